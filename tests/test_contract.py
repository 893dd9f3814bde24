"""The model-facing contract and the catalog calls a cell makes: the `exec` schema a strict
provider accepts, what the `exec` description promises, which cells the front end refuses
and which it runs, the failure messages the reference words, how a cell names a tool, what an
unknown one is told, and what a `waiting` result says of its pending calls."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from codemode import CodeMode, _engine, protocol
from codemode.model_surface import EXEC_PREAMBLE
from codemode.surfaces import strict_problem, to_openai
from mcp_servers import everything_server

# ---- the exec schema ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ccm():
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 5000}) as cm:

        @cm.tool(owner="weather", read_only=True)
        def get_weather(city: str) -> str:
            """Current weather for a city."""
            return f"sunny in {city}"

        @cm.tool(owner="images")
        def resize_image(path: str, width: int) -> str:
            """Make an image smaller."""
            return f"{path}@{width}"

        @cm.tool(owner="a")
        def lookup(key: str) -> str:
            return f"a:{key}"

        @cm.tool(owner="b", name="lookup")
        def lookup_b(key: str) -> str:
            return f"b:{key}"

        @cm.tool(owner="vault")
        def read_secret(name: str) -> str:
            return "hunter2"

        @cm.tool(direct_only=True)
        def screenshot(region: str = "all") -> str:
            """A picture of the screen (it cannot cross the bridge); `region` is optional, so its
            schema is not strict-valid."""
            return f"shot {region}"

        cm.set_policy(deny=["host:vault:*"])
        yield cm


@pytest.fixture
def cs(ccm):
    return ccm.session("contract")


def value(session: Any, code: str) -> Any:
    result = session.exec({"code": code})
    assert result["status"] == "completed", result
    return result["value"]


def test_the_code_surface_is_valid_in_openai_strict_mode(cs):
    tools = {t.name: t for t in cs.model_tools("code")}
    for name in ("exec", "wait"):
        assert strict_problem(tools[name].input_schema) is None, name
    assert strict_problem(cs.model_tools("tool_search_code")[0].input_schema) is None
    rendered = {t["function"]["name"]: t["function"] for t in to_openai(list(tools.values()))}
    assert rendered["exec"]["strict"] is True and rendered["wait"]["strict"] is True
    # A tool whose schema is not strict-valid is sent without asking for strict mode.
    assert "strict" not in rendered["screenshot"]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, "required"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "additionalProperties"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "enum": ["x", None]}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "enum value None",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "x"}}}}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "$.a[]",
        ),
        ({"type": "array", "items": {"type": "string"}}, "root must be an object"),
    ],
)
def test_strict_mode_check_names_what_a_strict_provider_refuses(schema, problem):
    found = strict_problem(schema)
    assert found is not None and problem in found, found


def test_strict_mode_nulls_stand_for_the_defaults(cs):
    result = cs.handle("exec", {"code": "return 40 + 2", "language": None, "restartSafe": None})
    assert result["status"] == "completed" and result["value"] == 42, result
    typed = cs.handle("exec", {"code": "const n: number = 2; return n", "language": "typescript", "restartSafe": False})
    assert typed["value"] == 2, typed
    assert cs.handle("exec", {"code": "return 1", "language": "python", "restartSafe": None})["code"] == "invalid_input"


def test_the_exec_description_says_what_a_cell_cannot_do_and_where_mcp_declarations_are(ccm):
    for text in (EXEC_PREAMBLE, ccm.exec_description()):
        assert "`import`, `require`" in text
        assert 'API.list("mcp")' in text and 'API.read("mcp/<server>.d.ts")' in text


# ---- what the front end refuses and runs -----------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "return (0, require)('fs')",
        "return globalThis.require('fs')",
        "return globalThis['require']('fs')",
        "const r = require; return r('fs')",
        "const f = () => import.meta.url; return f()",
        "if (true) { import('fs') }",
    ],
)
def test_disguised_loaders_are_refused_before_the_cell_runs(cs, code):
    result = cs.exec({"code": code})
    assert result["status"] == "failed" and result["code"] == "invalid_input", result
    assert result["error"].startswith("code mode module access is disabled."), result


def test_valid_sloppy_mode_code_runs_as_a_javascript_engine_runs_it(cs):
    assert value(cs, "const yield = 10; return yield") == 10
    assert value(cs, "var let = 1; with ({b: 2}) { return let + b + 010 }") == 11
    # Strict mode stays the cell's to ask for.
    strict = cs.exec({"code": "'use strict'; const yield = 10; return yield"})
    assert strict["code"] == "invalid_input", strict


def test_a_cell_cannot_run_code_outside_the_function_body_it_is(cs):
    result = cs.exec({"code": "}); globalThis.escaped = 1; (async () => {"})
    assert result["code"] == "invalid_input" and "cannot close it" in result["error"], result
    assert value(cs, "return typeof globalThis.escaped") == "undefined"


# ---- the reference's words where the spec names none -------------------------------------------------


def test_limit_failures_keep_the_reference_phrases(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 200, "maxOutputBytes": 1024, "maxSnapshotBytes": 1 << 20})
    session = cm.session("limits")
    timeout = session.exec({"code": "for (;;) {}"})
    assert timeout["code"] == "timeout" and "code mode timeout exceeded" in timeout["error"], timeout
    output = session.exec({"code": "for (let i = 0; i < 100; i++) text('x'.repeat(100)); return 1"})
    assert output["code"] == "output_limit_exceeded", output
    assert "code mode output limit exceeded" in output["error"], output
    snapshot = session.exec({"code": "globalThis.big = 'x'.repeat(2 << 20) + 'y'; await yield_control(); return 1"})
    assert snapshot["code"] == "snapshot_limit_exceeded", snapshot
    assert "code mode snapshot limit exceeded" in snapshot["error"] and "maxSnapshotBytes" in snapshot["error"]


# ---- naming a tool ----------------------------------------------------------------------------------


def test_call_value_and_call_take_an_exact_unambiguous_tool_name(cs):
    assert value(cs, "return await tools.callValue('get_weather', {city: 'Oslo'})") == "sunny in Oslo"
    assert value(cs, "return await tools.call('resize_image', {path: 'a.png', width: 9})") == {
        "tool": "resize_image",
        "result": "a.png@9",
    }
    ambiguous = "try { await tools.callValue('lookup', {key: 'k'}) } catch (e) { return e.message }"
    message = value(cs, ambiguous)
    assert "ambiguous" in message and "host:a:lookup" in message and "host:b:lookup" in message
    assert value(cs, "return await tools.callValue('host:b:lookup', {key: 'k'})") == "b:k"


def test_an_unknown_tool_suggests_the_closest_names_and_tools_search(cs):
    message = value(cs, "try { await tools.callValue('get_wether', {}) } catch (e) { return e.message }")
    assert message.startswith("unknown tool: get_wether. Did you mean: get_weather"), message
    assert "tools.search" in message


def test_a_denied_tool_answers_as_an_absent_one_and_is_never_suggested(cs):
    denied = value(cs, "try { await tools.callValue('host:vault:read_secret', {}) } catch (e) { return e.message }")
    by_name = value(cs, "try { await tools.callValue('read_secret', {}) } catch (e) { return e.message }")
    assert denied.startswith("unknown tool: host:vault:read_secret.") and "read_secret" not in denied.split(".", 1)[1]
    assert by_name.startswith("unknown tool: read_secret.") and "host:vault" not in by_name


def test_tool_call_on_a_direct_only_tool_says_to_call_it_directly(cs):
    for given in ("host:core:screenshot", "screenshot"):
        answer = cs.handle("tool_call", {"id": given, "args": {"region": "all"}})
        assert "direct-only" in answer["error"] and "call your `screenshot` tool directly" in answer["error"], answer
    assert cs.handle("screenshot", {"region": "all"})["result"] == "shot all"


def test_tool_call_with_an_unknown_id_points_at_tool_search(cs):
    for given in ("host:weather:nope", "host:vault:read_secret"):
        answer = cs.handle("tool_call", {"id": given, "args": {}})
        assert answer["error"].startswith(f"unknown tool: {given}.") and "tool_search" in answer["error"], answer


# ---- what a waiting result says of its calls --------------------------------------------------------


def test_the_bridge_method_names_are_one_list_on_both_sides():
    assert typing.get_args(protocol.CallMethod) == _engine.CALL_METHODS


@pytest.fixture
def gated(gated_namespace):
    """A read-only tool (and a namespace over it) that answers only once ``gate`` is set."""
    return gated_namespace(read_only=True)


def test_pending_calls_name_their_bridge_method(gated):
    cm, gate = gated
    session = cm.session("methods")
    code = """return await Promise.all([tools.callValue('host:slow:slow_fetch', {key: 'a'}),
        tools.call('slow_fetch', {key: 'b'}), Slow.fetch('c'), tools.slow_fetch({key: 'd'})])"""
    waiting = session.exec({"code": code})
    assert waiting["status"] == "waiting", waiting
    pending = [(c["toolId"], c["method"]) for c in waiting["pendingToolCalls"]]
    assert pending == [
        ("host:slow:slow_fetch", "callValue"),
        ("host:slow:slow_fetch", "call"),
        ("host:slow:slow_fetch", "namespace"),
        ("host:slow:slow_fetch", "callValue"),
    ]
    assert "replaySafe" not in waiting
    gate.set()
    done = session.wait({"runId": waiting["runId"]})
    assert done["value"][1] == {"tool": "slow_fetch", "result": "fetched b"}, done


def test_a_restart_safe_runs_waiting_result_is_marked_replay_safe(gated):
    cm, gate = gated
    session = cm.session("replay-safe")
    waiting = session.exec({"code": "return await tools.callValue('slow_fetch', {key: 'k'})", "restartSafe": True})
    assert waiting["status"] == "waiting" and waiting["replaySafe"] is True, waiting
    gate.set()
    for _ in range(10):
        if waiting["status"] != "waiting":
            break
        assert waiting["replaySafe"] is True
        waiting = session.wait({"runId": waiting["runId"]})
    assert waiting["value"] == "fetched k", waiting


def test_a_pending_mcp_call_is_named_an_mcp_call(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 300, "mcpServers": {"everything": everything_server()}})
    assert cm.load_mcp_tools() == {"everything": None}
    session = cm.session("mcp-method")
    code = "return (await MCP.everything.triggerLongRunningOperation({duration: 1, steps: 1})).content.length"
    waiting = session.exec({"code": code})
    assert waiting["status"] == "waiting", waiting
    assert [(c["toolId"], c["method"]) for c in waiting["pendingToolCalls"]] == [
        ("mcp:everything:trigger-long-running-operation", "mcp")
    ]
    session.cancel(waiting["runId"])
