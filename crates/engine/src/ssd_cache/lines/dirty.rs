//! Write-back bookkeeping (see the rules in [`super`]): writes that make lines dirty, destages
//! that make them clean, and the table blocks whose writes make either durable.

use super::{LineKey, Lines, State, WriteAction};
use crate::ssd_cache::map::{SlotEntry, ENTRIES_PER_BLOCK};
use std::collections::BTreeSet;

/// Called once the table block a write waits for is on disk (`true`) or failed (`false`).
pub(crate) type TableWaiter = Box<dyn FnOnce(bool) + Send>;

/// A table block write to start: the block, its generation, the entries of its slots.
pub(crate) struct TableStart {
    pub block: u32,
    pub generation: u64,
    pub image: Vec<Option<SlotEntry>>,
}

/// A destage to run: the line, its slot, and its epoch when it began.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Destage {
    pub key: LineKey,
    pub slot: u32,
    pub epoch: u64,
}

#[derive(Clone, Copy, Default)]
struct Block {
    /// The generation the block must reach: bumped when a slot's entry changes.
    requested: u64,
    /// The last generation written (or failed).
    written: u64,
    written_ok: bool,
    in_flight: Option<u64>,
}

/// What the table on the cache VD says, and the writes that change it.
pub(crate) struct Table {
    /// Per slot: its entry on disk may say dirty (a failed write leaves what it claimed).
    durable_dirty: Vec<bool>,
    /// Per slot: the block write in flight says dirty.
    in_flight_dirty: Vec<bool>,
    /// Slots freed while the table still says dirty there: free once it does not.
    clean_pending: BTreeSet<u32>,
    blocks: Vec<Block>,
    /// Blocks whose `requested` is past `written` and that no write is in flight for.
    wanted: BTreeSet<u32>,
    waiters: Vec<(u32, u64, TableWaiter)>,
}

impl Table {
    pub(super) fn new(slot_count: u32) -> Table {
        Table {
            durable_dirty: vec![false; slot_count as usize],
            in_flight_dirty: vec![false; slot_count as usize],
            clean_pending: BTreeSet::new(),
            blocks: vec![Block { written_ok: true, ..Block::default() }; slot_count.div_ceil(ENTRIES_PER_BLOCK) as usize],
            wanted: BTreeSet::new(),
            waiters: Vec::new(),
        }
    }

    pub(super) fn durable_dirty(&self, slot: u32) -> bool {
        self.durable_dirty[slot as usize]
    }

    /// The table on disk says, or may say once the write in flight lands, that `slot` holds a
    /// dirty line: the slot must not take another line.
    pub(super) fn may_say_dirty(&self, slot: u32) -> bool {
        self.durable_dirty[slot as usize] || self.in_flight_dirty[slot as usize]
    }

    pub(super) fn clean_pending(&self) -> impl Iterator<Item = u32> + '_ {
        self.clean_pending.iter().copied()
    }

    /// Asks for block `block` to be written again; the generation that will include what
    /// changed now.
    pub(super) fn request(&mut self, block: u32) -> u64 {
        let b = &mut self.blocks[block as usize];
        b.requested = b.requested.max(b.in_flight.unwrap_or(b.written) + 1);
        if b.in_flight.is_none() {
            self.wanted.insert(block);
        }
        b.requested
    }
}

fn block_of(slot: u32) -> u32 {
    slot / ENTRIES_PER_BLOCK
}

impl Lines {
    /// A write-back write touching `key` is about to go: a held valid line is written on the
    /// cache VD only and becomes dirty (with the table generation to wait for if the table does
    /// not say so yet); any other line is written around, as [`Lines::begin_write`] says.
    pub(crate) fn begin_write_back(&mut self, key: LineKey) -> (WriteAction, Option<(u32, u64)>) {
        assert!(self.write_back, "a write-through cache has no dirty lines");
        if self.entries.get(&key).map(|e| e.state) != Some(State::Valid) {
            return (self.begin_write(key), None);
        }
        *self.writing.entry(key).or_insert(0) += 1;
        let entry = self.entries.get_mut(&key).expect("checked above");
        entry.writers += 1;
        entry.epoch += 1;
        if !entry.dirty {
            entry.dirty = true;
            self.dirty.insert(key);
        }
        let slot = entry.slot;
        let block = block_of(slot);
        let in_flight = self.table.blocks[block as usize].in_flight;
        // What the table will say once the write in flight (if any) lands decides: a write in
        // flight that says clean (the line was destaged) would undo a dirty claim on disk.
        let wait = match (in_flight, self.table.in_flight_dirty[slot as usize], self.table.durable_dirty(slot)) {
            (None, _, true) | (Some(_), true, true) => None,
            (Some(generation), true, false) => Some((block, generation)),
            (None, _, false) | (Some(_), false, _) => Some((block, self.table.request(block))),
        };
        (WriteAction::Update(slot), wait)
    }

