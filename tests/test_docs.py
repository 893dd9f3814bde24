"""The API reference (mkdocs.yml, docs/) covers the public API and builds without a warning.

``make docs`` builds it; here it is built into a temporary directory with ``--strict`` (never
``-q``, which hides the warnings strict mode counts), so a docstring griffe cannot read, a
cross-reference that points nowhere or a public name left out fails the suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import codemode
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_documents_every_public_name():
    documented = set(re.findall(r"^::: codemode\.(\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M))
    # (Module pages: the error tree, and the models.* provider interface's types.)
    assert documented - {"errors", "models"} == set(codemode.__all__)


def test_the_docs_build_strict_without_a_warning(tmp_path: Path):
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs tools are not installed (make docs)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    reference = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("CodeMode", "exec_async", "WorkerCrashed", "load_config"):
        assert name in reference, name
