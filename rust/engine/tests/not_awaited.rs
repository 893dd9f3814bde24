//! A forgotten `await` is named: a bridge call's Promise found in the cell's value, an output or
//! a call's input, or used as a string, reads `[Promise of call_N <expression>: ...]`, and a
//! `NotAwaited` output says which call and where (once per call, at most five a run). Nothing
//! the guest builds or overrides can make the text name a call that is not there.

mod common;

use codemode_engine::{Language, Limits, Output, OutputKind, Settlement, Status};
use common::{engine_with, RUN};

/// Runs `cell` to its end, answering every call with `2`; the end and every output.
fn run_with(limits: Limits, cell: &str) -> (Status, Vec<Output>) {
    let mut engine = engine_with(limits);
    let mut out = engine.start(cell, Language::JavaScript, 2000.0, 1, RUN);
    let mut outputs = std::mem::take(&mut out.outputs);
    let mut rounds = 0;
    while out.status == Status::Pending {
        rounds += 1;
        assert!(rounds < 50, "{cell}: never ends");
        let settlements = out.calls.iter().map(|c| Settlement { id: c.id, ok: true, payload: "2".into() }).collect();
        out = engine.settle(settlements, 2000.0);
        outputs.append(&mut out.outputs);
    }
    (out.status, outputs)
}

fn run(cell: &str) -> (Status, Vec<Output>) {
    run_with(Limits::default(), cell)
}

fn value(cell: &str) -> String {
    match run(cell).0 {
        Status::Completed(json) => json,
        other => panic!("{cell}: {other:?}"),
    }
}

/// The texts of the `NotAwaited` outputs, and no other.
fn notices(outputs: &[Output]) -> Vec<&str> {
    outputs.iter().filter(|o| o.kind == OutputKind::NotAwaited).map(|o| o.text.as_str()).collect()
}

