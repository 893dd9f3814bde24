"""Priming: a worker that is up and idle is configured with the current catalog before a run
needs it (`Supervisor.prime`, `Supervisor.catalog_changed`, `FrameQueue.prime`), so it builds
that catalog's engine (and loads the search model) while the model is still thinking, and the
next cell sends only its `Start`. Whatever the timing, a cell sees the catalog of its exec."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from codemode import CodeMode
from codemode import workers as workers_module
from codemode.supervisor import PRIME_DELAY_S


@pytest.fixture
def sent(monkeypatch):
    """The kinds of the frames each write to a worker carried, in order."""
    log: list[list[str]] = []
    lock = threading.Lock()
    real = workers_module.WorkerProcess.send

    def send(self, frames, deadline):
        with lock:
            log.append([type(f).__name__ for f in frames])
        return real(self, frames, deadline)

    monkeypatch.setattr(workers_module.WorkerProcess, "send", send)
    return log


def _settle(cm: CodeMode, timeout: float = 10.0) -> None:
    """Waits until every worker is idle (or still starting, with nothing but its configuration
    sent) and configured with the current catalog, that configuration written (a prime marks
    the lane configured under the lock, then writes outside it; the first look-up of a
    searched catalog loads the search model: that takes a while)."""
    fleet = cm._supervisor._fleet
    current = cm.runner._factory.configuration()[0].fingerprint
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with fleet.lock:
            if fleet.lanes and all(
                fleet.frames.primable(lane)
                and not (lane.outbox or lane.writing)
                and getattr(lane.configured, "fingerprint", None) == current
                for lane in fleet.lanes
            ):
                return
        time.sleep(0.005)
    raise AssertionError("workers never settled")


def test_a_worker_is_configured_with_tools_added_after_the_constructor_before_the_first_cell(sent):
    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def double(x: int) -> int:
            return 2 * x

        time.sleep(PRIME_DELAY_S * 4)
        _settle(cm)
        configured = [frames for frames in sent if "Configure" in frames]
        assert configured, sent
        sent.clear()
        assert cm.session().exec({"code": "return await tools.double({x: 21})"})["value"] == 42
        # The cell found its catalog there: its frames carry no Configure.
        assert sent and all("Configure" not in frames for frames in sent), sent


def test_a_burst_of_tools_is_configured_once_when_it_is_over(sent):
    with CodeMode({"workers": 1}) as cm:
        _settle(cm)
        sent.clear()
        added = []
        for n in range(20):
            cm.tool(lambda x, n=n: x + n, name=f"add_{n}", description="adds", input_schema={"type": "object"})
            added.append(time.monotonic())
        time.sleep(PRIME_DELAY_S * 6)
        _settle(cm)
        # Once the catalog has been unchanged for PRIME_DELAY_S: a pause that long inside the
        # burst (a full garbage collection, a busy CI machine) rightly splits it in two.
        pauses = sum(b - a >= PRIME_DELAY_S for a, b in itertools.pairwise(added))
        assert 1 <= sent.count(["Configure"]) <= 1 + pauses, (sent, pauses)
        sent.clear()
        assert cm.session().exec({"code": "return await tools.add_19({x: 1})"})["value"] == 20
        assert all("Configure" not in frames for frames in sent), sent


def test_a_tool_added_just_before_a_cell_is_there_for_it():
    # However the re-prime and the exec interleave, the exec's own catalog wins.
    with CodeMode({"workers": 1}) as cm:
        s = cm.session()
        for n in range(30):
            cm.tool(lambda x, n=n: x * n, name=f"times_{n}", description="multiplies", input_schema={"type": "object"})
            time.sleep((n % 3) * PRIME_DELAY_S / 2)
            assert s.exec({"code": f"return await tools.times_{n}({{x: 2}})"})["value"] == 2 * n


def test_a_failing_configuration_leaves_the_cells_to_configure_their_worker(caplog):
    with CodeMode({"workers": 1}) as cm:
        _settle(cm)
        supervisor = cm._supervisor
        real = supervisor._fleet.primer

        def broken():
            raise RuntimeError("no catalog now")

        supervisor._fleet.primer = broken
        with caplog.at_level(logging.ERROR, logger="codemode"):

            @cm.tool
            def triple(x: int) -> int:
                return 3 * x

            time.sleep(PRIME_DELAY_S * 6)
        assert any("configuring a new worker early failed" in r.getMessage() for r in caplog.records)
        supervisor._fleet.primer = real
        assert cm.session().exec({"code": "return await tools.triple({x: 2})"})["value"] == 6


def test_no_priming_after_close():
    cm = CodeMode({"workers": 1})
    _settle(cm)
    cm.close()

    @cm.tool
    def late(x: int) -> int:
        return x

    time.sleep(PRIME_DELAY_S * 4)
    assert not cm._supervisor._fleet.lanes
