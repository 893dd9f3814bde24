"""Making a run: its journal, its dispatcher, and the catalog configuration its worker gets.

A run is born from a checked ``exec`` (`cells.CellArgs`) or from a journal another process
exported (``import_run``: restart-safe runs only, and nothing in the bytes is trusted). Either
way it gets this ``CodeMode``'s own limits, a dispatcher over the catalog the policy allows now,
and the namespaces and stored values of its session::

    CellArgs ──cell──> Cell: Start (seed, source, run setup: namespaces + store snapshot + which of
          │                  models/agents the prelude installs): all a first step needs
          └──run_for──> Journal (the start's, with limits and catalog fingerprint)
                    └─> Dispatcher (catalog view, gate, outputs, approvals, MCP ops, HostApis) ──> Run
    bytes ──imported──> Journal.decode ──checks (cells.journal_problem)──> Run + calls to redo
    configuration() ──> Configure (limits, catalog JSON, fingerprint, semantic pack), cached
                        per catalog fingerprint: what a worker needs before it starts a run
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from . import _engine, semantic, tracing
from .approvals import Approvals
from .call_gate import Gate
from .call_planning import NO_HOST_APIS, HostApis
from .cells import CellArgs, journal_problem
from .config import BOUNDS, CodeModeConfig
from .dispatch import Dispatcher
from .errors import CodemodeError
from .mcp_listing import McpListing
from .namespaces import Namespaces
from .outputs import OutputStore
from .protocol import Configure, EngineLimits, Start
from .runs import Journal, Run, Scope, fixed_clock_start, new_run_id
from .stored_values import StoredValues
from .tools import BackgroundLoop, CatalogView

if TYPE_CHECKING:
    from .namespaces import CallTable
    from .run_store import RunMeta
    from .session import Session

__all__ = ["Cell", "RunFactory"]

#: A call an imported run redoes here: ``(call id, tool id, input JSON)``.
Redo = tuple[int, str, str]


class Cell(msgspec.Struct):
    """A checked ``exec`` made ready to run: its session, run id, the frame that starts it (the
    source, seed and setup its worker starts it from; its run number set when it is sent), the
    catalog it got, and the rest its run is made of (`RunFactory.run_for`: the journal is made
    there, for a cell that does not end in its first step). (A struct: built in C, for every
    exec.)"""

    session: Session
    run_id: str
    start: Start
    restart_safe: bool
    configure: Configure
    view: CatalogView
    #: Where its tools' async calls run.
    loop: Callable[[], asyncio.AbstractEventLoop]
    timeout_ms: int
    #: The text budget of its result (``// @options: {"max_output_tokens": N}``), or None.
    output_chars: int | None
    namespace_calls: CallTable | None
    apis: HostApis
    #: The trace id of its exec, and the exec's span (None when untraced).
    parent: str
    span: tracing.RunSpan | None


class RunFactory:
    """Builds the runs of one ``CodeMode`` from its parts (``catalog`` gives the catalog a run
    would get now: the policy can change between runs)."""

    def __init__(
        self,
        config: CodeModeConfig,
        catalog: Callable[[], CatalogView],
        namespaces: Namespaces,
        stored: StoredValues,
        outputs: OutputStore,
        gate: Gate,
        mcp: McpListing,
        loop: BackgroundLoop,
        call_ids: itertools.count[int],
        apis: Callable[[], HostApis] = lambda: NO_HOST_APIS,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._namespaces = namespaces
        self._stored = stored
        self._outputs = outputs
        self._gate = gate
        self._mcp = mcp
        self._loop = loop
        self._call_ids = call_ids
        #: The host's ``models.*`` providers and agent runner under the policy now.
        self._apis = apis
        self._configure: Configure | None = None
        self._configure_lock = threading.Lock()

    def configuration(self) -> tuple[Configure, CatalogView]:
        """The catalog a run would get now, and what a worker needs to run against it."""
        view = self._catalog()
        current = self._configure
        if current is not None and current.fingerprint == view.fingerprint:
            return current, view  # (the catalog is the one it was built for: no lock to take)
        with self._configure_lock:
            current = self._configure
            if current is None or current.fingerprint != view.fingerprint:
                c = self._config
                limits = EngineLimits(
                    c.memory_limit_bytes,
                    c.max_output_bytes,
                    c.max_pending_tool_calls,
                    c.search_default_limit,
                    c.max_search_limit,
                )
                pack = semantic.worker_pack(view.counts)
                current = self._configure = Configure(limits, view.catalog_json, view.fingerprint, pack)
            return current, view

    def configure_for(self, run: Run) -> Configure:
        """What a replay of ``run`` needs: the catalog it started with (its dispatcher's view):
        the configuration of the current catalog while that is the same one (the object idle
        workers were primed with), else one built from the run's view."""
        current = self._configure
        if current is not None and current.fingerprint == run.journal.catalog_fingerprint:
            return current
        view = run.dispatcher.view
        return Configure(run.journal.limits, view.catalog_json, view.fingerprint, semantic.worker_pack(view.counts))

    def next_parent(self, kind: str) -> str:
        """The trace id of the next ``exec``/``wait``/``call`` (one numbering for all three)."""
        return f"{kind}_{next(self._call_ids)}"

    def new_run(
        self,
        session: Session,
        checked: CellArgs,
        loop: Callable[[], asyncio.AbstractEventLoop],
        min_timeout_ms: int,
        seed: int | None = None,
    ) -> tuple[Run, Configure]:
        """A run of ``session`` for a checked ``exec``, with its tools' calls run on ``loop``."""
        cell = self.cell(session, checked, loop, min_timeout_ms, seed)
        return self.run_for(cell), cell.configure

    def cell(
        self,
        session: Session,
        checked: CellArgs,
        loop: Callable[[], asyncio.AbstractEventLoop],
        min_timeout_ms: int,
        seed: int | None = None,
    ) -> Cell:
        """What a run of ``session`` for a checked ``exec`` is made of (`run_for`); its first
        step on an idle worker needs only its start (`Supervisor.first_step`)."""
        code, language, restart_safe, options = checked
        session_id = session.session_id
        # A pragma may only lower what the operator's config allows, never raise it.
        timeout_ms = self._config.timeout_ms
        low, high = BOUNDS["timeout_ms"]
        if options.timeout_ms is not None:
            timeout_ms = min(max(options.timeout_ms, low), timeout_ms)
        configure, view = self.configuration()
        run_id = new_run_id()
        namespaces, namespace_calls = self._namespaces.build(
            view.tools, session_id=session_id, agent_run=session.agent_run, run_id=run_id
        )
        apis = self._apis()
        run_setup: dict[str, Any] = dict(apis.setup) if apis.setup else {}
        if namespaces:
            run_setup["namespaces"] = namespaces
        stored = self._stored.snapshot(session_id, session.branch)
        if stored:
            run_setup["store"] = stored
        timeout_ms = min(max(timeout_ms, min_timeout_ms), high)
        start = Start(
            0,
            code,
            language,
            float(timeout_ms),
            random.getrandbits(63) if seed is None else seed,
            msgspec.json.encode(run_setup).decode() if run_setup else "{}",
            None if seed is None else fixed_clock_start(seed),
        )
        tokens = options.max_output_tokens
        return Cell(
            session,
            run_id,
            start,
            restart_safe,
            configure,
            view,
            loop,
            timeout_ms,
            None if tokens is None else min(tokens * 4, self._config.max_output_bytes),
            namespace_calls,
            apis,
            self.next_parent("exec"),
            tracing.run_span(run_id),
        )

    def run_for(self, cell: Cell) -> Run:
        """The run of ``cell``: its journal, and a dispatcher over the catalog it got."""
        session, start = cell.session, cell.start
        session_id = session.session_id
        journal = Journal(
            engine_version=_engine.__version__,
            prelude_hash=_engine.PRELUDE_HASH,
            catalog_fingerprint=cell.configure.fingerprint,
            limits=cell.configure.limits,
            language=start.language,
            source=start.source,
            seed=start.seed,
            run_json=start.run_json,
            clock_start=start.clock_start,
            restart_safe=cell.restart_safe,
            session_id=session_id,
            agent_run=session.agent_run,
        )
        dispatcher = Dispatcher(
            cell.view,
            cell.loop,
            outputs=self._outputs,
            session_id=session_id,
            gate=self._gate,
            read_only=journal.restart_safe,
            namespace_calls=cell.namespace_calls,
            mcp_ops=self._mcp.op if self._mcp.servers is not None else None,
            approvals=Approvals(journal.approvals),
            run_id=cell.run_id,
            agent_run=session.agent_run,
            apis=cell.apis,
        )
        run = Run(session.scope, journal, dispatcher, cell.run_id)
        run.store_key = (session_id, session.branch)
        dispatcher.parent = cell.parent
        dispatcher.span = cell.span
        run.output_chars = cell.output_chars
        run.timeout_ms = cell.timeout_ms
        return run

    def imported(self, data: bytes, session_id: str) -> tuple[Run, list[Redo]]:
        """A suspended run of ``session_id`` from a journal exported elsewhere (`CodeMode.import_run`),
        and its open calls to redo here; ``CodemodeError`` says why the bytes are refused."""
        journal = self._checked_journal(data, restart_safe=True)
        run = self._resumed(new_run_id(), journal, (session_id, None))
        run.timeout_ms = self._config.timeout_ms
        journal.session_id, journal.agent_run = session_id, None
        settled = journal.settled_ids()
        redo = [
            (c.id, c.tool, journal.open_inputs[c.id])
            for c in journal.calls
            if c.id not in settled and c.id in journal.open_inputs
        ]
        return run, redo

    def rebuilt(self, run_id: str, meta: RunMeta, data: bytes) -> Run:
        """A run another process suspended in the shared run store (`codemode.shared_runs`), to be
        replayed here; ``CodemodeError`` says why it cannot be (another engine or catalog)."""
        journal = self._checked_journal(data)
        run = self._resumed(run_id, journal, (meta.session_id, meta.agent_run))
        run.timeout_ms = meta.timeout_ms
        run.output_chars = meta.output_chars
        if meta.branch is not None:
            run.store_key = (meta.session_id, meta.branch)
        run.counts.tool_calls, run.counts.searches, run.counts.describes = (
            meta.tool_calls,
            meta.searches,
            meta.describes,
        )
        return run

    def _checked_journal(self, data: bytes, *, restart_safe: bool = False) -> Journal:
        """A journal from bytes written elsewhere, with this ``CodeMode``'s limits; ``CodemodeError``
        if it is malformed, not restart-safe when ``restart_safe`` asks it to be, of another engine
        or catalog, or out of bounds."""
        try:
            journal = Journal.decode(data)
        except (msgspec.DecodeError, RecursionError, MemoryError) as e:
            raise CodemodeError(f"not a code mode journal: {e}") from None
        if restart_safe and not journal.restart_safe:
            raise CodemodeError("only restartSafe runs can resume in another process")
        if journal.prelude_hash != _engine.PRELUDE_HASH:
            raise CodemodeError("this journal was written by a different code mode engine")
        configure, view = self.configuration()
        if view.fingerprint != journal.catalog_fingerprint:
            raise CodemodeError("this journal was written against a different tool catalog")
        problem = journal_problem(journal, self._config)
        if problem is not None:
            raise CodemodeError(f"refused journal: {problem}")
        journal.limits = configure.limits
        return journal

    def _resumed(self, run_id: str, journal: Journal, scope: Scope) -> Run:
        """A suspended run of ``scope`` around a checked journal: its dispatcher, approvals and
        yields as the journal has them; it is replayed by its next ``wait``."""
        session_id, agent_run = scope
        _, view = self.configuration()
        _, namespace_calls = self._namespaces.build(
            view.tools, session_id=session_id, agent_run=agent_run, run_id=run_id
        )
        dispatcher = Dispatcher(
            view,
            self._loop.get,
            outputs=self._outputs,
            session_id=session_id,
            gate=self._gate,
            read_only=journal.restart_safe,
            namespace_calls=namespace_calls,
            mcp_ops=self._mcp.op if self._mcp.servers is not None else None,
            approvals=Approvals(journal.approvals),
            run_id=run_id,
            agent_run=agent_run,
            apis=self._apis(),
        )
        run = Run(scope, journal, dispatcher, run_id)
        settled = journal.settled_ids()
        run.yields.extend(c.id for c in journal.calls if c.id not in settled and c.tool == _engine.YIELD_TOOL)
        return run
