"""Many runs at once: workers serve other runs while a run is parked on host tools.

Every test asserts outcomes only (values, statuses, call counts); the waits in them are hang
guards with generous bounds, never measurements.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from codemode import CodeMode, tool_starts

TWO_CALLS = "const a = await tools.slow({i: %d}); const b = await tools.slow({i: %d}); return [a, b]"


async def until(
    condition: Callable[[], bool], what: str, runs: Sequence[asyncio.Task[Any]] = (), timeout_s: float = 30.0
) -> None:
    """Polls ``condition`` on the running loop (which keeps serving the async tools); a run in
    ``runs`` that ends first fails the wait with its result."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        ended = [run.result() for run in runs if run.done()]
        if ended:
            raise AssertionError(f"{what}: a run ended first: {ended[0]}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (after {timeout_s} s)")
        await asyncio.sleep(0.01)


def only_worker_pid(cm: CodeMode) -> int:
    pids = cm.inspect().worker_pids
    assert len(pids) == 1, pids
    return pids[0]


def not_completed(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r["status"] != "completed"][:3]


@pytest.mark.timeout(60)
def test_48_concurrent_exec_async_cells_each_awaiting_two_async_tools_all_complete(make_codemode):
    cm = make_codemode({"workers": 2, "timeoutMs": 20000})

    @cm.tool
    async def slow(i: int) -> int:
        await asyncio.sleep(0.2)
        return i * 3

    async def main() -> list[dict[str, Any]]:
        s = cm.session()
        return await asyncio.gather(*(s.exec_async({"code": TWO_CALLS % (i, i + 1000)}) for i in range(48)))

    results = asyncio.run(main())
    assert not_completed(results) == []
    assert [r["value"] for r in results] == [[i * 3, (i + 1000) * 3] for i in range(48)]
    assert {r["telemetry"]["toolCalls"] for r in results} == {2}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_16_threads_each_calling_exec_on_a_300ms_tool_all_complete(make_codemode, kind):
    cm = make_codemode({"workers": 2, "timeoutMs": 20000})
    if kind == "sync":

        @cm.tool
        def slow(i: int) -> int:
            time.sleep(0.3)
            return i + 7

    else:

        @cm.tool
        async def slow(i: int) -> int:
            await asyncio.sleep(0.3)
            return i + 7

    start = threading.Barrier(16)
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        session = cm.session(f"thread-{i}")
        start.wait()
        try:
            results[i] = session.exec({"code": f"return await tools.slow({{i: {i}}})"})
        except Exception as e:  # reported by the assertion below, not lost in the thread
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert sorted(results) == list(range(16))
    assert not_completed(list(results.values())) == []
    assert [results[i]["value"] for i in range(16)] == [i + 7 for i in range(16)]


