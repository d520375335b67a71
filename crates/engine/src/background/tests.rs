use super::*;
use std::sync::Mutex;

/// A row function that completes each row on another thread after a seeded delay, so rows
/// finish out of order, with `outcome_of` deciding each row's outcome.
struct FakeRows {
    seen: Arc<Mutex<Vec<u64>>>,
    outcome_of: fn(u64) -> RowOutcome,
}

impl FakeRows {
    fn new(outcome_of: fn(u64) -> RowOutcome) -> FakeRows {
        FakeRows { seen: Arc::new(Mutex::new(Vec::new())), outcome_of }
    }

    fn submit(&self) -> impl Fn(u64, Box<dyn FnOnce(RowOutcome) + Send>) + '_ {
        move |row, done| {
            self.seen.lock().unwrap().push(row);
            let outcome = (self.outcome_of)(row);
            let delay_us = (row.wrapping_mul(0x9E37_79B9) >> 7) % 300;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(delay_us));
                done(outcome);
            });
        }
    }
}

fn run_all(progress: &Progress, rows: &FakeRows, checkpoints: &mut Vec<u64>) -> Finish {
    let submit = rows.submit();
    let mut record = |watermark| checkpoints.push(watermark);
    let submit = row_by_row(&submit);
    run(progress, Hooks { submit_rows: &submit, checkpoint: &mut record, clients_busy: &|| false, advanced: &|_| {} })
}

#[test]
fn every_row_is_done_once_and_the_watermark_only_moves_forward() {
    let progress = Progress::new(1000, 0, RATE_PERCENT_DEFAULT);
    let rows = FakeRows::new(|_| RowOutcome::Done);
    let mut checkpoints = Vec::new();
    assert_eq!(run_all(&progress, &rows, &mut checkpoints), Finish::Complete);
    let mut seen = rows.seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..1000).collect::<Vec<_>>());
    assert!(checkpoints.windows(2).all(|w| w[0] <= w[1]), "{checkpoints:?}");
    let step_rows_max = 1000 / CHECKPOINT_FRACTION + WINDOW_ROWS as u64;
    let gaps = std::iter::once(0).chain(checkpoints.iter().copied()).collect::<Vec<_>>();
    assert!(gaps.windows(2).all(|w| w[1] - w[0] <= step_rows_max), "a checkpoint about every 1/16: {checkpoints:?}");
    assert_eq!(progress.watermark_row(), 1000);
}

#[test]
fn a_stopped_operation_checkpoints_its_watermark_and_resumes_from_it() {
    let progress = Progress::new(400, 0, RATE_PERCENT_DEFAULT);
    let rows = FakeRows::new(|_| RowOutcome::Done);
    let stopper = Arc::clone(&rows.seen);
    let stop_at = Arc::new(AtomicU64::new(0));
    let submit = |row: u64, done: Box<dyn FnOnce(RowOutcome) + Send>| {
        if row == 100 {
            progress.set_control(Control::Stop);
            stop_at.store(row, Ordering::SeqCst);
        }
        stopper.lock().unwrap().push(row);
        done(RowOutcome::Done);
    };
    let mut checkpoints = Vec::new();
    let mut record = |watermark| checkpoints.push(watermark);
    let submit = row_by_row(&submit);
    let finish = run(&progress, Hooks { submit_rows: &submit, checkpoint: &mut record, clients_busy: &|| false, advanced: &|_| {} });
    assert_eq!(finish, Finish::Stopped);
    let watermark = progress.watermark_row();
    assert!((100..=100 + WINDOW_ROWS as u64).contains(&watermark), "{watermark}");
    assert_eq!(checkpoints.last(), Some(&watermark), "a stop records where it stopped");

    let resumed = Progress::new(400, watermark, RATE_PERCENT_DEFAULT);
    let rest = FakeRows::new(|_| RowOutcome::Done);
    assert_eq!(run_all(&resumed, &rest, &mut Vec::new()), Finish::Complete);
    let mut seen = rest.seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, (watermark..400).collect::<Vec<_>>(), "the rest, and only the rest");
}

#[test]
fn unrecoverable_rows_are_recorded_and_skipped_and_a_fatal_row_ends_the_run() {
    let progress = Progress::new(200, 0, RATE_PERCENT_DEFAULT);
    let rows = FakeRows::new(|row| if row % 50 == 7 { RowOutcome::Unrecoverable(format!("row {row}")) } else { RowOutcome::Done });
    assert_eq!(run_all(&progress, &rows, &mut Vec::new()), Finish::Complete);
    let mut bad = progress.bad_rows();
    bad.sort_unstable();
    assert_eq!(bad, vec![7, 57, 107, 157]);
    assert_eq!(progress.clean_rows(), 7, "done, but not clean past the first bad row");

    let progress = Progress::new(200, 0, RATE_PERCENT_DEFAULT);
    let rows = FakeRows::new(|row| if row == 60 { RowOutcome::Fatal("target failed".into()) } else { RowOutcome::Done });
    assert_eq!(run_all(&progress, &rows, &mut Vec::new()), Finish::Failed("target failed".into()));
    assert!(progress.watermark_row() <= 60, "the watermark never passes the row that failed");
}

