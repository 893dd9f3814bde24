"""The exception hierarchy for library misuse and infrastructure failures.

A guest failure (the cell threw, timed out, ran out of memory) is *result data*: a ``failed``
result with a code. These exceptions are for the host's own mistakes and for infrastructure the
host must know about.
"""

from __future__ import annotations

__all__ = [
    "ApprovalError",
    "ClosedError",
    "CodemodeError",
    "ConfigError",
    "ProtocolError",
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
