//! Live migration: a whole VD copied onto one drive (an RBD image, typically) while it serves,
//! then the VD switched to a JBOD of that drive with its id, name, size and export unchanged.
//!
//! The order of things, each step recorded before the next one depends on it: the target is
//! recorded `Mgrt` (its `copy_slot` naming the VD) before the engine sends it writes; the engine
//! then writes every member write of the VD to it too (`vd::migration`), and a background
//! process copies the rows under their row locks. After a crash the copy starts again from row
//! 0: writes in flight at the crash may be on the members and not on the target, and replay of
//! the journal at start writes the members only. A clean stop is different: once the shutdown
//! has written the cache out (the journal left empty) and flushed every VD, the target among
//! them, the target holds every row below the copy's watermark and every write since the start;
//! that watermark is recorded as the target's `rebuild_row`, and the next start resumes there,
//! after recording 0 again before any request can arrive (a crash in the resumed run must not
//! find the old checkpoint).
//!
//! The switch ([`Controller::switch_to_target`]): requests to the VD are held and those in flight
//! drained; everything cached is written to the members and the journal emptied (a parity row's
//! journal records are member images, which must never be replayed onto the JBOD); the target is
//! flushed; the record becomes a JBOD of the target (member size = reserved area + capacity, so
//! the same size) and the old members leave it, persisted before any request reaches the target
//! alone; then a new `VirtualDrive` takes the old one's place and the old one names it as its
//! successor, so requests through any handle of the old one (an NBD connection's) go on.

use super::bays::lowest_free_slot;
use super::rebuild::{row_outcome, set_copy_slot, set_rebuild_row, status_words, time_left, CLIENTS_BUSY_WINDOW};
use super::*;
use crate::background::{self, Finish, Hooks, Progress};
use crate::vd::MEMBER_RESERVED_BYTES;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the switch waits for the VD's requests in flight before it gives up (and retries).
const SWITCH_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A progress event at every this share of the copy.
const PROGRESS_EVENT_PERCENT: u64 = 25;

/// A migration that runs, for `show migrate` and `stop migrate`.
#[derive(Clone)]
pub struct MigrationView {
    pub vd_id: u32,
    /// The drive receiving the VD (Mgrt).
    pub target_slot: u32,
    /// What that drive was opened from (`rbd:POOL/IMAGE`, a path).
    pub target_source: String,
    pub progress: Arc<Progress>,
    /// When this run began, and at which row (for the estimate of the time left).
    pub started: Instant,
    start_row: u64,
    /// Set by `stop migrate`: the copy is abandoned, not kept for the next start.
    abandon: Arc<AtomicBool>,
}

impl MigrationView {
    /// storcli's words: "In progress", "Paused", "Stopped".
    pub fn status(&self) -> &'static str {
        status_words(&self.progress)
    }

    /// At the speed so far since this run began; `None` before there is a speed to go by.
    pub fn estimated_time_left(&self) -> Option<Duration> {
        time_left(&self.progress, self.started, self.start_row)
    }
}

