//! Source front end for code-mode cells.
//!
//! A *cell* is model-written JavaScript or TypeScript that the engine evaluates
//! in QuickJS as the **body of an async function**, so top-level `await` and
//! top-level `return` are legal. QuickJS itself cannot strip TypeScript types,
//! gives poor syntax errors, and would happily evaluate `import(...)` or a
//! `require(...)` shim if one ever leaked into the global scope. This module
//! runs every cell through oxc first (but a plain JavaScript cell, for which one
//! lexical pass proves what the parse would find, see [`plain_script`]: the
//! engine parses it only if QuickJS refuses it) to:
//!
//! * report syntax errors with 1-based line/column positions in the user's
//!   original source, before anything executes;
//! * reject module access (`import`/`export` declarations, `import(...)`,
//!   `import.meta`, and any use of `require` the parser can see: a call, a
//!   disguised call such as `(0, require)(...)` or `globalThis.require(...)`, or
//!   the bare name read into a variable) by looking at the AST, so strings and
//!   comments that merely mention those words are not affected;
//! * strip TypeScript syntax (types only, no downleveling) and hand back plain
//!   JavaScript.
//!
//! JavaScript cells are returned byte-for-byte unchanged so that QuickJS error
//! line numbers keep matching what the model wrote. TypeScript cells are
//! re-printed by the code generator, so their runtime line numbers refer to the
//! generated code, not to the original cell.
//!
//! How a cell is parsed is how the engine runs it: a JavaScript cell is parsed
//! inside the same wrapper ([`wrap`]), as a sloppy-mode *script*, so whatever
//! a JavaScript engine accepts in `(async () => { ... })` is accepted here
//! (`const yield = 10`, legacy octals) and top-level `await`/`return` are the
//! function body's own. Module syntax is then a syntax error; a cell that has
//! one is parsed once more as a module to say it is module access. A cell that
//! closes the wrapper's body (`}); evil(); (() => {`) is refused. TypeScript
//! cells are parsed as modules (strict, as `tsc` transpiles a module) and their
//! output is plain strict-compatible JavaScript.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use oxc_allocator::Allocator;
use oxc_ast::ast::{
    CallExpression, ComputedMemberExpression, Expression, IdentifierReference, ImportExpression, ImportMeta,
    ModuleDeclaration, Program, Statement, StaticMemberExpression, TSImportEqualsDeclaration, TSModuleReference,
    UnaryExpression,
};
use oxc_ast_visit::{walk, Visit};
use oxc_codegen::Codegen;
use oxc_diagnostics::OxcDiagnostic;
use oxc_parser::{ParseOptions, Parser, ParserReturn};
use oxc_semantic::SemanticBuilder;
use oxc_span::{GetSpan, SourceType};
use oxc_transformer::{TransformOptions, Transformer};

use crate::nesting::{self, MAX_NESTING};

/// Stack of the thread that runs the front end on cells deeper than [`INLINE_LEVELS`]: the
/// deepest recursion at [`MAX_NESTING`] levels, measured for the worst construct
/// (`tests::stack_per_level`), times two. Only the pages it touches are ever committed; the
/// worker's RLIMIT_AS leaves room for the reservation.
pub const FRONTEND_STACK_BYTES: usize = 32 << 20;

/// Cells the pre-scan bounds at this many levels, and whose AST is no deeper than
/// [`INLINE_DEPTH`], run on the caller's thread (the cost of a thread is then not paid): a few
/// hundred KiB of stack at most, which any thread that drives an engine has.
const INLINE_LEVELS: usize = 64;
const INLINE_DEPTH: usize = 96;

/// Source language of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// Plain JavaScript; returned unchanged after checking.
    JavaScript,
    /// TypeScript; type syntax is stripped and the result re-printed as JavaScript.
    TypeScript,
}

/// What the engine evaluates a cell in: the body of an async arrow (top-level `await` and
/// `return` are its own). The opening brace shares the cell's first line, so line numbers
/// match the source; columns on that line are off by the prefix.
const CELL_PREFIX: &str = "(async () => {";
const CELL_SUFFIX: &str = "\n})";

/// The script the engine evaluates for a prepared cell body.
pub fn wrap(body: &str) -> String {
    let mut out = String::with_capacity(CELL_PREFIX.len() + body.len() + CELL_SUFFIX.len());
    out.push_str(CELL_PREFIX);
    out.push_str(body);
    out.push_str(CELL_SUFFIX);
    out
}

/// One problem found in a cell.
///
/// `line` and `column` are 1-based and refer to the ORIGINAL cell source;
/// `column` counts Unicode scalar values (chars), not bytes or UTF-16 units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Human-readable description, without position.
    pub message: String,
    /// 1-based line number.
    pub line: u32,
    /// 1-based column, in chars of the line.
    pub column: u32,
}

/// Why a cell was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendError {
    /// parse / transform failure; at least one diagnostic
    Syntax(Vec<Diagnostic>),
    /// import / export declarations, dynamic import(), import.meta, or a use of `require`
    ModuleAccess(Diagnostic),
    /// The cell nests deeper than [`MAX_NESTING`] levels.
    TooDeep,
    /// The front end's thread could not be started (the worker is out of address space).
    Unavailable(String),
}

/// Fixed user-facing text for [`FrontendError::ModuleAccess`]. Deliberately does
/// not say which construct was hit, so the wording stays stable for callers.
const MODULE_ACCESS_MESSAGE: &str = "code mode module access is disabled.";

/// At most this many syntax diagnostics are rendered by [`FrontendError::message`];
/// after the first few, parser errors are mostly cascading noise.
const MAX_RENDERED_DIAGNOSTICS: usize = 5;

impl FrontendError {
    /// Human message, e.g. `SyntaxError: Unexpected token (line 3:9)` (one line per
    /// diagnostic, at most 5) or `code mode module access is disabled. (line 1:1)`.
    pub fn message(&self) -> String {
        match self {
            Self::Syntax(diagnostics) => diagnostics
                .iter()
                .take(MAX_RENDERED_DIAGNOSTICS)
                .map(|d| format!("SyntaxError: {} (line {}:{})", d.message, d.line, d.column))
                .collect::<Vec<_>>()
                .join("\n"),
            Self::ModuleAccess(d) => {
                format!("{MODULE_ACCESS_MESSAGE} (line {}:{})", d.line, d.column)
            }
            Self::TooDeep => format!(
                "code mode cell nests deeper than {MAX_NESTING} levels (brackets, operator chains or nested \
                 statements); split it into functions or flatten it."
            ),
            Self::Unavailable(why) => format!("the code mode front end could not start: {why}"),
        }
    }
}

