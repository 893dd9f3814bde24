"""The docs name only code and files the repository has.

``docs/architecture.md`` walks a newcomer through the code, one step per function, each cited as
`` `path/to/file.py: Class.method` `` (Python), `` `path/to/file.rs: Type::method` `` or
`` `path/to/file.rs: fn_name` `` (Rust), `` `path/to/file.js: name` `` (JavaScript). A rename or
a move that leaves the guide behind fails here, naming the citation. Every doc (README,
CHANGELOG, docs/, benches/README.md) is also held to the files it mentions: a path under one of
the repository's top-level directories must exist, and a bare file name (``supervisor.py``) must
be the name of some file in the repository.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "architecture.md"
DOCS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benches" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
#: The top-level directories a path in a doc is read as relative to (build outputs aside:
#: ``dist/``, ``site/``, ``target/`` hold what ``make`` writes).
TOP_DIRS = ("python", "rust", "tests", "benches", "tools", "docs")
#: Directories whose files never count as the repository's.
NOT_SOURCE = {".git", ".venv", "target", "site", "dist", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"}
#: File names docs mention that are no file of the repository, on purpose.
NOT_FILES = {"cell.js"}  # the script name QuickJS gives a cell in its stack traces
#: Words docs write that read like paths and are none: MCP method names.
NOT_PATHS = {"tools/call", "tools/list"}

#: A citation: `path: Name`, `path: Class.method` or `path: Type::method`.
CITATION = re.compile(r"`((?:python|rust|tests|benches|tools)/[\w./-]+\.(?:py|rs|js)): ([A-Za-z_][\w.:]*)`")
#: Anything written like a citation (a path that does not start at the repository root too).
CITATION_LIKE = re.compile(r"`([\w./-]+\.(?:py|rs|js)): ([A-Za-z_][\w.:]*)`")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) + r")/(?:[\w.*-]|\{[\w,.]+\}|/)*[\w*}/])")
BARE_NAME = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|pyi|rs|js|sh|toml|yml|md))(?![\w/-])")


def _expand(path: str) -> list[str]:
    """``rust/worker/src/{main,worker}.rs`` as the paths it stands for."""
    brace = re.search(r"\{([^}]*)\}", path)
    if brace is None:
        return [path]
    return [
        expanded
        for part in brace.group(1).split(",")
        for expanded in _expand(path[: brace.start()] + part + path[brace.end() :])
    ]


def _exists(path: str) -> bool:
    """Every path ``path`` stands for exists (a ``*`` matches as a glob)."""
    return all(any(ROOT.glob(p.rstrip("/"))) if "*" in p else (ROOT / p).exists() for p in _expand(path))


# ---- what a file defines ---------------------------------------------------------------------
def _python_names(source: str) -> set[str]:
    """Module-level functions, classes and constants, and ``Class.member`` for the functions,
    properties and attributes of each class (nested classes too: ``Outer.Inner.method``)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(prefix + node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(prefix + node.name)
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.Assign):
                names.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(prefix + node.target.id)

    visit(ast.parse(source).body, "")
    return names


