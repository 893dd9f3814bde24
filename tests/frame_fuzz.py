"""Fuzz harness for the host's reading of worker frames (worker output is hostile).

The supervisor reads a worker with ``WorkerProcess.take``: ``FrameReader`` (4-byte length
prefix, capped) over the worker's stdout pipe, then ``protocol.worker_decoder``; a
``msgspec.DecodeError`` becomes ``ProtocolError`` and end of file (None) becomes ``WorkerCrashed``,
and either one makes the supervisor replace the worker. ``read_stream`` drives that very method over a pipe fed with
arbitrary bytes, and ``check_stream`` states the property:

* reading yields typed ``WorkerFrame`` values (each re-encodes to what it decodes from) and then
  ends with ``ProtocolError`` or ``WorkerCrashed``: never another exception, never a hang;
* a stream of well-formed frames, cut into any chunks, reads back as exactly those frames;
* no length prefix makes the host allocate more than the frame cap (plus what was sent).

Used by ``tests/test_frame_fuzz.py`` (a few examples, always on, plus the committed regression
inputs in ``tests/fuzz_regressions/frames/``) and by ``tools/fuzz.py`` (``make fuzz``: a bounded
long run that saves any failing input there).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import tracemalloc
import typing
from typing import Any

import msgspec
from codemode import protocol
from codemode.errors import ProtocolError, WorkerCrashed
from codemode.protocol import MAX_FRAME_BYTES, Fault, Ready, Report
from codemode.workers import WorkerProcess
from hypothesis import strategies as st

#: How long one stream may take to read before it counts as a hang.
READ_TIMEOUT_S = 10.0
#: What reading may allocate beyond one capped frame and the bytes sent (buffers, frames).
ALLOC_SLACK = 8 << 20


class _Exited:
    """Stands in for the ``Popen`` of a worker that has exited (``crashed()`` reads it)."""

    pid = 0
    returncode = 0
    stdin = None
    stdout = None

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def _pipe_worker(rfd: int) -> WorkerProcess:
    """A ``WorkerProcess`` whose stdout is ``rfd``: the real ``take``, without a subprocess."""
    worker = WorkerProcess.__new__(WorkerProcess)
    worker.proc = _Exited()  # type: ignore[assignment]
    worker.rfd = rfd
    worker.reader = protocol.frame_reader(rfd)
    worker._bad = None
    return worker


def read_stream(data: bytes, chunks: list[int]) -> tuple[list[Any], BaseException]:
    """Everything ``WorkerProcess.take`` reads from a worker that writes ``data`` (in writes of
    ``chunks`` bytes, cycled) and exits: the frames, and the exception that ended reading."""
    rfd, wfd = os.pipe()

    def feed() -> None:
        try:
            view = memoryview(data)
            for i in range(len(data) + 1):
                if not view:
                    break
                # At most ~64 writes: short reads without crawling through a large stream.
                n = max(1, chunks[i % len(chunks)], len(data) >> 6)
                protocol.write_all(wfd, view[:n])
                view = view[n:]
        except OSError:
            pass  # the reader gave up on a bad frame and closed its end
        finally:
            os.close(wfd)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    frames: list[Any] = []
    try:
        worker = _pipe_worker(rfd)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                spoke, got = worker.take(deadline - time.monotonic())
                if not spoke:
                    raise TimeoutError("reading a worker's output hung")
                if got is None:
                    raise worker.crashed("worker exited")
            except (ProtocolError, WorkerCrashed) as e:
                return frames, e
            frames.extend(got)
    finally:
        os.close(rfd)
        writer.join()


def check_stream(data: bytes, chunks: list[int], expected: list[Any] | None = None) -> None:
    """The property (see the module docstring). ``expected``: the frames ``data`` encodes."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
    frames, end = read_stream(data, chunks)
    if tracing:
        _, peak = tracemalloc.get_traced_memory()
        grew = peak - before
        assert grew <= MAX_FRAME_BYTES + 4 * len(data) + ALLOC_SLACK, f"reading {len(data)} bytes allocated {grew}"
    assert type(end) in (ProtocolError, WorkerCrashed), f"reading ended with {end!r}"
    for frame in frames:
        assert isinstance(frame, Ready | Report | Fault), f"decoded {frame!r}"
        body = msgspec.msgpack.encode(frame)
        assert msgspec.msgpack.encode(protocol.worker_decoder.decode(body)) == body, f"{frame!r} does not round-trip"
    if expected is not None:
        got = [msgspec.msgpack.encode(f) for f in frames]
        assert got == [msgspec.msgpack.encode(f) for f in expected], "well-formed frames read back differently"
        assert isinstance(end, WorkerCrashed), f"well-formed frames ended with {end!r}"


