"""Starting a run's tool calls, and where its sync tools run; a result landing queues a settle.

    ReportRouter (a report's calls) ─┐
    Supervisor.resume (held calls) ──┼─> ToolStarter.submit (outside the lock) ──> Dispatcher
    the host's approvals ────────────┘        │
            sync tools, quick last time ──> the waiting caller's own thread (`Waiter.work`)
            sync tools, else ─────────────> a pool (the caller must stay free for its deadline)
            async tools, MCP calls ───────> their loops (which may read the lane: `loop_reading`)
    a result lands (any thread) ──results_ready──> a settle (or a replay) queued for the run

Sync tools never run on a thread that reads a worker: a slow one stalls no other run's reports.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .fleet import Fleet, Out, run_all
from .runs import Phase, Run

if TYPE_CHECKING:
    from .dispatch import InlineCalls
    from .readers import Waiter

__all__ = ["CALLER_TOOL_THREADS", "QUICK_TOOL_S", "SYNC_TOOL_THREADS", "ToolStarter"]

#: A sync tool that took at most this long last time runs on the thread waiting for its run (no
#: hop to the pool); one not yet seen, or slower, runs on the pool, so that the waiting thread
#: stays free to end its `exec` at the deadline whatever the tool does.
QUICK_TOOL_S = 0.005
#: Threads that run the sync tools of ``exec_async`` runs (whose callers have no thread to
#: lend): at most this many sync tools run at once for them; more wait their turn.
SYNC_TOOL_THREADS = 8
#: Threads that run, for `exec`/`wait` callers, the sync tools not known to be quick: each
#: caller's thread waits meanwhile (and ends its call at the deadline), so as many may run at
#: once as there are such callers, up to this.
CALLER_TOOL_THREADS = 256

_log = logging.getLogger(__name__)


class ToolStarter:
    """Starts calls through a run's dispatcher, times sync tools, and owns their pools."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        #: Sync tool id -> how long the last batch of calls with it took (see `quick`).
        self._tool_took: dict[str, float] = {}
        #: Threads for sync tools: of `exec_async` runs and advances (few), and standing in
        #: for `exec` callers whose tools are not known to be quick (as many as such callers).
        self._pools: dict[bool, concurrent.futures.ThreadPoolExecutor] = {}

    def results_ready(self, run: Run) -> None:
        """The dispatcher's listener, on the thread where a result landed: a parked run that
        someone waits for (or that an advance may take on) gets a settle queued."""
        fleet = self._fleet
        out: Out = []
        with fleet.lock:
            if run.phase is not Phase.PARKED or run.aborted or fleet.closed:
                return
            if not run.dispatcher.has_ready():
                # A call was filed for approval: its waiter looks again (`Waiting.budget`).
                if run.waiter is not None:
                    out.append(run.waiter.poke)
            elif run.waiter is None and (
                run.lane is None
                or run.yields
                or run.held
                or run.journal.restart_safe
                or run.stored_version
                or run.step.ended
            ):
                return  # suspended: the next `wait` delivers it (in a shared store, wherever it lands)
            else:
                # Landed on the thread that waits for the run, which reads the reply itself: to
                # an idle worker, the settle goes straight out (`FrameQueue.send_direct`).
                waiter = run.waiter
                sent = (
                    fleet.frames.send_direct(run, "settle", waiter, out)
                    if waiter is not None and waiter.loop is None and waiter.thread == threading.get_ident()
                    else None
                )
                if sent is None:
                    fleet.frames.enqueue(run, "settle" if run.lane is not None else "replay", out)
                elif sent[1]:
                    out.append(functools.partial(fleet.frames.write, *sent))
        run_all(out)

    def release(self, run: Run, out: Out) -> None:
        """Under the lock: starts (outside it) what the host decided on (`approvals`)."""
        approvals = run.dispatcher.approvals
        if not approvals:
            return  # (no call waits for a decision: most runs)
        decided = approvals.take_decided()
        if decided:
            calls = [(call_id, filed.tool_id, "") for call_id, filed, _ in decided]
            start = functools.partial(run.dispatcher.release, decided)
            out.append(functools.partial(self.submit, run, calls, start=start))

    def submit(
        self,
        run: Run,
        calls: list[tuple[int, str, str]],
        counted: bool = False,
        start: Callable[[], InlineCalls | None] | None = None,
    ) -> None:
        """Starts a run's calls (outside the lock); its sync tools go to the thread waiting for
        the run when they were quick last time, else to a pool (the waiting thread must be free
        to end the `exec` at its deadline). ``counted``: in ``run.starting``, which this ends.
        ``start``: what starts them, if not `Dispatcher.submit` (calls released by approvals)."""
        try:
            inline = run.dispatcher.submit(calls) if start is None else start()
        except Exception:  # (a bug: the run must still end, not wait on `starting` for good)
            _log.exception("code mode supervisor: starting calls failed")
            inline = None
        # Each call's catalog id (the guest's own name for it when that is one): never a name
        # the guest made up, so `_tool_took` holds at most one entry per tool.
        resolved, known = run.dispatcher.resolved, run.dispatcher.view.tools
        tools = [tool for call_id, name, _ in calls if (tool := resolved.get(call_id, name)) in known]
        out: Out = []
        pool = None
        lent = here = False
        with self._fleet.lock:
            if counted:
                run.starting -= 1
            waiter = run.waiter
            if inline is None:
                if counted and waiter is not None:
                    waiter.poke()  # (it may have slept through its deadline meanwhile)
                self._fleet.loop_reading.hand_to_loop(run, out)
            elif waiter is not None and waiter.loop is None and self.quick(tools):
                here = self._lone_on_this_thread(run, waiter, out)
                if not here:
                    # Its own thread runs them, once it is done with what it is doing now (when
                    # that is reading for other runs, with their actions: none waits for these).
                    waiter.work.append(functools.partial(self._timed, run, inline, tools, False))
                    waiter.event.set()
                    return
            else:
                lent = waiter is not None and waiter.loop is None
                if lent:
                    run.lent += 1
                    run.lent_at = time.monotonic()
                pool = self._pool(lent)
        run_all(out)
        if here and inline is not None:
            try:
                self._timed(run, inline, tools, False)
            finally:
                waiter.busy = False  # (the loop sets it again, under the lock, when it looks)
            return
        if inline is not None and pool is not None:
            try:
                pool.submit(self._timed, run, inline, tools, lent)
            except RuntimeError:
                pass  # closed: the run has gone with it

    def run_here(self, run: Run, calls: list[tuple[int, str, str]], tools: list[str]) -> None:
        """Starts the run's calls on this thread, each a sync tool (``tools``, as
        `Dispatcher.plain_sync_tools` found them) that was quick last time: they run here, at
        once (`Dispatcher.run_plain`), their results ready for the run, and how long they took
        is remembered before the caller sends those (`Supervisor._lease_calls`)."""
        started = time.perf_counter()
        try:
            run.dispatcher.run_plain(calls, tools)
        finally:
            self._took(tools, time.perf_counter() - started)

    def _took(self, tools: list[str], took: float) -> None:
        """A batch with these sync tools (catalog ids: one entry each) took ``took`` seconds."""
        for tool in tools:
            self._tool_took[tool] = took

    def _lone_on_this_thread(self, run: Run, waiter: Waiter, out: Out) -> bool:
        """Under the lock: whether the run's quick sync tools may run right here, on its
        waiting thread, now: it is reading the run's worker for this run alone (nothing else in
        flight, queued or waited for there), so it lets go of the lane (as its loop would
        before it ran them) and runs them at once, without a turn of that loop; else they go to
        the thread's work list."""
        lane = run.lane
        if (
            waiter.thread != threading.get_ident()
            or waiter.work
            or lane is None
            or lane.reader is not waiter
            or self._fleet.readers.need_reader(lane, run)
        ):
            return False
        waiter.polling = None
        waiter.busy = True
        self._fleet.readers.release_reader(lane, waiter, out, run)
        return True

    def close(self) -> None:
        """The pools stop (tools running there are not waited for)."""
        with self._fleet.lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)

    def _pool(self, lent: bool) -> concurrent.futures.ThreadPoolExecutor:
        """Under the lock: the pool for callers' tools (``lent``) or for the rest, made once."""
        pool = self._pools.get(lent)
        if pool is None:
            size, name = (
                (CALLER_TOOL_THREADS, "codemode-caller-tools") if lent else (SYNC_TOOL_THREADS, "codemode-sync-tools")
            )
            pool = self._pools[lent] = concurrent.futures.ThreadPoolExecutor(size, name)
        return pool

    def quick(self, tools: list[str]) -> bool:
        """Each of these tools has run, and took at most ``QUICK_TOOL_S`` the last time (the
        last time, not the slowest: one slow moment of a loaded host does not demote a tool
        for good; a tool that is slow stays on the pool)."""
        took = self._tool_took
        limit = QUICK_TOOL_S
        for tool in tools:  # (a loop, not all() over a generator: this runs before every quick call)
            if took.get(tool, limit + 1) > limit:
                return False
        return bool(tools)

    def _timed(self, run: Run, inline: InlineCalls, tools: list[str], lent: bool) -> None:
        """Runs a batch of sync tools and remembers, for each, how long the batch took (before
        their results land: the run's next call may start at once, and asks `quick`).
        ``lent``: on the pool for the run's waiting thread (counted in ``run.lent``)."""
        started = time.perf_counter()
        timed = False

        def ran() -> None:
            nonlocal timed
            timed = True
            self._took(tools, time.perf_counter() - started)

        try:
            inline(ran)
        finally:
            if not timed:
                ran()
            if lent:
                with self._fleet.lock:
                    run.lent -= 1
