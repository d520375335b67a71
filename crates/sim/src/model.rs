//! The reference model: what every VD sector may hold.
//!
//! While the VD runs, a read must return the newest contents (reads never overlap a write in
//! flight). A crash loosens that: a sector written since the last completed FLUSH that covers
//! the write may hold its contents before or after any of those writes, and nothing else. The
//! model keeps, for such sectors only, the durable contents and every write since, in
//! submission order (the engine applies overlapping writes in that order). After a crash, the
//! first read of such a sector decides which one the drives kept, and from then on it is fixed.
//!
//! A write becomes durable when a FLUSH submitted after it completed has completed (DESIGN.md,
//! durability rules: storc acknowledges a write when its members hold it, like a disk with a
//! volatile cache).

use layout::SECTOR_BYTES;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

const SECTOR: usize = SECTOR_BYTES as usize;

/// Identifies a write for the flushes that cover it.
pub type WriteId = u64;

/// A sector whose contents are not one known value.
struct SectorHistory {
    /// What the medium durably holds: one value, or after a crash every value it may hold
    /// until a read shows which one.
    durable: Vec<Box<[u8]>>,
    /// Writes submitted since, in submission order: not yet known durable.
    since: Vec<(WriteId, Box<[u8]>)>,
    /// For a sector no client wrote, whose copies differed: the [`Model::settle_floating`]
    /// call that made it undecided. A read submitted before it may have read a copy that the
    /// initialization replaced meanwhile, and does not decide the sector.
    settled_by: Option<u64>,
}

/// The writes a FLUSH makes durable: those completed when it was submitted.
pub struct FlushCovers(Vec<WriteId>);

pub struct Model {
    /// What a read returns now, for every sector not undecided by a crash.
    newest: Vec<u8>,
    /// By sector index: sectors written since they were last durable, or undecided.
    open: BTreeMap<u64, SectorHistory>,
    /// Writes not yet durable, by id: their range and whether they completed.
    writes: BTreeMap<WriteId, (Range<u64>, bool)>,
    next_write_id: WriteId,
    /// By sector index: sectors no client wrote whose mirror copies held different old data
    /// when the VD was created. Until their region is initialized a read may return any of
    /// them (the first copy, or another once the first is out of service), and goes on doing
    /// so; a write, or the end of their region's initialization, ends that.
    floating: BTreeMap<u64, Vec<Box<[u8]>>>,
    /// Calls of [`Model::settle_floating`] so far.
    settles: u64,
}

impl Model {
    /// A VD of `capacity_bytes` that reads as zeros (blank memory drives).
    pub fn new(capacity_bytes: usize) -> Model {
        Model {
            newest: vec![0; capacity_bytes],
            open: BTreeMap::new(),
            writes: BTreeMap::new(),
            next_write_id: 0,
            floating: BTreeMap::new(),
            settles: 0,
        }
    }

    /// A VD that reads as `image` (members that held data before it was created), where the
    /// sectors of `floating` may read as any of their values until written or initialized.
    pub fn with_image(image: Vec<u8>, floating: BTreeMap<u64, Vec<Box<[u8]>>>) -> Model {
        Model { floating, newest: image, ..Model::new(0) }
    }

    /// The floating sectors for which `initialized(sector)` holds now: their copies were made
    /// equal, to one of their values, which the next read shows (and fixes).
    pub fn settle_floating(&mut self, initialized: impl Fn(u64) -> bool) {
        self.settles += 1;
        let settled: Vec<u64> = self.floating.keys().copied().filter(|&number| initialized(number)).collect();
        for number in settled {
            let values = self.floating.remove(&number).expect("listed above");
            self.open.insert(number, SectorHistory { durable: values, since: Vec::new(), settled_by: Some(self.settles) });
        }
    }

    /// Settles so far: what a read submitted now records for [`Model::check_read_begun`].
    pub fn settles(&self) -> u64 {
        self.settles
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.newest.len() as u64
    }

