//! NBD over TLS: NBD_OPT_STARTTLS on the server (`--tls=on|require`, as qemu-nbd and nbdkit
//! offer it) and in storc's client, with pre-shared keys (a psktool file) or X.509 certificates
//! (a directory of `ca-cert.pem`, `server-cert.pem`, `server-key.pem`, as qemu and nbdkit read).
//!
//! # Why OpenSSL and not rustls
//!
//! The NBD clients people use (libnbd's nbdinfo/nbdcopy, qemu-img, qemu's block layer) speak
//! TLS through GnuTLS and offer two kinds of credentials: X.509 and *external* pre-shared keys
//! (TLS 1.3 external PSK, or the PSK cipher suites of TLS 1.2). rustls has X.509 but no external
//! PSK at all: its issue #174 ("Status of PSK Support?") and PR #2424 ("add TLS 1.3 PSK
//! support") are both still open, and the client-side follow-up PR #2524 was closed unmerged.
//! PSK is the simple way to give a local client access (one line in a file, no CA), so it is
//! the one that matters most here. OpenSSL (through the `openssl` crate and Debian's libssl)
//! serves both: its PSK callbacks work for TLS 1.3 (with SHA-256, what GnuTLS uses for external
//! PSKs) and TLS 1.2, and interoperation with nbdinfo and qemu-img is tested for real
//! (`tests/tls.rs`, and `crates/storc/tests/nbd_tls.rs`).
//!
//! # Where TLS runs: a relay thread per connection
//!
//! The kernel here has no kTLS (`tcp_available_ulp` lists only mptcp), so records are sealed in
//! user space. The server's data path writes replies from whichever thread completes a request,
//! with a non-blocking `sendmsg` and a writer thread as fallback (see `server::transmission`);
//! an `SslStream` cannot be shared that way (an SSL object must never be used by two threads at
//! once, and a lock around it would put every completing thread behind the slowest client). So
//! after the TLS handshake a *relay* thread owns the SSL object alone: it moves bytes between
//! the TCP socket (ciphertext) and one end of a `socketpair` (plaintext) with non-blocking I/O
//! and `poll(2)`; the connection's own code goes on over the other end exactly as over a plain
//! socket. Nothing in the transmission phase knows about TLS, every bound there still holds,
//! and the relay adds only two buffers of 64 KiB (`relay::RELAY_BUFFER_BYTES`) per connection. Each
//! direction stops reading when its buffer is full, so back-pressure reaches the client.
//!
//! The relay ends when the connection side closes its end (after the last reply is sealed, it
//! sends close_notify), when the client hangs up or the socket fails, or when sealed bytes wait
//! longer than the reply stall timeout for a client that does not read. A client's end of input
//! (close_notify, or a bare EOF) shuts the plaintext end for writing, so the connection sees
//! the same end of stream a plain socket gives it, and replies in flight are still sent.
//!
//! # STARTTLS rules (see `server::handshake`)
//!
//! With `require` (FORCEDTLS in the NBD spec) every option but STARTTLS and ABORT before TLS
//! gets NBD_REP_ERR_TLS_REQD, and EXPORT_NAME ends the connection: no export is listed, described
//! or opened in plaintext. With `on` (SELECTIVETLS with no TLS-only export) both work. Bytes the
//! client sent after STARTTLS but before reading its answer are a protocol violation (they would
//! otherwise be taken as part of the TLS stream: the plaintext-injection flaw of many STARTTLS
//! implementations), and so is a second STARTTLS. Options negotiated in plaintext before
//! STARTTLS (structured replies) are forgotten.

