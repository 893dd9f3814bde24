"""Internal namespaces: plugin-owned domain APIs (``Issues.list(...)``) inside the cell.

Follows the spec's namespace test checklist: prompts only when the backing tools are visible,
ownership by ``sourceName``, refusal of raw functions, forged ids and paths, undeclared tools,
serialization of nested and shared data, calls that run through the catalog tool path (hooks,
trace, telemetry), catchable failures, suspension through ``wait``, and cleanup on rollback.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from codemode import CodeMode, ToolDefinitionError
from codemode.namespaces import NamespaceRegistration, ScopeContext, namespace_tool
from codemode.policy import Block, ToolCallEvent

PLUGIN = "github"
REQUIRED = ("github_list_issues", "github_update_issue", "github_fail", "github_close_issue")
PROMPT = "Use Issues.list(params) and Issues.update(number, patch)."
DESCRIPTION = "GitHub issue helpers for the current repository."

EVENTS: list[ToolCallEvent] = []
CONTEXTS: list[ScopeContext] = []
SHARED = {"labels": ["bug", "docs"]}


def hook(event: ToolCallEvent) -> Block | None:
    EVENTS.append(event)
    if event.name == "github_close_issue":
        return Block("closing issues needs a human")
    return None


def add_github_tools(cm: CodeMode, owner: str = PLUGIN) -> None:
    """The plugin's backing catalog tools (host tools owned by the plugin)."""

    @cm.tool(owner=owner, read_only=True)
    def github_list_issues(state: str = "open") -> list[dict]:
        """List issues of the repository."""
        return [{"number": 1, "state": state}, {"number": 2, "state": state}]

    @cm.tool(owner=owner)
    def github_update_issue(number: int, patch: dict) -> dict:
        """Update one issue."""
        return {"number": number, "patch": patch, "tuple": (1, 2)}

    @cm.tool(owner=owner, read_only=True)
    def github_fail() -> str:
        raise RuntimeError("GitHub is down")

    @cm.tool(owner=owner)
    def github_close_issue(number: int) -> str:
        return f"closed {number}"


def issues_scope(ctx: ScopeContext) -> dict[str, Any]:
    CONTEXTS.append(ctx)
    return {
        "repository": ctx.config,
        "list": namespace_tool("github_list_issues"),
        "update": namespace_tool("github_update_issue", lambda args: {"number": args[0], "patch": args[1]}),
        "admin": {"close": namespace_tool("github_close_issue", lambda args: {"number": args[0]})},
        "views": {"closed": {"all": namespace_tool("github_list_issues", lambda args: {"state": "closed"})}},
        "fail": namespace_tool("github_fail"),
        "first": SHARED,
        "second": SHARED,
        "handle": object(),
        "ratio": float("nan"),
        "steps": [1, {"deep": True}],
    }


def issues_registration(**changes: Any) -> NamespaceRegistration:
    fields: dict[str, Any] = {
        "id": "github-issues",
        "global_name": "Issues",
        "description": DESCRIPTION,
        "required_tool_names": REQUIRED,
        "create_scope": issues_scope,
        "prompt": PROMPT,
        "config": {"owner": "openclaw", "repo": "openclaw"},
    }
    fields.update(changes)
    return NamespaceRegistration(**fields)


@pytest.fixture(scope="module")
def ncm():
    with CodeMode({"workers": 1, "timeoutMs": 5000}, before_tool_call=hook) as cm:
        add_github_tools(cm)
        cm.register_namespace(PLUGIN, issues_registration())
        yield cm


@pytest.fixture
def ns(ncm):
    return ncm.session("namespaces")


def value(session, code: str, **args: Any) -> Any:
    result = session.exec({"code": code, **args})
    assert result["status"] == "completed", result
    return result["value"]


def guest_error(session, call: str, **args: Any) -> str:
    out = value(session, f"try {{ await {call}; return null }} catch (e) {{ return String(e.message) }}", **args)
    assert out is not None, f"{call} did not throw"
    return out


