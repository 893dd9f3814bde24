"""Suspend and resume: `waiting`, `wait`, the run table, resident runtimes and journal replay."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest
from codemode import CodeMode, CodemodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp_servers import wait_until

UNAVAILABLE = "code mode run is unavailable or expired."
FOREIGN = "code mode run belongs to a different session."


class Gate:
    """An async tool that finishes only when the test opens it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.cancelled = threading.Event()

    def open(self) -> None:
        self.event.set()


def add_tools(cm: CodeMode, gate: Gate) -> None:
    @cm.tool(read_only=True)
    def fast(n: int = 1) -> int:
        return n

    @cm.tool(read_only=True)
    async def slow(n: int = 0) -> int:
        try:
            while not gate.event.is_set():
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            gate.cancelled.set()
            raise
        return n * 10

    @cm.tool(read_only=True)
    async def sleepy(ms: int, value: Any = None) -> Any:
        await asyncio.sleep(ms / 1000)
        return value

    @cm.tool
    def write(x: int) -> int:
        return x


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def wcm(make_codemode, gate):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_tools(cm, gate)
    return cm


def exec_(session, code: str, **extra: Any) -> dict[str, Any]:
    return session.exec({"code": code, **extra})


def resume_until_done(session, result: dict[str, Any], rounds: int = 50) -> dict[str, Any]:
    for _ in range(rounds):
        if result["status"] != "waiting":
            return result
        result = session.wait({"runId": result["runId"]})
    raise AssertionError(f"still waiting after {rounds} waits: {result}")


def test_tools_settling_before_the_deadline_drain_in_one_exec(make_codemode, gate):
    cm = make_codemode({"workers": 1, "timeoutMs": 5000})
    add_tools(cm, gate)
    code = "let t = 0; for (let i = 1; i <= 10; i++) t += await tools.sleepy({ms: 2, value: i}); return t"
    result = exec_(cm.session(), code)
    assert result["status"] == "completed"
    assert result["value"] == 55
    assert result["telemetry"]["toolCalls"] == 10


def test_pending_tool_at_deadline_returns_waiting_and_wait_completes(wcm, gate):
    s = wcm.session()
    first = exec_(s, "text('before'); const v = await tools.slow({n: 4}); text('after'); return v + 2")
    assert first["status"] == "waiting"
    assert first["reason"] == "pending_tools"
    assert first["runId"].startswith("run_")
    pending = [{"id": first["pendingToolCalls"][0]["id"], "toolId": "host:core:slow", "method": "callValue"}]
    assert first["pendingToolCalls"] == pending
    assert first["output"] == [{"type": "text", "text": "before"}]
    gate.open()
    done = s.wait({"runId": first["runId"]})
    assert done["status"] == "completed"
    assert done["value"] == 42
    assert done["output"] == [{"type": "text", "text": "after"}]


def test_wait_before_the_tool_finishes_returns_waiting_again(wcm, gate):
    s = wcm.session()
    first = exec_(s, "return await tools.slow({n: 1})")
    again = s.wait({"runId": first["runId"]})
    assert again["status"] == "waiting"
    assert again["runId"] == first["runId"]
    gate.open()
    assert s.wait({"runId": first["runId"]})["value"] == 10


def test_yield_control_suspends_with_reason_yield(wcm):
    s = wcm.session()
    first = exec_(s, "text('one'); await yield_control('show progress'); text('two'); return 'done'")
    assert first["status"] == "waiting"
    assert first["reason"] == "yield"
    assert "pendingToolCalls" not in first  # optional in the spec; omitted when empty
    done = s.wait({"runId": first["runId"]})
    assert done["status"] == "completed"
    assert done["value"] == "done"
    assert done["output"] == [{"type": "text", "text": "two"}]


def test_wait_on_unknown_run_fails_invalid_input(wcm):
    result = wcm.session().wait({"runId": "run_nope"})
    assert result["status"] == "failed"
    assert result["code"] == "invalid_input"
    assert result["error"] == UNAVAILABLE


def test_wait_on_completed_run_fails_invalid_input(wcm):
    s = wcm.session()
    first = exec_(s, "await yield_control(); return 1")
    assert s.wait({"runId": first["runId"]})["value"] == 1
    again = s.wait({"runId": first["runId"]})
    assert (again["code"], again["error"]) == ("invalid_input", UNAVAILABLE)


