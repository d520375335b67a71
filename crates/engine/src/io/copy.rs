//! Copying a member to another drive while it serves (`vd::copy`): the write tee that keeps the
//! target current behind the copy, and the row job that copies one row.

use super::row::{read_op, run_all, AttemptError, Env, Row};
use super::{on_span, RebuildTask};
use crate::runtime::{DriveDone, Reactor};
use crate::vd::{same_drive, CopyTarget, MemberSet, MemberState, VdError, VirtualDrive};
use drive::{Drive, DriveOp, IoBuf, OpKind};
use futures::future::join_all;
use std::rc::Rc;
use std::sync::Arc;

/// Runs `op` on the member's `drive` and, for a write or a flush, the same on the copy target:
/// the target must hold every write the member takes while it is copied, or the rows the copy
/// has passed would go stale on it. The member's outcome is the operation's outcome; a target
/// that fails is booked (the copy cannot finish) and never fails the member's operation.
pub(super) async fn tee(env: &Env, index: usize, copy: &CopyTarget, drive: &Arc<dyn Drive>, op: DriveOp) -> DriveDone {
    let twin = twin_of(&op).filter(|_| !copy.has_failed() && !same_drive(drive, copy.target()));
    let Some(twin) = twin else { return env.reactor.submit(&**drive, op).await };
    let kind = twin.kind();
    let (done, twin_done) = futures::future::join(env.reactor.submit(&**drive, op), env.reactor.submit(&**copy.target(), twin)).await;
    if let Err(error) = twin_done.result {
        env.vd.copy_target_error(index, copy, kind, &error);
    }
    done
}

/// The operation the copy target gets for `op`: the same write (its data copied, since the
/// buffers travel with the member's operation) or flush; nothing for a read.
fn twin_of(op: &DriveOp) -> Option<DriveOp> {
    match op {
        DriveOp::Write { offset_bytes, buf } => {
            Some(DriveOp::Write { offset_bytes: *offset_bytes, buf: IoBuf::from_slice(buf.as_slice()) })
        }
        DriveOp::WriteV { offset_bytes, bufs } => {
            let mut buf = IoBuf::zeroed(bufs.iter().map(IoBuf::len).sum());
            let mut at = 0;
            for piece in bufs {
                buf.as_mut_slice()[at..at + piece.len()].copy_from_slice(piece.as_slice());
                at += piece.len();
            }
            Some(DriveOp::Write { offset_bytes: *offset_bytes, buf })
        }
        DriveOp::Flush => Some(DriveOp::Flush),
        DriveOp::Read { .. } | DriveOp::ReadV { .. } => None,
    }
}

/// Copies member `member`'s strips of row `row` (a row this shard owns) to its copy target,
/// under the row lock: a client write to the row comes wholly before (and the copy reads it) or
/// wholly after (and the tee writes it to the target too).
///
/// A strip the member cannot read is rebuilt from the other members, which writes it to the
/// member (repairing it) and, through the tee, to the target.
///
/// # Errors
/// [`VdError::CopyEnded`] when the member is not being copied (any more) or is out of service;
/// [`VdError::RowMemberIo`] when the target fails its write (the target is booked failed);
/// what the rebuild of an unreadable strip returns.
pub(crate) async fn copy_row(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, row: u64, member: usize) -> Result<(), VdError> {
    let env = Env::new(reactor, vd);
    if env.vd.is_retired() {
        return Err(VdError::Deleted { vd: env.vd.name() });
    }
    let _lock = env.lock_row(row).await;
    let ended = || VdError::CopyEnded { vd: env.vd.name(), member };
    let copy = env.vd.copy_target(member).filter(|copy| !copy.has_failed()).ok_or_else(ended)?;
    if env.vd.member(member).state() != MemberState::Online {
        return Err(ended());
    }
    let geometry = *env.vd.geometry();
    let strip_bytes = geometry.strip_size_bytes() as usize;
    let map = geometry.row_map(row);
    let offsets: Vec<u64> =
        map.members().filter(|(place, _, _)| place.drive == member).map(|(place, _, _)| place.drive_offset_bytes).collect();
    let reads = offsets.iter().map(|&offset_bytes| (member, read_op(offset_bytes, strip_bytes))).collect();
    let (bufs, error) = run_all(&env, reads).await;
    if let Some(AttemptError::Member(fault)) = error {
        env.vd.member_error(&fault);
        if env.vd.member(member).state() != MemberState::Online {
            return Err(ended());
        }
        let whole = Row::whole(&geometry, row);
        let rows = [whole];
        let mut results = on_span(&env, RebuildTask(&rows, MemberSet::of(&[member]))).await;
        return results.pop().expect("a run of one row reports it");
    }
    let writes = offsets.iter().zip(bufs).map(|(&offset_bytes, buf)| {
        let buf = buf.expect("a read returns its buffer");
        env.reactor.submit(&**copy.target(), DriveOp::Write { offset_bytes, buf })
    });
    let failure = join_all(writes).await.into_iter().find_map(|done| done.result.err());
    if let Some(error) = failure {
        env.vd.copy_target_error(member, &copy, OpKind::Write, &error);
        return Err(VdError::RowMemberIo { vd: env.vd.name(), row, member, action: "copying to the target of", error });
    }
    Ok(())
}
