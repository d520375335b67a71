//! `storc`: the command line of the storc RAID controller.
//!
//! This crate is the outside edge: argument parsing, human and JSON output, and (as the
//! controller grows) the daemon, management API and console. Everything it shows comes from the
//! library crates; it computes nothing of its own.

mod api_types;
mod bench_cmd;
mod bench_engine;
mod bench_parity;
mod cli;
mod daemon;
mod manual;
mod report;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "storc",
    version,
    about = "A RAID controller in software",
    long_about = "A RAID controller in software, modelled on the MegaRAID controllers: RAID 0, 1, 1E, 5, 6, 10, 50, 60 and JBOD \
                  over files, block devices, RAM or emulated drives, served over NBD, managed with a storcli-style command line \
                  through the daemon's management API, with the reviewers' benchmark built in.",
    after_help = manual::OBJECT_SYNTAX_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller daemon: assemble the drives, serve every VD over NBD, and the API.
    Serve(daemon::Args),
    /// The reviewers' benchmark (patterns, suites, reports, file copies), and storc's own
    /// (parity kernels, engine against raw drives).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The manual page storc(1) in roff (man -l), or every page into a directory (--dir).
    Man(manual::ManArgs),
    /// A completion script for a shell (bash, zsh, fish, elvish, powershell), on stdout.
    Completions(manual::CompletionsArgs),
}

#[derive(Subcommand)]
#[command(after_help = bench_cmd::after_help())]
enum BenchCommand {
    /// Parity kernel throughput (XOR, P+Q, recovery) with the kernel set this CPU uses.
    Parity(bench_parity::Args),
    /// A RAID level over N drives next to the same drives driven raw, in one run.
    Engine(bench_engine::Args),
    /// Every built-in pattern of the reviewers' benchmark with its definition, and the suites.
    List(bench_cmd::ListArgs),
    /// One pattern against a target: storc bench run PATTERN --target TARGET.
    Run(bench_cmd::RunArgs),
    /// A suite of patterns against a target: storc bench suite review --target TARGET.
    Suite(bench_cmd::SuiteArgs),
    /// FC-Test-like file sets (ISO, MP3, Install, Windows, Programs): Create, Read, Copy Near, Copy Far in MB/s.
    Files(bench_cmd::FilesArgs),
    /// A self-contained HTML report from --json results: storc bench report R.json [--compare O.json] --html OUT.html.
    Report(bench_cmd::ReportArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("STORC_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    // storcli syntax (`storc /c0 show`) is parsed by hand: its object paths are not clap's style.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if first_object(&args).is_some_and(|a| a.starts_with("/c") || a.starts_with("/C")) {
        return cli::run(args);
    }
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Serve(args) => daemon::run(&args),
        Command::Bench(BenchCommand::Parity(args)) => bench_parity::run(&args),
        Command::Bench(BenchCommand::Engine(args)) => bench_engine::run(&args),
        Command::Bench(BenchCommand::List(args)) => bench_cmd::list(&args),
        Command::Bench(BenchCommand::Run(args)) => bench_cmd::run(&args),
        Command::Bench(BenchCommand::Suite(args)) => bench_cmd::suite(&args),
        Command::Bench(BenchCommand::Files(args)) => bench_cmd::files(&args),
        Command::Bench(BenchCommand::Report(args)) => bench_cmd::report(&args),
        Command::Man(args) => manual::man(Cli::command(), &args),
        Command::Completions(args) => manual::completions(Cli::command(), &args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("storc: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The first argument that is not `--api VALUE` / `--api=VALUE` or `--api-ca FILE` /
/// `--api-ca=FILE`: where a storcli object path sits.
fn first_object(args: &[String]) -> Option<&String> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--api" | "--api-ca" => {
                rest.next();
            }
            a if a.starts_with("--api=") || a.starts_with("--api-ca=") => {}
            _ => return Some(arg),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_object;

    #[test]
    fn the_object_path_follows_the_api_options() {
        let first = |args: &[&str]| first_object(&args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>()).cloned();
        assert_eq!(first(&["--api", "https://127.0.0.1:8443", "--api-ca", "ca.pem", "/c0", "show"]), Some("/c0".to_string()));
        assert_eq!(first(&["--api-ca=ca.pem", "--api=tcp:127.0.0.1:1", "/c0"]), Some("/c0".to_string()));
        assert_eq!(first(&["serve", "--api-listen", "127.0.0.1:8080"]), Some("serve".to_string()));
    }
}
