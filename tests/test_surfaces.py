"""Model-facing surfaces, `handle`, the cell pragma, and the seed-002 cell features."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from codemode import CodeMode
from codemode.policy import ToolCallEvent
from codemode.surfaces import SURFACES, to_anthropic, to_openai

CALLS: list[str] = []


def record(event: ToolCallEvent) -> None:
    CALLS.append(event.tool_id)


@pytest.fixture(scope="module")
def scm():
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 5000}, before_tool_call=record) as cm:

        @cm.tool(owner="weather")
        def forecast(city: str) -> dict[str, Any]:
            """Weather forecast for a city."""
            return {"city": city, "sky": "clear"}

        @cm.tool(direct_only=True)
        def computer(action: str) -> str:
            """Drive the screen (results cannot cross the bridge)."""
            return f"did {action}"

        yield cm


@pytest.fixture
def ss(scm):
    return scm.session("surfaces")


def names(tools) -> list[str]:
    return [t.name for t in tools]


def test_code_surface_is_exec_wait_and_direct_only_tools(ss):
    assert names(ss.model_tools("code")) == ["exec", "wait", "computer"]


def test_each_surface_exposes_its_controls(ss):
    assert names(ss.model_tools("tool_search_code")) == ["tool_search_code", "computer"]
    assert names(ss.model_tools("tool_search")) == ["tool_search", "tool_describe", "tool_call", "computer"]
    assert names(ss.model_tools("directory")) == ["tool_search", "tool_describe", "tool_call", "computer"]
    assert names(ss.model_tools("direct")) == ["forecast", "computer"]


def test_directory_surface_lists_names_and_descriptions(ss):
    search = ss.model_tools("directory")[0]
    assert "host:weather:forecast: Weather forecast for a city." in search.description


def test_disabled_config_keeps_the_direct_surface(make_codemode):
    cm = make_codemode({"workers": 1, "enabled": False})
    cm.add_tool(lambda city: city, name="forecast")
    assert names(cm.model_tools("code")) == ["forecast"]


def test_config_object_without_enabled_true_stays_disabled(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 1000})
    cm.add_tool(lambda city: city, name="forecast")
    assert names(cm.model_tools("code")) == ["forecast"]


def test_disable_tools_and_empty_catalog_never_engage(make_codemode, ss):
    assert ss.model_tools("code", disable_tools=True) == []
    empty = make_codemode({"workers": 1, "enabled": True})
    assert names(empty.model_tools("code")) == []
    denied = make_codemode({"workers": 1, "enabled": True})
    denied.add_tool(lambda: 1, name="only")
    denied.set_policy(allow=[])
    assert names(denied.model_tools("code")) == []


def _walk(node: Any) -> list[str]:
    keys: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            keys.append(key)
            keys.extend(_walk(value))
    elif isinstance(node, list):
        for value in node:
            keys.extend(_walk(value))
    return keys


@pytest.mark.parametrize("surface", SURFACES)
def test_schemas_are_provider_safe(ss, surface):
    rendered = to_openai(ss.model_tools(surface))
    keys = _walk(rendered)
    assert "oneOf" not in keys and "anyOf" not in keys
    for tool in rendered:
        assert tool["type"] == "function"
        assert tool["function"]["parameters"]["type"] == "object"


def test_exec_language_is_a_flat_nullable_string_enum(ss):
    exec_tool = ss.model_tools("code")[0]
    assert exec_tool.input_schema["properties"]["language"] == {
        "type": ["string", "null"],
        "enum": ["javascript", "typescript", None],
        "description": "null means javascript.",
    }
    anthropic = to_anthropic([exec_tool])[0]
    assert set(anthropic) == {"name", "description", "input_schema"}


def test_the_same_tool_is_called_on_every_surface(ss):
    CALLS.clear()
    assert ss.handle("exec", {"code": "return (await tools.forecast({city: 'Oslo'})).sky"})["value"] == "clear"
    cell = "return (await codemode.tools.call('host:weather:forecast', {city: 'Oslo'})).result.sky"
    assert ss.handle("tool_search_code", {"code": cell})["value"] == "clear"
    hits = ss.handle("tool_search", {"query": "weather forecast"})["results"]
    assert hits[0]["id"] == "host:weather:forecast"
    assert ss.handle("tool_describe", {"id": "host:weather:forecast"})["parameters"]["required"] == ["city"]
    called = ss.handle("tool_call", {"id": "host:weather:forecast", "args": {"city": "Oslo"}})
    assert called == {"tool": "host:weather:forecast", "result": {"city": "Oslo", "sky": "clear"}}
    assert ss.handle("forecast", {"city": "Oslo"})["result"]["sky"] == "clear"
    assert ss.handle("computer", {"action": "click"})["result"] == "did click"
    # the model's own exec call has its hook event too (tool_kind code_mode_exec), then the nested calls
    assert CALLS == ["exec"] + ["host:weather:forecast"] * 4 + ["host:core:computer"]


def test_unknown_model_tool_is_an_error_result(ss):
    assert "unknown tool" in ss.handle("rm_rf", {})["error"]


def test_payloads_of_a_500_tool_catalog_shrink_by_an_order_of_magnitude(make_codemode):
    cm = make_codemode({"workers": 1, "enabled": True})
    for i in range(500):
        cm.add_tool(
            lambda **kw: kw,
            name=f"tool_{i}",
            description=f"Does thing number {i} with records, filters and pagination.",
            input_schema={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {"type": "integer", "description": "At most this many."},
                    "cursor": {"type": "string", "description": "Where the previous page ended."},
                },
                "required": ["query"],
            },
        )
    sizes = cm.payload_telemetry()
    assert sizes["code"] <= sizes["direct"] * 0.10, sizes
    assert sizes["tool_search"] < sizes["direct"] and sizes["tool_search_code"] < sizes["direct"]


# ---- the cell pragma -------------------------------------------------------------------------------


def test_options_pragma_timeout_applies(ss):
    started = time.monotonic()
    result = ss.exec({"code": '// @options: {"timeout_ms": 200}\nwhile (true) {}'})
    assert result["code"] == "timeout"
    assert time.monotonic() - started < 2.0


def test_exec_pragma_form_is_accepted(ss):
    assert ss.exec({"code": '// @exec: {"timeout_ms": 3000}\nreturn 7'})["value"] == 7


def test_max_output_tokens_keeps_head_and_tail_and_says_what_was_cut(ss):
    code = '// @options: {"max_output_tokens": 10}\nfor (let i = 0; i < 50; i++) text("line " + i); return 1'
    output = ss.exec({"code": code})["output"]
    texts = [o["text"] for o in output]
    assert texts[0] == "line 0"
    assert texts[-1] == "line 49"
    assert any("cut by max_output_tokens" in t for t in texts)
    assert sum(len(t) for t in texts if "cut by" not in t) <= 40


@pytest.mark.parametrize(
    "pragma", ['// @options: {"timeout_ms": -1}', '// @options: {"bogus": 1}', "// @options: {not json}"]
)
def test_invalid_pragma_is_invalid_input(ss, pragma):
    result = ss.exec({"code": pragma + "\nreturn 1"})
    assert result["code"] == "invalid_input"
    assert "pragma" in result["error"] or "@options" in result["error"]


# ---- seed-002 cell features -------------------------------------------------------------------------


def test_exit_ends_the_cell_normally(ss):
    result = ss.exec({"code": "text('before'); exit(); text('after'); return 'never'"})
    assert result["status"] == "completed"
    assert result["value"] is None
    assert result["output"] == [{"type": "text", "text": "before"}]


def test_image_accepts_base64_data_urls_and_rejects_remote_urls(ss):
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="
    code = f"image({json.dumps(png)}); try {{ image('https://example.com/a.png') }}"
    result = ss.exec({"code": code + " catch (e) { return e.message }"})
    assert result["output"] == [{"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}]
    assert "remote URLs are not allowed" in result["value"]


def test_store_survives_a_new_session_on_the_same_branch_and_a_reopened_database(tmp_path):
    db = tmp_path / "store.sqlite"
    with CodeMode({"workers": 1}, store=db) as cm:
        first = cm.session("conv", branch="main")
        assert first.exec({"code": "store('count', 1); store('tags', ['a']); return load('count')"})["value"] == 1
        assert cm.session("conv", branch="main").exec({"code": "return [load('count'), load('tags')]"})["value"] == [
            1,
            ["a"],
        ]
        assert (
            cm.session("conv", branch="other").exec({"code": "return load('count') ?? 'absent'"})["value"] == "absent"
        )
    with CodeMode({"workers": 1}, store=db) as reopened:
        again = reopened.session("conv", branch="main")
        assert again.exec({"code": "store('count', load('count') + 1); return load('count')"})["value"] == 2
        assert again.exec({"code": "store('tags', undefined); return [load('count'), load('tags')]"})["value"] == [
            2,
            None,
        ]


def test_a_failing_cells_store_writes_are_gone(ss):
    failed = ss.exec({"code": "store('temp', 'x'); throw new Error('boom')"})
    assert failed["status"] == "failed"
    assert ss.exec({"code": "return load('temp') === undefined"})["value"] is True
    timed_out = ss.exec({"code": '// @options: {"timeout_ms": 150}\nstore("temp", 1); while (true) {}'})
    assert timed_out["code"] == "timeout"
    assert ss.exec({"code": "return load('temp') === undefined"})["value"] is True


def test_store_limits_are_enforced_in_the_cell(scm):
    ss = scm.session("limits", branch="scratch")
    big = "try { store('big', 'x'.repeat(262145)); return 'stored' } catch (e) { return e.name }"
    assert ss.exec({"code": big})["value"] == "RangeError"
    total = (
        "try { for (let i = 0; i < 5; i++) store('k' + i, 'y'.repeat(250000)); return 'stored' }"
        " catch (e) { return e.message }"
    )
    assert "1,048,576" in ss.exec({"code": total})["value"]


def test_directory_surface_exposes_a_few_likely_schemas_that_handle_can_call(ss):
    tools = ss.model_tools("directory", likely="weather forecast for Oslo")
    assert [t.name for t in tools] == ["tool_search", "tool_describe", "tool_call", "forecast", "computer"]
    assert tools[3].input_schema["required"] == ["city"]
    assert ss.handle("forecast", {"city": "Oslo"})["result"]["sky"] == "clear"


def test_directory_surface_keeps_client_tools_directly_visible(make_codemode):
    """Tool-search spec, directory mode: client-provided tools stay directly visible; the rest
    stays behind the directory (until likely or called by exact name)."""
    cm = make_codemode({"enabled": True, "workers": 1})
    cm.add_tool(lambda city: {"city": city}, name="forecast", description="Weather forecast.")
    cm.add_tool(lambda path="": path, name="pick_file", description="Ask the user for a file.", source="client")
    tools = cm.model_tools("directory")
    assert names(tools) == ["tool_search", "tool_describe", "tool_call", "pick_file"]
    assert names(cm.model_tools("directory", likely="ask the user to pick a file")).count("pick_file") == 1


def test_exec_schema_requires_code_and_the_command_alias_still_runs(ss):
    (exec_tool,) = [t for t in ss.model_tools("code") if t.name == "exec"]
    assert exec_tool.input_schema["required"] == ["code", "language", "restartSafe"]
    assert "command" not in exec_tool.input_schema["properties"]
    # `command` is the spec's alias for hooks and trusted rewrites: exec still takes it.
    assert ss.handle("exec", {"command": "return 6 * 7"})["value"] == 42
    assert ss.handle("exec", {})["code"] == "invalid_input"


def test_the_spec_runtime_name_is_accepted(make_codemode):
    cm = make_codemode({"runtime": "quickjs-wasi", "workers": 1})
    assert cm.session().exec({"code": "return 1"})["value"] == 1


def test_the_models_exec_call_gets_its_own_hook_event(make_codemode):
    """The spec: the outer code-mode `exec` hook event carries toolKind "code_mode_exec" and the
    input kind, so a policy can tell a cell from a shell `exec`; it may block or rewrite it.
    Calls from inside the cell are `code_mode_call`."""
    from codemode.policy import Block, Rewrite

    seen: list[ToolCallEvent] = []

    def hook(event: ToolCallEvent):
        seen.append(event)
        if event.tool_kind == "code_mode_exec" and "forbidden" in str(event.input.get("code")):
            return Block("no forbidden cells")
        if event.tool_kind == "code_mode_exec" and event.input.get("command") == "trusted":
            return Rewrite({"command": "return await tools.exec({cmd: 'ls'})"})
        return None

    cm = make_codemode({"enabled": True, "workers": 1}, before_tool_call=hook)
    cm.add_tool(lambda cmd: f"ran {cmd}", name="exec", owner="shell", description="Shell exec.")
    session = cm.session("hooks")
    result = session.handle("exec", {"code": "return 'forbidden'", "language": "typescript"})
    assert (result["status"], result["code"]) == ("failed", "invalid_input")
    assert result["error"] == "code mode exec blocked: no forbidden cells"
    assert (seen[0].tool_kind, seen[0].tool_input_kind, seen[0].name) == ("code_mode_exec", "typescript", "exec")
    seen.clear()
    assert session.handle("exec", {"command": "trusted"})["value"] == "ran ls"
    kinds = [(e.tool_kind, e.tool_id) for e in seen]
    assert kinds == [("code_mode_exec", "exec"), ("code_mode_call", "host:shell:exec")]
    assert seen[0].tool_input_kind == "javascript" and seen[1].tool_input_kind is None


def test_an_async_hook_sees_the_models_exec_call_too(make_codemode):
    from codemode.policy import Block

    async def hook(event: ToolCallEvent):
        return Block("async says no") if event.tool_kind == "code_mode_exec" else None

    cm = make_codemode({"enabled": True, "workers": 1}, before_tool_call=hook)
    cm.add_tool(lambda: 1, name="one")
    assert cm.session().handle("exec", {"code": "return 1"})["error"] == "code mode exec blocked: async says no"
    assert cm.session().exec({"code": "return await tools.one()"})["value"] == 1  # not through handle
