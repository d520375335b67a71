//! Hot-spare takeover and rebuild.
//!
//! When a member leaves service (an I/O failure, `set offline`, `set missing`, or absent at
//! assembly) and automatic rebuild is on, the controller picks a spare (`spares`), writes the
//! swap to the metadata (the spare becomes the member, `Rbld`; the old drive leaves the VD), and
//! only then starts writing the spare: the engine's member turns `Rebuilding` (written by client
//! writes from now on, read only below the rows it published as rebuilt, see `vd::rebuilt`) and
//! a background process (`crate::background`) rebuilds the rows in order through the level's own
//! row function. Its watermark is checkpointed into the spare's drive record, so a restart
//! resumes there. When every row is done, the spare becomes `Onln`, recorded before the engine
//! reads every row of it.

use super::*;
use crate::background::{self, Finish, Hooks, Progress, RowOutcome};
use crate::bitmap::{self, Bits, RegionMap};
use crate::vd::MemberSet;
use std::time::{Duration, Instant};

/// A rebuild that runs, for `show rebuild` and its controls.
#[derive(Clone)]
pub struct RebuildView {
    pub slot: u32,
    pub vd_id: u32,
    pub progress: Arc<Progress>,
    /// When this run began, and at which row (for the estimate of the time left).
    pub started: Instant,
    pub start_row: u64,
}

impl RebuildView {
    /// storcli's words: "In progress", "Paused", "Stopped".
    pub fn status(&self) -> &'static str {
        status_words(&self.progress)
    }

    /// At the speed so far since this run began; `None` before there is a speed to go by.
    pub fn estimated_time_left(&self) -> Option<Duration> {
        time_left(&self.progress, self.started, self.start_row)
    }
}

/// storcli's words for where a background operation stands: "In progress", "Paused", "Stopped".
pub(super) fn status_words(progress: &Progress) -> &'static str {
    match progress.control() {
        background::Control::Run => "In progress",
        background::Control::Pause => "Paused",
        background::Control::Stop => "Stopped",
    }
}

/// The time a background operation needs for its remaining rows at its speed since `started`
/// (at `start_row`); `None` before there is a speed to go by.
pub(super) fn time_left(progress: &Progress, started: Instant, start_row: u64) -> Option<Duration> {
    let done_rows = progress.watermark_row().saturating_sub(start_row);
    let elapsed = started.elapsed();
    if done_rows == 0 || elapsed.is_zero() {
        return None;
    }
    let left_rows = progress.total_rows - progress.watermark_row();
    Some(elapsed.mul_f64(left_rows as f64 / done_rows as f64))
}

/// A background operation that wrote every row of a drive is complete only once the drive has
/// made them durable: the drive is then recorded `Onln`, and nothing else covers those rows (the
/// write-intent bitmap covers client writes; a checkpoint only the rows below it). A power cut
/// right after the record would otherwise drop rows the metadata says the drive holds.
pub(super) fn durable(finish: Finish, drive: &dyn drive::Drive) -> Finish {
    if finish != Finish::Complete {
        return finish;
    }
    match bitmap::ondisk::flush(drive) {
        Ok(()) => Finish::Complete,
        Err(error) => Finish::Failed(format!("the rows written could not be made durable (flush: {error})")),
    }
}

/// What one rebuild thread works on.
#[derive(Clone, Copy)]
struct RebuildJob<'a> {
    member: usize,
    slot: u32,
    /// The member's rebuild epoch when the thread started (see `vd::rebuilt`).
    epoch: u16,
    /// A re-add: only the rows of these regions (the member holds everything else).
    only_regions: &'a Option<Bits>,
}

/// `/c0/sN start|stop|pause|resume rebuild`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildCommand {
    /// Runs a stopped rebuild again from its checkpoint.
    Start,
    /// Stops at the watermark (checkpointed); the member stays Rbld and keeps taking writes.
    Stop,
    Pause,
    Resume,
}

/// How long after a client request the VD still counts as busy for the rebuild rate.
pub(super) const CLIENTS_BUSY_WINDOW: Duration = Duration::from_millis(200);

