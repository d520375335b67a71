//! The transmission phase of one connection: its reader threads take turns reading requests
//! and submitting them to the device without waiting (see [`take_turns`]: while submissions
//! are quick one reader keeps the turn; once they are slow, the turn passes before each). A
//! reply is sent by the thread that completes it (the reader for a device that served the
//! request in place, a device thread otherwise) while the writer thread has nothing queued:
//! handing it over would cost a thread wake-up and a context switch, most of a small request's
//! time. It is sent without
//! blocking, the lock and the socket both only tried: what the socket does not take, and every
//! reply that finds the writer busy, goes to the writer thread, the rest of a reply first in
//! line. So no thread ever waits on a client that is not reading (the client may be blocked
//! sending the requests the readers should read, and a device's thread serves other clients).
//! While the reading buffer holds the next request's header, replies gather in a cork and go
//! out in one `sendmsg` before a reader may block (`replies.rs`): one system call, and one
//! wake-up of the client, per burst instead of per request. A reader that keeps the turn serves
//! the burst's last request with the cork still open, then reads without waiting: requests that
//! arrived meanwhile extend the burst, and only when none did does the cork go out.
//!
//! Every request holds a [`Credit`] from submission until its reply is on the wire (or
//! abandoned because the client is gone). Credits are bounded per connection and, for payload
//! bytes, across the server, so clients cannot make the server hold unbounded memory; a
//! `Credit` is released on drop, so no path (error, disconnect, a device that drops a
//! callback, a reply writer that gave up on a client that does not read) can leak one.

use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use super::in_flight::{Credit, InFlight};
use super::pace::{DispatchPace, HandOver};
use super::replies::{Outcome, Replies, Reply};
use super::request_check::check_request;
use super::round_trips::RoundTrips;
use super::{ConnectionError, CONNECTION_THREAD_STACK_BYTES};
use crate::device::{BlockDevice, Done, IoError};
use crate::proto::{self, Command, ProtoError, Request};
use crate::socket::{DeadlineSocket, Socket};

/// What the handshake hands to the transmission phase.
pub(crate) struct Session {
    /// May already hold bytes the client pipelined after its GO.
    pub(crate) reader: BufReader<DeadlineSocket>,
    pub(crate) socket: Socket,
    pub(crate) structured_replies: bool,
    pub(crate) limits: RequestLimits,
    pub(crate) in_flight: Arc<InFlight>,
    /// Set by the reply writer when it gives up on the client (gone, or stalled), so that the
    /// reader stops too instead of serving requests still queued in the socket for nobody.
    pub(crate) client_gone: Arc<AtomicBool>,
    /// Threads that take turns reading requests ([`super::ServerConfig::readers_per_connection`]).
    pub(crate) readers: usize,
    pub(crate) hand_over: HandOver,
    /// With [`HandOver::Auto`]: which way of taking turns serves this connection's client faster.
    pub(crate) round_trips: Option<RoundTrips>,
    /// The server's count of replies and of the socket writes that carried them.
    pub(crate) reply_counts: Arc<super::replies::ReplyCounts>,
}

/// What a request is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestLimits {
    pub(crate) size_bytes: u64,
    /// The advertised minimum block size: offsets and lengths must be multiples of it.
    pub(crate) block_size_bytes: u32,
    /// The advertised maximum block size.
    pub(crate) payload_max_bytes: u32,
    pub(crate) transmission_flags: u16,
}

