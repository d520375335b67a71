//! Where each field of the metadata's records lies: the byte tables of docs/on-disk-format.md,
//! checked against these by `metadata::tests::doc_tables_match_the_code`, and at compile time
//! to tile their records.

use super::HEADER_BYTES;
use crate::config::VD_NAME_BYTES_MAX;
use std::ops::Range;

/// One fixed-size field of an on-disk record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

impl Field {
    pub(crate) const fn new(name: &'static str, offset: usize, size: usize) -> Field {
        Field { name, offset, size }
    }

    pub(crate) fn range(self) -> Range<usize> {
        self.offset..self.offset + self.size
    }
}

/// Whether `fields` cover `[0, total_bytes)` in order, with no gap and no overlap.
pub(crate) const fn tiles(fields: &[Field], total_bytes: usize) -> bool {
    let mut end = 0;
    let mut index = 0;
    while index < fields.len() {
        if fields[index].offset != end || fields[index].size == 0 {
            return false;
        }
        end += fields[index].size;
        index += 1;
    }
    end == total_bytes
}

pub(crate) mod header {
    use super::{Field, HEADER_BYTES};
    pub const MAGIC: Field = Field::new("magic", 0, 8);
    pub const VERSION: Field = Field::new("format_version", 8, 4);
    pub const FLAGS: Field = Field::new("flags", 12, 4);
    pub const CONTROLLER_ID: Field = Field::new("controller_id", 16, 16);
    pub const DRIVE_ID: Field = Field::new("drive_id", 32, 16);
    pub const SLOT: Field = Field::new("slot", 48, 4);
    pub const COPY_INDEX: Field = Field::new("copy_index", 52, 4);
    pub const GENERATION: Field = Field::new("generation", 56, 8);
    pub const CAPACITY_BYTES: Field = Field::new("capacity_bytes", 64, 8);
    pub const PAYLOAD_BYTES: Field = Field::new("payload_bytes", 72, 4);
    pub const PAYLOAD_CRC32C: Field = Field::new("payload_crc32c", 76, 4);
    pub const WRITTEN_UNIX_NS: Field = Field::new("written_unix_ns", 80, 8);
    pub const RESERVED: Field = Field::new("reserved", 88, 4004);
    /// Covers bytes `[0, 4092)`: everything but itself.
    pub const HEADER_CRC32C: Field = Field::new("header_crc32c", 4092, 4);
    pub const ALL: [Field; 14] = [
        MAGIC,
        VERSION,
        FLAGS,
        CONTROLLER_ID,
        DRIVE_ID,
        SLOT,
        COPY_INDEX,
        GENERATION,
        CAPACITY_BYTES,
        PAYLOAD_BYTES,
        PAYLOAD_CRC32C,
        WRITTEN_UNIX_NS,
        RESERVED,
        HEADER_CRC32C,
    ];
    const _: () = assert!(HEADER_BYTES == 4096);
    const _: () = assert!(super::tiles(&ALL, HEADER_BYTES));
    const _: () = assert!(HEADER_CRC32C.offset + HEADER_CRC32C.size == HEADER_BYTES);
}

