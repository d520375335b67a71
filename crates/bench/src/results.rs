//! The result document of `storc bench run` and `storc bench suite`, as written with `--json`
//! (and flattened to one row per point with `--csv`).
//!
//! A [`Results`] says what was measured (target, level, drives, policies), on what machine,
//! with which storc and settings, and holds every pattern with every point and the point's
//! coordinates on the pattern's sweep axes. It is plain data: a report or chart generator needs
//! nothing else, and nothing here needs the code that measured it.
//!
//! Units are in the field names: `_bytes`, `_s` (seconds), `_us` (microseconds), `mb_per_s`
//! (10^6 bytes per second), `iops`. Latencies come from HDR histograms merged over all workers
//! of a point (never averaged percentiles); they run from the *intended* issue time, which in a
//! closed loop is the actual issue time and in an open loop is the schedule's.
//!
//! Axis names used in `coordinates` (see `patterns::Axis`): `queue_depth` (outstanding I/Os per
//! worker), `workers`, `block_bytes`, `write_percent`, `read_percent`, `random_percent`.

use crate::verify::{Mismatch, VerifyCounts};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bumped when a field changes meaning or disappears; new fields may be added without it.
pub const RESULTS_SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub schema_version: u32,
    pub storc_version: String,
    /// The command as typed, for reproducing the run.
    pub command_line: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
    /// The suite run, if any (`review`, `enterprise`, ...).
    pub suite: Option<String>,
    pub machine: Machine,
    pub target: TargetInfo,
    pub settings: Settings,
    pub patterns: Vec<PatternResult>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    /// Logical CPUs this process may use.
    pub cores: usize,
    /// From /proc/cpuinfo (`model name`).
    pub cpu_model: String,
    /// `uname -sr` equivalent, from /proc/sys/kernel.
    pub kernel: String,
    pub memory_bytes: u64,
}

/// What was measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetInfo {
    /// The `--target` text, normalised.
    pub spec: String,
    /// `vd` (in-process virtual drive), `nbd`, `file`, `block-device`, or `custom`.
    pub kind: String,
    pub description: String,
    pub capacity_bytes: u64,
    /// RAID level of a VD (`RAID5`).
    pub level: Option<String>,
    pub drive_count: Option<usize>,
    pub strip_size_bytes: Option<u64>,
    /// Member drives of a VD, or the file/device itself.
    pub drives: Vec<DriveDescription>,
    /// Cache policies of a VD; `None` where unknown (NBD: whatever the server does).
    pub policies: Option<Policies>,
    /// Whether the drives bypass the page cache.
    pub direct_io: Option<bool>,
    pub engine_shards: Option<usize>,
    /// The disks of a `set:`, which workers are assigned to as IOMeter assigns them; the other
    /// fields then describe one disk, but `capacity_bytes` and `drives` every disk.
    #[serde(default)]
    pub disk_count: Option<usize>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DriveDescription {
    pub name: String,
    /// `memory`, `file`, `block-device`, `emulated`.
    pub kind: String,
    /// The datasheet model an emulated drive behaves like.
    pub model: Option<String>,
    pub capacity_bytes: u64,
    pub direct_io: bool,
}

/// storcli words: write `wt`/`wb`/`awb`, read `nora`/`ra`/`adra`, io `direct`/`cached`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Policies {
    pub write: String,
    pub read: String,
    pub io: String,
    pub note: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    /// Measured seconds per point.
    pub duration_s: f64,
    /// Seconds per point before measuring starts, excluded.
    pub ramp_s: f64,
    pub seed: u64,
    pub verify: bool,
    /// Reduced sweeps and short points (`--quick`).
    pub quick: bool,
    /// `closed` (fixed outstanding I/Os per worker) or `open` (a fixed rate).
    pub loop_kind: String,
    /// Open loop: requests per second over all workers of a point.
    pub rate_iops: Option<f64>,
    /// `--qd`: queue depths that replaced each pattern's own.
    pub queue_depths: Option<Vec<u64>>,
    /// `--block`: block sizes that replaced each pattern's own.
    pub block_sizes: Option<Vec<u64>>,
    /// `--workers`: worker counts that replaced each pattern's own.
    #[serde(default)]
    pub workers: Option<Vec<u64>>,
    /// `--distribution`: where random requests fell, replacing each pattern's own (`zipf:1.1`).
    #[serde(default)]
    pub distribution: Option<String>,
}

/// One pattern as defined, and everything measured for it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PatternResult {
    pub name: String,
    /// Where the pattern comes from (`seed 000/001: the reviews`).
    pub source: String,
    /// The definition from BENCH.md.
    pub description: String,
    /// Choices storc made where the source does not say.
    pub notes: String,
    /// The workers of a point before the sweep changes them.
    pub groups: Vec<GroupDescription>,
    /// The swept axes, in order: the last one varies fastest in `points`.
    pub axes: Vec<AxisValues>,
    /// Charts the source drew from this pattern.
    pub charts: Vec<ChartHint>,
    pub points: Vec<Point>,
    /// Performance ratings (seed 001), one per combination of the non-QD axes, where the
    /// pattern was measured at every queue depth of 1, 2, 4, 8, 16 and 32.
    pub ratings: Vec<Rating>,
}

/// Workers that share an access specification.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GroupDescription {
    pub lines: Vec<crate::spec::AccessLine>,
    pub workers: usize,
    /// Outstanding I/Os per worker.
    pub queue_depth: usize,
    /// Which part of the target the workers use (`whole target, one slice per worker`).
    pub zone: String,
    /// Where random requests fall in the zone (`uniform`, `zoned:90/10:10/90`, `zipf:1.1`).
    #[serde(default)]
    pub distribution: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AxisValues {
    pub axis: String,
    /// `requests`, `workers`, `bytes`, `percent`.
    pub unit: String,
    pub values: Vec<u64>,
}

