//! How deeply a cell nests, measured before anything recursive touches it.
//!
//! oxc's parser, its visitors (semantic analysis, the TypeScript transform, codegen, our own
//! module-access check) and QuickJS's compiler all recurse once per level of nesting, and none
//! of oxc's has a depth guard: `"[".repeat(5000)` overflowed the worker's native stack (a
//! SIGSEGV, no error to catch). Two checks keep every recursion bounded:
//!
//! * [`scan`] runs over the source bytes in one linear pass, before parsing, and gives an
//!   upper bound on how deep the *parser* will recurse: brackets, template `${`, TypeScript type
//!   arguments, and the constructs the parser handles by recursion without brackets
//!   (right-associative chains `a = b = c`, `a ? b : c ? d : e`, `x => y => z`, `**`; prefix
//!   runs `!!x`, `typeof typeof x`, `await await x`, `new new X`; statement chains
//!   `if (a) if (b)`, `else if`, labels).
//! * [`exceeds`] walks the parsed AST, descending at most `limit` levels, before any other
//!   visitor runs. It catches what the parser builds iteratively but the visitors recurse on:
//!   left-deep chains (`1 + 1 + ...`, `a.b.c...`, `f()()()...`, `a[0][0]...`, `A.B.C` types).
//!
//! Soundness of the scan is what matters (it may overestimate, never underestimate). The one
//! lexical ambiguity of JavaScript, whether a `/` starts a regular expression or divides, is
//! resolved exactly where one token of context decides it (after `)`, the token before the
//! matching `(`). Where it cannot be decided cheaply (after some `}`, after `of`, after a
//! TypeScript `>`), the scan stops trusting its lexing: from there on it counts every byte and
//! keyword that could open a level, in strings and comments too, and never counts down. Real
//! code almost never reaches that mode; hostile code only makes the bound larger.

use oxc_ast::ast::{
    AssignmentTarget, BindingPattern, Expression, Statement, TSNamespaceDeclaration, TSType, TSTypeName,
};
use oxc_ast_visit::{walk, Visit};

/// How deeply a cell may nest, in the units [`scan`] and [`exceeds`] count (roughly one per
/// bracket, operator of a right-recursive chain, nested statement or AST level). Ordinary
/// cells stay under 100; 1,000 leaves room for generated code while the worst construct at this
/// depth uses a few MiB of the front end's stack (measured: `tests::stack_per_level`).
pub const MAX_NESTING: usize = 1000;

/// Words after which a `/` starts a regular expression (they cannot end an expression).
const REGEX_AFTER_WORDS: &[&[u8]] = &[
    b"return",
    b"typeof",
    b"instanceof",
    b"in",
    b"new",
    b"delete",
    b"void",
    b"throw",
    b"case",
    b"do",
    b"else",
    b"yield",
    b"await",
    b"extends",
];

/// Words the parser handles by recursion on what follows (prefix operators, statement heads,
/// type operators): each adds a level until its chain is reset.
const CHAIN_WORDS: &[&[u8]] = &[
    b"typeof",
    b"void",
    b"delete",
    b"await",
    b"new",
    b"yield",
    b"if",
    b"for",
    b"while",
    b"do",
    b"with",
    b"class",
    b"extends",
    b"keyof",
    b"readonly",
    b"infer",
    b"unique",
    b"asserts",
    b"return",
    b"throw",
    b"case",
    b"namespace",
    b"module",
    b"else",
    b"function",
    b"async",
    b"abstract",
    b"declare",
    b"is",
];

/// Words that may continue an expression on the next line: a newline before them is no
/// statement boundary.
const INFIX_WORDS: &[&[u8]] = &[b"in", b"of", b"instanceof", b"as", b"satisfies", b"extends", b"else", b"is"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Top,
    Paren {
        regex_after: bool,
    },
    Bracket,
    Brace {
        regex_after: Option<bool>,
    },
    /// `${` of a template literal: its `}` goes back to the template's text.
    TemplateExpr,
    /// TypeScript `<`: type arguments, or a comparison (closed at `;` or a statement boundary).
    Angle,
}

