"""Routing a worker's frames to the run whose frame it was executing.

    Readers.pump ──route──> Ready        the worker is up: its first queued frame goes
                            Fault        the run's runtime could not be built: it fails
                            Report ─┬─ of a replay       `replayed`: the calls must be the journal's
                                    ├─ completed|failed  the step ends, its waiter is woken
                                    └─ pending ─┬─ no one waits (an advance)  `advanced`: calls held
                                                └─ a waiter                   `parked`: calls start

Every frame is untrusted: one that answers nothing in flight, names another run, or reports more
calls than an engine may have open raises ``ProtocolError`` and the worker is discarded (its
culprit fails ``internal_error``, every other run on it is replayed elsewhere).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from . import protocol
from ._engine import YIELD_TOOL
from .errors import ProtocolError
from .fleet import Fleet, Out, drop_engine_run, failed, send_drop
from .protocol import Fault, Ready, Report, input_hash, utf8_len
from .runs import Failure, JournalCall, Phase, Run
from .workers import Inflight, Lane

__all__ = ["ReportRouter", "journal_calls"]


def journal_calls(run: Run, report: Report) -> list[tuple[int, str, str]]:
    """Journals the calls ``report`` started; returns the tool calls among them ``(call_id,
    tool, input)`` (a ``yield_control`` joins the run's yields instead)."""
    journal = run.journal
    calls = []
    for call_id, tool, data, method in report.calls:
        journal.calls.append(JournalCall(call_id, tool, input_hash(data), method))
        if tool == YIELD_TOOL:
            run.yields.append(call_id)
            continue
        calls.append((call_id, tool, data))
        if journal.restart_safe:
            journal.open_inputs[call_id] = data
            run.journal_bytes += utf8_len(data)
    return calls


def _divergence(expected: list[protocol.Call], got: list[protocol.Call], status: str) -> str:
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return f"call {i + 1} was {have[1]} (input {have[2][:8]}), the journal has {want[1]} (input {want[2][:8]})"
    if len(got) != len(expected):
        return f"the replay made {len(got)} tool call(s), the journal has {len(expected)}"
    return f"the replay ended {status} before reaching the suspension point"


class ReportRouter:
    """Under the fleet's lock: what each frame from a worker does to its run."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def route(self, lane: Lane, frame: protocol.WorkerFrame, decoded: Any, out: Out) -> None:
        """One frame from a worker, to the run whose frame it was executing (``decoded``: its
        guest JSON, decoded outside the lock, or why it is too heavy)."""
        fleet, frames = self._fleet, self._fleet.frames
        inflight = lane.inflight
        if isinstance(frame, Ready):
            if inflight is None or inflight.kind != "ready":
                raise ProtocolError(f"worker {lane.pid} introduced itself twice")
            out.append(lane.worker.booted)
            frames.next_in_pipeline(lane)
            frames.kick(lane, out)
            if fleet.primer is not None and lane.configured is None and frames.idle(lane):
                # (One configured while it started has it, and a catalog changed since is sent
                # by the re-prime that change scheduled: see `Supervisor.catalog_changed`.)
                out.append(functools.partial(frames.prime, lane))
            return
        if isinstance(frame, Fault) and frame.run == 0:
            raise ProtocolError(f"worker {lane.pid} refused its configuration: {frame.message}")
        if inflight is not None and inflight.kind == "lease":
            self._abandoned(lane, frame, out)
            return
        run = inflight.run if inflight is not None else None
        if inflight is None or run is None or frame.run != run.engine_run:
            raise ProtocolError(f"worker {lane.pid} answered out of order")
        if isinstance(frame, Report) and frame.status == "pending":
            if len(frame.calls) > run.journal.limits.max_pending_calls:
                # An engine never has more calls in flight: this worker is not one of ours.
                raise ProtocolError(f"worker {lane.pid} reported more calls than maxPendingToolCalls")
        run.drive_s = time.monotonic() - inflight.sent
        frames.next_in_pipeline(lane)
        if isinstance(frame, Fault):
            fleet.forget(run)
            message = f"code mode runtime is unavailable: {frame.message}"
            fleet.end(run, "failed", out, failure=failed("runtime_unavailable", "WorkerUnavailable", message))
        elif not isinstance(frame, Report):
            raise ProtocolError(f"worker {lane.pid} sent {type(frame).__name__} unasked")
        elif run.aborted:
            if frame.status == "pending":
                send_drop(lane, run, out)
            fleet.forget(run)
        elif inflight.kind == "replay":
            self._replayed(lane, run, frame, inflight, out)
        else:
            self._reported(lane, run, frame, decoded, out)
        frames.kick(lane, out)
        fleet.retire_if_done(lane, out)

    def _abandoned(self, lane: Lane, frame: protocol.WorkerFrame, out: Out) -> None:
        """The reply to a cell's first step whose caller was interrupted before it read it
        (`Supervisor.first_step`): no run waits for it; a runtime it left parked is dropped."""
        fleet, frames = self._fleet, self._fleet.frames
        if not isinstance(frame, (Report, Fault)):
            raise ProtocolError(f"worker {lane.pid} sent {type(frame).__name__} unasked")
        if isinstance(frame, Report) and frame.status == "pending":
            drop_engine_run(lane, frame.run, out)
        frames.next_in_pipeline(lane)
        frames.kick(lane, out)
        fleet.retire_if_done(lane, out)

    def counted(self, run: Run, report: Report) -> None:
        """Under the lock: what a report of the run says it did, counted (its step's reports,
        searches and memory, the clock reads its journal replays)."""
        step = run.step
        run.placements = run.stillborn = 0  # it got somewhere: a later death is a new one
        step.reports += 1
        step.searches += report.searches
        step.describes += report.describes
        step.memory_bytes = report.memory_bytes
        self._fleet.set_memory(run, report.memory_bytes)
        run.journal.clock_reads.extend(report.clock_reads)

    def _reported(self, lane: Lane, run: Run, report: Report, decoded: Any, out: Out) -> None:
        fleet = self._fleet
        step = run.step
        if isinstance(decoded, str):
            if report.status == "pending":
                send_drop(lane, run, out)
            fleet.forget(run)
            fleet.end(run, "failed", out, failure=failed("output_limit_exceeded", "OutputLimitError", decoded))
            return
        outputs, value, writes = decoded
        self.counted(run, report)
        step.outputs.extend(outputs)
        if report.status == "completed":
            step.value, step.store_writes = value, writes
            fleet.forget(run)
            fleet.end(run, "completed", out)
            return
        if report.status == "failed":
            fleet.forget(run)
            failure = Failure(*report.failure) if report.failure is not None else None
            fleet.end(run, "failed", out, failure=failure)
            return
        run.phase = Phase.PARKED
        calls = journal_calls(run, report)
        if run.waiter is None:
            self._advanced(lane, run, calls, out)
        else:
            self._parked(run, calls, out)

    def _advanced(self, lane: Lane, run: Run, calls: list[tuple[int, str, str]], out: Out) -> None:
        """A run that parked while no one waits for it (an advance): nothing the host would see
        starts before the model asks for it. The run stays suspended, so the snapshot limit
        holds here as at any suspension."""
        fleet = self._fleet
        overrun = run.snapshot_overrun(fleet.max_snapshot)
        if overrun is not None:
            send_drop(lane, run, out)
            fleet.forget(run)
            fleet.end(run, "failed", out, failure=failed("snapshot_limit_exceeded", "SnapshotLimitError", overrun))
            return
        run.held.extend(calls)
        if run.yields:
            run.step.status, run.step.reason = "suspended", "yield"
        elif not run.held and run.dispatcher.has_ready():
            fleet.frames.enqueue(run, "settle", out)

    def _parked(self, run: Run, calls: list[tuple[int, str, str]], out: Out) -> None:
        """A run that parked on ``calls`` (and yields) while its waiter waits: its calls start,
        and it suspends, settles what is ready, or goes on waiting."""
        fleet = self._fleet
        journal, step = run.journal, run.step
        if calls:
            step.tool_calls += len(calls)
            run.starting += 1
            out.append(functools.partial(fleet.tool_starts.submit, run, calls, True))
        if run.yields:
            fleet.end(run, "suspended", out, reason="yield")
        elif journal.restart_safe:
            # Restart-safe runs are never drained within the call (the spec), not even by a
            # tool that answered at once: each result goes through a `wait`.
            fleet.end(run, "suspended", out, reason="pending_tools")
        elif run.dispatcher.has_ready():
            fleet.frames.enqueue(run, "settle", out)
        elif run.awaits_only_approvals():
            fleet.end(run, "suspended", out, reason="pending_tools")
        elif time.monotonic() >= step.deadline:
            # Past the deadline: suspended by its waiter, once its sync tools (which run on
            # the waiter's thread) have had their turn: a guest whose tools answer at once is
            # still running, and the kill ends it.
            assert run.waiter is not None
            out.append(run.waiter.poke)

    def _replayed(self, lane: Lane, run: Run, report: Report, inflight: Inflight, out: Out) -> None:
        fleet = self._fleet
        journal, step = run.journal, run.step
        expected = [(c.id, c.tool, c.input_hash, c.method) for c in journal.calls]
        got = list(report.calls)
        if report.status != "pending" or got != expected:
            if report.status == "pending":
                send_drop(lane, run, out)
            fleet.forget(run)
            message = f"code mode run diverged on replay: {_divergence(expected, got, report.status)}"
            fleet.end(run, "failed", out, failure=failed("internal_error", "DivergenceError", message))
            return
        run.placements = run.stillborn = 0
        fleet.set_memory(run, report.memory_bytes)
        step.memory_bytes = report.memory_bytes
        run.phase = Phase.PARKED
        # Rebuilding is not the guest's time: its budget goes on once the runtime is back.
        step.deadline += time.monotonic() - inflight.sent
        if run.dispatcher.has_ready():
            fleet.frames.enqueue(run, "settle", out)
        elif run.waiter is not None and run.awaits_only_approvals():
            fleet.end(run, "suspended", out, reason="pending_tools")
        elif run.waiter is not None:
            # Parked again: its waiter, which may have gone to sleep until the replay's kill
            # time, looks now (it suspends the run if its deadline has passed meanwhile; a tool
            # answering later would find it past its deadline, as if it had run all along).
            out.append(run.waiter.poke)
