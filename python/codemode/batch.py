"""Batches of cells, for benchmark suites: ``codemode run cells.jsonl`` and ``CodeMode.run_many``.

A suite runs thousands of cells and compares one run of them with the next, line by line. So a
batch differs from a conversation in three ways:

- **Every line is final.** No model is there to call ``wait``: a cell that ends ``waiting`` (tool
  calls still running at its deadline, or ``yield_control``) is carried on with ``wait`` until it
  completes or fails, and its outputs of every step are joined. The batch cannot decide for the
  cell only where a person must: a run whose pending calls all wait for an approval, or one that
  yielded control ``MAX_YIELDS`` times (a batch answers ``yield_control`` with nothing), ends
  its line as ``waiting``, the run left suspended for its host to ``approve``, ``wait`` or
  ``cancel``.
- **Results come in completion order**, each with its cell's ``id``, at most ``concurrency``
  cells running at once (a slow cell does not hold back the lines of the quick ones).
- **A seed makes runs comparable.** ``seed=S`` gives each cell its own seed derived from ``S``
  and the cell's id (never from its place in the completion order, or the concurrency), so a
  cell's ``Math.random`` sequence and its clock are the same in every run with ``S`` (a seeded
  run's ``Date`` is fixed: `runs.fixed_clock_start`).

Each cell runs in its own session (``batch:<id>``) unless it names one: its ``store`` values
and its share of suspended runs are its own, so no cell sees what another stored before it (which
would make a line depend on the completion order). Cells that name one session share it.

    cells.jsonl --load_cells--> [Cell] --run_many(cm, concurrency=N, seed=S)-->
        semaphore(N) --> session.exec_async(seed=cell_seed(S, id))
                         while waiting and decidable: session.wait_async
                     --> CellResult(id, result, waits, seed)   (completion order)
                     --> one JSON line each (codemode run)
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import msgspec

from .errors import BatchError
from .runs import MAX_SUSPENDED_RUNS

if TYPE_CHECKING:
    from .session import CodeMode

__all__ = ["MAX_YIELDS", "Cell", "CellResult", "cell_seed", "load_cells", "run_many", "write_lines"]

#: ``yield_control`` calls a batch answers (with nothing) per cell before it leaves the run
#: ``waiting``: a cell that yields in a loop would otherwise never end its line.
MAX_YIELDS = 100

#: Problems one ``BatchError`` lists before it says how many more there are.
_PROBLEMS_SHOWN = 10

#: Seconds between two redraws of the progress line (a terminal need not show every cell).
_PROGRESS_EVERY_S = 0.1

CellId = str | int


class Cell(msgspec.Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True, frozen=True):
    """One cell of a batch, as one JSONL line holds it: ``{"code": "...", "language"?: ...,
    "id"?: ..., "session"?: ..., "agentRun"?: ..., "restartSafe"?: ...}``."""

    code: str
    language: Literal["javascript", "typescript"] = "javascript"
    #: Echoed on the cell's result; by default its 1-based position (a file's line number).
    id: CellId | None = None
    #: The session it runs in; by default one of its own, ``batch:<id>``.
    session: str | None = None
    agent_run: str | None = None
    restart_safe: bool = False


class CellResult(msgspec.Struct, frozen=True):
    """A cell's final result: the spec's result dict (``status``, ``value``/``error``, the
    ``output`` of every step, the last step's ``telemetry`` with ``durationMs`` summed over the
    steps), with the ``wait``s it took and its seed."""

    id: CellId
    result: dict[str, Any]
    waits: int
    #: The seed its run used, when the batch was given one (else each run drew its own).
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The cell's JSON line: ``{"id", **result, "waits", "seed"?}``."""
        line: dict[str, Any] = {"id": self.id, **self.result, "waits": self.waits}
        if self.seed is not None:
            line["seed"] = self.seed
        return line


