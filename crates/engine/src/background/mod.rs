//! Background operations (rebuild; later copyback, resync, init, consistency check, patrol
//! read) share one driver: it walks a VD's rows in order through a row function the I/O paths
//! provide (which runs on the shard that owns the row, under its row lock), keeps a few rows in
//! flight, advances a watermark over the rows that are done, checkpoints it, honours a rate,
//! and can be paused, resumed or stopped.
//!
//! The driver runs on a control-plane thread of its own and never touches a shard's state: it
//! only submits rows and waits for their completions, like any client.
//!
//! # Watermark
//! Rows complete out of order (several are in flight, on several shards). The watermark is the
//! first row not yet done: every row below it is done. A checkpoint records the watermark (or the
//! first bad row below it), so a restart resumes there and at worst redoes the rows that were in
//! flight.
//!
//! # Rate
//! `rate_percent` (0 to 100, MegaRAID's rebuild rate) is the share of the members' bandwidth the
//! operation takes while clients are using the VD: it then moves that share of the rows per
//! second it moves alone, in short bursts with pauses between them (see `Pacer`). An idle VD gets
//! the full speed, as on MegaRAID; a rate of 0 still makes progress while clients are busy (one
//! burst per [`RATE_ZERO_BURST_INTERVAL`]), so the operation always ends. While clients are busy a
//! burst also keeps less in flight ([`BUSY_WINDOW_MEMBER_BYTES`] of each member): the clients'
//! small I/Os wait behind fewer of its large ones.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows submitted past the watermark at most, by default: enough to keep every member's queue
/// fed across shards, and all a restart redoes. See [`window_rows_for`].
pub const WINDOW_ROWS: usize = 16;
/// Member bytes an operation keeps in flight on each member at least: with small strips, a
/// window of [`WINDOW_ROWS`] would leave a disk waiting between small I/Os.
pub const WINDOW_MEMBER_BYTES: u64 = 8 << 20;

/// The window for rows of `strip_size_bytes` per member: [`WINDOW_MEMBER_BYTES`] of each member,
/// and never fewer than [`WINDOW_ROWS`] rows.
pub fn window_rows_for(strip_size_bytes: u64) -> usize {
    (WINDOW_MEMBER_BYTES / strip_size_bytes.max(1)).max(WINDOW_ROWS as u64) as usize
}
/// Member bytes a burst keeps in flight on each member while clients are busy. A client's small
/// I/Os queue behind the operation's large ones on the same disks: a full window there costs a
/// 4 KiB random reader a third of its IOPS during the burst, where this costs it far less, while
/// large I/Os still keep the burst near the disks' speed (measured with bench/rebuild-speed).
pub const BUSY_WINDOW_MEMBER_BYTES: u64 = 1 << 20;

/// The window while clients are busy for rows of `strip_size_bytes` per member (at least one row).
pub fn busy_window_rows_for(strip_size_bytes: u64) -> usize {
    (BUSY_WINDOW_MEMBER_BYTES / strip_size_bytes.max(1)).max(1) as usize
}
/// A checkpoint at least this often...
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
/// ...and at least every this fraction of the VD (DESIGN.md: every 1/16 and every few seconds).
pub const CHECKPOINT_FRACTION: u64 = 16;
/// With a rate of 0 and busy clients, one burst this often, so that the operation still ends.
pub const RATE_ZERO_BURST_INTERVAL: Duration = Duration::from_millis(500);
/// The longest pause after a burst: a slow burst must not stall the operation for minutes.
pub const PAUSE_MAX: Duration = Duration::from_secs(1);
/// MegaRAID's default rebuild, consistency check and patrol read rate.
pub const RATE_PERCENT_DEFAULT: u8 = 30;

