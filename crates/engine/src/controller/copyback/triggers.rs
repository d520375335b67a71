//! What starts, resumes or ends copies from elsewhere in the controller: assembly, a slot that
//! becomes good, `insert` into a place held by a member in service, a spare's rebuild ending,
//! a VD's deletion.

use super::*;

impl Controller {
    /// At assembly, once the VDs are built and before resyncs start or spares take over:
    /// resumes the recorded copies whose member is online (from their checkpoint, or lower
    /// after an unclean stop), forgets what a vanished copy left behind, and offers a copyback
    /// to every slot that holds a drive found blank at this start. A copy whose member is out
    /// of service is left to `take_over`, which makes its target the member's rebuild.
    pub(in crate::controller) fn resume_copies(&self, state: &mut State, known_ids: &[DriveId]) {
        let targets: Vec<DriveRecord> = state.config.drives.iter().filter(|d| d.state == DriveState::Copyback).cloned().collect();
        for record in targets {
            self.resume_copy(state, &record);
        }
        if tidy_copy_slots(&mut state.config) {
            let _ = self.persist(state);
        }
        let new_drives: Vec<u32> = state
            .slots
            .iter()
            .filter(|(slot, present)| !present.foreign && !known_ids.contains(&present.drive_id) && unconfigured_good(state, **slot))
            .map(|(slot, _)| *slot)
            .collect();
        for slot in new_drives {
            self.offer_copyback(state, slot, "a new drive was found in its place at start");
        }
    }

    fn resume_copy(&self, state: &mut State, record: &DriveRecord) {
        let target = record.slot;
        let membership = record.copy_slot.and_then(|source| member_of(state, source).map(|m| (source, m)));
        let Some((source, (vd_id, member))) = membership else {
            let reason = "the member it copied is in no VD any more";
            self.return_target(state, target, state::Cause::CopybackStopped, reason);
            return drop(self.persist(state));
        };
        let copy = CopyJob { vd_id, member, source, target };
        let vd = Arc::clone(&state.vds[&vd_id]);
        if vd.member(member).state() != MemberState::Online {
            return; // out of service: take_over made the target its rebuild, or said why not
        }
        let fits = state.slots.get(&target).is_some_and(|s| s.drive.info().capacity_bytes >= vd.geometry().member_used_bytes());
        if !fits {
            return self.abandon_copy(state, copy, "the target is smaller than the member now", Severity::Critical);
        }
        let row = resume_row(&vd, record.rebuild_row);
        if row < record.rebuild_row {
            let checkpoint = record.rebuild_row;
            let why = format!("v{vd_id} stopped uncleanly with writes in flight from row {row}, which are copied again");
            self.log(Severity::Warning, format!("copyback of slot {source} to slot {target}: checkpoint at row {checkpoint}, but {why}"));
        }
        self.log(Severity::Info, format!("copyback of slot {source} to slot {target} (v{vd_id}) resumes at row {row}"));
        vd.start_copy(member, Arc::clone(&state.slots[&target].drive));
        self.spawn_copy(vd, copy, row, state.config.settings.rebuild_rate_percent);
    }

    /// Slot `slot` holds a good drive again (`why`): if a spare took its place, copy the spare
    /// back to it (copyback=on), or say how to (copyback=off).
    pub(in crate::controller) fn offer_copyback(&self, state: &mut State, slot: u32, why: &str) {
        let Some(spare) = serving_spare_for(state, slot) else { return };
        if !state.config.settings.copyback {
            let hint = format!("/c0/s{spare} start copyback target={slot} copies it back");
            return self.log(
                Severity::Info,
                format!("slot {slot}, which slot {spare} replaced, holds a good drive ({why}); copyback is off: {hint}"),
            );
        }
        let spare_state = state.config.drives.iter().find(|d| d.slot == spare).map(|d| d.state);
        if spare_state == Some(DriveState::Rebuild) {
            self.copyback_pending.lock().expect("copyback pending lock").insert(spare);
            return self.log(Severity::Info, format!("copyback of slot {spare} to slot {slot} ({why}) starts when its rebuild is done"));
        }
        let started = check_copy(state, spare, slot).and_then(|copy| self.begin_copy(state, copy, &format!("copyback: {why}")));
        if let Err(error) = started {
            self.log(Severity::Warning, format!("copyback of slot {spare} to slot {slot} not started: {error}"));
        }
    }

    /// The rebuild of spare `spare` is done: a copyback asked for meanwhile starts now.
    pub(in crate::controller) fn start_pending_copyback(&self, state: &mut State, spare: u32) {
        if !self.copyback_pending.lock().expect("copyback pending lock").remove(&spare) {
            return;
        }
        let replaced = state.config.drives.iter().find(|d| d.slot == spare).and_then(|d| d.copy_slot);
        if let Some(slot) = replaced.filter(|slot| unconfigured_good(state, *slot)) {
            self.offer_copyback(state, slot, "it became good during the rebuild");
        }
    }