impl std::fmt::Display for FrontendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for FrontendError {}

/// Parse and check a cell; return JavaScript source to evaluate as an async function body.
///
/// * JavaScript: parse (as the engine runs it, see [`wrap`]) + AST checks only (no
///   semantic analysis, no codegen); on success the input string is returned unchanged.
/// * TypeScript: additionally runs semantic analysis, the TypeScript
///   transform (type stripping, `enum`/`namespace`/parameter properties
///   lowered, nothing else downleveled) and codegen.
///
/// Never panics: an unexpected panic inside oxc is caught and reported as a
/// [`FrontendError::Syntax`] at line 1:1. Never overflows its stack: a cell nesting deeper
/// than [`MAX_NESTING`] levels is [`FrontendError::TooDeep`] (see `nesting`), and one deeper
/// than a few dozen levels is handled on a thread with a [`FRONTEND_STACK_BYTES`] stack.
pub fn prepare(source: &str, language: Language) -> Result<String, FrontendError> {
    // Nothing recursive touches a cell before the pre-scan has bounded how deep it nests.
    let levels = nesting::scan(source, language == Language::TypeScript, MAX_NESTING).ok_or(FrontendError::TooDeep)?;
    if levels <= INLINE_LEVELS {
        if let Some(done) = guarded(source, language, INLINE_DEPTH) {
            return done;
        }
    }
    let spawned = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("codemode-frontend".into())
            .stack_size(FRONTEND_STACK_BYTES)
            .spawn_scoped(scope, || guarded(source, language, MAX_NESTING))
            .map(|thread| thread.join())
    });
    match spawned {
        Ok(Ok(Some(done))) => done,
        // `guarded` catches panics and never asks for a deeper stack at MAX_NESTING.
        Ok(_) => Err(FrontendError::Unavailable("the front end thread failed".into())),
        Err(e) => Err(FrontendError::Unavailable(e.to_string())),
    }
}

/// The front end with panics caught; `None` if the AST is deeper than `depth_budget` (the
/// caller runs it again on a thread with a larger stack).
fn guarded(source: &str, language: Language, depth_budget: usize) -> Option<Result<String, FrontendError>> {
    // oxc is not expected to panic, but it contains debug assertions and is
    // fed arbitrary model output; a panic must never take the host down.
    catch_unwind(AssertUnwindSafe(|| prepare_inner(source, language, depth_budget))).unwrap_or_else(|_| {
        Some(Err(FrontendError::Syntax(vec![Diagnostic {
            message: "internal error while parsing the cell".to_string(),
            line: 1,
            column: 1,
        }])))
    })
}

/// A thread's AST arena is kept between cells up to this size (reset, not freed): a cell then
/// parses into memory that is already mapped, and cache-warm when cells come often.
const KEPT_ARENA_BYTES: usize = 1 << 20;

thread_local! {
    static ARENA: std::cell::RefCell<Option<Allocator>> = const { std::cell::RefCell::new(None) };
}

fn prepare_inner(source: &str, language: Language, depth_budget: usize) -> Option<Result<String, FrontendError>> {
    // On the system heap whoever calls: the kept arena outlives any engine's heap (a chunk
    // allocated inside one would be overwritten by its reset).
    crate::arena::outside(|| {
        // The thread's kept arena (none if a panic left it out), else a new one.
        let mut allocator = ARENA.with(|kept| kept.borrow_mut().take()).unwrap_or_default();
        let done = prepare_in(&allocator, source, language, depth_budget);
        if allocator.capacity() <= KEPT_ARENA_BYTES {
            allocator.reset();
            ARENA.with(|kept| *kept.borrow_mut() = Some(allocator));
        }
        done
    })
}

fn prepare_in(
    allocator: &Allocator,
    source: &str,
    language: Language,
    depth_budget: usize,
) -> Option<Result<String, FrontendError>> {
    match language {
        Language::JavaScript => check_script(allocator, source, depth_budget),
        Language::TypeScript => {
            let parsed = parse_module(allocator, source, language);
            if let Err(e) = check_parse(source, &parsed, 0) {
                return Some(Err(e));
            }
            let ParserReturn { mut program, .. } = parsed;
            if let Err(e) = check_module_access(source, &program, 0, depth_budget)? {
                return Some(Err(e));
            }
            Some(strip_types(allocator, source, &mut program))
        }
    }
}

/// A JavaScript cell, parsed inside the wrapper the engine runs it in (a sloppy script).
fn check_script(allocator: &Allocator, source: &str, depth_budget: usize) -> Option<Result<String, FrontendError>> {
    let wrapped = wrap(source);
    let shift = CELL_PREFIX.len();
    let parsed = Parser::new(allocator, &wrapped, SourceType::script()).parse();
    if let Err(syntax) = check_parse(source, &parsed, shift) {
        // Module syntax does not parse in a script: say what it is, if that is what failed.
        let module = parse_module(allocator, source, Language::JavaScript);
        if check_parse(source, &module, 0).is_ok() {
            if let Err(access) = check_module_access(source, &module.program, 0, depth_budget)? {
                return Some(Err(access));
            }
        }
        return Some(Err(syntax));
    }
    if let Some(offset) = wrapper_escape(&parsed.program, wrapped.len()) {
        let (line, column) = line_col(source, offset.saturating_sub(to_u32(shift)));
        let message = "Unexpected '}': a cell is a function body and cannot close it".to_string();
        return Some(Err(FrontendError::Syntax(vec![Diagnostic { message, line, column }])));
    }
    if let Err(e) = check_module_access(source, &parsed.program, shift, depth_budget)? {
        return Some(Err(e));
    }
    Some(Ok(source.to_string()))
}

/// The cell parsed as an ES module (TypeScript cells; JavaScript ones only to name module
/// syntax). Module code is strict; top-level `return` is allowed (the cell is a body).
fn parse_module<'a>(allocator: &'a Allocator, source: &'a str, language: Language) -> ParserReturn<'a> {
    let source_type = match language {
        Language::JavaScript => SourceType::mjs(),
        // `SourceType::ts()` is *unambiguous* (script unless it sees ESM
        // syntax), which would reject top-level await; force module.
        Language::TypeScript => SourceType::ts().with_module(true),
    };
    let options = ParseOptions {
        // Cells are function bodies, so `return` at top level is legal.
        allow_return_outside_function: true,
        // Ident hashes only speed up semantic analysis, which JS never runs.
        enable_ident_hashes: language == Language::TypeScript,
        ..ParseOptions::default()
    };
    Parser::new(allocator, source, source_type).with_options(options).parse()
}

