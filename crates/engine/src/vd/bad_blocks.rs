//! A VD's bad-block list (MegaRAID's puncture, md's bad-block log): VD byte ranges whose data
//! is lost because nothing that held it could be read. Reads that touch one fail; a write over
//! one makes the written bytes good again.
//!
//! # Durability
//! A row job that finds data lost records the ranges here first (from then on reads of them
//! fail), then waits until the controller has written the list to the metadata, and only then
//! writes anything over the lost data (zeros, and parity computed with them). A crash before
//! that write leaves the row as it was; a crash after it finds the ranges on disk. Either way no
//! read ever returns the zeros as data.
//!
//! A write over a bad range removes it at once, and the controller writes the shorter list soon
//! after, without holding the write's acknowledgement. A crash in between brings the range back
//! as bad although it holds the written data: its reads fail until it is written again. That is
//! the conservative side: an unreadable range that could have been read, never made-up data
//! served as if it were the client's.
//!
//! # Cost on the data path
//! Every request looks at one atomic (`count`); the lock is taken only while the list has
//! entries, which after a puncture is rare and short.

use crate::config::BadBlock;
use crate::runtime::RemoteWaker;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::Poll;

/// Most ranges one VD's list holds. A loss that would need more is not recorded: the row job
/// leaves the row as it was (its target stays unread) and the controller says why. 1024 ranges
/// are 16 KiB of metadata per VD.
pub const BAD_BLOCKS_MAX: usize = 1024;

/// A change of a VD's list, sent to the controller, which logs it and writes the list.
#[derive(Clone, Debug)]
pub struct BadBlockEvent {
    pub vd_id: u64,
    /// [`crate::VirtualDrive::instance_id`] of the VD.
    pub instance_id: u64,
    pub change: BadBlockChange,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadBlockChange {
    /// Data found lost and recorded in memory; `cause` says which row job found it and why.
    Lost { ranges: Vec<BadBlock>, cause: String },
    /// A loss that could not be recorded (the list is full): nothing was written over it.
    Refused { ranges: Vec<BadBlock>, cause: String, reason: String },
    /// Written by a client: good again.
    Rewritten { ranges: Vec<BadBlock> },
    /// Nothing new, but the list in memory is newer than the metadata: write it.
    Unsaved,
}

/// `repr(C)`: `count`, which every request reads, comes first, next to the other fields of the
/// VD that a request reads.
#[repr(C)]
pub struct BadBlocks {
    /// Entries in the list, read without the lock by every request.
    count: AtomicUsize,
    /// Bumped on every change: a read that saw it move while it ran is redone.
    version: AtomicU64,
    vd_id: u64,
    instance_id: u64,
    inner: Mutex<Inner>,
    notifier: OnceLock<crossbeam_channel::Sender<BadBlockEvent>>,
}

#[derive(Default)]
struct Inner {
    /// Sorted, not overlapping, not touching (touching ranges are merged).
    ranges: Vec<BadBlock>,
    version: u64,
    /// Every change up to this version is in the metadata.
    durable_version: u64,
    /// The newest version the controller could not write, and why.
    unrecorded: Option<(u64, String)>,
    /// Row jobs waiting for a version to be durable.
    waiters: Vec<RemoteWaker>,
}

impl BadBlocks {
    pub(crate) fn new(vd_id: u64, instance_id: u64) -> BadBlocks {
        BadBlocks {
            vd_id,
            instance_id,
            count: AtomicUsize::new(0),
            version: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            notifier: OnceLock::new(),
        }
    }

    /// Sends changes to `sender` (the controller, which writes them to the metadata). Without
    /// one (a VD outside a controller) a change is as durable as it will ever be at once.
    pub fn set_notifier(&self, sender: crossbeam_channel::Sender<BadBlockEvent>) {
        let _ = self.notifier.set(sender);
    }

    /// Takes the list recorded in the metadata (assembly): durable by definition.
    pub fn load(&self, ranges: &[BadBlock]) {
        let mut inner = self.lock();
        inner.ranges.clear();
        for range in ranges {
            merge_in(&mut inner.ranges, *range);
        }
        inner.durable_version = inner.version;
        self.publish(&inner);
    }