    /// A read of `keys` that is no hit: if one of them is dirty, every valid one is pinned and
    /// its slot returned (the others are read from the VD, which is as new as the cache there);
    /// `None` if none is dirty (an ordinary miss).
    pub(crate) fn begin_partial_read(&mut self, keys: &[LineKey]) -> Option<Vec<Option<u32>>> {
        if !self.any_dirty(keys) {
            return None;
        }
        let slots = keys
            .iter()
            .map(|key| {
                let valid = self.entries.get(key).is_some_and(|e| e.state == State::Valid);
                valid.then(|| self.begin_read(std::slice::from_ref(key)).expect("valid")[0])
            })
            .collect();
        Some(slots)
    }

    /// Runs `waiter` once block `block` reached `generation`; gives it back if it has (with the
    /// result of the block's last write, which includes the line: it stayed dirty since).
    pub(crate) fn table_wait(&mut self, block: u32, generation: u64, waiter: TableWaiter) -> Option<(TableWaiter, bool)> {
        let b = self.table.blocks[block as usize];
        if b.written >= generation {
            return Some((waiter, b.written_ok));
        }
        self.table.waiters.push((block, generation, waiter));
        None
    }

    /// Table block writes to start now (each block one at a time), with their images.
    pub(crate) fn table_starts(&mut self) -> Vec<TableStart> {
        let blocks: Vec<u32> = std::mem::take(&mut self.table.wanted).into_iter().collect();
        let mut starts = Vec::with_capacity(blocks.len());
        for block in blocks {
            let b = &mut self.table.blocks[block as usize];
            assert!(b.in_flight.is_none() && b.requested > b.written, "block {block}: wanted means due and idle");
            b.in_flight = Some(b.requested);
            let generation = b.requested;
            let first = block * ENTRIES_PER_BLOCK;
            let slots = first..(first + ENTRIES_PER_BLOCK).min(self.slot_count);
            let image: Vec<Option<SlotEntry>> = slots.clone().map(|slot| self.slot_entry(slot)).collect();
            for (slot, entry) in slots.zip(&image) {
                self.table.in_flight_dirty[slot as usize] = entry.is_some_and(|e| e.dirty);
            }
            starts.push(TableStart { block, generation, image });
        }
        starts
    }

    /// What the table should say about `slot` now.
    fn slot_entry(&self, slot: u32) -> Option<SlotEntry> {
        let key = self.slot_keys[slot as usize]?;
        let entry = &self.entries[&key];
        let vd_id = *self.vd_ids.get(&key.0)?;
        (entry.state == State::Valid).then_some(SlotEntry { vd_id, line: key.1, dirty: entry.dirty })
    }

    /// The table block write of [`Lines::table_starts`] ended; returns the writes waiting for
    /// it, to be told `ok` (outside the lock).
    pub(crate) fn table_written(&mut self, block: u32, generation: u64, ok: bool) -> Vec<TableWaiter> {
        let b = &mut self.table.blocks[block as usize];
        assert_eq!(b.in_flight, Some(generation), "block {block}: the write that ended is the one in flight");
        b.in_flight = None;
        b.written = generation;
        b.written_ok = ok;
        if b.requested > b.written {
            self.table.wanted.insert(block);
        }
        let first = block * ENTRIES_PER_BLOCK;
        for slot in first..(first + ENTRIES_PER_BLOCK).min(self.slot_count) {
            let claimed = std::mem::take(&mut self.table.in_flight_dirty[slot as usize]);
            // A failed write may have landed: what it claimed dirty may be dirty on disk.
            let durable = &mut self.table.durable_dirty[slot as usize];
            *durable = if ok { claimed } else { *durable || claimed };
            if !*durable && self.table.clean_pending.remove(&slot) {
                self.free.push(slot);
            }
        }
        let (done, waiting) = std::mem::take(&mut self.table.waiters).into_iter().partition(|(b, g, _)| *b == block && *g <= generation);
        self.table.waiters = waiting;
        done.into_iter().map(|(_, _, waiter)| waiter).collect()
    }

