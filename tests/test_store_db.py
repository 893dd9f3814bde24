"""The store's persistence layer: both backends against a real database.

The core tests run on a SQLite file and on PostgreSQL. PostgreSQL is a throwaway server started
for the session from the local binaries (``initdb``/``pg_ctl`` on PATH or in Debian's
``/usr/lib/postgresql/*/bin``), or an existing one named by ``CODEMODE_TEST_POSTGRES_URL`` (a
``postgresql://`` URL of a role allowed to create databases). Without either, or without
``psycopg``, the PostgreSQL cases skip and say why.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
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

S, MAIN = "session-1", "main"


def json_string(length: int) -> str:
    """JSON text of exactly ``length`` characters (a string value)."""
    return json.dumps("x" * (length - 2))


# -- a PostgreSQL server ----------------------------------------------------------------------


def find_pg_bin() -> Path | None:
    """The newest directory holding both ``initdb`` and ``pg_ctl``."""
    on_path = shutil.which("pg_ctl")
    dirs = [Path(on_path).resolve().parent] if on_path else []
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name), reverse=True)
    dirs += [Path(d) for d in debian]
    return next((d for d in dirs if (d / "initdb").exists() and (d / "pg_ctl").exists()), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    """A server URL; hands out a fresh database per test so tests cannot see each other."""

    def __init__(self, url: str) -> None:
        self.url = url

    def database_url(self, name: str) -> str:
        return urllib.parse.urlsplit(self.url)._replace(path="/" + name).geturl()

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)


def require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:  # not importorskip: a psycopg without libpq raises a plain ImportError
        pytest.skip(f"PostgreSQL tests need psycopg: pip install 'psycopg[binary]' ({exc})")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    require_psycopg()
    external = os.environ.get("CODEMODE_TEST_POSTGRES_URL")
    if external:
        yield PostgresServer(external)
        return
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql, "
            "or set CODEMODE_TEST_POSTGRES_URL"
        )
    # PostgreSQL refuses to run as root, so as root the server runs as the 'postgres' user.
    uid: int | None = None
    gid: int | None = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
        uid, gid = user.pw_uid, user.pw_gid
    root = Path(tempfile.mkdtemp(prefix="codemode-pg-"))  # not tmp_path: only root may enter that
    if uid is not None and gid is not None:
        os.chown(root, uid, gid)
    data, log, port = root / "data", root / "server.log", free_port()

    def pg(program: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bin_dir / program), *args],
            capture_output=True,
            text=True,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
        )

    try:
        init = pg("initdb", "-D", str(data), "-U", "codemode", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
        assert init.returncode == 0, f"initdb failed: {init.stderr}"
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        start = pg("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "30", "start")
        assert start.returncode == 0, f"pg_ctl start failed: {start.stderr}\n{log.read_text(errors='replace')[-2000:]}"
        yield PostgresServer(f"postgresql://codemode@127.0.0.1:{port}/postgres")
    finally:
        if pg("pg_ctl", "-D", str(data), "status").returncode == 0:
            stop = pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
            assert stop.returncode == 0, f"pg_ctl stop failed; the server in {data} still runs: {stop.stderr}"
        shutil.rmtree(root, ignore_errors=True)


# -- stores on either backend -----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where one test's database lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"codemode_test_{secrets.token_hex(6)}"
    server.admin(f"CREATE DATABASE {name}")
    yield server.database_url(name)
    server.admin(f"DROP DATABASE {name} WITH (FORCE)")


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
