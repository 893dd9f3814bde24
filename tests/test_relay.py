"""The relay: while a run is parked on calls that all run on one event loop (`MCP.*` calls on the
MCP client's loop), that loop's thread takes the worker's reports instead of the driver. These
pin that it is used, and that every way a step can end still ends as it does without it."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from codemode import CodeMode, supervisor
from codemode.supervisor import Supervisor
from mcp_servers import everything_server

LONG_OP = "mcp:everything:trigger-long-running-operation"


class Takes:
    """Counts the reports the driver and the relay take; ``started(tool)`` is set once the relay
    has started a call of that tool."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.driver = 0
        self.relay = 0
        self._started: dict[str, threading.Event] = {}
        take = Supervisor._take_report

        def counted(sup: Supervisor, worker: Any, run: Any, frame: Any, step: Any, relay: Any = None, **kw: Any) -> Any:
            taken = take(sup, worker, run, frame, step, relay, **kw)
            if relay is None:
                self.driver += 1
            elif taken is not None:
                self.relay += 1
                for call_id, _, _ in frame.calls:
                    self.started(run.dispatcher.resolved.get(call_id, "")).set()
            return taken

        monkeypatch.setattr(Supervisor, "_take_report", counted)

    def started(self, tool_id: str) -> threading.Event:
        return self._started.setdefault(tool_id, threading.Event())


@pytest.fixture(scope="module")
def rcm():
    with CodeMode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"everything": everything_server()}}) as cm:
        assert cm.load_mcp_tools() == {"everything": None}

        @cm.tool
        def double(n: int) -> int:
            return 2 * n

        yield cm


def mcp_codemode(make_codemode: Any, timeout_ms: int) -> CodeMode:
    cm = make_codemode({"workers": 1, "timeoutMs": timeout_ms, "mcpServers": {"everything": everything_server()}})
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


def test_sequential_mcp_calls_are_taken_by_the_relay_and_give_every_value(rcm, monkeypatch):
    takes = Takes(monkeypatch)
    code = """
        const sums = [];
        for (let i = 0; i < 30; i++) {
            const r = await MCP.everything.getSum({a: i, b: 1});
            sums.push(Number(r.content[0].text.replace(/\\.$/, '').split(' ').pop()));
            if (i % 10 === 0) text(`at ${i}`);
        }
        return sums;
    """
    result = rcm.session("relay").exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == [i + 1 for i in range(30)]
    assert result["telemetry"]["toolCalls"] == 30
    assert result["output"] == [{"type": "text", "text": f"at {i}"} for i in (0, 10, 20)]
    # The driver leaves the first report to the relay too (its call runs on the MCP loop) and
    # takes only the last one, which ends the run.
    assert (takes.driver, takes.relay) == (1, 30)


def test_mcp_and_sync_tools_mixed_in_one_cell(rcm, monkeypatch):
    takes = Takes(monkeypatch)
    code = """
        const n = (r) => Number(r.content[0].text.replace(/\\.$/, '').split(' ').pop());
        let total = 0;
        for (let i = 0; i < 5; i++) {
            total += n(await MCP.everything.getSum({a: i, b: 1}));
            total += n(await MCP.everything.getSum({a: i, b: 2}));
            total += await tools.double({n: i});
        }
        const [a, b, c] = await Promise.all([
            MCP.everything.getSum({a: 100, b: 1}), tools.double({n: 50}), MCP.everything.getSum({a: 200, b: 1}),
        ]);
        return [total, n(a), b, n(c)];
    """
    result = rcm.session("relay").exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == [sum(2 * i + 3 + 2 * i for i in range(5)), 101, 100, 201]
    assert result["telemetry"]["toolCalls"] == 18
    # Each second getSum follows a getSum, which the relay takes once it watches the worker;
    # on a loaded machine the driver may still be on its way to parking when a result lands
    # (it then settles that one itself), so not all five are the relay's every time.
    assert takes.relay >= 1


