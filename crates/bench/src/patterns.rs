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

const QD_1_256: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256];
const QD_1_32: &[u64] = &[1, 2, 4, 8, 16, 32];
/// The queue depths of the performance rating (seed 001).
pub const RATING_QUEUE_DEPTHS: [u64; 6] = [1, 2, 4, 8, 16, 32];
const BLOCKS_512_1M: &[u64] = &[512, KIB, 2 * KIB, 4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 512 * KIB, MIB];
const WRITE_0_100: &[u64] = &[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100];

const FILE_SERVER: &[AccessLine] = &[
    line(512, 10, 80, 100),
    line(KIB, 5, 80, 100),
    line(2 * KIB, 5, 80, 100),
    line(4 * KIB, 60, 80, 100),
    line(8 * KIB, 2, 80, 100),
    line(16 * KIB, 4, 80, 100),
    line(32 * KIB, 4, 80, 100),
    line(64 * KIB, 10, 80, 100),
];
const WEB_SERVER: &[AccessLine] = &[
    line(512, 22, 100, 100),
    line(KIB, 15, 100, 100),
    line(2 * KIB, 8, 100, 100),
    line(4 * KIB, 23, 100, 100),
    line(8 * KIB, 15, 100, 100),
    line(16 * KIB, 2, 100, 100),
    line(32 * KIB, 6, 100, 100),
    line(64 * KIB, 7, 100, 100),
    line(128 * KIB, 1, 100, 100),
    line(512 * KIB, 1, 100, 100),
];
const DATABASE: &[AccessLine] = &[line(8 * KIB, 100, 67, 100)];
const WORKSTATION: &[AccessLine] = &[line(8 * KIB, 100, 80, 80)];
const FILE_SERVER_BIMODAL: &[AccessLine] = &[
    line(2 * KIB, 10, 80, 100),
    line(4 * KIB, 30, 80, 100),
    line(8 * KIB, 10, 80, 100),
    line(32 * KIB, 10, 80, 100),
    line(64 * KIB, 30, 80, 100),
    line(128 * KIB, 10, 80, 100),
];

const fn one(lines: &'static [AccessLine], workers: usize, queue_depth: usize, zone: ZoneRule) -> Group {
    Group { lines, workers, queue_depth, zone, distribution: "uniform" }
}

const IOPS_BY_QD: &[Chart] = &[Chart { title: "IOPS by queue depth", x: Axis::QueueDepth, y: "iops", series: None, fixed: &[] }];
const MBPS_BY_QD: &[Chart] = &[Chart { title: "MB/s by queue depth", x: Axis::QueueDepth, y: "mb_per_s", series: None, fixed: &[] }];
const MBPS_BY_BLOCK: &[Chart] = &[Chart { title: "MB/s by block size", x: Axis::BlockBytes, y: "mb_per_s", series: None, fixed: &[] }];
const RANDOM_BY_BLOCK: &[Chart] = &[
    Chart { title: "IOPS by block size", x: Axis::BlockBytes, y: "iops", series: None, fixed: &[] },
    Chart { title: "MB/s by block size", x: Axis::BlockBytes, y: "mb_per_s", series: None, fixed: &[] },
];
const MULTITHREADED_CHARTS: &[Chart] = &[
    Chart { title: "MB/s by workers at QD 1", x: Axis::Workers, y: "mb_per_s", series: None, fixed: &[(Axis::QueueDepth, 1)] },
    Chart { title: "MB/s by outstanding I/Os per worker", x: Axis::QueueDepth, y: "mb_per_s", series: Some(Axis::Workers), fixed: &[] },
];
const MATRIX_CHARTS: &[Chart] = &[
    Chart {
        title: "sequential read",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 100), (Axis::RandomPercent, 0)],
    },
    Chart {
        title: "sequential 50% read",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 50), (Axis::RandomPercent, 0)],
    },
    Chart {
        title: "sequential write",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 0), (Axis::RandomPercent, 0)],
    },
    Chart {
        title: "random read",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 100), (Axis::RandomPercent, 100)],
    },
    Chart {
        title: "random 50% read",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 50), (Axis::RandomPercent, 100)],
    },
    Chart {
        title: "random write",
        x: Axis::BlockBytes,
        y: "mb_per_s",
        series: Some(Axis::Workers),
        fixed: &[(Axis::ReadPercent, 0), (Axis::RandomPercent, 100)],
    },
];

