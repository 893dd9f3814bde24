"""Throughput with many runs at once (DESIGN.md §12: "throughput bound by CPU work, never by tool
latency"): a worker serves other runs while a run is parked on host tools, so a batch of cells
awaiting slow tools takes about one tool time, however many cells there are.

Each round is one whole batch (``benchmark.pedantic(..., rounds=3, iterations=1)``); the ideal
for a batch parked on tools is the tool time itself, printed beside each test below. Every
round also checks every value, so a fast wrong answer cannot pass.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode

GROUP = "throughput"
ROUNDS = 3

#: Two 200 ms tools awaited together: ideal ~0.2 s per batch.
PARALLEL_PAIR = "const [a, b] = await Promise.all([tools.slow({i: %d}), tools.slow({i: %d})]); return a + b"
#: The same two awaited one after the other (the issue's shape): ideal ~0.4 s per batch.
SEQUENTIAL_PAIR = "const a = await tools.slow({i: %d}); const b = await tools.slow({i: %d}); return a + b"
#: ~20 ms of QuickJS arithmetic on this kind of machine (no tool calls: pure worker CPU).
CPU_ITERATIONS = 250_000


def cpu_cell(seed: int) -> str:
    return f"let x = {seed}; for (let i = 0; i < {CPU_ITERATIONS}; i++) {{ x = (x * 31 + i) % 1000003; }} return x"


def cpu_value(seed: int) -> int:
    x = seed
    for i in range(CPU_ITERATIONS):
        x = (x * 31 + i) % 1000003
    return x


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process, in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 50.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (after {timeout_s} s)")
        await asyncio.sleep(0.005)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for all rounds of a benchmark (the async tools run on it)."""
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def completed_values(results: list[dict[str, Any]]) -> list[Any]:
    bad = [r for r in results if r["status"] != "completed"]
    assert bad == [], bad[:3]
    return [r["value"] for r in results]


@pytest.mark.timeout(120)
@pytest.mark.benchmark(group=GROUP)
def test_256_exec_async_cells_each_awaiting_two_200ms_tools(benchmark, loop):
    """256 cells on 2 workers, each awaiting two 200 ms async tools at once (ideal ~0.2 s)."""
    _256_cells(benchmark, loop, PARALLEL_PAIR)


@pytest.mark.timeout(120)
@pytest.mark.benchmark(group=GROUP)
def test_256_exec_async_cells_each_awaiting_two_sequential_200ms_tools(benchmark, loop):
    """The same, each cell awaiting its two tools one after the other (ideal ~0.4 s)."""
    _256_cells(benchmark, loop, SEQUENTIAL_PAIR)


def _256_cells(benchmark: Any, loop: asyncio.AbstractEventLoop, cell: str) -> None:
    with CodeMode({"workers": 2, "timeoutMs": 60000}) as cm:

        @cm.tool
        async def slow(i: int) -> int:
            await asyncio.sleep(0.2)
            return i

        session = cm.session("throughput")
        assert loop.run_until_complete(session.exec_async({"code": cell % (1, 2)}))["value"] == 3

        async def batch() -> list[dict[str, Any]]:
            return await asyncio.gather(*(session.exec_async({"code": cell % (i, i + 1)}) for i in range(256)))

        results = benchmark.pedantic(lambda: loop.run_until_complete(batch()), rounds=ROUNDS, iterations=1)
        assert completed_values(results) == [2 * i + 1 for i in range(256)]


@pytest.mark.timeout(120)
@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_64_threads_calling_exec_on_a_300ms_tool(benchmark, kind):
    """64 threads, one session each, on 2 workers; the tool sleeps 300 ms (ideal ~0.3 s). A sync
    tool runs on the calling thread; an async one on the private loop `exec` uses."""
    threads = 64
    with CodeMode({"workers": 2, "timeoutMs": 60000}) as cm:
        if kind == "sync":

            @cm.tool
            def slow(i: int) -> int:
                time.sleep(0.3)
                return i * 5

        else:

            @cm.tool
            async def slow(i: int) -> int:
                await asyncio.sleep(0.3)
                return i * 5

        sessions = [cm.session(f"thread-{i}") for i in range(threads)]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            started = threading.Barrier(threads)

            def warm(i: int) -> Any:
                started.wait()  # every pool thread exists before the first timed round
                return sessions[i].exec({"code": "return 1"})["value"]

            assert list(pool.map(warm, range(threads))) == [1] * threads

            def one(i: int) -> dict[str, Any]:
                return sessions[i].exec({"code": f"return await tools.slow({{i: {i}}})"})

            results = benchmark.pedantic(lambda: list(pool.map(one, range(threads))), rounds=ROUNDS, iterations=1)
        assert completed_values(results) == [i * 5 for i in range(threads)]


