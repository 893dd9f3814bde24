"""Batches for benchmark suites: ``codemode run cells.jsonl`` and ``CodeMode.run_many``.

The command runs as a user runs it (a subprocess, a tools module on ``PYTHONPATH``); what it
writes is one JSON line per cell, in completion order, each final: a cell whose tools outlast its
deadline, or that yields, is carried through ``wait``s. With a seed, two runs of one file give
every cell the same ``Math.random`` whatever the concurrency and the order cells finish in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode
from codemode.batch import MAX_YIELDS, Cell, cell_seed, load_cells
from codemode.errors import BatchError

#: The tools module a batch's ``--tools batch_tools:TOOLS`` loads.
TOOLS_MODULE = '''
import asyncio
from pathlib import Path


async def sleep_ms(ms: int) -> int:
    """Answers after ``ms`` milliseconds (a tool that outlasts a short deadline)."""
    await asyncio.sleep(ms / 1000)
    return ms


async def after_lines(path: str, lines: int) -> int:
    """Answers once the file at ``path`` holds ``lines`` lines: the cell that calls it finishes
    only after that many other cells' results were written."""
    while len(Path(path).read_text().splitlines()) < lines:
        await asyncio.sleep(0.01)
    return lines


TOOLS = [sleep_ms, after_lines]
'''


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    (tmp_path / "batch_tools.py").write_text(TOOLS_MODULE)
    return tmp_path


def write_cells(path: Path, cells: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(cell) + "\n" for cell in cells))
    return path


def codemode_run(*argv: str | Path, tools_dir: Path, stderr: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tools_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "codemode", "run", *map(str, argv), "--tools", "batch_tools:TOOLS"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=120,
    )


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_run_writes_one_line_per_cell_in_completion_order(tools_dir: Path, tmp_path: Path):
    out = tmp_path / "results.jsonl"
    cells = write_cells(
        tmp_path / "cells.jsonl",
        [
            {"id": "slow", "code": f"return await tools.after_lines({{path: {json.dumps(str(out))}, lines: 3}})"},
            {"code": "return 1"},
            {"code": "return 'two'", "language": "typescript"},
            {"code": "throw new Error('three')"},
        ],
    )
    proc = codemode_run(cells, "--concurrency", "4", "--out", out, tools_dir=tools_dir)
    assert proc.returncode == 0, proc.stderr
    lines = lines_of(out.read_text())
    # The first cell waits for the other three lines: with 4 at once, it is written last.
    assert [line["id"] for line in lines][-1] == "slow"
    assert sorted(str(line["id"]) for line in lines[:3]) == ["2", "3", "4"]
    by_id = {line["id"]: line for line in lines}
    assert by_id["slow"]["value"] == 3
    assert by_id[2]["value"] == 1 and by_id[3]["value"] == "two"
    assert by_id[4]["status"] == "failed" and by_id[4]["error"] == "Error: three"
    assert all(line["telemetry"]["catalogSize"] == 2 for line in lines)
    assert by_id["slow"]["telemetry"]["toolCalls"] == 1
    assert proc.stdout == ""


def test_run_carries_suspended_cells_through_wait_to_their_end(tools_dir: Path, tmp_path: Path):
    cells = write_cells(
        tmp_path / "cells.jsonl",
        [
            {
                "id": "tool",
                "code": "console.log('before'); const v = await tools.sleep_ms({ms: 600}); "
                "console.log('after'); return v",
            },
            {"id": "yield", "code": "await yield_control('check'); await yield_control('again'); return 'yielded'"},
        ],
    )
    proc = codemode_run(cells, "--timeout-ms", "150", tools_dir=tools_dir)
    assert proc.returncode == 0, proc.stderr
    by_id = {line["id"]: line for line in lines_of(proc.stdout)}
    tool = by_id["tool"]
    assert tool["status"] == "completed" and tool["value"] == 600
    assert tool["waits"] >= 1
    # The outputs of the exec and of every wait, in order.
    assert [o["text"] for o in tool["output"]] == ["before", "after"]
    assert "runId" not in tool
    assert by_id["yield"]["status"] == "completed" and by_id["yield"]["value"] == "yielded"
    assert by_id["yield"]["waits"] == 2


def test_run_refuses_a_malformed_file_naming_each_bad_line(tools_dir: Path, tmp_path: Path):
    cells = tmp_path / "cells.jsonl"
    cells.write_text(
        '{"code": "return 1"}\n'
        "not json\n"
        "\n"
        '{"code": 2}\n'
        '{"code": "return 1", "langauge": "typescript"}\n'
        '{"code": "return 1", "id": 1}\n'
    )
    proc = codemode_run(cells, tools_dir=tools_dir)
    assert proc.returncode == 2
    assert proc.stdout == ""  # nothing ran
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"codemode: error: {cells}: line 2: JSON is malformed")
    assert "line 4: Expected `str`, got `int` - at `$.code`" in line
    assert "line 5: Object contains unknown field `langauge`" in line
    assert "line 6: id 1 repeats that of line 1" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.jsonl"], "cannot read the cells file missing.jsonl: No such file or directory"),
        (["cells.jsonl", "--concurrency", "0"], "--concurrency must be from 1 to 64, got 0"),
        (["cells.jsonl", "--tools", "nowhere:TOOLS"], "--tools nowhere:TOOLS: cannot import nowhere"),
    ],
)
def test_run_usage_errors_are_one_line_and_exit_2(tools_dir: Path, argv: list[str], message: str):
    write_cells(tools_dir / "cells.jsonl", [{"code": "return 1"}])
    proc = subprocess.run(
        [sys.executable, "-m", "codemode", "run", *argv],
        cwd=tools_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("codemode: error: " + message)


def test_run_warns_of_an_mcp_server_it_cannot_start_and_runs_the_cells(tools_dir: Path, tmp_path: Path):
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"gone": {"command": str(tmp_path / "no-such-server")}}}))
    cells = write_cells(tmp_path / "cells.jsonl", [{"code": "return 1"}])
    proc = codemode_run(cells, "--config", servers, tools_dir=tools_dir)
    assert proc.returncode == 0
    assert "codemode: warning: MCP server 'gone' is unavailable: " in proc.stderr
    assert [line["value"] for line in lines_of(proc.stdout)] == [1]


def test_run_draws_progress_only_on_a_terminal(tools_dir: Path, tmp_path: Path):
    cells = write_cells(tmp_path / "cells.jsonl", [{"code": f"return {i}"} for i in range(3)])
    piped = codemode_run(cells, tools_dir=tools_dir)
    assert piped.returncode == 0 and piped.stderr == ""
    assert len(piped.stdout.splitlines()) == 3

    controller, terminal = pty.openpty()
    try:
        shown = codemode_run(cells, tools_dir=tools_dir, stderr=terminal)
        os.close(terminal)
        drawn = b""
        while chunk := _read_or_empty(controller):
            drawn += chunk
    finally:
        os.close(controller)
    assert shown.returncode == 0
    assert len(shown.stdout.splitlines()) == 3  # the results stay on stdout, alone
    assert drawn.decode().endswith("\r3/3 cells, 0 not completed\r\n")


def _read_or_empty(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # (EIO once the terminal's other end is closed)
        return b""


def test_same_seed_gives_the_same_random_numbers_and_clock_line_by_line_at_any_concurrency(
    tools_dir: Path, tmp_path: Path
):
    cells = write_cells(
        tmp_path / "cells.jsonl",
        [{"code": "return [Math.random(), Math.random(), Date.now(), new Date().toISOString()]"} for _ in range(50)],
    )

    def values(*argv: str) -> list[Any]:
        proc = codemode_run(cells, *argv, tools_dir=tools_dir)
        assert proc.returncode == 0, proc.stderr
        return [line["value"] for line in sorted(lines_of(proc.stdout), key=lambda line: line["id"])]

    one_at_a_time = values("--seed", "7", "--concurrency", "1")
    assert values("--seed", "7", "--concurrency", "8") == one_at_a_time
    assert len({tuple(v) for v in one_at_a_time}) == 50  # each cell its own sequence
    other_seed = values("--seed", "8", "--concurrency", "8")
    assert all(a[:3] != b[:3] for a, b in zip(one_at_a_time, other_seed, strict=True))
    unseeded = values("--concurrency", "8")
    assert all(a[0] != b[0] and a[2] != b[2] for a, b in zip(one_at_a_time, unseeded, strict=True))


def test_cell_seed_depends_on_the_batch_seed_and_the_cell_id_only():
    assert cell_seed(7, 1) == cell_seed(7, 1)
    assert len({cell_seed(7, 1), cell_seed(7, "1"), cell_seed(8, 1), cell_seed(7, 2)}) == 4
    assert all(0 <= cell_seed(s, i) < 1 << 63 for s in (-1, 0, 1 << 80) for i in (0, "x"))


def test_load_cells_gives_each_cell_its_line_number_as_default_id(tmp_path: Path):
    path = tmp_path / "cells.jsonl"
    path.write_text('{"code": "return 1"}\n\n{"code": "return 2", "id": "b", "session": "s", "agentRun": "r"}\n')
    assert load_cells(path) == [Cell(code="return 1", id=1), Cell(code="return 2", id="b", session="s", agent_run="r")]


@pytest.fixture(scope="module")
def batch_cm():
    with CodeMode({"workers": 2, "timeoutMs": 2000}, require_approval=["deploy"]) as cm:

        @cm.tool
        def deploy(env: str) -> str:
            return f"deployed {env}"

        yield cm


def test_run_many_yields_final_results_in_completion_order(batch_cm: CodeMode):
    released = asyncio.Event()

    @batch_cm.tool
    async def gate() -> str:
        await released.wait()
        return "released"

    async def run() -> list[Any]:
        seen = []
        cells = [{"code": "return await tools.gate()", "id": "gated"}, {"code": "return 1"}, {"code": "return 2"}]
        async for done in batch_cm.run_many(cells, concurrency=3):
            seen.append((done.id, done.result["status"], done.result.get("value")))
            if len(seen) == 2:
                released.set()  # the gated cell can only end after both others did
        return seen

    try:
        seen = asyncio.run(run())
    finally:
        batch_cm.remove_tool("host:core:gate")
    assert seen[-1] == ("gated", "completed", "released")
    assert sorted(seen[:2]) == [(2, "completed", 1), (3, "completed", 2)]


def test_closing_run_many_early_cancels_the_cells_still_running(batch_cm: CodeMode):
    started, cancelled = asyncio.Event(), asyncio.Event()

    @batch_cm.tool
    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @batch_cm.tool
    async def once_forever_started() -> None:
        await started.wait()  # else the quick cell may end before the stuck one calls its tool

    async def run() -> list[Any]:
        cells = [
            {"code": "return await tools.forever()", "id": "stuck"},
            {"code": "await tools.once_forever_started(); return 1", "id": "quick"},
        ]
        async with contextlib.aclosing(batch_cm.run_many(cells, concurrency=2)) as results:
            first = await anext(results)
        await asyncio.wait_for(cancelled.wait(), 30)
        return [first.id]

    try:
        assert asyncio.run(run()) == ["quick"]
    finally:
        batch_cm.remove_tool("host:core:forever")
        batch_cm.remove_tool("host:core:once_forever_started")
    assert batch_cm.suspended_runs("batch:stuck") == []


def test_run_many_leaves_a_cell_waiting_for_an_approval_waiting(batch_cm: CodeMode):
    async def run() -> list[Any]:
        return [done async for done in batch_cm.run_many([{"code": "return await tools.deploy({env: 'prod'})"}])]

    (done,) = asyncio.run(run())
    assert done.result["status"] == "waiting" and done.waits == 0
    assert done.result["pendingToolCalls"][0]["approval"] == "pending"
    # Still suspended, in the cell's own session: its host may decide and go on.
    session = batch_cm.session("batch:1")
    session.approve(done.result["runId"], "call_1", True)
    assert session.wait({"runId": done.result["runId"]})["value"] == "deployed prod"


def test_run_many_answers_a_cell_that_yields_forever_only_so_often(batch_cm: CodeMode):
    async def run() -> list[Any]:
        cells = [{"code": "for (;;) await yield_control('again')"}]
        return [done async for done in batch_cm.run_many(cells)]

    (done,) = asyncio.run(run())
    assert done.result["status"] == "waiting" and done.result["reason"] == "yield"
    assert done.waits == MAX_YIELDS
    assert batch_cm.cancel("batch:1", done.result["runId"])


def test_run_many_checks_every_cell_before_running_any(batch_cm: CodeMode):
    async def run(cells: list[Any], **options: Any) -> list[Any]:
        return [done async for done in batch_cm.run_many(cells, **options)]

    with pytest.raises(BatchError) as refused:
        asyncio.run(
            run([{"code": "return 1", "id": "a"}, {"code": "x", "language": "python"}, {"code": "y", "id": "a"}])
        )
    assert str(refused.value) == (
        "the batch: cell 2: Invalid enum value 'python' - at `$.language`; cell 3: id \"a\" repeats that of cell 1"
    )
    with pytest.raises(ValueError, match="concurrency must be from 1 to 64, got 65"):
        asyncio.run(run([], concurrency=65))


def test_exec_async_seed_fixes_math_random(batch_cm: CodeMode):
    session = batch_cm.session("seeded")

    async def draw(seed: int | None) -> Any:
        return (await session.exec_async({"code": "return Math.random()"}, seed=seed))["value"]

    assert asyncio.run(draw(5)) == asyncio.run(draw(5)) != asyncio.run(draw(6))
    with pytest.raises(ValueError, match="seed must be an int from 0 to 2\\*\\*63 - 1, got -1"):
        asyncio.run(draw(-1))
