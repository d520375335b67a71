//! Parity spans: RAID5, RAID6, RAID50 and RAID60. Writes pick the full-stripe,
//! reconstruct-write or read-modify-write plan that needs the fewest member reads; reads go
//! straight to the data strip and fall back to reconstruction.

use super::lost::{self, StripRead, StripState, PROBE_BYTES};
use super::row::{
    book, member_io, read_op, read_strips, repair_copies, require_online, retry_limit, run_all, write_strips, Attempt, AttemptError, Env,
    Row,
};
use super::{intent, run, SpanIo};
use crate::config::BadBlock;
use crate::runtime::LockKey;
use crate::vd::{CheckMode, CheckOutcome, MemberSet, Mismatch, VdError};
use drive::{DriveOp, IoBuf};
use futures::future::join_all;
use layout::{DataPiece, Role, SpanKind};

mod check;
mod rebuild;
mod row_log;
pub(super) mod scattered;

use check::{parity_check_row, parity_check_rows};
use rebuild::{parity_rebuild_row, parity_rebuild_rows};
pub(super) use row_log::logs_row_images;

/// The parity span kinds' row functions.
pub(crate) struct Parity;

impl SpanIo for Parity {
    async fn read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
        parity_read(env, row, views).await
    }
    async fn write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Result<(), VdError> {
        parity_write(env, row, views).await
    }
    async fn rebuild_row(env: &Env, row: &Row, targets: MemberSet) -> Result<(), VdError> {
        parity_rebuild_row(env, row, targets).await
    }
    async fn rebuild_rows(env: &Env, rows: &[Row], targets: MemberSet) -> Vec<Result<(), VdError>> {
        parity_rebuild_rows(env, rows, targets).await
    }
    async fn check_row(env: &Env, row: &Row, mode: CheckMode) -> Result<CheckOutcome, VdError> {
        parity_check_row(env, row, mode).await
    }
    async fn check_rows(env: &Env, rows: &[Row], mode: CheckMode) -> Vec<Result<CheckOutcome, VdError>> {
        parity_check_rows(env, rows, mode).await
    }
}

fn generate_parity(kind: SpanKind, data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    match (kind, q) {
        (SpanKind::DoubleParity, Some(q)) => parity::pq_gen(data, p, q),
        (SpanKind::Parity, None) => parity::xor_gen(data, p),
        (kind, q) => unreachable!("{kind:?} with Q present: {}", q.is_some()),
    }
}

async fn parity_write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Result<(), VdError> {
    let mut avoid = MemberSet::default();
    for _ in 0..retry_limit(&env.vd) {
        // Members that failed a read are not read again in this request but are still written:
        // the write replaces the bad sectors (md does the same).
        // A member being rebuilt is written, and read only below its rebuild's watermark: above
        // it, it is lost for the parity math.
        let unwritable = env.vd.unwritable();
        let unreadable = env.vd.unavailable_for_read(row.map.row).union(avoid);
        let degraded = row.span_members().iter().any(|&(member, _)| unreadable.contains(member));
        let attempt = if degraded {
            degraded_write(env, row, views, unreadable, unwritable).await
        } else if rcw_read_count(row) <= rmw_read_count(row) {
            reconstruct_write(env, row, views).await
        } else {
            read_modify_write(env, row, views).await
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(error) => {
                if let Some(give_up) = book(env, error, &mut avoid) {
                    return Err(give_up);
                }
            }
        }
    }
    Err(env.vd.offline_error())
}

/// Column segments of strip `k` inside `[lo, hi)` that the new data does not cover.
fn uncovered_segments(row: &Row, k: usize) -> Vec<(u64, u64)> {
    match row.piece_of_strip(k) {
        None => vec![(row.lo, row.hi)],
        Some((_, piece)) => {
            let start = piece.offset_in_strip_bytes;
            let end = start + piece.len_bytes;
            [(row.lo, start), (end, row.hi)].into_iter().filter(|(a, b)| a < b).collect()
        }
    }
}

fn rcw_read_count(row: &Row) -> usize {
    (0..row.map.data_strip_count()).map(|k| uncovered_segments(row, k).len()).sum()
}

fn rmw_read_count(row: &Row) -> usize {
    let parity_count = if row.map.q_place().is_some() { 2 } else { 1 };
    row.pieces.len() + parity_count
}

