//! Catalog search behind `tools.search(query, {limit})` in guest code.
//!
//! Built once per catalog in the worker, then queried many times; pure, no I/O, and no input
//! (arbitrary Unicode, huge strings) can make it panic.
//!
//! # Ranking
//!
//! 1. **Exact name/id.** A query equal to an entry's `name` or `id`, compared case-insensitively and
//!    ignoring `_`, `-` and whitespace (`invoices list`, `InvoicesList`, `host:billing:invoices_list`),
//!    puts that entry first. Several such entries are ordered by their BM25 score, then by index.
//! 2. **BM25F** (`k1 = 1.2`) over one weighted pseudo-document per entry: each field's term
//!    frequency is length-normalised against that field's average length and weighted — name 3,
//!    label 2, description 1, fields text 1, id 0.5 (the id mostly repeats the name but carries the
//!    owner namespace, e.g. `billing`) — then summed and saturated once. Normalisation per field
//!    keeps a long description from drowning a short name; the single saturation keeps a term repeated
//!    in name, id and description from counting three times over. `b` is 0.75 for name, label and
//!    description but 0.3 for fields and id: a schema with many parameters is not less about its
//!    tool, and ids barely vary in length. idf is `ln(1 + (N - df + 0.5) / (df + 0.5))`, always
//!    positive. Everything but the query is fixed, so each posting stores its final contribution
//!    and a search is additions over a few posting lists.
//!
//!    Inflected words are also indexed in their own form (`shipments`), scored with the stem's idf
//!    and matched at 0.25: among tools that all mention `shipment`, the query `shipments` prefers
//!    the one that says `shipments` (usually the list tool), without letting a rare form outweigh
//!    a stem match elsewhere.
//! 3. **Query expansion**, each extra term weighted below an exact term (a term reached several ways
//!    keeps its highest weight; expansions never chain):
//!    - exact query terms: 1.0;
//!    - compounds, 0.8: adjacent query words joined (`on call` → `oncall`, `pull request`), and an
//!      out-of-vocabulary word split in two known words (`rollback` → `roll` + `back`);
//!    - prefix fallback, 0.7: an out-of-vocabulary term matches vocabulary terms it prefixes
//!      (`ship` → `shipment`), at most 32 of them; if that and the split find nothing, substring
//!      matches at 0.4 (`voice` inside `invoice` is never tried for a known term);
//!    - negation, 0.6: `un…`/`non…` (`unpaid`, `nonpaid`, `unread`) also match the positive stem;
//!      `in…`/`dis…` (`inactive`, `disabled`) only when the whole word is unknown, so `invoice`
//!      never looks for `voice`. Only the query is expanded, so `active` does not find `inactive`;
//!    - synonyms, 0.5: a small table of agent-tool vocabulary (`SYNONYM_GROUPS`: find/search/lookup,
//!      remove/delete, create/add/new, list/enumerate, fetch/get/retrieve/read, send/post,
//!      update/edit/modify, email/mail, message/msg, …), applied to exact query words only;
//!    - surface form, 0.25: see above.
//! 4. Ties break by entry index; results are deterministic for a given catalog and query (query
//!    terms are summed in term-id order, never in hash order).
//!
//! Only entries with a positive score are returned; an empty or all-stop-word query, or `limit`
//! 0, returns nothing.
//!
//! # Tokens
//!
//! [`tokenize`] splits on anything not alphanumeric (`_`, `-`, `.`, `:`, spaces), on camelCase and
//! acronyms (`getHTTPResponse` → `get http response`, while `listPRs` → `list prs`: a lone trailing
//! `s` pluralises the acronym), and on letter/digit boundaries: a mixed word is kept whole and its
//! letter runs of 2+ chars are added (`oauth2` → `oauth2 oauth`; `k8s` stays `k8s`). Tokens are
//! lowercased, cut to 64 chars, stop words (articles, prepositions, pronouns, question words, `not`)
//! dropped — never verbs like list/get/create/delete — and lightly stemmed, identically for catalog
//! and query:
//!
//! - plural: `-ies` → `-y`; otherwise a final `s` goes unless the word ends in `ss`/`us`/`is`
//!   (`status`, `address`, `analysis` stay whole; `shipments` → `shipment`, `weathers` → `weather`);
//! - `-ied` → `-y`; `-ing`/`-ed` go when 3+ letters with a vowel remain (`string`, `speed` stay),
//!   undoubling `runn` → `run` but not `add` or `bill`;
//! - then a final `e` (not `ee`) goes from 4+ letter words, so `update`/`updated`/`updating`/`updates`
//!   meet at `updat` and `invoice`/`invoices` at `invoic`;
//! - a short exception list covers words these rules would split wrongly (`alias`, `news`, `apis`,
//!   `cpus`, `embed`, `used`). There is no `-er` rule: it would merge `customer` with `custom`.
//!
//! Stems are index keys, not words: `page` is stored as `pag`.

