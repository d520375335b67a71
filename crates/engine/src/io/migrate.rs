//! A whole VD copied onto another drive while it serves (`vd::migration`): the write and flush
//! tees that keep the target current, and the row job that copies rows.

use super::merged::merged_io;
use super::row::Env;
use super::serve_row_locked;
use crate::runtime::{LockKey, Reactor, RowLock};
use crate::vd::{MigrationTarget, VdError, VirtualDrive};
use drive::{DriveOp, IoBuf, OpKind};
use layout::{RowPiece, SpanKind};
use std::rc::Rc;
use std::sync::Arc;

/// The target's copy of a write of `parts` (in VD order) at VD offset `vd_offset_bytes`, when a
/// migration runs and its target still takes writes: copied before the members' write consumes
/// the buffers. Called with the write's row locks held, which is what orders it against the
/// copy of its rows (see `vd::migration`).
pub(super) fn twin_write(env: &Env, vd_offset_bytes: u64, parts: &[&[u8]]) -> Option<(Arc<MigrationTarget>, DriveOp)> {
    let migration = env.vd.migration().filter(|migration| !migration.has_failed())?;
    let offset_bytes = MigrationTarget::target_offset_bytes(vd_offset_bytes);
    let len_bytes = parts.iter().map(|part| part.len()).sum();
    Some((migration, DriveOp::Write { offset_bytes, buf: IoBuf::from_parts(parts, len_bytes) }))
}

/// Runs the target's part of an operation (see [`twin_write`]); a failure is booked on the
/// migration and never fails the client's operation.
pub(super) async fn run_twin(env: &Env, twin: Option<(Arc<MigrationTarget>, DriveOp)>) {
    let Some((migration, op)) = twin else { return };
    let kind = op.kind();
    let done = env.reactor.submit(&**migration.target(), op).await;
    if let Err(error) = done.result {
        migration.target_error(&env.vd, kind, &error);
    }
}

/// The flush of the target when a migration runs: what a flush of the VD promises covers the
/// writes the target took too.
pub(super) fn twin_flush(env: &Env) -> Option<(Arc<MigrationTarget>, DriveOp)> {
    let migration = env.vd.migration().filter(|migration| !migration.has_failed())?;
    Some((migration, DriveOp::Flush))
}

/// Copies the `row_count` rows from `first_row` (rows this shard owns) onto the migration
/// target, under their row locks: a client write to one of them comes wholly before (and the
/// copy reads it from the members) or wholly after (and writes the target itself).
///
/// # Errors
/// [`VdError::MigrationEnded`] when no migration runs or its target failed (the write to the
/// target included); what reading the rows returns (a row that redundancy cannot recover).
pub(crate) async fn migrate_rows(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, first_row: u64, row_count: u64) -> Vec<Result<(), VdError>> {
    assert!(row_count > 0, "a run of rows holds a row");
    let env = Env::new(reactor, vd);
    let all = |error: VdError| vec![Err(error); row_count as usize];
    if env.vd.is_retired() {
        return all(VdError::Deleted { vd: env.vd.name() });
    }
    let ended = || VdError::MigrationEnded { vd: env.vd.name() };
    let rows = first_row..first_row + row_count;
    // Every ticket first, then the waits in row order, as `rebuild_rows` does.
    let locks: Vec<RowLock> = rows.clone().map(|row| env.reactor.lock(LockKey { vd_id: env.vd.id(), row })).collect();
    for lock in &locks {
        lock.acquired().await;
    }
    let Some(migration) = env.vd.migration().filter(|migration| !migration.has_failed()) else { return all(ended()) };
    let row_bytes = env.vd.geometry().row_data_bytes();
    let vd_offset_bytes = first_row * row_bytes;
    let buf = match read_rows(&env, first_row, row_count).await {
        Ok(buf) => buf,
        Err(error) => return all(error),
    };
    assert_eq!(buf.len() as u64, row_count * row_bytes, "a run's read covers its rows");
    let op = DriveOp::Write { offset_bytes: MigrationTarget::target_offset_bytes(vd_offset_bytes), buf };
    let done = env.reactor.submit(&**migration.target(), op).await;
    drop(locks);
    match done.result {
        Ok(()) => vec![Ok(()); row_count as usize],
        Err(error) => {
            migration.target_error(&env.vd, OpKind::Write, &error);
            all(ended())
        }
    }
}

/// The data of whole rows as the members hold it (reconstructed where a member is out), with
/// their locks held by the caller.
async fn read_rows(env: &Env, first_row: u64, row_count: u64) -> Result<IoBuf, VdError> {
    let row_bytes = env.vd.geometry().row_data_bytes();
    if env.vd.geometry().span_kind() == SpanKind::Stripe {
        let buf = IoBuf::zeroed((row_count * row_bytes) as usize);
        let (result, buf) = merged_io(env, first_row * row_bytes, buf, false).await;
        return match result {
            Ok(()) => Ok(buf),
            Err(error) => Err(super::merged::stripe_error(env, error, buf).result.expect_err("a failed read fails")),
        };
    }
    // One buffer for the run, a view of it per row: the views join back without a copy.
    let mut rest = IoBuf::zeroed((row_count * row_bytes) as usize);
    let mut views = Vec::with_capacity(row_count as usize);
    for row in first_row..first_row + row_count {
        let tail = rest.split_off(row_bytes as usize);
        let view = std::mem::replace(&mut rest, tail);
        let piece = RowPiece { row, vd_offset_bytes: row * row_bytes, offset_in_row_bytes: 0, len_bytes: row_bytes };
        let (result, view) = serve_row_locked(env, piece, view, false).await;
        result?;
        views.push(view);
    }
    Ok(IoBuf::join(views))
}
