//! Rows, views, and member I/O with retry and error booking: what every span kind's path is
//! built from.

use crate::runtime::{DriveDone, Reactor};
use crate::vd::{MemberSet, MemberState, VdError, VirtualDrive};
use drive::{DriveError, DriveOp, IoBuf, OpKind};
use futures::future::join_all;
use layout::{DataPiece, RowMap, RowPiece};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What one attempt at a row ran into.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// A member failed an operation; book it and retry without it.
    Member { index: usize, kind: OpKind, error: DriveError },
    /// The row has lost more members than its span tolerates.
    Lost,
}

pub(super) type Attempt<T> = Result<T, AttemptError>;

/// Retries an attempt at most once per member plus one.
pub(super) fn retry_limit(vd: &VirtualDrive) -> usize {
    vd.members().len() + 1
}

pub(crate) struct Env {
    pub reactor: Rc<Reactor>,
    pub vd: Arc<VirtualDrive>,
}

pub(super) fn split_views(mut buf: IoBuf, pieces: &[DataPiece]) -> Vec<IoBuf> {
    let pieces_bytes: u64 = pieces.iter().map(|p| p.len_bytes).sum();
    assert_eq!(pieces_bytes, buf.len() as u64, "a row's pieces cover exactly the request's bytes in it");
    let mut views = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let rest = buf.split_off(piece.len_bytes as usize);
        views.push(std::mem::replace(&mut buf, rest));
    }
    debug_assert!(buf.is_empty());
    views
}

/// One row piece: where its strips are and which strip columns it touches.
pub(crate) struct Row {
    pub(super) map: RowMap,
    pub(super) pieces: Vec<DataPiece>,
    /// The strip-column hull `[lo, hi)` the pieces touch: the part of P/Q a write changes.
    pub(super) lo: u64,
    pub(super) hi: u64,
}

impl Row {
    pub(super) fn with_columns(mut self, piece: RowPiece) -> Row {
        let (lo, hi) = self.map.column_range(piece.offset_in_row_bytes, piece.len_bytes);
        self.lo = lo;
        self.hi = hi;
        self.check();
        self
    }

    /// The invariants every row function relies on: pieces in strip order, each strip at most
    /// once, each inside the column hull and inside its strip.
    pub(super) fn check(&self) {
        assert!(self.lo < self.hi && self.hi <= self.map.strip_size_bytes(), "column hull [{}, {}) inside a strip", self.lo, self.hi);
        for pair in self.pieces.windows(2) {
            assert!(pair[0].strip_index < pair[1].strip_index, "pieces in strip order, each strip once: {:?}", self.pieces);
        }
        for piece in &self.pieces {
            let end_bytes = piece.offset_in_strip_bytes + piece.len_bytes;
            assert!(piece.len_bytes > 0 && end_bytes <= self.map.strip_size_bytes(), "piece inside its strip: {piece:?}");
            assert!(piece.offset_in_strip_bytes >= self.lo && end_bytes <= self.hi, "piece inside the column hull: {piece:?}");
        }
    }

    pub(super) fn width_bytes(&self) -> usize {
        (self.hi - self.lo) as usize
    }

    /// The piece (and its index) that writes strip `k`, if any.
    pub(super) fn piece_of_strip(&self, k: usize) -> Option<(usize, &DataPiece)> {
        self.pieces.iter().enumerate().find(|(_, p)| p.strip_index == k)
    }

    /// Member index of copy 0 of strip `k`, and where the strip starts on it.
    pub(super) fn data_member(&self, k: usize) -> (usize, u64) {
        let place = self.map.data_copy(k, 0);
        (place.drive, place.drive_offset_bytes)
    }

    /// Every member of the row's span with its role: data strips `0..m`, then P, then Q.
    pub(super) fn span_members(&self) -> Vec<(usize, u64)> {
        let m = self.map.data_strip_count();
        let mut members: Vec<(usize, u64)> = (0..m).map(|k| self.data_member(k)).collect();
        for place in [self.map.p_place(), self.map.q_place()].into_iter().flatten() {
            members.push((place.drive, place.drive_offset_bytes));
        }
        members
    }
}

