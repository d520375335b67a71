//! Sequential write streams of a parity VD, for write gathering (`io::gather`): the ends of the
//! last few writes that spanned rows, and of those among them that continued one of those (a
//! stream), and how many such writes are in flight. A row piece that ends where a stream's
//! write ends is that write's tail, and while another of them is in flight the stream's next
//! write will likely bring the rest of its row. Random writes, however large, never continue
//! one another, and a writer at queue depth 1 has none other in flight, so their rows never
//! wait. Relaxed atomics for the ends: a heuristic that a race can only make wait or not wait
//! once.

use super::VirtualDrive;
use crate::Done;
use layout::SpanKind;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Notes a client write of `[offset, offset + len)` and counts it in flight until it completes,
/// if it spans rows of a parity VD; any other write gets `done` back unchanged. Called before
/// the write is cut into shards' pieces: a piece cannot tell whether it is the tail of a
/// stream's write.
pub(crate) fn track(vd: &Arc<VirtualDrive>, offset_bytes: u64, len_bytes: u64, done: Done) -> Done {
    let (row_bytes, end_bytes) = (vd.geometry().row_data_bytes(), offset_bytes + len_bytes);
    let spans_rows = len_bytes > 0 && offset_bytes / row_bytes != (end_bytes - 1) / row_bytes;
    if !spans_rows || !matches!(vd.geometry().span_kind(), SpanKind::Parity | SpanKind::DoubleParity) {
        return done;
    }
    vd.write_streams.note(offset_bytes, end_bytes);
    vd.write_streams.begin();
    let vd = Arc::clone(vd);
    Box::new(move |completion| {
        vd.write_streams.end();
        done(completion)
    })
}

/// Writes remembered: at least the queue depth of one stream, so that a write's end is still
/// known when its tail reaches its shard (seed 003's streaming-write runs at QD 32; with 16, a
/// tail at that depth found its write forgotten and never waited for the next).
const REMEMBERED: usize = 64;

pub(crate) struct WriteStreams {
    ends: [AtomicU64; REMEMBERED],
    next_end: AtomicUsize,
    stream_ends: [AtomicU64; REMEMBERED],
    next_stream_end: AtomicUsize,
    /// Writes spanning rows submitted and not yet completed.
    in_flight: AtomicUsize,
    /// How long a row waited before the stream's next write joined it: a moving average over
    /// about eight joins, doubled after a wait that nothing joined (0: none yet).
    join_wait_ns: AtomicU64,
}

impl Default for WriteStreams {
    fn default() -> WriteStreams {
        WriteStreams {
            ends: std::array::from_fn(|_| AtomicU64::new(0)),
            next_end: AtomicUsize::new(0),
            stream_ends: std::array::from_fn(|_| AtomicU64::new(0)),
            next_stream_end: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            join_wait_ns: AtomicU64::new(0),
        }
    }
}

impl WriteStreams {
    /// A write of `[start, end)` spanning rows was submitted.
    fn note(&self, start_bytes: u64, end_bytes: u64) {
        let continues = self.ends.iter().any(|end| end.load(Ordering::Relaxed) == start_bytes && start_bytes != 0);
        let slot = self.next_end.fetch_add(1, Ordering::Relaxed) % REMEMBERED;
        self.ends[slot].store(end_bytes, Ordering::Relaxed);
        if continues {
            let slot = self.next_stream_end.fetch_add(1, Ordering::Relaxed) % REMEMBERED;
            self.stream_ends[slot].store(end_bytes, Ordering::Relaxed);
        }
    }

    /// A row's wait ended: `joined_after` is how long it waited until the next write joined
    /// it, `None` if none did before the wait ran out (`longest`: the cap of a wait).
    pub(crate) fn note_wait(&self, joined_after: Option<Duration>, longest: Duration) {
        let mean_ns = self.join_wait_ns.load(Ordering::Relaxed);
        let updated_ns = match joined_after {
            Some(waited) if mean_ns == 0 => waited.as_nanos() as u64,
            Some(waited) => mean_ns - mean_ns / 8 + waited.as_nanos() as u64 / 8,
            // Still unknown (0): the next wait is the longest anyway.
            None => (mean_ns * 2).min(longest.as_nanos() as u64),
        };
        self.join_wait_ns.store(updated_ns, Ordering::Relaxed);
    }

    /// How long a row waits for the next write of a stream: twice the usual wait before a
    /// join, from `shortest` to `longest` (the longest until a join has been seen).
    pub(crate) fn wait(&self, shortest: Duration, longest: Duration) -> Duration {
        match self.join_wait_ns.load(Ordering::Relaxed) {
            0 => longest,
            mean_ns => (Duration::from_nanos(mean_ns) * 2).clamp(shortest, longest),
        }
    }

    /// A write spanning rows was submitted ([`WriteStreams::end`] when it completes, before its
    /// client hears, so that the next write of a closed-loop client never counts it).
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn end(&self) {
        let before = self.in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "more writes spanning rows completed than were submitted");
    }

    /// Whether a write spanning rows other than the caller's is in flight.
    pub(crate) fn others_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 1
    }

    /// Whether a write of a stream ends at `end_bytes`.
    pub(crate) fn is_stream_end(&self, end_bytes: u64) -> bool {
        self.stream_ends.iter().any(|end| end.load(Ordering::Relaxed) == end_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_that_continue_a_write_spanning_rows_are_stream_ends() {
        let streams = WriteStreams::default();
        streams.note(0, 1 << 20);
        assert!(!streams.is_stream_end(1 << 20), "the first write continues nothing");
        streams.note(1 << 20, 2 << 20);
        assert!(streams.is_stream_end(2 << 20));
        streams.note(7 << 20, 8 << 20);
        assert!(!streams.is_stream_end(8 << 20), "a random large write continues nothing");
    }
}
