//! Reuse of the engine's heap buffers on the threads that make and drop most of them.
//!
//! A shard allocates a scratch buffer for nearly every step of a cached write (the cache's
//! copy, a row image's window, a parity strip, a destage run) and drops it a few microseconds
//! later on the same thread. Every one is 4 KiB-aligned, and glibc serves aligned blocks from
//! `posix_memalign`, which carves an aligned piece out of a larger free chunk and frees the
//! fragments around it: in a profile of 4 KiB random write-back writes on RAID5, malloc and
//! free were a quarter of the shard threads' time. A thread that opts in ([`enable`]) keeps
//! the blocks it frees, by size class, and hands them out again. The bytes it keeps idle are
//! bounded, in all and per class (an eighth of the whole each): a shard frees more 4 KiB
//! blocks than it allocates (a client's write buffers end there), and without a class bound
//! they filled the whole cache and every other size missed. Threads that did not opt in (a
//! client's, a reply writer's) free as before, so an idle connection pins nothing.
//!
//! Buffers are allocated in size classes ([`allocation_bytes`]): whole pages up to 4, then
//! four classes per doubling (at most a quarter more than asked), as jemalloc's are, so that
//! row images of a few pages more or less share blocks.
//!
//! Written here rather than taken from a general allocator crate: the blocks are the engine's
//! own aligned I/O buffers, whose sizes repeat, and one `Vec` per class is all the bookkeeping
//! that needs. mimalloc as the process's global allocator, tried instead, took RAID5 4 KiB WT
//! writes on memory drives from 210k IOPS to 48k-91k.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ptr::NonNull;

/// The largest block kept (in 4 KiB pages): a RAID5 row image of 64 KiB strips is under it.
const PAGES_MAX: usize = 256;

