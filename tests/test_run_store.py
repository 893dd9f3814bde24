"""A run store shared by host processes (``CodeMode(runs=...)``): a run suspended in one is
resumed by a ``wait`` in another, on SQLite and on a real PostgreSQL server.

Most cases use host *processes* (`run_store_host.py`, one ``CodeMode`` each, driven over a pipe)
so nothing is shared but the database; a few use two ``CodeMode`` objects in this process where
only the store's behaviour is at stake. Every tool call is logged by the host that ran it, so
"never started twice" is counted, not assumed.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from codemode import CodeMode
from codemode.run_store import HOST_TTL_S, RunStore
from codemode.runs import BUSY, FOREIGN, TOO_MANY, TOO_MANY_IN_SESSION, UNAVAILABLE
from mcp_servers import wait_until

HOST = Path(__file__).with_name("run_store_host.py")
TWO_CALLS = "const a = await tools.slow({tag: '{t}-1'}); const b = await tools.slow({tag: '{t}-2'}); return [a, b]"


def two_calls(tag: str) -> str:
    return TWO_CALLS.replace("{t}", tag)


class Host:
    """A host process on the run store; ``call`` sends one command and reads its answer."""

    def __init__(self, target: str, log: Path, extra_tool: str | None = None, timeout_ms: int = 150) -> None:
        args = [sys.executable, str(HOST), target, str(log), str(timeout_ms)] + ([extra_tool] if extra_tool else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.name = self._read(60.0)["ready"]

    def _read(self, timeout: float) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"host {self.proc.pid} did not answer within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"host {self.proc.pid} exited ({self.proc.poll()})"
        return json.loads(line)

    def call(self, op: str, timeout: float = 60.0, **fields: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10.0)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(20.0)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except BrokenPipeError:
                pass


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "tools.log"


@pytest.fixture
def hosts(database_target: str, log: Path) -> Iterator[Callable[..., Host]]:
    started: list[Host] = []

    def start(extra_tool: str | None = None, timeout_ms: int = 150) -> Host:
        host = Host(database_target, log, extra_tool, timeout_ms)
        started.append(host)
        return host

    yield start
    for host in started:
        host.close()


def ran(log: Path) -> collections.Counter[str]:
    """How many times each tagged tool call ran, over every host."""
    lines = log.read_text().splitlines() if log.exists() else []
    return collections.Counter(line.split(" ", 1)[1] for line in lines)


def resume_until_over(host: Host, run_id: str, session: str = "s1") -> dict[str, Any]:
    for _ in range(100):
        result: dict[str, Any] = host.call("wait", runId=run_id, session=session)
        if result["status"] != "waiting":
            return result
    raise AssertionError(f"run {run_id} never ended")


# ---- across processes ----------------------------------------------------------------------


def test_a_run_suspended_in_one_process_completes_in_another(hosts: Callable[..., Host], log: Path) -> None:
    a, b = hosts(), hosts()
    started = a.call("exec", code=two_calls("r"))
    assert started["status"] == "waiting"
    result = resume_until_over(b, started["runId"])
    assert result["status"] == "completed", result
    assert result["value"] == ["r-1", "r-2"]
    assert ran(log) == {"r-1": 1, "r-2": 1}  # the call started in a was never started again in b
    gone = a.call("wait", runId=started["runId"])
    assert gone["status"] == "failed" and gone["error"] == UNAVAILABLE  # completed: out of the store


def test_resuming_hops_between_processes_and_each_call_runs_once(hosts: Callable[..., Host], log: Path) -> None:
    a, b = hosts(), hosts()
    code = (
        "const out = []; for (let i = 0; i < 4; i++) out.push(await tools.slow({tag: `h-${i}`, ms: 200})); return out"
    )
    run_id = a.call("exec", code=code)["runId"]
    result: dict[str, Any] = {"status": "waiting"}
    turns = 0
    while result["status"] == "waiting":
        result = (b if turns % 2 == 0 else a).call("wait", runId=run_id)
        turns += 1
    assert result["status"] == "completed", result
    assert result["value"] == ["h-0", "h-1", "h-2", "h-3"]
    assert ran(log) == {f"h-{i}": 1 for i in range(4)}
    assert turns >= 2


#: A cell that suspends at once (on its yield), so that the ``wait`` after it holds the run for as
#: long as its tool takes, within the host's 5 s ``timeoutMs``.
HELD = (
    "await yield_control('go'); const x = await tools.slow({tag: 'k-1', ms: 100}); "
    "return await tools.slow({tag: 'k-2', ms: 3000})"
)


def wait_out_the_lease(host: Host, run_id: str) -> dict[str, Any]:
    """``wait`` until the run is no longer held by a host that was killed."""
    started = time.monotonic()
    result: dict[str, Any] = host.call("wait", runId=run_id)
    while result["status"] == "failed" and result["error"] == BUSY:
        assert time.monotonic() - started < HOST_TTL_S + 10, "the dead host's lease was never freed"
        time.sleep(0.2)
        result = host.call("wait", runId=run_id)
    return result


def test_a_wait_in_progress_holds_the_run_against_every_other_process(hosts: Callable[..., Host]) -> None:
    a, b = hosts(timeout_ms=5000), hosts()
    run_id = a.call("exec", code=HELD)["runId"]
    assert a.call("wait_later", runId=run_id) == {"started": True}
    time.sleep(0.5)
    busy = b.call("wait", runId=run_id)
    assert busy["status"] == "failed" and busy["error"] == BUSY and busy["code"] == "invalid_input"
    assert b.call("cancel", runId=run_id) == {"cancelled": False}  # held: not cancelled either


def test_another_session_cannot_resume_or_cancel_the_run(hosts: Callable[..., Host]) -> None:
    a, b = hosts(), hosts()
    run_id = a.call("exec", code=two_calls("f"))["runId"]
    foreign = b.call("wait", runId=run_id, session="intruder")
    assert foreign["status"] == "failed" and foreign["error"] == FOREIGN
    assert b.call("cancel", runId=run_id, session="intruder") == {"cancelled": False}
    result = resume_until_over(b, run_id)
    assert result["status"] == "completed", result


def test_a_process_killed_holding_the_lease_frees_it_and_the_run_fails_cleanly(
    hosts: Callable[..., Host], log: Path
) -> None:
    a, b = hosts(timeout_ms=5000), hosts()
    run_id = a.call("exec", code=HELD)["runId"]
    a.call("wait_later", runId=run_id)
    wait_until(lambda: ran(log)["k-1"] == 1, 10.0)  # k-2 now runs in a, which holds the run
    a.kill()
    result = wait_out_the_lease(b, run_id)
    assert result["status"] == "failed" and result["code"] == "internal_error"
    assert "host process that stopped" in result["error"] and "restartSafe" in result["error"]
    assert ran(log) == {"k-1": 1}  # nothing was started again
    assert b.call("wait", runId=run_id)["error"] == UNAVAILABLE  # failed: out of the store


def test_a_restart_safe_run_held_by_a_killed_process_goes_on_elsewhere(hosts: Callable[..., Host], log: Path) -> None:
    a, b = hosts(timeout_ms=5000), hosts()
    run_id = a.call("exec", code=HELD, restartSafe=True)["runId"]
    a.call("wait_later", runId=run_id)
    wait_until(lambda: ran(log)["k-1"] == 1, 10.0)
    a.kill()
    result = wait_out_the_lease(b, run_id)
    while result["status"] == "waiting":
        result = b.call("wait", runId=run_id)
    assert result["status"] == "completed" and result["value"] == "k-2", result
    assert ran(log)["k-2"] == 1  # (k-1 ran again: its tool is read-only, so it may)


def test_a_call_whose_process_was_killed_is_lost_and_the_run_says_so(hosts: Callable[..., Host], log: Path) -> None:
    a, b = hosts(), hosts()
    run_id = a.call("exec", code="return await tools.slow({tag: 'gone', ms: 5000})")["runId"]
    a.kill()  # suspended, its call still running in a: the result dies with it
    result = resume_until_over(b, run_id)
    assert result["status"] == "failed" and result["code"] == "internal_error"
    assert result["error"] == (
        "code mode run lost the result of call_1 (host:core:slow): the host process that ran it stopped. "
        "Only restartSafe runs redo such calls."
    )
    assert ran(log) == {}


def test_a_restart_safe_run_redoes_the_read_only_call_of_a_killed_process(
    hosts: Callable[..., Host], log: Path
) -> None:
    a, b = hosts(), hosts()
    run_id = a.call("exec", code="return await tools.slow({tag: 'rs', ms: 4000})", restartSafe=True)["runId"]
    a.kill()
    result = resume_until_over(b, run_id)
    assert result["status"] == "completed", result
    assert result["value"] == "rs"
    assert ran(log) == {"rs": 1}


def test_a_process_with_another_catalog_refuses_the_run_and_leaves_it(hosts: Callable[..., Host]) -> None:
    a, odd = hosts(), hosts("odd_tool")
    run_id = a.call("exec", code=two_calls("c"))["runId"]
    refused = odd.call("wait", runId=run_id)
    assert refused["status"] == "failed" and "different tool catalog" in refused["error"]
    assert resume_until_over(a, run_id)["status"] == "completed"  # the lease was freed


def test_two_processes_racing_waits_on_twenty_runs_lose_and_double_nothing(
    hosts: Callable[..., Host], log: Path
) -> None:
    a, b = hosts(), hosts()
    runs = [
        [(a if i < 10 else b).call("exec", code=two_calls(f"race{i}"), session=f"s{i}")["runId"], f"s{i}"]
        for i in range(20)
    ]
    answers: dict[str, Any] = {}

    def race(host: Host) -> None:
        answers[host.name] = host.call("race", timeout=240.0, runs=runs, at_least=50)

    threads = [threading.Thread(target=race, args=(host,)) for host in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300.0)
    seen = [answer["seen"] for answer in answers.values()]
    assert len(seen) == 2
    assert sum(answer["waits"] for answer in answers.values()) >= 100
    for run_id, _ in runs:
        statuses = seen[0][run_id] + seen[1][run_id]
        assert statuses.count("completed") == 1, (run_id, statuses)
        assert not [s for s in statuses if s.startswith("failed:")], (run_id, statuses)
    assert ran(log) == {f"race{i}-{k}": 1 for i in range(20) for k in (1, 2)}


# ---- the store's rules, two CodeModes in this process ---------------------------------------


@pytest.fixture
def pair(database_target: str) -> Iterator[Callable[..., tuple[CodeMode, CodeMode]]]:
    made: list[CodeMode] = []

    def make(**config: Any) -> tuple[CodeMode, CodeMode]:
        for _ in range(2):
            cm = CodeMode({"timeoutMs": 150, "workers": 1, **config}, runs=database_target)
            made.append(cm)
        return made[-2], made[-1]

    yield make
    for cm in made:
        cm.close()


def test_the_per_session_and_total_caps_hold_across_processes(pair: Callable[..., tuple[CodeMode, CodeMode]]) -> None:
    a, b = pair(maxSuspendedRunsPerSession=2)
    yielding = "await yield_control('more?'); return 1"
    assert a.session("s").exec({"code": yielding})["status"] == "waiting"
    assert b.session("s").exec({"code": yielding})["status"] == "waiting"
    refused = a.session("s").exec({"code": yielding})
    assert refused["status"] == "failed" and refused["error"] == TOO_MANY_IN_SESSION.format(limit=2)
    for i in range(62):
        assert (a if i % 2 else b).session(f"t{i}").exec({"code": yielding})["status"] == "waiting"
    full = b.session("last").exec({"code": yielding})
    assert full["status"] == "failed" and full["error"] == TOO_MANY


def test_a_run_expires_store_wide_and_leaves_the_store(
    pair: Callable[..., tuple[CodeMode, CodeMode]], database_target: str
) -> None:
    a, b = pair(snapshotTtlSeconds=1)
    run_id = a.session("s").exec({"code": "await yield_control('q'); return 1"})["runId"]
    time.sleep(1.3)
    gone = b.session("s").wait({"runId": run_id})
    assert gone["status"] == "failed" and gone["error"] == UNAVAILABLE
    store = RunStore(database_target, "observer")
    try:
        wait_until(lambda: store.versions([run_id]) == {}, 10.0)
    finally:
        store.close()
    wait_until(lambda: not a.inspect().suspended_runs, 10.0)  # the resident copy went too


def test_a_yield_answered_in_another_process(pair: Callable[..., tuple[CodeMode, CodeMode]]) -> None:
    a, b = pair()
    started = a.session("s").exec({"code": "const v = await yield_control('name?'); return `hi ${v}`"})
    assert started["status"] == "waiting"
    result = b.session("s").wait({"runId": started["runId"], "answer": "ada"})
    assert result["status"] == "completed" and result["value"] == "hi ada"


def test_cancel_in_one_process_ends_the_copy_resident_in_another(
    pair: Callable[..., tuple[CodeMode, CodeMode]],
) -> None:
    a, b = pair()
    run_id = a.session("s").exec({"code": "await yield_control('q'); return 1"})["runId"]
    assert [r.run_id for r in a.inspect().suspended_runs] == [run_id]
    assert b.session("s").cancel(run_id) is True
    assert a.session("s").wait({"runId": run_id})["error"] == UNAVAILABLE
    wait_until(lambda: not a.inspect().suspended_runs, 10.0)
    assert b.session("s").cancel(run_id) is False


def test_the_same_process_resumes_its_resident_copy_without_a_replay(
    pair: Callable[..., tuple[CodeMode, CodeMode]],
) -> None:
    a, _ = pair()
    session = a.session("s")
    code = "globalThis.n = (globalThis.n || 0) + 1; const v = await yield_control('q'); return [v, globalThis.n]"
    run_id = session.exec({"code": code})["runId"]
    result = session.wait({"runId": run_id, "answer": 7})
    # A replay would have run the cell's first line again: n would be 2.
    assert result["status"] == "completed" and result["value"] == [7, 1]
