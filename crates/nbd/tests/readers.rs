//! A connection's readers take turns (`ServerConfig::readers_per_connection`): handing the
//! socket over before every request that empties it (`HandOver::Always`), a client that waits
//! for each reply is served by one reader after another, every byte read back as written; while
//! requests are quick (`HandOver::WhenSlow`), the reader that read a request serves it and reads
//! on; once they are slow, requests that came together are served together; while a connection
//! measures which way serves a waiting client faster (`HandOver::Auto`), it is served both
//! ways, every byte read back; with one reader,
//! one thread serves everything; and a connection whose client hangs up ends with all its
//! readers; a reader count out of bounds is refused.

mod common;

use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use nbd::proto::{self, Command, Request};
use nbd::testing::MemDevice;
use nbd::{Client, ClientConfig, Export, HandOver, Server, ServerConfig, ServerHandle, READERS_PER_CONNECTION_MAX};

const BLOCK_BYTES: usize = 4096;
const BLOCKS: u64 = 64;

/// The tests count the process's threads: they run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serve(dir: &TempDir, readers: usize) -> (Server, ServerHandle, Arc<MemDevice>) {
    serve_handing_over(dir, readers, HandOver::WHEN_SLOW)
}

fn serve_handing_over(dir: &TempDir, readers: usize, hand_over: HandOver) -> (Server, ServerHandle, Arc<MemDevice>) {
    let device = Arc::new(MemDevice::new(BLOCKS * BLOCK_BYTES as u64));
    let config = ServerConfig { readers_per_connection: readers, hand_over, ..ServerConfig::default() };
    let server = Server::with_config(vec![Export::new("vd0", Arc::clone(&device))], config).unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    (server, handle, device)
}

/// Writes then reads back every block, one request at a time, twice over.
fn write_and_read_back_one_at_a_time(handle: &ServerHandle) {
    let mut client = Client::connect(&handle.uri("vd0"), &ClientConfig::default()).unwrap();
    for pass in 0..2u64 {
        for block in 0..BLOCKS {
            let data = random_bytes(BLOCK_BYTES, pass * BLOCKS + block);
            client.write(block * BLOCK_BYTES as u64, &data, false).unwrap();
            assert_eq!(client.read(block * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), data, "pass {pass} block {block}");
        }
    }
    client.flush().unwrap();
}

#[test]
fn a_client_that_waits_for_each_reply_is_served_by_the_readers_in_turn() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-turns");
    let (_server, handle, device) = serve_handing_over(&dir, 4, HandOver::Always);
    write_and_read_back_one_at_a_time(&handle);
    // Each request empties the socket, so its reader hands the socket on before serving it:
    // the next request is read, and submitted, by another thread.
    let threads = device.counters().submitting_threads();
    assert!((2..=4).contains(&threads), "{threads} of the 4 readers served the 257 requests");
    // A reader that kept the turn while it served would take it straight back: 15-17 of 257
    // requests came from another reader than the one before when tried. Released before the
    // request is served, the turn goes to another reader for 43-123 of them (the releasing
    // reader often takes it back before the woken one runs; a fair hand-over to the next
    // reader every time measured slower at QD 1).
    let changes = device.counters().submitter_changes();
    println!("{threads} readers served 257 requests, {changes} of them after another reader's");
    assert!(changes >= 30, "only {changes} of 257 requests came from another reader than the one before");
}

/// A connection's first ~16,000 round trips keep the turn and the next ~16,000 hand it over
/// (`HandOver::Auto` measures both ways, in windows of 16,384 intervals between requests that
/// came alone to an idle connection): a client that waits for each reply is served by one
/// reader, then by the readers in turn, and reads back every byte either way.
#[test]
fn a_client_that_waits_for_each_reply_is_served_both_ways_while_its_connection_measures() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-auto");
    // Never slow, so only the measurement hands the turn over.
    let (_server, handle, device) = serve_handing_over(&dir, 4, HandOver::Auto { slower_than: Duration::from_secs(3600) });
    let mut client = Client::connect(&handle.uri("vd0"), &ClientConfig::default()).unwrap();
    let mut round_trips = |requests: u64, pass: u64| {
        for request in (0..requests).step_by(2) {
            let block = request / 2 % BLOCKS;
            let data = random_bytes(BLOCK_BYTES, pass * 1_000_000 + request);
            client.write(block * BLOCK_BYTES as u64, &data, false).unwrap();
            assert_eq!(client.read(block * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), data, "pass {pass} request {request}");
        }
    };
    round_trips(16_000, 0);
    assert_eq!(device.counters().submitting_threads(), 1, "the first window keeps the turn");
    assert_eq!(device.counters().submitter_changes(), 0);
    round_trips(16_000, 1);
    let (threads, changes) = (device.counters().submitting_threads(), device.counters().submitter_changes());
    println!("the second window: {threads} readers, {changes} changes of reader in 16,000 requests");
    assert!(threads >= 2 && changes >= 100, "the second window hands the turn over: {threads} readers, {changes} changes");
}