/// Reconstruct-write: read what the new data does not cover, compute parity from the whole
/// columns. With every strip covered (a full-stripe write) it reads nothing.
async fn reconstruct_write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Attempt<()> {
    let m = row.map.data_strip_count();
    let mut reads = Vec::new();
    let mut segments = Vec::new();
    for k in 0..m {
        let (member, strip_offset) = row.data_member(k);
        for (start, end) in uncovered_segments(row, k) {
            reads.push((member, read_op(strip_offset + start, (end - start) as usize)));
            segments.push((k, start));
        }
    }
    let (bufs, error) = run_all(env, reads).await;
    if let Some(error) = error {
        return Err(error);
    }
    // Assemble whole columns only for strips that are not exactly covered by new data.
    let mut columns: Vec<Option<IoBuf>> = (0..m).map(|_| None).collect();
    for ((k, start), buf) in segments.into_iter().zip(bufs) {
        let column = columns[k].get_or_insert_with(|| column_with_new_data(row, k, views));
        let at = (start - row.lo) as usize;
        let buf = buf.expect("read returns its buffer");
        column.as_mut_slice()[at..at + buf.len()].copy_from_slice(buf.as_slice());
    }
    let data: Vec<&[u8]> = (0..m)
        .map(|k| match &columns[k] {
            Some(column) => column.as_slice(),
            None => views[row.piece_of_strip(k).expect("uncolumned strips are covered").0].as_slice(),
        })
        .collect();
    let (p, q) = new_parity(env, row, &data);
    write_row(env, row, views, p, q, MemberSet::default()).await
}

/// A `[lo, hi)` column of strip `k` holding the new data where the row piece writes it.
fn column_with_new_data(row: &Row, k: usize, views: &[IoBuf]) -> IoBuf {
    let mut column = IoBuf::zeroed(row.width_bytes());
    if let Some((i, piece)) = row.piece_of_strip(k) {
        let at = (piece.offset_in_strip_bytes - row.lo) as usize;
        column.as_mut_slice()[at..at + piece.len_bytes as usize].copy_from_slice(views[i].as_slice());
    }
    column
}

fn new_parity(env: &Env, row: &Row, data: &[&[u8]]) -> (IoBuf, Option<IoBuf>) {
    let kind = env.vd.geometry().span_kind();
    let mut p = IoBuf::zeroed(row.width_bytes());
    let mut q = (kind == SpanKind::DoubleParity).then(|| IoBuf::zeroed(row.width_bytes()));
    generate_parity(kind, data, p.as_mut_slice(), q.as_mut().map(|q| q.as_mut_slice()));
    (p, q)
}

/// Read-modify-write: new parity = old parity + the change of each written piece.
async fn read_modify_write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Attempt<()> {
    let mut reads: Vec<(usize, DriveOp)> = row
        .pieces
        .iter()
        .map(|piece| {
            let (member, strip_offset) = row.data_member(piece.strip_index);
            (member, read_op(strip_offset + piece.offset_in_strip_bytes, piece.len_bytes as usize))
        })
        .collect();
    for place in [row.map.p_place(), row.map.q_place()].into_iter().flatten() {
        reads.push((place.drive, read_op(place.drive_offset_bytes + row.lo, row.width_bytes())));
    }
    let (bufs, error) = run_all(env, reads).await;
    if let Some(error) = error {
        return Err(error);
    }
    let mut bufs: Vec<IoBuf> = bufs.into_iter().map(|b| b.expect("read returns its buffer")).collect();
    let mut q = (row.map.q_place().is_some()).then(|| bufs.pop().expect("Q read"));
    let mut p = bufs.pop().expect("P read");
    for ((piece, old), new) in row.pieces.iter().zip(bufs).zip(views.iter()) {
        let at = (piece.offset_in_strip_bytes - row.lo) as usize;
        fold_change(piece.strip_index, old, new.as_slice(), &mut p, q.as_mut(), at);
    }
    write_row(env, row, views, p, q, MemberSet::default()).await
}

/// Read-modify-write's parity step: folds the change of data strip `strip_index` from `old`
/// to `new` into the parity columns `p` (and `q`) from byte `at` on. `old` becomes the delta.
fn fold_change(strip_index: usize, mut old: IoBuf, new: &[u8], p: &mut IoBuf, q: Option<&mut IoBuf>, at: usize) {
    assert_eq!(old.len(), new.len(), "old and new data of one piece");
    parity::xor_into(old.as_mut_slice(), new);
    let (delta, len) = (old.as_slice(), new.len());
    let p_part = &mut p.as_mut_slice()[at..at + len];
    match q {
        Some(q) => parity::pq_update(strip_index, delta, p_part, &mut q.as_mut_slice()[at..at + len]),
        None => parity::xor_into(p_part, delta),
    }
}

