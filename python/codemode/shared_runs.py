"""Suspended runs that any host process on one run store can resume (``CodeMode(runs=...)``).

What one host does with the store (`run_store.RunStore`)::

    step suspends ──suspend──> row (journal, scope, TTL; version + 1) + a row per call started here
                               then every result landing here ──sink──> its call's row
    wait(runId) ──claim (lease)──> same version as the copy resident here: the fast path
                              └──> else: rebuild from the journal (the next drive replays it),
                                   results found in call rows delivered, the rest watched
    watcher (its thread) ──> results that land in other hosts' call rows, delivered; a call
                             whose host stopped: redone here if the run is restart-safe, else
                             the run fails (its result is lost, and the failure says so)
    heartbeat (same thread) ──> this host is alive; expired runs leave the store
    step completes / fails, cancel, expiry ──> the row goes

A resident copy another host has since resumed is *stale*: its runtime is dropped, but its
dispatcher lives on while its calls run (an *orphan*), so their results still reach their rows.
Advances (a result settled into a suspended runtime) are off for stored runs: a result stays
ready until the ``wait`` that delivers it, wherever that is.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable

from .errors import CodemodeError, StoreError
from .fleet import failed
from .protocol import CallResult
from .run_store import HEARTBEAT_S, CallRow, RunMeta, RunStore
from .runs import Run, RunLookupError, RunLost, Scope
from .supervisor import Supervisor

__all__ = ["WATCH_POLL_S", "SharedRuns"]

_log = logging.getLogger(__name__)

#: How often the watcher looks for results of calls other hosts run.
WATCH_POLL_S = 0.02

#: Why a suspension could not be filed: another host resumed the run meanwhile.
TAKEN_OVER = "code mode run was resumed by another process meanwhile."


#: A run whose ``wait`` died with its host: calls it started since the run's last suspension
#: are unknown, so only a restart-safe run (read-only tools, which may run again) goes on.
ABANDONED = (
    "code mode run was being resumed by a host process that stopped: the calls it started since the run "
    "last suspended are lost. Only restartSafe runs go on from there."
)


def _lost(call_id: int, tool: str) -> str:
    return (
        f"code mode run lost the result of call_{call_id} ({tool}): the host process that ran it stopped. "
        "Only restartSafe runs redo such calls."
    )


def _open_calls(run: Run) -> dict[int, str]:
    """The run's calls made and not settled (yields aside): id -> tool."""
    settled = run.journal.settled_ids()
    return {c.id: c.tool for c in run.journal.calls if c.id not in settled and c.id not in run.yields}


def _meta(run: Run) -> RunMeta:
    counts = run.counts
    return RunMeta(
        run.scope[0],
        run.scope[1],
        None if run.store_key is None else run.store_key[1],
        run.timeout_ms,
        run.output_chars,
        counts.tool_calls,
        counts.searches,
        counts.describes,
    )


