"""Suspended runs: the run table, and the journal that lets a run resume anywhere.

A run that still waits on tools at its deadline (or calls ``yield_control``) is *suspended*:
its QuickJS runtime stays resident in the worker that ran it (the fast path), and the host keeps
a journal of everything the run consumed — source, seed, limits, every tool call with its input
hash, every batch of results in delivery order, every clock reading. Replaying the journal into
a fresh engine reproduces the runtime exactly (the engine is deterministic given those inputs),
so when the resident runtime is gone — worker crashed, killed, recycled, or the run came from
another process — ``wait`` replays and then goes on live. A replay whose calls differ from the
journal fails with a divergence error instead of guessing.
"""

from __future__ import annotations

import enum
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from .protocol import CallMethod, CallResult, ClockRun, EngineLimits, Start, utf8_len

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .protocol import Configure
    from .workers import Lane

__all__ = [
    "MAX_SUSPENDED_RUNS",
    "Counts",
    "Journal",
    "JournalApproval",
    "JournalCall",
    "Phase",
    "Run",
    "RunLookupError",
    "RunLost",
    "RunTable",
    "Scope",
    "Step",
    "journal_size",
    "new_run_id",
]

#: Suspended runs one ``CodeMode`` keeps at once (the spec's per-process bound).
MAX_SUSPENDED_RUNS = 64

#: Messages the spec gives for runIds that cannot be resumed (all with code ``invalid_input``).
UNAVAILABLE = "code mode run is unavailable or expired."
FOREIGN = "code mode run belongs to a different session."
BUSY = "code mode run is already being resumed."
TOO_MANY = "too many suspended code mode runs."
#: Suspension refused because this session holds its share (``maxSuspendedRunsPerSession``).
TOO_MANY_IN_SESSION = "too many suspended code mode runs in this session (maxSuspendedRunsPerSession {limit})."

#: Whose suspended runs these are: ``(session id, agent run or None)``. A tuple, not a joined
#: string, so no session id can spell another session's scope.
Scope = tuple[str, str | None]


#: Where a seeded run's fixed clock starts: 2025-01-01T00:00:00Z plus the seed's share of a year.
FIXED_CLOCK_EPOCH_MS = 1_735_689_600_000
FIXED_CLOCK_SPAN_MS = 365 * 86_400_000


def fixed_clock_start(seed: int) -> float:
    """A seeded run's first clock reading: the same for the same seed, so two runs of a cell
    with one seed read the same `Date`s (and the same `Math.random`)."""
    return float(FIXED_CLOCK_EPOCH_MS + seed % FIXED_CLOCK_SPAN_MS)


#: Run ids are drawn from the OS, this many at a time: each as unguessable as a fresh
#: ``secrets`` token, for one system call per batch (a token per run cost each exec ~5 µs after
#: an idle gap; a keyed hash of a counter, the way before this, ~1 µs back to back).
RUN_ID_BATCH = 64
#: Drawn and not yet handed out. A forked child drops the parent's: the two would hand out the
#: same ones (hosts forked from one parent share a run store).
_run_ids: list[str] = []

os.register_at_fork(after_in_child=_run_ids.clear)


def new_run_id() -> str:
    """A run's id: unguessable, as a ``runId`` is all a ``wait`` needs besides its session."""
    try:
        return _run_ids.pop()
    except IndexError:
        raw = secrets.token_hex(12 * RUN_ID_BATCH)
        drawn = ["run_" + raw[at : at + 24] for at in range(0, len(raw), 24)]
        run_id = drawn.pop()
        _run_ids.extend(drawn)  # (another thread may be refilling too: more ids, all fresh)
        return run_id


def journal_size(journal: Journal) -> int:
    """The bytes a journal holds that grow with what the run does (payloads and open inputs)."""
    payloads = sum(utf8_len(result.payload) for batch in journal.batches for result in batch)
    return payloads + sum(utf8_len(data) for data in journal.open_inputs.values())


class JournalCall(msgspec.Struct, array_like=True, frozen=True):
    """A tool call the guest made: its engine call id, tool id (as the guest gave it), the
    hash of its input, and the guest API it came from."""

    id: int
    tool: str
    input_hash: str
    method: CallMethod


class JournalApproval(msgspec.Struct, array_like=True, frozen=True):
    """The host's decision on a call that waited for approval (see `approvals`)."""

    ok: bool
    reason: str = ""


