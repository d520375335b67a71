//! A drive in RAM: one anonymous mapping that the kernel backs page by page on first write, so
//! that a large drive costs nothing until it is used and reads of untouched areas return
//! zeros, like a new sparse file.
//!
//! A RAM drive (`mem:SIZE`, [`Backing::Dense`]) moves to 2 MiB huge pages as it fills: a
//! random 4 KiB write then costs one TLB entry per 2 MiB instead of a page-table walk through
//! 4 MiB of page tables per 2 GiB, which was most of what the write's copy cost when it landed
//! cold. Its pages start at 4 KiB, and each 2 MiB slab is collapsed into a huge page
//! (`MADV_COLLAPSE`) once every byte of it was written: a huge page on first touch would make
//! the first write anywhere in a slab zero 2 MiB, and 256 scattered first writes then took
//! over 100 ms. An emulated drive's store is written here and there (metadata at both ends, a
//! benchmark's random writes over 600 GiB) and keeps 4 KiB pages ([`Backing::Sparse`]).

use crate::{check_op_range, Completion, Drive, DriveInfo, DriveKind, DriveOp, IoCtx, Token};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::RwLock;

/// Locking unit. One strip-sized chunk per lock, so that shards serving neighbouring rows of a
/// VD do not queue behind each other on one lock; readers share it.
const CHUNK_BYTES: u64 = 64 << 10;

/// Pages of a chunk, tracked one bit each.
const PAGE_BYTES: usize = 4096;
const PAGES_PER_CHUNK: usize = CHUNK_BYTES as usize / PAGE_BYTES;

// A transparent huge page on x86-64 and arm64 with 4 KiB base pages; the mapping is aligned to
// it so that every whole 2 MiB of the drive can be one.
use crate::huge::HUGE_PAGE_BYTES;
const CHUNKS_PER_SLAB: usize = HUGE_PAGE_BYTES / CHUNK_BYTES as usize;

/// Linux 6.1's madvise advice that collapses a range into huge pages now, whatever the THP
/// sysfs setting (other than a range advised `MADV_NOHUGEPAGE`). Older kernels refuse it and
/// the drive stays on 4 KiB pages.
const MADV_COLLAPSE: libc::c_int = 25;

/// One chunk's lock over the pages of the chunk ever written, one bit each. Reads of the others
/// return zeros without touching their memory: a read would map the kernel's zero page, and the
/// next write there would then fault again and flush every core's TLB, which under random
/// read-modify-writes cost more than the I/O itself. A chunk with no page written is
/// unallocated as far as [`MemDrive::allocated_bytes`] and [`Drive::reads_zero`] go.
type Chunk = RwLock<u16>;

const _: () = assert!(PAGES_PER_CHUNK <= u16::BITS as usize, "a chunk's pages fit its page mask");
const _: () = assert!(HUGE_PAGE_BYTES.is_multiple_of(CHUNK_BYTES as usize), "chunks never straddle a huge page");
const _: () = assert!(CHUNKS_PER_SLAB <= u8::MAX as usize, "a slab's full chunks fit its counter");

/// How a memory drive's RAM is laid out (the module docs say why there are two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// 2 MiB huge pages for every slab written in full, where the kernel grants them: a RAM
    /// drive that is meant to be filled.
    Dense,
    /// 4 KiB pages: a store written sparsely.
    Sparse,
}

/// The drive's bytes: a private anonymous mapping reserved without commit (`MAP_NORESERVE`),
/// unmapped on drop. Its bytes are reached only through [`Region::chunk`], under that chunk's
/// lock, so no two threads ever hold overlapping references.
struct Region {
    mapping: NonNull<libc::c_void>,
    mapping_bytes: usize,
    /// The first byte of the drive: `mapping` rounded up to a huge page.
    base: NonNull<u8>,
}

