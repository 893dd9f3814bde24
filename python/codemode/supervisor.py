"""The worker pool and the driver of one run: deadlines, kills, crash recovery.

    Session.exec ──> Supervisor.start(run)          (Session.wait ──> Supervisor.resume(run))
                        │  acquire an idle worker (spawned ahead of time)
                        │  Configure (only if its limits/catalog are stale), Start ──> worker
                        │      worker: engine.start ──> Report(pending, calls)
                        │  dispatcher runs the calls in the host (sync inline, async on a loop)
                        │      (parked on one loop's calls: that loop's thread reads the
                        │      worker's next report and starts its calls itself, see `_Relay`)
                        │  Settle(results) ──> worker: engine.settle ──> Report(...)
                        │  ... until completed | failed, or the deadline:
                        │      guest still running at deadline + grace -> SIGKILL, replace, `timeout`
                        │      tools still pending at the deadline     -> suspended (`waiting`):
                        │          the runtime stays resident in the worker; the host keeps the
                        │          journal; `wait` settles into it, or replays the journal into
                        │          a fresh engine on any worker if the resident one is gone
                        │      worker gone (EOF, bad frame)            -> replace, `internal_error`
                        └─ release the worker to the idle pool (with its resident runs)

Workers are separate processes (``subprocess`` — never ``fork`` — ``python -I``, an empty
environment, their own session and process group, RLIMIT_AS and RLIMIT_CPU). Every frame
from a worker is untrusted: size-capped, decoded against the protocol union, and a worker that
sends anything else is discarded. QuickJS's interrupt handler stops most runaway guests inside
the worker; the SIGKILL at deadline + grace is the backstop for builtins that never poll it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from . import protocol
from ._engine import YIELD_TOOL
from .errors import ClosedError, ProtocolError, WorkerCrashed, WorkerUnavailable
from .hotloop import watch
from .protocol import Configure, Drop, Fault, Ready, Replay, Report, Settle, Start, decode_guest_json
from .runs import JournalCall, Run, input_hash
from .tools import settles_directly

__all__ = ["KILL_GRACE_S", "Step", "Supervisor"]

#: How long past the deadline a worker may take to report before it is killed.
KILL_GRACE_S = 0.25
#: The least time a run gets to use tool results it is handed, even when they arrive just at the
#: deadline (the smallest allowed ``timeoutMs``): otherwise a result landing late in a ``wait``
#: would turn into a timeout instead of progress.
SETTLE_FLOOR_S = 0.1
#: How long a new worker may take to say it is ready.
SPAWN_TIMEOUT_S = 10.0
#: RLIMIT_AS for a worker: QuickJS heaps are capped by their own allocator; this bounds the rest.
WORKER_ADDRESS_SPACE = 4 << 30
#: RLIMIT_CPU (seconds) for a worker; it is recycled well before it could reach this.
WORKER_CPU_SECONDS = 3600
#: Runs a worker serves before it is replaced.
RUNS_PER_WORKER = 50_000

#: The worker's entry. msgspec imports typing_extensions only if it can (it falls back to
#: `typing`), and that import (with `inspect`) is ~a third of a worker's start-up: block it.
_WORKER_MAIN = "import sys; sys.modules['typing_extensions'] = None; from codemode._worker import main; main()"


class Deadline(Exception):
    """Internal: the worker did not answer before the given time."""


class WorkerProcess:
    """One worker subprocess and the framing on its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_MAIN, str(WORKER_ADDRESS_SPACE), str(WORKER_CPU_SECONDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            start_new_session=True,
            close_fds=True,
            bufsize=0,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        self.reader = protocol.FrameReader(self.rfd)
        self._poller = select.poll()
        self._poller.register(self.rfd, select.POLLIN)
        self.ready = False
        self.configured: object = None
        self.runs = 0
        #: A `Drop` for a suspended run may be written while another thread drives this worker.
        self.write_lock = threading.Lock()
        #: Called once the worker is released (`Supervisor._claim` with ``later``).
        self.on_release: list[Callable[[], object]] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _write(self, frame: msgspec.Struct) -> OSError | None:
        """Writes one frame; the error if the pipe is gone. Under the write lock, which
        `close_pipes` takes too: the fd cannot be closed (and its number reused) meanwhile."""
        data = protocol.encode(frame)
        with self.write_lock:
            if self.proc.stdin is None or self.proc.stdin.closed:
                return BrokenPipeError("pipe closed")
            try:
                protocol.write_all(self.wfd, data)
            except OSError as e:
                return e
        return None

    def send(self, frame: msgspec.Struct) -> None:
        error = self._write(frame)
        if error is not None:
            raise self.crashed(f"worker {self.pid} stopped reading: {error}")

    def send_quietly(self, frame: msgspec.Struct) -> None:
        """``send`` from a thread that is not driving this worker: a write that fails is left
        for the driver to notice (end of file on the pipe it reads), nothing is closed here."""
        self._write(frame)

    def take_frame(self) -> protocol.WorkerFrame | None:
        """The next frame if the reader holds all of it."""
        body = self.reader.poll()
        if body is None:
            return None
        try:
            return protocol.worker_decoder.decode(body)
        except msgspec.DecodeError as e:
            raise ProtocolError(f"worker {self.pid} sent a malformed frame: {e}") from None

    def recv(self, deadline: float, wake_fd: int | None = None) -> protocol.WorkerFrame | None:
        """The next frame; None if ``wake_fd`` became readable first. Raises ``Deadline``."""
        reader = self.reader
        while True:
            frame = self.take_frame()
            if frame is not None:
                return frame
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise Deadline
            if wake_fd is None:
                events = self._poller.poll(timeout * 1000.0)
            else:
                poller = select.poll()
                poller.register(self.rfd, select.POLLIN)
                poller.register(wake_fd, select.POLLIN)
                events = poller.poll(timeout * 1000.0)
            if any(fd == self.rfd for fd, _ in events):
                if not reader.fill():
                    raise self.crashed(f"worker {self.pid} exited")
            elif events:
                return None

    def crashed(self, message: str, *, timed_out: bool = False) -> WorkerCrashed:
        code = self.proc.poll()
        if code is None and not timed_out:
            self.kill()
            code = self.proc.returncode
        sig = -code if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        if sig is not None:
            message = f"{message} (signal {signal.Signals(sig).name})"
        elif exit_code is not None:
            message = f"{message} (exit code {exit_code})"
        return WorkerCrashed(message, exit_code=exit_code, signal=sig, timed_out=timed_out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        with self.write_lock:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()

    def shutdown(self, wait_s: float = 0.5) -> None:
        """Asks the worker to exit (EOF on stdin), then kills it if it lingers."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class Step(msgspec.Struct):
    """What one ``exec`` or ``wait`` call saw of a run."""

    status: str = "failed"  # completed | failed | suspended
    value: Any = None  # decoded
    failure: tuple[str | None, str, str, str] | None = None
    reason: str = ""  # when suspended: pending_tools | yield
    store_writes: Any = None  # decoded: {key: value | None}, or None
    outputs: list[tuple[int, Any]] = msgspec.field(default_factory=list)  # kind 1 (json) decoded
    tool_calls: int = 0
    searches: int = 0
    describes: int = 0
    memory_bytes: int = 0
    reports: int = 0
    #: The deadline has had its one settle-floor extension (see `Supervisor._hand_results`).
    extended: bool = False
    deadline: float = 0.0


class _Relay:
    """Lets the event loop that runs a parked run's tool calls take the worker's next reports.

    Why: a tool call from a cell costs five thread/process wake-ups (worker -> driver thread ->
    loop thread -> MCP server -> loop thread -> worker) where the same call through the MCP SDK
    costs four, and each is 30-100 µs on a busy machine. While the driver is parked and every
    call in flight runs on one loop, that loop's thread watches the worker (``add_reader``); a
    report that only starts more calls on the same loop is journaled and started right there
    (`Supervisor._take_report`), without the driver. Any other frame, an error or the end of
    the pipe is handed back untouched, and the driver (asleep on the dispatcher's wake fd,
    never on the worker) goes on as if it had read it itself.

    ``first``: a report the driver read but leaves to the relay, whose calls it guessed run on
    this loop (`Dispatcher.loop_of`): the loop's thread takes it when it starts watching, and
    starts the calls on its own loop, instead of the driver handing each to it (a wake-up and a
    GIL hand-off less before a cell's first ``MCP.*`` call). Not taken, it is handed back.

    ``_lock`` guards who reads the worker: the relay only while ``_active``; the driver clears
    it (hand-back, waiting results, or the deadline) before it touches the worker again. A
    partial frame stays in the worker's reader. The loop watches a dup of the worker's read fd
    that only the loop thread closes, once it stops watching: however late the loop gets to it,
    no fd number is reused under its selector.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        worker: WorkerProcess,
        run: Run,
        step: Step,
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        first: protocol.WorkerFrame | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._worker = worker
        self._run = run
        self._step = step
        self._loop = loop
        self._deadline = deadline
        self._lock = threading.Lock()
        self._active = True
        self._fd = -1
        #: The hand-back: a frame the relay did not take, the error it met, or the pipe's end.
        self._handed_back = False
        self._frame: protocol.WorkerFrame | None = None
        self._error: Exception | None = None
        self._eof = False
        self._first = first

    def wait(self) -> protocol.WorkerFrame | None:
        """On the driver, in place of ``worker.recv(deadline, wake_fd)``: sleeps until the relay
        hands the worker back, results wait for the driver, or the deadline (``Deadline``)."""
        dispatcher = self._run.dispatcher
        wake_fd = dispatcher.wake_fd  # before the loop can hand back (`_attach` wakes it)
        self._fd = os.dup(self._worker.rfd)
        try:
            self._loop.call_soon_threadsafe(self._attach)
        except RuntimeError:  # the loop is closed
            os.close(self._fd)
            if self._first is not None:
                return self._first
            return self._worker.recv(self._deadline, wake_fd)
        poller = select.poll()
        poller.register(wake_fd, select.POLLIN)
        while True:
            # The relay may have pushed the deadline (a settle-floor extension).
            timeout = max(self._deadline, self._step.deadline) - time.monotonic()
            if timeout <= 0 or poller.poll(timeout * 1000.0):
                break
        if not self._lock.acquire(timeout=KILL_GRACE_S):
            # The loop's thread is stuck in the relay: writing to a worker that stopped reading
            # its pipe. Killing it ends that write, and the driver finds the pipe's end.
            try:
                os.killpg(self._worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._lock.acquire()
        try:
            self._active = False
        finally:
            self._lock.release()
        dispatcher.clear_wakes()
        if not self._handed_back:
            try:
                self._loop.call_soon_threadsafe(self._detach)
            except RuntimeError:
                pass  # closed: its selector watches nothing any more (the dup is leaked)
            if self._first is not None:
                return self._first  # the loop never got to it: the driver takes it, as read
            if timeout <= 0:
                raise Deadline
            return None
        if self._error is not None:
            raise self._error
        if self._eof:
            raise self._worker.crashed(f"worker {self._worker.pid} exited")
        return self._frame

    def _attach(self) -> None:
        with self._lock:
            if not self._active:
                return
            self._loop.add_reader(self._fd, self._readable)
            watch(self._loop, 1)  # the loop polls before it sleeps (see `hotloop`)
            first, self._first = self._first, None
            handed_back = first is not None and self._take_locked(first)
        if handed_back:
            self._run.dispatcher.wake()

    def _detach(self) -> None:
        """On the loop thread, once: stops watching and closes the dup."""
        if self._loop.remove_reader(self._fd):
            watch(self._loop, -1)
        os.close(self._fd)

    def _readable(self) -> None:
        with self._lock:
            if not self._active:
                return  # the driver took it back; `_detach` is on its way
            handed_back = self._take_locked(None)
        if handed_back:
            self._run.dispatcher.wake()

    def _take_locked(self, first: protocol.WorkerFrame | None) -> bool:
        """Under ``_lock``, while active: takes ``first``, or what the worker wrote, and every
        report after it that only starts calls here. True if it handed back instead (the
        frame it did not take, the error it met, or the pipe's end), and stopped watching."""
        worker, run, dispatcher = self._worker, self._run, self._run.dispatcher
        try:
            if first is None and not worker.reader.fill():
                self._eof = True
            else:
                frame = first if first is not None else worker.take_frame()
                # A frame while armed: the worker spoke unasked (the driver says so).
                while frame is not None and not dispatcher.armed:
                    if self._supervisor._take_report(worker, run, frame, self._step, self._loop) is None:
                        break
                    self._deadline = max(self._deadline, self._step.deadline)
                    self._supervisor._settle_or_arm(worker, run, self._deadline, self._step, driving=False)
                    frame = worker.take_frame()
                if frame is None:
                    return False  # taken, or the rest of it is still to come
                self._frame = frame
        except Exception as e:
            self._error = e
        self._active = False
        self._handed_back = True
        self._detach()
        return True


def _relayable(run: Run, frame: protocol.WorkerFrame | None) -> bool:
    """A report a relay may take: it parks the run on calls alone (no yield), and the run is not
    restart-safe (whose results only a `wait` settles)."""
    return (
        isinstance(frame, Report)
        and frame.status == "pending"
        and not run.journal.restart_safe
        and all(tool != YIELD_TOOL for _, tool, _ in frame.calls)
    )


def _carry(ahead: Step | None) -> Step:
    """A new step for an ``exec``/``wait`` call that goes on from an advance: what the advance
    produced (outputs, counts, memory) and nothing of how it ended."""
    if ahead is None:
        return Step()
    return Step(
        outputs=ahead.outputs,
        tool_calls=ahead.tool_calls,
        searches=ahead.searches,
        describes=ahead.describes,
        memory_bytes=ahead.memory_bytes,
    )


def _failed(code: str, name: str, message: str) -> tuple[str | None, str, str, str]:
    return (code, name, message, "")


class Supervisor:
    """A pool of pre-spawned workers and the run driver."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._idle: collections.deque[WorkerProcess] = collections.deque()
        self._busy: set[WorkerProcess] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._run_ids = iter(range(1, sys.maxsize))
        self.spawned = 0
        self.killed = 0
        with self._cond:
            for _ in range(self._size):
                try:
                    self._spawn_locked()
                except WorkerUnavailable:
                    break  # each run then fails with `runtime_unavailable` and the reason

    # ---- pool ----------------------------------------------------------------------------------
    def _spawn_locked(self) -> None:
        try:
            worker = WorkerProcess()
        except OSError as e:
            raise WorkerUnavailable(f"could not start a worker process: {e}") from None
        self.spawned += 1
        self._idle.append(worker)

    def _acquire(self) -> WorkerProcess:
        with self._cond:
            while True:
                if self._closed:
                    raise ClosedError("this CodeMode is closed")
                if self._idle:
                    worker = self._idle.popleft()
                    if worker.proc.poll() is not None:
                        # Died while idle (killed from outside, RLIMIT_CPU): replace it quietly.
                        worker.close_pipes()
                        self._spawn_locked()
                        self._cond.notify_all()
                        continue
                    self._busy.add(worker)
                    return worker
                if len(self._busy) < self._size:
                    self._spawn_locked()
                    continue
                self._cond.wait()

    def _claim(self, worker: WorkerProcess, *, later: Callable[[], object] | None = None) -> bool:
        """Takes this particular worker (it holds a resident run) once it is idle; False if it
        is gone from the pool. With ``later``, a busy worker is not waited for: False, and
        ``later`` is called when it is released."""
        with self._cond:
            while True:
                if self._closed:
                    raise ClosedError("this CodeMode is closed")
                if worker in self._idle:
                    if worker.proc.poll() is not None:
                        return False
                    self._idle.remove(worker)
                    self._busy.add(worker)
                    return True
                if worker not in self._busy:
                    return False
                if later is not None:
                    worker.on_release.append(later)
                    return False
                self._cond.wait()

    def _release(self, worker: WorkerProcess, *, discard: bool = False) -> None:
        with self._cond:
            self._busy.discard(worker)
            callbacks, worker.on_release = worker.on_release, []
            worker.runs += 1
            if discard or self._closed or worker.runs >= RUNS_PER_WORKER:
                retire = True
            else:
                retire = False
                self._idle.appendleft(worker)
            if retire and not self._closed:
                try:
                    self._spawn_locked()
                except WorkerUnavailable:
                    pass  # the next `_acquire` tries again and reports it to its run
            self._cond.notify_all()
        if retire:
            if discard:
                self.killed += 1
                worker.kill()
            else:
                worker.shutdown()
        for callback in callbacks:
            callback()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            workers = list(self._idle) + list(self._busy)
            self._idle.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.shutdown(0.2)

    @property
    def size(self) -> int:
        return self._size

    def worker_pids(self) -> list[int]:
        with self._cond:
            return [w.pid for w in list(self._idle) + list(self._busy)]

    # ---- runs ----------------------------------------------------------------------------------
    def start(self, run: Run, configure: Configure, timeout_ms: int) -> Step:
        """Runs a new cell until it completes, fails, or suspends at the deadline."""
        journal = run.journal
        run.engine_run = next(self._run_ids)
        start = Start(
            run.engine_run, journal.source, journal.language, float(timeout_ms), journal.seed, journal.run_json
        )
        step = Step()
        for attempt in range(2):
            worker = self._hand_over(configure, start, step)
            if worker is None:
                return step
            # The budget starts when a worker has the cell: time queued for a free worker is not
            # the guest's (the engine's own interrupt clock starts when it reads the frame, too).
            deadline = time.monotonic() + timeout_ms / 1000.0
            try:
                return self._drive(worker, run, deadline, step)
            except WorkerCrashed:
                # Dead before it said anything: most likely killed while idle, before it read
                # the cell (a kill is not visible to `poll()` at once). One more worker tries.
                if step.reports or attempt:
                    return step
        return step

    def resume(
        self, run: Run, configure: Configure, timeout_ms: int, ahead: Step | None = None, spent_s: float = 0.0
    ) -> Step:
        """Settles what finished into a suspended run and drives it on (``wait``). ``ahead``: the
        step `advance` took, whose held calls start now and whose outputs lead this one's.
        ``spent_s``: what the ``wait`` has used of its budget already (waiting for an advance)."""
        deadline = time.monotonic() + max(0.0, timeout_ms / 1000.0 - spent_s)
        step = _carry(ahead)
        self.start_held(run, step)
        results = self._collect(run, deadline)
        if not results:
            step.status, step.reason = "suspended", "pending_tools"
            return step
        worker = run.worker
        queued = time.monotonic()
        if worker is not None and self._claim(worker):
            # Time spent waiting for the resident worker to finish another run is not the guest's.
            deadline += time.monotonic() - queued
            try:
                try:
                    deadline = self._hand_results(worker, run, results, deadline, step)
                except WorkerCrashed:
                    self._release(worker, discard=True)
                    raise
                return self._drive(worker, run, deadline, step)
            except WorkerCrashed:
                if step.reports:
                    return step
                # It died before it took these results: they are still to be delivered.
                run.journal.batches.pop()
                step.extended = False
        # The resident runtime is gone: rebuild it from the journal, then settle.
        run.worker = None
        return self._replay(run, configure, results, deadline, timeout_ms, step)

    def advance(self, run: Run, timeout_ms: int, later: Callable[[], object]) -> Step | None:
        """Settles results that landed while the run was suspended into its resident runtime,
        and runs the guest on to its next report, before anyone asks: the next ``wait`` then
        finds the work done. Nothing the host would see starts here: new calls are held for
        that ``wait`` (a run never gets further than its pending calls allow). None if there
        was nothing to do, its worker is gone (``wait`` replays) or busy: an advance never
        queues (it would delay a cancel); ``later`` is called when the worker is free."""
        worker = run.worker
        if worker is None:
            return None
        results = run.dispatcher.take_ready()
        if not results:
            return None
        if not self._claim(worker, later=later):
            run.dispatcher.requeue(results)
            return None
        step = _carry(run.ahead)
        try:
            try:
                deadline = self._hand_results(worker, run, results, time.monotonic() + timeout_ms / 1000.0, step)
            except WorkerCrashed:
                self._release(worker, discard=True)
                raise
            return self._drive(worker, run, deadline, step, ahead=True)
        except WorkerCrashed:
            # Gone before it took them: the next `wait` replays, then delivers them.
            run.journal.batches.pop()
            run.dispatcher.requeue(results)
            run.worker = None
            return None

    def start_held(self, run: Run, step: Step) -> None:
        """Starts the calls an advance held: the model has now asked the run to go on."""
        if run.held:
            calls, run.held = run.held, []
            step.tool_calls += len(calls)
            run.dispatcher.submit(calls)

    def drop(self, run: Run) -> None:
        """Frees a suspended run's resident runtime (cancel, expiry, snapshot limit)."""
        worker, run.worker = run.worker, None
        if worker is not None and worker.proc.poll() is None:
            try:
                worker.send(Drop(run.engine_run))
            except WorkerCrashed:
                pass

    def _collect(self, run: Run, deadline: float) -> list[tuple[int, bool, str]]:
        """Results to deliver on resume: answered yields plus finished tools, waiting for at
        least one until the deadline."""
        results: list[tuple[int, bool, str]] = [(call_id, True, "null") for call_id in run.yields]
        run.yields.clear()
        results.extend(run.dispatcher.take_ready() if results else run.dispatcher.wait_ready(deadline))
        return results

    def _replay(
        self,
        run: Run,
        configure: Configure,
        results: list[tuple[int, bool, str]],
        deadline: float,
        timeout_ms: int,
        step: Step,
    ) -> Step:
        journal = run.journal
        run.engine_run = next(self._run_ids)
        start = Start(
            run.engine_run, journal.source, journal.language, float(timeout_ms), journal.seed, journal.run_json
        )
        frame = Replay(start, journal.batches, journal.clock_reads)
        queued = time.monotonic()
        worker = self._hand_over(configure, frame, step)
        if worker is None:
            return step
        try:
            # Rebuilding is not the guest's time: the replay has the budget the engine gives it
            # (a timeout per step), and the guest's wait budget starts once the runtime is back.
            steps = len(journal.batches) + 1
            report = worker.recv(time.monotonic() + steps * timeout_ms / 1000.0 + KILL_GRACE_S)
            deadline += time.monotonic() - queued
            expected = [(c.id, c.tool, c.input_hash) for c in journal.calls]
            got = (
                [(call_id, tool, input_hash(data)) for call_id, tool, data in report.calls]
                if isinstance(report, Report)
                else []
            )
            if not isinstance(report, Report) or report.run != run.engine_run:
                raise ProtocolError(f"worker {worker.pid} answered a replay out of order")
            if report.status != "pending" or got != expected:
                worker.send(Drop(run.engine_run))
                self._release(worker)
                step.failure = _failed(
                    "internal_error",
                    "DivergenceError",
                    f"code mode run diverged on replay: {_divergence(expected, got, report.status)}",
                )
                return step
            deadline = self._hand_results(worker, run, results, deadline, step)
            return self._drive(worker, run, deadline, step)
        except Deadline:
            self._release(worker, discard=True)
            step.failure = _failed("timeout", "TimeoutError", "code mode replay timed out.")
        except (WorkerCrashed, ProtocolError) as e:
            self._release(worker, discard=True)
            # The spec: a worker that exits (here: dies) is `runtime_unavailable`; a bad frame is ours.
            code = "runtime_unavailable" if isinstance(e, WorkerCrashed) else "internal_error"
            step.failure = _failed(code, type(e).__name__, f"code mode replay failed: {e}")
        return step

    def _hand_over(self, configure: Configure, frame: Start | Replay, step: Step) -> WorkerProcess | None:
        """Gives a cell (or a replay) to a live worker, which stays claimed for the caller.
        A worker found dead before it took the frame is replaced and the next one is tried."""
        for attempt in range(2):
            try:
                worker = self._acquire()
            except WorkerUnavailable as e:
                step.failure = _failed(
                    "runtime_unavailable", "WorkerUnavailable", f"code mode runtime is unavailable: {e}"
                )
                return None
            try:
                if not worker.ready:
                    ready = worker.recv(time.monotonic() + SPAWN_TIMEOUT_S)
                    if not isinstance(ready, Ready):
                        raise ProtocolError(f"worker {worker.pid} did not introduce itself")
                    worker.ready = True
                if worker.configured is not configure:
                    worker.send(configure)
                    worker.configured = configure
                worker.send(frame)
                return worker
            except (WorkerCrashed, ProtocolError, Deadline) as e:
                self._release(worker, discard=True)
                if attempt == 1 or isinstance(e, Deadline):
                    reason = str(e) or "the worker did not start in time"
                    step.failure = _failed(
                        "runtime_unavailable", "WorkerUnavailable", f"code mode runtime is unavailable: {reason}"
                    )
                    return None
        return None

    def _drive(self, worker: WorkerProcess, run: Run, deadline: float, step: Step, *, ahead: bool = False) -> Step:
        """Reads reports, runs tools, settles, until the run ends or suspends; then releases
        the worker (killed and replaced if it misbehaved or overran). ``ahead``: see `advance`."""
        discard = False
        try:
            self._loop(worker, run, deadline, step, ahead)
        except Deadline:
            # The guest is still running past deadline + grace: only a kill stops it.
            discard = True
            step.status = "failed"
            step.failure = _failed("timeout", "TimeoutError", "code mode cell timed out.")
        except WorkerCrashed as e:
            discard = True
            if not step.reports:
                self._release(worker, discard=True)
                raise
            step.status = "failed"
            # The spec's `runtime_unavailable`: a QuickJS worker that exits with a non-zero status.
            step.failure = _failed("runtime_unavailable", "WorkerCrashed", f"code mode worker crashed: {e}")
        except ProtocolError as e:
            discard = True
            step.status = "failed"
            step.failure = _failed("internal_error", "ProtocolError", str(e))
        except WorkerUnavailable as e:
            discard = True
            step.status = "failed"
            step.failure = _failed("runtime_unavailable", "WorkerUnavailable", str(e))
        except BaseException:
            # Not the worker's doing (a bug, the host closing under us): never leave it claimed.
            run.worker = None
            self._release(worker, discard=True)
            raise
        if step.status == "suspended":
            run.worker = None if discard else worker
        else:
            run.worker = None
        self._release(worker, discard=discard)
        return step

    def _loop(self, worker: WorkerProcess, run: Run, deadline: float, step: Step, ahead: bool) -> None:
        journal = run.journal
        dispatcher = run.dispatcher
        frame: protocol.WorkerFrame | None = None
        handed_back: protocol.WorkerFrame | None = None  # a report the relay did not take
        while True:
            if frame is None:
                frame = worker.recv(deadline + KILL_GRACE_S)
            # A report whose calls likely all run on one loop goes to that loop's relay whole.
            first: protocol.WorkerFrame | None = None
            loop: asyncio.AbstractEventLoop | None = None
            if not ahead and frame is not handed_back and _relayable(run, frame):
                assert isinstance(frame, Report)
                loop = dispatcher.loop_of(frame.calls)
                first = frame if loop is not None else None
            if first is None and self._take_report(worker, run, frame, step, hold=ahead):
                return
            frame = None
            # Parked: the guest awaits tools and the worker answers nothing until it is settled.
            while True:
                if first is None:  # (else the relay journals that report and starts its calls)
                    if run.yields:
                        step.status, step.reason = "suspended", "yield"
                        return
                    if journal.restart_safe or run.held:
                        # Restart-safe runs are never drained within the call (the spec), not
                        # even by a tool that answered at once: each result goes through a
                        # `wait`. Held calls (`advance`) start with the next `wait`.
                        step.status, step.reason = "suspended", "pending_tools"
                        return
                    if ahead:
                        # An advance never parks: a result that lands later advances it again.
                        results = dispatcher.take_ready()
                        if not results:
                            step.status, step.reason = "suspended", "pending_tools"
                            return
                        deadline = self._hand_results(worker, run, results, deadline, step)
                        break
                    if self._settle_or_arm(worker, run, deadline, step, driving=True):
                        deadline = step.deadline
                        break
                    loop = dispatcher.loop()
                try:
                    if loop is None:
                        spoke = worker.recv(deadline, dispatcher.wake_fd)
                    else:
                        spoke = _Relay(self, worker, run, step, loop, deadline, first).wait()
                    timed_out = False
                except Deadline:
                    spoke, timed_out = None, True
                finally:
                    # Never left armed: a late result must not be written to a worker (or a
                    # reused fd) after this run has moved on.
                    armed = dispatcher.disarm()
                if not armed:
                    # Settled by a tool's thread: the worker's report is next (or already here).
                    # (its deadline, if it has got that far: else ours, which the grace covers)
                    # Or the relay did not take the first report: the driver takes it.
                    deadline = max(deadline, step.deadline)
                    frame = spoke
                    handed_back = first
                    break
                first = None
                if timed_out:
                    step.status, step.reason = "suspended", "pending_tools"
                    return
                if spoke is not None:
                    raise ProtocolError(f"worker {worker.pid} spoke while parked")

    def _take_report(
        self,
        worker: WorkerProcess,
        run: Run,
        frame: protocol.WorkerFrame | None,
        step: Step,
        relay: asyncio.AbstractEventLoop | None = None,
        *,
        hold: bool = False,
    ) -> bool | None:
        """Journals one report and starts the tool calls it makes; True if the run has ended.
        ``relay``: called by the relay on that loop's thread, which takes only a pending report
        whose calls all start on that loop (no yields, no sync tools): for any other frame it
        returns None, having changed nothing."""
        journal = run.journal
        if isinstance(frame, Fault):
            raise WorkerUnavailable(f"code mode runtime is unavailable: {frame.message}")
        if not isinstance(frame, Report) or frame.run != run.engine_run:
            raise ProtocolError(f"worker {worker.pid} answered out of order")
        if relay is not None and not _relayable(run, frame):
            return None
        if frame.status == "pending":
            if len(frame.calls) > journal.limits.max_pending_calls:
                # An engine never has more calls in flight: this worker is not one of ours.
                raise ProtocolError(f"worker {worker.pid} reported more calls than maxPendingToolCalls")
            calls = [call for call in frame.calls if call[1] != YIELD_TOOL]
        elif frame.status not in ("completed", "failed"):
            raise ProtocolError(f"worker {worker.pid} reported an unknown status")
        # Guest JSON is decoded here, where a bad frame discards its worker, before any call starts.
        outputs = [(kind, decode_guest_json(text) if kind == 1 else text) for kind, text in frame.outputs]
        if relay is not None and not run.dispatcher.submit(calls, only_on=relay):
            return None
        step.reports += 1
        step.searches += frame.searches
        step.describes += frame.describes
        step.outputs.extend(outputs)
        step.memory_bytes = frame.memory_bytes
        journal.clock_reads.extend(frame.clock_reads)
        if frame.status == "completed":
            step.value = decode_guest_json(frame.value) if frame.value is not None else None
            if frame.store_writes is not None:
                step.store_writes = decode_guest_json(frame.store_writes)
            step.status = "completed"
            return True
        if frame.status == "failed":
            step.status, step.failure = "failed", frame.failure
            return True
        for call_id, tool, data in frame.calls:
            journal.calls.append(JournalCall(call_id, tool, input_hash(data)))
            if tool == YIELD_TOOL:
                run.yields.append(call_id)
            elif journal.restart_safe:
                journal.open_inputs[call_id] = data
        if hold:
            run.held.extend(calls)  # an advance (see `advance`): they start with the `wait`
        elif calls:
            step.tool_calls += len(calls)
            if relay is None:
                run.dispatcher.submit(calls)
        return False

    def _settle_or_arm(self, worker: WorkerProcess, run: Run, deadline: float, step: Step, *, driving: bool) -> bool:
        """Settles the results that are ready; if none are, arms the dispatcher so that the first
        to finish is settled by the thread that finished it: the worker gets it without a
        wake-up (and a GIL hand-off) of the driver in between. True if it settled."""
        results = run.dispatcher.take_ready()
        if results and (driving or settles_directly(results)):
            self._hand_results(worker, run, results, deadline, step, driving=driving)
            return True
        if results:
            run.dispatcher.requeue(results)  # too big to write from a tools' thread: the driver's
        run.dispatcher.arm(
            functools.partial(self._hand_results, worker, run, deadline=deadline, step=step, driving=False)
        )
        return False

    def _hand_results(
        self,
        worker: WorkerProcess,
        run: Run,
        results: list[tuple[int, bool, str]],
        deadline: float,
        step: Step,
        *,
        driving: bool = True,
    ) -> float:
        """Journals a batch of results and settles it into the run. Returns the deadline, pushed
        out once per exec/wait call so that results handed over just before it still get
        ``SETTLE_FLOOR_S`` of guest time. ``driving=False``: on a tool's thread while the driver
        is parked."""
        for call_id, _, _ in results:
            run.journal.open_inputs.pop(call_id, None)
        run.journal.batches.append(results)
        now = time.monotonic()
        if not step.extended and deadline - now < SETTLE_FLOOR_S:
            deadline, step.extended = now + SETTLE_FLOOR_S, True
        step.deadline = deadline
        frame = Settle(run.engine_run, results, max(1.0, (deadline - now) * 1000.0))
        if driving:
            worker.send(frame)
        else:
            worker.send_quietly(frame)
        return deadline


def _divergence(expected: list[tuple[int, str, str]], got: list[tuple[int, str, str]], status: str) -> str:
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return f"call {i + 1} was {have[1]} (input {have[2][:8]}), the journal has {want[1]} (input {want[2][:8]})"
    if len(got) != len(expected):
        return f"the replay made {len(got)} tool call(s), the journal has {len(expected)}"
    return f"the replay ended {status} before reaching the suspension point"
