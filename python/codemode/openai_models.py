"""A `ModelProvider` on the official ``openai`` SDK: classifiers on Chat Completions with
structured output, image models on the Images API.

A classification is one request whose ``response_format`` is a strict JSON schema with one
required property per question, so the model can only answer with a label, a level or a boolean
its criteria allow (`ModelRegistry` checks the answers again; a provider must not be trusted)::

    ClassifyRequest ──_schema()───> json_schema {question: enum | integer enum | boolean}
          │ ──_instructions()──> system message (questions, what each criterion means)
          │ ──state (JSON), images (data: URLs)──> user message
          └──> client.chat.completions.create ──> message.content (JSON) ──> ClassifyResult

    ImageRequest ──text parts (joined)──> prompt ──> client.images.generate   (no image parts)
          └──image parts (decoded)──> files ──────> client.images.edit       (reference images)
                      ──> data[i].b64_json ──> ImageBlock (+ TextBlock of a revised prompt)

The SDK is imported when first used, so ``codemode`` imports without it. Every failure the API
reports is a result, never a raise: a timeout is ``aborted``, anything else ``error`` with a short
message that never holds the api key (a proxy may echo the key in its error body). A response
with only an image URL is an error: codemode never fetches remote URLs.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .call_results import bounded_error, exception_text
from .errors import ConfigError
from .models import (
    ClassifyRequest,
    ClassifyResult,
    ImageBlock,
    ImageRequest,
    ImageResult,
    Model,
    ModelType,
    ModelUsage,
    Question,
    StopReason,
    TextBlock,
)

if TYPE_CHECKING:
    from types import ModuleType

    from openai import AsyncOpenAI
    from openai.types import ImagesResponse
    from openai.types.chat import ChatCompletion, ChatCompletionContentPartParam

__all__ = ["OpenAIModels"]

#: An image's ``output_format`` -> the MIME type of its block (the formats a cell takes).
_MIME_OF_FORMAT = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "gif": "image/gif"}
_SYSTEM = (
    "You classify the state the user sends (JSON, and any images). Answer every question below "
    "with one of the values its schema allows.\n\n"
)


class OpenAIModels:
    """The OpenAI models a host offers its cells: ``classifiers`` and ``image_models`` run
    here, ``chat`` models are only listed. ``base_url``, ``api_key`` and ``timeout_s`` configure
    the ``AsyncOpenAI`` it builds on first use (`aclose` closes it); a host's own ``client`` is
    used as it is, and stays the host's to close. The client belongs to the event loop of its
    first request (its pooled connections are): use one provider from one loop, the host's."""

    def __init__(
        self,
        *,
        classifiers: Sequence[str] = (),
        image_models: Sequence[str] = (),
        chat: Sequence[str] = (),
        name: str = "openai",
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        client: AsyncOpenAI | None = None,
    ) -> None:
        self.name = name
        by_type: dict[ModelType, Sequence[str]] = {"classifier": classifiers, "image": image_models, "chat": chat}
        self._models = [Model(provider=name, id=id_, type=type_) for type_, ids in by_type.items() for id_ in ids]
        self._base_url, self._api_key, self._timeout_s = base_url, api_key, timeout_s
        self._given = client
        self._built: AsyncOpenAI | None = None

    def models(self) -> list[Model]:
        return list(self._models)

    def available(self) -> bool:
        """An api key resolves here (given, in the host's client, or ``OPENAI_API_KEY``)."""
        return bool(self._api_key) or self._given is not None or bool(os.environ.get("OPENAI_API_KEY"))

    async def aclose(self) -> None:
        """Close the client this provider built (a host's own ``client`` is the host's to close)."""
        if self._built is not None:
            await self._built.close()
            self._built = None

    async def classify(self, model: Model, request: ClassifyRequest) -> ClassifyResult:
        openai = _sdk()
        user: list[ChatCompletionContentPartParam] = [
            {"type": "text", "text": "State (JSON):\n" + json.dumps(request.state)}
        ]
        user += [
            {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}}
            for image in request.images
        ]
        try:
            client = self._client()
            completion = await client.chat.completions.create(
                model=model.id,
                messages=[
                    {"role": "system", "content": _SYSTEM + _instructions(request.questions)},
                    {"role": "user", "content": user},
                ],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "classification", "strict": True, "schema": _schema(request.questions)},
                },
            )
        except openai.OpenAIError as e:
            stop, message = self._failure(openai, e)
            return ClassifyResult(stop_reason=stop, error_message=message)
        return _classified(completion)

    async def generate_images(self, model: Model, request: ImageRequest) -> ImageResult:
        openai = _sdk()
        prompt = "\n".join(part.text for part in request.input if isinstance(part, TextBlock))
        references = [part for part in request.input if isinstance(part, ImageBlock)]
        try:
            files = [
                (f"image-{i}.{ref.mime_type.partition('/')[2]}", _decoded(ref), ref.mime_type)
                for i, ref in enumerate(references)
            ]
        except binascii.Error:
            return ImageResult(stop_reason="error", error_message="a reference image is not valid base64")
        try:
            client = self._client()
            if files:
                response = await client.images.edit(model=model.id, prompt=prompt, image=files)
            else:
                response = await client.images.generate(model=model.id, prompt=prompt, n=1)
        except openai.OpenAIError as e:
            stop, message = self._failure(openai, e)
            return ImageResult(stop_reason=stop, error_message=message)
        return _generated(response)

    def _client(self) -> AsyncOpenAI:
        if self._given is not None:
            return self._given
        if self._built is None:
            from openai import AsyncOpenAI

            self._built = AsyncOpenAI(api_key=self._api_key, base_url=self._base_url, timeout=self._timeout_s)
        return self._built

    def _failure(self, openai: ModuleType, error: Exception) -> tuple[StopReason, str]:
        """What an SDK error means for the cell: its stop reason and a short message, the
        client's api key blanked out wherever the server echoed it."""
        if isinstance(error, openai.APITimeoutError):
            return "aborted", f"{self.name}: the request timed out"
        text = error.message if isinstance(error, openai.APIError) else exception_text(error)
        client = self._given or self._built
        key = self._api_key or (client.api_key if client is not None else None)
        if key:
            text = text.replace(key, "[api key]")
        return "error", bounded_error(f"{self.name}: {text}")


