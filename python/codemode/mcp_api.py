"""What guest code sees of MCP servers: ``MCP.<server>.<tool>`` names, the ``API`` files, and
the inputs a careful MCP client sends.

**Identifiers.** MCP names are often not JavaScript identifiers (``get-sum``, ``chrome-devtools``),
so each server and tool gets a camelCase identifier, deterministically: the catalog order decides
who keeps a contested identifier, later ones get a digit appended (``getSum2``, ``getSum3``…),
and so do names that are reserved words or ``Object.prototype`` names (``delete`` -> ``delete2``,
``constructor`` -> ``constructor2``), the reference's scheme: the declaration files stay valid
TypeScript, and a member never reads as something every object inherits. The files name both the
identifier and the original name.

**Declarations.** ``mcp/index.d.ts`` references each server's ``mcp/<server>.d.ts`` and declares
``MCP.$api()``; they are rendered from the tools' metadata once per catalog, for the visible
servers only, and served inside the worker: reading them is never a tool call. Shared types are
interfaces, so the files taken together (as ``index.d.ts``'s references take them) declare each
once. Input types are rendered here as TypeScript, not as the catalog's compact hints: a hint may
fold (``{ … }``) to stay short, a declaration must parse; it bounds its size by depth instead.

**Inputs.** An MCP tool's input is completed the way a careful client completes it before a
server sees it (`with_defaults`): top-level ``default``s fill omitted properties, then missing
required ones are refused by name.

**Requests.** ``MCP.<server>.resources.list/read`` and ``prompts.list/get`` are not catalog
tools, but policy, hooks and approvals see them as ``mcp:<server>:resources/list`` (the MCP
method, `op_id`), a name no conforming MCP tool can take (tool names are ``[A-Za-z0-9_.-]``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from .catalog import (
    array_of,
    compile_input_validator,
    inline_refs,
    schema_properties,
    schema_required,
    tuple_form,
    type_union,
)

__all__ = [
    "INDEX_PATH",
    "MCP_OPS",
    "McpNames",
    "camel_ident",
    "check_op_input",
    "declarations",
    "input_type",
    "mcp_names",
    "op_id",
    "op_name",
    "tool_declaration",
    "with_defaults",
]

_WORD = re.compile(r"[A-Za-z0-9]+")
#: Words a declaration cannot bind (``.d.ts`` files are strict code): JavaScript's reserved
#: words, strict mode's, and the names strict code may not bind.
_RESERVED_WORDS = frozenset(
    "break case catch class const continue debugger default delete do else enum export extends false finally for"
    " function if import in instanceof new null return super switch this throw true try typeof var void while with"
    " implements interface let package private protected public static yield await arguments eval".split()
)
#: Names every object inherits (and ``prototype``): as members they would read as the inherited
#: thing, to a reader and to code that forgets the ``MCP`` objects have no prototype.
_OBJECT_NAMES = frozenset(
    "constructor prototype __proto__ hasOwnProperty isPrototypeOf propertyIsEnumerable toLocaleString toString"
    " valueOf __defineGetter__ __defineSetter__ __lookupGetter__ __lookupSetter__".split()
)
_ESCAPED = _RESERVED_WORDS | _OBJECT_NAMES
#: Members every server object has: tools never take them.
_SERVER_MEMBERS = frozenset({"$api", "resources", "prompts"})
#: ``MCP.<server>.resources/prompts`` requests, as the guest names them.
MCP_OPS = ("resources.list", "resources.read", "prompts.list", "prompts.get")
#: Characters of a parameter name, and of its folded description, in a declaration's JSDoc.
_MAX_PARAM_CHARS = 100
_MAX_PARAM_DOC_CHARS = 300
_MAX_PARAM_DOCS = 32
_MAX_DOC_LINES = 12
#: Bounds of a rendered input type: nesting, union members, fields per object, and the whole
#: signature (past it, deeper levels become ``unknown``; past that, ``Record<string, unknown>``).
_MAX_TYPE_DEPTH = 8
_MAX_MEMBERS = 16
_MAX_FIELDS = 64
_MAX_SIGNATURE_CHARS = 4000
_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_PRIMITIVES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}


class _McpTool(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def input_schema(self) -> dict[str, Any] | None: ...
    @property
    def declared_output_schema(self) -> dict[str, Any] | None: ...


def camel_ident(name: str) -> str:
    """``get-sum`` -> ``getSum``, ``chrome-devtools`` -> ``chromeDevtools``, ``create_issue`` ->
    ``createIssue``; a leading digit gets a ``_``; nothing usable gives ``_``."""
    words: list[str] = _WORD.findall(name)
    if not words:
        return "_"
    head, *rest = words
    ident = head[0].lower() + head[1:] + "".join(w[0].upper() + w[1:] for w in rest)
    return "_" + ident if ident[0].isdigit() else ident


def _unique(ident: str, taken: set[str]) -> str:
    """``ident``, or it with the first digit from 2 up that makes it free and not escaped."""
    candidate, n = ident, 1
    while candidate in taken or candidate in _ESCAPED:
        n += 1
        candidate = f"{ident}{n}"
    taken.add(candidate)
    return candidate


class McpNames:
    """Identifiers for servers (``server -> ident``) and tools (``tool id -> ident``), and each
    server's declaration file (``server -> path``)."""

    def __init__(self, servers: dict[str, str], tools: dict[str, str], paths: dict[str, str]) -> None:
        self.servers = servers
        self.tools = tools
        self.paths = paths


