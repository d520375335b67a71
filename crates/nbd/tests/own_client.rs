//! The server against this crate's own client (and raw sockets, for what no polite client
//! sends): out-of-order completions, error codes, hostile clients, disconnects, the in-flight
//! bound, shutdown. And the client against nbdkit, so each side is checked by a third party.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use nbd::proto::{self, Command, InfoRequest};
use nbd::testing::{MemDevice, Nbdkit};
use nbd::{BlockDevice, Client, ClientConfig, ClientError, Done, Export, NbdUri, ReadDone, Server, ServerHandle};

const TIMEOUT: Duration = Duration::from_secs(10);

// ---- A device that holds requests until the test releases them --------------------------------

type Held = Box<dyn FnOnce() + Send>;

/// Wraps a MemDevice; while holding, requests are parked instead of executed, and released
/// later from another thread (as the engine's shards complete), in order or reversed.
struct HeldDevice {
    inner: Arc<MemDevice>,
    holding: Mutex<bool>,
    /// Each held request with its offset, in the order they reached the device (one lock, so
    /// the two agree): the readers may pass requests that arrived together to it in any order.
    held: Mutex<Vec<(u64, Held)>>,
}

impl HeldDevice {
    fn new(size_bytes: u64) -> Arc<HeldDevice> {
        Arc::new(HeldDevice { inner: Arc::new(MemDevice::new(size_bytes)), holding: Mutex::new(true), held: Mutex::default() })
    }

    fn held_count(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Runs every held request on a new thread, newest first if `reversed`; stops holding.
    fn release(&self, reversed: bool) -> thread::JoinHandle<()> {
        *self.holding.lock().unwrap() = false;
        let mut held = std::mem::take(&mut *self.held.lock().unwrap());
        if reversed {
            held.reverse();
        }
        thread::spawn(move || {
            for (_, request) in held {
                request();
            }
        })
    }

    /// The offsets of the requests held since the last release, in the order they came.
    fn held_offsets(&self) -> Vec<u64> {
        self.held.lock().unwrap().iter().map(|(offset, _)| *offset).collect()
    }

    fn run_or_hold(&self, offset: u64, request: Held) {
        if *self.holding.lock().unwrap() {
            self.held.lock().unwrap().push((offset, request));
        } else {
            request();
        }
    }
}

impl BlockDevice for HeldDevice {
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
        false
    }
    fn supports_trim(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: Vec<u8>, done: ReadDone<Vec<u8>>) {
        let inner = Arc::clone(&self.inner);
        self.run_or_hold(offset, Box::new(move || inner.read(offset, buf, done)));
    }
    fn write(&self, offset: u64, buf: Vec<u8>, fua: bool, done: Done) {
        let inner = Arc::clone(&self.inner);
        self.run_or_hold(offset, Box::new(move || inner.write(offset, buf, fua, done)));
    }
    fn flush(&self, done: Done) {
        let inner = Arc::clone(&self.inner);
        self.run_or_hold(0, Box::new(move || inner.flush(done)));
    }
    fn trim(&self, offset: u64, len_bytes: u64, done: Done) {
        let inner = Arc::clone(&self.inner);
        self.run_or_hold(offset, Box::new(move || inner.trim(offset, len_bytes, done)));
    }
    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        let inner = Arc::clone(&self.inner);
        self.run_or_hold(offset, Box::new(move || inner.write_zeroes(offset, len_bytes, fua, done)));
    }
}

fn serve<D: BlockDevice>(dir: &TempDir, device: Arc<D>) -> ServerHandle {
    let server = Server::new(vec![Export::new("vd0", device)]).unwrap();
    server.serve_unix(dir.join("nbd.sock")).unwrap()
}

fn connect(handle: &ServerHandle, structured_replies: bool) -> Client {
    Client::connect(&handle.uri("vd0"), &ClientConfig { structured_replies }).unwrap()
}

fn server_error(result: Result<impl std::fmt::Debug, ClientError>) -> nbd::NbdError {
    match result {
        Err(ClientError::Server(error)) => error,
        other => panic!("expected a server error, got {other:?}"),
    }
}

