"""The store's persistence layer: both backends against a real database.

The core tests run on a SQLite file and on PostgreSQL (a throwaway server: ``tests/postgres.py``).
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from codemode import ClosedError, ConfigError
from codemode.errors import StoreError, StoreLimitError
from codemode.store import (
    MAX_KEY_CHARS,
    MAX_TOTAL_CHARS,
    MAX_VALUE_CHARS,
    PostgresStore,
    SqliteStore,
    Store,
    open_store,
)
from postgres import PostgresServer, free_port, require_psycopg

S, MAIN = "session-1", "main"


def json_string(length: int) -> str:
    """JSON text of exactly ``length`` characters (a string value)."""
    return json.dumps("x" * (length - 2))


@pytest.fixture
def target(database_target: str) -> str:
    return database_target


@pytest.fixture
def make_store(target: str) -> Iterator[Callable[[], Store]]:
    """Opens stores (each with its own connection) on the test's database; closed at teardown."""
    opened: list[Store] = []

    def make() -> Store:
        store = open_store(target)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_commit_and_snapshot_roundtrip(make_store: Callable[[], Store]) -> None:
    store = make_store()
    writes = {"a": "1", "b": '{"x": [1, 2.5, null]}', "ünï 🦀 key": '"ünï 🦀 value"', "empty": '""'}
    store.commit(S, MAIN, writes)
    assert store.snapshot(S, MAIN) == writes
    assert store.snapshot(S, "other") == {}
    assert store.snapshot("no-such-session", MAIN) == {}


