//! Fixed-address arenas: a fresh engine heap per cell by copying bytes back.
//!
//! Building an engine (runtime, context, prelude) costs ~325 µs and dropping it ~98 µs; back to
//! back, that bounds a worker. Every piece of an engine's state lives on the heap (QuickJS keeps
//! atoms, shapes, classes and jobs in its `JSRuntime`; rquickjs keeps its opaque, allocator and
//! closures in Rust boxes), so if *every* allocation an engine makes lands in one fixed address
//! range, a copy of that range taken right after the prelude is installed is a pristine engine:
//! copying it back (~5 µs warm for ~260 KB) undoes everything a cell did, at the same addresses.
//!
//! ```text
//!   ArenaAllocator (#[global_allocator] of the worker binary)
//!     alloc ──── entered arena? (thread-local) ──yes──> that slot's talc
//!            └──────────────────────────────────no──> System
//!     free/realloc ── address inside the region? ─yes──> the owning slot's talc (by address)
//!                 └──────────────────────────────no──> System
//!
//!   region: one reservation, PROT_NONE, SLOTS x SLOT_BYTES
//!   ┌ slot 0 ───────────────────────────┬ slot 1 ──── ... ┬ slot N ──
//!   │ Header(talc) │ heap ... committed │ (PROT_NONE)     │
//!   └──────────────┴────────────────────┘
//!   Heap<T>: one slot; T built inside it; image = bytes [slot, heap end) after building;
//!            reset = copy the image back (and give back pages a run grew past the image).
//! ```
//!
//! Routing frees by address, not by the entered arena, is what makes it sound to mix: a system
//! pointer freed while an arena is entered goes to the system, an arena pointer freed outside
//! any (a report's strings, dropped by the worker) goes to its arena. Inside a slot the
//! allocator is `talc` over a region that grows by committing pages (`mprotect`) on demand:
//! the reservation itself is `PROT_NONE` and costs no memory, and what is committed counts
//! against RLIMIT_DATA (which is why the worker limits that, not its address space).
//!
//! The contract that keeps a reset sound: between [`Heap::with`] and the next reset nothing
//! allocated in the arena may be kept outside it (the worker drops each report after sending
//! it), and nothing outside may come to hold a pointer into it: process-wide lazy state first
//! built during a cell must be built [`outside`] the arena (the search index's fuzzy table is,
//! and the TypeScript front end runs there; the prelude's bytecode is compiled at build time),
//! or a reset would leave it dangling.
//! Per-runtime state inside the arena is fine: that is what the image restores. An arena is
//! used by one thread (a `Heap` is not `Send`), and a value it gave must not be freed on
//! another thread while that one uses the heap: the worker is single-threaded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use talc::base::binning::Binning;
use talc::base::Talc;
use talc::source::Source;
use talc::DefaultBinning;

/// Bytes of address space per arena: the largest memory limit (1 GiB) twice over, for the
/// unwind headroom, the Rust side and fragmentation.
pub const SLOT_BYTES: usize = 2 << 30;
/// Arenas in the region: `maxRunsPerWorker` at most (4096), each resident run keeping its
/// own, plus spares. 8 TiB of address space that costs nothing until committed.
pub const SLOTS: usize = 4096 + 64;
/// Pages are committed (made writable) in steps of at least this much.
const COMMIT_STEP: usize = 256 << 10;
/// A reset gives back the pages above the image when a run committed more than this past it.
const KEEP_ABOVE_IMAGE: usize = 1 << 20;
const PAGE: usize = 4096;
/// No arena entered.
const NONE: usize = usize::MAX;

/// Base address of the reserved region (0 until the first heap reserves it).
static REGION: AtomicUsize = AtomicUsize::new(0);
/// One bit per slot: taken by a live heap.
static TAKEN: [AtomicU64; SLOTS.div_ceil(64)] = [const { AtomicU64::new(0) }; SLOTS.div_ceil(64)];
/// Bytes from each slot's start that are committed. Outside the image on purpose: a reset
/// restores the allocator's view of its heap, not what the kernel has mapped.
static COMMITTED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