// ---- Out-of-order completions -------------------------------------------------------------------

fn reads_completed_in_reverse_land_correctly(structured_replies: bool) {
    const READS: usize = 16;
    const READ_BYTES: usize = 64 * 1024;
    let dir = TempDir::new("reverse");
    let device = HeldDevice::new(READS as u64 * READ_BYTES as u64);
    let data = random_bytes(READS * READ_BYTES, 3);
    device.inner.fill(0, &data);
    let handle = serve(&dir, Arc::clone(&device));
    let mut client = connect(&handle, structured_replies);
    assert_eq!(client.export().structured_replies, structured_replies);
    let cookies: Vec<u64> = (0..READS).map(|index| client.submit_read((index * READ_BYTES) as u64, READ_BYTES as u32).unwrap()).collect();
    // wait() sends the queued requests; run it on this thread only once they are all held.
    let waiter = thread::spawn(move || {
        let completions: Vec<_> = (0..READS).map(|_| client.wait().unwrap()).collect();
        completions
    });
    assert!(wait_until(TIMEOUT, || device.held_count() == READS), "the server did not submit all reads at once");
    let submitted: Vec<u64> = device.held_offsets().iter().map(|&offset| cookies[offset as usize / READ_BYTES]).collect();
    device.release(true).join().unwrap();
    let completions = waiter.join().unwrap();
    let order: Vec<u64> = completions.iter().map(|completion| completion.cookie).collect();
    let reversed: Vec<u64> = submitted.iter().rev().copied().collect();
    assert_eq!(order, reversed, "replies should follow completion order (the reverse of submission)");
    for completion in completions {
        let index = cookies.iter().position(|&cookie| cookie == completion.cookie).unwrap();
        let expected = &data[index * READ_BYTES..(index + 1) * READ_BYTES];
        assert!(completion.result.unwrap() == expected, "read {index} returned the wrong bytes");
    }
}

#[test]
fn out_of_order_completions_land_correctly_with_simple_replies() {
    reads_completed_in_reverse_land_correctly(false);
}

#[test]
fn out_of_order_completions_land_correctly_with_structured_replies() {
    reads_completed_in_reverse_land_correctly(true);
}

#[test]
fn pipelined_writes_then_reads_round_trip_over_tcp() {
    let device = Arc::new(MemDevice::new(16 * MIB));
    let server = Server::new(vec![Export::new("vd0", Arc::clone(&device))]).unwrap();
    let handle = server.serve_tcp("127.0.0.1:0").unwrap();
    let mut client = connect(&handle, true);
    let data = random_bytes(16 * MIB as usize, 4);
    let chunk_bytes = 256 * 1024;
    for (index, chunk) in data.chunks(chunk_bytes).enumerate() {
        client.submit_write((index * chunk_bytes) as u64, chunk, false).unwrap();
        if client.in_flight() >= 32 {
            client.wait().unwrap().result.unwrap();
        }
    }
    while client.in_flight() > 0 {
        client.wait().unwrap().result.unwrap();
    }
    client.flush().unwrap();
    assert!(device.snapshot(0, data.len()) == data);
    let read_back = client.read(MIB, MIB as u32).unwrap();
    assert!(read_back == data[MIB as usize..2 * MIB as usize]);
    client.disconnect().unwrap();
}

// ---- Errors -----------------------------------------------------------------------------------

