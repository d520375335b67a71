//! `storc-sim --seed N` replays one run; `storc-sim --runs N [--start S]` runs many.
//! `--ssd-cache-seed N` and `--ssd-cache-runs N [--start S]` do the same for the write-back SSD
//! cache's runs (`sim::run_ssd_cache_seed`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(|v| v.parse::<u64>());
    if args.iter().any(|a| a.starts_with("--ssd-cache-")) {
        return ssd_cache_runs(value("--ssd-cache-seed"), value("--ssd-cache-runs"), value("--start"));
    }
    let parsed = (value("--seed"), value("--runs"), value("--start"));
    let (seeds, verbose): (Vec<u64>, bool) = match parsed {
        (Some(Ok(seed)), None, None) => (vec![seed], true),
        (None, Some(Ok(runs)), start) => {
            let start = match start {
                Some(Ok(start)) => start,
                None => 0,
                Some(Err(_)) => return usage("--start takes a number"),
            };
            ((start..start + runs).collect(), false)
        }
        _ => return usage("give either --seed N, or --runs N [--start S]"),
    };
    let mut failed = 0;
    let mut coverage = sim::Coverage::new();
    for seed in &seeds {
        match sim::run_seed(*seed) {
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
    println!("{} passed, {failed} failed", seeds.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

type Parsed = Option<Result<u64, std::num::ParseIntError>>;

fn ssd_cache_runs(seed: Parsed, runs: Parsed, start: Parsed) -> ExitCode {
    let (seeds, verbose): (Vec<u64>, bool) = match (seed, runs, start) {
        (Some(Ok(seed)), None, None) => (vec![seed], true),
        (None, Some(Ok(runs)), None) => ((0..runs).collect(), false),
        (None, Some(Ok(runs)), Some(Ok(start))) => ((start..start + runs).collect(), false),
        _ => return usage("give either --ssd-cache-seed N, or --ssd-cache-runs N [--start S]"),
    };
    let mut failed = 0;
    for seed in &seeds {
        match sim::run_ssd_cache_seed(*seed) {
            Ok(report) if verbose => println!("{report:#?}"),
            Ok(_) => {}
            Err(failure) => {
                failed += 1;
                eprintln!("{failure}");
            }
        }
    }
    println!("{} passed, {failed} failed", seeds.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "storc-sim: {problem}\nusage: storc-sim --seed N | storc-sim --runs N [--start S] | storc-sim --ssd-cache-seed N | storc-sim --ssd-cache-runs N [--start S]"
    );
    ExitCode::from(2)
}
