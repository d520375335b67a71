//! The memory of the clean cache's lines: 64 KiB lines carved from 2 MiB slabs on huge pages
//! ([`drive::HugePageBuf`]).
//!
//! A cache hit is a 4 KiB copy from a random line. With each line a 64 KiB heap allocation on
//! 4 KiB pages, that copy cost a TLB miss and a page walk nearly every time: 70 % of the
//! in-process cost of a 4 KiB hit, which left hits slower than reads from memory drives once
//! those moved to huge pages.
//!
//! Lines are taken from the slab last given a free line (so a slab fills before the next is
//! mapped), and a slab goes back to the kernel once all its lines are free and more than
//! [`SPARE_LINES_MAX`] free lines remain: the memory follows the lines in use, as it did when
//! each line was its own allocation, give or take the lines of slabs still partly in use.

use drive::{HugePageBuf, HUGE_PAGE_BYTES};

use super::clean::LINE_BYTES;

const LINES_PER_SLAB: usize = HUGE_PAGE_BYTES / LINE_BYTES as usize;
const ALL_FREE: u32 = u32::MAX >> (32 - LINES_PER_SLAB);
const _: () = assert!(LINES_PER_SLAB <= 32, "a slab's free lines fit a u32");

/// Free lines kept at most beyond those of partly used slabs (4 MiB): a fresh slab is zeroed
/// and faulted in on first use.
const SPARE_LINES_MAX: usize = 64;

/// A line's place: slab index times [`LINES_PER_SLAB`] plus the line within the slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LineSlot(u32);

struct Slab {
    bytes: HugePageBuf,
    /// Bit `i`: line `i` is free.
    free: u32,
}

#[derive(Default)]
pub(super) struct LineMemory {
    slabs: Vec<Option<Slab>>,
    /// Slabs with a free line, the one given a line last at the end.
    with_room: Vec<usize>,
    /// Indices of `slabs` whose slab went back to the kernel.
    unused: Vec<usize>,
    free_lines: usize,
}

impl LineMemory {
    /// A free line (its bytes are whatever the last line there held), or `None` when no memory
    /// can be mapped: the cache then keeps nothing more.
    pub(super) fn take(&mut self) -> Option<LineSlot> {
        if self.with_room.is_empty() {
            self.map_slab()?;
        }
        let &index = self.with_room.last().expect("a slab with room");
        let slab = self.slabs[index].as_mut().expect("a slab with room is mapped");
        let line = slab.free.trailing_zeros() as usize;
        slab.free &= !(1 << line);
        if slab.free == 0 {
            self.with_room.pop();
        }
        self.free_lines -= 1;
        Some(LineSlot((index * LINES_PER_SLAB + line) as u32))
    }

    /// Line `slot` is no longer used.
    pub(super) fn give(&mut self, slot: LineSlot) {
        let (index, line) = (slot.0 as usize / LINES_PER_SLAB, slot.0 as usize % LINES_PER_SLAB);
        let slab = self.slabs[index].as_mut().expect("a line's slab is mapped");
        assert_eq!(slab.free & (1 << line), 0, "a line is given back once");
        let was_full = slab.free == 0;
        slab.free |= 1 << line;
        self.free_lines += 1;
        if slab.free == ALL_FREE && self.free_lines > SPARE_LINES_MAX + LINES_PER_SLAB {
            self.unmap_slab(index);
        } else if was_full {
            self.with_room.push(index);
        }
    }

    pub(super) fn bytes(&self, slot: LineSlot) -> &[u8] {
        let (index, line) = (slot.0 as usize / LINES_PER_SLAB, slot.0 as usize % LINES_PER_SLAB);
        let slab = self.slabs[index].as_ref().expect("a line's slab is mapped");
        &slab.bytes[line * LINE_BYTES as usize..(line + 1) * LINE_BYTES as usize]
    }

