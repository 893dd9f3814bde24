"""Full texts of cut outputs, kept for the session that made them, read back with ``readOutput``.

A cell's text budget (``// @options: {"max_output_tokens": N}``) cuts what the result shows to
a head and a tail. The cut part is not lost: the full text is kept here, in host memory only
(never on disk), under an unguessable handle that the cut note names, and the session's next
cells read it in pieces with ``await readOutput(handle, {offset, limit})``: a bridge call the
run's dispatcher answers at once from this store, journaled like any tool result (a replay
serves the recorded answer, never the store).

::

    _result (a cut) ──keep(session, text)──> OutputStore ──handle──> the cut note
    readOutput(h) ──bridge──> Dispatcher ──read_call(store, session, input)──> {text, end, more}

Bounded three ways: each session's texts fit ``outputStoreBytes`` (its least recently used goes
first), all sessions' fit ``outputStoreTotalBytes`` (the oldest kept anywhere goes first), and a
text expires ``outputStoreTtlSeconds`` after it was kept. Sizes are the host memory the texts
take (``sys.getsizeof``) plus ``ENTRY_OVERHEAD`` each.

A handle carries a MAC of its session id under a key that lives and dies with the store: a
handle this store issued to this session that is no longer here *expired or was evicted* (no
tombstones needed), and any other string, another session's handles included, is unknown, in
the same words: a guessed or leaked handle learns nothing.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

__all__ = [
    "DEFAULT_READ_CHARS",
    "ENTRY_OVERHEAD",
    "HANDLE_CHARS",
    "MAX_READ_CHARS",
    "OutputStore",
    "Read",
    "read_call",
]

#: Characters a ``readOutput`` without ``limit`` gives.
DEFAULT_READ_CHARS = 8192
#: The most one ``readOutput`` gives (a bigger ``limit`` gives this many): at most 6 bytes of
#: JSON a character, far under the bridge limit.
MAX_READ_CHARS = 1 << 20
#: What one kept text costs besides its own memory (its handle, its entries in the indexes).
ENTRY_OVERHEAD = 256
#: Handles are ``out_`` + 16 random base64url characters (96 bits) + a 12-character MAC.
_PREFIX = "out_"
_TOKEN_CHARS = 16
_MAC_BYTES = 9
HANDLE_CHARS = len(_PREFIX) + _TOKEN_CHARS + _MAC_BYTES * 4 // 3
#: The JSON of readOutput's arguments: a handle and two numbers need far less.
_MAX_INPUT_CHARS = 1024
_encode = msgspec.json.encode


class _Kept(NamedTuple):
    session_id: str
    text: str
    size: int
    expires: float


class Read(msgspec.Struct, frozen=True):
    """What ``readOutput`` gives: ``text`` is ``[offset, end)`` of the ``total`` characters
    (Unicode code points); ``end`` is the next offset, ``more`` says whether there is one."""

    handle: str
    text: str
    offset: int
    end: int
    total: int
    more: bool


class OutputStore:
    """Full texts per session id, bounded (see the module docstring); thread-safe."""

    def __init__(
        self,
        session_bytes: int,
        total_bytes: int,
        ttl_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_bytes = session_bytes
        self.total_bytes = total_bytes
        self._ttl = ttl_seconds
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        #: Every kept text, oldest first (expiry and the total bound take from the front).
        self._kept: collections.OrderedDict[str, _Kept] = collections.OrderedDict()
        #: Each session's handles, least recently used first.
        self._sessions: dict[str, collections.OrderedDict[str, None]] = {}
        self._used: dict[str, int] = {}
        self._total = 0

    def keep(self, session_id: str, text: str) -> str | None:
        """Keeps ``text`` for ``session_id``; its handle, or None if nothing is kept (keeping is
        off, or the text alone is over the session's budget)."""
        size = sys.getsizeof(text) + ENTRY_OVERHEAD
        if size > min(self.session_bytes, self.total_bytes):
            return None
        handle = self._handle(session_id)
        with self._lock:
            now = self._clock()
            self._expire(now)
            while self._used.get(session_id, 0) + size > self.session_bytes:
                self._forget(next(iter(self._sessions[session_id])))
            while self._total + size > self.total_bytes:
                self._forget(next(iter(self._kept)))
            self._kept[handle] = _Kept(session_id, text, size, now + self._ttl)
            self._sessions.setdefault(session_id, collections.OrderedDict())[handle] = None
            self._used[session_id] = self._used.get(session_id, 0) + size
            self._total += size
        return handle

    def read(self, session_id: str, handle: str, offset: int, limit: int) -> Read | str:
        """``limit`` characters of a kept text from ``offset``, or why not (as the guest reads it)."""
        if not self._issued(session_id, handle):
            return f"unknown output handle {_shown(handle)}: readOutput takes a handle a cut note of this session names"
        with self._lock:
            self._expire(self._clock())
            kept = self._kept.get(handle)
            if kept is None:
                return (
                    f"output {handle} expired or was evicted (outputs are kept for a while, within a "
                    "per-session budget): run the cell again to see it"
                )
            self._sessions[kept.session_id].move_to_end(handle)
        total = len(kept.text)
        if offset > total:
            return f"readOutput offset {offset} is past the end of output {handle} ({total} characters)"
        end = min(total, offset + limit)
        return Read(handle, kept.text[offset:end], offset, end, total, end < total)

    def drop(self, session_id: str) -> None:
        """Forgets every text of ``session_id`` (its session closed)."""
        with self._lock:
            for handle in list(self._sessions.get(session_id, ())):
                self._forget(handle)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._sessions.clear()
            self._used.clear()
            self._total = 0

    def used(self, session_id: str | None = None) -> int:
        """Bytes kept for ``session_id``, or for every session."""
        with self._lock:
            return self._total if session_id is None else self._used.get(session_id, 0)

    def _expire(self, now: float) -> None:
        while self._kept:
            handle, kept = next(iter(self._kept.items()))
            if kept.expires > now:
                return
            self._forget(handle)

    def _forget(self, handle: str) -> None:
        kept = self._kept.pop(handle)
        handles = self._sessions[kept.session_id]
        del handles[handle]
        self._total -= kept.size
        self._used[kept.session_id] -= kept.size
        if not handles:
            del self._sessions[kept.session_id]
            del self._used[kept.session_id]

    def _mac(self, session_id: str, token: str) -> str:
        message = session_id.encode("utf-8", "surrogatepass") + b"\x00" + token.encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]
        return base64.urlsafe_b64encode(digest).decode()

    def _handle(self, session_id: str) -> str:
        token = secrets.token_urlsafe(_TOKEN_CHARS * 3 // 4)
        return _PREFIX + token + self._mac(session_id, token)

    def _issued(self, session_id: str, handle: str) -> bool:
        """Whether this store made ``handle`` for ``session_id`` (kept now or not)."""
        if len(handle) != HANDLE_CHARS or not handle.startswith(_PREFIX) or not handle.isascii():
            return False
        split = len(_PREFIX) + _TOKEN_CHARS
        return hmac.compare_digest(self._mac(session_id, handle[len(_PREFIX) : split]), handle[split:])


def _shown(handle: str) -> str:
    """A guest's handle as an error message may quote it: short, one line."""
    text = handle if len(handle) <= 40 else handle[:40] + "…"
    return msgspec.json.encode(text).decode()


def _integer(request: dict[str, Any], name: str, default: int, low: int) -> int:
    """``request[name]``, an integer >= ``low`` (``default`` when absent); raises ``_Refused``."""
    value = request.get(name)
    if value is None:
        return default
    if type(value) is not int or value < low:
        raise _Refused(f"readOutput {name} must be an integer >= {low}")
    return value


class _Refused(Exception):
    """A readOutput call that fails with this message."""


def read_call(store: OutputStore | None, session_id: str, input_json: str) -> tuple[bool, str]:
    """``readOutput(handle, {offset, limit})`` for ``session_id``: ``(True, JSON of a Read)`` or
    ``(False, why not)``. ``input_json`` is the guest's (hostile); nothing here raises on it."""
    if len(input_json) > _MAX_INPUT_CHARS:
        return False, f"readOutput arguments are too large: a handle is {HANDLE_CHARS} characters"
    try:
        request = msgspec.json.decode(input_json)
        if not isinstance(request, dict) or not isinstance(request.get("handle"), str):
            raise _Refused('readOutput(handle, {offset, limit}) takes the handle string a cut note names ("out_…")')
        offset = _integer(request, "offset", 0, 0)
        limit = min(_integer(request, "limit", DEFAULT_READ_CHARS, 1), MAX_READ_CHARS)
    except (msgspec.DecodeError, RecursionError):
        return False, "readOutput arguments are not JSON"
    except _Refused as e:
        return False, str(e)
    if store is None:
        return False, f"unknown output handle {_shown(request['handle'])}: this host keeps no outputs"
    read = store.read(session_id, request["handle"], offset, limit)
    return (False, read) if isinstance(read, str) else (True, _encode(read).decode())