/// Runs the transmission phase until the client disconnects or breaks the protocol, then
/// waits for every in-flight request to complete and its reply to be sent.
pub(crate) fn serve<D: BlockDevice>(device: Arc<D>, session: Session) -> Result<(), ConnectionError> {
    let (replies, writer) = Replies::start(&session.socket, session.structured_replies, &session.client_gone, &session.reply_counts)?;
    let readers = session.readers;
    let pace = DispatchPace::new(session.hand_over);
    let turn = Mutex::new(ReadingTurn { session, end: None });
    thread::scope(|scope| {
        // Without the readers that could not be spawned, the others read every request.
        let mut reliefs = Vec::with_capacity(readers.saturating_sub(1));
        let mut spawn_error = None;
        for _ in 1..readers {
            let spawned = thread::Builder::new()
                .name("nbd-conn".into())
                .stack_size(CONNECTION_THREAD_STACK_BYTES)
                .spawn_scoped(scope, || take_turns(&device, &turn, &replies, &pace));
            match spawned {
                Ok(relief) => reliefs.push(relief),
                Err(error) => spawn_error = Some(error),
            }
        }
        if let Some(error) = spawn_error {
            tracing::warn!(%error, started = reliefs.len() + 1, readers, "nbd: a connection runs with fewer request readers");
        }
        take_turns(&device, &turn, &replies, &pace);
        for relief in reliefs {
            if relief.join().is_err() {
                tracing::error!("nbd: request reader panicked");
            }
        }
    });
    replies.flush_cork();
    // The writer ends once this sender and every pending completion's sender are gone.
    drop(replies);
    if writer.join().is_err() {
        tracing::error!("nbd: reply writer panicked");
    }
    match turn.into_inner() {
        Ok(turn) => turn.end.unwrap_or(Ok(())),
        Err(_) => Err(io::Error::other("a request reader panicked").into()),
    }
}

/// The socket's reading side, taken in turn by a connection's reader threads.
struct ReadingTurn {
    session: Session,
    /// How reading ended, once it has: the other readers then stop too.
    end: Option<Result<(), ConnectionError>>,
}

/// One reader thread's loop: takes the reading side and serves the requests the socket holds.
/// Whether it hands the reading side over before it dispatches the request that emptied the
/// socket, so that another reader is already waiting in `recv` for the next one (the pattern of
/// nbdkit's worker threads), depends on how long dispatches take ([`DispatchPace`]):
///
/// - **Quick dispatches** (a memory member served in place, or a request handed to a shard):
///   the reader keeps the turn, dispatches, and reads again itself. No other reader is woken,
///   so a request that arrives alone costs one wake-up instead of three (this reader's, the next
///   reader's for its turn, and this one's again when it waits for the turn back). A request
///   that arrives meanwhile waits for at most one quick dispatch.
/// - **Slow dispatches** (a device that serves requests in place and takes long: a large copy
///   out of memory, a read that waits for a disk): once a few come close together, the turn is
///   handed over before each, so requests that arrived with it or arrive meanwhile are read and
///   served by other readers in parallel, up to `--nbd-readers` at a time. One slow dispatch now
///   and then is a reader preempted on a busy machine, not a slow device, and changes nothing:
///   counted as slow, it put the readers into hand-overs that woke each other and the client
///   and were preempted again (storc bench as the client: 1.6x the server CPU per request).
/// - **`HandOver::Always`**: the turn is handed over before the request that emptied the socket
///   only; requests already buffered are served in place, one after another.
/// - **`HandOver::Auto`** (the default): as `WhenSlow`, and as `Always` while that has been
///   measured on the connection to shorten the round trip of a client that waits for each
///   reply (`round_trips`: which is faster depends on the host, and takes about a second of
///   either to show).
///
/// Measured on this VM class (`bench/nbd-cpu`, RAID0 and RAID1 of memory drives, against
/// `nbdkit memory`), the reader that keeps the turn needed 0.61-0.68 of nbdkit's server CPU
/// per paced fio read where handing over needed 0.83-1.01, and its QD 1 read latency was
/// 0.70-0.72 of nbdkit's against 0.92-0.97 (before the burst's last reply joined the cork).
/// On two other hosts of the same class the opposite held for latency (a reader that blocked in
/// `recv` itself was woken on a halted vCPU: 55 us per QD 1 read against 27 us with the
/// hand-over, and 78-83 against 37-44), which is why `HandOver::Auto` measures it.
fn take_turns<D: BlockDevice>(device: &Arc<D>, turn: &Mutex<ReadingTurn>, replies: &Replies<D::Buf>, pace: &DispatchPace) {
    loop {
        // A reader that panicked while reading may have left the stream unframed: stop.
        let Ok(mut reading) = turn.lock() else { return };
        if reading.end.is_some() {
            return;
        }
        // Requests the reader keeps the turn for are dispatched inside; the one it returns is
        // dispatched after the turn has passed to another reader.
        match read_requests(device, &mut reading.session, replies, pace) {
            Ok(Some(last)) => {
                drop(reading);
                pace.timed(|| dispatch(device, replies, last));
            }
            Ok(None) => {
                reading.end = Some(Ok(()));
                return;
            }
            Err(error) => {
                reading.end = Some(Err(error));
                return;
            }
        }
    }
}

