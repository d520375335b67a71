//! Replies gathered into one write while the reader serves requests it already holds (the
//! cork, `server/replies.rs`). The cork must never hold a reply a client waits for while the
//! reader sleeps: these tests send bursts that push on every place the reader may block (the
//! in-flight bounds, a payload not yet read, an empty socket) and fail if any reply is stuck.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use nbd::testing::MemDevice;
use nbd::{BlockDevice, Done, ReadDone};
use nbd::{Client, ClientConfig, Export, NbdUri, Server, ServerConfig, ServerHandle};

/// A stuck reply shows as a client that waits this long.
const TIMEOUT: Duration = Duration::from_secs(10);
const BLOCK_BYTES: usize = 4096;

fn serve(dir: &TempDir, device: Arc<dyn ErasedForTest>, config: ServerConfig) -> (Server, ServerHandle) {
    let export = device.export("vd0");
    let server = Server::with_config(vec![export], config).unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    (server, handle)
}

/// Either device as an export.
trait ErasedForTest: Send + Sync {
    fn export(self: Arc<Self>, name: &str) -> Export;
}

impl ErasedForTest for MemDevice {
    fn export(self: Arc<Self>, name: &str) -> Export {
        Export::new(name, self)
    }
}

impl ErasedForTest for SlowFlushDevice {
    fn export(self: Arc<Self>, name: &str) -> Export {
        Export::new(name, self)
    }
}

fn connect(handle: &ServerHandle) -> Client {
    let NbdUri::Unix { socket_path, .. } = handle.uri("vd0") else { unreachable!() };
    Client::connect(&NbdUri::Unix { socket_path, export_name: "vd0".into() }, &ClientConfig::default()).unwrap()
}

/// Runs `client_work` on its own thread and fails the test if it takes longer than
/// [`TIMEOUT`] (a reply held in the cork would hang it forever). A server whose reader is stuck
/// would hang its own drop too, so on a timeout it is leaked and the test fails at once.
fn within_timeout(what: &str, served: (Server, ServerHandle), client_work: impl FnOnce() + Send + 'static) -> (Server, ServerHandle) {
    let (finished_tx, finished) = mpsc::channel();
    let worker = thread::spawn(move || {
        client_work();
        let _ = finished_tx.send(());
    });
    match finished.recv_timeout(TIMEOUT) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => worker.join().unwrap(), // re-raises its panic
        Err(mpsc::RecvTimeoutError::Timeout) => {
            std::mem::forget(served);
            panic!("{what}: a reply did not arrive within {TIMEOUT:?}");
        }
    }
    served
}

/// Sends `count` 4 KiB writes and then `count` reads of the same blocks in one burst, then
/// reads every reply: each write succeeds, and each read returns the block as it was before
/// (zeros) or as written (NBD lets a server serve requests in flight in any order, and its
/// readers take turns). Then every block reads back what was written.
fn burst_of_writes_then_reads(mut client: Client, count: usize) {
    let blocks: Vec<Vec<u8>> = (0..count).map(|i| random_bytes(BLOCK_BYTES, i as u64 + 1)).collect();
    let mut reads = std::collections::HashMap::new();
    for (index, block) in blocks.iter().enumerate() {
        client.submit_write((index * BLOCK_BYTES) as u64, block, false).unwrap();
    }
    for index in 0..count {
        reads.insert(client.submit_read((index * BLOCK_BYTES) as u64, BLOCK_BYTES as u32).unwrap(), index);
    }
    client.send_submitted().unwrap();
    let zeros = vec![0u8; BLOCK_BYTES];
    for _ in 0..2 * count {
        let completion = client.wait().unwrap();
        let data = completion.result.unwrap_or_else(|error| panic!("request {} failed: {error}", completion.cookie));
        if let Some(index) = reads.remove(&completion.cookie) {
            assert!(data == blocks[index] || data == zeros, "read of block {index} in the burst: neither before nor as written");
        }
    }
    assert!(reads.is_empty(), "reads without a reply: {reads:?}");
    for (index, block) in blocks.iter().enumerate() {
        assert_eq!(&client.read((index * BLOCK_BYTES) as u64, BLOCK_BYTES as u32).unwrap(), block, "block {index} after the burst");
    }
}

/// Regression guard: corked replies hold credits. A burst longer than the connection's request
/// bound makes the reader wait for credit with replies in the cork; it must send them first,
/// or it waits for itself.
#[test]
fn a_burst_beyond_the_request_bound_is_answered_whole() {
    let dir = TempDir::new("cork-requests");
    let config = ServerConfig { requests_in_flight_max: 4, ..ServerConfig::default() };
    let served = serve(&dir, Arc::new(MemDevice::new(1 << 20)), config);
    let client = connect(&served.1);
    let (_server, handle) = within_timeout("requests bound", served, move || burst_of_writes_then_reads(client, 64));
    assert!(wait_until(TIMEOUT, || handle.requests_in_flight() == 0), "credits leaked");
}

