//! Workers that drive a target: each keeps its own number of I/Os outstanding (closed loop) or
//! issues at a fixed rate (open loop), in its own zone, drawing every request from its access
//! specification.
//!
//! # Design
//! Completions drive the loop: a completion records its request and issues the worker's next
//! one from the completion callback, on whatever thread completed it (an engine shard, an NBD
//! connection thread). The generator adds no thread and no queue hop of its own in a closed
//! loop. An open loop adds one pacer thread that issues requests at their scheduled instants;
//! a request due while all of its worker's slots are busy waits in a backlog and is issued by
//! the next completion, its latency still counted from the scheduled instant, so a slow target
//! shows its queueing delay instead of hiding it (no coordinated omission).
//!
//! A target may complete a request inside `submit` (a request it rejects at once). Issuing the
//! next request from that completion would recurse, once per request, until the stack ends; so
//! every issue goes through a per-thread trampoline that turns such recursion into a loop.

use crate::distribution::Distribution;
use crate::spec::{AccessLine, AccessSpec, Cursor, Io};
use crate::target::Target;
use crate::verify::{Verifier, VerifyCounts};
use drive::IoBuf;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Tries to find a request whose sectors no other request in flight touches (`--verify`).
const FREE_BLOCK_TRIES: usize = 32;

/// One worker: a target, an access specification, its outstanding I/Os and its zone.
#[derive(Clone)]
pub struct Job {
    pub target: Arc<dyn Target>,
    pub spec: AccessSpec,
    /// Outstanding I/Os (closed loop), or the most in flight at once (open loop).
    pub queue_depth: usize,
    /// Byte range of the target this worker uses.
    pub zone: Range<u64>,
    /// Where its first sequential request starts, inside the zone.
    pub first_offset_bytes: u64,
    /// Where the job's disk starts in the verifier's address space: disk × disk capacity in a
    /// set, so that two disks' sectors at one offset are told apart; 0 for a single target.
    pub verify_base_bytes: u64,
    /// Where its random requests fall in the zone.
    pub distribution: Distribution,
}

/// How requests are timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// Each completion issues the next request at once: a fixed number outstanding.
    Closed,
    /// Requests are due at a fixed rate over all workers, each latency counted from the instant
    /// the request was due.
    Open { rate_iops: f64 },
}

#[derive(Clone)]
pub struct RunOptions {
    /// Run before measuring; excluded from the results (errors and verify checks still count).
    pub ramp: Duration,
    pub duration: Duration,
    /// Worker `i` draws from a generator seeded with `seed + i`.
    pub seed: u64,
    pub pace: Pace,
    /// Head every written sector and check every read (`--verify`).
    pub verifier: Option<Arc<Verifier>>,
}

/// What one run of workers measured, all workers together.
pub struct PointMeasurement {
    /// Requests completed in the measured window.
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes: u64,
    /// Failed requests, ramp included.
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency in nanoseconds, from the intended issue instant, merged over workers.
    pub latency_ns: Histogram<u64>,
    pub first_error: Option<String>,
    pub verify: Option<VerifyCounts>,
}

