"""Tools defined the way Python users define them: inputs checked with messages a model can act
on, arguments converted to their annotations (dataclasses, Structs, pydantic models), results
serialized from models, a per-call ``ToolContext``, and MCP output schemas in declarations."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import subprocess
import sys
import textwrap
from typing import Annotated, Any, Literal, NamedTuple, TypedDict

import msgspec
import pydantic
import pytest
from codemode import CodeMode, Rewrite, ToolContext, ToolDefinitionError
from codemode.mcp_api import tool_declaration


class Query(pydantic.BaseModel):
    text: str
    limit: int = 5


class Strict(pydantic.BaseModel, extra="forbid"):
    name: str

    @pydantic.field_validator("name")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name must not be blank")
        return value


class Hit(pydantic.BaseModel):
    id: str
    score: float
    when: datetime.date


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Box(msgspec.Struct):
    label: str


class Color(enum.Enum):
    red = "red"
    blue = "blue"


class Span(TypedDict):
    start: int
    end: int


@pytest.fixture(scope="module")
def tdm():
    seen: dict[str, Any] = {}
    with CodeMode({"workers": 1, "timeoutMs": 2000, "enabled": True}) as cm:
        cm.seen = seen  # type: ignore[attr-defined]

        @cm.tool
        def add(a: int, b: int) -> int:
            seen["add"] = (a, b)
            return a + b

        @cm.tool
        def pick(color: Literal["red", "blue"], note: str = "") -> str:
            return color

        @cm.tool
        def shapes(p: Point, box: Box, day: datetime.date, color: Color, pair: tuple[int, int], span: Span) -> str:
            seen["shapes"] = (p, box, day, color, pair, span)
            return "ok"

        @cm.tool
        def ordered(a: int, /, b: int = 2, *, c: int = 3, **rest: Any) -> list[Any]:
            return [a, b, c, rest]

        @cm.tool
        def tagged(tags: list[str] = [], limit: int = 1) -> int:  # noqa: B006
            seen["tagged"] = tags
            return limit

        @cm.tool
        def find_hits(q: Query) -> list[Hit]:
            seen["find_hits"] = q
            return [Hit(id="h1", score=0.5, when=datetime.date(2024, 1, 2))][: q.limit]

        @cm.tool
        def batch(queries: list[Query], strict: Strict | None = None) -> int:
            seen["batch"] = (queries, strict)
            return len(queries)

        @cm.tool
        def broken_contract() -> Hit:
            return {"id": "h1"}  # type: ignore[return-value]

        @cm.tool
        def whoami(x: int, ctx: ToolContext) -> dict[str, Any]:
            return {"x": x, **msgspec.to_builtins(ctx)}

        @cm.tool(owner="ops")
        async def whoami_async(ctx: ToolContext | None = None) -> dict[str, Any]:
            return msgspec.to_builtins(ctx)

        def raw_ctx(ctx: ToolContext, **kw: Any) -> dict[str, Any]:
            return {"kw": kw, "tool": ctx.tool_id}

        cm.add_tool(raw_ctx, input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
        yield cm


def value(cm: CodeMode, code: str, session: str = "defs", **kw: Any) -> Any:
    result = cm.session(session, **kw).exec({"code": code})
    assert result["status"] == "completed", result
    return result["value"]


def error(cm: CodeMode, call: str) -> str:
    return value(cm, f"try {{ await {call}; return 'no error'; }} catch (e) {{ return e.message; }}")


# ---- inputs are checked, with messages a model can act on -------------------------------------------


def test_a_string_for_an_int_names_the_field_the_type_wanted_and_the_value_given(tdm):
    tdm.seen.pop("add", None)
    assert error(tdm, "tools.add({a: '1', b: 2})") == (
        'invalid input for tool host:core:add: $.a: expected int, got str "1". It takes { a: number; b: number }'
    )
    assert "add" not in tdm.seen  # the tool never ran


def test_every_problem_of_an_input_is_listed_at_once(tdm):
    message = error(tdm, "tools.add({a: '1', b: null, c: 3, d: 4})")
    assert message.partition(". It takes")[0] == (
        'invalid input for tool host:core:add: $: object contains unknown fields "c", "d"; '
        '$.a: expected int, got str "1"; $.b: expected int, got null'
    )
    assert error(tdm, "tools.add({})").startswith(
        "invalid input for tool host:core:add: $: object missing required fields a, b. It takes"
    )


def test_a_huge_value_or_key_is_never_echoed_in_full(tdm):
    message = error(tdm, "tools.add({a: 'x'.repeat(100000), b: 2})")
    assert f'$.a: expected int, got str "{"x" * 39}…" (100000 characters)' in message
    assert len(message) < 200
    message = error(tdm, "tools.add({a: 1, b: 2, ['k'.repeat(100000)]: 1})")
    assert f'unknown field "{"k" * 39}…"' in message and len(message) < 200
    message = error(tdm, "tools.pick({color: 'g'.repeat(100000)})")
    assert message.startswith("invalid input for tool host:core:pick: $.color: is not one of the allowed values")
    assert len(message) < 250
    assert message.endswith('It takes { color: "blue" | "red"; note?: string }')


def test_many_problems_are_capped_at_five(tdm):
    keys = ", ".join(f"k{i}: 1" for i in range(20))
    message = error(tdm, f"tools.tagged({{tags: [1, 2], limit: 'x', {keys}}})")
    assert message.partition(". It takes")[0].count("; ") == 2  # unknown keys (one line), tags[0], limit
    assert '"k0", "k1", "k2", "k3", "k4" (and 15 more)' in message
    assert "$.tags[0]: expected str, got int 1" in message and '$.limit: expected int, got str "x"' in message


def test_an_input_a_hook_rewrites_into_a_wrong_shape_fails_without_running_the_tool(make_codemode):
    cm = make_codemode({"workers": 1}, before_tool_call=lambda e: Rewrite({"a": "one", "b": 2}))
    ran: list[int] = []

    @cm.tool
    def add(a: int, b: int) -> int:
        ran.append(a)
        return a + b

    assert error(cm, "tools.add({a: 1, b: 2})") == (
        'tool host:core:add: invalid input: $.a: expected int, got str "one"'
    )
    assert ran == []


def test_a_hook_or_an_approval_that_changes_the_input_in_place_is_what_the_tool_gets(make_codemode):
    # The input is converted once, when it is checked; a hook or an approval callback may still
    # change it (in place, returning nothing), and the tool then gets the changed input.
    def hook(event: Any) -> None:
        event.input["a"] = 10

    def approve(event: Any) -> bool:
        event.input["b"] = 20
        return True

    for checks in ({"before_tool_call": hook}, {"approve": approve}):
        cm = make_codemode({"workers": 1}, **checks)

        @cm.tool
        def add(a: int, b: int) -> int:
            return a + b

        expected = 12 if "before_tool_call" in checks else 21
        assert value(cm, "return await tools.add({a: 1, b: 2})") == expected


# ---- arguments arrive as their annotations say ----------------------------------------------------


def test_dataclass_struct_date_enum_tuple_arguments_arrive_converted_and_a_typeddict_as_a_dict(tdm):
    code = """return await tools.shapes({p: {x: 1, y: 2}, box: {label: "b"}, day: "2024-01-02", color: "red",
        pair: [1, 2], span: {start: 0, end: 3}})"""
    assert value(tdm, code) == "ok"
    assert tdm.seen["shapes"] == (
        Point(1, 2),
        Box("b"),
        datetime.date(2024, 1, 2),
        Color.red,
        (1, 2),
        {"start": 0, "end": 3},
    )


def test_positional_only_keyword_only_and_extra_keyword_arguments_are_passed_as_declared(tdm):
    assert value(tdm, "return await tools.ordered({a: 1})") == [1, 2, 3, {}]
    assert value(tdm, "return await tools.ordered({a: 1, c: 5, extra: [1]})") == [1, 2, 5, {"extra": [1]}]
    assert value(tdm, "return await tools.ordered(7)") == [7, 2, 3, {}]


def test_an_absent_argument_takes_the_functions_own_default(tdm):
    assert value(tdm, "return await tools.tagged({limit: 4})") == 4
    assert tdm.seen["tagged"] == []


# ---- pydantic models, first class ---------------------------------------------------------------------


def test_a_pydantic_parameter_has_its_models_schema_and_arrives_as_a_model(tdm):
    described = value(tdm, "return await tools.describe('find_hits')")
    assert described["input"] == "{ q: { text: string; limit?: number } }"
    assert described["parameters"]["properties"]["q"]["properties"]["limit"] == {
        "default": 5,
        "title": "Limit",
        "type": "integer",
    }
    assert value(tdm, "return await tools.find_hits({q: {text: 'x', limit: 0}})") == []
    assert tdm.seen["find_hits"] == Query(text="x", limit=0)
    assert type(tdm.seen["find_hits"]) is Query


def test_a_returned_model_is_serialized_and_its_schema_is_a_closed_output_contract(tdm):
    described = value(tdm, "return await tools.describe('find_hits')")
    assert described["output"] == "Array<{ id: string; score: number; when: string }>"
    assert value(tdm, "return await tools.find_hits({q: {text: 'x'}})") == [
        {"id": "h1", "score": 0.5, "when": "2024-01-02"}
    ]
    assert "host:core:find_hits { q: { text: string; limit?: number } } -> Array<" in tdm.exec_description()
    assert error(tdm, "tools.broken_contract()") == (
        "tool host:core:broken_contract returned a value that breaks its output contract: "
        "data is missing required properties score, when"
    )


def test_pydantic_errors_carry_their_paths_validators_and_extra_rules(tdm):
    message = error(tdm, "tools.batch({queries: [{text: 'a'}, {text: 3, limit: 'z'}], strict: {name: ' ', x: 1}})")
    assert message.partition(". It takes")[0] == (
        "invalid input for tool host:core:batch: "
        "$.queries[1].text: input should be a valid string, got int 3; "
        '$.queries[1].limit: input should be a valid integer, unable to parse string as an integer, got str "z"; '
        '$.strict.name: value error, name must not be blank, got str " "; '
        "$.strict.x: extra inputs are not permitted"
    )
    assert value(tdm, "return await tools.batch({queries: [{text: 'a'}], strict: {name: 'n'}})") == 1
    assert tdm.seen["batch"] == ([Query(text="a")], Strict(name="n"))


def test_codemode_imports_and_defines_tools_without_pydantic():
    script = textwrap.dedent(
        """
        import sys
        sys.modules["pydantic"] = None  # importing it now fails
        import dataclasses
        from codemode import CodeMode

        @dataclasses.dataclass
        class P:
            x: int

        with CodeMode({"workers": 1}) as cm:
            @cm.tool
            def f(p: P) -> int:
                return p.x

            result = cm.session().exec({"code": "return await tools.f({p: {x: 4}})"})
            assert result["value"] == 4, result
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


