//! On-disk metadata: the controller configuration every member carries in its first 4 MiB.
//!
//! # Design
//!
//! Each member holds two copies of a [`Superblock`], copy 0 at byte 0 and copy 1 at byte
//! [`COPY_AREA_BYTES`]. A copy is a 4096-byte header (magic, version, ids, generation, lengths,
//! two CRC-32C checksums) followed by the configuration, padded to 4096 bytes so that O_DIRECT
//! works. [`write`] writes and flushes copy 0 before it starts copy 1: a crash can tear at most
//! one copy, and [`read`] then takes the other. The byte tables are in `docs/on-disk-format.md`;
//! a unit test keeps them and the code in agreement.
//!
//! The codec ([`encode`], [`decode`]) and [`assemble`] are pure; [`read`], [`write`] and
//! [`clear`] block on the drive and are for the control plane only, never for a shard.

mod assemble;
mod codec;
#[cfg(test)]
pub(crate) mod tests;

pub use assemble::{assemble, Assembly, ConfigGroup, StaleDrive};
pub use codec::{decode, encode, FORMAT_VERSION, HEADER_BYTES, MAGIC};
pub(crate) use codec::{tiles, Field};

use crate::config::{ControllerConfig, ControllerId, DriveId};
use crate::vd::MEMBER_RESERVED_BYTES;
use drive::{Completion, Drive, DriveError, DriveOp, IoBuf, IoCtx};
use std::time::Duration;

/// Copies of the superblock on every member.
pub const COPY_COUNT: u32 = 2;
/// Bytes each copy may occupy: its header, its payload and the padding.
pub const COPY_AREA_BYTES: u64 = 2 << 20;
/// Bytes at the start of a member that hold metadata.
pub const METADATA_AREA_BYTES: u64 = COPY_AREA_BYTES * COPY_COUNT as u64;
/// Unit every copy is padded to, so that O_DIRECT can write it from an aligned buffer.
pub const BLOCK_BYTES: usize = 4096;
/// Bytes of each copy area format 4 uses: the last MiB of copy 1's area is the write-intent
/// bitmap's, and copy 0 mirrors copy 1's size.
pub const COPY_USED_BYTES: u64 = 1 << 20;
/// The largest configuration (payload) a copy holds.
pub const PAYLOAD_BYTES_MAX: usize = COPY_USED_BYTES as usize - HEADER_BYTES;
/// The largest payload formats 1 to 3 wrote (a whole copy area).
pub const PAYLOAD_BYTES_MAX_V3: usize = COPY_AREA_BYTES as usize - HEADER_BYTES;
/// Where the write-intent bitmap area starts on a member, and its size (`crate::bitmap`).
pub const BITMAP_AREA_OFFSET_BYTES: u64 = COPY_AREA_BYTES + COPY_USED_BYTES;
pub const BITMAP_AREA_BYTES: u64 = METADATA_AREA_BYTES - BITMAP_AREA_OFFSET_BYTES;

const _: () = assert!(METADATA_AREA_BYTES <= MEMBER_RESERVED_BYTES);
const _: () = assert!(HEADER_BYTES.is_multiple_of(BLOCK_BYTES) && PAYLOAD_BYTES_MAX.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(BITMAP_AREA_BYTES == 1 << 20 && BITMAP_AREA_OFFSET_BYTES == 3 << 20);

/// What one member carries: who it belongs to, who it is, and the whole configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Must equal `config.controller_id`.
    pub controller_id: ControllerId,
    pub drive_id: DriveId,
    pub slot: u32,
    /// Must equal `config.generation`.
    pub generation: u64,
    /// This drive's capacity when the superblock was written.
    pub capacity_bytes: u64,
    pub written_unix_ns: u64,
    pub config: ControllerConfig,
}

/// The superblock [`read`] chose, and what the other copy said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOutcome {
    pub superblock: Superblock,
    /// The copy it came from (0 or 1).
    pub copy: u32,
    pub other: OtherCopy,
}

/// The state of the copy [`read`] did not choose. Anything but `Agrees` means the next
/// [`write`] should happen soon, to restore two good copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OtherCopy {
    /// Valid and identical.
    Agrees,
    /// Valid with an older generation: a write was interrupted between the two copies.
    Older { generation: u64 },
    /// Valid, same generation, different contents: never written by storc; copy 0 was taken.
    Conflicts,
    /// Unreadable, torn or corrupted.
    Invalid(MetadataError),
}

