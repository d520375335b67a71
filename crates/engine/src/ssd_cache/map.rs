//! The line map kept on the cache VD across a clean stop, so that the cache starts warm: which
//! slot holds which line of which VD. Byte tables in docs/on-disk-format.md ("SSD cache map"),
//! checked against the [`Field`] tables here by the test below.
//!
//! The map lives past the last slot: a header block, then one 16-byte entry per valid line. It
//! is written only at a clean stop, after the tier stopped changing (no client I/O, no fill in
//! flight), with the configuration generation the stop wrote last; it is read at the next start
//! only if that generation is the one assembled, and it is invalidated (its header zeroed and
//! flushed) before any VD is attached again. A crash, a configuration written by anything else
//! in between, or a torn map: the cache starts cold. A write-through cache loses nothing by
//! starting cold; it must never start with a line older than its VD.

use crate::metadata::{tiles, Field};

/// Bytes of the header block.
pub(crate) const HEADER_BYTES: usize = 4096;
/// Bytes of one entry.
pub(crate) const ENTRY_BYTES: usize = 16;
pub(crate) const MAGIC: [u8; 8] = *b"STORCSCM";
pub(crate) const VERSION: u32 = 1;

pub(crate) mod header {
    use super::Field;
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const LINE_BYTES: Field = Field::new("line_bytes", 12, 4);
    pub const CONTROLLER_ID: Field = Field::new("controller_id", 16, 16);
    pub const GENERATION: Field = Field::new("generation", 32, 8);
    pub const SLOT_COUNT: Field = Field::new("slot_count", 40, 8);
    pub const ENTRY_COUNT: Field = Field::new("entry_count", 48, 8);
    pub const ENTRIES_CRC32C: Field = Field::new("entries_crc32c", 56, 4);
    pub const RESERVED: Field = Field::new("reserved", 60, 4032);
    pub const HEADER_CRC32C: Field = Field::new("header_crc32c", 4092, 4);
    pub const ALL: [Field; 10] =
        [MAGIC, VERSION, LINE_BYTES, CONTROLLER_ID, GENERATION, SLOT_COUNT, ENTRY_COUNT, ENTRIES_CRC32C, RESERVED, HEADER_CRC32C];
}

pub(crate) mod entry {
    use super::Field;
    pub const VD_ID: Field = Field::new("vd_id", 0, 4);
    pub const SLOT: Field = Field::new("slot", 4, 4);
    pub const LINE: Field = Field::new("line", 8, 8);
    pub const ALL: [Field; 3] = [VD_ID, SLOT, LINE];
}

const _: () = assert!(tiles(&header::ALL, HEADER_BYTES) && tiles(&entry::ALL, ENTRY_BYTES));

/// One valid line: VD `vd_id`'s line `line` is in slot `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub vd_id: u32,
    pub slot: u32,
    pub line: u64,
}

/// Whose map it is: a map is read back only by the same controller, at the configuration
/// generation it was written with, for the same line size and slot count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapOwner {
    pub controller_id: u128,
    pub generation: u64,
}

/// Where the map starts on a cache VD of `slot_count` slots of `line_bytes`.
pub(crate) fn map_offset_bytes(slot_count: u32, line_bytes: u64) -> u64 {
    u64::from(slot_count) * line_bytes
}

/// Bytes the map takes for `slot_count` slots, in whole 4 KiB blocks.
pub(crate) fn map_bytes(slot_count: u32) -> u64 {
    (HEADER_BYTES + slot_count as usize * ENTRY_BYTES).next_multiple_of(4096) as u64
}

/// The most slots of `line_bytes` a cache VD of `capacity_bytes` holds beside their map.
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

