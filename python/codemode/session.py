"""The public API: ``CodeMode`` (tools, config, the worker pool) and ``Session`` (exec).

``session.exec({"code": ...})`` returns exactly the spec's JSON result; ``session.run(code)``
returns the same thing as a typed struct; both have ``async`` twins. A guest failure is a
``failed`` result, never an exception.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import msgspec

from . import _engine, catalog, semantic, tracing
from .approvals import ApprovalRequest, Approvals, call_number
from .cells import CellArgs, answer_json, check_cell, check_seed, journal_problem
from .config import BOUNDS, CodeModeConfig, load_config
from .errors import (
    ApprovalError,
    ClosedError,
    CodemodeError,
    StoreError,
    StoreLimitError,
)
from .mcp_listing import McpListing
from .model_surface import MODEL_VISIBLE_TOOLS, ModelSurface
from .namespaces import NamespaceRegistration, Namespaces
from .outcomes import (
    Completed,
    Failed,
    JsonOutput,
    Output,
    Result,
    Telemetry,
    TextOutput,
    Waiting,
    as_json,
    cut_to_budget,
    failure_text,
    outputs_of,
)
from .outputs import OutputStore
from .policy import Approver, Hook, Policy, ToolCallEvent, Trace, TraceEvent
from .protocol import Configure, EngineLimits
from .results import ExecResult
from .runs import (
    FOREIGN,
    UNAVAILABLE,
    Journal,
    Run,
    RunLookupError,
    RunTable,
    Scope,
    Step,
    fixed_clock_start,
    new_run_id,
)
from .store import Store, open_store
from .supervisor import Supervisor
from .surfaces import (
    ModelTool,
    Surface,
)
from .tools import (
    BackgroundLoop,
    Blocked,
    CatalogView,
    Dispatcher,
    Gate,
    Tool,
    ToolRegistry,
    apply_hook,
    define_tool,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from .batch import Cell, CellResult

__all__ = ["CodeMode", "Completed", "Failed", "JsonOutput", "Result", "Session", "Telemetry", "TextOutput", "Waiting"]

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger(__name__)

#: Characters of the reason a host gives when it rejects a call (it reaches the guest).
MAX_REASON_CHARS = 1000
#: The lower bound of a `tool_search_code` cell's timeout (seed 001).
TOOL_SEARCH_CODE_MIN_TIMEOUT_MS = 1000


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class CodeMode:
    """Owns the tool registry, the policy, the validated config and the worker pool.

    ``allow``/``deny`` are ``fnmatch`` patterns over tool names and ids (deny wins): denied tools
    never enter a run's catalog. ``before_tool_call(event)`` may return ``Block(reason)`` or
    ``Rewrite(input)``; ``approve(event)`` may refuse a call, or answer ``Defer()`` to decide
    later (``Session.approve``; the run suspends meanwhile). Both may be ``async``. Calls matching
    ``require_approval`` patterns (or of a tool defined with ``requires_approval=True``) wait for
    an approval: the callback's, or with none, the host's ``Session.approve``. Close the
    ``CodeMode`` when done (``with``/``async with``).

    With ``opentelemetry-api`` installed, each ``exec``/``wait`` is a span and each of its tool
    calls a child span (`codemode.tracing`), from ``tracer_provider`` or the global provider.
    """

    def __init__(
        self,
        config: CodeModeConfig | dict[str, Any] | bool | None = None,
        *,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] = (),
        before_tool_call: Hook | None = None,
        approve: Approver | None = None,
        require_approval: Iterable[str] = (),
        store: Store | str | os.PathLike[str] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = load_config(config)
        self._registry = ToolRegistry()
        self._mcp = McpListing(self._registry)
        # Before anything starts (worker processes, threads): a malformed entry then fails this
        # constructor with nothing left running.
        for name, server in self.config.mcp_servers.items():
            self.add_mcp_server(name, server)
        #: Where `store`/`load` values live: SQLite (a path; in memory by default) or PostgreSQL (a DSN).
        self._store: Store = open_store(store) if store is None or isinstance(store, (str, os.PathLike)) else store
        #: A private in-memory store has no other writer: its snapshots are served from here
        #: (a query per exec costs ~15 µs); a shared file or server is always asked.
        self._store_cache: dict[tuple[str, str], dict[str, str]] | None = {} if store is None else None
        self._namespaces = Namespaces()
        self._policy = Policy.of(allow, deny, require_approval)
        self._trace = Trace()
        self._gate = Gate(before_tool_call, approve, self._trace)
        self._tracer = tracing.tracer(tracer_provider)
        self._loop = BackgroundLoop()
        self._configure: Configure | None = None
        self._configure_lock = threading.Lock()
        self._closed = False
        self._call_ids = itertools.count(1)
        size = self.config.workers or min(4, os.cpu_count() or 1)
        self._supervisor = Supervisor(
            size,
            max_runs_per_worker=self.config.max_runs_per_worker,
            max_worker_memory=self.config.max_worker_memory_bytes,
            max_snapshot_bytes=self.config.max_snapshot_bytes,
            max_journal_bytes=self.config.max_journal_bytes,
        )
        self._runs = RunTable(self.config.snapshot_ttl_seconds, per_session=self.config.max_suspended_runs_per_session)
        #: Every run not yet retired, by id: a host's approval may come while its run still
        #: executes, before it is filed as suspended.
        self._live: dict[str, Run] = {}
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()
        #: Full texts of cut outputs, per session, in memory only (`codemode.outputs`).
        self._output_store = OutputStore(
            self.config.output_store_bytes, self.config.output_store_total_bytes, self.config.output_store_ttl_seconds
        )

        #: What the model is given, and the host side of the structured surfaces' calls
        #: (`codemode.model_surface`); sessions answer those calls through it.
        self.model_surface = ModelSurface(
            self.config,
            self._registry,
            self.catalog,
            self._namespaces,
            self._loop,
            self._gate,
            self._mcp,
            self._call_ids,
        )
    # ---- MCP -----------------------------------------------------------------------------------
    def add_mcp_server(self, name: str, config: Mapping[str, Any]) -> None:
        """Adds an MCP server (``{"command", "args", "env"}`` or ``{"url", "headers"}``, as MCP
        clients write them; see ``codemode.mcp.parse_server_config``); its tools join the catalog
        on the next exec (or ``load_mcp_tools()``), unless the entry says ``"disabled": true``.
        Without the ``mcp`` extra, an ``ImportError`` that says to install it."""
        self._mcp.add_server(name, config)

    def load_mcp_tools(self) -> dict[str, str | None]:
        """Lists the MCP servers not listed yet (and those that failed over ``MCP_RETRY_S`` ago),
        all at once, registers their tools and waits for them. Returns, per server, None or why
        its tools are absent: it cannot be used (other servers still work), or its config
        disables it (it is not started). Not on the MCP loop's thread (an async hook of an MCP
        call runs there): it would wait for work queued behind itself."""
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        return self._mcp.load_all()

    # ---- tools ---------------------------------------------------------------------------------
    @overload
    def tool(self, fn: F, /) -> F: ...
    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        owner: str = "core",
        source: Literal["host", "client", "mcp"] = "host",
        label: str | None = None,
        read_only: bool = False,
        requires_approval: bool = False,
        direct_only: bool = False,
        input_schema: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(self, fn: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
        """Registers a sync or async function as a catalog tool; usable as a decorator.

        Input and output JSON Schemas come from the type hints (``Annotated[T, msgspec.Meta(
        description=...)]`` for descriptions) unless given; a host tool's output schema is its
        contract: a result that breaks it fails the call before the guest sees it.
        """

        def register(f: F) -> F:
            self.add_tool(f, **options)
            return f

        return register(fn) if fn is not None else register

    def add_tool(self, fn: Callable[..., Any], **options: Any) -> Tool:
        """Registers ``fn`` and returns its ``Tool`` (id ``<source>:<owner>:<name>``)."""
        return self._registry.add(define_tool(fn, **options))

    def remove_tool(self, tool_id: str) -> bool:
        return self._registry.remove(tool_id)

    @property
    def tools(self) -> list[Tool]:
        """Every registered tool, including direct-only and denied ones, in id order."""
        return self._registry.all()

    def register_namespace(self, plugin_id: str, registration: NamespaceRegistration) -> None:
        """Registers a plugin-owned namespace; it is visible to runs whose catalog holds all its
        required tools owned by ``plugin_id``. Raw functions, cycles and unsafe keys are refused."""
        self._namespaces.register(plugin_id, registration)

    def clear_namespaces(self, plugin_id: str) -> int:
        """Removes the namespaces of a plugin that was disabled, unloaded or rolled back."""
        return self._namespaces.clear(plugin_id)

    def set_policy(
        self, *, allow: Iterable[str] | None = None, deny: Iterable[str] = (), require_approval: Iterable[str] = ()
    ) -> None:
        """Replaces the allow/deny patterns for runs started from now on."""
        self._policy = Policy.of(allow, deny, require_approval)

    def catalog(self) -> CatalogView:
        """The catalog a run would get now (policy applied, direct-only tools left out)."""
        return self._registry.view(self._policy)

    def model_visible_tools(self) -> list[str]:
        """``exec``, ``wait`` and the direct-only tools the policy allows."""
        return [*MODEL_VISIBLE_TOOLS, *self.catalog().direct]

    def exec_description(self, *, max_index_chars: int = 4000) -> str:
        """The model-facing ``exec`` description: how to use the guest API, then a bounded quick
        index of exact ids with compact input/output hints (never descriptions: catalog text is
        untrusted and stays lazy)."""
        return self.model_surface.exec_description(max_index_chars=max_index_chars)

    # ---- model-facing surfaces ---------------------------------------------------------------------
    def model_tools(
        self, surface: Surface = "code", *, disable_tools: bool = False, likely: str | None = None
    ) -> list[ModelTool]:
        """The tool definitions to hand the model for ``surface`` (see ``codemode.surfaces``).

        A disabled config keeps the direct surface untouched; a run with tools disabled gets no
        tools; a run whose catalog is empty never engages code mode or tool search. For the
        ``directory`` surface, ``likely`` (e.g. the user's message) picks a few catalog tools
        whose full schemas are exposed directly, as the tool-search spec describes.
        """
        return self.model_surface.model_tools(surface, disable_tools=disable_tools, likely=likely)

    def payload_telemetry(self) -> dict[str, int]:
        """Serialized bytes of the tool definitions each surface sends the model."""
        return self.model_surface.payload_telemetry()

    def call_tool(self, session: Session, tool_id: str, args: Any) -> dict[str, Any]:
        """Calls one catalog (or direct-only) tool from the host, through the same gate as a
        nested call; returns ``{tool, result}`` or ``{tool, error}``."""
        return self.model_surface.call_tool(session.session_id, tool_id, args)

    def trace(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Exported trace events: code-mode calls and the nested tool calls under them."""
        return self._trace.export(session_id)

    def kept_output_bytes(self, session_id: str | None = None) -> int:
        """Host memory the full texts of cut outputs take now (``readOutput``; see
        ``codemode.outputs``), for one session or for all."""
        return self._output_store.used(session_id)

    def _configuration(self) -> tuple[Configure, CatalogView]:
        view = self._registry.view(self._policy)
        with self._configure_lock:
            current = self._configure
            if current is None or current.fingerprint != view.fingerprint:
                c = self.config
                limits = EngineLimits(
                    c.memory_limit_bytes,
                    c.max_output_bytes,
                    c.max_pending_tool_calls,
                    c.search_default_limit,
                    c.max_search_limit,
                )
                pack = semantic.worker_pack(view.counts)
                current = self._configure = Configure(limits, view.catalog_json, view.fingerprint, pack)
            return current, view

    # ---- sessions and lifetime -------------------------------------------------------------------
    def session(self, session_id: str = "default", *, agent_run: str | None = None, branch: str = "main") -> Session:
        """A session handle; suspended runs are scoped to ``(session_id, agent_run)``, stored
        values to ``(session_id, branch)``."""
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        return Session(self, session_id, agent_run, branch)

    def run_many(
        self, cells: Iterable[Cell | Mapping[str, Any]], *, concurrency: int = 8, seed: int | None = None
    ) -> AsyncGenerator[CellResult, None]:
        """Runs a batch of cells, at most ``concurrency`` at once, carrying each through its
        ``wait``s: an async iterator of final results in completion order (``codemode.batch``).
        ``seed`` makes each cell's ``Math.random`` and clock the same in every run with it."""
        from .batch import run_many

        return run_many(self, cells, concurrency=concurrency, seed=seed)

    def close(self) -> None:
        """Stops every worker and the background tool loop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._sweep_stop.set()
        self._mcp.close()
        for run in self._runs.drain():
            run.dispatcher.close()
        self._live.clear()
        self._supervisor.close()
        self._loop.close()
        self._store.close()
        self._output_store.clear()

    def __enter__(self) -> CodeMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CodeMode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ---- running ---------------------------------------------------------------------------------
    def _telemetry(self, started: float, step: Step | None, run: Run | None = None) -> Telemetry:
        view = run.dispatcher.view if run is not None else self.catalog()
        counts = [0, 0, 0]
        if run is not None and step is not None:
            counts = run.counts
            counts[0] += step.tool_calls
            counts[1] += step.searches
            counts[2] += step.describes
        return Telemetry(
            duration_ms=(time.perf_counter() - started) * 1000.0,
            tool_calls=counts[0],
            searches=counts[1],
            describes=counts[2],
            memory_bytes=step.memory_bytes if step else 0,
            catalog_size=len(view.tools),
            catalog_sources=dict(view.counts),
            model_visible_tools=[*MODEL_VISIBLE_TOOLS, *view.direct],
        )

    def _invalid(self, started: float, message: str) -> Failed:
        return Failed(error=message, code="invalid_input", telemetry=self._telemetry(started, None))

    def _check_args(self, started: float, args: Any) -> CellArgs | Failed:
        checked = check_cell(args, self.config.languages)
        return self._invalid(started, checked) if isinstance(checked, str) else checked

    @tracing.traced("exec")
    def _exec(
        self,
        session: Session,
        args: Any,
        loop: Callable[[], asyncio.AbstractEventLoop],
        *,
        min_timeout_ms: int = 0,
        outer_hook: bool = False,
    ) -> Result:
        started = time.perf_counter()
        checked = self._admit(started, args)
        if isinstance(checked, Failed):
            return checked
        if outer_hook and self._gate.hook is not None:
            # The model's `exec` call itself, as the spec's hook event for it (it may block or
            # rewrite the cell, e.g. through the `command` alias).
            decision = self._gate.hook(self._exec_event(session, args, checked.language))
            if inspect.isawaitable(decision):
                decision = asyncio.run_coroutine_threadsafe(_awaited(decision), loop()).result()
            checked = self._hooked(started, args, decision, checked)
            if isinstance(checked, Failed):
                return checked
        if self._mcp.servers is not None:
            self._mcp.refresh()
        run, configure = self._new_run(session, checked, loop, min_timeout_ms)
        return self._driven(run, started, "exec", lambda: self._supervisor.start(run, configure, run.timeout_ms))

    @tracing.traced("exec")
    async def _exec_async(
        self,
        session: Session,
        args: Any,
        *,
        min_timeout_ms: int = 0,
        outer_hook: bool = False,
        seed: int | None = None,
    ) -> Result:
        """`_exec` as a coroutine on the caller's loop (its async tools, and an async hook, run
        there too)."""
        check_seed(seed)
        started = time.perf_counter()
        checked = self._admit(started, args)
        if isinstance(checked, Failed):
            return checked
        if outer_hook and self._gate.hook is not None:
            decision = self._gate.hook(self._exec_event(session, args, checked.language))
            if inspect.isawaitable(decision):
                decision = await decision
            checked = self._hooked(started, args, decision, checked)
            if isinstance(checked, Failed):
                return checked
        if self._mcp.servers is not None:
            await self._mcp.refresh_async()
        loop = asyncio.get_running_loop()
        run, configure = self._new_run(session, checked, lambda: loop, min_timeout_ms, seed)
        return await self._driven_async(
            run, started, "exec", self._supervisor.start_async(run, configure, run.timeout_ms)
        )

    def _driven(self, run: Run, started: float, kind: str, drive: Callable[[], Step]) -> Result:
        """``run``'s step (``drive``) as the spec's result. Whatever goes wrong in the host meanwhile,
        the run ends in a defined state: a failure is `_broken`; an interrupt retires it, then
        goes on up (nothing of the run is left running, its slot is free)."""
        try:
            return self._finish(run, drive(), started, kind)
        except Exception as e:
            return self._broken(run, started, e)
        except BaseException:
            self._retire(run)
            raise

    async def _driven_async(self, run: Run, started: float, kind: str, drive: Awaitable[Step]) -> Result:
        """`_driven` for a coroutine's step (a cancel retires the run)."""
        try:
            return self._finish(run, await drive, started, kind)
        except Exception as e:
            return self._broken(run, started, e)
        except BaseException:
            self._retire(run)
            raise

    def _broken(self, run: Run, started: float, error: Exception) -> Failed:
        """Something in the host failed while it drove ``run`` (a bug, or a hostile value that
        got past every check): the run ends and frees its slot, and the caller gets a failed
        result, never the exception."""
        _log.exception("code mode: run %s failed in the host", run.run_id)
        self._retire(run)
        message = f"code mode failed in the host: {type(error).__name__}"
        return Failed(error=message, code="internal_error", telemetry=self._telemetry(started, None))

    def _admit(self, started: float, args: Any) -> CellArgs | Failed:
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        self._sweep()
        return self._check_args(started, args)

    def _exec_event(self, session: Session, args: Any, language: str) -> ToolCallEvent:
        return ToolCallEvent(
            tool_id="exec",
            name="exec",
            source="codemode",
            owner="codemode",
            input=args,
            session_id=session.session_id,
            parent="",
            tool_kind="code_mode_exec",
            tool_input_kind=language,
        )

    def _hooked(self, started: float, args: Any, decision: Any, checked: CellArgs) -> CellArgs | Failed:
        try:
            rewritten = apply_hook(decision, args)
        except Blocked as e:
            return self._invalid(started, f"code mode exec blocked: {e.reason}")
        return checked if rewritten is args else self._check_args(started, rewritten)

    def _new_run(
        self,
        session: Session,
        checked: CellArgs,
        loop: Callable[[], asyncio.AbstractEventLoop],
        min_timeout_ms: int,
        seed: int | None = None,
    ) -> tuple[Run, Configure]:
        code, language, restart_safe, options = checked
        session_id, scope = session.session_id, session.scope
        # A pragma may only lower what the operator's config allows, never raise it.
        timeout_ms = self.config.timeout_ms
        low, high = BOUNDS["timeout_ms"]
        if options.timeout_ms is not None:
            timeout_ms = min(max(options.timeout_ms, low), timeout_ms)
        timeout_ms = min(max(timeout_ms, min_timeout_ms), high)
        configure, view = self._configuration()
        run_id = new_run_id()
        namespaces, namespace_calls = self._namespaces.build(
            view.tools, session_id=session_id, agent_run=session.agent_run, run_id=run_id
        )
        run_setup: dict[str, Any] = {}
        if namespaces:
            run_setup["namespaces"] = namespaces
        stored = self._snapshot(session_id, session.branch)
        if stored:
            run_setup["store"] = stored
        journal = Journal(
            engine_version=_engine.__version__,
            prelude_hash=_engine.PRELUDE_HASH,
            catalog_fingerprint=configure.fingerprint,
            limits=configure.limits,
            language=language,
            source=code,
            seed=random.getrandbits(63) if seed is None else seed,
            run_json=msgspec.json.encode(run_setup).decode() if run_setup else "{}",
            clock_start=None if seed is None else fixed_clock_start(seed),
            restart_safe=restart_safe,
            session_id=session_id,
            agent_run=session.agent_run,
        )
        dispatcher = Dispatcher(
            view,
            loop,
            outputs=self._output_store,
            session_id=session_id,
            gate=self._gate,
            read_only=restart_safe,
            namespace_calls=namespace_calls,
            mcp_ops=self._mcp.op if self._mcp.servers is not None else None,
            approvals=Approvals(journal.approvals),
            run_id=run_id,
            agent_run=session.agent_run,
        )
        run = Run(scope, journal, dispatcher, run_id)
        self._live[run_id] = run
        run.store_key = (session_id, session.branch)
        dispatcher.parent = f"exec_{next(self._call_ids)}"
        dispatcher.span = tracing.run_span(run_id)
        if options.max_output_tokens is not None:
            run.output_chars = min(options.max_output_tokens * 4, self.config.max_output_bytes)
        run.timeout_ms = timeout_ms
        return run, configure

    @tracing.traced("wait")
    def _wait(self, session: Session, args: Any) -> Result:
        started = time.perf_counter()
        claimed = self._claim(session, args, started)
        if isinstance(claimed, Failed):
            return claimed
        run, configure, answer = claimed
        return self._driven(
            run, started, "wait", lambda: self._supervisor.resume(run, configure, run.timeout_ms, answer)
        )

    @tracing.traced("wait")
    async def _wait_async(self, session: Session, args: Any) -> Result:
        started = time.perf_counter()
        claimed = self._claim(session, args, started)
        if isinstance(claimed, Failed):
            return claimed
        run, configure, answer = claimed
        return await self._driven_async(
            run, started, "wait", self._supervisor.resume_async(run, configure, run.timeout_ms, answer)
        )

    def _claim(self, session: Session, args: Any, started: float) -> tuple[Run, Configure, str] | Failed:
        """The run a `wait` resumes (marked resuming), the configuration a replay needs, and
        the JSON its yields are answered with."""
        if self._closed:
            raise ClosedError("this CodeMode is closed")
        # (No `_sweep` here: the sweeper expires runs, and `claim` refuses an expired one.)
        run_id = args.get("runId") if isinstance(args, dict) else None
        if not isinstance(run_id, str) or not run_id:
            return self._invalid(started, "wait requires a `runId` string.")
        try:
            answer = answer_json(args.get("answer"))
        except ValueError as e:
            return self._invalid(started, str(e))
        try:
            run = self._runs.claim(run_id, session.scope)
        except RunLookupError as e:
            return self._invalid(started, str(e))
        try:
            run.dispatcher.parent = f"wait_{next(self._call_ids)}"
            run.dispatcher.span = tracing.run_span(run_id)
            configure, view = self._configuration()
            if view.fingerprint != run.journal.catalog_fingerprint:
                # A replay must see the catalog the run started with; the journal records which.
                configure = self._configure_for(run)
        except Exception as e:
            return self._broken(run, started, e)
        return run, configure, answer

    def _snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        cache = self._store_cache
        if cache is None:
            return self._store.snapshot(session_id, branch)
        return cache.get((session_id, branch), {})

    def _configure_for(self, run: Run) -> Configure:
        view = run.dispatcher.view
        return Configure(run.journal.limits, view.catalog_json, view.fingerprint, semantic.worker_pack(view.counts))

    def _finish(self, run: Run, step: Step, started: float, kind: str) -> Result:
        """Files a suspended run or retires a finished one; builds the spec's result."""
        telemetry = self._telemetry(started, step, run)
        result = self._result(run, step, telemetry)
        self._trace.add(
            TraceEvent(
                kind=kind,
                id=run.dispatcher.parent,
                session_id=run.dispatcher.session_id,
                at=Trace.now(),
                duration_ms=telemetry.duration_ms,
                status="waiting" if isinstance(result, Waiting) else result.__struct_config__.tag,  # type: ignore[arg-type]
                run_id=run.run_id,
            )
        )
        return result

    def _shown(self, run: Run, step: Step) -> tuple[list[Output], Any]:
        """The outputs and value a result shows: with a text budget, cut to it (`outcomes.cut_to_budget`), the
        full texts of the cuts kept for the run's session."""
        output = outputs_of(step.outputs)
        if run.output_chars is None:
            return output, step.value
        value = step.value if step.status == "completed" else None
        return cut_to_budget(output, value, run.output_chars, functools.partial(self._output_store.keep, run.scope[0]))

    def _result(self, run: Run, step: Step, telemetry: Telemetry) -> Result:
        output, value = self._shown(run, step)
        if step.status == "suspended":
            overrun = run.snapshot_overrun(self.config.max_snapshot_bytes)
            if overrun is not None:
                self._retire(run)
                return Failed(error=overrun, code="snapshot_limit_exceeded", telemetry=telemetry, output=output)
            refused = self._runs.suspend(run)
            if refused is not None:
                self._retire(run)
                return Failed(error=refused, code="invalid_input", telemetry=telemetry, output=output)
            self._start_sweeper()
            waiting = Waiting(
                run_id=run.run_id,
                reason=step.reason,
                telemetry=telemetry,
                pending_tool_calls=run.pending_calls(),
                output=output,
                replay_safe=run.journal.restart_safe,
            )
            return waiting
        self._retire(run)
        if step.status == "completed":
            if step.store_writes is not None and run.store_key is not None:
                try:
                    self._store.commit(*run.store_key, step.store_writes)
                except StoreLimitError as e:  # the cell's own doing: it stored too much
                    return Failed(error=f"store commit refused: {e}", code="invalid_input", telemetry=telemetry)
                except StoreError as e:
                    return Failed(error=f"store commit failed: {e}", code="internal_error", telemetry=telemetry)
                if self._store_cache is not None:
                    self._store_cache[run.store_key] = self._store.snapshot(*run.store_key)
            return Completed(value=value, telemetry=telemetry, output=output)
        error, code_ = failure_text(step.failure, output, run.journal.limits.max_output_bytes)
        return Failed(error=error, code=code_, telemetry=telemetry, output=output)

    def _retire(self, run: Run) -> None:
        """A run is over (or abandoned): leave the table, free its runtime, cancel its tools."""
        self._runs.remove(run)
        self._end_run(run)

    def _sweep(self) -> None:
        for run in self._runs.expired():
            self._end_run(run)

    def _end_run(self, run: Run) -> None:
        """Frees what a run out of the table still holds: its runtime, its tools, its approvals."""
        self._live.pop(run.run_id, None)
        self._supervisor.drop(run)
        run.dispatcher.close()
        run.dispatcher.approvals.clear()

    # ---- approvals -------------------------------------------------------------------------------
    def approve(
        self, session_id: str | Scope, run_id: str, call_id: str | int, ok: bool = True, *, reason: str | None = None
    ) -> None:
        """Decides on a call that waits for approval (``pendingToolCalls`` entries with
        ``approval: "pending"``): ``ok`` runs it, else the guest's call fails saying it was not
        approved (with ``reason``). A run in an ``exec``/``wait`` acts on it at once, a
        suspended one with its next ``wait``. ``ApprovalError`` if the run (of this session,
        or ``(session id, agent run)``) or the call awaits no decision."""
        scope = (session_id, None) if isinstance(session_id, str) else session_id
        run = self._live.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.aborted:
            raise ApprovalError(UNAVAILABLE)
        if run.scope != scope:
            raise ApprovalError(FOREIGN)
        number = call_number(call_id)
        if number is None:
            raise ApprovalError(f"a call id is `call_<n>`, as pendingToolCalls names it, not {call_id!r}")
        if not isinstance(ok, bool):
            raise ApprovalError("`ok` must be a bool: True approves the call, False rejects it")
        text = "" if reason is None else catalog.bounded_text(str(reason), MAX_REASON_CHARS)
        run.dispatcher.approvals.decide(number, ok, text)
        self._supervisor.release_decided(run)

    def pending_approvals(self, session_id: str | None = None) -> list[ApprovalRequest]:
        """The calls that wait for the host's decision (and decided ones not yet acted on), of
        every session or of one, oldest run first."""
        requests: list[ApprovalRequest] = []
        for run in list(self._live.values()):
            if session_id is not None and run.scope[0] != session_id:
                continue
            if run.dispatcher.approvals and not run.aborted:
                requests.extend(run.dispatcher.approvals.requests(run.scope[0], run.scope[1], run.run_id))
        return requests

    def _start_sweeper(self) -> None:
        """Expires suspended runs on time even when nobody calls (their tool tasks get cancelled)."""
        if self._sweeper is not None:
            return
        interval = min(1.0, self.config.snapshot_ttl_seconds / 2)

        def loop() -> None:
            while not self._sweep_stop.wait(interval):
                self._sweep()

        self._sweeper = threading.Thread(target=loop, name="codemode-sweeper", daemon=True)
        self._sweeper.start()

    def cancel(self, session_id: str | Scope, run_id: str) -> bool:
        """Aborts a suspended run of this session (a session id, or ``(session id, agent run)``);
        True if there was one. It never waits for an advance of the run: that advance retires
        it when it ends."""
        scope = (session_id, None) if isinstance(session_id, str) else session_id
        try:
            run = self._runs.abort(run_id, scope)
        except RunLookupError:
            return False
        if run is not None:
            self._retire(run)
        return True

    def suspended_runs(self, session_id: str | None = None) -> list[str]:
        """Ids of the suspended runs, of every session or of one (any of its agent runs)."""
        return [r.run_id for r in self._runs.all() if session_id is None or r.scope[0] == session_id]

    def export_run(self, run_id: str) -> bytes:
        """The run's journal as bytes; ``import_run`` in another process resumes it."""
        for run in self._runs.all():
            if run.run_id == run_id:
                return run.journal.encode()
        raise CodemodeError(f"no suspended run {run_id!r}")

    def import_run(self, data: bytes, session_id: str) -> str:
        """Files a journal exported elsewhere as a suspended run of ``session_id``; its open tool
        calls are redone here, so only restart-safe runs (read-only tools) are accepted.

        Nothing in the bytes is trusted: the limits are this ``CodeMode``'s own, the source and
        the recorded calls are checked as an ``exec``'s would be, and the replay fails with a
        divergence error where the journal lies about what the cell does."""
        try:
            journal = Journal.decode(data)
        except (msgspec.DecodeError, RecursionError, MemoryError) as e:
            raise CodemodeError(f"not a code mode journal: {e}") from None
        if not journal.restart_safe:
            raise CodemodeError("only restartSafe runs can resume in another process")
        if journal.prelude_hash != _engine.PRELUDE_HASH:
            raise CodemodeError("this journal was written by a different code mode engine")
        configure, view = self._configuration()
        if view.fingerprint != journal.catalog_fingerprint:
            raise CodemodeError("this journal was written against a different tool catalog")
        problem = journal_problem(journal, self.config)
        if problem is not None:
            raise CodemodeError(f"refused journal: {problem}")
        journal.limits = configure.limits
        run_id = new_run_id()
        _, namespace_calls = self._namespaces.build(view.tools, session_id=session_id, agent_run=None, run_id=run_id)
        dispatcher = Dispatcher(
            view,
            self._loop.get,
            outputs=self._output_store,
            session_id=session_id,
            gate=self._gate,
            read_only=True,
            namespace_calls=namespace_calls,
            run_id=run_id,
        )
        run = Run((session_id, None), journal, dispatcher, run_id)
        run.timeout_ms = self.config.timeout_ms
        journal.session_id, journal.agent_run = session_id, None
        settled = journal.settled_ids()
        redo = [
            (c.id, c.tool, journal.open_inputs[c.id])
            for c in journal.calls
            if c.id not in settled and c.id in journal.open_inputs
        ]
        run.yields.extend(c.id for c in journal.calls if c.id not in settled and c.tool == _engine.YIELD_TOOL)
        refused = self._runs.suspend(run)
        if refused is not None:
            raise CodemodeError(refused)
        self._live[run_id] = run
        inline = run.dispatcher.submit(redo)
        if inline is not None:
            inline()
        return run.run_id


