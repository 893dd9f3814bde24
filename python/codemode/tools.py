"""Host tools: defining them, the run's catalog view, and running the calls a cell makes.

Tools always run in the host process, never in a worker. A sync function runs on the thread
of the ``exec``/``wait`` that waits for the run (no hop), or, for ``exec_async``, on a bounded
pool (`supervisor.SYNC_TOOL_THREADS`): never on the thread that reads a worker, so a slow one
stalls no other run. An ``async def`` tool runs on an event loop: the caller's own loop for
``exec_async``, or a private background loop for ``exec``. Every call passes the same gate:
the run's catalog (policy-filtered), the ``before_tool_call`` hook, the approval (at once, or
later: see `approvals`), then the tool, then its output contract. A host tool's input is checked
against its parameters' annotations before the gate, and converted to them (dataclasses, msgspec
``Struct``s, pydantic models arrive as instances; see `catalog.Parameters`) after it, with a
``ToolContext`` for the tool that asks for one. Results cross to the guest as JSON (a pydantic
model as its ``model_dump(mode="json")``); an exception becomes a plain guest ``Error`` carrying
only its message.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from . import _engine, catalog, tracing
from .approvals import Approvals, FiledCall, shown_input
from .errors import ToolDefinitionError
from .hotloop import HotLoop
from .mcp_api import MCP_OPS, check_op_input, declarations, mcp_names, op_id, op_name, tool_declaration, with_defaults
from .namespaces import CallTable
from .outputs import OutputStore, read_call
from .policy import (
    Approval,
    Approver,
    Block,
    Defer,
    Hook,
    HookResult,
    Policy,
    Rewrite,
    ToolCallEvent,
    Trace,
    TraceEvent,
)
from .protocol import too_heavy, utf8_len

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "MAX_BRIDGE_BYTES",
    "MAX_ERROR_CHARS",
    "BackgroundLoop",
    "CatalogView",
    "Dispatcher",
    "Gate",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "result_bytes",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_OWNER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: MCP servers name their tools (and users their servers) as they like; guest code reaches them
#: through camelCase identifiers (`mcp_api.camel_ident`), so only length and control characters
#: are refused. The MCP spec asks for 1-128 characters.
_MCP_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")
#: Names the catalog never holds: the model-facing control tools themselves.
CONTROL_TOOLS = frozenset({"exec", "wait", "tool_search_code", "tool_search", "tool_describe", "tool_call"})
#: The tool ids namespace and ``MCP.*`` calls arrive under (see prelude.js).
NAMESPACE_TOOL = "\x00ns"
MCP_TOOL = "\x00mcp"
#: The tool id ``readOutput(handle, {offset, limit})`` calls arrive under (`codemode.outputs`).
OUTPUT_TOOL = "\x00out"
McpOps = Callable[[str, str, Any], Awaitable[Any]]
LoopRef = Callable[[], asyncio.AbstractEventLoop]
_encode = msgspec.json.encode
#: A tool's result: what msgspec encodes, and pydantic models (`catalog.json_default`).
_encode_value = msgspec.json.Encoder(enc_hook=catalog.json_default).encode
_decode = msgspec.json.decode
_log = logging.getLogger(__name__)
#: Bytes of one tool result's JSON: the engine's ``max_bridge_bytes`` (its default, which every
#: worker uses). A bigger result fails its call here, before it is put in a settle frame.
MAX_BRIDGE_BYTES = _engine.MAX_BRIDGE_BYTES
#: The engine's words for a result over the bridge limit (one limit, one message).
_OVER_BRIDGE = f"tool result is larger than the bridge limit ({MAX_BRIDGE_BYTES} bytes)"
#: Characters of one failed call's message (a tool may raise with a 70 MB message).
MAX_ERROR_CHARS = 4096
#: An MCP or client tool's input is checked in the host up to this size (its schema is compiled
#: Python, slow on big inputs); a bigger one goes on, and its server checks it.
_UNTRUSTED_CHECK_CHARS = 1 << 20
#: Characters of an unreachable MCP server's reason in the catalog.
_MAX_REASON_CHARS = 1000
#: The most a run catalog may take as JSON: it goes to each worker in one frame, under
#: ``protocol.MAX_FRAME_BYTES``. Past it, descriptions are cut and full schemas dropped (the
#: compact hints stay) until it fits: many large tools make a terse catalog, not a failed exec.
CATALOG_BUDGET_BYTES = 16 << 20
#: What `_fitted` cuts descriptions to, in turn, and from which step it drops full schemas.
_FIT_DESCRIPTION_CHARS = (1024, 1024, 160)


class ToolContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool that asks for it (a parameter annotated ``ToolContext``) learns about the
    call it serves; never part of its input schema. ``run_id`` and ``call_id`` together name
    one call of a run."""

    #: The session the cell runs in.
    session_id: str
    #: The catalog id called (``host:billing:invoices_list``), however the cell named it.
    tool_id: str
    #: The session's agent run, if it has one.
    agent_run: str | None = None
    #: The run the call belongs to (the ``runId`` a ``waiting`` result gives); ``""`` for a
    #: call the host makes (``tool_call``, a direct tool).
    run_id: str = ""
    #: The call's number within its run.
    call_id: int = 0


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool backed by a Python callable, with its schemas and compact hints."""

    id: str
    name: str
    description: str
    fn: Callable[..., Any]
    is_async: bool
    source: str = "host"
    owner: str = "core"
    label: str | None = None
    read_only: bool = False
    #: Every call waits for an approval (the callback's, or ``Session.approve``).
    requires_approval: bool = False
    #: Stays a model-visible tool; never enters the code-mode catalog.
    direct_only: bool = False
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    #: An MCP tool's ``outputSchema``: the server's word, shown in its declaration only (never
    #: a hint, a search field or a contract).
    declared_output_schema: dict[str, Any] | None = None
    input_hint: str = "unknown"
    output_hint: str | None = None
    fields: tuple[str, ...] = ()
    #: Checks a call's input before anything else sees it: None if valid, else the problem.
    check_input: Callable[[Any], str | None] | None = None
    #: Makes the call of ``fn`` from an input (None: an object's keys are its keyword arguments,
    #: any other value its one argument).
    parameters: catalog.Parameters | None = None
    check_output: Callable[[Any], str | None] | None = None
    #: The event loop an async tool must run on (MCP tools: their client's loop), if not the run's.
    loop: Callable[[], asyncio.AbstractEventLoop] | None = None

    def entry(self) -> dict[str, Any]:
        """The catalog entry the worker serves: compact fields, schemas, and search text."""
        entry: dict[str, Any] = {"id": self.id, "name": self.name}
        if self.label:
            entry["label"] = self.label
        entry.update(description=self.description, source=self.source, sourceName=self.owner, input=self.input_hint)
        if self.output_hint is not None:
            entry["output"] = self.output_hint
        if self.input_schema is not None:
            entry["parameters"] = self.input_schema
        if self.output_schema is not None:
            entry["outputSchema"] = self.output_schema
        if self.fields:
            entry["fields"] = list(self.fields)
        return entry


def define_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    owner: str = "core",
    source: str = "host",
    label: str | None = None,
    read_only: bool = False,
    requires_approval: bool = False,
    direct_only: bool = False,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    loop: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> Tool:
    """Builds a ``Tool``: schemas from explicit arguments or the function's type hints.

    Only host tools are trusted: their schemas give compact hints, search text and an output
    contract. MCP and client tools keep ``input: "unknown"`` and no output hint, as the spec says.
    """
    if not callable(fn):
        raise ToolDefinitionError(f"a tool must be callable, not {type(fn).__name__}")
    name = name or str(getattr(fn, "__name__", ""))
    if not (_MCP_NAME if source == "mcp" else _NAME).fullmatch(name):
        raise ToolDefinitionError(f"invalid tool name {name!r}")
    if not (_MCP_NAME if source == "mcp" else _OWNER).fullmatch(owner):
        raise ToolDefinitionError(f"invalid tool owner {owner!r}")
    if source not in ("host", "client", "mcp"):
        raise ToolDefinitionError(f"invalid tool source {source!r}")
    if name in CONTROL_TOOLS and (direct_only or (source == "host" and owner == "core")):
        # The model sees exactly one `exec` and one `wait` and no tool-search controls, and the
        # core names are the control tools themselves. A plugin's shell `exec` is catalogued.
        raise ToolDefinitionError(f"{name!r} is a code mode control tool name")
    trusted = source == "host"
    parameters = None
    if trusted:
        input_schema, output_schema, parameters = _from_signature(fn, name, input_schema, output_schema)
    input_schema = _bounded_schema(name, "input", input_schema, trusted)
    output_schema = _bounded_schema(name, "output", output_schema, trusted)
    declared_output, output_schema = (output_schema, None) if source == "mcp" else (None, output_schema)
    hint = catalog.input_hint(input_schema) if trusted else "unknown"
    try:
        check_input = (
            parameters.check
            if parameters is not None and parameters.converts
            else catalog.compile_input_validator(input_schema, trusted=trusted)
        )
    except ToolDefinitionError as e:
        raise ToolDefinitionError(f"tool {name}: {e}") from None
    if check_input is not None and hint != "unknown":
        check_input = functools.partial(_with_hint, check_input, hint)
    doc = description if description is not None else inspect.getdoc(fn) or ""
    return Tool(
        id=f"{source}:{owner}:{name}",
        name=name,
        description=catalog.bounded_text(doc.strip(), catalog.MAX_DESCRIPTION_CHARS),
        fn=fn,
        is_async=inspect.iscoroutinefunction(fn),
        source=source,
        owner=owner,
        label=catalog.bounded_text(label, catalog.MAX_LABEL_CHARS) if label else label,
        read_only=read_only,
        requires_approval=requires_approval,
        direct_only=direct_only,
        input_schema=input_schema,
        output_schema=output_schema,
        declared_output_schema=declared_output,
        input_hint=hint,
        output_hint=catalog.output_hint(output_schema) if trusted else None,
        fields=tuple(catalog.search_fields(input_schema, output_schema)) if trusted else (),
        check_input=check_input,
        parameters=parameters,
        check_output=catalog.compile_output_validator(output_schema) if trusted and output_schema else None,
        loop=loop,
    )


def _from_signature(
    fn: Callable[..., Any], name: str, input_schema: dict[str, Any] | None, output_schema: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, catalog.Parameters | None]:
    """A host tool's schemas (the explicit ones, else its type hints') and how its input becomes
    its call: converted to its annotations, or, with an explicit input schema, as it is (its
    ``ToolContext`` filled in still)."""
    try:
        derived = catalog.describe_function(fn, context_type=ToolContext)
    except ToolDefinitionError as e:
        raise ToolDefinitionError(f"tool {name}: {e}") from None
    except (TypeError, ValueError, NameError) as e:
        raise ToolDefinitionError(f"tool {name}: cannot derive schemas from its signature: {e}") from None
    parameters = derived.parameters
    if input_schema is None:
        input_schema = derived.input_schema
    elif parameters is not None:
        parameters = catalog.Parameters.raw(parameters.context) if parameters.context is not None else None
    return input_schema, derived.output_schema if output_schema is None else output_schema, parameters


def _with_hint(check: Callable[[Any], str | None], hint: str, value: Any) -> str | None:
    """``check``'s problem with the input the tool takes, so the model can write it right."""
    problem = check(value)
    return None if problem is None else f"{problem}. It takes {hint}"


