"""A cut output keeps its full text: the cut note names a handle, and the session's next cells
read the text back with ``readOutput(handle, {offset, limit})`` (``codemode.outputs``)."""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from codemode import CodeMode, Session
from codemode.outputs import ENTRY_OVERHEAD, HANDLE_CHARS, MAX_READ_CHARS, OutputStore, Read, read_call

HANDLE = re.compile(r'readOutput\("(out_[A-Za-z0-9_-]+)"')
#: A cell whose text outputs (200 lines, ASCII and not) are cut to a 100-character budget.
LINES = [f"line {i} é 😀 {'x' * (i % 7)}" for i in range(200)]
LOUD = '// @options: {"max_output_tokens": 25}\n' + "".join(f"text({json.dumps(line)});\n" for line in LINES)
FULL_TEXT = "\n".join(LINES)
#: Reads a handle in pieces of `limit` characters until `more` is false.
READ_ALL = """
const pieces = [];
let offset = 0;
for (;;) {
  const r = await readOutput(HANDLE, {offset, limit: LIMIT});
  pieces.push(r);
  if (!r.more) break;
  offset = r.end;
}
return pieces;
"""


def run(session: Session, code: str) -> dict[str, Any]:
    return session.exec({"code": code})


def handles(result: dict[str, Any]) -> list[str]:
    """The handles the cut notes of ``result`` name (its outputs', then its value's)."""
    texts = [o["text"] for o in result.get("output", []) if o["type"] == "text"]
    if isinstance(result.get("value"), str):
        texts.append(result["value"])
    return [m for text in texts for m in HANDLE.findall(text)]


def cut(session: Session, code: str = LOUD) -> str:
    """Runs a cell whose text outputs are cut; the handle of their full text."""
    result = run(session, code)
    assert result["status"] == "completed", result
    (handle,) = handles(result)
    return handle


def read_error(session: Session, call: str) -> str:
    """The message a ``readOutput`` call rejects with (the cell catches it)."""
    result = run(session, f"try {{ await {call}; return 'resolved'; }} catch (e) {{ return e.message; }}")
    assert result["status"] == "completed", result
    return result["value"]  # type: ignore[no-any-return]


def kept_text_size(text: str) -> int:
    return sys.getsizeof(text) + ENTRY_OVERHEAD


@pytest.fixture(scope="module")
def ocm() -> Iterator[CodeMode]:
    with CodeMode({"workers": 1, "timeoutMs": 5000}) as codemode:
        yield codemode


# ---- reading a cut output back ---------------------------------------------------------------


