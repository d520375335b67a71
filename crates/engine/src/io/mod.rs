//! The I/O path of every level, written once over the row model of `layout`.
//!
//! A request is cut into row pieces; each row piece is served by the path of its span kind:
//!
//! - stripe (RAID0, JBOD; [`merged`]): one member I/O per drive-contiguous run of strip pieces;
//! - mirror (RAID1, 10, 1E; [`mirror`]): writes go to every available copy; reads go to the copy
//!   with fewer outstanding I/Os, ties broken by the nearer head position (the reviews' "luckier
//!   disk");
//! - parity (RAID5, 6, 50, 60; [`parity`]): writes pick the full-stripe, reconstruct-write or
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
//!
//! # One interface per span kind
//!
//! Each span kind implements [`SpanIo`]; [`on_span`] holds the only `match` on the span kind
//! that picks an implementation. It is a trait rather than an enum because each kind is a set
//! of functions with nothing in common but their signatures: an enum would repeat the `match`
//! in every method, and a trait lets the compiler check that a new row function (rebuild,
//! check) exists for every kind. The trait's functions are `async` and chosen statically
//! (generics, no `dyn`, no boxed futures), so the data path pays nothing for it.

mod copy;
pub(crate) mod gather;
pub(crate) mod intent;
mod lost;
mod merged;
mod migrate;
pub(crate) mod mirror;
mod parity;
mod row;
mod run;

use crate::runtime::{LockKey, Reactor, RowLock};
use crate::vd::{CheckMode, CheckOutcome, MemberSet, VdCompletion, VdError, VdRequest, VirtualDrive};
use drive::IoBuf;
use futures::future::join_all;
use layout::{DataPiece, RowPiece, SpanKind};
use merged::{merged_io, stripe_error};
use row::{flush, split_views, Env, Row};
use std::rc::Rc;
use std::sync::Arc;

/// The row functions of one span kind. `row` is locked by the caller where the function says
/// so; `views` hold the data pieces of `row.pieces`, in order, and come back holding them.
pub(crate) trait SpanIo {
    /// Reads the row's pieces into `views`, from redundancy where a member fails.
    async fn read(env: &Env, row: &Row, views: &mut [IoBuf]) -> Result<(), VdError>;
    /// Writes `views` to the row's pieces and their redundancy. The row lock is held.
    async fn write(env: &Env, row: &Row, views: &mut Vec<IoBuf>) -> Result<(), VdError>;
    /// Rebuilds the strips that `targets` hold in the whole row `row` from the other members,
    /// and writes them. Targets are never read. The row lock is held.
    ///
    /// # Errors
    /// [`VdError::RowUnrecoverable`] when the other members do not hold what a target needs
    /// (nothing is made up), [`VdError::RowMemberIo`] when a target fails its write (the target
    /// is failed), [`VdError::NoRedundancy`] for levels without redundancy.
    async fn rebuild_row(env: &Env, row: &Row, targets: MemberSet) -> Result<(), VdError>;
    /// [`SpanIo::rebuild_row`] of consecutive rows, all locked: one result per row, in order.
    /// Kinds with redundancy read and write each member's part of the run in as few I/Os as
    /// its layout allows (large I/Os are what lets a rebuild run at the members' speed).
    async fn rebuild_rows(env: &Env, rows: &[Row], targets: MemberSet) -> Vec<Result<(), VdError>> {
        let mut results = Vec::with_capacity(rows.len());
        for row in rows {
            results.push(Self::rebuild_row(env, row, targets).await);
        }
        results
    }
    /// Reads the whole row `row` from every member and verifies its redundancy, rewriting what
    /// disagrees when `mode` says so. The row lock is held.
    ///
    /// # Errors
    /// [`VdError::RowMemberOut`] when a member of the row is out of service,
    /// [`VdError::RowMemberIo`] when a member fails a read or a repair write,
    /// [`VdError::NoRedundancy`] for levels without redundancy.
    async fn check_row(env: &Env, row: &Row, mode: CheckMode) -> Result<CheckOutcome, VdError>;
    /// [`SpanIo::check_row`] of consecutive rows, all locked: one result per row, in order.
    /// Kinds that can read each member's part of the run in one I/O do (a check reads every
    /// byte of every member, so it runs at the members' speed only with large I/Os).
    async fn check_rows(env: &Env, rows: &[Row], mode: CheckMode) -> Vec<Result<CheckOutcome, VdError>> {
        let mut results = Vec::with_capacity(rows.len());
        for row in rows {
            results.push(Self::check_row(env, row, mode).await);
        }
        results
    }
}

/// One call of a [`SpanIo`] function with its arguments, so that [`on_span`] can make it for any
/// span kind.
trait RowTask {
    type Output;
    async fn run<S: SpanIo>(self, env: &Env) -> Self::Output;
}

