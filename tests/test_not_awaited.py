"""A forgotten `await` is named (issue 17, part 3).

`const r = tools.double({x: 2}); return {r}` used to complete with `{r: {}}`, and `r + 1` was
`"[object Promise]1"`, silently. A bridge call's Promise found in the cell's value, an output, a
call's input, or used as a string now reads `[Promise of call_1 tools.double: not awaited; use
await]`, and an output `[not awaited] call_1 tools.double: <where> ...; write `await ...``
tells the model which call and how to fix it (`call_1` as `pendingToolCalls` names calls). The
Promise is never awaited; its call still runs. One notice per call, at most five a run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode

NAMED_SERVER = str(Path(__file__).resolve().parent / "mcp_named_server.py")


def marker(label: str) -> str:
    return f"[Promise of {label}: not awaited; use await]"


def notices(result: dict[str, Any]) -> list[str]:
    """The texts of the result's not-awaited notices."""
    texts = [o.get("text", "") for o in result.get("output", [])]
    return [t for t in texts if t.startswith("[not awaited] ")]


@pytest.fixture(scope="module")
def ncm() -> Iterator[CodeMode]:
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:

        @cm.tool
        def double(x: int = 0) -> int:
            """Doubles x."""
            return 2 * x

        @cm.tool
        def echo(value: Any = None) -> Any:
            """Answers what it was given."""
            return value

        yield cm


def run(cm: CodeMode, code: str) -> dict[str, Any]:
    return cm.session("not-awaited").exec({"code": code})


def test_the_issues_cell_names_the_call_in_its_value_and_says_how_to_fix_it(ncm):
    result = run(ncm, "const r = tools.double({x: 2}); return {r}")
    assert result["status"] == "completed", result
    assert result["value"] == {"r": marker("call_1 tools.double")}
    assert notices(result) == [
        "[not awaited] call_1 tools.double: the cell's value holds its Promise, not its result; "
        "write `await tools.double(...)`"
    ]


@pytest.mark.parametrize(
    ("expression", "label"),
    [
        ("tools.double({x: 1})", "call_1 tools.double"),
        ("tools.callValue('double', {x: 1})", 'call_1 tools.callValue("double")'),
        ("tools.call('double', {x: 1})", 'call_1 tools.call("double")'),
        ("codemode.tools.call('double', {})", 'call_1 tools.call("double")'),
        ("tools.search('double')", "tools.search"),
        ("searchTools('double')", "searchTools"),
        ("describeTool('double')", "describeTool"),
    ],
)
def test_each_tool_path_is_named_as_the_cell_wrote_it(ncm, expression, label):
    result = run(ncm, f"const p = {expression}; return {{p}}")
    assert result["value"] == {"p": marker(label)}
    assert len(notices(result)) == 1
    assert notices(result)[0].startswith(f"[not awaited] {label}: the cell's value holds its Promise")


@pytest.mark.parametrize(
    ("statement", "where"),
    [
        ("text(r)", "a text() output"),
        ("json({r})", "a json() output"),
        ("console.log('got', r)", "a console.log() output"),
        ("console.error(r)", "a console.error() output"),
        ("await tools.echo({value: r})", "the input of call_2 tools.echo"),
        ("`${r}`", "its Promise was used as a string or number"),
    ],
)
def test_the_notice_says_where_the_promise_was_found(ncm, statement, where):
    result = run(ncm, f"const r = tools.double({{x: 3}}); {statement}; return 'done'")
    assert result["status"] == "completed", result
    [notice] = notices(result)
    assert notice.startswith(f"[not awaited] call_1 tools.double: {where}")
    assert notice.endswith("not its result; write `await tools.double(...)`")


def test_the_marker_is_what_a_string_use_or_a_tool_input_gets(ncm):
    result = run(ncm, "const r = tools.double({x: 3}); return [r + 1, await tools.echo({value: r})]")
    assert result["value"] == [marker("call_1 tools.double") + "1", marker("call_1 tools.double")]


