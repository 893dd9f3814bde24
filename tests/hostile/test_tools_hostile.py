"""Hostile values and hostile tools at the host's tool boundary (issue 15: items 1, 5, 6, 12, 16).

A guest value (or a compromised worker's) that reaches the host fails its own call, whatever
decoding, mapping or checking it does; a tool can only fail its own call, whatever it raises or
returns; inputs are checked against the tool's schema before it runs; one tool's catalog text
cannot fail every exec. After each, the next exec, and an async tool in another session, still
complete.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
from codemode import CodeMode, ToolDefinitionError
from codemode import workers as codemode_workers
from codemode.catalog import MAX_DESCRIPTION_CHARS, MAX_LABEL_CHARS, compile_input_validator
from codemode.dispatch import Dispatcher
from codemode.protocol import CallResult, Report
from codemode.tools import MAX_BRIDGE_BYTES, MAX_ERROR_CHARS, define_tool

ODD_SERVER = str(Path(__file__).resolve().parents[1] / "fixtures" / "odd_mcp_server.py")
#: A guest value nested past any decoder's recursion limit, as JSON text.
DEEP_JSON = "[" * 100_000 + "]" * 100_000
#: What a compromised worker's tampering replaces with `DEEP_JSON` in a call's input.
MARK = '"__deep__"'
OVER_BRIDGE = f"tool result is larger than the bridge limit ({MAX_BRIDGE_BYTES} bytes)"


class Claim(msgspec.Struct):
    id: str
    paid: bool


class Calls:
    """Counts the tool invocations a test must not see."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            self.count += 1


