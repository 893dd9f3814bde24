"""A started tool call is never dropped, and outputs, value and error share one budget.

Seed 000: `exec` returns `completed` only when the guest VM has no pending work. A cell's value
(or its error) is decided when the cell ends; the run ends with it once every call the guest
started has settled, so calls nobody awaits, the losers of a race and the rest of a fail-fast
`Promise.all` still run, to the end, and are never cancelled. Calls still running at the
deadline make the run `waiting`; `wait` delivers them and completes with the decided value.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from codemode import CodeMode


class Ledger:
    """What the tools saw: which calls started, finished, or were cancelled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: list[str] = []
        self.cancelled: list[str] = []

    def note(self, into: list[str], what: str) -> None:
        with self.lock:
            into.append(what)


def add_tools(cm: CodeMode, ledger: Ledger) -> None:
    @cm.tool
    async def work(name: str, ms: int = 0, fail: bool = False) -> str:
        """Sleeps `ms`, then answers (or fails); records how it ended."""
        try:
            await asyncio.sleep(ms / 1000)
        except asyncio.CancelledError:
            ledger.note(ledger.cancelled, name)
            raise
        ledger.note(ledger.finished, name)
        if fail:
            raise ValueError(f"{name} failed")
        return name

    @cm.tool
    def audit(event: str) -> bool:
        """Records an audit event (a side effect nobody awaits)."""
        ledger.note(ledger.finished, f"audit:{event}")
        return True


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def dcm(ledger: Ledger) -> Iterator[CodeMode]:
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        add_tools(cm, ledger)
        yield cm


def run(cm: CodeMode, code: str, session: str = "drain") -> dict[str, Any]:
    return cm.session(session).exec({"code": code})


def test_a_call_nobody_awaits_is_dispatched_and_runs_before_the_cell_completes(dcm, ledger):
    result = run(dcm, "void tools.audit({event: 'opened'}); return 'done'")
    assert result["status"] == "completed", result
    assert result["value"] == "done"
    assert ledger.finished == ["audit:opened"]
    assert result["telemetry"]["toolCalls"] == 1


def test_the_losers_of_promise_race_run_to_the_end_and_the_value_is_the_winner(dcm, ledger):
    code = """return await Promise.race([
        tools.work({name: 'fast', ms: 0}), tools.work({name: 'slow', ms: 150})])"""
    result = run(dcm, code)
    assert result == {**result, "status": "completed", "value": "fast"}
    assert sorted(ledger.finished) == ["fast", "slow"]
    assert ledger.cancelled == []


def test_the_losers_of_promise_any_are_not_cancelled(dcm, ledger):
    code = """return await Promise.any([
        tools.work({name: 'bad', fail: true}), tools.work({name: 'good', ms: 20}),
        tools.work({name: 'late', ms: 120})])"""
    result = run(dcm, code)
    assert result["value"] == "good"
    assert sorted(ledger.finished) == ["bad", "good", "late"]
    assert ledger.cancelled == []


def test_the_rest_of_a_fail_fast_promise_all_still_runs_when_the_cell_catches(dcm, ledger):
    code = """try {
        await Promise.all([tools.work({name: 'boom', fail: true}), tools.work({name: 'rest', ms: 100})]);
    } catch (e) { return 'caught: ' + e.message }"""
    result = run(dcm, code)
    assert result["status"] == "completed"
    assert result["value"].startswith("caught: ")
    assert "boom failed" in result["value"]
    assert sorted(ledger.finished) == ["boom", "rest"]


def test_a_cell_that_fails_still_ends_after_the_calls_it_started(dcm, ledger):
    code = "await Promise.all([tools.work({name: 'boom', fail: true}), tools.work({name: 'rest', ms: 100})])"
    result = run(dcm, code)
    assert result["status"] == "failed"
    assert "boom failed" in result["error"]
    assert sorted(ledger.finished) == ["boom", "rest"]
    assert ledger.cancelled == []


def test_detached_audit_calls_inside_nested_combinators_all_run(dcm, ledger):
    code = """
    const step = async (i) => {
        void tools.audit({event: 'start-' + i});
        const r = await Promise.race([tools.work({name: 'a' + i}), tools.work({name: 'b' + i, ms: 60})]);
        tools.audit({event: 'end-' + i});  // not awaited either
        return r;
    };
    return await Promise.all([step(1), step(2)]);"""
    result = run(dcm, code)
    assert result["value"] == ["a1", "a2"]
    expected = ["a1", "a2", "audit:end-1", "audit:end-2", "audit:start-1", "audit:start-2", "b1", "b2"]
    assert sorted(ledger.finished) == expected


