"""Shared fixtures for the codemode benchmark suite (pytest-benchmark).

Peer baselines live in ``test_baselines.py``; codemode's own benchmarks should
reuse the same ``@pytest.mark.benchmark(group=...)`` names ("pipe",
"monty-trivial", "monty-toolcalls", "monty-cold") so pytest-benchmark prints
them in one table per group, with its relative "(x.xx)" columns acting as the
side-by-side ratios.

Every fixture that needs a third-party peer package calls
``pytest.importorskip`` itself, so a test using it is skipped (not errored)
in an environment without that package.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# ---------------------------------------------------------------------------
# Length-prefixed framing over raw pipe fds (no buffered file objects).
# ---------------------------------------------------------------------------

# Child: a tiny echo loop, stdlib only. Reads a 4-byte big-endian length and
# that many payload bytes from fd 0, writes header+payload back to fd 1.
# os.read may return short reads; os.write may return short writes.
ECHO_CHILD = r"""
import os
def rx(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            raise SystemExit(0)
        buf += chunk
    return bytes(buf)
def tx(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
while True:
    hdr = rx(4)
    tx(hdr + rx(int.from_bytes(hdr, "big")))
"""


def read_exactly(fd: int, n: int) -> bytes:
    """Read exactly ``n`` bytes from ``fd``, looping over short reads."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError(f"peer closed fd {fd} after {len(buf)}/{n} bytes")
        buf += chunk
    return bytes(buf)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, looping over short writes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, payload: bytes) -> None:
    write_all(fd, len(payload).to_bytes(4, "big") + payload)


def read_frame(fd: int) -> bytes:
    return read_exactly(fd, int.from_bytes(read_exactly(fd, 4), "big"))


class EchoChild:
    """A ``python -I -c ECHO_CHILD`` subprocess plus its raw pipe fds."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", ECHO_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()

    def roundtrip(self, payload: bytes) -> bytes:
        write_frame(self.wfd, payload)
        return read_frame(self.rfd)

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF -> child exits cleanly
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def echo_child():
    child = EchoChild()
    # Prove it works (and warm it up) before handing it out.
    assert child.roundtrip(b"warmup") == b"warmup"
    yield child
    child.close()


# ---------------------------------------------------------------------------
# pydantic-monty (peer): a warm worker pool, and a warm checked-out session.
# ---------------------------------------------------------------------------

# monty's pool enforces `max_suspensions` per checkout (default 1000, cannot be
# disabled); a benchmarked session doing 10 host calls per round would hit it
# after 100 rounds, so raise it for the long-lived session.
MONTY_MAX_SUSPENSIONS = 2**63 - 1


@pytest.fixture(scope="module")
def monty_pool():
    pm = pytest.importorskip("pydantic_monty")
    # Two warm workers: one is held for the whole module by `monty_session`,
    # the other serves per-iteration checkouts. min_processes spawns them
    # eagerly on __enter__. checkout_timeout/request_timeout are backstops so
    # a starved checkout or a wedged worker fails instead of hanging the run.
    with pm.Monty(min_processes=2, max_processes=2, checkout_timeout=10, request_timeout=30) as pool:
        yield pool


@pytest.fixture(scope="module")
def monty_session(monty_pool):
    with monty_pool.checkout(limits={"max_suspensions": MONTY_MAX_SUSPENSIONS}) as session:
        assert session.feed_run("1 + 1") == 2  # warm the worker
        yield session