/// Runs `task` with the span kind of the VD: the one place that picks the implementation.
async fn on_span<T: RowTask>(env: &Env, task: T) -> T::Output {
    match env.vd.geometry().span_kind() {
        SpanKind::Stripe => task.run::<merged::Stripe>(env).await,
        SpanKind::Mirror | SpanKind::OffsetMirror => task.run::<mirror::Mirror>(env).await,
        SpanKind::Parity | SpanKind::DoubleParity => task.run::<parity::Parity>(env).await,
    }
}

struct ReadTask<'a>(&'a Row, &'a mut [IoBuf]);

impl RowTask for ReadTask<'_> {
    type Output = Result<(), VdError>;
    async fn run<S: SpanIo>(self, env: &Env) -> Self::Output {
        S::read(env, self.0, self.1).await
    }
}

struct WriteTask<'a>(&'a Row, &'a mut Vec<IoBuf>);

impl RowTask for WriteTask<'_> {
    type Output = Result<(), VdError>;
    async fn run<S: SpanIo>(self, env: &Env) -> Self::Output {
        S::write(env, self.0, self.1).await
    }
}

struct RebuildTask<'a>(&'a [Row], MemberSet);

impl RowTask for RebuildTask<'_> {
    type Output = Vec<Result<(), VdError>>;
    async fn run<S: SpanIo>(self, env: &Env) -> Self::Output {
        S::rebuild_rows(env, self.0, self.1).await
    }
}

struct CheckTask<'a>(&'a [Row], CheckMode);

impl RowTask for CheckTask<'_> {
    type Output = Vec<Result<CheckOutcome, VdError>>;
    async fn run<S: SpanIo>(self, env: &Env) -> Self::Output {
        S::check_rows(env, self.0, self.1).await
    }
}

/// Rebuilds the strips of `targets` in the `row_count` rows from `first_row`, rows this shard
/// owns (see [`SpanIo::rebuild_rows`]): one result per row, in order.
pub(crate) async fn rebuild_rows(
    reactor: Rc<Reactor>,
    vd: Arc<VirtualDrive>,
    first_row: u64,
    row_count: u64,
    targets: MemberSet,
) -> Vec<Result<(), VdError>> {
    assert!(row_count > 0, "a run of rows holds a row");
    let env = Env::new(reactor, vd);
    if env.vd.is_retired() {
        return vec![Err(VdError::Deleted { vd: env.vd.name() }); row_count as usize];
    }
    let row_numbers = first_row..first_row + row_count;
    // Every ticket first, in one step, then the waits in row order: the order in which a client
    // request over several rows takes them, so that a run and a request never wait for each other.
    let locks: Vec<RowLock> = row_numbers.clone().map(|row| env.reactor.lock(LockKey { vd_id: env.vd.id(), row })).collect();
    for lock in &locks {
        lock.acquired().await;
    }
    let rows: Vec<Row> = row_numbers.map(|row| Row::whole(env.vd.geometry(), row)).collect();
    let results = on_span(&env, RebuildTask(&rows, targets)).await;
    assert_eq!(results.len(), rows.len(), "a run reports every row");
    results
}

pub(crate) use copy::copy_row;
pub(crate) use migrate::migrate_rows;

/// Checks the `row_count` rows from `first_row`, rows this shard owns (see
/// [`SpanIo::check_rows`]): one result per row, in order.
pub(crate) async fn check_rows(
    reactor: Rc<Reactor>,
    vd: Arc<VirtualDrive>,
    first_row: u64,
    row_count: u64,
    mode: CheckMode,
) -> Vec<Result<CheckOutcome, VdError>> {
    assert!(row_count > 0, "a run of rows holds a row");
    let env = Env::new(reactor, vd);
    if env.vd.is_retired() {
        return vec![Err(VdError::Deleted { vd: env.vd.name() }); row_count as usize];
    }
    let row_numbers = first_row..first_row + row_count;
    // Every ticket first, then the waits in row order, as `rebuild_rows` does.
    let locks: Vec<RowLock> = row_numbers.clone().map(|row| env.reactor.lock(LockKey { vd_id: env.vd.id(), row })).collect();
    for lock in &locks {
        lock.acquired().await;
    }
    // A repair writes members like a client does: its regions must be marked first. A resync
    // (or BGI) writes only in regions that are unsynced, which slot 0 holds until the resync's
    // checkpoint has flushed them: a bit of its own would only keep a region it finished dirty
    // after a crash, and the resync would start over.
    let mut intents = Vec::new();
    if mode == CheckMode::Repair {
        for row in row_numbers.clone() {
            match intent::begin_write(&env, row, true).await {
                Ok(guard) => intents.push(guard),
                Err(error) => return vec![Err(error); row_count as usize],
            }
        }
    }
    let rows: Vec<Row> = row_numbers.clone().map(|row| Row::whole(env.vd.geometry(), row)).collect();
    let results = on_span(&env, CheckTask(&rows, mode)).await;
    assert_eq!(results.len(), rows.len(), "a run reports every row");
    for (row, result) in row_numbers.zip(&results) {
        let Ok(outcome) = result else { continue };
        assert!(outcome.row == row, "a check reports the row it checked");
        assert!(!outcome.repaired || (mode.writes() && !outcome.is_consistent()), "repaired only what a repair found");
    }
    results
}

