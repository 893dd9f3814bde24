"""``codemode serve`` keeps its MCP clients apart: each client gets its own code mode session
(its suspended runs, its stored values), the session goes when the client's MCP session ends or
expires, and ``--http`` can demand a bearer token.

Driven by the ``mcp`` SDK's own clients against ``codemode serve`` as a real subprocess; the
tests that count the session table run the same HTTP app in this process, under uvicorn, so
they can look at the table.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from codemode import CodeMode
from codemode.runs import FOREIGN, UNAVAILABLE
from codemode.serve import HttpClients, http_app
from codemode.store import SqliteStore
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_servers import wait_until

TOKEN = "tok_" + "x" * 28
PARK = "store('mine', 'parked'); await yield_control('check in'); return load('mine')"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def listening(port: int, process: subprocess.Popen[bytes] | None = None, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
                raise AssertionError(f"codemode serve did not listen on port {port}") from None
            time.sleep(0.05)


@contextmanager
def serve_http(*args: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """``codemode serve --http PORT`` as a subprocess; yields its MCP URL."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if k != "CODEMODE_SERVE_TOKEN"}
    environ.update(env or {})
    process = subprocess.Popen(
        [sys.executable, "-m", "codemode.cli", "serve", "--http", str(port), *args],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


@asynccontextmanager
async def connect(url: str, *, token: str | None = None, end_session: bool = True) -> AsyncIterator[Client]:
    """A real MCP client over streamable HTTP (``end_session=False``: it goes without a DELETE)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        transport = streamable_http_client(url, http_client=http, terminate_on_close=end_session)
        async with Client(transport) as client:
            yield client


def decoded(called: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads("".join(getattr(block, "text", "") for block in called.content))
    return result


async def run(client: Client, code: str) -> dict[str, Any]:
    return decoded(await client.call_tool("exec", {"code": code}))


async def resume(client: Client, run_id: str) -> dict[str, Any]:
    return decoded(await client.call_tool("wait", {"runId": run_id}))


async def value(client: Client, code: str) -> Any:
    result = await run(client, code)
    assert result["status"] == "completed", result
    return result["value"]


# ---- two clients of one `codemode serve --http` ---------------------------------------------------


def test_one_http_clients_stored_values_are_not_visible_to_another():
    async def clients(url: str) -> tuple[Any, Any, Any]:
        async with connect(url) as a, connect(url) as b:
            await value(a, "store('secret', 'of A'); return 1")
            seen_by_b = await value(b, "return load('secret') ?? 'absent'")
            await value(b, "store('secret', 'of B'); return 1")
            return seen_by_b, await value(a, "return load('secret')"), await value(b, "return load('secret')")

    with serve_http() as url:
        seen_by_b, a_reads, b_reads = asyncio.run(clients(url))
    assert seen_by_b == "absent"
    assert (a_reads, b_reads) == ("of A", "of B")


def test_a_run_id_of_one_http_client_fails_for_another_and_stays_the_first_clients():
    async def clients(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with connect(url) as a, connect(url) as b:
            parked = await run(a, PARK)
            assert parked["status"] == "waiting", parked
            by_b = await resume(b, parked["runId"])
            again_by_b = await resume(b, parked["runId"])
            return by_b, again_by_b, await resume(a, parked["runId"])

    with serve_http() as url:
        by_b, again_by_b, by_a = asyncio.run(clients(url))
    for refused in (by_b, again_by_b):
        assert refused["status"] == "failed"
        assert refused["code"] == "invalid_input"
        assert refused["error"] in (UNAVAILABLE, FOREIGN)
    assert by_a["status"] == "completed", by_a
    assert by_a["value"] == "parked"


def test_a_client_pinned_to_the_sessionless_protocol_is_told_which_versions_serve_it():
    async def pinned(url: str) -> MCPError:
        async with Client(url, mode="2026-07-28") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("exec", {"code": "return 1"})
            return refused.value

    with serve_http() as url:
        refused = asyncio.run(pinned(url))
    assert refused.code == -32022
    assert refused.error.data is not None
    assert refused.error.data["supported"] == ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
    assert "has no sessions" in refused.error.message


# ---- stdio: one process, one client ----------------------------------------------------------------


def test_a_stdio_server_is_one_clients_session_across_calls():
    params = StdioServerParameters(command=sys.executable, args=["-m", "codemode.cli", "serve"])

    async def session() -> tuple[dict[str, Any], Any]:
        async with Client(params) as client:
            parked = await run(client, PARK)
            assert parked["status"] == "waiting", parked
            return await resume(client, parked["runId"]), await value(client, "return load('mine')")

    done, stored = asyncio.run(session())
    assert done["status"] == "completed", done
    assert (done["value"], stored) == ("parked", "parked")


# ---- the bearer token ----------------------------------------------------------------------------


def _raw(url: str, method: str, headers: Mapping[str, str]) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"} if method == "POST" else None
    merged = {"Accept": "application/json, text/event-stream", **headers}
    return httpx2.request(method, url, headers=merged, json=body)


@pytest.mark.parametrize("how", ["env", "file"])
def test_http_with_a_token_refuses_every_request_without_it_and_serves_the_mcp_client_with_it(tmp_path: Path, how: str):
    if how == "env":
        args: tuple[str, ...] = ()
        env = {"CODEMODE_SERVE_TOKEN": TOKEN}
    else:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        args, env = ("--token-file", str(token_file)), {}

    async def authorised(url: str) -> Any:
        async with connect(url, token=TOKEN) as client:
            return await value(client, "return 6 * 7")

    with serve_http(*args, env=env) as url:
        refused = [
            _raw(target, method, headers)
            for target in (url, url.removesuffix("/mcp") + "/elsewhere")
            for method in ("POST", "GET", "DELETE")
            for headers in (
                {},
                {"Authorization": "Bearer " + TOKEN[:-1] + "y"},
                {"Authorization": "Bearer " + TOKEN + "x"},
                {"Authorization": "Basic " + TOKEN},
                {"Authorization": TOKEN},
            )
        ]
        wrong_host = _raw(url, "POST", {"Authorization": "Bearer " + TOKEN, "Host": "evil.example"})
        wrong_origin = _raw(url, "POST", {"Authorization": "Bearer " + TOKEN, "Origin": "http://evil.example"})
        answer = asyncio.run(authorised(url))
    assert {r.status_code for r in refused} == {401}
    assert all(r.headers["www-authenticate"].startswith("Bearer") for r in refused)
    assert wrong_host.status_code == 421
    assert wrong_origin.status_code == 403
    assert answer == 42


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--http", "1"), {"CODEMODE_SERVE_TOKEN": "short"}, "at least 32 characters"),
        (("--http", "1"), {"CODEMODE_SERVE_TOKEN": "a b" * 16}, "characters"),
        (("--token-file", "{file}"), {}, "--token-file needs --http"),
        (("--http", "1", "--token-file", "{file}"), {"CODEMODE_SERVE_TOKEN": TOKEN}, "not both"),
        (("--http", "1", "--token-file", "{missing}"), {}, "cannot read the token file"),
    ],
)
def test_serve_refuses_a_token_it_cannot_use(tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv = [a.format(file=token_file, missing=tmp_path / "nope") for a in args]
    environ = {k: v for k, v in os.environ.items() if k != "CODEMODE_SERVE_TOKEN"} | env
    proc = subprocess.run(
        [sys.executable, "-m", "codemode.cli", "serve", *argv],
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("codemode: error: ")
    assert message in proc.stderr
    assert TOKEN not in proc.stderr


# ---- the session table: released when the MCP session ends or expires --------------------------


class RecordingStore:
    """A real SQLite store that remembers which sessions wrote to it."""

    def __init__(self) -> None:
        self.inner = SqliteStore()
        self.sessions: set[tuple[str, str]] = set()

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        return self.inner.snapshot(session_id, branch)

    def commit(self, session_id: str, branch: str, writes: Mapping[str, str | None]) -> None:
        self.sessions.add((session_id, branch))
        self.inner.commit(session_id, branch, writes)

    def close(self) -> None:
        self.inner.close()

    def rows(self) -> dict[tuple[str, str], dict[str, str]]:
        return {key: kept for key in self.sessions if (kept := self.inner.snapshot(*key))}


@dataclass
class Served:
    url: str
    clients: HttpClients
    store: RecordingStore
    cm: CodeMode


@pytest.fixture
def in_process(make_codemode):
    """``codemode serve --http``'s app under uvicorn in this process, to look at its table."""
    started: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**options: Any) -> Served:
        store = RecordingStore()
        cm: CodeMode = make_codemode({"workers": 1}, store=store)
        app, clients = http_app(cm, store, **options)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((server, thread))
        wait_until(lambda: server.started, "uvicorn did not start", 30)
        return Served(f"http://127.0.0.1:{port}/mcp", clients, store, cm)

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(30)


