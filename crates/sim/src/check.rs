//! Consistency checks while clients write, as `start cc` runs them: a run of rows checked in
//! repair mode at a random moment, its outcome settled when it arrives.
//!
//! A VD that is whole, carries no injected faults and has no region awaiting a resync is
//! consistent in every row at every moment (each write holds its row's lock), so every row the
//! check reports must be consistent: a mismatch means the engine left a row inconsistent, and a
//! "repair" there could rewrite good data.

use crate::run::Sim;
use engine::{CheckMode, CheckOutcome, VdError, VdState};
use rand::Rng;
use std::cell::RefCell;
use std::rc::Rc;

/// The longest run one check job covers here (the controller's runs are a shard's stride).
const CHECK_RUN_ROWS_MAX: u64 = 6;

/// Where a check job's results arrive.
type CheckOutcomes = Rc<RefCell<Option<Vec<Result<CheckOutcome, VdError>>>>>;

/// A check job in flight.
pub(crate) struct Check {
    first_row: u64,
    /// Faults injected when it was queued: one injected since excuses a member error.
    faults_at_start: usize,
    outcome: CheckOutcomes,
}

impl Sim {
    /// Settles the check in flight if it arrived; sometimes queues the next one.
    pub(crate) fn check_some(&mut self) -> Result<(), String> {
        if let Some(check) = &self.check {
            let arrived = check.outcome.borrow_mut().take();
            let Some(results) = arrived else { return Ok(()) };
            let check = self.check.take().expect("checked above");
            self.settle_check(&check, results)?;
        }
        if self.rng.gen_range(0..100) < 4 && self.may_check() {
            let row_count = self.vd.geometry().row_count();
            let run_rows = self.rng.gen_range(1..=CHECK_RUN_ROWS_MAX).min(row_count);
            let first_row = self.rng.gen_range(0..=row_count - run_rows);
            let outcome: CheckOutcomes = Rc::new(RefCell::new(None));
            let filled = Rc::clone(&outcome);
            self.engine.check_rows(&self.vd, first_row, run_rows, CheckMode::Repair, move |results| *filled.borrow_mut() = Some(results));
            self.check = Some(Check { first_row, faults_at_start: self.faults.len(), outcome });
        }
        Ok(())
    }

    /// Waits for the check in flight, if any, and settles it.
    pub(crate) fn finish_check(&mut self) -> Result<(), String> {
        let Some(check) = self.check.take() else { return Ok(()) };
        self.engine.run_until_idle();
        let results = check.outcome.borrow_mut().take().expect("a queued check completes once the engine is idle");
        self.settle_check(&check, results)
    }

    /// Whole, without injected faults, nothing to resync, no other background job.
    fn may_check(&self) -> bool {
        self.check.is_none()
            && self.vd.geometry().span_kind() != layout::SpanKind::Stripe
            && self.vd.state() == VdState::Optimal
            && !self.at_risk.iter().any(|&at_risk| at_risk)
            && self.vd.write_intent().is_some_and(|intent| intent.unsynced_count() == 0)
            && self.rebuild.is_none()
    }

    fn settle_check(&mut self, check: &Check, results: Vec<Result<CheckOutcome, VdError>>) -> Result<(), String> {
        let faulted = self.faults.len() > check.faults_at_start;
        for (row, result) in (check.first_row..).zip(results) {
            match result {
                Ok(outcome) if outcome.is_consistent() => {}
                Ok(outcome) => return Err(format!("a check of a whole VD found row {row} inconsistent: {:?}", outcome.mismatches)),
                Err(VdError::RowMemberOut { .. } | VdError::RowMemberIo { .. } | VdError::Offline { .. }) if faulted => {}
                Err(error) => return Err(format!("a check of row {row} failed: {error}")),
            }
        }
        self.checks_settled += 1;
        Ok(())
    }
}
