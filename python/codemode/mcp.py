"""Connections to MCP servers, through the official ``mcp`` SDK, usable from any thread.

The host configures servers the way MCP clients already do, one entry per name::

    {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {...}, "cwd": "..."},
     "docs": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}},
     "old": {"type": "sse", "url": "https://example.com/sse"}}

``command`` means a stdio server (a subprocess speaking MCP on stdin/stdout), ``url`` a
streamable HTTP server or a legacy SSE one; ``parse_server_config`` says what becomes of the keys
other clients write. ``McpServers`` keeps one session per server on a private event-loop thread:
the SDK is anyio-based and a session's task groups must be entered and left by the same task, so
each connection lives in one long-lived *holder* task while requests from any thread
(or any other event loop, via the ``a*`` twins) are scheduled onto that loop::

    caller thread / loop ──LoopThread.run/arun──> the codemode-mcp loop (`codemode.mcp_loop`):
      McpServers: a name -> its config -> its _Connection (made on first use)
        └─> _tools_list, _tools_call...: what each request sends, how its answer reads
              └─> _Connection.request: timeout, retry ──> mcp.Client ──> server
                    └─ holder task per server: opens the transport + session, waits, closes

Failure policy, so that one bad server never takes the host down:

* A server that cannot start, or that dies, fails the calls that need it with
  ``McpServerError("MCP server 'x' is unavailable: ...")``; other servers are untouched.
* A session whose stream has ended (the server exited, the HTTP session closed) is replaced by
  a fresh one *before* the next request is sent. A request that loses its connection while in
  flight is retried once on a new session if it only reads (``tools/list``, ``resources/read``,
  ...); a ``tools/call`` is never re-sent, because it may already have run.
* Every request and every handshake has a timeout (``McpTimeoutError``).

As a careful client does, it asks a server only for what its ``initialize`` result announces:
a server without the ``tools`` capability lists no tools (it may offer only resources or
prompts), one without ``resources`` or ``prompts`` lists none of those, and reading a resource
or getting a prompt it does not offer is an ``McpServerError`` that says so.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.metadata
import logging
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.lowlevel
import httpx2
import msgspec
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    CONNECTION_CLOSED,
    Implementation,
    PaginatedResult,
    PromptListChangedNotification,
    ResourceListChangedNotification,
    ToolListChangedNotification,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from .errors import ClosedError, ConfigError, McpServerError, McpTimeoutError
from .mcp_loop import LoopThread

if TYPE_CHECKING:
    # The stream contract of the public ``mcp.client.Transport`` protocol, defined next to it.
    from mcp.client._transport import ReadStream, TransportStreams
    from mcp.shared.message import SessionMessage
    from typing_extensions import Self

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "McpHttpServerConfig",
    "McpPromptArgument",
    "McpPromptInfo",
    "McpResourceInfo",
    "McpServerConfig",
    "McpServers",
    "McpStdioServerConfig",
    "McpToolInfo",
    "parse_server_config",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
PageT = TypeVar("PageT", bound=PaginatedResult)

DEFAULT_TIMEOUT_S = 30.0
#: How long closing one session may take before its holder task is cancelled. The SDK's own
#: stdio shutdown is bounded too (stdin close, 2 s grace, SIGTERM, 2 s, SIGKILL).
_CLOSE_TIMEOUT_S = 10.0
#: A server that keeps returning a cursor is broken (or hostile); stop following it here.
_MAX_PAGES = 1000
#: A cell's listing (``MCP.<server>.resources.list()``) follows ``nextCursor`` up to this many
#: pages, or until it holds this many items; then it carries the ``nextCursor`` to go on from.
_MAX_LISTING_PAGES = 100
_MAX_LISTING_ITEMS = 10_000
#: The requests of ``MCP.<server>.resources/prompts`` (see `McpServers.run_op`), and the
#: capability each needs.
_OPS: dict[str, Literal["resources", "prompts"]] = {
    "resources.list": "resources",
    "resources.read": "resources",
    "prompts.list": "prompts",
    "prompts.get": "prompts",
}
#: Connect/write/pool timeouts for HTTP and SSE servers; reads stay open longer because a server
#: may stream a response (the values the SDK itself uses). Our per-request timeout still applies.
_HTTP_TIMEOUT_S = 30.0
_HTTP_READ_TIMEOUT_S = 300.0
_HTTP_TIMEOUT = httpx2.Timeout(_HTTP_TIMEOUT_S, read=_HTTP_READ_TIMEOUT_S)
#: Failures that mean the transport itself is gone, not that the server rejected a request.
_CONNECTION_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, httpx2.TransportError)


class _McpServerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What every server entry may say, whatever its transport."""

    #: ``true`` keeps the entry but never starts the server (Cline, Roo Code, Windsurf write it).
    disabled: bool = False


class McpStdioServerConfig(_McpServerEntry, frozen=True, kw_only=True):
    """A server run as a subprocess that speaks MCP on stdin/stdout.

    The subprocess gets the SDK's small default environment (``HOME``, ``PATH``, ``USER``...)
    plus ``env``, not the host's whole environment, so host secrets do not leak into it.
    """

    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str | None = None
    type: Literal["stdio"] = "stdio"


class McpHttpServerConfig(_McpServerEntry, frozen=True, kw_only=True):
    """A server reached over HTTP: streamable HTTP, or the legacy SSE transport (``type="sse"``).

    ``headers`` go with every request (auth), on either transport.
    """

    url: str
    headers: dict[str, str] = {}
    #: ``auto`` (an entry that names no transport): streamable HTTP is tried first, then SSE, as
    #: the MCP spec advises clients that may meet either kind of server; the one that answers is
    #: kept for reconnecting.
    type: Literal["http", "sse", "auto"] = "http"