/// A write to a row with lost members: rebuild the touched columns of every strip in memory,
/// apply the new data, recompute parity and write what still has a member to go to.
async fn degraded_write(env: &Env, row: &Row, views: &mut Vec<IoBuf>, unreadable: MemberSet, unwritable: MemberSet) -> Attempt<()> {
    let mut columns = match read_and_recover_columns(env, row, row.lo, row.hi, unreadable).await {
        // Members that cannot be read are written all the same (one being rebuilt, one that
        // failed a read): only those that take no writes are skipped.
        Err(AttemptError::Unsynced { .. }) if env.vd.is_replaying() => return replayed_data_only(env, row, views, unwritable).await,
        other => other?,
    };
    let m = row.map.data_strip_count();
    for (i, piece) in row.pieces.iter().enumerate() {
        let at = (piece.offset_in_strip_bytes - row.lo) as usize;
        columns[piece.strip_index].as_mut_slice()[at..at + views[i].len()].copy_from_slice(views[i].as_slice());
    }
    let data: Vec<&[u8]> = columns[..m].iter().map(|c| c.as_slice()).collect();
    let (p, q) = new_parity(env, row, &data);
    write_row(env, row, views, p, q, unwritable).await
}

/// A journal record replayed into a row that lacks a member and whose parity may be stale
/// (the crash that left the record also tore the row): its parity can neither be trusted nor
/// computed, so only the data pieces whose members are there are written. The row stays
/// unsynced, so reads that need its parity (the absent member's data, this record's part of it
/// included) keep being refused: nothing is made up, and what the members hold is the newest.
async fn replayed_data_only(env: &Env, row: &Row, views: &mut [IoBuf], absent: MemberSet) -> Attempt<()> {
    let members = row.span_members();
    let writes: Vec<(usize, DriveOp)> = row
        .pieces
        .iter()
        .zip(views.iter())
        .map(|(piece, view)| (members[piece.strip_index], piece, view))
        .filter(|((member, _), _, _)| !absent.contains(*member))
        .map(|((member, strip_offset), piece, view)| {
            let offset_bytes = strip_offset + piece.offset_in_strip_bytes;
            (member, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(view.as_slice()) })
        })
        .collect();
    // A replay logs nothing: the row stays unsynced (and its region unlogged) until a resync.
    intent::mark_unlogged(env, row.map.row).await.map_err(|_| AttemptError::Lost)?;
    let done = join_all(writes.into_iter().map(|(member, op)| super::row::member_io(env, member, op))).await;
    // A member that fails is booked by the caller and the row tried again without it.
    let faults = done.into_iter().filter_map(|(result, _)| result.err()).collect();
    super::row::first_error_booking_writes(env, faults).map_or(Ok(()), Err)
}

/// Reads columns `[lo, hi)` of every member of the row's span that is available and recovers
/// the others. Returns data columns `0..m`, then P, then Q (where the level has them).
async fn read_and_recover_columns(env: &Env, row: &Row, lo: u64, hi: u64, unavailable: MemberSet) -> Attempt<Vec<IoBuf>> {
    let width = (hi - lo) as usize;
    let members = row.span_members();
    let lost: Vec<usize> = (0..members.len()).filter(|&i| unavailable.contains(members[i].0)).collect();
    if lost.len() > env.vd.geometry().span_kind().failures_tolerated() {
        return Err(AttemptError::Lost);
    }
    // What stale parity would give is not data: until the region is resynced, nothing is
    // recovered from it.
    if !lost.is_empty() && env.vd.write_intent().is_some_and(|intent| intent.row_unsynced(row.map.row)) {
        return Err(AttemptError::Unsynced { row: row.map.row });
    }
    let reads = members
        .iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(_, &(member, strip_offset))| (member, read_op(strip_offset + lo, width)))
        .collect();
    let (bufs, error) = run_all(env, reads).await;
    if let Some(error) = error {
        return Err(error);
    }
    let mut bufs = bufs.into_iter().map(|b| b.expect("read returns its buffer"));
    let mut columns: Vec<IoBuf> = (0..members.len())
        .map(|i| if lost.contains(&i) { IoBuf::zeroed(width) } else { bufs.next().expect("one buffer per read") })
        .collect();
    recover(env.vd.geometry().span_kind(), &mut columns, &lost);
    Ok(columns)
}

