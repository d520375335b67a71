//! Copyback and proactive replacement: one copy mechanism for both.
//!
//! A copy takes an online member (the source) and another drive (the target, UGood or a hot
//! spare) and ends with the target in the member's place:
//! - **copyback**: a hot spare that took a member's place keeps its hot spare record while it
//!   serves (a revertible spare) and its drive record's `copy_slot` names the slot it replaced.
//!   When that slot holds a good drive again (a blank drive found there at start, `set good` on
//!   it, or `insert` of a drive into the spare's place), the spare is copied to it, and returns
//!   to the spares as it was (global or dedicated) once the copy is done. Automatic with
//!   `copyback=on` (the default); by hand at any time with `start copyback`.
//! - **proactive replacement** (md's `want_replacement`): `/c0/sN start copyback target=M` on
//!   a member N copies it to M while it keeps serving; then M replaces N and N becomes UGood.
//!   It may start on a degraded VD (replacing a failing member early is the point; a strip the
//!   member cannot read is then lost if nothing else holds it, and the copy is abandoned), never
//!   on an offline one. M is a UGood drive or a hot spare that serves the VD's drive group.
//!
//! The order of things, each step recorded before the next one depends on it: the target is
//! recorded `Cpybck` (with `copy_slot` = the source) before the engine sends it writes; the
//! engine then writes every client write of the member to the target too (`vd::copy`), and a
//! background process (`crate::background`, at the rebuild rate) copies the rows in order under
//! their row locks, checkpointing its watermark in the target's `rebuild_row` (a restart
//! resumes there: below it the target received every row and every write since). At the end
//! the swap is recorded (target `Onln` in the member's slot, source `HSP` or `UGood`), then the
//! engine switches the member to the target and waits for the I/O that may still reach the
//! source before the source can be used elsewhere.
//!
//! When the target fails, the copy stops and the target leaves (UBad); writes that skip it are
//! acknowledged only once that is recorded. When the source leaves service, the target takes
//! its place as a rebuild from row 0 (rows written while the member was out may be missing on
//! it, and nothing says which). `stop copyback` abandons the copy: the target returns to what
//! it was. A shutdown only pauses it until the next start.

use super::rebuild::{row_outcome, set_copy_slot, set_rebuild_row, status_words, time_left, CLIENTS_BUSY_WINDOW};
use super::*;
use crate::background::{self, Finish, Hooks, Progress};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod triggers;

/// How long the end of a copy waits for member I/O that may still reach its source or target.
const COPY_RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
/// A progress event at every this share of the copy.
const PROGRESS_EVENT_PERCENT: u64 = 25;

/// A copy that runs, for `show copyback` and its controls.
#[derive(Clone)]
pub struct CopyView {
    /// The drive receiving the copy (Cpybck).
    pub target_slot: u32,
    /// The member being copied.
    pub source_slot: u32,
    pub vd_id: u32,
    pub member: usize,
    pub progress: Arc<Progress>,
    /// When this run began, and at which row (for the estimate of the time left).
    pub started: Instant,
    pub start_row: u64,
    /// Set by `stop copyback`: the copy is abandoned, not kept for the next start.
    abandon: Arc<AtomicBool>,
}

impl CopyView {
    /// storcli's words: "In progress", "Paused", "Stopped".
    pub fn status(&self) -> &'static str {
        status_words(&self.progress)
    }

    /// At the speed so far since this run began; `None` before there is a speed to go by.
    pub fn estimated_time_left(&self) -> Option<Duration> {
        time_left(&self.progress, self.started, self.start_row)
    }
}

/// `/c0/sN stop|pause|resume copyback`, on the target or the source of the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopybackCommand {
    /// Abandons the copy: the target returns to what it was (UGood or hot spare).
    Stop,
    Pause,
    Resume,
}

/// Where a copy stands in the configuration: member `member` of `vd_id` (slot `source`) is
/// copied to slot `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CopyJob {
    vd_id: u32,
    member: usize,
    source: u32,
    target: u32,
}

