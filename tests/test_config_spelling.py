"""Config keys and the `// @options` pragma take either spelling, camelCase or snake_case, from
one table (the structs' own fields); a key given both ways is refused."""

from __future__ import annotations

import time

import msgspec
import pytest
from codemode import CodeModeConfig, ConfigError, load_config
from codemode.cells import CellOptions
from codemode.config import either_spelling


def test_every_config_key_is_accepted_camel_and_snake_case():
    for field in msgspec.structs.fields(CodeModeConfig):
        if field.name in ("runtime", "mode", "languages", "mcp_servers", "enabled"):
            continue
        low, _ = (1, 0) if field.default is msgspec.NODEFAULT else (field.default, 0)
        camel = load_config({field.encode_name: low})
        snake = load_config({field.name: low})
        assert getattr(camel, field.name) == getattr(snake, field.name), field.name
    assert load_config({"mcp_servers": {"t": {"command": "x"}}}).mcp_servers == {"t": {"command": "x"}}


def test_snake_case_config_is_clamped_as_camel_case_is():
    assert load_config({"timeout_ms": 1}).timeout_ms == 100
    assert load_config({"timeoutMs": 1}).timeout_ms == 100
    mixed = load_config({"timeout_ms": 5000, "maxOutputBytes": 2048, "search_default_limit": 3})
    assert (mixed.timeout_ms, mixed.max_output_bytes, mixed.search_default_limit) == (5000, 2048, 3)


def test_a_config_key_given_both_ways_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^'timeout_ms' and 'timeoutMs' name the same setting: give it once$"):
        load_config({"timeout_ms": 5000, "timeoutMs": 6000})


@pytest.mark.parametrize("key", ["timeout_mS", "Timeout_ms", "timeoutms", "timeout-ms"])
def test_other_spellings_are_still_unknown_keys(key):
    with pytest.raises(ConfigError, match=f"unknown field `{key}`"):
        load_config({key: 5000})


def test_either_spelling_leaves_other_keys_to_the_struct():
    assert either_spelling({"timeoutMs": 1, "x_y": 2, 3: 4}, CellOptions) == {"timeout_ms": 1, "x_y": 2, 3: 4}


@pytest.fixture(scope="module")
def session():
    from codemode import CodeMode

    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def sleepy(ms: int) -> int:
            time.sleep(ms / 1000)
            return ms

        yield cm.session()


@pytest.mark.parametrize("key", ["timeout_ms", "timeoutMs"])
def test_options_pragma_takes_the_timeout_in_either_spelling(session, key):
    # Under the config's 10 s the 1 s call is drained within the exec; under the pragma's it is not.
    result = session.exec({"code": f'// @options: {{"{key}": 200}}\nreturn await tools.sleepy({{ms: 1000}})'})
    assert (result["status"], result["reason"]) == ("waiting", "pending_tools"), result
    while result["status"] == "waiting":  # each wait has the pragma's 200 ms too
        result = session.wait({"runId": result["runId"]})
    assert result["value"] == 1000


@pytest.mark.parametrize("key", ["max_output_tokens", "maxOutputTokens"])
def test_options_pragma_takes_the_text_budget_in_either_spelling(session, key):
    result = session.exec({"code": f'// @options: {{"{key}": 20}}\ntext("x".repeat(1000)); return 1'})
    assert any("cut by max_output_tokens" in o["text"] for o in result["output"]), result


def test_options_pragma_with_a_key_given_both_ways_is_invalid_input(session):
    result = session.exec({"code": '// @options: {"timeout_ms": 150, "timeoutMs": 200}\nreturn 1'})
    assert result["code"] == "invalid_input"
    assert result["error"] == (
        "invalid // @options pragma: 'timeout_ms' and 'timeoutMs' name the same setting: give it once"
    )


def test_options_pragma_nested_too_deeply_is_invalid_input(session):
    result = session.exec({"code": '// @options: {"x": ' + "[" * 100_000 + "]" * 100_000 + "}\nreturn 1"})
    assert (result["code"], result["error"]) == ("invalid_input", "invalid // @options pragma: nested too deeply")
