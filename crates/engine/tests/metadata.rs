//! On-disk metadata: the codec, the two-copy write/read protocol on real drive backends, and
//! assembly. Layout offsets here are transcribed from docs/on-disk-format.md on purpose, so
//! that these tests also check the document.

use drive::{Drive, DriveError, DriveOp, Faults, FaultyDrive, FileDrive, FileDriveConfig, IoBuf, IoCtx, MemDrive};
use engine::config::{
    BadBlock, CcMode, CcSchedule, ControllerConfig, ControllerId, ControllerSettings, DriveId, DriveRecord, DriveState, HotSpareRecord,
    IoPolicy, PatrolSettings, ReadPolicy, SeqCutoff, VdRecord, WritePolicy,
};
use engine::metadata::{
    self, assemble, decode, encode, Assembly, ConfigGroup, MetadataError, OtherCopy, ReadOutcome, Superblock, COPY_AREA_BYTES,
    HEADER_BYTES, PAYLOAD_BYTES_MAX,
};
use layout::Level;
use std::sync::Arc;
use std::time::Duration;

// ---- fixtures ----

/// Members per VD and drives per span for every level, in `Level::ALL` order.
fn level_shape(level: Level) -> (u32, u32) {
    match level {
        Level::Raid0 | Level::Raid1 => (2, 2),
        Level::Raid1E | Level::Raid5 => (3, 3),
        Level::Raid6 => (4, 4),
        Level::Raid10 => (4, 2),
        Level::Raid50 => (6, 3),
        Level::Raid60 => (8, 4),
        Level::Jbod => (1, 1),
    }
}

/// A VD of every level with every policy, global and dedicated spares, spare and unconfigured
/// drives in every state: everything the format can hold.
fn full_config(controller: u128, generation: u64) -> ControllerConfig {
    let mut vds = Vec::new();
    let mut next_slot = 0u32;
    for (index, &level) in Level::ALL.iter().enumerate() {
        let (member_count, drives_per_span) = level_shape(level);
        let member_slots: Vec<u32> = (next_slot..next_slot + member_count).collect();
        next_slot += member_count;
        let name = match index {
            0 => "x".repeat(32),          // exactly the maximum
            1 => "données-é".to_string(), // multi-byte UTF-8
            2 => String::new(),
            _ => format!("vd-{}", level.short_name()),
        };
        vds.push(VdRecord {
            vd_id: index as u32 + 10,
            drive_group: index as u32,
            name,
            level,
            strip_size_bytes: 8192 << (index % 8),
            drives_per_span,
            member_slots,
            write_policy: WritePolicy::ALL[index % 3],
            read_policy: ReadPolicy::ALL[(index / 3) % 3],
            io_policy: IoPolicy::ALL[index % 2],
            member_size_bytes: (1 << 40) - u64::from(index as u32) * 4096,
            bad_blocks: (0..index as u64 % 3).map(|n| BadBlock { offset_bytes: n << 30, len_bytes: 512 << n }).collect(),
            bgi_pending: index % 2 == 1,
            cache_vd: index % 5 == 2,
            cache_write_back: index % 10 == 7,
            ssd_cache_vd_id: (index % 4 == 1).then_some(index as u32 + 100),
            seq_cutoff: [SeqCutoff::LevelDefault, SeqCutoff::Never, SeqCutoff::Mib(1), SeqCutoff::Mib(SeqCutoff::MIB_MAX)][index % 4],
        });
    }
    let hot_spares = vec![
        HotSpareRecord { slot: next_slot, dedicated_drive_groups: vec![] },
        HotSpareRecord { slot: next_slot + 1, dedicated_drive_groups: vec![3, 4] },
        HotSpareRecord { slot: next_slot + 2, dedicated_drive_groups: vec![8] },
    ];
    let drives = (0..next_slot + 10)
        .map(|slot| DriveRecord {
            slot,
            drive_id: DriveId(u128::MAX - u128::from(slot) * 0x1_0000_0001),
            state: DriveState::ALL[slot as usize % DriveState::ALL.len()],
            capacity_bytes: (1 << 40) + u64::from(slot) * 4096,
            rebuild_row: u64::from(slot) * 977,
            copy_slot: (slot % 3 == 1).then_some(slot / 2),
        })
        .collect();
    let patrol = PatrolSettings {
        enabled: false,
        manual: true,
        include_ssds: true,
        rate_percent: 9,
        delay_hours: 0x1234,
        last_start_unix_secs: 1_700_000_123,
    };
    let settings = ControllerSettings {
        auto_rebuild: false,
        rebuild_rate_percent: 77,
        copyback: false,
        cc_rate_percent: 12,
        bgi_rate_percent: 64,
        patrol,
        cc_schedule: CcSchedule { mode: CcMode::Concurrent, delay_hours: 0x0102, next_start_unix_secs: 1_800_000_777 },
        journal_id: 0x0123_4567_89ab_cdef,
        journal_stale_legs: 0b10,
    };
    ControllerConfig { controller_id: ControllerId(controller), generation, drives, vds, hot_spares, settings }
}

/// A small configuration whose layout is easy to follow in the corruption tests: 4 drive
/// records, VD 7 named "vd0" on slots 0..3, a spare dedicated to drive group 0.
fn small_config(controller: u128, generation: u64) -> ControllerConfig {
    let drives = (0..4)
        .map(|slot| DriveRecord {
            slot,
            drive_id: DriveId(100 + u128::from(slot)),
            state: DriveState::Online,
            capacity_bytes: 1 << 30,
            rebuild_row: 0,
            copy_slot: None,
        })
        .collect();
    let vd = VdRecord {
        vd_id: 7,
        drive_group: 0,
        name: "vd0".to_string(),
        level: Level::Raid5,
        strip_size_bytes: 64 << 10,
        drives_per_span: 3,
        member_slots: vec![0, 1, 2],
        write_policy: WritePolicy::WriteBack,
        read_policy: ReadPolicy::Adaptive,
        io_policy: IoPolicy::Direct,
        member_size_bytes: 1 << 30,
        bad_blocks: Vec::new(),
        bgi_pending: false,
        cache_vd: false,
        cache_write_back: false,
        ssd_cache_vd_id: None,
        seq_cutoff: SeqCutoff::LevelDefault,
    };
    let hot_spares = vec![HotSpareRecord { slot: 3, dedicated_drive_groups: vec![0] }];
    ControllerConfig {
        controller_id: ControllerId(controller),
        generation,
        drives,
        vds: vec![vd],
        hot_spares,
        settings: Default::default(),
    }
}

fn superblock(config: ControllerConfig, slot: u32) -> Superblock {
    Superblock {
        controller_id: config.controller_id,
        drive_id: DriveId(100 + u128::from(slot)),
        slot,
        generation: config.generation,
        capacity_bytes: 1 << 30,
        written_unix_ns: 1_700_000_000_123_456_789,
        config,
    }
}

// Offsets from docs/on-disk-format.md.
const PAYLOAD: usize = 4096;
/// The counts (48 bytes; 16 before version 6).
const COUNTS_BYTES: usize = 48;
const DRIVE_RECORDS: usize = PAYLOAD + COUNTS_BYTES;
/// The first VD record of `small_config` (after 4 drive records).
const VD0: usize = DRIVE_RECORDS + 4 * DRIVE_RECORD_BYTES;
const DRIVE_RECORD_BYTES: usize = 48;
/// Versions 1 and 2: drive records end before `rebuild_row`.
const DRIVE_RECORD_BYTES_V2: usize = 32;
/// Version 3: drive records end before `copy_slot`.
const DRIVE_RECORD_BYTES_V3: usize = 40;

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn set_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

