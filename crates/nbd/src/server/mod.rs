//! The NBD server: exports, listeners, and one reader and one writer thread per connection.
//!
//! ```text
//! accept thread ──spawns──▶ connection thread: handshake, then reads requests ──submit──▶ device
//!                                   │ (bounded by InFlight)                                 │
//!                                   └──── spawns writer thread ◀──── replies (channel) ◀── done()
//! ```

mod handshake;
mod transmission;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::device::BlockDevice;
use crate::proto::{self, BlockSizes};
use crate::socket::Socket;
use crate::uri::NbdUri;

/// Limits of a server; the defaults suit storc.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Requests a connection may have in flight before its reader stops reading.
    pub requests_in_flight_max: usize,
    /// READ and WRITE payload bytes a connection may have in flight before its reader stops.
    pub payload_in_flight_bytes_max: usize,
    /// A client that has not finished the handshake in this time is dropped.
    pub handshake_timeout: Duration,
    /// On shutdown, how long connections get to finish their in-flight requests and send the
    /// replies before their sockets are closed under them.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            requests_in_flight_max: 128,
            payload_in_flight_bytes_max: 64 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// One named block device offered to clients.
#[derive(Clone)]
pub struct Export {
    name: String,
    description: Option<String>,
    device: Arc<dyn ErasedDevice>,
}

impl Export {
    /// Exports `device` under `name`. Any number of exports may share one device type.
    pub fn new<D: BlockDevice>(name: impl Into<String>, device: Arc<D>) -> Export {
        Export { name: name.into(), description: None, device: Arc::new(Typed(device)) }
    }

    /// A line for people, shown by `nbdinfo --list`.
    pub fn with_description(mut self, description: impl Into<String>) -> Export {
        self.description = Some(description.into());
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    pub fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }

    /// The constraints advertised with NBD_INFO_BLOCK_SIZE: the device's block size but at
    /// least 512, a preferred size of at least 4 KiB, and at most 32 MiB per request.
    pub fn block_sizes(&self) -> BlockSizes {
        let min_bytes = self.device.block_size_bytes().max(proto::BLOCK_SIZE_MIN_BYTES);
        BlockSizes { min_bytes, preferred_bytes: min_bytes.max(proto::BLOCK_SIZE_PREFERRED_BYTES), max_bytes: proto::PAYLOAD_MAX_BYTES }
    }

    /// The transmission flags for this export; DF only once structured replies are negotiated.
    pub fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags =
            proto::NBD_FLAG_HAS_FLAGS | proto::NBD_FLAG_SEND_FLUSH | proto::NBD_FLAG_SEND_FUA | proto::NBD_FLAG_SEND_WRITE_ZEROES;
        if self.device.supports_trim() {
            flags |= proto::NBD_FLAG_SEND_TRIM;
        }
        if self.device.flush_is_global() {
            flags |= proto::NBD_FLAG_CAN_MULTI_CONN;
        }
        if structured_replies {
            // Every read is answered with one OFFSET_DATA chunk, so "don't fragment" is free.
            flags |= proto::NBD_FLAG_SEND_DF;
        }
        flags
    }

    fn check(&self) -> Result<(), ServerError> {
        let export = || self.name.clone();
        if self.name.len() > proto::STRING_MAX_BYTES {
            return Err(ServerError::NameTooLong { name_len_bytes: self.name.len() });
        }
        let block_size_bytes = self.device.block_size_bytes();
        if !block_size_bytes.is_power_of_two() || block_size_bytes > proto::BLOCK_SIZE_MIN_LIMIT_BYTES {
            return Err(ServerError::BadBlockSize { export: export(), block_size_bytes });
        }
        let min_bytes = u64::from(self.block_sizes().min_bytes);
        let size_bytes = self.device.size_bytes();
        if !size_bytes.is_multiple_of(min_bytes) {
            return Err(ServerError::PartialBlock { export: export(), size_bytes, block_size_bytes: min_bytes });
        }
        Ok(())
    }
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("size_bytes", &self.device.size_bytes())
            .finish()
    }
}

/// The object-safe face of a `BlockDevice`: what the handshake needs to know, and a way into
/// the transmission phase that is compiled per device type, so the hot path has no dynamic
/// dispatch and no boxed buffers.
trait ErasedDevice: Send + Sync {
    fn size_bytes(&self) -> u64;
    fn block_size_bytes(&self) -> u32;
    fn flush_is_global(&self) -> bool;
    fn supports_trim(&self) -> bool;
    fn serve(&self, session: transmission::Session) -> Result<(), ConnectionError>;
}

struct Typed<D>(Arc<D>);