def mcp_names(servers: Iterable[str], tools: Iterable[_McpTool]) -> McpNames:
    """Assigns identifiers: to ``servers`` in the order given, then to the owners of ``tools``
    not among them, then to the tools in catalog order; collisions and reserved names get a
    digit appended."""
    idents: dict[str, str] = {}
    server_taken: set[str] = set()
    tool_idents: dict[str, str] = {}
    taken_by_server: dict[str, set[str]] = {}
    tools = list(tools)
    for server in [*servers, *(t.owner for t in tools)]:
        if server not in idents:
            idents[server] = _unique(camel_ident(server), server_taken)
    for tool in tools:
        taken = taken_by_server.setdefault(tool.owner, set(_SERVER_MEMBERS))
        tool_idents[tool.id] = _unique(camel_ident(tool.name), taken)
    paths_taken = {INDEX_PATH}
    paths = {server: _api_path(server, ident, paths_taken) for server, ident in idents.items()}
    return McpNames(idents, tool_idents, paths)


INDEX_PATH = "mcp/index.d.ts"
_PATH_SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


def _api_path(server: str, ident: str, taken: set[str]) -> str:
    """The server's declaration file: ``mcp/<server>.d.ts``; ``mcp/<ident>.d.ts`` when the name
    would not make one path segment (``/``, spaces, a leading dot) or its file is taken (a server
    named ``index``); identifiers are unique, so that one is free unless a server is named so."""
    for name in (server, ident) if _PATH_SAFE.fullmatch(server) else (ident,):
        path = f"mcp/{name}.d.ts"
        if path not in taken:
            taken.add(path)
            return path
    path = f"mcp/{_unique(ident, {p[4:-5] for p in taken})}.d.ts"
    taken.add(path)
    return path


# ---- requests and inputs ------------------------------------------------------------------------


def op_name(op: str) -> str:
    """How policy names a request: ``resources.list`` -> ``resources/list`` (its MCP method)."""
    return op.replace(".", "/")


def op_id(server: str, op: str) -> str:
    """The catalog-like id policy, hooks and approvals see for ``MCP.<server>.<op>``."""
    return f"mcp:{server}:{op_name(op)}"


class _ListPage(msgspec.Struct):
    cursor: str | None = None


class _ReadResource(msgspec.Struct):
    uri: str


class _GetPrompt(msgspec.Struct):
    name: str
    arguments: dict[str, str] | None = None


#: The inputs of ``MCP.<server>.resources/prompts`` requests, as the declarations below give them.
_OP_CHECKS: dict[str, Callable[[Any], str | None] | None] = {
    "resources.list": compile_input_validator(input_type=_ListPage),
    "resources.read": compile_input_validator(input_type=_ReadResource),
    "prompts.list": compile_input_validator(input_type=_ListPage),
    "prompts.get": compile_input_validator(input_type=_GetPrompt),
}


def check_op_input(op: str, payload: Any) -> str | None:
    """Why ``payload`` is not the input ``MCP.<server>.<op>`` declares (None if it is)."""
    check = _OP_CHECKS.get(op)
    return None if check is None else check(payload)


