//! The write-intent bitmap in the controller (see `crate::bitmap`): opened when a VD is
//! assembled or created, cleared lazily by a daemon thread, resynced after an unclean stop,
//! used to re-add a member that comes back, and marked clean at shutdown.
//!
//! The resync is also the background initialization (BGI) of a VD created over members that
//! held data: every region starts unsynced, and the same walk makes parity and copies agree
//! with the data (see `bgi` for its commands). Either one checkpoints slot 0 as it goes, so a
//! crash resumes it near where it was.

use super::*;
use crate::background::{self, Finish, Hooks, Progress, RowOutcome};
use crate::bitmap::control::{self, Identity, Opening};
use crate::bitmap::{Bits, RegionMap};
use crate::vd::CheckMode;
use layout::SpanKind;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often idle regions are looked for (md's bitmap daemon sleeps about as long). A region
/// is cleared after one to two of these without a write.
pub const BITMAP_CLEAN_INTERVAL: Duration = Duration::from_secs(5);

/// A resync that runs or waits, for `/c0/vN show`.
#[derive(Clone)]
pub struct ResyncView {
    pub vd_id: u32,
    pub progress: Arc<Progress>,
    pub started: Instant,
    /// Regions left to resync.
    pub regions_left: u64,
    /// The VD's background initialization (its record's `bgi_pending`), not a resync after an
    /// unclean stop.
    pub bgi: bool,
    /// Set once its thread is done with the VD: nothing of it is in flight any more.
    pub ended: Arc<std::sync::atomic::AtomicBool>,
}

/// What `/c0/vN show` says about a VD's resync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResyncStatus {
    /// Regions await a resync that cannot run now (a member is out of service).
    Pending {
        regions: u64,
    },
    InProgress {
        regions: u64,
        percent_done: u64,
    },
}

/// The daemon thread that clears idle regions; stopped at shutdown.
pub(super) struct BitmapDaemon {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Controller {
    /// Gives `vd` its bitmap (levels with redundancy): reads what its members in service hold
    /// (when `Assembled`), prepares the area for this run, and says what needs a resync.
    pub(super) fn open_write_intent(&self, controller_id: ControllerId, vd_id: u32, vd: &VirtualDrive, opening: Opening) {
        if vd.geometry().span_kind() == SpanKind::Stripe {
            return;
        }
        let identity = Identity { controller_id: controller_id.0, vd_id };
        let opened = control::open(identity, RegionMap::for_geometry(vd.geometry()), &in_service_drives(vd), opening);
        for note in &opened.notes {
            self.log(Severity::Warning, format!("v{vd_id} write-intent bitmap: {note}"));
        }
        if opening == Opening::Assembled && opened.unclean && opened.dirty_region_count > 0 {
            let total = opened.intent.regions.region_count;
            let message = format!("v{vd_id} was not stopped cleanly: {} of {total} region(s) to resync", opened.dirty_region_count);
            self.log(Severity::Warning, message);
        }
        let out: Vec<usize> = (0..vd.members().len()).filter(|&i| vd.member(i).state() != MemberState::Online).collect();
        opened.intent.set_out_at_open(out);
        vd.set_write_intent(opened.intent);
    }

    /// A drive joins `vd` as member (a spare or replacement about to be rebuilt): its bitmap
    /// area gets this run's header, so that the next assembly counts its bits.
    pub(super) fn join_write_intent(&self, controller_id: ControllerId, vd_id: u32, vd: &VirtualDrive, drive: &dyn Drive) {
        let Some(intent) = vd.write_intent() else { return };
        if let Err(error) = control::join(Identity { controller_id: controller_id.0, vd_id }, intent, drive) {
            self.log(Severity::Warning, format!("v{vd_id} write-intent bitmap: {error}"));
        }
    }