impl<D: BlockDevice> ErasedDevice for Typed<D> {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn block_size_bytes(&self) -> u32 {
        self.0.block_size_bytes()
    }
    fn flush_is_global(&self) -> bool {
        self.0.flush_is_global()
    }
    fn supports_trim(&self) -> bool {
        self.0.supports_trim()
    }
    fn serve(&self, session: transmission::Session) -> Result<(), ConnectionError> {
        transmission::serve(Arc::clone(&self.0), session)
    }
}

/// Checks every export and that names are unique.
fn check_exports(exports: &[Export]) -> Result<(), ServerError> {
    for (index, export) in exports.iter().enumerate() {
        export.check()?;
        if exports[..index].iter().any(|earlier| earlier.name == export.name) {
            return Err(ServerError::DuplicateExport { export: export.name.clone() });
        }
    }
    Ok(())
}

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

/// A set of exports, ready to listen on any number of sockets.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

struct Shared {
    /// Replaced whole when the set changes; a connection keeps the list it negotiated with.
    exports: RwLock<Arc<Vec<Export>>>,
    config: ServerConfig,
    /// Connections in the transmission phase, by export name.
    connections_by_export: Mutex<HashMap<String, usize>>,
}

impl Server {
    /// # Errors
    /// If there are no exports, two share a name, a name is longer than the spec allows, or a
    /// device's block size or size cannot be advertised.
    pub fn new(exports: Vec<Export>) -> Result<Server, ServerError> {
        Server::with_config(exports, ServerConfig::default())
    }

    pub fn with_config(exports: Vec<Export>, config: ServerConfig) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        check_exports(&exports)?;
        if config.requests_in_flight_max == 0 {
            return Err(ServerError::NoRequestsInFlight);
        }
        Ok(Server {
            shared: Arc::new(Shared { exports: RwLock::new(Arc::new(exports)), config, connections_by_export: Mutex::new(HashMap::new()) }),
        })
    }

    /// A server that starts with no exports (a controller with no virtual drive yet still
    /// answers NBD_OPT_LIST); see [`Server::set_exports`].
    pub fn empty(config: ServerConfig) -> Result<Server, ServerError> {
        if config.requests_in_flight_max == 0 {
            return Err(ServerError::NoRequestsInFlight);
        }
        let exports = RwLock::new(Arc::new(Vec::new()));
        let connections_by_export = Mutex::new(HashMap::new());
        Ok(Server { shared: Arc::new(Shared { exports, config, connections_by_export }) })
    }

    /// Replaces the exports. New connections see the new set; open connections keep serving
    /// the export they chose until they disconnect.
    ///
    /// # Errors
    /// As [`Server::new`], except that an empty set is allowed.
    pub fn set_exports(&self, exports: Vec<Export>) -> Result<(), ServerError> {
        check_exports(&exports)?;
        *self.shared.exports.write().expect("exports lock poisoned") = Arc::new(exports);
        Ok(())
    }

    /// Clients connected to the export named `name` now (past the handshake).
    pub fn connections_to(&self, name: &str) -> usize {
        let counts = self.shared.connections_by_export.lock().expect("connection counts poisoned");
        counts.get(name).copied().unwrap_or(0)
    }

    pub fn exports(&self) -> Arc<Vec<Export>> {
        Arc::clone(&self.shared.exports.read().expect("exports lock poisoned"))
    }

    /// Listens on a Unix socket at `path` (which must not exist) and serves from a new thread.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<ServerHandle> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        self.spawn_listener(Listener::Unix(listener), ListenAddress::Unix(path))
    }

    /// Listens on TCP (port 0 picks a free port; see [`ServerHandle::address`]).
    pub fn serve_tcp(&self, address: impl ToSocketAddrs) -> io::Result<ServerHandle> {
        let listener = TcpListener::bind(address)?;
        let local = listener.local_addr()?;
        self.spawn_listener(Listener::Tcp(listener), ListenAddress::Tcp(local))
    }

    fn spawn_listener(&self, listener: Listener, address: ListenAddress) -> io::Result<ServerHandle> {
        let state = Arc::new(ListenerState::default());
        let shared = Arc::clone(&self.shared);
        let accept_state = Arc::clone(&state);
        let accept_thread = thread::Builder::new().name("nbd-accept".into()).spawn(move || accept_loop(listener, shared, accept_state))?;
        Ok(ServerHandle { address, state, accept_thread: Some(accept_thread), shutdown_grace: self.shared.config.shutdown_grace })
    }
}

enum Listener {
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
                Ok(Socket::Tcp(stream))
            }
            Listener::Unix(listener) => Ok(Socket::Unix(listener.accept()?.0)),
        }
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
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    /// A clone of each open connection's socket, so shutdown can close it under its threads.
    open: HashMap<u64, Socket>,
}