def test_each_call_is_noticed_once_and_a_run_at_most_five_times(ncm):
    once = run(ncm, "const r = tools.double({}); text(r); json(r); console.log(`${r}`); return [r]")
    assert len(notices(once)) == 1
    many = run(ncm, "return Array.from({length: 7}, (_, i) => tools.double({x: i}))")
    assert [n.split(":")[0] for n in notices(many)] == [f"[not awaited] call_{i} tools.double" for i in range(1, 6)]
    assert many["value"][6] == marker("call_7 tools.double")


def test_awaited_calls_are_not_noticed(ncm):
    result = run(
        ncm,
        """
        const r = await tools.double({x: 2});
        const {result} = await tools.call('double', {x: r});
        text(`${r} ${result}`);
        return tools.double({x: result});
        """,
    )
    assert result["value"] == 16
    assert result["output"] == [{"type": "text", "text": "4 8"}]


def test_a_promise_no_bridge_call_made_keeps_the_generic_marker(ncm):
    result = run(ncm, "const p = Promise.resolve(1); const q = tools.double({}).then(x => x); return {p, q, s: '' + p}")
    generic = "[Promise: not awaited; use await]"
    assert result["value"] == {"p": generic, "q": generic, "s": "[object Promise]"}
    assert notices(result) == []


def test_a_guest_cannot_make_the_marker_name_a_call_or_invoke_then(ncm):
    result = run(
        ncm,
        """
        let thenCalls = 0;
        const fake = Object.setPrototypeOf({}, Promise.prototype);
        globalThis.WeakMap = function () {}; globalThis.Promise = function () {};
        const r = tools.double({});
        r.then = () => { thenCalls++ }; r.constructor = function () { thenCalls++ };
        text(r);
        return {fake, r, thenCalls};
        """,
    )
    assert result["value"] == {
        "fake": "[Promise: not awaited; use await]",
        "r": marker("call_1 tools.double"),
        "thenCalls": 0,
    }
    assert len(notices(result)) == 1


def test_a_namespace_call_is_named_by_its_path(gated_namespace):
    cm, gate = gated_namespace()
    gate.set()
    session = cm.session()
    seen = [session.exec({"code": "const f = Slow.fetch('k'); return {f}"})]
    while seen[-1]["status"] == "waiting":  # (a loaded machine may pass the 150 ms deadline first)
        seen.append(session.wait({"runId": seen[-1]["runId"]}))
    assert seen[-1]["value"] == {"f": marker("call_1 Slow.fetch")}
    assert next(n for r in seen for n in notices(r)).endswith("write `await Slow.fetch(...)`")


def test_yield_control_is_named_and_the_run_still_waits_on_it(ncm):
    session = ncm.session("yield")
    first = session.exec({"code": "const y = yield_control('progress'); return {y}"})
    assert (first["status"], first["reason"]) == ("waiting", "yield"), first
    done = session.wait({"runId": first["runId"]})
    assert done["value"] == {"y": marker("call_1 yield_control")}
    assert any(n.startswith("[not awaited] call_1 yield_control:") for n in notices(first) + notices(done))


@pytest.fixture
def mcp_codemode(make_codemode: Callable[..., CodeMode]) -> CodeMode:
    server = {"command": sys.executable, "args": [NAMED_SERVER, "search"]}
    cm = make_codemode({"workers": 1, "timeoutMs": 5000, "mcpServers": {"docs": server}})
    assert cm.load_mcp_tools() == {"docs": None}
    return cm


def test_an_mcp_call_and_an_mcp_resource_read_are_named(mcp_codemode):
    result = mcp_codemode.session().exec(
        {"code": "const s = MCP.docs.search({}); const l = MCP.docs.resources.list(); return {s, l}"}
    )
    assert result["value"] == {"s": marker("call_1 MCP.docs.search"), "l": marker("call_2 MCP.docs.resources.list")}
    assert [n.split(":")[0] for n in notices(result)] == [
        "[not awaited] call_1 MCP.docs.search",
        "[not awaited] call_2 MCP.docs.resources.list",
    ]
