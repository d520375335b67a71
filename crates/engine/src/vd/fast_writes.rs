//! What the Fast Path's writes (see `fast_path::write`) agree on with the two things they must
//! not overtake, without a lock on the write's path.
//!
//! A Fast Path write goes from the submitting thread straight to one member: no row lock, no
//! cache. Two things could then miss it:
//! - **A copy of the member** (copyback, replace): a write that went to the source alone after
//!   the copy passed its row would be missing from the target once the copy takes the member's
//!   place. The copy sets the member's `copying` flag, then waits until no Fast Path write is in
//!   flight ([`VirtualDrive::wait_fast_writes_drained`]); a write announces itself before it
//!   looks at the flag ([`VirtualDrive::begin_fast_write`]). Both sides use SeqCst, so either
//!   the write sees the flag (and takes the normal path, which writes the copy too) or the copy
//!   waits for the write.
//! - **The clean cache**: a member read that fills it could read the old data while a Fast
//!   Path write is on its way, and keep it after the write completed. A fill sets the sticky
//!   `clean_cached` flag (which also stops Fast Path writes from then on: lines may stay in
//!   some shard's cache that no write could invalidate) and keeps what it read only if no Fast
//!   Path write was in flight when it began or began while it ran ([`FillTicket`]).

use super::*;

#[derive(Default)]
pub(super) struct FastWrites {
    /// Fast Path writes announced and not yet finished.
    in_flight: AtomicU64,
    /// Fast Path writes ever announced: a fill compares it before and after.
    started: AtomicU64,
    /// A member read filled (or began to fill) the clean cache: Fast Path writes stop for good.
    clean_cached: AtomicBool,
    /// Writes the Fast Path served.
    served: AtomicU64,
}

/// A clean cache fill's view of the Fast Path writes when it began (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FillTicket {
    started: u64,
    none_in_flight: bool,
}

impl VirtualDrive {
    /// Announces a Fast Path write; `false` (nothing announced) if a copy of a member or of the
    /// whole VD runs, or
    /// the clean cache may hold data of this VD: the write takes the normal path.
    pub(crate) fn begin_fast_write(&self) -> bool {
        let writes = &self.fast_writes;
        writes.in_flight.fetch_add(1, Ordering::SeqCst);
        writes.started.fetch_add(1, Ordering::SeqCst);
        if writes.clean_cached.load(Ordering::SeqCst) || self.members.iter().any(|m| m.is_copying()) || self.is_migrating() {
            self.end_fast_write();
            return false;
        }
        true
    }

    /// A write announced by [`Self::begin_fast_write`] reached its member (or failed).
    pub(crate) fn end_fast_write(&self) {
        let before = self.fast_writes.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "v{}: more Fast Path writes ended than began", self.id);
    }

    /// Waits until no Fast Path write is in flight: a copy calls it after setting its flag.
    pub(super) fn wait_fast_writes_drained(&self) {
        while self.fast_writes.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// A member read that will keep its data in the clean cache begins.
    pub(crate) fn begin_clean_fill(&self) -> FillTicket {
        let writes = &self.fast_writes;
        writes.clean_cached.store(true, Ordering::SeqCst);
        FillTicket { started: writes.started.load(Ordering::SeqCst), none_in_flight: writes.in_flight.load(Ordering::SeqCst) == 0 }
    }

    /// Whether a fill that began with `ticket` may keep what it read: no Fast Path write could
    /// have changed the members under it.
    pub(crate) fn clean_fill_may_keep(&self, ticket: FillTicket) -> bool {
        ticket.none_in_flight && self.fast_writes.started.load(Ordering::SeqCst) == ticket.started
    }

    /// Whether the clean cache may hold data of this VD (Fast Path writes are off for good).
    pub fn clean_cache_used(&self) -> bool {
        self.fast_writes.clean_cached.load(Ordering::SeqCst)
    }

    /// Writes the Fast Path served since the VD was opened.
    pub fn fast_path_writes(&self) -> u64 {
        self.fast_writes.served.load(Ordering::Relaxed)
    }

    pub(crate) fn count_fast_path_write(&self) {
        self.fast_writes.served.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drive::MemDrive;
    use layout::{Level, KIB, MIB};
    use std::sync::atomic::AtomicBool;

    fn raid0() -> Arc<VirtualDrive> {
        let layout = crate::VdLayout { level: Level::Raid0, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
        let drives = (0..2).map(|_| Arc::new(MemDrive::new(crate::MEMBER_RESERVED_BYTES + 8 * MIB)) as Arc<dyn Drive>).collect();
        Arc::new(VirtualDrive::new(0, "v", layout, drives).unwrap())
    }

    /// A copy that starts while a Fast Path write is in flight waits for it; once the copy
    /// runs, no Fast Path write is let through.
    #[test]
    fn a_copy_waits_for_the_fast_writes_in_flight_and_stops_new_ones() {
        let vd = raid0();
        assert!(vd.begin_fast_write());
        let started = Arc::new(AtomicBool::new(false));
        let copier = {
            let (vd, started) = (Arc::clone(&vd), Arc::clone(&started));
            std::thread::spawn(move || {
                vd.start_copy(0, Arc::new(MemDrive::new(crate::MEMBER_RESERVED_BYTES + 8 * MIB)));
                started.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!started.load(Ordering::SeqCst), "the copy started with a Fast Path write in flight");
        assert!(!vd.begin_fast_write(), "the copy's flag is up: the write takes the normal path");
        vd.end_fast_write();
        copier.join().unwrap();
        assert!(started.load(Ordering::SeqCst));
        assert!(!vd.begin_fast_write());
        vd.end_copy(0);
        assert!(vd.begin_fast_write(), "after the copy, writes take the Fast Path again");
        vd.end_fast_write();
    }

    /// A fill keeps what it read only if no Fast Path write was in flight when it began or
    /// began while it ran; once a fill began, no Fast Path write is let through.
    #[test]
    fn a_fill_keeps_its_data_only_if_no_fast_write_overlapped_it() {
        let vd = raid0();
        assert!(vd.begin_fast_write());
        let during = vd.begin_clean_fill();
        assert!(!vd.clean_fill_may_keep(during), "a write was in flight when the fill began");
        vd.end_fast_write();
        assert!(!vd.begin_fast_write(), "a fill began: Fast Path writes are off");
        let quiet = vd.begin_clean_fill();
        assert!(vd.clean_fill_may_keep(quiet), "nothing in flight, nothing began");
        // A write that announced itself after the fill began (and was refused) still counts.
        let racing = vd.begin_clean_fill();
        assert!(!vd.begin_fast_write());
        assert!(!vd.clean_fill_may_keep(racing), "a write began while the fill ran");
        assert!(vd.clean_cache_used());
    }
}
