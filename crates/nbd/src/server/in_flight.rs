//! A connection's requests in flight, bounded by count and payload bytes, with the server's
//! payload budget: a [`Credit`] per request, from submission until its reply is on the wire.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use super::limits::PayloadBudget;
use super::{ListenerState, ServerConfig};

/// Bounds one connection's requests in flight by count and by payload bytes, and takes the
/// payload bytes from the server's budget too.
pub(crate) struct InFlight {
    state: Mutex<InFlightState>,
    released: Condvar,
    requests_max: usize,
    payload_bytes_max: usize,
    listener: Arc<ListenerState>,
    budget: Arc<PayloadBudget>,
}

#[derive(Default)]
struct InFlightState {
    requests: usize,
    payload_bytes: usize,
    /// The reader waits on `released`: only then is it notified (a system call).
    reader_waiting: bool,
}

impl InFlight {
    pub(crate) fn new(config: &ServerConfig, listener: Arc<ListenerState>, budget: Arc<PayloadBudget>) -> Arc<InFlight> {
        Arc::new(InFlight {
            state: Mutex::new(InFlightState::default()),
            released: Condvar::new(),
            requests_max: config.requests_in_flight_max,
            payload_bytes_max: config.payload_in_flight_bytes_max,
            listener,
            budget,
        })
    }

    /// Blocks until the request fits this connection's bound, then the server's. A request
    /// alone always fits either, so nothing waits forever: what it waits for is held by
    /// requests that complete, and by replies that are sent or, after `reply_stall_timeout`,
    /// dropped.
    /// Whether a request of `payload_bytes` fits this connection's bounds now. A request alone
    /// always fits, however large its payload.
    fn fits(&self, state: &InFlightState, payload_bytes: usize) -> bool {
        state.requests < self.requests_max && (state.requests == 0 || state.payload_bytes + payload_bytes <= self.payload_bytes_max)
    }

    /// A credit if the request fits both bounds now, without waiting for either.
    pub(crate) fn try_acquire(self: &Arc<Self>, payload_bytes: usize) -> Option<Credit> {
        let mut state = self.state.lock().unwrap();
        if !self.fits(&state, payload_bytes) || !self.budget.try_take(payload_bytes) {
            return None;
        }
        state.requests += 1;
        state.payload_bytes += payload_bytes;
        drop(state);
        self.listener.requests_in_flight.fetch_add(1, Ordering::SeqCst);
        Some(Credit { in_flight: Arc::clone(self), payload_bytes })
    }

    /// Whether none of the connection's requests is in flight (every reply is on the wire).
    pub(crate) fn is_idle(&self) -> bool {
        self.state.lock().unwrap().requests == 0
    }

    pub(crate) fn acquire(self: &Arc<Self>, payload_bytes: usize) -> Credit {
        let mut state = self.state.lock().unwrap();
        while !self.fits(&state, payload_bytes) {
            state.reader_waiting = true;
            state = self.released.wait(state).unwrap();
            state.reader_waiting = false;
        }
        state.requests += 1;
        state.payload_bytes += payload_bytes;
        drop(state);
        // Only the reader holding the connection's reading turn acquires, so holding its share
        // while waiting for the server's cannot starve another request of this connection.
        self.budget.take(payload_bytes);
        self.listener.requests_in_flight.fetch_add(1, Ordering::SeqCst);
        Credit { in_flight: Arc::clone(self), payload_bytes }
    }
}

/// One request's share of its connection's in-flight bound, returned on drop.
pub(crate) struct Credit {
    in_flight: Arc<InFlight>,
    payload_bytes: usize,
}

impl Drop for Credit {
    fn drop(&mut self) {
        let mut state = self.in_flight.state.lock().unwrap();
        assert!(state.requests > 0 && state.payload_bytes >= self.payload_bytes);
        state.requests -= 1;
        state.payload_bytes -= self.payload_bytes;
        self.in_flight.listener.requests_in_flight.fetch_sub(1, Ordering::SeqCst);
        let reader_waiting = state.reader_waiting;
        drop(state);
        self.in_flight.budget.give_back(self.payload_bytes);
        // Only the reader holding the reading turn ever waits.
        if reader_waiting {
            self.in_flight.released.notify_one();
        }
    }
}