def test_cut_output_reads_back_in_pieces_equal_to_the_full_text(ocm):
    session = ocm.session("pieces")
    first = run(session, LOUD)
    shown = [o["text"] for o in first["output"]]
    assert sum(len(t) for t in shown if "readOutput" not in t) == 100
    (handle,) = handles(first)
    assert f"full text ({len(FULL_TEXT)} characters)" in next(t for t in shown if handle in t)
    result = run(session, READ_ALL.replace("HANDLE", json.dumps(handle)).replace("LIMIT", "397"))
    pieces = result["value"]
    assert len(pieces) == -(-len(FULL_TEXT) // 397) > 5
    assert "".join(p["text"] for p in pieces) == FULL_TEXT
    assert [p["offset"] for p in pieces] == [0, *(p["end"] for p in pieces[:-1])]
    assert {p["total"] for p in pieces} == {len(FULL_TEXT)} and {p["handle"] for p in pieces} == {handle}
    assert [p["more"] for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert result["telemetry"]["toolCalls"] == len(pieces)  # each read is a tool call


def test_offsets_count_code_points_so_end_continues_past_astral_characters(ocm):
    session = ocm.session("astral")
    handle = cut(session, '// @options: {"max_output_tokens": 1}\ntext("😀".repeat(30))')
    piece = run(
        session,
        f"const r = await readOutput({json.dumps(handle)}, {{offset: 10, limit: 5}}); return [r, r.text.length]",
    )
    assert piece["value"] == [
        {"handle": handle, "text": "😀" * 5, "offset": 10, "end": 15, "total": 30, "more": True},
        10,  # (UTF-16 code units in the guest)
    ]


def test_default_limit_and_a_huge_limit_are_bounded(ocm):
    session = ocm.session("limits")
    handle = cut(session, '// @options: {"max_output_tokens": 1}\ntext("ab".repeat(5000))')
    default = run(session, f"return (await readOutput({json.dumps(handle)})).end")
    assert default["value"] == 8192
    huge = run(session, f"const r = await readOutput({json.dumps(handle)}, {{limit: 1e15}}); return [r.end, r.more]")
    assert huge["value"] == [10_000, False]


def test_reading_at_the_end_gives_nothing_more_and_past_it_an_error(ocm):
    session = ocm.session("end")
    handle = cut(session, '// @options: {"max_output_tokens": 1}\ntext("abcdef")')
    at_end = run(session, f"return await readOutput({json.dumps(handle)}, {{offset: 6}})")
    assert at_end["value"] == {"handle": handle, "text": "", "offset": 6, "end": 6, "total": 6, "more": False}
    message = read_error(session, f"readOutput({json.dumps(handle)}, {{offset: 7}})")
    assert message == f"readOutput offset 7 is past the end of output {handle} (6 characters)"


def test_cut_value_becomes_an_excerpt_naming_its_full_json(ocm):
    session = ocm.session("value")
    value = {"rows": [{"id": i, "name": f"row {i}"} for i in range(100)]}
    result = run(session, f'// @options: {{"max_output_tokens": 50}}\nreturn {json.dumps(value)}')
    excerpt = result["value"]
    assert isinstance(excerpt, str) and excerpt.startswith('{"rows":[{"id":0,')
    assert excerpt.endswith('"row 99"}]}')
    assert "characters of the value's JSON cut by max_output_tokens; full JSON" in excerpt
    (handle,) = handles(result)
    back = run(session, READ_ALL.replace("HANDLE", json.dumps(handle)).replace("LIMIT", "500"))
    assert json.loads("".join(p["text"] for p in back["value"])) == value


def test_a_small_value_is_never_cut_and_leaves_the_text_the_whole_budget(ocm):
    result = run(
        ocm.session("small"), '// @options: {"max_output_tokens": 10}\ntext("t".repeat(500)); return "v".repeat(254)'
    )
    assert result["value"] == "v" * 254  # 256 characters of JSON
    assert [o["text"] for o in result["output"] if "readOutput" not in o["text"]] == ["t" * 20, "t" * 20]


def test_a_big_value_keeps_what_the_text_leaves_and_at_least_half_the_budget(ocm):
    session = ocm.session("shares")
    quiet = run(session, '// @options: {"max_output_tokens": 10}\ntext("t".repeat(10)); return "v".repeat(500)')
    assert quiet["output"] == [{"type": "text", "text": "t" * 10}]
    assert quiet["value"].startswith('"' + "v" * 14 + "[… 472 characters of the value's JSON cut")
    loud = run(session, '// @options: {"max_output_tokens": 10}\ntext("t".repeat(500)); return "v".repeat(500)')
    assert [o["text"] for o in loud["output"] if "readOutput" not in o["text"]] == ["t" * 10, "t" * 10]
    assert loud["value"].startswith('"' + "v" * 9 + "[… 482 characters of the value's JSON cut")
    assert loud["value"].endswith("…]" + "v" * 9 + '"')


def test_uncut_output_and_a_cell_without_a_budget_keep_nothing(ocm):
    session = ocm.session("uncut")
    assert handles(run(session, '// @options: {"max_output_tokens": 100}\ntext("short"); return 1')) == []
    assert handles(run(session, 'text("x".repeat(100000)); return "y".repeat(100000)')) == []
    assert ocm.kept_output_bytes("uncut") == 0


# ---- what is kept, for how long, for whom ------------------------------------------------------


def test_least_recently_read_output_is_evicted_past_the_session_budget(make_codemode):
    text = "z" * 10_000
    cm = make_codemode({"workers": 1, "outputStoreBytes": 2 * kept_text_size(text) + 100})
    session = cm.session("lru")
    code = f'// @options: {{"max_output_tokens": 1}}\ntext("{text}")'
    first, second = cut(session, code), cut(session, code)
    run(session, f"await readOutput({json.dumps(first)}, {{limit: 1}})")  # now the second is the oldest used
    third = cut(session, code)
    assert read_error(session, f"readOutput({json.dumps(second)})") == (
        f"output {second} expired or was evicted (outputs are kept for a while, within a per-session budget): "
        "run the cell again to see it"
    )
    for handle in (first, third):
        assert run(session, f"return (await readOutput({json.dumps(handle)})).total")["value"] == 10_000
    assert cm.kept_output_bytes("lru") == 2 * kept_text_size(text)


def test_text_over_the_session_budget_is_cut_without_a_handle(make_codemode):
    cm = make_codemode({"workers": 1, "outputStoreBytes": 1000})
    result = run(cm.session("big"), '// @options: {"max_output_tokens": 1}\ntext("q".repeat(5000))')
    assert [o["text"] for o in result["output"]][1] == "[… 4996 characters of output cut by max_output_tokens …]"


def test_keeping_can_be_turned_off(make_codemode):
    cm = make_codemode({"workers": 1, "outputStoreBytes": 0})
    session = cm.session("off")
    result = run(session, '// @options: {"max_output_tokens": 1}\ntext("q".repeat(50)); return "v".repeat(300)')
    assert handles(result) == []
    assert "[… 48 characters of output cut by max_output_tokens …]" in [o["text"] for o in result["output"]]
    assert result["value"] == '"' + "[… 300 characters of the value's JSON cut by max_output_tokens …]" + '"'
    assert cm.kept_output_bytes() == 0


def test_kept_output_expires_after_its_ttl(make_codemode):
    cm = make_codemode({"workers": 1, "outputStoreTtlSeconds": 1})
    session = cm.session("ttl")
    handle = cut(session)
    assert run(session, f"return (await readOutput({json.dumps(handle)})).total")["value"] == len(FULL_TEXT)
    time.sleep(1.05)
    assert "expired or was evicted" in read_error(session, f"readOutput({json.dumps(handle)})")
    assert cm.kept_output_bytes() == 0


def test_another_sessions_handle_answers_exactly_like_an_unknown_one(ocm):
    handle = cut(ocm.session("owner"))
    stranger = ocm.session("stranger")
    forged = "out_" + "A" * (HANDLE_CHARS - 4)
    foreign, unknown = (read_error(stranger, f"readOutput({json.dumps(h)})") for h in (handle, forged))
    assert foreign.replace(handle, "H") == unknown.replace(forged, "H")
    assert foreign.startswith(f'unknown output handle "{handle}"')
    assert run(ocm.session("owner"), f"return (await readOutput({json.dumps(handle)})).total")["value"] > 0


def test_closing_a_session_forgets_its_outputs(ocm):
    session = ocm.session("closing")
    handle = cut(session)
    session.close()
    assert ocm.kept_output_bytes("closing") == 0
    assert "expired or was evicted" in read_error(ocm.session("closing"), f"readOutput({json.dumps(handle)})")


def test_a_read_is_journaled_so_a_replay_elsewhere_serves_it(make_codemode):
    first_cm = make_codemode({"workers": 1})
    session = first_cm.session("s")
    handle = cut(session)
    code = f"const r = await readOutput({json.dumps(handle)}, {{limit: 50}}); await yield_control('x'); return r.text"
    waiting = session.exec({"code": code, "restartSafe": True})
    assert session.wait({"runId": waiting["runId"]})["reason"] == "yield"
    second_cm = make_codemode({"workers": 1})
    run_id = second_cm.import_run(first_cm.export_run(waiting["runId"]), "s")
    assert second_cm.session("s").wait({"runId": run_id})["value"] == FULL_TEXT[:50]


# ---- hostile arguments -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("readOutput()", 'readOutput(handle, {offset, limit}) takes the handle string a cut note names ("out_…")'),
        ("readOutput(42)", 'readOutput(handle, {offset, limit}) takes the handle string a cut note names ("out_…")'),
        ("readOutput({handle: 'x'})", "takes the handle string"),
        ("readOutput(H, {offset: -1})", "readOutput offset must be an integer >= 0"),
        ("readOutput(H, {offset: 1.5})", "readOutput offset must be an integer >= 0"),
        ("readOutput(H, {offset: '3'})", "readOutput offset must be an integer >= 0"),
        ("readOutput(H, {offset: true})", "readOutput offset must be an integer >= 0"),
        ("readOutput(H, {offset: 1e300})", "readOutput offset must be an integer >= 0"),
        ("readOutput(H, {offset: 2 ** 52})", "is past the end of output"),
        ("readOutput(H, {limit: 0})", "readOutput limit must be an integer >= 1"),
        ("readOutput(H, {limit: -5})", "readOutput limit must be an integer >= 1"),
        ("readOutput(H, {limit: NaN})", "resolved"),  # (NaN is JSON null: the default limit)
        (
            "readOutput('x'.repeat(1 << 20))",
            f"readOutput arguments are too large: a handle is {HANDLE_CHARS} characters",
        ),
        ("readOutput('out_' + '\\n'.repeat(60))", 'unknown output handle "out_\\n\\n\\n'),
        ("readOutput(H, {get offset() { throw new Error('trap'); }})", "trap"),
    ],
)
def test_hostile_arguments_get_errors_and_the_host_keeps_running(ocm, call, message):
    session = ocm.session("hostile")
    handle = cut(session, '// @options: {"max_output_tokens": 1}\ntext("abcdef")')
    answer = read_error(session, call.replace("H", json.dumps(handle)))
    assert answer.startswith(message) or message in answer
    assert run(session, "return 40 + 2")["value"] == 42


