//! The engine fuzz harness: one byte string becomes a cell, small limits and a sequence of
//! settle operations, run the way the worker runs them.
//!
//! Shared by the cargo-fuzz target (`fuzz_targets/engine.rs`) and the regression test
//! (`rust/engine/tests/fuzz_regressions.rs`, which includes this file by path so `cargo test`
//! needs no fuzzing dependency): a committed crash input replays through exactly this code.
//!
//! The property: `Engine::new` returns an engine or an error, `start`/`settle` return an
//! `Outcome`, and dropping the engine (finished or still pending) is clean. A panic, an abort
//! (e.g. a `Persistent` outliving the runtime) or a broken outcome invariant is a finding.
//!
//! Input format (every byte string is a valid input; `tools/fuzz.py` writes seeds in it):
//!
//! ```text
//! byte 0   bit 0 TypeScript | bits 1-2 memory 1/2/4/8 MiB | bits 3-4 slice 5/20/50/80 ms
//!          | bits 5-6 max pending calls 1/2/4/16 | bit 7 tool catalog + namespace + store
//! byte 1   bits 0-1 max output 1 KiB/4 KiB/64 KiB/1 MiB | bits 2-3 bridge 64 B/4 KiB/64 KiB/16 MiB
//!          | bits 4-5 replayed clock readings | bits 6-7 seed
//! source   bytes up to 0xFE (lossy UTF-8); 0xFF k inserts SNIPPETS[k % len] (neither byte
//!          occurs in UTF-8, so a plain JS file after the two header bytes is a valid input)
//! ops      after 0xFE, up to MAX_OPS operations (see `Op`)
//! ```

use std::sync::{Arc, OnceLock};

use codemode_engine::limits::{json_nests_deeper_than, MAX_VALUE_DEPTH};
use codemode_engine::{Catalog, ClockRun, Engine, Language, Limits, Outcome, OutputKind, Settlement, Status};

/// Ends the source; settle operations follow.
pub const SOURCE_END: u8 = 0xFE;
/// Followed by one byte: inserts a snippet into the source.
pub const SNIPPET: u8 = 0xFF;
/// Settle operations one input may drive (each runs up to one slice of guest code).
const MAX_OPS: usize = 24;
/// Slack over the memory limit the allocator may grant once a run is doomed (its unwind
/// headroom, 1 MiB) plus per-allocation rounding.
const MEMORY_SLACK: usize = 2 << 20;

/// JS/TS fragments that reach the bridge, the prelude and the limits: raw bytes alone would
/// rarely spell `await tools.echo({})`.
pub const SNIPPETS: &[&str] = &[
    "await tools.echo({value: 1})",
    "tools.echo({})",
    "await tools.callValue('host:core:echo', {value: [1, 2]})",
    "await tools.call('host:core:big', {n: 3})",
    "await Promise.all([tools.echo({}), tools.never({}), tools.raises({})])",
    "await Promise.allSettled([tools.echo({}), tools.echo({}), tools.echo({})])",
    "await Promise.race([tools.never({}), yield_control('r')])",
    "await yield_control('r')",
    "yield_control()",
    "await tools.search('echo', {limit: 1e9})",
    "await tools.describe('host:core:echo')",
    "ALL_TOOLS",
    "JSON.stringify",
    "JSON.parse",
    "new Proxy({}, {get: (t, k) => { throw new Error(String(k)) }})",
    "new Proxy([], {ownKeys: () => { for (;;) {} }})",
    "({toJSON() { return this }})",
    "({toJSON: () => tools.echo({})})",
    "({get a() { return tools.echo({value: this}) }})",
    "({[Symbol.toPrimitive]() { throw 1 }})",
    "'x'.repeat(1 << 20)",
    "'\\ud800'",
    "JSON.parse('['.repeat(100000) + ']'.repeat(100000))",
    "(function f(n) { return n ? [f(n - 1)] : [] })(5000)",
    "exit()",
    "store('k', {a: 1})",
    "store('k', 'x'.repeat(300000))",
    "load('k')",
    "text('hi')",
    "json({a: [1, 2]})",
    "console.log('x', {a: 1})",
    "console.error(new Error('e'))",
    "for (let i = 0; i < 1e6; i++) text('')",
    "image('data:image/png;base64,iVBORw0KGgo=')",
    "MCP.srv.fetch({url: 'x'})",
    "MCP.srv.$api('fetch', {schema: true})",
    "API.list('mcp')",
    "API.read('mcp/srv.d.ts')",
    "Issues.list({})",
    "describeNamespace('Issues')",
    "Math.random()",
    "Date.now()",
    "new Date()",
    "return ",
    "await ",
    "throw ",
    "try { ",
    "} catch (e) { return e }",
    "} finally { ",
    "for (;;) { ",
    "while (true) ",
    "async () => ",
    "function* g() { yield 1 }",
    "const a = ",
    "let x: number = ",
    "interface I { a: string }",
    "type T = ",
    " as any",
    "enum E { A, B }",
    "<T,>(x: T) => x",
    "Object.prototype.toJSON = () => 1;",
    "Array.prototype.then = (r) => r(1);",
    "Object.prototype.then = (r) => r(tools.echo({}));",
    "Promise.prototype.then = null;",
    "globalThis.Promise = function () {};",
    "Error.prepareStackTrace = () => 'x';",
    "Object.defineProperty(Error.prototype, 'message', {get() { throw 1 }});",
    "Object.defineProperty(Object.prototype, 'value', {get() { return tools.echo({}) }});",
    "new Array(1e6).fill({})",
    "[].constructor.constructor('return this')()",
    "eval('1 + 1')",
    "new Function('return 1')",
    "Symbol('s')",
    "10n ** 1000n",
    "new Uint8Array(1 << 20)",
    "/(a+)+$/.test('a'.repeat(30) + 'b')",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ";",
    ",",
    "\n",
    "'",
    "\"",
    "`${",
    "=>",
    "...",
    "tools.x = 1;",
    "delete globalThis.tools;",
    "import('x')",
    "require('fs')",
    "import.meta",
    "Promise.resolve().then(() => ",
    "new Promise(() => {})",
    "new Promise((r) => r(tools.echo({})))",
    "await null;",
];