@pytest.mark.timeout(60)
def test_exec_async_from_two_event_loops_in_two_threads_runs_each_tool_on_its_callers_loop(make_codemode):
    cm = make_codemode({"workers": 2, "timeoutMs": 20000})
    seen: dict[tuple[str, int], asyncio.AbstractEventLoop] = {}
    callers: dict[str, asyncio.AbstractEventLoop] = {}
    results: dict[str, Any] = {}
    start = threading.Barrier(2)

    @cm.tool
    async def where(tag: str, i: int) -> str:
        seen[(tag, i)] = asyncio.get_running_loop()
        await asyncio.sleep(0.05)
        return f"{tag}-{i}"

    async def cells(tag: str) -> list[dict[str, Any]]:
        callers[tag] = asyncio.get_running_loop()
        s = cm.session(tag)
        code = "return [await tools.where({tag: %r, i: %d}), await tools.where({tag: %r, i: %d})]"
        return await asyncio.gather(*(s.exec_async({"code": code % (tag, i, tag, i + 100)}) for i in range(6)))

    def loop_thread(tag: str) -> None:
        start.wait()
        try:
            results[tag] = asyncio.run(cells(tag))
        except Exception as e:
            results[tag] = e

    threads = [threading.Thread(target=loop_thread, args=(tag,)) for tag in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    for tag in ("left", "right"):
        assert not_completed(results[tag]) == []
        assert [r["value"] for r in results[tag]] == [[f"{tag}-{i}", f"{tag}-{i + 100}"] for i in range(6)]
    assert callers["left"] is not callers["right"]
    assert len(seen) == 24
    assert all(loop is callers[tag] for (tag, _), loop in seen.items())


@pytest.mark.timeout(90)
def test_sigkill_of_the_worker_holding_30_parked_runs_loses_none_and_calls_each_tool_once(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 30000})
    calls: collections.Counter[int] = collections.Counter()
    gate = asyncio.Event()

    @cm.tool
    async def slow(i: int) -> int:
        calls[i] += 1
        await gate.wait()
        await asyncio.sleep(0.05)
        return i * 2

    async def main() -> list[dict[str, Any]]:
        s = cm.session()
        runs = [asyncio.create_task(s.exec_async({"code": f"return await tools.slow({{i: {i}}})"})) for i in range(30)]
        await until(lambda: len(calls) == 30, "all 30 runs parked on their tool", runs)
        os.kill(only_worker_pid(cm), signal.SIGKILL)
        gate.set()
        return await asyncio.gather(*runs)

    pid = only_worker_pid(cm)
    results = asyncio.run(main())
    assert not_completed(results) == []
    assert [r["value"] for r in results] == [i * 2 for i in range(30)]
    assert calls == {i: 1 for i in range(30)}
    assert pid not in cm.inspect().worker_pids


@pytest.mark.timeout(90)
def test_sigkill_while_30_runs_are_parked_on_each_of_two_sequential_calls_replays_without_calling_again(
    make_codemode,
):
    cm = make_codemode({"workers": 1, "timeoutMs": 30000})
    calls: collections.Counter[int] = collections.Counter()
    first, second = asyncio.Event(), asyncio.Event()

    @cm.tool
    async def slow(i: int) -> int:
        calls[i] += 1
        await (first if i < 1000 else second).wait()
        await asyncio.sleep(0.05)
        return i

    code = "const a = await tools.slow({i: %d}); const b = await tools.slow({i: %d}); return a + b"

    async def main() -> list[dict[str, Any]]:
        s = cm.session()
        runs = [asyncio.create_task(s.exec_async({"code": code % (i, i + 1000)})) for i in range(30)]
        await until(lambda: len(calls) == 30, "all 30 runs parked on their first call", runs)
        os.kill(only_worker_pid(cm), signal.SIGKILL)  # the first calls are pending
        first.set()
        await until(lambda: len(calls) == 60, "all 30 runs parked on their second call", runs)
        os.kill(only_worker_pid(cm), signal.SIGKILL)  # the first results are only in the journal now
        second.set()
        return await asyncio.gather(*runs)

    results = asyncio.run(main())
    assert not_completed(results) == []
    assert [r["value"] for r in results] == [2 * i + 1000 for i in range(30)]
    assert calls == {**{i: 1 for i in range(30)}, **{i + 1000: 1 for i in range(30)}}


@pytest.mark.timeout(60)
def test_a_run_whose_tool_never_answers_times_out_alone_while_its_worker_serves_the_others(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 500})
    never_set = asyncio.Event()
    entered: list[str] = []

    @cm.tool
    async def stuck() -> int:
        entered.append("stuck")
        await never_set.wait()
        return 0

    @cm.tool
    async def quick(i: int) -> int:
        await asyncio.sleep(0.02)
        return -i

    async def main() -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
        s = cm.session()
        held = asyncio.create_task(s.exec_async({"code": "return await tools.stuck({})"}))
        await until(lambda: entered == ["stuck"], "the stuck run parked on its tool", [held])
        others = await asyncio.gather(
            *(s.exec_async({"code": f"return (await tools.quick({{i: {i}}})) - 1"}) for i in range(12))
        )
        waiting = await held
        # Cancelled while this loop (which runs the stuck tool's task) is still running.
        return waiting, others, s.cancel(waiting["runId"]) if waiting["status"] == "waiting" else False

    held, others, cancelled = asyncio.run(main())
    assert not_completed(others) == []
    assert [r["value"] for r in others] == [-i - 1 for i in range(12)]
    assert held["status"] == "waiting", held
    assert held["reason"] == "pending_tools"
    assert [c["toolId"] for c in held["pendingToolCalls"]] == ["host:core:stuck"]
    assert cancelled


