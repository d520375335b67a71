//! The record header: the one block kind with a body (a data or group record's data, a row
//! image's member writes), checked on its own before the body is read.

use super::{
    check_block, get_u32, get_u64, page_crcs, put, record, record_bytes_for, seal, Seed, BLOCK_BYTES, FORMAT_VERSION, IMAGE_ENTRIES_MAX,
    IMAGE_ENTRY_BYTES, KIND_DATA, KIND_GROUP, KIND_IMAGE, KIND_WRAP, PAGE_CRCS_MAX, RECORD_DATA_BYTES_MAX, RECORD_MAGIC,
};

/// What a record header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: u32,
    pub journal_id: u64,
    pub sequence: u64,
    pub position_bytes: u64,
    /// The header and its data pages (the data rounded up to whole blocks).
    pub record_bytes: u32,
    pub vd_id: u32,
    pub vd_offset_bytes: u64,
    pub data_bytes: u32,
    /// CRC-32C (seeded) of each 4 KiB page of the data, the last one zero-padded.
    pub page_crc32c: Vec<u32>,
    /// An image record's member writes (a group record's VD writes, see [`GroupEntry`]), in the
    /// order of their bytes in the data.
    pub entries: Vec<ImageEntry>,
}

/// One VD write of a group record. On the device it takes an [`ImageEntry`]'s 16 bytes, the VD
/// id where an image names the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    pub vd_id: u32,
    pub len_bytes: u32,
    pub vd_offset_bytes: u64,
}

/// One member write of a row image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageEntry {
    /// The member's index in the VD.
    pub member: u32,
    pub len_bytes: u32,
    pub member_offset_bytes: u64,
}

impl RecordHeader {
    /// The header of a data record of `data` (at most [`RECORD_DATA_BYTES_MAX`]).
    pub fn data(
        seed: Seed,
        journal_id: u64,
        sequence: u64,
        position_bytes: u64,
        vd_id: u32,
        vd_offset_bytes: u64,
        data: &[u8],
    ) -> RecordHeader {
        assert!(!data.is_empty() && data.len() as u64 <= RECORD_DATA_BYTES_MAX, "a record carries 1 byte to 1 MiB, not {}", data.len());
        RecordHeader {
            kind: KIND_DATA,
            journal_id,
            sequence,
            position_bytes,
            record_bytes: record_bytes_for(data.len() as u64) as u32,
            vd_id,
            vd_offset_bytes,
            data_bytes: data.len() as u32,
            page_crc32c: page_crcs(seed, data),
            entries: Vec::new(),
        }
    }

    /// The header of a row image of VD `vd_id`'s row `row`: the member writes `entries`, whose
    /// bytes are `data` one after the other.
    #[allow(clippy::too_many_arguments)]
    pub fn image(
        seed: Seed,
        journal_id: u64,
        sequence: u64,
        position_bytes: u64,
        vd_id: u32,
        row: u64,
        entries: Vec<ImageEntry>,
        data: &[u8],
    ) -> RecordHeader {
        assert!((1..=IMAGE_ENTRIES_MAX).contains(&entries.len()), "an image names 1 to {IMAGE_ENTRIES_MAX} member writes");
        assert_eq!(entries.iter().map(|e| u64::from(e.len_bytes)).sum::<u64>(), data.len() as u64, "the entries cover the data");
        RecordHeader {
            kind: KIND_IMAGE,
            vd_offset_bytes: row,
            entries,
            ..RecordHeader::data(seed, journal_id, sequence, position_bytes, vd_id, 0, data)
        }
    }

    /// The header of a group record: the VD writes `entries`, in the order they were placed,
    /// whose bytes are `data` one after the other.
    pub fn group(seed: Seed, journal_id: u64, sequence: u64, position_bytes: u64, entries: &[GroupEntry], data: &[u8]) -> RecordHeader {
        assert!((1..=IMAGE_ENTRIES_MAX).contains(&entries.len()), "a group names 1 to {IMAGE_ENTRIES_MAX} writes");
        assert_eq!(entries.iter().map(|e| u64::from(e.len_bytes)).sum::<u64>(), data.len() as u64, "the entries cover the data");
        let entries = entries
            .iter()
            .map(|e| ImageEntry { member: e.vd_id, len_bytes: e.len_bytes, member_offset_bytes: e.vd_offset_bytes })
            .collect();
        RecordHeader { kind: KIND_GROUP, entries, ..RecordHeader::data(seed, journal_id, sequence, position_bytes, 0, 0, data) }
    }

    /// A group record's VD writes, in order (empty for other kinds).
    pub fn group_entries(&self) -> Vec<GroupEntry> {
        if self.kind != KIND_GROUP {
            return Vec::new();
        }
        self.entries
            .iter()
            .map(|e| GroupEntry { vd_id: e.member, len_bytes: e.len_bytes, vd_offset_bytes: e.member_offset_bytes })
            .collect()
    }

    /// The header of a wrap record at `position_bytes`.
    pub fn wrap(journal_id: u64, sequence: u64, position_bytes: u64) -> RecordHeader {
        RecordHeader {
            kind: KIND_WRAP,
            journal_id,
            sequence,
            position_bytes,
            record_bytes: BLOCK_BYTES as u32,
            vd_id: 0,
            vd_offset_bytes: 0,
            data_bytes: 0,
            page_crc32c: Vec::new(),
            entries: Vec::new(),
        }
    }