impl Controller {
    /// `/c0/vN start migrate target=M`: copies VD `vd_id` onto the UGood drive in slot `target`
    /// while it serves, then switches the VD to a JBOD of that drive.
    ///
    /// # Errors
    /// What does not fit (no such VD, a cache VD or one with SSD caching, an offline VD, a
    /// migration or another background operation on it, a target that is not a UGood drive or
    /// is too small), with what is allowed; nothing changes then.
    pub fn start_migration(&self, vd_id: u32, target: u32) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.config.vds.iter().all(|v| v.vd_id != vd_id) {
            // `no_vd` lists the VDs under the lock itself.
            drop(state);
            return Err(self.no_vd(vd_id));
        }
        self.check_vd_migratable(&state, vd_id)?;
        check_target_slot(&state, vd_id, target)?;
        let before = state.config.clone();
        self.begin_migration(&mut state, vd_id, target).inspect_err(|_| state.config = before)
    }

    /// `/c0/vN start migrate target=SPEC` with a drive the controller does not hold yet (an RBD
    /// image named at run time): the drive, which must be blank, takes the lowest free slot and
    /// receives VD `vd_id`. Its record and the migration are written in one configuration
    /// update, so a crash leaves either no trace of the drive or the migration recorded (which
    /// starts again). Returns the slot.
    ///
    /// # Errors
    /// As [`Controller::start_migration`], and a drive that is not blank or is already held (with
    /// its slot); nothing changes then.
    pub fn start_migration_onto(&self, vd_id: u32, offer: OfferedDrive) -> Result<u32, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.config.vds.iter().all(|v| v.vd_id != vd_id) {
            drop(state);
            return Err(self.no_vd(vd_id));
        }
        if let Some((slot, _)) = state.slots.iter().find(|(_, held)| held.source == offer.source) {
            return Err(ControlError::Conflict(format!("{} is slot {slot} already; give target={slot}", offer.source)));
        }
        self.check_vd_migratable(&state, vd_id)?;
        check_blank(&state, &offer)?;
        let capacity_bytes = offer.drive.info().capacity_bytes;
        check_target_capacity(&state, vd_id, &offer.source, capacity_bytes)?;
        let before = state.config.clone();
        let slot = lowest_free_slot(&state);
        let drive_id = DriveId(random_id());
        let record = DriveRecord { slot, drive_id, state: DriveState::UnconfiguredGood, capacity_bytes, rebuild_row: 0, copy_slot: None };
        state.config.drives.push(record);
        let source = offer.source.clone();
        state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id, foreign: false });
        match self.begin_migration(&mut state, vd_id, slot) {
            Ok(()) => {
                self.log(Severity::Info, format!("slot {slot}: {source} ({capacity_bytes} bytes) added to receive v{vd_id}"));
                Ok(slot)
            }
            Err(error) => {
                state.slots.remove(&slot);
                state.config = before;
                Err(error)
            }
        }
    }

    /// The bytes a drive needs to receive VD `vd_id` (its capacity and the reserved area), once
    /// the VD is one that can be migrated now: what a drive made for it must hold.
    ///
    /// # Errors
    /// As [`Controller::start_migration`] for the VD.
    pub fn migration_target_bytes(&self, vd_id: u32) -> Result<u64, ControlError> {
        let state = self.state.lock().expect("controller lock");
        let Some(vd) = state.vds.get(&vd_id) else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        let needed_bytes = MEMBER_RESERVED_BYTES + vd.capacity_bytes();
        self.check_vd_migratable(&state, vd_id)?;
        Ok(needed_bytes)
    }

    /// The slot of the drive opened from `source` (a `--drive` argument, or a target added at
    /// run time), if the controller holds one.
    pub fn slot_of_source(&self, source: &str) -> Option<u32> {
        let state = self.state.lock().expect("controller lock");
        state.slots.iter().find(|(_, held)| held.source == source).map(|(slot, _)| *slot)
    }

    /// Records `target` (checked) as receiving `vd_id` and starts the copy. On an error the
    /// caller restores the configuration it had.
    fn begin_migration(&self, state: &mut State, vd_id: u32, target: u32) -> Result<(), ControlError> {
        let detail = format!("receives v{vd_id}, which moves onto it");
        self.transition(state, target, DriveState::Migrate, state::Cause::MigrationStarted, Some(&detail));
        set_copy_slot(&mut state.config, target, Some(vd_id));
        if let Err(error) = self.persist(state) {
            self.log(Severity::Critical, format!("migration of v{vd_id} to slot {target} not started: {error}"));
            return Err(error);
        }
        let vd = Arc::clone(&state.vds[&vd_id]);
        let drive = Arc::clone(&state.slots[&target].drive);
        let rate = state.config.settings.rebuild_rate_percent;
        // Under the lock, as a copy starts: no check or SSD caching may start on the VD between
        // the checks above and the migration's entry in the list.
        vd.start_migration(drive);
        let source = state.slots[&target].source.clone();
        self.spawn_migration(vd, vd_id, (target, source), 0, rate);
        Ok(())
    }

    /// Whether VD `vd_id` (which exists) can move now.
    fn check_vd_migratable(&self, state: &State, vd_id: u32) -> Result<(), ControlError> {
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("the caller checked that the VD exists");
        let vd = &state.vds[&vd_id];
        let refuse = |why: String| Err(ControlError::Conflict(format!("v{vd_id} cannot be migrated: {why}")));
        if record.cache_vd || record.ssd_cache_vd_id.is_some() {
            return refuse("SSD caching is on for it (turn it off first: its dirty lines are not on the members)".into());
        }
        if vd.state() == crate::VdState::Offline {
            return refuse("it is offline".into());
        }
        if let Some(busy) = self.background_on(vd_id) {
            return refuse(format!("{busy} runs on it; wait for it to end or stop it"));
        }
        Ok(())
    }

    /// The background operation running on VD `vd_id`, if any, in the CLI's words.
    fn background_on(&self, vd_id: u32) -> Option<&'static str> {
        if self.migrations.lock().expect("migrations lock").contains_key(&vd_id) {
            return Some("a migration");
        }
        if self.rebuilds.lock().expect("rebuilds lock").values().any(|r| r.vd_id == vd_id) {
            return Some("a rebuild");
        }
        if self.copies.lock().expect("copies lock").values().any(|c| c.vd_id == vd_id) {
            return Some("a copyback");
        }
        if self.checks.lock().expect("checks lock").contains_key(&vd_id) {
            return Some("a consistency check");
        }
        if self.resyncs.lock().expect("resyncs lock").contains_key(&vd_id) {
            return Some("a resync or background initialization");
        }
        if self.inits.lock().expect("inits lock").contains_key(&vd_id) {
            return Some("a full initialization");
        }
        None
    }

    /// The migrations running, by VD.
    pub fn migrations(&self) -> Vec<MigrationView> {
        self.migrations.lock().expect("migrations lock").values().cloned().collect()
    }

    /// `/c0/vN pause migrate`: the copy waits (writes still go to both sides); `resume migrate`
    /// goes on from where it was.
    ///
    /// # Errors
    /// No migration of that VD, or one that is not running (pause) or paused (resume).
    pub fn pause_migration(&self, vd_id: u32, pause: bool) -> Result<(), ControlError> {
        let view = self.migrations.lock().expect("migrations lock").get(&vd_id).cloned();
        let Some(view) = view else { return Err(self.no_migration(vd_id)) };
        let (from, to, verb) = match pause {
            true => (background::Control::Run, background::Control::Pause, "paused"),
            false => (background::Control::Pause, background::Control::Run, "resumed"),
        };
        if view.progress.control() != from {
            let allowed = if pause { "in progress" } else { "paused" };
            return Err(ControlError::Conflict(format!(
                "the migration of v{vd_id} is {}; it can be {verb} only when it is {allowed}",
                view.status()
            )));
        }
        view.progress.set_control(to);
        self.log(Severity::Info, format!("migration of v{vd_id}: {verb} by the administrator"));
        Ok(())
    }

    fn no_migration(&self, vd_id: u32) -> ControlError {
        let running: Vec<String> = self.migrations.lock().expect("migrations lock").keys().map(|v| format!("v{v}")).collect();
        let known = if running.is_empty() { "none runs".to_string() } else { format!("running: {}", running.join(", ")) };
        ControlError::NotFound(format!("v{vd_id} is not being migrated; {known}"))
    }

    /// `/c0/vN stop migrate`: abandons the copy; the target returns to UGood.
    ///
    /// # Errors
    /// No migration of that VD (with the VDs that have one).
    pub fn stop_migration(&self, vd_id: u32) -> Result<(), ControlError> {
        let view = self.migrations.lock().expect("migrations lock").get(&vd_id).cloned();
        let Some(view) = view else { return Err(self.no_migration(vd_id)) };
        view.abandon.store(true, Ordering::SeqCst);
        view.progress.set_control(background::Control::Stop);
        self.log(Severity::Info, format!("migration of v{vd_id}: stopped by the administrator"));
        Ok(())
    }

    /// At start: every drive recorded `Mgrt` receives its VD again, from row 0.
    pub(super) fn resume_migrations(&self, state: &mut State) {
        let targets: Vec<(u32, Option<u32>)> =
            state.config.drives.iter().filter(|d| d.state == DriveState::Migrate).map(|d| (d.slot, d.copy_slot)).collect();
        for (target, vd_id) in targets {
            let vd = vd_id.and_then(|vd_id| state.vds.get(&vd_id).map(|vd| (vd_id, Arc::clone(vd))));
            let present = state.slots.get(&target).map(|s| Arc::clone(&s.drive));
            let (Some((vd_id, vd)), Some(drive)) = (vd, present) else {
                self.return_migration_target(state, target, "its VD or the drive is gone");
                continue;
            };
            if vd.state() == crate::VdState::Offline {
                self.return_migration_target(state, target, "its VD is offline");
                continue;
            }
            let start_row = self.take_migration_checkpoint(state, target, vd.geometry().row_count());
            let from = if start_row == 0 {
                "from the beginning".to_string()
            } else {
                format!("at row {start_row}, its checkpoint from a clean stop")
            };
            self.log(Severity::Info, format!("migration of v{vd_id} to slot {target}: starts again {from}"));
            vd.start_migration(drive);
            let source = state.slots[&target].source.clone();
            self.spawn_migration(vd, vd_id, (target, source), start_row, state.config.settings.rebuild_rate_percent);
        }
    }

    /// The row a migration to `target` resumes at: its checkpoint, which is recorded as 0 again
    /// first (see the module docs); 0 when there is none or that cannot be recorded.
    fn take_migration_checkpoint(&self, state: &mut State, target: u32, row_count: u64) -> u64 {
        let checkpoint = state.config.drives.iter().find(|d| d.slot == target).map_or(0, |d| d.rebuild_row).min(row_count);
        if checkpoint == 0 {
            return 0;
        }
        set_rebuild_row(&mut state.config, target, 0);
        match self.persist(state) {
            Ok(()) => checkpoint,
            Err(error) => {
                self.log(
                    Severity::Warning,
                    format!("slot {target}: its migration checkpoint could not be cleared ({error}); the copy starts over"),
                );
                0
            }
        }
    }

    /// At a clean stop (see the module docs): each migration the shutdown stopped records its
    /// clean rows as its target's checkpoint, if everything was written out and the target did
    /// not fail meanwhile.
    pub(super) fn checkpoint_stopped_migrations(&self, state: &mut State, written_out: bool) {
        let stopped = std::mem::take(&mut *self.stopped_migrations.lock().expect("stopped migrations lock"));
        for (target, (vd, clean_rows)) in stopped {
            let receiving = state.config.drives.iter().any(|d| d.slot == target && d.state == DriveState::Migrate);
            let target_failed = vd.migration().is_none_or(|m| m.has_failed());
            if !written_out || !receiving || target_failed || clean_rows == 0 {
                continue;
            }
            set_rebuild_row(&mut state.config, target, clean_rows);
            let rows = vd.geometry().row_count();
            self.log(
                Severity::Info,
                format!("migration to slot {target}: checkpoint at row {clean_rows} of {rows}, where the next start resumes"),
            );
        }
    }

    fn return_migration_target(&self, state: &mut State, target: u32, why: &str) {
        self.transition(state, target, DriveState::UnconfiguredGood, state::Cause::MigrationStopped, Some(why));
        set_copy_slot(&mut state.config, target, None);
        set_rebuild_row(&mut state.config, target, 0);
        if let Err(error) = self.persist(state) {
            self.log(Severity::Warning, format!("slot {target}: the end of its migration was not recorded: {error}"));
        }
    }

    /// Starts the copy on a thread of its own. May be called with the state lock held: the
    /// thread takes it only later.
    fn spawn_migration(&self, vd: Arc<VirtualDrive>, vd_id: u32, (target, target_source): (u32, String), start_row: u64, rate_percent: u8) {
        let progress = Progress::new(vd.geometry().row_count(), start_row, rate_percent);
        progress.size_windows_for(vd.geometry().strip_size_bytes());
        let abandon = Arc::new(AtomicBool::new(false));
        let view = MigrationView {
            vd_id,
            target_slot: target,
            target_source,
            progress: Arc::clone(&progress),
            started: Instant::now(),
            start_row,
            abandon: Arc::clone(&abandon),
        };
        self.migrations.lock().expect("migrations lock").insert(vd_id, view);
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name(format!("storc-migrate-v{vd_id}")).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            let finish = controller.run_migration(&vd, vd_id, &progress);
            let ended = MigrationEnd { finish, abandon: abandon.load(Ordering::SeqCst), clean_rows: progress.clean_rows() };
            controller.migration_ended(&vd, vd_id, target, ended);
            controller.migrations.lock().expect("migrations lock").remove(&vd_id);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => self.log(Severity::Critical, format!("migration of v{vd_id} cannot start a thread: {error}")),
        }
    }

    fn run_migration(&self, vd: &Arc<VirtualDrive>, vd_id: u32, progress: &Progress) -> Finish {
        let engine = Arc::clone(&self.engine);
        let submit_rows = |first_row: u64, row_count: u64, done: background::RunDone| {
            engine.migrate_rows(vd, first_row, row_count, Box::new(move |results| done(results.into_iter().map(row_outcome).collect())));
        };
        let mut logged = 0;
        let mut checkpoint = |row: u64| {
            let share = row * 100 / progress.total_rows.max(1) / PROGRESS_EVENT_PERCENT;
            if share > logged && row < progress.total_rows {
                logged = share;
                self.log(Severity::Info, format!("migration of v{vd_id}: {}% copied", share * PROGRESS_EVENT_PERCENT));
            }
        };
        let clients_busy = || vd.last_client_request().elapsed() < CLIENTS_BUSY_WINDOW;
        let hooks = Hooks { submit_rows: &submit_rows, checkpoint: &mut checkpoint, clients_busy: &clients_busy, advanced: &|_| {} };
        background::run(progress, hooks)
    }

    fn migration_ended(&self, vd: &Arc<VirtualDrive>, vd_id: u32, target: u32, ended: MigrationEnd) {
        let MigrationEnd { finish, abandon, clean_rows } = ended;
        let target_failed = vd.migration().is_some_and(|m| m.has_failed());
        if finish == Finish::Complete && !target_failed {
            match self.switch_to_target(vd, vd_id, target) {
                Ok(()) => return,
                Err(error) => self.log(Severity::Critical, format!("migration of v{vd_id}: the switch to slot {target} failed: {error}")),
            }
        }
        if finish == Finish::Stopped && !abandon {
            // Shutdown: recorded as running, it goes on at the next start (from this row if the
            // shutdown writes everything out, see the module docs).
            self.stopped_migrations.lock().expect("stopped migrations lock").insert(target, (Arc::clone(vd), clean_rows));
            return;
        }
        vd.end_migration();
        let mut state = self.state.lock().expect("controller lock");
        if state.config.drives.iter().all(|d| d.slot != target || d.state != DriveState::Migrate) {
            return;
        }
        if target_failed {
            self.transition(
                &mut state,
                target,
                DriveState::UnconfiguredBad,
                state::Cause::IoFailure,
                Some(&format!("while receiving v{vd_id}")),
            );
            set_copy_slot(&mut state.config, target, None);
            set_rebuild_row(&mut state.config, target, 0);
            if let Err(error) = self.persist(&mut state) {
                self.log(Severity::Warning, format!("slot {target}: its failure was not recorded: {error}"));
            }
        } else {
            let why = match finish {
                Finish::Failed(reason) => format!("the copy failed: {reason}"),
                _ => "stopped".to_string(),
            };
            self.return_migration_target(&mut state, target, &why);
        }
        self.log(Severity::Warning, format!("migration of v{vd_id} to slot {target} ended before its end; v{vd_id} stays where it was"));
    }

    /// Switches VD `vd_id` to a JBOD of `target` (see the module docs for the order).
    fn switch_to_target(&self, old: &Arc<VirtualDrive>, vd_id: u32, target: u32) -> Result<(), String> {
        if !old.hold_requests(SWITCH_DRAIN_TIMEOUT) {
            self.release_to(old, None);
            return Err(format!("requests still in flight after {} s", SWITCH_DRAIN_TIMEOUT.as_secs()));
        }
        let prepared = self.engine.quiesce().map_err(|e| format!("the cache could not be written out: {e}")).and_then(|()| {
            let migration = old.migration().ok_or("the migration ended")?;
            crate::bitmap::ondisk::flush(&**migration.target()).map_err(|e| format!("the target's flush failed: {e}"))
        });
        if let Err(error) = prepared {
            self.release_to(old, None);
            return Err(error);
        }
        let new = match self.record_switch(old, vd_id, target) {
            Ok(new) => new,
            Err(error) => {
                self.release_to(old, None);
                return Err(error);
            }
        };
        old.end_migration();
        self.release_to(old, Some(Arc::clone(&new)));
        self.log(Severity::Info, format!("v{vd_id} moved to slot {target}: a JBOD of it now, same size and export"));
        self.vds_changed();
        Ok(())
    }

    /// Records the VD as a JBOD of `target`, its old members out of it, and lays the new VD.
    fn record_switch(&self, old: &Arc<VirtualDrive>, vd_id: u32, target: u32) -> Result<Arc<VirtualDrive>, String> {
        let mut state = self.state.lock().expect("controller lock");
        let before = state.config.clone();
        let position = state.config.vds.iter().position(|v| v.vd_id == vd_id).ok_or("the VD was deleted")?;
        let old_members = state.config.vds[position].member_slots.clone();
        {
            let record = &mut state.config.vds[position];
            record.level = Level::Jbod;
            record.drives_per_span = 1;
            record.member_slots = vec![target];
            record.member_size_bytes = MEMBER_RESERVED_BYTES + old.capacity_bytes();
            record.bgi_pending = false;
        }
        let detail = format!("holds v{vd_id} now");
        self.transition(&mut state, target, DriveState::Online, state::Cause::MigrationDone, Some(&detail));
        set_copy_slot(&mut state.config, target, None);
        set_rebuild_row(&mut state.config, target, 0);
        let detail = format!("left v{vd_id}, which moved to slot {target}");
        for slot in old_members {
            let from = state.config.drives.iter().find(|d| d.slot == slot).map(|d| d.state);
            match from {
                Some(DriveState::Online) => {
                    self.transition(&mut state, slot, DriveState::UnconfiguredGood, state::Cause::MigrationDone, Some(&detail));
                }
                Some(from) => {
                    if let Some(to) = state::after_vd_deleted(from) {
                        self.transition(&mut state, slot, to, state::Cause::VdDeleted, Some(&detail));
                    }
                }
                None => {}
            }
        }
        let record = state.config.vds[position].clone();
        let new = match self.build_vd(&state, &record) {
            Ok(new) => new,
            Err(error) => {
                state.config = before;
                return Err(error.to_string());
            }
        };
        assert_eq!(new.capacity_bytes(), old.capacity_bytes(), "v{vd_id}: a migrated VD keeps its size");
        new.inherit_export_identity(old);
        if let Err(error) = self.persist(&mut state) {
            state.config = before;
            return Err(error.to_string());
        }
        state.vds.insert(vd_id, Arc::clone(&new));
        Ok(new)
    }

    /// Ends `vd`'s hold; with a successor, its held requests go there.
    fn release_to(&self, vd: &Arc<VirtualDrive>, successor: Option<Arc<VirtualDrive>>) {
        let next = successor.clone();
        let held = vd.release_requests(successor);
        let to = next.as_ref().unwrap_or(vd);
        for (request, done) in held {
            self.engine.submit(to, request, done);
        }
    }
}

