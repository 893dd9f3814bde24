"""Planning a call: what a cell's call names, whether its run may make it, and its checked input.

A guest value reaches the host here, so every step either answers the call at once (a `Plan`
of its error) or hands on what it found::

    (call_id, tool_id, input_json)
      ├─ readOutput ──────────────────────────> answered from the session's cut outputs
      ├─ too_heavy(input_json) ───────────────> refused before it is decoded
      ├─ models.* / agents.run ───────────────> the host's providers / agent runner (`HostApis`),
      │                                         classify, images and sub-agents gated as tools
      ├─ MCP.* / namespace call ──unwrapped──> the tool it stands for (resources/prompts:
      │                                         plan_mcp_op, gated as a tool call would be)
      ├─ the catalog tool (an exact name for its one id; hidden, denied and absent alike)
      ├─ its input: decoded, an MCP tool's defaults, checked against its parameters
      └─ Plan: a sync tool inline (its caller runs it), an async one started on its loop

Nothing is started or recorded while planning; `dispatch.Dispatcher.submit` guards the whole
of it (whatever decoding, mapping or checking a guest value does fails its own call).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from . import catalog
from .agents import AGENTS_REQUEST, AgentRunner, agent_task, run_agent
from .approvals import FiledCall
from .call_gate import CallGate, CallScope, Deferred, HostRequest, op_rejected
from .call_results import TYPE_NAME, Refused, bounded_error, error_message, exception_text
from .call_running import FILED, CallRunner
from .catalog import BoundCall
from .mcp_api import check_op_input, op_id, op_name, with_defaults
from .models import ModelRegistry, ModelUsage
from .outputs import OutputStore, read_call
from .policy import Policy
from .protocol import CallResult, too_heavy
from .tools import AGENTS_TOOL, MCP_TOOL, MODELS_TOOL, NAMESPACE_TOOL, OUTPUT_TOOL, hinted

if TYPE_CHECKING:
    from .namespaces import CallTable
    from .tools import CatalogView, Tool

__all__ = ["NO_HOST_APIS", "CallPlanner", "HostApis", "McpOps", "Plan", "planning_failure", "subject", "unknown_tool"]

McpOps = Callable[[str, str, Any], Awaitable[Any]]
_encode = msgspec.json.encode
_decode = msgspec.json.decode
#: An MCP or client tool's input is checked in the host up to this size (its schema is compiled
#: Python, slow on big inputs); a bigger one goes on, and its server checks it.
_UNTRUSTED_CHECK_CHARS = 1 << 20
#: Names an unknown tool's error suggests, and the characters of the id it searches with.
_SUGGESTIONS = 3
_SUGGEST_QUERY_CHARS = 200
#: A call's input not yet decoded from its JSON.
_UNDECODED: Any = object()


class Plan(NamedTuple):
    """How `Dispatcher.submit` starts one call."""

    #: The tool id an ``MCP.*`` or namespace call resolved to.
    resolved: str | None
    #: Runs it: an answer or a sync tool returns its result; an async call starts on its loop
    #: and returns None.
    run: Callable[[], CallResult | None]
    #: A sync tool: host code that the caller of ``submit`` runs where it chooses.
    inline: bool = False


class HostApis:
    """What a run's ``models.*`` and ``agents.run`` calls reach in the host (None: no such global
    in its cells), and the policy their gated calls pass. Built once per policy: every run reads it."""

    __slots__ = ("agents", "models", "policy", "setup")

    def __init__(
        self, models: ModelRegistry | None = None, agents: AgentRunner | None = None, policy: Policy | None = None
    ) -> None:
        self.models = models if models else None
        self.policy = policy or Policy()
        permitted = agents is not None and self.policy.permits(AGENTS_REQUEST.id, AGENTS_REQUEST.name)
        self.agents = agents if permitted else None
        #: What the run's setup says the prelude installs (``models``, ``agents``/``phase``/``log``).
        self.setup: dict[str, bool] = {}
        if self.models is not None:
            self.setup["models"] = True
        if self.agents is not None:
            self.setup["agents"] = True


#: A run with no host-backed APIs (the host registers none).
NO_HOST_APIS = HostApis()

#: The ``models.*`` operations that reach a provider: the request each is gated as.
_MODEL_OPS = {"classify": "models.classify", "images": "models.generateImages"}


class _Target(NamedTuple):
    """The tool a call names, as `CallPlanner.plan` finds it."""

    tool_id: str
    #: The tool id an ``MCP.*`` or namespace call resolved to (None: the call named it).
    resolved: str | None
    #: Its input, if decoding it was part of finding the tool (else `_UNDECODED`).
    args: Any
    #: An ``MCP.*`` call: it may reach MCP tools only, and other calls only other tools.
    via_mcp: bool


def unknown_tool(view: CatalogView, tool_id: str) -> str:
    """What a cell's call of a tool its run cannot see is told: the closest names it can call
    (a hidden or denied tool answers as an absent one: the suggestions come from the visible
    catalog alone) and where to look for others."""
    # The name part of an id (`host:core:get_wether`): its source and owner would only add noise.
    query = tool_id.rsplit(":", 1)[-1][:_SUGGEST_QUERY_CHARS]
    hits = msgspec.json.decode(view.index.search(query, _SUGGESTIONS)) if view.by_name else []
    names = [h["name"] if len(view.by_name.get(h["name"], ())) == 1 else h["id"] for h in hits]
    hint = f" Did you mean: {', '.join(names)}?" if names else ""
    return (
        f"unknown tool: {catalog.bounded_text(tool_id, _SUGGEST_QUERY_CHARS)}.{hint} "
        "Find tools with `await tools.search(query)`; call one by its exact id or unambiguous name."
    )


def _ambiguous(name: str, ids: list[str]) -> str:
    """A tool name that several visible tools share: call one of them by its id."""
    return f"tool name {name} is ambiguous: call one of {', '.join(ids)} by its id."


def planning_failure(subject: str, exc: BaseException) -> str:
    """Why a call failed before it started: what a guest value did to decoding or checking it."""
    if isinstance(exc, RecursionError):
        return f"{subject}: input is nested too deeply"
    if isinstance(exc, MemoryError):
        return f"{subject}: input is too large for the host"
    return bounded_error(f"{subject} failed: {TYPE_NAME.__get__(type(exc))}: {exception_text(exc)}")


def subject(tool_id: str) -> str:
    """How a failed call names what it called, before its tool is known."""
    if tool_id == MCP_TOOL:
        return "MCP call"
    if tool_id == NAMESPACE_TOOL:
        return "namespace call"
    return f"tool {catalog.bounded_text(tool_id, 200)}"


def answer(call_id: int, resolved: str | None, message: str) -> Plan:
    """A call answered at once with an error ``message``."""
    return Plan(resolved, lambda: CallResult(call_id, False, message))


class CallPlanner:
    """Plans one run's calls against its catalog view (see the module docstring)."""

    __slots__ = (
        "_apis",
        "_gate",
        "_mcp_ops",
        "_namespace_calls",
        "_outputs",
        "_read_only",
        "_runner",
        "_scope",
        "model_usage",
        "view",
    )

    def __init__(
        self,
        view: CatalogView,
        gate: CallGate,
        runner: CallRunner,
        scope: CallScope,
        *,
        outputs: OutputStore | None,
        namespace_calls: CallTable | None,
        mcp_ops: McpOps | None,
        read_only: bool,
        apis: HostApis | None = None,
    ) -> None:
        self.view = view
        self._gate = gate
        self._runner = runner
        self._scope = scope
        #: Where `readOutput` reads this session's cut outputs (none: it knows no handle).
        self._outputs = outputs
        self._namespace_calls = namespace_calls or {}
        #: Resource and prompt requests of `MCP.<server>.resources/prompts` (no catalog tool).
        self._mcp_ops = mcp_ops
        #: Restart-safe runs may only call read-only tools (they may be redone after a restart).
        self._read_only = read_only
        self._apis = apis or NO_HOST_APIS
        #: What this run's model operations used (its telemetry's ``modelUsage``); None until one.
        self.model_usage: ModelUsage | None = None

    def plan(self, call_id: int, tool_id: str, input_json: str) -> Plan:
        """How one call starts (nothing is started or recorded here); `submit` guards it. Each
        step either answers the call at once (a `Plan` of its error) or hands on what it found:
        the tool an ``MCP.*`` or namespace call stands for, the catalog tool, its checked input."""
        if tool_id == OUTPUT_TOOL:  # `readOutput`: answered here, from this session's outputs
            ok, payload = read_call(self._outputs, self._scope.session_id, input_json)
            return Plan("readOutput", lambda: CallResult(call_id, ok, payload))
        heavy = too_heavy(input_json)
        if heavy is not None:  # weighed before it is decoded
            return answer(call_id, None, f"{subject(tool_id)}: input is too heavy for the host: {heavy}")
        if tool_id == MODELS_TOOL:
            return self._plan_models(call_id, input_json)
        if tool_id == AGENTS_TOOL:
            return self._plan_agent(call_id, input_json)
        target = self._unwrapped(call_id, tool_id, input_json)
        if isinstance(target, Plan):
            return target
        found = self._catalog_tool(call_id, target)
        if isinstance(found, Plan):
            return found
        tool, target = found
        args, bound, problem = self._checked_input(tool, target.args, input_json)
        if problem is not None:
            return answer(call_id, target.resolved, problem)
        runner = self._runner
        if tool.is_async or self._gate.gate.is_async:
            return Plan(target.resolved, lambda: runner.start_async(call_id, tool, args))
        return Plan(target.resolved, lambda: runner.run_sync(call_id, tool, args, bound=bound), inline=True)

    def _namespace_target(self, input_json: str) -> tuple[str, Any]:
        """Resolves a namespace function call to ``(tool id, tool input)``; raises ``Refused``."""
        try:
            request = _decode(input_json)
            key = (str(request["ns"]), str(request["path"]))
            args = request.get("args") or []
        except (msgspec.DecodeError, KeyError, TypeError):
            raise Refused("malformed namespace call") from None
        target = self._namespace_calls.get(key)
        if target is None:
            raise Refused(f"unknown namespace function {key[0]}:{key[1]}")
        tool_id, mapper = target
        if mapper is not None:
            return tool_id, mapper(list(args))
        return tool_id, args[0] if args else {}

    def _unwrapped(self, call_id: int, tool_id: str, input_json: str) -> _Target | Plan:
        """The tool an ``MCP.*`` call (then a namespace call) stands for, with its input; an
        ``MCP.<server>.resources/prompts`` request is planned here. Another call names its own."""
        via_mcp = tool_id == MCP_TOOL
        resolved = None
        args: Any = _UNDECODED
        if via_mcp:
            try:
                request = _decode(input_json)
                if "id" in request:
                    tool_id, args = str(request["id"]), request.get("input", {})
                else:
                    server, op, payload = str(request["server"]), str(request["op"]), request.get("input", {})
            except (msgspec.DecodeError, KeyError, TypeError, AttributeError):
                return answer(call_id, None, "malformed MCP call")
            if "id" not in request:
                return self.plan_mcp_op(call_id, server, op, payload)
            resolved = tool_id
        if tool_id == NAMESPACE_TOOL:
            try:
                tool_id, mapped = self._namespace_target(input_json)
                args = _decode(_encode(mapped))  # the tool sees JSON, as from any other call
            except (RecursionError, MemoryError):
                raise  # a guest value the host cannot hold: `submit` says so
            except BaseException as e:  # refused, or the host's input mapper failed
                return answer(call_id, None, error_message("namespace", e))
            resolved = tool_id
        return _Target(tool_id, resolved, args, via_mcp)

    def _catalog_tool(self, call_id: int, target: _Target) -> tuple[Tool, _Target] | Plan:
        """The catalog tool ``target`` reaches (an exact name stands for its one id), if this
        run may call it."""
        tool_id, resolved = target.tool_id, target.resolved
        # (`MCP.<server>.<tool>()` names an MCP tool by its id; `tools.*` may name a tool.)
        reached = self.view.tools.get(tool_id) if target.via_mcp else self.view.reached(tool_id)
        if isinstance(reached, list):
            if len(reached) > 1:
                return answer(call_id, None, _ambiguous(tool_id, reached))
            reached = None
        elif reached is not None and reached.id != tool_id:
            tool_id = resolved = reached.id  # an exact tool name stands for its one id
        tool = reached
        if tool is None or (tool.source == "mcp") != target.via_mcp:
            # Hidden, denied and absent tools answer alike: a guessed id learns nothing.
            return answer(call_id, resolved, unknown_tool(self.view, tool_id))
        if self._read_only and not tool.read_only:
            message = f"tool {tool_id} is not read-only: a restartSafe run may only call read-only tools"
            return answer(call_id, resolved, message)
        if self._read_only and self.view.needs_approval(tool):
            message = f"tool {tool_id} waits for approval: a restartSafe run may only call tools that need none"
            return answer(call_id, resolved, message)
        if tool_id is target.tool_id and resolved is target.resolved:
            return tool, target
        return tool, target._replace(tool_id=tool_id, resolved=resolved)

    def plain_input(self, call_id: int, name: str, tool: Tool, input_json: str) -> tuple[Any, BoundCall | None] | Plan:
        """`plan` for a call of a plain sync tool (`Dispatcher.plain_sync_tools`: the catalog
        tool ``tool`` that ``name`` reaches, which this run may call with no hook, approval or
        async gate, and not restart-safe), where only its input is left to weigh, decode and
        check: the input the tool runs with (`CallRunner.run_sync`), or the call's answer."""
        heavy = too_heavy(input_json)
        if heavy is not None:
            return answer(call_id, None, f"{subject(name)}: input is too heavy for the host: {heavy}")
        args, bound, problem = self._checked_input(tool, _UNDECODED, input_json)
        if problem is not None:
            return answer(call_id, None if name == tool.id else tool.id, problem)
        return args, bound

    @staticmethod
    def _checked_input(tool: Tool, args: Any, input_json: str) -> tuple[Any, BoundCall | None, str | None]:
        """The call's input (decoded here unless its way to the tool decoded it: ``args``; an
        MCP tool's defaults filled in), its arguments when checking it converted it to the
        tool's parameters (the run uses them unless a hook may have changed the input), and
        why it is refused, if it is."""
        tool_id = tool.id  # (the catalog tool's own: `_catalog_tool` resolves a name to it)
        if args is _UNDECODED:
            try:
                args = _decode(input_json)
            except msgspec.DecodeError:
                return None, None, f"tool {tool_id}: input is not valid JSON"
        parameters = tool.parameters
        if parameters is not None and parameters.converts:
            bound = parameters.bind(args)
            if isinstance(bound, str):
                return None, None, f"invalid input for tool {tool_id}: {hinted(bound, tool.input_hint)}"
            return args, bound, None
        if tool.source == "mcp":
            args, problem = with_defaults(tool.input_schema, args)
            if problem is not None:
                return None, None, f"invalid input for tool {tool_id}: {problem}"
        if tool.check_input is not None and (tool.source == "host" or len(input_json) <= _UNTRUSTED_CHECK_CHARS):
            problem = tool.check_input(args)
            if problem is not None:
                return None, None, f"invalid input for tool {tool_id}: {problem}"
        return args, None, None

    def plan_mcp_op(self, call_id: int, server: str, op: str, payload: Any) -> Plan:
        """An ``MCP.<server>.resources/prompts`` request: one the policy denies answers as one
        that does not exist; its input is checked against what the declarations promise
        (`mcp_api.check_op_input`), then it passes the hook and the approval as a tool call
        would (as `mcp_api.op_id`), and goes to the server."""
        ops = self._mcp_ops
        ident = self.view.mcp_servers.get(server)
        if ops is None or ident is None or op not in self.view.mcp_ops.get(server, ()):
            return answer(call_id, None, f"unknown MCP request {server}.{op}")
        problem = check_op_input(op, payload)
        if problem is not None:
            return answer(call_id, None, f"invalid input for MCP.{ident}.{op}: {problem}")
        request = HostRequest(op_id(server, op), op_name(op), server)
        return self._gated(call_id, request, payload, functools.partial(ops, server, op))

    def _plan_models(self, call_id: int, input_json: str) -> Plan:
        """A ``models.*`` call: a listing is answered from the providers; ``classify`` and
        ``generateImages`` pass the policy and the gate as ``models:<provider>:<op>`` first."""
        registry = self._apis.models
        if not registry:
            return answer(call_id, None, "models is not available: this host registers no model providers")
        try:
            payload = _decode(input_json)
            op = payload.get("op")
        except (msgspec.DecodeError, AttributeError):
            return answer(call_id, None, "malformed models call")
        if self.model_usage is None:
            self.model_usage = ModelUsage()
        act = functools.partial(registry.answer, usage=self.model_usage)
        name = _MODEL_OPS.get(op)
        if name is None:
            listing = functools.partial(act, payload)
            return Plan("models:list", lambda: self._runner.start_coroutine(call_id, "models:list", listing))
        provider = catalog.bounded_text(str(payload.get("provider")), 200)
        request = HostRequest(f"models:{provider}:{op}", name, provider, source="models")
        if not self._apis.policy.permits(request.id, request.name):
            return answer(call_id, None, f"{name}: the host's policy does not permit {request.id}")
        return self._gated(call_id, request, payload, act)

    def _plan_agent(self, call_id: int, input_json: str) -> Plan:
        """An ``agents.run``: its task, then the policy and the gate as ``agents:run``, then the runner."""
        runner, request = self._apis.agents, AGENTS_REQUEST
        if runner is None:
            return answer(call_id, None, "agents.run is not available: this host runs no sub-agents")
        if self._read_only:
            return answer(call_id, None, "agents.run is not read-only: a restartSafe run may only call read-only tools")
        scope = self._scope
        try:
            task = agent_task(_decode(input_json), scope.session_id, scope.run_id, call_id, scope.agent_run)
        except (msgspec.DecodeError, ValueError) as e:
            return answer(call_id, None, bounded_error(str(e)))

        async def act(gated: Any) -> Any:  # (a hook may have rewritten the call's input)
            return await run_agent(runner, agent_task(gated, scope.session_id, scope.run_id, call_id, scope.agent_run))

        return self._gated(call_id, request, {"prompt": task.prompt, "options": task.options}, act)

    def _gated(self, call_id: int, request: HostRequest, payload: Any, act: Callable[[Any], Awaitable[Any]]) -> Plan:
        """A call that is no catalog tool: it passes the hook and the approval as a tool call
        would (as ``request``), then ``act`` runs with the input they leave."""
        gate, runner = self._gate, self._runner

        async def run() -> Any:
            try:
                gated = await gate.check_async(call_id, request, payload) if gate.passes(request) else payload
            except Deferred as deferred:
                approved = functools.partial(act, deferred.input)
                resume = functools.partial(runner.start_coroutine, call_id, request.id, approved)
                refuse = functools.partial(op_rejected, call_id, request.id)
                gate.file(call_id, deferred, FiledCall(request.id, None, resume, False, refuse))
                return FILED
            return await act(gated)

        return Plan(request.id, lambda: runner.start_coroutine(call_id, request.id, run))
