//! What happens to a redundant VD's members under the SSD cache (the VD is RAID1, 5 or 6), each
//! beside the clients and the cache's destager, which write to the VD as they please:
//!
//! - a member fails (its drive refuses every I/O; the data path finds out and takes it out);
//! - it is replaced by a blank drive and rebuilt, a few rows per job, the jobs in flight while
//!   the clients go on;
//! - (RAID6) a strip goes bad behind the VD's back, reads that nobody checks let the cache
//!   promote what the VD returns of it, and a repairing check must correct the strip *and* drop
//!   what the cache holds of it (`cache::RepairHold`);
//! - after a power cut, a resync of every row (parity recomputed, copies made equal), as the
//!   controller's write-intent bitmap would ask for, before anything is read.
//!
//! A power cut comes while no member is failed or being rebuilt, or, on RAID1, while one is
//! being rebuilt: the restart begins that rebuild again at row 0 (the controller resumes it at
//! its last checkpoint, and its bitmap's resync copies the dirty regions before it to the member
//! being rebuilt; starting over covers both). A parity VD cut while degraded has the write hole
//! these runs have no journal to close, and a failure not yet replaced lives in the controller's
//! metadata, which these runs do not have.

use super::{run_request, Drives, Running, SsdCacheReport, LINE_BYTES, ROW_JOB_TIMEOUT};
use crate::drive::{flush_now, write_now};
use drive::IoBuf;
use engine::{CheckMode, CheckOutcome, MemberSet, MemberState, VdError, VdRequest, VirtualDrive};
use layout::Level;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore};
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;

/// The most rows one rebuild job covers: a few, so that jobs and client requests interleave.
const REBUILD_RUN_ROWS_MAX: u64 = 4;

/// The VD's member events so far: at most one member out at a time.
#[derive(Default)]
pub(super) struct Members {
    /// The member whose drive was failed, until its rebuild finished.
    failed: Option<usize>,
    rebuild: Option<Rebuild>,
}

struct Rebuild {
    member: usize,
    /// Rows below it are rebuilt.
    next_row: u64,
    in_flight: Option<RebuildJob>,
}

/// A rebuild job in flight: its first row, its row count, and where its outcome arrives.
type RebuildJob = (u64, u64, Receiver<Vec<Result<(), VdError>>>);

impl Members {
    /// Whether a power cut may come now (see the module docs).
    pub(super) fn cut_allowed(&self, level: Level) -> bool {
        let quiet = self.failed.is_none() && self.rebuild.is_none();
        quiet || (level == Level::Raid1 && self.rebuild.is_some())
    }

    /// At a power cut: the member being rebuilt, whose rebuild begins again at row 0 once the
    /// VD is assembled (the job in flight dies with the engine). Its VD needs no resync of its
    /// own then, as the rebuild copies every row.
    pub(super) fn restart_rebuild(&mut self) -> Option<usize> {
        let rebuild = self.rebuild.as_mut()?;
        rebuild.next_row = 0;
        rebuild.in_flight = None;
        Some(rebuild.member)
    }

    /// One member event, as the seed says: a failure, the start of a rebuild, or (RAID6) a
    /// strip gone bad and repaired.
    pub(super) fn event(
        &mut self,
        running: &Running,
        drives: &mut Drives,
        rng: &mut SmallRng,
        report: &mut SsdCacheReport,
    ) -> Result<(), String> {
        if self.rebuild.is_some() {
            return Ok(());
        }
        if let Some(member) = self.failed {
            self.start_rebuild(running, drives, member)?;
            report.rebuilds += 1;
            return Ok(());
        }
        if running.vd.geometry().level() == Level::Raid6 && rng.gen_bool(0.5) {
            return repair_bad_strip(running, drives, rng, report);
        }
        let member = rng.gen_range(0..drives.vd_count);
        drives.faulty[member].set_failed(true);
        self.failed = Some(member);
        report.member_failures += 1;
        Ok(())
    }

    /// The failed member's drive is replaced by a blank one, which the rebuild writes.
    fn start_rebuild(&mut self, running: &Running, drives: &mut Drives, member: usize) -> Result<(), String> {
        // Out of service, then the new drive at once, while clients' requests are in flight:
        // an error of the old drive that one of them books after the swap must not fail the
        // new one (the engine compares the member's rebuild epoch).
        running.vd.set_member_state(member, MemberState::Failed);
        let blank = drives.replace_blank(member);
        running.vd.start_rebuild(member, blank);
        self.rebuild = Some(Rebuild { member, next_row: 0, in_flight: None });
        Ok(())
    }

    /// Settles the rebuild job in flight if it finished (`wait`: waits for it) and submits the
    /// next; puts the member back in service once every row is rebuilt.
    pub(super) fn advance(&mut self, running: &Running, wait: bool) -> Result<(), String> {
        let Some(rebuild) = &mut self.rebuild else { return Ok(()) };
        if let Some((first_row, row_count, outcome)) = &rebuild.in_flight {
            let results = if wait {
                outcome.recv_timeout(ROW_JOB_TIMEOUT).map_err(|_| format!("the rebuild job of rows {first_row}.. never finished"))?
            } else {
                match outcome.try_recv() {
                    Ok(results) => results,
                    Err(_) => return Ok(()),
                }
            };
            if let Some((index, Err(error))) = results.iter().enumerate().find(|(_, r)| r.is_err()) {
                return Err(format!("the rebuild of member {} failed at row {}: {error}", rebuild.member, *first_row + index as u64));
            }
            rebuild.next_row += row_count;
            rebuild.in_flight = None;
        }
        let rows = running.vd.geometry().row_count();
        if rebuild.next_row == rows {
            // As the controller does: the drive holds the rows durably before it is in service.
            flush_now(&*running.vd.member(rebuild.member).drive()).map_err(|e| format!("flush of the rebuilt member: {e}"))?;
            running.vd.finish_rebuild(rebuild.member);
            self.rebuild = None;
            self.failed = None;
            return Ok(());
        }
        let row_count = REBUILD_RUN_ROWS_MAX.min(rows - rebuild.next_row);
        let (sender, outcome) = channel();
        let done = Box::new(move |results| {
            let _ = sender.send(results);
        });
        running.engine.rebuild_rows(&running.vd, rebuild.next_row, row_count, MemberSet::of(&[rebuild.member]), done);
        rebuild.in_flight = Some((rebuild.next_row, row_count, outcome));
        Ok(())
    }

