"""codemode's own numbers (DESIGN.md §12), measured beside the baselines in test_baselines.py.

Two views of a warm exec:
* ``idle``: pedantic rounds with a short pause before each (not timed), so the worker has built
  its next runtime — the latency a model-driven host sees, whose execs are turns apart;
* ``back-to-back``: pytest-benchmark's default tight loop — sustained throughput, where the
  worker's rebuild of the next runtime (~150-250 µs of CPU) competes with the next exec.
``benches/report.py`` turns the JSON of one run into the README table and its ratios.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode, protocol, workers
from codemode.cells import CellArgs, check_cell
from codemode.workers import WORKER_BINARY, popen_worker

GAP_S = 0.002
TEN_CALLS = "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t"


def _pause() -> None:
    time.sleep(GAP_S)


def _trivial_rounds(
    benchmark: Any,
    execute: Callable[[dict[str, str]], dict[str, Any]],
    pause: Callable[[], None],
    rounds: int,
    warmup: int,
) -> None:
    """Times ``execute`` (an exec, or a host's stand-in for one) of the trivial cell, after
    ``pause()`` (untimed) before each round."""
    result = benchmark.pedantic(
        execute, args=({"code": "return 1 + 1"},), setup=pause, rounds=rounds, warmup_rounds=warmup
    )
    assert result["value"] == 2


def _paired_rounds(
    benchmark: Any, session: Any, reference: Callable[[], object], code: str, rounds: int, warmup: int = 0
) -> tuple[Any, list[tuple[float, float, float]]]:
    """Times ``code``'s cell as the benchmark's figure and, before each of its rounds, after the
    same pause before each, ``reference()`` and a trivial exec: this machine drifts by more
    than what such a triple compares between the minutes two benchmarks run in. Returns the
    cell's result and each timed round's ``(reference, trivial exec, cell)`` seconds."""
    before_cell: list[tuple[float, float]] = []
    cells: list[float] = []

    def before() -> tuple[tuple[object, ...], dict[str, object]]:
        _pause()
        started = time.perf_counter()
        reference()
        took = time.perf_counter() - started
        _pause()
        started = time.perf_counter()
        session.exec({"code": "return 1 + 1"})
        before_cell.append((took, time.perf_counter() - started))
        _pause()
        return ({"code": code},), {}

    def cell(args: dict[str, str]) -> dict[str, object]:
        started = time.perf_counter()
        result = session.exec(args)
        cells.append(time.perf_counter() - started)
        return result

    result = benchmark.pedantic(cell, setup=before, rounds=rounds, warmup_rounds=warmup)
    timed = [(r, e, c) for (r, e), c in zip(before_cell, cells, strict=True)][warmup:]  # (warm-up rounds aside)
    return result, timed


@pytest.fixture(scope="module")
def session():
    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def double(x: int) -> int:
            return x * 2

        s = cm.session("bench")
        assert s.exec({"code": "return 1 + 1"})["value"] == 2
        yield s


@pytest.mark.benchmark(group="trivial")
def test_exec_trivial_idle(benchmark, session):
    _trivial_rounds(benchmark, session.exec, _pause, rounds=400, warmup=20)


@pytest.mark.benchmark(group="trivial")
def test_exec_trivial_back_to_back(benchmark, session):
    assert benchmark(session.exec, {"code": "return 1 + 1"})["value"] == 2


@pytest.mark.benchmark(group="trivial")
def test_pipe_roundtrip_idle(benchmark, echo_child):
    """The floor, measured the same way as the idle exec: one framed round trip after a pause."""
    import msgspec

    frame = msgspec.msgpack.encode({"kind": "ping", "n": 1})
    assert benchmark.pedantic(echo_child.roundtrip, args=(frame,), setup=_pause, rounds=400) == frame


@pytest.mark.benchmark(group="toolcalls")
def test_exec_ten_sequential_tool_calls_idle(benchmark, session):
    result = benchmark.pedantic(session.exec, args=({"code": TEN_CALLS},), setup=_pause, rounds=300, warmup_rounds=10)
    assert result["value"] == 90


@pytest.mark.benchmark(group="toolcalls")
def test_exec_paired_with_a_pipe_round_trip(benchmark, session, echo_child):
    """The budgets' ratios from paired rounds: this VM's phase moves between the minutes two
    benchmarks run in, by more than the ratios' margins. Each round, after the same pause
    before each: a bare pipe round trip, a trivial exec, then the ten-call cell (timed); the
    ratios are the medians of each round's (an exec against its round's round trip; a tool
    call, the ten-call cell less the trivial exec over ten, against the same)."""
    import msgspec

    frame = msgspec.msgpack.encode({"kind": "ping", "n": 1})
    result, rounds = _paired_rounds(
        benchmark, session, lambda: echo_child.roundtrip(frame), TEN_CALLS, rounds=300, warmup=10
    )
    assert result["value"] == 90
    execs = sorted(e / p for p, e, _ in rounds)
    calls = sorted((c - e) / 10 / p for p, e, c in rounds)
    benchmark.extra_info["paired_exec_over_pipe"] = execs[len(execs) // 2]
    benchmark.extra_info["paired_call_over_pipe"] = calls[len(calls) // 2]


class BareWorker:
    """A worker process driven with the fewest host steps there are: each frame recorded from
    a real exec is written as it was, and each reply read the way the host reads one (a short
    spin, then the frame reader). What an idle exec costs beyond this is the host's."""

    def __init__(self, configure: bytes) -> None:
        self.proc = popen_worker([str(WORKER_BINARY)])
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd, self.rfd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.reader = protocol.frame_reader(self.rfd)
        assert isinstance(self.reply(), protocol.Ready)
        os.write(self.wfd, configure)

    def reply(self) -> protocol.WorkerFrame:
        while True:
            spoke, bodies = self.reader.read_within(60.0, workers.SPIN_S)
            assert spoke and bodies is not None, "the worker exited or hung"
            if bodies:
                return protocol.worker_decoder.decode(bodies[-1])

    def drive(self, frames: list[bytes]) -> protocol.WorkerFrame:
        """Writes each host frame after the reply to the one before; the last reply."""
        reply = None
        for frame in frames:
            os.write(self.wfd, frame)
            reply = self.reply()
        assert reply is not None
        return reply

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=5)
        self.proc.stdout.close()


