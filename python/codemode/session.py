"""The public API: ``CodeMode`` (tools, config, the worker pool) and ``Session`` (exec).

``session.exec({"code": ...})`` returns exactly the spec's JSON result; ``session.run(code)``
returns the same thing as a typed struct; both have ``async`` twins. A guest failure is a
``failed`` result, never an exception.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import msgspec

from .config import CodeModeConfig, load_config
from .errors import ClosedError
from .protocol import Configure, EngineLimits
from .supervisor import RunOutcome, Supervisor
from .tools import BackgroundLoop, Dispatcher, Tool, ToolRegistry

__all__ = ["CodeMode", "Session", "Completed", "Failed", "Result", "Telemetry", "TextOutput", "JsonOutput"]

F = TypeVar("F", bound=Callable[..., Any])

MODEL_VISIBLE_TOOLS = ("exec", "wait")


class TextOutput(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class JsonOutput(msgspec.Struct, tag="json", tag_field="type"):
    value: Any


Output = TextOutput | JsonOutput


class Telemetry(msgspec.Struct, rename="camel"):
    duration_ms: float
    tool_calls: int
    memory_bytes: int
    catalog_size: int
    catalog_sources: dict[str, int]
    model_visible_tools: list[str]


class Completed(msgspec.Struct, tag="completed", tag_field="status", omit_defaults=True):
    value: Any
    telemetry: Telemetry
    output: list[Output] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class Failed(msgspec.Struct, tag="failed", tag_field="status", omit_defaults=True):
    error: str
    telemetry: Telemetry
    code: str | None = None
    output: list[Output] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


Result = Completed | Failed

_LOG_PREFIX = {2: "", 3: "", 4: "[warn] ", 5: "[error] "}
_decode_json = msgspec.json.decode


def _outputs(raw: list[tuple[int, str]]) -> list[Output]:
    out: list[Output] = []
    for kind, text in raw:
        if kind == 1:
            out.append(JsonOutput(_decode_json(text)))
        else:
            out.append(TextOutput(_LOG_PREFIX.get(kind, "") + text))
    return out


class CodeMode:
    """Owns the tool registry, the validated config and the worker pool. Close it when done."""

    def __init__(self, config: CodeModeConfig | dict[str, Any] | bool | None = None) -> None:
        self.config = load_config(config)
        self._registry = ToolRegistry()
        self._loop = BackgroundLoop()
        self._configure: Configure | None = None
        self._configure_lock = threading.Lock()
        self._closed = False
        size = self.config.workers or min(4, os.cpu_count() or 1)
        self._supervisor = Supervisor(size)

    # ---- tools ---------------------------------------------------------------------------------
    @overload
    def tool(self, fn: F, /) -> F: ...
    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        owner: str = "core",
        source: Literal["host", "client", "mcp"] = "host",
        read_only: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        owner: str = "core",
        source: Literal["host", "client", "mcp"] = "host",
        read_only: bool = False,
    ) -> F | Callable[[F], F]:
        """Registers a sync or async function as a catalog tool; usable as a decorator."""

        def register(f: F) -> F:
            self.add_tool(f, name=name, description=description, owner=owner, source=source, read_only=read_only)
            return f

        return register(fn) if fn is not None else register

    def add_tool(self, fn: Callable[..., Any], **options: Any) -> Tool:
        """Registers ``fn`` and returns its catalog ``Tool`` (id ``<source>:<owner>:<name>``)."""
        return self._registry.add(fn, **options)

    @property
    def tools(self) -> list[Tool]:
        return [t for t in (self._registry.get(i) for i in sorted(self._registry._tools)) if t is not None]

    def _configuration(self) -> Configure:
        version, catalog = self._registry.catalog_json()
        with self._configure_lock:
            current = self._configure
            if current is None or current.catalog_json is not catalog:
                c = self.config
                limits = EngineLimits(
                    c.memory_limit_bytes,
                    c.max_output_bytes,
                    c.max_pending_tool_calls,
                    c.search_default_limit,
                    c.max_search_limit,
                )
                current = self._configure = Configure(limits, catalog)
            return current

    # ---- sessions and lifetime -------------------------------------------------------------------
    def session(self, session_id: str = "default") -> Session:
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        return Session(self, session_id)

    def close(self) -> None:
        """Stops every worker and the background tool loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._supervisor.close()
        self._loop.close()

    def __enter__(self) -> CodeMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CodeMode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ---- running ---------------------------------------------------------------------------------
    def _telemetry(self, started: float, outcome: RunOutcome | None) -> Telemetry:
        return Telemetry(
            duration_ms=round((time.perf_counter() - started) * 1000.0, 3),
            tool_calls=outcome.tool_calls if outcome else 0,
            memory_bytes=outcome.memory_bytes if outcome else 0,
            catalog_size=len(self._registry),
            catalog_sources=self._registry.source_counts(),
            model_visible_tools=list(MODEL_VISIBLE_TOOLS),
        )

    def _invalid(self, started: float, message: str) -> Failed:
        return Failed(error=message, code="invalid_input", telemetry=self._telemetry(started, None))

    def _run(self, args: Any, loop: Callable[[], asyncio.AbstractEventLoop]) -> Result:
        started = time.perf_counter()
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        if not isinstance(args, dict):
            return self._invalid(started, "exec input must be an object with a `code` string.")
        code = args.get("code")
        command = args.get("command")
        if code is None:
            code = command
        elif command is not None and command != code:
            return self._invalid(started, "exec `code` and `command` must match when both are given.")
        if not isinstance(code, str) or not code.strip():
            return self._invalid(started, "exec requires a non-empty `code` string.")
        language = args.get("language", "javascript")
        if language not in ("javascript", "typescript"):
            return self._invalid(started, 'exec `language` must be "javascript" or "typescript".')
        if language not in self.config.languages:
            return self._invalid(started, f"code mode language {language} is disabled.")
        dispatcher = Dispatcher(self._registry, loop)
        try:
            outcome = self._supervisor.run(
                self._configuration(),
                code,
                language,
                self.config.timeout_ms,
                random.getrandbits(63),
                dispatcher,
            )
        finally:
            dispatcher.close()
        telemetry = self._telemetry(started, outcome)
        output = _outputs(outcome.outputs)
        if outcome.status == "completed":
            value = _decode_json(outcome.value) if outcome.value is not None else None
            return Completed(value=value, telemetry=telemetry, output=output)
        code_, name, message, _stack = outcome.failure or ("internal_error", "Error", "unknown failure", "")
        error = message if code_ is not None else (f"{name}: {message}" if message else name)
        return Failed(error=error, code=code_, telemetry=telemetry, output=output)


