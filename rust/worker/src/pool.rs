//! Where each run's engine comes from, and where it goes when the run ends.
//!
//! ```text
//!   take ──> ready heap (pristine)  ──or──> a new Heap (built in a fresh arena, ~0.4 ms)
//!                                   ──or──> a plain Engine on the system heap (no arena left)
//!   run ends ──> retire ──> finished ──idle──> reset (copy the image back) ──> ready
//!                                    └──a run starts first, none ready: reuse_finished (reset) ──> ready
//!                                    └──idle──> discard (configuration changed, no room ready)
//!   ready ──no frame for a while (main.rs)──> shed: all but MIN_READY discarded
//! ```
//!
//! A heap (`codemode_engine::arena::Heap`) holds one engine in its own fixed-address arena;
//! resetting it copies back the image taken after the prelude was installed, so every cell
//! still starts on a fresh heap, and back to back a cell costs a copy (~5-30 µs) instead of an
//! engine build and drop (~0.4 ms). After a burst of runs parked at once (a host's many
//! conversations, each awaiting its tools), their heaps are kept ready, reset, within a memory
//! budget: the next burst costs a copy a run, not a build (256 cells awaiting two tools, 2
//! workers: ~0.3 s of worker CPU a batch -> ~0.1 s), and a worker quiet for a while gives them
//! back. Parked and suspended runs keep their heaps; a finished run's heap is reset only in idle
//! work (a few heaps a turn), never while a report of it may still be alive (the arena's
//! contract). Any end — completed, failed, out of memory, interrupted, a stack overflow
//! — is followed by a reset before reuse: a heap is never handed out dirty. When arenas are
//! unavailable (the region could not be reserved) or all in use, runs get a plain engine, built
//! the old way.

use codemode_engine::arena::{Heap, HeapError, SLOTS};
use codemode_engine::Engine;

/// Pristine heaps kept ready however quiet the worker is.
const MIN_READY: usize = 4;
/// Bytes the ready heaps may hold together (each its committed pages and its image, both
/// counted by RLIMIT_DATA; the first `MIN_READY` are kept whatever they hold), and at most this
/// share of the worker's memory cap: the host's cap leaves 2 GiB past its runs' QuickJS heaps
/// for all such (workers.py, `WORKER_MEMORY_SLACK`). A heap holds ~0.5-1.5 MB.
const READY_BYTES: usize = 256 << 20;
const READY_SHARE_OF_CAP: usize = 8;
/// Heaps reset or discarded in one turn of idle work (`idle`, `shed`) at most: a frame that
/// comes meanwhile waits for one turn (a reset ~35 µs, a discard ~0.2 ms), not for all of a
/// burst's (128 discarded ~30 ms).
const IDLE_STEP: usize = 16;

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
    /// What the ready heaps may hold together (`READY_BYTES`).
    ready_budget: usize,
    /// Heaps of ended runs (and of an old configuration), reset or discarded in idle work.
    finished: Vec<(Heap<Engine>, u64)>,
    /// Plain engines of ended runs, dropped in idle work.
    retired: Vec<Engine>,
    /// Heaps alive now (ready, running, resident or finished), at most `max_heaps`.
    live: usize,
    max_heaps: usize,
    /// False once arenas proved unavailable in this process: plain engines from then on.
    heaps: bool,
    /// Memory was freed since the worker last gave the system allocator's free pages back.
    untrimmed: bool,
}

impl HeapPool {
    /// A pool for a worker whose memory cap (RLIMIT_DATA) is `memory_cap` bytes.
    pub fn new(memory_cap: usize) -> HeapPool {
        HeapPool::with_limits(SLOTS, READY_BYTES.min(memory_cap / READY_SHARE_OF_CAP))
    }

