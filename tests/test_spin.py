"""Bounded polling between the host and its workers (`codemode_spin`): a side awaiting a frame
due within microseconds polls for it briefly instead of letting its CPU halt, and never longer.
The speed this buys is measured in benches/; these tests pin the bounds: nothing spins while
idle, a caller waiting on a long cell or a slow tool sleeps, a yielding poll gives up on a busy
CPU."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest
from codemode import CodeMode
from codemode._engine import spin_readable
from codemode.workers import SPIN_S

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _idle_cpus(seconds: float = 0.1) -> float:
    """How many CPUs this machine left idle over ``seconds`` (from /proc/stat), this process
    asleep meanwhile."""

    def idle_and_total() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(n) for n in f.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks[:8])  # (idle + iowait; user .. steal)

    idle, total = idle_and_total()
    time.sleep(seconds)
    idle_after, total_after = idle_and_total()
    return os.cpu_count() * (idle_after - idle) / max(1, total_after - total)


@pytest.fixture
def spare_cpu() -> None:
    """Where a worker polls and on which CPU is what these tests pin: with no CPU idle (other
    tasks busy on every one, just before the test), a yielding poll gives its CPU up and a
    worker has nowhere to move to, as designed, and there is nothing for them to see."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("polling needs a second CPU")
    if _idle_cpus() < 0.7:
        pytest.skip("polling needs an idle CPU: this machine is busy")


SPARE_CPU = pytest.mark.usefixtures("spare_cpu")
TEN_CALLS = "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t"


def _voluntary_switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


@pytest.fixture
def cm():
    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        async def slow(ms: int) -> int:
            await asyncio.sleep(ms / 1000)
            return ms

        @cm.tool
        def double(x: int) -> int:
            return 2 * x

        yield cm


def test_a_yielding_poll_of_an_empty_pipe_ends_within_its_bound():
    r, w = os.pipe()
    try:
        for yielding in (False, True):
            started = time.monotonic()
            assert spin_readable(r, 0.002, yielding) is False
            assert time.monotonic() - started < 0.05
        os.write(w, b"x")
        assert spin_readable(r, 1.0, True) is True
    finally:
        os.close(r)
        os.close(w)


def test_a_yielding_poll_sees_a_write_from_another_thread():
    r, w = os.pipe()
    try:
        threading.Timer(0.001, os.write, (w, b"x")).start()
        # A yielding poll may give up early (a shared CPU); then the caller sleeps in poll().
        deadline = time.monotonic() + 5
        while not spin_readable(r, 0.01, True) and time.monotonic() < deadline:
            pass
        assert os.read(r, 1) == b"x"
    finally:
        os.close(r)
        os.close(w)


def test_an_idle_worker_sleeps_after_its_last_cell(cm):
    s = cm.session("s")
    for _ in range(200):
        assert s.exec({"code": "return 1 + 1"})["value"] == 2
    (pid,) = cm.inspect().worker_pids
    before = _cpu_s(pid)
    time.sleep(0.5)
    # A worker that kept polling would have used the whole 0.5 s; one that polled for its
    # window after the last reply and then slept uses (almost) nothing.
    assert _cpu_s(pid) - before < 0.05


def test_a_caller_awaiting_a_long_cell_sleeps_through_it(cm):
    s = cm.session("s")
    s.exec({"code": "return 1"})
    started_cpu, started = time.thread_time(), time.monotonic()
    result = s.exec({"code": "const end = Date.now() + 300; while (Date.now() < end) {} return 7"})
    # (Date.now() counts whole milliseconds, so the loop may end up to 1 ms short of 300.)
    assert result["value"] == 7 and time.monotonic() - started >= 0.29
    # The caller reads its worker itself; it polls for SPIN_S, then sleeps until the reply.
    assert time.thread_time() - started_cpu < 0.05


def test_a_run_parked_on_a_slow_tool_costs_neither_side_a_cpu(cm):
    s = cm.session("s")
    s.exec({"code": "return 1"})
    (pid,) = cm.inspect().worker_pids
    host_before, worker_before = time.process_time(), _cpu_s(pid)
    result = s.exec({"code": "return await tools.slow({ms: 400})"})
    assert result["value"] == 400, result
    assert time.process_time() - host_before < 0.1
    assert _cpu_s(pid) - worker_before < 0.05


def test_the_window_is_short():
    # The bound the tests above rely on, and the one the benches measured.
    assert 0 < SPIN_S <= 200e-6


@SPARE_CPU
def test_a_worker_started_off_the_hosts_cpu_gets_every_cpu_back_and_polls(cm):
    # A new worker starts off its spawner's CPU (`workers._start_elsewhere`), on one, and gets
    # the host's CPUs back once it is up; it must then poll between cells as one started
    # anywhere would.
    # (It once decided at start-up, on one CPU, never to poll: back to back cost ~90 µs, not ~50.)
    s = cm.session("s")
    s.exec({"code": "return 1"})
    (pid,) = cm.inspect().worker_pids
    # Every CPU of the host's, or all but one: the worker keeps off a CPU it found shared with
    # the host (the thread that read its `Ready` gives them back just after it routed it).
    host, worker = os.sched_getaffinity(0), os.sched_getaffinity(pid)
    assert worker <= host and len(host - worker) <= 1
    for _ in range(50):
        s.exec({"code": "return 1"})
    before = _voluntary_switches(pid)
    for _ in range(300):
        s.exec({"code": "return 1"})
    # A worker that sleeps after each cell switches out once per cell; one that polls finds the
    # next cell's frame awake, all but a few times.
    assert _voluntary_switches(pid) - before < 200