def test_clients_that_end_their_sessions_leave_no_session_runs_or_values_behind(in_process):
    served = in_process()
    url, clients, store = served.url, served.clients, served.store
    cm_runs: list[int] = []

    async def cycles() -> None:
        for _ in range(30):
            async with connect(url) as client:
                await value(client, "store('k', 'v'.repeat(1000)); return 1")
                parked = await run(client, PARK)
                assert parked["status"] == "waiting", parked
                assert len(clients) == 1
            # Released once the DELETE and the client's GET stream, which the SDK then closes,
            # have both ended.
            wait_until(lambda: len(clients) == 0, "an ended client's session stayed")
            cm_runs.append(len(served.cm.suspended_runs()))

    asyncio.run(cycles())
    assert cm_runs == [0] * 30
    assert store.rows() == {}
    assert len(store.sessions) == 30


def test_clients_that_vanish_without_ending_their_sessions_expire(in_process):
    served = in_process(idle_timeout_s=0.5, reap_margin_s=0.1)
    url, clients, store = served.url, served.clients, served.store

    async def vanish() -> None:
        for _ in range(10):
            async with connect(url, end_session=False) as client:
                await value(client, "store('k', 'v'); return 1")

    async def one_more() -> None:
        async with connect(url) as client:
            await value(client, "return 1")

    asyncio.run(vanish())
    vanished = set(store.sessions)
    assert len(vanished) == 10
    deadline = time.monotonic() + 30
    while len(clients) > 0:  # each new client's first call sweeps the table
        assert time.monotonic() < deadline, f"{len(clients)} vanished clients' sessions stayed"
        asyncio.run(one_more())
    assert {key: kept for key, kept in store.rows().items() if key in vanished} == {}


