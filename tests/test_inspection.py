"""``CodeMode.inspect()``: a frozen snapshot of the worker pool and the suspended runs, which the
tests read instead of the supervisor's private fields."""

from __future__ import annotations

import os
import signal

import pytest
from codemode.inspection import RunState


def test_a_fresh_codemode_shows_its_live_workers_and_no_runs(make_codemode):
    cm = make_codemode({"workers": 2})
    assert cm.session().exec({"code": "return 1"})["value"] == 1
    seen = cm.inspect()
    assert len(seen.worker_pids) == 2
    for pid in seen.worker_pids:
        os.kill(pid, 0)  # a live process (ProcessLookupError otherwise)
    assert seen.workers_spawned >= 2
    assert (seen.workers_killed, seen.suspended_runs) == (0, ())


def test_a_suspended_run_is_shown_with_its_session_until_its_wait_ends_it(make_codemode):
    cm = make_codemode({"workers": 1})
    s = cm.session("chat", agent_run="agent-1")
    asked = s.exec({"code": "return await yield_control('why')"})
    assert asked["status"] == "waiting"
    assert cm.inspect().run(asked["runId"]) == RunState(asked["runId"], "chat", "agent-1", "parked")
    assert s.wait({"runId": asked["runId"], "answer": 7})["value"] == 7
    assert cm.inspect().run(asked["runId"]) is None
    assert cm.inspect().suspended_runs == ()


def test_a_worker_killed_at_the_deadline_is_counted_and_replaced(make_codemode):
    cm = make_codemode({"workers": 1, "timeoutMs": 200})
    s = cm.session()
    before = cm.inspect()
    result = s.exec({"code": "const a = {length: 2 ** 31}; Array.prototype.reverse.call(a); return 1"})
    assert result["code"] == "timeout", result
    after = cm.inspect()
    assert after.workers_killed == before.workers_killed + 1
    assert after.worker_pids != before.worker_pids and len(after.worker_pids) == 1
    assert after.workers_spawned > before.workers_spawned
    assert s.exec({"code": "return 2"})["value"] == 2


def test_the_snapshot_is_frozen_and_does_not_follow_the_pool(make_codemode):
    cm = make_codemode({"workers": 1})
    seen = cm.inspect()
    with pytest.raises(AttributeError):
        seen.workers_killed = 5  # type: ignore[misc]
    os.kill(seen.worker_pids[0], signal.SIGKILL)
    assert cm.session().exec({"code": "return 3"})["value"] == 3  # (served by a replacement)
    assert cm.inspect().worker_pids != seen.worker_pids
