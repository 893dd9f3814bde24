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
    assert_eq!(names, ["callValue", "call", "namespace", "mcp", "yield_control", "readOutput", "models", "agents.run"]);
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

/// The host-backed APIs exist only when the run's setup says the host backs them.
const HOST_APIS: &str = r#"{"models": true, "agents": true}"#;

fn host_api_calls(cell: &str) -> Vec<codemode_engine::ToolCall> {
    let mut engine = engine_with(Limits::default());
    let out = engine.start(cell, Language::JavaScript, 2000.0, 1, HOST_APIS);
    assert_eq!(out.status, Status::Pending, "{cell}");
    out.calls
}

#[test]
fn models_and_agents_calls_name_their_bridge_methods_and_send_only_what_was_checked() {
    for (cell, tool, method, input) in [
        (
            "await models.getModelsOfType('image')",
            codemode_engine::MODELS_TOOL,
            CallMethod::Models,
            r#"{"op":"list","type":"image","available":false}"#,
        ),
        (
            "await models.getAvailableOfType('chat', 'acme')",
            codemode_engine::MODELS_TOOL,
            CallMethod::Models,
            r#"{"op":"list","type":"chat","provider":"acme","available":true}"#,
        ),
        (
            "await models.generateImages({provider: 'p', id: 'i', type: 'image', name: 'n'}, {input: [{type: 'text', text: 't', x: 1}]})",
            codemode_engine::MODELS_TOOL,
            CallMethod::Models,
            r#"{"op":"images","provider":"p","id":"i","context":{"input":[{"type":"text","text":"t"}]}}"#,
        ),
        (
            "await agents.run('go', {name: 'n'})",
            codemode_engine::AGENTS_TOOL,
            CallMethod::Agents,
            r#"{"prompt":"go","options":{"name":"n"}}"#,
        ),
    ] {
        let calls = host_api_calls(cell);
        let got: Vec<(String, CallMethod, String)> = calls.into_iter().map(|c| (c.tool, c.method, c.input_json)).collect();
        assert_eq!(got, vec![(tool.to_owned(), method, input.to_owned())], "{cell}");
    }
}

#[test]
fn without_the_host_saying_so_there_is_no_models_or_agents_global() {
    let mut engine = engine_with(Limits::default());
    let out = engine.start(
        "return [typeof models, typeof agents, typeof phase, typeof log]",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Completed(r#"["undefined","undefined","undefined","undefined"]"#.into()));
}
