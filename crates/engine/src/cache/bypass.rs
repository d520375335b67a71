//! Writes that go around the journal (`vd::journal_bypass` says which are candidates): straight
//! to the members, acknowledged when they have it, as WT without a journal does.
//!
//! The danger is replay. A record or row image still in the ring is written back after a
//! crash, over whatever the members hold; if it is older than a write that went around the
//! journal, that acknowledged write would be undone. So a write goes around only when nothing
//! the journal could replay names its bytes:
//! - no dirty extent overlaps it (its record is live, and its destage would follow);
//! - no data record that a replay would read names its rows ([`LoggedRows`]: every record
//!   placed is noted, and forgotten once the partition's durable tail has passed it). Checked
//!   at admission: a record placed later belongs to a later write, which lands later and is
//!   replayed later;
//! - no row image of a row it writes whole is live: checked under the row lock, where every
//!   earlier write of the row has logged its image (`io::parity::row_log`); if one is, the
//!   row write logs its image as usual.
//!
//! A row written whole without an image must be durable before a later write of the row logs
//! an image: that image's parity assumes the row's data, and if a crash dropped the unflushed
//! data of the row written around, replaying it would leave the row inconsistent. So such a
//! row is noted when its member writes are done ([`note_written_around`]), and a row write
//! that logs an image of a noted row waits for a flush first ([`around_durable`]).
//!
//! It is acknowledged only once it is durable on the members, as a WB write is once it is
//! durable in the journal: a flush of the VD's members that starts after it completed, shared
//! by every write of the VD that completed in the same turn of the shard ([`FlushGroup`]:
//! group commit).
//!
//! And only while the VD has every member in service: a row written whole without an image
//! is marked unlogged in the bitmap, and resynced after a crash, which needs every member.
//! Partial rows (a stream's first and last) are logged as row images as usual, so that a crash
//! can never tear data the write does not own; under WB on a VD with row images they are
//! cached instead, and a partial row whose rest the cache holds goes around whole with it
//! ([`complete_row`]). Where the stream's neighbouring write is already on its way, a partial
//! row goes around after all, to be gathered whole with that neighbour (`io::gather`).

