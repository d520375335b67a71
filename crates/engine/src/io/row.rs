//! Rows, views, and member I/O with retry and error booking: what every span kind's path is
//! built from.

use crate::runtime::{DriveDone, LockKey, Reactor, RowLock};
use crate::vd::{MemberFault, MemberSet, MemberState, VdError, VirtualDrive};
use drive::{DriveOp, IoBuf, OpKind};
use futures::future::join_all;
use layout::{DataPiece, Geometry, RowMap, RowPiece};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

/// What one attempt at a row ran into.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// A member failed an operation; book it and retry without it.
    Member(MemberFault),
    /// The row has lost more members than its span tolerates.
    Lost,
    /// Recovering the row needs parity that may be stale (not resynced after an unclean stop).
    Unsynced { row: u64 },
}

pub(super) type Attempt<T> = Result<T, AttemptError>;

/// Retries an attempt at most once per member plus one.
pub(super) fn retry_limit(vd: &VirtualDrive) -> usize {
    vd.members().len() + 1
}

pub(crate) struct Env {
    pub reactor: Rc<Reactor>,
    pub vd: Arc<VirtualDrive>,
    /// A write that goes around the journal (`cache::bypass`): a parity row it writes whole
    /// needs no row image (`io::parity::row_log`).
    pub full_rows_unlogged: bool,
    /// Set when a row of the request was written without an image a replay could restore it
    /// from (`io::parity::row_log` marked it unlogged), or went out with another request's row
    /// write (`io::gather`): what [`super::serve_imaged`] reports.
    pub not_imaged: Cell<bool>,
}

impl Env {
    pub(crate) fn new(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>) -> Env {
        Env { reactor, vd, full_rows_unlogged: false, not_imaged: Cell::new(false) }
    }

    /// Queues for the lock of `row` and waits until it is held.
    pub(super) async fn lock_row(&self, row: u64) -> RowLock {
        let lock = self.reactor.lock(LockKey { vd_id: self.vd.id(), row });
        lock.acquired().await;
        lock
    }
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
    /// Every strip of row `row`, whole: what rebuild and check work on.
    pub(super) fn whole(geometry: &Geometry, row: u64) -> Row {
        let map = geometry.row_map(row);
        let len_bytes = geometry.row_data_bytes();
        let piece = RowPiece { row, vd_offset_bytes: row * len_bytes, offset_in_row_bytes: 0, len_bytes };
        let pieces = map.data_pieces(0, len_bytes).collect();
        let whole = Row { map, pieces, lo: 0, hi: 0 }.with_columns(piece);
        assert!(whole.pieces.len() == whole.map.data_strip_count(), "a whole row has one piece per data strip");
        assert!(whole.width_bytes() as u64 == whole.map.strip_size_bytes(), "a whole row covers whole strips");
        whole
    }

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

    /// Whether the pieces cover every data strip of the row whole (a full-stripe write).
    pub(super) fn is_whole(&self) -> bool {
        let strip_bytes = self.map.strip_size_bytes();
        self.pieces.len() == self.map.data_strip_count()
            && self.pieces.iter().all(|p| p.offset_in_strip_bytes == 0 && p.len_bytes == strip_bytes)
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
        span_members(&self.map)
    }
}

/// Every member of `map`'s span, with where its strip starts: data strips `0..m` (copy 0),
/// then P, then Q.
pub(super) fn span_members(map: &RowMap) -> Vec<(usize, u64)> {
    let data = (0..map.data_strip_count()).map(|k| map.data_copy(k, 0));
    data.chain([map.p_place(), map.q_place()].into_iter().flatten()).map(|place| (place.drive, place.drive_offset_bytes)).collect()
}

/// What [`member_submit`] returns: the drive's [`DriveDone`], with its error as the member's
/// [`MemberFault`] for the caller to book.
pub(super) struct MemberDone {
    pub result: Result<(), MemberFault>,
    pub buf: Option<IoBuf>,
    pub bufs: Vec<IoBuf>,
}

/// Runs one member operation, keeping the member's queue depth and head position current.
///
/// Its fault carries the member's rebuild epoch from before the submission, so that an error
/// of a drive that left the member's place meanwhile (a spare or a re-add took it) is not
/// booked against the drive there now, however late the caller books it.
pub(super) async fn member_submit(env: &Env, index: usize, op: DriveOp) -> MemberDone {
    env.vd.assert_in_data_area(index, &op);
    let member = env.vd.member(index);
    let range = op.range_bytes();
    let kind = op.kind();
    let is_read = matches!(op, DriveOp::Read { .. } | DriveOp::ReadV { .. });
    env.vd.member_io_started(index);
    // Before the drive: `start_rebuild` sets the drive, then moves the epoch.
    let epoch = env.vd.rebuild_epoch(index);
    // The copy before the drive, and held until the operation is done (see `vd::copy`).
    let copy = member.copy_target();
    let done: DriveDone = match &copy {
        Some(copy) => super::copy::tee(env, index, copy, &member.drive(), op).await,
        None => member.with_drive(|drive| env.reactor.submit(drive, op)).await,
    };
    drop(copy);
    env.vd.member_io_ended(index);
    if let Some((offset_bytes, len_bytes)) = range {
        env.vd.note_member_io(index, offset_bytes, len_bytes, is_read);
    }
    let result = done.result.map_err(|error| MemberFault { index, kind, error, epoch });
    MemberDone { result, buf: done.buf, bufs: done.bufs }
}

/// [`member_submit`] for a single-buffer operation.
pub(super) async fn member_io(env: &Env, index: usize, op: DriveOp) -> (Result<(), MemberFault>, Option<IoBuf>) {
    let done = member_submit(env, index, op).await;
    (done.result, done.buf)
}

