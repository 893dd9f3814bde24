"""Persistence for the cell globals ``store(key, value)`` / ``load(key)``.

A cell's writes are buffered by the host and handed to :meth:`Store.commit` only when the cell
completes, so a failed, cancelled or timed-out cell leaves nothing behind. Values belong to a
(session, conversation branch) pair: a branch reads only what was committed on that branch, and
what was committed survives reopening the database.

Values cross this interface as JSON text, already serialized by the caller; the store never parses
them. Limits are counted in Python ``str`` characters (code points), which is what both SQLite's
and PostgreSQL's ``length()`` count on UTF-8 text, so the total can be measured inside the same
transaction that changes it. JavaScript's ``.length`` counts an astral character twice, so a
guest-side check with the same numbers is at least as strict: nothing it let through fails here.

Two backends share one table, ``codemode_store``: :class:`SqliteStore` (stdlib, the default, in
memory or a file) and :class:`PostgresStore` (needs ``psycopg`` 3) for hosts that run several
processes against one database. :func:`open_store` picks one from a configuration value.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ClosedError, ConfigError, StoreError, StoreLimitError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_TOTAL_CHARS",
    "MAX_VALUE_CHARS",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "open_store",
]

#: Longest serialized JSON value one key may hold (the spec's per-value limit).
MAX_VALUE_CHARS = 262_144
#: Keys plus serialized values, summed over one (session, branch) (the spec's total limit).
MAX_TOTAL_CHARS = 1_048_576
#: Longest key; keeps one key from eating the total budget by itself.
MAX_KEY_CHARS = 1_024

#: How long a SQLite commit waits for another process's write transaction before failing.
SQLITE_BUSY_TIMEOUT_S = 10.0

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# NOT NULL because SQLite, unlike PostgreSQL, otherwise accepts NULL in primary key columns.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS codemode_store (
    session_id TEXT NOT NULL,
    branch TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (session_id, branch, key)
)
"""

# Written with ``{p}`` for the driver's placeholder: ``?`` for sqlite3, ``%s`` for psycopg.
_SELECT = "SELECT key, value FROM codemode_store WHERE session_id = {p} AND branch = {p}"
_DELETE = "DELETE FROM codemode_store WHERE session_id = {p} AND branch = {p} AND key = {p}"
_UPSERT = (
    "INSERT INTO codemode_store (session_id, branch, key, value) VALUES ({p}, {p}, {p}, {p}) "
    "ON CONFLICT (session_id, branch, key) DO UPDATE SET value = excluded.value"
)
_TOTAL = (
    "SELECT COALESCE(SUM(length(key) + length(value)), 0) FROM codemode_store WHERE session_id = {p} AND branch = {p}"
)

# Serializes concurrent ``CREATE TABLE IF NOT EXISTS`` from several processes, which PostgreSQL
# otherwise lets fail with a unique violation on its catalog. Any fixed 64-bit number will do.
_SCHEMA_LOCK_ID = 0x636F_6465_6D6F_6465  # "codemode"


class Store(Protocol):
    """Committed ``store()`` values per (session, branch); all backends behave the same."""

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        """Every committed key of the branch, mapped to its JSON text."""
        ...

    def commit(self, session_id: str, branch: str, writes: Mapping[str, str | None]) -> None:
        """Applies a completed cell's writes (JSON text, or ``None`` to delete) all at once.

        Raises :class:`StoreLimitError` (and changes nothing) when a key or value is too long or
        the branch's resulting total would exceed :data:`MAX_TOTAL_CHARS`.
        """
        ...

    def close(self) -> None:
        """Releases the database; idempotent."""
        ...


