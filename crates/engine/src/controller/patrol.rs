//! Patrol read (`/c0 start|stop|pause|resume|show patrolread`, `/c0 set patrolread=on|off
//! mode=auto|manual delay=HOURS prrate=N includessds=on|off`): every sector of every VD member
//! and hot spare is read in the background, so that a sector gone bad is found and rewritten
//! while the rest of its row can still rebuild it, not discovered by a rebuild that needs it.
//!
//! A patrol reads each drive's data area (a member's rows, a spare's whole capacity past the
//! reserved area) in [`PATROL_READ_BYTES`] reads on a thread of its own, straight from the
//! drive: its reads need no row lock, since only whether they fail matters. A read that fails
//! is probed in [`PROBE_BYTES`] pieces to find the bad sectors. On a member, each row they fall
//! in is rebuilt onto that member from the rest of the row (`Engine::rebuild_row`, under the
//! row's lock, parity or the other copy): the write remaps the sectors, and a read of them
//! afterwards proves it ("patrol read corrected medium error"). Where nothing else holds the
//! data (another member unreadable there, a level without redundancy, a region not yet
//! initialized), the rebuild records it in the VD's bad-block list as it does for a rebuild, or,
//! without redundancy, the patrol records it; either way an event says so. A spare's bad sectors
//! hold nothing: an event names them.
//!
//! Solid-state drives are left out unless `includessds=on` (MegaRAID's default: they remap on
//! their own). While clients are busy, a patrol keeps `prrate` of its time (after each read, it
//! sleeps what holds it to that share). In mode auto it starts `delay` hours after the last one
//! started (its start is in the metadata), the first one `delay` hours after the controller
//! started; mode manual waits for `start patrolread`.

use super::*;
use crate::background::{self, Control, Progress};
use crate::vd::{MemberSet, VdError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of one patrol read.
pub const PATROL_READ_BYTES: u64 = 1 << 20;
/// Bytes of one probe of a read that failed: the unit bad sectors are found and reported in.
pub const PROBE_BYTES: u64 = 4096;
/// The longest sleep after a read while clients are busy.
const PAUSE_MAX: Duration = Duration::from_secs(1);

/// A patrol read that runs, for `show patrolread` and its controls.
#[derive(Clone)]
pub struct PatrolView {
    pub progress: Arc<Progress>,
    pub started: Instant,
    pub tally: Arc<PatrolTally>,
    /// The drives it reads, by slot, in order.
    pub slots: Vec<u32>,
}

impl PatrolView {
    /// storcli's words: "Active", "Paused", "Stopped".
    pub fn state(&self) -> &'static str {
        match self.progress.control() {
            Control::Run => "Active",
            Control::Pause => "Paused",
            Control::Stop => "Stopped",
        }
    }
}

/// What a patrol read did so far.
#[derive(Debug, Default)]
pub struct PatrolTally {
    pub drives_done: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Bad ranges found (a run of unreadable probes counts once).
    pub medium_errors: AtomicU64,
    pub corrected: AtomicU64,
    /// The slot being read now.
    pub current_slot: AtomicU64,
}

/// `/c0 stop|pause|resume patrolread`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatrolCommand {
    Stop,
    Pause,
    Resume,
}

/// One drive a patrol reads.
struct PatrolTarget {
    slot: u32,
    drive: Arc<dyn Drive>,
    /// Drive bytes to read.
    range: std::ops::Range<u64>,
    /// The VD and member index, for a member; `None` for a hot spare.
    member: Option<(u32, Arc<VirtualDrive>, usize)>,
}

