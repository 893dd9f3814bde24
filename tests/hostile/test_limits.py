"""Hostile input, round two: the operator's limits hold whatever the cell, the journal or a
host fault does, and no session can take what other sessions need (issue 15, items 2, 5, 7,
8, 9, 11, 13, 14, 16). Each test ends with the next exec of the same ``CodeMode`` completing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import msgspec
import pytest
from codemode import CodeMode, CodemodeError
from codemode.cells import MAX_SOURCE_CHARS
from codemode.config import BOUNDS, load_config
from codemode.protocol import MAX_VALUE_CONTAINERS
from codemode.runs import Journal

MiB = 1 << 20
SPIN = "let x = 0; for (let i = 0; i < 4e6; i++) { x += i } return x"


def exec_(session: Any, code: str, **extra: Any) -> dict[str, Any]:
    return session.exec({"code": code, **extra})


def recovers(cm: CodeMode, session: str = "after") -> None:
    assert exec_(cm.session(session), "return 40 + 2")["value"] == 42


def add_sleepy(cm: CodeMode) -> None:
    @cm.tool(read_only=True)
    async def sleepy(ms: int = 0, value: Any = None) -> Any:
        await asyncio.sleep(ms / 1000)
        return value


# ---- item 7: a pragma only lowers what the config allows -------------------------------------
@pytest.mark.parametrize("pragma", [5_000, 60_000, 2_147_483_647])
def test_options_pragma_cannot_raise_the_configured_timeout(make_codemode, pragma):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    add_sleepy(cm)
    code = f'// @options: {{"timeout_ms": {pragma}}}\nreturn await tools.sleepy({{ms: 1500, value: 1}})'
    assert exec_(cm.session(), code)["status"] == "waiting"  # at 300 ms, not at the pragma's
    spun = exec_(cm.session(), f'// @options: {{"timeout_ms": {pragma}}}\nwhile (true) {{}}')
    assert (spun["status"], spun["code"]) == ("failed", "timeout")
    recovers(cm)


def test_options_pragma_still_lowers_the_timeout(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 5000})
    add_sleepy(cm)
    code = '// @options: {"timeout_ms": 200}\nreturn await tools.sleepy({ms: 1500, value: 1})'
    assert exec_(cm.session(), code)["status"] == "waiting"


def test_options_pragma_cannot_raise_the_output_budget(make_codemode):
    cm = make_codemode({"workers": 1, "maxOutputBytes": 4096})
    pragma = '// @options: {"max_output_tokens": 1000000000}\n'
    code = pragma + 'for (let i = 0; i < 100; i++) text("x".repeat(100)); return 1'
    result = exec_(cm.session(), code)
    text = "".join(o.get("text", "") for o in result.get("output", []))
    assert len(text) <= 4096 + 200, result["status"]  # the config's budget, not a billion tokens
    recovers(cm)


# ---- item 5: an oversized source never reaches a worker ----------------------------------------
def test_a_source_over_the_cap_is_invalid_input_before_any_worker(make_codemode):
    cm = make_codemode({"workers": 1})
    pids = cm.inspect().worker_pids
    for size in (MAX_SOURCE_CHARS + 1, 70 * MiB):
        result = exec_(cm.session(), "return 1;" + " " * (size - 9))
        assert (result["status"], result["code"]) == ("failed", "invalid_input")
        assert result["error"] == f"exec `code` is {size} characters; the limit is {MAX_SOURCE_CHARS}."
    assert cm.inspect().worker_pids == pids
    at_cap = "return 1;//" + "x" * (MAX_SOURCE_CHARS - 11)
    assert exec_(cm.session(), at_cap)["value"] == 1
    recovers(cm)


@pytest.mark.parametrize(
    "code", ["return '\ud800'", "return 1 // \udfff", "\ud83d" + "x" * 5000, "return '\ud83d\ude00\udc00'"]
)
@pytest.mark.parametrize("how", ["exec", "command", "handle"])
def test_a_source_with_a_lone_surrogate_is_invalid_input_at_once(make_codemode, code: str, how: str):
    cm = make_codemode({"workers": 1, "timeoutMs": 60_000})
    s = cm.session()
    args = {"command": code} if how == "command" else {"code": code}
    result = s.handle("exec", args) if how == "handle" else s.exec(args)
    assert (result["status"], result["code"]) == ("failed", "invalid_input")
    assert result["error"].startswith("exec `code` holds a lone surrogate (U+D")
    assert "write it as an escape" in result["error"]
    assert exec_(s, "return '\\ud800'.length")["value"] == 1  # the escape is how to write one
    recovers(cm)


# ---- item 8: journals are counted ----------------------------------------------------------
def test_a_result_past_max_journal_bytes_fails_its_call_not_the_run(make_codemode):
    cm = make_codemode({"workers": 1, "maxJournalBytes": 64 << 10})

    @cm.tool
    def blob(n: int) -> str:
        return "x" * n

    code = """
      const a = await tools.blob({n: 40000});
      let b;
      try { b = await tools.blob({n: 40000}); } catch (e) { b = String(e); }
      const c = await tools.blob({n: 10});
      return [a.length, b, c];
    """
    result = exec_(cm.session(), code)
    assert result["status"] == "completed", result
    first, refused, small = result["value"]
    assert first == 40000 and small == "x" * 10
    assert "would grow this run's journal past maxJournalBytes (65536)" in refused
    recovers(cm)


def test_five_results_of_15_mib_never_make_a_settle_frame_over_its_cap(make_codemode):
    cm = make_codemode({"workers": 1, "memoryLimitBytes": 512 * MiB, "maxJournalBytes": 32 * MiB, "timeoutMs": 20000})
    pids = cm.inspect().worker_pids

    @cm.tool
    async def big(n: int) -> str:
        return str(n) * (15 * MiB)

    code = """
      const settled = await Promise.allSettled([1, 2, 3, 4, 5].map(n => tools.big({n})));
      return settled.map(s => s.status === "fulfilled" ? s.value.length : String(s.reason).slice(0, 200));
    """
    result = exec_(cm.session(), code)
    assert result["status"] == "completed", result.get("error")
    lengths = [v for v in result["value"] if isinstance(v, int)]
    refused = [v for v in result["value"] if isinstance(v, str)]
    assert lengths == [15 * MiB] * 2 and len(refused) == 3, result["value"]
    assert all("maxJournalBytes" in r for r in refused)
    assert cm.inspect().worker_pids == pids  # no worker died over a frame
    recovers(cm)


def test_a_suspended_runs_journal_counts_in_max_snapshot_bytes(make_codemode):
    cm = make_codemode({"workers": 1, "maxSnapshotBytes": 256 << 10, "timeoutMs": 2000})

    @cm.tool
    def blob(n: int) -> str:
        return "x" * n

    # Small in QuickJS (the result is dropped), big in the host's journal.
    code = "for (let i = 0; i < 8; i++) await tools.blob({n: 60000}); await yield_control(); return 1"
    result = exec_(cm.session(), code)
    assert (result["status"], result["code"]) == ("failed", "snapshot_limit_exceeded"), result
    assert "journal" in result["error"] and "maxSnapshotBytes (262144)" in result["error"]
    assert cm.suspended_runs() == []
    recovers(cm)


# ---- item 11: import_run trusts nothing in the journal ---------------------------------------
def _exported(cm: CodeMode) -> bytes:
    add_sleepy(cm)
    code = "const v = await tools.sleepy({ms: 400, value: 7}); const big = 'x'.repeat(100 << 20); return v + big.length"
    waiting = cm.session("a").exec({"code": code, "restartSafe": True})
    assert waiting["status"] == "waiting", waiting
    return cm.export_run(waiting["runId"])


def test_import_run_uses_the_importers_limits_not_the_journals(make_codemode):
    data = _exported(make_codemode({"workers": 1, "memoryLimitBytes": 512 * MiB, "timeoutMs": 300}))
    journal = Journal.decode(data)
    assert journal.limits.memory_limit_bytes == 512 * MiB  # the journal asks for 512 MiB
    importer = make_codemode({"workers": 1, "memoryLimitBytes": 16 * MiB, "timeoutMs": 2000})
    add_sleepy(importer)
    run_id = importer.import_run(data, "b")
    session = importer.session("b")
    result = session.wait({"runId": run_id})
    while result["status"] == "waiting":
        result = session.wait({"runId": run_id})
    assert (result["status"], result["code"]) == ("failed", "memory_limit_exceeded"), result
    recovers(importer)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda j: setattr(j, "source", "x" * (MAX_SOURCE_CHARS + 1)), "characters; the limit is"),
        (lambda j: setattr(j, "language", "python"), "is not enabled here"),
        (lambda j: j.batches.append([(999, True, "1")]), "calls and results do not match"),
        (lambda j: j.batches.append([(1, True, "1" * (20 * MiB))]), "maxJournalBytes"),
    ],
    ids=["huge-source", "language", "foreign-result", "huge-results"],
)
def test_import_run_refuses_an_edited_journal(make_codemode, edit, message):
    data = _exported(make_codemode({"workers": 1, "timeoutMs": 300}))
    journal = Journal.decode(data)
    edit(journal)
    importer = make_codemode({"workers": 1})
    add_sleepy(importer)
    with pytest.raises(CodemodeError, match=message):
        importer.import_run(journal.encode(), "b")
    assert importer.suspended_runs() == []


@pytest.mark.parametrize("data", [b"", b"\xc1" * 10, msgspec.msgpack.encode([[[[[]]]]] * 3), b"\x91" * 5000])
def test_import_run_refuses_bytes_that_are_not_a_journal(make_codemode, data):
    cm = make_codemode({"workers": 1})
    with pytest.raises(CodemodeError, match="not a code mode journal"):
        cm.import_run(data, "b")
    recovers(cm)


# ---- item 2: whatever goes wrong in the host, the run ends and frees its slot ---------------
class _Boom:
    """Makes the host's trace raise once, as a bug or a hostile value past every check would."""

    def __init__(self, cm: CodeMode, error: BaseException) -> None:
        self.cm, self.error, self.real = cm, error, cm._trace.add

    def __call__(self, event: Any) -> None:
        self.cm._trace.add = self.real  # type: ignore[method-assign]
        raise self.error


