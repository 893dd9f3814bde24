"""``codemode serve``: codemode itself as an MCP server that exposes ``exec`` and ``wait``.

Any MCP client can then use code mode over the MCP servers it already has: the servers named
in the config file (``mcpServers``, the format MCP clients use) become the hidden catalog, plus
Python tools given with ``--tools module:attr``. Transports: stdio, and streamable HTTP bound to
localhost.

Each client drives its own code mode session: its suspended runs and its stored values are
nobody else's. A stdio process serves one client, so it holds one session. Over HTTP a client is
its MCP session (the ``Mcp-Session-Id`` the SDK mints at ``initialize`` and checks on every
request): its code mode session is made at its first ``exec``/``wait`` and released, runs and
stored values with it, when the MCP session ends (the client's DELETE) or once the SDK has
expired it for idleness. The 2026-07-28 protocol revision has no sessions, so nothing would tell
one client from another: HTTP refuses it with the handshake versions it serves, and an MCP client
in ``auto`` mode falls back to the initialize handshake. An optional bearer token guards every
HTTP request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_TIMEOUT
from mcp.shared.exceptions import MCPError
from mcp_types import (
    UNSUPPORTED_PROTOCOL_VERSION,
    CallToolResult,
    ImageContent,
    TextContent,
    UnsupportedProtocolVersionErrorData,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from .errors import CodemodeError, ConfigError
from .rendering import render
from .session import CodeMode, Session
from .store import Store
from .surfaces import WAIT_DESCRIPTION

__all__ = [
    "TOKEN_ENV",
    "HttpClients",
    "build_server",
    "http_app",
    "load_servers_config",
    "read_token",
    "serve_http",
    "serve_stdio",
]

_log = logging.getLogger(__name__)

#: ``--http`` listens here only: the server runs cells with the operator's tools.
HOST = "127.0.0.1"
#: The environment variable ``--http`` reads its bearer token from (``--token-file`` instead).
TOKEN_ENV = "CODEMODE_SERVE_TOKEN"
#: A token is a secret a person generates (``secrets.token_urlsafe(32)`` gives 43 characters).
MIN_TOKEN_CHARS = 32
#: RFC 6750's ``b64token``: what may follow ``Bearer `` in an Authorization header.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
#: How long after the SDK's idle timeout a client's session is released. The SDK expires an MCP
#: session from the same last activity (its requests lie within ours), and once it has, that id
#: answers 404 forever; the margin covers the SDK's own teardown running a little late.
REAP_MARGIN_S = 5.0

_SESSIONLESS = (
    "codemode serve keeps each client's suspended runs and stored values in its MCP session, and the "
    "2026-07-28 protocol has no sessions: connect with the initialize handshake (a supported version)"
)


def load_servers_config(path: Path) -> dict[str, Any]:
    """Reads an MCP client config file: ``{"mcpServers": {...}}``, or VS Code's ``mcp.json``
    (``{"servers": {...}}``) when there is no ``mcpServers``; other keys are ignored."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read MCP config {path}: {e}") from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f"{path} has no `mcpServers` (or VS Code `servers`) object")
    return servers


