"""Runs parked on ``MCP.*`` calls (which run on the MCP client's loop), alone and beside host
tools: every way such a step can end — completed, suspended at the deadline, its worker killed
under it, the guest overrunning — ends with the right outcome, and the host goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
from codemode import CodeMode, supervisor
from mcp_servers import everything_server

LONG_OP = "mcp:everything:trigger-long-running-operation"
#: The guest's reading of server-everything's get-sum answer (``"The sum of 1 and 2 is 3."``).
SUM_OF = "const n = (r) => Number(r.content[0].text.replace(/\\.$/, '').split(' ').pop());"


class McpCalls:
    """The MCP tool calls the host starts (server-side tool names, in order); ``started(name)``
    is set once a call of that tool has started."""

    def __init__(self, cm: CodeMode, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        self._started: dict[str, threading.Event] = {}
        mcp = cm._mcp.servers
        assert mcp is not None
        real = mcp.call_tool_here

        def recorded(server: str, tool: str, arguments: Any = None, **kw: Any) -> Any:
            self.names.append(tool)
            self.started(tool).set()
            return real(server, tool, arguments, **kw)

        monkeypatch.setattr(mcp, "call_tool_here", recorded)

    def started(self, tool: str) -> threading.Event:
        return self._started.setdefault(tool, threading.Event())

    def count(self, tool: str) -> int:
        return self.names.count(tool)


@pytest.fixture(scope="module")
def rcm():
    with CodeMode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"everything": everything_server()}}) as cm:
        assert cm.load_mcp_tools() == {"everything": None}

        @cm.tool
        def double(n: int) -> int:
            return 2 * n

        yield cm


def mcp_codemode(make_codemode: Any, timeout_ms: int, **config: Any) -> CodeMode:
    cm = make_codemode(
        {"workers": 1, "timeoutMs": timeout_ms, "mcpServers": {"everything": everything_server()}, **config}
    )
    assert cm.load_mcp_tools() == {"everything": None}
    return cm


def waited_out(session: Any, result: dict[str, Any]) -> dict[str, Any]:
    """``wait`` until the run is no longer waiting (at most 40 times)."""
    for _ in range(40):
        if result["status"] != "waiting":
            break
        result = session.wait({"runId": result["runId"]})
    return result


def sum_text(result: dict[str, Any]) -> int:
    """The number in server-everything's get-sum answer (``"The sum of 1 and 2 is 3."``)."""
    return int(result["content"][0]["text"].rstrip(".").split()[-1])


def test_sequential_mcp_calls_give_every_value(rcm, monkeypatch):
    calls = McpCalls(rcm, monkeypatch)
    code = f"""
        {SUM_OF}
        const sums = [];
        for (let i = 0; i < 30; i++) {{
            sums.push(n(await MCP.everything.getSum({{a: i, b: 1}})));
            if (i % 10 === 0) text(`at ${{i}}`);
        }}
        return sums;
    """
    result = rcm.session("mcp").exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == [i + 1 for i in range(30)]
    assert result["telemetry"]["toolCalls"] == 30
    assert result["output"] == [{"type": "text", "text": f"at {i}"} for i in (0, 10, 20)]
    assert calls.names == ["get-sum"] * 30


def test_mcp_and_sync_tools_mixed_in_one_cell(rcm):
    code = f"""
        {SUM_OF}
        let total = 0;
        for (let i = 0; i < 5; i++) {{
            total += n(await MCP.everything.getSum({{a: i, b: 1}}));
            total += n(await MCP.everything.getSum({{a: i, b: 2}}));
            total += await tools.double({{n: i}});
        }}
        const [a, b, c] = await Promise.all([
            MCP.everything.getSum({{a: 100, b: 1}}), tools.double({{n: 50}}), MCP.everything.getSum({{a: 200, b: 1}}),
        ]);
        return [total, n(a), b, n(c)];
    """
    result = rcm.session("mcp").exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == [sum(2 * i + 3 + 2 * i for i in range(5)), 101, 100, 201]
    assert result["telemetry"]["toolCalls"] == 18


def test_an_mcp_call_and_a_sync_tool_in_one_report_both_reach_the_guest(rcm):
    # One report, two calls: one runs on the MCP loop, the sync one on the waiting thread.
    code = """
        const [a, b] = await Promise.all([MCP.everything.getSum({a: 1, b: 1}), tools.double({n: 3})]);
        return [a.content[0].text, b];
    """
    result = rcm.session("mcp").exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == ["The sum of 1 and 1 is 2.", 6]
    assert result["telemetry"]["toolCalls"] == 2


