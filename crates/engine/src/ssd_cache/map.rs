//! The line table kept on the cache VD: which slot holds which line of which VD, and whether
//! the line is dirty (write-back: newer on the cache VD than on its VD). Byte tables in
//! docs/on-disk-format.md ("SSD cache map header", "SSD cache map entry"), checked against the
//! [`Field`] tables here by the test below.
//!
//! The table lives past the last slot: a header block, then one 32-byte entry per slot, 128 to
//! a 4 KiB block, each with its own checksum (a torn block write leaves every 512-byte sector,
//! and so every entry, old or new: no entry straddles a sector). The header says how far the
//! entries can be trusted:
//! - `running` (written, and flushed, before the first request after a start): only the
//!   dirty flags are true. Fills do not write the table, so a valid clean entry may name a line
//!   the slot no longer holds; a dirty entry is written (and flushed) before the first write
//!   that makes its line dirty is acknowledged, and a slot leaves a dirty line only after its
//!   entry says so on disk ([`super::lines`]).
//! - `clean` (written at a clean stop, after the whole table, once nothing moves): every entry
//!   is true, for the configuration generation it names. A start at that generation is warm;
//!   at any other it keeps the dirty lines only (they are the newest data of their VDs, whatever
//!   the configuration did since; a clean line could be older than its VD).

use crate::metadata::{tiles, Field};

/// Bytes of the header block.
pub(crate) const HEADER_BYTES: usize = 4096;
/// Bytes of one entry.
pub(crate) const ENTRY_BYTES: usize = 32;
/// Bytes of one table block: the unit the table is written in.
pub(crate) const BLOCK_BYTES: usize = 4096;
pub(crate) const ENTRIES_PER_BLOCK: u32 = (BLOCK_BYTES / ENTRY_BYTES) as u32;
pub(crate) const MAGIC: [u8; 8] = *b"STORCSCM";
/// Version 1 (a list of valid lines written at a clean stop) is not read: a cache of version 1
/// starts cold, which a write-through cache can afford.
pub(crate) const VERSION: u32 = 2;
pub(crate) const STATE_RUNNING: u32 = 1;
pub(crate) const STATE_CLEAN: u32 = 2;
pub(crate) const HEADER_FLAG_WRITE_BACK: u32 = 1;
pub(crate) const ENTRY_FLAG_VALID: u32 = 1;
pub(crate) const ENTRY_FLAG_DIRTY: u32 = 2;

pub(crate) mod header {
    use super::Field;
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const LINE_BYTES: Field = Field::new("line_bytes", 12, 4);
    pub const CONTROLLER_ID: Field = Field::new("controller_id", 16, 16);
    pub const GENERATION: Field = Field::new("generation", 32, 8);
    pub const SLOT_COUNT: Field = Field::new("slot_count", 40, 8);
    pub const STATE: Field = Field::new("state", 48, 4);
    pub const FLAGS: Field = Field::new("flags", 52, 4);
    pub const RESERVED: Field = Field::new("reserved", 56, 4036);
    pub const HEADER_CRC32C: Field = Field::new("header_crc32c", 4092, 4);
    pub const ALL: [Field; 10] = [MAGIC, VERSION, LINE_BYTES, CONTROLLER_ID, GENERATION, SLOT_COUNT, STATE, FLAGS, RESERVED, HEADER_CRC32C];
}

pub(crate) mod entry {
    use super::Field;
    pub const VD_ID: Field = Field::new("vd_id", 0, 4);
    pub const FLAGS: Field = Field::new("flags", 4, 4);
    pub const LINE: Field = Field::new("line", 8, 8);
    pub const RESERVED: Field = Field::new("reserved", 16, 12);
    pub const ENTRY_CRC32C: Field = Field::new("entry_crc32c", 28, 4);
    pub const ALL: [Field; 5] = [VD_ID, FLAGS, LINE, RESERVED, ENTRY_CRC32C];
}

const _: () = assert!(tiles(&header::ALL, HEADER_BYTES) && tiles(&entry::ALL, ENTRY_BYTES));

/// A slot's line read back: VD `vd_id`'s line `line` is in slot `slot`, `dirty` or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub vd_id: u32,
    pub slot: u32,
    pub line: u64,
    pub dirty: bool,
}

/// What one slot's entry says (`None` in an image: the slot holds nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotEntry {
    pub vd_id: u32,
    pub line: u64,
    pub dirty: bool,
}

/// Whose table it is: a table is read only by the same controller, for the same line size and
/// slot count; its clean lines only at the configuration generation it was saved with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapOwner {
    pub controller_id: u128,
    pub generation: u64,
}

/// A header read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub generation: u64,
    pub clean: bool,
    pub write_back: bool,
}

/// Where the header starts on a cache VD of `slot_count` slots of `line_bytes`.
pub(crate) fn map_offset_bytes(slot_count: u32, line_bytes: u64) -> u64 {
    u64::from(slot_count) * line_bytes
}

