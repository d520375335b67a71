//! Aligned I/O buffers that can be split into disjoint pieces and joined again.
//!
//! A RAID write of 1 MiB becomes sixteen 64 KiB member writes; copying the data into sixteen new
//! buffers would halve memory throughput. [`IoBuf::split_off`] instead hands out disjoint views of
//! one allocation, each owned by one in-flight operation, and [`IoBuf::unsplit`] puts them back
//! together when they return. The allocation is freed when the last view is dropped, so a buffer
//! handed to the kernel stays valid until its completion returns the view.

use crate::heap_cache;
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of every allocation: enough for O_DIRECT on any device we meet (4 KiB sectors).
pub const BUF_ALIGN_BYTES: usize = 4096;

/// Pooled buffers at least this large are mapped from the kernel and unmapped when freed, not
/// taken from malloc: glibc raises its mmap threshold after freeing a large block and then
/// serves later large buffers from heaps that small live allocations pin, so after a burst of
/// 1 MiB requests RSS stayed at its peak. 128 KiB is glibc's own initial threshold.
/// `IoBuf::zeroed` stays on malloc: the engine's scratch buffers are short-lived, and malloc's
/// reuse saves them the page faults of a fresh mapping.
pub const MAP_MIN_BYTES: usize = 128 << 10;

/// Where an allocation's memory came from, so that it goes back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Memory {
    Heap,
    Mapped,
}

impl Memory {
    fn for_pool(size_bytes: usize) -> Memory {
        if size_bytes >= MAP_MIN_BYTES {
            Memory::Mapped
        } else {
            Memory::Heap
        }
    }
}

struct Allocation {
    ptr: NonNull<u8>,
    layout: Layout,
    memory: Memory,
    /// Where the memory goes back to when the last view is dropped; freed if `None`.
    pool: Option<Arc<PoolShared>>,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if pool.give_back(self.ptr, self.layout) {
                return;
            }
        }
        // SAFETY: ptr came from allocate_zeroed with this exact layout and memory, and is freed
        // once, when the last IoBuf view (the last Arc) goes away and no pool took it back.
        unsafe { free(self.ptr, self.layout, self.memory) }
    }
}

/// A pool of I/O buffers by power-of-two size class, so that a frontend serving 1 MiB requests
/// does not map, fault in, zero and unmap a megabyte per request. Buffers come back when the
/// last view of them is dropped, from any thread. The bytes kept idle are bounded over all
/// classes together, so after a burst the memory beyond that bound goes back to the kernel.
#[derive(Clone)]
pub struct BufPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    /// Free allocations per class; class `c` holds `BUF_ALIGN_BYTES << c` bytes.
    classes: Vec<std::sync::Mutex<Vec<NonNull<u8>>>>,
    /// Bytes idle in all classes; reserved before a buffer is pushed, released after one is
    /// popped, so it never exceeds `idle_bytes_max`.
    idle_bytes: AtomicUsize,
    idle_bytes_max: usize,
}

// SAFETY: the pointers are exclusively owned idle allocations, moved between threads whole.
unsafe impl Send for PoolShared {}
unsafe impl Sync for PoolShared {}

/// The largest pooled buffer; larger ones are allocated and freed each time.
const POOL_CLASS_BYTES_MAX: usize = 32 << 20;

impl BufPool {
    /// A pool that keeps at most `idle_bytes_max` idle, over all size classes together.
    pub fn new(idle_bytes_max: usize) -> BufPool {
        let class_count = (POOL_CLASS_BYTES_MAX / BUF_ALIGN_BYTES).trailing_zeros() as usize + 1;
        let classes = (0..class_count).map(|_| std::sync::Mutex::new(Vec::new())).collect();
        BufPool { shared: Arc::new(PoolShared { classes, idle_bytes: AtomicUsize::new(0), idle_bytes_max }) }
    }

    /// Bytes of buffers the pool holds for reuse now.
    pub fn idle_bytes(&self) -> usize {
        self.shared.idle_bytes.load(Ordering::SeqCst)
    }

