"""Internal namespaces: compact plugin-owned domain APIs inside the cell (``Issues.list(...)``).

A trusted loader registers a namespace for a plugin; a run sees it only if every tool it needs is
in that run's catalog and owned by the same plugin (``sourceName``/owner). Its scope is built per
run by ``create_scope(ctx)`` and may hold only JSON-compatible data and ``namespace_tool(...)``
markers, which become guest functions: calling one is a catalog tool call (the same policy,
hooks, approval, trace and suspend/resume as ``tools.call``). Raw host functions, cycles and
unsafe keys are refused before any guest code runs.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .catalog import MAX_DESCRIPTION_CHARS, bounded_text
from .errors import ToolDefinitionError

__all__ = ["MAX_SCOPE_BYTES", "NamespaceRegistration", "NamespaceTool", "Namespaces", "ScopeContext", "namespace_tool"]

_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
#: Globals the guest API owns; a namespace can never take one of these names.
RESERVED_GLOBALS = frozenset(
    {
        "tools", "namespaces", "text", "json", "yield_control", "MCP", "API", "ALL_TOOLS", "console",
        "searchTools", "describeTool", "describeNamespace", "store", "load", "exit", "image",
        "models", "agents", "phase", "log", "readOutput",
        "globalThis", "Object", "Array", "Function", "Promise", "JSON", "Math", "Date", "Error",
        "Reflect", "Proxy", "Symbol", "String", "Number", "Boolean", "BigInt", "RegExp", "Map", "Set",
        "eval", "undefined", "NaN", "Infinity",
    }
)  # fmt: skip
_UNSAFE_KEYS = frozenset({"__proto__", "constructor", "prototype"})


@functools.cache
def guest_globals() -> frozenset[str]:
    """Every name already on a guest's ``globalThis`` (builtins and the prelude's API, e.g.
    ``codemode``), read once from a real engine: a namespace may take none of them."""
    from ._engine import Catalog, Engine

    engine = Engine(
        catalog=Catalog('{"tools": [], "api": {}}'),
        memory_limit_bytes=16 << 20,
        max_output_bytes=1 << 20,
        max_pending_calls=1,
    )
    outcome = engine.start("return Object.getOwnPropertyNames(globalThis)", "javascript", 5000.0, 0, "{}")
    assert outcome.status == "completed" and outcome.value is not None, (outcome.status, outcome.failure)
    return frozenset(msgspec.json.decode(outcome.value))


_MAX_DEPTH = 32
#: JSON bytes of one run's scope of a namespace: it crosses to the worker with every run that
#: sees the namespace, so a bigger one is refused at registration and hidden at run time.
MAX_SCOPE_BYTES = 1 << 20


class NamespaceTool(msgspec.Struct, frozen=True):
    """A scope member that calls a catalog tool. ``input_mapper(args)`` turns the guest's
    arguments into the tool input; without one, the first argument (or ``{}``) is the input."""

    tool_name: str
    input_mapper: Callable[[list[Any]], Any] | None = None


def namespace_tool(tool_name: str, input_mapper: Callable[[list[Any]], Any] | None = None) -> NamespaceTool:
    """Marks a scope member as a callable namespace function backed by ``tool_name``."""
    return NamespaceTool(tool_name, input_mapper)


class ScopeContext(msgspec.Struct, frozen=True, kw_only=True):
    """What ``create_scope`` learns about the run it builds a scope for: its session, its agent
    run (None when the session has none) and its run id (the ``runId`` a ``waiting`` result
    gives, so a plugin can key per-run state). The probe at registration has empty ids."""

    session_id: str
    plugin_id: str
    agent_run: str | None = None
    run_id: str = ""
    config: Mapping[str, Any] = msgspec.field(default_factory=dict)


class NamespaceRegistration(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    global_name: str
    description: str
    required_tool_names: tuple[str, ...]
    create_scope: Callable[[ScopeContext], Mapping[str, Any]]
    prompt: str | None = None
    config: Mapping[str, Any] = msgspec.field(default_factory=dict)


class _Registered(msgspec.Struct, frozen=True):
    plugin_id: str
    registration: NamespaceRegistration


#: For one run: (namespace id, path) -> (tool id, input mapper)
CallTable = dict[tuple[str, str], tuple[str, Callable[[list[Any]], Any] | None]]


def _serialize(
    value: Any, path: str, required: tuple[str, ...], markers: dict[str, NamespaceTool], stack: list[int]
) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, NamespaceTool):
        if value.tool_name not in required:
            raise ToolDefinitionError(f"namespace path {path!r} targets undeclared tool {value.tool_name!r}")
        markers[path] = value
        return {"$call": path}
    if callable(value):
        raise ToolDefinitionError(
            f"namespace path {path!r} is a raw host function; wrap the catalog tool with namespace_tool()"
        )
    if len(stack) >= _MAX_DEPTH:
        raise ToolDefinitionError(f"namespace scope is nested too deeply at {path!r}")
    if id(value) in stack:
        raise ToolDefinitionError(f"namespace scope has a cycle at {path!r}")
    stack.append(id(value))
    try:
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str) or not key.strip() or key in _UNSAFE_KEYS or "." in key or "/" in key:
                    raise ToolDefinitionError(f"namespace scope has an unsafe key {key!r} at {path or '<root>'!r}")
                out[key] = _serialize(item, f"{path}.{key}" if path else key, required, markers, stack)
            return out
        if isinstance(value, (list, tuple)):
            return [_serialize(item, f"{path}.{i}", required, markers, stack) for i, item in enumerate(value)]
    finally:
        stack.pop()
    # Not JSON: a JSON-safe stand-in, never the host object.
    return str(value)


class Namespaces:
    """Process-local namespace registrations, keyed by namespace id."""

    def __init__(self) -> None:
        self._items: dict[str, _Registered] = {}
        self._lock = threading.Lock()

    def register(self, plugin_id: str, registration: NamespaceRegistration) -> None:
        name = registration.global_name
        taken = name in RESERVED_GLOBALS or name in guest_globals() or name.startswith("__openclaw")
        if not _IDENTIFIER.match(name) or taken:
            raise ToolDefinitionError(f"namespace globalName {name!r} is not a free JavaScript identifier")
        if not registration.id.strip():
            raise ToolDefinitionError("namespace id must not be empty")
        if not registration.required_tool_names:
            raise ToolDefinitionError(f"namespace {registration.id!r} must name the tools it requires")
        # Probe the scope once now: raw functions, cycles and bad keys are refused at registration.
        probe = ScopeContext(session_id="", plugin_id=plugin_id, config=registration.config)
        scope = _serialize(registration.create_scope(probe), "", registration.required_tool_names, {}, [])
        size = len(msgspec.json.encode(scope))
        if size > MAX_SCOPE_BYTES:
            why = f"its scope is {size} bytes of JSON, over the {MAX_SCOPE_BYTES}-byte limit"
            raise ToolDefinitionError(f"namespace {registration.id!r}: {why}")
        # Every run that sees it carries its text, as a tool's description (bounded alike).
        registration = msgspec.structs.replace(
            registration,
            description=bounded_text(registration.description, MAX_DESCRIPTION_CHARS),
            prompt=bounded_text(registration.prompt, MAX_DESCRIPTION_CHARS) if registration.prompt else None,
        )
        with self._lock:
            held = self._items.get(registration.id)
            if held is not None and held.plugin_id != plugin_id:
                # Only its own plugin may replace a namespace (e.g. on reload), never another.
                raise ToolDefinitionError(
                    f"namespace id {registration.id!r} is already registered by plugin {held.plugin_id!r}"
                )
            for other in self._items.values():
                if other.registration.global_name == name and other.registration.id != registration.id:
                    raise ToolDefinitionError(f"namespace globalName {name!r} is taken by {other.registration.id!r}")
            self._items[registration.id] = _Registered(plugin_id, registration)

    def clear(self, plugin_id: str) -> int:
        """Removes every namespace of ``plugin_id`` (plugin unloaded or rolled back)."""
        with self._lock:
            gone = [k for k, v in self._items.items() if v.plugin_id == plugin_id]
            for key in gone:
                del self._items[key]
        return len(gone)

    def visible(self, tools: Mapping[str, Any]) -> list[_Registered]:
        """Registrations whose required tools are all in the catalog and owned by the plugin."""
        if not self._items:
            return []
        by_name: dict[str, list[Any]] = {}
        for tool in tools.values():
            by_name.setdefault(tool.name, []).append(tool)
        with self._lock:
            items = sorted(self._items.values(), key=lambda r: r.registration.id)
        return [
            item
            for item in items
            if all(
                any(t.owner == item.plugin_id and t.source == "host" for t in by_name.get(required, ()))
                for required in item.registration.required_tool_names
            )
        ]

    def prompts(self, tools: Mapping[str, Any]) -> list[str]:
        """The description and prompt of each visible namespace, for the ``exec`` description."""
        out = []
        for item in self.visible(tools):
            reg = item.registration
            out.append(f"- {reg.global_name}: {reg.description}" + (f" {reg.prompt}" if reg.prompt else ""))
        return out

    def build(
        self, tools: Mapping[str, Any], *, session_id: str, agent_run: str | None, run_id: str
    ) -> tuple[list[dict[str, Any]], CallTable]:
        """The run's namespace descriptors (for the engine) and its call table."""
        descriptors: list[dict[str, Any]] = []
        table: CallTable = {}
        for item in self.visible(tools):
            reg = item.registration
            ctx = ScopeContext(
                session_id=session_id, plugin_id=item.plugin_id, agent_run=agent_run, run_id=run_id, config=reg.config
            )
            markers: dict[str, NamespaceTool] = {}
            try:
                scope = _serialize(reg.create_scope(ctx), "", reg.required_tool_names, markers, [])
                hidden = len(msgspec.json.encode(scope)) > MAX_SCOPE_BYTES
            except Exception:
                hidden = True
            if hidden:
                # A scope that fails or breaks the rules at run time is hidden for this run, never
                # half-installed, and never takes the other cells of the CodeMode down with it.
                continue
            owned = {t.name: t.id for t in tools.values() if t.owner == item.plugin_id and t.source == "host"}
            for path, marker in markers.items():
                table[(reg.id, path)] = (owned[marker.tool_name], marker.input_mapper)
            descriptors.append(
                {
                    "id": reg.id,
                    "globalName": reg.global_name,
                    "description": reg.description,
                    "prompt": reg.prompt,
                    "tools": sorted(markers),
                    "scope": scope,
                }
            )
        return descriptors, table
