//! A partition's ring of records: where the next record goes, which records are still needed,
//! and how much space is free. Pure bookkeeping; the I/O is in `part.rs`.
//!
//! Three positions matter. `head` is where the next record goes. The *live tail* is the oldest
//! record whose data may not be on the members yet. The *durable tail* is the tail the last
//! checkpoint on the device names: replay starts there, so the space between it and the head
//! may not be overwritten even when the live tail has moved on. Space is reclaimed only when a
//! checkpoint is durable, after the members were flushed.

use super::format::BLOCK_BYTES;
use std::collections::VecDeque;

/// A record the ring still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live {
    sequence: u64,
    position_bytes: u64,
    /// The record's bytes, plus for a wrap record the end of the ring it skips.
    span_bytes: u64,
    /// Holders of the record: its writer until its data is in the cache, then each cached piece
    /// of its data until that piece is on the members or overwritten.
    holders: u32,
}

/// Where a new record goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub sequence: u64,
    pub position_bytes: u64,
    /// A wrap record to write first (its sequence and position), when the record does not fit
    /// before the end of the ring.
    pub wrap: Option<(u64, u64)>,
}

#[derive(Debug)]
pub struct Ring {
    start_bytes: u64,
    end_bytes: u64,
    head_bytes: u64,
    next_sequence: u64,
    live: VecDeque<Live>,
    durable_tail: (u64, u64),
    /// Bytes from the durable tail to the head.
    used_bytes: u64,
}

impl Ring {
    /// An empty ring over device bytes `[start_bytes, end_bytes)` whose next record is
    /// `sequence` at `start_bytes`.
    pub fn new(start_bytes: u64, end_bytes: u64, sequence: u64) -> Ring {
        assert!(
            start_bytes.is_multiple_of(BLOCK_BYTES) && end_bytes.is_multiple_of(BLOCK_BYTES) && start_bytes < end_bytes,
            "ring {start_bytes}..{end_bytes}"
        );
        Ring {
            start_bytes,
            end_bytes,
            head_bytes: start_bytes,
            next_sequence: sequence,
            live: VecDeque::new(),
            durable_tail: (start_bytes, sequence),
            used_bytes: 0,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.end_bytes - self.start_bytes
    }

    /// Bytes that replay could still need: from the durable tail to the head.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes() - self.used_bytes
    }

    /// The sequence the next record gets.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Records still held (not yet on the members).
    pub fn live_records(&self) -> usize {
        self.live.len()
    }

    /// The position after a record of `record_bytes` at `position_bytes`.
    pub fn next_position(&self, position_bytes: u64, record_bytes: u64) -> u64 {
        let next = position_bytes + record_bytes;
        assert!(next <= self.end_bytes, "a record never crosses the end of the ring");
        if next == self.end_bytes {
            self.start_bytes
        } else {
            next
        }
    }

    /// The start of the ring: where a wrap record sends replay.
    pub fn start_bytes(&self) -> u64 {
        self.start_bytes
    }

    /// Whether records of `record_sizes` bytes, placed one after the other, would all fit
    /// (beyond `reserve_bytes`): what [`Ring::place`] would say of each, without placing any.
    pub fn fits(&self, record_sizes: &[u64], reserve_bytes: u64) -> bool {
        let (mut head, mut used) = (self.head_bytes, self.used_bytes);
        for &record_bytes in record_sizes {
            let room_before_end = self.end_bytes - head;
            let wraps = room_before_end < record_bytes;
            let needed = record_bytes + if wraps { room_before_end } else { 0 };
            if used + needed + reserve_bytes > self.capacity_bytes() {
                return false;
            }
            used += needed;
            head = if wraps { self.start_bytes + record_bytes } else { head + record_bytes };
            if head == self.end_bytes {
                head = self.start_bytes;
            }
        }
        true
    }

