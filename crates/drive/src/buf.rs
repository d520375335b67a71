//! Aligned I/O buffers that can be split into disjoint pieces and joined again.
//!
//! A RAID write of 1 MiB becomes sixteen 64 KiB member writes; copying the data into sixteen new
//! buffers would halve memory throughput. [`IoBuf::split_off`] instead hands out disjoint views of
//! one allocation, each owned by one in-flight operation, and [`IoBuf::unsplit`] puts them back
//! together when they return. The allocation is freed when the last view is dropped, so a buffer
//! handed to the kernel stays valid until its completion returns the view.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every allocation: enough for O_DIRECT on any device we meet (4 KiB sectors).
pub const BUF_ALIGN_BYTES: usize = 4096;

struct Allocation {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with this exact layout and is freed once,
        // when the last IoBuf view (the last Arc) goes away.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
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
        let size = len_bytes.max(1).next_multiple_of(BUF_ALIGN_BYTES);
        let layout = Layout::from_size_align(size, BUF_ALIGN_BYTES).expect("buffer size overflows");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        IoBuf { allocation: Arc::new(Allocation { ptr, layout }), start_bytes: 0, len_bytes }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> IoBuf {
        let mut buf = IoBuf::zeroed(bytes.len());
        buf.as_mut_slice().copy_from_slice(bytes);
        buf
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
        let tail = IoBuf {
            allocation: Arc::clone(&self.allocation),
            start_bytes: self.start_bytes + at,
            len_bytes: self.len_bytes - at,
        };
        self.len_bytes = at;
        tail
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
    fn views_of_other_buffers_are_not_adjacent() {
        let a = IoBuf::zeroed(512);
        let b = IoBuf::zeroed(512);
        assert!(!a.is_followed_by(&b));
    }
}
