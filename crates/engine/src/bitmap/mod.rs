//! The write-intent bitmap (md's): which regions of a VD may have members that disagree.
//!
//! # The rule
//! A region's bit is set, written and flushed on the members before the first write to the
//! region is issued, and cleared only when the region has been idle for a while and the members
//! have been flushed (while a member is out, it is noted as written while degraded first). So at
//! any instant, every region whose members may disagree (a write in flight at a power cut, a
//! member out of service that missed writes) is known: set on every member in service, or noted.
//! That buys two things:
//!
//! - **Unclean stop.** After a crash the dirty regions are resynced (parity recomputed, mirrors
//!   made equal) instead of the whole VD; until a region is resynced, a read that would have to
//!   reconstruct from its parity fails instead of returning what stale parity gives.
//! - **Re-add.** A member that was out of service and comes back missed writes only in regions
//!   that are dirty (bits are never cleared while a member is out), so only those are rebuilt.
//!
//! # Who writes what
//! Each shard owns one slot of the on-disk area ([`ondisk`]) and alone sets and clears its bits
//! ([`shard`]): shards never wait for each other. Slot 0 belongs to the control plane: at
//! assembly it receives the union of everything found on the members, and it is cleared once
//! that is resynced and the VD is whole again. Clearing is lazy: a periodic pass on every shard
//! ([`crate::Engine::clean_write_intent`]) clears regions not written since the previous pass.
//!
//! Each slot has a second half of *unlogged* bits ([`ondisk`]): why a region is dirty. After an
//! unclean stop only unlogged regions are resynced: a region dirty only through parity row
//! writes whose row images the journal holds is whole once they are replayed (and is resynced
//! if they are lost: [`WriteIntent::images_lost`]); slot 0's dirty-only regions (written while
//! a member was out, kept across a clean stop for its re-add) agree within themselves.
//!
//! Levels without redundancy (RAID0, JBOD) have nothing that can disagree and no bitmap.

pub mod control;
pub mod ondisk;
pub(crate) mod shard;

use layout::Geometry;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Member bytes a region covers at least (md's default bitmap chunk). A member too large for
/// [`ondisk::REGIONS_MAX`] regions gets larger ones.
pub const REGION_BYTES_MIN: u64 = 64 << 20;

/// A plain bit set of regions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bits {
    words: Vec<u64>,
}

impl Bits {
    pub fn new(len: u64) -> Bits {
        Bits { words: vec![0; len.div_ceil(64) as usize] }
    }

    pub fn get(&self, index: u64) -> bool {
        self.words.get((index / 64) as usize).is_some_and(|w| w & (1 << (index % 64)) != 0)
    }

    pub fn set(&mut self, index: u64) {
        self.words[(index / 64) as usize] |= 1 << (index % 64);
    }

    pub fn clear(&mut self, index: u64) {
        self.words[(index / 64) as usize] &= !(1 << (index % 64));
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    pub fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| i as u64 * 64 + b))
    }

    pub fn union_with(&mut self, other: &Bits) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        self.words.iter_mut().zip(&other.words).for_each(|(a, b)| *a |= b);
    }

    pub fn intersect_with(&mut self, other: &Bits) {
        self.words.iter_mut().enumerate().for_each(|(i, a)| *a &= other.words.get(i).copied().unwrap_or(0));
    }

    /// The bits as the on-disk slot holds them (bit `i` is bit `i % 8` of byte `i / 8`), padded
    /// with zeros to `len_bytes`.
    pub fn to_bytes(&self, len_bytes: usize) -> Vec<u8> {
        let mut bytes: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.resize(len_bytes, 0);
        bytes
    }

    /// Bits read from a slot, keeping only the first `len` (stray bits past the end are noise).
    pub fn from_bytes(bytes: &[u8], len: u64) -> Bits {
        let mut bits = Bits::new(len);
        for (i, chunk) in bytes.chunks(8).enumerate().take(bits.words.len()) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            bits.words[i] = u64::from_le_bytes(word);
        }
        if !len.is_multiple_of(64) {
            if let Some(last) = bits.words.last_mut() {
                *last &= (1 << (len % 64)) - 1;
            }
        }
        bits
    }
}

/// How a VD's rows are grouped into regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionMap {
    pub rows_per_region: u64,
    pub region_count: u64,
    pub row_count: u64,
}

