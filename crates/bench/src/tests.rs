//! Workers against real and synthetic targets: open-loop timing, zones, verification through a
//! VD with a corrupting member, and the NBD target against nbdkit.

use crate::open::{OpenOptions, OpenTarget, TargetSpec};
use crate::patterns::{self, SweepOptions};
use crate::results::{Results, TargetInfo};
use crate::runner::{Quiet, RunSettings, Runner};
use crate::spec::{AccessLine, AccessSpec};
use crate::target::{IoDone, Target, VdTarget};
use crate::verify::Verifier;
use crate::workload::{run_jobs, Job, Pace, PointMeasurement, RunOptions};
use drive::{Drive, Faults, FaultyDrive, IoBuf, MemDrive};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive};
use layout::Level;
use nbd::testing::Nbdkit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn options(duration_ms: u64, pace: Pace, verifier: Option<Arc<Verifier>>) -> RunOptions {
    RunOptions { ramp: Duration::ZERO, duration: Duration::from_millis(duration_ms), seed: 7, pace, verifier }
}

fn job(target: Arc<dyn Target>, lines: Vec<AccessLine>, queue_depth: usize, zone: std::ops::Range<u64>) -> Job {
    let spec = AccessSpec::new(lines).unwrap();
    Job { target, spec, queue_depth, first_offset_bytes: zone.start, zone, verify_base_bytes: 0, distribution: Default::default() }
}

/// Serves one request at a time, each taking `service`, on a thread of its own.
struct SlowTarget {
    queue: Mutex<mpsc::Sender<(IoBuf, IoDone)>>,
}

impl SlowTarget {
    fn new(service: Duration) -> SlowTarget {
        let (sender, receiver) = mpsc::channel::<(IoBuf, IoDone)>();
        std::thread::spawn(move || {
            for (buf, done) in receiver {
                std::thread::sleep(service);
                done(Ok(()), buf);
            }
        });
        SlowTarget { queue: Mutex::new(sender) }
    }
}

impl Target for SlowTarget {
    fn describe(&self) -> String {
        "slow".into()
    }
    fn capacity_bytes(&self) -> u64 {
        64 * MIB
    }
    fn submit(&self, _write: bool, _offset_bytes: u64, buf: IoBuf, done: IoDone) {
        self.queue.lock().unwrap().send((buf, done)).unwrap();
    }
}

fn slow_run(pace: Pace, queue_depth: usize) -> PointMeasurement {
    let target: Arc<dyn Target> = Arc::new(SlowTarget::new(Duration::from_millis(5)));
    run_jobs(&[job(target, vec![AccessLine::whole(4096, 100, 100)], queue_depth, 0..64 * MIB)], &options(600, pace, None))
}

#[test]
fn open_loop_latency_counts_queueing_from_the_intended_time() {
    // The target serves 200 requests/s. Closed loop at QD 1: every request takes its 5 ms.
    let closed = slow_run(Pace::Closed, 1);
    let p50_ms = closed.latency_ns.value_at_quantile(0.5) as f64 / 1e6;
    assert!((4.5..15.0).contains(&p50_ms), "closed loop p50 {p50_ms} ms");
    // Below capacity, the open loop sees the service time too.
    let light = slow_run(Pace::Open { rate_iops: 50.0 }, 4);
    let light_p50_ms = light.latency_ns.value_at_quantile(0.5) as f64 / 1e6;
    assert!(light_p50_ms < 15.0, "open loop at 50/s p50 {light_p50_ms} ms");
    assert!((light.iops() - 50.0).abs() < 15.0, "open loop at 50/s ran {} IOPS", light.iops());
    // At twice the capacity requests fall behind their schedule; measured from when they were
    // due, the backlog shows as latency far beyond what 4 outstanding I/Os would suggest (20 ms).
    let overload = slow_run(Pace::Open { rate_iops: 400.0 }, 4);
    let p99_ms = overload.latency_ns.value_at_quantile(0.99) as f64 / 1e6;
    assert!(p99_ms > 100.0, "open loop at 2x capacity: p99 {p99_ms} ms should show the backlog");
    assert!(overload.iops() < 250.0, "the target cannot go faster than 200/s: {}", overload.iops());
}

