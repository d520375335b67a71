//! The I/O path of every level, written once over the row model of `layout`.
//!
//! A request is cut into row pieces; each row piece is served by the path of its span kind:
//!
//! - stripe (RAID0, JBOD): one member I/O per strip piece;
//! - mirror (RAID1, 10, 1E): writes go to every available copy; reads go to the copy with fewer
//!   outstanding I/Os, ties broken by the nearer head position (the reviews' "luckier disk");
//! - parity (RAID5, 6, 50, 60): writes pick the full-stripe, reconstruct-write or
//!   read-modify-write plan that needs the fewest member reads; reads go straight to the data
//!   strip and fall back to reconstruction when its member is missing or returns an error.
//!
//! Every write takes the row lock, so overlapping writes land in submission order and parity is
//! never computed from a half-written row. Reads take it only when they reconstruct.
//!
//! Member errors do not fail a request while redundancy remains: the member's error is booked
//! (which may take it out of service), and the row is retried with that member avoided. A retry
//! after a partly applied write is safe because every member written so far holds its value of
//! the *new* row, and the untouched members hold values common to the old and the new row.

use crate::runtime::{LockKey, Reactor};
use crate::vd::{MemberSet, MemberState, VdCompletion, VdError, VdRequest, VirtualDrive};
use drive::{DriveError, DriveOp, IoBuf, OpKind};
use futures::future::join_all;
use layout::{DataPiece, RowMap, RowPiece, SpanKind};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What one attempt at a row ran into.
#[derive(Debug)]
enum AttemptError {
    /// A member failed an operation; book it and retry without it.
    Member { index: usize, kind: OpKind, error: DriveError },
    /// The row has lost more members than its span tolerates.
    Lost,
}

type Attempt<T> = Result<T, AttemptError>;

/// Retries an attempt at most once per member plus one.
fn retry_limit(vd: &VirtualDrive) -> usize {
    vd.members().len() + 1
}

pub(crate) struct Env {
    pub reactor: Rc<Reactor>,
    pub vd: Arc<VirtualDrive>,
}

/// Serves one request whose range lies in rows this shard owns (or a flush).
pub(crate) async fn serve(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, request: VdRequest) -> VdCompletion {
    let env = Env { reactor, vd };
    if env.vd.is_retired() {
        // Queued before the VD was deleted; its drives may belong to another VD by now.
        return VdCompletion { result: Err(VdError::Deleted { vd: env.vd.name() }), buf: request.into_buf() };
    }
    if env.vd.state() == crate::VdState::Offline {
        return VdCompletion { result: Err(env.vd.offline_error()), buf: request.into_buf() };
    }
    match request {
        VdRequest::Flush => VdCompletion { result: flush(&env).await, buf: None },
        VdRequest::Read { offset_bytes, buf } => serve_rows(&env, offset_bytes, buf, false).await,
        VdRequest::Write { offset_bytes, buf } => {
            env.vd.note_write();
            serve_rows(&env, offset_bytes, buf, true).await
        }
    }
}

/// Splits a range into row pieces and serves them concurrently. Each row future takes its lock
/// on first poll, and `join_all` polls them in row order, so locks queue in submission order.
async fn serve_rows(env: &Env, offset_bytes: u64, buf: IoBuf, write: bool) -> VdCompletion {
    let kind = env.vd.geometry().span_kind();
    let merged_read = !write && kind != SpanKind::Mirror && kind != SpanKind::OffsetMirror;
    if kind == SpanKind::Stripe || merged_read {
        let (result, buf) = merged_io(env, offset_bytes, buf, write).await;
        match result {
            Ok(()) => return VdCompletion { result: Ok(()), buf: Some(buf) },
            // A stripe level has no redundancy to retry with.
            Err(error) if kind == SpanKind::Stripe => return stripe_error(env, error, buf),
            // Parity levels: redo it row by row, which reconstructs and books the error.
            Err(_) => return serve_row_by_row(env, offset_bytes, buf, write).await,
        }
    }
    serve_row_by_row(env, offset_bytes, buf, write).await
}

