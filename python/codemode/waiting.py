"""A caller waiting for its run's step: on its own thread (``exec``/``wait``), or on its loop.

    wait_sync (the caller's thread), until its waiter has a step:
        ├─ sync tools of its run handed to it ──> runs them (and reads no worker meanwhile)
        ├─ its run's lane needs a reader, none has it ──> reads it itself (`Readers.pump`)
        └─ else ──> sleeps until woken or its deadline (`budget`)
    wait_async (a coroutine): a timer at `budget`, the future its waiter resolves

``budget`` is where a deadline is kept for a run parked on tools: past it the run is suspended
(``waiting``), and a run whose open calls all wait for the host's approval is handed back at
once. A run in a worker is not ended here: its worker's reader kills it at the kill time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .fleet import KILL_GRACE_S, READ_TICK_S, Fleet, Out, run_all
from .readers import Read, Waiter, on_loop
from .runs import Phase, Run, Step
from .workers import Lane

if TYPE_CHECKING:
    from .frames import Direct

__all__ = ["Waiting"]


class Waiting:
    """How a waiter waits for its run's step (a sync caller's thread may read workers meanwhile)."""

    def __init__(self, fleet: Fleet, drop: Callable[[Run], None]) -> None:
        self._fleet = fleet
        #: Frees a run whose async caller was cancelled (`Supervisor.drop`).
        self._drop = drop

    def wait_sync(self, run: Run, waiter: Waiter, direct: Direct | None = None, read: Read | None = None) -> Step:
        """The calling thread waits for the run's step: it runs the run's sync tools, reads the
        run's worker itself while no one else does (for every run there), or sleeps until it is
        woken or its deadline comes. (A wake-up that comes while it is busy is kept: its next
        sleep returns at once and it looks again; so does a stale one.) ``direct``: the run's
        frame goes straight to an idle worker (`FrameQueue.send_direct`): this thread writes
        it and reads the reply first (`_direct`). ``read``: what its worker wrote to a lease the
        run took over (`Supervisor.take_over`), routed first."""
        try:
            step = None
            if direct is not None:
                step = self._direct(run, waiter, *direct)
            elif read is not None and run.lane is not None:
                step = self._fleet.readers.deliver(run.lane, read, waiter, run)
            return step if step is not None else self._wait_sync_loop(run, waiter)
        except BaseException:
            # (An interrupt, say, or a sync tool's BaseException.) Never left as a lane's
            # reader: the lane goes to its thread, and the run is dropped by the caller.
            fleet = self._fleet
            out: Out = []
            with fleet.lock:
                waiter.polling = None
                for lane in fleet.lanes:
                    if lane.reader is waiter:
                        fleet.readers.release_reader(lane, waiter, out)
            run_all(out)
            raise

    def _direct(self, run: Run, waiter: Waiter, lane: Lane, frames: list[Any], deadline: float) -> Step | None:
        """Writes the run's frames to its idle worker as the lane's writer, then reads the reply
        as its reader, three turns of the lock in all (sent, written, routed): the step if the
        reply ended it; else None, and the loop goes on from there (as this lane's reader while
        it is still the run's and alive)."""
        if not frames:
            return None  # (nothing was to be sent after all: the loop looks at the run)
        fleet, readers = self._fleet, self._fleet.readers
        lane.worker.send(frames, deadline)  # (a failed write: the reply's read finds the pipe's end)
        with fleet.lock:
            flush = fleet.frames.written(lane)
            look = lane.reader is waiter and waiter.step is None and not waiter.work
            if look:
                waiter.polling = lane
                timeout = readers.poll_timeout(lane)
        if flush:
            fleet.frames.flush(lane)
        return readers.pump(lane, timeout, waiter, run) if look else None

    async def wait_async(self, run: Run, waiter: Waiter) -> Step:
        fleet = self._fleet
        loop = waiter.loop
        assert loop is not None and waiter.future is not None
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer
            if timer is not None:
                timer.cancel()
                timer = None
            out: Out = []
            with fleet.lock:
                delay = None if waiter.step is not None else self.budget(run, waiter, out)
            run_all(out)
            if delay is not None:
                timer = loop.call_later(delay, check)

        def poke() -> None:
            try:
                (loop.call_soon if on_loop(loop) else loop.call_soon_threadsafe)(check)
            except RuntimeError:
                pass  # the loop is closed

        waiter.poke = poke
        check()
        try:
            await waiter.future
        except asyncio.CancelledError:
            self._drop(run)  # nobody will ever ask for it: its tools are cancelled by the caller
            raise
        finally:
            if timer is not None:
                timer.cancel()
        assert waiter.step is not None
        return waiter.step

    def budget(self, run: Run, waiter: Waiter, out: Out) -> float | None:
        """Under the lock: suspends a parked run whose deadline has passed; else how long its
        waiter may sleep before it looks again. None once the step has ended."""
        if run.waiter is not waiter:
            return None
        fleet = self._fleet
        now = time.monotonic()
        step = run.step
        if run.phase is Phase.PARKED:
            if run.starting:
                return READ_TICK_S  # its calls are being started: `ToolStarter.submit` pokes it after
            if now < step.deadline and run.awaits_only_approvals():
                # Nothing the run waits on can come before the host decides: hand the model
                # back its turn now, not at the deadline (the next `wait` goes on).
                fleet.end(run, "suspended", out, reason="pending_tools")
                return None
            if now >= step.deadline:
                if run.lent and now < run.lent_at + KILL_GRACE_S:
                    # Sync tools handed to the pool just now: they may answer at once, as they
                    # would have on this thread (the guest then runs on, into its timeout).
                    return run.lent_at + KILL_GRACE_S - now
                fleet.end(run, "suspended", out, reason="pending_tools")
                return None
            return step.deadline - now
        lane = run.lane
        if run.phase is Phase.RUNNING and lane is not None and lane.pipeline:
            if now < step.deadline:
                return step.deadline - now
            # Its worker's reader kills it at the kill time: the report (or the kill) ends it.
            return max(READ_TICK_S, lane.pipeline[0].kill_at - now)
        # Queued: the time in the queue is not charged (`FrameQueue.frame_for`), so look again later.
        return max(READ_TICK_S, step.deadline - run.queued_at)

    def _wait_sync_loop(self, run: Run, waiter: Waiter) -> Step:
        fleet, readers = self._fleet, self._fleet.readers
        held: Lane | None = None  # where this thread is the reader
        while True:
            out: Out = []
            poll = sleep = None
            with fleet.lock:
                waiter.polling = None
                work, waiter.work = waiter.work, []
                waiter.busy = bool(work)
                held = self._reading_lane(run, waiter, held, bool(work), out)
                done = waiter.step if not work else None
                if not work and done is None:
                    sleep = self.budget(run, waiter, out)
                    if held is not None and sleep is not None:
                        poll, sleep = min(readers.poll_timeout(held), sleep), None
                        waiter.polling = held
            run_all(out)
            if done is not None:
                return done
            if work:
                for fn in work:
                    fn()
            elif poll is not None:
                assert held is not None
                readers.pump(held, poll)
            elif sleep is not None:
                waiter.event.wait(sleep)

    def _reading_lane(self, run: Run, waiter: Waiter, held: Lane | None, work: bool, out: Out) -> Lane | None:
        """The lane a waiting thread reads from now on (the caller holds the lock): ``held``
        unless another took it over, one handed to it, or its run's lane if that needs a
        reader; none while it has ``work`` to do or its step is done."""
        readers = self._fleet.readers
        lane = run.lane
        if held is not None and held.reader is not waiter:
            held = None  # taken over while this thread ran tools
        if held is None and lane is not None and lane.reader is waiter:
            held = lane  # handed to it (`Readers.ensure_reader`)
        if held is not None and (work or waiter.step is not None or held is not lane or held.dead):
            # (its own tools are the run's: no one needs to read for it meanwhile)
            readers.release_reader(held, waiter, out, run if work else None)
            held = None
        if work or waiter.step is not None:
            return held
        if held is None and lane is not None and not lane.dead and lane.reader is None and readers.need_reader(lane):
            held, lane.reader = lane, waiter
        return held
