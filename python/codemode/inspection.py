"""What a ``CodeMode`` holds right now, for tests and dashboards: a read-only snapshot.

The worker pool, the supervisor and the run table are internals; their fields change as the
host runs. ``CodeMode.inspect()`` copies what an observer may rely on into frozen structs, so a
test pins behaviour (a worker was killed and replaced; an advance took a suspended run on)
without reaching into private attributes::

    Supervisor.worker_pids / spawned / killed ─┐
    LiveRuns.suspended ── Supervisor.progress ─┴──> Inspection(workers, runs)
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .runs import Run
from .supervisor import Supervisor

__all__ = ["Inspection", "RunState", "snapshot"]


class RunState(msgspec.Struct, frozen=True):
    """One suspended run."""

    run_id: str
    session_id: str
    agent_run: str | None
    #: Where its step is: ``running`` (a frame of it in a worker, or queued for one), ``parked``
    #: (on tools, a ``wait``, or held calls), or how an advance ended it (``completed``, ``failed``).
    progress: str


class Inspection(msgspec.Struct, frozen=True):
    """A ``CodeMode`` at one moment."""

    #: The process ids of the live worker processes, in lane order.
    worker_pids: tuple[int, ...]
    #: Worker processes started since the ``CodeMode`` was made (replacements included).
    workers_spawned: int
    #: Workers SIGKILLed by the deadline backstop (a cell that did not answer in time).
    workers_killed: int
    #: The suspended runs, of every session.
    suspended_runs: tuple[RunState, ...]

    def run(self, run_id: str) -> RunState | None:
        """The suspended run ``run_id``, or None."""
        return next((r for r in self.suspended_runs if r.run_id == run_id), None)


def snapshot(supervisor: Supervisor, suspended: Iterable[Run]) -> Inspection:
    """A snapshot of ``supervisor`` and the ``suspended`` runs."""
    runs = tuple(RunState(r.run_id, r.scope[0], r.scope[1], supervisor.progress(r)) for r in suspended)
    return Inspection(tuple(supervisor.worker_pids()), supervisor.spawned, supervisor.killed, runs)
