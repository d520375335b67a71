//! A reader that polls its socket before it sleeps (`ServerConfig::poll_budget`): requests that
//! arrive while it polls, after it gave up and slept, and in pieces on either side of the
//! budget are all served whole, and a client that hangs up while it polls ends the connection.

mod common;

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use nbd::proto::{self, Command, Request};
use nbd::testing::MemDevice;
use nbd::{Client, ClientConfig, Export, NbdUri, Server, ServerConfig, ServerHandle, POLL_BUDGET_MAX};

const TIMEOUT: Duration = Duration::from_secs(10);
const BLOCK_BYTES: usize = 4096;
const POLL_BUDGET: Duration = Duration::from_micros(200);

fn serve_polling(dir: &TempDir, device: Arc<MemDevice>) -> (Server, ServerHandle) {
    let config = ServerConfig { poll_budget: POLL_BUDGET, ..ServerConfig::default() };
    let server = Server::with_config(vec![Export::new("vd0", device)], config).unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    (server, handle)
}

/// A client whose reads fail after [`TIMEOUT`] rather than wait forever for a lost reply.
fn connect(handle: &ServerHandle) -> Client {
    let NbdUri::Unix { socket_path, .. } = handle.uri("vd0") else { unreachable!() };
    let client = Client::connect(&NbdUri::Unix { socket_path, export_name: "vd0".into() }, &ClientConfig::default()).unwrap();
    // SO_RCVTIMEO belongs to the socket, so the duplicate sets it for the client too.
    raw_stream(&client).set_read_timeout(Some(TIMEOUT)).unwrap();
    client
}

/// The client's socket as a stream of our own (a duplicate descriptor), to send bytes the
/// client's own framing would send in one write.
fn raw_stream(client: &Client) -> UnixStream {
    // SAFETY: dup returns a new descriptor we own (checked below), which the stream closes.
    let fd = unsafe { libc::dup(client.socket_fd()) };
    assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is open and owned by nothing else.
    unsafe { UnixStream::from_raw_fd(fd) }
}

#[test]
fn requests_arriving_while_polling_after_it_and_in_pieces_are_served_whole() {
    let dir = TempDir::new("polling");
    let device = Arc::new(MemDevice::new(64 * BLOCK_BYTES as u64));
    let (_server, handle) = serve_polling(&dir, Arc::clone(&device));
    let mut client = connect(&handle);
    // Back to back (each request arrives while the reader polls), then with pauses far longer
    // than the budget (the reader sleeps in the kernel and is woken).
    for index in 0..32u64 {
        let data = random_bytes(BLOCK_BYTES, index);
        if index >= 24 {
            thread::sleep(POLL_BUDGET * 20);
        }
        client.write(index * BLOCK_BYTES as u64, &data, false).unwrap();
        assert_eq!(client.read(index * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), data, "block {index}");
    }
    // One write request in pieces: the header split inside its fields, the payload split too,
    // with pauses shorter and longer than the budget between them.
    let data = random_bytes(BLOCK_BYTES, 99);
    let request = Request { flags: 0, command: Command::Write, cookie: 7, offset: 40 * BLOCK_BYTES as u64, len_bytes: BLOCK_BYTES as u32 };
    let mut bytes = proto::encode_request(&request).to_vec();
    bytes.extend_from_slice(&data);
    let mut stream = raw_stream(&client);
    let cuts = [0, 3, 17, 28, 1000, 3000, bytes.len()];
    for (piece, pause_us) in cuts.windows(2).zip([20, 2_000, 50, 5_000, 10, 0]) {
        stream.write_all(&bytes[piece[0]..piece[1]]).unwrap();
        thread::sleep(Duration::from_micros(pause_us));
    }
    let mut reply = [0u8; 16];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(reply, proto::encode_simple_reply(7, 0), "the write in pieces succeeded");
    assert_eq!(client.read(40 * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), data, "and wrote what was sent");
}

#[test]
fn a_client_hanging_up_while_the_reader_polls_ends_the_connection() {
    let dir = TempDir::new("polling-hangup");
    let (_server, handle) = serve_polling(&dir, Arc::new(MemDevice::new(16 * BLOCK_BYTES as u64)));
    for _ in 0..20 {
        let mut client = connect(&handle);
        client.write(0, &random_bytes(BLOCK_BYTES, 1), false).unwrap();
        // The reader polls for the next request now; the client goes without a word.
        drop(client);
    }
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 0), "{} connections still open", handle.connections_open());
}

#[test]
fn a_poll_budget_beyond_the_maximum_is_refused_with_the_bound() {
    let config = ServerConfig { poll_budget: POLL_BUDGET_MAX + Duration::from_micros(1), ..ServerConfig::default() };
    let error = config.check().unwrap_err().to_string();
    assert!(error.contains("poll_budget") && error.contains("at most 1000 microseconds"), "{error}");
    assert!(ServerConfig { poll_budget: POLL_BUDGET_MAX, ..ServerConfig::default() }.check().is_ok());
}
