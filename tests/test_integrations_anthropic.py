"""The Anthropic adapter, driven by the SDK's tool runner against a scripted Messages API
(an ``httpx`` mock transport: the runner's own requests, no network)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, get_type_hints

import httpx2
import pytest
from anthropic import Anthropic, AsyncAnthropic
from anthropic.types import ToolParam
from codemode import CodeMode
from codemode.integrations.anthropic import async_runner_tools, runner_tools
from codemode.surfaces import SURFACES, to_anthropic
from pydantic import TypeAdapter

CELL = "await yield_control('confirm'); return (await tools.invoices_list({paid: false})).length"


def message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


class ScriptedMessages:
    """The Messages API as a script: exec, then wait on its runId, then the answer. It keeps
    the tools it was given and the tool results of the last request."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.first = first
        self.tools: list[Any] = []
        self.results: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        # Tools come with the request that creates the thread, not with those that continue it.
        self.tools = body.get("tools", self.tools)
        last = body["messages"][-1]["content"]
        self.results = [block for block in last if isinstance(block, dict) and block.get("type") == "tool_result"]
        if not self.results:
            answer = message([{"type": "tool_use", "id": "t1", "name": "exec", "input": self.first}], "tool_use")
        else:
            shown = json.loads(self.results[-1]["content"][0]["text"])
            if shown.get("status") == "waiting":
                use = {"type": "tool_use", "id": "t2", "name": "wait", "input": {"runId": shown["runId"]}}
                answer = message([use], "tool_use")
            else:
                answer = message([{"type": "text", "text": json.dumps(shown)}], "end_turn")
        return httpx2.Response(200, json=answer)


@pytest.fixture(scope="module")
def cm() -> Any:
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="billing")
        def invoices_list(paid: bool | None = None) -> list[dict[str, Any]]:
            """List invoices with amount and paid flag."""
            return [{"id": "i-1", "amount": 120, "paid": False}, {"id": "i-2", "amount": 80, "paid": False}]

        yield cm


def run(cm: CodeMode, first: dict[str, Any], *, sync: bool) -> tuple[str, ScriptedMessages]:
    api = ScriptedMessages(first)
    transport = httpx2.MockTransport(api)
    request = {"model": "claude-test", "max_tokens": 256, "messages": [{"role": "user", "content": "How many?"}]}
    session = cm.session(f"anthropic-{sync}")
    if sync:
        client = Anthropic(api_key="test", http_client=httpx2.Client(transport=transport))
        final = client.beta.messages.tool_runner(**request, tools=runner_tools(session)).until_done()
    else:

        async def until_done() -> Any:
            client = AsyncAnthropic(api_key="test", http_client=httpx2.AsyncClient(transport=transport))
            return await client.beta.messages.tool_runner(**request, tools=async_runner_tools(session)).until_done()

        final = asyncio.run(until_done())
    return final.content[0].text, api


@pytest.mark.parametrize("sync", [True, False], ids=["Anthropic", "AsyncAnthropic"])
def test_an_exec_that_waits_is_resumed_with_wait_through_the_tool_runner(cm, sync):
    final, api = run(cm, {"code": CELL}, sync=sync)
    assert json.loads(final) == {"status": "completed", "value": 2}
    assert [tool["name"] for tool in api.tools] == ["exec", "wait"]
    assert api.tools[0]["input_schema"]["required"] == ["code", "language", "restartSafe"]


@pytest.mark.parametrize("sync", [True, False], ids=["Anthropic", "AsyncAnthropic"])
def test_a_failed_cell_is_an_is_error_tool_result(cm, sync):
    final, api = run(cm, {"code": "throw new Error('closed')"}, sync=sync)
    assert json.loads(final) == {"status": "failed", "error": "Error: closed"}
    assert api.results[-1]["is_error"] is True


def test_the_readme_runner_runs_an_exec_and_a_wait():
    from test_readme import run_example

    example = run_example("#### Anthropic tool runner")
    cell = "await yield_control('look'); return (await tools.forecast({city: 'Oslo'})).sky"
    api = ScriptedMessages({"code": cell})
    client = Anthropic(api_key="test", http_client=httpx2.Client(transport=httpx2.MockTransport(api)))
    try:
        answered = example["answer"](client, "Is it clear in Oslo?")  # type: ignore[operator]
    finally:
        example["cm"].close()  # type: ignore[attr-defined]
    assert json.loads(answered) == {"status": "completed", "value": "clear"}
    assert [result["tool_use_id"] for result in api.results] == ["t2"]


def test_an_image_output_is_an_image_block_of_the_tool_result(cm):
    png = "iVBORw0KGgoAAAANSUhEUg=="
    _, api = run(cm, {"code": f"image('data:image/png;base64,{png}'); return 'drawn'"}, sync=True)
    text, image = api.results[-1]["content"]
    assert json.loads(text["text"])["value"] == "drawn"
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}


@pytest.mark.parametrize("surface", SURFACES)
def test_to_anthropic_tools_are_anthropic_tool_params(cm, surface):
    for tool in to_anthropic(cm.model_tools(surface)):
        TypeAdapter(ToolParam).validate_python(tool, strict=True)
        assert set(tool) <= set(get_type_hints(ToolParam))
