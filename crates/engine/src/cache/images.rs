//! The shard's image partition of the journal: the write hole's parity log.
//!
//! Before a parity row write goes to the members, its member writes (data pieces, P, Q) are
//! logged here as row images (`io::parity::row_log`) and made durable; after the writes
//! complete the images are released. After a crash, replay writes every image still in the
//! ring back to the members, oldest first, before the data records: a row torn by the crash is
//! whole again, so a member missing at the restart can still be reconstructed from it. A row
//! write that cannot be logged (no journal, a failed one, an image too big for the ring, a
//! replay) marks its region unlogged in the bitmap instead, and that region is resynced.
//!
//! Space behind the tail returns only after a checkpoint, and a checkpoint only after the
//! members of every VD imaged since the last one were flushed (an image may be forgotten only
//! once its row is durable). Checkpoints run at a tick when the ring is an eighth full or
//! destaging is idle, and at once when an image waits for room.

use super::ShardCache;
use crate::journal::part::JournalPart;
use crate::runtime::Reactor;
use crate::vd::VirtualDrive;
use std::rc::Rc;
use std::sync::Arc;

impl ShardCache {
    /// The shard's image partition from now on (`None`: no journal, or one without images).
    pub fn set_images(&self, part: Option<Rc<JournalPart>>) {
        *self.images.borrow_mut() = part;
        self.imaged.borrow_mut().clear();
        self.logged_rows.borrow_mut().forget_images();
        self.wake_all();
    }

    /// The image partition, if the journal has one and works.
    pub fn images(&self) -> Option<Rc<JournalPart>> {
        self.images.borrow().clone().filter(|part| part.health().is_usable())
    }

    /// `vd` took a row write whose images are in the ring: flushed before the next checkpoint.
    pub(crate) fn note_imaged(&self, vd: &Arc<VirtualDrive>) {
        self.imaged.borrow_mut().entry(vd.instance_id()).or_insert_with(|| Arc::clone(vd));
    }

    /// Wakes whoever waits for ring room (an image released, a checkpoint done).
    pub(crate) fn images_changed(&self) {
        self.wake_all();
    }

    pub(crate) async fn wait_for_image_room(&self) {
        self.wait_for_change().await;
    }
}

/// Checkpoints the image partition if records left its live tail, and either the ring is an
/// eighth full, destaging went idle, or `now` (an image waits for room).
pub(crate) fn checkpoint_images(reactor: &Rc<Reactor>, now: bool) {
    let Some(part) = reactor.cache().images() else { return };
    if !part.checkpoint_due() {
        return;
    }
    let (used, capacity) = part.usage();
    if !now && used < capacity / 8 && reactor.cache().runs_in_flight.get() > 0 {
        return;
    }
    let reactor2 = Rc::clone(reactor);
    reactor.spawn(async move {
        if let Err(error) = part.checkpoint(&reactor2, flush_imaged(&reactor2)).await {
            tracing::warn!("journal image checkpoint failed: {error}");
        }
        reactor2.cache().images_changed();
    });
}

/// Checkpoints the image partition past every image logged before the call: what a quiesce
/// needs, so that no image of a deleted VD is ever replayed into the VD that takes its id.
///
/// Without an image partition that works, the images logged into one that failed are never
/// replayed: the rows they covered are made durable on the members instead (a WT write on the
/// imaged path counted on its image, not on a data record).
pub(crate) async fn images_to_head(reactor: &Rc<Reactor>) -> Result<(), String> {
    let Some(part) = reactor.cache().images() else { return flush_imaged(reactor).await };
    let target = part.next_sequence();
    while part.durable_tail_sequence() < target {
        if !part.health().is_usable() {
            return flush_imaged(reactor).await;
        }
        if part.checkpoint_due() && !part.is_checkpointing() {
            match part.checkpoint(reactor, flush_imaged(reactor)).await {
                Ok(_) => reactor.cache().images_changed(),
                // A failed journal is detached before anything goes on without it, and never
                // replayed: what its images covered only needs to be durable on the members.
                Err(crate::journal::JournalError::Failed(_)) => return flush_imaged(reactor).await,
                Err(error) => return Err(error.to_string()),
            }
        } else {
            // Images still held by row writes in flight, or another checkpoint under way.
            reactor.cache().wait_for_image_room().await;
        }
    }
    Ok(())
}

/// Flushes the members of every VD imaged since the last checkpoint (taken when the future
/// first runs, in the same step as the checkpoint takes its tail).
pub(super) async fn flush_imaged(reactor: &Rc<Reactor>) -> Result<(), String> {
    let vds: Vec<Arc<VirtualDrive>> = reactor.cache().imaged.borrow_mut().drain().map(|(_, vd)| vd).collect();
    // A deleted VD's rows are nobody's now, and an offline one took no row write whole: their
    // images are not worth a flush that cannot succeed.
    let live = vds.into_iter().filter(|vd| !vd.is_retired() && vd.state() != crate::VdState::Offline);
    super::destage::flush_vds(reactor, live).await
}