def test_wait_from_another_session_fails_and_leaves_the_run(wcm):
    first = exec_(wcm.session("alice"), "await yield_control(); return 'mine'")
    foreign = wcm.session("bob").wait({"runId": first["runId"]})
    assert (foreign["code"], foreign["error"]) == ("invalid_input", FOREIGN)
    other_agent_run = wcm.session("alice", agent_run="other").wait({"runId": first["runId"]})
    assert other_agent_run["error"] == FOREIGN
    assert wcm.session("alice").wait({"runId": first["runId"]})["value"] == "mine"


def test_two_concurrent_waits_on_one_run_one_is_refused(wcm, gate):
    s = wcm.session()
    first = exec_(s, "return await tools.slow({n: 2})")
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(s.wait({"runId": first["runId"]}))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    gate.open()
    for t in threads:
        t.join()
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["completed", "failed"]
    refused = next(r for r in results if r["status"] == "failed")
    assert refused["code"] == "invalid_input"
    assert refused["error"] == "code mode run is already being resumed."


def test_the_65th_suspended_run_is_refused(make_codemode):
    cm = make_codemode({"workers": 2, "timeoutMs": 2000})
    sessions = [cm.session(f"s{n}") for n in range(4)]  # 16 each: the per-session share
    ids = []
    for i in range(64):
        r = exec_(sessions[i % 4], f"await yield_control(); return {i}")
        assert r["status"] == "waiting", r
        ids.append(r["runId"])
    refused = exec_(cm.session("s4"), "await yield_control(); return 64")
    assert refused["status"] == "failed"
    assert refused["code"] == "invalid_input"
    assert refused["error"] == "too many suspended code mode runs."
    assert exec_(sessions[0], "return 'not suspended'")["value"] == "not suspended"
    assert [sessions[i % 4].wait({"runId": rid})["value"] for i, rid in enumerate(ids)] == list(range(64))


def test_one_session_holds_at_most_its_share_of_suspended_runs(make_codemode):
    cm = make_codemode({"workers": 2, "timeoutMs": 2000, "maxSuspendedRunsPerSession": 3})
    greedy, other = cm.session("greedy"), cm.session("other")
    held = [exec_(greedy, "await yield_control(); return 1") for _ in range(3)]
    assert [r["status"] for r in held] == ["waiting"] * 3
    refused = exec_(greedy, "await yield_control(); return 1")
    assert (refused["status"], refused["code"]) == ("failed", "invalid_input")
    assert refused["error"] == "too many suspended code mode runs in this session (maxSuspendedRunsPerSession 3)."
    # Agent runs of the same session share its share; other sessions are untouched.
    assert exec_(cm.session("greedy", agent_run="r2"), "await yield_control()")["status"] == "failed"
    assert exec_(other, "await yield_control(); return 2")["status"] == "waiting"
    # A slot freed by a `wait` that finishes the run is the session's again.
    assert greedy.wait({"runId": held[0]["runId"]})["value"] == 1
    assert exec_(greedy, "await yield_control(); return 3")["status"] == "waiting"


def test_a_run_past_its_ttl_holds_no_slot_before_the_sweeper_takes_it(make_codemode, monkeypatch):
    # The table is not swept on every exec: an expired run must not count against the caps
    # meanwhile (here the sweeper never runs at all).
    cm = make_codemode({"workers": 1, "timeoutMs": 2000, "snapshotTtlSeconds": 1, "maxSuspendedRunsPerSession": 2})
    monkeypatch.setattr(cm._live, "sweep", lambda: None)
    s = cm.session("s")
    held = [exec_(s, "await yield_control(); return 1") for _ in range(2)]
    assert [r["status"] for r in held] == ["waiting"] * 2
    assert exec_(s, "await yield_control(); return 1")["status"] == "failed"
    time.sleep(1.1)
    assert exec_(s, "await yield_control(); return 2")["status"] == "waiting"
    # And the expired ones cannot be resumed.
    assert s.wait({"runId": held[0]["runId"]})["code"] == "invalid_input"


def test_a_session_id_cannot_spell_another_sessions_agent_run_scope(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 2000})
    owner = cm.session("conv", agent_run="run1")
    waiting = exec_(owner, "await yield_control(); return 'mine'")
    assert waiting["status"] == "waiting"
    for forger in (cm.session("conv\x00run1"), cm.session("conv"), cm.session("conv", agent_run="run2")):
        refused = forger.wait({"runId": waiting["runId"]})
        assert (refused["code"], refused["error"]) == ("invalid_input", "code mode run belongs to a different session.")
        assert forger.cancel(waiting["runId"]) is False
    assert owner.wait({"runId": waiting["runId"]})["value"] == "mine"


