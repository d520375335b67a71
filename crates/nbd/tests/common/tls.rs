//! TLS credentials made the way users make them: `psktool` for pre-shared keys, `certtool` for
//! a CA, a server and a client certificate (both from gnutls-bin, as qemu's and nbdkit's
//! documentation do it).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{require_tool, run, TempDir};

/// `psktool -u USER -p DIR/NAME`: a new random 32-byte key for `user` in a file of its own.
pub fn psk_file(dir: &TempDir, name: &str, user: &str) -> PathBuf {
    require_tool("psktool", "gnutls-bin");
    let path = dir.join(name);
    run(Command::new("psktool").args(["-u", user, "-p"]).arg(&path));
    path
}

/// Where `x509_credentials` put its files: the server's directory (ca-cert.pem,
/// server-cert.pem, server-key.pem) and a client's (ca-cert.pem, client-cert.pem, client-key.pem).
pub struct X509Dirs {
    pub server: PathBuf,
    pub client: PathBuf,
    /// ca-cert.pem only: a client that trusts the server but has no certificate of its own.
    pub anonymous_client: PathBuf,
}

/// A CA, and a server certificate for localhost/127.0.0.1 and a client certificate signed by it.
pub fn x509_credentials(dir: &TempDir) -> X509Dirs {
    require_tool("certtool", "gnutls-bin");
    let work = dir.join("x509-work");
    let dirs = X509Dirs { server: dir.join("x509-server"), client: dir.join("x509-client"), anonymous_client: dir.join("x509-anon") };
    for path in [&work, &dirs.server, &dirs.client, &dirs.anonymous_client] {
        std::fs::create_dir_all(path).unwrap();
    }
    let template = |name: &str, text: &str| {
        let path = work.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_key = private_key(&work.join("ca-key.pem"));
    let ca_cert = work.join("ca-cert.pem");
    let ca_info = template("ca.info", "cn = storc test CA\nca\ncert_signing_key\nexpiration_days = 2\n");
    run(Command::new("certtool")
        .arg("--generate-self-signed")
        .arg("--load-privkey")
        .arg(&ca_key)
        .arg("--template")
        .arg(&ca_info)
        .arg("--outfile")
        .arg(&ca_cert));
    let server_info = "organization = storc test\ncn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n\
                       tls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n";
    let client_info = "organization = storc test\ncn = alice\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n";
    for (role, info, out_dir) in [("server", server_info, &dirs.server), ("client", client_info, &dirs.client)] {
        let key = private_key(&out_dir.join(format!("{role}-key.pem")));
        let info = template(&format!("{role}.info"), info);
        let cert = out_dir.join(format!("{role}-cert.pem"));
        run(Command::new("certtool")
            .arg("--generate-certificate")
            .arg("--load-privkey")
            .arg(&key)
            .arg("--load-ca-certificate")
            .arg(&ca_cert)
            .arg("--load-ca-privkey")
            .arg(&ca_key)
            .arg("--template")
            .arg(&info)
            .arg("--outfile")
            .arg(&cert));
    }
    for out_dir in [&dirs.server, &dirs.client, &dirs.anonymous_client] {
        std::fs::copy(&ca_cert, out_dir.join("ca-cert.pem")).unwrap();
    }
    dirs
}

/// An RSA key, as qemu's documentation makes them: qemu insists that a certificate with the
/// `encryption_key` usage it asks for has a key that can encipher, which an ECDSA key cannot.
fn private_key(path: &Path) -> PathBuf {
    run(Command::new("certtool").args(["--generate-privkey", "--key-type=rsa", "--bits=2048", "--outfile"]).arg(path));
    path.to_path_buf()
}