def _check_text(what: str, text: str) -> None:
    """Rejects text that one backend would store and another refuse, so both behave alike.

    PostgreSQL cannot hold NUL in ``text`` (SQLite can, but its ``length()`` stops there), and
    neither driver can encode an unpaired surrogate, which a JavaScript string may contain.
    """
    if "\x00" in text:
        raise StoreError(f"store {what} must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(f"store {what} must not contain unpaired surrogates") from None


def _check_writes(writes: Mapping[str, str | None]) -> None:
    """Checks every key and value before the transaction starts, so a bad write costs no I/O."""
    for key, value in writes.items():
        if not isinstance(key, str) or not key:
            raise StoreError(f"store key must be a non-empty string, got {key!r:.60}")
        if len(key) > MAX_KEY_CHARS:
            raise StoreLimitError(f"store key is {len(key)} characters; the limit is {MAX_KEY_CHARS}")
        _check_text("key", key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise StoreError(f"store value for {key!r:.60} must be JSON text or None, got {type(value).__name__}")
        if len(value) > MAX_VALUE_CHARS:
            raise StoreLimitError(
                f"store value for {key!r:.60} is {len(value)} characters of JSON; the limit is {MAX_VALUE_CHARS}"
            )
        _check_text("value", value)


def _check_total(total: int) -> None:
    """Raised inside the commit's transaction, so the rollback undoes the writes just made."""
    if total > MAX_TOTAL_CHARS:
        raise StoreLimitError(f"stored keys and values would total {total} characters; the limit is {MAX_TOTAL_CHARS}")


def _split(session_id: str, branch: str, writes: Mapping[str, str | None]) -> tuple[list[Any], list[Any]]:
    """The parameter rows for the deletes and the upserts of one commit."""
    deletes = [(session_id, branch, key) for key, value in writes.items() if value is None]
    upserts = [(session_id, branch, key, value) for key, value in writes.items() if value is not None]
    return deletes, upserts


class SqliteStore:
    """A store in one SQLite database: ``":memory:"`` (private to this object) or a file.

    One connection serves every thread, behind a lock: SQLite runs one write transaction at a time
    anyway, and a second connection would make ``":memory:"`` a second database. Files use WAL so
    readers in other processes never block a commit; ``BEGIN IMMEDIATE`` takes the write lock
    before the total is measured, so concurrent commits from other processes cannot both fit
    under the limit separately.
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:") -> None:
        self._lock = threading.Lock()
        try:
            conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store database {os.fspath(path)!r}: {exc}") from exc
        try:
            if os.fspath(path) != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open the store database {os.fspath(path)!r}: {exc}") from exc
        self._conn: sqlite3.Connection | None = conn

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ClosedError("the store is closed")
        return self._conn

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        with self._lock:
            conn = self._open()
            try:
                return dict(conn.execute(_SELECT.format(p="?"), (session_id, branch)).fetchall())
            except sqlite3.Error as exc:
                raise StoreError(f"store read failed: {exc}") from exc

    def commit(self, session_id: str, branch: str, writes: Mapping[str, str | None]) -> None:
        _check_writes(writes)
        if not writes:
            return
        deletes, upserts = _split(session_id, branch, writes)
        with self._lock:
            conn = self._open()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(_DELETE.format(p="?"), deletes)
                    conn.executemany(_UPSERT.format(p="?"), upserts)
                    (total,) = conn.execute(_TOTAL.format(p="?"), (session_id, branch)).fetchone()
                    _check_total(total)
                    conn.execute("COMMIT")
                finally:
                    # Also after a failed COMMIT, which leaves the transaction open.
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise StoreError(f"store commit failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PostgresStore:
    """A store in a PostgreSQL database, shared safely by any number of processes.

    Each commit takes a transaction-level advisory lock on a hash of (session, branch) before it
    writes and measures the total: under READ COMMITTED two concurrent commits would otherwise
    each see only their own writes and could together exceed the limit. A hash collision only
    serializes two unrelated branches. A lost connection (server restart) fails the call that
    finds it lost and is reopened by the next one; a commit is never retried blindly.
    """

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError(f"a PostgreSQL store needs psycopg 3: pip install 'psycopg[binary]' ({exc})") from exc
        self._dsn = dsn
        self._db_error: type[Exception] = psycopg.Error
        self._lock = threading.Lock()
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL store: {exc}") from exc
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
                conn.execute(_SCHEMA)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot create the PostgreSQL store table: {exc}") from exc
        self._conn: psycopg.Connection[Any] | None = conn

    def _connect(self) -> psycopg.Connection[Any]:
        """Connects in autocommit mode, so that only explicit ``transaction()`` blocks group writes.

        The database must be UTF-8: in another encoding ``length()`` would not count characters.
        """
        import psycopg

        conn = psycopg.connect(self._dsn, autocommit=True, client_encoding="utf8")
        row = conn.execute("SHOW server_encoding").fetchone()
        if row is None or row[0] != "UTF8":
            conn.close()
            raise StoreError(f"the PostgreSQL store database must use UTF8 encoding, not {row and row[0]!r}")
        return conn

    def _open(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise ClosedError("the store is closed")
        if self._conn.closed:  # only ever by a lost connection: close() drops the reference
            self._conn = self._connect()
        return self._conn

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        with self._lock:
            try:
                conn = self._open()
                return dict(conn.execute(_SELECT.format(p="%s"), (session_id, branch)).fetchall())
            except self._db_error as exc:
                raise StoreError(f"store read failed: {exc}") from exc

    def commit(self, session_id: str, branch: str, writes: Mapping[str, str | None]) -> None:
        _check_writes(writes)
        if not writes:
            return
        deletes, upserts = _split(session_id, branch, writes)
        # JSON keeps the pair unambiguous whatever characters the ids contain.
        digest = hashlib.blake2b(json.dumps([session_id, branch]).encode(), digest_size=8).digest()
        lock_id = int.from_bytes(digest, "big", signed=True)
        with self._lock:
            try:
                conn = self._open()
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id,))
                    cur.executemany(_DELETE.format(p="%s"), deletes)
                    cur.executemany(_UPSERT.format(p="%s"), upserts)
                    row = cur.execute(_TOTAL.format(p="%s"), (session_id, branch)).fetchone()
                    _check_total(row[0] if row else 0)
            except self._db_error as exc:
                raise StoreError(f"store commit failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def open_store(target: str | os.PathLike[str] | None) -> Store:
    """The store a configuration value names.

    ``None`` is a private in-memory SQLite database (values last as long as the process); a
    ``postgresql://`` or ``postgres://`` URL is a PostgreSQL database; anything else is the path
    of a SQLite file, created if missing.
    """
    if target is None:
        return SqliteStore()
    if isinstance(target, str) and target.lower().startswith(_POSTGRES_SCHEMES):
        return PostgresStore(target)
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(f"store target must be a path or a postgresql:// URL, got {type(target).__name__}")
    return SqliteStore(target)
