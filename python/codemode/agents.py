"""Swarm (seed 000, "使用 Swarm 展開代理"): sub-agents a cell fans out with ``agents.run()``.

A separate opt-in gate: only a ``CodeMode`` given an agent runner (``CodeMode(agents=runner)``)
puts ``agents``, ``phase`` and ``log`` in its cells; enabling code mode alone never does. The
cell orchestrates with ordinary JavaScript (``Promise.all`` fan-out, decision gates, collecting
structured results), and each ``agents.run`` is a bridge call as a tool call is::

    agents.run(prompt, options?) ──bridge──> CallPlanner: checked, the gate (hook, approval,
        ``require_approval=["agents:run"]``) as ``agents:run`` ──> AgentRunner.run(AgentTask)
        ──> its structured result resolves the cell's promise (what it raises rejects it)
    phase(name), log(...) ──> outputs ``[phase] name`` / ``[log] ...`` and trace events

so a run's sub-agents count toward ``maxPendingToolCalls``, a run whose sub-agents outlast the
exec suspends (``waiting``) and its ``wait`` collects them, and a replay serves their recorded
results without running them again.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Protocol, runtime_checkable

import msgspec

from .call_gate import HostRequest
from .errors import ConfigError

__all__ = ["AGENTS_REQUEST", "AgentRunner", "AgentTask", "run_agent"]

#: What hooks, approvals and policy patterns see an ``agents.run`` call as.
AGENTS_REQUEST = HostRequest("agents:run", "agents.run", "agents", source="agents")


class AgentTask(msgspec.Struct, frozen=True, kw_only=True):
    """One ``agents.run(prompt, options)`` of a cell, as its runner gets it."""

    prompt: str
    #: The cell's options object as given (JSON), e.g. ``{name, schema, tools}``: the runner's to read.
    options: dict[str, Any] = {}
    session_id: str
    #: The run (its ``runId``) and the call's number in it: together they name this sub-agent.
    run_id: str
    call_id: int
    agent_run: str | None = None


class _Call(msgspec.Struct, frozen=True):
    prompt: str
    options: dict[str, Any] = {}


@runtime_checkable
class AgentRunner(Protocol):
    """What a host implements to run sub-agents: ``run`` takes one task and returns its
    structured result (JSON-serializable), or an awaitable of it. An ``async`` one runs on the
    host's loop, a plain one on a thread; what it raises fails the cell's ``agents.run``."""

    def run(self, task: AgentTask) -> Any: ...


def checked_runner(runner: Any) -> AgentRunner | None:
    """``CodeMode(agents=...)``: a runner, or None; ``ConfigError`` for anything else."""
    if runner is None:
        return None
    if not isinstance(runner, AgentRunner) or not callable(runner.run):
        raise ConfigError("agents= takes an agent runner: an object with run(task) (codemode.AgentRunner)")
    return runner


def agent_task(payload: Any, session_id: str, run_id: str, call_id: int, agent_run: str | None) -> AgentTask:
    """The task of a cell's call (decoded JSON); ``ValueError`` if it is malformed."""
    try:
        call = msgspec.convert(payload, _Call)
    except msgspec.ValidationError as e:
        raise ValueError(f"agents.run: malformed call: {e}") from None
    return AgentTask(
        prompt=call.prompt,
        options=call.options,
        session_id=session_id,
        run_id=run_id,
        call_id=call_id,
        agent_run=agent_run,
    )


async def run_agent(runner: AgentRunner, task: AgentTask) -> Any:
    """Runs one sub-agent: on this loop if its ``run`` is ``async``, else on a thread."""
    if inspect.iscoroutinefunction(runner.run):
        return await runner.run(task)
    value = await asyncio.to_thread(runner.run, task)
    if inspect.isawaitable(value):
        value = await value
    return value