/// Recomputes the `lost` blocks of `[D0.., P, (Q)]` in place.
fn recover(kind: SpanKind, columns: &mut [IoBuf], lost: &[usize]) {
    let mut blocks: Vec<&mut [u8]> = columns.iter_mut().map(|c| c.as_mut_slice()).collect();
    recover_blocks(kind, &mut blocks, lost);
}

fn recover_blocks(kind: SpanKind, blocks: &mut [&mut [u8]], lost: &[usize]) {
    if lost.is_empty() {
        return;
    }
    let outcome = match kind {
        SpanKind::Parity => parity::raid5_recover(blocks, lost[0]),
        SpanKind::DoubleParity => parity::raid6_recover(blocks, lost),
        other => unreachable!("{other:?} has no parity"),
    };
    outcome.expect("loss within tolerance is recoverable");
}

/// Writes the new data pieces, P and Q, skipping members in `skip`; puts the data buffers back
/// into `views` whatever happens.
async fn write_row(env: &Env, row: &Row, views: &mut Vec<IoBuf>, p: IoBuf, q: Option<IoBuf>, skip: MemberSet) -> Attempt<()> {
    assert_eq!(views.len(), row.pieces.len(), "one view per data piece");
    for (view, piece) in views.iter().zip(&row.pieces) {
        assert_eq!(view.len() as u64, piece.len_bytes, "a view is exactly its piece");
    }
    assert_eq!(p.len(), row.width_bytes(), "P covers the column hull");
    assert_eq!(q.is_some(), row.map.q_place().is_some(), "Q exactly when the span has one");
    assert!(q.as_ref().is_none_or(|q| q.len() == row.width_bytes()), "Q covers the column hull");
    let mut ops = Vec::with_capacity(row.pieces.len() + 2);
    let mut columns = Vec::with_capacity(row.pieces.len() + 2);
    let mut data_slots = Vec::with_capacity(row.pieces.len());
    for (piece, buf) in row.pieces.iter().zip(std::mem::take(views)) {
        let (member, strip_offset) = row.data_member(piece.strip_index);
        let offset_bytes = strip_offset + piece.offset_in_strip_bytes;
        // A lost member's piece is not written, but the buffer must still come back.
        let member = if skip.contains(member) { None } else { Some(member) };
        data_slots.push((member, offset_bytes, piece.offset_in_strip_bytes, buf));
    }
    let mut kept = Vec::new();
    for (slot, (member, offset_bytes, column, buf)) in data_slots.into_iter().enumerate() {
        match member {
            Some(member) => {
                ops.push((member, DriveOp::Write { offset_bytes, buf }));
                columns.push(column);
            }
            None => kept.push((slot, buf)),
        }
    }
    let parity = [row.map.p_place().zip(Some(p)), row.map.q_place().zip(q)];
    for (place, buf) in parity.into_iter().flatten() {
        if !skip.contains(place.drive) {
            ops.push((place.drive, DriveOp::Write { offset_bytes: place.drive_offset_bytes + row.lo, buf }));
            columns.push(row.lo);
        }
    }
    let data_op_count = row.pieces.len() - kept.len();
    debug_assert!(
        ops.iter().enumerate().all(|(i, (member, _))| ops[..i].iter().all(|(other, _)| other != member)),
        "a row write touches each member at most once"
    );
    // Held until the member writes are done: then the images may go.
    let logged = match log_row(env, row.map.row, &ops, &columns, row.is_whole()).await {
        Ok(logged) => logged,
        Err(error) => {
            let bufs = ops.into_iter().take(data_op_count).map(|(_, op)| match op {
                DriveOp::Write { buf, .. } => buf,
                _ => unreachable!("a row write writes"),
            });
            *views = restore_views(row, bufs, kept);
            return Err(error);
        }
    };
    let (bufs, error) = run_all(env, ops).await;
    if logged.is_none() && env.full_rows_unlogged && row.is_whole() {
        // Written around the journal: a later image of the row must wait until this is durable.
        crate::cache::note_written_around(&env.reactor, &env.vd, row.map.row);
    }
    drop(logged);
    let written = bufs.into_iter().take(data_op_count).map(|b| b.expect("write returns its buffer"));
    *views = restore_views(row, written, kept);
    error.map_or(Ok(()), Err)
}

