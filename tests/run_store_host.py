"""A host process on a shared run store, driven by a test over its stdin/stdout.

    python tests/run_store_host.py <run store target> <tool log path> <timeoutMs> [<extra tool name>]

It builds a ``CodeMode(runs=target)`` with the tools the run store tests use, then answers one
JSON command per line with one JSON line: ``{"op": "exec"|"wait"|"cancel", "session", ...}``
runs that call and answers its result; ``{"op": "wait_later", ...}`` starts a ``wait`` on a thread
and answers at once (the test kills this process while it runs); ``{"op": "race", "runs": [...]}``
waits on every run in turn until each is over, answering what it saw. Every tool call appends
``<host> <tag>`` to the tool log, so a test can count how often each call really ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
from typing import Any

from codemode import CodeMode
from codemode.runs import BUSY


def main() -> None:
    target, log_path = sys.argv[1], sys.argv[2]
    timeout_ms = int(sys.argv[3])
    extra = sys.argv[4] if len(sys.argv) > 4 else None
    name = f"host-{os.getpid()}"
    cm = CodeMode({"timeoutMs": timeout_ms, "workers": 1}, runs=target)

    def log(tag: str) -> None:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"{name} {tag}\n")

    @cm.tool(read_only=True)
    async def slow(tag: str, ms: int = 300) -> str:
        """Waits ``ms`` milliseconds (I/O, as agent tools do), then answers with its tag."""
        await asyncio.sleep(ms / 1000)
        log(tag)
        return tag

    if extra is not None:

        @cm.tool(name=extra)
        def other() -> int:
            """A tool only this host has (its catalog differs)."""
            return 1

    def answer(value: Any) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    answer({"ready": name})
    for line in sys.stdin:
        command = json.loads(line)
        op, session = command["op"], cm.session(command.get("session", "s1"))
        if op == "exec":
            answer(session.exec({"code": command["code"], "restartSafe": command.get("restartSafe", False)}))
        elif op == "wait":
            answer(session.wait({"runId": command["runId"]}))
        elif op == "wait_later":
            threading.Thread(target=session.wait, args=({"runId": command["runId"]},), daemon=True).start()
            answer({"started": True})
        elif op == "cancel":
            answer({"cancelled": session.cancel(command["runId"])})
        elif op == "race":
            answer(race(cm, command["runs"], command["at_least"]))
    cm.close()


def race(cm: CodeMode, runs: list[tuple[str, str]], at_least: int) -> dict[str, Any]:
    """Waits on each ``(run id, session)``, in random order, until every run is over here or
    elsewhere and at least ``at_least`` waits were made: the statuses seen per run
    (``completed``, ``failed:<error>``, ``busy``, ``gone``, ``waiting``), and the waits made."""
    sessions = dict(runs)
    seen: dict[str, list[str]] = {run_id: [] for run_id in sessions}
    left = set(sessions)
    waits = 0
    while left or waits < at_least:
        for run_id in random.sample(sorted(left or sessions), len(left or sessions)):
            result = cm.session(sessions[run_id]).wait({"runId": run_id})
            waits += 1
            status = result["status"]
            if status == "failed":
                error = result["error"]
                status = "busy" if error == BUSY else "gone" if "unavailable" in error else f"failed:{error}"
            seen[run_id].append(status)
            if status in ("gone", "completed") or status.startswith("failed:"):
                left.discard(run_id)
    return {"seen": seen, "waits": waits}


if __name__ == "__main__":
    main()
