"""A stdio MCP server whose tools have the names given on the command line.

Real servers name tools as the MCP spec allows (``[A-Za-z0-9_.-]``, a leading digit too), which
JavaScript identifiers do not; each tool returns its own name as text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from mcp.server.mcpserver import MCPServer


def answers(name: str) -> Callable[[], str]:
    def tool() -> str:
        return name

    return tool


def main(names: list[str]) -> None:
    server = MCPServer(name="named")
    for name in names:
        server.add_tool(answers(name), name=name, description=f"Answers {name}.")
    server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