class Journal(msgspec.Struct, kw_only=True):
    """Everything needed to re-execute a run deterministically; portable bytes (msgpack)."""

    engine_version: str
    prelude_hash: str
    catalog_fingerprint: str
    limits: EngineLimits
    language: str
    source: str
    seed: int
    run_json: str = "{}"
    #: The fixed clock's first reading, for a run given its seed (reproducible), or None.
    clock_start: float | None = None
    restart_safe: bool = False
    session_id: str = ""
    agent_run: str | None = None
    calls: list[JournalCall] = msgspec.field(default_factory=list)
    #: Result batches in the order they were settled.
    batches: list[list[CallResult]] = msgspec.field(default_factory=list)
    #: Clock readings as runs ``(ms, times read in a row)``, in the order they were read.
    clock_reads: list[ClockRun] = msgspec.field(default_factory=list)
    #: Inputs of calls still in flight at suspension (JSON text), so another process can redo
    #: them; only restart-safe runs (read-only tools) may.
    open_inputs: dict[int, str] = msgspec.field(default_factory=dict)
    #: Decisions on calls that waited for approval, by call id: a call decided once is never
    #: put to the approval callback again, and a rejected one never runs.
    approvals: dict[int, JournalApproval] = msgspec.field(default_factory=dict)

    def start_frame(self, engine_run: int, timeout_ms: float) -> Start:
        """The frame that starts (or, inside a `Replay`, re-executes) this run as engine run
        ``engine_run``."""
        return Start(engine_run, self.source, self.language, timeout_ms, self.seed, self.run_json, self.clock_start)

    def settled_ids(self) -> set[int]:
        return {result.call_id for batch in self.batches for result in batch}

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @staticmethod
    def decode(data: bytes) -> Journal:
        return msgspec.msgpack.decode(data, type=Journal)


class Failure(NamedTuple):
    """How a step failed: an engine's report of it (``code`` None: the cell's own exception,
    with its ``name``, ``message`` and ``stack``) or the host's (a code of the spec's, no stack)."""

    code: str | None
    name: str
    message: str
    stack: str


class Step(msgspec.Struct):
    """What one ``exec`` or ``wait`` call saw of a run (or, while the run is suspended, what an
    advance saw, for the next ``wait`` to report or go on from)."""

    status: str = "running"  # running | completed | failed | suspended
    value: Any = None  # decoded
    failure: Failure | None = None
    reason: str = ""  # when suspended: pending_tools | yield
    store_writes: Any = None  # decoded: {key: value | None}, or None
    outputs: list[tuple[int, Any]] = msgspec.field(default_factory=list)  # kind 1 (json) decoded
    tool_calls: int = 0
    searches: int = 0
    describes: int = 0
    memory_bytes: int = 0
    reports: int = 0
    #: The deadline has had its one settle-floor extension (see `FrameQueue.frame_for`).
    extended: bool = False
    #: ``time.monotonic()`` by which the guest must have parked (its frame's kill time is later).
    deadline: float = 0.0

    @property
    def ended(self) -> bool:
        return self.status != "running"


class Counts(msgspec.Struct):
    """What a run has done over its exec and waits together, for its telemetry."""

    tool_calls: int = 0
    searches: int = 0
    describes: int = 0

    def add(self, step: Step) -> None:
        """Counts in what ``step`` saw."""
        self.tool_calls += step.tool_calls
        self.searches += step.searches
        self.describes += step.describes


class Phase(enum.Enum):
    """Where a run is, as the supervisor sees it."""

    #: Resident in its worker (or, with no lane, to be replayed) and waiting on tools or a `wait`.
    PARKED = "parked"
    #: In its lane's queue: a frame to send once the worker is free.
    QUEUED = "queued"
    #: Its frame is the one the worker is executing.
    RUNNING = "running"
    #: Completed, failed or dropped: no engine anywhere.
    ENDED = "ended"