#[test]
fn misaligned_and_past_end_requests_get_einval_or_enospc() {
    let dir = TempDir::new("errors");
    let (handle, device) = serve_mem(&dir, "vd0", MIB);
    for structured_replies in [false, true] {
        let mut client = connect(&handle, structured_replies);
        let size_bytes = client.export().size_bytes;
        assert_eq!(server_error(client.read(1, 512)).error, proto::NBD_EINVAL);
        assert_eq!(server_error(client.read(0, 100)).error, proto::NBD_EINVAL);
        assert_eq!(server_error(client.read(size_bytes - 512, 1024)).error, proto::NBD_EINVAL);
        assert_eq!(server_error(client.write(size_bytes, &[1; 512], false)).error, proto::NBD_ENOSPC);
        assert_eq!(server_error(client.write(512, &[1; 100], false)).error, proto::NBD_EINVAL);
        assert_eq!(server_error(client.write_zeroes(size_bytes - 512, 1024, false)).error, proto::NBD_ENOSPC);
        // TRIM is advertised (MemDevice deallocates), so past the end is EINVAL, not ENOSPC.
        assert_eq!(server_error(client.trim(size_bytes, 512)).error, proto::NBD_EINVAL);
        let unknown_flag = client.submit_request(Command::Read, 1 << 9, 0, 512, &[]).unwrap();
        assert_eq!(client.wait_for(unknown_flag).unwrap().result.unwrap_err().error, proto::NBD_EINVAL);
        let write_error = server_error(client.write(size_bytes, &[1; 512], false));
        if structured_replies {
            assert_eq!(write_error.message, "Write of 512 bytes at offset 1048576 ends past the export size of 1048576 bytes");
        }
        // The rejected writes' payloads were skipped: the stream is still framed.
        client.write(512, &[7; 512], false).unwrap();
        assert_eq!(client.read(512, 512).unwrap(), vec![7; 512]);
        client.disconnect().unwrap();
    }
    assert_eq!(device.counters().writes.load(Ordering::Relaxed), 2, "rejected writes must not reach the device");
}

