//! `storc bench list`, `storc bench run PATTERN` and `storc bench suite NAME`: the reviewers'
//! patterns against a target, with a live progress bar, a table per pattern, and the results as
//! JSON and CSV. The patterns, the targets and the measuring live in the `bench` crate; this is
//! the terminal around them.

use crate::report::table;
use bench::distribution::Distribution;
use bench::open::{OpenOptions, OpenTarget, TargetSpec, TARGET_FORMS};
use bench::patterns::{self, Axis, Pattern, SweepOptions, SUITES};
use bench::progress::Progress;
use bench::results::{Machine, PatternResult, Point, Results, Settings, RESULTS_SCHEMA_VERSION};
use bench::runner::{Observer, RunSettings, Runner, DURATION_DEFAULT, QUICK_DURATION, QUICK_RAMP, RAMP_DEFAULT};
use bench::workload::Pace;
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The text under `storc bench --help`.
pub fn after_help() -> String {
    let suites: Vec<String> = SUITES.iter().map(|s| format!("  {:<14}{}", s.name, s.description)).collect();
    format!(
        "{TARGET_FORMS}\n\nSuites (storc bench suite NAME):\n{}\n\nEach point runs {} s after {} s of ramp-up (--quick: {} s + {} s and a reduced sweep).\n\
         storc bench list shows every pattern with its definition.",
        suites.join("\n"),
        DURATION_DEFAULT.as_secs_f64(),
        RAMP_DEFAULT.as_secs_f64(),
        QUICK_DURATION.as_secs_f64(),
        QUICK_RAMP.as_secs_f64()
    )
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Print the pattern table and the suites as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The pattern (storc bench list shows them all).
    pattern: String,
    #[command(flatten)]
    measure: MeasureArgs,
}

#[derive(clap::Args)]
pub struct SuiteArgs {
    /// review, enterprise, hba, software-raid, classic or all.
    suite: String,
    #[command(flatten)]
    measure: MeasureArgs,
}

/// `storc bench files`: FC-Test-like file sets in a directory (see `bench::files`).
#[derive(clap::Args)]
#[command(after_help = files_after_help())]
pub struct FilesArgs {
    /// The directory the file sets are created in (must exist; a storc-files-PID directory is
    /// made inside it).
    #[arg(long, value_name = "PATH")]
    dir: PathBuf,
    /// Copy Far's destination (must exist and not be inside --dir; ideally another partition)
    /// [default: a sibling storc-files-PID-far directory inside --dir].
    #[arg(long, value_name = "PATH")]
    second_dir: Option<PathBuf>,
    /// Multiplies every set's file count (ISO: its file size). 1 is about 4.9 GB of files.
    #[arg(long, value_name = "FACTOR", default_value_t = bench::files::DEFAULT_SCALE, allow_negative_numbers = true)]
    scale: f64,
    /// Only these sets (e.g. ISO,Windows) [default: all five].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    sets: Vec<String>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Leave the created files in place.
    #[arg(long)]
    keep: bool,
}

fn files_after_help() -> String {
    let sets: Vec<String> = bench::files::FILE_SETS.iter().map(|s| format!("  {:<10}{}", s.name, s.description)).collect();
    format!(
        "File sets at scale 1:\n{}\n\nPhases: Create, Read, Copy Near (within --dir), Copy Far (to --second-dir), in MB/s (10^6 bytes \
         of file data per second).\nThe default --scale {} takes about a minute on a plain disk.\nCache: {}.\n\
         Every file is checked (crc32c) after Read and after each copy; a mismatch exits non-zero.",
        sets.join("\n"),
        bench::files::DEFAULT_SCALE,
        bench::files::CACHE_POLICY
    )
}

/// Test hook: `STORC_BENCH_FILES_CORRUPT=PHASE` (create, read, copy-near, copy-far) flips a byte
/// of the first file of the first set right after PHASE, before it is verified.
const FILES_CORRUPT_ENV: &str = "STORC_BENCH_FILES_CORRUPT";

