"""Who reads a worker's reports, one at a time, and one look at its pipe.

    lane.reader ─┬─ READER_THREAD   the lane's own thread (`Readers.reader_thread`)
                 ├─ a Waiter        a caller of exec/wait, reading while no one else needs it
                 └─ a LoopReader    an event loop (`loop_reading`)
                        │
                        └─ Readers.pump: read what the worker wrote (outside the lock), decode its
                           guest JSON, route it (`reports.ReportRouter.route`); or kill the worker
                           past its frame's kill time

A lone caller reads its run's worker itself (no thread hop for a lone cell); when more runs
share the worker, or the caller is away running its sync tools, its lane's thread takes over
and wakes the callers. A caller is never left as a reader: whoever stops reading hands the
lane on if anything still needs it (`Readers.release_reader`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from . import protocol
from .errors import ProtocolError
from .fleet import KILL_GRACE_S, READ_TICK_S, Fleet, Out, run_all
from .protocol import Report, decode_guest_json, too_heavy
from .runs import Run, Step
from .workers import READER_THREAD, Inflight, Lane

__all__ = ["Lease", "LoopReader", "Read", "Readers", "Signal", "Waiter", "on_loop"]

_log = logging.getLogger(__name__)


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """This thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Signal:
    """A wake-up for one waiting thread: ``set`` from anywhere, ``wait`` consumes it (a lock
    used as a one-slot semaphore: no Python-level condition on an exec's latency path)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass  # set already

    def wait(self, timeout: float) -> None:
        """Returns once set (consuming it) or after ``timeout`` seconds."""
        self._lock.acquire(timeout=max(0.0, timeout))


class Waiter:
    """Who waits for a run's step: a thread (``exec``/``wait``), or a coroutine on a loop."""

    __slots__ = ("busy", "event", "future", "loop", "poke", "polling", "step", "thread", "work")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.event = Signal()
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None
        #: The step, once it has ended.
        self.step: Step | None = None
        #: Sync tools of the run, for a waiting thread to run on itself; ``busy`` while it does
        #: (it reads no worker meanwhile).
        self.work: list[Callable[[], None]] = []
        self.busy = False
        self.thread = threading.get_ident()
        #: The lane it is polling now (it closes a lane that died meanwhile, once it looks).
        self.polling: Lane | None = None
        #: Makes the waiter look at its run again now (its deadline may have come).
        self.poke: Callable[[], object] = self.event.set

    def wake(self) -> None:
        if self.loop is None:
            self.event.set()
            return
        if on_loop(self.loop):
            self._resolve()
            return
        try:
            self.loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    def _resolve(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(None)


#: What a lane's reader read in one look (`Readers.look`): the frames, each with its guest JSON
#: decoded (or why it is too heavy); the error that ends the worker, if any; whether that was
#: a timeout; whether the worker wrote at all.
Read = tuple[list[tuple[protocol.WorkerFrame, Any]], Exception | None, bool, bool]


#: What a lease has read before it reads (never changed: a look makes a new `Read`).
_NOT_READ: Read = ([], None, False, False)


class Lease(msgspec.Struct, eq=False):
    """A lane's reader while a cell's first step runs there, before the cell is a run
    (`FrameQueue.lease`, `Supervisor.first_step`): its engine run, when it was sent and must
    have answered, and what the worker answered (`read`; the report and its value once the
    lease is let go of, the cell over). (A struct: built in C, for every leased step.)"""

    lane: Lane | None = None
    engine_run: int = 0
    sent: float = 0.0
    #: The step's deadline (its run's, once it takes the lease over), and the kill time of
    #: the frame in flight.
    deadline: float = 0.0
    kill_at: float = 0.0
    read: Read = _NOT_READ
    report: Report | None = None
    value: Any = None


class LoopReader:
    """A lane's reader that is an event loop's thread (``add_reader`` on a dup of the pipe).

    Two cases: a caller's run parked on calls that all run on one of codemode's loops (``MCP.*``
    calls, say), nothing else on the lane to read for: that loop reads the worker's reports and
    starts the calls they make on itself, so a call costs the wake-ups a direct call does
    (worker -> loop -> server -> loop -> worker), not one more for the caller's thread, and the
    loop polls briefly before it sleeps (`hotloop`). And ``exec_async`` runs on the lane's
    thread whose calls all run on their caller's loop: that loop reads instead, so their
    reports, tool starts, results and wake-ups never cross a thread.

    It reads for every run on the lane while anything needs reading. Someone else who needs the
    lane read (another caller) takes it over: at once if the loop is not reading right now, else
    the loop hands it over after its current look (``leave``): never two readers at once. It
    polls a dup of the pipe, which only its loop closes; the pipe itself it reads only while
    ``pumping`` (and closes, if the worker died meanwhile)."""

    __slots__ = ("fd", "keeper", "lane", "leave", "loop", "pumping", "timer")

    def __init__(self, lane: Lane, loop: asyncio.AbstractEventLoop, keeper: Waiter | None) -> None:
        self.lane = lane
        self.loop = loop
        #: The caller whose run handed it the lane (its own wake-ups keep it reading).
        self.keeper = keeper
        self.fd = -1
        self.timer: asyncio.TimerHandle | None = None
        self.pumping = False
        self.leave = False

    def keeps(self, prefer: Waiter | None) -> bool:
        """Whether it goes on reading when ``prefer`` (None: no caller, e.g. an advance) needs
        the lane read: for its keeper, or callers on its loop (a caller's loop that reads only
        for its own runs: with them gone it may be gone too)."""
        if prefer is None:
            return self.keeper is not None
        return prefer is self.keeper or prefer.loop is self.loop


#: Why a report's guest JSON is not decoded here (`protocol.too_heavy` says what it holds).
_TOO_HEAVY = "code mode output limit exceeded: the result is too heavy for the host: {}."


def _decoded(report: Report) -> tuple[list[tuple[int, Any]], Any, Any] | str:
    """The guest JSON of a report, decoded (a ``ProtocolError`` if it is not JSON), outside the
    lock: outputs, the value, the store writes; or why it is too heavy to decode (the run
    fails, its worker is not to blame)."""
    if not report.outputs and report.store_writes is None:  # (most reports: a value at most)
        value = report.value
        if value is None:
            return [], None, None
        heavy = too_heavy(value)
        if heavy is not None:
            return _TOO_HEAVY.format(heavy)
        return [], decode_guest_json(value) if report.status == "completed" else None, None
    texts = [text for kind, text in report.outputs if kind == 1] if report.outputs else []
    if report.value is not None:
        texts.append(report.value)
    if report.store_writes is not None:
        texts.append(report.store_writes)
    for text in texts:
        heavy = too_heavy(text)
        if heavy is not None:
            return _TOO_HEAVY.format(heavy)
    outputs: list[tuple[int, Any]] = (
        [(kind, decode_guest_json(text) if kind == 1 else text) for kind, text in report.outputs]
        if report.outputs
        else []
    )
    value = decode_guest_json(report.value) if report.status == "completed" and report.value is not None else None
    writes = decode_guest_json(report.store_writes) if report.store_writes is not None else None
    return outputs, value, writes


class Readers:
    """Who reads each lane, and one look at a worker by its current reader."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def need_reader(self, lane: Lane, but: Run | None = None) -> bool:
        """The lane has a frame in flight or queued, or callers waiting on it (``but`` aside:
        the run of a caller that goes to run its sync tools and sends their results itself)."""
        return bool(lane.pipeline or lane.queue or len(lane.attached) > (but in lane.attached))

    def ensure_reader(self, lane: Lane, prefer: Waiter | None = None) -> None:
        """Someone reads the lane while it has work in flight or callers waiting on it: the
        caller ``prefer`` (a thread, which is woken to do it), else the lane's thread. A caller
        reading it that is away running its sync tools hands the reading over, unless it is the
        one preferred (on its own thread, done with them: their results are being sent)."""
        if lane.dead or not self.need_reader(lane):
            return
        reader = lane.reader
        if isinstance(reader, LoopReader) and not reader.keeps(prefer):
            if reader.pumping:
                reader.leave = True  # it hands over after this look
                return
            reader.leave = True  # not reading now: taken over at once (it stops at its next look)
            lane.reader = None
            if reader.loop.is_closed() and reader.fd >= 0:
                os.close(reader.fd)  # (its selector is gone with it: no one else will)
                reader.fd = -1
        elif isinstance(reader, Waiter) and reader.busy and reader is not prefer:
            lane.reader = None
        elif reader is not None:
            return
        if prefer is not None and prefer.loop is None and (not prefer.busy or prefer.thread == threading.get_ident()):
            lane.reader = prefer
            prefer.event.set()
        else:
            self.to_thread(lane)

    def to_thread(self, lane: Lane) -> None:
        """Under the lock: the lane's own thread reads it from now on (started the first time)."""
        lane.reader = READER_THREAD
        if lane.thread is None:
            lane.thread = threading.Thread(target=self.reader_thread, args=(lane,), name="codemode-reader", daemon=True)
            lane.thread.start()
        else:
            lane.cond.notify()

    def release_reader(self, lane: Lane, me: object, out: Out, but: Run | None = None) -> None:
        """``me`` stops reading the lane: the lane's thread goes on if anything needs it."""
        if lane.reader is not me:
            return
        lane.reader = None
        if lane.dead:
            out.append(lane.worker.kill)  # (the reader closes the pipes it polled)
        elif self.need_reader(lane, but):
            self.to_thread(lane)

    def polling(self, lane: Lane) -> bool:
        """Under the lock: someone polls the lane's pipe now (and closes it once it looks; a
        lease's holder looks before it is done with it)."""
        reader = lane.reader
        if reader is READER_THREAD or isinstance(reader, Lease) or (isinstance(reader, LoopReader) and reader.pumping):
            return True
        return isinstance(reader, Waiter) and reader.polling is lane

    def reader_thread(self, lane: Lane) -> None:
        """A lane's own thread: it reads while it is the lane's reader, until the lane is dead."""
        fleet = self._fleet
        while True:
            out: Out = []
            with fleet.lock:
                while lane.reader is not READER_THREAD and not lane.dead:
                    lane.cond.wait()
                if lane.dead:
                    self.release_reader(lane, READER_THREAD, out)
                    timeout = None
                elif not self.need_reader(lane):
                    lane.reader = None
                    continue
                else:
                    timeout = self.poll_timeout(lane)
            if timeout is None:
                run_all(out)
                return
            self.pump(lane, timeout)

    def poll_timeout(self, lane: Lane) -> float:
        pipeline = lane.pipeline
        if not pipeline:
            return READ_TICK_S
        return max(0.0, min(READ_TICK_S, pipeline[0].kill_at - time.monotonic()))

    def pump(self, lane: Lane, timeout: float, waiter: Waiter | None = None, run: Run | None = None) -> Step | None:
        """One look at the worker (by its current reader): route what it wrote, or kill it if
        its frame is past the kill time (`look`, then `deliver`)."""
        return self.deliver(lane, self.look(lane, timeout), waiter, run)

    def look(self, lane: Lane, timeout: float) -> Read:
        """Outside the lock, by the lane's reader: what its worker wrote within ``timeout``."""
        worker = lane.worker
        error: Exception | None = None
        timed_out = False
        frames: list[tuple[protocol.WorkerFrame, Any]] = []
        spoke = True
        try:
            spoke, got = worker.take(timeout, bool(lane.pipeline))
            if got is None:
                timed_out = worker.overdue
                error = worker.crashed(f"worker {worker.pid} exited", timed_out=timed_out)
            else:
                frames = [(f, _decoded(f) if isinstance(f, Report) else None) for f in got]
        except ProtocolError as e:
            error = e
        except OSError as e:
            error = worker.crashed(f"worker {worker.pid} pipe failed: {e}")
        return frames, error, timed_out, spoke

    def deliver(self, lane: Lane, read: Read, waiter: Waiter | None = None, run: Run | None = None) -> Step | None:
        """What the lane's reader read (`look`), routed (`routed`). ``waiter``: the caller of
        ``run`` that sent its frame here and reads the reply itself; in the same turn of the
        lock, it stops reading once its step has ended (the step is returned) or its run is no
        longer here (a dead worker is let go of, which closes its pipes)."""
        fleet = self._fleet
        out: Out = []
        step = None
        with fleet.lock:
            self.routed(lane, read, out)
            if waiter is not None and run is not None:  # (both or neither)
                waiter.polling = None
                step = None if waiter.work else waiter.step  # (tools handed to it run first)
                if step is not None or lane.dead or run.lane is not lane:
                    self.release_reader(lane, waiter, out)
        run_all(out)
        return step

    def routed(self, lane: Lane, read: Read, out: Out) -> None:
        """Under the lock: what the lane's reader read (`look`), routed to the runs it answers;
        or the worker discarded (it died, sent a bad frame, or is past its frame's kill time)."""
        if lane.dead:
            return
        fleet = self._fleet
        worker = lane.worker
        frames, error, timed_out, spoke = read
        try:
            for frame, decoded in frames:
                fleet.reports.route(lane, frame, decoded, out)
        except ProtocolError as e:
            error = e
        except Exception as e:
            # A bug in routing must not stop this worker's reader (its runs would hang): the
            # worker is discarded as if it had sent a bad frame.
            _log.exception("code mode supervisor: routing a frame from worker %s failed", worker.pid)
            error = ProtocolError(f"code mode could not route a frame from worker {worker.pid}: {e!r}")
        if error is not None:
            fleet.lane_died(lane, error, out, timed_out=timed_out)
        elif lane.pipeline and _overdue(lane.pipeline[0], spoke):
            late = "did not start in time" if lane.pipeline[0].kind == "ready" else "overran its deadline"
            error = worker.crashed(f"worker {worker.pid} {late}", timed_out=True)
            fleet.lane_died(lane, error, out, timed_out=True)


def _overdue(inflight: Inflight, spoke: bool) -> bool:
    """Past the kill time; a worker writing its report just then gets one more grace to
    finish it (only one: a worker that trickles bytes is killed all the same)."""
    now = time.monotonic()
    return now >= inflight.kill_at + (KILL_GRACE_S if spoke else 0.0)
