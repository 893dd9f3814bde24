"""Anthropic: a surface's tools for the SDK's tool runner (``client.beta.messages.tool_runner``).

    runner = client.beta.messages.tool_runner(model=..., max_tokens=1024, messages=[...],
                                              tools=runner_tools(cm.session("conversation-42")))
    final = runner.until_done()

`runner_tools` serves ``Anthropic`` (each call runs on the runner's thread, `Session.handle`),
`async_runner_tools` serves ``AsyncAnthropic`` (`Session.handle_async`, on the caller's loop).
A tool's definition is `codemode.surfaces.to_anthropic`'s; a failed cell is a ``ToolError``,
which the runner sends as an ``is_error`` tool result; a cell's images are image blocks.
"""

from __future__ import annotations

from typing import Any, cast

from anthropic.lib.tools import BetaAsyncBuiltinFunctionTool, BetaBuiltinFunctionTool, ToolError
from anthropic.types.beta import BetaToolParam

from ..rendering import Rendered, render
from ..session import Session
from ..surfaces import ModelTool, Surface, to_anthropic

__all__ = ["async_runner_tools", "runner_tools"]


def runner_tools(
    session: Session, surface: Surface = "code", *, telemetry: bool = False
) -> list[BetaBuiltinFunctionTool]:
    """The ``surface``'s tools for ``Anthropic().beta.messages.tool_runner``, each call run in
    ``session`` (``telemetry=True``: the results carry their telemetry)."""
    return [_Tool(session, tool, telemetry) for tool in session.model_tools(surface)]


def async_runner_tools(
    session: Session, surface: Surface = "code", *, telemetry: bool = False
) -> list[BetaAsyncBuiltinFunctionTool]:
    """`runner_tools` for ``AsyncAnthropic().beta.messages.tool_runner``."""
    return [_AsyncTool(session, tool, telemetry) for tool in session.model_tools(surface)]


class _Tool(BetaBuiltinFunctionTool):
    def __init__(self, session: Session, tool: ModelTool, telemetry: bool) -> None:
        self._session, self._tool, self._telemetry = session, tool, telemetry

    def to_dict(self) -> BetaToolParam:
        return _definition(self._tool)

    def call(self, input: object) -> list[Any]:
        args = input if isinstance(input, dict) else {}
        return _content(render(self._session.handle(self._tool.name, args), telemetry=self._telemetry))


class _AsyncTool(BetaAsyncBuiltinFunctionTool):
    def __init__(self, session: Session, tool: ModelTool, telemetry: bool) -> None:
        self._session, self._tool, self._telemetry = session, tool, telemetry

    def to_dict(self) -> BetaToolParam:
        return _definition(self._tool)

    async def call(self, input: object) -> list[Any]:
        args = input if isinstance(input, dict) else {}
        return _content(render(await self._session.handle_async(self._tool.name, args), telemetry=self._telemetry))


def _definition(tool: ModelTool) -> BetaToolParam:
    return cast(BetaToolParam, to_anthropic([tool])[0])


def _content(rendered: Rendered) -> list[Any]:
    """The tool result's blocks; a failed call raises them as a `ToolError` (``is_error``)."""
    images = [
        {"type": "image", "source": {"type": "base64", "media_type": i.mime_type, "data": i.data}}
        for i in rendered.images
    ]
    blocks: list[Any] = [{"type": "text", "text": rendered.text}, *images]
    if rendered.is_error:
        raise ToolError(blocks)
    return blocks
