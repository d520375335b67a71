//! The bytes of one metadata copy: a 4096-byte header, then the configuration (the payload).
//!
//! Every field is little-endian at a fixed offset given by a [`Field`] table below; the same
//! tables are in docs/on-disk-format.md, and a unit test checks that the two agree. Enums are
//! stored as explicit codes (never the Rust declaration order), and code 0 is never valid, so
//! that zeroed bytes do not decode as a plausible record.

use super::{MetadataError, Superblock, BLOCK_BYTES, COPY_COUNT, PAYLOAD_BYTES_MAX, PAYLOAD_BYTES_MAX_V3};
use crate::config::{
    BadBlock, CcMode, CcSchedule, ControllerConfig, ControllerId, ControllerSettings, DriveId, DriveRecord, HotSpareRecord, PatrolSettings,
    VdRecord, VD_NAME_BYTES_MAX,
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
pub const FORMAT_VERSION: u32 = 12;
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

// ---- decoding ----

/// Decodes one copy. `bytes` may run past the copy (a whole copy area, say): the header says
/// where the payload ends.
///
/// Checks, in order: the magic; the version (before the checksum, because another version may
/// keep its checksum elsewhere); the header checksum; flags, copy index and reserved bytes; the
/// payload length and checksum; then every record, code and name.
///
/// # Errors
/// The first thing found wrong, naming the field and what was expected.
pub fn decode(bytes: &[u8]) -> Result<Superblock, MetadataError> {
    decode_copy(bytes).map(|(superblock, _copy)| superblock)
}

/// [`decode`], also returning the copy index the header claims.
pub(crate) fn decode_copy(bytes: &[u8]) -> Result<(Superblock, u32), MetadataError> {
    let header = take_prefix(bytes, HEADER_BYTES, "a metadata header")?;
    let fields = decode_header(header)?;
    let copy_bytes = HEADER_BYTES + fields.payload_bytes;
    let payload = &take_prefix(bytes, copy_bytes, "the header and payload")?[HEADER_BYTES..];
    let computed = crc32c::crc32c(payload);
    if computed != fields.payload_crc32c {
        let payload_bytes = payload.len();
        return Err(MetadataError::PayloadChecksum { payload_bytes, stored: fields.payload_crc32c, computed });
    }
    let config = decode_payload(payload, fields.version, fields.controller_id, fields.generation)?;
    let superblock = Superblock {
        controller_id: fields.controller_id,
        drive_id: fields.drive_id,
        slot: fields.slot,
        generation: fields.generation,
        capacity_bytes: fields.capacity_bytes,
        written_unix_ns: fields.written_unix_ns,
        config,
    };
    Ok((superblock, fields.copy))
}

fn take_prefix<'a>(bytes: &'a [u8], len_bytes: usize, what: &str) -> Result<&'a [u8], MetadataError> {
    bytes.get(..len_bytes).ok_or_else(|| MetadataError::Truncated {
        what: what.to_string(),
        needed_bytes: len_bytes,
        available_bytes: bytes.len(),
    })
}

/// The header's fields, checked.
struct HeaderFields {
    version: u32,
    controller_id: ControllerId,
    drive_id: DriveId,
    slot: u32,
    copy: u32,
    generation: u64,
    capacity_bytes: u64,
    payload_bytes: usize,
    payload_crc32c: u32,
    written_unix_ns: u64,
}

fn decode_header(bytes: &[u8]) -> Result<HeaderFields, MetadataError> {
    assert_eq!(bytes.len(), HEADER_BYTES);
    let magic: [u8; 8] = get(bytes, header::MAGIC);
    if magic != MAGIC {
        return Err(MetadataError::BadMagic { found: magic });
    }
    let version = get_u32(bytes, header::VERSION);
    if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
        return Err(MetadataError::UnknownVersion { found: version, supported: FORMAT_VERSION });
    }
    let stored = get_u32(bytes, header::HEADER_CRC32C);
    let computed = crc32c::crc32c(&bytes[..header::HEADER_CRC32C.offset]);
    if stored != computed {
        return Err(MetadataError::HeaderChecksum { stored, computed });
    }
    check_header_fields(bytes, version)?;
    Ok(HeaderFields {
        version,
        controller_id: ControllerId(get_u128(bytes, header::CONTROLLER_ID)),
        drive_id: DriveId(get_u128(bytes, header::DRIVE_ID)),
        slot: get_u32(bytes, header::SLOT),
        copy: get_u32(bytes, header::COPY_INDEX),
        generation: get_u64(bytes, header::GENERATION),
        capacity_bytes: get_u64(bytes, header::CAPACITY_BYTES),
        payload_bytes: get_u32(bytes, header::PAYLOAD_BYTES) as usize,
        payload_crc32c: get_u32(bytes, header::PAYLOAD_CRC32C),
        written_unix_ns: get_u64(bytes, header::WRITTEN_UNIX_NS),
    })
}