use std::collections::HashMap;
use std::fmt;

/// One catalog entry as the worker knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub id: String,
    pub name: String,
    pub label: Option<String>,
    pub description: String,
    /// Trusted parameter and output-field text: names and descriptions from trusted JSON schemas (empty for MCP/client tools).
    pub fields: Vec<String>,
}

const K1: f32 = 1.2;
/// Per-field BM25 `b`, in field order (name, label, description, fields, id).
const FIELD_B: [f32; NFIELDS] = [0.75, 0.75, 0.75, 0.3, 0.3];

/// Queries are cut to this many chars before anything else, so a hostile query costs bounded time.
const MAX_QUERY_CHARS: usize = 1000;
/// Tokens are cut to this many chars (both sides), so one huge word cannot bloat the vocabulary.
const MAX_TOKEN_CHARS: usize = 64;
/// Cap on distinct weighted query terms after expansion; bounds the posting lists one search walks.
const MAX_QUERY_TERMS: usize = 256;
/// Cap on vocabulary terms one unknown query term may expand to by prefix or substring.
const MAX_FALLBACK_TERMS: usize = 32;
/// Unknown query words that get fallback expansion; a substring pass scans the whole vocabulary,
/// so a long query of gibberish must not pay it hundreds of times.
const MAX_FALLBACK_WORDS: usize = 8;

const NAME: usize = 0;
const LABEL: usize = 1;
const DESCRIPTION: usize = 2;
const FIELDS: usize = 3;
const ID: usize = 4;
const NFIELDS: usize = 5;
const FIELD_WEIGHTS: [f32; NFIELDS] = [3.0, 2.0, 1.0, 1.0, 0.5];
type FieldTerms = [Vec<u32>; NFIELDS];

const W_EXACT: f32 = 1.0;
const W_COMPOUND: f32 = 0.8;
const W_PREFIX: f32 = 0.7;
const W_NEGATION: f32 = 0.6;
const W_SYNONYM: f32 = 0.5;
const W_SUBSTRING: f32 = 0.4;
const W_SURFACE: f32 = 0.25;
const SURFACE_MARK: char = '=';

/// Words that mean the same thing to a model choosing a tool. Stemmed when the index is built, so
/// list plain words. A word may sit in several groups; expansion is one step (no transitive closure).
/// Keep groups tight: a loose synonym (e.g. user/account) turns a precise query into noise.
const SYNONYM_GROUPS: &[&[&str]] = &[
    &["find", "search", "lookup", "query", "look"],
    &["remove", "delete", "destroy", "erase", "trash"],
    &["create", "add", "new", "make", "insert"],
    &["list", "enumerate", "browse"],
    &["fetch", "get", "retrieve", "read", "load", "show", "view"],
    &["send", "post", "deliver"],
    &["update", "edit", "modify", "change", "patch"],
    &["email", "mail"],
    &["message", "msg", "dm"],
    &["run", "execute", "exec"],
    &["start", "launch", "begin"],
    &["stop", "halt", "terminate", "kill"],
    &["restart", "reboot"],
    &["cancel", "abort"],
    &["rollback", "revert", "undo"],
    &["upload", "attach"],
    &["repo", "repository"],
    &["pr", "pull"],
    &["doc", "document"],
    &["directory", "folder", "dir"],
    &["k8s", "kubernetes", "kube", "kubectl"],
    &["customer", "client"],
    &["package", "parcel"],
    &["meeting", "event", "appointment"],
    &["deploy", "deployment", "rollout"],
    &["issue", "bug"],
    &["alert", "alarm"],
];

/// Catalog search index: integer term ids, CSR postings with precomputed BM25F contributions.
#[derive(Clone)]
pub struct SearchIndex {
    len: usize,
    /// Term text by term id.
    terms: Vec<Box<str>>,
    vocab: HashMap<Box<str>, u32>,
    /// Term ids in lexicographic order of their text, for prefix ranges.
    sorted: Vec<u32>,
    /// Postings of term `t` are `offsets[t]..offsets[t + 1]` in `post_docs`/`post_scores`.
    offsets: Vec<usize>,
    post_docs: Vec<u32>,
    /// Final BM25F contribution of the term to that entry (idf and saturation included).
    post_scores: Vec<f32>,
    /// Normalised name/id → entries, for exact-match priority.
    exact: HashMap<String, Vec<u32>>,
    /// Stemmed word → stemmed synonyms.
    synonyms: HashMap<String, Vec<String>>,
}

impl fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchIndex")
            .field("entries", &self.len)
            .field("terms", &self.terms.len())
            .field("postings", &self.post_docs.len())
            .finish()
    }
}