def test_snapshot_over_max_snapshot_bytes_fails(make_codemode):
    cm = make_codemode({"workers": 1, "maxSnapshotBytes": 1 << 20})
    result = exec_(cm.session(), "globalThis.big = 'x'.repeat(3 << 20); await yield_control(); return 1")
    assert result["status"] == "failed"
    assert result["code"] == "snapshot_limit_exceeded"
    assert "maxSnapshotBytes" in result["error"]


def test_expired_run_is_gone_and_its_tool_task_cancelled(make_codemode, gate):
    cm = make_codemode({"workers": 1, "timeoutMs": 200, "snapshotTtlSeconds": 1})
    add_tools(cm, gate)
    s = cm.session()
    first = exec_(s, "return await tools.slow({n: 1})")
    assert first["status"] == "waiting"
    assert gate.cancelled.wait(5), "the expired run's tool task was not cancelled"
    expired = s.wait({"runId": first["runId"]})
    assert (expired["code"], expired["error"]) == ("invalid_input", UNAVAILABLE)


def test_cancel_aborts_the_run_and_its_tool_task(wcm, gate):
    s = wcm.session()
    first = exec_(s, "return await tools.slow({n: 1})")
    assert s.cancel(first["runId"]) is True
    assert gate.cancelled.wait(5)
    assert s.wait({"runId": first["runId"]})["error"] == UNAVAILABLE
    assert s.cancel(first["runId"]) is False


def test_closing_a_session_aborts_its_runs(wcm, gate):
    s = wcm.session("closing")
    first = exec_(s, "return await tools.slow({n: 1})")
    s.close()
    assert gate.cancelled.wait(5)
    assert s.wait({"runId": first["runId"]})["error"] == UNAVAILABLE


def test_a_worker_holds_several_suspended_runs_and_serves_new_execs(wcm):
    s = wcm.session()
    waiting = [exec_(s, f"await yield_control(); return {i}") for i in range(3)]
    assert exec_(s, "return 'fresh'")["value"] == "fresh"
    assert [s.wait({"runId": w["runId"]})["value"] for w in waiting] == [0, 1, 2]


def test_worker_killed_with_three_suspended_runs_all_complete_by_replay(make_codemode, gate):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_tools(cm, gate)
    s = cm.session()
    code = (
        "const seen = [Math.random(), Date.now()];"
        "const a = await tools.fast({n: %d}); text('a=' + a);"
        "const b = await tools.slow({n: a});"
        "return {b, seen: [seen[0] === Math.random() ? 'same' : 'fresh', typeof seen[1]], again: Math.random() < 2}"
    )
    waiting = [exec_(s, code % i) for i in (1, 2, 3)]
    assert all(w["status"] == "waiting" for w in waiting)
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    gate.open()
    done = [s.wait({"runId": w["runId"]}) for w in waiting]
    assert [d["status"] for d in done] == ["completed"] * 3, done
    assert [d["value"]["b"] for d in done] == [10, 20, 30]
    # Replayed output is not repeated: it was delivered with the `waiting` result.
    assert all("output" not in d for d in done)


def test_a_replay_runs_against_the_catalog_its_run_started_with_after_the_catalog_changed(make_codemode):
    """A tool added while a run is suspended is not in its catalog, resident or replayed (its
    worker killed): the journal's catalog is the one a replay configures its worker with."""
    cm = make_codemode({"workers": 1})

    @cm.tool
    def first(x: int) -> int:
        return x

    s = cm.session()
    has = "async (name) => { try { await tools.describe(name); return true } catch { return false } }"
    code = f"const has = {has}; const a = await yield_control(); return [a, await has('first'), await has('second')]"
    resident, replayed = exec_(s, code), exec_(s, code)

    @cm.tool
    def second(x: int) -> int:
        return x

    assert exec_(s, f"return await ({has})('second')")["value"] is True
    assert s.wait({"runId": resident["runId"], "answer": 1})["value"] == [1, True, False]
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    done = s.wait({"runId": replayed["runId"], "answer": 2})
    assert done["value"] == [2, True, False], done
    assert exec_(s, f"return await ({has})('second')")["value"] is True


def test_replay_that_diverges_from_the_journal_fails(make_codemode, gate):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_tools(cm, gate)
    s = cm.session()
    first = exec_(s, "const a = await tools.fast({n: 1}); return await tools.slow({n: a})")
    assert first["status"] == "waiting"
    (run,) = cm._live.suspended()  # (a journal corrupted in place: internals)
    call_id, ok, _ = run.journal.batches[0][0]
    run.journal.batches[0][0] = (call_id, ok, "2")  # the recorded result no longer matches
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    gate.open()
    result = s.wait({"runId": first["runId"]})
    assert result["status"] == "failed"
    assert "diverged on replay" in result["error"]
    assert "host:core:slow" in result["error"]


