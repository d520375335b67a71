//! The controller cache's journal: the software battery.
//!
//! A separate device (a file, a block device, an emulated SSD) that holds every write the cache
//! has acknowledged but not yet written to the members, as self-delimiting records in the
//! manner of md's raid5-cache. It is cut into one partition per shard ([`part`]), so shards never
//! coordinate: the rows a shard owns are the only ones its partition records, and a VD range's
//! records therefore sit in one partition in the order they were written.
//!
//! At start the control plane opens the device ([`Journal::open`]): it reads the superblock,
//! replays each partition from its checkpoint until the first record that fails a check (magic,
//! seeded CRC, journal id, sequence, own position, page CRCs), and hands every record to the
//! caller, which writes it to its VD through the normal path. Once the caller has flushed the
//! VDs, [`Journal::finish_replay`] writes a new layout whose sequence numbers start above any
//! that the device could still hold, so that a stale record beyond the replayed ones can never
//! validate. Written by hand because it is the core of the controller: no crate keeps a
//! checksummed, sequence-numbered log on a raw device with the ordering rules a RAID cache needs.

pub mod format;
pub mod part;
pub mod ring;
#[cfg(test)]
mod tests;

use crate::metadata::submit_and_wait;
use drive::{Drive, DriveOp, IoBuf};
use format::{Checkpoint, RecordHeader, Seed, Superblock, BLOCK_BYTES, KIND_DATA, KIND_WRAP, RING_OFFSET_IN_PARTITION_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("the journal failed: {0}")]
    Failed(String),
    #[error("a member flush before a journal checkpoint failed: {0}")]
    Members(String),
}

/// What the shards and the control plane share about a journal: whether it works, and how
/// full each partition is.
#[derive(Debug)]
pub struct Health {
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    used_bytes: Vec<AtomicU64>,
    capacity_bytes: Vec<AtomicU64>,
}

impl Health {
    fn new(partition_count: u32) -> Health {
        let counters = || (0..partition_count).map(|_| AtomicU64::new(0)).collect();
        Health { failed: AtomicBool::new(false), failure: Mutex::new(None), used_bytes: counters(), capacity_bytes: counters() }
    }

    pub fn is_usable(&self) -> bool {
        !self.failed.load(Ordering::Acquire)
    }

    /// Why the journal failed, if it did.
    pub fn failure(&self) -> Option<String> {
        if self.is_usable() {
            return None;
        }
        self.failure.lock().expect("journal health lock").clone()
    }

    /// Marks the journal failed (the first reason is kept).
    pub fn fail(&self, why: &str) {
        let mut failure = self.failure.lock().expect("journal health lock");
        failure.get_or_insert_with(|| why.to_string());
        self.failed.store(true, Ordering::Release);
    }

    fn set_used(&self, partition: u32, bytes: u64) {
        self.used_bytes[partition as usize].store(bytes, Ordering::Relaxed);
    }

    fn set_capacity(&self, partition: u32, bytes: u64) {
        self.capacity_bytes[partition as usize].store(bytes, Ordering::Relaxed);
    }

    /// Bytes of records replay could need, over every partition.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Bytes of ring, over every partition.
    pub fn ring_bytes(&self) -> u64 {
        self.capacity_bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

/// A record replay found, for the caller to write to its VD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayRecord {
    pub vd_id: u32,
    pub vd_offset_bytes: u64,
    pub data: Vec<u8>,
}

/// What the last start's replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub records: u64,
    pub data_bytes: u64,
    /// Whether the device held a journal of ours (false: it was blank and is formatted now).
    pub found: bool,
    /// The device held a journal of ours that the metadata does not trust (it was detached
    /// after it failed, or never trusted): it was not replayed and is formatted anew.
    pub untrusted: bool,
}

/// An opened journal device (control plane).
pub struct Journal {
    name: String,
    drive: Arc<dyn Drive>,
    seed: Seed,
    superblock: Superblock,
    /// The sequence every partition starts from after replay.
    next_sequence: u64,
    health: Arc<Health>,
    replay: ReplayReport,
}