impl Controller {
    /// After a member of `vd_id` left service: takes a spare over if automatic rebuild is on.
    /// Called with the state lock held, after the failure was recorded.
    pub(super) fn take_over(&self, state: &mut State, vd_id: u32) {
        if let Some(vd) = state.vds.get(&vd_id) {
            self.settle_write_intent(&Arc::clone(vd), vd_id);
        }
        // A member that was being copied has a target that holds part of it already: the
        // target takes its place, whatever autorebuild says (copyback.rs).
        self.rebuild_onto_copy_targets(state, vd_id);
        if !state.config.settings.auto_rebuild {
            return self.log(Severity::Warning, format!("v{vd_id} stays degraded: automatic rebuild is off (/c0 set autorebuild=on)"));
        }
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id).cloned().expect("a live VD has a record");
        let vd = Arc::clone(&state.vds[&vd_id]);
        if vd.state() == crate::VdState::Offline {
            // Beyond its tolerance nothing holds what a spare would need: it would be filled with
            // rows that cannot be rebuilt.
            return self.log(Severity::Critical, format!("v{vd_id} is offline: no spare can be rebuilt from what is left"));
        }
        let out: Vec<usize> = (0..record.member_slots.len())
            .filter(|&i| matches!(vd.member(i).state(), MemberState::Failed | MemberState::Missing))
            .collect();
        for member in out {
            let capacity_of = |slot: u32| state.slots.get(&slot).filter(|s| !s.foreign).map(|s| s.drive.info().capacity_bytes);
            match spares::choose_spare(&state.config, &record, capacity_of) {
                Ok(spare) => self.swap_in(state, vd_id, member, spare),
                Err(reason) => return self.log(Severity::Warning, format!("v{vd_id} stays degraded: {reason}")),
            }
        }
    }

    /// Makes `spare` member `member` of `vd_id` in the metadata, then starts rebuilding it.
    pub(super) fn swap_in(&self, state: &mut State, vd_id: u32, member: usize, spare: u32) {
        let before = state.config.clone();
        let old_slot = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("checked").member_slots[member];
        let detail = format!("takes the place of slot {old_slot} in v{vd_id}");
        self.transition(state, spare, DriveState::Rebuild, state::Cause::RebuildStarted, Some(&detail));
        // A hot spare keeps its record while it serves (a revertible spare) and remembers whose
        // place it took: a copyback returns the data there and the spare to the pool.
        let revertible = state.config.hot_spares.iter().any(|h| h.slot == spare);
        self.retire_replaced(state, old_slot, spare);
        let record = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id).expect("checked");
        record.member_slots[member] = spare;
        set_rebuild_row(&mut state.config, spare, 0);
        set_copy_slot(&mut state.config, spare, revertible.then_some(old_slot));
        if let Err(error) = self.persist(state) {
            state.config = before;
            return self
                .log(Severity::Critical, format!("v{vd_id}: slot {spare} cannot take over, the metadata cannot be written: {error}"));
        }
        let drive = Arc::clone(&state.slots[&spare].drive);
        let vd = Arc::clone(&state.vds[&vd_id]);
        self.join_write_intent(state.config.controller_id, vd_id, &vd, &*drive);
        vd.start_rebuild(member, drive);
        self.spawn_rebuild(vd, vd_id, member, spare, 0, state.config.settings.rebuild_rate_percent);
    }

    /// The drive a spare replaced leaves the VD: a failed one becomes UBad, an offline one
    /// UGood, a missing one is forgotten (if it returns it is a blank drive to us).
    fn retire_replaced(&self, state: &mut State, old_slot: u32, spare: u32) {
        let detail = format!("replaced by slot {spare}");
        // A spare that served here and is replaced in turn is no spare any more.
        state.config.hot_spares.retain(|h| h.slot != old_slot);
        if let Some(record) = state.config.drives.iter_mut().find(|d| d.slot == old_slot) {
            record.copy_slot = None;
            record.rebuild_row = 0;
        }
        match state.config.drives.iter().find(|d| d.slot == old_slot).map(|d| d.state) {
            // The transitions are logged; nothing else follows from them here.
            Some(DriveState::Failed) => {
                let _ = self.transition(state, old_slot, DriveState::UnconfiguredBad, state::Cause::Replaced, Some(&detail));
            }
            Some(DriveState::Offline) => {
                let _ = self.transition(state, old_slot, DriveState::UnconfiguredGood, state::Cause::Replaced, Some(&detail));
            }
            _ => {
                state.config.drives.retain(|d| d.slot != old_slot);
                self.log(Severity::Info, format!("slot {old_slot} (absent) {detail}; it leaves the configuration"));
            }
        }
    }

    /// Resumes every rebuild the configuration records (after a restart).
    pub(super) fn resume_rebuilds(&self, state: &State) {
        for drive in state.config.drives.iter().filter(|d| d.state == DriveState::Rebuild) {
            let Some((vd_id, member)) = member_of(state, drive.slot) else { continue };
            if state.vds[&vd_id].member(member).state() != MemberState::Rebuilding {
                continue; // not usable now (shrunk, absent): assembly said why
            }
            self.log(Severity::Info, format!("rebuild of slot {} (v{vd_id}) resumes at row {}", drive.slot, drive.rebuild_row));
            let vd = Arc::clone(&state.vds[&vd_id]);
            self.spawn_rebuild(vd, vd_id, member, drive.slot, drive.rebuild_row, state.config.settings.rebuild_rate_percent);
        }
    }

    /// Starts the rebuild process of member `member` (slot `slot`) on a thread of its own. May be
    /// called with the state lock held: the thread takes it only later.
    fn spawn_rebuild(&self, vd: Arc<VirtualDrive>, vd_id: u32, member: usize, slot: u32, start_row: u64, rate_percent: u8) {
        self.spawn_rebuild_of(vd, vd_id, member, slot, start_row, rate_percent, None);
    }

    /// [`Controller::spawn_rebuild`] of the rows in the regions of `only_regions` (a re-add:
    /// the member holds everything else already), or of every row.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn_rebuild_of(
        &self,
        vd: Arc<VirtualDrive>,
        vd_id: u32,
        member: usize,
        slot: u32,
        start_row: u64,
        rate_percent: u8,
        only_regions: Option<Bits>,
    ) {
        let progress = Progress::new(vd.geometry().row_count(), start_row, rate_percent);
        progress.size_windows_for(vd.geometry().strip_size_bytes());
        progress.set_run_rows(crate::run_rows_for(vd.geometry()));
        let view = RebuildView { slot, vd_id, progress: Arc::clone(&progress), started: Instant::now(), start_row };
        self.rebuilds.lock().expect("rebuilds lock").insert(slot, view);
        // Taken now, with the member just made (or found) Rebuilding: a later rebuild of the
        // same member, onto another drive, has another epoch.
        let epoch = vd.rebuild_epoch(member);
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name(format!("storc-rebuild-s{slot}")).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            // The member missed row writes whose images may still be in the journal: replayed
            // onto what the rebuild writes, they would take it back in time.
            if let Err(error) = controller.engine.images_to_head() {
                controller.log(Severity::Warning, format!("v{vd_id}: journal images before the rebuild of slot {slot}: {error}"));
            }
            let job = RebuildJob { member, slot, epoch, only_regions: &only_regions };
            let (finish, rows) = controller.run_rebuild(&vd, &job, &progress);
            let finish = durable(finish, &*vd.member(member).drive());
            if let (Some(dirty), Finish::Complete) = (&only_regions, &finish) {
                let bytes = rows * vd.geometry().strip_size_bytes();
                controller.log(
                    Severity::Info,
                    format!("re-add of slot {slot} (v{vd_id}): {} dirty region(s), {rows} row(s), {bytes} bytes resynced", dirty.count()),
                );
            }
            controller.rebuild_ended(vd_id, member, slot, &progress, finish);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => self.log(Severity::Critical, format!("rebuild of slot {slot} cannot start a thread: {error}")),
        }
    }

    /// Keeps a background operation's thread for the join at shutdown. Handles of threads that
    /// ended are dropped here (there is nothing left to wait for), so that the list holds live
    /// threads only and does not grow with every check or rebuild a long-running daemon does.
    pub(super) fn keep_thread(&self, thread: std::thread::JoinHandle<()>) {
        let mut threads = self.rebuild_threads.lock().expect("rebuild threads lock");
        threads.retain(|kept| !kept.is_finished());
        threads.push(thread);
    }

    /// Stops every rebuild and copy at its watermark (checkpointed) and waits for the threads:
    /// shutdown. They resume at the next start.
    pub(super) fn stop_rebuilds(&self) {
        for rebuild in self.rebuilds() {
            rebuild.progress.set_control(background::Control::Stop);
        }
        for copy in self.copybacks() {
            copy.progress.set_control(background::Control::Stop);
        }
        for migration in self.migrations() {
            migration.progress.set_control(background::Control::Stop);
        }
        let threads = std::mem::take(&mut *self.rebuild_threads.lock().expect("rebuild threads lock"));
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// Returns how the rebuild ended and how many rows it rebuilt.
    fn run_rebuild(&self, vd: &Arc<VirtualDrive>, job: &RebuildJob<'_>, progress: &Progress) -> (Finish, u64) {
        let RebuildJob { member, slot, epoch, only_regions: only } = *job;
        let targets = MemberSet::of(&[member]);
        let engine = Arc::clone(&self.engine);
        let regions = RegionMap::for_geometry(vd.geometry());
        let rows_rebuilt = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let submit_row = |row: u64, done: Box<dyn FnOnce(RowOutcome) + Send>| {
            if !resync::row_in(&regions, only, row) {
                return done(RowOutcome::Done);
            }
            let rows_rebuilt = Arc::clone(&rows_rebuilt);
            engine.rebuild_row(
                vd,
                row,
                targets,
                Box::new(move |result| {
                    rows_rebuilt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    done(row_outcome(result))
                }),
            );
        };
        let row_by_row = background::row_by_row(&submit_row);
        // Whole runs go to the engine as one job (large member I/Os); a run that a re-add's
        // regions cut goes row by row (only at a region's edge).
        let submit_rows = |first_row: u64, row_count: u64, done: background::RunDone| {
            if !(first_row..first_row + row_count).all(|row| resync::row_in(&regions, only, row)) {
                return row_by_row(first_row, row_count, done);
            }
            let rows_rebuilt = Arc::clone(&rows_rebuilt);
            engine.rebuild_rows(
                vd,
                first_row,
                row_count,
                targets,
                Box::new(move |results| {
                    rows_rebuilt.fetch_add(results.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    done(results.into_iter().map(row_outcome).collect())
                }),
            );
        };
        let mut checkpoint = |row: u64| self.checkpoint_rebuild(vd, member, slot, row);
        let clients_busy = || vd.last_client_request().elapsed() < CLIENTS_BUSY_WINDOW;
        // Client reads may use the member below the rows it holds now (`vd::rebuilt`).
        let advanced = |clean_rows: u64| vd.rebuild_advanced(member, epoch, clean_rows);
        let hooks = Hooks { submit_rows: &submit_rows, checkpoint: &mut checkpoint, clients_busy: &clients_busy, advanced: &advanced };
        let finish = background::run(progress, hooks);
        (finish, rows_rebuilt.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Records the watermark in the spare's drive record, so that a restart resumes there. The
    /// rows below it are flushed on the drive first: a checkpoint must not outlive what it
    /// vouches for (a power cut drops what a drive had not flushed).
    fn checkpoint_rebuild(&self, vd: &VirtualDrive, member: usize, slot: u32, row: u64) {
        if let Err(error) = bitmap::ondisk::flush(&*vd.member(member).drive()) {
            return self
                .log(Severity::Warning, format!("rebuild of slot {slot}: checkpoint at row {row} not written, flush failed: {error}"));
        }
        let mut state = self.state.lock().expect("controller lock");
        if !state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::Rebuild) {
            return;
        }
        set_rebuild_row(&mut state.config, slot, row);
        if let Err(error) = self.persist(&mut state) {
            self.log(Severity::Warning, format!("rebuild of slot {slot}: checkpoint at row {row} not written: {error}"));
        }
    }

    fn rebuild_ended(&self, vd_id: u32, member: usize, slot: u32, progress: &Progress, finish: Finish) {
        let elapsed = self.rebuilds.lock().expect("rebuilds lock").get(&slot).map(|r| r.started.elapsed()).unwrap_or_default();
        let removes = finish_removes(&finish);
        match finish {
            Finish::Complete => self.rebuild_done(vd_id, member, slot, progress, elapsed),
            Finish::Stopped => {
                self.log(Severity::Warning, format!("rebuild of slot {slot} (v{vd_id}) stopped at {:.1}%", progress.percent_done()))
            }
            Finish::Failed(reason) => self.log(Severity::Critical, format!("rebuild of slot {slot} (v{vd_id}) failed: {reason}")),
        }
        if removes {
            self.rebuilds.lock().expect("rebuilds lock").remove(&slot);
        }
    }

    /// Every row is rebuilt: recorded first, then the engine reads the member again.
    fn rebuild_done(&self, vd_id: u32, member: usize, slot: u32, progress: &Progress, elapsed: Duration) {
        let mut state = self.state.lock().expect("controller lock");
        let still_ours = state.vds.get(&vd_id).is_some_and(|vd| vd.member(member).state() == MemberState::Rebuilding)
            && state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::Rebuild);
        if !still_ours {
            return;
        }
        let bad_rows = progress.bad_rows();
        if !bad_rows.is_empty() {
            // Rows left as they were: lost data whose loss could not be recorded as bad blocks
            // (the list is full, the metadata could not be written), or rows whose parity may be
            // stale (not yet resynced). Reads of them must not reach the member, so it stays
            // Rbld (written, not read) and says why.
            let first = bad_rows.iter().min().expect("not empty");
            return self.log(
                Severity::Critical,
                format!("rebuild of slot {slot} (v{vd_id}) reached the end, but {} row(s) could not be rebuilt (lost data that could not be recorded as bad blocks, or a region not yet resynced after an unclean stop; first: row {first}); the member stays Rbld and is not read", bad_rows.len()),
            );
        }
        let detail = format!("v{vd_id} rebuilt in {:.1} s", elapsed.as_secs_f64());
        let transition = self.transition(&mut state, slot, DriveState::Online, state::Cause::RebuildDone, Some(&detail));
        set_rebuild_row(&mut state.config, slot, 0);
        if let Err(error) = self.persist(&mut state) {
            // Still Rbld on disk: a restart redoes the rebuild from its last checkpoint.
            self.undo_transition(&mut state, &transition);
            return self.log(Severity::Critical, format!("rebuild of slot {slot} done but not recorded: {error}"));
        }
        state.vds[&vd_id].finish_rebuild(member);
        self.start_resyncs(&state);
        // A copyback asked for while the spare was being rebuilt can start now.
        self.start_pending_copyback(&mut state, slot);
    }

    /// Steers the rebuild of `slot`.
    ///
    /// # Errors
    /// No rebuild at that slot (with the slots that have one), or the command does not fit its
    /// state (start on a running one, pause on a stopped one...).
    pub fn rebuild_command(&self, slot: u32, command: RebuildCommand) -> Result<(), ControlError> {
        let view = self.rebuilds.lock().expect("rebuilds lock").get(&slot).cloned();
        if view.is_none() && command == RebuildCommand::Start && self.slot(slot)?.state == DriveState::UnconfiguredGood {
            return self.replace_first_fitting(slot);
        }
        let Some(view) = view else {
            let slots: Vec<String> = self.rebuilds().iter().map(|r| r.slot.to_string()).collect();
            let known = if slots.is_empty() { "none has one".to_string() } else { format!("slots with one: {}", slots.join(", ")) };
            return Err(ControlError::NotFound(format!("slot {slot} has no rebuild; {known}")));
        };
        let control = view.progress.control();
        let refuse = |allowed: &str| {
            Err(ControlError::Conflict(format!(
                "the rebuild of slot {slot} is {}; {command:?} is allowed only when it is {allowed}",
                view.status()
            )))
        };
        match (command, control) {
            (RebuildCommand::Pause, background::Control::Run) => view.progress.set_control(background::Control::Pause),
            (RebuildCommand::Resume, background::Control::Pause) => view.progress.set_control(background::Control::Run),
            (RebuildCommand::Stop, background::Control::Run | background::Control::Pause) => {
                view.progress.set_control(background::Control::Stop)
            }
            (RebuildCommand::Start, background::Control::Stop) => return self.restart_rebuild(slot),
            (RebuildCommand::Pause, _) => return refuse("in progress"),
            (RebuildCommand::Resume, _) => return refuse("paused"),
            (RebuildCommand::Stop, _) => return refuse("in progress or paused"),
            (RebuildCommand::Start, _) => return refuse("stopped"),
        }
        self.log(Severity::Info, format!("rebuild of slot {slot} (v{}): {command:?} by the administrator", view.vd_id));
        Ok(())
    }

    /// Puts unconfigured good drive `slot` in the place of member `member` of `vd_id` (out of
    /// service) and rebuilds it: storcli's `insert` followed by `start rebuild`.
    ///
    /// # Errors
    /// What does not fit, with what is allowed; nothing changes then.
    pub fn replace_member(&self, slot: u32, vd_id: u32, member: usize) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id).cloned();
        let Some(record) = record else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        if record.member_slots.get(member).is_some_and(|&old| in_service(&state, vd_id, member, old) && revertible(&state, old)) {
            // The place is held by a spare that took over: the new drive receives a copy of it
            // and the spare returns to the spares (a copyback).
            return self.copy_into_place(&mut state, slot, vd_id, member);
        }
        check_replacement(&state, slot, &record, member)?;
        let vd = Arc::clone(&state.vds[&vd_id]);
        if vd.state() == crate::VdState::Offline {
            return Err(ControlError::Conflict(format!("v{vd_id} is offline: nothing is left to rebuild slot {slot} from")));
        }
        self.swap_in(&mut state, vd_id, member, slot);
        if state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::Rebuild) {
            Ok(())
        } else {
            Err(ControlError::Io(format!("slot {slot} could not take the place of member {member} of v{vd_id}; see the events")))
        }
    }

    /// `start rebuild` on an unconfigured good drive: the first out-of-service member it fits.
    fn replace_first_fitting(&self, slot: u32) -> Result<(), ControlError> {
        let candidates: Vec<(u32, usize)> = {
            let state = self.state.lock().expect("controller lock");
            let capacity = state.slots.get(&slot).map_or(0, |s| s.drive.info().capacity_bytes);
            let fits = |record: &VdRecord| capacity >= record.member_size_bytes;
            state
                .config
                .vds
                .iter()
                .filter(|record| fits(record))
                .flat_map(|record| {
                    let vd = &state.vds[&record.vd_id];
                    (0..record.member_slots.len())
                        .filter(|&i| matches!(vd.member(i).state(), MemberState::Failed | MemberState::Missing))
                        .map(move |i| (record.vd_id, i))
                })
                .collect()
        };
        let Some(&(vd_id, member)) = candidates.first() else {
            return Err(ControlError::Conflict(format!("slot {slot} is UGood but no VD has a member out of service that it fits")));
        };
        self.replace_member(slot, vd_id, member)
    }

    /// Runs a stopped rebuild again from the checkpoint in its drive record.
    fn restart_rebuild(&self, slot: u32) -> Result<(), ControlError> {
        let state = self.state.lock().expect("controller lock");
        let record = state.config.drives.iter().find(|d| d.slot == slot && d.state == DriveState::Rebuild).cloned();
        let Some((record, (vd_id, member))) = record.and_then(|r| member_of(&state, slot).map(|m| (r, m))) else {
            return Err(ControlError::Conflict(format!("slot {slot} is no longer being rebuilt")));
        };
        // The stopped run's thread has ended (its watermark was checkpointed on the way out).
        let stopped = self.rebuilds.lock().expect("rebuilds lock").remove(&slot);
        debug_assert!(stopped.is_some_and(|view| view.progress.control() == background::Control::Stop));
        let vd = Arc::clone(&state.vds[&vd_id]);
        self.spawn_rebuild(vd, vd_id, member, slot, record.rebuild_row, state.config.settings.rebuild_rate_percent);
        drop(state);
        self.log(Severity::Info, format!("rebuild of slot {slot} (v{vd_id}) started again at row {}", record.rebuild_row));
        Ok(())
    }

    /// The rebuilds running or stopped, by slot.
    pub fn rebuilds(&self) -> Vec<RebuildView> {
        self.rebuilds.lock().expect("rebuilds lock").values().cloned().collect()
    }
}

