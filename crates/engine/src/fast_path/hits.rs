//! Cache hits on the submitting thread: a read that the controller cache's clean lines hold
//! whole is copied out where it was submitted, with no hop to the shard that owns its row.
//!
//! A hop costs two thread wake-ups (to the shard, and back to the submitter's completion),
//! which at queue depth 1 are nearly all of a hit's latency: a 4 KiB hit from RAM would take
//! as long as a read from a fast SSD. The lines are shared with the owning shard under a mutex
//! (`cache::clean`), which only the shard changes, and every write changes the lines it
//! overlaps before it is acknowledged: a hit taken after an acknowledgement sees that write.
//!
//! Only for VDs that keep or fetch clean data (`iopolicy=cached`, or a read-ahead policy):
//! other VDs hold no lines, and would pay a lookup on every read for nothing. A read that
//! misses, or lies over two rows (two owners), goes the usual way.

use crate::cache::clean;
use crate::config::{IoPolicy, ReadPolicy};
use crate::vd::VdCompletion;
use crate::{Done, Engine, VdState, VirtualDrive};
use drive::IoBuf;
use std::sync::Arc;

impl Engine {
    /// Serves a read from the owning shard's clean lines on this thread if they hold all of
    /// it; hands the buffer and callback back otherwise.
    pub(crate) fn cache_hit(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, mut buf: IoBuf, done: Done) -> Result<(), (IoBuf, Done)> {
        if !may_hold_lines(vd) || !serving(vd) {
            return Err((buf, done));
        }
        let len_bytes = buf.len() as u64;
        let mut rows = vd.geometry().rows(offset_bytes, len_bytes);
        let Some(row) = rows.next().filter(|_| rows.next().is_none()) else { return Err((buf, done)) };
        let lines = &self.shards[self.shard_of_row(vd, row.row)].clean_lines;
        if !clean::serve_hit(lines, vd.instance_id(), offset_bytes..offset_bytes + len_bytes, buf.as_mut_slice()) {
            return Err((buf, done));
        }
        // Counted in flight on entry (`Engine::submit`): `finish` ends that count.
        vd.finish(VdCompletion { result: Ok(()), buf: Some(buf) }, done, false);
        Ok(())
    }
}

/// Whether the VD's reads keep what they read or read ahead into the cache.
fn may_hold_lines(vd: &VirtualDrive) -> bool {
    vd.io_policy() == IoPolicy::Cached || vd.read_policy() != ReadPolicy::NoReadAhead
}

/// Whether the VD serves reads now: an offline one fails them (the normal path says why), and
/// an initializing one is written behind the cache's back.
fn serving(vd: &VirtualDrive) -> bool {
    vd.state() != VdState::Offline && !vd.is_retired() && !vd.is_initializing()
}