pub fn files(args: &FilesArgs) -> Result<(), String> {
    use bench::files::{self as fc, Phase};
    let config = fc::FilesConfig {
        dir: args.dir.clone(),
        second_dir: args.second_dir.clone(),
        scale: args.scale,
        keep: args.keep,
        sets: args.sets.clone(),
    };
    let corrupt_after = match std::env::var(FILES_CORRUPT_ENV) {
        Ok(key) => Some(Phase::from_key(&key).ok_or_else(|| format!("{FILES_CORRUPT_ENV}={key}: not a phase"))?),
        Err(_) => None,
    };
    let done = std::cell::Cell::new(false);
    let corrupt = |phase: Phase, _set: &str, files: &[PathBuf]| {
        if Some(phase) == corrupt_after && !done.get() {
            if let Some(first) = files.first() {
                let mut bytes = std::fs::read(first).unwrap_or_default();
                if let Some(b) = bytes.first_mut() {
                    *b ^= 0xff;
                    let _ = std::fs::write(first, &bytes);
                    eprintln!("{FILES_CORRUPT_ENV}: corrupted {}", first.display());
                    done.set(true);
                }
            }
        }
    };
    let hook: Option<fc::Hook> = corrupt_after.map(|_| &corrupt as fc::Hook);
    let results = fc::run(&config, hook, &mut |line| eprintln!("{line}"))?;
    let mut header = vec!["Set", "Files", "MB"];
    header.extend(Phase::ALL.iter().map(|p| p.label()));
    let mut rows: Vec<Vec<String>> = results
        .sets
        .iter()
        .map(|s| {
            let mut row = vec![s.name.clone(), s.files.to_string(), format!("{:.1}", s.bytes as f64 / 1e6)];
            row.extend(s.phases.iter().map(|p| format!("{:.1}", p.mb_per_s)));
            row
        })
        .collect();
    let mut total = vec![
        "Total".to_string(),
        results.sets.iter().map(|s| s.files).sum::<u64>().to_string(),
        format!("{:.1}", results.sets.iter().map(|s| s.bytes).sum::<u64>() as f64 / 1e6),
    ];
    total.extend(results.totals.iter().map(|t| format!("{:.1}", t.mb_per_s)));
    rows.push(total);
    println!(
        "FC-Test-like file benchmark in {} (Copy Far to {}), scale {}, MB/s, all files verified\n{}",
        results.dir.display(),
        results.second_dir.display(),
        results.scale,
        table(&header, &rows)
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).expect("plain data") + "\n";
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct MeasureArgs {
    /// What to measure: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, a file or block
    /// device, or vd:LEVEL:COUNTxDRIVE[:strip=KIB] (e.g. vd:r5:8xhdd:15k:600GiB:strip=64).
    #[arg(long, long_help = TARGET_FORMS)]
    target: String,
    /// Measured seconds per point [default: 2, or 0.2 with --quick].
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of ramp-up per point, excluded from the results [default: 0.5, or 0.05 with --quick].
    #[arg(long)]
    ramp: Option<f64>,
    /// Head every written sector (offset, write number, crc32c) and check every read; exits
    /// non-zero if any sector reads back wrong.
    #[arg(long)]
    verify: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write one CSV row per point to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write a self-contained HTML report (charts and tables, opens offline) to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Queue depths per worker, replacing each pattern's own sweep (e.g. 1,4,32).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    qd: Option<Vec<u64>>,
    /// Block sizes, replacing each pattern's own (every line of its spec), e.g. 4K,1M.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_block_size)]
    block: Option<Vec<u64>>,
    /// Workers per group, replacing each pattern's own sweep (e.g. 2, or 1,2,4).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    workers: Option<Vec<u64>>,
    /// Where random requests fall, replacing each pattern's own (fio's random_distribution):
    /// uniform, zipf:THETA (e.g. zipf:1.1), or zoned:IO/SPACE[:IO/SPACE...] (e.g. zoned:90/10,
    /// 90% of requests to the first 10% of each worker's zone).
    #[arg(long, value_name = "DIST", value_parser = Distribution::parse)]
    distribution: Option<Distribution>,
    /// For CI: short points and each sweep cut to its first, middle and last value.
    #[arg(long)]
    quick: bool,
    /// Open loop: issue this many requests per second over all workers, latency counted from
    /// when each was due. Without it: closed loop.
    #[arg(long, value_name = "IOPS")]
    rate: Option<f64>,
    /// Seed of the request generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Engine shards for vd: and file targets (default: one per core).
    #[arg(long)]
    shards: Option<usize>,
    /// Allow patterns that write to a block device target (its data is destroyed).
    #[arg(long)]
    overwrite_device: bool,
}

pub fn list(args: &ListArgs) -> Result<(), String> {
    let defaults = SweepOptions::default();
    if args.json {
        let listing = serde_json::json!({
            "patterns": patterns::PATTERNS.iter().map(|p| {
                let mut definition = serde_json::to_value(definition(p, &defaults)).expect("plain data");
                definition["point_count"] = p.points(&defaults).len().into();
                definition
            }).collect::<Vec<_>>(),
            "suites": SUITES.iter().map(|s| serde_json::json!({
                "name": s.name,
                "description": s.description,
                "patterns": s.members().iter().map(|p| p.name).collect::<Vec<_>>(),
                "point_count": suite_points(s.members().as_slice(), &defaults),
            })).collect::<Vec<_>>(),
        });
        return print_all(serde_json::to_string_pretty(&listing).expect("plain data") + "\n");
    }
    let mut out: String = patterns::PATTERNS.iter().map(|p| describe_pattern(p, &defaults) + "\n").collect();
    let default_settings = settings_for(false, None, None);
    out += "Suites (storc bench suite NAME --target T):\n";
    for suite in SUITES {
        let points = suite_points(&suite.members(), &defaults);
        let estimate = default_settings.estimate(points);
        out += &format!(
            "  {:<14}{points:>4} points, about {} at the default 2 s + 0.5 s per point: {}\n",
            suite.name,
            minutes(estimate),
            suite.description
        );
    }
    print_all(out)
}

/// Prints to stdout; a reader that went away (`| head`) is not an error.
fn print_all(text: String) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// A pattern as `storc bench list` prints it.
fn describe_pattern(pattern: &Pattern, sweep: &SweepOptions) -> String {
    let mut out =
        format!("{}  ({}; {} points)\n  {}\n", pattern.name, pattern.source.text(), pattern.points(sweep).len(), pattern.description);
    for group in pattern.groups {
        let lines: Vec<String> = group
            .lines
            .iter()
            .map(|l| format!("{} {}% r{} rnd{}", size_text(l.block_bytes), l.share_percent, l.read_percent, l.random_percent))
            .collect();
        let skew = match group.distribution {
            "uniform" => String::new(),
            distribution => format!(", random offsets {distribution}"),
        };
        out += &format!("  workers: {} x QD {}, {}{skew}; {}\n", group.workers, group.queue_depth, group.zone.text(), lines.join(", "));
    }
    for (axis, values) in pattern.axes(sweep) {
        let values: Vec<String> = values.iter().map(|&v| axis_value_text(axis, v)).collect();
        out += &format!("  sweep {}: {}\n", axis.name(), values.join(" "));
    }
    if !pattern.notes.is_empty() {
        out += &format!("  note: {}\n", pattern.notes);
    }
    out
}

fn definition(pattern: &Pattern, sweep: &SweepOptions) -> PatternResult {
    PatternResult {
        name: pattern.name.into(),
        source: pattern.source.text().into(),
        description: pattern.description.into(),
        notes: pattern.notes.into(),
        groups: pattern.group_descriptions(sweep),
        axes: pattern.axis_values(sweep),
        charts: pattern.chart_hints(),
        points: Vec::new(),
        ratings: Vec::new(),
    }
}

fn suite_points(members: &[&Pattern], sweep: &SweepOptions) -> usize {
    members.iter().map(|p| p.points(sweep).len()).sum()
}

fn minutes(duration: Duration) -> String {
    let seconds = duration.as_secs();
    format!("{}m{:02}s", seconds / 60, seconds % 60)
}

pub fn run(args: &RunArgs) -> Result<(), String> {
    let pattern = patterns::find(&args.pattern)?;
    measure(&[pattern], None, &args.measure)
}

pub fn suite(args: &SuiteArgs) -> Result<(), String> {
    let suite = patterns::find_suite(&args.suite)?;
    measure(&suite.members(), Some(suite.name), &args.measure)
}

fn settings_for(quick: bool, duration: Option<f64>, ramp: Option<f64>) -> RunSettings {
    let (duration_default, ramp_default) = if quick { (QUICK_DURATION, QUICK_RAMP) } else { (DURATION_DEFAULT, RAMP_DEFAULT) };
    RunSettings {
        duration: duration.map_or(duration_default, Duration::from_secs_f64),
        ramp: ramp.map_or(ramp_default, Duration::from_secs_f64),
        seed: 1,
        verify: false,
        sweep: SweepOptions { quick, ..SweepOptions::default() },
        pace: Pace::Closed,
    }
}

fn parse_block_size(text: &str) -> Result<u64, String> {
    let bytes = drive::parse_size_bytes(text)?;
    if bytes == 0 || bytes % 512 != 0 || bytes > 1 << 30 {
        return Err(format!("block size {text:?} is not allowed; allowed: a multiple of 512 bytes up to 1GiB, e.g. 4K or 1M"));
    }
    Ok(bytes)
}

fn check_args(args: &MeasureArgs) -> Result<(), String> {
    for (name, value) in [("--duration", args.duration), ("--ramp", args.ramp)] {
        if value.is_some_and(|v| !(0.0..=86_400.0).contains(&v) || (name == "--duration" && v == 0.0)) {
            return Err(format!("{name} {} is not allowed; allowed: seconds, up to 86400 (--duration above 0)", value.unwrap_or_default()));
        }
    }
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(format!("--rate {} is not allowed; allowed: requests per second above 0", args.rate.unwrap_or_default()));
    }
    if let Some(depths) = &args.qd {
        if depths.is_empty() || depths.iter().any(|&q| q == 0 || q > 4096) {
            return Err(format!("--qd {depths:?} is not allowed; allowed: a list of queue depths from 1 to 4096, e.g. 1,4,32"));
        }
    }
    if let Some(workers) = &args.workers {
        if workers.is_empty() || workers.iter().any(|&w| w == 0 || w > 256) {
            return Err(format!("--workers {workers:?} is not allowed; allowed: a list of worker counts from 1 to 256, e.g. 1,2,4"));
        }
    }
    Ok(())
}