thread_local! {
    /// The slot that this thread's allocations go to, or `NONE`.
    static ENTERED: Cell<usize> = const { Cell::new(NONE) };
}

/// The slot this thread's allocations go to now (`NONE` outside any).
fn entered() -> usize {
    ENTERED.try_with(Cell::get).unwrap_or(NONE)
}

/// The slot that owns `ptr`, if it lies in the region.
fn owner(ptr: *mut u8) -> Option<usize> {
    let base = REGION.load(Ordering::Acquire);
    if base == 0 {
        return None;
    }
    let offset = (ptr as usize).wrapping_sub(base);
    (offset < SLOTS * SLOT_BYTES).then_some(offset / SLOT_BYTES)
}

/// The first byte of `slot` (valid once the region is reserved).
fn slot_base(slot: usize) -> *mut u8 {
    (REGION.load(Ordering::Acquire) + slot * SLOT_BYTES) as *mut u8
}

/// `n` rounded up to a multiple of `to`.
fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// The allocator state at the start of each slot, inside the image.
struct Header {
    talc: Talc<SlotSource, DefaultBinning>,
}

/// Where `slot`'s allocator state lives: its first bytes, so that the image holds it.
fn header(slot: usize) -> *mut Header {
    slot_base(slot).cast()
}

/// Where a slot's heap grows: commits pages past its end on demand.
#[derive(Debug)]
struct SlotSource {
    slot: usize,
    /// The end of the heap talc manages (None before the first claim).
    heap_end: Option<NonNull<u8>>,
}

/// Makes the slot's pages writable up to `bytes` from its start (rounded up to a step).
/// False when the slot or RLIMIT_DATA has no room.
fn commit(slot: usize, bytes: usize) -> bool {
    let committed = COMMITTED[slot].load(Ordering::Relaxed);
    if bytes <= committed {
        return true;
    }
    let target = round_up(bytes.max(committed + COMMIT_STEP), PAGE).min(SLOT_BYTES);
    if target < bytes {
        return false;
    }
    // SAFETY: [committed, target) lies inside this slot of the reserved region, which only
    // this module maps; making it writable cannot touch memory anyone else owns.
    let ok = unsafe {
        libc::mprotect(slot_base(slot).add(committed).cast(), target - committed, libc::PROT_READ | libc::PROT_WRITE)
            == 0
    };
    if ok {
        COMMITTED[slot].store(target, Ordering::Relaxed);
    }
    ok
}

/// Gives back the slot's pages from `from` (page aligned) on: zero pages, no longer writable.
fn decommit(slot: usize, from: usize) {
    let committed = COMMITTED[slot].load(Ordering::Relaxed);
    if committed <= from {
        return;
    }
    // SAFETY: [from, committed) lies inside this slot, and no live allocation is there (the
    // caller has restored an image that ends below `from`, or is releasing the slot).
    unsafe {
        let start = slot_base(slot).add(from).cast();
        libc::madvise(start, committed - from, libc::MADV_DONTNEED);
        if libc::mprotect(start, committed - from, libc::PROT_NONE) != 0 {
            // Still writable: keep counting it as committed.
            return;
        }
    }
    COMMITTED[slot].store(from, Ordering::Relaxed);
}

// SAFETY: `acquire` only claims or extends into this slot's own pages, which it has just made
// writable, and never allocates (it runs inside the global allocator).
unsafe impl Source for SlotSource {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, layout: Layout) -> Result<(), ()> {
        let slot = talc.source.slot;
        let base = slot_base(slot) as usize;
        // Room for the chunk's tags and alignment, and for talc's metadata on the first claim.
        let need = layout.size().saturating_add(layout.align()).saturating_add(talc::min_first_heap_size::<B>());
        match talc.source.heap_end {
            None => {
                let start = base + std::mem::size_of::<Header>();
                let end = (start - base).checked_add(need).ok_or(())?;
                if !commit(slot, end) {
                    return Err(());
                }
                let size = COMMITTED[slot].load(Ordering::Relaxed) - (start - base);
                // SAFETY: [start, start + size) is committed, inside this slot, and used by
                // nothing but this talc.
                let heap_end = unsafe { talc.claim(start as *mut u8, size) }.ok_or(())?;
                talc.source.heap_end = Some(heap_end);
            }
            Some(heap_end) => {
                let end = (heap_end.as_ptr() as usize - base).checked_add(need).ok_or(())?;
                if !commit(slot, end) {
                    return Err(());
                }
                let new_end = (base + COMMITTED[slot].load(Ordering::Relaxed)) as *mut u8;
                // SAFETY: `heap_end` is this talc's current heap end and [heap_end, new_end)
                // is committed slot memory no one else uses.
                let extended = unsafe { talc.extend(heap_end, new_end) };
                if extended == heap_end {
                    return Err(());
                }
                talc.source.heap_end = Some(extended);
            }
        }
        Ok(())
    }
}

