//! Pinned data in the journal. The records of an offline VD's cached writes cannot be
//! released (the data cannot reach the members), and ring space returns only from the tail,
//! so one such record at the tail would stop the whole ring after one lap and every VD's
//! writes with it. While the journal is short of room and the oldest record still held is
//! pinned, its extent is logged again at the head and its old records released, so that the
//! tail moves on (each lap of the ring rewrites the pinned data once).

use super::ShardCache;
use crate::journal::part::WriteData;
use crate::runtime::Reactor;
use crate::VdState;
use drive::IoBuf;
use std::rc::Rc;

/// Starts logging again the pinned extent that holds the ring's tail, if there is one and none
/// is being logged already.
pub(super) fn relocate_tail(reactor: &Rc<Reactor>) {
    let cache = reactor.cache();
    if cache.relocating.get() {
        return;
    }
    let Some(journal) = cache.journal().filter(|j| j.health().is_usable()) else { return };
    let tail = journal.live_tail_sequence();
    // pump runs at every write: the pinned extents are looked through once per tail and tick.
    if cache.relocation_looked_at.get() == Some(tail) {
        return;
    }
    let Some((vd, offset, id, data)) = pinned_holding(cache, tail) else {
        cache.relocation_looked_at.set(Some(tail));
        return;
    };
    // Room anywhere in the ring: relocation is what gives room back.
    let len_bytes = data.len() as u64;
    let write = WriteData { vd_id: vd.id() as u32, vd_offset_bytes: offset, data: Rc::new(data) };
    let Some(placed) = journal.place_relocation(reactor, &write) else { return };
    assert_eq!(placed.len(), 1, "an extent is at most one record long");
    cache.relocating.set(true);
    let reactor2 = Rc::clone(reactor);
    reactor.spawn(async move {
        let cache = Rc::clone(reactor2.cache());
        let written = journal.write(&reactor2, &placed).await;
        let sequence = placed[0].placement.sequence;
        let given_up = match written {
            Ok(()) => cache.vds.borrow_mut().get_mut(&vd.instance_id()).and_then(|entry| entry.dirty.relogged(offset, id, sequence)),
            Err(_) => None,
        };
        match given_up {
            Some(old) => {
                // The extent holds its new record; the writer's hold and the old ones end.
                journal.hold(sequence);
                cache.note_logged_data(&journal, &vd, offset, len_bytes, sequence);
                old.into_iter().for_each(|s| journal.release(s));
            }
            None => tracing::debug!("{}: pinned extent at {offset} left before it was logged again", vd.name()),
        }
        super::write::release_writer(&cache, &journal, &placed);
        cache.relocating.set(false);
        cache.wake_all();
        super::pump(&reactor2);
    });
}

/// The extent of an offline VD that holds record `tail`: its VD, offset, id and bytes.
fn pinned_holding(cache: &ShardCache, tail: u64) -> Option<(std::sync::Arc<crate::VirtualDrive>, u64, u64, IoBuf)> {
    let vds = cache.vds.borrow();
    for entry in vds.values().filter(|entry| entry.vd.state() == VdState::Offline && !entry.vd.is_retired()) {
        for (offset, extent) in entry.dirty.all_at() {
            if extent.sequence.iter().chain(&extent.superseded).any(|&s| s == tail) {
                return Some((std::sync::Arc::clone(&entry.vd), offset, extent.id, IoBuf::from_slice(extent.bytes())));
            }
        }
    }
    None
}