impl RegionMap {
    /// Regions of at least [`REGION_BYTES_MIN`] member bytes, doubled until they fit a slot.
    pub fn for_geometry(geometry: &Geometry) -> RegionMap {
        let row_count = geometry.row_count();
        let mut rows_per_region = (REGION_BYTES_MIN / geometry.strip_size_bytes()).max(1);
        while row_count.div_ceil(rows_per_region) > ondisk::REGIONS_MAX {
            rows_per_region *= 2;
        }
        RegionMap { rows_per_region, region_count: row_count.div_ceil(rows_per_region).max(1), row_count }
    }

    /// Regions of `rows_per_region` rows (md's `--bitmap-chunk`): smaller ones resync less
    /// after a crash and cost a bitmap write more often. The simulator uses tiny ones.
    pub fn with_rows_per_region(geometry: &Geometry, rows_per_region: u64) -> RegionMap {
        assert!(rows_per_region > 0, "a region holds at least one row");
        let row_count = geometry.row_count();
        let region_count = row_count.div_ceil(rows_per_region).max(1);
        assert!(region_count <= ondisk::REGIONS_MAX, "{region_count} regions do not fit a slot");
        RegionMap { rows_per_region, region_count, row_count }
    }

    pub fn region_of(&self, row: u64) -> u64 {
        debug_assert!(row < self.row_count.max(1), "row {row} of {}", self.row_count);
        row / self.rows_per_region
    }

    pub fn rows_of(&self, region: u64) -> Range<u64> {
        let start = region * self.rows_per_region;
        start..(start + self.rows_per_region).min(self.row_count)
    }
}

/// The bitmap of one VD in memory: each shard's slot, slot 0, and what awaits resync.
pub struct WriteIntent {
    pub regions: RegionMap,
    /// This run's epoch in the on-disk header.
    pub epoch: u64,
    /// Indexed by shard; each locked only by its shard, except to read the union.
    shards: Vec<Mutex<shard::ShardSlot>>,
    /// Slot 0: regions dirty when the VD was assembled, not yet known to agree.
    inherited: Mutex<Bits>,
    /// Regions written while a member was out of service (or while one was failing), in memory:
    /// what a re-add must resync besides `inherited`. Written to slot 0 at a clean stop; after
    /// an unclean one it is lost, and a member that was out then is rebuilt whole.
    written_degraded: Mutex<Bits>,
    /// Whether the VD was stopped cleanly before this run, so that `inherited` holds every
    /// region a member that was already out may have missed.
    opened_clean: bool,
    out_at_open: Mutex<Vec<usize>>,
    /// Regions whose redundancy may be stale after an unclean stop, not yet resynced.
    unsynced: Vec<AtomicU64>,
    unsynced_count: AtomicU64,
    /// Regions a shard had dirty at an unclean stop but not unlogged: their rows are whole
    /// only once the journal's images are replayed (see [`WriteIntent::images_lost`]).
    logged_at_open: Mutex<Bits>,
}