/// The checks that need a header whose checksum is already known to be right.
fn check_header_fields(bytes: &[u8], version: u32) -> Result<(), MetadataError> {
    let flags = get_u32(bytes, header::FLAGS);
    if flags != 0 {
        return Err(MetadataError::UnknownFlags { found: flags });
    }
    let copy = get_u32(bytes, header::COPY_INDEX);
    if copy >= COPY_COUNT {
        return Err(MetadataError::CopyIndexInvalid { found: copy });
    }
    check_zero(bytes, header::RESERVED, || "header".to_string())?;
    let payload_bytes = get_u32(bytes, header::PAYLOAD_BYTES) as usize;
    let max_bytes = if version < FORMAT_VERSION_BITMAP { PAYLOAD_BYTES_MAX_V3 } else { PAYLOAD_BYTES_MAX };
    if payload_bytes > max_bytes {
        return Err(MetadataError::PayloadTooLong { payload_bytes, max_bytes });
    }
    Ok(())
}

fn decode_payload(payload: &[u8], version: u32, controller_id: ControllerId, generation: u64) -> Result<ControllerConfig, MetadataError> {
    let mut reader = Reader { bytes: payload, position_bytes: 0 };
    let counts_bytes = if version < FORMAT_VERSION_BGI { counts::BYTES_V5 } else { counts::BYTES };
    let fixed = reader.take(counts_bytes, || "the record counts".to_string())?;
    let settings = decode_settings(fixed, version)?;
    let drive_count = get_u32(fixed, counts::DRIVE_COUNT);
    let vd_count = get_u32(fixed, counts::VD_COUNT);
    let hot_spare_count = get_u32(fixed, counts::HOT_SPARE_COUNT);
    // Records are decoded one at a time, so a corrupt count fails as Truncated before it can
    // make us allocate much.
    let drives: Vec<DriveRecord> =
        (0..drive_count).map(|index| decode_drive(&mut reader, index, drive_count, version)).collect::<Result<_, _>>()?;
    let vds = (0..vd_count).map(|index| decode_vd(&mut reader, index, vd_count, version, &drives)).collect::<Result<_, _>>()?;
    let hot_spares = (0..hot_spare_count).map(|index| decode_hot_spare(&mut reader, index, hot_spare_count)).collect::<Result<_, _>>()?;
    if reader.position_bytes != payload.len() {
        return Err(MetadataError::TrailingBytes { payload_bytes: payload.len(), parsed_bytes: reader.position_bytes });
    }
    Ok(ControllerConfig { controller_id, generation, drives, vds, hot_spares, settings })
}

