//! The shard's side of the write-intent bitmap (`crate::bitmap`): a write waits until its
//! region's bit is on the members; a clean pass clears the bits of idle regions.

use super::row::{flush, in_service, member_io, Env};
use crate::bitmap::{ondisk, shard::ShardSlot, WriteIntent};
use crate::metadata::BLOCK_BYTES;
use crate::vd::{MemberState, VdError, VirtualDrive};
use drive::{DriveOp, IoBuf};
use futures::future::join_all;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Held while a write to a region is in progress: the region's bit is on the members and is
/// not cleared until every guard of the region is dropped.
pub(crate) struct IntentGuard {
    vd: Arc<VirtualDrive>,
    shard: usize,
    region: u64,
}

impl Drop for IntentGuard {
    fn drop(&mut self) {
        let intent = self.vd.write_intent().expect("a guard exists only with a bitmap");
        intent.shard_slot(self.shard).lock().expect("bitmap lock").leave(self.region);
    }
}

/// Marks `row`'s region as being written and waits until its bit is on every member in service;
/// `unlogged` also marks it as written without a journal record that could mend a row the
/// write tears (every write but a parity row write whose image the journal holds: see
/// [`mark_unlogged`]). `None` for a VD without a bitmap.
///
/// # Errors
/// When the bit cannot be written anywhere (the VD went offline): the write must not go.
pub(crate) async fn begin_write(env: &Env, row: u64, unlogged: bool) -> Result<Option<IntentGuard>, VdError> {
    let Some(intent) = env.vd.write_intent() else { return Ok(None) };
    let shard = env.reactor.shard_index();
    let region = intent.regions.region_of(row);
    let mut durable = intent.shard_slot(shard).lock().expect("bitmap lock").enter(region, intent.regions.region_count, unlogged);
    let guard = IntentGuard { vd: Arc::clone(&env.vd), shard, region };
    while !durable {
        sync_slot(env, intent, shard).await?;
        let slot = intent.shard_slot(shard).lock().expect("bitmap lock");
        durable = slot.is_durable(region) && (!unlogged || slot.is_unlogged_durable(region));
    }
    Ok(Some(guard))
}

/// A parity row write under [`begin_write`] goes without its image in the journal (there is
/// none, it failed, or the VD is replaying): its region's unlogged bit must be on the members
/// first.
///
/// # Errors
/// As [`begin_write`].
pub(crate) async fn mark_unlogged(env: &Env, row: u64) -> Result<(), VdError> {
    let Some(intent) = env.vd.write_intent() else { return Ok(()) };
    let shard = env.reactor.shard_index();
    let region = intent.regions.region_of(row);
    let mut durable = intent.shard_slot(shard).lock().expect("bitmap lock").mark_unlogged(region);
    while !durable {
        sync_slot(env, intent, shard).await?;
        durable = intent.shard_slot(shard).lock().expect("bitmap lock").is_unlogged_durable(region);
    }
    Ok(())
}

/// Clears the bits of this shard's regions that were idle for a whole period (or, when
/// `stopping`, all of them). If a member is out, they are noted as written while degraded
/// first (in memory; slot 0 at a clean stop), for its re-add.
pub(crate) async fn clean(env: &Env, stopping: bool) -> Result<(), VdError> {
    let Some(intent) = env.vd.write_intent() else { return Ok(()) };
    let shard = env.reactor.shard_index();
    let slot = intent.shard_slot(shard);
    let candidates = slot.lock().expect("bitmap lock").clean_candidates(stopping);
    if candidates.is_empty() {
        return Ok(());
    }
    // The writes of those regions completed; a flush makes them durable before their bits go.
    flush(env).await?;
    if !whole(&env.vd) {
        // A member out (or failing meanwhile) missed these: its re-add must know them.
        intent.note_written_degraded(&candidates);
    }
    if !slot.lock().expect("bitmap lock").clear_idle(&candidates) {
        return Ok(());
    }
    sync_slot(env, intent, shard).await
}

/// Every member online: a region idle now was written on all of them.
fn whole(vd: &VirtualDrive) -> bool {
    vd.members().iter().all(|m| m.state() == MemberState::Online)
}

/// Brings the slot on the members up to what it should be, or waits for the write that is on
/// its way (the caller checks again afterwards).
async fn sync_slot(env: &Env, intent: &WriteIntent, shard: usize) -> Result<(), VdError> {
    let slot = intent.shard_slot(shard);
    let Some(write) = slot.lock().expect("bitmap lock").start_write() else {
        WaitForWriter { slot }.await;
        return Ok(());
    };
    let result = match write.blocks.is_empty() {
        true => Ok(()),
        false => write_blocks(env, 1 + shard, &ondisk::slot_image(&write.image.dirty, &write.image.unlogged), &write.blocks).await,
    };
    let waiters = slot.lock().expect("bitmap lock").finish_write(write.image, result.is_ok());
    waiters.into_iter().for_each(|waker| waker.wake());
    result
}

/// Writes `blocks` of slot `slot_index` from `image` (both halves) to every member in service,
/// then flushes them. A member that fails is booked (and leaves service); the VD going offline
/// is an error.
async fn write_blocks(env: &Env, slot_index: usize, image: &[u8], blocks: &[usize]) -> Result<(), VdError> {
    let members = in_service(&env.vd);
    let writes = members.iter().flat_map(|&member| {
        blocks.iter().map(move |&block| {
            let bytes = &image[block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES];
            let op = DriveOp::Write { offset_bytes: ondisk::block_offset_bytes(slot_index, block), buf: IoBuf::from_slice(bytes) };
            member_io(env, member, op)
        })
    });
    for (result, _) in join_all(writes).await {
        if let Err(fault) = result {
            env.vd.member_error(&fault);
        }
    }
    flush(env).await
}

/// Resolves once the slot's writer has finished.
struct WaitForWriter<'a> {
    slot: &'a Mutex<ShardSlot>,
}

impl Future for WaitForWriter<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut slot = self.slot.lock().expect("bitmap lock");
        if !slot.is_writing() {
            return Poll::Ready(());
        }
        slot.wait(cx.waker());
        Poll::Pending
    }
}