def github_codemode(make_codemode, config: dict[str, Any] | None = None) -> CodeMode:
    cm = make_codemode({"workers": 1, **(config or {})})
    add_github_tools(cm)
    cm.register_namespace(PLUGIN, issues_registration())
    return cm


# ---- the guest surface ---------------------------------------------------------------------------


def test_namespace_is_a_global_and_a_member_of_namespaces(ns):
    out = value(ns, "return [Issues === namespaces.Issues, Object.keys(namespaces)]")
    assert out == [True, ["Issues"]]


def test_namespace_function_calls_its_catalog_tool(ns):
    assert value(ns, "return await Issues.list({state: 'closed'})") == [
        {"number": 1, "state": "closed"},
        {"number": 2, "state": "closed"},
    ]


def test_namespace_call_through_the_namespaces_map(ns):
    assert value(ns, "return (await namespaces.Issues.list({state: 'open'})).length") == 2


def test_without_a_mapper_no_arguments_means_an_empty_input(ns):
    assert value(ns, "return (await Issues.list()).map((i) => i.state)") == ["open", "open"]


def test_input_mapper_builds_the_tool_input_from_the_arguments(ns):
    out = value(ns, "return await Issues.update(7, {title: 'New'})")
    assert out == {"number": 7, "patch": {"title": "New"}, "tuple": [1, 2]}


def test_nested_scope_member_is_callable(ns):
    assert value(ns, "return (await Issues.views.closed.all()).map((i) => i.state)") == ["closed", "closed"]


def test_scope_data_crosses_as_plain_data(ns):
    assert value(ns, "return [Issues.repository, Issues.steps]") == [
        {"owner": "openclaw", "repo": "openclaw"},
        [1, {"deep": True}],
    ]


def test_shared_references_serialize_at_each_path(ns):
    assert value(ns, "return [Issues.first, Issues.second]") == [SHARED, SHARED]


def test_non_json_scope_values_become_json_safe_stand_ins(ns):
    handle, ratio = value(ns, "return [typeof Issues.handle, Issues.ratio]")
    assert handle == "string"
    assert ratio is None


def test_namespace_scope_is_frozen(ns):
    code = "'use strict'; try { Issues.list = () => 'fake'; return 'mutated' } catch (e) { return e.name }"
    assert value(ns, code) == "TypeError"


def test_namespace_global_cannot_be_replaced(ns):
    code = "'use strict'; try { Issues = {}; return 'replaced' } catch (e) { return e.name }"
    assert value(ns, code) == "TypeError"


def test_describe_namespace_returns_its_metadata(ns):
    assert value(ns, "return await describeNamespace('Issues')") == {
        "name": "Issues",
        "id": "github-issues",
        "description": DESCRIPTION,
        "prompt": PROMPT,
        "tools": ["admin.close", "fail", "list", "update", "views.closed.all"],
    }


def test_describe_namespace_of_an_unknown_name_is_undefined(ns):
    assert value(ns, "return typeof (await describeNamespace('Nope'))") == "undefined"


def test_namespaces_are_not_catalog_entries(ns):
    ids = value(ns, "return ALL_TOOLS.map((t) => t.id)")
    assert sorted(ids) == sorted(f"host:github:{name}" for name in REQUIRED)


# ---- create_scope ----------------------------------------------------------------------------------


def test_create_scope_receives_the_run_context(ncm):
    CONTEXTS.clear()
    value(ncm.session("ctx-session"), "return 1")
    assert CONTEXTS[-1].session_id == "ctx-session"
    assert CONTEXTS[-1].plugin_id == PLUGIN
    assert dict(CONTEXTS[-1].config) == {"owner": "openclaw", "repo": "openclaw"}


def test_create_scope_sees_the_plain_session_id_in_an_agent_run(ncm):
    CONTEXTS.clear()
    value(ncm.session("ctx-session", agent_run="run-7"), "return 1")
    assert CONTEXTS[-1].session_id == "ctx-session"


