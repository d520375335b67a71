//! Clean data in a shard's cache: what reads of `iopolicy=cached` VDs brought in and what
//! read-ahead fetched, in lines of [`LINE_BYTES`] with a valid bit per [`PAGE_BYTES`] page.
//!
//! Lines are evicted by CLOCK (second chance): a line read since the hand last passed it is
//! spared once. A scan therefore pushes out lines nobody reads again before a hot line. Clean
//! data only ever takes the room dirty data leaves: it is evicted first when writes need room.
//!
//! The one danger of a clean cache is keeping data older than the members': a read that
//! started before a write may bring in what the write then replaced. Every read that will
//! keep its data registers a [`Fill`] first; a write poisons the fills it overlaps (and a
//! fill that starts while a write to its range is on its way to the members is poisoned from
//! birth), and a poisoned fill keeps nothing. Writes that go through the dirty map update the
//! lines they overlap in the same step; writes that go straight to the members invalidate
//! them, before and after.
//!
//! The lines themselves ([`LineTable`]) sit behind a mutex that the engine holds too: a read
//! that every held page answers is served on the thread that submits it
//! ([`crate::Engine`]'s cache hits), without the two thread wake-ups of a hop to the shard,
//! which at queue depth 1 are nearly all of a hit's latency. Only the shard changes the lines,
//! always under that mutex, and every write changes them (update or invalidate) before it is
//! acknowledged: a hit that takes the mutex after a write's acknowledgement sees the write's
//! bytes or no line. Fills and direct writes stay the shard's own.

use super::line_memory::{LineMemory, LineSlot};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

/// A line of clean data: aligned in VD space, kept whole or not at all.
pub const LINE_BYTES: u64 = 64 << 10;
/// The unit of validity within a line.
pub const PAGE_BYTES: u64 = 4096;
const PAGES_PER_LINE: u64 = LINE_BYTES / PAGE_BYTES;
const _: () = assert!(PAGES_PER_LINE <= 16, "a line's valid bits are a u16");

/// A VD (its instance id) and a line index.
type Key = (u64, u64);

struct Line {
    slot: LineSlot,
    /// Bit `i`: page `i` holds the VD's data.
    valid: u16,
    /// Read since the clock hand last passed.
    referenced: bool,
}

/// A read on its way to keeping what it reads (a client read of a cached VD, or a
/// read-ahead). See the module comment.
pub(crate) struct Fill {
    vd: u64,
    range: Range<u64>,
    /// [`crate::VirtualDrive::init_epoch`] when it began: an initialization since (which
    /// writes the members behind the cache's back) makes what it read worthless.
    pub init_epoch: u64,
    prefetch: bool,
    poisoned: Cell<bool>,
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
}

impl Fill {
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.get()
    }

    /// Waits until the fill ended (kept or not).
    pub async fn wait(&self) {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }
}

/// Counters of the clean cache, for `show` and the metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct CleanStats {
    pub hits: u64,
    pub misses: u64,
    pub read_ahead_bytes: u64,
    pub bytes: u64,
}

