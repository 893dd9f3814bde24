"""Tool schemas from Python functions, the hints rendered from them, the quick index, search
fields and output validation (``codemode.catalog``: pure functions, no workers needed)."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import pytest
from codemode.catalog import (
    compile_output_validator,
    inline_refs,
    input_hint,
    output_hint,
    quick_index,
    schemas_from_function,
    search_fields,
)
from codemode.errors import ToolDefinitionError
from hypothesis import given, settings
from hypothesis import strategies as st


class Shipment(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    paid: bool
    tons: float


class Loose(msgspec.Struct):
    """A struct that does not forbid unknown fields."""

    name: str


class Tree(msgspec.Struct):
    label: str
    children: list[Tree] = []


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Pair:
    left: int
    right: tuple[int, str] = (0, "")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def find_shipments(
    query: Annotated[str, msgspec.Meta(description="Free text to match against shipment ids")],
    limit: int = 10,
    mode: Literal["r", "w"] = "r",
) -> list[Shipment]:
    raise NotImplementedError


def schema_of(fn: Any) -> dict[str, Any]:
    return schemas_from_function(fn)[0]


def output_of(fn: Any) -> dict[str, Any] | None:
    return schemas_from_function(fn)[1]


# ---- schemas_from_function ----------------------------------------------------------------------


def test_annotated_description_lands_in_input_schema() -> None:
    props = schema_of(find_shipments)["properties"]
    assert props["query"] == {"type": "string", "description": "Free text to match against shipment ids"}


def test_params_with_defaults_are_optional_and_input_is_closed() -> None:
    schema = schema_of(find_shipments)
    assert schema["required"] == ["query"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["limit"] == {"type": "integer", "default": 10}
    assert "title" not in schema


def test_keyword_only_and_unusual_params() -> None:
    def tool(__odd: int, plain, *, flag: bool, items: list[int] = [1, 2]) -> None:  # type: ignore[no-untyped-def]  # noqa: B006
        raise NotImplementedError

    schema = schema_of(tool)
    assert list(schema["properties"]) == ["__odd", "plain", "flag", "items"]
    assert schema["required"] == ["__odd", "plain", "flag"]
    assert schema["properties"]["plain"] == {}  # no annotation: any
    assert "default" not in schema["properties"]["items"]  # a mutable default is not copied into the schema


@pytest.mark.parametrize("variadic", ["args", "kwargs"])
def test_variadic_params_open_the_input(variadic: str) -> None:
    def with_args(a: int, *rest: int) -> None:
        raise NotImplementedError

    def with_kwargs(a: int, **rest: int) -> None:
        raise NotImplementedError

    schema = schema_of(with_args if variadic == "args" else with_kwargs)
    assert schema["additionalProperties"] is True
    assert list(schema["properties"]) == ["a"]


class Custom:
    """A class msgspec cannot describe."""


def test_indescribable_annotations_become_any() -> None:
    def tool(a: Custom, b: int) -> Custom:
        raise NotImplementedError

    schema, output = schemas_from_function(tool)
    assert schema["properties"] == {"a": {}, "b": {"type": "integer"}}
    assert output is None


def test_list_of_closed_struct_gives_array_hint() -> None:
    output = output_of(find_shipments)
    assert output is not None
    assert "$ref" not in json.dumps(output)
    assert output_hint(output) == "Array<{ id: string; paid: boolean; tons: number }>"


@pytest.mark.parametrize(
    ("returns", "hint"),
    [
        (Loose, "{ name: string }"),
        (Point, "{ x: number; y: number }"),
        (Pair, "{ left: number; right?: [number, string] }"),
        (Shipment | None, "{ id: string; paid: boolean; tons: number } | null"),
        (Color, '"blue" | "red"'),
        (Literal["a", 1, None], 'null | 1 | "a"'),
        (dict[str, int], None),
        (dict[str, Any], None),
        (list[Any], None),
        (Tree, None),  # recursive: the cycle is left open
    ],
)
def test_output_hints_only_for_closed_return_types(returns: Any, hint: str | None) -> None:
    def tool() -> Any:
        raise NotImplementedError

    tool.__annotations__["return"] = returns
    output = output_of(tool)
    assert output is not None
    assert output_hint(output) == hint


def test_struct_like_outputs_are_closed_at_every_level() -> None:
    def tool() -> dict[str, list[Loose]]:
        raise NotImplementedError

    output = output_of(tool)
    assert output is not None
    assert output["additionalProperties"]["items"]["additionalProperties"] is False


def test_missing_or_any_return_has_no_output_schema() -> None:
    def bare(x: int):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def anything(x: int) -> Any:
        raise NotImplementedError

    assert output_of(bare) is None
    assert output_of(anything) is None


def test_recursive_types_inline_without_refs() -> None:
    def tool(tree: Tree) -> Tree:
        raise NotImplementedError

    schema, output = schemas_from_function(tool)
    assert "$ref" not in json.dumps(schema) + json.dumps(output)
    assert input_hint(schema) == "{ tree: { label: string; children?: unknown[] } }"


def test_inline_refs_keeps_sibling_keywords_and_drops_unresolvable() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/A", "description": "field text"},
            "b": {"$ref": "other.json#/x"},
        },
        "$defs": {"A": {"type": "string", "description": "type text"}},
    }
    assert inline_refs(schema) == {
        "type": "object",
        "properties": {"a": {"type": "string", "description": "field text"}, "b": {}},
    }


def test_unresolvable_forward_references_degrade_to_any() -> None:
    def tool(x: Missing) -> Missing:  # type: ignore[name-defined]  # noqa: F821
        raise NotImplementedError

    schema, output = schemas_from_function(tool)
    assert schema["properties"] == {"x": {}}
    assert output is None


# ---- input_hint / output_hint -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "hint"),
    [
        (None, "unknown"),
        ({}, "unknown"),
        ({"type": "string"}, "string"),
        ({"type": ["integer", "null"]}, "number | null"),
        ({"type": "array", "items": {"type": "string"}}, "string[]"),
        ({"type": "array", "items": {"type": ["string", "number"]}}, "Array<string | number>"),
        ({"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}, "boolean[][]"),
        ({"type": "array"}, "unknown[]"),
        ({"enum": ["r", "w"]}, '"r" | "w"'),
        ({"const": 3}, "3"),
        ({"type": "object"}, "{ ... }"),
        ({"type": "object", "additionalProperties": True}, "{ ... }"),
        ({"type": "object", "additionalProperties": {}}, "{ ... }"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, "Record<string, number>"),
        ({"type": "object", "additionalProperties": False}, "{}"),
        ({"allOf": [{"enum": [1, 2]}, {"type": "integer"}]}, "(1 | 2) & number"),
        (
            {"type": "object", "properties": {"my-key": {"type": "string"}, "ok": {}}, "required": ["my-key"]},
            '{ "my-key": string; ok?: unknown }',
        ),
        (
            {
                "type": "object",
                "properties": {
                    "paths": {"type": "array", "items": {"type": "string"}},
                    "mode": {"enum": ["r", "w"]},
                    "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "required": ["deep"]},
                },
                "required": ["paths"],
                "additionalProperties": True,
            },
            '{ paths: string[]; mode?: "r" | "w"; opts?: { deep: boolean }; [key: string]: unknown }',
        ),
    ],
)
def test_input_hint_rendering(schema: dict[str, Any] | None, hint: str) -> None:
    assert input_hint(schema) == hint


@pytest.mark.parametrize(
    ("schema", "hint"),
    [
        ({"const": "file"}, '"file"'),
        ({"const": -1.5}, "-1.5"),
        ({"const": None}, "null"),
        ({"const": False}, "false"),
        ({"const": {"kind": "file", "my-key": [1, "a"]}}, '{ kind: "file"; "my-key": [1, "a"] }'),
        ({"const": {}}, "{}"),
        ({"const": []}, "[]"),
        ({"enum": [{"op": "add"}]}, '{ op: "add" }'),
        ({"enum": [{"op": "add"}, ["x"], 2]}, '{ op: "add" } | ["x"] | 2'),
        ({"const": {"a": {"b": {"c": {"d": 1}}}}}, "{ a: { b: { c: { … } } } }"),
        ({"const": [[[[1]]]]}, "[[[unknown[]]]]"),
        ({"const": list(range(10))}, "[0, 1, 2, 3, 4, 5, 6, 7, ...unknown[]]"),
        ({"const": {f"k{i}": i for i in range(9)}}, "{ k0: 0; k1: 1; k2: 2; k3: 3; k4: 4; k5: 5; k6: 6; k7: 7; … }"),
        ({"const": "line\u2028break"}, '"line\\u2028break"'),
    ],
)
def test_json_literals_render_as_typescript_literal_types(schema: dict[str, Any], hint: str) -> None:
    assert input_hint(schema, max_chars=1000) == hint


def test_a_literal_object_in_a_field_and_a_closed_output_are_typescript() -> None:
    schema = {"type": "object", "properties": {"filter": {"const": {"state": "open"}}}, "required": ["filter"]}
    assert input_hint(schema) == '{ filter: { state: "open" } }'
    assert output_hint({"const": {"ok": True}}) == "{ ok: true }"


def test_open_objects_read_as_any_object_inside_a_hint() -> None:
    schema = {
        "type": "object",
        "properties": {
            "meta": {"type": "object"},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["meta"],
    }
    assert input_hint(schema) == "{ meta: { ... }; tags?: Record<string, string> }"


def test_input_hint_bounds_nesting_even_when_the_whole_fits() -> None:
    level: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    for name in ("d", "c", "b", "a"):
        level = {"type": "object", "properties": {name: level}, "required": [name]}
    assert input_hint(level, max_chars=1000) == "{ a: { b: { c: { … } } } }"
    array_of_deep = {"type": "array", "items": level}
    assert input_hint(array_of_deep, max_chars=1000) == "Array<{ a: { b: { c: { … } } } }>"


def test_input_hint_of_a_tool() -> None:
    assert input_hint(schema_of(find_shipments)) == '{ query: string; limit?: number; mode?: "r" | "w" }'


def test_input_hint_folds_nested_objects_before_dropping_fields() -> None:
    deep = {"type": "object", "properties": {"c": {"type": "string"}}, "required": ["c"]}
    middle = {"type": "object", "properties": {"b": deep, "b2": {"type": "string"}}}
    schema = {"type": "object", "properties": {"a": middle, "z": {"type": "number"}}, "required": ["z"]}
    full = "{ a?: { b?: { c: string }; b2?: string }; z: number }"
    assert input_hint(schema) == full
    assert input_hint(schema, max_chars=len(full) - 1) == "{ a?: { b?: { … }; b2?: string }; z: number }"
    assert input_hint(schema, max_chars=28) == "{ a?: { … }; z: number }"
    # Fewer characters: required fields are kept first and the cut is marked.
    assert input_hint(schema, max_chars=23) == "{ z: number; … }"
    assert input_hint(schema, max_chars=5) == "{ … }"
    assert input_hint(schema, max_chars=3) == "{ …"
    assert input_hint(schema, max_chars=0) == ""


def test_input_hint_degrades_to_required_fields_first() -> None:
    props = {f"opt{i}": {"type": "string"} for i in range(10)}
    props["query"] = {"type": "string"}
    props["limit"] = {"type": "integer"}
    schema = {"type": "object", "properties": props, "required": ["query"]}
    hint = input_hint(schema, max_chars=40)
    assert hint == "{ query: string; opt0?: string; … }"
    assert len(hint) <= 40


def test_output_hint_requires_closed_and_short() -> None:
    closed: dict[str, Any] = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    closed["additionalProperties"] = False
    assert output_hint(closed) == "{ id: string }"
    assert output_hint(closed, max_chars=13) is None
    assert output_hint({**closed, "additionalProperties": True}) is None
    assert output_hint({**closed, "additionalProperties": {"type": "string"}}) is None
    assert output_hint({"anyOf": [closed, {"type": "object"}]}) is None
    assert output_hint({"type": "array", "items": closed}) == "Array<{ id: string }>"
    assert output_hint({"type": "array"}) is None
    assert output_hint({}) is None
    assert output_hint(None) is None
    assert output_hint({"type": "null"}) == "null"


# A loose generator of JSON-Schema-shaped values, including nonsense a hint must survive.
_leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "x"])}),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none()), max_size=5)}),
    st.fixed_dictionaries({"const": st.text(max_size=12)}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/$defs/A", "#/nope", "http://x/y"])}),
    st.booleans(),
    st.just({}),
    st.integers(),
)


def _composite(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.text(min_size=0, max_size=10)
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(names, children, max_size=5)},
            optional={
                "required": st.lists(names, max_size=4),
                "additionalProperties": st.one_of(st.booleans(), children),
                "description": st.text(max_size=30),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={"items": st.one_of(children, st.lists(children, max_size=3)), "prefixItems": st.lists(children)},
        ),
        st.fixed_dictionaries({st.sampled_from(["anyOf", "oneOf", "allOf"]): st.lists(children, max_size=4)}),
        st.fixed_dictionaries(
            {"type": st.lists(st.sampled_from(["string", "object", "array", "null"]), max_size=3)},
            optional={"properties": children, "items": children, "required": st.text(max_size=3)},
        ),
    )


_schemas = st.recursive(_leaf, _composite, max_leaves=40).map(
    lambda s: {"type": "object", "properties": {"root": s}, "$defs": {"A": s}} if isinstance(s, dict) else s
)


@settings(max_examples=300, deadline=None)
@given(schema=_schemas, max_chars=st.integers(min_value=0, max_value=200))
def test_hints_never_exceed_max_chars_and_never_raise(schema: Any, max_chars: int) -> None:
    hint = input_hint(schema, max_chars=max_chars)
    assert len(hint) <= max_chars
    assert "\n" not in hint
    out = output_hint(schema, max_chars=max_chars)
    assert out is None or (len(out) <= max_chars and "unknown" not in out)
    fields = search_fields(schema, schema)
    assert len(fields) <= 64 and all(len(field) <= 200 for field in fields)


# ---- quick_index --------------------------------------------------------------------------------


def _entry(tool_id: str, output: str | None = None, source: str = "host") -> dict[str, Any]:
    entry: dict[str, Any] = {"id": tool_id, "name": tool_id.rsplit(":", 1)[-1], "source": source}
    entry["input"] = "{ q: string }"
    entry["description"] = "SECRET prose that must not appear"
    if output is not None:
        entry["output"] = output
    return entry


def test_quick_index_orders_declared_outputs_first_and_excludes_mcp() -> None:
    entries = [
        _entry("host:core:zeta", "number"),
        _entry("host:core:alpha"),
        _entry("mcp:srv:search", "string", source="mcp"),
        _entry("client:app:beta", "boolean"),
        _entry("host:core:gamma"),
    ]
    assert quick_index(entries) == "\n".join(
        [
            "- client:app:beta { q: string } -> boolean",
            "- host:core:zeta { q: string } -> number",
            "- host:core:alpha { q: string } -> ?",
            "- host:core:gamma { q: string } -> ?",
        ]
    )  # the MCP tool is neither listed nor counted: tools.search and ALL_TOOLS do not have it
    assert quick_index(list(reversed(entries))) == quick_index(entries)
    assert "SECRET" not in quick_index(entries)


def test_quick_index_stops_within_budget_with_footer() -> None:
    entries = [_entry(f"host:core:t{i:02d}") for i in range(50)]
    line = len("- host:core:t00 { q: string } -> ?")
    full = quick_index(entries, max_chars=100_000)
    assert "more:" not in full and len(full) == 50 * line + 49
    for max_chars in range(0, 400, 7):
        text = quick_index(entries, max_chars=max_chars)
        assert len(text) <= max_chars
    text = quick_index(entries, max_chars=200)
    lines = text.split("\n")
    shown = len(lines) - 1
    assert lines[:shown] == full.split("\n")[:shown]
    assert lines[-1] == f"(+{50 - shown} more: use tools.search(...) or ALL_TOOLS)"
    # One more line would not have fit next to the footer.
    assert len(text) + line + 1 > 200


def test_quick_index_uses_the_room_the_footer_frees() -> None:
    entries = [_entry("host:core:a"), _entry("host:core:b")]
    exact = quick_index(entries, max_chars=1000)
    assert quick_index(entries, max_chars=len(exact)) == exact
    assert quick_index([], max_chars=10) == ""


# ---- search_fields ------------------------------------------------------------------------------


def test_search_fields_names_and_descriptions_from_input_and_closed_output() -> None:
    schema, output = schemas_from_function(find_shipments)
    assert search_fields(schema, output) == [
        "query",
        "Free text to match against shipment ids",
        "limit",
        "mode",
        "id",
        "paid",
        "tons",
    ]
    open_output = {"type": "object", "properties": {"leak": {"type": "string"}}}
    assert search_fields(schema, open_output) == search_fields(schema, None)


def test_search_fields_are_capped() -> None:
    props = {f"field{i}": {"type": "string", "description": "d" * 500 + str(i)} for i in range(100)}
    fields = search_fields({"type": "object", "properties": props}, None)
    assert len(fields) == 64
    assert all(len(field) <= 200 for field in fields)
    assert fields[:2] == ["field0", "d" * 200]


# ---- compile_output_validator -------------------------------------------------------------------


def test_validator_accepts_good_values_and_rejects_bad_ones_without_echoing() -> None:
    output = output_of(find_shipments)
    assert output is not None
    check = compile_output_validator(output)
    assert check([{"id": "a", "paid": True, "tons": 1.5}, {"id": "b", "paid": False, "tons": 2}]) is None
    message = check([{"id": "a", "paid": "SECRET-123", "tons": 1}])
    assert message == "data[0].paid must be boolean"
    assert check([{"id": "a", "paid": True}]) == "data[0] is missing required properties tons"
    extra = check([{"id": "a", "paid": True, "tons": 1, "SECRET-KEY": "SECRET-VALUE"}])
    assert extra is not None and "SECRET" not in extra
    assert check({"id": "a"}) == "data must be array"


def test_validator_hides_undeclared_keys_in_paths() -> None:
    check = compile_output_validator({"type": "object", "additionalProperties": {"type": "integer"}})
    message = check({"SECRET.key": "SECRET-VALUE"})
    assert message is not None and "SECRET" not in message
    assert message == "data.*.* must be integer"


def test_validator_checks_tuples_from_msgspec() -> None:
    def tool() -> Pair:
        raise NotImplementedError

    output = output_of(tool)
    assert output is not None and "prefixItems" in json.dumps(output)
    check = compile_output_validator(output)
    assert check({"left": 1, "right": [2, "x"]}) is None
    assert check({"left": 1, "right": [2, 3]}) == "data.right[1] must be string"
    assert check({"left": 1, "right": [2, "x", 3]}) == "data.right violates maxItems 2"


def test_validator_does_not_fill_defaults_or_enforce_formats() -> None:
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time", "default": "x"}}}
    check = compile_output_validator(schema)
    value: dict[str, Any] = {}
    assert check(value) is None and value == {}
    assert check({"when": "2024-01-01T00:00:00"}) is None  # a naive datetime, as msgspec encodes it


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strin"},
        {"properties": 3},
        {"pattern": "("},
        {"minimum": "x"},
        {"$ref": "#/nope"},
        {"$ref": "http://127.0.0.1:9/schema.json"},
    ],
)
def test_invalid_schema_raises_tool_definition_error(schema: dict[str, Any]) -> None:
    with pytest.raises(ToolDefinitionError, match="invalid output schema"):
        compile_output_validator(schema)