/// Completes inside `submit`, recording the range it saw.
struct RecordingTarget {
    lowest: AtomicU64,
    highest_end: AtomicU64,
    count: AtomicU64,
}

impl RecordingTarget {
    fn new() -> RecordingTarget {
        RecordingTarget { lowest: AtomicU64::new(u64::MAX), highest_end: AtomicU64::new(0), count: AtomicU64::new(0) }
    }
}

impl Target for RecordingTarget {
    fn describe(&self) -> String {
        "recording".into()
    }
    fn capacity_bytes(&self) -> u64 {
        1 << 30
    }
    fn submit(&self, _write: bool, offset_bytes: u64, buf: IoBuf, done: IoDone) {
        self.lowest.fetch_min(offset_bytes, Ordering::Relaxed);
        self.highest_end.fetch_max(offset_bytes + buf.len() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        done(Ok(()), buf);
    }
}

/// Counts the requests it takes and the flushes between points, and records the request count
/// at each flush.
#[derive(Default)]
struct SettlingTarget {
    requests: AtomicU64,
    requests_at_settle: Mutex<Vec<u64>>,
}

impl Target for SettlingTarget {
    fn describe(&self) -> String {
        "settling".into()
    }
    fn capacity_bytes(&self) -> u64 {
        1 << 30
    }
    fn submit(&self, _write: bool, _offset_bytes: u64, buf: IoBuf, done: IoDone) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        done(Ok(()), buf);
    }
    fn settle(&self) -> Result<(), String> {
        self.requests_at_settle.lock().unwrap().push(self.requests.load(Ordering::Relaxed));
        Ok(())
    }
}

/// The target is flushed after every point, once its workers are done, so the next point does
/// not pay for the writes of this one.
#[test]
fn the_target_is_settled_after_each_point() {
    let target = Arc::new(SettlingTarget::default());
    let info = TargetInfo { kind: "test".into(), capacity_bytes: target.capacity_bytes(), ..TargetInfo::default() };
    let open = OpenTarget::shared(Arc::clone(&target) as Arc<dyn Target>, info);
    let settings = RunSettings {
        duration: Duration::from_millis(30),
        ramp: Duration::ZERO,
        seed: 1,
        verify: false,
        sweep: SweepOptions { workers: Some(vec![1, 2, 3]), queue_depths: Some(vec![1]), ..SweepOptions::default() },
        pace: Pace::Closed,
    };
    let result = Runner::new(&open, settings).run_pattern(patterns::find("review-multithreaded-write").unwrap(), &mut Quiet);
    assert_eq!(result.points.len(), 3);
    let at_settle = target.requests_at_settle.lock().unwrap().clone();
    assert_eq!(at_settle.len(), 3, "one flush per point: {at_settle:?}");
    assert!(at_settle.windows(2).all(|w| w[0] < w[1]) && at_settle[0] > 0, "each after its point's requests: {at_settle:?}");
    assert_eq!(*at_settle.last().unwrap(), target.requests.load(Ordering::Relaxed), "the last after the last request");
}