impl CleanStats {
    /// Both counts together (shards, or engines one after the other).
    pub fn plus(&self, other: &CleanStats) -> CleanStats {
        CleanStats {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            read_ahead_bytes: self.read_ahead_bytes + other.read_ahead_bytes,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// A shard's lines, their clock and the counters, shared with the threads that serve hits.
#[derive(Default)]
pub struct LineTable {
    lines: HashMap<Key, Line>,
    /// The clock: lines in the order they came in (keys of removed lines are skipped).
    clock: VecDeque<Key>,
    /// The lines' bytes. A line taken again keeps its old bytes, which are never read: a
    /// line's pages are valid only once written.
    memory: LineMemory,
    stats: CleanStats,
}

/// The handle the shard and the engine share (see the module comment).
pub type SharedLines = Arc<Mutex<LineTable>>;

/// Serves a read of `range` of VD `vd` from `lines` into `out` if every page of it is held
/// (counted as a hit); otherwise leaves `out` alone.
pub fn serve_hit(lines: &SharedLines, vd: u64, range: Range<u64>, out: &mut [u8]) -> bool {
    let mut table = lock(lines);
    let held = table.copy_out(vd, range, out);
    table.stats.hits += u64::from(held);
    held
}

fn lock(lines: &SharedLines) -> MutexGuard<'_, LineTable> {
    // A panic while the lock was held left the table as a whole step left it: each method
    // changes it only through safe code, so the lines stay usable.
    lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Default)]
pub(crate) struct CleanLines {
    table: SharedLines,
    fills: Vec<Rc<Fill>>,
    /// Writes on their way to the members outside the dirty map: (id, VD, range).
    direct_writes: Vec<(u64, u64, Range<u64>)>,
    next_write_id: u64,
}

/// The pages `range` touches: (line index, page within the line).
fn pages(range: &Range<u64>) -> impl Iterator<Item = (u64, u64)> {
    (range.start / PAGE_BYTES..range.end.div_ceil(PAGE_BYTES)).map(|page| (page / PAGES_PER_LINE, page % PAGES_PER_LINE))
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

impl LineTable {
    fn bytes(&self) -> u64 {
        self.lines.len() as u64 * LINE_BYTES
    }

    fn holds_page(&self, vd: u64, page: u64) -> bool {
        self.lines.get(&(vd, page / PAGES_PER_LINE)).is_some_and(|l| l.valid & (1 << (page % PAGES_PER_LINE)) != 0)
    }

    fn copy_out(&mut self, vd: u64, range: Range<u64>, out: &mut [u8]) -> bool {
        assert_eq!(out.len() as u64, range.end - range.start, "the buffer fits the range");
        let held = pages(&range).all(|(line, page)| self.lines.get(&(vd, line)).is_some_and(|l| l.valid & (1 << page) != 0));
        if !held {
            return false;
        }
        let mut offset = range.start;
        while offset < range.end {
            let line = self.lines.get_mut(&(vd, offset / LINE_BYTES)).expect("checked above");
            let at = (offset % LINE_BYTES) as usize;
            let len = ((LINE_BYTES - offset % LINE_BYTES).min(range.end - offset)) as usize;
            let out_at = (offset - range.start) as usize;
            out[out_at..out_at + len].copy_from_slice(&self.memory.bytes(line.slot)[at..at + len]);
            line.referenced = true;
            offset += len as u64;
        }
        true
    }

    fn insert(&mut self, vd: u64, offset: u64, data: &[u8], room_bytes: u64) {
        let first_page = offset.div_ceil(PAGE_BYTES);
        let end_page = (offset + data.len() as u64) / PAGE_BYTES;
        for page in first_page..end_page {
            let key = (vd, page / PAGES_PER_LINE);
            if !self.lines.contains_key(&key) {
                if room_bytes < LINE_BYTES {
                    return;
                }
                self.evict_to(room_bytes - LINE_BYTES);
                let Some(slot) = self.memory.take() else { return };
                self.lines.insert(key, Line { slot, valid: 0, referenced: false });
                self.clock.push_back(key);
            }
            let line = self.lines.get_mut(&key).expect("present");
            let at = ((page % PAGES_PER_LINE) * PAGE_BYTES) as usize;
            let from = (page * PAGE_BYTES - offset) as usize;
            self.memory.bytes_mut(line.slot)[at..at + PAGE_BYTES as usize].copy_from_slice(&data[from..from + PAGE_BYTES as usize]);
            line.valid |= 1 << (page % PAGES_PER_LINE);
        }
        self.tidy_clock();
    }

    fn update(&mut self, vd: u64, offset: u64, data: &[u8]) {
        let range = offset..offset + data.len() as u64;
        for (line_index, page) in pages(&range) {
            let Some(line) = self.lines.get_mut(&(vd, line_index)) else { continue };
            let page_range = (line_index * LINE_BYTES + page * PAGE_BYTES)..(line_index * LINE_BYTES + (page + 1) * PAGE_BYTES);
            let start = page_range.start.max(range.start);
            let end = page_range.end.min(range.end);
            let at = (start % LINE_BYTES) as usize;
            self.memory.bytes_mut(line.slot)[at..at + (end - start) as usize]
                .copy_from_slice(&data[(start - offset) as usize..(end - offset) as usize]);
            if start == page_range.start && end == page_range.end {
                line.valid |= 1 << page;
            }
        }
    }

    fn invalidate(&mut self, vd: u64, range: &Range<u64>) {
        for (line_index, page) in pages(range) {
            let Some(line) = self.lines.get_mut(&(vd, line_index)) else { continue };
            line.valid &= !(1 << page);
            if line.valid == 0 {
                self.remove(&(vd, line_index));
            }
        }
    }

    fn evict_to(&mut self, max_bytes: u64) {
        while self.bytes() > max_bytes {
            let key = self.clock.pop_front().expect("every line is on the clock");
            let Some(line) = self.lines.get_mut(&key) else { continue };
            if line.referenced {
                line.referenced = false;
                self.clock.push_back(key);
            } else {
                self.remove(&key);
            }
        }
    }

    /// Forgets line `key`, if held, and frees its memory.
    fn remove(&mut self, key: &Key) {
        if let Some(line) = self.lines.remove(key) {
            self.memory.give(line.slot);
        }
    }

    /// Drops the clock's keys of removed lines once they outnumber the lines.
    fn tidy_clock(&mut self) {
        if self.clock.len() <= 2 * self.lines.len() + 1024 {
            return;
        }
        let mut seen = HashSet::new();
        let lines = &self.lines;
        self.clock.retain(|key| lines.contains_key(key) && seen.insert(*key));
        assert_eq!(self.clock.len(), self.lines.len(), "every line is on the clock once");
    }
}

impl CleanLines {
    /// The lines, for the engine's hits on other threads.
    pub fn shared(&self) -> SharedLines {
        Arc::clone(&self.table)
    }

    fn table(&self) -> MutexGuard<'_, LineTable> {
        lock(&self.table)
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.table().bytes()
    }

    /// The counters, with the bytes held now.
    pub fn stats(&self) -> CleanStats {
        let table = self.table();
        CleanStats { bytes: table.bytes(), ..table.stats }
    }

    pub fn count_miss(&self) {
        self.table().stats.misses += 1;
    }

    pub fn count_read_ahead(&self, bytes: u64) {
        self.table().stats.read_ahead_bytes += bytes;
    }

    /// Copies `range` of VD `vd` into `out` if every page of it is held (counted as a hit);
    /// otherwise leaves `out` alone.
    pub fn copy_out(&self, vd: u64, range: Range<u64>, out: &mut [u8]) -> bool {
        serve_hit(&self.table, vd, range, out)
    }

    /// Keeps the whole pages of `data` (VD bytes from `offset`), taking at most `room_bytes`
    /// for all lines (evicting others to make room).
    pub fn insert(&mut self, vd: u64, offset: u64, data: &[u8], room_bytes: u64) {
        self.table().insert(vd, offset, data, room_bytes);
    }

    /// A write through the dirty map: the lines it overlaps take its bytes (pages it covers
    /// whole become valid), and fills of its range keep nothing.
    pub fn update(&mut self, vd: u64, offset: u64, data: &[u8]) {
        self.poison(vd, &(offset..offset + data.len() as u64));
        self.table().update(vd, offset, data);
    }

    /// Forgets the pages `range` touches.
    pub fn invalidate(&mut self, vd: u64, range: &Range<u64>) {
        self.table().invalidate(vd, range);
    }

    /// Forgets everything of a VD (deleted, or initialized).
    pub fn forget_vd(&mut self, vd: u64) {
        let mut table = self.table();
        let keys: Vec<Key> = table.lines.keys().filter(|&&(v, _)| v == vd).copied().collect();
        keys.iter().for_each(|key| table.remove(key));
        table.tidy_clock();
        drop(table);
        self.fills.iter().filter(|f| f.vd == vd).for_each(|f| f.poisoned.set(true));
    }

    /// A write to `range` is on its way to the members outside the dirty map (or a repair
    /// may change what the range reads): until [`CleanLines::end_direct_write`], nothing of
    /// it is kept.
    pub fn begin_direct_write(&mut self, vd: u64, range: Range<u64>) -> u64 {
        self.invalidate(vd, &range);
        self.poison(vd, &range);
        self.next_write_id += 1;
        self.direct_writes.push((self.next_write_id, vd, range));
        self.next_write_id
    }

    pub fn end_direct_write(&mut self, id: u64) {
        let index = self.direct_writes.iter().position(|w| w.0 == id).expect("a direct write ends once");
        let (_, vd, range) = self.direct_writes.swap_remove(index);
        self.invalidate(vd, &range);
    }

    pub fn begin_fill(&mut self, vd: u64, range: Range<u64>, prefetch: bool, init_epoch: u64) -> Rc<Fill> {
        let poisoned = self.direct_writes.iter().any(|(_, v, r)| *v == vd && overlaps(r, &range));
        let fill = Rc::new(Fill { vd, range, init_epoch, prefetch, poisoned: Cell::new(poisoned), waiters: RefCell::new(Vec::new()) });
        self.fills.push(Rc::clone(&fill));
        fill
    }

    pub fn end_fill(&mut self, fill: &Rc<Fill>) {
        self.fills.retain(|f| !Rc::ptr_eq(f, fill));
        for waiter in fill.waiters.borrow_mut().drain(..) {
            let _ = waiter.send(());
        }
    }

    /// A fill in flight that will keep all of `range`, if any.
    pub fn fill_covering(&self, vd: u64, range: &Range<u64>) -> Option<Rc<Fill>> {
        self.fills.iter().find(|f| f.vd == vd && !f.is_poisoned() && f.range.start <= range.start && range.end <= f.range.end).cloned()
    }

    pub fn prefetches_in_flight(&self) -> usize {
        self.fills.iter().filter(|f| f.prefetch).count()
    }

    /// `range` without the pages at either end that are held already (empty if all are).
    pub fn trim_held(&self, vd: u64, range: Range<u64>) -> Range<u64> {
        let table = self.table();
        let (mut first, mut end) = (range.start / PAGE_BYTES, range.end / PAGE_BYTES);
        while first < end && table.holds_page(vd, first) {
            first += 1;
        }
        while end > first && table.holds_page(vd, end - 1) {
            end -= 1;
        }
        first * PAGE_BYTES..end * PAGE_BYTES
    }

    fn poison(&self, vd: u64, range: &Range<u64>) {
        self.fills.iter().filter(|f| f.vd == vd && overlaps(&f.range, range)).for_each(|f| f.poisoned.set(true));
    }

    /// Evicts lines until at most `max_bytes` are held.
    pub fn evict_to(&mut self, max_bytes: u64) {
        self.table().evict_to(max_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: u64 = 1 << 30;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn whole_pages_are_kept_and_served_and_partial_ones_are_not() {
        let mut clean = CleanLines::default();
        let data = pattern(3 * PAGE_BYTES as usize, 1);
        // From the middle of a page: the first page is partial and is not kept.
        clean.insert(7, 512, &data, ROOM);
        let mut out = vec![0; PAGE_BYTES as usize];
        assert!(!clean.copy_out(7, 0..PAGE_BYTES, &mut out));
        assert!(clean.copy_out(7, PAGE_BYTES..2 * PAGE_BYTES, &mut out));
        assert_eq!(out, data[PAGE_BYTES as usize - 512..2 * PAGE_BYTES as usize - 512]);
        assert!(!clean.copy_out(8, PAGE_BYTES..2 * PAGE_BYTES, &mut out), "another VD's data is not served");
    }

    #[test]
    fn a_write_updates_what_is_held_and_poisons_fills_in_flight() {
        let mut clean = CleanLines::default();
        clean.insert(1, 0, &pattern(LINE_BYTES as usize, 1), ROOM);
        let fill = clean.begin_fill(1, LINE_BYTES..2 * LINE_BYTES, false, 0);
        let other = clean.begin_fill(1, 4 * LINE_BYTES..5 * LINE_BYTES, false, 0);
        let write = pattern(2 * LINE_BYTES as usize, 9);
        clean.update(1, 100, &write[..LINE_BYTES as usize]);
        assert!(fill.is_poisoned() && !other.is_poisoned());
        let mut out = vec![0; 200];
        assert!(clean.copy_out(1, 50..250, &mut out));
        assert_eq!(&out[50..], &write[..150]);
    }

    #[test]
    fn a_direct_write_invalidates_and_poisons_fills_that_start_during_it() {
        let mut clean = CleanLines::default();
        clean.insert(1, 0, &pattern(LINE_BYTES as usize, 1), ROOM);
        let id = clean.begin_direct_write(1, 8192..12288);
        let mut out = vec![0; 4096];
        assert!(!clean.copy_out(1, 8192..12288, &mut out));
        assert!(clean.copy_out(1, 0..4096, &mut out), "other pages stay");
        let during = clean.begin_fill(1, 0..LINE_BYTES, false, 0);
        assert!(during.is_poisoned());
        clean.end_direct_write(id);
        assert!(!clean.begin_fill(1, 0..LINE_BYTES, false, 0).is_poisoned());
    }

    #[test]
    fn eviction_spares_lines_read_since_the_hand_passed() {
        let mut clean = CleanLines::default();
        let room = 4 * LINE_BYTES;
        for line in 0..4 {
            clean.insert(1, line * LINE_BYTES, &pattern(LINE_BYTES as usize, 1), room);
        }
        let mut out = vec![0; 4096];
        assert!(clean.copy_out(1, 0..4096, &mut out), "line 0 is read: it is hot");
        for line in 10..13 {
            clean.insert(1, line * LINE_BYTES, &pattern(LINE_BYTES as usize, 1), room);
        }
        assert_eq!(clean.bytes(), room);
        assert!(clean.copy_out(1, 0..4096, &mut out), "the hot line survived a scan of three");
        assert!(!clean.copy_out(1, LINE_BYTES..LINE_BYTES + 4096, &mut out), "a cold one did not");
    }

    #[test]
    fn a_line_that_reuses_an_evicted_buffer_serves_only_what_was_put_in_it() {
        let mut clean = CleanLines::default();
        let room = LINE_BYTES;
        clean.insert(1, 0, &pattern(LINE_BYTES as usize, 1), room);
        // Evicts line 0; the new line takes its buffer, with line 0's bytes still in it.
        clean.insert(1, 4 * LINE_BYTES, &pattern(PAGE_BYTES as usize, 2), room);
        let mut out = vec![0; PAGE_BYTES as usize];
        assert!(!clean.copy_out(1, 0..PAGE_BYTES, &mut out), "the evicted line is gone");
        assert!(clean.copy_out(1, 4 * LINE_BYTES..4 * LINE_BYTES + PAGE_BYTES, &mut out));
        assert_eq!(out, pattern(PAGE_BYTES as usize, 2));
        let other_page = 4 * LINE_BYTES + PAGE_BYTES;
        assert!(!clean.copy_out(1, other_page..other_page + PAGE_BYTES, &mut out), "old bytes in the buffer are not data");
    }

    #[test]
    fn trimming_skips_held_pages_at_both_ends() {
        let mut clean = CleanLines::default();
        clean.insert(1, 0, &pattern(2 * PAGE_BYTES as usize, 1), ROOM);
        clean.insert(1, 5 * PAGE_BYTES, &pattern(PAGE_BYTES as usize, 1), ROOM);
        assert_eq!(clean.trim_held(1, 0..6 * PAGE_BYTES), 2 * PAGE_BYTES..5 * PAGE_BYTES);
        assert_eq!(clean.trim_held(1, 0..2 * PAGE_BYTES), 2 * PAGE_BYTES..2 * PAGE_BYTES);
    }
}
