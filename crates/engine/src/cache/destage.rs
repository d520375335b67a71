//! Destaging: what goes to the members when, in VD order, and the journal checkpoints that
//! follow. See the module above for the rules it keeps.

use super::extents::Extent;
use super::{release_extent, ShardCache, BACKGROUND_RUNS_IN_FLIGHT_MAX, RUNS_IN_FLIGHT_MAX, RUN_BYTES_MAX};
use crate::io;
use crate::runtime::Reactor;
use crate::vd::{VdError, VdRequest, VirtualDrive};
use drive::IoBuf;
use layout::SpanKind;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Starts destage runs while there is reason to and room in flight.
pub(crate) fn pump(reactor: &Rc<Reactor>) {
    let cache = reactor.cache();
    let limit = cache.limit_bytes.get();
    // Pinned data cannot be destaged: the watermarks look at the rest.
    let destageable = cache.bytes.get().saturating_sub(cache.pinned_bytes.get());
    if destageable > limit / 4 * 3 {
        cache.draining.set(true);
    } else if destageable <= limit / 2 {
        cache.draining.set(false);
    }
    let urgent = cache.draining.get() || cache.forced.get() > 0;
    // Looking for old data means scanning every extent: only while a tick found some.
    let old_before = if cache.aging.get() { Instant::now().checked_sub(cache.age_limit.get()) } else { None };
    let reclaiming = journal_short_of_room(cache);
    if reclaiming && cache.pinned_bytes.get() > 0 {
        super::relocate::relocate_tail(reactor);
    }
    let runs_max = if urgent { RUNS_IN_FLIGHT_MAX } else { BACKGROUND_RUNS_IN_FLIGHT_MAX };
    while cache.runs_in_flight.get() < runs_max {
        let picked = if reclaiming { pick_oldest(cache) } else { None };
        let Some(run) = picked.or_else(|| pick_run(cache, urgent, old_before)) else { break };
        cache.runs_in_flight.set(cache.runs_in_flight.get() + 1);
        let reactor2 = Rc::clone(reactor);
        reactor.spawn(async move { destage_run(reactor2, run).await });
    }
    checkpoint_if_due(reactor);
}

/// A destage run: its VD, where it starts, the extents it writes from there (contiguous, in
/// order), and on parity levels, when those lie inside one row, the row's other idle extents
/// (`siblings`, in order), written with them as one scattered row write.
pub(super) struct Run {
    vd: Arc<VirtualDrive>,
    offset_bytes: u64,
    extents: Vec<(u64, Extent)>,
    siblings: Vec<(u64, Extent)>,
}

impl Run {
    fn all(&self) -> impl Iterator<Item = &(u64, Extent)> {
        self.extents.iter().chain(&self.siblings)
    }

    /// Its extents, with their VD offsets (contiguous, in order).
    pub(super) fn extents(&self) -> &[(u64, Extent)] {
        &self.extents
    }
}

/// The run of `vd`'s dirty extents that, with a write of `range` (inside one row of a parity
/// VD, not all of it), makes the row whole: the row's other bytes, all dirty, contiguous and
/// idle, none overlapping `range` (`cache::bypass::complete_row`). Marked busy and counted
/// in flight as any run, in the same step as its writer queues for the row's lock.
pub(super) fn take_completing_run(cache: &ShardCache, vd: &VirtualDrive, range: &Range<u64>) -> Option<Run> {
    let row_bytes = row_bytes(vd);
    let row = range.start / row_bytes * row_bytes..(range.start / row_bytes + 1) * row_bytes;
    assert!(range.end <= row.end && *range != row, "a completing write is a part of one row");
    let mut vds = cache.vds.borrow_mut();
    let entry = vds.get_mut(&vd.instance_id())?;
    let extents: Vec<(u64, Extent)> = entry.dirty.overlapping(row.clone()).map(|(o, e)| (o, e.clone())).collect();
    let (first, last) = (extents.first()?, extents.last()?);
    let (start, end) = (first.0, last.0 + last.1.len_bytes);
    let contiguous = extents.windows(2).all(|w| w[0].0 + w[0].1.len_bytes == w[1].0);
    let idle = extents.iter().all(|(o, e)| !e.stuck && !is_busy(entry, *o, e));
    let completes = (start == row.start && end == range.start && range.end == row.end)
        || (start == range.end && end == row.end && range.start == row.start);
    if !(contiguous && idle && completes) {
        return None;
    }
    entry.busy.push(start..end);
    cache.runs_in_flight.set(cache.runs_in_flight.get() + 1);
    Some(Run { vd: Arc::clone(&entry.vd), offset_bytes: start, extents, siblings: Vec::new() })
}

