"""The ``codemode`` command: run a cell file against tools from a Python module.

    codemode exec cell.ts --tools myapp.tools:register
    codemode exec cell.js --demo
    codemode serve --config servers.json [--tools module:attr] [--http PORT [--token-file PATH]]

``--tools module:attr`` names either a callable taking the ``CodeMode`` (it registers tools)
or an iterable of functions (each becomes a tool).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .session import CodeMode
from .store import SqliteStore

__all__ = ["main"]


def _load_tools(cm: CodeMode, spec: str) -> None:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--tools expects module:attr, got {spec!r}")
    target: Any = getattr(importlib.import_module(module_name), attr)
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

    config: dict[str, Any] = {"enabled": True}
    try:
        if args.token_file is not None and args.http is None:
            raise ConfigError("--token-file needs --http (over stdio there is no listener to guard)")
        # Read before anything starts; a stdio server ignores $CODEMODE_SERVE_TOKEN.
        token = read_token(args.token_file, os.environ) if args.http is not None else None
        if args.config is not None:
            config["mcpServers"] = load_servers_config(args.config)
        # Over HTTP the server deletes a departed client's stored values, so it holds the store.
        store = SqliteStore() if args.http is not None else None
        cm = CodeMode(config, store=store)
    except ConfigError as e:
        # A malformed file, server entry or token: its message names the server, key or problem.
        raise SystemExit(f"codemode serve: {e}") from None
    with cm:
        for spec in args.tools:
            _load_tools(cm, spec)
        cm.load_mcp_tools()
        if store is not None:
            serve_http(cm, store, args.http, token)
        else:
            serve_stdio(cm)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codemode", description="Run code mode cells.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("exec", help="run one JavaScript or TypeScript cell and print the JSON result")
    run.add_argument("file", type=Path, help="a .js or .ts file (- for stdin, JavaScript)")
    run.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR", help="register tools")
    run.add_argument("--demo", action="store_true", help="register the built-in demo catalog")
    run.add_argument("--timeout-ms", type=int, default=None)
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
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)

    if str(args.file) == "-":
        source, language = sys.stdin.read(), "javascript"
    else:
        source = args.file.read_text()
        language = "typescript" if args.file.suffix in (".ts", ".mts", ".cts") else "javascript"
    config: dict[str, Any] = {"enabled": True}
    if args.timeout_ms is not None:
        config["timeoutMs"] = args.timeout_ms
    with CodeMode(config) as cm:
        if args.demo:
            from .demo import register_demo_tools

            register_demo_tools(cm)
        for spec in args.tools:
            _load_tools(cm, spec)
        result = cm.session("cli").exec({"code": source, "language": language})
    print(json.dumps(result, indent=2))
    return 0 if result["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
