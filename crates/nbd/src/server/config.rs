//! The limits of a server, and their check.

use super::pace::HandOver;
use super::ServerError;
use std::time::Duration;

/// Limits of a server; the defaults suit storc. Every bound a client can push against is here.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections open at once, in any phase, across all listeners of one server. Beyond it a
    /// new connection is accepted and closed at once (with a rate-limited log line). Default
    /// 256: a client opens one to sixteen per disk, and each costs
    /// [`ServerConfig::threads_per_connection`] threads.
    pub connections_max: usize,
    /// Requests a connection may have in flight before its reader stops reading. Default 128:
    /// deeper queues than the drives' own add latency, not throughput.
    pub requests_in_flight_max: usize,
    /// READ and WRITE payload bytes a connection may have in flight before its reader stops.
    /// Default 64 MiB: 64 reads of 1 MiB, enough to keep every member of a fast array busy.
    pub payload_in_flight_bytes_max: usize,
    /// READ and WRITE payload bytes in flight across all connections of one server: the bound
    /// on request buffers a crowd of clients can make the server hold. Default 512 MiB: eight
    /// connections at their full budget; more in flight makes no drive faster, only RSS larger.
    pub payload_in_flight_bytes_total_max: usize,
    /// The whole handshake, from accept to the chosen export, must end within this time, however
    /// slowly the client sends. Default 10 s: a handshake is a few round trips of milliseconds.
    pub handshake_timeout: Duration,
    /// A reply write that makes no progress for this long (the client does not read) drops the
    /// connection and releases its credits. Default 30 s: a live client drains the largest
    /// reply (32 MiB) in well under a second even on a loaded machine.
    pub reply_stall_timeout: Duration,
    /// On shutdown, how long connections get to finish their in-flight requests and send the
    /// replies before their sockets are closed under them.
    pub shutdown_grace: Duration,
    /// How long a connection's reader polls its socket for the next request before it sleeps
    /// in the kernel (hybrid polling, as the kernel's `io_poll` and SPDK's reactors do). A
    /// sleeping thread on an idle core costs the next request a wake-up of that core, which on
    /// a virtual machine is tens of microseconds; polling trades a core's time between requests
    /// for it. Default zero: never poll (a reader costs no CPU while its client is quiet).
    pub poll_budget: Duration,
    /// Threads of a connection that take turns reading its requests (at least 1). A reader
    /// serves in place the requests the socket already holds; the one that empties the socket
    /// it serves either keeping the socket, or after handing it to the next reader, as
    /// nbdkit's worker threads do ([`ServerConfig::hand_over`]): then up to this many requests
    /// are served in place at once. Default 16 (nbdkit's thread count).
    pub readers_per_connection: usize,
    /// When a reader hands the socket over before it serves the request that emptied it.
    /// Default [`HandOver::AUTO`]: while requests have recently taken over 50 us to dispatch
    /// (see `transmission`), and while handing over has been measured on the connection to
    /// shorten the round trip of a client that waits for each reply (`round_trips`); otherwise
    /// the reader keeps the socket, which costs a request that arrives alone one thread wake-up
    /// instead of three.
    pub hand_over: HandOver,
}

/// The most [`ServerConfig::readers_per_connection`]: past a few dozen, more threads change
/// nothing but the memory each connection holds.
pub const READERS_PER_CONNECTION_MAX: usize = 64;

/// The longest [`ServerConfig::poll_budget`]: a client's next request comes within tens of
/// microseconds of its last reply when it is latency-bound, and polling longer than that only
/// spends a core on one that went quiet.
pub const POLL_BUDGET_MAX: Duration = Duration::from_millis(1);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            connections_max: 256,
            requests_in_flight_max: 128,
            payload_in_flight_bytes_max: 64 << 20,
            payload_in_flight_bytes_total_max: 512 << 20,
            handshake_timeout: Duration::from_secs(10),
            reply_stall_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            poll_budget: Duration::ZERO,
            readers_per_connection: 16,
            hand_over: HandOver::AUTO,
        }
    }
}

impl ServerConfig {
    /// # Errors
    /// If a bound is zero (nothing could ever be served) or the total payload bound is below a
    /// connection's.
    pub fn check(&self) -> Result<(), ServerError> {
        let bad = |field: &'static str, value: u64, allowed: String| Err(ServerError::BadConfig { field, value, allowed });
        if self.requests_in_flight_max == 0 {
            return Err(ServerError::NoRequestsInFlight);
        }
        if self.connections_max == 0 {
            return bad("connections_max", 0, "at least 1".into());
        }
        if self.payload_in_flight_bytes_max == 0 {
            return bad("payload_in_flight_bytes_max", 0, "at least 1".into());
        }
        if self.payload_in_flight_bytes_total_max < self.payload_in_flight_bytes_max {
            let allowed = format!("at least payload_in_flight_bytes_max ({})", self.payload_in_flight_bytes_max);
            return bad("payload_in_flight_bytes_total_max", self.payload_in_flight_bytes_total_max as u64, allowed);
        }
        for (field, timeout) in [("handshake_timeout", self.handshake_timeout), ("reply_stall_timeout", self.reply_stall_timeout)] {
            if timeout.is_zero() {
                return bad(field, 0, "more than 0 seconds".into());
            }
        }
        if self.poll_budget > POLL_BUDGET_MAX {
            let allowed =
                format!("at most {} microseconds (longer only burns a core for clients that went quiet)", POLL_BUDGET_MAX.as_micros());
            return bad("poll_budget", self.poll_budget.as_micros() as u64, allowed);
        }
        if !(1..=READERS_PER_CONNECTION_MAX).contains(&self.readers_per_connection) {
            let allowed = format!("1 to {READERS_PER_CONNECTION_MAX}");
            return bad("readers_per_connection", self.readers_per_connection as u64, allowed);
        }
        Ok(())
    }

    /// Threads one connection holds in the transmission phase: its readers and a reply writer,
    /// and with `tls` the relay between the socket and the plaintext end the others use.
    pub fn threads_per_connection(&self, tls: bool) -> usize {
        self.readers_per_connection + 1 + usize::from(tls)
    }
}
