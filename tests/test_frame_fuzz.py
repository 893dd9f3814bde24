"""Hostile worker output: the host reads typed frames or replaces the worker, nothing else. And
the worker binary, fed anything a host could write: it replies with frames or exits, never
panics, never dies of a signal.

A few generated examples on every run, plus the committed regression inputs; ``make fuzz`` runs
the same properties (``frame_fuzz.py``) for longer and saves any failing input next to them.
"""

from __future__ import annotations

import pathlib
import tracemalloc
from typing import Any

import pytest
from codemode.errors import ProtocolError, WorkerCrashed
from codemode.protocol import MAX_FRAME_BYTES, Configure, EngineLimits, Ready, Report, Settle, Start
from frame_fuzz import (
    CATALOGS,
    check_stream,
    check_worker,
    encode_frames,
    good_host_streams,
    good_streams,
    host_streams,
    read_stream,
    run_worker,
    streams,
)
from hypothesis import HealthCheck, given, settings

REGRESSIONS = pathlib.Path(__file__).parent / "fuzz_regressions" / "frames"
WORKER_REGRESSIONS = pathlib.Path(__file__).parent / "fuzz_regressions" / "worker"
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FEW
@given(streams)
def test_any_worker_output_reads_as_frames_then_protocol_error_or_eof(stream: tuple[bytes, list[int]]) -> None:
    check_stream(*stream)


@FEW
@given(good_streams)
def test_well_formed_frames_read_back_exactly_however_the_writes_are_cut(stream: tuple[list[Any], list[int]]) -> None:
    frames, chunks = stream
    check_stream(encode_frames(frames), chunks, expected=frames)


def test_length_prefix_over_the_cap_is_refused_before_the_body_arrives() -> None:
    frames, end = read_stream((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"x" * 10, [1 << 16])
    assert frames == []
    assert isinstance(end, ProtocolError)
    assert str(end) == f"frame of {MAX_FRAME_BYTES + 1} bytes exceeds the {MAX_FRAME_BYTES}-byte cap"


def test_length_prefix_under_the_cap_allocates_no_more_than_the_cap() -> None:
    tracemalloc.start()
    try:
        check_stream((MAX_FRAME_BYTES - 1).to_bytes(4, "big") + b"x" * 100, [7])
    finally:
        tracemalloc.stop()


def test_body_that_is_not_a_worker_frame_is_a_protocol_error() -> None:
    good = encode_frames([Ready(1, "v")])
    wrong_tag = b"\x00\x00\x00\x03\x92\xa1x"  # ["x"]: an array with an unknown tag
    frames, end = read_stream(good + wrong_tag, [3])
    assert frames == [Ready(1, "v")]
    assert isinstance(end, ProtocolError)
    assert "sent a malformed frame" in str(end)


def test_stream_cut_inside_a_frame_is_a_crashed_worker() -> None:
    data = encode_frames([Report(1, "pending", None, None, [], [], [], 0, 0, 0, 0, None)])
    frames, end = read_stream(data[:-1], [5])
    assert frames == []
    assert isinstance(end, WorkerCrashed)


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*.bin")), ids=lambda p: p.stem)
def test_committed_regression_input(path: pathlib.Path) -> None:
    data = path.read_bytes()
    for chunks in ([1 << 16], [1], [3, 4096]):
        check_stream(data, chunks)


# ---- the worker binary ----------------------------------------------------------------------
@FEW
@given(host_streams)
def test_any_host_output_gets_frames_from_the_worker_then_its_exit_0_or_1(stream: tuple[bytes, list[int]]) -> None:
    check_worker(*stream)


@FEW
@given(good_host_streams)
def test_well_formed_host_frames_each_get_their_reply_and_the_worker_exits_0(
    stream: tuple[list[Any], list[int]],
) -> None:
    frames, chunks = stream
    check_worker(encode_frames(frames), chunks, expected=frames)


def test_worker_refuses_a_length_over_the_cap_before_the_body() -> None:
    frames, end, status = run_worker((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"x" * 10, [1 << 16])
    assert [type(f) for f in frames] == [Ready]
    assert isinstance(end, WorkerCrashed)
    assert status == 1


def test_worker_at_end_of_file_inside_a_frame_exits_0() -> None:
    frames, _end, status = run_worker((MAX_FRAME_BYTES - 1).to_bytes(4, "big") + b"x" * 100, [7])
    assert [type(f) for f in frames] == [Ready]
    assert status == 0


def test_worker_serves_a_cell_with_a_tool_call_and_settles_it() -> None:
    limits = EngineLimits(16 << 20, 1 << 16, 16, 8, 50)
    catalog = CATALOGS[2]  # one host tool, echo
    sent = [
        Configure(limits, catalog, "fp"),
        Start(1, "return (await tools.echo({v: 1})).v + 1", "javascript", 1000.0, 7),
        Settle(1, [(1, True, '{"v": 41}')], 1000.0),
    ]
    frames, _end, status = run_worker(encode_frames(sent), [1 << 16])
    assert status == 0
    ready, pending, done = frames
    assert isinstance(ready, Ready) and ready.engine_version
    assert isinstance(pending, Report) and pending.status == "pending"
    assert pending.calls == [(1, "host:core:echo", '{"v":1}', "callValue")]
    assert isinstance(done, Report) and (done.status, done.value) == ("completed", "42")


@pytest.mark.parametrize(
    "path", sorted([*WORKER_REGRESSIONS.glob("*.bin"), *REGRESSIONS.glob("*.bin")]), ids=lambda p: p.stem
)
def test_committed_regression_input_fed_to_the_worker(path: pathlib.Path) -> None:
    check_worker(path.read_bytes(), [1 << 16])
