//! Engines in arenas (`codemode_engine::arena`): a reset makes an engine pristine again, and
//! nothing one cell does — globals, prototypes, the symbol registry, interned atoms, memory,
//! a cell killed mid-allocation or by a stack overflow — reaches the next. Each test tries to
//! carry state across a reset and checks the next cell against a freshly built engine.

mod common;

use std::sync::Arc;

use codemode_engine::arena::{outside, ArenaAllocator, Heap, HeapError};
use codemode_engine::{Catalog, Engine, ErrorCode, Language, Limits, Outcome, Settlement, Status};
use common::{engine_with, CATALOG, RUN};

#[global_allocator]
static ALLOCATOR: ArenaAllocator = ArenaAllocator;

fn catalog() -> Arc<Catalog> {
    match Catalog::from_json(CATALOG) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("catalog: {e}"),
    }
}

fn heap_with(limits: Limits) -> Heap<Engine> {
    let catalog = catalog();
    match Heap::new(|| Engine::new(limits, catalog)) {
        Ok(heap) => heap,
        Err(e) => panic!("heap: {e}"),
    }
}

fn heap() -> Heap<Engine> {
    heap_with(Limits::default())
}

/// Runs `cell` in the heap's engine and hands back the outcome copied to the system heap (the
/// arena's copy is dropped inside), so it may outlive the next reset.
fn run(heap: &mut Heap<Engine>, cell: &str) -> Outcome {
    run_for(heap, cell, 2000.0)
}

fn run_for(heap: &mut Heap<Engine>, cell: &str, timeout_ms: f64) -> Outcome {
    heap.with(|engine| {
        let outcome = engine.start(cell, Language::JavaScript, timeout_ms, 7, RUN);
        outside(|| outcome.clone())
    })
}

fn settle(heap: &mut Heap<Engine>, id: u32, payload: &str) -> Outcome {
    let settlement = Settlement { id, ok: true, payload: payload.to_owned() };
    heap.with(|engine| {
        let outcome = engine.settle(vec![settlement], 2000.0);
        outside(|| outcome.clone())
    })
}

fn reset(heap: &mut Heap<Engine>) {
    // SAFETY: every outcome these tests keep was copied outside the arena by `run`/`settle`,
    // and nothing outside holds a pointer into it.
    unsafe { heap.reset() }
}

/// The outcome of `cell` in a newly built engine (the old way: the system heap).
fn fresh(cell: &str) -> Outcome {
    outside(|| engine_with(Limits::default()).start(cell, Language::JavaScript, 2000.0, 7, RUN))
}

fn completed(outcome: &Outcome) -> &str {
    match &outcome.status {
        Status::Completed(json) => json,
        other => panic!("not completed: {other:?}"),
    }
}

/// After `polluting` ran and the heap was reset, `probe` sees what a fresh engine sees.
fn assert_nothing_carries(polluting: &str, probe: &str) {
    let mut heap = heap();
    let before = run(&mut heap, probe);
    reset(&mut heap);
    let dirty = run(&mut heap, &format!("{polluting}; return 1"));
    assert!(!matches!(dirty.status, Status::Pending), "{polluting}: {dirty:?}");
    reset(&mut heap);
    let after = run(&mut heap, probe);
    assert_eq!(after, before, "{polluting} carried into {probe}");
    assert_eq!(after, fresh(probe), "{probe} in a reset heap differs from a fresh engine");
    // The control: in the same engine, the probe does see the pollution.
    let polluted = fresh(&format!("{polluting};\n{probe}"));
    assert_ne!(polluted, before, "{probe} cannot tell that {polluting} ran");
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe { heap.discard() };
}

#[test]
fn a_global_set_by_one_cell_is_gone_after_a_reset() {
    assert_nothing_carries(
        "globalThis.leak = 1; var leakVar = 2; leakFn = () => 3",
        "return [typeof leak, typeof leakVar, typeof leakFn, Object.keys(globalThis).length]",
    );
}

#[test]
fn prototype_pollution_is_gone_after_a_reset() {
    assert_nothing_carries(
        "Object.prototype.polluted = 1; Array.prototype.push = function () { return 'owned' }; \
         Function.prototype.call = null; String.prototype.trim = () => 'x'; \
         Object.defineProperty(Object.prototype, 'then', {get() { throw 1 }, configurable: true}); \
         JSON.stringify = () => '\"owned\"'; Promise.prototype.then = null",
        "const a = []; return [({}).polluted, a.push(1), typeof Function.prototype.call, ' y '.trim(), \
         JSON.stringify({a: 1}), typeof Promise.prototype.then]",
    );
}

