//! A guest that swallows every error while it fills the heap is still stopped, as out of
//! memory: the uncatchable interrupt always finds room to be built.

use std::sync::Arc;

use codemode_engine::{Catalog, Engine, ErrorCode, Language, Limits, Status};

#[test]
fn a_guest_swallowing_out_of_memory_in_a_loop_ends_as_out_of_memory() {
    for cell in [
        "const keep = []; for (;;) { try { for (;;) keep.push('x'.repeat(1000)) } catch (e) {} }",
        "'use strict'; const keep = []; for (;;) { try { for (;;) keep.push('x'.repeat(1000)) } catch (e) {} }",
        "const keep = []; for (;;) { try { for (;;) keep.push('x'.repeat(1000) + keep.length) } catch (e) {} }",
    ] {
        let limits = Limits { memory_bytes: 16 << 20, ..Limits::default() };
        let mut engine = match Engine::new(limits, Arc::new(Catalog::empty())) {
            Ok(e) => e,
            Err(e) => panic!("engine: {e}"),
        };
        match engine.start(cell, Language::JavaScript, 5_000.0, 1, "{}").status {
            Status::Failed(f) => assert_eq!(f.code, Some(ErrorCode::MemoryLimitExceeded), "{cell}: {f:?}"),
            other => panic!("{cell}: {other:?}"),
        }
    }
}
