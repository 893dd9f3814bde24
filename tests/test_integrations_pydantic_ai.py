"""The pydantic-ai adapter, driven through pydantic-ai's own agent loop by a ``FunctionModel``.

(``asyncio.run(agent.run(...))``, not ``run_sync``, which leaves its event loop open.)"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from codemode import CodeMode
from codemode.integrations.pydantic_ai import toolset
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


@pytest.fixture(scope="module")
def cm() -> Any:
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="billing")
        def invoices_list(paid: bool | None = None) -> list[dict[str, Any]]:
            """List invoices with amount and paid flag."""
            return [{"id": "i-1", "amount": 120, "paid": False}, {"id": "i-2", "amount": 80, "paid": False}]

        yield cm


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """The tool results the model has been sent, in order."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def test_an_exec_that_waits_is_resumed_with_wait_through_the_agent_loop(cm):
    cell = "await yield_control('confirm'); return (await tools.invoices_list({paid: false})).length"
    seen: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        done = returns(messages)
        if not done:
            return ModelResponse(parts=[ToolCallPart("exec", {"code": cell, "language": None, "restartSafe": None})])
        last = json.loads(done[-1].content)
        if last["status"] == "waiting":
            return ModelResponse(parts=[ToolCallPart("wait", {"runId": last["runId"]})])
        return ModelResponse(parts=[TextPart(f"{last['value']} unpaid")])

    agent = Agent(FunctionModel(model), toolsets=[toolset(cm.session("pydantic-ai"))])
    result = asyncio.run(agent.run("How many invoices are unpaid?"))
    assert result.output == "2 unpaid"
    assert [part.tool_name for part in returns(result.all_messages())] == ["exec", "wait"]
    tools = {tool.name: tool for tool in seen[0].function_tools}
    assert sorted(tools) == ["exec", "wait"]
    assert tools["exec"].strict is True
    assert tools["exec"].parameters_json_schema["required"] == ["code", "language", "restartSafe"]


def test_a_failed_cell_is_a_failed_tool_result_the_model_sees(cm):
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not returns(messages):
            return ModelResponse(parts=[ToolCallPart("exec", {"code": "throw new Error('ledger closed')"})])
        return ModelResponse(parts=[TextPart("sorry")])

    result = asyncio.run(Agent(FunctionModel(model), toolsets=[toolset(cm.session())]).run("Sum them"))
    failed = returns(result.all_messages())[0]
    assert failed.outcome == "failed"
    assert json.loads(failed.content) == {"status": "failed", "error": "Error: ledger closed"}


def test_the_readme_agent_runs_an_exec_and_a_wait():
    from test_readme import run_example

    example = run_example("#### pydantic-ai")
    cell = "await yield_control('look'); return (await tools.forecast({city: 'Oslo'})).sky"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        if not done:
            return ModelResponse(parts=[ToolCallPart("exec", {"code": cell})])
        last = json.loads(done[-1].content)
        if last["status"] == "waiting":
            return ModelResponse(parts=[ToolCallPart("wait", {"runId": last["runId"]})])
        return ModelResponse(parts=[TextPart(last["value"])])

    try:
        result = asyncio.run(example["agent"].run("Is it clear in Oslo?", model=FunctionModel(model)))  # type: ignore[attr-defined]
    finally:
        example["cm"].close()  # type: ignore[attr-defined]
    assert result.output == "clear"


def test_an_image_output_reaches_the_model_as_binary_content(cm):
    png = "iVBORw0KGgoAAAANSUhEUg=="
    cell = f"image('data:image/png;base64,{png}'); return 'drawn'"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not returns(messages):
            return ModelResponse(parts=[ToolCallPart("exec", {"code": cell})])
        return ModelResponse(parts=[TextPart("done")])

    result = asyncio.run(Agent(FunctionModel(model), toolsets=[toolset(cm.session())]).run("Draw"))
    text, image = returns(result.all_messages())[0].content
    assert json.loads(text)["output"] == [{"type": "image", "mimeType": "image/png"}]
    assert isinstance(image, BinaryContent)
    assert (image.media_type, image.data) == ("image/png", base64.b64decode(png))


def test_an_image_whose_base64_does_not_decode_is_left_out_and_the_text_arrives(cm):
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not returns(messages):
            return ModelResponse(
                parts=[ToolCallPart("exec", {"code": "image('data:image/png;base64,abcde'); return 1"})]
            )
        return ModelResponse(parts=[TextPart("done")])

    result = asyncio.run(Agent(FunctionModel(model), toolsets=[toolset(cm.session())]).run("Draw"))
    assert json.loads(returns(result.all_messages())[0].content)["value"] == 1