    /// Places a record of `record_bytes` (header and data blocks), held by its writer, or `None`
    /// when the ring has not the space (beyond `reserve_bytes`, which stays free).
    pub fn place(&mut self, record_bytes: u64, reserve_bytes: u64) -> Option<Placement> {
        assert!(
            record_bytes.is_multiple_of(BLOCK_BYTES) && record_bytes > 0 && record_bytes <= self.capacity_bytes() / 2,
            "record of {record_bytes} bytes"
        );
        let room_before_end = self.end_bytes - self.head_bytes;
        let wraps = room_before_end < record_bytes;
        let needed = record_bytes + if wraps { room_before_end } else { 0 };
        if self.used_bytes + needed + reserve_bytes > self.capacity_bytes() {
            return None;
        }
        let wrap = wraps.then(|| {
            let wrap = (self.next_sequence, self.head_bytes);
            self.push(room_before_end, 0);
            wrap
        });
        let placement = Placement { sequence: self.next_sequence, position_bytes: self.head_bytes, wrap };
        self.push(record_bytes, 1);
        Some(placement)
    }

    /// Makes the newest record, `sequence`, longer by `extra_bytes` (a group record taking one
    /// more write), if it is still the newest, the ring has the room (beyond `reserve_bytes`)
    /// and the longer record still ends at or before the end of the ring. Returns whether it
    /// did.
    pub fn grow_newest(&mut self, sequence: u64, extra_bytes: u64, reserve_bytes: u64) -> bool {
        assert!(extra_bytes.is_multiple_of(BLOCK_BYTES), "records grow by whole blocks");
        let Some(newest) = self.live.back() else { return false };
        let newest_end = newest.position_bytes + newest.span_bytes;
        let fits = newest.sequence == sequence
            && newest.sequence + 1 == self.next_sequence
            && newest_end + extra_bytes <= self.end_bytes
            && self.used_bytes + extra_bytes + reserve_bytes <= self.capacity_bytes()
            && newest.span_bytes + extra_bytes <= self.capacity_bytes() / 2;
        if !fits {
            return false;
        }
        // The head is right behind the newest record, or at the start when it ends the ring.
        assert_eq!(
            self.head_bytes,
            if newest_end == self.end_bytes { self.start_bytes } else { newest_end },
            "the head follows the newest record"
        );
        self.live.back_mut().expect("checked above").span_bytes += extra_bytes;
        self.used_bytes += extra_bytes;
        self.head_bytes = newest_end + extra_bytes;
        if self.head_bytes == self.end_bytes {
            self.head_bytes = self.start_bytes;
        }
        true
    }

    fn push(&mut self, span_bytes: u64, holders: u32) {
        self.live.push_back(Live { sequence: self.next_sequence, position_bytes: self.head_bytes, span_bytes, holders });
        self.next_sequence += 1;
        self.used_bytes += span_bytes;
        self.head_bytes += span_bytes;
        if self.head_bytes == self.end_bytes {
            self.head_bytes = self.start_bytes;
        }
        assert!(self.used_bytes <= self.capacity_bytes(), "the ring never holds more than its capacity");
    }

    fn live_mut(&mut self, sequence: u64) -> &mut Live {
        let front = self.live.front().expect("a held record is live").sequence;
        let index = sequence.checked_sub(front).expect("a held record is not behind the tail") as usize;
        let live = &mut self.live[index];
        assert_eq!(live.sequence, sequence, "live records have consecutive sequence numbers");
        live
    }

    /// One more holder of record `sequence` (a cached piece of its data).
    pub fn hold(&mut self, sequence: u64) {
        self.live_mut(sequence).holders += 1;
    }

    /// One holder of record `sequence` is done with it; records nobody holds leave the live
    /// tail, oldest first.
    pub fn release(&mut self, sequence: u64) {
        let live = self.live_mut(sequence);
        live.holders = live.holders.checked_sub(1).expect("a record is released once per holder");
        while self.live.front().is_some_and(|live| live.holders == 0) {
            self.live.pop_front();
        }
    }

    /// The live tail: the position and sequence replay would have to start from now.
    pub fn live_tail(&self) -> (u64, u64) {
        self.live.front().map_or((self.head_bytes, self.next_sequence), |live| (live.position_bytes, live.sequence))
    }

    pub fn durable_tail(&self) -> (u64, u64) {
        self.durable_tail
    }

