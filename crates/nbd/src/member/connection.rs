//! One connection of a member drive: a writer thread sends queued requests, a reader thread
//! receives replies. Both end when the connection is cut (by either of them on an error, by
//! the supervisor on a stalled request, or at a stop); the supervisor joins them.

use super::link::{Link, Outgoing};
use super::requests::deliver_all;
use crate::client::ClientParts;
use crate::proto::{self, Command, ReplyHeader};
use crate::socket::Socket;
use crate::tls::TlsLink;
use drive::{DriveError, IoBuf};
use std::io::{BufReader, BufWriter, Read, Write};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The threads of a connection, and its TLS relay (dropped, so joined, after them).
pub(super) struct Connection {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    _tls: Option<TlsLink>,
}

impl Connection {
    /// Starts the reader and writer of connection `generation`, which is the link's now.
    pub(super) fn start(link: &Arc<Link>, parts: ClientParts, generation: u64) -> std::io::Result<Connection> {
        let ClientParts { reader, writer, tls, .. } = parts;
        let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(name.into()).spawn(body);
        let for_writer = Arc::clone(link);
        let writer = match spawn("storc-nbd-send", Box::new(move || write_loop(&for_writer, writer, generation))) {
            Ok(writer) => writer,
            Err(error) => {
                link.cut(generation, format!("cannot start a writer thread: {error}"));
                return Err(error);
            }
        };
        let for_reader = Arc::clone(link);
        let reader = match spawn("storc-nbd-recv", Box::new(move || read_loop(&for_reader, reader, generation))) {
            Ok(reader) => reader,
            Err(error) => {
                link.cut(generation, format!("cannot start a reader thread: {error}"));
                let _ = writer.join();
                return Err(error);
            }
        };
        Ok(Connection { reader, writer, _tls: tls })
    }

    /// Waits for both threads, which end once the connection is cut.
    pub(super) fn join(self) {
        let _ = self.writer.join();
        let _ = self.reader.join();
    }
}

/// Sends requests in submission order; headers gather in the buffer until the queue is empty.
fn write_loop(link: &Link, mut writer: BufWriter<Socket>, generation: u64) {
    let mut state = link.lock();
    loop {
        if !state.is_current(generation) {
            return;
        }
        if let Some(outgoing) = state.queue.pop_front() {
            drop(state);
            if let Err(error) = send(link, &mut writer, outgoing) {
                return link.cut(generation, format!("sending a request: {error}"));
            }
        } else if writer.buffer().is_empty() {
            state = link.writer_wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
            continue;
        } else {
            drop(state);
            // A write that makes no progress for the link's timeout fails (SO_SNDTIMEO).
            if let Err(error) = writer.flush() {
                return link.cut(generation, format!("sending requests: {error}"));
            }
        }
        state = link.lock();
    }
}

/// Writes one request, then gives a WRITE's payload back to its entry (even when the write
/// failed: the cut that follows fails it).
fn send(link: &Link, writer: &mut BufWriter<Socket>, outgoing: Outgoing) -> std::io::Result<()> {
    let Outgoing { cookie, header, payload } = outgoing;
    let mut sent = writer.write_all(&header);
    for seg in &payload {
        sent = sent.and_then(|()| writer.write_all(seg.as_slice()));
    }
    if !payload.is_empty() {
        let mut finished = Vec::new();
        link.lock().give_back(cookie, payload, &mut finished);
        deliver_all(finished);
    }
    sent
}

/// Receives replies until the connection is cut or breaks.
fn read_loop(link: &Link, mut reader: BufReader<Socket>, generation: u64) {
    loop {
        let mut header = [0u8; proto::SIMPLE_REPLY_HEADER_BYTES];
        if let Err(error) = reader.read_exact(&mut header) {
            return link.cut(generation, format!("reading a reply: {error}"));
        }
        // Structured replies are not negotiated: anything but a simple reply is a broken stream.
        let (error, cookie) = match proto::parse_reply_header(&header) {
            Ok(ReplyHeader::Simple { error, cookie }) => (error, cookie),
            Ok(ReplyHeader::Chunk { .. }) => return link.cut(generation, "the server sent a structured reply unasked".into()),
            Err(error) => return link.cut(generation, format!("bad reply: {error}")),
        };
        if let Err(problem) = take_reply(link, &mut reader, generation, error, cookie) {
            return link.cut(generation, problem);
        }
    }
}

/// Books one reply (reading a READ's data into its buffers). `Err` says why the connection
/// cannot go on; `Ok` also when it was cut meanwhile (the next read ends the loop).
fn take_reply(link: &Link, reader: &mut BufReader<Socket>, generation: u64, error: u32, cookie: u64) -> Result<(), String> {
    let mut finished = Vec::new();
    let mut state = link.lock();
    if !state.is_current(generation) {
        return Ok(());
    }
    let Some(entry) = state.table.get_mut(&cookie) else {
        return Err(format!("reply for cookie {cookie}, which no request has"));
    };
    if error != 0 || entry.command != Command::Read {
        // The NBD error values are Linux's errno values.
        let outcome = if error == 0 { Ok(()) } else { Err(DriveError::Io(i32::try_from(error).unwrap_or(libc::EIO))) };
        state.settle(cookie, outcome, &mut finished);
        drop(state);
        deliver_all(finished);
        return Ok(());
    }
    let Some(mut segs) = entry.segs.take() else {
        return Err(format!("two replies for cookie {cookie}"));
    };
    drop(state);
    let read = read_data(reader, &mut segs);
    let mut state = link.lock();
    state.give_back(cookie, segs, &mut finished);
    let problem = read.as_ref().err().map(|error| format!("reading a reply's data: {error}"));
    state.settle(cookie, read.map_err(|_| DriveError::Gone), &mut finished);
    drop(state);
    deliver_all(finished);
    problem.map_or(Ok(()), Err)
}

fn read_data(reader: &mut BufReader<Socket>, segs: &mut [IoBuf]) -> std::io::Result<()> {
    segs.iter_mut().try_for_each(|seg| reader.read_exact(seg.as_mut_slice()))
}