    /// A buffer of `len_bytes` whose contents are whatever its last user left (not zeroed).
    pub fn take(&self, len_bytes: usize) -> IoBuf {
        let size = len_bytes.max(1).next_multiple_of(BUF_ALIGN_BYTES).next_power_of_two();
        if size > POOL_CLASS_BYTES_MAX {
            return IoBuf::zeroed(len_bytes);
        }
        let class = (size / BUF_ALIGN_BYTES).trailing_zeros() as usize;
        let layout = Layout::from_size_align(size, BUF_ALIGN_BYTES).expect("pool class layout");
        let reused = self.shared.classes[class].lock().expect("pool lock").pop();
        if reused.is_some() {
            self.shared.idle_bytes.fetch_sub(size, Ordering::SeqCst);
        }
        let memory = Memory::for_pool(size);
        let ptr = reused.unwrap_or_else(|| allocate_zeroed(layout, memory));
        let allocation = Allocation { ptr, layout, memory, pool: Some(Arc::clone(&self.shared)) };
        IoBuf { allocation: Arc::new(allocation), start_bytes: 0, len_bytes }
    }
}

impl PoolShared {
    /// Keeps an allocation for reuse if the idle bound has room. Returns whether it was kept.
    fn give_back(&self, ptr: NonNull<u8>, layout: Layout) -> bool {
        let size = layout.size();
        if !size.is_power_of_two() || size > POOL_CLASS_BYTES_MAX {
            return false;
        }
        let max = self.idle_bytes_max;
        let reserved = self.idle_bytes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |idle| (idle + size <= max).then_some(idle + size));
        if reserved.is_err() {
            return false;
        }
        let class = (size / BUF_ALIGN_BYTES).trailing_zeros() as usize;
        self.classes[class].lock().expect("pool lock").push(ptr);
        true
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        for (class, idle) in self.classes.iter_mut().enumerate() {
            let layout = Layout::from_size_align(BUF_ALIGN_BYTES << class, BUF_ALIGN_BYTES).expect("pool class layout");
            for ptr in idle.get_mut().expect("pool lock").drain(..) {
                // SAFETY: every idle pointer came from allocate_zeroed with its class's layout
                // and Memory::for_pool of its size, and is owned by the pool alone.
                unsafe { free(ptr, layout, Memory::for_pool(layout.size())) }
            }
        }
    }
}

