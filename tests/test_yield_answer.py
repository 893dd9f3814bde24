"""`wait` answers a yield: `await yield_control(...)` resolves to the `answer` the wait carried,
journaled like a tool result, so a replayed run sees the same answer."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest
from codemode import CodeMode
from codemode.runs import Journal
from codemode.surfaces import strict_problem, to_openai
from codemode.tools import MAX_BRIDGE_BYTES

ASK = "const a = await yield_control('which city?'); return {a, kind: typeof a}"


@pytest.fixture
def cm(make_codemode) -> CodeMode:
    return make_codemode({"enabled": True, "workers": 1, "timeoutMs": 300})


def asked(session: Any, code: str = ASK) -> str:
    first = session.exec({"code": code})
    assert (first["status"], first["reason"]) == ("waiting", "yield"), first
    return str(first["runId"])


@pytest.mark.parametrize("answer", ["Oslo", 42, 2.5, True, False, ["a", {"b": None}], {"city": "Oslo", "n": [1, 2]}])
def test_await_yield_control_resolves_to_the_answer_of_the_wait(cm, answer):
    s = cm.session()
    done = s.wait({"runId": asked(s), "answer": answer})
    assert done["status"] == "completed", done
    assert done["value"]["a"] == answer


@pytest.mark.parametrize("args", [{}, {"answer": None}])
def test_a_wait_without_an_answer_resolves_the_yield_to_undefined(cm, args):
    s = cm.session()
    done = s.wait({"runId": asked(s), **args})
    assert done["value"] == {"kind": "undefined"}


def test_typed_resume_and_resume_async_carry_the_answer(cm):
    s = cm.session()
    assert s.resume(asked(s), "sync").value == {"a": "sync", "kind": "string"}  # type: ignore[union-attr]

    async def main() -> Any:
        return await s.resume_async(asked(s), {"x": 1})

    assert asyncio.run(main()).value == {"a": {"x": 1}, "kind": "object"}  # type: ignore[union-attr]


def test_every_yield_pending_at_the_wait_gets_its_answer(cm):
    s = cm.session()
    run_id = asked(s, "return await Promise.all([yield_control('one'), yield_control('two')])")
    assert s.wait({"runId": run_id, "answer": "both"})["value"] == ["both", "both"]


def test_each_wait_answers_the_yield_it_resumes(cm):
    s = cm.session()
    first = asked(s, "const a = await yield_control('1'); const b = await yield_control('2'); return [a, b]")
    second = s.wait({"runId": first, "answer": "first"})
    assert second["reason"] == "yield"
    assert s.wait({"runId": first, "answer": "second"})["value"] == ["first", "second"]


def test_an_answered_yield_is_replayed_from_the_journal_after_a_worker_kill(cm):
    gate = threading.Event()

    @cm.tool
    async def slow() -> str:
        while not gate.is_set():
            await asyncio.sleep(0.005)
        return "slow"

    s = cm.session()
    code = "const a = await yield_control('q'); const b = await tools.slow({}); return [a, b, Math.random() < 2]"
    run_id = asked(s, code)
    parked = s.wait({"runId": run_id, "answer": {"deep": ["answer"]}})
    assert (parked["status"], parked["reason"]) == ("waiting", "pending_tools"), parked
    journal = Journal.decode(cm.export_run(run_id))
    assert [(ok, payload) for batch in journal.batches for _, ok, payload in batch] == [(True, '{"deep":["answer"]}')]
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    gate.set()
    done = s.wait({"runId": run_id})
    assert done["value"] == [{"deep": ["answer"]}, "slow", True], done


def test_a_wait_whose_answered_run_then_runs_past_its_deadline_fails_timeout(cm):
    # The wait's settle goes straight to the idle worker; nothing comes back while its caller
    # first looks, so the run's waiter takes over and the kill ends it on time.
    s = cm.session()
    run_id = asked(s, "await yield_control('go on?'); while (true) {}")
    done = s.wait({"runId": run_id, "answer": "yes"})
    assert (done["status"], done["code"]) == ("failed", "timeout"), done
    assert s.exec({"code": "return 1 + 1"})["value"] == 2


def test_a_worker_killed_while_it_runs_an_answered_yield_replays_the_run_with_the_answer(make_codemode):
    cm = make_codemode({"enabled": True, "workers": 1, "timeoutMs": 10_000})
    s = cm.session()
    code = "const a = await yield_control('q'); const t = Date.now(); while (Date.now() - t < 300) {} return a"
    run_id = asked(s, code)
    (pid,) = cm.inspect().worker_pids
    killer = threading.Timer(0.1, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        done = s.wait({"runId": run_id, "answer": {"kept": True}})
    finally:
        killer.cancel()
    assert done["value"] == {"kept": True}, done
    assert pid not in cm.inspect().worker_pids


def test_an_answer_that_is_not_json_is_invalid_input_and_the_run_stays_waiting(cm):
    s = cm.session()
    run_id = asked(s)
    refused = s.wait({"runId": run_id, "answer": object()})
    assert refused["code"] == "invalid_input"
    assert refused["error"].startswith("wait `answer` must be a JSON value: TypeError: ")
    assert s.wait({"runId": run_id, "answer": "after"})["value"]["a"] == "after"


def test_an_answer_over_the_bridge_limit_is_invalid_input(cm):
    s = cm.session()
    run_id = asked(s)
    refused = s.wait({"runId": run_id, "answer": "x" * MAX_BRIDGE_BYTES})
    assert refused["code"] == "invalid_input"
    assert refused["error"] == (
        f"wait `answer` is {MAX_BRIDGE_BYTES + 2} bytes of JSON; the limit is {MAX_BRIDGE_BYTES}, as for a tool result"
    )
    assert s.wait({"runId": run_id, "answer": 1})["value"]["a"] == 1


def test_an_answer_to_a_run_waiting_only_on_tools_is_not_given_to_it(cm):
    gate = threading.Event()

    @cm.tool
    async def slow() -> str:
        while not gate.is_set():
            await asyncio.sleep(0.005)
        return "slow"

    s = cm.session()
    first = s.exec({"code": "const b = await tools.slow({}); return [b, await yield_control()]"})
    assert first["reason"] == "pending_tools"
    gate.set()
    later = s.wait({"runId": first["runId"], "answer": "too early"})
    assert later["reason"] == "yield"
    assert s.wait({"runId": first["runId"], "answer": "now"})["value"] == ["slow", "now"]


def test_the_model_facing_wait_takes_an_answer_in_strict_mode(cm):
    @cm.tool
    def noop() -> None: ...

    s = cm.session()
    wait = next(t for t in s.model_tools("code") if t.name == "wait")
    assert wait.input_schema["properties"]["answer"]["type"] == ["string", "null"]
    assert strict_problem(wait.input_schema) is None
    assert next(t for t in to_openai([wait]))["function"]["strict"] is True
    run_id = asked(s)
    assert s.handle("wait", {"runId": run_id, "answer": "Oslo"})["value"] == {"a": "Oslo", "kind": "string"}


def test_codemode_serve_wait_carries_the_answer_to_the_yield():
    import json
    import sys
    from pathlib import Path

    import codemode
    from mcp import Client, StdioServerParameters

    path = os.pathsep.join([str(Path(__file__).parent), str(Path(codemode.__file__).resolve().parents[1])])
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "codemode.cli", "serve"], env={"PYTHONPATH": path}
    )

    def decoded(called: Any) -> dict[str, Any]:
        return json.loads("".join(getattr(block, "text", "") for block in called.content))  # type: ignore[no-any-return]

    async def session() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            wait_tool = next(t for t in (await client.list_tools()).tools if t.name == "wait")
            first = decoded(await client.call_tool("exec", {"code": ASK}))
            done = decoded(await client.call_tool("wait", {"runId": first["runId"], "answer": "Oslo"}))
            return wait_tool.input_schema, first, done

    schema, first, done = asyncio.run(session())
    assert "answer" in schema["properties"]
    assert first["reason"] == "yield", first
    assert done["value"] == {"a": "Oslo", "kind": "string"}, done
