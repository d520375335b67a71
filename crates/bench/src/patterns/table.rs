//! The pattern table: every pattern of BENCH.md and the suites, as data.

use super::*;

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