/// Where a wrapped cell closes the wrapper's body to run code outside it, if it does: the
/// wrapper must parse as one statement, the async arrow, whose body is the wrapper's braces.
fn wrapper_escape(program: &Program<'_>, wrapped_len: usize) -> Option<u32> {
    let body_start = to_u32(CELL_PREFIX.len() - 1);
    let body_end = to_u32(wrapped_len.saturating_sub(1));
    let arrow = match program.body.first() {
        Some(Statement::ExpressionStatement(statement)) => match statement.expression.without_parentheses() {
            Expression::ArrowFunctionExpression(arrow) => Some(arrow),
            _ => None,
        },
        _ => None,
    };
    match arrow {
        Some(arrow) if program.body.len() == 1 => {
            let span = arrow.body.span();
            (span.start != body_start || span.end != body_end).then_some(span.end.saturating_sub(1))
        }
        // The cell's own closing brace is where the wrapper's body ended.
        Some(arrow) => Some(arrow.body.span().end.saturating_sub(1)),
        None => Some(body_start),
    }
}

/// The AST checks after a clean parse: depth (every visitor recurses once per level), then
/// module access. `shift` is where the cell starts in the parsed text. The outer `None`
/// asks for a deeper stack (see [`guarded`]).
fn check_module_access(
    source: &str,
    program: &Program<'_>,
    shift: usize,
    depth_budget: usize,
) -> Option<Result<(), FrontendError>> {
    // Left-deep chains (`1+1+...`) are deep here although the parser built them in a loop.
    let depth = nesting::depth(program, MAX_NESTING);
    if depth > MAX_NESTING {
        return Some(Err(FrontendError::TooDeep));
    }
    if depth > depth_budget {
        return None;
    }
    // Only the wrapped script has the cell at an offset.
    Some(match find_module_access(program, shift > 0) {
        Some(offset) => {
            let (line, column) = line_col(source, offset.saturating_sub(to_u32(shift)));
            Err(FrontendError::ModuleAccess(Diagnostic { message: MODULE_ACCESS_MESSAGE.to_string(), line, column }))
        }
        None => Ok(()),
    })
}

/// Words whose presence anywhere in a JavaScript cell (code, strings or comments alike) sends
/// it through the parse: module syntax and the loader (`check_module_access`), and HTML-like
/// comments, which oxc's script grammar has and a plain lexer would read as code.
const PARSE_IF_PRESENT: [&str; 6] = ["import", "export", "require", "\\u", "<!--", "-->"];

/// The largest cell [`plain_script`] admits. The parse also refuses cells whose AST nests
/// deeper than [`MAX_NESTING`] where the scan sees no nesting (left-deep chains: `1+1+...`,
/// `a.b.c...`, each level at least two bytes); in this many bytes, within the scan's bound,
/// none can.
const PLAIN_MAX_BYTES: usize = 1024;

/// Whether a JavaScript cell goes to QuickJS without the front end's parse (the engine parses
/// it afterwards only if QuickJS refuses it, for the front end's diagnostic): true only when one
/// lexical pass proves what the parse would check. It cannot use module syntax or the loader
/// (none of [`PARSE_IF_PRESENT`] occurs, so no identifier spells them, escaped or not), and it
/// cannot close the wrapper's body: outside its strings and comments every `}` closes a `{` of
/// its own, and there are no regular expressions or templates, whose extent only a parser knows
/// (any `/` that does not open a comment, any backtick, sends it through the parse). Its
/// nesting is bounded as for the parse ([`nesting::scan`], and [`PLAIN_MAX_BYTES`]). Whatever else the parse would refuse
/// is a syntax error QuickJS refuses too; then the parse runs and the diagnostic is the same.
/// Measured: the parse and its checks were ~7 µs of a trivial cell's ~40 µs round trip to an
/// idle worker.
pub fn plain_script(source: &str) -> bool {
    if source.len() > PLAIN_MAX_BYTES || PARSE_IF_PRESENT.iter().any(|word| source.contains(word)) {
        return false;
    }
    if nesting::scan(source, false, MAX_NESTING).is_none_or(|levels| levels > INLINE_LEVELS) {
        return false;
    }
    let bytes = source.as_bytes();
    let (mut at, mut open) = (0, 0usize);
    while let Some(&byte) = bytes.get(at) {
        at += 1;
        match byte {
            b'{' => open += 1,
            b'}' => match open.checked_sub(1) {
                Some(left) => open = left,
                None => return false, // (it would close the wrapper's body)
            },
            b'\'' | b'"' => loop {
                // A string ends on its line (a line terminator in one is a syntax error: the
                // parse says so); a backslash escapes what follows, a line break too.
                match bytes.get(at) {
                    None | Some(b'\n' | b'\r') => return false,
                    Some(b'\\') => at += 2,
                    Some(&quote) if quote == byte => {
                        at += 1;
                        break;
                    }
                    Some(_) => at += 1,
                }
            },
            b'/' => match bytes.get(at) {
                // A line comment ends at any line terminator (U+2028 and U+2029 too).
                Some(b'/') => {
                    while bytes.get(at..).is_some_and(|rest| !rest.is_empty() && !ends_line(rest)) {
                        at += 1;
                    }
                }
                Some(b'*') => match source.get(at + 1..).and_then(|rest| rest.find("*/")) {
                    Some(end) => at += 1 + end + 2,
                    None => return false,
                },
                _ => return false, // a division or a regular expression: only a parser knows
            },
            b'`' => return false,
            _ => {}
        }
    }
    open == 0
}

/// Whether `rest` starts with a line terminator: `\n`, `\r`, U+2028 or U+2029.
fn ends_line(rest: &[u8]) -> bool {
    matches!(rest, [b'\n' | b'\r', ..] | [0xE2, 0x80, 0xA8 | 0xA9, ..])
}

/// Turn parser diagnostics into a `Syntax` error.
///
/// Pitfall: oxc recovers from some errors and still returns a full AST (which
/// codegen would happily print), so any error-severity diagnostic must fail
/// the cell, not just `panicked`.
fn check_parse(source: &str, parsed: &ParserReturn<'_>, shift: usize) -> Result<(), FrontendError> {
    let mut diagnostics = convert(source, parsed.diagnostics.errors(), shift);
    if parsed.panicked && diagnostics.is_empty() {
        diagnostics.push(Diagnostic { message: "failed to parse the cell".to_string(), line: 1, column: 1 });
    }
    if diagnostics.is_empty() {
        Ok(())
    } else {
        Err(FrontendError::Syntax(diagnostics))
    }
}

