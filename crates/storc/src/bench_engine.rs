//! `storc bench engine`: RAID levels over N drives next to the same drives driven raw, in one
//! run, so that the ratio says what the RAID layer costs on this machine today.

use crate::report::table;
use bench::target::{RawDriveTarget, Target, VdTarget};
use bench::workload::{self, Access, Measurement, RunConfig, Worker};
use drive::{Drive, FileDrive, FileDriveConfig, MemDrive};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, SpanKind, KIB, MIB};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// RAID levels to measure, comma-separated (r0, r1, r1e, r5, r6, r10, r50, r60, jbod).
    #[arg(long, default_value = "r0,r5", value_delimiter = ',')]
    levels: Vec<String>,
    /// Member drives.
    #[arg(long, default_value_t = 8)]
    drives: usize,
    /// `mem` for memory drives, `file` for files in --dir (O_DIRECT through io_uring).
    #[arg(long, default_value = "mem")]
    drive_kind: String,
    /// Directory for file drives (created and removed by the run).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Size of each drive, e.g. 1GiB.
    #[arg(long, default_value = "1GiB")]
    drive_size: String,
    /// Bytes of each drive the workloads touch (after the metadata reserve), e.g. 256MiB.
    #[arg(long, default_value = "256MiB")]
    zone: String,
    #[arg(long, default_value_t = 64)]
    strip_kib: u64,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of ramp-up per point, excluded.
    #[arg(long, default_value_t = 1.0)]
    ramp: f64,
    /// Total outstanding I/Os for the 1 MiB sequential patterns. Memory drives are sensitive to
    /// the cache footprint of the buffers in flight (QD x 1 MiB): raw drives slow down too as it
    /// grows, so the default keeps one per drive of the default 8.
    #[arg(long, default_value_t = 8)]
    seq_qd: usize,
    /// Total outstanding I/Os for the 4 KiB random patterns.
    #[arg(long, default_value_t = 64)]
    rand_qd: usize,
    /// Engine shards (default: one per core).
    #[arg(long)]
    shards: Option<usize>,
    /// Also run fio on the same files with the same total queue depth (file drives only).
    #[arg(long)]
    fio: bool,
    /// Rounds; targets alternate within each round and the median round is reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(long)]
    json: bool,
}

/// One benchmark pattern: an access line and its total queue depth.
struct Pattern {
    name: String,
    access: Access,
    queue_depth: usize,
}

fn patterns(args: &Args) -> Vec<Pattern> {
    let line = |name: &str, block_bytes, read_percent, random_percent, queue_depth| Pattern {
        name: name.to_string(),
        access: Access { block_bytes, read_percent, random_percent },
        queue_depth,
    };
    vec![
        line("seq-read-1m", MIB, 100, 0, args.seq_qd),
        line("seq-write-1m", MIB, 0, 0, args.seq_qd),
        line("rand-read-4k", 4 * KIB, 100, 100, args.rand_qd),
        line("rand-write-4k", 4 * KIB, 0, 100, args.rand_qd),
    ]
}

/// One target under one pattern, summarised over the rounds of the run.
struct Point {
    pattern: String,
    target: String,
    block_bytes: u64,
    /// The round with the median MB/s.
    measurement: Measurement,
    /// Medians over rounds of this round's MB/s divided by the baseline's in the same round.
    vs_raw: Option<f64>,
    vs_fio: Option<f64>,
    vs_first_level: Option<f64>,
}

/// MB/s of every target in every round, in the order measured.
#[derive(Default)]
struct Rounds {
    samples: Vec<(String, String, u64, Vec<Measurement>)>,
}

impl Rounds {
    fn add(&mut self, pattern: &str, target: &str, block_bytes: u64, measurement: Measurement) {
        match self.samples.iter_mut().find(|(p, t, _, _)| p == pattern && t == target) {
            Some((_, _, _, list)) => list.push(measurement),
            None => self.samples.push((pattern.to_string(), target.to_string(), block_bytes, vec![measurement])),
        }
    }

