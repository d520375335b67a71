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
use format::{Checkpoint, Seed, Superblock, BLOCK_BYTES, RING_OFFSET_IN_PARTITION_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("the journal failed: {0}")]
    Failed(String),
    #[error("a member flush before a journal checkpoint failed: {0}")]
    Members(String),
}

/// Where a leg of the journal stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegState {
    /// Written and flushed with every record.
    InService,
    /// It failed a write or a flush; records go on to the other leg, but none is acknowledged
    /// until the metadata names this leg stale (a restart must never replay it).
    Failed,
    /// Named stale in the metadata: out of the journal for good.
    Stale,
}

#[derive(Debug)]
struct Leg {
    name: String,
    state: Mutex<(LegState, Option<String>)>,
}

/// What the shards and the control plane share about a journal: whether it works, which of
/// its legs are in service, and how full each partition is.
#[derive(Debug)]
pub struct Health {
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    legs: Vec<Leg>,
    /// Some leg is [`LegState::Failed`]: acknowledgements wait.
    legs_pending: AtomicBool,
    used_bytes: Vec<AtomicU64>,
    capacity_bytes: Vec<AtomicU64>,
}

impl Health {
    fn new(partition_count: u32, leg_names: Vec<String>) -> Health {
        assert!((1..=format::LEGS_MAX).contains(&leg_names.len()), "a journal has one or two legs");
        let counters = || (0..partition_count).map(|_| AtomicU64::new(0)).collect();
        let legs = leg_names.into_iter().map(|name| Leg { name, state: Mutex::new((LegState::InService, None)) }).collect();
        Health {
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            legs,
            legs_pending: AtomicBool::new(false),
            used_bytes: counters(),
            capacity_bytes: counters(),
        }
    }

    /// Each leg's name, state and why it left service.
    pub fn legs(&self) -> Vec<(String, LegState, Option<String>)> {
        self.legs
            .iter()
            .map(|leg| {
                let (state, why) = leg.state.lock().expect("journal leg lock").clone();
                (leg.name.clone(), state, why)
            })
            .collect()
    }

    pub fn leg_in_service(&self, index: usize) -> bool {
        self.legs[index].state.lock().expect("journal leg lock").0 == LegState::InService
    }

    /// Takes leg `index` out of service. When no leg is left in service the journal fails.
    pub fn fail_leg(&self, index: usize, why: &str) {
        {
            let mut state = self.legs[index].state.lock().expect("journal leg lock");
            if state.0 != LegState::InService {
                return;
            }
            *state = (LegState::Failed, Some(why.to_string()));
        }
        if (0..self.legs.len()).any(|i| self.leg_in_service(i)) {
            self.legs_pending.store(true, Ordering::Release);
        } else {
            self.fail(&format!("leg {} failed: {why}, and no leg is left", self.legs[index].name));
        }
    }

    /// Whether a failed leg waits to be named stale in the metadata.
    pub fn legs_pending(&self) -> bool {
        self.legs_pending.load(Ordering::Acquire)
    }

    /// The legs that are not in service, a bit per leg: what the metadata must name stale.
    pub fn stale_mask(&self) -> u8 {
        (0..self.legs.len()).filter(|&i| !self.leg_in_service(i)).fold(0, |mask, i| mask | 1 << i)
    }

    /// The metadata names the legs of `mask` stale now: once no failed leg waits for that,
    /// acknowledgements go on.
    pub fn legs_recorded_stale(&self, mask: u8) {
        let mut pending = false;
        for (index, leg) in self.legs.iter().enumerate() {
            let mut state = leg.state.lock().expect("journal leg lock");
            if state.0 == LegState::Failed && mask & (1 << index) != 0 {
                state.0 = LegState::Stale;
            }
            pending |= state.0 == LegState::Failed;
        }
        self.legs_pending.store(pending, Ordering::Release);
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

/// A row image replay found: the member writes of one parity row write, for the caller to write
/// as they are to the VD's members (those in service), before any data record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayImage {
    pub vd_id: u32,
    pub row: u64,
    /// Per member write: the member, its offset on the member, its bytes.
    pub writes: Vec<(u32, u64, Vec<u8>)>,
}

/// What the last start's replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// VD writes replayed (a group record carries several).
    pub records: u64,
    /// Data and group records they came from.
    pub data_records: u64,
    pub data_bytes: u64,
    /// Row images written back to the members before the records.
    pub images: u64,
    /// Whether the device held a journal of ours (false: it was blank and is formatted now).
    pub found: bool,
    /// The device held a journal of ours that the metadata does not trust (it was detached
    /// after it failed, or never trusted): it was not replayed and is formatted anew.
    pub untrusted: bool,
}