def _without_literals(source: str) -> str:
    """Rust source with comments, strings and char literals blanked (braces in them would
    unbalance the blocks); lifetimes (``'a``) are kept."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\\\'\n])\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def _rust_block(source: str, opening: int) -> str:
    """The text of the ``{...}`` block whose ``{`` is at ``opening``."""
    depth = 0
    for at in range(opening, len(source)):
        if source[at] == "{":
            depth += 1
        elif source[at] == "}":
            depth -= 1
            if depth == 0:
                return source[opening : at + 1]
    return source[opening:]


def _rust_defines(source: str, name: str) -> bool:
    """``fn_name``, a type or a const (``Type``), or ``Type::method`` (a ``fn`` inside one of the
    ``impl ... Type`` blocks)."""
    code = _without_literals(source)
    if "::" not in name:
        item = r"\b(?:fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s+" + re.escape(name) + r"\b"
        return re.search(item, code) is not None
    owner, _, method = name.rpartition("::")
    impl = re.compile(r"\bimpl\b(?:<[^{;]*?>)?\s+(?:[\w:<>, ']+\s+for\s+)?" + re.escape(owner) + r"\b[^{;]*\{")
    fn = re.compile(r"\bfn\s+" + re.escape(method) + r"\b")
    return any(fn.search(_rust_block(code, m.end() - 1)) for m in impl.finditer(code))


def _js_defines(source: str, name: str) -> bool:
    declared = r"\b(?:(?:async\s+)?function\*?\s+|const\s+|let\s+|var\s+)" + re.escape(name) + r"\b"
    return re.search(declared, source) is not None


@functools.cache
def _source(path: str) -> str:
    return (ROOT / path).read_text()


def citation_problem(path: str, name: str) -> str | None:
    """Why `path: name` cites something that is not there, or None."""
    if not (ROOT / path).is_file():
        return f"{path}: no such file"
    source = _source(path)
    if path.endswith(".py"):
        found = name in _python_names(source)
    elif path.endswith(".rs"):
        found = _rust_defines(source, name)
    else:
        found = "." not in name and ":" not in name and _js_defines(source, name)
    return None if found else f"{path}: defines no {name}"


def citations(text: str) -> list[tuple[str, str]]:
    return CITATION.findall(text)


# ---- the guide -------------------------------------------------------------------------------
def _walk_throughs() -> dict[str, str]:
    text = GUIDE.read_text()
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {
        heading: body
        for heading, body in zip(parts[1::2], parts[2::2], strict=True)
        if heading.startswith("## Walk-through")
    }


def test_the_guide_has_four_walk_throughs_of_numbered_cited_steps():
    walks = _walk_throughs()
    assert len(walks) == 4, list(walks)
    for heading, body in walks.items():
        steps = re.findall(r"^\d+\. ", body, re.M)
        assert len(steps) >= 6, f"{heading}: {len(steps)} numbered steps"
        assert len(citations(body)) >= 10, f"{heading}: {len(citations(body))} citations"


def test_every_function_the_guide_cites_is_defined_where_it_says():
    cited = citations(GUIDE.read_text())
    assert len(cited) >= 60
    loose = set(CITATION_LIKE.findall(GUIDE.read_text())) - set(cited)
    assert not loose, f"citations must give the path from the repository root: {sorted(loose)}"
    problems = [problem for path, name in sorted(set(cited)) if (problem := citation_problem(path, name))]
    assert not problems, "docs/architecture.md cites what is not there:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("python/codemode/dispatch.py", "Dispatcher.no_such_method"),
        ("python/codemode/dispatch.py", "NoSuchClass.submit"),
        ("python/codemode/no_such_module.py", "Dispatcher"),
        ("rust/worker/src/worker.rs", "Worker::no_such_fn"),
        ("rust/worker/src/worker.rs", "Engine::handle"),  # a fn of another impl
        ("rust/engine/src/engine.rs", "no_such_fn"),
        ("rust/engine/src/prelude.js", "noSuchFunction"),
    ],
)
def test_the_check_refuses_a_citation_of_what_is_not_there(path: str, name: str):
    assert citation_problem(path, name) is not None


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("python/codemode/dispatch.py", "Dispatcher.submit"),
        ("python/codemode/fleet.py", "KILL_GRACE_S"),
        ("rust/worker/src/worker.rs", "Worker::handle"),
        ("rust/engine/src/engine.rs", "Engine::settle"),
        ("rust/engine/src/engine.rs", "install_prelude"),
        ("rust/engine/src/prelude.js", "callTool"),
    ],
)
def test_the_check_finds_what_is_there(path: str, name: str):
    assert citation_problem(path, name) is None


def test_the_readme_layout_points_to_the_guide_and_mkdocs_lists_it():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    assert "docs/architecture.md" in layout
    assert re.search(r"^\s*- [\w ]+: architecture\.md$", (ROOT / "mkdocs.yml").read_text(), re.M)


# ---- every doc -------------------------------------------------------------------------------
@functools.cache
def _file_names() -> frozenset[str]:
    names: set[str] = set()
    for _, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in NOT_SOURCE]
        names.update(files)
    return frozenset(names)


def path_problems(text: str) -> list[str]:
    """The paths and file names ``text`` mentions that the repository does not have."""
    problems = [f"no such path: {path}" for path in PATH.findall(text) if path not in NOT_PATHS and not _exists(path)]
    names = _file_names()
    problems += [
        f"no file is named {name}" for name in BARE_NAME.findall(text) if name not in names and name not in NOT_FILES
    ]
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_doc_mentions_only_files_the_repository_has(doc: Path):
    problems = path_problems(doc.read_text())
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n".join(sorted(set(problems)))


def test_the_path_check_refuses_what_is_not_there():
    assert path_problems("see `python/codemode/_worker.py`") == ["no such path: python/codemode/_worker.py"]
    assert path_problems("rust/worker/src/{main,nowhere}.rs") == ["no such path: rust/worker/src/{main,nowhere}.rs"]
    assert path_problems("the pool (pool_checkout.rs)") == ["no file is named pool_checkout.rs"]
    assert path_problems("`rust/worker/src/{main,worker}.rs`, tests/hostile, supervisor.py") == []
