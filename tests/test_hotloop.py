"""`HotLoop`: while a loop reader watches a worker from it, it polls before it sleeps, within a
bound, with the GIL released; otherwise it is an ordinary asyncio loop. The MCP client's loop and
the tools' loop are HotLoops (see `readers.LoopReader`)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest
from codemode import hotloop
from codemode._engine import spin_readable
from codemode.hotloop import HotLoop, watch


@pytest.fixture
def loop():
    loop = HotLoop()
    yield loop
    loop.close()


@pytest.fixture
def spins(monkeypatch):
    monkeypatch.setattr(hotloop, "SPINS", True)


def selects(loop: HotLoop, monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Records the timeout of each call the selector makes to its base ``select``."""
    calls: list[float | None] = []
    base = type(loop._hot).__mro__[1]
    real = base.select

    def recorded(self: Any, timeout: float | None = None) -> Any:
        calls.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(base, "select", recorded)
    return calls


def test_a_watched_loop_takes_a_reply_by_polling_not_sleeping(loop, spins, monkeypatch):
    monkeypatch.setattr(hotloop, "SPIN_S", 1.0)  # long: the reply, not the bound, ends the poll
    r, w = os.pipe()
    got = threading.Event()
    loop.add_reader(r, lambda: (os.read(r, 1), got.set(), loop.stop()))
    loop.watch(1)
    calls = selects(loop, monkeypatch)
    threading.Timer(0.05, os.write, (w, b"x")).start()
    started = time.monotonic()
    loop.run_forever()
    assert got.is_set() and time.monotonic() - started < 0.9
    # The loop never slept in its selector: the poll saw the reply, and a select(0) took it.
    assert calls and all(timeout == 0 for timeout in calls), calls
    os.close(r)
    os.close(w)


def test_an_unwatched_loop_sleeps_as_any_loop(loop, spins, monkeypatch):
    r, w = os.pipe()
    loop.add_reader(r, lambda: (os.read(r, 1), loop.stop()))
    calls = selects(loop, monkeypatch)
    threading.Timer(0.05, os.write, (w, b"x")).start()
    loop.run_forever()
    assert None in calls  # slept until the pipe was readable
    os.close(r)
    os.close(w)


def test_the_poll_is_bounded_and_timers_fire_on_time(loop, spins, monkeypatch):
    monkeypatch.setattr(hotloop, "SPIN_S", 0.02)
    loop.watch(1)
    calls = selects(loop, monkeypatch)

    async def main(delay: float) -> float:
        started = time.monotonic()
        await asyncio.sleep(delay)
        return time.monotonic() - started

    # A 0.2 s timer: 20 ms of polling, then a sleep for the rest.
    assert 0.2 <= loop.run_until_complete(main(0.2)) < 1.0
    assert any(timeout is not None and 0 < timeout < 0.2 for timeout in calls), calls
    # A timer due sooner than the window: polled out, on time.
    monkeypatch.setattr(hotloop, "SPIN_S", 5.0)
    assert 0.03 <= loop.run_until_complete(main(0.03)) < 1.0


def test_watching_is_counted_and_never_goes_below_zero(loop):
    loop.watch(1)
    loop.watch(1)
    loop.watch(-1)
    assert loop._hot.watchers == 1
    loop.watch(-1)
    loop.watch(-1)
    assert loop._hot.watchers == 0
    plain = asyncio.new_event_loop()
    try:
        watch(plain, 1)  # another kind of loop (a tool's own): nothing to do
        plain.run_until_complete(asyncio.sleep(0))
    finally:
        plain.close()


def test_no_polling_on_a_single_cpu(loop, monkeypatch):
    monkeypatch.setattr(hotloop, "SPINS", False)
    loop.watch(1)
    r, w = os.pipe()
    loop.add_reader(r, lambda: (os.read(r, 1), loop.stop()))
    calls = selects(loop, monkeypatch)
    threading.Timer(0.02, os.write, (w, b"x")).start()
    loop.run_forever()
    assert None in calls
    os.close(r)
    os.close(w)


def test_spin_readable_releases_the_gil_and_respects_its_bound():
    r, w = os.pipe()
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        started = time.monotonic()
        assert spin_readable(r, 0.2) is False
        assert 0.2 <= time.monotonic() - started < 1.0
        assert ticks > 1000  # the other thread ran all along
    finally:
        stop.set()
        counter.join()
    os.write(w, b"x")
    assert spin_readable(r, 5.0) is True
    assert spin_readable(r, float("nan")) is True  # a bad bound is no bound, not a panic
    os.close(r)
    os.close(w)
