//! Reading a journal device back: its superblock, each partition's checkpoint, and the records
//! from there on while each passes every check, handed to the caller's [`Sink`].

use super::format::{
    self, Checkpoint, RecordHeader, Seed, Superblock, BLOCK_BYTES, KIND_DATA, KIND_GROUP, KIND_IMAGE, KIND_WRAP,
    RING_OFFSET_IN_PARTITION_BYTES,
};
use super::{ring, ReplayImage, ReplayRecord, ReplayReport};
use crate::metadata::submit_and_wait;
use drive::{Drive, DriveOp, IoBuf};
use std::sync::Arc;

/// Of the `sources` legs, the one whose partition `index` holds the furthest valid record (a
/// leg that failed while the other went on stops earlier): found by a scan that applies
/// nothing. A leg that cannot be scanned is passed over.
pub(super) fn furthest_leg(legs: &[Arc<dyn Drive>], sources: &[usize], sb: &Superblock, seed: Seed, index: u32) -> usize {
    if sources.len() == 1 {
        return sources[0];
    }
    let reach = |&leg: &usize| {
        let mut scratch = ReplayReport::default();
        let mut sink = Sink { data: &mut |_| Ok(()), image: &mut |_| Ok(()) };
        replay_partition(&*legs[leg], sb, seed, index, &mut scratch, &mut sink).unwrap_or(0)
    };
    *sources.iter().max_by_key(|leg| reach(leg)).expect("a source leg")
}

fn read_block(drive: &dyn Drive, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, String> {
    let done = submit_and_wait(drive, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) })
        .map_err(|e| format!("journal {}: read at byte {offset_bytes} failed: {e}", drive.info().name))?;
    Ok(done.buf.expect("a read returns its buffer").as_slice().to_vec())
}

pub(super) enum SuperblockError {
    Unreadable(String),
    /// Another controller's journal: never formatted over.
    Foreign(String),
}

/// The newest valid superblock copy, `None` for a blank device.
///
/// # Errors
/// A read fails, or a copy is another controller's (its own CRC seed validates it).
pub(super) fn read_superblock(drive: &dyn Drive, seed: Seed) -> Result<Option<Superblock>, SuperblockError> {
    let mut newest: Option<Superblock> = None;
    for copy in 0..2 {
        let bytes = read_block(drive, copy * BLOCK_BYTES, BLOCK_BYTES).map_err(SuperblockError::Unreadable)?;
        match Superblock::decode(&bytes, seed) {
            Ok(sb) if newest.is_none_or(|n| sb.generation > n.generation) => newest = Some(sb),
            Ok(_) => {}
            Err(_) if bytes[..8] == format::SUPERBLOCK_MAGIC => {
                let theirs = u128::from_le_bytes(bytes[format::superblock::CONTROLLER_ID.range()].try_into().expect("16 bytes"));
                if Superblock::decode(&bytes, Seed::of_controller(theirs)).is_ok() {
                    return Err(SuperblockError::Foreign(format!(
                        "journal {} belongs to controller {theirs:032x}; clear it (overwrite its first 8 KiB) to use it here",
                        drive.info().name
                    )));
                }
            }
            Err(_) => {}
        }
    }
    Ok(newest)
}

/// The valid checkpoint of partition `index` with the larger counter, if any.
fn read_checkpoint(drive: &dyn Drive, sb: &Superblock, seed: Seed, index: u32) -> Result<Option<Checkpoint>, String> {
    let mut newest: Option<Checkpoint> = None;
    for block in 0..2 {
        let bytes = read_block(drive, sb.partition_offset_bytes(index) + block * BLOCK_BYTES, BLOCK_BYTES)?;
        let Ok(checkpoint) = Checkpoint::decode(&bytes, seed) else { continue };
        let ours = checkpoint.partition_index == index
            && checkpoint.journal_id == sb.journal_id
            && checkpoint.superblock_generation == sb.generation;
        if ours && newest.is_none_or(|n| checkpoint.counter > n.counter) {
            newest = Some(checkpoint);
        }
    }
    Ok(newest)
}

