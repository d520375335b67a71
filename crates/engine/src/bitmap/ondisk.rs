//! The bytes of the write-intent bitmap area: where each slot lives, the header codec, and the
//! blocking reads and writes the control plane does at assembly, creation and a clean stop.
//!
//! The area is the last MiB of every member's reserved 4 MiB
//! ([`crate::metadata::BITMAP_AREA_OFFSET_BYTES`]). A 4096-byte header comes first, then
//! [`SLOT_COUNT`] slots of [`SLOT_BYTES`]. Slot 0 belongs to the control plane (regions dirty
//! when the VD was assembled); slot `1 + i` to shard `i`, which alone writes it, so shards never
//! coordinate. A region is dirty when its bit is set in any slot of any member in service. Bit
//! blocks carry no checksum: a torn block holds, per sector, the old or the new bits, and both
//! are safe (a bit is trusted only once its write and a flush completed; a stale set bit costs
//! a resync of its region, nothing more). The header has a CRC-32C, since its `clean` flag
//! decides whether to resync at all.
//!
//! Version 2 gives each slot two halves of [`HALF_BLOCKS`] blocks: the *dirty* bits, then the
//! *unlogged* bits. In a shard's slot an unlogged bit says a write to the region may have torn
//! a row that no journal record can mend (every write but a parity row write whose row image
//! the journal holds sets it); in slot 0 it says the region awaited a resync when slot 0 was
//! written. After an unclean stop a region needs a resync if it is unlogged in any slot: a
//! region that slot 0 holds only as dirty (written while a member was out, in an earlier run)
//! agrees within itself. Version 1 (one half, every dirty bit also unsynced) is still read.

use super::Bits;
use crate::metadata::{submit_and_wait, BITMAP_AREA_BYTES, BITMAP_AREA_OFFSET_BYTES, BLOCK_BYTES};
use drive::{Drive, DriveError, DriveOp, IoBuf};

pub const MAGIC: [u8; 8] = *b"STORCWIB";
pub const VERSION: u32 = 2;
/// The version before the unlogged halves: its dirty bits count as unlogged too.
pub const VERSION_V1: u32 = 1;
pub const HEADER_BYTES: u64 = 4096;
/// Slot 0 for the control plane, one per shard after it.
pub const SLOT_COUNT: usize = 32;
/// The most shards a VD's bitmap serves (one slot each).
pub const SHARD_SLOTS_MAX: usize = SLOT_COUNT - 1;
pub const SLOT_BYTES: u64 = 28 << 10;
/// Blocks of each half of a slot (version 2): dirty bits in blocks `0..HALF_BLOCKS`, unlogged
/// bits in `HALF_BLOCKS..2 * HALF_BLOCKS`.
pub const HALF_BLOCKS: usize = 3;
/// Regions one slot can describe: a bit each in each half.
pub const REGIONS_MAX: u64 = (HALF_BLOCKS * BLOCK_BYTES * 8) as u64;
/// Regions a version-1 slot described (the whole slot for dirty bits).
const REGIONS_MAX_V1: u64 = SLOT_BYTES * 8;
/// `flags` bit 0: the VD was stopped cleanly (everything flushed); no resync is needed.
pub const FLAG_CLEAN: u32 = 1;

const _: () = assert!(HEADER_BYTES + SLOT_COUNT as u64 * SLOT_BYTES <= BITMAP_AREA_BYTES);
const _: () = assert!(SLOT_BYTES.is_multiple_of(BLOCK_BYTES as u64));
const _: () = assert!((2 * HALF_BLOCKS * BLOCK_BYTES) as u64 <= SLOT_BYTES);

mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const FLAGS: usize = 12;
    pub const CONTROLLER_ID: usize = 16;
    pub const VD_ID: usize = 32;
    pub const SLOT_COUNT: usize = 36;
    pub const ROWS_PER_REGION: usize = 40;
    pub const REGION_COUNT: usize = 48;
    pub const EPOCH: usize = 56;
    pub const RESERVED: usize = 64;
    pub const HEADER_CRC32C: usize = 4092;
}

