"""The exception hierarchy for library misuse and infrastructure failures, all of it here.

A guest failure (the cell threw, timed out, ran out of memory) is *result data*: a ``failed``
result with a code. These exceptions are for the host's own mistakes and for infrastructure the
host must know about::

    CodemodeError
    ├── ConfigError (ValueError)          a config value of the wrong type, an unknown key
    ├── ToolDefinitionError (ValueError)  a tool that cannot be registered
    ├── ApprovalError (LookupError)       ``approve`` of a run or call that awaits no decision
    ├── BatchError (ValueError)           a batch's cells file or cell malformed, an id repeated
    ├── ClosedError                       a ``CodeMode`` or session used after ``close()``
    ├── ProtocolError                     a worker frame oversized, malformed or out of order
    ├── WorkerCrashed                     a worker ended while it held a run
    ├── WorkerUnavailable                 no worker (or no runtime in it) could be started
    ├── McpServerError                    an MCP server unreachable, or it failed a request
    │   └── McpTimeoutError               ... or did not answer within its timeout
    └── StoreError                        a store write malformed, or its database failed
        └── StoreLimitError               ... or a commit would break a size limit
"""

from __future__ import annotations

__all__ = [
    "ApprovalError",
    "BatchError",
    "ClosedError",
    "CodemodeError",
    "ConfigError",
    "McpServerError",
    "McpTimeoutError",
    "ProtocolError",
    "StoreError",
    "StoreLimitError",
    "ToolDefinitionError",
    "WorkerCrashed",
    "WorkerUnavailable",
]


class CodemodeError(Exception):
    """Base class of every exception codemode raises."""


class ConfigError(CodemodeError, ValueError):
    """A configuration value has the wrong type or an unknown key."""


class ToolDefinitionError(CodemodeError, ValueError):
    """A tool could not be registered (bad name, duplicate id, not callable)."""


class ApprovalError(CodemodeError, LookupError):
    """``approve`` named a run or call that awaits no decision: unknown, expired, another
    session's, not waiting for an approval, or decided already."""


class BatchError(CodemodeError, ValueError):
    """A batch cannot start (``codemode.batch``): its cells file cannot be read, or a line or
    cell is malformed or repeats another's id. The message names every such line or cell."""


class ClosedError(CodemodeError):
    """The ``CodeMode`` or session was used after ``close()``."""


class ProtocolError(CodemodeError):
    """A worker sent a frame that is oversized, malformed, or out of order."""


class WorkerCrashed(CodemodeError):
    """A worker process ended while it held a run (or was killed at the deadline)."""

    def __init__(self, message: str, *, exit_code: int | None, signal: int | None, timed_out: bool) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.signal = signal
        self.timed_out = timed_out


class WorkerUnavailable(CodemodeError):
    """No worker process could be started, or its QuickJS runtime could not be built."""


class McpServerError(CodemodeError):
    """An MCP server could not be reached, failed a request, or answered it with an error.

    ``server`` names the configured server. ``code`` is the JSON-RPC error code when the server
    answered with an error response (``-32602`` for an unknown tool, say), else ``None``.
    """

    def __init__(self, message: str, *, server: str, code: int | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.code = code


class McpTimeoutError(McpServerError):
    """An MCP request, or the handshake before it, did not finish within its timeout."""


class StoreError(CodemodeError):
    """A store write was malformed, or the database failed or could not be opened."""


class StoreLimitError(StoreError):
    """A commit would break a size limit; nothing of it was applied."""
