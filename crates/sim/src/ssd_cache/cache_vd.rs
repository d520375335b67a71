//! The cache VD's write-intent bitmap. A RAID1 cache VD gets one at every start, as the
//! controller opens every redundant VD's, so that power cuts may come while both its SSDs are
//! in service: after one, the regions where its copies may disagree (a line or table write in
//! flight, kept on one SSD and dropped on the other) are read from the first copy until they
//! are resynced, and the model checks every read before and after the resync. Once an SSD has
//! failed the cache VD opens none: the one copy left cannot disagree with anything.

use super::members::{check_rows, flush_members};
use super::{Running, SsdCacheReport};
use engine::bitmap::control::Opening;
use engine::{CheckMode, VirtualDrive};

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
        check_rows(running, &running.cache_vd, intent.regions.rows_of(region), CheckMode::Resync)?;
        intent.region_synced(region);
        report.cache_regions_resynced += 1;
    }
    flush_members(&running.cache_vd, "the resync")
}