/// The start of the payload: how many records of each kind follow.
pub(crate) mod counts {
    use super::Field;
    pub const BYTES: usize = 48;
    /// Versions 1 to 5 end the counts after `bgi_rate_percent`'s byte.
    pub const BYTES_V5: usize = 16;
    pub const DRIVE_COUNT: Field = Field::new("drive_count", 0, 4);
    pub const VD_COUNT: Field = Field::new("vd_count", 4, 4);
    pub const HOT_SPARE_COUNT: Field = Field::new("hot_spare_count", 8, 4);
    /// Version 3: controller settings in what versions 1 and 2 kept reserved.
    pub const CONTROLLER_FLAGS: Field = Field::new("controller_flags", 12, 1);
    pub const REBUILD_RATE_PERCENT: Field = Field::new("rebuild_rate_percent", 13, 1);
    /// Version 5: the consistency check rate, in what versions 3 and 4 kept reserved.
    pub const CC_RATE_PERCENT: Field = Field::new("cc_rate_percent", 14, 1);
    /// Version 6: the background initialization rate, in what version 5 kept reserved.
    pub const BGI_RATE_PERCENT: Field = Field::new("bgi_rate_percent", 15, 1);
    /// Version 5: byte 15 is reserved.
    pub const RESERVED_V5: Field = Field::new("reserved", 15, 1);
    /// Versions 3 and 4: bytes 14 and 15 are reserved.
    pub const RESERVED_V4: Field = Field::new("reserved", 14, 2);
    /// Versions 1 and 2: everything after the counts is reserved.
    pub const RESERVED_V2: Field = Field::new("reserved", 12, 4);
    /// Version 6: patrol read.
    pub const PATROL_FLAGS: Field = Field::new("patrol_flags", 16, 1);
    pub const PATROL_RATE_PERCENT: Field = Field::new("patrol_rate_percent", 17, 1);
    pub const PATROL_DELAY_HOURS: Field = Field::new("patrol_delay_hours", 18, 2);
    pub const CC_MODE: Field = Field::new("cc_mode", 20, 1);
    /// Version 8: legs of a mirrored journal that must not be replayed (reserved zero before).
    pub const JOURNAL_STALE_LEGS: Field = Field::new("journal_stale_legs", 21, 1);
    pub const JOURNAL_STALE_LEGS_KNOWN: u8 = 0b11;
    pub const CC_DELAY_HOURS: Field = Field::new("cc_delay_hours", 22, 2);
    pub const PATROL_LAST_START_UNIX_SECS: Field = Field::new("patrol_last_start_unix_secs", 24, 8);
    pub const CC_NEXT_START_UNIX_SECS: Field = Field::new("cc_next_start_unix_secs", 32, 8);
    /// Version 7: the journal the cache trusts, in what version 6 kept reserved.
    pub const JOURNAL_ID: Field = Field::new("journal_id", 40, 8);
    /// Version 6: bytes 40 to 47 are reserved.
    pub const RESERVED_TAIL_V6: Field = Field::new("reserved", 40, 8);
    pub const ALL: [Field; 16] = [
        DRIVE_COUNT,
        VD_COUNT,
        HOT_SPARE_COUNT,
        CONTROLLER_FLAGS,
        REBUILD_RATE_PERCENT,
        CC_RATE_PERCENT,
        BGI_RATE_PERCENT,
        PATROL_FLAGS,
        PATROL_RATE_PERCENT,
        PATROL_DELAY_HOURS,
        CC_MODE,
        JOURNAL_STALE_LEGS,
        CC_DELAY_HOURS,
        PATROL_LAST_START_UNIX_SECS,
        CC_NEXT_START_UNIX_SECS,
        JOURNAL_ID,
    ];
    /// `patrol_flags` bit 0: patrol read is off; bit 1: it starts only by hand (mode manual);
    /// bit 2: it reads solid-state drives too.
    pub const PATROL_OFF: u8 = 1;
    pub const PATROL_MANUAL: u8 = 2;
    pub const PATROL_INCLUDE_SSDS: u8 = 4;
    pub const PATROL_FLAGS_KNOWN: u8 = PATROL_OFF | PATROL_MANUAL | PATROL_INCLUDE_SSDS;
    /// `controller_flags` bit 0: automatic rebuild onto hot spares is off (0 keeps the default, on).
    pub const FLAG_AUTO_REBUILD_OFF: u8 = 1;
    /// Bit 1 (version 4): copyback onto a replaced member's slot is off.
    pub const FLAG_COPYBACK_OFF: u8 = 2;
    pub const FLAGS_KNOWN_V3: u8 = FLAG_AUTO_REBUILD_OFF;
    pub const FLAGS_KNOWN: u8 = FLAG_AUTO_REBUILD_OFF | FLAG_COPYBACK_OFF;
    const _: () = assert!(BYTES == 48 && BYTES_V5 == PATROL_FLAGS.offset);
    const _: () = assert!(super::tiles(&ALL, BYTES));
}