fn measure(patterns: &[&'static Pattern], suite: Option<&str>, args: &MeasureArgs) -> Result<(), String> {
    check_args(args)?;
    let mut settings = settings_for(args.quick, args.duration, args.ramp);
    settings.seed = args.seed;
    settings.verify = args.verify;
    settings.sweep.queue_depths = args.qd.clone();
    settings.sweep.block_sizes = args.block.clone();
    settings.sweep.workers = args.workers.clone();
    settings.sweep.distribution = args.distribution.clone();
    settings.pace = args.rate.map_or(Pace::Closed, |rate_iops| Pace::Open { rate_iops });
    let spec = TargetSpec::parse(&args.target)?;
    let writer = patterns.iter().find(|p| p.points(&settings.sweep).iter().any(|pt| pt.groups.iter().any(|g| g.spec.writes())));
    if let (Some(writer), TargetSpec::Path(path)) = (writer, &spec) {
        let block_device = std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
        if block_device && !args.overwrite_device {
            return Err(format!(
                "--target {}: pattern {} writes, which destroys the device's data; add --overwrite-device if that is what you want",
                args.target, writer.name
            ));
        }
    }
    let target = OpenTarget::open(&spec, OpenOptions { shards: args.shards, writes: writer.is_some() })?;
    let total_points = suite_points(patterns, &settings.sweep);
    let machine = Machine::detect();
    println!("storc bench {}: {}", suite.map_or_else(|| patterns[0].name.to_string(), |s| format!("suite {s}")), target.info().description);
    println!(
        "{} points of {} s (+{} s ramp), about {}; {} loop{}; {} cores, {}, {}",
        total_points,
        settings.duration.as_secs_f64(),
        settings.ramp.as_secs_f64(),
        minutes(settings.estimate(total_points)),
        if args.rate.is_some() { "open" } else { "closed" },
        if args.verify { "; verifying every read" } else { "" },
        machine.cores,
        machine.cpu_model,
        machine.kernel
    );
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut observer = Terminal { progress: Progress::new(total_points) };
    let mut runner = Runner::new(&target, settings.clone());
    let results_patterns: Vec<PatternResult> = patterns.iter().map(|p| runner.run_pattern(p, &mut observer)).collect();
    observer.progress.finish();
    let results = Results {
        schema_version: RESULTS_SCHEMA_VERSION,
        storc_version: env!("CARGO_PKG_VERSION").into(),
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix_s,
        suite: suite.map(String::from),
        machine,
        target: target.info().clone(),
        settings: Settings {
            duration_s: settings.duration.as_secs_f64(),
            ramp_s: settings.ramp.as_secs_f64(),
            seed: settings.seed,
            verify: settings.verify,
            quick: args.quick,
            loop_kind: if args.rate.is_some() { "open" } else { "closed" }.into(),
            rate_iops: args.rate,
            queue_depths: args.qd.clone(),
            block_sizes: args.block.clone(),
            workers: args.workers.clone(),
            distribution: args.distribution.as_ref().map(Distribution::text),
        },
        patterns: results_patterns,
    };
    drop(target);
    write_outputs(&results, args)?;
    verdict(&results)
}

fn write_outputs(results: &Results, args: &MeasureArgs) -> Result<(), String> {
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(results).expect("plain data");
        std::fs::write(path, json + "\n").map_err(|e| format!("--json {}: {e}", path.display()))?;
        println!("results: {}", path.display());
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, results.to_csv()).map_err(|e| format!("--csv {}: {e}", path.display()))?;
        println!("csv: {}", path.display());
    }
    if let Some(path) = &args.html {
        let html = bench::report::render(results, None, "this run");
        std::fs::write(path, html).map_err(|e| format!("--html {}: {e}", path.display()))?;
        println!("report: {}", path.display());
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// A results document written by storc bench run/suite --json.
    results: PathBuf,
    /// A second results document: adds a table of every common point's value A / value B.
    #[arg(long, value_name = "OTHER.json")]
    compare: Option<PathBuf>,
    /// Where to write the self-contained HTML report.
    #[arg(long, value_name = "OUT.html")]
    html: PathBuf,
}

