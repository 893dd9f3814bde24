"""The ``codemode`` command (also ``python -m codemode``): run a cell file against tools from a
Python module or MCP servers, or serve code mode over MCP.

    codemode exec cell.ts --tools myapp.tools:register
    codemode exec cell.js --demo
    codemode exec cell.js --config servers.json
    codemode serve --config servers.json [--tools module:attr] [--http PORT [--token-file PATH]]
    codemode run cells.jsonl --tools module:attr [--config FILE] [--concurrency N] [--seed S] [--out FILE]
    codemode --version

``--tools module:attr`` names either a callable taking the ``CodeMode`` (it registers tools)
or an iterable of functions (each becomes a tool). ``--config`` is an MCP client config file
(``mcpServers``); its servers' tools join the catalog.

Exit status: 0 when the cell completed, 1 when it did not (the JSON result says why), 2 when the
command line cannot be carried out: a file, module, attribute or optional extra that is missing,
or a config that is wrong. That is one line on stderr, ``codemode: error: ...``, never a
traceback, as argparse words its own usage errors; a missing extra is named with its install line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .extras import explained, missing_extra
from .session import CodeMode
from .store import SqliteStore

__all__ = ["main"]

#: The exit status when the command line cannot be carried out (argparse's own, for usage).
EXIT_REFUSED = 2


class _Refused(Exception):
    """What the command line names cannot be used: its message is the one line the user sees."""


def _load_tools(cm: CodeMode, spec: str) -> None:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _Refused(f"--tools expects module:attr, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if missing_extra(e) is not None:
            raise  # (main names the extra to install)
        raise _Refused(f"--tools {spec}: cannot import {module_name}: {e}") from None
    try:
        target: Any = getattr(module, attr)
    except AttributeError:
        raise _Refused(f"--tools {spec}: module {module_name} has no attribute {attr!r}") from None
    if callable(target) and not isinstance(target, type):
        try:
            iterable = iter(target)
        except TypeError:
            target(cm)
            return
        for fn in iterable:
            cm.add_tool(fn)
        return
    for fn in target:
        cm.add_tool(fn)


def _serve(args: argparse.Namespace) -> int:
    from .serve import load_servers_config, read_token, serve_http, serve_stdio

    # A malformed file, server entry or token is a ConfigError naming the server, key or problem
    # (main prints it), raised before anything starts.
    config: dict[str, Any] = {"enabled": True}
    if args.token_file is not None and args.http is None:
        raise ConfigError("--token-file needs --http (over stdio there is no listener to guard)")
    # A stdio server ignores $CODEMODE_SERVE_TOKEN.
    token = read_token(args.token_file, os.environ) if args.http is not None else None
    if args.config is not None:
        config["mcpServers"] = load_servers_config(args.config)
    # Over HTTP the server deletes a departed client's stored values, so it holds the store.
    store = SqliteStore() if args.http is not None else None
    cm = CodeMode(config, store=store)
    with cm:
        for spec in args.tools:
            _load_tools(cm, spec)
        _list_servers(cm)
        if store is not None:
            serve_http(cm, store, args.http, token)
        else:
            serve_stdio(cm)
    return 0


def _read_cell(path: Path) -> tuple[str, str]:
    """The cell's source and language (TypeScript by its suffix; stdin is JavaScript)."""
    if str(path) == "-":
        return sys.stdin.read(), "javascript"
    try:
        source = path.read_text()
    except OSError as e:
        raise _Refused(f"cannot read the cell {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise _Refused(f"cannot read the cell {path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    return source, "typescript" if path.suffix in (".ts", ".mts", ".cts") else "javascript"


def _list_servers(cm: CodeMode) -> None:
    """Lists every MCP server before the first cell starts (an exec alone waits only so long
    for one); one that cannot be used is logged as it fails (a ``codemode: warning:`` line on
    stderr, `_log_to_stderr`), and the cells run without it."""
    cm.load_mcp_tools()


class _CommandLineFormat(logging.Formatter):
    """A record as the command's own lines on stderr read: ``codemode: warning: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"codemode: {record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _log_to_stderr() -> None:
    """codemode's warnings (an MCP server that cannot start, say) as the command's lines on
    stderr, each once: not also through the root handler the MCP SDK's server sets up."""
    logger = logging.getLogger("codemode")
    if not any(isinstance(h.formatter, _CommandLineFormat) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        handler.setFormatter(_CommandLineFormat())
        logger.addHandler(handler)
    logger.propagate = False


def _exec(args: argparse.Namespace) -> int:
    source, language = _read_cell(args.file)
    config: dict[str, Any] = {"enabled": True}
    if args.timeout_ms is not None:
        config["timeoutMs"] = args.timeout_ms
    if args.config is not None:
        from .serve import load_servers_config

        config["mcpServers"] = load_servers_config(args.config)
    with CodeMode(config) as cm:
        if args.demo:
            from .demo import register_demo_tools

            register_demo_tools(cm)
        for spec in args.tools:
            _load_tools(cm, spec)
        _list_servers(cm)
        result = cm.session("cli").exec({"code": source, "language": language})
    print(json.dumps(result, indent=2))
    return 0 if result["status"] == "completed" else 1


def _run_batch(args: argparse.Namespace) -> int:
    """``codemode run``: 0 once every cell has its line (a failed cell is a result, not an error)."""
    from .batch import load_cells, write_lines
    from .errors import BatchError
    from .runs import MAX_SUSPENDED_RUNS

    if not 1 <= args.concurrency <= MAX_SUSPENDED_RUNS:
        raise _Refused(f"--concurrency must be from 1 to {MAX_SUSPENDED_RUNS}, got {args.concurrency}")
    try:
        cells = load_cells(args.file)
    except BatchError as e:
        raise _Refused(str(e)) from None
    config: dict[str, Any] = {"enabled": True}
    if args.timeout_ms is not None:
        config["timeoutMs"] = args.timeout_ms
    if args.config is not None:
        from .serve import load_servers_config

        config["mcpServers"] = load_servers_config(args.config)
    try:
        sink = contextlib.nullcontext(sys.stdout) if args.out is None else args.out.open("w", encoding="utf-8")
    except OSError as e:
        raise _Refused(f"cannot write {args.out}: {e.strerror or e}") from None
    with sink as out, CodeMode(config) as cm:
        for spec in args.tools:
            _load_tools(cm, spec)
        _list_servers(cm)
        progress = sys.stderr if sys.stderr.isatty() else None  # (quiet in a pipe or a log)
        write_lines(cm, cells, out, concurrency=args.concurrency, seed=args.seed, progress=progress)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``codemode`` command line; returns the exit status (see the module docstring)."""
    _log_to_stderr()
    try:
        return _command(argv)
    except (_Refused, ConfigError) as e:
        message = str(e)
    except ImportError as e:
        if missing_extra(e) is None:
            raise
        message = str(explained(e))
    print("codemode: error: " + " ".join(message.splitlines()), file=sys.stderr)
    return EXIT_REFUSED


def _command(argv: Sequence[str] | None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="codemode", description="Run code mode cells.")
    parser.add_argument("--version", action="version", version=f"codemode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    cell = sub.add_parser("exec", help="run one JavaScript or TypeScript cell and print the JSON result")
    cell.add_argument("file", type=Path, help="a .js or .ts file (- for stdin, JavaScript)")
    cell.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR", help="register tools")
    cell.add_argument("--demo", action="store_true", help="register the built-in demo catalog")
    cell.add_argument("--config", type=Path, help="an MCP client config file with `mcpServers`: their tools too")
    cell.add_argument("--timeout-ms", type=int, default=None, help="the deadline (ms, 100-60000; default 10000)")
    serve = sub.add_parser("serve", help="run codemode as an MCP server exposing exec and wait")
    serve.add_argument("--config", type=Path, help="an MCP client config file with `mcpServers`")
    serve.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR", help="register tools")
    serve.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1:PORT instead of stdio")
    serve.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="with --http: demand `Authorization: Bearer <the token in PATH>` (or set $CODEMODE_SERVE_TOKEN)",
    )
    batch = sub.add_parser("run", help="run a batch of cells (JSONL, one a line) and write one JSON result a line")
    batch.add_argument("file", type=Path, help='a JSONL file: {"code": ..., "language"?, "id"?, "session"?} a line')
    batch.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR", help="register tools")
    batch.add_argument("--config", type=Path, help="an MCP client config file with `mcpServers`: their tools too")
    batch.add_argument("--timeout-ms", type=int, default=None, help="each cell's deadline (ms, 100-60000)")
    batch.add_argument("--concurrency", type=int, default=8, help="cells running at once (1-64; default 8)")
    batch.add_argument("--seed", type=int, default=None, help="seed each cell (Math.random, clock) from S and its id")
    batch.add_argument("--out", type=Path, default=None, help="write the results here (default stdout)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "run":
        return _run_batch(args)
    return _exec(args)


if __name__ == "__main__":
    sys.exit(main())
