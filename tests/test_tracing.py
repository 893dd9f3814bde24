"""OpenTelemetry spans (`codemode.tracing`): one per exec/wait, one child per nested tool call,
through the SDK's in-memory exporter. Each module-level ``CodeMode`` reports to its own provider
(``tracer_provider=``), so nothing here sets the process-wide one; the global provider and a
process without OpenTelemetry are tried in subprocesses."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from codemode import CodeMode
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

SECRET = "sk-live-7d3f9a1c-never-in-a-span"
TESTS = Path(__file__).parent


def in_memory() -> tuple[InMemorySpanExporter, TracerProvider]:
    """A provider whose finished spans land in the exporter, at once."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


class Traced:
    """A CodeMode reporting to an in-memory exporter, and its tools' gate."""

    def __init__(self) -> None:
        self.exporter, self.provider = in_memory()
        self.cm = CodeMode({"workers": 1, "timeoutMs": 5000}, tracer_provider=self.provider)
        #: `slow` answers once this is set.
        self.gate = threading.Event()
        app = self.provider.get_tracer("app")
        cm = self.cm

        @cm.tool
        def add(a: int, b: int) -> int:
            with app.start_as_current_span("add.inner"):  # a tool's own span
                return a + b

        @cm.tool
        async def fetch(key: str) -> str:
            with app.start_as_current_span("fetch.inner"):
                await asyncio.sleep(0)
                return key.upper()

        @cm.tool
        async def slow() -> str:
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
            return "slow"

        @cm.tool
        def login(user: str, token: str) -> dict[str, str]:
            return {"user": user, "session": f"{token}-session"}

        @cm.tool
        def broken() -> None:
            raise RuntimeError("the backend is down")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    t = Traced()
    with t.cm:
        yield t
    t.gate.set()


@pytest.fixture
def t(traced: Traced) -> Iterator[Traced]:
    traced.exporter.clear()
    traced.gate.clear()
    yield traced
    traced.gate.set()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def test_an_exec_with_three_tool_calls_is_one_span_with_three_tool_call_children(t: Traced):
    s = t.cm.session("three")
    code = "return (await tools.add({a: 1, b: 2})) + (await tools.add({a: 3, b: 4})) + (await tools.add({a: 5, b: 6}))"
    result = s.exec({"code": code})
    assert result["value"] == 21
    (exec_span,) = t.spans("codemode.exec")
    calls = sorted(t.spans("codemode.tool_call"), key=lambda s: s.attributes["codemode.call_id"])
    assert [parent_id(c) for c in calls] == [span_id(exec_span)] * 3
    assert all(c.context.trace_id == exec_span.context.trace_id for c in calls)
    (run_id,) = {c.attributes["codemode.run_id"] for c in calls}
    shown = [dict(c.attributes) for c in calls]
    assert all(isinstance(a.pop("codemode.duration_ms"), float) for a in shown)
    assert shown == [
        {"codemode.tool_id": "host:core:add", "codemode.call_id": n, "codemode.run_id": run_id, "codemode.status": "ok"}
        for n in (1, 2, 3)
    ]
    telemetry = result["telemetry"]
    attributes = exec_span.attributes
    assert attributes is not None
    assert attributes["codemode.session_id"] == "three"
    assert attributes["codemode.run_id"] == run_id
    assert attributes["codemode.status"] == "completed"
    assert attributes["codemode.telemetry.tool_calls"] == telemetry["toolCalls"] == 3
    assert attributes["codemode.telemetry.catalog_size"] == telemetry["catalogSize"]
    assert attributes["codemode.telemetry.catalog_sources.host"] == telemetry["catalogSources"]["host"]
    assert attributes["codemode.telemetry.model_visible_tools"] == ("exec", "wait")
    assert exec_span.status.status_code is StatusCode.UNSET


def test_a_tools_own_spans_nest_under_its_call(t: Traced):
    s = t.cm.session("inner")
    code = "return [await tools.add({a: 1, b: 1}), await tools.fetch({key: 'k'})]"
    assert s.exec({"code": code})["value"] == [2, "K"]
    calls = {c.attributes["codemode.tool_id"]: c for c in t.spans("codemode.tool_call")}
    (add_inner,) = t.spans("add.inner")  # a sync tool, on the exec caller's thread
    (fetch_inner,) = t.spans("fetch.inner")  # an async tool, on the private loop
    assert parent_id(add_inner) == span_id(calls["host:core:add"])
    assert parent_id(fetch_inner) == span_id(calls["host:core:fetch"])


