"""The public API is a list you can test: every name the README's code imports from `codemode`
(or reaches as `codemode.X`) is in `codemode.__all__`, and every name there imports."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import codemode

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_code() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def imported_names(code: str) -> set[str]:
    """Names of ``from codemode import a, b as c`` and of ``codemode.X`` in ``code``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module == "codemode":
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "codemode":
            names.add(node.attr)
    return names


def is_submodule(name: str) -> bool:
    try:
        importlib.import_module(f"codemode.{name}")
    except ImportError:
        return False
    return True


def test_imported_names_reads_every_import_form():
    code = "from codemode import A, B as C\nfrom codemode import (\n    D,\n    E,\n)\nx = codemode.F(codemode.g)\n"
    assert imported_names(code) == {"A", "B", "D", "E", "F", "g"}


def test_every_name_the_readme_imports_from_codemode_is_public():
    used = set().union(*(imported_names(code) for code in readme_code()))
    assert "CodeMode" in used  # the README still has its examples
    missing = sorted(name for name in used if name not in codemode.__all__ and not is_submodule(name))
    assert not missing, f"the README uses names codemode.__all__ lacks: {missing}"


def test_every_public_name_imports():
    broken = []
    for name in codemode.__all__:
        try:
            getattr(codemode, name)
        except AttributeError:
            broken.append(name)
    assert not broken, f"codemode.__all__ names that do not import: {broken}"
    assert sorted(dir(codemode)) == sorted(codemode.__all__)


def test_a_name_outside_the_public_api_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="module 'codemode' has no attribute 'Supervisor'"):
        codemode.Supervisor  # noqa: B018
