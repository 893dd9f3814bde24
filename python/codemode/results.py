"""The JSON results of ``exec`` and ``wait``, as ``TypedDict``s: what a user's type checker sees.

``Session.exec``/``wait`` (and their ``_async`` twins) return plain dicts, the JSON a model or a
host reads; the typed structs in ``session.py`` (``Completed``, ``Waiting``, ``Failed``) build
them with ``to_dict()``. These are the shapes of those dicts, one per status, so a checker
narrows on ``result["status"]``::

    result = session.exec({"code": "return 1"})
    if result["status"] == "completed":
        print(result["value"])
    elif result["status"] == "waiting":
        result = session.wait({"runId": result["runId"]})

``tests/test_results_typing.py`` pins them to what the structs encode. (Required keys in a base
class, optional ones in a ``total=False`` subclass: ``NotRequired`` is Python 3.11.)
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "CompletedResult",
    "ErrorCode",
    "ExecResult",
    "FailedResult",
    "ImageOutputItem",
    "JsonOutputItem",
    "ModelUsageTelemetry",
    "OutputItem",
    "PendingToolCall",
    "ResultTelemetry",
    "TextOutputItem",
    "WaitingResult",
]

#: A failed result's ``code``; absent when the cell threw its own exception.
ErrorCode = Literal[
    "invalid_input",
    "runtime_unavailable",
    "timeout",
    "output_limit_exceeded",
    "snapshot_limit_exceeded",
    "memory_limit_exceeded",
    "internal_error",
]


class ModelUsageTelemetry(TypedDict, total=False):
    """What a cell's ``models.classify``/``generateImages`` calls used (as providers report it)."""

    inputTokens: int
    outputTokens: int
    images: int
    operations: int


class _ResultTelemetry(TypedDict):
    durationMs: float
    toolCalls: int
    searches: int
    describes: int
    memoryBytes: int
    catalogSize: int
    #: Catalog tools per source: ``host``, ``mcp``, ``client``.
    catalogSources: dict[str, int]
    modelVisibleTools: list[str]


class ResultTelemetry(_ResultTelemetry, total=False):
    #: Present once the run made a ``models.*`` operation.
    modelUsage: ModelUsageTelemetry


class TextOutputItem(TypedDict):
    type: Literal["text"]
    text: str


class JsonOutputItem(TypedDict):
    type: Literal["json"]
    value: Any


class ImageOutputItem(TypedDict):
    type: Literal["image"]
    mimeType: str
    #: Base64, without the ``data:`` prefix.
    data: str


OutputItem = TextOutputItem | JsonOutputItem | ImageOutputItem


class _PendingToolCall(TypedDict):
    #: ``call_<n>``: what ``approve`` takes.
    id: str
    toolId: str
    #: The guest API that started it: ``callValue``, ``call``, ``namespace``, ``mcp``, ``readOutput``,
    #: ``models``, ``agents.run``.
    method: str


class PendingToolCall(_PendingToolCall, total=False):
    #: For a call that waits for the host's yes: ``pending``, or the decision the next ``wait`` acts on.
    approval: Literal["pending", "approved", "rejected"]
    #: The input the approval shows (``Defer(input=...)`` may show less).
    input: Any


class _Completed(TypedDict):
    status: Literal["completed"]
    value: Any
    telemetry: ResultTelemetry


class CompletedResult(_Completed, total=False):
    output: list[OutputItem]


class _Waiting(TypedDict):
    status: Literal["waiting"]
    runId: str
    #: ``pending_tools``, or ``yield`` (answer it with ``wait({"runId": ..., "answer": ...})``).
    reason: Literal["pending_tools", "yield"]
    telemetry: ResultTelemetry


class WaitingResult(_Waiting, total=False):
    pendingToolCalls: list[PendingToolCall]
    output: list[OutputItem]
    #: A ``restartSafe`` run: it may be replayed after a restart.
    replaySafe: bool


class _Failed(TypedDict):
    status: Literal["failed"]
    error: str
    telemetry: ResultTelemetry


class FailedResult(_Failed, total=False):
    code: ErrorCode
    output: list[OutputItem]


#: What ``exec`` and ``wait`` return.
ExecResult = CompletedResult | WaitingResult | FailedResult
