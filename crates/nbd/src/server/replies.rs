//! A connection's replies: sent by the thread that completes a request while the writer thread
//! has nothing queued (see the transmission module), gathered into one write while the reader
//! serves requests it already holds (the cork), and otherwise written by the writer thread.

use std::io::{self, BufWriter, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread;

use super::in_flight::Credit;
use super::CONNECTION_THREAD_STACK_BYTES;
use crate::device::IoError;
use crate::proto;
use crate::socket::Socket;

/// A completed request on its way to the writer.
pub(crate) struct Reply<B> {
    pub(crate) cookie: u64,
    /// Reads must be answered with structured replies once negotiated, even errors.
    pub(crate) is_read: bool,
    pub(crate) outcome: Outcome<B>,
    /// Held until the reply is written, so the in-flight bound covers queued replies too.
    pub(crate) _credit: Credit,
}

pub(crate) enum Outcome<B> {
    /// Writes nothing of its own: wakes the writer for the tail of a reply sent in place.
    Tail,
    Done,
    Data {
        offset: u64,
        buf: B,
    },
    Failed {
        error: IoError,
        message: String,
    },
}

/// Replies sent and the socket writes that carried them, over every connection of a server
/// ([`crate::ServerStats`]): how well small replies are batched (a reply larger than what the
/// socket takes at once goes out in several writes).
#[derive(Default)]
pub(crate) struct ReplyCounts {
    pub(crate) replies: AtomicU64,
    pub(crate) writes: AtomicU64,
}

impl ReplyCounts {
    /// Runs `write`, one socket write carrying `replies` whole replies (none for the writer
    /// thread's, which counts them as they enter its buffer). Counted before the write and
    /// taken back if the socket took nothing, so that a client holding its replies finds them
    /// counted ([`crate::Server::stats`] after the last reply).
    fn write(&self, replies: usize, write: impl FnOnce() -> io::Result<usize>) -> io::Result<usize> {
        self.replies.fetch_add(replies as u64, Ordering::SeqCst);
        self.writes.fetch_add(1, Ordering::SeqCst);
        let written = write();
        if !written.as_ref().is_ok_and(|&written_bytes| written_bytes > 0) {
            self.replies.fetch_sub(replies as u64, Ordering::SeqCst);
            self.writes.fetch_sub(1, Ordering::SeqCst);
        }
        written
    }
}

/// The writer thread's socket: counts each write that took bytes.
struct CountedSocket {
    socket: Socket,
    counts: Arc<ReplyCounts>,
}

impl Write for CountedSocket {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let socket = &mut self.socket;
        self.counts.write(0, || socket.write(bytes))
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let socket = &mut self.socket;
        self.counts.write(0, || socket.write_vectored(bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
    }
}

/// Replies smaller than this are gathered into one write; larger payloads go straight out.
const REPLY_BUFFER_BYTES: usize = 64 << 10;

/// Where a connection's replies go: into the cork, to the writer thread, or onto the socket in
/// place.
pub(crate) struct Replies<B> {
    sender: Sender<Reply<B>>,
    out: Arc<ReplyOut>,
    cork: Arc<Mutex<Cork<B>>>,
}

impl<B> Clone for Replies<B> {
    fn clone(&self) -> Self {
        Replies { sender: self.sender.clone(), out: Arc::clone(&self.out), cork: Arc::clone(&self.cork) }
    }
}

/// Replies held back while the reader serves requests it already has, to go out in one
/// `sendmsg`. Open only while the reader will not block: it closes (and sends) the cork before
/// any read the buffer cannot satisfy and before any wait for credit, since corked replies hold
/// credits and a client may wait for them before sending more.
struct Cork<B> {
    open: bool,
    replies: Vec<Reply<B>>,
    bytes: usize,
}

/// What the cork did with a reply offered to it.
enum Corked<B> {
    Held,
    /// The cork was full: what it held, to go out now; the reply is held in its place.
    Full(Vec<Reply<B>>),
    Closed(Reply<B>),
}

/// A reply's header at most: a structured reply's offset-data chunk header.
const REPLY_HEAD_BYTES_MAX: usize = 32;

/// Most replies, and bytes, one cork holds: a batch the socket usually takes whole.
const CORK_REPLIES_MAX: usize = 32;
const CORK_BYTES_MAX: usize = 64 << 10;

impl<B: AsRef<[u8]> + Send + 'static> Replies<B> {
    /// The replies of `socket`, and the thread that writes those that cannot go out in place.
    pub(crate) fn start(
        socket: &Socket,
        structured_replies: bool,
        client_gone: &Arc<AtomicBool>,
        counts: &Arc<ReplyCounts>,
    ) -> io::Result<(Replies<B>, thread::JoinHandle<()>)> {
        let (sender, replies_rx) = mpsc::channel::<Reply<B>>();
        let out = Arc::new(ReplyOut {
            writer: Mutex::new(WriterState {
                stream: Some(BufWriter::with_capacity(
                    REPLY_BUFFER_BYTES,
                    CountedSocket { socket: socket.clone(), counts: Arc::clone(counts) },
                )),
                tail: Vec::new(),
            }),
            queued: AtomicUsize::new(0),
            socket: socket.clone(),
            structured_replies,
            client_gone: Arc::clone(client_gone),
            counts: Arc::clone(counts),
        });
        let cork = Arc::new(Mutex::new(Cork { open: false, replies: Vec::with_capacity(CORK_REPLIES_MAX), bytes: 0 }));
        let replies = Replies { sender, out: Arc::clone(&out), cork };
        let writer = thread::Builder::new()
            .name("nbd-writer".into())
            .stack_size(CONNECTION_THREAD_STACK_BYTES)
            .spawn(move || write_replies(&out, replies_rx))?;
        Ok((replies, writer))
    }

    /// Sends `reply`: into the cork while it is open (a full cork goes out first, and stays
    /// open), else in place if the writer is idle, else to the writer thread.
    pub(crate) fn send(&self, reply: Reply<B>) {
        let reply = match self.offer_to_cork(reply) {
            Corked::Held => return,
            Corked::Full(batch) => return self.send_batch(batch),
            Corked::Closed(reply) => reply,
        };
        self.send_uncorked(reply);
    }

    /// Sends `reply` in place if the writer is idle, else through the writer thread.
    fn send_uncorked(&self, reply: Reply<B>) {
        let reply = match self.out.write_in_place(reply) {
            InPlace::Sent => return,
            InPlace::Partly(wake) => wake,
            InPlace::NotNow(reply) => reply,
        };
        self.to_writer(reply);
    }

    fn offer_to_cork(&self, reply: Reply<B>) -> Corked<B> {
        let mut cork = self.cork.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bytes = reply.wire_bytes();
        if !cork.open || bytes > CORK_BYTES_MAX {
            return Corked::Closed(reply);
        }
        let full = cork.replies.len() >= CORK_REPLIES_MAX || cork.bytes + bytes > CORK_BYTES_MAX;
        // A full cork goes out now rather than after the burst (a long burst would hold its
        // first replies back while later ones went out), and `reply` starts the next batch.
        let batch = full.then(|| std::mem::replace(&mut cork.replies, Vec::with_capacity(CORK_REPLIES_MAX)));
        if full {
            cork.bytes = 0;
        }
        cork.bytes += bytes;
        cork.replies.push(reply);
        batch.map_or(Corked::Held, Corked::Full)
    }

    /// Lets replies gather: the reader has the next request's header in its buffer, so it
    /// will not block before its next [`Replies::flush_cork`].
    pub(crate) fn open_cork(&self) {
        self.cork.lock().unwrap_or_else(std::sync::PoisonError::into_inner).open = true;
    }

    /// Closes the cork and sends what it holds in one write (to the writer thread if the
    /// socket or the writer is busy). Called before the reader may block, and at its end.
    pub(crate) fn flush_cork(&self) {
        let batch = {
            let mut cork = self.cork.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !cork.open && cork.replies.is_empty() {
                return;
            }
            cork.open = false;
            cork.bytes = 0;
            std::mem::take(&mut cork.replies)
        };
        self.send_batch(batch);
    }

    /// Sends replies in one write if the socket and the writer are free, else through the writer.
    fn send_batch(&self, batch: Vec<Reply<B>>) {
        match batch.len() {
            0 => {}
            1 => batch.into_iter().for_each(|reply| self.send_uncorked(reply)),
            _ => match self.out.write_batch_in_place(batch) {
                BatchInPlace::Sent => {}
                BatchInPlace::Partly(wake) => self.to_writer(wake),
                BatchInPlace::NotNow(batch) => batch.into_iter().for_each(|reply| self.to_writer(reply)),
            },
        }
    }

    fn to_writer(&self, reply: Reply<B>) {
        self.out.queued.fetch_add(1, Ordering::SeqCst);
        // The writer outlives every sender, so this cannot fail; if it ever did, dropping the
        // reply still releases its credit.
        let _ = self.sender.send(reply);
    }
}

impl<B: AsRef<[u8]>> Reply<B> {
    /// Bytes this reply puts on the wire, about (an error's message is not counted).
    fn wire_bytes(&self) -> usize {
        let data_bytes = match &self.outcome {
            Outcome::Data { buf, .. } => buf.as_ref().len(),
            _ => 0,
        };
        REPLY_HEAD_BYTES_MAX + data_bytes
    }
}

/// The socket's writing side, shared by the writer thread and the reader's in-place replies.
struct ReplyOut {
    /// Held for each whole reply, so two never interleave.
    writer: Mutex<WriterState>,
    /// Replies sent to the writer thread and not yet written.
    queued: AtomicUsize,
    socket: Socket,
    structured_replies: bool,
    client_gone: Arc<AtomicBool>,
    counts: Arc<ReplyCounts>,
}

struct WriterState {
    /// `None` once the client was abandoned.
    stream: Option<BufWriter<CountedSocket>>,
    /// The rest of a reply the reader began in place: written before anything else.
    tail: Vec<u8>,
}

/// What became of a batch offered to [`ReplyOut::write_batch_in_place`].
enum BatchInPlace<B> {
    Sent,
    /// The socket took part of it; the rest is the writer's, which this empty reply wakes.
    Partly(Reply<B>),
    /// For the writer thread, each reply as it was.
    NotNow(Vec<Reply<B>>),
}

/// What became of a reply offered to [`ReplyOut::write_in_place`].
enum InPlace<B> {
    Sent,
    /// The socket took part of it; the rest is the writer's, which this empty reply wakes.
    Partly(Reply<B>),
    /// For the writer thread.
    NotNow(Reply<B>),
}

impl ReplyOut {
    /// Sends `reply` now, from the thread that completed it, if the writer has nothing queued
    /// or buffered and nobody else is writing; hands it back otherwise. Never blocks (neither
    /// the lock nor the socket): the caller may be a device's thread, which must not wait for
    /// a client.
    fn write_in_place<B: AsRef<[u8]>>(&self, reply: Reply<B>) -> InPlace<B> {
        let Some(mut writer) = self.idle_writer() else { return InPlace::NotNow(reply) };
        let (head, data) = reply_parts(&reply, self.structured_replies);
        let total_bytes = head.len() + data.len();
        if total_bytes > REPLY_BUFFER_BYTES {
            // A large reply gains little from the wake-up saved and would often go in part.
            return InPlace::NotNow(reply);
        }
        match self.counts.write(1, || send_now(&self.socket, &head, data)) {
            Ok(sent_bytes) if sent_bytes == total_bytes => InPlace::Sent,
            Ok(0) => InPlace::NotNow(reply),
            Ok(sent_bytes) => {
                let mut rest = head.get(sent_bytes..).unwrap_or_default().to_vec();
                rest.extend_from_slice(&data[sent_bytes.saturating_sub(head.len())..]);
                writer.tail = rest;
                InPlace::Partly(Reply { cookie: reply.cookie, is_read: false, outcome: Outcome::Tail, _credit: reply._credit })
            }
            Err(error) => {
                abandon(&mut writer, &self.socket, &self.client_gone, &error);
                InPlace::Sent
            }
        }
    }

    /// The writer's state, if nothing is queued for it or half written and nobody else holds
    /// it (tried, never waited for). An abandoned client's replies are left to the writer,
    /// which drops them and releases their credits.
    fn idle_writer(&self) -> Option<std::sync::MutexGuard<'_, WriterState>> {
        if self.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let writer = self.writer.try_lock().ok()?;
        let idle = writer.tail.is_empty() && writer.stream.as_ref().is_some_and(|stream| stream.buffer().is_empty());
        idle.then_some(writer)
    }

    /// [`ReplyOut::write_in_place`] for several replies in one `sendmsg`: a corked batch.
    fn write_batch_in_place<B: AsRef<[u8]>>(&self, mut batch: Vec<Reply<B>>) -> BatchInPlace<B> {
        let Some(mut writer) = self.idle_writer() else { return BatchInPlace::NotNow(batch) };
        let parts: Vec<(ReplyHead, &[u8])> = batch.iter().map(|reply| reply_parts(reply, self.structured_replies)).collect();
        let total_bytes: usize = parts.iter().map(|(head, data)| head.len() + data.len()).sum();
        let sent_bytes = match self.counts.write(batch.len(), || send_vectored_now(&self.socket, &parts)) {
            Ok(0) => {
                drop(parts);
                return BatchInPlace::NotNow(batch);
            }
            Ok(sent_bytes) => sent_bytes,
            Err(error) => {
                abandon(&mut writer, &self.socket, &self.client_gone, &error);
                return BatchInPlace::Sent;
            }
        };
        if sent_bytes == total_bytes {
            return BatchInPlace::Sent;
        }
        writer.tail = unsent_bytes(&parts, sent_bytes);
        drop(parts);
        // The tail is bounded by the cork's size: one credit stands for it.
        let last = batch.pop().expect("a batch holds two replies or more");
        BatchInPlace::Partly(Reply { cookie: last.cookie, is_read: false, outcome: Outcome::Tail, _credit: last._credit })
    }
}

