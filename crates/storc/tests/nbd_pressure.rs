//! Issue 8 in CI, a small `bench/nbd-pressure`: the real daemon against clients that pipeline
//! 1 MiB reads and hang up without reading, then idle connections up to the limit and past it.
//! The daemon's RSS stays under a stated bound, falls back once the clients are gone, and
//! `storc /c0 show` answers throughout.

mod common;

use common::*;
use nbd::{Client, ClientConfig, NbdUri};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const CONNECTIONS_MAX: usize = 24;
const IN_FLIGHT_TOTAL_BYTES: u64 = 64 * MIB;
const IDLE_BUFFERS_BYTES: u64 = 16 * MIB;
/// What a connection may hold beyond its payload: a reader's 8 KiB buffer, the reply writer's
/// 64 KiB, the touched part of two stacks.
const PER_CONNECTION_BYTES: u64 = 128 << 10;
/// Allocator and engine bookkeeping: the bound is about what clients can make grow.
const SLACK_BYTES: u64 = 48 * MIB;
const BURST_CLIENTS: usize = 16;
const BURST_READS_PER_CLIENT: u64 = 32;
const BURST_ROUNDS: usize = 2;
const IDLE_EXTRA: usize = 4;
const CLI_ANSWER_MAX: Duration = Duration::from_secs(5);

/// `VmRSS` or `VmHWM` of a process, in bytes.
fn status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's /proc status");
    let line = status.lines().find(|line| line.starts_with(key)).unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("a size in kB") << 10
}

/// Runs `storc /c0 show` until `stop`, recording each answer's time (or a failure).
fn probe_cli(api_socket: std::path::PathBuf, stop: Arc<AtomicBool>, answers: Arc<Mutex<Vec<Result<Duration, String>>>>) {
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_storc")).args(["/c0", "show", "--api"]).arg(&api_socket).output();
        let answer = match output {
            Ok(output) if output.status.success() => Ok(started.elapsed()),
            Ok(output) => Err(format!("exit {}: {}", output.status, String::from_utf8_lossy(&output.stderr))),
            Err(error) => Err(error.to_string()),
        };
        answers.lock().unwrap().push(answer);
        thread::sleep(Duration::from_millis(100));
    }
}

/// `BURST_CLIENTS` clients at once pipeline 1 MiB reads and hang up without reading a reply. A
/// client may be refused while the last round's connections are still winding down.
fn burst(uri: &NbdUri) {
    thread::scope(|scope| {
        for client_index in 0..BURST_CLIENTS as u64 {
            scope.spawn(move || {
                let Ok(mut client) = Client::connect(uri, &ClientConfig::default()) else {
                    return;
                };
                let read_count = client.export().size_bytes / MIB;
                for index in 0..BURST_READS_PER_CLIENT {
                    client.submit_read((client_index + index) % read_count * MIB, MIB as u32).unwrap();
                }
                let _ = client.send_submitted(); // may fail once the server pushes back and we give up
                thread::sleep(Duration::from_millis(200));
            });
        }
    });
}