pub(crate) mod drive_record {
    use super::Field;
    pub const BYTES: usize = 48;
    /// Versions 1 and 2 end before `rebuild_row`.
    pub const BYTES_V2: usize = 32;
    /// Version 3 ends before `copy_slot`.
    pub const BYTES_V3: usize = 40;
    pub const SLOT: Field = Field::new("slot", 0, 4);
    pub const STATE: Field = Field::new("state", 4, 1);
    pub const RESERVED: Field = Field::new("reserved", 5, 3);
    pub const DRIVE_ID: Field = Field::new("drive_id", 8, 16);
    pub const CAPACITY_BYTES: Field = Field::new("capacity_bytes", 24, 8);
    pub const REBUILD_ROW: Field = Field::new("rebuild_row", 32, 8);
    pub const COPY_SLOT: Field = Field::new("copy_slot", 40, 4);
    pub const RESERVED_TAIL: Field = Field::new("reserved", 44, 4);
    pub const ALL: [Field; 8] = [SLOT, STATE, RESERVED, DRIVE_ID, CAPACITY_BYTES, REBUILD_ROW, COPY_SLOT, RESERVED_TAIL];
    /// `copy_slot` of a drive with no other end of a copy.
    pub const NO_SLOT: u32 = u32::MAX;
    const _: () = assert!(BYTES == 48 && BYTES_V2 == REBUILD_ROW.offset && BYTES_V3 == COPY_SLOT.offset);
    const _: () = assert!(super::tiles(&ALL, BYTES));
}

