//! The families of what runs beside the clients' I/O: background operations (rebuild,
//! copyback, migration, consistency check, initialization, patrol read, resync), the controller cache and
//! its journal, and the SSD cache tier.

use super::gather::{vd_labels, VdSeen};
use super::{flag, Columns, Family, Kind, Labels, Value};
use crate::daemon::api::AppState;
use engine::background::{Control, Progress};
use engine::controller::{JournalState, SsdCacheView};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Every kind of background operation, the `kind` label's values.
const KINDS: [&str; 8] = ["rebuild", "copyback", "migrate", "cc", "bgi", "init", "patrol", "resync"];

/// Every journal state (`Missing`: no journal).
const JOURNAL_STATES: [JournalState; 4] = [JournalState::Optimal, JournalState::Degraded, JournalState::Failed, JournalState::Missing];

pub(super) fn all(state: &AppState, vds: &[VdSeen]) -> Vec<Family> {
    let mut families = background(state, vds);
    families.extend(cache(state));
    families.extend(journal(state));
    families.extend(ssd_cache(state, vds));
    families
}

/// One background operation running (or paused) now.
struct Operation {
    kind: &'static str,
    /// `kind`, then `vd` and `slot` where the operation has them.
    labels: Labels,
    done_ratio: f64,
    /// The rate setting it runs at, as a ratio; `None` for operations without one.
    rate_ratio: Option<f64>,
    paused: bool,
    seconds_left: Option<Duration>,
}

impl Operation {
    fn new(kind: &'static str, vd: Option<u32>, slot: Option<u32>) -> Operation {
        let mut labels = vec![("kind", kind.to_string())];
        labels.extend(vd.map(|vd| ("vd", vd.to_string())));
        labels.extend(slot.map(|slot| ("slot", slot.to_string())));
        Operation { kind, labels, done_ratio: 0.0, rate_ratio: None, paused: false, seconds_left: None }
    }

    /// Progress, rate and pause as a row-walking operation's [`Progress`] has them.
    fn walking(mut self, progress: &Progress, seconds_left: Option<Duration>) -> Operation {
        self.done_ratio = progress.percent_done() / 100.0;
        self.rate_ratio = Some(f64::from(progress.rate_percent()) / 100.0);
        self.paused = progress.control() == Control::Pause;
        self.seconds_left = seconds_left;
        self
    }
}

fn operations(state: &AppState, vds: &[VdSeen]) -> Vec<Operation> {
    let controller = &state.controller;
    let mut operations = Vec::new();
    for view in controller.rebuilds() {
        operations.push(Operation::new("rebuild", Some(view.vd_id), Some(view.slot)).walking(&view.progress, view.estimated_time_left()));
    }
    for view in controller.copybacks() {
        let operation = Operation::new("copyback", Some(view.vd_id), Some(view.target_slot));
        operations.push(operation.walking(&view.progress, view.estimated_time_left()));
    }
    for view in controller.migrations() {
        let operation = Operation::new("migrate", Some(view.vd_id), Some(view.target_slot));
        operations.push(operation.walking(&view.progress, view.estimated_time_left()));
    }
    for view in controller.checks() {
        operations.push(Operation::new("cc", Some(view.vd_id), None).walking(&view.progress, view.estimated_time_left()));
    }
    for view in controller.bgis() {
        let mut operation = Operation::new("bgi", Some(view.vd_id), None);
        operation.done_ratio = view.percent_done / 100.0;
        operation.rate_ratio = Some(f64::from(view.rate_percent) / 100.0);
        operation.paused = view.status == "Paused";
        operation.seconds_left = view.estimated_time_left;
        operations.push(operation);
    }
    for view in vds.iter().filter_map(|seen| controller.init(seen.record.vd_id)) {
        let mut operation = Operation::new("init", Some(view.vd_id), None);
        operation.done_ratio = view.percent_done / 100.0;
        operations.push(operation);
    }
    if let Some(view) = controller.patrol_read() {
        operations.push(Operation::new("patrol", None, None).walking(&view.progress, None));
    }
    for seen in vds {
        if let Some(percent_done) = seen.view.resync.as_ref().and_then(|resync| resync.percent_done) {
            let mut operation = Operation::new("resync", Some(seen.record.vd_id), None);
            operation.done_ratio = percent_done as f64 / 100.0;
            operations.push(operation);
        }
    }
    operations
}