# ---- strategies -----------------------------------------------------------------------------
# Field values a compromised worker could send: the whole msgpack int range, NaN and
# infinities, NULs, long strings. (Statuses, failure codes and output kinds outside the protocol's
# Literal types are malformed frames: `wrong_shapes` covers them.)
ints = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, -1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, MAX_FRAME_BYTES]),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "completed", "failed", "pending", "timeout", "\ufffd", "\U0010ffff"]),
)
#: Where a worker sends long text (values, messages, outputs): also past the 64 KiB read size.
long_texts = st.one_of(texts, st.sampled_from([(1 << 16) - 8, 1 << 16, 200_000]).map(lambda n: "x" * n))
statuses = st.sampled_from(typing.get_args(protocol.Status))
failure_codes = st.none() | st.sampled_from(typing.get_args(protocol.FailureCode))
output_kinds = st.sampled_from(typing.get_args(protocol.OutputKind))
call_methods = st.sampled_from(typing.get_args(protocol.CallMethod))

readies = st.builds(Ready, ints, texts)
faults = st.builds(Fault, ints, long_texts)
reports = st.builds(
    Report,
    run=ints,
    status=statuses,
    value=st.none() | long_texts,
    failure=st.none() | st.tuples(failure_codes, texts, long_texts, texts),
    outputs=st.lists(st.tuples(output_kinds, long_texts), max_size=4),
    calls=st.lists(st.tuples(ints, texts, texts, call_methods), max_size=4),
    clock_reads=st.lists(st.tuples(floats, st.integers(1, (1 << 32) - 1)), max_size=4),
    in_flight=ints,
    memory_bytes=ints,
    searches=ints,
    describes=ints,
    store_writes=st.none() | texts,
)
worker_frames = st.one_of(readies, faults, reports)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    floats,
    texts,
    st.binary(max_size=40),
    st.builds(msgspec.msgpack.Ext, st.integers(min_value=-128, max_value=127), st.binary(max_size=16)),
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(texts, inner, max_size=4), max_leaves=24
)
#: msgpack of the wrong shape: any value, and arrays that start with a real tag.
_tags = st.sampled_from(["ready", "report", "fault", "configure", "start", "settle", "replay", "drop", ""])
wrong_shapes = st.one_of(_values, st.tuples(_tags, st.lists(_values, max_size=14)).map(lambda t: [t[0], *t[1]])).map(
    msgspec.msgpack.encode
)
# A frame body: well-formed, of the wrong shape, or random bytes.
bodies = st.one_of(worker_frames.map(msgspec.msgpack.encode), wrong_shapes, st.binary(max_size=200))