/// An allocation from `slot`'s talc; null when the slot (or RLIMIT_DATA) has no room.
///
/// # Safety
/// `slot` is a live slot whose header is initialised, used by one thread at a time.
unsafe fn arena_alloc(slot: usize, layout: Layout) -> *mut u8 {
    // SAFETY: per the contract; `layout` is non-zero per `GlobalAlloc`'s.
    unsafe { (*header(slot)).talc.allocate(layout).map_or(ptr::null_mut(), NonNull::as_ptr) }
}

/// The worker binary's global allocator: the entered arena's, or the system's (see the module
/// doc). Install it with `#[global_allocator] static A: ArenaAllocator = ArenaAllocator;`.
pub struct ArenaAllocator;

// SAFETY: every pointer is freed by the allocator that gave it (decided by its address, which
// the region makes unambiguous); arena slots are used by the one thread that holds their heap.
unsafe impl GlobalAlloc for ArenaAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match entered() {
            // SAFETY: an entered slot belongs to a live heap of this thread.
            NONE => unsafe { System.alloc(layout) },
            slot => unsafe { arena_alloc(slot, layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match entered() {
            // SAFETY: as in `alloc`; the zeroed bytes are the ones just allocated.
            NONE => unsafe { System.alloc_zeroed(layout) },
            slot => unsafe {
                let ptr = arena_alloc(slot, layout);
                if !ptr.is_null() {
                    ptr::write_bytes(ptr, 0, layout.size());
                }
                ptr
            },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match owner(ptr) {
            // SAFETY: `ptr` lies in `slot`, so that slot's talc gave it with `layout`.
            Some(slot) => unsafe { (*header(slot)).talc.deallocate(ptr, layout) },
            // SAFETY: not in the region, so the system allocator gave it.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(slot) = owner(ptr) else {
            // SAFETY: not in the region, so the system allocator gave it.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        // A block stays in the arena that owns it, whatever is entered.
        // SAFETY: `ptr` was given by this slot's talc with `layout`; `new_size` is non-zero.
        unsafe {
            let talc = &mut (*header(slot)).talc;
            if talc.try_realloc_in_place(ptr, layout, new_size) {
                return ptr;
            }
            let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                return ptr::null_mut();
            };
            let Some(new) = talc.allocate(new_layout) else {
                return ptr::null_mut();
            };
            ptr::copy_nonoverlapping(ptr, new.as_ptr(), layout.size().min(new_size));
            talc.deallocate(ptr, layout);
            new.as_ptr()
        }
    }
}

/// Restores the previously entered arena when dropped (also when a panic unwinds).
struct Entered {
    previous: usize,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = ENTERED.try_with(|e| e.set(self.previous));
    }
}

/// Routes this thread's allocations to `slot` (or to the system, for `NONE`) until the guard drops.
fn enter(slot: usize) -> Entered {
    Entered { previous: ENTERED.try_with(|e| e.replace(slot)).unwrap_or(NONE) }
}

/// Runs `f` with no arena entered: what it allocates is the system's, and survives resets.
/// For process-wide state that a cell may be the first to build (a `OnceLock`), and for work
/// whose memory need not be an engine's. A no-op where the arena allocator is not installed.
pub fn outside<R>(f: impl FnOnce() -> R) -> R {
    let _outside = enter(NONE);
    f()
}

/// Why a heap could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeapError {
    /// The process's global allocator is not [`ArenaAllocator`].
    NotInstalled,
    /// The region could not be reserved, or its first pages committed.
    Reserve(String),
    /// Every slot is held by a live heap.
    Exhausted,
    /// Building the value failed (its error, as text).
    Build(String),
}

