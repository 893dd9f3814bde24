"""The fleet: the supervisor's worker lanes, their one lock, and how a run's step ends on them.

    Supervisor ──> Fleet ─┬─ lanes           one per worker process (`workers.Lane`)
                          ├─ lock            guards every lane and every run on them
                          ├─ place/spawn     where a new runtime goes; replacing dead workers
                          ├─ end/forget      a run's step ends; its runtime leaves its worker
                          └─ lane_died       a worker is gone: its culprit fails (`blame`),
                                             every other run on it is replayed elsewhere

The fleet is the state every part of the supervisor shares, and the parts themselves
(`readers`, `frames`, `reports`, `tool_starts`, `waiting`), so that each reaches the others
through one object instead of through each other's privates. Everything here runs under
``lock``; what must happen outside it (pipe writes, wake-ups, starting tools) is appended to
an ``out`` list that the caller runs once it has let go of the lock (`run_all`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import WorkerCrashed
from .protocol import Configure, Drop, utf8_len
from .runs import Failure, Phase, Run, Step
from .workers import WORKER_MEMORY_SLACK, Inflight, Lane

if TYPE_CHECKING:
    from .frames import FrameQueue
    from .loop_reading import LoopReading
    from .placement import Placement
    from .readers import Readers
    from .reports import ReportRouter
    from .tool_starts import ToolStarter

__all__ = [
    "KILL_GRACE_S",
    "READ_TICK_S",
    "RUNS_PER_WORKER",
    "Fleet",
    "Out",
    "drop_engine_run",
    "failed",
    "run_all",
    "send_drop",
    "timed_out",
]

#: How long past the deadline a worker may take to report before it is killed.
KILL_GRACE_S = 0.25
#: Cells a worker starts before it is replaced (once the runs it holds have ended).
RUNS_PER_WORKER = 50_000
#: The longest a reader sleeps between looks at its worker's kill deadline.
READ_TICK_S = 0.05
#: How many workers a start or a replay is tried on before its run fails (a worker that dies
#: before answering is replaced, and the frame goes to the next).
MAX_PLACEMENTS = 3

#: What was decided under the lock, to run once it is let go of.
Out = list[Callable[[], object]]
_log = logging.getLogger(__name__)


def run_all(out: Out) -> None:
    """What was decided under the lock: writes, wake-ups, starting calls. One that raises (a
    bug) is logged and the rest still run: a skipped wake-up would leave a caller waiting."""
    for action in out:
        try:
            action()
        except Exception:
            _log.exception("code mode supervisor: an action failed")


def failed(code: str, name: str, message: str) -> Failure:
    """A failure the host decided (not the guest's exception: no stack)."""
    return Failure(code, name, message, "")


def timed_out(what: str) -> str:
    """A run's failure at its deadline, in the reference's words ("code mode timeout exceeded")."""
    return f"code mode timeout exceeded (the {what} ran past timeoutMs)."


def send_drop(lane: Lane, run: Run, out: Out) -> None:
    """The worker forgets the run's runtime (a frame it does not answer)."""
    drop_engine_run(lane, run.engine_run, out)


def drop_engine_run(lane: Lane, engine_run: int, out: Out) -> None:
    """The worker forgets engine run ``engine_run`` (a frame it does not answer)."""
    out.append(functools.partial(lane.worker.send, [Drop(engine_run)], time.monotonic() + KILL_GRACE_S))


def unsettle(run: Run) -> None:
    """The run's last settle never reached an engine: its batch leaves the journal (and its
    bytes the journal's count) and its results are ready again, to be delivered elsewhere."""
    batch = run.journal.batches.pop()
    run.journal_bytes -= sum(utf8_len(result.payload) for result in batch)
    run.dispatcher.requeue(batch)


class Fleet:
    """The lanes and every run on them, guarded by ``lock``; the supervisor's parts, wired in
    by the `Supervisor` (each is built with the fleet, then named here)."""

    readers: Readers
    loop_reading: LoopReading
    frames: FrameQueue
    reports: ReportRouter
    tool_starts: ToolStarter

    def __init__(
        self,
        size: int,
        *,
        max_runs_per_worker: int,
        max_worker_memory: int,
        max_snapshot_bytes: int,
        max_journal_bytes: int,
        placement: Placement,
    ) -> None:
        self.size = max(1, size)
        #: Where workers run (`codemode.placement`): subprocesses here, or Ray actors.
        self.placement = placement
        self.max_runs = max_runs_per_worker
        self.max_memory = max_worker_memory
        self.max_snapshot = max_snapshot_bytes
        self.max_journal = max_journal_bytes
        self.lock = threading.Lock()
        self.lanes: list[Lane] = []
        self.closed = False
        #: Runs someone waits for (a step in progress): `Supervisor.close` ends them all,
        #: resident or not.
        self.waited: set[Run] = set()
        #: What a new worker is configured with as soon as it is up, before any run needs it
        #: (`Supervisor.prime`, `FrameQueue.prime`): it builds its first engine meanwhile.
        self.primer: Callable[[], Configure] | None = None
        self.spawned = 0
        self.killed = 0
        self._spawn_error = ""
        self._run_ids = itertools.count(1)

    def next_run_id(self) -> int:
        """Under the lock: the id of an engine run, new to every worker."""
        return next(self._run_ids)

    # ---- lanes -------------------------------------------------------------------------------
    def spawn(self) -> Lane | None:
        """Under the lock: a new worker and its lane, whose reader thread (`Readers.to_thread`)
        reads its `Ready`; None if it could not be started (why is kept for the runs that find
        no worker)."""
        try:
            worker = self.placement.start(self.max_memory + WORKER_MEMORY_SLACK)
        except Exception as e:  # (OSError here; whatever a remote placement's client raises)
            self._spawn_error = f"could not start a worker process: {e}"
            return None
        self.spawned += 1
        lane = Lane(worker, self.lock, time.monotonic() + self.placement.spawn_timeout_s)
        self.lanes.append(lane)
        self.readers.ensure_reader(lane)
        return lane

    def live(self) -> list[Lane]:
        return [lane for lane in self.lanes if not lane.dead and not lane.retiring]

    def place(self) -> Lane | str:
        """The lane a new runtime goes to: the least busy with room; else why none has room."""
        live = self.live()
        while len(live) < self.size and (lane := self.spawn()) is not None:
            live.append(lane)  # replaces workers that could not be started before
        best: Lane | None = None
        full = ""
        for lane in live:
            if len(lane.residents) >= self.max_runs:
                full = f"every worker holds maxRunsPerWorker ({self.max_runs}) runs"
            elif lane.memory >= self.max_memory:
                full = f"every worker holds maxWorkerMemoryBytes ({self.max_memory}) of QuickJS memory"
            elif best is None or (lane.busy(), len(lane.residents)) < (best.busy(), len(best.residents)):
                best = lane
        if best is not None:
            return best
        return full or self._spawn_error or "no worker process is running"

    def retire_if_done(self, lane: Lane, out: Out) -> None:
        """Under the lock: a retiring worker that holds nothing more is shut down."""
        if lane.retiring and not lane.residents and not lane.pipeline and not lane.queue and not lane.dead:
            lane.dead = True
            self.lanes.remove(lane)
            self.close_when_free(lane, out, lane.worker.shutdown)

    def close_when_free(self, lane: Lane, out: Out, close: Callable[[], object]) -> None:
        """Under the lock, for a dead lane: its pipes are closed (``close``) now if no one polls
        them, else by the one who does, once it looks (`Readers.release_reader`): an fd is never
        closed, and its number reused, under a poll."""
        lane.cond.notify_all()
        if not self.readers.polling(lane):
            lane.reader = None
            out.append(close)

    # ---- a run's step ------------------------------------------------------------------------
    def end(self, run: Run, status: str, out: Out, *, failure: Failure | None = None, reason: str = "") -> None:
        """Under the lock: the run's step ends; whoever waits for it is woken."""
        step = run.step
        step.status = status
        if failure is not None:
            step.failure = failure
        step.reason = reason
        if status != "suspended":
            run.phase = Phase.ENDED
        waiter = run.waiter
        if waiter is None:
            return  # an advance: the next `wait` finds it
        run.waiter = None
        self.waited.discard(run)
        if run.lane is not None:
            run.lane.attached.discard(run)
        if status == "suspended":
            run.step = Step()
        waiter.step = step
        out.append(waiter.wake)

    def forget(self, run: Run) -> None:
        """Under the lock: the run's runtime is gone from its worker."""
        lane = run.lane
        if lane is not None:
            lane.residents.discard(run)
            lane.attached.discard(run)
            lane.memory -= run.memory_bytes
        run.memory_bytes = 0
        run.lane = None
        run.phase = Phase.ENDED

    def set_memory(self, run: Run, memory_bytes: int) -> None:
        if run.lane is not None:
            run.lane.memory += memory_bytes - run.memory_bytes
        run.memory_bytes = memory_bytes

    # ---- a worker is gone --------------------------------------------------------------------
    def lane_died(self, lane: Lane, error: Exception, out: Out, *, timed_out: bool = False) -> None:
        """Under the lock: a worker is gone (or is killed here). Its culprit fails; every other
        run on it is replayed elsewhere (at once if someone waits for it, else by its `wait`)."""
        if lane.dead:
            return
        lane.dead = True
        lane.worker.signal_kill()
        self.killed += 1
        self.close_when_free(lane, out, lane.worker.kill)
        self.lanes.remove(lane)
        if not self.closed:
            self.spawn()
        inflight = lane.inflight
        culprit = inflight.run if inflight is not None else None
        stillborn = inflight is not None and inflight.kind == "ready"  # it never said it was ready
        # Frames in the pipe behind the culprit's never started: their runs go on elsewhere,
        # and the results a settle among them carried are still to be delivered.
        behind = {entry.run: entry.kind for entry in list(lane.pipeline)[1:] if entry.run is not None}
        lane.pipeline.clear()
        for run, kind in behind.items():
            if kind == "settle":
                unsettle(run)
        runs = list(lane.residents)
        lane.residents.clear()
        lane.attached.clear()
        lane.queue.clear()
        lane.memory = 0
        for run in runs:
            run.lane = None
            run.memory_bytes = 0
            if run.aborted:
                run.phase = Phase.ENDED
            elif run is culprit:
                assert inflight is not None
                self._blame(run, inflight, error, timed_out, out)
            elif (run.phase is Phase.QUEUED and run.next_frame == "start") or behind.get(run) == "start":
                self._elsewhere(run, "start", error, out, stillborn)  # it never ran: it starts elsewhere
            elif run.waiter is not None:
                self._elsewhere(run, "replay", error, out, stillborn)
            else:
                run.phase = Phase.PARKED  # suspended: its next `wait` replays it

    def _elsewhere(self, run: Run, kind: str, error: Exception, out: Out, stillborn: bool) -> None:
        """Under the lock: a run of a dead worker that was not its culprit goes on on another,
        unless the worker never came up (``stillborn``) and neither did the `MAX_PLACEMENTS`
        before it that the run waited for (a worker binary that cannot start, an actor the
        cluster cannot place): then it fails rather than wait for ever."""
        if stillborn:
            run.stillborn += 1
            if run.stillborn >= MAX_PLACEMENTS:
                message = (
                    f"code mode runtime is unavailable: {MAX_PLACEMENTS} workers died before they were ready: {error}"
                )
                self.end(run, "failed", out, failure=failed("runtime_unavailable", "WorkerUnavailable", message))
                return
        self.frames.enqueue(run, kind, out)

    def _blame(self, run: Run, inflight: Inflight, error: Exception, timed_out_: bool, out: Out) -> None:
        """Under the lock: the run whose frame the dead worker was executing."""
        if timed_out_:
            what = "replay" if inflight.kind == "replay" else "cell"
            self.end(run, "failed", out, failure=failed("timeout", "TimeoutError", timed_out(what)))
            return
        if isinstance(error, WorkerCrashed) and run.placements < MAX_PLACEMENTS:
            # Dead under the frame, maybe before it read it (killed from outside, while idle: a
            # kill is not visible at once): the run goes on elsewhere from its journal, the
            # results of that frame delivered again. A run that kills every worker it is given
            # fails once it has had `MAX_PLACEMENTS`.
            if inflight.kind == "settle":
                unsettle(run)
            if run.waiter is None:
                run.phase = Phase.PARKED  # an advance: the next `wait` replays
            else:
                kind = "start" if inflight.kind == "start" and not run.step.reports else "replay"
                self.frames.enqueue(run, kind, out)
            return
        if isinstance(error, WorkerCrashed):
            # The spec's `runtime_unavailable`: a QuickJS worker that exits with a non-zero status.
            what = "replay failed" if inflight.kind == "replay" else "worker crashed"
            failure = failed("runtime_unavailable", "WorkerCrashed", f"code mode {what}: {error}")
        else:
            failure = failed("internal_error", type(error).__name__, str(error))
        self.end(run, "failed", out, failure=failure)
