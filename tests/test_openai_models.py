"""`OpenAIModels` against a real OpenAI-compatible HTTP server on 127.0.0.1 (no network).

The server (`FakeOpenAI`) answers what the SDK sends the way the API does: a chat completion
answers the strict ``json_schema`` it was given (the last value of each enum, ``true`` for a
boolean), the images endpoints answer a 1x1 PNG as ``b64_json``. A test can make it answer a
canned status and body instead, or stall until the client gives up; every request is recorded,
so the tests read what went over the wire, not what the provider meant to send.
"""

from __future__ import annotations

import asyncio
import base64
import email.parser
import email.policy
import importlib
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import msgspec
import pytest
from codemode.errors import ConfigError
from codemode.models import (
    ClassifyRequest,
    ClassifyResult,
    ImageBlock,
    ImageRequest,
    Model,
    ModelProvider,
    ModelRegistry,
    ModelUsage,
    Question,
    TextBlock,
)
from codemode.openai_models import OpenAIModels
from openai import AsyncOpenAI

T = TypeVar("T")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
KEY = "sk-test-secret-0123456789"
CLASSIFIER = Model(provider="openai", id="gpt-test", type="classifier")
IMAGER = Model(provider="openai", id="gpt-image-test", type="image")
QUESTIONS = {
    "topic": Question("What the ticket is about", "choice", {"billing": "money matters", "bug": "it is broken"}),
    "urgency": Question("How urgent it is", "score", ["can wait", "this week", "now"]),
    "tone": Question("How polite it is", "score", {"rude": "insults", "neutral": "plain", "warm": "kind"}),
    "spam": Question("Whether it is spam", "bool", {"true": "an advert", "false": "a real ticket"}),
}
TICKET = ClassifyRequest(state={"subject": "Refund", "body": "I was charged twice"}, questions=QUESTIONS)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> list[tuple[str, str | None, bytes]]:
        """A multipart body as (field name, file name, bytes) per part."""
        head = f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self.body)
        return [
            (part.get_param("name", header="content-disposition"), part.get_filename(), part.get_payload(decode=True))
            for part in message.iter_parts()  # type: ignore[attr-defined]
        ]


@dataclass
class FakeOpenAI:
    url: str
    received: list[Received] = field(default_factory=list)
    #: A canned (status, JSON body) to answer every request with, instead of the API's answer.
    reply: tuple[int, Any] | None = None
    #: Answer nothing until the test ends (the client times out first).
    stall: bool = False
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, request: Received) -> tuple[int, Any]:
        if self.reply is not None:
            return self.reply
        if request.path == "/v1/chat/completions":
            return 200, completion(json.dumps(schema_answer(request.json())))
        if request.path in ("/v1/images/generations", "/v1/images/edits"):
            image = {"b64_json": base64.b64encode(PNG).decode(), "revised_prompt": "a red dot, centred"}
            usage = {"input_tokens": 11, "output_tokens": 272, "total_tokens": 283, "input_tokens_details": {}}
            return 200, {"created": 0, "data": [image], "output_format": "png", "usage": usage}
        return 404, {"error": {"message": f"no route {request.path}", "type": "invalid_request_error"}}


def completion(content: str | None, *, finish_reason: str = "stop", refusal: str | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 321, "completion_tokens": 17, "total_tokens": 338},
    }


def schema_answer(body: dict[str, Any]) -> dict[str, Any]:
    """What a strict model answers: the last value of each enum, ``true`` for a boolean."""
    properties = body["response_format"]["json_schema"]["schema"]["properties"]
    return {key: prop["enum"][-1] if "enum" in prop else True for key, prop in properties.items()}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            server.received.append(request)
            if server.stall:
                server.release.wait(30)
                return
            status, answer = server.answer(request)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST  # (recorded too: a fetch of an image URL must show up)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = FakeOpenAI(url=f"http://127.0.0.1:{httpd.server_address[1]}/v1")
    # (a short poll: `shutdown` waits up to one poll for the loop to notice)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server
    server.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def run(provider: OpenAIModels, operation: Callable[[OpenAIModels], Awaitable[T]]) -> T:
    """``operation`` on a fresh loop, with the client the provider built closed after it."""

    async def main() -> T:
        try:
            return await operation(provider)
        finally:
            await provider.aclose()

    return asyncio.run(main())


