//! NBD over TLS at the protocol's edges, with raw sockets and storc's own client: what a
//! plaintext client gets from `TlsMode::Require`, STARTTLS misuse, and clients that hang up or
//! stall mid-handshake or mid-request (each ends its connection and its TLS relay thread).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::psk_file;
use common::*;
use nbd::testing::MemDevice;
use nbd::{
    proto, Client, ClientConfig, Export, ListenAddress, NbdUri, Server, ServerConfig, ServerHandle, TlsCredentials, TlsMode, TlsServer,
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The tests count this process's relay threads, so they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct TlsFixture {
    _dir: TempDir,
    handle: ServerHandle,
    device: Arc<MemDevice>,
    address: SocketAddr,
    uri: NbdUri,
    /// Last: released once the server is shut down.
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn serve(mode: TlsMode, config: ServerConfig) -> TlsFixture {
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = TempDir::new("tls-bounds");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let device = Arc::new(MemDevice::new(64 * MIB));
    let server = Server::with_config(vec![Export::new("vd0", Arc::clone(&device))], config).unwrap();
    let tls = TlsServer::new(mode, &TlsCredentials::psk_file(&keys).unwrap()).unwrap();
    let handle = server.serve_tcp_with("127.0.0.1:0", Some(tls)).unwrap();
    let ListenAddress::Tcp(address) = *handle.address() else { unreachable!() };
    let uri = format!("nbds://alice@{address}/vd0?tls-psk-file={}", keys.display()).parse().unwrap();
    TlsFixture { _serial: serial, _dir: dir, handle, device, address, uri }
}

/// Connects, reads the greeting and sends fixed-newstyle client flags.
fn greeted(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.read_exact(&mut [0u8; proto::GREETING_BYTES]).unwrap();
    stream.write_all(&(proto::NBD_FLAG_C_FIXED_NEWSTYLE | proto::NBD_FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    stream
}

fn option_reply(stream: &mut TcpStream) -> (u32, u32, String) {
    let mut header = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let header = proto::parse_option_reply_header(&header).unwrap();
    let mut data = vec![0; header.len_bytes as usize];
    stream.read_exact(&mut data).unwrap();
    (header.option, header.reply_type, String::from_utf8_lossy(&data).into_owned())
}

/// True once the server has closed the connection (EOF or reset, not a timeout).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// TLS relay threads alive in this process (the server's and the client's).
fn relay_threads() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks.filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok()).filter(|name| name.trim() == "nbd-tls").count()
}

fn assert_all_closed(fixture: &TlsFixture, what: &str) {
    assert!(wait_until(TIMEOUT, || fixture.handle.connections_open() == 0), "{what}: connections still open");
    assert!(wait_until(TIMEOUT, || relay_threads() == 0), "{what}: {} TLS relay threads left", relay_threads());
}

#[test]
fn a_plaintext_client_of_require_gets_tls_reqd_for_every_option_and_no_export() {
    let fixture = serve(TlsMode::Require, ServerConfig::default());
    let mut stream = greeted(fixture.address);
    let info = proto::encode_info_request(&proto::InfoRequest { export_name: "vd0".into(), info_types: vec![] });
    for (option, data) in [(proto::NBD_OPT_LIST, Vec::new()), (proto::NBD_OPT_INFO, info.clone()), (proto::NBD_OPT_GO, info)] {
        stream.write_all(&proto::encode_option(option, &data)).unwrap();
        let (replied_to, reply_type, message) = option_reply(&mut stream);
        assert_eq!((replied_to, reply_type), (option, proto::NBD_REP_ERR_TLS_REQD), "option {option}: {message}");
        assert_eq!(message, "this server requires TLS: send NBD_OPT_STARTTLS first");
    }
    // STARTTLS itself must come without data; then it is answered, but this client stops there.
    stream.write_all(&proto::encode_option(proto::NBD_OPT_STARTTLS, b"x")).unwrap();
    assert_eq!(option_reply(&mut stream).1, proto::NBD_REP_ERR_INVALID);
    // EXPORT_NAME cannot be refused with an error: the connection ends, with no export sent.
    stream.write_all(&proto::encode_option(proto::NBD_OPT_EXPORT_NAME, b"vd0")).unwrap();
    assert!(closed_by_server(&mut stream), "EXPORT_NAME in plaintext should end the connection");
    assert_all_closed(&fixture, "after EXPORT_NAME in plaintext");
}

#[test]
fn plaintext_sent_after_starttls_before_its_answer_ends_the_connection() {
    let fixture = serve(TlsMode::On, ServerConfig::default());
    let mut stream = greeted(fixture.address);
    // STARTTLS and, in the same write, a GO the attacker wants taken as if it came over TLS.
    let mut bytes = proto::encode_option(proto::NBD_OPT_STARTTLS, &[]);
    bytes.extend(proto::encode_option(proto::NBD_OPT_GO, &[0, 0, 0, 0, 0, 0]));
    stream.write_all(&bytes).unwrap();
    assert_eq!(option_reply(&mut stream).1, proto::NBD_REP_ACK);
    assert!(closed_by_server(&mut stream), "bytes injected after STARTTLS should end the connection");
    assert_all_closed(&fixture, "after an injection");
}

#[test]
fn a_client_that_hangs_up_or_stalls_mid_handshake_ends_its_connection() {
    let config = ServerConfig { handshake_timeout: Duration::from_secs(1), ..ServerConfig::default() };
    let fixture = serve(TlsMode::Require, config);
    // Half a TLS ClientHello (a record header and a few bytes), then gone.
    let mut stream = greeted(fixture.address);
    stream.write_all(&proto::encode_option(proto::NBD_OPT_STARTTLS, &[])).unwrap();
    assert_eq!(option_reply(&mut stream).1, proto::NBD_REP_ACK);
    stream.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]).unwrap();
    drop(stream);
    assert_all_closed(&fixture, "a hang-up mid-handshake");

    // A client that says nothing after STARTTLS is dropped at the handshake deadline.
    let started = Instant::now();
    let mut stream = greeted(fixture.address);
    stream.write_all(&proto::encode_option(proto::NBD_OPT_STARTTLS, &[])).unwrap();
    assert_eq!(option_reply(&mut stream).1, proto::NBD_REP_ACK);
    assert!(closed_by_server(&mut stream), "a silent TLS client should be dropped");
    assert!(started.elapsed() < Duration::from_secs(5), "dropped after {:?}, the deadline is 1 s", started.elapsed());
    assert_all_closed(&fixture, "a stall mid-handshake");
}

