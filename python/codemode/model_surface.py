"""What the model is given and what its calls of the structured surfaces do: the tool
definitions of each surface (`codemode.surfaces` holds their schemas), the ``exec`` description
with its quick index, and the host side of ``tool_search``/``tool_describe``/``tool_call`` and of a
direct tool.

The cell surfaces (``exec``, ``wait``, ``tool_search_code``) run cells (`codemode.runner`); the
structured ones are answered here, in the host, from the same catalog a run gets::

    model_tools(surface) ──catalog()──> control tools + exec_description() + direct/likely tools
    Session.handle(name, args) ──exec | wait | tool_search_code──> Runner
                               └─ anything else ──handle_catalog──> search_catalog() (Rust index)
                                                                 └─ call_tool ──Dispatcher──> the tool

A host-side call goes through the gate (hook, policy, approvals) as a cell's nested call does; it
can never wait for a person (a call that needs one is refused rather than left waiting).
"""

from __future__ import annotations

import collections
import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import msgspec

from . import catalog, semantic
from ._engine import Catalog
from .call_gate import Gate
from .call_planning import NO_HOST_APIS, HostApis
from .catalog import quick_index
from .config import CodeModeConfig
from .dispatch import Dispatcher
from .errors import ConfigError
from .mcp_listing import McpListing
from .namespaces import Namespaces
from .surfaces import (
    SURFACES,
    ModelTool,
    Surface,
    control_tools,
    directory_listing,
    payload_bytes,
    provider_schema,
)
from .tools import MCP_TOOL, BackgroundLoop, CatalogView, ToolRegistry

__all__ = ["EXEC_PREAMBLE", "LIKELY_SCHEMAS", "MODEL_VISIBLE_TOOLS", "ModelSurface"]

#: What the code surface always shows the model (with the direct-only tools the policy allows).
MODEL_VISIBLE_TOOLS = ("exec", "wait")
#: Catalog schemas the `directory` surface exposes directly for a `likely` request.
LIKELY_SCHEMAS = 3

EXEC_PREAMBLE = """Run a JavaScript or TypeScript cell (an async function body: top-level await and return) \
against the hidden tool catalog. In the cell: `await tools.search(query, {limit})` -> compact entries; \
`await tools.describe(id)` -> full schemas; `await tools.callValue(id, input)` -> the tool's value (an exact \
id, or an unambiguous tool name); `tools.<name>(input)` for unambiguous names; `ALL_TOOLS`; `text(v)`, \
`json(v)`, `console.log` for output; `await yield_control(reason)` to hand control back (it resolves to \
the `answer` the next `wait` gives). MCP tools are \
`await MCP.<server>.<tool>({...})`: read their declarations with `await API.list("mcp")` and \
`await API.read("mcp/<server>.d.ts")`. There is no `import`, `require`, file system, network or timer: \
everything goes through these. Return one compact JSON value. If the result says `waiting`, call `wait` \
with its runId. An arrow `-> ?` means the output shape is unknown: return the raw value first instead of \
guessing field names.
Catalog (id input -> output):"""


#: What the exec description says of ``models`` (only when the host has model providers).
MODELS_NOTE = """
Models: `await models.getAvailableOfType("classifier" | "image" | "chat", provider?)` lists model objects \
({provider, id}); `await models.classify(model, {state, questions: {key: {type: "choice" | "score" | "bool", \
instructions, criteria}}, images?})` and `await models.generateImages(model, {input: [{type: "text", text}]})` \
resolve to results with `stopReason` ("stop" | "error" | "aborted"), `errorMessage`, and `answers` or `output` \
(pass image parts to `image(part)`). At most 4 run at once."""
#: What the exec description says of Swarm (only when the host runs sub-agents).
AGENTS_NOTE = """
Sub-agents: `await agents.run(prompt, options?)` runs one and resolves to its structured result; fan out \
with `Promise.all`. `phase(name)` and `log(...)` report progress to the host."""