/// Where an operation stands, shared between its driver and whoever shows or steers it.
pub struct Progress {
    pub total_rows: u64,
    watermark_row: AtomicU64,
    control: AtomicU8,
    rate_percent: AtomicU8,
    window_rows: std::sync::atomic::AtomicUsize,
    /// The window while clients are busy (see [`BUSY_WINDOW_MEMBER_BYTES`]).
    busy_window_rows: std::sync::atomic::AtomicUsize,
    /// Rows are submitted in runs aligned to this many rows (see [`Progress::set_run_rows`]).
    run_rows: AtomicU64,
    /// Rows whose data could not be produced (no other copy): recorded, then skipped.
    bad_rows: std::sync::Mutex<Vec<u64>>,
}

/// What the administrator asked the operation to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Control {
    Run = 0,
    Pause = 1,
    Stop = 2,
}

impl Progress {
    pub fn new(total_rows: u64, start_row: u64, rate_percent: u8) -> Arc<Progress> {
        assert!(start_row <= total_rows, "start row {start_row} past the end ({total_rows} rows)");
        Arc::new(Progress {
            total_rows,
            watermark_row: AtomicU64::new(start_row),
            control: AtomicU8::new(Control::Run as u8),
            rate_percent: AtomicU8::new(rate_percent.min(100)),
            window_rows: std::sync::atomic::AtomicUsize::new(WINDOW_ROWS),
            busy_window_rows: std::sync::atomic::AtomicUsize::new(WINDOW_ROWS),
            run_rows: AtomicU64::new(1),
            bad_rows: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Rows the operation may run past its watermark (set before it starts).
    pub fn set_window_rows(&self, rows: usize) {
        self.window_rows.store(rows.max(1), Ordering::Relaxed);
    }

    pub fn window_rows(&self) -> usize {
        self.window_rows.load(Ordering::Relaxed)
    }

    /// Both windows for rows of `strip_size_bytes` per member (set before it starts).
    pub fn size_windows_for(&self, strip_size_bytes: u64) {
        self.set_window_rows(window_rows_for(strip_size_bytes));
        self.busy_window_rows.store(busy_window_rows_for(strip_size_bytes), Ordering::Relaxed);
    }

    /// Rows a burst may run past the watermark while clients are busy.
    pub fn busy_window_rows(&self) -> usize {
        self.busy_window_rows.load(Ordering::Relaxed).min(self.window_rows())
    }

    /// Submits rows in runs of up to `rows` consecutive rows, aligned to multiples of `rows`
    /// (set before it starts): an operation whose row function can serve a run with larger
    /// member I/Os (`crate::run_rows_for`) gets whole runs; 1 (the default) submits row by row.
    pub fn set_run_rows(&self, rows: u64) {
        self.run_rows.store(rows.max(1), Ordering::Relaxed);
    }

    pub fn run_rows(&self) -> u64 {
        self.run_rows.load(Ordering::Relaxed)
    }

    /// For an operation that walks something else than rows (patrol read: reads of drives):
    /// everything below `row` is done.
    pub fn set_watermark_row(&self, row: u64) {
        assert!(row <= self.total_rows, "watermark {row} past the end ({} rows)", self.total_rows);
        self.watermark_row.store(row, Ordering::Release);
    }

    /// Every row below this one is done.
    pub fn watermark_row(&self) -> u64 {
        self.watermark_row.load(Ordering::Acquire)
    }

    pub fn percent_done(&self) -> f64 {
        if self.total_rows == 0 {
            return 100.0;
        }
        self.watermark_row() as f64 * 100.0 / self.total_rows as f64
    }

    pub fn control(&self) -> Control {
        match self.control.load(Ordering::Acquire) {
            0 => Control::Run,
            1 => Control::Pause,
            2 => Control::Stop,
            other => unreachable!("control value {other} is never stored"),
        }
    }

    pub fn set_control(&self, control: Control) {
        self.control.store(control as u8, Ordering::Release);
    }

    pub fn rate_percent(&self) -> u8 {
        self.rate_percent.load(Ordering::Relaxed)
    }

    pub fn set_rate_percent(&self, rate_percent: u8) {
        self.rate_percent.store(rate_percent.min(100), Ordering::Relaxed);
    }

    pub fn bad_rows(&self) -> Vec<u64> {
        self.bad_rows.lock().expect("bad rows lock").clone()
    }

    /// Every row below this one is done and none of them is a bad row: the watermark, or the
    /// first bad row below it.
    pub fn clean_rows(&self) -> u64 {
        let watermark = self.watermark_row();
        let bad_rows = self.bad_rows.lock().expect("bad rows lock");
        bad_rows.iter().copied().min().map_or(watermark, |first_bad| first_bad.min(watermark))
    }
}

/// What a row function reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowOutcome {
    Done,
    /// The row's data could not be produced (a source unreadable with no other copy): the
    /// operation records it and goes on.
    Unrecoverable(String),
    /// The operation cannot go on (its target failed, the VD went offline).
    Fatal(String),
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Every row done (some may be in the bad-row list).
    Complete,
    /// Stopped by the administrator at the watermark.
    Stopped,
    Failed(String),
}

/// Called with the row and a completion to call once the row is done (from any thread).
pub type SubmitRow<'a> = dyn Fn(u64, Box<dyn FnOnce(RowOutcome) + Send>) + 'a;
/// Called with a run of rows (first row, row count) and a completion to call once with the
/// outcome of each row, in order (from any thread).
pub type SubmitRows<'a> = dyn Fn(u64, u64, RunDone) + 'a;
/// Called once with the outcome of each row of a run, in order.
pub type RunDone = Box<dyn FnOnce(Vec<RowOutcome>) + Send>;

/// A [`SubmitRows`] for row functions that take one row at a time: each row of the run is
/// submitted alone, and the run completes when the last of them does.
pub fn row_by_row<'a>(submit_row: &'a SubmitRow<'a>) -> impl Fn(u64, u64, RunDone) + 'a {
    move |first_row, row_count, done| {
        type Join = (Vec<Option<RowOutcome>>, usize, Option<RunDone>);
        let join: Arc<std::sync::Mutex<Join>> =
            Arc::new(std::sync::Mutex::new((vec![None; row_count as usize], row_count as usize, Some(done))));
        for i in 0..row_count {
            let join = Arc::clone(&join);
            submit_row(
                first_row + i,
                Box::new(move |outcome| {
                    let mut join = join.lock().expect("row join lock");
                    join.0[i as usize] = Some(outcome);
                    join.1 -= 1;
                    if join.1 == 0 {
                        let outcomes = join.0.drain(..).map(|o| o.expect("every row reported")).collect();
                        let done = join.2.take().expect("a run completes once");
                        drop(join);
                        done(outcomes);
                    }
                }),
            );
        }
    }
}

/// The hooks of one run: submit a run of rows, record a checkpoint, tell whether clients are
/// busy, and hear of each advance.
pub struct Hooks<'a> {
    pub submit_rows: &'a SubmitRows<'a>,
    pub checkpoint: &'a mut dyn FnMut(u64),
    pub clients_busy: &'a dyn Fn() -> bool,
    /// Called with [`Progress::clean_rows`] whenever the watermark moved: a rebuild lets client
    /// reads use its target below it (`VirtualDrive::rebuild_advanced`).
    pub advanced: &'a dyn Fn(u64),
}

/// Runs the operation from the progress's watermark to the end (or a stop or a failure).
/// Blocks: call it on a thread of its own.
pub fn run(progress: &Progress, hooks: Hooks<'_>) -> Finish {
    let (done_tx, done_rx) = mpsc::channel::<(u64, Vec<RowOutcome>)>();
    let mut next_row = progress.watermark_row();
    let mut runs_in_flight = 0usize;
    let mut finished_above: BTreeSet<u64> = BTreeSet::new();
    let mut last_checkpoint = (Instant::now(), progress.watermark_row());
    let checkpoint_rows = (progress.total_rows / CHECKPOINT_FRACTION).max(1);
    let mut failure = None;
    let mut pacer = Pacer::new();
    loop {
        let control = wait_while_paused(progress, runs_in_flight);
        // While clients are busy the operation works in bursts, each drained before a pause that
        // holds its speed to the rate's share of its speed alone (see `Pacer`).
        let throttled = progress.rate_percent() < 100 && (hooks.clients_busy)();
        pacer.observe(progress, throttled);
        let may_submit = control == Control::Run && failure.is_none() && (!throttled || runs_in_flight == 0);
        if may_submit && runs_in_flight == 0 {
            pacer.start_batch(progress, throttled);
        }
        // The window bounds the distance from the watermark, not only the rows in flight: a
        // slow row holds the others back, so a restart redoes at most a window of rows.
        let window_rows = pacer.window_rows(progress, throttled);
        let window_end_row = progress.watermark_row().saturating_add(window_rows as u64).min(progress.total_rows);
        while may_submit && next_row < window_end_row {
            let done_tx = done_tx.clone();
            let first_row = next_row;
            let run_end_row = ((first_row / progress.run_rows() + 1) * progress.run_rows()).min(progress.total_rows);
            (hooks.submit_rows)(first_row, run_end_row - first_row, Box::new(move |outcomes| drop(done_tx.send((first_row, outcomes)))));
            next_row = run_end_row;
            runs_in_flight += 1;
        }
        if runs_in_flight == 0 {
            break;
        }
        let (first_row, outcomes) = done_rx.recv().expect("a submitted run always completes");
        runs_in_flight -= 1;
        for (row, outcome) in (first_row..).zip(outcomes) {
            match outcome {
                RowOutcome::Done => drop(finished_above.insert(row)),
                RowOutcome::Unrecoverable(_) => {
                    progress.bad_rows.lock().expect("bad rows lock").push(row);
                    finished_above.insert(row);
                }
                // Not done: the watermark must stay below it, so a resumed run does it again.
                RowOutcome::Fatal(reason) => failure = failure.or(Some(reason)),
            }
        }
        let before = progress.watermark_row();
        advance_watermark(progress, &mut finished_above);
        let watermark = progress.watermark_row();
        if watermark > before {
            (hooks.advanced)(progress.clean_rows());
        }
        if watermark - last_checkpoint.1 >= checkpoint_rows || last_checkpoint.0.elapsed() >= CHECKPOINT_INTERVAL {
            // Not past a bad row: a restart must not take a row left as it was for done.
            (hooks.checkpoint)(progress.clean_rows());
            last_checkpoint = (Instant::now(), watermark);
        }
        if runs_in_flight == 0 {
            pacer.end_batch(progress, hooks.clients_busy);
        }
    }
    match (failure, progress.control()) {
        (Some(reason), _) => Finish::Failed(reason),
        (None, Control::Stop) if progress.watermark_row() < progress.total_rows => {
            (hooks.checkpoint)(progress.clean_rows());
            Finish::Stopped
        }
        _ => {
            assert_eq!(progress.watermark_row(), progress.total_rows, "a complete run covers every row");
            Finish::Complete
        }
    }
}

/// Moves the watermark over the rows finished right above it.
fn advance_watermark(progress: &Progress, finished_above: &mut BTreeSet<u64>) {
    let mut watermark = progress.watermark_row();
    while finished_above.remove(&watermark) {
        watermark += 1;
    }
    progress.watermark_row.store(watermark, Ordering::Release);
}

/// Sleeps while paused, once nothing is in flight (rows already submitted finish first).
pub(crate) fn wait_while_paused(progress: &Progress, in_flight: usize) -> Control {
    while progress.control() == Control::Pause && in_flight == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    progress.control()
}

/// Holds an operation to its rate while clients are busy.
///
/// The rate is the share of the members' bandwidth the operation takes from busy clients
/// (MegaRAID's rebuild rate): while clients are busy it moves `rate_percent` of the rows per
/// second it moves alone. Its speed alone (the reference) is measured over a second of running
/// unthrottled, or, when clients are busy from the start, by a calibration burst of a whole
/// window every [`CALIBRATION_INTERVAL`]. Other bursts keep only [`BUSY_WINDOW_MEMBER_BYTES`]
/// of each member in flight, so that the clients' small I/Os wait behind few large ones, and are
/// followed by the pause that brings the speed down to the share. A burst that clients slowed
/// below the share gets no pause: the operation keeps its share of the bandwidth, not of the
/// time (a time share would let a busy client stall it).
struct Pacer {
    /// Rows per second alone, and when that was measured.
    reference: Option<(f64, Instant)>,
    /// An unthrottled stretch: since when, from which watermark.
    stretch: Option<(Instant, u64)>,
    /// The batch under way: when it started, from which watermark, and whether it calibrates.
    batch: (Instant, u64, bool),
}

/// How often a calibration burst measures the operation's speed again while clients are busy.
pub const CALIBRATION_INTERVAL: Duration = Duration::from_secs(10);
/// How long an unthrottled stretch runs before it counts as the operation's speed alone.
const STRETCH_MEASURED: Duration = Duration::from_secs(1);

impl Pacer {
    fn new() -> Pacer {
        Pacer { reference: None, stretch: None, batch: (Instant::now(), 0, false) }
    }

