"""`exec`/`wait` results have TypedDicts (`codemode.results`): the keys real results carry are
the ones declared, and a user's type checker narrows on `status` and catches a wrong key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from codemode import (
    CodeMode,
    CompletedResult,
    ExecResult,
    FailedResult,
    PendingToolCall,
    ResultTelemetry,
    WaitingResult,
)
from codemode.models import ModelUsage
from codemode.outcomes import Completed, ImageOutput, JsonOutput, Telemetry, TextOutput
from codemode.results import ErrorCode, ImageOutputItem, JsonOutputItem, TextOutputItem

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
SHAPES = {"completed": CompletedResult, "waiting": WaitingResult, "failed": FailedResult}
OUTPUTS = {"text": TextOutputItem, "json": JsonOutputItem, "image": ImageOutputItem}


def check_shape(value: dict[str, Any], shape: Any) -> None:
    keys = set(value)
    assert shape.__required_keys__ <= keys, (shape.__name__, value)
    assert keys <= shape.__required_keys__ | shape.__optional_keys__, (shape.__name__, value)


def check_result(result: dict[str, Any]) -> None:
    check_shape(result, SHAPES[result["status"]])
    check_shape(result["telemetry"], ResultTelemetry)
    for item in result.get("output", []):
        check_shape(item, OUTPUTS[item["type"]])
    for call in result.get("pendingToolCalls", []):
        check_shape(call, PendingToolCall)
    if "code" in result:
        assert result["code"] in get_args(ErrorCode)


@pytest.fixture(scope="module")
def cm():
    with CodeMode({"workers": 1, "timeoutMs": 300}, require_approval=["deploy"]) as cm:

        @cm.tool(read_only=True)
        def slow() -> int:
            import time

            time.sleep(0.6)
            return 1

        @cm.tool
        def deploy(env: str) -> str:
            return env

        yield cm


CELLS = [
    f"text('t'); json({{a: 1}}); console.log('l'); image('data:image/png;base64,{PNG}'); return 1",
    "text('before'); throw new Error('mine')",
    "while (true) {}",
    "text('asking'); await yield_control('why')",
    "return await tools.slow({})",
    "return await tools.deploy({env: 'prod'})",
]


@pytest.mark.parametrize("code", CELLS)
def test_each_result_has_the_declared_keys_and_no_others(cm, code):
    result = cm.session("shapes").exec({"code": code})
    check_result(result)  # type: ignore[arg-type]


def test_the_cells_cover_every_shape_and_optional_key(cm):
    session = cm.session("cover")
    seen: set[tuple[str, str]] = set()
    results = [session.exec({"code": code}) for code in CELLS]
    results.append(session.exec({"code": "return await tools.slow({})", "restartSafe": True}))
    for result in results:
        seen |= {(result["status"], key) for key in result}
        seen |= {("call", key) for call in result.get("pendingToolCalls", []) for key in call}
    declared = {(status, key) for status, shape in SHAPES.items() for key in shape.__annotations__}
    declared |= {("call", key) for key in PendingToolCall.__annotations__}
    assert declared <= seen, declared - seen


def test_a_type_checker_narrows_on_status_and_catches_a_wrong_key(tmp_path: Path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from codemode import CodeMode, ExecResult

            def total(cm: CodeMode) -> float:
                result: ExecResult = cm.session("s").exec({"code": "return 1"})
                while result["status"] == "waiting":
                    result = cm.session("s").wait({"runId": result["runId"], "answer": None})
                if result["status"] == "failed":
                    raise RuntimeError(result["error"], result.get("code"))
                return float(result["value"]) + result["telemetry"]["durationMs"]

            async def wrong(cm: CodeMode) -> object:
                result = await cm.session("s").exec_async({"code": "return 1"})
                return result["value"]
            """
        )
    )
    # In a process of its own: mypy raises the interpreter's recursion limit, which the hostile
    # corpus's deep values depend on.
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "c")]
    proc = subprocess.run([*command, str(snippet)], capture_output=True, text=True, timeout=300, check=False)
    out, status = proc.stdout, proc.returncode
    errors = [line.split(": ", 1)[1] for line in out.splitlines() if ": error: " in line]
    assert errors == [
        'error: TypedDict "WaitingResult" has no key "value"  [typeddict-item]',
        'error: TypedDict "FailedResult" has no key "value"  [typeddict-item]',
    ], out
    assert status == 1


def test_exec_result_is_the_union_of_the_three_shapes():
    assert set(get_args(ExecResult)) == {CompletedResult, WaitingResult, FailedResult}


TELEMETRIES = [
    Telemetry(12.5, 3, 1, 2, 4096, 7, {"host": 5, "mcp": 2}, ["exec", "wait", "direct_one"]),
    Telemetry(0.5, 0, 0, 0, 0, 0, {}, ["exec", "wait"], ModelUsage(input_tokens=3, images=1)),
]
OUTPUT_LISTS = [[], [TextOutput("a"), JsonOutput({"b": [1, None]}), ImageOutput("image/png", PNG)]]
CONTAINER_RESULTS = [
    Completed(value, telemetry, output)
    for value in ({"records": [{"id": 1}]}, [1, [2, {"a": None}]], {}, [])
    for telemetry in TELEMETRIES
    for output in OUTPUT_LISTS
]


@pytest.mark.parametrize("result", CONTAINER_RESULTS)
def test_a_completed_value_handed_over_as_it_is_is_the_generic_conversion(result: Any):
    """`Completed.to_dict` hands a dict or list value over as it is (not walked and copied
    again) and converts the rest: key for key, in the same order and types, what
    `msgspec.to_builtins` makes of the whole struct; the telemetry's dict and list are the
    result's own."""
    shown = result.to_dict()
    generic = msgspec.to_builtins(result)
    assert msgspec.json.encode(shown) == msgspec.json.encode(generic)  # (keys, order and types)
    assert shown["value"] is result.value
    check_result(shown)
    shown["telemetry"]["catalogSources"]["host"] = -1
    shown["telemetry"]["modelVisibleTools"].append("x")
    assert result.telemetry.catalog_sources.get("host") != -1
    assert result.telemetry.model_visible_tools[-1] != "x"