impl SearchIndex {
    /// Builds the index; linear in the catalog's text plus a sort per entry and of the vocabulary.
    pub fn new(entries: &[IndexEntry]) -> SearchIndex {
        let mut vocab: HashMap<Box<str>, u32> = HashMap::new();
        let mut terms: Vec<Box<str>> = Vec::new();
        // Per entry: stem term ids per field, and surface-form term ids per field.
        let mut docs: Vec<(FieldTerms, FieldTerms)> = Vec::with_capacity(entries.len());
        let mut totals = [0f64; NFIELDS];
        let mut exact: HashMap<String, Vec<u32>> = HashMap::new();

        for (d, e) in entries.iter().enumerate() {
            // Stems count towards field length; surface forms ride along uncounted.
            let mut fields: [Vec<u32>; NFIELDS] = Default::default();
            let mut surfaces: [Vec<u32>; NFIELDS] = Default::default();
            let mut add = |field: usize, text: &str| {
                analyze(text, &mut |stemmed, seg| {
                    if stemmed != seg {
                        let id = intern(&mut vocab, &mut terms, surface_term(seg));
                        surfaces[field].push(id);
                    }
                    let id = intern(&mut vocab, &mut terms, stemmed);
                    fields[field].push(id);
                });
            };
            add(NAME, &e.name);
            if let Some(label) = &e.label {
                add(LABEL, label);
            }
            add(DESCRIPTION, &e.description);
            for f in &e.fields {
                add(FIELDS, f);
            }
            add(ID, &e.id);
            for (total, toks) in totals.iter_mut().zip(&fields) {
                *total += toks.len() as f64;
            }
            docs.push((fields, surfaces));
            for key in [normalize_exact(&e.name), normalize_exact(&e.id)] {
                if key.is_empty() {
                    continue;
                }
                let hits = exact.entry(key).or_default();
                if hits.last() != Some(&(d as u32)) {
                    hits.push(d as u32);
                }
            }
        }

        let n = entries.len().max(1) as f64;
        let avg: [f32; NFIELDS] = totals.map(|t| if t > 0.0 { (t / n) as f32 } else { 1.0 });

        // Per-entry weighted, length-normalised term frequencies, appended in entry order so each
        // posting list comes out sorted by entry.
        let mut postings: Vec<Vec<(u32, f32)>> = vec![Vec::new(); terms.len()];
        let mut occ: Vec<(u32, f32)> = Vec::new();
        for (d, (fields, surfaces)) in docs.iter().enumerate() {
            occ.clear();
            for (f, toks) in fields.iter().enumerate() {
                let (Some(weight), Some(avg_len), Some(b)) = (FIELD_WEIGHTS.get(f), avg.get(f), FIELD_B.get(f)) else {
                    continue;
                };
                let norm = weight / (1.0 - b + b * toks.len() as f32 / avg_len);
                occ.extend(toks.iter().chain(surfaces.get(f).into_iter().flatten()).map(|&t| (t, norm)));
            }
            // Stable sort: equal terms keep field order, so the float sums are reproducible.
            occ.sort_by_key(|&(t, _)| t);
            for run in occ.chunk_by(|a, b| a.0 == b.0) {
                let tf: f32 = run.iter().map(|&(_, w)| w).sum();
                let list = run.first().and_then(|&(t, _)| postings.get_mut(t as usize));
                if let (Some(list), true) = (list, tf > 0.0) {
                    list.push((d as u32, tf));
                }
            }
        }

        let n = entries.len() as f32;
        let total: usize = postings.iter().map(Vec::len).sum();
        let mut offsets = Vec::with_capacity(terms.len() + 1);
        let mut post_docs = Vec::with_capacity(total);
        let mut post_scores = Vec::with_capacity(total);
        offsets.push(0);
        // A surface form scores with its stem's (lower) idf: the exact form is a bonus on top of
        // the stem match, never a rare word of its own (`details` must not outweigh `issue`).
        let dfs: Vec<usize> = postings.iter().map(Vec::len).collect();
        for (t, list) in postings.into_iter().enumerate() {
            let parent =
                term_text(&terms, t as u32).strip_prefix(SURFACE_MARK).and_then(|seg| vocab.get(stem(seg).as_str()));
            let df = parent.and_then(|&p| dfs.get(p as usize)).copied().unwrap_or(list.len()) as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for (d, tf) in list {
                post_docs.push(d);
                post_scores.push(idf * tf * (K1 + 1.0) / (K1 + tf));
            }
            offsets.push(post_docs.len());
        }

        let mut sorted: Vec<u32> = (0..terms.len() as u32).collect();
        sorted.sort_by(|&a, &b| term_text(&terms, a).cmp(term_text(&terms, b)));

        SearchIndex {
            len: entries.len(),
            terms,
            vocab,
            sorted,
            offsets,
            post_docs,
            post_scores,
            exact,
            synonyms: synonym_table(),
        }
    }

