//! A drive in RAM, allocated in chunks on first write so that a large drive costs nothing until
//! it is used and reads of untouched areas return zeros, like a new sparse file.

use crate::{check_op_range, Completion, Drive, DriveInfo, DriveKind, DriveOp, IoCtx, Token};
use std::sync::RwLock;

/// Allocation and locking unit. One strip-sized chunk per lock, so that shards serving
/// neighbouring rows of a VD do not queue behind each other on one lock; readers share it.
const CHUNK_BYTES: u64 = 64 << 10;

/// Pages of a chunk, tracked one bit each.
const PAGE_BYTES: usize = 4096;
const PAGES_PER_CHUNK: usize = CHUNK_BYTES as usize / PAGE_BYTES;

/// One chunk: unallocated (reads as zeros) until first written.
type Chunk = RwLock<Option<ChunkData>>;

/// A written chunk, and which of its pages were ever written. Reads of the others return zeros
/// without touching their memory: a read would map the kernel's zero page, and the next write
/// there would then fault again and flush every core's TLB, which under random
/// read-modify-writes cost more than the I/O itself.
struct ChunkData {
    bytes: Box<[u8]>,
    written_pages: u16,
}

const _: () = assert!(PAGES_PER_CHUNK <= u16::BITS as usize, "a chunk's pages fit its page mask");

impl ChunkData {
    fn new() -> ChunkData {
        ChunkData { bytes: vec![0u8; CHUNK_BYTES as usize].into_boxed_slice(), written_pages: 0 }
    }

    fn write(&mut self, in_chunk: usize, part: &[u8]) {
        self.bytes[in_chunk..in_chunk + part.len()].copy_from_slice(part);
        self.written_pages |= page_mask(in_chunk, part.len());
    }

    fn read(&self, in_chunk: usize, part: &mut [u8]) {
        let mut done = 0;
        while done < part.len() {
            let at = in_chunk + done;
            let page = at / PAGE_BYTES;
            let len = (PAGE_BYTES - at % PAGE_BYTES).min(part.len() - done);
            let out = &mut part[done..done + len];
            if self.written_pages & (1 << page) != 0 {
                out.copy_from_slice(&self.bytes[at..at + len]);
            } else {
                out.fill(0);
            }
            done += len;
        }
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
}

impl MemDrive {
    pub fn new(capacity_bytes: u64) -> MemDrive {
        MemDrive::named(format!("mem:{capacity_bytes}"), capacity_bytes)
    }

    pub fn named(name: String, capacity_bytes: u64) -> MemDrive {
        let chunk_count = capacity_bytes.div_ceil(CHUNK_BYTES) as usize;
        let chunks = (0..chunk_count).map(|_| RwLock::new(None)).collect();
        let info = DriveInfo { name, kind: DriveKind::Memory, capacity_bytes, direct_io: true, solid_state: false };
        MemDrive { info, chunks }
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
                let mut data = chunk.write().expect("memory drive lock poisoned");
                data.get_or_insert_with(ChunkData::new).write(in_chunk, part);
            } else {
                match chunk.read().expect("memory drive lock poisoned").as_ref() {
                    Some(data) => data.read(in_chunk, part),
                    None => part.fill(0),
                }
            }
            done += len;
        }
    }

    /// Writes every byte of the drive (a pattern that differs from chunk to chunk), so that
    /// reads copy memory as they would from a drive holding data.
    pub fn fill(&self) {
        for (index, chunk) in self.chunks.iter().enumerate() {
            let mut data = ChunkData::new();
            data.bytes.iter_mut().enumerate().for_each(|(i, byte)| *byte = (i as u8).wrapping_mul(31) ^ index as u8);
            data.written_pages = u16::MAX;
            *chunk.write().expect("memory drive lock poisoned") = Some(data);
        }
    }

    /// Bytes of RAM the drive holds now.
    pub fn allocated_bytes(&self) -> u64 {
        let allocated = self.chunks.iter().filter(|c| c.read().map(|c| c.is_some()).unwrap_or(false)).count();
        allocated as u64 * CHUNK_BYTES
    }
}

impl Drive for MemDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, mut op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        match &mut op {
            DriveOp::Read { offset_bytes, buf } => self.copy(*offset_bytes, buf.as_mut_slice(), false),
            DriveOp::Write { offset_bytes, buf } => self.copy(*offset_bytes, buf.as_mut_slice(), true),
            DriveOp::ReadV { offset_bytes, bufs } => self.copy_vectored(*offset_bytes, bufs, false),
            DriveOp::WriteV { offset_bytes, bufs } => self.copy_vectored(*offset_bytes, bufs, true),
            DriveOp::Flush => {}
        }
        ctx.complete(Completion::of(token, Ok(()), op));
    }

    /// Chunks never written read as zero; a written chunk is not looked into.
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if len_bytes == 0 {
            return true;
        }
        let end_bytes = offset_bytes.saturating_add(len_bytes).min(self.info.capacity_bytes);
        let chunks = (offset_bytes / CHUNK_BYTES) as usize..end_bytes.div_ceil(CHUNK_BYTES) as usize;
        self.chunks[chunks].iter().all(|chunk| chunk.read().map(|data| data.is_none()).unwrap_or(false))
    }
}

impl MemDrive {
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
}
