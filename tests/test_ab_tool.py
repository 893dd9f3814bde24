"""`tools/ab.py` (two trees' hosts timed round by round) runs each cell it is asked for in both
hosts and prints their medians and ratio; it refuses a cell it does not know."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "ab.py"


def test_ab_tool_times_each_cell_in_both_trees():
    done = subprocess.run(
        [sys.executable, str(TOOL), str(ROOT / "python"), "--rounds", "3", "--cells", "trivial,suspend,b2b"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^(\w+) +base +([\d.]+) µs  new +([\d.]+) µs  new/base ([\d.]+)$", done.stdout, re.MULTILINE)
    assert [row[0] for row in rows] == ["trivial", "suspend", "b2b"]
    for _, base, new, ratio in rows:
        assert float(base) > 0 and float(new) > 0
        assert abs(float(ratio) - float(new) / float(base)) < 0.02  # (the medians are printed rounded)


def test_ab_tool_refuses_an_unknown_cell():
    done = subprocess.run(
        [sys.executable, str(TOOL), str(ROOT / "python"), "--cells", "trivial,nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown cells ['nope']" in done.stderr