mod psk;
pub(crate) mod relay;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openssl::ssl::{
    HandshakeError, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslSessionCacheMode, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Name;

pub use psk::{PskKeys, PSK_KEY_MAX_BYTES, PSK_USERNAME_MAX_BYTES};

use crate::server::CONNECTION_THREAD_STACK_BYTES;
use crate::socket::{DeadlineSocket, Socket};

/// Whether a listener that has credentials also serves plaintext clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// TLS for clients that ask (NBD_OPT_STARTTLS), plaintext for the others.
    On,
    /// TLS before anything else: plaintext clients get NBD_REP_ERR_TLS_REQD and no export.
    Require,
}

/// The TLS 1.2 suites offered with PSK: AEAD only, with forward secrecy first. TLS 1.3 (what
/// GnuTLS clients negotiate) uses its own suites.
const PSK_TLS12_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256:PSK-CHACHA20-POLY1305";

/// The files of an X.509 credentials directory, named as qemu and nbdkit name them.
pub const X509_CA_FILE: &str = "ca-cert.pem";
pub const X509_SERVER_CERT_FILE: &str = "server-cert.pem";
pub const X509_SERVER_KEY_FILE: &str = "server-key.pem";

/// What a server proves itself with and checks its clients against.
#[derive(Debug, Clone)]
pub enum TlsCredentials {
    /// Clients prove they hold the key of a user in the file; the server, that it holds it too.
    Psk(PskKeys),
    /// The server shows `server-cert.pem`; clients must show a certificate signed by
    /// `ca-cert.pem` (qemu's default, `verify-peer=on`): encryption without it would still let
    /// every local user in.
    X509 { dir: PathBuf },
}

impl TlsCredentials {
    /// # Errors
    /// As [`PskKeys::load`].
    pub fn psk_file(path: &Path) -> Result<TlsCredentials, String> {
        PskKeys::load(path).map(TlsCredentials::Psk)
    }

    /// # Errors
    /// `dir` lacks one of the three files.
    pub fn x509_dir(dir: &Path) -> Result<TlsCredentials, String> {
        for name in [X509_CA_FILE, X509_SERVER_CERT_FILE, X509_SERVER_KEY_FILE] {
            let path = dir.join(name);
            if let Err(error) = std::fs::File::open(&path) {
                return Err(format!(
                    "X.509 credentials directory {}: cannot open {name} ({error}); allowed: a directory holding {X509_CA_FILE}, \
                     {X509_SERVER_CERT_FILE} and {X509_SERVER_KEY_FILE}, as for qemu-nbd and nbdkit",
                    dir.display()
                ));
            }
        }
        Ok(TlsCredentials::X509 { dir: dir.to_path_buf() })
    }

    fn kind(&self) -> &'static str {
        match self {
            TlsCredentials::Psk(_) => "PSK",
            TlsCredentials::X509 { .. } => "X.509",
        }
    }
}

/// A listener's TLS: the mode and a ready server context. Cheap to clone.
#[derive(Clone)]
pub struct TlsServer {
    mode: TlsMode,
    kind: &'static str,
    context: Arc<SslContext>,
}

impl fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsServer").field("mode", &self.mode).field("credentials", &self.kind).finish()
    }
}

impl TlsServer {
    /// # Errors
    /// OpenSSL refuses the credentials (a certificate or key that does not load, a key that does
    /// not match the certificate), with its reason.
    pub fn new(mode: TlsMode, credentials: &TlsCredentials) -> Result<TlsServer, String> {
        let context = server_context(credentials).map_err(|error| format!("TLS ({} credentials): {error}", credentials.kind()))?;
        Ok(TlsServer { mode, kind: credentials.kind(), context: Arc::new(context) })
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// "PSK" or "X.509".
    pub fn credentials_kind(&self) -> &'static str {
        self.kind
    }

    /// The server side of the TLS handshake on `tcp`, to end by `deadline`; then the relay.
    pub(crate) fn accept(&self, tcp: &Socket, deadline: Instant, stall_timeout: Duration) -> io::Result<TlsLink> {
        let ssl = Ssl::new(&self.context).map_err(io::Error::other)?;
        let stream = ssl.accept(DeadlineSocket::new(tcp.clone(), deadline)).map_err(handshake_error)?;
        TlsLink::start(stream, tcp, stall_timeout)
    }
}