def own_client(fake: FakeOpenAI, operation: Callable[[OpenAIModels], Awaitable[T]], timeout: float = 10.0) -> T:
    """``operation`` through a host's own client that never retries."""

    async def main() -> T:
        async with AsyncOpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=timeout) as client:
            return await operation(
                OpenAIModels(classifiers=["gpt-test"], image_models=["gpt-image-test"], client=client)
            )

    return asyncio.run(main())


def provider(fake: FakeOpenAI) -> OpenAIModels:
    return OpenAIModels(classifiers=["gpt-test"], image_models=["gpt-image-test"], base_url=fake.url, api_key=KEY)


def classify(request: ClassifyRequest) -> Callable[[OpenAIModels], Awaitable[ClassifyResult]]:
    return lambda p: p.classify(CLASSIFIER, request)


# ---- classify ------------------------------------------------------------------------------
def test_classify_sends_a_strict_schema_with_one_typed_property_per_question(fake: FakeOpenAI):
    run(provider(fake), classify(TICKET))
    (sent,) = fake.received
    assert sent.path == "/v1/chat/completions"
    body = sent.json()
    assert body["model"] == "gpt-test"
    assert body["response_format"]["type"] == "json_schema"
    json_schema = body["response_format"]["json_schema"]
    assert json_schema["strict"] is True
    assert json_schema["schema"] == {
        "type": "object",
        "properties": {
            "topic": {"type": "string", "enum": ["billing", "bug"]},
            "urgency": {"type": "integer", "enum": [0, 1, 2]},
            "tone": {"type": "string", "enum": ["rude", "neutral", "warm"]},
            "spam": {"type": "boolean"},
        },
        "required": ["topic", "urgency", "tone", "spam"],
        "additionalProperties": False,
    }


def test_classify_messages_carry_the_instructions_criteria_and_state_as_json(fake: FakeOpenAI):
    run(provider(fake), classify(TICKET))
    system, user = fake.received[0].json()["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for question in QUESTIONS.values():
        assert question.instructions in system["content"]
        meanings = question.criteria.values() if isinstance(question.criteria, dict) else question.criteria
        assert all(meaning in system["content"] for meaning in meanings)
    (text,) = user["content"]
    assert json.loads(text["text"].partition("\n")[2]) == TICKET.state


def test_classify_parses_the_answers_and_the_token_usage(fake: FakeOpenAI):
    result = run(provider(fake), classify(TICKET))
    assert result == ClassifyResult(
        answers={"topic": "bug", "urgency": 2, "tone": "warm", "spam": True},
        usage=ModelUsage(input_tokens=321, output_tokens=17),
    )
    assert fake.received[0].headers["authorization"] == f"Bearer {KEY}"


def test_classify_sends_images_as_data_urls_after_the_state(fake: FakeOpenAI):
    png = base64.b64encode(PNG).decode()
    request = ClassifyRequest(state={}, questions=QUESTIONS, images=[ImageBlock("image/png", png)])
    run(provider(fake), classify(request))
    _, user = fake.received[0].json()["messages"]
    assert [part["type"] for part in user["content"]] == ["text", "image_url"]
    assert user["content"][1]["image_url"]["url"] == f"data:image/png;base64,{png}"


def test_a_server_error_is_an_error_result_naming_the_status_and_never_the_key(fake: FakeOpenAI):
    # A proxy that echoes the credentials it was sent: the key must not reach the cell.
    fake.reply = (500, {"error": {"message": f"upstream failed for key {KEY}", "type": "server_error"}})
    result = own_client(fake, classify(TICKET))
    assert result.stop_reason == "error"
    assert result.error_message is not None
    assert "500" in result.error_message and "upstream failed" in result.error_message
    assert KEY not in result.error_message


def test_a_rejected_key_is_an_error_result_with_the_status(fake: FakeOpenAI):
    fake.reply = (401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
    result = run(provider(fake), classify(TICKET))
    assert (result.stop_reason, result.error_message) == (
        "error",
        "openai: Error code: 401 - Incorrect API key provided",
    )


def test_a_request_that_times_out_is_aborted(fake: FakeOpenAI):
    fake.stall = True
    result = own_client(fake, classify(TICKET), timeout=0.2)
    assert (result.stop_reason, result.error_message) == ("aborted", "openai: the request timed out")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (completion("the topic is billing"), "the model's answer is not a JSON object"),
        (completion(None), "the model's answer is not a JSON object"),
        (completion('["bug"]'), "the model's answer is not a JSON object"),
        (completion(None, refusal="I cannot help with that"), "the model refused: I cannot help with that"),
        (completion('{"topic": "bu', finish_reason="length"), "the model stopped early (length)"),
        (completion(None, finish_reason="content_filter"), "the model stopped early (content_filter)"),
        ({**completion("{}"), "choices": []}, "the model gave no answer"),
    ],
)
def test_an_answer_that_is_not_a_classification_is_an_error_result_keeping_usage(
    fake: FakeOpenAI, answer: dict[str, Any], why: str
):
    fake.reply = (200, answer)
    result = run(provider(fake), classify(TICKET))
    assert result == ClassifyResult(
        stop_reason="error", error_message=why, usage=ModelUsage(input_tokens=321, output_tokens=17)
    )


