"""Who may call what: allow/deny lists, the ``before_tool_call`` hook, approvals, and the trace.

Nested calls from a cell go through the same gate a direct tool call would: a denied or hidden
tool is not in the run's catalog at all (a guessed id gets the same "unknown tool" answer as a
tool that does not exist), a hook can block a call or rewrite its input, and an approval
callback can refuse it. Blocked calls reach the guest as plain errors that say so, except MCP
tool calls: those answer as MCP tools report a failure, ``{content: [{type: "text", text:
<reason>}], isError: true}`` (the reference's shape), and the tool does not run.

An approval may also come *later*: the callback answers ``Defer()``, or a call matches
``Policy.approve`` (or its tool says ``requires_approval``) with no callback to ask. The call then
waits for the host's ``Session.approve`` and its run suspends meanwhile (see `approvals`).

Every MCP path passes the gate. ``MCP.<server>.resources.list/read`` and ``prompts.list/get`` are
no catalog tools, but patterns, hooks and approvals see them as ``mcp:<server>:resources/list``
(name ``resources/list``, the MCP method; owner the server; see `mcp_api.op_id`), so
``deny=["mcp:docs:resources/*"]`` or a hook on ``event.tool_id`` reaches them as it reaches tools.
"""

from __future__ import annotations

import fnmatch
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec

__all__ = ["Block", "Defer", "Policy", "Rewrite", "ToolCallEvent", "Trace", "TraceEvent"]


class ToolCallEvent(msgspec.Struct, frozen=True, kw_only=True):
    """What hooks and approvals see of one nested call, and hooks of the model's own ``exec``
    call when it goes through ``Session.handle`` (``tool_kind="code_mode_exec"``)."""

    tool_id: str
    name: str
    source: str
    owner: str
    input: Any
    session_id: str
    #: The ``exec``/``wait`` call the nested call belongs to.
    parent: str
    #: ``code_mode_exec`` for the model's ``exec`` of a cell (the spec: a policy can tell a cell
    #: from a shell-like ``exec``), ``code_mode_call`` for a call made from inside a cell.
    tool_kind: str = "code_mode_call"
    #: For ``code_mode_exec``: ``javascript`` or ``typescript``.
    tool_input_kind: str | None = None


class Block(msgspec.Struct, frozen=True):
    """Returned by a hook: refuse the call; the guest sees ``tool call blocked: <reason>`` (an MCP
    tool call: an ``isError`` result whose text is ``reason``)."""

    reason: str


class Rewrite(msgspec.Struct, frozen=True):
    """Returned by a hook: run the call with this input instead."""

    input: Any


class Defer(msgspec.Struct, frozen=True):
    """Returned by an approval callback: no answer yet. The call waits for
    ``Session.approve(run_id, call_id, ok)``, its run suspends as ``waiting`` meanwhile, and its
    entry in ``pendingToolCalls`` shows ``input`` (the call's input if not given: give less to
    keep a secret out of what the model and the host's UI see)."""

    input: Any = msgspec.UNSET


HookResult = Block | Rewrite | None
Hook = Callable[[ToolCallEvent], HookResult | Awaitable[HookResult]]
Approval = bool | Defer
Approver = Callable[[ToolCallEvent], Approval | Awaitable[Approval]]


class Policy(msgspec.Struct, frozen=True):
    """Allow and deny patterns over tool names and ids (``fnmatch`` globs); deny wins. Calls
    matching ``approve`` wait for an approval (the callback's, or ``Session.approve``)."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    approve: tuple[str, ...] = ()

    @staticmethod
    def of(allow: Iterable[str] | None, deny: Iterable[str], approve: Iterable[str] = ()) -> Policy:
        return Policy(None if allow is None else tuple(allow), tuple(deny), tuple(approve))

    def permits(self, tool_id: str, name: str) -> bool:
        if _hit(self.deny, tool_id, name):
            return False
        return self.allow is None or _hit(self.allow, tool_id, name)

    def needs_approval(self, tool_id: str, name: str) -> bool:
        return _hit(self.approve, tool_id, name)


def _hit(patterns: Iterable[str], tool_id: str, name: str) -> bool:
    return any(fnmatch.fnmatchcase(tool_id, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


class TraceEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """One entry of the trace: a code-mode call (``exec``/``wait``) or a nested tool call."""

    kind: str  # exec | wait | tool_call | phase | log
    id: str
    session_id: str
    at: float
    duration_ms: float = 0.0
    parent: str | None = None
    tool_id: str | None = None
    status: str | None = None
    run_id: str | None = None
    #: A ``phase``'s name, a ``log``'s line (Swarm's progress outputs).
    text: str | None = None


class Trace:
    """A bounded, thread-safe event list the host can export (``CodeMode.trace()``): a bounded
    deque, whose ``append`` and copy (``list``) each run in C under the GIL, so no lock."""

    def __init__(self, limit: int = 10_000) -> None:
        self._events: deque[TraceEvent] = deque(maxlen=limit)
        #: Adds an event (the oldest goes once ``limit`` are held).
        self.add: Callable[[TraceEvent], None] = self._events.append

    def export(self, session_id: str | None = None) -> list[dict[str, Any]]:
        events = list(self._events)
        return [msgspec.to_builtins(e) for e in events if session_id is None or e.session_id == session_id]

    @staticmethod
    def now() -> float:
        return time.time()