def with_defaults(schema: Mapping[str, Any] | None, value: Any) -> tuple[Any, str | None]:
    """``(input, problem)``: a cell's input to an MCP tool as a careful client sends it.

    Omitted top-level properties with a ``default`` get a copy of it, as own keys of a new dict
    (a ``__proto__`` key is a key like any other here, and JSON on the wire); then ``problem``
    names the required properties still missing. An input that is not an object is refused:
    MCP tool arguments are an object.
    """
    if not isinstance(value, dict):
        return value, "an MCP tool takes one object argument"
    node = schema if isinstance(schema, Mapping) else {}
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        missing = [k for k, p in properties.items() if k not in value and isinstance(p, Mapping) and "default" in p]
        if missing:
            value = {**value, **{key: copy.deepcopy(properties[key]["default"]) for key in missing}}
    required = node.get("required")
    absent = [k for k in required if isinstance(k, str) and k not in value] if isinstance(required, list) else []
    if not absent:
        return value, None
    shown = ", ".join(json.dumps(k[:_MAX_PARAM_CHARS]) for k in absent[:_MAX_PARAM_DOCS])
    more = f" (and {len(absent) - _MAX_PARAM_DOCS} more)" if len(absent) > _MAX_PARAM_DOCS else ""
    return value, f"missing required argument{'s' if len(absent) > 1 else ''}: {shown}{more}"


# ---- TypeScript types of inputs -------------------------------------------------------------------


def input_type(schema: Mapping[str, Any] | None) -> tuple[str, bool]:
    """``(type, optional)``: an MCP tool's input schema as a TypeScript type that parses, and
    whether the input may be omitted (nothing is required once defaults are filled in)."""
    node = inline_refs(dict(schema)) if isinstance(schema, Mapping) else {}
    filled = frozenset(_defaulted(node))
    text = "Record<string, unknown>"
    for depth in (_MAX_TYPE_DEPTH, 2, 1):
        rendered = _ts_type(node, 0, depth, filled)
        if len(rendered) <= _MAX_SIGNATURE_CHARS:
            text = rendered
            break
    return text, not (schema_required(node) - filled)


def _defaulted(node: Mapping[str, Any]) -> list[str]:
    return [key for key, prop in schema_properties(node).items() if isinstance(prop, Mapping) and "default" in prop]


def _ts_type(node: Any, depth: int, max_depth: int, filled: frozenset[str] = frozenset()) -> str:
    """``node`` as a TypeScript type; levels below ``max_depth`` are ``unknown``. ``filled``: the
    top-level properties a default fills, optional in the type."""
    if node is False:
        return "never"
    if not isinstance(node, Mapping) or depth > max_depth:
        return "unknown"
    if "const" in node:
        return _literal(node["const"])
    enum = node.get("enum")
    if isinstance(enum, list) and 0 < len(enum) <= _MAX_MEMBERS:
        return type_union([_literal(value) for value in enum])
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and 0 < len(members) <= _MAX_MEMBERS:
            return type_union([_ts_type(member, depth + 1, max_depth) for member in members])
    members = node.get("allOf")
    if isinstance(members, list) and 0 < len(members) <= _MAX_MEMBERS:
        parts = [_ts_type(member, depth + 1, max_depth) for member in members]
        return "unknown" if "unknown" in parts else " & ".join(f"({p})" if " | " in p else p for p in parts)
    kinds = _types(node)
    if not kinds:
        return "unknown"
    return type_union([_kind_type(node, kind, depth, max_depth, filled) for kind in kinds])


def _kind_type(node: Mapping[str, Any], kind: str, depth: int, max_depth: int, filled: frozenset[str]) -> str:
    if kind == "object":
        return _object_type(node, depth, max_depth, filled)
    if kind == "array":
        return _array_type(node, depth, max_depth)
    return _PRIMITIVES.get(kind, "unknown")


def _object_type(node: Mapping[str, Any], depth: int, max_depth: int, filled: frozenset[str]) -> str:
    """An object type; an open one (no ``additionalProperties: false``) gets an index signature
    whose type admits its fields' (TypeScript requires it), unknown past eight."""
    properties = schema_properties(node)
    shown = list(properties.items())[:_MAX_FIELDS]
    extra = node.get("additionalProperties")
    patterns = node.get("patternProperties")
    index: str | None
    if (isinstance(patterns, Mapping) and patterns) or len(properties) > len(shown):
        index = "unknown"
    elif extra is False:
        index = None
    else:
        index = _ts_type(extra, depth + 1, max_depth) if isinstance(extra, Mapping) else "unknown"
    if not shown:
        return f"Record<string, {index or 'never'}>"
    required = schema_required(node) - filled
    fields, types = [], set()
    for key, sub in shown:
        kind = _ts_type(sub, depth + 1, max_depth)
        types.update([kind] if key in required else [kind, "undefined"])
        fields.append(f"{key if _IDENT.fullmatch(key) else json.dumps(key)}{'' if key in required else '?'}: {kind}")
    if index is not None:
        if index != "unknown":
            types.add(index)
            index = "unknown" if "unknown" in types or len(types) > 8 else " | ".join(sorted(types))
        fields.append(f"[key: string]: {index}")
    return "{ " + "; ".join(fields) + " }"