/// Most extents one scattered row write takes: bounds its row image's entries (each extent of
/// a 4 KiB write adds a data write and a parity column range) and its member operations.
const SCATTERED_EXTENTS_MAX: usize = 32;

/// Extents a look for old data examines per VD and pump: the dirty map is not ordered by age,
/// so the look goes round it a slice at a time instead of scanning all of it on every write.
const AGE_SCAN_EXTENTS: usize = 64;

/// The next run to destage: contiguous extents of one VD from its cursor on, none busy; when
/// not urgent, only one that starts with an extent older than `old_before`.
fn pick_run(cache: &ShardCache, urgent: bool, old_before: Option<Instant>) -> Option<Run> {
    if !urgent && old_before.is_none() {
        return None;
    }
    let mut vds = cache.vds.borrow_mut();
    for entry in vds.values_mut() {
        let eligible = |e: &Extent| urgent || old_before.is_some_and(|t| e.born <= t);
        let mut start = None;
        for (scanned, (offset, extent)) in entry.dirty.candidates(entry.cursor).enumerate() {
            if !urgent && scanned >= AGE_SCAN_EXTENTS {
                // Nothing old in this slice: the next look starts after it.
                entry.cursor = offset;
                break;
            }
            if eligible(extent) && !is_busy(entry, offset, extent) {
                start = Some(offset);
                break;
            }
        }
        if let Some(run) = start.and_then(|offset| take_run(entry, offset)) {
            return Some(run);
        }
    }
    None
}

fn is_busy(entry: &super::VdCache, offset: u64, extent: &Extent) -> bool {
    entry.busy.iter().any(|r| offset < r.end && r.start < offset + extent.len_bytes)
}

/// The run from the extent at `offset` (see [`run_from`]), marked busy, the elevator's cursor
/// moved past it; `None` if that extent is being destaged.
fn take_run(entry: &mut super::VdCache, offset: u64) -> Option<Run> {
    let extents = run_from(entry, offset);
    let end = extents.last().map(|(o, e)| o + e.len_bytes)?;
    let siblings = row_siblings(entry, offset..end, extents.len());
    entry.busy.push(offset..end);
    entry.busy.extend(siblings.iter().map(|(o, e)| *o..o + e.len_bytes));
    entry.cursor = end;
    Some(Run { vd: Arc::clone(&entry.vd), offset_bytes: offset, extents, siblings })
}

/// On a parity VD, the idle extents of the row that holds `run` (a part of one row, not all of
/// it) other than the run's own `taken` ones, in order, at most [`SCATTERED_EXTENTS_MAX`] in all.
fn row_siblings(entry: &super::VdCache, run: Range<u64>, taken: usize) -> Vec<(u64, Extent)> {
    let geometry = entry.vd.geometry();
    if !matches!(geometry.span_kind(), SpanKind::Parity | SpanKind::DoubleParity) {
        return Vec::new();
    }
    let row_bytes = geometry.row_data_bytes();
    let row = run.start / row_bytes * row_bytes..(run.start / row_bytes + 1) * row_bytes;
    if run.end > row.end || run == row {
        return Vec::new();
    }
    entry
        .dirty
        .candidates(row.start)
        .take_while(|(o, _)| row.contains(o))
        .filter(|(o, e)| !run.contains(o) && o + e.len_bytes <= row.end && !is_busy(entry, *o, e))
        .take(SCATTERED_EXTENTS_MAX.saturating_sub(taken))
        .map(|(o, e)| (o, e.clone()))
        .collect()
}

/// Whether the journal's records span more than half its ring: space comes back only as the
/// oldest records' data reaches the members, so destaging goes oldest first until it is not.
/// (In LBA order alone, the oldest record waits for a full sweep of the cache, and writers for
/// journal room with it.)
fn journal_short_of_room(cache: &ShardCache) -> bool {
    cache.journal().is_some_and(|journal| {
        let (used_bytes, capacity_bytes) = journal.usage();
        used_bytes > capacity_bytes / 2
    })
}

