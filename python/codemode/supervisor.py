"""The supervisor: many runs on a few workers, routed by run id; deadlines, kills, recovery.

    exec/wait (any thread) ─┐                 ┌─> lane 0 ── worker process (one frame at a time)
    exec_async (any loop) ──┼─> Supervisor ───┼─> lane 1 ── worker process
    tool results ───────────┘   (one lock)    └─> ...
                                   │
          each lane's reader (its thread, the caller waiting on it, or an event loop: see
          `LoopReader`) reads its reports:
            Report(pending, calls) ──> journal, start the calls at once, park the run
            Report(completed|failed) ──> end the run's step, wake who waits for it
          a tool result lands (on any thread) ──> Settle queued on the run's lane, written
            when the worker is free, or at once behind what it executes if it is small

A run lives on one worker (its runtime is resident there) and a worker drives one frame at a
time, so what takes a worker is a cell's CPU work, never a tool's latency: while a run is parked
on its tools, its worker serves other runs' frames. The supervisor writes a worker a frame when
it is free, or a small one behind the frame it executes (at most `PIPELINE_DEPTH`, in order,
through one writer per lane); it knows, for every worker, whose frame it is executing and since
when, and the frames behind it are not their runs' time.

- **Deadlines** are per run: ``timeoutMs`` of wall time from when the cell first runs (time in a
  busy worker's queue is not charged); a run parked on tools at its deadline is suspended
  (``waiting``); a worker that has not answered by deadline + ``KILL_GRACE_S`` is SIGKILLed
  by whoever reads it (QuickJS's interrupt is not a hard deadline).
- **Recovery**: when a worker dies (killed, crashed, a malformed frame), the run whose frame it
  was executing fails (``timeout``, ``runtime_unavailable`` or ``internal_error``); every other
  run resident there is replayed from its journal on another worker and goes on, its started
  calls never started again (they are still running in the host) and its delivered results
  served from the journal. A suspended run is replayed by its next ``wait``.
- **Advances**: a result that lands while a run is suspended is settled at once; calls the
  guest makes on the way are held until the next ``wait`` (which then finds the work done).
- **Readers**: one at a time per worker. A caller of ``exec``/``wait`` reads its run's worker
  itself while no one else needs it (no thread hop for a lone cell); an event loop reads it while
  the runs there wait only on calls on that loop (`LoopReader`); otherwise the worker's reader
  thread does, and wakes the callers. Sync tools run on their caller's thread (or, for ``exec_async``, a bounded
  pool), never on a reader: a slow one stalls no other run's reports.

Every frame from a worker is untrusted: a worker that sends anything unexpected is discarded
(as a crash, with ``internal_error`` for its culprit).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from ._engine import YIELD_TOOL
from .errors import ClosedError
from .fleet import KILL_GRACE_S, Fleet, Out, failed, run_all, send_drop
from .frames import SETTLE_BUDGET_BYTES, Direct, FrameQueue
from .loop_reading import LoopReading
from .placement import LocalPlacement, Placement
from .protocol import CallResult, Configure, Fault, Report, Start, WorkerFrame
from .readers import Lease, LoopReader, Read, Readers, Waiter
from .reports import ReportRouter, journal_calls
from .runs import Failure, Phase, Run, Step
from .tool_starts import SYNC_TOOL_THREADS, ToolStarter
from .waiting import Waiting
from .workers import SPIN_S

__all__ = ["KILL_GRACE_S", "SYNC_TOOL_THREADS", "Supervisor"]

#: How long the catalog must stay unchanged before idle workers are configured with it.
PRIME_DELAY_S = 0.005


def _closed() -> Failure:
    """How a run in progress fails when its ``CodeMode`` closes."""
    return failed("runtime_unavailable", "ClosedError", "this CodeMode is closed")


def _dropped() -> Failure:
    """How a run's step ends for its caller when the run is dropped meanwhile."""
    return failed("internal_error", "CancelledError", "code mode run was dropped")