    /// A member left service: clears at once every region with no write in flight, noting it as
    /// written while degraded. Otherwise a crash in the next seconds would find those bits set
    /// and leave their regions unsynced, unreadable through parity, while a rebuild needs it.
    pub(super) fn settle_write_intent(&self, vd: &Arc<VirtualDrive>, vd_id: u32) {
        if vd.write_intent().is_none() {
            return;
        }
        let controller = self.myself();
        self.engine.clean_write_intent(
            vd,
            true,
            Box::new(move |result| {
                if let (Err(error), Some(controller)) = (result, controller.upgrade()) {
                    controller
                        .log(Severity::Warning, format!("v{vd_id} write-intent bitmap: settling after a member left failed: {error}"));
                }
            }),
        );
    }

    /// Starts the resync (or BGI) of every VD that needs one and can have one (every member in
    /// service, not stopped by the administrator).
    pub(super) fn start_resyncs(&self, state: &State) {
        for (&vd_id, vd) in &state.vds {
            let bgi = state.config.vds.iter().any(|record| record.vd_id == vd_id && record.bgi_pending);
            // A BGI recorded pending with nothing left (a crash between its end and its record)
            // walks once, finds nothing, and records the VD consistent.
            let needs = vd.write_intent().is_some_and(|intent| intent.unsynced_count() > 0 || bgi);
            let held = self.resyncs.lock().expect("resyncs lock").get(&vd_id).is_some_and(|r| {
                // Running, paused, or stopped by `stop bgi` (until `resume bgi` or a restart).
                r.progress.control() != background::Control::Stop || self.bgi_stopped.lock().expect("bgi lock").contains(&vd_id)
            });
            if needs && !held && all_online(vd) && !vd.is_initializing() {
                let settings = &state.config.settings;
                let rate_percent = if bgi { settings.bgi_rate_percent } else { settings.rebuild_rate_percent };
                self.spawn_resync(Arc::clone(vd), vd_id, rate_percent, bgi);
            }
        }
    }

    /// Where the resync of `vd_id` stands, if it has regions to resync.
    pub fn resync_status(&self, vd_id: u32) -> Option<ResyncStatus> {
        let state = self.state.lock().expect("controller lock");
        let regions = state.vds.get(&vd_id)?.write_intent()?.unsynced_count();
        drop(state);
        let running = self.resyncs.lock().expect("resyncs lock").get(&vd_id).cloned();
        match running {
            // A walk that synced its last region is still running until it has said it is done
            // (the event), so that no one sees it gone before that.
            Some(view) if view.progress.control() == background::Control::Run => {
                Some(ResyncStatus::InProgress { regions, percent_done: view.progress.percent_done() as u64 })
            }
            _ if regions == 0 => None,
            _ => Some(ResyncStatus::Pending { regions }),
        }
    }

    fn spawn_resync(&self, vd: Arc<VirtualDrive>, vd_id: u32, rate_percent: u8, bgi: bool) {
        let intent = vd.write_intent().expect("checked by the caller");
        let regions = intent.regions;
        // From the first unsynced region: a resumed BGI shows how far it really is.
        let first_region = intent.unsynced_regions().ones().next().unwrap_or(0);
        let start_row = regions.rows_of(first_region).start.min(vd.geometry().row_count());
        let progress = Progress::new(vd.geometry().row_count(), start_row, rate_percent);
        progress.size_windows_for(vd.geometry().strip_size_bytes());
        progress.set_run_rows(crate::run_rows_for(vd.geometry()));
        let regions_left = intent.unsynced_count();
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let view =
            ResyncView { vd_id, progress: Arc::clone(&progress), started: Instant::now(), regions_left, bgi, ended: Arc::clone(&ended) };
        self.resyncs.lock().expect("resyncs lock").insert(vd_id, view);
        let what = sync_name(bgi);
        let total = regions.region_count;
        self.log(Severity::Info, format!("{what} of v{vd_id} started: {regions_left} of {total} region(s), rate {rate_percent}%"));
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name(format!("storc-resync-v{vd_id}")).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            let started = Instant::now();
            let (finish, rows) = controller.run_resync(&vd, vd_id, &progress, bgi);
            ended.store(true, Ordering::Release);
            // The walk is shown until its end is logged: a client that waits for it to go
            // then finds the event.
            controller.resync_ended(&vd, vd_id, &finish, rows, started.elapsed(), bgi);
            controller.forget_resync(vd_id, &progress, &finish);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => self.log(Severity::Critical, format!("resync of v{vd_id} cannot start a thread: {error}")),
        }
    }

