"""The worker pool and the driver of one run: deadlines, kills, crash recovery.

    Session.exec ──> Supervisor.run(start, dispatcher)
                        │  acquire an idle worker (spawned ahead of time)
                        │  Configure (only if its limits/catalog are stale), Start ──> worker
                        │      worker: engine.start ──> Report(pending, calls)
                        │  dispatcher runs the calls in the host (sync inline, async on a loop)
                        │  Settle(results) ──> worker: engine.settle ──> Report(...)
                        │  ... until completed | failed, or the deadline:
                        │      guest still running at deadline + grace -> SIGKILL, replace, `timeout`
                        │      tools still pending at the deadline     -> Drop, `timeout`
                        │      worker gone (EOF, bad frame)            -> replace, `internal_error`
                        └─ release the worker to the idle pool

Workers are separate processes (``subprocess`` — never ``fork`` — ``python -I``, an empty
environment, their own session and process group, RLIMIT_AS and RLIMIT_CPU). Every frame
from a worker is untrusted: size-capped, decoded against the protocol union, and a worker that
sends anything else is discarded. QuickJS's interrupt handler stops most runaway guests inside
the worker; the SIGKILL at deadline + grace is the backstop for builtins that never poll it.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Protocol

import msgspec

from . import protocol
from .errors import ClosedError, ProtocolError, WorkerCrashed, WorkerUnavailable
from .protocol import Configure, Drop, Fault, Ready, Report, Settle, Start

__all__ = ["Supervisor", "RunOutcome", "KILL_GRACE_S"]

#: How long past the deadline a worker may take to report before it is killed.
KILL_GRACE_S = 0.25
#: How long a new worker may take to say it is ready.
SPAWN_TIMEOUT_S = 10.0
#: RLIMIT_AS for a worker: QuickJS heaps are capped by their own allocator; this bounds the rest.
WORKER_ADDRESS_SPACE = 4 << 30
#: RLIMIT_CPU (seconds) for a worker; it is recycled well before it could reach this.
WORKER_CPU_SECONDS = 3600
#: Runs a worker serves before it is replaced.
RUNS_PER_WORKER = 50_000

_WORKER_MAIN = "from codemode._worker import main; main()"


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
        self.ready = False
        self.configured: object = None
        self.runs = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, frame: msgspec.Struct) -> None:
        try:
            protocol.write_all(self.wfd, protocol.encode(frame))
        except OSError as e:
            raise self.crashed(f"worker {self.pid} stopped reading: {e}") from None

    def recv(self, deadline: float, wake_fd: int | None = None) -> protocol.WorkerFrame | None:
        """The next frame; None if ``wake_fd`` became readable first. Raises ``Deadline``."""
        reader = self.reader
        while True:
            body = reader.poll()
            if body is not None:
                try:
                    frame = protocol.worker_decoder.decode(body)
                except msgspec.DecodeError as e:
                    raise ProtocolError(f"worker {self.pid} sent a malformed frame: {e}") from None
                return frame
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise Deadline
            poller = select.poll()
            poller.register(self.rfd, select.POLLIN)
            if wake_fd is not None:
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


class Dispatcher(Protocol):
    """Runs tool calls for one run (see ``tools.Dispatcher``)."""

    wake_fd: int

    def submit(self, calls: list[tuple[int, str, str]]) -> None: ...
    def take_ready(self) -> list[tuple[int, bool, str]]: ...
    def pending(self) -> int: ...
    def cancel(self) -> None: ...


class RunOutcome(msgspec.Struct):
    """What the driver saw: the final report's status and everything the run produced."""

    status: str  # completed | failed
    value: str | None = None
    failure: tuple[str | None, str, str, str] | None = None
    outputs: list[tuple[int, str]] = msgspec.field(default_factory=list)
    tool_calls: int = 0
    memory_bytes: int = 0
    reports: int = 0


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
                self._spawn_locked()

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
                        continue
                    self._busy.add(worker)
                    return worker
                if len(self._busy) < self._size:
                    self._spawn_locked()
                    continue
                self._cond.wait()

    def _release(self, worker: WorkerProcess, *, discard: bool = False) -> None:
        with self._cond:
            self._busy.discard(worker)
            worker.runs += 1
            if discard or self._closed or worker.runs >= RUNS_PER_WORKER:
                retire = True
            else:
                retire = False
                self._idle.appendleft(worker)
            if retire and not self._closed:
                self._spawn_locked()
            self._cond.notify()
        if retire:
            if discard:
                self.killed += 1
                worker.kill()
            else:
                worker.shutdown()

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

    def worker_pids(self) -> list[int]:
        with self._cond:
            return [w.pid for w in list(self._idle) + list(self._busy)]

    # ---- one run -------------------------------------------------------------------------------
    def run(
        self,
        configure: Configure,
        source: str,
        language: str,
        timeout_ms: int,
        seed: int,
        dispatcher: Dispatcher,
    ) -> RunOutcome:
        deadline = time.monotonic() + timeout_ms / 1000.0
        run_id = next(self._run_ids)
        start = Start(run_id, source, language, float(timeout_ms), seed)
        outcome = RunOutcome(status="failed")
        worker = self._start(configure, start, outcome)
        if worker is None:
            return outcome
        discard = False
        try:
            try:
                self._drive(worker, run_id, deadline, dispatcher, outcome)
            except WorkerCrashed:
                if outcome.reports:
                    raise
                # Dead before it said anything: most likely killed while idle, before it read
                # the cell (a kill is not visible to `poll()` at once). One more worker tries.
                self._release(worker, discard=True)
                worker = self._start(configure, start, outcome)
                if worker is None:
                    return outcome
                self._drive(worker, run_id, deadline, dispatcher, outcome)
        except Deadline:
            # The guest is still running past deadline + grace: only a kill stops it.
            discard = True
            outcome.failure = _failed("timeout", "TimeoutError", "code mode cell timed out.")
        except WorkerCrashed as e:
            discard = True
            outcome.failure = _failed("internal_error", "WorkerCrashed", f"code mode worker crashed: {e}")
        except ProtocolError as e:
            discard = True
            outcome.failure = _failed("internal_error", "ProtocolError", str(e))
        except WorkerUnavailable as e:
            discard = True
            outcome.failure = _failed("runtime_unavailable", "WorkerUnavailable", str(e))
        finally:
            if outcome.status != "completed" and dispatcher.pending():
                dispatcher.cancel()
            self._release(worker, discard=discard)
        return outcome

    def _start(self, configure: Configure, start: Start, outcome: RunOutcome) -> WorkerProcess | None:
        """Hands the cell to a live worker. A worker found dead before it took the cell is
        replaced and the cell goes to the next one; the guest did nothing wrong."""
        for attempt in range(2):
            worker = self._acquire()
            try:
                if not worker.ready:
                    ready = worker.recv(time.monotonic() + SPAWN_TIMEOUT_S)
                    if not isinstance(ready, Ready):
                        raise ProtocolError(f"worker {worker.pid} did not introduce itself")
                    worker.ready = True
                if worker.configured is not configure:
                    worker.send(configure)
                    worker.configured = configure
                worker.send(start)
                return worker
            except (WorkerCrashed, ProtocolError, Deadline) as e:
                self._release(worker, discard=True)
                if attempt == 1 or isinstance(e, Deadline):
                    reason = str(e) or "the worker did not start in time"
                    outcome.failure = _failed(
                        "runtime_unavailable", "WorkerUnavailable", f"code mode runtime is unavailable: {reason}"
                    )
                    return None
        return None

    def _drive(
        self, worker: WorkerProcess, run_id: int, deadline: float, dispatcher: Dispatcher, outcome: RunOutcome
    ) -> None:
        while True:
            frame = worker.recv(deadline + KILL_GRACE_S)
            if isinstance(frame, Fault):
                raise WorkerUnavailable(f"code mode runtime is unavailable: {frame.message}")
            if not isinstance(frame, Report) or frame.run != run_id:
                raise ProtocolError(f"worker {worker.pid} answered out of order")
            outcome.reports += 1
            outcome.outputs.extend(frame.outputs)
            outcome.memory_bytes = frame.memory_bytes
            if frame.status == "completed":
                outcome.status = "completed"
                outcome.value = frame.value
                return
            if frame.status == "failed":
                outcome.failure = frame.failure
                return
            if frame.status != "pending":
                raise ProtocolError(f"worker {worker.pid} reported an unknown status")
            if frame.calls:
                outcome.tool_calls += len(frame.calls)
                dispatcher.submit(frame.calls)
            results = dispatcher.take_ready()
            while not results:
                # The guest is parked on tools; the worker is idle and answers nothing until we
                # settle. Wait for a tool (or the worker dying) until the deadline.
                try:
                    woke = worker.recv(deadline, dispatcher.wake_fd)
                except Deadline:
                    worker.send(Drop(run_id))
                    outcome.failure = _failed(
                        "timeout",
                        "TimeoutError",
                        f"code mode cell timed out waiting for {dispatcher.pending()} tool call(s).",
                    )
                    return
                if woke is not None:
                    raise ProtocolError(f"worker {worker.pid} spoke while parked")
                results = dispatcher.take_ready()
            remaining_ms = max(1.0, (deadline - time.monotonic()) * 1000.0)
            worker.send(Settle(run_id, results, remaining_ms))