#[test]
fn storcs_client_reads_and_writes_over_tls_and_a_hang_up_mid_request_leaks_nothing() {
    let fixture = serve(TlsMode::Require, ServerConfig::default());
    let mut client = Client::connect(&fixture.uri, &ClientConfig { structured_replies: true }).unwrap();
    let data = random_bytes(3 * MIB as usize, 7);
    client.write(MIB, &data, true).unwrap();
    assert!(client.read(MIB, data.len() as u32).unwrap() == data, "read back over TLS differs");
    assert!(fixture.device.snapshot(MIB, data.len()) == data, "the device holds other data than was written over TLS");
    client.disconnect().unwrap();
    assert_all_closed(&fixture, "after a soft disconnect");

    // Many large reads in flight, then the client is gone without reading a byte of them.
    let mut client = Client::connect(&fixture.uri, &ClientConfig::default()).unwrap();
    for index in 0..32 {
        client.submit_read(index * MIB, MIB as u32).unwrap();
    }
    client.send_submitted().unwrap();
    drop(client);
    assert_all_closed(&fixture, "a hang-up mid-request");
    assert_eq!(fixture.handle.requests_in_flight(), 0);
    assert_eq!(fixture.handle.payload_in_flight_bytes(), 0);
}

#[test]
fn shutdown_ends_tls_connections_and_their_relays() {
    let mut fixture = serve(TlsMode::On, ServerConfig { shutdown_grace: Duration::from_secs(2), ..ServerConfig::default() });
    let mut idle = Client::connect(&fixture.uri, &ClientConfig::default()).unwrap();
    assert_eq!(idle.read(0, 4096).unwrap(), vec![0; 4096]);
    let started = Instant::now();
    fixture.handle.shutdown();
    assert!(started.elapsed() < Duration::from_secs(2), "an idle TLS connection held shutdown for {:?}", started.elapsed());
    assert!(idle.read(0, 4096).is_err(), "the connection should be closed");
    drop(idle);
    assert_all_closed(&fixture, "after shutdown");
}
