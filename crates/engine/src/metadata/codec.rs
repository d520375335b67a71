//! The bytes of one metadata copy: a 4096-byte header, then the configuration (the payload).
//!
//! Every field is little-endian at a fixed offset given by a [`Field`] table below; the same
//! tables are in docs/on-disk-format.md, and a unit test checks that the two agree. Enums are
//! stored as explicit codes (never the Rust declaration order), and code 0 is never valid, so
//! that zeroed bytes do not decode as a plausible record.

use super::{MetadataError, Superblock, BLOCK_BYTES, COPY_COUNT, PAYLOAD_BYTES_MAX, PAYLOAD_BYTES_MAX_V3};
use crate::config::{
    BadBlock, CcMode, CcSchedule, ControllerConfig, ControllerId, ControllerSettings, DriveId, DriveRecord, HotSpareRecord, PatrolSettings,
    SeqCutoff, VdRecord, VD_NAME_BYTES_MAX,
};

pub const MAGIC: [u8; 8] = *b"STORCMD\0";
/// The format version this code writes. It also reads version 1, whose VD records lack
/// `member_size_bytes` (taken then from the smallest member's drive record, which is how a
/// version-1 storc sized its VDs), and version 2, which lacks the drive state codes 8 (`Cpybck`)
/// and 9 (`UBad`): version 3 exists so that an older storc refuses these drives by version
/// rather than misreading them. Version 4 adds copyback (a setting, and the member a `Cpybck`
/// drive copies), per-VD bad-block lists, and gives the last MiB of the reserved area to the
/// write-intent bitmap (so a payload is at most 1 MiB less one header). Version 5 adds the
/// consistency check rate. Version 6 adds the background initialization rate, VD flags
/// (background initialization pending), the patrol read settings and the consistency check
/// schedule (the counts grow to 48 bytes). Version 7 adds the id of the journal the cache trusts.
/// Version 8 adds the legs of a mirrored journal that must not be replayed. Version 9 adds the
/// drive state `Jrnl` (a slot's drive holding the journal). Version 10 adds SSD caching: the VD
/// flag of a cache VD, and the cache VD that caches a VD. Version 11 adds the VD flag of a
/// write-back cache VD. Version 12 adds the drive state `Mgrt` (a drive receiving a whole VD).
/// Version 13 adds a VD's sequential cutoff (`seqcutoff=`).
pub const FORMAT_VERSION: u32 = 13;
/// The first version with the drive states `Cpybck` and `UBad`.
const FORMAT_VERSION_COPYBACK_UBAD: u32 = 3;
/// The first version with copyback, bad-block lists and the write-intent bitmap area.
const FORMAT_VERSION_BITMAP: u32 = 4;
/// The first version with the consistency check rate.
const FORMAT_VERSION_CC_RATE: u32 = 5;
/// The first version with the background initialization rate and VD flags.
const FORMAT_VERSION_BGI: u32 = 6;
/// The first version with the trusted journal's id.
const FORMAT_VERSION_JOURNAL: u32 = 7;
/// The first version with the stale legs of a mirrored journal.
const FORMAT_VERSION_JOURNAL_LEGS: u32 = 8;
/// The first version with the drive state `Jrnl`.
const FORMAT_VERSION_JOURNAL_DRIVE: u32 = 9;
/// The first version with cache VDs (SSD caching).
const FORMAT_VERSION_SSD_CACHE: u32 = 10;
/// The first version with write-back cache VDs.
const FORMAT_VERSION_SSD_CACHE_WRITE_BACK: u32 = 11;
/// The first version with the drive state `Mgrt`.
const FORMAT_VERSION_MIGRATION: u32 = 12;
/// The first version with a VD's sequential cutoff.
const FORMAT_VERSION_SEQ_CUTOFF: u32 = 13;
/// The oldest format version this code reads.
pub const FORMAT_VERSION_OLDEST: u32 = 1;
pub const HEADER_BYTES: usize = 4096;

mod fields;
pub(crate) use fields::{bad_block, counts, drive_record, header, hot_spare_record, tiles, vd_record, Field};

/// Bytes of one entry of the lists that follow VD and hot spare records.
const LIST_ENTRY_BYTES: usize = 4;

// ---- encoding ----