// ---- Reading requests ------------------------------------------------------------------------

/// Reads and dispatches requests while the reader keeps the turn; returns, received but not
/// dispatched, the first before which the turn passes (one that emptied the buffer, while
/// [`hands_over`] says so, or any while dispatches are slow); or `None` once the client is done.
fn read_requests<D: BlockDevice>(
    device: &Arc<D>,
    session: &mut Session,
    replies: &Replies<D::Buf>,
    pace: &DispatchPace,
) -> Result<Option<ReceivedRequest<D::Buf>>, ConnectionError> {
    let mut header = [0u8; proto::REQUEST_HEADER_BYTES];
    loop {
        check_client_taking_replies(session)?;
        // Replies gather while the next request is already here; they go out before a read
        // that may block.
        let in_burst = session.reader.buffer().len() >= proto::REQUEST_HEADER_BYTES;
        if in_burst {
            replies.open_cork();
        } else {
            replies.flush_cork();
            let sleep_in_poll = session.round_trips.as_ref().is_some_and(|trips| !trips.client_waits());
            session.reader.get_mut().set_sleep_in_poll(sleep_in_poll);
        }
        if !read_header(&mut session.reader, &mut header)? {
            return Ok(None); // The client closed between requests.
        }
        if let Some(round_trips) = &mut session.round_trips {
            round_trips.arrived(!in_burst, || (Instant::now(), session.in_flight.is_idle()));
        }
        let request = match proto::parse_request(&header) {
            Ok(request) => request,
            Err(error @ ProtoError::UnknownCommand { cookie, .. }) => {
                // The spec: answer an unknown command with EINVAL and carry on.
                let credit = acquire(session, replies, 0);
                send_failure(replies, cookie, false, credit, IoError::Invalid, error.to_string());
                continue;
            }
            // A bad magic means we have lost the framing: nothing after it can be trusted.
            Err(error) => return Err(ConnectionError::Protocol(error.to_string())),
        };
        if request.command == Command::Disc {
            return Ok(None); // In-flight replies are still sent before the socket closes.
        }
        // The read that brought this header may have brought the next request too: then this
        // reply joins the cork and goes out with the next one's, in one `sendmsg`, where the
        // check above (made before that read) would have sent it alone.
        if next_header_buffered(&session.reader, &request) {
            replies.open_cork();
        }
        let Some(received) = handle_request(device, session, replies, request)? else { continue };
        if session.reader.buffer().len() >= proto::REQUEST_HEADER_BYTES && !pace.slow() {
            pace.timed(|| dispatch(device, replies, received));
            continue;
        }
        if !hands_over(pace, session) {
            // The burst's last request, kept: its reply, if the device answers in place, joins
            // the cork and the burst's replies go out in one `sendmsg` before the next read
            // (which may block), instead of two.
            // A request that came alone skips the read that does not wait: its client (at QD 1)
            // sends nothing more before this reply, so the read would only delay it.
            replies.open_cork();
            pace.timed(|| dispatch(device, replies, received));
            if !(in_burst && refill_now(&mut session.reader)?) {
                replies.flush_cork();
            }
            continue;
        }
        // The next read may block, or the dispatch may take long (then another reader serves
        // the requests already buffered meanwhile): what the cork holds goes now, and this
        // request is dispatched by the caller.
        replies.flush_cork();
        return Ok(Some(received));
    }
}

