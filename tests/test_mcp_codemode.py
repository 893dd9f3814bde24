"""MCP servers nobody here wrote, seen from a cell: `MCP.*`, `API`, `$api`, resources, prompts;
identifiers and their collisions, the policy path of `MCP.*` calls, a server killed mid-call;
and `codemode serve` driven by the `mcp` SDK's own client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import codemode
import codemode.session
import pytest
from codemode import CodeMode
from codemode.errors import ConfigError
from codemode.mcp import McpServers
from codemode.policy import Block, Rewrite, ToolCallEvent
from codemode.serve import load_servers_config
from mcp import Client, StdioServerParameters
from mcp_servers import everything_server, read_pid, time_server, wait_gone, with_pidfile

TESTS = Path(__file__).resolve().parent


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


def guest_error(session, call: str) -> str:
    """The message of the error ``await <call>`` throws in the cell (fails if it does not throw)."""
    out = value(session, f"try {{ await {call}; return null }} catch (e) {{ return String(e.message) }}")
    assert out is not None, f"{call} did not throw"
    return out


def sum_text(session, a: int, b: int) -> str:
    """What server-everything's ``get-sum`` answers through ``MCP.everything.getSum``."""
    return value(session, f"return (await MCP.everything.getSum({{a: {a}, b: {b}}})).content[0].text")


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
    assert value(ms, code).startswith("unknown tool: mcp:everything:get-sum")


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
    uri = listed["resources"][0]["uri"]
    read = value(ms, f"return await MCP.everything.resources.read({{uri: {json.dumps(uri)}}})")
    assert read["contents"][0]["uri"] == uri
    prompts = value(ms, "return await MCP.everything.prompts.list()")
    simple = next(p for p in prompts["prompts"] if not p.get("arguments"))
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


# ---- identifiers: camelCase and visible collision suffixes (MCP tools registered directly) -------

#: (server, tool) pairs whose names are the point; no server runs behind them.
NAMED_MCP_TOOLS = [
    ("github", "create_issue"),
    ("chrome-devtools", "take_screenshot"),
    ("chrome_devtools", "take_screenshot"),  # the same server identifier as chrome-devtools
    ("demo", "get-sum"),
    ("demo", "get_sum"),  # the same tool identifier as get-sum
    ("demo", "resources"),  # named like members every server object has
    ("demo", "prompts"),
]
SERVER_MEMBERS = ["$api", "prompts", "resources"]


def answers(server: str, name: str):
    """A tool that says which (server, tool) it is, to show which one an identifier reached."""

    def tool(**_: Any) -> str:
        return f"{server}/{name}"

    return tool


@pytest.fixture(scope="module")
def named():
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        for server, name in NAMED_MCP_TOOLS:
            cm.add_tool(
                answers(server, name),
                name=name,
                owner=server,
                source="mcp",
                description=f"{name} of {server}.",
                input_schema={"type": "object", "properties": {"n": {"type": "number"}}},
            )
        yield cm.session("named")


def test_server_and_tool_names_become_camel_case_identifiers(named):
    assert sorted(value(named, "return Object.keys(MCP)")) == ["chromeDevtools", "chromeDevtools2", "demo", "github"]
    assert sorted(value(named, "return Object.keys(MCP.github)")) == sorted(["createIssue", *SERVER_MEMBERS])
    assert sorted(value(named, "return Object.keys(MCP.chromeDevtools)")) == sorted(["takeScreenshot", *SERVER_MEMBERS])


def test_colliding_identifiers_get_visible_numeric_suffixes_and_members_keep_their_meaning(named):
    keys = sorted(value(named, "return Object.keys(MCP.demo)"))
    assert keys == ["$api", "getSum", "getSum2", "prompts", "prompts2", "resources", "resources2"]
    members = "return [typeof MCP.demo.$api, typeof MCP.demo.resources.read, typeof MCP.demo.prompts.get]"
    assert value(named, members) == ["function", "function", "function"]