#[test]
fn workers_stay_in_their_zones_and_a_target_that_completes_in_submit_does_not_recurse() {
    let zones = crate::runner::zones(patterns::ZoneRule::Slices, 3, 30 * MIB, 64 * KIB).unwrap();
    let targets: Vec<Arc<RecordingTarget>> = (0..3).map(|_| Arc::new(RecordingTarget::new())).collect();
    let lines = vec![AccessLine { align_bytes: 512, ..AccessLine::whole(64 * KIB, 50, 50) }];
    let jobs: Vec<Job> = zones
        .iter()
        .zip(&targets)
        .map(|((zone, _), target)| job(Arc::clone(target) as Arc<dyn Target>, lines.clone(), 4, zone.clone()))
        .collect();
    let measured = run_jobs(&jobs, &options(100, Pace::Closed, None));
    assert!(measured.ops > 1000, "a synchronous target runs at full speed: {} ops", measured.ops);
    for ((zone, _), target) in zones.iter().zip(&targets) {
        assert!(target.lowest.load(Ordering::Relaxed) >= zone.start, "worker left {zone:?} downwards");
        assert!(target.highest_end.load(Ordering::Relaxed) <= zone.end, "worker left {zone:?} upwards");
        assert!(target.count.load(Ordering::Relaxed) > 0);
    }
}

/// A RAID5 of three memory drives behind fault injection, in an engine of its own.
fn raid5(faults: Faults) -> (OpenTarget, Vec<Arc<FaultyDrive>>) {
    let members: Vec<Arc<FaultyDrive>> = (0..3).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(64 * MIB))))).collect();
    members[0].set_faults(faults);
    let drives: Vec<Arc<dyn Drive>> = members.iter().map(|m| Arc::clone(m) as Arc<dyn Drive>).collect();
    let layout = VdLayout { level: Level::Raid5, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(0, "v", layout, drives).unwrap());
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    let target = Arc::new(VdTarget { engine, vd });
    let info = TargetInfo { kind: "vd".into(), capacity_bytes: target.capacity_bytes(), ..TargetInfo::default() };
    (OpenTarget::shared(target, info), members)
}

/// Every read of the member returns flipped bytes.
fn corrupting_every_read() -> Faults {
    let mut faults = Faults::default();
    faults.corrupt_read_ranges.push(0..u64::MAX);
    faults
}

fn mixed_verify_run(target: &OpenTarget) -> PointMeasurement {
    // A small zone, so that reads soon land on sectors this run wrote; block sizes that do not
    // line up with each other, so that reads check sectors of several writes.
    let lines = vec![
        AccessLine { block_bytes: 4 * KIB, share_percent: 50, read_percent: 50, random_percent: 100, align_bytes: 512 },
        AccessLine { block_bytes: 512, share_percent: 30, read_percent: 50, random_percent: 100, align_bytes: 512 },
        AccessLine { block_bytes: 64 * KIB, share_percent: 20, read_percent: 50, random_percent: 0, align_bytes: 64 * KIB },
    ];
    let worker = target.worker_target(0, 0, 16, &AccessSpec::new(lines.clone()).unwrap(), true).unwrap();
    let verifier = Some(Arc::new(Verifier::new()));
    run_jobs(&[job(worker, lines, 16, 0..2 * MIB)], &options(400, Pace::Closed, verifier))
}

#[test]
fn verify_passes_on_a_healthy_vd_and_catches_a_corrupting_member() {
    let (healthy, _) = raid5(Faults::default());
    let measured = mixed_verify_run(&healthy);
    let verify = measured.verify.expect("verifying");
    assert_eq!(measured.errors, 0, "{:?}", measured.first_error);
    assert!(verify.checked_sectors > 1000, "reads must check written sectors: {verify:?}");
    assert_eq!(verify.mismatched_sectors, 0, "{:?}", verify.first_mismatches);

    let (corrupting, _) = raid5(corrupting_every_read());
    let verify = mixed_verify_run(&corrupting).verify.expect("verifying");
    assert!(verify.mismatched_sectors > 0, "flipped bytes must be caught: {verify:?}");
    assert!(!verify.first_mismatches.is_empty());
}