/// Which journal the metadata trusts: its id (0: none) and the legs it must not replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    pub journal_id: u64,
    /// A bit per `leg_index` ([`format::Superblock::leg_index`]).
    pub stale_legs: u8,
}

impl From<u64> for Trust {
    fn from(journal_id: u64) -> Trust {
        Trust { journal_id, stale_legs: 0 }
    }
}

impl Trust {
    /// Whether the leg whose superblock is `sb` may be replayed.
    fn trusts(&self, sb: &Superblock) -> bool {
        self.journal_id != 0 && sb.journal_id == self.journal_id && self.stale_legs & (1 << sb.leg_index) == 0
    }
}

/// An opened journal device (control plane): one drive, or the two legs of a mirrored pair.
pub struct Journal {
    name: String,
    legs: Vec<Arc<dyn Drive>>,
    seed: Seed,
    superblock: Superblock,
    /// The sequence every partition starts from after replay.
    next_sequence: u64,
    health: Arc<Health>,
    replay: ReplayReport,
}

impl Journal {
    /// Opens the journal on `legs` (one drive, or a mirrored pair) for a controller with
    /// `partition_count` shards: replays what an earlier run left (each record handed to
    /// `apply`, partition by partition, in order) if the metadata trusts it (`trust`), and
    /// returns the journal, which [`Journal::finish_replay`] must then lay out anew. Each
    /// partition is replayed from the trusted leg whose records go furthest; a leg that cannot
    /// be read is out of service (the journal runs on the other).
    ///
    /// # Errors
    /// The device is too small, belongs to another controller, no leg can be read, or `apply`
    /// failed.
    pub fn open(
        legs: Vec<Arc<dyn Drive>>,
        controller_id: u128,
        partition_count: u32,
        trust: impl Into<Trust>,
        apply: &mut dyn FnMut(&ReplayRecord) -> Result<(), String>,
    ) -> Result<Journal, String> {
        let mut no_images =
            |image: &ReplayImage| Err(format!("a row image of v{} row {} found, and nothing to write it", image.vd_id, image.row));
        Journal::open_with_images(legs, controller_id, partition_count, trust, apply, &mut no_images)
    }

    /// [`Journal::open`] for a caller that also writes row images back (`apply_image`, every
    /// image partition first, each in order): the controller and the simulator.
    ///
    /// # Errors
    /// As [`Journal::open`], or `apply_image` failed.
    pub fn open_with_images(
        legs: Vec<Arc<dyn Drive>>,
        controller_id: u128,
        partition_count: u32,
        trust: impl Into<Trust>,
        apply: &mut dyn FnMut(&ReplayRecord) -> Result<(), String>,
        apply_image: &mut dyn FnMut(&ReplayImage) -> Result<(), String>,
    ) -> Result<Journal, String> {
        assert!((1..=format::LEGS_MAX).contains(&legs.len()), "a journal has one or two legs");
        let trust = trust.into();
        let name = legs.iter().map(|leg| leg.info().name.clone()).collect::<Vec<_>>().join(" + ");
        // Room for the image partitions' counters too.
        let health = Arc::new(Health::new(2 * partition_count, legs.iter().map(|leg| leg.info().name.clone()).collect()));
        let capacity_bytes = legs.iter().map(|leg| leg.info().capacity_bytes).min().expect("a leg") / BLOCK_BYTES * BLOCK_BYTES;
        let seed = Seed::of_controller(controller_id);
        let mut on_device = Vec::with_capacity(legs.len());
        for (index, leg) in legs.iter().enumerate() {
            match read_superblock(&**leg, seed) {
                Ok(sb) => on_device.push(sb),
                Err(SuperblockError::Foreign(why)) => return Err(why),
                Err(SuperblockError::Unreadable(why)) if legs.len() > 1 => {
                    health.fail_leg(index, &why);
                    on_device.push(None);
                }
                Err(SuperblockError::Unreadable(why)) => return Err(why),
            }
        }
        if let Some(why) = health.failure() {
            return Err(why);
        }
        let newest_trusted = on_device.iter().flatten().filter(|sb| trust.trusts(sb)).map(|sb| sb.generation).max();
        // The trusted legs of the newest layout: the ones that may hold acknowledged records.
        let sources: Vec<usize> = (0..legs.len())
            .filter(|&i| on_device[i].is_some_and(|sb| trust.trusts(&sb) && Some(sb.generation) == newest_trusted))
            .collect();
        let found = sources.first().and_then(|&i| on_device[i]);
        // An untrusted journal may hold records older than writes the members took without it.
        let untrusted = found.is_none() && on_device.iter().any(Option::is_some);
        let mut replay = ReplayReport { found: found.is_some(), untrusted, ..ReplayReport::default() };
        let mut last_sequence = 0;
        if let Some(sb) = &found {
            // Images first: they put torn rows back together, then the records go through the
            // normal write path over consistent rows.
            let images = sb.partition_count..sb.all_partition_count();
            for index in images.chain(0..sb.partition_count) {
                let leg = furthest_leg(&legs, &sources, sb, seed, index);
                let mut sink = Sink { data: &mut *apply, image: &mut *apply_image };
                last_sequence = last_sequence.max(replay_partition(&*legs[leg], sb, seed, index, &mut replay, &mut sink)?);
            }
        }
        let journal_id = found.map_or_else(|| rand::random::<u64>().max(1), |sb| sb.journal_id);
        let mut superblock = Superblock::plan(controller_id, journal_id, capacity_bytes, partition_count)?;
        superblock.generation = on_device.iter().flatten().map(|sb| sb.generation).max().map_or(1, |g| g + 1);
        superblock.leg_count = legs.len() as u32;
        // Above every sequence the device can hold: it holds at most one record per block.
        let next_sequence = last_sequence + capacity_bytes / BLOCK_BYTES + 1;
        Ok(Journal { name, legs, seed, superblock, next_sequence, health, replay })
    }

