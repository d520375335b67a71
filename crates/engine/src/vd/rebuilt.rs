//! Reading a member while it is rebuilt, below the rebuild's clean watermark.
//!
//! A member being rebuilt is written by every client write, so a row the rebuild has passed
//! stays current from then on: it may be read like an online member's (md's `recovery_offset`).
//! Client reads of those rows then go straight to the member instead of reconstructing its
//! strips from every other member of the row, which is what costs a degraded RAID5/6 most of its
//! read IOPS while it rebuilds.
//!
//! The rebuild publishes how far it got, `rows`: every row below is rebuilt and none of them is a
//! row it had to leave as it was (those stay unreadable through the member until it is done).
//! A rebuild that ended (its target failed) and a new one onto another drive must not mix:
//! [`VirtualDrive::start_rebuild`] begins a new epoch at row 0, and a rebuild publishes only under
//! the epoch it started with. Nothing here is persistent: after a restart the rebuild resumes at
//! its checkpoint and publishes again from there.

use super::{MemberSet, MemberState, VirtualDrive};
use std::sync::atomic::{AtomicU64, Ordering};

const ROWS_BITS: u32 = 48;
const ROWS_MASK: u64 = (1 << ROWS_BITS) - 1;

/// A rebuild's epoch (upper 16 bits) and the rows below which it made the member current.
#[derive(Default)]
pub(super) struct RebuiltRows(AtomicU64);

impl RebuiltRows {
    fn epoch(&self) -> u16 {
        (self.0.load(Ordering::Acquire) >> ROWS_BITS) as u16
    }

    fn rows(&self) -> u64 {
        self.0.load(Ordering::Acquire) & ROWS_MASK
    }

    /// A new rebuild begins: nothing is current yet. Returns its epoch.
    pub(super) fn begin(&self) -> u16 {
        let epoch = self.epoch().wrapping_add(1);
        self.0.store(u64::from(epoch) << ROWS_BITS, Ordering::Release);
        epoch
    }

    /// Rows below `rows` are current, if the rebuild of `epoch` still owns the member. Only ever
    /// moves up: a rebuild stopped and started again resumes at its checkpoint, below what it
    /// published, and the rows in between stayed current (clients kept writing them).
    fn advance(&self, epoch: u16, rows: u64) {
        assert!(rows <= ROWS_MASK, "row {rows} does not fit the rebuilt-rows word");
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
            let (word_epoch, word_rows) = ((word >> ROWS_BITS) as u16, word & ROWS_MASK);
            (word_epoch == epoch && rows > word_rows).then_some((u64::from(epoch) << ROWS_BITS) | rows)
        });
    }
}

impl VirtualDrive {
    /// The epoch of the rebuild that owns member `index` now (see the module docs). A rebuild
    /// takes it when it starts, with the member already `Rebuilding`.
    pub fn rebuild_epoch(&self, index: usize) -> u16 {
        self.members[index].rebuilt.epoch()
    }

    /// The rebuild of `epoch` made every row of member `index` below `rows` current: client
    /// reads of those rows may read the member. Ignored if another rebuild owns it by now.
    pub fn rebuild_advanced(&self, index: usize, epoch: u16, rows: u64) {
        assert!(rows <= self.geometry.row_count(), "v{}: rebuilt rows {rows} past the end", self.id);
        self.members[index].rebuilt.advance(epoch, rows);
    }

    /// Rows below this one of member `index` may be read (all of them when it is online).
    pub fn readable_rows(&self, index: usize) -> u64 {
        let member = &self.members[index];
        match member.state() {
            MemberState::Online => self.geometry.row_count(),
            MemberState::Rebuilding => member.rebuilt.rows(),
            MemberState::Failed | MemberState::Missing => 0,
        }
    }

    /// Members that must not be read for `row` by a client I/O: [`VirtualDrive::unavailable`],
    /// less a member being rebuilt whose rebuild has passed the row. Background row jobs keep
    /// `unavailable`: a rebuild reconstructs its targets, a check proves whole rows.
    pub(crate) fn unavailable_for_read(&self, row: u64) -> MemberSet {
        let mut set = MemberSet::default();
        for index in 0..self.members.len() {
            if row >= self.readable_rows(index) {
                set.insert(index);
            }
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_only_within_its_epoch_and_only_up() {
        let rows = RebuiltRows::default();
        let first = rows.begin();
        rows.advance(first, 10);
        rows.advance(first, 4);
        assert_eq!(rows.rows(), 10, "never moves down");
        let second = rows.begin();
        assert_ne!(first, second);
        assert_eq!(rows.rows(), 0, "a new rebuild starts with nothing current");
        rows.advance(first, 20);
        assert_eq!(rows.rows(), 0, "the ended rebuild's progress does not count for the new one");
        rows.advance(second, 3);
        assert_eq!(rows.rows(), 3);
    }

    #[test]
    fn the_epoch_wraps() {
        let rows = RebuiltRows(AtomicU64::new(u64::from(u16::MAX) << ROWS_BITS | 7));
        let epoch = rows.begin();
        assert_eq!(epoch, 0);
        rows.advance(epoch, 1);
        assert_eq!(rows.rows(), 1);
    }
}
