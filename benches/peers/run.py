"""Peer benchmarks: the same cells in codemode and in its peers, side by side in one process.

    .venv/bin/python benches/peers/run.py [--write README.md] [--quick]
    .venv/bin/python benches/peers/run.py --interleaved [--sweep-mib N] [--quick]

Peers: ``mini-racer`` (V8, in process), ``quickjs`` (PyPI, QuickJS in process), ``pydantic-monty``
(Python cells of the same logic, in its worker subprocess) and ``node/harness.mjs`` (quickjs-wasi in
a Node worker thread, the reference design; spawned once, timed inside Node). Workloads: a trivial
cell (after a pause, and back to back), ten sequential awaited calls to a host tool, filtering 1,000
records built in the cell, a suspend/resume cycle, and a cold start. Every warm round but the
back-to-back ones follows a short untimed pause, as in ``benches/test_codemode.py``'s idle numbers;
every result is checked. The in-process peers take turns in `PASSES` passes, each with its
share of the rounds, so that a drift of this VM's speed over the minutes of a run (its wake-up
costs come and go) lands on each of them alike. Prints the table (medians and
peer/codemode ratios), writes ``results.json`` beside this file and the chart ``docs/peers.png``,
and with ``--write`` replaces the table between the peers markers of that README.

``--interleaved`` compares codemode and pydantic-monty alone, round by round (`interleaved`): no
round follows its own peer's, so each pays for the code and data it touches after other work
(with ``--sweep-mib``, after the host rewrote that much memory, as between a model's turns); it
prints its table and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HARNESS = HERE / "node" / "harness.mjs"
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"

GAP_S = 0.002  # before each warm round: the worker is idle, as between model turns
COLD_GAP_S = 0.2  # before each cold round: the previous instance's teardown finishes off the clock
WARMUP = 10
ROUNDS = {"trivial": 300, "b2b": 300, "toolcalls": 200, "filter": 200, "suspend": 200, "cold": 15}
QUICK_ROUNDS = {"trivial": 30, "b2b": 30, "toolcalls": 20, "filter": 20, "suspend": 20, "cold": 3}
#: Turns the in-process peers take (each runs its workloads with ROUNDS / PASSES rounds a turn).
PASSES = 3

#: workload -> (table label, chart label)
WORKLOADS = {
    "trivial": ("trivial cell (`return 1 + 1`)", "trivial cell"),
    "b2b": ("the trivial cell, back to back (no pause)", "back to back"),
    "toolcalls": ("10 sequential awaited host tool calls", "10 tool calls"),
    "filter": ("filter 1,000 records built in the cell", "filter 1,000 records"),
    "suspend": ("suspend, then resume (exec + wait)", "suspend + resume"),
    "cold": ("cold start: nothing to first result", "cold start"),
}

JS_CELLS = {
    "trivial": "return 1 + 1",
    "toolcalls": "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t",
    "filter": (
        "const records = [];\n"
        "for (let i = 0; i < 1000; i++) records.push({id: i, score: (i * 7919) % 1000});\n"
        "const hits = records.filter((r) => r.score > 500);\n"
        "return {count: hits.length, idSum: hits.reduce((s, r) => s + r.id, 0)};"
    ),
    "suspend": "await yield_control('pause'); return 1",
}
PY_CELLS = {  # pydantic-monty: the same logic as a Python cell (the last expression is the value)
    "trivial": "1 + 1",
    "toolcalls": "t = 0\nfor i in range(10):\n    t += double(i)\nt",
    "filter": (
        "records = [{'id': i, 'score': (i * 7919) % 1000} for i in range(1000)]\n"
        "hits = [r for r in records if r['score'] > 500]\n"
        "{'count': len(hits), 'idSum': sum(r['id'] for r in hits)}"
    ),
    "suspend": "yield_control('pause')\n1",
}
#: Workloads that run another's cell (back to back: the trivial cell with no pause between rounds).
CELL_OF = {"b2b": "trivial"}
_HITS = [i for i in range(1000) if (i * 7919) % 1000 > 500]
EXPECTED: dict[str, object] = {
    "trivial": 2,
    "b2b": 2,
    "toolcalls": sum(2 * i for i in range(10)),
    "filter": {"count": len(_HITS), "idSum": sum(_HITS)},
    "suspend": 1,
    "cold": 2,
}

# The in-process JS peers get the same guest surface as codemode's cells: `tools.<name>(input)`,
# bridged as JSON text to one host function, and the cell as an async function body.
INPROC_PRELUDE = """
globalThis.tools = new Proxy({}, {
  get: (_, name) => async (input) => JSON.parse(await __call(String(name), JSON.stringify(input))),
});
"""

TOOLS: dict[str, Callable[[dict[str, Any]], Any]] = {"double": lambda args: args["x"] * 2}

#: a measurement: seconds per round, or the reason a peer cannot do the workload
Samples = list[float] | str


def _call_tool(name: str, payload: str) -> str:
    return json.dumps(TOOLS[name](json.loads(payload)))


def _check(workload: str, value: object) -> None:
    if value != EXPECTED[workload]:
        raise AssertionError(f"{workload}: expected {EXPECTED[workload]!r}, got {value!r}")


def _gap(workload: str) -> float:
    """The untimed pause before each round of ``workload``."""
    return {"cold": COLD_GAP_S, "b2b": 0.0}.get(workload, GAP_S)


def js_cell(workload: str) -> str:
    return JS_CELLS[CELL_OF.get(workload, workload)]


def sample(workload: str, once: Callable[[], tuple[float, object]], rounds: dict[str, int]) -> list[float]:
    """``once()`` runs one round and returns (seconds it timed, value); the value is checked."""
    gap = _gap(workload)
    for _ in range(0 if workload == "cold" else WARMUP):
        _check(workload, once()[1])
    out = []
    for _ in range(rounds[workload]):
        time.sleep(gap)
        seconds, value = once()
        _check(workload, value)
        out.append(seconds)
    return out


async def sample_async(
    workload: str, once: Callable[[], Awaitable[tuple[float, object]]], rounds: dict[str, int]
) -> list[float]:
    gap = _gap(workload)
    for _ in range(0 if workload == "cold" else WARMUP):
        _check(workload, (await once())[1])
    out = []
    for _ in range(rounds[workload]):
        time.sleep(gap)  # blocks the loop on purpose: nothing is pending between rounds
        seconds, value = await once()
        _check(workload, value)
        out.append(seconds)
    return out


# ---------------------------------------------------------------------------------------------
# codemode
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def codemode_rounds() -> Iterator[dict[str, Callable[[], tuple[float, object]]]]:
    """A warm codemode (one worker, the benches' tool) and one timed round of each warm
    workload's cell on it (``b2b`` is the trivial cell's)."""
    from codemode import CodeMode

    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def double(x: int) -> int:
            return x * 2

        session = cm.session("peers")

        def exec_once(code: str) -> Callable[[], tuple[float, object]]:
            def once() -> tuple[float, object]:
                t0 = time.perf_counter()
                result = session.exec({"code": code})
                seconds = time.perf_counter() - t0
                if result["status"] != "completed":
                    raise AssertionError(result)
                return seconds, result["value"]

            return once

        def suspend() -> tuple[float, object]:
            t0 = time.perf_counter()
            waiting = session.exec({"code": JS_CELLS["suspend"]})
            first = time.perf_counter() - t0
            if waiting["status"] != "waiting":
                raise AssertionError(waiting)
            time.sleep(GAP_S)
            t0 = time.perf_counter()
            result = session.wait({"runId": waiting["runId"]})
            return first + time.perf_counter() - t0, result.get("value")

        yield {**{w: exec_once(js_cell(w)) for w in ("trivial", "b2b", "toolcalls", "filter")}, "suspend": suspend}


def bench_codemode(rounds: dict[str, int]) -> dict[str, Samples]:
    from codemode import CodeMode

    def cold() -> tuple[float, object]:
        t0 = time.perf_counter()
        cm = CodeMode({"workers": 1})
        value = cm.session().exec({"code": JS_CELLS["trivial"]})["value"]
        seconds = time.perf_counter() - t0
        cm.close()
        return seconds, value

    out: dict[str, Samples] = {"cold": sample("cold", cold, rounds)}
    with codemode_rounds() as once:
        for workload, run in once.items():
            out[workload] = sample(workload, run, rounds)
    return out


# ---------------------------------------------------------------------------------------------
# mini-racer (V8 in this process; Python callbacks are async and run on an asyncio loop)
# ---------------------------------------------------------------------------------------------


def bench_mini_racer(rounds: dict[str, int]) -> dict[str, Samples]:
    return asyncio.run(_mini_racer(rounds))


async def _mini_racer(rounds: dict[str, int]) -> dict[str, Samples]:
    from py_mini_racer import mini_racer

    async def call(name: Any, payload: Any) -> str:
        return _call_tool(str(name), str(payload))

    @contextlib.asynccontextmanager
    async def engine() -> Any:
        with mini_racer() as mr:  # a new isolate and context, driven from the running loop
            mr.set_hard_memory_limit(64 * 1024 * 1024)
            async with mr.wrap_py_function(call) as fn:
                mr.eval("this")["__call"] = fn  # type: ignore[index]
                mr.eval(INPROC_PRELUDE)
                yield mr

    async def run(mr: Any, code: str) -> object:
        return json.loads(await mr.eval(f"(async () => {{\n{code}\n}})().then(JSON.stringify)"))

    async def cold() -> tuple[float, object]:
        async with contextlib.AsyncExitStack() as stack:
            t0 = time.perf_counter()
            mr = await stack.enter_async_context(engine())
            value = await run(mr, JS_CELLS["trivial"])
            return time.perf_counter() - t0, value

    out: dict[str, Samples] = {"cold": await sample_async("cold", cold, rounds)}
    async with engine() as mr:
        for workload in ("trivial", "b2b", "toolcalls", "filter"):

            async def once(code: str = js_cell(workload)) -> tuple[float, object]:
                t0 = time.perf_counter()
                value = await run(mr, code)
                return time.perf_counter() - t0, value

            out[workload] = await sample_async(workload, once, rounds)
    out["suspend"] = "n/a: no suspended-run API (a pending run can only stay live in the caller's context)"
    return out


# ---------------------------------------------------------------------------------------------
# quickjs (PyPI: QuickJS in this process; host callables are synchronous)
# ---------------------------------------------------------------------------------------------


def bench_quickjs(rounds: dict[str, int]) -> dict[str, Samples]:
    import quickjs

    def engine() -> Any:
        ctx = quickjs.Context()
        ctx.set_memory_limit(64 * 1024 * 1024)  # no set_time_limit: it refuses calls into Python
        ctx.add_callable("__call", _call_tool)
        ctx.eval(INPROC_PRELUDE)
        return ctx

    def run(ctx: Any, code: str) -> object:
        ctx.eval(
            f"globalThis.__out = undefined; (async () => {{\n{code}\n}})()"
            ".then((v) => { __out = JSON.stringify(v); }, (e) => { __out = JSON.stringify({error: String(e)}); })"
        )
        while ctx.execute_pending_job():
            pass
        return json.loads(ctx.get("__out"))

    def cold() -> tuple[float, object]:
        t0 = time.perf_counter()
        value = run(engine(), JS_CELLS["trivial"])
        return time.perf_counter() - t0, value

    out: dict[str, Samples] = {"cold": sample("cold", cold, rounds)}
    ctx = engine()
    for workload in ("trivial", "b2b", "toolcalls", "filter"):

        def once(code: str = js_cell(workload)) -> tuple[float, object]:
            t0 = time.perf_counter()
            value = run(ctx, code)
            return time.perf_counter() - t0, value

        out[workload] = sample(workload, once, rounds)
    out["suspend"] = "n/a: no suspended-run API (a pending run can only stay live in the caller's context)"
    return out


# ---------------------------------------------------------------------------------------------
# pydantic-monty (Python cells in a `monty` worker subprocess; see benches/test_baselines.py)
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def monty_rounds() -> Iterator[dict[str, Callable[[], tuple[float, object]]]]:
    """A warm pydantic-monty session (one worker) and one timed round of each warm workload's
    cell on it (``b2b`` is the trivial cell's); its external calls are answered here."""
    import pydantic_monty as pm

    def drive(session: Any, code: str) -> object:
        """feed_start + a resume loop: every external call is answered here, by the host."""
        snap = session.feed_start(code)
        while not isinstance(snap, pm.MontyComplete):
            snap = snap.resume({"return_value": 2 * snap.args[0]})
        return snap.output

    with (
        pm.Monty(min_processes=1, max_processes=1, request_timeout=30) as pool,
        pool.checkout(limits={"max_suspensions": 2**63 - 1}) as session,
    ):

        def once(workload: str) -> Callable[[], tuple[float, object]]:
            def run() -> tuple[float, object]:
                t0 = time.perf_counter()
                if workload == "toolcalls":
                    value = drive(session, PY_CELLS[workload])
                else:
                    value = session.feed_run(PY_CELLS[workload])
                return time.perf_counter() - t0, value

            return run

        def suspend() -> tuple[float, object]:
            t0 = time.perf_counter()
            snap = session.feed_start(PY_CELLS["suspend"])
            first = time.perf_counter() - t0
            if not isinstance(snap, pm.FunctionSnapshot) or snap.function_name != "yield_control":
                raise AssertionError(snap)
            time.sleep(GAP_S)
            t0 = time.perf_counter()
            done = snap.resume({"return_value": None})
            return first + time.perf_counter() - t0, done.output

        yield {**{w: once(CELL_OF.get(w, w)) for w in ("trivial", "b2b", "toolcalls", "filter")}, "suspend": suspend}


def bench_monty(rounds: dict[str, int]) -> dict[str, Samples]:
    import pydantic_monty as pm

    def cold() -> tuple[float, object]:
        with contextlib.ExitStack() as stack:
            t0 = time.perf_counter()
            pool = stack.enter_context(pm.Monty(min_processes=1, max_processes=1, request_timeout=30))
            session = stack.enter_context(pool.checkout())
            value = session.feed_run(PY_CELLS["trivial"])
            return time.perf_counter() - t0, value

    out: dict[str, Samples] = {"cold": sample("cold", cold, rounds)}
    with monty_rounds() as once:
        for workload, run in once.items():
            out[workload] = sample(workload, run, rounds)
    return out


# ---------------------------------------------------------------------------------------------
# Node + quickjs-wasi (node/harness.mjs, timed inside Node)
# ---------------------------------------------------------------------------------------------


def bench_node(rounds: dict[str, int]) -> tuple[dict[str, Samples], dict[str, Any]]:
    node = shutil.which("node")
    if node is None or not (HERE / "node" / "node_modules" / "quickjs-wasi").is_dir():
        reason = "n/a: needs node and `npm ci` in benches/peers/node"
        return dict.fromkeys(WORKLOADS, reason), {}
    config = {
        "pauseMs": GAP_S * 1e3,
        "coldPauseMs": COLD_GAP_S * 1e3,
        "warmup": WARMUP,
        "rounds": rounds,
        "cells": JS_CELLS,
    }
    proc = subprocess.run(
        [node, str(HARNESS), json.dumps(config)], capture_output=True, text=True, check=True, timeout=600
    )
    report = json.loads(proc.stdout)
    for workload, value in report["results"].items():
        if workload in EXPECTED:
            _check(workload, value)
    return report["samples"], {"node": report["node"], "snapshot_bytes": report["results"].get("snapshotBytes")}


# ---------------------------------------------------------------------------------------------
# Interleaved: codemode and pydantic-monty round by round (`--interleaved`)
# ---------------------------------------------------------------------------------------------

#: The warm workloads the interleaved comparison runs.
INTERLEAVED = ("trivial", "toolcalls", "filter", "suspend")


def interleaved(rounds: dict[str, int], sweep_mib: int) -> dict[str, dict[str, list[float]]]:
    """codemode and pydantic-monty, the two peers that put a process boundary between the cell
    and the host, round by round: each round of a workload times one cell of each, in a random
    order, each after the same pause and, with ``sweep_mib``, after the host rewrote that many
    MiB of memory (other work between two cells, as a model's turn is: caches cold). No peer's
    round follows its own, so each pays for what it touches after other work, and a drift of
    this VM's speed lands on both within a round. Each workload's seconds by peer."""
    junk = bytearray(sweep_mib << 20)
    order = random.Random(0)
    out: dict[str, dict[str, list[float]]] = {}
    with codemode_rounds() as ours, monty_rounds() as theirs:
        peers = {"codemode": ours, "monty": theirs}
        for workload in INTERLEAVED:
            for once in peers.values():
                for _ in range(WARMUP):
                    _check(workload, once[workload]()[1])
            samples: dict[str, list[float]] = {key: [] for key in peers}
            for _ in range(rounds[workload]):
                turn = list(peers.items())
                order.shuffle(turn)
                for key, once in turn:
                    if junk:
                        junk[:-1] = junk[1:]  # (reads and writes every line of it)
                    time.sleep(GAP_S)
                    seconds, value = once[workload]()
                    _check(workload, value)
                    samples[key].append(seconds)
            out[workload] = samples
    return out


def interleaved_table(out: dict[str, dict[str, list[float]]], sweep_mib: int) -> str:
    """Medians of each peer, and the median over rounds of monty / codemode (above 1: codemode
    is faster)."""
    lines = ["| workload | codemode | pydantic-monty | monty / codemode, per round |", "|---|---|---|---|"]
    for workload, samples in out.items():
        ours, theirs = samples["codemode"], samples["monty"]
        ratio = statistics.median(m / c for c, m in zip(ours, theirs, strict=True))
        label = WORKLOADS[workload][0]
        lines.append(f"| {label} | {fmt(statistics.median(ours))} | {fmt(statistics.median(theirs))} | {ratio:.2f}x |")
    swept = f", the host rewriting {sweep_mib} MiB before each" if sweep_mib else ""
    note = f"Rounds interleaved (each after the other peer's{swept}), after a {GAP_S * 1e3:.0f} ms pause each."
    return "\n".join([*lines, "", note])


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

#: (key, column label, what it runs)
PEERS = [
    ("codemode", "codemode", "QuickJS in a worker process, fresh context per cell"),
    ("mini-racer", "mini-racer", "V8 in this process, one long-lived context"),
    ("quickjs", "quickjs (PyPI)", "QuickJS in this process, one long-lived context"),
    ("monty", "pydantic-monty", "Python cells in a monty worker process, one checked-out session"),
    ("node", "Node + quickjs-wasi", "a worker thread, new WASM VM + prelude per exec, timed in Node"),
]


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def summarize(samples: Samples) -> dict[str, Any]:
    if isinstance(samples, str):
        return {"na": samples}
    ordered = sorted(samples)
    return {
        "median_s": statistics.median(ordered),
        "p10_s": ordered[len(ordered) // 10],
        "p90_s": ordered[(len(ordered) * 9) // 10],
        "rounds": len(ordered),
    }


def table(results: dict[str, Any]) -> str:
    stats = results["workloads"]
    head = "| workload | " + " | ".join(label for _, label, _ in PEERS) + " |"
    lines = [head, "|---" * (len(PEERS) + 1) + "|"]
    for workload, (label, _) in WORKLOADS.items():
        base = stats[workload]["codemode"].get("median_s")
        cells = []
        for key, _, _ in PEERS:
            entry = stats[workload][key]
            if "na" in entry:
                cells.append("n/a")
            elif key == "codemode" or not base:
                cells.append(fmt(entry["median_s"]))
            else:
                cells.append(f"{fmt(entry['median_s'])} ({entry['median_s'] / base:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    reasons = sorted({entry["na"] for w in stats.values() for entry in w.values() if "na" in entry})
    notes = [
        "Medians; `(Nx)` is peer / codemode (above 1: codemode is faster).",
        *(f"{reason.removeprefix('n/a: ')[:1].upper()}{reason.removeprefix('n/a: ')[1:]}." for reason in reasons),
    ]
    return "\n".join([*lines, "", " ".join(notes)])


def machine() -> str:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return cpu


def versions(node: dict[str, Any]) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("codemode", "mini-racer", "quickjs", "pydantic-monty", "matplotlib"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    if node.get("node"):
        out["node"] = node["node"]
        lock = json.loads((HERE / "node" / "package-lock.json").read_text())
        out["quickjs-wasi"] = lock["packages"]["node_modules/quickjs-wasi"]["version"]
    return out


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = results["workloads"]
    workloads = list(WORKLOADS)
    width = 0.8 / len(PEERS)
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    for i, (key, label, _) in enumerate(PEERS):
        xs, ys, spread, missing = [], [], ([], []), []
        for j, workload in enumerate(workloads):
            x = j + (i - (len(PEERS) - 1) / 2) * width
            entry = stats[workload][key]
            if "median_s" in entry:
                xs.append(x)
                ys.append(entry["median_s"] * 1e3)
                spread[0].append((entry["median_s"] - entry["p10_s"]) * 1e3)
                spread[1].append((entry["p90_s"] - entry["median_s"]) * 1e3)
            else:
                missing.append(x)
        bars = ax.bar(xs, ys, width, yerr=spread, error_kw={"elinewidth": 0.8, "alpha": 0.6}, label=label)
        ax.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=7, padding=2)
        for x in missing:
            ax.annotate(
                "n/a",
                (x, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                rotation=90,
            )
    ax.set_yscale("log")
    ax.set_ylabel("median latency, ms (log scale; whiskers: p10-p90)")
    ax.set_xticks(range(len(workloads)), [WORKLOADS[w][1] for w in workloads])
    ax.set_title(f"codemode and its peers, `make bench-peers`, {results['date']} ({results['machine_note']})")
    ax.legend(fontsize=8, ncols=len(PEERS), loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_ylim(top=ax.get_ylim()[1] * 4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def readme_block(results: dict[str, Any]) -> str:
    v = results["versions"]
    peers = ", ".join(
        f"{name} {v[name]}" for name in ("mini-racer", "quickjs", "pydantic-monty", "quickjs-wasi") if name in v
    )
    head = (
        f"`make bench-peers`, {results['date']}, {results['machine_note']}, {results['cpu']}, "
        f"Python {v['python']}, Node {v.get('node', '?')}; {peers}:"
    )
    return "\n".join([head, "", table(results), "", "![peer latency](docs/peers.png)"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="replace the table between the peers markers in this README")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "peers.png")
    parser.add_argument("--json", type=Path, default=HERE / "results.json")
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke run, not figures to publish")
    parser.add_argument(
        "--interleaved", action="store_true", help="codemode and pydantic-monty round by round; prints, writes nothing"
    )
    parser.add_argument("--sweep-mib", type=int, default=0, help="with --interleaved: MiB rewritten before each round")
    args = parser.parse_args()
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    if args.interleaved:
        print(interleaved_table(interleaved(rounds, args.sweep_mib), args.sweep_mib))
        return

    load_before = os.getloadavg()
    if load_before[0] > 0.5:
        print(
            f">> load average {load_before[0]:.2f}: other work on this machine will skew the figures", file=sys.stderr
        )
    passes = 1 if args.quick else PASSES
    share = {workload: -(-n // passes) for workload, n in rounds.items()}
    raw: dict[str, dict[str, Samples]] = {}
    for turn in range(passes):
        for key, runner in (
            ("codemode", bench_codemode),
            ("mini-racer", bench_mini_racer),
            ("quickjs", bench_quickjs),
            ("monty", bench_monty),
        ):
            print(f">> {key} (pass {turn + 1} of {passes})", file=sys.stderr, flush=True)
            pooled = raw.setdefault(key, {})
            for workload, samples in runner(share).items():
                kept = pooled.get(workload, [])
                pooled[workload] = samples if isinstance(samples, str) or isinstance(kept, str) else kept + samples
    print(">> node", file=sys.stderr, flush=True)
    raw["node"], node_info = bench_node(rounds)

    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine_note": "2-vCPU VM",
        "cpu": machine(),
        "versions": versions(node_info),
        "rounds": rounds,
        "passes": passes,
        "pause_before_warm_round_s": GAP_S,
        "pause_before_cold_round_s": COLD_GAP_S,
        "node_snapshot_bytes": node_info.get("snapshot_bytes"),
        "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "peers": {key: what for key, _, what in PEERS},
        "workloads": {w: {key: summarize(raw[key][w]) for key, _, _ in PEERS} for w in WORKLOADS},
    }
    text = readme_block(results)
    print(text)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    chart(results, args.chart)
    if args.write:
        readme = args.write.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(readme):
            raise SystemExit(f"{args.write}: no {BEGIN} ... {END} markers")
        args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", readme))


if __name__ == "__main__":
    main()
