//! The NBD server: exports, listeners, and per connection reader threads that take turns and
//! a reply writer thread.
//!
//! ```text
//! accept thread ──spawns──▶ connection thread: handshake, then its turn at reading requests
//!                             + readers-1 more (ServerConfig::readers_per_connection): one
//!                               reads at a time ──submit──▶ device (bounded by InFlight)
//!                           writer thread ◀──── replies the completing thread could not send ◀── done()
//! ```
//!
//! A reply is sent by the thread that completed it, without blocking, while the writer has
//! nothing queued; the writer takes what the socket did not (see `transmission`).
//!
//! Everything a client can make the server hold is bounded by a [`ServerConfig`] field:
//! connections, requests and payload bytes in flight per connection and in total, the time a
//! handshake may take, and the time a reply may wait for a client that does not read.

mod config;
mod connection;
mod export;
mod handshake;
mod in_flight;
mod limits;
mod listener;
mod pace;
mod replies;
mod request_check;
mod round_trips;
mod transmission;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::proto;
use crate::socket::Socket;
use crate::tls::TlsServer;
pub use config::{ServerConfig, POLL_BUDGET_MAX, READERS_PER_CONNECTION_MAX};
pub use export::Export;
use export::{check_exports, ExportIdentity};
use limits::{LogLimiter, PayloadBudget};
use listener::Listener;
pub use listener::ServerHandle;
pub use pace::HandOver;

/// Descriptors one connection holds: its socket, shared by the reader, the writer and the
/// registry (see `Socket`). What a process must keep free per connection it allows.
pub const DESCRIPTORS_PER_CONNECTION: usize = 1;
/// Descriptors a connection holds once it runs TLS: its socket and the two ends of the
/// socketpair between the connection and its TLS relay (see `tls`).
pub const TLS_DESCRIPTORS_PER_CONNECTION: usize = 3;
/// Stack of each connection thread. They parse fixed-size headers, call the device and write
/// replies, with no recursion, so a fraction of std's 2 MiB default is plenty; it bounds the
/// address space that idle connections reserve.
pub const CONNECTION_THREAD_STACK_BYTES: usize = 256 << 10;
/// At most one line per this interval about refused or dropped connections; the rest are
/// counted in the next line, so a flood of clients cannot flood the log.
pub const DROPPED_CONNECTION_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Why a server could not be built from its exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerError {
    NoExports,
    DuplicateExport {
        export: String,
    },
    NameTooLong {
        name_len_bytes: usize,
    },
    BadBlockSize {
        export: String,
        block_size_bytes: u32,
    },
    PartialBlock {
        export: String,
        size_bytes: u64,
        block_size_bytes: u64,
    },
    /// `requests_in_flight_max` is 0: no request could ever be served.
    NoRequestsInFlight,
    /// A [`ServerConfig`] bound outside what can work.
    BadConfig {
        field: &'static str,
        value: u64,
        allowed: String,
    },
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::NoExports => write!(f, "an NBD server needs at least one export"),
            ServerError::DuplicateExport { export } => {
                write!(f, "export name {export:?} is used twice; names must be unique")
            }
            ServerError::NameTooLong { name_len_bytes } => {
                write!(f, "export name is {name_len_bytes} bytes; at most {} allowed", proto::STRING_MAX_BYTES)
            }
            ServerError::BadBlockSize { export, block_size_bytes } => write!(
                f,
                "export {export:?} has block size {block_size_bytes}; allowed: a power of two up to {}",
                proto::BLOCK_SIZE_MIN_LIMIT_BYTES
            ),
            ServerError::PartialBlock { export, size_bytes, block_size_bytes } => {
                write!(f, "export {export:?} is {size_bytes} bytes, not a multiple of its block size {block_size_bytes}")
            }
            ServerError::NoRequestsInFlight => {
                write!(f, "requests_in_flight_max is 0; allowed: at least 1 (default 128)")
            }
            ServerError::BadConfig { field, value, allowed } => write!(f, "{field} is {value}; allowed: {allowed}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// Why one connection ended early; logged, never propagated to other connections.
#[derive(Debug)]
pub(crate) enum ConnectionError {
    Io(io::Error),
    /// The client broke the protocol in a way that leaves no choice but a hard disconnect.
    Protocol(String),
}

impl From<io::Error> for ConnectionError {
    fn from(error: io::Error) -> Self {
        ConnectionError::Io(error)
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionError::Io(error) => write!(f, "I/O error: {error}"),
            ConnectionError::Protocol(reason) => write!(f, "protocol violation: {reason}"),
        }
    }
}

/// What [`Server::stats`] reports, over every listener of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now, in any phase (handshake included).
    pub connections_open: usize,
    pub connections_max: usize,
    /// Connections that got a place under `connections_max` since the server started.
    pub connections_accepted: u64,
    /// Connections closed at once because `connections_max` were open.
    pub connections_refused: u64,
    /// READ and WRITE payload bytes in flight now, and their bound.
    pub payload_in_flight_bytes: usize,
    pub payload_in_flight_bytes_max: usize,
    /// Replies sent since the server started, and the socket writes that carried them: a reader
    /// that serves a burst of requests sends their replies in one write (the cork).
    pub replies_sent: u64,
    pub reply_writes: u64,
    /// With `HandOver::Auto`: connections' measurements of how their readers should take turns
    /// that chose handing over, that chose keeping the turn, and that ended with the turn kept
    /// because the client kept requests in flight or sent at its own pace.
    pub turn_choices_hand_over: u64,
    pub turn_choices_keep: u64,
    pub turn_choices_too_few_round_trips: u64,
}

