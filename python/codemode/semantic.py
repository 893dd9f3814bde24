"""Semantic tool search: WordLlama's static token embeddings, fused with BM25 in the engine.

With the ``semantic`` extra (``pip install 'codemode[semantic]'``, which installs the ``wordllama``
wheel) ``tools.search`` is hybrid: BM25 fused with the cosine similarity of mean-pooled token
embeddings of each tool's ``name: description`` (see rust/engine/src/search.rs). Without it, BM25
alone. :func:`search_mode` says which is active in this process.

::

    wordllama wheel: tokenizers/l2_supercat_tokenizer_config.json + weights/l2_supercat_256.safetensors
        | read once per process (files only: wordllama is never imported)
        v
    SemanticModel.from_wordllama (Rust: parse, check, int8-quantise)  --pack()-->  ~9 MB of bytes
        | host: Catalog(..., semantic=model) for the tool-search surface
        | workers: Configure(semantic=pack) once per catalog fingerprint (SemanticModel(pack))
        v
    engine: tool vectors built once per catalog; each query tokenised and pooled in Rust

Why the files and not ``wordllama.WordLlama.load``: importing ``wordllama`` calls
``logging.basicConfig(level=INFO)`` (it would reconfigure the host's logging) and takes ~0.5 s
(numpy, pydantic, requests); and its own lookup of the bundled tokenizer misses (it looks under
``wordllama/tokenizer/``, the file is in ``wordllama/tokenizers/``) and then downloads it, unless
called with ``cache_dir`` set to the package directory and ``disable_download=True``. Locating
the package with ``importlib.util.find_spec`` runs none of its code, and the Rust side refuses a
tokenizer whose normaliser or model options it does not reproduce exactly.

The model is WordLlama's: MIT License per the wheel's metadata and LICENSE file. Its README says
it was trained from the token-embedding codebooks of LLaMA 2 70B and phi 3 medium (Llama 2
tokenizer), whose own licenses the wheel does not restate; codemode ships none of it (the extra
installs the wheel from PyPI).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from ._engine import SemanticModel

__all__ = ["MODEL_NAME", "model", "model_files", "pack", "search_mode", "worker_pack"]

#: The WordLlama configuration and width used; reported as the model's name.
MODEL_NAME = "wordllama/l2_supercat_256"
_TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
_WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"

_log = logging.getLogger(__name__)
_lock = threading.Lock()
#: Loaded at most once per process: (model, its pack); (None, b"") when unavailable.
_loaded: tuple[SemanticModel | None, bytes] | None = None


def model_files() -> tuple[Path, Path] | None:
    """The installed ``wordllama`` wheel's tokenizer JSON and weights, found without importing
    it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec("wordllama")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent
    return directory / _TOKENIZER, directory / _WEIGHTS


def _load() -> tuple[SemanticModel | None, bytes]:
    files = model_files()
    if files is None:
        return None, b""
    try:
        tokenizer = files[0].read_text(encoding="utf-8")
        weights = files[1].read_bytes()
        loaded = SemanticModel.from_wordllama(tokenizer, weights, MODEL_NAME)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        _log.warning("codemode: wordllama is installed but its model cannot be used (%s); search is BM25 only", e)
        return None, b""
    return loaded, loaded.pack()


def _get() -> tuple[SemanticModel | None, bytes]:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def model() -> SemanticModel | None:
    """The semantic model (loaded on first use, ~0.1 s), or None without the ``semantic`` extra."""
    return _get()[0]


def pack() -> bytes:
    """The model as the bytes a worker loads (``b""``: none, BM25 alone)."""
    return _get()[1]


def worker_pack(counts: Mapping[str, int]) -> bytes:
    """The pack for a worker whose catalog has ``counts`` tools per source: empty when no tool is
    searched in code mode (MCP tools are reached through ``MCP.*``), so such a worker neither
    receives ~9 MB nor waits for the model to load."""
    searched = sum(n for source, n in counts.items() if source != "mcp")
    return pack() if searched else b""


def search_mode() -> Literal["hybrid", "bm25"]:
    """``"hybrid"`` when ``tools.search`` fuses BM25 with embeddings in this process, else ``"bm25"``."""
    return "hybrid" if model() is not None else "bm25"