def test_create_scope_receives_the_agent_run_and_the_run_id_a_waiting_result_gives(ncm):
    CONTEXTS.clear()
    session = ncm.session("ctx-run", agent_run="agent-run-3")
    waiting = session.exec({"code": "await yield_control('pause'); return 1"})
    assert waiting["status"] == "waiting", waiting
    try:
        ctx = CONTEXTS[-1]
        assert (ctx.session_id, ctx.agent_run, ctx.run_id) == ("ctx-run", "agent-run-3", waiting["runId"])
    finally:
        session.cancel(waiting["runId"])
    value(ncm.session("ctx-run"), "return 1")
    other = CONTEXTS[-1]
    assert other.agent_run is None
    assert other.run_id.startswith("run_") and other.run_id != ctx.run_id


def test_create_scope_failing_at_run_time_hides_the_namespace(make_codemode):
    cm = make_codemode({"workers": 1})
    add_github_tools(cm)

    def fragile(ctx: ScopeContext) -> dict[str, Any]:
        if ctx.session_id:  # the registration probe has no session
            raise RuntimeError("plugin scope broke")
        return {"list": namespace_tool("github_list_issues")}

    cm.register_namespace(PLUGIN, issues_registration(create_scope=fragile))
    result = cm.session("s").exec({"code": "return typeof Issues"})
    assert result["status"] == "completed", result
    assert result["value"] == "undefined"


def test_an_input_mapper_that_returns_no_json_fails_only_that_call(make_codemode):
    cm = make_codemode({"workers": 1})
    add_github_tools(cm)

    def scope(ctx: ScopeContext) -> dict[str, Any]:
        return {"update": namespace_tool("github_update_issue", lambda args: {"number": object(), "patch": {}})}

    cm.register_namespace(PLUGIN, issues_registration(create_scope=scope))
    s = cm.session("s")
    out = value(s, "try { await Issues.update(1); return null } catch (e) { return String(e.message) }")
    assert out.startswith("tool namespace failed: TypeError"), out
    assert value(s, "return 40 + 2") == 42


# ---- prompts and visibility ------------------------------------------------------------------------


def test_namespace_prompt_is_in_the_exec_description_when_visible(ncm):
    text = ncm.exec_description()
    assert f"- Issues: {DESCRIPTION} {PROMPT}" in text.splitlines()


def test_namespace_prompt_is_absent_when_a_backing_tool_is_missing(make_codemode):
    cm = make_codemode({"workers": 1})
    cm.add_tool(lambda state="open": [], name="github_list_issues", owner=PLUGIN)
    cm.register_namespace(PLUGIN, issues_registration())
    assert PROMPT not in cm.exec_description()
    assert value(cm.session(), "return [typeof Issues, Object.keys(namespaces)]") == ["undefined", []]


def test_namespace_is_hidden_when_a_backing_tool_is_denied(make_codemode):
    cm = github_codemode(make_codemode)
    cm.set_policy(deny=["github_update_issue"])
    assert PROMPT not in cm.exec_description()
    assert value(cm.session(), "return typeof Issues") == "undefined"


def test_same_named_tools_from_another_owner_do_not_expose_the_namespace(make_codemode):
    cm = make_codemode({"workers": 1})
    add_github_tools(cm, owner="impostor")
    cm.register_namespace(PLUGIN, issues_registration())
    assert PROMPT not in cm.exec_description()
    assert value(cm.session(), "return typeof Issues") == "undefined"


def test_one_required_tool_from_another_owner_hides_the_namespace(make_codemode):
    cm = make_codemode({"workers": 1})
    add_github_tools(cm)
    cm.remove_tool("host:github:github_fail")
    cm.add_tool(lambda: "x", name="github_fail", owner="impostor")
    cm.register_namespace(PLUGIN, issues_registration())
    assert value(cm.session(), "return typeof Issues") == "undefined"


def test_namespace_calls_the_plugins_tool_when_another_owner_has_the_same_name(make_codemode):
    cm = github_codemode(make_codemode)
    cm.add_tool(lambda state="open": "impostor", name="github_list_issues", owner="impostor")
    assert value(cm.session(), "return (await Issues.list()).length") == 2