impl PointMeasurement {
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// 1 ns to 10 minutes at 3 significant digits; longer latencies are recorded as 10 minutes.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs the workers together for `options.ramp + options.duration` and merges their results.
///
/// # Panics
/// If a worker's zone cannot hold every line of its spec, or its queue depth is zero.
pub fn run_jobs(jobs: &[Job], options: &RunOptions) -> PointMeasurement {
    let run = Arc::new(RunState {
        measuring: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        drained: (Mutex::new(()), Condvar::new()),
        pace: options.pace,
        verifier: options.verifier.clone(),
        parked: Mutex::new(Vec::new()),
    });
    let states: Vec<Arc<JobState>> =
        jobs.iter().enumerate().map(|(i, job)| Arc::new(JobState::new(job, options.seed + i as u64))).collect();
    // Every slot's buffer exists before the clock starts: filling 20 × 64 MiB takes a while.
    let slot_bufs: Vec<Vec<IoBuf>> =
        states.iter().map(|s| (0..s.job.queue_depth).map(|slot| s.new_buf(options.seed + slot as u64)).collect()).collect();
    // Issued from a thread of their own: a target that completes inside `submit` keeps that
    // thread issuing until the stop, which this one must be free to give.
    let starter = match options.pace {
        Pace::Closed => {
            let (states, run) = (states.clone(), Arc::clone(&run));
            let start = move || {
                for (state, bufs) in states.iter().zip(slot_bufs) {
                    for buf in bufs {
                        issue(Arc::clone(state), Arc::clone(&run), buf, None);
                    }
                }
            };
            std::thread::Builder::new().name("bench-start".into()).spawn(start).expect("starter thread")
        }
        Pace::Open { rate_iops } => {
            assert!(rate_iops > 0.0, "an open loop needs a positive rate");
            for (state, bufs) in states.iter().zip(slot_bufs) {
                state.open.lock().expect("open-loop lock").idle = bufs;
            }
            let (states, run) = (states.clone(), Arc::clone(&run));
            let rate_per_job = rate_iops / states.len() as f64;
            std::thread::Builder::new().name("bench-pacer".into()).spawn(move || pace(&states, &run, rate_per_job)).expect("pacer thread")
        }
    };
    std::thread::sleep(options.ramp);
    states.iter().for_each(|s| s.stats.lock().expect("stats lock").reset());
    run.measuring.store(true, Ordering::Release);
    let started = Instant::now();
    std::thread::sleep(options.duration);
    run.measuring.store(false, Ordering::Release);
    let elapsed = started.elapsed();
    run.stopped.store(true, Ordering::Release);
    starter.join().expect("starter thread");
    run.parked.lock().expect("parked lock").clear();
    wait_drained(&run);
    wait_released(&states);
    merge(&states, elapsed, options.verifier.is_some())
}

/// Waits until every completion callback has returned and let go of its worker: a callback
/// counts itself finished just before it returns, and what it holds (the worker, and through
/// it the target) must not be dropped on the target's own thread after the run is over.
fn wait_released(states: &[Arc<JobState>]) {
    while states.iter().any(|s| Arc::strong_count(s) > 1) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Per-completion counters of one worker, for the measured window.
struct Stats {
    latency_ns: Histogram<u64>,
    ops: u64,
    read_ops: u64,
    write_ops: u64,
    bytes: u64,
}

impl Stats {
    fn reset(&mut self) {
        self.latency_ns.reset();
        (self.ops, self.read_ops, self.write_ops, self.bytes) = (0, 0, 0, 0);
    }
}

struct Generator {
    rng: SmallRng,
    cursor: Cursor,
}

/// Open loop: buffers of idle slots, and instants of requests due while no slot was idle.
#[derive(Default)]
struct OpenLoop {
    idle: Vec<IoBuf>,
    backlog: VecDeque<Instant>,
}

/// State shared by one worker's requests.
struct JobState {
    job: Job,
    generator: Mutex<Generator>,
    stats: Mutex<Stats>,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    verify: Mutex<VerifyCounts>,
    open: Mutex<OpenLoop>,
}

impl JobState {
    fn new(job: &Job, seed: u64) -> JobState {
        assert!(job.queue_depth > 0, "a worker needs at least one outstanding I/O");
        let cursor = Cursor::new(job.zone.clone(), job.first_offset_bytes).with_distribution(job.distribution.clone());
        for line in job.spec.lines() {
            assert!(cursor.fits(line), "zone {:?} cannot hold a {}-byte request", job.zone, line.block_bytes);
        }
        let stats = Stats { latency_ns: latency_histogram(), ops: 0, read_ops: 0, write_ops: 0, bytes: 0 };
        JobState {
            job: job.clone(),
            generator: Mutex::new(Generator { rng: SmallRng::seed_from_u64(seed), cursor }),
            stats: Mutex::new(stats),
            errors: AtomicU64::new(0),
            first_error: Mutex::new(None),
            verify: Mutex::new(VerifyCounts::default()),
            open: Mutex::new(OpenLoop::default()),
        }
    }

    /// A slot's buffer, as large as the largest request, filled with seeded bytes (64 KiB of
    /// random data repeated: what is written must not be all zeros, and need not be unique).
    fn new_buf(&self, seed: u64) -> IoBuf {
        let len = self.job.spec.block_bytes_max() as usize;
        let mut buf = IoBuf::zeroed(len);
        let bytes = buf.as_mut_slice();
        let pattern_len = len.min(64 << 10);
        SmallRng::seed_from_u64(seed).fill_bytes(&mut bytes[..pattern_len]);
        for start in (pattern_len..len).step_by(pattern_len) {
            let end = (start + pattern_len).min(len);
            bytes.copy_within(0..end - start, start);
        }
        buf
    }

    /// Where `io` lies in the verifier's address space (see [`Job::verify_base_bytes`]).
    fn verify_offset(&self, io: &Io) -> u64 {
        self.job.verify_base_bytes + io.offset_bytes
    }

    /// The next request; with a verifier, one whose sectors no request in flight touches, or
    /// `None` after [`FREE_BLOCK_TRIES`] tries.
    fn next_io(&self, verifier: Option<&Verifier>) -> Option<Io> {
        let mut generator = self.generator.lock().expect("generator lock");
        let Generator { rng, cursor } = &mut *generator;
        let Some(verifier) = verifier else { return Some(cursor.next(&self.job.spec, rng)) };
        for _ in 0..FREE_BLOCK_TRIES {
            let io = cursor.next(&self.job.spec, rng);
            if verifier.try_reserve(self.verify_offset(&io), io.len_bytes) {
                return Some(io);
            }
            cursor.skip(&io);
        }
        None
    }

    /// Books one completed request.
    fn complete(&self, run: &RunState, io: &Io, sequence: u64, result: &Result<(), String>, data: &[u8], issued: Instant) {
        let latency_ns = issued.elapsed().as_nanos().max(1) as u64;
        if let Some(verifier) = &run.verifier {
            match (io.write, result) {
                (true, result) => verifier.finish_write(self.verify_offset(io), io.len_bytes, sequence, result.is_ok()),
                (false, Ok(())) => self.verify.lock().expect("verify lock").add(&verifier.check_read(self.verify_offset(io), data)),
                (false, Err(_)) => {}
            }
            verifier.release(self.verify_offset(io));
        }
        if let Err(error) = result {
            self.errors.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first_error.lock().expect("error lock");
            first.get_or_insert_with(|| format!("{} at offset {}: {error}", if io.write { "write" } else { "read" }, io.offset_bytes));
            return;
        }
        if !run.measuring.load(Ordering::Acquire) {
            return;
        }
        let mut stats = self.stats.lock().expect("stats lock");
        stats.ops += 1;
        if io.write {
            stats.write_ops += 1;
        } else {
            stats.read_ops += 1;
        }
        stats.bytes += io.len_bytes;
        stats.latency_ns.saturating_record(latency_ns);
    }
}

/// Shared by every worker of a run.
struct RunState {
    measuring: AtomicBool,
    stopped: AtomicBool,
    /// Requests submitted to the target and not completed (plus those about to be).
    in_flight: AtomicUsize,
    drained: (Mutex<()>, Condvar),
    pace: Pace,
    verifier: Option<Arc<Verifier>>,
    /// Slots that found no free block (`--verify`): retried at the next completion.
    parked: Mutex<Vec<ParkedSlot>>,
}

/// A slot that found no free block: its worker, its buffer, its intended instant.
type ParkedSlot = (Arc<JobState>, IoBuf, Option<Instant>);

type Deferred = Box<dyn FnOnce()>;

thread_local! {
    /// Issues deferred while this thread is already issuing (see the module docs).
    static TRAMPOLINE: RefCell<Option<VecDeque<Deferred>>> = const { RefCell::new(None) };
}

/// Runs `f` now, or after the issue this thread is already inside of.
fn trampoline(f: impl FnOnce() + 'static) {
    let nested = TRAMPOLINE.with(|t| match t.borrow_mut().as_mut() {
        Some(queue) => {
            queue.push_back(Box::new(f));
            None
        }
        None => Some(f),
    });
    let Some(f) = nested else { return };
    TRAMPOLINE.with(|t| *t.borrow_mut() = Some(VecDeque::new()));
    f();
    while let Some(next) = TRAMPOLINE.with(|t| t.borrow_mut().as_mut().and_then(VecDeque::pop_front)) {
        next();
    }
    TRAMPOLINE.with(|t| *t.borrow_mut() = None);
}

/// Issues one request of `job` in `buf`'s slot; `intended` is the open loop's schedule.
fn issue(job: Arc<JobState>, run: Arc<RunState>, buf: IoBuf, intended: Option<Instant>) {
    run.in_flight.fetch_add(1, Ordering::AcqRel);
    trampoline(move || issue_now(job, run, buf, intended));
}

fn issue_now(job: Arc<JobState>, run: Arc<RunState>, mut buf: IoBuf, intended: Option<Instant>) {
    let Some(io) = job.next_io(run.verifier.as_deref()) else {
        run.parked.lock().expect("parked lock").push((job, buf, intended));
        return finish_one(&run);
    };
    let tail = (io.len_bytes < buf.len() as u64).then(|| buf.split_off(io.len_bytes as usize));
    let sequence = match (&run.verifier, io.write) {
        (Some(verifier), true) => verifier.prepare_write(job.verify_offset(&io), buf.as_mut_slice()),
        _ => 0,
    };
    let target = Arc::clone(&job.job.target);
    let issued = intended.unwrap_or_else(Instant::now);
    target.submit(
        io.write,
        io.offset_bytes,
        buf,
        Box::new(move |result, mut buf| {
            job.complete(&run, &io, sequence, &result, buf.as_slice(), issued);
            if let Some(tail) = tail {
                match buf.is_followed_by(&tail) {
                    true => buf.unsplit(tail),
                    false => buf = job.new_buf(sequence),
                }
            }
            after_completion(job, run, buf);
        }),
    );
}

/// Reuses a completed request's slot: the next request at once (closed loop), the oldest
/// overdue one, or idle until the pacer's next (open loop).
fn after_completion(job: Arc<JobState>, run: Arc<RunState>, buf: IoBuf) {
    if !run.stopped.load(Ordering::Acquire) {
        match run.pace {
            Pace::Closed => issue(Arc::clone(&job), Arc::clone(&run), buf, None),
            Pace::Open { .. } => {
                let mut open = job.open.lock().expect("open-loop lock");
                match open.backlog.pop_front() {
                    Some(intended) => {
                        drop(open);
                        issue(Arc::clone(&job), Arc::clone(&run), buf, Some(intended));
                    }
                    None => open.idle.push(buf),
                }
            }
        }
        if run.verifier.is_some() {
            let parked = std::mem::take(&mut *run.parked.lock().expect("parked lock"));
            for (job, buf, intended) in parked {
                issue(job, Arc::clone(&run), buf, intended);
            }
        }
    }
    finish_one(&run);
}

/// The open loop's schedule: worker `i`'s requests are due every `1 / rate` seconds, the
/// workers' schedules staggered evenly.
fn pace(states: &[Arc<JobState>], run: &Arc<RunState>, rate_per_job: f64) {
    let interval = Duration::from_secs_f64(1.0 / rate_per_job);
    let start = Instant::now();
    let mut due: Vec<Instant> = (0..states.len()).map(|i| start + interval.mul_f64(i as f64 / states.len() as f64)).collect();
    while !run.stopped.load(Ordering::Acquire) {
        let now = Instant::now();
        for (state, due) in states.iter().zip(due.iter_mut()) {
            while *due <= now {
                let idle = {
                    let mut open = state.open.lock().expect("open-loop lock");
                    let idle = open.idle.pop();
                    if idle.is_none() {
                        open.backlog.push_back(*due);
                    }
                    idle
                };
                if let Some(buf) = idle {
                    issue(Arc::clone(state), Arc::clone(run), buf, Some(*due));
                }
                *due += interval;
            }
        }
        let next = due.iter().min().copied().unwrap_or(now);
        // Wake at least every 10 ms to see the stop.
        std::thread::sleep(next.saturating_duration_since(Instant::now()).min(Duration::from_millis(10)));
    }
}

fn finish_one(run: &RunState) {
    if run.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        let _guard = run.drained.0.lock().expect("drain lock");
        run.drained.1.notify_all();
    }
}

fn wait_drained(run: &RunState) {
    let mut guard = run.drained.0.lock().expect("drain lock");
    while run.in_flight.load(Ordering::Acquire) > 0 {
        guard = run.drained.1.wait_timeout(guard, Duration::from_millis(50)).expect("drain lock").0;
    }
}

fn merge(states: &[Arc<JobState>], elapsed: Duration, verifying: bool) -> PointMeasurement {
    let mut measurement = PointMeasurement {
        ops: 0,
        read_ops: 0,
        write_ops: 0,
        bytes: 0,
        errors: 0,
        elapsed,
        latency_ns: latency_histogram(),
        first_error: None,
        verify: verifying.then(VerifyCounts::default),
    };
    for state in states {
        let stats = state.stats.lock().expect("stats lock");
        measurement.ops += stats.ops;
        measurement.read_ops += stats.read_ops;
        measurement.write_ops += stats.write_ops;
        measurement.bytes += stats.bytes;
        measurement.latency_ns.add(&stats.latency_ns).expect("same histogram bounds");
        measurement.errors += state.errors.load(Ordering::Relaxed);
        if measurement.first_error.is_none() {
            measurement.first_error = state.first_error.lock().expect("error lock").clone();
        }
        if let Some(verify) = &mut measurement.verify {
            verify.add(&state.verify.lock().expect("verify lock"));
        }
    }
    measurement
}

// --- The single-line interface `storc bench engine` uses. ---

/// One access specification line: block size, read share and random share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Access {
    pub block_bytes: u64,
    pub read_percent: u32,
    pub random_percent: u32,
}