fn payload_len(bytes: &[u8]) -> usize {
    u32_at(bytes, 72) as usize
}

/// Recomputes both checksums after a deliberate change, to reach the checks behind them.
fn reseal(bytes: &mut [u8]) {
    let end = PAYLOAD + payload_len(bytes);
    if end <= bytes.len() {
        let payload_crc = crc32c::crc32c(&bytes[PAYLOAD..end]);
        set_u32(bytes, 76, payload_crc);
    }
    let header_crc = crc32c::crc32c(&bytes[..4092]);
    set_u32(bytes, 4092, header_crc);
}

fn header_checksum_error(bytes: &[u8]) -> MetadataError {
    MetadataError::HeaderChecksum { stored: u32_at(bytes, 4092), computed: crc32c::crc32c(&bytes[..4092]) }
}

// ---- codec ----

#[test]
fn round_trip_of_everything_the_format_holds() {
    let sb = superblock(full_config(0xDEAD_BEEF_0123_4567_89AB_CDEF_0011_2233, u64::MAX - 1), 5);
    for copy in 0..2 {
        let bytes = encode(&sb, copy).unwrap();
        assert_eq!(bytes.len() % 4096, 0, "copy {copy} is padded for O_DIRECT");
        assert_eq!(decode(&bytes), Ok(sb.clone()), "copy {copy}");
        // A whole copy area read from a drive carries bytes past the copy: they are ignored.
        let mut area = bytes.clone();
        area.resize(COPY_AREA_BYTES as usize, 0xA5);
        assert_eq!(decode(&area), Ok(sb.clone()), "copy {copy} with trailing bytes");
    }
}

#[test]
fn the_two_copies_differ_only_in_copy_index_and_header_checksum() {
    let sb = superblock(small_config(1, 1), 0);
    let (copy0, copy1) = (encode(&sb, 0).unwrap(), encode(&sb, 1).unwrap());
    let differing: Vec<usize> = (0..copy0.len()).filter(|&i| copy0[i] != copy1[i]).collect();
    assert!(differing.iter().all(|&i| i == 52 || (4092..4096).contains(&i)), "differing bytes {differing:?}");
    assert_eq!((u32_at(&copy0, 52), u32_at(&copy1, 52)), (0, 1));
}

/// The bytes a version-1, -2 or -3 storc wrote for `sb`, whose settings must be the defaults,
/// with no rebuild or copy in progress and one VD without bad blocks: drive records without
/// `copy_slot` (and, before version 3, `rebuild_row`), VD records without
/// `bad_block_count` (and, in version 1, `member_size_bytes`), and before version 3 no settings
/// in the counts.
fn encode_old(sb: &Superblock, version: u32) -> Vec<u8> {
    let current = encode(sb, 0).unwrap();
    let payload = &current[PAYLOAD..PAYLOAD + payload_len(&current)];
    // Versions 1 to 5 have 16 bytes of counts; records start after 32 in version 6.
    let payload = &[&payload[..16], &payload[COUNTS_BYTES..]].concat();
    let mut old = payload[..16].to_vec();
    if version < 3 {
        old[12..16].fill(0);
    }
    if version < 5 {
        old[14] = 0; // the consistency check rate
    }
    if version < 6 {
        old[15] = 0; // the background initialization rate
    }
    let drive_count = sb.config.drives.len();
    let drive_record_bytes = match version {
        ..3 => DRIVE_RECORD_BYTES_V2,
        3 => DRIVE_RECORD_BYTES_V3,
        _ => DRIVE_RECORD_BYTES,
    };
    for index in 0..drive_count {
        let at = 16 + index * DRIVE_RECORD_BYTES;
        old.extend_from_slice(&payload[at..at + drive_record_bytes]);
    }
    let mut rest = payload[16 + drive_count * DRIVE_RECORD_BYTES..].to_vec();
    if (4..10).contains(&version) {
        rest[76..80].fill(0); // the VD record's ssd_cache_vd_id, reserved before version 10
    }
    if version < 4 {
        rest.drain(72..80); // the VD record's bad_block_count and reserved
    }
    if version == 1 {
        rest.drain(64..72); // the VD record's member_size_bytes
    }
    old.extend(rest);
    let mut bytes = current[..PAYLOAD].to_vec();
    set_u32(&mut bytes, 8, version);
    set_u32(&mut bytes, 72, old.len() as u32);
    bytes.extend(old);
    bytes.resize(bytes.len().next_multiple_of(4096), 0);
    reseal(&mut bytes);
    bytes
}

/// Format version 1 (written by earlier storc releases) is still read: its VD records end before
/// `member_size_bytes`, which is then the smallest member's recorded capacity.
#[test]
fn version_1_metadata_is_read_with_the_member_size_from_the_drive_records() {
    let sb = superblock(small_config(0x55, 9), 1);
    let bytes = encode_old(&sb, 1);
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.config.vds[0].member_size_bytes, 1 << 30);
    assert_eq!(decoded, sb);
}

/// Every drive state round-trips, the two added in version 3 (`Cpybck` = 8, `UBad` = 9) included,
/// at the documented byte.
#[test]
fn every_drive_state_round_trips_with_its_documented_code() {
    let codes = [
        (DriveState::UnconfiguredGood, 1),
        (DriveState::Online, 2),
        (DriveState::Offline, 3),
        (DriveState::Failed, 4),
        (DriveState::Missing, 5),
        (DriveState::HotSpare, 6),
        (DriveState::Rebuild, 7),
        (DriveState::Copyback, 8),
        (DriveState::UnconfiguredBad, 9),
        (DriveState::Journal, 10),
        (DriveState::Migrate, 11),
    ];
    assert_eq!(codes.len(), DriveState::ALL.len(), "every state has a documented code here");
    for (state, code) in codes {
        let mut config = small_config(0x77, 5);
        config.drives[1].state = state;
        let sb = superblock(config, 0);
        let bytes = encode(&sb, 0).unwrap();
        assert_eq!(bytes[DRIVE_RECORDS + DRIVE_RECORD_BYTES + 4], code, "{state:?} is stored as {code}");
        assert_eq!(decode(&bytes), Ok(sb), "{state:?}");
    }
}

/// Version 2 (before `Cpybck` and `UBad`) is still read; a version-2 record holding one of the
/// codes version 3 added was never written by any storc and is refused as unknown.
#[test]
fn version_2_metadata_is_read_and_knows_no_copyback_or_unconfigured_bad() {
    let as_version_2 = |state: DriveState| {
        let mut config = small_config(0x66, 4);
        config.drives[1].state = state;
        let sb = superblock(config, 0);
        let bytes = encode_old(&sb, 2);
        (sb, bytes)
    };
    let (sb, bytes) = as_version_2(DriveState::Failed);
    assert_eq!(decode(&bytes), Ok(sb));
    let states_v2 = "1 (UGood), 2 (Onln), 3 (Offln), 4 (Failed), 5 (Msng), 6 (HSP), 7 (Rbld)";
    for (state, code) in [(DriveState::Copyback, 8), (DriveState::UnconfiguredBad, 9)] {
        let (_, bytes) = as_version_2(state);
        let expected = MetadataError::UnknownCode { record: "drive record 1".into(), field: "state", code, known: states_v2.into() };
        assert_eq!(decode(&bytes).err(), Some(expected), "{state:?} in version 2");
    }
}