    /// A pool that holds at most `max_heaps` heaps at once (runs past that get plain engines),
    /// its ready ones at most `ready_budget` bytes (but `MIN_READY` of them whatever they hold).
    pub fn with_limits(max_heaps: usize, ready_budget: usize) -> HeapPool {
        HeapPool {
            generation: 0,
            ready: Vec::new(),
            ready_budget,
            finished: Vec::new(),
            retired: Vec::new(),
            live: 0,
            max_heaps,
            heaps: true,
            untrimmed: false,
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

    /// What the ready heaps hold together (`held`: a few hundred at most, summed when asked).
    fn ready_bytes(&self) -> usize {
        self.ready.iter().map(held).sum()
    }

    /// Whether a reset `heap` has room among the ready ones.
    fn room_for(&self, heap: &Heap<Engine>) -> bool {
        self.ready.len() < MIN_READY || self.ready_bytes() + held(heap) <= self.ready_budget
    }

    /// Whether a quiet worker has memory to give back (`shed`): more heaps than `MIN_READY`
    /// ready, or heaps and engines freed since it last did.
    pub fn can_shed(&self) -> bool {
        self.untrimmed || self.ready.len() > MIN_READY
    }

    /// The worker has been quiet a while: its ready heaps past `MIN_READY` are discarded
    /// (`IDLE_STEP` a turn), then the system allocator gives the pages it holds free back (the
    /// heaps' images, engines on the system heap: after a burst of a thousand runs, ~150 MB a
    /// worker kept for good).
    pub fn shed(&mut self) {
        for _ in 0..IDLE_STEP {
            if self.ready.len() <= MIN_READY {
                break;
            }
            let Some(heap) = self.ready.pop() else { break };
            // SAFETY: a ready heap is pristine (reset, and used by no run since): nothing
            // allocated in its arena is alive outside it.
            unsafe { heap.discard() };
            self.live -= 1;
        }
        if self.ready.len() <= MIN_READY {
            // SAFETY: no arguments that point anywhere; glibc's allocator is the system one here.
            unsafe { libc::malloc_trim(0) };
            self.untrimmed = false;
        }
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

    /// A turn of work between frames: free plain engines, reset finished heaps into the ready
    /// set while it has room (`room_for`; else discard them), `IDLE_STEP` at most, and build
    /// one ready heap when none is left. Whether finished heaps are left for another turn.
    ///
    /// # Safety
    /// No value allocated in a finished heap's arena is alive outside it: the reports of the
    /// runs that ended were sent and dropped.
    pub unsafe fn idle(&mut self, build: Option<&dyn Fn() -> Result<Engine, String>>) -> bool {
        self.untrimmed |= !self.retired.is_empty();
        self.retired.clear();
        for _ in 0..IDLE_STEP {
            let Some((mut heap, generation)) = self.finished.pop() else { break };
            if generation == self.generation {
                // SAFETY: the caller's contract.
                unsafe { heap.reset() };
                if self.room_for(&heap) {
                    self.ready.push(heap);
                    continue;
                }
            }
            // SAFETY: the caller's contract.
            unsafe { heap.discard() };
            self.live -= 1;
            self.untrimmed = true;
        }
        if let (Some(build), true) = (build, self.ready.is_empty()) {
            if let Some(heap) = self.new_heap(build) {
                self.ready.push(heap);
            }
        }
        !self.finished.is_empty()
    }
}

/// The memory a ready heap holds: its arena's committed pages and its image.
fn held(heap: &Heap<Engine>) -> usize {
    heap.committed_bytes() + heap.image_bytes()
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
        let mut pool = HeapPool::new(4 << 30);
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
        let mut pool = HeapPool::new(4 << 30);
        let mut first = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start(&mut first, "globalThis.leak = 1; Object.prototype.x = 2; return 1"), "1");
        pool.retire(first);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.reuse_finished() };
        let mut second = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start(&mut second, "return [typeof leak, ({}).x === undefined]"), r#"["undefined",true]"#);
        assert_eq!(pool.live, 1, "the finished heap was reset and reused, not a new one built");
    }

