//! Closed-loop workers: each keeps `queue_depth` I/Os outstanding against its target, in its own
//! zone, with one access specification line, until the run ends.

use crate::target::Target;
use drive::IoBuf;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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

/// State shared by one worker's in-flight I/Os.
struct WorkerState {
    worker: Worker,
    rng: Mutex<SmallRng>,
    next_sequential_bytes: AtomicU64,
    latency_ns: Mutex<Histogram<u64>>,
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

/// Shared by every worker of a run.
struct RunState {
    measuring: AtomicBool,
    stopped: AtomicBool,
    in_flight: AtomicUsize,
    drained: (Mutex<()>, Condvar),
}

/// Runs the workers together for `config.ramp + config.duration` and merges their results.
///
/// # Panics
/// If a worker's zone cannot hold one block.
pub fn run(workers: &[Worker], config: RunConfig) -> Measurement {
    let run = Arc::new(RunState {
        measuring: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        drained: (Mutex::new(()), Condvar::new()),
    });
    let states: Vec<Arc<WorkerState>> =
        workers.iter().enumerate().map(|(i, w)| Arc::new(worker_state(w, config.seed + i as u64))).collect();
    for state in &states {
        for _ in 0..state.worker.queue_depth {
            let buf = IoBuf::from_slice(&fill(state.worker.access.block_bytes as usize, config.seed));
            run.in_flight.fetch_add(1, Ordering::AcqRel);
            issue(Arc::clone(state), Arc::clone(&run), buf);
        }
    }
    std::thread::sleep(config.ramp);
    for state in &states {
        reset_counters(state);
    }
    run.measuring.store(true, Ordering::Release);
    let started = Instant::now();
    std::thread::sleep(config.duration);
    run.measuring.store(false, Ordering::Release);
    let elapsed = started.elapsed();
    run.stopped.store(true, Ordering::Release);
    wait_drained(&run);
    merge(&states, elapsed)
}

fn worker_state(worker: &Worker, seed: u64) -> WorkerState {
    assert!(worker.zone.end - worker.zone.start >= worker.access.block_bytes, "zone smaller than one block");
    WorkerState {
        worker: worker.clone(),
        rng: Mutex::new(SmallRng::seed_from_u64(seed)),
        next_sequential_bytes: AtomicU64::new(worker.zone.start),
        latency_ns: Mutex::new(latency_histogram()),
        ops: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
    }
}

/// 1 ns to 10 minutes at 3 significant digits; longer latencies are recorded as 10 minutes.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn fill(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn reset_counters(state: &WorkerState) {
    state.ops.store(0, Ordering::Relaxed);
    state.bytes.store(0, Ordering::Relaxed);
    state.latency_ns.lock().expect("histogram lock").reset();
}

/// Picks the next I/O of a worker: (write?, offset).
fn next_io(state: &WorkerState) -> (bool, u64) {
    let access = state.worker.access;
    let zone = &state.worker.zone;
    let blocks = (zone.end - zone.start) / access.block_bytes;
    let mut rng = state.rng.lock().expect("rng lock");
    let write = rng.gen_range(0..100) >= access.read_percent;
    let random = rng.gen_range(0..100) < access.random_percent;
    let offset = if random {
        zone.start + rng.gen_range(0..blocks) * access.block_bytes
    } else {
        let offset = state.next_sequential_bytes.fetch_add(access.block_bytes, Ordering::Relaxed);
        if offset + access.block_bytes > zone.end {
            state.next_sequential_bytes.store(zone.start + access.block_bytes, Ordering::Relaxed);
            zone.start
        } else {
            offset
        }
    };
    (write, offset)
}

/// Issues one I/O; its completion records it and issues the next until the run stops.
fn issue(state: Arc<WorkerState>, run: Arc<RunState>, buf: IoBuf) {
    let (write, offset) = next_io(&state);
    let issued = Instant::now();
    let target = Arc::clone(&state.worker.target);
    target.submit(
        write,
        offset,
        buf,
        Box::new(move |result, buf| {
            record(&state, &run, issued, result, buf.len() as u64);
            if run.stopped.load(Ordering::Acquire) {
                finish_one(&run);
            } else {
                issue(state, run, buf);
            }
        }),
    );
}

fn record(state: &WorkerState, run: &RunState, issued: Instant, result: Result<(), String>, len_bytes: u64) {
    if let Err(error) = result {
        state.errors.fetch_add(1, Ordering::Relaxed);
        state.first_error.lock().expect("error lock").get_or_insert(error);
        return;
    }
    if !run.measuring.load(Ordering::Acquire) {
        return;
    }
    state.ops.fetch_add(1, Ordering::Relaxed);
    state.bytes.fetch_add(len_bytes, Ordering::Relaxed);
    let latency_ns = issued.elapsed().as_nanos().max(1) as u64;
    state.latency_ns.lock().expect("histogram lock").saturating_record(latency_ns);
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

fn merge(states: &[Arc<WorkerState>], elapsed: Duration) -> Measurement {
    let mut latency_ns = latency_histogram();
    let mut measurement = Measurement { ops: 0, bytes: 0, errors: 0, elapsed, latency_ns: latency_ns.clone(), first_error: None };
    for state in states {
        measurement.ops += state.ops.load(Ordering::Relaxed);
        measurement.bytes += state.bytes.load(Ordering::Relaxed);
        measurement.errors += state.errors.load(Ordering::Relaxed);
        latency_ns.add(&*state.latency_ns.lock().expect("histogram lock")).expect("same histogram bounds");
        if measurement.first_error.is_none() {
            measurement.first_error = state.first_error.lock().expect("error lock").clone();
        }
    }
    measurement.latency_ns = latency_ns;
    measurement
}