/// Version 3 (before copyback, bad-block lists and the bitmap area) is still read; a version-3
/// record with the copyback-off flag, which version 4 added, is refused as unknown.
#[test]
fn version_3_metadata_is_read_and_knows_no_copyback_flag() {
    let sb = superblock(small_config(0x77, 5), 1);
    let bytes = encode_old(&sb, 3);
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let mut flagged = bytes.clone();
    flagged[PAYLOAD + 12] = 2; // controller_flags bit 1
    reseal(&mut flagged);
    let known = "bit 0 (automatic rebuild off)".to_string();
    let expected = MetadataError::UnknownCode { record: "record counts".into(), field: "controller_flags", code: 2, known };
    assert_eq!(decode(&flagged).err(), Some(expected));
}

/// An independent transcription of the byte tables: the exact bytes of `small_config`.
#[test]
fn encoding_matches_the_documented_bytes() {
    let sb = superblock(small_config(0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10, 42), 2);
    let bytes = encode(&sb, 1).unwrap();
    let mut header = Vec::new();
    header.extend_from_slice(b"STORCMD\0");
    header.extend_from_slice(&13u32.to_le_bytes()); // format_version
    header.extend_from_slice(&0u32.to_le_bytes()); // flags
    header.extend_from_slice(&0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10u128.to_le_bytes());
    header.extend_from_slice(&102u128.to_le_bytes()); // drive_id
    header.extend_from_slice(&2u32.to_le_bytes()); // slot
    header.extend_from_slice(&1u32.to_le_bytes()); // copy_index
    header.extend_from_slice(&42u64.to_le_bytes()); // generation
    header.extend_from_slice(&(1u64 << 30).to_le_bytes()); // capacity_bytes
    let mut payload = Vec::new();
    for n in [4u32, 1, 1] {
        payload.extend_from_slice(&n.to_le_bytes()); // counts
    }
    payload.extend_from_slice(&[0, 30, 30, 30]); // autorebuild on, rebuild, cc and bgi rates 30 %
    payload.extend_from_slice(&[0, 30]); // patrol read on, automatic, SSDs left out; rate 30 %
    payload.extend_from_slice(&168u16.to_le_bytes()); // patrol_delay_hours
    payload.extend_from_slice(&[1, 0]); // cc_mode off, reserved
    payload.extend_from_slice(&168u16.to_le_bytes()); // cc_delay_hours
    payload.extend_from_slice(&0u64.to_le_bytes()); // patrol_last_start_unix_secs: never
    payload.extend_from_slice(&0u64.to_le_bytes()); // cc_next_start_unix_secs
    payload.extend_from_slice(&0u64.to_le_bytes()); // journal_id (none)
    for slot in 0..4u32 {
        payload.extend_from_slice(&slot.to_le_bytes());
        payload.extend_from_slice(&[2, 0, 0, 0]); // Onln, reserved
        payload.extend_from_slice(&(100 + u128::from(slot)).to_le_bytes());
        payload.extend_from_slice(&(1u64 << 30).to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes()); // rebuild_row
        payload.extend_from_slice(&u32::MAX.to_le_bytes()); // copy_slot: none
        payload.extend_from_slice(&[0; 4]); // reserved
    }
    payload.extend_from_slice(&7u32.to_le_bytes()); // vd_id
    payload.extend_from_slice(&0u32.to_le_bytes()); // drive_group
    payload.extend_from_slice(&[4, 2, 3, 1]); // r5, wb, adra, direct
    payload.extend_from_slice(&3u32.to_le_bytes()); // drives_per_span
    payload.extend_from_slice(&(64u64 << 10).to_le_bytes()); // strip_size_bytes
    payload.extend_from_slice(&3u32.to_le_bytes()); // member_count
    payload.extend_from_slice(&[3, 0, 0, 0]); // name_len, vd_flags (no BGI pending, no cache VD), seq_cutoff_mib (the level's)
    payload.extend_from_slice(&[b"vd0".as_slice(), &[0; 29]].concat());
    payload.extend_from_slice(&(1u64 << 30).to_le_bytes()); // member_size_bytes
    payload.extend_from_slice(&0u32.to_le_bytes()); // bad_block_count
    payload.extend_from_slice(&u32::MAX.to_le_bytes()); // ssd_cache_vd_id: none
    [0u32, 1, 2].iter().for_each(|slot| payload.extend_from_slice(&slot.to_le_bytes()));
    payload.extend_from_slice(&3u32.to_le_bytes()); // spare slot
    payload.extend_from_slice(&1u32.to_le_bytes()); // dedicated_count
    payload.extend_from_slice(&0u32.to_le_bytes()); // drive group 0
    header.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    header.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    header.extend_from_slice(&1_700_000_000_123_456_789u64.to_le_bytes());
    header.resize(4092, 0);
    let header_crc = crc32c::crc32c(&header);
    header.extend_from_slice(&header_crc.to_le_bytes());
    let mut expected = [header, payload].concat();
    expected.resize(8192, 0);
    assert_eq!(bytes, expected);
}

fn check_decode(case: &str, mutate: impl FnOnce(&mut Vec<u8>), expected: impl FnOnce(&[u8]) -> MetadataError) {
    let mut bytes = encode(&superblock(small_config(9, 3), 1), 0).unwrap();
    mutate(&mut bytes);
    let expected = expected(&bytes);
    assert_eq!(decode(&bytes).err(), Some(expected), "{case}");
}

#[test]
fn header_corruption_is_detected_precisely() {
    use MetadataError::*;
    check_decode("bad magic", |b| b[3] = b'X', |_| BadMagic { found: *b"STOXCMD\0" });
    check_decode("zeroed header", |b| b[..4096].fill(0), |_| BadMagic { found: [0; 8] });
    check_decode("unknown version", |b| set_u32(b, 8, 14), |_| UnknownVersion { found: 14, supported: 13 });
    check_decode("version 0", |b| set_u32(b, 8, 0), |_| UnknownVersion { found: 0, supported: 13 });
    for offset in [12, 16, 31, 32, 48, 52, 56, 64, 72, 76, 80, 88, 1000, 4091, 4092, 4095] {
        check_decode(&format!("header byte {offset} flipped"), |b| b[offset] ^= 0x10, header_checksum_error);
    }
    check_decode("unknown flag", |b| (set_u32(b, 12, 4), reseal(b)).1, |_| UnknownFlags { found: 4 });
    check_decode("copy index 2", |b| (set_u32(b, 52, 2), reseal(b)).1, |_| CopyIndexInvalid { found: 2 });
    let reserved = |b: &mut Vec<u8>| (b[300] = 1, reseal(b)).1;
    check_decode("reserved", reserved, |_| ReservedNotZero { record: "header".into(), field: "reserved", offset_bytes: 300 });
    let too_long = |b: &mut Vec<u8>| (set_u32(b, 72, 2093057), reseal(b)).1;
    check_decode("payload too long", too_long, |_| PayloadTooLong { payload_bytes: 2093057, max_bytes: PAYLOAD_BYTES_MAX });
}

#[test]
fn payload_corruption_and_truncation_are_detected_precisely() {
    use MetadataError::*;
    let payload_checksum = |b: &[u8]| {
        let payload = &b[PAYLOAD..PAYLOAD + payload_len(b)];
        PayloadChecksum { payload_bytes: payload.len(), stored: u32_at(b, 76), computed: crc32c::crc32c(payload) }
    };
    for offset in [PAYLOAD, VD0 + 8, VD0 + 32] {
        check_decode(&format!("payload byte {offset} flipped"), |b| b[offset] ^= 1, payload_checksum);
    }
    let flip_last = |b: &mut Vec<u8>| {
        let last = PAYLOAD + payload_len(b) - 1;
        b[last] ^= 0x80;
    };
    check_decode("last payload byte", flip_last, payload_checksum);
    let header_only = |_: &[u8]| Truncated { what: "a metadata header".into(), needed_bytes: 4096, available_bytes: 100 };
    check_decode("100 bytes", |b| b.truncate(100), header_only);
    check_decode(
        "header and part of the payload",
        |b| b.truncate(4096 + 10),
        |b| Truncated { what: "the header and payload".into(), needed_bytes: 4096 + payload_len(b), available_bytes: 4106 },
    );
    check_decode("empty", |b| b.clear(), |_| Truncated { what: "a metadata header".into(), needed_bytes: 4096, available_bytes: 0 });
}

