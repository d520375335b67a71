//! Whether handing the reading turn over shortens the round trip of a client that waits for
//! each reply (`HandOver::Auto`): measured on the connection itself, both ways in turn, because
//! which way is faster depends on the machine and no rule found it.
//!
//! At queue depth 1 a reader that keeps the turn sleeps in `recv` after each reply and is woken
//! where it slept; one that hands over has woken another reader, already waiting in `recv` when
//! the next request comes, and that often runs on the client's CPU. Measured on four hosts of
//! one VM class (`bench/nbd-cpu`, QD 1 4 KiB reads on RAID1 of memory drives): keeping the turn
//! took 55-58, 78-83 and 55-65 us per read on three of them where handing over took 26-29,
//! 37-44 and 40-45 (a woken virtual CPU that had halted costs tens of microseconds there), and
//! on the fourth 21-23 against 27-28. Handing over costs CPU, too: two more context switches
//! per request (server CPU per paced fio read 0.79 of nbdkit's against 0.62 keeping the turn),
//! for nothing when the client does not wait.
//!
//! So the readers keep the turn unless handing over is measured to be faster. What is measured
//! is the time between two requests that each came alone (the reader's buffer held nothing)
//! where the later came with nothing of the connection's in flight: a client that waited for
//! its reply before sending, whose round trip, as the server sees it, is that interval (serving,
//! replying, the client's turnaround and the wake-up of the reader). A client that keeps
//! requests in flight, or sends at its own pace, gives few such intervals, and a measurement
//! that gathers too few ends at once with the turn kept; one whose intervals no choice of the
//! server shortens measures a tie, and the cheaper way stays. Every [`SETTLED_REQUESTS`]
//! requests both ways are measured again, so a connection follows its client from one pattern
//! to another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Intervals per measuring window (about 0.8 s at queue depth 1); the first of each is dropped
/// (it straddles the switch). Shorter windows did not see the difference: with 64 or 1,024
/// intervals (3 and 50 ms) handing over measured as fast as keeping the turn or slower (45-58
/// against 36-56 us), with 16,384 it measured 48 us against 61-64, as whole runs of either way
/// do (40-45 us against 55-65). What the scheduler and the hypervisor learn of a thread's
/// wake-ups takes that long to settle.
const WINDOW_SAMPLES: u32 = 16_384;

/// Measuring windows, alternating: keep, hand over, keep, hand over (so that a drift of the
/// machine's speed during the measurement favours neither).
const WINDOWS: u8 = 4;

/// Handing over is chosen only if it shortened the mean interval by at least this share: it
/// costs CPU, so a tie or noise keeps the turn.
const HAND_OVER_GAIN_MIN: f64 = 0.10;

/// An interval longer than this is the client's think time, not a round trip: not counted.
const ROUND_TRIP_MAX: Duration = Duration::from_millis(2);

/// Requests served with the chosen way before both are measured again (about a minute at
/// queue depth 1): two of the four windows serve with the slower way, so a measurement costs
/// about 3% of the time in it.
const SETTLED_REQUESTS: u32 = 1 << 20;

/// A window that has seen this many requests, fewer than [`INTERVALS_PER_REQUEST_MIN`] of which
/// gave an interval, ends the measurement with the turn kept: the client does not wait for its
/// replies (it keeps several in flight, or sends at its own pace: fio paced at 40k IOPS gave an
/// interval for 1,885 of 262,144 requests), so no way of taking turns shortens its round trip.
const RARE_CHECK_REQUESTS: u32 = 1024;
const INTERVALS_PER_REQUEST_MIN: f64 = 0.25;

/// Requests after a measurement that ended so before the next: it cost nothing, and the client
/// may have changed its pattern (a burst of metadata reads, then one request at a time).
const REMEASURE_AFTER_RARE: u32 = 1 << 16;

