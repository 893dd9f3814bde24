"""codemode: two tools (``exec``, ``wait``) over a hidden tool catalog, run in QuickJS workers.

    with CodeMode() as cm:
        @cm.tool
        def add(a: int, b: int) -> int:
            return a + b
        print(cm.session().exec({"code": "return await tools.add({a: 1, b: 2})"}))
"""

from .config import CodeModeConfig, load_config
from .errors import (
    ClosedError,
    CodemodeError,
    ConfigError,
    ProtocolError,
    ToolDefinitionError,
    WorkerCrashed,
    WorkerUnavailable,
)
from .session import CodeMode, Completed, Failed, JsonOutput, Result, Session, Telemetry, TextOutput
from .tools import Tool

__all__ = [
    "ClosedError",
    "CodeMode",
    "CodeModeConfig",
    "CodemodeError",
    "Completed",
    "ConfigError",
    "Failed",
    "JsonOutput",
    "ProtocolError",
    "Result",
    "Session",
    "Telemetry",
    "TextOutput",
    "Tool",
    "ToolDefinitionError",
    "WorkerCrashed",
    "WorkerUnavailable",
    "load_config",
]