#[test]
fn bad_records_in_a_well_sealed_payload_are_detected_precisely() {
    use MetadataError::*;
    let sealed = |offset: usize, byte: u8| move |b: &mut Vec<u8>| (b[offset] = byte, reseal(b)).1;
    let vd0 = || "vd record 0 (vd 7)".to_string();
    let unknown = |record: String, field, code, known: &str| {
        let known = known.to_string();
        move |_: &[u8]| UnknownCode { record, field, code, known }
    };
    let states = "1 (UGood), 2 (Onln), 3 (Offln), 4 (Failed), 5 (Msng), 6 (HSP), 7 (Rbld), 8 (Cpybck), 9 (UBad), 10 (Jrnl), 11 (Mgrt)";
    check_decode("drive state 0", sealed(DRIVE_RECORDS + DRIVE_RECORD_BYTES + 4, 0), unknown("drive record 1".into(), "state", 0, states));
    check_decode("drive state 12", sealed(DRIVE_RECORDS + 4, 12), unknown("drive record 0".into(), "state", 12, states));
    let levels = "1 (r0), 2 (r1), 3 (r1e), 4 (r5), 5 (r6), 6 (r10), 7 (r50), 8 (r60), 9 (jbod)";
    check_decode("level 42", sealed(VD0 + 8, 42), unknown(vd0(), "level", 42, levels));
    check_decode("write policy 4", sealed(VD0 + 9, 4), unknown(vd0(), "write_policy", 4, "1 (wt), 2 (wb), 3 (awb)"));
    check_decode("read policy 0", sealed(VD0 + 10, 0), unknown(vd0(), "read_policy", 0, "1 (nora), 2 (ra), 3 (adra)"));
    check_decode("io policy 255", sealed(VD0 + 11, 255), unknown(vd0(), "io_policy", 255, "1 (direct), 2 (cached)"));
    let reserved = |record: String, field, offset_bytes| move |_: &[u8]| ReservedNotZero { record, field, offset_bytes };
    check_decode("drive reserved", sealed(DRIVE_RECORDS + 7, 1), reserved("drive record 0".into(), "reserved", 7));
    // seq_cutoff_mib (VD0 + 30) takes any value; a version-12 record's reserved bytes there
    // are checked by `version_12_metadata_knows_no_seq_cutoff`.
    check_decode("drive reserved tail", sealed(DRIVE_RECORDS + 45, 1), reserved("drive record 0".into(), "reserved", 45));
    // Version 10 holds `ssd_cache_vd_id` in the VD record's last 4 bytes; before, they are reserved.
    let mut v9 = encode(&superblock(small_config(9, 3), 1), 0).unwrap();
    relabel(&mut v9, 9);
    v9[VD0 + 79] = 1;
    reseal(&mut v9);
    assert_eq!(decode(&v9).err(), Some(ReservedNotZero { record: vd0(), field: "reserved", offset_bytes: 79 }), "vd reserved tail");
    let bgi_rate =
        |_: &[u8]| UnknownCode { record: "record counts".into(), field: "bgi_rate_percent", code: 101, known: "0 to 100".into() };
    check_decode("bgi rate", sealed(PAYLOAD + 15, 101), bgi_rate);
    let flags = |_: &[u8]| UnknownCode {
        record: "record counts".into(),
        field: "controller_flags",
        code: 4,
        known: "bit 0 (automatic rebuild off), bit 1 (copyback off)".into(),
    };
    check_decode("controller flag 4", sealed(PAYLOAD + 12, 4), flags);
    let rate =
        |_: &[u8]| UnknownCode { record: "record counts".into(), field: "rebuild_rate_percent", code: 101, known: "0 to 100".into() };
    check_decode("rebuild rate 101", sealed(PAYLOAD + 13, 101), rate);
    check_decode("name padding", sealed(VD0 + 32 + 5, b'z'), reserved(vd0(), "name padding", 35));
    let name_too_long = |_: &[u8]| NameTooLong { record: vd0(), len_bytes: 33, max_bytes: 32 };
    check_decode("name_len 33", sealed(VD0 + 28, 33), name_too_long);
    let utf8_error = String::from_utf8(vec![0xFF, b'd', b'0']).unwrap_err().utf8_error();
    check_decode("name not UTF-8", sealed(VD0 + 32, 0xFF), |_| NameNotUtf8 { record: vd0(), error: utf8_error });
}

#[test]
fn counts_and_lengths_that_disagree_with_the_payload_are_detected() {
    use MetadataError::*;
    let one_more_spare = |b: &mut Vec<u8>| (set_u32(b, PAYLOAD + 8, 2), reseal(b)).1;
    check_decode("hot spare count + 1", one_more_spare, |b| Truncated {
        what: "hot spare record 1 of 2".into(),
        needed_bytes: payload_len(b) + 8,
        available_bytes: payload_len(b),
    });
    let huge_members = |b: &mut Vec<u8>| (set_u32(b, VD0 + 24, u32::MAX), reseal(b)).1;
    check_decode("member count 2^32 - 1", huge_members, |b| Truncated {
        what: "member slots of vd record 0 (vd 7)".into(),
        needed_bytes: VD0 - PAYLOAD + 80 + 4 * u32::MAX as usize,
        available_bytes: payload_len(b),
    });
    let no_drives = |b: &mut Vec<u8>| (set_u32(b, PAYLOAD, 0), reseal(b)).1;
    check_decode("drive count 0 (records misread)", no_drives, |_| {
        UnknownCode {
            record: "vd record 0 (vd 0)".into(),
            field: "level",
            code: 100, // the low byte of drive record 0's drive_id
            known: "1 (r0), 2 (r1), 3 (r1e), 4 (r5), 5 (r6), 6 (r10), 7 (r50), 8 (r60), 9 (jbod)".into(),
        }
    });
    // The padding after the payload is zeros: claiming 4 of them leaves bytes no record uses.
    let longer = |b: &mut Vec<u8>| {
        let len = payload_len(b) as u32;
        (set_u32(b, 72, len + 4), reseal(b)).1
    };
    check_decode("payload 4 bytes longer", longer, |b| TrailingBytes { payload_bytes: payload_len(b), parsed_bytes: payload_len(b) - 4 });
}

#[test]
fn error_messages_name_the_field_and_what_was_expected() {
    let check = |case: &str, mutate: fn(&mut Vec<u8>), expected: &str| {
        let mut bytes = encode(&superblock(small_config(9, 3), 1), 0).unwrap();
        mutate(&mut bytes);
        let message = decode(&bytes).unwrap_err().to_string();
        assert_eq!(message, expected, "{case}");
    };
    check("magic", |b| b[..8].copy_from_slice(b"EFI PART"), "no storc metadata: magic is b\"EFI PART\", expected b\"STORCMD\\0\"");
    check("version", |b| set_u32(b, 8, 14), "metadata format version 14 is unknown; this storc reads versions 1 to 13");
    check(
        "level",
        |b| (b[VD0 + 8] = 0, reseal(b)).1,
        "vd record 0 (vd 7): `level` code 0 is unknown; known codes are 1 (r0), 2 (r1), 3 (r1e), 4 (r5), 5 (r6), 6 (r10), 7 (r50), 8 (r60), 9 (jbod)",
    );
    check("name", |b| (b[VD0 + 28] = 40, reseal(b)).1, "vd record 0 (vd 7): name is 40 bytes; at most 32 are allowed");
}

