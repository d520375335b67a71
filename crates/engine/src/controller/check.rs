//! The consistency check (`/c0/vN start|stop|pause|resume|show cc`): every row of a VD read
//! whole through the level's own check function (`SpanIo::check_row`), under its row lock, while
//! clients keep reading and writing; each inconsistent row becomes an event that names the
//! slots involved as precisely as the level allows, and in repair mode (the default, as on
//! MegaRAID) the row is made consistent:
//! - RAID6/60: P and Q locate a single wrong strip (data, P or Q; md's raid6check), and only
//!   that strip is rewritten.
//! - RAID5/50, or RAID6 with more than one wrong strip: which strip is wrong cannot be told; the
//!   rule is that the data is trusted and the parity recomputed from it.
//! - Mirrors: copies that differ cannot say which is right; the rule is that copy 0 is copied
//!   over the others (md does the same).
//!
//! A member that cannot read its part of a row (a medium error) does not end the check: once
//! the watermark has passed the row, the check's thread rebuilds that member's strips of the
//! row from the rest of it (the write remaps the sectors, as patrol read does), checks the row
//! again, and says both in an event. A member that left service does end it.
//!
//! It runs on the background driver at `ccrate` (the share of its speed alone it keeps while
//! clients are busy), on a thread of its own. It needs every member online (a degraded row has
//! nothing to compare) and no resync pending (the resync is the check of those regions). It does
//! not survive a restart: `start cc` begins again at row 0.

use super::*;
use crate::background::{self, Finish, Hooks, Progress, RowOutcome};
use crate::vd::{CheckMode, CheckOutcome, Mismatch, VdError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Inconsistent rows logged one by one per check; past that they are counted, and the final
/// event gives the total (the event log keeps [`EVENTS_MAX`] events for everything else too).
pub const CC_ROW_EVENTS_MAX: u64 = 100;

/// A consistency check that runs, for `show cc` and its controls.
#[derive(Clone)]
pub struct CcView {
    pub vd_id: u32,
    pub progress: Arc<Progress>,
    pub started: Instant,
    /// Repair (rewrites what disagrees) or report only.
    pub repair: bool,
    pub tally: Arc<CcTally>,
}

impl CcView {
    /// storcli's words: "In progress", "Paused", "Stopped".
    pub fn status(&self) -> &'static str {
        rebuild::status_words(&self.progress)
    }

    pub fn estimated_time_left(&self) -> Option<Duration> {
        rebuild::time_left(&self.progress, self.started, 0)
    }
}

/// What a check found so far.
#[derive(Debug, Default)]
pub struct CcTally {
    pub rows_checked: AtomicU64,
    pub rows_inconsistent: AtomicU64,
    pub rows_repaired: AtomicU64,
}

/// `/c0/vN stop|pause|resume cc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcCommand {
    Stop,
    Pause,
    Resume,
}