def test_restart_safe_run_refuses_tools_not_marked_read_only(wcm):
    code = "try { await tools.write({x: 1}); return 'wrote' } catch (e) { return e.message }"
    session = wcm.session()
    result = resume_until_done(session, exec_(session, code, restartSafe=True))
    assert "not read-only" in result["value"]


def test_restart_safe_run_is_never_drained_within_the_call(wcm):
    """The spec: restart-safe runs are never auto-drained, even by tools that answer at once."""
    session = wcm.session()
    code = "const a = await tools.fast({n: 2}); const b = await tools.fast({n: a + 1}); return a + b"
    first = exec_(session, code, restartSafe=True)
    assert first["status"] == "waiting" and first["reason"] == "pending_tools"
    second = session.wait({"runId": first["runId"]})
    assert second["status"] == "waiting"
    assert session.wait({"runId": first["runId"]})["value"] == 5
    assert exec_(session, code)["value"] == 5  # the same cell, not restart-safe: one call


def test_restart_safe_run_resumes_in_another_codemode_from_exported_journal(make_codemode, gate):
    first_cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_tools(first_cm, gate)
    code = (
        "const a = await tools.fast({n: 3}); text('x'); const b = await tools.sleepy({ms: 400, value: a * 7}); return b"
    )
    first = exec_(first_cm.session("s"), code, restartSafe=True)
    assert first["status"] == "waiting"
    data = first_cm.export_run(first["runId"])
    assert isinstance(data, bytes)
    second_cm = make_codemode({"workers": 1, "timeoutMs": 2000})
    add_tools(second_cm, Gate())
    run_id = second_cm.import_run(data, "s")
    result = resume_until_done(second_cm.session("s"), second_cm.session("s").wait({"runId": run_id}))
    assert result["status"] == "completed"
    assert result["value"] == 21


def test_journal_of_a_run_that_is_not_restart_safe_cannot_be_imported(wcm, make_codemode):
    first = exec_(wcm.session(), "await yield_control(); return 1")
    data = wcm.export_run(first["runId"])
    other = make_codemode({"workers": 1})
    with pytest.raises(CodemodeError, match="restartSafe"):
        other.import_run(data, "default")


CELL = """
const results = [];
for (const [i, ms] of INPUT.entries()) {
  results.push(await tools.sleepy({ms, value: i * 3}));
}
const par = await Promise.all(INPUT.map((ms, i) => tools.sleepy({ms: Math.floor(ms / 2), value: i})));
return {results, par, t: Date.now() > 0};
"""


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    latencies=st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=5), timeout=st.integers(100, 250)
)
def test_any_latencies_and_deadline_give_the_value_of_an_unhurried_run(latencies, timeout, make_codemode):
    gate = Gate()
    code = CELL.replace("INPUT", str(latencies))
    with CodeMode({"workers": 1, "timeoutMs": 10_000}) as patient:
        add_tools(patient, gate)
        expected = patient.session().exec({"code": code})
    assert expected["status"] == "completed"
    hurried = make_codemode({"workers": 1, "timeoutMs": timeout})
    add_tools(hurried, gate)
    s = hurried.session()
    result = resume_until_done(s, s.exec({"code": code}), rounds=200)
    assert result["status"] == "completed", result
    assert result["value"] == expected["value"]


# ---- queueing for a worker is not guest time ---------------------------------------------------------

BUSY = "let n = 0; for (let i = 0; i < 4e7; i++) n += i & 1; return n"  # ~0.5 s of CPU in QuickJS
SHORT = '// @options: {"timeout_ms": 100}\n'


def _busy_in_background(cm: CodeMode) -> tuple[threading.Thread, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: got.append(cm.session("busy").exec({"code": BUSY})))
    thread.start()
    time.sleep(0.1)  # the one worker is now running BUSY
    return thread, got


def test_exec_queued_behind_a_long_cell_keeps_its_whole_budget(gate: Gate) -> None:
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        add_tools(cm, gate)
        thread, busy = _busy_in_background(cm)
        result = cm.session("s").exec({"code": SHORT + "return 7"})
        thread.join()
        assert result["status"] == "completed", result
        assert result["value"] == 7
        assert busy[0]["status"] == "completed", busy
        assert cm.inspect().workers_killed == 0