#[test]
fn a_paused_operation_submits_nothing_until_resumed() {
    let progress = Progress::new(64, 0, RATE_PERCENT_DEFAULT);
    progress.set_control(Control::Pause);
    let rows = FakeRows::new(|_| RowOutcome::Done);
    std::thread::scope(|scope| {
        let runner = scope.spawn(|| run_all(&progress, &rows, &mut Vec::new()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(rows.seen.lock().unwrap().is_empty(), "nothing while paused");
        progress.set_control(Control::Run);
        assert_eq!(runner.join().unwrap(), Finish::Complete);
    });
}

#[test]
fn with_busy_clients_the_rate_slows_the_operation_down() {
    // Two bursts of a window each, every row 20 ms: 40 ms of work. At 25 % each burst is followed
    // by three times its length of pause, so the run takes at least about 160 ms; idle, 40 ms.
    let rows = 2 * WINDOW_ROWS as u64;
    let submit = |_row: u64, done: Box<dyn FnOnce(RowOutcome) + Send>| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            done(RowOutcome::Done);
        });
    };
    let timed = |busy: bool| {
        let progress = Progress::new(rows, 0, 25);
        let started = Instant::now();
        let submit = row_by_row(&submit);
        let finish = run(&progress, Hooks { submit_rows: &submit, checkpoint: &mut |_| {}, clients_busy: &|| busy, advanced: &|_| {} });
        assert_eq!(finish, Finish::Complete);
        started.elapsed()
    };
    let idle = timed(false);
    let busy = timed(true);
    // Lower bounds only: timing here is noisy, and a slow machine only makes both longer.
    assert!(busy >= Duration::from_millis(150), "busy {busy:?}");
    assert!(idle < busy, "idle {idle:?} is full speed, busy {busy:?} is throttled");
}

#[test]
fn runs_are_aligned_cover_every_row_once_and_report_each_row() {
    // 7-row runs over 100 rows from row 10: the first run ends at 14, the last is 2 rows long.
    let progress = Progress::new(100, 10, RATE_PERCENT_DEFAULT);
    progress.set_run_rows(7);
    let runs = Mutex::new(Vec::new());
    let submit = |first_row: u64, row_count: u64, done: Box<dyn FnOnce(Vec<RowOutcome>) + Send>| {
        runs.lock().unwrap().push((first_row, row_count));
        let outcomes = (first_row..first_row + row_count)
            .map(|row| if row == 50 { RowOutcome::Unrecoverable("row 50".into()) } else { RowOutcome::Done })
            .collect();
        std::thread::spawn(move || done(outcomes));
    };
    let finish = run(&progress, Hooks { submit_rows: &submit, checkpoint: &mut |_| {}, clients_busy: &|| false, advanced: &|_| {} });
    assert_eq!(finish, Finish::Complete);
    let mut runs = runs.into_inner().unwrap();
    runs.sort_unstable();
    assert_eq!(runs.first(), Some(&(10, 4)), "the first run ends where the alignment says");
    assert_eq!(runs.last(), Some(&(98, 2)), "the last run ends at the last row");
    assert!(runs.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), "runs follow each other without gaps or overlaps: {runs:?}");
    assert!(runs[1..].iter().all(|&(first, _)| first % 7 == 0), "later runs start on the alignment: {runs:?}");
    assert_eq!(progress.bad_rows(), vec![50], "a row's outcome inside a run is its own");
    assert_eq!(progress.watermark_row(), 100);
}

#[test]
fn checkpoints_and_advances_never_vouch_for_a_bad_row() {
    let progress = Progress::new(CHECKPOINT_FRACTION * 40, 0, RATE_PERCENT_DEFAULT);
    let rows = FakeRows::new(|row| if row == 90 { RowOutcome::Unrecoverable("row 90".into()) } else { RowOutcome::Done });
    let submit = rows.submit();
    let submit = row_by_row(&submit);
    let mut checkpoints = Vec::new();
    let advances = Mutex::new(Vec::new());
    let mut record = |row| checkpoints.push(row);
    let advanced = |row| advances.lock().unwrap().push(row);
    let hooks = Hooks { submit_rows: &submit, checkpoint: &mut record, clients_busy: &|| false, advanced: &advanced };
    assert_eq!(run(&progress, hooks), Finish::Complete);
    let advances = advances.into_inner().unwrap();
    assert!(advances.windows(2).all(|w| w[0] <= w[1]), "advances only move up: {advances:?}");
    assert!(advances.iter().any(|&row| row > 0 && row < 90), "advances are published as rows finish: {advances:?}");
    assert_eq!(advances.last(), Some(&90), "clean up to the bad row, not past it");
    assert!(checkpoints.iter().all(|&row| row <= 90), "a restart redoes the bad row: {checkpoints:?}");
    assert_eq!(progress.watermark_row(), progress.total_rows, "the run itself goes on past it");
}

#[test]
fn the_pause_holds_a_busy_operation_to_its_share_of_its_speed_alone() {
    let ms = Duration::from_millis;
    // 100 rows/s alone, rate 25: 10 rows are due in 400 ms. A burst of 100 ms pauses 300 ms...
    assert_eq!(pause_after(10, ms(100), 25, Some(100.0)), ms(300));
    // ...one that busy clients slowed to 400 ms or more pauses not at all.
    assert_eq!(pause_after(10, ms(400), 25, Some(100.0)), Duration::ZERO);
    assert_eq!(pause_after(10, ms(900), 25, Some(100.0)), Duration::ZERO);
    // Without a reference the burst's own speed stands in: a time share.
    assert_eq!(pause_after(10, ms(100), 25, None), ms(300));
    // Rate 100 never pauses, rate 0 pauses the fixed interval, and no pause is over the cap.
    assert_eq!(pause_after(10, ms(100), 100, Some(100.0)), Duration::ZERO);
    assert_eq!(pause_after(10, ms(100), 0, Some(100.0)), RATE_ZERO_BURST_INTERVAL);
    assert_eq!(pause_after(1000, ms(100), 1, Some(100.0)), PAUSE_MAX);
}