    /// The list now and its version, for the controller to write.
    pub fn snapshot(&self) -> (Vec<BadBlock>, u64) {
        let inner = self.lock();
        (inner.ranges.clone(), inner.version)
    }

    pub fn ranges(&self) -> Vec<BadBlock> {
        self.snapshot().0
    }

    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// Changes so far; a reader compares it before and after.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The first bad range that `[offset_bytes, offset_bytes + len_bytes)` touches.
    pub fn overlap(&self, offset_bytes: u64, len_bytes: u64) -> Option<BadBlock> {
        if self.is_empty() {
            return None;
        }
        let end = offset_bytes + len_bytes;
        let inner = self.lock();
        let first_ending_after = inner.ranges.partition_point(|r| r.offset_bytes + r.len_bytes <= offset_bytes);
        inner.ranges.get(first_ending_after).filter(|r| r.offset_bytes < end).copied()
    }

    /// Records lost data. Returns the version the caller must see durable before it writes
    /// over the data, or why the loss cannot be recorded (nothing changed then; the controller
    /// is told).
    pub(crate) fn record_lost(&self, ranges: &[BadBlock], cause: &str) -> Result<u64, String> {
        let mut inner = self.lock();
        let mut merged = inner.ranges.clone();
        for range in ranges {
            merge_in(&mut merged, *range);
        }
        if merged.len() > BAD_BLOCKS_MAX {
            drop(inner);
            let reason = format!("the bad-block list of v{} holds its maximum of {BAD_BLOCKS_MAX} ranges", self.vd_id);
            let _ = self.notify(BadBlockChange::Refused { ranges: ranges.to_vec(), cause: cause.to_string(), reason: reason.clone() });
            return Err(reason);
        }
        let changed = merged != inner.ranges;
        if changed {
            inner.ranges = merged;
            self.bump(&mut inner);
        }
        let version = inner.version;
        let pending = inner.durable_version < version;
        drop(inner);
        let told = match (changed, pending) {
            (true, _) => self.notify(BadBlockChange::Lost { ranges: ranges.to_vec(), cause: cause.to_string() }),
            (false, true) => self.notify(BadBlockChange::Unsaved),
            (false, false) => true,
        };
        if !told {
            // Nobody will write it: the caller must not wait for that.
            self.persisted(version, Err(format!("the controller of v{} is gone", self.vd_id)));
        }
        Ok(version)
    }

    /// A client wrote `[offset_bytes, offset_bytes + len_bytes)`: those bytes are good again.
    /// Where cutting a range in two would take the list past its bound, the range stays whole
    /// (its reads keep failing until it is written whole).
    pub(crate) fn rewritten(&self, offset_bytes: u64, len_bytes: u64) {
        if self.overlap(offset_bytes, len_bytes).is_none() {
            return;
        }
        let mut inner = self.lock();
        let (ranges, removed) = cut_out(&inner.ranges, offset_bytes, offset_bytes + len_bytes);
        if removed.is_empty() {
            return;
        }
        inner.ranges = ranges;
        self.bump(&mut inner);
        drop(inner);
        let _ = self.notify(BadBlockChange::Rewritten { ranges: removed });
    }

    /// Whether `version` is in the metadata: `Ready(Ok)` once it is, `Ready(Err)` if the
    /// controller could not write it; otherwise `waker` is kept and called when that changes.
    pub(crate) fn poll_durable(&self, version: u64, waker: impl FnOnce() -> RemoteWaker) -> Poll<Result<(), String>> {
        let mut inner = self.lock();
        if inner.durable_version >= version {
            return Poll::Ready(Ok(()));
        }
        if let Some((failed, reason)) = &inner.unrecorded {
            if *failed >= version {
                return Poll::Ready(Err(reason.clone()));
            }
        }
        inner.waiters.push(waker());
        Poll::Pending
    }

