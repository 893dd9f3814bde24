"""What an ``exec`` or a ``wait`` is given, checked before anything runs: the cell's arguments,
its first-line pragma, a `wait`'s answer, a seed, an imported journal.

Everything here comes from the model (or from bytes another process wrote) and is as hostile as
the cell itself; a check gives the message the caller's ``failed`` result (``invalid_input``)
carries, in the spec's words, and nothing reaches a worker until it passes::

    exec args ──check_cell──> CellArgs(code, language, restart_safe, options) | message
        (first line: ``// @options: {...}`` ──_cell_options──> CellOptions)
    wait answer ──answer_json──> JSON for yield_control | ValueError
    import_run bytes ──Journal.decode──> journal_problem ──> None | message
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, NamedTuple

import msgspec

from .config import CodeModeConfig, either_spelling
from .errors import ConfigError
from .protocol import utf8_len
from .runs import Journal, journal_size
from .tools import MAX_BRIDGE_BYTES

__all__ = ["MAX_SOURCE_CHARS", "CellArgs", "CellOptions", "answer_json", "check_cell", "check_seed", "journal_problem"]

#: The longest cell source accepted, in characters: a model writes cells of a few KB; a bigger
#: one is refused before it reaches a worker (and is one frame, under its cap, if it does).
MAX_SOURCE_CHARS = 1 << 20

_PRAGMA = re.compile(r"^\s*//\s*@(options|exec):(.*)$")


class CellOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The first-line pragma ``// @options: {...}`` (or ``// @exec: {...}``); each key may be
    written camelCase too (``timeoutMs``), as the config spells it (`either_spelling`)."""

    timeout_ms: int | None = None
    max_output_tokens: int | None = None


#: A cell's options when its first line has no pragma (most cells).
NO_OPTIONS = CellOptions()


def _cell_options(code: str) -> CellOptions | str:
    """The pragma of ``code``'s first line, or an error message; no pragma gives defaults."""
    end = code.find("\n")
    first = code if end < 0 else code[:end]  # (not the rest: a cell may be 1 MiB)
    if "@" not in first:
        return NO_OPTIONS  # (no pragma can be there: not worth the pattern's look)
    match = _PRAGMA.match(first)
    if match is None:
        return NO_OPTIONS
    try:
        given = msgspec.json.decode(match.group(2))
        if isinstance(given, dict):
            given = either_spelling(given, CellOptions)
        options = msgspec.convert(given, CellOptions)
    except (msgspec.DecodeError, ConfigError) as e:
        return f"invalid // @{match.group(1)} pragma: {e}"
    except RecursionError:
        return f"invalid // @{match.group(1)} pragma: nested too deeply"
    if options.timeout_ms is not None and not 0 < options.timeout_ms <= 2_147_483_647:
        return "// @options timeout_ms must be a positive integer"
    if options.max_output_tokens is not None and options.max_output_tokens < 0:
        return "// @options max_output_tokens must be a non-negative integer"
    return options


def journal_problem(journal: Journal, config: CodeModeConfig) -> str | None:
    """What is wrong with an imported journal, as this ``CodeMode`` would see the same run made
    here (its limits, its languages), or None."""
    if journal.language not in config.languages:
        return f"language {journal.language!r} is not enabled here"
    if len(journal.source) > MAX_SOURCE_CHARS:
        return f"its source is {len(journal.source)} characters; the limit is {MAX_SOURCE_CHARS}"
    if len(journal.run_json) > MAX_SOURCE_CHARS * 4:
        return "its run setup is too large"
    size = journal_size(journal)
    if size > config.max_journal_bytes:
        return f"it holds {size} bytes of results; maxJournalBytes is {config.max_journal_bytes}"
    if journal.approvals:
        return "it holds approvals, which no restartSafe run can wait for"
    made = {call.id for call in journal.calls}
    if len(made) != len(journal.calls) or not journal.settled_ids() <= made or not set(journal.open_inputs) <= made:
        return "its calls and results do not match"
    return None


def answer_json(answer: Any) -> str:
    """A `wait`'s ``answer`` as the JSON its run's ``yield_control`` calls resolve to (``null``,
    as when none is given, resolves to undefined), capped as a tool result is; a ValueError
    says why it cannot be one."""
    if answer is None:
        return "null"  # (most waits: none given)
    try:
        text = msgspec.json.encode(answer).decode()
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise ValueError(f"wait `answer` must be a JSON value: {type(e).__name__}: {e}"[:500]) from None
    size = utf8_len(text)
    if size > MAX_BRIDGE_BYTES:
        raise ValueError(
            f"wait `answer` is {size} bytes of JSON; the limit is {MAX_BRIDGE_BYTES}, as for a tool result"
        )
    return text


def check_seed(seed: int | None) -> None:
    """A run's seed is a journal field and the engine's u64: a caller's must fit both."""
    if seed is not None and not (isinstance(seed, int) and 0 <= seed < 1 << 63):
        raise ValueError(f"seed must be an int from 0 to 2**63 - 1, got {seed!r}")


def _lone_surrogate(code: str) -> str | None:
    """Why ``code`` (not ASCII) cannot reach a worker, if it holds a lone surrogate (a Python
    string may, UTF-8 may not: no frame could carry it); None otherwise."""
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as e:
        point = ord(code[e.start])
        return (
            f"exec `code` holds a lone surrogate (U+{point:04X} at character {e.start}), which UTF-8 "
            f"cannot carry; write it as an escape (\\u{point:04x}) in a string literal."
        )
    return None


class CellArgs(NamedTuple):
    """An ``exec``'s arguments once checked."""

    code: str
    language: str
    restart_safe: bool
    options: CellOptions


def check_cell(args: Any, languages: Collection[str]) -> CellArgs | str:
    """``args`` of an ``exec`` as `CellArgs`, or the message that refuses them (``languages``:
    those the config enables)."""
    if not isinstance(args, dict):
        return "exec input must be an object with a `code` string."
    code = args.get("code")
    command = args.get("command")
    if code is None:
        code = command
    elif command is not None and command != code:
        return "exec `code` and `command` must match when both are given."
    if not isinstance(code, str) or not code or code.isspace():  # (no stripped copy of the cell)
        return "exec requires a non-empty `code` string."
    if len(code) > MAX_SOURCE_CHARS:
        return f"exec `code` is {len(code)} characters; the limit is {MAX_SOURCE_CHARS}."
    if not code.isascii():
        surrogate = _lone_surrogate(code)
        if surrogate is not None:
            return surrogate
    # `null` is how a strict-mode provider leaves an optional field out (`surfaces.EXEC_SCHEMA`).
    language = args.get("language")
    if language is None:
        language = "javascript"
    if language not in ("javascript", "typescript"):
        return 'exec `language` must be "javascript" or "typescript".'
    if language not in languages:
        return f"code mode language {language} is disabled."
    restart_safe = args.get("restartSafe")
    if restart_safe is None:
        restart_safe = False
    if not isinstance(restart_safe, bool):
        return "exec `restartSafe` must be a boolean."
    options = _cell_options(code) if "@" in code else NO_OPTIONS  # (no pragma can be there)
    if isinstance(options, str):
        return options
    return CellArgs(code, language, restart_safe, options)
