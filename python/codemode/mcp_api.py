"""What guest code sees of MCP servers: ``MCP.<server>.<tool>`` names and the ``API`` files.

MCP names are often not JavaScript identifiers (``get-sum``, ``chrome-devtools``), so each server
and tool gets a camelCase identifier, deterministically: the catalog order decides who keeps a
contested identifier, later ones get ``_2``, ``_3``… and the declaration files name both the
identifier and the original name. The files (``mcp/index.d.ts``, ``mcp/<server>.d.ts``) are
rendered from the tools' metadata once per catalog, for the visible servers only, and served
inside the worker: reading them is never a tool call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from .catalog import compile_input_validator, input_hint

__all__ = ["McpNames", "camel_ident", "check_op_input", "declarations", "mcp_names", "tool_declaration"]

_WORD = re.compile(r"[A-Za-z0-9]+")
_RESERVED_MEMBERS = frozenset({"$api", "resources", "prompts"})
#: Characters of a parameter name in a declaration's JSDoc (a server's schema keys are its own).
_MAX_PARAM_CHARS = 100


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
    candidate, n = ident, 1
    while candidate in taken:
        n += 1
        candidate = f"{ident}_{n}"
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
    not among them, then to the tools in catalog order; collisions get visible numeric
    suffixes."""
    idents: dict[str, str] = {}
    server_taken: set[str] = set()
    tool_idents: dict[str, str] = {}
    taken_by_server: dict[str, set[str]] = {}
    tools = list(tools)
    for server in [*servers, *(t.owner for t in tools)]:
        if server not in idents:
            idents[server] = _unique(camel_ident(server), server_taken)
    for tool in tools:
        taken = taken_by_server.setdefault(tool.owner, set(_RESERVED_MEMBERS))
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


class _ReadResource(msgspec.Struct):
    uri: str


class _GetPrompt(msgspec.Struct):
    name: str
    arguments: dict[str, str] | None = None


#: The inputs of ``MCP.<server>.resources/prompts`` requests, as the declarations below give them
#: (``list()`` takes none).
_OP_CHECKS: dict[str, Callable[[Any], str | None] | None] = {
    "resources.read": compile_input_validator(input_type=_ReadResource),
    "prompts.get": compile_input_validator(input_type=_GetPrompt),
}


def check_op_input(op: str, payload: Any) -> str | None:
    """Why ``payload`` is not the input ``MCP.<server>.<op>`` declares (None if it is)."""
    check = _OP_CHECKS.get(op)
    return None if check is None else check(payload)


def _safe_comment(text: str) -> str:
    """Untrusted MCP text inside a JSDoc comment: it must not be able to close the comment."""
    return text.replace("*/", "*\\/")


def _doc(description: str, schema: Mapping[str, Any] | None, indent: str) -> list[str]:
    lines = [f"{indent}/**"]
    for line in (description.strip() or "(no description)").splitlines()[:12]:
        lines.append(f"{indent} * {_safe_comment(line)}")
    properties = (schema or {}).get("properties")
    if isinstance(properties, Mapping):
        for key, prop in list(properties.items())[:32]:
            text = prop.get("description") if isinstance(prop, Mapping) else None
            if isinstance(text, str) and text.strip():
                name = _safe_comment(str(key)[:_MAX_PARAM_CHARS])
                lines.append(f"{indent} * @param {name} {_safe_comment(text.strip().splitlines()[0][:200])}")
    lines.append(f"{indent} */")
    return lines


HEADER = """type McpToolResult = {
  content?: unknown[];
  structuredContent?: unknown;
  isError?: boolean;
  [key: string]: unknown;
};

type McpApiHeader = { server: string; tool?: string; declaration: string; schema?: unknown };
"""


def tool_declaration(tool: _McpTool, ident: str) -> str:
    """One tool's declaration (JSDoc + signature), as ``MCP.<server>.$api(tool)`` returns it."""
    lines = _doc(tool.description, tool.input_schema, "")
    if ident != tool.name:
        lines.append(f"// MCP tool name: {json.dumps(tool.name)}")
    signature = input_hint(tool.input_schema, max_chars=600)
    lines.append(f"function {ident}(input: {signature}): Promise<McpToolResult>;")
    return "\n".join(lines)


def declarations(
    tools: Iterable[_McpTool], names: McpNames, unavailable: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The virtual ``API`` files: ``mcp/index.d.ts`` and one ``mcp/<server>.d.ts`` per server
    named in ``names`` (with or without tools); ``unavailable`` servers (why) are noted in the
    index only."""
    unavailable = unavailable or {}
    by_server: dict[str, list[_McpTool]] = {s: [] for s in names.servers if s not in unavailable}
    for tool in tools:
        by_server[tool.owner].append(tool)
    files: dict[str, str] = {}
    index = [HEADER, "/** MCP servers visible to this run: `MCP.<server>.<tool>(input)`. */", "declare const MCP: {"]
    for server, items in by_server.items():
        ident = names.servers[server]
        path = names.paths[server]
        label = _safe_comment(json.dumps(server))
        index.append(f"  /** server {label}: {len(items)} tool(s); see {path} */")
        index.append(f"  {ident}: typeof MCP.{ident};")
        body = [HEADER, f"/** MCP server {label} (`MCP.{ident}`). */", f"declare namespace MCP.{ident} {{"]
        body.append("  /** Returns this API header; for one tool (with `schema: true`, its JSON Schema too). */")
        body.append("  function $api(toolName?: string, options?: { schema?: boolean }): Promise<McpApiHeader>;")
        body.append("  const resources: { list(): Promise<unknown>; read(input: { uri: string }): Promise<unknown> };")
        body.append(
            "  const prompts: { list(): Promise<unknown>; "
            "get(input: { name: string; arguments?: Record<string, string> }): Promise<unknown> };"
        )
        for tool in items:
            body.extend("  " + line for line in tool_declaration(tool, names.tools[tool.id]).splitlines())
        body.append("}")
        files[path] = "\n".join(body) + "\n"
    for server, reason in unavailable.items():
        ident = names.servers[server]
        why = _safe_comment(" ".join(reason.split())[:300])
        index.append(f"  /** server {_safe_comment(json.dumps(server))} is unavailable: {why} */")
        index.append(f"  {ident}: unknown;")
    index.append("};")
    files[INDEX_PATH] = "\n".join(index) + "\n"
    return files
