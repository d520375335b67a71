//! Power cuts and restarts.
//!
//! At a seeded operation the power fails: requests in flight are abandoned with the engine,
//! every drive loses, keeps or tears its unflushed writes ([`crate::drive`]), and the
//! controller's part is played again from the drives alone: a new VD over the same drives with
//! the member states the configuration recorded (failed members stay failed, a drive that
//! vanished comes back missing, a member being rebuilt resumes from its last checkpoint), then
//! the resync, then a consistency check and a read of everything, whole and degraded.
//!
//! # Which crashes may tear rows
//! The restart reopens the write-intent bitmap ([`crate::intent`]) and resyncs only its dirty
//! regions. A torn parity row that lacks a member cannot be resynced (the write hole, which
//! only a journal closes): its region stays unsynced and reads that need its parity are
//! refused, which the oracle accepts there. So at parity levels the power fails with client
//! writes unflushed in any state. A mirror row that cannot be resynced is different: its
//! copies may disagree, and reads switch copies once copy 0 is gone, so a sector already read
//! could change; there the writes are first drained and flushed.

use crate::drive::CrashTally;
use crate::intent;
use crate::run::Sim;
use engine::{CheckMode, CompletionOrder, LocalEngine, MemberSet, MemberState, VdRequest, VirtualDrive};
use layout::SpanKind;
use rand::Rng;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

/// What one power cut did and what the restart found.
#[derive(Clone, Debug)]
pub struct CrashReport {
    pub at_operation: usize,
    pub tally: CrashTally,
    /// VD rows holding unflushed client writes.
    pub unflushed_row_count: usize,
    /// VD sectors left holding one of several contents until read.
    pub undecided_sector_count: usize,
    pub resync: ResyncReport,
    /// The member being rebuilt and the row its rebuild resumed at.
    pub rebuild_resumed: Option<(usize, u64)>,
}

impl fmt::Display for CrashReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tally;
        let kind = if self.unflushed_row_count > 0 { "with writes unflushed" } else { "with nothing unflushed" };
        write!(
            f,
            "crash before op {} {kind} (unflushed drive writes: {} dropped, {} kept, {} torn; {} rows unflushed, {} sectors undecided); resync: {}",
            self.at_operation, t.dropped, t.kept, t.torn, self.unflushed_row_count, self.undecided_sector_count, self.resync
        )?;
        if let Some((member, row)) = self.rebuild_resumed {
            write!(f, "; rebuild of member {member} resumed at row {row}")?;
        }
        Ok(())
    }
}

/// What the resync after a restart did.
#[derive(Clone, Debug, Default)]
pub struct ResyncReport {
    /// Regions the bitmap found dirty on the members in service.
    pub dirty_region_count: u64,
    /// Regions resynced (every row of them made consistent).
    pub regions_resynced: u64,
    /// Regions left unsynced: some row lacks a member (reads through its parity are refused).
    pub regions_left_unsynced: u64,
    /// Rows checked (and repaired where they disagreed).
    pub checked_row_count: usize,
    pub rows_repaired: Vec<u64>,
    /// Mirror rows copied onto the member being rebuilt.
    pub copied_row_count: usize,
    /// Rows that could not be resynced, and why.
    pub rows_unsyncable: Vec<(u64, String)>,
}

impl fmt::Display for ResyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} regions dirty, {} resynced, {} left unsynced; {} rows checked, {} repaired {:?}, {} copied, {} not resyncable",
            self.dirty_region_count,
            self.regions_resynced,
            self.regions_left_unsynced,
            self.checked_row_count,
            self.rows_repaired.len(),
            self.rows_repaired,
            self.copied_row_count,
            self.rows_unsyncable.len()
        )
    }
}

/// What the configuration says of a member at a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recorded {
    Online,
    OutOfService(MemberState),
    Rebuilding { checkpoint_row: u64 },
}

/// How one row is made consistent after an unclean stop, given the members in service.
enum RowResync {
    /// Every member of the row is in service: check it and repair what disagrees.
    Check,
    /// A mirror pair whose other copy is being rebuilt: copy the copy in service onto it.
    CopyTo(usize),
    /// One copy of a mirror pair is out, or the level has no redundancy: nothing can disagree.
    Nothing,
    /// A parity or RAID1E row without one of its members: what it held is lost with a torn write.
    Impossible(String),
}