def _sdk() -> ModuleType:
    try:
        import openai
    except ImportError as e:
        raise ConfigError(f"OpenAIModels needs the openai SDK: pip install 'codemode[openai]' ({e})") from e
    return openai


def _decoded(image: ImageBlock) -> bytes:
    return base64.b64decode(image.data, validate=True)


def _schema(questions: dict[str, Question]) -> dict[str, Any]:
    """The JSON schema of the answers: one required property per question, nothing else."""
    properties: dict[str, Any] = {}
    for key, question in questions.items():
        if question.type == "bool":
            properties[key] = {"type": "boolean"}
        elif question.type == "score" and isinstance(question.criteria, list):
            properties[key] = {"type": "integer", "enum": list(range(len(question.criteria)))}
        else:
            properties[key] = {"type": "string", "enum": list(question.criteria)}
    return {"type": "object", "properties": properties, "required": list(questions), "additionalProperties": False}


def _instructions(questions: dict[str, Question]) -> str:
    """Each question's instructions and what each of its answers means."""
    lines: list[str] = []
    for key, question in questions.items():
        lines.append(f"Question {json.dumps(key)} ({question.type}): {question.instructions}")
        if question.type == "score" and isinstance(question.criteria, list):
            lines += [f"  {level}: {meaning}" for level, meaning in enumerate(question.criteria)]
            lines.append("  (answer with the number of the level; 0 is the lowest)")
        elif isinstance(question.criteria, dict):
            lines += [f"  {json.dumps(label)}: {meaning}" for label, meaning in question.criteria.items()]
            if question.type == "score":
                lines.append("  (the levels are listed from lowest to highest)")
        else:
            lines += [f"  {json.dumps(label)}" for label in question.criteria]
    return "\n".join(lines)


def _classified(completion: ChatCompletion) -> ClassifyResult:
    """The answers in a completion; an ``error`` (with the tokens it cost) when it holds none."""
    usage = None
    if completion.usage is not None:
        usage = ModelUsage(
            input_tokens=completion.usage.prompt_tokens, output_tokens=completion.usage.completion_tokens
        )
    choice = completion.choices[0] if completion.choices else None
    answers = None
    if choice is None:
        why = "the model gave no answer"
    elif choice.message.refusal:
        why = f"the model refused: {choice.message.refusal}"
    elif choice.finish_reason in ("length", "content_filter"):
        # (a cut-off answer may still parse as JSON: it is not one to act on)
        why = f"the model stopped early ({choice.finish_reason})"
    else:
        with contextlib.suppress(json.JSONDecodeError):
            answers = json.loads(choice.message.content or "")
        why = "the model's answer is not a JSON object"
    if not isinstance(answers, dict):
        return ClassifyResult(stop_reason="error", error_message=bounded_error(why), usage=usage)
    return ClassifyResult(answers=answers, usage=usage)


def _generated(response: ImagesResponse) -> ImageResult:
    """The images in a response, each followed by its revised prompt; an ``error`` when there
    is none, one is only a URL, or they are of a format a cell cannot take."""
    usage = ModelUsage(images=len(response.data or []))
    if response.usage is not None:
        usage.input_tokens, usage.output_tokens = response.usage.input_tokens, response.usage.output_tokens
    mime = _MIME_OF_FORMAT.get(response.output_format or "png")
    if mime is None:
        return _image_error(f"the model answered {response.output_format} images, which a cell cannot take", usage)
    output: list[ImageBlock | TextBlock] = []
    for image in response.data or []:
        if not image.b64_json:
            return _image_error("the model answered an image URL, not its data (codemode never fetches URLs)", usage)
        output.append(ImageBlock(mime_type=mime, data=image.b64_json))
        if image.revised_prompt:
            output.append(TextBlock(image.revised_prompt))
    return ImageResult(output=output, usage=usage) if output else _image_error("the model gave no image", usage)


def _image_error(message: str, usage: ModelUsage) -> ImageResult:
    return ImageResult(stop_reason="error", error_message=bounded_error(message), usage=usage)
