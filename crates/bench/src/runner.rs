//! Runs patterns on an opened target: each point's workers built from its plan, run, and
//! summarised into the result model; ratings computed from the points.

use crate::open::OpenTarget;
use crate::patterns::{Pattern, PointPlan, SweepOptions, ZoneRule, RATING_QUEUE_DEPTHS};
use crate::results::{LatencyUs, PatternResult, Point, Rating, RatingTerm};
use crate::verify::Verifier;
use crate::workload::{run_jobs, Job, Pace, PointMeasurement, RunOptions};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Default measured time per point: the review suite (243 points) then takes about 11 minutes
/// with the ramp and the drain, within the 15 the issue allows.
pub const DURATION_DEFAULT: Duration = Duration::from_secs(2);
pub const RAMP_DEFAULT: Duration = Duration::from_millis(500);
/// `--quick`: enough to exercise every path in CI, not to measure.
pub const QUICK_DURATION: Duration = Duration::from_millis(200);
pub const QUICK_RAMP: Duration = Duration::from_millis(50);
/// Drain and setup per point, for time estimates.
const POINT_OVERHEAD: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
pub struct RunSettings {
    pub duration: Duration,
    pub ramp: Duration,
    pub seed: u64,
    pub verify: bool,
    pub sweep: SweepOptions,
    pub pace: Pace,
}

impl RunSettings {
    /// How long `points` points take, roughly.
    pub fn estimate(&self, points: usize) -> Duration {
        (self.duration + self.ramp + POINT_OVERHEAD) * points as u32
    }
}

/// Told as a run progresses; every method has a default that does nothing.
pub trait Observer {
    fn point_started(&mut self, _pattern: &Pattern, _coordinates: &BTreeMap<String, u64>) {}
    fn point_finished(&mut self, _pattern: &Pattern, _point: &Point) {}
    fn pattern_finished(&mut self, _result: &PatternResult) {}
}

/// Observes nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// Runs patterns on one target; with `--verify`, one verifier spans every pattern, so a later
/// pattern's reads check an earlier one's writes.
pub struct Runner<'a> {
    target: &'a OpenTarget,
    settings: RunSettings,
    verifier: Option<Arc<Verifier>>,
    points_run: u64,
}