@pytest.mark.parametrize("error", [RecursionError("deep"), MemoryError(), ValueError("odd")])
def test_a_host_fault_in_wait_fails_the_run_and_frees_its_slot(make_codemode, error):
    cm = make_codemode({"workers": 1, "timeoutMs": 300, "maxSuspendedRunsPerSession": 1})
    s = cm.session("s")
    waiting = exec_(s, "await yield_control(); return 1")
    assert waiting["status"] == "waiting"
    cm._trace.add = _Boom(cm, error)  # type: ignore[method-assign]
    result = s.wait({"runId": waiting["runId"]})
    assert (result["status"], result["code"]) == ("failed", "internal_error")
    assert result["error"] == f"code mode failed in the host: {type(error).__name__}"
    assert cm.suspended_runs() == [] and s.cancel(waiting["runId"]) is False
    assert s.wait({"runId": waiting["runId"]})["error"] == "code mode run is unavailable or expired."
    assert exec_(s, "await yield_control(); return 2")["status"] == "waiting"  # its one slot is free
    recovers(cm)


def test_a_host_fault_in_exec_fails_the_run_and_frees_its_slot(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    cm._trace.add = _Boom(cm, RecursionError("deep"))  # type: ignore[method-assign]
    result = exec_(cm.session(), "await yield_control(); return 1")
    assert (result["status"], result["code"]) == ("failed", "internal_error")
    assert cm.suspended_runs() == []
    recovers(cm)


def test_a_host_fault_in_exec_async_fails_the_run(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 300})
    cm._trace.add = _Boom(cm, RecursionError("deep"))  # type: ignore[method-assign]
    result = asyncio.run(cm.session().exec_async({"code": "await yield_control(); return 1"}))
    assert (result["status"], result["code"]) == ("failed", "internal_error")
    assert cm.suspended_runs() == []
    recovers(cm)


