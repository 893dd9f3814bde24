"""Stub for the Rust extension (rust/pyext): one sandboxed QuickJS run per ``Engine``."""

from typing import Literal, TypeAlias, final

__all__ = [
    "CALL_METHODS",
    "MAX_BRIDGE_BYTES",
    "MAX_NESTING",
    "MAX_REPORT_BYTES",
    "MAX_VALUE_DEPTH",
    "PRELUDE_HASH",
    "YIELD_TOOL",
    "Catalog",
    "Engine",
    "EngineInitError",
    "SemanticModel",
    "__version__",
    "spin_readable",
]

#: ``(code, name, message, stack)`` of a failed run; ``code`` is None for a guest exception.
_Failure: TypeAlias = tuple[str | None, str, str, str]
#: ``(status, value_json, failure, outputs, calls (id, tool, input, method), clock_reads, in_flight,
#: memory_bytes, searches, describes, store_writes)``
_Outcome: TypeAlias = tuple[
    str,
    str | None,
    _Failure | None,
    list[tuple[int, str]],
    list[tuple[int, str, str, str]],
    list[tuple[float, int]],
    int,
    int,
    int,
    int,
    str | None,
]

__version__: str
PRELUDE_HASH: str
YIELD_TOOL: str
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
class Engine:
    def __new__(
        cls,
        *,
        catalog: Catalog,
        memory_limit_bytes: int,
        max_output_bytes: int,
        max_pending_calls: int,
        stack_bytes: int = ...,
        max_bridge_bytes: int = ...,
        search_default_limit: int = ...,
        max_search_limit: int = ...,
    ) -> Engine: ...
    def start(self, source: str, language: str, timeout_ms: float, seed: int, run_json: str = "{}") -> _Outcome: ...
    def settle(self, results: list[tuple[int, bool, str]], timeout_ms: float) -> _Outcome: ...
    def replay_clock(self, readings: list[tuple[float, int]]) -> None: ...
    def memory_bytes(self) -> int: ...

def spin_readable(fd: int, seconds: float) -> bool:
    """Polls ``fd`` without sleeping, for up to ``seconds`` (at most 1), with the GIL released;
    True once it is readable (or in error)."""