def _bounded_schema(name: str, kind: str, schema: dict[str, Any] | None, trusted: bool) -> dict[str, Any] | None:
    """``schema`` if the catalog can carry it. An untrusted one over the bounds is replaced by a
    stand-in that says why (one server's schema must not fail every exec); the host's own is its
    contract and is refused."""
    bounded, why = catalog.bounded_schema(schema)
    if why is not None and trusted:
        raise ToolDefinitionError(f"tool {name}: its {kind} schema cannot be catalogued: {why}")
    return bounded


class CatalogView(msgspec.Struct, frozen=True, dict=True):
    """The tools one run may see and call (policy applied, direct-only tools left out).
    (``dict``: room for the lookups below, built on first use, once per view.)"""

    tools: dict[str, Tool]
    catalog_json: str
    fingerprint: str
    #: Tools per source, for telemetry.
    counts: dict[str, int]
    #: Names of the direct-only tools the policy allows (they stay model-visible).
    direct: tuple[str, ...]
    #: The MCP servers this run may use: server -> the identifier under ``MCP``.
    mcp_servers: dict[str, str] = {}
    #: The ``resources``/``prompts`` requests the policy permits, per server of ``mcp_servers``
    #: (``resources.list``...; policy names them `mcp_api.op_id`).
    mcp_ops: dict[str, frozenset[str]] = {}
    #: ``Policy.approve``: patterns of the calls that wait for an approval.
    approve: tuple[str, ...] = ()

    def needs_approval(self, tool: Tool | _McpRequest) -> bool:
        """Whether a call of ``tool`` waits for an approval (its own flag, or the policy's)."""
        if tool.requires_approval:
            return True
        return bool(self.approve) and Policy(approve=self.approve).needs_approval(tool.id, tool.name)

    @functools.cached_property
    def by_name(self) -> dict[str, list[str]]:
        """Catalog ids per tool name, MCP tools aside (a cell reaches those through ``MCP``):
        ``tools.callValue`` takes a name with one id as that id."""
        out: dict[str, list[str]] = {}
        for tool in self.tools.values():
            if tool.source != "mcp":
                out.setdefault(tool.name, []).append(tool.id)
        return out

    @functools.cached_property
    def index(self) -> _engine.Catalog:
        """The search the guest runs (the same entries, MCP aside), for the names an unknown
        id's error suggests."""
        return _engine.Catalog(self.catalog_json)