def test_an_idle_client_that_keeps_its_stream_open_keeps_its_session(in_process):
    served = in_process(idle_timeout_s=0.5, reap_margin_s=0.1)
    url, clients = served.url, served.clients

    async def idle_then_load() -> Any:
        async with connect(url) as a:
            await value(a, "store('k', 'kept'); return 1")
            await asyncio.sleep(1.5)
            async with connect(url) as b:  # a new client's first call sweeps the table
                await value(b, "return 1")
            return await value(a, "return load('k') ?? 'lost'")

    assert asyncio.run(idle_then_load()) == "kept"
    wait_until(lambda: len(clients) == 0, "an ended client's session stayed")


# ---- what the client's model reads ----------------------------------------------------------------


def test_serve_answers_compact_results_and_is_error_for_a_failed_cell():
    from contextlib import nullcontext

    from codemode.serve import build_server

    png = "iVBORw0KGgoAAAANSUhEUg=="

    async def calls(cm: CodeMode) -> list[Any]:
        session = cm.session("compact")
        async with Client(build_server(cm, lambda ctx: nullcontext(session))) as client:
            waiting = await client.call_tool("exec", {"code": "await yield_control('go on?'); return 'resumed'"})
            return [
                await client.call_tool("exec", {"code": "return 40 + 2"}),
                await client.call_tool("exec", {"code": "throw new Error('broken')"}),
                await client.call_tool("exec", {"code": f"image('data:image/png;base64,{png}'); return 1"}),
                await client.call_tool("wait", {"runId": decoded(waiting)["runId"]}),
            ]

    with CodeMode({"workers": 1}) as cm:
        completed, failed, imaged, resumed = asyncio.run(calls(cm))
    assert (completed.is_error, [block.text for block in completed.content]) == (
        False,
        ['{"status":"completed","value":42}'],
    )
    assert failed.is_error is True
    assert decoded(failed) == {"status": "failed", "error": "Error: broken"}
    assert [(block.type, getattr(block, "data", None)) for block in imaged.content[1:]] == [("image", png)]
    assert decoded(resumed) == {"status": "completed", "value": "resumed"}