#[test]
fn unknown_export_is_refused_with_the_list_of_exports() {
    let dir = TempDir::new("unknown-export");
    let (handle, _device) = serve_mem(&dir, "vd0", MIB);
    let NbdUri::Unix { socket_path, .. } = handle.uri("vd0") else { unreachable!() };
    let uri = NbdUri::Unix { socket_path, export_name: "vd9".into() };
    match Client::connect(&uri, &ClientConfig::default()) {
        Err(ClientError::OptionRejected { reply_type, message, .. }) => {
            assert_eq!(reply_type, proto::NBD_REP_ERR_UNKNOWN);
            assert_eq!(message, "no export named \"vd9\"; exports: vd0");
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("connected to an export that does not exist"),
    }
}

#[test]
fn flush_fua_trim_and_write_zeroes_reach_the_device() {
    let dir = TempDir::new("commands");
    let (handle, device) = serve_mem(&dir, "vd0", MIB);
    let mut client = connect(&handle, false);
    let counters = device.counters();
    client.write(0, &[9; 4096], true).unwrap();
    assert_eq!(counters.fua_writes.load(Ordering::Relaxed), 1);
    client.flush().unwrap();
    assert_eq!(counters.flushes.load(Ordering::Relaxed), 1);
    client.trim(0, 1024).unwrap();
    assert_eq!(counters.flushes.load(Ordering::Relaxed), 1);
    // TRIM with FUA must be persisted before the reply: the server flushes after it.
    let trim_fua = client.submit_request(Command::Trim, proto::NBD_CMD_FLAG_FUA, 0, 1024, &[]).unwrap();
    client.wait_for(trim_fua).unwrap().result.unwrap();
    assert_eq!(counters.flushes.load(Ordering::Relaxed), 2);
    assert_eq!(client.read(0, 2048).unwrap()[..1024], [0; 1024]);
    // Without NO_HOLE the device may deallocate; with it the server writes zeros instead.
    client.write_zeroes(1024, 1024, false).unwrap();
    assert_eq!(counters.write_zeroes.load(Ordering::Relaxed), 1);
    let writes_before = counters.writes.load(Ordering::Relaxed);
    client.write_zeroes(2048, 1024, true).unwrap();
    assert_eq!(counters.write_zeroes.load(Ordering::Relaxed), 1);
    assert_eq!(counters.writes.load(Ordering::Relaxed), writes_before + 1);
    assert_eq!(client.read(0, 4096).unwrap()[..3072], [0; 3072]);
    assert_eq!(client.read(3072, 1024).unwrap(), vec![9; 1024]);
}

// ---- Raw sockets: what a hostile or broken client sends ---------------------------------------

/// Does the handshake by hand (NBD_OPT_GO for "vd0", simple replies) and returns the socket in
/// the transmission phase.
fn raw_transmission(socket_path: &Path) -> UnixStream {
    let stream = UnixStream::connect(socket_path).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    negotiate(stream)
}

/// The same over TCP, to a server listening on `handle`'s loopback address.
fn raw_tcp_transmission(handle: &ServerHandle) -> std::net::TcpStream {
    let nbd::ListenAddress::Tcp(address) = handle.address() else { panic!("expected a TCP listener") };
    let stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    negotiate(stream)
}

/// The fixed-newstyle handshake up to transmission, on export "vd0".
fn negotiate<S: Read + Write>(mut stream: S) -> S {
    let mut greeting = [0u8; proto::GREETING_BYTES];
    stream.read_exact(&mut greeting).unwrap();
    proto::parse_greeting(&greeting).unwrap();
    stream.write_all(&[0, 0, 0, 3]).unwrap();
    let request = InfoRequest { export_name: "vd0".into(), info_types: vec![] };
    stream.write_all(&proto::encode_option(proto::NBD_OPT_GO, &proto::encode_info_request(&request))).unwrap();
    loop {
        let (reply_type, _) = read_option_reply(&mut stream);
        if reply_type == proto::NBD_REP_ACK {
            return stream;
        }
        assert_eq!(reply_type, proto::NBD_REP_INFO);
    }
}

fn read_option_reply(stream: &mut impl Read) -> (u32, Vec<u8>) {
    let mut header = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = proto::parse_option_reply_header(&header).unwrap();
    let mut data = vec![0; header.len_bytes as usize];
    stream.read_exact(&mut data).unwrap();
    (header.reply_type, data)
}

/// Reads one simple reply header and returns (error, cookie).
fn read_simple_reply(stream: &mut impl Read) -> (u32, u64) {
    let mut header = [0u8; proto::SIMPLE_REPLY_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    match proto::parse_reply_header(&header).unwrap() {
        proto::ReplyHeader::Simple { error, cookie } => (error, cookie),
        other => panic!("expected a simple reply, got {other:?}"),
    }
}

/// True once the server has closed the connection (EOF or reset, not a timeout).
fn is_closed_by_server(stream: &mut UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

fn socket_path(handle: &ServerHandle) -> std::path::PathBuf {
    match handle.address() {
        nbd::ListenAddress::Unix(path) => path.clone(),
        other => panic!("expected a unix listener, got {other:?}"),
    }
}

#[test]
fn hostile_clients_are_dropped_while_another_connection_keeps_working() {
    let dir = TempDir::new("hostile");
    let (handle, _device) = serve_mem(&dir, "vd0", MIB);
    let path = socket_path(&handle);
    let mut good = connect(&handle, false);
    good.write(0, &[5; 512], false).unwrap();

    // Garbage after the handshake: the framing is lost, so the server hangs up.
    let mut garbage = raw_transmission(&path);
    garbage.write_all(&[0xAB; 64]).unwrap();
    assert!(is_closed_by_server(&mut garbage), "garbage request was not dropped");

    // A WRITE announcing 1 GiB of payload: EINVAL, then a hard disconnect.
    let mut oversized = raw_transmission(&path);
    oversized.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_WRITE, 77, 0, 1 << 30)).unwrap();
    assert_eq!(read_simple_reply(&mut oversized), (proto::NBD_EINVAL, 77));
    assert!(is_closed_by_server(&mut oversized), "oversized write was not dropped");

    // An option announcing 4 GiB of data during the handshake: ERR_TOO_BIG, then a disconnect.
    let mut big_option = UnixStream::connect(&path).unwrap();
    big_option.set_read_timeout(Some(TIMEOUT)).unwrap();
    big_option.read_exact(&mut [0u8; proto::GREETING_BYTES]).unwrap();
    big_option.write_all(&[0, 0, 0, 3]).unwrap();
    let mut option = proto::encode_option(proto::NBD_OPT_GO, &[]);
    option[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    big_option.write_all(&option).unwrap();
    assert_eq!(read_option_reply(&mut big_option).0, proto::NBD_REP_ERR_TOO_BIG);
    assert!(is_closed_by_server(&mut big_option), "oversized option was not dropped");

    // Unknown client flags: dropped at once, as the spec requires.
    let mut bad_flags = UnixStream::connect(&path).unwrap();
    bad_flags.set_read_timeout(Some(TIMEOUT)).unwrap();
    bad_flags.read_exact(&mut [0u8; proto::GREETING_BYTES]).unwrap();
    bad_flags.write_all(&[0xff, 0, 0, 3]).unwrap();
    assert!(is_closed_by_server(&mut bad_flags), "unknown client flags were not dropped");

    // Meanwhile the polite client is served as if nothing happened.
    assert_eq!(good.read(0, 512).unwrap(), vec![5; 512]);
    good.write(512, &[6; 512], true).unwrap();
    assert_eq!(good.read(512, 512).unwrap(), vec![6; 512]);
    assert!(wait_until(TIMEOUT, || handle.connections_open() == 1), "dropped connections still open");
}

#[test]
fn unknown_options_and_commands_get_errors_and_the_connection_goes_on() {
    let dir = TempDir::new("unknown");
    let (handle, device) = serve_mem(&dir, "vd0", MIB);
    device.fill(0, &[3; 512]);
    let path = socket_path(&handle);
    let mut stream = UnixStream::connect(&path).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.read_exact(&mut [0u8; proto::GREETING_BYTES]).unwrap();
    stream.write_all(&[0, 0, 0, 3]).unwrap();
    stream.write_all(&proto::encode_option(proto::NBD_OPT_STARTTLS, &[])).unwrap();
    let (reply_type, message) = read_option_reply(&mut stream);
    assert_eq!(reply_type, proto::NBD_REP_ERR_UNSUP);
    assert!(String::from_utf8(message).unwrap().contains("supported: EXPORT_NAME, ABORT, LIST, INFO, GO"));
    // Then enter transmission with the old EXPORT_NAME (NO_ZEROES was negotiated: no padding).
    stream.write_all(&proto::encode_option(proto::NBD_OPT_EXPORT_NAME, b"vd0")).unwrap();
    let mut export_reply = [0u8; proto::EXPORT_NAME_REPLY_BYTES];
    stream.read_exact(&mut export_reply).unwrap();
    assert_eq!(u64::from_be_bytes(export_reply[..8].try_into().unwrap()), MIB);
    stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_BLOCK_STATUS, 41, 0, 512)).unwrap();
    assert_eq!(read_simple_reply(&mut stream), (proto::NBD_EINVAL, 41));
    stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_READ, 42, 0, 512)).unwrap();
    assert_eq!(read_simple_reply(&mut stream), (0, 42));
    let mut data = [0u8; 512];
    stream.read_exact(&mut data).unwrap();
    assert_eq!(data, [3; 512]);
}