@pytest.mark.timeout(120)
@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("workers", [1, 2], ids=["workers-1", "workers-2"])
def test_cpu_bound_cells_from_8_threads_by_worker_count(benchmark, workers):
    """The same 32 CPU-bound cells (~20 ms each, no tools) from 8 threads: compare the two ids;
    with 2 workers on 2 free CPUs the batch should take about half as long as with one."""
    threads, cells = 8, 32
    expected = [cpu_value(seed) for seed in range(cells)]
    with CodeMode({"workers": workers, "timeoutMs": 60000}) as cm:
        sessions = [cm.session(f"cpu-{i}") for i in range(threads)]
        for s in sessions:
            assert s.exec({"code": "return 1"})["value"] == 1

        def thread_share(t: int) -> list[tuple[int, dict[str, Any]]]:
            return [(seed, sessions[t].exec({"code": cpu_cell(seed)})) for seed in range(t, cells, threads)]

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:

            def batch() -> list[dict[str, Any]]:
                done = sorted(
                    (pair for share in pool.map(thread_share, range(threads)) for pair in share), key=lambda p: p[0]
                )
                return [result for _, result in done]

            results = benchmark.pedantic(batch, rounds=ROUNDS, iterations=1)
        assert completed_values(results) == expected


@pytest.mark.timeout(180)
@pytest.mark.benchmark(group=GROUP)
def test_1000_parked_runs_host_and_worker_rss(benchmark, loop):
    """1,000 cells parked at once on a tool that blocks until the test opens its gate: the host's
    and the workers' RSS while all 1,000 are parked go to ``extra_info`` (and are printed); the
    time is the whole batch (start 1,000, all parked, open, all complete)."""
    parked = 1000
    with CodeMode({"workers": 2, "maxRunsPerWorker": parked, "timeoutMs": 60000}) as cm:
        state: dict[str, Any] = {"entered": 0, "gate": asyncio.Event()}

        @cm.tool
        async def held(i: int) -> int:
            state["entered"] += 1
            await state["gate"].wait()
            return i + 1

        session = cm.session("parked")
        for _ in range(4):
            assert loop.run_until_complete(session.exec_async({"code": "return 1"}))["value"] == 1
        idle_host = rss_kib()
        idle_workers = sum(rss_kib(pid) for pid in cm.inspect().worker_pids)
        samples: list[dict[str, Any]] = []

        async def batch() -> list[dict[str, Any]]:
            state["entered"], state["gate"] = 0, asyncio.Event()
            runs = [
                asyncio.create_task(session.exec_async({"code": f"return await tools.held({{i: {i}}})"}))
                for i in range(parked)
            ]
            await until(lambda: state["entered"] == parked, f"all {parked} runs parked on their tool")
            workers = {pid: rss_kib(pid) for pid in cm.inspect().worker_pids}
            samples.append({"host_rss_kib": rss_kib(), "worker_rss_kib": workers})
            state["gate"].set()
            return await asyncio.gather(*runs)

        results = benchmark.pedantic(lambda: loop.run_until_complete(batch()), rounds=ROUNDS, iterations=1)
        assert completed_values(results) == [i + 1 for i in range(parked)]

    peak = max(samples, key=lambda s: s["host_rss_kib"])
    workers_total = sum(peak["worker_rss_kib"].values())
    info = {
        "parked_runs": parked,
        "host_rss_kib_idle": idle_host,
        "host_rss_kib_parked": peak["host_rss_kib"],
        "host_kib_per_parked_run": round((peak["host_rss_kib"] - idle_host) / parked, 2),
        "workers_rss_kib_idle": idle_workers,
        "workers_rss_kib_parked": workers_total,
        "worker_kib_per_parked_run": round((workers_total - idle_workers) / parked, 2),
        "worker_rss_kib_parked_by_pid": {str(pid): kib for pid, kib in peak["worker_rss_kib"].items()},
    }
    benchmark.extra_info.update(info)
    print(f"\n{parked} parked runs: " + ", ".join(f"{k} {v}" for k, v in info.items()))