/// TypeScript path: semantic -> TypeScript transform -> codegen.
///
/// Pitfalls:
/// * The enum transform relies on member values computed by
///   `SemanticBuilder::with_enum_eval(true)`; without it string members get
///   wrong reverse mappings (and a debug assertion fires).
/// * `TransformOptions::default()` enables only the TypeScript transform with
///   an empty `env`, i.e. no syntax lowering (target is effectively ESNext).
/// * Spans are unchanged by semantic/transform, so their diagnostics map to
///   the original source directly. Top-level `return`/`await` survive as is.
fn strip_types<'a>(allocator: &'a Allocator, source: &str, program: &mut Program<'a>) -> Result<String, FrontendError> {
    let semantic = SemanticBuilder::new().with_enum_eval(true).build(program);
    // Without `with_check_syntax_error` this only reports binder errors such as
    // redeclarations; reporting them here gives original-source positions.
    let diagnostics = convert(source, semantic.diagnostics.errors(), 0);
    if !diagnostics.is_empty() {
        return Err(FrontendError::Syntax(diagnostics));
    }
    let scoping = semantic.semantic.into_scoping();

    let options = TransformOptions::default();
    let transformed = Transformer::new(allocator, Path::new("cell.ts"), &options).build_with_scoping(scoping, program);
    let diagnostics = convert(source, transformed.diagnostics.errors(), 0);
    if !diagnostics.is_empty() {
        return Err(FrontendError::Syntax(diagnostics));
    }

    Ok(Codegen::new().build(program).code)
}

/// Convert oxc diagnostics to ours, positioned at their most relevant label (`shift`: where
/// the cell starts in the text that was parsed).
fn convert<'d>(source: &str, diagnostics: impl Iterator<Item = &'d OxcDiagnostic>, shift: usize) -> Vec<Diagnostic> {
    diagnostics
        .map(|d| {
            // Prefer the primary label; otherwise the last one, because
            // multi-label oxc errors are mostly "declared here" + "redeclared
            // here", where the last label is the offending site.
            let offset = d.labels.iter().find(|l| l.primary()).or_else(|| d.labels.last()).map_or(0, |l| l.offset());
            let (line, column) = line_col(source, offset.saturating_sub(to_u32(shift)));
            Diagnostic { message: d.message.to_string(), line, column }
        })
        .collect()
}

