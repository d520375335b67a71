//! Issue 8, "memory and threads are unbounded": every bound of `ServerConfig` against clients
//! that push on it. Each test names what it pins; short bounds keep them fast.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use nbd::proto::{self, InfoRequest};
use nbd::testing::MemDevice;
use nbd::{Client, ClientConfig, ClientError, Export, ListenAddress, NbdUri, Server, ServerConfig, ServerHandle};

const TIMEOUT: Duration = Duration::from_secs(10);

fn serve_with(dir: &TempDir, exports: Vec<Export>, config: ServerConfig) -> (Server, ServerHandle) {
    let server = if exports.is_empty() { Server::empty(config) } else { Server::with_config(exports, config) }.unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    (server, handle)
}

fn mem_export(name: &str, size_bytes: u64) -> Export {
    Export::new(name, Arc::new(MemDevice::new(size_bytes)))
}

fn socket_path(handle: &ServerHandle) -> std::path::PathBuf {
    match handle.address() {
        ListenAddress::Unix(path) => path.clone(),
        other => panic!("expected a unix listener, got {other:?}"),
    }
}

fn connect(handle: &ServerHandle, export_name: &str) -> Result<Client, ClientError> {
    let NbdUri::Unix { socket_path, .. } = handle.uri(export_name) else { unreachable!() };
    Client::connect(&NbdUri::Unix { socket_path, export_name: export_name.into() }, &ClientConfig::default())
}

/// True once the server has closed the connection (EOF or reset, not a timeout).
fn is_closed_by_server(stream: &mut UnixStream) -> bool {
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut bytes = [0u8; 4096];
    loop {
        match stream.read(&mut bytes) {
            Ok(0) => return true,
            Ok(_) => continue, // a greeting or replies the test did not read
            Err(error) => return error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

// ---- (a) the handshake deadline covers the whole negotiation ---------------------------------

/// Regression: the timeout applied per read, so a client sending one byte every 20 s held a
/// connection (and its threads) for as long as it liked.
#[test]
fn a_client_dribbling_its_handshake_is_dropped_at_the_whole_handshake_deadline() {
    let deadline = Duration::from_millis(1000);
    let dribble_interval = Duration::from_millis(100); // far inside any per-read timeout
    let dir = TempDir::new("dribble");
    let config = ServerConfig { handshake_timeout: deadline, ..ServerConfig::default() };
    let (_server, handle) = serve_with(&dir, vec![mem_export("vd0", MIB)], config);
    let mut stream = UnixStream::connect(socket_path(&handle)).unwrap();
    let started = Instant::now();
    let mut bytes = vec![0, 0, 0, 3];
    let request = InfoRequest { export_name: "x".repeat(1000), info_types: vec![] };
    bytes.extend(proto::encode_option(proto::NBD_OPT_GO, &proto::encode_info_request(&request)));
    let dropped_after = bytes.iter().find_map(|byte| {
        thread::sleep(dribble_interval);
        stream.write_all(&[*byte]).err().map(|_| started.elapsed())
    });
    let dropped_after = dropped_after.unwrap_or_else(|| panic!("still connected after dribbling for {:?}", started.elapsed()));
    assert!(dropped_after >= deadline, "dropped after {dropped_after:?}, before the {deadline:?} deadline");
    assert!(dropped_after < deadline * 3, "dropped only after {dropped_after:?}; the deadline is {deadline:?}");
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 0));
}

// ---- (b) connections beyond connections_max are refused ----------------------------------------

#[test]
fn connections_beyond_the_maximum_are_refused_and_the_others_keep_working() {
    let dir = TempDir::new("connections-max");
    let config = ServerConfig { connections_max: 3, ..ServerConfig::default() };
    let (server, handle) = serve_with(&dir, vec![mem_export("vd0", MIB)], config);
    let mut clients: Vec<Client> = (0..3).map(|_| connect(&handle, "vd0").unwrap()).collect();
    let mut refused = UnixStream::connect(socket_path(&handle)).unwrap();
    assert!(is_closed_by_server(&mut refused), "a fourth connection was served");
    assert!(matches!(connect(&handle, "vd0"), Err(ClientError::Io(_))), "a fourth client got through the handshake");
    assert_eq!(handle.connections_refused(), 2);
    for (index, client) in clients.iter_mut().enumerate() {
        client.write(index as u64 * 512, &[index as u8 + 1; 512], false).unwrap();
        assert_eq!(client.read(index as u64 * 512, 512).unwrap(), vec![index as u8 + 1; 512]);
    }
    clients.pop().unwrap().disconnect().unwrap();
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 2));
    let mut again = connect(&handle, "vd0").expect("a place freed by a disconnect is given to the next client");
    assert_eq!(again.read(0, 512).unwrap(), vec![1; 512]);
    // What the daemon's metrics report: over every listener, the refused ones apart.
    let stats = server.stats();
    assert_eq!((stats.connections_open, stats.connections_max), (3, 3), "{stats:?}");
    assert_eq!((stats.connections_accepted, stats.connections_refused), (4, 2), "{stats:?}");
}