/// `storc bench report RESULTS.json [--compare OTHER.json] --html OUT.html`.
pub fn report(args: &ReportArgs) -> Result<(), String> {
    let read = |path: &PathBuf| -> Result<Results, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a storc bench results document: {e}", path.display()))
    };
    let results = read(&args.results)?;
    let other = args.compare.as_ref().map(read).transpose()?;
    let label = |path: &PathBuf| path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let html = bench::report::render(
        &results,
        other.as_ref().zip(args.compare.as_ref()).map(|(o, path)| (o, label(path))).as_ref().map(|(o, l)| (*o, l.as_str())),
        &label(&args.results),
    );
    std::fs::write(&args.html, html).map_err(|e| format!("--html {}: {e}", args.html.display()))?;
    println!("report: {}", args.html.display());
    Ok(())
}

/// Mismatches are printed so that nobody misses them, and fail the command; so do I/O errors.
fn verdict(results: &Results) -> Result<(), String> {
    let Some(failure) = results.failure() else { return Ok(()) };
    if results.mismatched_sectors() > 0 {
        let bar = "!".repeat(78);
        eprintln!("{bar}\n!!! {failure}");
        for (pattern, mismatch) in results.first_mismatches(8) {
            eprintln!("!!!   {pattern}: {mismatch}");
        }
        eprintln!("!!! the target returned data that was not the last data written there\n{bar}");
    } else if let Some((pattern, point)) = results.points().find(|(_, p)| p.errors > 0) {
        eprintln!("first failed request ({}): {}", pattern.name, point.first_error.as_deref().unwrap_or("?"));
    }
    Err(failure)
}