impl Controller {
    /// Starts a consistency check of `vd_id`, repairing what disagrees when `repair`.
    ///
    /// # Errors
    /// No such VD; a level without redundancy; a member out of service; a resync pending; a
    /// check already running. Nothing starts then.
    pub fn start_cc(&self, vd_id: u32, repair: bool) -> Result<(), ControlError> {
        let state = self.state.lock().expect("controller lock");
        let vd = Arc::clone(state.vds.get(&vd_id).ok_or_else(|| ControlError::NotFound(format!("no VD {vd_id}")))?);
        let level = vd.geometry().level();
        if vd.geometry().span_kind() == layout::SpanKind::Stripe {
            return Err(ControlError::BadInput(format!(
                "v{vd_id} is {level}: a consistency check needs redundancy (RAID1, 1E, 5, 6, 10, 50, 60)"
            )));
        }
        if self.migrations.lock().expect("migrations lock").contains_key(&vd_id) {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} is being migrated: a check's repairs could change rows the copy has read; start it once the migration ends"
            )));
        }
        if vd.state() != crate::VdState::Optimal {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} is {}: a consistency check needs every member online (a degraded row has nothing to compare); rebuild first",
                vd.state().short_name()
            )));
        }
        if let Some(regions) = vd.write_intent().map(|intent| intent.unsynced_count()).filter(|&count| count > 0) {
            let bgi = state.config.vds.iter().any(|record| record.vd_id == vd_id && record.bgi_pending);
            let what = if bgi {
                "to initialize (its background initialization makes them consistent first)"
            } else {
                "to resync after an unclean stop (the resync checks them first)"
            };
            return Err(ControlError::Conflict(format!("v{vd_id} has {regions} region(s) {what}")));
        }
        let rate_percent = state.config.settings.cc_rate_percent;
        let member_slots = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("a live VD has a record").member_slots.clone();
        let mut checks = self.checks.lock().expect("checks lock");
        if let Some(running) = checks.get(&vd_id) {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} has a consistency check already ({}, {:.1}%); stop it first",
                running.status(),
                running.progress.percent_done()
            )));
        }
        let progress = Progress::new(vd.geometry().row_count(), 0, rate_percent);
        progress.size_windows_for(vd.geometry().strip_size_bytes());
        progress.set_run_rows(crate::run_rows_for(vd.geometry()));
        let view = CcView { vd_id, progress, started: Instant::now(), repair, tally: Arc::default() };
        checks.insert(vd_id, view.clone());
        drop(checks);
        drop(state);
        let mode = if repair { "repair" } else { "report only" };
        self.log(Severity::Info, format!("consistency check of v{vd_id} started ({mode}, ccrate {rate_percent}%)"));
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name(format!("storc-cc-v{vd_id}")).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            let finish = controller.run_cc(&vd, &view, &member_slots);
            controller.cc_ended(&view, finish);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => {
                self.checks.lock().expect("checks lock").remove(&vd_id);
                return Err(ControlError::Io(format!("the consistency check of v{vd_id} cannot start a thread: {error}")));
            }
        }
        Ok(())
    }

    /// Consistency checks running (or paused), by VD.
    pub fn checks(&self) -> Vec<CcView> {
        self.checks.lock().expect("checks lock").values().cloned().collect()
    }

    /// Steers the check of `vd_id`.
    ///
    /// # Errors
    /// No check on that VD (with the VDs that have one), or the command does not fit its state.
    pub fn cc_command(&self, vd_id: u32, command: CcCommand) -> Result<(), ControlError> {
        let Some(view) = self.checks.lock().expect("checks lock").get(&vd_id).cloned() else {
            let running: Vec<String> = self.checks().iter().map(|c| format!("v{}", c.vd_id)).collect();
            let known = if running.is_empty() { "none has one".to_string() } else { format!("VDs with one: {}", running.join(", ")) };
            return Err(ControlError::NotFound(format!("v{vd_id} has no consistency check running; {known}")));
        };
        let control = view.progress.control();
        let refuse = |allowed: &str| {
            Err(ControlError::Conflict(format!(
                "the consistency check of v{vd_id} is {}; {command:?} is allowed only when it is {allowed}",
                view.status()
            )))
        };
        let next = match (command, control) {
            (CcCommand::Stop, background::Control::Run | background::Control::Pause) => background::Control::Stop,
            (CcCommand::Pause, background::Control::Run) => background::Control::Pause,
            (CcCommand::Resume, background::Control::Pause) => background::Control::Run,
            (CcCommand::Pause, _) => return refuse("in progress"),
            (CcCommand::Resume, _) => return refuse("paused"),
            (CcCommand::Stop, _) => return refuse("in progress or paused"),
        };
        view.progress.set_control(next);
        self.log(Severity::Info, format!("consistency check of v{vd_id}: {command:?} at {:.1}%", view.progress.percent_done()));
        Ok(())
    }

    /// Stops every check (shutdown); they do not resume.
    pub(super) fn stop_checks(&self) {
        for view in self.checks.lock().expect("checks lock").values() {
            view.progress.set_control(background::Control::Stop);
        }
    }

    fn run_cc(&self, vd: &Arc<VirtualDrive>, view: &CcView, member_slots: &[u32]) -> Finish {
        let mode = if view.repair { CheckMode::Repair } else { CheckMode::Report };
        let engine = Arc::clone(&self.engine);
        let vd_id = view.vd_id;
        // Findings to log, handed from the shards (which must not wait for the event log) to
        // this thread.
        let findings: Arc<Mutex<Vec<(CheckOutcome, u64)>>> = Arc::default();
        // Rows a member could not read: (row, member, error), repaired on this thread.
        let unreadable: Arc<Mutex<Vec<(u64, usize, String)>>> = Arc::default();
        let log_findings = || {
            let taken = std::mem::take(&mut *findings.lock().expect("findings lock"));
            for (outcome, number) in taken {
                self.log_inconsistent_row(vd_id, &outcome, member_slots, number);
            }
            let unreadable = std::mem::take(&mut *unreadable.lock().expect("unreadable lock"));
            for (row, member, error) in unreadable {
                self.repair_unreadable_row(vd, view, member_slots, (row, member, &error), mode);
            }
        };
        // Whole runs (a shard's stride of rows): each member's part read in one I/O.
        let submit_rows = |first_row: u64, row_count: u64, done: background::RunDone| {
            let (tally, findings, unreadable) = (Arc::clone(&view.tally), Arc::clone(&findings), Arc::clone(&unreadable));
            let vd_for_done = Arc::clone(vd);
            let finished = Box::new(move |results: Vec<Result<CheckOutcome, VdError>>| {
                let outcomes = (first_row..).zip(results).map(|(row, result)| match result {
                    Ok(outcome) => {
                        if let Some(number) = tally_row(&tally, &outcome) {
                            findings.lock().expect("findings lock").push((outcome, number));
                        }
                        RowOutcome::Done
                    }
                    // A read error of a member still in service: repaired by the check's thread.
                    Err(VdError::RowMemberIo { member, error, .. })
                        if error != drive::DriveError::Gone && vd_for_done.member(member).state() == crate::vd::MemberState::Online =>
                    {
                        unreadable.lock().expect("unreadable lock").push((row, member, error.to_string()));
                        RowOutcome::Done
                    }
                    Err(error) => RowOutcome::Fatal(error.to_string()),
                });
                done(outcomes.collect());
            });
            engine.check_rows(vd, first_row, row_count, mode, finished);
        };
        let total_rows = view.progress.total_rows;
        let milestone = AtomicU64::new(0);
        let advanced = |clean_rows: u64| {
            log_findings();
            // Events at every quarter, as MegaRAID logs progress.
            let quarter = clean_rows * 4 / total_rows.max(1);
            if quarter > milestone.fetch_max(quarter, Ordering::Relaxed) && quarter < 4 {
                self.log(Severity::Info, format!("consistency check of v{vd_id}: {}% done", quarter * 25));
            }
        };
        let clients_busy = || vd.last_client_request().elapsed() < rebuild::CLIENTS_BUSY_WINDOW;
        let hooks = Hooks { submit_rows: &submit_rows, checkpoint: &mut |_| {}, clients_busy: &clients_busy, advanced: &advanced };
        let finish = background::run(&view.progress, hooks);
        log_findings();
        repairs_durable(finish, vd, &view.tally)
    }

    /// A row that `member` could not read: its strips on it rebuilt from the rest of the row
    /// (which remaps bad sectors), then the row checked again; events say what happened.
    fn repair_unreadable_row(
        &self,
        vd: &Arc<VirtualDrive>,
        view: &CcView,
        slots: &[u32],
        (row, member, error): (u64, usize, &str),
        mode: CheckMode,
    ) {
        let vd_id = view.vd_id;
        let slot = slots[member];
        let (sender, receiver) = std::sync::mpsc::channel();
        self.engine.rebuild_row(vd, row, crate::vd::MemberSet::of(&[member]), Box::new(move |result| drop(sender.send(result))));
        if let Err(rebuild_error) = receiver.recv().unwrap_or(Err(VdError::Stopped)) {
            let description = format!(
                "consistency check of v{vd_id}: row {row}: slot {slot} could not be read ({error}) and could not be rewritten: {rebuild_error}"
            );
            return self.log(Severity::Critical, description);
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        self.engine.check_row(vd, row, mode, Box::new(move |result| drop(sender.send(result))));
        let checked = match receiver.recv() {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(check_error)) => {
                return self.log(
                    Severity::Critical,
                    format!(
                        "consistency check of v{vd_id}: row {row}: checking it again after rewriting slot {slot} failed: {check_error}"
                    ),
                );
            }
            Err(_) => return,
        };
        view.tally.rows_repaired.fetch_add(1, Ordering::Relaxed);
        let again = if checked.is_consistent() { "consistent" } else { "still inconsistent (see the next event)" };
        self.log(
            Severity::Warning,
            format!("consistency check of v{vd_id}: row {row}: slot {slot} could not be read ({error}); rewritten from the rest of the row, then checked: {again}"),
        );
        if let Some(number) = tally_row(&view.tally, &checked) {
            self.log_inconsistent_row(vd_id, &checked, slots, number);
        }
    }

    /// One inconsistent row, in an event that names the slots (see the module docs for what
    /// each level can tell and the rule a repair follows).
    fn log_inconsistent_row(&self, vd_id: u32, outcome: &CheckOutcome, slots: &[u32], number: u64) {
        let findings: Vec<String> = outcome.mismatches.iter().map(|m| describe(m, slots, outcome.repaired)).collect();
        let mut description = format!("consistency check of v{vd_id}: row {} inconsistent: {}", outcome.row, findings.join("; "));
        if number == CC_ROW_EVENTS_MAX {
            description.push_str(&format!(" (further inconsistent rows are counted, not logged, past {CC_ROW_EVENTS_MAX})"));
        }
        self.log(Severity::Warning, description);
    }

    fn cc_ended(&self, view: &CcView, finish: Finish) {
        self.checks.lock().expect("checks lock").remove(&view.vd_id);
        let tally = &view.tally;
        let (checked, inconsistent, repaired) = (
            tally.rows_checked.load(Ordering::Relaxed),
            tally.rows_inconsistent.load(Ordering::Relaxed),
            tally.rows_repaired.load(Ordering::Relaxed),
        );
        let summary = format!("{checked} row(s) checked, {inconsistent} inconsistent, {repaired} repaired");
        let vd_id = view.vd_id;
        match finish {
            Finish::Complete => {
                let severity = if inconsistent == 0 { Severity::Info } else { Severity::Warning };
                let secs = view.started.elapsed().as_secs_f64();
                self.log(severity, format!("consistency check of v{vd_id} done in {secs:.1} s: {summary}"));
            }
            Finish::Stopped => self.log(Severity::Info, format!("consistency check of v{vd_id} stopped: {summary}")),
            Finish::Failed(reason) => {
                self.log(Severity::Warning, format!("consistency check of v{vd_id} cannot go on ({reason}): {summary}"))
            }
        }
    }
}

