"""Basic exec behaviour: results, outputs, TypeScript, JSON fallbacks, async, config, arguments."""

from __future__ import annotations

import asyncio
import os

import codemode
import pytest
from codemode import ClosedError, CodeMode, CodemodeError, Completed, ConfigError, Failed, StoreError, load_config
from mcp_servers import wait_until

# ---- result shape --------------------------------------------------------------------------------


def test_completed_result_has_exactly_status_value_telemetry(session, run_js):
    result = run_js(session, "return 1 + 2")
    assert result["status"] == "completed"
    assert result["value"] == 3
    assert set(result) == {"status", "value", "telemetry"}


def test_a_completed_result_of_records_is_the_same_json_as_its_struct_gives(session, run_js):
    """A value of objects and arrays is handed over as decoded (not converted once more): the
    result is still exactly the struct's JSON, outputs and key order included."""
    import msgspec
    from codemode.outcomes import Completed

    code = "console.log('n'); return [{a: 1, b: [true, null, 'x']}, {a: 2.5, b: []}, {}]"
    result = run_js(session, code)
    assert result["value"] == [{"a": 1, "b": [True, None, "x"]}, {"a": 2.5, "b": []}, {}]
    assert list(result) == ["status", "value", "telemetry", "output"]
    struct = msgspec.convert(result, Completed)
    assert msgspec.to_builtins(struct) == result
    nested = run_js(session, "return {rows: [1, 2], more: {deep: [[]]}}")
    assert list(nested) == ["status", "value", "telemetry"] and nested["value"] == {
        "rows": [1, 2],
        "more": {"deep": [[]]},
    }


def test_telemetry_reports_catalog_and_model_visible_tools(session, run_js):
    telemetry = run_js(session, "return 1")["telemetry"]
    assert set(telemetry) == {
        "durationMs",
        "toolCalls",
        "searches",
        "describes",
        "memoryBytes",
        "catalogSize",
        "catalogSources",
        "modelVisibleTools",
    }
    assert telemetry["modelVisibleTools"] == ["exec", "wait"]
    assert telemetry["toolCalls"] == 0
    assert telemetry["catalogSize"] == 0
    assert telemetry["memoryBytes"] > 0


def test_uncaught_exception_fails_with_name_and_message_and_no_code(session, run_js):
    result = run_js(session, "throw new TypeError('nope')")
    assert result["status"] == "failed"
    assert result["error"] == "TypeError: nope"
    assert "code" not in result
    assert set(result) == {"status", "error", "telemetry"}


def test_thrown_non_error_value_is_reported_as_error(session, run_js):
    result = run_js(session, "throw 'plain string'")
    assert result["status"] == "failed"
    assert result["error"] == "Error: plain string"


def test_runtime_type_error_is_a_failed_result(session, run_js):
    result = run_js(session, "const o = null; return o.x")
    assert result["status"] == "failed"
    assert result["error"].startswith("TypeError:")


def test_top_level_await_resolves_before_completion(session, run_js):
    result = run_js(session, "const v = await Promise.resolve(20); return v + await 1")
    assert result["status"] == "completed"
    assert result["value"] == 21


def test_cells_do_not_share_globals(session, run_js):
    assert run_js(session, "globalThis.leak = 1; return 1")["status"] == "completed"
    assert run_js(session, "return typeof leak")["value"] == "undefined"


# ---- outputs -------------------------------------------------------------------------------------


def test_outputs_keep_call_order_across_text_json_and_console(session, run_js):
    result = run_js(session, "text('a'); json({b: 1}); console.log('c', 1); console.warn('w'); return 0")
    assert result["output"] == [
        {"type": "text", "text": "a"},
        {"type": "json", "value": {"b": 1}},
        {"type": "text", "text": "c 1"},
        {"type": "text", "text": "[warn] w"},
    ]


def test_console_log_renders_objects_as_json(session, run_js):
    result = run_js(session, "console.log('x', {a: [1, 2]}); return 0")
    assert result["output"] == [{"type": "text", "text": 'x {"a":[1,2]}'}]


def test_console_error_is_prefixed(session, run_js):
    result = run_js(session, "console.error('bad'); return 0")
    assert result["output"] == [{"type": "text", "text": "[error] bad"}]


def test_output_key_is_absent_when_nothing_was_printed(session, run_js):
    assert "output" not in run_js(session, "return 0")


def test_outputs_are_kept_on_a_failed_result(session, run_js):
    result = run_js(session, "text('before'); throw new Error('after')")
    assert result["status"] == "failed"
    assert result["output"] == [{"type": "text", "text": "before"}]


# ---- TypeScript ----------------------------------------------------------------------------------


