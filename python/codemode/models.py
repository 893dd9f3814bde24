"""Classifier and image models for cells (seed 002, "分類・画像モデルAPI"): the provider interface
a host implements, and the registry that answers a cell's ``models.*`` calls.

A cell sees the models of the providers registered on its ``CodeMode`` (``CodeMode(models=[...])``)
and nothing else: with none registered there is no ``models`` global at all. Every operation is
a bridge call, answered in the host::

    models.getModelsOfType(type, provider?)   ──{op: "list"}──────> ModelRegistry.listed
    models.getAvailableOfType(type, provider?) ─{op: "list", available}─> (a provider's own
                                                  `available()`: local credentials, no probe)
    models.getModelOfType(type, provider, id)  ──list, then the one with that id (or undefined)
    models.classify(model, context)  ──checked in the guest──{op: "classify"}──> provider.classify
    models.generateImages(model, ctx) ─checked in the guest──{op: "images"}───> provider.generate_images

A model is named by its catalog ``provider`` and ``id`` only (never a joined string, never an
endpoint); the host looks it up among its providers' models of that type. A provider's failure
is a result (``stopReason: "error"``, or ``"aborted"`` when it was cancelled), never a thrown
host error; what it reports as usage is added to the cell's telemetry (``modelUsage``). At most
`MAX_MODEL_OPS` classify/image operations of one cell run at once (the guest queues the rest).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import msgspec

from .call_results import bounded_error, exception_text
from .errors import ConfigError

__all__ = [
    "MAX_MODEL_OPS",
    "ClassifyRequest",
    "ClassifyResult",
    "ImageBlock",
    "ImageRequest",
    "ImageResult",
    "Model",
    "ModelProvider",
    "ModelRegistry",
    "ModelType",
    "ModelUsage",
    "Question",
    "StopReason",
    "TextBlock",
]

ModelType = Literal["chat", "image", "classifier"]
StopReason = Literal["stop", "error", "aborted"]
#: Classify and image operations one cell runs at once (the seed's limit); the guest queues more.
MAX_MODEL_OPS = 4
#: Models one listing gives at most, and the characters of a provider name or model id.
MAX_LISTED = 1000
MAX_NAME_CHARS = 200


class Model(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One configured model as a provider lists it and a cell sees it."""

    #: The provider's name (`ModelProvider.name`): with ``id``, what names the model.
    provider: str
    id: str
    type: ModelType
    #: A display name, if the provider has one.
    name: str | None = None


class ImageBlock(msgspec.Struct, frozen=True, tag="image", tag_field="type", rename="camel"):
    """A base64 PNG, JPEG, GIF or WebP image (what ``image(part)`` takes in a cell)."""

    mime_type: Annotated[str, msgspec.Meta(pattern=r"^image/(png|jpeg|gif|webp)$")]
    data: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9+/]+={0,2}$")]


class TextBlock(msgspec.Struct, frozen=True, tag="text", tag_field="type"):
    text: str


class Question(msgspec.Struct, frozen=True):
    """One question of a classification. ``criteria``: for ``choice``, each label and what it
    means; for ``score``, the levels from low to high (a list, answered by index, or an object,
    answered by its key); for ``bool``, what ``"true"`` and ``"false"`` mean."""

    instructions: str
    type: Literal["choice", "score", "bool"]
    criteria: dict[str, str] | list[str]


class ClassifyRequest(msgspec.Struct, frozen=True):
    """``models.classify(model, {state, questions, images?})``, checked."""

    state: dict[str, Any]
    questions: dict[str, Question]
    images: list[ImageBlock] = []


class ImageRequest(msgspec.Struct, frozen=True):
    """``models.generateImages(model, {input})``: text prompts and reference images, in order."""

    input: list[TextBlock | ImageBlock]


