"""Load and fault test (``make soak``): many sessions at once on a small worker pool, mixing
normal cells, hostile cells, slow tools and ``wait``s, while workers are SIGKILLed at random.

Every run must end in a defined state: ``completed`` with the right value, or ``failed`` with a
spec code (a hostile cell with exactly its corpus outcome; any cell whose worker was killed under
it with ``internal_error``). A suspended run must finish through ``wait`` with the value it would
have had without the kills (its journal is replayed when the resident runtime was killed). Anything
else — an exception in the host, a wrong value, a run ``wait`` cannot finish, a leaked worker —
counts as lost, and the command fails if any run is lost.



"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from codemode import CodeMode  # noqa: E402

from tests.hostile.corpus import BASE_CONFIG, CORPUS, Cell  # noqa: E402
from tests.hostile.test_corpus import install_tools  # noqa: E402

#: A cell that suspends on a slow tool, then goes on after `wait`: (value, ms) -> 2 * value + 1.
SUSPENDING = """// @options: {"timeout_ms": 100}
const a = await tools.slow({value: %d, ms: %d});
const b = await tools.double({x: a});
return b + 1"""
YIELDING = (
    "let t = 0; for (let i = 0; i < 5; i++) t += await tools.double({x: i}); await yield_control('soak'); return t"
)
NORMAL = {
    "trivial": ("return 1 + 1", 2),
    "ten_calls": ("let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t", 90),
    "filter_1000": (
        "const rs = Array.from({length: 1000}, (_, i) => ({id: i, score: (i * 7919) % 1000}));"
        " const hi = rs.filter(r => r.score > 500); return [hi.length, hi.reduce((s, r) => s + r.id, 0)]",
        None,
    ),
}
#: Rounds of load (RSS is read while idle between them).
ROUNDS = 4
#: Failure codes a run may end with when the soak's own SIGKILL hit its worker.
KILLED_CODES = ("internal_error", "runtime_unavailable")


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child_pids() -> set[int]:
    me = str(os.getpid())
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    pids.add(int(entry.name))
            except (OSError, IndexError):
                continue
    return pids


def quiet_rss_kib() -> int:
    """RSS with the garbage collected and freed heap returned to the OS (glibc keeps it otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return rss_kib()


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies_ms: list[float] = field(default_factory=list)
    calls: int = 0
    lost: list[str] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)

    def killed_during(self, t0: float, t1: float) -> bool:
        with self.lock:
            return any(t0 <= k <= t1 for k in self.kills)


