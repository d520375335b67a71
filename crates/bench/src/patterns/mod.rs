//! Every pattern of BENCH.md as data: one table, [`PATTERNS`], and the suites that group them.
//!
//! A pattern is one or more groups of workers (each an access specification, a worker count, a
//! queue depth per worker and a zone rule) and a sweep: axes whose values replace the first
//! group's, one point per combination, the last axis varying fastest. Nothing here runs I/O;
//! `runner` turns a point into workers on a target.

use crate::distribution::Distribution;
use crate::results::{AxisValues, ChartHint, GroupDescription};
use crate::spec::{AccessLine, AccessSpec};
use std::collections::BTreeMap;

mod table;
pub use table::{PATTERNS, RATING_QUEUE_DEPTHS, SUITES};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// A line aligned to its own block size (IOMeter's "request size boundaries").
const fn line(block_bytes: u64, share_percent: u32, read_percent: u32, random_percent: u32) -> AccessLine {
    AccessLine { block_bytes, share_percent, read_percent, random_percent, align_bytes: block_bytes }
}

/// What a sweep varies. Each replaces one property of the first group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Outstanding I/Os per worker.
    QueueDepth,
    Workers,
    /// The block size of every line.
    BlockBytes,
    /// Every line's read share becomes 100 - value.
    WritePercent,
    ReadPercent,
    RandomPercent,
}

impl Axis {
    pub const ALL: [Axis; 6] =
        [Axis::QueueDepth, Axis::Workers, Axis::BlockBytes, Axis::WritePercent, Axis::ReadPercent, Axis::RandomPercent];

    /// The name in results (`coordinates`), CSV columns and tables.
    pub fn name(self) -> &'static str {
        match self {
            Axis::QueueDepth => "queue_depth",
            Axis::Workers => "workers",
            Axis::BlockBytes => "block_bytes",
            Axis::WritePercent => "write_percent",
            Axis::ReadPercent => "read_percent",
            Axis::RandomPercent => "random_percent",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Axis::QueueDepth => "requests",
            Axis::Workers => "workers",
            Axis::BlockBytes => "bytes",
            Axis::WritePercent | Axis::ReadPercent | Axis::RandomPercent => "percent",
        }
    }

    /// A short column header for terminal tables.
    pub fn short_name(self) -> &'static str {
        match self {
            Axis::QueueDepth => "qd",
            Axis::Workers => "workers",
            Axis::BlockBytes => "block",
            Axis::WritePercent => "write%",
            Axis::ReadPercent => "read%",
            Axis::RandomPercent => "random%",
        }
    }
}

/// Where a pattern comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The classic IOMeter access specifications.
    Classic,
    /// Seeds 000 and 001: the reviews.
    Reviews,
    /// Seed 003: the white paper's enterprise workloads.
    Enterprise,
    /// Seed 002: the HBA tests.
    Hba,
    /// Seed 004: the software-RAID matrix.
    SoftwareRaid,
}

impl Source {
    pub fn text(self) -> &'static str {
        match self {
            Source::Classic => "classic IOMeter access specifications",
            Source::Reviews => "seeds 000/001: the reviews' own patterns",
            Source::Enterprise => "seed 003: the white paper's enterprise workloads",
            Source::Hba => "seed 002: the HBA tests",
            Source::SoftwareRaid => "seed 004: the software-RAID matrix",
        }
    }
}

/// Which part of the target a group's workers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneRule {
    /// The whole target, shared; sequential workers start evenly spread over it.
    Whole,
    /// The whole target cut into one slice per worker (the reviews' non-overlapping zones).
    Slices,
    /// Worker `i` starts at `i × stride` (seed 003: "start offsets 2 GiB apart"); the stride
    /// shrinks to fit every worker in the target.
    Spaced { stride_bytes: u64 },
    /// `[from, to)` of the target in permille, cut into one slice per worker (seed 004's
    /// "middle zone" is 400..600: the middle 200 GB of a 1 TB drive).
    Part { from_permille: u32, to_permille: u32 },
}

impl ZoneRule {
    pub fn text(self) -> String {
        match self {
            ZoneRule::Whole => "whole target, shared".into(),
            ZoneRule::Slices => "whole target, one slice per worker".into(),
            ZoneRule::Spaced { stride_bytes } => format!("one zone per worker, starts {} MiB apart", stride_bytes / MIB),
            ZoneRule::Part { from_permille, to_permille } => {
                format!(
                    "{:.1}%..{:.1}% of the target, one slice per worker",
                    f64::from(from_permille) / 10.0,
                    f64::from(to_permille) / 10.0
                )
            }
        }
    }
}