/// Tool results the host may send: valid, hostile, invalid JSON.
const PAYLOADS: &[&str] = &[
    "null",
    "1",
    "\"s\"",
    "{\"a\":[1,2,{\"b\":null}]}",
    "\"\\ud800x\"",
    "{\"__proto__\":{\"polluted\":1}}",
    "{\"toJSON\":1,\"then\":2}",
    "1e400",
    "-0",
    "[]",
    "",
    "{",
    "NaN",
    "undefined",
    "tool failed: RuntimeError: boom",
    "\u{0}",
];

/// A cursor over the input; past the end it reads zeros, so every input decodes.
struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// The limits, language and run setup from the two header bytes.
struct Setup {
    language: Language,
    limits: Limits,
    slice_ms: f64,
    with_catalog: bool,
    clock: &'static [ClockRun],
    seed: u64,
}

fn setup(b0: u8, b1: u8) -> Setup {
    let limits = Limits {
        memory_bytes: 1 << (20 + ((b0 >> 1) & 3)),
        max_pending_calls: [1, 2, 4, 16][usize::from((b0 >> 5) & 3)],
        max_output_bytes: [1 << 10, 4 << 10, 64 << 10, 1 << 20][usize::from(b1 & 3)],
        max_bridge_bytes: [64, 4 << 10, 64 << 10, 16 << 20][usize::from((b1 >> 2) & 3)],
        // Tight enough that a few bridge-sized inputs meet it.
        max_report_bytes: [256 << 10, 1 << 20, 4 << 20, 40 << 20][usize::from(b1 & 3)],
        ..Limits::default()
    };
    const CLOCKS: [&[ClockRun]; 4] =
        [&[], &[(f64::NAN, 1), (f64::INFINITY, 0)], &[(0.0, 2), (-1e308, 1), (8.64e15, u32::MAX)], &[(1e15, 3)]];
    Setup {
        language: if b0 & 1 == 1 { Language::TypeScript } else { Language::JavaScript },
        limits,
        slice_ms: [5.0, 20.0, 50.0, 80.0][usize::from((b0 >> 3) & 3)],
        with_catalog: b0 & 0x80 != 0,
        clock: CLOCKS[usize::from((b1 >> 4) & 3)],
        seed: [0, 1, 7, u64::MAX][usize::from(b1 >> 6)],
    }
}