def _recorded(*cells: str) -> tuple[bytes, list[list[bytes]]]:
    """The frames a host writes for each cell (its second exec: the first is a warm-up), on a
    new ``CodeMode`` with the benches' tool, and the last configuration it wrote."""
    written: list[tuple[str, bytes]] = []
    encode = protocol.encode

    def recording(frame: Any) -> bytes:
        data = encode(frame)
        written.append((type(frame).__name__, data))
        return data

    recorded = []
    configure = b""
    workers.protocol.encode = recording  # type: ignore[attr-defined]
    try:
        with CodeMode({"workers": 1}) as cm:

            @cm.tool
            def double(x: int) -> int:
                return x * 2

            session = cm.session("recorded")
            for code in cells:
                session.exec({"code": code})
                configure = next((data for kind, data in reversed(written) if kind == "Configure"), configure)
                written.clear()
                session.exec({"code": code})
                recorded.append([data for _, data in written])
                written.clear()
    finally:
        workers.protocol.encode = encode  # type: ignore[attr-defined]
    return configure, recorded


@pytest.fixture(scope="module")
def bare():
    """A bare worker, and the frames of a trivial cell and of ten tool calls to drive it with."""
    configure, (trivial, ten) = _recorded("return 1 + 1", TEN_CALLS)
    worker = BareWorker(configure)
    yield worker, trivial, ten
    worker.close()


@pytest.mark.benchmark(group="trivial")
def test_worker_alone_trivial_idle(benchmark, bare):
    """The idle exec's cell with no host in between: its recorded frame written to a worker
    of its own after the same pause, the report read."""
    worker, trivial, _ = bare
    report = benchmark.pedantic(worker.drive, args=(trivial,), setup=_pause, rounds=400, warmup_rounds=20)
    assert isinstance(report, protocol.Report) and report.value == "2"


