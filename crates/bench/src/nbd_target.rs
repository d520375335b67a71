//! An NBD export as a benchmark target, through `nbd::Client`.
//!
//! The client is blocking, so each connection is one thread that owns it: it takes requests
//! from a channel, pipelines them on the socket and runs each request's completion callback
//! itself. A closed-loop worker's next request is submitted from that callback, i.e. on the
//! same thread, so it goes out before the thread waits for the next reply: the connection keeps
//! the worker's queue depth in flight with no thread hop. Requests from other threads (the
//! open-loop pacer) must not wait for the next reply: while they keep coming, the thread sleeps
//! in `poll(2)` on the socket and an eventfd they signal, and sends them at once. Once none came
//! for [`FOREIGN_QUIET_REPLIES`] replies (a closed loop after its first requests) it blocks in
//! `read(2)` alone again, which saves a system call per reply (5-10% at 4 KiB).
//!
//! A read's data arrives in a buffer of the client's own; it is copied into the worker's buffer
//! only when the worker checks it (`--verify`). Otherwise nothing looks at it, and the copy
//! would be a second pass over every byte that no other client makes (fio's nbd engine reads
//! straight into its buffer): at 1 MiB reads it cost a quarter of the throughput.
//!
//! # No deadlock against the server
//! The blocking client cannot read replies while it writes a request. A server that stops
//! reading requests while its replies to us are unread (storc: past 128 requests or 64 MiB in
//! flight; nbdkit: once every worker thread is blocked writing a reply) would then wait for us
//! while we wait for it. So a connection sends a request only when that cannot happen:
//! - at most [`REQUESTS_IN_FLIGHT_MAX`] requests and [`PAYLOAD_IN_FLIGHT_BYTES_MAX`] bytes;
//! - while reads are in flight (their replies may be unread), at most
//!   [`MIXED_WRITE_BYTES_IN_FLIGHT_MAX`] bytes of writes: the socket buffers hold that much
//!   even if the server reads nothing, so writing it never blocks. Without reads in flight the
//!   server's replies are 16 bytes each and never stop it reading.
//!
//! One request is always allowed when nothing is in flight. A request that may not go yet waits
//! in the connection's queue (its latency still runs), and a worker whose queue depth would hit
//! these limits often gets several connections ([`connections_for`]); a completion's follow-up
//! request stays on its connection. Requests above the server's largest request are split into
//! pieces and complete when the last piece does.

use crate::spec::AccessSpec;
use crate::target::{IoDone, Target};
use drive::{IoBuf, ShardWaker};
use nbd::{Client, ClientConfig, NbdUri};
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Requests one connection keeps in flight; storc's server takes 128.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 128;
/// Payload bytes one connection keeps in flight; storc's server takes 64 MiB.
pub const PAYLOAD_IN_FLIGHT_BYTES_MAX: u64 = 32 << 20;
/// Write bytes in flight beside reads: well under what the socket buffers of a Unix socket
/// (208 KiB by default) or a loopback TCP connection (16 KiB send + 128 KiB receive) hold.
pub const MIXED_WRITE_BYTES_IN_FLIGHT_MAX: u64 = 64 << 10;
/// Replies after the last request from another thread before the connection stops watching
/// for more such requests while replies are due.
pub const FOREIGN_QUIET_REPLIES: u32 = 256;
/// The largest request sent when the server does not say (the NBD spec's usual maximum).
const REQUEST_BYTES_MAX_DEFAULT: u64 = 32 << 20;

static NEXT_CONNECTION_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The connection whose thread this is (0: none), so that a completion's follow-up request
    /// stays on the connection it came from.
    static CURRENT_CONNECTION: Cell<usize> = const { Cell::new(0) };
}

/// Connections one worker needs to keep `queue_depth` requests of `spec` in flight within the
/// limits of one connection (see the module docs).
pub fn connections_for(queue_depth: usize, spec: &AccessSpec) -> usize {
    let by_count = queue_depth.div_ceil(REQUESTS_IN_FLIGHT_MAX);
    let per_connection = (PAYLOAD_IN_FLIGHT_BYTES_MAX / spec.block_bytes_max()).max(1) as usize;
    let by_payload = queue_depth.div_ceil(per_connection);
    let lines = spec.lines();
    let mixed = lines.iter().any(|l| l.read_percent > 0) && lines.iter().any(|l| l.read_percent < 100);
    let by_mixed_writes = match mixed {
        true => {
            // Expected write bytes per request, in hundredths of a percent of a byte.
            let write_bytes_x10000: u64 = lines.iter().map(|l| u64::from(l.share_percent * (100 - l.read_percent)) * l.block_bytes).sum();
            let connections = (queue_depth as u64 * write_bytes_x10000).div_ceil(MIXED_WRITE_BYTES_IN_FLIGHT_MAX * 10_000);
            // One request per connection always goes.
            (connections as usize).min(queue_depth)
        }
        false => 1,
    };
    by_count.max(by_payload).max(by_mixed_writes).max(1)
}

