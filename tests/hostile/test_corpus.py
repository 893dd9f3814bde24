"""Runs every cell of the hostile corpus: the exact outcome, then a plain exec in the same CodeMode."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from codemode import CodeMode

from .corpus import BASE_CONFIG, CORPUS, TAGS, Cell

RECOVERY = "return 40 + 2"
DISCOVER = os.environ.get("CODEMODE_CORPUS_DISCOVER") == "1"


class Claim(msgspec.Struct):
    id: str
    paid: bool


def install_tools(cm: CodeMode) -> None:
    """The host tools a corpus cell may call (``Cell.tools`` names them)."""

    @cm.tool
    def echo(value: Any = None) -> Any:
        return value

    @cm.tool
    async def never() -> None:
        await asyncio.sleep(3600)

    @cm.tool
    def nan() -> Any:
        return math.nan

    @cm.tool
    def inf() -> Any:
        return [math.inf, -math.inf]

    @cm.tool
    def nan_dict() -> Any:
        return {"a": {"b": [math.nan]}}

    @cm.tool
    def surrogate() -> Any:
        return "\ud800x"

    @cm.tool
    def raw_bytes() -> Any:
        return b"\xff\xfe\x00"

    @cm.tool
    def py_object() -> Any:
        return object()

    @cm.tool
    def py_set() -> Any:
        return {1, 2}

    @cm.tool
    def deep(n: int) -> Any:
        v: Any = 0
        for _ in range(n):
            v = [v]
        return v

    @cm.tool
    def big(n: int) -> Any:
        return "x" * n

    @cm.tool
    def huge_int() -> Any:
        return 10**400

    @cm.tool
    def raises() -> Any:
        raise RuntimeError("tool failed")

    @cm.tool
    def liar() -> list[Claim]:
        return [{"id": 1, "paid": "nope"}]  # type: ignore[list-item]


def config_of(cell: Cell) -> dict[str, Any]:
    return {**BASE_CONFIG, **(cell.config or {})}


@pytest.fixture(scope="module")
def pool() -> Iterator[dict[str, CodeMode]]:
    """One shared CodeMode per distinct config, for the cells that do not kill workers."""
    made: dict[str, CodeMode] = {}
    yield made
    for cm in made.values():
        cm.close()


def codemode_for(cell: Cell, pool: dict[str, CodeMode], own: list[CodeMode]) -> CodeMode:
    config = config_of(cell)
    if cell.isolated:
        cm = CodeMode(config)
        install_tools(cm)
        own.append(cm)
        return cm
    key = msgspec.json.encode(config, order="sorted").decode()
    if key not in pool:
        pool[key] = CodeMode(config)
        install_tools(pool[key])
    return pool[key]


def test_corpus_is_well_formed() -> None:
    names = [c.name for c in CORPUS]
    assert len(names) == len(set(names))
    assert len(CORPUS) >= 150
    for cell in CORPUS:
        assert cell.tags and set(cell.tags) <= set(TAGS), cell.name
        assert cell.expect_status in ("completed", "failed", "waiting"), cell.name


@pytest.mark.parametrize("cell", CORPUS, ids=[c.name for c in CORPUS])
def test_cell(cell: Cell, pool: dict[str, CodeMode]) -> None:
    own: list[CodeMode] = []
    try:
        cm = codemode_for(cell, pool, own)
        session = cm.session("hostile-" + cell.name)
        killed = cm.inspect().workers_killed
        result = session.exec({"code": cell.code})
        if result["status"] == "waiting":
            session.cancel(result["runId"])
        if DISCOVER:
            shown = {k: v for k, v in result.items() if k != "telemetry"}
            print(f"\nDISCOVER {cell.name}: {str(shown)[:600]}")
        assert result["status"] == cell.expect_status, result
        assert result.get("code") == cell.expect_code, result
        if cell.expect_error_contains is not None:
            assert cell.expect_error_contains in result["error"], result
        if cell.expect_value is not msgspec.UNSET:
            assert result["value"] == cell.expect_value, result
        if not cell.isolated:
            # A shared pool must never lose a worker to a cell; those cells are marked isolated.
            assert cm.inspect().workers_killed == killed, "cell killed a worker of the shared pool"
        after = session.exec({"code": RECOVERY})
        assert after["status"] == "completed", after
        assert after["value"] == 42
    finally:
        for c in own:
            c.close()