/// Extents found per look for the oldest records at least. A look scans every extent, so it
/// finds an eighth of them when there are more: the scans then cost a few extents per destage
/// run however large the cache is, where a fixed batch made them quadratic (with 50,000 dirty
/// 4 KiB extents per shard, a fifth of the CPU went to rescanning).
const RECLAIM_BATCH_MIN: usize = 64;

/// A run that starts with the extent holding the oldest journal record still cached (of those
/// not being destaged), and goes on over its contiguous neighbours.
fn pick_oldest(cache: &ShardCache) -> Option<Run> {
    if cache.reclaim.borrow().is_empty() {
        find_oldest(cache);
    }
    let mut vds = cache.vds.borrow_mut();
    while let Some((instance, offset, id)) = cache.reclaim.borrow_mut().pop_front() {
        let Some(entry) = vds.get_mut(&instance) else { continue };
        if !entry.dirty.holds(offset, id) {
            continue;
        }
        if let Some(run) = take_run(entry, offset) {
            return Some(run);
        }
    }
    None
}

/// Fills the reclaim queue with the extents that hold the oldest records (an eighth of them,
/// at least [`RECLAIM_BATCH_MIN`]).
fn find_oldest(cache: &ShardCache) {
    let extent_count: usize = cache.vds.borrow().values().map(|entry| entry.dirty.len()).sum();
    let batch = RECLAIM_BATCH_MIN.max(extent_count / 8);
    let mut oldest: std::collections::BinaryHeap<(u64, u64, u64, u64)> = std::collections::BinaryHeap::new();
    for (&instance, entry) in cache.vds.borrow().iter() {
        for (offset, extent) in entry.dirty.candidates(0) {
            let Some(sequence) = extent.sequence.iter().chain(&extent.superseded).min() else { continue };
            if oldest.len() < batch || oldest.peek().is_some_and(|top| *sequence < top.0) {
                oldest.push((*sequence, instance, offset, extent.id));
                if oldest.len() > batch {
                    oldest.pop();
                }
            }
        }
    }
    let mut queue = cache.reclaim.borrow_mut();
    queue.extend(oldest.into_sorted_vec().into_iter().map(|(_, instance, offset, id)| (instance, offset, id)));
}

/// The run from the extent at `offset` over its contiguous, idle neighbours (empty if that
/// extent is being destaged).
fn run_from(entry: &super::VdCache, offset: u64) -> Vec<(u64, Extent)> {
    let limit = RUN_BYTES_MAX.max(row_bytes(&entry.vd));
    let mut run: Vec<(u64, Extent)> = Vec::new();
    for (o, extent) in entry.dirty.candidates(offset) {
        let follows = match run.last() {
            None => o == offset,
            Some((last, e)) => last + e.len_bytes == o && run_bytes(&run) + extent.len_bytes <= limit,
        };
        if !follows || is_busy(entry, o, extent) {
            break;
        }
        run.push((o, extent.clone()));
    }
    run
}

fn run_bytes(run: &[(u64, Extent)]) -> u64 {
    run.iter().map(|(_, e)| e.len_bytes).sum()
}

fn row_bytes(vd: &VirtualDrive) -> u64 {
    vd.geometry().row_data_bytes()
}

/// Writes one run to the members through the VD's write path, then drops what it wrote from
/// the cache (the extents that are still the ones it took).
async fn destage_run(reactor: Rc<Reactor>, run: Run) {
    // One member write carries the contiguous extents: they must be back to back from the
    // run's offset, or data would land at the wrong VD offset.
    assert_eq!(run.extents.first().map(|(o, _)| *o), Some(run.offset_bytes), "a run starts with its first extent");
    assert!(run.extents.windows(2).all(|w| w[0].0 + w[0].1.len_bytes == w[1].0), "a run's extents are contiguous, in order");
    assert!(run.siblings.windows(2).all(|w| w[0].0 + w[0].1.len_bytes <= w[1].0), "a run's siblings are disjoint, in order");
    let (results, scattered) = write_run(&reactor, &run).await;
    finish_run(&reactor, &run, &results, scattered);
}