impl Sim {
    /// The power fails before operation `operation`; the controller restarts and resyncs.
    ///
    /// # Errors
    /// A torn row the resync could not reach, or what the verification afterwards found.
    pub(crate) fn crash_and_restart(&mut self, operation: usize) -> Result<(), String> {
        let with_unflushed_writes = self.crash_may_tear();
        if !with_unflushed_writes {
            self.drain_writes_and_flush()?;
        }
        // The power fails at a seeded point of the requests in flight.
        for _ in 0..self.rng.gen_range(0..4) {
            self.step()?;
        }
        let unflushed_rows = self.model.unflushed_rows(self.vd.geometry().row_data_bytes());
        let recorded = self.recorded_members();
        let mut tally = CrashTally::default();
        let journal = self.journal.iter().flat_map(|j| &j.legs);
        for drive in self.drives.iter().chain(self.copy.as_ref().map(|copy| &copy.target)).chain(journal) {
            tally.add(drive.cache.crash(&mut self.rng));
        }
        let undecided_sector_count = self.model.crash();
        self.restart(&recorded);
        let opened = intent::open(&self.vd, self.config.seed, self.config.rows_per_region, engine::bitmap::control::Opening::Assembled);
        if let Some(intent) = self.vd.write_intent() {
            // As the controller's assembly says which members were out when the VD opened.
            let out = recorded.iter().enumerate().filter(|(_, r)| matches!(r, Recorded::OutOfService(_))).map(|(m, _)| m).collect();
            intent.set_out_at_open(out);
        }
        // Before the resync, as the controller resumes copies before it starts resyncs.
        self.resume_copy();
        let mut resync = resync(&mut self.engine, &self.vd);
        resync.dirty_region_count = opened.map_or(0, |o| o.dirty_region_count);
        if opened.is_some_and(|o| !o.unclean) {
            return Err(format!("the bitmap said the VD stopped cleanly at the crash before op {operation}"));
        }
        self.flush_resync()?;
        self.restart_cache().map_err(|problem| format!("after the crash before op {operation}: {problem}"))?;
        let rebuild_resumed = self.rebuild.as_ref().map(|r| (r.member, r.next_row));
        let report = CrashReport {
            at_operation: operation,
            tally,
            unflushed_row_count: unflushed_rows.len(),
            undecided_sector_count,
            resync,
            rebuild_resumed,
        };
        self.crashes.push(report);
        self.verify_everything().map_err(|problem| format!("after the crash before op {operation}: {problem}"))
    }

    /// Whether the crash may come with client writes unflushed: unless a row holding them
    /// could then read as two versions. That is a mirror row the restart cannot resync (a
    /// RAID1E row lacking a member, or a member with injected faults that fail the resync):
    /// its copies on the members left may disagree, reads take copy 0 while it is there and
    /// the other copy once it is gone, and the oracle rightly says a sector read once stays
    /// what it was. Parity rows may be torn in any state: the bitmap keeps them unsynced and
    /// reads that need their parity are refused.
    fn crash_may_tear(&self) -> bool {
        if !matches!(self.vd.geometry().span_kind(), SpanKind::Mirror | SpanKind::OffsetMirror) {
            return true;
        }
        let faulty_online = |m: usize| self.at_risk[m] && self.vd.member(m).state() == MemberState::Online;
        self.model.unflushed_rows(self.vd.geometry().row_data_bytes()).into_iter().all(|row| {
            let healthy = row_members(&self.vd, row).into_iter().all(|m| !faulty_online(m));
            healthy && !matches!(plan(&self.vd, row), RowResync::Impossible(_))
        })
    }

    /// Lets the client writes in flight complete, then flushes: the crash leaves nothing
    /// unflushed that a client wrote.
    fn drain_writes_and_flush(&mut self) -> Result<(), String> {
        while self.in_flight.iter().flatten().any(|op| matches!(op, crate::run::Op::Write(..))) {
            self.step()?;
        }
        self.submit_flush();
        let flush = self.in_flight.len() - 1;
        while self.in_flight[flush].is_some() {
            self.step()?;
        }
        Ok(())
    }

    /// The member states a controller would assemble from the drives and its configuration.
    fn recorded_members(&self) -> Vec<Recorded> {
        let rebuilding = |m: usize| self.rebuild.as_ref().filter(|r| r.member == m).map(|r| r.checkpoint_row);
        (0..self.drives.len())
            .map(|m| match self.vd.member(m).state() {
                // A drive that vanished is not found at assembly.
                MemberState::Online if self.drives[m].faulty.faults().failed => Recorded::OutOfService(MemberState::Missing),
                MemberState::Online => Recorded::Online,
                MemberState::Rebuilding => match rebuilding(m) {
                    Some(checkpoint_row) => Recorded::Rebuilding { checkpoint_row },
                    // A rebuild that gave up on rows it could not produce (stale parity after a
                    // crash, injected read errors): the member never returns; recorded failed.
                    None => Recorded::OutOfService(MemberState::Failed),
                },
                out => Recorded::OutOfService(out),
            })
            .collect()
    }