/// One worker's connections to an export.
pub struct NbdTarget {
    uri: String,
    export_bytes: u64,
    connections: Vec<Connection>,
    next_connection: AtomicUsize,
    /// Whether reads copy their data into the worker's buffer (see the module docs).
    deliver_reads: Arc<AtomicBool>,
}

struct Connection {
    id: usize,
    sender: Option<Sender<Request>>,
    /// Wakes the connection's thread from `poll(2)` when another thread queued a request.
    waker: Arc<ShardWaker>,
    thread: Option<JoinHandle<()>>,
}

struct Request {
    /// Submitted by a thread other than the connection's own.
    foreign: bool,
    write: bool,
    offset_bytes: u64,
    buf: IoBuf,
    done: IoDone,
}

impl NbdTarget {
    /// Opens `connection_count` connections to the export `uri` names.
    ///
    /// # Errors
    /// The URI and what failed: connecting, or the handshake (e.g. an unknown export).
    pub fn connect(uri: &NbdUri, uri_text: &str, connection_count: usize) -> Result<NbdTarget, String> {
        let mut connections = Vec::with_capacity(connection_count);
        let mut export_bytes = 0;
        let deliver_reads = Arc::new(AtomicBool::new(true));
        for _ in 0..connection_count.max(1) {
            let client = Client::connect(uri, &ClientConfig::default()).map_err(|e| format!("--target {uri_text}: {e}"))?;
            export_bytes = client.export().size_bytes;
            let request_bytes_max = client.export().block_sizes.as_ref().map_or(REQUEST_BYTES_MAX_DEFAULT, |s| u64::from(s.max_bytes));
            let request_bytes_max = request_bytes_max.clamp(4096, REQUEST_BYTES_MAX_DEFAULT);
            let id = NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = mpsc::channel();
            let deliver_reads = Arc::clone(&deliver_reads);
            let waker = ShardWaker::new();
            let loop_waker = Arc::clone(&waker);
            let thread = std::thread::Builder::new()
                .name(format!("bench-nbd-{id}"))
                .spawn(move || {
                    CURRENT_CONNECTION.with(|c| c.set(id));
                    ConnectionLoop::new(client, receiver, loop_waker, request_bytes_max, deliver_reads).run();
                })
                .map_err(|e| format!("cannot start an NBD connection thread: {e}"))?;
            connections.push(Connection { id, sender: Some(sender), waker, thread: Some(thread) });
        }
        Ok(NbdTarget { uri: uri_text.to_string(), export_bytes, connections, next_connection: AtomicUsize::new(0), deliver_reads })
    }

    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// Whether completed reads hand their data to the worker (default: yes). Set only while no
    /// request is in flight.
    pub fn set_deliver_reads(&self, deliver: bool) {
        self.deliver_reads.store(deliver, Ordering::Relaxed);
    }

    fn pick_connection(&self) -> &Connection {
        let current = CURRENT_CONNECTION.with(Cell::get);
        if let Some(connection) = self.connections.iter().find(|c| c.id == current) {
            return connection;
        }
        &self.connections[self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len()]
    }
}

impl Target for NbdTarget {
    fn describe(&self) -> String {
        format!("NBD export {} ({} bytes)", self.uri, self.export_bytes)
    }

    fn capacity_bytes(&self) -> u64 {
        self.export_bytes
    }

    fn submit(&self, write: bool, offset_bytes: u64, buf: IoBuf, done: IoDone) {
        let connection = self.pick_connection();
        let foreign = CURRENT_CONNECTION.with(Cell::get) != connection.id;
        let request = Request { foreign, write, offset_bytes, buf, done };
        let sender = connection.sender.as_ref().expect("senders live until drop");
        if let Err(mpsc::SendError(request)) = sender.send(request) {
            return (request.done)(Err("the NBD connection thread has stopped".into()), request.buf);
        }
        // The connection's own thread is awake (it is running a completion); any other caller
        // may find it asleep in poll(2).
        if foreign {
            connection.waker.wake();
        }
    }
}

impl Drop for NbdTarget {
    /// Closes the channels; each thread finishes what is in flight, disconnects and ends. A
    /// connection's own thread (dropping the target from a completion) is left to end by itself.
    fn drop(&mut self) {
        for connection in &mut self.connections {
            connection.sender.take();
            connection.waker.wake();
        }
        let current = CURRENT_CONNECTION.with(Cell::get);
        for connection in &mut self.connections {
            if let Some(thread) = connection.thread.take().filter(|_| connection.id != current) {
                let _ = thread.join();
            }
        }
    }
}