/// Encodes copy `copy` of `sb`: the header, then the payload, padded to a multiple of 4096 bytes.
///
/// # Errors
/// If `copy` is not 0 or 1, the superblock and its config disagree on controller id or
/// generation, a VD name is longer than [`VD_NAME_BYTES_MAX`], or the configuration does not
/// fit in a copy.
pub fn encode(sb: &Superblock, copy: u32) -> Result<Vec<u8>, MetadataError> {
    check_superblock(sb, copy)?;
    let payload = encode_payload(&sb.config)?;
    let padded_bytes = payload.len().next_multiple_of(BLOCK_BYTES);
    let mut bytes = vec![0u8; HEADER_BYTES + padded_bytes];
    bytes[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(&payload);
    encode_header(sb, copy, &payload, &mut bytes[..HEADER_BYTES]);
    debug_assert!(bytes.len().is_multiple_of(BLOCK_BYTES));
    Ok(bytes)
}

fn check_superblock(sb: &Superblock, copy: u32) -> Result<(), MetadataError> {
    if copy >= COPY_COUNT {
        return Err(MetadataError::CopyIndexInvalid { found: copy });
    }
    if sb.controller_id != sb.config.controller_id {
        let (superblock, config) = (sb.controller_id.0, sb.config.controller_id.0);
        return Err(MetadataError::SuperblockMismatch { field: "controller_id", superblock, config });
    }
    if sb.generation != sb.config.generation {
        let (superblock, config) = (sb.generation.into(), sb.config.generation.into());
        return Err(MetadataError::SuperblockMismatch { field: "generation", superblock, config });
    }
    Ok(())
}

fn encode_header(sb: &Superblock, copy: u32, payload: &[u8], out: &mut [u8]) {
    assert_eq!(out.len(), HEADER_BYTES);
    let payload_bytes = u32::try_from(payload.len()).expect("payload length checked against the copy area");
    put(out, header::MAGIC, &MAGIC);
    put(out, header::VERSION, &FORMAT_VERSION.to_le_bytes());
    put(out, header::FLAGS, &0u32.to_le_bytes());
    put(out, header::CONTROLLER_ID, &sb.controller_id.0.to_le_bytes());
    put(out, header::DRIVE_ID, &sb.drive_id.0.to_le_bytes());
    put(out, header::SLOT, &sb.slot.to_le_bytes());
    put(out, header::COPY_INDEX, &copy.to_le_bytes());
    put(out, header::GENERATION, &sb.generation.to_le_bytes());
    put(out, header::CAPACITY_BYTES, &sb.capacity_bytes.to_le_bytes());
    put(out, header::PAYLOAD_BYTES, &payload_bytes.to_le_bytes());
    put(out, header::PAYLOAD_CRC32C, &crc32c::crc32c(payload).to_le_bytes());
    put(out, header::WRITTEN_UNIX_NS, &sb.written_unix_ns.to_le_bytes());
    let header_crc32c = crc32c::crc32c(&out[..header::HEADER_CRC32C.offset]);
    put(out, header::HEADER_CRC32C, &header_crc32c.to_le_bytes());
}

/// The payload's exact size, computed before encoding so that an oversized one is refused
/// before anything is allocated or written.
fn payload_len_bytes(config: &ControllerConfig) -> usize {
    let vd_bytes = |vd: &VdRecord| vd_record::BYTES + LIST_ENTRY_BYTES * vd.member_slots.len() + bad_block::BYTES * vd.bad_blocks.len();
    let vds: usize = config.vds.iter().map(vd_bytes).sum();
    let hot_spares: usize =
        config.hot_spares.iter().map(|spare| hot_spare_record::BYTES + LIST_ENTRY_BYTES * spare.dedicated_drive_groups.len()).sum();
    counts::BYTES + drive_record::BYTES * config.drives.len() + vds + hot_spares
}

fn encode_payload(config: &ControllerConfig) -> Result<Vec<u8>, MetadataError> {
    for (index, vd) in config.vds.iter().enumerate() {
        check_name_len(vd.name.len(), || vd_record_name(index, vd.vd_id))?;
    }
    let payload_bytes = payload_len_bytes(config);
    if payload_bytes > PAYLOAD_BYTES_MAX {
        return Err(MetadataError::ConfigTooLarge { payload_bytes, max_bytes: PAYLOAD_BYTES_MAX });
    }
    // Every count is below the payload size, which fits in a u32.
    let count = |len: usize| u32::try_from(len).expect("bounded by the payload size");
    let mut out = Vec::with_capacity(payload_bytes);
    let mut fixed = [0u8; counts::BYTES];
    put(&mut fixed, counts::DRIVE_COUNT, &count(config.drives.len()).to_le_bytes());
    put(&mut fixed, counts::VD_COUNT, &count(config.vds.len()).to_le_bytes());
    put(&mut fixed, counts::HOT_SPARE_COUNT, &count(config.hot_spares.len()).to_le_bytes());
    let mut flags = if config.settings.auto_rebuild { 0 } else { counts::FLAG_AUTO_REBUILD_OFF };
    if !config.settings.copyback {
        flags |= counts::FLAG_COPYBACK_OFF;
    }
    put(&mut fixed, counts::CONTROLLER_FLAGS, &[flags]);
    put(&mut fixed, counts::REBUILD_RATE_PERCENT, &[config.settings.rebuild_rate_percent]);
    put(&mut fixed, counts::CC_RATE_PERCENT, &[config.settings.cc_rate_percent]);
    put(&mut fixed, counts::BGI_RATE_PERCENT, &[config.settings.bgi_rate_percent]);
    let patrol = &config.settings.patrol;
    let mut patrol_flags = if patrol.enabled { 0 } else { counts::PATROL_OFF };
    patrol_flags |= if patrol.manual { counts::PATROL_MANUAL } else { 0 };
    patrol_flags |= if patrol.include_ssds { counts::PATROL_INCLUDE_SSDS } else { 0 };
    put(&mut fixed, counts::PATROL_FLAGS, &[patrol_flags]);
    put(&mut fixed, counts::PATROL_RATE_PERCENT, &[patrol.rate_percent]);
    put(&mut fixed, counts::PATROL_DELAY_HOURS, &patrol.delay_hours.to_le_bytes());
    put(&mut fixed, counts::PATROL_LAST_START_UNIX_SECS, &patrol.last_start_unix_secs.to_le_bytes());
    let cc = &config.settings.cc_schedule;
    put(&mut fixed, counts::CC_MODE, &[cc.mode.code()]);
    put(&mut fixed, counts::CC_DELAY_HOURS, &cc.delay_hours.to_le_bytes());
    put(&mut fixed, counts::CC_NEXT_START_UNIX_SECS, &cc.next_start_unix_secs.to_le_bytes());
    put(&mut fixed, counts::JOURNAL_ID, &config.settings.journal_id.to_le_bytes());
    put(&mut fixed, counts::JOURNAL_STALE_LEGS, &[config.settings.journal_stale_legs]);
    out.extend_from_slice(&fixed);
    config.drives.iter().for_each(|drive| encode_drive(drive, &mut out));
    config.vds.iter().for_each(|vd| encode_vd(vd, &mut out));
    config.hot_spares.iter().for_each(|spare| encode_hot_spare(spare, &mut out));
    assert_eq!(out.len(), payload_bytes, "payload_len_bytes agrees with the encoder");
    Ok(out)
}

fn encode_drive(drive: &DriveRecord, out: &mut Vec<u8>) {
    let mut fixed = [0u8; drive_record::BYTES];
    put(&mut fixed, drive_record::SLOT, &drive.slot.to_le_bytes());
    put(&mut fixed, drive_record::STATE, &[drive.state.code()]);
    put(&mut fixed, drive_record::DRIVE_ID, &drive.drive_id.0.to_le_bytes());
    put(&mut fixed, drive_record::CAPACITY_BYTES, &drive.capacity_bytes.to_le_bytes());
    put(&mut fixed, drive_record::REBUILD_ROW, &drive.rebuild_row.to_le_bytes());
    let copy_slot = drive.copy_slot.unwrap_or(drive_record::NO_SLOT);
    put(&mut fixed, drive_record::COPY_SLOT, &copy_slot.to_le_bytes());
    out.extend_from_slice(&fixed);
}

fn encode_vd(vd: &VdRecord, out: &mut Vec<u8>) {
    let name = vd.name.as_bytes();
    let mut fixed = [0u8; vd_record::BYTES];
    put(&mut fixed, vd_record::VD_ID, &vd.vd_id.to_le_bytes());
    put(&mut fixed, vd_record::DRIVE_GROUP, &vd.drive_group.to_le_bytes());
    put(&mut fixed, vd_record::LEVEL, &[vd.level.code()]);
    put(&mut fixed, vd_record::WRITE_POLICY, &[vd.write_policy.code()]);
    put(&mut fixed, vd_record::READ_POLICY, &[vd.read_policy.code()]);
    put(&mut fixed, vd_record::IO_POLICY, &[vd.io_policy.code()]);
    put(&mut fixed, vd_record::DRIVES_PER_SPAN, &vd.drives_per_span.to_le_bytes());
    put(&mut fixed, vd_record::STRIP_SIZE_BYTES, &vd.strip_size_bytes.to_le_bytes());
    put(&mut fixed, vd_record::MEMBER_COUNT, &(vd.member_slots.len() as u32).to_le_bytes());
    put(&mut fixed, vd_record::NAME_LEN, &[name.len() as u8]);
    let flags = if vd.bgi_pending { vd_record::FLAG_BGI_PENDING } else { 0 }
        | if vd.cache_vd { vd_record::FLAG_CACHE_VD } else { 0 }
        | if vd.cache_vd && vd.cache_write_back { vd_record::FLAG_CACHE_WRITE_BACK } else { 0 };
    put(&mut fixed, vd_record::VD_FLAGS, &[flags]);
    put(&mut fixed, vd_record::SEQ_CUTOFF_MIB, &seq_cutoff_code(vd.seq_cutoff).to_le_bytes());
    let cache_vd_id = vd.ssd_cache_vd_id.unwrap_or(vd_record::NO_SSD_CACHE);
    put(&mut fixed, vd_record::SSD_CACHE_VD_ID, &cache_vd_id.to_le_bytes());
    fixed[vd_record::NAME.offset..][..name.len()].copy_from_slice(name);
    put(&mut fixed, vd_record::MEMBER_SIZE_BYTES, &vd.member_size_bytes.to_le_bytes());
    put(&mut fixed, vd_record::BAD_BLOCK_COUNT, &(vd.bad_blocks.len() as u32).to_le_bytes());
    out.extend_from_slice(&fixed);
    vd.member_slots.iter().for_each(|slot| out.extend_from_slice(&slot.to_le_bytes()));
    for range in &vd.bad_blocks {
        let mut entry = [0u8; bad_block::BYTES];
        put(&mut entry, bad_block::OFFSET_BYTES, &range.offset_bytes.to_le_bytes());
        put(&mut entry, bad_block::LEN_BYTES, &range.len_bytes.to_le_bytes());
        out.extend_from_slice(&entry);
    }
}

fn seq_cutoff_code(cutoff: SeqCutoff) -> u16 {
    match cutoff {
        SeqCutoff::LevelDefault => 0,
        SeqCutoff::Never => vd_record::SEQ_CUTOFF_NEVER,
        SeqCutoff::Mib(mib) => mib,
    }
}

/// What [`seq_cutoff_code`] wrote: every value means something.
fn seq_cutoff_of_code(code: u16) -> SeqCutoff {
    match code {
        0 => SeqCutoff::LevelDefault,
        vd_record::SEQ_CUTOFF_NEVER => SeqCutoff::Never,
        mib => SeqCutoff::Mib(mib),
    }
}

fn encode_hot_spare(spare: &HotSpareRecord, out: &mut Vec<u8>) {
    let mut fixed = [0u8; hot_spare_record::BYTES];
    put(&mut fixed, hot_spare_record::SLOT, &spare.slot.to_le_bytes());
    let dedicated_count = spare.dedicated_drive_groups.len() as u32;
    put(&mut fixed, hot_spare_record::DEDICATED_COUNT, &dedicated_count.to_le_bytes());
    out.extend_from_slice(&fixed);
    spare.dedicated_drive_groups.iter().for_each(|group| out.extend_from_slice(&group.to_le_bytes()));
}

fn put(out: &mut [u8], field: Field, bytes: &[u8]) {
    assert_eq!(bytes.len(), field.size, "field `{}` is {} bytes", field.name, field.size);
    out[field.range()].copy_from_slice(bytes);
}

fn check_name_len(len_bytes: usize, record: impl Fn() -> String) -> Result<(), MetadataError> {
    if len_bytes > VD_NAME_BYTES_MAX {
        return Err(MetadataError::NameTooLong { record: record(), len_bytes, max_bytes: VD_NAME_BYTES_MAX });
    }
    Ok(())
}

fn vd_record_name(index: usize, vd_id: u32) -> String {
    format!("vd record {index} (vd {vd_id})")
}

fn get<const N: usize>(bytes: &[u8], field: Field) -> [u8; N] {
    assert_eq!(N, field.size, "field `{}` is {} bytes", field.name, field.size);
    bytes[field.range()].try_into().expect("size checked")
}

fn get_u32(bytes: &[u8], field: Field) -> u32 {
    u32::from_le_bytes(get(bytes, field))
}

fn get_u64(bytes: &[u8], field: Field) -> u64 {
    u64::from_le_bytes(get(bytes, field))
}

fn get_u128(bytes: &[u8], field: Field) -> u128 {
    u128::from_le_bytes(get(bytes, field))
}

mod decode;
pub use decode::decode;
pub(crate) use decode::decode_copy;

mod codes;
pub(crate) use codes::Code;
use codes::{check_state_in_version, decode_code};