def test_wait_whose_resident_worker_is_busy_keeps_its_whole_budget(gate: Gate) -> None:
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        add_tools(cm, gate)
        session = cm.session("s")
        waiting = session.exec({"code": SHORT + "await yield_control(); return await tools.fast({n: 3})"})
        assert waiting["status"] == "waiting", waiting
        thread, busy = _busy_in_background(cm)
        result = session.wait({"runId": waiting["runId"]})
        thread.join()
        assert result["status"] == "completed", result
        assert result["value"] == 3
        assert busy[0]["status"] == "completed", busy
        assert cm.inspect().workers_killed == 0


def test_results_arriving_at_the_deadline_still_get_time_to_be_used(gate: Gate) -> None:
    """A tool finishing just before the deadline: the guest gets the settle floor to use it,
    instead of a timeout with a few milliseconds left."""
    with CodeMode({"workers": 1}) as cm:
        add_tools(cm, gate)
        session = cm.session("s")
        code = SHORT + (
            "const v = await tools.sleepy({ms: 90, value: 5});"
            # ~40 ms of guest work once the result lands ~10 ms before the deadline: more than
            # is left, well within the floor (2e6 overran the floor with both cores busy).
            " let n = 0; for (let i = 0; i < 1e6; i++) n += i & 1; return v + n"
        )
        for _ in range(3):
            result = session.exec({"code": code})
            while result["status"] == "waiting":
                result = session.wait({"runId": result["runId"]})
            assert result["status"] == "completed", result
            assert result["value"] == 5 + 500_000


# ---- async results settled from the tool's own thread ---------------------------------------------


def test_async_results_small_and_large_reach_the_guest_in_order(gate: Gate) -> None:
    """Small results are settled by the tool's thread, large ones (past the pipe-sized limit)
    wake the driver; both arrive intact and in the guest's order."""
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        add_tools(cm, gate)

        @cm.tool
        async def blob(n: int) -> str:
            await asyncio.sleep(0.001)
            return "x" * n

        code = """
            const sizes = [10, 200000, 5, 40000, 1];
            const got = [];
            for (const n of sizes) got.push((await tools.blob({n})).length);
            const many = await Promise.all(sizes.map(n => tools.blob({n})));
            return [got, many.map(s => s.length)];
        """
        result = cm.session("s").exec({"code": code})
        sizes = [10, 200000, 5, 40000, 1]
        assert result["status"] == "completed", result
        assert result["value"] == [sizes, sizes]


def test_worker_killed_while_parked_on_an_async_tool_is_replayed_and_completes() -> None:
    """The worker dies while the run waits for an async tool: the run is replayed on the
    replacement from its journal, the tool (still running in the host) is not called again,
    its result reaches the guest, and the next cells work."""
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        started = threading.Event()
        calls: list[int] = []

        @cm.tool
        async def late(x: int) -> int:
            calls.append(x)
            started.set()
            await asyncio.sleep(0.3)
            return x

        session = cm.session("s")
        killer = threading.Thread(
            target=lambda: started.wait(5) and os.kill(cm.inspect().worker_pids[0], signal.SIGKILL)
        )
        killer.start()
        result = session.exec({"code": "text('before'); const v = await tools.late({x: 1}); return v + 1"})
        killer.join()
        assert (result["status"], result["value"]) == ("completed", 2), result
        assert result["output"] == [{"type": "text", "text": "before"}]
        assert calls == [1]
        for _ in range(3):
            assert session.exec({"code": "return await tools.late({x: 2})"})["value"] == 2


@pytest.mark.parametrize("tool", ["fast", "sleepy"])
def test_a_cell_that_keeps_calling_tools_still_times_out(gate: Gate, tool: str) -> None:
    """The settle floor is granted once per exec: a ping-pong loop over a sync or an async tool
    ends with `timeout` soon after the deadline, it is not kept alive by each result."""
    with CodeMode({"workers": 1}) as cm:
        add_tools(cm, gate)
        args = "{n: 1}" if tool == "fast" else "{ms: 1, value: 1}"
        started = time.monotonic()
        session = cm.session("s")
        result = session.exec({"code": SHORT + f"for (;;) await tools.{tool}({args})"})
        assert time.monotonic() - started < 2.0
        if tool == "fast":  # the guest is running at the deadline
            assert (result["status"], result.get("code")) == ("failed", "timeout"), result
        else:  # a call is pending at the deadline: the run suspends, as the spec says
            assert result["status"] == "waiting", result
            assert session.cancel(result["runId"])


# ---- advancing: a result that lands while the run is suspended is settled at once -----------


def _progress(cm: CodeMode, run_id: str) -> str | None:
    state = cm.inspect().run(run_id)
    return None if state is None else state.progress