// SAFETY: the region is plain memory owned by the drive; every access goes through a chunk's
// RwLock, which gives shared access to readers and exclusive access to one writer.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn map(capacity_bytes: u64, backing: Backing) -> io::Result<Region> {
        let too_large =
            || io::Error::new(io::ErrorKind::OutOfMemory, format!("{capacity_bytes} bytes do not fit this machine's address space"));
        let data_bytes = usize::try_from(capacity_bytes.div_ceil(CHUNK_BYTES) * CHUNK_BYTES).map_err(|_| too_large())?;
        let mapping_bytes = data_bytes.checked_add(HUGE_PAGE_BYTES).ok_or_else(too_large)?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing aliases nothing.
        let mapping = unsafe { libc::mmap(std::ptr::null_mut(), mapping_bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if mapping == libc::MAP_FAILED {
            let os_error = io::Error::last_os_error();
            return Err(io::Error::new(os_error.kind(), format!("cannot map {capacity_bytes} bytes of memory: {os_error}")));
        }
        let mapping = NonNull::new(mapping).expect("mmap returns MAP_FAILED, never null, on failure");
        let offset = mapping.as_ptr().align_offset(HUGE_PAGE_BYTES);
        // SAFETY: offset < HUGE_PAGE_BYTES, and the mapping has HUGE_PAGE_BYTES spare.
        let base = unsafe { NonNull::new_unchecked(mapping.as_ptr().cast::<u8>().add(offset)) };
        if backing == Backing::Sparse {
            // Advice only (where THP is `always`, faults would otherwise take huge pages); a
            // kernel without transparent huge pages refuses it and changes nothing.
            // SAFETY: the range lies inside the mapping.
            unsafe { libc::madvise(base.as_ptr().cast(), data_bytes, libc::MADV_NOHUGEPAGE) };
        }
        Ok(Region { mapping, mapping_bytes, base })
    }

    /// Asks the kernel to put 2 MiB slab `index` on one huge page; whether it did.
    fn collapse(&self, index: usize) -> bool {
        // SAFETY: the slab lies inside the mapping; the kernel moves its bytes to the huge page
        // without changing them, while other threads go on using them.
        unsafe { libc::madvise(self.base.as_ptr().add(index * HUGE_PAGE_BYTES).cast(), HUGE_PAGE_BYTES, MADV_COLLAPSE) == 0 }
    }

    /// Chunk `index`'s bytes.
    ///
    /// # Safety
    /// The caller holds chunk `index`'s lock for as long as it uses the pointer: for writing if
    /// it writes through it; and `index` is a chunk of the drive.
    unsafe fn chunk(&self, index: usize) -> *mut u8 {
        self.base.as_ptr().add(index * CHUNK_BYTES as usize)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing refers to it any more (the drive is dropping).
        unsafe { libc::munmap(self.mapping.as_ptr(), self.mapping_bytes) };
    }
}

/// Writes `part` at `in_chunk` of a chunk's bytes and marks its pages written.
fn write_chunk(bytes: &mut [u8], written_pages: &mut u16, in_chunk: usize, part: &[u8]) {
    bytes[in_chunk..in_chunk + part.len()].copy_from_slice(part);
    *written_pages |= page_mask(in_chunk, part.len());
}

/// Reads `part` from `in_chunk` of a chunk's bytes: zeros where a page was never written.
fn read_chunk(bytes: &[u8], written_pages: u16, in_chunk: usize, part: &mut [u8]) {
    let mut done = 0;
    while done < part.len() {
        let at = in_chunk + done;
        let page = at / PAGE_BYTES;
        let len = (PAGE_BYTES - at % PAGE_BYTES).min(part.len() - done);
        let out = &mut part[done..done + len];
        if written_pages & (1 << page) != 0 {
            out.copy_from_slice(&bytes[at..at + len]);
        } else {
            out.fill(0);
        }
        done += len;
    }
}

/// The pages that bytes `[in_chunk, in_chunk + len)` of a chunk touch.
fn page_mask(in_chunk: usize, len: usize) -> u16 {
    if len == 0 {
        return 0;
    }
    let first = in_chunk / PAGE_BYTES;
    let last = (in_chunk + len - 1) / PAGE_BYTES;
    (first..=last).fold(0u16, |mask, page| mask | (1 << page))
}