/// 1-based (line, column) of a byte offset. Lines are split on `\n` only (as
/// QuickJS counts them); the column counts chars. Out-of-range or
/// mid-character offsets are clamped instead of panicking.
fn line_col(source: &str, offset: u32) -> (u32, u32) {
    let mut end = usize::try_from(offset).unwrap_or(usize::MAX).min(source.len());
    while end > 0 && !source.is_char_boundary(end) {
        end -= 1;
    }
    let before = source.get(..end).unwrap_or("");
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let column = before.get(line_start..).unwrap_or("").chars().count() + 1;
    (to_u32(line), to_u32(column))
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Byte offset of the earliest module-access construct, if any.
///
/// In a module (`wrapped` false) `import`/`export` declarations are only checked at the top
/// level: nested ones are either parse errors (JS) or legal TypeScript that the transform
/// lowers to plain code (`export` inside a `namespace`, or inside an ambient `declare module`
/// that is erased). In the wrapped script every one counts: the parser leaves them to a
/// semantic check that is not run, and no function body may hold one.
fn find_module_access(program: &Program<'_>, wrapped: bool) -> Option<u32> {
    let top_level = program.body.iter().find(|stmt| stmt.is_module_declaration()).map(|stmt| stmt.span().start);
    let mut finder = ModuleAccessFinder { first: top_level, declarations: wrapped };
    finder.visit_program(program);
    finder.first
}

/// The CommonJS loader a model reaches for (no cell has one: the prelude deletes it).
const LOADER: &str = "require";
/// The names the global object goes by in the engines models know (`global` is Node's).
const GLOBAL_OBJECTS: [&str; 4] = ["globalThis", "self", "window", "global"];

/// Whether `expr` is the global object by one of its names (parentheses and TypeScript
/// assertions aside).
fn is_global_object(expr: &Expression<'_>) -> bool {
    GLOBAL_OBJECTS.iter().any(|name| expr.is_specific_id(name))
}

/// Whether a callee is the loader: by name, through parentheses, assertions, a comma
/// sequence (its last value is the callee), an optional chain, or off the global object.
fn is_loader(callee: &Expression<'_>) -> bool {
    match callee.get_inner_expression() {
        Expression::Identifier(ident) => ident.name == LOADER,
        Expression::SequenceExpression(sequence) => sequence.expressions.last().is_some_and(is_loader),
        Expression::StaticMemberExpression(member) => {
            member.property.name == LOADER && is_global_object(&member.object)
        }
        Expression::ComputedMemberExpression(member) => {
            member.static_property_name().is_some_and(|name| name == LOADER) && is_global_object(&member.object)
        }
        Expression::ChainExpression(chain) => chain
            .expression
            .as_member_expression()
            .is_some_and(|member| member.static_property_name() == Some(LOADER) && is_global_object(member.object())),
        _ => false,
    }
}

/// AST visitor recording the smallest start offset of a forbidden expression.
struct ModuleAccessFinder {
    first: Option<u32>,
    /// Every `import`/`export` declaration counts, at any depth.
    declarations: bool,
}

impl ModuleAccessFinder {
    fn record(&mut self, offset: u32) {
        self.first = Some(self.first.map_or(offset, |first| first.min(offset)));
    }
}

impl<'a> Visit<'a> for ModuleAccessFinder {
    // Children start after the node itself, so no need to walk into it.
    fn visit_import_expression(&mut self, it: &ImportExpression<'a>) {
        self.record(it.span.start);
    }

    fn visit_module_declaration(&mut self, it: &ModuleDeclaration<'a>) {
        if self.declarations {
            self.record(it.span().start);
            return;
        }
        walk::walk_module_declaration(self, it);
    }

    fn visit_import_meta(&mut self, it: &ImportMeta) {
        self.record(it.span.start);
    }

    /// A call whose callee is a loader however it is spelled: `require(..)`, `(require)(..)`,
    /// `require?.(..)`, `(0, require)(..)`, `globalThis.require(..)`, `self["require"](..)`.
    fn visit_call_expression(&mut self, it: &CallExpression<'a>) {
        if is_loader(&it.callee) {
            self.record(it.span.start);
            return;
        }
        walk::walk_call_expression(self, it);
    }

    /// The name read as a value (`const r = require`, `[require][0]('x')`, `{ require }`):
    /// whatever is done with it next, a cell has no use for it.
    fn visit_identifier_reference(&mut self, it: &IdentifierReference<'a>) {
        if it.name == LOADER {
            self.record(it.span.start);
        }
    }

    /// `typeof require` only asks whether there is one (there is not): it loads nothing.
    fn visit_unary_expression(&mut self, it: &UnaryExpression<'a>) {
        if it.operator.is_typeof() && it.argument.get_inner_expression().is_specific_id(LOADER) {
            return;
        }
        walk::walk_unary_expression(self, it);
    }

    /// `globalThis.require`, `self.require`, ...: the loader read off the global object.
    fn visit_static_member_expression(&mut self, it: &StaticMemberExpression<'a>) {
        if it.property.name == LOADER && is_global_object(&it.object) {
            self.record(it.span.start);
            return;
        }
        walk::walk_static_member_expression(self, it);
    }

    /// `globalThis["require"]`, ``self[`require`]``.
    fn visit_computed_member_expression(&mut self, it: &ComputedMemberExpression<'a>) {
        if it.static_property_name().is_some_and(|name| name == LOADER) && is_global_object(&it.object) {
            self.record(it.span.start);
            return;
        }
        walk::walk_computed_member_expression(self, it);
    }

    /// TypeScript `import x = require("m")`; aliases like `import A = N.B`
    /// are plain value bindings and stay allowed.
    fn visit_ts_import_equals_declaration(&mut self, it: &TSImportEqualsDeclaration<'a>) {
        if matches!(it.module_reference, TSModuleReference::ExternalModuleReference(_)) {
            self.record(it.span.start);
            return;
        }
        walk::walk_ts_import_equals_declaration(self, it);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(src: &str) -> Result<String, FrontendError> {
        prepare(src, Language::JavaScript)
    }

    fn ts(src: &str) -> Result<String, FrontendError> {
        prepare(src, Language::TypeScript)
    }

    fn module_access_at(result: Result<String, FrontendError>) -> (u32, u32) {
        match result {
            Err(FrontendError::ModuleAccess(d)) => (d.line, d.column),
            other => panic!("expected ModuleAccess, got {other:?}"),
        }
    }

    fn syntax(result: Result<String, FrontendError>) -> Vec<Diagnostic> {
        match result {
            Err(FrontendError::Syntax(d)) => {
                assert!(!d.is_empty());
                d
            }
            other => panic!("expected Syntax, got {other:?}"),
        }
    }

    #[test]
    fn js_passthrough_is_identical() {
        let src = "// hi\nconst a = [1, 2,3]  ;\n\n  a.map(x => x * 2)\n";
        assert_eq!(js(src).as_deref(), Ok(src));
    }

    #[test]
    fn js_top_level_await_and_return() {
        let src = "const r = await tools.search({ q: 'x' });\nif (!r) return null;\nreturn r.items;";
        assert_eq!(js(src).as_deref(), Ok(src));
    }

    #[test]
    fn ts_top_level_await_and_return() {
        let out = ts("const r: number = await Promise.resolve(1);\nif (r > 2) { return r }\nreturn r + 1;")
            .unwrap_or_else(|e| panic!("{}", e.message()));
        assert!(out.contains("await Promise.resolve(1)"), "{out}");
        assert!(out.contains("return r;"), "{out}");
        assert!(out.contains("return r + 1;"), "{out}");
        assert!(!out.contains(": number"), "{out}");
    }

    #[test]
    fn ts_type_syntax_is_stripped() {
        let src = "interface Item { id: number; name?: string }\n\
                   type Id = Item['id'];\n\
                   enum Color { Red, Green = 'g' }\n\
                   namespace NS { export const k = 3; }\n\
                   class Box<T> { constructor(private readonly v: T, public n = 1) {} get(): T { return this.v; } }\n\
                   function first<T>(xs: T[]): T | undefined { return xs[0]; }\n\
                   const items = (await tools.list()) as Item[];\n\
                   const it = first<Item>(items)!;\n\
                   const cfg = { a: 1 } satisfies Record<string, number>;\n\
                   return [it.id, Color.Green, NS.k, new Box<number>(2).get(), cfg.a];\n";
        let out = ts(src).unwrap_or_else(|e| panic!("{}", e.message()));
        for banned in ["interface", "type Id", ": number", "<T>", "<Item>", " as ", "satisfies", "private", ")!"] {
            assert!(!out.contains(banned), "{banned:?} survived in:\n{out}");
        }
        for kept in ["Color", "NS", "this.v = v", "await tools.list()", "return ["] {
            assert!(out.contains(kept), "{kept:?} missing in:\n{out}");
        }
        // The output must itself be valid JavaScript (as a cell).
        assert!(js(&out).is_ok(), "generated JS does not reparse:\n{out}");
    }

    #[test]
    fn syntax_error_position() {
        let d = syntax(js("const a = 1;\nconst b = 2;\nconst c = ;\n"));
        assert_eq!((d[0].line, d[0].column), (3, 11), "{d:?}");
        let e = FrontendError::Syntax(d);
        assert!(e.message().starts_with("SyntaxError: "), "{}", e.message());
        assert!(e.message().ends_with("(line 3:11)"), "{}", e.message());

        let d = syntax(ts("let a: number = 1;\nlet b = 2;\n  if (a { }\n"));
        assert_eq!(d[0].line, 3, "{d:?}");
    }

    #[test]
    fn syntax_error_column_counts_chars() {
        let d = syntax(js("const s = 'héllo'; )"));
        assert_eq!((d[0].line, d[0].column), (1, 20), "{d:?}");
    }

    #[test]
    fn message_caps_at_five() {
        let d = Diagnostic { message: "m".into(), line: 1, column: 1 };
        let e = FrontendError::Syntax(vec![d; 8]);
        assert_eq!(e.message().lines().count(), 5);
    }

    #[test]
    fn ts_redeclaration_reported_at_second_site() {
        let d = syntax(ts("let x = 1;\nlet x = 2;"));
        assert_eq!((d[0].line, d[0].column), (2, 5), "{d:?}");
    }

    #[test]
    fn module_access_rejected() {
        assert_eq!(module_access_at(js("import x from \"y\";")), (1, 1));
        assert_eq!(module_access_at(js("const q = 1;\nexport const a=1;")), (2, 1));
        assert_eq!(module_access_at(js("const fs = await import(\"fs\");")), (1, 18));
        assert_eq!(module_access_at(js("return import.meta.url;")), (1, 8));
        assert_eq!(module_access_at(js("const fs = require(\"fs\");")), (1, 12));
        assert_eq!(module_access_at(js("f(1, g((require)('x')))")), (1, 8));
        assert_eq!(module_access_at(js("require?.('x')")), (1, 1));
        assert_eq!(module_access_at(ts("import type { A } from 'a';")), (1, 1));
        assert_eq!(module_access_at(ts("import fs = require('fs');")), (1, 1));
        assert_eq!(module_access_at(ts("const x = require('fs') as any;")), (1, 11));
        // earliest offending node wins
        assert_eq!(module_access_at(js("require('a');\nexport {};")), (1, 1));
        // nested module syntax cannot hide in a block
        assert_eq!(module_access_at(js("if (x) { import('a') }")), (1, 10));
        assert_eq!(module_access_at(js("{ export const a = 1 }")), (1, 3));
        let e = FrontendError::ModuleAccess(Diagnostic { message: MODULE_ACCESS_MESSAGE.into(), line: 2, column: 1 });
        assert_eq!(e.message(), "code mode module access is disabled. (line 2:1)");
    }

    #[test]
    fn disguised_loaders_rejected() {
        for (src, at) in [
            ("return (0, require)('fs');", (1, 8)),
            ("return (1, 2, (require))('fs');", (1, 8)),
            ("return globalThis.require('fs');", (1, 8)),
            ("return globalThis['require']('fs');", (1, 8)),
            ("return self[`require`]?.('fs');", (1, 8)),
            ("return globalThis?.require('fs');", (1, 8)),
            ("const r = require;\nreturn r('fs');", (1, 11)),
            ("const { r } = { r: require };\nreturn r('fs');", (1, 20)),
            ("return [require][0]('fs');", (1, 9)),
            ("const g = globalThis.require;", (1, 11)),
            ("return import.meta;", (1, 8)),
            ("const f = () => import.meta.url;\nreturn f();", (1, 17)),
        ] {
            assert_eq!(module_access_at(js(src)), at, "{src}");
        }
        assert_eq!(module_access_at(ts("return (0, require as any)('fs');")), (1, 8));
        assert_eq!(module_access_at(ts("const r: any = globalThis.require;")), (1, 16));
    }

    #[test]
    fn sloppy_mode_cells_are_accepted_as_a_js_engine_accepts_them() {
        for src in [
            "const yield = 10;\nreturn yield;",
            "var let = 1; return let;",
            "return 010 + 1;",
            "with ({a: 1}) { return a; }",
            "function f(a, a) { return a }\nreturn f(1, 2);",
            "static = 1; return static;",
            "return await Promise.resolve(1);",
        ] {
            assert_eq!(js(src).as_deref(), Ok(src), "{src}");
        }
    }

    #[test]
    fn plain_script_admits_only_what_one_lexical_pass_can_vouch_for() {
        for src in [
            "return 1 + 1",
            "let t = 0; for (let i = 0; i < 10; i++) t += await tools.double({x: i}); return t",
            "await yield_control('pause'); return 1",
            "const o = { a: { b: [1, 2] } }; return o.a.b",
            "return '}' + \"})\" + '\\'}'",
            "// }); escape in a comment\nreturn 1",
            "/* }) { */ return 1",
            "return 'a\\\nb'",
            "",
        ] {
            assert!(plain_script(src), "{src:?}");
        }
        for src in [
            "}); globalThis.x = 1; (async () => {",
            "return 1 }); (async () => { return 2",
            "}",
            "{",
            "return 1 / 2",
            "return /}/.source",
            "return `}`",
            "return '\n'",
            "return 'unterminated",
            "/* unterminated",
            "// U+2028 ends a line comment\u{2028}}); (() => {",
            "const r = require",
            "return typeof require",
            "import('x')",
            "export default 1",
            "const \\u0072equire = 1",
            "<!-- }\nreturn 1",
            "--> }\nreturn 1",
            "return [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        ] {
            assert!(!plain_script(src), "{src:?}");
        }
        // Past the size where a left-deep chain could nest too deep for the parse's check.
        let chain = |n: usize| format!("return 1{}", "+1".repeat(n));
        assert!(plain_script(&chain(500)) && js(&chain(500)).is_ok());
        assert!(!plain_script(&chain(PLAIN_MAX_BYTES)));
    }

    /// What `plain_script` admits, the parse accepts or refuses as a syntax error only: never
    /// as module access, never as a cell that closes its wrapper (the engine then compiles it
    /// as it is, and asks the parse only for the diagnostic of a cell QuickJS refuses).
    #[test]
    fn what_plain_script_admits_the_parse_never_refuses_for_module_access_or_an_escape() {
        #[rustfmt::skip]
        const PIECES: [&str; 24] = [
            "{", "}", "(", ")", "[", "]", ";", "\n", " ", "'}'", "\"{\"", "// }\n", "/* } */", "return ",
            "x", "1", "+", ",", "=>", "async ", "await ", "const a = ", "f(", "\u{2028}",
        ];
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut admitted = 0;
        for _ in 0..20_000 {
            let len = (next() % 12) as usize;
            let src: String = (0..len).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]).collect();
            if !plain_script(&src) {
                continue;
            }
            admitted += 1;
            match js(&src) {
                Ok(_) => {}
                Err(FrontendError::Syntax(d)) => {
                    assert!(!d.iter().any(|d| d.message.contains("cannot close it")), "{src:?}: {d:?}")
                }
                Err(e) => panic!("{src:?}: {}", e.message()),
            }
        }
        assert!(admitted > 1_000, "only {admitted} admitted");
    }

    #[test]
    fn a_cell_cannot_close_the_function_body_it_runs_in() {
        for src in [
            "}); globalThis.x = 1; (async () => {",
            "}), (async () => {",
            "})(); (() => {",
            "}) + (async () => {",
            "return 1 }); (async () => { return 2",
        ] {
            let d = syntax(js(src));
            assert!(d[0].message.contains("cannot close it"), "{src}: {d:?}");
        }
        // A lone closer is a plain syntax error.
        assert_eq!(syntax(js("return 1; }")).len(), 1);
    }

    #[test]
    fn lookalikes_accepted() {
        for src in [
            "const s = \"require('x')\";\nreturn s;",
            "// import fs from 'fs'\n/* export default 1; import('x') */\nreturn 1;",
            "const o2 = { require: (x) => x }; return [o2.require(1), o2['require'](2)];",
            "return typeof require;",
            "class C { require() { return this.require; } }\nreturn new C().require();",
            "const o = { require: 1, import: 2 };\nreturn o.require + o.import;",
            "return `import.meta ${'require(1)'}`;",
            "function f() { return new.target; }\nreturn f();",
        ] {
            assert_eq!(js(src).as_deref(), Ok(src));
        }
        let out = ts("namespace N { export const a: number = 1; }\nimport A = N.a;\nreturn A;")
            .unwrap_or_else(|e| panic!("{}", e.message()));
        assert!(out.contains("return A"), "{out}");
    }

    #[test]
    fn ts_syntax_rejected_in_js() {
        let d = syntax(js("let x: number = 1;"));
        assert_eq!(d[0].line, 1, "{d:?}");
        assert!(ts("let x: number = 1;").is_ok());
    }

    #[test]
    fn weird_inputs_do_not_panic() {
        for src in ["", "\u{feff}", "}", "`${", "/*", "'\n'", "return", "await", "\u{2028}x", "a\r\nb )"] {
            let _ = js(src);
            let _ = ts(src);
        }
    }

    #[test]
    fn timing() {
        use std::time::Instant;
        let js_src = "const r = await tools.search({ query: 'x' });\nconst ids = r.items.map(i => i.id);\nreturn ids.slice(0, 5);\n";
        let ts_src = "interface Hit { id: string; score: number }\n\
                      type Page = { items: Hit[] };\n\
                      enum Mode { Fast, Slow }\n\
                      function top<T extends Hit>(xs: T[], n: number): T[] {\n\
                      \x20 return [...xs].sort((a, b) => b.score - a.score).slice(0, n);\n\
                      }\n\
                      const page = (await tools.search({ query: 'x' })) as Page;\n\
                      const best = top<Hit>(page.items, 3)!;\n\
                      const mode: Mode = Mode.Fast;\n\
                      return { ids: best.map((h) => h.id), mode };\n";
        for (name, src, lang) in
            [("js 3-line", js_src, Language::JavaScript), ("ts 10-line", ts_src, Language::TypeScript)]
        {
            for _ in 0..50 {
                assert!(prepare(src, lang).is_ok());
            }
            let n = 2000u32;
            let start = Instant::now();
            for _ in 0..n {
                let _ = std::hint::black_box(prepare(std::hint::black_box(src), lang));
            }
            println!("prepare() {name}: {:?} per call (warm, avg of {n})", start.elapsed() / n);
        }
    }
}

