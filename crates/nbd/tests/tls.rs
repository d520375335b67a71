//! NBD over TLS against the clients people use: nbdinfo (libnbd) and qemu-img (qemu's NBD
//! block driver), both GnuTLS, with pre-shared keys made by psktool and X.509 certificates made
//! by certtool. These tools must be installed (`apt-get install -y libnbd-bin qemu-utils
//! gnutls-bin`); a missing one fails the test.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use common::tls::{psk_file, x509_credentials};
use common::*;
use nbd::testing::MemDevice;
use nbd::{Export, ListenAddress, Server, ServerHandle, TlsCredentials, TlsMode, TlsServer};

/// A server with one MemDevice export `vd0` on 127.0.0.1, TLS as given.
fn serve_tls(mode: TlsMode, credentials: &TlsCredentials, size_bytes: u64) -> (ServerHandle, Arc<MemDevice>) {
    let device = Arc::new(MemDevice::new(size_bytes));
    let server = Server::new(vec![Export::new("vd0", Arc::clone(&device))]).unwrap();
    let tls = TlsServer::new(mode, credentials).unwrap();
    let handle = server.serve_tcp_with("127.0.0.1:0", Some(tls)).unwrap();
    (handle, device)
}

fn address(handle: &ServerHandle) -> SocketAddr {
    let ListenAddress::Tcp(address) = handle.address() else { unreachable!("a TCP listener") };
    *address
}

fn psk_uri(handle: &ServerHandle, user: &str, export: &str, keys: &Path) -> String {
    format!("nbds://{user}@{}/{export}?tls-psk-file={}", address(handle), keys.display())
}

/// Runs a command that must fail; its output.
fn run_failing(command: &mut Command) -> String {
    let output: Output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "{command:?} should have failed:\n{text}");
    text
}

#[test]
fn nbdinfo_reaches_an_export_over_tls_with_a_psk_file() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("tls-psk-nbdinfo");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let (handle, _device) = serve_tls(TlsMode::Require, &TlsCredentials::psk_file(&keys).unwrap(), 64 * MIB);
    let info = stdout(&run(Command::new("nbdinfo").arg(psk_uri(&handle, "alice", "vd0", &keys))));
    assert!(info.contains("export-size: 67108864"), "{info}");
    assert!(info.contains("uri: nbds://"), "nbdinfo should say it used TLS:\n{info}");
    let listing = stdout(&run(Command::new("nbdinfo").arg("--list").arg(psk_uri(&handle, "alice", "", &keys))));
    assert!(listing.contains("export=\"vd0\""), "{listing}");
    assert!(wait_until(std::time::Duration::from_secs(10), || handle.connections_open() == 0), "connections left open");
}
