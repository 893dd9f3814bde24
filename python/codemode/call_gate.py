"""The gate every call of a run passes before its tool runs: the hook, then the approval.

::

    planned call ──> CallGate.check_sync / check_async
                        ├─ before_tool_call hook:  Block -> Blocked, Rewrite -> new input
                        ├─ the journal's decision (a replayed run is not asked again)
                        ├─ the approve callback:   False -> Blocked, Defer -> Deferred
                        └─ Policy.approve / the tool's own flag with no callback -> Deferred
    Deferred ──> CallGate.file: the call waits in `approvals` for the host's decision
                 (Blocked instead where nothing can wait for it: host-side calls, restartSafe runs)

What the hook and the approval see is a `policy.ToolCallEvent`; the exec/wait call the calls
belong to (``parent``) and its span live in the run's `CallScope`, which the run's lifecycle
sets before each step.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from .approvals import Approvals, FiledCall, shown_input
from .call_results import CallResults, Refused, bounded_error, error_message
from .policy import Approval, Approver, Block, Defer, Hook, HookResult, Rewrite, ToolCallEvent, Trace
from .protocol import CallResult

if TYPE_CHECKING:
    from . import tracing
    from .tools import CatalogView, Tool

__all__ = [
    "Blocked",
    "CallGate",
    "CallScope",
    "Deferred",
    "Gate",
    "HostRequest",
    "InvalidInput",
    "apply_hook",
    "blocked_result",
    "op_rejected",
    "rejected",
]

_encode = msgspec.json.encode
#: Why a call that waits for a later approval is refused where nothing can wait for it.
_CANNOT_WAIT = "approval pending, and only a code mode run can wait for an approval that comes later"
_CANNOT_WAIT_SAFE = "approval pending, and a restartSafe run cannot wait for an approval"


class Gate(msgspec.Struct, frozen=True, dict=True):
    """The host's checks around every nested call, and where the trace goes.
    (``dict``: room for `is_async`, read once per gate.)"""

    hook: Hook | None = None
    approve: Approver | None = None
    trace: Trace | None = None

    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.hook) or inspect.iscoroutinefunction(self.approve)


class Blocked(Refused):
    """A hook returned ``Block(reason)``, or the approval callback refused (``not approved``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"tool call blocked: {reason}")
        self.reason = reason


class InvalidInput(Refused):
    """A call's input, rewritten by a hook, does not convert to its tool's parameters."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"invalid input: {problem}")


class Deferred(Exception):
    """The gate has no approval yet: the call waits for the host's (see `approvals`)."""

    def __init__(self, args: Any, shown: Any) -> None:
        super().__init__("awaiting approval")
        #: The input the call runs with once approved (the hook's rewrite applied).
        self.input = args
        self.shown = shown


class HostRequest(NamedTuple):
    """A call that is no catalog tool, as hooks and approvals see it: an
    ``MCP.<server>.resources/prompts`` request (`mcp_api.op_id`), a ``models.classify`` or
    ``models.generateImages`` (``models:<provider>:<op>``), an ``agents.run`` (``agents:run``)."""

    id: str
    name: str
    owner: str
    source: str = "mcp"
    requires_approval: bool = False


def _approved(args: Any, answer: Approval) -> Any:
    """The approval callback's ``answer`` over ``args``: the input to run with; ``Blocked`` if
    it refused, ``Deferred`` if it answers later."""
    if isinstance(answer, Defer):
        raise Deferred(args, args if answer.input is msgspec.UNSET else answer.input)
    if not answer:
        raise Blocked("not approved")
    return args


def rejected(reason: str) -> Blocked:
    """What a call the host rejected (``Session.approve(..., ok=False)``) fails with."""
    return Blocked(f"not approved: {reason}" if reason else "not approved")


def op_rejected(call_id: int, label: str, reason: str) -> CallResult:
    """An ``MCP.<server>.resources/prompts`` request the host rejected."""
    return CallResult(call_id, False, error_message(label, rejected(reason)))


def apply_hook(decision: HookResult, args: Any) -> Any:
    """A hook's decision over ``args``: the input to run with; ``Blocked`` if it blocked."""
    if isinstance(decision, Block):
        raise Blocked(decision.reason)
    if isinstance(decision, Rewrite):
        return decision.input
    return args


