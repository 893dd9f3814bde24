"""The worker protocol: every frame between the supervisor and a worker, defined once.

Frames are msgspec structs in tagged unions, msgpack-encoded behind a 4-byte big-endian length.
A length above the cap is refused before anything is allocated; a frame that does not decode
as the expected union is a ``ProtocolError`` and its sender is discarded.

    host -> worker: Configure | Start | Settle | Replay | Drop
    worker -> host: Ready | Report | Fault

The worker is a Rust binary (rust/worker): its ``protocol.rs`` mirrors these structs with serde
and rmp-serde, and ``tests/test_protocol_pinned.py`` pins it to them (hypothesis builds every
frame, msgspec encodes it, the binary decodes and re-encodes it, the bytes must be equal).
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

from ._engine import FrameReader
from .errors import ProtocolError

__all__ = [
    "MAX_FRAME_BYTES",
    "Call",
    "CallMethod",
    "CallResult",
    "ClockRun",
    "Configure",
    "Drop",
    "Fault",
    "FrameReader",
    "HostFrame",
    "Ready",
    "Replay",
    "Report",
    "Settle",
    "Start",
    "WorkerFrame",
    "bounded_bytes",
    "decode_guest_json",
    "encode",
    "frame_reader",
    "input_hash",
    "too_heavy",
    "utf8_len",
]

#: Cap on one frame in either direction (tool results and cell sources included).
MAX_FRAME_BYTES = 64 << 20

#: Arrays and objects one guest value may decode to in the host. JSON as small as ``[[],[]]``
#: costs the host ~25x its size in Python objects (and the collector's time over them): a value
#: is weighed before it is decoded, so a few MB of it cannot cost the host GBs and seconds.
MAX_VALUE_CONTAINERS = 1 << 18

_HEADER = struct.Struct(">I")

#: A clock reading (whole ms) and how many times in a row the guest read it: the journal keeps
#: runs, so a loop of ``Date.now()`` costs a report one entry per millisecond, not per read.
ClockRun = tuple[float, Annotated[int, msgspec.Meta(ge=1, le=(1 << 32) - 1)]]


class EngineLimits(msgspec.Struct, frozen=True, array_like=True):
    """What a worker needs to build an engine; a change makes it rebuild its spare."""

    memory_limit_bytes: int
    max_output_bytes: int
    max_pending_calls: int
    search_default_limit: int
    max_search_limit: int


class Configure(msgspec.Struct, tag="configure", array_like=True):
    """Limits and catalog for the engines built from now on (sent only when they change)."""

    limits: EngineLimits
    catalog_json: str
    #: Hash of ``catalog_json``: journals record it, a replay must see the same catalog.
    fingerprint: str
    #: The semantic search model as a pack (``codemode.semantic``; ~9 MB), or empty: BM25 alone.
    semantic: bytes = b""


class Start(msgspec.Struct, tag="start", array_like=True):
    run: int
    source: str
    language: str
    timeout_ms: float
    seed: int
    #: The run's setup: ``{"namespaces"?: [...], "store"?: {key: json}}`` (``{}`` for none).
    run_json: str = "{}"
    #: A fixed clock's first reading (ms since the epoch; each read 1 ms more), or None: the
    #: real clock. Seeded runs have one (`runs.fixed_clock_start`).
    clock_start: float | None = None


class CallResult(NamedTuple):
    """A tool call's result as it crosses to a worker (and as journals keep it): on the wire an
    array ``[call_id, ok, payload]``, as a plain tuple would be (``Result3`` in protocol.rs)."""

    call_id: int
    ok: bool
    #: JSON text of the value, or the error message when not ``ok``.
    payload: str


class Settle(msgspec.Struct, tag="settle", array_like=True):
    """Tool results for a run."""

    run: int
    results: list[CallResult]
    timeout_ms: float


class Replay(msgspec.Struct, tag="replay", array_like=True):
    """Rebuild a suspended run from its journal: start, settle each batch, keep it resident.
    The report lists every call the replay made, with its input's `input_hash` in place of the
    input (for the host's divergence check: a run's inputs together may not fit a frame), and
    no outputs."""

    start: Start
    batches: list[list[CallResult]]
    clock_reads: list[ClockRun]


class Drop(msgspec.Struct, tag="drop", array_like=True):
    """Forget a resident run (cancelled, timed out on the host side)."""

    run: int


class Ready(msgspec.Struct, tag="ready", array_like=True):
    pid: int
    engine_version: str


#: What a run's step can end in, and the failure codes an engine may report (None: the cell threw).
Status = Literal["completed", "failed", "pending"]
FailureCode = Literal["invalid_input", "timeout", "output_limit_exceeded", "memory_limit_exceeded", "internal_error"]
#: Output kinds: 0 text, 1 JSON, 2 log, 3 info, 4 warn, 5 error, 6 image (``mime;base64``),
#: 7 a not-awaited notice (``[not awaited] call_1 tools.x: ...``, shown as text), 8 a Swarm
#: ``phase(name)`` (``[phase] name``), 9 a Swarm ``log(...)`` (``[log] ...``).
OutputKind = Literal[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
#: The guest API that started a call: ``CallMethod`` in engine.rs (``_engine.CALL_METHODS``,
#: pinned equal by a test), so a frame naming any other is refused.
CallMethod = Literal["callValue", "call", "namespace", "mcp", "yield_control", "readOutput", "models", "agents.run"]
#: A call as a report carries it: ``(call_id, tool, input, method)``; a replay's report has the
#: input's `input_hash` in place of the input.
Call = tuple[int, str, str, CallMethod]


class Report(msgspec.Struct, tag="report", array_like=True):
    """One engine outcome. ``failure`` is ``(code, name, message, stack)``. ``value``,
    ``store_writes`` and JSON outputs are JSON text: `decode_guest_json` checks them."""

    run: int
    status: Status
    value: str | None
    failure: tuple[FailureCode | None, str, str, str] | None
    outputs: list[tuple[OutputKind, str]]
    calls: list[Call]
    clock_reads: list[ClockRun]
    in_flight: int
    memory_bytes: int
    searches: int
    describes: int
    #: On completion: the cell's ``store`` writes, ``{key: json | null}``.
    store_writes: str | None


class Fault(msgspec.Struct, tag="fault", array_like=True):
    """The worker could not serve a frame (e.g. its runtime could not be built)."""

    run: int
    message: str


HostFrame = Configure | Start | Settle | Replay | Drop
WorkerFrame = Ready | Report | Fault

_encoder = msgspec.msgpack.Encoder()


def encode(frame: msgspec.Struct) -> bytes:
    """The frame with its length prefix, ready for one ``write``."""
    body = _encoder.encode(frame)
    return _HEADER.pack(len(body)) + body


def frame_reader(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> FrameReader:
    """Reads length-prefixed frames from ``fd`` into one buffer kept for the pipe's life (the
    extension's `FrameReader`): ``read_within(timeout, spin)`` waits for ``fd`` (polling it
    first for up to ``spin``), does one ``read`` and returns the body of every whole frame
    buffered, None at end of file; ``read_blocking()`` returns the next body. A frame over
    ``max_bytes`` is a ``ProtocolError``."""
    return FrameReader(fd, max_bytes)


def write_all(fd: int, data: bytes) -> None:
    """Writes every byte (pipes accept partial writes of large frames)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