/// A chart the source showed: `y_metric` against `x_axis`, one line per value of
/// `series_axis`, with the other axes held at `fixed`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChartHint {
    pub title: String,
    pub x_axis: String,
    /// A field of [`Point`]: `iops`, `mb_per_s`, `latency_us.mean`, `latency_us.p99`.
    pub y_metric: String,
    pub series_axis: Option<String>,
    pub fixed: BTreeMap<String, u64>,
}

/// One measured point.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Point {
    /// Where on the pattern's axes this point lies: axis name → value.
    pub coordinates: BTreeMap<String, u64>,
    pub workers: usize,
    /// Outstanding I/Os over all workers.
    pub total_queue_depth: usize,
    /// Requests completed in the measured window (ramp excluded), all workers.
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes: u64,
    /// Failed requests, ramp included.
    pub errors: u64,
    pub elapsed_s: f64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub latency_us: LatencyUs,
    pub first_error: Option<String>,
    /// `--verify` only; ramp included.
    pub verify: Option<VerifyCounts>,
    /// Why the point was not measured (e.g. the target is smaller than one request).
    pub skipped: Option<String>,
}

/// Completion latency in microseconds from the merged HDR histogram (3 significant digits).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct LatencyUs {
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// Σ over q ∈ {1, 2, 4, 8, 16, 32} of IOPS(q) / q, for one combination of the other axes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rating {
    /// The other axes' values (e.g. `write_percent`).
    pub coordinates: BTreeMap<String, u64>,
    pub value: f64,
    pub terms: Vec<RatingTerm>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct RatingTerm {
    pub queue_depth: u64,
    pub iops: f64,
}

impl Results {
    /// Mismatched sectors over every point.
    pub fn mismatched_sectors(&self) -> u64 {
        self.points().filter_map(|(_, p)| p.verify.as_ref()).map(|v| v.mismatched_sectors).sum()
    }

    /// Failed requests over every point.
    pub fn errors(&self) -> u64 {
        self.points().map(|(_, p)| p.errors).sum()
    }

    /// The first mismatches over every point, with their pattern, at most `count`.
    pub fn first_mismatches(&self, count: usize) -> Vec<(String, Mismatch)> {
        self.points()
            .filter_map(|(pattern, point)| point.verify.as_ref().map(|v| (pattern, v)))
            .flat_map(|(pattern, verify)| verify.first_mismatches.iter().map(move |m| (pattern.name.clone(), m.clone())))
            .take(count)
            .collect()
    }

    /// Why the run failed, if it did: data read back wrong, or requests that failed. A report
    /// generator may still use the numbers; a caller must not exit 0.
    pub fn failure(&self) -> Option<String> {
        let mismatched = self.mismatched_sectors();
        let errors = self.errors();
        match (mismatched, errors) {
            (0, 0) => None,
            (0, errors) => Some(format!("{errors} requests failed")),
            (mismatched, errors) => Some(format!("VERIFY FAILED: {mismatched} sectors read back wrong ({errors} requests failed)")),
        }
    }

    pub fn points(&self) -> impl Iterator<Item = (&PatternResult, &Point)> {
        self.patterns.iter().flat_map(|pattern| pattern.points.iter().map(move |point| (pattern, point)))
    }

    /// One row per point; a column per axis that any pattern sweeps (empty where a pattern
    /// does not), then the measurements.
    pub fn to_csv(&self) -> String {
        let mut axes: Vec<String> = Vec::new();
        for pattern in &self.patterns {
            for point in &pattern.points {
                for axis in point.coordinates.keys() {
                    if !axes.contains(axis) {
                        axes.push(axis.clone());
                    }
                }
            }
        }
        let mut header = vec!["pattern".to_string()];
        header.extend(axes.iter().cloned());
        header.extend(CSV_MEASURES.iter().map(|m| m.to_string()));
        let mut out = header.join(",") + "\n";
        for (pattern, point) in self.points() {
            let mut row = vec![csv_field(&pattern.name)];
            row.extend(axes.iter().map(|axis| point.coordinates.get(axis).map(u64::to_string).unwrap_or_default()));
            row.extend(csv_measures(point));
            out += &(row.join(",") + "\n");
        }
        out
    }
}

const CSV_MEASURES: [&str; 17] = [
    "workers",
    "total_queue_depth",
    "iops",
    "mb_per_s",
    "latency_us_mean",
    "latency_us_p50",
    "latency_us_p99",
    "latency_us_p99_9",
    "latency_us_max",
    "ops",
    "read_ops",
    "write_ops",
    "bytes",
    "elapsed_s",
    "errors",
    "mismatched_sectors",
    "skipped",
];

fn csv_measures(point: &Point) -> Vec<String> {
    let l = &point.latency_us;
    let mismatches = point.verify.as_ref().map(|v| v.mismatched_sectors.to_string()).unwrap_or_default();
    vec![
        point.workers.to_string(),
        point.total_queue_depth.to_string(),
        format!("{:.1}", point.iops),
        format!("{:.3}", point.mb_per_s),
        format!("{:.1}", l.mean),
        format!("{:.1}", l.p50),
        format!("{:.1}", l.p99),
        format!("{:.1}", l.p99_9),
        format!("{:.1}", l.max),
        point.ops.to_string(),
        point.read_ops.to_string(),
        point.write_ops.to_string(),
        point.bytes.to_string(),
        format!("{:.3}", point.elapsed_s),
        point.errors.to_string(),
        mismatches,
        csv_field(point.skipped.as_deref().unwrap_or_default()),
    ]
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}