/// A WRITE whose payload comes in pieces, the header alone first (as libnbd sends it) and the
/// data in three writes with pauses: the reader waits for the rest of a small payload in one
/// read (MSG_WAITALL on a Unix socket, the low-water mark SO_RCVLOWAT at what is missing on TCP),
/// so each piece is taken and the write lands whole, over both, with and without a poll budget
/// (whose polls take a piece before the rest). The final READ's header is 28 bytes: a TCP mark
/// not put back to one byte would wait for more, and this test would time out.
#[test]
fn a_write_payload_sent_in_pieces_lands_whole() {
    for (poll_budget, pause) in [(Duration::ZERO, Duration::from_millis(20)), (Duration::from_millis(1), Duration::from_micros(300))] {
        let dir = TempDir::new("dribble");
        let device = Arc::new(MemDevice::new(MIB));
        let config = nbd::ServerConfig { poll_budget, ..nbd::ServerConfig::default() };
        let server = Server::with_config(vec![Export::new("vd0", Arc::clone(&device))], config).unwrap();
        let unix = server.serve_unix(dir.join("nbd.sock")).unwrap();
        let tcp = server.serve_tcp("127.0.0.1:0").unwrap();
        let what = format!("poll budget {poll_budget:?}");
        // Each transport writes payloads of its own, so neither passes on what the other left.
        write_in_pieces_then_read(&mut raw_transmission(&socket_path(&unix)), &device, pause, 0, &format!("unix, {what}"));
        write_in_pieces_then_read(&mut raw_tcp_transmission(&tcp), &device, pause, 100, &format!("tcp, {what}"));
    }
}

