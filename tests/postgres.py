"""A throwaway PostgreSQL server for the tests that need one (the stores' backends).

It is started for the test session from the local binaries (``initdb``/``pg_ctl`` on PATH or in
Debian's ``/usr/lib/postgresql/*/bin``), or is an existing one named by
``CODEMODE_TEST_POSTGRES_URL`` (a ``postgresql://`` URL of a role allowed to create databases).
Without either, or without ``psycopg``, the PostgreSQL cases skip and say why. ``database_target``
gives each test a SQLite file or a fresh PostgreSQL database (both, as two parametrized cases).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest


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


@pytest.fixture(params=["sqlite", "postgres"])
def database_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where one test's database lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"codemode_test_{secrets.token_hex(6)}"
    server.admin(f"CREATE DATABASE {name}")
    yield server.database_url(name)
    server.admin(f"DROP DATABASE {name} WITH (FORCE)")
