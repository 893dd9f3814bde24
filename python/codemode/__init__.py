"""codemode: two tools (``exec``, ``wait``) over a hidden tool catalog, run in QuickJS workers.

    with CodeMode() as cm:
        @cm.tool
        def add(a: int, b: int) -> int:
            return a + b
        print(cm.session().exec({"code": "return await tools.add({a: 1, b: 2})"}))

The public names load on first use: ``import codemode`` (or of one of its modules, e.g.
``codemode.protocol``) does not pay for the host's modules (asyncio, the supervisor).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    __version__: str
    from .approvals import ApprovalRequest
    from .config import CodeModeConfig, load_config
    from .errors import (
        ApprovalError,
        BatchError,
        ClosedError,
        CodemodeError,
        ConfigError,
        McpServerError,
        McpTimeoutError,
        ProtocolError,
        StoreError,
        StoreLimitError,
        ToolDefinitionError,
        WorkerCrashed,
        WorkerUnavailable,
    )
    from .namespaces import NamespaceRegistration, ScopeContext, namespace_tool
    from .placement import Placement
    from .policy import Block, Defer, Rewrite, ToolCallEvent
    from .ray_placement import RayPlacement
    from .results import (
        CompletedResult,
        ExecResult,
        FailedResult,
        OutputItem,
        PendingToolCall,
        ResultTelemetry,
        WaitingResult,
    )
    from .session import CodeMode, Completed, Failed, JsonOutput, Result, Session, Telemetry, TextOutput, Waiting
    from .tools import Tool, ToolContext

_HOME = {
    "ApprovalRequest": "approvals",
    "CodeModeConfig": "config",
    "load_config": "config",
    "ApprovalError": "errors",
    "BatchError": "errors",
    "ClosedError": "errors",
    "CodemodeError": "errors",
    "ConfigError": "errors",
    "McpServerError": "errors",
    "McpTimeoutError": "errors",
    "StoreError": "errors",
    "StoreLimitError": "errors",
    "ProtocolError": "errors",
    "ToolDefinitionError": "errors",
    "WorkerCrashed": "errors",
    "WorkerUnavailable": "errors",
    "NamespaceRegistration": "namespaces",
    "ScopeContext": "namespaces",
    "namespace_tool": "namespaces",
    "CompletedResult": "results",
    "ExecResult": "results",
    "FailedResult": "results",
    "OutputItem": "results",
    "PendingToolCall": "results",
    "ResultTelemetry": "results",
    "WaitingResult": "results",
    "Block": "policy",
    "Defer": "policy",
    "Rewrite": "policy",
    "ToolCallEvent": "policy",
    "CodeMode": "session",
    "Completed": "session",
    "Failed": "session",
    "JsonOutput": "session",
    "Result": "session",
    "Session": "session",
    "Telemetry": "session",
    "TextOutput": "session",
    "Waiting": "session",
    "Tool": "tools",
    "ToolContext": "tools",
    "Placement": "placement",
    "RayPlacement": "ray_placement",
}

__all__ = [
    "ApprovalError",
    "ApprovalRequest",
    "BatchError",
    "Block",
    "ClosedError",
    "CodeMode",
    "CodeModeConfig",
    "CodemodeError",
    "Completed",
    "CompletedResult",
    "ConfigError",
    "Defer",
    "ExecResult",
    "Failed",
    "FailedResult",
    "JsonOutput",
    "McpServerError",
    "McpTimeoutError",
    "NamespaceRegistration",
    "OutputItem",
    "PendingToolCall",
    "Placement",
    "ProtocolError",
    "RayPlacement",
    "Result",
    "ResultTelemetry",
    "Rewrite",
    "ScopeContext",
    "Session",
    "StoreError",
    "StoreLimitError",
    "Telemetry",
    "TextOutput",
    "Tool",
    "ToolCallEvent",
    "ToolContext",
    "ToolDefinitionError",
    "Waiting",
    "WaitingResult",
    "WorkerCrashed",
    "WorkerUnavailable",
    "load_config",
    "namespace_tool",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'codemode' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def _version() -> str:
    """The installed distribution's version: pyproject.toml's ``version`` is the one source
    (importlib.metadata is read on first use, not at ``import codemode``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codemode")
    except PackageNotFoundError:  # (the sources on sys.path, never installed)
        return "0+unknown"


def __dir__() -> list[str]:
    return __all__