# ---- ToolContext ------------------------------------------------------------------------------------


def test_a_context_parameter_is_filled_in_per_call_and_left_out_of_the_input(tdm):
    described = value(tdm, "return await tools.describe('whoami')")
    assert described["input"] == "{ x: number }"
    assert "ctx" not in described["parameters"]["properties"]
    s = tdm.session("ctx-session", agent_run="agent-7")
    waiting = s.exec({"code": "const a = await tools.whoami({x: 1}); await yield_control('look'); return a"})
    assert waiting["status"] == "waiting", waiting
    done = s.wait({"runId": waiting["runId"]})
    assert done["value"] == {
        "x": 1,
        "session_id": "ctx-session",
        "tool_id": "host:core:whoami",
        "agent_run": "agent-7",
        "run_id": waiting["runId"],
        "call_id": 1,
    }


def test_an_async_tool_gets_its_context_and_the_catalog_id_it_was_called_by(tdm):
    got = value(tdm, "return await tools.callValue('whoami_async', {})", session="ctx2")
    assert (got["tool_id"], got["session_id"], got["agent_run"]) == ("host:ops:whoami_async", "ctx2", None)
    assert got["run_id"]


def test_a_host_side_call_gets_a_context_with_no_run(tdm):
    surface = tdm.session("host-side")
    answer = surface.handle("tool_call", {"id": "host:core:whoami", "args": {"x": 2}})
    assert answer["result"]["run_id"] == "" and answer["result"]["session_id"] == "host-side"


