//! The deterministic simulator.
//!
//! One run is a pure function of its seed: the seed picks a level, a drive count, a strip size
//! and a workload, and it orders every drive completion (through [`engine::CompletionOrder`]),
//! so a failing seed replays exactly with `storc-sim --seed N`.
//!
//! A run drives the real engine paths ([`engine::LocalEngine`]) over memory drives wrapped in
//! fault injection, and checks every read against a reference model: a plain byte vector to
//! which each write is applied when it is submitted. Writes may overlap writes in flight (the
//! engine serialises them per row in submission order); reads never overlap a write in flight,
//! since their result would then legitimately be either value. While it runs, members fail
//! whole or return read or write errors, never more than the level tolerates. At the end the
//! whole VD is read back, and then read again with each remaining member taken out in turn, so
//! that parity or a mirror copy that was written wrong cannot hide behind a healthy member.
//!
//! In some runs one member is replaced by a blank drive part-way and rebuilt row by row while
//! the workload goes on (rows taken in order, interleaved with client I/O in seeded order), as a
//! hot spare is. After the workload the rest of the rows are rebuilt and the member returns to
//! service, and the final reads with each other member taken out prove what it holds.

pub mod drive;
pub mod model;

use ::drive::{Drive, FaultyDrive, IoBuf, MemDrive};
use engine::{CompletionOrder, LocalEngine, MemberState, VdCompletion, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, SECTOR_BYTES};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::fmt;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

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
    /// The operation at which a member is replaced by a blank drive and rebuilt (redundant
    /// levels only).
    pub rebuild_at_operation: Option<usize>,
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
        RunConfig {
            seed,
            level,
            drive_count,
            drives_per_span,
            strip_size_bytes,
            rows_per_member: rng.gen_range(2..6),
            operation_count,
            in_flight_max: rng.gen_range(1..24),
            fault_per_mille: [0, 10, 30][rng.gen_range(0..3)],
            rebuild_at_operation,
        }
    }
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

/// What a passing run did.
#[derive(Debug)]
pub struct RunReport {
    pub config: RunConfig,
    pub reads: usize,
    pub writes: usize,
    pub faults: Vec<String>,
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        write!(
            f,
            "seed {}: {} over {} drives, strip {} KiB: {} writes, {} reads, faults: [{}]",
            c.seed,
            c.level,
            c.drive_count,
            c.strip_size_bytes / KIB,
            self.writes,
            self.reads,
            self.faults.join(", ")
        )
    }
}

/// A failing run: what went wrong and how to replay it.
#[derive(Debug)]
pub struct RunFailure {
    pub config: RunConfig,
    pub problem: String,
    pub faults: Vec<String>,
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} FAILED ({:?}): {}\n  faults: [{}]\n  replay: cargo run -p sim -- --seed {}",
            self.config.seed,
            self.config,
            self.problem,
            self.faults.join(", "),
            self.config.seed
        )
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
    let mut sim = Sim::new(config.clone());
    match sim.workload().and_then(|()| sim.verify_everything()) {
        Ok(()) => Ok(RunReport { config, reads: sim.reads, writes: sim.writes, faults: sim.faults }),
        Err(problem) => Err(RunFailure { config, problem, faults: sim.faults }),
    }
}

/// An operation in flight: its range and, for reads, the bytes the model expects.
struct InFlight {
    range: Range<u64>,
    write: bool,
}

type Outcomes = Rc<RefCell<Vec<(usize, VdCompletion)>>>;

struct Sim {
    config: RunConfig,
    rng: SmallRng,
    engine: LocalEngine,
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
    model: Vec<u8>,
    in_flight: Vec<Option<InFlight>>,
    expected_reads: Vec<Option<Vec<u8>>>,
    outcomes: Outcomes,
    /// Members that are failed or carry an injected fault: they count against the tolerance.
    at_risk: Vec<bool>,
    faults: Vec<String>,
    reads: usize,
    writes: usize,
    rebuild: Option<Rebuild>,
}

