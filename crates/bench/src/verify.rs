//! `--verify`: every written sector says where it belongs and which write put it there, and
//! every read checks it.
//!
//! The unit is the 512-byte sector, not the request: patterns mix block sizes (file-server reads
//! 4 KiB over what eight 512-byte writes left), so only a unit that every request is made of can
//! be checked whatever wrote it. Each written sector is laid out as:
//!
//! | bytes    | field                                                          |
//! |----------|----------------------------------------------------------------|
//! | 0..8     | magic `storcVfy`                                               |
//! | 8..16    | byte offset of this sector in the target (little-endian)       |
//! | 16..24   | write sequence number, unique in the run (little-endian)       |
//! | 24..28   | crc32c of bytes 0..24 followed by 28..512 (little-endian)      |
//! | 28..32   | zero                                                           |
//! | 32..512  | pseudo-random bytes seeded by (offset, sequence)               |
//!
//! The run remembers the sequence of the last completed write of every sector (a sparse map,
//! 4 bytes per written sector). A read then checks, per sector it remembers: magic, offset
//! (catches misdirected writes and reads), crc (catches flipped bits) and sequence (catches lost
//! and stale writes). Sectors this run never wrote are not checked: their content is whatever
//! the target held before.
//!
//! Two requests that overlap are never in flight together while verifying: a request reserves
//! its sectors at issue ([`Verifier::try_reserve`]) and frees them at completion, after its
//! check, so the remembered sequence is exactly what a read must find.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub const VERIFY_SECTOR_BYTES: u64 = 512;
const MAGIC: [u8; 8] = *b"storcVfy";
const HEADER_BYTES: usize = 32;
/// Sectors per map entry: one allocation per 64 KiB of the target that was written.
const MAP_CHUNK_SECTORS: u64 = 128;
/// Map value of a sector never written in this run.
const NEVER_WRITTEN: u32 = 0;
/// Map value of a sector whose last write failed: its content is undefined.
const UNKNOWN: u32 = u32::MAX;
/// How many mismatches are kept with their details (the first of each read); the rest are only
/// counted.
pub const MISMATCH_DETAILS_MAX: usize = 16;

/// Why a sector read back is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum MismatchKind {
    /// No header: the write never reached the medium, or the data was overwritten.
    NoHeader { all_zero: bool },
    /// A header for another offset: a misdirected write or read.
    WrongOffset { found_offset_bytes: u64 },
    /// The header is there but the checksum does not match: flipped bits.
    BadChecksum,
    /// The right sector, but from an older (or newer) write than the last one completed.
    StaleWrite { expected_sequence: u64, found_sequence: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub offset_bytes: u64,
    #[serde(flatten)]
    pub kind: MismatchKind,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "offset {}: ", self.offset_bytes)?;
        match &self.kind {
            MismatchKind::NoHeader { all_zero: true } => write!(f, "no header (all zeros)"),
            MismatchKind::NoHeader { all_zero: false } => write!(f, "no header (foreign data)"),
            MismatchKind::WrongOffset { found_offset_bytes } => write!(f, "holds the sector of offset {found_offset_bytes}"),
            MismatchKind::BadChecksum => write!(f, "checksum mismatch"),
            MismatchKind::StaleWrite { expected_sequence, found_sequence } => {
                write!(f, "holds write #{found_sequence}, expected #{expected_sequence}")
            }
        }
    }
}

/// What the reads of one point (or run) checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyCounts {
    /// Sectors read that this run had written, so were checked.
    pub checked_sectors: u64,
    pub mismatched_sectors: u64,
    /// Reads with at least one mismatched sector.
    pub mismatched_reads: u64,
    /// The first bad sector of each of the first [`MISMATCH_DETAILS_MAX`] bad reads.
    pub first_mismatches: Vec<Mismatch>,
}

impl VerifyCounts {
    pub fn add(&mut self, other: &VerifyCounts) {
        self.checked_sectors += other.checked_sectors;
        self.mismatched_sectors += other.mismatched_sectors;
        self.mismatched_reads += other.mismatched_reads;
        let room = MISMATCH_DETAILS_MAX.saturating_sub(self.first_mismatches.len());
        self.first_mismatches.extend(other.first_mismatches.iter().take(room).cloned());
    }
}

/// The verification state of one run against one target, shared by every worker of every
/// point, so that a later point checks what an earlier one wrote.
pub struct Verifier {
    /// Last completed write sequence (low 32 bits) per sector, by 64 KiB chunk.
    written: Mutex<HashMap<u64, Box<[u32; MAP_CHUNK_SECTORS as usize]>>>,
    /// Requests in flight: start sector → end sector.
    reserved: Mutex<BTreeMap<u64, u64>>,
    next_sequence: AtomicU64,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier::new()
    }
}