/// The controller settings of version 3; versions 1 and 2 had none, so they get the defaults.
fn decode_settings(fixed: &[u8], version: u32) -> Result<ControllerSettings, MetadataError> {
    let record = || "record counts".to_string();
    if version < 3 {
        check_zero(fixed, counts::RESERVED_V2, record)?;
        return Ok(ControllerSettings::default());
    }
    match version {
        ..FORMAT_VERSION_CC_RATE => check_zero(fixed, counts::RESERVED_V4, record)?,
        FORMAT_VERSION_CC_RATE..FORMAT_VERSION_BGI => check_zero(fixed, counts::RESERVED_V5, record)?,
        _ => {}
    }
    let flags = get::<1>(fixed, counts::CONTROLLER_FLAGS)[0];
    let (flags_known, known) = match version {
        3 => (counts::FLAGS_KNOWN_V3, "bit 0 (automatic rebuild off)"),
        _ => (counts::FLAGS_KNOWN, "bit 0 (automatic rebuild off), bit 1 (copyback off)"),
    };
    if flags & !flags_known != 0 {
        let known = known.to_string();
        return Err(MetadataError::UnknownCode { record: record(), field: "controller_flags", code: flags, known });
    }
    let percent = |field: Field| {
        let value = get::<1>(fixed, field)[0];
        match value {
            0..=100 => Ok(value),
            _ => Err(MetadataError::UnknownCode { record: record(), field: field.name, code: value, known: "0 to 100".to_string() }),
        }
    };
    let rebuild_rate_percent = percent(counts::REBUILD_RATE_PERCENT)?;
    let cc_rate_percent = match version {
        ..FORMAT_VERSION_CC_RATE => ControllerSettings::default().cc_rate_percent,
        _ => percent(counts::CC_RATE_PERCENT)?,
    };
    let bgi_rate_percent = match version {
        ..FORMAT_VERSION_BGI => ControllerSettings::default().bgi_rate_percent,
        _ => percent(counts::BGI_RATE_PERCENT)?,
    };
    let (patrol, cc_schedule) = match version {
        ..FORMAT_VERSION_BGI => (PatrolSettings::default(), CcSchedule::default()),
        _ => (decode_patrol(fixed, percent(counts::PATROL_RATE_PERCENT)?)?, decode_cc_schedule(fixed)?),
    };
    let journal_stale_legs = match version {
        ..FORMAT_VERSION_BGI => 0,
        FORMAT_VERSION_BGI..FORMAT_VERSION_JOURNAL_LEGS => {
            // Reserved, zero.
            check_zero(fixed, counts::JOURNAL_STALE_LEGS, || "record counts".to_string())?;
            0
        }
        _ => get::<1>(fixed, counts::JOURNAL_STALE_LEGS)[0],
    };
    if journal_stale_legs & !counts::JOURNAL_STALE_LEGS_KNOWN != 0 {
        let known = "bit 0 (leg 0), bit 1 (leg 1)".to_string();
        return Err(MetadataError::UnknownCode {
            record: "record counts".into(),
            field: counts::JOURNAL_STALE_LEGS.name,
            code: journal_stale_legs,
            known,
        });
    }
    let journal_id = match version {
        ..FORMAT_VERSION_BGI => 0,
        FORMAT_VERSION_BGI..FORMAT_VERSION_JOURNAL => {
            check_zero(fixed, counts::RESERVED_TAIL_V6, record)?;
            0
        }
        _ => get_u64(fixed, counts::JOURNAL_ID),
    };
    Ok(ControllerSettings {
        journal_id,
        journal_stale_legs,
        auto_rebuild: flags & counts::FLAG_AUTO_REBUILD_OFF == 0,
        rebuild_rate_percent,
        copyback: flags & counts::FLAG_COPYBACK_OFF == 0,
        cc_rate_percent,
        bgi_rate_percent,
        patrol,
        cc_schedule,
    })
}

/// The consistency check schedule of version 6.
fn decode_cc_schedule(fixed: &[u8]) -> Result<CcSchedule, MetadataError> {
    let record = || "record counts".to_string();
    let mode = decode_code::<CcMode>(fixed, counts::CC_MODE, record)?;
    let delay_hours = u16::from_le_bytes(get::<2>(fixed, counts::CC_DELAY_HOURS));
    if delay_hours == 0 {
        let known = "1 to 65535 (hours)".to_string();
        return Err(MetadataError::UnknownCode { record: record(), field: counts::CC_DELAY_HOURS.name, code: 0, known });
    }
    Ok(CcSchedule { mode, delay_hours, next_start_unix_secs: get_u64(fixed, counts::CC_NEXT_START_UNIX_SECS) })
}

/// The patrol read settings of version 6.
fn decode_patrol(fixed: &[u8], rate_percent: u8) -> Result<PatrolSettings, MetadataError> {
    let record = || "record counts".to_string();
    let flags = get::<1>(fixed, counts::PATROL_FLAGS)[0];
    if flags & !counts::PATROL_FLAGS_KNOWN != 0 {
        let known = "bit 0 (patrol read off), bit 1 (manual), bit 2 (SSDs included)".to_string();
        return Err(MetadataError::UnknownCode { record: record(), field: counts::PATROL_FLAGS.name, code: flags, known });
    }
    let delay_hours = u16::from_le_bytes(get::<2>(fixed, counts::PATROL_DELAY_HOURS));
    if delay_hours == 0 {
        let known = "1 to 65535 (hours)".to_string();
        return Err(MetadataError::UnknownCode { record: record(), field: counts::PATROL_DELAY_HOURS.name, code: 0, known });
    }
    Ok(PatrolSettings {
        enabled: flags & counts::PATROL_OFF == 0,
        manual: flags & counts::PATROL_MANUAL != 0,
        include_ssds: flags & counts::PATROL_INCLUDE_SSDS != 0,
        rate_percent,
        delay_hours,
        last_start_unix_secs: get_u64(fixed, counts::PATROL_LAST_START_UNIX_SECS),
    })
}

