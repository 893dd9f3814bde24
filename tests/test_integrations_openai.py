"""The OpenAI tool formats, checked against the `openai` package's own types."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from codemode import CodeMode
from codemode.surfaces import SURFACES, to_openai, to_openai_responses
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter


@pytest.fixture(scope="module")
def cm() -> Any:
    with CodeMode({"enabled": True, "workers": 1}) as cm:

        @cm.tool(owner="weather")
        def forecast(city: str, days: int | None = None) -> dict[str, str]:
            """Forecast for a city."""
            return {"city": city}

        yield cm


def conforms(value: Any, param: Any) -> None:
    """``value`` validates as the TypedDict ``param`` and has no key it does not declare."""
    TypeAdapter(param).validate_python(value, strict=True)
    assert set(value) <= set(get_type_hints(param)), sorted(set(value) - set(get_type_hints(param)))


@pytest.mark.parametrize("surface", SURFACES)
def test_responses_tools_are_openai_function_tool_params(cm, surface):
    for tool in to_openai_responses(cm.model_tools(surface)):
        conforms(tool, FunctionToolParam)


@pytest.mark.parametrize("surface", SURFACES)
def test_chat_completions_tools_are_openai_chat_function_tool_params(cm, surface):
    for tool in to_openai(cm.model_tools(surface)):
        conforms(tool, ChatCompletionFunctionToolParam)
        conforms(tool["function"], get_type_hints(ChatCompletionFunctionToolParam)["function"])


def test_responses_exec_is_strict_and_a_schema_strict_mode_refuses_is_not(cm):
    rendered = {t["name"]: t for t in to_openai_responses(cm.model_tools("code"))}
    assert rendered["exec"]["strict"] is True and rendered["wait"]["strict"] is True
    tool_call = {t["name"]: t for t in to_openai_responses(cm.model_tools("tool_search"))}["tool_call"]
    assert tool_call["strict"] is False