def test_read_call_answers_every_input_without_raising():
    store = OutputStore(1 << 20, 1 << 20, 60)
    handle = store.keep("s", "hello")
    assert handle is not None
    for raw in ["", "{", "[]", "null", '"x"', "[" * 500 + "]" * 500, '{"handle": null}', '{"handle": "a\\ud800"}']:
        ok, message = read_call(store, "s", raw)
        assert not ok and isinstance(message, str), raw
    assert read_call(None, "s", json.dumps({"handle": handle})) == (
        False,
        f'unknown output handle "{handle}": this host keeps no outputs',
    )
    ok, payload = read_call(store, "s", json.dumps({"handle": handle, "limit": MAX_READ_CHARS * 10}))
    assert ok and json.loads(payload)["text"] == "hello"


# ---- the store's bounds (a clock the test moves) -----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_store_expires_a_text_at_its_ttl_not_before():
    clock = Clock()
    store = OutputStore(1 << 20, 1 << 20, 10, clock=clock)
    handle = store.keep("s", "abc")
    assert handle is not None
    clock.now = 9.999
    assert store.read("s", handle, 0, 10) == Read(handle, "abc", 0, 3, 3, False)
    clock.now = 10.0
    assert "expired or was evicted" in str(store.read("s", handle, 0, 10))
    assert store.used() == 0


