//! The deterministic simulator.
//!
//! One run is a pure function of its seed: the seed picks a level, a drive count, a strip size,
//! a workload, its faults and its crashes, and it orders every drive completion (through
//! [`engine::CompletionOrder`]), so a failing seed replays exactly with `storc-sim --seed N`
//! (`STORC_SIM_TRACE=1` prints its configuration, each operation's requests in flight and
//! dirty cache bytes, each request as it is submitted and completed, each BGI run and
//! checkpoint, each fault as it is injected, and the member states before the final
//! verification).
//!
//! A run drives the real engine paths ([`engine::LocalEngine`]) over memory drives with a
//! volatile write cache ([`crate::drive::VolatileDrive`]) wrapped in fault injection, and
//! checks every read against a reference model ([`model`]). Writes may overlap writes in
//! flight (the engine serialises them per row in submission order); reads never overlap a write
//! in flight, since their result would then legitimately be either value. FLUSHes run amid the
//! writes. While it runs, members fail whole or return read or write errors, never more than the
//! level tolerates.
//!
//! In some runs one member is replaced by a blank drive part-way and rebuilt row by row while
//! the workload goes on (rows taken in order, interleaved with client I/O in seeded order), as a
//! hot spare is; its progress is checkpointed only after a flush of the new drive, so that a
//! restart resumes past rows that are durable, and it returns to service amid the workload.
//!
//! Every redundant VD has a write-intent bitmap, cleared by clean passes amid the workload. In
//! most runs the power fails once or twice ([`crash`]): the drives drop, keep or tear their
//! unflushed writes (bitmap writes too), and the VD restarts from the drives alone, resyncs
//! the regions its bitmap says are dirty, and is checked. After each restart and at the end,
//! every row is checked for consistency, the whole VD is read back, and then read again with
//! each remaining member taken out in turn, so that parity or a mirror copy that was written
//! wrong cannot hide behind a healthy member. Reads that need the parity of a region left
//! unsynced are refused (`RowNotResynced`), and the oracle accepts that only there.
//!
//! Copyback, re-add of a member that missed writes, pauses and rate changes of background
//! operations belong to the controller, which the simulator does not run yet: a run drives one
//! `VirtualDrive`, playing the controller's part (recording failures, checkpointing the rebuild)
//! itself. Such events would be drawn in [`RunConfig`] and interleaved in the workload loop
//! beside `start_rebuild` (`rebuild.rs`); a restart would then assemble through the controller
//! instead of `crash::Sim::restart`.

mod bgi;
mod cache;
mod check;
mod config;
mod copy;
mod crash;
pub mod drive;
mod intent;
pub mod model;
mod readd;
mod rebuild;
mod run;
mod ssd_cache;
mod verify;

pub use bgi::BgiReport;
pub use config::RunConfig;
pub use crash::{CrashReport, ResyncReport};
pub use ssd_cache::{run_ssd_cache_seed, SsdCacheReport};

use layout::KIB;
use std::fmt;

/// What a passing run did.
#[derive(Debug)]
pub struct RunReport {
    pub config: RunConfig,
    pub reads: usize,
    pub writes: usize,
    pub flushes: usize,
    pub faults: Vec<String>,
    /// Members rebuilt onto a blank drive and returned to service.
    pub members_rebuilt: usize,
    /// Members re-added (their own drive, the regions they missed rebuilt) and in service again.
    pub members_re_added: usize,
    /// Members that client reads read while they were rebuilt (below the rebuild's watermark).
    pub members_read_in_rebuild: usize,
    /// Members copied to a new drive that took their place.
    pub members_copied: usize,
    /// Consistency check jobs (runs of rows, repair mode, while clients wrote) that found every
    /// row consistent.
    pub checks: usize,
    /// What the background initialization did (runs over old data).
    pub bgi: BgiReport,
    /// Journal records the restarts replayed into the VD.
    pub journal_records_replayed: u64,
    /// The journal failed and was detached (the cache written out first).
    pub journal_detached: bool,
    /// A restart replayed records after a leg of the mirrored journal had failed.
    pub journal_leg_replayed: bool,
    pub images_replayed_degraded: bool,
    /// Reads served from clean data, and bytes read ahead, over all the run's engines.
    pub clean_hits: u64,
    pub read_ahead_bytes: u64,
    /// Write pieces that went around the journal (`cache::bypass`), over all the run's VDs.
    pub journal_bypassed_writes: u64,
    /// Rows written whole around the journal from a stream's write and the cached rest of the
    /// row (`cache::bypass::complete_row`).
    pub journal_completed_rows: u64,
    /// Bytes of WB writes' whole rows that went to the journal as row images, not cached.
    pub write_back_imaged_bytes: u64,
    /// Destage runs that wrote a parity row's scattered extents as one row write.
    pub scattered_destages: u64,
    pub crashes: Vec<CrashReport>,
}

