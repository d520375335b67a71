//! A shard's partition of the journal: appending records, making them durable in groups, and
//! checkpointing the tail. Runs on the shard that owns the partition and nowhere else, so its
//! state is plain cells.
//!
//! Durability in order: a record is reported durable only when it and every record before it
//! were written and a journal flush completed after them, because replay stops at the first
//! record that fails its checks: a later record that reached the device while an earlier one
//! was torn would be skipped, so it must not have been acknowledged. One flush covers every
//! record written before it was issued; waiters re-check after each event.
//!
//! Group commit: the writes a shard places while the journal is busy share one group record
//! (one header, one device write). A group is written by its own task after the turn that
//! opened it (every write that turn placed joins it) and once fewer than
//! [`GROUP_WRITES_IN_FLIGHT_MAX`] group writes are in flight (every write placed meanwhile joins
//! it too): a write alone is written at once, and under load a group carries the writes that
//! arrived during the writes before it, as md's raid5-cache fills its next log block while one
//! is in flight. Entries keep the order the writes were placed, which is the order they were
//! admitted, so replay lays overlapping writes down as they were acknowledged.
//!
//! A mirrored pair gets every write and flush on both legs. A leg that fails one is taken out
//! of service and the other goes on, but nothing is reported durable while a failed leg waits
//! to be named stale in the metadata (see [`Health::fail_leg`]): until then a restart could
//! replay it, and it lacks what the other leg took since.

use super::format::{
    record_bytes_for, Checkpoint, GroupEntry, ImageEntry, RecordHeader, Seed, Superblock, BLOCK_BYTES, IMAGE_ENTRIES_MAX,
    RECORD_DATA_BYTES_MAX, RING_OFFSET_IN_PARTITION_BYTES,
};
use super::ring::{Placement, Ring};
use super::{Health, JournalError};
use crate::runtime::Reactor;
use drive::{Drive, DriveOp, IoBuf};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

/// Group records being written at once, at most. More in flight write smaller groups, each
/// carrying what arrived while the others were being written: with a journal file, four gave
/// 48k 4 KiB WB writes per second where one and two gave 52k-55k, and all three the same 1 MiB
/// sequential rate. Two keeps a second write going on a journal that takes writes in parallel.
pub const GROUP_WRITES_IN_FLIGHT_MAX: usize = 2;

/// The record that logs a piece of a write: its sequence and where that piece starts in the
/// write's buffer.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub placement: Placement,
    pub data_at: usize,
    pub data_bytes: usize,
}

/// A VD write's data to log, as the cache holds it.
#[derive(Clone)]
pub struct WriteData {
    pub vd_id: u32,
    pub vd_offset_bytes: u64,
    pub data: Rc<IoBuf>,
}

/// A group record not yet written: the pieces of writes it carries, in the order they were
/// placed.
struct Group {
    placement: Placement,
    pieces: Vec<(GroupEntry, Rc<IoBuf>, usize)>,
    data_bytes: usize,
}

impl Group {
    /// Whether a piece of `len_bytes` may join: the header names it and the data stays within
    /// a record's.
    fn takes(&self, len_bytes: usize) -> bool {
        self.pieces.len() < IMAGE_ENTRIES_MAX && (self.data_bytes + len_bytes) as u64 <= RECORD_DATA_BYTES_MAX
    }
}

pub struct JournalPart {
    legs: Vec<Arc<dyn Drive>>,
    seed: Seed,
    journal_id: u64,
    superblock_generation: u64,
    index: u32,
    partition_offset_bytes: u64,
    ring: RefCell<Ring>,
    reserve_bytes: u64,
    /// What WT keeps free too: room to log a pinned extent again (see `cache::relocate`).
    relocation_reserve_bytes: u64,
    checkpoint_counter: Cell<u64>,
    checkpointing: Cell<bool>,
    /// Every sequence below this was written.
    written_below: Cell<u64>,
    /// Written sequences at or above `written_below` (out of order).
    written_ahead: RefCell<BTreeSet<u64>>,
    /// Every sequence below this is durable.
    durable_below: Cell<u64>,
    flushing: Cell<bool>,
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
    health: Arc<Health>,
    /// Group records placed but not yet handed to the device, by sequence.
    groups: RefCell<BTreeMap<u64, Group>>,
    /// The group that new writes join, until its task writes it or a write that cannot join
    /// opens another.
    open_group: Cell<Option<u64>>,
    group_writes_in_flight: Cell<usize>,
}

