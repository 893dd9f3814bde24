"""What a run's calls answer: their results, how big they may be, and the calls still in flight.

Every result a run's worker is sent passes `CallResults.add` (a tool's, an answer planned at
once, ``yield_control``'s): one over the bridge limit becomes its call's error there, and an
error message is bounded, so no result can overflow a settle frame. Whoever finishes a call
(the thread of a sync tool, the loop of an async one) adds its result and tells the listener::

    CallRunner ──deliver(call_id, result)──> CallResults ──listener()──> the supervisor
         │  (track: what cancels an async call,          │ take(max_bytes) ──> settle frame
         │   and the loop it runs on)                    │ wait(deadline)  ──> host-side calls

A call the host cancelled (`CallResults.cancel`) is forgotten first, so a result it still
delivers is dropped, never handed over.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from . import _engine, catalog
from .protocol import CallResult, utf8_len

__all__ = [
    "MAX_BRIDGE_BYTES",
    "MAX_ERROR_CHARS",
    "CallResults",
    "bounded_error",
    "encode_result",
    "error_message",
    "exception_text",
    "result_bytes",
]

#: Bytes of one tool result's JSON: the engine's ``max_bridge_bytes`` (its default, which every
#: worker uses). A bigger result fails its call here, before it is put in a settle frame.
MAX_BRIDGE_BYTES = _engine.MAX_BRIDGE_BYTES
#: The engine's words for a result over the bridge limit (one limit, one message).
_OVER_BRIDGE = f"tool result is larger than the bridge limit ({MAX_BRIDGE_BYTES} bytes)"
#: Characters of one failed call's message (a tool may raise with a 70 MB message).
MAX_ERROR_CHARS = 4096
#: The C slot behind ``cls.__name__``: a metaclass cannot make reading it run code.
TYPE_NAME = type.__dict__["__name__"]
#: A tool's result: what msgspec encodes, and pydantic models (`catalog.json_default`).
_encode_value = msgspec.json.Encoder(enc_hook=catalog.json_default).encode


class Refused(Exception):
    """A call stopped before its tool ran (blocked, not approved): the message is for the guest."""


def error_message(label: str, exc: BaseException) -> str:
    """A failed call's message from ``exc``: bounded, whatever its ``__str__`` does (raise,
    return something odd or 70 MB)."""
    text = exception_text(exc)
    if isinstance(exc, Refused):
        return bounded_error(f"tool {label}: {text}")
    kind = TYPE_NAME.__get__(type(exc))
    return bounded_error(f"tool {label} failed: {kind}: {text}" if text else f"tool {label} failed: {kind}")


def exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # (its own __str__ raised, or returned a non-str)
        return "(its message could not be read)"
    # The base slice gives an exact str of bounded size, whatever a str subclass overrides.
    return str.__getitem__(text, slice(None, MAX_ERROR_CHARS + 1))


def bounded_error(message: str) -> str:
    """``message`` cut to ``MAX_ERROR_CHARS``, its lone surrogates replaced (a frame must encode)."""
    message = catalog.bounded_text(message, MAX_ERROR_CHARS)
    return message if message.isascii() else message.encode("utf-8", "replace").decode("utf-8")


def encode_result(label: str, value: Any) -> bytes | str:
    """A result's JSON, encoded once; or the message of the call's failure if it cannot cross."""
    try:
        payload = _encode_value(value)
    except RecursionError:
        return f"{label} returned a value that is nested too deeply for JSON"
    except (TypeError, ValueError, msgspec.EncodeError) as e:
        return f"{label} returned a value that is not JSON: {exception_text(e)}"
    return _OVER_BRIDGE if len(payload) > MAX_BRIDGE_BYTES else payload


def result_bytes(result: CallResult) -> int:
    """The UTF-8 size of a result's payload: what it adds to a settle frame (plus a few bytes
    of msgpack framing per result)."""
    return utf8_len(result.payload)


def _admitted(result: CallResult) -> tuple[CallResult, int]:
    """``result`` as it may cross to a worker, with its size: a payload over the bridge limit
    becomes that call's error, an error message is bounded."""
    call_id, ok, payload = result
    if ok:
        size = result_bytes(result)
        if size <= MAX_BRIDGE_BYTES:
            return result, size
        payload = _OVER_BRIDGE
    failed = CallResult(call_id, False, bounded_error(payload))
    return failed, result_bytes(failed)


