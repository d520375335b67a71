//! Initialization of a VD: background initialization (BGI), `start init` (fast) and
//! `start init full`.
//!
//! # Background initialization
//! A VD with redundancy created over members that held data (a reused disk, an old file) has
//! parity and copies that do not match its data: a read that needs them (a degraded read, a
//! rebuild) would return garbage. storc asks each member whether its data area is known to read
//! as zero (`Drive::reads_zero`: a sparse file's hole, memory never written); if all are, every
//! row is consistent already and nothing runs (the creation event says so). Otherwise the VD is
//! recorded `bgi_pending` and every region of its write-intent bitmap starts unsynced: the
//! resync walk (`resync`) makes parity agree with the data, row by row, while clients use the
//! VD. Until a region is done, reads that would need its parity fail instead of returning
//! garbage, and mirror reads go to the first copy only, so two reads never see two versions.
//! Slot 0 of the bitmap is checkpointed as regions finish: after a crash BGI resumes near where
//! it was. It runs at `bgirate` (MegaRAID's BGI rate, 30% by default) while clients are busy.
//!
//! `stop bgi` leaves the remaining regions unsynced (and reads needing their parity refused)
//! until `resume bgi` or the next start of the controller, which starts it again, as a
//! MegaRAID does.
//!
//! # `start init`
//! Fast: the first and last [`FAST_INIT_BYTES`] of the VD are written with zeros through the
//! normal write path (old partition tables and filesystem signatures vanish), with clients
//! still served; BGI, if pending, goes on. Full: every member's data area is written with zeros
//! (zeros are consistent parity for P and Q, and equal copies) while the VD refuses client
//! I/O; then BGI has nothing left to do. A full init first marks every region unsynced on disk,
//! so a crash in the middle leaves the VD to its BGI, never with silently mismatched parity.

use super::*;
use crate::background;
use crate::bitmap::control::{self, Opening};
use crate::vd::MemberState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes at the start and at the end of a VD that a fast initialization zeroes.
pub const FAST_INIT_BYTES: u64 = 8 << 20;
/// The size of each zero write of a full initialization.
const FULL_INIT_WRITE_BYTES: u64 = 1 << 20;

/// A background initialization, for `show bgi`.
#[derive(Clone, Debug)]
pub struct BgiView {
    pub vd_id: u32,
    /// storcli's words: "In progress", "Paused", "Stopped".
    pub status: &'static str,
    pub percent_done: f64,
    pub regions_left: u64,
    pub region_count: u64,
    pub rate_percent: u8,
    pub elapsed: Duration,
    pub estimated_time_left: Option<Duration>,
}

/// A full initialization that runs, for `show init`.
#[derive(Clone, Debug)]
pub struct InitView {
    pub vd_id: u32,
    pub percent_done: f64,
    pub elapsed: Duration,
}

/// `/c0/vN stop|pause|resume bgi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BgiCommand {
    Stop,
    Pause,
    Resume,
}

/// How a new VD's bitmap starts: zeroed members need no initialization.
pub(super) fn opening_for(vd: &VirtualDrive) -> Opening {
    let geometry = vd.geometry();
    let (start_bytes, end_bytes) = (geometry.data_offset_bytes(), geometry.member_used_bytes());
    let zeroed = vd.members().iter().all(|member| member.drive().reads_zero(start_bytes, end_bytes - start_bytes));
    if zeroed || geometry.span_kind() == layout::SpanKind::Stripe {
        Opening::CreatedZeroed
    } else {
        Opening::CreatedOverData
    }
}

impl Controller {
    /// Says what a new VD needs, and starts its BGI if it needs one.
    pub(super) fn bgi_at_create(&self, vd_id: u32, opening: Opening) {
        let state = self.state.lock().expect("controller lock");
        let Some(vd) = state.vds.get(&vd_id) else { return };
        if vd.write_intent().is_none() {
            return;
        }
        match opening {
            Opening::CreatedZeroed => self.log(
                Severity::Info,
                format!("v{vd_id}: every member reads as zero (sparse or never written), so its parity is consistent: no background initialization needed"),
            ),
            _ => {
                self.log(
                    Severity::Info,
                    format!("v{vd_id}: its members held data; background initialization makes its parity consistent (until a region is done, reads that need its parity fail rather than return wrong data)"),
                );
                self.start_resyncs(&state);
            }
        }
    }

