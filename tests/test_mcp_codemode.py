"""MCP servers nobody here wrote, seen from a cell: `MCP.*`, `API`, `$api`, resources, prompts;
and `codemode serve` driven by the `mcp` SDK's own client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import codemode.session
import pytest
from codemode import CodeMode
from codemode.errors import ConfigError
from codemode.serve import load_servers_config
from mcp import Client, StdioServerParameters
from mcp_servers import everything_server, time_server


@pytest.fixture(scope="module")
def mcm():
    config = {
        "workers": 1,
        "timeoutMs": 20_000,
        "mcpServers": {"time": time_server(), "everything": everything_server()},
    }
    with CodeMode(config) as cm:
        assert cm.load_mcp_tools() == {"time": None, "everything": None}
        yield cm


@pytest.fixture
def ms(mcm):
    return mcm.session("mcp")


def value(session, code: str) -> Any:
    result = session.exec({"code": code})
    assert result["status"] == "completed", result
    return result["value"]


def test_mcp_tools_are_in_the_run_catalog_but_not_in_all_tools(mcm, ms):
    ids = set(mcm.catalog().tools)
    assert "mcp:time:get_current_time" in ids
    assert "mcp:everything:get-sum" in ids
    assert value(ms, "return ALL_TOOLS.filter(t => t.source === 'mcp').length") == 0
    assert value(ms, "return (await tools.search('current time')).map(t => t.id)") == []


def test_hyphenated_names_become_camel_case_identifiers(ms):
    assert value(ms, "return Object.keys(MCP).sort()") == ["everything", "time"]
    assert "getSum" in value(ms, "return Object.keys(MCP.everything)")


def test_call_through_mcp_namespace_returns_the_mcp_tool_result(ms):
    result = value(ms, "return await MCP.everything.getSum({a: 2, b: 3})")
    assert result["isError"] is False
    assert "5" in json.dumps(result["content"])
    now = value(ms, "return await MCP.time.getCurrentTime({timezone: 'UTC'})")
    assert now["structuredContent"]["timezone"] == "UTC"


def test_direct_catalog_call_of_an_mcp_tool_is_refused(ms):
    code = "try { await tools.callValue('mcp:everything:get-sum', {a: 1, b: 2}); return 'ran' }"
    code += " catch (e) { return e.message }"
    assert value(ms, code) == "unknown tool: mcp:everything:get-sum"


def test_api_files_declare_visible_servers_without_a_tool_call(ms):
    result = ms.exec({"code": "return [await API.list('mcp'), await API.read('mcp/everything.d.ts')]"})
    files, declaration = result["value"]
    assert sorted(f["path"] for f in files) == ["mcp/everything.d.ts", "mcp/index.d.ts", "mcp/time.d.ts"]
    assert "declare namespace MCP.everything" in declaration
    assert "function getSum(input: {" in declaration
    assert '// MCP tool name: "get-sum"' in declaration
    assert result["telemetry"]["toolCalls"] == 0


@pytest.mark.parametrize("path", ["mcp/../secret", "./mcp/index.d.ts", "mcp/nope.d.ts", "/etc/passwd", ""])
def test_api_read_refuses_unknown_and_dotted_paths(ms, path):
    code = f"try {{ await API.read({json.dumps(path)}); return 'read' }} catch (e) {{ return e.message }}"
    message = value(ms, code)
    assert message != "read"
    assert "API path" in message


def test_dollar_api_returns_the_declaration_header_inline(ms):
    header = value(ms, "return await MCP.everything.$api('get-sum', {schema: true})")
    assert header["tool"] == "get-sum"
    assert "function getSum(" in header["declaration"]
    assert header["schema"]["type"] == "object"
    whole = value(ms, "return await MCP.time.$api()")
    assert "declare namespace MCP.time" in whole["declaration"]


def test_resource_read_and_prompt_get(ms):
    listed = value(ms, "return await MCP.everything.resources.list()")
    uri = listed[0]["uri"]
    read = value(ms, f"return await MCP.everything.resources.read({{uri: {json.dumps(uri)}}})")
    assert read["contents"][0]["uri"] == uri
    prompts = value(ms, "return await MCP.everything.prompts.list()")
    simple = next(p for p in prompts if not p.get("arguments"))
    got = value(ms, f"return await MCP.everything.prompts.get({{name: {json.dumps(simple['name'])}}})")
    assert got["messages"]


def test_mcp_tool_error_is_an_is_error_result_the_cell_can_check(ms):
    result = value(ms, "return await MCP.time.getCurrentTime({timezone: 'Not/AZone'})")
    assert result["isError"] is True


def test_codemode_serve_exposes_exec_and_wait_to_an_mcp_client(tmp_path: Path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": time_server()}}))

    async def session() -> tuple[list[str], dict[str, Any], str]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "codemode.cli", "serve", "--config", str(config)]
        )
        async with Client(params) as client:
            listed = await client.list_tools()
            names = sorted(t.name for t in listed.tools)
            description = next(t.description or "" for t in listed.tools if t.name == "exec")
            cell = "const r = await MCP.time.getCurrentTime({timezone: 'UTC'}); return r.structuredContent.timezone"
            called = await client.call_tool("exec", {"code": cell})
            text = "".join(getattr(block, "text", "") for block in called.content)
            return names, json.loads(text), description

    names, result, description = asyncio.run(session())
    assert names == ["exec", "wait"]
    assert result["status"] == "completed"
    assert result["value"] == "UTC"
    assert "tools.search" in description


def test_a_server_that_cannot_start_gives_a_clear_error_and_the_host_keeps_working(make_codemode):
    cm = make_codemode({"workers": 1, "mcpServers": {"broken": {"command": "/nonexistent/mcp-server"}}})
    s = cm.session()
    message = value(s, "try { await MCP.broken.anything({}); return 'ran' } catch (e) { return e.message }")
    assert "broken" in message and "unavailable" in message
    assert value(s, "return 40 + 2") == 42


def test_codemode_serve_over_streamable_http_on_localhost(tmp_path: Path):
    import socket
    import subprocess
    import time

    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": time_server()}}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "codemode.cli", "serve", "--config", str(config), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)

        async def call() -> dict[str, Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                called = await client.call_tool(
                    "exec", {"code": "return (await MCP.time.getCurrentTime({timezone: 'UTC'})).isError"}
                )
                return json.loads("".join(getattr(block, "text", "") for block in called.content))

        result = asyncio.run(call())
        assert result["status"] == "completed"
        assert result["value"] is False
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_disabled_server_is_reported_never_started_and_not_shown_to_cells(make_codemode, tmp_path: Path):
    marker = tmp_path / "started"
    entry = {"command": "/bin/sh", "args": ["-c", 'touch "$0"', str(marker)], "disabled": True}
    cm = make_codemode({"workers": 1, "mcpServers": {"off": entry}})

    assert cm.load_mcp_tools() == {"off": 'disabled in its config ("disabled": true); not started'}
    assert value(cm.session(), "return await API.list('mcp')") == []
    assert not marker.exists()


def test_a_malformed_entry_fails_codemode_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch):
    def no_workers(size: int) -> None:
        raise AssertionError("worker processes started before the MCP entries were checked")

    monkeypatch.setattr(codemode.session, "Supervisor", no_workers)
    servers = {"good": {"command": "srv"}, "bad": {"command": "srv", "args": "--flag"}}
    with pytest.raises(ConfigError, match=r"^MCP server 'bad': Expected `array`, got `str` - at `\$.args`$"):
        CodeMode({"mcpServers": servers})


def test_codemode_serve_names_the_server_and_key_of_a_malformed_entry(tmp_path: Path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": "x", "transportType": "websocket"}}}))

    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "serve", "--config", str(config)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert proc.returncode == 1
    assert proc.stderr == (
        "codemode serve: MCP server 'time': 'transportType' must be one of 'stdio', 'http', 'streamable-http', "
        "'streamableHttp', 'sse', not 'websocket'\n"
    )


def test_serve_reads_a_vs_code_mcp_json_with_servers_instead_of_mcp_servers(tmp_path: Path):
    config = tmp_path / "mcp.json"
    vscode = {"inputs": [], "servers": {"memory": {"type": "stdio", "command": "npx", "args": ["-y", "srv"]}}}
    config.write_text(json.dumps(vscode))

    assert load_servers_config(config) == vscode["servers"]