def test_the_exec_span_is_a_child_of_the_callers_span(t: Traced):
    with t.provider.get_tracer("app").start_as_current_span("agent turn") as turn:
        assert t.cm.session("turn").exec({"code": "return 1"})["value"] == 1
    (exec_span,) = t.spans("codemode.exec")
    assert parent_id(exec_span) == turn.get_span_context().span_id


def test_exec_async_traces_its_calls_on_the_callers_loop(t: Traced):
    s = t.cm.session("async")
    code = "return Promise.all([tools.fetch({key: 'a'}), tools.fetch({key: 'b'})])"
    assert asyncio.run(s.exec_async({"code": code}))["value"] == ["A", "B"]
    (exec_span,) = t.spans("codemode.exec")
    calls = t.spans("codemode.tool_call")
    assert [parent_id(c) for c in calls] == [span_id(exec_span)] * 2
    assert exec_span.attributes["codemode.telemetry.tool_calls"] == 2


def test_a_suspended_run_gives_an_exec_and_a_wait_span_each_call_under_the_one_that_started_it(t: Traced):
    s = t.cm.session("suspended")
    code = "const first = await tools.slow({}); const second = await tools.fetch({key: first}); return second"
    waiting = s.exec({"code": '// @options: {"timeout_ms": 150}\n' + code})
    assert waiting["status"] == "waiting", waiting
    t.gate.set()
    done = s.wait({"runId": waiting["runId"]})
    assert done["status"] == "completed" and done["value"] == "SLOW", done
    (exec_span,) = t.spans("codemode.exec")
    (wait_span,) = t.spans("codemode.wait")
    calls = {c.attributes["codemode.tool_id"]: c for c in t.spans("codemode.tool_call")}
    # `slow` started under the exec and landed during the wait: still the exec's child.
    assert parent_id(calls["host:core:slow"]) == span_id(exec_span)
    assert parent_id(calls["host:core:fetch"]) == span_id(wait_span)
    assert exec_span.attributes["codemode.status"] == "waiting"
    assert exec_span.attributes["codemode.reason"] == "pending_tools"
    assert exec_span.attributes["codemode.pending_tool_calls"] == 1
    assert exec_span.attributes["codemode.run_id"] == waiting["runId"]
    assert wait_span.attributes["codemode.run_id"] == waiting["runId"]
    assert wait_span.attributes["codemode.status"] == "completed"
    assert wait_span.attributes["codemode.telemetry.tool_calls"] == done["telemetry"]["toolCalls"]


def test_a_failed_cell_is_an_error_span_with_its_code(t: Traced):
    s = t.cm.session("failing")
    assert s.exec({"code": ""})["code"] == "invalid_input"
    thrown = s.exec({"code": "throw new TypeError('no such thing')"})
    assert thrown["status"] == "failed" and "code" not in thrown
    invalid, threw = t.spans("codemode.exec")
    assert invalid.status.status_code is StatusCode.ERROR
    assert invalid.status.description == "invalid_input"
    assert invalid.attributes["codemode.error_code"] == "invalid_input"
    assert invalid.attributes["codemode.status"] == "failed"
    assert "codemode.run_id" not in invalid.attributes  # (refused before a run)
    assert threw.status.status_code is StatusCode.ERROR
    assert "codemode.error_code" not in threw.attributes
    assert "no such thing" not in str(threw.status.description)


def test_a_failed_tool_call_is_an_error_span_without_its_message(t: Traced):
    s = t.cm.session("broken")
    message = s.exec({"code": "try { await tools.broken({}) } catch (e) { return e.message }"})["value"]
    assert "the backend is down" in message
    (call,) = t.spans("codemode.tool_call")
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes["codemode.status"] == "error"
    assert "the backend is down" not in str(call.status.description) and not call.events