impl Controller {
    /// `/c0/sN start copyback target=M`: copies member `source` to `target` while it serves;
    /// then `target` takes its place. A spare serving as a member returns to the spares, any
    /// other member becomes UGood.
    ///
    /// # Errors
    /// What does not fit (the source is no online member, the target no UGood drive or hot
    /// spare of its drive group, too small, the same drive, the VD offline), with what is
    /// allowed; nothing changes then.
    pub fn start_copyback(&self, source: u32, target: u32) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let copy = check_copy(&state, source, target)?;
        self.begin_copy(&mut state, copy, "started by the administrator")
    }

    /// Steers the copy that `slot` (its target or its source) takes part in.
    ///
    /// # Errors
    /// No copy at that slot (with the slots that have one), or the command does not fit its
    /// state (pause on a paused one...).
    pub fn copyback_command(&self, slot: u32, command: CopybackCommand) -> Result<(), ControlError> {
        let view = self.copybacks().into_iter().find(|c| c.target_slot == slot || c.source_slot == slot);
        let Some(view) = view else {
            let slots: Vec<String> = self.copybacks().iter().map(|c| format!("{} (to {})", c.source_slot, c.target_slot)).collect();
            let known = if slots.is_empty() { "none has one".to_string() } else { format!("slots with one: {}", slots.join(", ")) };
            return Err(ControlError::NotFound(format!("slot {slot} has no copyback; {known}")));
        };
        let refuse = |allowed: &str| {
            let status = view.status();
            Err(ControlError::Conflict(format!(
                "the copyback to slot {} is {status}; {command:?} is allowed only when it is {allowed}",
                view.target_slot
            )))
        };
        match (command, view.progress.control()) {
            (CopybackCommand::Pause, background::Control::Run) => view.progress.set_control(background::Control::Pause),
            (CopybackCommand::Resume, background::Control::Pause) => view.progress.set_control(background::Control::Run),
            (CopybackCommand::Stop, background::Control::Run | background::Control::Pause) => {
                view.abandon.store(true, Ordering::SeqCst);
                view.progress.set_control(background::Control::Stop);
            }
            (CopybackCommand::Pause, _) => return refuse("in progress"),
            (CopybackCommand::Resume, _) => return refuse("paused"),
            (CopybackCommand::Stop, _) => return refuse("in progress or paused"),
        }
        let (source, target) = (view.source_slot, view.target_slot);
        self.log(Severity::Info, format!("copyback of slot {source} to slot {target}: {command:?} by the administrator"));
        Ok(())
    }

    /// The copies running, paused or stopping, by target slot.
    pub fn copybacks(&self) -> Vec<CopyView> {
        self.copies.lock().expect("copies lock").values().cloned().collect()
    }

    /// Records `copy.target` as receiving a copy of `copy.source`, then starts it. `why` goes
    /// into the event.
    fn begin_copy(&self, state: &mut State, copy: CopyJob, why: &str) -> Result<(), ControlError> {
        let CopyJob { vd_id, member, source, target } = copy;
        let before = state.config.clone();
        let detail = format!("receives a copy of slot {source} (member {member} of v{vd_id}), {why}");
        self.transition(state, target, DriveState::Copyback, state::Cause::CopybackStarted, Some(&detail));
        set_copy_slot(&mut state.config, target, Some(source));
        set_rebuild_row(&mut state.config, target, 0);
        if let Err(error) = self.persist(state) {
            state.config = before;
            self.log(Severity::Critical, format!("copyback of slot {source} to slot {target} not started: {error}"));
            return Err(error);
        }
        let vd = Arc::clone(&state.vds[&vd_id]);
        vd.start_copy(member, Arc::clone(&state.slots[&target].drive));
        self.spawn_copy(vd, copy, 0, state.config.settings.rebuild_rate_percent);
        Ok(())
    }

    /// Starts the copy process on a thread of its own. May be called with the state lock held:
    /// the thread takes it only later.
    fn spawn_copy(&self, vd: Arc<VirtualDrive>, copy: CopyJob, start_row: u64, rate_percent: u8) {
        let progress = Progress::new(vd.geometry().row_count(), start_row, rate_percent);
        progress.size_windows_for(vd.geometry().strip_size_bytes());
        let view = CopyView {
            target_slot: copy.target,
            source_slot: copy.source,
            vd_id: copy.vd_id,
            member: copy.member,
            progress: Arc::clone(&progress),
            started: Instant::now(),
            start_row,
            abandon: Arc::new(AtomicBool::new(false)),
        };
        let abandon = Arc::clone(&view.abandon);
        self.copies.lock().expect("copies lock").insert(copy.target, view);
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name(format!("storc-copy-s{}", copy.target)).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            let finish = controller.run_copy(&vd, copy, &progress);
            let finish = match vd.copy_target(copy.member) {
                Some(target) => super::rebuild::durable(finish, &**target.target()),
                None => finish,
            };
            controller.copy_ended(copy, &progress, finish, abandon.load(Ordering::SeqCst));
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => self.log(Severity::Critical, format!("copyback to slot {} cannot start a thread: {error}", copy.target)),
        }
    }

    fn run_copy(&self, vd: &Arc<VirtualDrive>, copy: CopyJob, progress: &Progress) -> Finish {
        let engine = Arc::clone(&self.engine);
        let submit_row = |row: u64, done: Box<dyn FnOnce(background::RowOutcome) + Send>| {
            engine.copy_row(vd, row, copy.member, Box::new(move |result| done(row_outcome(result))));
        };
        let mut quarter_logged = progress.watermark_row() * 100 / progress.total_rows.max(1) / PROGRESS_EVENT_PERCENT;
        let mut checkpoint = |row: u64| {
            self.checkpoint_copy(vd, copy, row);
            let quarter = row * 100 / progress.total_rows.max(1) / PROGRESS_EVENT_PERCENT;
            if quarter > quarter_logged && row < progress.total_rows {
                quarter_logged = quarter;
                let percent = quarter * PROGRESS_EVENT_PERCENT;
                self.log(Severity::Info, format!("copyback of slot {} to slot {}: {percent}% done", copy.source, copy.target));
            }
        };
        let clients_busy = || vd.last_client_request().elapsed() < CLIENTS_BUSY_WINDOW;
        let submit_rows = background::row_by_row(&submit_row);
        background::run(
            progress,
            Hooks { submit_rows: &submit_rows, checkpoint: &mut checkpoint, clients_busy: &clients_busy, advanced: &|_| {} },
        )
    }

    /// Records the watermark in the target's drive record, so that a restart resumes there;
    /// the target is flushed first, so that the record never vouches for rows a power cut lost.
    fn checkpoint_copy(&self, vd: &VirtualDrive, copy: CopyJob, row: u64) {
        let Some(running) = vd.copy_target(copy.member) else { return };
        if let Err(error) = crate::bitmap::ondisk::flush(&**running.target()) {
            let target = copy.target;
            return self
                .log(Severity::Warning, format!("copyback to slot {target}: checkpoint at row {row} not written, flush failed: {error}"));
        }
        drop(running);
        let mut state = self.state.lock().expect("controller lock");
        if !copy_recorded(&state, copy) {
            return;
        }
        set_rebuild_row(&mut state.config, copy.target, row);
        if let Err(error) = self.persist(&mut state) {
            self.log(Severity::Warning, format!("copyback to slot {}: checkpoint at row {row} not written: {error}", copy.target));
        }
    }

    fn copy_ended(&self, copy: CopyJob, progress: &Progress, finish: Finish, abandon: bool) {
        let (source, target) = (copy.source, copy.target);
        if finish == Finish::Complete {
            self.copy_done(copy, progress);
            self.copies.lock().expect("copies lock").remove(&target);
            return;
        }
        let mut state = self.state.lock().expect("controller lock");
        let running = copy_running(&state, copy);
        match finish {
            Finish::Stopped if abandon && running => {
                let reason = format!("stopped by the administrator at {:.1}%", progress.percent_done());
                self.abandon_copy(&mut state, copy, &reason, Severity::Warning);
            }
            Finish::Stopped if running => {
                // Shutdown: the copy stays recorded and resumes at the next start.
                let percent = progress.percent_done();
                return self.log(
                    Severity::Info,
                    format!("copyback of slot {source} to slot {target} stopped at {percent:.1}%; it resumes at the next start"),
                );
            }
            // The target and the member are still fine: a row could not be produced.
            Finish::Failed(reason) if running => self.abandon_copy(&mut state, copy, &reason, Severity::Critical),
            // The target failed or the member left service: that path said what follows.
            Finish::Failed(reason) => self.log(Severity::Warning, format!("copyback of slot {source} to slot {target} ended: {reason}")),
            Finish::Stopped | Finish::Complete => {}
        }
        drop(state);
        self.copies.lock().expect("copies lock").remove(&target);
    }

    /// Every row is copied: the swap is recorded, then the engine switches the member to the
    /// target, then the source is released (a spare returns to the spares).
    fn copy_done(&self, copy: CopyJob, progress: &Progress) {
        let mut state = self.state.lock().expect("controller lock");
        if !copy_running(&state, copy) {
            return;
        }
        let bad_rows = progress.bad_rows();
        if let Some(first) = bad_rows.iter().min() {
            let reason = format!("{} row(s) of the source could not be read nor rebuilt (first: row {first})", bad_rows.len());
            return self.abandon_copy(&mut state, copy, &reason, Severity::Critical);
        }
        let CopyJob { vd_id, member, source, target } = copy;
        let before = state.config.clone();
        let revertible = state.config.hot_spares.iter().any(|h| h.slot == source);
        let detail = format!("takes the place of slot {source} in v{vd_id}");
        self.transition(&mut state, target, DriveState::Online, state::Cause::CopybackDone, Some(&detail));
        let (back_to, detail) = match revertible {
            true => (DriveState::HotSpare, format!("slot {target} holds its data in v{vd_id}; back to the hot spares")),
            false => (DriveState::UnconfiguredGood, format!("replaced by slot {target} in v{vd_id}")),
        };
        self.transition(&mut state, source, back_to, state::Cause::CopybackDone, Some(&detail));
        let record = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id).expect("checked");
        record.member_slots[member] = target;
        // A hot spare that received the copy now serves as a revertible spare in turn.
        let target_revertible = state.config.hot_spares.iter().any(|h| h.slot == target);
        set_copy_slot(&mut state.config, target, target_revertible.then_some(source));
        set_rebuild_row(&mut state.config, target, 0);
        set_copy_slot(&mut state.config, source, None);
        if let Err(error) = self.persist(&mut state) {
            // Still Cpybck on disk: a restart resumes the copy from its last checkpoint.
            state.config = before;
            return self.log(Severity::Critical, format!("copyback of slot {source} to slot {target} done but not recorded: {error}"));
        }
        let vd = Arc::clone(&state.vds[&vd_id]);
        let ended = vd.finish_copy(member);
        self.release_copy(&vd, &ended, source);
        let secs = self.copybacks().iter().find(|c| c.target_slot == target).map_or(0.0, |c| c.started.elapsed().as_secs_f64());
        self.log(Severity::Info, format!("copyback of slot {source} to slot {target} (v{vd_id}) done in {secs:.1} s"));
    }

    /// Ends a copy before its end: the target returns to what it was (UGood, or a hot spare).
    /// Recorded before the engine stops writing the target; if it cannot be recorded, the copy
    /// stays as it is (the target keeps receiving writes) and a restart resumes it.
    fn abandon_copy(&self, state: &mut State, copy: CopyJob, reason: &str, severity: Severity) {
        let CopyJob { source, target, vd_id, member } = copy;
        self.log(severity, format!("copyback of slot {source} to slot {target} (v{vd_id}) abandoned: {reason}"));
        let before = state.config.clone();
        self.return_target(state, target, state::Cause::CopybackStopped, reason);
        if let Err(error) = self.persist(state) {
            state.config = before;
            return self
                .log(Severity::Critical, format!("slot {target} cannot leave the copy: {error}; the copy resumes at the next start"));
        }
        let vd = Arc::clone(&state.vds[&vd_id]);
        if let Some(ended) = vd.end_copy(member) {
            self.release_copy(&vd, &ended, target);
        }
    }

    /// Waits until no I/O of `vd` can still reach the drive at `slot` through the ended copy.
    fn release_copy(&self, vd: &VirtualDrive, ended: &Arc<crate::vd::CopyTarget>, slot: u32) {
        if !vd.wait_copy_released(ended, COPY_RELEASE_TIMEOUT) {
            let secs = COPY_RELEASE_TIMEOUT.as_secs();
            self.log(
                Severity::Warning,
                format!("slot {slot}: member I/O of v{} still in flight after {secs} s; it may still land", vd.id()),
            );
        }
    }

    /// The copy target of member `event.member` failed (reported by the write tee or the copy):
    /// recorded UBad, then the ack gate lets the writes it held go, then the copy ends.
    pub(super) fn copy_target_failed(&self, event: MemberEvent) {
        let mut state = self.state.lock().expect("controller lock");
        let Some(vd) = state.vds.values().find(|vd| vd.instance_id() == event.instance_id).cloned() else { return };
        let vd_id = u32::try_from(event.vd_id).expect("VD ids are u32");
        let source = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("a live VD has a record").member_slots[event.member];
        let Some(target) = copy_target_of(&state.config, source) else {
            drop(state);
            return vd.failure_recorded(Ok(())); // the copy ended meanwhile
        };
        let before = state.config.clone();
        let detail = format!("copy target of slot {source} (v{vd_id}): {}; the copy stops", event.reason);
        self.transition(&mut state, target, DriveState::UnconfiguredBad, state::Cause::IoFailure, Some(&detail));
        state.config.hot_spares.retain(|h| h.slot != target);
        set_copy_slot(&mut state.config, target, None);
        set_rebuild_row(&mut state.config, target, 0);
        let recorded = self.persist(&mut state).map_err(|e| e.to_string());
        if recorded.is_err() {
            state.config = before;
        }
        vd.failure_recorded(recorded.clone());
        if recorded.is_ok() {
            self.stop_copy_view(target);
            if let Some(ended) = vd.end_copy(event.member) {
                self.release_copy(&vd, &ended, target);
            }
        }
    }

    /// Members of `vd_id` out of service whose copy was running: the target takes the member's
    /// place and is rebuilt from row 0 (writes made while the member was out may be missing on
    /// it). A VD beyond its tolerance has nothing to rebuild from: the copy is abandoned.
    pub(super) fn rebuild_onto_copy_targets(&self, state: &mut State, vd_id: u32) {
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id).cloned().expect("a live VD has a record");
        let vd = Arc::clone(&state.vds[&vd_id]);
        for (member, &source) in record.member_slots.iter().enumerate() {
            if !matches!(vd.member(member).state(), MemberState::Failed | MemberState::Missing) {
                continue;
            }
            let Some(target) = copy_target_of(&state.config, source) else { continue };
            let copy = CopyJob { vd_id, member, source, target };
            self.stop_copy_view(target);
            if vd.state() == crate::VdState::Offline {
                self.abandon_copy(state, copy, &format!("slot {source} left service and v{vd_id} is offline"), Severity::Critical);
                continue;
            }
            if let Some(ended) = vd.end_copy(member) {
                self.release_copy(&vd, &ended, source);
            }
            self.log(Severity::Warning, format!("slot {source} left service during its copy: slot {target} takes its place, rebuilt"));
            self.swap_in(state, vd_id, member, target);
        }
    }

    fn stop_copy_view(&self, target: u32) {
        if let Some(view) = self.copies.lock().expect("copies lock").get(&target) {
            view.progress.set_control(background::Control::Stop);
        }
    }
}