#[derive(Clone, Copy)]
struct Level {
    kind: Kind,
    /// Right-recursive chain links since the last `,`, `;` or statement boundary.
    chain: usize,
    /// `else` links: an `else if` chain nests across the `;`s of its branches.
    sticky: usize,
}

/// What the previous significant token was, for `/` and for prefix `+`/`-`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prev {
    /// Start of input, a punctuator or an operator: an expression may start here.
    Operator,
    /// An identifier, literal, `]`, postfix operator: an expression ended here.
    End,
    /// A `)` whose `(` followed `if`/`while`/`for`/`with`: a statement body follows.
    ParenHead,
    /// A `)` of an expression.
    ParenEnd,
    /// A `}`; `Some(true)` if it closed a block (a regex may follow), `None` if unknown.
    Brace(Option<bool>),
    /// A word after which a `/` is a regex.
    RegexWord,
    /// `of`: a keyword in `for (x of`, an identifier elsewhere.
    Of,
    /// TypeScript `>`: closes type arguments or compares.
    Angle,
    /// `=>`: a `{` after it is a function body (a block).
    Arrow,
}

struct Scanner<'s> {
    src: &'s [u8],
    pos: usize,
    typescript: bool,
    stack: Vec<Level>,
    total: usize,
    max: usize,
    prev: Prev,
    /// The word before the last token (for `for await (`), and the last word.
    last_word: &'s [u8],
    before_last_word: &'s [u8],
    /// A newline was crossed since the previous token.
    newline: bool,
    /// The last word followed a `.`: a property name, never a keyword.
    last_word_is_property: bool,
    /// After `namespace`/`module` in TypeScript: dotted names nest until the body's `{`.
    dotted: bool,
    /// A `function`/`class` keyword was seen at this stack height and its body's `{` is still
    /// to come: `Some(true)` if it is an expression (its `}` ends one), `None` if unsure.
    body_pending: Option<(usize, Option<bool>)>,
    /// Where the last `async` stood (an `async function` is placed where its `async` is).
    async_position: Option<bool>,
}

/// An upper bound on how deep oxc's parser recurses on `source` (see the module docs), or
/// `None` once it passes `cap` (the scan stops there: a hostile source costs no more).
pub fn scan(source: &str, typescript: bool, cap: usize) -> Option<usize> {
    let mut s = Scanner {
        src: source.as_bytes(),
        pos: 0,
        typescript,
        stack: vec![Level { kind: Kind::Top, chain: 0, sticky: 0 }],
        total: 1,
        max: 1,
        prev: Prev::Operator,
        last_word: b"",
        before_last_word: b"",
        newline: false,
        last_word_is_property: false,
        dotted: false,
        body_pending: None,
        async_position: None,
    };
    if s.code(cap) {
        Some(s.max)
    } else {
        None
    }
}

impl<'s> Scanner<'s> {
    fn peek(&self, ahead: usize) -> u8 {
        self.src.get(self.pos + ahead).copied().unwrap_or(0)
    }

    fn top(&mut self) -> &mut Level {
        let last = self.stack.len() - 1;
        &mut self.stack[last]
    }

    fn note(&mut self) {
        self.max = self.max.max(self.total);
    }

    fn link(&mut self) {
        self.top().chain += 1;
        self.total += 1;
        self.note();
    }

    fn push(&mut self, kind: Kind) {
        self.stack.push(Level { kind, chain: 0, sticky: 0 });
        self.total += 1;
        self.note();
    }

    fn pop(&mut self) -> Option<Kind> {
        if self.stack.len() <= 1 {
            return None;
        }
        let level = self.stack.pop()?;
        self.total -= 1 + level.chain + level.sticky;
        Some(level.kind)
    }

    /// Closes TypeScript `<` levels left open by comparisons.
    fn pop_angles(&mut self) {
        while matches!(self.top().kind, Kind::Angle) {
            self.pop();
        }
    }

    fn reset_chain(&mut self) {
        let top = self.top();
        let chain = std::mem::take(&mut top.chain);
        self.total -= chain;
    }

