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
//!
//! # Write-back: dirty lines ([`dirty`])
//! - A write touching a `Valid` line writes it on the cache VD only and makes it *dirty*
//!   (newer there than on its VD); any number of writes may do so at once, as on any drive:
//!   there is one copy. A write touching a line the cache does not hold goes to the VD
//!   (write-around) under the rules above. A dirty line is never `Stale`, evicted, or dropped
//!   on a failure: only destaged (written to its VD, which is flushed) or discarded on purpose.
//! - The table on the cache VD ([`super::map`]) must say a line is dirty before the first
//!   write that dirtied it is acknowledged, and a slot leaves a line only once the table no
//!   longer says it is dirty there (`durable_dirty`). Table blocks are written whole from the
//!   state here, one write per block at a time, each with a generation: a write waits for the
//!   generation that includes its line.
//! - A destage starts on a dirty line no write is in flight for and pins it; it ends clean only
//!   if no write came meanwhile (`epoch`).

mod dirty;

pub(crate) use dirty::{Destage, TableStart};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

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
    /// Newer on the cache VD than on the VD (write-back).
    dirty: bool,
    /// Write-back writes that began on the line: a destage that saw another number ends with
    /// the line still dirty.
    epoch: u64,
    destaging: bool,
}

impl Entry {
    fn new(slot: u32, state: State) -> Entry {
        Entry { slot, state, readers: 0, writers: 0, last_use: 0, dirty: false, epoch: 0, destaging: false }
    }
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
    /// Writes to held lines stay on the cache VD (write-back).
    write_back: bool,
    /// The number of each attached VD (instance id to VD id), which the table names.
    vd_ids: HashMap<u64, u32>,
    /// The line each slot holds.
    slot_keys: Vec<Option<LineKey>>,
    /// Dirty lines in LBA order (destaged from a cursor).
    dirty: BTreeSet<LineKey>,
    destage_cursor: LineKey,
    table: dirty::Table,
}

