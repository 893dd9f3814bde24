"""MCP as a careful client and the reference treat it, seen from a cell: policy on every MCP path
(tools, resources, prompts), declarations that are valid TypeScript with every tool reachable
whatever its name, inputs completed from schema defaults and checked for required arguments,
servers without tools, and listings that follow cursors within bounds.

The servers are real (the official SDK's servers in tests/fixtures and tests/mcp_named_server.py);
a few tools are registered directly as MCP-source tools where the point is what reaches them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode
from codemode.mcp import McpServers
from codemode.policy import Block, Rewrite, ToolCallEvent

TESTS = Path(__file__).resolve().parent
PAGED = str(TESTS / "fixtures" / "paged_mcp_server.py")
NAMED = str(TESTS / "mcp_named_server.py")
ODD = str(TESTS / "fixtures" / "odd_mcp_server.py")
ECHO = {"command": sys.executable, "args": [str(TESTS / "fixtures" / "echo_args_mcp_server.py")]}
#: Tool names that are reserved words or names every object inherits.
ODD_NAMES = ["delete", "enum", "constructor", "prototype", "toString", "hasOwnProperty", "valueOf", "__proto__", "let"]


def paged(*flags: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [PAGED, *flags]}


def named(*names: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [NAMED, *names]}


def value(session: Any, code: str, **extra: Any) -> Any:
    result = session.exec({"code": code, **extra})
    assert result["status"] == "completed", result
    return result["value"]


def guest_error(session: Any, call: str) -> str:
    """The message of the error ``await <call>`` throws in the cell (fails if it does not throw)."""
    out = value(session, f"try {{ await {call}; return null }} catch (e) {{ return [e.name, String(e.message)] }}")
    assert out is not None, f"{call} did not throw"
    assert out[0] == "Error", out
    return str(out[1])


# ---- policy on every MCP path -------------------------------------------------------------------

EVENTS: list[ToolCallEvent] = []


def hook(event: ToolCallEvent) -> Block | Rewrite | None:
    EVENTS.append(event)
    if event.tool_id == "mcp:paged:resources/list":
        return Block("no listing today")
    if event.tool_id == "mcp:paged:resources/read" and event.input == {"uri": "memo://secret"}:
        return Rewrite({"uri": "memo://public"})
    if event.tool_id == "mcp:gated:answer":
        return Block("answers are rationed")
    return None


def approve(event: ToolCallEvent) -> bool:
    return event.tool_id not in ("mcp:paged:prompts/get", "mcp:gated:refused")


RAN: list[dict[str, Any]] = []


def recorder(**arguments: Any) -> str:
    RAN.append(arguments)
    return "ran"


@pytest.fixture(scope="module")
def policed():
    config = {"workers": 1, "timeoutMs": 20_000, "mcpServers": {"paged": paged()}}
    with CodeMode(config, before_tool_call=hook, approve=approve) as cm:
        for name in ("answer", "refused", "free"):
            cm.add_tool(recorder, name=name, owner="gated", source="mcp", description=f"{name}.")
        assert cm.load_mcp_tools() == {"paged": None}
        yield cm.session("policed")


def test_a_hook_block_on_resources_list_stops_it_with_an_error_the_cell_can_catch(policed):
    EVENTS.clear()
    assert guest_error(policed, "MCP.paged.resources.list()") == (
        "tool mcp:paged:resources/list: tool call blocked: no listing today"
    )
    (event,) = EVENTS
    assert (event.tool_id, event.name, event.source, event.owner, event.input) == (
        "mcp:paged:resources/list",
        "resources/list",
        "mcp",
        "paged",
        {},
    )


def test_a_hook_rewrite_changes_what_a_resource_read_asks_the_server(policed):
    read = value(policed, "return await MCP.paged.resources.read({uri: 'memo://secret'})")
    assert read["contents"][0]["text"] == "text of memo://public"


def test_an_approval_refusal_stops_a_prompt_get(policed):
    message = guest_error(policed, "MCP.paged.prompts.get({name: 'brief', arguments: {topic: 'x'}})")
    assert message == "tool mcp:paged:prompts/get: tool call blocked: not approved"
    assert value(policed, "return (await MCP.paged.prompts.list()).prompts.length") == 3


def test_a_blocked_mcp_tool_call_is_an_mcp_error_result_and_the_tool_never_runs(policed):
    RAN.clear()
    blocked = value(policed, "return await MCP.gated.answer({q: 1})")
    assert blocked == {"content": [{"type": "text", "text": "answers are rationed"}], "isError": True}
    refused = value(policed, "return await MCP.gated.refused({})")
    assert refused == {"content": [{"type": "text", "text": "not approved"}], "isError": True}
    assert RAN == []
    assert value(policed, "return await MCP.gated.free({q: 2})") == "ran"
    assert RAN == [{"q": 2}]


def test_a_denied_request_answers_as_one_that_does_not_exist_and_leaves_the_declarations(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"paged": paged()}})
    cm.set_policy(deny=["mcp:paged:resources/read", "prompts/*"])
    s = cm.session()
    assert guest_error(s, "MCP.paged.resources.read({uri: 'memo://1'})") == "unknown MCP request paged.resources.read"
    assert guest_error(s, "MCP.paged.prompts.list()") == "unknown MCP request paged.prompts.list"
    assert value(s, "return (await MCP.paged.resources.list()).resources.length") == 5
    declared = value(s, "return await API.read('mcp/paged.d.ts')")
    assert "list(input?: { cursor?: string }): Promise<McpResourcesListResult>;" in declared
    assert "read(" not in declared and "const prompts" not in declared

    cm.set_policy(deny=["mcp:paged:resources/*", "mcp:paged:prompts/*"])
    assert value(cm.session(), "return Object.keys(MCP)") == []


# ---- identifiers: reserved and inherited names ----------------------------------------------------


@pytest.fixture(scope="module")
def oddly_named():
    servers = {"github": named(*ODD_NAMES), "constructor": named("prototype")}
    with CodeMode({"workers": 1, "timeoutMs": 20_000, "mcpServers": servers}) as cm:
        assert cm.load_mcp_tools() == {"github": None, "constructor": None}
        yield cm


def test_reserved_and_inherited_names_get_a_digit_appended_and_every_tool_is_callable(oddly_named):
    s = oddly_named.session()
    assert sorted(value(s, "return Object.keys(MCP)")) == ["constructor2", "github"]
    keys = value(s, "return Object.keys(MCP.github).filter(k => !['$api', 'resources', 'prompts'].includes(k))")
    expected = ["delete2", "enum2", "constructor2", "prototype2", "toString2", "hasOwnProperty2", "valueOf2", "proto"]
    assert sorted(keys) == sorted([*expected, "let2"])
    calls = ", ".join(f"(await MCP.github.{ident}()).content[0].text" for ident in [*expected, "let2"])
    assert value(s, f"return [{calls}]") == ODD_NAMES
    assert value(s, "return (await MCP.constructor2.prototype2()).content[0].text") == "prototype"
    declared = value(s, "return API.read('mcp/github.d.ts')")
    assert (
        "function delete2(input?: Record<string, unknown>): "
        "Promise<McpToolResult & { structuredContent?: { result: string; [key: string]: unknown } }>;"
    ) in declared
    assert "function delete(" not in declared
    assert "declare namespace MCP.constructor2 {" in value(s, "return API.read('mcp/constructor.d.ts')")


def test_the_mcp_objects_have_no_prototype_to_confuse_with_a_tool(oddly_named):
    s = oddly_named.session()
    probe = (
        "return [Object.getPrototypeOf(MCP), Object.getPrototypeOf(MCP.github), typeof MCP.toString,"
        " typeof MCP.github.constructor, typeof MCP.github.hasOwnProperty, typeof MCP.github.resources.list]"
    )
    assert value(s, probe) == [None, None, "undefined", "undefined", "undefined", "function"]


def test_every_declaration_file_parses_as_typescript_alone_and_all_together(oddly_named, make_codemode):
    odd = {"command": sys.executable, "args": [ODD]}
    cm = make_codemode(
        {
            "workers": 1,
            "timeoutMs": 20_000,
            "mcpServers": {"odd": odd, "paged": paged(), "down": {"command": "/nonexistent/mcp"}},
        }
    )
    cm.add_tool(
        lambda **_: "x",
        name="deep-schema",
        owner="shapes",
        source="mcp",
        description="Nested beyond what a compact hint shows.\n*/ still a comment",
        input_schema=DEEP_SCHEMA,
    )
    for host in (oddly_named, cm):
        s = host.session()
        files = value(
            s, "const out = {}; for (const f of await API.list()) out[f.path] = await API.read(f.path); return out"
        )
        assert files, "no declaration files"
        for path, text in files.items():
            result = s.exec({"code": text + "\nreturn 1", "language": "typescript"})
            assert result["status"] == "completed", (path, result.get("error"), text)
        together = "\n".join(files.values()) + "\nreturn 1"
        result = s.exec({"code": together, "language": "typescript"})
        assert result["status"] == "completed", result.get("error")


# ---- declarations: parameters, item grouping, open objects, the index ------------------------------

DEEP_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "description": "The rows to write.\nEach row names its id.\r\n\n  And its tags.",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["id"],
                "additionalProperties": False,
            },
        },
        "meta": {
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {}}}}}},
        },
        "mode": {"enum": ["fast", "safe"], "default": "safe", "description": "How."},
        "either": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]},
    },
    "required": ["items", "mode"],
    "additionalProperties": False,
}


def test_declarations_fold_descriptions_keep_item_grouping_and_give_open_objects_an_index(make_codemode):
    cm = make_codemode({"workers": 1})
    cm.add_tool(
        lambda **_: "x", name="write", owner="shapes", source="mcp", description="Writes.", input_schema=DEEP_SCHEMA
    )
    declared = value(cm.session(), "return API.read('mcp/shapes.d.ts')")
    assert "   * @param items The rows to write. Each row names its id. And its tags.\n" in declared
    assert '   * @param mode How. Default: "safe".\n' in declared
    signature = (
        "function write(input: { items: Array<{ id: string; tags?: string[] }>;"
        " meta?: { a?: { b?: { c?: unknown; [key: string]: unknown }; [key: string]: unknown };"
        " [key: string]: unknown };"
        ' mode?: "fast" | "safe"; either?: string | number[] }): Promise<McpToolResult>;'
    )
    assert signature in declared


def test_the_index_references_each_server_file_and_root_api_lists_the_servers(make_codemode):
    servers = {"paged": paged(), "named": named("a", "b"), "down": {"command": "/nonexistent/mcp"}}
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": servers}).session()
    index = value(s, "return API.read('mcp/index.d.ts')")
    assert index.startswith('/// <reference path="./paged.d.ts" />\n/// <reference path="./named.d.ts" />\n')
    assert "  function $api(): Promise<McpRootApiHeader>;\n" in index
    assert "./down.d.ts" not in index and "  const down: unknown;\n" in index
    root = value(s, "return await MCP.$api()")
    assert root["declaration"] == index
    servers_seen = sorted(root["servers"], key=lambda info: info["identifier"])
    assert servers_seen[1:] == [
        {"identifier": "named", "serverName": "named", "toolCount": 2},
        {"identifier": "paged", "serverName": "paged", "toolCount": 0},
    ]
    assert servers_seen[0]["identifier"] == "down" and "/nonexistent/mcp" in servers_seen[0]["unavailable"]
    assert sorted(value(s, "return Object.keys(MCP)")) == ["down", "named", "paged"]


def test_an_unavailable_server_object_is_not_a_thenable(make_codemode):
    s = make_codemode({"workers": 1, "mcpServers": {"down": {"command": "/nonexistent/mcp"}}}).session()
    assert value(s, "const d = await MCP.down; return [typeof d.then, typeof d.anyTool]") == ["undefined", "function"]


# ---- inputs: defaults and required arguments --------------------------------------------------------

DEFAULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "default": 10},
        "__proto__": {"type": "object", "default": {"polluted": True}},
        "filters": {"type": "object", "default": {"open": True}},
    },
    "required": ["query", "limit"],
}


def test_defaults_fill_omitted_properties_as_own_keys_before_the_hook_and_the_tool(make_codemode):
    seen: list[Any] = []
    cm = make_codemode({"workers": 1}, before_tool_call=lambda event: seen.append(event.input))
    got: list[dict[str, Any]] = []
    cm.add_tool(
        lambda **kw: got.append(kw) or "ok", name="find", owner="srv", source="mcp", input_schema=DEFAULTS_SCHEMA
    )
    s = cm.session()
    assert value(s, "return await MCP.srv.find({query: 'x', filters: {open: false}})") == "ok"
    assert value(s, "return await MCP.srv.find({query: 'y', limit: 3})") == "ok"
    expected = [
        {"query": "x", "filters": {"open": False}, "limit": 10, "__proto__": {"polluted": True}},
        {"query": "y", "limit": 3, "__proto__": {"polluted": True}, "filters": {"open": True}},
    ]
    assert got == expected and seen == expected
    got[0]["__proto__"]["polluted"] = "changed by a tool"
    assert value(s, "return await MCP.srv.find({query: 'z'})") == "ok"
    assert got[2]["__proto__"] == {"polluted": True}  # each call gets its own copy of a default
    assert value(s, "return ({}).polluted === undefined && Object.getPrototypeOf(MCP.srv) === null") is True
    declared = value(s, "return API.read('mcp/srv.d.ts')")
    signature = "function find(input: { query: string; limit?: number; __proto__?: Record<string, unknown>;"
    assert signature in declared


def test_missing_required_arguments_are_refused_by_name_before_the_tool_runs(make_codemode):
    cm = make_codemode({"workers": 1})
    got: list[Any] = []
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {"default": 1}}, "required": ["a", "b", "c"]}
    cm.add_tool(lambda **kw: got.append(kw), name="needs", owner="srv", source="mcp", input_schema=schema)
    s = cm.session()
    assert (
        guest_error(s, "MCP.srv.needs()")
        == 'invalid input for tool mcp:srv:needs: missing required arguments: "a", "b"'
    )
    assert (
        guest_error(s, "MCP.srv.needs({a: 1})")
        == 'invalid input for tool mcp:srv:needs: missing required argument: "b"'
    )
    assert (
        guest_error(s, "MCP.srv.needs([1])")
        == "invalid input for tool mcp:srv:needs: an MCP tool takes one object argument"
    )
    assert got == []


def test_a_real_server_gets_the_defaults_its_schema_declares_and_no_call_without_required_ones(make_codemode):
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"echo": ECHO}}).session()
    sent = value(s, "return JSON.parse((await MCP.echo.echo({count: 1})).content[0].text)")
    assert sent == {"__proto__": {"isAdmin": True}, "count": 1, "name": "world"}
    assert (
        guest_error(s, "MCP.echo.echo()") == 'invalid input for tool mcp:echo:echo: missing required argument: "count"'
    )


# ---- servers without tools, and listings ------------------------------------------------------------


def test_a_server_without_the_tools_capability_lists_no_tools_and_serves_resources_and_prompts(make_codemode):
    with McpServers({"paged": paged()}) as direct:
        assert direct.list_tools("paged") == []
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"paged": paged()}})
    assert cm.load_mcp_tools() == {"paged": None}
    s = cm.session()
    assert value(s, "return (await MCP.paged.resources.read({uri: 'memo://3'})).contents[0].text") == "text of memo://3"
    prompt = value(s, "return await MCP.paged.prompts.get({name: 'outline', arguments: {topic: 'tea'}})")
    assert prompt["messages"][0]["content"]["text"] == "outline about tea"


def test_requests_a_server_does_not_offer_are_not_sent_to_it(make_codemode):
    # The echo server announces tools only: it would answer resources/list with "Method not found".
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"echo": ECHO}}).session()
    assert value(s, "return [await MCP.echo.resources.list(), await MCP.echo.prompts.list()]") == [
        {"resources": []},
        {"prompts": []},
    ]
    message = guest_error(s, "MCP.echo.resources.read({uri: 'memo://1'})")
    assert "MCP server 'echo' does not offer resources" in message


def test_listings_follow_next_cursor_and_keep_annotations_and_meta(make_codemode):
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"paged": paged()}}).session()
    listed = value(s, "return await MCP.paged.resources.list()")
    assert [r["uri"] for r in listed["resources"]] == [f"memo://{n}" for n in range(5)]
    assert "nextCursor" not in listed
    assert listed["resources"][3] == {
        "uri": "memo://3",
        "name": "memo 3",
        "mimeType": "text/plain",
        "annotations": {"audience": ["assistant"], "priority": 0.3},
        "_meta": {"example.com/rank": 3},
    }
    prompts = value(s, "return await MCP.paged.prompts.list({cursor: '2'})")
    assert prompts == {
        "prompts": [
            {"name": "outline", "arguments": [{"name": "topic", "required": True}], "_meta": {"example.com/rank": 2}}
        ]
    }
    assert "invalid input for MCP.paged.resources.list" in guest_error(s, "MCP.paged.resources.list({cursor: 3})")


def test_an_endless_cursor_stops_at_the_page_cap_and_says_where_to_go_on(make_codemode):
    s = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"endless": paged("--endless")}}).session()
    first = value(s, "return await MCP.endless.resources.list()")
    assert (len(first["resources"]), first["nextCursor"]) == (100, "100")
    more = value(s, f"return await MCP.endless.resources.list({{cursor: {json.dumps(first['nextCursor'])}}})")
    assert (len(more["resources"]), more["nextCursor"]) == (100, "200")
