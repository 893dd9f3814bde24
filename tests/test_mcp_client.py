"""The MCP client against real servers: listing, calls, failures, reconnects, shutdown; and the
server entries other MCP clients write.

Servers: ``mcp-server-time`` (Python, negotiates the 2026-07-28 protocol) and
``@modelcontextprotocol/server-everything`` (Node, 2025-11-25), over stdio, streamable HTTP and
the legacy SSE transport.
See ``tests/mcp_servers.py`` for how they are found (and skipped, or failed under ``CI=true``).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest
from codemode.errors import ClosedError, ConfigError, McpServerError, McpTimeoutError
from codemode.mcp import McpServers, McpStdioServerConfig, parse_server_config
from mcp_servers import everything_http, everything_server, read_pid, time_server, wait_gone, wait_until, with_pidfile

EVERYTHING_TOOLS = 13
EVERYTHING_RESOURCES = 7
EVERYTHING_PROMPTS = 4
LONG_TOOL = "trigger-long-running-operation"
UNAVAILABLE = "MCP server 'every' is unavailable"


@pytest.fixture(scope="module")
def servers() -> Iterator[McpServers]:
    """Both servers over stdio, shared by the tests that leave them running."""
    with McpServers({"time": time_server(), "every": everything_server()}) as shared:
        yield shared


@pytest.fixture
def pidfile(tmp_path: Path) -> Path:
    return tmp_path / "server.pid"


@pytest.fixture
def killable(pidfile: Path) -> Iterator[McpServers]:
    """server-everything as ``every``, started so the test can read (and kill) its pid."""
    with McpServers({"every": with_pidfile(everything_server(), pidfile)}) as own:
        yield own


def text_of(result: dict[str, Any]) -> str:
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


# -- listing ---------------------------------------------------------------------------------


def test_lists_tools_of_both_servers_with_schemas(servers: McpServers) -> None:
    time_tools = {tool.name: tool for tool in servers.list_tools("time")}
    every_tools = {tool.name: tool for tool in servers.list_tools("every")}

    assert {"get_current_time", "convert_time"} <= set(time_tools)
    current = time_tools["get_current_time"]
    assert current.description
    assert current.input_schema["type"] == "object"
    assert current.input_schema["required"] == ["timezone"]
    assert current.output_schema is not None

    assert len(every_tools) == EVERYTHING_TOOLS
    get_sum = every_tools["get-sum"]
    assert set(get_sum.input_schema["properties"]) == {"a", "b"}
    assert get_sum.title == "Get Sum Tool"
    assert get_sum.output_schema is None
    assert every_tools["get-structured-content"].output_schema is not None


def test_tool_info_encodes_to_the_spec_camel_case_shape(servers: McpServers) -> None:
    (get_sum,) = [tool for tool in servers.list_tools("every") if tool.name == "get-sum"]
    encoded = msgspec.to_builtins(get_sum)
    assert set(encoded) == {"name", "description", "inputSchema", "title"}


def test_lists_resources_and_prompts(servers: McpServers) -> None:
    resources = servers.list_resources("every")
    prompts = {prompt.name: prompt for prompt in servers.list_prompts("every")}

    assert len(resources) == EVERYTHING_RESOURCES
    assert all(resource.uri.startswith("demo://") for resource in resources)
    assert len(prompts) == EVERYTHING_PROMPTS
    args = {arg.name: arg.required for arg in prompts["args-prompt"].arguments}
    assert args == {"city": True, "state": False}


# -- requests --------------------------------------------------------------------------------


def test_time_server_returns_current_time_as_text_and_structured_content(servers: McpServers) -> None:
    result = servers.call_tool("time", "get_current_time", {"timezone": "Europe/Paris"})

    assert result["isError"] is False
    assert result["structuredContent"]["timezone"] == "Europe/Paris"
    assert json.loads(text_of(result))["datetime"] == result["structuredContent"]["datetime"]
    assert set(result) == {"content", "structuredContent", "isError"}


def test_get_sum_on_everything(servers: McpServers) -> None:
    result = servers.call_tool("every", "get-sum", {"a": 2, "b": 3})

    assert result == {"content": [{"type": "text", "text": "The sum of 2 and 3 is 5."}], "isError": False}


def test_tool_failure_is_result_data_with_is_error(servers: McpServers) -> None:
    result = servers.call_tool("time", "get_current_time", {"timezone": "Nowhere/Atlantis"})

    assert result["isError"] is True
    assert "Invalid timezone" in text_of(result)


def test_unknown_tool_is_rejected_with_the_json_rpc_code(servers: McpServers) -> None:
    with pytest.raises(McpServerError, match=r"MCP server 'time' rejected tools/call 'nope': Unknown tool") as info:
        servers.call_tool("time", "nope", {})
    assert info.value.code == -32602
    assert info.value.server == "time"


def test_read_resource_returns_contents(servers: McpServers) -> None:
    uri = "demo://resource/static/document/features.md"
    result = servers.read_resource("every", uri)

    (content,) = result["contents"]
    assert content["uri"] == uri
    assert content["mimeType"] == "text/markdown"
    assert content["text"].startswith("# Everything Server")


def test_get_prompt_renders_messages_with_arguments(servers: McpServers) -> None:
    result = servers.get_prompt("every", "args-prompt", {"city": "Paris"})

    assert result == {"messages": [{"role": "user", "content": {"type": "text", "text": "What's weather in Paris?"}}]}


def test_unknown_prompt_is_rejected(servers: McpServers) -> None:
    with pytest.raises(McpServerError, match=r"rejected prompts/get 'nope'.*not found"):
        servers.get_prompt("every", "nope")


def test_async_twins_work_from_another_event_loop(servers: McpServers) -> None:
    async def main() -> None:
        total, now, resource, prompts = await asyncio.gather(
            servers.acall_tool("every", "get-sum", {"a": 1, "b": 1}),
            servers.acall_tool("time", "get_current_time", {"timezone": "UTC"}),
            servers.aread_resource("every", "demo://resource/static/document/features.md"),
            servers.alist_prompts("every"),
        )
        assert text_of(total) == "The sum of 1 and 1 is 2."
        assert now["structuredContent"]["timezone"] == "UTC"
        assert resource["contents"]
        assert len(prompts) == EVERYTHING_PROMPTS

    asyncio.run(main())


def test_concurrent_calls_from_threads_share_one_server_process(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)
    results: list[str] = []

    def call(n: int) -> None:
        results.append(text_of(killable.call_tool("every", "get-sum", {"a": n, "b": 1})))

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == sorted(f"The sum of {n} and 1 is {n + 1}." for n in range(8))
    assert read_pid(pidfile) == pid


def test_stdio_config_env_reaches_the_server() -> None:
    config = {**everything_server(), "env": {"CODEMODE_MCP_TEST": "hello"}}
    with McpServers({"every": config}) as own:
        env = json.loads(text_of(own.call_tool("every", "get-env")))
    assert env["CODEMODE_MCP_TEST"] == "hello"
    # The SDK's default environment, not the host's: host-only variables stay out.
    assert "PYTEST_CURRENT_TEST" not in env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's cwd from /proc")
def test_stdio_config_cwd_is_the_server_working_directory(tmp_path: Path, pidfile: Path) -> None:
    config = {**with_pidfile(everything_server(), pidfile), "cwd": str(tmp_path)}
    with McpServers({"every": config}) as own:
        own.connect("every")
        assert os.readlink(f"/proc/{read_pid(pidfile)}/cwd") == str(tmp_path)


def test_streamable_http_server_with_headers() -> None:
    with everything_http() as url, McpServers({"web": {"url": url, "headers": {"X-Codemode-Test": "1"}}}) as own:
        assert len(own.list_tools("web")) == EVERYTHING_TOOLS
        assert text_of(own.call_tool("web", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."


def test_sse_server_from_a_cline_entry_lists_calls_and_reads() -> None:
    with everything_http("sse") as url:
        entry = {
            "url": url,
            "transportType": "sse",
            "headers": {"X-Codemode-Test": "1"},
            "disabled": False,
            "alwaysAllow": ["get-sum"],
            "autoApprove": [],
            "timeout": 60,
        }
        with McpServers({"legacy": entry}) as own:
            assert len(own.list_tools("legacy")) == EVERYTHING_TOOLS
            assert text_of(own.call_tool("legacy", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
            assert own.read_resource("legacy", "demo://resource/static/document/features.md")["contents"]


def test_a_url_without_a_transport_finds_either_kind_of_server_and_keeps_to_it() -> None:
    for transport in ("streamableHttp", "sse"):
        with everything_http(transport) as url, McpServers({"bare": {"url": url}}) as own:
            assert text_of(own.call_tool("bare", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
            kept = own._connection("bare").config
            assert kept.type == ("http" if transport == "streamableHttp" else "sse")
    with McpServers({"none": {"url": "http://127.0.0.1:9/mcp"}}, timeout_s=5) as own:
        with pytest.raises(McpServerError, match=r"is unavailable: .*; over SSE: "):
            own.list_tools("none")


def test_a_message_post_an_sse_server_refuses_fails_its_call_at_once_and_the_next_reconnects() -> None:
    # server-everything's SSE transport refuses message bodies over 4 MB (413). The SDK's SSE
    # client only logs that and stops sending: the call waited its whole timeout, and the next
    # one went into the dead session.
    with everything_http("sse") as url, McpServers({"legacy": {"url": url}}, timeout_s=20) as own:
        assert text_of(own.call_tool("legacy", "get-sum", {"a": 1, "b": 1})) == "The sum of 1 and 1 is 2."
        started = time.monotonic()
        with pytest.raises(McpServerError, match="connection was lost"):
            own.call_tool("legacy", "echo", {"message": "x" * (5 << 20)})
        assert time.monotonic() - started < 10
        assert text_of(own.call_tool("legacy", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_configured_headers_reach_the_server_on_both_http_transports(transport: str) -> None:
    seen: list[str | None] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        """Not an MCP server: it records the header and answers 404."""

        def do_GET(self) -> None:
            seen.append(self.headers.get("X-Codemode-Test"))
            self.send_error(404)

        do_POST = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder) as recorder:
        threading.Thread(target=recorder.serve_forever, daemon=True).start()
        entry = {
            "type": transport,
            "url": f"http://127.0.0.1:{recorder.server_port}/mcp",
            "headers": {"X-Codemode-Test": "yes"},
        }
        with (
            McpServers({"web": entry}) as own,
            pytest.raises(McpServerError, match=r"^MCP server 'web' is unavailable"),
        ):
            own.list_tools("web")
        recorder.shutdown()
    assert seen
    assert set(seen) == {"yes"}


# -- timeouts --------------------------------------------------------------------------------


def test_slow_tool_times_out_and_the_session_stays_usable(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)

    with pytest.raises(McpTimeoutError, match=rf"MCP server 'every' did not answer tools/call '{LONG_TOOL}' within"):
        killable.call_tool("every", LONG_TOOL, {"duration": 30, "steps": 1}, timeout_s=0.5)

    assert text_of(killable.call_tool("every", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
    assert read_pid(pidfile) == pid


def test_server_that_never_answers_the_handshake_times_out() -> None:
    with McpServers({"mute": {"command": "/bin/sh", "args": ["-c", "exec sleep 60"]}}, timeout_s=0.5) as own:
        with pytest.raises(McpTimeoutError, match=r"MCP server 'mute' is unavailable: no MCP handshake within 0.5 s"):
            own.list_tools("mute")


# -- failures and recovery -------------------------------------------------------------------


def test_server_killed_mid_call_fails_that_call_and_the_next_call_reconnects(
    killable: McpServers, pidfile: Path
) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)
    outcome: list[BaseException] = []

    def long_call() -> None:
        try:
            killable.call_tool("every", LONG_TOOL, {"duration": 30, "steps": 1})
        except BaseException as e:
            outcome.append(e)

    caller = threading.Thread(target=long_call)
    caller.start()
    # Generous time for the request to reach the server; if the kill landed first, the call
    # would reconnect and run for 30 s instead of failing, and this test would fail.
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    caller.join()

    (error,) = outcome
    assert isinstance(error, McpServerError)
    assert str(error).startswith(f"{UNAVAILABLE}: the connection was lost during tools/call '{LONG_TOOL}'")
    assert "not retried because it may have run" in str(error)

    assert text_of(killable.call_tool("every", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
    assert read_pid(pidfile) != pid


def test_server_killed_while_idle_is_replaced_before_the_next_call(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    # "Idle" means the end of its stream has been seen: the SDK may reap the process before its
    # reader gets there (under load it does), and a tools/call sent before that point is not
    # retried, by design (it may have run). Wait for the stream end, as an idle host would.
    connection = killable._connections["every"]
    wait_until(connection._stop.is_set, "the stream end of a killed server was never seen")

    assert text_of(killable.call_tool("every", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
    assert read_pid(pidfile) != pid


def test_read_right_after_a_kill_succeeds_on_a_new_server(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)
    os.kill(pid, signal.SIGKILL)
    # No waiting: whether the session notices the death before sending or only after, a read
    # is safe to send again, so it must succeed either way.
    assert len(killable.list_tools("every")) == EVERYTHING_TOOLS
    assert read_pid(pidfile) != pid


def test_missing_command_fails_clearly_and_other_servers_keep_working(servers: McpServers) -> None:
    with McpServers({"ghost": {"command": "no-such-mcp-server-codemode"}, "time": time_server()}) as own:
        with pytest.raises(McpServerError, match=r"^MCP server 'ghost' is unavailable: could not start or reach it"):
            own.connect("ghost")
        with pytest.raises(McpServerError, match=r"No such file or directory: 'no-such-mcp-server-codemode'"):
            own.call_tool("ghost", "anything", {})
        assert own.call_tool("time", "get_current_time", {"timezone": "UTC"})["isError"] is False


def test_server_that_exits_during_the_handshake_is_unavailable() -> None:
    with McpServers({"quits": {"command": "/bin/sh", "args": ["-c", "exit 3"]}}) as own:
        with pytest.raises(McpServerError, match=r"'quits' is unavailable: the connection closed during the MCP hand"):
            own.list_tools("quits")


@pytest.mark.parametrize(("transport", "type_"), [("streamableHttp", "http"), ("sse", "sse")])
def test_unreachable_http_server_is_unavailable(transport: Any, type_: str) -> None:
    with everything_http(transport) as url:
        pass  # the server is stopped again: nothing listens on the port now
    with McpServers({"web": {"url": url, "type": type_}}) as own:
        with pytest.raises(McpServerError, match=r"^MCP server 'web' is unavailable: could not start or reach it"):
            own.list_tools("web")


def test_sse_server_restarted_while_idle_is_reconnected_on_the_next_call() -> None:
    with McpServers() as own:
        with everything_http("sse") as url:
            own.add("legacy", {"type": "sse", "url": url})
            own.connect("legacy")
        # The server is gone; an idle host sees its event stream end, as with the other transports.
        wait_until(own._connections["legacy"]._stop.is_set, "the end of the killed SSE server's stream was never seen")
        with everything_http("sse", port=urlsplit(url).port):
            assert text_of(own.call_tool("legacy", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."


# -- lifecycle -------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_close_with_a_dead_server_does_not_hang(pidfile: Path) -> None:
    own = McpServers({"every": with_pidfile(everything_server(), pidfile)})
    own.connect("every")
    os.kill(read_pid(pidfile), signal.SIGKILL)
    own.close()

    with pytest.raises(ClosedError):
        own.call_tool("every", "get-sum", {"a": 1, "b": 2})


def test_remove_stops_the_server_and_forgets_it(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)

    killable.remove("every")

    wait_gone(pid)
    assert killable.names() == []
    with pytest.raises(ConfigError, match=r"no MCP server named 'every' is configured"):
        killable.list_tools("every")


def test_connect_is_idempotent(killable: McpServers, pidfile: Path) -> None:
    killable.connect("every")
    pid = read_pid(pidfile)
    killable.connect("every")
    assert read_pid(pidfile) == pid


def test_async_lifecycle_from_an_event_loop(pidfile: Path) -> None:
    async def main() -> None:
        async with McpServers({"every": with_pidfile(everything_server(), pidfile)}) as own:
            await own.aconnect("every")
            pid = read_pid(pidfile)
            assert text_of(await own.acall_tool("every", "get-sum", {"a": 2, "b": 3})) == "The sum of 2 and 3 is 5."
            await own.aremove("every")
            await asyncio.to_thread(wait_gone, pid)
            own.add("every", everything_server())
            assert len(await own.alist_tools("every")) == EVERYTHING_TOOLS
        await own.aclose()
        with pytest.raises(ClosedError):
            await own.alist_tools("every")

    asyncio.run(main())


def test_close_is_idempotent_and_needs_no_started_loop() -> None:
    own = McpServers({"time": {"command": "unused"}})
    own.close()
    own.close()
    with pytest.raises(ClosedError):
        own.add("other", {"command": "unused"})


# -- configuration ---------------------------------------------------------------------------


def test_config_chooses_the_transport_from_command_or_url() -> None:
    stdio = parse_server_config("a", {"command": "srv", "args": ["--x"], "env": {"K": "V"}, "cwd": "/tmp"})
    http = parse_server_config("b", {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"}})
    assert msgspec.to_builtins(stdio) == {
        "disabled": False,
        "command": "srv",
        "args": ("--x",),
        "env": {"K": "V"},
        "cwd": "/tmp",
        "type": "stdio",
    }
    assert msgspec.to_builtins(http) == {
        "disabled": False,
        "url": "https://example.com/mcp",
        "headers": {"Authorization": "Bearer t"},
        "type": "auto",  # streamable HTTP, then SSE
    }


@pytest.mark.parametrize(
    ("entry", "transport", "target"),
    [
        # Claude Desktop
        ({"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"K": "V"}}, "stdio", "npx"),
        # Cline: its own approval keys and transportType
        (
            {
                "command": "node",
                "args": ["/srv/index.js"],
                "disabled": False,
                "alwaysAllow": ["x"],
                "autoApprove": [],
                "timeout": 60,
                "transportType": "stdio",
            },
            "stdio",
            "node",
        ),
        ({"url": "https://h.example/mcp", "transportType": "streamableHttp"}, "http", "https://h.example/mcp"),
        # VS Code (servers / .mcp.json) and Claude Code
        ({"type": "stdio", "command": "uvx", "envFile": "${workspaceFolder}/.env"}, "stdio", "uvx"),
        ({"type": "sse", "url": "http://h.example/sse"}, "sse", "http://h.example/sse"),
        ({"type": "http", "url": "https://h.example/mcp", "headers": {"A": "b"}}, "http", "https://h.example/mcp"),
        # Cursor: a bare url: streamable HTTP is tried, then SSE
        ({"url": "http://localhost:8000/sse"}, "auto", "http://localhost:8000/sse"),
        ({"url": "http://localhost:8000/mcp"}, "auto", "http://localhost:8000/mcp"),
        ({"type": "http", "url": "http://localhost:8000/sse"}, "http", "http://localhost:8000/sse"),
        # Windsurf's serverUrl; Kilo Code's streamable-http; a description
        ({"serverUrl": "https://h.example/mcp"}, "auto", "https://h.example/mcp"),
        ({"type": "streamable-http", "url": "https://h.example/mcp"}, "http", "https://h.example/mcp"),
        ({"command": "srv", "description": "my server"}, "stdio", "srv"),
    ],
)
def test_entries_other_clients_write_are_accepted(entry: dict[str, Any], transport: str, target: str) -> None:
    parsed = parse_server_config("x", entry)
    assert parsed.type == transport
    assert (parsed.command if isinstance(parsed, McpStdioServerConfig) else parsed.url) == target


def test_unused_keys_get_one_warning_per_server_and_ui_keys_none(caplog: pytest.LogCaptureFixture) -> None:
    cline = {"command": "node", "alwaysAllow": ["x"], "autoApprove": [], "timeout": 60, "envFile": ".env", "arg": []}
    with caplog.at_level(logging.WARNING, logger="codemode.mcp"):
        parse_server_config("cline", cline)
        parse_server_config("quiet", {"command": "node", "alwaysAllow": [], "trust": True, "description": "d"})

    assert [record.getMessage() for record in caplog.records] == [
        "MCP server 'cline': ignoring keys codemode does not use: 'arg', 'envFile', 'timeout'"
    ]


def test_disabled_server_is_kept_but_never_started_and_calls_say_so(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    entry = {"command": "/bin/sh", "args": ["-c", 'touch "$0"', str(marker)], "disabled": True}
    with McpServers({"off": entry, "on": {"command": "unused"}}) as own:
        assert own.names() == ["on"]
        assert own.disabled_names() == ["off"]
        with pytest.raises(ConfigError, match=r'^MCP server \'off\' is disabled in its config \("disabled": true\)$'):
            own.connect("off")
        with pytest.raises(ConfigError, match=r"^MCP server 'off' is disabled"):
            own.call_tool("off", "anything", {})
        own.remove("off")
        assert own.disabled_names() == []
    assert not marker.exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r"MCP server 'x': the config needs 'command' \(stdio\) or 'url'"),
        ({"comand": "a", "args": []}, r"MCP server 'x': the config needs 'command' \(stdio\) or 'url'"),
        ({"command": "a", "url": "http://b"}, r"MCP server 'x': set either 'command' \(stdio\) or 'url'"),
        ({"url": "http://b", "serverUrl": "http://b"}, r"MCP server 'x': set 'url' or 'serverUrl', not both"),
        ({"serverUrl": 5}, r"MCP server 'x': Expected `str`, got `int` - at `\$.serverUrl`"),
        ({"command": "a", "disabled": "yes"}, r"MCP server 'x': Expected `bool`, got `str` - at `\$.disabled`"),
        ({"command": "a", "args": "--flag"}, r"MCP server 'x': Expected `array`, got `str` - at `\$.args`"),
        ({"command": "a", "env": {"K": 1}}, r"MCP server 'x': Expected `str`, got `int` - at `\$.env\[\.\.\.\]`"),
        ({"command": ""}, r"MCP server 'x': 'command' must not be empty"),
        ({"url": "ftp://host/mcp"}, r"MCP server 'x': 'url' must start with http:// or https://"),
        (
            {"url": "http://host/mcp", "type": "websocket"},
            r"MCP server 'x': 'type' must be one of 'stdio', 'http', 'streamable-http', 'streamableHttp', 'sse', "
            r"not 'websocket'",
        ),
        ({"command": "a", "transportType": "sse"}, r"'x': 'transportType' is 'sse', which does not go with 'command'"),
        (
            {"url": "http://host/mcp", "type": "stdio"},
            r"MCP server 'x': 'type' is 'stdio', which does not go with 'url'",
        ),
        ("node server.js", r"MCP server 'x': the config must be a dict, not str"),
    ],
)
def test_bad_server_config_is_a_config_error_naming_the_server(config: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        McpServers({"x": config})


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"timeout_s must be > 0, not 0"):
        McpServers(timeout_s=0)


def test_duplicate_and_unknown_server_names_are_config_errors() -> None:
    with McpServers({"time": {"command": "unused"}}) as own:
        with pytest.raises(ConfigError, match=r"MCP server 'time' is already configured"):
            own.add("time", {"command": "unused"})
        with pytest.raises(ConfigError, match=r"no MCP server named 'nope' is configured"):
            own.remove("nope")
        with pytest.raises(ConfigError, match=r"no MCP server named 'nope' is configured"):
            own.call_tool("nope", "tool")
        assert own.names() == ["time"]


def test_environment_references_are_expanded_where_other_clients_expand_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CM_TOKEN", "s3cret")
    monkeypatch.setenv("CM_EMPTY", "")
    monkeypatch.delenv("CM_UNSET", raising=False)
    stdio = parse_server_config(
        "claude-code",
        {
            "command": "${CM_UNSET:-npx}",
            "args": [
                "--token=${CM_TOKEN}",
                "${CM_EMPTY:-fallback}",
                "$CM_TOKEN",
                "${input:key}",
                "${userHome}/x",
                "${workspaceFolderBasename}${pathSeparator}${cwd}",
            ],
            "env": {"TOKEN": "${env:CM_TOKEN}", "EMPTY": "${CM_EMPTY}", "PLAIN": "no refs"},
            "cwd": "${workspaceFolder}",
        },
    )
    assert isinstance(stdio, McpStdioServerConfig)
    assert stdio.command == "npx"
    # ':-' applies to unset and empty; a bare $VAR and VS Code's ${input:...} are not references.
    home = os.path.expanduser("~")
    here = os.getcwd()
    assert stdio.args == (
        "--token=s3cret",
        "fallback",
        "$CM_TOKEN",
        "${input:key}",
        f"{home}/x",
        f"{os.path.basename(here)}{os.sep}{here}",
    )
    assert stdio.env == {"TOKEN": "s3cret", "EMPTY": "", "PLAIN": "no refs"}
    assert stdio.cwd == os.getcwd()
    http = parse_server_config(
        "cursor",
        {"serverUrl": "https://${CM_UNSET:-h.example}/mcp", "headers": {"Authorization": "Bearer ${CM_TOKEN}"}},
    )
    assert msgspec.to_builtins(http)["url"] == "https://h.example/mcp"
    assert msgspec.to_builtins(http)["headers"] == {"Authorization": "Bearer s3cret"}
    # Keys codemode ignores are not read at all, references and all; nor are disabled entries
    # (often the ones whose secret is not set).
    parse_server_config("vscode", {"command": "uvx", "envFile": "${CM_UNSET}/.env"})
    off = parse_server_config("off", {"command": "srv", "env": {"T": "${CM_UNSET}"}, "disabled": True})
    assert isinstance(off, McpStdioServerConfig) and off.env == {"T": "${CM_UNSET}"}


def test_an_unset_environment_reference_names_the_server_the_key_and_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CM_UNSET", raising=False)
    unset = r"but CM_UNSET is not set in the environment \(write \$\{CM_UNSET:-default\} to give a default\)$"
    with pytest.raises(ConfigError, match=r"^MCP server 'gh': 'env' refers to \$\{CM_UNSET\}, " + unset):
        parse_server_config("gh", {"command": "srv", "env": {"GITHUB_TOKEN": "${CM_UNSET}"}})
    with pytest.raises(ConfigError, match=r"^MCP server 'w': 'serverUrl' refers to \$\{env:CM_UNSET\}, " + unset):
        parse_server_config("w", {"serverUrl": "https://${env:CM_UNSET}/mcp"})


def test_an_expanded_secret_reaches_the_stdio_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CM_SECRET_FOR_SERVER", "from-the-host")
    config = {**everything_server(), "env": {"CODEMODE_MCP_TEST": "${CM_SECRET_FOR_SERVER}"}}
    with McpServers({"every": config}) as own:
        env = json.loads(text_of(own.call_tool("every", "get-env")))
    assert env["CODEMODE_MCP_TEST"] == "from-the-host"
    assert "CM_SECRET_FOR_SERVER" not in env  # only what the entry passes on