/// A set of exports, ready to listen on any number of sockets.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

struct Shared {
    /// Replaced whole when the set changes; a connection keeps the list it negotiated with.
    exports: RwLock<Arc<Vec<Export>>>,
    config: ServerConfig,
    /// Connections in the transmission phase, by export identity.
    connections_by_export: Mutex<HashMap<ExportIdentity, usize>>,
    /// Connections open in any phase on every listener, bounded by `connections_max`.
    connections_open: AtomicUsize,
    /// Connections that got a place under `connections_max`, since the server started.
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    payload_budget: Arc<PayloadBudget>,
    reply_counts: Arc<replies::ReplyCounts>,
    /// How connections' measurements of the way to take turns ended (`HandOver::Auto`).
    turn_choices: Arc<round_trips::TurnChoices>,
    /// Every listener's registry, so `set_exports` can end connections to removed exports.
    listeners: Mutex<Vec<Weak<ListenerState>>>,
    refusals_log: LogLimiter,
    drops_log: LogLimiter,
}

impl Shared {
    fn new(exports: Vec<Export>, config: ServerConfig) -> Shared {
        Shared {
            exports: RwLock::new(Arc::new(exports)),
            connections_by_export: Mutex::new(HashMap::new()),
            connections_open: AtomicUsize::new(0),
            connections_accepted: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            payload_budget: Arc::new(PayloadBudget::new(config.payload_in_flight_bytes_total_max)),
            reply_counts: Arc::default(),
            turn_choices: Arc::default(),
            listeners: Mutex::new(Vec::new()),
            refusals_log: LogLimiter::new(DROPPED_CONNECTION_LOG_INTERVAL),
            drops_log: LogLimiter::new(DROPPED_CONNECTION_LOG_INTERVAL),
            config,
        }
    }

    fn exports(&self) -> Arc<Vec<Export>> {
        Arc::clone(&self.exports.read().expect("exports lock poisoned"))
    }

    /// A place under `connections_max`, or `None` if every place is taken.
    fn reserve_connection(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let max = self.config.connections_max;
        let reserved = self.connections_open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| (open < max).then_some(open + 1));
        reserved.ok()?;
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
        Some(ConnectionSlot { shared: Arc::clone(self) })
    }
}

/// One place under `connections_max`, given back on drop however the connection ends.
struct ConnectionSlot {
    shared: Arc<Shared>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.shared.connections_open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    /// # Errors
    /// If there are no exports, two share a name, a name is longer than the spec allows, or a
    /// device's block size or size cannot be advertised.
    pub fn new(exports: Vec<Export>) -> Result<Server, ServerError> {
        Server::with_config(exports, ServerConfig::default())
    }

