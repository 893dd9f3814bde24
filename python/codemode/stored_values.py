"""What a run's ``load`` sees and where its ``store`` writes go: one ``CodeMode``'s store, with
the snapshot cache a private store allows.

A run reads a snapshot of its ``(session, branch)`` values when it starts (the worker serves
``load`` from it) and commits its writes only when the cell completes::

    new run ──snapshot(session, branch)──> run setup "store" ──> worker: load(key)
    completed step ──commit(key, writes)──> Store (SQLite / PostgreSQL) ──> cache refreshed

A private in-memory store (the default) has no other writer, so its snapshots are served from a
cache (a query per exec costs ~15 µs); a shared file or server is always asked.
"""

from __future__ import annotations

import os
from typing import Any

from .store import Store, open_store

__all__ = ["StoredValues"]


class StoredValues:
    """``store``: a `Store`, a path or DSN (`open_store`), or None for a private in-memory one."""

    def __init__(self, store: Store | str | os.PathLike[str] | None) -> None:
        #: Where `store`/`load` values live: SQLite (a path; in memory by default) or PostgreSQL (a DSN).
        self._store: Store = open_store(store) if store is None or isinstance(store, (str, os.PathLike)) else store
        self._cache: dict[tuple[str, str], dict[str, str]] | None = {} if store is None else None

    def snapshot(self, session_id: str, branch: str) -> dict[str, str]:
        cache = self._cache
        if cache is None:
            return self._store.snapshot(session_id, branch)
        return cache.get((session_id, branch), {})

    def commit(self, key: tuple[str, str], writes: Any) -> None:
        """Commits a completed cell's writes (``StoreLimitError`` if it stored too much,
        ``StoreError`` if the store failed)."""
        self._store.commit(*key, writes)
        if self._cache is not None:
            self._cache[key] = self._store.snapshot(*key)

    def close(self) -> None:
        self._store.close()