# ---- item 13: queueing is fair across sessions --------------------------------------------
def test_an_idle_sessions_cell_goes_before_a_busy_sessions_queued_cells(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 20000})
    done: list[str] = []
    lock = threading.Lock()

    def run(session: str, code: str, name: str) -> None:
        result = exec_(cm.session(session), code)
        with lock:
            done.append(name if result["status"] == "completed" else f"{name}:{result}")

    # The first runs long enough (~0.5 s here) that the others and the idle session's cell are
    # all queued behind it whatever this machine's speed (with four equal cells, the idle one
    # could come only as the first ended, ~80 ms on a fast host, and queue behind a started one).
    first = SPIN.replace("4e6", "2.5e7")
    busy = [threading.Thread(target=run, args=("busy", first if n == 0 else SPIN, f"busy{n}")) for n in range(4)]
    for thread in busy:
        thread.start()
        time.sleep(0.02)  # queued in this order, behind the first (which runs)
    victim = threading.Thread(target=run, args=("idle", "return 1", "idle"))
    victim.start()
    for thread in [*busy, victim]:
        thread.join()
    assert sorted(done) == ["busy0", "busy1", "busy2", "busy3", "idle"], done
    assert done.index("idle") <= 1, done  # after the cell running when it came, not after all four
    recovers(cm)