impl<'a> Runner<'a> {
    pub fn new(target: &'a OpenTarget, settings: RunSettings) -> Runner<'a> {
        let verifier = settings.verify.then(|| Arc::new(Verifier::new()));
        Runner { target, settings, verifier, points_run: 0 }
    }

    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    pub fn run_pattern(&mut self, pattern: &Pattern, observer: &mut dyn Observer) -> PatternResult {
        let mut points = Vec::new();
        for plan in pattern.points(&self.settings.sweep) {
            observer.point_started(pattern, &plan.coordinates);
            let point = self.run_point(&plan);
            observer.point_finished(pattern, &point);
            points.push(point);
        }
        let result = PatternResult {
            name: pattern.name.into(),
            source: pattern.source.text().into(),
            description: pattern.description.into(),
            notes: pattern.notes.into(),
            groups: pattern.group_descriptions(&self.settings.sweep),
            axes: pattern.axis_values(&self.settings.sweep),
            charts: pattern.chart_hints(),
            ratings: ratings(&points),
            points,
        };
        observer.pattern_finished(&result);
        result
    }

    /// Runs one point; a point the target cannot hold is returned with `skipped` set.
    pub fn run_point(&mut self, plan: &PointPlan) -> Point {
        let workers = plan.groups.iter().map(|g| g.workers).sum();
        let planned_queue_depth = plan.groups.iter().map(|g| g.workers * g.queue_depth).sum();
        let skeleton = Point { coordinates: plan.coordinates.clone(), workers, total_queue_depth: planned_queue_depth, ..Point::default() };
        let jobs = match build_jobs(self.target, plan, self.verifier.is_some()) {
            Ok(jobs) => jobs,
            Err(reason) => return Point { skipped: Some(reason), ..skeleton },
        };
        // A worker with several disks keeps its queue depth on each, as IOMeter's do.
        let skeleton = Point { total_queue_depth: jobs.iter().map(|job| job.queue_depth).sum(), ..skeleton };
        let options = RunOptions {
            ramp: self.settings.ramp,
            duration: self.settings.duration,
            // Each point draws its own sequence, the same on every run with the same seed.
            seed: self.settings.seed.wrapping_add(self.points_run * 1024),
            pace: self.settings.pace,
            verifier: self.verifier.clone(),
        };
        self.points_run += 1;
        let point = summarise(skeleton, &run_jobs(&jobs, &options));
        // Untimed: the next point starts with the drives' write caches drained.
        if let Err(error) = self.target.settle() {
            eprintln!("warning: the flush after a point failed: {error}");
        }
        point
    }
}

/// The jobs of a point on `target`: one per worker of each group and disk it is assigned
/// ([`disk_assignment`]), in the zones the group's rule cuts from that disk among the workers
/// that share it; `reads_checked` when they verify what they read.
///
/// # Errors
/// Why the point cannot run: a disk is too small for its requests, or a worker could not be
/// connected.
pub fn build_jobs(target: &OpenTarget, plan: &PointPlan, reads_checked: bool) -> Result<Vec<Job>, String> {
    let mut jobs = Vec::new();
    let mut workers_before = 0;
    for group in &plan.groups {
        let block_bytes_max = group.spec.block_bytes_max();
        let pairs = disk_assignment(group.workers, target.disk_count());
        let mut zones_by_disk = Vec::new();
        for disk in 0..target.disk_count() {
            let sharers = pairs.iter().filter(|(_, d)| *d == disk).count();
            zones_by_disk.push(zones(group.zone, sharers, target.disk_capacity_bytes(), block_bytes_max)?.into_iter());
        }
        for (worker, disk) in pairs {
            let (zone, first_offset_bytes) = zones_by_disk[disk].next().expect("one zone per worker sharing the disk");
            let worker_target = target.worker_target(workers_before + worker, disk, group.queue_depth, &group.spec, reads_checked)?;
            let verify_base_bytes = disk as u64 * target.disk_capacity_bytes();
            let spec = group.spec.clone();
            let distribution = group.distribution.clone();
            let queue_depth = group.queue_depth;
            jobs.push(Job { target: worker_target, spec, queue_depth, zone, first_offset_bytes, verify_base_bytes, distribution });
        }
        workers_before += group.workers;
    }
    Ok(jobs)
}

/// IOMeter's assignment of a group's workers to disks, as (worker, disk) pairs, each one job
/// at the group's queue depth: with at least as many disks as workers, worker w takes disks
/// w, w + W, w + 2W, ... (8 workers on 16 disks: two each); with fewer, disk d is shared by
/// workers d, d + D, ... (one disk: every worker on it).
pub fn disk_assignment(workers: usize, disks: usize) -> Vec<(usize, usize)> {
    assert!(workers > 0 && disks > 0);
    if disks >= workers {
        (0..disks).map(|disk| (disk % workers, disk)).collect()
    } else {
        (0..workers).map(|worker| (worker, worker % disks)).collect()
    }
}

/// Each worker's zone and first sequential offset under `rule`. Workers that a rule would give
/// a zone smaller than one request share the rule's whole range instead, their sequential
/// streams starting evenly spread over it.
///
/// # Errors
/// If the rule's range of the target cannot hold one request of `block_bytes_max`.
pub fn zones(rule: ZoneRule, workers: usize, capacity_bytes: u64, block_bytes_max: u64) -> Result<Vec<(Range<u64>, u64)>, String> {
    assert!(workers > 0 && block_bytes_max > 0);
    let (from, to) = match rule {
        ZoneRule::Part { from_permille, to_permille } => {
            (capacity_bytes / 1000 * u64::from(from_permille), capacity_bytes / 1000 * u64::from(to_permille))
        }
        _ => (0, capacity_bytes),
    };
    let start = from.next_multiple_of(block_bytes_max);
    if start >= to || to - start < block_bytes_max {
        return Err(format!(
            "the target's zone ({}: {} bytes) cannot hold one {}-byte request",
            rule.text(),
            to.saturating_sub(from),
            block_bytes_max
        ));
    }
    let len = (to - start) / block_bytes_max * block_bytes_max;
    let even_slice = len / workers as u64 / block_bytes_max * block_bytes_max;
    let slice = match rule {
        ZoneRule::Whole => 0,
        ZoneRule::Slices | ZoneRule::Part { .. } => even_slice,
        ZoneRule::Spaced { stride_bytes } => (stride_bytes / block_bytes_max * block_bytes_max).min(even_slice),
    };
    let zones = (0..workers as u64).map(|i| match slice {
        0 => (start..start + len, start + len / workers as u64 * i / block_bytes_max * block_bytes_max),
        slice => (start + i * slice..start + (i + 1) * slice, start + i * slice),
    });
    Ok(zones.collect())
}

fn summarise(skeleton: Point, m: &PointMeasurement) -> Point {
    Point {
        ops: m.ops,
        read_ops: m.read_ops,
        write_ops: m.write_ops,
        bytes: m.bytes,
        errors: m.errors,
        elapsed_s: m.elapsed.as_secs_f64(),
        iops: m.iops(),
        mb_per_s: m.mb_per_sec(),
        latency_us: latency_us(&m.latency_ns),
        first_error: m.first_error.clone(),
        verify: m.verify.clone(),
        ..skeleton
    }
}

pub fn latency_us(histogram: &Histogram<u64>) -> LatencyUs {
    if histogram.is_empty() {
        return LatencyUs::default();
    }
    let at = |quantile: f64| histogram.value_at_quantile(quantile) as f64 / 1e3;
    LatencyUs {
        mean: histogram.mean() / 1e3,
        min: histogram.min() as f64 / 1e3,
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        p99_9: at(0.999),
        max: histogram.max() as f64 / 1e3,
    }
}

/// The performance rating of seed 001, Σ over q ∈ {1, 2, 4, 8, 16, 32} of IOPS(q) / q, for
/// every combination of the other coordinates that was measured at all six queue depths.
pub fn ratings(points: &[Point]) -> Vec<Rating> {
    let mut by_rest: BTreeMap<BTreeMap<String, u64>, BTreeMap<u64, f64>> = BTreeMap::new();
    for point in points.iter().filter(|p| p.skipped.is_none()) {
        let Some(&queue_depth) = point.coordinates.get("queue_depth") else { continue };
        let mut rest = point.coordinates.clone();
        rest.remove("queue_depth");
        by_rest.entry(rest).or_default().insert(queue_depth, point.iops);
    }
    by_rest
        .into_iter()
        .filter_map(|(coordinates, iops)| {
            let terms: Vec<RatingTerm> = RATING_QUEUE_DEPTHS
                .iter()
                .map(|&q| iops.get(&q).map(|&iops| RatingTerm { queue_depth: q, iops }))
                .collect::<Option<_>>()?;
            let value = terms.iter().map(|t| t.iops / t.queue_depth as f64).sum();
            Some(Rating { coordinates, value, terms })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn rating_is_the_sum_of_iops_over_queue_depth() {
        let point = |qd: u64, write: u64, iops: f64| Point {
            coordinates: BTreeMap::from([("queue_depth".into(), qd), ("write_percent".into(), write)]),
            iops,
            ..Point::default()
        };
        // IOPS 100, 180, 320, 480, 640, 800 at QD 1..32: 100 + 90 + 80 + 60 + 40 + 25 = 395.
        let mut points: Vec<Point> = [(1, 100.0), (2, 180.0), (4, 320.0), (8, 480.0), (16, 640.0), (32, 800.0), (64, 9999.0)]
            .iter()
            .map(|&(qd, iops)| point(qd, 0, iops))
            .collect();
        // Another write share, missing QD 32: no rating for it.
        points.extend([1, 2, 4, 8, 16].iter().map(|&qd| point(qd, 50, 1.0)));
        let ratings = ratings(&points);
        assert_eq!(ratings.len(), 1);
        assert_eq!(ratings[0].coordinates, BTreeMap::from([("write_percent".into(), 0)]));
        assert!((ratings[0].value - 395.0).abs() < 1e-9, "{}", ratings[0].value);
        assert_eq!(ratings[0].terms.len(), 6);
    }

    #[test]
    fn workers_take_disks_as_iometer_assigns_them() {
        let per_worker =
            |pairs: &[(usize, usize)], worker: usize| pairs.iter().filter(|(w, _)| *w == worker).map(|(_, d)| *d).collect::<Vec<_>>();
        // The HBA tests of seed 002: eight workers, two disks each, every disk once.
        let hba = disk_assignment(8, 16);
        assert_eq!(hba.len(), 16);
        assert!((0..8).all(|worker| per_worker(&hba, worker).len() == 2));
        assert_eq!(per_worker(&hba, 3), [3, 11]);
        let mut disks: Vec<usize> = hba.iter().map(|(_, d)| *d).collect();
        disks.sort_unstable();
        assert_eq!(disks, (0..16).collect::<Vec<_>>());
        // One disk: every worker on it, as before sets existed.
        assert_eq!(disk_assignment(3, 1), [(0, 0), (1, 0), (2, 0)]);
        // More workers than disks: they take turns on the disks.
        assert_eq!(disk_assignment(5, 2), [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]);
    }

    #[test]
    fn slices_do_not_overlap_and_cover_the_target() {
        let zones = zones(ZoneRule::Slices, 4, 10 * GIB + 12345, 64 * 1024).unwrap();
        assert_eq!(zones.len(), 4);
        for pair in zones.windows(2) {
            assert_eq!(pair[0].0.end, pair[1].0.start);
        }
        assert_eq!(zones[0].0.start, 0);
        assert!(zones[3].0.end <= 10 * GIB + 12345 && zones[3].0.end > 10 * GIB - 256 * 1024);
        assert!(zones.iter().all(|(zone, first)| *first == zone.start));
    }

    #[test]
    fn spaced_zones_start_two_gib_apart_and_shrink_to_fit() {
        let big = zones(ZoneRule::Spaced { stride_bytes: 2 * GIB }, 3, 100 * GIB, 64 * 1024).unwrap();
        assert_eq!(big.iter().map(|(z, _)| z.start / GIB).collect::<Vec<_>>(), [0, 2, 4]);
        let small = zones(ZoneRule::Spaced { stride_bytes: 2 * GIB }, 24, 12 * GIB, 64 * 1024).unwrap();
        assert_eq!(small[1].0.start, GIB / 2);
        assert!(small[23].0.end <= 12 * GIB);
    }

    #[test]
    fn the_middle_zone_is_forty_to_sixty_percent() {
        let middle = ZoneRule::Part { from_permille: 400, to_permille: 600 };
        let zones = zones(middle, 1, 1000 * GIB, 4096).unwrap();
        let (zone, _) = &zones[0];
        assert!((zone.start as f64 / (1000 * GIB) as f64 - 0.4).abs() < 1e-6);
        assert!((zone.end as f64 / (1000 * GIB) as f64 - 0.6).abs() < 1e-6);
    }

    #[test]
    fn workers_share_a_zone_too_small_to_cut_and_too_small_is_an_error() {
        let middle = ZoneRule::Part { from_permille: 400, to_permille: 600 };
        // 1 GiB target: a 200 MiB middle zone holds two aligned 64 MiB requests, not twenty slices.
        let shared = zones(middle, 20, GIB, 64 * MIB).unwrap();
        assert!(shared.iter().all(|(zone, _)| *zone == shared[0].0));
        assert!(shared.iter().all(|(zone, first)| zone.contains(first)));
        assert_ne!(shared[0].1, shared[19].1, "sequential streams start spread out");
        let error = zones(middle, 1, 256 * MIB, 64 * MIB).unwrap_err();
        assert!(error.contains("cannot hold one 67108864-byte request"), "{error}");
    }
}
