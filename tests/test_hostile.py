"""Hostile cells: each must end in a clear failed result, and the same CodeMode must keep working."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from codemode import CodeMode
from mcp_servers import wait_until

TIMEOUT_MS = 300
MEMORY_LIMIT = 16 << 20
MODULE_ACCESS = "code mode module access is disabled."


@pytest.fixture(scope="module")
def hcm():
    config = {"workers": 2, "timeoutMs": TIMEOUT_MS, "memoryLimitBytes": MEMORY_LIMIT, "maxOutputBytes": 4096}
    with CodeMode(config) as cm:

        @cm.tool
        def ping() -> str:
            return "pong"

        yield cm


@pytest.fixture
def hs(hcm):
    return hcm.session("hostile")


def run(session, code, language="javascript"):
    return session.exec({"code": code, "language": language})


def assert_failed(result, code):
    assert result["status"] == "failed", result
    assert result.get("code") == code, result


# ---- runaway loops (the in-VM interrupt) -----------------------------------------------------------

LOOPS = {
    "plain": "while (true) {}",
    "promise_job": "await Promise.resolve().then(() => { for (;;) {} })",
    "catch": "try { throw new Error('x') } catch (e) { for (;;) {} }",
    "finally": "try { } finally { for (;;) {} }",
    "after_await": "await null; for (;;) {}",
    "after_tool_await": "await tools.ping(); for (;;) {}",
    "catch_swallows_interrupt": "for (;;) { try { while (true) {} } catch (e) {} }",
}


@pytest.mark.parametrize("code", LOOPS.values(), ids=LOOPS.keys())
def test_infinite_loop_times_out(hs, code):
    result = run(hs, code)
    assert_failed(result, "timeout")
    assert "code mode timeout exceeded" in result["error"]


@pytest.mark.parametrize("code", LOOPS.values(), ids=LOOPS.keys())
def test_exec_after_infinite_loop_succeeds(hs, assert_recovers, code):
    run(hs, code)
    assert_recovers(hs)


# ---- builtins that never poll the interrupt: the supervisor's SIGKILL ------------------------------

HUGE_ARRAY_LIKES = {
    "reverse": "Array.prototype.reverse.call({length: 2 ** 32 - 1})",
    "sort": "Array.prototype.sort.call({length: 2 ** 32 - 1})",
    "join": "Array.prototype.join.call({length: 2 ** 32 - 1}, '')",
}


@pytest.mark.parametrize("code", HUGE_ARRAY_LIKES.values(), ids=HUGE_ARRAY_LIKES.keys())
def test_huge_array_like_builtin_is_killed_by_supervisor(hcm, hs, code):
    killed = hcm.inspect().workers_killed
    result = run(hs, code)
    assert_failed(result, "timeout")
    assert hcm.inspect().workers_killed > killed


@pytest.mark.parametrize("code", HUGE_ARRAY_LIKES.values(), ids=HUGE_ARRAY_LIKES.keys())
def test_exec_after_supervisor_kill_succeeds(hs, assert_recovers, code):
    assert run(hs, code)["code"] == "timeout"
    assert_recovers(hs)


# ---- memory bombs --------------------------------------------------------------------------------

MEMORY_BOMBS = {
    "array_growth": "const a = []; for (;;) a.push({i: a.length})",
    "string_doubling": "let s = 'x'; for (;;) s = s.repeat(2)",
    "object_graph": "let head = null; for (;;) head = {next: head, pad: [1, 2, 3]}",
    "wide_object": "const o = {}; for (let i = 0; ; i++) o['k' + i] = {i}",
}


@pytest.mark.parametrize("code", MEMORY_BOMBS.values(), ids=MEMORY_BOMBS.keys())
def test_memory_bomb_fails_with_memory_limit_exceeded(hs, code):
    result = run(hs, code)
    assert_failed(result, "memory_limit_exceeded")
    assert "memory limit" in result["error"]


@pytest.mark.parametrize("code", MEMORY_BOMBS.values(), ids=MEMORY_BOMBS.keys())
def test_memory_bomb_caught_by_guest_still_fails(hs, code):
    result = run(hs, "try { " + code + " } catch (e) { return 'survived: ' + e }")
    assert_failed(result, "memory_limit_exceeded")


def test_memory_bomb_retried_in_loop_still_fails(hs):
    code = "const keep = []; for (;;) { try { for (;;) keep.push('x'.repeat(1000) + keep.length) } catch (e) {} }"
    assert_failed(run(hs, code), "memory_limit_exceeded")


@pytest.mark.parametrize("code", MEMORY_BOMBS.values(), ids=MEMORY_BOMBS.keys())
def test_exec_after_memory_bomb_succeeds(hs, assert_recovers, code):
    run(hs, code)
    assert_recovers(hs)


# ---- stack, output, deadlock ---------------------------------------------------------------------


def test_unbounded_recursion_fails_with_range_error(hs):
    result = run(hs, "function f() { return f() + 1 } return f()")
    assert result["status"] == "failed"
    assert result["error"].startswith("RangeError")


def test_exec_after_unbounded_recursion_succeeds(hs, assert_recovers):
    run(hs, "function f() { return f() + 1 } return f()")
    assert_recovers(hs)


def test_output_flood_fails_with_output_limit_exceeded(hs):
    result = run(hs, "for (;;) console.log('x'.repeat(100))")
    assert_failed(result, "output_limit_exceeded")


def test_output_flood_caught_by_guest_still_fails(hs):
    result = run(hs, "try { for (;;) text('y'.repeat(100)) } catch (e) { return 'survived' }")
    assert_failed(result, "output_limit_exceeded")


def test_output_flood_keeps_output_within_limit(hs):
    result = run(hs, "for (;;) console.log('x'.repeat(100))")
    assert sum(len(o["text"].encode()) for o in result.get("output", [])) <= 4096


def test_oversized_final_value_fails_with_output_limit_exceeded(hs):
    assert_failed(run(hs, "return 'z'.repeat(10000)"), "output_limit_exceeded")


def test_exec_after_output_flood_succeeds(hs, assert_recovers):
    run(hs, "for (;;) console.log('x'.repeat(100))")
    assert_recovers(hs)


def test_never_settling_promise_fails_as_deadlock(hs):
    result = run(hs, "await new Promise(() => {})")
    assert_failed(result, "timeout")
    assert "can never finish" in result["error"]


def test_exec_after_never_settling_promise_succeeds(hs, assert_recovers):
    run(hs, "await new Promise(() => {})")
    assert_recovers(hs)


# ---- input the frontend refuses --------------------------------------------------------------------


def test_syntax_error_is_invalid_input_with_line(hs):
    result = run(hs, "const a = 1;\nconst b = ;")
    assert_failed(result, "invalid_input")
    assert "line 2:" in result["error"]


MODULE_CELLS = {
    "static_import": "import fs from 'fs'",
    "require": "const fs = require('fs'); return 1",
    "dynamic_import": "const m = await import('fs'); return m",
    "export": "export const a = 1",
}


@pytest.mark.parametrize("code", MODULE_CELLS.values(), ids=MODULE_CELLS.keys())
def test_module_access_is_invalid_input(hs, code):
    result = run(hs, code)
    assert_failed(result, "invalid_input")
    assert MODULE_ACCESS in result["error"]


def test_module_access_in_typescript_is_invalid_input(hs):
    result = run(hs, "import { a } from 'a';\nconst x: number = 1; return x", "typescript")
    assert_failed(result, "invalid_input")
    assert MODULE_ACCESS in result["error"]


def test_dynamic_import_hidden_in_eval_cannot_load_a_module(hs):
    result = run(hs, "const m = await eval('import(\"fs\")'); return Object.keys(m)")
    assert result["status"] == "failed", result


@pytest.mark.parametrize(
    "name", ["process", "require", "fetch", "setTimeout", "setInterval", "WeakRef", "FinalizationRegistry"]
)
def test_host_global_is_undefined(hs, name):
    assert run(hs, f"return typeof {name}")["value"] == "undefined"


def test_exec_after_rejected_input_succeeds(hs, assert_recovers):
    run(hs, "import fs from 'fs'")
    assert_recovers(hs)


# ---- workers killed from outside --------------------------------------------------------------------


def _wait_dead(pid: int) -> None:
    """Until the killed worker is a zombie (or gone), so the pool cannot race the signal."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} survived SIGKILL")


