"""One connection to a SQLite file or a PostgreSQL server, for the stores built on it.

Both stores (`store`: the cells' ``store``/``load`` values; `run_store`: suspended runs shared by
processes) write SQL once, with ``{p}`` where the driver's placeholder goes, and run it inside
`Database.transaction`::

    with db.transaction(write=True, lock=KEY) as tx:      SQLite: BEGIN IMMEDIATE (one writer)
        tx.rows("SELECT ... WHERE a = {p}", (a,))         PostgreSQL: a transaction holding
        tx.change("UPDATE ...", (...))  -> rows changed               pg_advisory_xact_lock(KEY)

A driver error inside becomes a `StoreError` saying what failed; one connection serves every
thread, behind a lock (SQLite runs one write at a time anyway, and a second connection would make
``":memory:"`` a second database). A lost PostgreSQL connection fails the call that finds it lost
and is reopened by the next one; nothing is retried blindly.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ClosedError, StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["POSTGRES_SCHEMES", "SQLITE_BUSY_TIMEOUT_S", "Database", "Tx", "is_postgres_url", "open_database"]

#: How long a SQLite transaction waits for another process's write transaction before failing.
SQLITE_BUSY_TIMEOUT_S = 10.0

POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# Serializes concurrent ``CREATE TABLE IF NOT EXISTS`` from several processes, which PostgreSQL
# otherwise lets fail with a unique violation on its catalog. Any fixed 64-bit number will do.
_SCHEMA_LOCK_ID = 0x636F_6465_6D6F_6465  # "codemode"


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and target.lower().startswith(POSTGRES_SCHEMES)


class Tx:
    """Statements inside one transaction (``{p}`` in the SQL is the driver's placeholder)."""

    __slots__ = ("_cursor", "_p")

    def __init__(self, cursor: Any, placeholder: str) -> None:
        self._cursor = cursor
        self._p = placeholder

    def sql(self, text: str, count: int = 0) -> str:
        """``text`` with its ``{p}`` filled in, and ``{ps}`` as ``count`` placeholders."""
        return text.format(p=self._p, ps=", ".join([self._p] * count))

    def rows(self, text: str, params: Sequence[Any] = (), count: int = 0) -> list[tuple[Any, ...]]:
        return list(self._cursor.execute(self.sql(text, count), params).fetchall())

    def change(self, text: str, params: Sequence[Any] = ()) -> int:
        """Runs a write; the number of rows it changed."""
        cursor = self._cursor.execute(self.sql(text), params)
        return int(cursor.rowcount)

    def many(self, text: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self._cursor.executemany(self.sql(text), rows)


class Database:
    """What both backends offer: a transaction, and closing."""

    #: How a column of bytes and one of floating-point seconds are spelled in this SQL dialect.
    blob = "BLOB"
    real = "REAL"

    def transaction(self, *, write: bool = False, lock: int | None = None) -> contextlib.AbstractContextManager[Tx]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    """``":memory:"`` (private to this object) or a file, in WAL mode so that readers in other
    processes never block a writer; a write transaction takes the write lock first
    (``BEGIN IMMEDIATE``), so what it measures cannot change under it."""

    def __init__(self, path: str | os.PathLike[str], schema: Sequence[str], what: str) -> None:
        self._lock = threading.Lock()
        self._what = what
        try:
            conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the {what} database {os.fspath(path)!r}: {exc}") from exc
        try:
            if os.fspath(path) != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            for statement in schema:
                conn.execute(statement.format(blob=self.blob, real=self.real))
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open the {what} database {os.fspath(path)!r}: {exc}") from exc
        self._conn: sqlite3.Connection | None = conn

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False, lock: int | None = None) -> Iterator[Tx]:
        del lock  # (``BEGIN IMMEDIATE`` already makes every writer wait its turn)
        with self._lock:
            conn = self._conn
            if conn is None:
                raise ClosedError(f"the {self._what} is closed")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield Tx(conn, "?")
                    conn.execute("COMMIT")
                finally:
                    # Also after a failed COMMIT, which leaves the transaction open.
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise StoreError(f"{self._what} {'write' if write else 'read'} failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PostgresDatabase(Database):
    """A PostgreSQL database, shared safely by any number of processes: a write that must see
    a stable total takes a transaction-level advisory lock on a key first (under READ COMMITTED
    two concurrent transactions would otherwise each see only their own writes)."""

    blob = "BYTEA"
    real = "DOUBLE PRECISION"

    def __init__(self, dsn: str, schema: Sequence[str], what: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError(f"a PostgreSQL {what} needs psycopg 3: pip install 'psycopg[binary]' ({exc})") from exc
        self._dsn = dsn
        self._what = what
        self._db_error: type[Exception] = psycopg.Error
        self._lock = threading.Lock()
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL {what}: {exc}") from exc
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
                for statement in schema:
                    conn.execute(statement.format(blob=self.blob, real=self.real))
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot create the PostgreSQL {what} tables: {exc}") from exc
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
            raise StoreError(f"the PostgreSQL {self._what} database must use UTF8 encoding, not {row and row[0]!r}")
        return conn

    def _open(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise ClosedError(f"the {self._what} is closed")
        if self._conn.closed:  # only ever by a lost connection: close() drops the reference
            self._conn = self._connect()
        return self._conn

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False, lock: int | None = None) -> Iterator[Tx]:
        with self._lock:
            try:
                conn = self._open()
                with conn.transaction(), conn.cursor() as cursor:
                    if lock is not None:
                        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
                    yield Tx(cursor, "%s")
            except self._db_error as exc:
                raise StoreError(f"{self._what} {'write' if write else 'read'} failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def open_database(target: str | os.PathLike[str], schema: Sequence[str], what: str) -> Database:
    """A ``postgresql://`` (or ``postgres://``) URL's database, or a SQLite file's (created if
    missing), with ``schema``'s ``CREATE ... IF NOT EXISTS`` statements run (``{blob}`` and
    ``{real}`` in them are the dialect's column types)."""
    if is_postgres_url(target):
        return PostgresDatabase(str(target), schema, what)
    return SqliteDatabase(target, schema, what)
