"""The ``models.*`` guest API (seed 002, "分類・画像モデルAPI") over a host's model providers.

The provider here is written the way a host would write one (`codemode.models.ModelProvider`);
it records what reaches it, so a test can tell a call the guest refused from one the provider saw.
`tests/test_openai_models.py` pins the real provider on the ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any

import pytest
from codemode import Block, CodeMode
from codemode.models import (
    ClassifyRequest,
    ClassifyResult,
    ImageBlock,
    ImageRequest,
    ImageResult,
    Model,
    ModelUsage,
    TextBlock,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
BOOL_QUESTION = {"type": "bool", "instructions": "Is it?", "criteria": {"true": "yes", "false": "no"}}
#: JS: the bool question ``Q`` the short classify cells ask.
Q = f"const Q = {json.dumps(BOOL_QUESTION)};\n"
#: A cell that asks the first available image model for one picture.
DRAW_ONE = (
    'const [p] = await models.getAvailableOfType("image");\n'
    'return await models.generateImages(p, {input: [{type: "text", text: "x"}]})'
)
#: A cell that asks the first available classifier ``Q``.
CLASSIFY_ONE = Q + (
    'const [m] = await models.getAvailableOfType("classifier");\n'
    "return await models.classify(m, {state: {}, questions: {q: Q}})"
)


class Recorder:
    """A provider that answers each question with its first allowed answer and records calls."""

    def __init__(self, name: str = "acme", *, available: bool = True, delay_s: float = 0.0) -> None:
        self.name = name
        self._available = available
        self.delay_s = delay_s
        self.calls: list[tuple[str, Model, Any]] = []
        self.running = 0
        self.peak = 0
        self.fail: BaseException | None = None
        self.answers: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def models(self) -> list[Model]:
        return [
            Model(provider=self.name, id="judge-1", type="classifier", name="Judge"),
            Model(provider=self.name, id="judge-2", type="classifier"),
            Model(provider=self.name, id="paint-1", type="image"),
            Model(provider=self.name, id="talk-1", type="chat"),
        ]

    def available(self) -> bool:
        return self._available

    async def _enter(self, op: str, model: Model, request: Any) -> None:
        with self._lock:
            self.calls.append((op, model, request))
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            with self._lock:
                self.running -= 1
        if self.fail is not None:
            raise self.fail

    async def classify(self, model: Model, request: ClassifyRequest) -> ClassifyResult:
        await self._enter("classify", model, request)
        answers = self.answers
        if answers is None:
            answers = {}
            for key, q in request.questions.items():
                if q.type == "bool":
                    answers[key] = True
                elif isinstance(q.criteria, list):
                    answers[key] = len(q.criteria) - 1
                else:
                    answers[key] = next(iter(q.criteria))
        return ClassifyResult(answers=answers, usage=ModelUsage(input_tokens=100, output_tokens=7))

    async def generate_images(self, model: Model, request: ImageRequest) -> ImageResult:
        await self._enter("images", model, request)
        return ImageResult(
            output=[ImageBlock(mime_type="image/png", data=PNG), TextBlock(text="a blue bird")],
            usage=ModelUsage(input_tokens=12, images=1),
        )


@pytest.fixture
def provider() -> Recorder:
    return Recorder()


@pytest.fixture
def cm(provider: Recorder) -> Any:
    with CodeMode({"enabled": True, "workers": 1}, models=[provider, Recorder("offline", available=False)]) as cm:
        yield cm


def run(cm: CodeMode, code: str) -> dict[str, Any]:
    result = cm.session().exec({"code": code})
    while result["status"] == "waiting":
        result = cm.session().wait({"runId": result["runId"]})
    return dict(result)


def value(cm: CodeMode, code: str) -> Any:
    result = run(cm, code)
    assert result["status"] == "completed", result
    return result["value"]


def error(cm: CodeMode, code: str) -> str:
    result = run(cm, code)
    assert result["status"] == "failed", result
    return str(result["error"])


# ---- presence ------------------------------------------------------------------------------------


def test_models_is_absent_without_a_provider_and_the_description_does_not_mention_it():
    with CodeMode({"enabled": True, "workers": 1}) as plain:
        plain.tool(lambda x: x, name="ident")
        assert value(plain, "return typeof models") == "undefined"
        assert "models." not in plain.exec_description()


def test_models_is_present_with_a_provider_and_the_description_says_how_to_use_it(cm):
    assert value(cm, "return Object.keys(models).sort()") == [
        "classify",
        "generateImages",
        "getAvailableOfType",
        "getModelOfType",
        "getModelsOfType",
    ]
    description = cm.exec_description()
    assert "models.getAvailableOfType" in description and "stopReason" in description
    # Code mode is offered even with no catalog tool: the models are reason enough.
    assert [t.name for t in cm.model_tools()] == ["exec", "wait"]


def test_models_is_frozen_and_cannot_be_replaced(cm):
    assert value(cm, "models.classify = 1; try { models = 2 } catch (e) {} return typeof models.classify") == "function"


# ---- listing -------------------------------------------------------------------------------------


def test_get_models_of_type_lists_every_configured_model_of_that_type(cm):
    listed = value(cm, 'return await models.getModelsOfType("classifier")')
    assert listed == [
        {"provider": "acme", "id": "judge-1", "type": "classifier", "name": "Judge"},
        {"provider": "acme", "id": "judge-2", "type": "classifier"},
        {"provider": "offline", "id": "judge-1", "type": "classifier", "name": "Judge"},
        {"provider": "offline", "id": "judge-2", "type": "classifier"},
    ]
    assert value(cm, 'return (await models.getModelsOfType("image", "offline")).map(m => m.provider + " " + m.id)') == [
        "offline paint-1"
    ]


def test_get_available_of_type_leaves_out_providers_that_cannot_run_here(cm):
    assert value(cm, 'return (await models.getAvailableOfType("classifier")).map(m => m.provider)') == ["acme", "acme"]
    assert value(cm, 'return await models.getAvailableOfType("image", "offline")') == []


def test_get_model_of_type_finds_one_model_by_three_strings_or_gives_undefined(cm):
    assert value(cm, 'return await models.getModelOfType("image", "acme", "paint-1")') == {
        "provider": "acme",
        "id": "paint-1",
        "type": "image",
    }
    code = """return [await models.getModelOfType("image", "acme", "judge-1"),
                      await models.getModelOfType("classifier", "nobody", "judge-1")].map(m => m === undefined)"""
    assert value(cm, code) == [True, True]
    assert "provider and id are two separate strings" in error(
        cm, 'return await models.getModelOfType("image", "acme/paint-1")'
    )


@pytest.mark.parametrize("bad", ['"embedding"', '"Classifier"', "undefined", "3"])
def test_an_unknown_model_type_rejects_in_the_guest(cm, bad):
    result = run(cm, f"return await models.getModelsOfType({bad})")
    assert result["status"] == "failed"
    assert 'type must be "chat", "image" or "classifier"' in result["error"]
    assert result["telemetry"]["toolCalls"] == 0


def test_listing_chat_models_exposes_no_chat_generation_function(cm):
    code = """const chat = await models.getModelsOfType("chat");
    const fns = [];
    for (const m of chat) for (const k of Object.keys(m)) if (typeof m[k] === "function") fns.push(k);
    return {chat, fns, frozen: Object.isFrozen(chat[0]),
            generate: ["chat", "complete", "generate", "generateText", "run"].filter(k => k in models)}"""
    got = value(cm, code)
    assert got["chat"][0] == {"provider": "acme", "id": "talk-1", "type": "chat"}
    assert got["fns"] == [] and got["generate"] == [] and got["frozen"] is True


# ---- classify ------------------------------------------------------------------------------------


def test_the_seed_classify_example_runs_as_written(cm, provider):
    code = """const available = await models.getAvailableOfType("classifier");