/// A request on the wire, possibly in several pieces.
struct InFlight {
    request: Request,
    pieces_left: usize,
    error: Option<String>,
}

/// The thread that owns one client.
struct ConnectionLoop {
    client: Client,
    receiver: Receiver<Request>,
    waker: Arc<ShardWaker>,
    request_bytes_max: u64,
    deliver_reads: Arc<AtomicBool>,
    /// Arrived, waiting for room in flight.
    queued: VecDeque<Request>,
    in_flight: HashMap<u64, InFlight>,
    /// Cookie → (request id, offset of the piece in the request's buffer).
    pieces: HashMap<u64, (u64, usize)>,
    payload_bytes: u64,
    write_bytes: u64,
    /// Reads in flight (whole requests).
    read_count: usize,
    next_request_id: u64,
    /// Replies left before the connection stops watching for requests from other threads.
    foreign_watch_replies: u32,
    /// Set once the channel is closed: finish what is in flight, then stop.
    closing: bool,
    /// Set once the connection failed: every request fails at once with this.
    broken: Option<String>,
}

impl ConnectionLoop {
    fn new(
        client: Client,
        receiver: Receiver<Request>,
        waker: Arc<ShardWaker>,
        request_bytes_max: u64,
        deliver_reads: Arc<AtomicBool>,
    ) -> ConnectionLoop {
        ConnectionLoop {
            client,
            receiver,
            waker,
            request_bytes_max,
            deliver_reads,
            queued: VecDeque::new(),
            in_flight: HashMap::new(),
            pieces: HashMap::new(),
            payload_bytes: 0,
            write_bytes: 0,
            read_count: 0,
            next_request_id: 0,
            foreign_watch_replies: 0,
            closing: false,
            broken: None,
        }
    }

    fn run(mut self) {
        loop {
            self.take_arrived();
            self.send_queued();
            if self.pieces.is_empty() {
                if self.closing && self.queued.is_empty() {
                    break;
                }
                if self.queued.is_empty() {
                    match self.receiver.recv() {
                        Ok(request) => self.enqueue(request),
                        Err(_) => self.closing = true,
                    }
                }
                continue;
            }
            let watch = self.foreign_watch_replies > 0 && !self.client.reply_buffered();
            if watch && !self.sleep_until_reply_or_request() {
                continue;
            }
            match self.client.wait() {
                Ok(completion) => {
                    self.foreign_watch_replies = self.foreign_watch_replies.saturating_sub(1);
                    self.complete_piece(completion);
                }
                Err(error) => self.fail_all(format!("NBD connection failed: {error}")),
            }
        }
        let _ = self.client.disconnect();
    }

