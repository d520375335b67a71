//! One shard's slot of the bitmap in memory: what is on the members, what should be, which
//! regions have writes in flight and which were written since the last clean pass. Only its
//! shard changes it (the I/O that goes with it is in `crate::io::intent`); the mutex is there
//! so that the control plane can read the union.

use super::Bits;
use crate::metadata::BLOCK_BYTES;
use std::collections::HashMap;
use std::task::Waker;

#[derive(Default)]
pub(crate) struct ShardSlot {
    /// The slot as the members in service hold it (written and flushed).
    on_disk: Bits,
    /// What the slot should say: set before a write may go, cleared by a clean pass.
    wanted: Bits,
    /// The unlogged half on the members, and what it should say: set before a write goes that
    /// no journal record can mend if it tears a row (see `ondisk`).
    unlogged_on_disk: Bits,
    unlogged_wanted: Bits,
    /// Regions written since the last clean pass: not idle long enough to clear.
    touched: Bits,
    /// Writes in progress per region; a region with any is never cleared.
    in_flight: HashMap<u64, u32>,
    /// The image on its way to the members, if any: one write at a time, so that an older image
    /// never lands after a newer one.
    writing: Option<SlotImage>,
    /// Tasks waiting for that write.
    waiters: Vec<Waker>,
    region_count: u64,
}

/// Both halves of a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlotImage {
    pub dirty: Bits,
    pub unlogged: Bits,
}

/// A slot write to make: the image to write and the blocks of it (numbered across both halves,
/// as [`super::ondisk::slot_image`] lays them out) that differ from the members.
pub(crate) struct SlotWrite {
    pub image: SlotImage,
    pub blocks: Vec<usize>,
}

impl ShardSlot {
    fn init(&mut self, region_count: u64) {
        if self.region_count == 0 {
            self.region_count = region_count;
            self.on_disk = Bits::new(region_count);
            self.wanted = Bits::new(region_count);
            self.unlogged_on_disk = Bits::new(region_count);
            self.unlogged_wanted = Bits::new(region_count);
            self.touched = Bits::new(region_count);
        }
        assert_eq!(self.region_count, region_count, "a VD's region count never changes");
    }

    /// A write to `region` begins, `unlogged` if nothing but a resync can mend a row it tears.
    /// Returns whether its bits are already on the members.
    pub fn enter(&mut self, region: u64, region_count: u64, unlogged: bool) -> bool {
        self.init(region_count);
        *self.in_flight.entry(region).or_default() += 1;
        self.touched.set(region);
        self.wanted.set(region);
        if unlogged {
            self.unlogged_wanted.set(region);
        }
        self.is_durable(region) && (!unlogged || self.is_unlogged_durable(region))
    }

    /// A write already in `region` (entered) turns out unlogged: its journal record could not
    /// be written. Returns whether the unlogged bit is already on the members.
    pub fn mark_unlogged(&mut self, region: u64) -> bool {
        assert!(self.in_flight.contains_key(&region), "region {region}: marked unlogged outside a write");
        self.unlogged_wanted.set(region);
        self.is_unlogged_durable(region)
    }

    pub fn leave(&mut self, region: u64) {
        let count = self.in_flight.get_mut(&region).expect("leave follows enter");
        *count -= 1;
        if *count == 0 {
            self.in_flight.remove(&region);
        }
    }

    /// Whether a write to `region` may go: its bit is on the members, and no write on its way
    /// clears it.
    pub fn is_durable(&self, region: u64) -> bool {
        self.on_disk.get(region) && self.writing.as_ref().is_none_or(|image| image.dirty.get(region))
    }

    /// The same for the unlogged bit.
    pub fn is_unlogged_durable(&self, region: u64) -> bool {
        self.unlogged_on_disk.get(region) && self.writing.as_ref().is_none_or(|image| image.unlogged.get(region))
    }

    pub fn wanted(&self) -> &Bits {
        &self.wanted
    }

    pub fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    pub fn wait(&mut self, waker: &Waker) {
        self.waiters.push(waker.clone());
    }

    /// Becomes the slot's writer, or `None` while another write is on its way.
    pub fn start_write(&mut self) -> Option<SlotWrite> {
        if self.writing.is_some() {
            return None;
        }
        let image = SlotImage { dirty: self.wanted.clone(), unlogged: self.unlogged_wanted.clone() };
        self.writing = Some(image.clone());
        let mut blocks = differing_blocks(&self.on_disk, &image.dirty, self.region_count);
        let unlogged = differing_blocks(&self.unlogged_on_disk, &image.unlogged, self.region_count);
        blocks.extend(unlogged.into_iter().map(|block| super::ondisk::HALF_BLOCKS + block));
        Some(SlotWrite { image, blocks })
    }

    /// The write of `image` ended. On success the members hold `image` in every block (the
    /// blocks not written already did, and nobody else writes the slot meanwhile).
    /// On failure the members hold some mix of the two images: only bits set in both are
    /// trusted.
    pub fn finish_write(&mut self, image: SlotImage, written: bool) -> Vec<Waker> {
        let writing = self.writing.take().expect("finish_write follows start_write");
        debug_assert!(writing == image);
        if written {
            self.on_disk = image.dirty;
            self.unlogged_on_disk = image.unlogged;
        } else {
            self.on_disk.intersect_with(&image.dirty);
            self.unlogged_on_disk.intersect_with(&image.unlogged);
        }
        std::mem::take(&mut self.waiters)
    }

    /// Regions a clean pass may clear: on the members, no write in flight and (unless the VD is
    /// stopping) none since the previous pass. Starts the next period.
    pub fn clean_candidates(&mut self, stopping: bool) -> Vec<u64> {
        if self.region_count == 0 {
            return Vec::new();
        }
        let idle = |region: &u64| !self.in_flight.contains_key(region) && (stopping || !self.touched.get(*region));
        let candidates = self.on_disk.ones().filter(|r| self.wanted.get(*r)).filter(idle).collect();
        self.touched = Bits::new(self.region_count);
        candidates
    }

    /// Clears those of `candidates` still idle (nothing written since the members were
    /// flushed). Returns whether any bit changed. A write that comes while the cleared image is
    /// on its way waits for it and sets its bit again (see [`ShardSlot::is_durable`]).
    pub fn clear_idle(&mut self, candidates: &[u64]) -> bool {
        let mut changed = false;
        for &region in candidates {
            if !self.in_flight.contains_key(&region) && !self.touched.get(region) && self.wanted.get(region) {
                self.wanted.clear(region);
                self.unlogged_wanted.clear(region);
                changed = true;
            }
        }
        changed
    }
}

/// Blocks (of [`BLOCK_BYTES`]) in which two images of a slot differ.
fn differing_blocks(a: &Bits, b: &Bits, region_count: u64) -> Vec<usize> {
    let len_bytes = super::ondisk::blocks_used(region_count) * BLOCK_BYTES;
    let (a, b) = (a.to_bytes(len_bytes), b.to_bytes(len_bytes));
    (0..len_bytes / BLOCK_BYTES)
        .filter(|&i| a[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES] != b[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES])
        .collect()
}
