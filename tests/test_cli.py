"""The ``codemode`` command as a user runs it: a subprocess, its exit status, stdout and stderr.

What the command line names and cannot be used (a cell file, a ``--tools`` module or attribute,
an optional extra, a config file) is one ``codemode: error:`` line and exit status 2, never a
traceback. A missing extra is simulated in the child: a meta-path finder refuses the extra's
modules, as Python does when they are not installed.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import codemode
import pytest
from codemode.extras import EXTRA_OF_MODULE

TESTS = Path(__file__).resolve().parent
PACKAGE = Path(codemode.__file__).resolve().parent

#: Runs ``python -m codemode <argv>`` with the modules in argv[1] (comma-separated) not installed.
WITHOUT = r"""
import importlib.abc, runpy, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

ABSENT = set(sys.argv[1].split(","))
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["codemode", *sys.argv[2:]]
runpy.run_module("codemode", run_name="__main__", alter_sys=True)
"""


def codemode_cli(*argv: str | Path, absent: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["-c", WITHOUT, absent] if absent else ["-m", "codemode"]
    return subprocess.run(
        [sys.executable, *prefix, *map(str, argv)],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (and that it was refused that way)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("codemode: error: "), line
    return line.removeprefix("codemode: error: ")


@pytest.fixture
def cell(tmp_path: Path) -> Path:
    path = tmp_path / "cell.js"
    path.write_text("return 40 + 2")
    return path


def test_version_is_the_installed_distributions():
    assert codemode.__version__ == version("codemode")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", codemode.__version__)
    proc = codemode_cli("--version")
    assert (proc.returncode, proc.stdout) == (0, f"codemode {codemode.__version__}\n")


def test_python_dash_m_codemode_runs_a_cell_and_prints_its_result(cell: Path):
    proc = codemode_cli("exec", cell)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["status"], result["value"]) == ("completed", 42)


def test_a_cell_that_fails_exits_1_with_its_result(tmp_path: Path):
    path = tmp_path / "throws.ts"
    path.write_text("const n: number = 1; throw new Error('no ' + n)")
    proc = codemode_cli("exec", path)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["status"] == "failed"
    assert "no 1" in result["error"]


def test_exec_with_config_gives_the_cell_the_mcp_servers_tools(tmp_path: Path, cell: Path):
    config = tmp_path / "servers.json"
    server = {"command": sys.executable, "args": [str(TESTS / "mcp_named_server.py"), "lookup"]}
    config.write_text(json.dumps({"mcpServers": {"named": server}}))
    cell.write_text("return (await MCP.named.lookup({})).content[0].text")
    proc = codemode_cli("exec", cell, "--config", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["value"] == "lookup"
    assert proc.stderr == ""


def test_exec_warns_of_an_mcp_server_that_cannot_start_and_runs_the_cell(tmp_path: Path, cell: Path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"gone": {"command": str(tmp_path / "no-such-server")}}}))
    proc = codemode_cli("exec", cell, "--config", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["value"] == 42
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("codemode: warning: ")]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("codemode: warning: MCP server 'gone' is unavailable: "), warnings
    assert "Traceback" not in proc.stderr


def test_a_missing_cell_file_is_one_line(tmp_path: Path):
    missing = tmp_path / "nope.js"
    assert refused(codemode_cli("exec", missing)) == f"cannot read the cell {missing}: No such file or directory"


def test_a_cell_file_that_is_not_utf8_is_one_line(tmp_path: Path):
    path = tmp_path / "latin1.js"
    path.write_bytes(b"return '\xe9'")
    assert refused(codemode_cli("exec", path)).startswith(f"cannot read the cell {path}: not UTF-8")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:tools", "--tools no_such_module_here:tools: cannot import no_such_module_here: "),
        ("json:no_such_attr", "--tools json:no_such_attr: module json has no attribute 'no_such_attr'"),
        ("json", "--tools expects module:attr, got 'json'"),
    ],
)
def test_a_tools_spec_that_cannot_be_loaded_is_one_line(cell: Path, spec: str, message: str):
    assert refused(codemode_cli("exec", cell, "--tools", spec)).startswith(message)


def test_a_tools_module_whose_own_import_fails_is_one_line(tmp_path: Path, cell: Path):
    (tmp_path / "my_tools.py").write_text("import not_installed_anywhere\n")
    line = refused(codemode_cli("exec", cell, "--tools", "my_tools:TOOLS", cwd=tmp_path))
    assert line == "--tools my_tools:TOOLS: cannot import my_tools: No module named 'not_installed_anywhere'"


@pytest.mark.parametrize("command", ["exec", "serve"])
def test_a_bad_config_file_is_one_line(tmp_path: Path, cell: Path, command: str):
    args = [cell] if command == "exec" else []
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"servers": []}))
    assert refused(codemode_cli(command, *args, "--config", config)) == (
        f"{config} has no `mcpServers` (or VS Code `servers`) object"
    )
    config.write_text("{not json")
    assert refused(codemode_cli(command, *args, "--config", config)).startswith(f"cannot read MCP config {config}: ")
    entry = {"mcpServers": {"time": {"command": "x", "transportType": "websocket"}}}
    config.write_text(json.dumps(entry))
    assert refused(codemode_cli(command, *args, "--config", config)).startswith(
        "MCP server 'time': 'transportType' must be one of "
    )


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["exec", "{cell}", "--config", "{config}"], "mcp,anyio"),  # the MCP client
        (["serve", "--config", "{config}"], "mcp,anyio"),  # the MCP server
        (["serve"], "mcp_types"),  # the SDK's types package alone
    ],
)
def test_a_missing_mcp_extra_names_the_extra_to_install(tmp_path: Path, cell: Path, argv: list[str], absent: str):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"named": {"command": sys.executable}}}))
    args = [a.format(cell=cell, config=config) for a in argv]
    line = refused(codemode_cli(*args, absent=absent))
    assert re.fullmatch(
        r"No module named '[\w.]+': this needs the 'mcp' extra \(pip install 'codemode\[mcp\]'\)", line
    ), line


def test_a_missing_mcp_extra_for_a_library_mcp_server_is_named_too(tmp_path: Path, cell: Path):
    # CodeMode({"mcpServers": ...}) imports codemode.mcp, whose first import is anyio.
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"named": {"command": sys.executable}}}))
    (tmp_path / "lib_tools.py").write_text(
        "from codemode import CodeMode\n"
        "def register(cm):\n"
        "    CodeMode({'mcpServers': {'s': {'command': 'x'}}}).close()\n"
    )
    line = refused(codemode_cli("exec", cell, "--tools", "lib_tools:register", absent="anyio", cwd=tmp_path))
    assert line == "No module named 'anyio': this needs the 'mcp' extra (pip install 'codemode[mcp]')"


def test_a_tools_module_needing_a_missing_extra_names_it(tmp_path: Path, cell: Path):
    (tmp_path / "model_tools.py").write_text("import pydantic\nTOOLS = []\n")
    line = refused(codemode_cli("exec", cell, "--tools", "model_tools:TOOLS", absent="pydantic", cwd=tmp_path))
    assert line == "No module named 'pydantic': this needs the 'pydantic' extra (pip install 'codemode[pydantic]')"


def _third_party_imports() -> set[str]:
    """The top-level modules the package imports that are neither stdlib nor codemode."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "codemode"}


