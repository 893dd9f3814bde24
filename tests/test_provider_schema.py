"""A tool's own schema reaches the model flat: `X | None` as a nullable type list (as OpenAI
strict mode writes it), never `oneOf`; and it accepts exactly what the tool's schema accepts."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

import fastjsonschema
import msgspec
import pydantic
import pytest
from codemode import CodeMode
from codemode.surfaces import provider_schema

SAMPLES: list[Any] = [None, True, False, 0, 1, 2.5, "", "a", "b", [], ["a"], [1], {}, {"days": 1}, {"days": "x"}]
SAMPLES += [{"paid": None}, {"paid": 1}, {"status": None}, {"status": "open"}, {"status": "other"}]


def nodes(schema: Any):
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from nodes(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from nodes(item)


@dataclasses.dataclass
class Window:
    days: int


class Filter(pydantic.BaseModel):
    paid: bool | None = None
    status: Literal["open", "closed"] | None = None


@pytest.fixture(scope="module")
def cm():
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="billing")
        def invoices(
            paid: bool | None = None,
            tags: list[str] | None = None,
            kind: Literal["a", "b"] | None = None,
            count: Annotated[int | None, msgspec.Meta(description="how many")] = None,
            window: Window | None = None,
        ) -> list[dict]:
            """List invoices."""
            return []

        @cm.tool(owner="billing")
        def search(f: Filter) -> list[dict]:
            """Search invoices."""
            return []

        @cm.tool(direct_only=True)
        def ask(question: str, urgent: bool | None = None) -> str:
            """Ask the user."""
            return "yes"

        yield cm


def test_nullable_scalars_arrays_and_enums_are_type_lists_on_the_direct_surface(cm):
    tools = {t.name: t.input_schema for t in cm.session().model_tools("direct")}
    properties = tools["invoices"]["properties"]
    assert properties["paid"] == {"type": ["boolean", "null"], "default": None}
    assert properties["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "default": None}
    assert properties["kind"] == {"enum": ["a", "b", None], "default": None}
    assert properties["count"] == {"type": ["integer", "null"], "description": "how many", "default": None}
    assert properties["window"]["type"] == ["object", "null"]
    assert properties["window"]["required"] == ["days"]
    assert tools["ask"]["properties"]["urgent"] == {"type": ["boolean", "null"], "default": None}


@pytest.mark.parametrize("surface", ["code", "tool_search_code", "tool_search", "directory", "direct"])
def test_no_surface_sends_oneof_or_a_nullable_anyof(cm, surface):
    for tool in cm.session().model_tools(surface, likely="invoices"):
        for node in nodes(tool.input_schema):
            assert "oneOf" not in node, tool.name
            branches = node.get("anyOf", [])
            simple = [b for b in branches if b != {"type": "null"} and "$ref" not in b]
            assert not ({"type": "null"} in branches and len(simple) == 1), (tool.name, node)


def test_the_directory_surface_flattens_its_likely_tools_and_direct_only_tools(cm):
    tools = {t.name: t.input_schema for t in cm.session().model_tools("directory", likely="invoices paid")}
    assert tools["invoices"]["properties"]["paid"]["type"] == ["boolean", "null"]
    assert tools["ask"]["properties"]["urgent"]["type"] == ["boolean", "null"]


def test_the_catalog_keeps_the_tools_own_schema(cm):
    described = cm.session().handle("tool_describe", {"id": "host:billing:invoices"})
    assert "anyOf" in json.dumps(described)


@pytest.mark.parametrize("tool", ["invoices", "search"])
def test_the_model_facing_schema_accepts_exactly_what_the_tools_schema_accepts(cm, tool):
    view = cm.catalog()
    original = next(t.input_schema for t in view.tools.values() if t.name == tool)
    flat = next(t.input_schema for t in cm.session().model_tools("direct") if t.name == tool)
    check_original, check_flat = fastjsonschema.compile(original), fastjsonschema.compile(flat)
    names = list(original.get("properties", {}))
    for name in names:
        for sample in SAMPLES:
            value = {name: sample}
            assert accepts(check_original, value) == accepts(check_flat, value), (tool, value)


def accepts(check: Any, value: Any) -> bool:
    try:
        check(value)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


@pytest.mark.parametrize(
    ("schema", "flat"),
    [
        (
            {"anyOf": [{"type": "string", "enum": ["x"]}, {"type": "null"}]},
            {"type": ["string", "null"], "enum": ["x", None]},
        ),
        ({"oneOf": [{"type": "object"}, {"type": "array"}]}, {"anyOf": [{"type": "object"}, {"type": "array"}]}),
        ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, {"type": ["integer", "null"]}),
        (
            {"type": "object", "properties": {"default": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
            {"type": "object", "properties": {"default": {"type": ["integer", "null"]}}},
        ),
        ({"default": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, None),  # data stays data
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, None),
        ({"anyOf": [{"const": 1}, {"type": "null"}]}, None),
        ({"anyOf": [{"type": "integer", "description": "a"}, {"type": "null"}], "description": "b"}, None),
        ({"anyOf": [{"type": "null"}, {"type": "null"}]}, None),
    ],
)
def test_provider_schema_merges_only_what_merges_cleanly(schema, flat):
    before = json.dumps(schema)
    assert provider_schema(schema) == (schema if flat is None else flat)
    assert json.dumps(schema) == before  # a new object: the tool's own schema is not changed