#: Names an unknown tool's error suggests, and the characters of the id it searches with.
_SUGGESTIONS = 3
_SUGGEST_QUERY_CHARS = 200


def unknown_tool(view: CatalogView, tool_id: str) -> str:
    """What a cell's call of a tool its run cannot see is told: the closest names it can call
    (a hidden or denied tool answers as an absent one: the suggestions come from the visible
    catalog alone) and where to look for others."""
    # The name part of an id (`host:core:get_wether`): its source and owner would only add noise.
    query = tool_id.rsplit(":", 1)[-1][:_SUGGEST_QUERY_CHARS]
    hits = msgspec.json.decode(view.index.search(query, _SUGGESTIONS)) if view.by_name else []
    names = [h["name"] if len(view.by_name.get(h["name"], ())) == 1 else h["id"] for h in hits]
    hint = f" Did you mean: {', '.join(names)}?" if names else ""
    return (
        f"unknown tool: {catalog.bounded_text(tool_id, _SUGGEST_QUERY_CHARS)}.{hint} "
        "Find tools with `await tools.search(query)`; call one by its exact id or unambiguous name."
    )


def _ambiguous(name: str, ids: list[str]) -> str:
    """A tool name that several visible tools share: call one of them by its id."""
    return f"tool name {name} is ambiguous: call one of {', '.join(ids)} by its id."


_SOURCE_RANK = {"host": 0, "mcp": 1, "client": 2}


def _permitted_ops(policy: Policy, server: str) -> frozenset[str]:
    """The ``MCP.<server>.resources/prompts`` requests ``policy`` lets through."""
    return frozenset(op for op in MCP_OPS if policy.permits(op_id(server, op), op_name(op)))


def _catalog_order(tool: Tool) -> tuple[int, bool, str]:
    return (_SOURCE_RANK[tool.source], tool.owner != "core", tool.id)


class ToolRegistry:
    """The host's tools, keyed by catalog id; catalog views are cached per (version, policy)."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()
        self.version = 0
        self._views: dict[Policy, tuple[int, CatalogView]] = {}
        #: MCP servers: server -> None once listed, else why it cannot be used (the guest gets
        #: a clear error). A listed server with no tools still has resources and prompts.
        self._mcp_servers: dict[str, str | None] = {}

    def set_mcp_server(self, server: str, tools: Iterable[Tool] | None, reason: str | None = None) -> None:
        """Replaces everything registered for MCP server ``server`` at once: its tools (``None``:
        keep them; each is ``mcp:<server>:<name>``, and a server name has no ``:``, so no other
        server's can be replaced) and its state (``reason``: why it cannot be used, or None).
        The first call for a server fixes its place among the servers: identifiers follow it."""
        with self._lock:
            if tools is not None:
                for tool_id in [t.id for t in self._tools.values() if t.source == "mcp" and t.owner == server]:
                    del self._tools[tool_id]
                self._tools.update((t.id, t) for t in tools)
            self._mcp_servers[server] = reason
            self.version += 1

    def add(self, tool: Tool) -> Tool:
        with self._lock:
            if tool.id in self._tools:
                raise ToolDefinitionError(f"a tool with id {tool.id!r} is already registered")
            self._tools[tool.id] = tool
            self.version += 1
        return tool

    def remove(self, tool_id: str) -> bool:
        with self._lock:
            found = self._tools.pop(tool_id, None) is not None
            if found:
                self.version += 1
            return found

    def get(self, tool_id: str) -> Tool | None:
        return self._tools.get(tool_id)

    def all(self) -> list[Tool]:
        with self._lock:
            return [self._tools[k] for k in sorted(self._tools)]

    def _mcp_visible(self, policy: Policy, shown: set[str], with_tools: set[str]) -> list[str]:
        """The MCP servers a run under ``policy`` sees.

        A server is visible when the policy lets one of its tools (``shown``: their servers) or
        its requests through; one whose tools are not known (still starting or unreachable, and
        none in ``with_tools``) also when it would let ``mcp:<server>:*`` through. A server
        whose tools and requests are all denied is hidden. Identifiers go to the visible servers
        in the order they were first set, whatever their state: a server's ``MCP.<ident>`` stays
        its own when another's tools arrive.
        """

        def unknown_tools(server: str) -> bool:
            return server not in with_tools and self._mcp_servers[server] is not None

        return [
            server
            for server in self._mcp_servers
            if server in shown
            or _permitted_ops(policy, server)
            or (unknown_tools(server) and policy.permits(f"mcp:{server}:*", "*"))
        ]

    def view(self, policy: Policy) -> CatalogView:
        """The run catalog under ``policy``, in the spec's order (core host tools, plugin tools,
        MCP, client) and by id within each, so equal sets give equal bytes."""
        with self._lock:
            cached = self._views.get(policy)
            if cached is not None and cached[0] == self.version:
                return cached[1]
            ordered = sorted(self._tools.values(), key=_catalog_order)
            tools = {t.id: t for t in ordered if not t.direct_only and policy.permits(t.id, t.name)}
            mcp = [t for t in tools.values() if t.source == "mcp"]
            with_tools = {t.owner for t in self._tools.values() if t.source == "mcp"}
            servers = self._mcp_visible(policy, {t.owner for t in mcp}, with_tools)
            unavailable = {
                s: catalog.bounded_text(r, _MAX_REASON_CHARS)
                for s in servers
                if s not in with_tools and (r := self._mcp_servers[s]) is not None
            }
            names = mcp_names(servers, mcp)
            ops = {server: _permitted_ops(policy, server) for server in names.servers}
            entries = []
            for tool in tools.values():
                entry = tool.entry()
                if tool.source == "mcp":
                    entry["ident"] = names.tools[tool.id]
                    entry["serverIdent"] = names.servers[tool.owner]
                    entry["declaration"] = tool_declaration(tool, names.tools[tool.id])
                entries.append(entry)
            described: dict[str, dict[str, str]] = {}
            for server, ident in names.servers.items():
                described[server] = {"ident": ident, "path": names.paths[server]}
                if server in unavailable:
                    described[server]["reason"] = unavailable[server]
            api = declarations(mcp, names, unavailable, ops) if described else {}
            catalog_json = _fitted(entries, {"api": api, "mcpServers": described})
            fingerprint = hashlib.blake2b(catalog_json.encode(), digest_size=16).hexdigest()
            counts = {"host": 0, "mcp": 0, "client": 0}
            for tool in tools.values():
                counts[tool.source] += 1
            direct = tuple(t.name for t in self._tools.values() if t.direct_only and policy.permits(t.id, t.name))
            reachable = {s: ident for s, ident in names.servers.items() if s not in unavailable}
            permitted = {s: ops[s] for s in reachable}
            view = CatalogView(
                tools, catalog_json, fingerprint, counts, direct, reachable, permitted, approve=policy.approve
            )
            if len(self._views) > 32:
                self._views.clear()
            self._views[policy] = (self.version, view)
            return view


class BackgroundLoop:
    """A private event loop thread for ``async`` tools called from synchronous ``exec``.

    Every session's async tools share it, so no tool may end it: each call is guarded (see
    `Dispatcher._start`), and a ``SystemExit``/``KeyboardInterrupt`` that a tool's own callback
    raises out of the loop (``loop.call_soon(sys.exit)``) is logged and the loop runs on.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed: threading.Event | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = HotLoop()  # a loop reader answers workers from it (see `hotloop`)
                closed = threading.Event()
                thread = threading.Thread(target=_serve, args=(loop, closed), name="codemode-tools", daemon=True)
                thread.start()
                self._loop, self._thread, self._closed = loop, thread, closed
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, thread, closed = self._loop, self._thread, self._closed
            self._loop = self._thread = self._closed = None
        if loop is not None and thread is not None and closed is not None:
            closed.set()
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


