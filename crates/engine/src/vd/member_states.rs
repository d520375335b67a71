//! The member states a VD's data path and its controller change, and the VD state they make
//! (MegaRAID's Optimal, Partially Degraded, Degraded, Offline): what takes a member out of
//! service (a vanished drive, a failed write, too many read errors), what puts one back (a
//! rebuild that covered every row), and the gate that holds write acknowledgements until the
//! controller has recorded a failure in the members' metadata. The controller's own state
//! machine (`controller::state`) says which of these changes an administrator may ask for.

use super::{MemberEvent, MemberSet, MemberState, VdCompletion, VdError, VdState, VirtualDrive, MEMBER_READ_ERRORS_MAX};
use drive::{Drive, DriveError, OpKind};
use layout::SpanKind;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

/// A member operation that failed, as the data path books it ([`VirtualDrive::member_error`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MemberFault {
    pub index: usize,
    pub kind: OpKind,
    pub error: DriveError,
    /// The member's rebuild epoch when the operation was submitted. Taken then, not when the
    /// error came back: an attempt books its faults once all its operations are done, and a
    /// spare may have taken the member's place in between.
    pub epoch: u16,
}

impl MemberFault {
    /// A fault found now, not by an operation in flight (a member seen out of service).
    pub(crate) fn now(vd: &VirtualDrive, index: usize, kind: OpKind, error: DriveError) -> Self {
        Self { index, kind, error, epoch: vd.rebuild_epoch(index) }
    }
}

impl VirtualDrive {
    /// Member failures found by I/O and not yet recorded by the controller.
    pub fn failures_unrecorded(&self) -> u32 {
        self.acks.lock().expect("ack gate poisoned").failures_unrecorded
    }

    /// Sends a member (or copy target) failure to the controller's watcher, whose record opens
    /// the ack gate again.
    pub(crate) fn report_failure(
        &self,
        notifier: &crossbeam_channel::Sender<MemberEvent>,
        member: usize,
        reason: String,
        copy_target: bool,
    ) {
        let event = MemberEvent { vd_id: self.id, instance_id: self.instance_id, member, state: MemberState::Failed, reason, copy_target };
        if notifier.send(event).is_err() {
            // No controller is listening, so there is no metadata to record it in.
            self.failure_recorded(Ok(()));
        }
    }

    /// Records that a member may not hold current data (it was out of service when the VD was
    /// assembled: nothing says what was written meanwhile, before a restart or a crash).
    pub(crate) fn presume_missed_writes(&self, index: usize) {
        self.members[index].missed_writes.store(true, Ordering::Release);
    }

    /// Marks every member that is out of service as having missed a write.
    pub(crate) fn note_write(&self) {
        for member in self.members.iter().filter(|m| m.state() != MemberState::Online) {
            member.missed_writes.store(true, Ordering::Release);
        }
    }

    /// Members that must not be written now: out of service. A member being rebuilt is
    /// written (see [`MemberState::Rebuilding`]).
    pub(crate) fn unwritable(&self) -> MemberSet {
        let mut set = MemberSet::default();
        for (index, member) in self.members.iter().enumerate() {
            if !matches!(member.state(), MemberState::Online | MemberState::Rebuilding) {
                set.insert(index);
            }
        }
        set
    }

    /// Members that must not be read now (every member not online, a rebuilding one too; a
    /// client read of one row may read more, see `unavailable_for_read`).
    pub(crate) fn unavailable(&self) -> MemberSet {
        let mut set = MemberSet::default();
        for (index, member) in self.members.iter().enumerate() {
            if member.state() != MemberState::Online {
                set.insert(index);
            }
        }
        set
    }

    pub fn state(&self) -> VdState {
        let lost = self.unavailable();
        let lost_mask: Vec<bool> = (0..self.members.len()).map(|m| lost.contains(m)).collect();
        if self.ssd_cache.is_lost() {
            // Its newest data was on a write-back cache VD that failed (`ssd_cache`).
            VdState::Offline
        } else if lost.is_empty() {
            VdState::Optimal
        } else if !self.geometry.survives(&lost_mask) {
            VdState::Offline
        } else if self.geometry.span_kind() == SpanKind::DoubleParity && self.max_lost_per_span(&lost) <= 1 {
            VdState::PartiallyDegraded
        } else {
            VdState::Degraded
        }
    }

    fn max_lost_per_span(&self, lost: &MemberSet) -> usize {
        let per_span = self.geometry.drives_per_span();
        (0..self.geometry.span_count())
            .map(|span| (span * per_span..(span + 1) * per_span).filter(|&m| lost.contains(m)).count())
            .max()
            .unwrap_or(0)
    }

    /// Sets a member's state by hand (administrator, tests). Returns the VD state after.
    pub fn set_member_state(&self, index: usize, state: MemberState) -> VdState {
        let guard = self.state_change.lock().expect("state lock poisoned");
        self.store_member_state(&guard, index, state);
        drop(guard);
        self.state()
    }

    /// Stores a member's state, under the state lock (the guard proves it is held).
    fn store_member_state(&self, _held: &MutexGuard<'_, ()>, index: usize, state: MemberState) {
        let before = self.members[index].state();
        self.members[index].state.store(state as u8, Ordering::Release);
        if before != state {
            tracing::warn!(vd = %self.name(), member = index, ?before, after = ?state, "member state changed");
        }
    }