/// Replays partition `index` from its checkpoint; returns the last valid sequence seen.
pub(super) fn replay_partition(
    drive: &dyn Drive,
    sb: &Superblock,
    seed: Seed,
    index: u32,
    report: &mut ReplayReport,
    sink: &mut Sink,
) -> Result<u64, String> {
    let Some(checkpoint) = read_checkpoint(drive, sb, seed, index)? else { return Ok(0) };
    let ring = ring::Ring::new(
        sb.partition_offset_bytes(index) + RING_OFFSET_IN_PARTITION_BYTES,
        sb.partition_offset_bytes(index) + sb.partition_size_bytes(index),
        0,
    );
    // Each kind lives in its own partitions: a record of the other kind is not the next one.
    let kinds: &[u32] = if index < sb.partition_count { &[KIND_DATA, KIND_GROUP] } else { &[KIND_IMAGE] };
    let (mut position, mut sequence) = (checkpoint.tail_position_bytes, checkpoint.tail_sequence);
    let mut scanned_bytes = 0;
    let mut last_valid = sequence.saturating_sub(1);
    while scanned_bytes < ring.capacity_bytes() {
        let Some((header, data)) = read_record(drive, seed, sb.journal_id, position, sequence, &ring)? else { break };
        if header.kind != KIND_WRAP && !kinds.contains(&header.kind) {
            break;
        }
        let failed = |e: String| format!("journal {}: replay of record {sequence}: {e}", drive.info().name);
        if header.kind == KIND_DATA {
            let record = ReplayRecord { vd_id: header.vd_id, vd_offset_bytes: header.vd_offset_bytes, data };
            (sink.data)(&record).map_err(failed)?;
            report.records += 1;
            report.data_records += 1;
            report.data_bytes += u64::from(header.data_bytes);
        } else if header.kind == KIND_GROUP {
            for record in group_writes(&header, &data) {
                (sink.data)(&record).map_err(failed)?;
                report.records += 1;
            }
            report.data_records += 1;
            report.data_bytes += u64::from(header.data_bytes);
        } else if header.kind == KIND_IMAGE {
            (sink.image)(&image_of(&header, data)).map_err(failed)?;
            report.images += 1;
        }
        scanned_bytes += u64::from(header.record_bytes);
        position = match header.kind {
            KIND_WRAP => ring.start_bytes(),
            _ => ring.next_position(position, u64::from(header.record_bytes)),
        };
        last_valid = sequence;
        sequence += 1;
    }
    Ok(last_valid)
}

/// Where replay hands what it finds.
pub(super) struct Sink<'a> {
    pub data: &'a mut dyn FnMut(&ReplayRecord) -> Result<(), String>,
    pub image: &'a mut dyn FnMut(&ReplayImage) -> Result<(), String>,
}

/// The member writes of an image record, its data cut along its entries.
fn image_of(header: &RecordHeader, data: Vec<u8>) -> ReplayImage {
    let lens = header.entries.iter().map(|entry| entry.len_bytes);
    let writes =
        header.entries.iter().zip(cut(&data, lens)).map(|(entry, bytes)| (entry.member, entry.member_offset_bytes, bytes)).collect();
    ReplayImage { vd_id: header.vd_id, row: header.vd_offset_bytes, writes }
}

/// The VD writes of a group record, in the order they were placed, its data cut along its
/// entries.
fn group_writes(header: &RecordHeader, data: &[u8]) -> Vec<ReplayRecord> {
    let entries = header.group_entries();
    let bytes = cut(data, entries.iter().map(|entry| entry.len_bytes));
    entries
        .iter()
        .zip(bytes)
        .map(|(entry, data)| ReplayRecord { vd_id: entry.vd_id, vd_offset_bytes: entry.vd_offset_bytes, data })
        .collect()
}

/// `data` cut into pieces of `lens` bytes, one after the other (the header's entries cover it).
fn cut(data: &[u8], lens: impl Iterator<Item = u32>) -> Vec<Vec<u8>> {
    let mut at = 0;
    lens.map(|len| {
        let piece = data[at..at + len as usize].to_vec();
        at += len as usize;
        piece
    })
    .collect()
}

/// The record at `position` if it passes every check for being the next one (`sequence`),
/// with its data; `None` where replay stops.
fn read_record(
    drive: &dyn Drive,
    seed: Seed,
    journal_id: u64,
    position: u64,
    sequence: u64,
    ring: &ring::Ring,
) -> Result<Option<(RecordHeader, Vec<u8>)>, String> {
    let header_bytes = read_block(drive, position, BLOCK_BYTES)?;
    let Ok(header) = RecordHeader::decode(&header_bytes, seed) else { return Ok(None) };
    let fits = position + u64::from(header.record_bytes) <= ring.start_bytes() + ring.capacity_bytes();
    if header.journal_id != journal_id || header.sequence != sequence || header.position_bytes != position || !fits {
        return Ok(None);
    }
    if header.kind == KIND_WRAP {
        return Ok(Some((header, Vec::new())));
    }
    let mut data = read_block(drive, position + BLOCK_BYTES, u64::from(header.record_bytes) - BLOCK_BYTES)?;
    if !header.data_matches(seed, &data) {
        return Ok(None);
    }
    data.truncate(header.data_bytes as usize);
    Ok(Some((header, data)))
}