use super::destage::{finish_run, Run};
use super::ShardCache;
use crate::io;
use crate::journal::part::JournalPart;
use crate::runtime::Reactor;
use crate::vd::{VdCompletion, VdError, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

/// Entries [`LoggedRows`] holds before a tick drops those the tails have passed.
const PRUNE_ABOVE_ENTRIES: usize = 4096;

/// The rows of this shard's VDs named by records and images the journal may still replay:
/// for each, one past the newest sequence of each kind (0: none).
#[derive(Default)]
pub(crate) struct LoggedRows {
    rows: HashMap<(u64, u64), Newest>,
}

#[derive(Clone, Copy, Default)]
struct Newest {
    data_below: u64,
    image_below: u64,
    /// The VD bytes of the row that the data records a replay could read may name: a bound
    /// (from the first to the last byte noted since the tail last passed them all).
    data_span_bytes: (u64, u64),
}

impl LoggedRows {
    /// A data record `sequence` names VD bytes `range` (rows of `row_bytes`); replay reads
    /// records from `data_tail` on.
    pub(crate) fn note_data(&mut self, vd_instance: u64, range: Range<u64>, row_bytes: u64, sequence: u64, data_tail: u64) {
        for row in rows_of(&range, row_bytes) {
            let (start, end) = (range.start.max(row * row_bytes), range.end.min((row + 1) * row_bytes));
            let newest = self.rows.entry((vd_instance, row)).or_default();
            newest.data_span_bytes = match newest.data_below > data_tail {
                true => (newest.data_span_bytes.0.min(start), newest.data_span_bytes.1.max(end)),
                // The records noted before are all behind the tail: replay never reads them.
                false => (start, end),
            };
            newest.data_below = newest.data_below.max(sequence + 1);
        }
    }

    /// Row image record `sequence` names row `row`.
    pub(crate) fn note_image(&mut self, vd_instance: u64, row: u64, sequence: u64) {
        let newest = self.rows.entry((vd_instance, row)).or_default();
        newest.image_below = newest.image_below.max(sequence + 1);
    }

    /// Whether a data record at or past `data_tail` names a row of `range`.
    fn data_live(&self, vd_instance: u64, range: &Range<u64>, row_bytes: u64, data_tail: u64) -> bool {
        rows_of(range, row_bytes).any(|row| self.rows.get(&(vd_instance, row)).is_some_and(|n| n.data_below > data_tail))
    }

    /// Whether a data record at or past `data_tail` may name a byte of `range`: finer than
    /// [`LoggedRows::data_live`], for a write that must not be undone by a record of its own
    /// row's other bytes (`complete_row`).
    fn data_named(&self, vd_instance: u64, range: &Range<u64>, row_bytes: u64, data_tail: u64) -> bool {
        rows_of(range, row_bytes).any(|row| {
            self.rows.get(&(vd_instance, row)).is_some_and(|n| {
                let (start, end) = n.data_span_bytes;
                n.data_below > data_tail && start < range.end && range.start < end
            })
        })
    }

    /// Whether an image at or past `image_tail` names `row`.
    pub(crate) fn image_live(&self, vd_instance: u64, row: u64, image_tail: u64) -> bool {
        self.rows.get(&(vd_instance, row)).is_some_and(|n| n.image_below > image_tail)
    }

    /// Forgets what the tails (`None`: no such partition) have passed, once there is much.
    pub(crate) fn prune(&mut self, data_tail: Option<u64>, image_tail: Option<u64>) {
        if self.rows.len() <= PRUNE_ABOVE_ENTRIES {
            return;
        }
        let (data_tail, image_tail) = (data_tail.unwrap_or(u64::MAX), image_tail.unwrap_or(u64::MAX));
        self.rows.retain(|_, n| n.data_below > data_tail || n.image_below > image_tail);
    }

    pub(crate) fn forget_data(&mut self) {
        self.rows.values_mut().for_each(|n| n.data_below = 0);
        self.rows.retain(|_, n| n.image_below > 0);
    }

    pub(crate) fn forget_images(&mut self) {
        self.rows.values_mut().for_each(|n| n.image_below = 0);
        self.rows.retain(|_, n| n.data_below > 0);
    }
}

fn rows_of(range: &Range<u64>, row_bytes: u64) -> Range<u64> {
    assert!(range.start < range.end && row_bytes > 0, "rows of a non-empty range");
    range.start / row_bytes..range.end.div_ceil(row_bytes)
}

/// Member flushes of one VD on this shard for the writes that went around the journal. A write
/// waits for a flush that starts after it completed: the first one to wait forms a flush, which
/// starts at the executor's next turn, so every write completing in the same turn joins it
/// (group commit); flushes may overlap, so no write waits for one that started before it.
#[derive(Default)]
pub(crate) struct FlushGroup {
    /// Flushes started (a flush is numbered by its start), and the highest number finished.
    started: Cell<u64>,
    max_finished: Cell<u64>,
    /// The flush that waiters may still join: it has not started.
    forming: RefCell<Option<Rc<Flush>>>,
    /// Rows written whole without an image, by row: the first flush number that covers them.
    rows_unflushed: RefCell<HashMap<u64, u64>>,
    /// The same, in the order they were noted (so by flush number), to forget them once done.
    rows_in_order: RefCell<std::collections::VecDeque<(u64, u64)>>,
}

/// One flush of a VD's members.
#[derive(Default)]
struct Flush {
    done: Cell<bool>,
    error: RefCell<Option<VdError>>,
}

impl Flush {
    fn result(&self) -> Result<(), VdError> {
        self.error.borrow().clone().map_or(Ok(()), Err)
    }
}

impl FlushGroup {
    /// The flush `number` finished: rows it covered need no other.
    fn forget_flushed(&self, number: u64) {
        let (mut rows, mut order) = (self.rows_unflushed.borrow_mut(), self.rows_in_order.borrow_mut());
        while let Some(&(needed, row)) = order.front().filter(|(needed, _)| *needed <= number) {
            order.pop_front();
            if rows.get(&row) == Some(&needed) {
                rows.remove(&row);
            }
        }
    }
}

/// Row `row` of `vd` was just written whole without an image (its member writes are done):
/// the next flush to start makes it durable.
pub(crate) fn note_written_around(reactor: &Reactor, vd: &VirtualDrive, row: u64) {
    let group = reactor.cache().flush_group(vd);
    let needed = group.started.get() + 1;
    assert!(group.rows_in_order.borrow().back().is_none_or(|&(last, _)| last <= needed), "flush numbers only grow");
    group.rows_unflushed.borrow_mut().insert(row, needed);
    group.rows_in_order.borrow_mut().push_back((needed, row));
}

/// Waits until row `row` of `vd`, if it was written around the journal, is durable: called
/// under the row's lock by a row write about to log an image of it.
///
/// # Errors
/// The flush failed (the VD went offline).
pub(crate) async fn around_durable(reactor: &Rc<Reactor>, vd: &Arc<VirtualDrive>, row: u64) -> Result<(), VdError> {
    let needed = reactor.cache().flush_group(vd).rows_unflushed.borrow().get(&row).copied();
    match needed {
        Some(needed) => flushed_from(reactor, vd, needed).await,
        None => Ok(()),
    }
}

impl ShardCache {
    /// Data record `sequence` of `journal` holds `len_bytes` of `vd` at `offset_bytes` ([`bypass`]).
    pub(super) fn note_logged_data(&self, journal: &JournalPart, vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64, sequence: u64) {
        let range = offset_bytes..offset_bytes + len_bytes;
        let data_tail = journal.durable_tail_sequence();
        self.logged_rows.borrow_mut().note_data(vd.instance_id(), range, vd.geometry().row_data_bytes(), sequence, data_tail);
    }

    /// Row image record `sequence` names `row` of `vd` ([`bypass`]).
    pub(crate) fn note_logged_image(&self, vd: &VirtualDrive, row: u64, sequence: u64) {
        self.logged_rows.borrow_mut().note_image(vd.instance_id(), row, sequence);
    }

    /// Whether a row image a replay could read names `row` of `vd` ([`bypass`]).
    pub(crate) fn image_live(&self, vd: &VirtualDrive, row: u64) -> bool {
        let Some(images) = self.images.borrow().clone() else { return false };
        self.logged_rows.borrow().image_live(vd.instance_id(), row, images.durable_tail_sequence())
    }

    /// Forgets the rows whose records and images replay can no longer read.
    pub(crate) fn prune_logged_rows(&self) {
        let data_tail = self.journal().map(|j| j.durable_tail_sequence());
        let image_tail = self.images.borrow().as_ref().map(|i| i.durable_tail_sequence());
        self.logged_rows.borrow_mut().prune(data_tail, image_tail);
    }

    fn flush_group(&self, vd: &VirtualDrive) -> Rc<FlushGroup> {
        Rc::clone(self.bypass_flushes.borrow_mut().entry(vd.instance_id()).or_default())
    }
}

/// Waits until everything `vd`'s members took before the call is durable on them.
pub(super) async fn members_durable(reactor: &Rc<Reactor>, vd: &Arc<VirtualDrive>) -> Result<(), VdError> {
    // A flush running now may have started before this write's data reached the members.
    let needed = reactor.cache().flush_group(vd).started.get() + 1;
    flushed_from(reactor, vd, needed).await
}

/// Waits until a flush of `vd`'s members numbered `needed` or later has finished, joining the
/// flush being formed or forming one.
async fn flushed_from(reactor: &Rc<Reactor>, vd: &Arc<VirtualDrive>, needed: u64) -> Result<(), VdError> {
    let cache = Rc::clone(reactor.cache());
    let group = cache.flush_group(vd);
    if group.max_finished.get() >= needed {
        return Ok(());
    }
    let forming = group.forming.borrow().clone();
    let Some(flush) = forming else { return run_flush(reactor, vd, &group, needed).await };
    // It starts after this call, so its number will be `needed` or later.
    while !flush.done.get() {
        cache.wait_for_change().await;
    }
    flush.result()
}

/// Forms a flush, lets the writes completing in this turn join it, then runs it.
async fn run_flush(reactor: &Rc<Reactor>, vd: &Arc<VirtualDrive>, group: &FlushGroup, needed: u64) -> Result<(), VdError> {
    let flush = Rc::new(Flush::default());
    *group.forming.borrow_mut() = Some(Rc::clone(&flush));
    crate::runtime::yield_now().await;
    let formed = group.forming.borrow_mut().take();
    assert!(formed.is_some_and(|f| Rc::ptr_eq(&f, &flush)), "only the flush's former starts it");
    let number = group.started.get() + 1;
    assert!(number >= needed, "flush numbers only grow");
    group.started.set(number);
    let result = io::serve(Rc::clone(reactor), Arc::clone(vd), VdRequest::Flush).await.result;
    *flush.error.borrow_mut() = result.err();
    flush.done.set(true);
    group.max_finished.set(group.max_finished.get().max(number));
    group.forget_flushed(number);
    reactor.cache().wake_all();
    flush.result()
}

/// Whether a write of `range` of `vd` may go around the journal now (see the module docs; the
/// images are looked at later, under each row's lock).
pub(super) fn allowed(cache: &ShardCache, vd: &VirtualDrive, range: &Range<u64>) -> bool {
    vd.unavailable().is_empty() && nothing_to_replay_over(cache, vd, range)
}

/// Whether a write of `range` of `vd` that leaves no data record could not be undone by a
/// replay: the VD is not replaying, no dirty extent overlaps it (its record is live, and its
/// destage would follow) and no live data record names its rows.
pub(super) fn nothing_to_replay_over(cache: &ShardCache, vd: &VirtualDrive, range: &Range<u64>) -> bool {
    if vd.is_replaying() {
        return false;
    }
    let dirty = cache.vds.borrow().get(&vd.instance_id()).is_some_and(|c| c.dirty.overlapping(range.clone()).next().is_some());
    if dirty {
        return false;
    }
    let data_tail = cache.journal().map_or(u64::MAX, |j| j.durable_tail_sequence());
    !cache.logged_rows.borrow().data_live(vd.instance_id(), range, vd.geometry().row_data_bytes(), data_tail)
}

/// Whether a write of `range` (a part of one row of a parity VD) may go around the journal
/// as part of its whole row ([`complete_row`]): as [`allowed`], except that data records may
/// name the row's other bytes (the dirty extents written with it hold their newest data, and
/// a replay of those records writes that same data again), never its own.
pub(super) fn may_complete_row(cache: &ShardCache, vd: &VirtualDrive, range: &Range<u64>) -> bool {
    if !vd.unavailable().is_empty() || vd.is_replaying() {
        return false;
    }
    let data_tail = cache.journal().map_or(u64::MAX, |j| j.durable_tail_sequence());
    !cache.logged_rows.borrow().data_named(vd.instance_id(), range, vd.geometry().row_data_bytes(), data_tail)
}

/// Writes `buf` (a part of one row at `offset_bytes`) with `run` (the row's other bytes, dirty
/// in the cache) to the members as one whole row around the journal, and acknowledges it once
/// that is durable, as [`write_around`] does.
///
/// A stream's write that does not end on a row boundary leaves the start of a row in the cache
/// (its record acknowledges it at once); the stream's next write brings the rest. Waiting
/// under the row lock for that next write instead (`io::gather`) made each write's
/// acknowledgement wait for the next write's arrival and a member flush, and a third of the
/// waits (at most 1.5 ms then) ran out into two read-modify-writes. Here neither waits for the
/// other, and the row still goes out once, as a full stripe without an image; the cost is the
/// first part's record in the journal. A 1 MiB stream at QD 4 on files ran about as fast as
/// with a 5 ms wait (1067-1207 MB/s against 898-1099, alternated), without a clock in the
/// path, so the simulator runs it.
///
/// A crash may tear the row. Replay then writes the cached part again from its records (no
/// record names this write's bytes: [`may_complete_row`]), and the row, written unlogged, is
/// resynced, as any row written around the journal. It counts as one write of the whole row
/// around the journal; the cached extents leave the cache once it is durable.
pub(super) async fn complete_row(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, run: Run) -> VdCompletion {
    let row_bytes = vd.geometry().row_data_bytes();
    let row_start_bytes = offset_bytes / row_bytes * row_bytes;
    let row = {
        let mut parts: Vec<(u64, &[u8])> = run.extents().iter().map(|(o, e)| (*o, e.bytes())).collect();
        parts.push((offset_bytes, buf.as_slice()));
        parts.sort_by_key(|&(o, _)| o);
        let contiguous = parts.windows(2).all(|w| w[0].0 + w[0].1.len() as u64 == w[1].0);
        let len_bytes: u64 = parts.iter().map(|(_, p)| p.len() as u64).sum();
        assert!(
            parts[0].0 == row_start_bytes && contiguous && len_bytes == row_bytes,
            "a completed row is its extents and the write, back to back"
        );
        let slices: Vec<&[u8]> = parts.iter().map(|&(_, p)| p).collect();
        IoBuf::from_parts(&slices, row_bytes as usize)
    };
    vd.journal_bypass().note_completed_row();
    let result = write_around(Rc::clone(&reactor), vd, row_start_bytes, row).await.result;
    finish_run(&reactor, &run, &vec![result.clone(); run.extents().len()], false);
    VdCompletion { result, buf: Some(buf) }
}

/// Writes `buf` at `offset_bytes` straight to the members: rows it covers whole go without an
/// image (unlogged in the bitmap), the others as any row write.
pub(super) async fn write_around(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    let len_bytes = buf.len() as u64;
    vd.journal_bypass().note_bypassed(len_bytes);
    let direct = cache.clean.borrow_mut().begin_direct_write(vd.instance_id(), offset_bytes..offset_bytes + len_bytes);
    let mut completion = io::serve_around_journal(Rc::clone(&reactor), Arc::clone(&vd), offset_bytes, buf).await;
    cache.clean.borrow_mut().end_direct_write(direct);
    if completion.result.is_ok() {
        completion.result = members_durable(&reactor, &vd).await;
    }
    completion
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: u64 = 448 << 10;

    #[test]
    fn a_record_names_the_rows_it_touches_until_the_tail_passes_it() {
        let mut logged = LoggedRows::default();
        logged.note_data(1, ROW - 4096..ROW + 4096, ROW, 7, 0);
        assert!(logged.data_live(1, &(0..4096), ROW, 7), "row 0 is named by record 7");
        assert!(logged.data_live(1, &(ROW..2 * ROW), ROW, 7), "row 1 too");
        assert!(!logged.data_live(1, &(2 * ROW..3 * ROW), ROW, 0), "row 2 is not");
        assert!(!logged.data_live(2, &(0..ROW), ROW, 0), "another VD's rows are not");
        assert!(!logged.data_live(1, &(0..ROW), ROW, 8), "the durable tail passed record 7: replay never reads it");
    }

    #[test]
    fn images_and_records_are_told_apart_and_forgotten_separately() {
        let mut logged = LoggedRows::default();
        logged.note_image(1, 3, 0);
        logged.note_data(1, 3 * ROW..3 * ROW + 512, ROW, 5, 0);
        assert!(logged.image_live(1, 3, 0) && !logged.image_live(1, 3, 1));
        logged.forget_images();
        assert!(!logged.image_live(1, 3, 0));
        assert!(logged.data_live(1, &(3 * ROW..4 * ROW), ROW, 5));
        logged.forget_data();
        assert!(logged.rows.is_empty());
    }

    #[test]
    fn pruning_keeps_what_a_replay_could_still_read() {
        let mut logged = LoggedRows::default();
        for row in 0..PRUNE_ABOVE_ENTRIES as u64 + 10 {
            logged.note_data(1, row * ROW..row * ROW + 512, ROW, row, 0);
        }
        logged.prune(Some(100), None);
        assert_eq!(logged.rows.len(), PRUNE_ABOVE_ENTRIES + 10 - 100);
        assert!(logged.data_live(1, &(100 * ROW..101 * ROW), ROW, 100) && !logged.data_live(1, &(99 * ROW..100 * ROW), ROW, 100));
    }
}