class UnreadableMessage(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class NotAStr(Exception):
    def __str__(self) -> Any:
        return 42


class _LyingName(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise SystemExit("the name is a trap")


class NamedLikeATrap(Exception, metaclass=_LyingName):
    pass


@pytest.fixture(scope="module")
def calls() -> Calls:
    return Calls()


@pytest.fixture(scope="module")
def tcm(calls: Calls):
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as cm:
        install_tools(cm, calls)
        yield cm


def install_tools(cm: CodeMode, calls: Calls) -> None:
    @cm.tool
    def echo(value: Any = None) -> Any:
        return value

    @cm.tool
    async def echo_async(value: Any = None) -> Any:
        return value

    @cm.tool
    async def ping_async() -> str:
        await asyncio.sleep(0)
        return "pong"

    @cm.tool
    def add(a: int, b: int) -> int:
        calls.hit()
        return a + b

    @cm.tool
    async def add_async(a: int, b: int) -> int:
        calls.hit()
        return a + b

    @cm.tool
    def square(n: int) -> int:
        calls.hit()
        return n * n

    @cm.tool
    def count(n: Annotated[int, msgspec.Meta(ge=0)], tags: list[str] = []) -> int:  # noqa: B006
        calls.hit()
        return n + len(tags)

    @cm.tool
    def settle(claim: Claim) -> bool:
        calls.hit()
        return True

    @cm.tool
    def kw_only(*, n: int) -> int:
        calls.hit()
        return n

    @cm.tool
    def spread(*values: Any) -> int:
        return len(values)

    cm.add_tool(
        lambda **kw: calls.hit() or kw,
        name="schema_tool",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}, "tag": {"type": "string", "maxLength": 3}},
            "required": ["n"],
        },
    )

    def raiser(name: str, exc: BaseException, is_async: bool) -> None:
        if is_async:

            async def tool() -> None:
                await asyncio.sleep(0)
                raise exc

        else:

            def tool() -> None:
                raise exc

        cm.add_tool(tool, name=name)

    raiser("sync_exit", SystemExit(3), False)
    raiser("sync_interrupt", KeyboardInterrupt(), False)
    raiser("sync_generator_exit", GeneratorExit(), False)
    raiser("sync_cancelled", asyncio.CancelledError(), False)
    raiser("sync_unreadable", UnreadableMessage(), False)
    raiser("sync_not_a_str", NotAStr(), False)
    raiser("sync_trap_name", NamedLikeATrap("x"), False)
    raiser("sync_surrogate", ValueError("bad \ud800 half"), False)
    raiser("async_exit", SystemExit(3), True)
    raiser("async_interrupt", KeyboardInterrupt(), True)
    raiser("async_cancelled", asyncio.CancelledError(), True)
    raiser("async_unreadable", UnreadableMessage(), True)

    @cm.tool
    async def async_inner_cancelled() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner

    @cm.tool
    async def async_cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    @cm.tool
    async def async_exit_from_callback() -> str:
        asyncio.get_running_loop().call_soon(sys.exit, 4)
        return "scheduled"

    @cm.tool
    async def async_stops_loop() -> str:
        asyncio.get_running_loop().stop()
        return "stopped"

    @cm.tool
    def huge_error() -> None:
        raise ValueError("x" * (70 << 20))

    @cm.tool
    async def huge_error_async() -> None:
        raise ValueError("y" * (70 << 20))

    @cm.tool
    def huge_result() -> str:
        return "z" * (65 << 20)  # over the 64 MiB frame cap on its own

    @cm.tool
    async def huge_result_async() -> str:
        return "z" * (65 << 20)

    @cm.tool
    def wide_result() -> str:
        return "é" * ((MAX_BRIDGE_BYTES // 2) + 16)  # under the limit in characters, over in bytes


def caught(session: Any, call: str) -> str:
    """The message of the error ``call`` throws in the guest (the cell itself completes)."""
    code = f"try {{ await {call}; return 'no throw' }} catch (e) {{ return String(e.message) }}"
    result = session.exec({"code": code})
    assert result["status"] == "completed", result
    return str(result["value"])


def assert_still_serves(cm: CodeMode) -> None:
    """A plain cell and an async tool in a session of their own both complete."""
    other = cm.session(f"other-{threading.get_ident()}-{id(cm)}")
    assert other.exec({"code": "return 40 + 2"})["value"] == 42
    result = other.exec({"code": "return await tools.ping_async()"})
    assert result["status"] == "completed", result
    assert result["value"] == "pong"


def tamper_calls(monkeypatch: pytest.MonkeyPatch, replacement: str = DEEP_JSON) -> None:
    """Plays a compromised worker: `MARK` in a call's input JSON becomes ``replacement``."""
    real_take = codemode_workers.WorkerProcess.take

    def change(frame: Any) -> Any:
        if isinstance(frame, Report) and any(MARK in call[2] for call in frame.calls):
            calls = [(i, tool, text.replace(MARK, replacement), method) for i, tool, text, method in frame.calls]
            frame = msgspec.structs.replace(frame, calls=calls)
        return frame

    def take(self: Any, timeout_s: float, spin: bool = False) -> Any:
        spoke, frames = real_take(self, timeout_s, spin)
        return spoke, None if frames is None else [change(frame) for frame in frames]

    monkeypatch.setattr(codemode_workers.WorkerProcess, "take", take)


# ---- item 1: every guest value is decoded and planned under one guard ---------------------------------


@pytest.mark.parametrize("tool", ["echo", "echo_async", "add", "settle"])
def test_a_deep_input_from_a_compromised_worker_fails_only_its_call(tcm, monkeypatch, tool):
    tamper_calls(monkeypatch)
    s = tcm.session("deep")
    assert caught(s, f"tools.{tool}({{value: {MARK}}})") == f"tool host:core:{tool}: input is nested too deeply"
    assert_still_serves(tcm)


def test_a_deep_input_after_a_wait_fails_only_its_call(tcm, monkeypatch):
    tamper_calls(monkeypatch)
    s = tcm.session("deep-wait")
    code = (
        "await yield_control('first');"
        f"try {{ await tools.echo({{value: {MARK}}}); return 'no throw' }} catch (e) {{ return e.message }}"
    )
    first = s.exec({"code": code})
    assert first["status"] == "waiting", first
    done = s.wait({"runId": first["runId"]})
    assert done["status"] == "completed", done
    assert done["value"] == "tool host:core:echo: input is nested too deeply"
    assert_still_serves(tcm)


def test_a_deep_guest_value_fails_its_call_or_is_refused_in_the_guest(tcm):
    s = tcm.session("deep-guest")
    deep = "let v = 1; for (let i = 0; i < 2000; i++) v = [v];"
    for tool in ("echo", "echo_async", "add"):
        code = f"{deep} try {{ await tools.{tool}({{value: v}}); return 'ran' }} catch (e) {{ return e.message }}"
        result = s.exec({"code": code})
        assert result["status"] == "completed", result
        message = result["value"].lower()
        assert "nest" in message or "deep" in message, result  # the host's guard, or the engine's limit
    assert_still_serves(tcm)


def test_a_namespace_call_whose_mapper_raises_or_whose_input_is_deep_fails_only_itself(make_codemode, monkeypatch):
    from codemode.namespaces import NamespaceRegistration, namespace_tool

    cm = make_codemode({"workers": 1})

    @cm.tool(owner="plug")
    def lookup(key: str = "") -> str:
        return key

    @cm.tool
    async def ping_async() -> str:
        return "pong"

    def interrupt(args: list[Any]) -> Any:
        raise KeyboardInterrupt

    def exits(args: list[Any]) -> Any:
        raise SystemExit(2)

    scope = {
        "interrupt": namespace_tool("lookup", interrupt),
        "exits": namespace_tool("lookup", exits),
        "find": namespace_tool("lookup"),
    }
    cm.register_namespace(
        "plug",
        NamespaceRegistration(
            id="plug-ns",
            global_name="Plug",
            description="test",
            required_tool_names=("lookup",),
            create_scope=lambda ctx: scope,
        ),
    )
    s = cm.session("ns")
    assert caught(s, "Plug.interrupt(1)") == "tool namespace failed: KeyboardInterrupt"
    assert caught(s, "Plug.exits(1)") == "tool namespace failed: SystemExit: 2"
    tamper_calls(monkeypatch)
    assert caught(s, f"Plug.find({MARK})") == "namespace call: input is nested too deeply"
    assert_still_serves(cm)


def test_hooks_and_approvals_that_raise_base_exceptions_fail_only_their_call(make_codemode):
    def hook(event: Any) -> None:
        if event.name == "add":
            raise KeyboardInterrupt
        return None

    def approve(event: Any) -> bool:
        if event.name == "square":
            raise SystemExit(5)
        return True

    calls = Calls()
    cm = make_codemode({"workers": 1}, before_tool_call=hook, approve=approve)
    install_tools(cm, calls)
    s = cm.session("hooks")
    assert caught(s, "tools.add({a: 1, b: 2})") == "tool host:core:add failed: KeyboardInterrupt"
    assert caught(s, "tools.square({n: 2})") == "tool host:core:square failed: SystemExit: 5"
    assert calls.count == 0
    assert_still_serves(cm)


# ---- item 6: a tool can only fail its own call --------------------------------------------------------

FAILURES = {
    "sync_exit": "tool host:core:sync_exit failed: SystemExit: 3",
    "sync_interrupt": "tool host:core:sync_interrupt failed: KeyboardInterrupt",
    "sync_generator_exit": "tool host:core:sync_generator_exit failed: GeneratorExit",
    "sync_cancelled": "tool host:core:sync_cancelled failed: CancelledError",
    "sync_unreadable": "tool host:core:sync_unreadable failed: UnreadableMessage: (its message could not be read)",
    "sync_not_a_str": "tool host:core:sync_not_a_str failed: NotAStr: (its message could not be read)",
    "sync_trap_name": "tool host:core:sync_trap_name failed: NamedLikeATrap: x",
    "sync_surrogate": "tool host:core:sync_surrogate failed: ValueError: bad ? half",
    "async_exit": "tool host:core:async_exit failed: SystemExit: 3",
    "async_interrupt": "tool host:core:async_interrupt failed: KeyboardInterrupt",
    "async_cancelled": "tool host:core:async_cancelled failed: CancelledError",
    "async_inner_cancelled": "tool host:core:async_inner_cancelled failed: CancelledError",
    "async_cancels_itself": "tool host:core:async_cancels_itself failed: CancelledError",
    "async_unreadable": "tool host:core:async_unreadable failed: UnreadableMessage: (its message could not be read)",
}


@pytest.mark.parametrize("tool", FAILURES)
def test_a_tool_raising_anything_fails_only_its_own_call(tcm, tool):
    s = tcm.session("bad-tools")
    assert caught(s, f"tools.{tool}()") == FAILURES[tool]
    assert_still_serves(tcm)


@pytest.mark.parametrize("tool", ["async_exit", "async_interrupt", "async_cancelled", "sync_exit"])
def test_a_tool_raising_anything_under_exec_async_fails_only_its_own_call(tcm, tool):
    s = tcm.session("bad-tools-async")
    code = f"try {{ await tools.{tool}(); return 'no throw' }} catch (e) {{ return e.message }}"

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        first = await s.exec_async({"code": code})
        return first, await s.exec_async({"code": "return await tools.ping_async()"})

    first, after = asyncio.run(main())
    assert (first["status"], first["value"]) == ("completed", FAILURES[tool])
    assert (after["status"], after["value"]) == ("completed", "pong")
    assert_still_serves(tcm)


def test_a_callback_that_raises_system_exit_out_of_the_tools_loop_does_not_end_it(tcm):
    s = tcm.session("loop-killers")
    assert s.exec({"code": "return await tools.async_exit_from_callback()"})["value"] == "scheduled"
    assert_still_serves(tcm)
    assert s.exec({"code": "return await tools.async_stops_loop()"})["value"] == "stopped"
    assert_still_serves(tcm)


# ---- item 5 (host side): an oversized result or error fails its own call -----------------------------


@pytest.mark.parametrize("tool", ["huge_error", "huge_error_async"])
def test_a_70_mb_error_message_is_cut_and_fails_only_its_call(tcm, tool):
    s = tcm.session("huge")
    message = caught(s, f"tools.{tool}()")
    assert len(message) == MAX_ERROR_CHARS, len(message)
    assert message.startswith(f"tool host:core:{tool} failed: ValueError: ")
    assert message.endswith("more characters cut]")
    assert_still_serves(tcm)


@pytest.mark.parametrize("tool", ["huge_result", "huge_result_async", "wide_result"])
def test_a_result_over_the_bridge_limit_fails_only_its_call(tcm, tool):
    s = tcm.session("huge")
    assert caught(s, f"tools.{tool}()") == OVER_BRIDGE
    assert_still_serves(tcm)


def test_ready_results_are_sized_in_bytes_and_taken_within_a_budget(tcm):
    dispatcher = Dispatcher(tcm.catalog(), asyncio.new_event_loop)
    dispatcher.add_ready(
        [CallResult(1, True, '"é"'), CallResult(2, True, "1" * 10), CallResult(3, False, "e" * (MAX_ERROR_CHARS * 2))]
    )
    cut = dispatcher.ready_bytes() - 4 - 10  # (the cut's marker holds a 3-byte "…")
    assert cut == MAX_ERROR_CHARS + 2
    assert [r.call_id for r in dispatcher.take_ready(max_bytes=3)] == [1]  # at least one
    assert [r.call_id for r in dispatcher.take_ready(max_bytes=10)] == [2]
    (rest,) = dispatcher.take_ready()
    assert rest.call_id == 3 and len(rest.payload) == MAX_ERROR_CHARS and len(rest.payload.encode()) == cut
    dispatcher.add_ready([CallResult(4, True, "x" * (MAX_BRIDGE_BYTES + 1))])
    assert dispatcher.take_ready() == [CallResult(4, False, OVER_BRIDGE)]


# ---- item 12: tool inputs are checked against the tool's schema ---------------------------------------

INVALID = [
    ("add", "{a: 'x', b: 2}", '$.a: expected int, got str "x"'),
    ("add", "{a: {}, b: 2}", "$.a: expected int, got object"),
    ("add", "{a: [1], b: 2}", "$.a: expected int, got array"),
    ("add", "{a: null, b: 2}", "$.a: expected int, got null"),
    ("add", "{a: true, b: 2}", "$.a: expected int, got bool true"),
    ("add", "{a: 1.5, b: 2}", "$.a: expected int, got float 1.5"),
    ("add", "{a: 1}", "$: object missing required field b"),
    ("add", "{a: 1, b: 2, c: 3}", '$: object contains unknown field "c"'),
    ("add_async", "{a: 'x', b: 2}", '$.a: expected int, got str "x"'),
    ("square", "'seven'", '$.n: expected int, got str "seven"'),
    ("kw_only", "7", "$: expected object, got int 7"),
    ("count", "{n: -1}", "$.n: expected int >= 0"),
    ("count", "{n: 1, tags: ['a', 2]}", "$.tags[1]: expected str, got int 2"),
    ("settle", "{claim: {id: 1, paid: true}}", "$.claim.id: expected str, got int 1"),
    ("settle", "{claim: {id: 'c1'}}", "$.claim: object missing required field paid"),
    ("schema_tool", "{n: 'x'}", '$.n: expected integer, got str "x"'),
    ("schema_tool", "{}", "$: object missing required field n"),
    ("schema_tool", "{n: 1, tag: 'long'}", "$.tag: violates maxLength 3"),
]


@pytest.mark.parametrize(("tool", "args", "problem"), INVALID, ids=[f"{t}-{a}" for t, a, _ in INVALID])
def test_an_input_that_breaks_the_tool_schema_fails_before_the_tool_runs(tcm, calls, tool, args, problem):
    s = tcm.session("inputs")
    before = calls.count
    message = caught(s, f"tools.{tool}({args})")
    assert message.partition(". It takes ")[0] == f"invalid input for tool host:core:{tool}: {problem}"
    assert calls.count == before
    assert_still_serves(tcm)


def test_valid_inputs_still_reach_their_tools(tcm):
    s = tcm.session("inputs")
    code = (
        "return [await tools.add({a: 1, b: 2}), await tools.square(3), await tools.count({n: 1, tags: ['a']}),"
        " await tools.settle({claim: {id: 'c', paid: false}}), await tools.spread(5), await tools.echo('as is'),"
        " (await tools.schema_tool({n: 1, tag: 'ok'})).n]"
    )
    result = s.exec({"code": code})
    assert result["status"] == "completed", result
    assert result["value"] == [3, 9, 2, True, 1, "as is", 1]


def test_an_invalid_input_never_reaches_the_hook_or_the_approval(make_codemode):
    seen: list[str] = []
    cm = make_codemode({"workers": 1}, before_tool_call=lambda e: seen.append(e.name), approve=lambda e: True)
    calls = Calls()
    install_tools(cm, calls)
    s = cm.session("gate")
    assert caught(s, "tools.add({a: 'x', b: 1})").startswith(
        'invalid input for tool host:core:add: $.a: expected int, got str "x"'
    )
    assert (seen, calls.count) == ([], 0)
    assert s.exec({"code": "return await tools.add({a: 1, b: 1})"})["value"] == 2
    assert seen == ["add"]


def test_mcp_tool_and_prompt_inputs_are_checked_before_they_reach_the_server(make_codemode, monkeypatch):
    servers = {"odd": {"command": sys.executable, "args": [ODD_SERVER]}}
    cm = make_codemode({"workers": 1, "timeoutMs": 20_000, "mcpServers": servers})
    assert cm.load_mcp_tools() == {"odd": None}
    s = cm.session("mcp")
    message = caught(s, "MCP.odd.getSum({a: 'one', b: 2})")
    assert message == 'invalid input for tool mcp:odd:get.sum: $.a: expected integer, got str "one"'
    prompt = caught(s, "MCP.odd.prompts.get({name: 'brief', arguments: {topic: [1]}})")
    assert prompt == "invalid input for MCP.odd.prompts.get: $.arguments[...]: expected str, got array"
    read = caught(s, "MCP.odd.resources.read({})")
    assert read == "invalid input for MCP.odd.resources.read: $: object missing required field uri"
    ok = s.exec({"code": "return (await MCP.odd.getSum({a: 1, b: 2})).content[0].text"})
    assert ok["value"] == "3", ok
    tamper_calls(monkeypatch)
    deep = caught(s, f"MCP.odd.prompts.get({{name: 'brief', arguments: {{topic: {MARK}}}}})")
    assert deep == "MCP call: input is nested too deeply"
    assert s.exec({"code": "return 40 + 2"})["value"] == 42


def test_an_untrusted_schema_drops_its_patterns_and_is_not_compiled_when_too_big():
    redos = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    check = compile_input_validator(redos, trusted=False)
    assert check is not None
    assert check({"s": "a" * 64 + "!"}) is None  # the pattern is not run (it would backtrack for ages)
    assert check({"s": 1}) == "$.s: expected string, got int 1"
    keyed = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}}, "additionalProperties": False}
    check = compile_input_validator(keyed, trusted=False)
    assert check is not None and check({"b": 1}) is None  # not checked in the host at all
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(200)}}
    check = compile_input_validator(big, trusted=False)
    assert check is not None and check({"p1": 1}) is None
    remote = {"$ref": "http://127.0.0.1:9/schema.json"}
    check = compile_input_validator(remote, trusted=False)
    assert check is not None and check(1) is None