/// Runs a clean pass of the VD's bitmap on this shard (see [`intent::clean`]).
pub(crate) async fn clean_write_intent(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, stopping: bool) -> Result<(), VdError> {
    intent::clean(&Env::new(reactor, vd), stopping).await
}

/// Serves one request whose range lies in rows this shard owns (or a flush).
pub(crate) async fn serve(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, request: VdRequest) -> VdCompletion {
    let env = Env::new(reactor, vd);
    if let Some(error) = refusal(&env) {
        return VdCompletion { result: Err(error), buf: request.into_buf() };
    }
    match request {
        VdRequest::Flush => VdCompletion { result: flush(&env).await, buf: None },
        VdRequest::Read { offset_bytes, buf } => lost::read_guarded(&env, offset_bytes, buf).await,
        VdRequest::Write { offset_bytes, buf } => write_rows(&env, offset_bytes, buf).await,
    }
}

/// Writes `buf` at `offset_bytes` for a write that goes around the journal
/// (`cache::bypass`): as [`serve`] does, except that a row it writes whole is written without
/// a row image (its region is marked unlogged), unless an older image of the row is live.
pub(crate) async fn serve_around_journal(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf) -> VdCompletion {
    let env = Env { full_rows_unlogged: true, ..Env::new(reactor, vd) };
    checked_write(&env, offset_bytes, buf).await
}

/// Writes `buf` at `offset_bytes` as [`serve`] does, and says whether every parity row it
/// wrote was logged as a row image first: then the write is in the journal (replay restores
/// it) as soon as it completes, as a WT write's data record would have it
/// (`cache::write`'s imaged path).
pub(crate) async fn serve_imaged(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf) -> (VdCompletion, bool) {
    let env = Env::new(reactor, vd);
    let completion = checked_write(&env, offset_bytes, buf).await;
    // A refused write wrote nothing, so nothing of it is in the journal either.
    let imaged = completion.result.is_ok() && !env.not_imaged.get();
    (completion, imaged)
}

/// Writes `writes` (VD offset, bytes: disjoint ranges inside parity row `row`) as one scattered
/// row write (`parity::scattered`), for the destager. `None`: the row cannot take one now (not
/// a parity VD, too many pieces, a member out, a migration or a replay, or a member error on the
/// way, booked): the caller writes them through [`serve`], in order, which handles all of that.
pub(crate) async fn serve_scattered(
    reactor: Rc<Reactor>,
    vd: Arc<VirtualDrive>,
    row: u64,
    writes: &[(u64, &[u8])],
) -> Option<Result<(), VdError>> {
    let geometry = *vd.geometry();
    let row_bytes = geometry.row_data_bytes();
    let row_start_bytes = row * row_bytes;
    assert!(
        writes.iter().all(|&(offset, bytes)| offset >= row_start_bytes && offset + bytes.len() as u64 <= row_start_bytes + row_bytes),
        "scattered writes lie inside row {row}"
    );
    let map = geometry.row_map(row);
    let piece_count: usize =
        writes.iter().map(|&(offset, bytes)| map.data_pieces(offset - row_start_bytes, bytes.len() as u64).count()).sum();
    let parity = matches!(geometry.span_kind(), SpanKind::Parity | SpanKind::DoubleParity);
    if !parity || !parity::scattered::fits_one_image(geometry.span_kind(), piece_count) {
        return None;
    }
    let env = Env::new(reactor, vd);
    if let Some(error) = refusal(&env) {
        return Some(Err(error));
    }
    let key = LockKey { vd_id: env.vd.id(), row };
    // Lands after a gathered write of the row, as any write that does not join it.
    gather::close(&env, key);
    let lock = env.reactor.lock(key);
    lock.acquired().await;
    let _intent = match intent::begin_write(&env, row, !parity::logs_row_images(&env)).await {
        Ok(guard) => guard,
        Err(error) => return Some(Err(error)),
    };
    // After the wait for the bitmap, right before the reads, as the ordinary path decides its
    // plan: a member may have left (or been replaced by a blank drive) meanwhile.
    if !parity::scattered::plain_row(&env, &map) {
        return None;
    }
    env.vd.note_write();
    let in_row: Vec<(u64, &[u8])> = writes.iter().map(|&(offset, bytes)| (offset - row_start_bytes, bytes)).collect();
    match parity::scattered::write_scattered(&env, &map, &in_row).await {
        Ok(()) => {
            // Under the row lock, as `serve_row_locked` does.
            writes.iter().for_each(|&(offset, bytes)| env.vd.bad_blocks().rewritten(offset, bytes.len() as u64));
            Some(Ok(()))
        }
        // Booked: the ordinary path writes them (`None`), unless the VD gives up.
        Err(error) => row::book(&env, error, &mut MemberSet::default()).map(Err),
    }
}