def test_an_mcp_loop_busy_past_the_deadline_suspends_the_run_and_wait_completes(make_codemode):
    cm = mcp_codemode(make_codemode, 150)
    session = cm.session("mcp")
    loop = cm._mcp.servers.event_loop()
    busy = threading.Event()
    # The MCP loop cannot start the call before the cell's deadline: the run suspends on it.
    loop.call_soon_threadsafe(busy.wait, 30)
    try:
        result = session.exec({"code": "return (await MCP.everything.getSum({a: 2, b: 5})).content[0].text"})
    finally:
        busy.set()
    assert result["status"] == "waiting", result
    assert result["reason"] == "pending_tools"
    assert [c["toolId"] for c in result["pendingToolCalls"]] == ["mcp:everything:get-sum"]
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == "The sum of 2 and 5 is 7."


def test_mcp_call_pending_at_the_deadline_suspends_and_wait_completes(make_codemode, monkeypatch):
    # The long operation starts after the three sums and takes a second: any deadline under a
    # second finds it pending; the sums get most of that (a loaded machine, CI once, took them
    # past 300 ms).
    cm = mcp_codemode(make_codemode, 900)
    calls = McpCalls(cm, monkeypatch)
    session = cm.session("mcp")
    code = """
        let total = 0;
        for (let i = 0; i < 3; i++) total += (await MCP.everything.getSum({a: i, b: 1})).content.length;
        const r = await MCP.everything.triggerLongRunningOperation({duration: 1, steps: 1});
        return [total, r.content[0].text];
    """
    result = session.exec({"code": code})
    assert result["status"] == "waiting", result
    assert result["reason"] == "pending_tools"
    assert [c["toolId"] for c in result["pendingToolCalls"]] == [LONG_OP]
    assert calls.started("trigger-long-running-operation").is_set()  # started before the suspension
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == [3, "Long running operation completed. Duration: 1 seconds, Steps: 1."]
    assert calls.names == ["get-sum"] * 3 + ["trigger-long-running-operation"]


@pytest.mark.parametrize(
    ("timeout_ms", "duration"),
    [(20_000, 2), (1_000, 3)],
    ids=["the_call_ends_within_the_cell", "the_call_outlives_the_deadline"],
)
def test_worker_sigkilled_while_parked_on_an_mcp_call_is_replayed_and_completes(
    make_codemode, monkeypatch, timeout_ms, duration
):
    """The worker dies while its run waits on an MCP call: the run is replayed on another
    worker from its journal (earlier results served from it, no call made again), the call
    still running in the host reaches the guest, and the run completes with the right value
    (within the cell, or through `wait` when the call outlives the deadline)."""
    cm = mcp_codemode(make_codemode, timeout_ms)
    calls = McpCalls(cm, monkeypatch)
    session = cm.session("mcp")
    pid = cm.inspect().worker_pids[0]
    killed = cm.inspect().workers_killed
    started = calls.started("trigger-long-running-operation")
    killer = threading.Thread(target=lambda: started.wait(10) and os.kill(pid, signal.SIGKILL))
    killer.start()
    code = f"""
        {SUM_OF}
        const sums = [];
        for (let i = 0; i < 3; i++) sums.push(n(await MCP.everything.getSum({{a: i, b: 1}})));
        text('before');
        const r = await MCP.everything.triggerLongRunningOperation({{duration: {duration}, steps: 1}});
        return [sums, r.content[0].text];
    """
    try:
        first = session.exec({"code": code})
    finally:
        started.set()
        killer.join()
    result = waited_out(session, first)
    assert result["status"] == "completed", result
    done = f"Long running operation completed. Duration: {duration} seconds, Steps: 1."
    assert result["value"] == [[1, 2, 3], done]
    if duration * 1000 < timeout_ms:
        assert first is result  # no `wait` was needed
    else:
        assert first["status"] == "waiting" and first["reason"] == "pending_tools", first
        assert [c["toolId"] for c in first["pendingToolCalls"]] == [LONG_OP]
    assert first["output"] == [{"type": "text", "text": "before"}]  # once: not again on the replay
    assert calls.names == ["get-sum"] * 3 + ["trigger-long-running-operation"]
    assert pid not in cm.inspect().worker_pids
    assert cm.inspect().workers_killed == killed + 1
    for i in range(3):
        result = session.exec({"code": f"return await MCP.everything.getSum({{a: {i}, b: 1}})"})
        assert sum_text(result["value"]) == i + 1


def test_guest_spinning_after_an_mcp_result_is_killed_at_deadline_plus_grace(make_codemode):
    cm = mcp_codemode(make_codemode, 300)
    session = cm.session("mcp")
    killed = cm.inspect().workers_killed
    code = """
        for (let i = 0; i < 3; i++) await MCP.everything.getSum({a: i, b: 1});
        Array.prototype.reverse.call({length: 2 ** 32 - 1});  // never polls the engine's interrupt
        return 'done';
    """
    result = session.exec({"code": code})
    assert (result["status"], result["code"]) == ("failed", "timeout"), result
    assert cm.inspect().workers_killed == killed + 1
    assert sum_text(session.exec({"code": "return await MCP.everything.getSum({a: 1, b: 1})"})["value"]) == 2