impl RunReport {
    /// Whether some power cut came with client writes unflushed or tore drive writes.
    pub fn tore_writes(&self) -> bool {
        // Under write-back with a journal, acknowledged writes are durable in the journal and
        // no client write is left unflushed: what a crash tears there is the members' writes
        // of destaged data, which the replay and the resync must put right.
        self.crashes.iter().any(|c| c.unflushed_row_count > 0 || c.tally.torn > 0)
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        write!(
            f,
            "seed {}: {} over {} drives, strip {} KiB: {} writes, {} reads, {} flushes, faults: [{}], members rebuilt: {}, re-added: {}, read in rebuild: {}, copied: {}, checks: {}, BGI rows: {} (checkpoints {}, left at a crash {}, completed {}), crashes: {}",
            c.seed,
            c.level,
            c.drive_count,
            c.strip_size_bytes / KIB,
            self.writes,
            self.reads,
            self.flushes,
            self.faults.join(", "),
            self.members_rebuilt,
            self.members_re_added,
            self.members_read_in_rebuild,
            self.members_copied,
            self.checks,
            self.bgi.rows_done,
            self.bgi.checkpoints,
            self.bgi.left_at_crash,
            self.bgi.completed,
            self.crashes.len()
        )?;
        for crash in &self.crashes {
            write!(f, "\n  {crash}")?;
        }
        Ok(())
    }
}

/// A failing run: what went wrong and how to replay it.
#[derive(Debug)]
pub struct RunFailure {
    /// Boxed: a failure is rare, and the `Result` of every run should stay small.
    pub config: Box<RunConfig>,
    pub problem: String,
    pub faults: Vec<String>,
    pub crashes: Vec<CrashReport>,
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} FAILED ({:?}): {}\n  faults: [{}]\n  crashes so far: {}\n  replay: cargo run -p sim -- --seed {}",
            self.config.seed,
            self.config,
            self.problem,
            self.faults.join(", "),
            self.crashes.len(),
            self.config.seed
        )?;
        for crash in &self.crashes {
            write!(f, "\n  {crash}")?;
        }
        Ok(())
    }
}

/// Runs the configuration of `seed`.
///
/// # Errors
/// The first difference between the engine and the model, with the seed to replay it.
pub fn run_seed(seed: u64) -> Result<RunReport, RunFailure> {
    run(RunConfig::from_seed(seed))
}

/// Runs one configuration.
///
/// # Errors
/// The first difference between the engine and the model.
pub fn run(config: RunConfig) -> Result<RunReport, RunFailure> {
    let mut sim = run::Sim::new(config.clone());
    match sim.workload().and_then(|()| sim.verify_everything()) {
        Ok(()) => Ok(RunReport {
            clean_hits: sim.clean_stats().hits,
            read_ahead_bytes: sim.clean_stats().read_ahead_bytes,
            config,
            reads: sim.reads,
            writes: sim.writes,
            flushes: sim.flushes,
            faults: sim.faults,
            members_rebuilt: sim.members_rebuilt,
            members_re_added: sim.members_re_added,
            members_read_in_rebuild: sim.members_read_in_rebuild,
            checks: sim.checks_settled,
            bgi: sim.bgi_report,
            members_copied: sim.members_copied,
            journal_records_replayed: sim.journal.as_ref().map_or(0, |j| j.replayed_records),
            journal_detached: sim.journal.as_ref().is_some_and(|j| j.detached),
            journal_leg_replayed: sim.journal.as_ref().is_some_and(|j| j.replayed_after_leg_failed),
            images_replayed_degraded: sim.journal.as_ref().is_some_and(|j| j.images_replayed_degraded),
            journal_bypassed_writes: sim.bypassed_before + sim.vd.journal_bypass().bypassed().0,
            journal_completed_rows: sim.completed_rows_before + sim.vd.journal_bypass().completed_rows(),
            write_back_imaged_bytes: sim.write_back_imaged_before + sim.engine.cache_stats().imaged.write_back_bytes,
            scattered_destages: sim.scattered_destages_before + sim.engine.cache_stats().destage.scattered_runs,
            crashes: sim.crashes,
        }),
        Err(problem) => Err(RunFailure { config: Box::new(config), problem, faults: sim.faults, crashes: sim.crashes }),
    }
}