/// Workers sharing one access specification.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub lines: &'static [AccessLine],
    pub workers: usize,
    /// Outstanding I/Os per worker.
    pub queue_depth: usize,
    pub zone: ZoneRule,
    /// Where random requests fall in the zone, as [`Distribution::parse`] reads it.
    pub distribution: &'static str,
}

impl Group {
    /// The pattern's own distribution.
    pub fn default_distribution(&self) -> Distribution {
        Distribution::parse(self.distribution).expect("built-in distributions are valid")
    }
}

/// A chart the source drew: `y` against `x`, a line per `series` value, other axes `fixed`.
#[derive(Clone, Copy, Debug)]
pub struct Chart {
    pub title: &'static str,
    pub x: Axis,
    /// `iops`, `mb_per_s`, `latency_us.mean`.
    pub y: &'static str,
    pub series: Option<Axis>,
    pub fixed: &'static [(Axis, u64)],
}

#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    pub name: &'static str,
    pub source: Source,
    /// The definition, as BENCH.md states it.
    pub description: &'static str,
    /// What storc chose where the source is silent.
    pub notes: &'static str,
    /// The sweep changes the first group; the others run alongside unchanged.
    pub groups: &'static [Group],
    pub sweep: &'static [(Axis, &'static [u64])],
    pub charts: &'static [Chart],
}

/// A set of patterns run one after the other on one target.
#[derive(Clone, Copy, Debug)]
pub struct Suite {
    pub name: &'static str,
    pub description: &'static str,
    pub patterns: &'static [&'static str],
}

/// # Errors
/// The unknown name, with every pattern name.
pub fn find(name: &str) -> Result<&'static Pattern, String> {
    PATTERNS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PATTERNS.iter().map(|p| p.name).collect();
        format!("unknown pattern {name:?}; allowed: {} (storc bench list shows their definitions)", names.join(", "))
    })
}

/// # Errors
/// The unknown name, with every suite name.
pub fn find_suite(name: &str) -> Result<&'static Suite, String> {
    SUITES.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
        format!("unknown suite {name:?}; allowed: {}", names.join(", "))
    })
}

impl Suite {
    pub fn members(&self) -> Vec<&'static Pattern> {
        if self.patterns.is_empty() {
            return PATTERNS.iter().collect();
        }
        self.patterns.iter().map(|name| find(name).expect("suites name existing patterns")).collect()
    }
}

/// How a sweep is cut down or replaced.
#[derive(Clone, Debug, Default)]
pub struct SweepOptions {
    /// First, middle and last value of each axis (`--quick`).
    pub quick: bool,
    /// Replaces the queue-depth axis, or adds one (`--qd`).
    pub queue_depths: Option<Vec<u64>>,
    /// Replaces the block-size axis, or adds one (`--block`).
    pub block_sizes: Option<Vec<u64>>,
    /// Replaces the worker-count axis, or adds one (`--workers`): one point of a sweep run on
    /// its own, to compare with the same point run after the others.
    pub workers: Option<Vec<u64>>,
    /// Replaces every group's distribution of random requests (`--distribution`).
    pub distribution: Option<Distribution>,
}

/// One point of a pattern: its coordinates and its groups with the sweep applied.
#[derive(Clone, Debug)]
pub struct PointPlan {
    pub coordinates: BTreeMap<String, u64>,
    pub groups: Vec<GroupPlan>,
}

#[derive(Clone, Debug)]
pub struct GroupPlan {
    pub spec: AccessSpec,
    pub workers: usize,
    pub queue_depth: usize,
    pub zone: ZoneRule,
    pub distribution: Distribution,
}