def _provider_name(name: str) -> str:
    """Tool names providers accept: ``[A-Za-z0-9_-]{1,64}``."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return cleaned or "tool"


class ModelSurface:
    """The model-facing side of a ``CodeMode``: its tool definitions and the structured
    surfaces' calls. ``catalog`` gives the catalog a run would get now (the policy can change);
    ``call_ids`` numbers host-side calls in the trace, with the runs' execs and waits."""

    def __init__(
        self,
        config: CodeModeConfig,
        registry: ToolRegistry,
        catalog: Callable[[], CatalogView],
        namespaces: Namespaces,
        loop: BackgroundLoop,
        gate: Gate,
        mcp: McpListing,
        call_ids: itertools.count[int],
        apis: Callable[[], HostApis] = lambda: NO_HOST_APIS,
    ) -> None:
        self._config = config
        self._registry = registry
        self._catalog = catalog
        self._namespaces = namespaces
        self._loop = loop
        self._gate = gate
        self._mcp = mcp
        self._call_ids = call_ids
        #: The ``models.*`` providers and agent runner cells reach now (`HostApis`).
        self._apis = apis
        self._host_catalog: tuple[str, Catalog] | None = None

    def exec_description(self, *, max_index_chars: int = 4000) -> str:
        """`CodeMode.exec_description`."""
        view = self._catalog()
        entries = [t.entry() for t in view.tools.values()]
        text = EXEC_PREAMBLE + "\n" + quick_index(entries, max_chars=max_index_chars)
        if view.mcp_servers:
            # The spec: the model learns of the MCP API from this description and reads only
            # the declarations it needs (MCP tools are not in the index, search or ALL_TOOLS).
            counts = collections.Counter(t.owner for t in view.tools.values() if t.source == "mcp")
            servers = ", ".join(f"MCP.{ident} ({counts[server]})" for server, ident in view.mcp_servers.items())
            text += (
                f"\nMCP servers (tools): {servers}. Call `await MCP.<server>.<tool>({{...}})`; read the "
                "declarations first: `await API.read('mcp/index.d.ts')`, `await API.read('mcp/<server>.d.ts')` "
                "or `await MCP.<server>.$api(toolName)`."
            )
        prompts = self._namespaces.prompts(view.tools)
        if prompts:
            text += "\nNamespaces (globals in the cell):\n" + "\n".join(prompts)
        setup = self._apis().setup
        if "models" in setup:
            text += MODELS_NOTE
        if "agents" in setup:
            text += AGENTS_NOTE
        return text

    def model_tools(
        self, surface: Surface = "code", *, disable_tools: bool = False, likely: str | None = None
    ) -> list[ModelTool]:
        """`CodeMode.model_tools`."""
        if surface not in SURFACES:
            raise ConfigError(f"unknown surface {surface!r}; one of {', '.join(SURFACES)}")
        if disable_tools:
            return []
        view = self._catalog()
        direct_only = [
            ModelTool(t.name, t.description, provider_schema(t.input_schema or {"type": "object"}))
            for t in self._registry.all()
            if t.direct_only and t.name in view.direct
        ]
        if not self._config.enabled or not (view.tools or self._apis().setup) or surface == "direct":
            return [*self._direct_tools(view).values(), *direct_only]
        directory = ""
        likely_tools: list[ModelTool] = []
        if surface == "directory":
            directory = directory_listing([(t.id, t.description) for t in view.tools.values()])
            names = {tool_id: name for name, tool_id in self._direct_names(view).items()}
            # The tool-search spec: client-provided tools stay directly visible in this mode,
            # and a few likely catalog schemas may join them.
            shown = [tool_id for tool_id, tool in view.tools.items() if tool.source == "client"]
            if likely:
                hits = msgspec.json.decode(self.search_catalog().search(likely, LIKELY_SCHEMAS))
                shown += [h["id"] for h in hits if h["id"] in names and h["id"] not in shown]
            likely_tools = [
                ModelTool(
                    names[tool_id],
                    view.tools[tool_id].description,
                    provider_schema(view.tools[tool_id].input_schema or {}),
                )
                for tool_id in shown
                if tool_id in names
            ]
        return [*control_tools(surface, self.exec_description(), directory), *likely_tools, *direct_only]

    def payload_telemetry(self) -> dict[str, int]:
        """`CodeMode.payload_telemetry`."""
        return {surface: payload_bytes(self.model_tools(surface)) for surface in SURFACES}

    def _direct_names(self, view: CatalogView) -> dict[str, str]:
        """Provider-safe unique names for the catalog tools: name -> catalog id."""
        out: dict[str, str] = {}
        for tool in view.tools.values():
            name = _provider_name(tool.name)
            if name in out:
                name = _provider_name(f"{tool.owner}__{tool.name}")
            out[name] = tool.id
        return out

    def _direct_tools(self, view: CatalogView) -> dict[str, ModelTool]:
        """Every catalog tool as its own definition, under its provider-safe name."""
        return {
            name: ModelTool(
                name,
                view.tools[tool_id].description,
                provider_schema(view.tools[tool_id].input_schema or {"type": "object"}),
            )
            for name, tool_id in self._direct_names(view).items()
        }

    def direct_target(self, name: str) -> str | None:
        """The catalog id behind a direct-surface tool name (or a direct-only tool)."""
        view = self._catalog()
        for tool in self._registry.all():
            if tool.direct_only and tool.name == name and name in view.direct:
                return tool.id
        return self._direct_names(view).get(name)

    def search_catalog(self) -> Catalog:
        """The run catalog for the structured tool-search surface (MCP tools included, by id)."""
        view = self._catalog()
        cached = self._host_catalog
        if cached is None or cached[0] != view.fingerprint:
            cached = self._host_catalog = (
                view.fingerprint,
                Catalog(view.catalog_json, include_mcp=True, semantic=semantic.model()),
            )
        return cached[1]

    def tool_call_refusal(self, tool_id: str) -> str | None:
        """Why the tool-search surface's ``tool_call`` does not run ``tool_id``, or None: a
        direct-only tool is one of the model's own tools, to call directly; any other id it
        cannot see is unknown (hidden and absent alike), to look up with ``tool_search``."""
        view = self._catalog()
        if tool_id in view.tools:
            return None
        shown = catalog.bounded_text(tool_id, 200)
        for tool in self._registry.all():
            if tool.direct_only and tool.name in view.direct and tool_id in (tool.id, tool.name):
                return f"tool {shown} is direct-only: call your `{tool.name}` tool directly, not through tool_call."
        return f"unknown tool: {shown}. Find exact ids with tool_search (then tool_describe for the input)."

    def call_tool(self, session_id: str, tool_id: str, args: Any) -> dict[str, Any]:
        """`CodeMode.call_tool`."""
        view = self._catalog()
        registry_tool = self._registry.get(tool_id)
        if registry_tool is not None and registry_tool.direct_only and registry_tool.name in view.direct:
            view = msgspec.structs.replace(view, tools={**view.tools, tool_id: registry_tool})
        dispatcher = Dispatcher(view, self._loop.get, session_id=session_id, gate=self._gate, mcp_ops=self._mcp.op)
        dispatcher.parent = f"call_{next(self._call_ids)}"
        tool = view.tools.get(tool_id)
        try:  # the model's arguments: as hostile as a guest's
            if tool is not None and tool.source == "mcp":
                call = (1, MCP_TOOL, msgspec.json.encode({"id": tool_id, "input": args or {}}).decode())
            else:
                call = (1, tool_id, msgspec.json.encode(args if args is not None else {}).decode())
        except (TypeError, ValueError, RecursionError, MemoryError) as e:
            return {"tool": tool_id, "error": f"tool arguments are not JSON the host can carry: {type(e).__name__}"}
        inline = dispatcher.submit([call])
        if inline is not None:
            inline()  # a sync tool: here, on the caller's thread
        try:
            results = dispatcher.wait_ready(time.monotonic() + self._config.timeout_ms / 1000.0)
        finally:
            dispatcher.close()
        if not results:
            return {"tool": tool_id, "error": "tool call timed out"}
        _, ok, text = results[0]
        return {"tool": tool_id, "result": msgspec.json.decode(text)} if ok else {"tool": tool_id, "error": text}

    def handle_catalog(self, session_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """The structured surfaces' calls: ``tool_search``, ``tool_describe``, ``tool_call``, and
        a direct (or direct-only) tool by its name."""
        if name == "tool_search":
            query = args.get("query")
            limit = args.get("limit", self._config.search_default_limit)
            if not isinstance(query, str) or not isinstance(limit, int):
                return {"error": "tool_search needs a `query` string and an optional integer `limit`"}
            limit = min(max(limit, 1), self._config.max_search_limit)
            return {"results": msgspec.json.decode(self.search_catalog().search(query, limit))}
        if name == "tool_describe":
            found = self.search_catalog().describe(str(args.get("id", "")))
            return msgspec.json.decode(found) if found is not None else {"error": f"unknown tool: {args.get('id')}"}
        if name == "tool_call":
            tool_id = str(args.get("id", ""))
            refused = self.tool_call_refusal(tool_id)
            if refused is not None:
                return {"tool": tool_id, "error": refused}
            return self.call_tool(session_id, tool_id, args.get("args", {}))
        target = self.direct_target(name)
        if target is not None:
            return self.call_tool(session_id, target, args)
        return {"error": f"unknown tool: {name}"}