/// How many passing runs saw each kind of event, per level: what a range of seeds covered.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// By level, in [`layout::Level::ALL`] order.
    pub levels: Vec<LevelCoverage>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct LevelCoverage {
    pub runs: usize,
    /// Runs that rebuilt a member onto a blank drive and returned it to service.
    pub rebuilt: usize,
    /// Runs with at least one power cut.
    pub crashed: usize,
    /// Runs where a power cut dropped or tore unflushed client writes.
    pub tore_writes: usize,
    /// Runs where a power cut came while a member was being rebuilt.
    pub crashed_in_rebuild: usize,
    /// Runs whose resync repaired a row.
    pub resync_repaired: usize,
    /// Runs that re-added a member and returned it to service.
    pub re_added: usize,
    /// Runs where client reads read a member while it was being rebuilt.
    pub read_in_rebuild: usize,
    /// Runs with a consistency check job that completed while clients wrote.
    pub checked: usize,
    /// Runs that switched a member to its copy.
    pub copied: usize,
    /// Runs over old data whose BGI made rows consistent while clients wrote.
    pub bgi: usize,
    /// Runs whose BGI a crash interrupted with regions left, and that ended with it complete.
    pub bgi_crashed: usize,
    /// Runs whose restart replayed journal records into the VD.
    pub journal_replayed: usize,
    /// Runs whose journal failed and was detached amid the workload.
    pub journal_detached: usize,
    /// Runs that replayed a mirrored journal after one of its legs failed.
    pub journal_leg_replayed: usize,
    /// Runs whose restart wrote row images back while a member was out (the write hole).
    pub images_replayed_degraded: usize,
    /// Runs where reads were served from clean data.
    pub clean_hits: usize,
    /// Runs that read ahead.
    pub read_ahead: usize,
    /// Runs where writes went around the journal.
    pub journal_bypassed: usize,
    /// Runs where a stream's write completed a cached row around the journal.
    pub rows_completed: usize,
    /// Runs where WB writes' whole rows went to the journal as row images, not cached.
    pub write_back_imaged: usize,
    /// Runs where the destager wrote a parity row's scattered extents as one row write.
    pub scattered: usize,
}

impl Coverage {
    pub fn new() -> Coverage {
        Coverage { levels: vec![LevelCoverage::default(); layout::Level::ALL.len()] }
    }

    pub fn add(&mut self, report: &RunReport) {
        let index = layout::Level::ALL.iter().position(|&l| l == report.config.level).expect("a level of ALL");
        let level = &mut self.levels[index];
        level.runs += 1;
        level.rebuilt += usize::from(report.members_rebuilt > 0);
        level.crashed += usize::from(!report.crashes.is_empty());
        level.tore_writes += usize::from(report.tore_writes());
        level.crashed_in_rebuild += usize::from(report.crashes.iter().any(|c| c.rebuild_resumed.is_some()));
        level.resync_repaired += usize::from(report.crashes.iter().any(|c| !c.resync.rows_repaired.is_empty()));
        level.re_added += usize::from(report.members_re_added > 0);
        level.read_in_rebuild += usize::from(report.members_read_in_rebuild > 0);
        level.checked += usize::from(report.checks > 0);
        level.copied += usize::from(report.members_copied > 0);
        level.bgi += usize::from(report.bgi.rows_done > 0);
        level.bgi_crashed += usize::from(report.bgi.left_at_crash > 0 && report.bgi.completed);
        level.journal_replayed += usize::from(report.journal_records_replayed > 0);
        level.journal_detached += usize::from(report.journal_detached);
        level.journal_leg_replayed += usize::from(report.journal_leg_replayed);
        level.images_replayed_degraded += usize::from(report.images_replayed_degraded);
        level.clean_hits += usize::from(report.clean_hits > 0);
        level.read_ahead += usize::from(report.read_ahead_bytes > 0);
        level.journal_bypassed += usize::from(report.journal_bypassed_writes > 0);
        level.rows_completed += usize::from(report.journal_completed_rows > 0);
        level.write_back_imaged += usize::from(report.write_back_imaged_bytes > 0);
        level.scattered += usize::from(report.scattered_destages > 0);
    }

