"""``codemode serve``: codemode itself as an MCP server that exposes ``exec`` and ``wait``.

Any MCP client can then use code mode over the MCP servers it already has: the servers named
in the config file (``mcpServers``, the format MCP clients use) become the hidden catalog, plus
Python tools given with ``--tools module:attr``. Transports: stdio, and streamable HTTP bound to
localhost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer

from .errors import ConfigError
from .session import CodeMode, Session

__all__ = ["build_server", "load_servers_config"]


def load_servers_config(path: Path) -> dict[str, Any]:
    """Reads an MCP client config file: ``{"mcpServers": {...}}``, or VS Code's ``mcp.json``
    (``{"servers": {...}}``) when there is no ``mcpServers``; other keys are ignored."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read MCP config {path}: {e}") from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f"{path} has no `mcpServers` (or VS Code `servers`) object")
    return servers


def build_server(cm: CodeMode, session: Session) -> MCPServer:
    """An MCP server whose two tools run cells against ``cm``'s catalog in ``session``."""
    server = MCPServer(
        name="codemode",
        instructions="Code mode: write a short JavaScript/TypeScript cell with `exec`; resume it with `wait`.",
    )

    async def exec(
        code: str, language: Literal["javascript", "typescript"] = "javascript", restartSafe: bool = False
    ) -> dict[str, Any]:
        return await session.exec_async({"code": code, "language": language, "restartSafe": restartSafe})

    async def wait(runId: str) -> dict[str, Any]:
        return await session.wait_async({"runId": runId})

    server.add_tool(exec, name="exec", description=cm.exec_description(), structured_output=False)
    server.add_tool(
        wait,
        name="wait",
        description="Resume a code mode run that returned `waiting`: pass its runId. Same result shape as exec.",
        structured_output=False,
    )
    return server
