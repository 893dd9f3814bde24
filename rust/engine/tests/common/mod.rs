//! What the bridge tests share: one small catalog (host tools `read`, `double`, `other`; an MCP
//! tool reached as `MCP.gh.createIssue`), one namespace (`Issues.list`, `Issues.comments.add`),
//! and an engine built over them.

use std::sync::Arc;

use codemode_engine::{Catalog, Engine, Limits};

pub const CATALOG: &str = r#"{
    "tools": [
        {"id": "host:core:read", "name": "read", "description": "Read.", "source": "host", "input": "unknown"},
        {"id": "host:core:double", "name": "double", "description": "Double.", "source": "host", "input": "unknown"},
        {"id": "host:core:other", "name": "other", "description": "Other.", "source": "host", "input": "unknown"},
        {"id": "mcp:gh:create_issue", "name": "create_issue", "description": "Create.", "source": "mcp",
         "sourceName": "gh", "input": "unknown", "ident": "createIssue", "serverIdent": "gh", "declaration": ""}
    ],
    "api": {},
    "mcpServers": {"gh": {"ident": "gh", "path": "mcp/gh.d.ts"}}
}"#;

/// The run setup of a namespace `Issues` whose `list` and `comments.add` are call markers.
pub const RUN: &str = r#"{"namespaces": [{"id": "github-issues", "globalName": "Issues", "description": "",
    "prompt": null, "tools": ["list"], "scope": {"list": {"$call": "list"}, "comments": {"add": {"$call": "comments.add"}}}}]}"#;

pub fn engine_with(limits: Limits) -> Engine {
    let catalog = match Catalog::from_json(CATALOG) {
        Ok(c) => c,
        Err(e) => panic!("catalog: {e}"),
    };
    match Engine::new(limits, Arc::new(catalog)) {
        Ok(e) => e,
        Err(e) => panic!("engine: {e}"),
    }
}