def blocked_result(call_id: int, tool: Tool, blocked: Blocked) -> CallResult:
    """A blocked call's answer (the tool did not run): a failed call, or for an MCP tool what
    MCP tools answer a failure with, a result the cell can check (``isError``) whose text is
    the reason."""
    if tool.source != "mcp":
        return CallResult(call_id, False, error_message(tool.id, blocked))
    content = [{"type": "text", "text": bounded_error(blocked.reason)}]
    return CallResult(call_id, True, _encode({"content": content, "isError": True}).decode())


class CallScope(msgspec.Struct, eq=False):
    """Whose calls these are: the session, the run and its agent run, and the exec/wait call
    the next calls belong to with its OpenTelemetry span (set before each step)."""

    session_id: str
    #: The run these calls belong to and its agent run, for `ToolContext` (none: host-side calls).
    run_id: str
    agent_run: str | None
    #: The exec/wait call the next calls belong to (for hooks and the trace).
    parent: str = ""
    #: Its span, the parent of the next calls' spans (None when untraced).
    span: tracing.RunSpan | None = None


class CallGate:
    """One run's gate: the host's `Gate` over its catalog view, with its journal's decisions."""

    __slots__ = ("_can_defer", "_read_only", "_results", "_scope", "approvals", "gate", "gated", "view")

    def __init__(
        self,
        gate: Gate,
        view: CatalogView,
        scope: CallScope,
        results: CallResults,
        *,
        approvals: Approvals,
        can_defer: bool,
        read_only: bool,
    ) -> None:
        self.gate = gate
        self.view = view
        self._scope = scope
        self._results = results
        #: Whether any call passes a hook or an approval callback.
        self.gated = gate.hook is not None or gate.approve is not None
        #: Calls that wait for a later approval (a run's, in its journal); none can wait for one
        #: without it (host-side calls: such a call is refused).
        self._can_defer = can_defer
        self.approvals = approvals
        #: Restart-safe runs may not wait for an approval (they may be redone after a restart).
        self._read_only = read_only

    def passes(self, tool: Tool | HostRequest) -> bool:
        """Whether a call of ``tool`` passes a hook or an approval at all."""
        return self.gated or self.view.needs_approval(tool)

    def event(self, tool: Tool | HostRequest, args: Any) -> ToolCallEvent:
        return ToolCallEvent(
            tool_id=tool.id,
            name=tool.name,
            source=tool.source,
            owner=tool.owner,
            input=args,
            session_id=self._scope.session_id,
            parent=self._scope.parent,
        )

    def check_sync(self, call_id: int, tool: Tool, args: Any) -> Any:
        """The input ``tool`` runs with; ``Blocked`` if the hook or the approval refuses it,
        ``Deferred`` if its approval comes later."""
        gate = self.gate
        if gate.hook is not None:
            args = apply_hook(gate.hook(self.event(tool, args)), args)  # type: ignore[arg-type]
        if self._already_decided(call_id):
            return args
        if gate.approve is not None:
            return _approved(args, gate.approve(self.event(tool, args)))  # type: ignore[arg-type]
        if self.view.needs_approval(tool):
            raise Deferred(args, args)
        return args

    async def check_async(self, call_id: int, tool: Tool | HostRequest, args: Any) -> Any:
        """`check_sync` with callbacks that may be ``async``."""
        gate = self.gate
        if gate.hook is not None:
            decision = gate.hook(self.event(tool, args))
            if inspect.isawaitable(decision):
                decision = await decision
            args = apply_hook(decision, args)
        if self._already_decided(call_id):
            return args
        if gate.approve is not None:
            answer = gate.approve(self.event(tool, args))
            if inspect.isawaitable(answer):
                answer = await answer
            return _approved(args, answer)
        if self.view.needs_approval(tool):
            raise Deferred(args, args)
        return args

    def _already_decided(self, call_id: int) -> bool:
        """The journal holds the host's decision on this call (it is put to the gate again):
        True to run it without asking again; ``Blocked`` if it was rejected."""
        decision = self.approvals.recorded(call_id)
        if decision is None:
            return False
        if not decision.ok:
            raise rejected(decision.reason)
        return True

    def file(self, call_id: int, deferred: Deferred, filed: FiledCall) -> None:
        """Files a call for the host's decision: it stays in flight with no result, and its run
        suspends once nothing else runs (see `approvals`). ``Blocked`` where nothing can wait
        for an approval (a host-side call, a restartSafe run)."""
        if self._read_only:
            raise Blocked(_CANNOT_WAIT_SAFE)
        if not self._can_defer:
            raise Blocked(_CANNOT_WAIT)
        self.approvals.file(call_id, filed._replace(shown=shown_input(deferred.shown)))
        self._results.tell()