def test_through_the_registry_an_answer_missing_a_question_is_an_error(fake: FakeOpenAI):
    # The provider passes on what the model said; the registry holds it to the questions.
    fake.reply = (200, completion(json.dumps({"topic": "bug", "urgency": 1, "tone": "warm"})))
    models = provider(fake)
    assert isinstance(models, ModelProvider)
    registry, usage = ModelRegistry([models]), ModelUsage()
    call = {"op": "classify", "provider": "openai", "id": "gpt-test", "context": msgspec.to_builtins(TICKET)}
    answer = run(models, lambda _: registry.answer(call, usage))
    assert answer["stopReason"] == "error"
    assert "no answer to question 'spam'" in answer["errorMessage"]
    assert usage == ModelUsage(input_tokens=321, output_tokens=17, operations=1)


# ---- images --------------------------------------------------------------------------------
def test_a_text_prompt_generates_an_image_whose_data_is_the_png(fake: FakeOpenAI):
    request = ImageRequest([TextBlock("a red dot"), TextBlock("on white")])
    result = run(provider(fake), lambda p: p.generate_images(IMAGER, request))
    (sent,) = fake.received
    assert sent.path == "/v1/images/generations"
    assert sent.json() == {"model": "gpt-image-test", "prompt": "a red dot\non white", "n": 1}
    assert result.stop_reason == "stop"
    image, revised = result.output
    assert isinstance(image, ImageBlock) and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == PNG
    assert revised == TextBlock("a red dot, centred")
    assert result.usage == ModelUsage(input_tokens=11, output_tokens=272, images=1)


def test_a_reference_image_is_uploaded_to_the_edits_endpoint(fake: FakeOpenAI):
    reference = b"\x89PNG\r\n\x1a\n reference bytes \x00\xff"
    request = ImageRequest([TextBlock("make it blue"), ImageBlock("image/png", base64.b64encode(reference).decode())])
    result = run(provider(fake), lambda p: p.generate_images(IMAGER, request))
    (sent,) = fake.received
    assert sent.path == "/v1/images/edits"
    form = {name: (filename, data) for name, filename, data in sent.form()}
    assert form["prompt"] == (None, b"make it blue")
    assert form["model"] == (None, b"gpt-image-test")
    assert form["image[]"] == ("image-0.png", reference)
    assert result.stop_reason == "stop" and isinstance(result.output[0], ImageBlock)


def test_an_image_answered_only_as_a_url_is_an_error_and_never_fetched(fake: FakeOpenAI):
    fake.reply = (200, {"created": 0, "data": [{"url": f"{fake.url}/never-fetched.png"}]})
    result = run(provider(fake), lambda p: p.generate_images(IMAGER, ImageRequest([TextBlock("a dot")])))
    assert result.stop_reason == "error" and result.output == []
    assert result.error_message == "the model answered an image URL, not its data (codemode never fetches URLs)"
    assert [r.path for r in fake.received] == ["/v1/images/generations"]


