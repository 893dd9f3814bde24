//! One sandboxed run: a QuickJS runtime + context, the trusted prelude, and the bridge.
//!
//! The host drives a run with `start` and then `settle` for each batch of tool results; each
//! call runs the guest's jobs to quiescence and reports an [`Outcome`]: completed, failed, or
//! pending on tool calls. Nothing here does I/O or knows what a tool does; values cross as
//! JSON text, and every crossing is capped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rquickjs::context::EvalOptions;
use rquickjs::promise::PromiseState;
use rquickjs::{qjs, Context, Ctx, Exception, Function, Object, Persistent, Promise, Runtime, Value};

use crate::alloc::LimitedAllocator;
use crate::arena;
use crate::bytecode::{sandbox_context, PRELUDE_SOURCE, WEB_SOURCE};
use crate::catalog::Catalog;
use crate::frontend::{self, Language};
use crate::limits::{json_nests_deeper_than, Abort, Flags, Limits, MAX_VALUE_DEPTH};

/// Output calls (`text`, `json`, `console.*`, `image`) one run may make (seed 002's bound).
pub const MAX_OUTPUT_CALLS: usize = 100_000;

/// What a tool call, an output or a clock reading costs in a report besides its text (msgpack
/// framing, the call id), counted so that many tiny ones cannot pass the budget either.
const CALL_OVERHEAD: usize = 32;
const OUTPUT_OVERHEAD: usize = 8;
const CLOCK_READ_BYTES: usize = 14;

/// A clock reading and how many times in a row the guest read it. A loop of `Date.now()`
/// reads the same millisecond thousands of times: journaled as runs, a 60 s busy-wait costs
/// its report at most 60,000 of them, not millions of readings.
pub type ClockRun = (f64, u32);
/// Why the engine would not hold more for the guest until the next outcome.
enum Refusal {
    /// The report would not fit in a frame.
    Report,
    /// With the QuickJS heap, the run would pass its memory limit.
    Memory,
}

impl Refusal {
    fn message(&self, limits: &Limits, what: &str) -> String {
        match self {
            Refusal::Report => format!(
                "{what} would make this step's tool calls and outputs pass {} bytes, the most one report to the host carries; await some calls before starting more.",
                limits.max_report_bytes
            ),
            Refusal::Memory => format!("code mode cell exceeded its memory limit of {} bytes.", limits.memory_bytes),
        }
    }
}

/// Reserves `bytes` more of what the engine holds for the guest outside QuickJS until the next
/// outcome takes it: within the report budget, and with the heap within the memory limit.
fn hold(flags: &Flags, limits: &Limits, bytes: usize) -> Result<(), Refusal> {
    let next = flags.held.load(Ordering::Relaxed).saturating_add(bytes);
    if next > limits.max_report_bytes {
        return Err(Refusal::Report);
    }
    if flags.used.load(Ordering::Relaxed).saturating_add(next) > limits.memory_bytes {
        return Err(Refusal::Memory);
    }
    flags.held.store(next, Ordering::Relaxed);
    Ok(())
}

/// The message for a value nested past [`MAX_VALUE_DEPTH`].
fn too_deep(what: &str) -> String {
    format!("{what} is nested deeper than {MAX_VALUE_DEPTH} levels (arrays and objects), the most a value leaving code mode may nest.")
}

/// A `RangeError` value from the intrinsic constructor (a guest that replaced `RangeError`
/// does not matter).
fn range_error<'js>(ctx: &Ctx<'js>, message: &str) -> Value<'js> {
    let _ = Exception::throw_range(ctx, message);
    ctx.catch()
}

// The bridge's internal tool ids, the one copy: the prelude receives them at install (`host`), the
// host imports them from `codemode._engine`. Catalog tool ids are validated by the host and none
// can contain a NUL, so these cannot collide with one.

/// The tool id of a `yield_control(reason)` call: the host suspends the run and settles it on `wait`.
pub const YIELD_TOOL: &str = "\u{0}yield";
/// The tool id of an `MCP.<server>.<tool>()` call (and the server's other operations).
pub const MCP_TOOL: &str = "\u{0}mcp";
/// The tool id of a namespace function's call (`Issues.list(...)`).
pub const NAMESPACE_TOOL: &str = "\u{0}ns";
/// The tool id of a `readOutput(handle)` call: the host answers it from the session's outputs.
pub const OUTPUT_TOOL: &str = "\u{0}out";
/// The tool id of a `models.*` call (seed 002): the host answers it from its model providers.
pub const MODELS_TOOL: &str = "\u{0}models";
/// The tool id of an `agents.run(prompt, options)` call (Swarm): the host runs a sub-agent.
pub const AGENTS_TOOL: &str = "\u{0}agents";

/// Identifies the prelude (FNV-1a 64 of its source): a journal replays only on the same one.
pub fn prelude_hash() -> u64 {
    PRELUDE_SOURCE
        .bytes()
        .chain(WEB_SOURCE.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Outcome codes, spelled as the spec spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidInput,
    Timeout,
    OutputLimitExceeded,
    MemoryLimitExceeded,
    InternalError,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::Timeout => "timeout",
            ErrorCode::OutputLimitExceeded => "output_limit_exceeded",
            ErrorCode::MemoryLimitExceeded => "memory_limit_exceeded",
            ErrorCode::InternalError => "internal_error",
        }
    }
}

/// A failed run. `code` is `None` for an exception the guest threw and did not catch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: Option<ErrorCode>,
    pub name: String,
    pub message: String,
    pub stack: String,
}

