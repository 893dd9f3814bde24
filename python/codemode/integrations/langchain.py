"""LangChain (``langchain-core``): a surface's tools as ``StructuredTool``\\s.

    model = chat_model.bind_tools(structured_tools(session))
    # ... for each tool call the model makes: messages.append(await tools[call["name"]].ainvoke(call))

Each tool keeps the surface's JSON schema as its ``args_schema`` (LangChain passes the model's
arguments through unvalidated; `Session.handle` checks them) and runs sync (``invoke``, on the
calling thread) or async (``ainvoke``, on the caller's loop). A failed cell is a
``ToolException``, which the tool answers as a ``ToolMessage`` with ``status="error"``; a cell's
images are standard image content blocks beside the text.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import StructuredTool, ToolException

from ..rendering import Rendered, render
from ..session import Session
from ..surfaces import ModelTool, Surface

__all__ = ["structured_tools"]


def structured_tools(session: Session, surface: Surface = "code", *, telemetry: bool = False) -> list[StructuredTool]:
    """The ``surface``'s tools for a LangChain chat model's ``bind_tools`` and tool loop, each
    call run in ``session`` (``telemetry=True``: the results carry their telemetry)."""
    return [_tool(session, tool, telemetry) for tool in session.model_tools(surface)]


def _tool(session: Session, tool: ModelTool, telemetry: bool) -> StructuredTool:
    def run(**args: Any) -> str | list[str | dict[str, Any]]:
        return _content(render(session.handle(tool.name, args), telemetry=telemetry))

    async def arun(**args: Any) -> str | list[str | dict[str, Any]]:
        return _content(render(await session.handle_async(tool.name, args), telemetry=telemetry))

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=tool.name,
        description=tool.description,
        args_schema=tool.input_schema,
        infer_schema=False,
        handle_tool_error=True,
    )


def _content(rendered: Rendered) -> str | list[str | dict[str, Any]]:
    """The tool message's content; a failed call raises `ToolException` (an error message)."""
    if rendered.is_error:
        raise ToolException(rendered.text)
    if not rendered.images:
        return rendered.text
    images = [{"type": "image", "base64": i.data, "mime_type": i.mime_type} for i in rendered.images]
    return [{"type": "text", "text": rendered.text}, *images]