impl std::fmt::Display for HeapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeapError::NotInstalled => f.write_str("the arena allocator is not the global allocator"),
            HeapError::Reserve(why) => write!(f, "arena region unavailable: {why}"),
            HeapError::Exhausted => write!(f, "all {SLOTS} arenas are in use"),
            HeapError::Build(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for HeapError {}

/// Reserves the region once per process (racing threads: one reservation wins).
fn reserve() -> Result<(), HeapError> {
    if REGION.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address of the kernel's choosing.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            SLOTS * SLOT_BYTES,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(HeapError::Reserve(std::io::Error::last_os_error().to_string()));
    }
    if REGION.compare_exchange(0, base as usize, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // SAFETY: `base` is the mapping made above, which nobody else knows of.
        unsafe { libc::munmap(base, SLOTS * SLOT_BYTES) };
    }
    Ok(())
}

/// Claims a free slot (lowest first), or None when all are taken.
fn take_slot() -> Option<usize> {
    for (word, bits) in TAKEN.iter().enumerate() {
        let mut current = bits.load(Ordering::Relaxed);
        while current != u64::MAX {
            let bit = (!current).trailing_zeros() as usize;
            let slot = word * 64 + bit;
            if slot >= SLOTS {
                return None;
            }
            match bits.compare_exchange(current, current | (1 << bit), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(slot),
                Err(now) => current = now,
            }
        }
    }
    None
}

/// Gives the slot's memory back and frees it for another heap.
fn release_slot(slot: usize) {
    decommit(slot, 0);
    TAKEN[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::AcqRel);
}

/// One value (an engine) built inside its own arena, with an image of the arena as it was when
/// built: [`reset`](Heap::reset) makes the value exactly that again. Not `Send`: the arena's
/// allocator is used by this thread only.
pub struct Heap<T> {
    slot: usize,
    value: NonNull<T>,
    /// The arena's bytes after building, from its start to the end of talc's heap.
    image: Vec<u8>,
    _not_send: PhantomData<*mut T>,
}

impl<T> Heap<T> {
    /// Builds `T` inside a fresh arena (every allocation `build` makes lands there), then takes
    /// the image. Anything lazy and process-wide that `build` first touches must be built
    /// [`outside`] the arena (see the module doc).
    pub fn new<E: std::fmt::Display>(build: impl FnOnce() -> Result<T, E>) -> Result<Heap<T>, HeapError> {
        reserve()?;
        let slot = take_slot().ok_or(HeapError::Exhausted)?;
        match Self::build_in(slot, build) {
            Ok(heap) => Ok(heap),
            Err(e) => {
                release_slot(slot);
                Err(e)
            }
        }
    }