class ModelUsage(msgspec.Struct, rename="camel", omit_defaults=True):
    """What model operations used: reported by providers, added up per cell (``modelUsage``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    images: int = 0
    #: Classify and image operations that reached a provider.
    operations: int = 0

    def add(self, other: ModelUsage) -> None:
        self.input_tokens += max(0, other.input_tokens)
        self.output_tokens += max(0, other.output_tokens)
        self.images += max(0, other.images)
        self.operations += max(0, other.operations)


class ClassifyResult(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """A classification: ``answers`` has one entry per question (a ``choice`` label, a
    ``score`` level, a ``bool``); a failure has ``stop_reason`` ``error``/``aborted`` and why."""

    stop_reason: StopReason = "stop"
    answers: dict[str, Any] = {}
    error_message: str | None = None
    usage: ModelUsage | None = None


class ImageResult(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Generated images (and any text the model gave), in order."""

    stop_reason: StopReason = "stop"
    output: list[ImageBlock | TextBlock] = []
    error_message: str | None = None
    usage: ModelUsage | None = None


@runtime_checkable
class ModelProvider(Protocol):
    """What a host implements to give cells models: a name, its models, whether it can run them
    here, and the two operations. ``classify`` and ``generate_images`` may be ``async`` (run on
    the host's loop) or plain functions (run on a thread); what they raise becomes a result with
    ``stopReason: "error"``."""

    #: The ``provider`` of every model it lists.
    name: str

    def models(self) -> Sequence[Model]:
        """Every configured model (all types)."""
        ...

    def available(self) -> bool:
        """Whether it is enabled and its credentials resolve here (never a remote probe)."""
        ...

    def classify(self, model: Model, request: ClassifyRequest) -> Any:
        """A `ClassifyResult` (or an awaitable of one)."""
        ...

    def generate_images(self, model: Model, request: ImageRequest) -> Any:
        """An `ImageResult` (or an awaitable of one)."""
        ...


class _Call(msgspec.Struct, frozen=True, tag_field="op"):
    """A cell's ``models.*`` call as the prelude sends it (its model: provider and id only)."""


class _List(_Call, frozen=True, tag="list"):
    type: ModelType
    provider: str | None = None
    available: bool = False


class _Classify(_Call, frozen=True, tag="classify"):
    provider: str
    id: str
    context: ClassifyRequest


class _Images(_Call, frozen=True, tag="images"):
    provider: str
    id: str
    context: ImageRequest


class ModelRegistry:
    """The providers of one ``CodeMode``, answering its cells' ``models.*`` calls."""

    def __init__(self, providers: Iterable[ModelProvider]) -> None:
        self._providers: dict[str, ModelProvider] = {}
        for provider in providers:
            name = getattr(provider, "name", None)
            if not isinstance(provider, ModelProvider) or not isinstance(name, str) or not name:
                raise ConfigError(
                    "a model provider has a name, models(), available(), classify() and generate_images()"
                )
            if name in self._providers:
                raise ConfigError(f"two model providers are named {name!r}")
            self._providers[name] = provider
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._providers)

    def listed(self, type_: str, provider: str | None = None, *, available: bool = False) -> list[Model]:
        """The models of ``type_`` (of one provider, if given; of available providers only,
        with ``available``)."""
        out: list[Model] = []
        for name, source in self._providers.items():
            if provider is not None and name != provider:
                continue
            if available and not source.available():
                continue
            for model in source.models():
                if isinstance(model, Model) and model.type == type_ and model.provider == name:
                    out.append(model)
                    if len(out) >= MAX_LISTED:
                        return out
        return out

    def find(self, type_: str, provider: str, model_id: str) -> tuple[ModelProvider, Model] | None:
        """The provider and model a cell named, if that provider lists it with that type."""
        source = self._providers.get(provider)
        if source is None:
            return None
        for model in source.models():
            if isinstance(model, Model) and model.type == type_ and model.id == model_id and model.provider == provider:
                return source, model
        return None

    async def answer(self, payload: Any, usage: ModelUsage) -> Any:
        """A cell's call (decoded JSON) -> what it resolves to; ``ValueError`` for what it is
        refused (an unknown model, a malformed request): the guest's promise rejects."""
        try:
            call = msgspec.convert(payload, _List | _Classify | _Images)
        except msgspec.ValidationError as e:
            raise ValueError(f"models: malformed request: {e}") from None
        if isinstance(call, _Classify):
            problem = _questions_problem(call.context)
            if problem is not None:
                raise ValueError(f"models.classify: {problem}")
        if isinstance(call, _List):
            listed = await asyncio.to_thread(self.listed, call.type, call.provider, available=call.available)
            return msgspec.to_builtins(listed)
        type_ = "classifier" if isinstance(call, _Classify) else "image"
        found = self.find(type_, call.provider, call.id)
        if found is None:
            raise ValueError(
                f"unknown {type_} model {call.provider!r} {call.id!r}: pass a model object that "
                f"models.getAvailableOfType({type_!r}) gives"
            )
        source, model = found
        if isinstance(call, _Classify):
            result = await _outcome(source.classify, model, call.context, ClassifyResult)
            if result.stop_reason == "stop":
                result = _checked_answers(result, call.context)
        else:
            result = await _outcome(source.generate_images, model, call.context, ImageResult)
        step = result.usage or ModelUsage()
        step.operations = 1
        with self._lock:
            usage.add(step)
        # `stopReason` always: a cell checks it before anything else (the seed's examples).
        return {"stopReason": result.stop_reason, **msgspec.to_builtins(result)}


