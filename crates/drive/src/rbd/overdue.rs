//! Writes and flushes librbd does not answer: after [`OP_DEADLINE`] (or the spec's `timeout=`)
//! the drive is treated as gone, as a controller resets and fails a disk that stops answering.
//!
//! librbd can hold an operation forever: in Ceph 16, a pool deleted under an image with the
//! exclusive-lock feature leaves writes waiting for a lock that is never reacquired ("aborting
//! reacquire due to invalid watch handle"), and librados' OSD timeout does not cover that wait.
//! Without a deadline the member never fails and its VD's I/O waits with it.
//!
//! Only writes and flushes are completed early. librbd copies a write's data at the call
//! (`rbd_disable_zero_copy_writes` is forced on) and a flush has none, so their buffers can go
//! back to the engine while librbd still holds the operation. A read's buffer is filled by
//! librbd when it completes, so a read stays with librbd until its callback; the drive being
//! gone makes every later operation fail at once, so the member still leaves service.
//!
//! The callback and the watch race for each operation's [`Delivery`]: whoever takes it first
//! completes it, exactly once. The operation is counted out of the drive (`Shared::end`) only
//! by librbd's callback, so closing the drive still waits for librbd to let go.

use crate::{Completion, CompletionPort, DriveError, DriveOp, Token};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long librbd may hold a write or a flush: two librados OSD timeouts (30 s each unless the
/// conf says otherwise), so a slow OSD is retried before the member is given up.
pub(super) const OP_DEADLINE: Duration = Duration::from_secs(60);

/// How often the watch looks: a few times per deadline.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// What completes an operation: its context's port, its token and its buffers.
pub(super) struct Delivery {
    pub(super) port: CompletionPort,
    pub(super) token: Token,
    pub(super) op: DriveOp,
}

impl Delivery {
    pub(super) fn complete(self, result: Result<(), DriveError>) {
        self.port.complete(Completion::of(self.token, result, self.op));
    }
}

/// The writes and flushes in flight on one drive, by id, with when they started.
#[derive(Default)]
pub(super) struct Overdue {
    state: Mutex<WatchState>,
    /// Wakes the watch thread when the drive closes.
    closed: Condvar,
}

#[derive(Default)]
struct WatchState {
    next_id: u64,
    /// With when the operation was handed to librbd; `None` until then (see [`Overdue::arm`]).
    watched: HashMap<u64, (Option<Instant>, Delivery)>,
    closed: bool,
}

impl Overdue {
    /// Holds `delivery` for an operation about to be handed to librbd; the id to arm it and
    /// to take it back with. Not watched until armed: the watch must not give a write's
    /// buffers back before librbd has copied them.
    pub(super) fn hold(&self, delivery: Delivery) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let id = state.next_id;
        state.next_id += 1;
        state.watched.insert(id, (None, delivery));
        id
    }

    /// Starts the deadline of operation `id`, which librbd accepted at `started` (unless its
    /// callback took it already).
    pub(super) fn arm(&self, id: u64, started: Instant) {
        if let Some((armed, _)) = self.state.lock().unwrap_or_else(PoisonError::into_inner).watched.get_mut(&id) {
            *armed = Some(started);
        }
    }

    /// The delivery of operation `id`, unless the watch completed it already.
    pub(super) fn take(&self, id: u64) -> Option<Delivery> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).watched.remove(&id).map(|(_, delivery)| delivery)
    }

    /// Takes every delivery whose operation started more than `deadline` before `now`.
    pub(super) fn take_overdue(&self, now: Instant, deadline: Duration) -> Vec<Delivery> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let overdue: Vec<u64> = state
            .watched
            .iter()
            .filter(|(_, (started, _))| started.is_some_and(|started| now.saturating_duration_since(started) > deadline))
            .map(|(id, _)| *id)
            .collect();
        overdue.into_iter().filter_map(|id| state.watched.remove(&id)).map(|(_, delivery)| delivery).collect()
    }

    /// Ends the watch thread (the drive is closing).
    pub(super) fn close(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        self.closed.notify_all();
    }

    /// The watch thread's loop: every [`WATCH_PERIOD`], completes the overdue operations with
    /// `DriveError::Gone` after `on_overdue` (which marks the drive gone), until `close`.
    pub(super) fn run(self: &Arc<Self>, deadline: Duration, on_overdue: impl Fn(usize)) {
        loop {
            {
                let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let (state, _) = self.closed.wait_timeout_while(state, WATCH_PERIOD, |s| !s.closed).unwrap_or_else(PoisonError::into_inner);
                if state.closed {
                    return;
                }
            }
            let overdue = self.take_overdue(Instant::now(), deadline);
            if !overdue.is_empty() {
                on_overdue(overdue.len());
                overdue.into_iter().for_each(|delivery| delivery.complete(Err(DriveError::Gone)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;

    fn write_delivery(port: &CompletionPort, token: Token) -> Delivery {
        Delivery { port: port.clone(), token, op: DriveOp::Write { offset_bytes: 0, buf: IoBuf::zeroed(512) } }
    }

    fn arrived(port: &CompletionPort) -> Vec<Completion> {
        let mut into = std::collections::VecDeque::new();
        port.take_all(&mut into);
        into.into_iter().collect()
    }

    #[test]
    fn only_operations_past_the_deadline_are_taken_and_each_once() {
        let overdue = Overdue::default();
        let port = CompletionPort::new(None);
        let start = Instant::now();
        let old = overdue.hold(write_delivery(&port, 1));
        overdue.arm(old, start);
        let young = overdue.hold(write_delivery(&port, 2));
        overdue.arm(young, start + Duration::from_secs(50));
        let not_yet_handed = overdue.hold(write_delivery(&port, 3));
        let taken = overdue.take_overdue(start + Duration::from_secs(61), OP_DEADLINE);
        assert_eq!(taken.iter().map(|d| d.token).collect::<Vec<_>>(), vec![1], "only the armed operation past its deadline");
        assert!(overdue.take(not_yet_handed).is_some());
        // The callback that comes after the watch finds nothing to complete...
        assert!(overdue.take(old).is_none());
        // ...and the one that comes first takes its own, which the watch then cannot.
        assert!(overdue.take(young).is_some());
        assert!(overdue.take_overdue(start + Duration::from_secs(500), OP_DEADLINE).is_empty());
    }

    #[test]
    fn the_watch_completes_an_overdue_write_as_gone_with_its_buffer_and_stops_at_close() {
        let overdue = Arc::new(Overdue::default());
        let port = CompletionPort::new(None);
        let id = overdue.hold(write_delivery(&port, 7));
        overdue.arm(id, Instant::now());
        let watch = {
            let overdue = Arc::clone(&overdue);
            std::thread::spawn(move || overdue.run(Duration::from_millis(10), |_| {}))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let completions = loop {
            let completions = arrived(&port);
            if !completions.is_empty() || Instant::now() > deadline {
                break completions;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(completions.len(), 1, "the overdue write was not completed");
        assert_eq!((completions[0].token, &completions[0].result), (7, &Err(DriveError::Gone)));
        assert_eq!(completions[0].buf.as_ref().map(IoBuf::len), Some(512), "the buffer goes back with it");
        overdue.close();
        watch.join().unwrap();
    }
}