/// The map's bytes: the header block, then the entries, zero-padded to whole blocks.
pub(crate) fn encode(owner: MapOwner, line_bytes: u64, slot_count: u32, entries: &[MapEntry]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_BYTES];
    for e in entries {
        let mut bytes = [0u8; ENTRY_BYTES];
        put(&mut bytes, entry::VD_ID, &e.vd_id.to_le_bytes());
        put(&mut bytes, entry::SLOT, &e.slot.to_le_bytes());
        put(&mut bytes, entry::LINE, &e.line.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    let entries_crc = crc32c::crc32c(&out[HEADER_BYTES..]);
    let h = &mut out[..HEADER_BYTES];
    put(h, header::MAGIC, &MAGIC);
    put(h, header::VERSION, &VERSION.to_le_bytes());
    put(h, header::LINE_BYTES, &(line_bytes as u32).to_le_bytes());
    put(h, header::CONTROLLER_ID, &owner.controller_id.to_le_bytes());
    put(h, header::GENERATION, &owner.generation.to_le_bytes());
    put(h, header::SLOT_COUNT, &u64::from(slot_count).to_le_bytes());
    put(h, header::ENTRY_COUNT, &(entries.len() as u64).to_le_bytes());
    put(h, header::ENTRIES_CRC32C, &entries_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&h[..header::HEADER_CRC32C.offset]);
    put(h, header::HEADER_CRC32C, &header_crc.to_le_bytes());
    out.resize(out.len().next_multiple_of(4096), 0);
    out
}

/// The entry count a header block announces, if it is a map of `owner`'s for this geometry;
/// `None` for anything else (zeros, another owner or generation, a torn or foreign block).
pub(crate) fn decode_header(block: &[u8], owner: MapOwner, line_bytes: u64, slot_count: u32) -> Option<(u64, u32)> {
    let crc = u32::from_le_bytes(get(block, header::HEADER_CRC32C));
    let ours = get::<8>(block, header::MAGIC) == MAGIC
        && crc == crc32c::crc32c(&block[..header::HEADER_CRC32C.offset])
        && u32::from_le_bytes(get(block, header::VERSION)) == VERSION
        && u64::from(u32::from_le_bytes(get(block, header::LINE_BYTES))) == line_bytes
        && u128::from_le_bytes(get(block, header::CONTROLLER_ID)) == owner.controller_id
        && u64::from_le_bytes(get(block, header::GENERATION)) == owner.generation
        && u64::from_le_bytes(get(block, header::SLOT_COUNT)) == u64::from(slot_count);
    let entry_count = u64::from_le_bytes(get(block, header::ENTRY_COUNT));
    (ours && entry_count <= u64::from(slot_count)).then(|| (entry_count, u32::from_le_bytes(get(block, header::ENTRIES_CRC32C))))
}

/// The entries, if their checksum matches and every slot is in range and used once.
pub(crate) fn decode_entries(bytes: &[u8], expected_crc: u32, slot_count: u32) -> Option<Vec<MapEntry>> {
    if crc32c::crc32c(bytes) != expected_crc {
        return None;
    }
    let entries: Vec<MapEntry> = bytes
        .chunks_exact(ENTRY_BYTES)
        .map(|e| MapEntry {
            vd_id: u32::from_le_bytes(get(e, entry::VD_ID)),
            slot: u32::from_le_bytes(get(e, entry::SLOT)),
            line: u64::from_le_bytes(get(e, entry::LINE)),
        })
        .collect();
    let mut slots: Vec<u32> = entries.iter().map(|e| e.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    (slots.len() == entries.len() && slots.last().is_none_or(|&s| s < slot_count)).then_some(entries)
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
    fn a_map_reads_back_only_for_its_owner_generation_and_geometry_and_whole() {
        let entries = vec![MapEntry { vd_id: 0, slot: 3, line: 77 }, MapEntry { vd_id: 2, slot: 0, line: 1 << 40 }];
        let bytes = encode(OWNER, 65536, 10, &entries);
        assert_eq!(bytes.len(), 4096 * 2);
        let (count, crc) = decode_header(&bytes[..HEADER_BYTES], OWNER, 65536, 10).expect("our map");
        assert_eq!(count, 2);
        let body = &bytes[HEADER_BYTES..HEADER_BYTES + 2 * ENTRY_BYTES];
        assert_eq!(decode_entries(body, crc, 10), Some(entries));
        let later = MapOwner { generation: 43, ..OWNER };
        assert_eq!(decode_header(&bytes[..HEADER_BYTES], later, 65536, 10), None, "another generation");
        assert_eq!(decode_header(&bytes[..HEADER_BYTES], OWNER, 65536, 11), None, "another slot count");
        assert_eq!(decode_header(&[0; HEADER_BYTES], OWNER, 65536, 10), None, "an invalidated map");
        let mut torn = bytes.clone();
        torn[20] ^= 1;
        assert_eq!(decode_header(&torn[..HEADER_BYTES], OWNER, 65536, 10), None, "a torn header");
        let mut flipped = body.to_vec();
        flipped[9] ^= 1;
        assert_eq!(decode_entries(&flipped, crc, 10), None, "a torn entry");
        let twice = encode(OWNER, 65536, 10, &[MapEntry { vd_id: 0, slot: 3, line: 1 }, MapEntry { vd_id: 1, slot: 3, line: 2 }]);
        let (_, crc) = decode_header(&twice[..HEADER_BYTES], OWNER, 65536, 10).unwrap();
        assert_eq!(decode_entries(&twice[HEADER_BYTES..HEADER_BYTES + 32], crc, 10), None, "a slot used twice");
    }

    #[test]
    fn slots_and_their_map_fit_the_cache_vd() {
        for capacity in [65536 * 3 + 8192, 1 << 30, (1 << 30) + 12345 * 512, 3 << 30] {
            let slots = slot_count_for(capacity, 65536);
            assert!(map_offset_bytes(slots, 65536) + map_bytes(slots) <= capacity, "{capacity}");
            assert!(map_offset_bytes(slots + 1, 65536) + map_bytes(slots + 1) > capacity, "{capacity}: one more slot would fit");
        }
        assert_eq!(slot_count_for(4096, 65536), 0);
    }
}