class ThinHost:
    """What a host must do per cell and no more, on a bare worker: check the exec's arguments,
    encode the cell's `Start` (a run number of its own, a fresh seed), write it, poll, read and
    decode the report and its value, and build the result. No run, journal, dispatcher, lane,
    reader, waiter or trace bookkeeping: what an idle exec costs beyond this is the supervisor's
    (the run model's) share, which a leaner first step of a run could save."""

    def __init__(self, worker: BareWorker) -> None:
        self.worker = worker
        self.numbers = itertools.count(1 << 40)  # (no recorded frame's run number)

    def exec(self, args: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        checked = check_cell(args, ("javascript", "typescript"))
        assert isinstance(checked, CellArgs)
        frame = protocol.Start(next(self.numbers), checked.code, checked.language, 5000.0, random.getrandbits(63))
        os.write(self.worker.wfd, protocol.encode(frame))
        report = self.worker.reply()
        assert isinstance(report, protocol.Report) and report.status == "completed"
        telemetry = {"durationMs": (time.perf_counter() - started) * 1000.0, "memoryBytes": report.memory_bytes}
        return {"status": "completed", "value": protocol.decode_guest_json(report.value), "telemetry": telemetry}


@pytest.mark.benchmark(group="trivial")
def test_thin_host_trivial_idle(benchmark, bare):
    """The idle exec's cell through `ThinHost`: a cell's own host steps, none of the
    supervisor's."""
    _trivial_rounds(benchmark, ThinHost(bare[0]).exec, _pause, rounds=400, warmup=20)


#: A longer pause: the host's and the worker's caches are cold again (on this kind of VM other
#: guests run on the halted CPUs meanwhile), as after a model's turn.
LONG_GAP_S = 0.03


def _long_pause() -> None:
    time.sleep(LONG_GAP_S)


@pytest.mark.benchmark(group="trivial-after-30ms")
def test_exec_trivial_after_30ms(benchmark, session):
    """The idle exec after a 30 ms pause: every step's code and data cold (see `LONG_GAP_S`)."""
    _trivial_rounds(benchmark, session.exec, _long_pause, rounds=100, warmup=5)


@pytest.mark.benchmark(group="trivial-after-30ms")
def test_thin_host_trivial_after_30ms(benchmark, bare):
    """`ThinHost`'s exec after the same 30 ms pause: what of the cold exec is not the
    supervisor's."""
    _trivial_rounds(benchmark, ThinHost(bare[0]).exec, _long_pause, rounds=100, warmup=5)


@pytest.mark.benchmark(group="toolcalls")
def test_worker_alone_ten_tool_calls_idle(benchmark, bare):
    """The ten-call cell with no host in between: each call answered with the frame the host
    wrote for it, at once."""
    worker, _, ten = bare
    report = benchmark.pedantic(worker.drive, args=(ten,), setup=_pause, rounds=300, warmup_rounds=10)
    assert isinstance(report, protocol.Report) and report.value == "90"


@pytest.mark.benchmark(group="cold")
def test_first_exec_on_new_codemode(benchmark):
    """A new ``CodeMode`` (worker spawn included), its first exec, and close."""

    def first() -> object:
        with CodeMode({"workers": 1}) as cm:
            return cm.session().exec({"code": "return 1 + 1"})["value"]

    assert benchmark.pedantic(first, rounds=10, warmup_rounds=1) == 2


@pytest.mark.benchmark(group="cold")
def test_first_exec_after_the_first_model_turn(benchmark):
    """The first exec of a new ``CodeMode`` with one tool, after a 200 ms pause (the model's
    first turn; not timed): what a host's first cell waits for once its worker is up (with the
    search model installed, that catalog's configuration carries it)."""

    made: list[CodeMode] = []

    def setup() -> None:
        while made:
            made.pop().close()  # the last round's, off the clock
        cm = CodeMode({"workers": 1})
        made.append(cm)

        @cm.tool
        def double(x: int) -> int:
            return x * 2

        time.sleep(0.2)

    def first() -> object:
        return made[-1].session().exec({"code": "return await tools.double({x: 1})"})["value"]

    try:
        assert benchmark.pedantic(first, setup=setup, rounds=10, warmup_rounds=1) == 2
    finally:
        while made:
            made.pop().close()


YIELDING = "await yield_control(); return 1"
TEN_THEN_YIELD = (
    "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); await yield_control(); return t"
)


@pytest.fixture(scope="module")
def late_session():
    """Cells whose one tool answers just after the exec's deadline (the least, 100 ms)."""
    with CodeMode({"workers": 1, "timeoutMs": 100}) as cm:

        @cm.tool
        async def late(x: int) -> int:
            await asyncio.sleep(0.115)
            return x

        yield cm.session("bench-late")


@pytest.mark.benchmark(group="resume")
def test_wait_on_resident_run_whose_tool_finished(benchmark, late_session):
    """The issue's `wait`: a run suspended on a pending tool, which has answered by the time
    the model (a turn later) calls `wait`; its runtime is resident."""

    def suspend():
        waiting = late_session.exec({"code": "const v = await tools.late({x: 20}); return v + 1"})
        assert waiting["status"] == "waiting"
        time.sleep(0.03)  # the tool answers (at 115 ms) and a model turn passes
        benchmark.extra_info["suspended_run_memory_bytes"] = waiting["telemetry"]["memoryBytes"]
        return ({"runId": waiting["runId"]},), {}

    assert benchmark.pedantic(late_session.wait, setup=suspend, rounds=150)["value"] == 21


@pytest.mark.benchmark(group="resume")
def test_wait_on_resident_run(benchmark, session):
    """`wait` on a run resident after `yield_control`: the wait itself answers the yield, so
    it always costs a worker round trip."""

    def suspend():
        waiting = session.exec({"code": YIELDING})
        assert waiting["status"] == "waiting"
        time.sleep(0.01)  # a model turn: the worker has finished its idle work meanwhile
        return ({"runId": waiting["runId"]},), {}

    assert benchmark.pedantic(session.wait, setup=suspend, rounds=300)["value"] == 1


@pytest.mark.benchmark(group="resume")
def test_wait_replaying_ten_journaled_calls(benchmark, session):
    """`wait` when the resident runtime is gone: the journal (10 tool calls) is replayed into a
    fresh engine, then the pending call is settled."""
    live = session.codemode._live

    def suspend_and_evict():
        waiting = session.exec({"code": TEN_THEN_YIELD})
        time.sleep(0.01)
        assert waiting["status"] == "waiting"
        (run,) = [r for r in live.suspended() if r.run_id == waiting["runId"]]
        assert session.codemode._supervisor.evict(run)  # the resident runtime is gone: wait must replay
        return ({"runId": waiting["runId"]},), {}

    assert benchmark.pedantic(session.wait, setup=suspend_and_evict, rounds=200)["value"] == 90


VERBS = ["list", "get", "create", "update", "delete", "search", "sync", "export", "archive", "approve"]
NOUNS = ["invoice", "shipment", "customer", "ticket", "deployment", "alert", "document", "calendar_event",
         "payment", "repository", "issue", "message", "file", "user", "report", "order", "lead", "contract",
         "device", "incident"]  # fmt: skip


def _catalog_codemode(size: int) -> CodeMode:
    cm = CodeMode({"workers": 1, "enabled": True})
    schema = {"type": "object", "properties": {"id": {"type": "string"}, "limit": {"type": "integer"}}}

    def handler(**kwargs: object) -> dict[str, object]:
        return dict(kwargs)

    for i in range(size):
        verb, noun = VERBS[i % len(VERBS)], NOUNS[(i // len(VERBS)) % len(NOUNS)]
        name = f"{verb}_{noun}_{i}"
        cm.add_tool(handler, name=name, owner=f"plugin{i % 50}", description=f"{verb} {noun} records (#{i}).",
                    input_schema=schema)  # fmt: skip
    return cm


@pytest.fixture(scope="module", params=[10, 10_000], ids=["10-tools", "10k-tools"])
def sized(request):
    with _catalog_codemode(request.param) as cm:
        s = cm.session("catalog")
        assert s.exec({"code": "return ALL_TOOLS.length"})["value"] == request.param  # first exec ships the catalog
        yield s


@pytest.mark.benchmark(group="catalog-size")
def test_exec_trivial_idle_by_catalog_size(benchmark, sized):
    _trivial_rounds(benchmark, sized.exec, _pause, rounds=300, warmup=10)


SEARCHES = 200
SEARCH_CELL = f"""
const qs = ["unpaid invoice", "delete shipment", "approve payment", "sync calendar event", "export report"];
let n = 0;
for (let i = 0; i < {SEARCHES}; i++) n += (await tools.search(qs[i % qs.length], {{limit: 8}})).length;
return n;
"""


@pytest.mark.benchmark(group="catalog-search")
def test_exec_with_200_searches_by_catalog_size(benchmark, sized):
    """Divide (this - trivial exec) by 200 for the cost of one `tools.search` in the guest."""
    result = benchmark.pedantic(sized.exec, args=({"code": SEARCH_CELL},), setup=_pause, rounds=30, warmup_rounds=2)
    assert result["status"] == "completed" and result["value"] > 0


@pytest.fixture(scope="module")
def mcp_session():
    sys_path = str(Path(__file__).resolve().parent.parent / "tests")
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    mcp_servers = pytest.importorskip("mcp_servers")
    with CodeMode({"workers": 1, "mcpServers": {"everything": mcp_servers.everything_server()}}) as cm:
        assert cm.load_mcp_tools() == {"everything": None}
        s = cm.session("mcp")
        assert s.exec({"code": "return await MCP.everything.getSum({a: 1, b: 2})"})["status"] == "completed"
        yield cm, s


TEN_MCP = "for (let i = 0; i < 10; i++) await MCP.everything.getSum({a: i, b: 1}); return 1"


def _ten_direct(cm: CodeMode) -> int:
    for i in range(10):
        cm._mcp.servers.call_tool("everything", "get-sum", {"a": i, "b": 1})
    return 1


@pytest.mark.benchmark(group="mcp")
def test_mcp_ten_calls_through_a_cell(benchmark, mcp_session):
    """The cell, timed; and, paired with each timed round, the same ten calls direct and a
    trivial exec just before it: this machine drifts by more than the overhead between the
    minutes two separate benchmarks run in, so the overhead is the median of paired rounds."""
    cm, s = mcp_session
    result, rounds = _paired_rounds(benchmark, s, lambda: _ten_direct(cm), TEN_MCP, rounds=100)
    assert result["value"] == 1
    overheads = sorted((c - d - t) / 10 for d, t, c in rounds)
    benchmark.extra_info["paired_overhead_per_call_s"] = overheads[len(overheads) // 2]


@pytest.mark.benchmark(group="mcp")
def test_mcp_ten_calls_direct_with_the_sdk_client(benchmark, mcp_session):
    """The same ten calls through the SDK client (codemode's McpServers wraps mcp.Client)."""
    cm, _ = mcp_session
    assert benchmark.pedantic(_ten_direct, args=(cm,), setup=_pause, rounds=100) == 1


@pytest.mark.benchmark(group="payload")
def test_model_payload_bytes_per_surface_for_500_tools(benchmark):
    """Not a timing: the bytes each surface sends the model for a 500-tool catalog (extra_info);
    the timed part is rendering the code surface."""
    with _catalog_codemode(500) as cm:
        sizes = cm.payload_telemetry()
        benchmark.extra_info.update({f"payload_bytes_{k}": v for k, v in sizes.items()})
        benchmark(cm.model_tools, "code")
    assert sizes["code"] <= sizes["direct"] * 0.10
