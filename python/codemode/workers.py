"""Worker processes: the handle on one, and the lane the supervisor keeps for each.

    Lane ─┬─ WorkerProcess      start, send, receive, kill, liveness (nothing else: a worker
          │                     elsewhere, e.g. a Ray actor, plugs in behind the same five)
          ├─ pipeline           the frames written to it, in order: the first is the one it is
          │                     executing (and when it must answer); small ones queue behind
          ├─ queue              runs with a frame to send once it is free (FIFO: fair)
          ├─ residents          runs whose runtime lives there (parked, queued, running)
          └─ reader             who reads its pipe now: its reader thread, or a waiting caller

Workers are separate processes: the ``codemode-worker`` binary shipped next to this module
(rust/worker; ``subprocess``, never ``fork``; an empty environment; their own session and
process group; RLIMIT_DATA and RLIMIT_CPU, which it sets from its arguments). Every frame from
a worker is untrusted: size-capped and decoded against the protocol union; a worker that sends
anything else is discarded. A worker executes one frame at a time, in the order written; the
supervisor writes small frames behind the one it executes (so a busy worker reads its next frame
without sleeping in between) and knows, for each worker, which run's frame it is executing, since
when, and which run to blame if it dies.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from . import protocol
from ._engine import current_cpu
from .errors import ProtocolError, WorkerCrashed
from .hotloop import SPINS

if TYPE_CHECKING:
    from .runs import Run

__all__ = ["FrameSource", "Inflight", "Lane", "Worker", "WorkerProcess", "popen_worker", "worker_argv", "write_before"]

#: RLIMIT_DATA (the memory a worker may write) on top of what its resident runtimes may hold
#: together: QuickJS heaps are capped by their own allocator; this bounds the rest (arena images,
#: pages committed past a heap, the system heap). Not RLIMIT_AS: the worker reserves terabytes of
#: address space for its engines' arenas (rust/engine/src/arena.rs), which costs no memory.
WORKER_MEMORY_SLACK = 2 << 30
#: RLIMIT_CPU (seconds) for a worker; it is recycled well before it could reach this.
WORKER_CPU_SECONDS = 3600
#: How long a worker waits with no frame before it gives back the memory of the engines it kept
#: ready past a burst of runs (rust/worker/src/pool.rs): longer than a model's turn, so that a
#: host whose many conversations take their turns together starts each burst on reset engines.
WORKER_SHED_AFTER_S = 60.0

#: The worker binary (rust/worker), built next to the package by ``make build`` and shipped in
#: the wheel. Missing, every spawn fails with an ``OSError``: runs fail ``runtime_unavailable``.
WORKER_BINARY = Path(__file__).with_name("codemode-worker")
#: How long a caller awaiting a worker's reply polls before it sleeps (`FrameSource.take`):
#: a trivial cell's reply comes ~20-40 µs after its frame, a tool call's report sooner, but the
#: first segment of a cell after some ms idle takes its worker 100-150 µs (a cold CPU). A caller
#: that slept through it is woken onto the worker's CPU, and the two then take turns there for
#: the rest of the cell (10 tool calls 3-5 ms after the last: ~1.5 ms at 100 µs, ~0.65 at 200).
SPIN_S = 200e-6


class FrameSource:
    """The reading side of a worker: whole frames from the file descriptor ``rfd`` (a worker's
    stdout, or a relay's pipe), decoded against the protocol union and size-capped."""

    def __init__(self, rfd: int) -> None:
        self.rfd = rfd
        self.reader = protocol.frame_reader(rfd)
        #: A malformed frame read after good ones (raised by the next `take`).
        self._bad: ProtocolError | None = None
        #: Killed because it stopped reading before a write's deadline (its culprit timed out).
        self.overdue = False

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def take(self, timeout_s: float, spin: bool = False) -> tuple[bool, list[protocol.WorkerFrame] | None]:
        """Waits up to ``timeout_s`` for the worker to write (or exit), then reads what it
        wrote: ``(False, [])`` if nothing came; else ``True`` and the whole frames it completes
        (maybe none), or None at the end of the pipe. ``spin``: a reply is due, maybe within
        microseconds (the worker is executing a frame), so it polls for up to `SPIN_S` before
        it sleeps (`codemode_spin`, yielding: it stops on a CPU it shares with the worker). A
        frame that is not one of ours is a ``ProtocolError``, raised once the frames before it
        have been returned (by the next take, at once)."""
        if self._bad is not None:
            raise self._bad
        spoke, bodies = self.reader.read_within(timeout_s, SPIN_S if spin and SPINS else 0.0)
        if bodies is None:
            return spoke, None if spoke else []
        frames = []
        for body in bodies:
            try:
                frames.append(protocol.worker_decoder.decode(body))
            except msgspec.DecodeError as e:
                self._bad = ProtocolError(f"worker {self.pid} sent a malformed frame: {e}")
                if not frames:
                    raise self._bad from None
                break
        return True, frames


def worker_argv(memory_bytes: int, cpu_seconds: int) -> list[str]:
    """The command line of a worker (rust/worker/src/main.rs): its memory and CPU limits, and
    when it sheds the engines it kept ready (`WORKER_SHED_AFTER_S`, in ms)."""
    return [str(WORKER_BINARY), str(memory_bytes), str(cpu_seconds), str(round(WORKER_SHED_AFTER_S * 1000))]


def popen_worker(argv: list[str]) -> subprocess.Popen[bytes]:
    """Starts a worker process (here, or inside a Ray actor): frames on unbuffered pipes, no
    stderr, an empty environment, and a session of its own (it is killed as a process group)."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={},
        start_new_session=True,
        close_fds=True,
        bufsize=0,
    )


def _start_elsewhere(pid: int) -> set[int] | None:
    """Keeps a new worker off the CPU its spawner runs on, until it is up; returns the CPUs to
    give it back then (None: nothing was changed). A new process is queued on its parent's CPU,
    and the host goes on there (its constructor, its first cell) while the other CPUs idle: the
    worker used to start only once the host paused, ~1.3 ms later on this kind of VM."""
    cpus = os.sched_getaffinity(0)
    here = current_cpu()
    if here is None or here not in cpus or len(cpus) < 2:
        return None
    try:
        os.sched_setaffinity(pid, cpus - {here})
    except OSError:
        return None
    return cpus


def write_before(fd: int, writable: select.poll, data: bytes, deadline: float) -> OSError | None:
    """Writes all of ``data`` to the non-blocking ``fd`` (``writable`` polls it for POLLOUT);
    the error if it is gone, or a ``TimeoutError`` if the reader has not taken it all by
    ``deadline`` (``time.monotonic``): it stopped reading, and the caller kills it."""
    try:
        written = os.write(fd, data)
    except BlockingIOError:
        written = 0
    except OSError as e:
        return e
    if written == len(data):
        return None  # (a frame fits the pipe's buffer: nearly always, at once)
    view = memoryview(data)[written:]
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not writable.poll(timeout * 1000.0):
                return TimeoutError("stopped reading")
        except OSError as e:
            return e
    return None


class Worker(Protocol):
    """What the supervisor needs of a worker, wherever it runs (`placement`): its frames
    (`FrameSource`), writing frames, liveness, and killing it."""

    rfd: int
    overdue: bool

    @property
    def pid(self) -> int: ...

    def take(self, timeout_s: float, spin: bool = False) -> tuple[bool, list[protocol.WorkerFrame] | None]: ...

    def send(self, frames: list[msgspec.Struct], deadline: float) -> OSError | None: ...

    def booted(self) -> None:
        """Told once, when it says `Ready`."""

    def alive(self) -> bool: ...

    def crashed(self, message: str, *, timed_out: bool = False) -> WorkerCrashed: ...

    def signal_kill(self) -> None: ...

    def kill(self) -> None: ...

    def close_pipes(self) -> None: ...

    def shutdown(self, wait_s: float = 0.5) -> None: ...


class WorkerProcess(FrameSource):
    """One worker subprocess on this machine, and the framing on its pipes."""

    def __init__(self, memory_bytes: int) -> None:
        self.proc = popen_worker(worker_argv(memory_bytes, WORKER_CPU_SECONDS))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        #: The CPUs it may use once it is up (`booted`); until then, not the spawner's.
        self._cpus = _start_elsewhere(self.proc.pid)
        super().__init__(self.proc.stdout.fileno())
        self._stdin = self.proc.stdin
        self.wfd = self._stdin.fileno()
        #: Writes never block past their deadline (a worker that stops reading is killed).
        os.set_blocking(self.wfd, False)
        self._out = select.poll()
        self._out.register(self.wfd, select.POLLOUT)
        #: Writes are whole frames: a ``Drop`` may be written by any thread, between others.
        self._write_lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, frames: list[msgspec.Struct], deadline: float) -> OSError | None:
        """Writes the frames, each whole; the error if the pipe is gone (the reader then finds
        its end). A worker that has not taken them by ``deadline`` (``time.monotonic``) stopped
        reading: it is killed. Under the write lock, which `close_pipes` takes too: the fd
        cannot be closed (and its number reused) meanwhile."""
        data = protocol.encode(frames[0]) if len(frames) == 1 else b"".join(map(protocol.encode, frames))
        with self._write_lock:
            if self._stdin.closed:
                return BrokenPipeError("pipe closed")
            error = write_before(self.wfd, self._out, data, deadline)
        if error is None:
            return None
        if isinstance(error, TimeoutError):
            self.overdue = True
            self.signal_kill()
            return TimeoutError(f"worker {self.pid} stopped reading")
        return error

    def booted(self) -> None:
        """It said `Ready`: from now on it may run on every CPU the host may (a frame then
        wakes it on the writer's, where it runs at once: on a CPU that has been idle, a
        wake-up costs ~70 µs more on this kind of VM)."""
        cpus, self._cpus = self._cpus, None
        if cpus is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, cpus)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def crashed(self, message: str, *, timed_out: bool = False) -> WorkerCrashed:
        """The error for a worker that is gone (reaped here), with its exit code or signal."""
        code = self.proc.poll()
        if code is None:
            self.signal_kill()  # (its pipes stay open: whoever polls them closes them)
            code = self.proc.wait()
        sig = -code if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        if sig is not None and not timed_out:
            message = f"{message} (signal {signal.Signals(sig).name})"
        elif exit_code is not None:
            message = f"{message} (exit code {exit_code})"
        return WorkerCrashed(message, exit_code=exit_code, signal=sig, timed_out=timed_out)

    def signal_kill(self) -> None:
        """SIGKILL, without waiting (safe under a lock); `kill` reaps."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal_kill()
        self.proc.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        with self._write_lock:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()

    def shutdown(self, wait_s: float = 0.5) -> None:
        """Asks the worker to exit (EOF on stdin), then kills it if it lingers."""
        with self._write_lock:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class Inflight(msgspec.Struct, frozen=True):
    """The frame a worker is executing. (A struct: built in C, for every frame.)"""

    #: Whose (None: the worker's ``Ready``, before its first frame).
    run: Run | None
    kind: str  # ready | start | settle | replay
    sent: float
    #: When the worker is killed if it has not answered (the run's deadline plus the grace).
    kill_at: float


#: The reader that is a lane's own thread (any other is a waiting caller's `Waiter`, or an event
#: loop's thread: `readers.LoopReader`).
READER_THREAD = "thread"


class Lane:
    """What the supervisor knows of one worker. Every field is guarded by the supervisor's
    lock, except ``worker``'s pipes (see `WorkerProcess`)."""

    __slots__ = (
        "attached",
        "cond",
        "configured",
        "dead",
        "memory",
        "outbox",
        "pipeline",
        "primed",
        "queue",
        "reader",
        "reader_busy",
        "residents",
        "retiring",
        "started",
        "thread",
        "worker",
        "writing",
    )

    def __init__(self, worker: Worker, lock: threading.Lock, ready_by: float) -> None:
        self.worker = worker
        #: Frames written and not answered yet, oldest first; it starts with the worker's `Ready`.
        self.pipeline: collections.deque[Inflight] = collections.deque(
            [Inflight(None, "ready", time.monotonic(), ready_by)]
        )
        self.queue: collections.deque[Run] = collections.deque()
        #: Frames to write, in pipeline order, and whether a thread is writing them now: writes
        #: happen outside the supervisor's lock, and their order is the pipeline's.
        self.outbox: collections.deque[tuple[list[msgspec.Struct], float]] = collections.deque()
        self.writing = False
        self.residents: set[Run] = set()
        #: Residents with a caller waiting on them: someone must read while any are here.
        self.attached: set[Run] = set()
        #: QuickJS memory of the residents together, as last reported.
        self.memory = 0
        #: Who reads the pipe: None, `READER_THREAD`, a waiting caller's `Waiter`, or a `LoopReader`.
        self.reader: object = None
        #: The caller reading is away running its sync tools: others take over if they need to.
        self.reader_busy = False
        self.cond = threading.Condition(lock)
        self.configured: object = None
        #: The last `FrameQueue.prime` that configured it (its order among them).
        self.primed = 0
        self.dead = False
        #: Served its share of cells: takes no new ones, and is replaced once it holds none.
        self.retiring = False
        self.started = 0
        self.thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.worker.pid

    @property
    def inflight(self) -> Inflight | None:
        """The frame the worker is executing."""
        return self.pipeline[0] if self.pipeline else None

    def busy(self) -> int:
        """How much work is ahead of a new frame here."""
        return len(self.queue) + len(self.pipeline)