    fn mb_per_sec(&self, pattern: &str, target: &str) -> Option<Vec<f64>> {
        self.samples
            .iter()
            .find(|(p, t, _, _)| p == pattern && t == target)
            .map(|(_, _, _, list)| list.iter().map(Measurement::mb_per_sec).collect())
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// Median over rounds of `a[i] / b[i]`.
fn median_ratio(a: &[f64], b: Option<Vec<f64>>) -> Option<f64> {
    let b = b?;
    Some(median(a.iter().zip(&b).map(|(x, y)| x / y).collect()))
}

struct Setup {
    engine: Arc<Engine>,
    drives: Vec<Arc<dyn Drive>>,
    files: Vec<PathBuf>,
    zone_bytes: u64,
    config: RunConfig,
}

pub fn run(args: &Args) -> Result<(), String> {
    let levels: Vec<Level> = args.levels.iter().map(|l| Level::parse(l).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let setup = setup(args)?;
    let result = measure_all(args, &setup, &levels);
    for file in &setup.files {
        let _ = std::fs::remove_file(file);
    }
    let points = result?;
    print_points(args, &setup, &points);
    Ok(())
}

fn setup(args: &Args) -> Result<Setup, String> {
    let drive_bytes = drive::parse_size_bytes(&args.drive_size).map_err(|e| format!("--drive-size: {e}"))?;
    let zone_bytes = drive::parse_size_bytes(&args.zone).map_err(|e| format!("--zone: {e}"))?;
    if zone_bytes < MIB || zone_bytes + MEMBER_RESERVED_BYTES > drive_bytes {
        return Err(format!(
            "--zone {} must be at least 1 MiB and fit in --drive-size {} after the 4 MiB metadata reserve",
            args.zone, args.drive_size
        ));
    }
    if args.drives == 0 || args.drives > 32 {
        return Err(format!("--drives {} is not allowed; allowed: 1 to 32", args.drives));
    }
    let (drives, files) = make_drives(args, drive_bytes)?;
    let shard_count = args.shards.unwrap_or_else(|| EngineConfig::default().shard_count);
    let engine = Engine::start(EngineConfig { shard_count, ..EngineConfig::default() }).map_err(|e| e.to_string())?;
    let config = RunConfig { ramp: Duration::from_secs_f64(args.ramp), duration: Duration::from_secs_f64(args.duration), seed: 1 };
    let setup = Setup { engine: Arc::new(engine), drives, files, zone_bytes, config };
    precondition(&setup);
    Ok(setup)
}

/// The member drives, and the files made for them (removed at the end).
type MadeDrives = (Vec<Arc<dyn Drive>>, Vec<PathBuf>);

fn make_drives(args: &Args, drive_bytes: u64) -> Result<MadeDrives, String> {
    match args.drive_kind.as_str() {
        "mem" => Ok(((0..args.drives).map(|_| Arc::new(MemDrive::new(drive_bytes)) as Arc<dyn Drive>).collect(), Vec::new())),
        "file" => {
            let mut drives = Vec::new();
            let mut files = Vec::new();
            for i in 0..args.drives {
                let path = args.dir.join(format!("storc-bench-{}-{i}", std::process::id()));
                let config = FileDriveConfig { create_size_bytes: Some(drive_bytes), ..Default::default() };
                files.push(path.clone());
                drives.push(Arc::new(FileDrive::open(&path, &config).map_err(|e| e.to_string())?) as Arc<dyn Drive>);
            }
            Ok((drives, files))
        }
        other => Err(format!("--drive-kind {other:?} is not allowed; allowed: mem, file")),
    }
}

/// Writes every drive's zone once so that reads hit written data and memory drives have their
/// pages, the same for every target measured afterwards.
fn precondition(setup: &Setup) {
    let workers = raw_workers(setup, Access { block_bytes: MIB, read_percent: 0, random_percent: 0 }, setup.drives.len() * 4);
    let per_drive_mb = setup.zone_bytes as f64 / 1e6;
    // Sequential writes at a conservative 200 MB/s per drive cover the zone in this time.
    let seconds = (per_drive_mb / 200.0).max(0.5);
    workload::run(&workers, RunConfig { ramp: Duration::ZERO, duration: Duration::from_secs_f64(seconds), seed: 7 });
}

/// One worker per drive sharing `queue_depth` out exactly (the first drives take the remainder),
/// so that the raw baseline never has more I/O outstanding than the VD it is compared with.
fn raw_workers(setup: &Setup, access: Access, queue_depth: usize) -> Vec<Worker> {
    let drive_count = setup.drives.len();
    setup
        .drives
        .iter()
        .enumerate()
        .map(|(i, drive)| (i, drive, queue_depth / drive_count + usize::from(i < queue_depth % drive_count)))
        .filter(|(_, _, depth)| *depth > 0)
        .map(|(i, drive, depth)| {
            let target: Arc<dyn Target> = Arc::new(RawDriveTarget {
                engine: Arc::clone(&setup.engine),
                drive: Arc::clone(drive),
                shard: i,
                data_offset_bytes: MEMBER_RESERVED_BYTES,
            });
            Worker { target, access, queue_depth: depth, zone: 0..setup.zone_bytes }
        })
        .collect()
}

fn vd_worker(setup: &Setup, vd: &Arc<VirtualDrive>, access: Access, queue_depth: usize) -> Worker {
    // The VD range that lies on the same member bytes as the raw zone.
    let geometry = vd.geometry();
    let member_data_bytes = geometry.member_used_bytes() - geometry.data_offset_bytes();
    let fraction = (setup.zone_bytes as f64 / member_data_bytes as f64).min(1.0);
    let zone_bytes = ((vd.capacity_bytes() as f64 * fraction) as u64 / MIB * MIB).max(access.block_bytes);
    let target: Arc<dyn Target> = Arc::new(VdTarget { engine: Arc::clone(&setup.engine), vd: Arc::clone(vd) });
    Worker { target, access, queue_depth, zone: 0..zone_bytes.min(vd.capacity_bytes()) }
}

const RAW: &str = "raw drives";
const FIO: &str = "fio on the same files";

fn make_vds(args: &Args, setup: &Setup, levels: &[Level]) -> Result<Vec<Arc<VirtualDrive>>, String> {
    let mut vds = Vec::new();
    for (i, level) in levels.iter().enumerate() {
        let layout = VdLayout { level: *level, strip_size_bytes: args.strip_kib * KIB, drives_per_span: None, member_size_bytes: None };
        let members = setup.drives[..member_count(*level, setup.drives.len())].to_vec();
        let vd = VirtualDrive::new(i as u64, &format!("v{i}"), layout, members).map_err(|e| format!("{level}: {e}"))?;
        vds.push(Arc::new(vd));
    }
    Ok(vds)
}

/// How many of the drives a level uses: RAID1 takes two, JBOD one, the others all of them.
fn member_count(level: Level, drive_count: usize) -> usize {
    match level {
        Level::Raid1 => 2.min(drive_count),
        Level::Jbod => 1,
        _ => drive_count,
    }
}

/// Measures every target once per round, alternating, so that drift in the machine hits all
/// targets alike; then summarises each target by its median round.
fn measure_all(args: &Args, setup: &Setup, levels: &[Level]) -> Result<Vec<Point>, String> {
    let vds = make_vds(args, setup, levels)?;
    let use_fio = args.fio && args.drive_kind == "file";
    if args.fio && !use_fio {
        return Err("--fio needs --drive-kind file".to_string());
    }
    let mut rounds = Rounds::default();
    for pattern in patterns(args) {
        for _ in 0..args.repeat.max(1) {
            measure_round(setup, &vds, &pattern, use_fio, &mut rounds)?;
        }
    }
    Ok(summarise(rounds, &vds))
}

fn measure_round(setup: &Setup, vds: &[Arc<VirtualDrive>], pattern: &Pattern, use_fio: bool, rounds: &mut Rounds) -> Result<(), String> {
    let block = pattern.access.block_bytes;
    let raw = workload::run(&raw_workers(setup, pattern.access, pattern.queue_depth), setup.config);
    rounds.add(&pattern.name, RAW, block, raw);
    if use_fio {
        let fio_mb = fio_baseline(setup, pattern)?;
        let elapsed = setup.config.duration;
        let bytes = (fio_mb * 1e6 * elapsed.as_secs_f64()) as u64;
        let fio = Measurement {
            ops: bytes / block,
            bytes,
            errors: 0,
            elapsed,
            latency_ns: bench::workload::latency_histogram(),
            first_error: None,
        };
        rounds.add(&pattern.name, FIO, block, fio);
    }
    for vd in vds {
        let measurement = workload::run(&[vd_worker(setup, vd, pattern.access, pattern.queue_depth)], setup.config);
        rounds.add(&pattern.name, &describe(vd), block, measurement);
    }
    if pattern.name == "seq-write-1m" {
        for vd in vds.iter().filter(|vd| matches!(vd.geometry().span_kind(), SpanKind::Parity | SpanKind::DoubleParity)) {
            // Whole rows per request: the full-stripe write path, no reads.
            let row_bytes = vd.geometry().row_data_bytes();
            let access = Access { block_bytes: row_bytes * (MIB / row_bytes).max(1), ..pattern.access };
            let measurement = workload::run(&[vd_worker(setup, vd, access, pattern.queue_depth)], setup.config);
            rounds.add("full-stripe-write", &describe(vd), access.block_bytes, measurement);
        }
    }
    Ok(())
}

fn summarise(rounds: Rounds, vds: &[Arc<VirtualDrive>]) -> Vec<Point> {
    let first_level = vds.first().map(|vd| describe(vd));
    let mut points = Vec::new();
    for (pattern, target, block_bytes, _) in &rounds.samples {
        let mb = rounds.mb_per_sec(pattern, target).expect("listed");
        let baseline_pattern = if pattern == "full-stripe-write" { "seq-write-1m" } else { pattern.as_str() };
        let is_vd = target != RAW && target != FIO;
        let vs_raw = if target == FIO { None } else { median_ratio(&mb, rounds.mb_per_sec(baseline_pattern, RAW)) };
        let vs_raw = vs_raw.filter(|_| target != RAW);
        let vs_fio = median_ratio(&mb, rounds.mb_per_sec(baseline_pattern, FIO)).filter(|_| target != FIO);
        let vs_first_level = first_level
            .as_ref()
            .filter(|first| is_vd && (*first != target || pattern != baseline_pattern))
            .and_then(|first| median_ratio(&mb, rounds.mb_per_sec(baseline_pattern, first)));
        let median_mb = median(mb.clone());
        let list = &rounds.samples.iter().find(|(p, t, _, _)| p == pattern && t == target).expect("listed").3;
        let chosen = list.iter().find(|m| m.mb_per_sec() == median_mb).expect("median is a sample");
        points.push(Point {
            pattern: pattern.clone(),
            target: target.clone(),
            block_bytes: *block_bytes,
            measurement: clone_measurement(chosen),
            vs_raw,
            vs_fio,
            vs_first_level,
        });
    }
    points
}

fn describe(vd: &VirtualDrive) -> String {
    let g = vd.geometry();
    format!("{} {}x strip {}K", g.level(), g.drive_count(), g.strip_size_bytes() / KIB)
}

fn clone_measurement(m: &Measurement) -> Measurement {
    Measurement {
        ops: m.ops,
        bytes: m.bytes,
        errors: m.errors,
        elapsed: m.elapsed,
        latency_ns: m.latency_ns.clone(),
        first_error: m.first_error.clone(),
    }
}

/// fio on the same files, one job per file, the same total queue depth, io_uring and O_DIRECT.
fn fio_baseline(setup: &Setup, pattern: &Pattern) -> Result<f64, String> {
    let access = pattern.access;
    let rw = match (access.read_percent, access.random_percent) {
        (100, 0) => "read",
        (0, 0) => "write",
        (100, _) => "randread",
        _ => "randwrite",
    };
    let per_file_qd = (pattern.queue_depth / setup.files.len()).max(1);
    let mut command = std::process::Command::new("fio");
    command.args([
        "--output-format=json",
        "--ioengine=io_uring",
        "--direct=1",
        "--time_based",
        "--group_reporting",
        &format!("--runtime={}", setup.config.duration.as_secs_f64()),
        &format!("--ramp_time={}", setup.config.ramp.as_secs_f64()),
        &format!("--rw={rw}"),
        &format!("--bs={}", access.block_bytes),
        &format!("--iodepth={per_file_qd}"),
        &format!("--offset={MEMBER_RESERVED_BYTES}"),
        &format!("--size={}", setup.zone_bytes),
    ]);
    for (i, file) in setup.files.iter().enumerate() {
        command.arg(format!("--name=d{i}")).arg(format!("--filename={}", file.display()));
    }
    let output = command.output().map_err(|e| format!("cannot run fio ({e}); install it with: apt-get install -y fio"))?;
    if !output.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| format!("fio output is not JSON: {e}"))?;
    let job = &json["jobs"][0];
    let side = if access.read_percent == 100 { "read" } else { "write" };
    job[side]["bw_bytes"].as_f64().map(|b| b / 1e6).ok_or_else(|| "fio JSON has no bw_bytes".to_string())
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".into())
}

fn print_points(args: &Args, setup: &Setup, points: &[Point]) {
    if args.json {
        let rows: Vec<serde_json::Value> = points
            .iter()
            .map(|p| {
                serde_json::json!({
                    "pattern": p.pattern, "target": p.target, "block_bytes": p.block_bytes,
                    "mb_per_sec": p.measurement.mb_per_sec(), "iops": p.measurement.iops(),
                    "latency_us_mean": p.measurement.mean_latency_us(),
                    "latency_us_p99": p.measurement.latency_ns.value_at_quantile(0.99) as f64 / 1e3,
                    "errors": p.measurement.errors,
                    "ratio_vs_raw": p.vs_raw, "ratio_vs_fio": p.vs_fio, "ratio_vs_first_level": p.vs_first_level,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("JSON of plain values"));
        return;
    }
    println!(
        "storc bench engine: {} {} drives, zone {} MiB each, {} shards, {} round(s) of {:.1} s per point (+{:.1} s ramp), parity kernels {}",
        setup.drives.len(),
        args.drive_kind,
        setup.zone_bytes / MIB,
        setup.engine.shard_count(),
        args.repeat.max(1),
        args.duration,
        args.ramp,
        parity::active_kernel_name()
    );
    println!(
        "ratios are medians over rounds of (this target / the baseline in the same round); full-stripe-write is compared with seq-write-1m"
    );
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let m = &p.measurement;
            vec![
                p.pattern.clone(),
                p.target.clone(),
                format!("{}K", p.block_bytes / KIB),
                format!("{:.0}", m.mb_per_sec()),
                format!("{:.0}", m.iops()),
                format!("{:.0}", m.mean_latency_us()),
                format!("{:.0}", m.latency_ns.value_at_quantile(0.99) as f64 / 1e3),
                format!("{}", m.errors),
                ratio_text(p.vs_raw),
                ratio_text(p.vs_fio),
                ratio_text(p.vs_first_level),
            ]
        })
        .collect();
    let first = format!("vs {}", args.levels.first().map(String::as_str).unwrap_or("-"));
    println!("{}", table(&["pattern", "target", "block", "MB/s", "IOPS", "lat us", "p99 us", "errors", "vs raw", "vs fio", &first], &rows));
}