/// Why the VD takes no request now, if it does not.
fn refusal(env: &Env) -> Option<VdError> {
    if env.vd.is_retired() {
        // Queued before the VD was deleted; its drives may belong to another VD by now.
        return Some(VdError::Deleted { vd: env.vd.name() });
    }
    (env.vd.state() == crate::VdState::Offline).then(|| env.vd.offline_error())
}

/// A write through `env`'s options, unless the VD takes no request now.
async fn checked_write(env: &Env, offset_bytes: u64, buf: IoBuf) -> VdCompletion {
    match refusal(env) {
        Some(error) => VdCompletion { result: Err(error), buf: Some(buf) },
        None => write_rows(env, offset_bytes, buf).await,
    }
}

async fn write_rows(env: &Env, offset_bytes: u64, buf: IoBuf) -> VdCompletion {
    env.vd.note_write();
    serve_rows(env, offset_bytes, buf, true).await
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
    let row_count = rows.len();
    let futures = rows.into_iter().enumerate().map(|(index, (piece, row_buf))| {
        let hold = write && gather::may_hold(env, &piece, index + 1 == row_count);
        serve_row(env, piece, row_buf, write, hold)
    });
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

/// Serves one row piece. A write joins the row's gathering if one is open (`gather`); with
/// `hold` it opens one, and writes what it gathered.
async fn serve_row(env: &Env, piece: RowPiece, buf: IoBuf, write: bool, hold: bool) -> (Result<(), VdError>, IoBuf) {
    let key = LockKey { vd_id: env.vd.id(), row: piece.row };
    if write {
        if let Some(gathered) = gather::join(env, key, &piece, &buf) {
            // Logged (or not) by the request that gathered it.
            env.not_imaged.set(true);
            return (gathered.await, buf);
        }
    }
    let lock = write.then(|| env.reactor.lock(key));
    let gathering = hold.then(|| gather::open(env, key, &piece));
    if let Some(lock) = &lock {
        // The ticket was taken when the lock was created; wait for our turn.
        lock.acquired().await;
    }
    let (result, buf) = match gathering {
        Some(gathering) => {
            let (gathered_piece, bytes) = gather::collect(env, key, &gathering, &buf).await;
            let joined = gather::joined_count(&gathering) as u64;
            let (result, _) = serve_row_locked(env, gathered_piece, bytes, true).await;
            gather::finish(&gathering, &result);
            env.vd.note_gathered(joined);
            (result, buf)
        }
        None => serve_row_locked(env, piece, buf, write).await,
    };
    drop(lock);
    (result, buf)
}

/// Serves one row piece; a write holds the row lock.
pub(super) async fn serve_row_locked(env: &Env, piece: RowPiece, buf: IoBuf, write: bool) -> (Result<(), VdError>, IoBuf) {
    let map = env.vd.geometry().row_map(piece.row);
    let pieces: Vec<DataPiece> = map.data_pieces(piece.offset_in_row_bytes, piece.len_bytes).collect();
    // A migration's copy of the write, under this row's lock (`vd::migration`).
    let twin = if write { migrate::twin_write(env, piece.vd_offset_bytes, &[buf.as_slice()]) } else { None };
    let mut views = split_views(buf, &pieces);
    // Under the lock, so that waiting for the bitmap cannot reorder overlapping writes. A row
    // write is unlogged unless it is a parity row write whose image the journal will hold
    // (`parity::row_log`, which marks it unlogged after all if the image cannot be written).
    let _intent = match write {
        true => match intent::begin_write(env, piece.row, !parity::logs_row_images(env)).await {
            Ok(guard) => guard,
            Err(error) => return (Err(error), IoBuf::join(views)),
        },
        false => None,
    };
    let row = Row { map, pieces, lo: 0, hi: 0 }.with_columns(piece);
    // RAID0/JBOD never come here: serve_rows sends them through merged_io.
    let result = match write {
        false => on_span(env, ReadTask(&row, &mut views)).await,
        true => futures::future::join(on_span(env, WriteTask(&row, &mut views)), migrate::run_twin(env, twin)).await.0,
    };
    if write && result.is_ok() {
        // Under the row lock, so that no row job can find the bytes lost again in between.
        env.vd.bad_blocks().rewritten(piece.vd_offset_bytes, piece.len_bytes);
    }
    (result, IoBuf::join(views))
}