def _array_type(node: Mapping[str, Any], depth: int, max_depth: int) -> str:
    form = tuple_form(node)
    if form is None:
        items = node.get("items")
        if items is False:
            return "[]"
        return array_of(_ts_type(items, depth + 1, max_depth) if isinstance(items, Mapping) else "unknown")
    prefix, rest = form
    if len(prefix) > _MAX_MEMBERS:
        return "unknown[]"
    parts = [_ts_type(item, depth + 1, max_depth) for item in prefix]
    if rest is not False:
        parts.append("..." + array_of(_ts_type(rest, depth + 1, max_depth) if isinstance(rest, Mapping) else "unknown"))
    return "[" + ", ".join(parts) + "]"


def _types(node: Mapping[str, Any]) -> list[str]:
    """The JSON types ``node`` allows, inferred from its keywords when ``type`` is absent;
    OpenAPI's ``nullable: true`` adds ``null``."""
    declared = node.get("type")
    if isinstance(declared, str):
        kinds = [declared]
    elif isinstance(declared, list):
        kinds = list(dict.fromkeys(kind for kind in declared if isinstance(kind, str)))
    elif any(key in node for key in ("properties", "additionalProperties", "required", "patternProperties")):
        kinds = ["object"]
    elif "items" in node or "prefixItems" in node:
        kinds = ["array"]
    else:
        return []
    return [*kinds, "null"] if node.get("nullable") is True and "null" not in kinds else kinds


def _literal(value: Any) -> str:
    """A JSON scalar as a literal type (ASCII escapes: one line, whatever the schema holds)."""
    if value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and value == value):
        try:
            return json.dumps(value, allow_nan=False)
        except ValueError:  # an infinite float (a schema from Python, not JSON)
            return "number"
    return "unknown"


# ---- declaration files ------------------------------------------------------------------------------


def _safe_comment(text: str) -> str:
    """Untrusted MCP text inside a JSDoc comment: it must not be able to close the comment."""
    return text.replace("*/", "*\\/")


def _folded(text: str, max_chars: int) -> str:
    """``text``'s lines as one (a multi-line description folds into its ``@param`` line)."""
    line = " ".join(text.split())
    return line if len(line) <= max_chars else line[: max_chars - 1] + "…"


def _doc(description: str, schema: Mapping[str, Any] | None, indent: str) -> list[str]:
    lines = [f"{indent}/**"]
    for line in (description.strip() or "(no description)").splitlines()[:_MAX_DOC_LINES]:
        lines.append(f"{indent} * {_safe_comment(line)}")
    for key, prop in list(schema_properties(schema or {}).items())[:_MAX_PARAM_DOCS]:
        if not isinstance(prop, Mapping):
            continue
        text = prop.get("description")
        doc = _folded(text, _MAX_PARAM_DOC_CHARS) if isinstance(text, str) else ""
        if "default" in prop:
            doc = f"{doc} Default: {_folded(json.dumps(prop['default'], default=str), _MAX_PARAM_DOC_CHARS)}.".strip()
        if doc:
            name = _safe_comment(_folded(key, _MAX_PARAM_CHARS))
            lines.append(f"{indent} * @param {name} {_safe_comment(doc)}")
    lines.append(f"{indent} */")
    return lines


#: What every server's file declares; interfaces, so that files read together merge them.
HEADER = """interface McpToolResult {
  content?: unknown[];
  structuredContent?: unknown;
  isError?: boolean;
  [key: string]: unknown;
}
interface McpApiHeader { server: string; tool?: string; declaration: string; schema?: unknown }
interface McpResourcesListResult { resources: unknown[]; nextCursor?: string }
interface McpResourcesReadResult { contents: unknown[] }
interface McpPromptsListResult { prompts: unknown[]; nextCursor?: string }
interface McpPromptsGetResult { description?: string; messages: unknown[] }
"""

_ROOT_HEADER = """interface McpServerInfo {
  identifier: string;
  serverName: string;
  toolCount: number;
  unavailable?: string;
}
interface McpRootApiHeader { declaration: string; servers: McpServerInfo[] }
"""