    /// The BGI of `vd_id` completed: the VD is consistent, and recorded so.
    pub(super) fn bgi_done(&self, vd_id: u32) {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id) else { return };
        if !record.bgi_pending {
            return;
        }
        record.bgi_pending = false;
        match self.persist(&mut state) {
            Ok(()) => self.log(Severity::Info, format!("background initialization of v{vd_id} complete: v{vd_id} is consistent")),
            // Still pending on disk: the next start walks it again, finding nothing left to do.
            Err(error) => self.log(Severity::Warning, format!("background initialization of v{vd_id} complete but not recorded: {error}")),
        }
    }

    /// The BGI of `vd_id`, if one is pending (running, paused or stopped).
    pub fn bgi(&self, vd_id: u32) -> Option<BgiView> {
        let state = self.state.lock().expect("controller lock");
        let record = state.config.vds.iter().find(|v| v.vd_id == vd_id && v.bgi_pending)?;
        let intent = state.vds.get(&record.vd_id)?.write_intent()?;
        let (regions_left, region_count) = (intent.unsynced_count(), intent.regions.region_count);
        let rate_percent = state.config.settings.bgi_rate_percent;
        drop(state);
        let view = self.resyncs.lock().expect("resyncs lock").get(&vd_id).filter(|view| view.bgi).cloned();
        let stopped = self.bgi_stopped.lock().expect("bgi lock").contains(&vd_id);
        let percent_of_regions = 100.0 * (region_count - regions_left) as f64 / region_count.max(1) as f64;
        Some(match view {
            Some(view) if !stopped => BgiView {
                vd_id,
                status: rebuild::status_words(&view.progress),
                percent_done: view.progress.percent_done(),
                regions_left,
                region_count,
                rate_percent: view.progress.rate_percent(),
                elapsed: view.started.elapsed(),
                estimated_time_left: rebuild::time_left(&view.progress, view.started, 0),
            },
            // Waiting for a member to come back, or stopped by the administrator.
            _ => BgiView {
                vd_id,
                status: if stopped { "Stopped" } else { "Waiting (for every member in service; show events says why it is not running)" },
                percent_done: percent_of_regions,
                regions_left,
                region_count,
                rate_percent,
                elapsed: Duration::ZERO,
                estimated_time_left: None,
            },
        })
    }

    /// Every pending BGI.
    pub fn bgis(&self) -> Vec<BgiView> {
        let ids: Vec<u32> = self.config().vds.iter().filter(|v| v.bgi_pending).map(|v| v.vd_id).collect();
        ids.into_iter().filter_map(|vd_id| self.bgi(vd_id)).collect()
    }

    /// Steers the BGI of `vd_id`.
    ///
    /// # Errors
    /// No such VD, no BGI pending on it, or the command does not fit its state.
    pub fn bgi_command(&self, vd_id: u32, command: BgiCommand) -> Result<(), ControlError> {
        let Some(view) = self.bgi(vd_id) else {
            if !self.config().vds.iter().any(|v| v.vd_id == vd_id) {
                return Err(self.no_vd(vd_id));
            }
            return Err(ControlError::NotFound(format!("v{vd_id} has no background initialization pending: it is consistent")));
        };
        let running = self.resyncs.lock().expect("resyncs lock").get(&vd_id).filter(|r| r.bgi).map(|r| Arc::clone(&r.progress));
        let refuse = |allowed: &str| {
            Err(ControlError::Conflict(format!(
                "the background initialization of v{vd_id} is {}; {command:?} is allowed only when it is {allowed}",
                view.status
            )))
        };
        match (command, view.status) {
            (BgiCommand::Pause, "In progress") => running.expect("in progress").set_control(background::Control::Pause),
            (BgiCommand::Resume, "Paused") => running.expect("paused").set_control(background::Control::Run),
            (BgiCommand::Resume, "Stopped") => {
                self.bgi_stopped.lock().expect("bgi lock").remove(&vd_id);
                self.start_resyncs(&self.state.lock().expect("controller lock"));
            }
            (BgiCommand::Stop, "In progress" | "Paused") => {
                self.bgi_stopped.lock().expect("bgi lock").insert(vd_id);
                running.expect("running").set_control(background::Control::Stop);
            }
            (BgiCommand::Pause, _) => return refuse("in progress"),
            (BgiCommand::Resume, _) => return refuse("paused or stopped"),
            (BgiCommand::Stop, _) => return refuse("in progress or paused"),
        }
        let words = match command {
            BgiCommand::Stop => "stopped (the regions left stay unsynced until `resume bgi` or the next start)",
            BgiCommand::Pause => "paused",
            BgiCommand::Resume => "resumed",
        };
        self.log(Severity::Info, format!("background initialization of v{vd_id} {words} at {:.1}%", view.percent_done));
        Ok(())
    }

    /// The full initialization of `vd_id` that runs, if any.
    pub fn init(&self, vd_id: u32) -> Option<InitView> {
        self.inits.lock().expect("inits lock").get(&vd_id).map(|run| InitView {
            vd_id,
            percent_done: run.percent_done(),
            elapsed: run.started.elapsed(),
        })
    }

    /// `/c0/vN start init [full]`: see the module docs. A fast one is done when this returns; a
    /// full one runs on a thread of its own (see [`Controller::init`]).
    ///
    /// # Errors
    /// No such VD; clients connected (`in_use`) without `force`; a member out of service; a
    /// check or another initialization running. Nothing is written then.
    pub fn start_init(&self, vd_id: u32, full: bool, force: bool, in_use: bool) -> Result<(), ControlError> {
        let (_, vd) = self.vd(vd_id)?;
        if in_use && !force {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} has NBD clients connected and an initialization overwrites its data; disconnect them or add `force`"
            )));
        }
        if self.inits.lock().expect("inits lock").contains_key(&vd_id) {
            return Err(ControlError::Conflict(format!("v{vd_id} is being initialized (full) already; `show init` says how far")));
        }
        if self.checks().iter().any(|c| c.vd_id == vd_id) {
            return Err(ControlError::Conflict(format!("v{vd_id} has a consistency check running; stop it first (`stop cc`)")));
        }
        if !full {
            return self.fast_init(vd_id, &vd);
        }
        if let Some(member) = vd.members().iter().position(|m| m.state() != MemberState::Online) {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} member {member} is {:?}: a full initialization writes every member, so every member must be online; rebuild first",
                vd.member(member).state()
            )));
        }
        self.full_init(vd_id, vd)
    }

    /// Zeroes the first and last [`FAST_INIT_BYTES`] through the write path.
    fn fast_init(&self, vd_id: u32, vd: &Arc<VirtualDrive>) -> Result<(), ControlError> {
        let capacity_bytes = vd.geometry().capacity_bytes();
        let head_bytes = FAST_INIT_BYTES.min(capacity_bytes);
        let tail_start_bytes = capacity_bytes.saturating_sub(FAST_INIT_BYTES).max(head_bytes);
        let zeros = vec![0u8; FULL_INIT_WRITE_BYTES as usize];
        for range in [0..head_bytes, tail_start_bytes..capacity_bytes] {
            let mut offset_bytes = range.start;
            while offset_bytes < range.end {
                let len_bytes = FULL_INIT_WRITE_BYTES.min(range.end - offset_bytes) as usize;
                self.engine
                    .write_at(vd, offset_bytes, &zeros[..len_bytes])
                    .map_err(|e| ControlError::Io(format!("fast initialization of v{vd_id} failed at byte {offset_bytes}: {e}")))?;
                offset_bytes += len_bytes as u64;
            }
        }
        self.engine.flush(vd).map_err(|e| ControlError::Io(format!("fast initialization of v{vd_id}: flush failed: {e}")))?;
        let pending = if self.bgi(vd_id).is_some() { "; its background initialization goes on" } else { "" };
        let mib = (head_bytes + capacity_bytes - tail_start_bytes) >> 20;
        self.log(Severity::Info, format!("fast initialization of v{vd_id} done: its first and last {mib} MiB zeroed{pending}"));
        Ok(())
    }

    /// Refuses client I/O, marks every region unsynced on disk, and starts the thread that
    /// writes zeros over every member.
    fn full_init(&self, vd_id: u32, vd: Arc<VirtualDrive>) -> Result<(), ControlError> {
        vd.set_initializing(true);
        if !vd.wait_idle(Duration::from_secs(30)) {
            vd.set_initializing(false);
            return Err(ControlError::Conflict(format!(
                "v{vd_id} still has requests in flight after 30 s; nothing was written, try again"
            )));
        }
        // What the cache holds of the VD is older than the zeros: dropped, not written over them
        // (and the journal emptied, so that no replay brings it back).
        if let Err(error) = self.engine.forget(&vd) {
            vd.set_initializing(false);
            return Err(ControlError::Conflict(format!("v{vd_id}: the cache cannot be emptied ({error}); nothing was written, try again")));
        }
        // So are its lines on an SSD cache (a fill still under way is poisoned).
        if let Some(cache) = vd.ssd_cache().get() {
            cache.drop_lines(&vd);
        }
        // No resync may walk the VD while its members are overwritten, nor mark a region synced
        // once they are marked unsynced below: it is stopped, and waited for.
        self.bgi_stopped.lock().expect("bgi lock").insert(vd_id);
        let resync = self.resyncs.lock().expect("resyncs lock").remove(&vd_id);
        if let Some(resync) = resync {
            resync.progress.set_control(background::Control::Stop);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !resync.ended.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !resync.ended.load(Ordering::Acquire) {
                vd.set_initializing(false);
                self.bgi_stopped.lock().expect("bgi lock").remove(&vd_id);
                return Err(ControlError::Conflict(format!(
                    "v{vd_id}: its resync did not stop within 30 s; nothing was written, try again"
                )));
            }
        }
        if let Err(error) = self.mark_all_unsynced(vd_id, &vd) {
            vd.set_initializing(false);
            self.bgi_stopped.lock().expect("bgi lock").remove(&vd_id);
            self.start_resyncs(&self.state.lock().expect("controller lock"));
            return Err(error);
        }
        let geometry = vd.geometry();
        let member_bytes = geometry.member_used_bytes() - geometry.data_offset_bytes();
        let run = Arc::new(InitRun {
            started: Instant::now(),
            bytes_done: AtomicU64::new(0),
            bytes_total: member_bytes * vd.members().len() as u64,
        });
        self.inits.lock().expect("inits lock").insert(vd_id, Arc::clone(&run));
        self.log(Severity::Info, format!("full initialization of v{vd_id} started: v{vd_id} refuses I/O until every row is written"));
        let controller = self.myself();
        let vd_for_thread = Arc::clone(&vd);
        let spawned = std::thread::Builder::new().name(format!("storc-init-v{vd_id}")).spawn(move || {
            let vd = vd_for_thread;
            let Some(controller) = controller.upgrade() else { return };
            let result = zero_members(&vd, &run);
            controller.full_init_ended(vd_id, &vd, &run, result);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => {
                self.inits.lock().expect("inits lock").remove(&vd_id);
                vd.set_initializing(false);
                return Err(ControlError::Io(format!("the initialization of v{vd_id} cannot start a thread: {error}")));
            }
        }
        Ok(())
    }

    /// Before any zero is written: every region unsynced, on disk too, and the VD recorded as
    /// needing its BGI, so that a crash part way leaves a VD that a BGI makes consistent.
    fn mark_all_unsynced(&self, vd_id: u32, vd: &VirtualDrive) -> Result<(), ControlError> {
        let Some(intent) = vd.write_intent() else { return Ok(()) };
        control::mark_all_unsynced(intent, &resync::in_service_drives(vd))
            .map_err(|e| ControlError::Io(format!("v{vd_id}: marking every region unsynced before a full initialization failed: {e}")))?;
        let mut state = self.state.lock().expect("controller lock");
        let record = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id).ok_or_else(|| self.no_vd(vd_id))?;
        record.bgi_pending = true;
        self.persist(&mut state)
    }

    fn full_init_ended(&self, vd_id: u32, vd: &Arc<VirtualDrive>, run: &InitRun, result: Result<(), String>) {
        let secs = run.started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                if let Some(intent) = vd.write_intent() {
                    (0..intent.regions.region_count).for_each(|region| intent.region_synced(region));
                    if let Err(error) = control::checkpoint_resync(intent, &resync::in_service_drives(vd)) {
                        self.log(Severity::Warning, format!("v{vd_id} write-intent bitmap: {error}"));
                    }
                }
                let mb_per_s = run.bytes_total as f64 / secs.max(1e-3) / 1e6;
                self.log(Severity::Info, format!("full initialization of v{vd_id} done in {secs:.1} s ({mb_per_s:.0} MB/s of members)"));
                self.bgi_done(vd_id);
            }
            Err(error) => self.log(
                Severity::Warning,
                format!(
                    "full initialization of v{vd_id} failed after {secs:.1} s ({error}); its background initialization makes it consistent"
                ),
            ),
        }
        vd.set_initializing(false);
        // Only now: `show init` says the initialization runs until its outcome is recorded and
        // the VD serves I/O again.
        self.inits.lock().expect("inits lock").remove(&vd_id);
        self.bgi_stopped.lock().expect("bgi lock").remove(&vd_id);
        self.start_resyncs(&self.state.lock().expect("controller lock"));
    }
}

