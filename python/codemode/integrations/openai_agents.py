"""The OpenAI Agents SDK (``openai-agents``): a surface's tools as ``agents.FunctionTool``\\s.

    agent = Agent(name="assistant", tools=function_tools(cm.session("conversation-42")))

The SDK makes a tool's schema strict unless told otherwise, rewriting it so every property is
required and refusing open objects (``tool_call``'s ``args``): a tool is strict here exactly when
its schema already is (`strict_problem`), so ``exec``'s schema reaches the model as written and
no schema is rewritten. The SDK hands a call's arguments over as the model's JSON text: text that
is not a JSON object is answered as an invalid input, never raised into the run.
"""

from __future__ import annotations

from typing import Any

import msgspec
from agents import FunctionTool, ToolOutputImage, ToolOutputText
from agents.tool_context import ToolContext

from ..rendering import Rendered, render
from ..session import Session
from ..surfaces import ModelTool, Surface, strict_problem

__all__ = ["function_tools"]


def function_tools(session: Session, surface: Surface = "code", *, telemetry: bool = False) -> list[FunctionTool]:
    """The ``surface``'s tools for an ``agents.Agent``, each call run in ``session``
    (``telemetry=True``: the results carry their telemetry)."""
    return [_function_tool(session, tool, telemetry) for tool in session.model_tools(surface)]


def _function_tool(session: Session, tool: ModelTool, telemetry: bool) -> FunctionTool:
    async def invoke(ctx: ToolContext[Any], arguments: str) -> str | list[ToolOutputText | ToolOutputImage]:
        try:
            args = msgspec.json.decode(arguments or "{}")
        except msgspec.DecodeError as e:
            args = e
        if not isinstance(args, dict):
            refused = {"status": "failed", "error": f"{tool.name} takes a JSON object", "code": "invalid_input"}
            return render(refused).text
        return _output(render(await session.handle_async(tool.name, args), telemetry=telemetry))

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=tool.input_schema,
        on_invoke_tool=invoke,
        strict_json_schema=strict_problem(tool.input_schema) is None,
    )


def _output(rendered: Rendered) -> str | list[ToolOutputText | ToolOutputImage]:
    if not rendered.images:
        return rendered.text
    return [ToolOutputText(text=rendered.text), *(ToolOutputImage(image_url=i.data_url) for i in rendered.images)]