def _mutate(body: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(body)
    for kind, pos, value in edits:
        at = pos % (len(out) + 1)
        if kind == 0:
            del out[at:]
        elif kind == 1 and at < len(out):
            out[at] ^= 1 << (value % 8)
        elif kind == 2:
            out[at:at] = bytes([value % 256])
        elif kind == 3:
            del out[at : at + 1 + value % 8]
        else:
            out[at:at] = b"\xdb\xff\xff\xff\xff"  # a str32 header claiming 4 GiB
    return bytes(out)


mutated_bodies = st.builds(
    _mutate,
    bodies,
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
)
#: Length prefixes around the cap and the 32-bit range, and small lies.
prefixes = st.one_of(
    st.sampled_from([0, 1, 3, 4, MAX_FRAME_BYTES - 1, MAX_FRAME_BYTES, MAX_FRAME_BYTES + 1, 2**31, 2**32 - 1]),
    st.integers(min_value=0, max_value=2**32 - 1),
)


def _prefixed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


segments = st.one_of(
    mutated_bodies.map(_prefixed),
    st.builds(lambda size, body: size.to_bytes(4, "big") + body, prefixes, mutated_bodies),
    st.binary(max_size=64),
)
#: Any byte stream a worker could write, with the sizes of its writes.
streams = st.tuples(
    st.lists(segments, max_size=5).map(b"".join), st.lists(st.integers(1, 70_000), min_size=1, max_size=6)
)
#: Well-formed frames only: they must read back exactly, however the writes are cut.
good_streams = st.tuples(st.lists(worker_frames, max_size=5), st.lists(st.integers(1, 70_000), min_size=1, max_size=6))


def encode_frames(frames: list[Any]) -> bytes:
    return b"".join(protocol.encode(f) for f in frames)


# ---- the worker binary ----------------------------------------------------------------------
# The same property from the other side of the pipe: the real worker binary (rust/worker) fed
# any byte stream a host could write never panics, never dies of a signal and never hangs; it
# writes only frames the host reads as ours (the stream ends at its exit: end of file, or a
# frame it could not read), exits 0 at end of file and 1 on a frame it cannot read; and a
# stream of well-formed frames gets one reply per Start/Settle/Replay, for that run, in order.

#: Integers in the Rust worker's domain (protocol.rs): what the host's frames hold.
u64s = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1), st.sampled_from([0, 1, 127, 128, 255, 256, 2**32, 2**63, 2**64 - 1])
)
u32s = st.one_of(st.integers(min_value=0, max_value=2**32 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1]))
clock_runs = st.lists(st.tuples(floats, st.integers(1, (1 << 32) - 1)), max_size=4)
tool_results = st.lists(st.tuples(u32s, st.booleans(), long_texts), max_size=4)

engine_limits = st.builds(protocol.EngineLimits, u64s, u64s, u64s, u64s, u64s)
configures = st.builds(protocol.Configure, engine_limits, long_texts, texts, st.binary(max_size=64))
starts = st.builds(protocol.Start, u64s, long_texts, texts, floats, u64s, texts)
settles = st.builds(protocol.Settle, u64s, tool_results, floats)
replays = st.builds(protocol.Replay, starts, st.lists(tool_results, max_size=3), clock_runs)
drops = st.builds(protocol.Drop, u64s)
#: Every host frame, with values anywhere in their types' domains.
host_frames = st.one_of(configures, starts, settles, replays, drops)
#: Every worker frame a Rust worker can write (the host-side strategies above also try values
#: no worker of ours can send, e.g. negative ids).
rust_worker_frames = st.one_of(
    st.builds(Ready, u64s, texts),
    st.builds(Fault, u64s, long_texts),
    st.builds(
        Report,
        run=u64s,
        status=statuses,
        value=st.none() | long_texts,
        failure=st.none() | st.tuples(failure_codes, texts, long_texts, texts),
        outputs=st.lists(st.tuples(output_kinds, long_texts), max_size=4),
        calls=st.lists(st.tuples(u32s, texts, texts, call_methods), max_size=4),
        clock_reads=clock_runs,
        in_flight=u64s,
        memory_bytes=u64s,
        searches=u64s,
        describes=u64s,
        store_writes=st.none() | texts,
    ),
)