    /// A checkpoint naming `tail` (a live tail taken earlier) is durable: the space behind it
    /// may be written again.
    pub fn checkpointed(&mut self, tail: (u64, u64)) {
        let (position, sequence) = tail;
        let (old_position, old_sequence) = self.durable_tail;
        assert!(sequence >= old_sequence, "checkpoints move forward");
        let freed = if sequence == old_sequence {
            0
        } else if position > old_position {
            position - old_position
        } else {
            // Crossed the end of the ring (a tail equal to the old one with a larger sequence
            // means the whole ring was used and freed).
            self.end_bytes - old_position + position - self.start_bytes
        };
        self.used_bytes = self.used_bytes.checked_sub(freed).expect("a checkpoint frees only used space");
        self.durable_tail = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK_BYTES;

    #[test]
    fn records_wrap_with_a_wrap_record_and_space_returns_only_at_a_checkpoint() {
        let mut ring = Ring::new(8 * B, 28 * B, 100);
        let first = ring.place(8 * B, 0).unwrap();
        assert_eq!(first, Placement { sequence: 100, position_bytes: 8 * B, wrap: None });
        let second = ring.place(8 * B, 0).unwrap();
        assert_eq!(second.position_bytes, 16 * B);
        // 4 blocks left before the end: a 8-block record needs the wrap, and the space is not
        // free until the first two are checkpointed.
        assert_eq!(ring.place(8 * B, 0), None);
        ring.release(100);
        ring.release(101);
        assert_eq!(ring.live_tail(), (24 * B, 102));
        assert_eq!(ring.place(8 * B, 0), None, "released but not checkpointed");
        assert!(!ring.fits(&[8 * B], 0), "fits says what place says");
        ring.checkpointed(ring.live_tail());
        assert_eq!(ring.used_bytes(), 0);
        // Four blocks before the end: one 8-block record needs 12 blocks, two need 20 (a ring).
        assert!(ring.fits(&[8 * B], 0) && ring.fits(&[8 * B, 8 * B], 0) && !ring.fits(&[8 * B, 8 * B, 4 * B], 0));
        let third = ring.place(8 * B, 0).unwrap();
        assert_eq!(third, Placement { sequence: 103, position_bytes: 8 * B, wrap: Some((102, 24 * B)) });
        assert_eq!(ring.used_bytes(), 12 * B);
        // The wrap record is held by nobody: releasing the record frees both.
        ring.release(103);
        assert_eq!(ring.live_tail(), (16 * B, 104));
        ring.checkpointed(ring.live_tail());
        assert_eq!(ring.used_bytes(), 0);
    }

    #[test]
    fn only_the_newest_record_grows_and_never_past_the_end_or_into_the_reserve() {
        let mut ring = Ring::new(0, 16 * B, 1);
        let a = ring.place(2 * B, 0).unwrap();
        assert!(ring.grow_newest(a.sequence, B, 0));
        assert_eq!((ring.used_bytes(), ring.live_tail()), (3 * B, (0, 1)));
        let b = ring.place(2 * B, 0).unwrap();
        assert_eq!(b.position_bytes, 3 * B, "the next record starts where the grown one ends");
        assert!(!ring.grow_newest(a.sequence, B, 0), "an older record cannot grow");
        assert!(!ring.grow_newest(b.sequence, 4 * B, 8 * B), "would eat into the reserve");
        assert!(ring.grow_newest(b.sequence, 3 * B, 0));
        assert!(!ring.grow_newest(b.sequence, 4 * B, 0), "a record is at most half the ring");
        let c = ring.place(8 * B, 0).unwrap();
        assert_eq!(c.position_bytes, 8 * B);
        assert_eq!(ring.used_bytes(), 16 * B);
        assert!(!ring.grow_newest(c.sequence, B, 0), "it ends the ring: the head is at the start");
        assert_eq!(ring.place(B, 0), None, "full");
    }

    #[test]
    fn the_reserve_stays_free_and_holders_keep_records_live() {
        let mut ring = Ring::new(0, 16 * B, 1);
        let a = ring.place(4 * B, 0).unwrap();
        ring.hold(a.sequence);
        ring.release(a.sequence); // the writer hands over to its cached piece
        assert_eq!(ring.live_records(), 1);
        assert_eq!(ring.place(8 * B, 8 * B), None, "would eat into the reserve");
        assert!(ring.place(8 * B, 4 * B).is_some());
        ring.release(a.sequence);
        assert_eq!(ring.live_tail().1, 2, "the first record left; the second is still held");
    }
}
