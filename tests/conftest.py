"""Shared fixtures for the codemode test suite.

Every ``CodeMode`` spawns worker processes, so suites share one per module where the tests
cannot disturb each other, and tests that break the pool on purpose build their own through
``make_codemode`` (closed at teardown).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from codemode import CodeMode, Session, supervisor, tool_starts
from codemode.namespaces import NamespaceRegistration, namespace_tool
from postgres import database_target, postgres_server

__all__ = ["database_target", "postgres_server"]  # (fixtures of `postgres`, for every test module)

RECOVERY_CELL = "return 40 + 2"


@pytest.fixture
def make_codemode() -> Iterator[Callable[..., CodeMode]]:
    """Builds ``CodeMode`` instances that are closed when the test ends."""
    made: list[CodeMode] = []

    def make(config: dict[str, Any] | None = None, **options: Any) -> CodeMode:
        cm = CodeMode(config, **options)
        made.append(cm)
        return cm

    yield make
    for cm in made:
        cm.close()


@pytest.fixture
def unhurried_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leaseholder reads its worker's reply however long it takes (`Supervisor._write_and_look`
    bounds the read at ``SPIN_S``, 200 µs, then the step goes the general way), and a sync tool
    counts as quick up to a second (`ToolStarter.quick`): for tests that pin which way a step
    went, which a loaded machine (a worker slower than 200 µs, CI once) must not change."""
    monkeypatch.setattr(supervisor, "SPIN_S", 30.0)
    monkeypatch.setattr(tool_starts, "QUICK_TOOL_S", 1.0)


@pytest.fixture(scope="module")
def cm() -> Iterator[CodeMode]:
    """A plain shared CodeMode: one worker, a generous timeout, no tools."""
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as codemode:
        yield codemode


@pytest.fixture
def session(cm: CodeMode) -> Session:
    return cm.session("test")


def exec_js(session: Session, code: str, language: str = "javascript") -> dict[str, Any]:
    return session.exec({"code": code, "language": language})


@pytest.fixture
def run_js() -> Callable[..., dict[str, Any]]:
    """``run_js(session, code, language="javascript")`` -> the exec result dict."""
    return exec_js


@pytest.fixture
def assert_recovers() -> Callable[[Session], None]:
    """Asserts that a plain cell still completes on ``session`` (the pool survived)."""

    def check(session: Session) -> None:
        result = exec_js(session, RECOVERY_CELL)
        assert result["status"] == "completed", result
        assert result["value"] == 42

    return check


@pytest.fixture
def gated_namespace(
    make_codemode: Callable[..., CodeMode],
) -> Iterator[Callable[..., tuple[CodeMode, threading.Event]]]:
    """``make(read_only=False)`` -> ``(cm, gate)``: a namespace ``Slow.fetch(key)`` over a tool
    that answers only once ``gate`` is set, so it is still pending at the 150 ms exec deadline.
    The gates open at teardown."""
    gates: list[threading.Event] = []

    def make(read_only: bool = False) -> tuple[CodeMode, threading.Event]:
        gate = threading.Event()
        gates.append(gate)
        cm = make_codemode({"workers": 1, "timeoutMs": 150})

        @cm.tool(owner="slow", read_only=read_only)
        async def slow_fetch(key: str) -> str:
            while not gate.is_set():
                await asyncio.sleep(0.005)
            return f"fetched {key}"

        registration = NamespaceRegistration(
            id="slow-ns",
            global_name="Slow",
            description="Slow helpers.",
            required_tool_names=("slow_fetch",),
            create_scope=lambda ctx: {"fetch": namespace_tool("slow_fetch", lambda args: {"key": args[0]})},
        )
        cm.register_namespace("slow", registration)
        return cm, gate

    yield make
    for gate in gates:
        gate.set()