    /// Scans code until the input ends; false once the bound passes `cap`.
    fn code(&mut self, cap: usize) -> bool {
        while self.pos < self.src.len() {
            if self.max > cap {
                return false;
            }
            let b = self.src[self.pos];
            match b {
                b'\n' | b'\r' => {
                    self.newline = true;
                    self.pos += 1;
                }
                b' ' | b'\t' | 0x0b | 0x0c => self.pos += 1,
                b'/' if self.peek(1) == b'/' => self.skip_line(),
                b'/' if self.peek(1) == b'*' => self.skip_block_comment(),
                b'/' => match self.slash_starts_regex() {
                    Some(true) => {
                        self.skip_regex();
                        self.token(Prev::End);
                    }
                    Some(false) => {
                        self.pos += 1;
                        if self.peek(0) == b'=' {
                            self.pos += 1;
                            self.link();
                        }
                        self.token(Prev::Operator);
                    }
                    None => return self.crude(cap),
                },
                b'\'' | b'"' => {
                    self.skip_string(b);
                    self.token(Prev::End);
                }
                b'`' => {
                    self.pos += 1;
                    self.template();
                }
                b'(' => {
                    let head = self.prev == Prev::End
                        && !self.last_word_is_property
                        && (matches!(self.last_word, b"if" | b"while" | b"for" | b"with")
                            || (self.last_word == b"await" && self.before_last_word == b"for"));
                    // `if (` etc.: the words count as chain links; their paren is a statement head.
                    self.pos += 1;
                    self.token(Prev::Operator);
                    self.push(Kind::Paren { regex_after: head });
                }
                b'[' => {
                    self.pos += 1;
                    self.token(Prev::Operator);
                    self.push(Kind::Bracket);
                }
                b'{' => {
                    let regex_after = self.brace_is_block();
                    self.pos += 1;
                    self.dotted = false;
                    self.token(Prev::Operator);
                    self.push(Kind::Brace { regex_after });
                }
                b')' | b']' | b'}' => {
                    self.pos += 1;
                    self.pop_angles();
                    let prev = match self.pop() {
                        Some(Kind::TemplateExpr) => {
                            self.template();
                            continue;
                        }
                        Some(Kind::Paren { regex_after: true }) => Prev::ParenHead,
                        Some(Kind::Paren { regex_after: false }) => Prev::ParenEnd,
                        Some(Kind::Brace { regex_after }) => Prev::Brace(regex_after),
                        _ if b == b'}' => Prev::Brace(None),
                        _ => Prev::End,
                    };
                    self.token(prev);
                }
                b';' => {
                    self.pos += 1;
                    self.pop_angles();
                    self.reset_chain();
                    self.dotted = false;
                    self.token(Prev::Operator);
                }
                b',' => {
                    self.pos += 1;
                    self.reset_chain();
                    self.token(Prev::Operator);
                }
                b'<' if self.typescript => {
                    self.pos += 1;
                    if self.peek(0) == b'<' {
                        self.pos += 1;
                    }
                    if self.peek(0) == b'=' {
                        self.pos += 1;
                    }
                    self.token(Prev::Operator);
                    self.push(Kind::Angle);
                }
                b'>' if self.typescript => {
                    self.pos += 1;
                    let assign = self.peek(0) == b'=';
                    if matches!(self.top().kind, Kind::Angle) {
                        // A type argument list or assertion `<T>x`: the parser recursed into it
                        // and, for an assertion, recurses again on what follows.
                        self.pop();
                        self.link();
                    }
                    if assign {
                        self.pos += 1;
                        self.link();
                    }
                    self.token(Prev::Angle);
                }
                b'=' | b'?' | b':' | b'!' | b'~' | b'*' | b'%' | b'&' | b'|' | b'^' | b'<' | b'>' | b'+' | b'-'
                | b'.' | b'@' | b'#' => self.punctuator(),
                b'0'..=b'9' => {
                    self.skip_number();
                    self.token(Prev::End);
                }
                _ => self.word(),
            }
        }
        self.max <= cap
    }

    /// Records a token: a newline before a statement-starting word after an ended expression
    /// is a statement boundary (ASI), where every chain of this level ends.
    fn token(&mut self, prev: Prev) {
        self.prev = prev;
        self.newline = false;
    }

