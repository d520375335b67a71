//! Thousands of seeded runs of a write-back SSD cache (issue 13) against the reference model:
//! client writes, reads and flushes, destaging and drains, a cache SSD failing, and power cuts
//! with the dirty lines read back at each restart (`sim::run_ssd_cache_seed`). A failure names
//! its seed; `storc-sim --ssd-cache-seed N` replays its steps. `STORC_SIM_SSD_CACHE_RUNS`
//! changes the count (default 5,000).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[test]
fn seeded_write_back_ssd_cache_runs_match_the_model() {
    let runs: u64 = std::env::var("STORC_SIM_SSD_CACHE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let reports = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= runs {
                    return;
                }
                match sim::run_ssd_cache_seed(seed) {
                    Ok(report) => reports.lock().unwrap().push(report),
                    Err(failure) => failures.lock().unwrap().push(failure),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed; first ones:\n{}",
        failures.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    let reports = reports.into_inner().unwrap();
    let sum = |f: fn(&sim::SsdCacheReport) -> u64| reports.iter().map(f).sum::<u64>();
    let (absorbed, recovered, destaged, cuts) =
        (sum(|r| r.writes_absorbed), sum(|r| r.dirty_recovered), sum(|r| r.lines_destaged), sum(|r| r.power_cuts));
    let ssd_failed = reports.iter().filter(|r| r.ssd_failed).count();
    println!(
        "{runs} seeded write-back SSD cache runs passed: {} writes ({absorbed} kept on the cache VD), {} reads, {} flushes, {cuts} power cuts, {recovered} dirty lines read back, {destaged} lines destaged, {ssd_failed} runs with a cache SSD failed",
        sum(|r| r.writes),
        sum(|r| r.reads),
        sum(|r| r.flushes),
    );
    // The runs must keep exercising what they are for.
    if runs >= 500 {
        assert!(absorbed > runs && recovered > runs / 10 && destaged > runs, "the runs stopped exercising write-back");
        assert!(cuts > runs / 2 && ssd_failed as u64 > runs / 20, "the runs stopped cutting power or failing SSDs");
    }
}