/// How the server's connections' measurements ended, since it started ([`super::ServerStats`]).
#[derive(Debug, Default)]
pub(crate) struct TurnChoices {
    pub(crate) hand_over: AtomicU64,
    pub(crate) keep: AtomicU64,
    /// Ended with the turn kept because the client gave too few round trips to time.
    pub(crate) too_few_round_trips: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring window `window` (even: keeping the turn, odd: handing it over): its requests,
    /// and the intervals counted among them.
    Measuring { window: u8, requests: u32, intervals: u32 },
    /// Serving with the chosen way for `requests_left` more requests.
    Settled { hand_over: bool, requests_left: u32 },
}

/// One connection's choice, and its measurement; kept by the reader holding the turn.
#[derive(Debug)]
pub(crate) struct RoundTrips {
    phase: Phase,
    /// Sum of the counted intervals (ns) and their count, keeping the turn and handing it over.
    total_ns: [u64; 2],
    counted: [u32; 2],
    /// When the last request that came alone arrived; `None` after one that came in a burst.
    last_alone: Option<Instant>,
    /// False once a measurement found too few round trips (the client keeps requests in flight
    /// or sends at its own pace), until the next measurement finds enough.
    client_waits: bool,
    choices: Arc<TurnChoices>,
}

impl RoundTrips {
    /// A new connection measures from its first request.
    pub(crate) fn new(choices: Arc<TurnChoices>) -> RoundTrips {
        RoundTrips { phase: MEASURING, total_ns: [0; 2], counted: [0; 2], last_alone: None, client_waits: true, choices }
    }

    /// Whether the readers hand the turn over now.
    pub(crate) fn hands_over(&self) -> bool {
        match self.phase {
            Phase::Measuring { window, .. } => window % 2 == 1,
            Phase::Settled { hand_over, .. } => hand_over,
        }
    }

    /// Whether the client waits for each reply before it sends again, as far as the last
    /// measurement saw (a new connection is taken to): then a reader that finds the socket
    /// empty sleeps in `recv`, whose wake-up costs the client's `send` least, instead of in
    /// `poll`, which lets a burst gather first (see `DeadlineSocket::read`).
    pub(crate) fn client_waits(&self) -> bool {
        self.client_waits
    }

    /// A request arrived; `alone`: its header was not already buffered. `now_and_idle` (the
    /// time, and whether nothing of the connection was in flight) is asked only while
    /// measuring: a settled connection reads no clock and takes no lock per request.
    pub(crate) fn arrived(&mut self, alone: bool, now_and_idle: impl FnOnce() -> (Instant, bool)) {
        if alone && matches!(self.phase, Phase::Measuring { .. }) {
            let (now, idle) = now_and_idle();
            self.arrived_alone(now, idle);
        } else {
            self.arrived_untimed();
        }
    }

    /// A request arrived in a burst, or while no measurement runs: no interval ends with it.
    fn arrived_untimed(&mut self) {
        self.last_alone = None;
        self.count_request();
    }

    /// A request arrived alone at `now`, while measuring; `idle`: nothing of the connection
    /// was in flight.
    fn arrived_alone(&mut self, now: Instant, idle: bool) {
        let interval = self.last_alone.replace(now).map(|last| now.saturating_duration_since(last));
        match interval {
            Some(interval) if idle && interval <= ROUND_TRIP_MAX => self.count_interval(interval),
            _ => {}
        }
        self.count_request();
    }

    fn count_interval(&mut self, interval: Duration) {
        let Phase::Measuring { window, requests, intervals } = self.phase else { return };
        self.phase = Phase::Measuring { window, requests, intervals: intervals + 1 };
        if intervals == 0 {
            return;
        }
        let way = usize::from(window % 2 == 1);
        self.total_ns[way] += interval.as_nanos() as u64;
        self.counted[way] += 1;
        if intervals + 1 >= WINDOW_SAMPLES {
            self.next_window(window);
        }
    }