    /// Indexes of matching entries, best first, at most `limit`.
    pub fn search(&self, query: &str, limit: usize) -> Vec<usize> {
        if limit == 0 || self.len == 0 {
            return Vec::new();
        }
        let query = truncate_chars(query, MAX_QUERY_CHARS);
        let key = normalize_exact(query);
        let exact: &[u32] = if key.is_empty() { &[] } else { self.exact.get(&key).map_or(&[], Vec::as_slice) };
        let weights = self.expand(query);
        if weights.is_empty() && exact.is_empty() {
            return Vec::new();
        }

        let mut acc = vec![0f32; self.len];
        let mut touched: Vec<u32> = Vec::new();
        for &(t, w) in &weights {
            let (docs, scores) = self.postings(t);
            for (&d, &s) in docs.iter().zip(scores) {
                if let Some(slot) = acc.get_mut(d as usize) {
                    if *slot == 0.0 {
                        touched.push(d);
                    }
                    *slot += w * s;
                }
            }
        }
        let score = |d: u32| acc.get(d as usize).copied().unwrap_or(0.0);

        let mut first: Vec<(u32, f32)> = exact.iter().map(|&d| (d, score(d))).collect();
        first.sort_by(rank_order);
        let mut out: Vec<usize> = first.iter().map(|&(d, _)| d as usize).take(limit).collect();
        if out.len() == limit {
            return out;
        }

        let mut rest: Vec<(u32, f32)> = touched
            .into_iter()
            .filter(|d| !exact.contains(d))
            .map(|d| (d, score(d)))
            .filter(|&(_, s)| s > 0.0)
            .collect();
        let want = limit - out.len();
        if rest.len() > want {
            rest.select_nth_unstable_by(want, rank_order);
            rest.truncate(want);
        }
        rest.sort_by(rank_order);
        out.extend(rest.into_iter().map(|(d, _)| d as usize));
        out
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn postings(&self, t: u32) -> (&[u32], &[f32]) {
        let t = t as usize;
        match (self.offsets.get(t), self.offsets.get(t + 1)) {
            (Some(&a), Some(&b)) => {
                (self.post_docs.get(a..b).unwrap_or(&[]), self.post_scores.get(a..b).unwrap_or(&[]))
            }
            _ => (&[], &[]),
        }
    }

    fn term_id(&self, term: &str) -> Option<u32> {
        self.vocab.get(term).copied()
    }

    /// Weighted vocabulary terms for a query, sorted by term id so score sums are reproducible.
    fn expand(&self, query: &str) -> Vec<(u32, f32)> {
        let mut segs: Vec<String> = Vec::new();
        for_each_segment(query, &mut |s| segs.push(s.to_owned()));

        let mut weights: HashMap<u32, f32> = HashMap::new();
        let mut put = |t: u32, w: f32| {
            if weights.len() < MAX_QUERY_TERMS || weights.contains_key(&t) {
                let slot = weights.entry(t).or_insert(0.0);
                *slot = slot.max(w);
            }
        };

        let mut fallbacks = 0;
        for seg in segs.iter().filter(|s| !is_stop_word(s)) {
            let term = stem(seg);
            let known = self.term_id(&term);
            match known {
                Some(t) => put(t, W_EXACT),
                None if fallbacks < MAX_FALLBACK_WORDS => {
                    fallbacks += 1;
                    self.fallback(&term, seg, &mut put);
                }
                None => {}
            }
            if term != *seg {
                if let Some(t) = self.term_id(&surface_term(seg)) {
                    put(t, W_SURFACE);
                }
            }
            for (prefix, always) in [("non", true), ("un", true), ("dis", false), ("in", false)] {
                if known.is_some() && !always {
                    continue;
                }
                if let Some(rest) = term.strip_prefix(prefix) {
                    if rest.chars().count() >= 3 {
                        if let Some(t) = self.term_id(rest) {
                            put(t, W_NEGATION);
                        }
                    }
                }
            }
            for syn in self.synonyms.get(&term).into_iter().flatten() {
                if let Some(t) = self.term_id(syn) {
                    put(t, W_SYNONYM);
                }
            }
        }

        for pair in segs.windows(2) {
            if let [a, b] = pair {
                if is_stop_word(a) && is_stop_word(b) {
                    continue;
                }
                if let Some(t) = self.term_id(&stem(&format!("{a}{b}"))) {
                    put(t, W_COMPOUND);
                }
            }
        }

        let mut out: Vec<(u32, f32)> = weights.into_iter().collect();
        out.sort_by_key(|&(t, _)| t);
        out
    }

    /// Expansions for a query term absent from the vocabulary: compound split and prefixes, else substrings.
    fn fallback(&self, term: &str, raw: &str, put: &mut impl FnMut(u32, f32)) {
        let mut found = false;
        if let Some((a, b)) = self.split_compound(term) {
            for t in [a, b].into_iter().flatten() {
                put(t, W_COMPOUND);
                found = true;
            }
        }
        let mut seen = 0;
        let prefixes: &[&str] = if raw == term { &[term] } else { &[term, raw] };
        for &p in prefixes {
            if p.chars().count() < 2 {
                continue;
            }
            let start = self.sorted.partition_point(|&t| self.text(t) < p);
            for &t in self.sorted.get(start..).unwrap_or(&[]).iter().take_while(|&&t| self.text(t).starts_with(p)) {
                if seen >= MAX_FALLBACK_TERMS {
                    break;
                }
                put(t, W_PREFIX);
                seen += 1;
                found = true;
            }
        }
        if found || term.chars().count() < 3 {
            return;
        }
        let substring = |t: &u32| {
            let text = self.text(*t);
            !text.starts_with(SURFACE_MARK) && text.contains(term)
        };
        for &t in self.sorted.iter().filter(|t| substring(t)).take(MAX_FALLBACK_TERMS) {
            put(t, W_SUBSTRING);
        }
    }

    /// Splits an unknown ASCII word into two parts that are known terms (or one known term and a
    /// stop word, as in `oncall`), preferring both-known, then the most balanced split.
    fn split_compound(&self, word: &str) -> Option<(Option<u32>, Option<u32>)> {
        if word.len() < 5 || !word.bytes().all(|b| b.is_ascii_lowercase()) {
            return None;
        }
        type Split = (Option<u32>, Option<u32>);
        let mut best: Option<((bool, usize), Split)> = None;
        for i in 2..=word.len() - 2 {
            let (left, right) = (word.get(..i)?, word.get(i..)?);
            let (l, r) = (self.term_id(&stem(left)), self.term_id(&stem(right)));
            let ok = |part: &str, id: Option<u32>| id.is_some() || is_stop_word(part);
            if !(ok(left, l) && ok(right, r)) || (l.is_none() && r.is_none()) {
                continue;
            }
            let rank = (l.is_some() && r.is_some(), left.len().min(right.len()));
            if best.as_ref().is_none_or(|(b, _)| rank > *b) {
                best = Some((rank, (l, r)));
            }
        }
        best.map(|(_, ids)| ids)
    }

    fn text(&self, t: u32) -> &str {
        term_text(&self.terms, t)
    }
}

fn term_text(terms: &[Box<str>], t: u32) -> &str {
    terms.get(t as usize).map_or("", |s| s)
}

fn intern(vocab: &mut HashMap<Box<str>, u32>, terms: &mut Vec<Box<str>>, tok: String) -> u32 {
    if let Some(&id) = vocab.get(tok.as_str()) {
        return id;
    }
    let id = terms.len() as u32;
    let tok: Box<str> = tok.into();
    terms.push(tok.clone());
    vocab.insert(tok, id);
    id
}

/// Higher score first, then lower entry index: a total order, so results never depend on sort internals.
fn rank_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn synonym_table() -> HashMap<String, Vec<String>> {
    let mut table: HashMap<String, Vec<String>> = HashMap::new();
    for group in SYNONYM_GROUPS {
        let stems: Vec<String> = group.iter().map(|w| stem(w)).collect();
        for s in &stems {
            let entry = table.entry(s.clone()).or_default();
            for other in &stems {
                if other != s && !entry.contains(other) {
                    entry.push(other.clone());
                }
            }
        }
    }
    table
}

fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => s.get(..i).unwrap_or(s),
        None => s,
    }
}

