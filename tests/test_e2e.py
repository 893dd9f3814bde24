"""End to end, as a host runs it: a scripted fake model (the only test double: it stands in for
the provider) sees the model-facing tools and makes tool calls; everything else is real —
workers, QuickJS, the catalog, a real MCP server, hooks, wait, the trace.

Seed 000's end-to-end plan (steps 1-16) and seed 001's six-point tool-search regression.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from codemode import CodeMode
from codemode.surfaces import payload_bytes, to_openai
from mcp_servers import time_server


class FakeModel:
    """Replays a script of tool calls; records the tool payloads it was offered."""

    def __init__(self, script: list[tuple[str, dict[str, Any]]]) -> None:
        self.script = list(script)
        self.offered: list[list[str]] = []
        self.payload_bytes: list[int] = []
        self.results: list[dict[str, Any]] = []

    def turn(self, tools: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        self.offered.append([t["function"]["name"] for t in tools])
        self.payload_bytes.append(len(json.dumps(tools)))
        while self.script:
            yield self.script.pop(0)


def drive(session, model: FakeModel, surface: str) -> list[dict[str, Any]]:
    """One agent turn: offer the surface's tools, run each call the model makes."""
    tools = to_openai(session.model_tools(surface))
    for name, args in model.turn(tools):
        if "$runId" in json.dumps(args):  # the model reads the runId from the previous result
            args = json.loads(json.dumps(args).replace("$runId", model.results[-1]["runId"]))
        model.results.append(session.handle(name, args))
    return model.results


GATE = threading.Event()


def add_test_tools(cm: CodeMode) -> None:
    @cm.tool(owner="core")
    def read(path: str) -> str:
        """Read a local file."""
        return f"contents of {path}"

    @cm.tool(owner="fakeplugin")
    def fake_lookup(key: str) -> dict[str, str]:
        """Look up a key in the fake plugin's store."""
        return {"key": key, "value": key.upper()}

    @cm.tool(owner="fakeplugin")
    async def slow_report(name: str) -> str:
        """Build a slow report."""
        while not GATE.is_set():
            await asyncio.sleep(0.005)
        return f"report {name}"

    @cm.tool(source="client", owner="app")
    def select_file(prompt: str) -> str:
        """Ask the user to select a file."""
        return "chosen.txt"

    @cm.tool(direct_only=True)
    def computer(action: str) -> str:
        """Control the screen."""
        return f"did {action}"

    @cm.tool(owner="danger")
    def wipe_disk() -> str:
        """Erase everything."""
        return "wiped"


def test_seed_000_end_to_end_plan():
    # 1-3: disabled code mode: the model-visible tools are the direct ones, unchanged.
    with CodeMode({"enabled": False, "workers": 1}) as off:
        add_test_tools(off)
        direct_names = [t.name for t in off.model_tools("code")]
        assert "read" in direct_names and "fake_lookup" in direct_names and "exec" not in direct_names

    # 4-6: enabled, with core, plugin, MCP and client tools: exec, wait and the direct-only tool.
    config = {"enabled": True, "workers": 1, "timeoutMs": 400, "mcpServers": {"time": time_server()}}
    with CodeMode(config, deny=["wipe_disk"]) as cm:
        add_test_tools(cm)
        session = cm.session("e2e")
        assert [t.name for t in session.model_tools("code")] == ["exec", "wait", "computer"]
        GATE.clear()
        model = FakeModel(
            [
                # 7: ALL_TOOLS has the eligible tools, not the direct-only one.
                ("exec", {"code": "return ALL_TOOLS.map(t => t.id)"}),
                # 8: search, describe, callValue / call on core, plugin and client tools.
                (
                    "exec",
                    {
                        "code": "const [hit] = await tools.search('fake plugin lookup key');"
                        "const d = await tools.describe(hit.id);"
                        "const v = await tools.callValue(d.id, {key: 'abc'});"
                        "const r = await tools.call('host:core:read', {path: 'README.md'});"
                        "const c = await tools.callValue('client:app:select_file', {prompt: 'pick'});"
                        "return [hit.id, v.value, r.result, c]"
                    },
                ),
                # 9-10: MCP declarations without a tool call, then an MCP call; no MCP in tools.*.
                (
                    "exec",
                    {
                        "code": "const files = (await API.list('mcp')).map(f => f.path);"
                        "const d = await API.read('mcp/time.d.ts');"
                        "const now = await MCP.time.getCurrentTime({timezone: 'UTC'});"
                        "return [files, d.includes('getCurrentTime'), now.isError,"
                        " ALL_TOOLS.some(t => t.source === 'mcp'), typeof tools.get_current_time]"
                    },
                ),
                # 11: the denied tool is absent and cannot be called by a guessed id.
                (
                    "exec",
                    {
                        "code": "const seen = ALL_TOOLS.some(t => t.name === 'wipe_disk');"
                        "try { await tools.callValue('host:danger:wipe_disk', {}); return [seen, 'called'] }"
                        " catch (e) { return [seen, e.message] }"
                    },
                ),
                # 12: a nested call that completes after exec returned `waiting`.
                (
                    "exec",
                    {
                        "code": "text('before'); const r = await tools.slow_report({name: 'q3'});"
                        " text('after'); return r"
                    },
                ),
            ]
        )
        results = drive(session, model, "code")
        assert "host:fakeplugin:fake_lookup" in results[0]["value"]
        assert "client:app:select_file" in results[0]["value"]
        assert "host:core:computer" not in results[0]["value"]
        assert results[1]["value"] == ["host:fakeplugin:fake_lookup", "ABC", "contents of README.md", "chosen.txt"]
        assert results[2]["value"] == [["mcp/index.d.ts", "mcp/time.d.ts"], True, False, False, "undefined"]
        assert results[3]["value"][0] is False
        assert results[3]["value"][1].startswith("unknown tool: host:danger:wipe_disk. ")
        waiting = results[4]
        assert waiting["status"] == "waiting" and waiting["output"] == [{"type": "text", "text": "before"}]
        # 13-14: wait delivers the result into the suspended VM; output after the resume arrives.
        GATE.set()
        model.script.append(("wait", {"runId": "$runId"}))
        done = drive(session, model, "code")[-1]
        assert done["status"] == "completed" and done["value"] == "report q3"
        assert done["output"] == [{"type": "text", "text": "after"}]
        # 15: timeout, cancel and expiry clear runtime state.
        GATE.clear()
        pending = session.handle("exec", {"code": "return await tools.slow_report({name: 'x'})"})
        assert session.cancel(pending["runId"]) is True
        assert session.handle("wait", {"runId": pending["runId"]})["code"] == "invalid_input"
        assert session.handle("exec", {"code": "while (true) {}"})["code"] == "timeout"
        # 16: the trace shows nested calls under their parent code-mode call.
        trace = cm.trace("e2e")
        parents = {e["id"]: e for e in trace if e["kind"] in ("exec", "wait")}
        nested = [e for e in trace if e["kind"] == "tool_call"]
        assert nested and all(e["parent"] in parents for e in nested)
        assert {e["toolId"] for e in nested} >= {"host:fakeplugin:fake_lookup", "mcp:time:get_current_time"}


