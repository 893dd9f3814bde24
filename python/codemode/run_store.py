"""Suspended runs in a database that several host processes share (PostgreSQL, or SQLite on
one machine), so a ``wait`` can land on any of them.

Three tables::

    codemode_runs       run_id | session_id | scope | meta | journal | version | expires_at | holder
    codemode_run_calls  run_id | call_id | owner | result     (calls started and not yet settled)
    codemode_hosts      host_id | alive_until                  (each process's heartbeat)

A row is written when its run suspends (``version`` counts suspensions: a process whose resident
copy has an older one replays instead) and deleted when the run completes, fails, expires or is
cancelled. ``holder`` is the lease of the one ``wait`` in progress: a host takes it only while
it is free, or while its holder's heartbeat has stopped (a crashed holder frees it within
`HOST_TTL_S`). A call's row names the host running it (``owner``) and, once it answered, its
result: the host that resumes the run delivers results it finds there, watches for the others,
and knows a call is lost when its owner's heartbeat has stopped.

Everything here is SQL and rows; what a host does with them is `codemode.shared_runs`. Times
are wall-clock seconds (``time.time()``), so hosts sharing a server keep their clocks in sync.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from .database import Database, Tx, open_database
from .protocol import CallResult
from .runs import BUSY, FOREIGN, TOO_MANY, TOO_MANY_IN_SESSION, UNAVAILABLE, RunLookupError, Scope

__all__ = ["HEARTBEAT_S", "HOST_TTL_S", "CallRow", "Claimed", "RunMeta", "RunStore"]

#: How often a host writes its heartbeat, and how long after its last one it counts as gone.
HEARTBEAT_S = 0.5
HOST_TTL_S = 3.0

# Serializes the count-then-insert of a first suspension (PostgreSQL; SQLite's BEGIN IMMEDIATE
# already does), so that the 64-run and per-session caps hold across processes.
_RUNS_LOCK_ID = 0x636D_5F72_756E_7321  # "cm_runs!"


def _run_lock(run_id: str) -> int:
    """The advisory lock key a claim of ``run_id`` takes on PostgreSQL (a hash: a collision only
    serializes two claims of unrelated runs)."""
    return int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(), "big", signed=True)


_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS codemode_runs (
        run_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        scope {blob} NOT NULL,
        meta {blob} NOT NULL,
        journal {blob} NOT NULL,
        version INTEGER NOT NULL,
        expires_at {real} NOT NULL,
        holder TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS codemode_run_calls (
        run_id TEXT NOT NULL,
        call_id INTEGER NOT NULL,
        owner TEXT NOT NULL,
        result {blob},
        PRIMARY KEY (run_id, call_id)
    )""",
    """CREATE TABLE IF NOT EXISTS codemode_hosts (
        host_id TEXT PRIMARY KEY,
        alive_until {real} NOT NULL
    )""",
]

_ALIVE = "SELECT host_id FROM codemode_hosts WHERE alive_until > {p}"
_FREE = f"(holder IS NULL OR holder NOT IN ({_ALIVE}))"


class RunMeta(msgspec.Struct, array_like=True, frozen=True):
    """What a suspended run carries besides its journal: whose it is and how its steps go."""

    session_id: str
    agent_run: str | None
    #: The conversation branch its ``store`` writes commit to, if any.
    branch: str | None
    timeout_ms: int
    output_chars: int | None
    #: Its telemetry counts so far (over its exec and waits, in any process).
    tool_calls: int = 0
    searches: int = 0
    describes: int = 0


class CallRow(NamedTuple):
    """A started call of a suspended run: who runs it, its result once it answered, and whether
    its owner is still alive."""

    call_id: int
    owner: str
    result: CallResult | None
    alive: bool


class Claimed(NamedTuple):
    """A run a ``wait`` now holds the lease of: its version, what it carries, its journal
    (None when the claimer's copy is of this version already), its open calls, and whether it
    was taken from a holder that stopped mid-``wait`` (what that did since is unknown)."""

    version: int
    meta: RunMeta
    journal: bytes | None
    calls: list[CallRow]
    abandoned: bool


def scope_bytes(scope: Scope) -> bytes:
    """A scope as one comparable value (msgpack: no session id can spell another's scope)."""
    return msgspec.msgpack.encode(list(scope))


def _result(data: bytes | None) -> CallResult | None:
    return None if data is None else msgspec.msgpack.decode(bytes(data), type=CallResult)