    /// Writes the new layout to every leg in service: every partition empty, sequences above
    /// any on the device. Call it once the replayed records are durable on the members. A leg
    /// that fails is out of service ([`Health::stale_mask`] then names it for the metadata).
    ///
    /// # Errors
    /// No leg took the new layout.
    pub fn finish_replay(&self) -> Result<(), String> {
        let sb = &self.superblock;
        for index in 0..sb.all_partition_count() {
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
                self.on_every_leg(|_| DriveOp::Write {
                    offset_bytes: sb.partition_offset_bytes(index) + block * BLOCK_BYTES,
                    buf: IoBuf::from_slice(&checkpoint.encode(self.seed)),
                })?;
            }
        }
        self.on_every_leg(|_| DriveOp::Flush)?;
        let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for copy in 0..2 {
            self.on_every_leg(|leg| {
                let ours = Superblock { leg_index: leg as u32, ..*sb };
                DriveOp::Write { offset_bytes: copy * BLOCK_BYTES, buf: IoBuf::from_slice(&ours.encode(self.seed, now_ns)) }
            })?;
        }
        self.on_every_leg(|_| DriveOp::Flush)
    }

    /// Runs `op_for(leg)` on every leg in service, taking out of service each that fails.
    ///
    /// # Errors
    /// No leg is left in service.
    fn on_every_leg(&self, op_for: impl Fn(usize) -> DriveOp) -> Result<(), String> {
        for (index, leg) in self.legs.iter().enumerate().filter(|&(index, _)| self.health.leg_in_service(index)) {
            if let Err(error) = submit_and_wait(&**leg, op_for(index)) {
                self.health.fail_leg(index, &format!("journal {}: {error}", leg.info().name));
            }
        }
        self.health.failure().map_or(Ok(()), Err)
    }

    /// What a shard needs to run partition `index` (after [`Journal::finish_replay`]): its data
    /// partition `index`, or [`Superblock::image_partition`] of it.
    pub fn part_spec(&self, index: u32) -> PartSpec {
        PartSpec {
            legs: self.legs.clone(),
            superblock: self.superblock,
            seed: self.seed,
            index,
            sequence: self.next_sequence,
            health: Arc::clone(&self.health),
        }
    }

    /// Shard `shard`'s data partition and, if the layout has them, its image partition.
    pub fn shard_specs(&self, shard: u32) -> (PartSpec, Option<PartSpec>) {
        (self.part_spec(shard), self.superblock.image_partition(shard).map(|index| self.part_spec(index)))
    }

    pub fn name(&self) -> &str {
        &self.name
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

    /// What the metadata must say for this journal to be replayed after a crash: its id, and
    /// the legs out of service now.
    pub fn trust(&self) -> Trust {
        Trust { journal_id: self.journal_id(), stale_legs: self.health.stale_mask() }
    }
}

/// A partition handed to its shard, which builds its [`part::JournalPart`] from it.
#[derive(Clone)]
pub struct PartSpec {
    pub legs: Vec<Arc<dyn Drive>>,
    pub superblock: Superblock,
    pub seed: Seed,
    pub index: u32,
    pub sequence: u64,
    pub health: Arc<Health>,
}

impl PartSpec {
    pub fn build(self) -> part::JournalPart {
        part::JournalPart::new(self.legs, &self.superblock, self.seed, self.index, self.sequence, 0, self.health)
    }
}

mod replay;
use replay::{furthest_leg, read_superblock, replay_partition, Sink, SuperblockError};