def _serve(loop: asyncio.AbstractEventLoop, closed: threading.Event) -> None:
    """Runs ``loop`` until ``closed``: neither a tool that stops it nor one whose callback
    raises out of it ends it."""
    while True:
        try:
            loop.run_forever()
        except BaseException:
            _log.exception("codemode: a tool's callback raised out of the tools' event loop")
        if closed.is_set():
            return


class Gate(msgspec.Struct, frozen=True):
    """The host's checks around every nested call, and where the trace goes."""

    hook: Hook | None = None
    approve: Approver | None = None
    trace: Trace | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.hook) or inspect.iscoroutinefunction(self.approve)


class Refused(Exception):
    """A call stopped before its tool ran (blocked, not approved): the message is for the guest."""


class Blocked(Refused):
    """A hook returned ``Block(reason)``, or the approval callback refused (``not approved``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"tool call blocked: {reason}")
        self.reason = reason


class InvalidInput(Refused):
    """A call's input, rewritten by a hook, does not convert to its tool's parameters."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"invalid input: {problem}")


class Deferred(Exception):
    """The gate has no approval yet: the call waits for the host's (see `approvals`)."""

    def __init__(self, args: Any, shown: Any) -> None:
        super().__init__("awaiting approval")
        #: The input the call runs with once approved (the hook's rewrite applied).
        self.input = args
        self.shown = shown


def _approved(args: Any, answer: Approval) -> Any:
    """The approval callback's ``answer`` over ``args``: the input to run with; ``Blocked`` if
    it refused, ``Deferred`` if it answers later."""
    if isinstance(answer, Defer):
        raise Deferred(args, args if answer.input is msgspec.UNSET else answer.input)
    if not answer:
        raise Blocked("not approved")
    return args


def _rejected(reason: str) -> Blocked:
    """What a call the host rejected (``Session.approve(..., ok=False)``) fails with."""
    return Blocked(f"not approved: {reason}" if reason else "not approved")


def _op_rejected(call_id: int, label: str, reason: str) -> Result:
    """An ``MCP.<server>.resources/prompts`` request the host rejected."""
    return (call_id, False, _error_message(label, _rejected(reason)))


#: What `_start_coroutine`'s request answers when it was filed for approval (no result yet).
_FILED: Any = object()
#: Why a call that waits for a later approval is refused where nothing can wait for it.
_CANNOT_WAIT = "approval pending, and only a code mode run can wait for an approval that comes later"
_CANNOT_WAIT_SAFE = "approval pending, and a restartSafe run cannot wait for an approval"


def apply_hook(decision: HookResult, args: Any) -> Any:
    """A hook's decision over ``args``: the input to run with; ``Blocked`` if it blocked."""
    if isinstance(decision, Block):
        raise Blocked(decision.reason)
    if isinstance(decision, Rewrite):
        return decision.input
    return args


Result = tuple[int, bool, str]


class _McpRequest(NamedTuple):
    """An ``MCP.<server>.resources/prompts`` request as hooks and approvals see it (`mcp_api.op_id`)."""

    id: str
    name: str
    owner: str
    source: str = "mcp"
    requires_approval: bool = False


def _blocked_result(call_id: int, tool: Tool, blocked: Blocked) -> Result:
    """A blocked call's answer (the tool did not run): a failed call, or for an MCP tool what
    MCP tools answer a failure with, a result the cell can check (``isError``) whose text is
    the reason."""
    if tool.source != "mcp":
        return (call_id, False, _error_message(tool.id, blocked))
    content = [{"type": "text", "text": _bounded_error(blocked.reason)}]
    return (call_id, True, _encode({"content": content, "isError": True}).decode())


class _Plan(NamedTuple):
    """How `Dispatcher.submit` starts one call."""

    #: The tool id an ``MCP.*`` or namespace call resolved to.
    resolved: str | None
    #: Runs it: an answer or a sync tool returns its result; an async call starts on its loop
    #: and returns None.
    run: Callable[[], Result | None]
    #: A sync tool: host code that the caller of ``submit`` runs where it chooses.
    inline: bool = False


#: The C slot behind ``cls.__name__``: a metaclass cannot make reading it run code.
_TYPE_NAME = type.__dict__["__name__"]


def _error_message(label: str, exc: BaseException) -> str:
    """A failed call's message from ``exc``: bounded, whatever its ``__str__`` does (raise,
    return something odd or 70 MB)."""
    text = _exception_text(exc)
    if isinstance(exc, Refused):
        return _bounded_error(f"tool {label}: {text}")
    kind = _TYPE_NAME.__get__(type(exc))
    return _bounded_error(f"tool {label} failed: {kind}: {text}" if text else f"tool {label} failed: {kind}")


def _exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # (its own __str__ raised, or returned a non-str)
        return "(its message could not be read)"
    # The base slice gives an exact str of bounded size, whatever a str subclass overrides.
    return str.__getitem__(text, slice(None, MAX_ERROR_CHARS + 1))


def _bounded_error(message: str) -> str:
    """``message`` cut to ``MAX_ERROR_CHARS``, its lone surrogates replaced (a frame must encode)."""
    message = catalog.bounded_text(message, MAX_ERROR_CHARS)
    return message if message.isascii() else message.encode("utf-8", "replace").decode("utf-8")