pub struct MemDrive {
    info: DriveInfo,
    chunks: Box<[Chunk]>,
    region: Region,
    /// Dense drives: per 2 MiB slab, the chunks written in full (every page); empty for sparse.
    full_chunks_per_slab: Box<[AtomicU8]>,
    /// Slabs the kernel put on a huge page.
    huge_slabs: AtomicU64,
}

impl MemDrive {
    /// A dense drive; panics where the machine cannot map `capacity_bytes` (tests and tools that
    /// pick the size; the daemon uses [`MemDrive::open`]).
    pub fn new(capacity_bytes: u64) -> MemDrive {
        MemDrive::named(format!("mem:{capacity_bytes}"), capacity_bytes)
    }

    /// As [`MemDrive::new`], with a name.
    pub fn named(name: String, capacity_bytes: u64) -> MemDrive {
        MemDrive::open(name, capacity_bytes, Backing::Dense).expect("a memory drive's mapping")
    }

    /// A drive of `capacity_bytes`, or why the machine cannot map that much.
    pub fn open(name: String, capacity_bytes: u64, backing: Backing) -> io::Result<MemDrive> {
        let region = Region::map(capacity_bytes, backing)?;
        let chunk_count = capacity_bytes.div_ceil(CHUNK_BYTES) as usize;
        // The lock table is the one part of the drive allocated up front (a lock per 64 KiB);
        // a capacity the machine cannot hold that for is an error, not an abort.
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(chunk_count).map_err(|_| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("{capacity_bytes} bytes need {chunk_count} chunk locks, more than this machine can allocate"),
            )
        })?;
        chunks.extend((0..chunk_count).map(|_| RwLock::new(0)));
        let chunks = chunks.into_boxed_slice();
        let slab_count = match backing {
            Backing::Dense => chunk_count.div_ceil(CHUNKS_PER_SLAB),
            Backing::Sparse => 0,
        };
        let full_chunks_per_slab = (0..slab_count).map(|_| AtomicU8::new(0)).collect();
        let info = DriveInfo { name, kind: DriveKind::Memory, capacity_bytes, direct_io: true, solid_state: false };
        Ok(MemDrive { info, chunks, region, full_chunks_per_slab, huge_slabs: AtomicU64::new(0) })
    }

    /// Copies between the drive and `bytes` chunk by chunk; `write` picks the direction.
    fn copy(&self, offset_bytes: u64, bytes: &mut [u8], write: bool) {
        let mut done = 0usize;
        while done < bytes.len() {
            let offset = offset_bytes + done as u64;
            let chunk_index = (offset / CHUNK_BYTES) as usize;
            let in_chunk = (offset % CHUNK_BYTES) as usize;
            let len = (CHUNK_BYTES as usize - in_chunk).min(bytes.len() - done);
            let part = &mut bytes[done..done + len];
            let chunk = &self.chunks[chunk_index];
            if write {
                let mut written_pages = chunk.write().expect("memory drive lock poisoned");
                let was_full = *written_pages == u16::MAX;
                // SAFETY: the chunk's write lock is held until the slice's last use.
                let chunk_bytes = unsafe { std::slice::from_raw_parts_mut(self.region.chunk(chunk_index), CHUNK_BYTES as usize) };
                write_chunk(chunk_bytes, &mut written_pages, in_chunk, part);
                let became_full = !was_full && *written_pages == u16::MAX;
                drop(written_pages);
                if became_full {
                    self.note_full_chunk(chunk_index);
                }
            } else {
                let written_pages = chunk.read().expect("memory drive lock poisoned");
                // SAFETY: the chunk's read lock is held until the slice's last use; no writer
                // holds a reference meanwhile.
                let chunk_bytes = unsafe { std::slice::from_raw_parts(self.region.chunk(chunk_index), CHUNK_BYTES as usize) };
                read_chunk(chunk_bytes, *written_pages, in_chunk, part);
            }
            done += len;
        }
    }

    /// Counts chunk `index` written in full, once; the chunk that completes its slab has the
    /// slab put on a huge page (a copy of 2 MiB, about as long as zeroing it on a first touch,
    /// paid once per slab by the write that fills it).
    fn note_full_chunk(&self, index: usize) {
        let slab = index / CHUNKS_PER_SLAB;
        let Some(full_chunks) = self.full_chunks_per_slab.get(slab) else {
            return;
        };
        let before = full_chunks.fetch_add(1, Ordering::Relaxed) as usize;
        debug_assert!(before < CHUNKS_PER_SLAB, "a chunk becomes full once");
        // A slab past the end of the drive has fewer chunks, or a last chunk never full: it never
        // gets here.
        if before + 1 == CHUNKS_PER_SLAB && self.region.collapse(slab) {
            self.huge_slabs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Bytes of the drive the kernel put on huge pages.
    pub fn huge_page_bytes(&self) -> u64 {
        self.huge_slabs.load(Ordering::Relaxed) * HUGE_PAGE_BYTES as u64
    }

    /// Writes every byte of the drive (a pattern that differs from chunk to chunk), so that
    /// reads copy memory as they would from a drive holding data.
    pub fn fill(&self) {
        let mut pattern = vec![0u8; CHUNK_BYTES as usize];
        for index in 0..self.chunks.len() {
            pattern.iter_mut().enumerate().for_each(|(i, byte)| *byte = (i as u8).wrapping_mul(31) ^ index as u8);
            self.copy(index as u64 * CHUNK_BYTES, &mut pattern, true);
        }
    }

    /// Bytes of the drive written at least once, counted in whole chunks. The RAM the kernel
    /// holds for them is more on a dense drive (whole huge pages).
    pub fn allocated_bytes(&self) -> u64 {
        let allocated = self.chunks.iter().filter(|c| c.read().map(|c| *c != 0).unwrap_or(false)).count();
        allocated as u64 * CHUNK_BYTES
    }
}

impl Drive for MemDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        ctx.complete(self.serve_checked(token, op));
    }

    /// Chunks never written read as zero; a written chunk is not looked into.
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if len_bytes == 0 {
            return true;
        }
        let end_bytes = offset_bytes.saturating_add(len_bytes).min(self.info.capacity_bytes);
        let chunks = (offset_bytes / CHUNK_BYTES) as usize..end_bytes.div_ceil(CHUNK_BYTES) as usize;
        self.chunks[chunks].iter().all(|chunk| chunk.read().map(|written_pages| *written_pages == 0).unwrap_or(false))
    }
}