impl Failure {
    fn new(code: ErrorCode, name: &str, message: impl Into<String>) -> Self {
        Failure { code: Some(code), name: name.to_owned(), message: message.into(), stack: String::new() }
    }

    fn aborted(why: Abort, limits: &Limits) -> Self {
        match why {
            Abort::Timeout => Failure::new(
                ErrorCode::Timeout,
                "TimeoutError",
                "code mode timeout exceeded (the cell ran past timeoutMs).",
            ),
            Abort::Memory => Failure::new(
                ErrorCode::MemoryLimitExceeded,
                "MemoryError",
                format!("code mode cell exceeded its memory limit of {} bytes.", limits.memory_bytes),
            ),
            Abort::Output => Failure::new(
                ErrorCode::OutputLimitExceeded,
                "OutputLimitError",
                format!("code mode output limit exceeded: maxOutputBytes is {} bytes.", limits.max_output_bytes),
            ),
            Abort::OutputCalls => Failure::new(
                ErrorCode::OutputLimitExceeded,
                "OutputLimitError",
                format!("code mode output limit exceeded: more than {MAX_OUTPUT_CALLS} text/json/console/image calls."),
            ),
            Abort::Exit => Failure::new(ErrorCode::InternalError, "Error", "exit() is not a failure"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The cell returned; its value as JSON text.
    Completed(String),
    Failed(Failure),
    /// The cell awaits tool calls that the host has not settled yet.
    Pending,
}

/// Bytes of `text` as a JSON string literal (quotes and escapes included), as the host encodes it.
fn json_string_len(text: &str) -> usize {
    let escapes: usize = text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    text.len().saturating_add(escapes).saturating_add(2)
}

/// What `text`, `json` and `console.*` produced, in call order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OutputKind {
    Text = 0,
    Json = 1,
    Log = 2,
    Info = 3,
    Warn = 4,
    Error = 5,
    /// `image(dataUrl)`: the text is `mimeType;base64data`.
    Image = 6,
    /// The prelude's diagnostic for a bridge call's Promise the cell did not await (found in its
    /// value, an output or a call's input, or used as a string): which call, and where.
    NotAwaited = 7,
    /// Swarm's `phase(name)`: where a fan-out is, for the host to show progress.
    Phase = 8,
    /// Swarm's `log(...)`: a progress line.
    Progress = 9,
}

impl OutputKind {
    /// What the host's result shows before a console line of this kind.
    fn prefix(self) -> &'static str {
        match self {
            OutputKind::Warn => "[warn] ",
            OutputKind::Error => "[error] ",
            OutputKind::NotAwaited => "[not awaited] ",
            OutputKind::Phase => "[phase] ",
            OutputKind::Progress => "[log] ",
            _ => "",
        }
    }

    /// Bytes this output takes in the host's result, as compact JSON (`{"type":"text","text":…}`,
    /// `{"type":"json","value":…}`, `{"type":"image","mimeType":…,"data":…}`) plus its comma:
    /// what `maxOutputBytes` counts, so escapes and framing cannot pass the budget unseen.
    fn result_bytes(self, text: &str) -> usize {
        match self {
            OutputKind::Json => 25usize.saturating_add(text.len()),
            OutputKind::Image => {
                let (mime, data) = text.split_once(';').unwrap_or((text, ""));
                37usize.saturating_add(json_string_len(mime)).saturating_add(json_string_len(data))
            }
            _ => 24usize.saturating_add(json_string_len(text)),
        }
    }

    /// The kind a number names (the prelude's `hostEmit(kind, …)`, a report frame's field).
    pub fn from_i32(v: i32) -> Option<OutputKind> {
        Some(match v {
            0 => OutputKind::Text,
            1 => OutputKind::Json,
            2 => OutputKind::Log,
            3 => OutputKind::Info,
            4 => OutputKind::Warn,
            5 => OutputKind::Error,
            6 => OutputKind::Image,
            7 => OutputKind::NotAwaited,
            8 => OutputKind::Phase,
            9 => OutputKind::Progress,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub kind: OutputKind,
    /// Plain text for text and console kinds, JSON text for `Json`.
    pub text: String,
}

/// A tool call the guest started and the host must run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: u32,
    pub tool: String,
    pub input_json: String,
    /// The guest API that started it: only the prelude knows, so it says so with each call.
    pub method: CallMethod,
}

/// The bridge methods a guest call can start from: the one definition of their names (the
/// prelude passes them, the host reports them in `pendingToolCalls`, `CALL_METHODS` exports
/// them to Python).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMethod {
    /// `tools.callValue(id, input)` and the `tools.<name>(input)` conveniences.
    CallValue,
    /// `tools.call(id, input)` (the `{tool, result}` envelope).
    Call,
    /// A function of a plugin namespace (`Issues.list(...)`).
    Namespace,
    /// `MCP.<server>.<tool>(input)` and its resources and prompts.
    Mcp,
    /// `yield_control(reason)`.
    Yield,
    /// `readOutput(handle, {offset, limit})`: a cut output's full text, kept by the host.
    ReadOutput,
    /// `models.getModelsOfType(...)`, `models.classify(...)` and the other `models.*` calls.
    Models,
    /// `agents.run(prompt, options)`: one sub-agent.
    Agents,
}

impl CallMethod {
    /// Every method, in the order `CALL_METHODS` lists them.
    pub const ALL: [CallMethod; 8] = [
        CallMethod::CallValue,
        CallMethod::Call,
        CallMethod::Namespace,
        CallMethod::Mcp,
        CallMethod::Yield,
        CallMethod::ReadOutput,
        CallMethod::Models,
        CallMethod::Agents,
    ];

    /// The name the prelude passes and the host reports.
    pub fn as_str(self) -> &'static str {
        match self {
            CallMethod::CallValue => "callValue",
            CallMethod::Call => "call",
            CallMethod::Namespace => "namespace",
            CallMethod::Mcp => "mcp",
            CallMethod::Yield => "yield_control",
            CallMethod::ReadOutput => "readOutput",
            CallMethod::Models => "models",
            CallMethod::Agents => "agents.run",
        }
    }

    /// The method of a name the prelude passed; None for any other string.
    pub fn parse(name: &str) -> Option<CallMethod> {
        CallMethod::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// A tool's answer for the guest: a JSON value on success, an error message otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub id: u32,
    pub ok: bool,
    pub payload: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: Status,
    /// Calls started since the previous outcome.
    pub calls: Vec<ToolCall>,
    /// Outputs produced since the previous outcome.
    pub outputs: Vec<Output>,
    /// Clock readings taken since the previous outcome (for the journal), as runs.
    pub clock_reads: Vec<ClockRun>,
    /// Calls started and not yet settled.
    pub in_flight: usize,
    /// Bytes the QuickJS heap holds now.
    pub memory_bytes: usize,
    /// `tools.search` calls since the previous outcome.
    pub searches: u32,
    /// `tools.describe` calls since the previous outcome.
    pub describes: u32,
    /// On completion: the cell's `store` writes, `{key: json | null}` (null deletes).
    pub store_writes: Option<String>,
}

/// Building a runtime failed: the host reports `runtime_unavailable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError(pub String);

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EngineError {}

impl From<rquickjs::Error> for EngineError {
    fn from(e: rquickjs::Error) -> Self {
        EngineError(e.to_string())
    }
}

type Resolvers = (Persistent<Function<'static>>, Persistent<Function<'static>>);

/// Bridge state reached from the host functions the prelude holds.
struct State {
    limits: Limits,
    catalog: Arc<Catalog>,
    searches: u32,
    describes: u32,
    next_call_id: u32,
    /// The id the last `call` gave (0 when it refused the call): the prelude names its promise.
    last_call_id: u32,
    resolvers: HashMap<u32, Resolvers>,
    new_calls: Vec<ToolCall>,
    outputs: Vec<Output>,
    output_bytes: usize,
    output_calls: usize,
    clock_reads: Vec<ClockRun>,
    /// Readings to serve before the real clock (journal replay), oldest last.
    clock_replay: Vec<ClockRun>,
    /// A fixed clock's next reading (`fix_clock`): each read gives it and moves it on 1 ms.
    clock_fixed: Option<f64>,
    /// The cell has written to `store` (its writes are read when it completes).
    stored: bool,
}

/// The prelude functions Rust calls; never reachable from guest code.
struct Internals {
    start_cell: Persistent<Function<'static>>,
    describe_error: Persistent<Function<'static>>,
    make_error: Persistent<Function<'static>>,
    store_writes: Persistent<Function<'static>>,
}

/// One run's sandbox. Not `Send`: create and use it on one thread.
///
/// Field order is drop order, and every `Persistent` must go before the runtime, or freeing the
/// runtime aborts on leaked GC objects; `Drop` clears the ones held in shared state first.
pub struct Engine {
    cell: Option<Persistent<Promise<'static>>>,
    /// The cell's end, once its promise settled; the run ends with it when nothing is in flight.
    decided: Option<Status>,
    internals: Internals,
    state: Rc<RefCell<State>>,
    context: Context,
    runtime: Runtime,
    flags: Arc<Flags>,
    started: bool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.try_borrow_mut() {
            state.resolvers.clear();
        }
    }
}

/// The prelude's bytecode, compiled at build time (`bytecode.rs`); loading it skips parsing.
const PRELUDE_BYTECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/prelude.qbc"));

/// Throws an error no guest `catch` can intercept: the run is over.
pub(crate) fn throw_uncatchable(ctx: &Ctx<'_>, message: &str) -> rquickjs::Error {
    match Exception::from_message(ctx.clone(), message) {
        Ok(error) => {
            // SAFETY: `error` is a live Error object in this context.
            unsafe { qjs::JS_SetUncatchableError(ctx.as_raw().as_ptr(), error.as_raw()) };
            ctx.throw(error.into_value())
        }
        Err(e) => e,
    }
}

/// Whole milliseconds since the epoch, as `Date.now()` gives them.
fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as f64).unwrap_or(0.0)
}