@SPARE_CPU
def test_after_a_pause_back_to_back_cells_find_the_worker_polling_on_another_cpu(cm):
    # A worker that slept is woken on its host's CPU; the two then took turns there, the worker
    # giving up its poll at once (its yields let the host run) and sleeping after every cell
    # while the other CPU idled. It now moves to the other CPU and polls there.
    s = cm.session("s")
    s.exec({"code": "return 1"})
    (pid,) = cm.inspect().worker_pids
    for _ in range(100):
        time.sleep(0.002)
        s.exec({"code": "return 1"})
    before = _voluntary_switches(pid)
    for _ in range(300):
        time.sleep(0)
        s.exec({"code": "return 1"})
    assert _voluntary_switches(pid) - before < 200


def _keep_off_the_hosts_cpu(session: Any, pid: int) -> None:
    """Cells until the worker keeps off the host's CPU, the host on one CPU meanwhile: each after
    a pause past STAY_AWAY (the worker asleep with every CPU, woken on its writer's CPU) and
    making quick tool calls, whose answers it moves off that CPU to poll for (see
    `test_a_cell_after_a_pause_moves_off_the_hosts_cpu_for_its_quick_tool_calls`); the run then
    ends with the traffic still coming, and it stays off. (Back-to-back trivial cells did this
    until a yield counted as shared only when another task ran: a worker woken on a CPU of its
    own, as this kernel mostly wakes it after a short pause, never finds it shared.)"""
    host = os.sched_getaffinity(0)
    cpu = min(host)
    os.sched_setaffinity(0, {cpu})
    moved, cells = host, 0
    try:
        # (Until off the host's CPU: a worker that found its own CPU shared, with another task
        # there, moved onto the host's instead; after the next pause it has every CPU again.)
        while moved != host - {cpu} and cells < 100:
            time.sleep(0.02)
            assert session.exec({"code": TEN_CALLS})["value"] == 90
            cells += 1
            moved = os.sched_getaffinity(pid)
    finally:
        os.sched_setaffinity(0, host)
    # (The set it moved to, as seen then: read again, it may be back already.)
    assert moved == host - {cpu}, f"the worker never moved off the host's CPU ({cells} cells): {moved}"


@SPARE_CPU
def test_a_worker_kept_off_the_hosts_cpu_comes_back_when_the_traffic_pauses(cm):
    # Back to back the worker keeps off the CPU it found shared with the host; sleeping there
    # through a pause of some ms, it would be woken on a CPU halted deep (a trivial cell after 10
    # ms idle ~300 µs instead of ~160): after STAY_AWAY (5 ms) it takes every CPU back.
    s = cm.session("s")
    (pid,) = cm.inspect().worker_pids
    host = os.sched_getaffinity(0)
    _keep_off_the_hosts_cpu(s, pid)
    time.sleep(0.05)
    assert os.sched_getaffinity(pid) == host
    # And the pause ended nothing: cells after it run (and may move it off again).
    assert s.exec({"code": "return 2"})["value"] == 2


@SPARE_CPU
def test_a_worker_kept_off_the_hosts_cpu_comes_back_soon_after_its_run_yields(cm):
    # A run parked on `yield_control` alone is resumed by a `wait`, a model's turn later: kept
    # off, its worker would sleep on a CPU of its own, halted by then, and that `wait` pay the
    # wake-up (suspend + resume 2 ms apart, after back-to-back cells: ~260-450 -> ~130-150 µs).
    # It takes every CPU back before it sleeps (HOST_FINISHES, 0.5 ms, after its reply: see the
    # next test), not STAY_AWAY (5 ms) later.
    s = cm.session("s")
    (pid,) = cm.inspect().worker_pids
    host = os.sched_getaffinity(0)
    _keep_off_the_hosts_cpu(s, pid)
    waiting = s.exec({"code": "await yield_control('pause'); return 3"})
    assert waiting["status"] == "waiting"
    deadline = time.monotonic() + 0.004  # (well within STAY_AWAY)
    while os.sched_getaffinity(pid) != host and time.monotonic() < deadline:
        time.sleep(0.0002)
    assert os.sched_getaffinity(pid) == host
    assert s.wait({"runId": waiting["runId"]})["value"] == 3


