"""The one configuration table: defaults, bounds, and how values are clamped.

Keys are camelCase (``timeoutMs``, ``maxOutputBytes``...), as the JSON configs of the tools
this replaces spell them; each may be written snake_case too (``timeout_ms``), as Python code
and a cell's ``// @options`` pragma spell them (`either_spelling`: both spellings come from the
struct's own fields, not from a second list). Numbers outside their range are clamped to it; a
wrong type, an unknown key or a key given both ways is a ``ConfigError``.
``searchDefaultLimit`` is clamped to ``maxSearchLimit``.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import msgspec

from ._engine import DEFAULT_LIMITS as _ENGINE
from .errors import ConfigError

__all__ = ["BOUNDS", "CodeModeConfig", "either_spelling", "load_config"]

Language = Literal["javascript", "typescript"]

#: field -> (minimum, maximum); the single source of the numeric limits.
BOUNDS: dict[str, tuple[int, int]] = {
    "timeout_ms": (100, 60_000),
    "memory_limit_bytes": (1 << 20, 1 << 30),
    "max_output_bytes": (1024, 10 << 20),
    "max_snapshot_bytes": (1024, 256 << 20),
    "max_pending_tool_calls": (1, 128),
    "snapshot_ttl_seconds": (1, 86_400),
    "search_default_limit": (1, 50),
    "max_search_limit": (1, 50),
    "max_runs_per_worker": (1, 4096),
    "max_worker_memory_bytes": (64 << 20, 64 << 30),
    "max_suspended_runs_per_session": (1, 64),
    "max_journal_bytes": (64 << 10, 32 << 20),
    "workers": (0, 256),
    "output_store_bytes": (0, 1 << 30),
    "output_store_total_bytes": (1 << 20, 64 << 30),
    "output_store_ttl_seconds": (1, 86_400),
}


class CodeModeConfig(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Validated, clamped configuration. Build it with ``load_config``."""

    #: Gates the model-facing surfaces only (the spec: just ``true`` enables); a ``CodeMode``
    #: built without a config is enabled.
    enabled: bool = False
    #: The spec's only value is "quickjs-wasi"; here both names mean the embedded QuickJS (quickjs-ng).
    runtime: Literal["quickjs", "quickjs-wasi"] = "quickjs"
    mode: Literal["only"] = "only"
    languages: tuple[Language, ...] = ("javascript", "typescript")
    timeout_ms: int = 10_000
    #: The engine's limits default to its own (``Limits::default`` in limits.rs, the one copy).
    memory_limit_bytes: int = _ENGINE.memory_bytes
    max_output_bytes: int = _ENGINE.max_output_bytes
    max_snapshot_bytes: int = 10 << 20
    max_pending_tool_calls: int = _ENGINE.max_pending_calls
    snapshot_ttl_seconds: int = 900
    search_default_limit: int = _ENGINE.search_default_limit
    max_search_limit: int = _ENGINE.max_search_limit
    #: Worker processes kept in the pool (0 = one per CPU).
    workers: int = 0
    #: Runs one worker holds at once (parked on tools, suspended, or running); past it, and
    #: past the memory cap, new cells go to another worker, or fail with `runtime_unavailable`.
    max_runs_per_worker: int = 512
    #: QuickJS memory the runs resident on one worker may hold together.
    max_worker_memory_bytes: int = 2 << 30
    #: Suspended runs one session may hold, of the 64 a ``CodeMode`` keeps: one busy session
    #: cannot take every other session's suspensions.
    max_suspended_runs_per_session: int = 16
    #: Tool results (and a restart-safe run's open inputs) one run's journal may hold: the host
    #: memory a run costs besides its runtime, and what a replay sends in one frame. A result
    #: past it fails that call. A suspended run counts it in ``maxSnapshotBytes`` too.
    max_journal_bytes: int = 16 << 20
    #: Host memory the full texts of one session's cut outputs may take (`codemode.outputs`;
    #: 0 keeps none): past it, the session's least recently read text is forgotten.
    output_store_bytes: int = 4 << 20
    #: The same for every session together: past it, the oldest text of any session goes.
    output_store_total_bytes: int = 64 << 20
    #: A kept text is forgotten this long after it was kept.
    output_store_ttl_seconds: int = 900
    #: MCP servers, in the format MCP clients use: ``{"time": {"command": ..., "args": [...]},
    #: "docs": {"url": ...}}``. Their tools join the catalog as ``mcp:<server>:<tool>``.
    mcp_servers: dict[str, Any] = msgspec.field(default_factory=dict)


def either_spelling(value: dict[Any, Any], struct: type[msgspec.Struct]) -> dict[Any, Any]:
    """``value`` with each of ``struct``'s fields under the name the struct decodes, whether it
    was given camelCase (``timeoutMs``) or snake_case (``timeout_ms``); a ``ConfigError`` names
    a field given both ways. Other keys are left for the struct to refuse."""
    names = _spellings(struct)
    out: dict[Any, Any] = {}
    given: dict[str, Any] = {}
    for key, item in value.items():
        name = names.get(key, key) if isinstance(key, str) else key
        if name in out:
            raise ConfigError(f"{given[name]!r} and {key!r} name the same setting: give it once")
        out[name] = item
        given[name] = key
    return out


@functools.cache
def _spellings(struct: type[msgspec.Struct]) -> dict[str, str]:
    """Each field's two spellings -> the name ``struct`` decodes. Once per struct: reading its
    fields resolves every annotation (~0.5 ms, on every ``CodeMode`` and pragma'd cell)."""
    names: dict[str, str] = {}
    for field in msgspec.structs.fields(struct):
        names[field.name] = names[_camel(field.name)] = field.encode_name
    return names


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _clamp(config: CodeModeConfig) -> CodeModeConfig:
    changes: dict[str, int] = {}
    for field, (low, high) in BOUNDS.items():
        value = getattr(config, field)
        clamped = min(max(value, low), high)
        if clamped != value:
            changes[field] = clamped
    limit = changes.get("max_search_limit", config.max_search_limit)
    if changes.get("search_default_limit", config.search_default_limit) > limit:
        changes["search_default_limit"] = limit
    if config.workers < 0:  # checked, not clamped: a negative count is a mistake, not a wish for 0
        raise ConfigError("workers must be >= 0")
    if not config.languages:
        raise ConfigError("languages must name at least one of 'javascript', 'typescript'")
    return msgspec.structs.replace(config, **changes) if changes else config


def load_config(value: CodeModeConfig | dict[str, Any] | bool | None = None) -> CodeModeConfig:
    """Accepts ``None``/``True`` (defaults), a camelCase dict, or a ``CodeModeConfig``."""
    if value is None or value is True:
        return CodeModeConfig(enabled=True)
    if value is False:
        return CodeModeConfig(enabled=False)
    if isinstance(value, CodeModeConfig):
        return _clamp(value)
    if not isinstance(value, dict):
        raise ConfigError(f"config must be a dict, a bool or a CodeModeConfig, not {type(value).__name__}")
    try:
        config = msgspec.convert(either_spelling(value, CodeModeConfig), CodeModeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid code mode config: {e}") from None
    return _clamp(config)