def _add_killer(cm) -> list[int]:
    calls: list[int] = []

    @cm.tool
    def kill_workers() -> int:
        pids = cm.inspect().worker_pids
        calls.append(len(pids))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return len(pids)

    return calls


def test_worker_sigkilled_under_a_parked_run_is_replayed_and_its_tool_runs_once(make_codemode):
    """The worker dies while its run waits on a tool: the run is replayed on the replacement and
    completes with the tool's value, the tool having run once."""
    cm = make_codemode({"workers": 1, "timeoutMs": 5000})
    calls = _add_killer(cm)
    result = cm.session().exec({"code": "text('a'); const n = await tools.kill_workers(); return n + 1"})
    assert (result["status"], result["value"]) == ("completed", 2), result
    assert result["output"] == [{"type": "text", "text": "a"}]
    assert len(calls) == 1


def test_a_run_whose_worker_is_killed_each_time_it_runs_fails_with_runtime_unavailable(make_codemode):
    """The spec: a QuickJS worker that exits with a non-zero status is `runtime_unavailable`. The
    run whose frame a dying worker was executing goes on elsewhere a few times (the worker may have
    been killed from outside), then fails; the host keeps serving."""
    cm = make_codemode({"workers": 1, "timeoutMs": 20000})
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set():
            for pid in cm.inspect().worker_pids:
                if pid not in killed and _running_cell(pid):
                    killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        result = cm.session().exec({"code": "while (true) {}"})
    finally:
        stop.set()
        thread.join()
    assert_failed(result, "runtime_unavailable")
    assert "crashed" in result["error"]
    assert "SIGKILL" in result["error"]
    assert len(killed) == 3
    assert cm.session().exec({"code": "return 5"})["value"] == 5