fn check_encode_error(case: &str, sb: Superblock, copy: u32, expected: MetadataError) {
    assert_eq!(encode(&sb, copy).err(), Some(expected), "{case}");
}

#[test]
fn encode_refuses_what_it_cannot_store() {
    use MetadataError::*;
    let with_name = |name: &str| {
        let mut config = small_config(1, 1);
        config.vds[0].name = name.to_string();
        superblock(config, 0)
    };
    let too_long = |len_bytes| NameTooLong { record: "vd record 0 (vd 7)".into(), len_bytes, max_bytes: 32 };
    check_encode_error("33-byte name", with_name(&"n".repeat(33)), 0, too_long(33));
    check_encode_error("17 two-byte chars", with_name(&"é".repeat(17)), 0, too_long(34));
    assert!(encode(&with_name(&"é".repeat(16)), 0).is_ok(), "32 bytes of UTF-8 fit");
    check_encode_error("copy 2", superblock(small_config(1, 1), 0), 2, CopyIndexInvalid { found: 2 });
    let mut other_id = superblock(small_config(1, 1), 0);
    other_id.controller_id = ControllerId(2);
    let mismatch = SuperblockMismatch { field: "controller_id", superblock: 2, config: 1 };
    check_encode_error("controller id", other_id, 0, mismatch);
    let mut other_generation = superblock(small_config(1, 1), 0);
    other_generation.generation = 7;
    let mismatch = SuperblockMismatch { field: "generation", superblock: 7, config: 1 };
    check_encode_error("generation", other_generation, 0, mismatch);
}

#[test]
fn the_largest_configuration_fits_and_one_drive_more_does_not() {
    let with_drives = |count: u32| {
        let mut config = ControllerConfig {
            controller_id: ControllerId(1),
            generation: 1,
            drives: vec![],
            vds: vec![],
            hot_spares: vec![],
            settings: Default::default(),
        };
        config.drives = (0..count)
            .map(|slot| DriveRecord {
                slot,
                drive_id: DriveId(slot.into()),
                state: DriveState::Online,
                capacity_bytes: 1,
                rebuild_row: 0,
                copy_slot: None,
            })
            .collect();
        superblock(config, 0)
    };
    let max_drives = ((PAYLOAD_BYTES_MAX - 16) / DRIVE_RECORD_BYTES) as u32;
    let bytes = encode(&with_drives(max_drives), 0).unwrap();
    assert!(bytes.len() as u64 <= COPY_AREA_BYTES);
    assert_eq!(decode(&bytes), Ok(with_drives(max_drives)));
    let payload_bytes = COUNTS_BYTES + DRIVE_RECORD_BYTES * (max_drives as usize + 1);
    let expected = MetadataError::ConfigTooLarge { payload_bytes, max_bytes: PAYLOAD_BYTES_MAX };
    check_encode_error("one drive more", with_drives(max_drives + 1), 0, expected);
}

// ---- write / read / clear on drives ----

const DRIVE_BYTES: u64 = 8 << 20;

/// Writes raw bytes, as a crash or another program would leave them.
fn write_raw(drive: &dyn Drive, offset_bytes: u64, bytes: &[u8]) {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(bytes) });
    let mut out = Vec::new();
    ctx.poll(&mut out, true);
    assert_eq!(out.pop().expect("memory drives complete at once").result, Ok(()));
}

fn read_outcome(drive: &dyn Drive) -> (u64, u32, OtherCopy) {
    let outcome = metadata::read(drive).unwrap().expect("metadata present");
    (outcome.superblock.generation, outcome.copy, outcome.other)
}

#[test]
fn a_blank_drive_reads_as_none_and_a_written_one_reads_back() {
    let drive = MemDrive::new(DRIVE_BYTES);
    assert_eq!(metadata::read(&drive), Ok(None));
    let sb = superblock(full_config(5, 1), 3);
    metadata::write(&drive, &sb).unwrap();
    let expected = ReadOutcome { superblock: sb, copy: 0, other: OtherCopy::Agrees };
    assert_eq!(metadata::read(&drive), Ok(Some(expected)));
}

#[test]
fn newest_generation_wins_and_an_interrupted_write_is_survived() {
    let drive = MemDrive::new(DRIVE_BYTES);
    let generation = |n| superblock(small_config(5, n), 0);
    metadata::write(&drive, &generation(1)).unwrap();
    metadata::write(&drive, &generation(2)).unwrap();
    assert_eq!(read_outcome(&drive), (2, 0, OtherCopy::Agrees));
    // Crash after copy 0 of generation 3 was flushed, before copy 1 was written.
    write_raw(&drive, 0, &encode(&generation(3), 0).unwrap());
    assert_eq!(read_outcome(&drive), (3, 0, OtherCopy::Older { generation: 2 }));
    // Crash while copy 0 of generation 4 was being written: its header landed, its payload not.
    let mut config = small_config(5, 4);
    config.vds[0].name = "renamed".into();
    write_raw(&drive, 0, &encode(&superblock(config, 0), 0).unwrap()[..HEADER_BYTES]);
    let (generation, copy, other) = read_outcome(&drive);
    assert_eq!((generation, copy), (2, 1), "the whole copy 1 is taken");
    assert!(matches!(other, OtherCopy::Invalid(MetadataError::PayloadChecksum { .. })), "{other:?}");
    // Only an older copy 1 beats a newer but torn copy 0; the next write repairs both.
    metadata::write(&drive, &superblock(small_config(5, 5), 0)).unwrap();
    assert_eq!(read_outcome(&drive), (5, 0, OtherCopy::Agrees));
}

#[test]
fn garbage_over_either_copy_leaves_the_other_readable() {
    let garbage: Vec<u8> = (0..COPY_AREA_BYTES as usize).map(|i| (i * 7 + 3) as u8).collect();
    let no_magic = |bytes: &[u8]| MetadataError::BadMagic { found: bytes[..8].try_into().unwrap() };
    for torn_copy in 0..2u32 {
        let drive = MemDrive::new(DRIVE_BYTES);
        metadata::write(&drive, &superblock(small_config(5, 9), 0)).unwrap();
        write_raw(&drive, u64::from(torn_copy) * COPY_AREA_BYTES, &garbage);
        let expected = (9, 1 - torn_copy, OtherCopy::Invalid(no_magic(&garbage)));
        assert_eq!(read_outcome(&drive), expected, "garbage over copy {torn_copy}");
    }
}

#[test]
fn a_drive_with_the_magic_but_no_valid_copy_is_an_error() {
    let drive = MemDrive::new(DRIVE_BYTES);
    metadata::write(&drive, &superblock(small_config(5, 9), 0)).unwrap();
    for copy in 0..2 {
        write_raw(&drive, copy * COPY_AREA_BYTES + 4096, &[0xEE; 4096]); // first payload block
    }
    match metadata::read(&drive) {
        Err(MetadataError::NoValidCopy { drive, copy0, copy1 }) => {
            assert_eq!(drive, "mem:8388608");
            assert!(matches!(*copy0, MetadataError::PayloadChecksum { .. }), "{copy0:?}");
            assert!(matches!(*copy1, MetadataError::PayloadChecksum { .. }), "{copy1:?}");
        }
        other => panic!("expected NoValidCopy, got {other:?}"),
    }
}