impl Verifier {
    pub fn new() -> Verifier {
        Verifier { written: Mutex::new(HashMap::new()), reserved: Mutex::new(BTreeMap::new()), next_sequence: AtomicU64::new(1) }
    }

    /// Reserves `[offset, offset + len)` for one request; false if another request in flight
    /// overlaps it (the caller picks another offset).
    pub fn try_reserve(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let (start, end) = sector_range(offset_bytes, len_bytes);
        let mut reserved = self.reserved.lock().expect("reservations lock");
        let before_overlaps = reserved.range(..end).next_back().is_some_and(|(_, &e)| e > start);
        if before_overlaps {
            return false;
        }
        reserved.insert(start, end);
        true
    }

    pub fn release(&self, offset_bytes: u64) {
        let removed = self.reserved.lock().expect("reservations lock").remove(&(offset_bytes / VERIFY_SECTOR_BYTES));
        assert!(removed.is_some(), "release of offset {offset_bytes}, which was not reserved");
    }

    /// Fills `buf` (a reserved write at `offset_bytes`) with headed sectors; returns the write's
    /// sequence number for [`Verifier::finish_write`].
    pub fn prepare_write(&self, offset_bytes: u64, buf: &mut [u8]) -> u64 {
        assert!(
            (buf.len() as u64).is_multiple_of(VERIFY_SECTOR_BYTES) && offset_bytes.is_multiple_of(VERIFY_SECTOR_BYTES),
            "unaligned write"
        );
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        assert!(sequence < u64::from(UNKNOWN), "more writes than the verify map can number");
        for (index, sector) in buf.chunks_exact_mut(VERIFY_SECTOR_BYTES as usize).enumerate() {
            fill_sector(sector, offset_bytes + index as u64 * VERIFY_SECTOR_BYTES, sequence);
        }
        sequence
    }

    /// Records a completed write: its sectors now hold `sequence`, or, if it failed, anything.
    pub fn finish_write(&self, offset_bytes: u64, len_bytes: u64, sequence: u64, succeeded: bool) {
        let value = if succeeded { sequence as u32 } else { UNKNOWN };
        let (start, end) = sector_range(offset_bytes, len_bytes);
        let mut written = self.written.lock().expect("verify map lock");
        for sector in start..end {
            let chunk = written.entry(sector / MAP_CHUNK_SECTORS).or_insert_with(|| Box::new([NEVER_WRITTEN; MAP_CHUNK_SECTORS as usize]));
            chunk[(sector % MAP_CHUNK_SECTORS) as usize] = value;
        }
    }

    /// Checks what a successful read of `offset_bytes` returned against the last writes.
    pub fn check_read(&self, offset_bytes: u64, data: &[u8]) -> VerifyCounts {
        let (start, end) = sector_range(offset_bytes, data.len() as u64);
        let expected: Vec<u32> = {
            let written = self.written.lock().expect("verify map lock");
            (start..end)
                .map(|s| written.get(&(s / MAP_CHUNK_SECTORS)).map_or(NEVER_WRITTEN, |chunk| chunk[(s % MAP_CHUNK_SECTORS) as usize]))
                .collect()
        };
        let mut counts = VerifyCounts::default();
        for (index, sector) in data.chunks_exact(VERIFY_SECTOR_BYTES as usize).enumerate() {
            let expected = expected[index];
            if expected == NEVER_WRITTEN || expected == UNKNOWN {
                continue;
            }
            counts.checked_sectors += 1;
            let offset = offset_bytes + index as u64 * VERIFY_SECTOR_BYTES;
            if let Some(kind) = check_sector(sector, offset, expected) {
                // Details of the first bad sector of each read: the list then shows distinct
                // places, not the neighbours of one.
                if counts.mismatched_sectors == 0 {
                    counts.first_mismatches.push(Mismatch { offset_bytes: offset, kind });
                }
                counts.mismatched_sectors += 1;
            }
        }
        counts.mismatched_reads = u64::from(counts.mismatched_sectors > 0);
        counts
    }
}

fn sector_range(offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
    assert!(len_bytes > 0, "empty request");
    (offset_bytes / VERIFY_SECTOR_BYTES, (offset_bytes + len_bytes).div_ceil(VERIFY_SECTOR_BYTES))
}

