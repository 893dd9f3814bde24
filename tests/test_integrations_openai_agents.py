"""The OpenAI Agents SDK adapter, driven through the SDK's own run loop by a scripted model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from agents import Agent, FunctionTool, Model, ModelResponse, RunConfig, Runner, Usage
from codemode import CodeMode
from codemode.integrations.openai_agents import function_tools
from codemode.surfaces import EXEC_SCHEMA
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

#: One model turn: what the model has been given so far -> what it answers.
Turn = Callable[[list[Any]], Any]


class ScriptedModel(Model):
    """A model that answers each request with the next turn of a script: a tool call
    (``(name, arguments)``) or a final text. It keeps what it was sent."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.tools: list[Any] = []
        self.outputs: list[str] = []

    async def get_response(
        self, system_instructions: Any, input: Any, model_settings: Any, tools: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.tools = list(tools)
        items = input if isinstance(input, list) else []
        self.outputs = [
            item["output"] for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        answer = self.turns.pop(0)(self.outputs)
        if isinstance(answer, tuple):
            name, arguments = answer
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{len(self.turns)}", name=name, arguments=json.dumps(arguments)
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=answer, annotations=[])
        message = ResponseOutputMessage(type="message", id="msg", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@pytest.fixture(scope="module")
def cm() -> Any:
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="billing")
        def invoices_list(paid: bool | None = None) -> list[dict[str, Any]]:
            """List invoices with amount and paid flag."""
            return [{"id": "i-1", "amount": 120.0, "paid": False}, {"id": "i-2", "amount": 80.0, "paid": False}]

        yield cm


def run(cm: CodeMode, turns: list[Turn]) -> tuple[str, ScriptedModel]:
    model = ScriptedModel(turns)
    agent = Agent(name="assistant", model=model, tools=function_tools(cm.session("agents")))
    result = asyncio.run(Runner.run(agent, "What do we owe?", run_config=RunConfig(tracing_disabled=True)))
    return result.final_output, model


def test_an_exec_that_waits_is_resumed_with_wait_through_the_agents_run_loop(cm):
    cell = (
        "await yield_control('confirm');"
        " return (await tools.invoices_list({paid: false})).reduce((s, i) => s + i.amount, 0)"
    )
    final, model = run(
        cm,
        [
            # A strict-mode model sends every property, null for the ones it leaves out.
            lambda outputs: ("exec", {"code": cell, "language": None, "restartSafe": None}),
            lambda outputs: ("wait", {"runId": json.loads(outputs[-1])["runId"]}),
            lambda outputs: f"We owe {json.loads(outputs[-1])['value']}.",
        ],
    )
    assert final == "We owe 200."
    assert json.loads(model.outputs[0]) == {
        "status": "waiting",
        "runId": json.loads(model.outputs[0])["runId"],
        "reason": "yield",
    }
    assert model.outputs[1] == '{"status":"completed","value":200}'


def test_exec_keeps_its_schema_and_strict_mode_and_an_open_schema_is_not_made_strict(cm):
    by_name = {tool.name: tool for tool in function_tools(cm.session(), "tool_search")}
    code = {tool.name: tool for tool in function_tools(cm.session())}
    assert isinstance(code["exec"], FunctionTool)
    assert (code["exec"].strict_json_schema, code["exec"].params_json_schema) == (True, EXEC_SCHEMA)
    assert code["wait"].strict_json_schema is True
    assert by_name["tool_call"].strict_json_schema is False
    assert by_name["tool_call"].params_json_schema["properties"]["args"]["additionalProperties"] is True


def test_a_failed_cell_and_arguments_that_are_not_an_object_reach_the_model_as_results(cm):
    _, model = run(
        cm,
        [
            lambda outputs: (
                "exec",
                {"code": "throw new Error('no invoices today')", "language": None, "restartSafe": None},
            ),
            lambda outputs: "sorry",
        ],
    )
    assert json.loads(model.outputs[0]) == {"status": "failed", "error": "Error: no invoices today"}
    tool = function_tools(cm.session())[0]
    answered = asyncio.run(tool.on_invoke_tool(None, "[1, 2]"))  # type: ignore[arg-type]
    assert json.loads(answered) == {"status": "failed", "error": "exec takes a JSON object", "code": "invalid_input"}


def test_the_readme_agent_runs_an_exec_and_a_wait():
    from test_readme import run_example

    example = run_example("#### OpenAI Agents SDK")
    cell = "await yield_control('look'); return (await tools.forecast({city: 'Oslo'})).sky"
    model = ScriptedModel(
        [
            lambda outputs: ("exec", {"code": cell, "language": None, "restartSafe": None}),
            lambda outputs: ("wait", {"runId": json.loads(outputs[-1])["runId"]}),
            lambda outputs: json.loads(outputs[-1])["value"],
        ]
    )
    try:
        config = RunConfig(model=model, tracing_disabled=True)
        result = asyncio.run(Runner.run(example["agent"], "Is it clear in Oslo?", run_config=config))
    finally:
        example["cm"].close()  # type: ignore[attr-defined]
    assert result.final_output == "clear"


def test_an_image_output_reaches_the_model_as_an_input_image(cm):
    png = "iVBORw0KGgoAAAANSUhEUg=="
    cell = f"image('data:image/png;base64,{png}'); return 'drawn'"
    _, model = run(
        cm,
        [lambda outputs: ("exec", {"code": cell, "language": None, "restartSafe": None}), lambda outputs: "done"],
    )
    text, image = model.outputs[0]  # type: ignore[misc]
    assert json.loads(text["text"])["output"] == [{"type": "image", "mimeType": "image/png"}]
    assert image == {"type": "input_image", "image_url": f"data:image/png;base64,{png}"}
