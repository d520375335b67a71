//! The NBD server's bounds as `storc serve` flags, and the connection limit the process's
//! descriptor limit allows (issue 8: 255 idle connections under a 1024-descriptor limit made
//! accept fail and the management API hang) and its thread limits allow (`thread_budget.rs`:
//! a connection holds 17 threads by default).

use std::time::Duration;

use super::thread_budget;

/// Descriptors kept free for everything that is not an NBD connection and opens after the
/// bounds are set: the NBD and API listeners, tokio's epoll and eventfd, the API's clients (the
/// CLI opens one per command), metadata and id files, and one per listener for accepting a
/// connection only to refuse it. Generous, because running out of these is what made the API
/// hang; descriptors are cheap.
pub const DESCRIPTORS_RESERVED_COUNT: u64 = 128;

/// Threads kept free for everything that is not an NBD connection and starts after the bounds
/// are set: io_uring's workers (io-wq, started on demand for each ring), the management API's
/// blocking tasks and TLS handshakes; half the room where the room is under twice this (a
/// small `TasksMax` still serves a few connections). The daemon itself runs about ten threads
/// when idle; those already run and are counted as in use.
pub const THREADS_RESERVED_COUNT: u64 = 256;

/// `storc serve` flags for the NBD server's bounds. The defaults are `nbd::ServerConfig`'s
/// (a test checks that they agree), each explained there.
#[derive(clap::Args, Debug)]
pub struct NbdLimitArgs {
    /// NBD connections open at once over both listeners; beyond it a connection is closed at
    /// once, with a logged reason. Lowered at start if the descriptor limit cannot hold it.
    #[arg(long, default_value_t = 256)]
    nbd_connections_max: usize,
    /// READ/WRITE payload one NBD connection may have in flight before the server stops reading
    /// its requests (back-pressure).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    nbd_connection_in_flight_bytes_max: u64,
    /// READ/WRITE payload all NBD connections together may have in flight: with the idle
    /// buffers, the bound on the memory clients can make the daemon hold.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    nbd_in_flight_bytes_max: u64,
    /// Request buffers kept for reuse when idle; the rest goes back to the kernel.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    nbd_idle_buffers_bytes_max: u64,
    /// Seconds a client has for the whole NBD handshake, however slowly it sends.
    #[arg(long, default_value_t = 10)]
    nbd_handshake_timeout_secs: u64,
    /// Seconds a reply may wait for a client that reads nothing before the connection is
    /// dropped and its buffers freed.
    #[arg(long, default_value_t = 30)]
    nbd_reply_stall_timeout_secs: u64,
    /// Microseconds a connection polls its socket for the next request before it sleeps
    /// (hybrid polling, at most 1000). It saves the wake-up of an idle core per request, most
    /// of a QD 1 round trip on a virtual machine, and costs that core's time between
    /// requests: up to one core per busy connection. 0 (the default): never poll.
    #[arg(long, default_value_t = 0)]
    nbd_poll_us: u64,
    /// Threads per NBD connection that take turns reading its requests (1 to 64): up to this
    /// many of a connection's requests that are slow to serve in place (large reads from
    /// memory drives on the Fast Path) are served at once. Each costs a thread per connection.
    /// Default 16, as nbdkit's threads.
    #[arg(long, default_value_t = 16)]
    nbd_readers: usize,
    /// When a reader hands the socket to the next before it serves the request that emptied
    /// it. `when-slow`: only while requests have recently taken over 50 us to hand to the VD (a
    /// large copy out of a memory drive), so that others are served meanwhile; a request that
    /// arrives alone then costs one thread wake-up, not three. `always`: before every such
    /// request, as nbdkit's threads do, so that another reader already waits in `recv` when the
    /// reply goes out (on some virtual machines a thread woken where it slept costs tens of
    /// microseconds). `auto` (the default): as `when-slow`, and also while handing over has
    /// been measured to shorten the round trip of a client that waits for each reply (a
    /// connection measures both ways from its first request, for about 3 s at queue depth 1,
    /// and again every 2^20 requests; one whose client keeps requests in flight or sends at its
    /// own pace stops measuring after 1,024 requests and keeps the turn).
    #[arg(long, value_enum, default_value_t = HandOverArg::Auto)]
    nbd_hand_over: HandOverArg,
}

/// `--nbd-hand-over`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HandOverArg {
    Auto,
    WhenSlow,
    Always,
}

