//! A listener: its accept thread, which refuses connections past `connections_max` at once,
//! and the handle that stops it and shuts its connections down.

use super::{connection, ListenAddress, ListenerState, Shared};
use crate::socket::Socket;
use crate::uri::NbdUri;
use std::io;
use std::net::{Shutdown, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// A second descriptor of the listening socket, for [`ServerHandle::stop_listening`].
    fn waker(&self) -> io::Result<OwnedFd> {
        Ok(match self {
            Listener::Tcp(listener) => OwnedFd::from(listener.try_clone()?),
            Listener::Unix(listener) => OwnedFd::from(listener.try_clone()?),
        })
    }

    fn accept(&self) -> io::Result<Socket> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept()?;
                // Replies are written whole; waiting to coalesce them only adds latency.
                stream.set_nodelay(true)?;
                Ok(Socket::tcp(stream))
            }
            Listener::Unix(listener) => Ok(Socket::unix(listener.accept()?.0)),
        }
    }
}

/// Starts the accept thread of `listener` for the server `shared`.
pub(super) fn spawn(shared: &Arc<Shared>, listener: Listener, address: ListenAddress, state: ListenerState) -> io::Result<ServerHandle> {
    let state = Arc::new(state);
    shared.listeners.lock().expect("listeners lock poisoned").push(Arc::downgrade(&state));
    let (accept_shared, accept_state) = (Arc::clone(shared), Arc::clone(&state));
    let waker = listener.waker()?;
    let socket_file = match &address {
        ListenAddress::Unix(path) => Some(FileId::of(path)?),
        ListenAddress::Tcp(_) => None,
    };
    let accept_thread =
        thread::Builder::new().name("nbd-accept".into()).spawn(move || accept_loop(listener, accept_shared, accept_state))?;
    Ok(ServerHandle { address, state, shared: Arc::clone(shared), accept_thread: Some(accept_thread), waker, socket_file })
}

fn accept_loop(listener: Listener, shared: Arc<Shared>, state: Arc<ListenerState>) {
    loop {
        let accepted = listener.accept();
        if state.stopping.load(Ordering::SeqCst) {
            return;
        }
        let socket = match accepted {
            Ok(socket) => socket,
            Err(error) => {
                // Out of file descriptors and the like: back off rather than spin.
                if let Some(suppressed_count) = shared.refusals_log.admit(Instant::now()) {
                    tracing::warn!(%error, suppressed_count, "nbd: accept failed");
                }
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(slot) = shared.reserve_connection() else {
            refuse(&shared, &socket);
            continue;
        };
        if let Err(error) = connection::spawn_connection(socket, slot, &shared, &state) {
            if let Some(suppressed_count) = shared.refusals_log.admit(Instant::now()) {
                tracing::warn!(%error, suppressed_count, "nbd: could not start a connection thread");
            }
        }
    }
}

/// Closes a connection beyond `connections_max` at once: the client sees EOF before the
/// greeting, and the server holds nothing for it.
fn refuse(shared: &Shared, socket: &Socket) {
    shared.connections_refused.fetch_add(1, Ordering::SeqCst);
    if let Some(suppressed_count) = shared.refusals_log.admit(Instant::now()) {
        let connections_max = shared.config.connections_max;
        tracing::warn!(
            peer = %socket.peer_name(),
            suppressed_count,
            "nbd: refused a connection: {connections_max} are open, the most allowed (connections_max)"
        );
    }
    let _ = socket.shutdown(Shutdown::Both);
}

/// A running listener. Dropping it shuts it down as [`ServerHandle::shutdown`] does.
pub struct ServerHandle {
    address: ListenAddress,
    state: Arc<ListenerState>,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
    /// The listening socket, shut down to wake the accept thread.
    waker: OwnedFd,
    /// A Unix socket's file as bound: removed on stop only if it is still that file.
    socket_file: Option<FileId>,
}

/// Which file a path named: device and inode.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileId(u64, u64);

impl FileId {
    fn of(path: &std::path::Path) -> io::Result<FileId> {
        let metadata = std::fs::symlink_metadata(path)?;
        Ok(FileId(metadata.dev(), metadata.ino()))
    }
}

impl ServerHandle {
    pub fn address(&self) -> &ListenAddress {
        &self.address
    }

    /// The URI a client uses to reach `export_name` through this listener.
    pub fn uri(&self, export_name: &str) -> NbdUri {
        match &self.address {
            ListenAddress::Tcp(address) => {
                NbdUri::Tcp { host: address.ip().to_string(), port: address.port(), export_name: export_name.to_string(), tls: None }
            }
            ListenAddress::Unix(path) => NbdUri::Unix { socket_path: path.clone(), export_name: export_name.to_string() },
        }
    }

    /// Connections open now on this listener, in any phase.
    pub fn connections_open(&self) -> usize {
        self.state.connections.lock().unwrap().open.len()
    }

    /// Connections closed at once because `connections_max` were open, over every listener of
    /// the server, since it started.
    pub fn connections_refused(&self) -> u64 {
        self.shared.connections_refused.load(Ordering::SeqCst)
    }

    /// Requests submitted to devices or with replies not yet sent, over this listener's
    /// connections.
    pub fn requests_in_flight(&self) -> usize {
        self.state.requests_in_flight.load(Ordering::SeqCst)
    }

    /// READ and WRITE payload bytes in flight now, over every listener of the server.
    pub fn payload_in_flight_bytes(&self) -> usize {
        self.shared.payload_budget.bytes()
    }

    /// The most payload bytes that were ever in flight at once, over every listener: never more
    /// than `payload_in_flight_bytes_total_max` unless a single request was larger.
    pub fn payload_in_flight_bytes_peak(&self) -> usize {
        self.shared.payload_budget.bytes_peak()
    }

    /// Stops accepting connections; open connections go on. Idempotent.
    pub fn stop_listening(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        self.state.stopping.store(true, Ordering::SeqCst);
        // accept() has no timeout. Shutting the listening socket down makes it return at once
        // (Linux: EINVAL), through the socket itself: a connection to its address would not
        // arrive if the socket's file was removed, or would reach whoever bound the address
        // since, and the daemon would never stop.
        // SAFETY: shutdown on a descriptor this handle owns.
        if unsafe { libc::shutdown(self.waker.as_raw_fd(), libc::SHUT_RDWR) } != 0 {
            tracing::error!(error = %io::Error::last_os_error(), "nbd: could not shut the listening socket down to stop accepting");
        }
        if accept_thread.join().is_err() {
            tracing::error!("nbd: accept thread panicked");
        }
        // Another server may have bound the path since ours was removed; its file stays.
        if let (ListenAddress::Unix(path), Some(bound)) = (&self.address, self.socket_file) {
            if FileId::of(path).is_ok_and(|now| now == bound) {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Stops listening, stops reading new requests, waits for the requests in flight to
    /// complete and their replies to be sent, then closes every connection. A client that does
    /// not read its replies gets `shutdown_grace` before its socket is closed under it.
    pub fn shutdown(&mut self) {
        self.stop_listening();
        self.state.shutdown_all(Shutdown::Read);
        if self.state.wait_closed(Some(Instant::now() + self.shared.config.shutdown_grace)) {
            return;
        }
        tracing::warn!("nbd: connections still open after the shutdown grace period; closing them");
        self.state.shutdown_all(Shutdown::Both);
        // Connections end once the device completes what it holds; buffers must come back first.
        self.state.wait_closed(None);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