    /// Whether the previous token surely ended an expression (a `+` here is binary, a
    /// TypeScript `!` postfix). Unsure cases say no: a prefix operator is counted, never missed.
    fn ended(&self) -> bool {
        matches!(self.prev, Prev::End | Prev::ParenEnd)
    }

    fn punctuator(&mut self) {
        let b = self.src[self.pos];
        let next = self.peek(1);
        let ended = self.ended();
        let mut prev = Prev::Operator;
        match (b, next) {
            (b'=', b'>') => {
                self.pos += 2;
                self.link();
                prev = Prev::Arrow;
            }
            (b'=', b'=') | (b'!', b'=') => {
                self.pos += 2;
                if self.peek(0) == b'=' {
                    self.pos += 1;
                }
            }
            (b'=', _) => {
                self.pos += 1;
                self.link();
            }
            (b'?', b'?') => {
                self.pos += 2;
                if self.peek(0) == b'=' {
                    self.pos += 1;
                    self.link();
                }
            }
            (b'?', b'.') if !self.peek(2).is_ascii_digit() => self.pos += 2,
            (b'?' | b':' | b'~', _) => {
                self.pos += 1;
                self.link();
            }
            (b'!', _) => {
                self.pos += 1;
                if self.typescript && ended {
                    // TypeScript's postfix non-null assertion `x!`.
                    prev = Prev::End;
                } else {
                    self.link();
                }
            }
            (b'*', b'*') => {
                self.pos += 2;
                if self.peek(0) == b'=' {
                    self.pos += 1;
                }
                self.link();
            }
            (b'+', b'+') | (b'-', b'-') => {
                self.pos += 2;
                if ended {
                    prev = Prev::End;
                } else {
                    self.link();
                }
            }
            (b'+' | b'-', _) => {
                self.pos += 1;
                if self.peek(0) == b'=' {
                    self.pos += 1;
                    self.link();
                } else if !ended {
                    self.link();
                }
            }
            (b'.', _) => {
                self.pos += 1;
                if self.dotted {
                    self.link();
                }
                while self.peek(0) == b'.' {
                    self.pos += 1;
                }
            }
            _ => {
                // `* % & | ^ < > << >> >>> && ||` and their `=` forms; `@`, `#`.
                self.pos += 1;
                while matches!(self.peek(0), b'&' | b'|' | b'<' | b'>') && self.peek(0) == b {
                    self.pos += 1;
                }
                if b == b'>' {
                    while self.peek(0) == b'>' {
                        self.pos += 1;
                    }
                }
                if self.peek(0) == b'=' && b != b'@' && b != b'#' {
                    self.pos += 1;
                    self.link();
                }
                if b == b'#' {
                    prev = self.prev;
                }
            }
        }
        self.token(prev);
    }

    fn word(&mut self) {
        let start = self.pos;
        // Identifier characters: ASCII word bytes, `$`, `\` escapes and any non-ASCII byte.
        while self.pos < self.src.len() {
            let b = self.src[self.pos];
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'\\' || b >= 0x80 {
                self.pos += 1;
            } else {
                break;
            }
        }
        if self.pos == start {
            // A byte no token starts with (the parser rejects it); skip it.
            self.pos += 1;
            self.token(Prev::Operator);
            return;
        }
        let word = &self.src[start..self.pos];
        let property = self.src[..start].trim_ascii_end().last() == Some(&b'.');
        // No statement ends after `if (...)` or `of`; after other ended expressions it does.
        let asi_end = matches!(self.prev, Prev::End | Prev::ParenEnd | Prev::Brace(_) | Prev::Angle);
        if self.newline && asi_end && !INFIX_WORDS.contains(&word) {
            self.pop_angles();
            self.reset_chain();
        }
        if word == b"else" {
            self.top().sticky += 1;
            self.total += 1;
            self.note();
        } else if CHAIN_WORDS.contains(&word) && !property {
            self.link();
        }
        if self.typescript && matches!(word, b"namespace" | b"module") && !property {
            self.dotted = true;
        }
        if !property {
            match word {
                b"async" => self.async_position = self.expression_position(start),
                b"function" | b"class" => {
                    let position = if self.last_word == b"async" && self.prev == Prev::End {
                        self.async_position
                    } else {
                        self.expression_position(start)
                    };
                    self.body_pending = Some((self.stack.len(), position));
                }
                _ => {}
            }
        }
        self.before_last_word = self.last_word;
        self.last_word = word;
        self.last_word_is_property = property;
        let prev = if word == b"of" {
            Prev::Of
        } else if REGEX_AFTER_WORDS.contains(&word) {
            Prev::RegexWord
        } else {
            Prev::End
        };
        self.token(prev);
    }