#[test]
fn the_symbol_registry_and_interned_atoms_are_gone_after_a_reset() {
    // A registered symbol, atoms made from strings: a fresh engine's memory count tells if the
    // previous cell's atoms, shapes or registry entries were still there.
    assert_nothing_carries(
        "for (let i = 0; i < 5000; i++) { Symbol.for('reg' + i); ({})['atom_' + i] = i; } \
         globalThis.s = Symbol.for('k'); Object.prototype[Symbol.for('k')] = 1",
        "const o = {}; o['atom_' + 7] = 1; return [({})[Symbol.for('k')], Symbol.keyFor(Symbol.for('reg1')), \
         Object.getOwnPropertySymbols(Object.prototype).length]",
    );
}

#[test]
fn a_reset_engine_reports_the_same_memory_as_a_fresh_one() {
    let mut heap = heap();
    let probe = "return 1";
    let fresh = fresh(probe);
    for _ in 0..3 {
        let outcome = run(&mut heap, probe);
        assert_eq!(outcome.memory_bytes, fresh.memory_bytes);
        reset(&mut heap);
        run(&mut heap, "globalThis.big = 'x'.repeat(1 << 20) + Math.random(); return 2");
        reset(&mut heap);
    }
}

#[test]
fn an_out_of_memory_cell_recovers_and_gives_its_pages_back() {
    let limits = Limits { memory_bytes: 32 << 20, ..Limits::default() };
    let mut heap = heap_with(limits);
    let image = heap.image_bytes();
    let oom = run(&mut heap, "const a = []; while (true) a.push('x'.repeat(1 << 16) + a.length); return 1");
    match &oom.status {
        Status::Failed(f) => assert_eq!(f.code, Some(ErrorCode::MemoryLimitExceeded)),
        other => panic!("not out of memory: {other:?}"),
    }
    assert!(heap.committed_bytes() > 16 << 20, "the cell grew the arena: {}", heap.committed_bytes());
    reset(&mut heap);
    assert!(heap.committed_bytes() <= image.next_multiple_of(4096), "pages above the image were kept");
    let small = run(&mut heap, "return [typeof a, 6 * 7]");
    assert_eq!(completed(&small), r#"["undefined",42]"#);
    assert_eq!(small.memory_bytes, fresh("return [typeof a, 6 * 7]").memory_bytes);
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe { heap.discard() };
}

#[test]
fn a_cell_interrupted_mid_allocation_leaves_nothing_behind() {
    let mut heap = heap();
    let killed = run_for(
        &mut heap,
        "globalThis.partial = []; while (true) { partial.push({a: 'x'.repeat(100), b: [1, 2, 3]}); partial.length %= 20000 }",
        50.0,
    );
    match &killed.status {
        Status::Failed(f) => assert_eq!(f.code, Some(ErrorCode::Timeout)),
        other => panic!("not a timeout: {other:?}"),
    }
    reset(&mut heap);
    let probe = "return [typeof partial, Object.keys(globalThis).length]";
    assert_eq!(run(&mut heap, probe), fresh(probe));
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe { heap.discard() };
}

#[test]
fn a_stack_overflow_leaves_nothing_behind() {
    let mut heap = heap();
    let overflow = run(&mut heap, "globalThis.depth = 0; function f() { depth++; return f() + 1 } return f()");
    match &overflow.status {
        Status::Failed(f) => assert!(f.message.contains("stack"), "{f:?}"),
        other => panic!("no overflow: {other:?}"),
    }
    reset(&mut heap);
    let probe = "function g(n) { return n ? g(n - 1) + 1 : 0 } return [typeof depth, g(500)]";
    assert_eq!(completed(&run(&mut heap, probe)), r#"["undefined",500]"#);
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe { heap.discard() };
}

#[test]
fn a_suspended_run_keeps_its_heap_while_other_heaps_run_and_reset() {
    let mut parked = heap();
    let started = run(
        &mut parked,
        "let kept = {n: 41, s: 'x'.repeat(1000)}; const r = await tools.read({}); return [kept.n + r, kept.s.length]",
    );
    assert_eq!(started.status, Status::Pending);
    let id = started.calls[0].id;
    let mut busy = heap();
    for i in 0..300 {
        let out = run(&mut busy, &format!("globalThis.kept = {i}; return Object.prototype.x = {i}"));
        assert_eq!(completed(&out), i.to_string());
        reset(&mut busy);
    }
    let done = settle(&mut parked, id, "1");
    assert_eq!(completed(&done), "[42,1000]");
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe {
        busy.discard();
        parked.discard();
    }
}

#[test]
fn a_thousand_mixed_cells_back_to_back_each_start_pristine() {
    let limits = Limits { memory_bytes: 16 << 20, ..Limits::default() };
    let mut heap = heap_with(limits);
    let probe = "return [typeof leak, ({}).polluted, [].push.name]";
    let clean = completed(&fresh(probe)).to_owned();
    for i in 0..1000 {
        let outcome = match i % 6 {
            0 => run(&mut heap, &format!("globalThis.leak = {i}; Object.prototype.polluted = {i}; return {i}")),
            1 => {
                let pending = run(&mut heap, "const r = await tools.double({n: 2}); return r * 2");
                assert_eq!(pending.status, Status::Pending, "{pending:?}");
                settle(&mut heap, pending.calls[0].id, "21")
            }
            2 => run(&mut heap, "throw new TypeError('no')"),
            3 => heap.with(|engine| {
                let out = engine.start("const n: number = 3; return n * 2", Language::TypeScript, 2000.0, 1, "{}");
                outside(|| out.clone())
            }),
            4 if i % 60 == 4 => run(&mut heap, "const a = []; while (true) a.push('y'.repeat(4096)); return 0"),
            _ => run(&mut heap, probe),
        };
        match i % 6 {
            0 => assert_eq!(completed(&outcome), i.to_string()),
            1 => assert_eq!(completed(&outcome), "42"),
            2 => assert!(matches!(outcome.status, Status::Failed(_))),
            3 => assert_eq!(completed(&outcome), "6"),
            4 if i % 60 == 4 => {
                assert!(matches!(&outcome.status, Status::Failed(f) if f.code == Some(ErrorCode::MemoryLimitExceeded)))
            }
            _ => assert_eq!(completed(&outcome), clean, "cell {i}"),
        }
        reset(&mut heap);
    }
    // SAFETY: the outcomes above were copied outside the arena.
    unsafe { heap.discard() };
}

#[test]
fn frees_go_to_the_owner_of_the_pointer_whatever_is_entered() {
    let mut heap = match Heap::new(|| Ok::<_, HeapError>(Vec::<String>::new())) {
        Ok(heap) => heap,
        Err(e) => panic!("heap: {e}"),
    };
    let outside_value = String::from("system");
    let inside_value = heap.with(|v| {
        // A system string dropped inside, an arena string taken outside.
        drop(outside_value);
        v.push("kept".repeat(100));
        "leaves".repeat(10)
    });
    assert!(heap.owns(inside_value.as_ptr()));
    let mut grown = inside_value;
    grown.push_str(&"more".repeat(1000));
    assert!(heap.owns(grown.as_ptr()), "a realloc outside stays in the owning arena");
    drop(grown);
    let system = String::from("s");
    assert!(!heap.owns(system.as_ptr()));
    heap.with(|v| assert_eq!(v.len(), 1));
    reset_plain(&mut heap);
    heap.with(|v| assert!(v.is_empty(), "the image was taken with an empty vector"));
    // SAFETY: no value from the arena is alive outside (`grown` was dropped).
    unsafe { heap.discard() };
}

fn reset_plain(heap: &mut Heap<Vec<String>>) {
    // SAFETY: the arena's values taken out were dropped before this reset.
    unsafe { heap.reset() }
}

#[test]
fn a_build_that_fails_reports_its_error_and_frees_the_slot() {
    let failed = Heap::<Engine>::new(|| Err::<Engine, _>(String::from("no engine today")));
    assert!(matches!(&failed, Err(HeapError::Build(m)) if m == "no engine today"), "{:?}", failed.err());
}

#[test]
fn an_engine_image_is_a_few_hundred_kilobytes() {
    let heap = heap();
    // ~160 KB of QuickJS heap after the prelude, plus rquickjs's and the engine's Rust side.
    assert!(heap.image_bytes() < 512 << 10, "image of {} bytes", heap.image_bytes());
    assert!(heap.committed_bytes() >= heap.image_bytes());
    // SAFETY: nothing ran in the heap.
    unsafe { heap.discard() };
}