/// A member being rebuilt onto a blank drive while the workload runs.
struct Rebuild {
    member: usize,
    /// The next row to rebuild; rows below it are done.
    next_row: u64,
    /// A row job in flight (one at a time), and its outcome once it arrived.
    in_flight: bool,
    outcome: Rc<RefCell<Option<Result<(), engine::VdError>>>>,
    /// A row that could not be rebuilt (its sources hit injected read errors): the member then
    /// never returns to service.
    unrecoverable: bool,
}

impl Sim {
    fn new(config: RunConfig) -> Sim {
        let rows_bytes = config.rows_per_member * config.strip_size_bytes;
        let physical_rows_bytes = if config.level == Level::Raid1E { 2 * rows_bytes } else { rows_bytes };
        let member_bytes = MEMBER_RESERVED_BYTES + physical_rows_bytes;
        let drives: Vec<Arc<FaultyDrive>> =
            (0..config.drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(member_bytes))))).collect();
        let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
        let layout = VdLayout {
            level: config.level,
            strip_size_bytes: config.strip_size_bytes,
            drives_per_span: config.drives_per_span,
            member_size_bytes: None,
        };
        let vd = Arc::new(VirtualDrive::new(config.seed, "sim", layout, members).expect("the seed picks a valid layout"));
        let capacity = vd.capacity_bytes() as usize;
        Sim {
            rng: SmallRng::seed_from_u64(config.seed),
            engine: LocalEngine::new(CompletionOrder::seeded(config.seed.wrapping_mul(31))),
            at_risk: vec![false; config.drive_count],
            config,
            vd,
            drives,
            model: vec![0; capacity],
            in_flight: Vec::new(),
            expected_reads: Vec::new(),
            outcomes: Rc::new(RefCell::new(Vec::new())),
            faults: Vec::new(),
            reads: 0,
            writes: 0,
            rebuild: None,
        }
    }

    fn workload(&mut self) -> Result<(), String> {
        for operation in 0..self.config.operation_count {
            while self.in_flight_count() >= self.config.in_flight_max {
                self.step()?;
            }
            if self.rng.gen_range(0..1000) < self.config.fault_per_mille {
                self.inject_fault();
            }
            if self.config.rebuild_at_operation == Some(operation) {
                self.start_rebuild();
            }
            self.rebuild_some()?;
            self.submit_random();
            // Let the engine make some progress between submissions, sometimes none.
            for _ in 0..self.rng.gen_range(0..3) {
                self.step()?;
            }
        }
        while self.in_flight_count() > 0 {
            self.step()?;
        }
        self.finish_rebuild()
    }

    /// Replaces a member that the VD can spare by a blank drive and starts rebuilding it.
    fn start_rebuild(&mut self) {
        let spare = (0..self.config.drive_count).filter(|&m| !self.at_risk[m]).find(|&m| {
            let mut with = self.at_risk.clone();
            with[m] = true;
            self.vd.geometry().survives(&with)
        });
        let Some(member) = spare else { return };
        self.at_risk[member] = true;
        let capacity_bytes = self.drives[member].info().capacity_bytes;
        let blank = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(capacity_bytes))));
        self.drives[member] = Arc::clone(&blank);
        // Out of service first (no I/O may be on its way to the old drive), then the new one.
        self.vd.set_member_state(member, MemberState::Failed);
        self.vd.start_rebuild(member, blank);
        self.faults.push(format!("member {member} replaced by a blank drive and rebuilt"));
        let outcome = Rc::new(RefCell::new(None));
        self.rebuild = Some(Rebuild { member, next_row: 0, in_flight: false, outcome, unrecoverable: false });
    }

    /// Settles the rebuild's row job if it finished, and sometimes submits the next row.
    fn rebuild_some(&mut self) -> Result<(), String> {
        let Some(rebuild) = &mut self.rebuild else { return Ok(()) };
        let arrived = rebuild.outcome.borrow_mut().take();
        if let Some(result) = arrived {
            rebuild.in_flight = false;
            settle_row(rebuild, result, &self.faults)?;
        }
        let row_count = self.vd.geometry().row_count();
        if rebuild.in_flight || rebuild.next_row >= row_count || !self.rng.gen_bool(0.5) {
            return Ok(());
        }
        let (row, targets, outcome) = (rebuild.next_row, engine::MemberSet::of(&[rebuild.member]), Rc::clone(&rebuild.outcome));
        rebuild.in_flight = true;
        self.engine.rebuild_row(&self.vd, row, targets, move |result| *outcome.borrow_mut() = Some(result));
        Ok(())
    }

    /// Rebuilds the rows left, then returns the member to service if every row was rebuilt.
    fn finish_rebuild(&mut self) -> Result<(), String> {
        let Some(mut rebuild) = self.rebuild.take() else { return Ok(()) };
        self.engine.run_until_idle();
        let arrived = rebuild.outcome.borrow_mut().take();
        if let Some(result) = arrived {
            settle_row(&mut rebuild, result, &self.faults)?;
        }
        let targets = engine::MemberSet::of(&[rebuild.member]);
        while rebuild.next_row < self.vd.geometry().row_count() {
            let result = self.engine.run_rebuild_row(&self.vd, rebuild.next_row, targets);
            settle_row(&mut rebuild, result, &self.faults)?;
        }
        if !rebuild.unrecoverable && self.vd.member(rebuild.member).state() == MemberState::Rebuilding {
            self.vd.finish_rebuild(rebuild.member);
            // The blank drive has no injected faults: it is as good as new.
            self.at_risk[rebuild.member] = false;
        }
        Ok(())
    }

    fn in_flight_count(&self) -> usize {
        self.in_flight.iter().filter(|op| op.is_some()).count()
    }

    /// A random sector-aligned range: mostly small, sometimes several rows, never strip-aligned
    /// on purpose.
    fn random_range(&mut self) -> Range<u64> {
        let capacity = self.model.len() as u64;
        let row_bytes = self.vd.geometry().row_data_bytes();
        let max_len = match self.rng.gen_range(0..10) {
            0..=5 => 16 * KIB,
            6..=8 => row_bytes,
            _ => 3 * row_bytes,
        }
        .min(capacity);
        let len = self.rng.gen_range(1..=max_len / SECTOR_BYTES) * SECTOR_BYTES;
        let start = self.rng.gen_range(0..=(capacity - len) / SECTOR_BYTES) * SECTOR_BYTES;
        start..start + len
    }

    fn overlaps_in_flight(&self, range: &Range<u64>, writes_only: bool) -> bool {
        self.in_flight.iter().flatten().any(|op| (op.write || !writes_only) && op.range.start < range.end && range.start < op.range.end)
    }

    fn submit_random(&mut self) {
        for _ in 0..8 {
            let range = self.random_range();
            let write = self.rng.gen_bool(0.55);
            // A write may overlap writes in flight but not reads; a read overlaps no write.
            let conflict = if write {
                self.in_flight.iter().flatten().any(|op| !op.write && op.range.start < range.end && range.start < op.range.end)
            } else {
                self.overlaps_in_flight(&range, true)
            };
            if !conflict {
                return self.submit(range, write);
            }
        }
    }

    fn submit(&mut self, range: Range<u64>, write: bool) {
        let id = self.in_flight.len();
        let (start, end) = (range.start as usize, range.end as usize);
        let request = if write {
            let data: Vec<u8> = (0..end - start).map(|_| self.rng.gen()).collect();
            self.model[start..end].copy_from_slice(&data);
            self.expected_reads.push(None);
            self.writes += 1;
            VdRequest::Write { offset_bytes: range.start, buf: IoBuf::from_slice(&data) }
        } else {
            self.expected_reads.push(Some(self.model[start..end].to_vec()));
            self.reads += 1;
            VdRequest::Read { offset_bytes: range.start, buf: IoBuf::zeroed(end - start) }
        };
        self.in_flight.push(Some(InFlight { range, write }));
        let outcomes = Rc::clone(&self.outcomes);
        self.engine.submit(&self.vd, request, move |completion| outcomes.borrow_mut().push((id, completion)));
    }

    /// Advances the engine one turn and checks whatever completed.
    fn step(&mut self) -> Result<(), String> {
        self.engine.step();
        let finished: Vec<(usize, VdCompletion)> = self.outcomes.borrow_mut().drain(..).collect();
        for (id, completion) in finished {
            let op = self.in_flight[id].take().expect("completed once");
            self.check(id, &op, completion)?;
        }
        Ok(())
    }

    fn check(&mut self, id: usize, op: &InFlight, completion: VdCompletion) -> Result<(), String> {
        let what = format!("{} {}+{}", if op.write { "write" } else { "read" }, op.range.start, op.range.end - op.range.start);
        if let Err(error) = completion.result {
            return Err(format!("{what} failed with faults within tolerance ({:?}): {error}", self.at_risk));
        }
        let Some(expected) = self.expected_reads[id].take() else { return Ok(()) };
        let got = completion.buf.expect("a read returns its buffer");
        compare(got.as_slice(), &expected, op.range.start).map_err(|diff| format!("{what}: {diff}"))
    }

    /// Fails a member, or gives it read or write errors in a range, if the VD survives it.
    fn inject_fault(&mut self) {
        let member = self.rng.gen_range(0..self.config.drive_count);
        if self.at_risk[member] {
            return;
        }
        let mut with = self.at_risk.clone();
        with[member] = true;
        if !self.vd.geometry().survives(&with) {
            return;
        }
        self.at_risk[member] = true;
        let used = self.vd.geometry().member_used_bytes();
        let start = self.rng.gen_range(MEMBER_RESERVED_BYTES / SECTOR_BYTES..used / SECTOR_BYTES) * SECTOR_BYTES;
        let range = start..(start + self.rng.gen_range(1..64) * SECTOR_BYTES).min(used);
        let kind = self.rng.gen_range(0..3);
        let drive = &self.drives[member];
        let description = match kind {
            0 => {
                drive.set_failed(true);
                format!("member {member} failed")
            }
            1 => {
                drive.update_faults(|f| f.read_error_ranges.push(range.clone()));
                format!("member {member} read errors {range:?}")
            }
            _ => {
                drive.update_faults(|f| f.write_error_ranges.push(range.clone()));
                format!("member {member} write errors {range:?}")
            }
        };
        self.faults.push(description);
    }

    /// Reads the whole VD, then again with each member that can still be spared taken out.
    fn verify_everything(&mut self) -> Result<(), String> {
        self.read_all("final read")?;
        for member in 0..self.config.drive_count {
            let mut with = self.at_risk.clone();
            if with[member] {
                continue;
            }
            with[member] = true;
            if !self.vd.geometry().survives(&with) {
                continue;
            }
            self.vd.set_member_state(member, MemberState::Failed);
            self.read_all(&format!("read without member {member}"))?;
            // Nothing was written meanwhile, so the member's contents are still current.
            self.vd.set_member_state(member, MemberState::Online);
        }
        Ok(())
    }

    fn read_all(&mut self, what: &str) -> Result<(), String> {
        let capacity = self.model.len();
        let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes: 0, buf: IoBuf::zeroed(capacity) });
        if let Err(error) = done.result {
            return Err(format!("{what}: {error}"));
        }
        compare(done.buf.expect("read buffer").as_slice(), &self.model, 0).map_err(|diff| format!("{what}: {diff}"))
    }
}

/// Books one rebuilt row: done, or not rebuildable because injected read errors took the only
/// other copy (allowed only when such faults were injected), or a failure of the run.
fn settle_row(rebuild: &mut Rebuild, result: Result<(), engine::VdError>, faults: &[String]) -> Result<(), String> {
    let row = rebuild.next_row;
    rebuild.next_row += 1;
    match result {
        Ok(()) => Ok(()),
        Err(engine::VdError::RowUnrecoverable { .. } | engine::VdError::RowMemberIo { .. }) if faults.len() > 1 => {
            rebuild.unrecoverable = true;
            Ok(())
        }
        Err(error) => Err(format!("rebuild of member {} failed at row {row}: {error}", rebuild.member)),
    }
}

/// Names the first differing byte by its VD offset.
fn compare(got: &[u8], expected: &[u8], vd_offset: u64) -> Result<(), String> {
    match got.iter().zip(expected).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "wrong data at VD byte {} (got {:#04x}, model has {:#04x}); {} of {} bytes differ",
            vd_offset + i as u64,
            got[i],
            expected[i],
            got.iter().zip(expected).filter(|(a, b)| a != b).count(),
            got.len()
        )),
    }
}
