"""The event-loop thread ``McpServers`` runs its MCP I/O on, and the sync/async facade onto it.

The SDK is anyio-based, and a session's task groups must be entered and left by the same task,
so every session lives on one long-lived loop of our own, whichever thread or loop the host
calls from. A blocking call (``run``) waits on the thread's future; an ``a*`` twin (``arun``)
awaits it from the caller's loop; ``event_loop()`` lets a caller already on this loop skip both::

    caller thread ──run(fn, ...)──┐
    caller loop ───arun(fn, ...)──┼─run_coroutine_threadsafe─> codemode-mcp thread: HotLoop
                                  │   (under the lock)          └─ fn(...) and the tasks it starts
    close() ──────────────────────┘── on_close(), then the loop stops and the thread is joined

The thread starts on first use. The lock is the owner's (it guards the owner's own table too):
held while the thread starts, while work is submitted and while closing begins, never while
waiting on the loop. Work submitted before ``close()`` therefore reaches the loop before the
shutdown does, and nothing reaches it after; an owner holding the lock sees a lifecycle that
does not move (``check_open``, ``started``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .errors import ClosedError
from .hotloop import HotLoop

__all__ = ["LoopThread"]

P = ParamSpec("P")
T = TypeVar("T")


class LoopThread:
    """A private event-loop thread, started on first use; ``close`` runs ``on_close`` on it,
    then stops it.

    ``lock`` is the owner's: ``check_open`` and ``started`` are read holding it, and the
    methods here that start, submit or close take it themselves.
    """

    def __init__(self, lock: threading.Lock, on_close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._lock = lock
        self._on_close = on_close
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Owned by the loop thread.
        self._loop_done: asyncio.Event | None = None

    def check_open(self) -> None:
        """Raises ``ClosedError`` once ``close()`` has begun; the caller holds the lock."""
        if self._closed:
            raise ClosedError("McpServers was used after close()")

    @property
    def started(self) -> bool:
        """Whether the thread was started (so work may be on it); the caller holds the lock."""
        return self._loop is not None

    def run(self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(...)`` on the loop, waited for here; never on the loop thread itself."""
        if self.on_loop_thread():
            raise RuntimeError("McpServers' blocking methods cannot run on its own loop thread; use the a* twins")
        return self._submit(fn, *args, **kwargs).result()

    async def arun(self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(...)`` on the loop, awaited from the caller's own loop."""
        return await asyncio.wrap_future(self._submit(fn, *args, **kwargs))

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop (started on first use)."""
        loop = self._loop
        if loop is None:
            self._submit(asyncio.sleep, 0).result()
            loop = self._loop
            assert loop is not None
        return loop

    def on_loop_thread(self) -> bool:
        """True on the loop's own thread: blocking there on its work never finishes."""
        return self._thread is not None and threading.current_thread() is self._thread

    def close(self) -> None:
        """Runs ``on_close`` on the loop, then stops the loop and joins the thread; later
        submissions raise ``ClosedError``. A no-op the second time."""
        shutdown = self._begin_close()
        if shutdown is not None:
            shutdown.result()
            self._join()

    async def aclose(self) -> None:
        shutdown = self._begin_close()
        if shutdown is not None:
            await asyncio.wrap_future(shutdown)
            await asyncio.to_thread(self._join)

    def _submit(
        self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        """Starts the loop thread on first use and submits ``fn(...)`` to it.

        Under the lock, so that work submitted before ``close()`` reaches the loop before its
        shutdown does, and nothing reaches it after.
        """
        with self._lock:
            self.check_open()
            if self._loop is None:
                started = threading.Event()
                thread = threading.Thread(target=self._serve, args=(started,), name="codemode-mcp", daemon=True)
                thread.start()
                started.wait()
                self._thread = thread
            assert self._loop is not None
            return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop)

    def _serve(self, started: threading.Event) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._loop_done = asyncio.Event()
            started.set()
            await self._loop_done.wait()

        # A HotLoop: a loop reader answers workers from it (see `hotloop`). Like asyncio.run (whose
        # loop_factory, asyncio.Runner, is 3.11+), cancel whatever is left, then close it.
        loop = HotLoop()
        try:
            loop.run_until_complete(main())
        finally:
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def _begin_close(self) -> concurrent.futures.Future[None] | None:
        """Marks the thread closed and submits the shutdown; None if there is nothing to stop."""
        if self.on_loop_thread():
            raise RuntimeError("McpServers cannot be closed from its own loop thread")
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            if self._loop is None:
                return None
            return asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)

    def _join(self) -> None:
        assert self._thread is not None
        self._thread.join()

    async def _shutdown(self) -> None:
        await self._on_close()
        assert self._loop_done is not None
        self._loop_done.set()