#: The request members of a server, as declared: op -> member line.
_OP_MEMBERS = {
    "resources.list": "list(input?: { cursor?: string }): Promise<McpResourcesListResult>;",
    "resources.read": "read(input: { uri: string }): Promise<McpResourcesReadResult>;",
    "prompts.list": "list(input?: { cursor?: string }): Promise<McpPromptsListResult>;",
    "prompts.get": "get(input: { name: string; arguments?: Record<string, string> }): Promise<McpPromptsGetResult>;",
}


def tool_declaration(tool: _McpTool, ident: str) -> str:
    """One tool's declaration (JSDoc + signature), as ``MCP.<server>.$api(tool)`` returns it."""
    lines = _doc(tool.description, tool.input_schema, "")
    if ident != tool.name:
        lines.append(f"// MCP tool name: {json.dumps(tool.name)}")
    signature, optional = input_type(tool.input_schema)
    returns = output_type(tool.declared_output_schema)
    lines.append(f"function {ident}(input{'?' if optional else ''}: {signature}): Promise<{returns}>;")
    return "\n".join(lines)


def output_type(schema: Mapping[str, Any] | None) -> str:
    """What an MCP tool's call resolves to: ``McpToolResult``, with ``structuredContent`` typed
    by the tool's ``outputSchema`` when it declares one (the server's word, shown to the model
    but never a trusted hint: it is not checked here)."""
    if not isinstance(schema, Mapping):
        return "McpToolResult"
    node = inline_refs(dict(schema))
    for depth in (_MAX_TYPE_DEPTH, 2, 1):
        rendered = _ts_type(node, 0, depth)
        if len(rendered) <= _MAX_SIGNATURE_CHARS:
            break
    else:
        return "McpToolResult"
    if rendered == "unknown":
        return "McpToolResult"
    return f"McpToolResult & {{ structuredContent?: {rendered} }}"


def _requests(ops: Iterable[str]) -> list[str]:
    """The ``resources``/``prompts`` members a server's file declares: the permitted ops only."""
    lines = []
    for group in ("resources", "prompts"):
        members = [_OP_MEMBERS[op] for op in MCP_OPS if op in ops and op.startswith(group + ".")]
        if members:
            lines.append(f"  const {group}: {{")
            lines.extend(f"    {member}" for member in members)
            lines.append("  };")
    return lines


def declarations(
    tools: Iterable[_McpTool],
    names: McpNames,
    unavailable: Mapping[str, str] | None = None,
    ops: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, str]:
    """The virtual ``API`` files: ``mcp/index.d.ts`` and one ``mcp/<server>.d.ts`` per server
    named in ``names`` (with or without tools); ``unavailable`` servers (why) are noted in the
    index only. ``ops``: the requests each server's file declares (default: all of them)."""
    unavailable = unavailable or {}
    by_server: dict[str, list[_McpTool]] = {s: [] for s in names.servers if s not in unavailable}
    for tool in tools:
        by_server[tool.owner].append(tool)
    files: dict[str, str] = {}
    references = [f'/// <reference path="./{names.paths[s][4:]}" />' for s in by_server]
    index = [*references, "", _ROOT_HEADER, "/** MCP servers visible to this run: `MCP.<server>.<tool>(input)`. */"]
    index.append("declare namespace MCP {")
    index.append("  /** Lists the visible servers (identifier, server name, tool count) and returns this file. */")
    index.append("  function $api(): Promise<McpRootApiHeader>;")
    for server, items in by_server.items():
        ident = names.servers[server]
        path = names.paths[server]
        label = _safe_comment(json.dumps(server))
        index.append(f"  /** server {label} (`MCP.{ident}`): {len(items)} tool(s); see {path} */")
        body = [HEADER, f"/** MCP server {label} (`MCP.{ident}`). */", f"declare namespace MCP.{ident} {{"]
        body.append("  /** Returns this API header; for one tool (with `schema: true`, its JSON Schema too). */")
        body.append("  function $api(toolName?: string, options?: { schema?: boolean }): Promise<McpApiHeader>;")
        body.extend(_requests(MCP_OPS if ops is None else ops.get(server, ())))
        for tool in items:
            body.extend("  " + line for line in tool_declaration(tool, names.tools[tool.id]).splitlines())
        body.append("}")
        files[path] = "\n".join(body) + "\n"
    for server, reason in unavailable.items():
        ident = names.servers[server]
        why = _safe_comment(" ".join(reason.split())[:300])
        index.append(f"  /** server {_safe_comment(json.dumps(server))} is unavailable: {why} */")
        index.append(f"  const {ident}: unknown;")
    index.append("}")
    files[INDEX_PATH] = "\n".join(index) + "\n"
    return files