# ---- registration rules ----------------------------------------------------------------------------


def test_raw_scope_function_is_rejected(ncm):
    with pytest.raises(ToolDefinitionError, match="raw host function"):
        registration = issues_registration(id="raw", global_name="Raw", create_scope=lambda ctx: {"list": lambda: []})
        ncm.register_namespace(PLUGIN, registration)


def test_callable_path_to_an_undeclared_tool_is_rejected(ncm):
    scope = lambda ctx: {"drop": namespace_tool("github_delete_repo")}  # noqa: E731
    registration = issues_registration(id="undeclared", global_name="Undeclared", create_scope=scope)
    with pytest.raises(ToolDefinitionError, match="undeclared tool"):
        ncm.register_namespace(PLUGIN, registration)


def test_cyclic_scope_is_rejected(ncm):
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    registration = issues_registration(id="cyclic", global_name="Cyclic", create_scope=lambda ctx: cyclic)
    with pytest.raises(ToolDefinitionError, match="cycle"):
        ncm.register_namespace(PLUGIN, registration)


@pytest.mark.parametrize("key", ["__proto__", "constructor", "prototype", "", "  ", "a.b", "a/b", 1])
def test_unsafe_scope_key_is_rejected(ncm, key):
    registration = issues_registration(id="unsafe", global_name="Unsafe", create_scope=lambda ctx: {"x": {key: 1}})
    with pytest.raises(ToolDefinitionError, match="unsafe key"):
        ncm.register_namespace(PLUGIN, registration)


@pytest.mark.parametrize(
    "name",
    ["tools", "namespaces", "text", "json", "yield_control", "MCP", "API", "ALL_TOOLS", "__openclawState",
     "searchTools", "describeNamespace", "1Issues", "my-issues", "",
     # every other name already on the guest's globalThis: the prelude's API and the builtins
     "codemode", "console", "store", "parseInt", "queueMicrotask", "Uint8Array", "WeakMap", "Iterator"],
)  # fmt: skip
def test_reserved_or_invalid_global_name_is_rejected(ncm, name):
    with pytest.raises(ToolDefinitionError, match="globalName"):
        ncm.register_namespace(PLUGIN, issues_registration(id="reserved", global_name=name))


@pytest.mark.parametrize("name", ["codemode", "exit", "Intl", "setTimeout", "fetch", "process", "Deno"])
def test_no_registrable_name_breaks_the_cells(name):
    """Whatever name a registration is refused or accepted with, cells still run."""
    with CodeMode({"workers": 1}) as cm:
        add_github_tools(cm)
        try:
            cm.register_namespace(PLUGIN, issues_registration(global_name=name))
        except ToolDefinitionError:
            return
        session = cm.session("probe")
        assert value(session, "return 1 + 1") == 2
        assert "list" in value(session, f"return Object.keys({name})")


def test_global_name_taken_by_another_namespace_is_rejected(ncm):
    with pytest.raises(ToolDefinitionError, match="taken"):
        ncm.register_namespace(PLUGIN, issues_registration(id="github-issues-2"))


def test_a_namespace_id_another_plugin_holds_is_refused(make_codemode):
    cm = github_codemode(make_codemode)
    with pytest.raises(ToolDefinitionError, match="'github-issues' is already registered by plugin 'github'"):
        cm.register_namespace("intruder", issues_registration(global_name="Stolen"))
    # The holder keeps it, untouched; its own plugin may register it again (a reload).
    session = cm.session("holder")
    assert value(session, "return Object.keys(namespaces)") == ["Issues"]
    cm.register_namespace(PLUGIN, issues_registration(description="reloaded"))
    assert "reloaded" in cm.exec_description()


def test_namespace_must_name_its_required_tools(ncm):
    with pytest.raises(ToolDefinitionError, match="must name the tools"):
        ncm.register_namespace(PLUGIN, issues_registration(id="none", global_name="None_", required_tool_names=()))