/// Settings every context shares: TLS 1.2 at least (the NBD spec's floor), no renegotiation, no
/// session tickets or cache (each connection is one handshake; nothing to resume), and a bare
/// EOF taken as the end of input (a client that hangs up without close_notify, or a half-close,
/// must look to the connection like the end of a plain stream; NBD's framing makes truncation
/// visible anyway).
fn common_settings(builder: &mut SslContextBuilder) -> Result<(), openssl::error::ErrorStack> {
    builder.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    builder.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::IGNORE_UNEXPECTED_EOF | SslOptions::NO_TICKET);
    builder.set_session_cache_mode(SslSessionCacheMode::OFF);
    Ok(())
}

fn server_context(credentials: &TlsCredentials) -> Result<SslContext, String> {
    let stack = |error: openssl::error::ErrorStack| error.to_string();
    let mut builder = SslContextBuilder::new(SslMethod::tls_server()).map_err(stack)?;
    common_settings(&mut builder).map_err(stack)?;
    builder.set_num_tickets(0).map_err(stack)?;
    match credentials {
        TlsCredentials::Psk(keys) => {
            builder.set_cipher_list(PSK_TLS12_CIPHERS).map_err(stack)?;
            let keys = keys.clone();
            builder.set_psk_server_callback(move |_ssl, identity, key_out| Ok(copy_key(&keys, identity, key_out)));
        }
        TlsCredentials::X509 { dir } => {
            let file = |name: &str| dir.join(name);
            let named = |name: &'static str| move |error: openssl::error::ErrorStack| format!("{}: {error}", dir.join(name).display());
            builder.set_certificate_chain_file(file(X509_SERVER_CERT_FILE)).map_err(named(X509_SERVER_CERT_FILE))?;
            builder.set_private_key_file(file(X509_SERVER_KEY_FILE), SslFiletype::PEM).map_err(named(X509_SERVER_KEY_FILE))?;
            builder
                .check_private_key()
                .map_err(|error| format!("{X509_SERVER_KEY_FILE} does not match {X509_SERVER_CERT_FILE}: {error}"))?;
            builder.set_ca_file(file(X509_CA_FILE)).map_err(named(X509_CA_FILE))?;
            builder.set_client_ca_list(X509Name::load_client_ca_file(file(X509_CA_FILE)).map_err(named(X509_CA_FILE))?);
            builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
    }
    Ok(builder.build())
}

/// The key of the user the client named, into OpenSSL's buffer; 0 (no key: the handshake fails)
/// for an unknown user or a key that does not fit.
fn copy_key(keys: &PskKeys, identity: Option<&[u8]>, key_out: &mut [u8]) -> usize {
    let username = identity.and_then(|bytes| std::str::from_utf8(bytes).ok());
    let Some(key) = username.and_then(|name| keys.key(name)) else {
        tracing::debug!(user = ?username, "nbd: TLS client named no known PSK user");
        return 0;
    };
    let Some(out) = key_out.get_mut(..key.len()) else { return 0 };
    out.copy_from_slice(key);
    key.len()
}

/// A client's TLS: a PSK user and key (storc's client speaks PSK only).
#[derive(Clone)]
pub struct TlsClient {
    context: Arc<SslContext>,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsClient { .. }")
    }
}