    /// Asks for every block to be written (at start, after the lines were installed, and at a
    /// clean stop); the generation each must reach.
    pub(crate) fn request_all_blocks(&mut self) -> Vec<(u32, u64)> {
        (0..self.table.blocks.len() as u32).map(|block| (block, self.table.request(block))).collect()
    }

    /// Up to `max` dirty lines to destage (of VD `only` if given), in LBA order from where the
    /// last destage stopped, each pinned; none while frozen.
    pub(crate) fn begin_destage(&mut self, only: Option<u64>, max: usize) -> Vec<Destage> {
        if self.frozen {
            return Vec::new();
        }
        let cursor = self.destage_cursor;
        let entries = &self.entries;
        let keys: Vec<LineKey> = self
            .dirty
            .range(cursor..)
            .chain(self.dirty.range(..cursor))
            .filter(|key| only.is_none_or(|vd| key.0 == vd))
            .filter(|key| entries[key].writers == 0 && !entries[key].destaging)
            .take(max)
            .copied()
            .collect();
        let mut destages = Vec::with_capacity(keys.len());
        for key in keys {
            let entry = self.entries.get_mut(&key).expect("a dirty line is held");
            entry.destaging = true;
            entry.readers += 1;
            destages.push(Destage { key, slot: entry.slot, epoch: entry.epoch });
            self.destage_cursor = (key.0, key.1 + 1);
        }
        destages
    }

    /// A destage ended: the line is clean if it was written to its VD and flushed (`ok`) and no
    /// write came meanwhile; the table is to say so (its block is requested). Returns whether
    /// it is clean now.
    pub(crate) fn end_destage(&mut self, destage: Destage, ok: bool) -> bool {
        let entry = self.entries.get_mut(&destage.key).expect("a destaging line is pinned");
        assert!(entry.destaging && entry.readers > 0, "line {:?}: a destage ended that did not begin", destage.key);
        entry.destaging = false;
        entry.readers -= 1;
        let cleaned = ok && entry.dirty && entry.epoch == destage.epoch;
        if cleaned {
            entry.dirty = false;
            self.dirty.remove(&destage.key);
            self.table.request(block_of(destage.slot));
        }
        self.release_if_idle(destage.key);
        cleaned
    }

    /// Drops a dirty line's data on purpose (its VD is detached or reinitialized): it becomes
    /// clean, and the table is to say its slot holds nothing dirty.
    pub(super) fn discard(&mut self, key: LineKey) {
        let Some(entry) = self.entries.get_mut(&key) else { return };
        if std::mem::take(&mut entry.dirty) {
            self.dirty.remove(&key);
            let slot = entry.slot;
            self.table.request(block_of(slot));
        }
    }

    /// Gives a slot back: free at once, or once the table no longer says it is dirty there.
    pub(super) fn free_slot(&mut self, slot: u32) {
        self.slot_keys[slot as usize] = None;
        if self.table.may_say_dirty(slot) {
            self.table.clean_pending.insert(slot);
            self.table.request(block_of(slot));
        } else {
            self.free.push(slot);
        }
    }

    pub(crate) fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    pub(crate) fn dirty_count_of(&self, vd_instance: u64) -> usize {
        self.dirty.range((vd_instance, 0)..=(vd_instance, u64::MAX)).count()
    }

    pub(crate) fn any_dirty(&self, keys: &[LineKey]) -> bool {
        keys.iter().any(|key| self.dirty.contains(key))
    }

    /// Table block writes in flight or due.
    pub(crate) fn table_busy(&self) -> bool {
        !self.table.wanted.is_empty() || self.table.blocks.iter().any(|b| b.in_flight.is_some())
    }
}