if (!available.length) { text("No configured classifier is available"); exit(); }
const result = await models.classify(available[0], {
  state: {subject: "Move tomorrow's meeting to Friday"},
  questions: {
    scheduling: {
      type: "bool", instructions: "Does this request change a meeting?",
      criteria: {true: "A meeting change is requested", false: "No meeting change"}
    }
  }
});
if (result.stopReason !== "stop") throw new Error(result.errorMessage || result.stopReason);
text(result);
return result.answers.scheduling"""
    result = run(cm, code)
    assert result["status"] == "completed" and result["value"] is True
    ((op, model, request),) = provider.calls
    assert (op, model.provider, model.id) == ("classify", "acme", "judge-1")
    assert request.state == {"subject": "Move tomorrow's meeting to Friday"}
    q = request.questions["scheduling"]
    assert (q.type, q.instructions, q.criteria) == (
        "bool",
        "Does this request change a meeting?",
        {"true": "A meeting change is requested", "false": "No meeting change"},
    )
    assert '"stopReason":"stop"' in result["output"][0]["text"]


def test_classify_sends_each_question_type_and_images_and_gets_typed_answers(cm, provider):
    code = f"""const [m] = await models.getAvailableOfType("classifier");
return await models.classify(m, {{
  state: {{ticket: "refund please", n: 3}},
  images: [{{type: "image", mimeType: "image/png", data: "{PNG}"}}],
  questions: {{
    topic: {{type: "choice", instructions: "Which team?", criteria: {{billing: "money", support: "help"}}}},
    urgency: {{type: "score", instructions: "How urgent?", criteria: ["not", "somewhat", "very"]}},
    tone: {{type: "score", instructions: "Tone?", criteria: {{calm: "calm", angry: "angry"}}}},
    spam: {{type: "bool", instructions: "Spam?", criteria: {{true: "spam", false: "not spam"}}}},
  }},
}})"""
    result = value(cm, code)
    assert result == {
        "stopReason": "stop",
        "answers": {"topic": "billing", "urgency": 2, "tone": "calm", "spam": True},
        "usage": {"inputTokens": 100, "outputTokens": 7, "operations": 1},
    }
    ((_, _, request),) = provider.calls
    assert request.images == [ImageBlock(mime_type="image/png", data=PNG)]
    assert request.questions["urgency"].criteria == ["not", "somewhat", "very"]


MALFORMED = {
    "a joined string model": ('"acme/judge-1"', "{state: {}, questions: {q: Q}}", "not a joined"),
    "a model with an endpoint": (
        '{provider: "acme", id: "judge-1", baseUrl: "http://evil"}',
        "{state: {}, questions: {q: Q}}",
        "no custom endpoints",
    ),
    "an image model": (
        '{provider: "acme", id: "paint-1", type: "image"}',
        "{state: {}, questions: {q: Q}}",
        "not a classifier",
    ),
    "no context": ("M", "undefined", "context must be an object"),
    "state not an object": ("M", '{state: "x", questions: {q: Q}}', "context.state must be an object"),
    "state an array": ("M", "{state: [], questions: {q: Q}}", "context.state must be an object"),
    "no questions": ("M", "{state: {}}", "non-empty object of questions"),
    "empty questions": ("M", "{state: {}, questions: {}}", "non-empty object of questions"),
    "questions an array": ("M", "{state: {}, questions: [Q]}", "non-empty object of questions"),
    "no instructions": (
        "M",
        '{state: {}, questions: {q: {type: "bool", criteria: Q.criteria}}}',
        "instructions must be",
    ),
    "unknown question type": (
        "M",
        '{state: {}, questions: {q: {type: "rank", instructions: "x", criteria: {}}}}',
        'type must be "choice", "score" or "bool"',
    ),
    "bool without false": (
        "M",
        '{state: {}, questions: {q: {type: "bool", instructions: "x", criteria: {true: "y"}}}}',
        '"true" and "false" mean',
    ),
    "bool with extra": (
        "M",
        '{state: {}, questions: {q: {type: "bool", instructions: "x", criteria: {true: "y", false: "n", maybe: "m"}}}}',
        '"true" and "false" mean',
    ),
    "choice without labels": (
        "M",
        '{state: {}, questions: {q: {type: "choice", instructions: "x", criteria: {}}}}',
        "labels and what each means",
    ),
    "choice with a non-string meaning": (
        "M",
        '{state: {}, questions: {q: {type: "choice", instructions: "x", criteria: {a: 1}}}}',
        "non-empty string",
    ),
    "score with one level": (
        "M",
        '{state: {}, questions: {q: {type: "score", instructions: "x", criteria: ["only"]}}}',
        "from low to high",
    ),
    "an image that is a URL": (
        "M",
        '{state: {}, questions: {q: Q}, images: [{type: "image", mimeType: "image/png", data: "https://x/y.png"}]}',
        "base64 image block",
    ),
    "an image of another type": (
        "M",
        '{state: {}, questions: {q: Q}, images: [{type: "image", mimeType: "image/svg+xml", data: "AAAA"}]}',
        "base64 image block",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_classify_arguments_reject_before_any_provider_call(cm, provider, case):
    model, context, message = MALFORMED[case]
    code = f"""const Q = {{type: "bool", instructions: "Is it?", criteria: {{true: "y", false: "n"}}}};
