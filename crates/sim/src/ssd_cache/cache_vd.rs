//! The cache VD's write-intent bitmap. A RAID1 cache VD gets one at every start, as the
//! controller opens every redundant VD's, so that power cuts may come while both its SSDs are
//! in service: after one, the regions where its copies may disagree (a line or table write in
//! flight, kept on one SSD and dropped on the other) are read from the first copy until they
//! are resynced, and the model checks every read before and after the resync. Once an SSD has
//! failed the cache VD opens none: the one copy left cannot disagree with anything.

use super::{Running, SsdCacheReport, ROW_JOB_TIMEOUT};
use crate::drive::flush_now;
use engine::bitmap::control::Opening;
use engine::{CheckMode, CheckOutcome, VdError, VirtualDrive};
use std::sync::mpsc::channel;

/// Small regions, so that a power cut leaves some synced and some not.
const ROWS_PER_REGION: u64 = 2;

/// Opens the cache VD's bitmap (a RAID1 one whose SSDs are both in service): `first` for the
/// VD the run created over blank SSDs, else as assembled after a stop.
pub(super) fn open_bitmap(cache_vd: &VirtualDrive, seed: u64, first: bool, ssd_failed: bool) {
    if !ssd_failed {
        let opening = if first { Opening::CreatedZeroed } else { Opening::Assembled };
        crate::intent::open(cache_vd, seed, ROWS_PER_REGION, opening);
    }
}

/// Resyncs every region of the cache VD that awaits it, as the controller's resync does: the
/// region's rows made equal to their first copy, the region marked synced, and at the end the
/// SSDs flushed (the resync checkpoint's flush: `members::resync` says why).
pub(super) fn resync(running: &Running, report: &mut SsdCacheReport) -> Result<(), String> {
    let Some(intent) = running.cache_vd.write_intent() else { return Ok(()) };
    for region in intent.unsynced_regions().ones() {
        let rows = intent.regions.rows_of(region);
        let (sender, outcome) = channel();
        let done = Box::new(move |results| {
            let _ = sender.send(results);
        });
        running.engine.check_rows(&running.cache_vd, rows.start, rows.end - rows.start, CheckMode::Resync, done);
        let results: Vec<Result<CheckOutcome, VdError>> =
            outcome.recv_timeout(ROW_JOB_TIMEOUT).map_err(|_| format!("the resync of cache VD region {region} never finished"))?;
        if let Some(error) = results.into_iter().find_map(Result::err) {
            return Err(format!("the resync of cache VD region {region} failed: {error}"));
        }
        intent.region_synced(region);
        report.cache_regions_resynced += 1;
    }
    for (index, member) in running.cache_vd.members().iter().enumerate() {
        flush_now(&*member.drive()).map_err(|e| format!("flush of cache SSD {index} after the resync: {e}"))?;
    }
    Ok(())
}
