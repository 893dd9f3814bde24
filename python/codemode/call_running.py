"""Running a planned call: a sync tool where its caller chooses, an async one on its loop.

::

    run_sync(call)   ──gate──> arguments ──tool.fn──> finish (output contract, JSON) ──> CallResult
    start_async(call) ─> start: a task on the tool's loop (or the run's) ──guarded──> gate,
                          arguments, await tool.fn, finish ──> CallResults.deliver
    start_coroutine(request) ─> start: an MCP resources/prompts request, the same way

Each call gets a span (a child of its exec/wait span, `tracing`) and a trace event when it ends.
A call whose approval comes later is filed (`CallGate.file`) and returns no result; its
approval runs the same function again with ``gated``. Whatever a hook or a tool raises fails
its own call, never the loop (shared) or the thread that ran it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from . import tracing
from .approvals import FiledCall
from .call_gate import Blocked, CallGate, CallScope, Deferred, InvalidInput, blocked_result, rejected
from .call_results import CallResults, encode_result, error_message
from .policy import Trace, TraceEvent
from .protocol import CallResult

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .catalog import BoundCall
    from .tools import Tool

__all__ = ["FILED", "CallRunner", "LoopRef", "ToolContext"]

LoopRef = Callable[[], asyncio.AbstractEventLoop]
_decode = msgspec.json.decode
#: What a coroutine of `CallRunner.start_coroutine` answers when it was filed for approval.
FILED: Any = object()


class ToolContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool that asks for it (a parameter annotated ``ToolContext``) learns about the
    call it serves; never part of its input schema. ``run_id`` and ``call_id`` together name
    one call of a run."""

    #: The session the cell runs in.
    session_id: str
    #: The catalog id called (``host:billing:invoices_list``), however the cell named it.
    tool_id: str
    #: The session's agent run, if it has one.
    agent_run: str | None = None
    #: The run the call belongs to (the ``runId`` a ``waiting`` result gives); ``""`` for a
    #: call the host makes (``tool_call``, a direct tool).
    run_id: str = ""
    #: The call's number within its run.
    call_id: int = 0