/// Whether `slot` may replace member `member` of `record`: an unconfigured good drive that is
/// present and big enough, and a member that is out of service.
fn check_replacement(state: &State, slot: u32, record: &VdRecord, member: usize) -> Result<(), ControlError> {
    let vd_id = record.vd_id;
    let drive = state.config.drives.iter().find(|d| d.slot == slot);
    let present = state.slots.get(&slot).filter(|s| !s.foreign);
    let (Some(drive), Some(present)) = (drive, present) else {
        return Err(ControlError::NotFound(format!("slot {slot} holds no drive of ours")));
    };
    if drive.state != DriveState::UnconfiguredGood {
        let state_name = drive.state.short_name();
        return Err(ControlError::Conflict(format!(
            "slot {slot} is {state_name}; only an unconfigured good (UGood) drive can replace a member"
        )));
    }
    let capacity_bytes = present.drive.info().capacity_bytes;
    if capacity_bytes < record.member_size_bytes {
        return Err(ControlError::BadInput(format!(
            "slot {slot} has {capacity_bytes} bytes; v{vd_id} needs {} bytes per member",
            record.member_size_bytes
        )));
    }
    let Some(old_slot) = record.member_slots.get(member) else {
        let count = record.member_slots.len();
        return Err(ControlError::BadInput(format!("v{vd_id} has {count} members (0 to {}); member {member} does not exist", count - 1)));
    };
    let out = matches!(state.vds[&vd_id].member(member).state(), MemberState::Failed | MemberState::Missing);
    if !out {
        return Err(ControlError::Conflict(format!(
            "member {member} of v{vd_id} (slot {old_slot}) is in service; only a member out of service can be replaced"
        )));
    }
    Ok(())
}