/// Logs a row write's member writes `ops` (whose columns in their strips are `columns`) as its
/// image, or marks its region unlogged ([`row_log::log_row`]). `whole`: they write every data
/// strip of the row whole.
async fn log_row(env: &Env, row: u64, ops: &[(usize, DriveOp)], columns: &[u64], whole: bool) -> Attempt<Option<row_log::Logged>> {
    let writes: Vec<row_log::MemberWrite> = ops
        .iter()
        .zip(columns)
        .map(|((member, op), &column_bytes)| match op {
            DriveOp::Write { offset_bytes, buf } => {
                row_log::MemberWrite { member: *member, offset_bytes: *offset_bytes, column_bytes, bytes: buf.as_slice() }
            }
            _ => unreachable!("a row write writes"),
        })
        .collect();
    row_log::log_row(env, row, &writes, whole).await
}

/// A row write's views again: the buffers of its data writes (in piece order) with those of the
/// pieces it kept (their member was not written) put back in their places.
fn restore_views(row: &Row, mut written: impl Iterator<Item = IoBuf>, kept: Vec<(usize, IoBuf)>) -> Vec<IoBuf> {
    let mut kept = kept.into_iter().peekable();
    (0..row.pieces.len())
        .map(|slot| match kept.peek() {
            Some((kept_slot, _)) if *kept_slot == slot => kept.next().expect("peeked").1,
            _ => written.next().expect("one buffer per data write"),
        })
        .collect()
}

async fn parity_read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let unavailable = env.vd.unavailable_for_read(row.map.row);
    let direct = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| async move {
        let (member, strip_offset) = row.data_member(piece.strip_index);
        if unavailable.contains(member) {
            return Some(None);
        }
        let buf = view.take();
        let op = DriveOp::Read { offset_bytes: strip_offset + piece.offset_in_strip_bytes, buf };
        let (result, buf) = member_io(env, member, op).await;
        *view = buf.expect("read returns its buffer");
        result.err().map(Some)
    });
    let outcomes = join_all(direct).await;
    let mut failed = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        if let Some(error) = outcome {
            failed.push((i, error));
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    let _lock = {
        let lock = env.reactor.lock(LockKey { vd_id: env.vd.id(), row: row.map.row });
        lock.acquired().await;
        lock
    };
    let mut avoid = MemberSet::default();
    let mut repair = Vec::new();
    for (i, error) in &failed {
        if let Some(fault) = error {
            let member = fault.index;
            if let Some(give_up) = book(env, AttemptError::Member(fault.clone()), &mut avoid) {
                return Err(give_up);
            }
            let piece = &row.pieces[*i];
            repair.push((*i, member, row.data_member(piece.strip_index).1 + piece.offset_in_strip_bytes));
        }
    }
    for (i, _) in &failed {
        reconstruct_piece(env, row, &row.pieces[*i], &mut views[*i], &mut avoid).await?;
    }
    for (i, member, offset_bytes) in repair {
        repair_copies(env, &[(member, offset_bytes)], &views[i]).await;
    }
    Ok(())
}

/// Rebuilds one data piece from the rest of its row into `view`.
async fn reconstruct_piece(env: &Env, row: &Row, piece: &DataPiece, view: &mut IoBuf, avoid: &mut MemberSet) -> Result<(), VdError> {
    let lo = piece.offset_in_strip_bytes;
    let hi = lo + piece.len_bytes;
    for _ in 0..retry_limit(&env.vd) {
        // A member whose read failed is failed or in `avoid` by now. One that was merely out of
        // service when the read began may be back (a rebuild just finished): it is read, not
        // counted as lost, or a failure elsewhere meanwhile would look like two losses.
        let unavailable = env.vd.unavailable_for_read(row.map.row).union(*avoid);
        match read_and_recover_columns(env, row, lo, hi, unavailable).await {
            Ok(columns) => {
                view.as_mut_slice().copy_from_slice(columns[piece.strip_index].as_slice());
                return Ok(());
            }
            Err(error) => {
                if let Some(give_up) = book(env, error, avoid) {
                    return Err(give_up);
                }
            }
        }
    }
    Err(env.vd.offline_error())
}

// ---------------------------------------------------------------------------------------------
// Rebuild and check: whole rows, under the row lock, with the same recovery and parity code as
// the read and write paths.