@pytest.mark.parametrize(
    ("call", "reached"),
    [
        ("MCP.github.createIssue", "github/create_issue"),
        ("MCP.chromeDevtools.takeScreenshot", "chrome-devtools/take_screenshot"),
        ("MCP.chromeDevtools2.takeScreenshot", "chrome_devtools/take_screenshot"),
        ("MCP.demo.getSum", "demo/get-sum"),
        ("MCP.demo.getSum2", "demo/get_sum"),
        ("MCP.demo.resources2", "demo/resources"),
        ("MCP.demo.prompts2", "demo/prompts"),
    ],
)
def test_each_identifier_calls_the_tool_it_was_given_to(named, call, reached):
    assert value(named, f"return await {call}({{n: 1}})") == reached


def test_declarations_name_both_the_identifier_and_the_original_name(named):
    index = value(named, "return await API.read('mcp/index.d.ts')")
    for server, ident in [("chrome-devtools", "chromeDevtools"), ("chrome_devtools", "chromeDevtools2")]:
        assert f'  /** server "{server}" (`MCP.{ident}`): 1 tool(s); see mcp/{server}.d.ts */\n' in index
        assert f'/// <reference path="./{server}.d.ts" />\n' in index
    second = value(named, "return await API.read('mcp/chrome_devtools.d.ts')")
    assert (
        '/** MCP server "chrome_devtools" (`MCP.chromeDevtools2`). */\ndeclare namespace MCP.chromeDevtools2 {\n'
        in second
    )
    demo = value(named, "return await API.read('mcp/demo.d.ts')")
    for name, ident in [("get-sum", "getSum"), ("get_sum", "getSum2"), ("resources", "resources2")]:
        declared = (
            f'  // MCP tool name: "{name}"\n'
            f"  function {ident}(input?: {{ n?: number; [key: string]: unknown }}): Promise<McpToolResult>;\n"
        )
        assert declared in demo
    github = value(named, "return await API.read('mcp/github.d.ts')")
    assert '  // MCP tool name: "create_issue"\n  function createIssue(input?: { n?: number;' in github


def test_dollar_api_finds_a_suffixed_tool_by_identifier_or_by_original_name(named):
    by_ident = value(named, "return await MCP.demo.$api('getSum2')")
    assert by_ident == value(named, "return await MCP.demo.$api('get_sum')")
    assert by_ident["server"] == "demo"
    assert by_ident["tool"] == "get_sum"
    assert by_ident["declaration"].endswith(
        '// MCP tool name: "get_sum"\n'
        "function getSum2(input?: { n?: number; [key: string]: unknown }): Promise<McpToolResult>;"
    )
    assert value(named, "return (await MCP.demo.$api('getSum')).tool") == "get-sum"
    whole = value(named, "return await MCP.chromeDevtools2.$api()")
    assert whole == {
        "server": "chrome_devtools",
        "declaration": value(named, "return API.read('mcp/chrome_devtools.d.ts')"),
    }


def test_exec_description_names_mcp_servers_by_their_identifiers(named):
    servers = "MCP servers (tools): MCP.chromeDevtools (1), MCP.chromeDevtools2 (1), MCP.demo (4), MCP.github (1)."
    assert servers in named.codemode.exec_description()


def test_a_real_tool_name_with_a_leading_digit_gets_an_identifier_and_the_host_keeps_working(make_codemode):
    server = {"command": sys.executable, "args": [str(TESTS / "mcp_named_server.py"), "get-sum", "2fa-code"]}
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"named": server}}).session()
    assert sorted(value(s, "return Object.keys(MCP.named)")) == ["$api", "_2faCode", "getSum", "prompts", "resources"]
    assert value(s, "return (await MCP.named._2faCode()).content[0].text") == "2fa-code"


# ---- the policy path of MCP.* calls ---------------------------------------------------------------

MCP_EVENTS: list[ToolCallEvent] = []


def mcp_hook(event: ToolCallEvent) -> Block | Rewrite | None:
    MCP_EVENTS.append(event)
    if event.input == {"a": 13, "b": 1}:
        return Block("13 is unlucky")
    if event.input == {"a": 1, "b": 1}:
        return Rewrite({"a": 100, "b": 200})
    return None