/// Heap memory for `layout` whose bytes are undefined: a block this thread freed earlier
/// (`heap_cache`), or a new one from malloc.
fn allocate_uninit(layout: Layout) -> NonNull<u8> {
    assert!(layout.size() > 0 && layout.align() <= BUF_ALIGN_BYTES);
    if let Some(ptr) = heap_cache::take(layout) {
        return ptr;
    }
    // SAFETY: layout has non-zero size.
    let raw = unsafe { alloc::alloc(layout) };
    NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

/// Zeroed memory for `layout`, from malloc (or this thread's freed blocks) or a new mapping.
fn allocate_zeroed(layout: Layout, memory: Memory) -> NonNull<u8> {
    assert!(layout.size() > 0 && layout.align() <= BUF_ALIGN_BYTES);
    if memory == Memory::Heap {
        if let Some(ptr) = heap_cache::take(layout) {
            // SAFETY: the block holds layout.size() bytes that nothing else uses.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, layout.size()) };
            return ptr;
        }
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        return NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
    }
    let protection = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; its pages are zero and page-aligned (pages are at least 4 KiB).
    let raw = unsafe { libc::mmap(std::ptr::null_mut(), layout.size(), protection, flags, -1, 0) };
    if raw == libc::MAP_FAILED {
        alloc::handle_alloc_error(layout);
    }
    assert_eq!(raw as usize % BUF_ALIGN_BYTES, 0, "mmap returned an address that is not 4 KiB-aligned");
    NonNull::new(raw.cast()).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

/// Frees what `allocate_zeroed` returned.
///
/// # Safety
/// `ptr` must come from `allocate_zeroed(layout, memory)` with these arguments, and be freed
/// only once.
unsafe fn free(ptr: NonNull<u8>, layout: Layout, memory: Memory) {
    if memory == Memory::Heap {
        if heap_cache::give_back(ptr, layout) {
            return;
        }
        // SAFETY: by the contract, ptr was malloc'd with this layout and is freed once.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
        return;
    }
    // SAFETY: by the contract, ptr is the start of a mapping of exactly layout.size() bytes
    // that nothing uses any more.
    let unmapped = unsafe { libc::munmap(ptr.as_ptr().cast(), layout.size()) };
    assert_eq!(unmapped, 0, "munmap of a {}-byte buffer failed: {}", layout.size(), std::io::Error::last_os_error());
}

// SAFETY: the allocation is plain memory; access is coordinated by IoBuf, whose views are
// disjoint, so sharing the owner between threads is sound.
unsafe impl Send for Allocation {}
unsafe impl Sync for Allocation {}

/// An owned, 4 KiB-aligned view `[start, start + len)` of a shared allocation.
///
/// No two live `IoBuf`s overlap: views are only created by [`IoBuf::split_off`] from a view that
/// owned both halves, so `&mut` access to one view never aliases another.
pub struct IoBuf {
    allocation: Arc<Allocation>,
    start_bytes: usize,
    len_bytes: usize,
}

impl IoBuf {
    /// A zero-filled buffer of `len_bytes`.
    pub fn zeroed(len_bytes: usize) -> IoBuf {
        let size = heap_cache::allocation_bytes(len_bytes);
        let layout = Layout::from_size_align(size, BUF_ALIGN_BYTES).expect("buffer size overflows");
        let ptr = allocate_zeroed(layout, Memory::Heap);
        IoBuf { allocation: Arc::new(Allocation { ptr, layout, memory: Memory::Heap, pool: None }), start_bytes: 0, len_bytes }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> IoBuf {
        IoBuf::from_parts(&[bytes], bytes.len())
    }

    /// A buffer of `len_bytes` holding `parts` one after the other, zeros after them. Each
    /// byte is written once: a zeroed buffer filled by copies writes the copied bytes twice,
    /// which for the cache's copies of 1 MiB writes, their journal records and their destage
    /// runs was an eighth of a sequential write-back run's CPU.
    ///
    /// # Panics
    /// If the parts hold more than `len_bytes`.
    pub fn from_parts(parts: &[&[u8]], len_bytes: usize) -> IoBuf {
        let parts_bytes: usize = parts.iter().map(|part| part.len()).sum();
        assert!(parts_bytes <= len_bytes, "{parts_bytes} bytes of parts do not fit in a {len_bytes}-byte buffer");
        let size = heap_cache::allocation_bytes(len_bytes);
        let layout = Layout::from_size_align(size, BUF_ALIGN_BYTES).expect("buffer size overflows");
        let ptr = allocate_uninit(layout);
        let mut at = 0;
        for part in parts {
            // SAFETY: `at + part.len() <= parts_bytes <= size`, so the copy stays inside the
            // allocation, which no part can overlap (it is new).
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), ptr.as_ptr().add(at), part.len()) };
            at += part.len();
        }
        // SAFETY: `[at, size)` lies inside the allocation; after this every byte of it is
        // initialized, before any slice of it exists.
        unsafe { std::ptr::write_bytes(ptr.as_ptr().add(at), 0, size - at) };
        IoBuf { allocation: Arc::new(Allocation { ptr, layout, memory: Memory::Heap, pool: None }), start_bytes: 0, len_bytes }
    }

    pub fn len(&self) -> usize {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: start_bytes <= allocation size, so the pointer stays in bounds.
        unsafe { self.allocation.ptr.as_ptr().add(self.start_bytes) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: as above; &mut self means this view is not being read elsewhere.
        unsafe { self.allocation.ptr.as_ptr().add(self.start_bytes) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the view is in bounds, initialised (zeroed at allocation) and no other live
        // view overlaps it, so no &mut to these bytes exists.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len_bytes) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len_bytes;
        // SAFETY: as in as_slice, and &mut self makes this the only access to the view.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }

    /// Splits the view in two: `self` keeps `[0, at)`, the returned view holds `[at, len)`.
    ///
    /// # Panics
    /// If `at > len`.
    pub fn split_off(&mut self, at: usize) -> IoBuf {
        assert!(at <= self.len_bytes, "split at {at} past the end of a {}-byte buffer", self.len_bytes);
        let tail = IoBuf { allocation: Arc::clone(&self.allocation), start_bytes: self.start_bytes + at, len_bytes: self.len_bytes - at };
        self.len_bytes = at;
        tail
    }

    /// The whole view, leaving an empty one of the same allocation in its place: what a
    /// buffer handed to an operation leaves behind until it comes back, without allocating a
    /// placeholder (a zeroed 4 KiB one per mirror write and parity read was a tenth of a
    /// RAID1 write's CPU in malloc and memset).
    pub fn take(&mut self) -> IoBuf {
        self.split_off(0)
    }

    /// Joins `tail`, which must be the view directly after `self` in the same allocation.
    ///
    /// # Panics
    /// If `tail` does not follow `self` in the same allocation.
    pub fn unsplit(&mut self, tail: IoBuf) {
        assert!(self.is_followed_by(&tail), "unsplit of views that are not adjacent in one allocation");
        self.len_bytes += tail.len_bytes;
    }

    /// Whether `tail` is the view directly after this one in the same allocation.
    pub fn is_followed_by(&self, tail: &IoBuf) -> bool {
        Arc::ptr_eq(&self.allocation, &tail.allocation) && self.start_bytes + self.len_bytes == tail.start_bytes
    }

    /// Joins views that were split from one buffer, in order.
    ///
    /// # Panics
    /// If `pieces` is empty or the pieces are not adjacent in order.
    pub fn join(pieces: impl IntoIterator<Item = IoBuf>) -> IoBuf {
        let mut pieces = pieces.into_iter();
        let mut whole = pieces.next().expect("join of no pieces");
        pieces.for_each(|piece| whole.unsplit(piece));
        whole
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes at +{})", self.len_bytes, self.start_bytes)
    }
}

impl AsRef<[u8]> for IoBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for IoBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_views_are_disjoint_and_join_back() {
        let mut whole = IoBuf::zeroed(3 * 4096);
        assert_eq!(whole.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        let mut middle = whole.split_off(4096);
        let mut last = middle.split_off(4096);
        middle.as_mut_slice().fill(2);
        last.as_mut_slice().fill(3);
        whole.as_mut_slice().fill(1);
        let joined = IoBuf::join([whole, middle, last]);
        let expected: Vec<u8> = [1u8, 2, 3].iter().flat_map(|&b| std::iter::repeat_n(b, 4096)).collect();
        assert_eq!(joined.as_slice(), &expected[..]);
    }

    #[test]
    fn take_moves_the_view_out_and_leaves_an_empty_one() {
        let mut view = IoBuf::from_slice(&[5u8; 8192]);
        let taken = view.take();
        assert_eq!((view.len(), taken.len()), (0, 8192));
        assert!(taken.as_slice().iter().all(|&b| b == 5));
        view = taken;
        assert_eq!(view.len(), 8192, "the buffer back in its place");
    }

    #[test]
    fn from_parts_lays_the_parts_end_to_end_and_zeros_the_rest() {
        // Dirty the heap first, so that memory handed back uninitialized would show.
        for _ in 0..8 {
            drop(IoBuf::from_parts(&[&[0xee; 20_000]], 20_000));
        }
        let buf = IoBuf::from_parts(&[b"abc", b"", &[7u8; 5000]], 12_000);
        assert_eq!(buf.len(), 12_000);
        assert_eq!(&buf.as_slice()[..3], b"abc");
        assert!(buf.as_slice()[3..5003].iter().all(|&b| b == 7));
        assert!(buf.as_slice()[5003..].iter().all(|&b| b == 0), "zeros after the parts");
        assert_eq!(IoBuf::from_slice(b"xyz").as_slice(), b"xyz");
        let overfull = std::panic::catch_unwind(|| IoBuf::from_parts(&[&[1u8; 10]], 9));
        assert!(overfull.is_err(), "parts larger than the buffer are refused");
    }

    #[test]
    fn pooled_buffers_come_back_and_are_reused_up_to_the_idle_limit() {
        let pool = BufPool::new(2 << 20);
        let mut first = pool.take(1 << 20);
        let address = first.as_ptr() as usize;
        let second_half = first.split_off(512 << 10);
        drop(first);
        drop(second_half); // the last view returns the allocation
        assert_eq!(pool.take(1000 << 10).as_ptr() as usize, address, "same class, reused");
        let many: Vec<IoBuf> = (0..4).map(|_| pool.take(1 << 20)).collect();
        drop(many); // only two fit under the 2 MiB idle limit; the rest are freed
        assert_eq!(pool.shared.classes[8].lock().unwrap().len(), 2);
        assert_eq!(pool.idle_bytes(), 2 << 20);
    }

    /// Regression: the idle bound was per size class, so a pool of fourteen classes could keep
    /// fourteen times what it was given.
    #[test]
    fn idle_bound_covers_all_size_classes_together() {
        let pool = BufPool::new(4 << 20);
        let sizes_bytes = [4 << 10, 64 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20];
        let buffers: Vec<IoBuf> = sizes_bytes.iter().flat_map(|&size| (0..4).map(move |_| size)).map(|size| pool.take(size)).collect();
        drop(buffers);
        assert!(pool.idle_bytes() <= 4 << 20, "{} bytes idle over a 4 MiB bound", pool.idle_bytes());
        let kept_bytes: usize =
            pool.shared.classes.iter().enumerate().map(|(class, idle)| idle.lock().unwrap().len() * (BUF_ALIGN_BYTES << class)).sum();
        assert_eq!(kept_bytes, pool.idle_bytes());
    }

    /// Bytes of this process resident in RAM (VmRSS).
    fn resident_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("a VmRSS line");
        let kib: usize = line.split_whitespace().nth(1).and_then(|value| value.parse().ok()).expect("VmRSS in kB");
        kib << 10
    }

    /// Regression: after a burst of 1 MiB buffers, with small allocations made in between still
    /// live (as a daemon's are), RSS stayed at the peak because glibc served the buffers from
    /// its heap once its mmap threshold had risen.
    #[test]
    fn memory_of_a_burst_goes_back_to_the_kernel() {
        // RSS is the process's: measured in a child running this test alone, since the other
        // tests of this binary run in parallel and keep what they freed in malloc's arenas.
        const CHILD: &str = "STORC_BUF_RSS_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let name = "buf::tests::memory_of_a_burst_goes_back_to_the_kernel";
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads", "1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            assert!(output.status.success() && printed.contains("1 passed"), "the test alone:\n{printed}");
            return;
        }
        const BURST_COUNT: usize = 256;
        const SLACK_BYTES: usize = 16 << 20;
        let idle_bytes_max = 16 << 20;
        drop(IoBuf::zeroed(1 << 20)); // what raises glibc's threshold, if anything here had not
        let pool = BufPool::new(idle_bytes_max);
        let before_bytes = resident_bytes();
        let mut small = Vec::new();
        let mut burst = Vec::new();
        for index in 0..BURST_COUNT {
            let mut buf = pool.take(1 << 20);
            buf.as_mut_slice().fill(index as u8 | 1); // fault every page in
            burst.push(buf);
            small.push(vec![index as u8; 256]);
        }
        let during_bytes = resident_bytes();
        assert!(during_bytes >= before_bytes + (BURST_COUNT << 20) * 3 / 4, "the burst is not resident: {before_bytes} -> {during_bytes}");
        drop(burst);
        let after_bytes = resident_bytes();
        assert!(
            after_bytes <= before_bytes + idle_bytes_max + SLACK_BYTES,
            "RSS {before_bytes} before, {during_bytes} during, {after_bytes} after a burst; allowed after: before + {idle_bytes_max} idle + slack"
        );
        assert_eq!(small.len(), BURST_COUNT);
    }

    #[test]
    fn views_of_other_buffers_are_not_adjacent() {
        let a = IoBuf::zeroed(512);
        let b = IoBuf::zeroed(512);
        assert!(!a.is_followed_by(&b));
    }
}