#[test]
fn a_copy_found_in_the_wrong_place_is_not_trusted() {
    let drive = MemDrive::new(DRIVE_BYTES);
    let sb = superblock(small_config(5, 9), 0);
    metadata::write(&drive, &sb).unwrap();
    write_raw(&drive, COPY_AREA_BYTES, &encode(&sb, 0).unwrap());
    let mismatch = MetadataError::CopyIndexMismatch { offset_bytes: COPY_AREA_BYTES, expected: 1, found: 0 };
    assert_eq!(read_outcome(&drive), (9, 0, OtherCopy::Invalid(mismatch)));
}

#[test]
fn two_valid_copies_of_one_generation_that_differ_are_reported() {
    let drive = MemDrive::new(DRIVE_BYTES);
    metadata::write(&drive, &superblock(small_config(5, 9), 0)).unwrap();
    let mut other = small_config(5, 9);
    other.vds[0].write_policy = WritePolicy::WriteThrough;
    write_raw(&drive, COPY_AREA_BYTES, &encode(&superblock(other, 0), 1).unwrap());
    assert_eq!(read_outcome(&drive), (9, 0, OtherCopy::Conflicts));
}

#[test]
fn clear_makes_a_drive_blank() {
    let drive = MemDrive::new(DRIVE_BYTES);
    metadata::clear(&drive).unwrap();
    assert_eq!(metadata::read(&drive), Ok(None), "clearing a blank drive");
    metadata::write(&drive, &superblock(full_config(5, 1), 0)).unwrap();
    metadata::clear(&drive).unwrap();
    assert_eq!(metadata::read(&drive), Ok(None));
}

#[test]
fn a_drive_smaller_than_the_metadata_area_is_refused() {
    let drive = MemDrive::new(3 << 20);
    let expected = MetadataError::DriveTooSmall { drive: "mem:3145728".into(), capacity_bytes: 3 << 20, needed_bytes: 4 << 20 };
    assert_eq!(metadata::read(&drive), Err(expected.clone()));
    assert_eq!(metadata::write(&drive, &superblock(small_config(1, 1), 0)), Err(expected.clone()));
    assert_eq!(metadata::clear(&drive), Err(expected));
}

#[test]
fn drive_errors_name_the_drive_and_the_step() {
    let faulty = FaultyDrive::new(Arc::new(MemDrive::named("slot3".into(), DRIVE_BYTES)));
    let sb = |generation| superblock(small_config(5, generation), 0);
    metadata::write(&faulty, &sb(1)).unwrap();
    // Copy 1 cannot be written: copy 0 already holds generation 2, which read then prefers.
    let copy1_first_byte = COPY_AREA_BYTES..COPY_AREA_BYTES + 1;
    faulty.set_faults(Faults { write_error_ranges: vec![copy1_first_byte], ..Faults::default() });
    let expected = MetadataError::Io {
        drive: "slot3".into(),
        action: "writing metadata copy 1 at byte 2097152".into(),
        error: DriveError::Io(libc::EIO),
    };
    assert_eq!(metadata::write(&faulty, &sb(2)), Err(expected));
    assert_eq!(read_outcome(&faulty), (2, 0, OtherCopy::Older { generation: 1 }));
    faulty.set_failed(true);
    let gone = |action: &str| MetadataError::Io { drive: "slot3".into(), action: action.into(), error: DriveError::Gone };
    assert_eq!(metadata::clear(&faulty), Err(gone("writing metadata copy 0 at byte 0")));
    let expected = MetadataError::NoValidCopy {
        drive: "slot3".into(),
        copy0: Box::new(gone("reading metadata copy 0 at byte 0")),
        copy1: Box::new(gone("reading metadata copy 1 at byte 2097152")),
    };
    assert_eq!(metadata::read(&faulty), Err(expected));
}

#[test]
fn slow_drives_are_waited_for() {
    let faulty = FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES)));
    faulty.set_faults(Faults { latency: Some(Duration::from_millis(2)), ..Faults::default() });
    let sb = superblock(small_config(5, 1), 0);
    metadata::write(&faulty, &sb).unwrap();
    assert_eq!(metadata::read(&faulty).unwrap().map(|o| o.superblock), Some(sb));
}

#[test]
fn a_file_drive_keeps_metadata_across_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member0");
    let config = FileDriveConfig { create_size_bytes: Some(DRIVE_BYTES), ..FileDriveConfig::default() };
    let sb = superblock(full_config(5, 77), 0);
    metadata::write(&FileDrive::open(&path, &config).unwrap(), &sb).unwrap();
    let reopened = FileDrive::open(&path, &config).unwrap();
    let expected = ReadOutcome { superblock: sb, copy: 0, other: OtherCopy::Agrees };
    assert_eq!(metadata::read(&reopened), Ok(Some(expected)));
}

// ---- assembly ----

/// One found drive: (controller, generation, config variant). Its drive index is its position.
type Found = (u128, u64, u8);

fn found_superblocks(found: &[Found]) -> Vec<(usize, Superblock)> {
    let superblock_of = |&(controller, generation, variant): &Found, index: usize| {
        let mut config = small_config(controller, generation);
        config.vds[0].strip_size_bytes <<= variant;
        superblock(config, index as u32)
    };
    found.iter().enumerate().map(|(index, f)| (index, superblock_of(f, index))).collect()
}

/// `c5 g2 current[0, 1] stale[2@g1] conflicting[3]`, leaving out empty lists but `current`.
fn describe_group(group: &ConfigGroup) -> String {
    let mut text = format!("c{} g{} current{:?}", group.controller_id.0, group.config.generation, group.current);
    if !group.stale.is_empty() {
        let stale: Vec<String> = group.stale.iter().map(|s| format!("{}@g{}", s.drive_index, s.generation)).collect();
        text += &format!(" stale[{}]", stale.join(", "));
    }
    if !group.conflicting.is_empty() {
        text += &format!(" conflicting{:?}", group.conflicting);
    }
    text
}

fn describe(assembly: &Assembly) -> String {
    let ours = assembly.ours.as_ref().map_or("none".to_string(), describe_group);
    let foreign: Vec<String> = assembly.foreign.iter().map(describe_group).collect();
    format!("ours {ours}; foreign [{}]", foreign.join("; "))
}

fn check_assembly(ours: Option<u128>, found: &[Found], expected: &str) {
    let assembly = assemble(ours.map(ControllerId), found_superblocks(found));
    assert_eq!(describe(&assembly), expected, "ours {ours:?}, found {found:?}");
    let superblocks = found_superblocks(found);
    for group in assembly.ours.iter().chain(&assembly.foreign) {
        let newest = group.current.first().map(|&i| &superblocks[i].1.config);
        assert_eq!(Some(&group.config), newest, "the group's config is its first current drive's");
    }
}

#[test]
fn assembly_takes_the_newest_generation_and_lists_stale_members() {
    check_assembly(Some(5), &[(5, 4, 0), (5, 4, 0), (5, 3, 0)], "ours c5 g4 current[0, 1] stale[2@g3]; foreign []");
    check_assembly(Some(5), &[(5, 1, 0), (5, 3, 0), (5, 2, 0)], "ours c5 g3 current[1] stale[2@g2, 0@g1]; foreign []");
    check_assembly(Some(5), &[(5, 7, 0)], "ours c5 g7 current[0]; foreign []");
    check_assembly(Some(5), &[(5, 7, 1), (5, 7, 0), (5, 6, 0)], "ours c5 g7 current[0] stale[2@g6] conflicting[1]; foreign []");
}

