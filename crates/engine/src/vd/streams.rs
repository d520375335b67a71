//! Where a member's recent reads ended: the sequential streams its head is serving. A mirror
//! sends a read that continues one of them to that copy (see `io::mirror`), so that each copy
//! keeps its own streams and reads them from its look-ahead, instead of every stream bouncing
//! between copies by queue depth and each copy seeking between all of them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Streams remembered per member: the review's multithreaded read runs up to four.
const STREAMS_TRACKED: usize = 4;

#[derive(Debug, Default)]
pub struct StreamEnds {
    ends_bytes: [AtomicU64; STREAMS_TRACKED],
    next: AtomicU32,
}

impl StreamEnds {
    /// A read ended at `end_bytes`: it replaces the stream it continued, or the oldest one.
    pub fn record(&self, start_bytes: u64, end_bytes: u64) {
        if let Some(slot) = self.ends_bytes.iter().find(|slot| slot.load(Ordering::Relaxed) == start_bytes) {
            slot.store(end_bytes, Ordering::Relaxed);
            return;
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed) as usize % STREAMS_TRACKED;
        self.ends_bytes[index].store(end_bytes, Ordering::Relaxed);
    }

    /// Whether a read at `offset_bytes` continues one of the streams.
    pub fn continues(&self, offset_bytes: u64) -> bool {
        offset_bytes != 0 && self.ends_bytes.iter().any(|slot| slot.load(Ordering::Relaxed) == offset_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stream_is_followed_and_the_oldest_gives_way() {
        let ends = StreamEnds::default();
        for stream in 0..4u64 {
            ends.record(stream << 30, (stream << 30) + 65536);
        }
        ends.record(65536, 131072);
        assert!(ends.continues(131072), "stream 0 moved on");
        assert!(!ends.continues(65536), "its old end is gone, not kept as a fifth stream");
        assert!((1..4u64).all(|stream| ends.continues((stream << 30) + 65536)));
        ends.record(5 << 30, (5 << 30) + 4096);
        assert!(ends.continues((5 << 30) + 4096));
        assert_eq!((0..4u64).filter(|&s| ends.continues(if s == 0 { 131072 } else { (s << 30) + 65536 })).count(), 3, "one gave way");
    }
}
