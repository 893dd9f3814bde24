"""The README's usage example is real code: it runs here as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_usage_example_runs_as_written():
    text = README.read_text()
    usage = text[text.index("## Use") :]
    example = re.search(r"```python\n(.*?)```", usage, re.S)
    assert example is not None, "the README lost its usage example"
    namespace: dict[str, object] = {}
    exec(compile(example.group(1), "README.md", "exec"), namespace)
    assert namespace["result"]["status"] == "completed"  # type: ignore[index]


def test_readme_concurrency_example_runs_as_written():
    text = README.read_text()
    section = text[text.index("### Concurrency") :]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None, "the README lost its concurrency example"
    exec(compile(example.group(1), "README.md", "exec"), {})


def test_readme_long_output_example_runs_as_written():
    text = README.read_text()
    section = text[text.index("### Long outputs") :]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None, "the README lost its long-output example"
    exec(compile(example.group(1), "README.md", "exec"), {})


def test_readme_approval_example_runs_as_written():
    text = README.read_text()
    section = text[text.index("### Approvals that pause a run") :]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None, "the README lost its approval example"
    exec(compile(example.group(1), "README.md", "exec"), {})
