//! The verification after each restart and at the end of a run: every row's redundancy
//! checked (report only), the whole VD read back per the model, then read again with each
//! member that can be spared taken out.

use crate::run::{ReadProblem, Sim};
use engine::{CheckMode, MemberState, VdError};
use std::ops::Range;

impl Sim {
    /// Checks every row's redundancy (report only), reads the whole VD, then reads it again
    /// with each member that can still be spared taken out: parity or a mirror copy that was
    /// written wrong cannot hide behind a healthy member.
    pub fn verify_everything(&mut self) -> Result<(), String> {
        self.settle_floating();
        if std::env::var_os("STORC_SIM_TRACE").is_some() {
            let states: Vec<String> = self.vd.members().iter().map(|m| format!("{:?}", m.state())).collect();
            eprintln!("  members before verification: {states:?}");
        }
        self.check_every_row()?;
        self.read_all("whole read")?;
        for member in 0..self.config.drive_count {
            let mut with = self.at_risk.clone();
            if with[member] {
                continue;
            }
            with[member] = true;
            if !self.vd.geometry().survives(&with) {
                continue;
            }
            self.vd.set_member_state(member, MemberState::Failed);
            self.read_all(&format!("read without member {member}"))?;
            // Nothing was written meanwhile, so the member's contents are still current.
            self.vd.set_member_state(member, MemberState::Online);
        }
        Ok(())
    }

    /// A consistency check of every row in report mode: rows that cannot be checked (a member
    /// out of service, an injected read error, no redundancy) are skipped, and so are rows of a
    /// region not yet initialized (a BGI pending): nothing claims those consistent yet.
    pub(crate) fn check_every_row(&mut self) -> Result<(), String> {
        for row in 0..self.vd.geometry().row_count() {
            if self.row_unsynced(row) {
                continue;
            }
            match self.engine.run_check_row(&self.vd, row, CheckMode::Report) {
                Ok(outcome) if outcome.is_consistent() => {}
                Ok(outcome) => return Err(format!("consistency check: row {row} is inconsistent: {:?}", outcome.mismatches)),
                Err(VdError::NoRedundancy { .. } | VdError::RowMemberOut { .. } | VdError::RowMemberIo { .. }) => {}
                Err(error) => return Err(format!("consistency check of row {row}: {error}")),
            }
        }
        Ok(())
    }

    /// Reads the whole VD: in one request while nothing awaits a resync, else row by row, and a
    /// row refused (correctly: it needs stale parity) strip by strip, so that every strip that
    /// needs no parity is still read and checked.
    fn read_all(&mut self, what: &str) -> Result<(), String> {
        if self.vd.write_intent().is_none_or(|intent| intent.unsynced_count() == 0) {
            let capacity = self.model.capacity_bytes();
            return self.read_checked(0..capacity).map_err(|problem| format!("{what}: {problem}"));
        }
        let row_bytes = self.vd.geometry().row_data_bytes();
        for row in 0..self.vd.geometry().row_count() {
            match self.read_checked(row * row_bytes..(row + 1) * row_bytes) {
                Err(ReadProblem::Refused) if self.refusal_is_correct(row, None) => self.read_strips(row)?,
                Err(problem) => return Err(format!("{what}, row {row}: {problem}")),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// The rows of `range` whose refusal would be right now.
    pub(crate) fn refusable_rows(&self, range: &Range<u64>) -> Vec<u64> {
        let row_bytes = self.vd.geometry().row_data_bytes();
        // A member may fail while the read is in flight (faults are injected between steps),
        // so an unsynced parity row may be refused even if nothing lacked when it was submitted.
        let parity = matches!(self.vd.geometry().span_kind(), layout::SpanKind::Parity | layout::SpanKind::DoubleParity);
        (range.start / row_bytes..range.end.div_ceil(row_bytes))
            .filter(|&row| self.refusal_is_correct(row, None) || (parity && self.row_unsynced(row)))
            .collect()
    }

    /// Reads row `row` one data strip at a time: only strips whose member lacks may be refused.
    fn read_strips(&mut self, row: u64) -> Result<(), String> {
        let (row_bytes, strip_bytes) = (self.vd.geometry().row_data_bytes(), self.config.strip_size_bytes);
        let map = self.vd.geometry().row_map(row);
        for strip in 0..map.data_strip_count() {
            let start = row * row_bytes + strip as u64 * strip_bytes;
            match self.read_checked(start..start + strip_bytes) {
                Err(ReadProblem::Refused) if self.refusal_is_correct(row, Some(&[map.data_copy(strip, 0).drive])) => {}
                Err(problem) => return Err(format!("row {row} strip {strip}: {problem}")),
                Ok(()) => {}
            }
        }
        Ok(())
    }
}
