//! A memory-limited allocator for one QuickJS runtime.
//!
//! QuickJS's own `JS_SetMemoryLimit` makes an allocation fail with a *catchable*
//! `InternalError: out of memory`: a guest can swallow it and keep going. This allocator
//! enforces the limit itself and raises a flag the interrupt handler reads, so an
//! out-of-memory ends the run however the guest handles the error.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rquickjs::allocator::{Allocator, RustAllocator};

use crate::limits::Flags;

/// Allocations past the limit are still granted up to this much, once the run is already
/// doomed, so QuickJS can build the error objects that unwind it instead of failing inside.
/// The guest may eat it before the interrupt handler is next polled (every 10,000 ticks: a
/// thousand 1 KB strings), so once the handler has stopped it there is as much again for the
/// uncatchable error: were that allocation refused, QuickJS would throw a catchable
/// `out of memory` in its place, and a guest that swallows errors in a loop would never stop.
const UNWIND_HEADROOM: usize = 1 << 20;

/// Wraps rquickjs' Rust allocator with byte accounting against `Flags::memory_limit`.
pub struct LimitedAllocator {
    inner: RustAllocator,
    flags: Arc<Flags>,
}

impl LimitedAllocator {
    pub fn new(flags: Arc<Flags>) -> Self {
        LimitedAllocator { inner: RustAllocator, flags }
    }

    /// Whether `extra` more bytes fit; past the limit the run is flagged as out of memory.
    fn admit(&mut self, extra: usize) -> bool {
        let limit = self.flags.memory_limit.load(Ordering::Relaxed);
        // What the engine holds for the guest outside QuickJS shares the limit.
        let held = self.flags.held.load(Ordering::Relaxed);
        let wanted = self.flags.used.load(Ordering::Relaxed).saturating_add(held).saturating_add(extra);
        if wanted <= limit {
            return true;
        }
        self.flags.oom.store(true, Ordering::Relaxed);
        let unwinding = self.flags.unwinding.load(Ordering::Relaxed);
        wanted <= limit.saturating_add(if unwinding { 2 * UNWIND_HEADROOM } else { UNWIND_HEADROOM })
    }

    fn track(&mut self, ptr: *mut u8) -> *mut u8 {
        if !ptr.is_null() {
            // SAFETY: `ptr` was just returned by `inner`, the same allocator.
            self.flags.used.fetch_add(unsafe { RustAllocator::usable_size(ptr) }, Ordering::Relaxed);
        }
        ptr
    }
}

// SAFETY: every pointer comes from and goes back to the inner `RustAllocator`; this type only
// refuses requests and counts bytes.
unsafe impl Allocator for LimitedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.admit(size) {
            return std::ptr::null_mut();
        }
        let ptr = self.inner.alloc(size);
        self.track(ptr)
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let Some(total) = count.checked_mul(size) else {
            return std::ptr::null_mut();
        };
        if !self.admit(total) {
            return std::ptr::null_mut();
        }
        let ptr = self.inner.calloc(count, size);
        self.track(ptr)
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        if ptr.is_null() {
            return;
        }
        self.flags.used.fetch_sub(RustAllocator::usable_size(ptr), Ordering::Relaxed);
        self.inner.dealloc(ptr);
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        // The inner allocator reads a header before `ptr`: a null pointer must not reach it.
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        let old = RustAllocator::usable_size(ptr);
        if new_size > old && !self.admit(new_size - old) {
            return std::ptr::null_mut();
        }
        let out = self.inner.realloc(ptr, new_size);
        if !out.is_null() {
            self.flags.used.fetch_sub(old, Ordering::Relaxed);
            self.flags.used.fetch_add(RustAllocator::usable_size(out), Ordering::Relaxed);
        }
        out
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        RustAllocator::usable_size(ptr)
    }
}