/// The live view: the progress bar, a table when a pattern finishes, mismatches at once.
struct Terminal {
    progress: Progress,
}

impl Observer for Terminal {
    fn point_started(&mut self, pattern: &Pattern, coordinates: &BTreeMap<String, u64>) {
        self.progress.point_started(&format!("{} {}", pattern.name, coordinates_text(coordinates)));
    }

    fn point_finished(&mut self, pattern: &Pattern, point: &Point) {
        self.progress.point_finished();
        if let Some(verify) = point.verify.as_ref().filter(|v| v.mismatched_sectors > 0) {
            let first = verify.first_mismatches.first().map(ToString::to_string).unwrap_or_default();
            self.progress.println(&format!(
                "!!! MISMATCH in {} {}: {} sectors read back wrong, first at {first}",
                pattern.name,
                coordinates_text(&point.coordinates),
                verify.mismatched_sectors
            ));
        }
    }

    fn pattern_finished(&mut self, result: &PatternResult) {
        self.progress.println(&render_pattern(result));
    }
}

fn coordinates_text(coordinates: &BTreeMap<String, u64>) -> String {
    let axes = Axis::ALL
        .iter()
        .filter_map(|axis| coordinates.get(axis.name()).map(|&v| format!("{}={}", axis.short_name(), axis_value_text(*axis, v))));
    axes.collect::<Vec<_>>().join(" ")
}