impl Controller {
    /// Starts a patrol read of every member and hot spare now (`start patrolread`).
    ///
    /// # Errors
    /// Patrol read is off, or one runs already. Nothing starts then.
    pub fn start_patrol_read(&self) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let settings = state.config.settings.patrol;
        if !settings.enabled {
            return Err(ControlError::Conflict("patrol read is off; `/c0 set patrolread=on` first".into()));
        }
        if let Some(running) = self.patrol.lock().expect("patrol lock").as_ref() {
            return Err(ControlError::Conflict(format!(
                "a patrol read is {} already ({:.1}%); stop it first",
                running.state(),
                running.progress.percent_done()
            )));
        }
        let (targets, left_out) = patrol_targets(&state, settings.include_ssds);
        state.config.settings.patrol.last_start_unix_secs = now_unix_secs();
        // Not fatal: the schedule would only start the next one early.
        if let Err(error) = self.persist(&mut state) {
            self.log(Severity::Warning, format!("patrol read: its start could not be recorded: {error}"));
        }
        drop(state);
        let total_chunks: u64 = targets.iter().map(|t| (t.range.end - t.range.start).div_ceil(PATROL_READ_BYTES)).sum();
        let progress = Progress::new(total_chunks, 0, settings.rate_percent);
        let view = PatrolView { progress, started: Instant::now(), tally: Arc::default(), slots: targets.iter().map(|t| t.slot).collect() };
        *self.patrol.lock().expect("patrol lock") = Some(view.clone());
        let skipped = if left_out.is_empty() { String::new() } else { format!("; SSDs left out: slots {}", slot_list(&left_out)) };
        self.log(
            Severity::Info,
            format!(
                "patrol read started: {} drive(s) (slots {}), prrate {}%{skipped}",
                targets.len(),
                slot_list(&view.slots),
                settings.rate_percent
            ),
        );
        let controller = self.myself();
        let spawned = std::thread::Builder::new().name("storc-patrol".into()).spawn(move || {
            let Some(controller) = controller.upgrade() else { return };
            controller.run_patrol(&view, &targets);
            controller.patrol_ended(&view);
        });
        match spawned {
            Ok(thread) => self.keep_thread(thread),
            Err(error) => {
                *self.patrol.lock().expect("patrol lock") = None;
                return Err(ControlError::Io(format!("patrol read cannot start a thread: {error}")));
            }
        }
        Ok(())
    }

    /// The patrol read that runs, if any.
    pub fn patrol_read(&self) -> Option<PatrolView> {
        self.patrol.lock().expect("patrol lock").clone()
    }

    /// When the next patrol read starts on its own: `None` when off or manual.
    pub fn patrol_next_start_unix_secs(&self) -> Option<u64> {
        let settings = self.state.lock().expect("controller lock").config.settings.patrol;
        if !settings.enabled || settings.manual {
            return None;
        }
        let delay_secs = u64::from(settings.delay_hours) * 3600;
        let after = match settings.last_start_unix_secs {
            0 => self.started_unix_secs,
            last => last,
        };
        Some(after + delay_secs)
    }

    /// Steers the patrol read.
    ///
    /// # Errors
    /// None runs, or the command does not fit its state.
    pub fn patrol_command(&self, command: PatrolCommand) -> Result<(), ControlError> {
        let Some(view) = self.patrol_read() else {
            return Err(ControlError::NotFound("no patrol read is running; `/c0 start patrolread` starts one".into()));
        };
        let next = match (command, view.progress.control()) {
            (PatrolCommand::Stop, Control::Run | Control::Pause) => Control::Stop,
            (PatrolCommand::Pause, Control::Run) => Control::Pause,
            (PatrolCommand::Resume, Control::Pause) => Control::Run,
            _ => {
                return Err(ControlError::Conflict(format!("the patrol read is {}; {command:?} does not apply", view.state())));
            }
        };
        view.progress.set_control(next);
        self.log(Severity::Info, format!("patrol read: {command:?} at {:.1}%", view.progress.percent_done()));
        Ok(())
    }

    /// Stops the patrol read (shutdown); the schedule starts the next one.
    pub(super) fn stop_patrol(&self) {
        if let Some(view) = self.patrol.lock().expect("patrol lock").as_ref() {
            view.progress.set_control(Control::Stop);
        }
    }

    /// Called every few seconds: starts the patrol read the schedule says is due.
    pub(super) fn patrol_tick(&self) {
        let due = self.patrol_next_start_unix_secs().is_some_and(|next| now_unix_secs() >= next);
        if due && self.patrol_read().is_none() {
            if let Err(error) = self.start_patrol_read() {
                self.log(Severity::Warning, format!("the scheduled patrol read cannot start: {error}"));
            }
        }
    }

    fn run_patrol(&self, view: &PatrolView, targets: &[PatrolTarget]) {
        let milestone = AtomicU64::new(0);
        let mut chunk_index = 0u64;
        for target in targets {
            view.tally.current_slot.store(u64::from(target.slot), Ordering::Relaxed);
            let mut offset_bytes = target.range.start;
            while offset_bytes < target.range.end {
                if background::wait_while_paused(&view.progress, 0) == Control::Stop {
                    return;
                }
                let len_bytes = PATROL_READ_BYTES.min(target.range.end - offset_bytes);
                let started = Instant::now();
                let read = metadata::submit_and_wait(
                    &*target.drive,
                    DriveOp::Read { offset_bytes, buf: drive::IoBuf::zeroed(len_bytes as usize) },
                );
                match read {
                    Ok(_) => {}
                    Err(DriveError::Gone) => {
                        self.log(Severity::Warning, format!("patrol read: slot {} is gone; it goes on with the next drive", target.slot));
                        break;
                    }
                    Err(_) => self.patrol_repair(view, target, offset_bytes, len_bytes),
                }
                view.tally.bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
                offset_bytes += len_bytes;
                chunk_index += 1;
                advance(&view.progress, chunk_index);
                self.patrol_milestone(&view.progress, &milestone);
                self.pace_patrol(&view.progress, started.elapsed());
            }
            view.tally.drives_done.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events at every quarter.
    fn patrol_milestone(&self, progress: &Progress, milestone: &AtomicU64) {
        let quarter = progress.watermark_row() * 4 / progress.total_rows.max(1);
        if quarter > milestone.fetch_max(quarter, Ordering::Relaxed) && quarter < 4 {
            self.log(Severity::Info, format!("patrol read: {}% done", quarter * 25));
        }
    }

    /// While clients use any VD, sleeps so that the patrol keeps `prrate` of the time.
    fn pace_patrol(&self, progress: &Progress, read_took: Duration) {
        let busy = self.vds().iter().any(|(_, vd)| vd.last_client_request().elapsed() < rebuild::CLIENTS_BUSY_WINDOW);
        let rate = u32::from(progress.rate_percent());
        if !busy || rate >= 100 {
            return;
        }
        let pause = match rate {
            0 => background::RATE_ZERO_BURST_INTERVAL,
            rate => read_took * (100 - rate) / rate,
        };
        std::thread::sleep(pause.min(PAUSE_MAX));
    }

    /// A read of `len_bytes` at `offset_bytes` failed: finds the bad pieces and deals with each.
    fn patrol_repair(&self, view: &PatrolView, target: &PatrolTarget, offset_bytes: u64, len_bytes: u64) {
        for bad in bad_ranges(&*target.drive, offset_bytes, len_bytes) {
            view.tally.medium_errors.fetch_add(1, Ordering::Relaxed);
            let where_ = format!("slot {} at LBA {} ({} sectors)", target.slot, bad.start / SECTOR, (bad.end - bad.start) / SECTOR);
            let Some((vd_id, vd, member)) = &target.member else {
                self.log(Severity::Warning, format!("patrol read found a medium error on hot spare {where_}: it holds no data to rewrite"));
                continue;
            };
            match self.rewrite_from_redundancy(vd, *member, &bad) {
                Ok(rows) if readable(&*target.drive, &bad) => {
                    view.tally.corrected.fetch_add(1, Ordering::Relaxed);
                    let message =
                        format!("patrol read corrected medium error on {where_}: v{vd_id} row(s) {rows} rewritten from redundancy");
                    self.log(Severity::Warning, message);
                }
                Ok(rows) => self.log(
                    Severity::Critical,
                    format!("patrol read: medium error on {where_}: v{vd_id} row(s) {rows} rewritten, yet the sectors still do not read"),
                ),
                Err(error) => self.log(Severity::Critical, format!("patrol read: medium error on {where_} not corrected: {error}")),
            }
        }
    }

    /// Rebuilds onto `member` every row of `vd` whose strips on it overlap `bad`; the rows, as
    /// text. Without redundancy the bytes are recorded in the bad-block list.
    fn rewrite_from_redundancy(&self, vd: &Arc<VirtualDrive>, member: usize, bad: &std::ops::Range<u64>) -> Result<String, String> {
        let rows = rows_on_member(vd.geometry(), member, bad);
        if vd.geometry().span_kind() == layout::SpanKind::Stripe {
            let lost = lost_vd_ranges(vd.geometry(), member, bad, &rows);
            vd.bad_blocks().record_lost(&lost, "patrol read found a medium error and nothing else holds the data").map_err(|e| {
                format!("the data is lost ({} keeps no redundancy) and cannot be recorded as a bad block: {e}", vd.geometry().level())
            })?;
            return Err(format!("{} keeps no redundancy: the data is lost, recorded in the bad-block list", vd.geometry().level()));
        }
        let bad_blocks_before = vd.bad_blocks().version();
        for &row in &rows {
            let (sender, receiver) = std::sync::mpsc::channel();
            self.engine.rebuild_row(vd, row, MemberSet::of(&[member]), Box::new(move |result| drop(sender.send(result))));
            match receiver.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(rebuild_error_text(&error)),
                Err(_) => return Err("the engine stopped".into()),
            }
        }
        if vd.bad_blocks().version() != bad_blocks_before {
            // The rebuild found part of it held nowhere else: zeros there now, and listed.
            return Err("nothing else held part of the data: it is in the bad-block list (show badblocks)".into());
        }
        Ok(rows.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
    }

    fn patrol_ended(&self, view: &PatrolView) {
        *self.patrol.lock().expect("patrol lock") = None;
        let tally = &view.tally;
        let summary = format!(
            "{} of {} drive(s), {} MiB read, {} medium error(s) found, {} corrected",
            tally.drives_done.load(Ordering::Relaxed),
            view.slots.len(),
            tally.bytes_read.load(Ordering::Relaxed) >> 20,
            tally.medium_errors.load(Ordering::Relaxed),
            tally.corrected.load(Ordering::Relaxed)
        );
        let secs = view.started.elapsed().as_secs_f64();
        match view.progress.control() {
            Control::Stop => self.log(Severity::Info, format!("patrol read stopped after {secs:.1} s: {summary}")),
            _ => self.log(Severity::Info, format!("patrol read done in {secs:.1} s: {summary}")),
        }
    }
}

const SECTOR: u64 = layout::SECTOR_BYTES;

/// The drives a patrol reads: members in service (not being rebuilt) of every VD, then hot
/// spares; SSDs only with `include_ssds`. Also the slots left out as SSDs.
fn patrol_targets(state: &State, include_ssds: bool) -> (Vec<PatrolTarget>, Vec<u32>) {
    let (mut targets, mut left_out) = (Vec::new(), Vec::new());
    let mut add = |slot: u32, drive: Arc<dyn Drive>, range, member| {
        if drive.info().solid_state && !include_ssds {
            left_out.push(slot);
        } else {
            targets.push(PatrolTarget { slot, drive, range, member });
        }
    };
    for record in &state.config.vds {
        let vd = &state.vds[&record.vd_id];
        let geometry = vd.geometry();
        for (member, slot) in record.member_slots.iter().enumerate() {
            if vd.member(member).state() == crate::vd::MemberState::Online {
                let range = geometry.data_offset_bytes()..geometry.member_used_bytes();
                add(*slot, vd.member(member).drive(), range, Some((record.vd_id, Arc::clone(vd), member)));
            }
        }
    }
    for spare in &state.config.hot_spares {
        let is_spare = state.config.drives.iter().any(|d| d.slot == spare.slot && d.state == DriveState::HotSpare);
        if let (true, Some(present)) = (is_spare, state.slots.get(&spare.slot)) {
            let capacity_bytes = present.drive.info().capacity_bytes;
            add(spare.slot, Arc::clone(&present.drive), crate::vd::MEMBER_RESERVED_BYTES.min(capacity_bytes)..capacity_bytes, None);
        }
    }
    (targets, left_out)
}

/// The patrol's progress, in reads done.
fn advance(progress: &Progress, chunks_done: u64) {
    progress.set_watermark_row(chunks_done.min(progress.total_rows));
}

/// The pieces of `[offset_bytes, offset_bytes + len_bytes)` that do not read, probed in
/// [`PROBE_BYTES`] and merged where they touch.
fn bad_ranges(drive: &dyn Drive, offset_bytes: u64, len_bytes: u64) -> Vec<std::ops::Range<u64>> {
    let mut bad: Vec<std::ops::Range<u64>> = Vec::new();
    let end = offset_bytes + len_bytes;
    let mut at = offset_bytes;
    while at < end {
        let piece = at..(at + PROBE_BYTES).min(end);
        if !readable(drive, &piece) {
            match bad.last_mut() {
                Some(last) if last.end == piece.start => last.end = piece.end,
                _ => bad.push(piece.clone()),
            }
        }
        at = piece.end;
    }
    bad
}

fn readable(drive: &dyn Drive, range: &std::ops::Range<u64>) -> bool {
    let buf = drive::IoBuf::zeroed((range.end - range.start) as usize);
    metadata::submit_and_wait(drive, DriveOp::Read { offset_bytes: range.start, buf }).is_ok()
}

/// The VD rows whose strips on `member` overlap `bad` (drive bytes). A member's physical strip
/// `p` holds part of the rows `p / 2 ..= p` of its span (two strips a row for RAID1E).
fn rows_on_member(geometry: &layout::Geometry, member: usize, bad: &std::ops::Range<u64>) -> Vec<u64> {
    let strip_bytes = geometry.strip_size_bytes();
    let first_strip = (bad.start - geometry.data_offset_bytes()) / strip_bytes;
    let last_strip = (bad.end - 1 - geometry.data_offset_bytes()) / strip_bytes;
    let (span, spans) = (geometry.span_of_drive(member) as u64, geometry.span_count() as u64);
    let overlaps = |row: u64| {
        geometry.row_map(row).members().any(|(place, _, _)| {
            place.drive == member && place.drive_offset_bytes < bad.end && bad.start < place.drive_offset_bytes + strip_bytes
        })
    };
    (first_strip / 2..=last_strip)
        .map(|row_in_span| row_in_span * spans + span)
        .filter(|&row| row < geometry.row_count() && overlaps(row))
        .collect()
}

/// For a level without redundancy: the VD bytes `bad` held on `member`, in `rows`.
fn lost_vd_ranges(geometry: &layout::Geometry, member: usize, bad: &std::ops::Range<u64>, rows: &[u64]) -> Vec<crate::config::BadBlock> {
    let strip_bytes = geometry.strip_size_bytes();
    let mut lost = Vec::new();
    for &row in rows {
        let map = geometry.row_map(row);
        for strip in 0..map.data_strip_count() {
            let place = map.data_copy(strip, 0);
            let (from, to) = (bad.start.max(place.drive_offset_bytes), bad.end.min(place.drive_offset_bytes + strip_bytes));
            if place.drive == member && from < to {
                let vd_offset_bytes = row * geometry.row_data_bytes() + strip as u64 * strip_bytes + (from - place.drive_offset_bytes);
                lost.push(crate::config::BadBlock { offset_bytes: vd_offset_bytes, len_bytes: to - from });
            }
        }
    }
    lost
}

fn rebuild_error_text(error: &VdError) -> String {
    match error {
        VdError::RowUnrecoverable { detail, .. } => format!("nothing else holds the data there: {detail}"),
        other => other.to_string(),
    }
}