host_decoder = msgspec.msgpack.Decoder(HostFrame)
worker_decoder = msgspec.msgpack.Decoder(WorkerFrame)


def input_hash(input_json: str) -> str:
    """What journals record of a call's input, and what a replay's report carries in its place."""
    return hashlib.blake2b(input_json.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate as its 3), without a copy when it is ASCII
    (most JSON is): what a payload adds to a frame."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def bounded_bytes(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character, the cut marked
    at its end with how much was left out."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    marker = f"… [{len(data) - max_bytes} more bytes cut]"
    keep = max(0, max_bytes - utf8_len(marker))
    return data[:keep].decode("utf-8", "ignore") + marker


def too_heavy(text: str) -> str | None:
    """Why the guest JSON ``text`` may not be decoded here (it would build more than
    ``MAX_VALUE_CONTAINERS`` arrays and objects), or None. Counting brackets overcounts those
    inside strings: only a value near the limit can be refused for them."""
    if len(text) < 2 * MAX_VALUE_CONTAINERS:
        return None  # too short to hold that many
    count = text.count("[") + text.count("{")
    if count <= MAX_VALUE_CONTAINERS:
        return None
    return f"a value of {count} arrays and objects (the host decodes at most {MAX_VALUE_CONTAINERS} per value)"


def decode_guest_json(text: str | bytes) -> Any:
    """JSON text the guest produced (through a worker, so untrusted): a ``ProtocolError`` if it
    is not JSON. JavaScript strings may hold lone UTF-16 surrogates, which ``JSON.stringify``
    escapes and msgspec (rightly) refuses; those become U+FFFD instead of failing."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        pass
    except RecursionError:  # an engine caps guest values at depth 64: this came from elsewhere
        raise ProtocolError("worker sent a value nested too deeply") from None
    import json  # only here: the fallback is rare

    try:
        return _replace_surrogates(json.loads(text))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"worker sent a value that is not JSON: {type(e).__name__}") from None


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    return value