@pytest.mark.timeout(60)
def test_max_runs_per_worker_refuses_a_third_run_fast_and_frees_slots_as_runs_end(make_codemode):
    cm = make_codemode({"workers": 1, "maxRunsPerWorker": 2, "timeoutMs": 20000})
    gate = asyncio.Event()
    entered: list[int] = []

    @cm.tool
    async def held(i: int) -> int:
        entered.append(i)
        await gate.wait()
        return i

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        s = cm.session()
        parked = [asyncio.create_task(s.exec_async({"code": f"return await tools.held({{i: {i}}})"})) for i in (1, 2)]
        await until(lambda: len(entered) == 2, "two runs parked on their tools", parked)
        # Bounded only so that a third run queued behind the two (instead of refused) fails the
        # test instead of hanging it: the gate opens only after the third has answered.
        third = await asyncio.wait_for(s.exec_async({"code": "return 3"}), 20)
        gate.set()
        done = await asyncio.gather(*parked)
        return done, third, await s.exec_async({"code": "return 4"})

    done, third, after = asyncio.run(main())
    assert third["status"] == "failed", third
    assert third["code"] == "runtime_unavailable"
    assert "maxRunsPerWorker" in third["error"]
    assert [r["value"] for r in done] == [1, 2]
    assert after["status"] == "completed", after
    assert after["value"] == 4


@pytest.mark.timeout(60)
def test_max_runs_per_worker_and_max_worker_memory_bytes_default_and_clamp(make_codemode):
    default = make_codemode({"workers": 1}).config
    assert default.max_runs_per_worker == 512
    assert default.max_worker_memory_bytes == 2 << 30
    low = make_codemode({"workers": 1, "maxRunsPerWorker": 0, "maxWorkerMemoryBytes": 0}).config
    assert low.max_runs_per_worker == 1
    assert low.max_worker_memory_bytes == 64 << 20
    high = make_codemode({"workers": 1, "maxRunsPerWorker": 10**6, "maxWorkerMemoryBytes": 1 << 50}).config
    assert high.max_runs_per_worker == 4096
    assert high.max_worker_memory_bytes == 64 << 30
    kept = make_codemode({"workers": 1, "maxRunsPerWorker": 77, "maxWorkerMemoryBytes": 1 << 30}).config
    assert (kept.max_runs_per_worker, kept.max_worker_memory_bytes) == (77, 1 << 30)


# ---- what goes wrong in a caller never stalls a worker ----------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("quick_first", [False, True], ids=["unknown-tool", "known-quick-tool"])
def test_a_sync_tool_raising_keyboard_interrupt_fails_only_its_call(quick_first):
    """A sync tool raises KeyboardInterrupt: it fails its own call (a tool can only do that),
    whether it ran on the pool (a tool not yet known to be quick) or on the caller's thread
    while that thread read the worker; the next cells on that one worker run."""
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        calls = []

        @cm.tool
        def interrupt() -> int:
            calls.append(1)
            if len(calls) > 1 or not quick_first:
                raise KeyboardInterrupt
            return 0

        session = cm.session("s")
        if quick_first:
            assert session.exec({"code": "return await tools.interrupt()"})["value"] == 0
        result = session.exec({"code": "return await tools.interrupt()"})
        assert result["status"] == "failed" and "KeyboardInterrupt" in result["error"], result
        results: list[dict[str, Any]] = []
        other = threading.Thread(target=lambda: results.append(cm.session("o").exec({"code": "return 3"})))
        other.start()
        other.join(20)
        assert not other.is_alive(), "a cell on the worker never finished"
        assert results[0]["value"] == 3
        assert session.exec({"code": "return 4"})["value"] == 4


