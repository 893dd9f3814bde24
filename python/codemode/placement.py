"""Where worker processes run: on this machine (the default) or elsewhere, behind one interface.

    Fleet.spawn ──placement.start(memory)──> Worker (`workers.Worker`): frames in and out,
                                             liveness, kill
        LocalPlacement  a `workers.WorkerProcess`: a subprocess of this host
        RayPlacement    a Ray actor that runs the worker binary (`codemode.ray_placement`)

Everything above the interface is the same wherever a worker runs: the supervisor's deadlines
and kills, its recovery by journal replay, the tools (which always run in the host).
"""

from __future__ import annotations

from typing import Any, Protocol

from . import workers
from .errors import ConfigError
from .workers import Worker

__all__ = ["LocalPlacement", "Placement", "placement_of"]


class Placement(Protocol):
    """Starts workers. ``start`` must not block (it is called under the supervisor's lock): a
    worker that takes time to come up says so with its ``Ready`` frame, within
    ``spawn_timeout_s``."""

    #: How long a new worker may take to send its ``Ready`` frame before it is killed.
    spawn_timeout_s: float

    def start(self, memory_bytes: int) -> Worker: ...

    def close(self) -> None: ...


class LocalPlacement:
    """Worker subprocesses of this host (`workers.WorkerProcess`)."""

    spawn_timeout_s = 10.0

    def start(self, memory_bytes: int) -> Worker:
        return workers.WorkerProcess(memory_bytes)  # (looked up here: tests replace it)

    def close(self) -> None:
        pass


def placement_of(value: Any) -> Placement:
    """The placement a ``CodeMode(placement=...)`` names: None or ``"local"``, ``"ray"`` (a local
    Ray cluster, or the one ``ray.init`` finds: ``RAY_ADDRESS``), or a placement object."""
    if value is None or value == "local":
        return LocalPlacement()
    if value == "ray":
        from .ray_placement import RayPlacement

        return RayPlacement()
    if all(callable(getattr(value, name, None)) for name in ("start", "close")) and hasattr(value, "spawn_timeout_s"):
        return value  # type: ignore[no-any-return]
    raise ConfigError(f'placement must be "local", "ray" or a placement object, not {value!r:.80}')
