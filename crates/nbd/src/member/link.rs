//! The state a member drive's submitters, reader, writer and supervisor share: the connection
//! in use (if any), the requests waiting to be written, and those waiting for their replies.

use super::requests::{Entry, Finished, Request};
use crate::socket::Socket;
use drive::{DriveError, IoBuf};
use std::collections::{HashMap, VecDeque};
use std::net::Shutdown;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Requests a link may hold (queued or waiting for replies). The engine bounds what it has in
/// flight far below this; a link that holds this many is not answering, and is cut as stalled.
pub(super) const REQUESTS_IN_FLIGHT_MAX: usize = 1 << 16;

pub(super) struct Link {
    /// The member's spec, for logs.
    pub(super) name: String,
    pub(super) timeout: Duration,
    state: Mutex<LinkState>,
    /// The writer waits here for requests (and for its connection being cut).
    pub(super) writer_wake: Condvar,
    /// The supervisor waits here between its checks (and for a stop).
    pub(super) supervisor_wake: Condvar,
    /// What a reconnection must pass before it goes live (`NbdDrive::check_reconnections`).
    pub(super) reconnect_check: Mutex<Option<std::sync::Arc<super::ReconnectCheck>>>,
}

pub(super) struct LinkState {
    /// The connection requests go to; `None` while the link is down.
    pub(super) up: Option<Up>,
    /// Connections made so far (the first at open is 1).
    pub(super) generation: u64,
    next_cookie: u64,
    pub(super) table: HashMap<u64, Entry>,
    /// Requests for the writer, in submission order.
    pub(super) queue: VecDeque<Outgoing>,
    /// Why the link last went down (or the last reconnection failed).
    pub(super) last_error: Option<String>,
    /// Why the reconnection check refused the export that answered last.
    pub(super) refused: Option<String>,
    /// The drive is being dropped: no more connections.
    pub(super) stopping: bool,
}

/// The connection in use and what its server allows.
pub(super) struct Up {
    pub(super) generation: u64,
    socket: Socket,
    pub(super) max_request_bytes: usize,
    pub(super) can_flush: bool,
}

/// A request for the writer: its header, and a WRITE's payload (lent from its entry).
pub(super) struct Outgoing {
    pub(super) cookie: u64,
    pub(super) header: [u8; crate::proto::REQUEST_HEADER_BYTES],
    pub(super) payload: Vec<IoBuf>,
}

impl Link {
    pub(super) fn new(name: String, timeout: Duration) -> Link {
        let state = LinkState {
            up: None,
            generation: 0,
            next_cookie: 1,
            table: HashMap::new(),
            queue: VecDeque::new(),
            last_error: None,
            refused: None,
            stopping: false,
        };
        let reconnect_check = Mutex::new(None);
        Link { name, timeout, state: Mutex::new(state), writer_wake: Condvar::new(), supervisor_wake: Condvar::new(), reconnect_check }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cuts connection `generation` if it is still the one in use, and delivers what that
    /// finished; wakes the writer and the supervisor.
    pub(super) fn cut(&self, generation: u64, reason: String) {
        let mut finished = Vec::new();
        let mut state = self.lock();
        if state.is_current(generation) {
            state.cut(reason, &mut finished);
        }
        drop(state);
        self.writer_wake.notify_all();
        self.supervisor_wake.notify_all();
        super::requests::deliver_all(finished);
    }
}

impl Link {
    /// Cuts whatever connection is in use now.
    pub(super) fn cut_current(&self, reason: String) {
        let generation = self.lock().up.as_ref().map(|up| up.generation);
        if let Some(generation) = generation {
            self.cut(generation, reason);
        }
    }
}

impl LinkState {
    pub(super) fn is_current(&self, generation: u64) -> bool {
        self.up.as_ref().is_some_and(|up| up.generation == generation)
    }

    /// A new connection takes over; requests go to it from now on.
    pub(super) fn connected(&mut self, socket: Socket, max_request_bytes: usize, can_flush: bool) -> u64 {
        self.generation += 1;
        self.refused = None;
        self.up = Some(Up { generation: self.generation, socket, max_request_bytes, can_flush });
        self.generation
    }

    /// Queues the requests of one operation (their entries first, so a reply always finds its
    /// request). `None` when the link is down or full: the caller fails them.
    pub(super) fn enqueue(&mut self, requests: Vec<Request>) -> Result<(), Vec<Request>> {
        if self.up.is_none() || self.table.len() + requests.len() > REQUESTS_IN_FLIGHT_MAX {
            return Err(requests);
        }
        for mut request in requests {
            let cookie = self.next_cookie;
            self.next_cookie += 1;
            let header = crate::proto::encode_request(&crate::proto::Request {
                flags: 0,
                command: request.command,
                cookie,
                offset: request.offset_bytes,
                len_bytes: request.len_bytes,
            });
            let segs = std::mem::take(&mut request.segs);
            let (kept, payload) = match request.command {
                crate::proto::Command::Write => (None, segs),
                _ => (Some(segs), Vec::new()),
            };
            self.table.insert(cookie, Entry::new(&request, kept));
            self.queue.push_back(Outgoing { cookie, header, payload });
        }
        Ok(())
    }

    /// Puts buffers the writer or the reader held back in their entry, which finishes if its
    /// outcome is known.
    pub(super) fn give_back(&mut self, cookie: u64, segs: Vec<IoBuf>, finished: &mut Vec<Finished>) {
        let entry = self.table.get_mut(&cookie).expect("an entry whose buffers are lent stays in the table");
        entry.segs = Some(segs);
        self.finish_if_done(cookie, finished);
    }

    /// Records a reply's outcome for `cookie`; `false` if no request has that cookie.
    pub(super) fn settle(&mut self, cookie: u64, outcome: Result<(), DriveError>, finished: &mut Vec<Finished>) -> bool {
        let Some(entry) = self.table.get_mut(&cookie) else { return false };
        entry.settle(outcome);
        self.finish_if_done(cookie, finished);
        true
    }

    fn finish_if_done(&mut self, cookie: u64, finished: &mut Vec<Finished>) {
        let Some(entry) = self.table.get_mut(&cookie) else { return };
        if let Some(done) = entry.finished() {
            self.table.remove(&cookie);
            finished.push(done);
        }
    }

    /// When the oldest request waiting for its reply was submitted.
    pub(super) fn oldest_submitted(&self) -> Option<Instant> {
        self.table.values().map(|entry| entry.submitted_at).min()
    }

    /// Takes the link down: the socket is shut (the reader and writer wake and end), and every
    /// request fails as the drive gone, each as soon as its buffers are back.
    pub(super) fn cut(&mut self, reason: String, finished: &mut Vec<Finished>) {
        let Some(up) = self.up.take() else { return };
        let _ = up.socket.shutdown(Shutdown::Both);
        self.last_error = Some(reason);
        for outgoing in std::mem::take(&mut self.queue) {
            if let Some(entry) = self.table.get_mut(&outgoing.cookie) {
                if entry.segs.is_none() && entry.command == crate::proto::Command::Write {
                    entry.segs = Some(outgoing.payload);
                }
            }
        }
        let cookies: Vec<u64> = self.table.keys().copied().collect();
        for cookie in cookies {
            self.settle(cookie, Err(DriveError::Gone), finished);
        }
    }
}