def test_an_image_server_error_is_an_error_result(fake: FakeOpenAI):
    fake.reply = (400, {"error": {"message": "prompt rejected", "type": "invalid_request_error"}})
    result = run(provider(fake), lambda p: p.generate_images(IMAGER, ImageRequest([TextBlock("a dot")])))
    assert (result.stop_reason, result.error_message) == ("error", "openai: Error code: 400 - prompt rejected")


# ---- listing, availability, the SDK --------------------------------------------------------
def test_models_lists_each_type_under_the_provider_name():
    models = OpenAIModels(classifiers=["c1", "c2"], image_models=["i1"], chat=["gpt-chat"], name="acme")
    assert models.models() == [
        Model(provider="acme", id="c1", type="classifier"),
        Model(provider="acme", id="c2", type="classifier"),
        Model(provider="acme", id="i1", type="image"),
        Model(provider="acme", id="gpt-chat", type="chat"),
    ]


def test_available_only_when_a_key_resolves_locally(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert OpenAIModels().available() is False
    assert OpenAIModels(api_key=KEY).available() is True
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert OpenAIModels().available() is True


def test_a_hosts_client_makes_it_available_without_a_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def main() -> bool:
        async with AsyncOpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1") as client:
            return OpenAIModels(client=client).available()

    assert asyncio.run(main()) is True


def test_without_the_sdk_it_imports_and_its_first_use_says_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # (what `import openai` finds: not installed)
    monkeypatch.delitem(sys.modules, "codemode.openai_models")
    fresh = importlib.import_module("codemode.openai_models")
    models = fresh.OpenAIModels(classifiers=["gpt-test"], api_key=KEY)
    with pytest.raises(ConfigError, match=r"pip install 'codemode\[openai\]'"):
        asyncio.run(models.classify(CLASSIFIER, TICKET))


def test_aclose_leaves_a_hosts_own_client_open(fake: FakeOpenAI):
    async def main() -> bool:
        async with AsyncOpenAI(base_url=fake.url, api_key=KEY, max_retries=0) as client:
            models = OpenAIModels(classifiers=["gpt-test"], client=client)
            await models.aclose()
            return client.is_closed()

    assert asyncio.run(main()) is False


# ---- through a CodeMode ----------------------------------------------------------------------


def test_a_cell_classifies_and_draws_through_the_openai_provider(fake: FakeOpenAI):
    """The seed's two examples end to end: cell -> worker -> host -> the SDK -> the local server."""
    from codemode import CodeMode

    code = """const [judge] = await models.getAvailableOfType("classifier");
const verdict = await models.classify(judge, {
  state: {subject: "Move tomorrow's meeting to Friday"},
  questions: {scheduling: {type: "bool", instructions: "Does this request change a meeting?",
                           criteria: {true: "A meeting change is requested", false: "No meeting change"}},
              team: {type: "choice", instructions: "Which team?", criteria: {ops: "operations", eng: "engineering"}}},
});
if (verdict.stopReason !== "stop") throw new Error(verdict.errorMessage || verdict.stopReason);
const [painter] = await models.getAvailableOfType("image");
const drawn = await models.generateImages(painter, {input: [{type: "text", text: "A simple blue bird icon"}]});
for (const part of drawn.output) part.type === "image" ? image(part) : text(part.text);
return verdict.answers"""
    openai_models = provider(fake)

    async def main() -> dict[str, Any]:
        try:
            async with CodeMode({"enabled": True, "workers": 1}, models=[openai_models]) as cm:
                return dict(await cm.session().exec_async({"code": code}))
        finally:
            await openai_models.aclose()

    result = asyncio.run(main())
    assert result["status"] == "completed", result
    assert result["value"] == {"scheduling": True, "team": "eng"}
    assert result["output"] == [
        {"type": "image", "mimeType": "image/png", "data": base64.b64encode(PNG).decode()},
        {"type": "text", "text": "a red dot, centred"},
    ]
    assert result["telemetry"]["modelUsage"] == {"inputTokens": 332, "outputTokens": 289, "images": 1, "operations": 2}
    assert [r.path for r in fake.received] == ["/v1/chat/completions", "/v1/images/generations"]
    assert fake.received[0].headers["authorization"] == f"Bearer {KEY}"
