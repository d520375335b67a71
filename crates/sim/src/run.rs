//! One run: the seeded workload, faults and member replacement against the model, and the
//! final verification. Crashes and restarts are in `crash`.

use crate::config::RunConfig;
use crate::crash::CrashReport;
use crate::drive::VolatileDrive;
use crate::intent::{self, CleanOutcome};
use crate::model::{FlushCovers, Model, WriteId};
use crate::rebuild::Rebuild;
use drive::{Drive, FaultyDrive, IoBuf};
use engine::{CompletionOrder, LocalEngine, MemberState, VdCompletion, VdError, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, SECTOR_BYTES};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

/// A request in flight and what the model needs when it completes.
pub(crate) enum Op {
    /// A read, the rows of it that could rightly be refused when it was submitted, and the
    /// model's settles before it was submitted ([`Model::settles`]).
    Read(Range<u64>, Vec<u64>, u64),
    Write(Range<u64>, WriteId),
    Flush(FlushCovers),
}

pub(crate) type Outcomes = Rc<RefCell<Vec<(usize, VdCompletion)>>>;

/// One member's drive: fault injection over a volatile write cache.
pub(crate) struct SimDrive {
    pub faulty: Arc<FaultyDrive>,
    pub cache: Arc<VolatileDrive>,
}

impl SimDrive {
    pub(crate) fn blank(capacity_bytes: u64) -> SimDrive {
        let cache = Arc::new(VolatileDrive::new(capacity_bytes));
        SimDrive { faulty: Arc::new(FaultyDrive::new(Arc::clone(&cache) as Arc<dyn Drive>)), cache }
    }
}

pub(crate) struct Sim {
    pub config: RunConfig,
    pub rng: SmallRng,
    pub layout: VdLayout,
    pub engine: LocalEngine,
    /// The clean cache's counters of the engines that crashed.
    pub clean_before: engine::cache::clean::CleanStats,
    pub vd: Arc<VirtualDrive>,
    pub drives: Vec<SimDrive>,
    pub model: Model,
    /// By request id; `None` once completed (or abandoned by a crash).
    pub in_flight: Vec<Option<Op>>,
    pub outcomes: Outcomes,
    /// Members that are failed or carry an injected fault: they count against the tolerance.
    pub at_risk: Vec<bool>,
    pub faults: Vec<String>,
    pub reads: usize,
    pub writes: usize,
    pub flushes: usize,
    pub rebuild: Option<Rebuild>,
    /// Members rebuilt onto a blank drive and returned to service.
    pub members_rebuilt: usize,
    /// Members re-added (their own drive) and returned to service.
    pub members_re_added: usize,
    /// Members that client reads read while they were being rebuilt (rows below the watermark).
    pub members_read_in_rebuild: usize,
    /// A member taken out of service, to be re-added.
    pub out_for_re_add: Option<usize>,
    /// A member being copied to a new drive (copyback, proactive replacement).
    pub copy: Option<crate::copy::Copy>,
    /// Members switched to their copy.
    pub members_copied: usize,
    pub crashes: Vec<CrashReport>,
    /// The bitmap's clean pass in flight, if any.
    pub clean: Option<CleanOutcome>,
    /// Clean passes that completed.
    pub clean_passes: usize,
    /// The consistency check job in flight, if any.
    pub check: Option<crate::check::Check>,
    /// Check jobs that completed, every row consistent.
    pub checks_settled: usize,
    /// The background initialization, while it is pending (runs over old data only).
    pub bgi: Option<crate::bgi::Bgi>,
    pub bgi_report: crate::bgi::BgiReport,
    /// The cache's journal, if the run has one.
    pub journal: Option<crate::cache::SimJournal>,
    /// Where the stream's last write ended: its next write starts there, whatever random
    /// writes came in between (so that its writes complete the rows its previous ones left).
    pub last_write_end: u64,
    /// Writes that went around the journal on VD objects of earlier engines (before restarts).
    pub bypassed_before: u64,
    /// Rows completed around the journal (`cache::bypass::complete_row`), likewise.
    pub completed_rows_before: u64,
    /// Bytes of WB writes' whole rows that took the imaged path, in the engines before this one.
    pub write_back_imaged_before: u64,
    /// Destage runs that went as one scattered row write, in the engines before this one.
    pub scattered_destages_before: u64,
    /// `STORC_SIM_TRACE` is set: print the run as it goes.
    pub trace: bool,
}

