//! Writes through the cache: admitted in arrival order, acknowledged as the write policy in
//! effect says (WT after the members, WB after the journal, AWB at once), and flushes, which
//! make what the journal does not hold reach the members.

use super::extents::{DirtyMap, Extent};
use super::{bypass, destage, pump, ShardCache, VdCache};
use crate::config::WritePolicy;
use crate::io;
use crate::journal::part::{JournalPart, WriteData};
use crate::runtime::Reactor;
use crate::vd::{VdCompletion, VdError, VdRequest, VirtualDrive};
use drive::IoBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// How a write is acknowledged here and now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// After the members have it.
    Through,
    /// After the journal has it.
    Back,
    /// At once.
    Always,
}

fn mode_for(vd: &VirtualDrive, journal: Option<&JournalPart>) -> Mode {
    if vd.is_replaying() {
        return Mode::Through;
    }
    match vd.write_policy() {
        WritePolicy::WriteThrough => Mode::Through,
        WritePolicy::WriteBack if journal.is_some_and(JournalPart::takes_write_back) => Mode::Back,
        WritePolicy::WriteBack => Mode::Through,
        WritePolicy::AlwaysWriteBack => Mode::Always,
    }
}

pub(super) async fn write(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, mut buf: IoBuf, bypass: bool) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    let cuts = whole_row_cuts(&cache, &vd, offset_bytes, buf.len() as u64, bypass);
    // Writes are admitted in the order they arrived, so that overlapping writes land in that
    // order even when one has to wait for room. The pieces of a write cut in rows take their
    // tickets one after another now, so they are admitted in the write's own turn.
    if cuts.is_empty() {
        let ticket = cache.admission.take_ticket();
        return write_admitted(reactor, vd, offset_bytes, buf, bypass, ticket).await;
    }
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut at_bytes = offset_bytes;
    for cut_bytes in cuts {
        let rest = buf.split_off((cut_bytes - at_bytes) as usize);
        pieces.push((at_bytes, std::mem::replace(&mut buf, rest)));
        at_bytes = cut_bytes;
    }
    pieces.push((at_bytes, buf));
    let writes: Vec<_> = pieces
        .into_iter()
        .map(|(offset_bytes, piece)| {
            let ticket = cache.admission.take_ticket();
            write_admitted(Rc::clone(&reactor), Arc::clone(&vd), offset_bytes, piece, bypass, ticket)
        })
        .collect();
    let completions = futures::future::join_all(writes).await;
    let result = completions.iter().find_map(|c| c.result.clone().err()).map_or(Ok(()), Err);
    let buf = IoBuf::join(completions.into_iter().map(|c| c.buf.expect("a write returns its buffer")));
    VdCompletion { result, buf: Some(buf) }
}

/// Where a WB write of `len_bytes` at `offset_bytes` is cut so that its whole rows go the
/// imaged path while its partial first and last rows are cached (and join the next and the
/// previous write's pieces there into whole rows): none unless it holds a whole row and a
/// partial one, on a parity VD whose row writes are imaged. A stream's write (`bypass`) is
/// also cut where it crosses a row without holding one whole, so that each piece may complete
/// the row the stream's other write left in the cache (`bypass::complete_row`).
///
/// Cached, a whole row goes to the journal twice (the data record, then the destage's row
/// image, which repeats the data beside the parity) and is copied three more times on the way;
/// imaged, the journal takes its data and parity once, as md's raid5-cache takes a full
/// stripe's (data at the write, parity at the flush). The price is the acknowledgement: after
/// the members' full-stripe writes, not after the journal's.
fn whole_row_cuts(cache: &ShardCache, vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64, bypass: bool) -> Vec<u64> {
    if !rows_imaged(cache, vd) || mode_for(vd, cache.journal().as_deref()) != Mode::Back {
        return Vec::new();
    }
    let row_bytes = vd.geometry().row_data_bytes();
    let end_bytes = offset_bytes + len_bytes;
    let (first_whole, past_whole) = (offset_bytes.next_multiple_of(row_bytes), end_bytes / row_bytes * row_bytes);
    if first_whole >= past_whole {
        let crosses = first_whole > offset_bytes && first_whole < end_bytes;
        return if bypass && crosses { vec![first_whole] } else { Vec::new() };
    }
    [first_whole, past_whole].into_iter().filter(|&cut| cut > offset_bytes && cut < end_bytes).collect()
}