    /// A new engine and VD over the crashed drives; whatever was in flight is gone with the old
    /// engine, and a rebuild resumes from its checkpoint.
    fn restart(&mut self, recorded: &[Recorded]) {
        let restarts = self.crashes.len() as u64 + 1;
        self.clean_before = self.clean_stats();
        self.write_back_imaged_before += self.engine.cache_stats().imaged.write_back_bytes;
        self.scattered_destages_before += self.engine.cache_stats().destage.scattered_runs;
        self.engine = LocalEngine::new(CompletionOrder::seeded(self.config.seed.wrapping_mul(31) ^ restarts.wrapping_mul(0x9e37_79b9)));
        self.in_flight.iter_mut().for_each(|op| *op = None);
        self.outcomes = Rc::new(RefCell::new(Vec::new()));
        // A check in flight dies with the engine; `start cc` does not survive a restart either.
        self.check = None;
        // So does a BGI job: what it left unsynced is in the bitmap, for the resync below.
        self.bgi_at_crash();
        let members = self.drives.iter().map(|d| Arc::clone(&d.faulty) as Arc<dyn drive::Drive>).collect();
        self.bypassed_before += self.vd.journal_bypass().bypassed().0;
        self.completed_rows_before += self.vd.journal_bypass().completed_rows();
        let vd = VirtualDrive::new(self.config.seed, "sim", self.layout, members).expect("the layout held before");
        for (member, recorded) in recorded.iter().enumerate() {
            match *recorded {
                Recorded::Online => {}
                Recorded::OutOfService(state) => drop(vd.set_member_state(member, state)),
                Recorded::Rebuilding { .. } => {
                    vd.set_member_state(member, MemberState::Failed);
                    vd.start_rebuild(member, Arc::clone(&self.drives[member].faulty) as Arc<dyn drive::Drive>);
                }
            }
        }
        self.vd = Arc::new(vd);
        if let Some(rebuild) = &mut self.rebuild {
            rebuild.next_row = rebuild.checkpoint_row;
            rebuild.in_flight = false;
            rebuild.outcome = Rc::new(RefCell::new(None));
            // As the controller resumes a re-add: whole from its checkpoint (the regions it
            // was to rebuild were noted in memory).
            rebuild.only_regions = None;
        }
    }

    /// Makes the resync's writes durable before anything relies on them.
    fn flush_resync(&mut self) -> Result<(), String> {
        let done = self.engine.run(&self.vd, VdRequest::Flush);
        done.result.map_err(|error| format!("flush after the resync: {error}"))
    }
}

/// The resync after an unclean stop: makes the rows of every region the bitmap left unsynced
/// consistent, each the way the members in service allow, and marks a region synced once all
/// its rows are. A region with a row that cannot be resynced stays unsynced: reads that need
/// its parity are refused from then on.
pub(crate) fn resync(engine: &mut LocalEngine, vd: &Arc<VirtualDrive>) -> ResyncReport {
    let mut report = ResyncReport::default();
    let Some(intent) = vd.write_intent() else { return report };
    for region in intent.unsynced_regions().ones() {
        let unsyncable_before = report.rows_unsyncable.len();
        intent.regions.rows_of(region).for_each(|row| resync_row(engine, vd, row, &mut report));
        if report.rows_unsyncable.len() == unsyncable_before {
            intent.region_synced(region);
            report.regions_resynced += 1;
        } else {
            report.regions_left_unsynced += 1;
        }
    }
    report
}

/// Makes row `row` consistent the way the members in service allow, booking it in `report`.
fn resync_row(engine: &mut LocalEngine, vd: &Arc<VirtualDrive>, row: u64, report: &mut ResyncReport) {
    {
        let outcome = match plan(vd, row) {
            RowResync::Check => {
                report.checked_row_count += 1;
                let checked = engine.run_check_row(vd, row, CheckMode::Resync);
                if checked.as_ref().is_ok_and(|outcome| outcome.repaired) {
                    report.rows_repaired.push(row);
                }
                checked.map(drop).map_err(|error| error.to_string())
            }
            RowResync::CopyTo(member) => {
                report.copied_row_count += 1;
                engine.run_rebuild_row(vd, row, MemberSet::of(&[member])).map_err(|error| error.to_string())
            }
            RowResync::Nothing => Ok(()),
            RowResync::Impossible(why) => Err(why),
        };
        if let Err(why) = outcome {
            report.rows_unsyncable.push((row, why));
        }
    }
}

/// How row `row` can be resynced with the members in service now.
fn plan(vd: &VirtualDrive, row: u64) -> RowResync {
    let geometry = vd.geometry();
    if geometry.span_kind() == SpanKind::Stripe {
        return RowResync::Nothing;
    }
    let out: Vec<(usize, MemberState)> =
        row_members(vd, row).into_iter().map(|m| (m, vd.member(m).state())).filter(|&(_, state)| state != MemberState::Online).collect();
    match (geometry.span_kind(), out.as_slice()) {
        (_, []) => RowResync::Check,
        (SpanKind::Mirror, [(member, MemberState::Rebuilding)]) => RowResync::CopyTo(*member),
        (SpanKind::Mirror, [_]) => RowResync::Nothing,
        (_, out) => RowResync::Impossible(format!("members {out:?} of the row are not in service")),
    }
}

/// The members that hold a part of row `row`.
fn row_members(vd: &VirtualDrive, row: u64) -> BTreeSet<usize> {
    vd.geometry().row_map(row).members().map(|(place, _, _)| place.drive).collect()
}
