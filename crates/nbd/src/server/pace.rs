//! When a connection's readers pass the socket on before a request's submission: decided from
//! how long recent submissions took (see `transmission::take_turns` for why).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// When a connection's readers hand the reading side over before a dispatch (`--nbd-hand-over`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// Before every dispatch that empties the socket.
    Always,
    /// Only while dispatches have recently taken longer than `slower_than` (see
    /// `transmission::take_turns`).
    WhenSlow { slower_than: Duration },
}

impl HandOver {
    /// [`HandOver::WhenSlow`] at [`SLOW_DISPATCH`].
    pub const WHEN_SLOW: HandOver = HandOver::WhenSlow { slower_than: SLOW_DISPATCH };
}

/// A dispatch longer than this (the request served in place, or handed on) makes the readers
/// hand the turn over for a while: well above a memory member's 4 KiB copy or a hand-off to a
/// shard (a few microseconds), below a read from any disk. A few times what the hand-over costs,
/// so a reader preempted once in a while does not switch modes often.
const SLOW_DISPATCH: Duration = Duration::from_micros(50);

/// How many dispatches after a slow one are preceded by a hand-over, however quick they are:
/// a device that was slow once (a page-cache miss, a busy disk) is likely to be again soon.
const HAND_OVERS_AFTER_SLOW: u32 = 256;

/// How long a connection's dispatches take, which decides whether its readers hand the turn
/// over (shared by them, so one slow dispatch switches every reader).
pub(crate) struct DispatchPace {
    hand_over: HandOver,
    /// Dispatches still to be preceded by a hand-over since the last slow one.
    hand_overs_left: AtomicU32,
}

impl DispatchPace {
    pub(crate) fn new(hand_over: HandOver) -> DispatchPace {
        DispatchPace { hand_over, hand_overs_left: AtomicU32::new(0) }
    }

    /// Whether the turn passes before the request that emptied the socket is dispatched.
    pub(crate) fn hands_over(&self) -> bool {
        self.hand_over == HandOver::Always || self.slow()
    }

    /// Whether dispatches have recently been slow: then every request is dispatched after the
    /// turn has passed, even one whose successor is buffered, so that slow requests that came
    /// together are served together.
    pub(crate) fn slow(&self) -> bool {
        self.hand_overs_left.load(Ordering::Relaxed) > 0
    }

    /// Runs `dispatch` (a request's submission), timed unless every dispatch hands over anyway.
    pub(crate) fn timed(&self, dispatch: impl FnOnce()) {
        let HandOver::WhenSlow { slower_than } = self.hand_over else { return dispatch() };
        let started = Instant::now();
        dispatch();
        if started.elapsed() > slower_than {
            self.hand_overs_left.store(HAND_OVERS_AFTER_SLOW, Ordering::Relaxed);
        } else {
            // Racing readers may lose a decrement or two: the count is a rough horizon.
            let left = self.hand_overs_left.load(Ordering::Relaxed);
            if left > 0 {
                self.hand_overs_left.store(left - 1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOWER_THAN: Duration = Duration::from_millis(5);

    #[test]
    fn one_slow_dispatch_makes_the_next_ones_hand_over_until_enough_were_quick() {
        let pace = DispatchPace::new(HandOver::WhenSlow { slower_than: SLOWER_THAN });
        pace.timed(|| {});
        assert!(!pace.hands_over() && !pace.slow(), "quick dispatches keep the turn");
        pace.timed(|| std::thread::sleep(SLOWER_THAN * 2));
        assert!(pace.hands_over() && pace.slow());
        for _ in 1..HAND_OVERS_AFTER_SLOW {
            pace.timed(|| {});
        }
        assert!(pace.slow(), "still slow one quick dispatch before the horizon");
        pace.timed(|| {});
        assert!(!pace.hands_over() && !pace.slow(), "{HAND_OVERS_AFTER_SLOW} quick dispatches later it keeps the turn again");
    }

    #[test]
    fn always_hands_over_the_last_request_and_never_counts_one_as_slow() {
        let pace = DispatchPace::new(HandOver::Always);
        pace.timed(|| std::thread::sleep(SLOW_DISPATCH * 2));
        assert!(pace.hands_over());
        assert!(!pace.slow(), "buffered requests are still served in place");
    }
}