/// Where table block `block` starts.
pub(crate) fn block_offset_bytes(slot_count: u32, line_bytes: u64, block: u32) -> u64 {
    map_offset_bytes(slot_count, line_bytes) + HEADER_BYTES as u64 + u64::from(block) * BLOCK_BYTES as u64
}

pub(crate) fn block_count(slot_count: u32) -> u32 {
    slot_count.div_ceil(ENTRIES_PER_BLOCK)
}

/// Bytes the header and the table take for `slot_count` slots.
pub(crate) fn map_bytes(slot_count: u32) -> u64 {
    HEADER_BYTES as u64 + u64::from(block_count(slot_count)) * BLOCK_BYTES as u64
}

/// The most slots of `line_bytes` a cache VD of `capacity_bytes` holds beside their table.
pub(crate) fn slot_count_for(capacity_bytes: u64, line_bytes: u64) -> u32 {
    let mut slots =
        (capacity_bytes.saturating_sub(HEADER_BYTES as u64) / (line_bytes + ENTRY_BYTES as u64)).min(u64::from(u32::MAX)) as u32;
    while slots > 0 && map_offset_bytes(slots, line_bytes) + map_bytes(slots) > capacity_bytes {
        slots -= 1;
    }
    slots
}

fn put(buf: &mut [u8], field: Field, bytes: &[u8]) {
    buf[field.range()].copy_from_slice(bytes);
}

fn get<const N: usize>(buf: &[u8], field: Field) -> [u8; N] {
    buf[field.range()].try_into().expect("field size")
}

pub(crate) fn encode_header(owner: MapOwner, line_bytes: u64, slot_count: u32, clean: bool, write_back: bool) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    put(&mut h, header::MAGIC, &MAGIC);
    put(&mut h, header::VERSION, &VERSION.to_le_bytes());
    put(&mut h, header::LINE_BYTES, &(line_bytes as u32).to_le_bytes());
    put(&mut h, header::CONTROLLER_ID, &owner.controller_id.to_le_bytes());
    put(&mut h, header::GENERATION, &owner.generation.to_le_bytes());
    put(&mut h, header::SLOT_COUNT, &u64::from(slot_count).to_le_bytes());
    let state = if clean { STATE_CLEAN } else { STATE_RUNNING };
    put(&mut h, header::STATE, &state.to_le_bytes());
    let flags = if write_back { HEADER_FLAG_WRITE_BACK } else { 0 };
    put(&mut h, header::FLAGS, &flags.to_le_bytes());
    let crc = crc32c::crc32c(&h[..header::HEADER_CRC32C.offset]);
    put(&mut h, header::HEADER_CRC32C, &crc.to_le_bytes());
    h
}

/// The header, if it is a table of `controller_id`'s for this geometry; `None` for anything
/// else (zeros, version 1, another controller, a torn or foreign block).
pub(crate) fn decode_header(block: &[u8], controller_id: u128, line_bytes: u64, slot_count: u32) -> Option<Header> {
    let crc = u32::from_le_bytes(get(block, header::HEADER_CRC32C));
    let state = u32::from_le_bytes(get(block, header::STATE));
    let ours = get::<8>(block, header::MAGIC) == MAGIC
        && crc == crc32c::crc32c(&block[..header::HEADER_CRC32C.offset])
        && u32::from_le_bytes(get(block, header::VERSION)) == VERSION
        && u64::from(u32::from_le_bytes(get(block, header::LINE_BYTES))) == line_bytes
        && u128::from_le_bytes(get(block, header::CONTROLLER_ID)) == controller_id
        && u64::from_le_bytes(get(block, header::SLOT_COUNT)) == u64::from(slot_count)
        && matches!(state, STATE_RUNNING | STATE_CLEAN);
    ours.then(|| Header {
        generation: u64::from_le_bytes(get(block, header::GENERATION)),
        clean: state == STATE_CLEAN,
        write_back: u32::from_le_bytes(get(block, header::FLAGS)) & HEADER_FLAG_WRITE_BACK != 0,
    })
}

/// One table block's bytes from the entries of its slots (fewer than a block's worth for the
/// last block: the rest stays zeros, which no entry decodes from).
pub(crate) fn encode_block(image: &[Option<SlotEntry>]) -> Vec<u8> {
    assert!(image.len() <= ENTRIES_PER_BLOCK as usize, "one block holds {ENTRIES_PER_BLOCK} entries");
    let mut out = vec![0u8; BLOCK_BYTES];
    for (bytes, slot) in out.chunks_exact_mut(ENTRY_BYTES).zip(image) {
        let Some(e) = slot else { continue };
        let flags = ENTRY_FLAG_VALID | if e.dirty { ENTRY_FLAG_DIRTY } else { 0 };
        put(bytes, entry::VD_ID, &e.vd_id.to_le_bytes());
        put(bytes, entry::FLAGS, &flags.to_le_bytes());
        put(bytes, entry::LINE, &e.line.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..entry::ENTRY_CRC32C.offset]);
        put(bytes, entry::ENTRY_CRC32C, &crc.to_le_bytes());
    }
    out
}