def _planning_failure(subject: str, exc: BaseException) -> str:
    """Why a call failed before it started: what a guest value did to decoding or checking it."""
    if isinstance(exc, RecursionError):
        return f"{subject}: input is nested too deeply"
    if isinstance(exc, MemoryError):
        return f"{subject}: input is too large for the host"
    return _bounded_error(f"{subject} failed: {_TYPE_NAME.__get__(type(exc))}: {_exception_text(exc)}")


def _fitted(entries: list[dict[str, Any]], rest: dict[str, Any]) -> str:
    """The catalog JSON of ``entries`` (plus ``rest``), within ``CATALOG_BUDGET_BYTES``."""
    text = _encode({"tools": entries, **rest})
    for step, chars in enumerate(_FIT_DESCRIPTION_CHARS):
        if len(text) <= CATALOG_BUDGET_BYTES:
            break
        for entry in entries:
            entry["description"] = catalog.bounded_text(entry["description"], chars)
            if step:
                entry.pop("parameters", None)
                entry.pop("outputSchema", None)
        text = _encode({"tools": entries, **rest})
    return text.decode()


def result_bytes(result: Result) -> int:
    """The UTF-8 size of a result's payload: what it adds to a settle frame (plus a few bytes
    of msgpack framing per result)."""
    return utf8_len(result[2])


def _admitted(result: Result) -> tuple[Result, int]:
    """``result`` as it may cross to a worker, with its size: a payload over the bridge limit
    becomes that call's error, an error message is bounded."""
    call_id, ok, payload = result
    if ok:
        size = result_bytes(result)
        if size <= MAX_BRIDGE_BYTES:
            return result, size
        payload = _OVER_BRIDGE
    failed = (call_id, False, _bounded_error(payload))
    return failed, result_bytes(failed)


#: A call's input not yet decoded from its JSON.
_UNDECODED: Any = object()


def _encode_result(label: str, value: Any) -> bytes | str:
    """A result's JSON, encoded once; or the message of the call's failure if it cannot cross."""
    try:
        payload = _encode_value(value)
    except RecursionError:
        return f"{label} returned a value that is nested too deeply for JSON"
    except (TypeError, ValueError, msgspec.EncodeError) as e:
        return f"{label} returned a value that is not JSON: {_exception_text(e)}"
    return _OVER_BRIDGE if len(payload) > MAX_BRIDGE_BYTES else payload