/// What is wrong with metadata, or with the drive holding it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("{what} needs {needed_bytes} bytes but only {available_bytes} are there")]
    Truncated { what: String, needed_bytes: usize, available_bytes: usize },
    #[error("no storc metadata: magic is b\"{}\", expected b\"STORCMD\\0\"", .found.escape_ascii())]
    BadMagic { found: [u8; 8] },
    #[error("metadata format version {found} is unknown; this storc reads versions 1 to {supported}")]
    UnknownVersion { found: u32, supported: u32 },
    #[error("header checksum mismatch: stored crc32c {stored:#010x}, computed {computed:#010x} (torn or corrupted header)")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("payload checksum mismatch over {payload_bytes} bytes: stored crc32c {stored:#010x}, computed {computed:#010x} (torn or corrupted configuration)")]
    PayloadChecksum { payload_bytes: usize, stored: u32, computed: u32 },
    #[error("header flags {found:#x} have unknown bits set; format version 1 defines none")]
    UnknownFlags { found: u32 },
    #[error("copy index {found} is not 0 or 1")]
    CopyIndexInvalid { found: u32 },
    #[error("the copy at byte {offset_bytes} says it is copy {found}, expected copy {expected}")]
    CopyIndexMismatch { offset_bytes: u64, expected: u32, found: u32 },
    #[error("{record}: reserved field `{field}` at byte {offset_bytes} of the record is not zero")]
    ReservedNotZero { record: String, field: &'static str, offset_bytes: usize },
    #[error("header says the payload is {payload_bytes} bytes; a copy holds at most {max_bytes}")]
    PayloadTooLong { payload_bytes: usize, max_bytes: usize },
    #[error("the configuration needs {payload_bytes} bytes but a metadata copy holds at most {max_bytes}")]
    ConfigTooLarge { payload_bytes: usize, max_bytes: usize },
    #[error("{record}: `{field}` code {code} is unknown; known codes are {known}")]
    UnknownCode { record: String, field: &'static str, code: u8, known: String },
    #[error("{record}: name is {len_bytes} bytes; at most {max_bytes} are allowed")]
    NameTooLong { record: String, len_bytes: usize, max_bytes: usize },
    #[error("{record}: name is not valid UTF-8 ({error})")]
    NameNotUtf8 { record: String, error: std::str::Utf8Error },
    #[error("payload is {payload_bytes} bytes but its records end at byte {parsed_bytes}")]
    TrailingBytes { payload_bytes: usize, parsed_bytes: usize },
    #[error("superblock `{field}` is {superblock} but its configuration says {config}")]
    SuperblockMismatch { field: &'static str, superblock: u128, config: u128 },
    #[error("drive {drive} has {capacity_bytes} bytes; metadata needs the first {needed_bytes}")]
    DriveTooSmall { drive: String, capacity_bytes: u64, needed_bytes: u64 },
    #[error("drive {drive}: {action} failed: {error}")]
    Io { drive: String, action: String, error: DriveError },
    #[error("drive {drive} has storc metadata but no valid copy: copy 0: {copy0}; copy 1: {copy1}")]
    NoValidCopy { drive: String, copy0: Box<MetadataError>, copy1: Box<MetadataError> },
}

/// Where copy `copy` starts on every member.
///
/// # Panics
/// If `copy` is not 0 or 1.
pub fn copy_offset_bytes(copy: u32) -> u64 {
    assert!(copy < COPY_COUNT, "copy index {copy} is not 0 or 1");
    u64::from(copy) * COPY_AREA_BYTES
}

/// Writes copy 0, flushes, writes copy 1, flushes, so that a crash tears at most one copy.
/// Blocks: control plane only.
///
/// # Errors
/// If the superblock cannot be encoded (nothing is written then), the drive is smaller than
/// [`METADATA_AREA_BYTES`], or an I/O fails (the message names the drive, the copy and the step).
pub fn write(drive: &dyn Drive, sb: &Superblock) -> Result<(), MetadataError> {
    check_capacity(drive)?;
    // Encode both before writing either: a configuration that does not fit changes nothing.
    let copies = [encode(sb, 0)?, encode(sb, 1)?];
    for (copy, bytes) in (0..COPY_COUNT).zip(copies) {
        debug_assert_eq!(decode(&bytes).as_ref(), Ok(sb), "copy {copy} decodes to what was encoded");
        write_and_flush(drive, copy, &bytes)?;
    }
    Ok(())
}

/// Writes each superblock to its drive as [`write`] does, every drive at once: a configuration
/// change (and a member taken out of service, which holds writes until it is recorded) then
/// waits for the slowest drive's two flushes rather than for the sum over all drives, as md
/// submits its superblock writes together. A drive whose thread cannot be started is written in
/// line afterwards. The results are in the order of `writes`. Blocks: control plane only.
pub fn write_all(writes: &[(&dyn Drive, Superblock)]) -> Vec<Result<(), MetadataError>> {
    std::thread::scope(|scope| {
        let started: Vec<_> = writes
            .iter()
            .map(|(drive, superblock)| {
                let writer = std::thread::Builder::new().name("storc-metadata".into());
                writer.spawn_scoped(scope, move || write(*drive, superblock)).ok()
            })
            .collect();
        started
            .into_iter()
            .zip(writes)
            .map(|(thread, (drive, superblock))| match thread {
                Some(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => write(*drive, superblock),
            })
            .collect()
    })
}

/// Reads both copies and returns the valid one with the newest generation (copy 0 on a tie).
/// Blocks: control plane only.
///
/// # Errors
/// `Ok(None)` for a blank drive (neither copy has the magic). An error when the drive is too
/// small, or when some copy has the magic but neither copy is valid ([`MetadataError::NoValidCopy`],
/// which says what is wrong with each).
pub fn read(drive: &dyn Drive) -> Result<Option<ReadOutcome>, MetadataError> {
    check_capacity(drive)?;
    let copies = [read_copy(drive, 0), read_copy(drive, 1)];
    choose(&drive.info().name, copies)
}

/// Zeroes both headers, copy 0 first: the drive then reads as blank (foreign config "del").
/// Blocks: control plane only.
///
/// # Errors
/// If the drive is too small or an I/O fails.
pub fn clear(drive: &dyn Drive) -> Result<(), MetadataError> {
    check_capacity(drive)?;
    let zeroes = [0u8; HEADER_BYTES];
    for copy in 0..COPY_COUNT {
        write_and_flush(drive, copy, &zeroes)?;
    }
    Ok(())
}

fn check_capacity(drive: &dyn Drive) -> Result<(), MetadataError> {
    let info = drive.info();
    if info.capacity_bytes < METADATA_AREA_BYTES {
        return Err(MetadataError::DriveTooSmall {
            drive: info.name.clone(),
            capacity_bytes: info.capacity_bytes,
            needed_bytes: METADATA_AREA_BYTES,
        });
    }
    Ok(())
}

fn write_and_flush(drive: &dyn Drive, copy: u32, bytes: &[u8]) -> Result<(), MetadataError> {
    assert!(bytes.len() as u64 <= COPY_AREA_BYTES && bytes.len().is_multiple_of(BLOCK_BYTES));
    let offset_bytes = copy_offset_bytes(copy);
    let op = DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(bytes) };
    run_blocking(drive, op, || format!("writing metadata copy {copy} at byte {offset_bytes}"))?;
    run_blocking(drive, DriveOp::Flush, || format!("flushing after metadata copy {copy}"))?;
    Ok(())
}

/// Reads a whole copy area (one I/O; the header says how much of it is payload).
fn read_copy(drive: &dyn Drive, copy: u32) -> Result<Superblock, MetadataError> {
    let offset_bytes = copy_offset_bytes(copy);
    let op = DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(COPY_AREA_BYTES as usize) };
    let completion = run_blocking(drive, op, || format!("reading metadata copy {copy} at byte {offset_bytes}"))?;
    let buf = completion.buf.expect("a read returns its buffer");
    let (superblock, found) = codec::decode_copy(buf.as_slice())?;
    if found != copy {
        return Err(MetadataError::CopyIndexMismatch { offset_bytes, expected: copy, found });
    }
    Ok(superblock)
}

/// Picks between the two copies of one drive (see [`read`] for the rules).
fn choose(drive: &str, copies: [Result<Superblock, MetadataError>; 2]) -> Result<Option<ReadOutcome>, MetadataError> {
    let outcome = |superblock, copy, other| Ok(Some(ReadOutcome { superblock, copy, other }));
    match copies {
        [Ok(first), Ok(second)] if second.generation > first.generation => {
            outcome(second, 1, OtherCopy::Older { generation: first.generation })
        }
        [Ok(first), Ok(second)] => {
            let other = match () {
                _ if second.generation < first.generation => OtherCopy::Older { generation: second.generation },
                _ if second == first => OtherCopy::Agrees,
                _ => OtherCopy::Conflicts,
            };
            outcome(first, 0, other)
        }
        [Ok(first), Err(error)] => outcome(first, 0, OtherCopy::Invalid(error)),
        [Err(error), Ok(second)] => outcome(second, 1, OtherCopy::Invalid(error)),
        [Err(MetadataError::BadMagic { .. }), Err(MetadataError::BadMagic { .. })] => Ok(None),
        [Err(copy0), Err(copy1)] => {
            Err(MetadataError::NoValidCopy { drive: drive.to_string(), copy0: Box::new(copy0), copy1: Box::new(copy1) })
        }
    }
}

/// Submits one operation on a private context and waits for its completion.
fn run_blocking(drive: &dyn Drive, op: DriveOp, action: impl FnOnce() -> String) -> Result<Completion, MetadataError> {
    submit_and_wait(drive, op).map_err(|error| MetadataError::Io { drive: drive.info().name.clone(), action: action(), error })
}

/// Runs one operation on a private context and waits for it: the control plane's blocking I/O
/// (metadata, the bitmap's header and slot 0). Never call it on a shard.
pub(crate) fn submit_and_wait(drive: &dyn Drive, op: DriveOp) -> Result<Completion, DriveError> {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, op);
    let mut out = Vec::with_capacity(1);
    loop {
        ctx.poll(&mut out, true);
        if let Some(completion) = out.pop() {
            return match completion.result {
                Ok(()) => Ok(completion),
                Err(ref error) => Err(error.clone()),
            };
        }
        assert!(ctx.in_flight() > 0, "drive {} accepted an operation and never completed it", drive.info().name);
        // Without a ring, poll cannot sleep; delayed completions (emulated latency) are due later.
        std::thread::sleep(Duration::from_micros(100));
    }
}