class RunStore:
    """The suspended-run tables on one database, as seen by one host (``host_id``)."""

    def __init__(self, target: str | os.PathLike[str], host_id: str) -> None:
        self._db: Database = open_database(target, _SCHEMA, "run store")
        self.host_id = host_id

    def beat(self) -> None:
        """Writes this host's heartbeat, and deletes expired runs whose lease is free (with their
        calls, and calls left by deleted runs)."""
        now = time.time()
        with self._db.transaction(write=True) as tx:
            tx.change(
                "INSERT INTO codemode_hosts (host_id, alive_until) VALUES ({p}, {p}) "
                "ON CONFLICT (host_id) DO UPDATE SET alive_until = excluded.alive_until",
                (self.host_id, now + HOST_TTL_S),
            )
            tx.change(f"DELETE FROM codemode_runs WHERE expires_at <= {{p}} AND {_FREE}", (now, now))
            tx.change("DELETE FROM codemode_run_calls WHERE run_id NOT IN (SELECT run_id FROM codemode_runs)")
            tx.change("DELETE FROM codemode_hosts WHERE alive_until < {p}", (now - 3600.0,))

    def leave(self) -> None:
        """This host is going away: its leases are freed and its heartbeat ends now, so its
        runs' calls count as lost at once instead of after `HOST_TTL_S`."""
        with self._db.transaction(write=True) as tx:
            tx.change("UPDATE codemode_runs SET holder = NULL WHERE holder = {p}", (self.host_id,))
            tx.change("DELETE FROM codemode_hosts WHERE host_id = {p}", (self.host_id,))

    def insert(
        self,
        run_id: str,
        scope: Scope,
        meta: RunMeta,
        journal: bytes,
        ttl_s: float,
        calls: Iterable[tuple[int, CallResult | None]],
        limit: int,
        per_session: int,
    ) -> str | None:
        """Files a run's first suspension (its calls owned here); else the spec's reason the
        store is full (store-wide, or for its session)."""
        now = time.time()
        with self._db.transaction(write=True, lock=_RUNS_LOCK_ID) as tx:
            ((total, in_session),) = tx.rows(
                "SELECT COUNT(*), COALESCE(SUM(CASE WHEN session_id = {p} THEN 1 ELSE 0 END), 0) "
                "FROM codemode_runs WHERE expires_at > {p}",
                (scope[0], now),
            )
            if total >= limit:
                return TOO_MANY
            if in_session >= per_session:
                return TOO_MANY_IN_SESSION.format(limit=per_session)
            tx.change("DELETE FROM codemode_runs WHERE run_id = {p}", (run_id,))  # (an expired leftover)
            tx.change(
                "INSERT INTO codemode_runs (run_id, session_id, scope, meta, journal, version, expires_at, holder) "
                "VALUES ({p}, {p}, {p}, {p}, {p}, 1, {p}, NULL)",
                (run_id, scope[0], scope_bytes(scope), msgspec.msgpack.encode(meta), journal, now + ttl_s),
            )
            self._own_calls(tx, run_id, calls, ())
        return None

    def update(
        self,
        run_id: str,
        version: int,
        meta: RunMeta,
        journal: bytes,
        ttl_s: float,
        calls: Iterable[tuple[int, CallResult | None]],
        settled: Iterable[int],
    ) -> bool:
        """Files a later suspension of a run this host holds the lease of (``version`` is the one
        it claimed; the row becomes ``version + 1`` and its lease is freed); False if the lease
        was lost meanwhile."""
        with self._db.transaction(write=True) as tx:
            changed = tx.change(
                "UPDATE codemode_runs SET meta = {p}, journal = {p}, version = version + 1, expires_at = {p}, "
                "holder = NULL WHERE run_id = {p} AND version = {p} AND holder = {p}",
                (msgspec.msgpack.encode(meta), journal, time.time() + ttl_s, run_id, version, self.host_id),
            )
            if changed:
                self._own_calls(tx, run_id, calls, settled)
        return bool(changed)

    def _own_calls(
        self, tx: Tx, run_id: str, calls: Iterable[tuple[int, CallResult | None]], settled: Iterable[int]
    ) -> None:
        """Forgets calls now settled into the journal; files the ones this host started."""
        tx.many("DELETE FROM codemode_run_calls WHERE run_id = {p} AND call_id = {p}", [(run_id, i) for i in settled])
        tx.many(
            "INSERT INTO codemode_run_calls (run_id, call_id, owner, result) VALUES ({p}, {p}, {p}, {p}) "
            "ON CONFLICT (run_id, call_id) DO UPDATE SET result = COALESCE(codemode_run_calls.result, excluded.result)",
            [
                (run_id, call_id, self.host_id, None if result is None else msgspec.msgpack.encode(result))
                for call_id, result in calls
            ],
        )

    def claim(self, run_id: str, scope: Scope, have_version: int) -> Claimed:
        """Takes the lease of a suspended run for a ``wait``; ``RunLookupError`` with the spec's
        message when it is unknown or expired, another session's, or being resumed."""
        now = time.time()
        # (Read, then write: on PostgreSQL two claims at once would each see no holder without
        # the run's lock; SQLite's one writer at a time serializes them already.)
        with self._db.transaction(write=True, lock=_run_lock(run_id)) as tx:
            rows = tx.rows(
                "SELECT r.scope, r.expires_at, r.holder, COALESCE(h.alive_until, 0), r.version, r.meta, "
                "CASE WHEN r.version = {p} THEN NULL ELSE r.journal END FROM codemode_runs r "
                "LEFT JOIN codemode_hosts h ON h.host_id = r.holder WHERE r.run_id = {p}",
                (have_version, run_id),
            )
            if not rows or rows[0][1] <= now:
                raise RunLookupError(UNAVAILABLE)
            stored_scope, _, holder, holder_alive_until, version, meta, journal = rows[0]
            if bytes(stored_scope) != scope_bytes(scope):
                raise RunLookupError(FOREIGN)
            if holder is not None and holder_alive_until > now:
                raise RunLookupError(BUSY)
            tx.change("UPDATE codemode_runs SET holder = {p} WHERE run_id = {p}", (self.host_id, run_id))
            calls = self._calls(tx, [run_id], now)
        return Claimed(
            int(version),
            msgspec.msgpack.decode(bytes(meta), type=RunMeta),
            None if journal is None else bytes(journal),
            [row for _, row in calls],
            holder is not None,
        )

    def calls(self, run_ids: list[str]) -> list[tuple[str, CallRow]]:
        """The started calls of these runs, with what is known of each."""
        if not run_ids:
            return []
        with self._db.transaction() as tx:
            return self._calls(tx, run_ids, time.time())

    def _calls(self, tx: Tx, run_ids: list[str], now: float) -> list[tuple[str, CallRow]]:
        rows = tx.rows(
            "SELECT c.run_id, c.call_id, c.owner, c.result, COALESCE(h.alive_until, 0) FROM codemode_run_calls c "
            "LEFT JOIN codemode_hosts h ON h.host_id = c.owner WHERE c.run_id IN ({ps})",
            run_ids,
            count=len(run_ids),
        )
        return [
            (run_id, CallRow(int(call_id), owner, _result(result), alive_until > now))
            for run_id, call_id, owner, result, alive_until in rows
        ]

    def release(self, run_id: str) -> None:
        """Frees the lease this host holds (a ``wait`` that ended without filing the run)."""
        with self._db.transaction(write=True) as tx:
            tx.change(
                "UPDATE codemode_runs SET holder = NULL WHERE run_id = {p} AND holder = {p}", (run_id, self.host_id)
            )

    def delete(self, run_id: str) -> None:
        """The run is over (completed, failed, expired, refused): its row and its calls go."""
        with self._db.transaction(write=True) as tx:
            tx.change("DELETE FROM codemode_runs WHERE run_id = {p}", (run_id,))
            tx.change("DELETE FROM codemode_run_calls WHERE run_id = {p}", (run_id,))

    def cancel(self, run_id: str, scope: Scope) -> bool:
        """Deletes a run of ``scope`` that no ``wait`` holds; False if there is none such."""
        now = time.time()
        with self._db.transaction(write=True) as tx:
            gone = tx.change(
                f"DELETE FROM codemode_runs WHERE run_id = {{p}} AND scope = {{p}} AND expires_at > {{p}} AND {_FREE}",
                (run_id, scope_bytes(scope), now, now),
            )
            if gone:
                tx.change("DELETE FROM codemode_run_calls WHERE run_id = {p}", (run_id,))
        return bool(gone)

    def of_scope(self, scope: Scope) -> list[str]:
        """The ids of the unexpired runs of ``scope``, wherever they are resident."""
        with self._db.transaction() as tx:
            rows = tx.rows(
                "SELECT run_id FROM codemode_runs WHERE scope = {p} AND expires_at > {p}",
                (scope_bytes(scope), time.time()),
            )
        return [run_id for (run_id,) in rows]

    def put_result(self, run_id: str, call_id: int, result: CallResult) -> None:
        """A call this host runs answered: its result is there for whoever resumes the run."""
        with self._db.transaction(write=True) as tx:
            tx.change(
                "UPDATE codemode_run_calls SET result = {p} WHERE run_id = {p} AND call_id = {p} AND result IS NULL",
                (msgspec.msgpack.encode(result), run_id, call_id),
            )

    def adopt(self, run_id: str, call_id: int) -> None:
        """This host now runs a call whose owner is gone (a restart-safe run redoing it)."""
        with self._db.transaction(write=True) as tx:
            tx.change(
                "UPDATE codemode_run_calls SET owner = {p} WHERE run_id = {p} AND call_id = {p}",
                (self.host_id, run_id, call_id),
            )

    def versions(self, run_ids: list[str]) -> dict[str, tuple[int, float]]:
        """Each of these runs still in the store: its version and when it expires."""
        if not run_ids:
            return {}
        with self._db.transaction() as tx:
            rows = tx.rows(
                "SELECT run_id, version, expires_at FROM codemode_runs WHERE run_id IN ({ps})",
                run_ids,
                count=len(run_ids),
            )
        return {run_id: (int(version), float(expires_at)) for run_id, version, expires_at in rows}

    def close(self) -> None:
        self._db.close()