async fn serve_row_by_row(env: &Env, offset_bytes: u64, mut buf: IoBuf, write: bool) -> VdCompletion {
    let geometry = *env.vd.geometry();
    let mut rows = Vec::new();
    for piece in geometry.rows(offset_bytes, buf.len() as u64) {
        let rest = buf.split_off(piece.len_bytes as usize);
        rows.push((piece, std::mem::replace(&mut buf, rest)));
    }
    let futures = rows.into_iter().map(|(piece, row_buf)| serve_row(env, piece, row_buf, write));
    let mut result = Ok(());
    let mut views = Vec::new();
    for (row_result, row_buf) in join_all(futures).await {
        if result.is_ok() {
            result = row_result;
        }
        views.push(row_buf);
    }
    VdCompletion { result, buf: Some(IoBuf::join(views)) }
}

async fn serve_row(env: &Env, piece: RowPiece, buf: IoBuf, write: bool) -> (Result<(), VdError>, IoBuf) {
    let map = env.vd.geometry().row_map(piece.row);
    let pieces: Vec<DataPiece> = map.data_pieces(piece.offset_in_row_bytes, piece.len_bytes).collect();
    let mut views = split_views(buf, &pieces);
    let lock = write.then(|| env.reactor.lock(LockKey { vd_id: env.vd.id(), row: piece.row }));
    if let Some(lock) = &lock {
        // The ticket was taken when the lock was created; wait for our turn.
        lock.acquired().await;
    }
    let row = Row { map, pieces, lo: 0, hi: 0 }.with_columns(piece);
    let result = match (env.vd.geometry().span_kind(), write) {
        // RAID0/JBOD never come here: serve_rows sends them through merged_io.
        (SpanKind::Stripe, _) => unreachable!("stripe levels use the merged path"),
        (SpanKind::Mirror | SpanKind::OffsetMirror, false) => mirror_read(env, &row, &mut views).await,
        (SpanKind::Mirror | SpanKind::OffsetMirror, true) => mirror_write(env, &row, &mut views).await,
        (_, false) => parity_read(env, &row, &mut views).await,
        (_, true) => parity_write(env, &row, &mut views).await,
    };
    drop(lock);
    (result, IoBuf::join(views))
}