/// Lowercase without `_`, `-` or whitespace: `Invoices-List`, `invoices list` and `invoices_list` are one name.
fn normalize_exact(s: &str) -> String {
    s.chars().filter(|&c| c != '_' && c != '-' && !c.is_whitespace()).flat_map(char::to_lowercase).collect()
}

/// Lowercased, stop-word-free, stemmed terms of `text`, as indexed and as searched.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    analyze(text, &mut |stemmed, _| out.push(stemmed));
    out
}

/// Calls `f(stem, segment)` for each non-stop-word segment of `text`.
fn analyze(text: &str, f: &mut dyn FnMut(String, &str)) {
    for_each_segment(text, &mut |seg| {
        if !is_stop_word(seg) {
            f(stem(seg), seg);
        }
    });
}

/// Vocabulary key of an inflected word's own form. `=` never occurs in a token, so these keys
/// cannot collide with stems or be reached by prefix/substring fallback of a query word.
fn surface_term(seg: &str) -> String {
    format!("{SURFACE_MARK}{seg}")
}

/// Calls `f` with each lowercased, length-capped word piece of `text`, stop words included.
fn for_each_segment(text: &str, f: &mut dyn FnMut(&str)) {
    let mut word: Vec<char> = Vec::new();
    let mut buf = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.push(c);
        } else if !word.is_empty() {
            split_word(&word, &mut buf, f);
            word.clear();
        }
    }
    if !word.is_empty() {
        split_word(&word, &mut buf, f);
    }
}