def test_a_tool_with_an_explicit_schema_gets_its_input_as_is_and_its_context(tdm):
    assert value(tdm, "return await tools.raw_ctx({n: 1, other: 'kept'})") == {
        "kw": {"n": 1, "other": "kept"},
        "tool": "host:core:raw_ctx",
    }


def test_two_context_parameters_or_a_positional_only_one_are_refused(make_codemode):
    cm = make_codemode({"workers": 1})

    def two(a: ToolContext, b: ToolContext) -> None: ...

    def positional(ctx: ToolContext, /) -> None: ...

    with pytest.raises(ToolDefinitionError, match="tool two: only one parameter may take the ToolContext"):
        cm.add_tool(two)
    with pytest.raises(ToolDefinitionError, match="the ToolContext parameter ctx must be passable by keyword"):
        cm.add_tool(positional)


# ---- MCP output schemas in declarations --------------------------------------------------------------


class _McpTool(NamedTuple):
    id: str
    name: str
    owner: str
    description: str
    input_schema: dict[str, Any] | None
    declared_output_schema: dict[str, Any] | None


def test_an_mcp_output_schema_types_structured_content_in_the_declaration():
    output = {
        "type": "object",
        "properties": {"temp": {"type": "number"}, "unit": {"enum": ["C", "F"]}},
        "required": ["temp"],
        "additionalProperties": False,
    }
    tool = _McpTool("mcp:w:get", "get", "w", "Weather.", {"type": "object"}, output)
    assert tool_declaration(tool, "get").endswith(
        "function get(input?: Record<string, unknown>): Promise<McpToolResult & { structuredContent?: { temp: number;"
        ' unit?: "C" | "F" } }>;'
    )
    assert tool_declaration(tool._replace(declared_output_schema=None), "get").endswith("Promise<McpToolResult>;")


