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

import hashlib
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec

from .protocol import EngineLimits

if TYPE_CHECKING:
    from .supervisor import Step, WorkerProcess
    from .tools import Dispatcher

__all__ = ["MAX_SUSPENDED_RUNS", "Journal", "JournalCall", "Run", "RunLookupError", "RunTable", "input_hash"]

#: Suspended runs one ``CodeMode`` keeps at once (the spec's per-process bound).
MAX_SUSPENDED_RUNS = 64

#: Messages the spec gives for runIds that cannot be resumed (all with code ``invalid_input``).
UNAVAILABLE = "code mode run is unavailable or expired."
FOREIGN = "code mode run belongs to a different session."
BUSY = "code mode run is already being resumed."
TOO_MANY = "too many suspended code mode runs."


def input_hash(input_json: str) -> str:
    return hashlib.blake2b(input_json.encode(), digest_size=16).hexdigest()


class JournalCall(msgspec.Struct, array_like=True, frozen=True):
    """A tool call the guest made: its engine call id, tool id and the hash of its input."""

    id: int
    tool: str
    input_hash: str


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
    restart_safe: bool = False
    session_id: str = ""
    calls: list[JournalCall] = msgspec.field(default_factory=list)
    #: Result batches ``(call_id, ok, payload)`` in the order they were settled.
    batches: list[list[tuple[int, bool, str]]] = msgspec.field(default_factory=list)
    clock_reads: list[float] = msgspec.field(default_factory=list)
    #: Inputs of calls still in flight at suspension (JSON text), so another process can redo
    #: them; only restart-safe runs (read-only tools) may.
    open_inputs: dict[int, str] = msgspec.field(default_factory=dict)

    def settled_ids(self) -> set[int]:
        return {call_id for batch in self.batches for call_id, _, _ in batch}

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @staticmethod
    def decode(data: bytes) -> Journal:
        return msgspec.msgpack.decode(data, type=Journal)


class Run:
    """One suspended (or resuming) run in the host."""

    __slots__ = (
        "aborted",
        "advancing",
        "ahead",
        "busy",
        "counts",
        "dispatcher",
        "engine_run",
        "expires_at",
        "held",
        "journal",
        "output_chars",
        "run_id",
        "session_id",
        "store_key",
        "timeout_ms",
        "worker",
        "yields",
    )

    def __init__(self, session_id: str, journal: Journal, dispatcher: Dispatcher) -> None:
        #: Given when the run is first suspended (most runs never are).
        self.run_id = ""
        self.session_id = session_id
        self.journal = journal
        self.dispatcher = dispatcher
        #: Where the runtime is resident, and its id there; None once it must be replayed.
        self.worker: WorkerProcess | None = None
        self.engine_run = 0
        #: ``yield_control`` calls waiting for the next ``wait``.
        self.yields: list[int] = []
        self.busy = False
        self.expires_at = 0.0
        #: Advanced while suspended (`CodeMode._advance`): results that landed after the
        #: suspension were settled into the resident runtime at once, and the guest ran on to
        #: its next report. ``ahead`` is what that step saw, for the next `wait` to return or
        #: go on from; ``held`` are the calls it made, started only by that `wait`.
        self.ahead: Step | None = None
        self.held: list[tuple[int, str, str]] = []
        self.advancing = False
        #: Cancelled while advancing: the advance retires it when it ends.
        self.aborted = False
        #: Cumulative over the run's exec and waits: tool calls, searches, describes.
        self.counts = [0, 0, 0]
        #: From the cell's ``// @options``: the text budget, and the wall clock of each call.
        self.output_chars: int | None = None
        #: ``(session id, branch)`` whose store a completed run commits to.
        self.store_key: tuple[str, str] | None = None
        self.timeout_ms = 10_000

    def pending_calls(self) -> list[dict[str, Any]]:
        """The spec's ``pendingToolCalls``: calls made and not yet settled, oldest first."""
        settled = self.journal.settled_ids()
        resolved = self.dispatcher.resolved
        return [
            {"id": f"call_{c.id}", "toolId": resolved.get(c.id, c.tool)}
            for c in self.journal.calls
            if c.id not in settled and c.id not in self.yields
        ]


class RunLookupError(Exception):
    """A ``wait`` that cannot resume: unknown, expired, foreign or busy (message per spec)."""


class RunTable:
    """In-memory suspended runs of one ``CodeMode``: bounded, expiring, session-scoped."""

    def __init__(self, ttl_seconds: float, limit: int = MAX_SUSPENDED_RUNS) -> None:
        self._ttl = ttl_seconds
        self._limit = limit
        self._runs: dict[str, Run] = {}
        self._lock = threading.Condition()

    def __len__(self) -> int:
        return len(self._runs)

    def expired(self) -> list[Run]:
        """Removes and returns runs past their TTL (the caller frees their resources)."""
        if not self._runs:
            return []
        now = time.monotonic()
        with self._lock:
            gone = [r for r in self._runs.values() if r.expires_at <= now and not (r.busy or r.advancing)]
            for run in gone:
                del self._runs[run.run_id]
        return gone

    def suspend(self, run: Run) -> bool:
        """Files a run as suspended; False if the table is full."""
        with self._lock:
            if run.run_id not in self._runs and len(self._runs) >= self._limit:
                return False
            if not run.run_id:
                run.run_id = "run_" + secrets.token_urlsafe(12)
            run.busy = False
            run.expires_at = time.monotonic() + self._ttl
            self._runs[run.run_id] = run
            return True

    def claim(self, run_id: Any, session_id: str) -> Run:
        """Marks a run as resuming; raises ``RunLookupError`` with the spec's message. A run
        being advanced is waited for: that is work the caller would do itself."""
        with self._lock:
            while (run := self._resumable(run_id, session_id)).advancing:
                self._lock.wait()
            run.busy = True
            return run

    def _resumable(self, run_id: Any, session_id: str) -> Run:
        """The run, if this session may take it now; else ``RunLookupError`` (under the lock)."""
        run = self._runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.expires_at <= time.monotonic():
            raise RunLookupError(UNAVAILABLE)
        if run.session_id != session_id:
            raise RunLookupError(FOREIGN)
        if run.busy:
            raise RunLookupError(BUSY)
        return run

    def begin_advance(self, run: Run) -> bool:
        """Marks a suspended run as being advanced; False if it is resuming, advancing or gone."""
        with self._lock:
            if self._runs.get(run.run_id) is not run or run.busy or run.advancing:
                return False
            run.advancing = True
            return True

    def end_advance(self, run: Run) -> bool:
        """Ends an advance; True if the run was cancelled meanwhile (the caller retires it)."""
        with self._lock:
            run.advancing = False
            self._lock.notify_all()
            return run.aborted

    def abort(self, run_id: Any, session_id: str) -> Run | None:
        """Takes a run out of the table to be cancelled (``claim``'s checks, without waiting for
        an advance). None if it is being advanced: that advance retires it when it ends."""
        with self._lock:
            run = self._resumable(run_id, session_id)
            del self._runs[run.run_id]
            run.aborted = True
            if run.advancing:
                return None
            run.busy = True
            return run

    def remove(self, run: Run) -> None:
        if not run.run_id:
            return
        with self._lock:
            if self._runs.get(run.run_id) is run:
                del self._runs[run.run_id]

    def of_session(self, session_id: str) -> list[Run]:
        with self._lock:
            return [r for r in self._runs.values() if r.session_id == session_id]

    def all(self) -> list[Run]:
        with self._lock:
            return list(self._runs.values())

    def drain(self) -> list[Run]:
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        return runs