/// A check that rewrote rows ends (done or stopped) only once the members in service made the
/// rewrites durable: a power cut right after an event said "repaired" would otherwise bring a
/// bad strip back, and the resync after an unclean stop trusts data strips
/// ([`CheckMode::Resync`]), so the bad bytes would then stay for good.
fn repairs_durable(finish: Finish, vd: &VirtualDrive, tally: &CcTally) -> Finish {
    if tally.rows_repaired.load(Ordering::Relaxed) == 0 {
        return finish;
    }
    let in_service = vd.members().iter().enumerate().filter(|(_, m)| m.state() == crate::vd::MemberState::Online);
    for (index, member) in in_service {
        if let Err(error) = crate::bitmap::ondisk::flush(&*member.drive()) {
            let reason = format!("the rows repaired could not be made durable (flush of member {index}: {error})");
            return match finish {
                Finish::Failed(earlier) => Finish::Failed(format!("{earlier}; {reason}")),
                _ => Finish::Failed(reason),
            };
        }
    }
    finish
}

/// Counts a checked row; returns the number of this inconsistent row when it is to be logged.
fn tally_row(tally: &CcTally, outcome: &CheckOutcome) -> Option<u64> {
    tally.rows_checked.fetch_add(1, Ordering::Relaxed);
    if outcome.is_consistent() {
        return None;
    }
    if outcome.repaired {
        tally.rows_repaired.fetch_add(1, Ordering::Relaxed);
    }
    let number = tally.rows_inconsistent.fetch_add(1, Ordering::Relaxed) + 1;
    (number <= CC_ROW_EVENTS_MAX).then_some(number)
}