/// No dispatch takes this long, so the readers never see one as slow.
const NEVER_SLOW: HandOver = HandOver::WhenSlow { slower_than: Duration::from_secs(3600) };

#[test]
fn while_requests_are_quick_the_reader_that_read_one_serves_it_and_reads_on() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-quick");
    let (_server, handle, device) = serve_handing_over(&dir, 4, NEVER_SLOW);
    write_and_read_back_one_at_a_time(&handle);
    // The reader that took the socket first keeps it: no other reader is ever woken.
    assert_eq!(device.counters().submitting_threads(), 1);
    assert_eq!(device.counters().submitter_changes(), 0);
    // A burst is served in order by that reader too.
    let reads_max = pipelined_reads(&handle, &device);
    assert_eq!(reads_max, 1, "{reads_max} reads were served at once by readers that never saw a slow one");
}

#[test]
fn slow_requests_that_come_together_are_served_together() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-slow");
    let (_server, handle, device) = serve(&dir, 8);
    // A read in place that goes to a disk; 20 ms is far above the 50 us that makes it slow.
    device.set_read_delay(Duration::from_millis(20));
    let reads_max = pipelined_reads(&handle, &device);
    // The first two reads are served by the reader that read them, which then sees reads are
    // slow (two slow ones close together) and passes the socket before each of the others: up
    // to 8 are served at once. Served one after another, as before, the 16 reads took 16 times
    // 20 ms.
    println!("at most {reads_max} of 16 slow reads were served at once by 8 readers");
    assert!(reads_max >= 4, "only {reads_max} of 16 slow reads sent together were served at once by 8 readers");
}

/// Sends 16 reads of distinct blocks in one burst, checks each reply's data, and returns the
/// most reads the device served at once.
fn pipelined_reads(handle: &ServerHandle, device: &MemDevice) -> u64 {
    for block in 0..16u64 {
        device.fill(block * BLOCK_BYTES as u64, &random_bytes(BLOCK_BYTES, 1000 + block));
    }
    let mut client = Client::connect(&handle.uri("vd0"), &ClientConfig::default()).unwrap();
    let cookies: Vec<u64> = (0..16u64).map(|block| client.submit_read(block * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap()).collect();
    client.send_submitted().unwrap();
    for (block, cookie) in cookies.into_iter().enumerate() {
        let data = client.wait_for(cookie).unwrap().result.unwrap();
        assert_eq!(data, random_bytes(BLOCK_BYTES, 1000 + block as u64), "block {block}");
    }
    device.counters().reads_at_once_max.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn one_reader_serves_every_request_itself() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-one");
    let (_server, handle, device) = serve(&dir, 1);
    write_and_read_back_one_at_a_time(&handle);
    assert_eq!(device.counters().submitting_threads(), 1);
    assert_eq!(device.counters().submitter_changes(), 0);
}

#[test]
fn a_client_that_hangs_up_mid_request_ends_the_connection_and_all_its_readers() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("readers-hangup");
    let (server, handle, _device) = serve(&dir, 8);
    let threads_before = process_thread_count();
    let mut client = Client::connect(&handle.uri("vd0"), &ClientConfig::default()).unwrap();
    client.write(0, &random_bytes(BLOCK_BYTES, 1), false).unwrap();
    assert!(wait_until(Duration::from_secs(10), || process_thread_count() >= threads_before + 9), "8 readers and a writer started");
    // Half a request header on the client's socket (a duplicate descriptor), then the client
    // is gone: the reader holding the turn is mid-header, the others wait for it.
    let request = Request { flags: 0, command: Command::Read, cookie: 9, offset: 0, len_bytes: BLOCK_BYTES as u32 };
    // SAFETY: dup returns a new descriptor we own (checked below), which the stream closes.
    let fd = unsafe { libc::dup(client.socket_fd()) };
    assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is open and owned by nothing else.
    let mut stream = unsafe { UnixStream::from_raw_fd(fd) };
    stream.write_all(&proto::encode_request(&request)[..proto::REQUEST_HEADER_BYTES / 2]).unwrap();
    drop(stream);
    drop(client);
    assert!(wait_until(Duration::from_secs(10), || server.stats().connections_open == 0), "the connection ended");
    assert!(wait_until(Duration::from_secs(10), || process_thread_count() <= threads_before), "its threads are gone");
}

fn process_thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_reader_count_out_of_range_is_refused_with_the_bounds() {
    for readers in [0, READERS_PER_CONNECTION_MAX + 1] {
        let config = ServerConfig { readers_per_connection: readers, ..ServerConfig::default() };
        let error = Server::with_config(vec![Export::new("vd0", Arc::new(MemDevice::new(4096)))], config).err().unwrap().to_string();
        assert_eq!(error, format!("readers_per_connection is {readers}; allowed: 1 to {READERS_PER_CONNECTION_MAX}"));
    }
    for readers in [1, READERS_PER_CONNECTION_MAX] {
        assert!(ServerConfig { readers_per_connection: readers, ..ServerConfig::default() }.check().is_ok());
    }
}
