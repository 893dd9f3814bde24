"""The README's examples are real code: each runs here as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def run_example(heading: str) -> dict[str, object]:
    """Runs the first Python block under ``heading``; returns the names it defined."""
    text = README.read_text()
    assert heading in text, f"the README lost its {heading!r} section"
    example = re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S)
    assert example is not None, f"the README lost the example under {heading!r}"
    namespace: dict[str, object] = {}
    exec(compile(example.group(1), "README.md", "exec"), namespace)
    return namespace


def test_readme_usage_example_runs_as_written():
    assert run_example("## Use")["result"]["status"] == "completed"  # type: ignore[index]


@pytest.mark.parametrize(
    "heading",
    [
        "### Concurrency",
        "### Waiting and resuming",
        "### The catalog, policy and namespaces",
        "### Long outputs",
        "### Approvals that pause a run",
        "### Defining tools",
        "### Batches",
        "### Observability",
        "### A run store shared by host processes",
        "### Workers on a Ray cluster",
        "### Models and sub-agents",
    ],
)
def test_readme_section_example_runs_as_written(heading: str):
    run_example(heading)