    /// The last byte before `start` that is not whitespace (0 at the start of input).
    fn byte_before(&self, start: usize) -> u8 {
        self.src[..start].trim_ascii_end().last().copied().unwrap_or(0)
    }

    /// Whether a `function`/`class` keyword starting at `start` is an expression
    /// (`Some(false)`: a declaration; `None`: unsure).
    fn expression_position(&self, start: usize) -> Option<bool> {
        match self.prev {
            Prev::Operator => match self.byte_before(start) {
                0 | b';' | b'{' | b'}' => Some(false),
                b':' => None,
                _ => Some(true),
            },
            Prev::Arrow => Some(true),
            Prev::RegexWord => Some(!matches!(self.last_word, b"do" | b"else")),
            Prev::ParenHead | Prev::Brace(_) => Some(false),
            _ => None,
        }
    }

    /// Whether a `{` opens a block (after its `}`, a `/` starts a regex): `Some(false)` for an
    /// object literal or the body of a function/class expression, `None` when unsure.
    fn brace_is_block(&mut self) -> Option<bool> {
        if let Some((height, position)) = self.body_pending {
            if height == self.stack.len() {
                self.body_pending = None;
                return position.map(|expression| !expression);
            }
        }
        match self.prev {
            Prev::ParenHead | Prev::ParenEnd | Prev::Brace(_) | Prev::Arrow => Some(true),
            Prev::Operator => match self.byte_before(self.pos) {
                0 | b';' | b'{' | b'}' => Some(true),
                b':' => None,
                _ => Some(false),
            },
            Prev::RegexWord => Some(matches!(self.last_word, b"do" | b"else")),
            Prev::End if !self.last_word_is_property && matches!(self.last_word, b"try" | b"finally") => Some(true),
            _ => None,
        }
    }

    /// Whether a `/` here starts a regular expression; `None` if one token cannot tell.
    fn slash_starts_regex(&self) -> Option<bool> {
        match self.prev {
            Prev::Operator | Prev::RegexWord | Prev::ParenHead | Prev::Arrow => Some(true),
            Prev::End | Prev::ParenEnd => Some(false),
            Prev::Angle if !self.typescript => Some(true),
            Prev::Brace(known) => known,
            Prev::Of | Prev::Angle => None,
        }
    }