const M = {{provider: "acme", id: "judge-1", type: "classifier"}};
try {{ await models.classify({model}, {context}); return "resolved" }}
catch (e) {{ return e.name + ": " + e.message }}"""
    got = value(cm, code)
    assert got.startswith("TypeError: models.classify(model, context): ") and message in got, got
    assert provider.calls == []


def test_classify_of_a_model_no_provider_lists_rejects(cm, provider):
    got = error(
        cm,
        Q + 'return await models.classify({provider: "acme", id: "judge-9"}, {state: {}, questions: {q: Q}})',
    )
    assert "unknown classifier model 'acme' 'judge-9'" in got
    assert provider.calls == []


def test_a_provider_failure_is_an_error_result_never_a_thrown_host_error(cm, provider):
    provider.fail = RuntimeError("quota exceeded for key ****")
    got = value(
        cm,
        CLASSIFY_ONE,
    )
    assert got["stopReason"] == "error" and "quota exceeded" in got["errorMessage"]
    assert "answers" not in got


def test_a_provider_timeout_is_an_aborted_result(cm, provider):
    provider.fail = TimeoutError("the model took too long")
    got = value(
        cm,
        CLASSIFY_ONE,
    )
    assert got["stopReason"] == "aborted" and "took too long" in got["errorMessage"]


@pytest.mark.parametrize(
    "answers", [{}, {"q": "yes"}, {"q": 1}, {"q": True, "extra": 1}], ids=["missing", "string", "number", "extra"]
)
def test_an_answer_outside_the_criteria_is_an_error_result(cm, provider, answers):
    provider.answers = answers
    got = value(
        cm,
        CLASSIFY_ONE,
    )
    if answers == {"q": True, "extra": 1}:  # extra keys are dropped, the asked ones kept
        assert got["stopReason"] == "stop" and got["answers"] == {"q": True}
    else:
        assert got["stopReason"] == "error" and "malformed" in got["errorMessage"]


def test_a_provider_returning_something_else_is_an_error_result():
    class Wrong(Recorder):
        async def classify(self, model: Model, request: ClassifyRequest) -> Any:
            return {"answers": {"q": True}}

    with CodeMode({"enabled": True, "workers": 1}, models=[Wrong()]) as cm:
        got = value(
            cm,
            CLASSIFY_ONE,
        )
    assert got == {"stopReason": "error", "errorMessage": "the model provider returned dict, not ClassifyResult"}


def test_a_sync_provider_runs_on_a_thread():
    class Sync(Recorder):
        def classify(self, model: Model, request: ClassifyRequest) -> ClassifyResult:  # type: ignore[override]
            return ClassifyResult(answers={"q": threading.current_thread() is not threading.main_thread()})

    with CodeMode({"enabled": True, "workers": 1}, models=[Sync()]) as cm:
        got = value(
            cm,
            CLASSIFY_ONE,
        )
    assert got["answers"] == {"q": True}


# ---- images --------------------------------------------------------------------------------------


def test_the_seed_image_example_puts_the_generated_image_and_text_in_the_outputs(cm, provider):
    code = """const available = await models.getAvailableOfType("image");
