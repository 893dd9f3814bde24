"""The LangChain adapter: a scripted chat model's tool calls run through ``bind_tools`` and the
tools' own ``ToolCall`` -> ``ToolMessage`` path, in the usual tool loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from codemode import CodeMode
from codemode.integrations.langchain import structured_tools
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool


class ScriptedChatModel(BaseChatModel):
    """Answers with ``script(messages)``; ``bind_tools`` binds the tools' OpenAI form, as a real
    chat model does, and the script sees it."""

    script: Callable[[list[BaseMessage], list[dict[str, Any]]], AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script(messages, kwargs.get("tools", [])))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)


@pytest.fixture(scope="module")
def cm() -> Any:
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="billing")
        def invoices_list(paid: bool | None = None) -> list[dict[str, Any]]:
            """List invoices with amount and paid flag."""
            return [{"id": "i-1", "amount": 120, "paid": False}, {"id": "i-2", "amount": 80, "paid": False}]

        yield cm


def call(name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{name}", "type": "tool_call"}])


def agent_loop(
    model: Runnable[Any, AIMessage], tools: dict[str, Any], question: str, *, sync: bool
) -> list[BaseMessage]:
    """The tool loop LangChain hosts write: call the model, run its tool calls, repeat."""
    messages: list[BaseMessage] = [HumanMessage(question)]
    while True:
        reply = model.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return messages
        for tool_call in reply.tool_calls:
            tool = tools[tool_call["name"]]
            messages.append(tool.invoke(tool_call) if sync else asyncio.run(tool.ainvoke(tool_call)))


def script(messages: list[BaseMessage], bound: list[dict[str, Any]]) -> AIMessage:
    assert [tool["function"]["name"] for tool in bound] == ["exec", "wait"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        cell = "await yield_control('confirm'); return (await tools.invoices_list({paid: false})).length"
        return call("exec", {"code": cell, "language": None, "restartSafe": None})
    last = json.loads(results[-1].content)  # type: ignore[arg-type]
    if last["status"] == "waiting":
        return call("wait", {"runId": last["runId"]})
    return AIMessage(content=f"{last['value']} unpaid")


@pytest.mark.parametrize("sync", [True, False], ids=["invoke", "ainvoke"])
def test_an_exec_that_waits_is_resumed_with_wait_through_the_tool_loop(cm, sync):
    tools = {tool.name: tool for tool in structured_tools(cm.session(f"langchain-{sync}"))}
    model = ScriptedChatModel(script=script).bind_tools(list(tools.values()))
    messages = agent_loop(model, tools, "How many invoices are unpaid?", sync=sync)
    assert messages[-1].content == "2 unpaid"
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.name, m.status) for m in results] == [("exec", "success"), ("wait", "success")]
    assert results[1].content == '{"status":"completed","value":2}'


def test_exec_is_bound_with_its_own_schema(cm):
    exec_tool = structured_tools(cm.session())[0]
    rendered = convert_to_openai_tool(exec_tool)["function"]
    assert rendered["parameters"]["required"] == ["code", "language", "restartSafe"]
    assert rendered["description"] == cm.exec_description()


def test_a_failed_cell_is_an_error_tool_message(cm):
    exec_tool = structured_tools(cm.session())[0]
    message = exec_tool.invoke(
        {"name": "exec", "args": {"code": "throw new Error('closed')"}, "id": "c1", "type": "tool_call"}
    )
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert json.loads(message.content) == {"status": "failed", "error": "Error: closed"}  # type: ignore[arg-type]


def test_the_readme_tool_loop_runs_an_exec_and_a_wait():
    from test_readme import run_example

    example = run_example("#### LangChain")
    cell = "await yield_control('look'); return (await tools.forecast({city: 'Oslo'})).sky"

    def weather(messages: list[BaseMessage], bound: list[dict[str, Any]]) -> AIMessage:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return call("exec", {"code": cell})
        last = json.loads(results[-1].content)  # type: ignore[arg-type]
        if last["status"] == "waiting":
            return call("wait", {"runId": last["runId"]})
        return AIMessage(content=last["value"])

    try:
        answered = example["answer"](ScriptedChatModel(script=weather), "Is it clear in Oslo?")  # type: ignore[operator]
    finally:
        example["cm"].close()  # type: ignore[attr-defined]
    assert answered == "clear"


def test_an_image_output_is_an_image_content_block(cm):
    png = "iVBORw0KGgoAAAANSUhEUg=="
    exec_tool = structured_tools(cm.session())[0]
    cell = f"image('data:image/png;base64,{png}'); return 'drawn'"
    message = exec_tool.invoke({"name": "exec", "args": {"code": cell}, "id": "c1", "type": "tool_call"})
    text, image = message.content
    assert json.loads(text["text"])["value"] == "drawn"  # type: ignore[index]
    assert image == {"type": "image", "base64": png, "mime_type": "image/png"}