def test_overwrite_and_delete_with_none(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.commit(S, MAIN, {"a": "1", "b": "2"})
    store.commit(S, MAIN, {"a": "3", "b": None, "never-stored": None})
    assert store.snapshot(S, MAIN) == {"a": "3"}
    store.commit(S, MAIN, {})
    assert store.snapshot(S, MAIN) == {"a": "3"}


def test_branches_are_isolated(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.commit(S, MAIN, {"a": "1", "b": "2"})
    store.commit(S, "fork", {"a": "10", "c": "30", "b": None})
    assert store.snapshot(S, MAIN) == {"a": "1", "b": "2"}
    assert store.snapshot(S, "fork") == {"a": "10", "c": "30"}


def test_sessions_are_isolated(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.commit("s1", MAIN, {"a": "1"})
    store.commit("s2", MAIN, {"a": "2", "b": "3"})
    store.commit("s2", MAIN, {"a": None})
    assert store.snapshot("s1", MAIN) == {"a": "1"}
    assert store.snapshot("s2", MAIN) == {"b": "3"}


def test_reopening_keeps_committed_values(make_store: Callable[[], Store]) -> None:
    first = make_store()
    first.commit(S, MAIN, {"a": "1"})
    first.commit(S, "fork", {"b": "[2]"})
    first.close()
    first.close()  # idempotent
    with pytest.raises(ClosedError):
        first.snapshot(S, MAIN)
    with pytest.raises(ClosedError):
        first.commit(S, MAIN, {"a": "2"})
    again = make_store()
    assert again.snapshot(S, MAIN) == {"a": "1"}
    assert again.snapshot(S, "fork") == {"b": "[2]"}


def test_a_commit_over_the_total_limit_changes_nothing(make_store: Callable[[], Store]) -> None:
    store = make_store()
    # Four one-character keys whose values bring the branch to exactly the limit: allowed.
    full = {key: json_string(MAX_TOTAL_CHARS // 4 - 1) for key in "abcd"}
    store.commit(S, MAIN, full)
    assert store.snapshot(S, MAIN) == full
    with pytest.raises(StoreLimitError, match="1048578"):
        store.commit(S, MAIN, {"z": "1"})
    # Shrinking "a" and deleting "b" happen in the same commit as the overflow, and are undone.
    big = json_string(MAX_VALUE_CHARS)
    with pytest.raises(StoreLimitError, match="total"):
        store.commit(S, MAIN, {"a": "1", "b": None, "y": big, "z": big})
    assert store.snapshot(S, MAIN) == full
    # The limit applies to the resulting state: deleting in the same commit makes room.
    store.commit(S, MAIN, {"a": None, "b": None, "y": big})
    assert store.snapshot(S, MAIN) == {"c": full["c"], "d": full["d"], "y": big}


def test_limits_count_characters_not_bytes(make_store: Callable[[], Store]) -> None:
    """Astral characters are four UTF-8 bytes each; a byte-counting total would refuse this."""
    store = make_store()

    def crabs(length: int) -> str:
        return json.dumps("🦀" * (length - 2), ensure_ascii=False)

    writes = {key: crabs(MAX_VALUE_CHARS) for key in "abc"}
    writes["d"] = crabs(MAX_TOTAL_CHARS - 3 * (MAX_VALUE_CHARS + 1) - 1)
    store.commit(S, MAIN, writes)
    assert store.snapshot(S, MAIN) == writes
    with pytest.raises(StoreLimitError, match="1048578"):
        store.commit(S, MAIN, {"e": "1"})


def test_per_value_limit(make_store: Callable[[], Store]) -> None:
    store = make_store()
    store.commit(S, MAIN, {"max": json_string(MAX_VALUE_CHARS)})
    with pytest.raises(StoreLimitError, match="262145"):
        store.commit(S, MAIN, {"fine": "1", "over": json_string(MAX_VALUE_CHARS + 1)})
    assert store.snapshot(S, MAIN) == {"max": json_string(MAX_VALUE_CHARS)}


def test_key_limit_and_malformed_writes(make_store: Callable[[], Store]) -> None:
    store = make_store()
    longest = "k" * MAX_KEY_CHARS
    store.commit(S, MAIN, {longest: "1"})
    with pytest.raises(StoreLimitError, match="1025"):
        store.commit(S, MAIN, {"fine": "1", "k" * (MAX_KEY_CHARS + 1): "1"})
    # Malformed rather than too big; the same on both backends although SQLite could hold some.
    malformed: list[dict[str, str | None]] = [
        {"": "1"},
        {"nul\x00key": "1"},
        {"lone\ud800surrogate": "1"},
        {"k": '"nul\x00value"'},
        {"k": 1},  # type: ignore[dict-item]
        {3: "1"},  # type: ignore[dict-item]
    ]
    for writes in malformed:
        with pytest.raises(StoreError) as caught:
            store.commit(S, MAIN, {"fine": "1", **writes})
        assert not isinstance(caught.value, StoreLimitError), writes
    assert store.snapshot(S, MAIN) == {longest: "1"}


def test_concurrent_commits_through_one_store(make_store: Callable[[], Store]) -> None:
    store = make_store()
    threads, rounds = 8, 40

    def work(i: int) -> None:
        branch = f"b{i % 2}"
        for n in range(rounds):
            store.commit(S, branch, {f"t{i}": json.dumps(n), "shared": json.dumps(i), f"gone{i}": None})
            assert store.snapshot(S, branch)[f"t{i}"] == json.dumps(n)

    run_threads(threads, work)
    for branch, members in (("b0", range(0, threads, 2)), ("b1", range(1, threads, 2))):
        values = store.snapshot(S, branch)
        assert {k: v for k, v in values.items() if k != "shared"} == {f"t{i}": json.dumps(rounds - 1) for i in members}
        assert int(values["shared"]) in members


def test_concurrent_commits_from_separate_connections_respect_the_limit(make_store: Callable[[], Store]) -> None:
    """Each commit alone fits; together they do not, so exactly as many as fit may succeed."""
    threads, size = 8, 200_000
    fits = MAX_TOTAL_CHARS // (size + 2)  # keys are two characters
    stores = [make_store() for _ in range(threads)]
    outcomes: list[str] = []
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        try:
            stores[i].commit(S, MAIN, {f"k{i}": json_string(size)})
            outcomes.append("ok")
        except StoreLimitError:
            outcomes.append("limit")

    run_threads(threads, work)
    assert sorted(outcomes) == ["limit"] * (threads - fits) + ["ok"] * fits
    assert len(stores[0].snapshot(S, MAIN)) == fits


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Runs ``work(i)`` on ``count`` threads and re-raises the first failure in the test."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]


# -- backend specifics ------------------------------------------------------------------------


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    memory = open_store(None)
    file_store = open_store(tmp_path / "a.db")
    try:
        assert isinstance(memory, SqliteStore)
        assert isinstance(file_store, SqliteStore)
        assert (tmp_path / "a.db").exists()
    finally:
        memory.close()
        file_store.close()
    with pytest.raises(ConfigError):
        open_store(42)  # type: ignore[arg-type]


def test_in_memory_stores_are_private() -> None:
    one, two = SqliteStore(), SqliteStore()
    try:
        one.commit(S, MAIN, {"a": "1"})
        assert two.snapshot(S, MAIN) == {}
    finally:
        one.close()
        two.close()


def test_sqlite_file_uses_wal(tmp_path: Path) -> None:
    import sqlite3

    SqliteStore(tmp_path / "wal.db").close()
    conn = sqlite3.connect(tmp_path / "wal.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()


def test_sqlite_path_that_cannot_be_opened(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open"):
        SqliteStore(tmp_path / "missing-dir" / "store.db")


def test_postgres_without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes ``import psycopg`` raise ImportError
    with pytest.raises(StoreError, match="psycopg"):
        open_store("postgresql://localhost/codemode")


def test_postgres_server_not_reachable() -> None:
    require_psycopg()
    with pytest.raises(StoreError, match="cannot connect"):
        PostgresStore(f"postgresql://codemode@127.0.0.1:{free_port()}/postgres?connect_timeout=5")


def test_postgres_reconnects_after_losing_the_connection(postgres_server: PostgresServer) -> None:
    name = f"codemode_test_{secrets.token_hex(6)}"
    postgres_server.admin(f"CREATE DATABASE {name}")
    store = PostgresStore(postgres_server.database_url(name))
    try:
        store.commit(S, MAIN, {"a": "1"})
        postgres_server.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
        with pytest.raises(StoreError, match="read failed"):
            store.snapshot(S, MAIN)
        assert store.snapshot(S, MAIN) == {"a": "1"}
        store.commit(S, MAIN, {"b": "2"})
        assert store.snapshot(S, MAIN) == {"a": "1", "b": "2"}
    finally:
        store.close()
        postgres_server.admin(f"DROP DATABASE {name} WITH (FORCE)")