if (!available.length) { text("No configured image model is available"); exit(); }
const result = await models.generateImages(available[0], {
  input: [{type: "text", text: "A simple blue bird icon on white"}]
});
if (result.stopReason !== "stop") throw new Error(result.errorMessage || result.stopReason);
for (const part of result.output) {
  if (part.type === "image") image(part);
  else if (part.type === "text") text(part.text);
}"""
    result = run(cm, code)
    assert result["status"] == "completed", result
    assert result["output"] == [
        {"type": "image", "mimeType": "image/png", "data": PNG},
        {"type": "text", "text": "a blue bird"},
    ]
    ((op, model, request),) = provider.calls
    assert (op, model.id) == ("images", "paint-1")
    assert request.input == [TextBlock(text="A simple blue bird icon on white")]


def test_generate_images_takes_base64_image_blocks_as_references(cm, provider):
    code = f"""const [m] = await models.getAvailableOfType("image");
return (await models.generateImages(m, {{input: [{{type: "text", text: "like this"}},
  {{type: "image", mimeType: "image/png", data: "{PNG}"}}]}})).stopReason"""
    assert value(cm, code) == "stop"
    assert provider.calls[0][2].input[1] == ImageBlock(mime_type="image/png", data=PNG)


@pytest.mark.parametrize(
    "context",
    [
        "undefined",
        "{}",
        "{input: []}",
        '{input: "a bird"}',
        f'{{input: [{{type: "image", mimeType: "image/png", data: "{PNG}"}}]}}',
        '{input: [{type: "text", text: ""}]}',
        '{input: [{type: "url", url: "https://x"}]}',
    ],
    ids=["none", "empty", "no-parts", "string", "images-only", "empty-text", "url"],
)
def test_malformed_image_requests_reject_before_any_provider_call(cm, provider, context):
    got = value(
        cm,
        f'try {{ await models.generateImages({{provider: "acme", id: "paint-1"}}, {context}); return "resolved" }}'
        " catch (e) { return e.message }",
    )
    assert got.startswith("models.generateImages(model, context): "), got
    assert provider.calls == []


def test_a_classifier_cannot_generate_images(cm, provider):
    got = value(
        cm,
        'try { await models.generateImages({provider: "acme", id: "judge-1"}, {input: [{type: "text", text: "x"}]}) }'
        " catch (e) { return e.message }",
    )
    assert "unknown image model 'acme' 'judge-1'" in got
    assert provider.calls == []


# ---- limits, usage, the gate ---------------------------------------------------------------------


def test_at_most_four_classify_or_image_operations_run_at_once_per_cell(cm, provider):
    provider.delay_s = 0.05
    code = (
        Q
        + """const [m] = await models.getAvailableOfType("classifier");