def test_no_span_carries_a_tool_input_a_result_an_error_text_or_a_yield(t: Traced):
    s = t.cm.session("secret")
    code = f"""
        const login = await tools.login({{user: "ann", token: "{SECRET}"}});
        console.log(login.session);
        throw new Error("leaked " + login.session);
    """
    result = s.exec({"code": code})
    assert result["status"] == "failed" and SECRET in result["error"]
    waiting = s.exec({"code": f'return await yield_control("{SECRET}")'})  # a yield's reason
    assert waiting["status"] == "waiting", waiting
    assert s.wait({"runId": waiting["runId"], "answer": SECRET})["value"] == SECRET  # and its answer
    spans = t.spans()
    assert {s.name for s in spans} == {"codemode.exec", "codemode.wait", "codemode.tool_call"}
    for span in spans:
        shown = json.dumps(
            [
                span.name,
                dict(span.attributes or {}),
                span.status.description,
                [(e.name, dict(e.attributes or {})) for e in span.events],
                [dict(link.attributes or {}) for link in span.links],
            ],
            default=str,
        )
        assert SECRET not in shown and "ann" not in shown


def test_a_call_held_for_approval_is_a_deferred_span_then_one_under_the_wait_that_decides_it(make_codemode):
    exporter, provider = in_memory()
    cm = make_codemode({"workers": 1}, require_approval=["deploy"], tracer_provider=provider)

    @cm.tool
    def deploy(env: str) -> str:
        return f"deployed {env}"

    s = cm.session("approvals")
    code = (
        "const calls = [tools.deploy({env: 'prod'}), tools.deploy({env: 'dev'})];"
        "return (await Promise.allSettled(calls)).map(r => r.status)"
    )
    waiting = s.exec({"code": code})
    assert waiting["status"] == "waiting", waiting
    prod, dev = sorted(s.pending_approvals(), key=lambda r: r.call_id)
    s.approve(prod.run_id, prod.call_id, True)
    s.approve(dev.run_id, dev.call_id, False, reason="not today")
    assert s.wait({"runId": waiting["runId"]})["value"] == ["fulfilled", "rejected"]
    spans = exporter.get_finished_spans()
    (exec_span,) = [x for x in spans if x.name == "codemode.exec"]
    (wait_span,) = [x for x in spans if x.name == "codemode.wait"]
    calls = [
        (c.attributes["codemode.call_id"], c.attributes["codemode.status"], parent_id(c))
        for c in spans
        if c.name == "codemode.tool_call"
    ]
    assert sorted(calls) == [
        (1, "deferred", span_id(exec_span)),
        (1, "ok", span_id(wait_span)),
        (2, "deferred", span_id(exec_span)),
        (2, "error", span_id(wait_span)),
    ]


def test_an_mcp_tool_call_is_a_child_span_of_its_exec(make_codemode):
    exporter, provider = in_memory()
    server = {"command": sys.executable, "args": [str(TESTS / "mcp_named_server.py"), "lookup"]}
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": {"named": server}}, tracer_provider=provider)
    result = cm.session("mcp").exec({"code": "return (await MCP.named.lookup({})).content[0].text"})
    assert result["value"] == "lookup", result
    spans = exporter.get_finished_spans()
    (exec_span,) = [x for x in spans if x.name == "codemode.exec"]
    (call,) = [x for x in spans if x.name == "codemode.tool_call"]
    assert call.attributes["codemode.tool_id"] == "mcp:named:lookup"
    assert call.attributes["codemode.status"] == "ok"
    assert parent_id(call) == span_id(exec_span)
    assert exec_span.attributes["codemode.telemetry.catalog_sources.mcp"] == 1


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60, check=False
    )


def test_without_opentelemetry_exec_runs_and_nothing_is_wrapped():
    proc = run_script(
        """
        import sys
        sys.modules["opentelemetry"] = None  # `import opentelemetry` now raises ImportError
        from codemode import CodeMode, tracing
        from codemode.session import CodeMode as Host
        assert not tracing.ENABLED and tracing.tracer() is None
        assert not hasattr(Host._exec, "__wrapped__") and not hasattr(Host._wait_async, "__wrapped__")
        with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
            @cm.tool
            def add(a: int, b: int) -> int:
                return a + b
            print(cm.session().exec({"code": "return await tools.add({a: 2, b: 3})"})["value"])
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "5"


def test_the_global_provider_is_followed_when_none_is_given():
    proc = run_script(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from codemode import CodeMode

        exporter = InMemorySpanExporter()
        with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:  # made before the provider is set
            @cm.tool
            def add(a: int, b: int) -> int:
                return a + b
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            cm.session().exec({"code": "return await tools.add({a: 2, b: 3})"})
        print(sorted(s.name for s in exporter.get_finished_spans()))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['codemode.exec', 'codemode.tool_call']"
