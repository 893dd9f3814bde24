"""MCP servers with what real servers and configs do that the common ones do not: names that
are not identifiers, no tools at all, a server that never answers, servers that fail alike.
The servers are real (the official SDK's ``MCPServer`` in tests/fixtures, or processes that
never speak MCP)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import codemode.mcp_listing
import pytest
from codemode import CodeMode
from codemode.dispatch import Dispatcher
from codemode.errors import ClosedError, ConfigError, ToolDefinitionError
from codemode.mcp_listing import MCP_START_WAIT_S
from codemode.tools import MCP_TOOL

ODD = str(Path(__file__).resolve().parent / "fixtures" / "odd_mcp_server.py")
NEVER_ANSWERS = {"command": sys.executable, "args": ["-c", "import time; time.sleep(600)"]}


def odd_server(*flags: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [ODD, *flags]}


def value(session: Any, code: str, **extra: Any) -> Any:
    result = session.exec({"code": code, **extra})
    assert result["status"] == "completed", result
    return result["value"]


def failure(session: Any, code: str) -> str:
    result = session.exec({"code": code})
    assert result["status"] == "failed", result
    return str(result["error"])


@pytest.fixture(scope="module")
def ecm():
    servers = {"My Server": odd_server(), "docs": odd_server("--docs-only")}
    with CodeMode({"workers": 1, "timeoutMs": 20_000, "mcpServers": servers}) as cm:
        assert cm.load_mcp_tools() == {"My Server": None, "docs": None}
        yield cm


def test_names_that_are_not_identifiers_reach_guest_code(ecm):
    s = ecm.session()
    assert value(s, "return Object.keys(MCP)") == ["docs", "myServer"]
    # "2fa-check" gets a leading underscore; "get.sum" and "get_sum" both camelCase to getSum,
    # the second in catalog order gets the visible suffix; the 200-character name is left out.
    assert value(s, "return Object.keys(MCP.myServer)") == [
        "_2faCheck",
        "getSum",
        "getSum2",
        "$api",
        "resources",
        "prompts",
    ]
    got = value(
        s,
        "const t = (r) => r.content[0].text;"
        "return [t(await MCP.myServer._2faCheck({code: '42'})), t(await MCP.myServer.getSum({a: 1, b: 2})),"
        " t(await MCP.myServer.getSum2({a: 1, b: 2}))]",
    )
    assert got == ["checked 42", "3", "1003"]
    ids = {t for t in ecm.catalog().tools if t.startswith("mcp:My Server:")}
    assert ids == {"mcp:My Server:2fa-check", "mcp:My Server:get.sum", "mcp:My Server:get_sum"}


def test_declaration_files_of_a_server_whose_name_is_not_a_path_segment(ecm):
    s = ecm.session()
    assert [f["path"] for f in value(s, "return await API.list()")] == [
        "mcp/docs.d.ts",
        "mcp/index.d.ts",
        "mcp/myServer.d.ts",
    ]
    index = value(s, "return await API.read('mcp/index.d.ts')")
    assert '/** server "My Server" (`MCP.myServer`): 3 tool(s); see mcp/myServer.d.ts */' in index
    declared = value(s, "return await API.read('mcp/myServer.d.ts')")
    assert (
        "function getSum2(input: { a: number; b: number; [key: string]: unknown }): "
        "Promise<McpToolResult & { structuredContent?: { result: number; [key: string]: unknown } }>;"
    ) in declared
    assert '// MCP tool name: "get_sum"' in declared
    assert '// MCP tool name: "2fa-check"' in declared


def test_api_finds_a_tool_by_its_identifier_or_its_name_never_by_another_description(ecm):
    s = ecm.session()
    # get.sum's description quotes `function getSum2(input`: it must not answer for getSum2.
    got = value(
        s,
        "const t = async (n) => (await MCP.myServer.$api(n)).tool;"
        "return [await t('getSum2'), await t('getSum'), await t('get_sum'), await t('get.sum'), await t('_2faCheck')]",
    )
    assert got == ["get_sum", "get.sum", "get_sum", "get.sum", "2fa-check"]
    assert "unknown MCP tool" in failure(s, "return await MCP.myServer.$api('function getSum2(')")


def test_a_server_with_only_resources_and_prompts_is_reachable(ecm):
    s = ecm.session()
    assert value(s, "return Object.keys(MCP.docs)") == ["$api", "resources", "prompts"]
    memo = value(s, "return await MCP.docs.resources.read({uri: 'memo://one'})")
    assert memo["contents"][0]["text"] == "the first memo"
    prompt = value(s, "return await MCP.docs.prompts.get({name: 'brief', arguments: {topic: 'tea'}})")
    assert prompt["messages"][0]["content"]["text"] == "Be brief about tea."
    declared = value(s, "return (await MCP.docs.$api()).declaration")
    assert "declare namespace MCP.docs {" in declared and "const resources:" in declared
    assert "MCP.docs (0)" in ecm.exec_description()


def test_a_policy_that_denies_a_servers_tools_hides_a_server_without_tools_too(ecm):
    ecm.set_policy(deny=["mcp:docs:*"])
    try:
        s = ecm.session()
        assert value(s, "return Object.keys(MCP)") == ["myServer"]
        assert [f["path"] for f in value(s, "return await API.list()")] == ["mcp/index.d.ts", "mcp/myServer.d.ts"]
    finally:
        ecm.set_policy()


def test_a_server_that_never_answers_holds_up_no_exec(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 1000, "mcpServers": {"silent": NEVER_ANSWERS}})

    @cm.tool
    def add(a: int, b: int) -> int:
        return a + b

    s = cm.session()
    # The MCP client waits up to 30 s for a handshake; an exec waits at most MCP_START_WAIT_S
    # for a server listed the first time, and not at all after that.
    for bound in (MCP_START_WAIT_S + 5, 5):
        started = time.monotonic()
        assert value(s, "return await tools.add({a: 1, b: 2})") == 3
        assert time.monotonic() - started < bound
    assert "is still starting" in failure(s, "return await MCP.silent.anything({})")


def test_servers_that_cannot_start_and_share_an_identifier_are_both_named(make_codemode):
    missing = {"command": "/nonexistent/mcp-server"}
    cm = make_codemode({"workers": 1, "mcpServers": {"chrome-devtools": missing, "chrome_devtools": missing}})
    reasons = cm.load_mcp_tools()
    assert set(reasons) == {"chrome-devtools", "chrome_devtools"} and all(reasons.values())
    s = cm.session()
    assert value(s, "return Object.keys(MCP)") == ["chromeDevtools", "chromeDevtools2"]
    assert "'chrome-devtools'" in failure(s, "return await MCP.chromeDevtools.navigate({})")
    assert "'chrome_devtools'" in failure(s, "return await MCP.chromeDevtools2.prompts.list()")
    index = value(s, "return await API.read('mcp/index.d.ts')")
    assert '/** server "chrome_devtools" is unavailable: ' in index


def test_a_server_named_index_does_not_replace_the_index_file(make_codemode):
    cm = make_codemode({"workers": 1, "mcpServers": {"index": odd_server("--docs-only")}})
    assert cm.load_mcp_tools() == {"index": None}
    s = cm.session()
    assert [f["path"] for f in value(s, "return await API.list()")] == ["mcp/index.d.ts", "mcp/index2.d.ts"]
    assert "declare namespace MCP {" in value(s, "return await API.read('mcp/index.d.ts')")
    own = value(s, "return await API.read('mcp/index2.d.ts')")
    assert "declare namespace MCP.index {" in own
    assert value(s, "return (await MCP.index.$api()).declaration") == own


NAMED = str(Path(__file__).resolve().parent / "mcp_named_server.py")


def named_server(*tools: str, first: str = "") -> dict[str, Any]:
    """``tests/mcp_named_server.py`` with these tools, after ``first`` (a shell command) runs."""
    script = f'{first} exec "$0" "$@"'
    return {"command": "/bin/sh", "args": ["-c", script, sys.executable, NAMED, *tools]}


def test_identifiers_stay_with_their_servers_when_a_slow_ones_tools_arrive(make_codemode, monkeypatch):
    monkeypatch.setattr(codemode.mcp_listing, "MCP_START_WAIT_S", 2.0)
    servers = {
        "chrome-devtools": named_server("from_a", first="sleep 4;"),
        "chrome_devtools": named_server("from_b"),
    }
    cm = make_codemode({"workers": 1, "mcpServers": servers})
    s = cm.session()
    keys = "return [Object.keys(MCP.chromeDevtools), Object.keys(MCP.chromeDevtools2)]"
    # The first exec goes on without the slow server (still starting), which keeps its place.
    assert value(s, keys)[1] == ["fromB", "$api", "resources", "prompts"]
    assert "is still starting" in failure(s, "return await MCP.chromeDevtools.fromA()")
    assert cm.load_mcp_tools() == {"chrome-devtools": None, "chrome_devtools": None}
    assert value(s, keys) == [["fromA", "$api", "resources", "prompts"], ["fromB", "$api", "resources", "prompts"]]


def test_a_retry_runs_in_the_background_and_its_tools_join_when_it_lands(make_codemode, monkeypatch, tmp_path):
    monkeypatch.setattr(codemode.mcp_listing, "MCP_RETRY_S", 0.0)
    marker = tmp_path / "tried"
    # Fails at once the first time; the retry takes 3 s to start, then works.
    first = f'if [ -e "{marker}" ]; then sleep 3; else touch "{marker}"; exit 1; fi;'
    cm = make_codemode({"workers": 1, "mcpServers": {"flaky": named_server("late", first=first)}})
    s = cm.session()
    assert "flaky" in failure(s, "return await MCP.flaky.late()")
    started = time.monotonic()
    assert value(s, "return Object.keys(MCP)") == ["flaky"]  # starts the retry, does not wait for it
    assert time.monotonic() - started < 2.5
    assert cm.load_mcp_tools() == {"flaky": None}
    assert value(s, "return (await MCP.flaky.late()).content[0].text") == "late"


def test_resources_of_a_denied_or_unavailable_server_are_refused_on_the_host(make_codemode):
    # A worker that forges an MCP resource request (the guest cannot: prelude.js keeps the
    # bridge's ids to itself) is refused by the dispatcher, as for a server that is not there.
    cm = make_codemode({"workers": 1})
    cm._registry.set_mcp_server("secret", [])
    cm._registry.set_mcp_server("down", None, "no handshake")
    cm._registry.set_mcp_server("open", [])
    cm.set_policy(deny=["mcp:secret:*"])
    view = cm.catalog()
    assert view.mcp_servers == {"open": "open"}
    dispatcher = Dispatcher(view, cm._loop.get, mcp_ops=cm._mcp.op)
    for server in ("secret", "down", "nowhere"):
        request = f'{{"server": "{server}", "op": "resources.read", "input": {{"uri": "memo://one"}}}}'
        assert dispatcher.submit([(1, MCP_TOOL, request)]) is None  # answered at once, nothing started
        assert dispatcher.pending() == 0
        assert dispatcher.take_ready() == [(1, False, f"unknown MCP request {server}.resources.read")]


def test_declaration_comments_cannot_be_closed_by_a_schema_key(make_codemode):
    cm = make_codemode({"workers": 1})
    cm.add_tool(
        lambda **_: "x",
        name="tricky",
        owner="srv",
        source="mcp",
        description="Fine.",
        input_schema={"type": "object", "properties": {"a*/b": {"type": "string", "description": "closes */ it"}}},
    )
    declared = value(cm.session(), "return await API.read('mcp/srv.d.ts')")
    assert " * @param a*\\/b closes *\\/ it" in declared
    comments = declared.split("function tricky")[0]  # (the signature quotes the key as a string)
    assert comments.count("*/") == comments.count("/**")


def test_server_names_with_a_colon_are_refused_and_lists_wait_never_on_the_mcp_loop(make_codemode):
    for name in ("a:b", "time\n", ""):  # (a trailing newline got past a `$` once)
        with pytest.raises(ConfigError, match="no ':'"):
            make_codemode({"mcpServers": {name: odd_server()}})
    for name, owner in (("read\n", "core"), ("read", "core\n")):
        with pytest.raises(ToolDefinitionError):
            make_codemode().add_tool(lambda: 1, name=name, owner=owner)
    seen: list[BaseException] = []

    def approve(event: Any) -> bool:
        # Hooks of MCP calls run on the MCP loop's thread: waiting there for listings queued
        # behind it would hang the loop.
        try:
            cm.load_mcp_tools()
        except RuntimeError as e:
            seen.append(e)
        return True

    cm = make_codemode({"workers": 1, "mcpServers": {"odd": odd_server()}}, approve=approve)
    assert cm.load_mcp_tools() == {"odd": None}
    assert value(cm.session(), "return (await MCP.odd.getSum({a: 1, b: 2})).content[0].text") == "3"
    assert len(seen) == 1 and "MCP loop" in str(seen[0])
    cm.close()
    with pytest.raises(ClosedError):
        cm.load_mcp_tools()


def test_a_server_that_says_its_tools_changed_is_listed_again(make_codemode):
    # The fixture speaks the 2026-07-28 protocol: the change comes on a subscriptions/listen
    # stream (older servers send notifications/tools/list_changed; both end up in one place).
    cm = make_codemode({"workers": 1, "mcpServers": {"odd": odd_server("--grows")}})
    assert cm.load_mcp_tools() == {"odd": None}
    session = cm.session("grows")
    assert value(session, "return typeof MCP.odd.grown") == "undefined"
    assert value(session, "return await MCP.odd.grow({})")["content"][0]["text"] == "grew"
    # The next exec lists the server again in the background; one after it sees the new tool.
    deadline = time.monotonic() + 10
    while value(session, "return typeof MCP.odd.grown") == "undefined":
        assert time.monotonic() < deadline, "the new tool never reached the catalog"
        time.sleep(0.05)
    assert value(session, "return (await MCP.odd.grown({})).content[0].text") == "I was not there at first"


def test_list_changed_notifications_of_older_sessions_say_a_listing_changed():
    # Sessions before 2026-07-28 get notifications instead of a listen stream; none of the
    # servers here sends one unasked, so the handler the session is given is checked directly.
    from codemode.mcp import McpStdioServerConfig, _Connection
    from mcp_types import (
        Implementation,
        LoggingMessageNotification,
        PromptListChangedNotification,
        ResourceListChangedNotification,
        ToolListChangedNotification,
    )

    changed: list[int] = []
    connection = _Connection(
        "old", McpStdioServerConfig(command="srv"), Implementation(name="t", version="0"), lambda: changed.append(1)
    )
    for message in (
        ToolListChangedNotification(),
        ResourceListChangedNotification(),
        PromptListChangedNotification(),
        LoggingMessageNotification(params={"level": "info", "data": "not a change"}),
        RuntimeError("a transport error"),
    ):
        asyncio.run(connection._on_message(message))
    assert changed == [1, 1, 1]