/// Writes one headed sector.
pub fn fill_sector(sector: &mut [u8], offset_bytes: u64, sequence: u64) {
    debug_assert_eq!(sector.len() as u64, VERIFY_SECTOR_BYTES);
    sector[0..8].copy_from_slice(&MAGIC);
    sector[8..16].copy_from_slice(&offset_bytes.to_le_bytes());
    sector[16..24].copy_from_slice(&sequence.to_le_bytes());
    sector[28..32].fill(0);
    let mut state = offset_bytes.rotate_left(17) ^ sequence.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for word in sector[HEADER_BYTES..].chunks_exact_mut(8) {
        word.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    let crc = sector_crc(sector);
    sector[24..28].copy_from_slice(&crc.to_le_bytes());
}

fn sector_crc(sector: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&sector[0..24]), &sector[28..])
}

/// `None` if the sector is the one write `expected_sequence` (low 32 bits) put at `offset_bytes`.
fn check_sector(sector: &[u8], offset_bytes: u64, expected_sequence: u32) -> Option<MismatchKind> {
    let field = |range: std::ops::Range<usize>| u64::from_le_bytes(sector[range].try_into().expect("8 bytes"));
    if sector[0..8] != MAGIC {
        return Some(MismatchKind::NoHeader { all_zero: sector.iter().all(|&b| b == 0) });
    }
    let found_crc = u32::from_le_bytes(sector[24..28].try_into().expect("4 bytes"));
    if found_crc != sector_crc(sector) {
        return Some(MismatchKind::BadChecksum);
    }
    if field(8..16) != offset_bytes {
        return Some(MismatchKind::WrongOffset { found_offset_bytes: field(8..16) });
    }
    let found_sequence = field(16..24);
    if found_sequence as u32 != expected_sequence {
        return Some(MismatchKind::StaleWrite { expected_sequence: u64::from(expected_sequence), found_sequence });
    }
    None
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(verifier: &Verifier, offset: u64, len: usize) -> Vec<u8> {
        assert!(verifier.try_reserve(offset, len as u64));
        let mut buf = vec![0u8; len];
        let sequence = verifier.prepare_write(offset, &mut buf);
        verifier.finish_write(offset, len as u64, sequence, true);
        verifier.release(offset);
        buf
    }

    #[test]
    fn a_read_of_what_was_written_passes_and_never_written_sectors_are_not_checked() {
        let verifier = Verifier::new();
        let data = written(&verifier, 4096, 4096);
        assert_eq!(verifier.check_read(4096, &data), VerifyCounts { checked_sectors: 8, ..Default::default() });
        // A read that also covers unwritten sectors (zeros or leftovers) checks only the written.
        let mut wider = vec![0xEEu8; 3 * 4096];
        wider[4096..8192].copy_from_slice(&data);
        assert_eq!(verifier.check_read(0, &wider).mismatched_sectors, 0);
        assert_eq!(verifier.check_read(0, &wider).checked_sectors, 8);
    }

    #[test]
    fn every_kind_of_damage_is_caught() {
        let verifier = Verifier::new();
        let first = written(&verifier, 0, 1024);
        let second = written(&verifier, 0, 1024);
        let check = |data: &[u8], kind: MismatchKind| {
            let counts = verifier.check_read(0, data);
            assert_eq!(counts.mismatched_sectors, 2, "{counts:?}");
            assert_eq!(counts.mismatched_reads, 1);
            assert_eq!(counts.first_mismatches[0], Mismatch { offset_bytes: 0, kind });
        };
        assert_eq!(verifier.check_read(0, &second).mismatched_sectors, 0);
        check(&first, MismatchKind::StaleWrite { expected_sequence: 2, found_sequence: 1 });
        check(&vec![0u8; 1024], MismatchKind::NoHeader { all_zero: true });
        let mut flipped = second.clone();
        flipped[100] ^= 1;
        flipped[612] ^= 0xA5;
        check(&flipped, MismatchKind::BadChecksum);
        let elsewhere = written(&verifier, 8192, 1024);
        check(&elsewhere, MismatchKind::WrongOffset { found_offset_bytes: 8192 });
    }

    #[test]
    fn failed_writes_leave_their_sectors_unchecked() {
        let verifier = Verifier::new();
        written(&verifier, 0, 512);
        let mut buf = vec![0u8; 512];
        let sequence = verifier.prepare_write(0, &mut buf);
        verifier.finish_write(0, 512, sequence, false);
        assert_eq!(verifier.check_read(0, &[0u8; 512]).checked_sectors, 0);
    }

    #[test]
    fn overlapping_requests_cannot_both_be_reserved() {
        let verifier = Verifier::new();
        assert!(verifier.try_reserve(8192, 8192));
        assert!(!verifier.try_reserve(8192, 512));
        assert!(!verifier.try_reserve(4096, 8192));
        assert!(!verifier.try_reserve(16384 - 512, 4096));
        assert!(verifier.try_reserve(0, 8192));
        assert!(verifier.try_reserve(16384, 4096));
        verifier.release(8192);
        assert!(verifier.try_reserve(12288, 4096));
    }
}