def test_large_and_small_results_mixed_reach_the_guest_intact_and_in_order(make_codemode):
    """Results that land together on the tools' loop and the MCP loop, a few bytes and a few
    hundred KiB (more than a pipe holds), each reach the guest whole, as the call it answers."""
    # 68 results of 256 KiB: over the default maxJournalBytes (16 MiB) a run may keep.
    cm = mcp_codemode(make_codemode, 20_000, maxJournalBytes=32 << 20)
    big_size = 256 << 10

    @cm.tool
    async def small(i: int) -> int:
        await asyncio.sleep(0.002)
        return i

    @cm.tool
    async def big(i: int) -> str:
        await asyncio.sleep(0.002 + (i % 7) / 5000)
        return str(i % 10) * (big_size + i)

    code = f"""
        {SUM_OF}
        const whole = (t, i) => t.length === {big_size} + i && t === String(i % 10).repeat(t.length);
        const got = [];
        for (let i = 0; i < 60; i++) {{
            const a = tools.small({{i}}), b = tools.big({{i}}), c = MCP.everything.getSum({{a: i, b: 1}});
            got.push([await a, whole(await b, i), n(await c)]);
        }}
        const bigs = await Promise.all([...Array(8).keys()].map(i => tools.big({{i}})));
        const smalls = await Promise.all([...Array(8).keys()].map(i => tools.small({{i}})));
        return [got, bigs.map(whole), smalls];
    """
    result = cm.session().exec({"code": code})
    assert result["status"] == "completed", result
    got, bigs, smalls = result["value"]
    assert got == [[i, True, i + 1] for i in range(60)]
    assert bigs == [True] * 8
    assert smalls == list(range(8))


def test_a_restart_safe_run_suspends_at_its_first_report_while_the_tools_loop_is_busy(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000})

    @cm.tool(read_only=True)
    async def lookup(key: str) -> str:
        return key.upper()

    session = cm.session("mcp")
    busy = threading.Event()
    cm._loop.get().call_soon_threadsafe(busy.wait, 30)
    try:
        code = "return await tools.callValue('host:core:lookup', {key: 'k'})"
        result = session.exec({"code": code, "restartSafe": True})
        # It suspended without waiting for the loop to get to the call.
        assert not busy.is_set()
    finally:
        busy.set()
    assert result["status"] == "waiting", result
    assert [c["toolId"] for c in result["pendingToolCalls"]] == ["host:core:lookup"]
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == "K"


def test_a_restart_safe_run_with_mcp_calls_goes_through_a_wait_for_each(rcm, monkeypatch):
    """A restart-safe run takes each result through a `wait` (MCP requests that read: resources,
    prompts), and is refused MCP tools, which are not read-only."""
    calls = McpCalls(rcm, monkeypatch)
    code = """
        const listed = await MCP.everything.resources.list();
        const prompts = await MCP.everything.prompts.list();
        let refused = '';
        try { await MCP.everything.getSum({a: 1, b: 2}); } catch (e) { refused = e.message; }
        return [Array.isArray(listed.resources ?? listed), Array.isArray(prompts.prompts ?? prompts), refused];
    """
    session = rcm.session("mcp")
    result = session.exec({"code": code, "restartSafe": True})
    waits = 0
    while result["status"] == "waiting" and waits < 10:
        waits += 1
        result = session.wait({"runId": result["runId"]})
    assert result["status"] == "completed", result
    assert waits == 3
    listed, prompted, refused = result["value"]
    assert listed and prompted
    assert "not read-only" in refused, refused
    assert calls.names == []


@pytest.mark.parametrize(
    "tool", ["stop_sync", "stop_async"], ids=["written_by_the_caller", "written_by_a_tools_thread"]
)
def test_a_worker_that_stops_reading_while_the_host_writes_to_it_is_killed(make_codemode, tool):
    """The worker stops reading its pipe (SIGSTOP) while the host writes it a settle larger than
    the pipe holds: whichever thread writes, the write ends at the frame's deadline with a kill,
    the run fails with `timeout`, and the host goes on with a new worker."""
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    big = "x" * (4 << 20)

    @cm.tool
    def stop_sync() -> str:
        os.kill(cm.inspect().worker_pids[0], signal.SIGSTOP)
        return big

    @cm.tool
    async def stop_async() -> str:
        os.kill(cm.inspect().worker_pids[0], signal.SIGSTOP)
        return big

    @cm.tool
    async def later(x: int) -> int:
        await asyncio.sleep(0.001)
        return x

    s = cm.session()
    started = time.monotonic()
    result = s.exec({"code": f"return (await tools.{tool}()).length"})
    elapsed = time.monotonic() - started
    assert (result["status"], result.get("code")) == ("failed", "timeout"), result
    assert elapsed < 0.3 + 3 * supervisor.KILL_GRACE_S + 0.5
    assert cm.inspect().workers_killed == 1
    assert s.exec({"code": "return await tools.later({x: 42})"})["value"] == 42