    /// Books a write at its submission; reads after it see `data`.
    pub fn submit_write(&mut self, offset_bytes: u64, data: &[u8]) -> WriteId {
        let id = self.next_write_id;
        self.next_write_id += 1;
        for (index, sector) in data.chunks(SECTOR).enumerate() {
            let number = offset_bytes / SECTOR_BYTES + index as u64;
            let at = number as usize * SECTOR;
            // A floating sector held any of its values before this write.
            let before = self.floating.remove(&number).unwrap_or_else(|| vec![self.newest[at..at + SECTOR].into()]);
            let history = self.open.entry(number).or_insert_with(|| SectorHistory { durable: before, since: Vec::new(), settled_by: None });
            history.since.push((id, sector.into()));
            history.settled_by = None;
            self.newest[at..at + SECTOR].copy_from_slice(sector);
        }
        self.writes.insert(id, (offset_bytes..offset_bytes + data.len() as u64, false));
        id
    }

    /// The engine acknowledged write `id`.
    pub fn complete_write(&mut self, id: WriteId) {
        if let Some((_, completed)) = self.writes.get_mut(&id) {
            *completed = true;
        }
    }

    /// Write `id` was acknowledged durable (it is in the journal): as if a FLUSH covered it.
    pub fn make_durable(&mut self, id: WriteId) {
        self.complete_flush(FlushCovers(vec![id]));
    }

    /// A FLUSH is submitted now: it covers the writes completed so far.
    pub fn submit_flush(&self) -> FlushCovers {
        FlushCovers(self.writes.iter().filter(|(_, (_, completed))| *completed).map(|(&id, _)| id).collect())
    }

    /// A FLUSH completed: the writes it covers are durable, and so nothing older survives in
    /// their sectors.
    pub fn complete_flush(&mut self, covers: FlushCovers) {
        for id in covers.0 {
            let Some((range, _)) = self.writes.remove(&id) else { continue };
            for number in range.start / SECTOR_BYTES..range.end / SECTOR_BYTES {
                self.settle(number, id);
            }
        }
    }

    /// Write `id` is durable in sector `number`: it becomes the durable contents, unless a later
    /// durable write already superseded it.
    fn settle(&mut self, number: u64, id: WriteId) {
        let Some(history) = self.open.get_mut(&number) else { return };
        let Some(position) = history.since.iter().position(|(w, _)| *w == id) else { return };
        let mut rest = history.since.split_off(position);
        let (_, durable) = rest.remove(0);
        history.durable = vec![durable];
        history.since = rest;
        if history.since.is_empty() {
            self.open.remove(&number);
        }
    }

    /// Rows (of `row_data_bytes`) holding a sector written and not yet durable: the rows a
    /// crash may tear, which a write-intent bitmap would mark dirty.
    pub fn unflushed_rows(&self, row_data_bytes: u64) -> BTreeSet<u64> {
        let sectors_per_row = row_data_bytes / SECTOR_BYTES;
        self.open.iter().filter(|(_, h)| !h.since.is_empty()).map(|(&number, _)| number / sectors_per_row).collect()
    }

    /// A power cut: every write not durable may or may not have reached the media, sector by
    /// sector. Returns how many sectors are left undecided.
    pub fn crash(&mut self) -> usize {
        self.writes.clear();
        self.open.retain(|_, history| {
            for (_, contents) in history.since.drain(..) {
                if !history.durable.contains(&contents) {
                    history.durable.push(contents);
                }
            }
            history.durable.len() > 1
        });
        // Sectors whose writes all carried the contents they had: decided already.
        self.open.len()
    }

    /// Checks what a read at `offset_bytes` returned, and fixes every undecided sector it
    /// covers to what it returned.
    ///
    /// # Errors
    /// The first sector that holds something the model does not allow, by VD byte.
    pub fn check_read(&mut self, offset_bytes: u64, got: &[u8]) -> Result<(), String> {
        self.check_read_begun(offset_bytes, got, self.settles)
    }