@pytest.fixture
def big_plugin():
    def make(config: dict[str, Any]) -> CodeMode:
        cm = CodeMode(config)
        for i in range(300):
            cm.add_tool(
                lambda **kw: {"echo": kw},
                name=f"fake_tool_{i}",
                owner="fakeplugin",
                description=f"Fake plugin operation {i}: lists, filters and exports records.",
                input_schema={
                    "type": "object",
                    "properties": {"record": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["record"],
                },
            )
        return cm

    return make


def test_seed_001_tool_search_regression(big_plugin):
    # 1 and 3: direct mode calls the fake plugin tool, whose schema the provider sees directly.
    with big_plugin({"enabled": False, "workers": 1}) as direct_cm:
        direct = FakeModel([("fake_tool_7", {"record": "r1"})])
        results = drive(direct_cm.session("direct"), direct, "tool_search")
        assert results[0]["result"] == {"echo": {"record": "r1"}}
        assert "fake_tool_7" in direct.offered[0]
    # 2 and 4: tool search calls the same tool; only the compact bridge (and direct-only tools).
    with big_plugin({"enabled": True, "workers": 1}) as cm:
        searching = FakeModel(
            [
                ("tool_search", {"query": "fake plugin operation 7", "limit": 3}),
                ("tool_describe", {"id": "host:fakeplugin:fake_tool_7"}),
                ("tool_call", {"id": "host:fakeplugin:fake_tool_7", "args": {"record": "r1"}}),
            ]
        )
        session = cm.session("search")
        results = drive(session, searching, "tool_search")
        assert "host:fakeplugin:fake_tool_7" in [hit["id"] for hit in results[0]["results"]]
        assert results[2]["result"] == {"echo": {"record": "r1"}}
        assert searching.offered[0] == ["tool_search", "tool_describe", "tool_call"]
        # 5: with a large fake catalog, the tool-search payload is smaller.
        assert searching.payload_bytes[0] < direct.payload_bytes[0] / 5
        assert payload_bytes(cm.model_tools("tool_search")) < payload_bytes(cm.model_tools("direct"))
        # 6: the session log has the expected call count and bridge telemetry.
        calls = [e for e in cm.trace("search") if e["kind"] == "tool_call"]
        assert [e["toolId"] for e in calls] == ["host:fakeplugin:fake_tool_7"]
        bridged = session.handle(
            "tool_search_code",
            {
                "code": "const [h] = await codemode.tools.search('operation 9');"
                " return (await codemode.tools.call(h.id, {record: 'x'})).tool"
            },
        )
        assert bridged["value"] == "host:fakeplugin:fake_tool_9"
        assert bridged["telemetry"]["searches"] == 1 and bridged["telemetry"]["toolCalls"] == 1
        assert bridged["telemetry"]["catalogSize"] == 300
