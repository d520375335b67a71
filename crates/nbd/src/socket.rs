//! One stream type over TCP and Unix sockets, so the server and client are written once.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Debug)]
pub(crate) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    pub(crate) fn try_clone(&self) -> io::Result<Socket> {
        match self {
            Socket::Tcp(stream) => stream.try_clone().map(Socket::Tcp),
            Socket::Unix(stream) => stream.try_clone().map(Socket::Unix),
        }
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream.shutdown(how),
            Socket::Unix(stream) => stream.shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream.set_read_timeout(timeout),
            Socket::Unix(stream) => stream.set_read_timeout(timeout),
        }
    }

    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Socket::Tcp(stream) => stream.as_raw_fd(),
            Socket::Unix(stream) => stream.as_raw_fd(),
        }
    }

    /// A printable name of the other end, for logs.
    pub(crate) fn peer_name(&self) -> String {
        match self {
            Socket::Tcp(stream) => stream.peer_addr().map_or_else(|_| "tcp peer".to_string(), |addr| addr.to_string()),
            Socket::Unix(_) => "unix peer".to_string(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(stream) => stream.read(buf),
            Socket::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(stream) => stream.write(buf),
            Socket::Unix(stream) => stream.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(stream) => stream.write_vectored(bufs),
            Socket::Unix(stream) => stream.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream.flush(),
            Socket::Unix(stream) => stream.flush(),
        }
    }
}