const [p] = await models.getAvailableOfType("image");
const jobs = [];
for (let i = 0; i < 7; i++) jobs.push(models.classify(m, {state: {i}, questions: {q: Q}}));
for (let i = 0; i < 5; i++) jobs.push(models.generateImages(p, {input: [{type: "text", text: "n" + i}]}));
const done = await Promise.all(jobs);
return done.filter(r => r.stopReason === "stop").length"""
    )
    assert value(cm, code) == 12
    assert provider.peak == 4
    assert len(provider.calls) == 12
    # Queued in call order: the guest starts them first come, first served.
    assert [c[2].state["i"] for c in provider.calls if c[0] == "classify"] == list(range(7))


def test_model_usage_is_added_to_the_cells_telemetry_over_its_exec_and_waits():
    slow = Recorder(delay_s=0.4)
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 150}, models=[slow]) as cm:
        s = cm.session()
        code = (
            Q
            + """const [m] = await models.getAvailableOfType("classifier");
const [p] = await models.getAvailableOfType("image");
const a = await models.classify(m, {state: {}, questions: {q: Q}});
const b = await models.generateImages(p, {input: [{type: "text", text: "x"}]});
return [a.stopReason, b.stopReason]"""
        )
        first = s.exec({"code": code})
        assert first["status"] == "waiting"
        result = first
        while result["status"] == "waiting":
            result = s.wait({"runId": result["runId"]})
        assert result["status"] == "completed" and result["value"] == ["stop", "stop"]
        assert result["telemetry"]["modelUsage"] == {
            "inputTokens": 112,
            "outputTokens": 7,
            "images": 1,
            "operations": 2,
        }
        plain = s.exec({"code": "return 1"})
        assert "modelUsage" not in plain["telemetry"]
        listing = s.exec({"code": 'return (await models.getModelsOfType("image")).length'})
        assert listing["value"] == 1 and "modelUsage" not in listing["telemetry"]  # no operation yet


def test_classify_passes_the_hook_as_a_call_of_models_provider_classify(provider):
    seen: list[tuple[str, str, str]] = []

    def hook(event: Any) -> Any:
        seen.append((event.tool_id, event.name, event.source))
        return Block("no classifying today") if event.tool_id.endswith(":classify") else None

    with CodeMode({"enabled": True, "workers": 1}, models=[provider], before_tool_call=hook) as cm:
        got = error(
            cm,
            CLASSIFY_ONE,
        )
        assert "tool call blocked: no classifying today" in got
        assert (
            value(
                cm,
                DRAW_ONE.replace("return await", "return (await") + ").stopReason",
            )
            == "stop"
        )
    assert seen == [
        ("models:acme:classify", "models.classify", "models"),
        ("models:acme:images", "models.generateImages", "models"),
    ]
    assert [c[0] for c in provider.calls] == ["images"]


def test_a_deny_pattern_keeps_an_operation_from_its_provider(provider):
    with CodeMode({"enabled": True, "workers": 1}, models=[provider], deny=["models:*:images"]) as cm:
        got = error(
            cm,
            DRAW_ONE,
        )
        assert "does not permit models:acme:images" in got
    assert provider.calls == []


def test_a_provider_must_have_the_whole_interface_and_a_unique_name():
    from codemode import ConfigError

    with pytest.raises(ConfigError, match="a model provider has a name"):
        CodeMode({"enabled": True}, models=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="two model providers are named 'acme'"):
        CodeMode({"enabled": True}, models=[Recorder(), Recorder()])


def test_models_calls_replay_from_the_journal_without_asking_the_provider_again():
    import os
    import signal

    gate = threading.Event()

    class Held(Recorder):
        async def classify(self, model: Model, request: ClassifyRequest) -> ClassifyResult:
            result = await super().classify(model, request)
            await asyncio.to_thread(gate.wait, 10)
            return result

    held = Held()
    with CodeMode({"enabled": True, "workers": 1, "timeoutMs": 200}, models=[held]) as own:
        s = own.session()
        code = (
            Q
            + """const [m] = await models.getAvailableOfType("classifier");
