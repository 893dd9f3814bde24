"""Shared fixtures for the codemode test suite.

Every ``CodeMode`` spawns worker processes, so suites share one per module where the tests
cannot disturb each other, and tests that break the pool on purpose build their own through
``make_codemode`` (closed at teardown).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from codemode import CodeMode, Session

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