// ---- (c) payload in flight is bounded across connections ---------------------------------------

/// Regression: the payload bound was per connection only, so a crowd of clients pipelining
/// 1 MiB reads and hanging up pushed the daemon's RSS to 7.9 GB.
#[test]
fn many_clients_pipelining_large_reads_and_hanging_up_stay_under_the_total_payload_bound() {
    const CLIENTS: usize = 16;
    const READS_PER_CLIENT: u64 = 16;
    let total_max_bytes = 8 * MIB as usize;
    let dir = TempDir::new("payload-total");
    let config = ServerConfig {
        payload_in_flight_bytes_max: 4 * MIB as usize,
        payload_in_flight_bytes_total_max: total_max_bytes,
        ..ServerConfig::default()
    };
    let (_server, handle) = serve_with(&dir, vec![mem_export("vd0", 16 * MIB)], config);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut client = connect(&handle, "vd0").unwrap();
            thread::spawn(move || {
                for index in 0..READS_PER_CLIENT {
                    client.submit_read(index * MIB, MIB as u32).unwrap();
                }
                client.send_submitted().unwrap();
                thread::sleep(Duration::from_millis(300)); // let the server fill up behind us
                drop(client); // hang up without reading a reply
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 0), "{} connections still open", handle.connections_open());
    let peak_bytes = handle.payload_in_flight_bytes_peak();
    assert!(peak_bytes <= total_max_bytes, "{peak_bytes} payload bytes were in flight; the total bound is {total_max_bytes}");
    assert!(peak_bytes > 4 * MIB as usize, "only {peak_bytes} bytes in flight at the peak: the test did not reach the bound");
    assert_eq!((handle.payload_in_flight_bytes(), handle.requests_in_flight()), (0, 0), "credits leaked");
}

// ---- (d) a client that never reads its replies ---------------------------------------------------

/// Regression: a client that sent reads and never read the replies pinned its connection's
/// 64 MiB of buffers (and two threads) for as long as it stayed connected.
#[test]
fn a_client_that_never_reads_replies_is_dropped_after_the_stall_timeout() {
    let stall_timeout = Duration::from_millis(500);
    let dir = TempDir::new("stall");
    let config = ServerConfig { reply_stall_timeout: stall_timeout, ..ServerConfig::default() };
    let (_server, handle) = serve_with(&dir, vec![mem_export("vd0", 64 * MIB)], config);
    let mut client = connect(&handle, "vd0").unwrap();
    for index in 0..32 {
        client.submit_read(index * MIB, MIB as u32).unwrap();
    }
    client.send_submitted().unwrap();
    assert!(wait_until(TIMEOUT, || handle.payload_in_flight_bytes() > 0));
    let stalled_at = Instant::now();
    assert!(
        wait_until(TIMEOUT, || handle.connections_open() == 0),
        "a client that reads nothing is still connected after {:?} (stall timeout {stall_timeout:?})",
        stalled_at.elapsed()
    );
    assert_eq!((handle.payload_in_flight_bytes(), handle.requests_in_flight()), (0, 0), "credits leaked");
    drop(client); // held open until here: the server, not the client, ended the connection
}

/// Regression: after a client hung up, its reader went on serving every request still queued
/// in the socket (reading 1 MiB from the device for each) for nobody.
#[test]
fn requests_queued_behind_a_hang_up_are_not_served() {
    const READS: u64 = 200;
    let dir = TempDir::new("hang-up");
    let device = Arc::new(MemDevice::new(MIB));
    let config = ServerConfig { payload_in_flight_bytes_max: 4 * MIB as usize, ..ServerConfig::default() };
    let (_server, handle) = serve_with(&dir, vec![Export::new("vd0", Arc::clone(&device))], config);
    let mut client = connect(&handle, "vd0").unwrap();
    for _ in 0..READS {
        client.submit_read(0, MIB as u32).unwrap();
    }
    client.send_submitted().unwrap(); // 200 headers fit in the socket; their replies do not
    assert!(wait_until(TIMEOUT, || handle.payload_in_flight_bytes() == 4 * MIB as usize));
    drop(client);
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 0));
    let served = device.counters().reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(served < READS / 4, "{served} of {READS} reads were served after the client hung up");
}

// ---- (e) a server with no exports ----------------------------------------------------------------

