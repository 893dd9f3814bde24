"""Workers on a Ray cluster against local worker processes, side by side in one run (``make
bench-scale``): throughput of CPU-bound cells by the number of workers, and what a cell and a
tool call cost when the worker is an actor.

    python benches/scale_out.py [--write README.md]

Starts a local Ray cluster (8 logical CPUs; an actor asks for one). Every cell's value is
checked, so a fast wrong answer cannot pass. With ``--write`` the table between the
``scale:begin``/``scale:end`` markers of the README is replaced.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from codemode import CodeMode
from test_throughput import cpu_cell, cpu_value

BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
THREADS, CELLS, ROUNDS = 8, 32, 3
#: Cells per latency sample set (each timed alone).
SAMPLES = 200
TEN_CALLS = "let n = 0; for (let i = 0; i < 10; i++) n += await tools.one({}); return n"


def median_s(fn: Callable[[], Any], samples: int, idle_s: float = 0.0) -> float:
    times = []
    for _ in range(samples):
        if idle_s:
            time.sleep(idle_s)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def checked(result: dict[str, Any], value: Any) -> None:
    if result.get("status") != "completed" or result.get("value") != value:
        raise SystemExit(f"wrong result: {result!r:.300}")


def measure(placement: str, workers: int) -> dict[str, float]:
    """One row: a ``CodeMode`` with ``workers`` workers placed as ``placement``."""
    with CodeMode({"workers": workers, "timeoutMs": 60000}, placement=placement) as cm:

        @cm.tool(read_only=True)
        def one() -> int:
            """1."""
            return 1

        sessions = [cm.session(f"cpu-{i}") for i in range(THREADS)]
        for s in sessions:  # every worker up and warm before the first timed round
            checked(s.exec({"code": "return 1"}), 1)
        expected = {seed: cpu_value(seed) for seed in range(CELLS)}

        def share(t: int) -> None:
            for seed in range(t, CELLS, THREADS):
                checked(sessions[t].exec({"code": cpu_cell(seed)}), expected[seed])

        batches = []
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            for _ in range(ROUNDS):
                start = time.perf_counter()
                list(pool.map(share, range(THREADS)))
                batches.append(time.perf_counter() - start)
        session = sessions[0]
        trivial = median_s(lambda: checked(session.exec({"code": "return 1"}), 1), SAMPLES)
        calls = median_s(lambda: checked(session.exec({"code": TEN_CALLS}), 10), SAMPLES)
        idle_calls = median_s(lambda: checked(session.exec({"code": TEN_CALLS}), 10), SAMPLES // 4, idle_s=0.02)
    return {
        "cells_per_s": CELLS / statistics.median(batches),
        "trivial_us": trivial * 1e6,
        "call_us": (calls - trivial) / 10 * 1e6,
        "idle_calls_us": idle_calls * 1e6,
    }


def table(rows: list[tuple[str, int, dict[str, float]]]) -> str:
    base = {workers: r["cells_per_s"] for placement, workers, r in rows if placement == "local"}
    lines = [
        "| workers | CPU-bound cells/s | vs local, same count | trivial exec | per tool call "
        "| 10 calls after 20 ms idle |",
        "|---|---|---|---|---|---|",
    ]
    for placement, workers, r in rows:
        ratio = f"{r['cells_per_s'] / base[workers]:.2f}x" if workers in base else "—"
        lines.append(
            f"| {workers} {placement} | {r['cells_per_s']:.0f} | {ratio} | {r['trivial_us']:.0f} µs "
            f"| {r['call_us']:.0f} µs | {r['idle_calls_us'] / 1000:.2f} ms |"
        )
    cpus = os.cpu_count()
    lines.append("")
    lines.append(
        f"({time.strftime('%Y-%m-%d')}, `make bench-scale`, {cpus} vCPUs, a local Ray "
        f"{ray.__version__} cluster; {CELLS} cells of ~20 ms from {THREADS} threads, median of "
        f"{ROUNDS} batches; latencies are medians of {SAMPLES} cells back to back.)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="rewrite the scale table in this README")
    args = parser.parse_args()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for placement, workers in [("local", 1), ("local", 2), ("ray", 1), ("ray", 2), ("ray", 4)]:
            rows.append((placement, workers, measure(placement, workers)))
            print(placement, workers, rows[-1][2], file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    text = table(rows)
    print(text)
    if args.write:
        readme = args.write.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(readme):
            raise SystemExit(f"{args.write} has no {BEGIN} ... {END} section")
        args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", readme))


if __name__ == "__main__":
    main()