    fn skip_line(&mut self) {
        while self.pos < self.src.len() && !matches!(self.src[self.pos], b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn skip_block_comment(&mut self) {
        self.pos += 2;
        while self.pos < self.src.len() {
            if self.src[self.pos] == b'\n' {
                self.newline = true;
            }
            if self.src[self.pos] == b'*' && self.peek(1) == b'/' {
                self.pos += 2;
                return;
            }
            self.pos += 1;
        }
    }

    /// A string literal; it ends at its quote or, unterminated, at a line end.
    fn skip_string(&mut self, quote: u8) {
        self.pos += 1;
        while self.pos < self.src.len() {
            match self.src[self.pos] {
                b'\\' => self.pos += 2,
                b'\n' | b'\r' => return,
                b if b == quote => {
                    self.pos += 1;
                    return;
                }
                _ => self.pos += 1,
            }
        }
    }

    fn skip_regex(&mut self) {
        self.pos += 1;
        let mut class = false;
        while self.pos < self.src.len() {
            match self.src[self.pos] {
                b'\\' => self.pos += 2,
                b'\n' | b'\r' => return,
                b'[' => {
                    class = true;
                    self.pos += 1;
                }
                b']' => {
                    class = false;
                    self.pos += 1;
                }
                b'/' if !class => {
                    self.pos += 1;
                    while self.pos < self.src.len() && self.src[self.pos].is_ascii_alphanumeric() {
                        self.pos += 1;
                    }
                    return;
                }
                _ => self.pos += 1,
            }
        }
    }

    fn skip_number(&mut self) {
        let mut last = 0;
        while let Some(&b) = self.src.get(self.pos) {
            let exponent_sign = matches!(b, b'+' | b'-') && matches!(last, b'e' | b'E');
            if b.is_ascii_alphanumeric() || b == b'_' || (b == b'.' && self.peek(1) != b'.') || exponent_sign {
                self.pos += 1;
                last = b;
            } else {
                break;
            }
        }
    }

    /// Template text after a backtick or a `${...}`: up to the closing backtick (then a token
    /// that ended an expression) or a `${` (a new level).
    fn template(&mut self) {
        while self.pos < self.src.len() {
            match self.src[self.pos] {
                b'\\' => self.pos += 2,
                b'`' => {
                    self.pos += 1;
                    self.token(Prev::End);
                    return;
                }
                b'$' if self.peek(1) == b'{' => {
                    self.pos += 2;
                    self.token(Prev::Operator);
                    self.push(Kind::TemplateExpr);
                    return;
                }
                _ => self.pos += 1,
            }
        }
    }

    /// The lexing can no longer be trusted: count everything that could open a level, in any
    /// context, and never count down.
    fn crude(&mut self, cap: usize) -> bool {
        let mut total = self.total;
        let mut i = self.pos;
        while i < self.src.len() {
            let b = self.src[i];
            if b.is_ascii_alphabetic() {
                let start = i;
                while i < self.src.len() && (self.src[i].is_ascii_alphanumeric() || self.src[i] == b'_') {
                    i += 1;
                }
                if CHAIN_WORDS.contains(&&self.src[start..i]) {
                    total += 1;
                }
                continue;
            }
            if matches!(b, b'(' | b'[' | b'{' | b'=' | b'?' | b':' | b'!' | b'~' | b'+' | b'-' | b'*' | b'<' | b'.') {
                total += 1;
                if total > cap {
                    self.max = total;
                    return false;
                }
            }
            i += 1;
        }
        self.max = self.max.max(total);
        self.max <= cap
    }
}

/// Whether the AST nests deeper than `limit` levels; the walk never descends past `limit`, so
/// its own recursion is bounded. Returns the depth reached (at most `limit + 1`).
pub fn depth(program: &oxc_ast::ast::Program<'_>, limit: usize) -> usize {
    let mut gauge = Gauge { depth: 0, max: 0, limit };
    gauge.visit_program(program);
    gauge.max
}

/// Whether `depth` says the AST passed `limit`.
pub fn exceeds(program: &oxc_ast::ast::Program<'_>, limit: usize) -> bool {
    depth(program, limit) > limit
}

/// Counts levels at every node type through which the AST recurses (every cycle of its types
/// passes through one of them), and stops descending past the limit.
struct Gauge {
    depth: usize,
    max: usize,
    limit: usize,
}

impl Gauge {
    fn enter(&mut self) -> bool {
        self.depth += 1;
        self.max = self.max.max(self.depth);
        self.depth <= self.limit
    }
}

macro_rules! gauged {
    ($($method:ident($ty:ty) => $walk:ident;)*) => {
        $(
            fn $method(&mut self, it: &$ty) {
                if self.enter() {
                    walk::$walk(self, it);
                }
                self.depth -= 1;
            }
        )*
    };
}

impl<'a> Visit<'a> for Gauge {
    gauged! {
        visit_expression(Expression<'a>) => walk_expression;
        visit_statement(Statement<'a>) => walk_statement;
        visit_ts_type(TSType<'a>) => walk_ts_type;
        visit_ts_type_name(TSTypeName<'a>) => walk_ts_type_name;
        visit_binding_pattern(BindingPattern<'a>) => walk_binding_pattern;
        visit_assignment_target(AssignmentTarget<'a>) => walk_assignment_target;
        visit_ts_namespace_declaration(TSNamespaceDeclaration<'a>) => walk_ts_namespace_declaration;
    }
}