def _advanced(cm: CodeMode, run_id: str, status: str) -> Any:
    """The suspended run, once an advance has taken it to ``status`` (``parked``: on to its
    next report, which parks it on held calls, or a yield's ``suspended``)."""
    (run,) = [r for r in cm._live.suspended() if r.run_id == run_id]  # (its step's reports: internals)
    wait_until(lambda: _progress(cm, run_id) == status and (status != "parked" or run.step.reports), "run advanced")
    return run


def _advanced_then_killed(cm: CodeMode, gate: Gate, session: Any, code: str) -> dict[str, Any]:
    """Runs ``code`` until it suspends on ``slow``, lets a background advance take it on once
    ``slow`` answers, then SIGKILLs the workers: the resident runtime is gone. The ``waiting``
    result."""
    first = exec_(session, code)
    gate.open()
    _advanced(cm, first["runId"], "parked")
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    return first


def _exited(pid: int) -> bool:
    """The process has exited (it may still wait to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.fixture
def recorded(wcm: CodeMode) -> list[int]:
    calls: list[int] = []

    @wcm.tool
    def record(x: int) -> int:
        calls.append(x)
        return x

    return calls


def test_a_result_landing_while_suspended_is_settled_before_the_wait(wcm, gate):
    s = wcm.session()
    first = exec_(s, "text('a'); const v = await tools.slow({n: 4}); text('b'); return v + 2")
    assert first["status"] == "waiting"
    gate.open()
    run = _advanced(wcm, first["runId"], "completed")
    assert run.lane is None  # the runtime has finished: the `wait` needs no worker
    done = s.wait({"runId": first["runId"]})
    assert (done["status"], done["value"]) == ("completed", 42)
    assert done["output"] == [{"type": "text", "text": "b"}]
    assert done["telemetry"]["toolCalls"] == 1
    assert wcm.suspended_runs() == []


def test_calls_made_while_advancing_start_only_with_the_wait(wcm, gate, recorded):
    s = wcm.session()
    first = exec_(s, "const v = await tools.slow({n: 1}); text('got ' + v); return await tools.record({x: v})")
    gate.open()
    run = _advanced(wcm, first["runId"], "parked")
    time.sleep(0.05)
    assert recorded == []  # held: the model has not asked the run to go on
    assert [tool for _, tool, _ in run.held] == ["host:core:record"]
    done = s.wait({"runId": first["runId"]})
    assert (done["status"], done["value"]) == ("completed", 10)
    assert recorded == [10]
    assert done["output"] == [{"type": "text", "text": "got 10"}]
    assert done["telemetry"]["toolCalls"] == 2


def test_cancel_after_an_advance_never_starts_the_held_calls(wcm, gate, recorded):
    s = wcm.session()
    first = exec_(s, "const v = await tools.slow({n: 1}); return await tools.record({x: v})")
    gate.open()
    _advanced(wcm, first["runId"], "parked")
    assert s.cancel(first["runId"]) is True
    time.sleep(0.05)
    assert recorded == []
    assert s.wait({"runId": first["runId"]})["code"] == "invalid_input"


def test_an_advance_stops_at_a_yield_and_the_wait_reports_it(wcm, gate):
    s = wcm.session()
    code = "const v = await tools.slow({n: 2}); text('v=' + v); await yield_control('check'); return v"
    first = exec_(s, code)
    gate.open()
    _advanced(wcm, first["runId"], "suspended")
    yielded = s.wait({"runId": first["runId"]})
    assert (yielded["status"], yielded["reason"]) == ("waiting", "yield")
    assert yielded["output"] == [{"type": "text", "text": "v=2" + "0"}]
    assert s.wait({"runId": first["runId"]})["value"] == 20


def test_worker_killed_after_an_advance_replays_with_the_held_calls(wcm, gate, recorded):
    s = wcm.session()
    code = "const v = await tools.slow({n: 3}); text('got ' + v); return await tools.record({x: v}) + 1"
    first = _advanced_then_killed(wcm, gate, s, code)
    done = s.wait({"runId": first["runId"]})
    assert (done["status"], done["value"]) == ("completed", 31), done
    assert recorded == [30]
    # Output of the advance is delivered once, by this `wait`; the replay's copy is dropped.
    assert done["output"] == [{"type": "text", "text": "got 30"}]


@pytest.mark.parametrize("wait_early", [False, True], ids=["after-both", "between"])
def test_advances_go_on_as_more_results_land_and_outputs_keep_their_order(wcm, gate, wait_early):
    s = wcm.session()
    code = (
        "const p = tools.slow({n: 1}), q = tools.sleepy({ms: 600, value: 5});"
        "text('x' + await p); text('y' + await q); return 'done'"
    )
    first = exec_(s, code)
    assert first["status"] == "waiting"
    gate.open()
    _advanced(wcm, first["runId"], "parked" if wait_early else "completed")
    # (On a loaded machine the 600 ms tool may outlive the first `wait`'s 300 ms: the outputs
    # then come over two waits, still once each and in order.)
    results = [s.wait({"runId": first["runId"]})]
    while results[-1]["status"] == "waiting" and len(results) < 20:
        results.append(s.wait({"runId": first["runId"]}))
    done = results[-1]
    assert (done["status"], done["value"]) == ("completed", "done"), done
    outputs = [output for result in results for output in result.get("output", [])]
    assert outputs == [{"type": "text", "text": "x10"}, {"type": "text", "text": "y5"}]


def test_a_guest_that_spins_after_its_result_times_out_in_the_advance(wcm, gate):
    s = wcm.session()
    first = exec_(s, "await tools.slow({n: 1}); while (true) {}")
    gate.open()
    _advanced(wcm, first["runId"], "failed")
    result = s.wait({"runId": first["runId"]})
    assert (result["status"], result["code"]) == ("failed", "timeout")
    assert exec_(s, "return 40 + 2")["value"] == 42


@pytest.mark.parametrize("yields", [False, True], ids=["held-call", "yield"])
def test_max_snapshot_bytes_holds_where_an_advance_parks_a_suspended_run(make_codemode, gate, yields):
    """A suspended run that an advance carries on stays suspended where it stops (at a held call
    or a yield): nobody waits for it, so its runtime must fit maxSnapshotBytes there too, or a
    few such runs grow their worker without bound while they sit out the TTL."""
    cm = make_codemode({"workers": 1, "timeoutMs": 300, "maxSnapshotBytes": 1 << 20})
    add_tools(cm, gate)
    s = cm.session()
    pause = "await yield_control()" if yields else "await tools.fast({n: 1})"
    code = f"const v = await tools.slow({{n: 1}}); let big = 'x'.repeat(3 << 20); {pause}; big = null; return v"
    first = exec_(s, code)
    assert first["status"] == "waiting"
    gate.open()
    _advanced(cm, first["runId"], "failed")
    result = s.wait({"runId": first["runId"]})
    assert (result["status"], result["code"]) == ("failed", "snapshot_limit_exceeded"), result
    assert "maxSnapshotBytes" in result["error"]
    assert cm.suspended_runs() == []
    assert exec_(s, "return 40 + 2")["value"] == 42


def test_an_advance_waits_for_a_busy_worker_without_delaying_a_cancel(wcm, gate):
    s = wcm.session()
    cancelled, advanced = (exec_(s, f"return await tools.slow({{n: {n}}})") for n in (1, 2))
    busy: dict[str, Any] = {}
    spin = threading.Thread(
        target=lambda: busy.update(exec_(s, "const t = Date.now(); while (Date.now() - t < 250) {} return 'spun'"))
    )
    spin.start()
    time.sleep(0.05)  # the one worker is now running the spin
    gate.open()
    time.sleep(0.03)  # the tools answer; their runs cannot be advanced yet
    started = time.monotonic()
    assert s.cancel(cancelled["runId"]) is True
    assert time.monotonic() - started < 0.1
    spin.join()
    assert busy["value"] == "spun"
    _advanced(wcm, advanced["runId"], "completed")  # once the worker is free
    assert s.wait({"runId": advanced["runId"]})["value"] == 20


def test_a_call_made_with_a_yield_starts_with_the_wait_that_reports_the_yield(wcm, gate, recorded):
    s = wcm.session()
    code = (
        "const v = await tools.slow({n: 1}); const p = tools.record({x: v}); await yield_control('y'); return await p"
    )
    first = exec_(s, code)
    gate.open()
    _advanced(wcm, first["runId"], "suspended")
    assert recorded == []
    yielded = s.wait({"runId": first["runId"]})
    assert (yielded["status"], yielded["reason"]) == ("waiting", "yield")
    assert recorded == [10]  # as without the advance: this wait saw the guest make the call
    assert s.wait({"runId": first["runId"]})["value"] == 10


def test_a_replay_that_fails_after_an_advance_fails_the_wait(wcm, gate, recorded, monkeypatch):
    from codemode import workers

    s = wcm.session()

    def cannot_start(*args: Any, **kwargs: Any) -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(workers, "WorkerProcess", cannot_start)  # no replacement for the kill
    pids = wcm.inspect().worker_pids
    first = _advanced_then_killed(wcm, gate, s, "const v = await tools.slow({n: 1}); return await tools.record({x: v})")
    wait_until(lambda: all(_exited(pid) for pid in pids), "the worker is gone")
    result = s.wait({"runId": first["runId"]})
    assert (result["status"], result["code"]) == ("failed", "runtime_unavailable"), result
    assert wcm.suspended_runs() == []


def test_cancel_does_not_wait_for_a_running_advance(wcm, gate):
    s = wcm.session()
    first = exec_(s, "await tools.slow({n: 1}); const t = Date.now(); while (Date.now() - t < 5000) {}")
    gate.open()
    (run,) = wcm._live.suspended()  # (whether it still holds a lane: internals)
    wait_until(lambda: _progress(wcm, first["runId"]) == "running", "the run is advancing")
    started = time.monotonic()
    assert s.cancel(first["runId"]) is True
    assert time.monotonic() - started < 0.1
    assert s.wait({"runId": first["runId"]})["code"] == "invalid_input"
    wait_until(lambda: run.lane is None, "the advance ended and retired the run")
    assert exec_(s, "return 40 + 2")["value"] == 42


def test_run_ids_are_fresh_across_batches_and_threads():
    """Ids come from the OS a batch at a time: many more than a batch, drawn from several
    threads at once, are all distinct and of the one shape (``run_`` and 24 hex digits)."""
    from codemode.runs import RUN_ID_BATCH, new_run_id

    drawn: list[str] = []
    lock = threading.Lock()

    def draw() -> None:
        mine = [new_run_id() for _ in range(RUN_ID_BATCH * 5 + 7)]
        with lock:
            drawn.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(drawn) == 4 * (RUN_ID_BATCH * 5 + 7)
    assert len(set(drawn)) == len(drawn)
    assert all(len(i) == 28 and i.startswith("run_") and int(i[4:], 16) >= 0 for i in drawn)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_hands_out_its_parents_run_ids():
    """Hosts forked from one parent share a run store: a child must not hand out the ids the
    parent drew and has not handed out yet."""
    from codemode.runs import new_run_id

    new_run_id()  # the parent holds the rest of a batch now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(new_run_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {new_run_id() for _ in range(8)}
    assert len(child) == 8 and not child & parent


class _Filed:
    """What the run table reads of a run."""

    def __init__(self, run_id: str, scope: tuple[str, str | None]) -> None:
        self.run_id, self.scope = run_id, scope
        self.busy, self.aborted, self.expires_at = False, False, 0.0


def test_the_run_tables_session_counts_follow_every_way_in_and_out():
    """The table counts a session's share over that session's runs only: after any sequence of
    filing, claiming, holding, aborting, taking, expiring and removing, each session's cap
    refuses exactly when the runs of that session holding a slot fill it, and `of_scope` lists
    exactly that scope's runs."""
    import random

    from codemode.runs import TOO_MANY_IN_SESSION, RunLookupError, RunTable

    rng = random.Random(7)
    table = RunTable(ttl_seconds=60.0, limit=10_000, per_session=4)
    scopes = [("a", None), ("a", "r2"), ("b", None), ("c", None)]
    runs = [_Filed(f"run_{n}", rng.choice(scopes)) for n in range(60)]
    for _ in range(3000):
        run = rng.choice(runs)
        op = rng.randrange(7)
        if op == 0:
            filed = {r.run_id: r for r in table.all()}
            holding = sum(
                1 for r in filed.values() if r.scope[0] == run.scope[0] and (r.busy or r.expires_at > time.monotonic())
            )
            refused = table.suspend(run)
            if run.run_id in filed:
                assert refused is None
            else:
                assert (refused == TOO_MANY_IN_SESSION.format(limit=4)) == (holding >= 4)
        elif op in (1, 3):
            with contextlib.suppress(RunLookupError):
                (table.claim if op == 1 else table.abort)(run.run_id, run.scope)
        elif op == 2:
            table.hold(run)
        elif op == 4:
            table.take_idle(run)
        elif op == 5:
            table.remove(run)
        else:
            run.expires_at = time.monotonic() - 1  # (expired unless busy)
            table.expired()
        everything = table.all()
        for scope in scopes:
            assert {r.run_id for r in table.of_scope(scope)} == {r.run_id for r in everything if r.scope == scope}
    table.drain()
    assert len(table) == 0 and all(table.of_scope(scope) == [] for scope in scopes)
