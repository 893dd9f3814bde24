"""A sync exec's first step on a leased idle worker (`Supervisor.first_step`), before its cell is
a run: the cells it ends make no run, every other cell ends exactly as a run would, and nothing
that happens while a lease is held (a close, an interrupt, another run's result) loses a run or
leaves a worker stuck.

Every wait here is a hang guard with a generous bound, never a measurement.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from codemode import CodeMode

TOOLS_CALLED = "return (await tools.double({x: 4})) + 1"


def _codemode(**config: Any) -> CodeMode:
    cm = CodeMode({"workers": 1, **config})

    @cm.tool
    def double(x: int) -> int:
        return x * 2

    return cm


@pytest.fixture
def cm() -> Iterator[CodeMode]:
    with _codemode() as made:
        assert made.session("warm").exec({"code": "return 0"})["status"] == "completed"
        yield made


def _runs_made(cm: CodeMode, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids the runner makes runs for from now on (`RunFactory.run_for`)."""
    factory = cm.runner._factory
    made: list[str] = []
    run_for = factory.run_for

    def counted(cell: Any) -> Any:
        made.append(cell.run_id)
        return run_for(cell)

    monkeypatch.setattr(factory, "run_for", counted)
    return made


def _hold_the_lease(cm: CodeMode, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], object]) -> None:
    """The next lease's first look at its worker runs ``meanwhile`` first (in the exec's thread,
    with the lease held and its start written)."""
    readers = cm.runner._supervisor._fleet.readers
    look = readers.look
    done = threading.Event()

    def held(lane: Any, timeout: float) -> Any:
        if not done.is_set() and lane.reader.__class__.__name__ == "Lease":
            done.set()
            meanwhile()
        return look(lane, timeout)

    monkeypatch.setattr(readers, "look", held)


def _shown(result: dict[str, Any]) -> str:
    """A result without what differs from one run of a cell to the next (its duration, run id,
    and the handles of cut outputs)."""
    shown = {k: v for k, v in result.items() if k != "runId"}
    shown["telemetry"] = {k: v for k, v in result["telemetry"].items() if k != "durationMs"}
    return re.sub(r"out_[\w-]+", "out_", json.dumps(shown, sort_keys=True))


@pytest.mark.usefixtures("unhurried_leases")
def test_a_cell_that_completes_plainly_makes_no_run(cm, monkeypatch):
    made = _runs_made(cm, monkeypatch)
    session = cm.session("plain")
    assert session.exec({"code": "return {a: [1, 2], b: 'x'}"})["value"] == {"a": [1, 2], "b": "x"}
    assert session.exec({"code": "let s = 0; for (let i = 0; i < 100; i++) s += i; return s"})["value"] == 4950
    assert made == []
    # A cell that does more than compute a value is a run, made when its first step shows it.
    assert session.exec({"code": TOOLS_CALLED})["value"] == 9
    assert session.exec({"code": "console.log('hi'); return 1"})["output"] == [{"type": "text", "text": "hi"}]
    assert len(made) == 2
    trace = [event for event in cm.trace() if event["sessionId"] == "plain" and event["kind"] == "exec"]
    assert [event["status"] for event in trace] == ["completed"] * 4
    assert all(event["runId"].startswith("run_") for event in trace)


CELLS = [
    "return 1 + 1",
    "return undefined",
    "return {deep: {er: [1, {x: null}]}}",
    "return 'é'.repeat(10000)",
    "console.log('a', {b: 1}); return 2",
    "throw new Error('boom')",
    "return (",
    "const x: number = 3; return x * 2",
    TOOLS_CALLED,
    "return (await tools.search('double')).length > 0",
    "await yield_control('pause'); return 1",
    "store('k', {v: 1}); return load('k')",
    "// @options: {\"max_output_tokens\": 20}\nreturn 'y'.repeat(500)",
    '// @options: {"timeout_ms": 100}\nwhile (true) {}',
    "let a = []; while (true) a.push('x'.repeat(1 << 20))",
    "function f() { return f() + 1 } return f()",
]


@pytest.mark.parametrize("code", CELLS)
def test_every_cell_ends_as_a_run_would_have_ended(cm, code):
    """The sync exec (leased first step) and exec_async (a run from the start) agree."""
    language = "typescript" if ": number" in code else "javascript"
    leased = cm.session("leased").exec({"code": code, "language": language})
    as_run = asyncio.run(cm.session("as_run").exec_async({"code": code, "language": language}))
    assert _shown(leased) == _shown(as_run)
    if leased["status"] == "waiting":
        assert cm.session("leased").wait({"runId": leased["runId"]})["value"] == 1
        assert asyncio.run(cm.session("as_run").wait_async({"runId": as_run["runId"]}))["value"] == 1


def test_close_while_a_lease_is_held_fails_the_cell_as_closed_and_frees_the_worker(monkeypatch):
    cm = _codemode()
    session = cm.session("s")
    assert session.exec({"code": "return 0"})["status"] == "completed"
    lane = cm.runner._supervisor._fleet.lanes[0]
    closer = threading.Thread(target=cm.close)
    _hold_the_lease(cm, monkeypatch, lambda: (closer.start(), time.sleep(0.2)))
    result = session.exec({"code": "return 1"})
    closer.join(10)
    assert result["status"] == "failed" and result["code"] == "runtime_unavailable", result
    assert "closed" in result["error"]
    assert lane.dead and lane.reader is None
    assert lane.worker.proc.stdout.closed and lane.worker.proc.poll() is not None