fn decode_drive(reader: &mut Reader, index: u32, count: u32, version: u32) -> Result<DriveRecord, MetadataError> {
    let record = || format!("drive record {index}");
    let fixed_bytes = match version {
        ..3 => drive_record::BYTES_V2,
        3 => drive_record::BYTES_V3,
        _ => drive_record::BYTES,
    };
    let fixed = reader.take(fixed_bytes, || format!("drive record {index} of {count}"))?;
    check_zero(fixed, drive_record::RESERVED, record)?;
    let copy_slot = match version {
        ..FORMAT_VERSION_BITMAP => None,
        _ => {
            check_zero(fixed, drive_record::RESERVED_TAIL, record)?;
            Some(get_u32(fixed, drive_record::COPY_SLOT)).filter(|&slot| slot != drive_record::NO_SLOT)
        }
    };
    let state = decode_code(fixed, drive_record::STATE, record)?;
    check_state_in_version(state, version, record)?;
    Ok(DriveRecord {
        slot: get_u32(fixed, drive_record::SLOT),
        drive_id: DriveId(get_u128(fixed, drive_record::DRIVE_ID)),
        state,
        capacity_bytes: get_u64(fixed, drive_record::CAPACITY_BYTES),
        rebuild_row: if version < 3 { 0 } else { get_u64(fixed, drive_record::REBUILD_ROW) },
        copy_slot,
    })
}

fn decode_vd(reader: &mut Reader, index: u32, count: u32, version: u32, drives: &[DriveRecord]) -> Result<VdRecord, MetadataError> {
    let fixed_bytes = match version {
        1 => vd_record::BYTES_V1,
        2 | 3 => vd_record::BYTES_V3,
        _ => vd_record::BYTES,
    };
    let fixed = reader.take(fixed_bytes, || format!("vd record {index} of {count}"))?;
    let vd_id = get_u32(fixed, vd_record::VD_ID);
    let record = || vd_record_name(index as usize, vd_id);
    let flags = match version {
        ..FORMAT_VERSION_BGI => {
            check_zero(fixed, vd_record::RESERVED_V5, record)?;
            0
        }
        _ => {
            check_zero(fixed, vd_record::RESERVED, record)?;
            let flags = get::<1>(fixed, vd_record::VD_FLAGS)[0];
            let (known_flags, known) = match version {
                ..FORMAT_VERSION_SSD_CACHE => (vd_record::FLAGS_KNOWN_V9, "bit 0 (background initialization pending)"),
                FORMAT_VERSION_SSD_CACHE..FORMAT_VERSION_SSD_CACHE_WRITE_BACK => {
                    (vd_record::FLAGS_KNOWN_V10, "bit 0 (background initialization pending), bit 1 (cache VD)")
                }
                _ => (vd_record::FLAGS_KNOWN, "bit 0 (background initialization pending), bit 1 (cache VD), bit 2 (write-back cache VD)"),
            };
            if flags & !known_flags != 0 {
                let known = known.to_string();
                return Err(MetadataError::UnknownCode { record: record(), field: vd_record::VD_FLAGS.name, code: flags, known });
            }
            flags
        }
    };
    let level = decode_code(fixed, vd_record::LEVEL, record)?;
    let write_policy = decode_code(fixed, vd_record::WRITE_POLICY, record)?;
    let read_policy = decode_code(fixed, vd_record::READ_POLICY, record)?;
    let io_policy = decode_code(fixed, vd_record::IO_POLICY, record)?;
    let name = decode_name(fixed, record)?;
    let member_count = get_u32(fixed, vd_record::MEMBER_COUNT);
    let member_slots = reader.take_u32_list(member_count, || format!("member slots of vd record {index} (vd {vd_id})"))?;
    let ssd_cache_vd_id = match version {
        ..FORMAT_VERSION_BITMAP => None,
        FORMAT_VERSION_BITMAP..FORMAT_VERSION_SSD_CACHE => {
            check_zero(fixed, vd_record::RESERVED_TAIL, record)?;
            None
        }
        _ => Some(get_u32(fixed, vd_record::SSD_CACHE_VD_ID)).filter(|&id| id != vd_record::NO_SSD_CACHE),
    };
    let bad_blocks = match version {
        ..FORMAT_VERSION_BITMAP => Vec::new(),
        _ => decode_bad_blocks(reader, get_u32(fixed, vd_record::BAD_BLOCK_COUNT), record)?,
    };
    let member_size_bytes = match version {
        1 => smallest_recorded_capacity_bytes(&member_slots, drives),
        _ => get_u64(fixed, vd_record::MEMBER_SIZE_BYTES),
    };
    Ok(VdRecord {
        member_size_bytes,
        vd_id,
        drive_group: get_u32(fixed, vd_record::DRIVE_GROUP),
        name,
        level,
        strip_size_bytes: get_u64(fixed, vd_record::STRIP_SIZE_BYTES),
        drives_per_span: get_u32(fixed, vd_record::DRIVES_PER_SPAN),
        member_slots,
        write_policy,
        read_policy,
        io_policy,
        bad_blocks,
        bgi_pending: flags & vd_record::FLAG_BGI_PENDING != 0,
        cache_vd: flags & vd_record::FLAG_CACHE_VD != 0,
        cache_write_back: flags & vd_record::FLAG_CACHE_VD != 0 && flags & vd_record::FLAG_CACHE_WRITE_BACK != 0,
        ssd_cache_vd_id,
    })
}

