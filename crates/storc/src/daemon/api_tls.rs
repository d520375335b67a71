//! HTTPS on the management API's TCP listener (`--api-tls-certificates DIR`): the server's
//! certificate and key, and an `axum::serve::Listener` that hands axum only connections whose TLS
//! handshake is done.
//!
//! # Why OpenSSL through `tokio-openssl`
//!
//! The daemon already links OpenSSL for NBD (the `nbd` crate's `tls` module says why: rustls
//! has no external PSK), and reads its certificate directories in the same layout. Taking the
//! same library for HTTPS means one TLS stack in the binary, one set of security updates (Debian's
//! libssl), and the same PEM files loaded the same way. `tokio-openssl` (tokio-rs, on the
//! `openssl` crate) is the async stream around an `Ssl` and nothing more; `axum-server` would
//! bring its own accept loop and a connection type that does not carry our end of the socket,
//! which the owner rule needs (`tcp_api`), and `tokio-rustls` a second TLS library.
//!
//! # The listener
//!
//! axum's `serve` takes one connection at a time from `Listener::accept`, so a handshake done
//! there would make every client wait for the slowest. Instead an acceptor task takes TCP
//! connections and runs each handshake in its own task, under a deadline
//! (`HANDSHAKE_TIMEOUT`); finished ones reach `accept` through a bounded channel. A connection
//! holds one of `CONNECTIONS_MAX` permits from its TCP accept to its close, so the listener never
//! holds more descriptors than the daemon reserves for the API (`nbd_limits`); past that, new
//! clients wait in the kernel's backlog. TCP keep-alive ends connections whose peer vanished
//! (a network client can disappear without a FIN), so they do not keep their permits.
//!
//! A client that speaks plain HTTP to the listener gets one plaintext `400` that says to use
//! `https://` (as nginx answers), and nothing else: no handler runs for it.
//!
//! Clients show no certificate here: the API token (`api_token`) is the credential, and TLS keeps
//! it and the answers secret and proves the server to the client.

use super::tcp_api::TcpConnection;
use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{self, AlpnError, Ssl, SslAcceptor, SslMethod};
use openssl::x509::X509;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_openssl::SslStream;

/// The files of `--api-tls-certificates DIR`, named as for NBD (and qemu); a `ca-cert.pem` there
/// is not read by the server (clients need it, the banner names it).
pub const SERVER_CERT_FILE: &str = nbd::tls::X509_SERVER_CERT_FILE;
pub const SERVER_KEY_FILE: &str = nbd::tls::X509_SERVER_KEY_FILE;
pub const CA_FILE: &str = nbd::tls::X509_CA_FILE;
/// Connections open at once, handshakes included: half of the descriptors the daemon keeps for
/// the management API (`nbd_limits::DESCRIPTORS_RESERVED_COUNT`), the rest for the Unix socket.
pub const CONNECTIONS_MAX: usize = 64;
/// From TCP accept to a finished handshake (or the plaintext answer).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections whose handshake is done and that axum has not taken yet.
const READY_QUEUE_LENGTH: usize = 16;
/// TCP keep-alive: the first probe after this much silence, then one every `KEEPALIVE_INTERVAL`
/// (the kernel gives up after 9 unanswered ones: a vanished peer is gone within 2.5 minutes).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// The first byte of every TLS record of a handshake (RFC 8446 5.1: `handshake(22)`).
const TLS_HANDSHAKE_RECORD: u8 = 22;
/// What a plain-HTTP client's request may bring before the refusal is written (drained so that
/// the close does not reset the connection before the client reads the answer).
const PLAINTEXT_DRAIN_BYTES: usize = 16 << 10;
const PLAINTEXT_DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// The server's side of TLS for the API: a ready OpenSSL acceptor and what the certificate names.
#[derive(Clone)]
pub struct ApiTls {
    acceptor: Arc<SslAcceptor>,
    dir: PathBuf,
    /// The DNS names of the certificate's subjectAltName (wildcards left out): the names clients
    /// can verify it under, so the Host rule accepts them.
    dns_names: Vec<String>,
}

