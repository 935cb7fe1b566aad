//! Gives memory freed by closed sessions and by bursts of watch events back to the operating
//! system.
//!
//! glibc's allocator keeps freed memory inside its arenas and returns only what sits at the top
//! of a heap, so memory that thousands of concurrent sessions used stays resident after they
//! close (reused by the next sessions, never returned). `malloc_trim` releases the free pages
//! of every arena.
//!
//! It walks every arena under its lock, so it runs only when there is something worth
//! returning: after the number of open sessions has fallen to half of a peak of at least
//! [`MIN_PEAK`] since the last trim, at most once per [`TRIM_DELAY`], on a blocking thread.
//! Steady churn of a few sessions at a time never triggers it. Watches (and the pod sync, for
//! each whole pod it reads) call [`decoded`] for each object they read: every [`DECODED_BURST`] objects (pods are decoded as `SlimPod`s, but each
//! event's line and list page are read whole first) schedule one trim the same way, so a leaf
//! that lists or deletes thousands of pods leaves relaylet where it was. Other C libraries
//! (musl) return memory eagerly; there this does nothing.
//!
//! [`heap_in_use`] says how much of the resident memory is live allocations (exported as
//! `relaylet_heap_in_use_bytes`), so a figure per object can be told from pages held free.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How long after the drop the trim runs; sessions ending meanwhile share one trim.
const TRIM_DELAY: Duration = Duration::from_secs(1);
/// Fewer concurrent sessions than this hold too little memory (~20 KiB each) to be worth a trim.
const MIN_PEAK: usize = 100;

/// Objects decoded by watches between two trims that make one worth it.
const DECODED_BURST: usize = 1000;

/// The most sessions open at once since the last trim.
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Objects decoded by watches since the last trim was scheduled.
static DECODED: AtomicUsize = AtomicUsize::new(0);
static TRIM_PENDING: AtomicBool = AtomicBool::new(false);

/// A session opened; `open` sessions are open now (the one count, kept by
/// `shutdown::OpenSessions`).
pub fn opened(open: usize) {
    PEAK.fetch_max(open, Ordering::AcqRel);
}

/// A session closed; `open` are left, and `current` tells how many are open later. Schedules a
/// trim when the open sessions have fallen to half of a large enough peak.
pub fn closed(open: usize, current: impl FnOnce() -> usize + Send + 'static) {
    let peak = PEAK.load(Ordering::Acquire);
    if peak < MIN_PEAK || open > peak / 2 {
        return;
    }
    // Sessions that ended meanwhile share this trim; the peak starts again from there.
    schedule(move || PEAK.store(current(), Ordering::Release));
}

/// A watch decoded one object (and has dropped it, keeping only what it needs). Schedules a
/// trim every [`DECODED_BURST`] objects.
pub fn decoded() {
    if DECODED.fetch_add(1, Ordering::AcqRel) + 1 >= DECODED_BURST {
        DECODED.store(0, Ordering::Release);
        schedule(|| {});
    }
}

/// Trims [`TRIM_DELAY`] from now unless a trim is already pending; `before` runs just before.
fn schedule(before: impl FnOnce() + Send + 'static) {
    if TRIM_PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    // Outside a runtime (the process is shutting down) there is nothing worth trimming.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        TRIM_PENDING.store(false, Ordering::Release);
        return;
    };
    runtime.spawn(async move {
        tokio::time::sleep(TRIM_DELAY).await;
        before();
        TRIM_PENDING.store(false, Ordering::Release);
        let _ = tokio::task::spawn_blocking(trim).await;
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    unsafe extern "C" {
        /// glibc: releases free memory at the top of the main heap and free whole pages in every
        /// arena; `pad` is the slack to keep at the top.
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: malloc_trim takes no pointers and is thread-safe (it locks each arena in turn).
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// Bytes the C library's allocator has handed out and not had back: glibc's `mallinfo2`,
/// `uordblks + hblkhd` (in use in its arenas, and its mmapped chunks). Resident memory less
/// this is what the allocator holds free (pages a trim cannot return while a live allocation
/// sits on them). `None` under another C library.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_in_use() -> Option<u64> {
    /// glibc's `struct mallinfo2` (glibc 2.33 on; Debian 12 has 2.36): ten `size_t`s, of
    /// which two are read.
    #[repr(C)]
    #[allow(dead_code)]
    struct MallInfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }
    unsafe extern "C" {
        fn mallinfo2() -> MallInfo2;
    }
    // SAFETY: mallinfo2 takes nothing and returns a struct by value; it locks each arena in
    // turn while it counts.
    let info = unsafe { mallinfo2() };
    Some((info.uordblks + info.hblkhd) as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_in_use() -> Option<u64> {
    None
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn the_heap_in_use_follows_an_allocation_and_its_release() {
        const BIG: usize = 64 << 20;
        let before = heap_in_use().unwrap();
        let block = vec![1u8; BIG];
        let with = heap_in_use().unwrap();
        // Other tests allocate meanwhile: margins far from their size.
        assert!(
            with >= before + BIG as u64 - (8 << 20),
            "{before} -> {with}"
        );
        drop(std::hint::black_box(block));
        let after = heap_in_use().unwrap();
        assert!(
            after + (BIG as u64) - (8 << 20) <= with,
            "{with} -> {after}"
        );
    }
}
