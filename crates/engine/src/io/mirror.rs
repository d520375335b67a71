//! Mirror spans: RAID1, RAID10 and RAID1E. Every strip has two copies; writes go to every
//! available copy, reads to the copy whose recent reads they continue, else to the one with
//! fewer outstanding I/Os, then the nearer head.

use super::lost::{self, StripRead, StripState, PROBE_BYTES};
use super::row::{book, member_io, read_strips, repair_copies, require_online, retry_limit, write_strips, AttemptError, Env, Row};
use super::{run, SpanIo};
use crate::config::BadBlock;
use crate::vd::{CheckMode, CheckOutcome, MemberSet, Mismatch, VdError, VirtualDrive};
use drive::{DriveOp, IoBuf};
use futures::future::join_all;
use layout::{DataPiece, RowMap};
use std::sync::atomic::Ordering;

/// The mirror span kinds' row functions.
pub(crate) struct Mirror;

impl SpanIo for Mirror {
    async fn read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
        mirror_read(env, row, views).await
    }
    async fn write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Result<(), VdError> {
        mirror_write(env, row, views).await
    }
    async fn rebuild_row(env: &Env, row: &Row, targets: MemberSet) -> Result<(), VdError> {
        let strips = (0..row.map.data_strip_count()).map(|k| rebuild_strip(env, row, k, targets));
        join_all(strips).await.into_iter().collect()
    }
    async fn rebuild_rows(env: &Env, rows: &[Row], targets: MemberSet) -> Vec<Result<(), VdError>> {
        mirror_rebuild_rows(env, rows, targets).await
    }
    async fn check_row(env: &Env, row: &Row, mode: CheckMode) -> Result<CheckOutcome, VdError> {
        mirror_check_row(env, row, mode).await
    }
    async fn check_rows(env: &Env, rows: &[Row], mode: CheckMode) -> Vec<Result<CheckOutcome, VdError>> {
        mirror_check_rows(env, rows, mode).await
    }
}

/// A copy keeps a stream it serves while its queue is at most this much deeper than the
/// shortest: more, and the streams spread out again (three streams on one copy of two).
const STREAM_AFFINITY_SLACK: u32 = 1;

/// The copy to read strip `k` from: the one whose recent reads this continues, unless its queue
/// is clearly deeper than another's; otherwise fewest outstanding I/Os, then nearest head.
/// Any level: one copy of a data strip is all that parity and stripe levels have.
pub(crate) fn choose_copy(vd: &VirtualDrive, map: &RowMap, piece: &DataPiece, unavailable: MemberSet) -> Option<(usize, u64)> {
    // Copies may differ until the region is resynced: always the first one available, so that
    // two reads never see two versions (the resync copies that one over the others).
    if vd.write_intent().is_some_and(|intent| intent.row_unsynced(map.row)) {
        return (0..map.copy_count())
            .map(|copy| map.data_copy(piece.strip_index, copy))
            .find(|place| !unavailable.contains(place.drive))
            .map(|place| (place.drive, place.drive_offset_bytes + piece.offset_in_strip_bytes));
    }
    // (outstanding, distance, continues a stream, drive, drive offset) of each available copy.
    let copies = || {
        (0..map.copy_count()).map(|copy| map.data_copy(piece.strip_index, copy)).filter(|place| !unavailable.contains(place.drive)).map(
            |place| {
                let member = vd.member(place.drive);
                let target = place.drive_offset_bytes + piece.offset_in_strip_bytes;
                let distance = member.last_end_bytes.load(Ordering::Relaxed).abs_diff(target);
                let continues = member.read_streams.continues(target);
                (member.outstanding.load(Ordering::Relaxed), distance, continues, place.drive, target)
            },
        )
    };
    let least_outstanding = copies().map(|c| c.0).min()?;
    let by_stream = copies().filter(|c| c.2 && c.0 <= least_outstanding + STREAM_AFFINITY_SLACK).min_by_key(|c| c.0);
    by_stream
        .or_else(|| copies().min_by_key(|&(outstanding, distance, ..)| (outstanding, distance)))
        .map(|(_, _, _, drive, target)| (drive, target))
}

async fn mirror_read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let reads = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| mirror_read_piece(env, row, piece, view));
    join_all(reads).await.into_iter().collect()
}