/// Whether the reader hands the turn over before it dispatches the request that emptied the
/// socket.
fn hands_over(pace: &DispatchPace, session: &Session) -> bool {
    pace.hands_over() || session.round_trips.as_ref().is_some_and(RoundTrips::hands_over)
}

/// Whether the reader's buffer holds, past `request`'s payload, the next request's header: the
/// reader will not block before it has served both.
fn next_header_buffered(reader: &BufReader<DeadlineSocket>, request: &Request) -> bool {
    let payload_bytes = if request.command == Command::Write { request.len_bytes as usize } else { 0 };
    reader.buffer().len() >= payload_bytes.saturating_add(proto::REQUEST_HEADER_BYTES)
}

/// Whether the stream has more bytes now: the reading buffer's, or what a read that does not
/// wait finds in the socket (requests that arrived while the last was served, whose replies
/// can then join the cork).
fn refill_now(reader: &mut BufReader<DeadlineSocket>) -> io::Result<bool> {
    if !reader.buffer().is_empty() {
        return Ok(true);
    }
    reader.get_mut().set_dont_wait(true);
    let filled = reader.fill_buf().map(|bytes| !bytes.is_empty());
    reader.get_mut().set_dont_wait(false);
    match filled {
        Ok(filled) => Ok(filled),
        Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(false),
        Err(error) => Err(error),
    }
}

fn check_client_taking_replies(session: &Session) -> Result<(), ConnectionError> {
    if session.client_gone.load(Ordering::SeqCst) {
        return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the client stopped taking replies").into());
    }
    Ok(())
}

