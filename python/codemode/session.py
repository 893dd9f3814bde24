"""The public API: ``CodeMode`` (tools, config, the worker pool) and ``Session`` (exec).

``session.exec({"code": ...})`` returns exactly the spec's JSON result; ``session.run(code)``
returns the same thing as a typed struct; both have ``async`` twins. A guest failure is a
``failed`` result, never an exception.

``CodeMode`` is a facade: it builds the parts once and forwards to them, each in a module named
for what it holds, and none calls another's private methods::

    Session.exec / wait / run ──> cm.runner (runner.Runner: admit, make or claim, drive)
                                    ├─ run_factory.RunFactory   journal, dispatcher, Configure
                                    ├─ live_runs.LiveRuns       finish, table, approvals, sweep
                                    └─ supervisor.Supervisor    workers, deadlines, replay
    Session.handle (structured surfaces), cm.model_tools ──> cm.model_surface (ModelSurface)
    cm.add_mcp_server / load_mcp_tools ──> mcp_listing.McpListing ──> the registry
    cm.inspect() ──> inspection.Inspection (read-only: workers, suspended runs)

What an exec is given is checked in `codemode.cells`; what it returns is built in
`codemode.outcomes`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from . import tracing
from .agents import AgentRunner, checked_runner
from .approvals import ApprovalRequest
from .call_gate import Gate
from .call_planning import NO_HOST_APIS, HostApis
from .config import CodeModeConfig, load_config
from .errors import ClosedError
from .inspection import Inspection, snapshot
from .live_runs import LiveRuns
from .mcp_listing import McpListing
from .model_surface import MODEL_VISIBLE_TOOLS, ModelSurface
from .models import ModelProvider, ModelRegistry
from .namespaces import NamespaceRegistration, Namespaces
from .outcomes import Completed, Failed, JsonOutput, Result, Telemetry, TextOutput, Waiting, as_json
from .outputs import OutputStore
from .placement import Placement, placement_of
from .policy import Approver, Hook, Policy, Trace
from .results import ExecResult
from .run_factory import RunFactory
from .runner import Runner
from .runs import MAX_SUSPENDED_RUNS, Scope
from .shared_runs import SharedRuns
from .store import Store
from .stored_values import StoredValues
from .supervisor import Supervisor
from .surfaces import ModelTool, Surface
from .tools import BackgroundLoop, CatalogView, Tool, ToolRegistry, define_tool

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from .batch import Cell, CellResult

__all__ = ["CodeMode", "Completed", "Failed", "JsonOutput", "Result", "Session", "Telemetry", "TextOutput", "Waiting"]

F = TypeVar("F", bound=Callable[..., Any])

#: The lower bound of a `tool_search_code` cell's timeout (seed 001).
TOOL_SEARCH_CODE_MIN_TIMEOUT_MS = 1000


class CodeMode:
    """Owns the tool registry, the policy, the validated config and the worker pool.

    ``allow``/``deny`` are ``fnmatch`` patterns over tool names and ids (deny wins): denied tools
    never enter a run's catalog. ``before_tool_call(event)`` may return ``Block(reason)`` or
    ``Rewrite(input)``; ``approve(event)`` may refuse a call, or answer ``Defer()`` to decide
    later (``Session.approve``; the run suspends meanwhile). Both may be ``async``. Calls matching
    ``require_approval`` patterns (or of a tool defined with ``requires_approval=True``) wait for
    an approval: the callback's, or with none, the host's ``Session.approve``. Close the
    ``CodeMode`` when done (``with``/``async with``).

    ``store`` is where cells' ``store``/``load`` values live; ``runs`` (a SQLite path or a
    ``postgresql://`` URL) is a run store shared by host processes: a run suspended in one can
    be resumed by a ``wait`` in any (`codemode.shared_runs`). ``placement`` is where worker
    processes run: here (``"local"``, the default), as actors on a Ray cluster (``"ray"``, or a
    `codemode.ray_placement.RayPlacement` for an address and actor options), or any `Placement`.

    ``models`` are the providers of cells' ``models.*`` API (seed 002; `codemode.models`), and
    ``agents`` the runner of Swarm's ``agents.run`` (seed 000; `codemode.agents`): with none,
    cells have no ``models`` global, and no ``agents``/``phase``/``log``.

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
        runs: str | os.PathLike[str] | None = None,
        placement: Placement | Literal["local", "ray"] | None = None,
        tracer_provider: TracerProvider | None = None,
        models: Iterable[ModelProvider] = (),
        agents: AgentRunner | None = None,
    ) -> None:
        self.config = load_config(config)
        #: The ``models.*`` providers and the Swarm runner cells reach (`codemode.models`,
        #: `codemode.agents`); checked before anything starts.
        self._models = ModelRegistry(models)
        self._agents = checked_runner(agents)
        self._host_apis = NO_HOST_APIS
        self._registry = ToolRegistry()
        self._mcp = McpListing(self._registry)
        # Before anything starts (worker processes, threads): a malformed entry then fails this
        # constructor with nothing left running.
        for name, server in self.config.mcp_servers.items():
            self.add_mcp_server(name, server)
        # The workers boot while the rest is set up (a store to open, a first worker to start).
        size = self.config.workers or min(4, os.cpu_count() or 1)
        self._supervisor = Supervisor(
            size,
            placement=placement_of(placement),
            max_runs_per_worker=self.config.max_runs_per_worker,
            max_worker_memory=self.config.max_worker_memory_bytes,
            max_snapshot_bytes=self.config.max_snapshot_bytes,
            max_journal_bytes=self.config.max_journal_bytes,
        )
        try:
            #: Where `store`/`load` values live, and the snapshots a run starts with (`codemode.stored_values`).
            self._stored = StoredValues(store)
        except BaseException:
            self._supervisor.close()  # (a store that cannot open leaves nothing running)
            raise
        self._namespaces = Namespaces()
        self._policy = Policy.of(allow, deny, require_approval)
        self._trace = Trace()
        self._gate = Gate(before_tool_call, approve, self._trace)
        self._loop = BackgroundLoop()
        self._closed = False
        call_ids = itertools.count(1)
        #: Full texts of cut outputs, per session, in memory only (`codemode.outputs`).
        self._output_store = OutputStore(
            self.config.output_store_bytes, self.config.output_store_total_bytes, self.config.output_store_ttl_seconds
        )
        factory = RunFactory(
            self.config,
            self.catalog,
            self._namespaces,
            self._stored,
            self._output_store,
            self._gate,
            self._mcp,
            self._loop,
            call_ids,
            self.host_apis,
        )
        # A worker is configured with the catalog of this moment while it starts (it reads that
        # once up), and builds its first engine meanwhile; later ones as they come up (tools
        # added since included), and all again once the catalog changes.
        self._supervisor.prime(lambda: factory.configuration()[0])
        shared = None
        if runs is not None:
            try:
                #: Suspended runs any process on this store can resume (`codemode.shared_runs`).
                shared = SharedRuns(
                    runs,
                    self._supervisor,
                    factory.rebuilt,
                    ttl_s=self.config.snapshot_ttl_seconds,
                    limit=MAX_SUSPENDED_RUNS,
                    per_session=self.config.max_suspended_runs_per_session,
                )
            except BaseException:
                self._supervisor.close()
                self._stored.close()
                raise
        #: The runs not yet over and the table of suspended ones (`codemode.live_runs`).
        self._live = LiveRuns(
            self.config, self.catalog, self._supervisor, self._trace, self._stored, self._output_store, shared
        )
        #: The run lifecycle of ``exec`` and ``wait`` (`codemode.runner`); sessions run their cells
        #: through it.
        self.runner = Runner(
            self.config,
            factory,
            self._live,
            self._supervisor,
            self._gate,
            self._mcp,
            self._loop,
            tracing.tracer(tracer_provider),
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
            call_ids,
            self.host_apis,
        )
        self._registry.on_change = self._supervisor.catalog_changed

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

    def host_apis(self) -> HostApis:
        """The ``models.*`` providers and the agent runner a run would reach now, and the policy
        their calls pass (rebuilt when the policy changes)."""
        apis = self._host_apis
        if apis.policy is not self._policy:
            apis = self._host_apis = HostApis(self._models, self._agents, self._policy)
        return apis

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
        self._closed = self.runner.closed = True
        self._mcp.close()
        self._live.close()
        self._supervisor.close()
        self._loop.close()
        self._stored.close()
        self._output_store.clear()

    def __enter__(self) -> CodeMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CodeMode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # ---- approvals and runs ------------------------------------------------------------------------
    def approve(
        self, session_id: str | Scope, run_id: str, call_id: str | int, ok: bool = True, *, reason: str | None = None
    ) -> None:
        """Decides on a call that waits for approval (``pendingToolCalls`` entries with
        ``approval: "pending"``): ``ok`` runs it, else the guest's call fails saying it was not
        approved (with ``reason``). A run in an ``exec``/``wait`` acts on it at once, a
        suspended one with its next ``wait``. ``ApprovalError`` if the run (of this session,
        or ``(session id, agent run)``) or the call awaits no decision."""
        scope = (session_id, None) if isinstance(session_id, str) else session_id
        self._live.approve(scope, run_id, call_id, ok, reason)

    def pending_approvals(self, session_id: str | None = None) -> list[ApprovalRequest]:
        """The calls that wait for the host's decision (and decided ones not yet acted on), of
        every session or of one, oldest run first."""
        return self._live.pending_approvals(session_id)

    def cancel(self, session_id: str | Scope, run_id: str) -> bool:
        """Aborts a suspended run of this session (a session id, or ``(session id, agent run)``);
        True if there was one. It never waits for an advance of the run: that advance retires
        it when it ends."""
        scope = (session_id, None) if isinstance(session_id, str) else session_id
        return self._live.cancel(scope, run_id)

    def suspended_runs(self, session_id: str | None = None) -> list[str]:
        """Ids of the suspended runs, of every session or of one (any of its agent runs)."""
        return [r.run_id for r in self._live.suspended(session_id)]

    def inspect(self) -> Inspection:
        """A read-only snapshot of this ``CodeMode`` now (`codemode.inspection`): the live worker
        processes' pids, how many workers were spawned and how many the deadline backstop
        SIGKILLed, and each suspended run with its session and its progress (``running``,
        ``parked``, or how an advance ended it). For tests and dashboards; nothing in it is
        live, and reading it changes nothing."""
        return snapshot(self._supervisor, self._live.suspended())

    def export_run(self, run_id: str) -> bytes:
        """The run's journal as bytes; ``import_run`` in another process resumes it."""
        return self._live.export(run_id)

    def import_run(self, data: bytes, session_id: str) -> str:
        """Files a journal exported elsewhere as a suspended run of ``session_id``; its open tool
        calls are redone here, so only restart-safe runs (read-only tools) are accepted.

        Nothing in the bytes is trusted: the limits are this ``CodeMode``'s own, the source and
        the recorded calls are checked as an ``exec``'s would be, and the replay fails with a
        divergence error where the journal lies about what the cell does."""
        return self.runner.import_run(data, session_id)


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
        return as_json(self.codemode.runner.exec(self, args))

    def wait(self, args: dict[str, Any]) -> ExecResult:
        """Resumes a ``waiting`` run (``{"runId": ...}``); the same result union as ``exec``.
        ``{"runId": ..., "answer": v}`` answers a run waiting on ``yield_control``: its ``await
        yield_control(...)`` resolves to ``v`` (any JSON value; none, or null, is undefined)."""
        return as_json(self.codemode.runner.wait(self, args))

    def run(
        self,
        code: str,
        *,
        language: Literal["javascript", "typescript"] = "javascript",
        restart_safe: bool = False,
    ) -> Result:
        """Typed ``exec``: a ``Completed``, ``Waiting`` or ``Failed`` struct."""
        args = {"code": code, "language": language, "restartSafe": restart_safe}
        return self.codemode.runner.exec(self, args)

    def resume(self, run_id: str, answer: Any = None) -> Result:
        """Typed ``wait``."""
        return self.codemode.runner.wait(self, {"runId": run_id, "answer": answer})

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
        self.codemode.runner.close_session(self.scope)

    def model_tools(
        self, surface: Surface = "code", *, disable_tools: bool = False, likely: str | None = None
    ) -> list[ModelTool]:
        """The model-facing tool definitions for ``surface``."""
        return self.codemode.model_tools(surface, disable_tools=disable_tools, likely=likely)

    def handle(self, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
        """Dispatches any model tool call of any surface and returns its JSON result
        (`codemode.rendering.render` gives what the model should read of it)."""
        args = args if isinstance(args, dict) else {}
        runner = self.codemode.runner
        if name == "exec":
            return runner.exec(self, args, outer_hook=True).to_dict()
        if name == "wait":
            return runner.wait(self, args).to_dict()
        if name == "tool_search_code":
            cell = _search_code_cell(args)
            return runner.exec(self, cell, min_timeout_ms=TOOL_SEARCH_CODE_MIN_TIMEOUT_MS).to_dict()
        return self.codemode.model_surface.handle_catalog(self.session_id, name, args)

    async def handle_async(self, name: str, args: dict[str, Any] | None) -> dict[str, Any]:
        """``handle`` as a coroutine: cells run as ``exec_async`` does (on this loop), and the
        structured surfaces' calls (search, ``tool_call``, a direct tool) on a worker thread, so
        no call blocks this loop."""
        args = args if isinstance(args, dict) else {}
        runner = self.codemode.runner
        if name == "exec":
            return (await runner.exec_async(self, args, outer_hook=True)).to_dict()
        if name == "wait":
            return (await runner.wait_async(self, args)).to_dict()
        if name == "tool_search_code":
            cell = _search_code_cell(args)
            return (await runner.exec_async(self, cell, min_timeout_ms=TOOL_SEARCH_CODE_MIN_TIMEOUT_MS)).to_dict()
        return await asyncio.to_thread(self.codemode.model_surface.handle_catalog, self.session_id, name, args)

    async def exec_async(self, args: dict[str, Any], *, seed: int | None = None) -> ExecResult:
        """``exec`` as a coroutine on this loop (no thread waits for it); async tools run on this
        loop, sync tools on a bounded pool (`supervisor.SYNC_TOOL_THREADS`). ``seed`` (0 to
        2**63 - 1) makes the run reproducible: it fixes the cell's ``Math.random`` sequence and its
        clock (``Date`` starts at a time the seed gives and moves 1 ms a read, whatever the real
        time: `runs.fixed_clock_start`); by default each run draws its own and reads the real clock."""
        return as_json(await self.codemode.runner.exec_async(self, args, seed=seed))

    async def wait_async(self, args: dict[str, Any]) -> ExecResult:
        return as_json(await self.codemode.runner.wait_async(self, args))

    async def run_async(
        self,
        code: str,
        *,
        language: Literal["javascript", "typescript"] = "javascript",
        restart_safe: bool = False,
    ) -> Result:
        args = {"code": code, "language": language, "restartSafe": restart_safe}
        return await self.codemode.runner.exec_async(self, args)

    async def resume_async(self, run_id: str, answer: Any = None) -> Result:
        """Typed ``wait_async``."""
        return await self.codemode.runner.wait_async(self, {"runId": run_id, "answer": answer})