async fn mirror_read_piece(env: &Env, row: &Row, piece: &DataPiece, view: &mut IoBuf) -> Result<(), VdError> {
    let mut avoid = MemberSet::default();
    let mut repair = Vec::new();
    for _ in 0..retry_limit(&env.vd) {
        let unavailable = env.vd.unavailable_for_read(row.map.row).union(avoid);
        let Some((member, offset_bytes)) = choose_copy(&env.vd, &row.map, piece, unavailable) else {
            return Err(env.vd.offline_error());
        };
        let buf = view.take();
        let (result, buf) = member_io(env, member, DriveOp::Read { offset_bytes, buf }).await;
        *view = buf.expect("read returns its buffer");
        match result {
            Ok(()) => {
                if !repair.is_empty() {
                    repair_under_lock(env, row, piece, &repair, avoid).await;
                }
                return Ok(());
            }
            Err(fault) => {
                if let Some(give_up) = book(env, AttemptError::Member(fault), &mut avoid) {
                    return Err(give_up);
                }
                repair.push((member, offset_bytes));
            }
        }
    }
    Err(env.vd.offline_error())
}

/// Writes a good copy of `piece` over the copies that failed to read it (md's read repair),
/// read again under the row lock: the read that found the error took no lock, and a write may
/// have landed on every copy since; writing back what that read returned would put older data
/// over newer on the repaired copy. Nothing is repaired if the good copy cannot be read now.
async fn repair_under_lock(env: &Env, row: &Row, piece: &DataPiece, repair: &[(usize, u64)], avoid: MemberSet) {
    let _lock = env.lock_row(row.map.row).await;
    let unavailable = env.vd.unavailable_for_read(row.map.row).union(avoid);
    let Some((member, offset_bytes)) = choose_copy(&env.vd, &row.map, piece, unavailable) else { return };
    let (result, buf) = member_io(env, member, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(piece.len_bytes as usize) }).await;
    if result.is_ok() {
        repair_copies(env, repair, &buf.expect("read returns its buffer")).await;
    }
}

async fn mirror_write(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let writes = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| mirror_write_piece(env, row, piece, view));
    join_all(writes).await.into_iter().collect()
}

async fn mirror_write_piece(env: &Env, row: &Row, piece: &DataPiece, view: &mut IoBuf) -> Result<(), VdError> {
    // A copy being rebuilt is written too, so the rows the rebuild has passed stay current.
    let unavailable = env.vd.unwritable();
    let places: Vec<(usize, u64)> = (0..row.map.copy_count())
        .map(|copy| row.map.data_copy(piece.strip_index, copy))
        .filter(|place| !unavailable.contains(place.drive))
        .map(|place| (place.drive, place.drive_offset_bytes + piece.offset_in_strip_bytes))
        .collect();
    // The first copy writes from the caller's buffer; the others from copies of it.
    let mut bufs: Vec<IoBuf> = places.iter().skip(1).map(|_| IoBuf::from_slice(view.as_slice())).collect();
    if !places.is_empty() {
        bufs.insert(0, view.take());
    }
    let ops: Vec<(usize, DriveOp)> =
        places.iter().zip(bufs).map(|(&(member, offset_bytes), buf)| (member, DriveOp::Write { offset_bytes, buf })).collect();
    let results = join_all(ops.into_iter().map(|(member, op)| member_io(env, member, op))).await;
    let mut written = 0;
    for (i, (result, buf)) in results.into_iter().enumerate() {
        if i == 0 {
            *view = buf.expect("write returns its buffer");
        }
        match result {
            Ok(()) => written += 1,
            Err(fault) => {
                env.vd.member_error(&fault);
            }
        }
    }
    if written == 0 {
        return Err(env.vd.offline_error());
    }
    Ok(())
}

/// Copies strip `k` of the row from a copy outside `targets` onto the copies inside it, and
/// over a source copy that failed its read (read repair). Chunks that no copy can give become
/// bad blocks (recorded durably first) and zeros on every copy written.
async fn rebuild_strip(env: &Env, row: &Row, k: usize, targets: MemberSet) -> Result<(), VdError> {
    let places = copy_places(row, k);
    if !places.iter().any(|&(member, _)| targets.contains(member)) {
        return Ok(());
    }
    let copies = lost::read_strips(env, &places, env.vd.unavailable().union(targets)).await;
    let writes = rebuilt_copies(env, row, k, targets, copies).await?;
    write_strips(env, row.map.row, writes, "writing the rebuilt strip to").await
}