/// [`write`] of one piece, admitted in the turn of `ticket`.
async fn write_admitted(
    reactor: Rc<Reactor>,
    vd: Arc<VirtualDrive>,
    offset_bytes: u64,
    buf: IoBuf,
    bypass: bool,
    ticket: u64,
) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    let len_bytes = buf.len() as u64;
    let mut data: Option<Rc<IoBuf>> = None;
    let (journal, mode, placed) = loop {
        if cache.admission.serving() != ticket {
            cache.wait_for_change().await;
            continue;
        }
        // A journal that failed stays trusted by the metadata until the controller detaches it;
        // until then a write that skipped it could be overwritten by its replay after a crash.
        if cache.journal().is_some_and(|j| !j.health().is_usable()) {
            cache.wait_for_change().await;
            continue;
        }
        let journal = cache.journal();
        let mode = mode_for(&vd, journal.as_deref());
        if mode == Mode::Through && journal.is_none() && !cache.has_dirty(&vd) {
            // Nothing cached to overtake: the direct path, which queues for its row locks now.
            let range = offset_bytes..offset_bytes + len_bytes;
            let direct = cache.clean.borrow_mut().begin_direct_write(vd.instance_id(), range);
            cache.admission.next(&cache);
            let completion = io::serve(reactor, vd, VdRequest::Write { offset_bytes, buf }).await;
            cache.clean.borrow_mut().end_direct_write(direct);
            return completion;
        }
        let range = offset_bytes..offset_bytes + len_bytes;
        // Under WB a stream's piece that fills part of a row is cached (its record
        // acknowledges it at once), unless it completes a row the stream's other write left in
        // the cache: then both go around the journal as one whole row (`bypass::complete_row`).
        let part_of_row = bypass && mode == Mode::Back && journal.is_some() && is_part_of_one_row(&cache, &vd, &range);
        if part_of_row && bypass::may_complete_row(&cache, &vd, &range) {
            if let Some(run) = destage::take_completing_run(&cache, &vd, &range) {
                // It queues for the row's lock before the next write's turn.
                cache.admission.next(&cache);
                return bypass::complete_row(reactor, vd, offset_bytes, buf, run).await;
            }
        }
        // A piece of one row goes around too where the stream's neighbouring write, already on
        // its way at this queue depth, will make the row whole on the members (`io::gather`):
        // the row is then written once, whole, where its record would have written the piece a
        // second time (a 1 MiB stream on 7+1 RAID5 journaled 0.19 bytes per byte that way).
        let gathers = part_of_row && io::gather::would_gather(&reactor, &vd, &range);
        // Under WB a stream set to go around the journal (its cutoff set on purpose) does so
        // before it would go the imaged path; WT keeps the imaged path first (it needs no flush).
        let around =
            bypass && (!part_of_row || gathers) && journal.is_some() && mode != Mode::Always && bypass::allowed(&cache, &vd, &range);
        let imaged = match mode {
            Mode::Through => journal.is_some() && !cache.has_dirty(&vd),
            Mode::Back => is_whole_rows(&vd, &range) && !around,
            Mode::Always => false,
        };
        if imaged && imaged_path_open(&cache, &vd, &range) {
            cache.admission.next(&cache);
            return write_imaged(reactor, vd, offset_bytes, buf, mode).await;
        }
        if around {
            // Like the direct path above, it queues for its row locks before the next write's turn.
            cache.admission.next(&cache);
            return bypass::write_around(reactor, vd, offset_bytes, buf).await;
        }
        // Room first (destaging frees it), then room in the journal (a checkpoint frees it).
        let room = cache.counted_bytes() + len_bytes <= cache.limit_bytes.get() || cache.bytes.get() == 0;
        let placed = match (&journal, room) {
            (_, false) => None,
            (None, true) => Some(None),
            (Some(journal), true) => {
                // The cache keeps its own copy, which the journal's group record is made from.
                let data = Rc::clone(data.get_or_insert_with(|| Rc::new(IoBuf::from_slice(buf.as_slice()))));
                let write = WriteData { vd_id: vd.id() as u32, vd_offset_bytes: offset_bytes, data };
                journal.place(&reactor, &write, mode == Mode::Back).map(Some)
            }
        };
        match placed {
            Some(placed) => break (journal, mode, placed),
            None => {
                // Below the watermarks nothing would be destaged for this write: it asks.
                cache.forced.set(cache.forced.get() + 1);
                pump(&reactor);
                cache.wait_for_change().await;
                cache.forced.set(cache.forced.get() - 1);
            }
        }
    };
    vd.note_write();
    // The cache keeps its own copy: the caller's buffer goes back to it (a request cut into
    // pieces is joined again from its views).
    let data = data.unwrap_or_else(|| Rc::new(IoBuf::from_slice(buf.as_slice())));
    let ours = insert(&cache, &vd, offset_bytes, &data, placed.as_deref());
    cache.admission.next(&cache);
    pump(&reactor);
    let logged = match (&journal, &placed) {
        (Some(journal), Some(placed)) if mode == Mode::Always => {
            // AWB: acknowledged now; the record is written behind it (a flush waits for it).
            let (journal, placed, reactor2) = (Rc::clone(journal), placed.clone(), Rc::clone(&reactor));
            reactor.spawn(async move {
                let _ = journal.write(&reactor2, &placed).await;
                release_writer(reactor2.cache(), &journal, &placed);
            });
            Ok(())
        }
        (Some(journal), Some(placed)) => {
            let result = journal.write(&reactor, placed).await;
            release_writer(&cache, journal, placed);
            result
        }
        _ => Ok(()),
    };
    if logged.is_err() {
        // The journal failed under this write: it goes to the members without it, once the
        // controller has stopped trusting the journal (see above).
        while cache.journal().is_some_and(|j| !j.health().is_usable()) {
            cache.wait_for_change().await;
        }
    }
    let result = match (mode, logged) {
        (Mode::Always, _) => Ok(()),
        (Mode::Back, Ok(())) => Ok(()),
        // WT, or WB whose journal failed under it: the data must reach the members now.
        _ => destage_written(&reactor, &vd, &ours).await,
    };
    VdCompletion { result, buf: Some(buf) }
}