fn split_word(word: &[char], buf: &mut String, f: &mut dyn FnMut(&str)) {
    let mut start = 0;
    for i in 1..word.len() {
        if is_case_boundary(word, i) {
            emit_part(word.get(start..i).unwrap_or(&[]), buf, f);
            start = i;
        }
    }
    emit_part(word.get(start..).unwrap_or(&[]), buf, f);
}

/// A new camelCase part starts at `i`: `fooBar`, `v2Beta`, and the last capital of an acronym
/// followed by lowercase (`HTTPResponse`) — unless that lowercase is a lone plural `s` (`PRs`, `IDsFor`).
fn is_case_boundary(w: &[char], i: usize) -> bool {
    let (Some(&p), Some(&c)) = (i.checked_sub(1).and_then(|j| w.get(j)), w.get(i)) else {
        return false;
    };
    if !c.is_uppercase() {
        return false;
    }
    if p.is_lowercase() || p.is_numeric() {
        return true;
    }
    match w.get(i + 1) {
        Some(&n) if p.is_uppercase() && n.is_lowercase() => {
            let lone_s = n == 's' && w.get(i + 2).is_none_or(|m| !m.is_lowercase());
            !lone_s
        }
        _ => false,
    }
}

fn emit_part(part: &[char], buf: &mut String, f: &mut dyn FnMut(&str)) {
    if part.is_empty() {
        return;
    }
    buf.clear();
    buf.extend(part.iter().flat_map(|c| c.to_lowercase()));
    let cut = truncate_chars(buf, MAX_TOKEN_CHARS).len();
    buf.truncate(cut);
    f(buf);
    if buf.chars().any(char::is_alphabetic) && buf.chars().any(char::is_numeric) {
        for run in buf.split(|c: char| c.is_numeric()).filter(|r| r.chars().count() >= 2) {
            f(run);
        }
    }
}

/// Words that carry no tool-choosing signal. Deliberately keeps verbs (list, get, create, delete,
/// show, find), `new` and `up`/`down` (`scale up`, `look up`). `not` is dropped: BM25 cannot negate,
/// and `not paid` still finds tools mentioning `paid`.
fn is_stop_word(w: &str) -> bool {
    matches!(
        w,
        "a" | "an"
            | "the"
            | "of"
            | "for"
            | "to"
            | "and"
            | "or"
            | "in"
            | "on"
            | "at"
            | "by"
            | "with"
            | "from"
            | "into"
            | "onto"
            | "via"
            | "as"
            | "is"
            | "are"
            | "was"
            | "were"
            | "be"
            | "been"
            | "it"
            | "its"
            | "this"
            | "that"
            | "these"
            | "those"
            | "i"
            | "me"
            | "my"
            | "we"
            | "our"
            | "you"
            | "your"
            | "they"
            | "them"
            | "their"
            | "please"
            | "can"
            | "could"
            | "would"
            | "should"
            | "will"
            | "do"
            | "does"
            | "did"
            | "some"
            | "any"
            | "all"
            | "what"
            | "which"
            | "who"
            | "whom"
            | "whose"
            | "when"
            | "where"
            | "how"
            | "there"
            | "here"
            | "if"
            | "then"
            | "than"
            | "so"
            | "also"
            | "just"
            | "about"
            | "not"
            | "no"
            | "s"
    )
}

/// Words the suffix rules would get wrong, mapped to a shared stem: singular-looking `-s/-is/-us`
/// words (`alias`, `news`), plurals of `-i/-u` words (`apis`, `cpus`), `-ed` lookalikes (`embed`).
fn irregular(w: &str) -> Option<&'static str> {
    Some(match w {
        "alias" | "aliases" => "alias",
        "canvas" | "canvases" => "canvas",
        "atlas" => "atlas",
        "bias" => "bias",
        "news" => "news",
        "series" => "series",
        "during" => "during",
        "embed" | "embeds" | "embedded" | "embedding" | "embeddings" => "embed",
        "analyses" => "analysis",
        "indices" | "indexes" => "index",
        "use" | "uses" | "used" | "using" => "use",
        "apis" => "api",
        "kpis" => "kpi",
        "uris" => "uri",
        "wikis" => "wiki",
        "emojis" => "emoji",
        "cpus" => "cpu",
        "gpus" => "gpu",
        "skus" => "sku",
        "menus" => "menu",
        "cookie" | "cookies" => "cookie",
        "movie" | "movies" => "movie",
        _ => return None,
    })
}

