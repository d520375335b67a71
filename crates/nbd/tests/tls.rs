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

/// qemu's TLS object for a PSK client: qemu reads `keys.psk` from the directory it is given.
fn qemu_psk_object(keys_dir: &Path, user: &str) -> String {
    format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username={user}", keys_dir.display())
}

fn qemu_nbd_opts(handle: &ServerHandle, export: &str) -> String {
    let address = address(handle);
    format!("driver=nbd,server.type=inet,server.host={},server.port={},export={export},tls-creds=tls0", address.ip(), address.port())
}

#[test]
fn qemu_img_writes_and_nbdcopy_reads_back_over_tls_with_a_psk() {
    require_tool("qemu-img", "qemu-utils");
    require_tool("nbdcopy", "libnbd-bin");
    let dir = TempDir::new("tls-psk-qemu");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let (handle, device) = serve_tls(TlsMode::Require, &TlsCredentials::psk_file(&keys).unwrap(), 16 * MIB);
    let info = stdout(&run(Command::new("qemu-img").args([
        "info",
        "--object",
        &qemu_psk_object(dir.path(), "alice"),
        "--image-opts",
        &qemu_nbd_opts(&handle, "vd0"),
    ])));
    assert!(info.contains("virtual size: 16 MiB (16777216 bytes)"), "{info}");

    // Data written over TLS lands in the device, and reads back over TLS.
    let image = dir.join("image.raw");
    let data = random_bytes(16 * MIB as usize, 14);
    std::fs::write(&image, &data).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "--object", &qemu_psk_object(dir.path(), "alice"), "--target-image-opts"])
        .arg(&image)
        .arg(qemu_nbd_opts(&handle, "vd0")));
    assert!(device.snapshot(0, data.len()) == data, "what qemu-img wrote over TLS is not what the device holds");
    let copy = dir.join("copy.raw");
    run(Command::new("nbdcopy").arg(psk_uri(&handle, "alice", "vd0", &keys)).arg(&copy));
    assert!(std::fs::read(&copy).unwrap() == data, "nbdcopy over TLS read back other data than was written");
}

#[test]
fn nbdinfo_reaches_an_export_with_x509_certificates_and_a_client_without_one_is_refused() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("tls-x509");
    let x509 = x509_credentials(&dir);
    let (handle, _device) = serve_tls(TlsMode::Require, &TlsCredentials::x509_dir(&x509.server).unwrap(), 64 * MIB);
    let uri = |certificates: &Path| format!("nbds://{}/vd0?tls-certificates={}", address(&handle), certificates.display());
    let info = stdout(&run(Command::new("nbdinfo").arg(uri(&x509.client))));
    assert!(info.contains("export-size: 67108864"), "{info}");

    // It trusts the server, but shows no certificate of its own: refused, as with qemu-nbd.
    let refused = run_failing(Command::new("nbdinfo").arg(uri(&x509.anonymous_client)));
    assert!(!refused.contains("export-size"), "{refused}");
    // qemu-img knows the same directory layout (client-cert.pem, client-key.pem).
    require_tool("qemu-img", "qemu-utils");
    let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", x509.client.display());
    let info = stdout(&run(Command::new("qemu-img").args(["info", "--object", &object, "--image-opts", &qemu_nbd_opts(&handle, "vd0")])));
    assert!(info.contains("virtual size: 64 MiB"), "{info}");
    assert!(wait_until(std::time::Duration::from_secs(10), || handle.connections_open() == 0), "connections left open");
}

#[test]
fn a_wrong_key_or_an_unknown_user_is_refused() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("tls-wrong-psk");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let other_keys = psk_file(&dir, "other.psk", "alice"); // same user, another random key
    let (handle, _device) = serve_tls(TlsMode::Require, &TlsCredentials::psk_file(&keys).unwrap(), 64 * MIB);
    for (user, file) in [("alice", &other_keys), ("mallory", &keys)] {
        let keys_of_user = if user == "mallory" { psk_file(&dir, "mallory.psk", "mallory") } else { file.clone() };
        let refused = run_failing(Command::new("nbdinfo").arg(psk_uri(&handle, user, "vd0", &keys_of_user)));
        assert!(!refused.contains("export-size"), "{user}: {refused}");
        assert!(
            refused.to_lowercase().contains("tls") || refused.contains("handshake"),
            "{user}: nbdinfo should say TLS failed:\n{refused}"
        );
    }
    assert!(wait_until(std::time::Duration::from_secs(10), || handle.connections_open() == 0), "refused connections left open");
}

#[test]
fn require_refuses_a_plaintext_client_before_it_sees_any_export() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("tls-require");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let (handle, _device) = serve_tls(TlsMode::Require, &TlsCredentials::psk_file(&keys).unwrap(), 64 * MIB);
    let plain = format!("nbd://{}/vd0", address(&handle));
    let listing = run_failing(Command::new("nbdinfo").arg("--list").arg(&plain));
    assert!(!listing.contains("vd0"), "a plaintext client saw the export list:\n{listing}");
    let info = run_failing(Command::new("nbdinfo").arg(&plain));
    assert!(!info.contains("export-size"), "a plaintext client opened the export:\n{info}");
    assert!(info.contains("TLS") || info.contains("tls"), "nbdinfo should say the server requires TLS:\n{info}");
}

#[test]
fn on_serves_plaintext_and_tls_clients_alike() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = TempDir::new("tls-on");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let (handle, device) = serve_tls(TlsMode::On, &TlsCredentials::psk_file(&keys).unwrap(), 64 * MIB);
    device.fill(0, &[7; 512]);
    let plain = stdout(&run(Command::new("nbdinfo").arg(format!("nbd://{}/vd0", address(&handle)))));
    assert!(plain.contains("export-size: 67108864"), "{plain}");
    let tls = stdout(&run(Command::new("nbdinfo").arg(psk_uri(&handle, "alice", "vd0", &keys))));
    assert!(tls.contains("export-size: 67108864"), "{tls}");
}

/// An export over `nbds://` as a member drive (`nbd::member`): the link's reader and writer
/// threads talk through the TLS relay, and the data reaches the server's device.
#[test]
fn a_member_drive_reaches_an_export_over_tls_with_a_psk() {
    use drive::{Drive, DriveOp, IoBuf, IoCtx, IoCtxConfig};
    let dir = TempDir::new("tls-psk-member");
    let keys = psk_file(&dir, "keys.psk", "alice");
    let (handle, device) = serve_tls(TlsMode::Require, &TlsCredentials::psk_file(&keys).unwrap(), 64 * MIB);
    let spec = nbd::member::MemberSpec::parse(&format!("{}&timeout=5s", psk_uri(&handle, "alice", "vd0", &keys))).unwrap();
    let member = nbd::member::NbdDrive::open(&spec).expect("open the member over TLS");
    let data = random_bytes(256 << 10, 7);
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    member.submit(&mut ctx, 1, DriveOp::Write { offset_bytes: 1 << 20, buf: IoBuf::from_slice(&data) });
    member.submit(&mut ctx, 2, DriveOp::Flush);
    let mut out = Vec::new();
    while out.len() < 2 {
        ctx.poll(&mut out, true);
    }
    assert!(out.iter().all(|c| c.result.is_ok()), "{:?}", out.iter().map(|c| &c.result).collect::<Vec<_>>());
    assert_eq!(device.snapshot(1 << 20, data.len()), data);
}
