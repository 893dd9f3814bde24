"""Model-facing surfaces: the tool definitions a host hands to its model provider.

    code              exec + wait (+ direct-only tools): JavaScript cells over the hidden catalog
    tool_search_code  tool_search_code (+ direct-only): one cell tool with `codemode.tools.*`
    tool_search       tool_search, tool_describe, tool_call (+ direct-only): structured fallback
    directory         the same three, with a bounded directory of names and descriptions
    direct            every tool as its own definition (what code mode replaces)

Schemas are provider-safe: flat string enums, never `oneOf`; the control tools' never `anyOf`
either, and the code surface's are valid in OpenAI strict mode (optional fields are nullable).
A tool's own schema (the direct surface, direct-only tools) is sent through `provider_schema`:
`X | None` becomes a nullable type list, as strict mode writes it, and a `oneOf` an `anyOf`; a
union of objects stays an `anyOf`, which every provider reads. Code mode fails closed: if
the engine cannot run, `exec` answers `runtime_unavailable`; the surface never silently widens to
the direct tools.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "SURFACES",
    "ModelTool",
    "Surface",
    "provider_schema",
    "strict_problem",
    "to_anthropic",
    "to_openai",
    "to_openai_responses",
]

Surface = Literal["code", "tool_search_code", "tool_search", "directory", "direct"]
SURFACES: tuple[Surface, ...] = ("code", "tool_search_code", "tool_search", "directory", "direct")


class ModelTool(msgspec.Struct, frozen=True):
    """One model-visible tool, provider-neutral."""

    name: str
    description: str
    input_schema: dict[str, Any]


#: OpenAI strict mode's shape (every property required, none beside them) with the optional
#: ones nullable: a strict provider sends ``null`` for "not given", which `exec` reads as the
#: default. ``command``, the spec's alias for hooks and trusted rewrites, is accepted by `exec`
#: and never advertised to the model.
EXEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "The cell: an async function body (await and return allowed)."},
        "language": {
            "type": ["string", "null"],
            "enum": ["javascript", "typescript", None],
            "description": "null means javascript.",
        },
        "restartSafe": {
            "type": ["boolean", "null"],
            "description": "true: only read-only tools, and the run may be replayed after a restart. null means false.",
        },
    },
    "required": ["code", "language", "restartSafe"],
    "additionalProperties": False,
}
#: ``answer`` is nullable (strict mode), and a string: what a model answers with. A host's
#: ``Session.wait`` takes any JSON value there.
WAIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "runId": {"type": "string", "description": "The runId of a `waiting` result."},
        "answer": {
            "type": ["string", "null"],
            "description": "For reason `yield`: what `await yield_control(...)` resolves to. null: undefined.",
        },
    },
    "required": ["runId", "answer"],
    "additionalProperties": False,
}
WAIT_DESCRIPTION = (
    "Resume a code mode run that returned `waiting`: pass its runId (and, if it yielded, your answer)."
    " Returns the same result as exec."
)
TOOL_SEARCH_CODE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "JavaScript: an async function body."}},
    "required": ["code"],
    "additionalProperties": False,
}
TOOL_SEARCH_CODE_DESCRIPTION = (
    "Run JavaScript against the tool catalog: `await codemode.tools.search(query, {limit})` -> compact hits, "
    "`await codemode.tools.describe(id)` -> full schema, `await codemode.tools.call(id, args)` -> the result; "
    "`console.log` for notes. Return the answer."
)
SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What the tool should do."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    "required": ["query"],
    "additionalProperties": False,
}
DESCRIBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string", "description": "A catalog id from tool_search."}},
    "required": ["id"],
    "additionalProperties": False,
}
CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "A catalog id from tool_search."},
        "args": {"type": "object", "description": "The tool's input.", "additionalProperties": True},
    },
    "required": ["id"],
    "additionalProperties": False,
}
SEARCH_DESCRIPTION = "Search the tool catalog; returns compact entries with exact ids and input hints."
DESCRIBE_DESCRIPTION = "Load one catalog tool's full input schema (and declared output schema)."
CALL_DESCRIPTION = "Call a catalog tool by its exact id with its input; returns {tool, result}."
#: Characters of the directory listing in `tool_search`'s description (directory surface).
DIRECTORY_CHARS = 6000


def control_tools(surface: Surface, exec_description: str, directory: str = "") -> list[ModelTool]:
    """The surface's control tools (without the direct-only tools, which the caller appends)."""
    if surface == "code":
        return [ModelTool("exec", exec_description, EXEC_SCHEMA), ModelTool("wait", WAIT_DESCRIPTION, WAIT_SCHEMA)]
    if surface == "tool_search_code":
        return [ModelTool("tool_search_code", TOOL_SEARCH_CODE_DESCRIPTION, TOOL_SEARCH_CODE_SCHEMA)]
    if surface in ("tool_search", "directory"):
        search = SEARCH_DESCRIPTION + (f"\nDirectory (name: description):\n{directory}" if directory else "")
        return [
            ModelTool("tool_search", search, SEARCH_SCHEMA),
            ModelTool("tool_describe", DESCRIBE_DESCRIPTION, DESCRIBE_SCHEMA),
            ModelTool("tool_call", CALL_DESCRIPTION, CALL_SCHEMA),
        ]
    return []


def directory_listing(entries: list[tuple[str, str]], max_chars: int = DIRECTORY_CHARS) -> str:
    """``- id: first line of description`` per tool, bounded, with a footer for what was left out."""
    lines: list[str] = []
    used = 0
    for index, (tool_id, description) in enumerate(entries):
        line = f"- {tool_id}: {description.strip().splitlines()[0][:160] if description.strip() else ''}"
        footer = f"(+{len(entries) - index} more: use tool_search)"
        if used + len(line) + 1 + len(footer) > max_chars:
            lines.append(footer)
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


