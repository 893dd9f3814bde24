"""Reading a worker's pipe (`FrameSource.take`, the extension's `FrameReader.read_within`): one
call waits for the pipe (polling first, when a reply is due) and reads what came, whatever the
timeout it is given, a signal meanwhile, or what the other end writes.

Every time bound here is a hang guard, never a measurement.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from codemode import protocol
from codemode.errors import ProtocolError
from codemode.protocol import MAX_FRAME_BYTES, Ready
from codemode.workers import WorkerProcess
from frame_fuzz import _pipe_worker

READY = Ready(pid=7, engine_version="x")


@pytest.fixture
def pipe() -> Iterator[tuple[WorkerProcess, int]]:
    """A worker whose stdout is a pipe the test writes (its write end)."""
    rfd, wfd = os.pipe()
    try:
        yield _pipe_worker(rfd), wfd
    finally:
        os.close(rfd)
        try:
            os.close(wfd)
        except OSError:
            pass  # (the test closed it)


def _later(seconds: float, do: object) -> threading.Thread:
    thread = threading.Timer(seconds, do)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_nothing_within_the_timeout_is_not_a_read(pipe):
    worker, _ = pipe
    started = time.monotonic()
    assert worker.take(0.05) == (False, [])
    assert 0.045 <= time.monotonic() - started < 5
    assert worker.take(0.01, spin=True) == (False, [])


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan, -math.inf], ids=["zero", "negative", "nan", "minus_inf"])
def test_a_timeout_of_nothing_looks_once_without_blocking(pipe, timeout):
    worker, wfd = pipe
    started = time.monotonic()
    assert worker.take(timeout, spin=True) == (False, [])
    os.write(wfd, protocol.encode(READY))
    assert worker.take(timeout) == (True, [READY])
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("timeout", [math.inf, 1e300, 3600.0], ids=["inf", "huge", "an_hour"])
def test_a_timeout_too_long_for_a_clock_waits_for_the_frame(pipe, timeout):
    worker, wfd = pipe
    writer = _later(0.02, lambda: os.write(wfd, protocol.encode(READY)))
    assert worker.take(timeout, spin=True) == (True, [READY])
    writer.join()


def test_a_frame_that_comes_while_it_waits_or_polls_is_read(pipe):
    worker, wfd = pipe
    for spin, after in [(False, 0.02), (True, 0.0001), (True, 0.02)]:
        writer = _later(after, lambda: os.write(wfd, protocol.encode(READY) * 2))
        spoke, frames = worker.take(10.0, spin=spin)
        writer.join()
        if frames == [READY]:  # (the two writes' halves may come apart)
            frames += worker.take(10.0)[1]
        assert spoke and frames == [READY, READY]


def test_part_of_a_frame_is_a_read_of_no_frames_and_the_rest_completes_it(pipe):
    worker, wfd = pipe
    data = protocol.encode(READY)
    os.write(wfd, data[:3])
    assert worker.take(1.0) == (True, [])
    os.write(wfd, data[3:])
    assert worker.take(1.0) == (True, [READY])


def test_the_end_of_the_pipe_is_none(pipe):
    worker, wfd = pipe
    os.write(wfd, protocol.encode(READY))
    os.close(wfd)
    assert worker.take(1.0) == (True, [READY])
    assert worker.take(1.0) == (True, None)


def test_a_malformed_frame_after_good_ones_is_raised_by_the_next_take_at_once(pipe):
    worker, wfd = pipe
    os.write(wfd, protocol.encode(READY) + b"\x00\x00\x00\x02\xc1\xc1")
    assert worker.take(1.0) == (True, [READY])
    started = time.monotonic()
    with pytest.raises(ProtocolError, match="malformed frame"):
        worker.take(30.0)
    assert time.monotonic() - started < 5


def test_a_length_over_the_cap_is_a_protocol_error(pipe):
    worker, wfd = pipe
    os.write(wfd, (MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match="cap"):
        worker.take(1.0)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_a_signal_while_it_waits_runs_its_handler_which_may_end_the_wait(pipe):
    worker, wfd = pipe
    handled: list[int] = []

    class Stop(Exception):
        pass

    def keep_on(signum: int, frame: object) -> None:
        handled.append(signum)

    def stop(signum: int, frame: object) -> None:
        raise Stop

    old = signal.signal(signal.SIGALRM, keep_on)
    try:
        # A handler that returns: the wait goes on, for what is left of its timeout.
        writer = _later(0.2, lambda: os.write(wfd, protocol.encode(READY)))
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        assert worker.take(30.0, spin=True) == (True, [READY])
        writer.join()
        assert handled == [signal.SIGALRM]
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        assert worker.take(0.1) == (False, [])
        assert 0.095 <= time.monotonic() - started < 5
        # A handler that raises ends it with the handler's exception.
        signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        started = time.monotonic()
        with pytest.raises(Stop):
            worker.take(30.0)
        assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # And nothing was lost: what comes next is read.
    os.write(wfd, protocol.encode(READY))
    assert worker.take(1.0) == (True, [READY])