/// Fills `header`; `Ok(false)` if the stream ended cleanly before its first byte.
fn read_header(reader: &mut impl Read, header: &mut [u8]) -> io::Result<bool> {
    let mut filled_bytes = 0;
    while filled_bytes < header.len() {
        match reader.read(&mut header[filled_bytes..]) {
            Ok(0) if filled_bytes == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read_bytes) => filled_bytes += read_bytes,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

fn handle_request<D: BlockDevice>(
    device: &Arc<D>,
    session: &mut Session,
    replies: &Replies<D::Buf>,
    request: Request,
) -> Result<Option<ReceivedRequest<D::Buf>>, ConnectionError> {
    let is_read = request.command == Command::Read;
    if let Err(rejection) = check_request(&request, &session.limits) {
        let credit = acquire(session, replies, 0);
        send_failure(replies, request.cookie, is_read, credit, rejection.error, rejection.message);
        if request.command == Command::Write {
            replies.flush_cork();
            skip_payload(session, &request)?;
        }
        return Ok(None);
    }
    let credit = acquire(session, replies, payload_bytes(&request));
    // The payload's read may block. A client sends a small payload right behind its header
    // without waiting for any reply, so the corked replies wait for it only as long as its
    // bytes take to arrive; a large one may take long and is read with the cork sent.
    let missing_payload_bytes = (request.len_bytes as usize).saturating_sub(session.reader.buffer().len());
    if request.command == Command::Write && missing_payload_bytes > ONE_WAKE_PAYLOAD_MAX_BYTES {
        replies.flush_cork();
    }
    // The wait for credit may have been long: the client may have gone meanwhile.
    check_client_taking_replies(session)?;
    Ok(Some(receive_payload(&**device, &mut session.reader, request, credit)?))
}

/// A credit for a request: at once if one is free, else after sending the corked replies,
/// which hold credits and which the client may be waiting for.
fn acquire<B: AsRef<[u8]> + Send + 'static>(session: &Session, replies: &Replies<B>, payload_bytes: usize) -> Credit {
    session.in_flight.try_acquire(payload_bytes).unwrap_or_else(|| {
        replies.flush_cork();
        session.in_flight.acquire(payload_bytes)
    })
}

/// Reads past the payload of a rejected WRITE to keep the stream framed, unless it is too long
/// to be honest (the spec allows a hard disconnect then).
fn skip_payload(session: &mut Session, request: &Request) -> Result<(), ConnectionError> {
    if request.len_bytes > session.limits.payload_max_bytes {
        return Err(ConnectionError::Protocol(format!(
            "WRITE payload of {} bytes exceeds the maximum of {} bytes",
            request.len_bytes, session.limits.payload_max_bytes
        )));
    }
    let mut payload = (&mut session.reader).take(u64::from(request.len_bytes));
    let skipped_bytes = io::copy(&mut payload, &mut io::sink())?;
    if skipped_bytes != u64::from(request.len_bytes) {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

/// Bytes of buffer a request holds while in flight.
fn payload_bytes(request: &Request) -> usize {
    match request.command {
        Command::Read | Command::Write => request.len_bytes as usize,
        Command::WriteZeroes if request.has_flag(proto::NBD_CMD_FLAG_NO_HOLE) => request.len_bytes as usize,
        _ => 0,
    }
}

/// A checked request, with its credit and, for a WRITE, its payload: ready for the device.
struct ReceivedRequest<B> {
    request: Request,
    credit: Credit,
    payload: Option<B>,
}

/// Reads a WRITE's payload into a buffer of the device's; other requests carry none.
fn receive_payload<D: BlockDevice>(
    device: &D,
    reader: &mut BufReader<DeadlineSocket>,
    request: Request,
    credit: Credit,
) -> io::Result<ReceivedRequest<D::Buf>> {
    let payload = match request.command {
        Command::Write if request.len_bytes > 0 => {
            let mut buf = alloc(device, request.len_bytes as usize);
            read_payload(reader, buf.as_mut())?;
            Some(buf)
        }
        _ => None,
    };
    Ok(ReceivedRequest { request, credit, payload })
}

/// Hands a received request to the device. Returns once it is submitted, not completed.
fn dispatch<D: BlockDevice>(device: &Arc<D>, replies: &Replies<D::Buf>, received: ReceivedRequest<D::Buf>) {
    let ReceivedRequest { request, credit, payload } = received;
    let fua = request.has_flag(proto::NBD_CMD_FLAG_FUA);
    let len_bytes = request.len_bytes as usize;
    if len_bytes == 0 && request.command != Command::Flush {
        // The spec leaves zero-length requests unspecified; succeeding without I/O is harmless.
        replies.send(Reply { cookie: request.cookie, is_read: request.command == Command::Read, outcome: Outcome::Done, _credit: credit });
        return;
    }
    match request.command {
        Command::Read => {
            let buf = alloc(&**device, len_bytes);
            device.read(request.offset, buf, read_done(replies, request, credit));
        }
        Command::Write => {
            let buf = payload.expect("a WRITE is read with its payload");
            device.write(request.offset, buf, fua, done(replies, request, credit));
        }
        Command::WriteZeroes if request.has_flag(proto::NBD_CMD_FLAG_NO_HOLE) => {
            // The device's write_zeroes may deallocate; a write of zeros stays provisioned.
            let mut buf = alloc(&**device, len_bytes);
            buf.as_mut().fill(0);
            device.write(request.offset, buf, fua, done(replies, request, credit));
        }
        Command::WriteZeroes => {
            let len_bytes = u64::from(request.len_bytes);
            device.write_zeroes(request.offset, len_bytes, fua, done(replies, request, credit));
        }
        Command::Trim => {
            let done = done(replies, request, credit);
            // The device's trim has no FUA: a flush after it persists the deallocation.
            let done = if fua { flush_then(Arc::clone(device), done) } else { done };
            device.trim(request.offset, u64::from(request.len_bytes), done);
        }
        Command::Flush => device.flush(done(replies, request, credit)),
        Command::Disc => unreachable!("DISC ends the reader before submission"),
    }
}

/// The most of a WRITE's payload still to come that the reader waits for in one go (see
/// [`read_payload`]): small requests, whose two wake-ups would cost more than the request
/// itself. Well below any socket's receive buffer, so the bytes waited for always fit.
const ONE_WAKE_PAYLOAD_MAX_BYTES: usize = 32 << 10;

/// Reads a WRITE's payload. A client that sends the header and the data in two writes (libnbd
/// does) would wake the reader for the header alone, then again for the data: the rest of a
/// small payload is read straight into the payload by a read that returns only once all of it
/// is there (`DeadlineSocket::read_exact_in_one_wake`).
fn read_payload(reader: &mut BufReader<DeadlineSocket>, payload: &mut [u8]) -> io::Result<()> {
    let buffered_bytes = reader.buffer().len().min(payload.len());
    let missing_bytes = payload.len() - buffered_bytes;
    if missing_bytes <= 1 || missing_bytes > ONE_WAKE_PAYLOAD_MAX_BYTES {
        return reader.read_exact(payload);
    }
    payload[..buffered_bytes].copy_from_slice(&reader.buffer()[..buffered_bytes]);
    reader.consume(buffered_bytes);
    reader.get_mut().read_exact_in_one_wake(&mut payload[buffered_bytes..])
}

/// A completion that, on success, flushes the device before calling `done`.
fn flush_then<D: BlockDevice>(device: Arc<D>, done: Done) -> Done {
    Box::new(move |result| match result {
        Ok(()) => device.flush(done),
        Err(error) => done(Err(error)),
    })
}

fn alloc<D: BlockDevice>(device: &D, len_bytes: usize) -> D::Buf {
    let mut buf = device.alloc(len_bytes);
    assert_eq!(buf.as_mut().len(), len_bytes, "BlockDevice::alloc must return exactly the bytes asked for");
    buf
}

/// The completion of a READ: sends the filled buffer, or the error, to the writer.
fn read_done<B: AsRef<[u8]> + Send + 'static>(
    replies: &Replies<B>,
    request: Request,
    credit: Credit,
) -> Box<dyn FnOnce(Result<B, IoError>) + Send> {
    let replies = replies.clone();
    Box::new(move |result| {
        let outcome = match result {
            Ok(buf) => Outcome::Data { offset: request.offset, buf },
            Err(error) => Outcome::Failed { error, message: failure_message(&request, error) },
        };
        replies.send(Reply { cookie: request.cookie, is_read: true, outcome, _credit: credit });
    })
}

/// The completion of any request without reply data.
fn done<B: AsRef<[u8]> + Send + 'static>(replies: &Replies<B>, request: Request, credit: Credit) -> Done {
    let replies = replies.clone();
    Box::new(move |result| {
        let outcome = match result {
            Ok(()) => Outcome::Done,
            Err(error) => Outcome::Failed { error, message: failure_message(&request, error) },
        };
        replies.send(Reply { cookie: request.cookie, is_read: false, outcome, _credit: credit });
    })
}

fn failure_message(request: &Request, error: IoError) -> String {
    format!("{:?} of {} bytes at offset {}: {error}", request.command, request.len_bytes, request.offset)
}

fn send_failure<B: AsRef<[u8]> + Send + 'static>(
    replies: &Replies<B>,
    cookie: u64,
    is_read: bool,
    credit: Credit,
    error: IoError,
    message: String,
) {
    replies.send(Reply { cookie, is_read, outcome: Outcome::Failed { error, message }, _credit: credit });
}
