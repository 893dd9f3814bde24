"""`tools/bytecodes.py` (the host's bytecodes per step, a measure this VM's noise cannot move)
runs, and reports each step it names with the functions that ran most of it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bytecodes.py"


def test_bytecodes_tool_counts_each_step_and_its_busiest_functions():
    done = subprocess.run(
        [sys.executable, str(TOOL), "--rounds", "2", "--top", "3"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    steps = re.findall(r"^(\S.*): ([\d,]+) bytecodes$", done.stdout, re.MULTILINE)
    assert [name for name, _ in steps] == [
        "exec, trivial",
        "exec, ten tool calls",
        "exec that yields",
        "wait answering it",
    ]
    assert all(int(count.replace(",", "")) > 0 for _, count in steps)
    # ten tool calls run more of the host than one trivial cell
    counts = {name: int(count.replace(",", "")) for name, count in steps}
    assert counts["exec, ten tool calls"] > counts["exec, trivial"]
    assert len(re.findall(r"^ +[\d,]+  \S+\.py:\S+$", done.stdout, re.MULTILINE)) == 4 * 3