/// A run's member writes are done (`results`: one per extent, the run's then its siblings'):
/// what it wrote leaves the cache (the extents that are still the ones it took), what failed
/// is stuck, and the run no longer counts in flight.
pub(super) fn finish_run(reactor: &Rc<Reactor>, run: &Run, results: &[Result<(), VdError>], scattered: bool) {
    assert_eq!(results.len(), run.extents.len() + run.siblings.len(), "a result per extent");
    let cache = Rc::clone(reactor.cache());
    let journal = cache.journal();
    let vd = &run.vd;
    {
        let mut vds = cache.vds.borrow_mut();
        if let Some(entry) = vds.get_mut(&vd.instance_id()) {
            let starts: Vec<u64> = std::iter::once(run.offset_bytes).chain(run.siblings.iter().map(|(o, _)| *o)).collect();
            entry.busy.retain(|r| !starts.contains(&r.start));
            for ((offset, extent), result) in run.all().zip(results) {
                match result {
                    Ok(()) => {
                        if let Some(removed) = entry.dirty.remove_if(*offset, extent.id) {
                            cache.bytes.set(cache.bytes.get() - removed.len_bytes);
                            vd.note_cache_dirty(-(removed.len_bytes as i64));
                            if let Some(journal) = &journal {
                                release_extent(journal, &removed);
                            }
                        }
                    }
                    Err(error) => {
                        // Stuck data is tried again at every tick while its VD is not offline:
                        // the same failure is logged once, not ten times a second.
                        if entry.last_error.as_ref() != Some(error) {
                            tracing::warn!("{}: destage of {} bytes at {offset} failed: {error}", vd.name(), extent.len_bytes);
                        }
                        entry.last_error = Some(error.clone());
                        entry.dirty.mark_stuck(*offset, extent.id);
                    }
                }
            }
        }
        if results.iter().any(Result::is_ok) {
            cache.destaged_to.borrow_mut().insert(vd.instance_id(), Arc::clone(vd));
        }
        let mut counts = cache.destaged.get();
        match results.iter().all(Result::is_ok) {
            true => {
                counts.runs += 1;
                counts.bytes += run.all().map(|(_, e)| e.len_bytes).sum::<u64>();
                counts.scattered_runs += u64::from(scattered);
            }
            false => counts.failed_runs += 1,
        }
        cache.destaged.set(counts);
    }
    cache.runs_in_flight.set(cache.runs_in_flight.get() - 1);
    cache.wake_all();
    pump(reactor);
}

/// Puts a run on the members: with its siblings as one scattered row write where the row takes
/// one, else its contiguous extents as one write and then each sibling as one. A result per
/// extent (the run's, then its siblings'), and whether it went as one scattered write.
async fn write_run(reactor: &Rc<Reactor>, run: &Run) -> (Vec<Result<(), VdError>>, bool) {
    if !run.siblings.is_empty() {
        let row = run.offset_bytes / row_bytes(&run.vd);
        let writes: Vec<(u64, &[u8])> = run.all().map(|(o, e)| (*o, e.bytes())).collect();
        if let Some(result) = io::serve_scattered(Rc::clone(reactor), Arc::clone(&run.vd), row, &writes).await {
            return (vec![result; writes.len()], true);
        }
    }
    let parts: Vec<&[u8]> = run.extents.iter().map(|(_, extent)| extent.bytes()).collect();
    let buf = IoBuf::from_parts(&parts, run_bytes(&run.extents) as usize);
    let request = VdRequest::Write { offset_bytes: run.offset_bytes, buf };
    let result = io::serve(Rc::clone(reactor), Arc::clone(&run.vd), request).await.result;
    let mut results = vec![result; run.extents.len()];
    for (offset_bytes, extent) in &run.siblings {
        let request = VdRequest::Write { offset_bytes: *offset_bytes, buf: IoBuf::from_slice(extent.bytes()) };
        results.push(io::serve(Rc::clone(reactor), Arc::clone(&run.vd), request).await.result);
    }
    (results, false)
}

/// Writes a journal checkpoint when the live tail moved and either destaging went idle or the
/// ring is a quarter full.
fn checkpoint_if_due(reactor: &Rc<Reactor>) {
    let cache = reactor.cache();
    let Some(journal) = cache.journal().filter(|j| j.health().is_usable()) else { return };
    if !journal.checkpoint_due() {
        return;
    }
    let (used, capacity) = journal.usage();
    if cache.runs_in_flight.get() > 0 && used < capacity / 4 {
        return;
    }
    let reactor2 = Rc::clone(reactor);
    reactor.spawn(async move {
        let cache = Rc::clone(reactor2.cache());
        if let Err(error) = journal.checkpoint(&reactor2, flush_destaged(&reactor2)).await {
            tracing::warn!("journal checkpoint failed: {error}");
        }
        // Writers wait for ring space, and a quiesce for this checkpoint to end, either way.
        cache.wake_all();
    });
}