class Run(msgspec.Struct, eq=False):
    """One run in the host: its journal, its tools, and where its runtime lives. (A struct with
    identity equality: built in C, for every run; hashed by identity in a lane's sets.)"""

    scope: Scope
    journal: Journal
    dispatcher: Dispatcher
    #: Known from the start (a namespace scope is built with it); a `wait` needs it only once
    #: the run is suspended.
    run_id: str
    #: What the journal holds for the host (results, and a restart-safe run's open inputs), in
    #: UTF-8 bytes: bounded by ``maxJournalBytes``, counted in the snapshot (`__post_init__`).
    journal_bytes: int = 0
    #: The worker where the runtime is resident (or queued to be), and its id there; no lane
    #: once it must be replayed.
    lane: Lane | None = None
    engine_run: int = 0
    phase: Phase = Phase.PARKED
    #: In the queue: what to send, ``start`` | ``settle`` | ``replay``, and since when.
    next_frame: str = ""
    queued_at: float = 0.0
    #: The catalog and limits a start or a replay configures its worker with.
    configure: Configure | None = None
    #: Workers placed on since its last report (bounded: a run whose frame kills every worker
    #: it is given fails).
    placements: int = 0
    #: Workers that died before they were ready while it waited for them, since its last
    #: report (bounded: a run whose workers never come up fails, see `Fleet.lane_died`).
    stillborn: int = 0
    #: How long its worker took over its last frame: a run whose frames are quick may have its
    #: next one wait in the pipe behind another's (see `FrameQueue.may_write`).
    drive_s: float = 0.0
    #: The step in progress, and who waits for it (None while suspended: then a result that
    #: lands advances the run, and the next `wait` reports or goes on from its step).
    step: Step = msgspec.field(default_factory=Step)
    waiter: Any = None
    #: Batches of calls handed to `ToolStarter.submit` and not yet started: the run is not
    #: suspended meanwhile (its sync tools may be about to run).
    starting: int = 0
    #: Batches of its sync tools running on a pool for its waiting thread, and when the last
    #: went (see `Waiting.budget`).
    lent: int = 0
    lent_at: float = 0.0
    #: QuickJS memory of the resident runtime, as last reported.
    memory_bytes: int = 0
    #: ``yield_control`` calls waiting for the next ``wait``.
    yields: list[int] = msgspec.field(default_factory=list)
    #: Calls an advance made: they start only with the next `wait` (a run never gets further
    #: than the model asked it to go).
    held: list[tuple[int, str, str]] = msgspec.field(default_factory=list)
    busy: bool = False
    expires_at: float = 0.0
    #: Cancelled or expired: its runtime is dropped, whatever it was doing.
    aborted: bool = False
    #: Cumulative over the run's exec and waits.
    counts: Counts = msgspec.field(default_factory=Counts)
    #: From the cell's ``// @options``: the text budget, and the wall clock of each call.
    output_chars: int | None = None
    #: ``(session id, branch)`` whose store a completed run commits to.
    store_key: tuple[str, str] | None = None
    timeout_ms: int = 10_000
    #: In a shared run store (`codemode.shared_runs`): the suspensions filed (0: not there),
    #: and its calls that have a row there, with the host that runs each.
    stored_version: int = 0
    stored_calls: dict[int, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        journal = self.journal
        if journal.batches or journal.open_inputs:  # (a journal made elsewhere)
            self.journal_bytes = journal_size(journal)

    def snapshot_overrun(self, limit: int) -> str | None:
        """Why this run may not stay suspended under ``maxSnapshotBytes`` (its resident runtime
        plus its journal), or None."""
        size = self.memory_bytes + self.journal_bytes
        if size <= limit:
            return None
        return (
            f"code mode snapshot limit exceeded: {size} bytes (runtime {self.memory_bytes}, journal "
            f"{self.journal_bytes}) over maxSnapshotBytes ({limit})."
        )

    def awaits_only_approvals(self) -> bool:
        """Under the supervisor's lock, for a parked run: every call it has open waits for the
        host's approval."""
        approvals = self.dispatcher.approvals
        if not approvals:
            return False
        waiting = approvals.undecided()
        if not waiting:
            return False
        settled = self.journal.settled_ids()
        return all(c.id in waiting for c in self.journal.calls if c.id not in settled and c.id not in self.yields)

    def pending_calls(self) -> list[dict[str, Any]]:
        """The spec's ``pendingToolCalls``: calls made and not yet settled, oldest first, each
        with the tool it resolved to and the bridge method that started it (``callValue``,
        ``call``, ``namespace``, ``mcp``). A call that waits for the host's approval says so
        (``approval``: ``pending``, or the decision the next ``wait`` acts on) with the
        ``input`` the gate shows."""
        settled = self.journal.settled_ids()
        resolved = self.dispatcher.resolved
        approvals = self.dispatcher.approvals
        entries = []
        for c in self.journal.calls:
            if c.id in settled or c.id in self.yields:
                continue
            entry: dict[str, Any] = {"id": f"call_{c.id}", "toolId": resolved.get(c.id, c.tool), "method": c.method}
            if approvals:
                entry.update(approvals.entry(c.id) or {})
            entries.append(entry)
        return entries


class RunLookupError(Exception):
    """A ``wait`` that cannot resume: unknown, expired, foreign or busy (message per spec)."""


class RunLost(Exception):
    """A ``wait`` found that its run cannot go on: results it needs died with another host."""


class RunTable:
    """In-memory suspended runs of one ``CodeMode``: bounded in all and per session, expiring,
    scoped to ``(session, agent run)``."""

    def __init__(self, ttl_seconds: float, limit: int = MAX_SUSPENDED_RUNS, per_session: int | None = None) -> None:
        self._ttl = ttl_seconds
        self._limit = limit
        self._per_session = limit if per_session is None else per_session
        self._runs: dict[str, Run] = {}
        #: The same runs by session: a session's share is counted over its own runs, not the
        #: whole table (with 1,000 runs filed, each suspend walked all of them).
        self._sessions: dict[str, dict[str, Run]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    def _file(self, run: Run) -> None:
        """Under the lock: ``run`` is in the table."""
        self._runs[run.run_id] = run
        self._sessions.setdefault(run.scope[0], {})[run.run_id] = run

    def _unfile(self, run: Run) -> None:
        """Under the lock: ``run``, which is in the table, leaves it."""
        del self._runs[run.run_id]
        session = self._sessions[run.scope[0]]
        del session[run.run_id]
        if not session:
            del self._sessions[run.scope[0]]

    def expired(self) -> list[Run]:
        """Removes and returns runs past their TTL (the caller frees their resources)."""
        if not self._runs:
            return []
        now = time.monotonic()
        with self._lock:
            gone = [r for r in self._runs.values() if r.expires_at <= now and not r.busy]
            for run in gone:
                self._unfile(run)
                run.aborted = True
        return gone

    def suspend(self, run: Run) -> str | None:
        """Files a run as suspended (and no longer resuming); else says why not (the table is
        full, or its session holds its share of it)."""
        now = time.monotonic()
        with self._lock:
            run.busy = False
            if run.run_id not in self._runs:
                # A run past its TTL holds no slot, even before the sweeper takes it out: the
                # table is not swept on every exec (with many suspended runs that cost each
                # exec ~0.1 µs a run), and counted here only when it could refuse.
                if len(self._runs) >= self._limit and self._holding(now) >= self._limit:
                    return TOO_MANY
                session_id = run.scope[0]
                held = self._sessions.get(session_id)
                # (Only a session with its share of entries can hold its share of slots.)
                if (
                    held is not None
                    and len(held) >= self._per_session
                    and self._holding(now, session_id) >= self._per_session
                ):
                    return TOO_MANY_IN_SESSION.format(limit=self._per_session)
            run.expires_at = now + self._ttl
            self._file(run)
            return None

    def _holding(self, now: float, session_id: str | None = None) -> int:
        """Under the lock: the runs that hold a slot (of ``session_id``'s, if given)."""
        runs = self._runs if session_id is None else self._sessions.get(session_id, {})
        return sum(1 for r in runs.values() if r.busy or r.expires_at > now)

    def get(self, run_id: str) -> Run | None:
        with self._lock:
            return self._runs.get(run_id)

    def hold(self, run: Run) -> None:
        """Files a run as resuming (one rebuilt here for a `wait`: no caps, the store holds them)."""
        with self._lock:
            run.busy = True
            self._file(run)

    def take_idle(self, run: Run) -> bool:
        """Takes ``run`` out of the table if it is there and no `wait` is resuming it."""
        with self._lock:
            if self._runs.get(run.run_id) is not run or run.busy:
                return False
            self._unfile(run)
            return True

    def claim(self, run_id: Any, scope: Scope) -> Run:
        """Marks a run as resuming; raises ``RunLookupError`` with the spec's message."""
        with self._lock:
            run = self._resumable(run_id, scope)
            run.busy = True
            return run

    def _resumable(self, run_id: Any, scope: Scope) -> Run:
        """The run, if this session may take it now; else ``RunLookupError`` (under the lock)."""
        run = self._runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.expires_at <= time.monotonic():
            raise RunLookupError(UNAVAILABLE)
        if run.scope != scope:
            raise RunLookupError(FOREIGN)
        if run.busy:
            raise RunLookupError(BUSY)
        return run

    def abort(self, run_id: Any, scope: Scope) -> Run:
        """Takes a run out of the table to be cancelled (``claim``'s checks)."""
        with self._lock:
            run = self._resumable(run_id, scope)
            self._unfile(run)
            run.aborted = True
            return run

    def remove(self, run: Run) -> None:
        with self._lock:
            if self._runs.get(run.run_id) is run:
                self._unfile(run)

    def of_scope(self, scope: Scope) -> list[Run]:
        with self._lock:
            return [r for r in self._sessions.get(scope[0], {}).values() if r.scope == scope]

    def all(self) -> list[Run]:
        with self._lock:
            return list(self._runs.values())

    def drain(self) -> list[Run]:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
            self._sessions.clear()
        return runs
