"""A leased step whose calls all go to sync tools that were quick last time is driven by its
caller's thread (`Supervisor._lease_calls`): its reports are not routed one by one, its tools
run on that thread, and the worker is free for others while they run. Whatever happens
meanwhile (a nested cell, a close, a dead worker, a tool that turns slow, another session's
cell) ends the cell exactly as a run driven the general way would end.

Every wait here is a hang guard with a generous bound, never a measurement.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from codemode import CodeMode
from codemode.protocol import MAX_VALUE_CONTAINERS

TEN_CALLS = "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t"


@pytest.fixture
def cm() -> Iterator[CodeMode]:
    with CodeMode({"workers": 1}) as made:
        called: list[int] = []

        @made.tool
        def double(x: int) -> int:
            called.append(threading.get_ident())
            return x * 2

        made.called = called  # type: ignore[attr-defined]
        # The first calls of a tool run the general way (not yet known to be quick).
        assert made.session("warm").exec({"code": TEN_CALLS})["value"] == 90
        yield made


def _routed(cm: CodeMode, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The status of each report the supervisor routes from now on (`ReportRouter.route`)."""
    reports = cm.runner._supervisor._fleet.reports
    route = reports.route
    seen: list[str] = []

    def counted(lane: Any, frame: Any, decoded: Any, out: Any) -> None:
        seen.append(getattr(frame, "status", type(frame).__name__))
        route(lane, frame, decoded, out)

    monkeypatch.setattr(reports, "route", counted)
    return seen


@pytest.mark.usefixtures("unhurried_leases")
def test_quick_sync_calls_run_on_the_callers_thread_and_only_the_last_report_is_routed(cm, monkeypatch):
    routed = _routed(cm, monkeypatch)
    cm.called.clear()
    done = cm.session().exec({"code": TEN_CALLS})
    assert done["value"] == 90, done
    assert done["telemetry"]["toolCalls"] == 10
    assert cm.called == [threading.get_ident()] * 10
    assert routed == ["completed"]


@pytest.mark.usefixtures("unhurried_leases")
def test_a_wait_that_answers_a_yield_drives_the_quick_calls_after_it(cm, monkeypatch):
    s = cm.session()
    first = s.exec({"code": f"const a = await yield_control('go?'); {TEN_CALLS.replace('return t', 'return [a, t]')}"})
    assert first["reason"] == "yield", first
    routed = _routed(cm, monkeypatch)
    done = s.wait({"runId": first["runId"], "answer": "yes"})
    assert done["value"] == ["yes", 90], done
    assert routed == ["completed"]


def test_console_output_between_quick_calls_is_kept_in_order(cm):
    code = "for (let i = 0; i < 3; i++) { console.log('before', i); await tools.double({x: i}); } return 'ok'"
    done = cm.session().exec({"code": code})
    assert done["value"] == "ok"
    assert [o["text"] for o in done["output"]] == ["before 0", "before 1", "before 2"]


def test_a_tool_that_runs_a_cell_of_its_own_on_the_only_worker_is_not_kept_waiting(cm):
    s = cm.session()

    @cm.tool
    def inner(x: int) -> int:
        return int(s.exec({"code": f"return {x} + 1"})["value"])

    code = "let t = 0; for (let i = 0; i < 5; i++) t += await tools.inner({x: i}); return t"
    assert s.exec({"code": code})["value"] == 15  # (the first time, the general way)
    started = time.monotonic()
    assert s.exec({"code": code})["value"] == 15
    assert time.monotonic() - started < 5.0  # (a nested cell queued behind its caller waits 10 s)


