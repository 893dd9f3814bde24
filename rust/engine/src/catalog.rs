//! The run's tool catalog as the guest sees it, built once per catalog fingerprint.
//!
//! The host sends the catalog as JSON once per worker; the worker parses it here, renders the
//! compact guest entries once, and builds the search index once. Every engine of that worker
//! shares it (`Arc`), and the guest reaches it lazily through host functions — so a
//! 10,000-tool catalog costs an exec nothing until the cell searches or lists it.
//!
//! MCP entries are kept (their ids resolve) but never appear in `ALL_TOOLS`, `tools.search`,
//! `tools.describe` or `tools.<name>`: in code mode they are reached only through `MCP.*`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::search::{IndexEntry, SearchIndex};
use crate::semantic::Model;

/// Names `tools.<name>` can never take: they are the catalog helpers themselves.
const RESERVED: [&str; 4] = ["search", "describe", "call", "callValue"];

/// What `MCP.<server>.$api(tool)` serves of one MCP tool.
#[derive(Debug)]
struct McpApi {
    server_ident: String,
    /// The tool's identifier under `MCP.<server>` and its MCP name: `$api` takes either.
    ident: String,
    name: String,
    declaration: String,
    /// The input schema, as JSON.
    schema: Option<String>,
}

/// One tool: what the guest may see of it, pre-rendered as JSON text.
#[derive(Debug)]
struct Entry {
    id: String,
    mcp: bool,
    /// MCP only: what `$api` serves of the tool.
    mcp_api: Option<McpApi>,
    /// `{id, name, label?, description, source, sourceName?, input, output?}`
    compact: String,
    /// The compact entry plus `parameters` and `outputSchema` (for `tools.describe`).
    full: String,
}

/// A parsed catalog with its search index; immutable once built.
#[derive(Debug)]
pub struct Catalog {
    entries: Vec<Entry>,
    by_id: HashMap<String, usize>,
    by_name: HashMap<String, usize>,
    safe_names: HashMap<String, usize>,
    /// Search results map through this: index position -> entry (MCP entries are not indexed).
    indexed: Vec<usize>,
    index: SearchIndex,
    /// `ALL_TOOLS` as JSON text (non-MCP compact entries, catalog order).
    all_json: String,
    /// The safe names, sorted, as a JSON array (for `Object.keys(tools)`).
    safe_names_json: String,
    /// `{serverIdent: {server, tools: {ident: id}}}` for the guest's `MCP` object.
    mcp_json: String,
    /// Virtual `API` files (`mcp/index.d.ts`, `mcp/<server>.d.ts`), path -> text.
    api: BTreeMap<String, String>,
    /// server identifier -> (server name, file path)
    mcp_servers: HashMap<String, (String, String)>,
}

