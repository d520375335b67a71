//! NBD for storc: the protocol, a server that exports any [`BlockDevice`], and a small client.
//!
//! This is the only crate that knows NBD, and it knows nothing of RAID: the engine implements
//! [`BlockDevice`] for its virtual drives and hands them to a [`Server`] as [`Export`]s.
//!
//! # Map
//!
//! - [`proto`]: constants and pure parse/encode of every message the server and client use.
//!   No I/O, so every boundary is unit-tested with bytes, including malformed ones.
//! - [`BlockDevice`] and [`IoError`]: the interface the server drives.
//! - [`Server`]: listeners on Unix sockets and TCP; per connection, the handshake, then the
//!   transmission phase.
//! - [`tls`]: NBD_OPT_STARTTLS (PSK and X.509, through OpenSSL; why not rustls is there), for
//!   the server's TCP listeners and the client; a relay thread per TLS connection owns its SSL
//!   object, so everything else sees a plain socket.
//! - [`Client`] and [`NbdUri`]: a blocking, pipelining client for storc's benchmark and tests
//!   (`nbds://` with a PSK too).
//! - [`member::NbdDrive`]: an export as a `drive::Drive`, so a VD can mirror a local drive with
//!   a remote export; its own reader and writer threads, a timeout, reconnection.
//! - [`testing::MemDevice`]: a `Vec`-backed device to test the server alone;
//!   [`testing::Nbdkit`]: nbdkit on a Unix socket, to test the client and the benchmark.
//!
//! # Design decisions
//!
//! **Threads per connection, not an async runtime.** Each connection has reader threads that
//! take turns parsing requests and submitting them to the device without waiting (one reads
//! at a time; the turn passes before a reader serves the request that emptied the socket, so
//! the next request finds a thread already waiting for it), and a writer thread that sends the
//! replies the completing threads could not send in place. The device completes from its own
//! threads (the engine's shards) through a callback that sends the reply. NBD connections are
//! few (one or a handful per client, and at most `connections_max`), so a thread blocked on a
//! lock or a socket costs nothing that matters, while blocking std sockets keep the code
//! straight-line, the stack traces readable, and the crate free of a runtime the engine's
//! thread-per-core design does not want on its data path. Concurrency comes from many requests
//! in flight per connection, not from many tasks.
//!
//! **Bounded everything.** A connection may have at most 128 requests or 64 MiB of payload in
//! flight, and all connections together 512 MiB (see [`ServerConfig`]); beyond that a reader
//! stops reading, and TCP pushes back on the client. Each request holds a credit from
//! submission until its reply has been written, released on drop, so a client that disconnects
//! mid-request, a write error, or a device that drops a callback cannot leak one, and a client
//! that stops reading its replies is dropped after `reply_stall_timeout`. Connections are
//! bounded in number (each holds [`DESCRIPTORS_PER_CONNECTION`] descriptor, or
//! [`TLS_DESCRIPTORS_PER_CONNECTION`] with TLS, and [`ServerConfig::threads_per_connection`]
//! threads), and a handshake must end within `handshake_timeout`
//! however slowly its bytes arrive. So the memory, threads and descriptors a crowd of clients
//! can make the server hold are known in advance.
//!
//! **One `match` from errors to the wire.** Device errors and the server's own request checks
//! (misaligned, past the end, unknown flag) are both [`IoError`]s, and [`IoError::nbd_error`]
//! is the single place that picks an NBD error value, so the spec's rules (ENOSPC for a write
//! past the end, EINVAL for a read past the end or a misaligned request) live in one table.
//!
//! **Hostile clients.** Every length is checked before memory is committed to it. A request
//! with a bad magic, a WRITE longer than the advertised maximum (32 MiB), or an oversized
//! option ends that connection only (a hard disconnect, as the spec allows); an unknown command
//! or flag gets EINVAL and the connection goes on, as the spec asks.
//!
//! **Generic hot path.** Exports of different device types live in one list behind an
//! object-safe wrapper, but the transmission phase is compiled per device type, so buffers move
//! from the device's pool to the socket and back without boxing or copying.

pub mod client;
mod device;
pub mod member;
pub mod proto;
pub mod server;
mod socket;
pub mod testing;
pub mod tls;
mod uri;

pub use client::{Client, ClientConfig, ClientError, Completion, ExportInfo, NbdError};
pub use device::{BlockDevice, Done, IoError, ReadDone};
pub use server::{
    Export, HandOver, ListenAddress, Server, ServerConfig, ServerError, ServerHandle, ServerStats, CONNECTION_THREAD_STACK_BYTES,
    DESCRIPTORS_PER_CONNECTION, DROPPED_CONNECTION_LOG_INTERVAL, POLL_BUDGET_MAX, READERS_PER_CONNECTION_MAX,
    TLS_DESCRIPTORS_PER_CONNECTION,
};
pub use tls::{PskKeys, TlsClient, TlsCredentials, TlsMode, TlsServer};
pub use uri::{NbdUri, UriError, UriTls};