/// Whether member `member` of `vd_id` (slot `slot`) is online, in the configuration and the engine.
fn in_service(state: &State, vd_id: u32, member: usize, slot: u32) -> bool {
    let online = state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::Online);
    online && state.vds[&vd_id].member(member).state() == MemberState::Online
}

/// Whether `slot` is a hot spare serving as a member (it kept its hot spare record).
fn revertible(state: &State, slot: u32) -> bool {
    state.config.hot_spares.iter().any(|h| h.slot == slot) && member_of(state, slot).is_some()
}

fn finish_removes(finish: &Finish) -> bool {
    !matches!(finish, Finish::Stopped)
}

pub(super) fn set_copy_slot(config: &mut ControllerConfig, slot: u32, copy_slot: Option<u32>) {
    let record = config.drives.iter_mut().find(|d| d.slot == slot).expect("a recorded drive");
    record.copy_slot = copy_slot;
}

pub(super) fn set_rebuild_row(config: &mut ControllerConfig, slot: u32, row: u64) {
    let record = config.drives.iter_mut().find(|d| d.slot == slot).expect("a recorded drive");
    record.rebuild_row = row;
}

/// A row that lost data that could not be recorded as bad blocks is skipped (the member then
/// stays Rbld); anything else ends the run. Losses that were recorded come back as `Ok`.
pub(super) fn row_outcome(result: Result<(), crate::VdError>) -> RowOutcome {
    match result {
        Ok(()) => RowOutcome::Done,
        Err(error @ crate::VdError::RowUnrecoverable { .. }) => RowOutcome::Unrecoverable(error.to_string()),
        Err(error) => RowOutcome::Fatal(error.to_string()),
    }
}
