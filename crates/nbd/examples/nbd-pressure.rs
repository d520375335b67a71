//! Clients that push on an NBD server's bounds, for `bench/nbd-pressure` (issue 8):
//!
//! ```text
//! nbd-pressure burst URI CLIENTS READS_PER_CLIENT ROUNDS   pipeline 1 MiB reads, hang up unread
//! nbd-pressure idle URI CONNECTIONS HOLD_SECS              hold handshaken idle connections
//! ```
//!
//! Each prints one summary line: how many connections were served and how many refused.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nbd::{Client, ClientConfig, NbdUri};

const READ_BYTES: u32 = 1 << 20;

#[derive(Default)]
struct Tally {
    served: AtomicUsize,
    refused: AtomicUsize,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["burst", uri, clients, reads, rounds] => (|| burst(&parse_uri(uri)?, number(clients)?, number(reads)?, number(rounds)?))(),
        ["idle", uri, connections, hold_secs] => (|| idle(&parse_uri(uri)?, number(connections)?, number(hold_secs)?))(),
        _ => Err("usage: nbd-pressure burst URI CLIENTS READS_PER_CLIENT ROUNDS | idle URI CONNECTIONS HOLD_SECS".to_string()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("nbd-pressure: {message}");
            ExitCode::FAILURE
        }
    }
}

fn parse_uri(text: &str) -> Result<NbdUri, String> {
    text.parse().map_err(|e| format!("{text}: {e}"))
}

fn number(text: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("{text:?} is not a count; allowed: a whole number"))
}

/// `rounds` times: `clients` clients at once each send `reads` 1 MiB reads, read none of the
/// replies, and hang up.
fn burst(uri: &NbdUri, clients: usize, reads: usize, rounds: usize) -> Result<(), String> {
    let tally = Tally::default();
    let started = Instant::now();
    for _ in 0..rounds {
        thread::scope(|scope| {
            for client_index in 0..clients {
                let tally = &tally;
                scope.spawn(move || pipeline_and_hang_up(uri, client_index, reads, tally));
            }
        });
    }
    let (served, refused) = (tally.served.load(Ordering::SeqCst), tally.refused.load(Ordering::SeqCst));
    println!(
        "burst: {served} connections sent {reads} reads of 1 MiB each and hung up, {refused} refused, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn pipeline_and_hang_up(uri: &NbdUri, client_index: usize, reads: usize, tally: &Tally) {
    let Ok(mut client) = Client::connect(uri, &ClientConfig::default()) else {
        tally.refused.fetch_add(1, Ordering::SeqCst);
        return;
    };
    let read_count = client.export().size_bytes / u64::from(READ_BYTES);
    for index in 0..reads {
        let offset = ((client_index + index) as u64 % read_count) * u64::from(READ_BYTES);
        if client.submit_read(offset, READ_BYTES).is_err() {
            break;
        }
    }
    // The server may stop reading (back-pressure) before it has all: a send that blocks is
    // the point, so it gets a moment and then the client hangs up anyway.
    let _ = client.send_submitted();
    thread::sleep(Duration::from_millis(200));
    tally.served.fetch_add(1, Ordering::SeqCst);
}

/// Opens `connections` connections through the handshake, holds them idle for `hold_secs`.
fn idle(uri: &NbdUri, connections: usize, hold_secs: usize) -> Result<(), String> {
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..connections {
        match Client::connect(uri, &ClientConfig::default()) {
            Ok(client) => held.push(client),
            Err(_) => refused += 1,
        }
    }
    println!("idle: {} connections open, {refused} refused; holding them {hold_secs} s", held.len());
    thread::sleep(Duration::from_secs(hold_secs as u64));
    Ok(())
}