fn axis_value_text(axis: Axis, value: u64) -> String {
    match axis {
        Axis::BlockBytes => size_text(value),
        _ => value.to_string(),
    }
}

/// `512`, `4K`, `1M`, `64M`.
fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn latency_text(us: f64) -> String {
    if us >= 100.0 {
        format!("{us:.0}")
    } else {
        format!("{us:.1}")
    }
}

/// One pattern's points as a table, its axes first, then its ratings.
fn render_pattern(result: &PatternResult) -> String {
    let axes: Vec<Axis> = result.axes.iter().filter_map(|v| Axis::ALL.iter().copied().find(|a| a.name() == v.axis)).collect();
    let verifying = result.points.iter().any(|p| p.verify.is_some());
    let mut header: Vec<&str> = axes.iter().map(|a| a.short_name()).collect();
    header.extend(["IOPS", "MB/s", "mean us", "p50 us", "p99 us", "p99.9 us", "max us", "errors"]);
    if verifying {
        header.push("mismatches");
    }
    let rows: Vec<Vec<String>> = result.points.iter().map(|point| point_row(&axes, point, verifying)).collect();
    let mut out = format!("\n== {} ({})\n{}", result.name, result.description, table(&header, &rows));
    for rating in &result.ratings {
        let rest = coordinates_text(&rating.coordinates);
        out += &format!(
            "\nrating{}: {:.1}  (sum over QD 1..32 of IOPS/QD)",
            if rest.is_empty() { String::new() } else { format!(" at {rest}") },
            rating.value
        );
    }
    out
}

fn point_row(axes: &[Axis], point: &Point, verifying: bool) -> Vec<String> {
    let mut row: Vec<String> =
        axes.iter().map(|a| point.coordinates.get(a.name()).map_or_else(String::new, |&v| axis_value_text(*a, v))).collect();
    if let Some(reason) = &point.skipped {
        row.push(format!("skipped: {reason}"));
        row.resize(axes.len() + 8 + usize::from(verifying), String::new());
        return row;
    }
    let l = &point.latency_us;
    row.extend([
        format!("{:.0}", point.iops),
        format!("{:.1}", point.mb_per_s),
        latency_text(l.mean),
        latency_text(l.p50),
        latency_text(l.p99),
        latency_text(l.p99_9),
        latency_text(l.max),
        point.errors.to_string(),
    ]);
    if verifying {
        row.push(point.verify.as_ref().map_or(0, |v| v.mismatched_sectors).to_string());
    }
    row
}
