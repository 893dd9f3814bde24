"""Counts the Python bytecodes the host runs for each step of a few cells.

    .venv/bin/python tools/bytecodes.py [--rounds N] [--top N]

A measure of host work that this VM's noise cannot move: the same path runs the same bytecodes,
and after a pause (a model's turn) each costs ~40-130 ns here, its code and data gone cold, so a
step's host time tracks its count. Timings need side-by-side runs to be read; this needs one.

Steps, each run warm (after warm-up rounds) on an idle worker, its bytecodes counted with
``sys.settrace`` opcode events: a trivial ``exec``, an ``exec`` that yields and the ``wait`` that
answers it, and an ``exec`` of ten sequential tool calls. ``--top`` lists the functions that run
the most of each step's bytecodes.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from codemode import CodeMode, Session

TRIVIAL = "return 1 + 1"
YIELDS = "await yield_control('pause'); return 1"
TEN_CALLS = "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t"
WARMUP = 50


def counted(step: Callable[[], Any]) -> tuple[Any, collections.Counter[tuple[str, str]]]:
    """What ``step()`` returns, and the bytecodes it ran by (file, function)."""
    ran: collections.Counter[tuple[str, str]] = collections.Counter()

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            ran[(code.co_filename.rsplit("/", 1)[-1], code.co_name)] += 1
        return trace

    sys.settrace(trace)
    try:
        value = step()
    finally:
        sys.settrace(None)
    return value, ran


def measure(session: Session, rounds: int) -> dict[str, collections.Counter[tuple[str, str]]]:
    """Each step's bytecodes by function, summed over ``rounds`` runs of it."""
    steps: dict[str, collections.Counter[tuple[str, str]]] = collections.defaultdict(collections.Counter)

    def once(record: bool) -> None:
        for name, code in (("exec, trivial", TRIVIAL), ("exec, ten tool calls", TEN_CALLS)):
            result, ran = counted(lambda code=code: session.exec({"code": code}))
            assert result["status"] == "completed", result
            if record:
                steps[name] += ran
        waiting, ran = counted(lambda: session.exec({"code": YIELDS}))
        assert waiting["status"] == "waiting", waiting
        done, ran_wait = counted(lambda: session.wait({"runId": waiting["runId"]}))
        assert done["status"] == "completed", done
        if record:
            steps["exec that yields"] += ran
            steps["wait answering it"] += ran_wait

    for _ in range(WARMUP):
        once(record=False)
    for _ in range(rounds):
        once(record=True)
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=0, help="list the N functions running most of each step")
    args = parser.parse_args(argv)
    with CodeMode({"workers": 1}) as cm:

        @cm.tool
        def double(x: int) -> int:
            return x * 2

        steps = measure(cm.session("bytecodes"), args.rounds)
    for name, ran in steps.items():
        print(f"{name}: {sum(ran.values()) / args.rounds:,.0f} bytecodes")
        for (filename, function), count in ran.most_common(args.top):
            print(f"    {count / args.rounds:8,.0f}  {filename}:{function}")


if __name__ == "__main__":
    main()