    /// Books a member operation's failure and takes the member out of service when it must
    /// be: at once for a vanished drive or a failed write (its contents are now stale), after
    /// [`MEMBER_READ_ERRORS_MAX`] repaired read errors otherwise. Returns whether it was failed.
    ///
    /// A fault of a drive that has left the member's place (its rebuild epoch moved since the
    /// operation was submitted: a spare or a re-add took it) is not booked, or it would fail the
    /// drive being rebuilt there; it counts as failed, so that the attempt is retried with the
    /// member as it is now. The epoch is compared under the state lock, which `start_rebuild`
    /// holds while it swaps the drive, so no swap falls between the comparison and the change.
    pub(crate) fn member_error(&self, fault: &MemberFault) -> bool {
        let MemberFault { index, kind, ref error, epoch } = *fault;
        let member = &self.members[index];
        let guard = self.state_change.lock().expect("state lock poisoned");
        if self.rebuild_epoch(index) != epoch {
            tracing::debug!(vd = %self.name(), member = index, ?kind, %error, "an operation of a drive since replaced failed");
            return true;
        }
        let fail = match (kind, error) {
            (_, DriveError::Gone) => true,
            (OpKind::Read, _) => member.read_errors.fetch_add(1, Ordering::Relaxed) + 1 >= MEMBER_READ_ERRORS_MAX,
            _ => true,
        };
        tracing::warn!(vd = %self.name(), member = index, drive = %member.drive().info().name, ?kind, %error, fail, "member I/O error");
        if !fail || !matches!(member.state(), MemberState::Online | MemberState::Rebuilding) {
            return fail;
        }
        // Whatever was being written when it failed did not reach it.
        member.missed_writes.store(true, Ordering::Release);
        // Counted before the state changes, so that no write that skips the member can be
        // acknowledged before the controller has recorded the failure.
        let notifier = self.notifier.get();
        if notifier.is_some() {
            let mut gate = self.acks.lock().expect("ack gate poisoned");
            gate.failures_unrecorded += 1;
            self.set_gated(&gate);
        }
        self.store_member_state(&guard, index, MemberState::Failed);
        // Reported once, by the booking that changed the state; unlocked, since a report
        // without a listener records itself at once.
        drop(guard);
        if let Some(notifier) = notifier {
            self.report_failure(notifier, index, format!("{kind:?} error: {error}"), false);
        }
        true
    }

    /// Puts `drive` in member `index`'s place and starts writing it (a rebuild onto a spare or
    /// a replacement). The member must be out of service, so no new I/O goes to the old drive.
    /// Operations still on their way to it may end after: one that fails then is not booked
    /// against the new drive (its [`MemberFault`] carries the epoch before this one), and a
    /// write that reached the old drive only is rewritten by the rebuild of its row, which
    /// waits for the write's row lock.
    pub fn start_rebuild(&self, index: usize, drive: Arc<dyn Drive>) {
        let member = &self.members[index];
        assert!(
            drive.info().capacity_bytes >= self.geometry.member_used_bytes(),
            "v{}: the new drive of member {index} is too small",
            self.id
        );
        let guard = self.state_change.lock().expect("state lock poisoned");
        let state = member.state();
        assert!(
            matches!(state, MemberState::Failed | MemberState::Missing),
            "v{}: member {index} is {state:?}, not out of service",
            self.id
        );
        member.set_drive(drive);
        // Whatever it missed is what the rebuild writes.
        member.missed_writes.store(true, Ordering::Release);
        // Before the state: no read may find the member Rebuilding with an earlier rebuild's rows.
        member.rebuilt.begin();
        self.store_member_state(&guard, index, MemberState::Rebuilding);
    }

    /// The rebuild of member `index` covered every row: it is current and in service.
    pub fn finish_rebuild(&self, index: usize) {
        let member = &self.members[index];
        assert_eq!(member.state(), MemberState::Rebuilding, "v{}: member {index} is not being rebuilt", self.id);
        member.missed_writes.store(false, Ordering::Release);
        member.read_errors.store(0, Ordering::Relaxed);
        self.set_member_state(index, MemberState::Online);
    }

    /// The controller has written (or failed to write) one reported member failure to the
    /// members' metadata. Held write acknowledgements go out once every reported failure is
    /// recorded; if the record failed, those writes fail instead.
    pub fn failure_recorded(&self, outcome: Result<(), String>) {
        let mut gate = self.acks.lock().expect("ack gate poisoned");
        assert!(gate.failures_unrecorded > 0, "v{}: a failure was recorded that was never reported", self.id);
        gate.failures_unrecorded -= 1;
        gate.record_error = outcome.err();
        self.set_gated(&gate);
        if gate.failures_unrecorded > 0 {
            return;
        }
        let held = std::mem::take(&mut gate.held);
        let refusal = gate.record_error.clone().map(|detail| VdError::FailureUnrecorded { vd: self.name(), detail });
        drop(gate);
        for (done, completion) in held {
            let result = refusal.clone().map_or(completion.result, Err);
            self.complete(done, VdCompletion { result, buf: completion.buf });
        }
    }

    /// A later successful metadata write recorded every failure: writes may be acknowledged again.
    pub fn metadata_current(&self) {
        let mut gate = self.acks.lock().expect("ack gate poisoned");
        if gate.failures_unrecorded == 0 {
            gate.record_error = None;
        }
        self.set_gated(&gate);
    }
}