/// [`rebuild_strip`] of every strip of a run of locked rows, with each member's part of the run
/// read and written in as few I/Os as the layout allows (see `run`). A failed read sends the
/// rows down the row path one by one.
async fn mirror_rebuild_rows(env: &Env, rows: &[Row], targets: MemberSet) -> Vec<Result<(), VdError>> {
    // (row index, strip) of every strip with a copy on a target: only those are read.
    let strips: Vec<(usize, usize)> = (0..rows.len())
        .flat_map(|i| (0..rows[i].map.data_strip_count()).map(move |k| (i, k)))
        .filter(|&(i, k)| copy_places(&rows[i], k).iter().any(|&(member, _)| targets.contains(member)))
        .collect();
    let places: Vec<Vec<(usize, u64)>> = strips.iter().map(|&(i, k)| copy_places(&rows[i], k)).collect();
    let flat: Vec<(usize, u64)> = places.iter().flatten().copied().collect();
    let mut results: Vec<Result<(), VdError>> = rows.iter().map(|_| Ok(())).collect();
    let Some(read) = run::read_strips(env, &flat, env.vd.unavailable().union(targets)).await else {
        for (i, row) in rows.iter().enumerate() {
            results[i] = Mirror::rebuild_row(env, row, targets).await;
        }
        return results;
    };
    let mut read = read.into_iter();
    let mut writes = Vec::new();
    for (&(i, k), strip_places) in strips.iter().zip(&places) {
        let copies: Vec<StripRead> = read.by_ref().take(strip_places.len()).collect();
        match rebuilt_copies(env, &rows[i], k, targets, copies).await {
            Ok(strip_writes) => writes.extend(strip_writes.into_iter().map(|(member, offset_bytes, buf)| (i, member, offset_bytes, buf))),
            Err(error) => results[i] = results[i].clone().and(Err(error)),
        }
    }
    let row_numbers: Vec<u64> = rows.iter().map(|row| row.map.row).collect();
    let written = run::write_strips(env, &row_numbers, writes, "writing the rebuilt strip to").await;
    results.into_iter().zip(written).map(|(planned, written)| planned.and(written)).collect()
}

/// Where the copies of strip `k` of a row are: (member, drive offset), copy 0 first.
fn copy_places(row: &Row, k: usize) -> Vec<(usize, u64)> {
    (0..row.map.copy_count()).map(|copy| row.map.data_copy(k, copy)).map(|place| (place.drive, place.drive_offset_bytes)).collect()
}

/// From the copies of strip `k` as read (targets not read), the copies to write, each in its own
/// buffer: the targets', and read repairs. Chunks no copy gives are recorded as bad blocks
/// (durably) first and written as zeros.
async fn rebuilt_copies(
    env: &Env,
    row: &Row,
    k: usize,
    targets: MemberSet,
    mut copies: Vec<StripRead>,
) -> Result<Vec<(usize, u64, IoBuf)>, VdError> {
    let first_target = copies.iter().map(|copy| copy.member).find(|&member| targets.contains(member)).expect("a strip with a target");
    let piece = &row.pieces[k];
    assert!(piece.strip_index == k && piece.offset_in_strip_bytes == 0, "a rebuild reads whole strips");
    let good = match copies.iter().position(|copy| copy.state == StripState::Read) {
        // The copy read is never written back (not a target, not unreadable): its buffer is
        // taken, not copied.
        Some(read) => copies[read].buf.take(),
        None => {
            lost::probe(env, &mut copies).await;
            let (good, lost_ranges) = assemble_strip(env, row, k, &copies);
            if !lost_ranges.is_empty() {
                let cause = lost::cause(row.map.row, targets, &copies);
                lost::record_lost(env, row.map.row, first_target, &lost_ranges, &cause).await?;
            }
            good
        }
    };
    let unwritable = env.vd.unwritable();
    let rewrite = |copy: &StripRead| targets.contains(copy.member) || (copy.is_unreadable() && !unwritable.contains(copy.member));
    let writes = copies.into_iter().filter(rewrite).map(|mut copy| {
        copy.buf.as_mut_slice().copy_from_slice(good.as_slice());
        (copy.member, copy.offset_bytes, copy.buf)
    });
    Ok(writes.collect())
}