class Soak:
    def __init__(self, cm: CodeMode, tally: Tally, seed: int, hostile: list[Cell]) -> None:
        self.cm = cm
        self.tally = tally
        self.rng = random.Random(seed)
        self.hostile = hostile

    def call(self, fn: Any, args: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        result = fn(args)
        ms = (time.perf_counter() - t0) * 1000.0
        with self.tally.lock:
            self.tally.latencies_ms.append(ms)
            self.tally.calls += 1
        return result

    def lose(self, kind: str, why: str) -> None:
        with self.tally.lock:
            self.tally.lost.append(f"{kind}: {why}"[:400])

    def finish(self, kind: str, result: dict[str, Any], started: float, expect: Any, session: Any) -> None:
        """Follows a run to its end (waiting -> wait ...) and checks the outcome."""
        waits = 0
        while result["status"] == "waiting":
            waits += 1
            if waits > 200:
                session.cancel(result["runId"])
                return self.lose(kind, f"still waiting after 200 waits: {result}")
            result = self.call(session.wait, {"runId": result["runId"]})
        status, code = result["status"], result.get("code")
        outcome = f"{status}/{code}" if code else status
        with self.tally.lock:
            self.tally.runs[kind] += 1
            self.tally.outcomes[outcome] += 1
        if status == "completed" and (expect is None or result["value"] == expect):
            return None
        if status == "failed" and code in KILLED_CODES and self.tally.killed_during(started, time.monotonic()):
            return None
        return self.lose(kind, f"expected {expect!r}, got {result}")

    def one(self, index: int) -> None:
        session = self.cm.session(f"soak-{index}-{self.rng.randrange(1 << 30)}")
        roll = self.rng.random()
        started = time.monotonic()
        try:
            if roll < 0.45:
                name = self.rng.choice(list(NORMAL))
                code, expect = NORMAL[name]
                if expect is None:
                    expect = [sum(1 for i in range(1000) if (i * 7919) % 1000 > 500)]
                    expect.append(sum(i for i in range(1000) if (i * 7919) % 1000 > 500))
                self.finish(name, self.call(session.exec, {"code": code}), started, expect, session)
            elif roll < 0.65:
                value, ms = self.rng.randrange(1000), self.rng.choice((20, 150, 400))
                result = self.call(session.exec, {"code": SUSPENDING % (value, ms)})
                self.finish("suspend_slow_tool", result, started, 2 * value + 1, session)
            elif roll < 0.75:
                result = self.call(session.exec, {"code": YIELDING})
                self.finish("yield_then_wait", result, started, 20, session)
            else:
                self.hostile_cell(session, self.rng.choice(self.hostile), started)
        except Exception as e:  # any exception out of the host API is a lost run
            self.lose("exception", f"{type(e).__name__}: {e}")
        finally:
            session.close()

    def hostile_cell(self, session: Any, cell: Cell, started: float) -> None:
        result = self.call(session.exec, {"code": cell.code})
        kind = "hostile"
        status, code = result["status"], result.get("code")
        with self.tally.lock:
            self.tally.runs[kind] += 1
            self.tally.outcomes[f"{status}/{code}" if code else status] += 1
        if status == "waiting":
            session.cancel(result["runId"])
        if status == cell.expect_status and code == cell.expect_code:
            return
        if status == "failed" and code in KILLED_CODES and self.tally.killed_during(started, time.monotonic()):
            return
        self.lose(f"hostile {cell.name}", f"expected {cell.expect_status}/{cell.expect_code}, got {result}")


def killer(cm: CodeMode, tally: Tally, stop: threading.Event, rng: random.Random, every_s: float) -> None:
    while not stop.wait(rng.uniform(0.3 * every_s, 1.7 * every_s)):
        pids = cm._supervisor.worker_pids()
        if not pids:
            continue
        pid = rng.choice(pids)
        with tally.lock:
            tally.kills.append(time.monotonic())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with tally.lock:
        tally.kills.append(time.monotonic())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 60)))
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions (threads)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=1.0, help="mean seconds between SIGKILLs")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", 1)))
    args = parser.parse_args()

    hostile = [c for c in CORPUS if c.config is None and not c.isolated and c.expect_status != "waiting"]
    children_before = child_pids()
    config = {**BASE_CONFIG, "workers": args.workers}
    tally = Tally()
    stop = threading.Event()
    with CodeMode(config) as cm:
        install_tools(cm)

        @cm.tool
        def double(x: int) -> int:
            return 2 * x

        @cm.tool
        async def slow(value: int, ms: int) -> int:
            await asyncio.sleep(ms / 1000.0)
            return value

        kill_thread = threading.Thread(
            target=killer, args=(cm, tally, stop, random.Random(args.seed), args.kill_every), daemon=True
        )
        started = time.monotonic()
        kill_thread.start()
        # Rounds of load; between rounds the sessions are idle, and the host's RSS is read after a
        # collection and a malloc_trim, so a leak shows as a rise from round to round.
        quiet_rss: list[int] = []
        peak = 0
        rounds = max(2, min(ROUNDS, int(args.seconds // 5)))
        for round_no in range(rounds):
            end = time.monotonic() + args.seconds / rounds

            def session_loop(index: int, end: float = end, round_no: int = round_no) -> None:
                soak = Soak(cm, tally, (args.seed * 1000 + index) * 100 + round_no, hostile)
                while time.monotonic() < end:
                    soak.one(index)

            threads = [threading.Thread(target=session_loop, args=(i,), daemon=True) for i in range(args.sessions)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads) and time.monotonic() < end + 120:
                peak = max(peak, rss_kib())
                time.sleep(0.25)
            for t in threads:
                t.join(1.0)
            tally.lost.extend(f"session thread {t.name} did not finish" for t in threads if t.is_alive())
            quiet_rss.append(quiet_rss_kib())
        stop.set()
        kill_thread.join()
        elapsed = time.monotonic() - started
        spawned, killed = cm._supervisor.spawned, cm._supervisor.killed
        suspended_left = len(cm._runs.all()) if hasattr(cm, "_runs") else 0
    time.sleep(0.2)
    leaked = child_pids() - children_before
    if leaked:
        tally.lost.append(f"worker processes left after close: {sorted(leaked)}")
    if suspended_left:
        tally.lost.append(f"{suspended_left} suspended run(s) left in the run table")

    lat = tally.latencies_ms
    total_runs = sum(tally.runs.values())
    print(f"soak: {args.seconds:.0f} s, {args.sessions} sessions, {args.workers} workers, seed {args.seed}")
    print(f"  runs finished          {total_runs}  ({', '.join(f'{k} {v}' for k, v in sorted(tally.runs.items()))})")
    print(f"  outcomes               {', '.join(f'{k} {v}' for k, v in sorted(tally.outcomes.items()))}")
    print(f"  exec/wait calls        {tally.calls}  ({tally.calls / elapsed:.1f}/s)")
    print(f"  latency per call       p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms")
    print(f"  SIGKILLs sent          {len(tally.kills) - 1}; workers spawned {spawned}, killed by supervisor {killed}")
    rss_line = " -> ".join(f"{kib // 1024}" for kib in quiet_rss)
    print(f"  host RSS               idle between rounds (MiB): {rss_line}; peak under load {peak // 1024} MiB")
    print(f"                         drift after the first round: {(quiet_rss[-1] - quiet_rss[0]) / 1024:+.1f} MiB")
    print(f"  runs lost              {len(tally.lost)}")
    for why in tally.lost[:20]:
        print(f"    - {why}")
    print(f"  wall time              {elapsed:.1f} s")
    return 1 if tally.lost else 0


if __name__ == "__main__":
    sys.exit(main())