def test_a_host_tool_with_a_schema_that_cannot_compile_is_refused_at_registration(make_codemode):
    cm = make_codemode({"workers": 1})
    with pytest.raises(ToolDefinitionError, match=r"tool bad: invalid input schema"):
        cm.add_tool(lambda **kw: kw, name="bad", input_schema={"type": "object", "properties": {"n": {"type": 7}}})


# ---- item 16: one tool's catalog text cannot fail every exec ------------------------------------------


def test_a_70_mb_description_and_label_are_cut_and_every_exec_still_works(make_codemode):
    cm = make_codemode({"workers": 1})
    cm.add_tool(lambda: 1, name="verbose", description="d" * (70 << 20), label="l" * (1 << 20))

    @cm.tool
    async def ping_async() -> str:
        return "pong"

    s = cm.session("verbose")
    described = s.exec({"code": "return await tools.describe('host:core:verbose')"})
    assert described["status"] == "completed", described
    entry = described["value"]
    assert len(entry["description"]) == MAX_DESCRIPTION_CHARS
    assert entry["description"].endswith("more characters cut]")
    assert len(entry["label"]) == MAX_LABEL_CHARS
    assert s.exec({"code": "return await tools.verbose()"})["value"] == 1
    assert len(cm.exec_description()) < 100_000
    assert_still_serves(cm)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 1000} for i in range(300)}},
        {"type": "object", "properties": {"deep": functools.reduce(lambda s, _: {"items": s}, range(70), {})}},
        functools.reduce(lambda s, _: {"not": s}, range(3000), {}),
    ],
    ids=["over_256_kib", "over_64_levels", "past_the_recursion_limit"],
)
def test_a_schema_the_catalog_cannot_carry_is_refused_for_host_tools_and_replaced_for_mcp_ones(make_codemode, schema):
    cm = make_codemode({"workers": 1})
    with pytest.raises(ToolDefinitionError, match=r"tool huge: its input schema cannot be catalogued: it is"):
        cm.add_tool(lambda **kw: kw, name="huge", input_schema=schema)
    client = cm.add_tool(lambda **kw: kw, name="huge", source="client", owner="app", input_schema=schema)
    assert client.input_schema is not None
    assert client.input_schema["description"].startswith("(schema left out of the catalog: it is")
    mcp = define_tool(lambda **kw: kw, name="huge", source="mcp", owner="srv", input_schema=schema)
    assert mcp.input_schema == client.input_schema

    @cm.tool
    async def ping_async() -> str:
        return "pong"

    s = cm.session("huge-schema")
    result = s.exec({"code": "return (await tools.callValue('client:app:huge', {n: 1})).n"})
    assert (result["status"], result["value"]) == ("completed", 1)
    assert_still_serves(cm)