fn background(state: &AppState, vds: &[VdSeen]) -> Vec<Family> {
    let operations = operations(state, vds);
    let mut running =
        Family::new("storc_background_operations", Kind::Gauge, "Background operations under way (paused ones included), by kind.");
    for kind in KINDS {
        let count = operations.iter().filter(|operation| operation.kind == kind).count() as u64;
        running.push(vec![("kind", kind.to_string())], Value::Int(count));
    }
    let mut done = Family::new("storc_background_progress_ratio", Kind::Gauge, "How much of a background operation is done, 0 to 1.");
    let mut rate = Family::new(
        "storc_background_rate_ratio",
        Kind::Gauge,
        "The rate setting a background operation runs at while clients are busy, 0 to 1 (rebuildrate, ccrate, bgirate, prrate).",
    );
    let mut paused = Family::new("storc_background_paused", Kind::Gauge, "1 while a background operation is paused.");
    let mut left = Family::new(
        "storc_background_estimated_remaining_seconds",
        Kind::Gauge,
        "Time a background operation still needs at its speed so far, once there is a speed to go by.",
    );
    for operation in &operations {
        done.push(operation.labels.clone(), Value::Float(operation.done_ratio));
        if let Some(ratio) = operation.rate_ratio {
            rate.push(operation.labels.clone(), Value::Float(ratio));
        }
        paused.push(operation.labels.clone(), flag(operation.paused));
        if let Some(seconds_left) = operation.seconds_left {
            left.push(operation.labels.clone(), Value::Float(seconds_left.as_secs_f64()));
        }
    }
    let mut families = vec![running, done, rate, paused, left];
    families.extend(tallies(state));
    families
}

/// What the consistency checks and the patrol read under way found so far.
fn tallies(state: &AppState) -> Vec<Family> {
    let mut inconsistent =
        Family::new("storc_cc_inconsistent_rows", Kind::Gauge, "Rows the consistency check under way found inconsistent.");
    let mut repaired = Family::new("storc_cc_repaired_rows", Kind::Gauge, "Rows the consistency check under way repaired.");
    for view in state.controller.checks() {
        inconsistent.push(vd_labels(view.vd_id), Value::Int(view.tally.rows_inconsistent.load(Ordering::Relaxed)));
        repaired.push(vd_labels(view.vd_id), Value::Int(view.tally.rows_repaired.load(Ordering::Relaxed)));
    }
    let mut medium_errors = Family::new("storc_patrol_medium_errors", Kind::Gauge, "Unreadable ranges the patrol read under way found.");
    let mut corrected = Family::new("storc_patrol_corrected_errors", Kind::Gauge, "Of those, the ones it rewrote from redundancy.");
    if let Some(view) = state.controller.patrol_read() {
        medium_errors.push(Vec::new(), Value::Int(view.tally.medium_errors.load(Ordering::Relaxed)));
        corrected.push(Vec::new(), Value::Int(view.tally.corrected.load(Ordering::Relaxed)));
    }
    vec![inconsistent, repaired, medium_errors, corrected]
}

fn cache(state: &AppState) -> Vec<Family> {
    let engine = state.controller.engine();
    let stats = engine.cache_stats();
    let gauge = |name, help, value: u64| Family::new(name, Kind::Gauge, help).with(Vec::new(), Value::Int(value));
    let counter = |name, help, value: u64| Family::new(name, Kind::Counter, help).with(Vec::new(), Value::Int(value));
    vec![
        gauge("storc_cache_size_bytes", "The controller cache's size (storc serve --cache-size).", engine.cache_bytes()),
        gauge("storc_cache_dirty_bytes", "Cached bytes not yet on the members.", stats.dirty_bytes),
        gauge("storc_cache_pinned_bytes", "Dirty bytes of offline VDs, which cannot be destaged until they are back.", stats.pinned_bytes),
        gauge("storc_cache_clean_bytes", "Clean (read and read-ahead) bytes held.", stats.clean.bytes),
        counter("storc_cache_hits", "Reads served from the cache whole.", stats.clean.hits),
        counter("storc_cache_misses", "Reads that went to the members.", stats.clean.misses),
        counter("storc_cache_read_ahead_bytes", "Bytes read ahead into the cache.", stats.clean.read_ahead_bytes),
        counter("storc_cache_destages", "Destage runs that wrote dirty data to the members.", stats.destage.runs),
        counter("storc_cache_destaged_bytes", "Dirty bytes written to the members by destaging.", stats.destage.bytes),
        counter("storc_cache_destage_failures", "Destage runs that failed (their data stays cached).", stats.destage.failed_runs),
        counter(
            "storc_cache_destage_scattered_rows",
            "Destage runs that wrote a parity row's scattered extents as one row write.",
            stats.destage.scattered_runs,
        ),
    ]
}