/// What a bitmap header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub controller_id: u128,
    pub vd_id: u32,
    pub rows_per_region: u64,
    pub region_count: u64,
    /// Incremented each time the VD is opened for writing.
    pub epoch: u64,
    pub clean: bool,
    /// The layout of the slots ([`VERSION`] or [`VERSION_V1`]); written as [`VERSION`] always.
    pub version: u32,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_BYTES as usize];
        bytes[field::MAGIC..][..8].copy_from_slice(&MAGIC);
        bytes[field::VERSION..][..4].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.clean { FLAG_CLEAN } else { 0 };
        bytes[field::FLAGS..][..4].copy_from_slice(&flags.to_le_bytes());
        bytes[field::CONTROLLER_ID..][..16].copy_from_slice(&self.controller_id.to_le_bytes());
        bytes[field::VD_ID..][..4].copy_from_slice(&self.vd_id.to_le_bytes());
        bytes[field::SLOT_COUNT..][..4].copy_from_slice(&(SLOT_COUNT as u32).to_le_bytes());
        bytes[field::ROWS_PER_REGION..][..8].copy_from_slice(&self.rows_per_region.to_le_bytes());
        bytes[field::REGION_COUNT..][..8].copy_from_slice(&self.region_count.to_le_bytes());
        bytes[field::EPOCH..][..8].copy_from_slice(&self.epoch.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..field::HEADER_CRC32C]);
        bytes[field::HEADER_CRC32C..][..4].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The header in `bytes`, or why there is none (blank, torn, another version).
    pub fn decode(bytes: &[u8]) -> Result<Header, String> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if bytes.len() < HEADER_BYTES as usize || bytes[..8] != MAGIC {
            return Err("no write-intent bitmap header".into());
        }
        let crc = crc32c::crc32c(&bytes[..field::HEADER_CRC32C]);
        if crc != u32_at(field::HEADER_CRC32C) {
            return Err("bitmap header checksum mismatch (torn or corrupted)".into());
        }
        let version = u32_at(field::VERSION);
        if !(VERSION_V1..=VERSION).contains(&version) || u32_at(field::SLOT_COUNT) != SLOT_COUNT as u32 {
            return Err(format!("bitmap version {} with {} slots is unknown", u32_at(field::VERSION), u32_at(field::SLOT_COUNT)));
        }
        let flags = u32_at(field::FLAGS);
        if flags & !FLAG_CLEAN != 0 || bytes[field::RESERVED..field::HEADER_CRC32C].iter().any(|&b| b != 0) {
            return Err("bitmap header has unknown flags or reserved bytes set".into());
        }
        Ok(Header {
            controller_id: u128::from_le_bytes(bytes[field::CONTROLLER_ID..][..16].try_into().expect("16 bytes")),
            vd_id: u32_at(field::VD_ID),
            rows_per_region: u64_at(field::ROWS_PER_REGION),
            region_count: u64_at(field::REGION_COUNT),
            epoch: u64_at(field::EPOCH),
            clean: flags & FLAG_CLEAN != 0,
            version,
        })
    }
}

/// Where the slots lie on a member: every byte [`block_offset_bytes`] can name.
pub fn slots_range_bytes() -> std::ops::Range<u64> {
    let start = BITMAP_AREA_OFFSET_BYTES + HEADER_BYTES;
    start..start + SLOT_COUNT as u64 * SLOT_BYTES
}

/// Where slot `slot`'s bit block `block` lives on a member.
pub fn block_offset_bytes(slot: usize, block: usize) -> u64 {
    assert!(slot < SLOT_COUNT && (block as u64) < SLOT_BYTES / BLOCK_BYTES as u64, "slot {slot} block {block}");
    BITMAP_AREA_OFFSET_BYTES + HEADER_BYTES + slot as u64 * SLOT_BYTES + block as u64 * BLOCK_BYTES as u64
}

/// Bit blocks each half of a slot of `region_count` regions uses.
pub fn blocks_used(region_count: u64) -> usize {
    assert!(region_count <= REGIONS_MAX, "{region_count} regions do not fit a slot");
    blocks_used_any(region_count)
}