fn split_views(mut buf: IoBuf, pieces: &[DataPiece]) -> Vec<IoBuf> {
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
struct Row {
    map: RowMap,
    pieces: Vec<DataPiece>,
    /// The strip-column hull `[lo, hi)` the pieces touch: the part of P/Q a write changes.
    lo: u64,
    hi: u64,
}

impl Row {
    fn with_columns(mut self, piece: RowPiece) -> Row {
        let (lo, hi) = self.map.column_range(piece.offset_in_row_bytes, piece.len_bytes);
        self.lo = lo;
        self.hi = hi;
        self.check();
        self
    }

    /// The invariants every row function relies on: pieces in strip order, each strip at most
    /// once, each inside the column hull and inside its strip.
    fn check(&self) {
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

    fn width_bytes(&self) -> usize {
        (self.hi - self.lo) as usize
    }

    /// The piece (and its index) that writes strip `k`, if any.
    fn piece_of_strip(&self, k: usize) -> Option<(usize, &DataPiece)> {
        self.pieces.iter().enumerate().find(|(_, p)| p.strip_index == k)
    }

    /// Member index of copy 0 of strip `k`, and where the strip starts on it.
    fn data_member(&self, k: usize) -> (usize, u64) {
        let place = self.map.data_copy(k, 0);
        (place.drive, place.drive_offset_bytes)
    }

    /// Every member of the row's span with its role: data strips `0..m`, then P, then Q.
    fn span_members(&self) -> Vec<(usize, u64)> {
        let m = self.map.data_strip_count();
        let mut members: Vec<(usize, u64)> = (0..m).map(|k| self.data_member(k)).collect();
        for place in [self.map.p_place(), self.map.q_place()].into_iter().flatten() {
            members.push((place.drive, place.drive_offset_bytes));
        }
        members
    }
}

/// Runs one member operation, keeping the member's queue depth and head position current.
async fn member_submit(env: &Env, index: usize, op: DriveOp) -> crate::runtime::DriveDone {
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
async fn member_io(env: &Env, index: usize, op: DriveOp) -> (Result<(), DriveError>, Option<IoBuf>) {
    let done = member_submit(env, index, op).await;
    (done.result, done.buf)
}

/// Runs member operations concurrently. Returns the buffers in order and the first error.
async fn run_all(env: &Env, ops: Vec<(usize, DriveOp)>) -> (Vec<Option<IoBuf>>, Option<AttemptError>) {
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

fn read_op(offset_bytes: u64, len_bytes: usize) -> DriveOp {
    DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) }
}

/// Books a failed attempt. Returns the error to give up with, or `None` to retry.
fn book(env: &Env, error: AttemptError, avoid: &mut MemberSet) -> Option<VdError> {
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

// ---------------------------------------------------------------------------------------------
// Merged I/O: one member operation per run of a drive's contiguous pieces, as the block layer
// merges adjacent bios. Used for RAID0/JBOD, and for parity-level reads while every member of
// the request's rows is online (any error sends the request back through the row paths).

/// Largest merged member I/O, and most pieces in one vectored operation.
const MERGED_IO_BYTES_MAX: u64 = 1 << 20;
const MERGED_PIECES_MAX: usize = 256;

/// A run of pieces that are contiguous on one drive: (member, drive offset, piece indices).
type MergedRun = (usize, u64, Vec<usize>);

async fn merged_io(env: &Env, offset_bytes: u64, mut buf: IoBuf, write: bool) -> (Result<(), AttemptError>, IoBuf) {
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
    let unavailable = env.vd.unavailable();
    if let Some(&(member, _, _)) = pieces.iter().find(|(member, _, _)| unavailable.contains(*member)) {
        let error = AttemptError::Member { index: member, kind: if write { OpKind::Write } else { OpKind::Read }, error: DriveError::Gone };
        return (Err(error), IoBuf::join(pieces.into_iter().map(|(_, _, view)| view)));
    }
    let runs = merge_runs(&pieces);
    let mut views: Vec<Option<IoBuf>> = pieces.into_iter().map(|(_, _, view)| Some(view)).collect();
    let ops = runs.iter().map(|(member, offset, indices)| {
        let bufs: Vec<IoBuf> = indices.iter().map(|&i| views[i].take().expect("each piece in one run")).collect();
        (*member, vectored_op(*offset, bufs, write))
    });
    let ops: Vec<(usize, DriveOp)> = ops.collect();
    let results = join_all(ops.into_iter().map(|(member, op)| member_submit(env, member, op))).await;
    let mut first_error = None;
    for ((member, _, indices), done) in runs.iter().zip(results) {
        let returned = done.buf.into_iter().chain(done.bufs);
        for (&i, view) in indices.iter().zip(returned) {
            views[i] = Some(view);
        }
        if let (Err(error), None) = (done.result, &first_error) {
            first_error = Some(AttemptError::Member { index: *member, kind: if write { OpKind::Write } else { OpKind::Read }, error });
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

fn stripe_error(env: &Env, error: AttemptError, buf: IoBuf) -> VdCompletion {
    let result = match error {
        AttemptError::Member { index, kind, error } => {
            env.vd.member_error(index, kind, &error);
            match env.vd.state() {
                crate::VdState::Offline => Err(env.vd.offline_error()),
                _ => Err(VdError::Unrecoverable { vd: env.vd.name(), member: index, error }),
            }
        }
        AttemptError::Lost => Err(env.vd.offline_error()),
    };
    VdCompletion { result, buf: Some(buf) }
}

// ---------------------------------------------------------------------------------------------
// Mirrors: RAID1, RAID10, RAID1E.

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

/// Writes good data back over places that returned read errors (md's read repair). A failed
/// write-back takes the member out of service.
async fn repair_copies(env: &Env, places: &[(usize, u64)], good: &IoBuf) {
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

// ---------------------------------------------------------------------------------------------
// Parity: RAID5, RAID6, RAID50, RAID60.

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
        let unwritable = env.vd.unavailable();
        let unreadable = unwritable.union(avoid);
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
    for ((piece, mut delta), new) in row.pieces.iter().zip(bufs).zip(views.iter()) {
        parity::xor_into(delta.as_mut_slice(), new.as_slice());
        let at = (piece.offset_in_strip_bytes - row.lo) as usize;
        let len = piece.len_bytes as usize;
        let p_part = &mut p.as_mut_slice()[at..at + len];
        match &mut q {
            Some(q) => parity::pq_update(piece.strip_index, delta.as_slice(), p_part, &mut q.as_mut_slice()[at..at + len]),
            None => parity::xor_into(p_part, delta.as_slice()),
        }
    }
    write_row(env, row, views, p, q, MemberSet::default()).await
}

/// A write to a row with lost members: rebuild the touched columns of every strip in memory,
/// apply the new data, recompute parity and write what still has a member to go to.
async fn degraded_write(env: &Env, row: &Row, views: &mut Vec<IoBuf>, unreadable: MemberSet, unwritable: MemberSet) -> Attempt<()> {
    let mut columns = read_and_recover_columns(env, row, row.lo, row.hi, unreadable).await?;
    let m = row.map.data_strip_count();
    for (i, piece) in row.pieces.iter().enumerate() {
        let at = (piece.offset_in_strip_bytes - row.lo) as usize;
        columns[piece.strip_index].as_mut_slice()[at..at + views[i].len()].copy_from_slice(views[i].as_slice());
    }
    let data: Vec<&[u8]> = columns[..m].iter().map(|c| c.as_slice()).collect();
    let (p, q) = new_parity(env, row, &data);
    write_row(env, row, views, p, q, unwritable).await
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
    if lost.is_empty() {
        return;
    }
    let mut blocks: Vec<&mut [u8]> = columns.iter_mut().map(|c| c.as_mut_slice()).collect();
    let outcome = match kind {
        SpanKind::Parity => parity::raid5_recover(&mut blocks, lost[0]),
        SpanKind::DoubleParity => parity::raid6_recover(&mut blocks, lost),
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
    let mut data_slots = Vec::with_capacity(row.pieces.len());
    for (piece, buf) in row.pieces.iter().zip(std::mem::take(views)) {
        let (member, strip_offset) = row.data_member(piece.strip_index);
        let offset_bytes = strip_offset + piece.offset_in_strip_bytes;
        // A lost member's piece is not written, but the buffer must still come back.
        let member = if skip.contains(member) { None } else { Some(member) };
        data_slots.push((member, offset_bytes, buf));
    }
    let mut kept = Vec::new();
    for (slot, (member, offset_bytes, buf)) in data_slots.into_iter().enumerate() {
        match member {
            Some(member) => ops.push((member, DriveOp::Write { offset_bytes, buf })),
            None => kept.push((slot, buf)),
        }
    }
    let parity = [row.map.p_place().zip(Some(p)), row.map.q_place().zip(q)];
    for (place, buf) in parity.into_iter().flatten() {
        if !skip.contains(place.drive) {
            ops.push((place.drive, DriveOp::Write { offset_bytes: place.drive_offset_bytes + row.lo, buf }));
        }
    }
    let data_op_count = row.pieces.len() - kept.len();
    debug_assert!(
        ops.iter().enumerate().all(|(i, (member, _))| ops[..i].iter().all(|(other, _)| other != member)),
        "a row write touches each member at most once"
    );
    let (bufs, error) = run_all(env, ops).await;
    let mut written = bufs.into_iter().take(data_op_count).map(|b| b.expect("write returns its buffer"));
    let mut kept = kept.into_iter().peekable();
    *views = (0..row.pieces.len())
        .map(|slot| match kept.peek() {
            Some((kept_slot, _)) if *kept_slot == slot => kept.next().expect("peeked").1,
            _ => written.next().expect("one buffer per data write"),
        })
        .collect();
    error.map_or(Ok(()), Err)
}

async fn parity_read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError> {
    let unavailable = env.vd.unavailable();
    let direct = row.pieces.iter().zip(views.iter_mut()).map(|(piece, view)| async move {
        let (member, strip_offset) = row.data_member(piece.strip_index);
        if unavailable.contains(member) {
            return Some(None);
        }
        let buf = std::mem::replace(view, IoBuf::zeroed(0));
        let op = DriveOp::Read { offset_bytes: strip_offset + piece.offset_in_strip_bytes, buf };
        let (result, buf) = member_io(env, member, op).await;
        *view = buf.expect("read returns its buffer");
        result.err().map(|error| Some((member, error)))
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
        if let Some((member, error)) = error {
            let kind = OpKind::Read;
            if let Some(give_up) = book(env, AttemptError::Member { index: *member, kind, error: error.clone() }, &mut avoid) {
                return Err(give_up);
            }
            let piece = &row.pieces[*i];
            repair.push((*i, *member, row.data_member(piece.strip_index).1 + piece.offset_in_strip_bytes));
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
        let mut unavailable = env.vd.unavailable().union(*avoid);
        // The piece's own member is treated as lost even if it is online (it just failed a read).
        unavailable.insert(row.data_member(piece.strip_index).0);
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

async fn flush(env: &Env) -> Result<(), VdError> {
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