/// A mismatch in words, with slots rather than member indices.
fn describe(mismatch: &Mismatch, slots: &[u32], repaired: bool) -> String {
    let slot = |member: usize| format!("slot {}", slots[member]);
    match mismatch {
        Mismatch::Member { member, role } => {
            let fix = if repaired { "; rewritten from the rest of the row" } else { "" };
            format!("{} ({role:?}) is wrong: P and Q both point to it{fix}", slot(*member))
        }
        Mismatch::Unlocated { p_member, q_member: None } => {
            let fix = if repaired { "; by rule the data is trusted and P recomputed" } else { "" };
            format!("P on {} disagrees with the data; a single parity cannot tell which strip is wrong{fix}", slot(*p_member))
        }
        Mismatch::Unlocated { p_member, q_member: Some(q_member) } => {
            let fix = if repaired { "; by rule the data is trusted and P and Q recomputed" } else { "" };
            format!(
                "P on {} and Q on {} disagree with the data in more than one strip, which cannot be located{fix}",
                slot(*p_member),
                slot(*q_member)
            )
        }
        Mismatch::Copies { strip_index, members } => {
            let others: Vec<String> = members[1..].iter().map(|&m| slot(m)).collect();
            let fix = if repaired { "; by rule copy 0 was copied over the others" } else { "" };
            format!(
                "copies of data strip {strip_index} differ: {} (copy 0) and {}; nothing tells which is right{fix}",
                slot(members[0]),
                others.join(", ")
            )
        }
    }
}