impl ListenerState {
    fn register(&self, socket: &Socket) -> io::Result<u64> {
        let clone = socket.try_clone()?;
        let mut connections = self.connections.lock().unwrap();
        let id = connections.next_id;
        connections.next_id += 1;
        connections.open.insert(id, clone);
        Ok(id)
    }

    fn shutdown_all(&self, how: Shutdown) {
        for socket in self.connections.lock().unwrap().open.values() {
            let _ = socket.shutdown(how);
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

/// Removes a connection from the registry when its thread ends, however it ends.
struct Registration {
    state: Arc<ListenerState>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.connections.lock().unwrap().open.remove(&self.id);
        self.state.connections_changed.notify_all();
    }
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
                tracing::warn!(%error, "nbd: accept failed");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if let Err(error) = spawn_connection(socket, &shared, &state) {
            tracing::warn!(%error, "nbd: could not start a connection thread");
        }
    }
}

fn spawn_connection(socket: Socket, shared: &Arc<Shared>, state: &Arc<ListenerState>) -> io::Result<()> {
    let id = state.register(&socket)?;
    let registration = Registration { state: Arc::clone(state), id };
    let shared = Arc::clone(shared);
    thread::Builder::new().name("nbd-conn".into()).spawn(move || {
        let peer = socket.peer_name();
        match run_connection(socket, &shared, &registration.state) {
            Ok(()) => tracing::debug!(%peer, "nbd: connection closed"),
            Err(error) => tracing::warn!(%peer, %error, "nbd: connection dropped"),
        }
        drop(registration);
    })?;
    Ok(())
}

/// Handshake, then the transmission phase of the chosen export, on this thread.
fn run_connection(socket: Socket, shared: &Shared, state: &Arc<ListenerState>) -> Result<(), ConnectionError> {
    socket.set_read_timeout(Some(shared.config.handshake_timeout))?;
    let mut reader = io::BufReader::new(socket.try_clone()?);
    let mut writer = io::BufWriter::new(socket.try_clone()?);
    let exports = Arc::clone(&shared.exports.read().expect("exports lock poisoned"));
    let negotiated = handshake::negotiate(&mut reader, &mut writer, &exports)?;
    let handshake::Negotiated::Transmission { export_index, structured_replies } = negotiated else {
        return Ok(());
    };
    socket.set_read_timeout(None)?;
    let export = &exports[export_index];
    let session = transmission::Session {
        reader,
        socket,
        structured_replies,
        limits: transmission::RequestLimits {
            size_bytes: export.size_bytes(),
            block_size_bytes: export.block_sizes().min_bytes,
            payload_max_bytes: export.block_sizes().max_bytes,
            transmission_flags: export.transmission_flags(structured_replies),
        },
        in_flight: transmission::InFlight::new(&shared.config, Arc::clone(state)),
    };
    let name = export.name().to_string();
    count_connection(shared, &name, true);
    let outcome = export.device.serve(session);
    count_connection(shared, &name, false);
    outcome
}

fn count_connection(shared: &Shared, name: &str, opened: bool) {
    let mut counts = shared.connections_by_export.lock().expect("connection counts poisoned");
    let count = counts.entry(name.to_string()).or_insert(0);
    if opened {
        *count += 1;
    } else {
        *count -= 1;
    }
}

/// A running listener. Dropping it shuts it down as [`ServerHandle::shutdown`] does.
pub struct ServerHandle {
    address: ListenAddress,
    state: Arc<ListenerState>,
    accept_thread: Option<JoinHandle<()>>,
    shutdown_grace: Duration,
}

impl ServerHandle {
    pub fn address(&self) -> &ListenAddress {
        &self.address
    }

    /// The URI a client uses to reach `export_name` through this listener.
    pub fn uri(&self, export_name: &str) -> NbdUri {
        match &self.address {
            ListenAddress::Tcp(address) => {
                NbdUri::Tcp { host: address.ip().to_string(), port: address.port(), export_name: export_name.to_string() }
            }
            ListenAddress::Unix(path) => NbdUri::Unix { socket_path: path.clone(), export_name: export_name.to_string() },
        }
    }

    /// Connections open now, in any phase.
    pub fn connections_open(&self) -> usize {
        self.state.connections.lock().unwrap().open.len()
    }

    /// Requests submitted to devices or with replies not yet sent, over all connections.
    pub fn requests_in_flight(&self) -> usize {
        self.state.requests_in_flight.load(Ordering::SeqCst)
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
        if self.state.wait_closed(Some(Instant::now() + self.shutdown_grace)) {
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