impl TlsClient {
    /// # Errors
    /// The user has no key in `keys`, or OpenSSL cannot build a context.
    pub fn psk(keys: &PskKeys, username: &str) -> Result<TlsClient, String> {
        let key = keys.key(username).ok_or_else(|| {
            let mut users: Vec<&str> = keys.usernames().collect();
            users.sort_unstable();
            format!("the PSK file has no key for user {username:?}; it has: {}", users.join(", "))
        })?;
        let (identity, key) = (username.as_bytes().to_vec(), key.to_vec());
        let stack = |error: openssl::error::ErrorStack| error.to_string();
        let mut builder = SslContextBuilder::new(SslMethod::tls_client()).map_err(stack)?;
        common_settings(&mut builder).map_err(stack)?;
        builder.set_cipher_list(PSK_TLS12_CIPHERS).map_err(stack)?;
        builder.set_psk_client_callback(move |_ssl, _hint, identity_out, key_out| {
            // The identity is a C string: it needs room for its NUL.
            let (Some(identity_slot), Some(key_slot)) = (identity_out.get_mut(..=identity.len()), key_out.get_mut(..key.len())) else {
                return Ok(0);
            };
            identity_slot[..identity.len()].copy_from_slice(&identity);
            identity_slot[identity.len()] = 0;
            key_slot.copy_from_slice(&key);
            Ok(key.len())
        });
        Ok(TlsClient { context: Arc::new(builder.build()) })
    }

    /// The client side of the TLS handshake on `tcp`, to end by `deadline`; then the relay.
    pub(crate) fn connect(&self, tcp: &Socket, deadline: Instant, stall_timeout: Duration) -> io::Result<TlsLink> {
        let ssl = Ssl::new(&self.context).map_err(io::Error::other)?;
        let stream = ssl.connect(DeadlineSocket::new(tcp.clone(), deadline)).map_err(handshake_error)?;
        TlsLink::start(stream, tcp, stall_timeout)
    }
}

fn handshake_error(error: HandshakeError<DeadlineSocket>) -> io::Error {
    match error {
        HandshakeError::SetupFailure(stack) => io::Error::other(format!("TLS setup: {stack}")),
        HandshakeError::Failure(mid) | HandshakeError::WouldBlock(mid) => {
            let kind = mid.error().io_error().map_or(io::ErrorKind::PermissionDenied, io::Error::kind);
            let verify = mid.ssl().verify_result();
            let detail = if verify.as_raw() == 0 { String::new() } else { format!(" (certificate: {})", verify.error_string()) };
            io::Error::new(kind, format!("TLS handshake failed: {}{detail}", mid.error()))
        }
    }
}

/// A connection's TLS after the handshake: the plaintext end of the relay, and the relay thread.
/// Dropping it closes the plaintext end and waits for the relay (which then seals what is left,
/// sends close_notify and closes the TCP socket, within the stall timeout), so a connection's
/// thread outlives its relay and no relay is left behind.
pub(crate) struct TlsLink {
    plain: Socket,
    relay: Option<JoinHandle<()>>,
}

impl TlsLink {
    fn start(stream: openssl::ssl::SslStream<DeadlineSocket>, tcp: &Socket, stall_timeout: Duration) -> io::Result<TlsLink> {
        let (plain, relay_end) = std::os::unix::net::UnixStream::pair()?;
        relay_end.set_nonblocking(true)?;
        tcp.set_nonblocking(true)?;
        let relay = relay::Relay::new(stream, relay_end, stall_timeout)?;
        let thread = std::thread::Builder::new().name("nbd-tls".into()).stack_size(CONNECTION_THREAD_STACK_BYTES).spawn(move || {
            if let Err(error) = relay.run() {
                tracing::debug!(%error, "nbd: TLS relay ended");
            }
        })?;
        Ok(TlsLink { plain: Socket::unix(plain), relay: Some(thread) })
    }

    /// The plaintext end: a socket like any other to the code above.
    pub(crate) fn socket(&self) -> &Socket {
        &self.plain
    }
}

impl Drop for TlsLink {
    fn drop(&mut self) {
        let _ = self.plain.shutdown(std::net::Shutdown::Both);
        if let Some(relay) = self.relay.take() {
            if relay.join().is_err() {
                tracing::error!("nbd: TLS relay panicked");
            }
        }
    }
}