fn decode_bad_blocks(reader: &mut Reader, count: u32, record: impl Fn() -> String) -> Result<Vec<BadBlock>, MetadataError> {
    (0..count)
        .map(|index| {
            let entry = reader.take(bad_block::BYTES, || format!("bad block {index} of {count} of {}", record()))?;
            Ok(BadBlock { offset_bytes: get_u64(entry, bad_block::OFFSET_BYTES), len_bytes: get_u64(entry, bad_block::LEN_BYTES) })
        })
        .collect()
}

/// What a version-1 storc laid a VD out on: its smallest member as the drive records knew it.
fn smallest_recorded_capacity_bytes(member_slots: &[u32], drives: &[DriveRecord]) -> u64 {
    let capacity_of = |slot: &u32| drives.iter().find(|d| d.slot == *slot).map(|d| d.capacity_bytes);
    member_slots.iter().filter_map(capacity_of).min().unwrap_or(0)
}

/// A name is `name_len` bytes of UTF-8 at the start of the `name` field, zero-padded.
fn decode_name(fixed: &[u8], record: impl Fn() -> String) -> Result<String, MetadataError> {
    let len_bytes = get::<1>(fixed, vd_record::NAME_LEN)[0] as usize;
    check_name_len(len_bytes, &record)?;
    let field = &fixed[vd_record::NAME.range()];
    if field[len_bytes..].iter().any(|&b| b != 0) {
        let offset_bytes = vd_record::NAME.offset + len_bytes;
        return Err(MetadataError::ReservedNotZero { record: record(), field: "name padding", offset_bytes });
    }
    match std::str::from_utf8(&field[..len_bytes]) {
        Ok(name) => Ok(name.to_string()),
        Err(error) => Err(MetadataError::NameNotUtf8 { record: record(), error }),
    }
}

fn decode_hot_spare(reader: &mut Reader, index: u32, count: u32) -> Result<HotSpareRecord, MetadataError> {
    let fixed = reader.take(hot_spare_record::BYTES, || format!("hot spare record {index} of {count}"))?;
    let dedicated_count = get_u32(fixed, hot_spare_record::DEDICATED_COUNT);
    let what = || format!("dedicated drive groups of hot spare record {index}");
    let dedicated_drive_groups = reader.take_u32_list(dedicated_count, what)?;
    Ok(HotSpareRecord { slot: get_u32(fixed, hot_spare_record::SLOT), dedicated_drive_groups })
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

fn check_zero(bytes: &[u8], field: Field, record: impl Fn() -> String) -> Result<(), MetadataError> {
    match bytes[field.range()].iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(at) => Err(MetadataError::ReservedNotZero { record: record(), field: field.name, offset_bytes: field.offset + at }),
    }
}

/// Reads records off the payload, failing with the record's name when the payload ends early.
struct Reader<'a> {
    bytes: &'a [u8],
    position_bytes: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len_bytes: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], MetadataError> {
        let end = self.position_bytes.checked_add(len_bytes).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            let needed_bytes = self.position_bytes.saturating_add(len_bytes);
            return Err(MetadataError::Truncated { what: what(), needed_bytes, available_bytes: self.bytes.len() });
        };
        let taken = &self.bytes[self.position_bytes..end];
        self.position_bytes = end;
        Ok(taken)
    }

    fn take_u32_list(&mut self, count: u32, what: impl FnOnce() -> String) -> Result<Vec<u32>, MetadataError> {
        let bytes = self.take(count as usize * LIST_ENTRY_BYTES, what)?;
        Ok(bytes.chunks_exact(LIST_ENTRY_BYTES).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }
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

mod codes;
pub(crate) use codes::Code;
use codes::{check_state_in_version, decode_code};