/// Light English stemmer applied identically to catalog and query text. Only merges inflections:
///
/// 1. plural: `-ies` → `-y` (5+ letters), else a final `s` is dropped unless the word ends in
///    `ss`/`us`/`is` (`status`, `address`, `analysis` stay);
/// 2. `-ied` → `-y`; `-ing`/`-ed` dropped when 3+ letters with a vowel remain (`string`, `need`,
///    `speed` stay), undoubling `runn` → `run` but not `add` or `bill`;
/// 3. a final `e` (not `ee`) is dropped from 4+ letter words, so `update`, `updates`, `updated`,
///    `updating` all give `updat`, and `invoices`/`invoice` give `invoic`.
///
/// No `-er` rule: it would merge `customer`/`custom` and `timer`/`time`, and `weather` must stay
/// `weather`. Non-ASCII or 1–2 letter words are left alone.
fn stem(word: &str) -> String {
    if word.len() <= 2 || !word.bytes().all(|b| b.is_ascii_lowercase()) {
        return word.to_owned();
    }
    if let Some(s) = irregular(word) {
        return s.to_owned();
    }
    let mut w = word.to_owned();
    if w.len() >= 5 && w.ends_with("ies") {
        w.truncate(w.len() - 3);
        w.push('y');
    } else if w.ends_with('s') && !(w.ends_with("ss") || w.ends_with("us") || w.ends_with("is")) {
        w.pop();
    }
    if w.len() >= 5 && w.ends_with("ied") {
        w.truncate(w.len() - 3);
        w.push('y');
    } else if w.ends_with("ing") {
        strip_verb_suffix(&mut w, 3);
    } else if w.ends_with("ed") && !w.ends_with("eed") {
        strip_verb_suffix(&mut w, 2);
    }
    if w.len() >= 4 && w.ends_with('e') && !w.ends_with("ee") {
        w.pop();
    }
    w
}