/// Regression: the default export "" of an empty export list was index 0 of nothing, and the
/// connection thread panicked.
#[test]
fn the_default_export_of_a_server_without_exports_is_unknown() {
    let dir = TempDir::new("no-exports");
    let (_server, handle) = serve_with(&dir, Vec::new(), ServerConfig::default());
    match connect(&handle, "") {
        Err(ClientError::OptionRejected { reply_type, message, .. }) => {
            assert_eq!(reply_type, proto::NBD_REP_ERR_UNKNOWN);
            assert_eq!(message, "no export named \"\": this server has no exports yet");
        }
        Err(other) => panic!("expected NBD_REP_ERR_UNKNOWN, got {other}"),
        Ok(_) => panic!("connected to the default export of a server with none"),
    }
    // The old EXPORT_NAME cannot be answered with an error: the spec says disconnect.
    let mut stream = UnixStream::connect(socket_path(&handle)).unwrap();
    stream.read_exact(&mut [0u8; proto::GREETING_BYTES]).unwrap();
    stream.write_all(&[0, 0, 0, 3]).unwrap();
    stream.write_all(&proto::encode_option(proto::NBD_OPT_EXPORT_NAME, b"")).unwrap();
    assert!(is_closed_by_server(&mut stream));
    require_tool("nbdinfo", "libnbd-bin");
    let uri = format!("nbd+unix:///?socket={}", socket_path(&handle).display());
    let output = Command::new("nbdinfo").arg(&uri).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "nbdinfo {uri} succeeded against a server without exports");
    // libnbd reports NBD_REP_ERR_UNKNOWN as ENOENT.
    assert!(stderr.contains("No such file or directory for the default export"), "nbdinfo does not say the export is unknown: {stderr}");
    let listing = stdout(&run(Command::new("nbdinfo").arg("--list").arg(&uri)));
    assert!(!listing.contains("export="), "nbdinfo --list shows exports of a server without any:\n{listing}");
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 0));
}

// ---- (f) set_exports ends the connections of removed exports ------------------------------------

#[test]
fn set_exports_ends_connections_to_removed_exports_and_keeps_renamed_ones() {
    let dir = TempDir::new("identity");
    let kept = Arc::new(MemDevice::new(MIB));
    let exports = vec![Export::new("a", Arc::clone(&kept)).with_identity(7), mem_export("b", MIB), mem_export("c", MIB).with_identity(8)];
    let (server, handle) = serve_with(&dir, exports, ServerConfig::default());
    let mut to_a = connect(&handle, "a").unwrap();
    let mut to_b = connect(&handle, "b").unwrap();
    let mut to_c = connect(&handle, "c").unwrap();
    to_a.write(0, &[4; 512], false).unwrap();
    // "a" is renamed (same identity), "b" (identified by its name) and "c" (identity 8) go.
    server.set_exports(vec![Export::new("a-renamed", Arc::clone(&kept)).with_identity(7), mem_export("b2", MIB)]).unwrap();
    assert!(to_b.read(0, 512).is_err(), "a connection to a removed export still serves");
    assert!(to_c.read(0, 512).is_err(), "a connection to a removed export still serves");
    assert_eq!(to_a.read(0, 512).unwrap(), vec![4; 512], "the connection to a renamed export was ended");
    assert_eq!(server.connections_to("a-renamed"), 1);
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 1));
    assert!(matches!(connect(&handle, "a"), Err(ClientError::OptionRejected { .. })), "the old name still answers");
    assert_eq!(connect(&handle, "a-renamed").unwrap().read(0, 512).unwrap(), vec![4; 512]);
}

// ---- (f) replies sent in place, in part -----------------------------------------------------------

/// A device that completes reads in place has their replies sent by the connection's reader
/// itself, without blocking: while the client reads nothing, the socket fills, a reply goes
/// out in part and the writer thread sends the rest before anything else. Every reply must
/// then arrive whole, with the right data, once the client reads.
#[test]
fn replies_sent_in_part_while_the_client_does_not_read_arrive_whole() {
    const READS: u64 = 64;
    const READ_BYTES: u64 = 60 << 10;
    let dir = TempDir::new("in-place");
    let device = Arc::new(MemDevice::new(READS * READ_BYTES));
    let (_server, handle) = serve_with(&dir, vec![Export::new("vd0", Arc::clone(&device))], ServerConfig::default());
    let mut client = connect(&handle, "vd0").unwrap();
    let pattern: Vec<u8> = (0..READS * READ_BYTES).map(|i| (i % 251) as u8).collect();
    client.write(0, &pattern, false).unwrap();
    let mut cookies = std::collections::HashMap::new();
    for index in 0..READS {
        cookies.insert(client.submit_read(index * READ_BYTES, READ_BYTES as u32).unwrap(), index);
    }
    client.send_submitted().unwrap();
    // Far more than the socket holds is waiting by now; some reply went out in part.
    thread::sleep(Duration::from_millis(300));
    for _ in 0..READS {
        let completion = client.wait().unwrap();
        let index = cookies.remove(&completion.cookie).expect("a reply for a request sent, once");
        let at = (index * READ_BYTES) as usize;
        assert_eq!(completion.result.unwrap(), &pattern[at..at + READ_BYTES as usize], "read {index}");
    }
    assert_eq!((handle.payload_in_flight_bytes(), handle.requests_in_flight()), (0, 0), "credits released");
}
