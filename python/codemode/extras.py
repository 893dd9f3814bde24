"""Which optional extra provides a module, so that a missing one is named with the line that fixes it.

codemode's core needs only msgspec and fastjsonschema. MCP servers, ``codemode serve``, pydantic
tools, the PostgreSQL store and the framework adapters import their libraries when first used,
and without the extra Python's own message names a module the user never asked for: an MCP
server in a fresh install fails with ``No module named 'anyio'``. ``missing_extra`` reads the
module an ``ImportError`` names and answers with the extra that installs it (the names are those
of ``[project.optional-dependencies]`` in pyproject.toml; a test pins the two together, and
checks that every third-party module the package imports is either a core dependency or here).
"""

from __future__ import annotations

__all__ = ["EXTRA_OF_MODULE", "explained", "missing_extra"]

#: The top-level module -> the extra whose install brings it. ``anyio``, ``httpx2``,
#: ``starlette``, ``uvicorn`` and the backports come with the ``mcp`` SDK, which codemode's MCP
#: client (``codemode.mcp``) and server (``codemode.serve``) import directly.
EXTRA_OF_MODULE: dict[str, str] = {
    "mcp": "mcp",
    "mcp_types": "mcp",
    "anyio": "mcp",
    "httpx2": "mcp",
    "starlette": "mcp",
    "uvicorn": "mcp",
    "exceptiongroup": "mcp",
    "typing_extensions": "mcp",
    "pydantic": "pydantic",
    "psycopg": "postgres",
    "opentelemetry": "otel",
    "agents": "openai-agents",
    "pydantic_ai": "pydantic-ai",
    "langchain_core": "langchain",
    "anthropic": "anthropic",
    "openai": "openai",
    "ray": "ray",
}


def missing_extra(error: ImportError) -> str | None:
    """The extra to install for ``error`` (a module that is not there), or None when the
    missing module is not one an extra provides (or the error names no module)."""
    if error.name is None:
        return None
    return EXTRA_OF_MODULE.get(error.name.partition(".")[0])


def explained(error: ImportError) -> ImportError:
    """``error`` saying which extra to install, as an ``ImportError`` naming the same module;
    ``error`` itself when no extra provides the module, or when it says so already."""
    extra = missing_extra(error)
    if extra is None or "pip install 'codemode[" in str(error):
        return error
    hint = f"{error}: this needs the {extra!r} extra (pip install 'codemode[{extra}]')"
    return ImportError(hint, name=error.name, path=error.path)
