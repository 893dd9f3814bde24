"""Bounded fuzzing (``make fuzz``): the engine under libFuzzer, the worker-frame reader under
hypothesis, each for ``FUZZ_SECONDS`` (default 60); prints executions, seconds and crashes.

* ``engine``: the cargo-fuzz target in ``rust/engine/fuzz`` (harness: ``rust/engine/fuzz/src/lib.rs``).
  cargo-fuzz is installed into ``.tools/`` (pinned), the target is built with AddressSanitizer
  on the stable toolchain through ``RUSTC_BOOTSTRAP=1`` (``FUZZ_SANITIZER=none`` skips it; a
  failed ASan build falls back to none, and says so). Seeds: the hostile corpus
  (``tests/hostile/corpus.py``) and a few bridge cells, written at run time into
  ``target/fuzz/seeds``; the working corpus and artifacts stay under ``target/fuzz`` too.
* ``deep``: the cargo-fuzz target ``deep`` in the same crate: deep and large sources (every
  construct class that makes a parser or visitor recurse, repeated up to 65,535 times and
  nested, up to 4 MiB) and values nested up to 65,535 deep sent out every way (return, json,
  tool input, store, console, yield), through the front end and the engine; seeds are its
  regression inputs (``rust/engine/fuzz/regressions-deep/``) and one input per construct.
* ``frames``: ``tests/frame_fuzz.py``'s property over the host's ``WorkerProcess.take``.
* ``worker``: the same module's property over the worker binary (rust/worker) fed any stream a
  host could write: frames back or an exit (0 or 1), never a panic, a signal or a hang.

A crash becomes a committed regression input: ``rust/engine/fuzz/regressions/`` or
``regressions-deep/`` (replayed by ``cargo test``: ``rust/engine/tests/fuzz_regressions.rs``),
or ``tests/fuzz_regressions/frames/`` and ``worker/`` (replayed by ``tests/test_frame_fuzz.py``). The command
fails if it found any crash.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FUZZ_DIR = ROOT / "rust" / "engine" / "fuzz"
WORK = ROOT / "target" / "fuzz"
TOOLS = ROOT / ".tools"
CARGO_FUZZ_VERSION = "0.13.2"
ENGINE_REGRESSIONS = FUZZ_DIR / "regressions"
DEEP_REGRESSIONS = FUZZ_DIR / "regressions-deep"
#: The deep target's nesting fragments (``NESTERS`` in rust/engine/fuzz/src/lib.rs): a seed
#: per fragment index below this bound.
DEEP_NESTERS = 37
FRAME_REGRESSIONS = ROOT / "tests" / "fuzz_regressions" / "frames"
WORKER_REGRESSIONS = ROOT / "tests" / "fuzz_regressions" / "worker"
#: libFuzzer's per-input limit: well past any slice the harness gives the guest (24 x 80 ms).
UNIT_TIMEOUT_S = 20

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


@dataclass
class Figures:
    target: str
    execs: int = 0
    seconds: float = 0.0
    crashes: list[Path] = field(default_factory=list)
    timeouts: list[Path] = field(default_factory=list)
    note: str = ""


def log(message: str) -> None:
    print(f">> {message}", flush=True)


# ---- engine seeds ---------------------------------------------------------------------------
# The harness's input format (rust/engine/fuzz/src/lib.rs): two header bytes, the source, 0xFE,
# settle operations. Header: tool catalog, 4 MiB, 50 ms slices, 16 pending calls | 4 KiB output,
# 64 KiB bridge.
SOURCE_END = b"\xfe"
JS, TS = 0xF4, 0xF5
LIMITS = 0x09
SETTLE_ALL = 5  # op: every pending call gets `null`


def batch(*settlements: tuple[int, bool, bytes]) -> bytes:
    """One settle batch of 1-4 settlements: (id choice byte, ok, payload bytes) each."""
    out = bytes([((len(settlements) - 1) % 4) << 3])
    for choice, ok, payload in settlements:
        out += bytes([choice])
        if choice & 3 == 2:
            out += b"\x00\x00\x00\x00"  # a never-issued id (0)
        out += bytes([0 if ok else 1]) + payload
    return out


# Id choices: the first pending call, the first issued call, a never-issued id, the previous id
# again. Payload choices: b"\x08" is the dictionary's "1", b"\x10" '"s"', b"\x38" "1e400",
# b"\x06" one byte past the bridge, b"\x07" + two bytes a deep (unbalanced) array.
PENDING_0, ISSUED_0, NEVER, AGAIN = 0, 1, 2, 3
BRIDGE_CELLS: list[tuple[int, str, bytes]] = [
    (
        JS,
        "const [a, b] = await Promise.all([tools.echo({value: 1}), tools.echo({value: 2})]); return [a, b]",
        batch((PENDING_0, True, b"\x08"), (AGAIN, True, b"\x10"), (NEVER, False, b"\x00"))
        + batch((PENDING_0, True, b"\x06"))
        + bytes([SETTLE_ALL]),
    ),
    (
        TS,
        "const x: number = (await tools.callValue('host:core:echo', {value: 1})) as number; return x + 1",
        batch((PENDING_0, True, b"\x38")) + bytes([SETTLE_ALL]),
    ),
    (JS, "const r = await yield_control('why'); text(String(r)); return r", batch((PENDING_0, False, b"\x10"))),
    (JS, "store('k', {a: [1]}); const v = load('k'); exit(); return v", b""),
    (JS, "return [await MCP.srv.fetch({url: 'u'}), await Issues.list({q: 1}), API.list('mcp')]", bytes([5, 5, 7])),
    (
        JS,
        "const o = {toJSON() { return tools.echo({value: this}) }}; return await tools.echo({value: o})",
        batch((PENDING_0, True, b"\x07\xc8\x0a")) + bytes([SETTLE_ALL, SETTLE_ALL]),
    ),
    (
        JS,
        "for (let i = 0; i < 100; i++) tools.echo({value: i}); return 1",
        bytes([SETTLE_ALL, 6]) + batch((ISSUED_0, True, b"\x08")),
    ),
]


def engine_seeds(into: Path) -> int:
    """Writes the seeds (named by content hash, as libFuzzer names its files); returns how many."""
    from tests.hostile.corpus import CORPUS

    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    seeds = [
        bytes([JS, LIMITS]) + c.code.encode() + SOURCE_END + bytes([SETTLE_ALL] * 6) for c in CORPUS if not c.isolated
    ]
    seeds += [bytes([lang, LIMITS]) + code.encode() + SOURCE_END + ops for lang, code, ops in BRIDGE_CELLS]
    for seed in seeds:
        (into / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    return len(seeds)


def deep_seeds(into: Path) -> int:
    """The deep target's seeds: its regression inputs, and each nesting fragment 2,000 deep
    inside an array 300 deep (byte layout: ``rust/engine/fuzz/src/lib.rs``, ``deep``)."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    seeds = [p.read_bytes() for p in sorted(DEEP_REGRESSIONS.iterdir())]
    seeds += [bytes([lang, 0, 0x2C, 0x01, k, 0xD0, 0x07]) + SOURCE_END for k in range(DEEP_NESTERS) for lang in (0, 1)]
    seeds += [bytes([2, 0x10, 0x27, way]) for way in range(8)]
    for seed in seeds:
        (into / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    return len(seeds)


# ---- engine: build and run ------------------------------------------------------------------
def cargo_fuzz_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{TOOLS / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["RUSTC_BOOTSTRAP"] = "1"  # cargo-fuzz's -Z flags on the stable toolchain
    return env


def ensure_cargo_fuzz(env: dict[str, str]) -> None:
    probe = subprocess.run(["cargo", "fuzz", "--version"], env=env, capture_output=True, text=True)
    if probe.returncode == 0 and CARGO_FUZZ_VERSION in probe.stdout:
        return
    log(f"installing cargo-fuzz {CARGO_FUZZ_VERSION} into {TOOLS.relative_to(ROOT)}/")
    subprocess.run(
        ["cargo", "install", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION, "--locked", "--root", str(TOOLS)],
        env=env,
        check=True,
    )


def build_engine(env: dict[str, str], sanitizer: str, target: str) -> tuple[Path, str]:
    """Builds the target (release + debug assertions); returns its path and the sanitizer used."""
    for attempt in dict.fromkeys([sanitizer, "none"]):
        log(f"cargo fuzz build {target} (sanitizer: {attempt})")
        command = ["cargo", "fuzz", "build", target, "--fuzz-dir", str(FUZZ_DIR), "--target-dir", str(WORK)]
        command += ["--sanitizer", attempt]
        if subprocess.run(command, env=env, cwd=ROOT).returncode == 0:
            host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
            triple = re.search(r"^host: (\S+)", host, re.M)
            binary = WORK / (triple.group(1) if triple else "") / "release" / target
            return binary, attempt
        log(f"the {attempt} build failed" + ("; retrying without a sanitizer" if attempt != "none" else ""))
    raise SystemExit("cannot build the engine fuzz target")


def fuzz_engine(seconds: float, sanitizer: str, target: str = "engine") -> Figures:
    env = cargo_fuzz_env()
    ensure_cargo_fuzz(env)
    binary, used = build_engine(env, sanitizer, target)
    figures = Figures(target, note=f"libFuzzer, sanitizer: {used}")
    seeds, corpus, artifacts = WORK / "seeds" / target, WORK / "corpus" / target, WORK / "artifacts" / target
    if target == "deep":
        log(f"{deep_seeds(seeds)} seeds: the deep regressions and one per nesting construct")
    else:
        log(f"{engine_seeds(seeds)} seeds from tests/hostile and the bridge cells")
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    # libFuzzer stops at the first crash: start it again (the corpus it grew is kept) until the
    # time is up, without the input that crashed.
    while (left := seconds - (time.monotonic() - start)) >= 1:
        command = [
            str(binary),
            str(corpus),
            str(seeds),
            f"-max_total_time={int(left)}",
            f"-timeout={UNIT_TIMEOUT_S}",
            "-max_len=8192",
            # The deep target builds sources of up to 4 MiB from short inputs.
            "-rss_limit_mb=2048" if target == "engine" else "-rss_limit_mb=4096",
            "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/",
        ]
        log(" ".join(command))
        proc = subprocess.run(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, errors="replace")
        tail = proc.stderr.splitlines()
        executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
        figures.execs += int(executed.group(1)) if executed else 0
        found = [Path(p) for p in re.findall(r"Test unit written to (\S+)", proc.stderr)]
        if proc.returncode == 0 and not found:
            print("\n".join(tail[-6:]), flush=True)
            break
        print("\n".join(tail[-40:]), flush=True)
        if not found:
            raise SystemExit(f"the engine fuzzer exited with {proc.returncode} and wrote no artifact")
        for artifact in dict.fromkeys(found):
            (figures.timeouts if artifact.name.startswith(("timeout-", "slow-unit-")) else figures.crashes).append(
                artifact
            )
            digest = artifact.name.split("-")[-1]
            for directory in (corpus, seeds):
                (directory / digest).unlink(missing_ok=True)
    figures.seconds = time.monotonic() - start
    if figures.crashes:
        regressions = DEEP_REGRESSIONS if target == "deep" else ENGINE_REGRESSIONS
        regressions.mkdir(parents=True, exist_ok=True)
        for artifact in figures.crashes:
            shutil.copy(artifact, regressions / artifact.name)
    return figures


# ---- frames ---------------------------------------------------------------------------------
def fuzz_frames(seconds: float) -> Figures:
    import tracemalloc

    import frame_fuzz
    from hypothesis import HealthCheck, given, settings

    figures = Figures("frames", note="hypothesis over WorkerProcess.take")
    failing: list[bytes] = []

    def checked(data: bytes, chunks: list[int], expected: list[Any] | None = None) -> None:
        figures.execs += 1
        try:
            frame_fuzz.check_stream(data, chunks, expected)
        except BaseException:
            failing.append(data)  # hypothesis replays the shrunk example last
            raise

    batch = settings(
        max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False
    )

    @batch
    @given(frame_fuzz.streams)
    def any_stream(stream: tuple[bytes, list[int]]) -> None:
        checked(*stream)

    @batch
    @given(frame_fuzz.good_streams)
    def good_stream(stream: tuple[list[Any], list[int]]) -> None:
        checked(frame_fuzz.encode_frames(stream[0]), stream[1], expected=stream[0])

    def traced_stream() -> None:
        # The allocation bound (tracemalloc makes every read ~4x slower: one batch in three).
        tracemalloc.start()
        try:
            any_stream()
        finally:
            tracemalloc.stop()

    return _rotate(figures, [any_stream, good_stream, traced_stream], failing, FRAME_REGRESSIONS, seconds)


def _rotate(figures: Figures, rotation: list[Any], failing: list[bytes], regressions: Path, seconds: float) -> Figures:
    """Runs the hypothesis batches in turn for ``seconds``; a failing input is kept in ``regressions``."""
    start = time.monotonic()
    turn = 0
    while time.monotonic() - start < seconds:
        failing.clear()
        try:
            rotation[turn % len(rotation)]()
        except BaseException as e:  # a property failure: keep the input, go on searching
            if isinstance(e, KeyboardInterrupt):
                raise
            traceback.print_exception(e, limit=3)
            data = failing[-1] if failing else b""
            path = regressions / f"{hashlib.sha1(data).hexdigest()}.bin"
            regressions.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if path not in figures.crashes:
                figures.crashes.append(path)
        turn += 1
    figures.seconds = time.monotonic() - start
    return figures


# ---- the worker binary ----------------------------------------------------------------------
def fuzz_worker(seconds: float) -> Figures:
    import frame_fuzz
    from hypothesis import HealthCheck, given, settings

    figures = Figures("worker", note="hypothesis over the codemode-worker binary's stdin")
    failing: list[bytes] = []

    def checked(data: bytes, chunks: list[int], expected: list[Any] | None = None) -> None:
        figures.execs += 1
        try:
            frame_fuzz.check_worker(data, chunks, expected)
        except BaseException:
            failing.append(data)
            raise

    batch = settings(
        max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False
    )

    @batch
    @given(frame_fuzz.host_streams)
    def any_stream(stream: tuple[bytes, list[int]]) -> None:
        checked(*stream)

    @batch
    @given(frame_fuzz.good_host_streams)
    def good_stream(stream: tuple[list[Any], list[int]]) -> None:
        checked(frame_fuzz.encode_frames(stream[0]), stream[1], expected=stream[0])

    return _rotate(figures, [any_stream, good_stream], failing, WORKER_REGRESSIONS, seconds)


def main() -> int:
    seconds = float(os.environ.get("FUZZ_SECONDS", "60"))
    sanitizer = os.environ.get("FUZZ_SANITIZER", "address")
    results = [fuzz_engine(seconds, sanitizer), fuzz_engine(seconds, sanitizer, "deep")]
    log(f"frames: hypothesis for {seconds:g} s")
    results.append(fuzz_frames(seconds))
    log(f"worker: hypothesis for {seconds:g} s")
    results.append(fuzz_worker(seconds))
    print()
    print(f"{'target':<8} {'execs':>10} {'seconds':>8} {'crashes':>8} {'timeouts':>9}  how")
    for f in results:
        print(f"{f.target:<8} {f.execs:>10} {f.seconds:>8.1f} {len(f.crashes):>8} {len(f.timeouts):>9}  {f.note}")
    for f in results:
        for path in f.crashes:
            print(f"crash ({f.target}): {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        for path in f.timeouts:
            print(f"timeout ({f.target}, not a regression input): {path}")
    crashed = any(f.crashes for f in results)
    if crashed:
        print("crashing inputs were copied into the regression corpora: commit them with the fix")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