impl Engine {
    /// Builds the runtime, context and prelude over a shared catalog. Do this before the cell
    /// arrives.
    pub fn new(limits: Limits, catalog: Arc<Catalog>) -> Result<Engine, EngineError> {
        let flags = Arc::new(Flags::new(limits.memory_bytes));
        let runtime = Runtime::new_with_alloc(LimitedAllocator::new(flags.clone()))?;
        runtime.set_max_stack_size(limits.stack_bytes);
        let handler_flags = flags.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || handler_flags.should_interrupt())));
        let context = sandbox_context(&runtime)?;
        let state = Rc::new(RefCell::new(State {
            limits,
            catalog,
            searches: 0,
            describes: 0,
            next_call_id: 0,
            last_call_id: 0,
            resolvers: HashMap::new(),
            new_calls: Vec::new(),
            outputs: Vec::new(),
            output_bytes: 0,
            output_calls: 0,
            clock_reads: Vec::new(),
            clock_replay: Vec::new(),
            clock_fixed: None,
            stored: false,
        }));
        let internals = context.with(|ctx| install_prelude(&ctx, PRELUDE_BYTECODE, &state, &flags))?;
        Ok(Engine { cell: None, decided: None, internals, state, context, runtime, flags, started: false })
    }

    /// Makes the clock fixed, for a reproducible run: the first read gives `start_ms`, each read
    /// after it 1 ms more (a loop that waits for the clock still ends), whatever the real time.
    /// A function of the reads alone, so no reading is reported: a replay with the same start
    /// reads the same values.
    pub fn fix_clock(&mut self, start_ms: f64) {
        self.state.borrow_mut().clock_fixed = Some(start_ms);
    }

    /// Serves these clock readings (runs, oldest first) before the real clock: journal replay.
    pub fn replay_clock(&mut self, readings: &[ClockRun]) {
        let mut state = self.state.borrow_mut();
        state.clock_replay = readings.iter().rev().filter(|(_, count)| *count > 0).copied().collect();
    }

    /// Starts the cell: checks and transpiles the source, then runs it until it completes,
    /// fails, or waits on tool calls. `timeout_ms` is this slice's wall-clock budget;
    /// `run_json` is the run's setup from the host (`{}` for none): `{namespaces?: [...],
    /// store?: {key: json}}` — the plugin namespaces and the committed `store` values.
    pub fn start(&mut self, source: &str, language: Language, timeout_ms: f64, seed: u64, run_json: &str) -> Outcome {
        if self.started {
            return self.outcome(Status::Failed(Failure::new(
                ErrorCode::InternalError,
                "Error",
                "this engine already ran a cell",
            )));
        }
        self.started = true;
        // A plain JavaScript cell is compiled as it is, and parsed only if QuickJS refuses it
        // (`frontend::plain_script`); any other goes through the front end first.
        let plain = language == Language::JavaScript && frontend::plain_script(source);
        let body = if plain {
            std::borrow::Cow::Borrowed(source)
        } else {
            match Self::front_end(source, language) {
                Ok(body) => std::borrow::Cow::Owned(body),
                Err(failure) => return self.outcome(Status::Failed(failure)),
            }
        };
        self.flags.set_deadline_in(timeout_ms);
        let internals = &self.internals;
        let mut refused = false;
        let started = self.context.with(|ctx| -> Result<Persistent<Promise<'static>>, Failure> {
            let mut options = EvalOptions::default();
            options.global = true;
            // Sloppy, as a JavaScript engine runs a script: the front end parsed the cell so.
            options.strict = false;
            options.filename = Some("cell.js".into());
            let cell: Function = ctx.eval_with_options(frontend::wrap(&body), options).map_err(|e| {
                refused = true;
                let (name, message, stack) = describe(&ctx, &internals.describe_error, e);
                Failure { code: Some(ErrorCode::InvalidInput), name, message, stack }
            })?;
            // (Compiling the cell ran none of it: it is seeded and set up before it runs, in
            // the one prelude call that starts it.)
            let [a, b, c, d] = random_state(seed).map(|word| word as i32);
            let run = (run_json != "{}").then_some(run_json);
            let start_cell = internals.start_cell.clone().restore(&ctx).map_err(|e| internal(&ctx, e))?;
            let promise: Promise = start_cell.call((cell, a, b, c, d, run)).map_err(|e| internal(&ctx, e))?;
            Ok(Persistent::save(&ctx, promise))
        });
        match started {
            Ok(promise) => {
                self.cell = Some(promise);
                self.drive()
            }
            Err(failure) => {
                let limits = self.state.borrow().limits;
                match self.flags.aborted() {
                    // `exit()` before the first await: a normal end, with its store writes.
                    Some(Abort::Exit) => self.drive(),
                    Some(why) => self.outcome(Status::Failed(Failure::aborted(why, &limits))),
                    // A plain cell QuickJS refused: the front end's diagnostic, as if it had
                    // gone through it first (QuickJS's own when the front end accepts it).
                    None if plain && refused => {
                        let failure = Self::front_end(source, language).err().unwrap_or(failure);
                        self.outcome(Status::Failed(failure))
                    }
                    None => self.outcome(Status::Failed(failure)),
                }
            }
        }
    }

    /// The cell's source through the front end (oxc; on the system heap: it is not engine state,
    /// and any lazy state of its own must outlive this engine's arena), or why it is refused.
    fn front_end(source: &str, language: Language) -> Result<String, Failure> {
        arena::outside(|| frontend::prepare(source, language)).map_err(|e| {
            let (code, name) = match e {
                frontend::FrontendError::Syntax(_) => (ErrorCode::InvalidInput, "SyntaxError"),
                frontend::FrontendError::ModuleAccess(_) => (ErrorCode::InvalidInput, "Error"),
                frontend::FrontendError::TooDeep => (ErrorCode::InvalidInput, "RangeError"),
                frontend::FrontendError::Unavailable(_) => (ErrorCode::InternalError, "Error"),
            };
            Failure::new(code, name, e.message())
        })
    }

    /// Delivers tool results, then runs the guest until it is quiet again.
    pub fn settle(&mut self, settlements: Vec<Settlement>, timeout_ms: f64) -> Outcome {
        self.flags.set_deadline_in(timeout_ms);
        let max_bridge = self.state.borrow().limits.max_bridge_bytes;
        for s in settlements {
            // Take the resolvers out before calling JS: resolving can run guest getters that
            // re-enter the bridge and borrow the state.
            let Some((resolve, reject)) = self.state.borrow_mut().resolvers.remove(&s.id) else {
                continue;
            };
            let make_error = &self.internals.make_error;
            self.context.with(|ctx| {
                let settled = (|| -> rquickjs::Result<()> {
                    let value = if !s.ok {
                        None
                    } else if s.payload.len() > max_bridge {
                        Some(Err(format!("tool result is larger than the bridge limit ({max_bridge} bytes)")))
                    } else {
                        match ctx.json_parse(s.payload.as_str()) {
                            Ok(v) => Some(Ok(v)),
                            Err(_) => {
                                let _ = ctx.catch();
                                Some(Err("tool result is not valid JSON".to_owned()))
                            }
                        }
                    };
                    match value {
                        Some(Ok(v)) => resolve.restore(&ctx)?.call::<_, ()>((v,)),
                        Some(Err(message)) => {
                            let error: Value = make_error.clone().restore(&ctx)?.call((message,))?;
                            reject.restore(&ctx)?.call::<_, ()>((error,))
                        }
                        None => {
                            let error: Value = make_error.clone().restore(&ctx)?.call((s.payload.as_str(),))?;
                            reject.restore(&ctx)?.call::<_, ()>((error,))
                        }
                    }
                })();
                if settled.is_err() {
                    let _ = ctx.catch();
                }
            });
        }
        self.drive()
    }

    /// Bytes the QuickJS heap holds now (as the allocator counts them).
    pub fn memory_bytes(&self) -> usize {
        self.flags.used.load(Ordering::Relaxed)
    }

    /// Runs pending jobs to quiescence, then reports.
    fn drive(&mut self) -> Outcome {
        while self.flags.aborted().is_none() {
            match self.runtime.execute_pending_job() {
                Ok(true) => {}
                Ok(false) => break,
                // Only an uncatchable error escapes a job; the abort flag says which.
                Err(_) => {}
            }
        }
        let status = self.conclude();
        let writes = if matches!(status, Status::Completed(_)) { self.store_writes() } else { None };
        let mut outcome = self.outcome(status);
        outcome.store_writes = writes;
        outcome
    }

    /// Where the run stands after a drive. The cell's own end (its value, or its error) is
    /// decided once, when its promise settles; the run ends with it only when no call the
    /// guest started is still in flight, so a call nobody awaits (`void tools.x()`, the losers
    /// of `Promise.race`, the rest of a fail-fast `Promise.all`) still runs and settles first.
    fn conclude(&mut self) -> Status {
        let limits = self.state.borrow().limits;
        if self.decided.is_none() && self.flags.aborted().is_none() {
            self.decided = self.decide(&limits);
        }
        // `exit()` stops the guest for good (no job of it runs again) but is a normal end: the
        // calls it started still settle first. Any other abort ends the run at once. Deciding
        // runs guest code (an error's getters), which may have broken a limit itself.
        let exited = match self.flags.aborted() {
            Some(Abort::Exit) => true,
            Some(why) => return Status::Failed(Failure::aborted(why, &limits)),
            None => false,
        };
        if !self.state.borrow().resolvers.is_empty() {
            return Status::Pending;
        }
        match &self.decided {
            Some(status) => status.clone(),
            None if exited => Status::Completed("null".into()),
            None => Status::Failed(Failure::new(
                ErrorCode::Timeout,
                "DeadlockError",
                "code mode cell can never finish: it awaits a promise that nothing will settle (no tool call is pending).",
            )),
        }
    }

    /// The cell's end once its promise has settled (None while it is pending). Its value
    /// counts against the output budget from here on, with every output after it.
    fn decide(&mut self, limits: &Limits) -> Option<Status> {
        let Some(cell) = self.cell.clone() else {
            return Some(Status::Failed(Failure::new(ErrorCode::InternalError, "Error", "no cell was started")));
        };
        let internals = &self.internals;
        let state = &self.state;
        self.context.with(|ctx| -> Option<Status> {
            let promise = match cell.restore(&ctx) {
                Ok(p) => p,
                Err(e) => return Some(Status::Failed(internal(&ctx, e))),
            };
            Some(match promise.state() {
                PromiseState::Pending => return None,
                PromiseState::Resolved => match promise.result::<String>() {
                    Some(Ok(json)) => {
                        let mut st = state.borrow_mut();
                        let total = st.output_bytes.saturating_add(json.len());
                        if total > limits.max_output_bytes {
                            Status::Failed(Failure::aborted(Abort::Output, limits))
                        } else if json_nests_deeper_than(&json, MAX_VALUE_DEPTH) {
                            // The cell's own result cannot be represented: like a syntax error,
                            // the same cell fails the same way until its code changes.
                            Status::Failed(Failure::new(
                                ErrorCode::InvalidInput,
                                "RangeError",
                                too_deep("the value the cell returned"),
                            ))
                        } else {
                            st.output_bytes = total;
                            Status::Completed(json)
                        }
                    }
                    Some(Err(e)) => Status::Failed(internal(&ctx, e)),
                    None => return None,
                },
                PromiseState::Rejected => {
                    let error = match promise.result::<Value>() {
                        Some(Err(e)) => e,
                        _ => rquickjs::Error::Exception,
                    };
                    let (name, message, stack) = describe(&ctx, &internals.describe_error, error);
                    Status::Failed(Failure { code: None, name, message, stack })
                }
            })
        })
    }

    /// The cell's `store` writes, read once it completed (a prelude call: no guest code runs).
    fn store_writes(&self) -> Option<String> {
        if !self.state.borrow().stored {
            return None;
        }
        let store_writes = &self.internals.store_writes;
        self.context.with(|ctx| {
            let f = store_writes.clone().restore(&ctx).ok()?;
            let writes: Option<String> = f.call(()).ok();
            writes.filter(|w| w != "{}")
        })
    }

    fn outcome(&mut self, status: Status) -> Outcome {
        let mut state = self.state.borrow_mut();
        if !matches!(status, Status::Pending) {
            // The run is over: drop the resolvers now, while the runtime is alive.
            state.resolvers.clear();
        }
        Outcome {
            status,
            calls: std::mem::take(&mut state.new_calls),
            outputs: std::mem::take(&mut state.outputs),
            clock_reads: std::mem::take(&mut state.clock_reads),
            in_flight: state.resolvers.len(),
            // What this outcome carries out was held for the guest until now.
            memory_bytes: self
                .flags
                .used
                .load(Ordering::Relaxed)
                .saturating_add(self.flags.held.swap(0, Ordering::Relaxed)),
            searches: std::mem::take(&mut state.searches),
            describes: std::mem::take(&mut state.describes),
            store_writes: None,
        }
    }
}

