//! The test binary's allocator: the system's, with two tallies per thread, so a test measures
//! what the code it runs on its own thread allocates whatever other tests do at the same time.
//! `asked` counts every byte asked for (allocations and the new size of reallocations);
//! `held` counts bytes asked for minus bytes given back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ASKED: Cell<usize> = const { Cell::new(0) };
    static HELD: Cell<isize> = const { Cell::new(0) };
}

fn tally(asked: usize, held: isize) {
    let _ = ASKED.try_with(|a| a.set(a.get() + asked));
    let _ = HELD.try_with(|h| h.set(h.get() + held));
}

// SAFETY: forwards to the system allocator; the tallies are const-initialised thread locals,
// which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tally(layout.size(), layout.size() as isize);
        // SAFETY: the caller's layout is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        tally(0, -(layout.size() as isize));
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tally(new_size, new_size as isize - layout.size() as isize);
        // SAFETY: as for `realloc` itself.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes this thread has asked the allocator for so far.
pub fn asked() -> usize {
    ASKED.with(Cell::get)
}

/// Bytes this thread holds: asked for minus given back (by this thread) so far.
pub fn held() -> isize {
    HELD.with(Cell::get)
}