/// One worker: a target, an access line, its outstanding I/Os and its address zone.
#[derive(Clone)]
pub struct Worker {
    pub target: Arc<dyn Target>,
    pub access: Access,
    pub queue_depth: usize,
    /// Byte range of the target this worker uses (block-aligned).
    pub zone: Range<u64>,
}

#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// Excluded from the results.
    pub ramp: Duration,
    pub duration: Duration,
    pub seed: u64,
}

/// What a run measured, all workers together.
pub struct Measurement {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Completion latency in nanoseconds.
    pub latency_ns: Histogram<u64>,
    pub first_error: Option<String>,
}

impl Measurement {
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64() / 1e6
    }
    pub fn mean_latency_us(&self) -> f64 {
        self.latency_ns.mean() / 1e3
    }
}

/// Runs single-line workers in a closed loop, each starting at its zone's start.
///
/// # Panics
/// If a worker's zone cannot hold one block.
pub fn run(workers: &[Worker], config: RunConfig) -> Measurement {
    let jobs: Vec<Job> = workers
        .iter()
        .map(|w| Job {
            target: Arc::clone(&w.target),
            spec: AccessSpec::new(vec![AccessLine::whole(w.access.block_bytes, w.access.read_percent, w.access.random_percent)])
                .expect("a valid access line"),
            queue_depth: w.queue_depth,
            verify_base_bytes: 0,
            zone: w.zone.clone(),
            first_offset_bytes: w.zone.start,
            distribution: Distribution::Uniform,
        })
        .collect();
    let options = RunOptions { ramp: config.ramp, duration: config.duration, seed: config.seed, pace: Pace::Closed, verifier: None };
    let m = run_jobs(&jobs, &options);
    Measurement { ops: m.ops, bytes: m.bytes, errors: m.errors, elapsed: m.elapsed, latency_ns: m.latency_ns, first_error: m.first_error }
}