/// Whether a write of `range` may skip its data record: on a parity VD whose row writes are
/// logged as row images (the image holds every byte the write puts on the members, so replay
/// restores it as it would restore the record), with nothing a replay could lay over it (no
/// dirty extent overlaps it, no live data record names its rows).
fn imaged_path_open(cache: &ShardCache, vd: &VirtualDrive, range: &std::ops::Range<u64>) -> bool {
    rows_imaged(cache, vd) && bypass::nothing_to_replay_over(cache, vd, range)
}

/// Whether `vd`'s row writes are logged as row images here: a parity VD, and a journal with
/// a working image partition.
fn rows_imaged(cache: &ShardCache, vd: &VirtualDrive) -> bool {
    let parity = matches!(vd.geometry().span_kind(), layout::SpanKind::Parity | layout::SpanKind::DoubleParity);
    parity && cache.images().is_some()
}

/// Whether `range` is a part of one row of `vd`, not all of it, on a parity VD whose WB writes
/// are cut at row boundaries ([`whole_row_cuts`]): the first or last piece of such a write.
fn is_part_of_one_row(cache: &ShardCache, vd: &VirtualDrive, range: &std::ops::Range<u64>) -> bool {
    let row_bytes = vd.geometry().row_data_bytes();
    let one_row = range.start / row_bytes == (range.end - 1) / row_bytes;
    rows_imaged(cache, vd) && one_row && !is_whole_rows(vd, range)
}

/// Whether `range` is whole rows of `vd` (a WB write's piece that goes the imaged path).
fn is_whole_rows(vd: &VirtualDrive, range: &std::ops::Range<u64>) -> bool {
    let row_bytes = vd.geometry().row_data_bytes();
    range.start.is_multiple_of(row_bytes) && range.end.is_multiple_of(row_bytes)
}

/// A write on the imaged path (WT with a journal, or whole rows of a WB write): straight to
/// the members, each row write logged as its image first, acknowledged when the members have
/// it. A write acknowledged with a journal attached must survive a crash (DESIGN.md's
/// durability table): a row that went without an image (no room in the ring, the journal
/// failing, a row joined to another request's) is made so by a flush of the members before the
/// acknowledgement.
async fn write_imaged(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, mode: Mode) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    let range = offset_bytes..offset_bytes + buf.len() as u64;
    let direct = cache.clean.borrow_mut().begin_direct_write(vd.instance_id(), range.clone());
    let (mut completion, imaged) = io::serve_imaged(Rc::clone(&reactor), Arc::clone(&vd), offset_bytes, buf).await;
    cache.clean.borrow_mut().end_direct_write(direct);
    if completion.result.is_ok() && !imaged {
        completion.result = bypass::members_durable(&reactor, &vd).await;
    }
    if completion.result.is_ok() {
        let mut counts = cache.imaged_writes.get();
        match mode {
            Mode::Back => counts.write_back_bytes += range.end - range.start,
            _ => counts.write_through_bytes += range.end - range.start,
        }
        cache.imaged_writes.set(counts);
    }
    completion
}

/// The writer hands its hold on each record over to the cached pieces. A quiesce may be
/// waiting for the live tail to move.
pub(super) fn release_writer(cache: &ShardCache, journal: &JournalPart, placed: &[crate::journal::part::Placed]) {
    for piece in placed {
        journal.release(piece.placement.sequence);
    }
    cache.wake_all();
}