/// Whether `target` may receive a copy of member `source`, and of which VD and member.
fn check_copy(state: &State, source: u32, target: u32) -> Result<CopyJob, ControlError> {
    let state_of = |slot: u32| state.config.drives.iter().find(|d| d.slot == slot).map(|d| d.state);
    let Some(source_state) = state_of(source) else {
        return Err(ControlError::NotFound(format!("slot {source} holds no drive of ours")));
    };
    if target == source {
        return Err(ControlError::BadInput(format!("slot {source} cannot be copied onto itself; give target= another drive")));
    }
    let Some((vd_id, member)) = member_of(state, source) else {
        let name = source_state.short_name();
        return Err(ControlError::Conflict(format!("slot {source} is {name}, in no VD; only an online member (Onln) can be copied")));
    };
    let vd = &state.vds[&vd_id];
    if source_state != DriveState::Online || vd.member(member).state() != MemberState::Online {
        let name = source_state.short_name();
        return Err(ControlError::Conflict(format!("slot {source} is {name} in v{vd_id}; only an online member (Onln) can be copied")));
    }
    if vd.state() == crate::VdState::Offline {
        return Err(ControlError::Conflict(format!(
            "v{vd_id} is offline: a copy needs a VD that serves; bring it back first (set online force)"
        )));
    }
    if let Some(other) = copy_target_of(&state.config, source) {
        return Err(ControlError::Conflict(format!("slot {source} is being copied to slot {other} already; stop that copyback first")));
    }
    let record = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("a live VD has a record");
    check_target(state, target, record)?;
    Ok(CopyJob { vd_id, member, source, target })
}