impl Lines {
    pub(crate) fn new(slot_count: u32, write_back: bool) -> Lines {
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
            write_back,
            vd_ids: HashMap::new(),
            slot_keys: vec![None; slot_count as usize],
            dirty: BTreeSet::new(),
            destage_cursor: (0, 0),
            table: dirty::Table::new(slot_count),
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

    pub(crate) fn attach(&mut self, vd_instance: u64, vd_id: u32) {
        self.attached.insert(vd_instance);
        self.vd_ids.insert(vd_instance, vd_id);
    }

    /// Drops every line of the VD: idle ones now, busy ones once idle (they become `Stale`,
    /// fills poisoned), dirty ones too (discarded: destage them first to keep them). No fill
    /// of it starts from now on.
    pub(crate) fn detach(&mut self, vd_instance: u64) {
        self.attached.remove(&vd_instance);
        let keys: Vec<LineKey> = self.entries.keys().filter(|key| key.0 == vd_instance).copied().collect();
        for key in keys {
            self.discard(key);
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
        if !ok && !entry.dirty {
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
        self.entries.insert(key, Entry::new(slot, State::Filling { poisoned: false }));
        self.slot_keys[slot as usize] = Some(key);
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
            // A dirty line is newer than its VD whatever order updates land in: it is
            // destaged after them (its epoch moved).
            State::Valid if entry.writers == 0 || entry.dirty => {
                entry.writers += 1;
                entry.epoch += 1;
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
            // A dirty line's failed range is uncertain, as after any failed write; the rest is
            // the only copy of its data.
            if !ok && !entry.dirty {
                self.make_stale(key);
            }
            self.release_if_idle(key);
        } else if !ok {
            // The VD's data is uncertain: a line filled before this write is no better.
            self.make_stale(key);
        }
    }

    /// A repair of the VD under `key` begins: a consistency check's or a resync's rewrite, or
    /// a rebuild of rows whose copies differed. It changes what the VD reads in a way no write
    /// names, so it counts as a write that skips the cache: a clean line leaves once idle and a
    /// fill under way is poisoned. A dirty line stays: it is newer than anything the repair
    /// writes, and its destage will lay it over them.
    pub(crate) fn begin_repair(&mut self, key: LineKey) {
        *self.writing.entry(key).or_insert(0) += 1;
        if self.entries.get(&key).is_some_and(|entry| !entry.dirty) {
            self.make_stale(key);
        }
    }

    /// The repair of [`Lines::begin_repair`] ended.
    pub(crate) fn end_repair(&mut self, key: LineKey) {
        self.end_write(key, WriteAction::Skip, true);
    }

    fn make_stale(&mut self, key: LineKey) {
        let Some(entry) = self.entries.get_mut(&key) else { return };
        assert!(!entry.dirty, "line {key:?}: a dirty line is destaged or discarded, never dropped");
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
            let slot = entry.slot;
            self.entries.remove(&key);
            self.free_slot(slot);
        }
    }

    /// Frees the least recently used line nothing reads or writes.
    fn evict(&mut self) -> Option<u32> {
        let victim = self.lru.iter().take(EVICTION_SCAN_MAX).map(|(_, key)| *key).find(|key| {
            let entry = &self.entries[key];
            // A line destaged but not yet clean in the table stays: a crash would find the
            // table naming it dirty in a slot holding another line.
            entry.readers == 0 && entry.writers == 0 && !entry.dirty && !self.table.may_say_dirty(entry.slot)
        })?;
        let entry = self.entries.remove(&victim).expect("an lru key has an entry");
        self.slot_keys[entry.slot as usize] = None;
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

    /// Makes each line valid in its slot, dirty or not (a table read back at start), skipping
    /// any whose slot is not free or whose line is known already; returns how many were
    /// installed. The table is then written whole ([`Lines::request_all_blocks`]).
    pub(crate) fn install(&mut self, lines: &[(LineKey, u32, bool)]) -> usize {
        let mut free = vec![false; self.slot_count as usize];
        self.free.iter().for_each(|&slot| free[slot as usize] = true);
        let mut installed = 0;
        for &(key, slot, dirty) in lines {
            if !free.get(slot as usize).copied().unwrap_or(false) || self.entries.contains_key(&key) || (dirty && !self.write_back) {
                continue;
            }
            free[slot as usize] = false;
            self.tick += 1;
            let entry = Entry { last_use: self.tick, dirty, ..Entry::new(slot, State::Valid) };
            self.entries.insert(key, entry);
            self.slot_keys[slot as usize] = Some(key);
            if dirty {
                self.dirty.insert(key);
            }
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
        slots.extend(self.table.clean_pending());
        slots.extend(self.entries.values().map(|e| e.slot));
        slots.sort_unstable();
        assert_eq!(slots, (0..self.slot_count).collect::<Vec<_>>(), "every slot is free, being cleaned, or held by one line");
        assert!(self.free.iter().all(|&slot| !self.table.may_say_dirty(slot)), "no free slot is (or is being written) dirty in the table");
        for (key, entry) in &self.entries {
            assert_eq!(entry.state == State::Valid, self.lru.get(&entry.last_use) == Some(key), "{key:?}: in the LRU iff valid");
            assert_eq!(self.slot_keys[entry.slot as usize], Some(*key), "{key:?}: its slot names it");
            assert!(entry.writers <= 1 || self.write_back || entry.dirty, "{key:?}: one updating writer at most (write-through)");
            if entry.writers > 0 {
                assert!(self.writing.contains_key(key), "{key:?}: an updating writer is counted as writing");
            }
            assert_eq!(entry.dirty, self.dirty.contains(key), "{key:?}: in the dirty set iff dirty");
            assert!(
                !entry.dirty || (entry.state == State::Valid && self.write_back),
                "{key:?}: only a valid line of a write-back cache is dirty"
            );
            assert!(!entry.destaging || entry.readers > 0, "{key:?}: a destage pins its line");
        }
        assert_eq!(self.slot_keys.iter().flatten().count(), self.entries.len(), "a slot names only a line it holds");
        assert_eq!(self.lru.len(), self.entries.values().filter(|e| e.state == State::Valid).count());
        assert!(self.ghosts.len() <= self.ghosts_max && self.ghost_set.len() <= self.ghosts.len());
        let entries: HashSet<(LineKey, u64)> = self.ghosts.iter().copied().collect();
        assert!(self.ghost_set.iter().all(|(key, miss)| entries.contains(&(*key, *miss))), "every remembered line has its entry");
    }
}

#[cfg(test)]
mod tests;
