//! A member rebuilt onto a blank drive while the workload runs: started when the VD can spare
//! a member, run a few rows at a time beside the clients, checkpointed, finished at the end of
//! the run, and checked row by row against the model at once. Re-adds (`readd`) use the same
//! `Rebuild` over the regions the member missed.

use crate::drive::flush_now;
use crate::run::{Sim, SimDrive};
use drive::Drive;
use engine::bitmap::Bits;
use engine::{MemberSet, MemberState, VdError};
use rand::Rng;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Each row's outcome of a run job, once it arrived (shared with the job's completion).
pub type RowOutcomes = Rc<RefCell<Option<Vec<Result<(), VdError>>>>>;

/// The longest run of rows one rebuild job covers here (the controller's runs are a shard's
/// stride of rows; a few rows already make member I/Os merge across rows).
const RUN_ROWS_MAX: u64 = 4;

/// A member being rebuilt onto a blank drive while the workload runs.
pub(crate) struct Rebuild {
    pub member: usize,
    /// The next row to rebuild; rows below it are done.
    pub next_row: u64,
    /// Rows below it are done and were flushed before it was recorded: a restart resumes here.
    pub checkpoint_row: u64,
    /// A job over a run of rows in flight (one at a time), and the outcome of each of its rows
    /// once it arrived.
    pub in_flight: bool,
    pub outcome: RowOutcomes,
    /// A row that could not be rebuilt (its sources hit injected read errors): the member then
    /// never returns to service.
    pub unrecoverable: bool,
    /// A re-add: the member's own drive came back, and only the rows of these bitmap regions
    /// are rebuilt (`None`: every row).
    pub only_regions: Option<Bits>,
    pub re_add: bool,
    /// Reads the member's drive had served when the rebuild began: the rebuild itself never
    /// reads its target, so any read after is a client's, of a row the rebuild had passed.
    pub reads_at_start: u64,
    /// Rows of the run in flight whose region was unsynced when it was submitted: the rebuild
    /// may refuse them even if a BGI job that was in flight then has synced the region since.
    pub unsynced_at_submit: Vec<u64>,
}

impl Sim {
    /// Replaces a member that the VD can spare by a blank drive and starts rebuilding it.
    pub(crate) fn start_rebuild(&mut self) {
        if self.copy.is_some() {
            return;
        }
        let Some(member) = self.member_to_spare() else { return };
        self.at_risk[member] = true;
        self.drives[member] = SimDrive::blank(self.drives[member].cache.info().capacity_bytes);
        // Out of service first (no I/O may be on its way to the old drive), then the new one.
        self.vd.set_member_state(member, MemberState::Failed);
        self.vd.start_rebuild(member, Arc::clone(&self.drives[member].faulty) as Arc<dyn Drive>);
        // Row images of writes the old drive took must not be replayed onto the new one's
        // rebuilt rows (see `readd.rs`).
        let _ = self.engine.run_images_to_head();
        self.faults.push(format!("member {member} replaced by a blank drive and rebuilt"));
        self.rebuild = Some(Rebuild::new(member, None, false));
        // The drive is new: every read of it from now on is a client read of a rebuilt row.
    }

    /// A member without faults that the VD can spare on top of those at risk.
    pub(crate) fn member_to_spare(&self) -> Option<usize> {
        (0..self.config.drive_count).filter(|&m| !self.at_risk[m]).find(|&m| {
            let mut with = self.at_risk.clone();
            with[m] = true;
            self.vd.geometry().survives(&with)
        })
    }

    /// Settles the rebuild's row job if it finished, sometimes checkpoints, and sometimes
    /// submits the next row; returns the member to service once every row is done.
    pub(crate) fn rebuild_some(&mut self) -> Result<(), String> {
        let Some(rebuild) = &mut self.rebuild else { return Ok(()) };
        let arrived = rebuild.outcome.borrow_mut().take();
        if let Some(results) = arrived {
            rebuild.in_flight = false;
            self.settle_rebuilt_rows(results)?;
            if self.rng.gen_bool(0.5) {
                self.checkpoint_rebuild();
            }
        }
        let rebuild = self.rebuild.as_mut().expect("checked above");
        if rebuild.in_flight || !self.rng.gen_bool(0.5) {
            return Ok(());
        }
        let run_rows_max = self.rng.gen_range(1..=RUN_ROWS_MAX);
        let Some((row, run_rows)) = self.next_run(run_rows_max) else { return self.end_rebuild() };
        let unsynced_at_submit = (row..row + run_rows).filter(|&r| self.row_unsynced(r)).collect();
        let rebuild = self.rebuild.as_mut().expect("checked above");
        let (targets, outcome) = (MemberSet::of(&[rebuild.member]), Rc::clone(&rebuild.outcome));
        rebuild.in_flight = true;
        rebuild.unsynced_at_submit = unsynced_at_submit;
        // Runs of several rows, as the controller submits them, where member I/Os merge.
        self.engine.rebuild_rows(&self.vd, row, run_rows, targets, move |results| *outcome.borrow_mut() = Some(results));
        Ok(())
    }