fn write_in_pieces_then_read(stream: &mut (impl Read + Write), device: &MemDevice, pause: Duration, seed: u64, what: &str) {
    for round in 0..20u64 {
        let payload = random_bytes(8192, seed + round + 7);
        let offset = (round % 8) * 8192;
        stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_WRITE, 60 + round, offset, 8192)).unwrap();
        thread::sleep(pause);
        for piece in [&payload[..100], &payload[100..5000], &payload[5000..]] {
            stream.write_all(piece).unwrap();
            thread::sleep(pause);
        }
        assert_eq!(read_simple_reply(stream), (0, 60 + round), "{what}");
        assert_eq!(device.snapshot(offset, 8192), payload, "write {round}, {what}");
    }
    // Then a read on the same connection: nothing waits for more than its header.
    stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_READ, 90, 0, 512)).unwrap();
    assert_eq!(read_simple_reply(stream), (0, 90), "{what}");
    let mut data = [0u8; 512];
    stream.read_exact(&mut data).unwrap();
    assert_eq!(data[..], device.snapshot(0, 512)[..], "{what}");
}

/// Replies gathered while the reader waits for a WRITE's payload: behind a small payload they
/// go out once it is in (a client sends it right behind its header), but a large one is read
/// only after they were sent, so a client that waits for its READs' replies before it sends a
/// large payload is answered. Each case sends two READs and the WRITE's header in one write:
/// the reader answers the first at once and gathers the second's reply (the next request is
/// already in its buffer), then comes to the WRITE.
#[test]
fn replies_wait_for_a_small_trailing_payload_but_not_for_a_large_one() {
    let dir = TempDir::new("trailing");
    let device = Arc::new(MemDevice::new(MIB));
    let handle = serve(&dir, Arc::clone(&device));
    let mut stream = raw_transmission(&socket_path(&handle));
    for (round, payload_bytes) in [(0u64, 64 << 10), (1, 4096)] {
        let payload = random_bytes(payload_bytes, 40 + round);
        let cookies = [10 + 3 * round, 11 + 3 * round, 12 + 3 * round];
        let mut requests = Vec::new();
        for &cookie in &cookies[..2] {
            requests.extend_from_slice(&proto::encode_raw_request(0, proto::NBD_CMD_READ, cookie, 0, 512));
        }
        requests.extend_from_slice(&proto::encode_raw_request(0, proto::NBD_CMD_WRITE, cookies[2], 4096, payload_bytes as u32));
        stream.write_all(&requests).unwrap();
        let read_replies = |stream: &mut UnixStream| {
            for &cookie in &cookies[..2] {
                assert_eq!(read_simple_reply(stream), (0, cookie), "payload of {payload_bytes} bytes");
                stream.read_exact(&mut [0u8; 512]).unwrap();
            }
        };
        if payload_bytes > 32 << 10 {
            // The large payload is not sent until both READs are answered: this times out if
            // the gathered reply waits for the payload.
            read_replies(&mut stream);
            stream.write_all(&payload).unwrap();
        } else {
            thread::sleep(Duration::from_millis(20));
            stream.write_all(&payload).unwrap();
            read_replies(&mut stream);
        }
        assert_eq!(read_simple_reply(&mut stream), (0, cookies[2]));
        assert_eq!(device.snapshot(4096, payload_bytes), payload, "payload of {payload_bytes} bytes");
    }
}

// ---- Disconnects, the in-flight bound, shutdown -----------------------------------------------