impl JournalPart {
    /// Partition `index` of the journal `sb` describes, empty, its next record `sequence` at
    /// the start of its ring, and checkpoint counter `counter`.
    pub fn new(
        legs: Vec<Arc<dyn Drive>>,
        sb: &Superblock,
        seed: Seed,
        index: u32,
        sequence: u64,
        counter: u64,
        health: Arc<Health>,
    ) -> JournalPart {
        let partition_offset_bytes = sb.partition_offset_bytes(index);
        let ring_start = partition_offset_bytes + RING_OFFSET_IN_PARTITION_BYTES;
        let ring = Ring::new(ring_start, partition_offset_bytes + sb.partition_size_bytes(index), sequence);
        // WB keeps an eighth of the ring (and room for a largest record) for WT's logging, so
        // that WT writes still run when write-back has filled the rest.
        let reserve_bytes = (ring.capacity_bytes() / 8).max(record_bytes_for(RECORD_DATA_BYTES_MAX) + BLOCK_BYTES);
        health.set_capacity(index, ring.capacity_bytes());
        JournalPart {
            legs,
            seed,
            journal_id: sb.journal_id,
            superblock_generation: sb.generation,
            index,
            partition_offset_bytes,
            ring: RefCell::new(ring),
            reserve_bytes,
            relocation_reserve_bytes: record_bytes_for(RECORD_DATA_BYTES_MAX) + BLOCK_BYTES,
            checkpoint_counter: Cell::new(counter),
            checkpointing: Cell::new(false),
            written_below: Cell::new(sequence),
            written_ahead: RefCell::new(BTreeSet::new()),
            durable_below: Cell::new(sequence),
            flushing: Cell::new(false),
            waiters: RefCell::new(Vec::new()),
            health,
            groups: RefCell::new(BTreeMap::new()),
            open_group: Cell::new(None),
            group_writes_in_flight: Cell::new(0),
        }
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Whether write-back may use the journal now: healthy and not full beyond the reserve.
    pub fn takes_write_back(&self) -> bool {
        self.health.is_usable()
            && self.ring.borrow().free_bytes() > self.reserve_bytes + record_bytes_for(RECORD_DATA_BYTES_MAX) + BLOCK_BYTES
    }

    /// Places the data of a write in group records (a piece per MiB), each held by the writer,
    /// or `None` when the ring lacks the space (WB: beyond its reserve; WT: beyond the room kept
    /// to log a pinned extent again). The records are written by their groups' tasks;
    /// [`JournalPart::write`] waits until they are durable.
    pub fn place(self: &Rc<Self>, reactor: &Rc<Reactor>, write: &WriteData, write_back: bool) -> Option<Vec<Placed>> {
        let reserve = if write_back { self.reserve_bytes } else { self.relocation_reserve_bytes };
        self.place_with_reserve(reactor, write, reserve)
    }

    /// Places the record that logs a pinned extent again: it may use every byte of the ring.
    pub fn place_relocation(self: &Rc<Self>, reactor: &Rc<Reactor>, write: &WriteData) -> Option<Vec<Placed>> {
        self.place_with_reserve(reactor, write, 0)
    }

    fn place_with_reserve(self: &Rc<Self>, reactor: &Rc<Reactor>, write: &WriteData, reserve: u64) -> Option<Vec<Placed>> {
        let len_bytes = write.data.len();
        assert!(len_bytes > 0, "a write carries data");
        if len_bytes as u64 <= RECORD_DATA_BYTES_MAX {
            if let Some(placed) = self.join_open_group(write, reserve) {
                return Some(vec![placed]);
            }
        }
        let pieces: Vec<(usize, usize)> = (0..len_bytes)
            .step_by(RECORD_DATA_BYTES_MAX as usize)
            .map(|at| (at, (len_bytes - at).min(RECORD_DATA_BYTES_MAX as usize)))
            .collect();
        let record_sizes: Vec<u64> = pieces.iter().map(|&(_, len)| record_bytes_for(len as u64)).collect();
        if !self.ring.borrow().fits(&record_sizes, reserve) {
            return None;
        }
        let placed = pieces
            .into_iter()
            .map(|(data_at, data_bytes)| {
                let placement =
                    self.ring.borrow_mut().place(record_bytes_for(data_bytes as u64), reserve).expect("space was checked for every piece");
                self.open(reactor, placement, write, data_at, data_bytes);
                Placed { placement, data_at, data_bytes }
            })
            .collect();
        self.health.set_used(self.index, self.ring.borrow().used_bytes());
        Some(placed)
    }

    /// Adds the write to the open group, when it has a slot, the data fits a record and the
    /// ring the longer record.
    fn join_open_group(&self, write: &WriteData, reserve: u64) -> Option<Placed> {
        let sequence = self.open_group.get()?;
        let mut groups = self.groups.borrow_mut();
        let group = groups.get_mut(&sequence).expect("the open group waits to be written");
        let len_bytes = write.data.len();
        if !group.takes(len_bytes) {
            return None;
        }
        let extra_bytes = record_bytes_for((group.data_bytes + len_bytes) as u64) - record_bytes_for(group.data_bytes as u64);
        let mut ring = self.ring.borrow_mut();
        if !ring.grow_newest(sequence, extra_bytes, reserve) {
            return None;
        }
        ring.hold(sequence);
        self.health.set_used(self.index, ring.used_bytes());
        group.pieces.push((group_entry(write, 0, len_bytes), Rc::clone(&write.data), 0));
        group.data_bytes += len_bytes;
        Some(Placed { placement: group.placement, data_at: 0, data_bytes: len_bytes })
    }

    /// Opens a group at `placement` with one piece of `write`, and starts the task that writes it.
    fn open(self: &Rc<Self>, reactor: &Rc<Reactor>, placement: Placement, write: &WriteData, data_at: usize, data_bytes: usize) {
        let piece = (group_entry(write, data_at, data_bytes), Rc::clone(&write.data), data_at);
        let group = Group { placement, pieces: vec![piece], data_bytes };
        let previous = self.groups.borrow_mut().insert(placement.sequence, group);
        assert!(previous.is_none(), "one group per sequence");
        // The task's own hold: the record stays live until it is written, whoever gives up.
        self.ring.borrow_mut().hold(placement.sequence);
        self.open_group.set(Some(placement.sequence));
        let (part, reactor2) = (Rc::clone(self), Rc::clone(reactor));
        reactor.spawn(async move { part.write_group(&reactor2, placement.sequence).await });
    }

    /// The task of the group at `sequence`: lets this turn's writes join, waits for room among
    /// the group writes in flight, then writes it.
    async fn write_group(&self, reactor: &Reactor, sequence: u64) {
        crate::runtime::yield_now().await;
        while self.group_writes_in_flight.get() >= GROUP_WRITES_IN_FLIGHT_MAX && self.health.failure().is_none() {
            self.wait().await;
        }
        if self.open_group.get() == Some(sequence) {
            self.open_group.set(None);
        }
        let group = self.groups.borrow_mut().remove(&sequence).expect("a group is written once");
        self.group_writes_in_flight.set(self.group_writes_in_flight.get() + 1);
        let body = group_body(&group);
        let header = self.group_header(&group, &body);
        // A failure is the journal's (or a leg's), and every writer waiting sees it there.
        let _ = self.write_placed(reactor, group.placement, &header, body).await;
        self.group_writes_in_flight.set(self.group_writes_in_flight.get() - 1);
        self.release(sequence);
        self.wake_all();
    }

    fn group_header(&self, group: &Group, body: &IoBuf) -> RecordHeader {
        let entries: Vec<GroupEntry> = group.pieces.iter().map(|(entry, _, _)| *entry).collect();
        let placement = group.placement;
        RecordHeader::group(
            self.seed,
            self.journal_id,
            placement.sequence,
            placement.position_bytes,
            &entries,
            &body.as_slice()[..group.data_bytes],
        )
    }

    async fn wait(&self) {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    pub fn hold(&self, sequence: u64) {
        self.ring.borrow_mut().hold(sequence);
    }

    pub fn release(&self, sequence: u64) {
        self.ring.borrow_mut().release(sequence);
    }

    /// Waits until the records `placed` (written by their groups' tasks) and everything before
    /// them are durable.
    pub async fn write(&self, reactor: &Reactor, placed: &[Placed]) -> Result<(), JournalError> {
        let last = placed.iter().map(|piece| piece.placement.sequence).max().expect("a write has a record");
        self.durable(reactor, last).await
    }

    /// Places a row image of `data_bytes` (at most a record's worth): it may use every byte of
    /// the ring, which holds nothing but images. `None` while the ring lacks the room.
    pub fn place_image(&self, data_bytes: usize) -> Option<Placed> {
        assert!(data_bytes as u64 <= RECORD_DATA_BYTES_MAX, "an image record carries at most {RECORD_DATA_BYTES_MAX} bytes");
        assert!(self.open_group.get().is_none(), "an image partition holds no data records");
        let mut ring = self.ring.borrow_mut();
        let placement = ring.place(record_bytes_for(data_bytes as u64), 0)?;
        self.health.set_used(self.index, ring.used_bytes());
        Some(Placed { placement, data_at: 0, data_bytes })
    }

    /// Writes the image record `placed` (the member writes `entries` of VD `vd_id`'s row `row`,
    /// their bytes one after the other at the start of `body`, zero-padded to whole blocks),
    /// then waits until it and everything before it are durable.
    pub async fn write_image(
        &self,
        reactor: &Reactor,
        placed: &Placed,
        (vd_id, row): (u32, u64),
        entries: Vec<ImageEntry>,
        body: IoBuf,
    ) -> Result<(), JournalError> {
        let placement = placed.placement;
        let data = &body.as_slice()[..placed.data_bytes];
        let header =
            RecordHeader::image(self.seed, self.journal_id, placement.sequence, placement.position_bytes, vd_id, row, entries, data);
        self.write_placed(reactor, placement, &header, body).await?;
        self.durable(reactor, placement.sequence).await
    }

    /// Writes a record (its wrap record first, if it has one): header, then `body`, its data
    /// already padded to whole blocks.
    async fn write_placed(&self, reactor: &Reactor, placement: Placement, header: &RecordHeader, body: IoBuf) -> Result<(), JournalError> {
        assert!(body.len().is_multiple_of(BLOCK_BYTES as usize), "a record's body is whole blocks");
        if let Some((sequence, position_bytes)) = placement.wrap {
            let wrap = RecordHeader::wrap(self.journal_id, sequence, position_bytes).encode(self.seed);
            self.submit_write(reactor, position_bytes, vec![IoBuf::from_slice(&wrap)]).await?;
            self.written(sequence);
        }
        let bufs = vec![IoBuf::from_slice(&header.encode(self.seed)), body];
        self.submit_write(reactor, placement.position_bytes, bufs).await?;
        self.written(placement.sequence);
        Ok(())
    }

    async fn submit_write(&self, reactor: &Reactor, offset_bytes: u64, bufs: Vec<IoBuf>) -> Result<(), JournalError> {
        let in_service = (0..self.legs.len()).filter(|&leg| self.health.leg_in_service(leg)).count();
        // The first leg takes the buffers, each other one a copy (a single journal copies nothing).
        let mut copies: Vec<Vec<IoBuf>> =
            (1..in_service).map(|_| bufs.iter().map(|buf| IoBuf::from_slice(buf.as_slice())).collect()).collect();
        let mut original = Some(bufs);
        let op =
            |_| DriveOp::WriteV { offset_bytes, bufs: original.take().or_else(|| copies.pop()).expect("buffers for every leg in service") };
        self.on_every_leg(reactor, op, &format!("write at byte {offset_bytes}")).await
    }

    /// Runs `op_for(leg)` on every leg in service at once; a leg that fails it leaves service.
    ///
    /// # Errors
    /// No leg is left in service: the journal failed.
    async fn on_every_leg(&self, reactor: &Reactor, mut op_for: impl FnMut(usize) -> DriveOp, what: &str) -> Result<(), JournalError> {
        let legs: Vec<usize> = (0..self.legs.len()).filter(|&leg| self.health.leg_in_service(leg)).collect();
        let ops: Vec<DriveOp> = legs.iter().map(|&leg| op_for(leg)).collect();
        let submits = legs.iter().zip(ops).map(|(&leg, op)| reactor.submit(&*self.legs[leg], op));
        let done = futures::future::join_all(submits).await;
        for (&leg, done) in legs.iter().zip(done) {
            if let Err(error) = done.result {
                self.health.fail_leg(leg, &format!("{what} on {} failed: {error}", self.legs[leg].info().name));
                self.wake_all();
            }
        }
        match self.health.failure() {
            Some(why) => Err(self.failed(why)),
            None => Ok(()),
        }
    }

    /// A nudge from the shard's ticker: waiters look again (a failed leg may have been named
    /// stale meanwhile).
    pub fn poke(&self) {
        if !self.waiters.borrow().is_empty() {
            self.wake_all();
        }
    }

    fn failed(&self, why: String) -> JournalError {
        self.health.fail(&why);
        self.wake_all();
        JournalError::Failed(why)
    }

    fn written(&self, sequence: u64) {
        let mut ahead = self.written_ahead.borrow_mut();
        ahead.insert(sequence);
        let mut below = self.written_below.get();
        while ahead.remove(&below) {
            below += 1;
        }
        self.written_below.set(below);
        drop(ahead);
        self.wake_all();
    }

    /// Whether every leg in service makes a write durable when it completes
    /// ([`Drive::writes_durable`]): then a record is durable once it and those before it are
    /// written, without a flush.
    fn legs_write_durably(&self) -> bool {
        (0..self.legs.len()).filter(|&leg| self.health.leg_in_service(leg)).all(|leg| self.legs[leg].writes_durable())
    }

    fn wake_all(&self) {
        for waiter in self.waiters.borrow_mut().drain(..) {
            let _ = waiter.send(());
        }
    }

    /// Waits until every record up to `sequence` is durable, flushing the journal when no
    /// flush that covers it is under way.
    async fn durable(&self, reactor: &Reactor, sequence: u64) -> Result<(), JournalError> {
        loop {
            if let Some(why) = self.health.failure() {
                return Err(JournalError::Failed(why));
            }
            if self.durable_below.get() > sequence && !self.health.legs_pending() {
                return Ok(());
            }
            if self.written_below.get() > self.durable_below.get() && self.legs_write_durably() {
                // Written is durable on such legs: no flush to wait for.
                self.durable_below.set(self.written_below.get());
                self.wake_all();
                continue;
            }
            if !self.flushing.get() && self.written_below.get() > self.durable_below.get() {
                self.flushing.set(true);
                let covered = self.written_below.get();
                let flushed = self.on_every_leg(reactor, |_| DriveOp::Flush, "flush").await;
                self.flushing.set(false);
                flushed?;
                self.durable_below.set(self.durable_below.get().max(covered));
                self.wake_all();
                continue;
            }
            self.wait().await;
        }
    }

    /// Waits until every record placed so far is durable (an AWB flush).
    pub async fn durable_all(&self, reactor: &Reactor) -> Result<(), JournalError> {
        let placed_below = self.ring.borrow().next_sequence();
        if placed_below <= self.durable_below.get() {
            return Ok(());
        }
        self.durable(reactor, placed_below - 1).await
    }

    /// Whether a checkpoint would free space: the live tail moved past the durable one.
    pub fn checkpoint_due(&self) -> bool {
        let ring = self.ring.borrow();
        !self.checkpointing.get() && ring.live_tail() != ring.durable_tail()
    }

    pub fn is_checkpointing(&self) -> bool {
        self.checkpointing.get()
    }

    /// The sequence of the oldest record still held: where the ring's space stops returning.
    pub fn live_tail_sequence(&self) -> u64 {
        self.ring.borrow().live_tail().1
    }

    /// Every record below this sequence is behind the durable tail: replay never reads it.
    pub fn durable_tail_sequence(&self) -> u64 {
        self.ring.borrow().durable_tail().1
    }

    /// The sequence the next record placed gets.
    pub fn next_sequence(&self) -> u64 {
        self.ring.borrow().next_sequence()
    }

    /// Bytes replay could need now and the ring's capacity.
    pub fn usage(&self) -> (u64, u64) {
        let ring = self.ring.borrow();
        (ring.used_bytes(), ring.capacity_bytes())
    }

    /// Records the live tail in the partition's checkpoint block, `members_flushed` having made
    /// everything destaged before it durable on the members. Returns whether space was freed.
    pub async fn checkpoint<F: std::future::Future<Output = Result<(), String>>>(
        &self,
        reactor: &Reactor,
        members_flushed: F,
    ) -> Result<bool, JournalError> {
        if self.checkpointing.get() {
            return Ok(false);
        }
        self.checkpointing.set(true);
        let result = self.checkpoint_now(reactor, members_flushed).await;
        self.checkpointing.set(false);
        result
    }

    async fn checkpoint_now<F: std::future::Future<Output = Result<(), String>>>(
        &self,
        reactor: &Reactor,
        members_flushed: F,
    ) -> Result<bool, JournalError> {
        let tail = self.ring.borrow().live_tail();
        if tail == self.ring.borrow().durable_tail() {
            return Ok(false);
        }
        // The destaged data must be on the members before the journal forgets it.
        members_flushed.await.map_err(JournalError::Members)?;
        let counter = self.checkpoint_counter.get() + 1;
        let checkpoint = Checkpoint {
            partition_index: self.index,
            journal_id: self.journal_id,
            superblock_generation: self.superblock_generation,
            counter,
            tail_position_bytes: tail.0,
            tail_sequence: tail.1,
        };
        let offset_bytes = self.partition_offset_bytes + checkpoint.block_index() * BLOCK_BYTES;
        self.submit_write(reactor, offset_bytes, vec![IoBuf::from_slice(&checkpoint.encode(self.seed))]).await?;
        self.on_every_leg(reactor, |_| DriveOp::Flush, "flush of a checkpoint").await?;
        self.checkpoint_counter.set(counter);
        let mut ring = self.ring.borrow_mut();
        ring.checkpointed(tail);
        self.health.set_used(self.index, ring.used_bytes());
        Ok(true)
    }
}

/// The entry of the piece `data_at..data_at + data_bytes` of `write`.
fn group_entry(write: &WriteData, data_at: usize, data_bytes: usize) -> GroupEntry {
    GroupEntry { vd_id: write.vd_id, len_bytes: data_bytes as u32, vd_offset_bytes: write.vd_offset_bytes + data_at as u64 }
}

/// A group's data, its pieces one after the other, zero-padded to whole blocks.
fn group_body(group: &Group) -> IoBuf {
    let parts: Vec<&[u8]> = group.pieces.iter().map(|(entry, data, at)| &data.as_slice()[*at..*at + entry.len_bytes as usize]).collect();
    IoBuf::from_parts(&parts, group.data_bytes.next_multiple_of(BLOCK_BYTES as usize))
}
