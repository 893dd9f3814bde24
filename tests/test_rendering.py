"""What the model reads of a result (`codemode.rendering.render`) and `Session.handle_async`."""

from __future__ import annotations

import asyncio
import json

import pytest
from codemode import CodeMode, Session
from codemode.policy import Block, ToolCallEvent
from codemode.rendering import Image, render

PNG = "iVBORw0KGgoAAAANSUhEUg=="


@pytest.fixture(scope="module")
def session() -> Session:
    cm = CodeMode({"enabled": True, "workers": 1, "timeoutMs": 5000})

    @cm.tool(owner="billing")
    def invoices_list(paid: bool | None = None) -> list[dict[str, object]]:
        """List invoices."""
        return [{"id": "i-1", "amount": 120.0, "paid": False}]

    yield cm.session("rendering")
    cm.close()


def test_a_completed_result_renders_as_its_status_and_value_only(session: Session):
    rendered = render(session.exec({"code": "return 40 + 2"}))
    assert rendered.text == '{"status":"completed","value":42}'
    assert rendered.images == [] and rendered.is_error is False


def test_a_completed_null_value_is_still_shown(session: Session):
    assert render(session.exec({"code": "return null"})).text == '{"status":"completed","value":null}'


def test_telemetry_is_rendered_only_when_asked_for(session: Session):
    result = session.exec({"code": "return 1"})
    assert "telemetry" not in json.loads(render(result).text)
    assert json.loads(render(result, telemetry=True).text)["telemetry"] == result["telemetry"]


def test_a_failed_cell_is_an_error_with_its_message_and_code(session: Session):
    refused = render(session.exec({"code": 42}))
    thrown = render(session.exec({"code": "throw new TypeError('nope')"}))
    assert refused.is_error is True
    assert json.loads(refused.text)["code"] == "invalid_input"
    assert json.loads(thrown.text) == {"status": "failed", "error": "TypeError: nope"}
    assert thrown.is_error is True


def test_a_waiting_result_renders_its_run_id_and_reason(session: Session):
    result = session.exec({"code": "await yield_control('ask the user'); return 'resumed'"})
    shown = json.loads(render(result).text)
    assert shown == {"status": "waiting", "runId": result["runId"], "reason": "yield"}
    assert render(session.wait({"runId": result["runId"]})).text == '{"status":"completed","value":"resumed"}'


def test_outputs_are_shown_and_image_data_moves_out_of_the_json(session: Session):
    result = session.exec({"code": f"console.log('hi'); image('data:image/png;base64,{PNG}'); return 1"})
    rendered = render(result)
    assert json.loads(rendered.text)["output"] == [
        {"type": "text", "text": "hi"},
        {"type": "image", "mimeType": "image/png"},
    ]
    assert PNG not in rendered.text
    assert rendered.images == [Image("image/png", PNG)]


def test_typed_results_render_like_their_dicts(session: Session):
    assert render(session.run("return 'x'")).text == '{"status":"completed","value":"x"}'


def test_another_surfaces_error_dict_is_an_error(session: Session):
    assert render(session.handle("tool_describe", {"id": "host:nope:nothing"})).is_error is True
    found = render(session.handle("tool_search", {"query": "invoices"}))
    assert found.is_error is False
    assert json.loads(found.text)["results"][0]["id"] == "host:billing:invoices_list"


def test_handle_async_runs_every_surfaces_calls_without_blocking_the_loop(session: Session):
    async def calls() -> list[dict[str, object]]:
        waiting = await session.handle_async("exec", {"code": "await yield_control('x'); return 2"})
        return [
            await session.handle_async("exec", {"code": "return (await tools.invoices_list({}))[0].amount"}),
            await session.handle_async("wait", {"runId": waiting["runId"]}),
            await session.handle_async("tool_search_code", {"code": "return 3"}),
            await session.handle_async("tool_call", {"id": "host:billing:invoices_list", "args": {"paid": False}}),
            await session.handle_async("no_such_tool", {}),
        ]

    summed, resumed, searched, called, unknown = asyncio.run(calls())
    assert summed["value"] == 120.0
    assert resumed["value"] == 2
    assert searched["value"] == 3
    assert called == {"tool": "host:billing:invoices_list", "result": [{"id": "i-1", "amount": 120.0, "paid": False}]}
    assert unknown == {"error": "unknown tool: no_such_tool"}


def test_handle_async_gives_the_models_exec_call_to_an_async_hook(make_codemode):
    async def hook(event: ToolCallEvent) -> Block | None:
        return Block("no cells today") if event.tool_kind == "code_mode_exec" else None

    cm = make_codemode({"enabled": True, "workers": 1}, before_tool_call=hook)
    cm.add_tool(lambda: 1, name="one", owner="t", description="One.")
    result = asyncio.run(cm.session().handle_async("exec", {"code": "return 1"}))
    assert (result["status"], result["error"]) == ("failed", "code mode exec blocked: no cells today")