fn blocks_used_any(region_count: u64) -> usize {
    region_count.div_ceil(8).div_ceil(BLOCK_BYTES as u64).max(1) as usize
}

/// The bytes of a whole slot image: `dirty` in the first half, `unlogged` in the second, each
/// padded to its half. Written from the slot's start.
pub fn slot_image(dirty: &Bits, unlogged: &Bits) -> Vec<u8> {
    let half = HALF_BLOCKS * BLOCK_BYTES;
    [dirty.to_bytes(half), unlogged.to_bytes(half)].concat()
}

/// One slot as a member holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotBits {
    pub dirty: Bits,
    pub unlogged: Bits,
}

/// What one member's area holds: its header (or why not) and every slot's bits.
pub struct AreaContents {
    pub header: Result<Header, String>,
    /// Per slot, its bits (for a version-1 area, the unlogged bits are the dirty ones).
    pub slots: Vec<SlotBits>,
}

/// Reads a member's whole area (one I/O). Blocks: control plane only.
pub fn read_area(drive: &dyn Drive, region_count: u64) -> Result<AreaContents, DriveError> {
    let op = DriveOp::Read { offset_bytes: BITMAP_AREA_OFFSET_BYTES, buf: IoBuf::zeroed(BITMAP_AREA_BYTES as usize) };
    let completion = submit_and_wait(drive, op)?;
    let bytes = completion.buf.expect("a read returns its buffer");
    let bytes = bytes.as_slice();
    let header = Header::decode(&bytes[..HEADER_BYTES as usize]);
    let v1 = header.as_ref().is_ok_and(|h| h.version == VERSION_V1);
    let fits = region_count <= if v1 { REGIONS_MAX_V1 } else { REGIONS_MAX };
    let used_bytes = blocks_used_any(region_count) * BLOCK_BYTES;
    let slots = (0..SLOT_COUNT)
        .map(|slot| {
            let start = (HEADER_BYTES + slot as u64 * SLOT_BYTES) as usize;
            let half = |at: usize| Bits::from_bytes(&bytes[at..at + used_bytes], region_count);
            match (v1, fits) {
                (_, false) => SlotBits { dirty: Bits::new(region_count), unlogged: Bits::new(region_count) },
                (true, true) => SlotBits { dirty: half(start), unlogged: half(start) },
                (false, true) => SlotBits { dirty: half(start), unlogged: half(start + HALF_BLOCKS * BLOCK_BYTES) },
            }
        })
        .collect();
    let header = header.and_then(|h| match fits {
        true => Ok(h),
        false => Err(format!("a bitmap of version {} cannot hold {region_count} regions", h.version)),
    });
    Ok(AreaContents { header, slots })
}

/// Writes `bytes` at `offset_bytes` and flushes. Blocks: control plane only.
pub fn write_and_flush(drive: &dyn Drive, offset_bytes: u64, bytes: &[u8]) -> Result<(), DriveError> {
    submit_and_wait(drive, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(bytes) })?;
    submit_and_wait(drive, DriveOp::Flush)?;
    Ok(())
}

/// Writes `bits` (whole blocks) from the start of slot `slot` on: one slot's image, or several
/// slots at once. Does not flush.
pub fn write_slot(drive: &dyn Drive, slot: usize, bits: &[u8]) -> Result<(), DriveError> {
    assert!(bits.len().is_multiple_of(BLOCK_BYTES), "whole blocks");
    submit_and_wait(drive, DriveOp::Write { offset_bytes: block_offset_bytes(slot, 0), buf: IoBuf::from_slice(bits) })?;
    Ok(())
}

/// Writes the header and flushes.
pub fn write_header(drive: &dyn Drive, header: &Header) -> Result<(), DriveError> {
    write_and_flush(drive, BITMAP_AREA_OFFSET_BYTES, &header.encode())
}

pub fn flush(drive: &dyn Drive) -> Result<(), DriveError> {
    submit_and_wait(drive, DriveOp::Flush).map(drop)
}
