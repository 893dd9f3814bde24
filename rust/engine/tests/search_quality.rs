//! Ranking quality (BM25 alone) on a realistic 228-tool catalog, and answers on a synthetic
//! 10,000-tool one (its speed is benches/test_search.py's to measure). The held-out paraphrase and misspelling queries over `catalog_20.json`, and
//! the hybrid mode (which needs the model from the `wordllama` wheel), are measured with recall
//! floors in tests/test_search.py.
//!
//! Run `cargo test --release -p codemode-engine --test search_quality -- --nocapture` for the
//! per-query ranks.

use codemode_engine::search::{IndexEntry, SearchIndex};
use serde_json::Value;

const CATALOG: &str = include_str!("../../../tests/fixtures/catalog_200.json");
const QUERIES: &str = include_str!("../../../tests/fixtures/search_queries.json");

fn parse(json: &str, what: &str) -> Vec<Value> {
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Array(items)) => items,
        Ok(_) => panic!("{what}: not a JSON array"),
        Err(e) => panic!("{what}: {e}"),
    }
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_str) {
        Some(s) => s.to_owned(),
        None => panic!("missing string {key:?} in {v}"),
    }
}

fn catalog() -> Vec<IndexEntry> {
    parse(CATALOG, "catalog")
        .iter()
        .map(|v| IndexEntry {
            id: text(v, "id"),
            name: text(v, "name"),
            label: v.get("label").and_then(Value::as_str).map(str::to_owned),
            description: text(v, "description"),
            fields: v
                .get("fields")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default(),
        })
        .collect()
}

#[test]
fn fixture_queries_rank_expected_tool_in_top_3() {
    let entries = catalog();
    assert!(entries.len() >= 200, "catalog has {} tools", entries.len());
    let index = SearchIndex::new(&entries);
    let queries: Vec<Value> = parse(QUERIES, "queries")
        .into_iter()
        .filter(|q| q.get("catalog").and_then(Value::as_str) == Some("catalog_200.json"))
        .collect();
    assert!(queries.len() >= 30);

    let mut top1 = 0;
    let mut top3 = 0;
    let mut misses = Vec::new();
    for q in &queries {
        let (query, expect) = (text(q, "query"), text(q, "expect"));
        assert!(entries.iter().any(|e| e.id == expect), "unknown expected id {expect}");
        let hits = index.search(&query, 10);
        let ids: Vec<&str> = hits.iter().filter_map(|&i| entries.get(i)).map(|e| e.id.as_str()).collect();
        let rank = ids.iter().position(|&id| id == expect).map(|r| r + 1);
        if rank == Some(1) {
            top1 += 1;
        }
        if rank.is_some_and(|r| r <= 3) {
            top3 += 1;
        } else {
            misses.push(format!("{query:?} -> expected {expect}, got {:?}", ids.get(..3).unwrap_or(&ids)));
        }
        let shown = rank.map_or("-".to_owned(), |r| r.to_string());
        println!("rank {shown:>2}  {query:<32} {expect:<40} top: {}", ids.first().copied().unwrap_or(""));
    }
    let n = queries.len();
    println!("top-1: {top1}/{n} ({:.1}%), top-3: {top3}/{n} ({:.1}%)", pct(top1, n), pct(top3, n));
    assert!(misses.is_empty(), "not in top 3:\n{}", misses.join("\n"));
}

fn pct(a: usize, n: usize) -> f64 {
    100.0 * a as f64 / n.max(1) as f64
}

const VERBS: [&str; 20] = [
    "list", "get", "create", "update", "delete", "search", "send", "archive", "export", "import", "sync", "approve",
    "cancel", "restore", "assign", "close", "merge", "schedule", "validate", "count",
];
const NOUNS: [&str; 25] = [
    "invoice",
    "customer",
    "shipment",
    "ticket",
    "issue",
    "pull_request",
    "message",
    "channel",
    "file",
    "folder",
    "event",
    "deployment",
    "pod",
    "alert",
    "incident",
    "page",
    "user",
    "role",
    "payment",
    "refund",
    "order",
    "product",
    "report",
    "dashboard",
    "contact",
];
const OWNERS: [&str; 20] = [
    "github",
    "gitlab",
    "slack",
    "teams",
    "stripe",
    "billing",
    "crm",
    "hubspot",
    "zendesk",
    "jira",
    "k8s",
    "aws",
    "gcp",
    "pagerduty",
    "datadog",
    "confluence",
    "notion",
    "gmail",
    "outlook",
    "shopify",
];
const EXTRAS: [&str; 8] = [
    "Supports pagination with a cursor.",
    "Filters by status, owner and date range.",
    "Returns the updated record.",
    "Requires admin scope.",
    "Results are sorted by creation time, newest first.",
    "Accepts an optional idempotency key.",
    "Works across all workspaces the token can access.",
    "Emits a webhook event when done.",
];

/// 20 owners x 20 verbs x 25 nouns = 10,000 tools with overlapping, realistic vocabulary.
fn synthetic() -> Vec<IndexEntry> {
    let mut out = Vec::with_capacity(10_000);
    for (o, owner) in OWNERS.iter().enumerate() {
        for (v, verb) in VERBS.iter().enumerate() {
            for (n, noun) in NOUNS.iter().enumerate() {
                let i = out.len();
                let name = match i % 5 {
                    0 => camel(&format!("{verb}_{noun}")),
                    1 => format!("{noun}s-{verb}"),
                    _ => format!("{noun}s_{verb}"),
                };
                let plain = noun.replace('_', " ");
                out.push(IndexEntry {
                    id: format!("host:{owner}:{name}"),
                    name,
                    label: (i % 3 == 0).then(|| format!("{verb} {plain} ({owner})")),
                    description: format!(
                        "{} {plain}s in {owner}. {}",
                        capitalize(verb),
                        EXTRAS.get((o + v + n) % EXTRAS.len()).copied().unwrap_or("")
                    ),
                    fields: vec![
                        format!("{noun}_id"),
                        "status".into(),
                        "created_at".into(),
                        "owner_id".into(),
                        format!("{plain} name"),
                    ],
                });
            }
        }
    }
    out
}

fn camel(s: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in s.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Every query finds something in a 10,000-tool catalog and hostile queries (long runs of
/// unknown words, of known words, one huge word, multi-byte text) return within the limit. How
/// fast is measured in benches/test_search.py, not here.
#[test]
fn search_over_10k_tools_answers_every_query_and_survives_hostile_ones() {
    let entries = synthetic();
    assert_eq!(entries.len(), 10_000);
    let index = SearchIndex::new(&entries);
    let queries = [
        "list invoices",
        "unpaid invoices",
        "send slack message",
        "create github issue",
        "restart deployment pods",
        "search customers",
        "delete user role",
        "merge pull request",
        "export dashboard report",
        "cancel stripe payment",
        "pagerduty incidents",
        "ship",
        "schedule event",
        "find open tickets",
        "refund order",
        "listInvoices",
    ];
    for q in queries {
        let hits = index.search(q, 8);
        assert!(!hits.is_empty() && hits.len() <= 8, "{q}: {} hits", hits.len());
    }
    let gibberish: String = (0..400).map(|i| format!("zq{i}x ")).collect();
    let known: String = VERBS.iter().chain(NOUNS.iter()).cycle().take(300).map(|w| format!("{w} ")).collect();
    for q in [gibberish, known, "x".repeat(100_000), "ünï🦀 ".repeat(5_000)] {
        assert!(index.search(&q, 50).len() <= 50);
    }
}
