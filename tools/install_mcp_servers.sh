#!/usr/bin/env bash
# Installs the real MCP servers that tests/test_mcp_client.py talks to. Idempotent: each server
# is installed only when the pinned version is not already there.
#
#   mcp-server-time                        (PyPI) into the project venv (.venv)
#   @modelcontextprotocol/server-everything (npm)  into .mcp-servers/ (run: node <dist/index.js> stdio)
#
# Versions are pinned so the tests (tool/resource/prompt counts, messages) stay reproducible;
# bump them here and re-run the tests together.
set -euo pipefail

MCP_SERVER_TIME_VERSION="2026.10.19"
SERVER_EVERYTHING_VERSION="2026.8.31"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PREFIX="$ROOT/.mcp-servers"
PKG_JSON="$PREFIX/node_modules/@modelcontextprotocol/server-everything/package.json"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "error: no virtualenv at $VENV (create it first, e.g. with 'make venv')" >&2
  exit 1
fi

installed_time="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp-server-time"))' 2>/dev/null || true)"
if [[ "$installed_time" == "$MCP_SERVER_TIME_VERSION" ]]; then
  echo ">> mcp-server-time $MCP_SERVER_TIME_VERSION already installed"
else
  echo ">> installing mcp-server-time $MCP_SERVER_TIME_VERSION into $VENV"
  "$VENV/bin/pip" install --disable-pip-version-check --no-input -q "mcp-server-time==$MCP_SERVER_TIME_VERSION"
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "error: node and npm are needed for @modelcontextprotocol/server-everything (Node.js 20+)" >&2
  exit 1
fi

installed_everything="$(node -p "require('$PKG_JSON').version" 2>/dev/null || true)"
if [[ "$installed_everything" == "$SERVER_EVERYTHING_VERSION" ]]; then
  echo ">> @modelcontextprotocol/server-everything $SERVER_EVERYTHING_VERSION already installed"
else
  echo ">> installing @modelcontextprotocol/server-everything $SERVER_EVERYTHING_VERSION into $PREFIX"
  mkdir -p "$PREFIX"
  npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION"
fi