    pub fn encode(&self, seed: Seed) -> Vec<u8> {
        use record as f;
        assert!(self.page_crc32c.len() <= PAGE_CRCS_MAX, "a header holds at most {PAGE_CRCS_MAX} page CRCs");
        let mut bytes = vec![0u8; BLOCK_BYTES as usize];
        put(&mut bytes, f::MAGIC, &RECORD_MAGIC);
        put(&mut bytes, f::VERSION, &FORMAT_VERSION.to_le_bytes());
        put(&mut bytes, f::KIND, &self.kind.to_le_bytes());
        put(&mut bytes, f::JOURNAL_ID, &self.journal_id.to_le_bytes());
        put(&mut bytes, f::SEQUENCE, &self.sequence.to_le_bytes());
        put(&mut bytes, f::POSITION_BYTES, &self.position_bytes.to_le_bytes());
        put(&mut bytes, f::RECORD_BYTES, &self.record_bytes.to_le_bytes());
        put(&mut bytes, f::VD_ID, &self.vd_id.to_le_bytes());
        put(&mut bytes, f::VD_OFFSET_BYTES, &self.vd_offset_bytes.to_le_bytes());
        put(&mut bytes, f::DATA_BYTES, &self.data_bytes.to_le_bytes());
        put(&mut bytes, f::PAGE_COUNT, &(self.page_crc32c.len() as u32).to_le_bytes());
        for (index, crc) in self.page_crc32c.iter().enumerate() {
            let at = f::PAGE_CRC32C.offset + 4 * index;
            bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        }
        assert!(self.entries.len() <= IMAGE_ENTRIES_MAX, "a header holds at most {IMAGE_ENTRIES_MAX} image entries");
        put(&mut bytes, f::ENTRY_COUNT, &(self.entries.len() as u32).to_le_bytes());
        for (index, entry) in self.entries.iter().enumerate() {
            let at = f::ENTRIES.offset + IMAGE_ENTRY_BYTES * index;
            bytes[at..at + 4].copy_from_slice(&entry.member.to_le_bytes());
            bytes[at + 4..at + 8].copy_from_slice(&entry.len_bytes.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&entry.member_offset_bytes.to_le_bytes());
        }
        seal(&mut bytes, seed, f::CRC32C);
        bytes
    }

    /// The header in `bytes`, checked on its own (magic, CRC, version, sizes that agree).
    pub fn decode(bytes: &[u8], seed: Seed) -> Result<RecordHeader, String> {
        use record as f;
        check_block(bytes, seed, RECORD_MAGIC, f::VERSION, f::CRC32C, f::RESERVED, "journal record")?;
        let page_count = get_u32(bytes, f::PAGE_COUNT) as usize;
        if page_count > PAGE_CRCS_MAX {
            return Err(format!("journal record claims {page_count} pages; at most {PAGE_CRCS_MAX}"));
        }
        let page_crc32c = (0..page_count)
            .map(|index| {
                let at = f::PAGE_CRC32C.offset + 4 * index;
                u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
            })
            .collect();
        let entry_count = get_u32(bytes, f::ENTRY_COUNT) as usize;
        if entry_count > IMAGE_ENTRIES_MAX {
            return Err(format!("journal record claims {entry_count} image entries; at most {IMAGE_ENTRIES_MAX}"));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let entries: Vec<ImageEntry> = (0..entry_count)
            .map(|index| {
                let at = f::ENTRIES.offset + IMAGE_ENTRY_BYTES * index;
                ImageEntry {
                    member: u32_at(at),
                    len_bytes: u32_at(at + 4),
                    member_offset_bytes: u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8 bytes")),
                }
            })
            .collect();
        let unused_entries = &bytes[f::ENTRIES.offset + IMAGE_ENTRY_BYTES * entry_count..f::ENTRIES.offset + f::ENTRIES.size];
        if unused_entries.iter().any(|&b| b != 0) {
            return Err("journal record has bytes set past its image entries".into());
        }
        let header = RecordHeader {
            kind: get_u32(bytes, f::KIND),
            journal_id: get_u64(bytes, f::JOURNAL_ID),
            sequence: get_u64(bytes, f::SEQUENCE),
            position_bytes: get_u64(bytes, f::POSITION_BYTES),
            record_bytes: get_u32(bytes, f::RECORD_BYTES),
            vd_id: get_u32(bytes, f::VD_ID),
            vd_offset_bytes: get_u64(bytes, f::VD_OFFSET_BYTES),
            data_bytes: get_u32(bytes, f::DATA_BYTES),
            page_crc32c,
            entries,
        };
        let sized = header.data_bytes > 0
            && u64::from(header.data_bytes) <= RECORD_DATA_BYTES_MAX
            && u64::from(header.record_bytes) == record_bytes_for(u64::from(header.data_bytes))
            && header.page_crc32c.len() as u64 == u64::from(header.data_bytes).div_ceil(BLOCK_BYTES);
        let entries_cover = header.entries.iter().map(|e| u64::from(e.len_bytes)).sum::<u64>() == u64::from(header.data_bytes);
        let consistent = match header.kind {
            KIND_DATA => sized && header.entries.is_empty(),
            KIND_IMAGE => sized && !header.entries.is_empty() && entries_cover,
            KIND_GROUP => sized && !header.entries.is_empty() && entries_cover && header.entries.iter().all(|e| e.len_bytes > 0),
            KIND_WRAP => header.data_bytes == 0 && u64::from(header.record_bytes) == BLOCK_BYTES && page_count == 0 && entry_count == 0,
            _ => false,
        };
        if !consistent {
            return Err(format!("journal record of kind {} has sizes that disagree", header.kind));
        }
        Ok(header)
    }

    /// Whether `data` (this record's data pages, padding included) matches its page CRCs.
    pub fn data_matches(&self, seed: Seed, data: &[u8]) -> bool {
        data.len() as u64 >= u64::from(self.data_bytes) && page_crcs(seed, &data[..self.data_bytes as usize]) == self.page_crc32c
    }
}