    /// Sends what is buffered and sleeps until a reply starts to arrive (true) or another thread
    /// queued a request or closed the channel (false).
    fn sleep_until_reply_or_request(&mut self) -> bool {
        if let Err(error) = self.client.send_submitted() {
            self.fail_all(format!("NBD connection failed: {error}"));
            return false;
        }
        self.waker.prepare_sleep();
        // A request queued before the flag was set found nobody to wake: look once more.
        match self.receiver.try_recv() {
            Ok(request) => {
                self.waker.cancel_sleep();
                self.enqueue(request);
                return false;
            }
            Err(TryRecvError::Disconnected) if !self.closing => {
                self.waker.cancel_sleep();
                self.closing = true;
                return false;
            }
            Err(_) => {}
        }
        let mut fds = [
            libc::pollfd { fd: self.client.socket_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.waker.fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two live pollfd entries; both descriptors stay open for the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        self.waker.cancel_sleep();
        if fds[1].revents != 0 {
            self.waker.drain();
        }
        // On a poll error (EINTR), read the socket: a blocking wait is always safe here.
        ready < 0 || fds[0].revents != 0
    }

    fn take_arrived(&mut self) {
        loop {
            match self.receiver.try_recv() {
                Ok(request) => self.enqueue(request),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.closing = true;
                    return;
                }
            }
        }
    }

    fn enqueue(&mut self, request: Request) {
        if request.foreign {
            self.foreign_watch_replies = FOREIGN_QUIET_REPLIES;
        }
        self.queued.push_back(request);
    }

    /// Sends queued requests while the connection has room; one request is always allowed
    /// when nothing is in flight, however large.
    fn send_queued(&mut self) {
        while let Some(front) = self.queued.front() {
            if let Some(error) = &self.broken {
                let request = self.queued.pop_front().expect("front exists");
                let error = error.clone();
                (request.done)(Err(error), request.buf);
                continue;
            }
            if !self.may_send(front.write, front.buf.len() as u64) && !self.in_flight.is_empty() {
                return;
            }
            let request = self.queued.pop_front().expect("front exists");
            if let Err(error) = self.send(request) {
                self.fail_all(format!("NBD connection failed: {error}"));
            }
        }
    }

    /// Whether a request fits the connection's limits now (see the module docs).
    fn may_send(&self, write: bool, len_bytes: u64) -> bool {
        let room = self.pieces.len() < REQUESTS_IN_FLIGHT_MAX && self.payload_bytes + len_bytes <= PAYLOAD_IN_FLIGHT_BYTES_MAX;
        let write_bytes_after = self.write_bytes + if write { len_bytes } else { 0 };
        room && (self.read_count == 0 || write_bytes_after <= MIXED_WRITE_BYTES_IN_FLIGHT_MAX)
    }

    fn send(&mut self, request: Request) -> Result<(), nbd::ClientError> {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let len = request.buf.len();
        let piece_bytes = self.request_bytes_max as usize;
        let piece_count = len.div_ceil(piece_bytes).max(1);
        self.payload_bytes += len as u64;
        match request.write {
            true => self.write_bytes += len as u64,
            false => self.read_count += 1,
        }
        let mut result = Ok(());
        let mut sent = 0;
        for piece in 0..piece_count {
            let start = piece * piece_bytes;
            let end = (start + piece_bytes).min(len);
            let offset = request.offset_bytes + start as u64;
            let cookie = match request.write {
                true => self.client.submit_write(offset, &request.buf.as_slice()[start..end], false),
                false => self.client.submit_read(offset, (end - start) as u32),
            };
            match cookie {
                Ok(cookie) => {
                    self.pieces.insert(cookie, (id, start));
                    sent += 1;
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        let error = result.as_ref().err().map(|e| format!("NBD connection failed: {e}"));
        self.in_flight.insert(id, InFlight { request, pieces_left: sent, error });
        if sent == 0 {
            self.finish(id);
        }
        result
    }

    fn complete_piece(&mut self, completion: nbd::Completion) {
        let Some((id, start)) = self.pieces.remove(&completion.cookie) else {
            return self.fail_all(format!("NBD server replied to unknown cookie {}", completion.cookie));
        };
        let in_flight = self.in_flight.get_mut(&id).expect("a piece belongs to a request in flight");
        match completion.result {
            Ok(data) if !in_flight.request.write && self.deliver_reads.load(Ordering::Relaxed) => {
                in_flight.request.buf.as_mut_slice()[start..start + data.len()].copy_from_slice(&data);
            }
            Ok(_) => {}
            Err(error) => {
                in_flight.error.get_or_insert_with(|| format!("NBD server error at offset {}: {error}", in_flight.request.offset_bytes));
            }
        }
        in_flight.pieces_left -= 1;
        if in_flight.pieces_left == 0 {
            self.finish(id);
        }
    }

    /// Completes a request whose pieces are all back; its callback may queue the next one.
    fn finish(&mut self, id: u64) {
        let in_flight = self.in_flight.remove(&id).expect("finished request is in flight");
        let len = in_flight.request.buf.len() as u64;
        self.payload_bytes -= len;
        match in_flight.request.write {
            true => self.write_bytes -= len,
            false => self.read_count -= 1,
        }
        let result = in_flight.error.map_or(Ok(()), Err);
        (in_flight.request.done)(result, in_flight.request.buf);
    }

    /// The connection is gone: every request in flight fails, and so will every later one.
    fn fail_all(&mut self, error: String) {
        self.broken.get_or_insert(error.clone());
        self.pieces.clear();
        let ids: Vec<u64> = self.in_flight.keys().copied().collect();
        for id in ids {
            if let Some(in_flight) = self.in_flight.get_mut(&id) {
                in_flight.error.get_or_insert_with(|| error.clone());
            }
            self.finish(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::AccessLine;

    #[test]
    fn connections_keep_each_within_the_limits() {
        let spec = |block_bytes: u64, read_percent: u32| AccessSpec::new(vec![AccessLine::whole(block_bytes, read_percent, 100)]).unwrap();
        let check = |queue_depth: usize, spec: AccessSpec, expected: usize| {
            assert_eq!(connections_for(queue_depth, &spec), expected, "QD {queue_depth} of {:?}", spec.lines());
        };
        check(1, spec(4096, 100), 1);
        check(128, spec(4096, 100), 1);
        check(256, spec(8192, 0), 2);
        check(64, spec(1 << 20, 100), 2);
        check(1, spec(64 << 20, 50), 1);
        check(4, spec(64 << 20, 100), 4);
        // 8 KiB at 67% reads: 2.7 KiB of writes per request, 64 KiB of them per connection.
        check(16, spec(8192, 67), 1);
        check(256, spec(8192, 67), 11);
    }
}