class CallResults(msgspec.Struct, eq=False):
    """One run's finished calls, ready to hand over, and its async calls in flight. (A struct:
    built in C, for every run.)"""

    #: Results ready to hand over, each with its payload's size (`result_bytes`).
    _ready: list[tuple[CallResult, int]] = msgspec.field(default_factory=list)
    _lock: threading.Lock = msgspec.field(default_factory=threading.Lock)
    #: Set when results land, while `wait` waits (host-side calls only).
    _landed: threading.Event | None = None
    #: In-flight async calls: what cancels them (None until they are started).
    _futures: dict[int, Callable[[], object] | None] = msgspec.field(default_factory=dict)
    #: The loop each in-flight async call runs on.
    _loops: dict[int, asyncio.AbstractEventLoop] = msgspec.field(default_factory=dict)
    #: Told (with no arguments, outside the lock) after results land.
    listener: Callable[[], object] | None = None
    #: Given every result that lands (before the listener), while the run is suspended in a
    #: shared run store: its calls' results are written there for whichever host resumes it.
    sink: Callable[[list[CallResult]], object] | None = None

    def add(self, results: list[CallResult]) -> None:
        """Results to hand to the run; tells the listener. Every result passes here (see
        `_admitted`)."""
        if not results:
            return
        admitted = [_admitted(result) for result in results]
        with self._lock:
            self._ready.extend(admitted)
            landed, listener, sink = self._landed, self.listener, self.sink
        if sink is not None:
            sink([result for result, _ in admitted])
        if landed is not None:
            landed.set()
        if listener is not None:
            listener()

    def tell(self) -> None:
        """Tells the listener with no result landed (a call was filed for approval: the run
        may have nothing left but approvals)."""
        listener = self.listener
        if listener is not None:
            listener()

    def requeue(self, results: list[CallResult]) -> None:
        """Puts back results taken with ``take`` that were never delivered (first, in their
        order; the listener is not told: whoever put them back goes on with them)."""
        sized = [(result, result_bytes(result)) for result in results]
        with self._lock:
            self._ready[:0] = sized

    def ready_bytes(self) -> int:
        """The UTF-8 size of the payloads of the results ready to hand over (see `result_bytes`)."""
        with self._lock:
            return sum(size for _, size in self._ready)

    def has_ready(self) -> bool:
        return bool(self._ready)  # (one read of a list's length: no lock needed)

    def peek(self) -> list[CallResult]:
        """The ready results, left ready."""
        with self._lock:
            return [result for result, _ in self._ready]

    def take(self, max_bytes: int | None = None) -> list[CallResult]:
        """The ready results, in order; with ``max_bytes``, only the first ones whose payloads
        total at most that (and at least one): the rest stay ready for the next frame."""
        with self._lock:
            if max_bytes is None or len(self._ready) == 1:  # (one result is always taken)
                taken, self._ready = self._ready, []
            else:
                count, total = 0, 0
                for _, size in self._ready:
                    total += size
                    if count and total > max_bytes:
                        break
                    count += 1
                taken, self._ready = self._ready[:count], self._ready[count:]
        return [result for result, _ in taken]

    def wait(self, deadline: float) -> list[CallResult]:
        """The results ready now or, if none, the first to finish before ``deadline``
        (``time.monotonic``); empty if nothing is running or the deadline passes."""
        landed = self._landed = threading.Event()
        while True:
            with self._lock:
                if self._ready or not self._futures:
                    ready, self._ready = self._ready, []
                    return [result for result, _ in ready]
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return []
            landed.wait(timeout)
            landed.clear()

    def track(self, call_id: int, loop: asyncio.AbstractEventLoop, cancel: Callable[[], object] | None) -> None:
        """An async call now in flight on ``loop``; ``cancel`` stops it (None: not yet known)."""
        with self._lock:
            self._futures[call_id] = cancel
            self._loops[call_id] = loop

    def set_cancel(self, call_id: int, cancel: Callable[[], object]) -> bool:
        """What cancels a call `track`ed with none; False if it was cancelled or delivered meanwhile."""
        with self._lock:
            if call_id in self._futures:
                self._futures[call_id] = cancel
                return True
        return False

    def forget(self, call_id: int) -> None:
        """A call no longer in flight with no result (its loop is gone, or it was filed)."""
        with self._lock:
            self._futures.pop(call_id, None)
            self._loops.pop(call_id, None)

    def in_flight(self, call_id: int) -> bool:
        """Whether the call is still tracked (False: the host cancelled it)."""
        with self._lock:
            return call_id in self._futures

    def deliver(self, call_id: int, result: CallResult) -> None:
        """An async call's result, added unless the call was cancelled."""
        with self._lock:
            if call_id not in self._futures:
                return  # cancelled
            del self._futures[call_id]
            self._loops.pop(call_id, None)
        self.add([result])

    def pending(self) -> int:
        with self._lock:
            return len(self._futures)

    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The one event loop every in-flight call runs on (with none ready); else None."""
        with self._lock:
            if self._ready:
                return None
            loops = set(self._loops.values())
        return loops.pop() if len(loops) == 1 else None

    def cancel(self) -> None:
        # Most runs have nothing in flight and no one waiting. (A call started as this reads
        # is no more missed than one started just after the lock below.)
        if not self._futures and self._landed is None:
            return
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
            self._loops.clear()
            landed = self._landed
        if landed is not None:
            landed.set()
        for cancel in futures:
            if cancel is not None:
                try:
                    cancel()
                except RuntimeError:
                    pass  # its loop is closed: the call is gone with it
