"""``tools.search`` over 10,000 tools, BM25 alone and hybrid (BM25 fused with embeddings).

Each round is one search through ``codemode._engine.Catalog`` — the index and ranking the guest's
``tools.search`` runs, without the exec around it (``test_codemode.py``'s ``catalog-search``
group measures it inside a cell). The budget is 1 ms a search (DESIGN.md §12). Queries rotate
over exact, inflected, paraphrased and misspelled ones; the catalog build (tool embeddings
included) is timed separately, once per catalog fingerprint in each worker.
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from codemode import semantic
from codemode._engine import Catalog

VERBS = ["list", "get", "create", "update", "delete", "search", "send", "archive", "export", "import", "sync",
         "approve", "cancel", "restore", "assign", "close", "merge", "schedule", "validate", "count"]  # fmt: skip
NOUNS = ["invoice", "customer", "shipment", "ticket", "issue", "pull_request", "message", "channel", "file",
         "folder", "event", "deployment", "pod", "alert", "incident", "page", "user", "role", "payment",
         "refund", "order", "product", "report", "dashboard", "contact"]  # fmt: skip
OWNERS = ["github", "gitlab", "slack", "teams", "stripe", "billing", "crm", "hubspot", "zendesk", "jira", "k8s",
          "aws", "gcp", "pagerduty", "datadog", "confluence", "notion", "gmail", "outlook", "shopify"]  # fmt: skip
QUERIES = ["list invoices", "unpaid invoices", "send slack message", "restart deployment pods", "listInvoices",
           "what is the temperature in paris", "make the photo smaller", "refund an order", "slak mesage",
           "who is on call", "delete user role", "export dashboard report"]  # fmt: skip


def _catalog_json() -> str:
    """20 owners x 20 verbs x 25 nouns: 10,000 tools with overlapping vocabulary."""
    tools = []
    for owner, verb, noun in itertools.product(OWNERS, VERBS, NOUNS):
        name = f"{noun}s_{verb}"
        tools.append({
            "id": f"host:{owner}:{name}", "name": name, "source": "host", "input": "unknown",
            "description": f"{verb.capitalize()} {noun.replace('_', ' ')}s in {owner}.",
            "fields": [f"{noun}_id", "status", "created_at"],
        })  # fmt: skip
    return json.dumps(tools)


@pytest.fixture(scope="module", params=["bm25", "hybrid"])
def catalog(request: pytest.FixtureRequest) -> Catalog:
    model = semantic.model() if request.param == "hybrid" else None
    if request.param == "hybrid" and model is None:
        pytest.skip("the semantic extra (wordllama) is not installed")
    text = _catalog_json()
    started = time.perf_counter()
    built = Catalog(text, semantic=model)
    print(f"\n{request.param}: 10,000-tool catalog built in {(time.perf_counter() - started) * 1e3:.0f} ms")
    assert built.search_mode == request.param and len(built) == 10_000
    return built


@pytest.mark.benchmark(group="search-10k")
def test_search_over_10k_tools(benchmark, catalog: Catalog) -> None:
    queries = itertools.cycle(QUERIES)

    def one() -> str:
        return catalog.search(next(queries), 8)

    benchmark.pedantic(one, rounds=len(QUERIES) * 50, warmup_rounds=len(QUERIES))
    assert json.loads(catalog.search("list invoices", 8))
