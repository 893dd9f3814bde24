"""OpenTelemetry spans for ``exec``/``wait`` and the tool calls a cell makes (optional).

With ``opentelemetry-api`` importable (``pip install 'codemode[otel]'``; the ``mcp`` extra brings
it too), each model-facing call is a span, ``codemode.exec`` or ``codemode.wait``, and each
nested tool call is a child span, ``codemode.tool_call``. Without it the decorators below give
back the method they decorate and nothing runs per exec: the module is checked once, at import.
With the API but no SDK (no provider set), each exec starts one non-recording span and stops
there.

    exec / wait (caller's thread or task)          tool call (its own thread or loop)
    ---------------------------------------        -----------------------------------
    `traced` starts the span, makes it current
    `new_run`/`_claim`: `run_span()` -> the
        run's Dispatcher holds it (`RunSpan`)  --> `start_call(dispatcher.span, ...)`: a child
                                                   span, current while the tool runs (its own
    result -> status, error code, telemetry        spans nest under it); ended as it lands
    counters; the span ends

The parent is carried explicitly, never taken from the thread's current context: a call runs
where its tool runs (the caller's thread, a pool thread, the private loop, the caller's loop),
and one started under an ``exec`` may land during a later ``wait``; it stays the child of the
span that started it.

What spans carry: ids, outcomes, the error code and the result's telemetry counters. Never a
cell's source, a tool's input or result, or an error's text (the guest writes it, and it may
quote a secret a tool gave it): the spec's rule that telemetry holds no secrets and no
unredacted tool inputs.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from . import _engine

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # no extra: `traced` wraps nothing, so no span ever reaches the functions below
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = ["ENABLED", "RunSpan", "call_in", "end_call", "enter", "run_span", "start_call", "traced", "tracer"]

#: Whether ``opentelemetry-api`` is importable (decided once, at import).
ENABLED = _trace is not None
#: The instrumentation scope spans are reported under.
SCOPE = "codemode"

F = TypeVar("F", bound=Callable[..., Any])


class RunSpan(NamedTuple):
    """The span of the ``exec``/``wait`` a run's next tool calls belong to, with the tracer that
    made it (their spans come from the same one)."""

    tracer: Tracer
    span: Span


#: The span of the ``exec``/``wait`` running in this thread or task (set by `traced`).
_current: contextvars.ContextVar[RunSpan | None] = contextvars.ContextVar("codemode_run_span", default=None)


def tracer(provider: TracerProvider | None = None) -> Tracer | None:
    """The tracer a ``CodeMode`` reports with: ``provider``'s, or the global provider's (it
    follows ``trace.set_tracer_provider`` even when that comes later); None without the API."""
    if _trace is None:
        return None
    # (The scope's version is the engine's: `codemode.__version__` reads importlib.metadata,
    # ~60 ms the first time, too much for each CodeMode.)
    return _trace.get_tracer(SCOPE, _engine.__version__, tracer_provider=provider)


def traced(kind: str) -> Callable[[F], F]:
    """Makes a ``Runner`` method ``(self, session, args, ...) -> Result`` one span named
    ``codemode.<kind>``, current while the method runs (a hook's or tool's spans nest under it),
    and ended with the result's outcome (`_describe`). The identity without the API."""
    name = f"codemode.{kind}"

    def decorate(method: F) -> F:
        if _trace is None:
            return method
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def run_async(host: Any, session: Any, *args: Any, **kwargs: Any) -> Any:
                run = _start(host, name, session)
                if run is None:
                    return await method(host, session, *args, **kwargs)
                with _trace.use_span(run.span, end_on_exit=True):
                    token = _current.set(run)
                    try:
                        result = await method(host, session, *args, **kwargs)
                    finally:
                        _current.reset(token)
                    _describe(run.span, result)
                return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(method)
        def run_sync(host: Any, session: Any, *args: Any, **kwargs: Any) -> Any:
            tracer = host.tracer
            run = None if tracer is None or _no_op(tracer) else _start(host, name, session)
            if run is None:
                return method(host, session, *args, **kwargs)
            with _trace.use_span(run.span, end_on_exit=True):
                token = _current.set(run)
                try:
                    result = method(host, session, *args, **kwargs)
                finally:
                    _current.reset(token)
                _describe(run.span, result)
            return result

        return run_sync  # type: ignore[return-value]

    return decorate