/// Every built-in pattern.
pub static PATTERNS: &[Pattern] = &[
    Pattern {
        name: "file-server",
        source: Source::Classic,
        description: "512 B 10, 1 KiB 5, 2 KiB 5, 4 KiB 60, 8 KiB 2, 16 KiB 4, 32 KiB 4, 64 KiB 10 (share of requests); 80% read; 100% random; swept over queue depth 1 to 256",
        notes: "one worker over the whole target; offsets aligned to the request size",
        groups: &[one(FILE_SERVER, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "web-server",
        source: Source::Classic,
        description: "512 B 22, 1 KiB 15, 2 KiB 8, 4 KiB 23, 8 KiB 15, 16 KiB 2, 32 KiB 6, 64 KiB 7, 128 KiB 1, 512 KiB 1 (share of requests); 100% read; 100% random; swept over queue depth 1 to 256",
        notes: "one worker over the whole target; offsets aligned to the request size",
        groups: &[one(WEB_SERVER, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "database",
        source: Source::Classic,
        description: "8 KiB 100%; 67% read; 100% random; swept over queue depth 1 to 256",
        notes: "one worker over the whole target",
        groups: &[one(DATABASE, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "workstation",
        source: Source::Classic,
        description: "8 KiB 100%; 80% read; 80% random; swept over queue depth 1 to 32",
        notes: "one worker over the whole target; a sequential request continues from the worker's last one",
        groups: &[one(WORKSTATION, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_32)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "review-database",
        source: Source::Reviews,
        description: "8 KiB, 100% random; write share 0% to 100% in steps of 10; queue depth 1 to 256; charts at QD 1, 16, 256",
        notes: "one worker over the whole target; every write share at every queue depth",
        groups: &[one(&[line(8 * KIB, 100, 100, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::WritePercent, WRITE_0_100), (Axis::QueueDepth, QD_1_256)],
        charts: &[
            Chart { title: "IOPS by write share at QD 1", x: Axis::WritePercent, y: "iops", series: None, fixed: &[(Axis::QueueDepth, 1)] },
            Chart { title: "IOPS by write share at QD 16", x: Axis::WritePercent, y: "iops", series: None, fixed: &[(Axis::QueueDepth, 16)] },
            Chart { title: "IOPS by write share at QD 256", x: Axis::WritePercent, y: "iops", series: None, fixed: &[(Axis::QueueDepth, 256)] },
        ],
    },
    Pattern {
        name: "review-sequential-read",
        source: Source::Reviews,
        description: "sequential, QD 4; block size grows step by step (512 B to 1 MiB or more), one step per interval",
        notes: "reads; block sizes 512 B to 1 MiB in powers of two, one point each; the sequential stream restarts at the start of the target for each point",
        groups: &[one(&[line(512, 100, 100, 0)], 1, 4, ZoneRule::Whole)],
        sweep: &[(Axis::BlockBytes, BLOCKS_512_1M)],
        charts: MBPS_BY_BLOCK,
    },
    Pattern {
        name: "review-sequential-write",
        source: Source::Reviews,
        description: "sequential, QD 4; block size grows step by step (512 B to 1 MiB or more), one step per interval",
        notes: "writes; block sizes 512 B to 1 MiB in powers of two, one point each; the sequential stream restarts at the start of the target for each point",
        groups: &[one(&[line(512, 100, 0, 0)], 1, 4, ZoneRule::Whole)],
        sweep: &[(Axis::BlockBytes, BLOCKS_512_1M)],
        charts: MBPS_BY_BLOCK,
    },
    Pattern {
        name: "review-random-read",
        source: Source::Reviews,
        description: "random; block size sweep; IOPS for small blocks, MB/s for large ones",
        notes: "reads at QD 4 (the sources do not give the queue depth; the same as their sequential tests, --qd changes it); block sizes 512 B to 1 MiB",
        groups: &[one(&[line(512, 100, 100, 100)], 1, 4, ZoneRule::Whole)],
        sweep: &[(Axis::BlockBytes, BLOCKS_512_1M)],
        charts: RANDOM_BY_BLOCK,
    },
    Pattern {
        name: "review-random-write",
        source: Source::Reviews,
        description: "random; block size sweep; IOPS for small blocks, MB/s for large ones",
        notes: "writes at QD 4 (the sources do not give the queue depth; the same as their sequential tests, --qd changes it); block sizes 512 B to 1 MiB",
        groups: &[one(&[line(512, 100, 0, 100)], 1, 4, ZoneRule::Whole)],
        sweep: &[(Axis::BlockBytes, BLOCKS_512_1M)],
        charts: RANDOM_BY_BLOCK,
    },
    Pattern {
        name: "review-response-time",
        source: Source::Reviews,
        description: "512 B random, QD 1, reads and writes; reports mean response time",
        notes: "two points: all reads (write share 0%) and all writes (100%); the reviews ran 10 minutes, --duration sets it",
        groups: &[one(&[line(512, 100, 100, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::WritePercent, &[0, 100])],
        charts: &[Chart { title: "mean response time", x: Axis::WritePercent, y: "latency_us.mean", series: None, fixed: &[] }],
    },
    Pattern {
        name: "review-multithreaded-read",
        source: Source::Reviews,
        description: "64 KiB sequential per worker, 1 to 4 workers in non-overlapping zones, 1 to 8 outstanding per worker; charts at QD 1",
        notes: "reads; each worker streams through its own slice of the target",
        groups: &[one(&[line(64 * KIB, 100, 100, 0)], 1, 1, ZoneRule::Slices)],
        sweep: &[(Axis::Workers, &[1, 2, 3, 4]), (Axis::QueueDepth, &[1, 2, 3, 4, 5, 6, 7, 8])],
        charts: MULTITHREADED_CHARTS,
    },
    Pattern {
        name: "review-multithreaded-write",
        source: Source::Reviews,
        description: "64 KiB sequential per worker, 1 to 4 workers in non-overlapping zones, 1 to 8 outstanding per worker; charts at QD 1",
        notes: "writes; each worker streams through its own slice of the target",
        groups: &[one(&[line(64 * KIB, 100, 0, 0)], 1, 1, ZoneRule::Slices)],
        sweep: &[(Axis::Workers, &[1, 2, 3, 4]), (Axis::QueueDepth, &[1, 2, 3, 4, 5, 6, 7, 8])],
        charts: MULTITHREADED_CHARTS,
    },
    Pattern {
        name: "rating",
        source: Source::Reviews,
        description: "performance rating = Σ over QD q in {1,2,4,8,16,32} of IOPS(q)/q",
        notes: "measured on the database pattern (8 KiB, 67% read, 100% random); a rating is also computed for every other pattern swept over these queue depths",
        groups: &[one(DATABASE, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_32)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "streaming-read",
        source: Source::Enterprise,
        description: "large sequential (e.g. 1 MiB), high QD; QD sweep 1 to 256",
        notes: "1 MiB sequential reads, one worker",
        groups: &[one(&[line(MIB, 100, 100, 0)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: MBPS_BY_QD,
    },
    Pattern {
        name: "streaming-write",
        source: Source::Enterprise,
        description: "large sequential (e.g. 1 MiB), high QD; QD sweep 1 to 256",
        notes: "1 MiB sequential writes, one worker",
        groups: &[one(&[line(MIB, 100, 0, 0)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: MBPS_BY_QD,
    },
    Pattern {
        name: "multithreaded-read",
        source: Source::Enterprise,
        description: "1 to 24 threads of 64 KiB sequential, start offsets 2 GiB apart",
        notes: "reads, one outstanding I/O per thread; on a target smaller than threads × 2 GiB the spacing shrinks to fit",
        groups: &[one(&[line(64 * KIB, 100, 100, 0)], 1, 1, ZoneRule::Spaced { stride_bytes: 2 * GIB })],
        sweep: &[(Axis::Workers, &[1, 2, 4, 6, 8, 12, 16, 20, 24])],
        charts: &[Chart { title: "MB/s by threads", x: Axis::Workers, y: "mb_per_s", series: None, fixed: &[] }],
    },
    Pattern {
        name: "multithreaded-write",
        source: Source::Enterprise,
        description: "1 to 24 threads of 64 KiB sequential, start offsets 2 GiB apart",
        notes: "writes, one outstanding I/O per thread; on a target smaller than threads × 2 GiB the spacing shrinks to fit",
        groups: &[one(&[line(64 * KIB, 100, 0, 0)], 1, 1, ZoneRule::Spaced { stride_bytes: 2 * GIB })],
        sweep: &[(Axis::Workers, &[1, 2, 4, 6, 8, 12, 16, 20, 24])],
        charts: &[Chart { title: "MB/s by threads", x: Axis::Workers, y: "mb_per_s", series: None, fixed: &[] }],
    },
    Pattern {
        name: "oltp",
        source: Source::Enterprise,
        description: "8 KiB random, 2:1 read:write; QD sweep 1 to 256",
        notes: "67% reads",
        groups: &[one(&[line(8 * KIB, 100, 67, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "oltp-skewed",
        source: Source::Enterprise,
        description: "oltp with a hot set: 8 KiB random, 2:1 read:write, 90% of requests to 10% of the target; QD sweep 1 to 256",
        notes: "seed 003's SQL Server test (a brokerage database, the SSD cache's showcase) names no access pattern; \
                storc models its hot user data as fio's zoned:90/10 over the whole target (--distribution replaces it)",
        groups: &[Group { distribution: "zoned:90/10", ..one(&[line(8 * KIB, 100, 67, 100)], 1, 1, ZoneRule::Whole) }],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "analytics",
        source: Source::Enterprise,
        description: "8 KiB random, 50:50, high QD; plus pure random read and pure random write; QD sweep 1 to 256",
        notes: "the read share is an axis: 50% (the workload), 100% and 0% (the pure random read and write)",
        groups: &[one(&[line(8 * KIB, 100, 50, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::ReadPercent, &[50, 100, 0]), (Axis::QueueDepth, QD_1_256)],
        charts: &[Chart { title: "IOPS by queue depth", x: Axis::QueueDepth, y: "iops", series: Some(Axis::ReadPercent), fixed: &[] }],
    },
    Pattern {
        name: "os-drive",
        source: Source::Enterprise,
        description: "70:30 random read:write plus small sequential writes (logging); QD sweep 1 to 256",
        notes: "two workers: 8 KiB random 70% read over the first 95% of the target (swept), and 4 KiB sequential writes at QD 1 over the last 5% (the log)",
        groups: &[
            one(&[line(8 * KIB, 100, 70, 100)], 1, 1, ZoneRule::Part { from_permille: 0, to_permille: 950 }),
            one(&[line(4 * KIB, 100, 0, 0)], 1, 1, ZoneRule::Part { from_permille: 950, to_permille: 1000 }),
        ],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "file-server-bimodal",
        source: Source::Enterprise,
        description: "80:20 random read:write, sizes split around 4 KiB and 64 KiB; QD sweep 1 to 256",
        notes: "2 KiB 10, 4 KiB 30, 8 KiB 10, 32 KiB 10, 64 KiB 30, 128 KiB 10 (share of requests)",
        groups: &[one(FILE_SERVER_BIMODAL, 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "email-8k",
        source: Source::Enterprise,
        description: "8 KiB 50% read random; QD sweep 1 to 256",
        notes: "",
        groups: &[one(&[line(8 * KIB, 100, 50, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "email-32k",
        source: Source::Enterprise,
        description: "32 KiB 65% read random; QD sweep 1 to 256",
        notes: "",
        groups: &[one(&[line(32 * KIB, 100, 65, 100)], 1, 1, ZoneRule::Whole)],
        sweep: &[(Axis::QueueDepth, QD_1_256)],
        charts: IOPS_BY_QD,
    },
    Pattern {
        name: "hba-iops",
        source: Source::Hba,
        description: "4 KiB sequential reads, 8 workers, QD 64 each",
        notes: "each worker streams through its own slice of the target",
        groups: &[one(&[line(4 * KIB, 100, 100, 0)], 8, 64, ZoneRule::Slices)],
        sweep: &[],
        charts: &[],
    },
    Pattern {
        name: "hba-throughput",
        source: Source::Hba,
        description: "1 MiB random reads, 8 workers, QD 64 each",
        notes: "each worker reads at random in its own slice of the target",
        groups: &[one(&[line(MIB, 100, 100, 100)], 8, 64, ZoneRule::Slices)],
        sweep: &[],
        charts: &[],
    },
    Pattern {
        name: "software-raid-matrix",
        source: Source::SoftwareRaid,
        description: "read % in {100, 50, 0} × random % in {0, 100} × threads in {1, 20} × block size in {4 KiB, 8 KiB, 32 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB, 8 MiB, 64 MiB}; O_DIRECT; the middle zone of the target; fixed duration per point (20 s in the original; configurable)",
        notes: "the middle zone is 40%..60% of the target (the original's 400..600 GB of a 1 TB drive), one slice per thread; one outstanding I/O per thread",
        groups: &[one(&[line(4 * KIB, 100, 100, 0)], 1, 1, ZoneRule::Part { from_permille: 400, to_permille: 600 })],
        sweep: &[
            (Axis::ReadPercent, &[100, 50, 0]),
            (Axis::RandomPercent, &[0, 100]),
            (Axis::Workers, &[1, 20]),
            (Axis::BlockBytes, &[4 * KIB, 8 * KIB, 32 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 8 * MIB, 64 * MIB]),
        ],
        charts: MATRIX_CHARTS,
    },
];

pub static SUITES: &[Suite] = &[
    Suite {
        name: "review",
        description: "the reviews' patterns (seeds 000 and 001)",
        patterns: &[
            "review-database",
            "review-sequential-read",
            "review-sequential-write",
            "review-random-read",
            "review-random-write",
            "review-response-time",
            "review-multithreaded-read",
            "review-multithreaded-write",
            "file-server",
            "web-server",
            "workstation",
            "rating",
        ],
    },
    Suite {
        name: "enterprise",
        description: "the white paper's enterprise workloads (seed 003)",
        patterns: &[
            "streaming-read",
            "streaming-write",
            "multithreaded-read",
            "multithreaded-write",
            "oltp",
            "oltp-skewed",
            "analytics",
            "os-drive",
            "file-server-bimodal",
            "email-8k",
            "email-32k",
            "web-server",
            "workstation",
        ],
    },
    Suite { name: "hba", description: "the HBA tests (seed 002)", patterns: &["hba-iops", "hba-throughput"] },
    Suite { name: "software-raid", description: "the software-RAID matrix (seed 004)", patterns: &["software-raid-matrix"] },
    Suite {
        name: "classic",
        description: "the classic IOMeter patterns",
        patterns: &["file-server", "web-server", "database", "workstation"],
    },
    Suite { name: "all", description: "every pattern once", patterns: &[] },
];

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
mod tests {
    use super::*;

    /// Every pattern name BENCH.md's tables define ("x / -y" names two), read from the file.
    fn bench_md_names() -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/BENCH.md");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("BENCH.md must be at {}: {e}", path.display()));
        let mut names = Vec::new();
        for row in text.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| pattern")) {
            let cell = row.split('|').nth(1).unwrap_or_default().trim();
            if cell == "QD sweep" {
                continue; // a sweep of the enterprise patterns, not a pattern
            }
            let (first, second) = cell.split_once(" / ").map_or((cell, None), |(a, b)| (a, Some(b)));
            names.push(first.to_string());
            if let Some(second) = second {
                let suffix = second.trim_start_matches('-');
                let stem = match second.starts_with('-') {
                    true => first.rsplit_once('-').map(|(stem, _)| stem).unwrap_or(first).to_string() + "-",
                    false => String::new(),
                };
                names.push(stem + suffix);
            }
        }
        names
    }

    #[test]
    fn the_table_covers_every_bench_md_pattern() {
        let names = bench_md_names();
        assert!(names.len() >= 25, "parsed too few names from BENCH.md: {names:?}");
        for name in &names {
            assert!(find(name).is_ok(), "BENCH.md defines {name:?}, the pattern table does not");
        }
        // The software-RAID matrix is a section of its own in BENCH.md, without a table row.
        assert!(find("software-raid-matrix").is_ok());
    }

    #[test]
    fn every_pattern_is_valid_and_every_suite_names_patterns() {
        for pattern in PATTERNS {
            assert!(!pattern.description.is_empty(), "{}", pattern.name);
            let points = pattern.points(&SweepOptions::default());
            assert!(!points.is_empty());
            for chart in pattern.charts {
                assert!(pattern.sweep.iter().any(|(a, _)| *a == chart.x), "{}: chart over an axis it does not sweep", pattern.name);
            }
        }
        for suite in SUITES {
            assert!(!suite.members().is_empty(), "{}", suite.name);
        }
        let unique: std::collections::HashSet<&str> = PATTERNS.iter().map(|p| p.name).collect();
        assert_eq!(unique.len(), PATTERNS.len(), "pattern names are unique");
    }

    #[test]
    fn sweeps_expand_to_the_defined_points() {
        let count = |name: &str| find(name).unwrap().points(&SweepOptions::default()).len();
        assert_eq!(count("review-database"), 11 * 9);
        assert_eq!(count("workstation"), 6);
        assert_eq!(count("review-multithreaded-read"), 32);
        assert_eq!(count("software-raid-matrix"), 3 * 2 * 2 * 9);
        assert_eq!(count("hba-iops"), 1);
        let database = find("review-database").unwrap().points(&SweepOptions::default());
        // Last axis fastest: the queue depth runs through before the write share moves.
        assert_eq!(database[1].coordinates, BTreeMap::from([("queue_depth".into(), 2), ("write_percent".into(), 0)]));
        assert_eq!(database[9].groups[0].spec.lines()[0].read_percent, 90);
        assert_eq!(database[9].groups[0].queue_depth, 1);
    }

    #[test]
    fn quick_and_qd_options_reshape_the_sweep() {
        let quick = SweepOptions { quick: true, ..SweepOptions::default() };
        let axes = find("review-database").unwrap().axes(&quick);
        assert_eq!(axes, vec![(Axis::WritePercent, vec![0, 50, 100]), (Axis::QueueDepth, vec![1, 16, 256])]);
        let qd = SweepOptions { queue_depths: Some(vec![1, 32]), ..SweepOptions::default() };
        assert_eq!(find("review-sequential-read").unwrap().axes(&qd).last(), Some(&(Axis::QueueDepth, vec![1, 32])));
        assert_eq!(find("oltp").unwrap().axes(&qd), vec![(Axis::QueueDepth, vec![1, 32])]);
        let block = SweepOptions { block_sizes: Some(vec![4096]), queue_depths: Some(vec![32]), quick: true, ..SweepOptions::default() };
        assert_eq!(find("review-random-read").unwrap().axes(&block), vec![(Axis::BlockBytes, vec![4096]), (Axis::QueueDepth, vec![32])]);
        let point = &find("oltp").unwrap().points(&block)[0];
        assert_eq!((point.groups[0].spec.lines()[0].block_bytes, point.groups[0].queue_depth), (4096, 32));
        let workers = SweepOptions { workers: Some(vec![2]), queue_depths: Some(vec![1]), ..SweepOptions::default() };
        let points = find("review-multithreaded-read").unwrap().points(&workers);
        assert_eq!(points.len(), 1, "one worker count and one queue depth: one point");
        assert_eq!((points[0].groups[0].workers, points[0].groups[0].queue_depth), (2, 1));
    }

    #[test]
    fn distributions_come_from_the_pattern_unless_replaced() {
        let defaults = SweepOptions::default();
        let skewed = find("oltp-skewed").unwrap();
        let oltp = find("oltp").unwrap();
        assert_eq!(skewed.points(&defaults)[0].groups[0].distribution.text(), "zoned:90/10:10/90");
        assert_eq!(oltp.points(&defaults)[0].groups[0].distribution, Distribution::Uniform);
        assert_eq!(skewed.group_descriptions(&defaults)[0].distribution, "zoned:90/10:10/90");
        let zipf = SweepOptions { distribution: Some(Distribution::Zipf { theta: 1.1 }), ..SweepOptions::default() };
        for pattern in [skewed, oltp] {
            assert!(pattern.points(&zipf).iter().all(|p| p.groups[0].distribution.text() == "zipf:1.1"), "{}", pattern.name);
            assert_eq!(pattern.group_descriptions(&zipf)[0].distribution, "zipf:1.1");
        }
        for pattern in PATTERNS {
            for group in pattern.groups {
                let _ = group.default_distribution();
            }
        }
    }

    #[test]
    fn review_suite_fits_fifteen_minutes_at_the_default_point_length() {
        let points: usize = find_suite("review").unwrap().members().iter().map(|p| p.points(&SweepOptions::default()).len()).sum();
        // 2 s measured + 0.5 s ramp per point, with up to 1 s of drain and setup.
        assert!(points as f64 * 3.5 < 15.0 * 60.0, "{points} points");
    }
}