    /// # Errors
    /// As [`Server::new`], or if a bound of `config` cannot work ([`ServerConfig::check`]).
    pub fn with_config(exports: Vec<Export>, config: ServerConfig) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        check_exports(&exports)?;
        config.check()?;
        Ok(Server { shared: Arc::new(Shared::new(exports, config)) })
    }

    /// A server that starts with no exports (a controller with no virtual drive yet still
    /// answers NBD_OPT_LIST); see [`Server::set_exports`].
    ///
    /// # Errors
    /// If a bound of `config` cannot work ([`ServerConfig::check`]).
    pub fn empty(config: ServerConfig) -> Result<Server, ServerError> {
        config.check()?;
        Ok(Server { shared: Arc::new(Shared::new(Vec::new(), config)) })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// Replaces the exports. New connections see the new set. Open connections to an export
    /// whose identity is still in the set (under its old name or a new one) go on; the others
    /// are ended: their sockets are shut down for reading, requests in flight complete and are
    /// answered, then they close.
    ///
    /// # Errors
    /// As [`Server::new`], except that an empty set is allowed.
    pub fn set_exports(&self, exports: Vec<Export>) -> Result<(), ServerError> {
        check_exports(&exports)?;
        let identities: HashSet<ExportIdentity> = exports.iter().map(Export::identity).collect();
        *self.shared.exports.write().expect("exports lock poisoned") = Arc::new(exports);
        let mut listeners = self.shared.listeners.lock().expect("listeners lock poisoned");
        listeners.retain(|listener| listener.strong_count() > 0);
        for listener in listeners.iter().filter_map(Weak::upgrade) {
            listener.end_connections_not_in(&identities);
        }
        Ok(())
    }

    /// Clients connected to the export named `name` now (past the handshake), counted by its
    /// identity, so connections made under an earlier name count too.
    pub fn connections_to(&self, name: &str) -> usize {
        let exports = self.exports();
        let identity =
            exports.iter().find(|export| export.name == name).map_or_else(|| ExportIdentity::Name(name.into()), Export::identity);
        let counts = self.shared.connections_by_export.lock().expect("connection counts poisoned");
        counts.get(&identity).copied().unwrap_or(0)
    }

    pub fn exports(&self) -> Arc<Vec<Export>> {
        self.shared.exports()
    }

    /// The server's connection and payload counts now, over every listener.
    pub fn stats(&self) -> ServerStats {
        let shared = &self.shared;
        ServerStats {
            connections_open: shared.connections_open.load(Ordering::SeqCst),
            connections_max: shared.config.connections_max,
            connections_accepted: shared.connections_accepted.load(Ordering::Relaxed),
            connections_refused: shared.connections_refused.load(Ordering::SeqCst),
            payload_in_flight_bytes: shared.payload_budget.bytes(),
            payload_in_flight_bytes_max: shared.config.payload_in_flight_bytes_total_max,
            replies_sent: shared.reply_counts.replies.load(Ordering::SeqCst),
            reply_writes: shared.reply_counts.writes.load(Ordering::SeqCst),
            turn_choices_hand_over: shared.turn_choices.hand_over.load(Ordering::Relaxed),
            turn_choices_keep: shared.turn_choices.keep.load(Ordering::Relaxed),
            turn_choices_too_few_round_trips: shared.turn_choices.too_few_round_trips.load(Ordering::Relaxed),
        }
    }

    /// Listens on a Unix socket at `path` (which must not exist) and serves from a new thread.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<ServerHandle> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        self.spawn_listener(Listener::Unix(listener), ListenAddress::Unix(path), ListenerState::default())
    }

    /// Listens on TCP (port 0 picks a free port; see [`ServerHandle::address`]), without TLS.
    pub fn serve_tcp(&self, address: impl ToSocketAddrs) -> io::Result<ServerHandle> {
        self.serve_tcp_with(address, None)
    }

    /// Listens on TCP with STARTTLS offered (`TlsMode::On`) or required (`TlsMode::Require`),
    /// or without TLS (`None`).
    pub fn serve_tcp_with(&self, address: impl ToSocketAddrs, tls: Option<TlsServer>) -> io::Result<ServerHandle> {
        self.serve_tcp_listener(TcpListener::bind(address)?, tls)
    }

    /// [`Server::serve_tcp_with`] on a listener the caller bound (a daemon binds its ports
    /// before it opens anything else, so that a port in use stops it with nothing touched).
    pub fn serve_tcp_listener(&self, listener: TcpListener, tls: Option<TlsServer>) -> io::Result<ServerHandle> {
        let local = listener.local_addr()?;
        let state = ListenerState { tls, ..ListenerState::default() };
        self.spawn_listener(Listener::Tcp(listener), ListenAddress::Tcp(local), state)
    }

    fn spawn_listener(&self, listener: Listener, address: ListenAddress, state: ListenerState) -> io::Result<ServerHandle> {
        listener::spawn(&self.shared, listener, address, state)
    }
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Per-listener state shared by the accept thread, the connections and the handle.
#[derive(Default)]
struct ListenerState {
    stopping: AtomicBool,
    connections: Mutex<Connections>,
    connections_changed: Condvar,
    requests_in_flight: AtomicUsize,
    /// STARTTLS offered or required on this listener's connections.
    tls: Option<TlsServer>,
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, OpenConnection>,
}