def test_typescript_types_are_stripped(session, run_js):
    code = "interface P { x: number }\nconst p: P = { x: 41 };\nconst f = (n: number): number => n + 1;\nreturn f(p.x)"
    result = run_js(session, code, "typescript")
    assert result["status"] == "completed", result
    assert result["value"] == 42


def test_typescript_syntax_is_rejected_in_javascript_cells(session, run_js):
    result = run_js(session, "const x: number = 1; return x")
    assert result["status"] == "failed"
    assert result["code"] == "invalid_input"


def test_typescript_syntax_error_reports_line_and_column(session, run_js):
    result = run_js(session, "const a: number = 1;\nconst b: number = ;", "typescript")
    assert result["code"] == "invalid_input"
    assert "(line 2:" in result["error"]


# ---- JSON-safe fallbacks for the final value ------------------------------------------------------


def test_returned_function_becomes_function_marker_with_name(session, run_js):
    assert run_js(session, "return function foo() {}")["value"] == "[Function: foo]"


def test_returned_anonymous_function_becomes_anonymous_marker(session, run_js):
    assert run_js(session, "return (() => {})")["value"] == "[Function: anonymous]"


def test_cycle_becomes_circular_marker(session, run_js):
    result = run_js(session, "const o = {n: 1}; o.self = o; return o")
    assert result["status"] == "completed"
    assert result["value"] == {"n": 1, "self": "[Circular]"}


def test_bigint_becomes_decimal_string(session, run_js):
    assert run_js(session, "return 2n ** 70n")["value"] == str(2**70)


def test_undefined_becomes_null(session, run_js):
    result = run_js(session, "return undefined")
    assert result["status"] == "completed"
    assert result["value"] is None


def test_no_return_completes_with_null(session, run_js):
    result = run_js(session, "const x = 1")
    assert result["status"] == "completed"
    assert result["value"] is None


def test_undefined_array_items_become_null(session, run_js):
    assert run_js(session, "return [undefined, 1]")["value"] == [None, 1]


def test_non_finite_numbers_become_null(session, run_js):
    assert run_js(session, "return [NaN, Infinity, 1.5]")["value"] == [None, None, 1.5]


def test_bigint_nested_in_object_becomes_string(session, run_js):
    assert run_js(session, "return {n: 5n}")["value"] == {"n": "5"}


def test_json_output_uses_the_same_fallbacks(session, run_js):
    result = run_js(session, "const o = {}; o.o = o; json(o); return 0")
    assert result["output"] == [{"type": "json", "value": {"o": "[Circular]"}}]


# ---- typed run and async -------------------------------------------------------------------------


def test_run_returns_completed_struct(session):
    result = session.run("return [1, 'a']")
    assert isinstance(result, Completed)
    assert result.value == [1, "a"]


def test_run_returns_failed_struct_with_code_none_for_guest_exception(session):
    result = session.run("throw new Error('x')")
    assert isinstance(result, Failed)
    assert result.error == "Error: x"
    assert result.code is None


def test_run_typescript_language_keyword(session):
    result = session.run("const n: number = 5; return n * 2", language="typescript")
    assert isinstance(result, Completed)
    assert result.value == 10


def test_run_to_dict_matches_exec_shape(session):
    as_dict = session.run("return 'v'").to_dict()
    assert as_dict["status"] == "completed"
    assert as_dict["value"] == "v"


def test_exec_async_returns_result_dict(session):
    result = asyncio.run(session.exec_async({"code": "return await Promise.resolve('async')"}))
    assert result["status"] == "completed"
    assert result["value"] == "async"


def test_run_async_returns_typed_result(session):
    result = asyncio.run(session.run_async("return 7"))
    assert isinstance(result, Completed)
    assert result.value == 7


def test_concurrent_exec_async_calls_all_complete(session):
    async def many() -> list[dict]:
        return await asyncio.gather(*(session.exec_async({"code": f"return {i}"}) for i in range(5)))

    results = asyncio.run(many())
    assert [r["value"] for r in results] == [0, 1, 2, 3, 4]


# ---- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "field", "given", "expected"),
    [
        ("timeoutMs", "timeout_ms", 1, 100),
        ("timeoutMs", "timeout_ms", 10**9, 60_000),
        ("memoryLimitBytes", "memory_limit_bytes", 1, 1 << 20),
        ("memoryLimitBytes", "memory_limit_bytes", 1 << 40, 1 << 30),
        ("maxOutputBytes", "max_output_bytes", 1, 1024),
        ("maxPendingToolCalls", "max_pending_tool_calls", 0, 1),
        ("maxPendingToolCalls", "max_pending_tool_calls", 1000, 128),
    ],
)
def test_config_numbers_are_clamped_to_their_bounds(key, field, given, expected):
    assert getattr(load_config({key: given}), field) == expected


