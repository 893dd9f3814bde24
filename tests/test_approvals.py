"""Approvals that pause a run: a call waits for the host's decision, its run suspends as
``waiting`` (``pending_tools``, the entry saying ``approval: "pending"``), and the host approves
or rejects it by call id; the next ``wait`` runs approved calls and hands rejections to the
guest as plain errors. Decisions are in the journal: a replay after a worker kill never asks
twice and never runs a rejected call."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from codemode import ApprovalError, CodeMode, Defer
from codemode.policy import ToolCallEvent
from codemode.runs import FOREIGN, UNAVAILABLE, Journal, JournalApproval

TESTS = Path(__file__).parent
ECHO = {"command": sys.executable, "args": [str(TESTS / "fixtures" / "echo_args_mcp_server.py")]}
PAGED = {"command": sys.executable, "args": [str(TESTS / "fixtures" / "paged_mcp_server.py")]}
#: A cell's deadline far past the test's own timeout: a run that suspends only at its deadline
#: fails the test (it must suspend as soon as nothing but approvals is left).
LONG = {"workers": 1, "timeoutMs": 60_000}
DEPLOY = "host:core:deploy"

DEPLOY_TWICE = """
const a = await tools.add({a: 1, b: 2});
let d;
try { d = await tools.deploy({env: "prod"}); } catch (e) { d = "refused: " + e.message; }
return {a, d};
"""


def with_tools(cm: CodeMode) -> list[str]:
    ran: list[str] = []

    @cm.tool
    def deploy(env: str) -> str:
        """Deploys to an environment."""
        ran.append(env)
        return f"deployed {env}"

    @cm.tool(read_only=True)
    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    return ran


@pytest.fixture
def gated(make_codemode) -> tuple[CodeMode, list[str]]:
    cm = make_codemode(LONG, require_approval=["deploy"])
    return cm, with_tools(cm)


@pytest.mark.timeout(30)
def test_a_call_that_needs_approval_suspends_the_run_at_once_with_its_entry(gated):
    cm, ran = gated
    s = cm.session("s")
    result = s.exec({"code": DEPLOY_TWICE})
    assert result["status"] == "waiting" and result["reason"] == "pending_tools"
    assert result["pendingToolCalls"] == [
        {"id": "call_2", "toolId": DEPLOY, "method": "callValue", "approval": "pending", "input": {"env": "prod"}}
    ]
    assert ran == []
    (request,) = s.pending_approvals()
    assert (request.run_id, request.call_id, request.tool_id, request.input, request.state) == (
        result["runId"],
        "call_2",
        "host:core:deploy",
        {"env": "prod"},
        "pending",
    )


def test_an_approved_call_runs_with_the_next_wait_not_before(gated):
    cm, ran = gated
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    s.approve(waiting["runId"], "call_2", True)
    assert ran == []  # a run never gets further than the model asked it to go
    assert s.pending_approvals()[0].state == "approved"
    done = s.wait({"runId": waiting["runId"]})
    assert done["status"] == "completed", done
    assert done["value"] == {"a": 3, "d": "deployed prod"}
    assert ran == ["prod"]
    assert s.pending_approvals() == []


def test_a_rejected_call_fails_in_the_guest_saying_so_and_never_runs(gated):
    cm, ran = gated
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    s.approve(waiting["runId"], 2, False, reason="not on a Friday")
    done = s.wait({"runId": waiting["runId"]})
    assert done["value"]["d"] == "refused: tool host:core:deploy: tool call blocked: not approved: not on a Friday"
    assert ran == []


def test_an_uncaught_rejection_fails_the_cell_with_the_reason(gated):
    cm, ran = gated
    s = cm.session("s")
    waiting = s.exec({"code": "return await tools.deploy({env: 'x'})"})
    s.approve(waiting["runId"], "call_1", False)
    done = s.wait({"runId": waiting["runId"]})
    assert done["status"] == "failed"
    assert done["error"] == "Error: tool host:core:deploy: tool call blocked: not approved"
    assert ran == []


def test_parallel_calls_are_decided_one_by_one_and_the_run_waits_for_the_undecided(gated):
    cm, ran = gated
    s = cm.session("s")
    code = """
    const envs = ["a", "b", "c"];
    return await Promise.all(envs.map(env => tools.deploy({env}).catch(e => e.message)));
    """
    waiting = s.exec({"code": code})
    assert [e["approval"] for e in waiting["pendingToolCalls"]] == ["pending"] * 3
    s.approve(waiting["runId"], "call_1", True)
    s.approve(waiting["runId"], "call_2", False, reason="no")
    again = s.wait({"runId": waiting["runId"]})
    assert again["status"] == "waiting", again
    assert again["pendingToolCalls"] == [
        {"id": "call_3", "toolId": DEPLOY, "method": "callValue", "approval": "pending", "input": {"env": "c"}}
    ]
    s.approve(again["runId"], "call_3", True)
    done = s.wait({"runId": again["runId"]})
    assert done["value"] == ["deployed a", "tool host:core:deploy: tool call blocked: not approved: no", "deployed c"]
    assert ran == ["a", "c"]


def test_an_approval_that_comes_while_the_run_executes_starts_the_call_at_once(make_codemode):
    cm = make_codemode(LONG, require_approval=["deploy"])
    ran = with_tools(cm)
    started = threading.Event()
    release = threading.Event()

    @cm.tool(read_only=True)
    async def slow() -> str:
        """Holds the run in its exec until the test has approved."""
        started.set()
        for _ in range(2000):
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        return "slow done"

    s = cm.session("s")

    def approve_while_running() -> None:
        started.wait(20)
        deadline = time.monotonic() + 20
        while not s.pending_approvals() and time.monotonic() < deadline:
            time.sleep(0.01)
        (request,) = s.pending_approvals()
        s.approve(request.run_id, request.call_id, True)
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()

    helper = threading.Thread(target=approve_while_running)
    helper.start()
    result = s.exec({"code": "return await Promise.all([tools.slow(), tools.deploy({env: 'now'})])"})
    helper.join()
    assert result["status"] == "completed", result
    assert result["value"] == ["slow done", "deployed now"]


def test_an_approval_callback_may_defer_and_show_less_of_the_input(make_codemode):
    asked: list[ToolCallEvent] = []

    def approve(event: ToolCallEvent) -> bool | Defer:
        asked.append(event)
        if event.name == "deploy":
            return Defer(input={"env": event.input["env"], "token": "[redacted]"})
        return True

    cm = make_codemode(LONG, approve=approve)
    got: list[dict[str, Any]] = []

    @cm.tool
    def deploy(env: str, token: str) -> str:
        """Deploys with a token."""
        got.append({"env": env, "token": token})
        return "ok"

    s = cm.session("s")
    waiting = s.exec({"code": "return await tools.deploy({env: 'prod', token: 's3cret'})"})
    assert waiting["pendingToolCalls"][0]["input"] == {"env": "prod", "token": "[redacted]"}
    assert "s3cret" not in repr(waiting) and "s3cret" not in repr(s.pending_approvals())
    s.approve(waiting["runId"], "call_1")
    assert s.wait({"runId": waiting["runId"]})["value"] == "ok"
    assert got == [{"env": "prod", "token": "s3cret"}]  # the tool gets the real input
    assert [e.name for e in asked] == ["deploy"]  # asked once, never again after the decision


def test_an_async_callback_that_defers_and_a_tool_that_requires_approval(make_codemode):
    async def approve(event: ToolCallEvent) -> bool | Defer:
        await asyncio.sleep(0)
        return Defer()

    cm = make_codemode(LONG, approve=approve)

    @cm.tool(requires_approval=True)
    async def transfer(amount: int) -> int:
        """Moves money."""
        return amount

    s = cm.session("s")
    waiting = s.exec({"code": "return await tools.transfer({amount: 5})"})
    assert waiting["pendingToolCalls"][0]["approval"] == "pending"
    s.approve(waiting["runId"], "call_1", True)
    assert s.wait({"runId": waiting["runId"]})["value"] == 5


def test_a_rule_based_approval_with_a_callback_asks_the_callback(make_codemode):
    cm = make_codemode(LONG, require_approval=["deploy"], approve=lambda event: event.input.get("env") != "prod")
    ran = with_tools(cm)
    s = cm.session("s")
    code = "return [await tools.deploy({env: 'dev'}), await tools.deploy({env: 'prod'}).catch(e => e.message)]"
    result = s.exec({"code": code})
    assert result["value"] == ["deployed dev", "tool host:core:deploy: tool call blocked: not approved"]
    assert ran == ["dev"]


def test_approve_refuses_what_awaits_no_decision(gated):
    cm, _ = gated
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    run_id = waiting["runId"]
    with pytest.raises(ApprovalError, match="does not await an approval"):
        s.approve(run_id, "call_1", True)  # `add`, long settled
    with pytest.raises(ApprovalError, match="call_<n>"):
        s.approve(run_id, "2", True)
    with pytest.raises(ApprovalError, match="call_<n>"):
        s.approve(run_id, True, True)  # type: ignore[arg-type]
    with pytest.raises(ApprovalError, match="must be a bool"):
        s.approve(run_id, "call_2", "yes")  # type: ignore[arg-type]
    with pytest.raises(ApprovalError, match=FOREIGN):
        cm.session("other").approve(run_id, "call_2", True)
    with pytest.raises(ApprovalError, match=FOREIGN):
        cm.session("s", agent_run="child").approve(run_id, "call_2", True)
    with pytest.raises(ApprovalError, match=UNAVAILABLE):
        s.approve("run_unknown", "call_2", True)
    s.approve(run_id, "call_2", True)
    with pytest.raises(ApprovalError, match="decided already"):
        s.approve(run_id, "call_2", False)
    assert s.wait({"runId": run_id})["value"]["d"] == "deployed prod"
    with pytest.raises(ApprovalError, match=UNAVAILABLE):
        s.approve(run_id, "call_2", True)  # the run is over


def test_a_hostile_reason_is_bounded_before_it_reaches_the_guest(gated):
    cm, _ = gated
    s = cm.session("s")
    waiting = s.exec({"code": "try { await tools.deploy({env: 'x'}) } catch (e) { return e.message.length }"})
    s.approve(waiting["runId"], "call_1", False, reason="x" * 1_000_000)
    assert s.wait({"runId": waiting["runId"]})["value"] < 1200


def test_unanswered_approvals_expire_with_the_run(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 60_000, "snapshotTtlSeconds": 1}, require_approval=["deploy"])
    ran = with_tools(cm)
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    deadline = time.monotonic() + 10
    while s.pending_approvals() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.pending_approvals() == []
    with pytest.raises(ApprovalError, match=UNAVAILABLE):
        s.approve(waiting["runId"], "call_2", True)
    assert s.wait({"runId": waiting["runId"]})["error"] == UNAVAILABLE
    assert ran == []


def test_a_cancelled_run_takes_its_approvals_with_it(gated):
    cm, ran = gated
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    assert s.cancel(waiting["runId"])
    assert s.pending_approvals() == []
    with pytest.raises(ApprovalError, match=UNAVAILABLE):
        s.approve(waiting["runId"], "call_2", True)
    assert ran == []


def test_the_journal_records_the_decision(gated):
    cm, _ = gated
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    assert Journal.decode(cm.export_run(waiting["runId"])).approvals == {}
    s.approve(waiting["runId"], "call_2", False, reason="later")
    assert Journal.decode(cm.export_run(waiting["runId"])).approvals == {2: JournalApproval(False, "later")}


def kill_workers(cm: CodeMode) -> None:
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("ok", [True, False])
def test_a_decision_survives_a_worker_kill_and_the_replay_never_asks_twice(make_codemode, ok: bool):
    asked: list[str] = []

    def approve(event: ToolCallEvent) -> bool | Defer:
        asked.append(event.name)
        return Defer() if event.name == "deploy" else True

    cm = make_codemode(LONG, approve=approve)
    ran = with_tools(cm)
    s = cm.session("s")
    waiting = s.exec({"code": DEPLOY_TWICE})
    s.approve(waiting["runId"], "call_2", ok, reason="no")
    kill_workers(cm)
    done = s.wait({"runId": waiting["runId"]})
    assert done["status"] == "completed", done
    expected = "deployed prod" if ok else "refused: tool host:core:deploy: tool call blocked: not approved: no"
    assert done["value"] == {"a": 3, "d": expected}
    assert ran == (["prod"] if ok else [])
    assert asked == ["add", "deploy"]


def test_a_delivered_rejection_is_served_from_the_journal_after_a_kill(make_codemode):
    cm = make_codemode(LONG, require_approval=["deploy"])
    ran = with_tools(cm)
    s = cm.session("s")
    code = """
    const first = await tools.deploy({env: "one"}).catch(e => e.message);
    const second = await tools.deploy({env: "two"});
    return {first, second};
    """
    waiting = s.exec({"code": code})
    s.approve(waiting["runId"], "call_1", False)
    again = s.wait({"runId": waiting["runId"]})
    assert [e["id"] for e in again["pendingToolCalls"]] == ["call_2"]
    kill_workers(cm)
    s.approve(again["runId"], "call_2", True)
    done = s.wait({"runId": again["runId"]})
    assert done["value"] == {"first": f"tool {DEPLOY}: tool call blocked: not approved", "second": "deployed two"}
    assert ran == ["two"]


def test_a_restart_safe_run_cannot_hold_an_approval(make_codemode):
    cm = make_codemode(LONG, require_approval=["add"], approve=lambda event: Defer() if event.name == "peek" else True)
    with_tools(cm)

    @cm.tool(read_only=True)
    def peek() -> int:
        """Reads."""
        return 1

    s = cm.session("s")
    code = "return [await tools.add({a: 1, b: 1}).catch(e => e.message), await tools.peek().catch(e => e.message)]"
    waiting = s.exec({"code": code, "restartSafe": True})
    while waiting["status"] == "waiting":
        waiting = s.wait({"runId": waiting["runId"]})
    assert waiting["value"] == [
        "tool host:core:add waits for approval: a restartSafe run may only call tools that need none",
        "tool host:core:peek: tool call blocked: approval pending, and a restartSafe run cannot wait for an approval",
    ]


def test_a_host_side_call_cannot_wait_for_an_approval(gated):
    cm, ran = gated
    s = cm.session("s")
    answer = cm.call_tool(s, "host:core:deploy", {"env": "prod"})
    assert answer == {
        "tool": "host:core:deploy",
        "error": "tool host:core:deploy: tool call blocked: approval pending, and only a code mode run can wait "
        "for an approval that comes later",
    }
    assert ran == []


@pytest.mark.timeout(60)
def test_an_mcp_tool_and_an_mcp_request_wait_for_approval_too(make_codemode):
    config = {"workers": 1, "timeoutMs": 60_000, "mcpServers": {"echo": ECHO, "paged": PAGED}}
    cm = make_codemode(config, require_approval=["mcp:echo:*", "mcp:paged:resources/list"])
    s = cm.session("s")
    code = """
    const echoed = await MCP.echo.echo({count: 1});
    const listed = await MCP.paged.resources.list();
    return {echoed: echoed.isError === true ? echoed.content[0].text : "ran", listed: listed.resources.length};
    """
    waiting = s.exec({"code": code})
    assert waiting["pendingToolCalls"][0] == {
        "id": "call_1",
        "toolId": "mcp:echo:echo",
        "method": "mcp",
        "approval": "pending",
        "input": {"count": 1, "name": "world", "__proto__": {"isAdmin": True}},
    }
    s.approve(waiting["runId"], "call_1", False, reason="no echo")
    again = s.wait({"runId": waiting["runId"]})
    assert again["status"] == "waiting", again
    # (A request is shown as the policy names it, never as the bridge's internal marker id.)
    assert again["pendingToolCalls"][0]["toolId"] == "mcp:paged:resources/list"
    assert again["pendingToolCalls"][0]["approval"] == "pending"
    s.approve(again["runId"], "call_2", True)
    done = s.wait({"runId": again["runId"]})
    assert done["status"] == "completed", done
    assert done["value"]["echoed"] == "not approved: no echo"
    assert done["value"]["listed"] > 0


def test_exec_async_and_approve_async(make_codemode):
    cm = make_codemode(LONG, require_approval=["deploy"])
    ran = with_tools(cm)

    async def scenario() -> dict[str, Any]:
        s = cm.session("s")
        waiting = await s.exec_async({"code": DEPLOY_TWICE})
        await s.approve_async(waiting["runId"], "call_2", True)
        return await s.wait_async({"runId": waiting["runId"]})

    assert asyncio.run(scenario())["value"] == {"a": 3, "d": "deployed prod"}
    assert ran == ["prod"]


def test_a_huge_input_is_shown_cut(gated):
    cm, _ = gated
    s = cm.session("s")
    waiting = s.exec({"code": "return await tools.deploy({env: 'x'.repeat(100000)})"})
    shown = waiting["pendingToolCalls"][0]["input"]
    assert isinstance(shown, str) and shown.startswith("[input of 100010 bytes, cut]") and len(shown) < 2200


def test_an_mcp_client_of_serve_sees_the_pending_approval_and_resumes_once_the_host_decides(make_codemode):
    import json
    from contextlib import nullcontext

    from codemode.serve import build_server
    from mcp import Client

    cm = make_codemode(LONG, require_approval=["deploy"])
    ran = with_tools(cm)
    session = cm.session("serve:client-1")
    server = build_server(cm, lambda ctx: nullcontext(session))

    def decoded(called: Any) -> dict[str, Any]:
        result: dict[str, Any] = json.loads("".join(getattr(block, "text", "") for block in called.content))
        return result

    async def client_side() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(server) as client:
            waiting = decoded(await client.call_tool("exec", {"code": DEPLOY_TWICE}))
            # The host (the process that serves) decides, as its operator's UI would.
            (request,) = cm.pending_approvals("serve:client-1")
            cm.approve("serve:client-1", request.run_id, request.call_id, True)
            return waiting, decoded(await client.call_tool("wait", {"runId": waiting["runId"]}))

    waiting, done = asyncio.run(client_side())
    assert waiting["status"] == "waiting"
    assert waiting["pendingToolCalls"][0]["approval"] == "pending"
    assert waiting["pendingToolCalls"][0]["input"] == {"env": "prod"}
    assert done["status"] == "completed", done
    assert done["value"] == {"a": 3, "d": "deployed prod"}
    assert ran == ["prod"]