impl MemDrive {
    /// Serves `op`, already checked against the capacity (`check_op_range`), on the calling
    /// thread and returns its completion: what [`Drive::submit`] does, for a caller that checked
    /// the range itself and has no context to complete into (an emulated drive's store, once per
    /// operation, where a scratch context cost allocations and a process-wide counter).
    pub(crate) fn serve_checked(&self, token: Token, mut op: DriveOp) -> Completion {
        debug_assert!(
            check_op_range(&op, self.info.capacity_bytes).is_ok(),
            "{}: an operation out of range reached serve_checked",
            self.info.name
        );
        match &mut op {
            DriveOp::Read { offset_bytes, buf } => self.copy(*offset_bytes, buf.as_mut_slice(), false),
            DriveOp::Write { offset_bytes, buf } => self.copy(*offset_bytes, buf.as_mut_slice(), true),
            DriveOp::ReadV { offset_bytes, bufs } => self.copy_vectored(*offset_bytes, bufs, false),
            DriveOp::WriteV { offset_bytes, bufs } => self.copy_vectored(*offset_bytes, bufs, true),
            DriveOp::Flush => {}
        }
        Completion::of(token, Ok(()), op)
    }

    fn copy_vectored(&self, offset_bytes: u64, bufs: &mut [crate::IoBuf], write: bool) {
        let mut offset = offset_bytes;
        for buf in bufs {
            self.copy(offset, buf.as_mut_slice(), write);
            offset += buf.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::huge::smaps::{anon_huge_bytes, huge_page_eligible, transparent_huge_pages_enabled};

    #[test]
    fn a_filled_drive_holds_data_everywhere_and_keeps_what_is_written() {
        let drive = MemDrive::new(3 * CHUNK_BYTES);
        drive.fill();
        assert_eq!(drive.allocated_bytes(), 3 * CHUNK_BYTES);
        let mut first = vec![0u8; PAGE_BYTES];
        let mut last = vec![0u8; PAGE_BYTES];
        drive.copy(0, &mut first, false);
        drive.copy(3 * CHUNK_BYTES - PAGE_BYTES as u64, &mut last, false);
        assert!(first.iter().any(|&b| b != 0) && first != last, "chunks hold different non-zero patterns");
        let mut written = vec![7u8; PAGE_BYTES];
        drive.copy(CHUNK_BYTES, &mut written, true);
        let mut read = vec![0u8; PAGE_BYTES];
        drive.copy(CHUNK_BYTES, &mut read, false);
        assert_eq!(read, written);
    }

    /// A RAM drive's slabs move to huge pages once written in full, and not before (a first
    /// write stays cheap); the data stays as written. An emulated drive's sparse store never
    /// takes huge pages.
    #[test]
    fn a_dense_drive_moves_full_slabs_to_huge_pages_and_a_sparse_one_never_does() {
        let dense = MemDrive::open("dense".into(), 8 << 20, Backing::Dense).unwrap();
        let sparse = MemDrive::open("sparse".into(), 8 << 20, Backing::Sparse).unwrap();
        let dense_base = dense.region.base.as_ptr() as usize;
        assert_eq!(dense_base % HUGE_PAGE_BYTES, 0, "the drive starts on a huge page");
        assert!(!huge_page_eligible(sparse.region.base.as_ptr() as usize), "sparse: never huge");
        // Slab 1 all but its last page, then its last page in a second write.
        let mut data: Vec<u8> = (0..HUGE_PAGE_BYTES).map(|i| (i % 251) as u8).collect();
        let slab_at = HUGE_PAGE_BYTES as u64;
        dense.copy(slab_at, &mut data[..HUGE_PAGE_BYTES - PAGE_BYTES], true);
        assert_eq!(dense.huge_page_bytes(), 0, "a slab written in part stays on small pages");
        dense.copy(slab_at + (HUGE_PAGE_BYTES - PAGE_BYTES) as u64, &mut data[HUGE_PAGE_BYTES - PAGE_BYTES..], true);
        if transparent_huge_pages_enabled() {
            assert_eq!(dense.huge_page_bytes(), HUGE_PAGE_BYTES as u64, "the full slab is on a huge page");
            assert!(anon_huge_bytes(dense_base) >= HUGE_PAGE_BYTES as u64, "the kernel reports the huge page");
        }
        let mut read = vec![0u8; HUGE_PAGE_BYTES];
        dense.copy(slab_at, &mut read, false);
        assert!(read == data, "the collapse kept the data");
    }

    /// A capacity the machine cannot map is an error the daemon can report, not an abort.
    #[test]
    fn a_drive_larger_than_the_address_space_is_an_error() {
        let error = MemDrive::open("huge".into(), 1 << 62, Backing::Dense).err().expect("4 EiB cannot be mapped");
        assert_eq!(error.kind(), io::ErrorKind::OutOfMemory, "{error}");
    }

    /// A dropped drive gives its memory back: the process's resident memory after a 1 GiB
    /// drive was written in full and dropped is within 256 MiB of what it was before.
    #[test]
    fn a_dropped_drive_returns_its_memory() {
        let resident_bytes = || {
            let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
            let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("a VmRSS line");
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
        };
        let before = resident_bytes();
        let drive = MemDrive::new(1 << 30);
        let mut ones = vec![1u8; 1 << 20];
        (0..1024).for_each(|mib| drive.copy(mib << 20, &mut ones, true));
        assert!(resident_bytes() >= before + (1 << 30) - (64 << 20), "the written drive is resident");
        drop(drive);
        let after = resident_bytes();
        assert!(after < before + (256 << 20), "{before} bytes resident before, {after} after the drive was dropped");
    }
}