#: A catalog with a host tool, and some that are not catalogs.
CATALOGS = [
    "[]",
    '{"tools": [], "api": {}}',
    '{"tools": [{"id": "host:core:echo", "name": "echo", "description": "Echo.", "source": "host", '
    '"input": "unknown"}], "api": {}}',
    "{",
    '{"tools": 1}',
]
#: Cells that run (calls, yields, outputs, errors, a busy loop) and sources that do not parse.
CELLS = [
    "return 1",
    "return await tools.echo({value: 1})",
    "const [a, b] = await Promise.all([tools.echo({}), tools.echo({})]); return [a, b]",
    "const r = await yield_control('why'); return r",
    "console.log('x'); text('y'); return Date.now()",
    "throw new Error('no')",
    "while (true) {}",
    "let a = []; for (;;) a.push(new Array(1e5))",
    "return await tools.callValue('host:core:echo', {value: [1, 2]})",
    "import x from 'y'",
    "",
]
#: Run and call ids the frames of one stream share, so that settles meet their runs.
few_ids = st.integers(0, 3)
sane_limits = st.builds(
    protocol.EngineLimits,
    st.one_of(st.integers(1 << 20, 64 << 20), st.sampled_from([0, 1, 2**64 - 1])),
    st.one_of(st.integers(0, 1 << 20), st.just(2**64 - 1)),
    st.integers(0, 32),
    st.integers(0, 60),
    st.integers(0, 60),
)
#: Slices a busy cell can spend (the supervisor's kill is the backstop for more).
slices = st.one_of(st.floats(0, 100), st.sampled_from([float("nan"), float("inf"), -1.0, 0.0]))
languages = st.one_of(st.sampled_from(["javascript", "typescript"]), st.just("javascript"), texts)
configures_to_run = st.builds(
    protocol.Configure, sane_limits, st.sampled_from(CATALOGS[:3]), st.sampled_from(["a", "b"]), st.just(b"")
)
run_frames = st.one_of(
    st.builds(
        protocol.Configure,
        sane_limits,
        st.sampled_from(CATALOGS) | texts,
        st.sampled_from(["a", "b"]),
        st.just(b"") | st.binary(max_size=16),
    ),
    st.builds(
        protocol.Start,
        few_ids,
        st.sampled_from(CELLS) | texts,
        languages,
        slices,
        u64s,
        st.sampled_from(["{}", '{"store": {"k": "1"}}', "{", "[]"]),
    ),
    st.builds(
        protocol.Settle,
        few_ids,
        st.lists(st.tuples(few_ids, st.booleans(), st.sampled_from(["1", '"s"', "{", "null"]) | texts), max_size=3),
        slices,
    ),
    st.builds(
        protocol.Replay,
        st.builds(protocol.Start, few_ids, st.sampled_from(CELLS), st.just("javascript"), slices, u64s),
        st.lists(st.lists(st.tuples(few_ids, st.booleans(), st.just("1")), max_size=2), max_size=3),
        st.lists(st.tuples(st.floats(0, 1e13), st.integers(1, 3)), max_size=2),
    ),
    st.builds(protocol.Drop, few_ids),
)
#: Well-formed host frames that drive engines (most streams start with a catalog that loads);
#: and any stream a host could write.
good_host_streams = st.tuples(
    st.one_of(
        st.builds(lambda first, rest: [first, *rest], configures_to_run, st.lists(run_frames, max_size=8)),
        st.lists(run_frames, max_size=8),
    ),
    st.lists(st.integers(1, 70_000), min_size=1, max_size=6),
)
_host_bodies = st.one_of(
    run_frames.map(msgspec.msgpack.encode),
    host_frames.map(msgspec.msgpack.encode),
    wrong_shapes,
    st.binary(max_size=200),
)
_host_segments = st.one_of(
    st.builds(
        _mutate,
        _host_bodies,
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
    ).map(_prefixed),
    st.builds(lambda size, body: size.to_bytes(4, "big") + body, prefixes, _host_bodies),
    st.binary(max_size=64),
)
host_streams = st.tuples(
    st.lists(_host_segments, max_size=6).map(b"".join), st.lists(st.integers(1, 70_000), min_size=1, max_size=6)
)

