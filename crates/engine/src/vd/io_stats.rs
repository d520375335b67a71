//! What a VD's clients saw: requests, bytes, errors and latency per kind of request, kept with
//! the VD object (a rename keeps them, a deletion drops them) for the daemon's metrics.
//!
//! The frontend that serves clients records a request when it answers it (the NBD export in
//! `storc`), so the latency is the client's: from submission to the answer, a FUA write's flush
//! included. Everything here is relaxed atomics on the data path, no lock: a request costs three
//! `fetch_add`s (bucket, time, bytes), four when it failed. Each kind sits on its own cache
//! lines, so readers and writers do not share them. A snapshot reads the atomics one by one: a
//! request recorded meanwhile may show in one field and not yet in another, which Prometheus'
//! rate arithmetic absorbs; its count is the sum of its buckets, so a histogram is always whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The kinds of client request counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read = 0,
    /// Writes and write-zeroes (the bytes they cover).
    Write = 1,
    Flush = 2,
}

impl IoKind {
    pub const ALL: [IoKind; 3] = [IoKind::Read, IoKind::Write, IoKind::Flush];

    /// Lower case, as a metric label: `read`, `write`, `flush`.
    pub fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
        }
    }
}

/// Upper bounds of the latency buckets, in ns: 25 us to 10 s, about three per decade (the
/// span from a memory drive's Fast Path read to a hard disk queue under a rebuild). A request
/// slower than the last bound counts only in the implicit +Inf bucket.
pub const LATENCY_BUCKET_BOUNDS_NS: [u64; 18] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

const BUCKETS: usize = LATENCY_BUCKET_BOUNDS_NS.len() + 1;

/// One kind's counters, aligned so that two kinds never share a cache line.
#[repr(align(64))]
#[derive(Default)]
struct KindStats {
    /// Requests per latency bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; BUCKETS],
    latency_sum_ns: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// A VD's client requests by kind (see the module docs).
#[derive(Default)]
pub struct ClientIoStats {
    kinds: [KindStats; 3],
}

/// One kind's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IoKindSnapshot {
    /// Requests answered, failed ones included: the sum of `buckets`.
    pub requests: u64,
    pub bytes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests per bucket of [`LATENCY_BUCKET_BOUNDS_NS`], not cumulative; one more entry
    /// than there are bounds (the requests slower than the last).
    pub buckets: Vec<u64>,
    pub latency_sum_seconds: f64,
}

impl ClientIoStats {
    /// Books one answered request of `kind` over `bytes`, which took `latency`.
    pub fn record(&self, kind: IoKind, bytes: u64, latency: Duration, ok: bool) {
        let stats = &self.kinds[kind as usize];
        let latency_ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        stats.buckets[bucket_of(latency_ns)].fetch_add(1, Ordering::Relaxed);
        stats.latency_sum_ns.fetch_add(latency_ns, Ordering::Relaxed);
        if bytes > 0 {
            stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if !ok {
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self, kind: IoKind) -> IoKindSnapshot {
        let stats = &self.kinds[kind as usize];
        let buckets: Vec<u64> = stats.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        IoKindSnapshot {
            requests: buckets.iter().sum(),
            bytes: stats.bytes.load(Ordering::Relaxed),
            errors: stats.errors.load(Ordering::Relaxed),
            buckets,
            latency_sum_seconds: stats.latency_sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The bucket a latency falls in: the first whose bound it does not exceed (Prometheus' `le`).
fn bucket_of(latency_ns: u64) -> usize {
    LATENCY_BUCKET_BOUNDS_NS.partition_point(|&bound| bound < latency_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_falls_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(25_000), 0, "le is inclusive");
        assert_eq!(bucket_of(25_001), 1);
        assert_eq!(bucket_of(1_000_000), 5);
        assert_eq!(bucket_of(10_000_000_000), LATENCY_BUCKET_BOUNDS_NS.len() - 1);
        assert_eq!(bucket_of(10_000_000_001), LATENCY_BUCKET_BOUNDS_NS.len(), "slower than every bound: +Inf only");
        assert!(LATENCY_BUCKET_BOUNDS_NS.windows(2).all(|pair| pair[0] < pair[1]), "bounds ascend");
    }

    #[test]
    fn kinds_are_counted_apart_and_a_snapshot_is_whole() {
        let stats = ClientIoStats::default();
        stats.record(IoKind::Read, 4096, Duration::from_micros(40), true);
        stats.record(IoKind::Read, 8192, Duration::from_millis(3), false);
        stats.record(IoKind::Write, 1 << 20, Duration::from_secs(20), true);
        stats.record(IoKind::Flush, 0, Duration::from_micros(10), true);
        let read = stats.snapshot(IoKind::Read);
        assert_eq!((read.requests, read.bytes, read.errors), (2, 12288, 1));
        assert_eq!(read.buckets[1], 1, "40 us: the 50 us bucket");
        assert_eq!(read.buckets[7], 1, "3 ms: the 5 ms bucket");
        assert!((read.latency_sum_seconds - 0.00304).abs() < 1e-9, "{}", read.latency_sum_seconds);
        let write = stats.snapshot(IoKind::Write);
        assert_eq!((write.requests, write.bytes, write.errors), (1, 1 << 20, 0));
        assert_eq!(write.buckets.last(), Some(&1), "20 s is past every bound");
        let flush = stats.snapshot(IoKind::Flush);
        assert_eq!((flush.requests, flush.bytes, flush.buckets[0]), (1, 0, 1));
    }
}
