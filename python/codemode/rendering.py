"""What the model reads of a tool result: one compact rendering for every host path.

``session.exec`` returns the spec's result, telemetry and all, for the host to log. The model
needs far less: for ``{"code": "return 40 + 2"}`` the spec's result is ~350 bytes of indented
JSON, of which ``{"status":"completed","value":42}`` is the answer. `render` keeps what the model
acts on, once, for ``codemode serve`` and every framework adapter (``codemode.integrations``):

    completed  status, value, output?
    waiting    status, runId, reason, pendingToolCalls?, output?   (the model calls `wait`)
    failed     status, error, code?, output?                       (is_error: the tool failed)

Telemetry is left out unless asked for. Image outputs leave the JSON (which keeps their place
and type, not their base64) for `Rendered.images`, which each adapter hands its framework as an
image. Results of the other surfaces (``tool_search``, ``tool_call``, a direct tool) are plain
dicts: rendered as compact JSON, an error when they carry ``error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

from .session import Completed, Failed, Waiting

__all__ = ["Image", "Rendered", "render"]

#: The fields of a result the model reads, by status, in the order it reads them.
_FIELDS = {
    "completed": ("status", "value", "output"),
    "waiting": ("status", "runId", "reason", "pendingToolCalls", "output"),
    "failed": ("status", "error", "code", "output"),
}


class Image(NamedTuple):
    """One ``image(dataUrl)`` output of a cell."""

    mime_type: str
    #: Base64, as the cell gave it.
    data: str

    @property
    def data_url(self) -> str:
        """``data:<mime>;base64,<data>``, for frameworks that take images as URLs."""
        return f"data:{self.mime_type};base64,{self.data}"


class Rendered(NamedTuple):
    """A tool result as the model sees it."""

    #: Compact JSON.
    text: str
    #: The cell's image outputs, in order (their data is not in ``text``).
    images: list[Image]
    #: The call failed: a ``failed`` cell, or another surface's ``{"error": ...}``.
    is_error: bool


def render(result: Mapping[str, Any] | Completed | Failed | Waiting, *, telemetry: bool = False) -> Rendered:
    """``result`` (what ``Session.handle`` or ``exec`` returns, or a typed result) for the model;
    ``telemetry=True`` keeps the result's telemetry."""
    if isinstance(result, Completed | Failed | Waiting):
        result = result.to_dict()
    fields = _FIELDS.get(result.get("status"))  # type: ignore[arg-type]
    if fields is None:
        return Rendered(msgspec.json.encode(result).decode(), [], "error" in result)
    shown: dict[str, Any] = {}
    images: list[Image] = []
    for name in (*fields, "telemetry") if telemetry else fields:
        if name not in result or (name != "value" and result[name] in (None, [])):
            continue
        shown[name] = _outputs(result[name], images) if name == "output" else result[name]
    return Rendered(msgspec.json.encode(shown).decode(), images, result["status"] == "failed")


def _outputs(outputs: list[dict[str, Any]], images: list[Image]) -> list[dict[str, Any]]:
    """The outputs with each image's data moved to ``images``."""
    shown = []
    for output in outputs:
        if output.get("type") == "image":
            images.append(Image(output["mimeType"], output["data"]))
            output = {"type": "image", "mimeType": output["mimeType"]}
        shown.append(output)
    return shown