def test_a_namespace_with_a_70_mb_description_or_a_huge_scope_cannot_fail_every_exec(make_codemode):
    from codemode.namespaces import MAX_SCOPE_BYTES, NamespaceRegistration, namespace_tool

    cm = make_codemode({"workers": 1})

    @cm.tool(owner="plug")
    def lookup(key: str = "") -> str:
        return key

    @cm.tool
    async def ping_async() -> str:
        return "pong"

    def registration(create_scope: Any, description: str = "looks up") -> NamespaceRegistration:
        return NamespaceRegistration(
            id="plug-ns",
            global_name="Plug",
            description=description,
            prompt="p" * (70 << 20),
            required_tool_names=("lookup",),
            create_scope=create_scope,
        )

    with pytest.raises(ToolDefinitionError, match=r"namespace 'plug-ns': its scope is \d+ bytes of JSON, over the"):
        cm.register_namespace("plug", registration(lambda ctx: {"blob": "b" * MAX_SCOPE_BYTES}))
    grows = [False]
    scope = {"find": namespace_tool("lookup")}
    cm.register_namespace(
        "plug",
        registration(lambda ctx: {**scope, "blob": "b" * MAX_SCOPE_BYTES} if grows[0] else scope, "d" * (70 << 20)),
    )
    assert len(cm.exec_description()) < 100_000
    s = cm.session("ns")
    assert s.exec({"code": "return await Plug.find('k')"})["value"] == "k"
    grows[0] = True  # too big at run time: hidden from the run, every exec goes on
    assert s.exec({"code": "return typeof Plug"})["value"] == "undefined"
    assert_still_serves(cm)