/// Opens idle connections up to the limit (retrying while the bursts' connections wind down),
/// then `IDLE_EXTRA` beyond it; returns the open ones and how many of the extra were refused.
fn idle_connections(uri: &NbdUri) -> (Vec<Client>, usize) {
    let mut open = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while open.len() < CONNECTIONS_MAX && Instant::now() < deadline {
        match Client::connect(uri, &ClientConfig::default()) {
            Ok(client) => open.push(client),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
    let refused = (0..IDLE_EXTRA).filter(|_| Client::connect(uri, &ClientConfig::default()).is_err()).count();
    (open, refused)
}

#[test]
fn rss_stays_bounded_and_the_cli_answers_under_nbd_clients_that_hang_up_or_idle() {
    let scratch = Scratch::new("nbd-pressure");
    let limits = [
        ["--nbd-connections-max", &CONNECTIONS_MAX.to_string()],
        ["--nbd-connection-in-flight-bytes-max", "16MiB"],
        ["--nbd-in-flight-bytes-max", &format!("{}MiB", IN_FLIGHT_TOTAL_BYTES / MIB)],
        ["--nbd-idle-buffers-bytes-max", &format!("{}MiB", IDLE_BUFFERS_BYTES / MIB)],
    ];
    let args: Vec<&str> = limits.iter().flatten().copied().collect();
    let daemon = Daemon::start_with_args(&scratch, &mem_drives(8, "64MiB"), &args);
    daemon.create_vd("r5", &[0, 1, 2, 3, 4, 5, 6, 7], "v0");
    let uri: NbdUri = daemon.tcp_uri("v0").parse().unwrap();
    let pid = daemon.pid();
    thread::sleep(Duration::from_millis(500));
    let baseline_bytes = status_bytes(pid, "VmRSS:");
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let prober = thread::spawn({
        let (socket, stop, answers) = (daemon.api_socket(), Arc::clone(&stop), Arc::clone(&answers));
        move || probe_cli(socket, stop, answers)
    });

    for _ in 0..BURST_ROUNDS {
        burst(&uri);
    }
    let (open, refused) = idle_connections(&uri);
    thread::sleep(Duration::from_secs(1)); // the CLI keeps answering with every place taken
    let idle_open = open.len();
    drop(open);
    let idle_bound_bytes = baseline_bytes + IDLE_BUFFERS_BYTES + SLACK_BYTES;
    let fell_back = wait_until_rss_below(pid, idle_bound_bytes);
    stop.store(true, Ordering::SeqCst);
    prober.join().unwrap();

    let bound_bytes =
        baseline_bytes + IN_FLIGHT_TOTAL_BYTES + IDLE_BUFFERS_BYTES + SLACK_BYTES + CONNECTIONS_MAX as u64 * PER_CONNECTION_BYTES;
    let peak_bytes = status_bytes(pid, "VmHWM:");
    let after_bytes = status_bytes(pid, "VmRSS:");
    let answers = answers.lock().unwrap();
    let slowest = answers.iter().filter_map(|answer| answer.as_ref().ok()).max().copied().unwrap_or_default();
    let mib = |bytes: u64| bytes / MIB;
    println!(
        "RSS bound {} MiB (baseline {} + in flight {} + idle buffers {} + slack {} + {CONNECTIONS_MAX} x 128 KiB), peak {} MiB, \
         after the clients {} MiB (bound {} MiB); CLI: {} answers, slowest {slowest:?}; idle: {idle_open} open, {refused} refused",
        mib(bound_bytes),
        mib(baseline_bytes),
        mib(IN_FLIGHT_TOTAL_BYTES),
        mib(IDLE_BUFFERS_BYTES),
        mib(SLACK_BYTES),
        mib(peak_bytes),
        mib(after_bytes),
        mib(idle_bound_bytes),
        answers.len()
    );
    assert!(
        peak_bytes <= bound_bytes,
        "RSS peaked at {} MiB, over the bound of {} MiB\n{}",
        mib(peak_bytes),
        mib(bound_bytes),
        daemon.log_tail()
    );
    assert!(fell_back, "RSS stayed at {} MiB after the clients left, over {} MiB", mib(after_bytes), mib(idle_bound_bytes));
    let failures: Vec<&String> = answers.iter().filter_map(|answer| answer.as_ref().err()).collect();
    assert!(failures.is_empty(), "storc /c0 show failed under NBD pressure: {failures:?}");
    assert!(slowest <= CLI_ANSWER_MAX, "storc /c0 show took {slowest:?}; allowed: {CLI_ANSWER_MAX:?}");
    assert_eq!((idle_open, refused), (CONNECTIONS_MAX, IDLE_EXTRA), "idle connections (open, refused) with a limit of {CONNECTIONS_MAX}");
    daemon.stop();
}

/// Waits up to 10 s for the daemon's RSS to fall to `bound_bytes`: connections end and free
/// their buffers asynchronously after the clients hang up.
fn wait_until_rss_below(pid: u32, bound_bytes: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if status_bytes(pid, "VmRSS:") <= bound_bytes {
            return true;
        }
        thread::sleep(Duration::from_millis(100));
    }
    false
}
