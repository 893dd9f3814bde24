"""Host tools seen from a cell: calls, errors, non-JSON results, hangs, limits, the catalog."""

from __future__ import annotations

import asyncio
import threading

import pytest
from codemode import CodeMode, ToolDefinitionError

MAX_PENDING = 4

# Guest snippet: the caught error's shape, as JSON-safe facts.
ERROR_FACTS = """
  return {
    isError: e instanceof Error,
    protoIsError: Object.getPrototypeOf(e) === Error.prototype,
    ctorIsError: e.constructor === Error,
    keys: Object.keys(e),
    ownNames: Object.getOwnPropertyNames(e).sort(),
    name: e.name,
    message: e.message,
  };
"""


class Concurrency:
    """Counts async tool calls running at once (on the tool loop's thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def reset(self) -> None:
        with self.lock:
            self.now = self.peak = 0


@pytest.fixture(scope="module")
def concurrency() -> Concurrency:
    return Concurrency()


@pytest.fixture(scope="module")
def tcm(concurrency: Concurrency):
    with CodeMode({"workers": 1, "timeoutMs": 1000, "maxPendingToolCalls": MAX_PENDING}) as cm:

        @cm.tool
        def add(a: int, b: int) -> int:
            """Adds two numbers."""
            return a + b

        @cm.tool
        async def add_async(a: int, b: int) -> int:
            await asyncio.sleep(0)
            return a + b

        @cm.tool
        def echo(**kwargs):
            return kwargs

        @cm.tool
        def boom() -> None:
            raise ValueError("bad thing")

        @cm.tool
        async def boom_async() -> None:
            await asyncio.sleep(0)
            raise KeyError("missing")

        @cm.tool
        def returns_set():
            return {1, 2}

        @cm.tool
        def returns_object():
            return object()

        @cm.tool
        async def hang() -> None:
            await asyncio.sleep(3600)

        @cm.tool
        async def tracked(i: int) -> int:
            with concurrency.lock:
                concurrency.now += 1
                concurrency.peak = max(concurrency.peak, concurrency.now)
            await asyncio.sleep(0.05)
            with concurrency.lock:
                concurrency.now -= 1
            return i

        @cm.tool(name="weather.lookup", description="Looks up the weather forecast for a city.")
        def weather(city: str) -> dict:
            return {"city": city, "sky": "clear"}

        yield cm


@pytest.fixture
def ts(tcm):
    return tcm.session("tools")


def run(session, code):
    return session.exec({"code": code})


# ---- calling ------------------------------------------------------------------------------------


def test_call_value_passes_input_object_as_kwargs(ts):
    result = run(ts, "return await tools.callValue('host:core:add', {a: 1, b: 2})")
    assert result["status"] == "completed", result
    assert result["value"] == 3


def test_call_wraps_result_with_tool_id(ts):
    result = run(ts, "return await tools.call('host:core:add', {a: 2, b: 3})")
    assert result["value"] == {"tool": "host:core:add", "result": 5}


def test_safe_name_shortcut_calls_the_tool(ts):
    assert run(ts, "return await tools.add({a: 4, b: 5})")["value"] == 9


def test_async_tool_result_reaches_guest(ts):
    assert run(ts, "return await tools.add_async({a: 10, b: 5})")["value"] == 15


def test_tool_input_round_trips_as_json(ts):
    result = run(ts, "return await tools.echo({s: 'x', n: [1, 2.5, null], o: {t: true}})")
    assert result["value"] == {"s": "x", "n": [1, 2.5, None], "o": {"t": True}}


def test_sequential_tool_calls_are_counted_in_telemetry(ts):
    result = run(ts, "let n = 0; for (let i = 0; i < 5; i++) n = await tools.add({a: n, b: 1}); return n")
    assert result["value"] == 5
    assert result["telemetry"]["toolCalls"] == 5


def test_promise_all_runs_async_tool_calls_in_parallel(ts, concurrency):
    concurrency.reset()
    result = run(ts, "return await Promise.all([1, 2, 3].map((i) => tools.tracked({i})))")
    assert result["value"] == [1, 2, 3]
    assert concurrency.peak == 3


def test_promise_all_mixes_sync_and_async_tools(ts):
    result = run(ts, "return await Promise.all([tools.add({a: 1, b: 1}), tools.add_async({a: 2, b: 2})])")
    assert result["value"] == [2, 4]


def test_async_tool_runs_on_the_callers_loop_under_exec_async(tcm):
    seen: list[asyncio.AbstractEventLoop] = []

    async def where() -> str:
        seen.append(asyncio.get_running_loop())
        return "here"

    tcm.add_tool(where)

    async def main() -> tuple[dict, asyncio.AbstractEventLoop]:
        result = await tcm.session().exec_async({"code": "return await tools.where()"})
        return result, asyncio.get_running_loop()

    result, loop = asyncio.run(main())
    assert result["value"] == "here"
    assert seen == [loop]


# ---- tool errors --------------------------------------------------------------------------------


def test_tool_exception_is_catchable_plain_error_with_message(ts):
    result = run(ts, "try { await tools.boom(); return 'no throw' } catch (e) {" + ERROR_FACTS + "}")
    facts = result["value"]
    assert facts["isError"] is True
    assert facts["protoIsError"] is True
    assert facts["ctorIsError"] is True
    assert facts["name"] == "Error"
    assert "bad thing" in facts["message"]
    assert "ValueError" in facts["message"]


def test_tool_exception_error_carries_no_extra_keys(ts):
    facts = run(ts, "try { await tools.boom() } catch (e) {" + ERROR_FACTS + "}")["value"]
    assert facts["keys"] == []
    assert set(facts["ownNames"]) <= {"message", "stack"}


def test_tool_exception_message_has_no_python_traceback(ts):
    facts = run(ts, "try { await tools.boom() } catch (e) {" + ERROR_FACTS + "}")["value"]
    assert "Traceback" not in facts["message"]
    assert ".py" not in facts["message"]


def test_async_tool_exception_is_catchable_plain_error(ts):
    facts = run(ts, "try { await tools.boom_async() } catch (e) {" + ERROR_FACTS + "}")["value"]
    assert facts["protoIsError"] is True
    assert "KeyError" in facts["message"]
    assert "missing" in facts["message"]


def test_uncaught_tool_exception_fails_the_run_without_code(ts):
    result = run(ts, "await tools.boom()")
    assert result["status"] == "failed"
    assert "code" not in result
    assert result["error"].startswith("Error: ")
    assert "bad thing" in result["error"]


def test_tool_returning_object_instance_is_catchable_error(ts):
    result = run(ts, "try { await tools.returns_object(); return 'no throw' } catch (e) {" + ERROR_FACTS + "}")
    facts = result["value"]
    assert facts["isError"] is True
    assert "not JSON" in facts["message"]


def test_tool_returning_set_crosses_as_json_array(ts):
    result = run(ts, "const v = await tools.returns_set(); return [...v].sort()")
    assert result["value"] == [1, 2]


def test_unknown_tool_id_is_catchable_error(ts):
    cell = "try { await tools.callValue('host:core:nope', {}); return 'no throw' } catch (e) {" + ERROR_FACTS + "}"
    result = run(ts, cell)
    facts = result["value"]
    assert facts["isError"] is True
    assert "unknown tool" in facts["message"]


def test_call_value_with_non_string_id_is_catchable_error(ts):
    result = run(ts, "try { await tools.callValue(42, {}); return 'no throw' } catch (e) { return e.message }")
    assert "id must be a string" in result["value"]


def test_exceeding_max_pending_tool_calls_is_catchable_error(ts):
    calls = f"Array.from({{length: {MAX_PENDING + 1}}}, (_, i) => tools.tracked({{i}}))"
    code = f"try {{ await Promise.all({calls}); return 'no throw' }}"
    code += " catch (e) { return [e instanceof Error, e.message] }"
    is_error, message = run(ts, code)["value"]
    assert is_error is True
    assert "too many pending tool calls" in message


def test_max_pending_tool_calls_allows_exactly_the_limit(ts):
    code = f"return (await Promise.all(Array.from({{length: {MAX_PENDING}}}, (_, i) => tools.tracked({{i}})))).length"
    assert run(ts, code)["value"] == MAX_PENDING


def test_hanging_tool_suspends_the_run_at_the_deadline(ts):
    result = run(ts, "return await tools.hang()")
    assert result["status"] == "waiting"
    assert result["reason"] == "pending_tools"
    assert [c["toolId"] for c in result["pendingToolCalls"]] == ["host:core:hang"]
    assert ts.cancel(result["runId"]) is True


def test_exec_after_hanging_tool_succeeds(ts, assert_recovers):
    waiting = run(ts, "return await tools.hang()")
    assert waiting["status"] == "waiting"
    ts.cancel(waiting["runId"])
    assert_recovers(ts)
    assert run(ts, "return await tools.add({a: 1, b: 1})")["value"] == 2


# ---- catalog ------------------------------------------------------------------------------------


def test_all_tools_lists_registered_ids(ts):
    ids = run(ts, "return ALL_TOOLS.map((t) => t.id)")["value"]
    assert "host:core:add" in ids
    assert "host:core:weather.lookup" in ids


def test_catalog_entry_carries_name_and_description(ts):
    entry = run(ts, "return await tools.describe('host:core:add')")["value"]
    assert entry["id"] == "host:core:add"
    assert entry["name"] == "add"
    assert entry["description"] == "Adds two numbers."


def test_search_finds_tool_by_description_word(ts):
    ids = run(ts, "return (await tools.search('forecast')).map((t) => t.id)")["value"]
    assert ids[0] == "host:core:weather.lookup"


def test_describe_unknown_tool_rejects(ts):
    result = run(ts, "try { await tools.describe('nope'); return 'no throw' } catch (e) { return e.message }")
    assert "unknown tool" in result["value"]


def test_custom_named_tool_is_callable_by_id(ts):
    result = run(ts, "return await tools.callValue('host:core:weather.lookup', {city: 'Oslo'})")
    assert result["value"] == {"city": "Oslo", "sky": "clear"}


def test_tools_object_is_frozen(ts):
    result = run(ts, "'use strict'; try { tools.add = () => 1; return 'mutated' } catch (e) { return e.name }")
    assert result["value"] == "TypeError"


def test_tool_registered_later_is_visible_to_next_cell(make_codemode):
    cm = make_codemode({"workers": 1})
    session = cm.session()
    assert session.exec({"code": "return ALL_TOOLS.length"})["value"] == 0

    @cm.tool
    def late() -> str:
        return "late"

    assert session.exec({"code": "return await tools.late()"})["value"] == "late"


def test_duplicate_tool_id_is_rejected(tcm):
    with pytest.raises(ToolDefinitionError):
        tcm.add_tool(lambda: 1, name="add")


def test_control_tool_name_is_rejected(tcm):
    with pytest.raises(ToolDefinitionError):
        tcm.add_tool(lambda: 1, name="exec")
