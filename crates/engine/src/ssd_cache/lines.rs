//! Which lines of which VDs the cache VD holds, and the rules that keep every one of them equal
//! to its VD. Pure bookkeeping under the SSD cache's lock: no I/O, no clock.
//!
//! # Admission and eviction: 2Q without its A1in queue
//! A line is promoted on its second miss while it is remembered in the *ghost* queue (2Q's
//! A1out: the keys of recently missed lines, no data, as many as half the cache's slots): a line
//! read once, as by a scan, costs a key and never displaces a cached line. Cached lines are
//! evicted least recently used first (2Q's Am). 2Q's A1in, which caches a line on its first
//! miss, is left out: promotion writes the SSD, and a line read once is not worth that write
//! (MegaRAID's CacheCade and bcache's `sequential_cutoff` make the same choice for the same
//! reason). ARC would adapt the ghost size to the workload; 2Q's fixed size is simpler and the
//! seed's workloads (a database's hot set) do not need the adaptation.
//!
//! # Keeping lines equal to their VD (write-through)
//! - A read is served from the cache only if every line it touches is `Valid`; it pins them
//!   (`readers`) so that none is evicted or reused under it.
//! - A write counts itself on every line it touches (`writing`, cached or not), before it
//!   goes to the VD. A `Valid` line with no other writer is updated with it (`writers`); a line
//!   another write is updating becomes `Stale` (two updates in flight could land in different
//!   orders on the VD and the cache VD) and leaves once idle.
//! - A fill (promotion) starts only on a line that no write is in flight for, and any write
//!   that arrives before it is installed poisons it: the fill read the VD before that write.
//! - A line whose cache read or update failed becomes `Stale`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// A line: the VD's instance id (never reused in a process, unlike VD numbers) and the line's
/// index in the VD.
pub(crate) type LineKey = (u64, u64);

/// Fills (promotions) in flight at once: each reads a line from the VD (hard disks) and
/// writes it to the cache VD; more would take the disks from the clients.
pub(crate) const FILLS_IN_FLIGHT_MAX: usize = 16;
/// Cached lines looked at, oldest first, for one that nothing uses, before a promotion is
/// given up.
const EVICTION_SCAN_MAX: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Being read from the VD and written to the cache VD; `poisoned` by a write meanwhile.
    Filling {
        poisoned: bool,
    },
    Valid,
    /// Not to be read; freed once no read or write uses it.
    Stale,
}

#[derive(Debug)]
struct Entry {
    slot: u32,
    state: State,
    readers: u32,
    writers: u32,
    /// Key in `lru` while `Valid`.
    last_use: u64,
}

/// What a write does with one line it touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteAction {
    /// Write the line's part to this slot too.
    Update(u32),
    /// The VD only.
    Skip,
}

pub(crate) struct Lines {
    slot_count: u32,
    entries: HashMap<LineKey, Entry>,
    /// Valid lines by last use, oldest first.
    lru: BTreeMap<u64, LineKey>,
    free: Vec<u32>,
    /// Missed lines in miss order, each with the number of its miss. A line promoted or missed
    /// again leaves its old entry behind (removing it would cost a scan on the data path); the
    /// entry counts against the bound and is skipped when it comes out.
    ghosts: VecDeque<(LineKey, u64)>,
    /// The lines remembered, with the number of their entry in `ghosts`.
    ghost_set: HashMap<LineKey, u64>,
    ghosts_max: usize,
    misses: u64,
    /// Writes in flight per line, cached or not.
    writing: HashMap<LineKey, u32>,
    /// VDs (instance ids) whose lines may be filled: attached now.
    attached: HashSet<u64>,
    fills_in_flight: usize,
    /// No fill starts (a clean stop saves the map).
    frozen: bool,
    tick: u64,
    pub(crate) evictions: u64,
}

impl Lines {
    pub(crate) fn new(slot_count: u32) -> Lines {
        assert!(slot_count > 0, "a cache needs at least one line");
        Lines {
            slot_count,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            free: (0..slot_count).rev().collect(),
            ghosts: VecDeque::new(),
            ghost_set: HashMap::new(),
            ghosts_max: (slot_count as usize / 2).max(16),
            misses: 0,
            writing: HashMap::new(),
            attached: HashSet::new(),
            fills_in_flight: 0,
            frozen: false,
            tick: 0,
            evictions: 0,
        }
    }

