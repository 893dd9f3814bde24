"""Smoke test of the built wheel: install it into a fresh venv and run one cell.

Skipped unless a wheel already exists in ``dist/`` or ``CODEMODE_WHEEL_TEST=1``
is set; with the variable set, the wheel is (re)built first via ``make wheel``
(a no-op when it is up to date). ``make test`` sets the variable.

The fresh venv is created outside the repository and the check runs with
``cwd`` in a temporary directory, ``python -I`` and no ``PYTHONPATH``, so it
can only import ``codemode`` from the installed wheel, never from the
in-tree ``python/`` sources or the dev ``.venv``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
FORCED = os.environ.get("CODEMODE_WHEEL_TEST") == "1"


def _wheels() -> list[Path]:
    return sorted(DIST.glob("codemode-*.whl"), key=lambda p: p.stat().st_mtime)


pytestmark = pytest.mark.skipif(
    not (FORCED or _wheels()),
    reason="no wheel in dist/ (run `make wheel`, or set CODEMODE_WHEEL_TEST=1 to build one)",
)

# Environment variables that could leak the dev checkout or dev venv into the
# fresh interpreter (or re-enter the parent make's jobserver).
_SCRUB = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
)

CHECK = r"""
import json, sys
import codemode, codemode._engine, codemode.workers
with codemode.CodeMode() as cm:
    result = cm.session().exec({"code": "return 1+1"})
print(json.dumps({
    "codemode": codemode.__file__,
    "engine": codemode._engine.__file__,
    "worker": str(codemode.workers.WORKER_BINARY),
    "path": sys.path,
    "result": result,
}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


@pytest.fixture(scope="module")
def wheel() -> Path:
    if FORCED:
        make = shutil.which("make")
        if make is None:
            pytest.fail("CODEMODE_WHEEL_TEST=1 but `make` is not on PATH")
        _run([make, "-s", "wheel"], cwd=ROOT, timeout=3000)
    wheels = _wheels()
    if not wheels:
        pytest.fail("no codemode-*.whl in dist/ after `make wheel`")
    return wheels[-1]


PT_INTERP = 3


def _program_headers(elf: bytes) -> list[int]:
    """The types of a 64-bit little-endian ELF file's program headers (PT_INTERP: it asks for a
    dynamic loader)."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, elf[:6]
    offset, size, count = struct.unpack_from("<Q", elf, 0x20)[0], *struct.unpack_from("<HH", elf, 0x36)
    return [struct.unpack_from("<I", elf, offset + i * size)[0] for i in range(count)]


@pytest.mark.timeout(3600)
def test_wheel_installs_into_fresh_venv_and_runs(wheel: Path, tmp_path: Path) -> None:
    assert "abi3" in wheel.name, wheel.name
    assert "manylinux" in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        worker_mode = zf.getinfo("codemode/codemode-worker").external_attr >> 16
        worker = zf.read("codemode/codemode-worker")
    extensions = [n for n in names if n.startswith("codemode/_engine") and n.endswith(".so")]
    assert extensions == ["codemode/_engine.abi3.so"], extensions
    assert "codemode/__init__.py" in names
    assert "codemode/_worker.py" not in names  # the worker is the binary: no Python in it
    assert worker_mode & 0o111 == 0o111, oct(worker_mode)  # pip keeps the executable bits
    # The worker binary is linked statically: it needs no glibc (nor any library) where it runs.
    assert _program_headers(worker) and PT_INTERP not in _program_headers(worker)
    assert not re.search(rb"GLIBC_\d+\.\d+", worker)

    base = shutil.which("python3") or sys.executable
    venv = tmp_path / "venv"
    work = tmp_path / "work"
    work.mkdir()
    _run([base, "-m", "venv", str(venv)], cwd=work, timeout=300)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", str(wheel)], cwd=work, timeout=900)

    proc = _run([str(py), "-I", "-c", CHECK], cwd=work, timeout=300)
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    site = venv.resolve()
    for key in ("codemode", "engine", "worker"):
        assert Path(report[key]).resolve().is_relative_to(site), (key, report[key])
    src = str(ROOT / "python")
    assert not any(p and Path(p).resolve() == Path(src).resolve() for p in report["path"]), report["path"]

    result = report["result"]
    assert result["status"] == "completed", result
    assert result["value"] == 2, result

    # The wheel carries the license (PEP 639: pyproject's license-files), and pip installs it.
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], names
    (installed,) = venv.glob("lib/python*/site-packages/codemode-*.dist-info/licenses/LICENSE")
    assert installed.read_text() == (ROOT / "LICENSE").read_text()
    # The console script and python -m codemode both run, and say the wheel's version.
    expected = f"codemode {wheel.name.split('-')[1]}\n"
    assert _run([str(venv / "bin" / "codemode"), "--version"], cwd=work, timeout=60).stdout == expected
    assert _run([str(py), "-I", "-m", "codemode", "--version"], cwd=work, timeout=60).stdout == expected
