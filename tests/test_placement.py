"""Where workers run (`codemode.placement`): the names ``CodeMode(placement=...)`` takes, and a
placement of the host's own behind the same interface (Ray's has its own module)."""

from __future__ import annotations

import pytest
from codemode import CodeMode, Placement
from codemode.errors import ConfigError
from codemode.placement import LocalPlacement, placement_of
from codemode.workers import Worker


def test_placement_names_are_checked() -> None:
    assert isinstance(placement_of(None), LocalPlacement)
    assert isinstance(placement_of("local"), LocalPlacement)
    with pytest.raises(ConfigError, match='placement must be "local", "ray" or a placement object'):
        placement_of("kubernetes")
    with pytest.raises(ConfigError, match="placement must be"):
        placement_of(object())


class Counting:
    """A host's own placement: local workers, counted, and told when the supervisor is done."""

    spawn_timeout_s = 10.0

    def __init__(self) -> None:
        self.started: list[int] = []
        self.closed = False

    def start(self, memory_bytes: int) -> Worker:
        self.started.append(memory_bytes)
        return LocalPlacement().start(memory_bytes)

    def close(self) -> None:
        self.closed = True


def test_a_placement_object_starts_every_worker_and_is_closed_with_the_codemode() -> None:
    placement = Counting()
    assert isinstance(placement_of(placement), Counting)
    typed: Placement = placement
    with CodeMode({"workers": 2}, placement=typed) as cm:
        assert cm.session("s").exec({"code": "return 6 * 7"})["value"] == 42
        assert len(placement.started) == 2  # the pool's workers, each through it
        assert cm.inspect().workers_spawned == 2
    assert placement.closed