/// Whether `target` may receive a copy of a member of `record`: present and ours, unconfigured
/// good or a hot spare that serves the VD's drive group, and big enough.
fn check_target(state: &State, target: u32, record: &VdRecord) -> Result<(), ControlError> {
    let vd_id = record.vd_id;
    let drive = state.config.drives.iter().find(|d| d.slot == target);
    let present = state.slots.get(&target).filter(|s| !s.foreign);
    let (Some(drive), Some(present)) = (drive, present) else {
        return Err(ControlError::NotFound(format!("slot {target} holds no drive of ours")));
    };
    let allowed =
        format!("a copy goes to an unconfigured good drive (UGood) or a hot spare that serves drive group {}", record.drive_group);
    let spare_groups = state.config.hot_spares.iter().find(|h| h.slot == target).map(|h| &h.dedicated_drive_groups);
    let what = match (member_of(state, target), spare_groups) {
        (Some((vd, _)), _) => format!("{} (a member of v{vd})", drive.state.short_name()),
        (None, Some(groups)) if !groups.is_empty() => {
            format!("{} (dedicated to drive group(s) {})", drive.state.short_name(), slot_list(groups))
        }
        (None, _) => drive.state.short_name().to_string(),
    };
    let fits_group = match (drive.state, spare_groups) {
        (DriveState::UnconfiguredGood, _) => true,
        (DriveState::HotSpare, Some(groups)) => groups.is_empty() || groups.contains(&record.drive_group),
        _ => false,
    };
    if !fits_group {
        return Err(ControlError::Conflict(format!("slot {target} is {what}; {allowed}")));
    }
    let capacity_bytes = present.drive.info().capacity_bytes;
    if capacity_bytes < record.member_size_bytes {
        let needed = record.member_size_bytes;
        return Err(ControlError::BadInput(format!("slot {target} has {capacity_bytes} bytes; v{vd_id} needs {needed} bytes per member")));
    }
    Ok(())
}

/// The slot receiving a copy of member slot `source`, if any.
fn copy_target_of(config: &ControllerConfig, source: u32) -> Option<u32> {
    config.drives.iter().find(|d| d.state == DriveState::Copyback && d.copy_slot == Some(source)).map(|d| d.slot)
}

/// Whether the configuration still records `copy` (target Cpybck from that source, which is
/// still that member).
fn copy_recorded(state: &State, copy: CopyJob) -> bool {
    let member_slot = state.config.vds.iter().find(|v| v.vd_id == copy.vd_id).and_then(|v| v.member_slots.get(copy.member).copied());
    member_slot == Some(copy.source) && copy_target_of(&state.config, copy.source) == Some(copy.target)
}

/// Whether `copy` is recorded and still runs in the engine: the member online, its copy there
/// and its target not failed.
fn copy_running(state: &State, copy: CopyJob) -> bool {
    let Some(vd) = state.vds.get(&copy.vd_id) else { return false };
    let engine_copy = vd.copy_target(copy.member).is_some_and(|c| !c.has_failed());
    copy_recorded(state, copy) && engine_copy && vd.member(copy.member).state() == MemberState::Online
}