# ---- item 16: small ones ---------------------------------------------------------------------
@pytest.mark.parametrize(("asked", "got"), [(10**9, BOUNDS["workers"][1]), (3, 3), (0, 0)])
def test_workers_is_bounded(asked, got):
    assert load_config({"workers": asked}).workers == got


def test_a_store_over_its_total_at_commit_reports_the_store_error(make_codemode):
    """Two cells of one session, each within the total on its own, commit one after the other:
    the second breaks the total only at commit, and says so (it is not an internal error)."""
    cm = make_codemode({"workers": 2, "timeoutMs": 5000})
    add_sleepy(cm)
    results: list[dict[str, Any]] = []

    def cell(prefix: str, ms: int) -> None:
        writes = f"for (let i = 0; i < 4; i++) store('{prefix}' + i, 'x'.repeat(200000));"
        code = f"{writes} await tools.sleepy({{ms: {ms}}}); return 'stored'"
        results.append(exec_(cm.session("s"), code))

    threads = [threading.Thread(target=cell, args=(p, ms)) for p, ms in (("a", 200), ("b", 600))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = results
    assert first.get("value") == "stored", first
    assert (second["status"], second["code"]) == ("failed", "invalid_input"), second
    assert second["error"].startswith("store commit refused: stored keys and values would total")
    assert exec_(cm.session("s"), "return [load('a0') !== undefined, load('b0')]")["value"] == [True, None]
    recovers(cm)


# ---- item 8: a value is weighed before the host decodes it -----------------------------------
@pytest.mark.parametrize(
    "tail",
    ["return a", "json(a); return 1", "store('k', a); return 1", "return {nested: {a}}"],
    ids=["return", "json-output", "store", "nested-return"],
)
def test_a_value_of_too_many_arrays_fails_the_run_before_the_host_decodes_it(make_codemode, tail):
    cm = make_codemode({"workers": 1, "maxOutputBytes": 10 * MiB, "memoryLimitBytes": 256 * MiB})
    pids = cm.inspect().worker_pids
    code = f"let a = []; for (let i = 0; i < {MAX_VALUE_CONTAINERS + 10}; i++) a.push([]); {tail}"
    result = exec_(cm.session(), code)
    if tail.startswith("store"):  # a store value has its own, smaller, limit in the guest
        assert result["status"] == "failed", result
    else:
        assert (result["status"], result["code"]) == ("failed", "output_limit_exceeded"), result
        heavy = "code mode output limit exceeded: the result is too heavy for the host: a value of"
        assert result["error"].startswith(heavy)
    assert cm.inspect().worker_pids == pids  # the worker did nothing wrong
    under = f"let a = []; for (let i = 0; i < {MAX_VALUE_CONTAINERS // 2}; i++) a.push([]); return a.length"
    assert exec_(cm.session(), under)["value"] == MAX_VALUE_CONTAINERS // 2
    recovers(cm)


def test_a_tool_input_of_too_many_arrays_fails_its_call_before_the_host_decodes_it(make_codemode):
    cm = make_codemode({"workers": 1, "memoryLimitBytes": 256 * MiB})
    seen: list[Any] = []

    @cm.tool
    def echo(value: Any = None) -> Any:
        seen.append(value)
        return 1

    code = f"""
      let a = []; for (let i = 0; i < {MAX_VALUE_CONTAINERS + 10}; i++) a.push([]);
      try {{ await tools.echo({{value: a}}); return 'called' }} catch (e) {{ return String(e) }}
    """
    result = exec_(cm.session(), code)
    assert result["status"] == "completed", result
    assert "input is too heavy for the host: a value of" in result["value"]
    assert seen == []  # the tool never ran
    recovers(cm)


@pytest.mark.parametrize("surface_args", ["deep", "not-json"])
def test_model_arguments_to_tool_call_the_host_cannot_encode_are_an_error_result(make_codemode, surface_args):
    cm = make_codemode({"workers": 1})

    @cm.tool
    def echo(value: Any = None) -> Any:
        return value

    args: Any = {"value": object()}
    if surface_args == "deep":
        args = 1
        for _ in range(5000):
            args = [args]
        args = {"value": args}
    result = cm.session().handle("tool_call", {"id": "host:core:echo", "args": args})
    assert result["error"].startswith("tool arguments are not JSON the host can carry"), result
    recovers(cm)


def test_a_catalog_too_large_for_one_frame_is_made_terse_not_fatal(make_codemode):
    """9,000 tools with 8 KiB descriptions (74 MB of catalog, over the 64 MiB frame): the catalog
    still reaches every worker, with cut descriptions, and every exec still runs and finds them."""
    cm = make_codemode({"workers": 1})

    def make(n: int) -> Any:
        def tool(q: str = "") -> int:
            return n

        return tool

    for n in range(9000):
        cm.add_tool(make(n), name=f"tool_{n}", description=f"finds record {n} " + "x" * 8200)
    found = exec_(
        cm.session(), "return [(await tools.search('record 1234', {limit: 1}))[0].id, await tools.tool_7({})]"
    )
    assert found["value"] == ["host:core:tool_1234", 7], found
    described = exec_(cm.session(), "return (await tools.describe('host:core:tool_1')).description")
    assert described["value"].startswith("finds record 1 x") and len(described["value"]) <= 1024
    recovers(cm)


def test_a_replay_of_a_run_whose_inputs_passed_a_frame_reports_their_hashes(make_codemode):
    """Nine 8 MiB inputs over a run's life (72 MiB, past one frame): after its worker dies, the
    replay's report lists every call by its input's hash, so it fits, and the run completes."""
    cm = make_codemode({"workers": 1, "memoryLimitBytes": 256 * MiB, "timeoutMs": 20000})

    @cm.tool
    def size(value: str) -> int:
        return len(value)

    session = cm.session()
    code = "let t = 0; for (let i = 0; i < 9; i++) t += await tools.size({value: String(i).repeat(8 << 20)});"
    waiting = exec_(session, code + " await yield_control(); return t")
    assert waiting["status"] == "waiting", waiting
    for pid in cm.inspect().worker_pids:
        os.kill(pid, signal.SIGKILL)
    result = session.wait({"runId": waiting["runId"]})
    assert (result["status"], result.get("value")) == ("completed", 9 * (8 << 20)), result
    recovers(cm)