/// Reads the pending exception (or the error) as `(name, message, stack)` through the prelude.
fn describe(
    ctx: &Ctx<'_>,
    describe_error: &Persistent<Function<'static>>,
    error: rquickjs::Error,
) -> (String, String, String) {
    let value = match error {
        rquickjs::Error::Exception => ctx.catch(),
        other => return ("Error".into(), other.to_string(), String::new()),
    };
    let described = describe_error.clone().restore(ctx).and_then(|f| f.call::<_, Vec<String>>((value,)));
    match described {
        Ok(mut parts) if parts.len() == 3 => {
            let stack = parts.pop().unwrap_or_default();
            let message = parts.pop().unwrap_or_default();
            let name = parts.pop().unwrap_or_default();
            (name, message, stack)
        }
        _ => {
            let _ = ctx.catch();
            ("Error".into(), "uncaught exception (its value could not be read)".into(), String::new())
        }
    }
}

fn caught(ctx: &Ctx<'_>, error: rquickjs::Error) -> String {
    match error {
        rquickjs::Error::Exception => format!("{:?}", ctx.catch()),
        other => other.to_string(),
    }
}

fn internal(ctx: &Ctx<'_>, error: rquickjs::Error) -> Failure {
    Failure::new(ErrorCode::InternalError, "Error", caught(ctx, error))
}

