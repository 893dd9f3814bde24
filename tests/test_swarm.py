"""Swarm (seed 000, "使用 Swarm 展開代理"): ``agents.run()``, ``phase()`` and ``log()`` in a cell.

The runner here is written the way a host would write one: each sub-agent is a session of a
nested ``CodeMode`` whose cell is the prompt, with a slow tool of its own, so sub-agents
suspend and resume (their own ``wait``) while the orchestrating cell waits on them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest
from codemode import Block, CodeMode, Defer
from codemode.agents import AgentTask


class Research:
    """The nested catalog's one tool, counting how many calls run at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.running = 0
        self.peak = 0
        self.lock = threading.Lock()

    async def research(self, topic: str) -> dict[str, Any]:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            with self.lock:
                self.running -= 1
        return {"topic": topic, "score": len(topic)}


class NestedSessions:
    """An agent runner: a sub-agent is a session of ``inner`` that runs the prompt as its cell
    (waiting on it until it is done), and returns its value with the options' ``name``."""

    def __init__(self, inner: CodeMode) -> None:
        self.inner = inner
        self.tasks: list[AgentTask] = []

    async def run(self, task: AgentTask) -> dict[str, Any]:
        self.tasks.append(task)
        session = self.inner.session(f"{task.session_id}/{task.run_id}/{task.call_id}")
        result = await session.exec_async({"code": task.prompt})
        while result["status"] == "waiting":
            result = await session.wait_async({"runId": result["runId"]})
        if result["status"] == "failed":
            raise RuntimeError(f"sub-agent failed: {result['error']}")
        return {"name": task.options.get("name"), "value": result["value"]}


@pytest.fixture(scope="module")
def research() -> Research:
    return Research(0.4)


@pytest.fixture(scope="module")
def inner(research: Research) -> Any:
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 100}) as inner:
        inner.tool(research.research, name="research", description="Research a topic.")
        yield inner


@pytest.fixture
def runner(inner: CodeMode) -> NestedSessions:
    return NestedSessions(inner)


@pytest.fixture
def cm(runner: NestedSessions) -> Any:
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 250}, agents=runner) as cm:
        yield cm


def finish(cm: CodeMode, result: Any, session: Any = None) -> dict[str, Any]:
    session = session or cm.session()
    while result["status"] == "waiting":
        result = session.wait({"runId": result["runId"]})
    return dict(result)


def run(cm: CodeMode, code: str) -> dict[str, Any]:
    return finish(cm, cm.session().exec({"code": code}))


# ---- the gate ------------------------------------------------------------------------------------


def test_enabling_code_mode_alone_never_exposes_the_swarm_globals():
    with CodeMode({"enabled": True, "workers": 1}) as plain:
        plain.tool(lambda x: x, name="ident")
        got = run(plain, "return [typeof agents, typeof phase, typeof log]")
        assert got["value"] == ["undefined", "undefined", "undefined"]
        assert "agents.run" not in plain.exec_description()


def test_a_runner_exposes_agents_phase_and_log_and_the_description_says_so(cm):
    got = run(cm, "return [typeof agents.run, typeof phase, typeof log, Object.isFrozen(agents)]")
    assert got["value"] == ["function", "function", "function", True]
    assert "agents.run(prompt, options?)" in cm.exec_description()


def test_a_runner_without_run_is_refused():
    from codemode import ConfigError

    with pytest.raises(ConfigError, match="agent runner"):
        CodeMode({"enabled": True}, agents=object())  # type: ignore[arg-type]


def test_a_deny_pattern_on_agents_run_removes_the_swarm_globals(runner):
    with CodeMode({"enabled": True, "workers": 1}, agents=runner, deny=["agents:run"]) as cm:
        assert run(cm, "return typeof agents")["value"] == "undefined"
        assert "agents.run" not in cm.exec_description()


# ---- running sub-agents --------------------------------------------------------------------------


def test_agents_run_resolves_to_the_sub_agents_structured_result(cm, runner):
    got = run(
        cm, 'return await agents.run("return (await tools.research({topic: \\"tides\\"})).score", {name: "tides"})'
    )
    assert got["status"] == "completed", got
    assert got["value"] == {"name": "tides", "value": 5}
    (task,) = runner.tasks
    assert task.options == {"name": "tides"}
    assert task.run_id.startswith("run_") and task.call_id >= 1 and task.session_id == "default"


