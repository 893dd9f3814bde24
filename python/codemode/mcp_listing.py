"""Which MCP servers' tools are in the catalog now: listing, retry and list-changed state.

An ``exec`` never waits for a server longer than once. Each server is listed on the MCP loop
(`codemode.mcp`), one listing at a time; its tools join the registry all at once when the
listing lands. A server seen for the first time holds an ``exec`` up to ``MCP_START_WAIT_S``
(set-up, not the cell's time); after that it is unavailable, saying why, until a listing works.
A failed one is listed again, in the background, by the first ``exec`` ``MCP_RETRY_S`` later;
one that says its listing changed is listed again by the next ``exec``::

    exec ──refresh()──> stale servers ──run_coroutine_threadsafe──> MCP loop: _list_server
                             │                                          │ alist_tools
       waits (first time,    │                                          v
       up to MCP_START_WAIT_S)└──────────────<── done ── registry.set_mcp_server(tools | reason)
    server: list_changed ──_list_changed──> stale again (the next exec lists it)

A listing that changes what a server is logs once: WARNING when it becomes unusable (the cell
sees the same reason), INFO when it works again; a retry that fails alike logs at DEBUG.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import CodemodeError, ToolDefinitionError
from .extras import explained
from .tools import Tool, ToolRegistry, define_tool

if TYPE_CHECKING:
    from .mcp import McpServers

__all__ = ["MCP_DISABLED", "MCP_RETRY_S", "MCP_START_WAIT_S", "McpListing"]

_log = logging.getLogger(__name__)

#: How long an unreachable MCP server is left alone before an exec lists it again (in the
#: background: a retry never holds an exec up).
MCP_RETRY_S = 10.0
#: How long an exec waits for servers listed for the first time (set-up, not the cell's time);
#: one that takes longer is unavailable, saying so, until its listing lands.
MCP_START_WAIT_S = 10.0
#: What ``load_mcp_tools`` reports for a server whose config entry says ``"disabled": true``.
MCP_DISABLED = 'disabled in its config ("disabled": true); not started'


def _still_starting(server: str) -> str:
    return f"MCP server {server!r} is still starting"


#: The state of a server no listing has finished for (`_log_mcp_listing`).
_NEVER_LISTED = object()


def _log_mcp_listing(server: str, before: object, reason: str | None) -> None:
    """Logs a finished listing when it changes what the server is: unusable (WARNING, saying
    why; the cell sees the same reason) or usable (INFO, after a failure or a slow start). A
    retry that fails as the last one did logs at DEBUG: execs retry every ``MCP_RETRY_S``."""
    if reason is None:
        if before is not None and before is not _NEVER_LISTED:
            _log.info("MCP server %r is available", server)
    elif reason == before:
        _log.debug("%s (again)", reason)
    else:
        _log.warning("%s", reason)


def _mcp_caller(mcp: McpServers, server: str, tool: str) -> Callable[..., Awaitable[Any]]:
    # Runs on the MCP client's own loop (the tool's `loop`): no hop through the tools' loop.
    async def call(**arguments: Any) -> Any:
        return await mcp.call_tool_here(server, tool, arguments)

    return call


class McpListing:
    """A ``CodeMode``'s MCP servers and what their listings put in ``registry``."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry
        #: The servers' clients (`codemode.mcp`), once one is added; None without any.
        self.servers: McpServers | None = None
        #: MCP servers whose tools are in the registry (or that failed to list: name -> error).
        self._loaded: dict[str, str | None] = {}
        self._failed_at: dict[str, float] = {}
        #: Listings in flight (on the MCP loop), by server.
        self._listing: dict[str, concurrent.futures.Future[None]] = {}
        #: Servers that said their listings changed since they were last listed.
        self._changed: set[str] = set()
        self._lock = threading.Lock()

    def add_server(self, name: str, config: Mapping[str, Any]) -> None:
        """`CodeMode.add_mcp_server`: without the ``mcp`` extra, an ``ImportError`` that says to
        install it."""
        try:
            from .mcp import McpServers
        except ImportError as e:
            raise explained(e) from e

        with self._lock:
            if self.servers is None:
                self.servers = McpServers()
                self.servers.on_list_changed(self._list_changed)
            self.servers.add(name, config)
            self._loaded.pop(name, None)

    def load_all(self) -> dict[str, str | None]:
        """`CodeMode.load_mcp_tools`: lists every stale server and waits for all of them."""
        self._list(None)
        mcp = self.servers
        if mcp is None:
            return {}
        with self._lock:
            return self._loaded | dict.fromkeys(mcp.disabled_names(), MCP_DISABLED)

    def refresh(self) -> None:
        """For an ``exec``: lists the stale servers, waiting up to ``MCP_START_WAIT_S`` for the
        new ones (nothing to do, and no wait, when none is stale)."""
        if self._wanted():
            self._list(MCP_START_WAIT_S)

    async def refresh_async(self) -> None:
        """`refresh` for a coroutine: the listings are awaited, not waited for."""
        if self._wanted():
            waited = self._start_listings(MCP_START_WAIT_S)
            if waited:
                await asyncio.wait([asyncio.wrap_future(f) for f in waited.values()], timeout=MCP_START_WAIT_S)
                self._listed(waited)

    async def op(self, server: str, op: str, payload: Any) -> Any:
        """A resource or prompt request of a run (a dispatcher's ``mcp_ops``)."""
        mcp = self.servers
        if mcp is None:
            raise CodemodeError("no MCP servers are configured")
        return await mcp.arun_op(server, op, payload)

    def close(self) -> None:
        if self.servers is not None:
            self.servers.close()

    def _list_changed(self, server: str) -> None:
        """On the MCP loop: the server said a listing changed; the next exec lists it again (in
        the background: that exec still sees the listing before)."""
        with self._lock:
            self._changed.add(server)

    def _stale(self, server: str, now: float) -> bool:
        """Never listed, changed since, or failed long enough ago to try again (and not being
        listed now)."""
        if server in self._listing:
            return False
        if server not in self._loaded or server in self._changed:
            return True
        return self._loaded[server] is not None and now - self._failed_at.get(server, now) >= MCP_RETRY_S

    def _wanted(self) -> bool:
        """Some server is to be listed (an exec starts it: never listed, or its retry is due)."""
        mcp = self.servers
        if mcp is None:
            return False
        now = time.monotonic()
        return any(self._stale(server, now) for server in mcp.names())

    def _list(self, wait_s: float | None) -> None:
        """Starts listing each stale server on the MCP loop (one listing per server at a time),
        then waits: for every listing (``wait_s`` None), or up to ``wait_s`` for the servers
        listed for the first time. So a server that is slow to start, or never answers, costs an
        ``exec`` at most ``wait_s`` once; until its listing lands it is unavailable, saying so,
        and retries never hold an ``exec`` up."""
        waited = self._start_listings(wait_s)
        if waited:
            concurrent.futures.wait(waited.values(), timeout=wait_s)
            self._listed(waited)

    def _start_listings(self, wait_s: float | None) -> dict[str, concurrent.futures.Future[None]]:
        """Starts the listings `_list` describes; returns those to wait for."""
        mcp = self.servers
        if mcp is None:
            return {}
        here = mcp.on_loop_thread()  # (an async hook of an MCP call): start them, never wait
        if here and wait_s is None:
            raise RuntimeError("load_mcp_tools() cannot run on the MCP loop's thread; the listings queue behind it")
        loop = mcp.event_loop()  # (started here, not under the lock its listings take)
        waited: dict[str, concurrent.futures.Future[None]] = {}
        with self._lock:
            now = time.monotonic()
            for server in mcp.names():
                if self._stale(server, now):
                    first = server not in self._loaded
                    self._changed.discard(server)  # (a change from now on lists it again)
                    if first:
                        self._registry.set_mcp_server(server, None, _still_starting(server))
                    listing = asyncio.run_coroutine_threadsafe(self._list_server(mcp, server), loop)
                    self._listing[server] = listing
                    if first or wait_s is None:
                        waited[server] = listing
                elif wait_s is None and server in self._listing:
                    waited[server] = self._listing[server]
        return {} if here else waited

    def _listed(self, waited: dict[str, concurrent.futures.Future[None]]) -> None:
        with self._lock:
            for server, listing in waited.items():
                if not listing.done() and server not in self._loaded:
                    # Not waited for again: later execs go on without it until it lands.
                    self._loaded[server] = _still_starting(server)

    async def _list_server(self, mcp: McpServers, server: str) -> None:
        """On the MCP loop: lists one server and registers its tools, all at once (before the
        listing's future completes, so whoever waits for it finds them)."""
        reason: str | None = None
        tools: list[Tool] = []
        try:
            listed = await mcp.alist_tools(server)
        except CodemodeError as e:
            reason = str(e)
        else:
            for info in listed:
                try:
                    tools.append(
                        define_tool(
                            _mcp_caller(mcp, server, info.name),
                            name=info.name,
                            owner=server,
                            source="mcp",
                            description=info.description,
                            label=info.title,
                            input_schema=info.input_schema,
                            output_schema=info.output_schema,
                            loop=mcp.event_loop,
                        )
                    )
                except ToolDefinitionError as e:
                    # One unusable name (empty, over 128 characters, control characters) costs
                    # that tool, not the server.
                    _log.warning("MCP server %r: tool left out: %s", server, e)
        with self._lock:
            self._listing.pop(server, None)
            if reason is None:
                self._registry.set_mcp_server(server, tools)
                self._failed_at.pop(server, None)
            else:
                self._registry.set_mcp_server(server, None, reason)
                self._failed_at[server] = time.monotonic()
            before = self._loaded.get(server, _NEVER_LISTED)
            self._loaded[server] = reason
        _log_mcp_listing(server, before, reason)
