"""Tool search by meaning: the hybrid mode (BM25 fused with WordLlama embeddings) and BM25 alone.

The semantic model comes from the ``wordllama`` wheel (``codemode[semantic]``; ``make`` installs
it with the dev tools), so these tests fail rather than skip without it: a missing extra must not
pass for a working hybrid mode. Recall floors hold each mode to what it measured on the held-out
queries of ``fixtures/search_queries.json`` (see the README's search section).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from codemode import semantic
from codemode._engine import Catalog, SemanticModel

FIXTURES = Path(__file__).parent / "fixtures"
QUERIES = json.loads((FIXTURES / "search_queries.json").read_text(encoding="utf-8"))

#: recall@3 each mode measured on the held-out queries (catalog_20.json); a change that loses
#: one fails here. Raise a floor when a change finds more.
HELD_OUT_FLOORS = {"bm25": 22, "hybrid": 32}


@pytest.fixture(scope="module")
def model() -> SemanticModel:
    found = semantic.model()
    if found is None:
        pytest.fail("the semantic extra is missing: pip install 'codemode[semantic]' (make installs it)")
    return found


def _catalog(name: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return [{**t, "source": "host", "input": "unknown"} for t in tools]


def _queries(catalog: str) -> list[dict[str, Any]]:
    return [q for q in QUERIES if q["catalog"] == catalog]


def _top3(catalog: Catalog, query: str) -> list[str]:
    return [hit["id"] for hit in json.loads(catalog.search(query, 3))]


def _misses(catalog: Catalog, queries: list[dict[str, Any]]) -> list[str]:
    return [
        f"{q['query']!r}: expected {q['expect']}, got {top}"
        for q in queries
        if q["expect"] not in (top := _top3(catalog, q["query"]))
    ]


def _files() -> tuple[Path, Path]:
    files = semantic.model_files()
    assert files is not None, "the semantic extra is missing"
    return files


def _reference_tokenizer() -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(_files()[0]))


def _tokenizer_cases() -> list[str]:
    """Catalog and query text, every vocabulary piece as text, and seeded random text."""
    texts: list[str] = []
    for name in ("catalog_200.json", "catalog_20.json"):
        for tool in json.loads((FIXTURES / name).read_text(encoding="utf-8")):
            texts += [tool["name"], tool["description"], f"{tool['name']}: {tool['description']}", *tool["fields"]]
    texts += [q["query"] for q in QUERIES]
    vocab = json.loads(_files()[0].read_text(encoding="utf-8"))["model"]["vocab"]
    pieces = [piece.replace("\u2581", " ") for piece in vocab]
    texts += pieces
    rnd = random.Random(20240607)
    alphabet = "abcdefXYZ019 _-:.,!?<>/s\t\n  éüßñ日本語한국어🦀\u200b\u0000\u2581"
    texts += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(5000)]
    texts += [" ".join(rnd.choice(pieces).strip() for _ in range(rnd.randint(1, 8))) for _ in range(2000)]
    texts += ["<s>", "</s>", "<unk>", "a<s>b", "<s><s>", "x</s>y<unk>", "<s", "s>", "  lead", "trail  ", "a   b"]
    return texts


def test_semantic_tokenizer_gives_the_python_tokenizers_ids_exactly(model: SemanticModel) -> None:
    reference = _reference_tokenizer()
    cases = _tokenizer_cases()
    assert len(cases) > 39_000
    wrong = [t for t in cases if model.token_ids(t) != reference.encode(t, add_special_tokens=False).ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} texts tokenise differently, e.g. {wrong[:5]!r}"


def test_semantic_embedding_is_the_float_mean_of_token_vectors_within_quantisation(model: SemanticModel) -> None:
    np = pytest.importorskip("numpy")
    safetensors = pytest.importorskip("safetensors.numpy")
    table = safetensors.load_file(str(_files()[1]))["embedding.weight"].astype(np.float32)
    reference = _reference_tokenizer()
    texts = [f"{t['name']}: {t['description']}" for t in _catalog("catalog_200.json")] + [q["query"] for q in QUERIES]
    for text in texts:
        mean = table[reference.encode(text, add_special_tokens=False).ids].mean(axis=0)
        ours = np.array(model.embed(text))
        assert float(ours @ (mean / np.linalg.norm(mean))) > 0.999, text
    assert model.embed("") is None


def test_semantic_model_pack_round_trips_and_a_corrupt_pack_is_a_value_error(model: SemanticModel) -> None:
    packed = model.pack()
    assert packed == semantic.pack()
    assert 8_000_000 < len(packed) < 10_000_000  # int8 table: half the wheel's float16 file
    again = SemanticModel(packed)
    assert (again.name, again.dim) == (semantic.MODEL_NAME, 256)
    assert again.embed("weather in Paris") == model.embed("weather in Paris")
    for bad in (b"", b"nonsense", packed[:-1], packed + b"\0", packed[:100]):
        with pytest.raises(ValueError, match="semantic pack"):
            SemanticModel(bad)


def test_from_wordllama_refuses_a_tokenizer_it_cannot_reproduce(model: SemanticModel) -> None:
    tokenizer_file, weights_file = _files()
    tokenizer, weights = tokenizer_file.read_text(encoding="utf-8"), weights_file.read_bytes()
    spec = json.loads(tokenizer)
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    with pytest.raises(ValueError, match="pre-tokenizer"):
        SemanticModel.from_wordllama(json.dumps(spec), weights, "x")
    with pytest.raises(ValueError, match="safetensors file is truncated"):
        SemanticModel.from_wordllama(tokenizer, weights[:50], "x")


def test_search_mode_says_hybrid_with_the_model_and_bm25_without(model: SemanticModel) -> None:
    tools = json.dumps(_catalog("catalog_20.json"))
    assert Catalog(tools, semantic=model).search_mode == "hybrid"
    assert Catalog(tools).search_mode == "bm25"
    assert semantic.search_mode() == "hybrid"


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_held_out_paraphrases_and_misspellings_keep_their_recall_floor(model: SemanticModel, mode: str) -> None:
    catalog = Catalog(json.dumps(_catalog("catalog_20.json")), semantic=model if mode == "hybrid" else None)
    queries = _queries("catalog_20.json")
    assert len(queries) >= 24 and len({q["expect"] for q in queries}) == 20
    misses = _misses(catalog, queries)
    found = len(queries) - len(misses)
    assert found >= HELD_OUT_FLOORS[mode], f"{mode}: {found}/{len(queries)} in the top 3; missed:\n" + "\n".join(misses)


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_every_catalog_200_query_ranks_its_tool_in_the_top_3_in_both_modes(model: SemanticModel, mode: str) -> None:
    catalog = Catalog(json.dumps(_catalog("catalog_200.json")), semantic=model if mode == "hybrid" else None)
    misses = _misses(catalog, _queries("catalog_200.json"))
    assert not misses, "\n".join(misses)


def test_bm25_alone_finds_misspelled_tools() -> None:
    catalog = Catalog(json.dumps(_catalog("catalog_20.json")))
    assert _top3(catalog, "wether forecast")[:1] == ["host:weather:get_weather"]
    assert _top3(catalog, "transalte to french")[:1] == ["host:lang:translate_text"]
    assert _top3(catalog, "curency exchange")[:1] == ["host:finance:convert_currency"]


def test_hybrid_search_returns_related_tools_where_bm25_returns_nothing(model: SemanticModel) -> None:
    tools = json.dumps(_catalog("catalog_20.json"))
    lexical, hybrid = Catalog(tools), Catalog(tools, semantic=model)
    for query in ("what is the temperature in Paris", "say this in spanish", "how many euros is 100 dollars"):
        assert json.loads(lexical.search(query, 3)) == []
        assert json.loads(hybrid.search(query, 3)) != []
    # Nothing in the catalog is about bananas: no tool is offered for the sake of it.
    assert json.loads(hybrid.search("banana", 3)) == []


def test_guest_and_tool_search_surface_both_search_by_meaning(make_codemode: Any, model: SemanticModel) -> None:
    cm = make_codemode({"workers": 1, "timeoutMs": 10000})
    for tool in _catalog("catalog_20.json"):
        _source, owner, name = tool["id"].split(":", 2)
        cm.add_tool(lambda **kwargs: kwargs, name=name, owner=owner, description=tool["description"])
    session = cm.session("semantic")
    code = "return (await tools.search('make the photo smaller', {limit: 3})).map((t) => t.id)"
    result = session.exec({"code": code})
    assert result["status"] == "completed", result
    assert "host:media:resize_image" in result["value"]
    hits = session.handle("tool_search", {"query": "what is the temperature in Paris", "limit": 3})["results"]
    assert [h["id"] for h in hits][:1] == ["host:weather:get_weather"]


_WITHOUT_WORDLLAMA = """
import importlib.abc, json, sys

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "wordllama":
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Hide())
from codemode import CodeMode, semantic

with CodeMode({"workers": 1}) as cm:
    cm.add_tool(lambda **kw: kw, name="get_weather", owner="weather", description="Get the current weather.")
    s = cm.session()
    found = lambda q: s.exec({"code": f"return (await tools.search({q!r})).map((t) => t.id)"})["value"]
    print(json.dumps([semantic.search_mode(), found("wether"), found("what is the temperature in Paris")]))
"""


def test_without_the_semantic_extra_search_is_bm25_and_still_works() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_WORDLLAMA], capture_output=True, text=True, timeout=60, check=True
    )
    mode, misspelled, paraphrase = json.loads(out.stdout.strip().splitlines()[-1])
    assert mode == "bm25"
    assert misspelled == ["host:weather:get_weather"]
    assert paraphrase == []