impl WriteIntent {
    /// `inherited` regions are dirty from before; `unsynced` (a subset) need a resync;
    /// `opened_clean` says the last stop was clean.
    pub fn new(regions: RegionMap, epoch: u64, inherited: Bits, unsynced: &Bits, opened_clean: bool) -> WriteIntent {
        let unsynced_words: Vec<AtomicU64> = (0..regions.region_count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        let intent = WriteIntent {
            regions,
            epoch,
            shards: (0..ondisk::SHARD_SLOTS_MAX).map(|_| Mutex::new(shard::ShardSlot::default())).collect(),
            inherited: Mutex::new(inherited),
            written_degraded: Mutex::new(Bits::new(regions.region_count)),
            opened_clean,
            out_at_open: Mutex::new(Vec::new()),
            unsynced: unsynced_words,
            unsynced_count: AtomicU64::new(0),
            logged_at_open: Mutex::new(Bits::new(regions.region_count)),
        };
        unsynced.ones().filter(|&r| r < regions.region_count).for_each(|region| intent.mark_unsynced(region));
        intent
    }

    /// `region`'s members may disagree: reads through its parity fail until a resync.
    pub fn mark_unsynced(&self, region: u64) {
        let bit = 1 << (region % 64);
        if self.unsynced[(region / 64) as usize].fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.unsynced_count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether `row`'s region awaits its resync (its parity or copies may be stale).
    pub fn row_unsynced(&self, row: u64) -> bool {
        self.unsynced_count.load(Ordering::Acquire) != 0 && self.region_unsynced(self.regions.region_of(row))
    }

    pub fn region_unsynced(&self, region: u64) -> bool {
        self.unsynced[(region / 64) as usize].load(Ordering::Acquire) & (1 << (region % 64)) != 0
    }

    /// The resync of `region` is done: its members agree.
    pub fn region_synced(&self, region: u64) {
        let bit = 1 << (region % 64);
        if self.unsynced[(region / 64) as usize].fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            self.unsynced_count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The regions dirty at an unclean stop through logged writes only (set by `control::open`).
    pub fn set_logged_at_open(&self, regions: Bits) {
        *self.logged_at_open.lock().expect("bitmap lock") = regions;
    }

    /// The journal that held the images of the logged writes was not replayed (it is lost, or
    /// this VD could not take them): their regions need a resync like any other. Returns how
    /// many regions that adds.
    pub fn images_lost(&self) -> u64 {
        let logged = std::mem::replace(&mut *self.logged_at_open.lock().expect("bitmap lock"), Bits::new(self.regions.region_count));
        let added = logged.ones().filter(|&region| !self.region_unsynced(region)).count() as u64;
        logged.ones().for_each(|region| self.mark_unsynced(region));
        added
    }

    /// The images were replayed: the logged regions are whole.
    pub fn images_replayed(&self) {
        *self.logged_at_open.lock().expect("bitmap lock") = Bits::new(self.regions.region_count);
    }

    pub fn unsynced_count(&self) -> u64 {
        self.unsynced_count.load(Ordering::Acquire)
    }

    pub fn unsynced_regions(&self) -> Bits {
        let mut bits = Bits::new(self.regions.region_count);
        (0..self.regions.region_count).filter(|&r| self.region_unsynced(r)).for_each(|r| bits.set(r));
        bits
    }

    /// Every region that may be dirty now: slot 0, those written while degraded, and every
    /// shard's (set or being set): what a member that left service during this run missed.
    pub fn dirty_regions(&self) -> Bits {
        let mut bits = self.inherited.lock().expect("bitmap lock").clone();
        bits.union_with(&self.written_degraded.lock().expect("bitmap lock"));
        for slot in &self.shards {
            bits.union_with(slot.lock().expect("bitmap lock").wanted());
        }
        bits
    }

    pub fn inherited(&self) -> Bits {
        self.inherited.lock().expect("bitmap lock").clone()
    }

    /// Slot 0 was cleared on the members (by the control plane), the VD being whole: nothing
    /// that a re-add would need is left.
    pub fn clear_inherited(&self) {
        *self.inherited.lock().expect("bitmap lock") = Bits::new(self.regions.region_count);
        *self.written_degraded.lock().expect("bitmap lock") = Bits::new(self.regions.region_count);
    }

    /// Adds `regions` to slot 0's image (written by the caller).
    pub fn add_inherited(&self, regions: &Bits) {
        self.inherited.lock().expect("bitmap lock").union_with(regions);
    }

    /// Drops from slot 0's image the regions resynced since it was written, and returns what it
    /// keeps: the regions still unsynced and those written while a member was out (a re-add
    /// needs those). Only while every member is in service (nothing else needs slot 0 then).
    pub fn keep_inherited_unsynced(&self) -> Bits {
        let mut inherited = self.inherited.lock().expect("bitmap lock");
        let mut kept = self.unsynced_regions();
        kept.intersect_with(&inherited);
        *inherited = kept.clone();
        drop(inherited);
        kept.union_with(&self.written_degraded.lock().expect("bitmap lock"));
        kept
    }

    /// `regions` may have been written while a member was out: a clean pass clears their bits
    /// from a shard's slot only after noting them here.
    pub fn note_written_degraded(&self, regions: &[u64]) {
        let mut bits = self.written_degraded.lock().expect("bitmap lock");
        regions.iter().for_each(|&region| bits.set(region));
    }

    /// Whether the bitmap knows every region member `member` missed while out of service: not
    /// if it was out already when the VD opened after an unclean stop (what was noted in memory
    /// before the crash is gone).
    pub fn knows_missed_regions_of(&self, member: usize) -> bool {
        self.opened_clean || !self.out_at_open.lock().expect("bitmap lock").contains(&member)
    }

    /// The members out of service when the VD opened (set once, by the controller).
    pub fn set_out_at_open(&self, members: Vec<usize>) {
        *self.out_at_open.lock().expect("bitmap lock") = members;
    }

    pub(crate) fn shard_slot(&self, shard: usize) -> &Mutex<shard::ShardSlot> {
        assert!(shard < self.shards.len(), "shard {shard}: a bitmap has {} shard slots", self.shards.len());
        &self.shards[shard]
    }
}

#[cfg(test)]
mod tests;
