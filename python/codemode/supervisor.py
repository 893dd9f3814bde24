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
import concurrent.futures
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from . import protocol
from ._engine import YIELD_TOOL
from .errors import ClosedError, ProtocolError, WorkerCrashed
from .hotloop import HotLoop, watch
from .protocol import (
    CallResult,
    Configure,
    Drop,
    Fault,
    Ready,
    Replay,
    Report,
    Settle,
    decode_guest_json,
    input_hash,
    too_heavy,
    utf8_len,
)
from .runs import JournalCall, Phase, Run, Step
from .workers import READER_THREAD, WORKER_MEMORY_SLACK, Inflight, Lane, WorkerProcess

__all__ = ["KILL_GRACE_S", "SYNC_TOOL_THREADS", "Supervisor"]

#: How long past the deadline a worker may take to report before it is killed.
KILL_GRACE_S = 0.25
#: The least time a run gets to use tool results it is handed, even when they arrive just at the
#: deadline (the smallest allowed ``timeoutMs``): otherwise a result landing late in a ``wait``
#: would turn into a timeout instead of progress.
SETTLE_FLOOR_S = 0.1
#: How long a new worker may take to say it is ready.
SPAWN_TIMEOUT_S = 10.0
#: Cells a worker starts before it is replaced (once the runs it holds have ended).
RUNS_PER_WORKER = 50_000
#: The longest a reader sleeps between looks at its worker's kill deadline.
READ_TICK_S = 0.05
#: Frames written to a busy worker behind the one it executes, at most, and the largest such a
#: frame may be (a pipe holds 64 KiB: no write to a worker that is busy ever blocks).
PIPELINE_DEPTH = 4
PIPELINE_FRAME_BYTES = 8 << 10
#: A run whose last frame took its worker at most this long may queue its next in the pipe.
PIPELINE_QUICK_S = 0.002
#: A sync tool that took at most this long last time runs on the thread waiting for its run (no
#: hop to the pool); one not yet seen, or slower, runs on the pool, so that the waiting thread
#: stays free to end its `exec` at the deadline whatever the tool does.
QUICK_TOOL_S = 0.005
#: How far into a lane's queue fair queueing looks for the session served longest ago.
FAIR_SCAN = 64
#: Sessions whose last service is remembered (the rest count as never served).
SERVED_SESSIONS = 4096
#: Threads that run the sync tools of ``exec_async`` runs (whose callers have no thread to
#: lend): at most this many sync tools run at once for them; more wait their turn.
SYNC_TOOL_THREADS = 8
#: Threads that run, for `exec`/`wait` callers, the sync tools not known to be quick: each
#: caller's thread waits meanwhile (and ends its call at the deadline), so as many may run at
#: once as there are such callers, up to this.
CALLER_TOOL_THREADS = 256
#: How many workers a start or a replay is tried on before its run fails (a worker that dies
#: before answering is replaced, and the frame goes to the next).
MAX_PLACEMENTS = 3
#: Result bytes one settle frame carries at most; with one result of up to the bridge limit
#: (16 MiB) always allowed, a settle stays well under ``protocol.MAX_FRAME_BYTES``.
SETTLE_BUDGET_BYTES = protocol.MAX_FRAME_BYTES // 2

Out = list[Callable[[], object]]
_log = logging.getLogger(__name__)


def _failed(code: str, name: str, message: str) -> tuple[str | None, str, str, str]:
    return (code, name, message, "")


def _unsettle(run: Run) -> None:
    """The run's last settle never reached an engine: its batch leaves the journal (and its
    bytes the journal's count) and its results are ready again, to be delivered elsewhere."""
    batch = run.journal.batches.pop()
    run.journal_bytes -= sum(utf8_len(result.payload) for result in batch)
    run.dispatcher.requeue(batch)


def _journal_full(length: int, limit: int) -> str:
    return (
        f"tool result of {length} bytes would grow this run's journal past maxJournalBytes ({limit}); "
        "ask the tool for less (a page, a filter, fewer fields)."
    )


