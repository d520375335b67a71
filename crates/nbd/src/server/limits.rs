//! The server-wide bounds: payload bytes in flight across every connection, and logging of
//! refused and dropped connections that a flood of clients cannot turn into a flood of lines.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Payload bytes in flight across all connections of one server, handed out first come, first
/// served: a reader whose request does not fit stops reading (back-pressure on its client)
/// until enough comes back. A ticket queue keeps a large request from being overtaken forever
/// by small ones.
pub(crate) struct PayloadBudget {
    state: Mutex<BudgetState>,
    changed: Condvar,
    bytes_max: usize,
}

#[derive(Default)]
struct BudgetState {
    bytes: usize,
    bytes_peak: usize,
    next_ticket: u64,
    serving_ticket: u64,
    /// Takers waiting on `changed`: without any, nobody is notified (a notification is a
    /// system call, three per request before).
    waiting: usize,
}

impl PayloadBudget {
    pub(crate) fn new(bytes_max: usize) -> PayloadBudget {
        assert!(bytes_max > 0, "a payload budget of 0 bytes would admit only lone requests");
        PayloadBudget { state: Mutex::new(BudgetState::default()), changed: Condvar::new(), bytes_max }
    }

    /// Blocks until `bytes` fit, in arrival order. A request alone always fits, so that one
    /// larger than the whole budget still runs (when nothing else does) instead of waiting forever.
    pub(crate) fn take(&self, bytes: usize) {
        if bytes == 0 {
            return; // holds no buffer: neither waits nor makes others wait
        }
        let mut state = self.state.lock().unwrap();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        while state.serving_ticket != ticket || (state.bytes > 0 && state.bytes + bytes > self.bytes_max) {
            state.waiting += 1;
            state = self.changed.wait(state).unwrap();
            state.waiting -= 1;
        }
        state.serving_ticket += 1;
        state.bytes += bytes;
        state.bytes_peak = state.bytes_peak.max(state.bytes);
        let waiting = state.waiting > 0;
        drop(state);
        // The next ticket may fit too.
        if waiting {
            self.changed.notify_all();
        }
    }

    /// Takes `bytes` if nobody waits before it and they fit now; never waits.
    pub(crate) fn try_take(&self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut state = self.state.lock().unwrap();
        if state.serving_ticket != state.next_ticket || (state.bytes > 0 && state.bytes + bytes > self.bytes_max) {
            return false;
        }
        state.next_ticket += 1;
        state.serving_ticket += 1;
        state.bytes += bytes;
        state.bytes_peak = state.bytes_peak.max(state.bytes);
        true
    }

    pub(crate) fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap();
        assert!(state.bytes >= bytes, "giving back {bytes} bytes of a budget with {} taken", state.bytes);
        state.bytes -= bytes;
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.changed.notify_all();
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().unwrap().bytes
    }

    pub(crate) fn bytes_peak(&self) -> usize {
        self.state.lock().unwrap().bytes_peak
    }
}

/// Lets one line through per `interval` and counts the rest, so that a client opening
/// thousands of connections a second costs a line every few seconds, not a full disk.
pub(crate) struct LogLimiter {
    interval: Duration,
    state: Mutex<LimiterState>,
}

#[derive(Default)]
struct LimiterState {
    last_logged: Option<Instant>,
    suppressed_count: u64,
}

impl LogLimiter {
    pub(crate) fn new(interval: Duration) -> LogLimiter {
        LogLimiter { interval, state: Mutex::new(LimiterState::default()) }
    }

    /// `Some(n)` if a line may be logged at `now`, `n` being how many were suppressed since the
    /// last one; `None` if this one is suppressed (and counted).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap();
        let due = state.last_logged.is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            state.suppressed_count += 1;
            return None;
        }
        state.last_logged = Some(now);
        Some(std::mem::take(&mut state.suppressed_count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn log_limiter_admits_one_line_per_interval_and_counts_the_rest() {
        let limiter = LogLimiter::new(Duration::from_secs(5));
        let start = Instant::now();
        let at = |millis: u64| start + Duration::from_millis(millis);
        let admitted: Vec<Option<u64>> = [0, 1, 2, 4_999, 5_000, 5_001, 20_000].iter().map(|&ms| limiter.admit(at(ms))).collect();
        assert_eq!(admitted, [Some(0), None, None, None, Some(3), None, Some(1)]);
    }

    #[test]
    fn budget_waits_until_bytes_come_back_and_admits_a_lone_oversized_request() {
        let budget = Arc::new(PayloadBudget::new(100));
        budget.take(60);
        budget.take(40);
        let waiter = {
            let budget = Arc::clone(&budget);
            thread::spawn(move || budget.take(30))
        };
        thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "took 30 bytes of a full budget");
        budget.give_back(40);
        waiter.join().unwrap();
        assert_eq!((budget.bytes(), budget.bytes_peak()), (90, 100));
        budget.give_back(60);
        budget.give_back(30);
        budget.take(500); // alone: allowed, or it would wait forever
        assert_eq!(budget.bytes_peak(), 500);
        budget.give_back(500);
        assert_eq!(budget.bytes(), 0);
    }
}