class Session:
    """One conversation's handle on a ``CodeMode``: ``exec`` cells, typed or as dicts."""

    def __init__(self, codemode: CodeMode, session_id: str) -> None:
        self.codemode = codemode
        self.session_id = session_id

    def exec(self, args: dict[str, Any]) -> dict[str, Any]:
        """Runs one cell; returns the spec's JSON result (``status``, ``value``/``error``...)."""
        return self.codemode._run(args, self.codemode._loop.get).to_dict()

    def run(self, code: str, *, language: Literal["javascript", "typescript"] = "javascript") -> Result:
        """Typed ``exec``: a ``Completed`` or ``Failed`` struct."""
        return self.codemode._run({"code": code, "language": language}, self.codemode._loop.get)

    async def exec_async(self, args: dict[str, Any]) -> dict[str, Any]:
        """``exec`` without blocking the event loop; async tools run on this loop."""
        return (await self._run_async(args)).to_dict()

    async def run_async(
        self, code: str, *, language: Literal["javascript", "typescript"] = "javascript"
    ) -> Result:
        return await self._run_async({"code": code, "language": language})

    async def _run_async(self, args: Any) -> Result:
        loop = asyncio.get_running_loop()
        return await asyncio.to_thread(self.codemode._run, args, lambda: loop)