#[test]
fn assembly_groups_foreign_controllers() {
    check_assembly(
        Some(5),
        &[(5, 4, 0), (8, 2, 0), (6, 9, 0), (8, 3, 0), (5, 4, 0)],
        "ours c5 g4 current[0, 4]; foreign [c6 g9 current[2]; c8 g3 current[3] stale[1@g2]]",
    );
    check_assembly(Some(5), &[(6, 1, 0)], "ours none; foreign [c6 g1 current[0]]");
    check_assembly(Some(5), &[], "ours none; foreign []");
}

#[test]
fn assembly_without_an_id_adopts_only_a_single_controller() {
    check_assembly(None, &[(6, 2, 0), (6, 1, 0)], "ours c6 g2 current[0] stale[1@g1]; foreign []");
    check_assembly(None, &[(6, 2, 0), (7, 9, 0)], "ours none; foreign [c6 g2 current[0]; c7 g9 current[1]]");
    check_assembly(None, &[], "ours none; foreign []");
}

/// Version 4 (before the consistency check rate) is still read, with the default rate; its
/// byte 14 is reserved, so a version-4 record that sets it is refused.
#[test]
fn version_4_metadata_is_read_with_the_default_cc_rate() {
    let mut sb = superblock(small_config(0x79, 5), 1);
    let bytes = encode_old(&sb, 4);
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let mut rated = bytes.clone();
    rated[PAYLOAD + 14] = 50;
    reseal(&mut rated);
    let expected = MetadataError::ReservedNotZero { record: "record counts".into(), field: "reserved", offset_bytes: 14 };
    assert_eq!(decode(&rated).err(), Some(expected));

    // Version 5 keeps it, and refuses a rate past 100.
    sb.config.settings.cc_rate_percent = 55;
    let bytes = encode(&sb, 0).unwrap();
    assert_eq!(decode(&bytes).unwrap().config.settings.cc_rate_percent, 55);
    let mut bad = bytes.clone();
    bad[PAYLOAD + 14] = 101;
    reseal(&mut bad);
    let expected =
        MetadataError::UnknownCode { record: "record counts".into(), field: "cc_rate_percent", code: 101, known: "0 to 100".into() };
    assert_eq!(decode(&bad).err(), Some(expected));
}

/// Version 5 (before BGI) is still read, with the default BGI rate and no BGI pending; its
/// counts byte 15 and VD record bytes 29-31 are reserved, so a version-5 record that sets them
/// is refused. Version 6 keeps both, and refuses a flag it does not know.
#[test]
fn version_5_metadata_is_read_with_no_bgi_pending() {
    let mut sb = superblock(small_config(0x7a, 5), 1);
    let bytes = encode_old(&sb, 5);
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let vd_record_at = PAYLOAD + COUNTS_BYTES + 4 * DRIVE_RECORD_BYTES;
    let vd_record_at_v5 = vd_record_at - (COUNTS_BYTES - 16);
    for (at, record, offset_bytes) in [(PAYLOAD + 15, "record counts", 15), (vd_record_at_v5 + 29, "vd record 0 (vd 7)", 29)] {
        let mut set = bytes.clone();
        set[at] = 1;
        reseal(&mut set);
        let expected = MetadataError::ReservedNotZero { record: record.into(), field: "reserved", offset_bytes };
        assert_eq!(decode(&set).err(), Some(expected), "{record} byte {offset_bytes}");
    }

    sb.config.settings.bgi_rate_percent = 5;
    sb.config.vds[0].bgi_pending = true;
    let bytes = encode(&sb, 0).unwrap();
    assert_eq!(bytes[vd_record_at + 29], 1, "vd_flags bit 0");
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let mut unknown_flag = bytes.clone();
    unknown_flag[vd_record_at + 29] = 9;
    reseal(&mut unknown_flag);
    let expected = MetadataError::UnknownCode {
        record: "vd record 0 (vd 7)".into(),
        field: "vd_flags",
        code: 9,
        known: "bit 0 (background initialization pending), bit 1 (cache VD), bit 2 (write-back cache VD)".into(),
    };
    assert_eq!(decode(&unknown_flag).err(), Some(expected));
}

/// Version 6's patrol read settings round-trip; a zero delay, an unknown flag or a set
/// reserved byte is refused.
#[test]
fn patrol_read_settings_are_kept_and_checked() {
    let mut sb = superblock(small_config(0x7b, 5), 1);
    sb.config.settings.patrol = PatrolSettings {
        enabled: false,
        manual: true,
        include_ssds: true,
        rate_percent: 45,
        delay_hours: 12,
        last_start_unix_secs: 1_800_000_000,
    };
    let bytes = encode(&sb, 0).unwrap();
    assert_eq!(bytes[PAYLOAD + 16], 7, "patrol_flags: off, manual, SSDs");
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let counts = || "record counts".to_string();
    let cases: [(usize, u8, MetadataError); 3] = [
        (
            PAYLOAD + 16,
            8,
            MetadataError::UnknownCode {
                record: counts(),
                field: "patrol_flags",
                code: 8,
                known: "bit 0 (patrol read off), bit 1 (manual), bit 2 (SSDs included)".into(),
            },
        ),
        (
            PAYLOAD + 21,
            4,
            MetadataError::UnknownCode {
                record: counts(),
                field: "journal_stale_legs",
                code: 4,
                known: "bit 0 (leg 0), bit 1 (leg 1)".into(),
            },
        ),
        (
            PAYLOAD + 17,
            101,
            MetadataError::UnknownCode { record: counts(), field: "patrol_rate_percent", code: 101, known: "0 to 100".into() },
        ),
    ];
    for (at, value, expected) in cases {
        let mut bad = bytes.clone();
        bad[at] = value;
        reseal(&mut bad);
        assert_eq!(decode(&bad).err(), Some(expected), "byte {at} = {value}");
    }
    let mut no_delay = bytes.clone();
    no_delay[PAYLOAD + 18..PAYLOAD + 20].fill(0);
    reseal(&mut no_delay);
    let expected =
        MetadataError::UnknownCode { record: counts(), field: "patrol_delay_hours", code: 0, known: "1 to 65535 (hours)".into() };
    assert_eq!(decode(&no_delay).err(), Some(expected));
}

/// Version 6's consistency check schedule round-trips; an unknown mode, a zero delay or a set
/// reserved byte is refused.
#[test]
fn the_consistency_check_schedule_is_kept_and_checked() {
    let mut sb = superblock(small_config(0x7c, 5), 1);
    sb.config.settings.cc_schedule = CcSchedule { mode: CcMode::Sequential, delay_hours: 24, next_start_unix_secs: 1_900_000_000 };
    let bytes = encode(&sb, 0).unwrap();
    assert_eq!(bytes[PAYLOAD + 20], 2, "cc_mode seq");
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let counts = || "record counts".to_string();
    let known = "1 (off), 2 (seq), 3 (conc)".to_string();
    let mut unknown = bytes.clone();
    unknown[PAYLOAD + 20] = 4;
    reseal(&mut unknown);
    assert_eq!(decode(&unknown).err(), Some(MetadataError::UnknownCode { record: counts(), field: "cc_mode", code: 4, known }));
    let mut no_delay = bytes.clone();
    no_delay[PAYLOAD + 22..PAYLOAD + 24].fill(0);
    reseal(&mut no_delay);
    let expected = MetadataError::UnknownCode { record: counts(), field: "cc_delay_hours", code: 0, known: "1 to 65535 (hours)".into() };
    assert_eq!(decode(&no_delay).err(), Some(expected));
    // Version 6 kept bytes 40 to 47 reserved; version 7 keeps the trusted journal's id there.
    let mut tail = bytes.clone();
    tail[PAYLOAD + 47] = 1;
    set_u32(&mut tail, 8, 6);
    reseal(&mut tail);
    assert_eq!(decode(&tail).err(), Some(MetadataError::ReservedNotZero { record: counts(), field: "reserved", offset_bytes: 47 }));
    let mut with_journal = sb.clone();
    with_journal.config.settings.journal_id = 0xfeed_f00d;
    let bytes = encode(&with_journal, 0).unwrap();
    assert_eq!(bytes[PAYLOAD + 40..PAYLOAD + 48], 0xfeed_f00du64.to_le_bytes());
    assert_eq!(decode(&bytes), Ok(with_journal.clone()));
    // Version 7 kept byte 21 reserved; version 8 names the stale legs of a mirrored journal there.
    with_journal.config.settings.journal_stale_legs = 0b01;
    let bytes = encode(&with_journal, 0).unwrap();
    assert_eq!(bytes[PAYLOAD + 21], 1);
    assert_eq!(decode(&bytes), Ok(with_journal));
    let mut v7 = bytes.clone();
    set_u32(&mut v7, 8, 7);
    reseal(&mut v7);
    assert_eq!(decode(&v7).err(), Some(MetadataError::ReservedNotZero { record: counts(), field: "journal_stale_legs", offset_bytes: 21 }));
}