def test_every_optional_import_is_mapped_to_a_declared_extra():
    # pyproject.toml, not the installed metadata: an editable install's is as old as its build.
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in project["dependencies"]}
    assert core == {"msgspec", "fastjsonschema"}
    assert _third_party_imports() - core == set(EXTRA_OF_MODULE)
    declared = set(project["optional-dependencies"])
    assert set(EXTRA_OF_MODULE.values()) <= declared, set(EXTRA_OF_MODULE.values()) - declared


def test_the_docs_name_only_flags_the_command_has():
    # Every `codemode <subcommand> ... --flag` line in the README and docs/ against --help.
    pages = [PACKAGE.parents[1] / "README.md", *sorted((PACKAGE.parents[1] / "docs").glob("*.md"))]
    lines = [m for page in pages for m in re.findall(r"codemode (exec|serve|run) ([^#\n]*)", page.read_text())]
    helps = {command: codemode_cli(command, "--help").stdout for command in {"exec", "serve", "run"}}
    seen = {command for command, _ in lines}
    assert seen == {"exec", "serve", "run"}, seen
    for command, rest in lines:
        for flag in re.findall(r"--[a-z][a-z-]*", rest):
            assert flag in helps[command], (command, flag, rest)


#: A library user's ``CodeMode`` with an MCP server, in a child where the mcp extra is absent.
LIBRARY_WITHOUT_MCP = r"""
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"mcp", "mcp_types", "anyio"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from codemode import CodeMode
try:
    CodeMode({"mcpServers": {"s": {"command": "true"}}})
except ImportError as e:
    print(e.name, "|", e)
"""


def test_a_library_user_without_the_mcp_extra_is_told_to_install_it():
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY_WITHOUT_MCP], capture_output=True, text=True, timeout=120, check=True
    )
    name, _, message = proc.stdout.strip().partition(" | ")
    assert name in {"mcp", "mcp_types", "anyio"}
    assert message.endswith("this needs the 'mcp' extra (pip install 'codemode[mcp]')"), message
