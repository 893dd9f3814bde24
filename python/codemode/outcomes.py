"""What an ``exec`` or ``wait`` returns: the result structs, their outputs, and the cuts a text
budget makes.

A run's step (`runs.Step`: the engine's value, failure, raw ``(kind, text)`` outputs) becomes
one of three structs, which ``to_dict()`` turns into the spec's JSON (typed by
`codemode.results`)::

    Step.outputs ──outputs_of──> [TextOutput | JsonOutput | ImageOutput]
        ──cut_to_budget (// @options max_output_tokens)──> head + cut note + tail
    Step.failure ──failure_text (what maxOutputBytes leaves the error)──> Failed.error
    Completed | Waiting | Failed ──to_dict / as_json──> ExecResult

A cut keeps the full text for the run's session (`codemode.outputs`), and its note says how the
next cell reads it back. Which struct a step becomes, and what the run table does with the run,
is the runner's (`codemode.runner`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import msgspec

from .models import ModelUsage
from .outputs import DEFAULT_READ_CHARS
from .protocol import bounded_bytes, utf8_len
from .results import ExecResult
from .runs import Failure

__all__ = [
    "Completed",
    "Failed",
    "ImageOutput",
    "JsonOutput",
    "Output",
    "Result",
    "Telemetry",
    "TextOutput",
    "Waiting",
    "as_json",
    "cut_to_budget",
    "failure_text",
    "outputs_of",
]

#: What a failed run's error keeps when its outputs used up maxOutputBytes: enough to say why.
MIN_ERROR_BYTES = 256


class TextOutput(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class JsonOutput(msgspec.Struct, tag="json", tag_field="type"):
    value: Any


class ImageOutput(msgspec.Struct, tag="image", tag_field="type", rename="camel"):
    mime_type: str
    data: str


Output = TextOutput | JsonOutput | ImageOutput


class Telemetry(msgspec.Struct, rename="camel", omit_defaults=True):
    duration_ms: float
    tool_calls: int
    searches: int
    describes: int
    memory_bytes: int
    catalog_size: int
    catalog_sources: dict[str, int]
    model_visible_tools: list[str]
    #: What the run's ``models.*`` operations used so far (absent when it made none).
    model_usage: ModelUsage | None = None


class Completed(msgspec.Struct, tag="completed", tag_field="status", omit_defaults=True):
    value: Any
    telemetry: Telemetry
    output: list[Output] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        if not isinstance(value, (dict, list)):
            return msgspec.to_builtins(self)  # type: ignore[no-any-return]
        # The guest's JSON, decoded to plain dicts and lists already: handed over as it is, not
        # walked and copied once more (a value of 1,000 records: ~130 µs; 10,000: ~1.4 ms).
        shown: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(self, value=None))
        shown["value"] = value
        return shown


class Failed(msgspec.Struct, tag="failed", tag_field="status", omit_defaults=True):
    error: str
    telemetry: Telemetry
    code: str | None = None
    output: list[Output] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class Waiting(msgspec.Struct, tag="waiting", tag_field="status", omit_defaults=True, rename="camel"):
    run_id: str
    reason: str
    telemetry: Telemetry
    pending_tool_calls: list[dict[str, Any]] = msgspec.field(default_factory=list)
    output: list[Output] = msgspec.field(default_factory=list)
    #: A ``restartSafe`` run (read-only tools only): safe to replay after a restart.
    replay_safe: bool = False

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


Result = Completed | Failed | Waiting


def as_json(result: Result) -> ExecResult:
    """``result`` as the JSON ``exec``/``wait`` return, typed as its shape (`codemode.results`)."""
    return cast("ExecResult", result.to_dict())


def outputs_of(raw: list[tuple[int, Any]]) -> list[Output]:
    """The spec's outputs from a run's ``(kind, text)`` list (kind 1 already decoded)."""
    out: list[Output] = []
    for kind, text in raw:
        if kind == 1:
            out.append(JsonOutput(text))
        elif kind == 6:
            mime, _, data = text.partition(";")
            out.append(ImageOutput(mime, data))
        else:
            out.append(TextOutput(text))  # console lines carry their prefix from the engine
    return out


#: Keeps a cut's full text for the run's session; gives its handle, or None if it is not kept.
Keep = Callable[[str], str | None]
#: A value with no more JSON than this is never cut (a cut note is longer) and leaves the text
#: outputs the whole budget.
SMALL_VALUE_CHARS = 256
#: What a cut note calls a cut value.
_VALUE_CUT = "the value's JSON"


def cut_to_budget(outputs: list[Output], value: Any, budget: int, keep: Keep) -> tuple[list[Output], Any]:
    """``outputs`` and ``value`` within a text budget of ``budget`` characters (``// @options:
    {"max_output_tokens": N}``, ~4 characters a token). A value whose JSON is over
    ``SMALL_VALUE_CHARS`` keeps what the text outputs leave, and at least half the budget; the
    text outputs keep the rest. What is cut is kept in full (`_cut_note`)."""
    value_json = msgspec.json.encode(value).decode()
    if len(value_json) <= SMALL_VALUE_CHARS:
        return _truncate(outputs, budget, keep), value
    text_chars = sum(len(o.text) for o in outputs if isinstance(o, TextOutput))
    value_share = min(len(value_json), max(budget - text_chars, budget // 2))
    outputs = _truncate(outputs, budget - value_share, keep)
    if len(value_json) > value_share:
        note = _cut_note(len(value_json) - value_share, _VALUE_CUT, value_json, keep)
        head = value_share // 2
        value = value_json[:head] + note + value_json[len(value_json) - (value_share - head) :]
    return outputs, value


def _truncate(outputs: list[Output], budget: int, keep: Keep) -> list[Output]:
    """Keeps the head and the tail of the text outputs within ``budget`` characters and says
    what was cut in between, naming where their full text is kept."""
    texts = [o.text for o in outputs if isinstance(o, TextOutput)]
    total = sum(len(text) for text in texts)
    if total <= budget:
        return outputs
    head_left, tail_left = budget // 2, budget - budget // 2
    kept_head: list[Output] = []
    kept_tail: list[Output] = []
    for output in outputs:
        if not isinstance(output, TextOutput):
            kept_head.append(output)
        elif head_left > 0:
            kept_head.append(TextOutput(output.text[:head_left]))
            head_left -= len(kept_head[-1].text)  # type: ignore[union-attr]
    for output in reversed(outputs):
        if isinstance(output, TextOutput) and tail_left > 0:
            piece = output.text[-tail_left:]
            kept_tail.insert(0, TextOutput(piece))
            tail_left -= len(piece)
    note = TextOutput(_cut_note(total - budget, "output", "\n".join(texts), keep))
    return [*kept_head, note, *kept_tail]


def _cut_note(cut: int, what: str, full: str, keep: Keep) -> str:
    """What a cut says: how much it left out, and how to read ``full`` (the text outputs joined
    by newlines, or the value's JSON) back, unless it could not be kept."""
    handle = keep(full)
    if handle is None:
        return f"[… {cut} characters of {what} cut by max_output_tokens …]"
    read = f'await readOutput("{handle}", {{offset: 0, limit: {DEFAULT_READ_CHARS}}})'
    name = "JSON" if what == _VALUE_CUT else "text"
    return f"[… {cut} characters of {what} cut by max_output_tokens; full {name} ({len(full)} characters): {read} …]"


def failure_text(failure: Failure | None, output: list[Output], budget: int) -> tuple[str, str | None]:
    """A failed step's error text and code. One budget: the error gets what the outputs left of
    maxOutputBytes ``budget`` (at least a line), counted as JSON like the outputs (the quotes and
    escapes of the text count too). A cell's own exception (no code) reads ``Name: message``."""
    code_, name, message, _stack = failure or ("internal_error", "Error", "unknown failure", "")
    error = message if code_ is not None else (f"{name}: {message}" if message else name)
    left = budget - len(msgspec.json.encode(output)) if output else budget
    escapes = len(msgspec.json.encode(error)) - utf8_len(error)
    return bounded_bytes(error, max(left - escapes, min(budget, MIN_ERROR_BYTES))), code_