#[test]
fn a_run_with_mismatches_fails_and_says_where() {
    let (target, _) = raid5(corrupting_every_read());
    let settings = RunSettings {
        duration: Duration::from_millis(100),
        ramp: Duration::ZERO,
        seed: 1,
        verify: true,
        sweep: SweepOptions { quick: true, queue_depths: Some(vec![8]), ..SweepOptions::default() },
        pace: Pace::Closed,
    };
    let mut runner = Runner::new(&target, settings);
    // Writes first, then reads of the same area: a verify run reads what it wrote.
    let write = runner.run_pattern(patterns::find("review-multithreaded-write").unwrap(), &mut Quiet);
    let read = runner.run_pattern(patterns::find("review-multithreaded-read").unwrap(), &mut Quiet);
    let results = Results { patterns: vec![write, read], ..Results::default() };
    let failure = results.failure().expect("mismatches fail the run");
    assert!(failure.starts_with("VERIFY FAILED"), "{failure}");
    assert!(!results.first_mismatches(3).is_empty());
}

#[test]
fn nbd_target_measures_and_verifies_against_nbdkit() {
    let nbdkit = Nbdkit::start(&["memory", "size=256M"]);
    let target = OpenTarget::open(&TargetSpec::parse(&nbdkit.uri()).unwrap(), OpenOptions::default()).unwrap();
    assert_eq!(target.capacity_bytes(), 256 * MIB);
    assert_eq!(target.info().kind, "nbd");
    let settings = RunSettings {
        duration: Duration::from_millis(100),
        ramp: Duration::ZERO,
        seed: 3,
        verify: true,
        sweep: SweepOptions { quick: true, ..SweepOptions::default() },
        pace: Pace::Closed,
    };
    let mut runner = Runner::new(&target, settings);
    // QD 256 needs two connections per worker; the file server mixes eight block sizes.
    for name in ["review-database", "file-server", "review-multithreaded-write", "review-multithreaded-read"] {
        let result = runner.run_pattern(patterns::find(name).unwrap(), &mut Quiet);
        for point in &result.points {
            assert_eq!(point.errors, 0, "{name} {:?}: {:?}", point.coordinates, point.first_error);
            assert!(point.ops > 0, "{name} {:?} did nothing", point.coordinates);
            let verify = point.verify.as_ref().unwrap();
            assert_eq!(verify.mismatched_sectors, 0, "{name}: {:?}", verify.first_mismatches);
        }
        let checked: u64 = result.points.iter().map(|p| p.verify.as_ref().unwrap().checked_sectors).sum();
        assert!(name.ends_with("-write") || checked > 0, "{name}: reads checked nothing");
    }
}

#[test]
fn nbd_requests_above_the_server_maximum_are_split() {
    let nbdkit = Nbdkit::start(&["memory", "size=256M"]);
    let target = OpenTarget::open(&TargetSpec::parse(&nbdkit.uri()).unwrap(), OpenOptions::default()).unwrap();
    let block = 40 * MIB;
    let lines = vec![AccessLine::whole(block, 50, 0)];
    let worker = target.worker_target(0, 0, 2, &AccessSpec::new(lines.clone()).unwrap(), true).unwrap();
    let verifier = Some(Arc::new(Verifier::new()));
    let measured = run_jobs(&[job(worker, lines, 2, 0..200 * MIB)], &options(500, Pace::Closed, verifier));
    assert_eq!(measured.errors, 0, "{:?}", measured.first_error);
    assert!(measured.ops > 0);
    let verify = measured.verify.unwrap();
    assert_eq!(verify.mismatched_sectors, 0, "{:?}", verify.first_mismatches);
}

#[test]
fn verify_catches_an_nbd_server_that_drops_writes() {
    // nbdkit's null plugin accepts writes and reads back zeros: every written sector is lost.
    let nbdkit = Nbdkit::start(&["null", "size=64M"]);
    let target = OpenTarget::open(&TargetSpec::parse(&nbdkit.uri()).unwrap(), OpenOptions::default()).unwrap();
    let lines = vec![AccessLine::whole(4096, 50, 100)];
    let worker = target.worker_target(0, 0, 4, &AccessSpec::new(lines.clone()).unwrap(), true).unwrap();
    let verifier = Some(Arc::new(Verifier::new()));
    let measured = run_jobs(&[job(worker, lines, 4, 0..MIB)], &options(200, Pace::Closed, verifier));
    let verify = measured.verify.unwrap();
    assert!(verify.mismatched_sectors > 0, "{verify:?}");
    assert!(matches!(verify.first_mismatches[0].kind, crate::verify::MismatchKind::NoHeader { all_zero: true }));
}