    pub(crate) fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// Lines holding data that can be served.
    pub(crate) fn valid_count(&self) -> usize {
        self.lru.len()
    }

    pub(crate) fn valid_count_of(&self, vd_instance: u64) -> usize {
        self.lru.values().filter(|key| key.0 == vd_instance).count()
    }

    pub(crate) fn attach(&mut self, vd_instance: u64) {
        self.attached.insert(vd_instance);
    }

    /// Drops every line of the VD: idle ones now, busy ones once idle (they become `Stale`,
    /// fills poisoned). No fill of it starts from now on.
    pub(crate) fn detach(&mut self, vd_instance: u64) {
        self.attached.remove(&vd_instance);
        let keys: Vec<LineKey> = self.entries.keys().filter(|key| key.0 == vd_instance).copied().collect();
        for key in keys {
            self.make_stale(key);
        }
        self.ghosts.retain(|(key, _)| key.0 != vd_instance);
        self.ghost_set.retain(|key, _| key.0 != vd_instance);
    }

    /// The slots of `keys` if every one is `Valid`, each pinned for a read (see
    /// [`Lines::end_read`]) and counted as used now.
    pub(crate) fn begin_read(&mut self, keys: &[LineKey]) -> Option<Vec<u32>> {
        if !keys.iter().all(|key| self.entries.get(key).is_some_and(|e| e.state == State::Valid)) {
            return None;
        }
        let mut slots = Vec::with_capacity(keys.len());
        for key in keys {
            self.tick += 1;
            let entry = self.entries.get_mut(key).expect("checked above");
            self.lru.remove(&entry.last_use);
            entry.last_use = self.tick;
            self.lru.insert(self.tick, *key);
            entry.readers += 1;
            slots.push(entry.slot);
        }
        Some(slots)
    }

    pub(crate) fn end_read(&mut self, key: LineKey, ok: bool) {
        let entry = self.entries.get_mut(&key).expect("a pinned line stays");
        assert!(entry.readers > 0, "line {key:?}: a read ended that did not begin");
        entry.readers -= 1;
        if !ok {
            self.make_stale(key);
        }
        self.release_if_idle(key);
    }

    /// A miss of `key`: whether to promote it now (its second miss within the ghost window).
    pub(crate) fn note_miss(&mut self, key: LineKey) -> bool {
        if self.entries.contains_key(&key) || !self.attached.contains(&key.0) {
            return false;
        }
        if self.ghost_set.remove(&key).is_some() {
            return true;
        }
        self.misses += 1;
        self.ghosts.push_back((key, self.misses));
        self.ghost_set.insert(key, self.misses);
        while self.ghosts.len() > self.ghosts_max {
            let (oldest, miss) = self.ghosts.pop_front().expect("over the bound");
            if self.ghost_set.get(&oldest) == Some(&miss) {
                self.ghost_set.remove(&oldest);
            }
        }
        false
    }

    /// A slot for promoting `key`, evicting the least recently used idle line if none is free;
    /// `None` if the line cannot be filled now (a write in flight, enough fills in flight, its
    /// VD detached, nothing evictable), in which case it is remembered as missed again.
    pub(crate) fn begin_fill(&mut self, key: LineKey) -> Option<u32> {
        let blocked = self.entries.contains_key(&key)
            || self.writing.contains_key(&key)
            || self.fills_in_flight >= FILLS_IN_FLIGHT_MAX
            || self.frozen
            || !self.attached.contains(&key.0);
        let slot = if blocked { None } else { self.free.pop().or_else(|| self.evict()) };
        let Some(slot) = slot else {
            self.note_miss(key);
            return None;
        };
        self.entries.insert(key, Entry { slot, state: State::Filling { poisoned: false }, readers: 0, writers: 0, last_use: 0 });
        self.fills_in_flight += 1;
        Some(slot)
    }

