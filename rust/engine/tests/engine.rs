//! Behaviour of one run, driven as the worker drives it.

use std::sync::Arc;

use codemode_engine::{Catalog, Engine, ErrorCode, Language, Limits, OutputKind, Settlement, Status};

fn engine() -> Engine {
    engine_with(Limits::default())
}

fn engine_with(limits: Limits) -> Engine {
    match Engine::new(limits, Arc::new(Catalog::empty())) {
        Ok(e) => e,
        Err(e) => panic!("engine: {e}"),
    }
}

fn run(source: &str) -> Status {
    engine().start(source, Language::JavaScript, 2000.0, 7, "{}").status
}

fn failure_code(status: &Status) -> Option<ErrorCode> {
    match status {
        Status::Failed(f) => f.code,
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn returns_json_value_of_the_cell() {
    assert_eq!(run("return 1 + 1"), Status::Completed("2".into()));
    assert_eq!(
        run("const a = await Promise.resolve({x: [1, 'two']}); return a"),
        Status::Completed(r#"{"x":[1,"two"]}"#.into())
    );
}

#[test]
fn non_json_values_fall_back_to_json_safe_forms() {
    assert_eq!(run("return undefined"), Status::Completed("null".into()));
    assert_eq!(run("return function named() {}"), Status::Completed(r#""[Function: named]""#.into()));
    assert_eq!(run("return 12n"), Status::Completed(r#""12""#.into()));
    assert_eq!(
        run("const a = {n: 1}; a.self = a; return a"),
        Status::Completed(r#"{"n":1,"self":"[Circular]"}"#.into())
    );
    assert_eq!(run("return [NaN, Infinity]"), Status::Completed("[null,null]".into()));
}

#[test]
fn uncaught_guest_error_is_a_failure_without_code() {
    match run("throw new TypeError('boom')") {
        Status::Failed(f) => {
            assert_eq!(f.code, None);
            assert_eq!(f.name, "TypeError");
            assert_eq!(f.message, "boom");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tool_calls_are_reported_and_settled() {
    let mut e = engine();
    let out = e.start(
        "const [a, b] = await Promise.all([tools.callValue('t:a', {n: 1}), tools.callValue('t:b', {n: 2})]); return a + b",
        Language::JavaScript,
        2000.0,
        1, "{}",
    );
    assert_eq!(out.status, Status::Pending);
    assert_eq!(out.calls.len(), 2);
    assert_eq!(out.calls[0].tool, "t:a");
    assert_eq!(out.calls[0].input_json, r#"{"n":1}"#);
    let first = e.settle(vec![Settlement { id: out.calls[0].id, ok: true, payload: "40".into() }], 2000.0);
    assert_eq!(first.status, Status::Pending);
    assert_eq!(first.in_flight, 1);
    let done = e.settle(vec![Settlement { id: out.calls[1].id, ok: true, payload: "2".into() }], 2000.0);
    assert_eq!(done.status, Status::Completed("42".into()));
}

#[test]
fn tool_error_is_a_catchable_plain_error() {
    let mut e = engine();
    let out = e.start(
        "try { await tools.callValue('t:x', {}) } catch (err) { return [err instanceof Error, err.message] }",
        Language::JavaScript,
        2000.0,
        1,
        "[]",
    );
    let id = out.calls[0].id;
    let done = e.settle(vec![Settlement { id, ok: false, payload: "tool t:x failed: nope".into() }], 2000.0);
    assert_eq!(done.status, Status::Completed(r#"[true,"tool t:x failed: nope"]"#.into()));
}

#[test]
fn too_many_pending_calls_reject() {
    let limits = Limits { max_pending_calls: 2, ..Limits::default() };
    let mut e = engine_with(limits);
    let out = e.start(
        "const ps = [1,2,3].map(i => tools.callValue('t', {i}).catch(e => e.message)); return 0",
        Language::JavaScript,
        2000.0,
        1,
        "[]",
    );
    assert_eq!(out.calls.len(), 2);
}

#[test]
fn infinite_loops_are_interrupted() {
    for src in [
        "while (true) {}",
        "await null; while (true) {}",
        "try { while (true) {} } catch (e) { return 'caught' }",
        "try { throw 1 } finally { while (true) {} }",
        "Promise.resolve().then(() => { for (;;) {} }); await new Promise(r => Promise.resolve().then(r)); while(true){}",
    ] {
        let status = engine().start(src, Language::JavaScript, 100.0, 1, "{}").status;
        assert_eq!(failure_code(&status), Some(ErrorCode::Timeout), "{src}");
    }
}

#[test]
fn memory_bombs_end_the_run_even_when_caught() {
    let limits = Limits { memory_bytes: 8 << 20, ..Limits::default() };
    for src in [
        "const a = []; while (true) a.push({x: a.length, y: 'z'.repeat(10)})",
        "let s = 'x'; while (true) s = s.repeat(2)",
        "try { let s = 'x'; while (true) s = s.repeat(2) } catch (e) { return 'swallowed' }",
        "const root = {}; let n = root; while (true) { n.next = {a: [1, 2, 3], b: {}}; n = n.next }",
    ] {
        let status = engine_with(limits).start(src, Language::JavaScript, 5000.0, 1, "{}").status;
        assert_eq!(failure_code(&status), Some(ErrorCode::MemoryLimitExceeded), "{src}");
    }
}

#[test]
fn rope_string_doubling_fails_clearly() {
    match run("let s = 'x'; while (true) s += s") {
        Status::Failed(f) => {
            assert!(f.message == "string too long" || f.code == Some(ErrorCode::MemoryLimitExceeded), "{f:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn output_flood_is_cut() {
    let limits = Limits { max_output_bytes: 1024, ..Limits::default() };
    let status = engine_with(limits)
        .start(
            "try { while (true) text('xxxxxxxx') } catch (e) { return 'swallowed' }",
            Language::JavaScript,
            2000.0,
            1,
            "[]",
        )
        .status;
    assert_eq!(failure_code(&status), Some(ErrorCode::OutputLimitExceeded));
    let status = engine_with(limits).start("return 'y'.repeat(5000)", Language::JavaScript, 2000.0, 1, "{}").status;
    assert_eq!(failure_code(&status), Some(ErrorCode::OutputLimitExceeded));
}

#[test]
fn outputs_keep_call_order() {
    let out = engine().start(
        "text('a'); json({b: 1}); console.warn('c', 2); return null",
        Language::JavaScript,
        2000.0,
        1,
        "[]",
    );
    let kinds: Vec<_> = out.outputs.iter().map(|o| (o.kind, o.text.as_str())).collect();
    assert_eq!(
        kinds,
        vec![(OutputKind::Text, "a"), (OutputKind::Json, r#"{"b":1}"#), (OutputKind::Warn, "[warn] c 2")]
    );
}

#[test]
fn a_promise_nothing_settles_is_reported_as_deadlock() {
    match run("await new Promise(() => {})") {
        Status::Failed(f) => {
            assert_eq!(f.code, Some(ErrorCode::Timeout));
            assert_eq!(f.name, "DeadlockError");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unbounded_recursion_is_a_range_error() {
    match run("function f() { return f() + 1 } return f()") {
        Status::Failed(f) => assert_eq!(f.name, "RangeError"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn module_access_and_syntax_errors_are_invalid_input() {
    for src in ["import fs from 'fs'", "return require('fs')", "await import('x')", "return 1 +"] {
        assert_eq!(failure_code(&run(src)), Some(ErrorCode::InvalidInput), "{src}");
    }
}

/// A plain JavaScript cell goes to QuickJS without the front end's parse
/// (`frontend::plain_script`); one QuickJS refuses gets the front end's diagnostic all the same,
/// and a cell that is not plain is refused by the front end as before.
#[test]
fn a_plain_cell_quickjs_refuses_fails_with_the_front_ends_diagnostic() {
    use codemode_engine::frontend::{plain_script, prepare};
    for src in [
        "return 1 +",
        "a b",
        "return (1",
        "const a = 1; const a = 2",
        "return 1 }",
        "}); x = 1; (async () => {",
        "import fs from 'fs'",
        "return require('fs')",
        "return 1 / ",
        "const x = { a: 1,, }",
    ] {
        match (run(src), prepare(src, Language::JavaScript)) {
            (Status::Failed(failure), Err(front)) => {
                assert_eq!(failure.message, front.message(), "{src} (plain: {})", plain_script(src));
                assert_eq!(failure.code, Some(ErrorCode::InvalidInput), "{src}");
            }
            // What only QuickJS refuses (a redeclaration: the front end parses, it does not
            // resolve names), it refuses in its own words, as before.
            (Status::Failed(failure), Ok(_)) => {
                assert_eq!(
                    (failure.name.as_str(), failure.code),
                    ("SyntaxError", Some(ErrorCode::InvalidInput)),
                    "{src}"
                );
                assert!(failure.message.contains("redefinition"), "{src}: {failure:?}");
            }
            (other, _) => panic!("{src}: {other:?}"),
        }
    }
    assert!(plain_script("return 1 +") && plain_script("a b") && !plain_script("return 1 }"));
}

#[test]
fn host_globals_do_not_exist() {
    assert_eq!(
        run("return [typeof process, typeof require, typeof fetch, typeof WeakRef, typeof FinalizationRegistry, typeof setTimeout]"),
        Status::Completed(r#"["undefined","undefined","undefined","undefined","undefined","undefined"]"#.into())
    );
}

#[test]
fn random_is_sfc32_from_the_seed_halves_after_twelve_rounds() {
    // sfc32 seeded with (hi, lo, hi ^ 0x9e3779b9, lo ^ 0x85ebca6b), 12 rounds dropped: the
    // sequence the guest-side seeding gave, pinned: a seeded run is reproducible across builds.
    let cell = "return [Math.random(), Math.random(), Math.random()]";
    for (seed, want) in [
        (0u64, "[0.9590891762636602,0.03144328226335347,0.14240834792144597]"),
        (99, "[0.7876690027769655,0.5682987261097878,0.4084720683749765]"),
        (0x1234_5678_9abc_def0, "[0.7824223546776921,0.20267076906748116,0.8034400779288262]"),
        (u64::MAX, "[0.7560571047943085,0.45212187455035746,0.7994883516803384]"),
    ] {
        let got = engine().start(cell, Language::JavaScript, 2000.0, seed, "{}").status;
        assert_eq!(got, Status::Completed(want.into()), "seed {seed}");
    }
}

#[test]
fn random_is_seeded_and_clock_replays() {
    let a = engine().start("return [Math.random(), Math.random()]", Language::JavaScript, 2000.0, 99, "{}").status;
    let b = engine().start("return [Math.random(), Math.random()]", Language::JavaScript, 2000.0, 99, "{}").status;
    let c = engine().start("return [Math.random(), Math.random()]", Language::JavaScript, 2000.0, 100, "{}").status;
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mut e = engine();
    e.replay_clock(&[(1000.0, 2), (2000.0, 1)]);
    let out = e.start(
        "return [Date.now(), Date.now(), new Date().getTime(), new Date(5).getTime()]",
        Language::JavaScript,
        2000.0,
        1,
        "[]",
    );
    assert_eq!(out.status, Status::Completed("[1000,1000,2000,5]".into()));
    assert_eq!(out.clock_reads, vec![(1000.0, 2), (2000.0, 1)]);
}

#[test]
fn typescript_cells_run() {
    let status = engine()
        .start(
            "interface P { x: number }\nconst p: P = { x: 41 };\nreturn (p.x as number) + 1;",
            Language::TypeScript,
            2000.0,
            1,
            "[]",
        )
        .status;
    assert_eq!(status, Status::Completed("42".into()));
}

#[test]
fn build_cost_is_printed() {
    let t = std::time::Instant::now();
    for _ in 0..50 {
        drop(engine());
    }
    println!("engine new+drop: {:?} each", t.elapsed() / 50);
    let mut engines: Vec<_> = (0..50).map(|_| engine()).collect();
    let t = std::time::Instant::now();
    for e in engines.iter_mut() {
        let _ = e.start("return 1 + 1", Language::JavaScript, 1000.0, 1, "{}");
    }
    println!("start trivial: {:?} each", t.elapsed() / 50);
}

#[test]
fn yield_control_is_a_call_the_host_settles() {
    let mut e = engine();
    let out = e.start("await yield_control('need input'); return 'resumed'", Language::JavaScript, 2000.0, 1, "{}");
    assert_eq!(out.status, Status::Pending);
    assert_eq!(out.calls[0].tool, codemode_engine::YIELD_TOOL);
    assert_eq!(out.calls[0].input_json, r#""need input""#);
    let done = e.settle(vec![Settlement { id: out.calls[0].id, ok: true, payload: "null".into() }], 2000.0);
    assert_eq!(done.status, Status::Completed(r#""resumed""#.into()));
}

#[test]
fn store_writes_come_back_on_completion_and_load_sees_them() {
    let out = engine().start(
        "store('a', {n: 1}); store('b', undefined); return [load('a'), load('c'), load('b')]",
        Language::JavaScript,
        2000.0,
        1,
        r#"{"store": {"c": "[1,2]", "b": "true"}}"#,
    );
    assert_eq!(out.status, Status::Completed(r#"[{"n":1},[1,2],null]"#.into()));
    assert_eq!(out.store_writes.as_deref(), Some(r#"{"a":"{\"n\":1}","b":null}"#));
}

#[test]
fn store_writes_are_dropped_when_the_cell_fails() {
    let out = engine().start("store('a', 1); throw new Error('no')", Language::JavaScript, 2000.0, 1, "{}");
    assert!(matches!(out.status, Status::Failed(_)));
    assert_eq!(out.store_writes, None);
}

#[test]
fn exit_ends_the_run_normally_even_inside_try() {
    let out = engine().start(
        "store('k', 1); try { exit() } catch (e) { return 'caught' } finally { return 'finally' }",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Completed("null".into()));
    assert_eq!(out.store_writes.as_deref(), Some(r#"{"k":"1"}"#));
}

#[test]
fn image_takes_only_base64_data_urls() {
    let out = engine().start(
        "image('data:image/png;base64,iVBORw0KGgo='); try { image('https://x/y.png') } catch (e) { return e.name }",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Completed(r#""TypeError""#.into()));
    assert_eq!(out.outputs[0].kind, OutputKind::Image);
    assert_eq!(out.outputs[0].text, "image/png;iVBORw0KGgo=");
}

/// A cell that builds `v`, nested `depth` arrays deep.
fn nested(depth: usize, then: &str) -> String {
    format!("let v = 0; for (let i = 0; i < {depth}; i++) v = [v];\n{then}")
}

fn completed(status: &Status) -> &str {
    match status {
        Status::Completed(json) => json,
        other => panic!("expected completion, got {other:?}"),
    }
}

#[test]
fn a_returned_value_nested_past_the_depth_limit_fails_the_run_naming_it() {
    use codemode_engine::limits::MAX_VALUE_DEPTH;
    assert!(matches!(run(&nested(MAX_VALUE_DEPTH, "return v")), Status::Completed(_)));
    for depth in [MAX_VALUE_DEPTH + 1, 1000, 4000] {
        match run(&nested(depth, "return v")) {
            Status::Failed(f) => {
                assert_eq!((f.code, f.name.as_str()), (Some(ErrorCode::InvalidInput), "RangeError"));
                assert!(f.message.contains(&format!("nested deeper than {MAX_VALUE_DEPTH} levels")), "{}", f.message);
            }
            other => panic!("depth {depth}: {other:?}"),
        }
    }
    // Objects count as arrays do; strings that look nested do not.
    let objects = "let v = 0; for (let i = 0; i < 200; i++) v = {v}; return v";
    assert_eq!(failure_code(&run(objects)), Some(ErrorCode::InvalidInput));
    assert!(matches!(run("return '['.repeat(5000)"), Status::Completed(_)));
}

#[test]
fn every_other_way_out_refuses_a_deep_value_with_a_catchable_range_error() {
    for way in [
        "tools.callValue('t', {value: v})",
        "tools.call('t', v)",
        "json(v)",
        "store('k', v)",
        "console.log('ok'); json({a: v})",
    ] {
        let cell = nested(
            1000,
            &format!(
                "try {{ await {way}; return 'passed' }} catch (e) {{ return [e.name, String(e.message).includes('nested deeper than 128 levels')] }}"
            ),
        );
        let mut engine = engine();
        let outcome = engine.start(&cell, Language::JavaScript, 2000.0, 7, "{}");
        assert!(outcome.calls.is_empty(), "{way}: a call reached the host");
        assert_eq!(completed(&outcome.status), r#"["RangeError",true]"#, "{way}");
        assert!(outcome.outputs.iter().all(|o| o.kind != OutputKind::Json), "{way}: {:?}", outcome.outputs);
    }
}

#[test]
fn tool_calls_past_the_report_budget_do_not_start_and_reject_catchably() {
    let limits = Limits { max_report_bytes: 4 << 20, max_bridge_bytes: 2 << 20, ..Limits::default() };
    let cell = "const big = 'x'.repeat(1500000); const got = [];\n\
                for (let i = 0; i < 5; i++) got.push(tools.callValue('t', big).then(() => 'ok', (e) => e.name + ': ' + e.message));\n\
                return await Promise.all(got)";
    let mut engine = engine_with(limits);
    let first = engine.start(cell, Language::JavaScript, 2000.0, 7, "{}");
    let sent: usize = first.calls.iter().map(|c| c.input_json.len() + c.tool.len()).sum();
    assert_eq!(first.calls.len(), 2, "two 1.5 MB inputs fit a 4 MiB report, a third does not");
    assert!(sent <= limits.max_report_bytes);
    // The budget is per report: once the host has them, the next step starts afresh.
    let settle = first.calls.iter().map(|c| Settlement { id: c.id, ok: true, payload: "1".into() }).collect();
    let second = engine.settle(settle, 2000.0);
    let json = completed(&second.status);
    assert!(json.starts_with(r#"["ok","ok","RangeError: this tool call would make this step's tool calls"#), "{json}");
}

#[test]
fn bytes_held_for_the_host_count_against_the_memory_limit_and_in_memory_bytes() {
    let limits = Limits { memory_bytes: 8 << 20, ..Limits::default() };
    // Within the limit: what the outcome carries out is part of the memory it reports.
    let cell = "const big = 'x'.repeat(1000000); await tools.callValue('t', big); return 1";
    let outcome = engine_with(limits).start(cell, Language::JavaScript, 2000.0, 7, "{}");
    let held: usize = outcome.calls.iter().map(|c| c.input_json.len()).sum();
    assert_eq!((outcome.status, outcome.calls.len()), (Status::Pending, 1));
    assert!(
        outcome.memory_bytes >= held + 1_000_000,
        "memory_bytes {} leaves out {held} held bytes",
        outcome.memory_bytes
    );
    // Past it, however small each input and whatever the guest catches: the run is over.
    for size in [2_000_000, 700_000, 100_000] {
        let cell = format!(
            "const got = [];\n\
             for (let i = 0; i < 16; i++) try {{ got.push(tools.callValue('t', 'x'.repeat({size})).catch(() => 0)) }} catch (e) {{}}\n\
             return await Promise.all(got)"
        );
        let mut engine = engine_with(Limits { max_pending_calls: 16, memory_bytes: 2 << 20, ..limits });
        let outcome = engine.start(&cell, Language::JavaScript, 2000.0, 7, "{}");
        let held: usize = outcome.calls.iter().map(|c| c.input_json.len()).sum();
        if size * 16 > 2 << 20 {
            assert_eq!(failure_code(&outcome.status), Some(ErrorCode::MemoryLimitExceeded), "{size}");
        }
        assert!(held <= 2 << 20, "{held} bytes of inputs held under a 2 MiB limit");
    }
}

#[test]
fn a_clock_read_loop_journals_runs_of_readings_not_each_reading() {
    let cell = "let n = 0; for (let i = 0; i < 300000; i++) { n += Date.now() === Date.now() ? 1 : 0 } return 1";
    let outcome = engine().start(cell, Language::JavaScript, 10_000.0, 7, "{}");
    assert_eq!(completed(&outcome.status), "1");
    let reads: u64 = outcome.clock_reads.iter().map(|(_, count)| u64::from(*count)).sum();
    assert_eq!(reads, 600_000);
    assert!(outcome.clock_reads.len() < 20_000, "{} runs for 600,000 reads", outcome.clock_reads.len());
    assert!(outcome.clock_reads.iter().all(|(ms, _)| ms.fract() == 0.0), "Date.now() gives whole milliseconds");
}

#[test]
fn a_clock_that_keeps_changing_cannot_grow_a_report_past_its_budget() {
    let limits = Limits { max_report_bytes: 64 << 10, ..Limits::default() };
    let distinct: Vec<(f64, u32)> = (0..100_000).map(|ms| (f64::from(ms), 1)).collect();
    let mut engine = engine_with(limits);
    engine.replay_clock(&distinct);
    let cell = "let n = 0; try { for (;;) { Date.now(); n++ } } catch (e) { return [n, e.name] }";
    let outcome = engine.start(cell, Language::JavaScript, 2000.0, 7, "{}");
    let expected = limits.max_report_bytes / 14;
    assert_eq!(completed(&outcome.status), format!(r#"[{expected},"RangeError"]"#));
    assert!(outcome.clock_reads.len() * 14 <= limits.max_report_bytes);
}

fn settle_all(e: &mut Engine, ids: &[u32], payload: &str) -> codemode_engine::Outcome {
    e.settle(ids.iter().map(|&id| Settlement { id, ok: true, payload: payload.into() }).collect(), 2000.0)
}

#[test]
fn a_call_nobody_awaits_is_still_started_and_the_run_ends_after_it_settles() {
    let mut e = engine();
    let out = e.start("void tools.callValue('t:audit', {}); return 'done'", Language::JavaScript, 2000.0, 1, "{}");
    assert_eq!(out.status, Status::Pending);
    assert_eq!(out.calls.len(), 1);
    assert_eq!(out.calls[0].tool, "t:audit");
    let done = settle_all(&mut e, &[out.calls[0].id], "null");
    assert_eq!(done.status, Status::Completed(r#""done""#.into()));
}

#[test]
fn the_losers_of_a_race_settle_before_the_run_completes_with_the_winner_the_cell_saw() {
    let mut e = engine();
    let out = e.start(
        "return await Promise.race([tools.callValue('t:fast', {}), tools.callValue('t:slow', {})])",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    let (fast, slow) = (out.calls[0].id, out.calls[1].id);
    let decided = settle_all(&mut e, &[fast], r#""fast""#);
    assert_eq!(decided.status, Status::Pending, "the loser is still running");
    assert_eq!(decided.in_flight, 1);
    let done = settle_all(&mut e, &[slow], r#""slow""#);
    assert_eq!(done.status, Status::Completed(r#""fast""#.into()));
}

#[test]
fn work_a_settling_loser_does_after_the_value_is_decided_still_runs() {
    let mut e = engine();
    let out = e.start(
        "tools.callValue('t:first', {}).then((v) => { text('late ' + v); return tools.callValue('t:second', {}) });
         return 1",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Pending);
    let next = settle_all(&mut e, &[out.calls[0].id], "2");
    assert_eq!(next.status, Status::Pending);
    assert_eq!(next.calls.len(), 1, "a call started after the cell returned is started too");
    assert_eq!(next.outputs[0].text, "late 2");
    let done = settle_all(&mut e, &[next.calls[0].id], "3");
    assert_eq!(done.status, Status::Completed("1".into()));
}

#[test]
fn a_failed_cell_also_ends_only_after_its_started_calls_settle() {
    let mut e = engine();
    let out = e.start(
        "await Promise.all([Promise.reject(new Error('early')), tools.callValue('t:rest', {})])",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Pending);
    let done = settle_all(&mut e, &[out.calls[0].id], "1");
    match done.status {
        Status::Failed(f) => assert_eq!(f.message, "early"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn outputs_and_the_value_share_one_budget_counted_as_the_results_json() {
    let limits = Limits { max_output_bytes: 1024, ..Limits::default() };
    // 1,000 characters of text take 1,024 bytes in the result ({"type":"text","text":"…"},):
    // with any value besides, the budget is passed (it used to count the raw text only).
    let status =
        engine_with(limits).start("text('x'.repeat(1000)); return 1", Language::JavaScript, 2000.0, 1, "{}").status;
    assert_eq!(failure_code(&status), Some(ErrorCode::OutputLimitExceeded));
    let status =
        engine_with(limits).start("text('x'.repeat(900)); return 1", Language::JavaScript, 2000.0, 1, "{}").status;
    assert_eq!(status, Status::Completed("1".into()));
    // Escapes count as the host writes them: 300 newlines are 600 bytes of JSON.
    let status = engine_with(limits)
        .start("text('\\n'.repeat(300)); text('\\n'.repeat(300))", Language::JavaScript, 2000.0, 1, "{}")
        .status;
    assert_eq!(failure_code(&status), Some(ErrorCode::OutputLimitExceeded));
}

#[test]
fn warnings_and_errors_carry_their_prefix_from_the_engine() {
    let out = engine().start(
        "console.warn('w'); console.error('e'); console.log('l')",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    let texts: Vec<_> = out.outputs.iter().map(|o| o.text.as_str()).collect();
    assert_eq!(texts, ["[warn] w", "[error] e", "l"]);
}

#[test]
fn errors_serialize_as_name_and_message_wherever_they_sit() {
    assert_eq!(run("return new TypeError('bad')"), Status::Completed(r#"{"name":"TypeError","message":"bad"}"#.into()));
    assert_eq!(
        run("const e = new Error('x'); e.code = 7; return {errors: [e]}"),
        Status::Completed(r#"{"errors":[{"name":"Error","message":"x"}]}"#.into())
    );
    let out = engine().start("json(new RangeError('r')); return 1", Language::JavaScript, 2000.0, 1, "{}");
    assert_eq!(out.outputs[0].text, r#"{"name":"RangeError","message":"r"}"#);
}

#[test]
fn a_promise_in_the_value_or_an_output_is_named_as_not_awaited_without_being_awaited() {
    let mut e = engine();
    let out = e.start(
        "const r = tools.callValue('t:double', {x: 2}); json({r}); return {r, n: 1n}",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    let named = r#""[Promise of call_1 tools.callValue(\"t:double\"): not awaited; use await]""#;
    assert_eq!(out.outputs[0].text, format!(r#"{{"r":{named}}}"#));
    assert_eq!(out.outputs[1].kind, OutputKind::NotAwaited); // which call, and where (tests/not_awaited.rs)
                                                             // The call it started still runs; the value was decided when the cell returned.
    let done = settle_all(&mut e, &[out.calls[0].id], "4");
    assert_eq!(done.status, Status::Completed(format!(r#"{{"r":{named},"n":"1"}}"#)));
    // A promise no bridge call made keeps the generic marker.
    assert_eq!(
        run("return [Promise.resolve(1)]"),
        Status::Completed(r#"["[Promise: not awaited; use await]"]"#.into())
    );
    // A thenable is a plain object: its `then` is never called.
    assert_eq!(
        run("let called = false; const t = {then() { called = true }, v: 1}; json(t); return {t, called}"),
        Status::Completed(r#"{"t":{"v":1},"called":false}"#.into())
    );
}

#[test]
fn exit_stops_the_guest_but_the_calls_it_started_still_settle_before_the_end() {
    let mut e = engine();
    let out = e.start(
        "tools.callValue('t:audit', {}).then(() => text('never runs')); store('k', 2); exit(); return 'unreached'",
        Language::JavaScript,
        2000.0,
        1,
        "{}",
    );
    assert_eq!(out.status, Status::Pending);
    assert_eq!(out.calls.len(), 1);
    let done = settle_all(&mut e, &[out.calls[0].id], "true");
    assert_eq!(done.status, Status::Completed("null".into()));
    assert!(done.outputs.is_empty(), "no guest code runs after exit(): {:?}", done.outputs);
    assert_eq!(done.store_writes.as_deref(), Some(r#"{"k":"2"}"#));
}