#: How long a worker may take over one stream (busy cells spend at most ~100 ms slices).
WORKER_TIMEOUT_S = 30.0


def run_worker(data: bytes, chunks: list[int]) -> tuple[list[Any], BaseException, int]:
    """Feeds ``data`` (in writes of ``chunks`` bytes, cycled) to a fresh worker binary started as
    the supervisor starts one, then closes its stdin; returns the frames the host reads from it,
    the exception that ended reading, and its exit status (``Popen.returncode``)."""
    import subprocess

    from codemode.workers import WORKER_BINARY, WORKER_MEMORY_SLACK

    proc = subprocess.Popen(
        [WORKER_BINARY, str(WORKER_MEMORY_SLACK + (2 << 30)), "60"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={},
        start_new_session=True,
        bufsize=0,
    )
    assert proc.stdin is not None and proc.stdout is not None
    wfd = proc.stdin.fileno()

    def feed() -> None:
        try:
            view = memoryview(data)
            for i in range(len(data) + 1):
                if not view:
                    break
                n = max(1, chunks[i % len(chunks)], len(data) >> 6)
                protocol.write_all(wfd, view[:n])
                view = view[n:]
        except OSError:
            pass  # the worker exited on a frame it could not read
        finally:
            proc.stdin.close()  # type: ignore[union-attr]

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    worker = _pipe_worker(proc.stdout.fileno())
    worker.proc = proc
    frames: list[Any] = []
    end: BaseException
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while True:
            try:
                spoke, got = worker.take(deadline - time.monotonic())
                if not spoke:
                    raise TimeoutError("the worker hung")
                if got is None:
                    end = WorkerCrashed("worker exited", exit_code=None, signal=None, timed_out=False)
                    break
            except ProtocolError as e:
                end = e
                break
            frames.extend(got)
    finally:
        try:
            proc.wait(5.0)  # its stdout is closed: it is exiting
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        writer.join()
    return frames, end, proc.returncode


def _replies_match(sent: list[Any], replies: list[Any]) -> None:
    """Each Start/Settle/Replay got one Report or Fault for its run, in order; a Configure may
    get a Fault (run 0: a catalog it refused); nothing else is answered."""
    replies = list(replies)
    for frame in sent:
        if isinstance(frame, protocol.Configure):
            if replies and isinstance(replies[0], Fault) and replies[0].message.startswith("bad catalog: "):
                assert replies.pop(0).run == 0, frame
        elif isinstance(frame, protocol.Start | protocol.Settle | protocol.Replay):
            run = frame.start.run if isinstance(frame, protocol.Replay) else frame.run
            assert replies, f"no reply to {frame!r}"
            reply = replies.pop(0)
            assert isinstance(reply, Report | Fault) and reply.run == run, (frame, reply)
    assert not replies, f"replies nothing asked for: {replies!r}"


def check_worker(data: bytes, chunks: list[int], expected: list[Any] | None = None) -> None:
    """The worker binary's property (see this section's comment). ``expected``: the frames
    ``data`` encodes, all well-formed."""
    frames, end, status = run_worker(data, chunks)
    assert status in (0, 1), f"the worker ended with status {status} (a negative one is a signal; 101 a panic)"
    assert isinstance(end, WorkerCrashed), f"the host read a frame that is not ours: {end!r}"
    assert frames and isinstance(frames[0], Ready), f"the worker did not introduce itself: {frames[:1]!r}"
    for frame in frames:
        body = msgspec.msgpack.encode(frame)
        assert msgspec.msgpack.encode(protocol.worker_decoder.decode(body)) == body, f"{frame!r} does not round-trip"
    assert not any(isinstance(f, Ready) for f in frames[1:]), "the worker introduced itself twice"
    if expected is not None:
        assert status == 0, f"well-formed frames ended the worker with status {status}"
        _replies_match(expected, frames[1:])