McpServerConfig = McpStdioServerConfig | McpHttpServerConfig


class McpToolInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One tool a server lists; ``msgspec.to_builtins`` gives the spec's camelCase shape."""

    name: str
    description: str = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    title: str | None = None


class McpResourceInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One resource a server lists, with its annotations (audience, priority...) and ``_meta``."""

    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class McpPromptArgument(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One argument of a prompt template (prompt arguments are always strings)."""

    name: str
    description: str | None = None
    required: bool = False


class McpPromptInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One prompt a server lists, with its ``_meta``."""

    name: str
    title: str | None = None
    description: str | None = None
    arguments: tuple[McpPromptArgument, ...] = ()
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


#: The transport names clients write in ``type`` (or Cline's ``transportType``).
_TRANSPORTS: dict[str, Literal["stdio", "http", "sse"]] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamableHttp": "http",
    "sse": "sse",
}
#: Other clients' names for our keys: Windsurf's ``serverUrl``, Cline's ``transportType``.
_ALIASES = {"serverUrl": "url", "transportType": "type"}
#: Keys about another client's own approval prompts or display: nothing to do here.
_UI_KEYS = frozenset({"alwaysAllow", "autoApprove", "trust", "description"})


#: Server names as configs have them (``My Server``, ``chrome-devtools``), but never a ``:``, so
#: that a tool id ``mcp:<server>:<tool>`` names one server and one tool.
_SERVER_NAME = re.compile(r"^[^:\x00-\x1f\x7f]{1,128}$")


def parse_server_config(name: str, config: Mapping[str, Any] | McpServerConfig) -> McpServerConfig:
    """Validates one server entry; ``command`` selects stdio, ``url`` HTTP.

    Entries copied from other MCP clients (Claude Desktop, Claude Code, Cursor, VS Code, Cline,
    Windsurf) work as they are:

    * ``type`` or ``transportType`` may name the transport: ``stdio``; ``http``,
      ``streamable-http`` or ``streamableHttp``; ``sse``. A ``url`` without one is tried over
      streamable HTTP, then SSE (Cursor and Windsurf entries often give only a url and let the
      client find out). Windsurf's ``serverUrl`` is ``url``.
    * ``disabled: true`` keeps the entry, but the server never starts (see ``McpServers.names``).
    * Keys about the other client's own prompts and display (``alwaysAllow``, ``autoApprove``,
      ``trust``, ``description``) are ignored.
    * Any other key is ignored with one logged warning per entry that names the keys. Clients
      keep adding keys of their own (Cursor's ``envFile``, VS Code's ``dev``, Claude Code's
      ``oauth``, Gemini CLI's ``includeTools``...), and refusing them would let one copied entry
      stop the whole host. The warning still shows a misspelt optional key or a setting that is
      not applied here, and a misspelt ``command`` or ``url`` still fails: the entry has neither.
    * Environment references in ``command``, ``args``, ``env``, ``cwd``, ``url`` and
      ``headers`` values are expanded from the host's environment when the entry is read:
      ``${VAR}`` and ``${VAR:-default}`` (Claude Code), ``${env:VAR}`` (Cursor, VS Code). This
      is how those entries pass a secret to a server (``"env": {"TOKEN": "${TOKEN}"}``), since
      a stdio server does not inherit the host's environment. Cursor's and VS Code's
      ``${userHome}``, ``${workspaceFolder}`` (and ``${workspaceRoot}``, ``${cwd}``),
      ``${workspaceFolderBasename}`` and ``${pathSeparator}`` are the home directory, the
      directory the host runs in, its name, and the path separator. A variable that is not set,
      with no default, is a ``ConfigError``: sent on as text it would only fail later, as a login
      error from the server. A bare ``$VAR`` and VS Code's ``${input:...}`` prompts are left as
      they are; a default is plain text (no ``}``, no nested reference). Disabled entries are
      not expanded.
    * ``timeout`` is such a key, not applied: Cline means seconds and Gemini CLI milliseconds,
      so either reading breaks the other's entries (60 ms, or a 7-day wait). The request timeout
      here is ``McpServers(timeout_s=...)``.

    A malformed entry (a value of the wrong type, both ``command`` and ``url``, an unknown or
    mismatched transport) is a ``ConfigError`` that names the server and the key.
    """
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise ConfigError(
            f"an MCP server name must be 1-128 characters with no ':' or control characters"
            f" (its tools' ids are mcp:<server>:<tool>), not {name!r}"
        )
    if isinstance(config, McpStdioServerConfig | McpHttpServerConfig):
        parsed: McpServerConfig = config
    elif not isinstance(config, Mapping):
        raise ConfigError(f"MCP server {name!r}: the config must be a dict, not {type(config).__name__}")
    else:
        parsed = _parse_entry(name, config)
    if isinstance(parsed, McpStdioServerConfig) and not parsed.command:
        raise ConfigError(f"MCP server {name!r}: 'command' must not be empty")
    if isinstance(parsed, McpHttpServerConfig) and not parsed.url.startswith(("http://", "https://")):
        # (not the url itself: expanded, it may hold a token)
        raise ConfigError(f"MCP server {name!r}: 'url' must start with http:// or https://")
    return parsed


def _parse_entry(name: str, config: Mapping[str, Any]) -> McpServerConfig:
    entry = dict(config)
    spelled: dict[str, str] = {}  # our key -> the alias the entry used (errors name the entry's key)
    for alias, key in _ALIASES.items():
        if alias in entry:
            if key in entry:
                raise ConfigError(f"MCP server {name!r}: set {key!r} or {alias!r}, not both")
            entry[key] = entry.pop(alias)
            spelled[key] = alias
    if "command" in entry and "url" in entry:
        raise ConfigError(f"MCP server {name!r}: set either 'command' (stdio) or 'url' (HTTP), not both")
    if entry.get("disabled") is not True:  # (a disabled entry is often the one whose secret is unset)
        _expand_env_refs(name, entry, spelled)
    if "command" not in entry and "url" not in entry:
        raise ConfigError(f"MCP server {name!r}: the config needs 'command' (stdio) or 'url' (HTTP)")
    kind: type[McpServerConfig] = McpStdioServerConfig if "command" in entry else McpHttpServerConfig
    transport = entry.get("type")
    if transport is None:
        if kind is McpHttpServerConfig:
            entry["type"] = "auto"
    else:
        type_key = "transportType" if "transportType" in config else "type"
        if not isinstance(transport, str) or transport not in _TRANSPORTS:
            known = ", ".join(map(repr, _TRANSPORTS))
            raise ConfigError(f"MCP server {name!r}: {type_key!r} must be one of {known}, not {transport!r}")
        entry["type"] = _TRANSPORTS[transport]
        if (entry["type"] == "stdio") != (kind is McpStdioServerConfig):
            has = "command" if kind is McpStdioServerConfig else "url"
            raise ConfigError(f"MCP server {name!r}: {type_key!r} is {transport!r}, which does not go with {has!r}")
    try:
        parsed = msgspec.convert(entry, kind)
    except msgspec.ValidationError as e:
        message = str(e)
        for key, alias in spelled.items():
            message = message.replace(f"`$.{key}`", f"`$.{alias}`")
        raise ConfigError(f"MCP server {name!r}: {message}") from None
    ignored = sorted(entry.keys() - kind.__struct_fields__ - _UI_KEYS)
    if ignored:
        logger.warning("MCP server %r: ignoring keys codemode does not use: %s", name, ", ".join(map(repr, ignored)))
    return parsed


#: ``${VAR}``, ``${VAR:-default}`` (Claude Code) and ``${env:VAR}`` (Cursor, VS Code).
_ENV_REF = re.compile(r"\$\{(env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: Cursor's and VS Code's own variables that their entries use in paths; the workspace is the
#: directory the host runs in.
_PREDEFINED: dict[str, Callable[[], str]] = {
    "userHome": lambda: os.path.expanduser("~"),
    "workspaceFolder": os.getcwd,
    "workspaceRoot": os.getcwd,
    "workspaceFolderBasename": lambda: os.path.basename(os.getcwd()),
    "cwd": os.getcwd,
    "pathSeparator": lambda: os.sep,
}
#: The keys whose string values (or list items, or mapping values) may hold them.
_EXPANDED = ("command", "args", "env", "cwd", "url", "headers")


def _expand_env_refs(name: str, entry: dict[str, Any], spelled: Mapping[str, str]) -> None:
    """Expands `_ENV_REF` references in place, from ``os.environ`` (see `parse_server_config`).
    Values of the wrong type are left for the entry's own validation to report."""

    def expand(key: str, text: str) -> str:
        def value(ref: re.Match[str]) -> str:
            prefixed, var, default = ref.group(1), ref.group(2), ref.group(3)
            found = _PREDEFINED[var]() if not prefixed and var in _PREDEFINED else os.environ.get(var)
            if found is None or (found == "" and default is not None):  # ':-': unset or empty
                if default is None:
                    raise ConfigError(
                        f"MCP server {name!r}: {spelled.get(key, key)!r} refers to {ref.group(0)}, but {var} is"
                        f" not set in the environment (write ${{{var}:-default}} to give a default)"
                    )
                return default
            return found

        return _ENV_REF.sub(value, text) if "${" in text else text

    for key in _EXPANDED:
        value = entry.get(key)
        if isinstance(value, str):
            entry[key] = expand(key, value)
        elif isinstance(value, list | tuple):
            entry[key] = [expand(key, item) if isinstance(item, str) else item for item in value]
        elif isinstance(value, Mapping):
            entry[key] = {k: expand(key, v) if isinstance(v, str) else v for k, v in value.items()}