#[test]
fn results_round_trip_through_json_and_flatten_to_csv() {
    let (target, _) = raid5(Faults::default());
    let settings = RunSettings {
        duration: Duration::from_millis(50),
        ramp: Duration::ZERO,
        seed: 1,
        verify: false,
        sweep: SweepOptions { quick: true, ..SweepOptions::default() },
        pace: Pace::Closed,
    };
    let mut runner = Runner::new(&target, settings);
    let database = runner.run_pattern(patterns::find("review-database").unwrap(), &mut Quiet);
    let hba = runner.run_pattern(patterns::find("hba-iops").unwrap(), &mut Quiet);
    let results = Results { schema_version: 1, patterns: vec![database, hba], ..Results::default() };
    let json = serde_json::to_string(&results).unwrap();
    let back: Results = serde_json::from_str(&json).unwrap();
    assert_eq!(back.patterns[0].points.len(), 9);
    assert_eq!(back.patterns[0].points[4].coordinates["write_percent"], 50);
    let csv = results.to_csv();
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("pattern,queue_depth,write_percent,workers,total_queue_depth,iops,mb_per_s"), "{header}");
    assert_eq!(lines.count(), 10);
    assert!(csv.lines().last().unwrap().starts_with("hba-iops,,,8,512,"), "{csv}");
    assert_eq!(results.failure(), None);
}

/// Open loop over NBD: a request the pacer issues while another is in flight must go out at
/// once, not when the next reply wakes the connection's thread. nbdkit delays every read by
/// 10 ms; at 150 requests/s a new one is due every 6.7 ms, while the one before is still out.
/// Were it held until that reply, the median would be about 13 ms.
#[test]
fn open_loop_requests_over_nbd_go_out_while_replies_are_due() {
    let nbdkit = Nbdkit::start(&["--threads", "16", "--filter=delay", "memory", "size=64M", "rdelay=10ms"]);
    let target = OpenTarget::open(&TargetSpec::parse(&nbdkit.uri()).unwrap(), OpenOptions::default()).unwrap();
    let lines = vec![AccessLine::whole(4096, 100, 100)];
    let worker = target.worker_target(0, 0, 4, &AccessSpec::new(lines.clone()).unwrap(), true).unwrap();
    let measured = run_jobs(&[job(worker, lines, 4, 0..64 * MIB)], &options(2000, Pace::Open { rate_iops: 150.0 }, None));
    assert_eq!(measured.errors, 0, "{:?}", measured.first_error);
    let p50_ms = measured.latency_ns.value_at_quantile(0.5) as f64 / 1e6;
    eprintln!("open loop at 150/s against a 10 ms server: p50 {p50_ms:.2} ms, {:.0} IOPS", measured.iops());
    assert!((9.9..12.0).contains(&p50_ms), "p50 {p50_ms:.2} ms: requests waited for a reply before going out");
}

/// Reads `len` bytes at `offset_bytes` of `target`, waiting for them.
fn read_back(target: &dyn Target, offset_bytes: u64, len: usize) -> Vec<u8> {
    let (sender, receiver) = mpsc::channel();
    target.submit(false, offset_bytes, IoBuf::zeroed(len), Box::new(move |result, buf| sender.send((result, buf)).unwrap()));
    let (result, buf) = receiver.recv().unwrap();
    result.unwrap();
    buf.as_slice().to_vec()
}