#[test]
fn client_vanishing_mid_request_leaks_nothing() {
    let dir = TempDir::new("vanish");
    let device = HeldDevice::new(MIB);
    let handle = serve(&dir, Arc::clone(&device));
    let path = socket_path(&handle);

    // Reads held in the device when the client goes away.
    let mut reader = raw_transmission(&path);
    for cookie in 0..8 {
        reader.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_READ, cookie, cookie * 4096, 4096)).unwrap();
    }
    assert!(wait_until(TIMEOUT, || device.held_count() == 8));
    drop(reader);

    // Writes whose payload stops halfway: a large one, and a small one (whose rest the reader
    // waits for in one call).
    for payload_bytes in [65536, 16384] {
        let mut writer = raw_transmission(&path);
        writer.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_WRITE, 9, 0, payload_bytes)).unwrap();
        writer.write_all(&[1; 1000]).unwrap();
        drop(writer);
    }

    assert!(wait_until(TIMEOUT, || handle.connections_open() == 1), "a half-written connection is still open");
    assert_eq!(handle.requests_in_flight(), 8);
    device.release(false).join().unwrap();
    assert!(
        wait_until(TIMEOUT, || handle.connections_open() == 0 && handle.requests_in_flight() == 0),
        "open: {}, in flight: {}",
        handle.connections_open(),
        handle.requests_in_flight()
    );
    assert_eq!(device.inner.counters().writes.load(Ordering::Relaxed), 0, "a torn write reached the device");
}

#[test]
fn in_flight_requests_are_bounded_per_connection() {
    let dir = TempDir::new("bound");
    let device = HeldDevice::new(64 * MIB);
    let handle = serve(&dir, Arc::clone(&device));
    let mut client = connect(&handle, false);
    for index in 0..200u64 {
        client.submit_read(index * 4096, 4096).unwrap();
    }
    let waiter = thread::spawn(move || {
        let mut completed = 0;
        while client.in_flight() > 0 {
            client.wait().unwrap().result.unwrap();
            completed += 1;
        }
        (client, completed)
    });
    assert!(wait_until(TIMEOUT, || device.held_count() == 128));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(device.held_count(), 128, "more than 128 requests reached the device");
    assert_eq!(handle.requests_in_flight(), 128);
    device.release(false).join().unwrap();
    let (mut client, completed) = waiter.join().unwrap();
    assert_eq!(completed, 200);

    // The payload bound: two 32 MiB reads fill the 64 MiB budget; the third waits.
    *device.holding.lock().unwrap() = true;
    for index in 0..3u64 {
        client.submit_read(index * 16 * MIB, 32 * MIB as u32 - if index == 2 { 16 * MIB as u32 } else { 0 }).unwrap();
    }
    let waiter = thread::spawn(move || (0..3).map(|_| client.wait().unwrap().result.unwrap().len()).sum::<usize>());
    assert!(wait_until(TIMEOUT, || device.held_count() == 2));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(device.held_count(), 2, "more than 64 MiB of reads reached the device");
    device.release(false).join().unwrap();
    assert!(wait_until(TIMEOUT, || device.held_count() == 0 && handle.requests_in_flight() == 0));
    assert_eq!(waiter.join().unwrap(), 80 * MIB as usize);
}

#[test]
fn disc_closes_only_after_in_flight_replies_are_sent() {
    let dir = TempDir::new("disc");
    let device = HeldDevice::new(MIB);
    let handle = serve(&dir, Arc::clone(&device));
    let mut stream = raw_transmission(&socket_path(&handle));
    for cookie in 0..4 {
        stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_READ, cookie, 0, 512)).unwrap();
    }
    stream.write_all(&proto::encode_raw_request(0, proto::NBD_CMD_DISC, 99, 0, 0)).unwrap();
    assert!(wait_until(TIMEOUT, || device.held_count() == 4));
    device.release(true);
    let mut cookies = Vec::new();
    for _ in 0..4 {
        let (error, cookie) = read_simple_reply(&mut stream);
        assert_eq!(error, 0);
        stream.read_exact(&mut [0u8; 512]).unwrap();
        cookies.push(cookie);
    }
    cookies.sort();
    assert_eq!(cookies, [0, 1, 2, 3]);
    assert!(is_closed_by_server(&mut stream), "no close after DISC");
}

