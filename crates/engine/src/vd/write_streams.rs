//! Sequential write streams of a parity VD, for write gathering (`io::gather`): the ends of the
//! last few writes that spanned rows, and of those among them that continued one of those (a
//! stream). A row piece that ends where a stream's write ends is that write's tail, and the
//! stream's next write will likely bring the rest of its row. Random writes, however large,
//! never continue one another, so their rows never wait. Relaxed atomics: a heuristic that a
//! race can only make wait or not wait once.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Writes remembered: at least the queue depth of one stream, so that a write's end is still
/// known when its tail reaches its shard.
const REMEMBERED: usize = 16;

#[derive(Default)]
pub(crate) struct WriteStreams {
    ends: [AtomicU64; REMEMBERED],
    next_end: AtomicUsize,
    stream_ends: [AtomicU64; REMEMBERED],
    next_stream_end: AtomicUsize,
}

impl WriteStreams {
    /// A write of `[start, end)` was submitted; `spans_rows`: it covers more than one row.
    pub(crate) fn note(&self, start_bytes: u64, end_bytes: u64, spans_rows: bool) {
        if !spans_rows {
            return;
        }
        let continues = self.ends.iter().any(|end| end.load(Ordering::Relaxed) == start_bytes && start_bytes != 0);
        let slot = self.next_end.fetch_add(1, Ordering::Relaxed) % REMEMBERED;
        self.ends[slot].store(end_bytes, Ordering::Relaxed);
        if continues {
            let slot = self.next_stream_end.fetch_add(1, Ordering::Relaxed) % REMEMBERED;
            self.stream_ends[slot].store(end_bytes, Ordering::Relaxed);
        }
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
        streams.note(0, 1 << 20, true);
        assert!(!streams.is_stream_end(1 << 20), "the first write continues nothing");
        streams.note(1 << 20, 2 << 20, true);
        assert!(streams.is_stream_end(2 << 20));
        streams.note(2 << 20, (2 << 20) + 4096, false);
        assert!(!streams.is_stream_end((2 << 20) + 4096), "a write within one row is no stream's");
        streams.note(7 << 20, 8 << 20, true);
        assert!(!streams.is_stream_end(8 << 20), "a random large write continues nothing");
    }
}