def test_a_quick_sync_tool_runs_on_its_exec_callers_thread_after_its_first_call(monkeypatch):
    """The first call of a sync tool goes to the pool (it might be slow); once it was quick, its
    calls run on the caller's own thread: no hop per call. (What counts as quick is widened: the
    pool thread's first call can take past 5 ms on a loaded machine, which CI once was.)"""
    monkeypatch.setattr(tool_starts, "QUICK_TOOL_S", 1.0)
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        threads: list[int] = []

        @cm.tool
        def where(i: int = 0) -> int:
            threads.append(threading.get_ident())
            return i

        code = "let t = 0; for (let i = 0; i < 5; i++) t += await tools.where({i}); return t"
        assert cm.session("s").exec({"code": code})["value"] == 10
        assert threads[0] != threading.get_ident()
        assert threads[1:] == [threading.get_ident()] * 4


def test_a_lone_runs_quick_tool_runs_on_its_callers_thread_with_the_worker_free_meanwhile(monkeypatch):
    """A cell alone on its worker whose quick sync tool is called: the caller's thread, which
    read the report, runs the tool at once, and it lets go of the worker first: another cell,
    from another thread, runs on that one worker while the tool is still running (the tool
    waits for it), and both end."""
    monkeypatch.setattr(tool_starts, "QUICK_TOOL_S", 1.0)
    with CodeMode({"workers": 1, "timeoutMs": 10000}) as cm:
        threads: list[int] = []
        other_done = threading.Event()
        holding = threading.Event()

        @cm.tool
        def hold(wait: bool = False) -> int:
            threads.append(threading.get_ident())
            if wait:
                holding.set()
                assert other_done.wait(8), "the other cell did not run while this tool ran"
            return 1

        session = cm.session("s")
        code = "return await tools.hold({}) + await tools.hold({})"
        assert session.exec({"code": code})["value"] == 2  # (the first call: on the pool)
        results: list[Any] = []

        def other() -> None:
            assert holding.wait(8)
            results.append(cm.session("t").exec({"code": "return 40 + 2"}))
            other_done.set()

        helper = threading.Thread(target=other)
        helper.start()
        assert session.exec({"code": "return await tools.hold({wait: true})"})["value"] == 1
        helper.join(10)
        assert results and results[0]["value"] == 42, results
        assert threads[-1] == threading.get_ident()


def test_a_slow_sync_tool_does_not_hold_exec_past_its_deadline():
    """The caller's thread does not run a sync tool that is not known to be quick: it stays
    free to end its `exec` at the deadline (`waiting`), and the result reaches the `wait`."""
    with CodeMode({"workers": 1, "timeoutMs": 300}) as cm:

        @cm.tool
        def slow(ms: int) -> int:
            time.sleep(ms / 1000)
            return ms

        session = cm.session("s")
        first = session.exec({"code": "return await tools.slow({ms: 1500})"})
        assert first["status"] == "waiting", first
        assert first["telemetry"]["durationMs"] < 1500  # it did not sit out the tool
        result = first
        while result["status"] == "waiting":
            result = session.wait({"runId": result["runId"]})
        assert result["value"] == 1500
        # Slow last time, on the pool again: the next call does not hold its caller either.
        again = session.exec({"code": "return await tools.slow({ms: 1500})"})
        assert again["status"] == "waiting" and again["telemetry"]["durationMs"] < 1500, again
        assert session.cancel(again["runId"])


@pytest.mark.timeout(60)
def test_an_async_tool_whose_loop_is_closed_fails_the_call_and_the_run_ends():
    dead = asyncio.new_event_loop()
    dead.close()
    with CodeMode({"workers": 1, "timeoutMs": 2000}) as cm:

        async def on_a_closed_loop(n: int = 0) -> int:
            return n

        cm.add_tool(on_a_closed_loop, loop=lambda: dead)
        result = cm.session("s").exec({"code": "return await tools.on_a_closed_loop({n: 1})"})
        assert result["status"] == "failed", result
        assert "Event loop is closed" in result["error"]