    /// Ends a fill: the line is served from now on if it was written whole (`ok`) and no write
    /// came meanwhile. Returns whether it was.
    pub(crate) fn end_fill(&mut self, key: LineKey, ok: bool) -> bool {
        self.fills_in_flight -= 1;
        let entry = self.entries.get_mut(&key).expect("a filling line stays until its fill ends");
        let installed = ok && entry.state == (State::Filling { poisoned: false });
        assert!(matches!(entry.state, State::Filling { .. } | State::Stale), "line {key:?} in {:?} at the end of a fill", entry.state);
        if installed {
            self.tick += 1;
            entry.state = State::Valid;
            entry.last_use = self.tick;
            self.lru.insert(self.tick, key);
        } else {
            entry.state = State::Stale;
            self.release_if_idle(key);
        }
        installed
    }

    /// A write touching `key` is about to go to the VD; what it does with the line.
    pub(crate) fn begin_write(&mut self, key: LineKey) -> WriteAction {
        *self.writing.entry(key).or_insert(0) += 1;
        let Some(entry) = self.entries.get_mut(&key) else { return WriteAction::Skip };
        match entry.state {
            State::Valid if entry.writers == 0 => {
                entry.writers = 1;
                WriteAction::Update(entry.slot)
            }
            State::Valid | State::Stale => {
                self.make_stale(key);
                WriteAction::Skip
            }
            State::Filling { .. } => {
                entry.state = State::Filling { poisoned: true };
                WriteAction::Skip
            }
        }
    }

    /// The write of [`Lines::begin_write`] ended; `ok`: the VD and (for an update) the cache VD
    /// both took it.
    pub(crate) fn end_write(&mut self, key: LineKey, action: WriteAction, ok: bool) {
        let writing = self.writing.get_mut(&key).expect("a write ended that did not begin");
        *writing -= 1;
        if *writing == 0 {
            self.writing.remove(&key);
        }
        if let WriteAction::Update(_) = action {
            let entry = self.entries.get_mut(&key).expect("an updated line stays until its writer ends");
            entry.writers -= 1;
            if !ok {
                self.make_stale(key);
            }
            self.release_if_idle(key);
        } else if !ok {
            // The VD's data is uncertain: a line filled before this write is no better.
            self.make_stale(key);
        }
    }

    fn make_stale(&mut self, key: LineKey) {
        let Some(entry) = self.entries.get_mut(&key) else { return };
        match entry.state {
            State::Valid => {
                self.lru.remove(&entry.last_use);
                entry.state = State::Stale;
                self.release_if_idle(key);
            }
            State::Filling { .. } => entry.state = State::Filling { poisoned: true },
            State::Stale => {}
        }
    }

    fn release_if_idle(&mut self, key: LineKey) {
        let Some(entry) = self.entries.get(&key) else { return };
        if entry.state == State::Stale && entry.readers == 0 && entry.writers == 0 {
            self.free.push(entry.slot);
            self.entries.remove(&key);
        }
    }

    /// Frees the least recently used line nothing reads or writes.
    fn evict(&mut self) -> Option<u32> {
        let victim = self.lru.iter().take(EVICTION_SCAN_MAX).map(|(_, key)| *key).find(|key| {
            let entry = &self.entries[key];
            entry.readers == 0 && entry.writers == 0
        })?;
        let entry = self.entries.remove(&victim).expect("an lru key has an entry");
        self.lru.remove(&entry.last_use);
        self.evictions += 1;
        Some(entry.slot)
    }

    /// Stops new fills, for a snapshot of the map.
    pub(crate) fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Nothing reads, writes or fills any line: the map stays as it is until I/O comes.
    pub(crate) fn is_idle(&self) -> bool {
        self.fills_in_flight == 0 && self.writing.is_empty() && self.entries.values().all(|e| e.readers == 0 && e.writers == 0)
    }

    /// The valid lines, oldest use first, with their slots.
    pub(crate) fn valid_lines(&self) -> Vec<(LineKey, u32)> {
        self.lru.values().map(|key| (*key, self.entries[key].slot)).collect()
    }

