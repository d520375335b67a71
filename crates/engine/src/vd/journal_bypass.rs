//! Which writes go around the journal: large writes of sequential streams, as bcache's
//! `sequential_cutoff` sends them around its cache and ZFS writes large blocks in place with
//! only a pointer in its log.
//!
//! Under WB (and WT with a journal) every byte is written twice: into the journal, then to the
//! members. For a stream of large writes that is pure cost: the members take full stripes at
//! their own speed, and a journal device (one SSD, often) caps a whole array's streaming writes
//! at its own bandwidth. So a write of a stream that has written at least `cutoff_bytes` in a
//! row, and that is at least a row long, goes straight to the members (`cache::bypass`), which
//! acknowledges it when they have it, as WT without a journal does. The shard still decides
//! whether it may (`cache::bypass::allowed`): only on a VD with every member in service, and
//! only where no journal record or row image a replay could lay over it is still live.
//!
//! It is on by default only where it changes nothing a crash can do: RAID0, JBOD and the mirror
//! levels, whose row writes the journal never logs as images anyway. On parity levels a row
//! written whole without an image marks its bitmap region unlogged, and a crash followed by a
//! restart without one member would then refuse the reads of that whole region (older,
//! acknowledged data in it included) until a resync, as md without a journal does: the write
//! hole the journal closes. So there the cutoff starts at 0 (never) and must be set on purpose
//! (`/cx/vx set seqcutoff=4MiB`: [`crate::config::SeqCutoff`], kept in the VD's record); the
//! simulator runs parity levels with it on.
//!
//! The stream table here is a heuristic (a race can only send a write one way or the other);
//! nothing that makes the bypass safe depends on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A stream's length, in bytes written in a row, from which its large writes go around the
/// journal (bcache's default sequential cutoff): the default of levels without parity.
pub const DEFAULT_CUTOFF_BYTES: u64 = 4 << 20;
/// The cutoff of a VD whose spans are `kind` unless it sets its own (`SeqCutoff`): on
/// without parity, off with it (module docs).
pub fn default_cutoff_bytes(kind: layout::SpanKind) -> u64 {
    match kind {
        layout::SpanKind::Parity | layout::SpanKind::DoubleParity => 0,
        _ => DEFAULT_CUTOFF_BYTES,
    }
}

/// Write streams tracked per VD.
const STREAMS_TRACKED: usize = 16;
/// A write continues a stream if it starts within this many of its own lengths of the
/// stream's end: requests of one stream may reach the VD slightly out of order at a queue
/// depth above one.
const REORDER_LENGTHS: u64 = 16;

#[derive(Clone, Copy, Default)]
struct Stream {
    end_bytes: u64,
    run_bytes: u64,
    /// When it was last continued, in writes noted (for replacing the oldest).
    used_at: u64,
}

pub struct JournalBypass {
    streams: Mutex<StreamTable>,
    cutoff_bytes: AtomicU64,
    writes: AtomicU64,
    bytes: AtomicU64,
    completed_rows: AtomicU64,
}

#[derive(Default)]
struct StreamTable {
    streams: [Stream; STREAMS_TRACKED],
    noted: u64,
}

impl Default for JournalBypass {
    fn default() -> Self {
        JournalBypass::with_cutoff_bytes(DEFAULT_CUTOFF_BYTES)
    }
}

impl JournalBypass {
    /// A VD's, with the cutoff of `bytes` (0: never).
    pub(crate) fn with_cutoff_bytes(cutoff_bytes: u64) -> JournalBypass {
        JournalBypass {
            streams: Mutex::new(StreamTable::default()),
            cutoff_bytes: AtomicU64::new(cutoff_bytes),
            writes: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            completed_rows: AtomicU64::new(0),
        }
    }

