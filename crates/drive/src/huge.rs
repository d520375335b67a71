//! One 2 MiB block of memory on a transparent huge page, for memory that is filled densely and
//! read at random (the controller cache's lines): a random 4 KiB copy out of 4 KiB pages costs a
//! TLB miss and a page walk nearly every time, which made cache hits slower than reads from a
//! memory drive once memory drives moved to huge pages.
//!
//! Unlike a memory drive's slabs ([`crate::MemDrive`]), it takes its huge page at the first
//! touch (`MADV_HUGEPAGE`): whoever asks for one is about to fill it. Where the kernel has no
//! transparent huge pages it is plain memory on 4 KiB pages.

use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The size and alignment of a [`HugePageBuf`].
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// 2 MiB of zeroed memory aligned to 2 MiB, unmapped on drop.
pub struct HugePageBuf {
    base: NonNull<u8>,
}

// SAFETY: the buffer owns its mapping; shared references give shared access, and `&mut` is
// needed to write, as for a `Box<[u8]>`.
unsafe impl Send for HugePageBuf {}
unsafe impl Sync for HugePageBuf {}

impl HugePageBuf {
    /// Maps a new buffer.
    ///
    /// # Errors
    /// The kernel's, when it cannot map the memory.
    pub fn new() -> io::Result<HugePageBuf> {
        let mapping_bytes = 2 * HUGE_PAGE_BYTES;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing aliases nothing.
        let mapping = unsafe { libc::mmap(std::ptr::null_mut(), mapping_bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if mapping == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = mapping as usize;
        let base = start.next_multiple_of(HUGE_PAGE_BYTES);
        // Keep only the aligned 2 MiB: the head before it and the tail after it go back.
        // SAFETY: both ranges lie inside the mapping just made and are page-aligned; nothing
        // refers to them.
        unsafe {
            if base > start {
                libc::munmap(mapping, base - start);
            }
            let end = base + HUGE_PAGE_BYTES;
            if start + mapping_bytes > end {
                libc::munmap(end as *mut libc::c_void, start + mapping_bytes - end);
            }
            // Advice only: a kernel without transparent huge pages refuses it and changes nothing.
            libc::madvise(base as *mut libc::c_void, HUGE_PAGE_BYTES, libc::MADV_HUGEPAGE);
        }
        let base = NonNull::new(base as *mut u8).expect("a mapping is never at address 0");
        Ok(HugePageBuf { base })
    }
}

impl Deref for HugePageBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is HUGE_PAGE_BYTES long, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), HUGE_PAGE_BYTES) }
    }
}

impl DerefMut for HugePageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), HUGE_PAGE_BYTES) }
    }
}

impl Drop for HugePageBuf {
    fn drop(&mut self) {
        // SAFETY: the aligned 2 MiB is ours, and nothing refers to it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), HUGE_PAGE_BYTES) };
    }
}

/// What the kernel says of a mapping of this process (tests of huge-page backing).
#[cfg(test)]
pub(crate) mod smaps {
    /// A field of the mapping that holds `address`, from /proc/self/smaps.
    fn smaps_field(address: usize, field: &str) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(range, _)| range.contains('-') && !range.ends_with(':')) {
                let (start, end) = range.split_once('-').expect("an address range");
                let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
                inside = (start..end).contains(&address);
            } else if let Some(value) = line.strip_prefix(field).filter(|_| inside) {
                return value.to_string();
            }
        }
        panic!("no mapping holds {address:#x}")
    }

    pub(crate) fn huge_page_eligible(address: usize) -> bool {
        smaps_field(address, "THPeligible:").trim() == "1"
    }

    /// The `AnonHugePages` bytes of the mapping that holds `address`.
    pub(crate) fn anon_huge_bytes(address: usize) -> u64 {
        smaps_field(address, "AnonHugePages:").trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() << 10
    }

    pub(crate) fn transparent_huge_pages_enabled() -> bool {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        !setting.is_empty() && !setting.contains("[never]")
    }
}

#[cfg(test)]
mod tests {
    use super::smaps::{anon_huge_bytes, transparent_huge_pages_enabled};
    use super::*;

    #[test]
    fn a_buffer_is_aligned_zeroed_and_writable() {
        let mut buf = HugePageBuf::new().unwrap();
        assert_eq!(buf.as_ptr() as usize % HUGE_PAGE_BYTES, 0, "aligned to a huge page");
        assert!(buf.iter().all(|&b| b == 0), "starts zeroed");
        buf[HUGE_PAGE_BYTES - 1] = 7;
        buf[0] = 3;
        assert_eq!((buf[0], buf[HUGE_PAGE_BYTES - 1]), (3, 7));
    }

    /// Filled, it is one huge page where the kernel has transparent huge pages at all.
    #[test]
    fn a_filled_buffer_is_on_a_huge_page() {
        let mut buf = HugePageBuf::new().unwrap();
        buf.fill(1);
        let address = buf.as_ptr() as usize;
        match transparent_huge_pages_enabled() {
            true => assert_eq!(anon_huge_bytes(address), HUGE_PAGE_BYTES as u64, "the mapping is one huge page"),
            false => assert_eq!(anon_huge_bytes(address), 0),
        }
        drop(buf);
    }
}
