//! Copyback and proactive replacement in the simulator: a member in service is copied to a new
//! drive while client I/O runs (every write and flush of the member goes to the target too, and
//! the rows are copied in order under their locks), and the target then takes its place, as the
//! controller's copy does (`controller/copyback.rs`).
//!
//! Across a power cut the copy resumes as the controller's does: at its checkpoint (rows below
//! it were flushed on the target), or lower, at the first region the crash left unsynced (a
//! write there may have reached the member and not the target, and a resync repairs members
//! only). The copy is flushed before the target takes the member's place.
//!
//! What proves it: the consistency check right after the switch and the degraded reads after
//! it find a row the target lacks.

use crate::drive::flush_now;
use crate::run::{Sim, SimDrive};
use drive::Drive;
use engine::{MemberState, VdError};
use rand::Rng;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// A copy of a member to a new drive, one row job at a time.
pub(crate) struct Copy {
    pub member: usize,
    pub target: SimDrive,
    /// Rows below it are copied.
    pub next_row: u64,
    /// Rows below it were copied and flushed on the target before it was recorded.
    pub checkpoint_row: u64,
    pub in_flight: bool,
    pub outcome: Rc<RefCell<Option<Result<(), VdError>>>>,
}

impl Sim {
    /// Starts copying a member without faults to a blank drive, while nothing else is being
    /// rebuilt or waits for a re-add.
    pub(crate) fn start_copy(&mut self) {
        if self.rebuild.is_some() || self.out_for_re_add.is_some() || self.copy.is_some() {
            return;
        }
        let online = |m: usize| self.vd.member(m).state() == MemberState::Online;
        let Some(member) = (0..self.config.drive_count).find(|&m| !self.at_risk[m] && online(m)) else { return };
        let target = SimDrive::blank(self.drives[member].cache.info().capacity_bytes);
        self.vd.start_copy(member, Arc::clone(&target.faulty) as Arc<dyn Drive>);
        self.faults.push(format!("member {member} copied to a new drive"));
        let outcome = Rc::new(RefCell::new(None));
        self.copy = Some(Copy { member, target, next_row: 0, checkpoint_row: 0, in_flight: false, outcome });
    }

    /// Settles the copy's row job if it finished, sometimes checkpoints, and sometimes submits
    /// the next row; switches the member to the target once every row is copied.
    pub(crate) fn copy_some(&mut self) -> Result<(), String> {
        let Some(copy) = &mut self.copy else { return Ok(()) };
        let arrived = copy.outcome.borrow_mut().take();
        if let Some(result) = arrived {
            copy.in_flight = false;
            if !self.settle_copied_row(result)? {
                return Ok(());
            }
            if self.rng.gen_bool(0.5) {
                self.checkpoint_copy();
            }
        }
        let copy = self.copy.as_mut().expect("a copy runs");
        if copy.in_flight || !self.rng.gen_bool(0.5) {
            return Ok(());
        }
        if copy.next_row >= self.vd.geometry().row_count() {
            return self.switch_to_copy();
        }
        let (row, member, outcome) = (copy.next_row, copy.member, Rc::clone(&copy.outcome));
        copy.in_flight = true;
        self.engine.copy_row(&self.vd, row, member, move |result| *outcome.borrow_mut() = Some(result));
        Ok(())
    }

    /// Copies the rows left and switches (the end of the workload).
    pub(crate) fn finish_copy(&mut self) -> Result<(), String> {
        if self.copy.is_none() {
            return Ok(());
        }
        self.engine.run_until_idle();
        let arrived = self.copy.as_ref().and_then(|copy| copy.outcome.borrow_mut().take());
        if let Some(result) = arrived {
            if !self.settle_copied_row(result)? {
                return Ok(());
            }
        }
        while let Some(copy) = self.copy.as_ref().filter(|copy| copy.next_row < self.vd.geometry().row_count()) {
            let (row, member) = (copy.next_row, copy.member);
            let result = self.engine.run_copy_row(&self.vd, row, member);
            if !self.settle_copied_row(result)? {
                return Ok(());
            }
        }
        self.switch_to_copy()
    }

    /// Books one copied row. Returns whether the copy goes on: it is abandoned (the target
    /// dropped) when the member left service or a row could not be read nor rebuilt, which
    /// only injected faults may cause.
    fn settle_copied_row(&mut self, result: Result<(), VdError>) -> Result<bool, String> {
        let copy = self.copy.as_mut().expect("a copy runs");
        match result {
            Ok(()) => {
                copy.next_row += 1;
                Ok(true)
            }
            Err(
                VdError::CopyEnded { .. } | VdError::RowUnrecoverable { .. } | VdError::RowMemberIo { .. } | VdError::RowNotResynced { .. },
            ) if self.faults.len() > 1 || self.vd.member(copy.member).state() != MemberState::Online => {
                self.abandon_copy();
                Ok(false)
            }
            Err(error) => Err(format!("copy of member {} failed at row {}: {error}", copy.member, copy.next_row)),
        }
    }

    fn abandon_copy(&mut self) {
        let copy = self.copy.take().expect("a copy runs");
        self.vd.end_copy(copy.member);
        self.faults.push(format!("copy of member {} abandoned at row {}", copy.member, copy.next_row));
    }

    /// Records the copy's progress as the controller does, after flushing the target.
    fn checkpoint_copy(&mut self) {
        let Some(copy) = &mut self.copy else { return };
        if flush_now(&*copy.target.faulty).is_ok() {
            copy.checkpoint_row = copy.next_row;
        }
    }

    /// Every row is copied: the target is flushed, then takes the member's place (recorded by
    /// the controller before the switch), and the old drive leaves.
    fn switch_to_copy(&mut self) -> Result<(), String> {
        let copy = self.copy.take().expect("a copy runs");
        let member = copy.member;
        if self.vd.member(member).state() != MemberState::Online {
            self.vd.end_copy(member);
            return Ok(());
        }
        flush_now(&*copy.target.faulty).map_err(|e| format!("flushing the copy of member {member}: {e}"))?;
        self.vd.finish_copy(member);
        self.drives[member] = copy.target;
        self.members_copied += 1;
        self.check_every_row().map_err(|problem| format!("right after member {member} switched to its copy: {problem}"))
    }

    /// After a restart (the bitmap open, before its resync): the copy resumes at its checkpoint
    /// or at the first unsynced region below it.
    pub(crate) fn resume_copy(&mut self) {
        let Some(copy) = &mut self.copy else { return };
        if self.vd.member(copy.member).state() != MemberState::Online {
            // Out of service at the restart: the copy ends (the controller makes the target its
            // rebuild; here it is simply dropped).
            let member = copy.member;
            self.copy = None;
            self.faults.push(format!("copy of member {member} ended: the member is out of service"));
            return;
        }
        let first_unsynced = self
            .vd
            .write_intent()
            .and_then(|intent| intent.unsynced_regions().ones().next().map(|region| intent.regions.rows_of(region).start));
        copy.next_row = first_unsynced.map_or(copy.checkpoint_row, |row| row.min(copy.checkpoint_row));
        copy.checkpoint_row = copy.next_row;
        copy.in_flight = false;
        copy.outcome = Rc::new(RefCell::new(None));
        self.vd.start_copy(copy.member, Arc::clone(&copy.target.faulty) as Arc<dyn Drive>);
    }
}