fn journal(state: &AppState) -> Vec<Family> {
    let view = state.controller.journal_view();
    let mut states = Family::new(
        "storc_journal_state",
        Kind::Gauge,
        "1 for the cache journal's state (Missing: none assigned; WB VDs run WT without a usable one).",
    );
    let words: Vec<&str> = JOURNAL_STATES.iter().map(|s| s.short_name()).collect();
    states.push_state_set(&Vec::new(), &words, view.state.short_name());
    let mut legs =
        Family::new("storc_journal_leg_in_service", Kind::Gauge, "1 while a leg of the journal (of a mirrored pair) is in service.");
    for (index, leg) in view.legs.iter().enumerate() {
        legs.push(vec![("leg", index.to_string())], flag(leg.in_service));
    }
    let gauge = |name, help, value: u64| Family::new(name, Kind::Gauge, help).with(Vec::new(), Value::Int(value));
    vec![
        states,
        legs,
        gauge("storc_journal_capacity_bytes", "The journal device's size.", view.capacity_bytes),
        gauge("storc_journal_ring_bytes", "The journal's record space, over every shard's partition.", view.ring_bytes),
        gauge("storc_journal_used_bytes", "Journal bytes a replay could need now (records not yet checkpointed).", view.used_bytes),
    ]
}

/// Each cache VD's line counts and counters, and each cached VD's share of its lines.
fn ssd_cache(state: &AppState, vds: &[VdSeen]) -> Vec<Family> {
    let mut cache_vds = Columns::new(&SSD_CACHE_FAMILIES);
    let mut valid = Family::new("storc_vd_ssd_cache_valid_lines", Kind::Gauge, "Lines of an SSD cache VD holding this VD's data.");
    let mut dirty =
        Family::new("storc_vd_ssd_cache_dirty_lines", Kind::Gauge, "Of those, the lines newer there than on the VD (write-back).");
    let mut lost = Family::new("storc_vd_ssd_cache_lost", Kind::Gauge, "1 when the cache VD failed holding this VD's newest data.");
    for seen in vds {
        match state.controller.ssd_cache_view(seen.record.vd_id) {
            Some(SsdCacheView::CacheVd { stats, .. }) => cache_vds.add(&seen.labels(), &ssd_cache_values(&stats)),
            Some(SsdCacheView::Cached { lines_valid, lines_dirty, lost: is_lost, .. }) => {
                valid.push(seen.labels(), Value::Int(lines_valid));
                dirty.push(seen.labels(), Value::Int(lines_dirty));
                lost.push(seen.labels(), flag(is_lost));
            }
            None => {}
        }
    }
    let mut families = cache_vds.into_families();
    families.extend([valid, dirty, lost]);
    families
}

/// A cache VD's families (`vd` is the cache VD's number), in the order [`ssd_cache_values`]
/// gives them.
const SSD_CACHE_FAMILIES: [(&str, Kind, &str); 17] = [
    ("storc_ssd_cache_write_back", Kind::Gauge, "1 for a write-back cache VD, 0 for write-through."),
    ("storc_ssd_cache_lines", Kind::Gauge, "The cache VD's lines."),
    ("storc_ssd_cache_valid_lines", Kind::Gauge, "Lines holding data of a cached VD."),
    ("storc_ssd_cache_dirty_lines", Kind::Gauge, "Lines newer on the cache VD than on their VD."),
    ("storc_ssd_cache_line_size_bytes", Kind::Gauge, "The size of a line."),
    ("storc_ssd_cache_read_hits", Kind::Counter, "Reads served from the cache VD."),
    ("storc_ssd_cache_read_misses", Kind::Counter, "Reads that went to the VD."),
    ("storc_ssd_cache_read_bypassed", Kind::Counter, "Reads of a sequential stream served by the VD without promoting."),
    ("storc_ssd_cache_promotions", Kind::Counter, "Lines written to the cache VD and served from then on."),
    ("storc_ssd_cache_evictions", Kind::Counter, "Lines dropped to make room."),
    ("storc_ssd_cache_fills_dropped", Kind::Counter, "Fills dropped (a write came meanwhile, or a failure)."),
    ("storc_ssd_cache_write_updates", Kind::Counter, "Writes that updated lines on the cache VD as well as the VD."),
    ("storc_ssd_cache_writes_absorbed", Kind::Counter, "Writes kept on the cache VD (write-back)."),
    ("storc_ssd_cache_destaged_lines", Kind::Counter, "Dirty lines written to their VDs."),
    ("storc_ssd_cache_destage_retries", Kind::Counter, "Destages that left their line dirty (a write came meanwhile, or a failure)."),
    ("storc_ssd_cache_read_errors", Kind::Counter, "Reads the cache VD failed, served again by the VD."),
    ("storc_ssd_cache_table_write_errors", Kind::Counter, "Writes of the line table that failed (their writes failed with them)."),
];

fn ssd_cache_values(stats: &engine::ssd_cache::SsdCacheStats) -> [u64; 17] {
    [
        u64::from(stats.write_back),
        stats.line_count,
        stats.lines_valid,
        stats.lines_dirty,
        stats.line_bytes,
        stats.read_hits,
        stats.read_misses,
        stats.read_bypassed,
        stats.promotions,
        stats.evictions,
        stats.fills_dropped,
        stats.write_updates,
        stats.writes_absorbed,
        stats.lines_destaged,
        stats.destage_retries,
        stats.cache_read_errors,
        stats.table_write_errors,
    ]
}