/// The bytes of `parts` past the first `sent_bytes`.
fn unsent_bytes(parts: &[(ReplyHead, &[u8])], mut sent_bytes: usize) -> Vec<u8> {
    let mut rest = Vec::new();
    for piece in parts.iter().flat_map(|(head, data)| [&**head, *data]) {
        let skipped_bytes = sent_bytes.min(piece.len());
        sent_bytes -= skipped_bytes;
        rest.extend_from_slice(&piece[skipped_bytes..]);
    }
    rest
}

/// Sends what the socket takes at once of `parts`, in order; `Ok(0)` if it would block.
fn send_vectored_now(socket: &Socket, parts: &[(ReplyHead, &[u8])]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .flat_map(|(head, data)| [&**head, *data])
        .filter(|piece| !piece.is_empty())
        .map(|piece| libc::iovec { iov_base: piece.as_ptr() as *mut libc::c_void, iov_len: piece.len() })
        .collect();
    sendmsg_now(socket, &iov)
}

/// Sends what the socket takes at once of `head` then `data`; `Ok(0)` if it would block.
fn send_now(socket: &Socket, head: &[u8], data: &[u8]) -> io::Result<usize> {
    let iov = [
        libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
        libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() },
    ];
    sendmsg_now(socket, &iov[..if data.is_empty() { 1 } else { 2 }])
}