def mcp_approve(event: ToolCallEvent) -> bool:
    return event.input != {"a": 7, "b": 1}


@pytest.fixture(scope="module")
def policed():
    config = {"workers": 1, "timeoutMs": 20_000, "mcpServers": {"everything": everything_server()}}
    with CodeMode(config, before_tool_call=mcp_hook, approve=mcp_approve) as cm:
        yield cm.session("policed")


def test_hook_sees_an_mcp_call_under_its_exact_catalog_id(policed):
    MCP_EVENTS.clear()
    assert sum_text(policed, 2, 3) == "The sum of 2 and 3 is 5."
    (event,) = MCP_EVENTS
    assert (event.tool_id, event.name, event.source, event.owner) == (
        "mcp:everything:get-sum",
        "get-sum",
        "mcp",
        "everything",
    )
    assert event.input == {"a": 2, "b": 3}


def test_hook_block_answers_an_mcp_call_with_an_is_error_result(policed):
    blocked = value(policed, "return await MCP.everything.getSum({a: 13, b: 1})")
    assert blocked == {"content": [{"type": "text", "text": "13 is unlucky"}], "isError": True}


def test_hook_rewrite_replaces_the_input_the_mcp_server_gets(policed):
    assert sum_text(policed, 1, 1) == "The sum of 100 and 200 is 300."


def test_approval_refusal_stops_an_mcp_call(policed):
    refused = value(policed, "return await MCP.everything.getSum({a: 7, b: 1})")
    assert refused == {"content": [{"type": "text", "text": "not approved"}], "isError": True}


def test_denied_mcp_tool_and_server_are_gone_like_ones_that_never_existed(make_codemode):
    events: list[ToolCallEvent] = []
    config = {
        "workers": 1,
        "timeoutMs": 20_000,
        "mcpServers": {"everything": everything_server(), "time": time_server()},
    }
    cm = make_codemode(config, deny=["mcp:everything:get-sum"], before_tool_call=events.append)
    s = cm.session("denied")
    keys = value(s, "return Object.keys(MCP.everything)")
    assert "echo" in keys
    assert "getSum" not in keys
    call = "try {{ await MCP.everything.{}({{a: 2, b: 3}}); return 'ran' }} catch (e) {{ return [e.name, e.message] }}"
    denied = value(s, call.format("getSum"))
    assert denied == value(s, call.format("neverExisted"))
    assert denied[0] == "TypeError"
    assert guest_error(s, "MCP.everything.$api('get-sum')") == 'unknown MCP tool "get-sum" on server "everything"'
    assert "get-sum" not in value(s, "return API.read('mcp/everything.d.ts')")
    unknown = "unknown tool: mcp:everything:get-sum"
    assert s.handle("tool_call", {"id": "mcp:everything:get-sum", "args": {"a": 2, "b": 3}})["error"].startswith(
        unknown
    )
    assert events == []

    cm.set_policy(deny=["mcp:everything:*"])
    assert value(s, "return Object.keys(MCP)") == ["time"]
    assert value(s, "return (await API.list('mcp')).map(f => f.path)") == ["mcp/index.d.ts", "mcp/time.d.ts"]
    assert guest_error(s, "API.read('mcp/everything.d.ts')") == 'unknown API path "mcp/everything.d.ts"'
    assert '"everything"' not in value(s, "return API.read('mcp/index.d.ts')")


# ---- MCP entries carry no trusted hints ------------------------------------------------------------


