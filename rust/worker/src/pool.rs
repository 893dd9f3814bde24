//! Where each run's engine comes from, and where it goes when the run ends.
//!
//! ```text
//!   take ──> ready heap (pristine)  ──or──> a new Heap (built in a fresh arena, ~0.4 ms)
//!                                   ──or──> a plain Engine on the system heap (no arena left)
//!   run ends ──> retire ──> finished ──idle──> reset (copy the image back) ──> ready
//!                                    └──a run starts first, none ready: reuse_finished (reset) ──> ready
//!                                    └──idle──> discard (configuration changed, enough ready)
//! ```
//!
//! A heap (`codemode_engine::arena::Heap`) holds one engine in its own fixed-address arena;
//! resetting it copies back the image taken after the prelude was installed, so every cell
//! still starts on a fresh heap, and back to back a cell costs a copy (~5-30 µs) instead of an
//! engine build and drop (~0.4 ms). Parked and suspended runs keep their heaps; a finished
//! run's heap is reset only in idle work, never while a report of it may still be alive (the
//! arena's contract). Any end — completed, failed, out of memory, interrupted, a stack overflow
//! — is followed by a reset before reuse: a heap is never handed out dirty. When arenas are
//! unavailable (the region could not be reserved) or all in use, runs get a plain engine, built
//! the old way.

use codemode_engine::arena::{Heap, HeapError, SLOTS};
use codemode_engine::Engine;

/// Pristine heaps kept ready at most; a finished heap past this is discarded.
const MAX_READY: usize = 4;

/// A run's engine: in its own arena, or (the fallback) on the system heap.
pub enum Sandbox {
    Heap { heap: Heap<Engine>, generation: u64 },
    Plain(Box<Engine>),
}

impl Sandbox {
    /// Runs `f` on the engine (inside its arena, for a heap).
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Engine) -> R) -> R {
        match self {
            Sandbox::Heap { heap, .. } => heap.with(f),
            Sandbox::Plain(engine) => f(engine),
        }
    }
}

pub struct HeapPool {
    /// Bumped when the configuration changes: heaps built before are not reused.
    generation: u64,
    ready: Vec<Heap<Engine>>,
    /// Heaps of ended runs (and of an old configuration), reset or discarded in idle work.
    finished: Vec<(Heap<Engine>, u64)>,
    /// Plain engines of ended runs, dropped in idle work.
    retired: Vec<Engine>,
    /// Heaps alive now (ready, running, resident or finished), at most `max_heaps`.
    live: usize,
    max_heaps: usize,
    /// False once arenas proved unavailable in this process: plain engines from then on.
    heaps: bool,
}

impl HeapPool {
    pub fn new() -> HeapPool {
        HeapPool::with_max_heaps(SLOTS)
    }

    /// A pool that holds at most `max_heaps` heaps at once; runs past that get plain engines.
    pub fn with_max_heaps(max_heaps: usize) -> HeapPool {
        HeapPool {
            generation: 0,
            ready: Vec::new(),
            finished: Vec::new(),
            retired: Vec::new(),
            live: 0,
            max_heaps,
            heaps: true,
        }
    }

    /// A pristine engine for a new run: a ready heap, a new one, or a plain engine.
    pub fn take(&mut self, build: &dyn Fn() -> Result<Engine, String>) -> Result<Sandbox, String> {
        if let Some(heap) = self.ready.pop() {
            return Ok(Sandbox::Heap { heap, generation: self.generation });
        }
        if let Some(heap) = self.new_heap(build) {
            return Ok(Sandbox::Heap { heap, generation: self.generation });
        }
        build().map(|engine| Sandbox::Plain(Box::new(engine)))
    }

    fn new_heap(&mut self, build: &dyn Fn() -> Result<Engine, String>) -> Option<Heap<Engine>> {
        if !self.heaps || self.live >= self.max_heaps {
            return None;
        }
        match Heap::new(build) {
            Ok(heap) => {
                self.live += 1;
                Some(heap)
            }
            Err(HeapError::NotInstalled | HeapError::Reserve(_)) => {
                self.heaps = false;
                None
            }
            Err(HeapError::Exhausted | HeapError::Build(_)) => None,
        }
    }

    /// Takes back the engine of a run that ended (or was dropped); freed or reset while idle.
    pub fn retire(&mut self, sandbox: Sandbox) {
        match sandbox {
            Sandbox::Heap { heap, generation } => self.finished.push((heap, generation)),
            Sandbox::Plain(engine) => self.retired.push(*engine),
        }
    }

    /// The configuration changed: engines built from now on differ, ready heaps are stale.
    pub fn configure(&mut self) {
        let stale = self.generation;
        self.generation += 1;
        self.finished.extend(self.ready.drain(..).map(|heap| (heap, stale)));
    }

