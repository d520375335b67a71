//! Decoding one metadata copy: the header's checks, then the payload's records, codes and
//! names, each error naming the field and what was expected.

use super::*;

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
            if version < FORMAT_VERSION_SEQ_CUTOFF {
                check_zero(fixed, vd_record::RESERVED_V12, record)?;
            }
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
    let seq_cutoff = match version {
        ..FORMAT_VERSION_SEQ_CUTOFF => SeqCutoff::LevelDefault,
        _ => seq_cutoff_of_code(u16::from_le_bytes(get::<2>(fixed, vd_record::SEQ_CUTOFF_MIB))),
    };
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
        seq_cutoff,
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
