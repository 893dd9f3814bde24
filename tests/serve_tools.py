"""Host tools for the ``codemode serve --tools module:attr`` tests, in both accepted forms."""

from __future__ import annotations

from codemode import CodeMode


def shipping_quote(tons: float) -> float:
    """Quote the cost of shipping a load, in euros."""
    return tons * 12.5


#: ``--tools serve_tools:TOOLS``: an iterable of functions, each becomes a tool.
TOOLS = [shipping_quote]


def register(cm: CodeMode) -> None:
    """``--tools serve_tools:register``: a callable that registers tools on the ``CodeMode``."""

    @cm.tool(owner="freight", description="The tariff zone of a port.")
    def tariff_zone(port: str) -> str:
        return f"zone of {port}: B"