/// Reads and runs bytecode that [`crate::bytecode::compile`] wrote at build time; gives its completion value.
pub(crate) fn run_bytecode<'js>(ctx: &Ctx<'js>, bytecode: &[u8]) -> Result<Value<'js>, EngineError> {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the bytecode was written at build time, by this QuickJS, from our own source (never
    // from a guest, a file or a store); JS_EvalFunction consumes the read object and returns an owned value.
    unsafe {
        let object = qjs::JS_ReadObject(raw, bytecode.as_ptr(), bytecode.len() as _, qjs::JS_READ_OBJ_BYTECODE as i32);
        if qjs::JS_IsException(object) {
            return Err(EngineError(format!("bytecode does not load: {}", caught(ctx, rquickjs::Error::Exception))));
        }
        let value = qjs::JS_EvalFunction(raw, object);
        if qjs::JS_IsException(value) {
            return Err(EngineError(format!("bytecode does not run: {}", caught(ctx, rquickjs::Error::Exception))));
        }
        Ok(Value::from_raw(ctx.clone(), value))
    }
}

/// `Math.random`'s state (sfc32) for a run's seed: the seed's halves mixed with two constants,
/// then 12 rounds discarded (the prelude's `random`, as 32-bit words).
fn random_state(seed: u64) -> [u32; 4] {
    let (hi, lo) = ((seed >> 32) as u32, seed as u32);
    let mut s = [hi, lo, hi ^ 0x9e37_79b9, lo ^ 0x85eb_ca6b];
    for _ in 0..12 {
        let t = s[0].wrapping_add(s[1]).wrapping_add(s[3]);
        s[3] = s[3].wrapping_add(1);
        s[0] = s[1] ^ (s[1] >> 9);
        s[1] = s[2].wrapping_add(s[2] << 3);
        s[2] = s[2].rotate_left(21).wrapping_add(t);
    }
    s
}