def _args(value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return ((), value) if isinstance(value, dict) else ((value,), {})


class CallRunner:
    """Runs one run's calls once planned, and delivers their results to its `CallResults`."""

    __slots__ = ("_gate", "_loop", "_results", "_scope")

    def __init__(self, gate: CallGate, results: CallResults, scope: CallScope, loop: LoopRef) -> None:
        self._gate = gate
        self._results = results
        self._scope = scope
        #: The loop async calls run on unless their tool names its own.
        self._loop = loop

    def run_sync(
        self, call_id: int, tool: Tool, args: Any, gated: bool = False, bound: BoundCall | None = None
    ) -> CallResult | None:
        """Runs a sync tool (``gated``: its call has passed the gate); None if its approval
        comes later (the call is filed). ``bound``: ``args`` converted when they were checked,
        used unless a hook or an approval callback saw them (either may change them in place)."""
        started = time.perf_counter()
        span = self.call_span(call_id, tool.id)
        try:
            if not gated:
                args = self._gate.check_sync(call_id, tool, args)
            gate = self._gate.gate
            if gated or gate.hook is not None or gate.approve is not None:
                bound = None
            positional, keywords = self._arguments(call_id, tool, args, bound)
            if span is None:
                value = tool.fn(*positional, **keywords)
            else:
                value = tracing.call_in(span, tool.fn, positional, keywords)
            result = self._finish(call_id, tool, value)
        except Blocked as e:
            result = blocked_result(call_id, tool, e)
        except Deferred as deferred:
            resume = functools.partial(self.run_sync, call_id, tool, deferred.input, True)
            try:
                self._gate.file(call_id, deferred, FiledCall(tool.id, None, resume, True, self._refusal(call_id, tool)))
                if span is not None:
                    tracing.end_call(span, "deferred", started)
                return None
            except Blocked as e:
                result = blocked_result(call_id, tool, e)
        except BaseException as e:  # a hook or tool fails its own call, whatever it raises
            result = CallResult(call_id, False, error_message(tool.id, e))
        self.record(call_id, tool.id, started, result.ok, span)
        return result

    def call_span(self, call_id: int, tool_id: str) -> Span | None:
        """A starting call's span, the child of the exec/wait span that starts it (`tracing`);
        None when untraced."""
        run_span = self._scope.span
        return None if run_span is None else tracing.start_call(run_span, call_id, tool_id, self._scope.run_id)

    def _arguments(self, call_id: int, tool: Tool, args: Any, bound: BoundCall | None = None) -> BoundCall:
        """The arguments ``tool.fn`` is called with for the input ``args`` (`catalog.Parameters`;
        ``bound``: already converted), its ``ToolContext`` among them if it asks for one;
        ``InvalidInput`` if ``args`` (a hook's rewrite: the call's own input was checked when it
        was planned) does not convert."""
        parameters = tool.parameters
        if parameters is None:
            return _args(args)
        if bound is None:
            converted = parameters.bind(args)
            if isinstance(converted, str):
                raise InvalidInput(converted)
            bound = converted
        positional, keywords = bound
        if parameters.context is not None:
            scope = self._scope
            keywords[parameters.context] = ToolContext(
                session_id=scope.session_id,
                tool_id=tool.id,
                agent_run=scope.agent_run,
                run_id=scope.run_id,
                call_id=call_id,
            )
        return positional, keywords

    def _refusal(self, call_id: int, tool: Tool) -> Callable[[str], CallResult]:
        """Answers ``tool``'s call as the host rejected it (with the reason given)."""
        return lambda reason: blocked_result(call_id, tool, rejected(reason))

    def _finish(self, call_id: int, tool: Tool, value: Any) -> CallResult:
        """Checks the output contract, then encodes; neither message echoes the value."""
        payload = encode_result(f"tool {tool.id}", value)
        if isinstance(payload, str):
            return CallResult(call_id, False, payload)
        if tool.check_output is not None:
            problem = tool.check_output(_decode(payload))
            if problem is not None:
                return CallResult(
                    call_id, False, f"tool {tool.id} returned a value that breaks its output contract: {problem}"
                )
        return CallResult(call_id, True, payload.decode())

    def record(self, call_id: int, tool_id: str, started: float, ok: bool, span: Span | None) -> None:
        """Ends a call's span and adds its trace event."""
        if span is not None:
            tracing.end_call(span, "ok" if ok else "error", started)
        trace = self._gate.gate.trace
        if trace is not None:
            parent = self._scope.parent
            trace.add(
                TraceEvent(
                    kind="tool_call",
                    id=f"{parent}/call_{call_id}",
                    session_id=self._scope.session_id,
                    at=Trace.now(),
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                    parent=parent,
                    tool_id=tool_id,
                    status="ok" if ok else "error",
                )
            )

    def start_async(self, call_id: int, tool: Tool, args: Any, gated: bool = False) -> None:
        """Starts a call of ``tool`` on its loop (``gated``: it has passed the gate)."""
        through_gate = not gated and self._gate.passes(tool)

        async def call() -> CallResult | None:
            try:
                gated = await self._gate.check_async(call_id, tool, args) if through_gate else args
            except Blocked as blocked:
                return blocked_result(call_id, tool, blocked)
            except Deferred as deferred:
                resume = functools.partial(self.start_async, call_id, tool, deferred.input, True)
                try:
                    refuse = self._refusal(call_id, tool)
                    self._gate.file(call_id, deferred, FiledCall(tool.id, None, resume, False, refuse))
                except Blocked as blocked:
                    return blocked_result(call_id, tool, blocked)
                return None
            positional, keywords = self._arguments(call_id, tool, gated)
            value = tool.fn(*positional, **keywords)
            if inspect.isawaitable(value):
                value = await value
            return self._finish(call_id, tool, value)

        self._start(call_id, tool.id, call, tool.loop)

    def start_coroutine(self, call_id: int, label: str, make: Callable[[], Awaitable[Any]]) -> None:
        """Starts a request that is no catalog tool (``MCP.<server>.resources/prompts``)."""

        async def call() -> CallResult | None:
            value = await make()
            if value is FILED:
                return None
            payload = encode_result(label, value)
            if isinstance(payload, str):
                return CallResult(call_id, False, payload)
            return CallResult(call_id, True, payload.decode())

        self._start(call_id, label, call, None)

    def _start(
        self,
        call_id: int,
        label: str,
        call: Callable[[], Awaitable[CallResult | None]],
        loop: LoopRef | None,
    ) -> None:
        """Starts ``call`` on its loop (at once, as a task, when this is that loop's thread)."""
        started = time.perf_counter()
        span = self.call_span(call_id, label)
        results = self._results

        async def guarded() -> None:
            if span is not None:
                tracing.enter(span)
            # Delivers from inside the task: no extra loop iterations for future callbacks.
            try:
                result = await call()
            except asyncio.CancelledError as e:
                if not results.in_flight(call_id):  # the host cancelled it (`cancel` forgets it first)
                    if span is not None:
                        tracing.end_call(span, "cancelled", started)
                    raise
                # The tool raised it, or cancelled its own task: its call fails like any other.
                result = CallResult(call_id, False, error_message(label, e))
            except BaseException as e:  # it fails its own call; the loop (shared) goes on
                result = CallResult(call_id, False, error_message(label, e))
            if result is None:  # filed for approval: no longer running
                results.forget(call_id)
                if span is not None:
                    tracing.end_call(span, "deferred", started)
                return
            self.record(call_id, label, started, result.ok, span)
            results.deliver(call_id, result)

        target = (loop or self._loop)()
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        coro = guarded()
        if target is here:
            # No trip through the loop's self-pipe, one loop iteration less before it runs.
            task = target.create_task(coro)
            results.track(call_id, target, functools.partial(target.call_soon_threadsafe, task.cancel))
            return
        results.track(call_id, target, None)  # it may finish before run_coroutine_threadsafe returns
        try:
            future = asyncio.run_coroutine_threadsafe(coro, target)
        except BaseException:
            coro.close()  # (never scheduled: its loop is closed)
            if span is not None:
                tracing.end_call(span, "error", started)
            raise
        if not results.set_cancel(call_id, future.cancel):
            future.cancel()  # cancelled meanwhile (a no-op if it was delivered already)