    /// [`Model::check_read`] for a read submitted after `settles_before` settles: a sector
    /// settled since may read as any of its values and is not decided by this read, which may
    /// have read a copy before the initialization replaced it.
    pub fn check_read_begun(&mut self, offset_bytes: u64, got: &[u8], settles_before: u64) -> Result<(), String> {
        let first = offset_bytes / SECTOR_BYTES;
        for (index, sector) in got.chunks(SECTOR).enumerate() {
            let number = first + index as u64;
            let at = number as usize * SECTOR;
            if let Some(values) = self.floating.get(&number) {
                if !values.iter().any(|v| **v == *sector) {
                    return Err(undecided_mismatch(number, sector, values.len()));
                }
            } else if let Some(history) = self.open.get(&number).filter(|h| h.since.is_empty()) {
                if !history.durable.iter().any(|d| **d == *sector) {
                    return Err(undecided_mismatch(number, sector, history.durable.len()));
                }
                if history.settled_by.is_some_and(|settle| settle > settles_before) {
                    continue;
                }
                self.newest[at..at + SECTOR].copy_from_slice(sector);
                self.open.remove(&number);
            } else if self.newest[at..at + SECTOR] != *sector {
                return Err(mismatch(number, sector, &self.newest[at..at + SECTOR]));
            }
        }
        Ok(())
    }
}

fn mismatch(number: u64, got: &[u8], expected: &[u8]) -> String {
    let i = got.iter().zip(expected).position(|(a, b)| a != b).expect("they differ");
    format!(
        "wrong data at VD byte {} (got {:#04x}, model has {:#04x}); {} bytes of its sector differ",
        number * SECTOR_BYTES + i as u64,
        got[i],
        expected[i],
        got.iter().zip(expected).filter(|(a, b)| a != b).count()
    )
}

fn undecided_mismatch(number: u64, got: &[u8], candidates: usize) -> String {
    format!(
        "wrong data in VD sector at byte {} after a crash: it is none of the {candidates} contents it may hold (first bytes {:02x?})",
        number * SECTOR_BYTES,
        &got[..8]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sectors(byte: u8, count: usize) -> Vec<u8> {
        vec![byte; count * SECTOR]
    }

    #[test]
    fn after_a_crash_a_sector_holds_its_durable_or_a_later_write_then_stays_fixed() {
        let mut model = Model::new(8 * SECTOR);
        let first = model.submit_write(0, &sectors(1, 2));
        model.complete_write(first);
        let covers = model.submit_flush();
        let second = model.submit_write(0, &sectors(2, 2));
        model.complete_flush(covers);
        model.complete_write(second);
        model.submit_write(SECTOR_BYTES, &sectors(3, 1));
        assert_eq!(model.unflushed_rows(4 * SECTOR_BYTES), BTreeSet::from([0]));
        assert_eq!(model.crash(), 2);
        // Sector 0 may hold 1 or 2 (never 0: the first write was flushed); sector 1: 1, 2 or 3.
        assert!(model.check_read(0, &sectors(0, 1)).is_err());
        let mut torn = sectors(2, 1);
        torn.extend(sectors(1, 1));
        model.check_read(0, &torn).unwrap();
        assert!(model.check_read(0, &sectors(2, 2)).is_err(), "decided at the first read");
        model.check_read(2 * SECTOR_BYTES, &sectors(0, 6)).unwrap();
    }

    #[test]
    fn a_flush_covers_only_writes_completed_before_it() {
        let mut model = Model::new(4 * SECTOR);
        let write = model.submit_write(0, &sectors(5, 1));
        let covers = model.submit_flush();
        model.complete_write(write);
        model.complete_flush(covers);
        model.crash();
        model.check_read(0, &sectors(0, 1)).unwrap();
    }

    /// Regression (seed 3032006): a read submitted while a mirror's copies still differed, and
    /// answered from the copy that the initialization replaced, completed after the settle and
    /// decided the sector; the next read, of the copy now on both members, was called wrong.
    #[test]
    fn a_read_begun_before_its_sector_settled_does_not_decide_it() {
        let floating = BTreeMap::from([(0, vec![sectors(1, 1).into(), sectors(2, 1).into()])]);
        let mut model = Model::with_image(sectors(1, 2), floating);
        let begun = model.settles();
        model.check_read_begun(0, &sectors(2, 1), begun).unwrap();
        model.settle_floating(|_| true);
        model.check_read_begun(0, &sectors(2, 1), begun).unwrap();
        model.check_read(0, &sectors(1, 1)).unwrap();
        assert!(model.check_read(0, &sectors(2, 1)).is_err(), "decided by the first read begun after the settle");
    }
}