/// Runs one member operation, keeping the member's queue depth and head position current.
pub(super) async fn member_submit(env: &Env, index: usize, op: DriveOp) -> DriveDone {
    let member = env.vd.member(index);
    let end_bytes = op.range_bytes().map(|(offset, len)| offset + len);
    member.outstanding.fetch_add(1, Ordering::Relaxed);
    let done = env.reactor.submit(&*member.drive, op).await;
    member.outstanding.fetch_sub(1, Ordering::Relaxed);
    if let Some(end) = end_bytes {
        member.last_end_bytes.store(end, Ordering::Relaxed);
    }
    done
}

/// [`member_submit`] for a single-buffer operation.
pub(super) async fn member_io(env: &Env, index: usize, op: DriveOp) -> (Result<(), DriveError>, Option<IoBuf>) {
    let done = member_submit(env, index, op).await;
    (done.result, done.buf)
}

/// Runs member operations concurrently. Returns the buffers in order and the first error.
pub(super) async fn run_all(env: &Env, ops: Vec<(usize, DriveOp)>) -> (Vec<Option<IoBuf>>, Option<AttemptError>) {
    let kinds: Vec<(usize, OpKind)> = ops.iter().map(|(index, op)| (*index, op.kind())).collect();
    let results = join_all(ops.into_iter().map(|(index, op)| member_io(env, index, op))).await;
    let mut first_error = None;
    let mut bufs = Vec::with_capacity(results.len());
    for ((index, kind), (result, buf)) in kinds.into_iter().zip(results) {
        if let (Err(error), None) = (result, &first_error) {
            first_error = Some(AttemptError::Member { index, kind, error });
        }
        bufs.push(buf);
    }
    (bufs, first_error)
}

pub(super) fn read_op(offset_bytes: u64, len_bytes: usize) -> DriveOp {
    DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) }
}

/// Books a failed attempt. Returns the error to give up with, or `None` to retry.
pub(super) fn book(env: &Env, error: AttemptError, avoid: &mut MemberSet) -> Option<VdError> {
    match error {
        AttemptError::Lost => Some(env.vd.offline_error()),
        AttemptError::Member { index, kind, error } => {
            if !env.vd.member_error(index, kind, &error) {
                avoid.insert(index);
            }
            (env.vd.state() == crate::VdState::Offline).then(|| env.vd.offline_error())
        }
    }
}

/// Writes good data back over places that returned read errors (md's read repair). A failed
/// write-back takes the member out of service.
pub(super) async fn repair_copies(env: &Env, places: &[(usize, u64)], good: &IoBuf) {
    for &(member, offset_bytes) in places {
        if env.vd.member(member).state() != MemberState::Online {
            continue;
        }
        let op = DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(good.as_slice()) };
        if let (Err(error), _) = member_io(env, member, op).await {
            env.vd.member_error(member, OpKind::Write, &error);
        } else {
            tracing::info!(vd = %env.vd.name(), member, offset_bytes, "repaired a read error from redundancy");
        }
    }
}

/// Flushes every online member's cache; a member that fails it is booked.
pub(super) async fn flush(env: &Env) -> Result<(), VdError> {
    let online: Vec<usize> = (0..env.vd.members().len()).filter(|&m| env.vd.member(m).state() == MemberState::Online).collect();
    let flushes = online.iter().map(|&member| member_io(env, member, DriveOp::Flush));
    for (&member, (result, _)) in online.iter().zip(join_all(flushes).await) {
        if let Err(error) = result {
            env.vd.member_error(member, OpKind::Flush, &error);
        }
    }
    match env.vd.state() {
        crate::VdState::Offline => Err(env.vd.offline_error()),
        _ => Ok(()),
    }
}