#: Keywords whose values are data, not schemas: `provider_schema` leaves them as they are.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
#: Keywords whose values map names to schemas (a property may be called `default`).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
#: Nesting past which `provider_schema` leaves a schema as it is (an MCP server's is untrusted).
_MAX_SCHEMA_DEPTH = 64


def provider_schema(schema: Any, depth: int = 0) -> Any:
    """``schema`` (a tool's own input schema) as every provider reads it, in a new object: a
    nullable ``{"anyOf": [X, {"type": "null"}]}`` (how msgspec and pydantic write ``X | None``)
    becomes ``X`` with a type list (``{"type": ["boolean", "null"]}``, an ``enum`` gaining
    ``null``), as OpenAI strict mode writes an optional field, and a ``oneOf`` becomes an
    ``anyOf`` (the host still checks every input against the tool's own schema). Other unions
    (of objects, of ``$ref``s) stay ``anyOf``."""
    if not isinstance(schema, dict) or depth > _MAX_SCHEMA_DEPTH:
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: provider_schema(sub, depth + 1) for name, sub in value.items()}
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif isinstance(value, list):
            out[key] = [provider_schema(item, depth + 1) for item in value]
        else:
            out[key] = provider_schema(value, depth + 1)
    if "oneOf" in out and "anyOf" not in out:
        out["anyOf"] = out.pop("oneOf")
    return _nullable(out) or out


def _nullable(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``{"anyOf": [X, {"type": "null"}], ...}`` as one node with a nullable type, or None when
    it is no such thing or the two do not merge cleanly."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or {"type": "null"} not in branches:
        return None
    others = [branch for branch in branches if branch != {"type": "null"}]
    other = others[0] if len(others) == 1 else None
    if not isinstance(other, dict) or any(key in other for key in ("const", "anyOf", "oneOf", "allOf", "$ref")):
        return None
    kind, enum = other.get("type"), other.get("enum")
    if not (isinstance(kind, str) and kind != "null") and not (kind is None and isinstance(enum, list)):
        return None
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    if any(key in rest and rest[key] != value for key, value in other.items()):
        return None
    merged = {**other, **rest}
    if kind is not None:
        merged["type"] = [kind, "null"]
    if isinstance(enum, list) and None not in enum:
        merged["enum"] = [*enum, None]
    return merged


#: The JSON types OpenAI strict mode knows.
_STRICT_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def strict_problem(schema: Any, path: str = "$") -> str | None:
    """Why ``schema`` is not valid in OpenAI strict mode (structured outputs), or None.

    The documented rules: the root is an object; every object lists all its properties in
    ``required`` and sets ``additionalProperties: false`` (an optional field is a nullable
    one); types are JSON's; an ``enum``'s values have one of the declared types. Nested
    ``properties``, ``items``, ``anyOf`` and ``$defs`` follow the same rules.
    """
    if not isinstance(schema, dict):
        return f"{path}: not a schema object"
    if path == "$" and schema.get("type") != "object":
        return "$: the root must be an object"
    declared = schema.get("type")
    types = declared if isinstance(declared, list) else [declared] if declared is not None else []
    if not types and "anyOf" not in schema and "$ref" not in schema:
        return f"{path}: no type"
    if any(t not in _STRICT_TYPES for t in types):
        return f"{path}: unknown type {declared!r}"
    json_type = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}
    for value in schema.get("enum", ()):
        kind = json_type.get(type(value))
        if kind not in types and not (kind == "integer" and "number" in types):
            return f"{path}: enum value {value!r} is not of type {declared!r}"
    if "object" in types:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return f"{path}: additionalProperties must be false"
        if sorted(schema.get("required", [])) != sorted(properties):
            return f"{path}: every property must be required (make an optional one nullable)"
        for name, sub in properties.items():
            if (problem := strict_problem(sub, f"{path}.{name}")) is not None:
                return problem
    nested = [("[]", schema["items"])] if "items" in schema else []
    nested += [(f".anyOf[{i}]", sub) for i, sub in enumerate(schema.get("anyOf", []))]
    nested += [(f".$defs.{name}", sub) for name, sub in schema.get("$defs", {}).items()]
    for suffix, sub in nested:
        if (problem := strict_problem(sub, path + suffix)) is not None:
            return problem
    return None


def to_openai(tools: list[ModelTool]) -> list[dict[str, Any]]:
    """The OpenAI Chat Completions function-tool format (``{"type": "function", "function":
    {...}}``); a tool whose schema is valid in strict mode (`strict_problem`) asks for it."""
    out = []
    for t in tools:
        function: dict[str, Any] = {"name": t.name, "description": t.description, "parameters": t.input_schema}
        if strict_problem(t.input_schema) is None:
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out


def to_openai_responses(tools: list[ModelTool]) -> list[dict[str, Any]]:
    """The OpenAI Responses API function-tool format (flat: ``{"type": "function", "name", ...}``,
    and ``strict`` always given, as the API requires); strict for a schema valid in strict mode."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.input_schema,
            "strict": strict_problem(t.input_schema) is None,
        }
        for t in tools
    ]


def to_anthropic(tools: list[ModelTool]) -> list[dict[str, Any]]:
    """The Anthropic Messages tool format."""
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


def payload_bytes(tools: list[ModelTool]) -> int:
    """Serialized size of the definitions a provider receives (the cost code mode cuts)."""
    return len(msgspec.json.encode(to_openai(tools)))
