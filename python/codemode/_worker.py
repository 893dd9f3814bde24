"""Worker process: frames in on stdin, engine calls, frames out on stdout.

Started by the supervisor as ``python -I -c "from codemode._worker import main; main()"`` with
an empty environment, in its own process group. It holds the engines of its resident runs and,
while idle, builds the next engine so a new cell does not wait for a runtime. It exits at EOF.
Everything it knows comes from the host; it never imports a tool, touches a file or opens a
socket after start-up.
"""

from __future__ import annotations

import os
import resource
import select
import sys

from . import protocol
from ._engine import Catalog, Engine, EngineInitError, SemanticModel, __version__
from .protocol import Configure, Drop, Fault, Ready, Replay, Report, Settle, Start, input_hash

#: How long a worker whose run just parked on tool calls gives the host to answer before it
#: does its idle work (freeing the last engine, building the next), in seconds.
PARKED_GRACE_S = 0.002
#: The same for a run that ended after it had parked: the host is finishing the ``exec``. Short,
#: so that the next engine is still built before a cell that follows within a few ms.
ENDED_GRACE_S = 0.0005


def _limit(kind: int, value: int) -> None:
    _soft, hard = resource.getrlimit(kind)
    cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (cap, hard if hard != resource.RLIM_INFINITY else cap))


def _hashed(calls: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """A replay's calls as its report carries them: each input by its hash."""
    return [(call_id, tool, input_hash(data), method) for call_id, tool, data, method in calls]


def _report(run: int, outcome: tuple) -> Report:  # type: ignore[type-arg]
    return Report(run, *outcome)


class Worker:
    def __init__(self) -> None:
        self.config: Configure | None = None
        self.catalog: Catalog | None = None
        #: The semantic search model and the pack it came from (a new catalog reuses it).
        self.semantic: tuple[bytes, SemanticModel | None] = (b"", None)
        self.spare: Engine | None = None
        self.resident: dict[int, Engine] = {}
        #: A finished engine, freed while idle so its teardown is not on the reply path.
        self.retired: Engine | None = None

    def build(self) -> Engine:
        config, catalog = self.config, self.catalog
        if config is None or catalog is None:
            raise EngineInitError("no configuration received before the first cell")
        limits = config.limits
        return Engine(
            catalog=catalog,
            memory_limit_bytes=limits.memory_limit_bytes,
            max_output_bytes=limits.max_output_bytes,
            max_pending_calls=limits.max_pending_calls,
            search_default_limit=limits.search_default_limit,
            max_search_limit=limits.max_search_limit,
        )

    def handle(self, frame: protocol.HostFrame) -> protocol.WorkerFrame | None:
        if isinstance(frame, Start):
            engine, self.spare = self.spare, None
            try:
                if engine is None:
                    engine = self.build()
            except EngineInitError as e:
                return Fault(frame.run, str(e))
            outcome = engine.start(frame.source, frame.language, frame.timeout_ms, frame.seed, frame.run_json)
            if outcome[0] == "pending":
                self.resident[frame.run] = engine
            else:
                self.retired = engine
            return _report(frame.run, outcome)
        if isinstance(frame, Settle):
            engine = self.resident.get(frame.run)
            if engine is None:
                return Fault(frame.run, "unknown run")
            outcome = engine.settle(frame.results, frame.timeout_ms)
            if outcome[0] != "pending":
                self.retired = self.resident.pop(frame.run)
            return _report(frame.run, outcome)
        if isinstance(frame, Replay):
            return self.replay(frame)
        if isinstance(frame, Drop):
            self.resident.pop(frame.run, None)
            return None
        if isinstance(frame, Configure):
            if self.config is None or (frame.fingerprint, frame.semantic) != (
                self.config.fingerprint,
                self.config.semantic,
            ):
                try:
                    if frame.semantic != self.semantic[0]:
                        self.semantic = (frame.semantic, SemanticModel(frame.semantic) if frame.semantic else None)
                    self.catalog = Catalog(frame.catalog_json, semantic=self.semantic[1])
                except ValueError as e:
                    self.config = self.catalog = None
                    return Fault(0, f"bad catalog: {e}")
            self.config = frame
            self.spare = None
            return None
        raise TypeError(f"unexpected frame {type(frame).__name__}")

    def replay(self, frame: Replay) -> Report | Fault:
        start = frame.start
        engine, self.spare = self.spare, None
        try:
            if engine is None:
                engine = self.build()
        except EngineInitError as e:
            return Fault(start.run, str(e))
        engine.replay_clock(frame.clock_reads)
        outcome = engine.start(start.source, start.language, start.timeout_ms, start.seed, start.run_json)
        calls = _hashed(outcome[4])
        for batch in frame.batches:
            if outcome[0] != "pending":
                break
            outcome = engine.settle(batch, start.timeout_ms)
            calls.extend(_hashed(outcome[4]))
        status, value, failure, _outputs, _calls, _clock, in_flight, memory, _searches, _describes, writes = outcome
        if status == "pending":
            self.resident[start.run] = engine
        else:
            self.retired = engine
        return Report(start.run, status, value, failure, [], calls, [], in_flight, memory, 0, 0, writes)  # type: ignore[arg-type]  # checked by the host on decode

    def has_idle_work(self) -> bool:
        return self.retired is not None or (self.spare is None and self.config is not None)

    def idle(self) -> None:
        """Work done between frames: free the last engine, build the next one."""
        self.retired = None
        if self.spare is None and self.config is not None:
            try:
                self.spare = self.build()
            except EngineInitError:
                self.spare = None


def main() -> None:
    memory_cap = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 30
    cpu_seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
    _limit(resource.RLIMIT_AS, memory_cap)
    _limit(resource.RLIMIT_CPU, cpu_seconds)
    rfd, wfd = sys.stdin.fileno(), sys.stdout.fileno()
    # Nothing else may write to the protocol pipe: stray prints go to stderr.
    sys.stdout = sys.stderr
    reader = protocol.FrameReader(rfd)
    decode = protocol.host_decoder.decode
    write_all = protocol.write_all
    encode = protocol.encode
    worker = Worker()
    write_all(wfd, encode(Ready(os.getpid(), __version__)))
    #: Before it blocks for the next frame, the worker does its idle work (~0.5 ms: free the last
    #: engine, build the next) after giving the host this many seconds to send a frame first.
    grace = 0.0
    while True:
        body = reader.poll()
        if body is None:
            if worker.has_idle_work() and not (grace and select.select([rfd], [], [], grace)[0]):
                worker.idle()
            body = reader.read_blocking()
            if body is None:
                return
        frame = decode(body)
        reply = worker.handle(frame)
        if reply is not None:
            write_all(wfd, encode(reply))
        if isinstance(reply, Report) and reply.status == "pending":
            # Parked on tools, which usually answer within microseconds: the rebuild waits for a
            # slow answer (or for a run the host suspends, which sends nothing).
            grace = PARKED_GRACE_S
        elif isinstance(frame, Settle):
            # A run that parked has ended. The host may be finishing it on a thread that a
            # rebuild started now would keep off a CPU for its whole ~0.5 ms (measured: an exec
            # whose last MCP result was read by its loop returned 0.4 ms later).
            grace = ENDED_GRACE_S
        else:
            grace = 0.0


if __name__ == "__main__":
    main()