/// Flushes the members of every VD destaged to since the last checkpoint. The set is taken
/// when the future first runs, in the same step as the checkpoint takes its tail.
async fn flush_destaged(reactor: &Rc<Reactor>) -> Result<(), String> {
    let vds: Vec<Arc<VirtualDrive>> = reactor.cache().destaged_to.borrow_mut().drain().map(|(_, vd)| vd).collect();
    flush_vds(reactor, vds).await
}

/// Flushes the members of each of `vds`, one after the other; the first failure ends it.
pub(super) async fn flush_vds(reactor: &Rc<Reactor>, vds: impl IntoIterator<Item = Arc<VirtualDrive>>) -> Result<(), String> {
    for vd in vds {
        let done = io::serve(Rc::clone(reactor), vd, VdRequest::Flush).await;
        done.result.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes everything cached to the members and checkpoints the journal up to its head, so that
/// it holds nothing replay would apply: before a VD id can be used again (a deleted VD's
/// records must not be replayed into its successor), and before a failed journal is detached
/// (what only it held must be durable on the members first; a healthy-but-failed journal
/// cannot be checkpointed, so the members are flushed instead).
///
/// # Errors
/// Data that cannot be destaged (its VD is offline), or a failed checkpoint.
pub(crate) async fn quiesce(reactor: &Rc<Reactor>) -> Result<(), String> {
    let cache = Rc::clone(reactor.cache());
    cache.forced.set(cache.forced.get() + 1);
    let drained = loop {
        let stuck = cache.vds.borrow().values().any(|c| c.dirty.all().any(|e| e.stuck));
        if stuck && cache.runs_in_flight.get() == 0 {
            break Err("cached data cannot be written to its VD".to_string());
        }
        if cache.bytes.get() == 0 && cache.runs_in_flight.get() == 0 {
            break Ok(());
        }

        pump(reactor);
        cache.wait_for_change().await;
    };
    cache.forced.set(cache.forced.get() - 1);
    drained?;
    if !cache.journal().is_some_and(|j| j.health().is_usable()) {
        // No journal to checkpoint (or one that failed): the members' flush is what makes the
        // data durable, destaged or written on the imaged path alike.
        return flush_written(reactor).await;
    }
    while let Some(journal) = cache.journal().filter(|j| j.health().is_usable()) {
        if !journal.checkpoint_due() && !journal.is_checkpointing() {
            if journal.live_tail_sequence() != journal.next_sequence() {
                // Records whose data left the cache are still held by their writers, on their way
                // to acknowledging them: that data may be on the members unflushed, so the
                // checkpoint (and the flush before it) must pass these records too.
                cache.wait_for_change().await;
                continue;
            }
            return super::images_to_head(reactor).await;
        }
        match journal.checkpoint(reactor, flush_destaged(reactor)).await {
            Ok(true) => cache.wake_all(),
            // Another checkpoint is under way: wait for it, then look again.
            Ok(false) => cache.wait_for_change().await,
            // The journal failed meanwhile: the members' flush makes the data durable.
            Err(crate::journal::JournalError::Failed(_)) => return flush_written(reactor).await,
            Err(error) => return Err(error.to_string()),
        }
    }
    // The journal failed (or left) while this waited.
    flush_written(reactor).await
}

/// Flushes the members of every VD destaged to or imaged since the last checkpoints: what a
/// journal that failed can no longer replay must be durable on the members.
async fn flush_written(reactor: &Rc<Reactor>) -> Result<(), String> {
    flush_destaged(reactor).await?;
    super::images::flush_imaged(reactor).await
}

/// A periodic nudge (from the engine's ticker): destages what grew old, checkpoints.
pub(crate) fn tick(reactor: &Rc<Reactor>) {
    reactor.cache().aging.set(true);
    reactor.cache().review_stuck();
    // Waiters look again: a failed leg may have been named stale meanwhile.
    let images = reactor.cache().images.borrow().clone();
    reactor.cache().journal().into_iter().chain(images).for_each(|part| part.poke());
    super::checkpoint_images(reactor, false);
    reactor.cache().prune_logged_rows();
    pump(reactor);
}