def test_a_first_report_the_relay_cannot_take_goes_back_to_the_driver(rcm, monkeypatch):
    takes = Takes(monkeypatch)
    firsts: list[bool] = []
    take = supervisor._Relay._take_locked

    def recorded(relay: Any, first: Any) -> bool:
        handed_back = take(relay, first)
        if first is not None:
            firsts.append(handed_back)
        return handed_back

    monkeypatch.setattr(supervisor._Relay, "_take_locked", recorded)
    code = """
        const [a, b] = await Promise.all([MCP.everything.getSum({a: 1, b: 1}), tools.double({n: 3})]);
        return [a.content[0].text, b];
    """
    started = time.monotonic()
    result = rcm.session("relay").exec({"code": code})
    assert result["status"] == "completed", result
    # At once: the driver heard of the hand-back (it once slept through it until the deadline).
    assert time.monotonic() - started < 5.0
    assert result["value"] == ["The sum of 1 and 1 is 2.", 6]
    assert result["telemetry"]["toolCalls"] == 2
    # Its first call runs on the MCP loop, so the relay got the report; the sync call beside it
    # runs inline, on the driver: the relay handed it back, and the driver took it.
    assert firsts == [True]
    assert takes.driver >= 2


def test_a_first_report_the_loop_never_gets_to_is_taken_by_the_driver(make_codemode, monkeypatch):
    takes = Takes(monkeypatch)
    cm = mcp_codemode(make_codemode, 150)
    session = cm.session("relay")
    loop = cm._mcp.event_loop()
    # The MCP loop is busy past the cell's deadline: the relay given the first report never
    # starts watching, and the driver, at the deadline, takes the report back as read.
    loop.call_soon_threadsafe(time.sleep, 0.6)
    result = session.exec({"code": "return (await MCP.everything.getSum({a: 2, b: 5})).content[0].text"})
    assert result["status"] == "waiting", result
    assert [c["toolId"] for c in result["pendingToolCalls"]] == ["mcp:everything:get-sum"]
    assert takes.driver == 1 and takes.relay == 0
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == "The sum of 2 and 5 is 7."


def test_a_restart_safe_first_report_is_not_offered_to_a_busy_relay(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 5_000})

    @cm.tool(read_only=True)
    async def lookup(key: str) -> str:
        return key.upper()

    session = cm.session("relay")
    # The relay never takes a restart-safe run's reports: offered one, a driver would wait for a
    # busy loop to refuse it before it could suspend.
    cm._loop.get().call_soon_threadsafe(time.sleep, 1.0)
    started = time.monotonic()
    result = session.exec({"code": "return await tools.callValue('host:core:lookup', {key: 'k'})", "restartSafe": True})
    assert result["status"] == "waiting", result
    assert time.monotonic() - started < 0.6
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == "K"


def test_mcp_call_pending_at_the_deadline_suspends_and_wait_completes(make_codemode, monkeypatch):
    takes = Takes(monkeypatch)
    cm = mcp_codemode(make_codemode, 300)
    session = cm.session("relay")
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
    assert takes.started(LONG_OP).is_set()  # the relay had started it
    result = waited_out(session, result)
    assert result["status"] == "completed", result
    assert result["value"] == [3, "Long running operation completed. Duration: 1 seconds, Steps: 1."]


def test_worker_sigkilled_while_the_relay_owns_it_fails_with_runtime_unavailable(make_codemode, monkeypatch):
    takes = Takes(monkeypatch)
    # The call outlives the deadline: the death must be seen when it happens, not when the call
    # ends (that would suspend the run instead).
    cm = mcp_codemode(make_codemode, 3000)
    session = cm.session("relay")
    pid = cm._supervisor.worker_pids()[0]
    killer = threading.Thread(target=lambda: takes.started(LONG_OP).wait(5) and os.kill(pid, signal.SIGKILL))
    killer.start()
    code = """
        for (let i = 0; i < 3; i++) await MCP.everything.getSum({a: i, b: 1});
        await MCP.everything.triggerLongRunningOperation({duration: 30, steps: 1});
        return 'survived';
    """
    result = session.exec({"code": code})
    killer.join()
    assert result["status"] == "failed", result
    assert result["code"] == "runtime_unavailable"
    assert "SIGKILL" in result["error"]
    for i in range(3):
        result = session.exec({"code": f"return await MCP.everything.getSum({{a: {i}, b: 1}})"})
        assert sum_text(result["value"]) == i + 1


