"""Peer baselines for the codemode benchmark suite.

codemode's own benchmarks should use the same group names so one run prints
them side by side (pytest-benchmark's relative columns give the ratios).

pydantic-monty API facts relied on here (read from the installed
pydantic-monty 1.4.0 = pydantic-monty-client 1.4.0 + pydantic-monty-runtime
1.4.0: pydantic_monty/__init__.py, pydantic_monty/_monty.pyi, _binary.py and
the package README):

* There is NO in-process interpreter and NO separate parse/compile step in
  this version: execution *always* happens in a pool of `monty` worker
  subprocesses (binary `bin/monty` from pydantic-monty-runtime, located via
  `binary_path=` / $MONTY_BIN / the env's scripts dir / PATH). So "worker
  subprocess mode" is the only mode, and "warm" means a live pool plus a
  checked-out session.
* `pydantic_monty.Monty(*, binary_path=None, min_processes=1,
  max_processes=None, checkout_timeout=None, request_timeout=None,
  max_checkouts_per_worker=None, ...)` configures the pool; workers are
  spawned by `with Monty(...) as pool:` (min_processes eagerly).
* `pool.checkout(*, script_name='main.py', limits=None, type_check=False,
  os_policy=None, external_modules=None, ...)` -> `MontySession`, used as a
  context manager; it dedicates one worker to a REPL session (globals
  persist across feeds) and returns the worker to the pool on exit.
* `session.feed_run(code, *, inputs=None, external_lookup=None,
  print_callback=None, mount=None, cwd=None, os=None, skip_type_check=False)
  -> Any` runs a snippet to completion and returns its trailing expression's
  value. Names the snippet leaves undefined are resolved lazily from
  `external_lookup`; a callable entry becomes a host function the sandbox
  can call (the binding answers each call automatically, in this process).
* `session.feed_start(code, *, inputs=None, external_lookup=None, ...)` is
  the suspendable form: it returns a snapshot at each external call / OS
  call / name lookup / future, or `MontyComplete` (value in `.output`).
  `FunctionSnapshot` has `.function_name`, `.args`, `.kwargs`, `.call_id`,
  and `.resume({'return_value': v})` (or `{'exception': exc}` /
  `{'exc_type': 'ValueError', 'message': ...}`) -> next snapshot;
  `.resume_auto()` answers from the captured `external_lookup`. An undefined
  name that is *called* (e.g. `get(i)`) arrives as a `FunctionSnapshot`
  directly (verified: 10 calls -> exactly 10 FunctionSnapshots).
* `limits={'max_suspensions': N}` (a `ResourceLimits` key): the pool counts
  external calls / name lookups per *checkout* (default 1000, cannot be
  disabled; exceeding it raises `MontyRuntimeError: RuntimeError: suspension
  limit 1000 exceeded`). A long-lived benchmarked session must raise it.
* `AsyncMonty` / `AsyncMontyWebsocket` are the asyncio and remote
  counterparts (not benchmarked here).
"""

from __future__ import annotations

import pytest

# ---------------------------------------------------------------------------
# group "pipe": one bare length-prefixed msgpack round trip to a child process
# ---------------------------------------------------------------------------


@pytest.mark.benchmark(group="pipe")
def test_pipe_roundtrip_msgpack(benchmark, echo_child):
    """Parent encodes a small msgpack frame, writes it (4-byte BE length
    prefix) to a `python -I -c` echo child, reads the echoed frame back with a
    readexactly loop and decodes it. The child echoes raw bytes (stdlib only),
    so this is the floor for any host<->worker request/response."""
    msgspec = pytest.importorskip("msgspec")
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder()
    msg = {"kind": "ping", "n": 1}

    def roundtrip():
        return decoder.decode(echo_child.roundtrip(encoder.encode(msg)))

    assert roundtrip() == msg
    assert benchmark(roundtrip) == msg


# ---------------------------------------------------------------------------
# group "monty-trivial": `1 + 1` in pydantic-monty
# ---------------------------------------------------------------------------