@pytest.mark.timeout(60)
def test_close_ends_a_wait_whose_run_waits_for_a_replay():
    """The worker of a suspended run dies; a `wait` is waiting for the run's tool before it
    replays it; `close` ends that wait (failed, runtime_unavailable) instead of leaving it to its
    deadline."""
    cm = CodeMode({"workers": 1, "timeoutMs": 20000})

    @cm.tool
    async def never() -> int:
        await asyncio.Event().wait()
        return 1

    session = cm.session("s")
    first = session.exec({"code": '// @options: {"timeout_ms": 1500}\nreturn await tools.never({})'})
    assert first["status"] == "waiting", first
    os.kill(cm.inspect().worker_pids[0], signal.SIGKILL)
    results: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: results.append(session.wait({"runId": first["runId"]})))
    waiter.start()
    time.sleep(0.3)
    cm.close()
    waiter.join(10)
    assert not waiter.is_alive(), "the wait outlived close()"
    assert (results[0]["status"], results[0]["code"]) == ("failed", "runtime_unavailable"), results


@pytest.mark.timeout(60)
def test_sync_tools_of_cells_sharing_a_worker_all_run_at_once():
    """32 cells on one worker, each on its own thread, call a sync tool that waits until all 32
    are inside it: a caller that reads the worker for the others hands them their calls before
    it runs its own (none of them waits for another's tool)."""
    threads = 32
    with CodeMode({"workers": 1, "timeoutMs": 20000}) as cm:
        barrier = threading.Barrier(threads, timeout=10)

        @cm.tool
        def meet(i: int) -> int:
            barrier.wait()
            return i

        sessions = [cm.session(f"s{i}") for i in range(threads)]
        results: list[Any] = [None] * threads

        def one(i: int) -> None:
            results[i] = sessions[i].exec({"code": f"return await tools.meet({{i: {i}}})"})

        workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(30)
        assert [r["value"] if r["status"] == "completed" else r for r in results] == list(range(threads))


@pytest.mark.timeout(60)
def test_a_run_replayed_past_its_deadline_is_suspended_not_failed_when_its_slow_tool_answers(make_codemode):
    # Found by a 300 s `make soak`: a parked run whose worker was killed is replayed at once for
    # its async waiter; the replay (re-running 0.6 s of the cell) was still running when the
    # deadline came, so the waiter slept until the replay's kill time, and nothing woke it when
    # the replay parked the run again past its deadline. The slow tool's answer then came to a
    # run "past its deadline and running", which failed it with `timeout`. A run parked past its
    # deadline is suspended (`waiting`) as any other; its next `wait` delivers the answer.
    cm = make_codemode({"workers": 1, "timeoutMs": 1000})
    parked = threading.Event()

    @cm.tool
    async def quick(i: int) -> int:
        return i

    @cm.tool
    async def slow(ms: int) -> int:
        parked.set()
        await asyncio.sleep(ms / 1000)
        return 7

    code = (
        "let t = 0; for (let i = 0; i < 3; i++) t += await tools.quick({i});"  # three batches to replay
        " const end = Date.now() + 600; while (Date.now() < end) {}"  # the replay runs this again
        " return t + await tools.slow({ms: 2500})"
    )

    async def main() -> dict[str, Any]:
        s = cm.session()
        run = asyncio.create_task(s.exec_async({"code": code}))
        await until(parked.is_set, "the run parked on its slow tool", [run])
        os.kill(only_worker_pid(cm), signal.SIGKILL)
        result = await run
        assert result["status"] == "waiting", result
        while result["status"] == "waiting":
            result = await s.wait_async({"runId": result["runId"]})
        return result

    result = asyncio.run(main())
    assert result["status"] == "completed" and result["value"] == 10, result