def test_guest_spinning_after_an_mcp_result_is_killed_at_deadline_plus_grace(make_codemode, monkeypatch):
    takes = Takes(monkeypatch)
    cm = mcp_codemode(make_codemode, 300)
    session = cm.session("relay")
    killed = cm._supervisor.killed
    code = """
        for (let i = 0; i < 3; i++) await MCP.everything.getSum({a: i, b: 1});
        Array.prototype.reverse.call({length: 2 ** 32 - 1});  // never polls the engine's interrupt
        return 'done';
    """
    result = session.exec({"code": code})
    assert (result["status"], result["code"]) == ("failed", "timeout"), result
    assert cm._supervisor.killed == killed + 1
    assert takes.relay >= 1
    assert sum_text(session.exec({"code": "return await MCP.everything.getSum({a: 1, b: 1})"})["value"]) == 2


def test_results_past_the_direct_cap_are_written_by_the_driver_only(make_codemode, monkeypatch):
    """A large result that lands while the relay owns the worker is left to the run's driver: a
    tools' thread (the relay's included) never writes more than DIRECT_SETTLE_BYTES to a worker."""
    import asyncio

    from codemode.tools import DIRECT_SETTLE_BYTES

    cm = make_codemode({"workers": 1, "timeoutMs": 10_000})

    @cm.tool
    async def small() -> int:
        await asyncio.sleep(0.002)
        return 1

    @cm.tool
    async def big(i: int) -> str:
        await asyncio.sleep(0.002 + (i % 7) / 5000)
        return "x" * (256 << 10)

    settles: list[tuple[bool, int]] = []
    real = Supervisor._hand_results

    def spy(sup: Supervisor, worker: Any, run: Any, results: Any, deadline: float, step: Any, **kw: Any) -> Any:
        settles.append((kw.get("driving", True), sum(len(r[2]) for r in results)))
        return real(sup, worker, run, results, deadline, step, **kw)

    monkeypatch.setattr(Supervisor, "_hand_results", spy)
    code = """
        let n = 0;
        for (let i = 0; i < 100; i++) { const a = tools.small(), b = tools.big({i}); await a; n += (await b).length; }
        return n;
    """
    result = cm.session().exec({"code": code})
    assert result["value"] == 100 * (256 << 10), result
    assert any(not driving for driving, _ in settles)  # the small ones went directly
    assert [size for driving, size in settles if not driving and size > DIRECT_SETTLE_BYTES] == []


def test_a_relay_stuck_writing_to_a_worker_that_stopped_reading_is_ended_by_a_kill(make_codemode, monkeypatch):
    """Stands in for a hostile worker that stops reading its pipe while the relay writes to it:
    the relay's thread holds the relay and blocks until the worker dies. The driver does not
    wait for it past the grace: it kills the worker, and the run fails; the host goes on."""
    import asyncio
    import time

    from codemode import supervisor

    cm = make_codemode({"workers": 1, "timeoutMs": 300})

    @cm.tool
    async def later(x: int) -> int:
        await asyncio.sleep(0.001)
        return x

    real = supervisor._Relay._readable
    stuck = threading.Event()

    def readable(relay: Any) -> None:
        if not stuck.is_set():
            stuck.set()
            with relay._lock:
                while relay._worker.proc.poll() is None:  # a write that ends when the worker does
                    time.sleep(0.005)
            return
        real(relay)

    monkeypatch.setattr(supervisor._Relay, "_readable", readable)
    s = cm.session()
    started = time.monotonic()
    result = s.exec({"code": "let t = 0; for (let i = 0; i < 5; i++) t += await tools.later({x: i}); return t"})
    assert stuck.is_set()
    # Killed past the deadline: which the driver sees first, the deadline or the pipe's end,
    # depends on the machine's load.
    assert result["status"] == "failed" and result["code"] in ("runtime_unavailable", "timeout"), result
    assert time.monotonic() - started < 0.3 + 3 * supervisor.KILL_GRACE_S + 0.5
    monkeypatch.setattr(supervisor._Relay, "_readable", real)
    assert s.exec({"code": "return await tools.later({x: 42})"})["value"] == 42
