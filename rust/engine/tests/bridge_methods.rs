//! Each guest API names its bridge method on the calls it starts (`CallMethod`): the host shows
//! it in `pendingToolCalls`. One cell per path; the names are pinned here and, against the
//! Python side, by `_engine.CALL_METHODS`.

mod common;

use codemode_engine::{CallMethod, Language, Limits, Status};
use common::{engine_with, RUN};

fn calls_of(cell: &str) -> Vec<codemode_engine::ToolCall> {
    let mut engine = engine_with(Limits::default());
    let out = engine.start(cell, Language::JavaScript, 2000.0, 1, RUN);
    assert_eq!(out.status, Status::Pending, "{cell}");
    out.calls
}

fn methods_of(cell: &str) -> Vec<(String, CallMethod)> {
    calls_of(cell).into_iter().map(|c| (c.tool, c.method)).collect()
}

#[test]
fn every_guest_path_names_its_bridge_method() {
    for (cell, tool, method) in [
        ("await tools.callValue('host:core:read', {})", "host:core:read", CallMethod::CallValue),
        ("await tools.read({})", "host:core:read", CallMethod::CallValue),
        ("await tools.call('host:core:read', {})", "host:core:read", CallMethod::Call),
        ("await codemode.tools.call('host:core:read', {})", "host:core:read", CallMethod::Call),
        ("await Issues.list()", "\u{0}ns", CallMethod::Namespace),
        ("await MCP.gh.createIssue({})", "\u{0}mcp", CallMethod::Mcp),
        ("await MCP.gh.resources.list()", "\u{0}mcp", CallMethod::Mcp),
        ("await yield_control('why')", codemode_engine::YIELD_TOOL, CallMethod::Yield),
        ("await readOutput('out_x')", "\u{0}out", CallMethod::ReadOutput),
    ] {
        assert_eq!(methods_of(cell), vec![(tool.to_owned(), method)], "{cell}");
    }
}

#[test]
fn method_names_are_the_guest_api_names_and_parse_back() {
    let names: Vec<&str> = CallMethod::ALL.iter().map(|m| m.as_str()).collect();
    assert_eq!(names, ["callValue", "call", "namespace", "mcp", "yield_control", "readOutput"]);
    for method in CallMethod::ALL {
        assert_eq!(CallMethod::parse(method.as_str()), Some(method));
    }
    assert_eq!(CallMethod::parse("callvalue"), None);
}

#[test]
fn read_output_sends_the_handle_and_only_the_options_given() {
    let inputs = |cell: &str| -> Vec<String> { calls_of(cell).into_iter().map(|c| c.input_json).collect() };
    assert_eq!(
        inputs("await readOutput('out_x', {offset: 5, limit: 10, other: 1})"),
        [r#"{"handle":"out_x","offset":5,"limit":10}"#]
    );
    assert_eq!(inputs("await readOutput('out_x')"), [r#"{"handle":"out_x"}"#]);
    assert_eq!(inputs("await readOutput(7, 'nope')"), [r#"{"handle":7}"#]);
}
