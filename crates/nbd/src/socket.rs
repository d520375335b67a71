//! One stream type over TCP and Unix sockets, so the server and client are written once.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connected socket. Clones share one descriptor (`&TcpStream` reads and writes), so a
/// connection's reader, writer and registry entry cost one descriptor, not one each: under a
/// descriptor limit that is the difference between refusing clients and refusing the API.
#[derive(Debug, Clone)]
pub(crate) struct Socket {
    stream: Arc<Stream>,
}

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub(crate) fn tcp(stream: TcpStream) -> Socket {
        Socket { stream: Arc::new(Stream::Tcp(stream)) }
    }

    pub(crate) fn unix(stream: UnixStream) -> Socket {
        Socket { stream: Arc::new(Stream::Unix(stream)) }
    }

    /// Shutting down one clone shuts down the socket under every clone.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &*self.stream {
            Stream::Tcp(stream) => stream.shutdown(how),
            Stream::Unix(stream) => stream.shutdown(how),
        }
    }

    /// SO_RCVTIMEO: set on the socket, so it applies to every clone.
    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &*self.stream {
            Stream::Tcp(stream) => stream.set_read_timeout(timeout),
            Stream::Unix(stream) => stream.set_read_timeout(timeout),
        }
    }

    /// SO_SNDTIMEO: a write that makes no progress for this long fails with WouldBlock.
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &*self.stream {
            Stream::Tcp(stream) => stream.set_write_timeout(timeout),
            Stream::Unix(stream) => stream.set_write_timeout(timeout),
        }
    }

    /// O_NONBLOCK on the descriptor, so for every clone: only a TLS relay, which then owns all
    /// reads and writes of it, sets it.
    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &*self.stream {
            Stream::Tcp(stream) => stream.set_nonblocking(nonblocking),
            Stream::Unix(stream) => stream.set_nonblocking(nonblocking),
        }
    }

    pub(crate) fn is_unix(&self) -> bool {
        matches!(&*self.stream, Stream::Unix(_))
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &*self.stream {
            Stream::Tcp(stream) => stream.as_raw_fd(),
            Stream::Unix(stream) => stream.as_raw_fd(),
        }
    }

    /// A read that never sleeps: `WouldBlock` when nothing is there (MSG_DONTWAIT, so the
    /// socket stays blocking for every other clone).
    pub(crate) fn read_nonblocking(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf, libc::MSG_DONTWAIT)
    }

    /// One `recv(2)` with `flags` into `buf`.
    fn recv(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and the
        // descriptor stays open while `self` holds the stream.
        let read_bytes = unsafe { libc::recv(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
        if read_bytes < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(read_bytes as usize)
    }

    /// SO_RCVLOWAT: a blocking read returns once this many bytes are there (or the stream
    /// ended, or the timeout passed), not at the first byte.
    pub(crate) fn set_receive_low_water(&self, bytes: usize) -> io::Result<()> {
        let bytes = libc::c_int::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the option value is a live c_int of the size passed.
        let result = unsafe {
            libc::setsockopt(
                self.raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sleeps until a read would not block: data, the end of the stream, an error, or a
    /// shutdown of this socket (which wakes a `poll`, as it wakes a `recv`). A signal ends the
    /// wait early; the read after it then waits as a blocking read does.
    pub(crate) fn wait_readable(&self) -> io::Result<()> {
        let mut pollfd = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd, for the length passed; the descriptor stays open while
        // `self` holds the stream.
        if unsafe { libc::poll(&mut pollfd, 1, -1) } < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
        Ok(())
    }

    /// Fills `buf` with blocking `recv(MSG_WAITALL)` calls: one call, not one per arrival, when
    /// the bytes come in several pieces.
    fn read_exact_waiting_all(&self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.recv(buf, libc::MSG_WAITALL) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(read_bytes) => buf = &mut buf[read_bytes..],
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes that are on their way, waking the caller once if the
    /// kernel can. On a Unix socket every arrival wakes a sleeping reader whatever its low-water
    /// mark (`unix_stream_data_wait` returns when the queue's tail changes), so MSG_WAITALL does
    /// what the mark would in one call instead of three. TCP wakes a reader only once the mark is
    /// met (`tcp_data_ready`), so there the mark is set for the read and put back to one byte.
    pub(crate) fn read_exact_in_one_wake(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.is_unix() {
            return self.read_exact_waiting_all(buf);
        }
        self.set_receive_low_water(buf.len())?;
        let read = self.read_exact(buf);
        self.set_receive_low_water(1)?;
        read
    }

    /// A printable name of the other end, for logs.
    pub(crate) fn peer_name(&self) -> String {
        match &*self.stream {
            Stream::Tcp(stream) => stream.peer_addr().map_or_else(|_| "tcp peer".to_string(), |addr| addr.to_string()),
            Stream::Unix(_) => "unix peer".to_string(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &*self.stream {
            Stream::Tcp(stream) => (&*stream).read(buf),
            Stream::Unix(stream) => (&*stream).read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &*self.stream {
            Stream::Tcp(stream) => (&*stream).write(buf),
            Stream::Unix(stream) => (&*stream).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &*self.stream {
            Stream::Tcp(stream) => (&*stream).write_vectored(bufs),
            Stream::Unix(stream) => (&*stream).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(()) // sockets have no user-space buffer
    }
}

/// A socket whose reads and writes fail with `TimedOut` once `deadline` passes, however slowly
/// the bytes trickle: before each call the socket's timeout is set to the time remaining. A
/// per-call timeout alone lets a client that sends one byte just inside it hold a connection
/// for as long as it likes.
#[derive(Debug)]
pub(crate) struct DeadlineSocket {
    socket: Socket,
    deadline: Option<Instant>,
    /// Without a deadline: how long a read polls before it sleeps ([`DeadlineSocket::poll`]).
    poll_budget: Duration,
    /// Reads return `WouldBlock` instead of waiting ([`DeadlineSocket::set_dont_wait`]).
    dont_wait: bool,
    /// A read that finds a Unix socket empty sleeps in `poll` rather than in `recv`
    /// ([`DeadlineSocket::set_sleep_in_poll`]).
    sleep_in_poll: bool,
}

impl DeadlineSocket {
    pub(crate) fn new(socket: Socket, deadline: Instant) -> DeadlineSocket {
        DeadlineSocket { socket, deadline: Some(deadline), poll_budget: Duration::ZERO, dont_wait: false, sleep_in_poll: false }
    }

    /// Reads poll the socket this long for data before they sleep in the kernel (zero: never).
    pub(crate) fn set_poll_budget(&mut self, budget: Duration) {
        self.poll_budget = budget;
    }

    /// While set, reads take what is there and fail with `WouldBlock` if nothing is, whatever
    /// the deadline or poll budget: a caller that has work of its own to do first.
    pub(crate) fn set_dont_wait(&mut self, dont_wait: bool) {
        self.dont_wait = dont_wait;
    }

    /// Whether a read that finds a Unix socket empty sleeps in `poll(2)` and reads once woken,
    /// instead of sleeping in `recv` (the default); see [`DeadlineSocket::read`].
    pub(crate) fn set_sleep_in_poll(&mut self, sleep_in_poll: bool) {
        self.sleep_in_poll = sleep_in_poll;
    }

    /// Reads without waiting, again and again for up to the budget (once with none): `Some`
    /// with what a read returned once data (or the end, or an error) is there, `None` if
    /// nothing came in time.
    fn poll(&self, buf: &mut [u8]) -> Option<io::Result<usize>> {
        let mut started: Option<Instant> = None;
        loop {
            match self.socket.read_nonblocking(buf) {
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                outcome => return Some(outcome),
            }
            // The clock is read only once the first read found nothing.
            if started.get_or_insert_with(Instant::now).elapsed() >= self.poll_budget {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.raw_fd()
    }

    /// See [`Socket::read_exact_in_one_wake`]. Under a deadline (the handshake, which reads no
    /// payload) or a poll budget, a plain `read_exact` through [`DeadlineSocket::read`], which
    /// keeps to them: a TCP reader whose polls ran out may then wake once more for the rest.
    pub(crate) fn read_exact_in_one_wake(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.deadline.is_some() || !self.poll_budget.is_zero() {
            return self.read_exact(buf);
        }
        self.socket.read_exact_in_one_wake(buf)
    }

    /// Shuts down the socket under every clone.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket.shutdown(how)
    }

    /// From now on reads and writes wait as long as the socket's own timeouts say.
    pub(crate) fn clear_deadline(&mut self) -> io::Result<()> {
        self.deadline = None;
        self.socket.set_read_timeout(None)
    }

    /// The time left, or `TimedOut` if none is; `None` without a deadline.
    fn remaining(&self) -> io::Result<Option<Duration>> {
        let Some(deadline) = self.deadline else {
            return Ok(None);
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake deadline passed"));
        }
        Ok(Some(remaining))
    }

    /// A socket timeout (EAGAIN) under a deadline is the deadline passing.
    fn name_timeout(&self, error: io::Error) -> io::Error {
        if self.deadline.is_some() && error.kind() == io::ErrorKind::WouldBlock {
            return io::Error::new(io::ErrorKind::TimedOut, "the handshake deadline passed");
        }
        error
    }
}

impl Read for DeadlineSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.dont_wait {
            return self.socket.read_nonblocking(buf);
        }
        if let Some(remaining) = self.remaining()? {
            self.socket.set_read_timeout(Some(remaining))?;
            return self.socket.read(buf).map_err(|error| self.name_timeout(error));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let sleeps_in_poll = self.sleep_in_poll && self.socket.is_unix();
        if sleeps_in_poll || !self.poll_budget.is_zero() {
            if let Some(outcome) = self.poll(buf) {
                return outcome;
            }
        }
        // Nothing there. Where the reader sleeps is a trade between the client's latency and
        // the server's CPU, on a Unix socket of a virtual machine:
        // - In `recv` (nbdkit's way, the default): woken, it leaves the socket's wait queue
        //   without taking its lock, so the client's `send` that woke it finishes at once
        //   (fio's submission latency 3 us, as against nbdkit; storc bench's QD 1 reads 35-41
        //   us against 45-55 sleeping in `poll`).
        // - In `poll`, reading once woken: the woken `poll` takes the wait queue's lock to
        //   leave it while the client's `send` still holds it to wake it, which cost each send
        //   8-9 us (fio's submission latency 11-12 us). But the slower wake-up lets a burst
        //   gather before the read: paced fio (QD 32, 40k IOPS) cost 0.21 context switches per
        //   4 KiB write against 0.41, and the server 10.2 us of CPU per write against 10.7
        //   (the client 14.6 against 15.7). The connection asks for it while its client is
        //   known not to wait for each reply (`RoundTrips::client_waits`).
        if sleeps_in_poll {
            self.socket.wait_readable()?;
        }
        self.socket.read(buf)
    }
}

impl Write for DeadlineSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(remaining) = self.remaining()? {
            self.socket.set_write_timeout(Some(remaining))?;
        }
        self.socket.write(buf).map_err(|error| self.name_timeout(error))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A reader of an empty Unix socket, sleeping in `recv` or in `poll` as asked.
    fn sleeping_reader(sleep_in_poll: bool) -> (UnixStream, Socket, std::thread::JoinHandle<Vec<Vec<u8>>>) {
        let (client, server) = UnixStream::pair().unwrap();
        let socket = Socket::unix(server);
        let mut reader = DeadlineSocket::new(socket.clone(), Instant::now() + Duration::from_secs(60));
        reader.clear_deadline().unwrap();
        reader.set_sleep_in_poll(sleep_in_poll);
        let thread = std::thread::spawn(move || {
            let mut reads = Vec::new();
            loop {
                let mut buf = [0u8; 64];
                let read_bytes = reader.read(&mut buf).unwrap();
                reads.push(buf[..read_bytes].to_vec());
                if read_bytes == 0 {
                    return reads;
                }
            }
        });
        (client, socket, thread)
    }

    #[test]
    fn a_reader_sleeping_in_recv_or_in_poll_wakes_for_data_and_for_a_shutdown() {
        for sleep_in_poll in [false, true] {
            let (mut client, socket, reader) = sleeping_reader(sleep_in_poll);
            // Both writes come after the reader has gone to sleep (most likely): each wakes it.
            std::thread::sleep(Duration::from_millis(20));
            client.write_all(b"header").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            client.write_all(b"payload").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            // The server shutting its own socket down (a connection being closed) ends the read.
            socket.shutdown(Shutdown::Both).unwrap();
            let reads = reader.join().unwrap();
            assert_eq!(reads.concat(), b"headerpayload", "sleep_in_poll {sleep_in_poll}");
            assert_eq!(reads.last().map(Vec::len), Some(0), "sleep_in_poll {sleep_in_poll}: ended by the shutdown");
        }
    }
}
