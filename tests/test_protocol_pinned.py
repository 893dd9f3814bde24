"""The Rust worker's codec (rust/worker/src/protocol.rs) pinned to protocol.py, the one definition.

``codemode-worker echo`` decodes each frame it reads (of either direction) and writes it back
re-encoded, or ``["error", reason]``. Against msgspec:

* every frame of every type, with values anywhere in the Rust worker's integer domain, comes
  back byte for byte (field order, arrays with the tag first, nested tags, integer and string
  widths, floats, nil, bin);
* any other body (wrong shapes, mutated frames, random bytes): what msgspec refuses, Rust
  refuses; what both accept comes back as msgspec re-encodes it (defaults filled, extra fields
  dropped, an integer in a float field made a float). Rust may refuse more: integers outside its
  domain (a negative seed, a call id past 32 bits), which the Python worker also could not use.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from codemode import protocol
from codemode.workers import WORKER_BINARY
from frame_fuzz import _mutate, host_frames, rust_worker_frames, wrong_shapes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Echo = Callable[[bytes], Any]
MANY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
#: Either direction, as the echo mode reads it.
any_decoder = msgspec.msgpack.Decoder(protocol.HostFrame | protocol.WorkerFrame)


@pytest.fixture(scope="module")
def echo() -> Iterator[Echo]:
    """A frame body through ``codemode-worker echo``: its re-encoding, or the reason it refused."""
    proc = subprocess.Popen([WORKER_BINARY, "echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={}, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    reader = protocol.frame_reader(proc.stdout.fileno())

    def through(body: bytes) -> Any:
        protocol.write_all(proc.stdin.fileno(), len(body).to_bytes(4, "big") + body)  # type: ignore[union-attr]
        out = reader.read_blocking()
        assert out is not None, "the echo worker exited"
        reply = msgspec.msgpack.decode(out)
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == "error":
            return Refused(reply[1])
        return out

    yield through
    proc.stdin.close()
    assert proc.wait(10) == 0
    proc.stdout.close()


class Refused(str):
    """The reason the Rust codec gave for refusing a body."""


@MANY
@given(host_frames)
def test_every_host_frame_comes_back_from_rust_byte_for_byte(echo: Echo, frame: msgspec.Struct) -> None:
    body = msgspec.msgpack.encode(frame)
    assert echo(body) == body


@MANY
@given(rust_worker_frames)
def test_every_worker_frame_comes_back_from_rust_byte_for_byte(echo: Echo, frame: msgspec.Struct) -> None:
    body = msgspec.msgpack.encode(frame)
    assert echo(body) == body


def _canonical(body: bytes) -> bytes | None:
    """msgspec's re-encoding of ``body`` as a frame of either direction, None if it refuses it."""
    try:
        return msgspec.msgpack.encode(any_decoder.decode(body))
    except msgspec.DecodeError:
        return None


def _is_msgpack(body: bytes) -> bool:
    try:
        msgspec.msgpack.decode(body)
    except msgspec.DecodeError:
        return False
    return True


_frame_bodies = st.one_of(host_frames, rust_worker_frames).map(msgspec.msgpack.encode)
#: Bodies near frames: mutated ones (cut, bit flips, inserted and deleted bytes), wrong shapes.
near_bodies = st.one_of(
    st.builds(
        _mutate,
        _frame_bodies,
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**10), st.integers(0, 255)), min_size=1, max_size=3),
    ),
    wrong_shapes,
    st.binary(max_size=100),
)


@MANY
@given(near_bodies)
def test_what_msgspec_refuses_rust_refuses_and_what_both_take_reads_the_same(echo: Echo, body: bytes) -> None:
    expected, got = _canonical(body), echo(body)
    if expected is None:
        # The one leniency: rmp-serde hands a str that is not UTF-8 over as bytes, and the one
        # bytes field (`Configure.semantic`) takes it. msgspec refuses such a str anywhere.
        lenient = (
            isinstance(got, bytes) and isinstance(any_decoder.decode(got), protocol.Configure) and not _is_msgpack(body)
        )
        assert isinstance(got, Refused) or lenient, f"Rust took what msgspec refuses: {body!r}"
    elif not isinstance(got, Refused):
        assert got == expected


@pytest.mark.parametrize(
    ("body", "same_as"),
    [
        # ["start", 1, "s", "javascript", 1, 2]: run_json left out (its default), an int timeout.
        (msgspec.msgpack.encode(["start", 1, "s", "javascript", 1, 2]), protocol.Start(1, "s", "javascript", 1.0, 2)),
        # ["drop", 5, "extra"]: elements past the last field are ignored.
        (msgspec.msgpack.encode(["drop", 5, "extra"]), protocol.Drop(5)),
        # A Configure without its semantic pack.
        (
            msgspec.msgpack.encode(["configure", [1, 2, 3, 4, 5], "[]", "fp"]),
            protocol.Configure(protocol.EngineLimits(1, 2, 3, 4, 5), "[]", "fp"),
        ),
    ],
    ids=["default_and_int_for_float", "extra_field", "no_semantic"],
)
def test_rust_reads_what_msgspec_reads_the_same_way(echo: Echo, body: bytes, same_as: msgspec.Struct) -> None:
    assert echo(body) == msgspec.msgpack.encode(same_as) == _canonical(body)


@pytest.mark.parametrize(
    "value",
    [
        ["start", -1, "s", "javascript", 1.0, 2],  # a negative run id
        ["start", 1, "s", "javascript", 1.0, -2],  # a negative seed
        ["settle", 1, [[2**32, True, "1"]], 1.0],  # a call id past 32 bits
        ["replay", ["start", 1, "s", "javascript", 1.0, 2], [], [[1.0, 0]]],  # a clock run read 0 times
        ["report", 1, "done", None, None, [], [], [], 0, 0, 0, 0, None],  # a status outside the Literal
        ["report", 1, "failed", None, None, [[10, "x"]], [], [], 0, 0, 0, 0, None],  # an output kind past the last (9)
        ["fault", 1, b"bytes"],  # bin where a str belongs
        ["ready", 1],  # a field missing
        {"drop": 1},  # a map
        ["nope", 1],  # an unknown tag
    ],
)
def test_rust_refuses_frames_outside_the_protocol(echo: Echo, value: Any) -> None:
    assert isinstance(echo(msgspec.msgpack.encode(value)), Refused)


def test_rust_refuses_trailing_bytes_as_msgspec_does(echo: Echo) -> None:
    body = msgspec.msgpack.encode(protocol.Drop(1)) + b"\x00"
    assert _canonical(body) is None
    assert isinstance(echo(body), Refused)