/// Runs member operations concurrently. Returns the buffers in order and the first error, for
/// the caller to book; see [`first_error_booking_writes`] for the others.
pub(super) async fn run_all(env: &Env, ops: Vec<(usize, DriveOp)>) -> (Vec<Option<IoBuf>>, Option<AttemptError>) {
    let results = join_all(ops.into_iter().map(|(index, op)| member_io(env, index, op))).await;
    let mut faults = Vec::new();
    let mut bufs = Vec::with_capacity(results.len());
    for (result, buf) in results {
        if let Err(fault) = result {
            faults.push(fault);
        }
        bufs.push(buf);
    }
    (bufs, first_error_booking_writes(env, faults))
}

/// The first of an attempt's member errors, to be booked by the caller; every other member
/// that failed a write (or flush) is booked now. Such a member holds stale data where the
/// attempt wrote: a retry that still counted it in service would compute parity from it (a
/// RAID6 row that lost a data strip's and P's writes in one attempt would rebuild the strip
/// from the old P, and write the garbage into Q). A member that failed a read needs no haste:
/// its data is not used, and the retry meets the error again.
pub(super) fn first_error_booking_writes(env: &Env, faults: Vec<MemberFault>) -> Option<AttemptError> {
    let mut faults = faults.into_iter();
    let first = faults.next()?;
    for other in faults.filter(|other| other.kind != OpKind::Read) {
        env.vd.member_error(&other);
    }
    Some(AttemptError::Member(first))
}

pub(super) fn read_op(offset_bytes: u64, len_bytes: usize) -> DriveOp {
    DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) }
}

/// Books a failed attempt. Returns the error to give up with, or `None` to retry.
pub(super) fn book(env: &Env, error: AttemptError, avoid: &mut MemberSet) -> Option<VdError> {
    match error {
        AttemptError::Lost => Some(env.vd.offline_error()),
        AttemptError::Unsynced { row } => Some(VdError::RowNotResynced { vd: env.vd.name(), row }),
        AttemptError::Member(fault) => {
            if !env.vd.member_error(&fault) {
                avoid.insert(fault.index);
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
        if let (Err(fault), _) = member_io(env, member, op).await {
            env.vd.member_error(&fault);
        } else {
            tracing::info!(vd = %env.vd.name(), member, offset_bytes, "repaired a read error from redundancy");
        }
    }
}

/// Members that are written: online, or being rebuilt.
pub(super) fn in_service(vd: &VirtualDrive) -> Vec<usize> {
    (0..vd.members().len()).filter(|&m| matches!(vd.member(m).state(), MemberState::Online | MemberState::Rebuilding)).collect()
}

/// Fails a row job that needs every member of `members` in service, naming the first that is not.
pub(super) fn require_online(env: &Env, row: u64, mut members: impl Iterator<Item = usize>) -> Result<(), VdError> {
    let unavailable = env.vd.unavailable();
    match members.find(|&member| unavailable.contains(member)) {
        Some(member) => Err(VdError::RowMemberOut { vd: env.vd.name(), row, member }),
        None => Ok(()),
    }
}

/// Reads whole strips, (member, drive offset), for a row job; a read error is booked and fails
/// the job with its member named (`action` says what the reads were for).
pub(super) async fn read_strips(env: &Env, row: u64, places: &[(usize, u64)], action: &'static str) -> Result<Vec<IoBuf>, VdError> {
    let strip_bytes = env.vd.geometry().strip_size_bytes() as usize;
    let reads = places.iter().map(|&(member, offset_bytes)| (member, read_op(offset_bytes, strip_bytes))).collect();
    let (bufs, error) = run_all(env, reads).await;
    if let Some(AttemptError::Member(fault)) = error {
        env.vd.member_error(&fault);
        return Err(VdError::RowMemberIo { vd: env.vd.name(), row, member: fault.index, action, error: fault.error });
    }
    Ok(bufs.into_iter().map(|buf| buf.expect("read returns its buffer")).collect())
}

/// Writes strips a row job rebuilt or repaired: (member, drive offset, contents). Every member
/// that fails its write is taken out of service (its strip is now stale); the first is named.
pub(super) async fn write_strips(env: &Env, row: u64, writes: Vec<(usize, u64, IoBuf)>, action: &'static str) -> Result<(), VdError> {
    let places: Vec<(usize, u64)> = writes.iter().map(|&(member, offset_bytes, _)| (member, offset_bytes)).collect();
    assert!(places.iter().enumerate().all(|(i, p)| !places[..i].contains(p)), "a row job writes each strip once: {places:?}");
    let ops = writes.into_iter().map(|(member, offset_bytes, buf)| member_io(env, member, DriveOp::Write { offset_bytes, buf }));
    let mut first_error = None;
    for (result, _) in join_all(ops).await {
        if let Err(fault) = result {
            env.vd.member_error(&fault);
            let (member, error) = (fault.index, fault.error);
            first_error.get_or_insert(VdError::RowMemberIo { vd: env.vd.name(), row, member, action, error });
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Flushes every online member's cache; a member that fails it is booked.
/// Flushes every member in service (a member being rebuilt too: what it was written must be
/// durable before a checkpoint or a client's flush says so).
pub(super) async fn flush(env: &Env) -> Result<(), VdError> {
    let members = in_service(&env.vd);
    let flushes = join_all(members.iter().map(|&member| member_io(env, member, DriveOp::Flush)));
    let (flushed, ()) = futures::future::join(flushes, super::migrate::run_twin(env, super::migrate::twin_flush(env))).await;
    for (result, _) in flushed {
        if let Err(fault) = result {
            env.vd.member_error(&fault);
        }
    }
    match env.vd.state() {
        crate::VdState::Offline => Err(env.vd.offline_error()),
        _ => Ok(()),
    }
}