/// A JavaScript-identifier form of a tool name: other characters become `_`.
pub fn safe_name(name: &str) -> String {
    let mut out: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '$' { c } else { '_' }).collect();
    if out.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn text(object: &Map<String, Value>, key: &str) -> Option<String> {
    object.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl Catalog {
    /// An empty catalog (a host without tools).
    pub fn empty() -> Catalog {
        Catalog::from_entries(Vec::new(), BTreeMap::new(), false, None)
    }

    /// Parses the host's catalog: `{"tools": [...], "api": {path: text}}` (or just the tools
    /// array). A tool is `{id, name, description, source, input, label?, sourceName?, output?,
    /// parameters?, outputSchema?, fields?}`; MCP tools add `ident`, `serverIdent`, `declaration`.
    pub fn from_json(json: &str) -> Result<Catalog, String> {
        Catalog::from_json_with(json, false, None)
    }

    /// `include_mcp`: MCP tools are searched, described and listed like the others (the host's
    /// tool-search surface, where they are called by id; code mode keeps them to `MCP.*`).
    /// `model`: search is hybrid (BM25 fused with embeddings, the tools embedded here, once).
    pub fn from_json_with(json: &str, include_mcp: bool, model: Option<Arc<Model>>) -> Result<Catalog, String> {
        let value: Value = serde_json::from_str(json).map_err(|e| format!("catalog is not valid JSON: {e}"))?;
        let (items, api, servers) = match value {
            Value::Array(items) => (items, Map::new(), Map::new()),
            Value::Object(mut object) => {
                let items = match object.remove("tools") {
                    Some(Value::Array(items)) => items,
                    _ => return Err("catalog.tools must be a JSON array".into()),
                };
                let api = match object.remove("api") {
                    Some(Value::Object(api)) => api,
                    None => Map::new(),
                    _ => return Err("catalog.api must be an object".into()),
                };
                let servers = match object.remove("mcpServers") {
                    Some(Value::Object(servers)) => servers,
                    _ => Map::new(),
                };
                (items, api, servers)
            }
            _ => return Err("catalog must be a JSON array or object".into()),
        };
        let mut entries = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let Value::Object(object) = item else {
                return Err(format!("catalog entry {i} is not an object"));
            };
            entries.push(object);
        }
        let api = api.into_iter().filter_map(|(k, v)| v.as_str().map(|text| (k, text.to_owned()))).collect();
        let mut catalog = Catalog::from_entries(entries, api, include_mcp, model);
        if !include_mcp {
            catalog.add_mcp_servers(servers);
        }
        Ok(catalog)
    }

    fn from_entries(
        objects: Vec<Map<String, Value>>,
        api: BTreeMap<String, String>,
        include_mcp: bool,
        model: Option<Arc<Model>>,
    ) -> Catalog {
        let mut mcp_view = Map::new();
        let mut mcp_servers = HashMap::new();
        let mut entries = Vec::with_capacity(objects.len());
        let mut index_entries = Vec::new();
        let mut indexed = Vec::new();
        let mut by_id = HashMap::new();
        let mut by_name = HashMap::new();
        let mut name_counts: HashMap<String, (usize, usize)> = HashMap::new();
        for (position, object) in objects.into_iter().enumerate() {
            let id = text(&object, "id").unwrap_or_default();
            let name = text(&object, "name").unwrap_or_default();
            let mcp = !include_mcp && object.get("source").and_then(Value::as_str) == Some("mcp");
            let mut compact = Map::new();
            for key in ["id", "name", "label", "description", "source", "sourceName", "input", "output"] {
                if let Some(v) = object.get(key) {
                    compact.insert(key.to_owned(), v.clone());
                }
            }
            let mut full = compact.clone();
            for key in ["parameters", "outputSchema"] {
                if let Some(v) = object.get(key) {
                    full.insert(key.to_owned(), v.clone());
                }
            }
            if !mcp {
                let fields = match object.get("fields") {
                    Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                    _ => Vec::new(),
                };
                index_entries.push(IndexEntry {
                    id: id.clone(),
                    name: name.clone(),
                    label: text(&object, "label"),
                    description: text(&object, "description").unwrap_or_default(),
                    fields,
                });
                indexed.push(position);
                let counted = name_counts.entry(safe_name(&name)).or_insert((0, position));
                counted.0 += 1;
                by_name.entry(name.clone()).or_insert(position);
            }
            let mut mcp_api = None;
            if mcp {
                let server = text(&object, "sourceName").unwrap_or_default();
                let server_ident = text(&object, "serverIdent").unwrap_or_default();
                let ident = text(&object, "ident").unwrap_or_default();
                let declaration = text(&object, "declaration").unwrap_or_default();
                let schema = object.get("parameters").map(Value::to_string);
                if let Value::Object(slot) = mcp_view
                    .entry(server_ident.clone())
                    .or_insert_with(|| serde_json::json!({"server": server, "tools": {}}))
                {
                    if let Some(Value::Object(tools)) = slot.get_mut("tools") {
                        tools.insert(ident.clone(), Value::String(id.clone()));
                    }
                }
                mcp_servers
                    .entry(server_ident.clone())
                    .or_insert_with(|| (server.clone(), format!("mcp/{server}.d.ts")));
                mcp_api = Some(McpApi { server_ident, ident, name: name.clone(), declaration, schema });
            }
            by_id.entry(id.clone()).or_insert(position);
            entries.push(Entry {
                id,
                mcp,
                mcp_api,
                compact: Value::Object(compact).to_string(),
                full: Value::Object(full).to_string(),
            });
        }
        let safe_names: HashMap<String, usize> = name_counts
            .into_iter()
            .filter(|(name, (count, _))| *count == 1 && !RESERVED.contains(&name.as_str()))
            .map(|(name, (_, position))| (name, position))
            .collect();
        let mut sorted: Vec<&String> = safe_names.keys().collect();
        sorted.sort();
        let safe_names_json = Value::from(sorted.into_iter().cloned().collect::<Vec<_>>()).to_string();
        let all: Vec<&str> = entries.iter().filter(|e| !e.mcp).map(|e| e.compact.as_str()).collect();
        let all_json = format!("[{}]", all.join(","));
        Catalog {
            index: SearchIndex::with_model(&index_entries, model),
            entries,
            by_id,
            by_name,
            safe_names,
            indexed,
            all_json,
            safe_names_json,
            mcp_json: Value::Object(mcp_view).to_string(),
            api,
            mcp_servers,
        }
    }

    /// The host's `mcpServers`: `{server: {ident, path, reason?}}` for every visible server.
    /// Each gets its `API` file path for `$api`; a server without tools (resources and prompts
    /// only) gets an `MCP` entry of its own; one that cannot be used (`reason`) appears as an
    /// object whose calls reject with the reason: a clear error, not `undefined is not a function`.
    fn add_mcp_servers(&mut self, servers: Map<String, Value>) {
        if servers.is_empty() {
            return;
        }
        let Ok(Value::Object(mut view)) = serde_json::from_str::<Value>(&self.mcp_json) else { return };
        for (server, info) in servers {
            let ident = info.get("ident").and_then(Value::as_str).unwrap_or(server.as_str()).to_owned();
            if let Some(reason) = info.get("reason").and_then(Value::as_str) {
                view.entry(ident).or_insert_with(|| serde_json::json!({"server": server, "unavailable": reason}));
                continue;
            }
            let path = info.get("path").and_then(Value::as_str).map(str::to_owned);
            let path = path.unwrap_or_else(|| format!("mcp/{server}.d.ts"));
            view.entry(ident.clone()).or_insert_with(|| serde_json::json!({"server": server, "tools": {}}));
            self.mcp_servers.insert(ident, (server, path));
        }
        self.mcp_json = Value::Object(view).to_string();
    }

    /// The guest's `MCP` object description.
    pub fn mcp_json(&self) -> &str {
        &self.mcp_json
    }

    /// `API.list(prefix)`: `[{path, bytes}]` of the virtual files under `prefix`.
    pub fn api_list_json(&self, prefix: &str) -> String {
        let prefix = prefix.trim_start_matches("./").trim_end_matches('/');
        let files: Vec<Value> = self
            .api
            .iter()
            .filter(|(path, _)| prefix.is_empty() || path.as_str() == prefix || path.starts_with(&format!("{prefix}/")))
            .map(|(path, text)| serde_json::json!({"path": path, "bytes": text.len()}))
            .collect();
        Value::from(files).to_string()
    }

    /// `API.read(path)`: a virtual file, or why not. Paths with `.`/`..` segments are refused.
    pub fn api_read(&self, path: &str) -> Result<&str, String> {
        if path.split('/').any(|segment| segment == "." || segment == ".." || segment.is_empty()) {
            return Err(format!("API path {path:?} is not allowed: no empty, '.' or '..' segments"));
        }
        self.api.get(path).map(String::as_str).ok_or_else(|| format!("unknown API path {path:?}"))
    }

    /// `MCP.<server>.$api(tool?, {schema?})` as JSON: the server's declaration file, or one tool's.
    pub fn mcp_api_json(&self, server_ident: &str, tool_ident: Option<&str>, schema: bool) -> Result<String, String> {
        let (server, path) =
            self.mcp_servers.get(server_ident).ok_or_else(|| format!("unknown MCP server {server_ident:?}"))?;
        let Some(tool_ident) = tool_ident else {
            let declaration = self.api.get(path).cloned().unwrap_or_default();
            return Ok(serde_json::json!({"server": server, "declaration": declaration}).to_string());
        };
        // The identifier first: a tool's MCP name may be another's identifier.
        let found = self
            .entries
            .iter()
            .filter_map(|entry| entry.mcp_api.as_ref())
            .filter(|api| api.server_ident == server_ident)
            .min_by_key(|api| {
                if api.ident == tool_ident {
                    0
                } else if api.name == tool_ident {
                    1
                } else {
                    2
                }
            })
            .filter(|api| api.ident == tool_ident || api.name == tool_ident);
        if let Some(api) = found {
            let mut header = serde_json::json!({"server": server, "tool": api.name, "declaration": api.declaration});
            if schema {
                let parsed = api.schema.as_deref().and_then(|p| serde_json::from_str::<Value>(p).ok());
                header["schema"] = parsed.unwrap_or(Value::Null);
            }
            return Ok(header.to_string());
        }
        Err(format!("unknown MCP tool {tool_ident:?} on server {server:?}"))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `ALL_TOOLS` as JSON text.
    pub fn all_json(&self) -> &str {
        &self.all_json
    }

    /// The sorted safe names as a JSON array.
    pub fn safe_names_json(&self) -> &str {
        &self.safe_names_json
    }

    /// `"hybrid"` or `"bm25"`: how `tools.search` ranks in this catalog.
    pub fn search_mode(&self) -> &'static str {
        self.index.mode()
    }

    /// Search results as a JSON array of compact entries.
    pub fn search_json(&self, query: &str, limit: usize) -> String {
        self.search_in_json(query, limit, None)
    }

    /// `search_json` narrowed to one namespace: the owner part of the id (`host:<owner>:name`).
    pub fn search_in_json(&self, query: &str, limit: usize, namespace: Option<&str>) -> String {
        // With a namespace, rank the whole index and keep the first `limit` that belong to it.
        let pool = if namespace.is_some() { self.indexed.len() } else { limit };
        let hits: Vec<&str> = self
            .index
            .search(query, pool)
            .into_iter()
            .filter_map(|i| self.indexed.get(i))
            .filter_map(|&position| self.entries.get(position))
            .filter(|e| namespace.is_none_or(|ns| e.id.split(':').nth(1) == Some(ns)))
            .take(limit)
            .map(|e| e.compact.as_str())
            .collect();
        format!("[{}]", hits.join(","))
    }

    /// The full entry (with schemas) for an id or a tool name; MCP entries are not described here.
    pub fn describe_json(&self, id_or_name: &str) -> Option<&str> {
        let position = self.by_id.get(id_or_name).or_else(|| self.by_name.get(id_or_name))?;
        let entry = self.entries.get(*position)?;
        (!entry.mcp).then_some(entry.full.as_str())
    }

    /// The catalog id behind `tools.<name>`, if that name is unambiguous.
    pub fn resolve_safe_name(&self, name: &str) -> Option<&str> {
        let position = self.safe_names.get(name)?;
        self.entries.get(*position).map(|e| e.id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        let json = r#"[
            {"id": "host:core:read", "name": "read", "description": "Read a file.", "source": "host", "input": "{ path: string }"},
            {"id": "host:web:web-search", "name": "web-search", "description": "Search the web.", "source": "host", "input": "unknown"},
            {"id": "host:a:dup", "name": "dup", "description": "one", "source": "host", "input": "unknown"},
            {"id": "client:b:dup", "name": "dup", "description": "two", "source": "client", "input": "unknown"},
            {"id": "host:core:search", "name": "search", "description": "reserved name", "source": "host", "input": "unknown"},
            {"id": "mcp:gh:create_issue", "name": "create_issue", "description": "Create an issue.", "source": "mcp", "input": "unknown"}
        ]"#;
        match Catalog::from_json(json) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn safe_names_skip_collisions_reserved_names_and_mcp() {
        let c = catalog();
        assert_eq!(c.resolve_safe_name("read"), Some("host:core:read"));
        assert_eq!(c.resolve_safe_name("web_search"), Some("host:web:web-search"));
        assert_eq!(c.resolve_safe_name("dup"), None);
        assert_eq!(c.resolve_safe_name("search"), None);
        assert_eq!(c.resolve_safe_name("create_issue"), None);
        assert_eq!(c.safe_names_json(), r#"["read","web_search"]"#);
    }

    #[test]
    fn search_narrowed_to_a_namespace_keeps_only_its_tools_up_to_the_limit() {
        let c = catalog();
        let both = c.search_json("dup", 8);
        assert!(both.contains("host:a:dup") && both.contains("client:b:dup"));
        assert_eq!(c.search_in_json("dup", 8, Some("b")).matches("\"id\"").count(), 1);
        assert!(c.search_in_json("dup", 8, Some("b")).contains("client:b:dup"));
        assert_eq!(c.search_in_json("dup", 8, Some("nowhere")), "[]");
        assert_eq!(c.search_in_json("read search web", 1, Some("web")).matches("\"id\"").count(), 1);
    }

    #[test]
    fn mcp_entries_are_hidden_from_guest_views() {
        let c = catalog();
        assert!(!c.all_json().contains("mcp:"));
        assert_eq!(c.describe_json("mcp:gh:create_issue"), None);
        assert!(!c.search_json("create issue", 8).contains("mcp:"));
        assert!(c.describe_json("host:core:read").is_some_and(|s| s.contains("\"input\"")));
    }

    #[test]
    fn mcp_servers_get_entries_api_paths_and_api_lookups() {
        let json = r#"{"tools": [
            {"id": "mcp:odd:get.sum", "name": "get.sum", "source": "mcp", "sourceName": "odd", "serverIdent": "odd",
             "ident": "getSum", "declaration": "// Unlike function getSum_2(input\nfunction getSum(input: {}): Promise<McpToolResult>;"},
            {"id": "mcp:odd:get_sum", "name": "get_sum", "source": "mcp", "sourceName": "odd", "serverIdent": "odd",
             "ident": "getSum_2", "declaration": "function getSum_2(input: {}): Promise<McpToolResult>;"}
        ], "api": {"mcp/odd.d.ts": "odd file", "mcp/index_2.d.ts": "index file"},
        "mcpServers": {"odd": {"ident": "odd", "path": "mcp/odd.d.ts"},
                       "index": {"ident": "index", "path": "mcp/index_2.d.ts"},
                       "down": {"ident": "down", "path": "mcp/down.d.ts", "reason": "no handshake"}}}"#;
        let c = match Catalog::from_json(json) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let view: Value = serde_json::from_str(c.mcp_json()).unwrap_or(Value::Null);
        assert_eq!(view["odd"]["tools"]["getSum_2"], "mcp:odd:get_sum");
        assert_eq!(view["index"], serde_json::json!({"server": "index", "tools": {}}));
        assert_eq!(view["down"], serde_json::json!({"server": "down", "unavailable": "no handshake"}));
        let tool = |server: &str, name: &str| -> String {
            let header = c.mcp_api_json(server, Some(name), false).unwrap_or_default();
            serde_json::from_str::<Value>(&header).unwrap_or(Value::Null)["tool"].as_str().unwrap_or("").to_owned()
        };
        // The identifier first, then the MCP name; never a match inside another's declaration.
        assert_eq!(tool("odd", "getSum_2"), "get_sum");
        assert_eq!(tool("odd", "getSum"), "get.sum");
        assert_eq!(tool("odd", "get.sum"), "get.sum");
        assert!(c.mcp_api_json("odd", Some("function getSum_2("), false).is_err());
        assert!(c.mcp_api_json("index", None, false).is_ok_and(|h| h.contains("index file")));
        assert!(c.mcp_api_json("down", None, false).is_err());
    }

    #[test]
    fn bad_catalogs_are_errors_not_panics() {
        assert!(Catalog::from_json("{").is_err());
        assert!(Catalog::from_json("{}").is_err());
        assert!(Catalog::from_json("[1]").is_err());
        assert!(Catalog::from_json("[{}]").is_ok());
        assert_eq!(safe_name("9lives"), "_9lives");
        assert_eq!(safe_name(""), "_");
    }
}