def test_work_a_loser_does_after_the_value_is_decided_is_in_the_result(dcm, ledger):
    code = """tools.work({name: 'later', ms: 50}).then((v) => text('settled ' + v));
    return 'decided'"""
    result = run(dcm, code)
    assert result["value"] == "decided"
    assert result["output"] == [{"type": "text", "text": "settled later"}]


def test_calls_still_running_at_the_deadline_make_the_run_wait_then_wait_completes_with_the_decided_value(
    ledger, make_codemode
):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_tools(cm, ledger)
    session = cm.session("deadline")
    first = session.exec({"code": "void tools.work({name: 'slow', ms: 900}); return await tools.work({name: 'quick'})"})
    assert first["status"] == "waiting", first
    assert first["reason"] == "pending_tools"
    assert len(first["pendingToolCalls"]) == 1  # the call nobody awaits
    result = first
    for _ in range(20):
        result = session.wait({"runId": first["runId"]})
        if result["status"] != "waiting":
            break
    assert result["status"] == "completed", result
    assert result["value"] == "quick"
    assert sorted(ledger.finished) == ["quick", "slow"]
    assert ledger.cancelled == []


# ---- one output budget ----------------------------------------------------------------------------


@pytest.fixture
def small() -> Iterator[CodeMode]:
    with CodeMode({"workers": 1, "timeoutMs": 5000, "maxOutputBytes": 1024}) as cm:
        yield cm


def result_bytes(result: dict[str, Any]) -> int:
    """What the budget counts: the outputs and the value (or error) as the host returns them."""
    return sum(len(msgspec.json.encode(result[k])) for k in ("output", "value", "error") if k in result)


def test_text_and_value_share_the_budget_as_the_json_the_host_returns(small):
    # 1,017 bytes of raw text plus a value fit a raw-byte count of 1,024; as JSON they do not.
    result = run(small, "text('x'.repeat(1017)); return 'value'")
    assert result["status"] == "failed"
    assert result["code"] == "output_limit_exceeded"
    fitting = run(small, "text('x'.repeat(900)); return 'value'")
    assert fitting["status"] == "completed"
    assert result_bytes(fitting) <= 1024


def test_escaped_characters_count_as_the_host_writes_them(small):
    # 400 quotes are 800 bytes of JSON: two such texts pass 1 KiB though their raw text is 800.
    result = run(small, "text('\"'.repeat(400)); text('\"'.repeat(400))")
    assert result["code"] == "output_limit_exceeded"


def test_an_error_longer_than_the_budget_is_cut_with_a_marker_and_whole_characters(small):
    result = run(small, "throw new Error('é'.repeat(3000))")
    assert result["status"] == "failed"
    error = result["error"]
    assert len(error.encode()) <= 1024
    assert error.startswith("Error: éé")
    assert error.endswith("more bytes cut]")
    assert "\ufffd" not in error


def test_an_error_after_outputs_gets_what_the_outputs_left(small):
    result = run(small, "text('y'.repeat(600)); throw new Error('z'.repeat(4000))")
    assert result["status"] == "failed"
    assert result_bytes(result) <= 1024
    assert result["output"] == [{"type": "text", "text": "y" * 600}]


def test_an_error_value_serializes_as_its_name_and_message(dcm):
    result = run(dcm, "const e = new RangeError('out'); e.extra = 1; json([e]); return {e}")
    assert result["value"] == {"e": {"name": "RangeError", "message": "out"}}
    assert result["output"] == [{"type": "json", "value": [{"name": "RangeError", "message": "out"}]}]


def test_a_pending_promise_in_the_value_or_an_output_is_named_without_being_awaited(dcm, ledger):
    result = run(dcm, "const r = tools.work({name: 'forgot'}); text(r); return {r}")
    marker = "[Promise of call_1 tools.work: not awaited; use await]"
    assert result["value"] == {"r": marker}
    assert result["output"][0] == {"type": "text", "text": f'"{marker}"'}
    assert result["output"][1]["text"].startswith("[not awaited] call_1 tools.work: a text() output")
    assert ledger.finished == ["forgot"]  # the call itself still ran