    /// Makes every row of the regions that await a resync agree with its data, in order, in
    /// whole runs (each member's part read in one I/O); a region is trusted again once all its
    /// rows are done. Returns how it ended and the rows resynced.
    fn run_resync(&self, vd: &Arc<VirtualDrive>, vd_id: u32, progress: &Progress, bgi: bool) -> (Finish, u64) {
        let intent = vd.write_intent().expect("a resync has a bitmap");
        let regions = intent.regions;
        let rows_left: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(
            intent.unsynced_regions().ones().map(|region| (region, regions.rows_of(region).end - regions.rows_of(region).start)).collect(),
        ));
        let rows_resynced = Arc::new(AtomicU64::new(0));
        let engine = Arc::clone(&self.engine);
        let submit_rows = |first_row: u64, row_count: u64, done: background::RunDone| {
            let rows = first_row..first_row + row_count;
            let wanted = |row: &u64| rows_left.lock().expect("resync lock").contains_key(&regions.region_of(*row));
            if !rows.clone().any(|row| wanted(&row)) {
                return done(vec![RowOutcome::Done; row_count as usize]);
            }
            let (rows_left, rows_resynced, vd_for_done) = (Arc::clone(&rows_left), Arc::clone(&rows_resynced), Arc::clone(vd));
            let finished = Box::new(move |results: Vec<Result<crate::vd::CheckOutcome, crate::vd::VdError>>| {
                let intent = vd_for_done.write_intent().expect("a resync has a bitmap");
                let outcomes = rows.zip(results).map(|(row, result)| match result {
                    Ok(_) => {
                        rows_resynced.fetch_add(1, Ordering::Relaxed);
                        row_synced(&rows_left, intent, row);
                        RowOutcome::Done
                    }
                    Err(error) => RowOutcome::Fatal(error.to_string()),
                });
                done(outcomes.collect());
            });
            engine.check_rows(vd, first_row, row_count, CheckMode::Resync, finished);
        };
        let mut checkpoint = |_row: u64| {
            if !all_online(vd) {
                return;
            }
            if let Err(error) = control::checkpoint_resync(intent, &in_service_drives(vd)) {
                self.log(Severity::Warning, format!("v{vd_id} write-intent bitmap: {} checkpoint failed: {error}", sync_name(bgi)));
            }
        };
        let total_rows = progress.total_rows;
        let milestone = AtomicU64::new(progress.watermark_row() * 4 / total_rows.max(1));
        let advanced = |clean_rows: u64| {
            // Events at every quarter, as MegaRAID logs the progress of a BGI.
            let quarter = clean_rows * 4 / total_rows.max(1);
            if quarter > milestone.fetch_max(quarter, Ordering::Relaxed) && quarter < 4 {
                self.log(Severity::Info, format!("{} of v{vd_id}: {}% done", sync_name(bgi), quarter * 25));
            }
        };
        let clients_busy = || vd.last_client_request().elapsed() < rebuild::CLIENTS_BUSY_WINDOW;
        let hooks = Hooks { submit_rows: &submit_rows, checkpoint: &mut checkpoint, clients_busy: &clients_busy, advanced: &advanced };
        let finish = background::run(progress, hooks);
        (finish, rows_resynced.load(Ordering::Relaxed))
    }

    fn resync_ended(&self, vd: &Arc<VirtualDrive>, vd_id: u32, finish: &Finish, rows: u64, elapsed: Duration, bgi: bool) {
        let strip_bytes = vd.geometry().strip_size_bytes();
        let members = vd.members().len() as u64;
        let summary = format!("{rows} row(s), {} MiB read per member", (rows * strip_bytes) >> 20);
        let what = sync_name(bgi);
        match finish {
            Finish::Complete => {
                let per_s = (rows * strip_bytes * members) as f64 / elapsed.as_secs_f64().max(1e-3) / 1e6;
                self.log(Severity::Info, format!("{what} of v{vd_id} done: {summary} in {:.1} s ({per_s:.0} MB/s)", elapsed.as_secs_f64()));
                self.clear_inherited_if_whole(vd, vd_id);
                if bgi {
                    self.bgi_done(vd_id);
                }
            }
            Finish::Stopped => self.log(
                Severity::Warning,
                format!("{what} of v{vd_id} stopped after {summary}; the regions left stay unsynced until it runs again"),
            ),
            Finish::Failed(reason) => self.log(
                Severity::Warning,
                format!("{what} of v{vd_id} cannot go on ({reason}); the regions left stay unreadable through parity until it runs again"),
            ),
        }
    }

    /// A walk that completed or failed is no longer shown (a failed one starts again once every
    /// member is in service); a stopped one stays, as stopped. Only this walk's own view goes:
    /// a deleted VD's number may belong to a new VD already.
    fn forget_resync(&self, vd_id: u32, progress: &Arc<Progress>, finish: &Finish) {
        if matches!(finish, Finish::Stopped) {
            return;
        }
        let mut resyncs = self.resyncs.lock().expect("resyncs lock");
        if resyncs.get(&vd_id).is_some_and(|view| Arc::ptr_eq(&view.progress, progress)) {
            resyncs.remove(&vd_id);
        }
    }

    /// Clears slot 0 once the VD is whole and resynced: what it held is consistent now.
    fn clear_inherited_if_whole(&self, vd: &VirtualDrive, vd_id: u32) {
        let Some(intent) = vd.write_intent() else { return };
        if intent.unsynced_count() != 0 || !all_online(vd) || intent.inherited().is_empty() {
            return;
        }
        if let Err(error) = control::clear_inherited(intent, &in_service_drives(vd)) {
            self.log(Severity::Warning, format!("v{vd_id} write-intent bitmap: {error}"));
        }
    }

    /// Starts the thread that clears idle regions every [`BITMAP_CLEAN_INTERVAL`].
    pub(super) fn start_bitmap_daemon(&self) -> std::io::Result<()> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let controller = self.myself();
        let thread = std::thread::Builder::new().name("storc-bitmap".into()).spawn(move || {
            // Woken at once by a stop (or by the controller going away), not at the next tick.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(BITMAP_CLEAN_INTERVAL) {
                let Some(controller) = controller.upgrade() else { return };
                controller.bitmap_pass();
                // The same tick starts the patrol read and the checks their schedules say are due.
                controller.patrol_tick();
                controller.cc_schedule_tick();
            }
        })?;
        *self.bitmap_daemon.lock().expect("bitmap daemon lock") = Some(BitmapDaemon { stop, thread });
        Ok(())
    }

    /// One pass of the daemon: every shard clears its idle regions; slot 0 goes once resynced.
    fn bitmap_pass(&self) {
        for (record, vd) in self.vds() {
            if vd.write_intent().is_none() || vd.is_retired() {
                continue;
            }
            let (vd_id, name) = (record.vd_id, record.name.clone());
            let controller = self.myself();
            self.engine.clean_write_intent(
                &vd,
                false,
                Box::new(move |result| {
                    if let (Err(error), Some(controller)) = (result, controller.upgrade()) {
                        controller.log(Severity::Warning, format!("v{vd_id} ({name}) write-intent bitmap: clean pass failed: {error}"));
                    }
                }),
            );
            self.clear_inherited_if_whole(&vd, vd_id);
        }
    }

    /// Shutdown: stops the daemon and resyncs (which resume at the next start), clears every
    /// bit a whole VD no longer needs, and marks each VD's bitmap clean. Call after the VDs
    /// were flushed and before anything else writes them.
    pub(super) fn close_write_intents(&self) {
        if let Some(daemon) = self.bitmap_daemon.lock().expect("bitmap daemon lock").take() {
            let _ = daemon.stop.send(());
            let _ = daemon.thread.join();
        }
        let identity_of = |vd_id| Identity { controller_id: self.state.lock().expect("controller lock").config.controller_id.0, vd_id };
        for (record, vd) in self.vds() {
            let Some(intent) = vd.write_intent() else { continue };
            let (sender, receiver) = std::sync::mpsc::channel();
            self.engine.clean_write_intent(&vd, true, Box::new(move |result| drop(sender.send(result))));
            if let Ok(Err(error)) = receiver.recv() {
                self.log(Severity::Warning, format!("v{}: clearing the bitmap at shutdown failed: {error}", record.vd_id));
            }
            self.clear_inherited_if_whole(&vd, record.vd_id);
            if let Err(error) = control::close(identity_of(record.vd_id), intent, &in_service_drives(&vd)) {
                self.log(Severity::Warning, format!("v{} write-intent bitmap: {error}", record.vd_id));
            }
        }
    }

    /// Stops every resync (shutdown); each resumes at the next start from the bitmap.
    pub(super) fn stop_resyncs(&self) {
        for view in self.resyncs.lock().expect("resyncs lock").values() {
            view.progress.set_control(background::Control::Stop);
        }
    }

    /// `set online` on a member that missed writes, with a bitmap: it comes back as Rbld and
    /// only the regions written while it was out (the dirty ones) are rebuilt on it.
    pub(super) fn re_add(&self, state: &mut State, slot: u32, vd_id: u32, member: usize) -> Result<(), ControlError> {
        let vd = Arc::clone(&state.vds[&vd_id]);
        let intent = vd.write_intent().expect("re-add needs a bitmap");
        // Out since before an unclean stop: what it missed was noted in memory and is gone.
        let dirty = intent.knows_missed_regions_of(member).then(|| intent.dirty_regions());
        let detail = match &dirty {
            Some(dirty) => format!("re-added to v{vd_id}: {} dirty region(s) to resync", dirty.count()),
            None => format!("re-added to v{vd_id}: out of service since before an unclean stop, so every row is rebuilt"),
        };
        let transition = self.transition(state, slot, DriveState::Rebuild, state::Cause::RebuildStarted, Some(&detail));
        rebuild::set_rebuild_row(&mut state.config, slot, 0);
        if let Err(error) = self.persist(state) {
            self.undo_transition(state, &transition);
            return Err(error);
        }
        vd.start_rebuild(member, vd.member(member).drive());
        self.spawn_rebuild_of(vd, vd_id, member, slot, 0, state.config.settings.rebuild_rate_percent, dirty);
        Ok(())
    }
}