impl From<HandOverArg> for nbd::HandOver {
    fn from(arg: HandOverArg) -> nbd::HandOver {
        match arg {
            HandOverArg::Auto => nbd::HandOver::AUTO,
            HandOverArg::WhenSlow => nbd::HandOver::WHEN_SLOW,
            HandOverArg::Always => nbd::HandOver::Always,
        }
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    drive::parse_size_bytes(text)
}

impl NbdLimitArgs {
    /// Bytes of request buffers the pool keeps idle.
    pub fn idle_buffers_bytes_max(&self) -> usize {
        self.nbd_idle_buffers_bytes_max as usize
    }

    /// The server's configuration, with `connections_max` lowered to what the descriptor limit
    /// (after raising the soft limit to the hard one) and the thread limits hold; prints the
    /// effective bounds. With `tls`, a connection may hold a TLS relay: more descriptors and
    /// threads each.
    pub fn server_config(&self, tls: bool) -> Result<nbd::ServerConfig, String> {
        let mut config = nbd::ServerConfig {
            connections_max: self.nbd_connections_max,
            payload_in_flight_bytes_max: self.nbd_connection_in_flight_bytes_max as usize,
            payload_in_flight_bytes_total_max: self.nbd_in_flight_bytes_max as usize,
            handshake_timeout: Duration::from_secs(self.nbd_handshake_timeout_secs),
            reply_stall_timeout: Duration::from_secs(self.nbd_reply_stall_timeout_secs),
            poll_budget: Duration::from_micros(self.nbd_poll_us),
            readers_per_connection: self.nbd_readers,
            hand_over: self.nbd_hand_over.into(),
            ..nbd::ServerConfig::default()
        };
        config.check().map_err(|e| format!("NBD bounds: {}", flag_names(&e.to_string())))?;
        let per_connection = PerConnection::new(tls, self.nbd_readers);
        let by_descriptors = descriptor_fit(per_connection)?;
        let by_threads = thread_fit(per_connection, thread_budget::thread_room())?;
        let mut lowered_by = None;
        for fit in [Some(by_descriptors), by_threads].into_iter().flatten() {
            if fit.connections < config.connections_max {
                config.connections_max = fit.connections;
                lowered_by = Some(fit.why);
            }
        }
        if let Some(why) = lowered_by {
            println!("NBD connections lowered from {} to {}: {why}", self.nbd_connections_max, config.connections_max);
        }
        self.print(&config, per_connection);
        Ok(config)
    }

