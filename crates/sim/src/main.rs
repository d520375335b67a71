//! `storc-sim --seed N` replays one run; `storc-sim --runs N [--start S]` runs many.
//! `--ssd-cache-seed N` and `--ssd-cache-runs N [--start S]` do the same for the write-back SSD
//! cache's runs (`sim::run_ssd_cache_seed`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(|v| v.parse::<u64>());
    let ssd_cache = args.iter().any(|a| a.starts_with("--ssd-cache-"));
    let (seed_flag, runs_flag) = if ssd_cache { ("--ssd-cache-seed", "--ssd-cache-runs") } else { ("--seed", "--runs") };
    let (seeds, verbose) = match seeds(value(seed_flag), value(runs_flag), value("--start")) {
        Ok(seeds) => seeds,
        Err(()) => return usage(&format!("give either {seed_flag} N, or {runs_flag} N [--start S] (numbers)")),
    };
    let failed = if ssd_cache { ssd_cache_runs(&seeds, verbose) } else { main_runs(&seeds, verbose) };
    println!("{} passed, {failed} failed", seeds.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

type Parsed = Option<Result<u64, std::num::ParseIntError>>;

/// The seeds asked for, and whether to print each run's report (one seed: a replay).
fn seeds(seed: Parsed, runs: Parsed, start: Parsed) -> Result<(Vec<u64>, bool), ()> {
    match (seed, runs, start) {
        (Some(Ok(seed)), None, None) => Ok((vec![seed], true)),
        (None, Some(Ok(runs)), None) => Ok(((0..runs).collect(), false)),
        (None, Some(Ok(runs)), Some(Ok(start))) => Ok(((start..start + runs).collect(), false)),
        _ => Err(()),
    }
}

/// Runs the main seeded runs; returns how many failed.
fn main_runs(seeds: &[u64], verbose: bool) -> usize {
    let mut failed = 0;
    let mut coverage = sim::Coverage::new();
    for seed in seeds {
        match sim::run_caught(*seed, sim::run_seed) {
            Ok(report) => {
                if verbose {
                    println!("{report}");
                }
                coverage.add(&report);
            }
            Err(failure) => {
                failed += 1;
                eprintln!("{failure}");
            }
        }
    }
    if !verbose {
        print!("{coverage}");
    }
    failed
}

/// Runs the write-back SSD cache's seeded runs; returns how many failed.
fn ssd_cache_runs(seeds: &[u64], verbose: bool) -> usize {
    let mut failed = 0;
    for seed in seeds {
        match sim::run_caught(*seed, sim::run_ssd_cache_seed) {
            Ok(report) if verbose => println!("{report:#?}"),
            Ok(_) => {}
            Err(failure) => {
                failed += 1;
                eprintln!("{failure}");
            }
        }
    }
    failed
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "storc-sim: {problem}\nusage: storc-sim --seed N | storc-sim --runs N [--start S] | storc-sim --ssd-cache-seed N | storc-sim --ssd-cache-runs N [--start S]"
    );
    ExitCode::from(2)
}
