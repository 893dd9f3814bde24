"""Load and fault test (``make soak``): many sessions at once on a small worker pool, mixing
normal cells, hostile cells, slow tools and ``wait``s, while workers are SIGKILLed at random.

Every run must end in a defined state: ``completed`` with the right value, or ``failed`` with a
spec code (a hostile cell with exactly its corpus outcome; any cell whose worker was killed under
it with ``internal_error``). A suspended run must finish through ``wait`` with the value it would
have had without the kills (its journal is replayed when the resident runtime was killed). Anything
else — an exception in the host, a wrong value, a run ``wait`` cannot finish, a leaked worker —
counts as lost, and the command fails if any run is lost.

Beside the sessions, one thread with its own event loop keeps ``--parked`` ``exec_async`` cells
(100 by default) parked on slow async tools at every moment, so each kill lands on a worker that
holds many parked runs. Each such run makes two sequential tool calls and must complete with the
right value, with each of its two tool inputs called exactly once (a replay never calls a tool
again). A worker drives one run at a time, so a kill may fail at most one run it was driving:
one parked run failed with a kill's code per kill is tolerated (and reported); a second one on
the same kill, a wrong value, a repeated tool call, an exception, or a run not finished by the
end of its round is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import ctypes
import gc
import itertools
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
#: A cell parked on two sequential slow tools: (key, value, ms) -> 2 * value + 1. Its budget is
#: long, so it completes within its `exec` (kills and replays included).
PARKED = """// @options: {"timeout_ms": 30000}
const a = await tools.parked({key: "%s-a", value: %d, ms: %d});
const b = await tools.parked({key: "%s-b", value: a + 1, ms: %d});
return a + b"""
PARKED_MS = (100, 300, 800)
#: How long a round's parked runs may take to finish once the round has ended, in seconds.
PARKED_GRACE_S = 60.0
#: Cells that hand the host hostile values or call tools that misbehave (issue 15): each must
#: end as stated, whatever the tool raised or the value was, with no exception out of the host.
CAUGHT = "try { await %s; return 'no error' } catch (e) { return 'caught' }"
DEEP = "let v = 1; for (let i = 0; i < 200; i++) v = [v];"  # past the 128 levels a value may nest
HOSTILE_HOST = {
    "tool_raises_system_exit": (CAUGHT % "tools.exits({})", ("completed", None), "caught"),
    "async_tool_raises_keyboard_interrupt": (CAUGHT % "tools.interrupts({})", ("completed", None), "caught"),
    "tool_raises_cancelled_error": (CAUGHT % "tools.cancels({})", ("completed", None), "caught"),
    "tool_error_whose_str_raises": (CAUGHT % "tools.unprintable({})", ("completed", None), "caught"),
    "tool_returns_20_mib": (CAUGHT % "tools.huge({})", ("completed", None), "caught"),
    "deep_tool_input": (DEEP + CAUGHT % "tools.double({x: v})", ("completed", None), "caught"),
    "deep_return": (DEEP + "return v", ("failed", "invalid_input"), None),
    "deep_source": ("return " + "[" * 5000 + "]" * 5000, ("failed", "invalid_input"), None),
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
            elif roll < 0.85:
                self.hostile_host(session, self.rng.choice(list(HOSTILE_HOST)), started)
            else:
                self.hostile_cell(session, self.rng.choice(self.hostile), started)
        except Exception as e:  # any exception out of the host API is a lost run
            self.lose("exception", f"{type(e).__name__}: {e}")
        finally:
            session.close()

    def hostile_host(self, session: Any, name: str, started: float) -> None:
        code, (expect_status, expect_code), value = HOSTILE_HOST[name]
        result = self.call(session.exec, {"code": code})
        status, code_ = result["status"], result.get("code")
        with self.tally.lock:
            self.tally.runs["hostile_host"] += 1
            self.tally.outcomes[f"{status}/{code_}" if code_ else status] += 1
        if (status, code_) == (expect_status, expect_code) and (value is None or result.get("value") == value):
            return
        if status == "failed" and code_ in KILLED_CODES and self.tally.killed_during(started, time.monotonic()):
            return
        self.lose(f"hostile host {name}", f"expected {expect_status}/{expect_code} {value!r}, got {result}"[:400])

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


@dataclass
class ParkedState:
    """Shared by every round's parked load: the tool's call counts and the parked-at-once gauge."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    inside: int = 0
    peak: int = 0
    #: kill index -> parked runs failed with a kill's code attributed to it (1 is tolerated).
    failed_by_kill: collections.Counter[int] = field(default_factory=collections.Counter)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    async def tool(self, key: str, value: int, ms: int) -> int:
        with self.lock:
            self.calls[key] += 1
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        try:
            await asyncio.sleep(ms / 1000.0)
        finally:
            with self.lock:
                self.inside -= 1
        return value


