"""codemode's own numbers (DESIGN.md §12), measured beside the baselines in test_baselines.py.

Two views of a warm exec:
* ``idle``: pedantic rounds with a short pause before each (not timed), so the worker has built
  its next runtime — the latency a model-driven host sees, whose execs are turns apart;
* ``back-to-back``: pytest-benchmark's default tight loop — sustained throughput, where the
  worker's rebuild of the next runtime (~150-250 µs of CPU) competes with the next exec.
``benches/report.py`` turns the JSON of one run into the README table and its ratios.
"""

from __future__ import annotations

import time

import pytest

from codemode import CodeMode

GAP_S = 0.002
TEN_CALLS = "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t"


def _pause() -> None:
    time.sleep(GAP_S)


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
    result = benchmark.pedantic(
        session.exec, args=({"code": "return 1 + 1"},), setup=_pause, rounds=400, warmup_rounds=20
    )
    assert result["value"] == 2


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


@pytest.mark.benchmark(group="cold")
def test_first_exec_on_new_codemode(benchmark):
    """A new ``CodeMode`` (worker spawn included), its first exec, and close."""

    def first() -> object:
        with CodeMode({"workers": 1}) as cm:
            return cm.session().exec({"code": "return 1 + 1"})["value"]

    assert benchmark.pedantic(first, rounds=10, warmup_rounds=1) == 2