def test_config_in_range_value_is_kept():
    assert load_config({"timeoutMs": 1234}).timeout_ms == 1234


def test_search_default_limit_is_clamped_to_max_search_limit():
    config = load_config({"searchDefaultLimit": 40, "maxSearchLimit": 10})
    assert config.search_default_limit == 10


def test_codemode_applies_clamped_config(make_codemode):
    cm = make_codemode({"timeoutMs": 5, "workers": 1})
    assert cm.config.timeout_ms == 100
    result = cm.session().exec({"code": "while (true) {}"})
    assert result["code"] == "timeout"


def test_unknown_config_key_raises_config_error():
    with pytest.raises(ConfigError, match="bogus"):
        CodeMode({"bogus": 1})


def test_wrong_config_type_raises_config_error():
    with pytest.raises(ConfigError, match="timeoutMs"):
        CodeMode({"timeoutMs": "fast"})


def test_unknown_language_in_config_raises_config_error():
    with pytest.raises(ConfigError):
        CodeMode({"languages": ["python"]})


def test_empty_languages_raise_config_error():
    with pytest.raises(ConfigError):
        CodeMode({"languages": []})


def _worker_children() -> set[int]:
    """This process's live codemode-worker children (from /proc: no dependency)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm == "codemode-worker" and int(rest[1]) == os.getpid() and rest[0] != "Z":
            pids.add(int(entry))
    return pids


def test_a_store_that_cannot_open_fails_the_constructor_with_no_worker_left_running(tmp_path):
    # The workers start before the store opens (they boot meanwhile): a failure must end them.
    before = _worker_children()
    for target in (tmp_path / "no" / "such" / "dir" / "s.db", "postgresql://127.0.0.1:1/none?connect_timeout=2"):
        with pytest.raises(StoreError, match=r"cannot (open|connect)"):
            CodeMode({"workers": 2}, store=target)
    wait_until(lambda: not _worker_children() - before, "the workers of the failed constructors exited", 5)


def test_negative_workers_raise_config_error():
    with pytest.raises(ConfigError):
        CodeMode({"workers": -1})


def test_config_error_is_a_value_error_and_codemode_error():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, CodemodeError)


def test_non_dict_config_raises_config_error():
    with pytest.raises(ConfigError):
        codemode.load_config(["timeoutMs", 100])  # type: ignore[arg-type]


# ---- exec argument validation ---------------------------------------------------------------------


def test_missing_code_is_invalid_input(session):
    result = session.exec({})
    assert result["status"] == "failed"
    assert result["code"] == "invalid_input"
    assert "code" in result["error"]


@pytest.mark.parametrize("code", ["", "   \n", 5, None])
def test_empty_or_non_string_code_is_invalid_input(session, code):
    result = session.exec({"code": code})
    assert result["code"] == "invalid_input"


def test_non_dict_args_are_invalid_input(session):
    result = session.exec("return 1")  # type: ignore[arg-type]
    assert result["code"] == "invalid_input"


def test_code_and_command_mismatch_is_invalid_input(session):
    result = session.exec({"code": "return 1", "command": "return 2"})
    assert result["code"] == "invalid_input"
    assert "must match" in result["error"]


def test_command_alone_is_accepted_as_code(session):
    result = session.exec({"command": "return 5"})
    assert result["status"] == "completed"
    assert result["value"] == 5


def test_matching_code_and_command_run(session):
    assert session.exec({"code": "return 6", "command": "return 6"})["value"] == 6


def test_unknown_language_is_invalid_input(session):
    result = session.exec({"code": "return 1", "language": "python"})
    assert result["code"] == "invalid_input"


def test_disabled_language_is_invalid_input(make_codemode):
    cm = make_codemode({"workers": 1, "languages": ["javascript"]})
    result = cm.session().exec({"code": "return 1", "language": "typescript"})
    assert result["status"] == "failed"
    assert result["code"] == "invalid_input"
    assert result["error"] == "code mode language typescript is disabled."


def test_enabled_language_still_runs_when_other_is_disabled(make_codemode):
    cm = make_codemode({"workers": 1, "languages": ["javascript"]})
    assert cm.session().exec({"code": "return 1"})["value"] == 1


# ---- lifetime ------------------------------------------------------------------------------------


def test_exec_after_close_raises_closed_error(make_codemode):
    cm = make_codemode({"workers": 1})
    session = cm.session()
    cm.close()
    with pytest.raises(ClosedError):
        session.exec({"code": "return 1"})


def test_session_after_close_raises_closed_error(make_codemode):
    cm = make_codemode({"workers": 1})
    cm.close()
    with pytest.raises(ClosedError):
        cm.session()
