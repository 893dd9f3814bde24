"""One run's tool calls: the `Dispatcher` the supervisor hands a worker's calls to.

It is the facade over four parts, each with one job::

    submit(calls) ──> CallPlanner.plan   what each call names, may it, its checked input
                  ──> launch: answers and async calls now, sync tools as one callable
                        CallRunner       runs a sync tool / starts an async one
                          └─ CallGate    hook, approval, the journal's decisions
                        CallResults      ready results (take_ready, wait_ready), calls in flight
    release(decided) ──> the host's approvals: an approved call runs as submit runs it

``submit`` and ``release`` never run host code themselves: what runs the sync tools among the
calls comes back to the caller (`tool_starts`), which runs it on a thread of its choosing.
``run_plain`` is ``submit`` and that run in one, for a caller that has chosen its own thread
(calls of plain sync tools: `plain_sync_tools`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import protocol
from .approvals import Approvals, FiledCall
from .call_gate import CallGate, CallScope, Gate
from .call_planning import CallPlanner, HostApis, McpOps, Plan, answer, planning_failure, subject
from .call_results import CallResults, error_message
from .call_running import CallRunner
from .protocol import CallResult

if TYPE_CHECKING:
    from . import tracing
    from .models import ModelUsage
    from .namespaces import CallTable
    from .outputs import OutputStore
    from .tools import CatalogView

__all__ = ["Dispatcher", "InlineCalls"]


class InlineCalls(Protocol):
    """Runs a batch of a run's sync tools on the calling thread, then hands their results to
    the run; ``ran`` is told when the tools have run, before the results land (so how long they
    took is known before the run can make its next call: `ToolStarter`)."""

    def __call__(self, ran: Callable[[], None] | None = None) -> None: ...


class Dispatcher:
    """Runs one run's tool calls and hands back ``(call_id, ok, payload)`` results.

    Finished calls land in its `CallResults`; ``listener`` (the supervisor's, for runs) is told
    after each lands, on the thread that finished it, and ``wait_ready`` serves host-side calls.
    """

    __slots__ = ("_deferrable", "_parts", "_plain", "_results", "_scope", "_setup", "approvals", "resolved", "view")

    def __init__(
        self,
        view: CatalogView,
        loop: Callable[[], asyncio.AbstractEventLoop],
        *,
        outputs: OutputStore | None = None,
        session_id: str = "",
        gate: Gate | None = None,
        read_only: bool = False,
        namespace_calls: CallTable | None = None,
        mcp_ops: McpOps | None = None,
        approvals: Approvals | None = None,
        run_id: str = "",
        agent_run: str | None = None,
        apis: HostApis | None = None,
    ) -> None:
        self.view = view
        self._scope = CallScope(session_id, run_id, agent_run)
        self._results = CallResults()
        #: Calls may wait for a later approval only with the run's own (a journal's) approvals.
        self._deferrable = approvals is not None
        self.approvals = approvals if approvals is not None else Approvals({})
        #: What the planner, runner and gate are built from, on the run's first call (`_built`):
        #: most cells of a busy host make none, and building them cost each exec ~5 µs.
        self._setup = (loop, outputs, gate, read_only, namespace_calls, mcp_ops, apis)
        self._parts: tuple[CallPlanner, CallRunner, CallGate] | None = None
        #: Namespace calls arrive under a marker id; this maps their call ids to the real tool.
        self.resolved: dict[int, str] = {}
        #: Names called so far that reach a plain sync tool, with its id (`plain_sync_tools`).
        self._plain: dict[str, str] = {}

    def _built(self) -> tuple[CallPlanner, CallRunner, CallGate]:
        parts = self._parts
        if parts is None:
            loop, outputs, gate, read_only, namespace_calls, mcp_ops, apis = self._setup
            scope, results = self._scope, self._results
            call_gate = CallGate(
                gate or Gate(),
                self.view,
                scope,
                results,
                approvals=self.approvals,
                can_defer=self._deferrable,
                read_only=read_only,
            )
            runner = CallRunner(call_gate, results, scope, loop)
            planner = CallPlanner(
                self.view,
                call_gate,
                runner,
                scope,
                outputs=outputs,
                namespace_calls=namespace_calls,
                mcp_ops=mcp_ops,
                read_only=read_only,
                apis=apis,
            )
            parts = self._parts = (planner, runner, call_gate)
        return parts

    @property
    def session_id(self) -> str:
        return self._scope.session_id

    @property
    def model_usage(self) -> ModelUsage | None:
        """What the run's ``models.classify``/``generateImages`` calls used so far (None: none yet)."""
        return None if self._parts is None else self._parts[0].model_usage

    @property
    def parent(self) -> str:
        """The exec/wait call the next calls belong to (for hooks and the trace)."""
        return self._scope.parent

    @parent.setter
    def parent(self, parent: str) -> None:
        self._scope.parent = parent

    @property
    def span(self) -> tracing.RunSpan | None:
        """The exec/wait call's span, the parent of the next calls' spans (None when untraced)."""
        return self._scope.span

    @span.setter
    def span(self, span: tracing.RunSpan | None) -> None:
        self._scope.span = span

    @property
    def listener(self) -> Callable[[], object] | None:
        """Told (with no arguments, outside any lock) after results land."""
        return self._results.listener

    @listener.setter
    def listener(self, listener: Callable[[], object] | None) -> None:
        self._results.listener = listener

    def submit(self, calls: list[tuple[int, str, str]]) -> InlineCalls | None:
        """Starts the calls: async ones on their loop; calls that fail before a tool runs are
        answered at once. Returns what runs the sync tools among them (each result lands as
        any other), for the caller to run on a thread of its choosing; None if there are none.

        Never raises: a guest value reaches the host here, and whatever decoding, mapping or
        checking it does (RecursionError, MemoryError, a mapper's own exception) fails its call."""
        plans = []
        plan_call = self._built()[0].plan
        for call in calls:
            call_id, tool_id, _ = call
            try:
                plan = plan_call(*call)
            except BaseException as e:  # the one guard over a guest value's way into the host
                plan = answer(call_id, None, planning_failure(subject(tool_id), e))
            if plan.resolved is not None:
                self.resolved[call_id] = plan.resolved
            plans.append((call_id, plan))
        return self._launch(plans)

    def run_plain(self, calls: list[tuple[int, str, str]], tools: list[str]) -> None:
        """`submit` for calls that each reach a plain sync tool (``tools``: their ids, as
        `plain_sync_tools` gave them), and the run of their tools, here and now (the caller
        chose its thread: `ToolStarter.run_here`): all are planned (`CallPlanner.plain_input`),
        then their tools run, their results landing as `submit`'s would (those answered before
        their tool ran first). Never raises for a guest value, as `submit`."""
        planner, runner, _ = self._built()
        known, resolved = self.view.tools, self.resolved
        answered: list[CallResult] = []
        runs = []
        for (call_id, name, input_json), tool_id in zip(calls, tools, strict=True):
            tool = known[tool_id]
            try:
                checked = planner.plain_input(call_id, name, tool, input_json)
            except BaseException as e:  # the one guard over a guest value's way into the host
                checked = answer(call_id, None, planning_failure(subject(name), e))
            if isinstance(checked, Plan):
                if checked.resolved is not None:
                    resolved[call_id] = checked.resolved
                answered.append(checked.run())  # type: ignore[arg-type]
                continue
            if name != tool_id:
                resolved[call_id] = tool_id  # (an exact tool name stands for its one id)
            runs.append((call_id, tool, checked))
        if answered:
            self._results.add(answered)
        results = []
        for call_id, tool, (args, bound) in runs:
            result = runner.run_sync(call_id, tool, args, bound=bound)
            if result is not None:  # (None: filed for a later approval, which a plain tool needs not)
                results.append(result)
        self._results.add(results)

    def plain_sync_tools(self, calls: list[protocol.Call]) -> list[str] | None:
        """The catalog ids the calls reach, if each names (by id, or by a name with one id) a
        sync tool this run calls with nothing in between: no hook, approval or async gate, no
        ``MCP``/namespace wrapping, not a restart-safe run's. `submit` then plans them all to
        run on its caller's thread or be answered at once. None if any is otherwise."""
        plain = self._plain
        ids = []
        for _, name, _, _ in calls:
            tool_id = plain.get(name)
            if tool_id is None:
                tool_id = self._plain_tool(name)
                if tool_id is None:
                    return None
                plain[name] = tool_id  # (at most one entry per catalog tool, and its name)
            ids.append(tool_id)
        return ids

    def _plain_tool(self, name: str) -> str | None:
        """The id of the catalog tool ``name`` reaches (`CatalogView.reached`, as `CallPlanner`
        takes it), if it is a sync host tool the gate lets through untouched
        (`CallGate.passes`) and the run is not restart-safe; else None. (The ids `CallPlanner.plan`
        answers before the catalog, of ``readOutput``, ``models``, ``agents``, ``MCP`` and
        namespace calls, start with NUL, which no tool's name or id holds: none reaches a tool,
        so `run_plain`, which skips those steps, never meets one.)"""
        if self._setup[3]:  # (restart-safe: its calls' tools are checked read-only as planned)
            return None
        tool = self.view.reached(name)
        if isinstance(tool, list) or tool.is_async or tool.source == "mcp" or self._built()[2].passes(tool):
            return None
        return tool.id

    def release(self, decided: list[tuple[int, FiledCall, Any]]) -> InlineCalls | None:
        """Acts on the host's decisions (`Approvals.take_decided`): an approved call starts as
        `submit` starts a call (the run of its sync tool is returned), a rejected one fails."""
        plans = []
        for call_id, filed, decision in decided:
            if decision.ok:
                plans.append((call_id, Plan(None, filed.run, inline=filed.inline)))
            else:
                runner = self._built()[1]
                span = runner.call_span(call_id, filed.tool_id)
                runner.record(call_id, filed.tool_id, time.perf_counter(), False, span)
                plans.append((call_id, Plan(None, functools.partial(filed.refuse, decision.reason))))
        return self._launch(plans)

    def _launch(self, plans: list[tuple[int, Plan]]) -> InlineCalls | None:
        inline: list[Callable[[], CallResult | None]] = []
        answered: list[CallResult] = []
        for call_id, plan in plans:
            if plan.inline:
                inline.append(plan.run)
                continue
            try:
                result = plan.run()
            except BaseException as e:  # its loop is closed or gone: it fails, nothing stays in flight
                self._results.forget(call_id)
                result = CallResult(call_id, False, error_message(plan.resolved or "call", e))
            if result is not None:
                answered.append(result)
        if answered:
            self._results.add(answered)
        if not inline:
            return None
        return functools.partial(self._run_inline, inline)

    def _run_inline(self, runs: list[Callable[[], CallResult | None]], ran: Callable[[], None] | None = None) -> None:
        results = [result for run in runs if (result := run()) is not None]
        if ran is not None:
            ran()
        self._results.add(results)

    def add_ready(self, results: list[CallResult]) -> None:
        """Results to hand to the run (tools', or ``yield_control``'s); tells the listener.
        Every result passes here: one over the bridge limit becomes its call's error, and an
        error message is bounded, so no result can overflow a frame (`CallResults.add`)."""
        self._results.add(results)

    def requeue(self, results: list[CallResult]) -> None:
        """Puts back results taken with ``take_ready`` that were never delivered (first, in
        their order; the listener is not told: whoever put them back goes on with them)."""
        self._results.requeue(results)

    def ready_bytes(self) -> int:
        """The UTF-8 size of the payloads of the results ready to hand over (see `result_bytes`)."""
        return self._results.ready_bytes()

    def has_ready(self) -> bool:
        return self._results.has_ready()

    def ready(self) -> list[CallResult]:
        """The results ready to hand over, left ready."""
        return self._results.peek()

    @property
    def sink(self) -> Callable[[list[CallResult]], object] | None:
        """What every result that lands is also given (`CallResults.sink`)."""
        return self._results.sink

    @sink.setter
    def sink(self, sink: Callable[[list[CallResult]], object] | None) -> None:
        self._results.sink = sink

    def take_ready(self, max_bytes: int | None = None) -> list[CallResult]:
        """The ready results, in order; with ``max_bytes``, only the first ones whose payloads
        total at most that (and at least one): the rest stay ready for the next frame."""
        return self._results.take(max_bytes)

    def wait_ready(self, deadline: float) -> list[CallResult]:
        """The results ready now or, if none, the first to finish before ``deadline``
        (``time.monotonic``); empty if nothing is running or the deadline passes."""
        return self._results.wait(deadline)

    def pending(self) -> int:
        return self._results.pending()

    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The one event loop every in-flight call runs on (with none ready); else None."""
        return self._results.loop()

    def cancel(self) -> None:
        self._results.cancel()

    def close(self) -> None:
        """Cancels what is in flight and tells no one of results from now on."""
        self._results.listener = None
        self._results.cancel()