def _args(value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return ((), value) if isinstance(value, dict) else ((value,), {})


def _subject(tool_id: str) -> str:
    """How a failed call names what it called, before its tool is known."""
    if tool_id == MCP_TOOL:
        return "MCP call"
    if tool_id == NAMESPACE_TOOL:
        return "namespace call"
    return f"tool {catalog.bounded_text(tool_id, 200)}"


class Dispatcher:
    """Runs one run's tool calls and hands back ``(call_id, ok, payload)`` results.

    Finished calls land in a list; ``listener`` (the supervisor's, for runs) is told after each
    lands, on the thread that finished it, and ``wait_ready`` serves host-side calls.
    """

    def __init__(
        self,
        view: CatalogView,
        loop: Callable[[], asyncio.AbstractEventLoop],
        *,
        outputs: OutputStore | None = None,
        session_id: str = "",
        gate: Gate | None = None,
        read_only: bool = False,
        namespace_calls: CallTable | None = None,
        mcp_ops: McpOps | None = None,
        approvals: Approvals | None = None,
        run_id: str = "",
        agent_run: str | None = None,
    ) -> None:
        self.view = view
        #: Where `readOutput` reads this session's cut outputs (none: it knows no handle).
        self._outputs = outputs
        self._namespace_calls = namespace_calls or {}
        #: Resource and prompt requests of `MCP.<server>.resources/prompts` (no catalog tool).
        self._mcp_ops = mcp_ops
        self._loop = loop
        self._gate = gate or Gate()
        #: Read once: `Gate.is_async` inspects two callables, and every call asks.
        self._gate_is_async = self._gate.is_async
        self._gated = self._gate.hook is not None or self._gate.approve is not None
        #: Calls that wait for a later approval (a run's, in its journal); none can wait for one
        #: without it (host-side calls: such a call is refused).
        self._can_defer = approvals is not None
        self.approvals = approvals if approvals is not None else Approvals({})
        self.session_id = session_id
        #: The run these calls belong to and its agent run, for `ToolContext` (none: host-side calls).
        self.run_id = run_id
        self.agent_run = agent_run
        #: Restart-safe runs may only call read-only tools (they may be redone after a restart).
        self._read_only = read_only
        #: The exec/wait call the next calls belong to (for hooks and the trace).
        self.parent = ""
        #: Its OpenTelemetry span, the parent of the next calls' spans (None when untraced).
        self.span: tracing.RunSpan | None = None
        #: Namespace calls arrive under a marker id; this maps their call ids to the real tool.
        self.resolved: dict[int, str] = {}
        #: Results ready to hand over, each with its payload's size (`result_bytes`).
        self._ready: list[tuple[Result, int]] = []
        self._lock = threading.Lock()
        #: Set when results land, while `wait_ready` waits (host-side calls only).
        self._landed: threading.Event | None = None
        #: In-flight async calls: what cancels them (None until they are started).
        self._futures: dict[int, Callable[[], object] | None] = {}
        #: The loop each in-flight async call runs on.
        self._loops: dict[int, asyncio.AbstractEventLoop] = {}
        #: Told (with no arguments, outside the lock) after results land.
        self.listener: Callable[[], object] | None = None

    def _namespace_target(self, input_json: str) -> tuple[str, Any]:
        """Resolves a namespace function call to ``(tool id, tool input)``; raises ``Refused``."""
        try:
            request = _decode(input_json)
            key = (str(request["ns"]), str(request["path"]))
            args = request.get("args") or []
        except (msgspec.DecodeError, KeyError, TypeError):
            raise Refused("malformed namespace call") from None
        target = self._namespace_calls.get(key)
        if target is None:
            raise Refused(f"unknown namespace function {key[0]}:{key[1]}")
        tool_id, mapper = target
        if mapper is not None:
            return tool_id, mapper(list(args))
        return tool_id, args[0] if args else {}

    def submit(self, calls: list[tuple[int, str, str]]) -> Callable[[], None] | None:
        """Starts the calls: async ones on their loop; calls that fail before a tool runs are
        answered at once. Returns what runs the sync tools among them (each result lands as
        any other), for the caller to run on a thread of its choosing; None if there are none.

        Never raises: a guest value reaches the host here, and whatever decoding, mapping or
        checking it does (RecursionError, MemoryError, a mapper's own exception) fails its call."""
        plans = []
        for call in calls:
            call_id, tool_id, _ = call
            try:
                plan = self._plan(*call)
            except BaseException as e:  # the one guard over a guest value's way into the host
                plan = self._answer(call_id, None, _planning_failure(_subject(tool_id), e))
            if plan.resolved is not None:
                self.resolved[call_id] = plan.resolved
            plans.append((call_id, plan))
        return self._launch(plans)

    def release(self, decided: list[tuple[int, FiledCall, Any]]) -> Callable[[], None] | None:
        """Acts on the host's decisions (`Approvals.take_decided`): an approved call starts as
        `submit` starts a call (the run of its sync tool is returned), a rejected one fails."""
        plans = []
        for call_id, filed, decision in decided:
            if decision.ok:
                plans.append((call_id, _Plan(None, filed.run, inline=filed.inline)))
            else:
                span = self._call_span(call_id, filed.tool_id)
                self._record(call_id, filed.tool_id, time.perf_counter(), False, span)
                plans.append((call_id, _Plan(None, functools.partial(filed.refuse, decision.reason))))
        return self._launch(plans)

    def _launch(self, plans: list[tuple[int, _Plan]]) -> Callable[[], None] | None:
        inline: list[Callable[[], Result | None]] = []
        answered: list[Result] = []
        for call_id, plan in plans:
            if plan.inline:
                inline.append(plan.run)
                continue
            try:
                result = plan.run()
            except BaseException as e:  # its loop is closed or gone: it fails, nothing stays in flight
                with self._lock:
                    self._futures.pop(call_id, None)
                    self._loops.pop(call_id, None)
                result = (call_id, False, _error_message(plan.resolved or "call", e))
            if result is not None:
                answered.append(result)
        if answered:
            self.add_ready(answered)
        if not inline:
            return None
        return functools.partial(self._run_inline, inline)

    def _run_inline(self, runs: list[Callable[[], Result | None]]) -> None:
        results = [result for run in runs if (result := run()) is not None]
        self.add_ready(results)

    def _plan(self, call_id: int, tool_id: str, input_json: str) -> _Plan:
        """How one call starts (nothing is started or recorded here); `submit` guards it."""
        if tool_id == OUTPUT_TOOL:  # `readOutput`: answered here, from this session's outputs
            ok, payload = read_call(self._outputs, self.session_id, input_json)
            return _Plan("readOutput", lambda: (call_id, ok, payload))
        heavy = too_heavy(input_json)
        if heavy is not None:  # weighed before it is decoded
            return self._answer(call_id, None, f"{_subject(tool_id)}: input is too heavy for the host: {heavy}")
        via_mcp = tool_id == MCP_TOOL
        resolved = None
        args: Any = _UNDECODED
        if via_mcp:
            try:
                request = _decode(input_json)
                if "id" in request:
                    tool_id, args = str(request["id"]), request.get("input", {})
                else:
                    server, op, payload = str(request["server"]), str(request["op"]), request.get("input", {})
            except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
                return self._answer(call_id, None, "malformed MCP call")
            if "id" not in request:
                return self._plan_mcp_op(call_id, server, op, payload)
            resolved = tool_id
        if tool_id == NAMESPACE_TOOL:
            try:
                tool_id, mapped = self._namespace_target(input_json)
                args = _decode(_encode(mapped))  # the tool sees JSON, as from any other call
            except (RecursionError, MemoryError):
                raise  # a guest value the host cannot hold: `submit` says so
            except BaseException as e:  # refused, or the host's input mapper failed
                return self._answer(call_id, None, _error_message("namespace", e))
            resolved = tool_id
        tool = self.view.tools.get(tool_id)
        if tool is None and not via_mcp:
            # `tools.callValue("get_weather")`: an exact tool name stands for its one id.
            ids = self.view.by_name.get(tool_id, [])
            if len(ids) > 1:
                return self._answer(call_id, None, _ambiguous(tool_id, ids))
            if ids:
                tool_id = resolved = ids[0]
                tool = self.view.tools[tool_id]
        if tool is None or (tool.source == "mcp") != via_mcp:
            # Hidden, denied and absent tools answer alike: a guessed id learns nothing.
            return self._answer(call_id, resolved, unknown_tool(self.view, tool_id))
        if self._read_only and not tool.read_only:
            message = f"tool {tool_id} is not read-only: a restartSafe run may only call read-only tools"
            return self._answer(call_id, resolved, message)
        if self._read_only and self.view.needs_approval(tool):
            message = f"tool {tool_id} waits for approval: a restartSafe run may only call tools that need none"
            return self._answer(call_id, resolved, message)
        if args is _UNDECODED:
            try:
                args = _decode(input_json)
            except msgspec.DecodeError:
                return self._answer(call_id, resolved, f"tool {tool_id}: input is not valid JSON")
        if tool.source == "mcp":
            args, problem = with_defaults(tool.input_schema, args)
            if problem is not None:
                return self._answer(call_id, resolved, f"invalid input for tool {tool_id}: {problem}")
        if tool.check_input is not None and (tool.source == "host" or len(input_json) <= _UNTRUSTED_CHECK_CHARS):
            problem = tool.check_input(args)
            if problem is not None:
                return self._answer(call_id, resolved, f"invalid input for tool {tool_id}: {problem}")
        if tool.is_async or self._gate_is_async:
            return _Plan(resolved, lambda: self._start_async(call_id, tool, args))
        return _Plan(resolved, lambda: self._run_sync(call_id, tool, args), inline=True)

    def _gated_call(self, tool: Tool | _McpRequest) -> bool:
        """Whether a call of ``tool`` passes a hook or an approval at all."""
        return self._gated or self.view.needs_approval(tool)

    def _plan_mcp_op(self, call_id: int, server: str, op: str, payload: Any) -> _Plan:
        """An ``MCP.<server>.resources/prompts`` request: one the policy denies answers as one
        that does not exist; its input is checked against what the declarations promise
        (`mcp_api.check_op_input`), then it passes the hook and the approval as a tool call
        would (as `mcp_api.op_id`), and goes to the server."""
        ops = self._mcp_ops
        ident = self.view.mcp_servers.get(server)
        if ops is None or ident is None or op not in self.view.mcp_ops.get(server, ()):
            return self._answer(call_id, None, f"unknown MCP request {server}.{op}")
        problem = check_op_input(op, payload)
        if problem is not None:
            return self._answer(call_id, None, f"invalid input for MCP.{ident}.{op}: {problem}")
        request = _McpRequest(op_id(server, op), op_name(op), server)

        async def run() -> Any:
            try:
                gated = await self._gate_async(call_id, request, payload) if self._gated_call(request) else payload
            except Deferred as deferred:
                approved = functools.partial(ops, server, op, deferred.input)
                resume = functools.partial(self._start_coroutine, call_id, request.id, approved)
                refuse = functools.partial(_op_rejected, call_id, request.id)
                self._file(call_id, deferred, FiledCall(request.id, None, resume, False, refuse))
                return _FILED
            return await ops(server, op, gated)

        return _Plan(None, lambda: self._start_coroutine(call_id, request.id, run))

    def _answer(self, call_id: int, resolved: str | None, message: str) -> _Plan:
        """A call answered at once with an error ``message``."""
        return _Plan(resolved, lambda: (call_id, False, message))

    def _event(self, tool: Tool | _McpRequest, args: Any) -> ToolCallEvent:
        return ToolCallEvent(
            tool_id=tool.id,
            name=tool.name,
            source=tool.source,
            owner=tool.owner,
            input=args,
            session_id=self.session_id,
            parent=self.parent,
        )

    def _gate_sync(self, call_id: int, tool: Tool, args: Any) -> Any:
        """The input ``tool`` runs with; ``Blocked`` if the hook or the approval refuses it,
        ``Deferred`` if its approval comes later."""
        gate = self._gate
        if gate.hook is not None:
            args = apply_hook(gate.hook(self._event(tool, args)), args)  # type: ignore[arg-type]
        if self._already_decided(call_id):
            return args
        if gate.approve is not None:
            return _approved(args, gate.approve(self._event(tool, args)))  # type: ignore[arg-type]
        if self.view.needs_approval(tool):
            raise Deferred(args, args)
        return args

    async def _gate_async(self, call_id: int, tool: Tool | _McpRequest, args: Any) -> Any:
        """`_gate_sync` with callbacks that may be ``async``."""
        gate = self._gate
        if gate.hook is not None:
            decision = gate.hook(self._event(tool, args))
            if inspect.isawaitable(decision):
                decision = await decision
            args = apply_hook(decision, args)
        if self._already_decided(call_id):
            return args
        if gate.approve is not None:
            answer = gate.approve(self._event(tool, args))
            if inspect.isawaitable(answer):
                answer = await answer
            return _approved(args, answer)
        if self.view.needs_approval(tool):
            raise Deferred(args, args)
        return args

    def _already_decided(self, call_id: int) -> bool:
        """The journal holds the host's decision on this call (it is put to the gate again):
        True to run it without asking again; ``Blocked`` if it was rejected."""
        decision = self.approvals.recorded(call_id)
        if decision is None:
            return False
        if not decision.ok:
            raise _rejected(decision.reason)
        return True

    def _file(self, call_id: int, deferred: Deferred, filed: FiledCall) -> None:
        """Files a call for the host's decision: it stays in flight with no result, and its run
        suspends once nothing else runs (see `approvals`). ``Blocked`` where nothing can wait
        for an approval (a host-side call, a restartSafe run)."""
        if self._read_only:
            raise Blocked(_CANNOT_WAIT_SAFE)
        if not self._can_defer:
            raise Blocked(_CANNOT_WAIT)
        self.approvals.file(call_id, filed._replace(shown=shown_input(deferred.shown)))
        listener = self.listener
        if listener is not None:
            listener()  # (no result landed: the run may have nothing left but approvals)

    def _run_sync(self, call_id: int, tool: Tool, args: Any, gated: bool = False) -> Result | None:
        """Runs a sync tool (``gated``: its call has passed the gate); None if its approval
        comes later (the call is filed)."""
        started = time.perf_counter()
        span = self._call_span(call_id, tool.id)
        try:
            if not gated:
                args = self._gate_sync(call_id, tool, args)
            positional, keywords = self._arguments(call_id, tool, args)
            if span is None:
                value = tool.fn(*positional, **keywords)
            else:
                value = tracing.call_in(span, tool.fn, positional, keywords)
            result = self._finish(call_id, tool, value)
        except Blocked as e:
            result = _blocked_result(call_id, tool, e)
        except Deferred as deferred:
            resume = functools.partial(self._run_sync, call_id, tool, deferred.input, True)
            try:
                self._file(call_id, deferred, FiledCall(tool.id, None, resume, True, self._refusal(call_id, tool)))
                if span is not None:
                    tracing.end_call(span, "deferred", started)
                return None
            except Blocked as e:
                result = _blocked_result(call_id, tool, e)
        except BaseException as e:  # a hook or tool fails its own call, whatever it raises
            result = (call_id, False, _error_message(tool.id, e))
        self._record(call_id, tool.id, started, result[1], span)
        return result

    def _call_span(self, call_id: int, tool_id: str) -> Span | None:
        """A starting call's span, the child of the exec/wait span that starts it (`tracing`);
        None when untraced."""
        run_span = self.span
        return None if run_span is None else tracing.start_call(run_span, call_id, tool_id, self.run_id)

    def _arguments(self, call_id: int, tool: Tool, args: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments ``tool.fn`` is called with for the input ``args`` (`catalog.Parameters`),
        its ``ToolContext`` among them if it asks for one; ``InvalidInput`` if ``args`` (a hook's
        rewrite: the call's own input was checked when it was planned) does not convert."""
        parameters = tool.parameters
        if parameters is None:
            return _args(args)
        bound = parameters.bind(args)
        if isinstance(bound, str):
            raise InvalidInput(bound)
        positional, keywords = bound
        if parameters.context is not None:
            keywords[parameters.context] = ToolContext(
                session_id=self.session_id,
                tool_id=tool.id,
                agent_run=self.agent_run,
                run_id=self.run_id,
                call_id=call_id,
            )
        return positional, keywords

    def _refusal(self, call_id: int, tool: Tool) -> Callable[[str], Result]:
        """Answers ``tool``'s call as the host rejected it (with the reason given)."""
        return lambda reason: _blocked_result(call_id, tool, _rejected(reason))

    def _finish(self, call_id: int, tool: Tool, value: Any) -> Result:
        """Checks the output contract, then encodes; neither message echoes the value."""
        payload = _encode_result(f"tool {tool.id}", value)
        if isinstance(payload, str):
            return (call_id, False, payload)
        if tool.check_output is not None:
            problem = tool.check_output(_decode(payload))
            if problem is not None:
                return (call_id, False, f"tool {tool.id} returned a value that breaks its output contract: {problem}")
        return (call_id, True, payload.decode())

    def _record(self, call_id: int, tool_id: str, started: float, ok: bool, span: Span | None) -> None:
        if span is not None:
            tracing.end_call(span, "ok" if ok else "error", started)
        trace = self._gate.trace
        if trace is not None:
            trace.add(
                TraceEvent(
                    kind="tool_call",
                    id=f"{self.parent}/call_{call_id}",
                    session_id=self.session_id,
                    at=Trace.now(),
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                    parent=self.parent,
                    tool_id=tool_id,
                    status="ok" if ok else "error",
                )
            )

    def _start_async(self, call_id: int, tool: Tool, args: Any, gated: bool = False) -> None:
        """Starts a call of ``tool`` on its loop (``gated``: it has passed the gate)."""
        through_gate = not gated and self._gated_call(tool)

        async def call() -> Result | None:
            try:
                gated = await self._gate_async(call_id, tool, args) if through_gate else args
            except Blocked as blocked:
                return _blocked_result(call_id, tool, blocked)
            except Deferred as deferred:
                resume = functools.partial(self._start_async, call_id, tool, deferred.input, True)
                try:
                    refuse = self._refusal(call_id, tool)
                    self._file(call_id, deferred, FiledCall(tool.id, None, resume, False, refuse))
                except Blocked as blocked:
                    return _blocked_result(call_id, tool, blocked)
                return None
            positional, keywords = self._arguments(call_id, tool, gated)
            value = tool.fn(*positional, **keywords)
            if inspect.isawaitable(value):
                value = await value
            return self._finish(call_id, tool, value)

        self._start(call_id, tool.id, call, tool.loop)

    def _start_coroutine(self, call_id: int, label: str, make: Callable[[], Awaitable[Any]]) -> None:
        async def call() -> Result | None:
            value = await make()
            if value is _FILED:
                return None
            payload = _encode_result(label, value)
            if isinstance(payload, str):
                return (call_id, False, payload)
            return (call_id, True, payload.decode())

        self._start(call_id, label, call, None)

    def _start(
        self,
        call_id: int,
        label: str,
        call: Callable[[], Awaitable[Result | None]],
        loop: LoopRef | None,
    ) -> None:
        """Starts ``call`` on its loop (at once, as a task, when this is that loop's thread)."""
        started = time.perf_counter()
        span = self._call_span(call_id, label)

        async def guarded() -> None:
            if span is not None:
                tracing.enter(span)
            # Delivers from inside the task: no extra loop iterations for future callbacks.
            try:
                result = await call()
            except asyncio.CancelledError as e:
                with self._lock:
                    cancelled = call_id not in self._futures
                if cancelled:  # the host cancelled it (`cancel` forgets it first): nobody waits
                    if span is not None:
                        tracing.end_call(span, "cancelled", started)
                    raise
                # The tool raised it, or cancelled its own task: its call fails like any other.
                result = (call_id, False, _error_message(label, e))
            except BaseException as e:  # it fails its own call; the loop (shared) goes on
                result = (call_id, False, _error_message(label, e))
            if result is None:  # filed for approval: no longer running
                with self._lock:
                    self._futures.pop(call_id, None)
                    self._loops.pop(call_id, None)
                if span is not None:
                    tracing.end_call(span, "deferred", started)
                return
            self._deliver(call_id, label, started, result, span)

        target = (loop or self._loop)()
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        coro = guarded()
        if target is here:
            # No trip through the loop's self-pipe, one loop iteration less before it runs.
            task = target.create_task(coro)
            with self._lock:
                self._futures[call_id] = functools.partial(target.call_soon_threadsafe, task.cancel)
                self._loops[call_id] = target
            return
        with self._lock:
            self._futures[call_id] = None  # it may finish before run_coroutine_threadsafe returns
            self._loops[call_id] = target
        try:
            future = asyncio.run_coroutine_threadsafe(coro, target)
        except BaseException:
            coro.close()  # (never scheduled: its loop is closed)
            if span is not None:
                tracing.end_call(span, "error", started)
            raise
        with self._lock:
            if call_id in self._futures:
                self._futures[call_id] = future.cancel
                return
        future.cancel()  # cancelled meanwhile (a no-op if it was delivered already)

    def _deliver(self, call_id: int, label: str, started: float, result: Result, span: Span | None) -> None:
        self._record(call_id, label, started, result[1], span)
        with self._lock:
            if call_id not in self._futures:
                return  # cancelled
            del self._futures[call_id]
            self._loops.pop(call_id, None)
        self.add_ready([result])

    def add_ready(self, results: list[Result]) -> None:
        """Results to hand to the run (tools', or ``yield_control``'s); tells the listener.
        Every result passes here: one over the bridge limit becomes its call's error, and an
        error message is bounded (see `_admitted`), so no result can overflow a frame."""
        if not results:
            return
        admitted = [_admitted(result) for result in results]
        with self._lock:
            self._ready.extend(admitted)
            landed, listener = self._landed, self.listener
        if landed is not None:
            landed.set()
        if listener is not None:
            listener()

    def requeue(self, results: list[Result]) -> None:
        """Puts back results taken with ``take_ready`` that were never delivered (first, in
        their order; the listener is not told: whoever put them back goes on with them)."""
        sized = [(result, result_bytes(result)) for result in results]
        with self._lock:
            self._ready[:0] = sized

    def ready_bytes(self) -> int:
        """The UTF-8 size of the payloads of the results ready to hand over (see `result_bytes`)."""
        with self._lock:
            return sum(size for _, size in self._ready)

    def has_ready(self) -> bool:
        with self._lock:
            return bool(self._ready)

    def take_ready(self, max_bytes: int | None = None) -> list[Result]:
        """The ready results, in order; with ``max_bytes``, only the first ones whose payloads
        total at most that (and at least one): the rest stay ready for the next frame."""
        with self._lock:
            if max_bytes is None:
                taken, self._ready = self._ready, []
            else:
                count, total = 0, 0
                for _, size in self._ready:
                    total += size
                    if count and total > max_bytes:
                        break
                    count += 1
                taken, self._ready = self._ready[:count], self._ready[count:]
        return [result for result, _ in taken]

    def wait_ready(self, deadline: float) -> list[Result]:
        """The results ready now or, if none, the first to finish before ``deadline``
        (``time.monotonic``); empty if nothing is running or the deadline passes."""
        landed = self._landed = threading.Event()
        while True:
            with self._lock:
                if self._ready or not self._futures:
                    ready, self._ready = self._ready, []
                    return [result for result, _ in ready]
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return []
            landed.wait(timeout)
            landed.clear()

    def pending(self) -> int:
        with self._lock:
            return len(self._futures)

    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The one event loop every in-flight call runs on (with none ready); else None."""
        with self._lock:
            if self._ready:
                return None
            loops = set(self._loops.values())
        return loops.pop() if len(loops) == 1 else None

    def cancel(self) -> None:
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
            self._loops.clear()
            landed = self._landed
        if landed is not None:
            landed.set()
        for cancel in futures:
            if cancel is not None:
                try:
                    cancel()
                except RuntimeError:
                    pass  # its loop is closed: the call is gone with it

    def close(self) -> None:
        """Cancels what is in flight and tells no one of results from now on."""
        self.listener = None
        self.cancel()