def test_rejected_registration_leaves_no_namespace_behind(ns):
    assert value(ns, "return Object.keys(namespaces)") == ["Issues"]


# ---- forged calls ----------------------------------------------------------------------------------


# The namespace channel is not reachable through tools.callValue at all (the prelude refuses the
# bridge's internal ids); the host's own path and id checks stand behind that.
def test_forged_namespace_id_is_refused(ns):
    call = "tools.callValue('\\u0000ns', {ns: 'forged-ns', path: 'list', args: []})"
    assert "unknown tool" in guest_error(ns, call)


@pytest.mark.parametrize("path", ["repository", "nope", "admin", "list.constructor"])
def test_forged_namespace_path_is_refused(ns, path):
    call = f"tools.callValue('\\u0000ns', {{ns: 'github-issues', path: '{path}', args: []}})"
    assert "unknown tool" in guest_error(ns, call)


def test_malformed_namespace_call_is_refused(ns):
    assert "unknown tool" in guest_error(ns, "tools.callValue('\\u0000ns', 'garbage')")


# ---- calls go through the catalog tool path --------------------------------------------------------


def test_namespace_call_is_seen_by_the_hook_as_its_catalog_tool(ns):
    EVENTS.clear()
    value(ns, "return await Issues.update(9, {state: 'closed'})")
    (event,) = EVENTS
    assert (event.tool_id, event.owner, event.source) == ("host:github:github_update_issue", PLUGIN, "host")
    assert event.input == {"number": 9, "patch": {"state": "closed"}}
    assert event.session_id == "namespaces"


def test_hook_can_block_a_namespace_call(ns):
    message = guest_error(ns, "Issues.admin.close(1)")
    assert message == "tool host:github:github_close_issue: tool call blocked: closing issues needs a human"


def test_namespace_call_is_traced_under_its_exec(ncm):
    session = ncm.session("ns-trace")
    value(session, "return await Issues.list()")
    events = ncm.trace("ns-trace")
    (call,) = [e for e in events if e["kind"] == "tool_call"]
    (parent,) = [e for e in events if e["kind"] == "exec"]
    assert (call["toolId"], call["parent"], call["status"]) == ("host:github:github_list_issues", parent["id"], "ok")


def test_namespace_calls_count_as_tool_calls_in_telemetry(ns):
    result = ns.exec({"code": "await Issues.list(); await namespaces.Issues.update(1, {}); return 1"})
    assert result["telemetry"]["toolCalls"] == 2


def test_namespace_call_result_is_json_safe(ns):
    assert value(ns, "const r = await Issues.update(1, {}); return [Array.isArray(r.tuple), JSON.stringify(r)]") == [
        True,
        '{"number":1,"patch":{},"tuple":[1,2]}',
    ]


def test_guest_can_catch_a_failing_namespace_call(ns):
    out = value(ns, "try { await Issues.fail(); return null } catch (e) { return [e instanceof Error, e.message] }")
    assert out[0] is True
    assert "GitHub is down" in out[1]
    assert "Traceback" not in out[1]


def test_uncaught_namespace_failure_fails_the_run(ns):
    result = ns.exec({"code": "return await Issues.fail()"})
    assert result["status"] == "failed"
    assert "GitHub is down" in result["error"]


def _until_done(session, result: dict[str, Any]) -> dict[str, Any]:
    """Restart-safe runs are never drained within a call: each tool result comes with a wait."""
    for _ in range(10):
        if result["status"] != "waiting":
            break
        result = session.wait({"runId": result["runId"]})
    return result


def test_restart_safe_run_refuses_a_namespace_call_to_a_side_effecting_tool(ns):
    code = "try { await Issues.update(1, {}); return null } catch (e) { return String(e.message) }"
    result = _until_done(ns, ns.exec({"code": code, "restartSafe": True}))
    assert "not read-only" in result["value"]


def test_restart_safe_run_allows_a_namespace_call_to_a_read_only_tool(ns):
    result = _until_done(ns, ns.exec({"code": "return (await Issues.list()).length", "restartSafe": True}))
    assert result["value"] == 2