def test_store_stays_within_its_budgets_whatever_is_kept():
    rng = random.Random(7)
    sizes: Callable[[], int] = lambda: rng.choice([0, 1, 50, 900, 5000, 20_000])  # noqa: E731
    store = OutputStore(30_000, 100_000, 1000)
    sessions = [f"s{i}" for i in range(12)]
    kept: dict[str, tuple[str, str]] = {}
    for _ in range(2000):
        session = rng.choice(sessions)
        text = rng.choice("aé😀") * sizes()
        handle = store.keep(session, text)
        assert (handle is None) == (kept_text_size(text) > 30_000)
        if handle is not None:
            kept[handle] = (session, text)
        assert all(store.used(s) <= 30_000 for s in sessions)
        assert store.used() == sum(store.used(s) for s in sessions) <= 100_000
    readable = 0
    for handle, (session, text) in kept.items():
        read = store.read(session, handle, 0, MAX_READ_CHARS)
        if not isinstance(read, str):
            assert read.text == text
            readable += 1
    assert readable > 0


def test_the_total_budget_evicts_the_oldest_text_of_any_session():
    store = OutputStore(1 << 20, 3 * kept_text_size("x" * 1000), 1000)
    first = store.keep("a", "x" * 1000)
    others = [store.keep(s, "x" * 1000) for s in ("b", "c", "d")]
    assert first is not None and all(others)
    assert "expired or was evicted" in str(store.read("a", first, 0, 1))
    assert store.used() == 3 * kept_text_size("x" * 1000)