impl Pattern {
    /// The axes and their values after `options`.
    pub fn axes(&self, options: &SweepOptions) -> Vec<(Axis, Vec<u64>)> {
        let mut axes: Vec<(Axis, Vec<u64>)> = self.sweep.iter().map(|(axis, values)| (*axis, values.to_vec())).collect();
        if options.quick {
            for (_, values) in &mut axes {
                *values = quick_values(values);
            }
        }
        let replacements =
            [(Axis::BlockBytes, &options.block_sizes), (Axis::QueueDepth, &options.queue_depths), (Axis::Workers, &options.workers)];
        for (axis, replacement) in replacements {
            let Some(replacement) = replacement else { continue };
            match axes.iter_mut().find(|(a, _)| *a == axis) {
                Some((_, values)) => *values = replacement.clone(),
                None => axes.push((axis, replacement.clone())),
            }
        }
        axes
    }

    /// Every point, the last axis varying fastest.
    pub fn points(&self, options: &SweepOptions) -> Vec<PointPlan> {
        let axes = self.axes(options);
        let mut points = Vec::new();
        let mut index = vec![0usize; axes.len()];
        loop {
            points.push(self.point(axes.iter().zip(&index).map(|((axis, values), &i)| (*axis, values[i])), options));
            // Odometer: bump the last axis, carry leftwards.
            let mut position = axes.len();
            loop {
                if position == 0 {
                    return points;
                }
                position -= 1;
                index[position] += 1;
                if index[position] < axes[position].1.len() {
                    break;
                }
                index[position] = 0;
            }
        }
    }

    fn point(&self, coordinates: impl Iterator<Item = (Axis, u64)>, options: &SweepOptions) -> PointPlan {
        let mut groups: Vec<GroupPlan> = self
            .groups
            .iter()
            .map(|g| GroupPlan {
                spec: AccessSpec::new(g.lines.to_vec()).expect("built-in specs are valid"),
                workers: g.workers,
                queue_depth: g.queue_depth,
                zone: g.zone,
                distribution: options.distribution.clone().unwrap_or_else(|| g.default_distribution()),
            })
            .collect();
        let mut map = BTreeMap::new();
        for (axis, value) in coordinates {
            apply(&mut groups[0], axis, value);
            map.insert(axis.name().to_string(), value);
        }
        PointPlan { coordinates: map, groups }
    }

    /// The groups as defined, with the distribution in effect (`options`), for results.
    pub fn group_descriptions(&self, options: &SweepOptions) -> Vec<GroupDescription> {
        self.groups
            .iter()
            .map(|g| GroupDescription {
                lines: g.lines.to_vec(),
                workers: g.workers,
                queue_depth: g.queue_depth,
                zone: g.zone.text(),
                distribution: options.distribution.clone().unwrap_or_else(|| g.default_distribution()).text(),
            })
            .collect()
    }

    pub fn axis_values(&self, options: &SweepOptions) -> Vec<AxisValues> {
        self.axes(options)
            .into_iter()
            .map(|(axis, values)| AxisValues { axis: axis.name().into(), unit: axis.unit().into(), values })
            .collect()
    }

    pub fn chart_hints(&self) -> Vec<ChartHint> {
        self.charts
            .iter()
            .map(|c| ChartHint {
                title: c.title.into(),
                x_axis: c.x.name().into(),
                y_metric: c.y.into(),
                series_axis: c.series.map(|a| a.name().into()),
                fixed: c.fixed.iter().map(|(a, v)| (a.name().to_string(), *v)).collect(),
            })
            .collect()
    }
}

fn apply(group: &mut GroupPlan, axis: Axis, value: u64) {
    let lines: Vec<AccessLine> = group
        .spec
        .lines()
        .iter()
        .map(|l| match axis {
            Axis::BlockBytes => AccessLine { block_bytes: value, align_bytes: value, ..*l },
            Axis::WritePercent => AccessLine { read_percent: 100 - value as u32, ..*l },
            Axis::ReadPercent => AccessLine { read_percent: value as u32, ..*l },
            Axis::RandomPercent => AccessLine { random_percent: value as u32, ..*l },
            Axis::QueueDepth | Axis::Workers => *l,
        })
        .collect();
    group.spec = AccessSpec::new(lines).expect("sweep values are valid");
    match axis {
        Axis::QueueDepth => group.queue_depth = value as usize,
        Axis::Workers => group.workers = value as usize,
        _ => {}
    }
}

/// First, middle and last: enough to see the shape of a curve in a CI run.
fn quick_values(values: &[u64]) -> Vec<u64> {
    if values.len() <= 3 {
        return values.to_vec();
    }
    vec![values[0], values[values.len() / 2], values[values.len() - 1]]
}

#[cfg(test)]
mod tests;