    pub fn of(&self, level: layout::Level) -> LevelCoverage {
        self.levels[layout::Level::ALL.iter().position(|&l| l == level).expect("a level of ALL")]
    }
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "level    runs  rebuilt  re-added  read-in-rbld  copied  checked  bgi  bgi-crashed  crashed  tore-writes  crashed-in-rebuild  resync-repaired  journal-replayed  journal-detached  leg-replayed  images-degraded  clean-hits  read-ahead  bypassed  completed  wb-imaged  scattered"
        )?;
        for (level, c) in layout::Level::ALL.iter().zip(&self.levels) {
            writeln!(
                f,
                "{:<7} {:>5} {:>8} {:>9} {:>13} {:>7} {:>8} {:>4} {:>12} {:>8} {:>12} {:>19} {:>16} {:>17} {:>17} {:>13} {:>16} {:>11} {:>11} {:>9} {:>10} {:>10} {:>10}",
                level.to_string(),
                c.runs,
                c.rebuilt,
                c.re_added,
                c.read_in_rebuild,
                c.copied,
                c.checked,
                c.bgi,
                c.bgi_crashed,
                c.crashed,
                c.tore_writes,
                c.crashed_in_rebuild,
                c.resync_repaired,
                c.journal_replayed,
                c.journal_detached,
                c.journal_leg_replayed,
                c.images_replayed_degraded,
                c.clean_hits,
                c.read_ahead,
                c.journal_bypassed,
                c.rows_completed,
                c.write_back_imaged,
                c.scattered
            )?;
        }
        Ok(())
    }
}

/// Runs seeds `0..runs` with `run`, on as many threads as there are cores; returns the
/// reports of the runs that passed and the failures (as text), each in no particular order.
pub fn run_seeds_in_parallel<R: Send, E: std::fmt::Display>(runs: u64, run: impl Fn(u64) -> Result<R, E> + Sync) -> (Vec<R>, Vec<String>) {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    run_seeds_on_threads(runs, cores, run)
}

/// [`run_seeds_in_parallel`] on `threads` threads: more than the cores for runs that mostly
/// wait (the threaded engine's). A run that panics is a failure that names its seed, and the
/// other runs go on.
pub fn run_seeds_on_threads<R: Send, E: std::fmt::Display>(
    runs: u64,
    threads: usize,
    run: impl Fn(u64) -> Result<R, E> + Sync,
) -> (Vec<R>, Vec<String>) {
    let next = std::sync::atomic::AtomicU64::new(0);
    let results = std::sync::Mutex::new((Vec::new(), Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= runs {
                    return;
                }
                let outcome = run_caught(seed, &run);
                let mut results = results.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match outcome {
                    Ok(report) => results.0.push(report),
                    Err(failure) => results.1.push(failure),
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs seed `seed` with `run`; a panic is a failure that names the seed, as an error is.
///
/// # Errors
/// What the run returned, as text, or what it panicked with.
pub fn run_caught<R, E: std::fmt::Display>(seed: u64, run: impl FnOnce(u64) -> Result<R, E>) -> Result<R, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed))) {
        Ok(outcome) => outcome.map_err(|failure| failure.to_string()),
        Err(panic) => Err(format!("seed {seed} panicked: {}", panic_text(&*panic))),
    }
}

/// What a panic said, when it said it with text.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    /// A run that panics is a failure naming its seed; the other runs still report.
    #[test]
    fn a_panicking_run_is_a_failure_that_names_its_seed() {
        let (reports, failures) = super::run_seeds_on_threads(8, 3, |seed| match seed {
            5 => panic!("member 2 is Failed, not Rebuilding"),
            6 => Err(format!("seed {seed}: wrong data")),
            _ => Ok(seed),
        });
        let mut reports = reports;
        reports.sort_unstable();
        assert_eq!(reports, vec![0, 1, 2, 3, 4, 7]);
        let mut failures = failures;
        failures.sort();
        assert_eq!(failures, vec!["seed 5 panicked: member 2 is Failed, not Rebuilding".to_string(), "seed 6: wrong data".to_string()]);
    }
}
