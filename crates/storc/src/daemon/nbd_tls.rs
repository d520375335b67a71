//! `storc serve --tls off|on|require` with `--tls-psk-file` or `--tls-certificates`: TLS on the
//! NBD TCP listener (the protocol and the relay live in the `nbd` crate's `tls` module).
//!
//! TLS applies to the TCP listener only. The Unix socket stays plaintext: it is reachable only
//! by the daemon's user (and `--socket-group`), which the kernel checks on every connect, and
//! encryption between two processes of one machine protects nothing the kernel does not.

use std::path::{Path, PathBuf};

/// `--tls`: as qemu-nbd's and nbdkit's `--tls=off|on|require`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFlag {
    /// No TLS: STARTTLS is refused.
    Off,
    /// TLS for clients that ask (nbds://), plaintext for the others.
    On,
    /// TLS before anything else: a plaintext client sees no export.
    Require,
}

#[derive(clap::Args, Debug)]
pub struct TlsArgs {
    /// TLS on the NBD TCP listener: off, on (plaintext and TLS clients) or require (TLS only;
    /// a plaintext client is refused before it sees any export). on and require need
    /// --tls-psk-file or --tls-certificates.
    #[arg(long, value_enum, default_value_t = TlsFlag::Off)]
    tls: TlsFlag,
    /// Pre-shared keys for TLS: USERNAME:HEXKEY lines as `psktool -u USER -p FILE` (gnutls-bin)
    /// writes them, the file nbdkit and qemu-nbd read. Clients: nbds://USER@HOST:PORT/EXPORT?tls-psk-file=FILE.
    #[arg(long, value_name = "FILE")]
    tls_psk_file: Option<PathBuf>,
    /// X.509 credentials for TLS: a directory holding ca-cert.pem, server-cert.pem and
    /// server-key.pem, as for qemu-nbd and nbdkit. Clients must show a certificate signed by
    /// ca-cert.pem (client-cert.pem and client-key.pem in their own directory).
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
}

const CREDENTIALS_ALLOWED: &str = "--tls-psk-file FILE (made with: psktool -u USER -p FILE) or --tls-certificates DIR \
                                   (holding ca-cert.pem, server-cert.pem, server-key.pem)";

impl TlsArgs {
    /// The NBD TCP listener's TLS, checked and loaded before anything is created: `None` for
    /// `--tls off`.
    ///
    /// # Errors
    /// Credentials missing, given twice, or given with `--tls off`; TLS with no TCP listener; a
    /// key file or certificate that does not load (named, with what is allowed).
    pub fn server(&self, nbd_tcp: bool) -> Result<Option<nbd::TlsServer>, String> {
        let flag = format!("--tls {}", self.flag_name());
        let mode = match self.tls {
            TlsFlag::Off => {
                let given = [("--tls-psk-file", self.tls_psk_file.is_some()), ("--tls-certificates", self.tls_certificates.is_some())];
                if let Some((name, _)) = given.iter().find(|(_, is_given)| *is_given) {
                    return Err(format!("{name} is given but TLS is off; allowed: {name} with --tls on or --tls require"));
                }
                return Ok(None);
            }
            TlsFlag::On => nbd::TlsMode::On,
            TlsFlag::Require => nbd::TlsMode::Require,
        };
        if !nbd_tcp {
            return Err(format!(
                "{flag} applies to the NBD TCP listener, which --nbd-listen none turns off (the Unix socket is plaintext, \
                 reachable only by its owner and --socket-group); allowed: --tls off with --nbd-listen none"
            ));
        }
        let credentials = match (&self.tls_psk_file, &self.tls_certificates) {
            (None, None) => return Err(format!("{flag} needs credentials; allowed: {CREDENTIALS_ALLOWED}")),
            (Some(_), Some(_)) => {
                return Err("--tls-psk-file and --tls-certificates are both given; allowed: one of them".to_string());
            }
            (Some(file), None) => nbd::TlsCredentials::psk_file(file).map_err(|e| format!("--tls-psk-file: {e}"))?,
            (None, Some(dir)) => nbd::TlsCredentials::x509_dir(dir).map_err(|e| format!("--tls-certificates: {e}"))?,
        };
        nbd::TlsServer::new(mode, &credentials).map(Some)
    }

    fn flag_name(&self) -> &'static str {
        match self.tls {
            TlsFlag::Off => "off",
            TlsFlag::On => "on",
            TlsFlag::Require => "require",
        }
    }

    /// How a client reaches export `export` over TLS at `address`, for the banner: nbdinfo's URI.
    pub fn client_uri(&self, address: &str, export: &str) -> Option<String> {
        if self.tls == TlsFlag::Off {
            return None;
        }
        if let Some(file) = &self.tls_psk_file {
            let user = first_psk_user(file).unwrap_or_else(|| "USER".to_string());
            return Some(format!("nbds://{user}@{address}/{export}?tls-psk-file={}", absolute(file).display()));
        }
        Some(format!("nbds://{address}/{export}?tls-certificates=DIR-WITH-ca-cert.pem,client-cert.pem,client-key.pem"))
    }
}

/// The first user of a PSK file (sorted), to show in an example.
fn first_psk_user(file: &Path) -> Option<String> {
    let keys = nbd::PskKeys::load(file).ok()?;
    keys.usernames().min().map(str::to_string)
}

fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        tls: TlsArgs,
    }

    fn error_of(args: &[&str], nbd_tcp: bool) -> String {
        let mut argv = vec!["storc"];
        argv.extend_from_slice(args);
        Flags::parse_from(argv).tls.server(nbd_tcp).expect_err("should be refused")
    }

    #[test]
    fn tls_flags_that_cannot_work_are_refused_with_what_is_allowed() {
        let missing = error_of(&["--tls", "require"], true);
        assert!(missing.starts_with("--tls require needs credentials; allowed: --tls-psk-file FILE"), "{missing}");
        let both = error_of(&["--tls", "on", "--tls-psk-file", "a", "--tls-certificates", "b"], true);
        assert_eq!(both, "--tls-psk-file and --tls-certificates are both given; allowed: one of them");
        let off = error_of(&["--tls-psk-file", "a"], true);
        assert_eq!(off, "--tls-psk-file is given but TLS is off; allowed: --tls-psk-file with --tls on or --tls require");
        let no_tcp = error_of(&["--tls", "require", "--tls-psk-file", "a"], false);
        assert!(no_tcp.starts_with("--tls require applies to the NBD TCP listener, which --nbd-listen none turns off"), "{no_tcp}");
        let no_dir = error_of(&["--tls", "on", "--tls-certificates", "/nonexistent"], true);
        assert!(no_dir.starts_with("--tls-certificates: X.509 credentials directory /nonexistent: cannot open ca-cert.pem"), "{no_dir}");
        assert!(Flags::try_parse_from(["storc", "--tls", "maybe"]).is_err());
    }
}
