"""Stub for the Rust extension (rust/pyext): one sandboxed QuickJS run per ``Engine``."""

from typing import Literal, TypeAlias, final

__all__ = [
    "AGENTS_TOOL",
    "CALL_METHODS",
    "DEFAULT_LIMITS",
    "MAX_BRIDGE_BYTES",
    "MAX_NESTING",
    "MAX_REPORT_BYTES",
    "MAX_VALUE_DEPTH",
    "MCP_TOOL",
    "MODELS_TOOL",
    "NAMESPACE_TOOL",
    "OUTPUT_TOOL",
    "PRELUDE_HASH",
    "YIELD_TOOL",
    "Catalog",
    "Engine",
    "EngineInitError",
    "FrameReader",
    "Limits",
    "Outcome",
    "SemanticModel",
    "__version__",
    "current_cpu",
    "spin_readable",
]

#: ``(code, name, message, stack)`` of a failed run; ``code`` is None for a guest exception.
_Failure: TypeAlias = tuple[str | None, str, str, str]

__version__: str
PRELUDE_HASH: str
#: The bridge's internal tool ids (engine.rs; the prelude gets the same ones at install): a
#: ``yield_control``, an ``MCP.*`` call, a namespace function's call, a ``readOutput``, a
#: ``models.*`` call, an ``agents.run``.
YIELD_TOOL: str
MCP_TOOL: str
NAMESPACE_TOOL: str
OUTPUT_TOOL: str
MODELS_TOOL: str
AGENTS_TOOL: str
#: The guest API a call can start from, as each call's ``method`` names it (``CallMethod`` in engine.rs).
CALL_METHODS: tuple[str, ...]
#: How deeply a cell's source may nest (brackets, operator chains, statements); deeper is invalid_input.
MAX_NESTING: int
#: How deeply a value leaving the guest may nest (arrays and objects).
MAX_VALUE_DEPTH: int
#: Bytes of tool calls, outputs and clock readings one report carries (fits in a protocol frame).
MAX_REPORT_BYTES: int
#: Bytes of one value crossing the bridge (a tool input or result): the engine's default limit.
MAX_BRIDGE_BYTES: int

class EngineInitError(RuntimeError): ...

@final
class Limits:
    """A run's limits (``Limits`` in limits.rs)."""

    @property
    def memory_bytes(self) -> int: ...
    @property
    def stack_bytes(self) -> int: ...
    @property
    def max_output_bytes(self) -> int: ...
    @property
    def max_pending_calls(self) -> int: ...
    @property
    def max_bridge_bytes(self) -> int: ...
    @property
    def search_default_limit(self) -> int: ...
    @property
    def max_search_limit(self) -> int: ...
    @property
    def max_report_bytes(self) -> int: ...

#: The engine's default limits: the one copy, which ``codemode.config``'s defaults read.
DEFAULT_LIMITS: Limits

@final
class Outcome:
    """What a run's step ended in: the fields of protocol.py's ``Report``."""

    @property
    def status(self) -> Literal["completed", "failed", "pending"]: ...
    @property
    def value(self) -> str | None: ...
    @property
    def failure(self) -> _Failure | None: ...
    @property
    def outputs(self) -> list[tuple[int, str]]: ...
    @property
    def calls(self) -> list[tuple[int, str, str, str]]:
        """``(id, tool, input, method)`` of each call started."""
    @property
    def clock_reads(self) -> list[tuple[float, int]]: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def searches(self) -> int: ...
    @property
    def describes(self) -> int: ...
    @property
    def store_writes(self) -> str | None: ...

@final
class SemanticModel:
    def __new__(cls, pack: bytes) -> SemanticModel: ...
    @staticmethod
    def from_wordllama(tokenizer_json: str, weights: bytes, name: str) -> SemanticModel: ...
    def pack(self) -> bytes: ...
    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...
    def token_ids(self, text: str) -> list[int]: ...
    def embed(self, text: str) -> list[float] | None: ...

@final
class Catalog:
    def __new__(
        cls, entries_json: str, include_mcp: bool = False, semantic: SemanticModel | None = None
    ) -> Catalog: ...
    def __len__(self) -> int: ...
    @property
    def search_mode(self) -> Literal["hybrid", "bm25"]: ...
    def search(self, query: str, limit: int) -> str: ...
    def describe(self, id_or_name: str) -> str | None: ...

@final
class FrameReader:
    """Length-prefixed frames (a 4-byte big-endian length, then the body) read from ``fd`` into
    one buffer kept for the pipe's life (``protocol.frame_reader``)."""

    def __new__(cls, fd: int, max_bytes: int) -> FrameReader: ...
    def read_within(self, timeout: float, spin: float) -> tuple[bool, list[bytes] | None]:
        """Waits up to ``timeout`` seconds for the pipe (polling it first for up to ``spin``,
        yielding), then does one ``read``, the GIL released once for all of it: ``(False,
        None)`` if nothing came; else ``True`` and the body of every whole frame buffered, None
        at end of file. A signal's Python handler runs (and may raise) before it waits again.
        ``ProtocolError`` for a frame over ``max_bytes``; ``OSError`` if the read fails."""
    def read_blocking(self) -> bytes | None:
        """The next frame's body, blocking; None at end of file."""

@final
class Engine:
    def __new__(
        cls,
        *,
        catalog: Catalog,
        memory_limit_bytes: int | None = None,
        max_output_bytes: int | None = None,
        max_pending_calls: int | None = None,
        stack_bytes: int | None = None,
        max_bridge_bytes: int | None = None,
        search_default_limit: int | None = None,
        max_search_limit: int | None = None,
    ) -> Engine:
        """Limits left out (None) are the engine's defaults (``DEFAULT_LIMITS``)."""
    def start(self, source: str, language: str, timeout_ms: float, seed: int, run_json: str = "{}") -> Outcome: ...
    def settle(self, results: list[tuple[int, bool, str]], timeout_ms: float) -> Outcome: ...
    def replay_clock(self, readings: list[tuple[float, int]]) -> None: ...
    def memory_bytes(self) -> int: ...

def current_cpu() -> int | None:
    """The CPU the calling thread runs on now (None where the kernel cannot tell)."""

def spin_readable(fd: int, seconds: float, yielding: bool = False) -> bool:
    """Polls ``fd`` without sleeping, for up to ``seconds`` (at most 1), with the GIL released;
    True once it is readable (or in error). ``yielding``: give the CPU away between looks, and
    stop (False) once a yield shows another task wants this CPU."""