    fn count_request(&mut self) {
        match self.phase {
            Phase::Settled { requests_left: 0 | 1, .. } => self.measure(),
            Phase::Settled { hand_over, requests_left } => self.phase = Phase::Settled { hand_over, requests_left: requests_left - 1 },
            Phase::Measuring { window, requests, intervals } => {
                let requests = requests + 1;
                self.phase = Phase::Measuring { window, requests, intervals };
                if requests >= RARE_CHECK_REQUESTS && f64::from(intervals) < INTERVALS_PER_REQUEST_MIN * f64::from(requests) {
                    tracing::debug!(
                        window,
                        requests,
                        intervals,
                        "nbd: a connection's client does not wait for its replies: its readers keep the turn"
                    );
                    self.choices.too_few_round_trips.fetch_add(1, Ordering::Relaxed);
                    self.client_waits = false;
                    self.phase = Phase::Settled { hand_over: false, requests_left: REMEASURE_AFTER_RARE };
                }
            }
        }
    }

    fn measure(&mut self) {
        self.total_ns = [0; 2];
        self.counted = [0; 2];
        self.phase = MEASURING;
    }

    fn next_window(&mut self, window: u8) {
        if window + 1 < WINDOWS {
            self.phase = Phase::Measuring { window: window + 1, requests: 0, intervals: 0 };
            return;
        }
        let hand_over = self.hand_over_is_faster();
        tracing::debug!(
            hand_over,
            keep_us = self.mean_us(0),
            hand_over_us = self.mean_us(1),
            "nbd: a connection chose how its readers take turns"
        );
        let chosen = if hand_over { &self.choices.hand_over } else { &self.choices.keep };
        chosen.fetch_add(1, Ordering::Relaxed);
        self.client_waits = true;
        self.phase = Phase::Settled { hand_over, requests_left: SETTLED_REQUESTS };
    }

    fn hand_over_is_faster(&self) -> bool {
        let (keep_us, hand_over_us) = (self.mean_us(0), self.mean_us(1));
        keep_us > 0.0 && hand_over_us > 0.0 && hand_over_us <= keep_us * (1.0 - HAND_OVER_GAIN_MIN)
    }

    fn mean_us(&self, way: usize) -> f64 {
        match self.counted[way] {
            0 => 0.0,
            counted => self.total_ns[way] as f64 / f64::from(counted) / 1e3,
        }
    }
}