/// Whether the drive in slot `target` can receive VD `vd_id`: a UGood drive of ours, large enough.
fn check_target_slot(state: &State, vd_id: u32, target: u32) -> Result<(), ControlError> {
    let drive = state.config.drives.iter().find(|d| d.slot == target);
    let present = state.slots.get(&target).filter(|s| !s.foreign);
    let (Some(drive), Some(present)) = (drive, present) else {
        return Err(ControlError::BadInput(format!("slot {target} holds no drive of this controller; the target must be a UGood drive")));
    };
    if drive.state != DriveState::UnconfiguredGood {
        return Err(ControlError::Conflict(format!("slot {target} is {}; the target must be UGood", drive.state.short_name())));
    }
    check_target_capacity(state, vd_id, &format!("slot {target}"), present.drive.info().capacity_bytes)
}

fn check_target_capacity(state: &State, vd_id: u32, target: &str, capacity_bytes: u64) -> Result<(), ControlError> {
    let vd = &state.vds[&vd_id];
    let needed_bytes = MEMBER_RESERVED_BYTES + vd.capacity_bytes();
    if capacity_bytes < needed_bytes {
        return Err(ControlError::BadInput(format!(
            "{target} holds {capacity_bytes} bytes; v{vd_id} needs {needed_bytes} (its {} bytes and the 4 MiB reserved area)",
            vd.capacity_bytes()
        )));
    }
    Ok(())
}

