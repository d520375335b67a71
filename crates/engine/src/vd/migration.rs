//! A whole VD being copied onto another drive while it serves (live migration, e.g. into an RBD
//! image): the VD's bytes go to the target at [`MEMBER_RESERVED_BYTES`] + their VD offset, so
//! that the target can become a JBOD holding the same VD once the copy is done.
//!
//! From [`VirtualDrive::start_migration`] on, every write that reaches the members also goes to
//! the target, under the row locks it holds (`io::migrate::twin_write`), and every flush flushes
//! the target too; a row job (`io::migrate::migrate_rows`) copies rows in any order under their
//! row locks. A write to a row comes wholly before the row's copy (which reads it from the
//! members) or wholly after it (and writes the target itself), so once every row was copied the
//! target holds the VD: no watermark has to be compared on the write path, at the price of
//! writing rows not yet copied twice.
//!
//! # Writes that did not see the start
//! A write decides whether it goes to the target too only once it holds the row locks of its
//! rows (`io::migrate::twin_write`), and row locks are granted in the order their tickets were
//! taken on the row's shard. A write that found no migration took its tickets before the start
//! stored it, so before any copy of its rows took theirs (the copy's row jobs reach the shard
//! only after the start returns): it is on the members when the copy reads them. Nothing has to
//! be drained but the Fast Path's writes, which hold no row lock: they are drained as for a
//! member's copy (`fast_writes`).

use super::*;

/// The migration of a VD in progress: where its bytes go, and whether the target still takes
/// them.
pub struct MigrationTarget {
    target: Arc<dyn Drive>,
    /// The target failed an operation: it gets nothing more, and the migration cannot finish.
    failed: AtomicBool,
}

impl MigrationTarget {
    pub fn target(&self) -> &Arc<dyn Drive> {
        &self.target
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Where VD byte `vd_offset_bytes` lives on the target.
    pub fn target_offset_bytes(vd_offset_bytes: u64) -> u64 {
        MEMBER_RESERVED_BYTES + vd_offset_bytes
    }

    /// Books a failed operation of the target: nothing more goes to it. Never fails the VD's
    /// own operation.
    pub(crate) fn target_error(&self, vd: &VirtualDrive, kind: OpKind, error: &DriveError) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "{}: the migration target {} failed a {kind:?}: {error}; the migration stops",
                vd.name(),
                self.target.info().name
            );
        }
    }
}

impl VirtualDrive {
    /// Starts copying the whole VD onto `target`: from the return on, every write and flush of
    /// the VD also goes to the target, and rows may be copied (`Engine::migrate_rows`). The target
    /// must hold the reserved area and the VD's capacity; no migration may run already.
    pub fn start_migration(&self, target: Arc<dyn Drive>) {
        let needed_bytes = MigrationTarget::target_offset_bytes(self.capacity_bytes());
        assert!(
            target.info().capacity_bytes >= needed_bytes,
            "v{}: the migration target holds {} bytes, {needed_bytes} needed",
            self.id,
            target.info().capacity_bytes
        );
        {
            let mut migration = self.migration.write().expect("migration lock poisoned");
            assert!(migration.is_none(), "v{}: a migration runs already", self.id);
            *migration = Some(Arc::new(MigrationTarget { target, failed: AtomicBool::new(false) }));
            self.migrating.store(true, Ordering::SeqCst);
        }
        // A Fast Path write that looked before the migration was stored writes the members
        // alone: the copy starts once none is left (see `fast_writes`).
        self.wait_fast_writes_drained();
    }

    /// The migration in progress, if any. Every member write asks: without a migration the
    /// answer is one load of a flag that only a start or an end writes, not the lock.
    pub fn migration(&self) -> Option<Arc<MigrationTarget>> {
        if !self.is_migrating() {
            return None;
        }
        self.migration.read().expect("migration lock poisoned").clone()
    }

    /// Whether a migration runs (the Fast Path's writes step aside).
    pub(crate) fn is_migrating(&self) -> bool {
        self.migrating.load(Ordering::SeqCst)
    }

    /// Ends the migration (done or abandoned): writes no longer go to the target. Returns it.
    pub fn end_migration(&self) -> Option<Arc<MigrationTarget>> {
        let mut migration = self.migration.write().expect("migration lock poisoned");
        self.migrating.store(false, Ordering::SeqCst);
        migration.take()
    }
}

/// The end of a migration: the VD's requests held while it switches to its successor (a JBOD
/// of the target), then sent there. Requests are held in [`Engine::submit`](crate::Engine::submit)
/// before they reach a shard, so they are bounded by what the clients have in flight.
/// What every request reads comes first (`repr(C)`, as the VD's own hot fields).
#[derive(Default)]
#[repr(C)]
pub(super) struct Switch {
    holding: AtomicBool,
    successor: std::sync::OnceLock<Arc<VirtualDrive>>,
    held: Mutex<Vec<(VdRequest, crate::Done)>>,
    /// The export identity of the VD this one succeeded (see [`VirtualDrive::export_identity`]).
    inherited_identity: std::sync::OnceLock<u64>,
}

impl VirtualDrive {
    /// The VD that took this one's place (a migration's end): requests go there.
    pub fn successor(&self) -> Option<&Arc<VirtualDrive>> {
        self.switch.successor.get()
    }

    /// What a frontend's connections follow (an NBD export's identity): the instance id, or
    /// the identity of the VD this one succeeded, so that a migration's end keeps them.
    pub fn export_identity(&self) -> u64 {
        self.switch.inherited_identity.get().copied().unwrap_or(self.instance_id)
    }

    /// Takes `predecessor`'s export identity: this VD takes its place.
    pub fn inherit_export_identity(&self, predecessor: &VirtualDrive) {
        let identity = predecessor.export_identity();
        assert!(self.switch.inherited_identity.set(identity).is_ok(), "v{}: an export identity is inherited once", self.id);
    }

    /// Parks `request` while the VD is held; gives it back otherwise. The request is counted
    /// in flight before (`Engine::submit`), and both sides are SeqCst: a submitter that does
    /// not see the hold was counted before [`VirtualDrive::hold_requests`] looked at the count.
    pub(crate) fn park_if_held(&self, request: VdRequest, done: crate::Done) -> Option<(VdRequest, crate::Done)> {
        if !self.switch.holding.load(Ordering::SeqCst) {
            return Some((request, done));
        }
        let mut held = self.switch.held.lock().expect("held requests lock poisoned");
        // Released meanwhile: the release took the list before this lock.
        if !self.switch.holding.load(Ordering::SeqCst) {
            return Some((request, done));
        }
        held.push((request, done));
        None
    }

    /// Holds every request from now on, and waits (up to `timeout`) until none is in flight.
    /// `false` if some still are: the caller releases the hold.
    pub fn hold_requests(&self, timeout: Duration) -> bool {
        self.switch.holding.store(true, Ordering::SeqCst);
        self.wait_idle(timeout)
    }

    /// Ends the hold. With a `successor`, it takes this VD's place for good (held requests and
    /// every later one go there); the held requests are returned for the caller to submit.
    pub fn release_requests(&self, successor: Option<Arc<VirtualDrive>>) -> Vec<(VdRequest, crate::Done)> {
        let mut held = self.switch.held.lock().expect("held requests lock poisoned");
        if let Some(successor) = successor {
            assert!(self.switch.successor.set(successor).is_ok(), "v{}: a VD is succeeded once", self.id);
        }
        self.switch.holding.store(false, Ordering::SeqCst);
        std::mem::take(&mut *held)
    }
}
