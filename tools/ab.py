"""Side by side: two trees' hosts timed round by round, so this VM's phase lands on both alike.

    .venv/bin/python tools/ab.py BASE_DIR [NEW_DIR] [--cells trivial,b2b,ten,filter,suspend]
                                 [--rounds N] [--gap-ms MS]

``BASE_DIR`` and ``NEW_DIR`` (default: this tree's) are ``python/`` directories with a built
extension and worker binary: for another commit, ``git worktree add /tmp/base REV`` and, when the
Rust side is the same, this tree's ``python/codemode/_engine.abi3.so`` and ``codemode-worker``
copied into it (``python/codemode/``). Each tree runs in a host process of its own with one
worker; each round times one cell in each (which goes first alternates), after the same pause.
Prints each cell's medians and new / base.

Why: two benchmark runs minutes apart differ here by more than most changes (a pipe round trip
has taken 10-31 µs in one hour, the same code); alternating rounds does not. A ratio within a few
% of 1 is noise: run it twice.

Cells: ``trivial`` (``return 1 + 1``), ``b2b`` (the median of 300 trivial cells back to back, one
sample a round), ``ten`` (ten sequential awaited tool calls), ``filter`` (1,000 records built and
filtered in the cell), ``suspend`` (an ``exec`` that yields, a pause, the ``wait`` that answers
it: the two timed together).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CELLS = {
    "trivial": "return 1 + 1",
    "ten": "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t",
    "filter": (
        "const records = [];\n"
        "for (let i = 0; i < 1000; i++) records.push({id: i, score: (i * 7919) % 1000});\n"
        "return records.filter((r) => r.score > 500).length;"
    ),
    "suspend": "await yield_control('pause'); return 1",
}
KINDS = ("trivial", "b2b", "ten", "filter", "suspend")
HERE_PYTHON = Path(__file__).resolve().parent.parent / "python"


def host(gap_s: float) -> None:
    """A host process: times the cell named on each line of stdin, writes its µs."""
    from codemode import CodeMode

    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def double(x: int) -> int:
            return x * 2

        session = cm.session("ab")
        for _ in range(50):  # warm-up: every path once, the worker's engine built
            session.exec({"code": CELLS["trivial"]})
            session.exec({"code": CELLS["ten"]})
            session.wait({"runId": session.exec({"code": CELLS["suspend"]})["runId"]})
        for line in sys.stdin:
            print(f"{_timed(session, line.strip(), gap_s) * 1e6:.2f}", flush=True)


def _timed(session: object, kind: str, gap_s: float) -> float:
    exec_, wait = session.exec, session.wait  # type: ignore[attr-defined]
    if kind == "b2b":
        args, times = {"code": CELLS["trivial"]}, []
        for _ in range(300):
            started = time.perf_counter()
            exec_(args)
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    time.sleep(gap_s)
    started = time.perf_counter()
    result = exec_({"code": CELLS[kind]})
    took = time.perf_counter() - started
    if kind == "suspend":
        if result["status"] != "waiting":
            raise SystemExit(f"ab: the suspend cell did not suspend: {result}")
        time.sleep(gap_s)
        started = time.perf_counter()
        result = wait({"runId": result["runId"]})
        took += time.perf_counter() - started
    if result["status"] != "completed":
        raise SystemExit(f"ab: the {kind} cell did not complete: {result}")
    return took


def compare(dirs: dict[str, Path], kinds: list[str], rounds: int, gap_s: float) -> dict[str, dict[str, float]]:
    """The medians (µs) of each cell in each tree, from rounds that alternate between them."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, __file__, "--host", "--gap-ms", str(gap_s * 1000)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(path)},
        )
        for name, path in dirs.items()
    }
    samples: dict[tuple[str, str], list[float]] = {(name, kind): [] for name in dirs for kind in kinds}
    try:
        for kind in kinds:
            for n in range(max(6, rounds // 50) if kind == "b2b" else rounds):
                order = list(dirs) if n % 2 == 0 else list(reversed(list(dirs)))
                for name in order:
                    proc = procs[name]
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(kind + "\n")
                    proc.stdin.flush()
                    answer = proc.stdout.readline()
                    if not answer:
                        raise SystemExit(f"ab: the {name} host stopped (see its error above)")
                    samples[(name, kind)].append(float(answer))
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=30)
    return {kind: {name: statistics.median(samples[(name, kind)]) for name in dirs} for kind in kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, nargs="?", help="the base tree's python/ directory")
    parser.add_argument("new", type=Path, nargs="?", default=HERE_PYTHON, help="the new tree's (default: this one)")
    parser.add_argument("--cells", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="the pause before each timed cell")
    parser.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        host(args.gap_ms / 1000)
        return
    kinds = [kind for kind in args.cells.split(",") if kind]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if args.base is None or unknown:
        parser.error(f"unknown cells {unknown}" if unknown else "the base tree's python/ directory is required")
    medians = compare({"base": args.base, "new": args.new}, kinds, args.rounds, args.gap_ms / 1000)
    for kind, by_tree in medians.items():
        base, new = by_tree["base"], by_tree["new"]
        print(f"{kind:8s} base {base:8.1f} µs  new {new:8.1f} µs  new/base {new / base:.3f}")


if __name__ == "__main__":
    main()
