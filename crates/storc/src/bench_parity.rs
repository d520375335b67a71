//! `storc bench parity`: throughput of the parity kernels on this CPU.

use crate::report::table;
use parity::bench::{self, BenchConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Data strips per stripe.
    #[arg(long, default_value_t = 8)]
    data_strips: usize,
    /// Strip size in KiB.
    #[arg(long, default_value_t = 64)]
    strip_kib: usize,
    /// Measure every kernel set this CPU supports, not only the one in use.
    #[arg(long)]
    all_kernels: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<(), String> {
    if !(2..=255).contains(&args.data_strips) {
        return Err(format!("--data-strips {} is not allowed; allowed: 2 to 255", args.data_strips));
    }
    if args.strip_kib == 0 || args.strip_kib > 64 * 1024 {
        return Err(format!("--strip-kib {} is not allowed; allowed: 1 to 65536", args.strip_kib));
    }
    let config = BenchConfig {
        data_strips: args.data_strips,
        strip_bytes: args.strip_kib * 1024,
        all_kernels: args.all_kernels,
        ..BenchConfig::default()
    };
    let results = bench::run(&config);
    if args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "op": r.op, "kernel": r.kernel, "data_strips": r.data_strips,
                    "strip_bytes": r.strip_bytes, "bytes_per_sec": r.bytes_per_sec,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("JSON of plain values"));
        return Ok(());
    }
    println!(
        "parity kernels in use: {}; {} data strips of {} KiB per call",
        parity::active_kernel_name(),
        args.data_strips,
        args.strip_kib
    );
    let rows: Vec<Vec<String>> =
        results.iter().map(|r| vec![r.op.to_string(), r.kernel.to_string(), format!("{:.2}", r.bytes_per_sec / 1e9)]).collect();
    println!("{}", table(&["op", "kernel", "GB/s (data bytes)"], &rows));
    Ok(())
}