impl ApiTls {
    /// Loads `dir/server-cert.pem` (the chain, leaf first) and `dir/server-key.pem`.
    ///
    /// # Errors
    /// A file missing or not loadable, or a key that does not match the certificate, named with
    /// what is allowed.
    pub fn load(dir: &Path) -> Result<ApiTls, String> {
        for name in [SERVER_CERT_FILE, SERVER_KEY_FILE] {
            if let Err(error) = std::fs::File::open(dir.join(name)) {
                return Err(format!(
                    "--api-tls-certificates {}: cannot open {name} ({error}); allowed: a directory holding {SERVER_CERT_FILE} \
                     (the server's certificate, PEM, chain after it) and {SERVER_KEY_FILE} (its key, PEM)",
                    dir.display()
                ));
            }
        }
        let in_dir = |error: String| format!("--api-tls-certificates {}: {error}", dir.display());
        let certificate = read_pem(dir, SERVER_CERT_FILE, X509::from_pem).map_err(in_dir)?;
        let key = read_pem(dir, SERVER_KEY_FILE, PKey::private_key_from_pem).map_err(in_dir)?;
        // OpenSSL would say "key values mismatch"; say which files do not belong together.
        if !certificate.public_key().is_ok_and(|public| public.public_eq(&key)) {
            return Err(in_dir(format!(
                "{SERVER_KEY_FILE} does not match {SERVER_CERT_FILE} (it is the key of another certificate); allowed: the key the \
                 certificate was made for"
            )));
        }
        let acceptor = acceptor(dir, &key).map_err(in_dir)?;
        Ok(ApiTls { acceptor: Arc::new(acceptor), dir: dir.to_path_buf(), dns_names: dns_names(&certificate) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// Starts accepting on `tcp`; the listener to give `axum::serve`.
    pub fn listen(&self, tcp: TcpListener) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (ready_tx, ready) = mpsc::channel(READY_QUEUE_LENGTH);
        tokio::spawn(accept_loop(tcp, Arc::clone(&self.acceptor), ready_tx));
        Ok(TlsListener { ready, local })
    }
}

/// The first PEM object of `dir/name`, parsed by `parse`.
fn read_pem<T>(dir: &Path, name: &str, parse: impl FnOnce(&[u8]) -> Result<T, openssl::error::ErrorStack>) -> Result<T, String> {
    let pem = std::fs::read(dir.join(name)).map_err(|error| format!("cannot read {name} ({error})"))?;
    parse(&pem).map_err(|error| format!("{name} is not PEM of the kind it should hold ({error})"))
}

/// Mozilla's "intermediate" settings (TLS 1.2 and 1.3, AEAD suites with forward secrecy), the
/// certificate chain and key, and ALPN answering `http/1.1` (the only HTTP axum serves here).
fn acceptor(dir: &Path, key: &PKey<Private>) -> Result<SslAcceptor, String> {
    let named = |name: &'static str| move |error: openssl::error::ErrorStack| format!("{name}: {error}");
    let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| e.to_string())?;
    builder.set_certificate_chain_file(dir.join(SERVER_CERT_FILE)).map_err(named(SERVER_CERT_FILE))?;
    builder.set_private_key(key).map_err(named(SERVER_KEY_FILE))?;
    builder.check_private_key().map_err(|error| format!("{SERVER_KEY_FILE} does not match {SERVER_CERT_FILE}: {error}"))?;
    builder.set_alpn_select_callback(|_ssl, offered| ssl::select_next_proto(b"\x08http/1.1", offered).ok_or(AlpnError::NOACK));
    Ok(builder.build())
}

fn dns_names(certificate: &X509) -> Vec<String> {
    let names = certificate.subject_alt_names().into_iter().flatten();
    let mut dns: Vec<String> =
        names.filter_map(|name| name.dnsname().map(str::to_ascii_lowercase)).filter(|name| !name.contains('*')).collect();
    dns.dedup();
    dns
}

/// Connections whose TLS handshake is done, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsConnection, TcpConnection)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsConnection;
    type Addr = TcpConnection;

    async fn accept(&mut self) -> (TlsConnection, TcpConnection) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The acceptor ended: the listening socket failed for good. axum waits here for the
            // shutdown signal, as it does on a failing plain listener.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<TcpConnection> {
        Ok(TcpConnection { peer: self.local, local: Some(self.local) })
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for TcpConnection {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        *stream.remote_addr()
    }
}

