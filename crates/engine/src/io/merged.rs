//! Merged I/O: one member operation per run of a drive's contiguous pieces, as the block layer
//! merges adjacent bios. Used for RAID0/JBOD, and for parity-level reads while every member of
//! the request's rows is online (any error sends the request back through the row paths).

use super::row::{member_submit, AttemptError, Env, Row};
use super::SpanIo;
use crate::runtime::LockKey;
use crate::vd::{CheckMode, CheckOutcome, MemberFault, MemberSet, VdCompletion, VdError};
use drive::{DriveError, DriveOp, IoBuf, OpKind};
use futures::future::join_all;

/// Largest merged member I/O, and most pieces in one vectored operation.
const MERGED_IO_BYTES_MAX: u64 = 1 << 20;
const MERGED_PIECES_MAX: usize = 256;

/// A run of pieces that are contiguous on one drive: (member, drive offset, piece indices).
type MergedRun = (usize, u64, Vec<usize>);

pub(super) async fn merged_io(env: &Env, offset_bytes: u64, mut buf: IoBuf, write: bool) -> (Result<(), AttemptError>, IoBuf) {
    let geometry = *env.vd.geometry();
    let mut locks = Vec::new();
    let mut pieces: Vec<(usize, u64, IoBuf)> = Vec::new();
    for row in geometry.rows(offset_bytes, buf.len() as u64) {
        if write {
            locks.push(env.reactor.lock(LockKey { vd_id: env.vd.id(), row: row.row }));
        }
        let map = geometry.row_map(row.row);
        for piece in map.data_pieces(row.offset_in_row_bytes, row.len_bytes) {
            let place = map.data_copy(piece.strip_index, 0);
            let rest = buf.split_off(piece.len_bytes as usize);
            pieces.push((place.drive, place.drive_offset_bytes + piece.offset_in_strip_bytes, std::mem::replace(&mut buf, rest)));
        }
    }
    for lock in &locks {
        lock.acquired().await;
    }
    // A migration's copy of the write, decided under the row locks (`vd::migration`).
    let twin = if write && env.vd.is_migrating() {
        let parts: Vec<&[u8]> = pieces.iter().map(|(_, _, view)| view.as_slice()).collect();
        super::migrate::twin_write(env, offset_bytes, &parts)
    } else {
        None
    };
    let unavailable = env.vd.unavailable();
    if let Some(&(member, _, _)) = pieces.iter().find(|(member, _, _)| unavailable.contains(*member)) {
        let kind = if write { OpKind::Write } else { OpKind::Read };
        let error = AttemptError::Member(MemberFault::now(&env.vd, member, kind, DriveError::Gone));
        return (Err(error), IoBuf::join(pieces.into_iter().map(|(_, _, view)| view)));
    }
    let runs = merge_runs(&pieces);
    let mut views: Vec<Option<IoBuf>> = pieces.into_iter().map(|(_, _, view)| Some(view)).collect();
    let ops = runs.iter().map(|(member, offset, indices)| {
        let bufs: Vec<IoBuf> = indices.iter().map(|&i| views[i].take().expect("each piece in one run")).collect();
        (*member, vectored_op(*offset, bufs, write))
    });
    let ops: Vec<(usize, DriveOp)> = ops.collect();
    let members_io = join_all(ops.into_iter().map(|(member, op)| member_submit(env, member, op)));
    let (results, ()) = futures::future::join(members_io, super::migrate::run_twin(env, twin)).await;
    let mut first_error = None;
    for ((_, _, indices), done) in runs.iter().zip(results) {
        let returned = done.buf.into_iter().chain(done.bufs);
        for (&i, view) in indices.iter().zip(returned) {
            views[i] = Some(view);
        }
        if let (Err(fault), None) = (done.result, &first_error) {
            first_error = Some(AttemptError::Member(fault));
        }
    }
    drop(locks);
    let buf = IoBuf::join(views.into_iter().map(|v| v.expect("every piece returned")));
    (first_error.map_or(Ok(()), Err), buf)
}

/// Groups pieces (member, drive offset, buffer) into runs contiguous on one drive.
fn merge_runs(pieces: &[(usize, u64, IoBuf)]) -> Vec<MergedRun> {
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by_key(|&i| (pieces[i].0, pieces[i].1));
    let mut runs: Vec<MergedRun> = Vec::new();
    let mut run_end = 0u64;
    let mut run_bytes = 0u64;
    for i in order {
        let (member, offset, ref view) = pieces[i];
        let len = view.len() as u64;
        match runs.last_mut() {
            Some((m, _, indices))
                if *m == member && run_end == offset && run_bytes + len <= MERGED_IO_BYTES_MAX && indices.len() < MERGED_PIECES_MAX =>
            {
                indices.push(i);
                run_bytes += len;
            }
            _ => {
                runs.push((member, offset, vec![i]));
                run_bytes = len;
            }
        }
        run_end = offset + len;
    }
    runs
}

fn vectored_op(offset_bytes: u64, mut bufs: Vec<IoBuf>, write: bool) -> DriveOp {
    match (bufs.len(), write) {
        (1, true) => DriveOp::Write { offset_bytes, buf: bufs.pop().expect("one") },
        (1, false) => DriveOp::Read { offset_bytes, buf: bufs.pop().expect("one") },
        (_, true) => DriveOp::WriteV { offset_bytes, bufs },
        (_, false) => DriveOp::ReadV { offset_bytes, bufs },
    }
}

pub(super) fn stripe_error(env: &Env, error: AttemptError, buf: IoBuf) -> VdCompletion {
    let result = match error {
        AttemptError::Member(fault) => {
            env.vd.member_error(&fault);
            match env.vd.state() {
                crate::VdState::Offline => Err(env.vd.offline_error()),
                _ => Err(VdError::Unrecoverable { vd: env.vd.name(), member: fault.index, error: fault.error }),
            }
        }
        AttemptError::Lost => Err(env.vd.offline_error()),
        AttemptError::Unsynced { row } => Err(VdError::RowNotResynced { vd: env.vd.name(), row }),
    };
    VdCompletion { result, buf: Some(buf) }
}

/// RAID0 and JBOD: every request goes through [`merged_io`], so their read and write row
/// functions are never called; they have no redundancy to rebuild or check a row from.
pub(crate) struct Stripe;

impl SpanIo for Stripe {
    async fn read(_env: &Env, _row: &Row, _views: &mut [IoBuf]) -> Result<(), VdError> {
        unreachable!("stripe levels read through the merged path")
    }
    async fn write(_env: &Env, _row: &Row, _views: &mut Vec<IoBuf>) -> Result<(), VdError> {
        unreachable!("stripe levels write through the merged path")
    }
    async fn rebuild_row(env: &Env, _row: &Row, _targets: MemberSet) -> Result<(), VdError> {
        Err(no_redundancy(env, "rebuild"))
    }
    async fn check_row(env: &Env, _row: &Row, _mode: CheckMode) -> Result<CheckOutcome, VdError> {
        Err(no_redundancy(env, "check"))
    }
}

fn no_redundancy(env: &Env, action: &'static str) -> VdError {
    VdError::NoRedundancy { vd: env.vd.name(), level: env.vd.geometry().level(), action }
}
