"""Turns one pytest-benchmark JSON run into the README's performance table (with ratios).

    python benches/report.py .benchmarks/latest.json [--write README.md]

Ratios compare numbers from the same run only: machines here are noisy, ratios less so.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from pathlib import Path

BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"

#: (label, test name, budget from DESIGN.md §12 or the issue, or "")
ROWS = [
    ("warm `exec` of `return 1+1`, idle worker (median)", "test_exec_trivial_idle", "<= 60 µs"),
    ("warm `exec`, back to back (median)", "test_exec_trivial_back_to_back", ""),
    ("one bare pipe round trip, idle (median)", "test_pipe_roundtrip_idle", "9-24 µs"),
    (
        "`return 1+1` as its recorded frame, to a bare worker: no host code (median, idle)",
        "test_worker_alone_trivial_idle",
        "",
    ),
    (
        "`return 1+1` through a thin host: a cell's own steps, no run bookkeeping (median, idle)",
        "test_thin_host_trivial_idle",
        "",
    ),
    ("warm `exec` of `return 1+1` after a 30 ms pause, caches cold (median)", "test_exec_trivial_after_30ms", ""),
    ("the same through a thin host, after a 30 ms pause (median)", "test_thin_host_trivial_after_30ms", ""),
    ("pydantic-monty: warm `1 + 1` after a 30 ms pause (median)", "test_monty_trivial_after_30ms", ""),
    ("cell with 10 sequential awaited tool calls (median)", "test_exec_ten_sequential_tool_calls_idle", ""),
    (
        "the same 10 calls as their recorded frames, to a bare worker: no host code (median, idle)",
        "test_worker_alone_ten_tool_calls_idle",
        "",
    ),
    (
        "`wait` on a resident suspended run whose tool has answered (median)",
        "test_wait_on_resident_run_whose_tool_finished",
        "<= 100 µs",
    ),
    ("`wait` answering a `yield_control()`, resident run (median)", "test_wait_on_resident_run", ""),
    ("`wait` replaying a journal of 10 tool calls (median)", "test_wait_replaying_ten_journaled_calls", "<= 1 ms"),
    ("first exec on a new `CodeMode`, worker spawn included (median)", "test_first_exec_on_new_codemode", "<= 60 ms"),
    (
        "first exec of a new `CodeMode` with a tool, after the model's first turn (median)",
        "test_first_exec_after_the_first_model_turn",
        "",
    ),
    ("warm `exec`, 10-tool catalog (median)", "test_exec_trivial_idle_by_catalog_size[10-tools]", ""),
    (
        "warm `exec`, 10,000-tool catalog (median)",
        "test_exec_trivial_idle_by_catalog_size[10k-tools]",
        "within 0.1 ms of 10",
    ),
    ("10 `MCP.everything.getSum()` calls in one cell (median)", "test_mcp_ten_calls_through_a_cell", ""),
    ("the same 10 calls with the SDK client directly (median)", "test_mcp_ten_calls_direct_with_the_sdk_client", ""),
    ("pydantic-monty: warm `1 + 1`, back to back (median)", "test_monty_trivial_warm_session", ""),
    ("pydantic-monty: warm `1 + 1`, idle (median)", "test_monty_trivial_idle", ""),
    ("pydantic-monty: 10 external calls, start/resume (median)", "test_monty_toolcalls_start_resume", ""),
    (
        "256 concurrent `exec_async` cells, each awaiting two 200 ms tools at once, 2 workers (median batch)",
        "test_256_exec_async_cells_each_awaiting_two_200ms_tools",
        "<= 0.6 s",
    ),
    (
        "the same 256 cells awaiting their two 200 ms tools one after the other (median batch)",
        "test_256_exec_async_cells_each_awaiting_two_sequential_200ms_tools",
        "<= 0.6 s",
    ),
    (
        "64 threads calling `exec` on a 300 ms sync tool, 2 workers (median batch)",
        "test_64_threads_calling_exec_on_a_300ms_tool[sync]",
        "<= 0.6 s",
    ),
    (
        "64 threads calling `exec` on a 300 ms async tool, 2 workers (median batch)",
        "test_64_threads_calling_exec_on_a_300ms_tool[async]",
        "<= 0.6 s",
    ),
    (
        "32 CPU-bound cells (~20 ms each) from 8 threads, 1 worker (median batch)",
        "test_cpu_bound_cells_from_8_threads_by_worker_count[workers-1]",
        "",
    ),
    ("the same on 2 workers (median batch)", "test_cpu_bound_cells_from_8_threads_by_worker_count[workers-2]", ""),
    (
        "1,000 runs parked at once on a tool, then released: the whole batch (median)",
        "test_1000_parked_runs_host_and_worker_rss",
        "",
    ),
]


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def table(data: dict) -> str:
    by_name = {b["name"]: b for b in data["benchmarks"]}
    median = {name: b["stats"]["median"] for name, b in by_name.items()}
    lines = ["| measurement | result | budget |", "|---|---|---|"]
    for label, name, budget in ROWS:
        if name in median:
            lines.append(f"| {label} | {fmt(median[name])} | {budget} |")
    derived = [*_latency_ratios(median), *_after_pause_ratios(median), *_recorded_figures(by_name, median)]
    machine = data.get("machine_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw", platform.processor() or "?")
    head = f"`make bench`, {data.get('datetime', '')[:10]}, {cpu}, Python {machine.get('python_version', '?')}:"
    return "\n".join([head, "", *lines, "", "; ".join(derived) + "."])


def _after_pause_ratios(median: dict[str, float]) -> list[str]:
    """The exec after a 30 ms pause (caches cold) against monty's, and the run bookkeeping's
    part of it (against the thin host's)."""
    cold = median.get("test_exec_trivial_after_30ms")
    derived = []
    if cold and "test_monty_trivial_after_30ms" in median:
        derived.append(f"after a 30 ms pause, exec / monty: **{cold / median['test_monty_trivial_after_30ms']:.2f}x**")
    if cold and "test_thin_host_trivial_after_30ms" in median:
        bookkeeping = fmt(cold - median["test_thin_host_trivial_after_30ms"])
        derived.append(f"of which the run bookkeeping's (exec - thin host): **{bookkeeping}**")
    return derived


def _latency_ratios(median: dict[str, float]) -> list[str]:
    """The derived figures of medians: against a pipe round trip and monty, per tool call,
    per catalog size, per search."""
    exec_idle = median.get("test_exec_trivial_idle")
    derived = []
    if exec_idle and "test_pipe_roundtrip_idle" in median:
        derived.append(f"warm exec / pipe round trip: **{exec_idle / median['test_pipe_roundtrip_idle']:.1f}x**")
    if exec_idle and "test_monty_trivial_idle" in median:
        derived.append(f"idle warm exec / monty idle warm: **{exec_idle / median['test_monty_trivial_idle']:.2f}x**")
    b2b = median.get("test_exec_trivial_back_to_back")
    if b2b and "test_monty_trivial_warm_session" in median:
        derived.append(
            f"back-to-back exec / monty back to back: **{b2b / median['test_monty_trivial_warm_session']:.2f}x**"
        )
    alone = median.get("test_worker_alone_trivial_idle")
    if alone and "test_pipe_roundtrip_idle" in median:
        derived.append(f"bare worker / pipe round trip: **{alone / median['test_pipe_roundtrip_idle']:.1f}x**")
    if alone and exec_idle:
        derived.append(f"the host's part of an idle exec: **{fmt(exec_idle - alone)}**")
    thin = median.get("test_thin_host_trivial_idle")
    if thin and exec_idle:
        derived.append(f"of which the run bookkeeping's (idle exec - thin host): **{fmt(exec_idle - thin)}**")
    if thin and "test_monty_trivial_idle" in median:
        derived.append(f"thin host / monty idle warm: **{thin / median['test_monty_trivial_idle']:.2f}x**")
    ten = median.get("test_exec_ten_sequential_tool_calls_idle")
    if ten and exec_idle:
        per_call = (ten - exec_idle) / 10
        derived.append(f"per sequential tool call: **{fmt(per_call)}** (budget: within 2x the pipe round trip)")
        ten_alone = median.get("test_worker_alone_ten_tool_calls_idle")
        if alone and ten_alone:
            derived.append(f"of which the host's: **{fmt((ten - ten_alone - (exec_idle - alone)) / 10)}**")
        if "test_monty_toolcalls_start_resume" in median:
            derived.append(
                f"10 tool calls / monty's 10 calls: **{ten / median['test_monty_toolcalls_start_resume']:.2f}x**"
            )
    small = median.get("test_exec_trivial_idle_by_catalog_size[10-tools]")
    large = median.get("test_exec_trivial_idle_by_catalog_size[10k-tools]")
    if small and large:
        derived.append(f"10,000-tool catalog costs an exec **{fmt(large - small)}** more than a 10-tool one")
    searches = median.get("test_exec_with_200_searches_by_catalog_size[10k-tools]")
    if searches and large:
        derived.append(
            f"one `tools.search` over 10,000 tools in the guest: **{fmt((searches - large) / 200)}** (budget <= 1 ms)"
        )
    return derived


def _recorded_figures(by_name: dict, median: dict[str, float]) -> list[str]:
    """The derived figures of what benchmarks recorded besides their times (paired overheads,
    payload sizes, memory), and of the worker-count scaling."""
    derived = []
    ratios = by_name.get("test_exec_paired_with_a_pipe_round_trip", {}).get("extra_info", {})
    if "paired_exec_over_pipe" in ratios:
        exec_ratio, call_ratio = ratios["paired_exec_over_pipe"], ratios["paired_call_over_pipe"]
        derived.append(
            "paired rounds (a pipe round trip, a trivial exec and the ten-call cell, each after the same "
            f"pause, medians of each round's ratios): warm exec / pipe round trip **{exec_ratio:.1f}x** "
            f"(budget <= 3x), per sequential tool call / pipe round trip **{call_ratio:.1f}x** (budget <= 2x)"
        )
    paired = by_name.get("test_mcp_ten_calls_through_a_cell", {}).get("extra_info", {})
    if "paired_overhead_per_call_s" in paired:
        derived.append(
            "overhead of one `MCP.<server>.<tool>()` call over the SDK client (median of rounds pairing the cell "
            f"with the direct calls and a trivial exec): **{fmt(paired['paired_overhead_per_call_s'])}** "
            "(budget <= 0.1 ms)"
        )
    payload = by_name.get("test_model_payload_bytes_per_surface_for_500_tools", {}).get("extra_info", {})
    if payload:
        sizes = ", ".join(f"{k.removeprefix('payload_bytes_')} {v:,} B" for k, v in payload.items())
        ratio = payload["payload_bytes_code"] / payload["payload_bytes_direct"]
        derived.append(f"model payload for 500 tools: {sizes}; code is **{ratio:.1%}** of direct (budget <= 10%)")
    extra = by_name.get("test_wait_on_resident_run_whose_tool_finished", {}).get("extra_info", {})
    if "suspended_run_memory_bytes" in extra:
        derived.append(
            f"QuickJS memory of an idle suspended run: **{extra['suspended_run_memory_bytes'] / 1024:.0f} KiB**"
        )
    one, two = (median.get(f"test_cpu_bound_cells_from_8_threads_by_worker_count[workers-{n}]") for n in (1, 2))
    if one and two:
        derived.append(f"CPU-bound cells, 2 workers against 1: **{one / two:.2f}x** as fast")
    parked = by_name.get("test_1000_parked_runs_host_and_worker_rss", {}).get("extra_info", {})
    if "host_kib_per_parked_run" in parked:
        derived.append(
            f"1,000 parked runs: host RSS {parked['host_rss_kib_idle'] // 1024} -> "
            f"{parked['host_rss_kib_parked'] // 1024} MiB (**{parked['host_kib_per_parked_run']:.1f} KiB** a run), "
            f"workers {parked['workers_rss_kib_idle'] // 1024} -> {parked['workers_rss_kib_parked'] // 1024} MiB "
            f"(**{parked['worker_kib_per_parked_run']:.0f} KiB** a run)"
        )
    return derived


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("json", type=Path)
    parser.add_argument("--write", type=Path, help="replace the table between the perf markers in this file")
    args = parser.parse_args()
    text = table(json.loads(args.json.read_text()))
    print(text)
    if args.write:
        readme = args.write.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", readme))


if __name__ == "__main__":
    main()