fn strip_verb_suffix(w: &mut String, n: usize) {
    let Some(keep) = w.len().checked_sub(n) else { return };
    let Some(stem) = w.get(..keep) else { return };
    if stem.len() < 3 || !stem.bytes().any(|b| b"aeiouy".contains(&b)) {
        return;
    }
    let b = stem.as_bytes();
    let undouble = match b {
        [.., x, y] if b.len() >= 4 && x == y => b"bdgmnprt".contains(x),
        _ => false,
    };
    w.truncate(if undouble { keep - 1 } else { keep });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, name: &str, description: &str, fields: &[&str]) -> IndexEntry {
        IndexEntry {
            id: id.into(),
            name: name.into(),
            label: None,
            description: description.into(),
            fields: fields.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn names(index: &SearchIndex, entries: &[IndexEntry], query: &str) -> Vec<String> {
        index.search(query, 10).into_iter().filter_map(|i| entries.get(i)).map(|e| e.name.clone()).collect()
    }

    fn small() -> Vec<IndexEntry> {
        vec![
            entry(
                "host:billing:invoices_list",
                "invoices_list",
                "List invoices for an account.",
                &["account_id", "status", "amount", "paid", "due_date"],
            ),
            entry("host:billing:invoice_create", "invoice_create", "Create a draft invoice.", &["customer_id"]),
            entry("host:logistics:shipments_list", "shipments_list", "List shipments.", &["status"]),
            entry("host:weather:weather_current", "weather_current", "Current weather for a city.", &["city"]),
            entry("host:slack:chat_post_message", "chat_post_message", "Post a message to a channel.", &[]),
            entry("host:gmail:email_send", "email_send", "Send an email.", &["to", "subject"]),
            entry("host:users:users_list", "users_list", "List users.", &["active", "role"]),
            entry("host:pd:get_current_oncall", "get_current_oncall", "Who is on call now.", &["schedule_id"]),
            entry("host:k8s:rollout_undo", "rollout_undo", "Roll back a deployment.", &["deployment"]),
            entry("host:k8s:deployment_restart", "deployment_restart", "Restart a deployment.", &["deployment"]),
        ]
    }

    #[test]
    fn tokenize_splits_cases_and_separators() {
        assert_eq!(tokenize("getHTTPResponse"), ["get", "http", "respons"]);
        assert_eq!(tokenize("list_PRs"), ["list", "pr"]);
        assert_eq!(tokenize("chat.postMessage"), ["chat", "post", "messag"]);
        assert_eq!(tokenize("page-export-pdf"), ["pag", "export", "pdf"]);
        assert_eq!(tokenize("host:billing:invoices_list"), ["host", "bill", "invoic", "list"]);
        assert_eq!(tokenize("oauth2 K8sPods v2"), ["oauth2", "oauth", "k8s", "pod", "v2"]);
        assert_eq!(tokenize("the list of all files for a user"), ["list", "fil", "user"]);
        assert_eq!(tokenize("getIDsList"), ["get", "id", "list"]);
    }

    #[test]
    fn stemmer_merges_forms_without_mangling() {
        let same = |a: &str, b: &str| assert_eq!(stem(a), stem(b), "{a} vs {b}");
        same("weather", "weathers");
        same("shipment", "shipments");
        same("status", "statuses");
        same("address", "addresses");
        same("invoice", "invoices");
        same("update", "updated");
        same("update", "updating");
        same("query", "queries");
        same("copy", "copied");
        same("run", "running");
        same("log", "logging");
        same("box", "boxes");
        same("branch", "branches");
        same("cache", "caches");
        same("api", "apis");
        same("alias", "aliases");
        same("close", "closed");
        assert_eq!(stem("weather"), "weather");
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("string"), "string");
        assert_eq!(stem("speed"), "speed");
        assert_eq!(stem("add"), "add");
        assert_eq!(stem("added"), "add");
        assert_eq!(stem("billing"), "bill");
        assert_eq!(stem("paid"), "paid");
        assert_ne!(stem("customer"), stem("custom"));
    }

    #[test]
    fn negation_finds_the_positive_field() {
        let e = small();
        let idx = SearchIndex::new(&e);
        assert_eq!(names(&idx, &e, "unpaid invoices").first().map(String::as_str), Some("invoices_list"));
        assert_eq!(names(&idx, &e, "nonpaid invoices").first().map(String::as_str), Some("invoices_list"));
        assert_eq!(names(&idx, &e, "inactive users").first().map(String::as_str), Some("users_list"));
    }

    #[test]
    fn synonyms_rank_below_exact_terms() {
        let e = small();
        let idx = SearchIndex::new(&e);
        assert_eq!(names(&idx, &e, "send a message").first().map(String::as_str), Some("chat_post_message"));
        assert_eq!(names(&idx, &e, "send mail").first().map(String::as_str), Some("email_send"));
        assert_eq!(names(&idx, &e, "add invoice").first().map(String::as_str), Some("invoice_create"));
    }

    #[test]
    fn exact_name_or_id_ranks_first() {
        let e = small();
        let idx = SearchIndex::new(&e);
        for q in ["invoice_create", "Invoice-Create", "invoice create", "host:billing:invoice_create", "InvoiceCreate"]
        {
            assert_eq!(idx.search(q, 3).first(), Some(&1), "{q}");
        }
    }

    #[test]
    fn prefix_and_compound_fallbacks() {
        let e = small();
        let idx = SearchIndex::new(&e);
        assert_eq!(names(&idx, &e, "ship").first().map(String::as_str), Some("shipments_list"));
        assert_eq!(names(&idx, &e, "who is on call").first().map(String::as_str), Some("get_current_oncall"));
        assert_eq!(names(&idx, &e, "oncall").first().map(String::as_str), Some("get_current_oncall"));
        assert_eq!(names(&idx, &e, "rollback deployment").first().map(String::as_str), Some("rollout_undo"));
        assert_eq!(names(&idx, &e, "weathers").first().map(String::as_str), Some("weather_current"));
        assert_eq!(names(&idx, &e, "eather").first().map(String::as_str), Some("weather_current"));
    }

    #[test]
    fn edge_cases_never_panic() {
        let e = small();
        let idx = SearchIndex::new(&e);
        assert!(idx.search("", 5).is_empty());
        assert!(idx.search("   ", 5).is_empty());
        assert!(idx.search("the of and", 5).is_empty());
        assert!(idx.search("invoices", 0).is_empty());
        assert!(idx.search("invoices", 1).len() == 1);
        let huge = "ünïcødé🦀ß\u{0}\u{200b}İ".repeat(50_000);
        let _ = idx.search(&huge, 5);
        let _ = idx.search(&"x".repeat(1_000_000), 5);
        let _ = idx.search(&"ab ".repeat(10_000), 50);
        let _ = tokenize(&huge);
        let weird = vec![
            entry(&huge, &huge, &huge, &[&huge]),
            entry("", "", "", &[]),
            entry("İ", "ǅungla", "ΣΑΣ", &["日本語のテキスト"]),
        ];
        let w = SearchIndex::new(&weird);
        assert_eq!(w.len(), 3);
        let _ = w.search(&huge, 5);
        let _ = w.search("ǅungla", 5);
        assert!(SearchIndex::new(&[]).search("anything", 5).is_empty());
        assert!(SearchIndex::new(&[]).is_empty());
    }

    #[test]
    fn deterministic_ties_by_index() {
        let e: Vec<IndexEntry> =
            (0..5).map(|i| entry(&format!("host:x:t{i}"), &format!("same_tool_{i}"), "Same words.", &[])).collect();
        let idx = SearchIndex::new(&e);
        assert_eq!(idx.search("same words", 10), [0, 1, 2, 3, 4]);
        assert_eq!(idx.search("same words", 2), [0, 1]);
    }
}