    /// Resets the finished heaps of this configuration into the ready set when none is ready:
    /// what a new run's `take` would otherwise pay an engine build for (~0.4 ms against a copy of
    /// ~5-30 µs). Called before a frame that starts a run, when a run ended just before it and
    /// the idle work that would have reset its heap was put off (the worker's grace).
    ///
    /// # Safety
    /// The contract of `idle`: no value allocated in a finished heap's arena is alive outside it.
    pub unsafe fn reuse_finished(&mut self) {
        if !self.ready.is_empty() {
            return;
        }
        let generation = self.generation;
        if let Some(at) = self.finished.iter().position(|(_, g)| *g == generation) {
            let (mut heap, _) = self.finished.swap_remove(at);
            // SAFETY: the caller's contract.
            unsafe { heap.reset() };
            self.ready.push(heap);
        }
    }

    pub fn has_idle_work(&self, configured: bool) -> bool {
        !self.finished.is_empty() || !self.retired.is_empty() || (configured && self.ready.is_empty())
    }

    /// Work done between frames: free plain engines, reset finished heaps into the ready set
    /// (or discard them), and build one ready heap when none is left.
    ///
    /// # Safety
    /// No value allocated in a finished heap's arena is alive outside it: the reports of the
    /// runs that ended were sent and dropped.
    pub unsafe fn idle(&mut self, build: Option<&dyn Fn() -> Result<Engine, String>>) {
        self.retired.clear();
        for (mut heap, generation) in std::mem::take(&mut self.finished) {
            if generation == self.generation && self.ready.len() < MAX_READY {
                // SAFETY: the caller's contract.
                unsafe { heap.reset() };
                self.ready.push(heap);
            } else {
                // SAFETY: the caller's contract.
                unsafe { heap.discard() };
                self.live -= 1;
            }
        }
        if let (Some(build), true) = (build, self.ready.is_empty()) {
            if let Some(heap) = self.new_heap(build) {
                self.ready.push(heap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use codemode_engine::{Catalog, Language, Limits, Status};

    use super::*;

    fn build() -> Result<Engine, String> {
        let catalog = Catalog::from_json(r#"{"tools": [], "api": {}, "mcpServers": {}}"#).map_err(|e| e.to_string())?;
        Engine::new(Limits::default(), Arc::new(catalog)).map_err(|e| e.0)
    }

    /// Starts `cell` and hands back its value, or the failure as text.
    fn start(sandbox: &mut Sandbox, cell: &str) -> String {
        sandbox.with(|engine| match engine.start(cell, Language::JavaScript, 2000.0, 1, "{}").status {
            Status::Completed(json) => codemode_engine::arena::outside(|| json.clone()),
            other => codemode_engine::arena::outside(|| format!("{other:?}")),
        })
    }

    #[test]
    fn a_finished_heap_is_reset_while_idle_and_reused_pristine() {
        let mut pool = HeapPool::new();
        let mut first = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(first, Sandbox::Heap { .. }), "the arena allocator is installed in this binary");
        assert_eq!(start(&mut first, "globalThis.leak = 1; return 1"), "1");
        pool.retire(first);
        assert!(pool.has_idle_work(true));
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(Some(&build)) };
        let mut second = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(second, Sandbox::Heap { .. }));
        assert_eq!(start(&mut second, "return typeof leak"), "\"undefined\"");
        assert_eq!(pool.live, 1, "the finished heap was reused, not a new one built");
    }

    #[test]
    fn a_run_right_after_one_that_ended_reuses_its_heap_reset_not_a_new_one() {
        let mut pool = HeapPool::new();
        let mut first = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start(&mut first, "globalThis.leak = 1; Object.prototype.x = 2; return 1"), "1");
        pool.retire(first);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.reuse_finished() };
        let mut second = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start(&mut second, "return [typeof leak, ({}).x === undefined]"), r#"["undefined",true]"#);
        assert_eq!(pool.live, 1, "the finished heap was reset and reused, not a new one built");
    }

    #[test]
    fn past_its_heaps_the_pool_falls_back_to_plain_engines_that_work() {
        let mut pool = HeapPool::with_max_heaps(1);
        let mut held = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        let mut plain = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(held, Sandbox::Heap { .. }));
        assert!(matches!(plain, Sandbox::Plain(_)));
        assert_eq!(start(&mut plain, "globalThis.leak = 2; return [1, 2].length"), "2");
        assert_eq!(start(&mut held, "return typeof leak"), "\"undefined\"");
        pool.retire(plain);
        pool.retire(held);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(None) };
        assert!(pool.retired.is_empty());
        assert_eq!(pool.ready.len(), 1);
    }

    #[test]
    fn a_new_configuration_discards_ready_heaps_and_heaps_built_before_it() {
        let mut pool = HeapPool::new();
        let mut running = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: nothing was run in the pool's heaps yet.
        unsafe { pool.idle(Some(&build)) };
        assert_eq!(pool.ready.len(), 1);
        pool.configure();
        assert_eq!(start(&mut running, "return 3"), "3");
        pool.retire(running);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(None) };
        assert!(pool.ready.is_empty(), "heaps of the old configuration are not reused");
        assert_eq!(pool.live, 0);
    }
}