# ---- suspension ------------------------------------------------------------------------------------


def test_suspended_namespace_call_resumes_through_wait(gated_namespace):
    cm, gate = gated_namespace()
    session = cm.session("slow")
    waiting = session.exec({"code": "const v = await Slow.fetch('k'); return v + '!'"})
    assert waiting["status"] == "waiting", waiting
    assert waiting["reason"] == "pending_tools"
    gate.set()
    done = session.wait({"runId": waiting["runId"]})
    assert (done["status"], done.get("value")) == ("completed", "fetched k!")


def test_pending_namespace_call_names_its_catalog_tool(gated_namespace):
    cm, gate = gated_namespace()
    session = cm.session("slow")
    waiting = session.exec({"code": "return await Slow.fetch('k')"})
    try:
        assert waiting["status"] == "waiting", waiting
        assert [c["toolId"] for c in waiting["pendingToolCalls"]] == ["host:slow:slow_fetch"]
    finally:
        gate.set()
        session.cancel(waiting.get("runId", ""))


# ---- cleanup ---------------------------------------------------------------------------------------


def test_clear_namespaces_removes_the_plugins_namespaces(make_codemode):
    cm = github_codemode(make_codemode)
    assert cm.clear_namespaces(PLUGIN) == 1
    assert PROMPT not in cm.exec_description()
    assert value(cm.session(), "return [typeof Issues, Object.keys(namespaces)]") == ["undefined", []]


def test_clear_namespaces_keeps_other_plugins_namespaces(make_codemode):
    cm = github_codemode(make_codemode)
    cm.add_tool(lambda: ["event"], name="calendar_list", owner="calendar")
    cm.register_namespace(
        "calendar",
        NamespaceRegistration(
            id="calendar",
            global_name="Calendar",
            description="Calendar helpers.",
            required_tool_names=("calendar_list",),
            create_scope=lambda ctx: {"list": namespace_tool("calendar_list")},
        ),
    )
    assert cm.clear_namespaces(PLUGIN) == 1
    assert value(cm.session(), "return [typeof Issues, await Calendar.list()]") == ["undefined", ["event"]]
    assert "- Calendar: Calendar helpers." in cm.exec_description().splitlines()


def test_clear_namespaces_of_an_unknown_plugin_removes_nothing(ncm, ns):
    assert ncm.clear_namespaces("no-such-plugin") == 0
    assert value(ns, "return typeof Issues") == "object"


def test_cleared_global_name_can_be_registered_again(make_codemode):
    cm = github_codemode(make_codemode)
    cm.clear_namespaces(PLUGIN)
    cm.register_namespace(PLUGIN, issues_registration(id="github-issues-v2"))
    assert value(cm.session(), "return (await describeNamespace('Issues')).id") == "github-issues-v2"


def test_host_refuses_forged_namespace_paths_even_if_a_frame_carries_one():
    """Defence in depth: a worker frame is untrusted, so the dispatcher checks paths itself."""

    from codemode.dispatch import Dispatcher
    from codemode.tools import NAMESPACE_TOOL, CatalogView

    view = CatalogView(tools={}, catalog_json="[]", fingerprint="", counts={}, direct=())
    dispatcher = Dispatcher(view, asyncio.new_event_loop, namespace_calls={("github-issues", "list"): ("x", None)})
    dispatcher.submit(
        [
            (1, NAMESPACE_TOOL, '{"ns": "forged-ns", "path": "list", "args": []}'),
            (2, NAMESPACE_TOOL, '{"ns": "github-issues", "path": "list.constructor", "args": []}'),
            (3, NAMESPACE_TOOL, '"garbage"'),
        ]
    )
    results = {call_id: message for call_id, _, message in dispatcher.take_ready()}
    dispatcher.close()
    assert "unknown namespace function forged-ns:list" in results[1]
    assert "unknown namespace function github-issues:list.constructor" in results[2]
    assert "malformed namespace call" in results[3]
