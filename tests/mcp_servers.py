"""Finds and starts the real MCP servers the MCP client tests talk to.

``tools/install_mcp_servers.sh`` installs them: ``mcp-server-time`` (PyPI) into the venv and
``@modelcontextprotocol/server-everything`` (npm) under ``.mcp-servers/``. A missing server skips
its tests with the reason, except under ``CI=true``, where it fails them: CI must not go green
by testing nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
EVERYTHING_JS = (
    REPO / ".mcp-servers" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
)
INSTALL_HINT = "run tools/install_mcp_servers.sh"


def missing(reason: str) -> NoReturn:
    """Skips the test, or fails it in CI, because a server it needs is not installed."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: missing MCP test servers fail instead of skipping)")
    pytest.skip(reason)


def time_server() -> dict[str, Any]:
    """Config for ``mcp-server-time`` (stdio; Python), with a fixed local timezone."""
    args = ["--local-timezone", "UTC"]
    script = Path(sys.executable).parent / "mcp-server-time"
    if script.is_file():
        return {"command": str(script), "args": args}
    if importlib.util.find_spec("mcp_server_time") is not None:
        return {"command": sys.executable, "args": ["-m", "mcp_server_time", *args]}
    missing(f"mcp-server-time is not installed in {sys.prefix}; {INSTALL_HINT}")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        missing("node is not on PATH; server-everything needs Node.js 20+")
    if not EVERYTHING_JS.is_file():
        missing(f"server-everything is not installed at {EVERYTHING_JS.parent.parent}; {INSTALL_HINT}")
    return node


def everything_server() -> dict[str, Any]:
    """Config for ``@modelcontextprotocol/server-everything`` over stdio (Node)."""
    return {"command": _node(), "args": [str(EVERYTHING_JS), "stdio"]}


def with_pidfile(config: dict[str, Any], pidfile: Path) -> dict[str, Any]:
    """The same stdio server, started through ``sh`` so that its pid lands in ``pidfile``.

    ``exec`` replaces the shell, so the pid written is the server's own: a test can kill the
    real server process, which the SDK does not expose.
    """
    script = 'echo $$ > "$0"; exec "$@"'
    return {**config, "command": "/bin/sh", "args": ["-c", script, str(pidfile), config["command"], *config["args"]]}


def read_pid(pidfile: Path, timeout_s: float = 10.0) -> int:
    """The pid ``with_pidfile`` recorded, once the shell has written it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = pidfile.read_text() if pidfile.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.01)
    raise AssertionError(f"no pid in {pidfile} after {timeout_s} s")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Polls ``condition`` until it holds; fails with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} (after {timeout_s} s)")
        time.sleep(0.01)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Waits until ``pid`` no longer exists (killed *and* reaped by its parent, the SDK)."""
    wait_until(lambda: not _exists(pid), f"process {pid} still exists", timeout_s)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: server-everything's network transports, and the path each one serves MCP on.
_EVERYTHING_PATHS = {"streamableHttp": "/mcp", "sse": "/sse"}


@contextmanager
def everything_http(
    transport: Literal["streamableHttp", "sse"] = "streamableHttp", *, port: int | None = None, timeout_s: float = 20.0
) -> Iterator[str]:
    """Runs server-everything's streamable HTTP (or legacy SSE) transport on ``port`` (a free one
    by default); yields its URL."""
    node = _node()
    port = _free_port() if port is None else port
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", ""), "PORT": str(port)}
    process = subprocess.Popen(
        [node, str(EVERYTHING_JS), transport], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"server-everything ({transport}) did not listen on port {port}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}{_EVERYTHING_PATHS[transport]}"
    finally:
        process.kill()
        process.wait()