const a = await models.classify(m, {state: {n: 1}, questions: {q: Q}});
const b = await models.classify(m, {state: {n: 2}, questions: {q: Q}});
return [a.answers.q, b.answers.q]"""
        )
        first = s.exec({"code": code})
        assert first["status"] == "waiting"
        killed = own.inspect().worker_pids
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        gate.set()
        result = first
        while result["status"] == "waiting":
            result = s.wait({"runId": result["runId"]})
        assert result["status"] == "completed" and result["value"] == [True, True], result
        assert not set(killed) & set(own.inspect().worker_pids)  # the run's runtime was rebuilt elsewhere
    assert [c[2].state["n"] for c in held.calls] == [1, 2]  # each asked once, the replay served the first


def test_a_model_or_image_whose_getters_change_is_read_once(cm, provider):
    code = (
        Q
        + f"""let reads = 0;
const sneaky = {{get provider() {{ return reads++ === 0 ? "acme" : "elsewhere" }}, id: "judge-1"}};
let seen = 0;
const img = {{type: "image", get mimeType() {{ return seen++ === 0 ? "image/png" : "text/html" }}, data: "{PNG}"}};
return (await models.classify(sneaky, {{state: {{}}, questions: {{q: Q}}, images: [img]}})).stopReason"""
    )
    assert value(cm, code) == "stop"
    ((_, model, request),) = provider.calls
    assert model.provider == "acme" and request.images[0].mime_type == "image/png"


def test_a_hook_rewrite_is_checked_again_in_the_host(provider):
    from codemode import Rewrite

    def hook(event: Any) -> Any:
        context = dict(event.input["context"])
        if event.name == "models.classify":
            context["questions"] = {"q": {**BOOL_QUESTION, "criteria": {"yes": "y"}}}
        else:
            context["input"] = [{"type": "image", "mimeType": "text/html", "data": "PGI+"}]
        return Rewrite({**event.input, "context": context})

    with CodeMode({"enabled": True, "workers": 1}, models=[provider], before_tool_call=hook) as cm:
        assert "question 'q' has no criteria of the shape a bool question needs" in error(cm, CLASSIFY_ONE)
        assert "models: malformed request" in error(cm, DRAW_ONE)
    assert provider.calls == []