    /// Measures the speed alone while nothing throttles the operation.
    fn observe(&mut self, progress: &Progress, throttled: bool) {
        if throttled {
            self.stretch = None;
            return;
        }
        let watermark = progress.watermark_row();
        match self.stretch {
            None => self.stretch = Some((Instant::now(), watermark)),
            Some((since, from_row)) if since.elapsed() >= STRETCH_MEASURED => {
                let rows_per_sec = (watermark - from_row) as f64 / since.elapsed().as_secs_f64();
                self.reference = Some((rows_per_sec, Instant::now()));
                self.stretch = Some((Instant::now(), watermark));
            }
            Some(_) => {}
        }
    }

    fn start_batch(&mut self, progress: &Progress, throttled: bool) {
        let stale = self.reference.is_none_or(|(_, measured)| measured.elapsed() >= CALIBRATION_INTERVAL);
        self.batch = (Instant::now(), progress.watermark_row(), throttled && stale);
    }

    fn window_rows(&self, progress: &Progress, throttled: bool) -> usize {
        match (throttled, self.batch.2) {
            (true, false) => progress.busy_window_rows(),
            _ => progress.window_rows(),
        }
    }

    /// The batch drained: nothing while the VD is idle; otherwise the pause the rate asks for.
    fn end_batch(&mut self, progress: &Progress, clients_busy: &dyn Fn() -> bool) {
        let (started, from_row, calibrating) = self.batch;
        let burst = started.elapsed();
        let rows = progress.watermark_row().saturating_sub(from_row);
        if calibrating && rows > 0 && !burst.is_zero() {
            self.reference = Some((rows as f64 / burst.as_secs_f64(), Instant::now()));
        }
        if !clients_busy() {
            return;
        }
        let reference = if calibrating { None } else { self.reference.map(|(rows_per_sec, _)| rows_per_sec) };
        let pause = pause_after(rows, burst, progress.rate_percent(), reference);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

/// The pause after a burst of `rows` that took `burst` while clients are busy, for the operation
/// to move `rate_percent` of `reference_rows_per_sec` (its speed alone). Without a reference (a
/// calibration burst) the burst's own speed stands in for it. At most [`PAUSE_MAX`].
fn pause_after(rows: u64, burst: Duration, rate_percent: u8, reference_rows_per_sec: Option<f64>) -> Duration {
    let pause = match rate_percent {
        0 => RATE_ZERO_BURST_INTERVAL,
        100.. => Duration::ZERO,
        rate => match reference_rows_per_sec {
            Some(reference) if reference > 0.0 => {
                let due = Duration::from_secs_f64(rows as f64 * 100.0 / (f64::from(rate) * reference));
                due.saturating_sub(burst)
            }
            _ => burst * u32::from(100 - rate) / u32::from(rate),
        },
    };
    pause.min(PAUSE_MAX)
}

#[cfg(test)]
mod tests;