@pytest.mark.benchmark(group="monty-trivial")
def test_monty_trivial_warm_session(benchmark, monty_session):
    """`feed_run('1 + 1')` on an already checked-out session (warm worker
    subprocess, REPL state kept). monty has no reusable parsed-program object
    in this version; each feed ships the source to the worker, which parses
    and runs it. This is monty's best case for a trivial cell."""
    assert benchmark(monty_session.feed_run, "1 + 1") == 2


@pytest.mark.benchmark(group="monty-trivial")
def test_monty_trivial_checkout_per_run(benchmark, monty_pool):
    """Warm pool, but a fresh `checkout()` (new session on an already-running
    worker) per `1 + 1`: the cost of a clean sandbox per cell without
    spawning a process."""

    def run():
        with monty_pool.checkout() as session:
            return session.feed_run("1 + 1")

    assert run() == 2  # make sure both pool workers are live before timing
    assert benchmark(run) == 2


@pytest.mark.benchmark(group="monty-cold")
def test_monty_trivial_cold_pool(benchmark):
    """Cold start: spawn a one-worker pool (the `monty` subprocess), check out,
    run `1 + 1`, shut down. Few rounds; ~2-3 ms each."""
    pm = pytest.importorskip("pydantic_monty")

    def run():
        with pm.Monty(min_processes=1, max_processes=1, request_timeout=30) as pool:
            with pool.checkout() as session:
                return session.feed_run("1 + 1")

    assert benchmark.pedantic(run, rounds=30, iterations=1, warmup_rounds=2) == 2


# ---------------------------------------------------------------------------
# group "monty-toolcalls": 10 sequential host-function calls, summed
# ---------------------------------------------------------------------------

TOOLCALL_CODE = """\
total = 0
for i in range(10):
    total += get(i)
total
"""
TOOLCALL_RESULT = sum(i * 2 for i in range(10))  # 90


def _get(i):
    return i * 2


@pytest.mark.benchmark(group="monty-toolcalls")
def test_monty_toolcalls_feed_run(benchmark, monty_session):
    """`feed_run(code, external_lookup={'get': get})`: the binding services
    all 10 worker->host calls itself (natively, in Rust) until completion."""
    lookup = {"get": _get}
    assert benchmark(monty_session.feed_run, TOOLCALL_CODE, external_lookup=lookup) == TOOLCALL_RESULT


@pytest.mark.benchmark(group="monty-toolcalls")
def test_monty_toolcalls_start_resume(benchmark, monty_session):
    """`feed_start(code)` then a Python-level `snapshot.resume({'return_value':
    ...})` loop: 10 FunctionSnapshots, each answered by the host. This is the
    shape closest to a host driving tool calls itself."""
    pm = pytest.importorskip("pydantic_monty")
    MontyComplete = pm.MontyComplete

    def run():
        snap = monty_session.feed_start(TOOLCALL_CODE)
        calls = 0
        while not isinstance(snap, MontyComplete):
            # 'get' is undefined in the sandbox, so each call suspends here.
            assert snap.function_name == "get"
            snap = snap.resume({"return_value": _get(*snap.args)})
            calls += 1
        assert calls == 10
        return snap.output

    assert benchmark(run) == TOOLCALL_RESULT


@pytest.mark.benchmark(group="monty-trivial")
def test_monty_trivial_idle(benchmark, monty_session):
    """`1 + 1` after a 2 ms pause (not timed), measured the way codemode's idle exec is."""
    import time

    assert benchmark.pedantic(monty_session.feed_run, args=("1 + 1",), setup=lambda: time.sleep(0.002), rounds=300) == 2


@pytest.mark.benchmark(group="trivial-after-30ms")
def test_monty_trivial_after_30ms(benchmark, monty_session):
    """`1 + 1` after a 30 ms pause, measured the way codemode's exec after 30 ms is."""
    import time

    assert benchmark.pedantic(monty_session.feed_run, args=("1 + 1",), setup=lambda: time.sleep(0.03), rounds=100) == 2
