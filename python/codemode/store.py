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
from collections.abc import Mapping
from typing import Any, Protocol

from .database import Database, PostgresDatabase, SqliteDatabase, is_postgres_url
from .errors import ConfigError, StoreError, StoreLimitError

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


class _DatabaseStore:
    """The store's SQL over a `database.Database` (either backend)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        with self._db.transaction() as tx:
            return dict(tx.rows(_SELECT, (session_id, branch)))

    def commit(self, session_id: str, branch: str, writes: Mapping[str, str | None]) -> None:
        _check_writes(writes)
        if not writes:
            return
        deletes, upserts = _split(session_id, branch, writes)
        with self._db.transaction(write=True, lock=_branch_lock(session_id, branch)) as tx:
            tx.many(_DELETE, deletes)
            tx.many(_UPSERT, upserts)
            ((total,),) = tx.rows(_TOTAL, (session_id, branch))
            _check_total(total)

    def close(self) -> None:
        self._db.close()


def _branch_lock(session_id: str, branch: str) -> int:
    """The advisory lock key a commit to (session, branch) takes on PostgreSQL: a hash (JSON keeps
    the pair unambiguous whatever characters the ids contain); a collision only serializes two
    unrelated branches."""
    digest = hashlib.blake2b(json.dumps([session_id, branch]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class SqliteStore(_DatabaseStore):
    """A store in one SQLite database: ``":memory:"`` (private to this object) or a file.

    ``BEGIN IMMEDIATE`` takes the write lock before the total is measured, so concurrent commits
    from other processes cannot both fit under the limit separately.
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:") -> None:
        super().__init__(SqliteDatabase(path, [_SCHEMA], "store"))


class PostgresStore(_DatabaseStore):
    """A store in a PostgreSQL database, shared safely by any number of processes.

    Each commit takes a transaction-level advisory lock on a hash of (session, branch) before it
    writes and measures the total: under READ COMMITTED two concurrent commits would otherwise
    each see only their own writes and could together exceed the limit.
    """

    def __init__(self, dsn: str) -> None:
        super().__init__(PostgresDatabase(dsn, [_SCHEMA], "store"))


def open_store(target: str | os.PathLike[str] | None) -> Store:
    """The store a configuration value names.

    ``None`` is a private in-memory SQLite database (values last as long as the process); a
    ``postgresql://`` or ``postgres://`` URL is a PostgreSQL database; anything else is the path
    of a SQLite file, created if missing.
    """
    if target is None:
        return SqliteStore()
    if is_postgres_url(target):
        return PostgresStore(str(target))
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(f"store target must be a path or a postgresql:// URL, got {type(target).__name__}")
    return SqliteStore(target)