/// Puts a write into the dirty map, one extent per journal record (or one for all of it).
/// Returns where each extent went and its id.
fn insert(
    cache: &ShardCache,
    vd: &Arc<VirtualDrive>,
    offset_bytes: u64,
    data: &Rc<IoBuf>,
    placed: Option<&[crate::journal::part::Placed]>,
) -> Vec<(u64, u64)> {
    let pieces: Vec<(usize, usize, Option<u64>)> = match placed {
        Some(placed) => placed.iter().map(|p| (p.data_at, p.data_bytes, Some(p.placement.sequence))).collect(),
        None => vec![(0, data.len(), None)],
    };
    let journal = cache.journal();
    let mut vds = cache.vds.borrow_mut();
    let entry = vds.entry(vd.instance_id()).or_insert_with(|| VdCache {
        vd: Arc::clone(vd),
        dirty: DirtyMap::default(),
        cursor: 0,
        busy: Vec::new(),
        last_error: None,
    });
    let mut ours = Vec::new();
    for (at, len, sequence) in pieces {
        let id = cache.next_id.get();
        cache.next_id.set(id + 1);
        if let (Some(sequence), Some(journal)) = (sequence, &journal) {
            journal.hold(sequence);
            cache.note_logged_data(journal, vd, offset_bytes + at as u64, len as u64, sequence);
        }
        let extent = Extent {
            len_bytes: len as u64,
            data: Rc::clone(data),
            at,
            sequence,
            superseded: Vec::new(),
            id,
            born: Instant::now(),
            stuck: false,
        };
        ours.push((offset_bytes + at as u64, id));
        let displaced = entry.dirty.insert(offset_bytes + at as u64, extent);
        cache.bytes.set(cache.bytes.get() + len as u64 - displaced.bytes_removed);
        vd.note_cache_dirty(len as i64 - displaced.bytes_removed as i64);
        if let Some(journal) = &journal {
            // Superseded holds moved to the new extent as they were; a split piece adds one.
            displaced.held.iter().for_each(|&s| journal.hold(s));
        }
    }
    drop(vds);
    let mut clean = cache.clean.borrow_mut();
    clean.update(vd.instance_id(), offset_bytes, data.as_slice());
    clean.evict_to(cache.limit_bytes.get().saturating_sub(cache.bytes.get()));
    ours
}

/// Waits until the extents a write put in the cache (`ours`: offset and id) are on the members
/// or overwritten, destaging them now.
async fn destage_written(reactor: &Rc<Reactor>, vd: &Arc<VirtualDrive>, ours: &[(u64, u64)]) -> Result<(), VdError> {
    let cache = Rc::clone(reactor.cache());
    cache.forced.set(cache.forced.get() + 1);
    let result = loop {
        let (pending, stuck) = {
            let vds = cache.vds.borrow();
            let Some(entry) = vds.get(&vd.instance_id()) else { break Ok(()) };
            let pending = ours.iter().filter(|&&(offset, id)| entry.dirty.holds(offset, id)).count();
            let stuck = ours.iter().any(|&(offset, id)| entry.dirty.is_stuck(offset, id));
            (pending, stuck.then(|| entry.last_error.clone()).flatten())
        };
        if let Some(error) = stuck {
            break Err(error);
        }
        if pending == 0 {
            break Ok(());
        }
        pump(reactor);
        cache.wait_for_change().await;
    };
    cache.forced.set(cache.forced.get() - 1);
    result
}

pub(super) async fn flush(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>) -> VdCompletion {
    let cache = Rc::clone(reactor.cache());
    if let Some(journal) = cache.journal().filter(|j| j.health().is_usable()) {
        if let Err(error) = journal.durable_all(&reactor).await {
            tracing::warn!("journal failed at a flush: {error}");
        }
    }
    // A failed journal: what it held goes to the members, once the controller stopped trusting
    // it (its replay could otherwise overwrite what this flush makes durable).
    while cache.journal().is_some_and(|j| !j.health().is_usable()) {
        cache.wait_for_change().await;
    }
    // What the journal does not hold must reach the members.
    let unjournaled = |cache: &ShardCache| {
        let journal_ok = cache.journal().is_some_and(|j| j.health().is_usable());
        cache.vds.borrow().get(&vd.instance_id()).is_some_and(|c| c.dirty.candidates(0).any(|(_, e)| e.sequence.is_none() || !journal_ok))
    };
    cache.forced.set(cache.forced.get() + 1);
    while unjournaled(&cache) {
        pump(&reactor);
        cache.wait_for_change().await;
    }
    cache.forced.set(cache.forced.get() - 1);
    io::serve(reactor, vd, VdRequest::Flush).await
}