/// The entries of a table block whose first slot is `first_slot`: those whose checksum
/// matches, that are valid and name a slot below `slot_count`.
pub(crate) fn decode_block(block: &[u8], first_slot: u32, slot_count: u32) -> Vec<MapEntry> {
    let mut entries = Vec::new();
    for (index, bytes) in block.chunks_exact(ENTRY_BYTES).enumerate() {
        let slot = first_slot + index as u32;
        let crc = u32::from_le_bytes(get(bytes, entry::ENTRY_CRC32C));
        let flags = u32::from_le_bytes(get(bytes, entry::FLAGS));
        if slot >= slot_count || crc != crc32c::crc32c(&bytes[..entry::ENTRY_CRC32C.offset]) || flags & ENTRY_FLAG_VALID == 0 {
            continue;
        }
        let vd_id = u32::from_le_bytes(get(bytes, entry::VD_ID));
        let line = u64::from_le_bytes(get(bytes, entry::LINE));
        entries.push(MapEntry { vd_id, slot, line, dirty: flags & ENTRY_FLAG_DIRTY != 0 });
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: MapOwner = MapOwner { controller_id: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, generation: 42 };

    #[test]
    fn doc_tables_match_the_code() {
        crate::metadata::tests::check_byte_table("SSD cache map header", &header::ALL);
        crate::metadata::tests::check_byte_table("SSD cache map entry", &entry::ALL);
    }

    #[test]
    fn a_header_reads_back_only_for_its_controller_and_geometry() {
        let h = encode_header(OWNER, 65536, 10, true, true);
        let read = decode_header(&h, OWNER.controller_id, 65536, 10).expect("ours");
        assert_eq!(read, Header { generation: 42, clean: true, write_back: true });
        let running = decode_header(&encode_header(OWNER, 65536, 10, false, false), OWNER.controller_id, 65536, 10).unwrap();
        assert!(!running.clean && !running.write_back);
        assert_eq!(decode_header(&h, OWNER.controller_id + 1, 65536, 10), None, "another controller");
        assert_eq!(decode_header(&h, OWNER.controller_id, 65536, 11), None, "another slot count");
        assert_eq!(decode_header(&h, OWNER.controller_id, 4096, 10), None, "another line size");
        assert_eq!(decode_header(&[0; HEADER_BYTES], OWNER.controller_id, 65536, 10), None, "zeros");
        let mut torn = h.clone();
        torn[20] ^= 1;
        assert_eq!(decode_header(&torn, OWNER.controller_id, 65536, 10), None, "a torn header");
    }

    #[test]
    fn entries_read_back_each_on_its_own_checksum() {
        let mut image = vec![None; ENTRIES_PER_BLOCK as usize];
        image[0] = Some(SlotEntry { vd_id: 3, line: 1 << 40, dirty: true });
        image[5] = Some(SlotEntry { vd_id: 0, line: 7, dirty: false });
        image[127] = Some(SlotEntry { vd_id: 1, line: 9, dirty: true });
        let mut block = encode_block(&image);
        let read = decode_block(&block, 128, 1000);
        assert_eq!(
            read,
            vec![
                MapEntry { vd_id: 3, slot: 128, line: 1 << 40, dirty: true },
                MapEntry { vd_id: 0, slot: 133, line: 7, dirty: false },
                MapEntry { vd_id: 1, slot: 255, line: 9, dirty: true },
            ]
        );
        // A torn entry is lost alone; a slot past the table is not read.
        block[5 * ENTRY_BYTES + 9] ^= 1;
        assert_eq!(decode_block(&block, 128, 1000).len(), 2);
        assert_eq!(decode_block(&block, 128, 200).len(), 1);
        assert!(decode_block(&[0; BLOCK_BYTES], 0, 1000).is_empty(), "zeros are no entries");
    }

    #[test]
    fn slots_and_their_table_fit_the_cache_vd() {
        for capacity in [65536 * 3 + 8192, 1 << 30, (1 << 30) + 12345 * 512, 3 << 30] {
            let slots = slot_count_for(capacity, 65536);
            assert!(map_offset_bytes(slots, 65536) + map_bytes(slots) <= capacity, "{capacity}");
            assert!(map_offset_bytes(slots + 1, 65536) + map_bytes(slots + 1) > capacity, "{capacity}: one more slot would fit");
        }
        assert_eq!(slot_count_for(4096, 65536), 0);
        assert_eq!(block_offset_bytes(10, 65536, 1), 10 * 65536 + 4096 + 4096);
    }
}