    pub(super) fn bytes_mut(&mut self, slot: LineSlot) -> &mut [u8] {
        let (index, line) = (slot.0 as usize / LINES_PER_SLAB, slot.0 as usize % LINES_PER_SLAB);
        let slab = self.slabs[index].as_mut().expect("a line's slab is mapped");
        &mut slab.bytes[line * LINE_BYTES as usize..(line + 1) * LINE_BYTES as usize]
    }

    /// Memory mapped for lines, in use or free.
    #[cfg(test)]
    pub(super) fn mapped_bytes(&self) -> u64 {
        (self.slabs.iter().flatten().count() * HUGE_PAGE_BYTES) as u64
    }

    fn map_slab(&mut self) -> Option<()> {
        let bytes = match HugePageBuf::new() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(%error, "cache: no memory for more clean lines");
                return None;
            }
        };
        let slab = Some(Slab { bytes, free: ALL_FREE });
        let index = match self.unused.pop() {
            Some(index) => {
                self.slabs[index] = slab;
                index
            }
            None => {
                self.slabs.push(slab);
                self.slabs.len() - 1
            }
        };
        self.with_room.push(index);
        self.free_lines += LINES_PER_SLAB;
        Some(())
    }

    fn unmap_slab(&mut self, index: usize) {
        self.slabs[index] = None;
        self.with_room.retain(|&i| i != index);
        self.unused.push(index);
        self.free_lines -= LINES_PER_SLAB;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_distinct_and_fill_a_slab_before_the_next() {
        let mut memory = LineMemory::default();
        let slots: Vec<LineSlot> = (0..LINES_PER_SLAB + 1).map(|_| memory.take().unwrap()).collect();
        assert_eq!(memory.mapped_bytes(), 2 * HUGE_PAGE_BYTES as u64, "the 33rd line maps the second slab");
        for (n, &slot) in slots.iter().enumerate() {
            memory.bytes_mut(slot).fill(n as u8);
        }
        for (n, &slot) in slots.iter().enumerate() {
            assert!(memory.bytes(slot).iter().all(|&b| b == n as u8), "line {n} kept its own bytes");
        }
    }

    #[test]
    fn free_lines_are_taken_again_before_a_slab_is_mapped() {
        let mut memory = LineMemory::default();
        let slots: Vec<LineSlot> = (0..2 * LINES_PER_SLAB).map(|_| memory.take().unwrap()).collect();
        slots.iter().step_by(2).for_each(|&slot| memory.give(slot));
        let taken: Vec<LineSlot> = (0..LINES_PER_SLAB).map(|_| memory.take().unwrap()).collect();
        assert!(taken.iter().all(|slot| slots.iter().step_by(2).any(|given| given == slot)), "the lines given back");
        assert_eq!(memory.mapped_bytes(), 2 * HUGE_PAGE_BYTES as u64, "the half-used slabs took the new lines");
    }

    #[test]
    fn a_slab_all_free_goes_back_once_enough_lines_are_spare() {
        let mut memory = LineMemory::default();
        let slab_count = SPARE_LINES_MAX / LINES_PER_SLAB + 4;
        let slots: Vec<LineSlot> = (0..slab_count * LINES_PER_SLAB).map(|_| memory.take().unwrap()).collect();
        slots.iter().for_each(|&slot| memory.give(slot));
        let spare_slabs = (SPARE_LINES_MAX + LINES_PER_SLAB).div_ceil(LINES_PER_SLAB) as u64;
        assert_eq!(memory.mapped_bytes(), spare_slabs * HUGE_PAGE_BYTES as u64, "only the spare lines' slabs stay mapped");
        let again: Vec<LineSlot> = (0..slab_count * LINES_PER_SLAB).map(|_| memory.take().unwrap()).collect();
        assert_eq!(again.len(), slots.len(), "slabs given back are mapped again when needed");
        assert_eq!(memory.mapped_bytes(), (slab_count * HUGE_PAGE_BYTES) as u64);
    }

    #[test]
    #[should_panic(expected = "given back once")]
    fn a_line_given_back_twice_is_a_bug() {
        let mut memory = LineMemory::default();
        let slot = memory.take().unwrap();
        memory.give(slot);
        memory.give(slot);
    }
}