def _running_cell(pid: int) -> bool:
    """The worker is on a CPU (running a cell), not asleep in a read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] == "R" and int(fields[11]) > 20  # utime (ticks): past its start-up


def test_exec_after_worker_sigkilled_mid_run_succeeds(make_codemode, assert_recovers):
    cm = make_codemode({"workers": 1, "timeoutMs": 5000})
    _add_killer(cm)
    session = cm.session()
    assert session.exec({"code": "return await tools.kill_workers()"})["value"] == 1
    assert_recovers(session)


def test_exec_after_every_pool_worker_sigkilled_mid_run_succeeds(make_codemode, assert_recovers):
    cm = make_codemode({"workers": 2, "timeoutMs": 5000})
    _add_killer(cm)
    session = cm.session()
    assert session.exec({"code": "return await tools.kill_workers()"})["value"] == 2
    assert_recovers(session)


def test_idle_worker_killed_from_outside_does_not_fail_next_exec(make_codemode, assert_recovers):
    cm = make_codemode({"workers": 1, "timeoutMs": 5000})
    session = cm.session()
    assert_recovers(session)
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
    assert_recovers(session)


def test_exec_after_pool_wide_sigkill_succeeds_every_time(make_codemode):
    """The idle worker killed alongside the busy one may not have exited yet when the next cell
    is handed to it; that cell must still run (on a replacement), never fail as a crash."""
    cm = make_codemode({"workers": 2, "timeoutMs": 5000})
    _add_killer(cm)
    session = cm.session()
    failures = []
    for _ in range(40):
        assert session.exec({"code": "return await tools.kill_workers()"})["status"] == "completed"
        result = session.exec({"code": "return 1"})
        if result["status"] != "completed":
            failures.append(result["error"])
    assert failures == []


# ---- a compromised worker: well-formed frames with hostile values ------------------------------------


def _tamper_frames(monkeypatch, change) -> None:
    """Every frame a worker sends passes through ``change`` on its way to the supervisor."""
    from codemode import workers

    real_take = workers.WorkerProcess.take

    def take(self, timeout_s, spin=False):
        spoke, frames = real_take(self, timeout_s, spin)
        return spoke, None if frames is None else [change(frame) for frame in frames]

    monkeypatch.setattr(workers.WorkerProcess, "take", take)


HOSTILE_REPORT_FIELDS = {
    "value_not_json": {"value": "{"},
    "value_too_deep": {"value": "[" * 100_000 + "]" * 100_000},
    "store_writes_not_json": {"store_writes": "nope"},
    "json_output_not_json": {"outputs": [(1, "{'a': 1}")]},
}


@pytest.mark.parametrize("change", HOSTILE_REPORT_FIELDS.values(), ids=HOSTILE_REPORT_FIELDS.keys())
def test_hostile_values_in_a_report_discard_the_worker(monkeypatch, change) -> None:
    """A worker that sends a completed report whose JSON fields are not JSON: the run fails with
    internal_error, the worker is replaced, the host raises nothing and the next exec works."""
    import msgspec
    from codemode.protocol import Report

    tamper = [True]

    def change_frame(frame):
        if tamper[0] and isinstance(frame, Report) and frame.status == "completed":
            tamper[0] = False
            frame = msgspec.structs.replace(frame, **change)
        return frame

    _tamper_frames(monkeypatch, change_frame)
    with CodeMode({"workers": 1}) as cm:
        session = cm.session("s")
        result = session.exec({"code": "console.log('x'); return 1"})
        assert result["status"] == "failed", result
        assert result["code"] == "internal_error"
        assert "worker sent a value" in result["error"]
        assert cm.inspect().workers_killed == 1
        assert session.exec({"code": "return 2"})["value"] == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"status": "done"},
        {"failure": ("root_access", "Error", "m", "")},
        {"outputs": [(10, "x")]},
    ],
    ids=["unknown_status", "unknown_failure_code", "unknown_output_kind"],
)
def test_frames_with_values_outside_the_protocol_do_not_decode(fields) -> None:
    import msgspec
    from codemode import protocol

    base = {
        "run": 1,
        "status": "failed",
        "value": None,
        "failure": ("timeout", "TimeoutError", "m", ""),
        "outputs": [],
        "calls": [],
        "clock_reads": [],
        "in_flight": 0,
        "memory_bytes": 0,
        "searches": 0,
        "describes": 0,
        "store_writes": None,
    }
    good = ["report", *base.values()]
    assert isinstance(protocol.worker_decoder.decode(msgspec.msgpack.encode(good)), protocol.Report)
    bad = ["report", *{**base, **fields}.values()]
    with pytest.raises(msgspec.ValidationError):
        protocol.worker_decoder.decode(msgspec.msgpack.encode(bad))


def test_a_worker_flooding_the_host_with_calls_is_discarded(monkeypatch) -> None:
    """More calls in one report than maxPendingToolCalls: no engine does that, so no tool runs
    and the worker is replaced."""
    import msgspec
    from codemode.protocol import Report

    ran: list[int] = []
    flood_once = [True]

    def flood_frame(frame):
        if isinstance(frame, Report) and frame.status == "pending" and frame.calls and flood_once[0]:
            flood_once[0] = False
            call_id, tool, data, method = frame.calls[0]
            flood = [(call_id + i, tool, data, method) for i in range(5)]
            frame = msgspec.structs.replace(frame, calls=flood)
        return frame

    _tamper_frames(monkeypatch, flood_frame)
    with CodeMode({"workers": 1, "maxPendingToolCalls": 4}) as cm:

        @cm.tool
        def count(x: int) -> int:
            ran.append(x)
            return x

        session = cm.session("s")
        result = session.exec({"code": "return await tools.count({x: 1})"})
        assert (result["status"], result["code"]) == ("failed", "internal_error"), result
        assert "maxPendingToolCalls" in result["error"]
        assert ran == []
        assert cm.inspect().workers_killed == 1
        assert session.exec({"code": "return await tools.count({x: 2})"})["value"] == 2


def test_workers_that_cannot_start_fail_each_run_with_runtime_unavailable(monkeypatch) -> None:
    """The spec: a worker that cannot start is `runtime_unavailable`, as a result, not an exception."""
    from codemode import workers

    with CodeMode({"workers": 1}) as cm:
        session = cm.session("s")
        assert session.exec({"code": "return 1"})["value"] == 1

        def cannot_start(self, *args):
            raise OSError(2, "No such file or directory", "python")

        monkeypatch.setattr(workers.WorkerProcess, "__init__", cannot_start)
        for pid in cm.inspect().worker_pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        for _ in range(2):
            result = session.exec({"code": "return 2"})
            assert (result["status"], result["code"]) == ("failed", "runtime_unavailable"), result
            assert "could not start a worker process" in result["error"]
        monkeypatch.undo()
        assert session.exec({"code": "return 3"})["value"] == 3


@pytest.mark.parametrize(
    ("script", "why"),
    [("exec sleep 30", "did not start in time"), ("exit 3", "exited")],
    ids=["never_ready", "exits_at_once"],
)
def test_workers_that_die_before_they_are_ready_fail_a_run_after_three_not_loop(
    monkeypatch, tmp_path, script, why
) -> None:
    """A worker binary that starts but never says it is ready (or dies at once) is replaced, and
    the run waiting for it fails after three, rather than waiting on replacements for ever."""
    from codemode import placement, workers

    with CodeMode({"workers": 1, "timeoutMs": 1000}) as cm:
        session = cm.session("s")
        assert session.exec({"code": "return 1"})["value"] == 1
        broken = tmp_path / "worker"
        broken.write_text(f"#!/bin/sh\n{script}\n")
        broken.chmod(0o755)
        monkeypatch.setattr(workers, "WORKER_BINARY", broken)
        monkeypatch.setattr(placement.LocalPlacement, "spawn_timeout_s", 0.3)
        for pid in cm.inspect().worker_pids:
            os.kill(pid, signal.SIGKILL)
        result = session.exec({"code": "return 2"})
        assert (result["status"], result["code"]) == ("failed", "runtime_unavailable"), result
        assert result["error"].startswith("code mode runtime is unavailable: 3 workers died before they were ready: ")
        assert why in result["error"]
        monkeypatch.undo()
        wait_until(lambda: session.exec({"code": "return 3"}).get("value") == 3, "a real worker again")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"outputs": [(1, "{'a': 1}")]}, "worker sent a value"),
        ("flood", "maxPendingToolCalls"),
    ],
    ids=["output_not_json", "call_flood"],
)
def test_a_hostile_report_mid_run_starts_no_call(monkeypatch, change, message) -> None:
    """A report after several calls (parked on async calls, read by whichever reader) is checked
    before any of its calls starts."""
    import asyncio

    import msgspec
    from codemode.protocol import Report

    pending = [0]

    def change_frame(frame):
        if isinstance(frame, Report) and frame.status == "pending" and frame.calls:
            pending[0] += 1
            if pending[0] == 3:
                if change == "flood":
                    call_id, tool, data, method = frame.calls[0]
                    flood = [(call_id + i, tool, data, method) for i in range(5)]
                    return msgspec.structs.replace(frame, calls=flood)
                return msgspec.structs.replace(frame, **change)
        return frame

    _tamper_frames(monkeypatch, change_frame)
    ran: list[int] = []
    with CodeMode({"workers": 1, "maxPendingToolCalls": 4}) as cm:

        @cm.tool
        async def later(x: int) -> int:
            ran.append(x)
            await asyncio.sleep(0.001)
            return x

        session = cm.session("s")
        code = "let t = 0; for (let i = 0; i < 5; i++) t += await tools.later({x: i}); return t"
        result = session.exec({"code": code})
        assert (result["status"], result["code"]) == ("failed", "internal_error"), result
        assert message in result["error"]
        time.sleep(0.05)
        assert ran == [0, 1]
        assert cm.inspect().workers_killed == 1
        pending[0] = -100
        assert session.exec({"code": "return await tools.later({x: 7})"})["value"] == 7
