//! A listener: its accept thread, which refuses connections past `connections_max` at once,
//! and the handle that stops it and shuts its connections down.

use super::{connection, ListenAddress, ListenerState, Shared};
use crate::socket::Socket;
use crate::uri::NbdUri;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
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
    let accept_thread =
        thread::Builder::new().name("nbd-accept".into()).spawn(move || accept_loop(listener, accept_shared, accept_state))?;
    Ok(ServerHandle { address, state, shared: Arc::clone(shared), accept_thread: Some(accept_thread) })
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
        // accept() has no timeout: wake it with a connection it will see is the last.
        let _ = match &self.address {
            ListenAddress::Tcp(address) => std::net::TcpStream::connect(wake_address(*address)).map(drop),
            ListenAddress::Unix(path) => UnixStream::connect(path).map(drop),
        };
        if accept_thread.join().is_err() {
            tracing::error!("nbd: accept thread panicked");
        }
        if let ListenAddress::Unix(path) = &self.address {
            let _ = std::fs::remove_file(path);
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

/// A listener bound to the unspecified address is woken through loopback.
fn wake_address(address: SocketAddr) -> SocketAddr {
    let mut wake = address;
    if address.ip().is_unspecified() {
        wake.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    wake
}