def cell_seed(seed: int, cell_id: CellId) -> int:
    """The seed of cell ``cell_id`` in a batch seeded with ``seed``: 63 bits of a hash of both
    (``1`` and ``"1"`` are different ids, and get different seeds)."""
    text = msgspec.json.encode([seed, cell_id])
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def load_cells(path: Path) -> list[Cell]:
    """The cells of a JSONL file, one a line (blank lines skipped), each ``id`` defaulting to its
    line number. A line that is not a cell, or repeats an id, is a ``BatchError`` naming the line
    and what is wrong with it (every such line, so one run of the file finds them all)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BatchError(f"cannot read the cells file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise BatchError(f"cannot read the cells file {path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    decoder = msgspec.json.Decoder(Cell)
    cells: list[tuple[str, Cell]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cells.append((f"line {number}", _with_id(decoder.decode(line), number)))
        except msgspec.DecodeError as e:
            problems.append(f"line {number}: {e}")
    problems += _duplicates(cells)
    _raise_if(problems, str(path))
    return [cell for _, cell in cells]


async def run_many(
    cm: CodeMode,
    cells: Iterable[Cell | Mapping[str, Any]],
    *,
    concurrency: int = 8,
    seed: int | None = None,
) -> AsyncGenerator[CellResult, None]:
    """Runs ``cells`` (``Cell``s, or dicts as a JSONL line holds them), at most ``concurrency``
    at once, and yields each one's final ``CellResult`` as it finishes (see the module
    docstring). Every cell is checked before any runs: a malformed one, or a repeated id, is a
    ``BatchError``. Closing the iterator early (``aclose()``, or ``contextlib.aclosing`` around
    an ``async for`` that breaks) cancels the cells still running and their tool calls."""
    if not 1 <= concurrency <= MAX_SUSPENDED_RUNS:
        # Each running cell may hold one of the suspended runs a CodeMode keeps.
        raise ValueError(f"concurrency must be from 1 to {MAX_SUSPENDED_RUNS}, got {concurrency}")
    todo = _checked(cells)
    gate = asyncio.Semaphore(concurrency)

    async def bounded(cell: Cell) -> CellResult:
        async with gate:
            return await _run_cell(cm, cell, seed)

    tasks = [asyncio.ensure_future(bounded(cell)) for cell in todo]
    try:
        for finished in asyncio.as_completed(tasks):
            yield await finished
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_cell(cm: CodeMode, cell: Cell, batch_seed: int | None) -> CellResult:
    """One cell from ``exec`` through every ``wait`` it needs, to its final result."""
    assert cell.id is not None  # (`_checked` gave every cell one)
    session = cm.session(_session_id(cell), agent_run=cell.agent_run)
    seed = None if batch_seed is None else cell_seed(batch_seed, cell.id)
    args = {"code": cell.code, "language": cell.language, "restartSafe": cell.restart_safe}
    result = await session.exec_async(args, seed=seed)
    output = list(result.get("output", []))
    duration_ms = result["telemetry"]["durationMs"]
    waits = yields = 0
    while result["status"] == "waiting" and not _undecidable(result, yields):
        yields += result["reason"] == "yield"
        result = await session.wait_async({"runId": result["runId"]})
        output += result.get("output", [])
        duration_ms += result["telemetry"]["durationMs"]
        waits += 1
    if output:
        result["output"] = output
    result["telemetry"]["durationMs"] = duration_ms
    return CellResult(id=cell.id, result=dict(result), waits=waits, seed=seed)


def write_lines(
    cm: CodeMode,
    cells: list[Cell],
    out: TextIO,
    *,
    concurrency: int = 8,
    seed: int | None = None,
    progress: TextIO | None = None,
) -> None:
    """``codemode run``: runs ``cells`` and writes each final result to ``out`` as one JSON line
    (``CellResult.to_dict``) as it finishes, with a progress line on ``progress`` if given. A run
    left ``waiting`` (see the module docstring) is cancelled once its line is out: nobody reading
    lines can approve it."""
    asyncio.run(_write_lines(cm, cells, out, concurrency, seed, progress))


async def _write_lines(
    cm: CodeMode, cells: list[Cell], out: TextIO, concurrency: int, seed: int | None, progress: TextIO | None
) -> None:
    counter = _Progress(progress, len(cells)) if progress is not None else None
    scopes = {cell.id: (_session_id(cell), cell.agent_run) for cell in cells}
    async for done in run_many(cm, cells, concurrency=concurrency, seed=seed):
        out.write(msgspec.json.encode(done.to_dict()).decode() + "\n")
        out.flush()
        if done.result["status"] == "waiting":
            cm.cancel(scopes[done.id], done.result["runId"])
        if counter is not None:
            counter.count(done.result["status"])
    if counter is not None:
        counter.close()


class _Progress:
    """A one-line counter redrawn with ``\\r`` (``12/50 cells, 1 failed``): for a terminal."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self._stream = stream
        self._total = total
        self._done = self._failed = 0
        self._drawn_at = float("-inf")

    def count(self, status: str) -> None:
        self._done += 1
        self._failed += status != "completed"
        now = time.monotonic()
        if now - self._drawn_at >= _PROGRESS_EVERY_S or self._done == self._total:
            self._drawn_at = now
            self._draw()

    def close(self) -> None:
        self._draw()
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self) -> None:
        self._stream.write(f"\r{self._done}/{self._total} cells, {self._failed} not completed")
        self._stream.flush()


def _session_id(cell: Cell) -> str:
    return cell.session if cell.session is not None else f"batch:{cell.id}"


def _undecidable(waiting: Mapping[str, Any], yields: int) -> bool:
    """Whether only a person could carry this ``waiting`` result on: every pending call waits
    for an approval, or the cell yields once more after ``MAX_YIELDS``."""
    if waiting["reason"] == "yield":
        return yields >= MAX_YIELDS
    pending = waiting.get("pendingToolCalls", [])
    return bool(pending) and all(call.get("approval") == "pending" for call in pending)


def _checked(cells: Iterable[Cell | Mapping[str, Any]]) -> list[Cell]:
    """``cells`` as ``Cell``s with ids (by default each one's 1-based position), or a
    ``BatchError`` naming every malformed cell and repeated id."""
    checked: list[tuple[str, Cell]] = []
    problems: list[str] = []
    for position, cell in enumerate(cells, start=1):
        try:
            parsed = cell if isinstance(cell, Cell) else msgspec.convert(cell, Cell)
            checked.append((f"cell {position}", _with_id(parsed, position)))
        except msgspec.ValidationError as e:
            problems.append(f"cell {position}: {e}")
    problems += _duplicates(checked)
    _raise_if(problems, "the batch")
    return [cell for _, cell in checked]


def _with_id(cell: Cell, position: int) -> Cell:
    return cell if cell.id is not None else msgspec.structs.replace(cell, id=position)


def _duplicates(cells: list[tuple[str, Cell]]) -> list[str]:
    """A problem for each (where, cell) whose id an earlier cell has: ids are how the lines of
    two runs meet."""
    first: dict[str, str] = {}
    problems = []
    for where, cell in cells:
        key = msgspec.json.encode(cell.id).decode()
        if key in first:
            problems.append(f"{where}: id {key} repeats that of {first[key]}")
        else:
            first[key] = where
    return problems


def _raise_if(problems: list[str], where: str) -> None:
    if not problems:
        return
    shown = "; ".join(problems[:_PROBLEMS_SHOWN])
    more = len(problems) - _PROBLEMS_SHOWN
    raise BatchError(f"{where}: {shown}" + (f"; and {more} more" if more > 0 else ""))