    /// `insert` of `slot` into the place of member `member` of `vd_id`, which is in service: the
    /// drive receives a copy of the member and then takes its place.
    pub(in crate::controller) fn copy_into_place(
        &self,
        state: &mut State,
        slot: u32,
        vd_id: u32,
        member: usize,
    ) -> Result<(), ControlError> {
        let source = state.config.vds.iter().find(|v| v.vd_id == vd_id).expect("checked").member_slots[member];
        let copy = check_copy(state, source, slot)?;
        self.begin_copy(state, copy, "inserted by the administrator")
    }

    /// VD `record` is being deleted: the targets of its copies return to what they were (a hot
    /// spare, or UGood), and spares that served in it are spares no more.
    pub(in crate::controller) fn release_copy_targets(&self, state: &mut State, record: &VdRecord) {
        for &source in &record.member_slots {
            let Some(target) = copy_target_of(&state.config, source) else { continue };
            self.stop_copy_view(target);
            self.return_target(state, target, state::Cause::VdDeleted, &format!("was receiving a copy of slot {source}"));
        }
        let keeps_record = |slot: u32| {
            let spare_state = state.config.drives.iter().find(|d| d.slot == slot).map(|d| d.state);
            matches!(spare_state, Some(DriveState::HotSpare | DriveState::Missing | DriveState::Copyback))
                || member_of(state, slot).is_some()
        };
        let kept: Vec<HotSpareRecord> = state.config.hot_spares.iter().filter(|h| keeps_record(h.slot)).cloned().collect();
        state.config.hot_spares = kept;
        tidy_copy_slots(&mut state.config);
    }

    /// Moves copy target `target` back to what it was (HSP when it has a hot spare record,
    /// UGood otherwise) and clears its copy fields. Not persisted.
    pub(in crate::controller) fn return_target(&self, state: &mut State, target: u32, cause: state::Cause, detail: &str) {
        let back_to = match state.config.hot_spares.iter().any(|h| h.slot == target) {
            true => DriveState::HotSpare,
            false => DriveState::UnconfiguredGood,
        };
        self.transition(state, target, back_to, cause, Some(detail));
        set_copy_slot(&mut state.config, target, None);
        set_rebuild_row(&mut state.config, target, 0);
    }
}

/// Where a copy checkpointed at `checkpoint_row` resumes: there, or lower when the VD stopped
/// uncleanly with writes in flight below it (its write-intent bitmap says where): such a write
/// may have reached the member and not the target, and a resync repairs only the members.
fn resume_row(vd: &VirtualDrive, checkpoint_row: u64) -> u64 {
    let checkpoint_row = checkpoint_row.min(vd.geometry().row_count());
    let Some(intent) = vd.write_intent() else { return checkpoint_row };
    let first_unsynced = intent.unsynced_regions().ones().next().map(|region| intent.regions.rows_of(region).start);
    first_unsynced.map_or(checkpoint_row, |row| row.min(checkpoint_row))
}

/// The spare serving as a member in the place of slot `slot` (a revertible spare), if any.
fn serving_spare_for(state: &State, slot: u32) -> Option<u32> {
    let spare = state.config.drives.iter().find(|d| d.copy_slot == Some(slot) && d.state != DriveState::Copyback)?;
    let revertible = state.config.hot_spares.iter().any(|h| h.slot == spare.slot) && member_of(state, spare.slot).is_some();
    revertible.then_some(spare.slot)
}

/// Whether `slot` holds a present drive of ours that is unconfigured good.
fn unconfigured_good(state: &State, slot: u32) -> bool {
    let present = state.slots.get(&slot).is_some_and(|s| !s.foreign);
    present && state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::UnconfiguredGood)
}

/// Clears `copy_slot` where the drive's state gives it no meaning (a copy target that vanished,
/// a spare that left its VD). Returns whether anything changed.
fn tidy_copy_slots(config: &mut ControllerConfig) -> bool {
    let member = |slot: u32| config.vds.iter().any(|v| v.member_slots.contains(&slot));
    let spare = |slot: u32| config.hot_spares.iter().any(|h| h.slot == slot);
    let stale: Vec<u32> = config
        .drives
        .iter()
        .filter(|d| {
            d.copy_slot.is_some() && !matches!(d.state, DriveState::Copyback | DriveState::Migrate) && !(spare(d.slot) && member(d.slot))
        })
        .map(|d| d.slot)
        .collect();
    for slot in &stale {
        config.drives.iter_mut().filter(|d| d.slot == *slot).for_each(|d| d.copy_slot = None);
    }
    !stale.is_empty()
}
