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
    /// As [`HandOver::WhenSlow`], and also while handing over has been measured, on the
    /// connection, to shorten the round trip of a client that waits for each reply
    /// (`round_trips`).
    Auto { slower_than: Duration },
}

impl HandOver {
    /// [`HandOver::WhenSlow`] at [`SLOW_DISPATCH`].
    pub const WHEN_SLOW: HandOver = HandOver::WhenSlow { slower_than: SLOW_DISPATCH };
    /// [`HandOver::Auto`] at [`SLOW_DISPATCH`].
    pub const AUTO: HandOver = HandOver::Auto { slower_than: SLOW_DISPATCH };

    /// Whether the connection measures which way of taking turns serves a waiting client faster.
    pub(crate) fn measures_round_trips(self) -> bool {
        matches!(self, HandOver::Auto { .. })
    }
}

/// A dispatch longer than this (the request served in place, or handed on) is slow, and two of
/// them close together make the readers hand the turn over for a while: well above a memory
/// member's 4 KiB copy or a hand-off to a shard (a few microseconds), below a read from any disk.
const SLOW_DISPATCH: Duration = Duration::from_micros(50);

/// How a slow dispatch and a quick one move a connection's slowness score: a slow one adds
/// [`SLOW_WEIGHT`], a quick one takes one away. The score climbs while more than one dispatch
/// in `SLOW_WEIGHT + 1` is slow, which a device that waits for a disk does at nearly every
/// request; a reader preempted now and then on a busy machine (its dispatch took long because
/// another thread, often the very client it just answered, ran on its core) does not.
const SLOW_WEIGHT: u32 = 8;

/// The score at which readers hand over: two slow dispatches close together.
const SLOW_SCORE: u32 = 2 * SLOW_WEIGHT;

/// The highest score: how many quick dispatches it takes, after a slow spell, before the reader
/// keeps the turn again (a device that was slow for a while is likely to be again soon).
const SLOW_SCORE_MAX: u32 = 256;

/// How long a connection's dispatches take, which decides whether its readers hand the turn
/// over (shared by them, so a slow spell switches every reader).
pub(crate) struct DispatchPace {
    hand_over: HandOver,
    /// Slowness of recent dispatches, from 0 to [`SLOW_SCORE_MAX`].
    slow_score: AtomicU32,
}

impl DispatchPace {
    pub(crate) fn new(hand_over: HandOver) -> DispatchPace {
        DispatchPace { hand_over, slow_score: AtomicU32::new(0) }
    }

    /// Whether the turn passes before the request that emptied the socket is dispatched.
    pub(crate) fn hands_over(&self) -> bool {
        self.hand_over == HandOver::Always || self.slow()
    }

    /// Whether dispatches have recently been slow: then every request is dispatched after the
    /// turn has passed, even one whose successor is buffered, so that slow requests that came
    /// together are served together.
    pub(crate) fn slow(&self) -> bool {
        self.slow_score.load(Ordering::Relaxed) >= SLOW_SCORE
    }

    /// Runs `dispatch` (a request's submission), timed unless every dispatch hands over anyway.
    pub(crate) fn timed(&self, dispatch: impl FnOnce()) {
        let (HandOver::WhenSlow { slower_than } | HandOver::Auto { slower_than }) = self.hand_over else { return dispatch() };
        let started = Instant::now();
        dispatch();
        // Racing readers may lose an update or two: the score is a rough horizon.
        let score = self.slow_score.load(Ordering::Relaxed);
        let score = if started.elapsed() > slower_than { (score + SLOW_WEIGHT).min(SLOW_SCORE_MAX) } else { score.saturating_sub(1) };
        self.slow_score.store(score, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOWER_THAN: Duration = Duration::from_millis(5);

    fn slow(pace: &DispatchPace) {
        pace.timed(|| std::thread::sleep(SLOWER_THAN * 2));
    }

    #[test]
    fn a_slow_spell_makes_the_next_dispatches_hand_over_until_enough_were_quick() {
        let pace = DispatchPace::new(HandOver::WhenSlow { slower_than: SLOWER_THAN });
        pace.timed(|| {});
        assert!(!pace.hands_over() && !pace.slow(), "quick dispatches keep the turn");
        for _ in 0..SLOW_SCORE_MAX / SLOW_WEIGHT {
            slow(&pace);
        }
        assert!(pace.hands_over() && pace.slow());
        for _ in 0..SLOW_SCORE_MAX - SLOW_SCORE {
            pace.timed(|| {});
        }
        assert!(pace.slow(), "still slow one quick dispatch before the horizon");
        pace.timed(|| {});
        assert!(!pace.hands_over() && !pace.slow(), "{} quick dispatches later it keeps the turn again", SLOW_SCORE_MAX - SLOW_SCORE + 1);
    }

    #[test]
    fn two_slow_dispatches_close_together_hand_over_and_one_now_and_then_does_not() {
        let pace = DispatchPace::new(HandOver::WhenSlow { slower_than: SLOWER_THAN });
        for _ in 0..4 {
            slow(&pace);
            assert!(!pace.slow(), "one slow dispatch in {} is a preempted reader, not a slow device", SLOW_WEIGHT + 2);
            for _ in 0..SLOW_WEIGHT + 1 {
                pace.timed(|| {});
            }
        }
        slow(&pace);
        slow(&pace);
        assert!(pace.hands_over() && pace.slow(), "two in a row are a slow device");
    }

    #[test]
    fn always_hands_over_the_last_request_and_never_counts_one_as_slow() {
        let pace = DispatchPace::new(HandOver::Always);
        pace.timed(|| std::thread::sleep(SLOW_DISPATCH * 2));
        assert!(pace.hands_over());
        assert!(!pace.slow(), "buffered requests are still served in place");
    }
}