@SPARE_CPU
def test_a_worker_kept_off_the_hosts_cpu_comes_back_only_once_the_host_has_built_the_result(cm):
    # Coming back lands the worker on the host's CPU: done the moment its yield was reported,
    # the move (the migration thread's turn, then the worker's) preempted the host while it
    # made the cell a suspended run (~20 µs, in phases). The worker waits HOST_FINISHES (0.5 ms)
    # first: kept off when the yielding cell came, it is still off when the exec returns.
    s = cm.session("s")
    (pid,) = cm.inspect().worker_pids
    host = os.sched_getaffinity(0)
    tries = still_off = 0
    for _ in range(30):
        _keep_off_the_hosts_cpu(s, pid)
        # (One more cell back to back, as in a burst: kept off after the helper's tool calls, the
        # worker stays off for it, and the yielding cell below comes while it is.)
        s.exec({"code": "return 1"})
        if os.sched_getaffinity(pid) == host:
            continue
        tries += 1
        waiting = s.exec({"code": "await yield_control('pause'); return 5"})
        still_off += os.sched_getaffinity(pid) != host
        assert s.wait({"runId": waiting["runId"]})["value"] == 5
        if tries == 5:
            break
    assert tries >= 3, f"the worker stayed off the host's CPU before {tries} yielding cells of 30"
    # (Coming back at once, it was still off when the exec returned in 1-2 of 5 tries.)
    assert still_off >= tries - 1, f"the worker came back before the exec returned {tries - still_off} times in {tries}"


@SPARE_CPU
def test_a_worker_kept_off_the_hosts_cpu_comes_back_at_once_when_a_cell_after_a_pause_ends(cm):
    # Cells 2 ms apart after a burst: the traffic never pauses STAY_AWAY (5 ms), and a worker
    # that waited for that kept off for good, each cell's frame waking it on a CPU of its own,
    # halted meanwhile (idle trivial cells ~94 µs kept off, ~70 with every CPU). A cell whose
    # frame came after a pause ends: it takes every CPU back before it sleeps.
    s = cm.session("s")
    (pid,) = cm.inspect().worker_pids
    host = os.sched_getaffinity(0)
    back = 0
    for _ in range(5):
        _keep_off_the_hosts_cpu(s, pid)
        time.sleep(0.002)  # (a model's turn, well within STAY_AWAY)
        assert s.exec({"code": "return 4"})["value"] == 4
        deadline = time.monotonic() + 0.003  # (the reply's poll window, and some: < STAY_AWAY)
        while os.sched_getaffinity(pid) != host and time.monotonic() < deadline:
            time.sleep(0.0002)
        back += os.sched_getaffinity(pid) == host
    # (Most times, not every time: a busy machine may stretch a window past the deadline.)
    assert back >= 3, f"came back at once after {back} of 5 cells"


@SPARE_CPU
def test_a_cell_after_a_pause_moves_off_the_hosts_cpu_for_its_quick_tool_calls(cm):
    # Woken on the host's CPU by a cell's start after a pause, a worker whose tools answered
    # quickly before moves off that CPU when it polls for their answers (the host runs the tools
    # there): the calls then pass between two CPUs that poll, with no wake-up each (10 paced
    # calls, ping-pong A/B: ~0.85x the time of sleeping on the host's CPU for each answer).
    s = cm.session("s")
    (pid,) = cm.inspect().worker_pids
    host = os.sched_getaffinity(0)
    code = TEN_CALLS
    assert s.exec({"code": code})["value"] == 90  # (its tool is quick from now on)
    moved = 0
    for _ in range(10):
        time.sleep(0.02)  # (past STAY_AWAY: every CPU back, asleep)
        assert os.sched_getaffinity(pid) == host
        assert s.exec({"code": code})["value"] == 90
        moved += os.sched_getaffinity(pid) != host
    # (Most times, not every time: another task on the other CPU may keep it there.)
    assert moved >= 4, f"moved off the host's CPU in {moved} of 10 cells"


@SPARE_CPU
def test_a_worker_polls_for_quick_tool_answers_on_a_cpu_of_its_own(cm):
    # Back to back, the worker polls on the CPU the host does not use; parked on a tool that
    # answers within microseconds it polls for the answer there too, instead of sleeping and
    # being woken on a halted CPU for each call (10 sequential calls: ~1 ms -> ~0.55 ms).
    s = cm.session("s")
    code = TEN_CALLS
    for _ in range(20):
        s.exec({"code": code})
    (pid,) = cm.inspect().worker_pids
    before = _voluntary_switches(pid)
    for _ in range(50):
        assert s.exec({"code": code})["value"] == 90
    assert _voluntary_switches(pid) - before < 330


def _run_ns(pid: int) -> int:
    """Nanoseconds process ``pid``'s main thread has run (from /proc; finer than `_cpu_s`)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def test_a_worker_whose_tools_answer_slowly_stops_polling_for_their_answers(cm):
    # A poll that runs out costs a slow tool's answer (an MCP server's, say) ~100 µs, by taking a
    # CPU the host needs: parked, the worker polls only while the last answer came in time.
    s = cm.session("s")
    code = "for (let i = 0; i < 100; i++) await tools.slow({ms: 2}); return 1"
    s.exec({"code": code})
    (pid,) = cm.inspect().worker_pids
    before = _run_ns(pid)
    assert s.exec({"code": code})["value"] == 1
    # Polling the whole window each time would be >= 100 x 300 µs; not polling, ~100 x 20 µs.
    assert _run_ns(pid) - before < 15_000_000