/// A drive added at run time must hold no configuration: it would be written over. One that
/// carries this controller's id but is in no record of it left the configuration, so is blank.
fn check_blank(state: &State, offer: &OfferedDrive) -> Result<(), ControlError> {
    let found =
        metadata::read(&*offer.drive).map_err(|e| ControlError::Io(format!("{}: its metadata cannot be read: {e}", offer.source)))?;
    let Some(found) = found else { return Ok(()) };
    let sb = found.superblock;
    let ours = sb.controller_id == state.config.controller_id;
    if ours && state.config.drives.iter().all(|d| d.drive_id != sb.drive_id) {
        return Ok(());
    }
    let whose = if ours { "this controller".to_string() } else { format!("controller {:032x}", sb.controller_id.0) };
    Err(ControlError::BadInput(format!(
        "{} holds the configuration of {whose} (it was slot {} there); a drive added to receive a VD must be blank \
         (clear it with /c0/fall delete if it is foreign, or use a new image or file)",
        offer.source, sb.slot
    )))
}

/// How a migration's run ended, for [`Controller::migration_ended`].
struct MigrationEnd {
    finish: Finish,
    /// `stop migrate` (not the shutdown) stopped it.
    abandon: bool,
    /// Every row below this is on the target.
    clean_rows: u64,
}