    /// Runs the rebuild in progress to its end.
    pub(super) fn finish(&mut self, running: &Running) -> Result<(), String> {
        while self.rebuild.is_some() {
            self.advance(running, true)?;
        }
        Ok(())
    }
}

/// A RAID6 strip goes bad on its drive; reads nobody checks return it (the SSD cache may keep
/// what they return); a repairing check must name and correct it, and every later read (the
/// model checks them all) must return the repaired bytes, from the cache or not.
///
/// The cache is drained first and nothing writes the VD until the check is done: a destage's
/// reconstruct-write reading the bad strip would compute parity from it, and no check could
/// tell the strip was bad any more.
fn repair_bad_strip(running: &Running, drives: &Drives, rng: &mut SmallRng, report: &mut SsdCacheReport) -> Result<(), String> {
    running.cache.flush_vd(&running.vd, ROW_JOB_TIMEOUT)?;
    let geometry = running.vd.geometry();
    let row = rng.gen_range(0..geometry.row_count());
    let member = rng.gen_range(0..drives.vd_count);
    let sector_bytes = 4096;
    let within_strip = rng.gen_range(0..geometry.strip_size_bytes() / sector_bytes) * sector_bytes;
    let mut garbage = vec![0u8; sector_bytes as usize];
    rng.fill_bytes(&mut garbage);
    let member_offset = geometry.data_offset_bytes() + row * geometry.strip_size_bytes() + within_strip;
    write_now(&*drives.volatile[member], member_offset, &garbage).map_err(|e| e.to_string())?;
    flush_now(&*drives.volatile[member]).map_err(|e| e.to_string())?;
    let row_bytes = geometry.row_data_bytes();
    for _ in 0..3 {
        for offset in (row * row_bytes..(row + 1) * row_bytes).step_by(LINE_BYTES as usize) {
            run_request(running, VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(LINE_BYTES as usize) })?;
        }
    }
    let outcomes = check_rows(running, &running.vd, 0..running.vd.geometry().row_count(), CheckMode::Repair)?;
    // As the controller's check does once it repaired rows (`controller/check.rs`).
    flush_members(&running.vd, "the repair")?;
    let outcome = &outcomes[row as usize];
    if outcome.is_consistent() || !outcome.repaired {
        return Err(format!("a repairing check left the bad strip of member {member} in row {row} as it was: {outcome:?}"));
    }
    running.cache.end_drain(&running.vd);
    report.strips_repaired += 1;
    Ok(())
}

/// After a power cut: every row's redundancy made to agree with its data, what the
/// controller's resync of the bitmap's dirty regions does, before the model checks a read;
/// then the members flushed, as the controller's resync checkpoint flushes them before it
/// forgets the regions (`bitmap::control::checkpoint_resync`). Unflushed, a copy the resync
/// wrote could be the only one left (its source replaced by a blank drive) and vanish at the
/// next power cut, taking back what reads had returned since.
pub(super) fn resync(running: &Running, report: &mut SsdCacheReport) -> Result<(), String> {
    check_rows(running, &running.vd, 0..running.vd.geometry().row_count(), CheckMode::Resync)?;
    flush_members(&running.vd, "the resync")?;
    report.resyncs += 1;
    Ok(())
}

/// Checks every row of the VD in `mode` and waits; an error names the first row that failed.
pub(super) fn check_rows(
    running: &Running,
    vd: &Arc<VirtualDrive>,
    rows: Range<u64>,
    mode: CheckMode,
) -> Result<Vec<CheckOutcome>, String> {
    let (sender, outcome) = channel();
    let done = Box::new(move |results| {
        let _ = sender.send(results);
    });
    let first = rows.start;
    running.engine.check_rows(vd, first, rows.end - first, mode, done);
    let results: Vec<Result<CheckOutcome, VdError>> =
        outcome.recv_timeout(ROW_JOB_TIMEOUT).map_err(|_| format!("a {mode:?} check of {} never finished", vd.name()))?;
    let named =
        |(i, r): (usize, Result<_, _>)| r.map_err(|e| format!("a {mode:?} check of {} row {} failed: {e}", vd.name(), first + i as u64));
    results.into_iter().enumerate().map(named).collect()
}

/// Flushes every member of `vd` (after `what`), as the controller's resync checkpoint does.
pub(super) fn flush_members(vd: &VirtualDrive, what: &str) -> Result<(), String> {
    for (index, member) in vd.members().iter().enumerate() {
        flush_now(&*member.drive()).map_err(|e| format!("flush of {} member {index} after {what}: {e}", vd.name()))?;
    }
    Ok(())
}
