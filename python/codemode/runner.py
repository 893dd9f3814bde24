"""The run lifecycle of ``exec`` and ``wait``: admit the call, make or claim the run, drive it on
the supervisor, and end it in a defined state, whatever happens in the host meanwhile.

One ``exec`` (``wait`` is the same from the claim on)::

    Session.exec ──Runner.exec──> closed? sweep ──check_cell (cells)──> the model's exec hook
        ──> MCP listings (mcp_listing: new servers only) ──RunFactory.new_run──> LiveRuns.add
        ──Supervisor.start (worker: engine start, tool calls dispatched, drained)──> Step
        ──LiveRuns.finish──> Completed | Waiting (filed in the table) | Failed
    Session.wait ──Runner.wait──> answer_json ──LiveRuns.claim──> configuration (the run's own
        catalog for a replay) ──Supervisor.resume──> Step ──LiveRuns.finish──> result

A bad argument is a ``failed`` result (``invalid_input``), never an exception; so is a failure in
the host while a run is driven (``internal_error``: `_broken`), and an interrupt retires the run
before it goes on up. The sync forms run the tools' async calls on the background loop, the
``_async`` ones on the caller's loop. Each call is one tracing span (`tracing.traced`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from . import tracing
from .call_gate import Blocked, Gate, apply_hook
from .cells import CellArgs, answer_json, check_cell, check_seed
from .config import CodeModeConfig
from .errors import ClosedError
from .live_runs import LiveRuns
from .mcp_listing import McpListing
from .outcomes import Failed, Result
from .policy import ToolCallEvent
from .protocol import Configure
from .run_factory import RunFactory
from .runs import Run, RunLookupError, RunLost, Scope, Step
from .supervisor import Supervisor
from .tools import BackgroundLoop

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from .session import Session

__all__ = ["Runner"]

_log = logging.getLogger(__name__)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _exec_event(session: Session, args: Any, language: str) -> ToolCallEvent:
    """The model's ``exec`` call itself, as the spec's hook event for it."""
    return ToolCallEvent(
        tool_id="exec",
        name="exec",
        source="codemode",
        owner="codemode",
        input=args,
        session_id=session.session_id,
        parent="",
        tool_kind="code_mode_exec",
        tool_input_kind=language,
    )


class Runner:
    """Runs the cells of one ``CodeMode``'s sessions over its supervisor."""

    def __init__(
        self,
        config: CodeModeConfig,
        factory: RunFactory,
        live: LiveRuns,
        supervisor: Supervisor,
        gate: Gate,
        mcp: McpListing,
        loop: BackgroundLoop,
        tracer: Tracer | None,
    ) -> None:
        self._config = config
        self._factory = factory
        self._live = live
        self._supervisor = supervisor
        self._gate = gate
        self._mcp = mcp
        self._loop = loop
        #: Read by `tracing.traced` (the spans of exec and wait).
        self.tracer = tracer
        self.closed = False

    @tracing.traced("exec")
    def exec(self, session: Session, args: Any, *, min_timeout_ms: int = 0, outer_hook: bool = False) -> Result:
        """Runs one cell of ``session`` (its tools' async calls on the background loop).
        ``outer_hook``: the call is the model's, and the hook sees it first."""
        loop = self._loop.get
        started = time.perf_counter()
        checked = self._admit(started, args)
        if isinstance(checked, Failed):
            return checked
        if outer_hook and self._gate.hook is not None:
            # The model's `exec` call itself, as the spec's hook event for it (it may block or
            # rewrite the cell, e.g. through the `command` alias).
            decision = self._gate.hook(_exec_event(session, args, checked.language))
            if inspect.isawaitable(decision):
                decision = asyncio.run_coroutine_threadsafe(_awaited(decision), loop()).result()
            checked = self._hooked(started, args, decision, checked)
            if isinstance(checked, Failed):
                return checked
        if self._mcp.servers is not None:
            self._mcp.refresh()
        cell = self._factory.cell(session, checked, loop, min_timeout_ms)
        lease = None
        try:
            if cell.output_chars is None:  # (a text budget may cut even a plain value: as a run)
                lease = self._supervisor.first_step(cell.start, cell.configure, cell.session.session_id)
                if lease is not None and lease.report is not None:
                    return self._live.first_result(cell, lease.report, lease.value, started)
            run = self._factory.run_for(cell)
            self._live.add(run)
        except BaseException as e:
            if lease is not None and lease.report is None:
                self._supervisor.abandon(lease)  # (no run will take it over)
            if not isinstance(e, Exception):
                raise
            return self._broken(None, started, e)
        drive = self._supervisor.start if lease is None else functools.partial(self._supervisor.take_over, lease)
        return self._driven(run, started, "exec", drive, cell.configure, cell.timeout_ms)

    @tracing.traced("exec")
    async def exec_async(
        self,
        session: Session,
        args: Any,
        *,
        min_timeout_ms: int = 0,
        outer_hook: bool = False,
        seed: int | None = None,
    ) -> Result:
        """`exec` as a coroutine on the caller's loop (its async tools, and an async hook, run
        there too)."""
        check_seed(seed)
        started = time.perf_counter()
        checked = self._admit(started, args)
        if isinstance(checked, Failed):
            return checked
        if outer_hook and self._gate.hook is not None:
            decision = self._gate.hook(_exec_event(session, args, checked.language))
            if inspect.isawaitable(decision):
                decision = await decision
            checked = self._hooked(started, args, decision, checked)
            if isinstance(checked, Failed):
                return checked
        if self._mcp.servers is not None:
            await self._mcp.refresh_async()
        loop = asyncio.get_running_loop()
        run, configure = self._factory.new_run(session, checked, lambda: loop, min_timeout_ms, seed)
        self._live.add(run)
        return await self._driven_async(
            run, started, "exec", self._supervisor.start_async(run, configure, run.timeout_ms)
        )

    @tracing.traced("wait")
    def wait(self, session: Session, args: Any) -> Result:
        """Resumes a suspended run of ``session`` (``{"runId", "answer"?}``)."""
        started = time.perf_counter()
        claimed = self._claim(session, args, started)
        if isinstance(claimed, Failed):
            return claimed
        run, configure, answer = claimed
        return self._driven(run, started, "wait", self._supervisor.resume, configure, run.timeout_ms, answer)

    @tracing.traced("wait")
    async def wait_async(self, session: Session, args: Any) -> Result:
        """`wait` as a coroutine on the caller's loop."""
        started = time.perf_counter()
        claimed = self._claim(session, args, started)
        if isinstance(claimed, Failed):
            return claimed
        run, configure, answer = claimed
        return await self._driven_async(
            run, started, "wait", self._supervisor.resume_async(run, configure, run.timeout_ms, answer)
        )

    def import_run(self, data: bytes, session_id: str) -> str:
        """`CodeMode.import_run`: files the run, then redoes its open calls here."""
        run, redo = self._factory.imported(data, session_id)
        self._live.file_imported(run)
        inline = run.dispatcher.submit(redo)
        if inline is not None:
            inline()
        return run.run_id

    def close_session(self, scope: Scope) -> None:
        """`Session.close` (`LiveRuns.close_session`)."""
        self._live.close_session(scope)

    def _invalid(self, started: float, message: str) -> Failed:
        return Failed(error=message, code="invalid_input", telemetry=self._live.telemetry(started, None))

    def _admit(self, started: float, args: Any) -> CellArgs | Failed:
        if self.closed:
            raise ClosedError("this CodeMode is closed")
        # (No sweep here either: the sweeper expires runs on time, and an expired run holds
        # no slot in the table, see `RunTable.suspend`.)
        checked = check_cell(args, self._config.languages)
        return self._invalid(started, checked) if isinstance(checked, str) else checked

    def _hooked(self, started: float, args: Any, decision: Any, checked: CellArgs) -> CellArgs | Failed:
        try:
            rewritten = apply_hook(decision, args)
        except Blocked as e:
            return self._invalid(started, f"code mode exec blocked: {e.reason}")
        return checked if rewritten is args else self._admit(started, rewritten)

    def _claim(self, session: Session, args: Any, started: float) -> tuple[Run, Configure, str] | Failed:
        """The run a `wait` resumes (marked resuming), the configuration a replay needs, and
        the JSON its yields are answered with."""
        if self.closed:
            raise ClosedError("this CodeMode is closed")
        # (No sweep here: the sweeper expires runs, and `claim` refuses an expired one.)
        run_id = args.get("runId") if isinstance(args, dict) else None
        if not isinstance(run_id, str) or not run_id:
            return self._invalid(started, "wait requires a `runId` string.")
        try:
            answer = answer_json(args.get("answer"))
        except ValueError as e:
            return self._invalid(started, str(e))
        try:
            run = self._live.claim(run_id, session.scope)
        except RunLookupError as e:
            return self._invalid(started, str(e))
        except RunLost as e:
            return Failed(error=str(e), code="internal_error", telemetry=self._live.telemetry(started, None))
        try:
            run.dispatcher.parent = self._factory.next_parent("wait")
            run.dispatcher.span = tracing.run_span(run_id)
            # A replay must see the catalog the run started with (the journal records which),
            # whatever the catalog is now.
            configure = self._factory.configure_for(run)
        except Exception as e:
            return self._broken(run, started, e)
        return run, configure, answer

    def _driven(self, run: Run, started: float, kind: str, drive: Callable[..., Step], *args: Any) -> Result:
        """``run``'s step (``drive(run, *args)``) as the spec's result. Whatever goes wrong in the
        host meanwhile, the run ends in a defined state: a failure is `_broken`; an interrupt
        retires it, then goes on up (nothing of the run is left running, its slot is free)."""
        try:
            return self._live.finish(run, drive(run, *args), started, kind)
        except Exception as e:
            return self._broken(run, started, e)
        except BaseException:
            self._live.retire(run)
            raise

    async def _driven_async(self, run: Run, started: float, kind: str, drive: Awaitable[Step]) -> Result:
        """`_driven` for a coroutine's step (a cancel retires the run)."""
        try:
            return self._live.finish(run, await drive, started, kind)
        except Exception as e:
            return self._broken(run, started, e)
        except BaseException:
            self._live.retire(run)
            raise

    def _broken(self, run: Run | None, started: float, error: Exception) -> Failed:
        """Something in the host failed while it drove ``run`` (a bug, or a hostile value that
        got past every check; no run: a cell's first step, `Supervisor.first_step`): the run
        ends and frees its slot, and the caller gets a failed result, never the exception."""
        _log.exception("code mode: run %s failed in the host", run.run_id if run is not None else "(first step)")
        if run is not None:
            self._live.retire(run)
        message = f"code mode failed in the host: {type(error).__name__}"
        return Failed(error=message, code="internal_error", telemetry=self._live.telemetry(started, None))