def read_token(token_file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The bearer token ``--http`` demands: from ``token_file`` or ``$CODEMODE_SERVE_TOKEN`` (never
    a command-line value, which other users can read in ``ps``); None if neither is given."""
    from_env = environ.get(TOKEN_ENV) or None
    if token_file is not None and from_env is not None:
        raise ConfigError(f"give the bearer token in --token-file or in ${TOKEN_ENV}, not both")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the token file {token_file}: {e}") from None
    elif from_env is not None:
        token = from_env
    else:
        return None
    # The messages never quote the token: they end up in logs.
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the bearer token must be at least {MIN_TOKEN_CHARS} characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)"
        )
    if _B64TOKEN.fullmatch(token) is None:
        raise ConfigError("the bearer token may hold only the characters A-Z a-z 0-9 - . _ ~ + / (and = at its end)")
    return token


def build_server(
    cm: CodeMode,
    session_for: Callable[[Context[Any, Any]], AbstractContextManager[Session]],
    *,
    sessions_only: bool = False,
) -> MCPServer:
    """An MCP server whose two tools run cells against ``cm``'s catalog, each in the session
    ``session_for`` gives for the calling client. ``sessions_only`` refuses the sessionless
    protocol revision (HTTP: a client must have an MCP session to have a code mode session)."""
    server = MCPServer(
        name="codemode",
        instructions="Code mode: write a short JavaScript/TypeScript cell with `exec`; resume it with `wait`.",
        middleware=[_refuse_sessionless] if sessions_only else None,
    )

    async def exec(
        ctx: Context[Any, Any],
        code: str,
        language: Literal["javascript", "typescript"] = "javascript",
        restartSafe: bool = False,
    ) -> CallToolResult:
        with session_for(ctx) as session:
            args = {"code": code, "language": language, "restartSafe": restartSafe}
            return _tool_result(await session.handle_async("exec", args))

    async def wait(ctx: Context[Any, Any], runId: str, answer: str | None = None) -> CallToolResult:
        with session_for(ctx) as session:
            return _tool_result(await session.handle_async("wait", {"runId": runId, "answer": answer}))

    server.add_tool(exec, name="exec", description=cm.exec_description(), structured_output=False)
    server.add_tool(wait, name="wait", description=WAIT_DESCRIPTION, structured_output=False)
    return server


def _tool_result(result: dict[str, Any]) -> CallToolResult:
    """A cell's result as the client's model reads it (`codemode.rendering`): a failed cell is
    an ``isError`` result, an image output an image block."""
    rendered = render(result)
    images = [ImageContent(data=image.data, mime_type=image.mime_type) for image in rendered.images]
    return CallToolResult(content=[TextContent(text=rendered.text), *images], is_error=rendered.is_error)


async def _refuse_sessionless(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Answers a 2026-07-28 request with -32022 naming the handshake versions (``auto`` clients
    then fall back to ``initialize``); drops its notifications, as that revision does anyway."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return await call_next(ctx)
    if ctx.request_id is None:
        return None
    supported = UnsupportedProtocolVersionErrorData(
        supported=list(HANDSHAKE_PROTOCOL_VERSIONS), requested=ctx.protocol_version
    )
    raise MCPError(code=UNSUPPORTED_PROTOCOL_VERSION, message=_SESSIONLESS, data=supported.model_dump(mode="json"))


def serve_stdio(cm: CodeMode) -> None:
    """Serves the one client at the other end of stdin/stdout, in one session."""
    session = cm.session("serve")
    build_server(cm, lambda ctx: nullcontext(session)).run("stdio")


@dataclass(eq=False)
class _Client:
    session: Session
    #: ``time.monotonic()`` at the end of its last accepted request or call.
    active_at: float
    #: ``exec``/``wait`` calls running (one can outlive its HTTP request).
    calls: int = 0
    #: Its MCP session was ended (DELETE); released once nothing of it runs.
    ended: bool = False


class HttpClients:
    """The code mode session of each MCP session of ``codemode serve --http``, by its
    ``Mcp-Session-Id``.

    A client's session is made at its first ``exec``/``wait`` and released (its suspended runs
    cancelled, its stored values deleted) when its MCP session ends or has expired: the SDK ends
    it at a DELETE and expires it ``idle_timeout`` after its last request (an open GET stream
    counts); this table sees the same requests (through ``tracked``), and a new client's first
    call releases every session idle for ``expire_after_s``. So the table holds the SDK's open
    sessions plus the ones it expired since the last new client arrived: however often clients
    connect, it is bounded by the SDK's own session limit (twice over at most). It is touched
    only from the server's event loop.
    """

    def __init__(self, cm: CodeMode, store: Store, *, expire_after_s: float) -> None:
        self._cm = cm
        #: The store ``cm`` commits to: a released client's values are deleted from it.
        self._store = store
        self._expire_after = expire_after_s
        #: By MCP session id, least recently active first.
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        #: HTTP requests in flight, by the session id they name (an entry lasts while they do).
        self._requests: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._clients)

    @contextmanager
    def call(self, mcp_session_id: str) -> Iterator[Session]:
        """The client's session for one ``exec`` or ``wait``."""
        client = self._clients.get(mcp_session_id)
        if client is None:
            now = time.monotonic()
            self._expire(now)
            # A fresh random id, not the header's: no value a client sends names a session.
            session = self._cm.session("serve:" + secrets.token_hex(16))
            client = self._clients[mcp_session_id] = _Client(session, now)
        client.calls += 1
        try:
            yield client.session
        finally:
            client.calls -= 1
            self._active(mcp_session_id, client)

    def tracked(self, app: ASGIApp) -> ASGIApp:
        """``app`` (the SDK's streamable HTTP app), telling this table about each request that
        names an MCP session: while it is in flight, when it was accepted, when it ended one."""

        async def tracked(scope: Scope, receive: Receive, send: Send) -> None:
            session_id = _header(scope, b"mcp-session-id") if scope["type"] == "http" else None
            if session_id is None:
                await app(scope, receive, send)
                return
            status = 0

            async def watch(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            self._requests[session_id] = self._requests.get(session_id, 0) + 1
            try:
                await app(scope, receive, watch)
            finally:
                # Only what the SDK accepted counts: a 404 (unknown id), a 421/403 (Host, Origin)
                # keeps nobody's session.
                accepted = 200 <= status < 300
                self._request_done(session_id, accepted, accepted and scope["method"] == "DELETE")

        return tracked

    def _request_done(self, session_id: str, accepted: bool, ended: bool) -> None:
        left = self._requests[session_id] - 1
        if left:
            self._requests[session_id] = left
        else:
            del self._requests[session_id]
        client = self._clients.get(session_id)
        if client is None:
            return
        client.ended = client.ended or ended
        if accepted:
            self._active(session_id, client)

    def _active(self, session_id: str, client: _Client) -> None:
        if client.ended:
            if not self._busy(session_id, client):
                self._release(session_id)
            return
        client.active_at = time.monotonic()
        self._clients.move_to_end(session_id)

    def _busy(self, session_id: str, client: _Client) -> bool:
        return client.calls > 0 or session_id in self._requests

    def _expire(self, now: float) -> None:
        for session_id, client in list(self._clients.items()):
            if now - client.active_at < self._expire_after:
                break  # the rest were active later
            if not self._busy(session_id, client):
                self._release(session_id)

    def _release(self, session_id: str) -> None:
        session = self._clients[session_id].session
        try:
            session.close()
            kept = self._store.snapshot(session.session_id, session.branch)
            if kept:
                self._store.commit(session.session_id, session.branch, dict.fromkeys(kept))
        except CodemodeError as e:  # the store failed or is closed (shutting down): values stay
            _log.warning("codemode serve: could not delete a closed session's stored values: %s", e)
        finally:
            # Last, so a client counted out of the table has nothing left behind.
            del self._clients[session_id]


def _header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of an HTTP request (lower-case ``name``)."""
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)


def _bearer(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` behind ``Authorization: Bearer <token>``: every other HTTP request is answered 401
    (every path and method, before the SDK's Host/Origin checks, which then still apply)."""
    # Digests of equal length, compared in constant time: timing tells nothing of the token,
    # not even its length.
    expected = hashlib.sha256(token.encode()).digest()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await app(scope, receive, send)
            return
        scheme, _, credential = (_header(scope, b"authorization") or "").partition(" ")
        presented = hashlib.sha256(credential.strip().encode("latin-1")).digest()
        if hmac.compare_digest(presented, expected) and scheme.lower() == "bearer":
            await app(scope, receive, send)
        elif scope["type"] == "websocket":
            await WebSocketClose(code=1008)(scope, receive, send)
        else:
            refusal = JSONResponse(
                {"error": "invalid_token", "error_description": "a valid bearer token is required"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="codemode serve"'},
            )
            await refusal(scope, receive, send)

    return guarded


def http_app(
    cm: CodeMode,
    store: Store,
    *,
    token: str | None = None,
    idle_timeout_s: float = DEFAULT_SESSION_IDLE_TIMEOUT,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    reap_margin_s: float = REAP_MARGIN_S,
) -> tuple[ASGIApp, HttpClients]:
    """The ASGI app ``codemode serve --http`` runs, and its table of client sessions. ``store``
    is the one ``cm`` was built with; MCP sessions idle for ``idle_timeout_s`` expire, at most
    ``max_sessions`` are open at once (more are answered 503 by the SDK)."""
    clients = HttpClients(cm, store, expire_after_s=idle_timeout_s + reap_margin_s)

    def session_for(ctx: Context[Any, Any]) -> AbstractContextManager[Session]:
        # Every HTTP call names its MCP session (the SDK serves no call before `initialize`, nor
        # one without the session id it minted there), and the session is the SDK's to check.
        return clients.call((ctx.headers or {})[MCP_SESSION_ID_HEADER])

    server = build_server(cm, session_for, sessions_only=True)
    sdk_app = server.streamable_http_app(host=HOST, session_idle_timeout=idle_timeout_s, max_sessions=max_sessions)
    app = clients.tracked(sdk_app)
    return (app if token is None else _bearer(app, token)), clients


def serve_http(cm: CodeMode, store: Store, port: int, token: str | None) -> None:
    """Serves streamable HTTP on 127.0.0.1:``port`` until interrupted."""
    import uvicorn

    app, _ = http_app(cm, store, token=token)
    uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="info")).run()