    /// The controller wrote the list of `version` (or could not): wakes the row jobs waiting.
    pub fn persisted(&self, version: u64, outcome: Result<(), String>) {
        let mut inner = self.lock();
        match outcome {
            Ok(()) => inner.durable_version = inner.durable_version.max(version),
            Err(reason) => inner.unrecorded = Some((version, reason)),
        }
        let waiters = std::mem::take(&mut inner.waiters);
        drop(inner);
        waiters.into_iter().for_each(RemoteWaker::wake);
    }

    /// The VD is gone: nothing will write its list any more.
    pub(crate) fn abandon(&self, reason: &str) {
        self.persisted(u64::MAX, Err(reason.to_string()));
    }

    /// A deletion was abandoned: the controller writes the list again.
    pub(crate) fn revive(&self) {
        self.lock().unrecorded = None;
    }

    fn bump(&self, inner: &mut Inner) {
        inner.version += 1;
        if self.notifier.get().is_none() {
            inner.durable_version = inner.version;
        }
        self.publish(inner);
    }

    fn publish(&self, inner: &Inner) {
        debug_assert!(is_normal(&inner.ranges), "bad-block list out of order: {:?}", inner.ranges);
        self.count.store(inner.ranges.len(), Ordering::Release);
        self.version.store(inner.version, Ordering::Release);
    }