def test_annotated_constraints_still_check_through_conversion(make_codemode):
    cm = make_codemode({"workers": 1})

    @cm.tool
    def pages(n: Annotated[int, msgspec.Meta(ge=1, le=10)]) -> int:
        return n

    assert error(cm, "tools.pages({n: 11})").startswith(
        "invalid input for tool host:core:pages: $.n: expected int <= 10"
    )


def test_pydantic_field_metadata_describes_checks_and_defaults_a_plain_parameter(make_codemode):
    cm = make_codemode({"workers": 1})
    got: list[Any] = []

    @cm.tool
    def page(
        n: Annotated[int, pydantic.Field(ge=1, description="page number")],
        size: int = pydantic.Field(10, le=50),
        seen: list[int] = pydantic.Field(default_factory=list),  # noqa: B008 (the FastMCP way, under test)
    ) -> int:
        seen.append(n)
        got.append((n, size, seen))
        return n

    described = value(cm, "return await tools.describe('page')")
    assert described["input"] == "{ n: number; size?: number; seen?: number[] }"
    assert described["parameters"]["properties"]["n"] == {"description": "page number", "minimum": 1, "type": "integer"}
    assert value(cm, "return [await tools.page({n: 1}), await tools.page({n: 2})]") == [1, 2]
    assert got == [(1, 10, [1]), (2, 10, [2])]  # the Field's default, a fresh list per call
    assert error(cm, "tools.page({n: 0, size: 99})").partition(". It takes")[0] == (
        "invalid input for tool host:core:page: $.n: input should be greater than or equal to 1, got int 0; "
        "$.size: input should be less than or equal to 50, got int 99"
    )


class Opaque:
    """A class msgspec and pydantic know nothing of."""


def test_a_parameter_of_an_unknown_class_takes_its_json_as_it_is(make_codemode):
    cm = make_codemode({"workers": 1})

    @cm.tool
    def keep(thing: Opaque, more: list[Opaque] = []) -> list[Any]:  # noqa: B006
        return [thing, more]

    assert value(cm, "return await tools.describe('keep')")["input"] == "{ thing: unknown; more?: unknown }"
    assert value(cm, "return await tools.keep({thing: {a: 1}, more: [2]})") == [{"a": 1}, [2]]