/// A full initialization's progress.
pub(super) struct InitRun {
    started: Instant,
    bytes_done: AtomicU64,
    bytes_total: u64,
}

impl InitRun {
    fn percent_done(&self) -> f64 {
        100.0 * self.bytes_done.load(Ordering::Relaxed) as f64 / self.bytes_total.max(1) as f64
    }
}

/// Writes zeros over the data area of every member, each on a thread of its own (the members
/// work in parallel, as a full init on a MegaRAID does), then flushes them.
fn zero_members(vd: &VirtualDrive, run: &InitRun) -> Result<(), String> {
    let geometry = vd.geometry();
    let (start_bytes, end_bytes) = (geometry.data_offset_bytes(), geometry.member_used_bytes());
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let mut writers = Vec::new();
        let mut results = Vec::new();
        for member in vd.members() {
            let drive = member.drive();
            let zero = move || zero_range(&*drive, start_bytes, end_bytes, &run.bytes_done);
            // Without a thread of its own (a thread limit reached) a member is zeroed here,
            // after the others have started.
            match std::thread::Builder::new().name("storc-init-zero".into()).spawn_scoped(scope, zero.clone()) {
                Ok(writer) => writers.push(writer),
                Err(_) => results.push(zero()),
            }
        }
        results.extend(writers.into_iter().map(|writer| writer.join().unwrap_or_else(|_| Err("a writer thread panicked".into()))));
        results
    });
    results.into_iter().collect()
}

fn zero_range(drive: &dyn Drive, start_bytes: u64, end_bytes: u64, bytes_done: &AtomicU64) -> Result<(), String> {
    let name = &drive.info().name;
    let mut offset_bytes = start_bytes;
    while offset_bytes < end_bytes {
        let len_bytes = FULL_INIT_WRITE_BYTES.min(end_bytes - offset_bytes);
        let op = DriveOp::Write { offset_bytes, buf: drive::IoBuf::zeroed(len_bytes as usize) };
        metadata::submit_and_wait(drive, op).map_err(|e| format!("{name}: writing zeros at byte {offset_bytes} failed: {e}"))?;
        bytes_done.fetch_add(len_bytes, Ordering::Relaxed);
        offset_bytes += len_bytes;
    }
    metadata::submit_and_wait(drive, DriveOp::Flush).map_err(|e| format!("{name}: flush after writing zeros failed: {e}"))?;
    Ok(())
}