def test_sixteen_sub_agents_fan_out_suspend_and_resume_with_wait(cm, runner, research):
    code = """phase("research");
const topics = Array.from({length: 16}, (_, i) => "topic-" + "x".repeat(i));
log("fanning out", topics.length);
const found = await Promise.all(topics.map((t) => agents.run(
  `return (await tools.research({topic: ${JSON.stringify(t)}})).score`, {name: t})));
phase("gate");
const best = found.filter((r) => r.value > 12);
if (best.length === 0) return "nothing good";
phase("collect");
return {count: found.length, best: best.map((r) => r.name)}"""
    s = cm.session()
    first = s.exec({"code": code})
    assert first["status"] == "waiting" and first["reason"] == "pending_tools"
    pending = first["pendingToolCalls"]
    assert len(pending) == 16 and {p["method"] for p in pending} == {"agents.run"}
    assert {p["toolId"] for p in pending} == {"agents:run"}
    assert [o["text"] for o in first["output"]] == ["[phase] research", "[log] fanning out 16"]
    done = finish(cm, first, s)
    assert done["status"] == "completed", done
    assert done["value"] == {"count": 16, "best": [f"topic-{'x' * i}" for i in range(7, 16)]}
    assert [o["text"] for o in done["output"]] == ["[phase] gate", "[phase] collect"]
    assert len(runner.tasks) == 16 and done["telemetry"]["toolCalls"] == 16
    assert research.peak == 16  # every sub-agent's tool ran at once: a fan-out, not a queue


def test_sub_agent_calls_count_toward_max_pending_tool_calls(runner):
    with CodeMode({"enabled": True, "workers": 1, "maxPendingToolCalls": 4}, agents=runner) as cm:
        code = """const runs = [];
for (let i = 0; i < 5; i++) runs.push(agents.run("return " + i).then((r) => r.value, (e) => e.message));
return await Promise.all(runs)"""
        got = run(cm, code)
    assert got["value"][:4] == [0, 1, 2, 3]
    assert "too many pending tool calls: at most 4" in got["value"][4]


def test_a_failing_sub_agent_rejects_its_promise_only(cm):
    code = """const [ok, bad] = await Promise.allSettled([
  agents.run("return 1"), agents.run("throw new Error('lost')")]);
return [ok.status, ok.value.value, bad.status, bad.reason.message]"""
    got = run(cm, code)["value"]
    assert got[:3] == ["fulfilled", 1, "rejected"]
    assert "sub-agent failed: Error: lost" in got[3]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("agents.run()", "prompt must be a non-empty string"),
        ('agents.run("")', "prompt must be a non-empty string"),
        ("agents.run({prompt: 'x'})", "prompt must be a non-empty string"),
        ('agents.run("x", "fast")', "options must be an object"),
        ("phase()", "name must be a non-empty string"),
        ("phase(3)", "name must be a non-empty string"),
    ],
)
def test_malformed_swarm_calls_reject_in_the_guest(cm, runner, call, message):
    got = run(cm, f"try {{ await {call}; return 'resolved' }} catch (e) {{ return e.name + ': ' + e.message }}")
    assert got["value"].startswith("TypeError: ") and message in got["value"], got
    assert runner.tasks == []


def test_a_not_awaited_agents_run_is_named(cm):
    got = run(cm, 'const r = agents.run("return 1"); return {r}')
    assert "agents.run" in str(got["value"]) and "not awaited" in str(got["value"])


# ---- the host's gate, trace, journal ---------------------------------------------------------------


def test_agents_run_passes_the_hook_which_may_block_or_rewrite_it(runner):
    seen: list[tuple[str, str, Any]] = []

    def hook(event: Any) -> Any:
        seen.append((event.tool_id, event.source, event.input))
        if "forbidden" in event.input["prompt"]:
            return Block("not that one")
        return None

    with CodeMode({"enabled": True, "workers": 1}, agents=runner, before_tool_call=hook) as cm:
        got = run(cm, "try { await agents.run(\"return 'forbidden'\") } catch (e) { return e.message }")
        assert "tool call blocked: not that one" in got["value"]
        assert run(cm, 'return (await agents.run("return 2", {name: "b"})).value')["value"] == 2
    assert seen[1] == ("agents:run", "agents", {"prompt": "return 2", "options": {"name": "b"}})
    assert [t.prompt for t in runner.tasks] == ["return 2"]