#[test]
fn shutdown_waits_for_in_flight_requests() {
    let dir = TempDir::new("shutdown");
    let device = HeldDevice::new(MIB);
    let mut handle = serve(&dir, Arc::clone(&device));
    device.inner.fill(0, &[8; 4096]);
    let mut client = connect(&handle, true);
    for index in 0..4 {
        client.submit_read(index * 1024, 1024).unwrap();
    }
    let waiter = thread::spawn(move || (0..4).map(|_| client.wait().unwrap().result.unwrap()).collect::<Vec<_>>());
    assert!(wait_until(TIMEOUT, || device.held_count() == 4));
    let shutting_down = thread::spawn(move || {
        handle.shutdown();
        handle
    });
    thread::sleep(Duration::from_millis(200));
    assert!(!shutting_down.is_finished(), "shutdown returned with requests still in flight");
    device.release(false);
    let handle = shutting_down.join().unwrap();
    assert_eq!(handle.connections_open(), 0);
    assert_eq!(handle.requests_in_flight(), 0);
    for data in waiter.join().unwrap() {
        assert_eq!(data, vec![8; 1024], "in-flight reads must be answered before the socket closes");
    }
    assert!(UnixStream::connect(socket_path(&handle)).is_err(), "still listening after shutdown");
}

/// Stopping does not go through the socket's address: a server whose socket file was removed,
/// and another server bound at the same path since, stops at once, on Unix sockets and on TCP,
/// and leaves the other's socket file in place.
#[test]
fn a_server_stops_when_its_socket_file_is_gone() {
    let dir = TempDir::new("stop-without-file");
    let device = Arc::new(MemDevice::new(MIB));
    let server = Server::new(vec![Export::new("vd0", Arc::clone(&device))]).unwrap();
    let unix = server.serve_unix(dir.join("nbd.sock")).unwrap();
    let tcp = server.serve_tcp("127.0.0.1:0").unwrap();
    std::fs::remove_file(dir.join("nbd.sock")).unwrap();
    let newcomer = server.serve_unix(dir.join("nbd.sock")).unwrap();
    let stopping = thread::spawn(move || {
        let (mut unix, mut tcp) = (unix, tcp);
        unix.shutdown();
        tcp.shutdown();
        tcp
    });
    assert!(wait_until(TIMEOUT, || stopping.is_finished()), "shutdown hangs once the socket file is gone");
    let tcp = stopping.join().unwrap();
    let address = match tcp.address() {
        nbd::ListenAddress::Tcp(address) => *address,
        other => panic!("a TCP listener has address {other:?}"),
    };
    assert!(std::net::TcpStream::connect(address).is_err(), "still listening on TCP after shutdown");
    let mut client = connect(&newcomer, true);
    assert_eq!(client.read(0, 512).unwrap(), vec![0; 512], "the newcomer's socket file was left alone");
    client.disconnect().unwrap();
}

// ---- The client against a third-party server ---------------------------------------------------

#[test]
fn client_round_trips_against_nbdkit() {
    let nbdkit = Nbdkit::start(&["memory", "size=8M"]);
    let uri = NbdUri::Unix { socket_path: nbdkit.socket_path().to_path_buf(), export_name: String::new() };
    for structured_replies in [false, true] {
        let mut client = Client::connect(&uri, &ClientConfig { structured_replies }).unwrap();
        assert_eq!(client.export().size_bytes, 8 * MIB);
        assert_eq!(client.export().structured_replies, structured_replies);
        let data = random_bytes(MIB as usize, 5 + structured_replies as u64);
        for (index, chunk) in data.chunks(64 * 1024).enumerate() {
            client.submit_write(index as u64 * 64 * 1024, chunk, false).unwrap();
        }
        while client.in_flight() > 0 {
            client.wait().unwrap().result.unwrap();
        }
        client.flush().unwrap();
        assert!(client.read(0, MIB as u32).unwrap() == data);
        // nbdkit's memory plugin is sparse: reads of a hole may come back as OFFSET_HOLE chunks.
        client.trim(0, 4096).unwrap();
        assert_eq!(client.read(0, 8192).unwrap()[..4096], [0; 4096]);
        assert_eq!(server_error(client.read(8 * MIB, 512)).error, proto::NBD_EINVAL);
        client.disconnect().unwrap();
    }
}