@pytest.mark.parametrize("code", ["return 5", TOOLS_CALLED])
def test_an_interrupt_while_a_lease_is_held_leaves_the_worker_serving(cm, monkeypatch, code):
    """The reply is dropped when it comes (a runtime parked on a call goes with it); the worker
    is neither killed nor stuck."""

    def interrupt() -> None:
        raise KeyboardInterrupt

    _hold_the_lease(cm, monkeypatch, interrupt)
    session = cm.session("s")
    with pytest.raises(KeyboardInterrupt):
        session.exec({"code": code})
    for i in range(5):
        assert session.exec({"code": f"return {i}"})["value"] == i
    assert session.exec({"code": TOOLS_CALLED})["value"] == 9
    inspection = cm.inspect()
    assert cm.runner._supervisor.killed == 0
    assert len(inspection.worker_pids) == 1


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
def test_a_run_that_cannot_be_made_for_a_held_lease_lets_the_worker_go(cm, monkeypatch, interrupt):
    """The cell's first step is leased and shows a tool call, and making its run fails (an
    interrupt, or a bug): no run takes the lease over, so the lane is let go of, not left
    leased; the worker serves on."""
    factory = cm.runner._factory
    run_for = factory.run_for

    def failing(cell: Any) -> Any:
        monkeypatch.setattr(factory, "run_for", run_for)
        raise interrupt

    monkeypatch.setattr(factory, "run_for", failing)
    session = cm.session("s")
    if interrupt is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            session.exec({"code": TOOLS_CALLED})
    else:
        result = session.exec({"code": TOOLS_CALLED})
        assert result["status"] == "failed" and result["code"] == "internal_error", result
    assert session.exec({"code": TOOLS_CALLED})["value"] == 9
    assert session.exec({"code": "return 6"})["value"] == 6
    assert cm.runner._supervisor.killed == 0


def test_an_interrupt_before_the_start_is_written_replaces_the_worker(cm, monkeypatch):
    """A start not wholly written may have left part of a frame in the pipe: that worker goes."""
    lane = cm.runner._supervisor._fleet.lanes[0]
    send = lane.worker.send

    def interrupted(frames: Any, deadline: float) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(lane.worker, "send", interrupted)
    session = cm.session("s")
    with pytest.raises(KeyboardInterrupt):
        session.exec({"code": "return 1"})
    monkeypatch.setattr(lane.worker, "send", send)
    assert session.exec({"code": "return 2"})["value"] == 2
    assert session.exec({"code": TOOLS_CALLED})["value"] == 9
    assert cm.runner._supervisor.killed == 1


@pytest.mark.timeout(60)
def test_a_suspended_runs_result_that_lands_during_a_lease_is_settled_after_it(monkeypatch):
    """Run A is suspended on its tool, resident on the only worker; the tool answers while cell
    B holds that worker's lease: A's settle (an advance) waits for the lease to end, then goes,
    and A's next `wait` finds it completed; B's cell ends plainly."""
    with CodeMode({"workers": 1, "timeout_ms": 300}) as cm:
        release = threading.Event()

        @cm.tool
        def slow(i: int) -> int:
            release.wait(30)
            return i * 10

        a = cm.session("a")
        waiting = a.exec({"code": "return await tools.slow({i: 7})"})
        assert waiting["status"] == "waiting", waiting
        lane = cm.runner._supervisor._fleet.lanes[0]
        deadline = time.monotonic() + 10
        while (lane.reader is not None or lane.pipeline) and time.monotonic() < deadline:
            time.sleep(0.001)  # (B's exec leases the worker only once nothing reads or runs there)
        queued: list[int] = []

        def land_a() -> None:
            release.set()
            deadline = time.monotonic() + 10
            while not lane.queue and time.monotonic() < deadline:
                time.sleep(0.001)  # A's result lands; its settle queues behind the lease
            queued.append(len(lane.queue))

        _hold_the_lease(cm, monkeypatch, land_a)
        assert cm.session("b").exec({"code": "return 'b'"})["value"] == "b"
        assert queued == [1]
        result = a.wait({"runId": waiting["runId"]})
        assert result["status"] == "completed" and result["value"] == 70, result
        assert cm.runner._supervisor.killed == 0


@pytest.mark.timeout(120)
def test_threads_mixing_plain_cells_tool_calls_and_suspends_on_one_worker_all_end_right():
    with _codemode() as cm:
        errors: list[Any] = []

        def client(n: int) -> None:
            session = cm.session(f"c{n}")
            for i in range(40):
                kind = (n + i) % 4
                if kind == 0:
                    result = session.exec({"code": f"return {i}"})
                    ok = result.get("value") == i
                elif kind == 1:
                    result = session.exec({"code": TOOLS_CALLED})
                    ok = result.get("value") == 9
                elif kind == 2:
                    waiting = session.exec({"code": "await yield_control('p'); return 3"})
                    result = session.wait({"runId": waiting.get("runId", "")})
                    ok = result.get("value") == 3
                else:
                    result = session.exec({"code": "console.log(1); return 4"})
                    ok = result.get("value") == 4
                if not ok:
                    errors.append(result)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(100)
        assert errors == []
        assert cm.runner._supervisor.killed == 0
