//! The relay thread of one TLS connection: the only user of its SSL object. It moves plaintext
//! between the SSL stream over the TCP socket and its end of a socketpair, both non-blocking,
//! and sleeps in `poll(2)` on what the last attempts were waiting for.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use openssl::ssl::{ErrorCode, SslStream};

use crate::socket::DeadlineSocket;

/// Plaintext held per direction: a few TLS records (16 KiB each), so large replies go out in
/// few system calls, and small enough that a thousand connections hold little.
pub(crate) const RELAY_BUFFER_BYTES: usize = 64 << 10;

/// Bytes read and not yet written on.
struct Buffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer { bytes: vec![0; RELAY_BUFFER_BYTES].into_boxed_slice(), start: 0, end: 0 }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    fn consume(&mut self, len_bytes: usize) {
        self.start += len_bytes;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// The whole buffer, to fill when empty.
    fn space(&mut self) -> &mut [u8] {
        debug_assert!(self.is_empty());
        &mut self.bytes
    }

    fn filled(&mut self, len_bytes: usize) {
        (self.start, self.end) = (0, len_bytes);
    }
}

/// What one round of attempts is waiting for, as poll(2) events.
#[derive(Default)]
struct Waits {
    tcp: libc::c_short,
    plain: libc::c_short,
}

pub(crate) struct Relay {
    tls: SslStream<DeadlineSocket>,
    tcp_fd: RawFd,
    plain: UnixStream,
    /// Decrypted from the peer, for the plaintext end.
    inbound: Buffer,
    /// From the plaintext end, to seal.
    outbound: Buffer,
    /// The peer's input ended (close_notify, or EOF).
    peer_done: bool,
    /// The plaintext end was shut for writing after `peer_done`.
    plain_write_shut: bool,
    /// The plaintext end closed its sending side: nothing more to seal once `outbound` is out.
    plain_done: bool,
    stall_timeout: Duration,
}

impl Relay {
    pub(crate) fn new(mut tls: SslStream<DeadlineSocket>, plain: UnixStream, stall_timeout: Duration) -> io::Result<Relay> {
        tls.get_mut().clear_deadline()?;
        let tcp_fd = tls.get_ref().raw_fd();
        Ok(Relay {
            tls,
            tcp_fd,
            plain,
            inbound: Buffer::new(),
            outbound: Buffer::new(),
            peer_done: false,
            plain_write_shut: false,
            plain_done: false,
            stall_timeout,
        })
    }

    /// Relays until the plaintext end closes (then close_notify), the peer fails or hangs up,
    /// or sealed bytes wait `stall_timeout` for a peer that does not read.
    pub(crate) fn run(mut self) -> io::Result<()> {
        let mut last_sent = Instant::now();
        loop {
            let mut waits = Waits::default();
            let mut progress = self.peer_to_plain(&mut waits)?;
            let sent = self.plain_to_peer(&mut waits)?;
            if sent {
                last_sent = Instant::now();
            }
            progress |= sent;
            if self.plain_done && self.outbound.is_empty() {
                // Best effort: a peer that reads nothing more needs no close_notify.
                let _ = self.tls.shutdown();
                let _ = self.tls.get_ref().shutdown(Shutdown::Both);
                return Ok(());
            }
            if progress {
                continue;
            }
            let timeout = if self.outbound.is_empty() {
                None
            } else {
                let waited = last_sent.elapsed();
                if waited >= self.stall_timeout {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS peer took no data for the reply stall timeout"));
                }
                Some(self.stall_timeout - waited)
            };
            self.wait(&waits, timeout)?;
        }
    }

    /// Decrypts what the peer sent into `inbound` and passes it on; true if anything moved.
    fn peer_to_plain(&mut self, waits: &mut Waits) -> io::Result<bool> {
        let mut progress = false;
        if !self.peer_done && self.inbound.is_empty() {
            match self.tls.ssl_read(self.inbound.space()) {
                Ok(read_bytes) => {
                    self.inbound.filled(read_bytes);
                    progress = true;
                }
                Err(error) => match error.code() {
                    ErrorCode::WANT_READ => waits.tcp |= libc::POLLIN,
                    ErrorCode::WANT_WRITE => waits.tcp |= libc::POLLOUT,
                    ErrorCode::ZERO_RETURN => {
                        self.peer_done = true;
                        progress = true;
                    }
                    _ => return Err(tls_error("reading from the TLS peer", error)),
                },
            }
        }
        if !self.inbound.is_empty() {
            match (&self.plain).write(self.inbound.data()) {
                Ok(written_bytes) => {
                    self.inbound.consume(written_bytes);
                    progress = true;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => waits.plain |= libc::POLLOUT,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => progress = true,
                // The connection closed its end: nothing left to relay to.
                Err(error) => return Err(error),
            }
        }
        if self.peer_done && self.inbound.is_empty() && !self.plain_write_shut {
            // The connection sees the end of the stream, as on a plain socket.
            let _ = self.plain.shutdown(Shutdown::Write);
            self.plain_write_shut = true;
        }
        Ok(progress)
    }

    /// Takes what the plaintext end wrote into `outbound` and seals it; true if the peer took any.
    fn plain_to_peer(&mut self, waits: &mut Waits) -> io::Result<bool> {
        let mut progress = false;
        if !self.plain_done && self.outbound.is_empty() {
            match (&self.plain).read(self.outbound.space()) {
                Ok(0) => self.plain_done = true,
                Ok(read_bytes) => self.outbound.filled(read_bytes),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => waits.plain |= libc::POLLIN,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.plain_done = true,
            }
        }
        if !self.outbound.is_empty() {
            // A retry after WANT_* passes the same bytes, as OpenSSL requires (the buffer is
            // refilled only once empty).
            match self.tls.ssl_write(self.outbound.data()) {
                Ok(written_bytes) => {
                    self.outbound.consume(written_bytes);
                    progress = true;
                }
                Err(error) => match error.code() {
                    ErrorCode::WANT_WRITE => waits.tcp |= libc::POLLOUT,
                    ErrorCode::WANT_READ => waits.tcp |= libc::POLLIN,
                    _ => return Err(tls_error("writing to the TLS peer", error)),
                },
            }
        }
        Ok(progress)
    }

    /// Sleeps until a socket is ready for what `waits` names. A socket waited on for nothing is
    /// left out (fd -1), so a hang-up it reports cannot make this spin; a hang-up or error on
    /// one that is waited on is seen by the next read or write.
    fn wait(&self, waits: &Waits, timeout: Option<Duration>) -> io::Result<()> {
        let entry = |fd: RawFd, events: libc::c_short| libc::pollfd { fd: if events == 0 { -1 } else { fd }, events, revents: 0 };
        let mut fds = [entry(self.tcp_fd, waits.tcp), entry(self.plain.as_raw_fd(), waits.plain)];
        let timeout_ms = timeout.map_or(-1, |timeout| i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX));
        // SAFETY: `fds` is a live array of two pollfd for the whole call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
        Ok(())
    }
}

fn tls_error(doing: &str, error: openssl::ssl::Error) -> io::Error {
    match error.io_error() {
        Some(io_error) => io::Error::new(io_error.kind(), format!("{doing}: {io_error}")),
        None => io::Error::other(format!("{doing}: {error}")),
    }
}
