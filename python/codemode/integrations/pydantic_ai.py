"""pydantic-ai: a surface's tools as a ``FunctionToolset``.

    agent = Agent(model, toolsets=[toolset(cm.session("conversation-42"))])

The tools take the surface's JSON schemas as they are (``Tool.from_schema``: pydantic-ai does not
validate the arguments, `Session.handle_async` does), strict exactly when the schema is valid in
strict mode. A failed cell is a ``ToolFailed``: the model sees a failed tool result, and no retry
budget is spent (a cell that failed is an answer, not a malformed call). A cell's images go back
in the tool result as ``BinaryContent``.
"""

from __future__ import annotations

import binascii
from typing import Any

from pydantic_ai import BinaryContent, Tool, ToolFailed
from pydantic_ai.toolsets import FunctionToolset

from ..rendering import Image, render
from ..session import Session
from ..surfaces import ModelTool, Surface, strict_problem

__all__ = ["toolset"]


def toolset(session: Session, surface: Surface = "code", *, telemetry: bool = False) -> FunctionToolset[Any]:
    """The ``surface``'s tools for a pydantic-ai ``Agent``, each call run in ``session``
    (``telemetry=True``: the results carry their telemetry)."""
    return FunctionToolset([_tool(session, tool, telemetry) for tool in session.model_tools(surface)])


def _tool(session: Session, tool: ModelTool, telemetry: bool) -> Tool[Any]:
    async def call(**args: Any) -> str | list[str | BinaryContent]:
        rendered = render(await session.handle_async(tool.name, args), telemetry=telemetry)
        if rendered.is_error:
            raise ToolFailed(rendered.text)
        images = [image for image in map(_binary, rendered.images) if image is not None]
        return [rendered.text, *images] if images else rendered.text

    made: Tool[Any] = Tool.from_schema(
        call, name=tool.name, description=tool.description, json_schema=tool.input_schema
    )
    made.strict = strict_problem(tool.input_schema) is None
    return made


def _binary(image: Image) -> BinaryContent | None:
    """The image as pydantic-ai content; None if its base64 does not decode (the guest's)."""
    try:
        return BinaryContent.from_data_uri(image.data_url)
    except (ValueError, binascii.Error):
        return None
