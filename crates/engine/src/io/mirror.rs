//! Mirror spans: RAID1, RAID10 and RAID1E. Every strip has two copies; writes go to every
//! available copy, reads to the copy with fewer outstanding I/Os, then the nearer head.

use super::row::{book, member_io, repair_copies, retry_limit, AttemptError, Env, Row};
use super::SpanIo;
use crate::vd::{MemberSet, VdError};
use drive::{DriveOp, IoBuf, OpKind};
use futures::future::join_all;
use layout::DataPiece;
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
}

/// The copy to read strip `k` from: fewest outstanding I/Os, then nearest head position.
fn choose_copy(env: &Env, row: &Row, piece: &DataPiece, unavailable: MemberSet) -> Option<(usize, u64)> {
    (0..row.map.copy_count())
        .map(|copy| row.map.data_copy(piece.strip_index, copy))
        .filter(|place| !unavailable.contains(place.drive))
        .map(|place| {
            let member = env.vd.member(place.drive);
            let target = place.drive_offset_bytes + piece.offset_in_strip_bytes;
            let distance = member.last_end_bytes.load(Ordering::Relaxed).abs_diff(target);
            (member.outstanding.load(Ordering::Relaxed), distance, place.drive, target)
        })
        .min_by_key(|&(outstanding, distance, _, _)| (outstanding, distance))
        .map(|(_, _, drive, target)| (drive, target))
}

async fn mirror_read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let reads = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| mirror_read_piece(env, row, piece, view));
    join_all(reads).await.into_iter().collect()
}

async fn mirror_read_piece(env: &Env, row: &Row, piece: &DataPiece, view: &mut IoBuf) -> Result<(), VdError> {
    let mut avoid = MemberSet::default();
    let mut repair = Vec::new();
    for _ in 0..retry_limit(&env.vd) {
        let unavailable = env.vd.unavailable().union(avoid);
        let Some((member, offset_bytes)) = choose_copy(env, row, piece, unavailable) else {
            return Err(env.vd.offline_error());
        };
        let buf = std::mem::replace(view, IoBuf::zeroed(0));
        let (result, buf) = member_io(env, member, DriveOp::Read { offset_bytes, buf }).await;
        *view = buf.expect("read returns its buffer");
        match result {
            Ok(()) => {
                repair_copies(env, &repair, view).await;
                return Ok(());
            }
            Err(error) => {
                if let Some(give_up) = book(env, AttemptError::Member { index: member, kind: OpKind::Read, error }, &mut avoid) {
                    return Err(give_up);
                }
                repair.push((member, offset_bytes));
            }
        }
    }
    Err(env.vd.offline_error())
}

async fn mirror_write(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let writes = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| mirror_write_piece(env, row, piece, view));
    join_all(writes).await.into_iter().collect()
}

async fn mirror_write_piece(env: &Env, row: &Row, piece: &DataPiece, view: &mut IoBuf) -> Result<(), VdError> {
    let unavailable = env.vd.unavailable();
    let places: Vec<(usize, u64)> = (0..row.map.copy_count())
        .map(|copy| row.map.data_copy(piece.strip_index, copy))
        .filter(|place| !unavailable.contains(place.drive))
        .map(|place| (place.drive, place.drive_offset_bytes + piece.offset_in_strip_bytes))
        .collect();
    // The first copy writes from the caller's buffer; the others from copies of it.
    let mut bufs: Vec<IoBuf> = places.iter().skip(1).map(|_| IoBuf::from_slice(view.as_slice())).collect();
    if !places.is_empty() {
        bufs.insert(0, std::mem::replace(view, IoBuf::zeroed(0)));
    }
    let ops: Vec<(usize, DriveOp)> =
        places.iter().zip(bufs).map(|(&(member, offset_bytes), buf)| (member, DriveOp::Write { offset_bytes, buf })).collect();
    let kinds: Vec<usize> = ops.iter().map(|(member, _)| *member).collect();
    let results = join_all(ops.into_iter().map(|(member, op)| member_io(env, member, op))).await;
    let mut written = 0;
    for (i, (member, (result, buf))) in kinds.into_iter().zip(results).enumerate() {
        if i == 0 {
            *view = buf.expect("write returns its buffer");
        }
        match result {
            Ok(()) => written += 1,
            Err(error) => {
                env.vd.member_error(member, OpKind::Write, &error);
            }
        }
    }
    if written == 0 {
        return Err(env.vd.offline_error());
    }
    Ok(())
}