/// Loads the prelude bytecode, hands it the host functions, and keeps the internals it returns.
fn install_prelude<'js>(
    ctx: &Ctx<'js>,
    bytecode: &[u8],
    state: &Rc<RefCell<State>>,
    flags: &Arc<Flags>,
) -> Result<Internals, EngineError> {
    let install: Function = run_bytecode(ctx, bytecode)?.get().map_err(EngineError::from)?;
    let host = Object::new(ctx.clone())?;
    crate::web::install_host(ctx, &host, flags)?;
    let call_state = state.clone();
    let call_flags = flags.clone();
    host.set(
        "call",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, tool: String, input: String, method: String| -> rquickjs::Result<Promise<'js>> {
                // The prelude is the only caller; a name it does not spell right is its bug.
                let Some(method) = CallMethod::parse(&method) else {
                    return Err(Exception::throw_type(&ctx, "unknown bridge method"));
                };
                let mut st = call_state.borrow_mut();
                st.last_call_id = 0;
                let limits = st.limits;
                let refusal = if st.resolvers.len() >= limits.max_pending_calls {
                    Some(
                        Exception::from_message(
                            ctx.clone(),
                            &format!(
                                "too many pending tool calls: at most {} may be in flight.",
                                limits.max_pending_calls
                            ),
                        )?
                        .into_value(),
                    )
                } else if input.len() > limits.max_bridge_bytes {
                    Some(
                        Exception::from_message(
                            ctx.clone(),
                            &format!("tool input is larger than the bridge limit ({} bytes).", limits.max_bridge_bytes),
                        )?
                        .into_value(),
                    )
                } else if json_nests_deeper_than(&input, MAX_VALUE_DEPTH) {
                    Some(range_error(&ctx, &too_deep("the tool input")))
                } else {
                    let cost = tool
                        .len()
                        .saturating_add(input.len())
                        .saturating_add(method.as_str().len())
                        .saturating_add(CALL_OVERHEAD);
                    match hold(&call_flags, &limits, cost) {
                        Ok(()) => None,
                        Err(Refusal::Report) => {
                            Some(range_error(&ctx, &Refusal::Report.message(&limits, "this tool call")))
                        }
                        // Like a refused allocation: the run is over, whatever the guest catches.
                        Err(Refusal::Memory) => {
                            call_flags.abort(Abort::Memory);
                            return Err(throw_uncatchable(&ctx, "code mode memory limit exceeded"));
                        }
                    }
                };
                let (promise, resolve, reject) = ctx.promise()?;
                if let Some(error) = refusal {
                    // A call is a promise: a refused one rejects (`Promise.allSettled` sees it)
                    // rather than throwing at the call site. It never reaches the host.
                    drop(st);
                    reject.call::<_, ()>((error,))?;
                    return Ok(promise);
                }
                st.next_call_id = st.next_call_id.wrapping_add(1);
                let id = st.next_call_id;
                st.last_call_id = id;
                st.resolvers.insert(id, (Persistent::save(&ctx, resolve), Persistent::save(&ctx, reject)));
                st.new_calls.push(ToolCall { id, tool, input_json: input, method });
                Ok(promise)
            },
        )?,
    )?;

    let stored_state = state.clone();
    host.set("stored", Function::new(ctx.clone(), move || stored_state.borrow_mut().stored = true)?)?;

    let last_call_state = state.clone();
    host.set("lastCall", Function::new(ctx.clone(), move || -> u32 { last_call_state.borrow().last_call_id })?)?;

    let emit_state = state.clone();
    let emit_flags = flags.clone();
    host.set(
        "emit",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, kind: i32, text: String| -> rquickjs::Result<()> {
            let Some(kind) = OutputKind::from_i32(kind) else {
                return Err(Exception::throw_type(&ctx, "unknown output kind"));
            };
            let text = match kind.prefix() {
                "" => text,
                prefix => format!("{prefix}{text}"),
            };
            let mut st = emit_state.borrow_mut();
            let total = st.output_bytes.saturating_add(kind.result_bytes(&text));
            if total > st.limits.max_output_bytes {
                emit_flags.abort(Abort::Output);
                return Err(throw_uncatchable(&ctx, "code mode output limit exceeded"));
            }
            if st.outputs.len() >= MAX_OUTPUT_CALLS || st.output_calls >= MAX_OUTPUT_CALLS {
                emit_flags.abort(Abort::OutputCalls);
                return Err(throw_uncatchable(&ctx, "code mode output call limit exceeded"));
            }
            if kind == OutputKind::Json && json_nests_deeper_than(&text, MAX_VALUE_DEPTH) {
                return Err(Exception::throw_range(&ctx, &too_deep("json(value): the value")));
            }
            match hold(&emit_flags, &st.limits, text.len().saturating_add(OUTPUT_OVERHEAD)) {
                Ok(()) => {}
                Err(Refusal::Report) => {
                    emit_flags.abort(Abort::Output);
                    return Err(throw_uncatchable(&ctx, "code mode report budget exceeded"));
                }
                Err(Refusal::Memory) => {
                    emit_flags.abort(Abort::Memory);
                    return Err(throw_uncatchable(&ctx, "code mode memory limit exceeded"));
                }
            }
            st.output_calls += 1;
            st.output_bytes = total;
            st.outputs.push(Output { kind, text });
            Ok(())
        })?,
    )?;

    let exit_flags = flags.clone();
    host.set(
        "exit",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| -> rquickjs::Result<()> {
            exit_flags.abort(Abort::Exit);
            Err(throw_uncatchable(&ctx, "exit"))
        })?,
    )?;

    let clock_state = state.clone();
    let clock_flags = flags.clone();
    host.set(
        "now",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>| -> rquickjs::Result<f64> {
            let mut st = clock_state.borrow_mut();
            if let Some(reading) = st.clock_fixed {
                st.clock_fixed = Some(reading + 1.0);
                return Ok(reading);
            }
            let reading = match st.clock_replay.last_mut() {
                Some((value, count)) => {
                    let value = *value;
                    *count -= 1;
                    if *count == 0 {
                        st.clock_replay.pop();
                    }
                    value
                }
                None => now_ms(),
            };
            if let Some((last, count)) = st.clock_reads.last_mut() {
                if *last == reading && *count < u32::MAX {
                    *count += 1; // the same millisecond again: its run grows, the report does not
                    return Ok(reading);
                }
            }
            // A new reading rides in the next report: a clock that keeps changing must not
            // grow one past its frame either.
            match hold(&clock_flags, &st.limits, CLOCK_READ_BYTES) {
                Ok(()) => {}
                Err(Refusal::Report) => {
                    return Err(Exception::throw_range(
                        &ctx,
                        &Refusal::Report.message(&st.limits, "another clock reading"),
                    ))
                }
                Err(Refusal::Memory) => {
                    clock_flags.abort(Abort::Memory);
                    return Err(throw_uncatchable(&ctx, "code mode memory limit exceeded"));
                }
            }
            st.clock_reads.push((reading, 1));
            Ok(reading)
        })?,
    )?;
    host.set("maxValueDepth", MAX_VALUE_DEPTH as u32)?;
    host.set("yieldTool", YIELD_TOOL)?;
    host.set("mcpTool", MCP_TOOL)?;
    host.set("namespaceTool", NAMESPACE_TOOL)?;
    host.set("outputTool", OUTPUT_TOOL)?;
    host.set("modelsTool", MODELS_TOOL)?;
    host.set("agentsTool", AGENTS_TOOL)?;
    host.set(
        "checkDepth",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, what: String, json: String| -> rquickjs::Result<()> {
            if json_nests_deeper_than(&json, MAX_VALUE_DEPTH) {
                return Err(Exception::throw_range(&ctx, &too_deep(&what)));
            }
            Ok(())
        })?,
    )?;
    let all_state = state.clone();
    host.set(
        "all",
        Function::new(ctx.clone(), move || -> String { all_state.borrow().catalog.all_json().to_owned() })?,
    )?;
    let names_state = state.clone();
    host.set(
        "names",
        Function::new(ctx.clone(), move || -> String { names_state.borrow().catalog.safe_names_json().to_owned() })?,
    )?;
    let resolve_state = state.clone();
    host.set(
        "resolve",
        Function::new(ctx.clone(), move |name: String| -> Option<String> {
            resolve_state.borrow().catalog.resolve_safe_name(&name).map(str::to_owned)
        })?,
    )?;
    let mcp_state = state.clone();
    host.set(
        "mcp",
        Function::new(ctx.clone(), move || -> String { mcp_state.borrow().catalog.mcp_json().to_owned() })?,
    )?;
    let api_list_state = state.clone();
    host.set(
        "apiList",
        Function::new(ctx.clone(), move |prefix: String| -> String {
            api_list_state.borrow().catalog.api_list_json(&prefix)
        })?,
    )?;
    let api_read_state = state.clone();
    host.set(
        "apiRead",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, path: String| -> rquickjs::Result<String> {
            let st = api_read_state.borrow();
            st.catalog.api_read(&path).map(str::to_owned).map_err(|e| Exception::throw_message(&ctx, &e))
        })?,
    )?;
    let mcp_api_state = state.clone();
    host.set(
        "mcpApi",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, server: String, tool: Option<String>, schema: bool| -> rquickjs::Result<String> {
                let st = mcp_api_state.borrow();
                st.catalog
                    .mcp_api_json(&server, tool.as_deref(), schema)
                    .map_err(|e| Exception::throw_message(&ctx, &e))
            },
        )?,
    )?;
    let search_state = state.clone();
    host.set(
        "search",
        Function::new(ctx.clone(), move |query: String, limit: Option<f64>, namespace: Option<String>| -> String {
            let mut st = search_state.borrow_mut();
            st.searches = st.searches.saturating_add(1);
            let most = st.limits.max_search_limit.max(1);
            let limit = match limit {
                Some(n) if n.is_finite() => (n.max(1.0) as usize).min(most),
                _ => st.limits.search_default_limit.clamp(1, most),
            };
            st.catalog.search_in_json(&query, limit, namespace.as_deref())
        })?,
    )?;
    let describe_state = state.clone();
    host.set(
        "describe",
        Function::new(ctx.clone(), move |id: String| -> Option<String> {
            let mut st = describe_state.borrow_mut();
            st.describes = st.describes.saturating_add(1);
            st.catalog.describe_json(&id).map(str::to_owned)
        })?,
    )?;

    let internals: Object =
        install.call((host,)).map_err(|e| EngineError(format!("prelude install: {}", caught(ctx, e))))?;
    let get = |name: &str| -> Result<Persistent<Function<'static>>, EngineError> {
        let f: Function = internals.get(name)?;
        Ok(Persistent::save(ctx, f))
    };
    Ok(Internals {
        start_cell: get("startCell")?,
        describe_error: get("describeError")?,
        make_error: get("makeError")?,
        store_writes: get("storeWrites")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::deep::{constructs, deepest_accepted};

    #[test]
    fn the_embedded_prelude_bytecode_is_this_source_compiled() {
        let fresh = crate::bytecode::compile(PRELUDE_SOURCE, crate::bytecode::PRELUDE_NAME);
        assert_eq!(fresh.as_deref(), Ok(PRELUDE_BYTECODE));
    }

    fn engine() -> Engine {
        match Engine::new(Limits::default(), Arc::new(Catalog::empty())) {
            Ok(engine) => engine,
            Err(e) => panic!("{e}"),
        }
    }

    /// QuickJS compiles the stripped JavaScript with its own parser: at the deepest nesting the
    /// front end lets through, it either runs the cell or refuses it with its stack check
    /// (a failed run), never overflows the native stack.
    #[test]
    fn quickjs_runs_or_refuses_the_deepest_cell_of_each_construct() {
        for (name, language, make) in constructs() {
            let n = deepest_accepted(language, make);
            let outcome = engine().start(&make(n), language, 5000.0, 1, "{}");
            match &outcome.status {
                Status::Completed(_) => {}
                Status::Failed(f) => println!("{name} x{n}: {:?} {}: {}", f.code, f.name, f.message),
                Status::Pending => panic!("{name}: pending"),
            }
        }
    }
}