/// A `set:` gives its workers disks as IOMeter does (each worker keeps its queue depth on each
/// of its disks), every disk gets work, and `--verify` tells apart the sectors of two disks at
/// the same offset: the writers of disks 0 and 2 (one worker) start at the same offset.
#[test]
fn a_set_spreads_workers_over_its_disks_and_verifies_each_disk() {
    for text in ["set:4:raw:mem:16MiB", "set:4:vd:jbod:1xmem:16MiB"] {
        let target = OpenTarget::open(&TargetSpec::parse(text).unwrap(), OpenOptions { shards: Some(2), writes: true }).unwrap();
        assert_eq!(target.disk_count(), 4, "{text}");
        assert_eq!(target.capacity_bytes(), 4 * target.disk_capacity_bytes(), "{text}");
        assert_eq!(target.info().disk_count, Some(4));
        assert_eq!(target.info().drives.len(), 4, "{text}: every disk's drive is described");
        let settings = RunSettings {
            duration: Duration::from_millis(150),
            ramp: Duration::ZERO,
            seed: 5,
            verify: true,
            sweep: SweepOptions { quick: true, workers: Some(vec![2]), ..SweepOptions::default() },
            pace: Pace::Closed,
        };
        let mut runner = Runner::new(&target, settings);
        let write = runner.run_pattern(patterns::find("review-multithreaded-write").unwrap(), &mut Quiet);
        let read = runner.run_pattern(patterns::find("hba-iops").unwrap(), &mut Quiet);
        let point = &read.points[0];
        assert_eq!((point.workers, point.total_queue_depth), (2, 4 * 64), "{text}: two workers, two disks each, QD 64 on each");
        for point in write.points.iter().chain(&read.points) {
            assert_eq!(point.errors, 0, "{text}: {:?}", point.first_error);
            let verify = point.verify.as_ref().unwrap();
            assert_eq!(verify.mismatched_sectors, 0, "{text}: {:?}", verify.first_mismatches);
        }
        assert!(point.verify.as_ref().unwrap().checked_sectors > 0, "{text}: the reads checked what the writes left");
        for disk in 0..4 {
            let worker = target.worker_target(0, disk, 1, &AccessSpec::new(vec![AccessLine::whole(4096, 100, 0)]).unwrap(), true).unwrap();
            let first = read_back(worker.as_ref(), 0, 4096);
            assert!(first.iter().any(|&b| b != 0), "{text}: disk {disk} was never written");
        }
    }
}

#[test]
fn filled_file_drives_are_written_whole_once_kept_and_locked_while_in_use() {
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir().join(format!("storc-bench-filled-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = TargetSpec::parse(&format!("vd:r5:3xfile:{}:8MiB,filled", dir.display())).unwrap();
    let kept = |member: usize| dir.join(format!("storc-bench-filled-{member}-{}.img", 8 << 20));
    let target = OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).unwrap();
    for member in 0..3 {
        let meta = std::fs::metadata(kept(member)).unwrap();
        assert!(meta.blocks() * 512 >= 8 << 20, "member {member}'s file has every block: {} blocks", meta.blocks());
    }
    let second =
        OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).err().expect("a second run on the same files is refused");
    assert!(second.contains("in use by another storc bench"), "{second}");
    drop(target);
    assert!((0..3).all(|member| kept(member).exists()), "the files stay after the run");
    // A file made anew has a new birth time (an inode number could be reused).
    let born = |member: usize| std::fs::metadata(kept(member)).unwrap().created().expect("the filesystem records birth times");
    let whole_born = born(0);
    // A file left half written (a run stopped while writing it) is written again.
    std::fs::OpenOptions::new().write(true).open(kept(1)).unwrap().set_len(1 << 20).unwrap();
    let again = OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).unwrap();
    drop(again);
    assert!(std::fs::metadata(kept(1)).unwrap().blocks() * 512 >= 8 << 20, "the cut file was written whole again");
    assert_eq!(born(0), whole_born, "a whole kept file is used again, not made anew");
    std::fs::remove_dir_all(&dir).unwrap();
}