class ParkedLoad:
    """One round's parked load: ``target`` ``exec_async`` cells in flight at every moment until
    ``end``, on this thread's own event loop (which also runs their async tools)."""

    def __init__(self, cm: CodeMode, tally: Tally, state: ParkedState, seed: int, target: int, end: float) -> None:
        self.cm = cm
        self.tally = tally
        self.state = state
        self.rng = random.Random(seed)
        self.target = target
        self.end = end

    def lose(self, why: str) -> None:
        with self.tally.lock:
            self.tally.lost.append(f"parked: {why}"[:400])

    def run(self) -> None:
        try:
            asyncio.run(self.main())
        except Exception as e:
            self.lose(f"the parked load's loop failed: {type(e).__name__}: {e}")

    async def main(self) -> None:
        running: set[asyncio.Task[None]] = set()
        while time.monotonic() < self.end:
            while len(running) < self.target:
                running.add(asyncio.create_task(self.one()))
            _, running = await asyncio.wait(running, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        if not running:
            return
        _, pending = await asyncio.wait(running, timeout=PARKED_GRACE_S)
        for task in pending:
            self.lose(f"run not finished {PARKED_GRACE_S:.0f} s after its round ended")
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def one(self) -> None:
        n = next(self.state.ids)
        key, value, ms = f"p{n}", self.rng.randrange(1000), self.rng.choice(PARKED_MS)
        session = self.cm.session(f"parked-{n}")
        started = time.monotonic()
        try:
            result = await session.exec_async({"code": PARKED % (key, value, ms, key, ms)})
            waits = 0
            while result["status"] == "waiting" and waits < 200:
                waits += 1
                result = await session.wait_async({"runId": result["runId"]})
            self.check(key, value, result, started)
        except Exception as e:  # any exception out of the host API is a lost run
            self.lose(f"exception: {type(e).__name__}: {e}")
        finally:
            session.close()

    def check(self, key: str, value: int, result: dict[str, Any], started: float) -> None:
        status, code = result["status"], result.get("code")
        with self.tally.lock:
            self.tally.runs["parked"] += 1
            self.tally.outcomes[f"{status}/{code}" if code else status] += 1
            kills = list(self.tally.kills)
        if status == "completed":
            with self.state.lock:
                calls = (self.state.calls[f"{key}-a"], self.state.calls[f"{key}-b"])
            if result["value"] == 2 * value + 1 and calls == (1, 1):
                return
            return self.lose(f"expected {2 * value + 1} with each tool input called once, got {result} {calls}")
        if status == "failed" and code in KILLED_CODES:
            kill = bisect.bisect_right(kills, time.monotonic()) - 1  # the latest kill before now
            if kill >= 0 and kills[kill] >= started:
                with self.state.lock:
                    self.state.failed_by_kill[kill] += 1
                    if self.state.failed_by_kill[kill] == 1:
                        return  # the one run that kill's worker may have been driving
            return self.lose(f"failed though parked (a kill fails at most the one run it drove): {result}")
        return self.lose(f"expected {2 * value + 1}, got {result}")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def install_bad_tools(cm: CodeMode) -> None:
    """Tools that misbehave as a buggy or hostile host tool would: each may fail only its call."""

    @cm.tool
    def exits() -> None:
        raise SystemExit(3)

    @cm.tool
    async def interrupts() -> None:
        raise KeyboardInterrupt

    @cm.tool
    async def cancels() -> None:
        raise asyncio.CancelledError

    @cm.tool
    def unprintable() -> None:
        raise _Unprintable

    @cm.tool
    def huge() -> str:
        return "x" * (20 << 20)


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
    parser.add_argument(
        "--parked", type=int, default=100, help="exec_async cells kept parked on slow tools at once (0: none)"
    )
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", 1)))
    args = parser.parse_args()

    hostile = [c for c in CORPUS if c.config is None and not c.isolated and c.expect_status != "waiting"]
    children_before = child_pids()
    config = {**BASE_CONFIG, "workers": args.workers}
    tally = Tally()
    parked_state = ParkedState()
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

        @cm.tool
        async def parked(key: str, value: int, ms: int) -> int:
            return await parked_state.tool(key, value, ms)

        install_bad_tools(cm)

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
            if args.parked > 0:
                load = ParkedLoad(cm, tally, parked_state, args.seed * 1000 + round_no, args.parked, end)
                threads.append(threading.Thread(target=load.run, name="parked-load", daemon=True))
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
    print(
        f"soak: {args.seconds:.0f} s, {args.sessions} sessions, {args.parked} parked runs,"
        f" {args.workers} workers, seed {args.seed}"
    )
    print(f"  runs finished          {total_runs}  ({', '.join(f'{k} {v}' for k, v in sorted(tally.runs.items()))})")
    print(f"  outcomes               {', '.join(f'{k} {v}' for k, v in sorted(tally.outcomes.items()))}")
    print(f"  exec/wait calls        {tally.calls}  ({tally.calls / elapsed:.1f}/s)")
    print(f"  latency per call       p50 {percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms")
    tolerated = len(parked_state.failed_by_kill)  # kills that failed a parked run (one each)
    print(
        f"  parked runs            {tally.runs['parked']} finished, peak {parked_state.peak} parked at once"
        f" (target {args.parked}); {tolerated} failed under the kill that hit the run being driven"
    )
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