/// Accepts while anyone takes the finished connections; one permit per connection.
async fn accept_loop(tcp: TcpListener, acceptor: Arc<SslAcceptor>, ready: mpsc::Sender<(TlsConnection, TcpConnection)>) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            () = ready.closed() => return,
            accepted = accept_with_permit(&tcp, &permits) => accepted,
        };
        let Some((stream, peer, permit)) = accepted else { return };
        let connection = TcpConnection { peer, local: stream.local_addr().ok() };
        let (acceptor, ready) = (Arc::clone(&acceptor), ready.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, stream)).await {
                Ok(Ok(stream)) => drop(ready.send((TlsConnection { stream, _permit: permit }, connection)).await),
                Ok(Err(why)) => tracing::debug!(peer = %peer, "management API over HTTPS: no TLS: {why}"),
                Err(_) => tracing::debug!(peer = %peer, "management API over HTTPS: no handshake within {HANDSHAKE_TIMEOUT:?}"),
            }
        });
    }
}

/// A permit, then a connection; `None` once the listening socket is closed for good.
async fn accept_with_permit(tcp: &TcpListener, permits: &Arc<Semaphore>) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let permit = Arc::clone(permits).acquire_owned().await.ok()?;
    loop {
        match tcp.accept().await {
            Ok((stream, peer)) => {
                // OpenSSL writes each handshake record on its own: with Nagle's algorithm the
                // second waits for the client's delayed ACK (40 ms a handshake on loopback).
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(peer = %peer, "management API over HTTPS: no TCP_NODELAY: {error}");
                }
                let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
                if let Err(error) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
                    tracing::debug!(peer = %peer, "management API over HTTPS: no TCP keep-alive: {error}");
                }
                return Some((stream, peer, permit));
            }
            // Out of descriptors or a connection reset before accept: as axum's own listener,
            // wait a little and go on.
            Err(error) if is_passing(&error) => {
                tracing::warn!("management API over HTTPS: accept failed: {error}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => {
                tracing::error!("management API over HTTPS: the listener failed: {error}");
                return None;
            }
        }
    }
}

fn is_passing(error: &io::Error) -> bool {
    !matches!(error.raw_os_error(), Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP))
}

/// The server's handshake, or the plaintext refusal of a client that did not start one.
async fn handshake(acceptor: &SslAcceptor, stream: TcpStream) -> Result<SslStream<TcpStream>, String> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) => return Err("the client closed the connection".into()),
        Ok(_) if first[0] != TLS_HANDSHAKE_RECORD => {
            refuse_plaintext(stream).await;
            return Err("the client spoke plain HTTP; answered 400".into());
        }
        Ok(_) => {}
        Err(error) => return Err(error.to_string()),
    }
    let ssl = Ssl::new(acceptor.context()).map_err(|e| e.to_string())?;
    let mut tls = SslStream::new(ssl, stream).map_err(|e| e.to_string())?;
    Pin::new(&mut tls).accept().await.map_err(|e| e.to_string())?;
    Ok(tls)
}

/// The answer to a plain-HTTP request: what went wrong and what works.
const PLAINTEXT_REFUSAL_BODY: &str =
    "{\"error\":\"this listener speaks HTTPS only (storc serve --api-tls-certificates); allowed: https:// URLs\"}";

async fn refuse_plaintext(mut stream: TcpStream) {
    let mut request = vec![0u8; PLAINTEXT_DRAIN_BYTES];
    let _ = tokio::time::timeout(PLAINTEXT_DRAIN_TIMEOUT, stream.read(&mut request)).await;
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PLAINTEXT_REFUSAL_BODY}",
        PLAINTEXT_REFUSAL_BODY.len()
    );
    if stream.write_all(answer.as_bytes()).await.is_ok() && stream.shutdown().await.is_ok() {
        // Until the client closes (or a bound is hit), so the close sends no reset over the answer.
        let mut drained = 0;
        while drained < PLAINTEXT_DRAIN_BYTES {
            match tokio::time::timeout(PLAINTEXT_DRAIN_TIMEOUT, stream.read(&mut request)).await {
                Ok(Ok(read)) if read > 0 => drained += read,
                _ => break,
            }
        }
    }
}

/// One HTTPS connection; its permit goes back when axum drops it.
pub struct TlsConnection {
    stream: SslStream<TcpStream>,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for TlsConnection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_the_files_is_refused_with_what_it_must_hold() {
        let error = ApiTls::load(Path::new("/nonexistent-storc-tls")).err().unwrap();
        assert!(
            error.starts_with("--api-tls-certificates /nonexistent-storc-tls: cannot open server-cert.pem (No such file or directory"),
            "{error}"
        );
        assert!(error.ends_with("allowed: a directory holding server-cert.pem (the server's certificate, PEM, chain after it) and server-key.pem (its key, PEM)"), "{error}");
    }
}