impl Sim {
    pub fn new(config: RunConfig) -> Sim {
        let rows_bytes = config.rows_per_member * config.strip_size_bytes;
        let physical_rows_bytes = if config.level == Level::Raid1E { 2 * rows_bytes } else { rows_bytes };
        let member_bytes = MEMBER_RESERVED_BYTES + physical_rows_bytes;
        let drives: Vec<SimDrive> = (0..config.drive_count).map(|_| SimDrive::blank(member_bytes)).collect();
        let members = drives.iter().map(|d| Arc::clone(&d.faulty) as Arc<dyn Drive>).collect();
        let layout = VdLayout {
            level: config.level,
            strip_size_bytes: config.strip_size_bytes,
            drives_per_span: config.drives_per_span,
            member_size_bytes: Some(member_bytes),
        };
        let vd = Arc::new(VirtualDrive::new(config.seed, "sim", layout, members).expect("the seed picks a valid layout"));
        let opening = match config.bgi {
            true => {
                crate::bgi::fill_with_old_data(&drives, vd.geometry(), config.seed);
                engine::bitmap::control::Opening::CreatedOverData
            }
            false => engine::bitmap::control::Opening::CreatedZeroed,
        };
        intent::open(&vd, config.seed, config.rows_per_region, opening);
        let model = match config.bgi {
            true => {
                let (image, floating) = crate::bgi::image_of(&vd);
                Model::with_image(image, floating)
            }
            false => Model::new(vd.capacity_bytes() as usize),
        };
        let bgi = if config.bgi { crate::bgi::Bgi::start(&vd) } else { None };
        Sim {
            rng: SmallRng::seed_from_u64(config.seed),
            engine: LocalEngine::new(CompletionOrder::seeded(config.seed.wrapping_mul(31))),
            clean_before: Default::default(),
            at_risk: vec![false; config.drive_count],
            model,
            config,
            layout,
            vd,
            drives,
            in_flight: Vec::new(),
            outcomes: Rc::new(RefCell::new(Vec::new())),
            faults: Vec::new(),
            reads: 0,
            writes: 0,
            flushes: 0,
            rebuild: None,
            members_rebuilt: 0,
            members_re_added: 0,
            members_read_in_rebuild: 0,
            out_for_re_add: None,
            copy: None,
            members_copied: 0,
            crashes: Vec::new(),
            clean: None,
            clean_passes: 0,
            check: None,
            checks_settled: 0,
            bgi,
            bgi_report: Default::default(),
            journal: None,
            last_write_end: 0,
            bypassed_before: 0,
            completed_rows_before: 0,
            write_back_imaged_before: 0,
            scattered_destages_before: 0,
            trace: std::env::var_os("STORC_SIM_TRACE").is_some(),
        }
    }

    pub fn workload(&mut self) -> Result<(), String> {
        self.start_cache()?;
        let trace = self.trace;
        if trace {
            eprintln!("{:?}", self.config);
        }
        for operation in 0..self.config.operation_count {
            if trace {
                eprintln!("op {operation}: in flight {}, dirty {}", self.in_flight_count(), self.engine.dirty_bytes());
            }
            self.journal_some(operation)?;
            self.journal_leg_some(operation);
            if self.config.crash_at_operations.contains(&operation) {
                self.crash_and_restart(operation)?;
            }
            while self.in_flight_count() >= self.config.in_flight_max {
                self.step()?;
            }
            if self.rng.gen_range(0..1000) < self.config.fault_per_mille {
                self.inject_fault();
            }
            if self.config.rebuild_at_operation == Some(operation) {
                self.start_rebuild();
            }
            if self.config.copy_at_operation == Some(operation) {
                self.start_copy();
            }
            match self.config.re_add_at_operations {
                Some((out, _)) if out == operation => self.take_out_for_re_add(),
                Some((_, back)) if back == operation => self.re_add(),
                _ => {}
            }
            self.rebuild_some()?;
            self.copy_some()?;
            self.clean_some()?;
            self.check_some()?;
            self.bgi_some()?;
            self.submit_random();
            if self.rng.gen_bool(0.2) {
                self.engine.tick();
            }
            // Let the engine make some progress between submissions, sometimes none.
            for _ in 0..self.rng.gen_range(0..3) {
                self.step()?;
            }
        }
        while self.in_flight_count() > 0 {
            self.step()?;
        }
        self.finish_check()?;
        self.finish_bgi()?;
        self.finish_rebuild()?;
        self.finish_copy()
    }

