"""Approvals that answer later: a call waits for the host's decision, and its run suspends.

    guest: await tools.deploy({...}) ──> gate: the hook, then the approval
        callback answers True / False ──> the call runs / is refused at once (as ever)
        callback answers Defer()  ─┐
        or the call needs one      ├─> filed here, awaiting; the run parks on it, and with nothing
        (Policy.approve, a tool's  │   else running suspends at once: waiting{pending_tools,
        requires_approval) and no ─┘   pendingToolCalls: [{id, toolId, approval: "pending", input}]}
        callback to ask
    host: session.approve(run_id, "call_3", ok, reason=...) ──> decided, in the run's journal
        the run is in an exec/wait now ──> released at once
        the run is suspended           ──> released by its next wait (a run never gets further
                                           than the model asked it to go)
        released: approved ──> the tool runs with the input the gate passed
                  rejected ──> the guest's call fails: "tool call blocked: not approved: <reason>"

A decision is recorded in the journal under the call's id before anything acts on it, and a call
whose decision is recorded is never put to the callback again: a replay never asks twice and
never runs a rejected call. Unanswered approvals go with their run (its TTL, a cancel, a close).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from .errors import ApprovalError

if TYPE_CHECKING:
    from .runs import JournalApproval

__all__ = ["SHOWN_INPUT_BYTES", "ApprovalRequest", "Approvals", "FiledCall", "call_number", "shown_input"]

#: The most of a call's input an approval entry shows, as JSON; a bigger one is shown cut.
SHOWN_INPUT_BYTES = 4096


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A call that waits for (or has) the host's decision, as ``pending_approvals()`` lists it."""

    session_id: str
    agent_run: str | None
    run_id: str
    #: As ``pendingToolCalls`` names it: ``call_<n>``.
    call_id: str
    tool_id: str
    #: What the gate shows of the call's input (``Defer(input=...)``, else the input).
    input: Any
    #: ``pending``, or ``approved``/``rejected`` until the run's next ``wait`` releases it.
    state: str


class FiledCall(NamedTuple):
    """One call filed for approval: what it shows, and what starts it once approved."""

    tool_id: str
    shown: Any
    #: Starts the approved call: returns its result (a sync tool, to run where the caller
    #: chooses) or None (started on its loop).
    run: Callable[[], Any]
    inline: bool
    #: Answers the rejected call (its result; the tool never runs).
    refuse: Callable[[str], Any]


def call_number(call_id: str | int) -> int | None:
    """``call_3`` (as ``pendingToolCalls`` names it) or ``3`` as the engine's call id."""
    if isinstance(call_id, bool):
        return None
    if isinstance(call_id, int):
        return call_id if call_id > 0 else None
    if isinstance(call_id, str) and call_id.startswith("call_") and call_id[5:].isdecimal():
        number = int(call_id[5:])
        return number if number > 0 else None
    return None


def shown_input(value: Any) -> Any:
    """``value`` as an approval entry shows it: itself, or, past ``SHOWN_INPUT_BYTES`` of JSON,
    a string that says how big it is with its head."""
    try:
        text = msgspec.json.encode(value)
    except (TypeError, ValueError, RecursionError, MemoryError):
        return "[input not shown: not JSON]"
    if len(text) <= SHOWN_INPUT_BYTES:
        return value
    head = text[: SHOWN_INPUT_BYTES // 2].decode("utf-8", "ignore")
    return f"[input of {len(text)} bytes, cut] {head}…"


class Approvals(msgspec.Struct, eq=False):
    """One run's calls that wait for a decision, and the decisions not yet acted on.

    ``_record`` is the run's journal (``Journal.approvals``): a decision is written there first.
    Thread-safe: the gate files calls on tool threads and loops, the host decides on its own.
    (A struct: built in C, for every run.)"""

    _record: dict[int, JournalApproval]
    _waiting: dict[int, FiledCall] = msgspec.field(default_factory=dict)
    _lock: threading.Lock = msgspec.field(default_factory=threading.Lock)

    def recorded(self, call_id: int) -> JournalApproval | None:
        """The decision the journal holds for a call (a call put to the gate again)."""
        return self._record.get(call_id)

    def file(self, call_id: int, waiting: FiledCall) -> None:
        with self._lock:
            self._waiting[call_id] = waiting

    def decide(self, call_id: int, ok: bool, reason: str) -> None:
        """Records the host's decision; ``ApprovalError`` if the call awaits none."""
        from .runs import JournalApproval

        with self._lock:
            if call_id not in self._waiting:
                raise ApprovalError(f"call_{call_id} of this run does not await an approval")
            if call_id in self._record:
                raise ApprovalError(f"call_{call_id} of this run was decided already")
            self._record[call_id] = JournalApproval(ok, reason)

    def take_decided(self) -> list[tuple[int, FiledCall, JournalApproval]]:
        """The decided calls, to act on (each once), oldest call first."""
        with self._lock:
            decided = sorted(c for c in self._waiting if c in self._record)
            return [(c, self._waiting.pop(c), self._record[c]) for c in decided]

    def undecided(self) -> set[int]:
        with self._lock:
            return {c for c in self._waiting if c not in self._record}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def entry(self, call_id: int) -> dict[str, Any] | None:
        """What a ``pendingToolCalls`` entry adds for a call filed here, or None."""
        with self._lock:
            waiting = self._waiting.get(call_id)
            decision = self._record.get(call_id)
        if waiting is None:
            return None
        state = "pending" if decision is None else "approved" if decision.ok else "rejected"
        return {"approval": state, "input": waiting.shown}

    def requests(self, session_id: str, agent_run: str | None, run_id: str) -> list[ApprovalRequest]:
        with self._lock:
            filed = sorted(self._waiting.items())
            record = dict(self._record)
        return [
            ApprovalRequest(
                session_id=session_id,
                agent_run=agent_run,
                run_id=run_id,
                call_id=f"call_{call_id}",
                tool_id=waiting.tool_id,
                input=waiting.shown,
                state="pending" if call_id not in record else "approved" if record[call_id].ok else "rejected",
            )
            for call_id, waiting in filed
        ]

    def clear(self) -> None:
        if not self._waiting:
            return  # (most runs filed none)
        with self._lock:
            self._waiting.clear()