def _run_all(out: Out) -> None:
    """What was decided under the lock: writes, wake-ups, starting calls. One that raises (a
    bug) is logged and the rest still run: a skipped wake-up would leave a caller waiting."""
    for action in out:
        try:
            action()
        except Exception:
            _log.exception("code mode supervisor: an action failed")


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
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
        if _on_loop(self.loop):
            self._resolve()
            return
        try:
            self.loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    def _resolve(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(None)


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


def _journal_calls(run: Run, report: Report) -> list[tuple[int, str, str]]:
    """Journals the calls ``report`` started; returns the tool calls among them ``(call_id,
    tool, input)`` (a ``yield_control`` joins the run's yields instead)."""
    journal = run.journal
    calls = []
    for call_id, tool, data, method in report.calls:
        journal.calls.append(JournalCall(call_id, tool, input_hash(data), method))
        if tool == YIELD_TOOL:
            run.yields.append(call_id)
            continue
        calls.append((call_id, tool, data))
        if journal.restart_safe:
            journal.open_inputs[call_id] = data
            run.journal_bytes += utf8_len(data)
    return calls


def _send_drop(lane: Lane, run: Run, out: Out) -> None:
    """The worker forgets the run's runtime (a frame it does not answer)."""
    out.append(functools.partial(lane.worker.send, [Drop(run.engine_run)], time.monotonic() + KILL_GRACE_S))


def _timed_out(what: str) -> str:
    """A run's failure at its deadline, in the reference's words ("code mode timeout exceeded")."""
    return f"code mode timeout exceeded (the {what} ran past timeoutMs)."


def _decoded(report: Report) -> tuple[list[tuple[int, Any]], Any, Any] | str:
    """The guest JSON of a report, decoded (a ``ProtocolError`` if it is not JSON), outside the
    lock: outputs, the value, the store writes; or why it is too heavy to decode (the run
    fails, its worker is not to blame)."""
    texts = [text for kind, text in report.outputs if kind == 1]
    texts.extend(text for text in (report.value, report.store_writes) if text is not None)
    for text in texts:
        heavy = too_heavy(text)
        if heavy is not None:
            return f"code mode output limit exceeded: the result is too heavy for the host: {heavy}."
    outputs: list[tuple[int, Any]] = [
        (kind, decode_guest_json(text) if kind == 1 else text) for kind, text in report.outputs
    ]
    value = decode_guest_json(report.value) if report.status == "completed" and report.value is not None else None
    writes = decode_guest_json(report.store_writes) if report.store_writes is not None else None
    return outputs, value, writes


class Supervisor:
    """The worker lanes and every run on them. All state is guarded by one lock; pipe I/O,
    waking and tool code run outside it."""

    def __init__(
        self,
        size: int,
        *,
        max_runs_per_worker: int = 512,
        max_worker_memory: int = 2 << 30,
        max_snapshot_bytes: int = 10 << 20,
        max_journal_bytes: int = 16 << 20,
    ) -> None:
        self._size = max(1, size)
        self._max_runs = max_runs_per_worker
        self._max_memory = max_worker_memory
        self._max_snapshot = max_snapshot_bytes
        self._max_journal = max_journal_bytes
        #: Sync tool id -> how long the last batch of calls with it took (see `_quick`).
        self._tool_took: dict[str, float] = {}
        #: Session id -> when it last had a frame sent, oldest first (fair queueing).
        self._served: dict[str, int] = {}
        self._serve_ticks = itertools.count()
        self._lock = threading.Lock()
        self._lanes: list[Lane] = []
        self._closed = False
        self._run_ids = itertools.count(1)
        self._spawn_error = ""
        #: Threads for sync tools: of `exec_async` runs and advances (few), and standing in
        #: for `exec` callers whose tools are not known to be quick (as many as such callers).
        self._pools: dict[bool, concurrent.futures.ThreadPoolExecutor] = {}
        #: Runs someone waits for (a step in progress): `close` ends them all, resident or not.
        self._waited: set[Run] = set()
        self.spawned = 0
        self.killed = 0
        with self._lock:
            for _ in range(self._size):
                self._spawn_locked()

    # ---- lanes -------------------------------------------------------------------------------
    def _spawn_locked(self) -> Lane | None:
        try:
            worker = WorkerProcess(self._max_memory + WORKER_MEMORY_SLACK)
        except OSError as e:
            self._spawn_error = f"could not start a worker process: {e}"
            return None
        self.spawned += 1
        lane = Lane(worker, self._lock, time.monotonic() + SPAWN_TIMEOUT_S)
        self._lanes.append(lane)
        lane.thread = threading.Thread(target=self._reader_thread, args=(lane,), name="codemode-reader", daemon=True)
        lane.thread.start()
        self._ensure_reader(lane)
        return lane

    def _live(self) -> list[Lane]:
        return [lane for lane in self._lanes if not lane.dead and not lane.retiring]

    def _place(self) -> Lane | str:
        """The lane a new runtime goes to: the least busy with room; else why none has room."""
        live = self._live()
        while len(live) < self._size and (lane := self._spawn_locked()) is not None:
            live.append(lane)  # replaces workers that could not be started before
        best: Lane | None = None
        full = ""
        for lane in live:
            if len(lane.residents) >= self._max_runs:
                full = f"every worker holds maxRunsPerWorker ({self._max_runs}) runs"
            elif lane.memory >= self._max_memory:
                full = f"every worker holds maxWorkerMemoryBytes ({self._max_memory}) of QuickJS memory"
            elif best is None or (lane.busy(), len(lane.residents)) < (best.busy(), len(best.residents)):
                best = lane
        if best is not None:
            return best
        return full or self._spawn_error or "no worker process is running"

    def _need_reader(self, lane: Lane, but: Run | None = None) -> bool:
        """The lane has a frame in flight or queued, or callers waiting on it (``but`` aside:
        the run of a caller that goes to run its sync tools and sends their results itself)."""
        return bool(lane.inflight is not None or lane.queue or len(lane.attached) > (but in lane.attached))

    def _ensure_reader(self, lane: Lane, prefer: Waiter | None = None) -> None:
        """Someone reads the lane while it has work in flight or callers waiting on it: the
        caller ``prefer`` (a thread, which is woken to do it), else the lane's thread. A caller
        reading it that is away running its sync tools hands the reading over, unless it is the
        one preferred (on its own thread, done with them: their results are being sent)."""
        if lane.dead or not self._need_reader(lane):
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
            lane.reader = READER_THREAD
            lane.cond.notify()

    def _release_reader(self, lane: Lane, me: object, out: Out, but: Run | None = None) -> None:
        """``me`` stops reading the lane: the lane's thread goes on if anything needs it."""
        if lane.reader is not me:
            return
        lane.reader = None
        if lane.dead:
            out.append(lane.worker.kill)  # (the reader closes the pipes it polled)
        elif self._need_reader(lane, but):
            lane.reader = READER_THREAD
            lane.cond.notify()

    # ---- running -----------------------------------------------------------------------------
    def start(self, run: Run, configure: Configure, timeout_ms: int) -> Step:
        """Runs a new cell until it completes, fails, or suspends; blocks this thread only."""
        waiter = Waiter()
        self._begin(run, configure, timeout_ms, waiter)
        return self._wait_sync(run, waiter)

    async def start_async(self, run: Run, configure: Configure, timeout_ms: int) -> Step:
        waiter = Waiter(asyncio.get_running_loop())
        self._begin(run, configure, timeout_ms, waiter)
        return await self._wait_async(run, waiter)

    def _begin(self, run: Run, configure: Configure, timeout_ms: int, waiter: Waiter) -> None:
        out: Out = []
        with self._lock:
            if self._closed:
                raise ClosedError("this CodeMode is closed")
            run.configure = configure
            run.timeout_ms = timeout_ms
            run.dispatcher.listener = functools.partial(self._results_ready, run)
            run.waiter = waiter
            self._waited.add(run)
            run.step.deadline = time.monotonic() + timeout_ms / 1000.0
            self._enqueue(run, "start", out)
        _run_all(out)

    def resume(self, run: Run, configure: Configure, timeout_ms: int, answer: str = "null") -> Step:
        """Goes on with a suspended run (``wait``): delivers what its tools answered, and
        ``answer`` (JSON) to its yields, and drives it on, replaying its journal first if its
        runtime is gone."""
        waiter = Waiter()
        ready = self._begin_resume(run, configure, timeout_ms, waiter, answer)
        return ready if ready is not None else self._wait_sync(run, waiter)

    async def resume_async(self, run: Run, configure: Configure, timeout_ms: int, answer: str = "null") -> Step:
        waiter = Waiter(asyncio.get_running_loop())
        ready = self._begin_resume(run, configure, timeout_ms, waiter, answer)
        return ready if ready is not None else await self._wait_async(run, waiter)

    def _begin_resume(
        self, run: Run, configure: Configure, timeout_ms: int, waiter: Waiter, answer: str
    ) -> Step | None:
        """Attaches ``waiter`` to the run; the step at once if an advance already ended it.
        A yield's answer is settled like a tool result, so its journal keeps it for a replay."""
        out: Out = []
        with self._lock:
            if self._closed:
                raise ClosedError("this CodeMode is closed")
            step = run.step
            held, run.held = run.held, []
            step.tool_calls += len(held)
            if held:
                # The model has asked the run to go on: calls an advance made start now.
                out.append(functools.partial(self._submit, run, held))
            self._release(run, out)  # and calls whose approval the host has decided
            if step.ended or run.phase is Phase.ENDED:
                # An advance got to where this `wait` would have stopped.
                if step.status == "suspended":
                    run.step = Step()
                ready: Step | None = step
            else:
                ready = None
                run.configure = configure
                run.timeout_ms = timeout_ms
                run.dispatcher.listener = functools.partial(self._results_ready, run)
                run.waiter = waiter
                self._waited.add(run)
                step.deadline = time.monotonic() + timeout_ms / 1000.0
                step.extended = False
                if run.yields:
                    run.dispatcher.requeue([CallResult(call_id, True, answer) for call_id in run.yields])
                    run.yields.clear()
                lane = run.lane
                if lane is not None:
                    lane.attached.add(run)
                if run.phase is Phase.PARKED and run.dispatcher.has_ready():
                    self._enqueue(run, "settle" if lane is not None else "replay", out, waiter)
                elif lane is not None:
                    self._ensure_reader(lane, waiter)
        _run_all(out)
        return ready

    def drop(self, run: Run) -> None:
        """Frees a run's runtime wherever it is (cancel, expiry, snapshot limit, a caller gone)."""
        if run.phase is Phase.ENDED and run.waiter is None:
            run.aborted = True  # ended is final: nothing else can hold it (most runs end here)
            return
        out: Out = []
        with self._lock:
            run.aborted = True
            lane = run.lane
            waiter, run.waiter = run.waiter, None
            if run.phase is Phase.RUNNING:
                pass  # its report comes back first; then it is dropped (`_reported`)
            elif lane is not None:
                if run.phase is Phase.QUEUED:
                    lane.queue.remove(run)
                if run.phase is not Phase.QUEUED or run.next_frame != "start":
                    _send_drop(lane, run, out)
                self._forget(run)
            else:
                run.phase = Phase.ENDED
            if waiter is not None:
                self._waited.discard(run)
                waiter.step = Step(failure=_failed("internal_error", "CancelledError", "code mode run was dropped"))
                out.append(waiter.wake)
        _run_all(out)

    def evict(self, run: Run) -> bool:
        """Frees a suspended run's resident runtime and keeps the run: its next `wait` replays
        its journal. False if the run is not parked in a worker (running, or not resident)."""
        out: Out = []
        with self._lock:
            lane = run.lane
            if lane is None or run.phase is not Phase.PARKED or run.waiter is not None:
                return False
            _send_drop(lane, run, out)
            lane.residents.discard(run)
            lane.memory -= run.memory_bytes
            run.memory_bytes = 0
            run.lane = None
        _run_all(out)
        return True

    # ---- waiting -----------------------------------------------------------------------------
    def _wait_sync(self, run: Run, waiter: Waiter) -> Step:
        """The calling thread waits for the run's step: it runs the run's sync tools, reads the
        run's worker itself while no one else does (for every run there), or sleeps until it is
        woken or its deadline comes. (A wake-up that comes while it is busy is kept: its next
        sleep returns at once and it looks again; so does a stale one.)"""
        try:
            return self._wait_sync_loop(run, waiter)
        except BaseException:
            # (An interrupt, say, or a sync tool's BaseException.) Never left as a lane's
            # reader: the lane goes to its thread, and the run is dropped by the caller.
            out: Out = []
            with self._lock:
                waiter.polling = None
                for lane in self._lanes:
                    if lane.reader is waiter:
                        self._release_reader(lane, waiter, out)
            _run_all(out)
            raise

    def _wait_sync_loop(self, run: Run, waiter: Waiter) -> Step:
        held: Lane | None = None  # where this thread is the reader
        while True:
            out: Out = []
            poll = sleep = None
            with self._lock:
                waiter.polling = None
                work, waiter.work = waiter.work, []
                waiter.busy = bool(work)
                held = self._reading_lane(run, waiter, held, bool(work), out)
                done = waiter.step if not work else None
                if not work and done is None:
                    sleep = self._budget(run, waiter, out)
                    if held is not None and sleep is not None:
                        poll, sleep = min(self._poll_timeout(held), sleep), None
                        waiter.polling = held
            _run_all(out)
            if done is not None:
                return done
            if work:
                for fn in work:
                    fn()
            elif poll is not None:
                assert held is not None
                self._pump(held, poll)
            elif sleep is not None:
                waiter.event.wait(sleep)

    def _reading_lane(self, run: Run, waiter: Waiter, held: Lane | None, work: bool, out: Out) -> Lane | None:
        """The lane a waiting thread reads from now on (the caller holds the lock): ``held``
        unless another took it over, one handed to it, or its run's lane if that needs a
        reader; none while it has ``work`` to do or its step is done."""
        lane = run.lane
        if held is not None and held.reader is not waiter:
            held = None  # taken over while this thread ran tools
        if held is None and lane is not None and lane.reader is waiter:
            held = lane  # handed to it (`_ensure_reader`)
        if held is not None and (work or waiter.step is not None or held is not lane or held.dead):
            # (its own tools are the run's: no one needs to read for it meanwhile)
            self._release_reader(held, waiter, out, run if work else None)
            held = None
        if work or waiter.step is not None:
            return held
        if held is None and lane is not None and not lane.dead and lane.reader is None and self._need_reader(lane):
            held, lane.reader = lane, waiter
        return held

    async def _wait_async(self, run: Run, waiter: Waiter) -> Step:
        loop = waiter.loop
        assert loop is not None and waiter.future is not None
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer
            if timer is not None:
                timer.cancel()
                timer = None
            out: Out = []
            with self._lock:
                delay = None if waiter.step is not None else self._budget(run, waiter, out)
            _run_all(out)
            if delay is not None:
                timer = loop.call_later(delay, check)

        def poke() -> None:
            try:
                (loop.call_soon if _on_loop(loop) else loop.call_soon_threadsafe)(check)
            except RuntimeError:
                pass  # the loop is closed

        waiter.poke = poke
        check()
        try:
            await waiter.future
        except asyncio.CancelledError:
            self.drop(run)  # nobody will ever ask for it: its tools are cancelled by the caller
            raise
        finally:
            if timer is not None:
                timer.cancel()
        assert waiter.step is not None
        return waiter.step

    def _budget(self, run: Run, waiter: Waiter, out: Out) -> float | None:
        """Under the lock: suspends a parked run whose deadline has passed; else how long its
        waiter may sleep before it looks again. None once the step has ended."""
        if run.waiter is not waiter:
            return None
        now = time.monotonic()
        step = run.step
        if run.phase is Phase.PARKED:
            if run.starting:
                return READ_TICK_S  # its calls are being started: `_submit` pokes it after
            if now < step.deadline and _awaits_only_approvals(run):
                # Nothing the run waits on can come before the host decides: hand the model
                # back its turn now, not at the deadline (the next `wait` goes on).
                self._end(run, "suspended", out, reason="pending_tools")
                return None
            if now >= step.deadline:
                if run.lent and now < run.lent_at + KILL_GRACE_S:
                    # Sync tools handed to the pool just now: they may answer at once, as they
                    # would have on this thread (the guest then runs on, into its timeout).
                    return run.lent_at + KILL_GRACE_S - now
                self._end(run, "suspended", out, reason="pending_tools")
                return None
            return step.deadline - now
        lane = run.lane
        if run.phase is Phase.RUNNING and lane is not None and lane.inflight is not None:
            if now < step.deadline:
                return step.deadline - now
            # Its worker's reader kills it at the kill time: the report (or the kill) ends it.
            return max(READ_TICK_S, lane.inflight.kill_at - now)
        # Queued: the time in the queue is not charged (`_frame_for`), so look again later.
        return max(READ_TICK_S, step.deadline - run.queued_at)

    def _reader_thread(self, lane: Lane) -> None:
        while True:
            out: Out = []
            with self._lock:
                while lane.reader is not READER_THREAD and not lane.dead:
                    lane.cond.wait()
                if lane.dead:
                    self._release_reader(lane, READER_THREAD, out)
                    timeout = None
                elif not self._need_reader(lane):
                    lane.reader = None
                    continue
                else:
                    timeout = self._poll_timeout(lane)
            if timeout is None:
                _run_all(out)
                return
            self._pump(lane, timeout)

    def _overdue(self, inflight: Inflight, spoke: bool) -> bool:
        """Past the kill time; a worker writing its report just then gets one more grace to
        finish it (only one: a worker that trickles bytes is killed all the same)."""
        now = time.monotonic()
        return now >= inflight.kill_at + (KILL_GRACE_S if spoke else 0.0)

    def _poll_timeout(self, lane: Lane) -> float:
        if lane.inflight is None:
            return READ_TICK_S
        return max(0.0, min(READ_TICK_S, lane.inflight.kill_at - time.monotonic()))

    # ---- reading -----------------------------------------------------------------------------
    def _pump(self, lane: Lane, timeout: float) -> None:
        """One look at the worker (by its current reader): route what it wrote, or kill it if
        its frame is past the kill time."""
        worker = lane.worker
        out: Out = []
        error: Exception | None = None
        timed_out = False
        frames: list[tuple[protocol.WorkerFrame, Any]] = []
        spoke = worker.readable(timeout)
        if spoke:
            try:
                got = worker.receive()
                if got is None:
                    timed_out = worker.overdue
                    error = worker.crashed(f"worker {worker.pid} exited", timed_out=timed_out)
                else:
                    frames = [(f, _decoded(f) if isinstance(f, Report) else None) for f in got]
            except ProtocolError as e:
                error = e
            except OSError as e:
                error = worker.crashed(f"worker {worker.pid} pipe failed: {e}")
        with self._lock:
            if lane.dead:
                return
            try:
                for frame, decoded in frames:
                    self._route(lane, frame, decoded, out)
            except ProtocolError as e:
                error = e
            except Exception as e:
                # A bug in routing must not stop this worker's reader (its runs would hang):
                # the worker is discarded as if it had sent a bad frame.
                _log.exception("code mode supervisor: routing a frame from worker %s failed", worker.pid)
                error = ProtocolError(f"code mode could not route a frame from worker {worker.pid}: {e!r}")
            if error is not None:
                self._lane_died(lane, error, out, timed_out=timed_out)
            elif lane.inflight is not None and self._overdue(lane.inflight, spoke):
                error = worker.crashed(f"worker {worker.pid} overran its deadline", timed_out=True)
                self._lane_died(lane, error, out, timed_out=True)
        _run_all(out)

    def _route(self, lane: Lane, frame: protocol.WorkerFrame, decoded: Any, out: Out) -> None:
        """Under the lock: one frame from a worker, to the run whose frame it was executing."""
        inflight = lane.inflight
        if isinstance(frame, Ready):
            if inflight is None or inflight.kind != "ready":
                raise ProtocolError(f"worker {lane.pid} introduced itself twice")
            self._next_in_pipeline(lane)
            self._kick(lane, out)
            return
        if isinstance(frame, Fault) and frame.run == 0:
            raise ProtocolError(f"worker {lane.pid} refused its configuration: {frame.message}")
        run = inflight.run if inflight is not None else None
        if inflight is None or run is None or frame.run != run.engine_run:
            raise ProtocolError(f"worker {lane.pid} answered out of order")
        if isinstance(frame, Report) and frame.status == "pending":
            if len(frame.calls) > run.journal.limits.max_pending_calls:
                # An engine never has more calls in flight: this worker is not one of ours.
                raise ProtocolError(f"worker {lane.pid} reported more calls than maxPendingToolCalls")
        run.drive_s = time.monotonic() - inflight.sent
        self._next_in_pipeline(lane)
        if isinstance(frame, Fault):
            self._forget(run)
            message = f"code mode runtime is unavailable: {frame.message}"
            self._end(run, "failed", out, failure=_failed("runtime_unavailable", "WorkerUnavailable", message))
        elif not isinstance(frame, Report):
            raise ProtocolError(f"worker {lane.pid} sent {type(frame).__name__} unasked")
        elif run.aborted:
            if frame.status == "pending":
                _send_drop(lane, run, out)
            self._forget(run)
        elif inflight.kind == "replay":
            self._replayed(lane, run, frame, inflight, out)
        else:
            self._reported(lane, run, frame, decoded, out)
        self._kick(lane, out)
        self._retire_if_done(lane, out)

    def _reported(self, lane: Lane, run: Run, report: Report, decoded: Any, out: Out) -> None:
        journal, step = run.journal, run.step
        run.placements = 0  # it got somewhere: a later death is a new one
        if isinstance(decoded, str):
            if report.status == "pending":
                _send_drop(lane, run, out)
            self._forget(run)
            self._end(run, "failed", out, failure=_failed("output_limit_exceeded", "OutputLimitError", decoded))
            return
        outputs, value, writes = decoded
        step.reports += 1
        step.searches += report.searches
        step.describes += report.describes
        step.outputs.extend(outputs)
        step.memory_bytes = report.memory_bytes
        self._set_memory(run, report.memory_bytes)
        journal.clock_reads.extend(report.clock_reads)
        if report.status == "completed":
            step.value, step.store_writes = value, writes
            self._forget(run)
            self._end(run, "completed", out)
            return
        if report.status == "failed":
            self._forget(run)
            self._end(run, "failed", out, failure=report.failure)
            return
        run.phase = Phase.PARKED
        calls = _journal_calls(run, report)
        if run.waiter is None:
            self._advanced(lane, run, calls, out)
        else:
            self._parked(run, calls, out)

    def _advanced(self, lane: Lane, run: Run, calls: list[tuple[int, str, str]], out: Out) -> None:
        """A run that parked while no one waits for it (an advance): nothing the host would see
        starts before the model asks for it. The run stays suspended, so the snapshot limit
        holds here as at any suspension."""
        overrun = run.snapshot_overrun(self._max_snapshot)
        if overrun is not None:
            _send_drop(lane, run, out)
            self._forget(run)
            self._end(run, "failed", out, failure=_failed("snapshot_limit_exceeded", "SnapshotLimitError", overrun))
            return
        run.held.extend(calls)
        if run.yields:
            run.step.status, run.step.reason = "suspended", "yield"
        elif not run.held and run.dispatcher.has_ready():
            self._enqueue(run, "settle", out)

    def _parked(self, run: Run, calls: list[tuple[int, str, str]], out: Out) -> None:
        """A run that parked on ``calls`` (and yields) while its waiter waits: its calls start,
        and it suspends, settles what is ready, or goes on waiting."""
        journal, step = run.journal, run.step
        if calls:
            step.tool_calls += len(calls)
            run.starting += 1
            out.append(functools.partial(self._submit, run, calls, True))
        if run.yields:
            self._end(run, "suspended", out, reason="yield")
        elif journal.restart_safe:
            # Restart-safe runs are never drained within the call (the spec), not even by a
            # tool that answered at once: each result goes through a `wait`.
            self._end(run, "suspended", out, reason="pending_tools")
        elif run.dispatcher.has_ready():
            self._enqueue(run, "settle", out)
        elif _awaits_only_approvals(run):
            self._end(run, "suspended", out, reason="pending_tools")
        elif time.monotonic() >= step.deadline:
            # Past the deadline: suspended by its waiter, once its sync tools (which run on
            # the waiter's thread) have had their turn: a guest whose tools answer at once is
            # still running, and the kill ends it.
            out.append(run.waiter.poke)

    def _replayed(self, lane: Lane, run: Run, report: Report, inflight: Inflight, out: Out) -> None:
        journal, step = run.journal, run.step
        expected = [(c.id, c.tool, c.input_hash, c.method) for c in journal.calls]
        got = list(report.calls)
        if report.status != "pending" or got != expected:
            if report.status == "pending":
                _send_drop(lane, run, out)
            self._forget(run)
            message = f"code mode run diverged on replay: {_divergence(expected, got, report.status)}"
            self._end(run, "failed", out, failure=_failed("internal_error", "DivergenceError", message))
            return
        run.placements = 0
        self._set_memory(run, report.memory_bytes)
        step.memory_bytes = report.memory_bytes
        run.phase = Phase.PARKED
        # Rebuilding is not the guest's time: its budget goes on once the runtime is back.
        step.deadline += time.monotonic() - inflight.sent
        if run.dispatcher.has_ready():
            self._enqueue(run, "settle", out)
        elif run.waiter is not None and _awaits_only_approvals(run):
            self._end(run, "suspended", out, reason="pending_tools")

    def _results_ready(self, run: Run) -> None:
        """The dispatcher's listener, on the thread where a result landed: a parked run that
        someone waits for (or that an advance may take on) gets a settle queued."""
        out: Out = []
        with self._lock:
            if run.phase is not Phase.PARKED or run.aborted or self._closed:
                return
            if not run.dispatcher.has_ready():
                # A call was filed for approval: its waiter looks again (`_budget`).
                if run.waiter is not None:
                    out.append(run.waiter.poke)
            elif run.waiter is None and (
                run.lane is None or run.yields or run.held or run.journal.restart_safe or run.step.ended
            ):
                return  # suspended: the next `wait` delivers it
            else:
                self._enqueue(run, "settle" if run.lane is not None else "replay", out)
        _run_all(out)

    def release_decided(self, run: Run) -> None:
        """The host decided on calls of ``run`` that waited for approval: a run in an
        ``exec``/``wait`` acts on them now; a suspended one with its next ``wait``."""
        out: Out = []
        with self._lock:
            if run.waiter is not None and not run.aborted:
                self._release(run, out)
        _run_all(out)

    def _release(self, run: Run, out: Out) -> None:
        """Under the lock: starts (outside it) what the host decided on (`approvals`)."""
        decided = run.dispatcher.approvals.take_decided()
        if decided:
            calls = [(call_id, filed.tool_id, "") for call_id, filed, _ in decided]
            start = functools.partial(run.dispatcher.release, decided)
            out.append(functools.partial(self._submit, run, calls, start=start))

    def _submit(
        self,
        run: Run,
        calls: list[tuple[int, str, str]],
        counted: bool = False,
        start: Callable[[], Callable[[], None] | None] | None = None,
    ) -> None:
        """Starts a run's calls (outside the lock); its sync tools go to the thread waiting for
        the run when they were quick last time, else to a pool (the waiting thread must be free
        to end the `exec` at its deadline). ``counted``: in ``run.starting``, which this ends.
        ``start``: what starts them, if not `Dispatcher.submit` (calls released by approvals)."""
        try:
            inline = run.dispatcher.submit(calls) if start is None else start()
        except Exception:  # (a bug: the run must still end, not wait on `starting` for good)
            _log.exception("code mode supervisor: starting calls failed")
            inline = None
        # Each call's catalog id (the guest's own name for it when that is one): never a name
        # the guest made up, so `_tool_took` holds at most one entry per tool.
        resolved, known = run.dispatcher.resolved, run.dispatcher.view.tools
        tools = [tool for call_id, name, _ in calls if (tool := resolved.get(call_id, name)) in known]
        out: Out = []
        pool = None
        lent = False
        with self._lock:
            if counted:
                run.starting -= 1
            waiter = run.waiter
            if inline is None:
                if counted and waiter is not None:
                    waiter.poke()  # (it may have slept through its deadline meanwhile)
                self._hand_to_loop(run, out)
            elif waiter is not None and waiter.loop is None and self._quick(tools):
                # Its own thread runs them, once it is done with what it is doing now (when that
                # is reading for other runs, with their actions: none waits for these tools).
                waiter.work.append(functools.partial(self._timed, run, inline, tools, False))
                waiter.event.set()
                return
            else:
                lent = waiter is not None and waiter.loop is None
                if lent:
                    run.lent += 1
                    run.lent_at = time.monotonic()
                pool = self._pools.get(lent)
                if pool is None:
                    size, name = (
                        (CALLER_TOOL_THREADS, "codemode-caller-tools")
                        if lent
                        else (SYNC_TOOL_THREADS, "codemode-sync-tools")
                    )
                    pool = self._pools[lent] = concurrent.futures.ThreadPoolExecutor(size, name)
        _run_all(out)
        if inline is not None and pool is not None:
            try:
                pool.submit(self._timed, run, inline, tools, lent)
            except RuntimeError:
                pass  # closed: the run has gone with it

    def _quick(self, tools: list[str]) -> bool:
        """Each of these tools has run, and took at most ``QUICK_TOOL_S`` the last time (the
        last time, not the slowest: one slow moment of a loaded host does not demote a tool
        for good; a tool that is slow stays on the pool)."""
        took = self._tool_took
        return bool(tools) and all(took.get(tool, QUICK_TOOL_S + 1) <= QUICK_TOOL_S for tool in tools)

    def _timed(self, run: Run, inline: Callable[[], None], tools: list[str], lent: bool) -> None:
        """Runs a batch of sync tools and remembers, for each, how long the batch took.
        ``lent``: on the pool for the run's waiting thread (counted in ``run.lent``)."""
        started = time.perf_counter()
        try:
            inline()
        finally:
            took = time.perf_counter() - started
            for tool in tools:  # (catalog ids: as many as there are tools)
                self._tool_took[tool] = took
            if lent:
                with self._lock:
                    run.lent -= 1

    # ---- a loop as reader --------------------------------------------------------------------
    def _hand_to_loop(self, run: Run, out: Out) -> None:
        """Under the lock, on the thread that reads the run's worker, once the run's calls have
        started: the loop they all run on reads the worker from now on, if it may (see
        `LoopReader`)."""
        waiter: Waiter | None = run.waiter
        lane = run.lane
        if waiter is None or lane is None or lane.dead or run.phase is not Phase.PARKED:
            return
        loop = run.dispatcher.loop()
        if loop is None:
            return
        if waiter.loop is None:
            # A caller reading its own worker, alone on it; only codemode's loops (a caller's
            # own loop may stop at any time, while this caller waits on another thread).
            if lane.reader is not waiter or waiter.thread != threading.get_ident():
                return
            if not isinstance(loop, HotLoop) or self._need_reader(lane, run):
                return
            keeper: Waiter | None = waiter
        else:
            if loop is not waiter.loop or lane.reader is not READER_THREAD:
                return
            if threading.current_thread() is not lane.thread:
                return  # (only the lane's thread may hand over its own reading, between looks)
            keeper = None
        reader = LoopReader(lane, loop, keeper)
        lane.reader = reader
        out.append(functools.partial(self._loop_start, reader))

    def _loop_start(self, reader: LoopReader) -> None:
        try:
            reader.loop.call_soon_threadsafe(self._loop_attach, reader)
        except RuntimeError:  # closed: the lane's thread reads instead
            with self._lock:
                lane = reader.lane
                if lane.reader is reader:
                    lane.reader = None
                    self._ensure_reader(lane)

    def _loop_attach(self, reader: LoopReader) -> None:
        """On the loop's thread."""
        with self._lock:
            lane = reader.lane
            if lane.reader is reader and not lane.dead and not reader.leave:
                reader.fd = os.dup(lane.worker.rfd)  # (open: no one closes it while it is ours)
        if reader.fd >= 0:
            reader.loop.add_reader(reader.fd, self._loop_look, reader)
            watch(reader.loop, 1)
        self._loop_after(reader)

    def _loop_look(self, reader: LoopReader) -> None:
        """On the loop's thread: the worker wrote (or a frame's kill time came)."""
        with self._lock:
            lane = reader.lane
            reader.pumping = lane.reader is reader and not lane.dead and not reader.leave
        if reader.pumping:
            self._pump(lane, 0.0)
        self._loop_after(reader)

    def _loop_after(self, reader: LoopReader) -> None:
        """On the loop's thread: goes on reading while anything needs it (with a timer for the
        kill time of a frame in flight), else stops: hands the lane over, or closes the pipes
        of a worker that died."""
        out: Out = []
        delay: float | None = None
        with self._lock:
            reader.pumping = False
            lane = reader.lane
            if lane.reader is reader and not lane.dead and not reader.leave and self._need_reader(lane):
                delay = self._poll_timeout(lane)
            elif lane.reader is reader:
                lane.reader = None
                if lane.dead:
                    out.append(lane.worker.kill)
                else:
                    self._ensure_reader(lane)
        if reader.timer is not None:
            reader.timer.cancel()
            reader.timer = None
        if delay is not None:
            reader.timer = reader.loop.call_later(delay, self._loop_look, reader)
        elif reader.fd >= 0:
            reader.loop.remove_reader(reader.fd)
            os.close(reader.fd)
            reader.fd = -1
            watch(reader.loop, -1)
        _run_all(out)

    # ---- sending -----------------------------------------------------------------------------
    def _enqueue(self, run: Run, kind: str, out: Out, prefer: Waiter | None = None) -> None:
        """Under the lock: queues the run's next frame on its lane (placing it on one first, for
        a start or a replay), and sends it if the worker is free."""
        lane = run.lane
        if lane is None or lane.dead:
            placed = self._place()
            if isinstance(placed, str):
                run.phase = Phase.ENDED
                message = f"code mode runtime is unavailable: {placed}"
                self._end(run, "failed", out, failure=_failed("runtime_unavailable", "WorkerUnavailable", message))
                return
            lane = run.lane = placed
            run.placements += 1
            lane.residents.add(run)
        if run.waiter is not None:
            lane.attached.add(run)
        run.next_frame = kind
        run.phase = Phase.QUEUED
        run.queued_at = time.monotonic()
        lane.queue.append(run)
        self._kick(lane, out)
        self._ensure_reader(lane, prefer if prefer is not None else run.waiter)

    def _kick(self, lane: Lane, out: Out) -> None:
        """Under the lock: if the worker is free, the next queued frame goes to it. (A worker
        that died while idle is found by its reader when the frame gets no answer: its run,
        the culprit, goes on elsewhere, see `_blame`.)"""
        while lane.queue and not lane.dead:
            run = self._take_next(lane)
            if run.aborted or run.phase is not Phase.QUEUED:
                continue
            if not self._may_write(lane, run):
                lane.queue.appendleft(run)  # (its turn is next)
                return
            frames = self._frame_for(lane, run, out)
            if frames is not None:
                self._served_now(run.scope[0])
                lane.outbox.append((frames, lane.pipeline[-1].kill_at))
                if not lane.writing:
                    lane.writing = True
                    out.append(functools.partial(self._flush, lane))

    def _served_now(self, session_id: str) -> None:
        """Under the lock: ``session_id`` just had a frame sent (the most recent of all)."""
        served = self._served
        served.pop(session_id, None)
        served[session_id] = next(self._serve_ticks)
        if len(served) > SERVED_SESSIONS:
            del served[next(iter(served))]  # the longest-unserved: forgetting it keeps it first

    def _flush(self, lane: Lane) -> None:
        """Writes the lane's outbox in order (outside the lock; one writer at a time)."""
        while True:
            with self._lock:
                if not lane.outbox:
                    lane.writing = False
                    return
                frames, deadline = lane.outbox.popleft()
            lane.worker.send(frames, deadline)

    def _frame_for(self, lane: Lane, run: Run, out: Out) -> list[Any] | None:
        """Under the lock: the frame(s) for a run's turn on its worker, which is now busy with
        it; None if it has nothing to send after all."""
        now = time.monotonic()
        kind, step, journal = run.next_frame, run.step, run.journal
        waited = now - run.queued_at  # in the queue: not the guest's time
        frames: list[Any] = []
        if kind != "settle" and lane.configured is not run.configure:
            frames.append(run.configure)
            lane.configured = run.configure
        if kind == "start":
            run.engine_run = next(self._run_ids)
            step.deadline += waited
            frames.append(journal.start_frame(run.engine_run, float(run.timeout_ms)))
            kill_at = step.deadline + KILL_GRACE_S
            lane.started += 1
            if lane.started >= RUNS_PER_WORKER and not lane.retiring:
                lane.retiring = True
                self._spawn_locked()
        elif kind == "settle":
            results = self._journaled(run, run.dispatcher.take_ready(max_bytes=SETTLE_BUDGET_BYTES))
            if not results:
                run.phase = Phase.PARKED
                return None
            if run.waiter is not None:
                step.deadline += waited
                if now >= step.deadline + KILL_GRACE_S:
                    # A guest whose tools answer at once has been running all along: it is
                    # past its time as if in one long drive (the kill would have ended that).
                    _send_drop(lane, run, out)
                    self._forget(run)
                    failure = _failed("timeout", "TimeoutError", _timed_out("cell"))
                    self._end(run, "failed", out, failure=failure)
                    return None
            else:
                step.deadline = now + run.timeout_ms / 1000.0  # an advance: the run's own budget
            for call_id, _, _ in results:
                journal.open_inputs.pop(call_id, None)
            journal.batches.append(results)
            if not step.extended and step.deadline - now < SETTLE_FLOOR_S:
                step.deadline, step.extended = now + SETTLE_FLOOR_S, True
            frames.append(Settle(run.engine_run, results, max(1.0, (step.deadline - now) * 1000.0)))
            kill_at = step.deadline + KILL_GRACE_S
        else:
            run.engine_run = next(self._run_ids)
            start = journal.start_frame(run.engine_run, float(run.timeout_ms))
            frames.append(Replay(start, journal.batches, journal.clock_reads))
            step.deadline += waited
            # The replay has the budget the engine gives it (a timeout per step).
            kill_at = now + (len(journal.batches) + 1) * run.timeout_ms / 1000.0 + KILL_GRACE_S
        lane.pipeline.append(Inflight(run, kind, now, kill_at))
        run.phase = Phase.RUNNING
        return frames

    def _journaled(self, run: Run, results: list[CallResult]) -> list[CallResult]:
        """The results of one settle frame (taken within ``SETTLE_BUDGET_BYTES``: the rest stay
        ready for the next, so no frame outgrows its cap), as the journal records them: within
        ``maxJournalBytes``, past which a call fails instead."""
        journaled: list[CallResult] = []
        for call_id, ok, payload in results:
            length = utf8_len(payload)
            if run.journal_bytes + length > self._max_journal:
                ok, payload = False, _journal_full(length, self._max_journal)
                length = len(payload)
            run.journal_bytes += length
            journaled.append(CallResult(call_id, ok, payload))
        return journaled

    def _may_write(self, lane: Lane, run: Run) -> bool:
        """Under the lock: the run's frame may be written now: the worker is free, or the frame
        is a settle small enough to wait in the pipe behind what it executes (it never fills the
        pipe, so no write blocks on a worker that is busy) of a run whose frames are quick. A
        frame in the pipe is committed to go next, so only those: a new cell (of unknown cost)
        or a slow run would make every run queued behind it wait longer than one frame."""
        if not lane.pipeline:
            return True
        if len(lane.pipeline) >= PIPELINE_DEPTH or lane.pipeline[0].kind == "ready":
            return False
        quick = run.next_frame == "settle" and run.drive_s <= PIPELINE_QUICK_S
        return quick and run.dispatcher.ready_bytes() <= PIPELINE_FRAME_BYTES

    def _take_next(self, lane: Lane) -> Run:
        """Under the lock: the queued run whose turn it is, fair across sessions: of the first
        ``FAIR_SCAN`` in the queue, the one whose session was served longest ago (a session
        never served first), FIFO among equals. A session that resubmits as soon as it is
        served cannot keep another session's cell waiting for more than one frame."""
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

    def _next_in_pipeline(self, lane: Lane) -> None:
        """Under the lock: the worker answered its first frame; the next, if any, is the one it
        executes now: its time in the pipe is not its run's (its deadline and kill time move)."""
        lane.pipeline.popleft()
        if lane.pipeline:
            head = lane.pipeline[0]
            waited = time.monotonic() - head.sent
            if head.run is not None and head.run.waiter is not None:
                head.run.step.deadline += waited
            lane.pipeline[0] = head._replace(sent=head.sent + waited, kill_at=head.kill_at + waited)

    # ---- ending ------------------------------------------------------------------------------
    def _end(
        self,
        run: Run,
        status: str,
        out: Out,
        *,
        failure: tuple[str | None, str, str, str] | None = None,
        reason: str = "",
    ) -> None:
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
        self._waited.discard(run)
        if run.lane is not None:
            run.lane.attached.discard(run)
        if status == "suspended":
            run.step = Step()
        waiter.step = step
        out.append(waiter.wake)

    def _forget(self, run: Run) -> None:
        """Under the lock: the run's runtime is gone from its worker."""
        lane = run.lane
        if lane is not None:
            lane.residents.discard(run)
            lane.attached.discard(run)
            lane.memory -= run.memory_bytes
        run.memory_bytes = 0
        run.lane = None
        run.phase = Phase.ENDED

    def _set_memory(self, run: Run, memory_bytes: int) -> None:
        if run.lane is not None:
            run.lane.memory += memory_bytes - run.memory_bytes
        run.memory_bytes = memory_bytes

    def _lane_died(self, lane: Lane, error: Exception, out: Out, *, timed_out: bool = False) -> None:
        """Under the lock: a worker is gone (or is killed here). Its culprit fails; every other
        run on it is replayed elsewhere (at once if someone waits for it, else by its `wait`)."""
        if lane.dead:
            return
        lane.dead = True
        lane.worker.signal_kill()
        self.killed += 1
        self._close_when_free(lane, out, lane.worker.kill)
        self._lanes.remove(lane)
        if not self._closed:
            self._spawn_locked()
        inflight = lane.inflight
        culprit = inflight.run if inflight is not None else None
        # Frames in the pipe behind the culprit's never started: their runs go on elsewhere,
        # and the results a settle among them carried are still to be delivered.
        behind = {entry.run: entry.kind for entry in list(lane.pipeline)[1:] if entry.run is not None}
        lane.pipeline.clear()
        for run, kind in behind.items():
            if kind == "settle":
                _unsettle(run)
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
                self._enqueue(run, "start", out)  # it never ran: it starts elsewhere
            elif run.waiter is not None:
                self._enqueue(run, "replay", out)
            else:
                run.phase = Phase.PARKED  # suspended: its next `wait` replays it

    def _blame(self, run: Run, inflight: Inflight, error: Exception, timed_out: bool, out: Out) -> None:
        """Under the lock: the run whose frame the dead worker was executing."""
        step = run.step
        if timed_out:
            what = "replay" if inflight.kind == "replay" else "cell"
            self._end(run, "failed", out, failure=_failed("timeout", "TimeoutError", _timed_out(what)))
            return
        if isinstance(error, WorkerCrashed) and run.placements < MAX_PLACEMENTS:
            # Dead under the frame, maybe before it read it (killed from outside, while idle: a
            # kill is not visible at once): the run goes on elsewhere from its journal, the
            # results of that frame delivered again. A run that kills every worker it is given
            # fails once it has had `MAX_PLACEMENTS`.
            if inflight.kind == "settle":
                _unsettle(run)
            if run.waiter is None:
                run.phase = Phase.PARKED  # an advance: the next `wait` replays
            else:
                self._enqueue(run, "start" if inflight.kind == "start" and not step.reports else "replay", out)
            return
        if isinstance(error, WorkerCrashed):
            # The spec's `runtime_unavailable`: a QuickJS worker that exits with a non-zero status.
            what = "replay failed" if inflight.kind == "replay" else "worker crashed"
            failure = _failed("runtime_unavailable", "WorkerCrashed", f"code mode {what}: {error}")
        else:
            failure = _failed("internal_error", type(error).__name__, str(error))
        self._end(run, "failed", out, failure=failure)

    def _retire_if_done(self, lane: Lane, out: Out) -> None:
        """Under the lock: a retiring worker that holds nothing more is shut down."""
        if lane.retiring and not lane.residents and not lane.pipeline and not lane.queue and not lane.dead:
            lane.dead = True
            self._lanes.remove(lane)
            self._close_when_free(lane, out, lane.worker.shutdown)

    def _close_when_free(self, lane: Lane, out: Out, close: Callable[[], object]) -> None:
        """Under the lock, for a dead lane: its pipes are closed (``close``) now if no one polls
        them, else by the one who does, once it looks (`_release_reader`): an fd is never
        closed, and its number reused, under a poll."""
        lane.cond.notify_all()
        reader = lane.reader
        if reader is READER_THREAD or (isinstance(reader, LoopReader) and reader.pumping):
            return
        if isinstance(reader, Waiter) and reader.polling is lane:
            return
        lane.reader = None
        out.append(close)

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        out: Out = []
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lanes, self._lanes = self._lanes, []
            closed = _failed("runtime_unavailable", "ClosedError", "this CodeMode is closed")
            for lane in lanes:
                lane.dead = True
                for run in list(lane.residents):
                    self._forget(run)
                    self._end(run, "failed", out, failure=closed)
                lane.worker.signal_kill()  # (its poller, if any, wakes at the pipe's end)
                reader = lane.reader
                self._close_when_free(lane, out, lane.worker.kill)
                if isinstance(reader, LoopReader):
                    out.append(functools.partial(self._loop_stop, reader))
            for run in list(self._waited):  # (those with no lane: waiting for a replay)
                self._end(run, "failed", out, failure=closed)
            pools, self._pools = list(self._pools.values()), {}
        _run_all(out)
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)

    def _loop_stop(self, reader: LoopReader) -> None:
        """At close: the loop reader stops on its loop (which runs it before it stops); on a
        loop closed already (its selector with it), its dup is closed here."""
        try:
            reader.loop.call_soon_threadsafe(self._loop_after, reader)
        except RuntimeError:
            if reader.fd >= 0:
                os.close(reader.fd)
                reader.fd = -1

    @property
    def size(self) -> int:
        return self._size

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [lane.pid for lane in self._lanes if not lane.dead]

    def progress(self, run: Run) -> str:
        """Where a run's step is: ``running`` (a frame of it in a worker, or queued for one),
        ``parked`` (on tools, a `wait`, or held calls), or how it ended."""
        with self._lock:
            if run.step.ended:
                return run.step.status
            if run.phase in (Phase.RUNNING, Phase.QUEUED):
                return "running"
            return "parked"


def _awaits_only_approvals(run: Run) -> bool:
    """Under the lock, for a parked run: every call it has open waits for the host's approval."""
    approvals = run.dispatcher.approvals
    if not approvals:
        return False
    waiting = approvals.undecided()
    if not waiting:
        return False
    settled = run.journal.settled_ids()
    return all(c.id in waiting for c in run.journal.calls if c.id not in settled and c.id not in run.yields)


def _divergence(expected: list[protocol.Call], got: list[protocol.Call], status: str) -> str:
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return f"call {i + 1} was {have[1]} (input {have[2][:8]}), the journal has {want[1]} (input {want[2][:8]})"
    if len(got) != len(expected):
        return f"the replay made {len(got)} tool call(s), the journal has {len(expected)}"
    return f"the replay ended {status} before reaching the suspension point"
