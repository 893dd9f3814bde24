//! Limits of one run and the flags that end it.
//!
//! `Flags` is shared by the allocator, the interrupt handler and the host functions: whichever
//! notices a broken limit first records why, and the interrupt handler then stops the guest
//! with QuickJS's uncatchable `interrupted` error, so no `try/catch` in guest code can keep a
//! doomed run alive.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Instant;

/// Per-run limits, already validated and clamped by the host's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes QuickJS may allocate for this run (heap, strings, bytecode).
    pub memory_bytes: usize,
    /// Native stack QuickJS may use; keep it well below the thread's real stack.
    pub stack_bytes: usize,
    /// UTF-8 bytes of all outputs plus the final value.
    pub max_output_bytes: usize,
    /// Tool calls that may be in flight at once.
    pub max_pending_calls: usize,
    /// Bytes of one value crossing the bridge (a tool input or a tool result).
    pub max_bridge_bytes: usize,
    /// Results `tools.search` returns without an explicit limit.
    pub search_default_limit: usize,
    /// Upper bound on any `tools.search` limit.
    pub max_search_limit: usize,
    /// Bytes of tool calls (id + input), outputs and clock readings one outcome may carry
    /// ([`MAX_REPORT_BYTES`] in the worker): a report must fit in one protocol frame.
    pub max_report_bytes: usize,
}

/// How deeply a value leaving the guest may nest (arrays and objects): serde_json's default
/// recursion limit. Decoders on the host recurse per level; past this a value is refused in
/// the guest (a catchable `RangeError`, or a failed run for the return value), never sent.
pub const MAX_VALUE_DEPTH: usize = 128;

/// What one report may carry in calls, outputs and clock readings: the protocol's 64 MiB
/// frame (`MAX_FRAME_BYTES` in protocol.py, pinned by a test) less 24 MiB for what the
/// report holds besides: the cell's value (at most `maxOutputBytes`, clamped to 10 MiB), its
/// `store` writes (1 Mi characters of JSON, re-escaped: under 8 MiB) and a failure (clipped).
pub const MAX_REPORT_BYTES: usize = 40 << 20;

/// Whether JSON text nests deeper than `limit` arrays/objects. One pass, no recursion: the
/// text comes from `JSON.stringify`, so a quote always opens or closes a string.
pub fn json_nests_deeper_than(json: &str, limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in json.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            stack_bytes: 1 << 20,
            max_output_bytes: 64 << 10,
            max_pending_calls: 16,
            max_bridge_bytes: 16 << 20,
            search_default_limit: 8,
            max_search_limit: 50,
            max_report_bytes: MAX_REPORT_BYTES,
        }
    }
}

/// Why a run was stopped from outside the guest's control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Abort {
    Timeout = 1,
    Memory = 2,
    Output = 3,
    /// Too many output calls (seed 002: 100,000).
    OutputCalls = 4,
    /// The guest called `exit()`: the run completes, nothing else of it runs.
    Exit = 5,
}

impl Abort {
    fn from_u8(v: u8) -> Option<Abort> {
        match v {
            1 => Some(Abort::Timeout),
            2 => Some(Abort::Memory),
            3 => Some(Abort::Output),
            4 => Some(Abort::OutputCalls),
            5 => Some(Abort::Exit),
            _ => None,
        }
    }
}

/// State shared (on one thread, but through `'static` closures) by everything that can end a run.
#[derive(Debug)]
pub struct Flags {
    epoch: Instant,
    /// Nanoseconds after `epoch`; 0 means no deadline.
    deadline_ns: AtomicU64,
    abort: AtomicU8,
    /// Set by the allocator on the first refused allocation.
    pub oom: AtomicBool,
    /// Set when the interrupt handler stops the guest: QuickJS then allocates the uncatchable
    /// error, and the allocator grants it a headroom of its own (see `alloc`).
    pub unwinding: AtomicBool,
    pub memory_limit: AtomicUsize,
    /// Bytes the allocator has handed out and not taken back.
    pub used: AtomicUsize,
    /// Bytes the engine holds outside QuickJS for the guest until the next outcome takes them
    /// (tool calls, outputs, clock readings): they count against the same memory limit.
    pub held: AtomicUsize,
}

impl Flags {
    pub fn new(memory_limit: usize) -> Self {
        Flags {
            epoch: Instant::now(),
            deadline_ns: AtomicU64::new(0),
            abort: AtomicU8::new(0),
            oom: AtomicBool::new(false),
            unwinding: AtomicBool::new(false),
            memory_limit: AtomicUsize::new(memory_limit),
            used: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }
    }

    /// Starts a new wall-clock slice of `ms` milliseconds from now.
    pub fn set_deadline_in(&self, ms: f64) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let slice = if ms.is_finite() && ms > 0.0 { (ms * 1e6) as u64 } else { 0 };
        self.deadline_ns.store(now.saturating_add(slice).max(1), Ordering::Relaxed);
    }

    /// Records the first reason to stop; later reasons do not overwrite it.
    pub fn abort(&self, why: Abort) {
        let _ = self.abort.compare_exchange(0, why as u8, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn aborted(&self) -> Option<Abort> {
        if self.oom.load(Ordering::Relaxed) {
            self.abort(Abort::Memory);
        }
        Abort::from_u8(self.abort.load(Ordering::Relaxed))
    }

    /// The interrupt handler's question: must the guest stop now?
    pub fn should_interrupt(&self) -> bool {
        let deadline = self.deadline_ns.load(Ordering::Relaxed);
        let stop = self.aborted().is_some()
            || (deadline != 0 && self.epoch.elapsed().as_nanos() as u64 >= deadline && {
                self.abort(Abort::Timeout);
                true
            });
        if stop {
            self.unwinding.store(true, Ordering::Relaxed);
        }
        stop
    }
}