class SharedRuns:
    """This host's side of a shared run store: filing, claiming, watching, heartbeat.

    ``rebuild`` makes a run from a stored journal (`RunFactory.rebuilt`); ``limit`` and
    ``per_session`` are the suspended-run caps, held store-wide."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        supervisor: Supervisor,
        rebuild: Callable[[str, RunMeta, bytes], Run],
        *,
        ttl_s: float,
        limit: int,
        per_session: int,
    ) -> None:
        self.host_id = "host_" + secrets.token_urlsafe(9)
        self._store = RunStore(target, self.host_id)
        try:
            self._store.beat()
        except BaseException:
            self._store.close()
            raise
        self._supervisor = supervisor
        self._rebuild = rebuild
        self._ttl_s = ttl_s
        self._limit = limit
        self._per_session = per_session
        self._lock = threading.Lock()
        #: Runs resident here with calls other hosts run: run id -> (run, call id -> tool).
        self._watched: dict[str, tuple[Run, dict[int, str]]] = {}
        #: Stale copies whose calls still run here: run id -> their runs.
        self._orphans: dict[str, list[Run]] = {}
        #: Results landed here for stored calls, to write (``(run id, result)``).
        self._writes: list[tuple[str, CallResult]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="codemode-run-store", daemon=True)
        self._thread.start()

    # ---- a step ends ----------------------------------------------------------------------
    def suspend(self, run: Run) -> str | None:
        """Files a suspended run in the store (its first suspension, or one after a claim);
        the reason it may not stay suspended, or None. ``StoreError`` if the store failed."""
        open_calls = _open_calls(run)
        approvals = run.dispatcher.approvals
        undecided = approvals.undecided() if approvals else set()
        ready = {result.call_id: result for result in run.dispatcher.ready()}
        # Calls started here: new ones get a row, and ones already there their result if it landed.
        mine = [i for i in open_calls if run.stored_calls.get(i, self.host_id) == self.host_id and i not in undecided]
        calls = [(i, ready.get(i)) for i in mine]
        settled = [i for i in run.stored_calls if i not in open_calls]
        journal = run.journal.encode()
        if run.stored_version == 0:
            refused = self._store.insert(
                run.run_id, run.scope, _meta(run), journal, self._ttl_s, calls, self._limit, self._per_session
            )
            if refused is not None:
                return refused
        elif not self._store.update(run.run_id, run.stored_version, _meta(run), journal, self._ttl_s, calls, settled):
            run.stored_version = 0  # (the row is the other host's now: it is not deleted from here)
            return TAKEN_OVER
        run.stored_version += 1
        for i in settled:
            del run.stored_calls[i]
        for i in mine:
            run.stored_calls[i] = self.host_id
        # From now on every result landing here goes to its row too; those that landed since
        # `ready` was read are written now (a write of an answered call changes nothing).
        run.dispatcher.sink = functools.partial(self._landed, run)
        late = [r for r in run.dispatcher.ready() if r.call_id not in ready]
        if late:
            self._landed(run, late)
        return None

    def forget(self, run: Run) -> None:
        """The run is over here and everywhere (completed, failed, cancelled, expired): its row
        goes, and nothing of it is watched."""
        run.dispatcher.sink = None
        with self._lock:
            self._watched.pop(run.run_id, None)
        if run.stored_version:
            run.stored_version = 0
            try:
                self._store.delete(run.run_id)
            except StoreError:
                _log.exception("code mode: could not delete run %s from the run store (it expires there)", run.run_id)

    # ---- a wait begins --------------------------------------------------------------------
    def claim(self, run_id: str, scope: Scope, local: Run | None) -> Run:
        """The run a ``wait`` resumes, with its lease held here: ``local`` when that copy is
        current, else one rebuilt from the journal. ``RunLookupError`` in the spec's words if it
        cannot be had; ``RunLost`` (the run is over) if a result it needs is gone."""
        try:
            claimed = self._store.claim(run_id, scope, local.stored_version if local is not None else 0)
        except StoreError as e:
            raise RunLookupError(f"code mode run store failed: {e}") from None
        try:
            if claimed.journal is None and local is not None:
                run = local
            else:
                try:
                    run = self._rebuild(run_id, claimed.meta, claimed.journal or b"")
                except CodemodeError as e:
                    raise RunLookupError(f"code mode run cannot resume in this process: {e}") from None
                run.stored_version = claimed.version
            if claimed.abandoned and not run.journal.restart_safe:
                raise RunLost(ABANDONED)
            run.dispatcher.sink = None  # (held here: what lands stays ready for this wait)
            self._take_calls(run, claimed.calls, rebuilt=run is not local)
        except RunLost:
            self._store.delete(run_id)
            raise
        except BaseException:
            self._release(run_id)
            raise
        return run

    def _take_calls(self, run: Run, rows: list[CallRow], rebuilt: bool) -> None:
        """Delivers what the call rows hold, watches calls other hosts still run, and redoes
        (restart-safe) or gives up on (``RunLost``) calls whose host stopped."""
        by_id = {row.call_id: row for row in rows}
        run.stored_calls.update((row.call_id, row.owner) for row in rows)
        watch: dict[int, str] = {}
        redo: list[tuple[int, str, str]] = []
        found: list[CallResult] = []
        for call_id, tool in _open_calls(run).items():
            row = by_id.get(call_id)
            action = self._action(run, call_id, row, rebuilt)
            if action == "found" and row is not None and row.result is not None:
                found.append(row.result)
            elif action == "watch":
                watch[call_id] = tool
            elif action == "redo":
                redo.append((call_id, tool, run.journal.open_inputs[call_id]))
            elif action == "lost":
                raise RunLost(_lost(call_id, tool))
        if found:
            run.dispatcher.add_ready(found)
        if watch:
            with self._lock:
                self._watched.setdefault(run.run_id, (run, {}))[1].update(watch)
            self._wake.set()
        for call_id, _, _ in redo:
            self._store.adopt(run.run_id, call_id)
            run.stored_calls[call_id] = self.host_id
        if redo:
            inline = run.dispatcher.submit(redo)
            if inline is not None:
                inline()

    def _action(self, run: Run, call_id: int, row: CallRow | None, rebuilt: bool) -> str:
        """What a claim does about one open call: ``skip`` (this copy runs it, or it waits for
        an approval here), ``found`` (its result is in its row), ``watch`` (another host, or an
        orphan here, still runs it), ``redo`` (its host stopped; the run is restart-safe) or
        ``lost``."""
        if row is None:
            if not rebuilt:
                return "skip"
            row = CallRow(call_id, "", None, False)  # (never filed: not started anywhere)
        mine = row.owner == self.host_id
        if mine and not rebuilt:
            return "skip"
        if row.result is not None:
            return "found" if rebuilt else "skip"  # (a copy resident here has it from the watcher)
        if row.alive:
            return "watch"
        if run.journal.restart_safe and call_id in run.journal.open_inputs:
            return "redo"
        return "lost"

    def _release(self, run_id: str) -> None:
        try:
            self._store.release(run_id)
        except StoreError:
            _log.exception("code mode: could not free the lease of run %s (it frees when this host stops)", run_id)

    def release(self, run: Run) -> None:
        """A claimed run was not resumed after all (its ``wait`` failed before driving it)."""
        self._release(run.run_id)

    def cancel(self, run_id: str, scope: Scope) -> bool:
        """Deletes a run of ``scope`` no ``wait`` holds, wherever it is resident."""
        return self._store.cancel(run_id, scope)

    def of_scope(self, scope: Scope) -> list[str]:
        return self._store.of_scope(scope)

    # ---- copies resident here -------------------------------------------------------------
    def sweep(self, local: list[Run]) -> tuple[list[Run], list[Run]]:
        """Of suspended runs resident here (none being resumed): those gone from the store
        (over elsewhere, or expired: ended here) and those another host has resumed since
        (stale: their runtime goes, their calls run on as orphans)."""
        if not local:
            return [], []
        stored = self._store.versions([run.run_id for run in local])
        now = time.time()
        gone, stale = [], []
        for run in local:
            entry = stored.get(run.run_id)
            if entry is None or entry[1] <= now:
                gone.append(run)
            elif entry[0] != run.stored_version:
                stale.append(run)
        return gone, stale

    def orphan(self, run: Run) -> None:
        """A stale copy: nothing of it is watched; its calls running here still write their
        results (its dispatcher's sink) until they are done or the run is gone."""
        with self._lock:
            watched = self._watched.get(run.run_id)
            if watched is not None and watched[0] is run:
                del self._watched[run.run_id]
            if any(owner == self.host_id for owner in run.stored_calls.values()):
                self._orphans.setdefault(run.run_id, []).append(run)
            else:
                run.dispatcher.close()

    # ---- the store's thread ---------------------------------------------------------------
    def _landed(self, run: Run, results: list[CallResult]) -> None:
        """The sink of a stored run's dispatcher: results of calls run here, to their rows."""
        mine = [r for r in results if run.stored_calls.get(r.call_id) == self.host_id]
        if not mine:
            return
        with self._lock:
            self._writes.extend((run.run_id, r) for r in mine)
        self._wake.set()

    def _loop(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_S
        while not self._stop.is_set():
            with self._lock:
                watching = bool(self._watched)
            self._wake.wait(WATCH_POLL_S if watching else HEARTBEAT_S)
            self._wake.clear()
            try:
                self._write()
                if watching:
                    self._poll()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + HEARTBEAT_S
                    self._store.beat()
                    self._close_orphans()
            except StoreError:
                _log.exception("code mode: the run store failed (retrying)")
            except Exception:  # (a bug: the heartbeat must go on)
                _log.exception("code mode: the run store thread failed (retrying)")

    def _write(self) -> None:
        with self._lock:
            writes, self._writes = self._writes, []
        for run_id, result in writes:
            self._store.put_result(run_id, result.call_id, result)

    def _poll(self) -> None:
        """Delivers results of watched calls; a call whose host stopped is redone here
        (restart-safe) or fails the run in progress."""
        with self._lock:
            watched = {run_id: (run, dict(calls)) for run_id, (run, calls) in self._watched.items()}
        for run_id, row in self._store.calls(list(watched)):
            run, calls = watched[run_id]
            tool = calls.get(row.call_id)
            if tool is None:
                continue
            if row.result is not None:
                self._unwatch(run, row.call_id)
                run.dispatcher.add_ready([row.result])
            elif not row.alive:
                self._unwatch(run, row.call_id)
                if run.journal.restart_safe and row.call_id in run.journal.open_inputs:
                    self._store.adopt(run_id, row.call_id)
                    run.stored_calls[row.call_id] = self.host_id
                    inline = run.dispatcher.submit([(row.call_id, tool, run.journal.open_inputs[row.call_id])])
                    if inline is not None:
                        threading.Thread(target=inline, name="codemode-redo", daemon=True).start()
                elif run.waiter is not None:
                    self._supervisor.drop(run, failed("internal_error", "LostResultError", _lost(row.call_id, tool)))

    def _unwatch(self, run: Run, call_id: int) -> None:
        with self._lock:
            watched = self._watched.get(run.run_id)
            if watched is None or watched[0] is not run:
                return
            watched[1].pop(call_id, None)
            if not watched[1]:
                del self._watched[run.run_id]

    def _close_orphans(self) -> None:
        """Orphans whose runs left the store, or whose calls are all answered, are closed."""
        with self._lock:
            orphans = {run_id: list(runs) for run_id, runs in self._orphans.items()}
        if not orphans:
            return
        stored = self._store.versions(list(orphans))
        for run_id, runs in orphans.items():
            for run in runs:
                answered = {r.call_id for r in run.dispatcher.ready()} | run.journal.settled_ids()
                running = [i for i, owner in run.stored_calls.items() if owner == self.host_id and i not in answered]
                if run_id in stored and running:
                    continue
                run.dispatcher.close()
                with self._lock:
                    kept = self._orphans.get(run_id, [])
                    if run in kept:
                        kept.remove(run)
                    if not kept:
                        self._orphans.pop(run_id, None)

    def close(self) -> None:
        """Stops the thread, writes what landed, frees this host's leases and ends its heartbeat."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        try:
            self._write()
            self._store.leave()
        except (StoreError, CodemodeError):
            _log.exception("code mode: could not leave the run store cleanly")
        with self._lock:
            orphans = [run for runs in self._orphans.values() for run in runs]
            self._orphans.clear()
            self._watched.clear()
        for run in orphans:
            run.dispatcher.close()
        self._store.close()