    /// Records the rebuild's progress as the controller does, but only after flushing the new
    /// drive: a row counts as done across a power cut only once it is durable.
    fn checkpoint_rebuild(&mut self) {
        let Some(rebuild) = &mut self.rebuild else { return };
        if flush_now(&*self.drives[rebuild.member].faulty).is_ok() {
            rebuild.checkpoint_row = rebuild.next_row;
        }
    }

    /// Rebuilds the rows left, then returns the member to service if every row was rebuilt.
    pub(crate) fn finish_rebuild(&mut self) -> Result<(), String> {
        if self.rebuild.is_none() {
            return Ok(());
        }
        self.engine.run_until_idle();
        let rebuild = self.rebuild.as_ref().expect("checked above");
        let (member, arrived) = (rebuild.member, rebuild.outcome.borrow_mut().take());
        if let Some(results) = arrived {
            self.settle_rebuilt_rows(results)?;
        }
        let targets = MemberSet::of(&[member]);
        while let Some((row, run_rows)) = self.next_run(RUN_ROWS_MAX) {
            let results = self.engine.run_rebuild_rows(&self.vd, row, run_rows, targets);
            self.settle_rebuilt_rows(results)?;
        }
        self.end_rebuild()
    }

    /// Books the rows of a run, in order, from the rebuild's next row.
    fn settle_rebuilt_rows(&mut self, results: Vec<Result<(), VdError>>) -> Result<(), String> {
        for result in results {
            let unsynced =
                self.rebuild.as_ref().is_some_and(|r| self.row_unsynced(r.next_row) || r.unsynced_at_submit.contains(&r.next_row));
            let rebuild = self.rebuild.as_mut().expect("a rebuild runs");
            settle_row(rebuild, result, &self.faults, unsynced)?;
        }
        // As the controller publishes its clean watermark: client reads may now read the
        // rebuilt rows of the member, which the model checks like every other read.
        let rebuild = self.rebuild.as_ref().expect("a rebuild runs");
        if !rebuild.unrecoverable {
            let member = rebuild.member;
            self.vd.rebuild_advanced(member, self.vd.rebuild_epoch(member), rebuild.next_row);
        }
        Ok(())
    }

    /// Every row is rebuilt: flushed, then in service (as the controller records `Onln` only
    /// after the rows are durable). A member with rows that could not be rebuilt stays out.
    fn end_rebuild(&mut self) -> Result<(), String> {
        let rebuild = self.rebuild.take().expect("a rebuild runs");
        let member = rebuild.member;
        if rebuild.unrecoverable || self.vd.member(member).state() != MemberState::Rebuilding {
            return Ok(());
        }
        if self.drives[member].cache.data_reads() > rebuild.reads_at_start {
            self.members_read_in_rebuild += 1;
        }
        flush_now(&*self.drives[member].faulty).map_err(|e| format!("flushing rebuilt member {member}: {e}"))?;
        self.vd.finish_rebuild(member);
        match rebuild.re_add {
            true => self.members_re_added += 1,
            false => self.members_rebuilt += 1,
        }
        // The blank drive has no injected faults: it is as good as new.
        self.at_risk[member] = false;
        // As the controller does once every member is in service again: regions a crash left
        // unsynced for want of this member are resynced now.
        if self.vd.write_intent().is_some_and(|intent| intent.unsynced_count() > 0) {
            crate::crash::resync(&mut self.engine, &self.vd);
        }
        // Checked at once: later client writes could cover a row the rebuild got wrong.
        self.check_every_row().map_err(|problem| format!("right after member {member} was rebuilt: {problem}"))
    }
}

/// Books one rebuilt row: done, or not rebuildable because injected read errors took the only
/// other copy (allowed only when such faults were injected) or because the row is `unsynced`
/// (its parity may be stale after a crash: nothing is reconstructed from it), or a failure of
/// the run.
fn settle_row(rebuild: &mut Rebuild, result: Result<(), VdError>, faults: &[String], unsynced: bool) -> Result<(), String> {
    let row = rebuild.next_row;
    rebuild.next_row += 1;
    match result {
        Ok(()) => Ok(()),
        Err(VdError::RowUnrecoverable { .. } | VdError::RowMemberIo { .. } | VdError::RowNotResynced { .. })
            if faults.len() > 1 || unsynced =>
        {
            rebuild.unrecoverable = true;
            Ok(())
        }
        Err(error) => Err(format!("rebuild of member {} failed at row {row}: {error}", rebuild.member)),
    }
}