def _search_code_cell(args: dict[str, Any]) -> dict[str, Any]:
    """The cell a ``tool_search_code`` call runs (the tool-search spec clamps its timeout to
    1,000-60,000 ms: `TOOL_SEARCH_CODE_MIN_TIMEOUT_MS`)."""
    return {"code": args.get("code"), "language": "javascript"}


class Session:
    """One conversation's handle on a ``CodeMode``: ``exec`` cells and ``wait`` on suspended ones.

    Suspended runs belong to the session (and agent run) that made them; ``close`` aborts them.
    """

    def __init__(self, codemode: CodeMode, session_id: str, agent_run: str | None = None, branch: str = "main") -> None:
        self.codemode = codemode
        self.session_id = session_id
        self.agent_run = agent_run
        #: The conversation branch `store` commits to and `load` reads from.
        self.branch = branch
        #: Suspended runs belong to this key: the session and, if given, the agent run.
        self.scope: Scope = (session_id, agent_run)

    def exec(self, args: dict[str, Any]) -> ExecResult:
        """Runs one cell; returns the spec's JSON result (``completed``, ``waiting``, ``failed``)."""
        return as_json(self.codemode._exec(self, args, self.codemode._loop.get))

    def wait(self, args: dict[str, Any]) -> ExecResult:
        """Resumes a ``waiting`` run (``{"runId": ...}``); the same result union as ``exec``.
        ``{"runId": ..., "answer": v}`` answers a run waiting on ``yield_control``: its ``await
        yield_control(...)`` resolves to ``v`` (any JSON value; none, or null, is undefined)."""
        return as_json(self.codemode._wait(self, args))

    def run(
        self,
        code: str,
        *,
        language: Literal["javascript", "typescript"] = "javascript",
        restart_safe: bool = False,
    ) -> Result:
        """Typed ``exec``: a ``Completed``, ``Waiting`` or ``Failed`` struct."""
        args = {"code": code, "language": language, "restartSafe": restart_safe}
        return self.codemode._exec(self, args, self.codemode._loop.get)

    def resume(self, run_id: str, answer: Any = None) -> Result:
        """Typed ``wait``."""
        return self.codemode._wait(self, {"runId": run_id, "answer": answer})

    def cancel(self, run_id: str) -> bool:
        """Aborts one of this session's suspended runs and cancels its tool tasks."""
        return self.codemode.cancel(self.scope, run_id)

    def approve(self, run_id: str, call_id: str | int, ok: bool = True, *, reason: str | None = None) -> None:
        """Decides on a call of one of this session's runs that waits for approval
        (``CodeMode.approve``): ``ok=False`` rejects it, saying ``reason`` to the guest."""
        self.codemode.approve(self.scope, run_id, call_id, ok, reason=reason)

    async def approve_async(
        self, run_id: str, call_id: str | int, ok: bool = True, *, reason: str | None = None
    ) -> None:
        """``approve`` from a coroutine (it never blocks: an approved call starts on its own
        thread or loop)."""
        self.codemode.approve(self.scope, run_id, call_id, ok, reason=reason)

    def pending_approvals(self) -> list[ApprovalRequest]:
        """This session's calls (of this agent run) that wait for a decision."""
        return [r for r in self.codemode.pending_approvals(self.session_id) if r.agent_run == self.agent_run]

    def close(self) -> None:
        """Aborts every suspended run of this session and forgets the full texts of its cut
        outputs (those of every agent run of its session id)."""
        for run in self.codemode._runs.of_scope(self.scope):
            self.codemode.cancel(self.scope, run.run_id)
        self.codemode._output_store.drop(self.session_id)

    def model_tools(
        self, surface: Surface = "code", *, disable_tools: bool = False, likely: str | None = None
    ) -> list[ModelTool]:
        """The model-facing tool definitions for ``surface``."""
        return self.codemode.model_tools(surface, disable_tools=disable_tools, likely=likely)

    def handle(self, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
        """Dispatches any model tool call of any surface and returns its JSON result
        (`codemode.rendering.render` gives what the model should read of it)."""
        args = args if isinstance(args, dict) else {}
        cm = self.codemode
        if name == "exec":
            return cm._exec(self, args, cm._loop.get, outer_hook=True).to_dict()
        if name == "wait":
            return cm._wait(self, args).to_dict()
        if name == "tool_search_code":
            cell = _search_code_cell(args)
            return cm._exec(self, cell, cm._loop.get, min_timeout_ms=TOOL_SEARCH_CODE_MIN_TIMEOUT_MS).to_dict()
        return self.codemode.model_surface.handle_catalog(self.session_id, name, args)

    async def handle_async(self, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
        """``handle`` as a coroutine: cells run as ``exec_async`` does (on this loop), and the
        structured surfaces' calls (search, ``tool_call``, a direct tool) on a worker thread, so
        no call blocks this loop."""
        args = args if isinstance(args, dict) else {}
        cm = self.codemode
        if name == "exec":
            return (await cm._exec_async(self, args, outer_hook=True)).to_dict()
        if name == "wait":
            return (await cm._wait_async(self, args)).to_dict()
        if name == "tool_search_code":
            cell = _search_code_cell(args)
            return (await cm._exec_async(self, cell, min_timeout_ms=TOOL_SEARCH_CODE_MIN_TIMEOUT_MS)).to_dict()
        return await asyncio.to_thread(self.codemode.model_surface.handle_catalog, self.session_id, name, args)

    async def exec_async(self, args: dict[str, Any], *, seed: int | None = None) -> ExecResult:
        """``exec`` as a coroutine on this loop (no thread waits for it); async tools run on this
        loop, sync tools on a bounded pool (`supervisor.SYNC_TOOL_THREADS`). ``seed`` (0 to
        2**63 - 1) makes the run reproducible: it fixes the cell's ``Math.random`` sequence and its
        clock (``Date`` starts at a time the seed gives and moves 1 ms a read, whatever the real
        time: `runs.fixed_clock_start`); by default each run draws its own and reads the real clock."""
        return as_json(await self.codemode._exec_async(self, args, seed=seed))

    async def wait_async(self, args: dict[str, Any]) -> ExecResult:
        return as_json(await self.codemode._wait_async(self, args))

    async def run_async(
        self,
        code: str,
        *,
        language: Literal["javascript", "typescript"] = "javascript",
        restart_safe: bool = False,
    ) -> Result:
        args = {"code": code, "language": language, "restartSafe": restart_safe}
        return await self.codemode._exec_async(self, args)

    async def resume_async(self, run_id: str, answer: Any = None) -> Result:
        """Typed ``wait_async``."""
        return await self.codemode._wait_async(self, {"runId": run_id, "answer": answer})