def test_agents_run_waits_for_an_approval_when_the_policy_asks_for_one(runner):
    with CodeMode({"enabled": True, "workers": 1}, agents=runner, require_approval=["agents:run"]) as cm:
        s = cm.session()
        first = s.exec({"code": 'return (await agents.run("return 7")).value'})
        assert first["status"] == "waiting"
        (pending,) = first["pendingToolCalls"]
        assert pending["approval"] == "pending" and pending["input"] == {"prompt": "return 7", "options": {}}
        assert runner.tasks == []
        s.approve(first["runId"], pending["id"])
        assert finish(cm, first, s)["value"] == 7


def test_a_deferred_approval_can_be_rejected(runner):
    with CodeMode({"enabled": True, "workers": 1}, agents=runner, approve=lambda e: Defer()) as cm:
        s = cm.session()
        first = s.exec({"code": 'try { await agents.run("return 7") } catch (e) { return e.message }'})
        s.approve(first["runId"], first["pendingToolCalls"][0]["id"], ok=False, reason="too costly")
        assert "not approved: too costly" in finish(cm, first, s)["value"]
    assert runner.tasks == []


def test_phase_log_and_sub_agent_calls_are_in_the_trace(cm):
    result = run(cm, 'phase("one"); log("a", {b: 1}); await agents.run("return 1"); phase("two"); return 0')
    assert result["status"] == "completed"
    trace = cm.trace()
    progress = [(e["kind"], e["text"]) for e in trace if e["kind"] in ("phase", "log")]
    assert progress == [("phase", "one"), ("log", 'a {"b":1}'), ("phase", "two")]
    calls = [e for e in trace if e["kind"] == "tool_call"]
    assert [(e["toolId"], e["status"]) for e in calls] == [("agents:run", "ok")]


def test_a_restart_safe_run_may_not_start_sub_agents(cm, runner):
    result = cm.session().exec({"code": "return await agents.run('return 1')", "restartSafe": True})
    result = finish(cm, result)
    assert result["status"] == "failed" and "agents.run is not read-only" in result["error"]
    assert runner.tasks == []


def test_sub_agents_finished_before_a_worker_dies_replay_from_the_journal(runner):
    release = threading.Event()

    class Gated(NestedSessions):
        async def run(self, task: AgentTask) -> dict[str, Any]:
            if task.options.get("hold"):
                await asyncio.to_thread(release.wait, 10)
            return await super().run(task)

    gated = Gated(runner.inner)
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 300}, agents=gated) as cm:
        s = cm.session()
        code = """const first = await Promise.all([agents.run("return 1"), agents.run("return 2")]);
phase("second wave");
const second = await agents.run("return 3", {hold: true});
return [...first.map((r) => r.value), second.value]"""
        waiting = s.exec({"code": code})
        assert waiting["status"] == "waiting"
        killed = cm.inspect().worker_pids
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        release.set()
        done = finish(cm, waiting, s)
        assert done["status"] == "completed", done
        assert done["value"] == [1, 2, 3]
        assert not set(killed) & set(cm.inspect().worker_pids)
    assert sorted(t.prompt for t in gated.tasks) == ["return 1", "return 2", "return 3"]  # none ran twice


def test_each_sub_agent_is_a_tool_call_span_under_its_exec(runner):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with CodeMode({"enabled": True, "workers": 1}, agents=runner, tracer_provider=provider) as cm:
        result = run(cm, 'return (await Promise.all([agents.run("return 1"), agents.run("return 2")])).length')
        assert result["value"] == 2 and result["telemetry"]["toolCalls"] == 2
    spans = exporter.get_finished_spans()
    (exec_span,) = [s for s in spans if s.name == "codemode.exec"]
    calls = [s for s in spans if s.name == "codemode.tool_call"]
    assert [c.attributes["codemode.tool_id"] for c in calls] == ["agents:run", "agents:run"]
    assert {c.parent.span_id for c in calls if c.parent is not None} == {exec_span.context.span_id}