    /// Notes a client write of `len_bytes` at `offset_bytes` on a VD whose rows hold
    /// `row_bytes`, and says whether it is a candidate to go around the journal: a stream's
    /// write, at least a row long, once the stream has written the cutoff (this write counted).
    pub fn note_write(&self, offset_bytes: u64, len_bytes: u64, row_bytes: u64) -> bool {
        let cutoff_bytes = self.cutoff_bytes.load(Ordering::Relaxed);
        if cutoff_bytes == 0 || len_bytes < row_bytes {
            return false;
        }
        let mut table = self.streams.lock().expect("stream table lock");
        table.noted += 1;
        let noted = table.noted;
        let window_bytes = len_bytes.saturating_mul(REORDER_LENGTHS);
        let continues = |s: &Stream| s.run_bytes > 0 && offset_bytes.abs_diff(s.end_bytes) <= window_bytes;
        let index = match table.streams.iter().position(continues) {
            Some(index) => index,
            None => {
                let oldest = (0..STREAMS_TRACKED).min_by_key(|&i| table.streams[i].used_at).expect("a table has streams");
                table.streams[oldest] = Stream::default();
                oldest
            }
        };
        let stream = &mut table.streams[index];
        stream.end_bytes = stream.end_bytes.max(offset_bytes + len_bytes);
        stream.run_bytes = stream.run_bytes.saturating_add(len_bytes);
        stream.used_at = noted;
        stream.run_bytes >= cutoff_bytes
    }

    /// A stream's length from which its large writes go around the journal; 0: never.
    pub fn cutoff_bytes(&self) -> u64 {
        self.cutoff_bytes.load(Ordering::Relaxed)
    }

    pub fn set_cutoff_bytes(&self, bytes: u64) {
        self.cutoff_bytes.store(bytes, Ordering::Relaxed);
    }

    /// A write piece of `len_bytes` went around the journal.
    pub(crate) fn note_bypassed(&self, len_bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len_bytes, Ordering::Relaxed);
    }

    /// A write piece went around the journal with the cached rest of its row
    /// (`cache::bypass::complete_row`).
    pub(crate) fn note_completed_row(&self) {
        self.completed_rows.fetch_add(1, Ordering::Relaxed);
    }

    /// Rows written whole around the journal from a write and the cached rest of the row.
    pub fn completed_rows(&self) -> u64 {
        self.completed_rows.load(Ordering::Relaxed)
    }

    /// Write pieces that went around the journal, and their bytes.
    pub fn bypassed(&self) -> (u64, u64) {
        (self.writes.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const ROW: u64 = 448 << 10;

    #[test]
    fn a_stream_goes_around_from_the_cutoff_on_and_random_writes_never_do() {
        let bypass = JournalBypass::default();
        let sent: Vec<bool> = (0..6).map(|i| bypass.note_write(i * MIB, MIB, ROW)).collect();
        assert_eq!(sent, [false, false, false, true, true, true], "the fourth 1 MiB write reaches the 4 MiB cutoff");
        let random = JournalBypass::default();
        assert!((0..64).all(|i| !random.note_write((i * 7919 % 512) * 64 * MIB, MIB, ROW)), "far-apart writes never continue one another");
    }

    #[test]
    fn writes_shorter_than_a_row_and_a_zero_cutoff_never_go_around() {
        let bypass = JournalBypass::default();
        assert!((0..64).all(|i| !bypass.note_write(i * (256 << 10), 256 << 10, ROW)), "shorter than a row");
        bypass.set_cutoff_bytes(0);
        assert!((0..8).all(|i| !bypass.note_write(i * MIB, MIB, ROW)), "cutoff 0 turns it off");
    }

    #[test]
    fn a_stream_whose_writes_arrive_slightly_out_of_order_stays_one_stream() {
        let bypass = JournalBypass::default();
        let order = [0, 2, 1, 4, 3, 5];
        let sent: Vec<bool> = order.iter().map(|&i| bypass.note_write(i * MIB, MIB, ROW)).collect();
        assert_eq!(sent, [false, false, false, true, true, true]);
    }

    #[test]
    fn interleaved_streams_each_keep_their_own_run() {
        let bypass = JournalBypass::default();
        let far = 100 * 1024 * MIB;
        let mut sent = Vec::new();
        for i in 0..4 {
            sent.push(bypass.note_write(i * MIB, MIB, ROW));
            sent.push(bypass.note_write(far + i * MIB, MIB, ROW));
        }
        assert_eq!(sent, [false, false, false, false, false, false, true, true]);
    }
}
