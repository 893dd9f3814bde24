"""Host tools: defining them from Python functions, and running the calls a cell makes.

Tools always run in the host process, never in a worker. A sync function runs inline on the
thread driving the run (no hop; it must not block for long). An ``async def`` tool runs on an
event loop: the caller's own loop for ``exec_async``, or a private background loop for
``exec``. Results cross to the guest as JSON; an exception becomes a plain guest ``Error``
carrying only its message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from .errors import ToolDefinitionError

__all__ = ["BackgroundLoop", "Dispatcher", "Tool", "ToolRegistry"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_OWNER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_encode = msgspec.json.encode
_decode = msgspec.json.decode


class Tool(msgspec.Struct, frozen=True):
    """One catalog tool backed by a Python callable."""

    id: str
    name: str
    description: str
    fn: Callable[..., Any]
    is_async: bool
    source: str = "host"
    owner: str = "core"
    read_only: bool = False

    def entry(self) -> dict[str, Any]:
        """The compact catalog entry the guest sees in ``ALL_TOOLS``."""
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "sourceName": self.owner,
            "input": "unknown",
        }


class ToolRegistry:
    """The host's tools, keyed by catalog id; the catalog JSON is cached per version."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()
        self.version = 0
        self._catalog: tuple[int, str] | None = None
        self._counts: tuple[int, dict[str, int]] | None = None

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        owner: str = "core",
        source: str = "host",
        read_only: bool = False,
    ) -> Tool:
        if not callable(fn):
            raise ToolDefinitionError(f"a tool must be callable, not {type(fn).__name__}")
        name = name or str(getattr(fn, "__name__", ""))
        if not _NAME.match(name):
            raise ToolDefinitionError(f"invalid tool name {name!r}")
        if not _OWNER.match(owner):
            raise ToolDefinitionError(f"invalid tool owner {owner!r}")
        if source not in ("host", "client", "mcp"):
            raise ToolDefinitionError(f"invalid tool source {source!r}")
        if name in ("exec", "wait") and source == "host" and owner == "core":
            raise ToolDefinitionError(f"{name!r} is a code mode control tool name")
        doc = description if description is not None else inspect.getdoc(fn) or ""
        tool = Tool(
            id=f"{source}:{owner}:{name}",
            name=name,
            description=doc.strip(),
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn),
            source=source,
            owner=owner,
            read_only=read_only,
        )
        with self._lock:
            if tool.id in self._tools:
                raise ToolDefinitionError(f"a tool with id {tool.id!r} is already registered")
            self._tools[tool.id] = tool
            self.version += 1
        return tool

    def get(self, tool_id: str) -> Tool | None:
        return self._tools.get(tool_id)

    def __len__(self) -> int:
        return len(self._tools)

    def source_counts(self) -> dict[str, int]:
        """Tools per source; counted once per registry version (telemetry reads it per exec)."""
        cached = self._counts
        if cached is not None and cached[0] == self.version:
            return cached[1]
        counts = {"host": 0, "mcp": 0, "client": 0}
        for tool in list(self._tools.values()):
            counts[tool.source] += 1
        self._counts = (self.version, counts)
        return counts

    def catalog_json(self) -> tuple[int, str]:
        """``(version, JSON array of entries)``, sorted by id so equal sets give equal bytes."""
        with self._lock:
            cached = self._catalog
            if cached is not None and cached[0] == self.version:
                return cached
            entries = [self._tools[k].entry() for k in sorted(self._tools)]
            self._catalog = (self.version, _encode(entries).decode())
            return self._catalog