    /// Makes each line valid in its slot (a map read back at start), skipping any whose slot
    /// is not free or whose line is known already; returns how many were installed.
    pub(crate) fn install(&mut self, lines: &[(LineKey, u32)]) -> usize {
        let mut free = vec![false; self.slot_count as usize];
        self.free.iter().for_each(|&slot| free[slot as usize] = true);
        let mut installed = 0;
        for &(key, slot) in lines {
            if !free.get(slot as usize).copied().unwrap_or(false) || self.entries.contains_key(&key) {
                continue;
            }
            free[slot as usize] = false;
            self.tick += 1;
            self.entries.insert(key, Entry { slot, state: State::Valid, readers: 0, writers: 0, last_use: self.tick });
            self.lru.insert(self.tick, key);
            installed += 1;
        }
        // Popped from the end: the lowest free slots first, as at the start.
        self.free = (0..self.slot_count).rev().filter(|&slot| free[slot as usize]).collect();
        installed
    }

    /// Checks the invariants that the rules above keep (tests and debug builds).
    pub(crate) fn check(&self) {
        let mut slots: Vec<u32> = self.free.clone();
        slots.extend(self.entries.values().map(|e| e.slot));
        slots.sort_unstable();
        assert_eq!(slots, (0..self.slot_count).collect::<Vec<_>>(), "every slot is free or held by exactly one line");
        for (key, entry) in &self.entries {
            assert_eq!(entry.state == State::Valid, self.lru.get(&entry.last_use) == Some(key), "{key:?}: in the LRU iff valid");
            assert!(entry.writers <= 1, "{key:?}: one updating writer at most");
            if entry.writers > 0 {
                assert!(self.writing.contains_key(key), "{key:?}: an updating writer is counted as writing");
            }
        }
        assert_eq!(self.lru.len(), self.entries.values().filter(|e| e.state == State::Valid).count());
        assert!(self.ghosts.len() <= self.ghosts_max && self.ghost_set.len() <= self.ghosts.len());
        let entries: HashSet<(LineKey, u64)> = self.ghosts.iter().copied().collect();
        assert!(self.ghost_set.iter().all(|(key, miss)| entries.contains(&(*key, *miss))), "every remembered line has its entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VD: u64 = 7;

    fn lines(slots: u32) -> Lines {
        let mut lines = Lines::new(slots);
        lines.attach(VD);
        lines
    }

    /// Promotes line `n` of the VD: two misses, a fill that succeeds.
    fn promote(lines: &mut Lines, n: u64) {
        assert!(!lines.note_miss((VD, n)));
        assert!(lines.note_miss((VD, n)));
        lines.begin_fill((VD, n)).expect("a slot");
        assert!(lines.end_fill((VD, n), true));
        lines.check();
    }

    #[test]
    fn a_line_is_promoted_on_its_second_miss_and_then_served() {
        let mut lines = lines(4);
        assert!(lines.begin_read(&[(VD, 1)]).is_none());
        promote(&mut lines, 1);
        let slots = lines.begin_read(&[(VD, 1)]).expect("a hit");
        lines.end_read((VD, 1), true);
        assert_eq!(slots.len(), 1);
        assert_eq!(lines.valid_count(), 1);
    }

    #[test]
    fn a_scan_of_lines_read_once_evicts_nothing() {
        let mut lines = lines(4);
        for n in 0..4 {
            promote(&mut lines, n);
        }
        for n in 100..10_000 {
            assert!(!lines.note_miss((VD, n)), "a line read once is never promoted");
        }
        assert_eq!(lines.valid_count(), 4);
        assert!(lines.ghosts.len() <= lines.ghosts_max);
        lines.check();
    }

    #[test]
    fn a_line_missed_again_outlives_its_old_ghost_entry() {
        let mut lines = lines(4);
        assert_eq!(lines.ghosts_max, 16);
        assert!(!lines.note_miss((VD, 1)) && lines.note_miss((VD, 1)), "promoted: its entry stays behind");
        assert!(!lines.note_miss((VD, 1)), "not filled, missed again: remembered anew");
        for n in 100..115 {
            lines.note_miss((VD, n));
        }
        // The old entry of line 1 has just left the queue; its new one has not.
        assert!(lines.ghosts.iter().all(|(key, miss)| *key != (VD, 1) || *miss != 1));
        lines.check();
        assert!(lines.note_miss((VD, 1)), "still remembered: its second miss promotes it");
    }

    #[test]
    fn the_least_recently_used_idle_line_is_evicted() {
        let mut lines = lines(3);
        for n in 0..3 {
            promote(&mut lines, n);
        }
        // Line 0 is used again, line 1 is being read: line 2 is the one to go.
        lines.begin_read(&[(VD, 0)]).unwrap();
        lines.end_read((VD, 0), true);
        lines.begin_read(&[(VD, 1)]).unwrap();
        promote(&mut lines, 9);
        assert!(lines.begin_read(&[(VD, 2)]).is_none(), "line 2 was evicted");
        assert!(lines.begin_read(&[(VD, 0)]).is_some());
        assert_eq!(lines.evictions, 1);
        lines.check();
    }

    #[test]
    fn a_write_during_a_fill_poisons_it_and_a_write_in_flight_blocks_one() {
        let mut lines = lines(4);
        lines.note_miss((VD, 1));
        lines.note_miss((VD, 1));
        lines.begin_fill((VD, 1)).unwrap();
        assert_eq!(lines.begin_write((VD, 1)), WriteAction::Skip);
        lines.end_write((VD, 1), WriteAction::Skip, true);
        assert!(!lines.end_fill((VD, 1), true), "the fill read the VD before the write");
        assert!(lines.begin_read(&[(VD, 1)]).is_none());
        lines.check();
        // A write in flight: no fill starts (it could read the VD before the write lands).
        assert_eq!(lines.begin_write((VD, 2)), WriteAction::Skip);
        lines.note_miss((VD, 2));
        assert!(lines.note_miss((VD, 2)));
        assert!(lines.begin_fill((VD, 2)).is_none());
        lines.end_write((VD, 2), WriteAction::Skip, true);
        assert!(lines.note_miss((VD, 2)), "remembered as missed: the next miss promotes it");
        assert!(lines.begin_fill((VD, 2)).is_some());
        lines.check();
    }

    #[test]
    fn one_writer_updates_a_line_and_a_second_makes_it_stale() {
        let mut lines = lines(4);
        promote(&mut lines, 1);
        let first = lines.begin_write((VD, 1));
        assert!(matches!(first, WriteAction::Update(_)));
        assert_eq!(lines.begin_write((VD, 1)), WriteAction::Skip);
        assert!(lines.begin_read(&[(VD, 1)]).is_none(), "stale while two writes are in flight");
        lines.end_write((VD, 1), WriteAction::Skip, true);
        lines.end_write((VD, 1), first, true);
        assert!(lines.entries.is_empty(), "the stale line left once idle");
        assert_eq!(lines.free.len(), 4);
        lines.check();
    }

    #[test]
    fn a_saved_map_installs_into_free_slots_once() {
        let mut lines = lines(4);
        promote(&mut lines, 1);
        let saved = lines.valid_lines();
        let mut fresh = self::lines(4);
        let taken = ((VD, 9), saved[0].1);
        assert_eq!(fresh.install(&[saved[0], ((VD, 2), 3), taken, ((VD, 5), 7)]), 2, "a slot taken twice or out of range is skipped");
        assert!(fresh.begin_read(&[(VD, 1)]).is_some() && fresh.begin_read(&[(VD, 2)]).is_some());
        assert_eq!(fresh.free.len(), 2);
        fresh.check();
        fresh.freeze();
        assert!(fresh.note_miss((VD, 3)) || fresh.note_miss((VD, 3)));
        assert_eq!(fresh.begin_fill((VD, 3)), None, "frozen: no fill starts");
    }

    #[test]
    fn failures_and_detaching_drop_lines_only_once_idle() {
        let mut lines = lines(4);
        promote(&mut lines, 1);
        promote(&mut lines, 2);
        lines.begin_read(&[(VD, 1)]).unwrap();
        lines.end_read((VD, 1), false);
        assert!(lines.begin_read(&[(VD, 1)]).is_none(), "a failed cache read drops the line");
        let update = lines.begin_write((VD, 2));
        lines.end_write((VD, 2), update, false);
        assert_eq!(lines.valid_count(), 0, "a failed update drops the line");
        promote(&mut lines, 3);
        lines.begin_read(&[(VD, 3)]).unwrap();
        lines.detach(VD);
        assert_eq!(lines.valid_count(), 0);
        assert!(!lines.note_miss((VD, 4)) && !lines.note_miss((VD, 4)), "a detached VD's lines are not promoted");
        lines.end_read((VD, 3), true);
        assert_eq!(lines.free.len(), 4);
        lines.check();
    }
}