    /// Takes `n` engines, runs a cell that leaves state behind in each, and retires them all.
    fn burst(pool: &mut HeapPool, n: usize) {
        let mut taken = Vec::new();
        for i in 0..n {
            let mut sandbox = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
            assert!(matches!(sandbox, Sandbox::Heap { .. }));
            let cell = format!("globalThis.leak = {i}; Array.prototype.extra = 1; return {i}");
            assert_eq!(start(&mut sandbox, &cell), i.to_string());
            taken.push(sandbox);
        }
        for sandbox in taken {
            pool.retire(sandbox);
        }
    }

    #[test]
    fn the_heaps_of_a_burst_are_kept_ready_and_the_next_burst_builds_none() {
        let mut pool = HeapPool::new(4 << 30);
        burst(&mut pool, 3 * MIN_READY);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(Some(&build)) };
        assert_eq!((pool.ready.len(), pool.live), (3 * MIN_READY, 3 * MIN_READY));
        let mut again = Vec::new();
        for _ in 0..3 * MIN_READY {
            let mut sandbox = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(start(&mut sandbox, "return [typeof leak, [].extra === undefined]"), r#"["undefined",true]"#);
            again.push(sandbox);
        }
        assert_eq!(pool.live, 3 * MIN_READY, "each run got a reset heap, none was built");
        assert_eq!(pool.ready.len(), 0);
    }

    #[test]
    fn ready_heaps_past_the_few_always_kept_stay_within_their_memory_budget() {
        let mut pool = HeapPool::with_limits(SLOTS, 0);
        burst(&mut pool, MIN_READY + 3);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(Some(&build)) };
        assert_eq!((pool.ready.len(), pool.live), (MIN_READY, MIN_READY), "the rest were discarded");

        let mut roomy = HeapPool::with_limits(SLOTS, 0);
        burst(&mut roomy, 1);
        // SAFETY: as above.
        unsafe { roomy.idle(None) };
        let one = roomy.ready_bytes();
        let mut pool = HeapPool::with_limits(SLOTS, (MIN_READY + 2) * one + one / 2);
        burst(&mut pool, MIN_READY + 5);
        // SAFETY: as above.
        unsafe { pool.idle(None) };
        assert!((MIN_READY + 1..=MIN_READY + 3).contains(&pool.ready.len()), "{} ready", pool.ready.len());
        assert!(pool.ready_bytes() <= (MIN_READY + 2) * one + one / 2);
        assert_eq!(pool.live, pool.ready.len(), "the rest were discarded");
    }

    #[test]
    fn a_quiet_pool_sheds_its_surplus_ready_heaps_and_keeps_the_few() {
        let mut pool = HeapPool::new(4 << 30);
        assert!(!pool.can_shed());
        burst(&mut pool, MIN_READY + 6);
        // SAFETY: `start` copied each value outside the arena.
        unsafe { pool.idle(None) };
        assert!(pool.can_shed());
        pool.shed();
        assert_eq!((pool.ready.len(), pool.live), (MIN_READY, MIN_READY));
        assert!(!pool.can_shed(), "nothing more to give back");
        let mut sandbox = pool.take(&build).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(start(&mut sandbox, "return typeof leak"), "\"undefined\"");
    }

    #[test]
    fn idle_work_and_shedding_go_a_few_heaps_a_turn() {
        let mut pool = HeapPool::new(4 << 30);
        burst(&mut pool, 2 * IDLE_STEP + 3);
        let mut turns = 0;
        // SAFETY: `start` copied each value outside the arena.
        while unsafe { pool.idle(None) } {
            turns += 1;
            assert_eq!(pool.ready.len(), turns * IDLE_STEP);
        }
        assert_eq!((turns, pool.ready.len(), pool.finished.len()), (2, 2 * IDLE_STEP + 3, 0));
        let mut sheds = 0;
        while pool.can_shed() {
            pool.shed();
            sheds += 1;
        }
        assert_eq!((sheds, pool.ready.len(), pool.live), (2, MIN_READY, MIN_READY));
        assert!(!pool.untrimmed);
    }

    #[test]
    fn past_its_heaps_the_pool_falls_back_to_plain_engines_that_work() {
        let mut pool = HeapPool::with_limits(1, READY_BYTES);
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
        let mut pool = HeapPool::new(4 << 30);
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