class BackgroundLoop:
    """A private event loop thread for ``async`` tools called from synchronous ``exec``."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="codemode-tools", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


def _error_message(tool_id: str, exc: BaseException) -> str:
    text = str(exc)
    kind = type(exc).__name__
    return f"tool {tool_id} failed: {kind}: {text}" if text else f"tool {tool_id} failed: {kind}"


def _invoke_sync(tool: Tool, args: Any) -> Any:
    return tool.fn(**args) if isinstance(args, dict) else tool.fn(args)


class Dispatcher:
    """Runs one run's tool calls and hands back ``(call_id, ok, payload)`` results.

    Completed async calls land in a list and write a byte to ``wake_fd``, so the run driver can
    wait on the worker pipe and the tools with one ``poll``.
    """

    def __init__(
        self, registry: ToolRegistry, loop: Callable[[], asyncio.AbstractEventLoop], *, read_only: bool = False
    ) -> None:
        self._registry = registry
        self._loop = loop
        #: Restart-safe runs may only call read-only tools (they may be redone after a restart).
        self._read_only = read_only
        self._ready: list[tuple[int, bool, str]] = []
        self._lock = threading.Lock()
        self._futures: dict[int, concurrent.futures.Future[Any]] = {}
        self._pipe: tuple[int, int] | None = None

    @property
    def wake_fd(self) -> int:
        if self._pipe is None:
            self._pipe = os.pipe()
            os.set_blocking(self._pipe[0], False)
            os.set_blocking(self._pipe[1], False)
        return self._pipe[0]

    def submit(self, calls: list[tuple[int, str, str]]) -> None:
        for call_id, tool_id, input_json in calls:
            tool = self._registry.get(tool_id)
            if tool is None:
                self._ready.append((call_id, False, f"unknown tool: {tool_id}"))
                continue
            if self._read_only and not tool.read_only:
                message = f"tool {tool_id} is not read-only: a restartSafe run may only call read-only tools"
                self._ready.append((call_id, False, message))
                continue
            try:
                args = _decode(input_json)
            except msgspec.DecodeError:
                self._ready.append((call_id, False, f"tool {tool_id}: input is not valid JSON"))
                continue
            if tool.is_async:
                self._start_async(call_id, tool, args)
                continue
            try:
                result = _invoke_sync(tool, args)
            except Exception as e:
                self._ready.append((call_id, False, _error_message(tool_id, e)))
                continue
            self._ready.append(self._encode_result(call_id, tool_id, result))

    def _encode_result(self, call_id: int, tool_id: str, result: Any) -> tuple[int, bool, str]:
        try:
            return (call_id, True, _encode(result).decode())
        except (TypeError, ValueError, msgspec.EncodeError) as e:
            return (call_id, False, f"tool {tool_id} returned a value that is not JSON: {e}")

    def _start_async(self, call_id: int, tool: Tool, args: Any) -> None:
        async def call() -> Any:
            return await (tool.fn(**args) if isinstance(args, dict) else tool.fn(args))

        _ = self.wake_fd  # created here, on the driving thread, before any callback can need it
        future = asyncio.run_coroutine_threadsafe(call(), self._loop())
        with self._lock:
            self._futures[call_id] = future
        future.add_done_callback(lambda f: self._finished(call_id, tool.id, f))

    def _finished(self, call_id: int, tool_id: str, future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        result = (
            (call_id, False, _error_message(tool_id, exc))
            if exc
            else self._encode_result(call_id, tool_id, future.result())
        )
        with self._lock:
            if self._futures.pop(call_id, None) is None:
                return
            self._ready.append(result)
            # Under the lock: `close` cannot close the pipe (and free its fd number) meanwhile.
            if self._pipe is not None:
                try:
                    os.write(self._pipe[1], b"\0")
                except BlockingIOError:
                    pass  # full of wake-ups already

    def take_ready(self) -> list[tuple[int, bool, str]]:
        with self._lock:
            ready, self._ready = self._ready, []
        if ready and self._pipe is not None:
            try:
                while os.read(self._pipe[0], 4096):
                    pass
            except BlockingIOError:
                pass
        return ready

    def pending(self) -> int:
        with self._lock:
            return len(self._futures)

    def cancel(self) -> None:
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.cancel()

    def close(self) -> None:
        self.cancel()
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            for fd in pipe:
                os.close(fd)