#[test]
fn the_cells_value_names_the_unawaited_call_and_a_notice_says_how_to_fix_it() {
    let (status, outputs) = run("const r = tools.double({x: 2}); return {r}");
    assert_eq!(status, Status::Completed(r#"{"r":"[Promise of call_1 tools.double: not awaited; use await]"}"#.into()));
    assert_eq!(
        notices(&outputs),
        ["[not awaited] call_1 tools.double: the cell's value holds its Promise, not its result; write `await tools.double(...)`"]
    );
}

#[test]
fn every_guest_path_labels_its_promise_as_the_cell_wrote_it() {
    for (expression, label) in [
        ("tools.double({})", "call_1 tools.double"),
        ("tools.callValue('host:core:double', {})", r#"call_1 tools.callValue(\"host:core:double\")"#),
        ("tools.call('host:core:double', {})", r#"call_1 tools.call(\"host:core:double\")"#),
        ("codemode.tools.call('double', {})", r#"call_1 tools.call(\"double\")"#),
        ("MCP.gh.createIssue({})", "call_1 MCP.gh.createIssue"),
        ("MCP.gh.resources.read({uri: 'x'})", "call_1 MCP.gh.resources.read"),
        ("MCP.gh.prompts.get({name: 'x'})", "call_1 MCP.gh.prompts.get"),
        ("Issues.list()", "call_1 Issues.list"),
        ("Issues.comments.add(1, 'hi')", "call_1 Issues.comments.add"),
        ("yield_control('why')", "call_1 yield_control"),
        ("readOutput('h', {})", "call_1 readOutput"),
        ("tools.search('double')", "tools.search"),
        ("tools.describe('host:core:double')", "tools.describe"),
        ("searchTools('double')", "searchTools"),
        ("describeTool('double')", "describeTool"),
    ] {
        let expected = format!(r#"{{"p":"[Promise of {label}: not awaited; use await]"}}"#);
        assert_eq!(value(&format!("const p = {expression}; return {{p}}")), expected, "{expression}");
    }
}

#[test]
fn the_notice_says_where_the_promise_was_found() {
    for (cell, where_) in [
        ("text({r})", "a text() output"),
        ("json([r])", "a json() output"),
        ("console.log('r is', r)", "a console.log() output"),
        ("console.warn(r)", "a console.warn() output"),
        ("await tools.other({r})", "the input of call_2 tools.other"),
        ("await Issues.list({page: r})", "the input of call_2 Issues.list"),
        ("await MCP.gh.createIssue({title: r})", "the input of call_2 MCP.gh.createIssue"),
        ("await tools.callValue('host:core:other', [r])", r#"the input of call_2 tools.callValue("host:core:other")"#),
    ] {
        let (_, outputs) = run(&format!("const r = tools.double({{}}); {cell}"));
        let expected = format!(
            "[not awaited] call_1 tools.double: {where_} holds its Promise, not its result; write `await tools.double(...)`"
        );
        assert_eq!(notices(&outputs), [expected.as_str()], "{cell}");
    }
}

#[test]
fn a_notice_follows_the_output_that_holds_the_promise() {
    let (_, outputs) = run("const r = tools.double({}); text('before'); text(r); text('after')");
    let kinds: Vec<_> = outputs.iter().map(|o| o.kind).collect();
    assert_eq!(kinds, [OutputKind::Text, OutputKind::Text, OutputKind::NotAwaited, OutputKind::Text]);
    assert_eq!(outputs[1].text, r#""[Promise of call_1 tools.double: not awaited; use await]""#);
}

#[test]
fn a_promise_used_as_a_string_or_number_reads_the_marker_and_is_noticed() {
    let (status, outputs) = run("const r = tools.double({}); return [r + 1, `${r}!`, String(r), r * 1]");
    let marker = "[Promise of call_1 tools.double: not awaited; use await]";
    assert_eq!(status, Status::Completed(format!(r#"["{marker}1","{marker}!","{marker}",null]"#)));
    assert_eq!(
        notices(&outputs),
        ["[not awaited] call_1 tools.double: its Promise was used as a string or number, not its result; write `await tools.double(...)`"]
    );
}

#[test]
fn a_promise_in_a_thrown_value_is_noticed_too() {
    let (status, outputs) = run("const r = tools.double({}); throw {r}");
    match status {
        Status::Failed(f) => assert!(f.message.contains("[Promise of call_1 tools.double"), "{}", f.message),
        other => panic!("{other:?}"),
    }
    assert_eq!(notices(&outputs).len(), 1);
    assert!(notices(&outputs)[0].contains("the error the cell threw holds its Promise"));
}

#[test]
fn each_call_is_noticed_once_and_a_run_at_most_five_times() {
    let (_, outputs) = run("const r = tools.double({}); text(r); json({r}); console.log(r, r); return [r, '' + r]");
    assert_eq!(notices(&outputs).len(), 1);
    assert!(notices(&outputs)[0].contains("a text() output"));
    let (status, outputs) = run("const all = []; for (let i = 0; i < 8; i++) all.push(tools.double({i})); return all");
    let noticed = notices(&outputs);
    assert_eq!(noticed.len(), 5);
    for (i, text) in noticed.iter().enumerate() {
        assert!(text.starts_with(&format!("[not awaited] call_{} tools.double:", i + 1)), "{text}");
    }
    // Past the bound, the value still names every call.
    assert!(matches!(status, Status::Completed(json) if json.contains("call_8 tools.double")));
}

#[test]
fn awaited_calls_and_a_returned_promise_are_not_noticed() {
    for cell in [
        "const r = await tools.double({}); text(r); json({r}); return {r, s: '' + r}",
        "return tools.double({})",
        "const [a, b] = await Promise.all([tools.double({}), Issues.list()]); return a + b",
        "const {result} = await tools.call('double', {}); return result",
        "await yield_control('x'); return (await tools.search('double')).length",
    ] {
        let (status, outputs) = run(cell);
        assert!(matches!(status, Status::Completed(_)), "{cell}: {status:?}");
        assert_eq!(notices(&outputs), Vec::<&str>::new(), "{cell}");
    }
}

#[test]
fn a_promise_no_bridge_call_made_keeps_the_generic_marker_and_converts_as_before() {
    let generic = "[Promise: not awaited; use await]";
    let (status, outputs) = run("const p = Promise.resolve(1); const q = tools.double({}).then(x => x); \
         const o = Promise.resolve(2); o.toString = () => 'own'; \
         return {p, q, s: '' + p, t: `${o}`, n: Number(o)}");
    assert_eq!(
        status,
        Status::Completed(format!(r#"{{"p":"{generic}","q":"{generic}","s":"[object Promise]","t":"own","n":null}}"#))
    );
    assert_eq!(notices(&outputs), Vec::<&str>::new());
}

#[test]
fn guest_built_and_subclassed_promises_cannot_pass_for_a_call() {
    let generic = "[Promise: not awaited; use await]";
    let cell = "void tools.double({}); const fake = Object.setPrototypeOf({}, Promise.prototype); \
                class P extends Promise {}; const sub = new P(() => {}); \
                const convert = Promise.prototype[Symbol.toPrimitive]; \
                return {fake, sub, direct: convert.call(fake, 'string'), onNumber: convert.call(5, 'number')}";
    let (status, outputs) = run(cell);
    assert_eq!(
        status,
        Status::Completed(format!(
            r#"{{"fake":"{generic}","sub":"{generic}","direct":"[object Promise]","onNumber":5}}"#
        ))
    );
    assert_eq!(notices(&outputs), Vec::<&str>::new());
}

#[test]
fn overrides_the_guest_makes_neither_change_the_marker_nor_invoke_then() {
    let cell = "let called = 0; \
        globalThis.WeakMap = function () { called++ }; WeakMap.prototype.get = () => { called++ }; \
        const r = tools.double({}); \
        r.then = () => { called++ }; r.constructor = function () { called++ }; \
        Object.defineProperty(Promise, Symbol.hasInstance, {value: () => { called++; return false }}); \
        globalThis.Promise = function () { called++ }; \
        let replaced; try { Object.defineProperty(Object.getPrototypeOf(r), Symbol.toPrimitive, {value: () => 'lie'}); replaced = true } \
        catch (e) { replaced = false } \
        json(r); text(r); console.log(r); \
        return {r, s: `${r}`, replaced, called}";
    let marker = "[Promise of call_1 tools.double: not awaited; use await]";
    let (status, outputs) = run(cell);
    // `called` is read before the value itself is serialized: naming `r` three times and
    // converting it ran none of the overrides.
    assert_eq!(status, Status::Completed(format!(r#"{{"r":"{marker}","s":"{marker}","replaced":false,"called":0}}"#)));
    assert_eq!(notices(&outputs).len(), 1);
}

#[test]
fn setters_on_the_prototypes_never_see_what_the_prelude_keeps_about_a_call() {
    let cell = "let leaks = 0; \
        const spy = {set(v) { if (v !== null && typeof v === 'object' && Object.hasOwn(v, 'noticed')) leaks++ }, configurable: true}; \
        for (const key of ['0', '1', '2', '3']) Object.defineProperty(Array.prototype, key, spy); \
        for (const key of ['id', 'where', 'next', 'noticed']) Object.defineProperty(Object.prototype, key, spy); \
        const a = tools.double({}); const b = tools.other({}); text(a); json({b}); const s = `${a}`; \
        return {a, b, leaks}";
    let (status, outputs) = run(cell);
    let (a, b) = (
        "[Promise of call_1 tools.double: not awaited; use await]",
        "[Promise of call_2 tools.other: not awaited; use await]",
    );
    assert_eq!(status, Status::Completed(format!(r#"{{"a":"{a}","b":"{b}","leaks":0}}"#)));
    assert_eq!(notices(&outputs).len(), 2);
}

#[test]
fn a_promise_whose_own_to_primitive_the_guest_set_says_what_the_guest_wrote_and_no_notice() {
    let cell = "const r = tools.double({}); \
        Object.defineProperty(r, Symbol.toPrimitive, {value: () => '[Promise of call_9 tools.other: lie]'}); \
        return '' + r";
    let (status, outputs) = run(cell);
    assert_eq!(status, Status::Completed(r#""[Promise of call_9 tools.other: lie]""#.into()));
    assert_eq!(notices(&outputs), Vec::<&str>::new());
}

/// A refused call's promise has rejected saying why, and a cell can make thousands of them (the
/// hostile corpus makes 10,000 under a 16 MiB limit): none is remembered.
#[test]
fn a_refused_call_is_not_remembered() {
    let limits = Limits { max_pending_calls: 1, ..Limits::default() };
    let (status, outputs) =
        run_with(limits, "const a = tools.double({}); const b = tools.other({}); b.catch(() => {}); return {a, b}");
    assert_eq!(
        status,
        Status::Completed(
            r#"{"a":"[Promise of call_1 tools.double: not awaited; use await]","b":"[Promise: not awaited; use await]"}"#
                .into()
        )
    );
    assert_eq!(notices(&outputs).len(), 1);
}

#[test]
fn a_long_tool_id_is_clipped_in_the_label() {
    let long = "x".repeat(5000);
    let (status, outputs) =
        run(&format!("const p = tools.callValue('{long}', {{}}); p.catch(() => {{}}); return {{p}}"));
    let Status::Completed(json) = status else { panic!("{status:?}") };
    assert!(json.len() < 300, "{json}");
    assert!(json.contains(&format!(r#"tools.callValue(\"{}…\")"#, "x".repeat(80))), "{json}");
    assert!(notices(&outputs)[0].len() < 500);
}

#[test]
fn a_notice_counts_against_the_output_budget() {
    let cell = "const r = tools.double({}); text('y'.repeat(900)); return {r}";
    let roomy = Limits { max_output_bytes: 1200, ..Limits::default() };
    assert!(matches!(run_with(roomy, cell).0, Status::Completed(_)));
    let tight = Limits { max_output_bytes: 1000, ..Limits::default() };
    let (status, _) = run_with(tight, cell);
    assert!(matches!(&status, Status::Failed(f) if f.name == "OutputLimitError"), "{status:?}");
    // Without the notice the same value fits.
    let plain = "const r = Promise.resolve(1); text('y'.repeat(900)); return {r}";
    assert!(matches!(run_with(tight, plain).0, Status::Completed(_)));
}