def _start(host: Any, name: str, session: Any) -> RunSpan | None:
    """A recording span for one exec/wait of ``session``, or None (no tracer, or not sampled)."""
    tracer: Tracer | None = host.tracer
    if tracer is None or _no_op(tracer):
        return None
    span = tracer.start_span(name)
    if not span.is_recording():
        return None
    span.set_attribute("codemode.session_id", session.session_id)
    if session.agent_run is not None:
        span.set_attribute("codemode.agent_run", session.agent_run)
    return RunSpan(tracer, span)


def _no_op(tracer: Tracer) -> bool:
    """Whether ``tracer`` records nothing: the global provider's while none is set (its proxy
    then hands out the API's no-op tracer). Asked before each exec/wait rather than starting a
    span that is not recording: that costs a cell ~3-5 µs of Python, most after an idle gap."""
    if isinstance(tracer, _trace.ProxyTracer):
        if tracer._real_tracer is None and _trace._TRACER_PROVIDER is None:
            return True  # (no provider set yet: the proxy's tracer is the no-op one)
        # (`_tracer` is the proxy's own look-up: the real tracer once a provider is set.)
        tracer = tracer._tracer
    return isinstance(tracer, _trace.NoOpTracer)


def _describe(span: Span, result: Any) -> None:
    """Sets a finished exec/wait's outcome on its span: status (``completed``/``waiting``/
    ``failed``), the error code, the run's wait reason and pending calls, and the telemetry
    counters. A failed cell's span has status ERROR (its description the code, not the text)."""
    status = result.__struct_config__.tag
    telemetry = result.telemetry
    attributes: dict[str, Any] = {
        "codemode.status": status,
        "codemode.telemetry.duration_ms": telemetry.duration_ms,
        "codemode.telemetry.tool_calls": telemetry.tool_calls,
        "codemode.telemetry.searches": telemetry.searches,
        "codemode.telemetry.describes": telemetry.describes,
        "codemode.telemetry.memory_bytes": telemetry.memory_bytes,
        "codemode.telemetry.catalog_size": telemetry.catalog_size,
        "codemode.telemetry.model_visible_tools": list(telemetry.model_visible_tools),
    }
    for source, count in telemetry.catalog_sources.items():
        attributes[f"codemode.telemetry.catalog_sources.{source}"] = count
    if status == "waiting":
        attributes["codemode.run_id"] = result.run_id
        attributes["codemode.reason"] = result.reason
        attributes["codemode.pending_tool_calls"] = len(result.pending_tool_calls)
    span.set_attributes(attributes)
    if status == "failed":
        if result.code is not None:
            span.set_attribute("codemode.error_code", result.code)
        span.set_status(_trace.StatusCode.ERROR, result.code or "the cell threw")


def run_span(run_id: str) -> RunSpan | None:
    """The span of the exec/wait driving ``run_id`` now (None when untraced), marked with the
    run's id: its dispatcher parents the run's next tool calls to it."""
    run = _current.get()
    if run is not None:
        run.span.set_attribute("codemode.run_id", run_id)
    return run


def start_call(run: RunSpan, call_id: int, tool_id: str, run_id: str) -> Span:
    """A started tool call's span, the child of ``run``'s (whatever thread starts it)."""
    attributes: Mapping[str, Any] = {
        "codemode.tool_id": tool_id,
        "codemode.call_id": call_id,
        "codemode.run_id": run_id,
    }
    parent = _trace.set_span_in_context(run.span)
    return run.tracer.start_span("codemode.tool_call", context=parent, attributes=attributes)


def end_call(span: Span, outcome: str, started: float) -> None:
    """Ends a call's span: ``outcome`` is ``ok``, ``error`` (status ERROR, no text: the message
    may quote the input), ``deferred`` (filed for an approval; its run, once approved, is a span
    of its own) or ``cancelled``; ``started`` is its ``time.perf_counter()`` start."""
    span.set_attribute("codemode.status", outcome)
    span.set_attribute("codemode.duration_ms", (time.perf_counter() - started) * 1000.0)
    if outcome == "error":
        span.set_status(_trace.StatusCode.ERROR)
    span.end()


def call_in(span: Span, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` with ``span`` current (a sync tool's own spans nest under its call)."""
    token = _context.attach(_trace.set_span_in_context(span))
    try:
        return fn(*args, **kwargs)
    finally:
        _context.detach(token)


def enter(span: Span) -> None:
    """Makes ``span`` current for the rest of the running task (an async tool's call): a task
    runs in its own copy of the context, so nothing outlives it and nothing is detached."""
    _context.attach(_trace.set_span_in_context(span))