struct ThreadCache {
    /// Idle blocks by their size in pages (index 0 unused).
    by_pages: Vec<Vec<NonNull<u8>>>,
    idle_bytes: usize,
    idle_bytes_max: usize,
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        for (pages, idle) in self.by_pages.iter_mut().enumerate() {
            for ptr in idle.drain(..) {
                // SAFETY: every idle block was allocated by the global allocator with the layout
                // `layout_of(pages)` and is owned by this cache alone.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout_of(pages)) };
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Option<ThreadCache>> = const { RefCell::new(None) };
}

/// Bytes a heap buffer of `len_bytes` is allocated with: its size class up to the largest
/// block kept, whole pages above.
pub(crate) fn allocation_bytes(len_bytes: usize) -> usize {
    let pages = len_bytes.max(1).div_ceil(crate::BUF_ALIGN_BYTES);
    let class_pages = if pages <= 4 || pages > PAGES_MAX {
        pages
    } else {
        // Four classes between half of the next power of two and it.
        pages.next_multiple_of(pages.next_power_of_two() / 8)
    };
    class_pages * crate::BUF_ALIGN_BYTES
}

fn layout_of(pages: usize) -> Layout {
    Layout::from_size_align(pages * crate::BUF_ALIGN_BYTES, crate::BUF_ALIGN_BYTES).expect("cached block layout")
}

/// The page count `layout` is kept under, if blocks of it are kept at all.
fn pages_of(layout: Layout) -> Option<usize> {
    let pages = layout.size() / crate::BUF_ALIGN_BYTES;
    let exact = layout.align() == crate::BUF_ALIGN_BYTES && layout.size().is_multiple_of(crate::BUF_ALIGN_BYTES);
    (exact && (1..=PAGES_MAX).contains(&pages)).then_some(pages)
}

/// Makes this thread keep up to `idle_bytes_max` bytes of the heap buffers it frees, for its
/// own later allocations. Freed with the thread.
pub fn enable(idle_bytes_max: usize) {
    CACHE.with(|cache| {
        *cache.borrow_mut() = Some(ThreadCache { by_pages: (0..=PAGES_MAX).map(|_| Vec::new()).collect(), idle_bytes: 0, idle_bytes_max });
    });
}

/// Bytes this thread keeps idle now (0 if it did not opt in).
pub fn idle_bytes() -> usize {
    CACHE.try_with(|cache| cache.borrow().as_ref().map_or(0, |c| c.idle_bytes)).unwrap_or(0)
}

/// A block of `layout` this thread freed earlier, if it keeps one. Its bytes are whatever the
/// last user left.
pub(crate) fn take(layout: Layout) -> Option<NonNull<u8>> {
    let pages = pages_of(layout)?;
    CACHE
        .try_with(|cache| {
            let mut cache = cache.borrow_mut();
            let cache = cache.as_mut()?;
            let ptr = cache.by_pages[pages].pop()?;
            cache.idle_bytes -= layout.size();
            Some(ptr)
        })
        .ok()
        .flatten()
}

/// Keeps `ptr` (a block of `layout` from the global allocator that nothing uses any more) for
/// reuse if this thread opted in and its bound has room. Returns whether it was kept; if not,
/// the caller frees it.
pub(crate) fn give_back(ptr: NonNull<u8>, layout: Layout) -> bool {
    let Some(pages) = pages_of(layout) else { return false };
    CACHE
        .try_with(|cache| {
            let mut cache = cache.borrow_mut();
            let Some(cache) = cache.as_mut() else { return false };
            let class_bytes = cache.by_pages[pages].len() * layout.size();
            if class_bytes + layout.size() > cache.idle_bytes_max / 8 || cache.idle_bytes + layout.size() > cache.idle_bytes_max {
                return false;
            }
            cache.idle_bytes += layout.size();
            cache.by_pages[pages].push(ptr);
            true
        })
        // The thread is exiting and its cache is gone.
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;

    /// Runs `f` on a new thread, whose cache starts empty.
    fn on_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().expect("test thread");
    }

    #[test]
    fn a_thread_that_opted_in_reuses_its_freed_blocks_and_hands_them_out_clean() {
        on_thread(|| {
            enable(1 << 20);
            let mut dirty = IoBuf::zeroed(3 * 4096);
            dirty.as_mut_slice().fill(0xee);
            let address = dirty.as_ptr() as usize;
            drop(dirty);
            assert_eq!(idle_bytes(), 3 * 4096, "the freed block is kept");
            let zeroed = IoBuf::zeroed(3 * 4096);
            assert_eq!(zeroed.as_ptr() as usize, address, "the same block comes back");
            assert!(zeroed.as_slice().iter().all(|&b| b == 0), "a reused block is zeroed");
            assert_eq!(idle_bytes(), 0);
            drop(zeroed);
            let parts = IoBuf::from_parts(&[&[7u8; 100]], 3 * 4096);
            assert_eq!(parts.as_ptr() as usize, address);
            assert!(parts.as_slice()[..100].iter().all(|&b| b == 7));
            assert!(parts.as_slice()[100..].iter().all(|&b| b == 0), "zeros after the parts, whatever the block held");
        });
    }

    #[test]
    fn the_idle_bytes_stay_within_the_bounds_in_all_and_per_class() {
        on_thread(|| {
            enable(80 * 4096);
            let bufs: Vec<IoBuf> = (0..8).map(|_| IoBuf::zeroed(4 * 4096)).collect();
            drop(bufs);
            assert_eq!(idle_bytes(), 8 * 4096, "two 4-page blocks fit in a class's eighth of an 80-page bound");
            let small: Vec<IoBuf> = (0..20).map(|_| IoBuf::zeroed(4096)).collect();
            drop(small);
            assert_eq!(idle_bytes(), 18 * 4096, "and ten 1-page blocks");
            drop(IoBuf::zeroed(12 * 4096));
            assert_eq!(idle_bytes(), 18 * 4096, "a block larger than a class's eighth is freed");
            // Many sizes at once: the bound in all holds whatever the mix.
            for round in 0..20 {
                let mix: Vec<IoBuf> = (1..=10).cycle().skip(round).take(40).map(|pages| IoBuf::zeroed(pages * 4096)).collect();
                drop(mix);
                assert!(idle_bytes() <= 80 * 4096, "{} bytes idle", idle_bytes());
            }
        });
    }

    #[test]
    fn sizes_are_rounded_to_classes_at_most_a_quarter_larger() {
        let pages = |len_bytes: usize| allocation_bytes(len_bytes) / 4096;
        assert_eq!([pages(0), pages(1), pages(4096), pages(4097), pages(4 * 4096)], [1, 1, 1, 2, 4]);
        assert_eq!([pages(5 * 4096), pages(9 * 4096), pages(17 * 4096), pages(129 * 4096)], [5, 10, 20, 160]);
        for len_pages in 1..=PAGES_MAX {
            let class = pages(len_pages * 4096);
            assert!(class >= len_pages && class * 4 <= len_pages * 5, "{len_pages} pages in a class of {class}");
        }
        assert_eq!(pages((PAGES_MAX + 3) * 4096), PAGES_MAX + 3, "whole pages above the largest kept block");
    }

    #[test]
    fn a_thread_that_did_not_opt_in_keeps_nothing() {
        on_thread(|| {
            drop(IoBuf::zeroed(4096));
            drop(IoBuf::from_slice(&[1u8; 8192]));
            assert_eq!(idle_bytes(), 0);
        });
        // A buffer made on a thread that keeps blocks and dropped on one that does not is freed
        // there (the allocator takes any thread's blocks).
        let (tx, rx) = std::sync::mpsc::channel();
        on_thread(move || {
            enable(1 << 20);
            tx.send(IoBuf::zeroed(4096)).expect("receiver waits");
        });
        on_thread(move || {
            drop(rx.recv().expect("a buffer"));
            assert_eq!(idle_bytes(), 0);
        });
    }
}