/// Strip `k` from whatever copy can give each chunk, zeros where none can; and the lost ranges.
fn assemble_strip(env: &Env, row: &Row, k: usize, copies: &[StripRead]) -> (IoBuf, Vec<BadBlock>) {
    let mut good = IoBuf::zeroed(env.vd.geometry().strip_size_bytes() as usize);
    let mut lost_chunks = Vec::new();
    for chunk in 0..lost::chunk_count(env.vd.geometry()) {
        let at = chunk * PROBE_BYTES as usize..(chunk + 1) * PROBE_BYTES as usize;
        match copies.iter().find(|copy| !copy.lost_at(chunk)) {
            Some(copy) => good.as_mut_slice()[at.clone()].copy_from_slice(&copy.buf.as_slice()[at]),
            None => lost_chunks.push(lost::lost_range(env.vd.geometry(), row.map.row, k, chunk..chunk + 1)),
        }
    }
    (good, lost::merged(lost_chunks))
}

/// Compares every copy of every strip in the row with copy 0; a repair copies copy 0 over the
/// copies that differ (nothing tells which copy is right; MegaRAID's check does the same).
async fn mirror_check_row(env: &Env, row: &Row, mode: CheckMode) -> Result<CheckOutcome, VdError> {
    let places = mirror_check_places(row);
    require_online(env, row.map.row, places.iter().map(|&(member, _)| member))?;
    let copies = read_strips(env, row.map.row, &places, "reading for a check from").await?;
    judge_copies(env, row, &places, copies, mode).await
}

/// Every copy of every data strip of `row`: strip 0's copies in copy order, then strip 1's...
fn mirror_check_places(row: &Row) -> Vec<(usize, u64)> {
    let copy_count = row.map.copy_count();
    (0..row.map.data_strip_count())
        .flat_map(|k| (0..copy_count).map(move |copy| (k, copy)))
        .map(|(k, copy)| row.map.data_copy(k, copy))
        .map(|place| (place.drive, place.drive_offset_bytes))
        .collect()
}

/// [`mirror_check_row`] of a run of locked rows, with each member's part of the run read in one
/// I/O per drive-contiguous range; a failed read or a member out of service sends the run down
/// the row path.
async fn mirror_check_rows(env: &Env, rows: &[Row], mode: CheckMode) -> Vec<Result<CheckOutcome, VdError>> {
    let places: Vec<Vec<(usize, u64)>> = rows.iter().map(mirror_check_places).collect();
    let mut results = Vec::with_capacity(rows.len());
    match run::read_rows(env, &places).await {
        Some(copies) => {
            for ((row, places), copies) in rows.iter().zip(&places).zip(copies) {
                results.push(judge_copies(env, row, places, copies, mode).await);
            }
        }
        None => {
            for row in rows {
                results.push(mirror_check_row(env, row, mode).await);
            }
        }
    }
    results
}

/// Compares each data strip's copies (read from `places`) with copy 0 and, when `mode` writes,
/// copies copy 0 over those that differ.
async fn judge_copies(env: &Env, row: &Row, places: &[(usize, u64)], copies: Vec<IoBuf>, mode: CheckMode) -> Result<CheckOutcome, VdError> {
    let copy_count = row.map.copy_count();
    assert_eq!(copies.len(), places.len(), "one buffer per copy of each strip");
    let mut mismatches = Vec::new();
    let mut repairs = Vec::new();
    for (k, strip_copies) in copies.chunks(copy_count).enumerate() {
        let strip_places = &places[k * copy_count..(k + 1) * copy_count];
        let differing: Vec<usize> = (1..copy_count).filter(|&c| strip_copies[c].as_slice() != strip_copies[0].as_slice()).collect();
        if differing.is_empty() {
            continue;
        }
        let members = std::iter::once(0).chain(differing.iter().copied()).map(|c| strip_places[c].0).collect();
        mismatches.push(Mismatch::Copies { strip_index: k, members });
        for c in differing {
            repairs.push((strip_places[c].0, strip_places[c].1, IoBuf::from_slice(strip_copies[0].as_slice())));
        }
    }
    let repaired = mode.writes() && !repairs.is_empty();
    if repaired {
        write_strips(env, row.map.row, repairs, "writing copy 0 over").await?;
    }
    Ok(CheckOutcome { row: row.map.row, mismatches, repaired })
}