struct OpenConnection {
    /// Shares the connection's descriptor, so shutdown can close it under its threads.
    socket: Socket,
    /// Under TLS, the plaintext end the connection's threads use (the relay holds the other):
    /// ending its input ends the connection's as shutting a plain socket's does, while the
    /// relay still carries the replies in flight out.
    plain: Option<Socket>,
    /// Set once the handshake has chosen an export.
    identity: Option<ExportIdentity>,
}

impl OpenConnection {
    /// Stops the connection reading (`Read`: requests in flight are still answered) or ends it
    /// (`Both`: the TCP socket too, so a TLS relay stops at once).
    fn shutdown(&self, how: Shutdown) {
        match (&self.plain, how) {
            (Some(plain), Shutdown::Read) => {
                let _ = plain.shutdown(Shutdown::Read);
            }
            (plain, _) => {
                if let Some(plain) = plain {
                    let _ = plain.shutdown(how);
                }
                let _ = self.socket.shutdown(how);
            }
        }
    }
}

impl ListenerState {
    fn register(&self, socket: &Socket) -> u64 {
        let mut connections = self.connections.lock().unwrap();
        let id = connections.next_id;
        connections.next_id += 1;
        connections.open.insert(id, OpenConnection { socket: socket.clone(), plain: None, identity: None });
        id
    }

    /// Records the plaintext end of connection `id`'s TLS relay.
    fn attach_plain(&self, id: u64, plain: &Socket) {
        if let Some(connection) = self.connections.lock().unwrap().open.get_mut(&id) {
            connection.plain = Some(plain.clone());
        }
    }

    /// Records the export connection `id` chose; false if `set_exports` has removed it since
    /// the handshake began. Checked under the registry lock, which `set_exports` takes after
    /// replacing the set, so a connection is either refused here or ended there.
    fn enter_transmission(&self, id: u64, identity: ExportIdentity, shared: &Shared) -> bool {
        let mut connections = self.connections.lock().unwrap();
        if !shared.exports().iter().any(|export| export.identity() == identity) {
            return false;
        }
        if let Some(connection) = connections.open.get_mut(&id) {
            connection.identity = Some(identity);
        }
        true
    }

    fn end_connections_not_in(&self, identities: &HashSet<ExportIdentity>) {
        let connections = self.connections.lock().unwrap();
        for connection in connections.open.values() {
            if connection.identity.as_ref().is_some_and(|identity| !identities.contains(identity)) {
                connection.shutdown(Shutdown::Read);
            }
        }
    }

    fn shutdown_all(&self, how: Shutdown) {
        for connection in self.connections.lock().unwrap().open.values() {
            connection.shutdown(how);
        }
    }

    /// Waits until no connection is open, or `deadline` passes; returns whether none is open.
    fn wait_closed(&self, deadline: Option<Instant>) -> bool {
        let mut connections = self.connections.lock().unwrap();
        while !connections.open.is_empty() {
            let Some(deadline) = deadline else {
                connections = self.connections_changed.wait(connections).unwrap();
                continue;
            };
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            connections = self.connections_changed.wait_timeout(connections, deadline - now).unwrap().0;
        }
        true
    }
}