impl Journal {
    /// Opens the journal on `drive` for a controller with `partition_count` shards: replays what
    /// an earlier run left (each record handed to `apply`, partition by partition, in order) if
    /// its id is `trusted_id` (the one the metadata names; 0 trusts none), and returns the
    /// journal, which [`Journal::finish_replay`] must then lay out anew.
    ///
    /// # Errors
    /// The device is too small, belongs to another controller, cannot be read, or `apply` failed.
    pub fn open(
        drive: Arc<dyn Drive>,
        controller_id: u128,
        partition_count: u32,
        trusted_id: u64,
        apply: &mut dyn FnMut(&ReplayRecord) -> Result<(), String>,
    ) -> Result<Journal, String> {
        let name = drive.info().name.clone();
        let capacity_bytes = drive.info().capacity_bytes / BLOCK_BYTES * BLOCK_BYTES;
        let seed = Seed::of_controller(controller_id);
        let on_device = read_superblock(&*drive, seed)?;
        let untrusted = on_device.is_some_and(|sb| trusted_id == 0 || sb.journal_id != trusted_id);
        // An untrusted journal may hold records older than writes the members took without it.
        let found = on_device.filter(|_| !untrusted);
        let mut replay = ReplayReport { found: found.is_some(), untrusted, ..ReplayReport::default() };
        let mut last_sequence = 0;
        if let Some(sb) = &found {
            for index in 0..sb.partition_count {
                last_sequence = last_sequence.max(replay_partition(&*drive, sb, seed, index, &mut replay, apply)?);
            }
        }
        let journal_id = found.map_or_else(|| rand::random::<u64>().max(1), |sb| sb.journal_id);
        let mut superblock = Superblock::plan(controller_id, journal_id, capacity_bytes, partition_count)?;
        superblock.generation = on_device.map_or(1, |sb| sb.generation + 1);
        // Above every sequence the device can hold: it holds at most one record per block.
        let next_sequence = last_sequence + capacity_bytes / BLOCK_BYTES + 1;
        let health = Arc::new(Health::new(partition_count));
        Ok(Journal { name, drive, seed, superblock, next_sequence, health, replay })
    }

    /// Writes the new layout: every partition empty, sequences above any on the device. Call it
    /// once the replayed records are durable on the members.
    ///
    /// # Errors
    /// A write or flush of the device failed.
    pub fn finish_replay(&self) -> Result<(), String> {
        let sb = &self.superblock;
        for index in 0..sb.partition_count {
            let ring_start = sb.partition_offset_bytes(index) + RING_OFFSET_IN_PARTITION_BYTES;
            let checkpoint = Checkpoint {
                partition_index: index,
                journal_id: sb.journal_id,
                superblock_generation: sb.generation,
                counter: 0,
                tail_position_bytes: ring_start,
                tail_sequence: self.next_sequence,
            };
            // Both blocks: a block left from the old layout names the old generation anyway.
            for block in 0..2 {
                self.write_block(sb.partition_offset_bytes(index) + block * BLOCK_BYTES, &checkpoint.encode(self.seed))?;
            }
        }
        self.flush()?;
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for copy in 0..2 {
            self.write_block(copy * BLOCK_BYTES, &sb.encode(self.seed, now_ns))?;
        }
        self.flush()
    }

