"""Workers as Ray actors (``CodeMode(placement="ray")``): the same worker binary, on a cluster.

    host: RayWorker                                  actor (WorkerActor, on any node)
      listens on a TCP port   <──connect + token──   relays its worker's pipes to the stream
      send ──frames──────────────── TCP ──────────>  ──stdin──> codemode-worker
      relay thread <─────────────── TCP ───────────  <─stdout───┘
      └─> a local pipe (rfd): the supervisor reads it like a local worker's stdout
      watcher: ray.get(actor.exited()) returns or raises when the worker or the actor is gone

Ray places, starts, watches and kills the actors; the frames do not go through Ray calls (a
round trip through actor calls costs ~1.5 ms here, a TCP stream tens of µs). Each actor starts
one ``codemode-worker`` subprocess (no Python in the engine's process, the same limits as a
local worker) and connects back to a port the host opened for that worker alone, proving itself
with a random token that went to it with its constructor arguments; anything else that connects
is dropped. The host copies what arrives into a local pipe, so the supervisor's readers,
deadlines and event-loop reading work unchanged. Killing a worker kills its actor (``ray.kill``):
the worker was started with ``PR_SET_PDEATHSIG`` (``setpriv --pdeathsig KILL``) from a thread
that lives as long as it does, so it dies with the actor even in the middle of a builtin that
never polls QuickJS's interrupt. A lost actor's runs are recovered as for any dead worker
(`fleet.Fleet.lane_died`): they replay elsewhere from their journals.

Tools still run in the host. Ray is an optional extra (``pip install 'codemode[ray]'``).
"""

from __future__ import annotations

import hmac
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import threading
import weakref
from typing import Any

import msgspec

from . import protocol
from .errors import WorkerCrashed
from .extras import explained
from .workers import WORKER_CPU_SECONDS, FrameSource, Worker, popen_worker, worker_argv, write_before

__all__ = ["RayPlacement", "RayWorker", "WorkerActor"]

#: The most one read of the stream takes at once.
CHUNK_BYTES = 1 << 20
#: The actor's proof that it is the one this port was opened for.
TOKEN_BYTES = 32
#: ``exited`` blocks for the worker's life on a thread of its own, so ``pid`` and ``close``
#: are never held up behind it.
CONCURRENCY_GROUPS = {"watch": 1, "control": 1}
#: How often the relay, still waiting for its actor to connect, looks whether it is gone.
ACCEPT_TICK_S = 0.1
#: How long a crash report waits for the actor to say how its worker ended.
CRASH_REPORT_S = 0.5
#: How long killing a worker waits for its watch thread to see the actor gone (Ray says so
#: within milliseconds; this only bounds a cluster that does not answer).
WATCH_END_S = 5.0


class WorkerActor:
    """Inside the actor: one worker subprocess, its pipes relayed to the host's stream."""

    def __init__(self, memory_bytes: int, cpu_seconds: int, host: str, port: int, token: bytes) -> None:
        self._proc = self._start(memory_bytes, cpu_seconds)
        stream = socket.create_connection((host, port), timeout=30.0)
        stream.settimeout(None)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.sendall(token)
        self._stream = stream
        for target in (self._frames_in, self._frames_out):
            threading.Thread(target=target, name="codemode-actor-relay", daemon=True).start()

    @staticmethod
    def _start(memory_bytes: int, cpu_seconds: int) -> subprocess.Popen[bytes]:
        argv = worker_argv(memory_bytes, cpu_seconds)
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        started: list[subprocess.Popen[bytes] | OSError] = []
        ready = threading.Event()

        def keep() -> None:
            # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: this one
            # lives as long as the child.
            try:
                proc = popen_worker(argv)
            except OSError as e:
                started.append(e)
                ready.set()
                return
            started.append(proc)
            ready.set()
            proc.wait()

        threading.Thread(target=keep, name="codemode-worker-keeper", daemon=True).start()
        ready.wait()
        proc = started[0]
        if isinstance(proc, OSError):
            raise proc
        return proc

    def _frames_in(self) -> None:
        """The host's frames to the worker's stdin; EOF from the host closes it (the worker exits)."""
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while data := self._stream.recv(CHUNK_BYTES):
                stdin.write(data)
        except OSError:
            pass
        finally:
            self.close()

    def _frames_out(self) -> None:
        """The worker's stdout to the host; its end is the stream's end."""
        stdout = self._proc.stdout
        assert stdout is not None
        try:
            while data := os.read(stdout.fileno(), CHUNK_BYTES):
                self._stream.sendall(data)
        except OSError:
            pass
        finally:
            try:
                self._stream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def pid(self) -> int:
        """The worker's process id on the actor's node."""
        return self._proc.pid

    def exited(self) -> int | None:
        """Blocks until the worker is gone; its exit status."""
        return self._proc.wait()

    def close(self) -> None:
        """EOF on the worker's stdin: it exits when done with its frame."""
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass


class RayWorker(FrameSource):
    """The host's handle on one actor: frames both ways on a TCP stream the actor connects to
    (read by a relay thread into a local pipe, ``rfd``), liveness and kill by Ray."""

    def __init__(self, actor_class: Any, memory_bytes: int, options: dict[str, Any], host: str) -> None:
        import ray

        self._ray = ray
        self._listener = socket.create_server((host, 0), backlog=8)
        self._listener.settimeout(ACCEPT_TICK_S)
        self._token = secrets.token_bytes(TOKEN_BYTES)
        port = self._listener.getsockname()[1]
        self._actor = actor_class.options(**options).remote(memory_bytes, WORKER_CPU_SECONDS, host, port, self._token)
        rfd, self._wfd = os.pipe()
        super().__init__(rfd)
        self._lock = threading.Lock()
        self._stream: socket.socket | None = None
        self._writable = select.poll()
        #: Frames sent before the actor connected, with their deadlines.
        self._early: list[tuple[bytes, float]] = []
        self._gone = False
        self._killed = False
        self._closed = False
        self._pid = 0
        #: The worker's exit status, once the actor has said (None if the actor died first).
        self._status: int | None = None
        self._watched = threading.Event()
        self._relay = threading.Thread(target=self._pump, name="codemode-ray-relay", daemon=True)
        self._relay.start()
        threading.Thread(target=self._watch, name="codemode-ray-watch", daemon=True).start()

    @property
    def pid(self) -> int:
        """The worker's process id on its node (0 until the actor has said)."""
        return self._pid

    def _call(self, method: str, group: str) -> Any:
        return getattr(self._actor, method).options(concurrency_group=group).remote()

    def _watch(self) -> None:
        """Ray says when the actor is up (its worker's pid) and when it or its worker is gone."""
        try:
            self._pid = self._ray.get(self._call("pid", "control"))
            self._status = self._ray.get(self._call("exited", "watch"))
        except self._ray.exceptions.RayError:
            pass  # the actor died, or could not be made
        self._hang_up()
        self._watched.set()

    def _hang_up(self) -> None:
        """Ends the stream (the relay then ends the pipe: the reader sees the worker exit)."""
        with self._lock:
            self._gone = True
            if self._stream is not None:
                try:
                    self._stream.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> socket.socket | None:
        """The actor's connection (proven by its token); None if it is gone first (one that does
        not connect in time is killed by the supervisor: `placement.Placement.spawn_timeout_s`)."""
        with self._listener:
            while not self._gone:
                try:
                    stream, _ = self._listener.accept()
                except TimeoutError:
                    continue
                stream.settimeout(5.0)
                try:
                    token = stream.recv(TOKEN_BYTES, socket.MSG_WAITALL)
                except OSError:
                    token = b""
                if hmac.compare_digest(token, self._token):
                    return stream
                stream.close()  # not our actor: it gets nothing, and we keep waiting
        return None

    def _pump(self) -> None:
        """The relay: the stream into the local pipe, until either end is gone."""
        stream = self._accept()
        try:
            if stream is None or not self._connected(stream):
                return
            poller = select.poll()
            poller.register(stream, select.POLLIN)
            while True:
                poller.poll()
                data = stream.recv(CHUNK_BYTES)
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(self._wfd, view) :]
        except OSError:
            pass  # the host closed its end
        finally:
            with self._lock:
                self._gone = True
                self._stream = None
                if stream is not None:
                    stream.close()
            os.close(self._wfd)

    def _connected(self, stream: socket.socket) -> bool:
        """The stream is up: what was sent before goes first; False if that already failed."""
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.setblocking(False)
        with self._lock:
            if self._gone:
                return False
            self._stream = stream
            self._writable.register(stream, select.POLLOUT)
            early, self._early = self._early, []
            for data, deadline in early:
                if self._write(data, deadline) is not None:
                    return False
        return True

    def _write(self, data: bytes, deadline: float) -> OSError | None:
        """Under the lock, with the stream up."""
        assert self._stream is not None
        error = write_before(self._stream.fileno(), self._writable, data, deadline)
        if isinstance(error, TimeoutError):
            self.overdue = True
            self._kill_actor()
            return TimeoutError(f"worker {self._pid} stopped reading")
        return error

    def send(self, frames: list[msgspec.Struct], deadline: float) -> OSError | None:
        """Writes the frames to the stream (kept until the actor connects); a worker that has
        not taken them by ``deadline`` stopped reading: its actor is killed."""
        data = b"".join(protocol.encode(frame) for frame in frames)
        with self._lock:
            if self._gone or self._killed:
                return BrokenPipeError("the worker's actor is gone")
            if self._stream is None:
                self._early.append((data, deadline))
                return None
            return self._write(data, deadline)

    def booted(self) -> None:
        pass  # (its process runs in its actor, wherever Ray put it)

    def alive(self) -> bool:
        return not self._killed and not self._gone

    def crashed(self, message: str, *, timed_out: bool = False) -> WorkerCrashed:
        """The error for a worker that is gone: its exit status if its actor could say, else
        a SIGKILL (its actor is killed, if it was not gone already)."""
        self.signal_kill()
        self._watched.wait(CRASH_REPORT_S)
        code = self._status
        sig: int | None = None
        exit_code: int | None = None
        if code is None:
            sig, why = signal.SIGKILL, "its actor is gone"
        elif code < 0:
            sig, why = -code, f"signal {signal.Signals(-code).name}"
        else:
            exit_code, why = code, f"exit code {code}"
        if not timed_out:
            message = f"{message} ({why})"
        return WorkerCrashed(message, exit_code=exit_code, signal=sig, timed_out=timed_out)

    def signal_kill(self) -> None:
        """Kills the actor (its worker dies with it) and ends the stream, without waiting."""
        with self._lock:
            self._kill_actor()
        self._hang_up()

    def _kill_actor(self) -> None:
        if self._killed:
            return
        self._killed = True
        try:
            self._ray.kill(self._actor, no_restart=True)
        except self._ray.exceptions.RayError:
            pass  # (gone already)

    def kill(self) -> None:
        """Kills the actor and waits until its threads are done with it: a Ray reference its
        watch thread still held when the host then called `ray.shutdown()` would be freed after
        it, and Ray ends the whole process (status 1, from its core worker) when a thread
        touches it after shutdown: a test run died so, a `CodeMode` closed while an actor was
        still being made."""
        self.signal_kill()
        self._relay.join(10.0)
        self.watch_ended(WATCH_END_S)
        self.close_pipes()

    def watch_ended(self, timeout_s: float) -> None:
        """Waits (at most ``timeout_s``) until the watch thread has seen the actor gone."""
        self._watched.wait(timeout_s)

    def close_pipes(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.close(self.rfd)

    def shutdown(self, wait_s: float = 0.5) -> None:
        """Asks the worker to exit (EOF on its stdin), then kills the actor."""
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        self._relay.join(wait_s)
        self.kill()


class RayPlacement:
    """Workers as actors on a Ray cluster: the one at ``address`` (or ``RAY_ADDRESS``), or a local
    one started here if there is none and Ray is not initialized yet. ``actor_options`` go to
    each actor (``num_cpus``, ``resources``, ``runtime_env``...; by default one CPU each). An
    actor that is not up within ``spawn_timeout_s`` (the cluster has no room for it, its node
    lacks codemode) is killed, and the runs that waited for it fail. Each actor connects back to
    ``host`` (by default this node's address as Ray sees it) on a port opened for it alone: with
    Ray Client (``ray://``), or a host behind NAT, name one the nodes can reach."""

    def __init__(
        self,
        address: str | None = None,
        *,
        actor_options: dict[str, Any] | None = None,
        init_options: dict[str, Any] | None = None,
        spawn_timeout_s: float = 60.0,
        host: str | None = None,
    ) -> None:
        self.spawn_timeout_s = spawn_timeout_s
        try:
            import ray
        except ImportError as e:
            raise explained(e) from e
        if not ray.is_initialized():
            ray.init(address=address, **(init_options or {}))
        #: The address actors connect back to for their frames: this node's, as Ray sees it.
        self.host: str = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        # (Ray takes concurrency groups here only, not in `.options()`; its stubs omit them.)
        self._class = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(WorkerActor)  # type: ignore[call-overload]
        self._options = {"num_cpus": 1, **(actor_options or {})}
        #: Workers whose watch may still run (a watching thread keeps its worker alive).
        self._workers: weakref.WeakSet[RayWorker] = weakref.WeakSet()

    def start(self, memory_bytes: int) -> Worker:
        worker = RayWorker(self._class, memory_bytes, self._options, self.host)
        self._workers.add(worker)
        return worker

    def close(self) -> None:
        """The supervisor is done: every actor is killed, and this returns once no thread of
        ours still waits on Ray for one (the host may call `ray.shutdown()` next, see
        `RayWorker.kill`). The cluster is not ours to stop: the host may use it for other work."""
        for worker in list(self._workers):
            worker.signal_kill()
            worker.watch_ended(WATCH_END_S)