/// The fixed part of a VD record; `member_count` little-endian u32 member slots follow it, then
/// (version 4) `bad_block_count` bad-block entries.
pub(crate) mod vd_record {
    use super::{Field, VD_NAME_BYTES_MAX};
    pub const BYTES: usize = 80;
    /// Format version 1 ends the fixed part before `member_size_bytes`.
    pub const BYTES_V1: usize = 64;
    /// Format versions 2 and 3 end it before `bad_block_count`.
    pub const BYTES_V3: usize = 72;
    pub const VD_ID: Field = Field::new("vd_id", 0, 4);
    pub const DRIVE_GROUP: Field = Field::new("drive_group", 4, 4);
    pub const LEVEL: Field = Field::new("level", 8, 1);
    pub const WRITE_POLICY: Field = Field::new("write_policy", 9, 1);
    pub const READ_POLICY: Field = Field::new("read_policy", 10, 1);
    pub const IO_POLICY: Field = Field::new("io_policy", 11, 1);
    pub const DRIVES_PER_SPAN: Field = Field::new("drives_per_span", 12, 4);
    pub const STRIP_SIZE_BYTES: Field = Field::new("strip_size_bytes", 16, 8);
    pub const MEMBER_COUNT: Field = Field::new("member_count", 24, 4);
    pub const NAME_LEN: Field = Field::new("name_len", 28, 1);
    /// Version 6: flags, in the first byte versions 1 to 5 kept reserved.
    pub const VD_FLAGS: Field = Field::new("vd_flags", 29, 1);
    /// Version 13: the sequential cutoff, in the bytes versions 6 to 12 kept reserved.
    pub const SEQ_CUTOFF_MIB: Field = Field::new("seq_cutoff_mib", 30, 2);
    /// Versions 6 to 12: bytes 30 and 31 are reserved.
    pub const RESERVED_V12: Field = Field::new("reserved", 30, 2);
    /// `seq_cutoff_mib` of a VD whose writes all go through the journal (`SeqCutoff::Never`);
    /// 0 is the level's default, other values MiB.
    pub const SEQ_CUTOFF_NEVER: u16 = u16::MAX;
    /// Versions 1 to 5: bytes 29 to 31 are reserved.
    pub const RESERVED_V5: Field = Field::new("reserved", 29, 3);
    pub const NAME: Field = Field::new("name", 32, VD_NAME_BYTES_MAX);
    pub const MEMBER_SIZE_BYTES: Field = Field::new("member_size_bytes", 64, 8);
    pub const BAD_BLOCK_COUNT: Field = Field::new("bad_block_count", 72, 4);
    /// Version 10: the cache VD caching this VD, in the bytes versions 4 to 9 kept reserved.
    pub const SSD_CACHE_VD_ID: Field = Field::new("ssd_cache_vd_id", 76, 4);
    /// Versions 4 to 9: bytes 76 to 79 are reserved.
    pub const RESERVED_TAIL: Field = Field::new("reserved", 76, 4);
    /// `ssd_cache_vd_id` of a VD no cache VD caches.
    pub const NO_SSD_CACHE: u32 = u32::MAX;
    pub const ALL: [Field; 16] = [
        VD_ID,
        DRIVE_GROUP,
        LEVEL,
        WRITE_POLICY,
        READ_POLICY,
        IO_POLICY,
        DRIVES_PER_SPAN,
        STRIP_SIZE_BYTES,
        MEMBER_COUNT,
        NAME_LEN,
        VD_FLAGS,
        SEQ_CUTOFF_MIB,
        NAME,
        MEMBER_SIZE_BYTES,
        BAD_BLOCK_COUNT,
        SSD_CACHE_VD_ID,
    ];
    const _: () = assert!(BYTES == 80 && BYTES_V1 == MEMBER_SIZE_BYTES.offset && BYTES_V3 == BAD_BLOCK_COUNT.offset);
    const _: () = assert!(super::tiles(&ALL, BYTES));
    const _: () = assert!(VD_NAME_BYTES_MAX <= u8::MAX as usize, "name_len is one byte");
    /// `vd_flags` bit 0: background initialization has not completed (see `VdRecord::bgi_pending`).
    pub const FLAG_BGI_PENDING: u8 = 1;
    /// `vd_flags` bit 1 (version 10): a cache VD (see `VdRecord::cache_vd`).
    pub const FLAG_CACHE_VD: u8 = 2;
    /// `vd_flags` bit 2 (version 11): a cache VD that caches write-back.
    pub const FLAG_CACHE_WRITE_BACK: u8 = 4;
    /// The flags versions 6 to 9 know.
    pub const FLAGS_KNOWN_V9: u8 = FLAG_BGI_PENDING;
    /// The flags version 10 knows.
    pub const FLAGS_KNOWN_V10: u8 = FLAG_BGI_PENDING | FLAG_CACHE_VD;
    pub const FLAGS_KNOWN: u8 = FLAG_BGI_PENDING | FLAG_CACHE_VD | FLAG_CACHE_WRITE_BACK;
}

/// The fixed part of a hot spare record; `dedicated_count` u32 drive groups follow it.
pub(crate) mod hot_spare_record {
    use super::Field;
    pub const BYTES: usize = 8;
    pub const SLOT: Field = Field::new("slot", 0, 4);
    pub const DEDICATED_COUNT: Field = Field::new("dedicated_count", 4, 4);
    pub const ALL: [Field; 2] = [SLOT, DEDICATED_COUNT];
    const _: () = assert!(BYTES == 8);
    const _: () = assert!(super::tiles(&ALL, BYTES));
}

/// One entry of a VD's bad-block list (version 4): a VD byte range whose data is lost.
pub(crate) mod bad_block {
    use super::Field;
    pub const BYTES: usize = 16;
    pub const OFFSET_BYTES: Field = Field::new("offset_bytes", 0, 8);
    pub const LEN_BYTES: Field = Field::new("len_bytes", 8, 8);
    pub const ALL: [Field; 2] = [OFFSET_BYTES, LEN_BYTES];
    const _: () = assert!(super::tiles(&ALL, BYTES));
}