    pub fn in_flight_count(&self) -> usize {
        self.in_flight.iter().filter(|op| op.is_some()).count()
    }

    /// A random sector-aligned range: mostly small, sometimes several rows, never strip-aligned
    /// on purpose.
    fn random_range(&mut self) -> Range<u64> {
        let capacity = self.model.capacity_bytes();
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

    /// One to two rows from where the last write ended (from the start once that is too near
    /// the end): a sequential stream's next write, long enough to go around the journal.
    fn stream_range(&mut self) -> Range<u64> {
        let capacity = self.model.capacity_bytes();
        let row_bytes = self.vd.geometry().row_data_bytes();
        let len = (self.rng.gen_range(row_bytes / SECTOR_BYTES..=2 * row_bytes / SECTOR_BYTES) * SECTOR_BYTES).min(capacity);
        let start = if self.last_write_end + len <= capacity { self.last_write_end } else { 0 };
        start..start + len
    }

    /// Whether a request in flight of the kind `writes` (or any kind) overlaps `range`.
    fn overlaps_in_flight(&self, range: &Range<u64>, writes: bool) -> bool {
        self.in_flight.iter().flatten().any(|op| match op {
            Op::Write(r, _) => r.start < range.end && range.start < r.end,
            Op::Read(r, ..) => !writes && r.start < range.end && range.start < r.end,
            Op::Flush(_) => false,
        })
    }

    pub fn submit_random(&mut self) {
        if self.rng.gen_range(0..1000) < self.config.flush_per_mille {
            return self.submit_flush();
        }
        for _ in 0..8 {
            let write = self.rng.gen_bool(0.55);
            let stream = write && self.config.journal_bypass && self.rng.gen_bool(0.4);
            let range = match stream {
                true => self.stream_range(),
                false => self.random_range(),
            };
            // A write may overlap writes in flight but not reads; a read overlaps no write.
            let reads_only = |op: &Op| matches!(op, Op::Read(r, ..) if r.start < range.end && range.start < r.end);
            let conflict = if write {
                self.in_flight.iter().flatten().any(reads_only) || self.touches_unsynced(&range)
            } else {
                self.overlaps_in_flight(&range, true)
            };
            if !conflict {
                if write && stream {
                    self.last_write_end = range.end;
                }
                return if write { self.submit_write(range) } else { self.submit_read(range) };
            }
        }
    }

    /// Whether `range` touches a row left unsynced by a restart. A write there may need the
    /// row's stale parity (a degraded read-modify-write) and be refused: a client that got EIO
    /// there writes elsewhere, which keeps the model free of writes that may or may not have
    /// landed.
    fn touches_unsynced(&self, range: &Range<u64>) -> bool {
        let row_bytes = self.vd.geometry().row_data_bytes();
        self.vd.write_intent().is_some_and(|i| i.unsynced_count() > 0)
            && (range.start / row_bytes..range.end.div_ceil(row_bytes)).any(|row| self.row_unsynced(row))
    }

    fn submit_write(&mut self, range: Range<u64>) {
        let mut data = vec![0u8; (range.end - range.start) as usize];
        self.rng.fill(&mut data[..]);
        let id = self.model.submit_write(range.start, &data);
        self.writes += 1;
        self.submit(Op::Write(range.clone(), id), VdRequest::Write { offset_bytes: range.start, buf: IoBuf::from_slice(&data) });
    }

    pub fn submit_read(&mut self, range: Range<u64>) {
        self.reads += 1;
        let request = VdRequest::Read { offset_bytes: range.start, buf: IoBuf::zeroed((range.end - range.start) as usize) };
        let refusable = self.refusable_rows(&range);
        let settles = self.model.settles();
        self.submit(Op::Read(range, refusable, settles), request);
    }

    pub fn submit_flush(&mut self) {
        self.flushes += 1;
        self.submit(Op::Flush(self.model.submit_flush()), VdRequest::Flush);
    }

    fn submit(&mut self, op: Op, request: VdRequest) {
        let id = self.in_flight.len();
        if self.trace {
            eprintln!("  submit #{id}: {}", describe(&op));
        }
        self.in_flight.push(Some(op));
        let outcomes = Rc::clone(&self.outcomes);
        self.engine.submit(&self.vd, request, move |completion| outcomes.borrow_mut().push((id, completion)));
    }

    /// Advances the engine one turn and checks whatever completed.
    pub fn step(&mut self) -> Result<(), String> {
        self.engine.step();
        let finished: Vec<(usize, VdCompletion)> = self.outcomes.borrow_mut().drain(..).collect();
        for (id, completion) in finished {
            let op = self.in_flight[id].take().expect("completed once");
            if self.trace {
                eprintln!("  done #{id}: {} {:?}", describe(&op), completion.result.as_ref().map(|_| ()));
            }
            self.check(op, completion)?;
        }
        Ok(())
    }

    fn check(&mut self, op: Op, completion: VdCompletion) -> Result<(), String> {
        let what = describe(&op);
        if let (Op::Read(range, refusable_at_submit, _), Err(VdError::RowNotResynced { row, .. })) = (&op, &completion.result) {
            // Right if it was right when the read began or is now: the engine decides in
            // between, and a rebuild and resync may have ended meanwhile.
            return match self.refusal_is_correct(*row, None) || refusable_at_submit.contains(row) {
                true => Ok(()),
                false => Err(format!(
                    "{what} refused (row {row} not resynced) though it needs no stale parity ({} bytes)",
                    range.end - range.start
                )),
            };
        }
        if let Err(error) = completion.result {
            let states: Vec<MemberState> = (0..self.drives.len()).map(|m| self.vd.member(m).state()).collect();
            return Err(format!("{what} failed with faults within tolerance (at risk {:?}, members {states:?}): {error}", self.at_risk));
        }
        match op {
            Op::Read(range, _, settles_before) => {
                let got = completion.buf.expect("a read returns its buffer");
                self.model.check_read_begun(range.start, got.as_slice(), settles_before).map_err(|diff| format!("{what}: {diff}"))
            }
            Op::Write(_, id) => {
                self.model.complete_write(id);
                if self.acknowledged_is_durable() {
                    self.model.make_durable(id);
                }
                Ok(())
            }
            Op::Flush(covers) => {
                self.model.complete_flush(covers);
                Ok(())
            }
        }
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
        let drive = &self.drives[member].faulty;
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
        if std::env::var_os("STORC_SIM_TRACE").is_some() {
            eprintln!("  fault: {description}");
        }
        self.faults.push(description);
    }

    /// Reads `range` and checks it against the model.
    pub(crate) fn read_checked(&mut self, range: Range<u64>) -> Result<(), ReadProblem> {
        let len_bytes = (range.end - range.start) as usize;
        let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes: range.start, buf: IoBuf::zeroed(len_bytes) });
        match done.result {
            Err(VdError::RowNotResynced { .. }) => Err(ReadProblem::Refused),
            Err(error) => Err(ReadProblem::Other(error.to_string())),
            Ok(()) => self.model.check_read(range.start, done.buf.expect("read buffer").as_slice()).map_err(ReadProblem::Other),
        }
    }
}

/// Why a read did not match the model.
pub(crate) enum ReadProblem {
    /// `VdError::RowNotResynced`: correct only where the read needs a row's stale parity.
    Refused,
    Other(String),
}

impl std::fmt::Display for ReadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadProblem::Refused => write!(f, "refused (row not resynced) though it needs no stale parity"),
            ReadProblem::Other(problem) => write!(f, "{problem}"),
        }
    }
}

/// A request as the trace and the failure messages name it: `read 4096+512`.
fn describe(op: &Op) -> String {
    match op {
        Op::Read(r, ..) => format!("read {}+{}", r.start, r.end - r.start),
        Op::Write(r, _) => format!("write {}+{}", r.start, r.end - r.start),
        Op::Flush(_) => "flush".to_string(),
    }
}
