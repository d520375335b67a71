//! Reads through the cache: served from dirty and clean data where every byte is held, else
//! from the members with dirty data laid over; kept as clean data under `iopolicy=cached`;
//! and read-ahead, which brings ranges in before they are asked for (see
//! [`crate::vd::policy`] for when).

use super::clean::Fill;
use super::extents::{DirtyMap, Extent};
use super::ShardCache;
use crate::config::IoPolicy;
use crate::io;
use crate::runtime::Reactor;
use crate::vd::{VdCompletion, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

/// Bytes of read-ahead buffers a shard keeps for reuse: a window's buffer (up to 4 MiB) fresh
/// from malloc was faulted in and zeroed page by page, a third of the shards' CPU under ADRA
/// with four streams; the reads fill every byte, so a reused one needs no zeroing.
const PREFETCH_BUFS_IDLE_BYTES_MAX: usize = 64 << 20;

thread_local! {
    static PREFETCH_BUFS: drive::BufPool = drive::BufPool::new(PREFETCH_BUFS_IDLE_BYTES_MAX);
}

/// Read-aheads in flight per shard at most; more are dropped (read-ahead is advice). Enough
/// for every stream ADRA tracks to have its window and the next one on their way on one shard
/// (a window over rows of both shards is two): readers whose hits are served on their own
/// thread reach the end of a window before it is in, and a window dropped is read by misses.
pub const PREFETCHES_IN_FLIGHT_MAX: usize = 32;

pub(super) async fn read(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, mut buf: IoBuf) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    let range = offset_bytes..offset_bytes + buf.len() as u64;
    if cache.serve_from_memory(&vd, &range, buf.as_mut_slice()) {
        return VdCompletion { result: Ok(()), buf: Some(buf) };
    }
    // A read-ahead (or another read) is bringing this range in: wait for it rather than read
    // the members twice.
    let pending = cache.clean.borrow().fill_covering(vd.instance_id(), &range);
    if let Some(fill) = pending {
        fill.wait().await;
        if cache.serve_from_memory(&vd, &range, buf.as_mut_slice()) {
            return VdCompletion { result: Ok(()), buf: Some(buf) };
        }
    }
    cache.clean.borrow().count_miss();
    let keep = vd.io_policy() == IoPolicy::Cached;
    let (snapshot, fill) = cache.begin_member_read(&vd, &range, keep, false);
    let mut completion = io::serve(reactor, Arc::clone(&vd), VdRequest::Read { offset_bytes, buf }).await;
    if completion.result.is_ok() {
        let out = completion.buf.as_mut().expect("a read returns its buffer");
        overlay(snapshot, &range, out.as_mut_slice());
    }
    cache.end_member_read(&vd, fill, &range, completion.buf.as_ref().filter(|_| completion.result.is_ok()));
    completion
}

/// Reads `range` (owned by this shard) into the clean cache, unless it is held or on its way
/// already, or too many read-aheads are in flight.
pub(crate) async fn prefetch(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, range: Range<u64>) {
    if vd.is_retired() || vd.is_initializing() || vd.state() == crate::VdState::Offline {
        return;
    }
    let cache = Rc::clone(reactor.cache());
    let range = {
        let clean = cache.clean.borrow();
        let range = clean.trim_held(vd.instance_id(), range);
        let busy = clean.prefetches_in_flight() >= PREFETCHES_IN_FLIGHT_MAX || clean.fill_covering(vd.instance_id(), &range).is_some();
        if busy || range.is_empty() {
            return;
        }
        range
    };
    let (snapshot, fill) = cache.begin_member_read(&vd, &range, true, true);
    let buf = PREFETCH_BUFS.with(|pool| pool.take((range.end - range.start) as usize));
    let mut completion = io::serve(reactor, Arc::clone(&vd), VdRequest::Read { offset_bytes: range.start, buf }).await;
    if completion.result.is_ok() {
        let out = completion.buf.as_mut().expect("a read returns its buffer");
        overlay(snapshot, &range, out.as_mut_slice());
        cache.clean.borrow().count_read_ahead(range.end - range.start);
    }
    cache.end_member_read(&vd, fill, &range, completion.buf.as_ref().filter(|_| completion.result.is_ok()));
}

/// Dirty extents a member read of a range must lay over what the members return.
type Snapshot = Vec<(u64, Extent)>;

/// A fill of the clean cache, and what the Fast Path's writes were when it began.
type KeptFill = (Rc<Fill>, crate::vd::FillTicket);

fn overlay(snapshot: Snapshot, range: &Range<u64>, out: &mut [u8]) {
    assert_eq!(out.len() as u64, range.end - range.start, "the buffer is the range read");
    if snapshot.is_empty() {
        return;
    }
    let mut overlay = DirtyMap::default();
    for (offset, extent) in snapshot {
        overlay.insert(offset, extent);
    }
    overlay.overlay(range.clone(), out);
}

impl ShardCache {
    /// Serves a read from dirty and clean data if together they hold all of it.
    fn serve_from_memory(&self, vd: &VirtualDrive, range: &Range<u64>, out: &mut [u8]) -> bool {
        let vds = self.vds.borrow();
        let dirty = vds.get(&vd.instance_id()).map(|c| &c.dirty);
        if dirty.is_some_and(|d| d.covers(range.clone())) {
            dirty.expect("checked").overlay(range.clone(), out);
            return true;
        }
        if !self.clean.borrow().copy_out(vd.instance_id(), range.clone(), out) {
            return false;
        }
        if let Some(dirty) = dirty {
            dirty.overlay(range.clone(), out);
        }
        true
    }

    /// Before a member read: the dirty data to lay over it and, if it is to be kept, its fill
    /// (registered in the same step, so that any later write poisons it).
    fn begin_member_read(&self, vd: &VirtualDrive, range: &Range<u64>, keep: bool, prefetch: bool) -> (Snapshot, Option<KeptFill>) {
        let snapshot = match self.vds.borrow().get(&vd.instance_id()) {
            Some(cache) => cache.dirty.overlapping(range.clone()).map(|(o, e)| (o, e.clone())).collect(),
            None => Vec::new(),
        };
        let fill = keep.then(|| {
            let ticket = vd.begin_clean_fill();
            (self.clean.borrow_mut().begin_fill(vd.instance_id(), range.clone(), prefetch, vd.init_epoch()), ticket)
        });
        (snapshot, fill)
    }

    /// After a member read: keeps what it read (`data`, dirty data laid over) unless a write
    /// poisoned the fill or the VD went away.
    fn end_member_read(&self, vd: &VirtualDrive, fill: Option<KeptFill>, range: &Range<u64>, data: Option<&IoBuf>) {
        let Some((fill, ticket)) = fill else { return };
        let mut clean = self.clean.borrow_mut();
        let current = !fill.is_poisoned() && !vd.is_retired() && !vd.is_initializing() && vd.init_epoch() == fill.init_epoch;
        let current = current && vd.clean_fill_may_keep(ticket);
        if let Some(data) = data.filter(|_| current) {
            let room = self.limit_bytes.get().saturating_sub(self.bytes.get());
            clean.insert(vd.instance_id(), range.start, data.as_slice(), room);
        }
        clean.end_fill(&fill);
    }
}