def test_mcp_entry_has_unknown_input_and_no_output_hint_though_the_server_declares_an_output_schema(mcm, ms):
    with McpServers({"time": time_server()}) as direct:
        (listed,) = [t for t in direct.list_tools("time") if t.name == "get_current_time"]
    assert listed.output_schema is not None
    assert "day_of_week" in listed.output_schema["properties"]

    tool = mcm.catalog().tools["mcp:time:get_current_time"]
    assert (tool.input_hint, tool.output_hint, tool.output_schema, tool.check_output) == ("unknown", None, None, None)
    entry = tool.entry()
    assert entry["input"] == "unknown"
    assert "output" not in entry
    assert "outputSchema" not in entry
    described = ms.handle("tool_describe", {"id": "mcp:time:get_current_time"})
    assert described["input"] == "unknown"
    assert "output" not in described
    assert "outputSchema" not in described
    assert described["parameters"] == listed.input_schema
    (hit,) = [r for r in ms.handle("tool_search", {"query": "current time"})["results"] if r["name"] == tool.name]
    assert hit["input"] == "unknown"
    assert "output" not in hit
    header = value(ms, "return await MCP.time.$api('get_current_time', {schema: true})")
    # The server's outputSchema types structuredContent in the declaration, and only there.
    assert header["declaration"].endswith(
        "function getCurrentTime(input: { timezone: string; [key: string]: unknown }): Promise<McpToolResult & "
        "{ structuredContent?: { timezone: string; datetime: string; day_of_week: string; is_dst: boolean;"
        " [key: string]: unknown } }>;"
    )
    assert header["schema"] == listed.input_schema
    assert "day_of_week" in value(ms, "return API.read('mcp/time.d.ts')")
    assert "day_of_week" not in mcm.exec_description()


# ---- the declaration files of real servers ------------------------------------------------------


def test_server_declaration_has_jsdoc_typed_input_and_the_mcp_tool_result_type(ms):
    declaration = value(ms, "return await API.read('mcp/everything.d.ts')")
    assert declaration.startswith(
        "interface McpToolResult {\n  content?: unknown[];\n  structuredContent?: unknown;\n  isError?: boolean;\n"
    )
    get_sum = (
        "  /**\n"
        "   * Returns the sum of two numbers\n"
        "   * @param a First number\n"
        "   * @param b Second number\n"
        "   */\n"
        '  // MCP tool name: "get-sum"\n'
        "  function getSum(input: { a: number; b: number; [key: string]: unknown }): Promise<McpToolResult>;\n"
    )
    assert get_sum in declaration
    assert (
        "  function echo(input: { message: string; [key: string]: unknown }): Promise<McpToolResult>;\n" in declaration
    )
    long_running = "function triggerLongRunningOperation(input?: { duration?: number; steps?: number;"
    assert long_running in declaration


def test_index_declaration_lists_every_visible_server_with_its_tool_count(mcm, ms):
    index = value(ms, "return await API.read('mcp/index.d.ts')")
    assert "declare namespace MCP {\n" in index
    counts = {"everything": 0, "time": 0}
    for tool in mcm.catalog().tools.values():
        counts[tool.owner] += 1
    assert counts == {"everything": 13, "time": 2}
    for server, n in counts.items():
        assert f'  /** server "{server}" (`MCP.{server}`): {n} tool(s); see mcp/{server}.d.ts */\n' in index


# ---- servers added at runtime, and killed mid-call ---------------------------------------------


def test_mcp_server_added_at_runtime_is_in_the_next_exec(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000})
    s = cm.session()
    assert value(s, "return Object.keys(MCP)") == []
    cm.add_mcp_server("time", time_server())
    assert value(s, "return Object.keys(MCP)") == ["time"]
    cm.add_mcp_server("everything", everything_server())
    assert sorted(value(s, "return Object.keys(MCP)")) == ["everything", "time"]
    assert sum_text(s, 2, 3) == "The sum of 2 and 3 is 5."
    assert "mcp:everything:get-sum" in cm.catalog().tools


