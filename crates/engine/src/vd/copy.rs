//! A member being copied to another drive: copyback to the slot a spare replaced, or a proactive
//! replacement of a healthy member. The member stays in service on its own drive (the source);
//! while the copy runs, every write and flush to the member also goes to the target
//! (`io::copy::tee`), and a background process copies the rows in order under their row locks
//! (`io::copy::copy_row`). So every row the copy has passed stays current on the target, and
//! when the last row is copied the target holds the member: it takes the member's place.
//!
//! # Who sees which drive
//! The I/O path reads a member's copy before its drive, and holds the copy (an `Arc`) until its
//! operation completes. A copy ends by putting the target in the member's place *before*
//! clearing the copy, so an operation that finds no copy finds the drive that replaced the
//! source, and every operation that may still reach the source holds the ended copy:
//! [`VirtualDrive::wait_copy_released`] waits for those before the source is used elsewhere.

use super::{MemberState, VirtualDrive};
use drive::{Drive, DriveError, OpKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A member's copy in progress: where it comes from, where it goes, and whether the target
/// still takes writes.
pub struct CopyTarget {
    source: Arc<dyn Drive>,
    target: Arc<dyn Drive>,
    /// The target failed an operation: it gets no more writes, and the copy cannot finish.
    failed: AtomicBool,
    /// The target's failure was reported to the controller (once).
    reported: AtomicBool,
}

impl CopyTarget {
    /// The member's drive when the copy began.
    pub fn source(&self) -> &Arc<dyn Drive> {
        &self.source
    }

    pub fn target(&self) -> &Arc<dyn Drive> {
        &self.target
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

/// Whether two handles are the same drive (the data pointers; vtables may differ per crate).
pub(crate) fn same_drive(a: &Arc<dyn Drive>, b: &Arc<dyn Drive>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl VirtualDrive {
    /// Starts copying member `index` to `target`: from now on every write and flush of the
    /// member also goes to `target`. The member must be online and not being copied already.
    pub fn start_copy(&self, index: usize, target: Arc<dyn Drive>) {
        let member = &self.members[index];
        assert_eq!(member.state(), MemberState::Online, "v{}: member {index} is not online: it cannot be copied", self.id);
        assert!(
            target.info().capacity_bytes >= self.geometry.member_used_bytes(),
            "v{}: the copy target of member {index} is too small",
            self.id
        );
        let mut copy = member.copy.write().expect("member copy lock poisoned");
        assert!(copy.is_none(), "v{}: member {index} is being copied already", self.id);
        let source = member.drive();
        assert!(!same_drive(&source, &target), "v{}: member {index} cannot be copied onto itself", self.id);
        *copy = Some(Arc::new(CopyTarget { source, target, failed: AtomicBool::new(false), reported: AtomicBool::new(false) }));
        member.copying.store(true, Ordering::SeqCst);
        drop(copy);
        // A Fast Path write that looked before the flag was set writes the source alone: the
        // copy starts once none is left (see `fast_writes`).
        self.wait_fast_writes_drained();
    }

    /// The copy of member `index`, if one runs.
    pub fn copy_target(&self, index: usize) -> Option<Arc<CopyTarget>> {
        self.members[index].copy_target()
    }

    /// The copy of member `index` covered every row: the target takes the member's place. Returns
    /// the ended copy, for [`VirtualDrive::wait_copy_released`].
    pub fn finish_copy(&self, index: usize) -> Arc<CopyTarget> {
        let member = &self.members[index];
        let copy = member.copy_target().unwrap_or_else(|| panic!("v{}: member {index} is not being copied", self.id));
        assert!(!copy.has_failed(), "v{}: the copy target of member {index} failed; it cannot take the member's place", self.id);
        assert_eq!(member.state(), MemberState::Online, "v{}: member {index} left service during its copy", self.id);
        // The drive first, then the copy: see the module docs.
        member.set_drive(Arc::clone(&copy.target));
        let mut running = member.copy.write().expect("member copy lock poisoned");
        *running = None;
        member.copying.store(false, Ordering::Release);
        drop(running);
        member.read_errors.store(0, Ordering::Relaxed);
        copy
    }

    /// Ends the copy of member `index` without a switch (the target failed or left, the member
    /// left service): the target gets no more writes once [`VirtualDrive::wait_copy_released`]
    /// returns.
    pub fn end_copy(&self, index: usize) -> Option<Arc<CopyTarget>> {
        let member = &self.members[index];
        let mut running = member.copy.write().expect("member copy lock poisoned");
        member.copying.store(false, Ordering::Release);
        running.take()
    }

    /// Waits until no operation holds `copy` any more (the caller's handle aside): then nothing
    /// reaches its source or target through this VD. Returns whether that happened in `timeout`.
    pub fn wait_copy_released(&self, copy: &Arc<CopyTarget>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Arc::strong_count(copy) > 1 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Books an error the copy target of member `index` returned: the target gets no more
    /// writes and the controller is told, once. Writes that skip the target from now on are
    /// acknowledged only after the controller has recorded its failure (the ack gate): until
    /// then the metadata says rows below the copy's checkpoint are current on the target, and a
    /// crash would resume the copy above rows the target missed.
    pub(crate) fn copy_target_error(&self, index: usize, copy: &CopyTarget, kind: OpKind, error: &DriveError) {
        tracing::warn!(vd = %self.name(), member = index, drive = %copy.target.info().name, ?kind, %error, "copy target I/O error");
        let notifier = self.notifier.get();
        {
            // Under the gate's lock, so that a second failing write returns only once the first
            // has closed the gate.
            let mut gate = self.acks.lock().expect("ack gate poisoned");
            if copy.reported.swap(true, Ordering::SeqCst) {
                return;
            }
            if notifier.is_some() {
                gate.failures_unrecorded += 1;
                self.set_gated(&gate);
            }
            // After the gate: a write that sees the target failed (and skips it) sees it closed.
            copy.failed.store(true, Ordering::SeqCst);
        }
        let Some(notifier) = notifier else { return };
        let reason = format!("{kind:?} error on the copy target {}: {error}", copy.target.info().name);
        self.report_failure(notifier, index, reason, true);
    }
}