def _lone(read: Read) -> tuple[WorkerFrame, Any] | None:
    """The one frame a lease read (with its guest JSON, decoded), if it read one and the
    worker is not to be discarded; else None."""
    got, error, _, _ = read
    return got[0] if error is None and len(got) == 1 else None


def _ends_step(read: Read) -> bool:
    """Whether a reply a lease read ends its run's step whoever routes it: one frame, a fault
    or a report that completed, failed, or parked on yields alone (they suspend the run). Not
    a report's tool calls, which a reply routed with no waiter (an advance's) would hold, nor
    a worker's death, after which a run with a waiter goes on elsewhere at once."""
    lone = _lone(read)
    if lone is None:
        return False
    frame = lone[0]
    if not isinstance(frame, Report):
        return isinstance(frame, Fault)
    if frame.status != "pending":
        return True
    for call in frame.calls:
        if call[1] != YIELD_TOOL:
            return False
    return bool(frame.calls)


class Supervisor:
    """The worker lanes and every run on them: starts, resumes, drops and evicts runs. All
    state is the `Fleet`'s, guarded by its one lock; pipe I/O, waking and tool code run outside
    it. The parts, each a module: `readers` and `loop_reading` (who reads a worker), `reports`
    (what a frame from one does), `frames` (what is sent to one, and when), `tool_starts`
    (where a run's calls run), `waiting` (a caller waiting for its step)."""

    def __init__(
        self,
        size: int,
        *,
        max_runs_per_worker: int = 512,
        max_worker_memory: int = 2 << 30,
        max_snapshot_bytes: int = 10 << 20,
        max_journal_bytes: int = 16 << 20,
        placement: Placement | None = None,
    ) -> None:
        self._placement = placement or LocalPlacement()
        fleet = self._fleet = Fleet(
            size,
            max_runs_per_worker=max_runs_per_worker,
            max_worker_memory=max_worker_memory,
            max_snapshot_bytes=max_snapshot_bytes,
            max_journal_bytes=max_journal_bytes,
            placement=self._placement,
        )
        fleet.readers = Readers(fleet)
        fleet.loop_reading = LoopReading(fleet)
        fleet.frames = FrameQueue(fleet)
        fleet.reports = ReportRouter(fleet)
        fleet.tool_starts = ToolStarter(fleet)
        self._waiting = Waiting(fleet, self.drop)
        #: A re-prime is scheduled (`catalog_changed`), for when the catalog has been quiet.
        self._prime_timer = False
        self._prime_due = 0.0
        with fleet.lock:
            for _ in range(fleet.size):
                fleet.spawn()

    def prime(self, configuration: Callable[[], Configure]) -> None:
        """Workers are configured as soon as they are up with ``configuration()`` (what the
        next run would get), so they build their first engine before a run needs it
        (`FrameQueue.prime`); idle ones, and those still starting, get it now."""
        with self._fleet.lock:
            self._fleet.primer = configuration
        self._prime_idle()

    def catalog_changed(self) -> None:
        """The catalog changed (a tool added or removed, an MCP server listed): once it has not
        changed for `PRIME_DELAY_S` (tools come in bursts), idle workers are configured with
        the new one and build an engine for it, off the next cell's path. For a catalog whose
        tools are searched by meaning that is the ~9 MB search model, ~25 ms the first cell
        would wait for."""
        fleet = self._fleet
        with fleet.lock:
            if fleet.primer is None or fleet.closed:
                return
            self._prime_due = time.monotonic() + PRIME_DELAY_S
            if self._prime_timer:
                return
            self._prime_timer = True
        timer = threading.Timer(PRIME_DELAY_S, self._prime_when_quiet)
        timer.daemon = True
        timer.start()

    def _prime_when_quiet(self) -> None:
        fleet = self._fleet
        with fleet.lock:
            closed = fleet.closed
            wait = 0.0 if closed else self._prime_due - time.monotonic()
            self._prime_timer = wait > 0
        if wait > 0:  # changed again meanwhile
            timer = threading.Timer(wait, self._prime_when_quiet)
            timer.daemon = True
            timer.start()
        elif not closed:
            self._prime_idle()

    def _prime_idle(self) -> None:
        fleet = self._fleet
        with fleet.lock:
            idle = [lane for lane in fleet.live() if fleet.frames.primable(lane)]
        for lane in idle:
            fleet.frames.prime(lane)

    # ---- running -----------------------------------------------------------------------------
    def start(self, run: Run, configure: Configure, timeout_ms: int) -> Step:
        """Runs a new cell until it completes, fails, or suspends; blocks this thread only."""
        waiter = Waiter()
        direct = self._begin(run, configure, timeout_ms, waiter, direct=True)
        return self._waiting.wait_sync(run, waiter, direct)

    async def start_async(self, run: Run, configure: Configure, timeout_ms: int) -> Step:
        waiter = Waiter(asyncio.get_running_loop())
        self._begin(run, configure, timeout_ms, waiter)
        return await self._waiting.wait_async(run, waiter)

    def resume(self, run: Run, configure: Configure, timeout_ms: int, answer: str = "null") -> Step:
        """Goes on with a suspended run (``wait``): delivers what its tools answered, and
        ``answer`` (JSON) to its yields, and drives it on, replaying its journal first if its
        runtime is gone."""
        leased = self._resume_leased(run, configure, timeout_ms, answer)
        if leased is not None:
            return leased
        waiter = Waiter()
        ready, direct = self._begin_resume(run, configure, timeout_ms, waiter, answer, direct=True)
        return ready if ready is not None else self._waiting.wait_sync(run, waiter, direct)

    async def resume_async(self, run: Run, configure: Configure, timeout_ms: int, answer: str = "null") -> Step:
        waiter = Waiter(asyncio.get_running_loop())
        ready, _ = self._begin_resume(run, configure, timeout_ms, waiter, answer)
        return ready if ready is not None else await self._waiting.wait_async(run, waiter)

    def _begin(
        self, run: Run, configure: Configure, timeout_ms: int, waiter: Waiter, *, direct: bool = False
    ) -> Direct | None:
        """Queues the run's start. ``direct`` (a caller on its own thread): on an idle worker it
        goes out at once: the frames the caller writes, then it reads the reply
        (`FrameQueue.send_direct`)."""
        fleet = self._fleet
        out: Out = []
        with fleet.lock:
            if fleet.closed:
                raise ClosedError("this CodeMode is closed")
            self._attach(run, configure, timeout_ms, waiter, time.monotonic() + timeout_ms / 1000.0)
            sent = fleet.frames.send_direct(run, "start", waiter, out) if direct else None
            if sent is None:
                fleet.frames.enqueue(run, "start", out)
        run_all(out)
        return sent

    def _begin_resume(
        self,
        run: Run,
        configure: Configure,
        timeout_ms: int,
        waiter: Waiter,
        answer: str,
        *,
        direct: bool = False,
        deadline: float | None = None,
    ) -> tuple[Step | None, Direct | None]:
        """Attaches ``waiter`` to the run; the step at once if an advance already ended it.
        A yield's answer is settled like a tool result, so its journal keeps it for a replay.
        ``direct``: as for `_begin`, a settle for a resident run (what the caller writes).
        ``deadline``: the step's, if not ``timeout_ms`` from now (a step that goes on)."""
        fleet = self._fleet
        out: Out = []
        sent: Direct | None = None
        with fleet.lock:
            if fleet.closed:
                raise ClosedError("this CodeMode is closed")
            step = run.step
            held, run.held = run.held, []
            step.tool_calls += len(held)
            if held:
                # The model has asked the run to go on: calls an advance made start now.
                out.append(functools.partial(fleet.tool_starts.submit, run, held))
            fleet.tool_starts.release(run, out)  # and calls whose approval the host has decided
            if step.ended or run.phase is Phase.ENDED:
                # An advance got to where this `wait` would have stopped.
                if step.status == "suspended":
                    run.step = Step()
                ready: Step | None = step
            else:
                ready = None
                if deadline is None:
                    deadline = time.monotonic() + timeout_ms / 1000.0
                    step.extended = False
                self._attach(run, configure, timeout_ms, waiter, deadline)
                if run.yields:
                    run.dispatcher.requeue([CallResult(call_id, True, answer) for call_id in run.yields])
                    run.yields.clear()
                lane = run.lane
                if lane is not None:
                    lane.attached.add(run)
                if run.phase is Phase.PARKED and run.dispatcher.has_ready():
                    kind = "settle" if lane is not None else "replay"
                    if direct and kind == "settle":
                        sent = fleet.frames.send_direct(run, kind, waiter, out)
                    if sent is None:
                        fleet.frames.enqueue(run, kind, out, waiter)
                elif lane is not None:
                    fleet.readers.ensure_reader(lane, waiter)
        run_all(out)
        return ready, sent

    def _resume_leased(self, run: Run, configure: Configure, timeout_ms: int, answer: str) -> Step | None:
        """A `wait` that answers a resident run's yields, with nothing else to deliver or start
        and its worker idle, goes as a cell's first step does (`first_step`): the caller writes
        the settle and reads the reply, and the run takes the lease over (`take_over`). None if
        it cannot go so: the general way (`_begin_resume`) then."""
        fleet = self._fleet
        lease = Lease()
        with fleet.lock:
            lane = run.lane
            if (
                fleet.closed
                or lane is None
                or lane.reader is not None
                or not fleet.frames.idle(lane)
                or run.phase is not Phase.PARKED
                or run.waiter is not None
                or not run.yields
                or run.held
                or run.dispatcher.approvals
                or run.step.ended
                or run.dispatcher.has_ready()
            ):
                return None
            run.configure, run.timeout_ms = configure, timeout_ms
            run.step.extended = False
            answers = [CallResult(call_id, True, answer) for call_id in run.yields]
            run.yields.clear()
            frames = fleet.frames.settle_lease(lane, lease, run, answers)
        self._write_and_look(lease, frames)
        return self.take_over(lease, run, configure, timeout_ms)

    def _attach(self, run: Run, configure: Configure, timeout_ms: int, waiter: Waiter | None, deadline: float) -> None:
        """Under the lock: ``waiter`` waits for the run's step, due at ``deadline`` (none: a
        step whose reply is at hand, `take_over`)."""
        run.configure = configure
        run.timeout_ms = timeout_ms
        run.dispatcher.listener = functools.partial(self._fleet.tool_starts.results_ready, run)
        if waiter is not None:
            run.waiter = waiter
            self._fleet.waited.add(run)
        run.step.deadline = deadline

    # ---- a cell's first step, before it is a run -----------------------------------------------
    def first_step(self, start: Start, configure: Configure, session_id: str) -> Lease | None:
        """A sync exec's cell goes straight to an idle worker before the host makes it a run: most
        cells end in their first step, and a run's bookkeeping was most of what such an exec
        cost the host. None if no worker is idle (it starts as a run: `start`). Else the lease,
        let go of with the report and value if the cell completed plainly within `SPIN_S` (no
        tool call, output or store write); else still held, for the run to take over
        (`take_over`)."""
        fleet = self._fleet
        lease = Lease()
        with fleet.lock:
            if fleet.closed:
                raise ClosedError("this CodeMode is closed")
            lane = fleet.place()
            if isinstance(lane, str) or lane.reader is not None or not fleet.frames.idle(lane):
                return None
            frames = fleet.frames.lease(lane, lease, configure, start, session_id)
        self._write_and_look(lease, frames)
        lone = _lone(lease.read)
        if lone is None:
            return lease
        report, decoded = lone
        if not (
            isinstance(report, Report)
            and report.run == lease.engine_run
            and report.status == "completed"
            and not report.outputs
            and report.store_writes is None
            and isinstance(decoded, tuple)  # (else too heavy for the host)
        ):
            return lease
        out: Out = []
        with fleet.lock:
            if lane.reader is lease and not lane.dead:
                if len(lane.pipeline) == 1 and not (lane.queue or lane.attached or lane.retiring):
                    # (Most often: nothing else is there, nothing is to be handed on; the four
                    # calls below come to this.)
                    lane.pipeline.popleft()
                    lane.reader = None
                else:
                    fleet.frames.next_in_pipeline(lane)
                    fleet.frames.kick(lane, out)
                    fleet.readers.release_reader(lane, lease, out)
                    fleet.retire_if_done(lane, out)
                lease.report, lease.value = report, decoded[1]
        run_all(out)
        return lease

    def _write_and_look(self, lease: Lease, frames: list[Any]) -> None:
        """The leaseholder writes its frames, then reads what the worker answers within
        `SPIN_S` (``lease.read``). Interrupted, it lets go of the lease (`abandon`): a reply
        it read goes where the lane's reader would have sent it."""
        lane = lease.lane
        assert lane is not None
        written = False
        try:
            lane.worker.send(frames, lease.kill_at)  # (a failed write: the read finds the pipe's end)
            written = True
            lease.read = self._fleet.readers.look(lane, SPIN_S)
        except BaseException:
            self.abandon(lease, written)
            raise

    def take_over(self, lease: Lease, run: Run, configure: Configure, timeout_ms: int) -> Step:
        """The run of a leased step (a cell's first, `first_step`; a `wait`'s settle,
        `_resume_leased`) takes the lease over, and what the lease read is routed as its
        reader would have. A reply that ends the step (`_ends_step`) is routed as an advance's
        (`ReportRouter`): no waiter is set up, the step is at hand. A report whose calls the
        caller may run itself is driven first (`_lease_calls`), until a reply is not one.
        Else the run is as a direct `start` or settle leaves one (resident on the lane, its
        frame in flight, its caller the lane's reader), and its step is waited for as any
        run's."""
        fleet = self._fleet
        lane = lease.lane
        assert lane is not None
        ends = _ends_step(lease.read)
        calls = None if ends else self._quick_calls(lease, run)
        if calls is not None:
            parked = self._lease_calls(lease, run, configure, timeout_ms, *calls)
            if parked is not None:
                return parked
            ends = _ends_step(lease.read)
        out: Out = []
        try:
            waiter = None if ends else Waiter()
        except BaseException:
            self.abandon(lease)  # (interrupted before the run took it: the lane must not stay leased)
            raise
        step = run.step
        with fleet.lock:
            closed, dropped = lane.dead, run.aborted  # (dropped: a `wait`'s run, as its settle went out)
            if closed:  # (nothing else ends a leased lane)
                fleet.readers.release_reader(lane, lease, out)
                run.phase = Phase.ENDED
            elif not dropped:
                self._attach(run, configure, timeout_ms, waiter, lease.deadline)
                fleet.frames.hand_over(lease, run, waiter)
                if waiter is None:  # (in the same turn of the lock: routed, then let go of)
                    fleet.readers.routed(lane, lease.read, out)
                    fleet.readers.release_reader(lane, lease, out)
                    if step.status == "suspended":
                        run.step = Step()
        run_all(out)
        if closed:
            return Step(status="failed", failure=_closed())
        if dropped:
            self.abandon(lease)  # (what it read is routed to the run, which drops it)
            return Step(status="failed", failure=_dropped())
        if waiter is not None:
            return self._waiting.wait_sync(run, waiter, read=lease.read)
        # (Not ended: the run was dropped meanwhile, and its reply with it.)
        return step if step.ended else Step(status="failed", failure=_dropped())

    def _quick_calls(self, lease: Lease, run: Run) -> tuple[Report, list[tuple[int, Any]], list[str]] | None:
        """What the lease read, if it is the run's report parked on calls its leaseholder may
        run itself (`_lease_calls`): each to a sync tool that was quick last time with nothing
        in between (`Dispatcher.plain_sync_tools`); with its outputs, and the catalog ids the
        calls reach."""
        lone = _lone(lease.read)
        if lone is None or run.stored_version:
            return None
        report, decoded = lone
        if not (
            isinstance(report, Report)
            and report.status == "pending"
            and report.run == lease.engine_run
            and report.calls
            and len(report.calls) <= run.journal.limits.max_pending_calls
            and isinstance(decoded, tuple)
        ):
            return None
        tools = run.dispatcher.plain_sync_tools(report.calls)
        if tools is None or not self._fleet.tool_starts.quick(tools):
            return None
        return report, decoded[0], tools

    def _lease_calls(
        self,
        lease: Lease,
        run: Run,
        configure: Configure,
        timeout_ms: int,
        report: Report,
        outputs: list[tuple[int, Any]],
        tools: list[str],
    ) -> Step | None:
        """The leaseholder drives its run's quick calls itself, one report and one settle at a
        time, while they come (`_quick_calls`) and the worker has nothing else to do: under the
        lock the run resides on the lane, its report is counted and journaled as routing
        would, and the lane is let go of (another run may use the worker meanwhile); its calls
        run here (`ToolStarter.run_here`); under the lock the lane is leased again for the
        run's settle (`FrameQueue.relet`), which is written and its reply read (`SPIN_S`). None
        when a reply is not one of those (or none came yet): the lease is held and `take_over`
        routes it. A step if the lane could not be had again (someone else's frame, a dead
        worker, the run dropped or past its time): the run, parked with its results, goes on
        as a `wait` of it would, to the same deadline."""
        fleet = self._fleet
        lane = lease.lane
        assert lane is not None
        frames, dispatcher = fleet.frames, run.dispatcher
        run.configure, run.timeout_ms, run.step.deadline = configure, timeout_ms, lease.deadline
        dispatcher.listener = None  # (its results are taken here; `_attach` sets it again)
        while True:
            out: Out = []
            with fleet.lock:
                if lane.reader is not lease or lane.dead or lane.queue or run.aborted:
                    return None
                now = time.monotonic()
                if now >= run.step.deadline:
                    return None
                frames.hand_over(lease, run, None)  # (a first step's report: the run resides)
                run.drive_s = now - lease.sent
                frames.next_in_pipeline(lane)
                run.phase = Phase.PARKED
                fleet.reports.counted(run, report)
                run.step.outputs.extend(outputs)
                calls = journal_calls(run, report)
                run.step.tool_calls += len(calls)
                fleet.readers.release_reader(lane, lease, out)
            run_all(out)
            fleet.tool_starts.run_here(run, calls, tools)
            results = dispatcher.take_ready(max_bytes=SETTLE_BUDGET_BYTES)
            with fleet.lock:
                sent = frames.relet(lane, lease, run, results)
            if sent is None:
                if run.aborted:
                    return Step(status="failed", failure=_dropped())
                if run.step.ended or fleet.closed:  # (closed meanwhile: its step failed with it)
                    return run.step if run.step.ended else Step(status="failed", failure=_closed())
                dispatcher.requeue(results)
                waiter = Waiter()
                ready, direct = self._begin_resume(
                    run, configure, timeout_ms, waiter, "null", direct=True, deadline=run.step.deadline
                )
                return ready if ready is not None else self._waiting.wait_sync(run, waiter, direct)
            self._write_and_look(lease, sent)
            quick = self._quick_calls(lease, run)
            if quick is None:
                return None
            report, outputs, tools = quick

    def abandon(self, lease: Lease, written: bool = True) -> None:
        """A lease held by no run any more (its caller was interrupted, or failed to make the
        run): the lane goes to its thread, which drops the cell's reply when it comes
        (`ReportRouter.route`); a start not wholly written may have left part of a frame in the
        pipe, so that worker is killed (its runs go on elsewhere). A reply the lease read
        already is routed first, as that dropped reply."""
        lane = lease.lane
        assert lane is not None
        got, error, _, _ = lease.read
        if got or error is not None:
            self._fleet.readers.deliver(lane, lease.read)
        out: Out = []
        with self._fleet.lock:
            if not written:
                lane.worker.signal_kill()
            self._fleet.readers.release_reader(lane, lease, out)
        run_all(out)

    def drop(self, run: Run, failure: Failure | None = None) -> None:
        """Frees a run's runtime wherever it is (cancel, expiry, snapshot limit, a caller gone);
        a step in progress ends with ``failure`` (by default: the run was dropped)."""
        if run.phase is Phase.ENDED and run.waiter is None:
            run.aborted = True  # ended is final: nothing else can hold it (most runs end here)
            return
        fleet = self._fleet
        out: Out = []
        with fleet.lock:
            run.aborted = True
            lane = run.lane
            waiter, run.waiter = run.waiter, None
            if run.phase is Phase.RUNNING:
                pass  # its report comes back first; then it is dropped (`ReportRouter.route`)
            elif lane is not None:
                if run.phase is Phase.QUEUED:
                    lane.queue.remove(run)
                if run.phase is not Phase.QUEUED or run.next_frame != "start":
                    send_drop(lane, run, out)
                fleet.forget(run)
            else:
                run.phase = Phase.ENDED
            if waiter is not None:
                fleet.waited.discard(run)
                waiter.step = Step(failure=failure or _dropped())
                out.append(waiter.wake)
        run_all(out)

    def evict(self, run: Run) -> bool:
        """Frees a suspended run's resident runtime and keeps the run: its next `wait` replays
        its journal. False if the run is not parked in a worker (running, or not resident)."""
        out: Out = []
        with self._fleet.lock:
            lane = run.lane
            if lane is None or run.phase is not Phase.PARKED or run.waiter is not None:
                return False
            send_drop(lane, run, out)
            lane.residents.discard(run)
            lane.memory -= run.memory_bytes
            run.memory_bytes = 0
            run.lane = None
        run_all(out)
        return True

    def release_decided(self, run: Run) -> None:
        """The host decided on calls of ``run`` that waited for approval: a run in an
        ``exec``/``wait`` acts on them now; a suspended one with its next ``wait``."""
        out: Out = []
        with self._fleet.lock:
            if run.waiter is not None and not run.aborted:
                self._fleet.tool_starts.release(run, out)
        run_all(out)

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        fleet = self._fleet
        out: Out = []
        with fleet.lock:
            if fleet.closed:
                return
            fleet.closed = True
            lanes, fleet.lanes = fleet.lanes, []
            closed = _closed()
            for lane in lanes:
                lane.dead = True
                for run in list(lane.residents):
                    fleet.forget(run)
                    fleet.end(run, "failed", out, failure=closed)
                lane.worker.signal_kill()  # (its poller, if any, wakes at the pipe's end)
                reader = lane.reader
                fleet.close_when_free(lane, out, lane.worker.kill)
                if isinstance(reader, LoopReader):
                    out.append(functools.partial(fleet.loop_reading.stop, reader))
            for run in list(fleet.waited):  # (those with no lane: waiting for a replay)
                fleet.end(run, "failed", out, failure=closed)
        run_all(out)
        fleet.tool_starts.close()
        self._placement.close()

    @property
    def size(self) -> int:
        return self._fleet.size

    @property
    def spawned(self) -> int:
        """Workers started so far (replacements included)."""
        return self._fleet.spawned

    @property
    def killed(self) -> int:
        """Workers killed so far (crashed, overran, or sent what they should not)."""
        return self._fleet.killed

    def worker_pids(self) -> list[int]:
        with self._fleet.lock:
            return [lane.pid for lane in self._fleet.lanes if not lane.dead]

    def progress(self, run: Run) -> str:
        """Where a run's step is: ``running`` (a frame of it in a worker, or queued for one),
        ``parked`` (on tools, a `wait`, or held calls), or how it ended."""
        with self._fleet.lock:
            if run.step.ended:
                return run.step.status
            if run.phase in (Phase.RUNNING, Phase.QUEUED):
                return "running"
            return "parked"
