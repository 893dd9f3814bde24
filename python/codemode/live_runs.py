"""The runs of one ``CodeMode`` that are not over: how a step ends, and what can reach a run
between its steps (an approval, a cancel, expiry, an export).

Every run is *live* from its first step until it is retired; a suspended one is also in the run
table (`runs.RunTable`: scoped to its session, at most 64, each for ``snapshotTtlSeconds``),
where the next ``wait`` claims it::

    step ──finish──> suspended: table.suspend ──> Waiting (runId, pendingToolCalls)
                 └─> completed / failed: retire ──> Completed (store writes committed) | Failed
    approve(run, call) ──> live run's approvals ──> supervisor.release_decided (acts at once)
    cancel / expiry (the sweeper thread) / close ──> retire: out of the table, runtime dropped,
                                                     tool tasks cancelled, approvals cleared

Building the result from the step (outputs, cuts, the error's budget) is `codemode.outcomes`;
each ended step is also one event of the host's trace (`policy.Trace`).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from . import catalog
from .approvals import ApprovalRequest, call_number
from .config import CodeModeConfig
from .errors import ApprovalError, CodemodeError, StoreError, StoreLimitError
from .model_surface import MODEL_VISIBLE_TOOLS
from .outcomes import Completed, Failed, Output, Result, Telemetry, Waiting, cut_to_budget, failure_text, outputs_of
from .outputs import OutputStore
from .policy import Trace, TraceEvent
from .protocol import Report
from .runs import FOREIGN, UNAVAILABLE, Run, RunLookupError, RunLost, RunTable, Scope, Step
from .stored_values import StoredValues
from .supervisor import Supervisor
from .tools import CatalogView

if TYPE_CHECKING:
    from .run_factory import Cell
    from .shared_runs import SharedRuns

__all__ = ["MAX_REASON_CHARS", "LiveRuns"]

_log = logging.getLogger(__name__)
#: The output kinds of Swarm's ``phase`` and ``log`` (engine.rs `OutputKind`), as trace events.
_PROGRESS_KINDS = {8: "phase", 9: "log"}

#: Characters of the reason a host gives when it rejects a call (it reaches the guest).
MAX_REASON_CHARS = 1000


def _telemetry(
    started: float, view: CatalogView, calls: int, searches: int, describes: int, memory_bytes: int, usage: Any
) -> Telemetry:
    """A result's telemetry: time since ``started``, what the run did (its tool calls, searches
    and describes), the catalog it had."""
    return Telemetry(
        (time.perf_counter() - started) * 1000.0,
        calls,
        searches,
        describes,
        memory_bytes,
        len(view.tools),
        dict(view.counts),
        [*MODEL_VISIBLE_TOOLS, *view.direct],
        usage,
    )


class LiveRuns:
    """The live runs and the table of suspended ones (``catalog`` gives the catalog a run would
    get now, for the telemetry of a call that made no run)."""

    def __init__(
        self,
        config: CodeModeConfig,
        catalog: Callable[[], CatalogView],
        supervisor: Supervisor,
        trace: Trace,
        stored: StoredValues,
        outputs: OutputStore,
        shared: SharedRuns | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._supervisor = supervisor
        self._trace = trace
        self._stored = stored
        self._outputs = outputs
        #: The shared run store, if any (`codemode.shared_runs`): it holds the caps and the TTL
        #: store-wide, and this table only the copies resident here.
        self._shared = shared
        if shared is None:
            self._runs = RunTable(config.snapshot_ttl_seconds, per_session=config.max_suspended_runs_per_session)
        else:
            self._runs = RunTable(math.inf, limit=sys.maxsize, per_session=sys.maxsize)
        #: Every run not yet retired, by id: a host's approval may come while its run still
        #: executes, before it is filed as suspended.
        self._live: dict[str, Run] = {}
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()

    def add(self, run: Run) -> None:
        self._live[run.run_id] = run

    def claim(self, run_id: str, scope: Scope) -> Run:
        """The suspended run a `wait` resumes, marked resuming (`RunTable.claim`; a
        ``RunLookupError`` in the spec's words if it cannot). With a shared run store, its lease
        is taken there first, and a copy resident here is used only if it is current (else the
        run is rebuilt here, replayed by this `wait`); ``RunLost`` if it cannot go on."""
        shared = self._shared
        if shared is None:
            return self._runs.claim(run_id, scope)
        if not isinstance(run_id, str):
            raise RunLookupError(UNAVAILABLE)
        self._start_sweeper()
        local = self._runs.get(run_id)
        try:
            run = shared.claim(run_id, scope, local)
        except RunLost:
            if local is not None and self._runs.take_idle(local):
                self._end_run(local)
            raise
        if run is local:
            return self._runs.claim(run_id, scope)
        if local is not None and self._runs.take_idle(local):
            self._stale(local)
        self._runs.hold(run)
        self._live[run.run_id] = run
        return run

    def _stale(self, run: Run) -> None:
        """A copy resident here that another host has resumed since: its runtime goes; its
        calls running here go on (`SharedRuns.orphan`)."""
        assert self._shared is not None
        if self._live.get(run.run_id) is run:
            del self._live[run.run_id]
        self._supervisor.drop(run)
        self._shared.orphan(run)

    def telemetry(self, started: float, step: Step | None, run: Run | None = None) -> Telemetry:
        view = run.dispatcher.view if run is not None else self._catalog()
        if run is None or step is None:
            return _telemetry(started, view, 0, 0, 0, step.memory_bytes if step else 0, None)
        counts = run.counts
        counts.add(step)
        used = run.dispatcher.model_usage
        usage = None if used is None or not used.operations else msgspec.structs.replace(used)
        return _telemetry(started, view, counts.tool_calls, counts.searches, counts.describes, step.memory_bytes, usage)

    def finish(self, run: Run, step: Step, started: float, kind: str) -> Result:
        """Files a suspended run or retires a finished one; builds the spec's result."""
        telemetry = self.telemetry(started, step, run)
        result = self._result(run, step, telemetry)
        if step.outputs:
            self._progress(run, step)
        status = "waiting" if isinstance(result, Waiting) else result.__struct_config__.tag
        self._traced(kind, run.dispatcher.parent, run.dispatcher.session_id, telemetry, status, run.run_id)  # type: ignore[arg-type]
        return result

    def first_result(self, cell: Cell, report: Report, value: Any, started: float) -> Completed:
        """The result of a cell that completed plainly in its first step, before it was a run
        (`Supervisor.first_step`: no tool call, output or store write)."""
        telemetry = _telemetry(started, cell.view, 0, report.searches, report.describes, report.memory_bytes, None)
        self._traced("exec", cell.parent, cell.session.session_id, telemetry, "completed", cell.run_id)
        return Completed(value, telemetry)

    def _traced(self, kind: str, parent: str, session_id: str, telemetry: Telemetry, status: str, run_id: str) -> None:
        """An exec or wait that ended, as an event of the host's trace."""
        self._trace.add(
            TraceEvent(
                kind=kind,
                id=parent,
                session_id=session_id,
                at=Trace.now(),
                duration_ms=telemetry.duration_ms,
                status=status,
                run_id=run_id,
            )
        )

    def _progress(self, run: Run, step: Step) -> None:
        """Swarm's ``phase(name)`` and ``log(...)`` outputs of this step, as trace events (their
        text without the output's ``[phase] ``/``[log] `` prefix), for a host showing progress."""
        dispatcher = run.dispatcher
        for n, (kind, text) in enumerate(step.outputs):
            if kind in _PROGRESS_KINDS:
                name = _PROGRESS_KINDS[kind]
                self._trace.add(
                    TraceEvent(
                        kind=name,
                        id=f"{dispatcher.parent}/{name}_{n}",
                        session_id=dispatcher.session_id,
                        at=Trace.now(),
                        parent=dispatcher.parent,
                        run_id=run.run_id,
                        text=text.partition("] ")[2],
                    )
                )

    def _shown(self, run: Run, step: Step) -> tuple[list[Output], Any]:
        """The outputs and value a result shows: with a text budget, cut to it
        (`outcomes.cut_to_budget`), the full texts of the cuts kept for the run's session."""
        output = outputs_of(step.outputs)
        if run.output_chars is None:
            return output, step.value
        value = step.value if step.status == "completed" else None
        return cut_to_budget(output, value, run.output_chars, functools.partial(self._outputs.keep, run.scope[0]))

    def _result(self, run: Run, step: Step, telemetry: Telemetry) -> Result:
        output, value = self._shown(run, step)
        if step.status == "suspended":
            overrun = run.snapshot_overrun(self._config.max_snapshot_bytes)
            if overrun is not None:
                self.retire(run)
                return Failed(error=overrun, code="snapshot_limit_exceeded", telemetry=telemetry, output=output)
            if self._shared is not None:
                try:
                    refused = self._shared.suspend(run)
                except CodemodeError as e:
                    self.retire(run)
                    message = f"code mode run store failed: {e}"
                    return Failed(error=message, code="internal_error", telemetry=telemetry, output=output)
                if refused is not None:
                    self.retire(run)
                    return Failed(error=refused, code="invalid_input", telemetry=telemetry, output=output)
            refused = self._runs.suspend(run)
            if refused is not None:
                self.retire(run)
                return Failed(error=refused, code="invalid_input", telemetry=telemetry, output=output)
            self._start_sweeper()
            waiting = Waiting(
                run_id=run.run_id,
                reason=step.reason,
                telemetry=telemetry,
                pending_tool_calls=run.pending_calls(),
                output=output,
                replay_safe=run.journal.restart_safe,
            )
            return waiting
        self.retire(run)
        if step.status == "completed":
            if step.store_writes is not None and run.store_key is not None:
                try:
                    self._stored.commit(run.store_key, step.store_writes)
                except StoreLimitError as e:  # the cell's own doing: it stored too much
                    return Failed(error=f"store commit refused: {e}", code="invalid_input", telemetry=telemetry)
                except StoreError as e:
                    return Failed(error=f"store commit failed: {e}", code="internal_error", telemetry=telemetry)
            return Completed(value=value, telemetry=telemetry, output=output)
        error, code_ = failure_text(step.failure, output, run.journal.limits.max_output_bytes)
        return Failed(error=error, code=code_, telemetry=telemetry, output=output)

    def file_imported(self, run: Run) -> None:
        """Files a run imported from a journal as suspended (`CodemodeError` if the table
        refuses it)."""
        refused = self._runs.suspend(run)
        if refused is not None:
            raise CodemodeError(refused)
        self._live[run.run_id] = run

    def retire(self, run: Run) -> None:
        """A run is over (or abandoned): leave the table, free its runtime, cancel its tools."""
        self._runs.remove(run)
        self._end_run(run)

    def sweep(self) -> None:
        for run in self._runs.expired():
            self._end_run(run)

    def _sweep_shared(self) -> None:
        """Copies resident here whose run is over elsewhere (or expired) end; stale ones go."""
        assert self._shared is not None
        gone, stale = self._shared.sweep([run for run in self._runs.all() if not run.busy])
        for run in gone:
            if self._runs.take_idle(run):
                run.aborted = True
                self._end_run(run)
        for run in stale:
            if self._runs.take_idle(run):
                self._stale(run)

    def _end_run(self, run: Run) -> None:
        """Frees what a run out of the table still holds: its runtime, its tools, its approvals
        (and its row in a shared run store)."""
        if self._live.get(run.run_id) is run:
            del self._live[run.run_id]
        self._supervisor.drop(run)
        run.dispatcher.close()
        run.dispatcher.approvals.clear()
        if self._shared is not None:
            self._shared.forget(run)

    def _start_sweeper(self) -> None:
        """Expires suspended runs on time even when nobody calls (their tool tasks get cancelled)."""
        if self._sweeper is not None:
            return
        interval = min(1.0, self._config.snapshot_ttl_seconds / 2)

        def loop() -> None:
            while not self._sweep_stop.wait(interval):
                self.sweep()
                if self._shared is not None:
                    try:
                        self._sweep_shared()
                    except CodemodeError:
                        _log.exception("code mode: sweeping the shared run store failed (retrying)")

        self._sweeper = threading.Thread(target=loop, name="codemode-sweeper", daemon=True)
        self._sweeper.start()

    def approve(self, scope: Scope, run_id: str, call_id: str | int, ok: bool, reason: str | None) -> None:
        """`CodeMode.approve`."""
        run = self._live.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.aborted:
            raise ApprovalError(UNAVAILABLE)
        if run.scope != scope:
            raise ApprovalError(FOREIGN)
        number = call_number(call_id)
        if number is None:
            raise ApprovalError(f"a call id is `call_<n>`, as pendingToolCalls names it, not {call_id!r}")
        if not isinstance(ok, bool):
            raise ApprovalError("`ok` must be a bool: True approves the call, False rejects it")
        text = "" if reason is None else catalog.bounded_text(str(reason), MAX_REASON_CHARS)
        run.dispatcher.approvals.decide(number, ok, text)
        self._supervisor.release_decided(run)

    def pending_approvals(self, session_id: str | None) -> list[ApprovalRequest]:
        """`CodeMode.pending_approvals`."""
        requests: list[ApprovalRequest] = []
        for run in list(self._live.values()):
            if session_id is not None and run.scope[0] != session_id:
                continue
            if run.dispatcher.approvals and not run.aborted:
                requests.extend(run.dispatcher.approvals.requests(run.scope[0], run.scope[1], run.run_id))
        return requests

    def cancel(self, scope: Scope, run_id: str) -> bool:
        """`CodeMode.cancel` (with a shared run store: wherever the run is resident)."""
        if self._shared is not None:
            if not isinstance(run_id, str) or not self._shared.cancel(run_id, scope):
                return False
            local = self._runs.get(run_id)
            if local is not None and self._runs.take_idle(local):
                local.aborted = True
                self._end_run(local)
            return True
        try:
            run = self._runs.abort(run_id, scope)
        except RunLookupError:
            return False
        if run is not None:
            self.retire(run)
        return True

    def suspended(self, session_id: str | None = None) -> list[Run]:
        """The suspended runs, of every session or of one (any of its agent runs)."""
        return [r for r in self._runs.all() if session_id is None or r.scope[0] == session_id]

    def close_session(self, scope: Scope) -> None:
        """`Session.close`: aborts every suspended run of ``scope`` and forgets the full texts of
        its session id's cut outputs (those of every agent run)."""
        run_ids = {run.run_id for run in self._runs.of_scope(scope)}
        if self._shared is not None:
            run_ids.update(self._shared.of_scope(scope))
        for run_id in run_ids:
            self.cancel(scope, run_id)
        self._outputs.drop(scope[0])

    def export(self, run_id: str) -> bytes:
        """`CodeMode.export_run`."""
        for run in self._runs.all():
            if run.run_id == run_id:
                return run.journal.encode()
        raise CodemodeError(f"no suspended run {run_id!r}")

    def close(self) -> None:
        """Stops the sweeper and closes every suspended run's tools (the workers go with the
        supervisor)."""
        self._sweep_stop.set()
        for run in self._runs.drain():
            run.dispatcher.close()
        self._live.clear()
        if self._shared is not None:
            self._shared.close()
