//! Thousands of seeded runs of a write-back SSD cache (issue 13) against the reference model:
//! client writes, reads and flushes, destaging and drains, a cache SSD failing, power cuts
//! with the dirty lines read back at each restart, and under a redundant VD members failing
//! and rebuilt, strips gone bad and repaired, resyncs after power cuts, and a RAID1 cache VD's
//! bitmap and resync (`sim::run_ssd_cache_seed`). A failure names
//! its seed; `storc-sim --ssd-cache-seed N` replays its steps. `STORC_SIM_SSD_CACHE_RUNS`
//! changes the count (default 5,000).

#[test]
fn seeded_write_back_ssd_cache_runs_match_the_model() {
    let runs: u64 = std::env::var("STORC_SIM_SSD_CACHE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    // The runs wait on the threaded engine's threads more than they compute: twice the cores.
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let (reports, failures) = sim::run_seeds_on_threads(runs, 2 * cores, sim::run_ssd_cache_seed);
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed; first ones:\n{}",
        failures.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    let sum = |f: fn(&sim::SsdCacheReport) -> u64| reports.iter().map(f).sum::<u64>();
    let (absorbed, recovered, destaged, cuts) =
        (sum(|r| r.writes_absorbed), sum(|r| r.dirty_recovered), sum(|r| r.lines_destaged), sum(|r| r.power_cuts));
    let ssd_failed = reports.iter().filter(|r| r.ssd_failed).count();
    let (failures, rebuilds, repaired, resyncs) =
        (sum(|r| r.member_failures), sum(|r| r.rebuilds), sum(|r| r.strips_repaired), sum(|r| r.resyncs));
    let cache_resynced = sum(|r| r.cache_regions_resynced);
    let cuts_in_rebuild = sum(|r| r.power_cuts_in_rebuild);
    println!(
        "{runs} seeded write-back SSD cache runs passed: {} writes ({absorbed} kept on the cache VD), {} reads, {} flushes, {cuts} power cuts, {recovered} dirty lines read back, {destaged} lines destaged, {ssd_failed} runs with a cache SSD failed; under redundant VDs {failures} member failures, {rebuilds} rebuilds, {repaired} bad strips repaired, {resyncs} resyncs, {cuts_in_rebuild} power cuts during a RAID1 rebuild; {cache_resynced} cache VD regions resynced",
        sum(|r| r.writes),
        sum(|r| r.reads),
        sum(|r| r.flushes),
    );
    // The runs must keep exercising what they are for.
    if runs >= 500 {
        assert!(absorbed > runs && recovered > runs / 10 && destaged > runs, "the runs stopped exercising write-back");
        assert!(cuts > runs / 2 && ssd_failed as u64 > runs / 20, "the runs stopped cutting power or failing SSDs");
        assert!(
            rebuilds > runs / 2 && repaired > runs / 10 && resyncs > runs / 4,
            "the runs stopped rebuilding, repairing or resyncing redundant VDs"
        );
        assert!(cuts_in_rebuild > runs / 50, "the runs stopped cutting power during RAID1 rebuilds");
        assert!(cache_resynced > runs / 10, "the runs stopped cutting power under a RAID1 cache VD with both SSDs");
    }
}