/// One non-blocking `sendmsg` of `iov` (at most `IOV_MAX` long); `Ok(0)` if it would block.
fn sendmsg_now(socket: &Socket, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid; it points at live iovecs over live buffers.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iov.as_ptr() as *mut libc::iovec;
    message.msg_iovlen = iov.len();
    loop {
        // SAFETY: sendmsg reads the buffers described above and nothing else.
        let sent = unsafe { libc::sendmsg(socket.raw_fd(), &message, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(error),
        }
    }
}

/// Sends replies in completion order, batching writes while more are queued. After a write
/// error it keeps draining so that every credit is released, then closes the socket.
fn write_replies<B: AsRef<[u8]>>(out: &ReplyOut, replies: Receiver<Reply<B>>) {
    while let Some(reply) = next_reply(&replies, out) {
        let mut writer = out.writer.lock().expect("reply writer lock");
        let state = &mut *writer;
        if let Some(stream) = state.stream.as_mut() {
            let tail = std::mem::take(&mut state.tail);
            // Counted as it goes into the buffer, before any byte of it can reach the client;
            // a tail's reply was counted when its first bytes went out in place.
            if !matches!(reply.outcome, Outcome::Tail) {
                out.counts.replies.fetch_add(1, Ordering::SeqCst);
            }
            if let Err(error) = stream.write_all(&tail).and_then(|()| write_reply(stream, &reply, out.structured_replies)) {
                abandon(&mut writer, &out.socket, &out.client_gone, &error);
            }
        }
        drop(writer);
        out.queued.fetch_sub(1, Ordering::SeqCst);
        drop(reply);
    }
    if let Some(stream) = out.writer.lock().expect("reply writer lock").stream.as_mut() {
        let _ = stream.flush();
    }
    let _ = out.socket.shutdown(Shutdown::Both);
}

/// The next reply; flushes first if none is queued, so replies go out as soon as the queue
/// runs dry. `None` once every sender is gone.
fn next_reply<B>(replies: &Receiver<Reply<B>>, out: &ReplyOut) -> Option<Reply<B>> {
    match replies.try_recv() {
        Ok(reply) => return Some(reply),
        Err(TryRecvError::Disconnected) => return None,
        Err(TryRecvError::Empty) => {}
    }
    let mut writer = out.writer.lock().expect("reply writer lock");
    if let Some(stream) = writer.stream.as_mut() {
        if let Err(error) = stream.flush() {
            abandon(&mut writer, &out.socket, &out.client_gone, &error);
        }
    }
    drop(writer);
    replies.recv().ok()
}

/// The client is gone, or stuck for `reply_stall_timeout` (SO_SNDTIMEO): stop writing, and close
/// the socket so the reader stops too.
fn abandon(state: &mut WriterState, socket: &Socket, client_gone: &AtomicBool, error: &io::Error) {
    tracing::debug!(%error, "nbd: cannot send replies; dropping the connection");
    client_gone.store(true, Ordering::SeqCst);
    state.stream = None;
    state.tail.clear();
    let _ = socket.shutdown(Shutdown::Both);
}

fn write_reply<B: AsRef<[u8]>>(out: &mut impl Write, reply: &Reply<B>, structured_replies: bool) -> io::Result<()> {
    let (head, data) = reply_parts(reply, structured_replies);
    out.write_all(&head)?;
    out.write_all(data)
}

/// A reply's header, or a whole reply without data: in place for the fixed-size ones every
/// successful request gets (no allocation per reply), on the heap for an error's message.
enum ReplyHead {
    Fixed { bytes: [u8; REPLY_HEAD_BYTES_MAX], len_bytes: usize },
    Owned(Vec<u8>),
}

impl ReplyHead {
    fn fixed<const N: usize>(head: [u8; N]) -> ReplyHead {
        const { assert!(N <= REPLY_HEAD_BYTES_MAX, "a fixed reply head fits REPLY_HEAD_BYTES_MAX") };
        let mut bytes = [0u8; REPLY_HEAD_BYTES_MAX];
        bytes[..N].copy_from_slice(&head);
        ReplyHead::Fixed { bytes, len_bytes: N }
    }
}

impl std::ops::Deref for ReplyHead {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReplyHead::Fixed { bytes, len_bytes } => &bytes[..*len_bytes],
            ReplyHead::Owned(bytes) => bytes,
        }
    }
}