const MEASURING: Phase = Phase::Measuring { window: 0, requests: 0, intervals: 0 };

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds requests that each come alone to an idle connection, `keep` apart while the turn
    /// is kept and `hand_over` apart while it is handed over, until the phase settles; returns
    /// how many intervals that took.
    fn measure(trips: &mut RoundTrips, keep: Duration, hand_over: Duration) -> u32 {
        let mut now = Instant::now();
        let mut intervals = 0;
        trips.arrived_alone(now, true);
        while matches!(trips.phase, Phase::Measuring { .. }) {
            now += if trips.hands_over() { hand_over } else { keep };
            trips.arrived_alone(now, true);
            intervals += 1;
        }
        intervals
    }

    fn settled_requests_left(trips: &RoundTrips) -> u32 {
        match trips.phase {
            Phase::Settled { requests_left, .. } => requests_left,
            phase => panic!("not settled: {phase:?}"),
        }
    }

    #[test]
    fn handing_over_is_chosen_when_it_shortens_the_round_trip_and_kept_to_until_the_next_measurement() {
        let mut trips = RoundTrips::new(Arc::default());
        assert!(!trips.hands_over(), "a new connection measures, keeping the turn first");
        let intervals = measure(&mut trips, Duration::from_micros(60), Duration::from_micros(45));
        assert_eq!(intervals, WINDOW_SAMPLES * WINDOWS as u32);
        assert!(trips.hands_over(), "45 us against 60 us");
        assert_eq!(trips.choices.hand_over.load(Ordering::Relaxed), 1);
        // The request that ended the measurement was the first of the settled ones.
        let mut settled_requests = 1;
        while trips.hands_over() {
            trips.arrived_untimed();
            settled_requests += 1;
        }
        assert_eq!(settled_requests, SETTLED_REQUESTS);
        assert_eq!(trips.phase, MEASURING, "measured again");
    }

    /// The clock and the in-flight lock are asked for only by a request that came alone while
    /// measuring.
    #[test]
    fn only_a_request_alone_during_a_measurement_reads_the_clock() {
        let mut trips = RoundTrips::new(Arc::default());
        let mut probed = 0;
        trips.arrived(true, || {
            probed += 1;
            (Instant::now(), true)
        });
        assert_eq!(probed, 1, "alone, measuring");
        trips.arrived(false, || panic!("a request in a burst read the clock"));
        measure(&mut trips, Duration::from_micros(60), Duration::from_micros(60));
        assert!(matches!(trips.phase, Phase::Settled { .. }));
        trips.arrived(true, || panic!("a settled connection read the clock"));
    }

    #[test]
    fn a_tie_or_a_small_gain_keeps_the_turn() {
        for hand_over_us in [60, 57, 70] {
            let mut trips = RoundTrips::new(Arc::default());
            measure(&mut trips, Duration::from_micros(60), Duration::from_micros(hand_over_us));
            assert!(!trips.hands_over(), "{hand_over_us} us handing over against 60 us keeping");
            assert_eq!(trips.choices.keep.load(Ordering::Relaxed), 1);
            assert_eq!(settled_requests_left(&trips), SETTLED_REQUESTS - 1, "the request that ended the measurement counts");
        }
    }

    /// Handing over looks faster, but only where the connection was not idle, or across a
    /// pause far longer than a round trip: the hand-over window gathers no interval, and the
    /// measurement ends early with the turn kept.
    #[test]
    fn intervals_of_a_client_that_kept_requests_in_flight_or_paused_are_not_counted() {
        for (hand_over_gap, hand_over_idle) in [(Duration::from_micros(10), false), (ROUND_TRIP_MAX + Duration::from_micros(1), true)] {
            let mut trips = RoundTrips::new(Arc::default());
            let mut now = Instant::now();
            trips.arrived_alone(now, true);
            while matches!(trips.phase, Phase::Measuring { .. }) {
                let hand_over = trips.hands_over();
                now += if hand_over { hand_over_gap } else { Duration::from_micros(60) };
                trips.arrived_alone(now, !hand_over || hand_over_idle);
            }
            assert!(!trips.hands_over(), "{hand_over_gap:?} apart, idle {hand_over_idle}");
            assert_eq!(settled_requests_left(&trips), REMEASURE_AFTER_RARE);
        }
    }

    #[test]
    fn a_client_that_does_not_wait_for_its_replies_ends_the_measurement_at_once() {
        let mut trips = RoundTrips::new(Arc::default());
        assert!(trips.client_waits(), "a new connection's client is taken to wait for its replies");
        let mut now = Instant::now();
        let mut requests = 0;
        // One request in eight comes alone to an idle connection, as under a paced load.
        while matches!(trips.phase, Phase::Measuring { .. }) {
            now += Duration::from_micros(25);
            match requests % 8 {
                0 => trips.arrived_alone(now, true),
                _ => trips.arrived_untimed(),
            }
            requests += 1;
        }
        assert_eq!(requests, RARE_CHECK_REQUESTS, "the first check ends it");
        assert!(!trips.hands_over());
        assert_eq!(trips.choices.too_few_round_trips.load(Ordering::Relaxed), 1);
        assert!(!trips.client_waits(), "its readers let bursts gather (sleep in poll)");
        for _ in 0..REMEASURE_AFTER_RARE {
            trips.arrived_untimed();
        }
        assert_eq!(trips.phase, MEASURING, "measured again sooner than after a settled choice");
        assert!(!trips.client_waits(), "what the last measurement found holds while the next runs");
        // The client now waits for each reply: the measurement completes, and says so.
        measure(&mut trips, Duration::from_micros(60), Duration::from_micros(60));
        assert!(matches!(trips.phase, Phase::Settled { .. }));
        assert!(trips.client_waits());
    }
}