def test_a_quick_tool_that_turns_slow_past_the_deadline_fails_the_cell_timeout(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    slow = threading.Event()

    @cm.tool
    def step(x: int) -> int:
        if slow.is_set() and x == 2:
            time.sleep(0.7)  # (past the deadline and its grace)
        return x

    s = cm.session()
    code = "let t = 0; for (let i = 0; i < 4; i++) t += await tools.step({x: i}); return t"
    assert s.exec({"code": code})["value"] == 6
    assert s.exec({"code": code})["value"] == 6
    slow.set()
    killed = cm.inspect().workers_killed
    done = s.exec({"code": code})
    assert (done["status"], done["code"]) == ("failed", "timeout"), done
    assert cm.inspect().workers_killed == killed  # (its runtime dropped, its worker kept)
    assert s.exec({"code": "return 1 + 1"})["value"] == 2


def test_a_worker_killed_while_a_quick_tool_runs_replays_the_cell_without_calling_again(make_codemode):
    cm = make_codemode({"workers": 1})
    kill = threading.Event()
    calls: list[int] = []

    @cm.tool
    def step(x: int) -> int:
        calls.append(x)
        if kill.is_set() and x == 2:
            kill.clear()
            (pid,) = cm.inspect().worker_pids
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return x * 10

    s = cm.session()
    code = "let t = []; for (let i = 0; i < 4; i++) t.push(await tools.step({x: i})); return t"
    assert s.exec({"code": code})["value"] == [0, 10, 20, 30]
    calls.clear()
    kill.set()
    done = s.exec({"code": code})
    assert done["value"] == [0, 10, 20, 30], done
    assert calls == [0, 1, 2, 3]  # (the replay is served from the journal)


def test_a_close_while_a_quick_tool_runs_fails_the_cell_closed(make_codemode):
    cm = make_codemode({"workers": 1})
    close = threading.Event()

    @cm.tool
    def step(x: int) -> int:
        if close.is_set() and x == 1:
            closer = threading.Thread(target=cm.close)
            closer.start()
            closer.join(10)
        return x

    s = cm.session()
    code = "let t = 0; for (let i = 0; i < 3; i++) t += await tools.step({x: i}); return t"
    assert s.exec({"code": code})["value"] == 3
    close.set()
    done = s.exec({"code": code})
    assert (done["status"], done["code"]) == ("failed", "runtime_unavailable"), done


def test_another_sessions_cell_is_served_while_a_cell_makes_many_quick_calls(make_codemode):
    cm = make_codemode({"workers": 1})

    @cm.tool
    def tick(x: int) -> int:
        time.sleep(0.001)
        return x

    long = "let t = 0; for (let i = 0; i < 400; i++) t += await tools.tick({x: 1}); return t"
    assert cm.session("a").exec({"code": "return await tools.tick({x: 1})"})["value"] == 1
    ended: dict[str, float] = {}

    def run_long() -> None:
        assert cm.session("a").exec({"code": long})["value"] == 400
        ended["long"] = time.monotonic()

    thread = threading.Thread(target=run_long)
    thread.start()
    time.sleep(0.05)
    assert cm.session("b").exec({"code": "return 1 + 1"})["value"] == 2
    ended["short"] = time.monotonic()
    thread.join(30)
    assert ended["short"] < ended["long"]


def test_results_past_one_settle_go_in_the_next_and_the_journal_cap_holds(make_codemode):
    cm = make_codemode({"workers": 1, "maxJournalBytes": 32 << 20, "memoryLimitBytes": 256 << 20})

    @cm.tool
    def big(n: int) -> str:
        return "x" * n

    size = 12 << 20  # (two fill a settle frame's budget; the third goes in the next one)
    code = (
        f"const r = await Promise.allSettled([0, 1, 2].map(() => tools.big({{n: {size}}})));"
        " return r.map((s) => s.status === 'fulfilled' ? s.value.length : s.reason.message.slice(0, 40))"
    )
    s = cm.session()
    assert s.exec({"code": "return (await tools.big({n: 1})).length"})["value"] == 1
    done = s.exec({"code": code})
    assert done["value"] == [size, size, "tool result of 12582914 bytes would grow"], done


@pytest.mark.usefixtures("unhurried_leases")
def test_calls_answered_before_their_tool_runs_answer_alike_on_the_callers_thread(make_codemode):
    """One batch of calls (`Dispatcher.run_plain`) whose inputs are refused (too heavy, not the
    tool's, missing a field) between calls that run, by id and by name: the same answers, in
    the same order, as the general way gave the first time (`Dispatcher.submit`)."""
    cm = make_codemode({"workers": 1})
    ran_on: list[int] = []

    @cm.tool
    def double(x: int) -> int:
        ran_on.append(threading.get_ident())
        return x * 2

    heavy = MAX_VALUE_CONTAINERS  # (with the input's own object, one container too many)
    code = f"""
        const seen = [];
        const track = (tag, p) => p.then((v) => seen.push([tag, v]), (e) => seen.push([tag, e.message]));
        await Promise.all([
          track('by id', tools.callValue('host:core:double', {{x: 1}})),
          track('by name', tools.callValue('double', {{x: 2}})),
          track('not its input', tools.callValue('double', {{x: 'no'}})),
          track('too heavy', tools.callValue('double', {{x: 1, pad: Array.from({{length: {heavy}}}, () => [])}})),
          track('missing', tools.double({{}})),
        ]);
        return seen;
    """
    s = cm.session()
    general = s.exec({"code": code})
    assert ran_on and threading.get_ident() not in ran_on  # (the first time: on a pool's thread)
    ran_on.clear()
    here = s.exec({"code": code})
    assert ran_on == [threading.get_ident()] * 2, "the second time, the caller's thread runs them"
    assert here["value"] == general["value"], (here, general)
    assert [tag for tag, _ in here["value"]] == ["not its input", "too heavy", "missing", "by id", "by name"]
    assert here["value"][1][1].startswith("tool double: input is too heavy for the host")
    assert here["telemetry"]["toolCalls"] == 5