async def _outcome(fn: Any, model: Model, request: Any, kind: type[Any]) -> Any:
    """What ``fn`` (a provider's operation) gives, as a ``kind`` result; what it raises, or a
    value of another type, is a result with ``stopReason: "error"`` (``"aborted"`` for a
    ``TimeoutError``: a provider on an SDK maps its own timeouts so). Its message is bounded."""
    try:
        if inspect.iscoroutinefunction(fn):
            value = await fn(model, request)
        else:
            value = await asyncio.to_thread(fn, model, request)
            if inspect.isawaitable(value):
                value = await value
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # a provider's failure is the cell's result data
        aborted = isinstance(e, TimeoutError)
        return kind(stop_reason="aborted" if aborted else "error", error_message=bounded_error(exception_text(e)))
    if not isinstance(value, kind):
        return kind(
            stop_reason="error",
            error_message=f"the model provider returned {type(value).__name__}, not {kind.__name__}",
        )
    if value.stop_reason != "stop":
        message = value.error_message or f"the model stopped: {value.stop_reason}"
        value = msgspec.structs.replace(value, error_message=bounded_error(message))
    return value


def _questions_problem(request: ClassifyRequest) -> str | None:
    """What the guest checks of each question's criteria, again here: a hook may have rewritten
    the input after the guest checked it."""
    if not request.questions:
        return "questions must not be empty"
    for key, q in request.questions.items():
        criteria = q.criteria
        if q.type == "bool":
            ok = isinstance(criteria, dict) and set(criteria) == {"true", "false"}
        elif q.type == "score":
            ok = len(criteria) >= 2
        else:
            ok = isinstance(criteria, dict) and len(criteria) >= 1
        if not ok:
            return f"question {key!r} has no criteria of the shape a {q.type} question needs"
    return None


def _checked_answers(result: ClassifyResult, request: ClassifyRequest) -> ClassifyResult:
    """A provider's answers held to the questions: one per question, of its type and among its
    criteria; anything else is an ``error`` result (the cell must not act on a made-up label)."""
    answers: dict[str, Any] = {}
    for key, question in request.questions.items():
        if key not in result.answers:
            return _bad_answer(result, f"no answer to question {key!r}")
        value = result.answers[key]
        criteria = question.criteria
        if question.type == "bool":
            ok = isinstance(value, bool)
        elif question.type == "score" and isinstance(criteria, list):
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(criteria)
        else:
            ok = isinstance(value, str) and isinstance(criteria, dict) and value in criteria
        if not ok:
            return _bad_answer(result, f"the answer to question {key!r} is not one its criteria allow")
        answers[key] = value
    return msgspec.structs.replace(result, answers=answers)


def _bad_answer(result: ClassifyResult, why: str) -> ClassifyResult:
    return ClassifyResult(
        stop_reason="error", error_message=f"the classifier's answer is malformed: {why}", usage=result.usage
    )