/// The source: raw bytes up to `SOURCE_END`, with `SNIPPET k` expanded.
fn source(input: &mut Bytes<'_>) -> String {
    let mut out = Vec::new();
    loop {
        if input.is_empty() {
            break;
        }
        match input.byte() {
            SOURCE_END => break,
            SNIPPET => {
                let k = usize::from(input.byte()) % SNIPPETS.len();
                out.extend_from_slice(SNIPPETS[k].as_bytes());
            }
            b => out.push(b),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A tool catalog with host tools, an MCP tool and its declarations (fixed: the host builds
/// catalogs, the guest does not).
fn catalog(with_tools: bool) -> Arc<Catalog> {
    static EMPTY: OnceLock<Arc<Catalog>> = OnceLock::new();
    static TOOLS: OnceLock<Arc<Catalog>> = OnceLock::new();
    if !with_tools {
        return EMPTY.get_or_init(|| Arc::new(Catalog::empty())).clone();
    }
    TOOLS
        .get_or_init(|| {
            let mut tools: Vec<String> = ["echo", "never", "big", "deep", "raises", "nan", "surrogate"]
                .iter()
                .map(|name| {
                    format!(
                        r#"{{"id": "host:core:{name}", "name": "{name}", "description": "The {name} tool.", "source": "host", "input": "{{ value?: unknown; n?: number }}"}}"#
                    )
                })
                .collect();
            tools.push(
                r#"{"id": "mcp:srv:fetch", "name": "fetch", "description": "Fetch a URL.", "source": "mcp", "input": "unknown", "ident": "fetch", "serverIdent": "srv", "declaration": "fetch(input: { url: string }): Promise<unknown>;"}"#.to_owned(),
            );
            let json = format!(
                r#"{{"tools": [{}], "api": {{"mcp/srv.d.ts": "declare namespace MCP.srv {{}}"}}, "mcpServers": {{"srv": {{"ident": "srv", "path": "mcp/srv.d.ts"}}, "down": {{"ident": "down", "reason": "unreachable"}}}}}}"#,
                tools.join(",")
            );
            match Catalog::from_json(&json) {
                Ok(c) => Arc::new(c),
                Err(e) => panic!("the harness catalog does not parse: {e}"),
            }
        })
        .clone()
}

/// The run setup that goes with the tool catalog: a plugin namespace and committed store values.
const RUN_JSON: &str = r#"{"namespaces": [{"id": "plugin:issues", "globalName": "Issues", "description": "Issues.", "prompt": "", "tools": ["host:core:echo"], "scope": {"list": {"$call": "list"}, "deep": {"a": [{"$call": "x"}]}}}], "store": {"k": "[1,2]", "big": "\"xxxxxxxx\""}}"#;

/// What the harness tracks across one run's outcomes to check the engine's own promises.
struct Run {
    limits: Limits,
    issued: Vec<u32>,
    pending: Vec<u32>,
    output_bytes: usize,
}

impl Run {
    /// The invariants every outcome keeps, whatever the guest did.
    fn check(&mut self, outcome: &Outcome) {
        let limits = self.limits;
        for call in &outcome.calls {
            assert!(!self.issued.contains(&call.id), "call id {} issued twice", call.id);
            assert!(
                call.input_json.len() <= limits.max_bridge_bytes,
                "a tool input of {} bytes crossed a {}-byte bridge",
                call.input_json.len(),
                limits.max_bridge_bytes
            );
            self.issued.push(call.id);
            self.pending.push(call.id);
        }
        let report: usize = outcome.calls.iter().map(|c| c.tool.len() + c.input_json.len()).sum::<usize>()
            + outcome.outputs.iter().map(|o| o.text.len()).sum::<usize>()
            + outcome.clock_reads.len() * 14;
        assert!(
            report <= limits.max_report_bytes,
            "a {report}-byte report past a {}-byte budget",
            limits.max_report_bytes
        );
        for json in outcome
            .calls
            .iter()
            .map(|c| &c.input_json)
            .chain(outcome.outputs.iter().filter(|o| o.kind == OutputKind::Json).map(|o| &o.text))
        {
            assert!(
                !json_nests_deeper_than(json, MAX_VALUE_DEPTH),
                "a value nested past {MAX_VALUE_DEPTH} left the guest"
            );
        }
        if let Status::Completed(json) = &outcome.status {
            assert!(
                !json_nests_deeper_than(json, MAX_VALUE_DEPTH),
                "a value nested past {MAX_VALUE_DEPTH} was returned"
            );
        }
        self.output_bytes += outcome.outputs.iter().map(|o| o.text.len()).sum::<usize>();
        assert!(
            self.output_bytes <= limits.max_output_bytes,
            "{} output bytes past a {}-byte limit",
            self.output_bytes,
            limits.max_output_bytes
        );
        if let Status::Completed(json) = &outcome.status {
            assert!(
                json.len() + self.output_bytes <= limits.max_output_bytes,
                "a {}-byte value completed past the output limit",
                json.len()
            );
        }
        if matches!(outcome.status, Status::Pending) {
            assert!(outcome.in_flight <= limits.max_pending_calls, "{} calls in flight", outcome.in_flight);
        } else {
            assert_eq!(outcome.in_flight, 0, "a finished run still holds resolvers");
            self.pending.clear();
        }
        assert!(
            outcome.memory_bytes <= limits.memory_bytes + MEMORY_SLACK,
            "{} heap bytes past a {}-byte limit",
            outcome.memory_bytes,
            limits.memory_bytes
        );
    }

    /// A call id to settle: one still pending, one already issued, one never issued, or the
    /// previous id again (a duplicate within the batch).
    fn pick_id(&self, input: &mut Bytes<'_>, previous: Option<u32>) -> u32 {
        let choice = input.byte();
        let pick = |ids: &[u32]| ids.get(usize::from(choice >> 2) % ids.len().max(1)).copied();
        match choice & 3 {
            0 => pick(&self.pending).unwrap_or(1),
            1 => pick(&self.issued).unwrap_or(0),
            2 => input.u32(),
            _ => previous.unwrap_or(u32::MAX),
        }
    }
}

/// A tool result or error message: from the dictionary, raw input bytes, or too big for the bridge.
fn payload(input: &mut Bytes<'_>, limits: &Limits) -> String {
    let choice = input.byte();
    match choice % 8 {
        0..=4 => PAYLOADS[usize::from(choice >> 3) % PAYLOADS.len()].to_owned(),
        5 => {
            let n = usize::from(input.byte());
            String::from_utf8_lossy(input.take(n)).into_owned()
        }
        // One byte past the bridge limit (capped: a 16 MiB bridge gets a 1 MiB value, which
        // crosses it and then meets the memory limit inside the VM).
        6 => format!("\"{}\"", "x".repeat(limits.max_bridge_bytes.min(1 << 20).saturating_sub(1))),
        _ => format!("{}0{}", "[".repeat(usize::from(input.byte()) << 6), "]".repeat(usize::from(input.byte()) << 6)),
    }
}

/// Runs one fuzz input and returns the run's last status (`None` if no engine could be built).
/// Panics only on a finding.
pub fn run(data: &[u8]) -> Option<Status> {
    let mut input = Bytes { data };
    let setup = setup(input.byte(), input.byte());
    let source = source(&mut input);
    let mut engine = match Engine::new(setup.limits, catalog(setup.with_catalog)) {
        Ok(engine) => engine,
        // Building a runtime may fail (the host reports runtime_unavailable); it must not panic.
        Err(_) => return None,
    };
    if !setup.clock.is_empty() {
        engine.replay_clock(setup.clock);
    }
    let run_json = if setup.with_catalog { RUN_JSON } else { "{}" };
    let mut run = Run { limits: setup.limits, issued: Vec::new(), pending: Vec::new(), output_bytes: 0 };
    let outcome = engine.start(&source, setup.language, setup.slice_ms, setup.seed, run_json);
    run.check(&outcome);
    let mut last = outcome.status;
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        let op = input.byte();
        let settlements = match op % 8 {
            // A batch of 1-4 settlements with chosen ids, outcomes and payloads.
            0..=4 => {
                let mut batch: Vec<Settlement> = Vec::new();
                for _ in 0..=(op >> 3) % 4 {
                    let id = run.pick_id(&mut input, batch.last().map(|s| s.id));
                    let ok = input.byte() & 1 == 0;
                    batch.push(Settlement { id, ok, payload: payload(&mut input, &setup.limits) });
                }
                batch
            }
            // Every pending call succeeds with `null`: moves a well-behaved cell forward.
            5 => run.pending.drain(..).map(|id| Settlement { id, ok: true, payload: "null".into() }).collect(),
            // An empty batch: only drives jobs.
            6 => Vec::new(),
            // A second start on the same engine must be refused as a failure, not a panic.
            _ => {
                let again = engine.start(&source, setup.language, setup.slice_ms, setup.seed, run_json);
                assert!(matches!(again.status, Status::Failed(_)), "a second start did not fail: {:?}", again.status);
                run.check(&again);
                last = again.status;
                continue;
            }
        };
        for s in &settlements {
            run.pending.retain(|&id| id != s.id);
        }
        let outcome = engine.settle(settlements, setup.slice_ms);
        run.check(&outcome);
        last = outcome.status;
    }
    // Dropping the engine here, finished or still pending, must not abort.
    drop(engine);
    Some(last)
}

// ---- deep and large sources and values (the `frontend` target) ---------------------------

/// `(open, close)` fragments whose repetition nests: every construct class the front end's
/// pre-scan and gauge must bound, and literals that try to hide closers from the scan.
pub const NESTERS: &[(&str, &str)] = &[
    ("[", "]"),
    ("(", ")"),
    ("{", "}"),
    ("{a:", "}"),
    ("`${", "}`"),
    ("f(", ")"),
    ("x=>", ""),
    ("async x=>", ""),
    ("a=", ""),
    ("a+=", ""),
    ("1?1:", ""),
    ("1**", ""),
    ("!", ""),
    ("- ", ""),
    ("typeof ", ""),
    ("await ", ""),
    ("new ", ""),
    ("void ", ""),
    ("1+", ""),
    ("a.b+", ""),
    ("", "()"),
    ("a[0]+", ""),
    ("if(1)", ""),
    ("if(0)1;else ", ""),
    ("while(0)", ""),
    ("l:", ""),
    ("function f(){", "}"),
    ("<any>", ""),
    ("Array<", ">"),
    ("keyof ", ""),
    ("() => ", ""),
    ("\"]]]]\"+", ""),
    ("/]]]]/,", ""),
    ("{}/", ""),
    ("(function(){})/", ""),
    ("/* ] */", ""),
    ("\n", ""),
];

/// Most source bytes one input may build (the worker takes frames up to 64 MiB; libFuzzer's
/// speed wants less, and depth, not size, is what recursion meets).
const MAX_SOURCE: usize = 4 << 20;

/// Builds a cell from the input: byte 0 picks the language (bit 0) and whether the rest
/// describes a source (nesting fragments, each `index, count_lo, count_hi`, opened in order and
/// closed in reverse, then raw bytes) or a deep value (`depth_lo, depth_hi, way`) sent out of
/// the guest one way. Runs it through the front end and, if it passes, the engine; panics only
/// on a finding (a crash is one too: ASan reports a stack overflow).
pub fn deep(data: &[u8]) -> Option<Status> {
    let mut input = Bytes { data };
    let b0 = input.byte();
    let language = if b0 & 1 == 1 { Language::TypeScript } else { Language::JavaScript };
    let source = if b0 & 2 == 0 { nested_source(&mut input) } else { deep_value(&mut input) };
    let limits = Limits { memory_bytes: 16 << 20, max_report_bytes: 1 << 20, ..Limits::default() };
    let mut engine = Engine::new(limits, catalog(false)).ok()?;
    let mut run = Run { limits, issued: Vec::new(), pending: Vec::new(), output_bytes: 0 };
    let outcome = engine.start(&source, language, 50.0, 0, "{}");
    run.check(&outcome);
    if let Status::Failed(f) = &outcome.status {
        assert!(f.code.is_some() || !f.name.is_empty(), "a failure without a name: {f:?}");
    }
    Some(outcome.status)
}

fn nested_source(input: &mut Bytes<'_>) -> String {
    let mut opens = String::from("return ");
    let mut closes: Vec<&str> = Vec::new();
    while !input.is_empty() && input.data.first() != Some(&SOURCE_END) {
        let (open, close) = NESTERS[usize::from(input.byte()) % NESTERS.len()];
        let count = usize::from(u16::from_le_bytes([input.byte(), input.byte()]));
        let count = count.min(MAX_SOURCE.saturating_sub(opens.len()) / (open.len() + close.len()).max(1));
        opens.push_str(&open.repeat(count));
        closes.push(close);
        for _ in 1..count {
            closes.push(close);
        }
    }
    input.byte();
    opens.push('0');
    for close in closes.iter().rev() {
        opens.push_str(close);
    }
    opens.push_str(&String::from_utf8_lossy(input.take(4096)));
    opens
}

fn deep_value(input: &mut Bytes<'_>) -> String {
    let depth = u16::from_le_bytes([input.byte(), input.byte()]);
    let way = [
        "return v",
        "json(v)",
        "await tools.callValue('t', v)",
        "store('k', v)",
        "console.log(v)",
        "await yield_control(v)",
        "return {a: [v]}",
        "text(v)",
    ][usize::from(input.byte()) % 8];
    format!("let v = 0; for (let i = 0; i < {depth}; i++) v = (i & 1) ? [v] : {{v}};\ntry {{ {way} }} catch (e) {{ return e.name }}")
}
