"""codemode logs through named loggers (``codemode.<module>``), and says so when an MCP server
cannot be used: at WARNING when it fails, naming it and why, not again for each retry that
fails alike, and at INFO once it works."""

from __future__ import annotations

import logging
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from codemode import mcp_listing
from codemode import session as session_module

PACKAGE = Path(session_module.__file__).parent
TESTS = Path(__file__).parent


def test_every_module_logs_through_a_logger_named_after_it():
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        loggers = re.findall(r"logging\.getLogger\(([^)]*)\)", source)
        # (The command line also sets up the package's logger: its warnings are lines on stderr.)
        allowed = {"__name__", '"codemode"'} if path.name == "cli.py" else {"__name__"}
        assert set(loggers) <= allowed, f"{path.name}: {loggers}"
        # Nothing logs through the root logger (`logging.warning(...)` and the like).
        root_calls = re.findall(r"\blogging\.(debug|info|warning|error|exception|critical|log)\(", source)
        assert not root_calls, f"{path.name} logs through the root logger: {root_calls}"


def mcp_warnings(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "codemode.mcp_listing" and r.levelno == level]


def test_an_mcp_server_that_cannot_start_is_logged_once_naming_it(make_codemode, caplog, monkeypatch, tmp_path: Path):
    monkeypatch.setattr(mcp_listing, "MCP_RETRY_S", 0.0)  # every listing retries a failed server
    late = tmp_path / "late-server"  # not there yet
    servers = {
        "gone": {"command": "/nonexistent/mcp-server"},
        "quits": {"command": sys.executable, "args": ["-c", "pass"]},
        "late": {"command": str(late)},
    }
    cm = make_codemode({"workers": 1, "mcpServers": servers})
    with caplog.at_level(logging.DEBUG, logger="codemode.mcp_listing"):
        assert cm.session().exec({"code": "return 1"})["value"] == 1  # an exec lists them
        warned = mcp_warnings(caplog)
        assert sorted(m.split(" is unavailable: ")[0] for m in warned) == [
            "MCP server 'gone'",
            "MCP server 'late'",
            "MCP server 'quits'",
        ], warned
        assert any("No such file or directory" in m for m in warned if "'gone'" in m)
        assert any("did the server exit?" in m for m in warned if "'quits'" in m)

        caplog.clear()
        late.write_text(f"#!/bin/sh\nexec {sys.executable} {TESTS / 'mcp_named_server.py'} lookup\n")
        late.chmod(late.stat().st_mode | stat.S_IXUSR)
        reasons = cm.load_mcp_tools()
        assert reasons["late"] is None and reasons["gone"] is not None
        assert mcp_warnings(caplog) == []  # the same failures again: DEBUG only
        assert len(mcp_warnings(caplog, logging.DEBUG)) == 2
        assert mcp_warnings(caplog, logging.INFO) == ["MCP server 'late' is available"]


def test_codemode_serve_says_at_start_up_which_mcp_server_cannot_start(tmp_path: Path):
    config = tmp_path / "servers.json"
    config.write_text('{"mcpServers": {"gone": {"command": "/nonexistent/mcp-server"}}}')
    # stdin is closed: the stdio server starts, reads EOF and exits.
    proc = subprocess.run(
        [sys.executable, "-m", "codemode", "serve", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith("codemode: warning: MCP server 'gone' is unavailable: could not start"), warning
    assert proc.stdout == ""  # (stdout is the MCP stream)
