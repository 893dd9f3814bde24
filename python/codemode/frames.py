"""Sending: each lane's queue of runs with a frame to send, and the frames written to its worker.

    enqueue(run, start|settle|replay) ──> lane.queue ──kick (worker free, or a small settle
        behind what it executes)──> take_next (fair across sessions) ──frame_for──> Configure?
        + Start | Settle (results, journaled) | Replay ──> lane.pipeline + lane.outbox
        ──flush (outside the lock, one writer per lane)──> the worker's pipe

A worker executes one frame at a time, in the order written. Time a run spends in a queue, or
in the pipe behind another run's frame, is not the guest's: its deadline moves by it (here when
the frame goes out, and in `FrameQueue.next_in_pipeline` when the worker gets to it).
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import Any

import msgspec

from . import protocol
from .fleet import KILL_GRACE_S, RUNS_PER_WORKER, Fleet, Out, failed, send_drop, timed_out
from .protocol import CallResult, Replay, Settle, Start, utf8_len
from .readers import Lease, Waiter
from .runs import Phase, Run
from .workers import Inflight, Lane

_log = logging.getLogger(__name__)

#: How long a worker may take to read a configuration sent ahead of any run (`FrameQueue.prime`)
#: before it is taken to have stopped reading: a 64 MiB catalog takes it ~0.3 s here. (A run's
#: own frames have its deadline.)
PRIME_WRITE_S = 30.0

__all__ = ["PIPELINE_DEPTH", "Direct", "FrameQueue"]

#: A frame sent straight to an idle worker (`FrameQueue.send_direct`): its lane, the frames for
#: its caller to write there (none: nothing to send after all), and their write deadline.
Direct = tuple[Lane, list[Any], float]

#: The least time a run gets to use tool results it is handed, even when they arrive just at the
#: deadline (the smallest allowed ``timeoutMs``): otherwise a result landing late in a ``wait``
#: would turn into a timeout instead of progress.
SETTLE_FLOOR_S = 0.1
#: Frames written to a busy worker behind the one it executes, at most, and the largest such a
#: frame may be (a pipe holds 64 KiB: no write to a worker that is busy ever blocks).
PIPELINE_DEPTH = 4
PIPELINE_FRAME_BYTES = 8 << 10
#: A run whose last frame took its worker at most this long may queue its next in the pipe.
PIPELINE_QUICK_S = 0.002
#: How far into a lane's queue fair queueing looks for the session served longest ago.
FAIR_SCAN = 64
#: Sessions whose last service is remembered (the rest count as never served).
SERVED_SESSIONS = 4096
#: Result bytes one settle frame carries at most; with one result of up to the bridge limit
#: (16 MiB) always allowed, a settle stays well under ``protocol.MAX_FRAME_BYTES``.
SETTLE_BUDGET_BYTES = protocol.MAX_FRAME_BYTES // 2


def _settle(run: Run, results: list[CallResult], now: float) -> Settle:
    """The settle of ``results`` (journaled, `FrameQueue._journaled`), which the run's journal
    records; a step near its deadline gets `SETTLE_FLOOR_S` to use them (once)."""
    step, journal = run.step, run.journal
    for call_id, _, _ in results:
        journal.open_inputs.pop(call_id, None)
    journal.batches.append(results)
    if not step.extended and step.deadline - now < SETTLE_FLOOR_S:
        step.deadline, step.extended = now + SETTLE_FLOOR_S, True
    return Settle(run.engine_run, results, max(1.0, (step.deadline - now) * 1000.0))


def _journal_full(length: int, limit: int) -> str:
    return (
        f"tool result of {length} bytes would grow this run's journal past maxJournalBytes ({limit}); "
        "ask the tool for less (a page, a filter, fewer fields)."
    )


class FrameQueue:
    """Under the fleet's lock: which run's frame each worker gets next, and what it is."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        #: Session id -> when it last had a frame sent, oldest first (fair queueing).
        self._served: dict[str, int] = {}
        self._serve_ticks = itertools.count()
        #: The session served last (the last in ``_served``).
        self._last_served = ""
        #: Orders `prime` calls: one that looked up the configuration later wins.
        self._prime_ticks = itertools.count(1)

    def enqueue(self, run: Run, kind: str, out: Out, prefer: Waiter | None = None) -> None:
        """Queues the run's next frame on its lane (placing it on one first, for a start or a
        replay), and sends it if the worker is free."""
        fleet = self._fleet
        lane = run.lane
        if lane is None or lane.dead:
            placed = fleet.place()
            if isinstance(placed, str):
                run.phase = Phase.ENDED
                message = f"code mode runtime is unavailable: {placed}"
                fleet.end(run, "failed", out, failure=failed("runtime_unavailable", "WorkerUnavailable", message))
                return
            lane = placed
            self._reside(run, lane)
        if run.waiter is not None:
            lane.attached.add(run)
        run.next_frame = kind
        run.phase = Phase.QUEUED
        run.queued_at = time.monotonic()
        lane.queue.append(run)
        self.kick(lane, out)
        fleet.readers.ensure_reader(lane, prefer if prefer is not None else run.waiter)

    def send_direct(self, run: Run, kind: str, waiter: Waiter, out: Out) -> Direct | None:
        """A run's ``start`` (it is placed first) or ``settle`` whose caller's thread waits for
        it goes straight to its worker when that one is idle (nothing queued or in flight
        there, nobody reading it): the caller is made the lane's writer and reader, writes the
        frames it is given (`write`, or `Waiting._direct`) and reads the reply itself, with
        no queue, no hand-over of the reader and no wake-up in between. None if the worker is
        not idle: then it queues as any other (`enqueue`). No frames: nothing to send after all
        (or its time is up), as `kick` would find."""
        lane = run.lane if kind == "settle" else self._fleet.place()
        if lane is None or isinstance(lane, str) or lane.reader is not None or not self.idle(lane):
            return None
        if kind == "start":
            self._reside(run, lane)
        lane.attached.add(run)
        run.next_frame = kind
        run.queued_at = time.monotonic()
        frames = self.frame_for(lane, run, out)
        if frames is None:
            self._fleet.readers.ensure_reader(lane, waiter)
            return lane, [], 0.0
        self._served_now(run.scope[0])
        lane.writing = True
        lane.reader = waiter
        return lane, frames, lane.pipeline[-1].kill_at

    @staticmethod
    def _reside(run: Run, lane: Lane) -> None:
        """A run's runtime is placed on ``lane``."""
        run.lane = lane
        run.placements += 1
        lane.residents.add(run)

    def _send(self, lane: Lane, run: Run, frames: list[Any], out: Out) -> None:
        """The run's frames, just put in flight (`frame_for`), go out in pipeline order."""
        self._served_now(run.scope[0])
        deadline = lane.pipeline[-1].kill_at
        if lane.writing:
            lane.outbox.append((frames, deadline))
        else:  # (then the outbox is empty: these go first, then whatever is queued meanwhile)
            lane.writing = True
            out.append(functools.partial(self.write, lane, frames, deadline))

    def kick(self, lane: Lane, out: Out) -> None:
        """If the worker is free, the next queued frame goes to it. (A worker that died while
        idle is found by its reader when the frame gets no answer: its run, the culprit, goes
        on elsewhere, see `Fleet.lane_died`.)"""
        while lane.queue and not lane.dead:
            run = self._take_next(lane)
            if run.aborted or run.phase is not Phase.QUEUED:
                continue
            if not self.may_write(lane, run):
                lane.queue.appendleft(run)  # (its turn is next)
                return
            frames = self.frame_for(lane, run, out)
            if frames is not None:
                self._send(lane, run, frames, out)

    def idle(self, lane: Lane) -> bool:
        """Under the lock: the worker is up and has nothing to do or to be sent."""
        return not (lane.dead or lane.pipeline or lane.queue or lane.outbox or lane.writing)

    def primable(self, lane: Lane) -> bool:
        """Under the lock: no run has a frame in flight or queued there (the worker may still be
        starting: a configuration written now is read right after it says `Ready`). Frames
        being written to it then are other configurations (or drops): a new one goes behind
        them, so a catalog that changed while the last was written still gets there."""
        pipeline = lane.pipeline
        booting = len(pipeline) == 1 and pipeline[0].kind == "ready"
        return (booting or not pipeline) and not (lane.dead or lane.queue)

    def prime(self, lane: Lane) -> None:
        """Outside the lock: an idle worker (starting, just up, or after the catalog changed)
        gets the current configuration now, and builds an engine for it before a run needs one
        (~1 ms that was on the next cell's path; with the search model, ~25 ms). The configuration
        is the one the next run would get (`RunFactory.configuration`, found outside the lock:
        it may load the search model); that run then sends none. Best effort: if it fails or
        the worker got busy meanwhile, the run's own frame configures the worker as before."""
        fleet = self._fleet
        primer = fleet.primer
        if primer is None:
            return
        tick = next(self._prime_ticks)
        try:
            configure = primer()
        except Exception:
            _log.exception("code mode supervisor: configuring a new worker early failed")
            return
        with fleet.lock:
            if tick < lane.primed or lane.configured is configure or not self.primable(lane):
                return  # (a later look-up was sent, it is configured so, or a run's frame will be)
            lane.primed = tick
            lane.configured = configure
            lane.outbox.append(([configure], time.monotonic() + PRIME_WRITE_S))
            if lane.writing:
                return
            lane.writing = True
        self.flush(lane)

    def next_in_pipeline(self, lane: Lane) -> None:
        """The worker answered its first frame; the next, if any, is the one it executes now:
        its time in the pipe is not its run's (its deadline and kill time move)."""
        lane.pipeline.popleft()
        if lane.pipeline:
            head = lane.pipeline[0]
            waited = time.monotonic() - head.sent
            if head.run is not None and head.run.waiter is not None:
                head.run.step.deadline += waited
            lane.pipeline[0] = msgspec.structs.replace(head, sent=head.sent + waited, kill_at=head.kill_at + waited)

    def may_write(self, lane: Lane, run: Run) -> bool:
        """The run's frame may be written now: the worker is free, or the frame is a settle
        small enough to wait in the pipe behind what it executes (it never fills the pipe, so no
        write blocks on a worker that is busy) of a run whose frames are quick. A frame in the
        pipe is committed to go next, so only those: a new cell (of unknown cost) or a slow run
        would make every run queued behind it wait longer than one frame."""
        if not lane.pipeline:
            return True
        if len(lane.pipeline) >= PIPELINE_DEPTH or lane.pipeline[0].kind in ("ready", "lease"):
            return False  # (nothing goes behind a worker's start-up, or behind a lease)
        quick = run.next_frame == "settle" and run.drive_s <= PIPELINE_QUICK_S
        return quick and run.dispatcher.ready_bytes() <= PIPELINE_FRAME_BYTES

    def frame_for(self, lane: Lane, run: Run, out: Out, results: list[CallResult] | None = None) -> list[Any] | None:
        """The frame(s) for a run's turn on its worker, which is now busy with it; None if it
        has nothing to send after all. A settle carries ``results`` if given, else the results
        ready for the run."""
        fleet = self._fleet
        now = time.monotonic()
        kind, step, journal = run.next_frame, run.step, run.journal
        waited = now - run.queued_at  # in the queue: not the guest's time
        frames: list[Any] = []
        if kind != "settle":
            self._configure(lane, run.configure, frames)
        if kind == "start":
            run.engine_run = fleet.next_run_id()
            step.deadline += waited
            frames.append(journal.start_frame(run.engine_run, float(run.timeout_ms)))
            kill_at = step.deadline + KILL_GRACE_S
            self._count_start(lane)
        elif kind == "settle":
            if results is None:
                results = run.dispatcher.take_ready(max_bytes=SETTLE_BUDGET_BYTES)
            results = self._journaled(run, results)
            if not results:
                run.phase = Phase.PARKED
                return None
            if run.waiter is not None:
                step.deadline += waited
                if now >= step.deadline + KILL_GRACE_S:
                    # A guest whose tools answer at once has been running all along: it is
                    # past its time as if in one long drive (the kill would have ended that).
                    send_drop(lane, run, out)
                    fleet.forget(run)
                    fleet.end(run, "failed", out, failure=failed("timeout", "TimeoutError", timed_out("cell")))
                    return None
            else:
                step.deadline = now + run.timeout_ms / 1000.0  # an advance: the run's own budget
            frames.append(_settle(run, results, now))
            kill_at = step.deadline + KILL_GRACE_S
        else:
            run.engine_run = fleet.next_run_id()
            start = journal.start_frame(run.engine_run, float(run.timeout_ms))
            frames.append(Replay(start, journal.batches, journal.clock_reads))
            step.deadline += waited
            # The replay has the budget the engine gives it (a timeout per step).
            kill_at = now + (len(journal.batches) + 1) * run.timeout_ms / 1000.0 + KILL_GRACE_S
        lane.pipeline.append(Inflight(run, kind, now, kill_at))
        run.phase = Phase.RUNNING
        return frames

    def lease(self, lane: Lane, holder: Lease, configure: Any, start: Start, session_id: str) -> list[Any]:
        """Under the lock, for an idle lane with no reader: a cell's first step (``start``, of
        ``session_id``'s cell, which gets its engine run here) goes to it before the cell is a run
        (`Supervisor.first_step`). ``holder`` is the lane's reader until it lets go or a run
        takes it over; meanwhile the lease is the frame in flight and every other frame for the
        worker queues (`may_write`), so the holder writes its own at once, with no outbox to
        flush after it (a `Drop` goes straight to the worker, whole, as ever). Returns the
        frames to write."""
        fleet = self._fleet
        now = time.monotonic()
        holder.lane = lane
        holder.engine_run = start.run = fleet.next_run_id()
        holder.sent = now
        holder.deadline = now + start.timeout_ms / 1000.0
        holder.kill_at = holder.deadline + KILL_GRACE_S
        frames: list[Any] = []
        self._configure(lane, configure, frames)
        frames.append(start)
        self._count_start(lane)
        lane.pipeline.append(Inflight(None, "lease", now, holder.kill_at))
        self._served_now(session_id)
        lane.reader = holder
        return frames

    def settle_lease(self, lane: Lane, holder: Lease, run: Run, results: list[CallResult]) -> list[Any]:
        """Under the lock, for an idle lane with no reader where ``run`` is parked with no
        waiter: its settle of ``results`` (its step due ``run.timeout_ms`` from now) goes out
        as `lease` sends a first step (`Supervisor.resume`), the run's own frame in flight,
        read by ``holder`` (as its reader, until it lets go or the run's waiter takes over).
        Returns the frames to write."""
        now = time.monotonic()
        run.next_frame, run.queued_at = "settle", now
        run.step.deadline = now + run.timeout_ms / 1000.0
        holder.lane, holder.engine_run = lane, run.engine_run
        return self._lent_settle(lane, holder, run, results, now)

    def relet(self, lane: Lane, holder: Lease, run: Run, results: list[CallResult]) -> list[Any] | None:
        """Under the lock: the settle of ``results`` for the run of a lease whose holder let go
        of its lane to run the run's calls (`Supervisor._lease_calls`), if the lane is idle
        again with the run's runtime resident there and the run not past its time: the holder
        reads the lane again, its settle the frame in flight. None if not (the run then goes on
        as any other)."""
        now = time.monotonic()
        if (
            run.lane is not lane
            or run.aborted
            or lane.reader is not None
            or not self.idle(lane)
            or now >= run.step.deadline + KILL_GRACE_S
        ):
            return None
        return self._lent_settle(lane, holder, run, results, now)

    def _lent_settle(self, lane: Lane, holder: Lease, run: Run, results: list[CallResult], now: float) -> list[Any]:
        """Under the lock: the run's settle of ``results`` (journaled, `_settle`), put in
        flight on the idle lane for ``holder`` to write and read (its sent and kill times, and
        the step's deadline, are the lease's)."""
        frame = _settle(run, self._journaled(run, results), now)
        step = run.step
        inflight = Inflight(run, "settle", now, step.deadline + KILL_GRACE_S)
        lane.pipeline.append(inflight)
        run.phase = Phase.RUNNING
        holder.sent, holder.kill_at, holder.deadline = now, inflight.kill_at, step.deadline
        self._served_now(run.scope[0])
        lane.reader = holder
        return [frame]

    def hand_over(self, lease: Lease, run: Run, waiter: Waiter | None) -> None:
        """Under the lock: the run of a leased step takes the lease over (`Supervisor.
        take_over`), and is then as `send_direct` leaves a run it sent: resident on the lane,
        its frame the one in flight, its caller (``waiter``) the lane's reader; none: the
        lease reads on, the reply at hand. (A first step's frame was no run's yet: it becomes
        the run's start.)"""
        lane = lease.lane
        assert lane is not None
        if lane.pipeline[0].run is None:
            self._reside(run, lane)
            run.engine_run = lease.engine_run
            run.next_frame, run.queued_at = "start", lease.sent
            run.phase = Phase.RUNNING
            lane.pipeline[0] = Inflight(run, "start", lease.sent, lease.kill_at)
        if waiter is not None:
            lane.attached.add(run)
            lane.reader = waiter

    @staticmethod
    def _configure(lane: Lane, configure: Any, frames: list[Any]) -> None:
        """A start or a replay configures its worker first when it has another catalog."""
        if lane.configured is not configure:
            frames.append(configure)
            lane.configured = configure

    def _count_start(self, lane: Lane) -> None:
        """A cell starts on ``lane``: a worker that has started its share is replaced once the
        runs it holds have ended (`Fleet.retire_if_done`)."""
        lane.started += 1
        if lane.started >= RUNS_PER_WORKER and not lane.retiring:
            lane.retiring = True
            self._fleet.spawn()

    def _journaled(self, run: Run, results: list[CallResult]) -> list[CallResult]:
        """The results of one settle frame (taken within ``SETTLE_BUDGET_BYTES``: the rest stay
        ready for the next, so no frame outgrows its cap), as the journal records them: within
        ``maxJournalBytes``, past which a call fails instead."""
        limit = self._fleet.max_journal
        journaled: list[CallResult] = []
        for call_id, ok, payload in results:
            length = utf8_len(payload)
            if run.journal_bytes + length > limit:
                ok, payload = False, _journal_full(length, limit)
                length = len(payload)
            run.journal_bytes += length
            journaled.append(CallResult(call_id, ok, payload))
        return journaled

    def _take_next(self, lane: Lane) -> Run:
        """The queued run whose turn it is, fair across sessions: of the first ``FAIR_SCAN`` in
        the queue, the one whose session was served longest ago (a session never served first),
        FIFO among equals. A session that resubmits as soon as it is served cannot keep another
        session's cell waiting for more than one frame."""
        queue = lane.queue
        served = self._served
        best, best_at = 0, served.get(queue[0].scope[0], -1)
        for index in range(1, min(len(queue), FAIR_SCAN)):
            at = served.get(queue[index].scope[0], -1)
            if at < best_at:
                best, best_at = index, at
        run = queue[best]
        del queue[best]
        return run

    def _served_now(self, session_id: str) -> None:
        """``session_id`` just had a frame sent (the most recent of all)."""
        if session_id == self._last_served:
            return  # (the most recent already: the order of the others is the same)
        self._last_served = session_id
        served = self._served
        served.pop(session_id, None)
        served[session_id] = next(self._serve_ticks)
        if len(served) > SERVED_SESSIONS:
            del served[next(iter(served))]  # the longest-unserved: forgetting it keeps it first

    def write(self, lane: Lane, frames: list[Any], deadline: float) -> None:
        """Outside the lock, as the lane's writer: ``frames``, then the outbox."""
        lane.worker.send(frames, deadline)
        self.flush(lane)

    def flush(self, lane: Lane) -> None:
        """Writes the lane's outbox in order (outside the lock; one writer at a time)."""
        while True:
            with self._fleet.lock:
                if not self.written(lane):
                    return
                frames, deadline = lane.outbox.popleft()
            lane.worker.send(frames, deadline)

    @staticmethod
    def written(lane: Lane) -> bool:
        """Under the lock, by the lane's writer once its frames are written: True if others
        queued frames behind them meanwhile (it writes those next); else it is no longer the
        writer."""
        if lane.outbox:
            return True
        lane.writing = False
        return False