#[cfg(test)]
pub(crate) mod deep {
    //! Deep cells: refused with `TooDeep` before anything recursive overflows, and the stack
    //! the front end needs at the limit, measured.
    use super::*;

    /// `(name, language, cell of nesting n)`.
    pub(crate) type Construct = (&'static str, Language, fn(usize) -> String);

    /// Every construct class that makes oxc or QuickJS recurse.
    pub(crate) fn constructs() -> Vec<Construct> {
        use Language::{JavaScript as J, TypeScript as T};
        vec![
            ("arrays", J, |n| format!("return {}{}", "[".repeat(n), "]".repeat(n))),
            ("parens", J, |n| format!("return {}1{}", "(".repeat(n), ")".repeat(n))),
            ("blocks", J, |n| format!("{}{}", "{".repeat(n), "}".repeat(n))),
            ("objects", J, |n| format!("return {}1{}", "{a:".repeat(n), "}".repeat(n))),
            ("calls", J, |n| format!("const f = x => x; return {}1{}", "f(".repeat(n), ")".repeat(n))),
            ("arrows", J, |n| format!("return {}1", "x=>".repeat(n))),
            ("async arrows", J, |n| format!("return {}1", "async x=>".repeat(n))),
            ("assignments", J, |n| format!("let a; return {}1", "a=".repeat(n))),
            ("compound assignments", J, |n| format!("let a = 0; return {}1", "a+=".repeat(n))),
            ("ternaries", J, |n| format!("return {}1", "1?1:".repeat(n))),
            ("exponents", J, |n| format!("return {}1", "1**".repeat(n))),
            ("nots", J, |n| format!("return {}1", "!".repeat(n))),
            ("negations", J, |n| format!("return {}1", "- ".repeat(n))),
            ("typeofs", J, |n| format!("return {}1", "typeof ".repeat(n))),
            ("awaits", J, |n| format!("return {}1", "await ".repeat(n))),
            ("news", J, |n| format!("return {}Object", "new ".repeat(n))),
            ("voids", J, |n| format!("return {}1", "void ".repeat(n))),
            ("ifs", J, |n| format!("{}return 1", "if (1) ".repeat(n))),
            ("else ifs", J, |n| format!("{}return 1", "if (0) 1; else ".repeat(n))),
            ("else ifs with braces", J, |n| format!("{}{{}}", "if (0) {} else ".repeat(n))),
            ("whiles", J, |n| format!("{}break", "while (0) ".repeat(n))),
            ("labels", J, |n| (0..n).map(|i| format!("l{i}: ")).collect::<String>() + "1"),
            ("functions", J, |n| format!("{}{}", "function f() {".repeat(n), "}".repeat(n))),
            ("templates", J, |n| format!("return {}1{}", "`${".repeat(n), "}`".repeat(n))),
            ("classes", J, |n| {
                format!("return {}{}", "class extends ".repeat(n), "Object {}".to_owned() + &"{}".repeat(n))
            }),
            ("sums", J, |n| format!("return {}", vec!["1"; n].join("+"))),
            ("members", J, |n| format!("const a = {{}}; return a{}", ".b".repeat(n))),
            ("call chains", J, |n| format!("const f = () => f; return f{}", "()".repeat(n))),
            ("indexes", J, |n| format!("const a = [[]]; return a{}", "[0]".repeat(n))),
            ("optional chains", J, |n| format!("const a = {{}}; return a{}", "?.b".repeat(n))),
            ("comma-free sequences", J, |n| format!("return {}", vec!["a"; n].join(" || "))),
            ("destructuring", J, |n| format!("let {}a{} = 1", "[".repeat(n), "]".repeat(n))),
            ("ts generics", T, |n| format!("let x: {}number{} = 1", "Array<".repeat(n), ">".repeat(n))),
            ("ts arrays", T, |n| format!("let x: number{} = []", "[]".repeat(n))),
            ("ts keyofs", T, |n| format!("let x: {}number = 1", "keyof ".repeat(n))),
            ("ts function types", T, |n| format!("let x: {}number = 1", "() => ".repeat(n))),
            ("ts conditional types", T, |n| format!("type X = {}1", "1 extends 1 ? 1 : ".repeat(n))),
            ("ts assertions", T, |n| format!("return {}1", "<any>".repeat(n))),
            ("ts qualified names", T, |n| format!("let x: a{} = 1", ".b".repeat(n))),
            ("ts namespaces", T, |n| format!("namespace a{} {{}}", ".b".repeat(n))),
            ("ts generic calls", T, |n| {
                format!("const f = (x: any) => x; return {}1{}", "f<any>(".repeat(n), ")".repeat(n))
            }),
            ("ts sums", T, |n| format!("return {}", vec!["1"; n].join("+"))),
        ]
    }

    /// Kilobytes of this thread's stack mapping that are resident after `f` ran: the deepest
    /// point the stack reached (pages are committed when first touched and stay).
    fn stack_kib<R: Send>(f: impl FnOnce() -> R + Send) -> (R, usize) {
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new().stack_size(FRONTEND_STACK_BYTES).spawn_scoped(scope, || {
                let out = f();
                let here = &out as *const R as usize;
                let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
                let mut inside = false;
                for line in smaps.lines() {
                    let first = line.split_whitespace().next().unwrap_or("");
                    if let Some((lo, hi)) = first.split_once('-') {
                        if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                            inside = lo <= here && here < hi;
                            continue;
                        }
                    }
                    if inside {
                        if let Some(rss) = line.strip_prefix("Rss:") {
                            let kib = rss.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                            return (out, kib);
                        }
                    }
                }
                (out, 0)
            });
            match thread.map(|t| t.join()) {
                Ok(Ok(measured)) => measured,
                _ => panic!("the measuring thread failed"),
            }
        })
    }

    /// The deepest nesting of a construct that `prepare` accepts.
    pub(crate) fn deepest_accepted(language: Language, make: fn(usize) -> String) -> usize {
        let (mut lo, mut hi) = (1usize, 4 * MAX_NESTING);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if matches!(prepare(&make(mid), language), Err(FrontendError::TooDeep)) {
                hi = mid - 1;
            } else {
                lo = mid;
            }
        }
        lo
    }

    #[test]
    fn every_construct_nested_past_the_limit_is_too_deep() {
        for (name, language, make) in constructs() {
            for n in [MAX_NESTING + 50, 5000, 100_000] {
                let got = prepare(&make(n), language);
                assert!(matches!(got, Err(FrontendError::TooDeep)), "{name} x{n}: {got:?}");
            }
        }
        let message = FrontendError::TooDeep.message();
        assert!(message.contains(&format!("nests deeper than {MAX_NESTING} levels")), "{message}");
    }

    #[test]
    fn the_deepest_accepted_cell_of_each_construct_uses_under_half_the_front_end_stack() {
        let (_, base) = stack_kib(|| guarded("return 1", Language::JavaScript, MAX_NESTING));
        for (name, language, make) in constructs() {
            let n = deepest_accepted(language, make);
            let (result, kib) = stack_kib(|| guarded(&make(n), language, MAX_NESTING));
            let used = kib.saturating_sub(base) << 10;
            println!("{name:<24} n={n:<5} stack {used:>8} B ({} B per level)", used / n);
            assert!(result.is_some(), "{name}: asked for a deeper stack at the limit");
            assert!(used < FRONTEND_STACK_BYTES / 2, "{name} x{n}: {used} bytes of stack");
        }
    }

    #[test]
    fn ordinary_cells_scan_shallow_enough_to_run_inline() {
        let asi: String = (0..400)
            .map(|i| {
                format!(
                    "const v{i} = await tools.get({{id: {i}, tags: ['a', 'b']}})\nif (v{i}.ok) out.push(v{i}.value)\n"
                )
            })
            .collect();
        let concat =
            format!("return {}", (0..60).map(|i| format!("'part {i} ' + x{i}")).collect::<Vec<_>>().join(" + "));
        let chained = "const r = items\n  .filter(x => x.ok)\n  .map(x => ({id: x.id, n: x.n * 2}))\n  .sort((a, b) => a.n - b.n)\nreturn r";
        let statements: String = (0..500).map(|i| format!("let a{i} = {i};\n")).collect();
        let ts = "interface Hit { id: string; score: number }\nconst m = new Map<string, Array<Hit>>()\nfunction top<T extends Hit>(xs: T[]): T[] { return [...xs].sort((a, b) => b.score - a.score) }\nconst re = /[(\\[{]+/g\nif (a < b) x = {} \nreturn top(m.get('k') ?? [])";
        for (src, language) in [
            (asi.as_str(), Language::JavaScript),
            (concat.as_str(), Language::JavaScript),
            (chained, Language::JavaScript),
            (statements.as_str(), Language::JavaScript),
            (ts, Language::TypeScript),
        ] {
            let levels = nesting::scan(src, language == Language::TypeScript, MAX_NESTING);
            assert!(levels.is_some_and(|l| l <= INLINE_LEVELS), "{levels:?} for:\n{}", &src[..src.len().min(300)]);
            assert!(prepare(src, language).is_ok(), "{src}");
        }
    }

    #[test]
    fn strings_regexes_and_comments_cannot_hide_nesting() {
        // 1,200 real levels around a literal full of closers: a scan that took them for code
        // would count 700.
        let closers = "]".repeat(500);
        for hide in [
            format!("\"{closers}\""),
            format!("'{closers}'"),
            format!("/{closers}/"),
            format!("`{closers}`"),
            format!("/* {closers} */ 0"),
            format!("x = {{}} / \"/{closers}\""),
            format!("x = {{a: {{}}}} / '/{closers}'"),
            format!("x = function () {{}} / \"/{closers}\""),
            format!("x = async function () {{}} / \"/{closers}\""),
            format!("x = class {{}} / \"/{closers}\""),
            format!("x = a.if(1) / \"/{closers}\""),
            format!("x = (1) / \"/{closers}\""),
            format!("x = a ? {{}} : {{}} / \"/{closers}\""),
            format!("x = () => {{}}\n/\"/ + '{closers}'"),
        ] {
            let src =
                format!("return {}{hide}, {}0{}{}", "[".repeat(600), "[".repeat(600), "]".repeat(600), "]".repeat(600));
            for typescript in [false, true] {
                let levels = nesting::scan(&src, typescript, usize::MAX).unwrap_or(0);
                assert!(
                    levels >= 1200,
                    "{levels} levels for {} (typescript: {typescript})",
                    &hide[..hide.len().min(40)]
                );
            }
        }
    }
}