/// The same for the payload bounds, the connection's and the server's.
#[test]
fn a_burst_beyond_the_payload_bounds_is_answered_whole() {
    let dir = TempDir::new("cork-payload");
    let config = ServerConfig {
        payload_in_flight_bytes_max: 4 * BLOCK_BYTES,
        payload_in_flight_bytes_total_max: 6 * BLOCK_BYTES,
        ..ServerConfig::default()
    };
    let served = serve(&dir, Arc::new(MemDevice::new(1 << 20)), config);
    let clients: Vec<Client> = (0..2).map(|_| connect(&served.1)).collect();
    let (_server, handle) = within_timeout("payload bounds", served, move || {
        let workers: Vec<_> = clients.into_iter().map(|client| thread::spawn(move || burst_of_writes_then_reads(client, 64))).collect();
        workers.into_iter().for_each(|worker| worker.join().unwrap());
    });
    assert!(wait_until(TIMEOUT, || handle.payload_in_flight_bytes() == 0), "credits leaked");
}

/// A reply completed on another thread after the reader emptied its buffer and went to sleep
/// goes out at once: the cork is closed while the reader may block, so it cannot catch it.
#[test]
fn a_reply_completed_elsewhere_while_the_reader_sleeps_is_not_held() {
    let dir = TempDir::new("cork-elsewhere");
    let device = Arc::new(SlowFlushDevice { inner: MemDevice::new(1 << 20), delay: Duration::from_millis(100) });
    let served = serve(&dir, device, ServerConfig::default());
    let mut client = connect(&served.1);
    within_timeout("slow flush", served, move || {
        for round in 0..5u64 {
            // The FLUSH completes on the device's thread 100 ms after the reader, having served
            // the read in place from the same burst, emptied its buffer and blocked.
            let flush = client.submit_flush().unwrap();
            let read = client.submit_read(round * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap();
            client.send_submitted().unwrap();
            let mut cookies = vec![client.wait().unwrap().cookie, client.wait().unwrap().cookie];
            cookies.sort_unstable();
            let mut expected = vec![flush, read];
            expected.sort_unstable();
            assert_eq!(cookies, expected);
        }
    });
}

/// A memory device whose FLUSH completes on a thread of its own after `delay`, as a shard
/// completes a request the reader handed it.
struct SlowFlushDevice {
    inner: MemDevice,
    delay: Duration,
}

impl BlockDevice for SlowFlushDevice {
    type Buf = Vec<u8>;

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn block_size_bytes(&self) -> u32 {
        self.inner.block_size_bytes()
    }

    fn alloc(&self, len_bytes: usize) -> Vec<u8> {
        self.inner.alloc(len_bytes)
    }

    fn flush_is_global(&self) -> bool {
        true
    }

    fn supports_trim(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, buf: Vec<u8>, done: ReadDone<Vec<u8>>) {
        self.inner.read(offset, buf, done);
    }

    fn write(&self, offset: u64, buf: Vec<u8>, fua: bool, done: Done) {
        self.inner.write(offset, buf, fua, done);
    }

    fn flush(&self, done: Done) {
        let delay = self.delay;
        thread::spawn(move || {
            thread::sleep(delay);
            done(Ok(()));
        });
    }

    fn trim(&self, offset: u64, len_bytes: u64, done: Done) {
        self.inner.trim(offset, len_bytes, done);
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        self.inner.write_zeroes(offset, len_bytes, fua, done);
    }
}

/// The point of the cork: a burst of requests the reader holds at once is answered in one
/// socket write, not one per reply (nbdkit writes each reply on its own). Eight 4 KiB reads
/// sent in one write, five times; the best burst must take one write, and every burst fewer
/// writes than replies. (A reader preempted twice in one burst on a loaded host may switch to
/// handing the socket over, which sends the cork early: hence the best of five, not each.)
#[test]
fn a_burst_of_reads_is_answered_in_one_socket_write() {
    const READS: usize = 8;
    let dir = TempDir::new("cork-one-write");
    let device = Arc::new(MemDevice::new(1 << 20));
    for block in 0..READS {
        device.fill((block * BLOCK_BYTES) as u64, &random_bytes(BLOCK_BYTES, 500 + block as u64));
    }
    let (server, handle) = serve(&dir, device, ServerConfig::default());
    let mut client = connect(&handle);
    let mut writes_per_burst = Vec::new();
    for _ in 0..5 {
        let before = server.stats();
        let cookies: Vec<u64> =
            (0..READS).map(|block| client.submit_read((block * BLOCK_BYTES) as u64, BLOCK_BYTES as u32).unwrap()).collect();
        client.send_submitted().unwrap();
        for (block, cookie) in cookies.into_iter().enumerate() {
            let data = client.wait_for(cookie).unwrap().result.unwrap();
            assert_eq!(data, random_bytes(BLOCK_BYTES, 500 + block as u64), "block {block}");
        }
        let after = server.stats();
        assert_eq!(after.replies_sent - before.replies_sent, READS as u64, "every reply of the burst is counted once");
        writes_per_burst.push(after.reply_writes - before.reply_writes);
    }
    println!("socket writes per burst of {READS} replies: {writes_per_burst:?}");
    assert_eq!(writes_per_burst.iter().min(), Some(&1), "no burst of {READS} reads went out in one write: {writes_per_burst:?}");
    assert!(writes_per_burst.iter().all(|&writes| writes < READS as u64), "a burst took a write per reply: {writes_per_burst:?}");
    drop(client);
    drop(handle);
}