/// A row of an unsynced region is done; the region is synced once all its rows are.
fn row_synced(rows_left: &Mutex<HashMap<u64, u64>>, intent: &crate::bitmap::WriteIntent, row: u64) {
    let region = intent.regions.region_of(row);
    let mut left = rows_left.lock().expect("resync lock");
    // A row of a region that was synced already (a run that straddles regions) counts nothing.
    let Some(count) = left.get_mut(&region) else { return };
    *count -= 1;
    if *count == 0 {
        left.remove(&region);
        intent.region_synced(region);
    }
}

/// What the events call the walk: BGI for a new VD over old data, resync otherwise.
pub(super) fn sync_name(bgi: bool) -> &'static str {
    if bgi {
        "background initialization"
    } else {
        "resync"
    }
}

/// The drives of `vd`'s members that are written now (online or being rebuilt).
pub(super) fn in_service_drives(vd: &VirtualDrive) -> Vec<Arc<dyn Drive>> {
    vd.members().iter().filter(|m| matches!(m.state(), MemberState::Online | MemberState::Rebuilding)).map(|m| m.drive()).collect()
}

fn all_online(vd: &VirtualDrive) -> bool {
    vd.members().iter().all(|m| m.state() == MemberState::Online)
}

/// The rows of `regions` set in `dirty`, for a re-add: `None` keeps every row.
pub(super) fn row_in(regions: &RegionMap, dirty: &Option<Bits>, row: u64) -> bool {
    dirty.as_ref().is_none_or(|bits| bits.get(regions.region_of(row)))
}
