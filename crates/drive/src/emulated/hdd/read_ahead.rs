//! The read look-ahead segment of the hard-disk model (see the module above): what the buffer
//! holds while the head streams on after a read, and when the head reaches a given offset.

use super::super::geometry::Platter;
use super::super::Command;

/// The look-ahead segment: `[held_start(t), held_end(t))` is in the buffer at time `t`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadAhead {
    /// Where the access that started the stream began; the segment holds from here, or from
    /// `segment_bytes` before what the head has read, whichever is later.
    pub(super) segment_start_bytes: u64,
    /// What one segment holds: twice the look-ahead (what the head reads ahead of the reader
    /// and as much behind it, for queued reads that arrive out of order). A stream read on for
    /// seconds keeps only its last stretch, not everything since it began.
    pub(super) segment_bytes: u64,
    /// The head was exactly here at `stream_start_ns` and read on from there.
    pub(super) stream_from_bytes: u64,
    pub(super) stream_start_ns: u64,
    /// The segment is full here; the head stops reading.
    pub(super) limit_bytes: u64,
    /// Another access took the head at this time; `u64::MAX` while none has.
    pub(super) stopped_ns: u64,
    /// The head reads on at least to here before another access may take it: a detected
    /// stream's minimum prefetch (see [`HddModel::head_free_ns`]); `stream_from_bytes` for a
    /// read that did not continue a stream.
    pub(super) prefetch_to_bytes: u64,
}

impl ReadAhead {
    pub(super) fn held_end_bytes(&self, platter: &Platter, at_ns: u64) -> u64 {
        let until_ns = at_ns.min(self.stopped_ns);
        if until_ns <= self.stream_start_ns {
            return self.stream_from_bytes;
        }
        let reached = platter.offset_after(self.stream_from_bytes, (until_ns - self.stream_start_ns) as f64);
        reached.min(self.limit_bytes)
    }

    pub(super) fn is_streaming(&self, platter: &Platter, at_ns: u64) -> bool {
        at_ns < self.stopped_ns && self.held_end_bytes(platter, at_ns) < self.limit_bytes
    }

    /// Where what the segment holds at `at_ns` begins.
    pub(super) fn held_start_bytes(&self, platter: &Platter, at_ns: u64) -> u64 {
        self.segment_start_bytes.max(self.held_end_bytes(platter, at_ns).saturating_sub(self.segment_bytes))
    }

    pub(super) fn holds_start_of(&self, platter: &Platter, command: &Command, at_ns: u64) -> bool {
        self.held_start_bytes(platter, at_ns) <= command.offset_bytes && command.offset_bytes <= self.held_end_bytes(platter, at_ns)
    }

    /// Whether the head, still streaming, will reach the command's start before the segment is
    /// full: a read that skips a little ahead of the stream (RAID5's parity strip, 64 KiB) waits
    /// for the head to come round to it instead of paying a revolution.
    pub(super) fn will_hold_start_of(&self, platter: &Platter, command: &Command, at_ns: u64) -> bool {
        self.held_start_bytes(platter, at_ns) <= command.offset_bytes
            && command.offset_bytes < self.limit_bytes
            && self.is_streaming(platter, at_ns)
    }

    /// When the head, streaming, reaches `offset_bytes` (at once if it passed it).
    pub(super) fn reaches_ns(&self, platter: &Platter, offset_bytes: u64) -> f64 {
        let ahead_bytes = offset_bytes.saturating_sub(self.stream_from_bytes);
        self.stream_start_ns as f64 + platter.transfer_ns(self.stream_from_bytes, ahead_bytes)
    }

    /// When the head has read the minimum prefetch (at once if it has, or has none).
    pub(super) fn prefetched_ns(&self, platter: &Platter) -> u64 {
        let bytes = self.prefetch_to_bytes.min(self.limit_bytes).saturating_sub(self.stream_from_bytes);
        self.stream_start_ns + platter.transfer_ns(self.stream_from_bytes, bytes).ceil() as u64
    }
}
