//! Re-add in the simulator: a member taken out of service (as `set offline` does) comes back
//! with its own drive, and only the bitmap regions written while it was out are rebuilt on it,
//! as the controller's `set online` does (`controller/resync.rs`). A member out since before a
//! crash is rebuilt whole: what was noted in memory about its missed writes died with the
//! crash. A rebuild interrupted by a crash resumes whole from its checkpoint, as the
//! controller's does.
//!
//! What proves it: the rows a re-add skips must already hold what the other members say, so the
//! consistency check at the end of every rebuild (and every degraded read afterwards) finds a
//! region the bitmap forgot.

use crate::rebuild::Rebuild;
use crate::run::Sim;
use engine::bitmap::Bits;
use engine::MemberState;
use std::cell::RefCell;
use std::rc::Rc;

impl Rebuild {
    pub(crate) fn new(member: usize, only_regions: Option<Bits>, re_add: bool) -> Rebuild {
        let outcome = Rc::new(RefCell::new(None));
        Rebuild {
            member,
            next_row: 0,
            checkpoint_row: 0,
            in_flight: false,
            outcome,
            unrecoverable: false,
            only_regions,
            re_add,
            reads_at_start: 0,
            unsynced_at_submit: Vec::new(),
        }
    }
}

impl Sim {
    /// Takes a member that the VD can spare out of service, keeping its drive for the re-add.
    pub(crate) fn take_out_for_re_add(&mut self) {
        if self.rebuild.is_some() || self.out_for_re_add.is_some() || self.copy.is_some() {
            return;
        }
        let Some(member) = self.member_to_spare() else { return };
        self.at_risk[member] = true;
        self.vd.set_member_state(member, MemberState::Failed);
        // As the controller settles the bitmap when a member leaves: idle regions are cleared
        // now and noted as written while degraded.
        if self.vd.write_intent().is_some() {
            self.engine.clean_write_intent(&self.vd, true, |_| {});
        }
        self.faults.push(format!("member {member} taken out, to be re-added"));
        self.out_for_re_add = Some(member);
    }

    /// Brings the member taken out back: a rebuild of the regions it missed, or of every row.
    pub(crate) fn re_add(&mut self) {
        let Some(member) = self.out_for_re_add.take() else { return };
        if self.rebuild.is_some() || self.vd.member(member).state() != MemberState::Failed {
            return;
        }
        let intent = self.vd.write_intent().expect("a redundant level has a bitmap");
        let only_regions = intent.knows_missed_regions_of(member).then(|| intent.dirty_regions());
        let what = match &only_regions {
            Some(regions) => format!("{} of {} regions", regions.count(), intent.regions.region_count),
            None => "every row: out since before a crash".to_string(),
        };
        self.faults.push(format!("member {member} re-added, {what} rebuilt"));
        self.vd.start_rebuild(member, self.vd.member(member).drive());
        // As the controller's rebuild thread does before its first write: no row image of a
        // write this member missed may be replayed onto what the rebuild puts there. (A member
        // flush may fail under injected faults; the rebuild goes on, as the controller's does.)
        let _ = self.engine.run_images_to_head();
        let mut rebuild = Rebuild::new(member, only_regions, true);
        rebuild.reads_at_start = self.drives[member].cache.data_reads();
        self.rebuild = Some(rebuild);
    }

    /// The next run of rows the rebuild must do: from its next row on, skipping rows outside
    /// its regions (a re-add), at most `run_rows_max` rows, all inside its regions. Moves the
    /// rebuild's next row to the run's first. `None` when no row is left.
    pub(crate) fn next_run(&mut self, run_rows_max: u64) -> Option<(u64, u64)> {
        let row_count = self.vd.geometry().row_count();
        let regions = self.vd.write_intent().map(|intent| intent.regions);
        let rebuild = self.rebuild.as_mut().expect("a rebuild runs");
        let wanted = |row: u64| match (&rebuild.only_regions, &regions) {
            (Some(bits), Some(regions)) => bits.get(regions.region_of(row)),
            _ => true,
        };
        let first = (rebuild.next_row..row_count).find(|&row| wanted(row))?;
        let count = (first..row_count.min(first + run_rows_max)).take_while(|&row| wanted(row)).count() as u64;
        rebuild.next_row = first;
        Some((first, count))
    }
}
