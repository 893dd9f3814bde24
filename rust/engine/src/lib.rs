//! codemode's engine: hostile JavaScript/TypeScript cells in a limited QuickJS runtime.
//!
//! Pure Rust, no Python: the worker process wraps it (rust/pyext). It never spawns, never does
//! I/O and never runs tools; tool calls leave as JSON text and results come back the same way.

mod alloc;
pub mod arena;
mod bytecode;
pub mod catalog;
pub mod engine;
pub mod frontend;
pub mod limits;
pub mod nesting;
pub mod search;
pub mod semantic;
mod web;

pub use catalog::Catalog;
pub use engine::{
    prelude_hash, CallMethod, ClockRun, Engine, EngineError, ErrorCode, Failure, Outcome, Output, OutputKind,
    Settlement, Status, ToolCall, AGENTS_TOOL, MCP_TOOL, MODELS_TOOL, NAMESPACE_TOOL, OUTPUT_TOOL, YIELD_TOOL,
};
pub use frontend::Language;
pub use limits::Limits;
