"""A run given its seed is reproducible: the same ``Math.random`` and the same clock.

``exec_async(seed=S)`` (and ``codemode run --seed``, which derives a seed per cell) fixes the
cell's random sequence and its clock: ``Date`` starts at a time the seed gives and moves 1 ms a
read, whatever the real time, so two runs of one cell with one seed give the same value even
when they read the date. The fixed clock is a function of the reads alone: a run replayed from
its journal after its worker died reads the same dates it read before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from codemode import CodeMode
from codemode.runs import FIXED_CLOCK_EPOCH_MS, FIXED_CLOCK_SPAN_MS, fixed_clock_start

READS = "const a = Date.now(), d = new Date().toISOString(), b = Date.now(); return [a, d, b, Math.random()]"


@pytest.fixture(scope="module")
def cm():
    with CodeMode({"workers": 1, "timeoutMs": 2000}) as cm:

        @cm.tool
        async def slow(x: int) -> int:
            await asyncio.sleep(0.3)
            return x

        yield cm


def run(cm: CodeMode, code: str, seed: int | None) -> dict:
    return asyncio.run(cm.session("seeded").exec_async({"code": code}, seed=seed))


def test_the_same_seed_reads_the_same_clock_and_random_numbers(cm):
    first = run(cm, READS, 7)
    time.sleep(0.01)  # the real clock moves on; the run's does not
    second = run(cm, READS, 7)
    assert first["status"] == "completed"
    assert first["value"] == second["value"]
    a, iso, b, _ = first["value"]
    start = fixed_clock_start(7)
    assert a == start and b == start + 2  # each read 1 ms on (the Date between them is one)
    assert iso == "2025-01-01T00:00:00.008Z"  # seed 7: 7 ms into the fixed clock's year, + 1 read


def test_another_seed_or_none_reads_other_values(cm):
    seven, eight = run(cm, READS, 7)["value"], run(cm, READS, 8)["value"]
    assert seven[0] != eight[0] and seven[3] != eight[3]
    real = run(cm, READS, None)["value"]
    assert abs(real[0] - time.time() * 1000) < 60_000  # unseeded: the real clock


def test_fixed_clock_starts_stay_within_a_year_of_its_epoch():
    for seed in (0, 1, FIXED_CLOCK_SPAN_MS - 1, FIXED_CLOCK_SPAN_MS, 2**63 - 1):
        assert FIXED_CLOCK_EPOCH_MS <= fixed_clock_start(seed) < FIXED_CLOCK_EPOCH_MS + FIXED_CLOCK_SPAN_MS


def test_a_loop_that_waits_for_the_fixed_clock_ends(cm):
    code = "const end = Date.now() + 50; let n = 0; while (Date.now() < end) n++; return n"
    assert run(cm, code, 3)["value"] == 49  # one read a turn, 1 ms each: no spin to the deadline


def test_a_seeded_run_replayed_after_its_worker_died_reads_the_same_dates(cm):
    code = "const a = Date.now(); const x = await tools.slow({x: 1}); return [a, Date.now(), x, Math.random()]"

    async def suspended_then_killed() -> dict:
        session = cm.session("seeded-replay")
        waiting = await session.exec_async({"code": '// @options: {"timeout_ms": 100}\n' + code}, seed=11)
        assert waiting["status"] == "waiting"
        for pid in cm._supervisor.worker_pids():
            os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.4)  # the tool has answered; the run's runtime is gone
        result = await session.wait_async({"runId": waiting["runId"]})
        while result["status"] == "waiting":
            result = await session.wait_async({"runId": result["runId"]})
        return result

    replayed = asyncio.run(suspended_then_killed())
    straight = run(cm, code, 11)
    assert replayed["status"] == "completed", replayed
    assert replayed["value"] == straight["value"]
    assert replayed["value"][:2] == [fixed_clock_start(11), fixed_clock_start(11) + 1]
