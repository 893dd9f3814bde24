"""Workers as Ray actors (``CodeMode(placement="ray")``): the same worker binary, on a cluster.

    host: RayWorker ──send(seq, frames)──>  actor (WorkerActor) ──stdin──> codemode-worker
          relay thread <──receive()── bytes ◄────────────────── stdout ◄──┘
          └─> a local pipe (rfd): the supervisor reads it like a local worker's stdout

Each actor runs one ``codemode-worker`` subprocess (no Python in the engine's process, the same
limits as a local worker) and relays its pipes: frames go in through ``send`` (numbered, written
in order whatever order Ray runs the calls in), and ``receive`` is a long poll that returns
whatever the worker wrote. The host copies those bytes into a local pipe, so the supervisor's
readers, deadlines and event-loop reading work unchanged. Killing a worker kills its actor
(``ray.kill``); the worker process was started with ``PR_SET_PDEATHSIG`` (``setpriv
--pdeathsig KILL``) from a thread that lives as long as it does, so it dies with the actor even
in the middle of a builtin that never polls QuickJS's interrupt. A lost actor's runs are
recovered as for any dead worker: the run it was executing fails, the others replay elsewhere.

Tools still run in the host. Ray is an optional extra (``pip install 'codemode[ray]'``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import threading
from typing import Any

import msgspec

from . import protocol
from .errors import WorkerCrashed
from .extras import explained
from .workers import WORKER_BINARY, WORKER_CPU_SECONDS, FrameSource, Worker

__all__ = ["RayPlacement", "RayWorker", "WorkerActor"]

#: The most a ``receive`` hands back at once.
RECEIVE_BYTES = 1 << 20

#: Each kind of actor call has its own thread in the actor, so that a long poll for output never
#: holds up a frame going in, and a kill never waits for either.
CONCURRENCY_GROUPS = {"send": 1, "receive": 1, "control": 1}


class WorkerActor:
    """Inside the actor: one worker subprocess and its pipes."""

    def __init__(self, memory_bytes: int, cpu_seconds: int) -> None:
        argv = [str(WORKER_BINARY), str(memory_bytes), str(cpu_seconds)]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        started = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._error: OSError | None = None

        def keep() -> None:
            # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: this one
            # lives as long as the child.
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env={},
                    start_new_session=True,
                    close_fds=True,
                    bufsize=0,
                )
            except OSError as e:
                self._error = e
                return
            finally:
                started.set()
            self._proc.wait()

        threading.Thread(target=keep, name="codemode-worker-keeper", daemon=True).start()
        started.wait()
        self._next = 0
        self._held: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def pid(self) -> int:
        """The worker's process id on the actor's node (-1 if it could not start)."""
        return -1 if self._proc is None else self._proc.pid

    def send(self, seq: int, data: bytes) -> None:
        """Writes frames to the worker in ``seq`` order (a call that comes early waits)."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with self._lock:
            self._held[seq] = data
            while self._next in self._held:
                chunk = self._held.pop(self._next)
                self._next += 1
                try:
                    proc.stdin.write(chunk)
                except (BrokenPipeError, ValueError):
                    return  # the worker is gone: `receive` says so

    def receive(self) -> bytes:
        """What the worker wrote next (blocks until it writes); empty once it is gone."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return b""
        try:
            return os.read(proc.stdout.fileno(), RECEIVE_BYTES)
        except OSError:
            return b""

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def kill_worker(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """EOF on the worker's stdin: it exits when done with its frame."""
        if self._proc is not None and self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass


class RayWorker(FrameSource):
    """The host's handle on one actor: frames out by actor calls, frames in through a relay
    thread into a local pipe (``rfd``), liveness and kill by Ray."""

    def __init__(self, actor_class: Any, memory_bytes: int, options: dict[str, Any]) -> None:
        import ray

        self._ray = ray
        self._actor = actor_class.options(**options).remote(memory_bytes, WORKER_CPU_SECONDS)
        rfd, self._wfd = os.pipe()
        super().__init__(rfd)
        self._seq = itertools.count()
        self._send_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._pid = 0
        self._killed = False
        self._closed = False
        self._relay = threading.Thread(target=self._pump, name="codemode-ray-relay", daemon=True)
        self._relay.start()

    @property
    def pid(self) -> int:
        """The worker's process id on its node (0 until the actor has said)."""
        return self._pid

    def _call(self, method: str, group: str, *args: Any) -> Any:
        return getattr(self._actor, method).options(concurrency_group=group).remote(*args)

    def _pump(self) -> None:
        """The relay: the actor's output into the local pipe, until either end is gone."""
        try:
            self._pid = self._ray.get(self._call("pid", "control"))
            while True:
                data = self._ray.get(self._call("receive", "receive"))
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(self._wfd, view) :]
        except (self._ray.exceptions.RayError, OSError):
            pass  # the actor died, or the host closed its end
        finally:
            os.close(self._wfd)

    def send(self, frames: list[msgspec.Struct], deadline: float) -> OSError | None:
        """Hands the frames to the actor (in order: numbered). A dead actor is found by the
        relay; one that stops taking frames, by the reader's kill time."""
        del deadline
        data = b"".join(protocol.encode(frame) for frame in frames)
        with self._send_lock:
            if self._killed:
                return BrokenPipeError("the worker's actor is gone")
            self._call("send", "send", next(self._seq), data)
        return None

    def alive(self) -> bool:
        return not self._killed and self._relay.is_alive()

    def crashed(self, message: str, *, timed_out: bool = False) -> WorkerCrashed:
        if self.alive():
            self.signal_kill()
        sig = signal.SIGKILL if self._killed else None
        if sig is not None and not timed_out:
            message = f"{message} (actor killed)"
        return WorkerCrashed(message, exit_code=None, signal=sig, timed_out=timed_out)

    def signal_kill(self) -> None:
        """Kills the actor (its worker dies with it), without waiting."""
        with self._send_lock:
            if self._killed:
                return
            self._killed = True
        try:
            self._ray.kill(self._actor, no_restart=True)
        except self._ray.exceptions.RayError:
            pass  # (gone already)

    def kill(self) -> None:
        self.signal_kill()
        self._relay.join(10.0)
        self.close_pipes()

    def close_pipes(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                os.close(self.rfd)

    def shutdown(self, wait_s: float = 0.5) -> None:
        """Asks the worker to exit (EOF on its stdin), then kills the actor."""
        try:
            self._call("close", "control")
        except self._ray.exceptions.RayError:
            pass
        self._relay.join(wait_s)
        self.kill()


class RayPlacement:
    """Workers as actors on a Ray cluster: the one at ``address`` (or ``RAY_ADDRESS``), or a local
    one started here if there is none and Ray is not initialized yet. ``actor_options`` go to
    each actor (``num_cpus``, ``resources``, ``runtime_env``...; by default one CPU each). An
    actor that is not up within ``spawn_timeout_s`` (the cluster has no room for it, its node
    lacks codemode) is killed, and the runs that waited for it fail."""

    def __init__(
        self,
        address: str | None = None,
        *,
        actor_options: dict[str, Any] | None = None,
        init_options: dict[str, Any] | None = None,
        spawn_timeout_s: float = 60.0,
    ) -> None:
        self.spawn_timeout_s = spawn_timeout_s
        try:
            import ray
        except ImportError as e:
            raise explained(e) from e
        if not ray.is_initialized():
            ray.init(address=address, **(init_options or {}))
        # (Ray takes concurrency groups here only, not in `.options()`; its stubs omit them.)
        self._class = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(WorkerActor)  # type: ignore[call-overload]
        self._options = {"num_cpus": 1, **(actor_options or {})}

    def start(self, memory_bytes: int) -> Worker:
        return RayWorker(self._class, memory_bytes, self._options)

    def close(self) -> None:
        pass  # (the cluster is not ours to stop: the host may use it for other work)