    /// Tells the controller, if there is one; whether it could be told (true without one).
    fn notify(&self, change: BadBlockChange) -> bool {
        match self.notifier.get() {
            Some(notifier) => notifier.send(BadBlockEvent { vd_id: self.vd_id, instance_id: self.instance_id, change }).is_ok(),
            None => true,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("bad-block list poisoned")
    }
}

/// Sorted, each range non-empty, and a gap between any two.
fn is_normal(ranges: &[BadBlock]) -> bool {
    ranges.iter().all(|r| r.len_bytes > 0) && ranges.windows(2).all(|w| w[0].offset_bytes + w[0].len_bytes < w[1].offset_bytes)
}

/// Adds `range` to a normal list, merging what it overlaps or touches.
fn merge_in(ranges: &mut Vec<BadBlock>, range: BadBlock) {
    if range.len_bytes == 0 {
        return;
    }
    let mut start = range.offset_bytes;
    let mut end = range.offset_bytes + range.len_bytes;
    let first = ranges.partition_point(|r| r.offset_bytes + r.len_bytes < start);
    let mut last = first;
    while last < ranges.len() && ranges[last].offset_bytes <= end {
        start = start.min(ranges[last].offset_bytes);
        end = end.max(ranges[last].offset_bytes + ranges[last].len_bytes);
        last += 1;
    }
    ranges.splice(first..last, [BadBlock { offset_bytes: start, len_bytes: end - start }]);
    debug_assert!(is_normal(ranges));
}

/// `ranges` without `[start, end)`, and the parts removed. A range that would be cut in two
/// while the list is at its bound stays whole.
fn cut_out(ranges: &[BadBlock], start: u64, end: u64) -> (Vec<BadBlock>, Vec<BadBlock>) {
    let mut kept = Vec::with_capacity(ranges.len() + 1);
    let mut removed = Vec::new();
    for range in ranges {
        let range_end = range.offset_bytes + range.len_bytes;
        if range_end <= start || end <= range.offset_bytes {
            kept.push(*range);
            continue;
        }
        let splits = range.offset_bytes < start && end < range_end;
        if splits && ranges.len() + 1 > BAD_BLOCKS_MAX {
            kept.push(*range);
            continue;
        }
        let cut_start = range.offset_bytes.max(start);
        let cut_end = range_end.min(end);
        removed.push(BadBlock { offset_bytes: cut_start, len_bytes: cut_end - cut_start });
        if range.offset_bytes < cut_start {
            kept.push(BadBlock { offset_bytes: range.offset_bytes, len_bytes: cut_start - range.offset_bytes });
        }
        if cut_end < range_end {
            kept.push(BadBlock { offset_bytes: cut_end, len_bytes: range_end - cut_end });
        }
    }
    (kept, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(offset_bytes: u64, len_bytes: u64) -> BadBlock {
        BadBlock { offset_bytes, len_bytes }
    }

    #[test]
    fn ranges_merge_when_they_overlap_or_touch_and_stay_apart_otherwise() {
        let list = BadBlocks::new(0, 0);
        list.record_lost(&[block(4096, 4096), block(16384, 4096)], "test").unwrap();
        list.record_lost(&[block(8192, 4096)], "test").unwrap();
        assert_eq!(list.ranges(), vec![block(4096, 8192), block(16384, 4096)]);
        list.record_lost(&[block(0, 20480)], "test").unwrap();
        assert_eq!(list.ranges(), vec![block(0, 20480)]);
        assert_eq!(list.overlap(20480, 512), None);
        assert_eq!(list.overlap(20479 - 511, 512), Some(block(0, 20480)));
    }

    #[test]
    fn a_write_removes_exactly_what_it_covers() {
        let list = BadBlocks::new(0, 0);
        list.load(&[block(0, 65536), block(131072, 4096)]);
        let before = list.version();
        list.rewritten(4096, 8192);
        assert_eq!(list.ranges(), vec![block(0, 4096), block(12288, 53248), block(131072, 4096)]);
        assert!(list.version() > before, "a reader sees the change");
        list.rewritten(0, 200_000);
        assert!(list.is_empty());
        assert_eq!(list.overlap(0, 1 << 30), None);
    }

    #[test]
    fn the_bound_refuses_a_new_loss_and_keeps_a_range_whole_rather_than_split_it() {
        let list = BadBlocks::new(3, 0);
        let full: Vec<BadBlock> = (0..BAD_BLOCKS_MAX as u64).map(|i| block(i * 8192, 4096)).collect();
        list.record_lost(&full, "test").unwrap();
        let refused = list.record_lost(&[block(1 << 40, 4096)], "test").unwrap_err();
        assert_eq!(refused, "the bad-block list of v3 holds its maximum of 1024 ranges");
        assert_eq!(list.ranges(), full, "a refused loss changes nothing");
        // Merging needs no new entry (this one joins two into one), so it is still recorded.
        list.record_lost(&[block(4096, 4096)], "test").unwrap();
        assert_eq!((list.ranges()[0], list.ranges().len()), (block(0, 12288), BAD_BLOCKS_MAX - 1));
        list.record_lost(&[block(1 << 40, 4096)], "test").unwrap();
        list.rewritten(4096, 512);
        assert_eq!(list.ranges()[0], block(0, 12288), "cutting it in two would pass the bound");
        list.rewritten(0, 12288);
        assert_eq!(list.ranges().len(), BAD_BLOCKS_MAX - 1);
    }

    #[test]
    fn without_a_controller_a_loss_is_durable_at_once_and_with_one_only_when_written() {
        let alone = BadBlocks::new(0, 0);
        let version = alone.record_lost(&[block(0, 4096)], "test").unwrap();
        assert!(matches!(alone.poll_durable(version, || unreachable!("no wait")), Poll::Ready(Ok(()))));

        let managed = BadBlocks::new(0, 7);
        let (sender, receiver) = crossbeam_channel::unbounded();
        managed.set_notifier(sender);
        let version = managed.record_lost(&[block(0, 4096)], "rebuild").unwrap();
        let event = receiver.try_recv().unwrap();
        assert_eq!(event.instance_id, 7);
        assert_eq!(event.change, BadBlockChange::Lost { ranges: vec![block(0, 4096)], cause: "rebuild".into() });
        managed.persisted(version, Err("disk full".into()));
        assert!(matches!(managed.poll_durable(version, || unreachable!()), Poll::Ready(Err(reason)) if reason == "disk full"));
        // Recording the same loss again asks for the write again.
        assert_eq!(managed.record_lost(&[block(0, 4096)], "rebuild"), Ok(version));
        assert_eq!(receiver.try_recv().unwrap().change, BadBlockChange::Unsaved);
        managed.persisted(version, Ok(()));
        assert!(matches!(managed.poll_durable(version, || unreachable!()), Poll::Ready(Ok(()))));
    }
}