/// A drive record in `state` (code `code`, new in the version after `older`) was never
/// written by any storc at version `older`: such a record is refused as unknown, naming the
/// codes `older` knows (`known`); records of version `older` are read otherwise.
fn check_state_unknown_before(state: DriveState, code: u8, older: u32, known: &str) {
    let mut config = small_config(0x99, 5);
    config.drives[1].state = state;
    let sb = superblock(config, 0);
    let bytes = encode(&sb, 0).unwrap();
    assert_eq!(decode(&bytes), Ok(sb.clone()));
    let mut old = bytes.clone();
    set_u32(&mut old, 8, older);
    reseal(&mut old);
    let expected = MetadataError::UnknownCode { record: "drive record 1".into(), field: "state", code, known: known.into() };
    assert_eq!(decode(&old).err(), Some(expected), "{state:?} in a version {older} record");
    let mut plain = sb;
    plain.config.drives[1].state = DriveState::Online;
    let mut old = encode(&plain, 0).unwrap();
    relabel(&mut old, older);
    assert_eq!(decode(&old), Ok(plain), "a version {older} record without {state:?}");
}

/// Version 9 added the drive state `Jrnl` (code 10).
#[test]
fn version_8_metadata_knows_no_journal_drive() {
    let known = "1 (UGood), 2 (Onln), 3 (Offln), 4 (Failed), 5 (Msng), 6 (HSP), 7 (Rbld), 8 (Cpybck), 9 (UBad)";
    check_state_unknown_before(DriveState::Journal, 10, 8, known);
}

/// Version 10 added SSD caching: the cache VD flag (`vd_flags` bit 1) and `ssd_cache_vd_id`.
/// A version-9 record with the flag was never written and is refused; one without reads as
/// caching nothing.
#[test]
fn version_9_metadata_knows_no_ssd_cache() {
    let mut config = small_config(0x9a, 5);
    config.vds[0].cache_vd = true;
    let cache_vd = superblock(config.clone(), 0);
    let bytes = encode(&cache_vd, 0).unwrap();
    assert_eq!(bytes[VD0 + 29], 2, "vd_flags bit 1");
    assert_eq!(decode(&bytes), Ok(cache_vd));
    let mut v9 = bytes.clone();
    relabel(&mut v9, 9);
    let known = "bit 0 (background initialization pending)".to_string();
    let expected = MetadataError::UnknownCode { record: "vd record 0 (vd 7)".into(), field: "vd_flags", code: 2, known };
    assert_eq!(decode(&v9).err(), Some(expected));
    config.vds[0].cache_vd = false;
    config.vds[0].ssd_cache_vd_id = Some(3);
    let cached = superblock(config, 0);
    let bytes = encode(&cached, 0).unwrap();
    assert_eq!(bytes[VD0 + 76..VD0 + 80], 3u32.to_le_bytes());
    assert_eq!(decode(&bytes), Ok(cached.clone()));
    let mut v9 = bytes;
    relabel(&mut v9, 9);
    let mut uncached = cached;
    uncached.config.vds[0].ssd_cache_vd_id = None;
    assert_eq!(decode(&v9), Ok(uncached));
}

/// Bytes of a one-VD configuration written by this version, relabelled as the older `version`:
/// the VD record's `ssd_cache_vd_id` (version 10) goes back to reserved zeros.
fn relabel(bytes: &mut [u8], version: u32) {
    set_u32(bytes, 8, version);
    if version < 10 {
        bytes[VD0 + 76..VD0 + 80].fill(0);
    }
    reseal(bytes);
}

/// Version 12 added the drive state `Mgrt` (code 11).
#[test]
fn version_11_metadata_knows_no_migration_target() {
    let known = "1 (UGood), 2 (Onln), 3 (Offln), 4 (Failed), 5 (Msng), 6 (HSP), 7 (Rbld), 8 (Cpybck), 9 (UBad), 10 (Jrnl)";
    check_state_unknown_before(DriveState::Migrate, 11, 11, known);
}

/// Version 11 added the write-back cache VD flag (`vd_flags` bit 2): a version-10 record with
/// it was never written and is refused.
#[test]
fn version_10_metadata_knows_no_write_back_cache_vd() {
    let mut config = small_config(0x9b, 5);
    config.vds[0].cache_vd = true;
    config.vds[0].cache_write_back = true;
    let cache_vd = superblock(config, 0);
    let bytes = encode(&cache_vd, 0).unwrap();
    assert_eq!(bytes[VD0 + 29], 6, "vd_flags bits 1 and 2");
    assert_eq!(decode(&bytes), Ok(cache_vd));
    let mut v10 = bytes;
    relabel(&mut v10, 10);
    let known = "bit 0 (background initialization pending), bit 1 (cache VD)".to_string();
    let expected = MetadataError::UnknownCode { record: "vd record 0 (vd 7)".into(), field: "vd_flags", code: 6, known };
    assert_eq!(decode(&v10).err(), Some(expected));
}

/// Version 13 put a VD's sequential cutoff (`seqcutoff=`) in the VD record's bytes 30-31,
/// reserved before: 0 is the level's default, 0xFFFF never, anything else MiB. A version-12
/// record with them set was never written and is refused; one without reads as the default.
#[test]
fn version_12_metadata_knows_no_seq_cutoff() {
    let mut config = small_config(0x9c, 5);
    for (cutoff, code) in [(SeqCutoff::LevelDefault, 0u16), (SeqCutoff::Never, 0xFFFF), (SeqCutoff::Mib(16), 16)] {
        config.vds[0].seq_cutoff = cutoff;
        let sb = superblock(config.clone(), 0);
        let bytes = encode(&sb, 0).unwrap();
        assert_eq!(bytes[VD0 + 30..VD0 + 32], code.to_le_bytes(), "seq_cutoff_mib of {cutoff:?}");
        assert_eq!(decode(&bytes), Ok(sb));
    }
    let mut v12 = encode(&superblock(config.clone(), 0), 0).unwrap();
    set_u32(&mut v12, 8, 12);
    reseal(&mut v12);
    let expected = MetadataError::ReservedNotZero { record: "vd record 0 (vd 7)".into(), field: "reserved", offset_bytes: 30 };
    assert_eq!(decode(&v12).err(), Some(expected));
    v12[VD0 + 30..VD0 + 32].fill(0);
    reseal(&mut v12);
    config.vds[0].seq_cutoff = SeqCutoff::LevelDefault;
    assert_eq!(decode(&v12), Ok(superblock(config, 0)));
}
