//! What one run does, derived from its seed alone.

use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use layout::{Level, KIB};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What one run does, derived from its seed.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub seed: u64,
    pub level: Level,
    pub drive_count: usize,
    pub drives_per_span: Option<usize>,
    pub strip_size_bytes: u64,
    /// Rows each member holds (small, so that writes collide often).
    pub rows_per_member: u64,
    pub operation_count: usize,
    pub in_flight_max: usize,
    /// Chance per operation that a fault is injected (while the level can take one more).
    pub fault_per_mille: u32,
    /// Chance per operation that a FLUSH is submitted instead of a read or a write.
    pub flush_per_mille: u32,
    /// The operation at which a member is replaced by a blank drive and rebuilt (redundant
    /// levels only).
    pub rebuild_at_operation: Option<usize>,
    /// The operations before which the power fails (in increasing order).
    pub crash_at_operations: Vec<usize>,
    /// Rows per write-intent bitmap region (redundant levels): tiny, so that a VD of a few rows
    /// has several regions and a crash leaves some clean.
    pub rows_per_region: u64,
    /// Chance per operation that a clean pass of the bitmap starts (clearing idle regions).
    pub clean_per_mille: u32,
    /// The operations at which a member is taken out of service (as `set offline` does) and
    /// at which it is re-added: only the regions written meanwhile are rebuilt on it (every row
    /// if a crash came in between). Redundant levels, in runs that rebuild no blank drive.
    pub re_add_at_operations: Option<(usize, usize)>,
    /// The operation at which a member is copied to a new drive that then takes its place
    /// (copyback, proactive replacement), if nothing else is rebuilt then. Redundant levels.
    pub copy_at_operation: Option<usize>,
    /// The VD is created over members full of old data: every region starts unsynced and a
    /// background initialization runs amid the workload (redundant levels).
    pub bgi: bool,
    /// The cache's policy for the VD's writes.
    pub write_policy: WritePolicy,
    /// The cache has a journal (on a volatile drive that crashes like the members).
    pub journal: bool,
    /// The operation at which the journal fails (and is detached), if it does.
    pub journal_fail_at_operation: Option<usize>,
    /// The shard's cache size: small, so that destaging runs all the time.
    pub cache_bytes: u64,
    /// Dirty data is destaged at a tick once it is older than this (zero: at every tick).
    pub destage_age_ms: u64,
    /// The VD's read-ahead policy: RA and ADRA read into the clean cache.
    pub read_policy: ReadPolicy,
    /// Cached keeps what reads bring in.
    pub io_policy: IoPolicy,
    /// The journal is a mirrored pair (when there is a journal).
    pub journal_mirrored: bool,
    /// The operation at which one leg of a mirrored journal fails, if one does: the other goes
    /// on, and the failed one comes back stale at some restarts.
    pub journal_leg_fail_at_operation: Option<usize>,
    /// Writes of sequential streams go around the journal (`cache::bypass`) from a stream of
    /// one row on, and part of the writes continue the last one to make such streams.
    pub journal_bypass: bool,
}