    fn print(&self, config: &nbd::ServerConfig, per_connection: PerConnection) {
        let mib = |bytes: usize| bytes >> 20;
        println!(
            "NBD bounds: {} connections ({} descriptor(s) and {} threads each), {} MiB in flight per connection, {} MiB in total, \
             {} MiB idle buffers, handshake {} s, reply stall {} s, poll {} us",
            config.connections_max,
            per_connection.descriptors,
            per_connection.threads,
            mib(config.payload_in_flight_bytes_max),
            mib(config.payload_in_flight_bytes_total_max),
            mib(self.idle_buffers_bytes_max()),
            config.handshake_timeout.as_secs(),
            config.reply_stall_timeout.as_secs(),
            config.poll_budget.as_micros()
        );
    }
}

/// Connections one limit holds, and what to say if it is the one that lowers the limit.
struct Fit {
    connections: usize,
    why: String,
}

/// Connections the descriptor limit holds (after raising the soft limit to the hard one);
/// an error if it holds none.
fn descriptor_fit(per_connection: PerConnection) -> Result<Fit, String> {
    let descriptors_max = raise_descriptor_limit()?;
    let descriptors_open = open_descriptor_count()?;
    let connections = connections_within(descriptors_max, descriptors_open, per_connection.descriptors);
    if connections == 0 {
        return Err(format!(
            "the descriptor limit ({descriptors_max}, {descriptors_open} open) leaves no room for NBD connections after the \
             {DESCRIPTORS_RESERVED_COUNT} reserved for the API; allowed: a limit of at least {} (ulimit -n)",
            descriptors_open + DESCRIPTORS_RESERVED_COUNT + per_connection.descriptors as u64
        ));
    }
    let why = format!(
        "the descriptor limit is {descriptors_max}, {descriptors_open} are open and {DESCRIPTORS_RESERVED_COUNT} reserved for \
         the management API"
    );
    Ok(Fit { connections, why })
}

/// Connections the tightest thread limit holds, if any could be read; an error if it holds
/// none.
fn thread_fit(per_connection: PerConnection, room: Option<thread_budget::ThreadRoom>) -> Result<Option<Fit>, String> {
    let Some(room) = room else { return Ok(None) };
    let threads = per_connection.threads;
    let reserved = threads_reserved(room.threads);
    let connections = usize::try_from((room.threads - reserved) / threads as u64).unwrap_or(usize::MAX);
    let held = format!("a connection holds {threads} threads ({} of them request readers: --nbd-readers)", per_connection.readers);
    if connections == 0 {
        return Err(format!(
            "{} leaves room for {} more threads, too few for one NBD connection beside the rest of the daemon: {held}; allowed: \
             room for at least {} threads, or fewer --nbd-readers (to make room, {})",
            room.limit,
            room.threads,
            2 * threads,
            room.remedy
        ));
    }
    let why = format!(
        "{held}, and {} leaves room for {} more threads, {reserved} of them kept for the rest of the daemon",
        room.limit, room.threads
    );
    Ok(Some(Fit { connections, why }))
}

/// What one NBD connection holds at most.
#[derive(Clone, Copy)]
struct PerConnection {
    descriptors: usize,
    threads: usize,
    readers: usize,
}

impl PerConnection {
    fn new(tls: bool, readers: usize) -> PerConnection {
        let descriptors = if tls { nbd::TLS_DESCRIPTORS_PER_CONNECTION } else { nbd::DESCRIPTORS_PER_CONNECTION };
        let threads = nbd::ServerConfig { readers_per_connection: readers, ..nbd::ServerConfig::default() }.threads_per_connection(tls);
        PerConnection { descriptors, threads, readers }
    }
}

/// Threads of `room_threads` kept for the rest of the daemon ([`THREADS_RESERVED_COUNT`]).
fn threads_reserved(room_threads: u64) -> u64 {
    THREADS_RESERVED_COUNT.min(room_threads / 2)
}

/// Connections that fit in the descriptors left after those open and those reserved.
fn connections_within(descriptors_max: u64, descriptors_open: u64, per_connection: usize) -> usize {
    let free = descriptors_max.saturating_sub(descriptors_open + DESCRIPTORS_RESERVED_COUNT);
    usize::try_from(free / per_connection as u64).unwrap_or(usize::MAX)
}

/// `ServerConfig`'s field names in an error, as the flags a user gave.
fn flag_names(message: &str) -> String {
    [
        ("payload_in_flight_bytes_total_max", "--nbd-in-flight-bytes-max"),
        ("payload_in_flight_bytes_max", "--nbd-connection-in-flight-bytes-max"),
        ("connections_max", "--nbd-connections-max"),
        ("handshake_timeout", "--nbd-handshake-timeout-secs"),
        ("reply_stall_timeout", "--nbd-reply-stall-timeout-secs"),
        ("poll_budget", "--nbd-poll-us"),
        ("readers_per_connection", "--nbd-readers"),
    ]
    .iter()
    .fold(message.to_string(), |text, (field, flag)| text.replace(field, flag))
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (the soft default of 1024 is a relic of
/// select(2), which storc does not use); returns the limit now in force.
fn raise_descriptor_limit() -> Result<u64, String> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we pass, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error()));
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            eprintln!("storc: cannot raise the descriptor limit to {}: {}", limit.rlim_max, std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

fn open_descriptor_count() -> Result<u64, String> {
    let entries = std::fs::read_dir("/proc/self/fd").map_err(|e| format!("cannot count open descriptors in /proc/self/fd: {e}"))?;
    Ok(entries.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        limits: NbdLimitArgs,
    }

    #[test]
    fn flag_defaults_are_the_servers_defaults() {
        let flags = Flags::parse_from(["storc"]).limits;
        let defaults = nbd::ServerConfig::default();
        assert_eq!(flags.nbd_connections_max, defaults.connections_max);
        assert_eq!(flags.nbd_connection_in_flight_bytes_max as usize, defaults.payload_in_flight_bytes_max);
        assert_eq!(flags.nbd_in_flight_bytes_max as usize, defaults.payload_in_flight_bytes_total_max);
        assert_eq!(Duration::from_secs(flags.nbd_handshake_timeout_secs), defaults.handshake_timeout);
        assert_eq!(Duration::from_secs(flags.nbd_reply_stall_timeout_secs), defaults.reply_stall_timeout);
        assert_eq!(Duration::from_micros(flags.nbd_poll_us), defaults.poll_budget);
        assert_eq!(flags.nbd_readers, defaults.readers_per_connection);
        assert_eq!(nbd::HandOver::from(flags.nbd_hand_over), defaults.hand_over);
    }

    #[test]
    fn an_unknown_hand_over_is_refused_with_the_allowed_ones() {
        let error = Flags::try_parse_from(["storc", "--nbd-hand-over", "never"]).unwrap_err().to_string();
        assert!(error.contains("'never'") && error.contains("auto, when-slow, always"), "{error}");
        let always = Flags::parse_from(["storc", "--nbd-hand-over", "always"]).limits;
        assert_eq!(nbd::HandOver::from(always.nbd_hand_over), nbd::HandOver::Always);
    }

    #[test]
    fn connections_fit_in_the_descriptors_left_after_the_reserve() {
        assert_eq!(connections_within(1024, 40, 1), 1024 - 40 - DESCRIPTORS_RESERVED_COUNT as usize);
        assert_eq!(connections_within(1024, 40, 3), (1024 - 40 - DESCRIPTORS_RESERVED_COUNT as usize) / 3);
        assert_eq!(connections_within(100, 40, 1), 0);
    }

    #[test]
    fn connections_fit_in_the_threads_left_after_the_reserve() {
        let room = |threads: u64| thread_budget::ThreadRoom {
            threads,
            limit: "the pids cgroup /t (pids.max 9, 0 in use)".into(),
            remedy: "raise it",
        };
        let per_connection = PerConnection::new(false, 16);
        assert_eq!(per_connection.threads, 17);
        let fit = thread_fit(per_connection, Some(room(600))).unwrap().unwrap();
        assert_eq!(fit.connections, (600 - 256) / 17);
        assert_eq!(
            fit.why,
            "a connection holds 17 threads (16 of them request readers: --nbd-readers), and the pids cgroup /t (pids.max 9, 0 in \
             use) leaves room for 600 more threads, 256 of them kept for the rest of the daemon"
        );
        // A small room keeps half of itself: a few connections still fit.
        let fit = thread_fit(per_connection, Some(room(120))).unwrap().unwrap();
        assert_eq!(fit.connections, 60 / 17);
        assert!(fit.why.ends_with("leaves room for 120 more threads, 60 of them kept for the rest of the daemon"), "{}", fit.why);
        assert!(thread_fit(per_connection, None).unwrap().is_none(), "no limit read: no lowering");
    }

    #[test]
    fn too_little_room_for_one_connection_is_refused_with_what_would_do() {
        let room = thread_budget::ThreadRoom {
            threads: 30,
            limit: "the user's process limit (ulimit -u 60, 30 threads of uid 1000 running)".into(),
            remedy: "raise ulimit -u (LimitNPROC= for a systemd unit)",
        };
        let error = thread_fit(PerConnection::new(true, 16), Some(room)).err().unwrap();
        assert_eq!(
            error,
            "the user's process limit (ulimit -u 60, 30 threads of uid 1000 running) leaves room for 30 more threads, too few for \
             one NBD connection beside the rest of the daemon: a connection holds 18 threads (16 of them request readers: \
             --nbd-readers); allowed: room for at least 36 threads, or fewer --nbd-readers (to make room, raise ulimit -u \
             (LimitNPROC= for a systemd unit))"
        );
    }

    #[test]
    fn config_errors_name_the_flag() {
        let flags = Flags::parse_from(["storc", "--nbd-in-flight-bytes-max", "1MiB"]).limits;
        let error = flags.server_config(false).unwrap_err();
        assert!(error.starts_with("NBD bounds: --nbd-in-flight-bytes-max is 1048576; allowed: at least"), "{error}");
    }

    #[test]
    fn a_reader_count_out_of_range_names_the_flag_and_what_is_allowed() {
        for readers in ["0", "65"] {
            let flags = Flags::parse_from(["storc", "--nbd-readers", readers]).limits;
            let error = flags.server_config(false).unwrap_err();
            assert_eq!(error, format!("NBD bounds: --nbd-readers is {readers}; allowed: 1 to 64"));
        }
    }
}