class McpServers:
    """The host's MCP servers: one lazily connected session each, callable from any thread.

    Every I/O method has an ``a``-prefixed twin (``acall_tool``...) for callers on another
    event loop; both run the work on this object's own loop thread, started on first use.
    ``timeout_s`` bounds each request, and separately the handshake when a call has to
    (re)connect first; ``None`` means the ``timeout_s`` given here.
    """

    def __init__(
        self,
        servers: Mapping[str, Mapping[str, Any] | McpServerConfig] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, not {timeout_s!r}")
        self._timeout_s = timeout_s
        self._client_info = Implementation(name="codemode", version=importlib.metadata.version("codemode"))
        #: Guards the config table and (shared with the loop thread) the loop's lifecycle; never
        #: held while waiting on the loop.
        self._lock = threading.Lock()
        self._configs: dict[str, McpServerConfig] = {}
        self._loop_thread = LoopThread(self._lock, on_close=self._close_connections)
        # Owned by the loop thread.
        self._connections: dict[str, _Connection] = {}
        self._shutting_down = False
        self._on_list_changed: Callable[[str], object] | None = None
        for name, config in (servers or {}).items():
            self.add(name, config)

    def on_list_changed(self, callback: Callable[[str], object] | None) -> None:
        """``callback(server)``, on the loop thread, whenever a server says its tools, resources
        or prompts changed (``notifications/*/list_changed``, or a ``subscriptions/listen``
        event on 2026-07-28 sessions). It must not block."""
        self._on_list_changed = callback

    def _list_changed(self, name: str) -> None:
        callback = self._on_list_changed
        if callback is not None:
            try:
                callback(name)
            except Exception:
                logger.exception("MCP server %r: the list-changed callback failed", name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- configuration -------------------------------------------------------------------

    def add(self, name: str, config: Mapping[str, Any] | McpServerConfig) -> None:
        """Registers a server; nothing starts until a call needs it (or ``connect``), and a
        disabled one (``"disabled": true``) never starts."""
        parsed = parse_server_config(name, config)
        with self._lock:
            self._loop_thread.check_open()
            if name in self._configs:
                raise ConfigError(f"MCP server {name!r} is already configured")
            self._configs[name] = parsed

    def names(self) -> list[str]:
        """The servers that may start, in the order they were added (not the disabled ones)."""
        with self._lock:
            return [name for name, config in self._configs.items() if not config.disabled]

    def disabled_names(self) -> list[str]:
        """The servers configured with ``"disabled": true``: never started, and a call to one is
        a ``ConfigError``. ``remove`` forgets them like any other."""
        with self._lock:
            return [name for name, config in self._configs.items() if config.disabled]

    def remove(self, name: str) -> None:
        """Forgets a server and shuts its session down (a stdio server's process exits)."""
        if self._forget_unstarted(name):
            return
        self._loop_thread.run(self._remove, name)

    async def aremove(self, name: str) -> None:
        if self._forget_unstarted(name):
            return
        await self._loop_thread.arun(self._remove, name)

    # -- lifecycle -----------------------------------------------------------------------

    def connect(self, name: str, *, timeout_s: float | None = None) -> None:
        """Opens the server's session now rather than on first use; no-op when it is live."""
        self._loop_thread.run(self._connect, name, timeout_s)

    async def aconnect(self, name: str, *, timeout_s: float | None = None) -> None:
        await self._loop_thread.arun(self._connect, name, timeout_s)

    def close(self) -> None:
        """Closes every session and stops the loop thread; later calls raise ``ClosedError``.

        Bounded even when servers are dead or hung: each session gets a few seconds to close,
        then its task is cancelled (the SDK still kills a stdio server's process tree).
        """
        self._loop_thread.close()

    async def aclose(self) -> None:
        await self._loop_thread.aclose()

    # -- requests ------------------------------------------------------------------------

    def list_tools(self, name: str, *, timeout_s: float | None = None) -> list[McpToolInfo]:
        """Every tool the server lists (all pages)."""
        return self._loop_thread.run(self._list_tools, name, timeout_s)

    async def alist_tools(self, name: str, *, timeout_s: float | None = None) -> list[McpToolInfo]:
        return await self._loop_thread.arun(self._list_tools, name, timeout_s)

    def list_resources(self, name: str, *, timeout_s: float | None = None) -> list[McpResourceInfo]:
        """Every resource the server lists (all pages)."""
        return self._loop_thread.run(self._list_resources, name, timeout_s)

    async def alist_resources(self, name: str, *, timeout_s: float | None = None) -> list[McpResourceInfo]:
        return await self._loop_thread.arun(self._list_resources, name, timeout_s)

    def list_prompts(self, name: str, *, timeout_s: float | None = None) -> list[McpPromptInfo]:
        """Every prompt the server lists (all pages)."""
        return self._loop_thread.run(self._list_prompts, name, timeout_s)

    async def alist_prompts(self, name: str, *, timeout_s: float | None = None) -> list[McpPromptInfo]:
        return await self._loop_thread.arun(self._list_prompts, name, timeout_s)

    def call_tool(
        self, name: str, tool: str, arguments: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Calls a tool: ``{"content": [...], "structuredContent"?: ..., "isError": bool}``.

        A tool that fails reports it in the result (``isError``), as MCP intends; an
        ``McpServerError`` means the server refused the request (``code`` set: unknown tool,
        bad arguments) or could not be reached.
        """
        return self._loop_thread.run(self._call_tool, name, tool, arguments, timeout_s)

    async def acall_tool(
        self, name: str, tool: str, arguments: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        return await self._loop_thread.arun(self._call_tool, name, tool, arguments, timeout_s)

    def run_op(self, name: str, op: str, payload: Mapping[str, Any], *, timeout_s: float | None = None) -> Any:
        """One ``MCP.<server>.resources/prompts`` request as a cell makes it, answered in the
        shape the declarations give (``mcp_api``):

        * ``resources.list`` / ``prompts.list`` (``{cursor?}``): ``{"resources" | "prompts": [...],
          "nextCursor"?: str}``, each item as the server gave it (annotations and ``_meta``
          kept). Pages are followed from ``cursor`` up to 100 pages or 10,000 items; a
          ``nextCursor`` in the answer means there is more, from there.
        * ``resources.read`` (``{uri}``) and ``prompts.get`` (``{name, arguments?}``): as
          ``read_resource`` and ``get_prompt``.
        """
        return self._loop_thread.run(self._run_op, name, op, payload, timeout_s)

    async def arun_op(self, name: str, op: str, payload: Mapping[str, Any], *, timeout_s: float | None = None) -> Any:
        return await self._loop_thread.arun(self._run_op, name, op, payload, timeout_s)

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop MCP I/O runs on (started on first use). A caller that runs its coroutines
        here (``call_tool_here``) saves two thread hops per call."""
        return self._loop_thread.event_loop()

    def call_tool_here(
        self, name: str, tool: str, arguments: Mapping[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        """``acall_tool`` for a coroutine already running on ``event_loop()`` (which awaits
        what this returns: one coroutine frame less on each of the call's resumptions)."""
        return self._call_tool(name, tool, arguments, timeout_s)

    def read_resource(self, name: str, uri: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Reads a resource: ``{"contents": [{"uri", "mimeType"?, "text" | "blob"}, ...]}``."""
        return self._loop_thread.run(self._read_resource, name, uri, timeout_s)

    async def aread_resource(self, name: str, uri: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._loop_thread.arun(self._read_resource, name, uri, timeout_s)

    def get_prompt(
        self, name: str, prompt: str, arguments: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Renders a prompt: ``{"description"?: str, "messages": [{"role", "content"}, ...]}``."""
        return self._loop_thread.run(self._get_prompt, name, prompt, arguments, timeout_s)

    async def aget_prompt(
        self, name: str, prompt: str, arguments: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        return await self._loop_thread.arun(self._get_prompt, name, prompt, arguments, timeout_s)

    def on_loop_thread(self) -> bool:
        """True on the thread of ``event_loop()``: blocking there on MCP work never finishes."""
        return self._loop_thread.on_loop_thread()

    # -- the config table and the sessions -----------------------------------------------

    def _forget_unstarted(self, name: str) -> bool:
        """Removes the server right here when no loop (hence no session) exists yet."""
        with self._lock:
            self._loop_thread.check_open()
            if name not in self._configs:
                raise ConfigError(f"no MCP server named {name!r} is configured")
            if not self._loop_thread.started:
                del self._configs[name]
                return True
            return False

    async def _close_connections(self) -> None:
        """The loop thread's last work (see `LoopThread.close`): every session closes."""
        self._shutting_down = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(connection.close() for connection in connections))

    # -- work on the loop ----------------------------------------------------------------

    def _connection(self, name: str) -> _Connection:
        if self._shutting_down:
            raise ClosedError("McpServers was used after close()")
        with self._lock:
            config = self._configs.get(name)
        if config is None:
            raise ConfigError(f"no MCP server named {name!r} is configured")
        if config.disabled:
            raise ConfigError(f'MCP server {name!r} is disabled in its config ("disabled": true)')
        connection = self._connections.get(name)
        if connection is None:
            connection = self._connections[name] = _Connection(
                name, config, self._client_info, functools.partial(self._list_changed, name)
            )
        return connection

    def _timeout(self, timeout_s: float | None) -> float:
        return self._timeout_s if timeout_s is None else timeout_s

    async def _remove(self, name: str) -> None:
        # Config and session go together, with no await in between: a call that comes later
        # finds neither, and a server added again under this name gets a new session.
        with self._lock:
            if self._configs.pop(name, None) is None:
                raise ConfigError(f"no MCP server named {name!r} is configured")
        connection = self._connections.pop(name, None)
        if connection is not None:
            await connection.close()

    async def _connect(self, name: str, timeout_s: float | None) -> None:
        await self._connection(name).client(self._timeout(timeout_s))

    async def _list_tools(self, name: str, timeout_s: float | None) -> list[McpToolInfo]:
        return await _tools_list(self._connection(name), self._timeout(timeout_s))

    async def _list_resources(self, name: str, timeout_s: float | None) -> list[McpResourceInfo]:
        return await _resources_list(self._connection(name), self._timeout(timeout_s))

    async def _list_prompts(self, name: str, timeout_s: float | None) -> list[McpPromptInfo]:
        return await _prompts_list(self._connection(name), self._timeout(timeout_s))

    async def _call_tool(
        self, name: str, tool: str, arguments: Mapping[str, Any] | None, timeout_s: float | None
    ) -> dict[str, Any]:
        return await _tools_call(self._connection(name), tool, arguments, self._timeout(timeout_s))

    async def _read_resource(self, name: str, uri: str, timeout_s: float | None) -> dict[str, Any]:
        return await _resources_read(self._connection(name), uri, self._timeout(timeout_s))

    async def _get_prompt(
        self, name: str, prompt: str, arguments: Mapping[str, str] | None, timeout_s: float | None
    ) -> dict[str, Any]:
        return await _prompts_get(self._connection(name), prompt, arguments, self._timeout(timeout_s))

    async def _run_op(self, name: str, op: str, payload: Any, timeout_s: float | None) -> Any:
        payload = payload if isinstance(payload, Mapping) else {}
        if op == "resources.read":
            return await self._read_resource(name, str(payload.get("uri", "")), timeout_s)
        if op == "prompts.get":
            return await self._get_prompt(name, str(payload.get("name", "")), payload.get("arguments"), timeout_s)
        if op not in _OPS:
            raise McpServerError(f"unknown MCP request {op!r}", server=name)
        cursor = payload.get("cursor")
        return await _cell_listing(
            self._connection(name), _OPS[op], cursor if isinstance(cursor, str) else None, self._timeout(timeout_s)
        )


# -- the requests: what each sends on a server's connection, and how its answer reads -----------


async def _tools_list(connection: _Connection, timeout_s: float) -> list[McpToolInfo]:
    async def op(client: Client) -> list[McpToolInfo]:
        if client.server_capabilities.tools is None:
            return []  # (a server of resources or prompts only)
        pages = await _all_pages(connection.name, "tools/list", lambda cursor: client.list_tools(cursor=cursor))
        return [
            McpToolInfo(
                name=tool.name,
                description=tool.description or "",
                input_schema=tool.input_schema,
                output_schema=tool.output_schema,
                # The spec's display-name order: title, then annotations.title.
                title=tool.title or (tool.annotations.title if tool.annotations else None),
            )
            for page in pages
            for tool in page.tools
        ]

    return await connection.request("tools/list", op, timeout_s, replay_safe=True)


async def _resources_list(connection: _Connection, timeout_s: float) -> list[McpResourceInfo]:
    async def op(client: Client) -> list[McpResourceInfo]:
        if client.server_capabilities.resources is None:
            return []
        pages = await _all_pages(connection.name, "resources/list", lambda cursor: client.list_resources(cursor=cursor))
        return [
            McpResourceInfo(
                uri=resource.uri,
                name=resource.name,
                title=resource.title,
                description=resource.description,
                mime_type=resource.mime_type,
                size=resource.size,
                annotations=_dumped(resource.annotations),
                meta=resource.meta,
            )
            for page in pages
            for resource in page.resources
        ]

    return await connection.request("resources/list", op, timeout_s, replay_safe=True)


async def _prompts_list(connection: _Connection, timeout_s: float) -> list[McpPromptInfo]:
    async def op(client: Client) -> list[McpPromptInfo]:
        if client.server_capabilities.prompts is None:
            return []
        pages = await _all_pages(connection.name, "prompts/list", lambda cursor: client.list_prompts(cursor=cursor))
        return [
            McpPromptInfo(
                name=prompt.name,
                title=prompt.title,
                description=prompt.description,
                arguments=tuple(
                    McpPromptArgument(name=arg.name, description=arg.description, required=bool(arg.required))
                    for arg in prompt.arguments or ()
                ),
                meta=prompt.meta,
            )
            for page in pages
            for prompt in page.prompts
        ]

    return await connection.request("prompts/list", op, timeout_s, replay_safe=True)


async def _tools_call(
    connection: _Connection, tool: str, arguments: Mapping[str, Any] | None, timeout_s: float
) -> dict[str, Any]:
    async def op(client: Client) -> dict[str, Any]:
        result = await client.call_tool(tool, dict(arguments) if arguments is not None else None)
        # Only the spec's McpToolResult fields: the envelope (resultType, _meta) is protocol.
        return result.model_dump(
            mode="json", by_alias=True, exclude_none=True, include={"content", "structured_content", "is_error"}
        )

    return await connection.request(f"tools/call {tool!r}", op, timeout_s, replay_safe=False)


async def _resources_read(connection: _Connection, uri: str, timeout_s: float) -> dict[str, Any]:
    async def op(client: Client) -> dict[str, Any]:
        _offers(connection.name, client, "resources")
        result = await client.read_resource(uri)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True, include={"contents"})

    return await connection.request(f"resources/read {uri!r}", op, timeout_s, replay_safe=True)


async def _prompts_get(
    connection: _Connection, prompt: str, arguments: Mapping[str, str] | None, timeout_s: float
) -> dict[str, Any]:
    async def op(client: Client) -> dict[str, Any]:
        _offers(connection.name, client, "prompts")
        result = await client.get_prompt(prompt, dict(arguments) if arguments is not None else None)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True, include={"description", "messages"})

    return await connection.request(f"prompts/get {prompt!r}", op, timeout_s, replay_safe=True)


async def _cell_listing(
    connection: _Connection, kind: Literal["resources", "prompts"], cursor: str | None, timeout_s: float
) -> dict[str, Any]:
    """A cell's ``resources.list`` / ``prompts.list`` (see `McpServers.run_op`)."""

    async def listing(client: Client) -> dict[str, Any]:
        if getattr(client.server_capabilities, kind) is None:
            return {kind: []}
        fetch = client.list_resources if kind == "resources" else client.list_prompts
        return await _listing(fetch, kind, cursor)

    return await connection.request(f"{kind}/list", listing, timeout_s, replay_safe=True)


class _Connection:
    """One server's session, owned by the loop thread, reopened after it breaks.

    The session lives in a holder task (see ``_hold``) because anyio requires the task that
    entered the transport's and the session's task groups to be the one that leaves them;
    requests from other tasks only use the ``Client``.
    """

    def __init__(
        self, name: str, config: McpServerConfig, client_info: Implementation, changed: Callable[[], None]
    ) -> None:
        self.name = name
        self.config = config
        self._client_info = client_info
        #: Called when the server says a listing changed.
        self._changed = changed
        self._client: Client | None = None
        self._holder: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Client] | None = None
        #: Set when the session must end: the server's stream ended, a request found the
        #: connection gone, or we are closing. The holder then closes the session.
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closed = False

    def _live(self) -> Client | None:
        return None if self._stop.is_set() else self._client

    def _mark_broken(self, client: Client) -> None:
        """Ends ``client``'s session, unless a newer session already replaced it."""
        if client is self._client:
            self._stop.set()

    async def request(
        self, what: str, op: Callable[[Client], Awaitable[T]], timeout_s: float, *, replay_safe: bool
    ) -> T:
        """Runs one request; ``replay_safe`` ones (reads) get one more try if the connection drops.

        A request whose connection drops in flight may have reached the server, so a
        ``tools/call`` is not sent again: it fails, and the next call opens a new session.
        """
        try:
            return await self._attempt(what, op, timeout_s)
        except _ConnectionLost as lost:
            if not replay_safe:
                raise McpServerError(
                    f"MCP server {self.name!r} is unavailable: the connection was lost during {what} ({lost}); "
                    "not retried because it may have run. The next call reconnects.",
                    server=self.name,
                ) from lost.__cause__
        try:
            return await self._attempt(what, op, timeout_s)
        except _ConnectionLost as lost:
            raise McpServerError(
                f"MCP server {self.name!r} is unavailable: the connection was lost during {what}, twice ({lost})",
                server=self.name,
            ) from lost.__cause__

    async def _attempt(self, what: str, op: Callable[[Client], Awaitable[T]], timeout_s: float) -> T:
        """Runs ``op`` on the live session within ``timeout_s``, mapping SDK failures.

        Raises ``_ConnectionLost`` (after ending the session) when the connection went away
        under the request, so that ``request`` can decide whether to send it again.
        """
        client = await self.client(timeout_s)
        try:
            with anyio.fail_after(timeout_s):
                return await op(client)
        except McpServerError:
            raise  # already ours (e.g. a listing that paginates without end)
        except TimeoutError:
            raise McpTimeoutError(
                f"MCP server {self.name!r} did not answer {what} within {timeout_s:g} s", server=self.name
            ) from None
        except MCPError as e:
            if e.code != CONNECTION_CLOSED:
                raise McpServerError(
                    f"MCP server {self.name!r} rejected {what}: {e.message} (error {e.code})",
                    server=self.name,
                    code=e.code,
                ) from None
            self._mark_broken(client)
            raise _ConnectionLost(e.message) from e
        except _CONNECTION_ERRORS as e:
            self._mark_broken(client)
            raise _ConnectionLost(_describe(e)) from e
        except (ValidationError, RuntimeError) as e:
            # The SDK's verdict on the answer (a malformed result, structured content that
            # breaks the tool's output schema): the connection itself is fine.
            raise McpServerError(f"MCP server {self.name!r} failed {what}: {_describe(e)}", server=self.name) from e
        except Exception as e:
            # Unknown state: start the next request on a new session.
            self._mark_broken(client)
            raise McpServerError(f"MCP server {self.name!r} failed {what}: {_describe(e)}", server=self.name) from e

    async def client(self, timeout_s: float) -> Client:
        """The live session, (re)connecting first when there is none.

        Checked right before each request: a session whose stream already ended is replaced
        here, so a request is never sent into a connection known to be dead.
        """
        client = self._live()
        if client is not None:
            return client
        async with self._lock:
            if self._closed:
                raise ClosedError(f"MCP server {self.name!r} was removed or closed")
            client = self._live()
            if client is None:
                await self._release()
                client = await self._open(timeout_s)
            return client

    async def close(self) -> None:
        self._closed = True
        await self._release()

    async def _open(self, timeout_s: float) -> Client:
        config = self.config
        if not (isinstance(config, McpHttpServerConfig) and config.type == "auto"):
            return await self._open_with(config, timeout_s)
        try:
            return await self._open_with(msgspec.structs.replace(config, type="http"), timeout_s)
        except McpTimeoutError:
            raise  # the budget is spent
        except McpServerError as over_http:
            try:
                return await self._open_with(msgspec.structs.replace(config, type="sse"), timeout_s)
            except McpServerError as over_sse:
                cause = over_sse.__cause__
                why = _describe_connect_failure(cause) if cause is not None else str(over_sse)
                raise McpServerError(f"{over_http}; over SSE: {why}", server=self.name) from over_sse

    async def _open_with(self, config: McpServerConfig, timeout_s: float) -> Client:
        """Opens a session over ``config``'s transport; the one that answers is kept in
        ``self.config`` (an ``auto`` entry then reconnects the same way)."""
        self._stop = asyncio.Event()
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._ready = ready
        self._holder = asyncio.create_task(self._hold(config, ready, self._stop), name=f"mcp-server-{self.name}")
        try:
            # shield: giving up waiting must not cancel ``ready`` under the holder.
            client = await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except asyncio.TimeoutError:
            await self._release()
            raise McpTimeoutError(
                f"MCP server {self.name!r} is unavailable: no MCP handshake within {timeout_s:g} s", server=self.name
            ) from None
        except asyncio.CancelledError:
            if not ready.cancelled():
                raise
            # The holder was cancelled before the handshake finished: close() or remove().
            raise ClosedError(f"MCP server {self.name!r} was closed while connecting") from None
        except Exception as e:
            await self._release()
            raise McpServerError(
                f"MCP server {self.name!r} is unavailable: {_describe_connect_failure(e)}", server=self.name
            ) from e
        self.config = config
        self._client = client
        return client

    async def _hold(self, config: McpServerConfig, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Opens the transport and session, publishes the client, and closes both on ``stop``."""
        try:
            client = Client(
                _open_streams(config, on_end=stop.set),
                client_info=self._client_info,
                # The catalog decides when to refetch listings; a response cache would only
                # hide a server's changes from it.
                cache=None,
                message_handler=self._on_message,
            )
            async with client:
                ready.set_result(client)
                async with anyio.create_task_group() as listening:
                    listening.start_soon(self._listen, client)
                    await stop.wait()
                    listening.cancel_scope.cancel()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except Exception as e:
            if not ready.done():
                ready.set_exception(e)
            else:
                logger.debug("MCP server %r: the session ended with an error", self.name, exc_info=True)
        finally:
            stop.set()

    async def _on_message(self, message: Any) -> None:
        """Server notifications of a session before 2026-07-28: a listing changed."""
        if isinstance(message, _LIST_CHANGED):
            self._changed()
        await anyio.lowlevel.checkpoint()

    async def _listen(self, client: Client) -> None:
        """On a 2026-07-28 session whose server announces list changes: a ``subscriptions/
        listen`` stream, each event of which says a listing changed. Older sessions get
        notifications instead (`_on_message`); a stream that cannot open or breaks is let go
        (the session's own requests say whether the server is still there)."""
        caps = client.server_capabilities
        tools = bool(caps.tools and caps.tools.list_changed)
        prompts = bool(caps.prompts and caps.prompts.list_changed)
        resources = bool(caps.resources and caps.resources.list_changed)
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (tools or prompts or resources):
            return
        try:
            async with client.listen(
                tools_list_changed=tools, prompts_list_changed=prompts, resources_list_changed=resources
            ) as events:
                async for _event in events:
                    self._changed()
        except Exception:
            logger.debug("MCP server %r: no list-changed stream", self.name, exc_info=True)

    async def _release(self) -> None:
        """Stops the holder task (if any) and waits, bounded, until the session is closed."""
        self._client = None
        holder, ready = self._holder, self._ready
        self._holder = self._ready = None
        if holder is None:
            return
        self._stop.set()
        if ready is not None and not ready.done():
            # Still in the handshake, which does not watch ``stop``.
            holder.cancel()
        # asyncio.wait, not wait_for: it neither raises the holder's outcome nor cancels the
        # holder when *this* task is cancelled.
        done, _ = await asyncio.wait({holder}, timeout=_CLOSE_TIMEOUT_S)
        if not done:
            logger.warning("MCP server %r did not close within %g s; abandoning it", self.name, _CLOSE_TIMEOUT_S)
            holder.cancel()


#: The notifications that say a listing changed (sessions before 2026-07-28).
_LIST_CHANGED = (ToolListChangedNotification, ResourceListChangedNotification, PromptListChangedNotification)


class _ConnectionLost(Exception):
    """The connection went away while a request was in flight (internal; see `_Connection.request`)."""


class _EndWatch:
    """A transport's read stream that reports when it ends.

    The SDK has no public signal that a server went away while idle. The end of this stream is
    that signal: the stdio transport ends it when the process's stdout closes (the process
    died, or its stdin write failed), the HTTP transport when its session is torn down. Seeing
    it before the next request is what lets that request go to a new session instead of
    failing.
    """

    def __init__(self, inner: ReadStream[SessionMessage | Exception], on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> contextvars.Context | None:
        """The sender's context snapshot, which the SDK's dispatcher reads if present (HTTP)."""
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _SsePostWatch(httpx2.AsyncHTTPTransport):
    """The SSE transport's HTTP: a message POST that fails (an HTTP error, or no connection)
    ends the session. The SDK's SSE client only logs such a failure and stops sending, so the
    request waited its whole timeout and the next one was sent into a dead session."""

    def __init__(self, on_end: Callable[[], None]) -> None:
        super().__init__()
        self._on_end = on_end

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await super().handle_async_request(request)
        except Exception:
            if request.method == "POST":
                self._on_end()
            raise
        if request.method == "POST" and response.status_code >= 400:
            self._on_end()
        return response


@asynccontextmanager
async def _open_streams(config: McpServerConfig, on_end: Callable[[], None]) -> AsyncIterator[TransportStreams]:
    """The SDK transport for ``config`` (a ``mcp.client.Transport``), with its end watched."""
    async with AsyncExitStack() as stack:
        if isinstance(config, McpStdioServerConfig):
            params = StdioServerParameters(
                command=config.command, args=list(config.args), env=dict(config.env), cwd=config.cwd
            )
            # The server's stderr (its logs) goes to the host's stderr, as other MCP clients do.
            transport = stdio_client(params, errlog=sys.stderr)
        elif config.type == "sse":
            # sse_client builds its HTTP client itself, from the same headers and timeouts, with
            # a transport that notices failed POSTs (see `_SsePostWatch`).
            def client(
                headers: dict[str, str] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                return httpx2.AsyncClient(transport=_SsePostWatch(on_end), headers=headers, timeout=timeout, auth=auth)

            transport = sse_client(
                config.url,
                headers=config.headers,
                timeout=_HTTP_TIMEOUT_S,
                sse_read_timeout=_HTTP_READ_TIMEOUT_S,
                httpx_client_factory=client,
            )
        else:
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=config.headers, timeout=_HTTP_TIMEOUT))
            transport = streamable_http_client(config.url, http_client=http)
        read, write = await stack.enter_async_context(transport)
        yield _EndWatch(read, on_end), write


async def _all_pages(server: str, what: str, fetch: Callable[[str | None], Awaitable[PageT]]) -> list[PageT]:
    pages: list[PageT] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await fetch(cursor)
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None:
            return pages
    raise McpServerError(f"MCP server {server!r} returned more than {_MAX_PAGES} pages for {what}", server=server)


async def _listing(fetch: Callable[..., Awaitable[Any]], kind: str, cursor: str | None) -> dict[str, Any]:
    """``{kind: items, "nextCursor"?}`` from ``cursor`` on, within `_MAX_LISTING_PAGES` pages
    and `_MAX_LISTING_ITEMS` items (whole pages: a cursor only resumes at a page's end)."""
    items: list[Any] = []
    for _ in range(_MAX_LISTING_PAGES):
        page = await fetch(cursor=cursor)
        items.extend(item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in getattr(page, kind))
        cursor = page.next_cursor
        if cursor is None or len(items) >= _MAX_LISTING_ITEMS:
            break
    return {kind: items} if cursor is None else {kind: items, "nextCursor": cursor}


def _offers(server: str, client: Client, kind: Literal["resources", "prompts"]) -> None:
    """Refuses a request the server's capabilities do not announce (it would answer "Method not
    found", or worse)."""
    if getattr(client.server_capabilities, kind) is None:
        raise McpServerError(f"MCP server {server!r} does not offer {kind} (its capabilities say so)", server=server)


def _dumped(model: Any) -> dict[str, Any] | None:
    return None if model is None else dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, which anyio task groups raise."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    error = _leaf(error)
    if isinstance(error, MCPError):
        return error.message
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _describe_connect_failure(error: BaseException) -> str:
    leaf = _leaf(error)
    if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
        return "the connection closed during the MCP handshake (did the server exit?)"
    if isinstance(leaf, OSError | httpx2.TransportError):
        return f"could not start or reach it: {_describe(leaf)}"
    return f"the MCP handshake failed: {_describe(leaf)}"
