"""Host tools: defining them, the registry, and the catalog view one run may see and call.

How a run's calls are run is `dispatch` (planned by `call_planning`, gated by `call_gate`, run
by `call_running`, their results in `call_results`); this module holds what they run.

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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from . import _engine, catalog
from .call_results import MAX_BRIDGE_BYTES, MAX_ERROR_CHARS, result_bytes
from .call_running import ToolContext
from .errors import ToolDefinitionError
from .hotloop import HotLoop
from .mcp_api import MCP_OPS, declarations, mcp_names, op_id, op_name, tool_declaration
from .policy import Policy

if TYPE_CHECKING:
    from .call_gate import HostRequest

__all__ = [
    "MAX_BRIDGE_BYTES",
    "MAX_ERROR_CHARS",
    "BackgroundLoop",
    "CatalogView",
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
#: The tool ids namespace calls, ``MCP.*`` calls, ``readOutput(handle, {offset, limit})`` calls
#: (`codemode.outputs`), ``models.*`` calls (`codemode.models`) and ``agents.run`` calls
#: (`codemode.agents`) arrive under: the engine's (engine.rs, handed to prelude.js too).
NAMESPACE_TOOL = _engine.NAMESPACE_TOOL
MCP_TOOL = _engine.MCP_TOOL
OUTPUT_TOOL = _engine.OUTPUT_TOOL
MODELS_TOOL = _engine.MODELS_TOOL
AGENTS_TOOL = _engine.AGENTS_TOOL
_encode = msgspec.json.encode
_log = logging.getLogger(__name__)
#: Characters of an unreachable MCP server's reason in the catalog.
_MAX_REASON_CHARS = 1000
#: The most a run catalog may take as JSON: it goes to each worker in one frame, under
#: ``protocol.MAX_FRAME_BYTES``. Past it, descriptions are cut and full schemas dropped (the
#: compact hints stay) until it fits: many large tools make a terse catalog, not a failed exec.
CATALOG_BUDGET_BYTES = 16 << 20
#: What `_fitted` cuts descriptions to, in turn, and from which step it drops full schemas.
_FIT_DESCRIPTION_CHARS = (1024, 1024, 160)


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
        # (An input converted to the parameters is checked by that conversion: `CallPlanner._checked_input`.)
        converts = parameters is not None and parameters.converts
        check_input = None if converts else catalog.compile_input_validator(input_schema, trusted=trusted)
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
    return None if problem is None else hinted(problem, hint)


def hinted(problem: str, hint: str) -> str:
    """``problem`` with the input the tool takes (when that is known)."""
    return problem if hint == "unknown" else f"{problem}. It takes {hint}"


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

    def needs_approval(self, tool: Tool | HostRequest) -> bool:
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

    def reached(self, name: str) -> Tool | list[str]:
        """The tool a call naming ``name`` reaches: the one with that catalog id, or the one
        tool with that exact name (``tools.callValue("get_weather")``, MCP tools aside); else
        the ids the name has (none, or several: it is ambiguous)."""
        tool = self.tools.get(name)
        if tool is not None:
            return tool
        ids = self.by_name.get(name, [])
        return self.tools[ids[0]] if len(ids) == 1 else ids

    @functools.cached_property
    def index(self) -> _engine.Catalog:
        """The search the guest runs (the same entries, MCP aside), for the names an unknown
        id's error suggests."""
        return _engine.Catalog(self.catalog_json)


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
        #: Called (outside the lock) after each change: `CodeMode` re-primes idle workers.
        self.on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

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
        self._changed()

    def add(self, tool: Tool) -> Tool:
        with self._lock:
            if tool.id in self._tools:
                raise ToolDefinitionError(f"a tool with id {tool.id!r} is already registered")
            self._tools[tool.id] = tool
            self.version += 1
        self._changed()
        return tool

    def remove(self, tool_id: str) -> bool:
        with self._lock:
            found = self._tools.pop(tool_id, None) is not None
            if found:
                self.version += 1
        if found:
            self._changed()
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
        cached = self._views.get(policy)  # (one read of the cache: no lock while it is current)
        if cached is not None and cached[0] == self.version:
            return cached[1]
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
    `call_running.CallRunner._start`), and a ``SystemExit``/``KeyboardInterrupt`` that a tool's own callback
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