/// A reply's bytes: its header (or whole reply) and the read data that follows it, if any.
fn reply_parts<B: AsRef<[u8]>>(reply: &Reply<B>, structured_replies: bool) -> (ReplyHead, &[u8]) {
    let cookie = reply.cookie;
    match (&reply.outcome, structured_replies) {
        (Outcome::Tail, _) => (ReplyHead::fixed([]), &[]),
        (Outcome::Done, true) if reply.is_read => (ReplyHead::fixed(proto::encode_none_chunk(cookie)), &[]),
        (Outcome::Done, _) => (ReplyHead::fixed(proto::encode_simple_reply(cookie, 0)), &[]),
        (Outcome::Data { buf, .. }, false) => (ReplyHead::fixed(proto::encode_simple_reply(cookie, 0)), buf.as_ref()),
        (Outcome::Data { offset, buf }, true) => {
            let data = buf.as_ref();
            let data_len_bytes = u32::try_from(data.len()).expect("reads are at most PAYLOAD_MAX_BYTES");
            // One chunk, marked done: the data is complete, so no error can follow it.
            (ReplyHead::fixed(proto::encode_offset_data_header(cookie, *offset, data_len_bytes, true)), data)
        }
        (Outcome::Failed { error, .. }, false) => (ReplyHead::fixed(proto::encode_simple_reply(cookie, error.nbd_error())), &[]),
        (Outcome::Failed { error, message }, true) => {
            (ReplyHead::Owned(proto::encode_error_chunk(cookie, error.nbd_error(), message)), &[])
        }
    }
}