impl RunConfig {
    /// The configuration seed `seed` runs: levels rotate with the seed so that every level gets
    /// the same share of any range of seeds.
    pub fn from_seed(seed: u64) -> RunConfig {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_5eed);
        let level = Level::ALL[(seed % Level::ALL.len() as u64) as usize];
        let (drive_count, drives_per_span) = drive_count_for(level, &mut rng);
        let strip_size_bytes = [8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB][rng.gen_range(0..4)];
        let operation_count = rng.gen_range(40..160);
        let redundant = !matches!(level, Level::Raid0 | Level::Jbod);
        let rebuild_at_operation = (redundant && rng.gen_bool(0.5)).then(|| rng.gen_range(0..operation_count));
        let rows_per_member = rng.gen_range(2..6);
        let in_flight_max = rng.gen_range(1..24);
        let fault_per_mille = [0, 10, 30][rng.gen_range(0..3)];
        let flush_per_mille = [0, 20, 80][rng.gen_range(0..3)];
        RunConfig {
            seed,
            level,
            drive_count,
            drives_per_span,
            strip_size_bytes,
            rows_per_member,
            operation_count,
            in_flight_max,
            fault_per_mille,
            flush_per_mille,
            rebuild_at_operation,
            crash_at_operations: crash_points(&mut rng, operation_count, rebuild_at_operation),
            // Drawn last, so that the fields above stay what they were for each seed.
            rows_per_region: rng.gen_range(1..=3),
            clean_per_mille: [20, 60, 150][rng.gen_range(0..3)],
            re_add_at_operations: re_add_points(&mut rng, operation_count, redundant && rebuild_at_operation.is_none()),
            copy_at_operation: (redundant && rng.gen_bool(0.5)).then(|| rng.gen_range(0..operation_count)),
            bgi: redundant && rng.gen_bool(0.35),
            write_policy: [WritePolicy::WriteThrough, WritePolicy::WriteBack, WritePolicy::WriteBack, WritePolicy::AlwaysWriteBack]
                [rng.gen_range(0..4)],
            journal: rng.gen_bool(0.75),
            journal_fail_at_operation: rng.gen_bool(0.2).then(|| rng.gen_range(0..operation_count)),
            cache_bytes: [16 * KIB, 64 * KIB, 256 * KIB, 4096 * KIB][rng.gen_range(0..4)],
            destage_age_ms: [0, 0, 1000][rng.gen_range(0..3)],
            read_policy: ReadPolicy::ALL[rng.gen_range(0..3)],
            io_policy: IoPolicy::ALL[rng.gen_range(0..2)],
            journal_mirrored: rng.gen_bool(0.5),
            // In the first half, so that most such runs crash afterwards.
            journal_leg_fail_at_operation: rng.gen_bool(0.5).then(|| rng.gen_range(0..operation_count / 2 + 1)),
            journal_bypass: rng.gen_bool(0.5),
        }
    }
}

/// No crash in a quarter of the runs, one in a quarter, two in the rest: the first in the first
/// half of the run (before faults pile up, so that most crashes may tear writes), the second
/// after it. In half the runs that rebuild a member, the last crash comes while the rebuild runs.
fn crash_points(rng: &mut SmallRng, operation_count: usize, rebuild_at_operation: Option<usize>) -> Vec<usize> {
    let count = [0, 1, 2, 2][rng.gen_range(0..4)];
    let half = operation_count / 2;
    let mut points: Vec<usize> = match count {
        0 => vec![],
        1 => vec![rng.gen_range(1..half)],
        _ => vec![rng.gen_range(1..half), rng.gen_range(half..operation_count)],
    };
    if let (Some(last), Some(rebuild_at)) = (points.last_mut(), rebuild_at_operation) {
        if rng.gen_bool(0.5) {
            *last = (rebuild_at + rng.gen_range(1..8)).min(operation_count - 1);
        }
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// In most runs that may have one: out in the first half, back some operations later.
fn re_add_points(rng: &mut SmallRng, operation_count: usize, eligible: bool) -> Option<(usize, usize)> {
    if !eligible || !rng.gen_bool(0.8) {
        return None;
    }
    let out = rng.gen_range(0..operation_count / 2);
    Some((out, rng.gen_range(out + 1..operation_count)))
}

fn drive_count_for(level: Level, rng: &mut SmallRng) -> (usize, Option<usize>) {
    match level {
        Level::Jbod => (1, None),
        Level::Raid0 => (rng.gen_range(1..7), None),
        Level::Raid1 => (2, None),
        Level::Raid1E => (rng.gen_range(3..7), None),
        Level::Raid5 => (rng.gen_range(3..9), None),
        Level::Raid6 => (rng.gen_range(4..10), None),
        Level::Raid10 => (2 * rng.gen_range(2..5), Some(2)),
        Level::Raid50 => {
            let per_span = rng.gen_range(3..5);
            (per_span * rng.gen_range(2..4), Some(per_span))
        }
        Level::Raid60 => {
            let per_span = rng.gen_range(4..6);
            (per_span * rng.gen_range(2..4), Some(per_span))
        }
    }
}