def test_server_killed_mid_call_fails_that_call_in_the_cell_and_the_next_cell_reconnects(make_codemode, tmp_path):
    pidfile = tmp_path / "everything.pid"
    servers = {"everything": with_pidfile(everything_server(), pidfile)}
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": servers}).session("killed")
    # The sum is asked after the slow call, on the same connection: once it is answered, the
    # server has the slow call. The cell then hands control back while the slow call runs; if
    # the kill came before the slow call reached the server, the call would reconnect and
    # outlive the run's timeout instead of failing.
    cell = """
        const slow = MCP.everything.triggerLongRunningOperation({duration: 600, steps: 1})
            .then(r => 'completed: ' + JSON.stringify(r), e => e.message);
        const sum = await MCP.everything.getSum({a: 2, b: 3});
        await yield_control('kill the server');
        return [sum.content[0].text, await slow];
    """
    first = s.exec({"code": cell})
    assert first["status"] == "waiting", first
    pid = read_pid(pidfile)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)

    done = s.wait({"runId": first["runId"]})
    assert done["status"] == "completed", done
    summed, slow = done["value"]
    assert summed == "The sum of 2 and 3 is 5."
    assert slow.startswith(
        "tool mcp:everything:trigger-long-running-operation failed: McpServerError: MCP server 'everything' is "
        "unavailable: the connection was lost during tools/call 'trigger-long-running-operation'"
    )
    assert "not retried because it may have run" in slow

    assert sum_text(s, 4, 5) == "The sum of 4 and 5 is 9."
    assert read_pid(pidfile) != pid
    assert value(s, "return 40 + 2") == 42


# ---- codemode serve: --tools and wait ------------------------------------------------------------


def serve_params(*args: str) -> StdioServerParameters:
    """``codemode serve`` over stdio, importing the codemode under test and this directory's modules."""
    path = os.pathsep.join([str(TESTS), str(Path(codemode.__file__).resolve().parents[1])])
    return StdioServerParameters(
        command=sys.executable, args=["-m", "codemode.cli", "serve", *args], env={"PYTHONPATH": path}
    )


def decoded(called: Any) -> dict[str, Any]:
    """The codemode result a ``call_tool`` of ``exec`` or ``wait`` carries as JSON text."""
    result: dict[str, Any] = json.loads("".join(getattr(block, "text", "") for block in called.content))
    return result


def test_codemode_serve_registers_python_tools_given_with_tools_module_attr():
    cell = (
        "return [await tools.shipping_quote({tons: 2}),"
        " await tools.callValue('host:freight:tariff_zone', {port: 'Kiel'})]"
    )

    async def session() -> tuple[str, dict[str, Any]]:
        params = serve_params("--tools", "serve_tools:TOOLS", "--tools", "serve_tools:register")
        async with Client(params) as client:
            listed = await client.list_tools()
            description = next(t.description or "" for t in listed.tools if t.name == "exec")
            return description, decoded(await client.call_tool("exec", {"code": cell}))

    description, result = asyncio.run(session())
    assert result["status"] == "completed", result
    assert result["value"] == [25, "zone of Kiel: B"]
    assert "host:core:shipping_quote" in description
    assert "host:freight:tariff_zone" in description


def test_codemode_serve_wait_resumes_a_run_that_yielded():
    async def session() -> tuple[dict[str, Any], dict[str, Any] | None]:
        async with Client(serve_params()) as client:
            first = decoded(
                await client.call_tool("exec", {"code": "await yield_control('check in'); return 'resumed'"})
            )
            if first.get("status") != "waiting":
                return first, None
            return first, decoded(await client.call_tool("wait", {"runId": first["runId"]}))

    first, done = asyncio.run(session())
    assert first["status"] == "waiting", first
    assert first["reason"] == "yield"
    assert done is not None
    assert done["status"] == "completed", done
    assert done["value"] == "resumed"


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

    assert proc.returncode == 2
    assert proc.stderr == (
        "codemode: error: MCP server 'time': 'transportType' must be one of 'stdio', 'http', 'streamable-http', "
        "'streamableHttp', 'sse', not 'websocket'\n"
    )


def test_serve_reads_a_vs_code_mcp_json_with_servers_instead_of_mcp_servers(tmp_path: Path):
    config = tmp_path / "mcp.json"
    vscode = {"inputs": [], "servers": {"memory": {"type": "stdio", "command": "npx", "args": ["-y", "srv"]}}}
    config.write_text(json.dumps(vscode))

    assert load_servers_config(config) == vscode["servers"]