    fn build_in<E: std::fmt::Display>(slot: usize, build: impl FnOnce() -> Result<T, E>) -> Result<Heap<T>, HeapError> {
        if !commit(slot, COMMIT_STEP) {
            return Err(HeapError::Reserve(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: the slot's first pages are committed and belong to no one else yet.
        unsafe { header(slot).write(Header { talc: Talc::new(SlotSource { slot, heap_end: None }) }) };
        let value = {
            let _inside = enter(slot);
            let probe = Box::new(0u8);
            if owner(&*probe as *const u8 as *mut u8) != Some(slot) {
                return Err(HeapError::NotInstalled);
            }
            drop(probe);
            match build() {
                Ok(value) => NonNull::from(Box::leak(Box::new(value))),
                Err(e) => {
                    let message = outside(|| e.to_string());
                    drop(e);
                    return Err(HeapError::Build(message));
                }
            }
        };
        // SAFETY: the header was written above; shrinking the heap to its last allocation
        // keeps the image small and touches only free space.
        let image_len = unsafe {
            let talc = &mut (*header(slot)).talc;
            if let Some(end) = talc.source.heap_end {
                talc.source.heap_end = talc.truncate(end, ptr::null_mut());
            }
            talc.source
                .heap_end
                .map_or(std::mem::size_of::<Header>(), |end| end.as_ptr() as usize - slot_base(slot) as usize)
        };
        // SAFETY: [slot start, image_len) is committed arena memory, read while no one writes it.
        let image = outside(|| unsafe { std::slice::from_raw_parts(slot_base(slot), image_len) }.to_vec());
        Ok(Heap { slot, value, image, _not_send: PhantomData })
    }

    /// Runs `f` on the value with this arena entered: what it allocates lands here.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        let _inside = enter(self.slot);
        // SAFETY: `value` was built in this arena and lives as long as the heap; `&mut self`
        // makes this the only reference.
        f(unsafe { self.value.as_mut() })
    }

    /// Makes the value and its arena exactly what they were when built, and gives back the
    /// pages a run grew past the image when they are many.
    ///
    /// # Safety
    /// Nothing allocated in this arena since it was built (or last reset) may be alive outside
    /// it: every value [`with`](Heap::with) returned has been dropped, and no outside structure
    /// holds a pointer into the arena.
    pub unsafe fn reset(&mut self) {
        // SAFETY: the image is this slot's own bytes at these addresses, and its range is
        // still committed (commits only grow between resets); by the contract nothing live
        // outside refers to what the copy overwrites.
        unsafe { ptr::copy_nonoverlapping(self.image.as_ptr(), slot_base(self.slot), self.image.len()) };
        let image_pages = round_up(self.image.len(), PAGE);
        if COMMITTED[self.slot].load(Ordering::Relaxed) > image_pages + KEEP_ABOVE_IMAGE {
            decommit(self.slot, image_pages);
        }
    }

    /// Resets the heap, drops the value (so what it holds outside the arena is released, e.g.
    /// a shared catalog's count), and frees the arena for another heap.
    ///
    /// # Safety
    /// As for [`reset`](Heap::reset).
    pub unsafe fn discard(mut self) {
        // SAFETY: the caller's contract is reset's; after it the value is pristine and whole.
        unsafe {
            self.reset();
            let _inside = enter(self.slot);
            drop(Box::from_raw(self.value.as_ptr()));
        }
        release_slot(self.slot);
    }

    /// Bytes of the image a reset copies back.
    pub fn image_bytes(&self) -> usize {
        self.image.len()
    }

    /// Bytes of the arena that are committed now (writable, counted by RLIMIT_DATA).
    pub fn committed_bytes(&self) -> usize {
        COMMITTED[self.slot].load(Ordering::Relaxed)
    }

    /// Whether `ptr` points into this heap's arena.
    pub fn owns(&self, ptr: *const u8) -> bool {
        owner(ptr as *mut u8) == Some(self.slot)
    }
}

impl<T> Drop for Heap<T> {
    /// A heap dropped without [`discard`](Heap::discard) (a panic unwinding, say) keeps its
    /// slot: freeing it could leave values outside pointing into a reused arena.
    fn drop(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This crate's test binary keeps the system allocator: a heap there would not hold its
    /// value's allocations, so it is refused (the pyext case).
    #[test]
    fn a_heap_is_refused_where_the_arena_allocator_is_not_installed() {
        let heap = Heap::new(|| Ok::<_, HeapError>(vec![1u8; 64]));
        assert!(matches!(heap, Err(HeapError::NotInstalled)), "{:?}", heap.err());
    }

    #[test]
    fn pointers_outside_the_region_have_no_owner() {
        let _ = reserve();
        let boxed = Box::new(7u64);
        assert_eq!(owner(&*boxed as *const u64 as *mut u8), None);
        let base = REGION.load(Ordering::Acquire) as *mut u8;
        assert_eq!(owner(base.wrapping_add(SLOT_BYTES + 8)), Some(1));
        assert_eq!(owner(base.wrapping_add(SLOTS * SLOT_BYTES)), None);
        assert_eq!(owner(base.wrapping_sub(1)), None);
    }
}
