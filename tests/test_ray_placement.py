"""Workers as Ray actors (``CodeMode(placement="ray")``), on a local Ray cluster the tests start.

The cells run in the worker binary inside actors; the tools run in this process; deadlines and
the kill backstop hold by killing the actor; a lost actor's suspended runs replay on another.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode, protocol
from codemode.ray_placement import RayPlacement
from codemode.workers import WORKER_MEMORY_SLACK
from mcp_servers import wait_until

ray = pytest.importorskip("ray", reason="Ray placement tests need Ray: pip install 'codemode[ray]'")

pytestmark = pytest.mark.timeout(300)


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True  # (reaped between the two looks: reading its stat then fails with ESRCH)
    return state == "Z"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster for this module (logical CPUs: an actor asks for one)."""
    ray.init(num_cpus=6, include_dashboard=False, object_store_memory=96 << 20, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def rcm(cluster: None) -> Iterator[CodeMode]:
    cm = CodeMode({"workers": 2, "timeoutMs": 2000}, placement="ray")

    @cm.tool
    def where() -> int:
        """The process this tool runs in."""
        return os.getpid()

    @cm.tool(read_only=True)
    async def slow(tag: str, ms: int = 300) -> str:
        """Answers with its tag after ``ms`` milliseconds."""
        await asyncio.sleep(ms / 1000)
        return tag

    yield cm
    cm.close()


def test_a_cell_runs_in_an_actor_and_its_tools_in_the_host(rcm: CodeMode) -> None:
    result = rcm.session("s").exec({"code": "const pid = await tools.where({}); return [pid, 6 * 7]"})
    assert result["status"] == "completed", result
    assert result["value"] == [os.getpid(), 42]
    wait_until(lambda: all(pid > 0 for pid in rcm.inspect().worker_pids), "actors report their pids", 30.0)
    pids = rcm.inspect().worker_pids
    assert len(pids) == 2
    for pid in pids:
        assert parent_of(pid) != os.getpid()  # a child of its actor, not of this host


def test_a_run_suspends_and_resumes_through_an_actor(rcm: CodeMode) -> None:
    session = rcm.session("s")
    code = "// @options: {\"timeout_ms\": 100}\nreturn [await tools.slow({tag: 'a'}), await tools.slow({tag: 'b'})]"
    result: dict[str, Any] = dict(session.exec({"code": code}))
    assert result["status"] == "waiting"
    while result["status"] == "waiting":
        result = dict(session.wait({"runId": result["runId"]}))
    assert result["status"] == "completed" and result["value"] == ["a", "b"]


def test_an_endless_loop_in_an_actor_times_out_by_interrupt_without_losing_the_actor(rcm: CodeMode) -> None:
    wait_until(lambda: all(pid > 0 for pid in rcm.inspect().worker_pids), "actors report their pids", 30.0)
    before, killed = set(rcm.inspect().worker_pids), rcm.inspect().workers_killed
    result = rcm.session("s").exec({"code": '// @options: {"timeout_ms": 300}\nwhile (true) {}'})
    assert result["status"] == "failed" and result["code"] == "timeout", result
    assert rcm.inspect().workers_killed == killed  # the engine's interrupt ended it: no kill
    assert set(rcm.inspect().worker_pids) == before
    assert rcm.session("s").exec({"code": "return 7"})["value"] == 7


def test_a_runaway_builtin_is_stopped_by_killing_its_actor_and_its_worker_dies_with_it(rcm: CodeMode) -> None:
    wait_until(lambda: all(pid > 0 for pid in rcm.inspect().worker_pids), "actors report their pids", 30.0)
    before = set(rcm.inspect().worker_pids)
    killed_before = rcm.inspect().workers_killed
    runaway = '// @options: {"timeout_ms": 500}\nArray.prototype.reverse.call({length: 2 ** 32 - 1})'
    result = rcm.session("s").exec({"code": runaway})
    assert result["status"] == "failed" and result["code"] == "timeout", result
    assert rcm.inspect().workers_killed == killed_before + 1
    (victim,) = before - set(rcm.inspect().worker_pids)
    # Still inside the builtin (which never polls QuickJS's interrupt) when its actor was
    # killed: it must not be left spinning on the actor's node.
    wait_until(lambda: gone(victim), "the worker dies with its actor")
    after = rcm.session("s").exec({"code": "return 40 + 2"})
    assert after["status"] == "completed" and after["value"] == 42  # a new actor took its place


def test_a_lost_actor_s_suspended_runs_replay_on_another(cluster: None) -> None:
    with CodeMode({"workers": 1, "timeoutMs": 2000}, placement="ray") as cm:  # one actor holds them all

        @cm.tool
        def where() -> int:
            """The process this tool runs in."""
            return os.getpid()

        session = cm.session("lost")
        code = "const n = await yield_control('go'); return [n, await tools.where({})]"
        runs = [session.exec({"code": code})["runId"] for _ in range(4)]
        assert all(cm.inspect().run(run_id) is not None for run_id in runs)
        wait_until(lambda: all(pid > 0 for pid in cm.inspect().worker_pids), "actors report their pids", 30.0)
        (victim,) = cm.inspect().worker_pids
        os.kill(parent_of(victim), signal.SIGKILL)  # the actor's process: its worker goes with it
        wait_until(lambda: gone(victim), "the worker dies with its actor")
        for run_id in runs:
            result = session.wait({"runId": run_id, "answer": 5})
            assert result["status"] == "completed" and result["value"] == [5, os.getpid()], result
        assert cm.inspect().workers_spawned == 2  # the replays ran on a new actor
        assert victim not in cm.inspect().worker_pids


def test_an_actor_the_cluster_cannot_place_fails_its_runs_after_the_spawn_timeout(cluster: None) -> None:
    placement = RayPlacement(actor_options={"resources": {"no-such-resource": 1}}, spawn_timeout_s=1.0)
    with CodeMode({"workers": 1}, placement=placement) as cm:
        result = cm.session("s").exec({"code": "return 1"})
    assert result["status"] == "failed", result
    assert result["code"] == "runtime_unavailable"
    assert result["error"] == (
        "code mode runtime is unavailable: 3 workers died before they were ready: worker 0 did not start in time"
    )


def test_only_the_actor_with_the_token_gets_the_worker_stream(cluster: None) -> None:
    """The port a worker's actor connects back to is open to anyone who can reach the host: a
    connection without the token gets nothing and is dropped, and the actor still gets through."""
    worker = RayPlacement().start(WORKER_MEMORY_SLACK + (64 << 20))
    try:
        # (Before the actor, which takes about a second to start.)
        with socket.create_connection(worker._listener.getsockname(), timeout=10.0) as intruder:
            intruder.sendall(b"x" * 32)
            assert intruder.recv(1024) == b""  # dropped, having been sent nothing
        spoke, frames = worker.take(30.0)
        assert spoke and frames is not None and [type(f) for f in frames] == [protocol.Ready]
    finally:
        worker.kill()


def test_closing_while_actors_are_still_made_leaves_no_thread_holding_a_ray_reference(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closed at once, its actors are still being made: each watch thread must be done with Ray
    # when close returns (a reference freed after `ray.shutdown()` makes Ray end the process).
    # Ray here answers a watch slowly, as a busy cluster does.
    real_get = ray.get

    def slow_get(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return real_get(*args, **kwargs)

    monkeypatch.setattr(ray, "get", slow_get)
    before = {t.ident for t in threading.enumerate() if t.name == "codemode-ray-watch"}
    CodeMode({"workers": 2}, placement="ray").close()
    left = [t for t in threading.enumerate() if t.name == "codemode-ray-watch" and t.ident not in before]
    assert not [t for t in left if t.is_alive()], left