    fn write_block(&self, offset_bytes: u64, bytes: &[u8]) -> Result<(), String> {
        submit_and_wait(&*self.drive, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(bytes) })
            .map(|_| ())
            .map_err(|e| format!("journal {}: write at byte {offset_bytes} failed: {e}", self.name))
    }

    fn flush(&self) -> Result<(), String> {
        submit_and_wait(&*self.drive, DriveOp::Flush).map(|_| ()).map_err(|e| format!("journal {}: flush failed: {e}", self.name))
    }

    /// What a shard needs to run partition `index` (after [`Journal::finish_replay`]).
    pub fn part_spec(&self, index: u32) -> PartSpec {
        PartSpec {
            drive: Arc::clone(&self.drive),
            superblock: self.superblock,
            seed: self.seed,
            index,
            sequence: self.next_sequence,
            health: Arc::clone(&self.health),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn drive(&self) -> &Arc<dyn Drive> {
        &self.drive
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    pub fn replay_report(&self) -> ReplayReport {
        self.replay
    }

    /// The id the metadata must name for this journal to be replayed after a crash.
    pub fn journal_id(&self) -> u64 {
        self.superblock.journal_id
    }
}

/// A partition handed to its shard, which builds its [`part::JournalPart`] from it.
#[derive(Clone)]
pub struct PartSpec {
    pub drive: Arc<dyn Drive>,
    pub superblock: Superblock,
    pub seed: Seed,
    pub index: u32,
    pub sequence: u64,
    pub health: Arc<Health>,
}

impl PartSpec {
    pub fn build(self) -> part::JournalPart {
        part::JournalPart::new(self.drive, &self.superblock, self.seed, self.index, self.sequence, 0, self.health)
    }
}

fn read_block(drive: &dyn Drive, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, String> {
    let done = submit_and_wait(drive, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) })
        .map_err(|e| format!("journal {}: read at byte {offset_bytes} failed: {e}", drive.info().name))?;
    Ok(done.buf.expect("a read returns its buffer").as_slice().to_vec())
}

/// The newest valid superblock copy, `None` for a blank device.
///
/// # Errors
/// A read fails, or a copy is another controller's (its own CRC seed validates it).
fn read_superblock(drive: &dyn Drive, seed: Seed) -> Result<Option<Superblock>, String> {
    let mut newest: Option<Superblock> = None;
    for copy in 0..2 {
        let bytes = read_block(drive, copy * BLOCK_BYTES, BLOCK_BYTES)?;
        match Superblock::decode(&bytes, seed) {
            Ok(sb) if newest.is_none_or(|n| sb.generation > n.generation) => newest = Some(sb),
            Ok(_) => {}
            Err(_) if bytes[..8] == format::SUPERBLOCK_MAGIC => {
                let theirs = u128::from_le_bytes(bytes[format::superblock::CONTROLLER_ID.range()].try_into().expect("16 bytes"));
                if Superblock::decode(&bytes, Seed::of_controller(theirs)).is_ok() {
                    return Err(format!(
                        "journal {} belongs to controller {theirs:032x}; clear it (overwrite its first 8 KiB) to use it here",
                        drive.info().name
                    ));
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
fn replay_partition(
    drive: &dyn Drive,
    sb: &Superblock,
    seed: Seed,
    index: u32,
    report: &mut ReplayReport,
    apply: &mut dyn FnMut(&ReplayRecord) -> Result<(), String>,
) -> Result<u64, String> {
    let Some(checkpoint) = read_checkpoint(drive, sb, seed, index)? else { return Ok(0) };
    let ring = ring::Ring::new(
        sb.partition_offset_bytes(index) + RING_OFFSET_IN_PARTITION_BYTES,
        sb.partition_offset_bytes(index) + sb.partition_bytes,
        0,
    );
    let (mut position, mut sequence) = (checkpoint.tail_position_bytes, checkpoint.tail_sequence);
    let mut scanned_bytes = 0;
    let mut last_valid = sequence.saturating_sub(1);
    while scanned_bytes < ring.capacity_bytes() {
        let Some((header, data)) = read_record(drive, seed, sb.journal_id, position, sequence, &ring)? else { break };
        if header.kind == KIND_DATA {
            let record = ReplayRecord { vd_id: header.vd_id, vd_offset_bytes: header.vd_offset_bytes, data };
            apply(&record).map_err(|e| format!("journal {}: replay of record {sequence}: {e}", drive.info().name))?;
            report.records += 1;
            report.data_bytes += u64::from(header.data_bytes);
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
