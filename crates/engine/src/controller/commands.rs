//! The administrator's commands: virtual drives, drive states, hot spares, foreign configurations.

use super::*;
use crate::bitmap::control::Opening;

/// How long a deletion waits for the VD's requests in flight to finish.
const VD_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Controller {
    // -----------------------------------------------------------------------------------------
    // Virtual drives

    /// Creates a VD over unconfigured good drives.
    ///
    /// # Errors
    /// Which slot or rule is wrong, and what is allowed; nothing changes.
    pub fn create_vd(&self, spec: CreateVdSpec) -> Result<VdRecord, ControlError> {
        self.create_vd_of_kind(spec, None)
    }

    /// Creates a VD, or a cache VD (`cache`: `Some(write_back)`, see `ssd_caching`).
    pub(super) fn create_vd_of_kind(&self, spec: CreateVdSpec, cache: Option<bool>) -> Result<VdRecord, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        check_new_members(&state, &spec.slots)?;
        let vd_id = (0..).find(|id| !state.vds.contains_key(id)).expect("a free VD id");
        let name = match &spec.name {
            Some(name) => parse_name(name)?,
            None => format!("v{vd_id}"),
        };
        if let Some(other) = state.config.vds.iter().find(|v| v.name == name) {
            return Err(ControlError::Conflict(format!(
                "VD name {name:?} is used by v{}; names are NBD export names and must be unique",
                other.vd_id
            )));
        }
        let members: Vec<Arc<dyn Drive>> = spec.slots.iter().map(|s| Arc::clone(&state.slots[s].drive)).collect();
        // Recorded, so that a member found smaller later is refused rather than the VD shrunk.
        let member_size_bytes = members.iter().map(|d| d.info().capacity_bytes).min().unwrap_or(0);
        let layout = VdLayout {
            level: spec.level,
            strip_size_bytes: spec.strip_size_bytes,
            drives_per_span: spec.drives_per_span,
            member_size_bytes: Some(member_size_bytes),
        };
        let vd = VirtualDrive::new(u64::from(vd_id), &name, layout, members)
            .map_err(|e| ControlError::BadInput(format!("{e}: slots {}", slot_list(&spec.slots))))?;
        vd.set_write_policy(spec.write_policy);
        vd.set_read_policies(spec.read_policy, spec.io_policy);
        vd.set_seq_cutoff(spec.seq_cutoff);
        let record = VdRecord {
            vd_id,
            drive_group: vd_id,
            name,
            level: spec.level,
            strip_size_bytes: spec.strip_size_bytes,
            drives_per_span: vd.geometry().drives_per_span() as u32,
            member_slots: spec.slots.clone(),
            write_policy: spec.write_policy,
            read_policy: spec.read_policy,
            io_policy: spec.io_policy,
            member_size_bytes,
            bad_blocks: Vec::new(),
            bgi_pending: false,
            cache_vd: false,
            cache_write_back: false,
            ssd_cache_vd_id: None,
            seq_cutoff: spec.seq_cutoff,
        };
        let opening = bgi::opening_for(&vd);
        let (cache_vd, cache_write_back) = (cache.is_some(), cache == Some(true));
        let record = VdRecord { bgi_pending: opening == Opening::CreatedOverData, cache_vd, cache_write_back, ..record };
        vd.set_notifier(self.member_events.clone());
        self.open_write_intent(state.config.controller_id, vd_id, &vd, opening);
        vd.bad_blocks().set_notifier(self.bad_block_events.clone());
        let detail = format!("member of v{vd_id}");
        for slot in &spec.slots {
            self.transition(&mut state, *slot, DriveState::Online, state::Cause::VdCreated, Some(&detail));
        }
        state.config.vds.push(record.clone());
        state.vds.insert(vd_id, Arc::new(vd));
        let persisted = self.persist(&mut state);
        if cache_vd {
            self.apply_ssd_caches(&mut state, &BTreeMap::new());
        }
        drop(state);
        self.log(
            Severity::Info,
            format!("created v{vd_id} {:?}: {} over slots {}", record.name, record.level, slot_list(&record.member_slots)),
        );
        if persisted.is_ok() {
            self.bgi_at_create(vd_id, opening);
        }
        self.vds_changed();
        persisted.map(|()| record)
    }

    /// Deletes a VD; its drives become unconfigured good, except failed ones, which become
    /// unconfigured bad, and missing ones, which stay missing (see `state`). `in_use` says
    /// whether clients are connected to it; then `force` is needed.
    ///
    /// # Errors
    /// No such VD, or in use without `force`.
    pub fn delete_vd(&self, vd_id: u32, force: bool, in_use: bool) -> Result<(), ControlError> {
        // A write-back cache VD's data goes to the VDs it caches first, and a VD cached
        // write-back has its lines destaged (not under the lock): no dirty line of it may
        // outlive it in the table, to be read back into a VD made later under its number.
        self.drain_cache_vd_users(vd_id)?;
        if let Err(error) = self.drain_for_delete(vd_id) {
            self.end_cache_vd_drains(vd_id);
            return Err(error);
        }
        let deleted = self.delete_drained_vd(vd_id, force, in_use);
        if deleted.is_err() {
            self.end_cache_vd_drains(vd_id);
        }
        deleted
    }

    fn delete_drained_vd(&self, vd_id: u32, force: bool, in_use: bool) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(position) = state.config.vds.iter().position(|v| v.vd_id == vd_id) else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        if in_use && !force {
            return Err(ControlError::Conflict(format!("v{vd_id} has NBD clients connected; disconnect them or add `force`")));
        }
        if self.migrations().iter().any(|m| m.vd_id == vd_id) {
            return Err(ControlError::Conflict(format!(
                "v{vd_id} is being migrated; stop the migration first (`/c0/v{vd_id} stop migrate`)"
            )));
        }
        if self.inits.lock().expect("inits lock").contains_key(&vd_id) {
            // Its thread writes the members: they must not go to another VD meanwhile.
            return Err(ControlError::Conflict(format!(
                "v{vd_id} is being initialized (full); delete it once that ends (`show init` says how far)"
            )));
        }
        // The VDs it caches go on uncached; cached, it goes on uncached until it is gone.
        self.unlink_ssd_caching(&mut state, vd_id);
        // Nothing of this VD may still be on its way to the drives once another VD can have
        // them: refuse new requests, then wait for those already queued or running.
        let vd = Arc::clone(&state.vds[&vd_id]);
        vd.retire();
        if !vd.wait_idle(VD_DRAIN_TIMEOUT) {
            vd.unretire();
            return Err(ControlError::Conflict(format!(
                "v{vd_id} still has {} request(s) in flight after {} s; nothing was deleted, try again",
                vd.requests_in_flight(),
                VD_DRAIN_TIMEOUT.as_secs()
            )));
        }
        if let Err(error) = self.engine.forget(&vd) {
            // Its id is free once the record is gone: the journal must hold nothing of it.
            vd.unretire();
            return Err(ControlError::Conflict(format!(
                "v{vd_id} cannot be deleted yet: the cache cannot be emptied ({error}); nothing was deleted"
            )));
        }
        let record = state.config.vds.remove(position);
        state.vds.remove(&vd_id);
        let detail = format!("was a member of v{vd_id}");
        for slot in &record.member_slots {
            let from = state.config.drives.iter().find(|d| d.slot == *slot).map(|d| d.state);
            if let Some(to) = from.and_then(state::after_vd_deleted) {
                self.transition(&mut state, *slot, to, state::Cause::VdDeleted, Some(&detail));
            }
        }
        self.release_copy_targets(&mut state, &record);
        // A spare dedicated only to this drive group has nothing left to serve: it becomes
        // unconfigured good (as on a MegaRAID), never silently global.
        let dg = record.drive_group;
        let orphaned: Vec<u32> = state.config.hot_spares.iter().filter(|h| h.dedicated_drive_groups == [dg]).map(|h| h.slot).collect();
        state.config.hot_spares.retain(|h| !orphaned.contains(&h.slot));
        for spare in &mut state.config.hot_spares {
            spare.dedicated_drive_groups.retain(|g| *g != dg);
        }
        for slot in &orphaned {
            // A missing spare stays missing; found again it is in no VD, so UGood.
            if state.config.drives.iter().any(|d| d.slot == *slot && d.state == DriveState::HotSpare) {
                let detail = format!("was dedicated to drive group {dg}");
                self.transition(&mut state, *slot, DriveState::UnconfiguredGood, state::Cause::VdDeleted, Some(&detail));
            }
        }
        let persisted = self.persist(&mut state);
        drop(state);
        // Its resync or BGI ends (its rows now fail); a new VD with this number starts afresh.
        if let Some(resync) = self.resyncs.lock().expect("resyncs lock").remove(&vd_id) {
            resync.progress.set_control(crate::background::Control::Stop);
        }
        self.bgi_stopped.lock().expect("bgi lock").remove(&vd_id);
        self.log(Severity::Info, format!("deleted v{vd_id} {:?}", record.name));
        self.vds_changed();
        persisted
    }

    /// Changes a VD's policies or name.
    ///
    /// # Errors
    /// No such VD, or a bad or duplicate name.
    pub fn set_vd(&self, vd_id: u32, changes: VdChanges) -> Result<VdRecord, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let name = changes.name.as_deref().map(parse_name).transpose()?;
        if let Some(name) = &name {
            if let Some(other) = state.config.vds.iter().find(|v| &v.name == name && v.vd_id != vd_id) {
                return Err(ControlError::Conflict(format!("VD name {name:?} is used by v{}", other.vd_id)));
            }
        }
        let Some(record) = state.config.vds.iter_mut().find(|v| v.vd_id == vd_id) else {
            drop(state);
            return Err(self.no_vd(vd_id));
        };
        record.write_policy = changes.write_policy.unwrap_or(record.write_policy);
        record.read_policy = changes.read_policy.unwrap_or(record.read_policy);
        record.io_policy = changes.io_policy.unwrap_or(record.io_policy);
        record.seq_cutoff = changes.seq_cutoff.unwrap_or(record.seq_cutoff);
        let renamed = name.is_some();
        if let Some(name) = name {
            record.name = name;
        }
        let record = record.clone();
        if renamed {
            // Renamed in place: connections to the VD stay bound to this object and keep seeing
            // its member states (a rebuilt object would leave them on a stale copy).
            state.vds[&vd_id].set_name(&record.name);
        }
        let persisted = self.persist(&mut state);
        state.vds[&vd_id].set_write_policy(record.write_policy);
        state.vds[&vd_id].set_read_policies(record.read_policy, record.io_policy);
        state.vds[&vd_id].set_seq_cutoff(record.seq_cutoff);
        drop(state);
        if record.write_policy == WritePolicy::WriteBack && !self.journal_usable() {
            self.log(Severity::Warning, format!("v{vd_id} is WB and runs as WT: the journal is not usable (a bad battery)"));
        }
        self.log(
            Severity::Info,
            format!(
                "v{vd_id}: policies {} {} {}, seqcutoff {}, name {:?}",
                record.write_policy.short_name(),
                record.read_policy.short_name(),
                record.io_policy.short_name(),
                record.seq_cutoff.text(),
                record.name
            ),
        );
        if renamed {
            self.vds_changed();
        }
        persisted.map(|()| record)
    }

    // -----------------------------------------------------------------------------------------
    // Drives and hot spares

    /// Takes a drive out, brings it back, marks it missing, or makes it unconfigured good.
    ///
    /// # Errors
    /// No such slot, or the change is not allowed from its state (with what is); nothing changes.
    /// If the metadata cannot be written, a member stays in service (see below).
    pub fn set_drive(&self, slot: u32, command: DriveCommand) -> Result<(), ControlError> {
        self.change_drive(slot, command, false)?;
        // A cache VD this took offline: as if its member had failed (`ssd_caching`).
        let offline_cache_vd = {
            let state = self.state.lock().expect("controller lock");
            member_of(&state, slot)
                .filter(|(vd_id, _)| state.config.vds.iter().any(|v| v.vd_id == *vd_id && v.cache_vd))
                .filter(|(vd_id, _)| state.vds[vd_id].state() == crate::VdState::Offline)
                .map(|(vd_id, _)| vd_id)
        };
        if let Some(cache_vd_id) = offline_cache_vd {
            self.cache_vd_failed(cache_vd_id, false);
        }
        Ok(())
    }

    /// `set online force`: brings a member back even though it missed writes, for a VD that lost
    /// more than it tolerates while the members' contents are still there (a backing filesystem
    /// that filled up failed two members of a RAID5 at once). The rows written while it was out
    /// are stale on it; an event says so, and a consistency check repairs them.
    ///
    /// # Errors
    /// As [`Controller::set_drive`] for `online`, except that missed writes do not refuse it.
    pub fn force_online(&self, slot: u32) -> Result<(), ControlError> {
        self.change_drive(slot, DriveCommand::Online, true)
    }

    fn change_drive(&self, slot: u32, command: DriveCommand, force: bool) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.drives.iter().find(|d| d.slot == slot).cloned() else {
            drop(state);
            return Err(self.no_slot(slot));
        };
        let membership = member_of(&state, slot);
        let new_state = plan_drive_change(slot, record.state, command, membership.as_ref().map(|(vd, _)| vd))?;
        let vd = membership.map(|(vd_id, index)| (Arc::clone(&state.vds[&vd_id]), vd_id, index));
        if let Some((vd, vd_id, index)) = &vd {
            let missed = new_state == DriveState::Online && vd.member(*index).has_missed_writes();
            if missed && vd.write_intent().is_some() && vd.state() != crate::VdState::Offline {
                // Only the regions written while it was out need it: md's re-add. `force` is
                // for a VD that is offline without the member; here it would only serve stale rows.
                let (vd_id, index) = (*vd_id, *index);
                return self.re_add(&mut state, slot, vd_id, index);
            }
            if missed && !force {
                return Err(ControlError::Conflict(format!(
                    "slot {slot} missed writes to v{vd_id} while out of service; bringing it online would serve stale data. It needs a rebuild: a hot spare takes its place, or `start rebuild` on a replacement; `set online force` accepts the stale rows (for a VD that is offline otherwise)"
                )));
            }
        }
        let transition = self.transition(&mut state, slot, new_state, state::Cause::Command(command), None);
        let into_service = new_state == DriveState::Online;
        if let (Some((vd, _, index)), true) = (&vd, into_service) {
            // Back in service before the record: a crash in between finds it out of service in
            // the metadata, which is only conservative.
            vd.set_member_state(*index, MemberState::Online);
        }
        let persisted = self.persist(&mut state);
        match (&vd, into_service, &persisted) {
            // Out of service only once the metadata says so: no write may skip a member whose
            // absence a crash would forget.
            (Some((vd, vd_id, index)), false, Ok(())) => {
                vd.set_member_state(*index, member_state_of(new_state));
                self.take_over(&mut state, *vd_id);
            }
            (Some(_), false, Err(_)) => self.undo_transition(&mut state, &transition),
            (Some((vd, vd_id, index)), true, Ok(())) if force && vd.member(*index).has_missed_writes() => {
                let suspect = suspect_rows(vd);
                self.log(
                    Severity::Critical,
                    format!(
                        "slot {slot} forced online in v{vd_id} ({}): writes made while it was out of service are missing on it; {suspect}",
                        vd.state().short_name()
                    ),
                );
                // Back within its tolerance, the VD gets spares for the members still out.
                self.take_over(&mut state, *vd_id);
            }
            // A drive made good in a slot a spare replaced: the spare may copy back to it.
            (None, false, Ok(())) if new_state == DriveState::UnconfiguredGood => self.offer_copyback(&mut state, slot, "set good"),
            _ => {}
        }
        drop(state);
        persisted
    }

    /// Makes an unconfigured good drive a hot spare, global (no drive groups) or dedicated.
    ///
    /// # Errors
    /// No such slot, the drive is not unconfigured good, or a drive group does not exist.
    pub fn add_hot_spare(&self, slot: u32, drive_groups: Vec<u32>) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.drives.iter().find(|d| d.slot == slot).cloned() else {
            drop(state);
            return Err(self.no_slot(slot));
        };
        if state::check(record.state, DriveState::HotSpare, state::Cause::SpareAdded).is_err() {
            return Err(ControlError::Conflict(format!(
                "slot {slot} is {}; only an unconfigured good (UGood) drive can become a hot spare",
                record.state.short_name()
            )));
        }
        for dg in &drive_groups {
            if state.config.vds.iter().all(|v| v.drive_group != *dg) {
                let dgs: Vec<String> = state.config.vds.iter().map(|v| v.drive_group.to_string()).collect();
                return Err(ControlError::NotFound(format!(
                    "drive group {dg} does not exist; drive groups: {}",
                    if dgs.is_empty() { "none".into() } else { dgs.join(", ") }
                )));
            }
        }
        let kind = match drive_groups.is_empty() {
            true => "global (GHS)".to_string(),
            false => format!("dedicated (DHS) to drive group(s) {}", slot_list(&drive_groups)),
        };
        self.transition(&mut state, slot, DriveState::HotSpare, state::Cause::SpareAdded, Some(&kind));
        state.config.hot_spares.push(HotSpareRecord { slot, dedicated_drive_groups: drive_groups });
        self.persist(&mut state)
    }

    /// Turns a hot spare back into an unconfigured good drive.
    ///
    /// # Errors
    /// No such slot, or it is not a hot spare.
    pub fn delete_hot_spare(&self, slot: u32) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let Some(position) = state.config.hot_spares.iter().position(|h| h.slot == slot) else {
            let exists = state.config.drives.iter().any(|d| d.slot == slot);
            drop(state);
            return Err(if exists { ControlError::Conflict(format!("slot {slot} is not a hot spare")) } else { self.no_slot(slot) });
        };
        state.config.hot_spares.remove(position);
        // A missing spare stays missing; found again it is in no VD, so UGood.
        if state.config.drives.iter().any(|d| d.slot == slot && d.state == DriveState::HotSpare) {
            self.transition(&mut state, slot, DriveState::UnconfiguredGood, state::Cause::SpareRemoved, None);
        }
        if let Some((vd_id, _)) = member_of(&state, slot) {
            // A spare serving as a member: it stays a member, no longer revertible.
            rebuild::set_copy_slot(&mut state.config, slot, None);
            self.log(Severity::Info, format!("slot {slot} stays a member of v{vd_id}; it is no longer a hot spare (no copyback)"));
        }
        self.persist(&mut state)
    }

    // -----------------------------------------------------------------------------------------
    // Foreign configurations

    /// Adopts every foreign configuration: its VDs join ours, its drives become our members.
    ///
    /// # Errors
    /// If there is none, or its VDs' names clash with ours.
    pub fn import_foreign(&self) -> Result<usize, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.foreign.is_empty() {
            return Err(ControlError::NotFound("there is no foreign configuration to import".into()));
        }
        if let Some(refusal) = state.foreign.iter().find_map(write_back_cache_in_use) {
            return Err(ControlError::Conflict(refusal));
        }
        let foreign = std::mem::take(&mut state.foreign);
        let mut imported = 0;
        for config in &foreign {
            imported += import_one(&mut state, config)
                .map_err(|e| ControlError::Conflict(format!("foreign configuration {:032x}: {e}", config.superblock.controller_id.0)))?;
        }
        for record in state.config.vds.clone() {
            if !state.vds.contains_key(&record.vd_id) {
                let vd = self.build_vd(&state, &record)?;
                state.vds.insert(record.vd_id, vd);
            }
        }
        self.apply_ssd_caches(&mut state, &BTreeMap::new());
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Info, format!("imported {imported} VD(s) from {} foreign configuration(s)", foreign.len()));
        self.vds_changed();
        persisted.map(|()| imported)
    }

    /// Clears every foreign configuration; its drives become unconfigured good drives of ours.
    ///
    /// # Errors
    /// If there is none, or a drive's metadata cannot be cleared.
    pub fn clear_foreign(&self) -> Result<usize, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        if state.foreign.is_empty() {
            return Err(ControlError::NotFound("there is no foreign configuration to delete".into()));
        }
        let foreign = std::mem::take(&mut state.foreign);
        let slots: Vec<u32> = foreign.iter().flat_map(|f| f.slots.clone()).collect();
        for slot in &slots {
            let present = state.slots.get_mut(slot).expect("foreign drives are present");
            metadata::clear(&*present.drive).map_err(|e| ControlError::Io(format!("slot {slot}: {e}")))?;
            present.foreign = false;
            present.drive_id = DriveId(random_id());
            let record = DriveRecord {
                slot: *slot,
                drive_id: present.drive_id,
                state: DriveState::UnconfiguredGood,
                capacity_bytes: present.drive.info().capacity_bytes,
                rebuild_row: 0,
                copy_slot: None,
            };
            state.config.drives.push(record);
        }
        let persisted = self.persist(&mut state);
        drop(state);
        self.log(Severity::Warning, format!("cleared {} foreign configuration(s) on slots {}", foreign.len(), slot_list(&slots)));
        persisted.map(|()| foreign.len())
    }
}

/// The state a drive command leads to, or why it is not allowed: the command's own rule (members
/// of a VD or drives in none), then the drive state table.
fn plan_drive_change(slot: u32, current: DriveState, command: DriveCommand, vd: Option<&u32>) -> Result<DriveState, ControlError> {
    let refusal = || {
        let (current, words, allowed) = (current.short_name(), command.cli_words(), command.allowed_for());
        ControlError::Conflict(format!("slot {slot} is {current}; `{words}` is allowed only for {allowed}"))
    };
    match (command.for_members(), vd) {
        (true, None) => return Err(refusal()),
        (false, Some(vd)) => return Err(ControlError::Conflict(format!("slot {slot} is a member of v{vd}; delete the VD first"))),
        _ => {}
    }
    state::check(current, command.target(), state::Cause::Command(command)).map_err(|_| refusal())?;
    Ok(command.target())
}

/// Checks that `slots` can become the members of a new VD.
fn check_new_members(state: &State, slots: &[u32]) -> Result<(), ControlError> {
    if slots.is_empty() {
        return Err(ControlError::BadInput("a VD needs drives; give them as drives=0-3".into()));
    }
    for (i, slot) in slots.iter().enumerate() {
        if slots[..i].contains(slot) {
            return Err(ControlError::BadInput(format!("slot {slot} is listed twice: slots {}", slot_list(slots))));
        }
        if state.slots.get(slot).is_some_and(|s| s.foreign) {
            return Err(ControlError::Conflict(format!(
                "slot {slot} holds a foreign configuration; import it (/c0/fall import) or clear it (/c0/fall del) first"
            )));
        }
        let Some(record) = state.config.drives.iter().find(|d| d.slot == *slot) else {
            let mut known: Vec<u32> = state.config.drives.iter().map(|d| d.slot).chain(state.slots.keys().copied()).collect();
            known.sort_unstable();
            known.dedup();
            return Err(ControlError::NotFound(format!("slot {slot} does not exist; slots: {}", slot_list(&known))));
        };
        if record.state != DriveState::UnconfiguredGood || state.slots.get(slot).is_none_or(|s| s.foreign) {
            let what = match member_of(state, *slot) {
                Some((vd, _)) => format!("a member of v{vd}"),
                None if record.state == DriveState::HotSpare => format!("a hot spare (remove it with /c0/s{slot} delete hotsparedrive)"),
                None => record.state.short_name().to_string(),
            };
            return Err(ControlError::Conflict(format!("slot {slot} is {what}; a new VD needs unconfigured good (UGood) drives")));
        }
    }
    Ok(())
}

/// Moves one foreign configuration's VDs into ours. Returns how many.
fn import_one(state: &mut State, foreign: &ForeignConfig) -> Result<usize, String> {
    let theirs = &foreign.superblock.config;
    // Their slot numbers -> ours, through the drive ids.
    let slot_of = |their_slot: u32| -> Option<u32> {
        let drive_id = theirs.drives.iter().find(|d| d.slot == their_slot)?.drive_id;
        state.slots.iter().find(|(_, s)| s.drive_id == drive_id).map(|(slot, _)| *slot)
    };
    let mut new_records = Vec::new();
    for record in &theirs.vds {
        if state.config.vds.iter().any(|v| v.name == record.name) {
            return Err(format!("its VD name {:?} is already used here; rename ours first", record.name));
        }
        let taken: Vec<u32> = state.config.vds.iter().map(|v| v.vd_id).chain(new_records.iter().map(|r: &VdRecord| r.vd_id)).collect();
        let vd_id = (0..).find(|id| !taken.contains(id)).expect("a free id");
        let member_slots: Vec<u32> = record.member_slots.iter().map(|s| slot_of(*s).unwrap_or(u32::MAX)).collect();
        new_records.push(VdRecord { vd_id, drive_group: vd_id, member_slots, ..record.clone() });
    }
    for slot in &foreign.slots {
        let present = state.slots.get_mut(slot).expect("foreign drives are present");
        present.foreign = false;
        let their_state =
            theirs.drives.iter().find(|d| d.drive_id == present.drive_id).map(|d| d.state).unwrap_or(DriveState::UnconfiguredGood);
        let record = DriveRecord {
            slot: *slot,
            drive_id: present.drive_id,
            state: their_state,
            capacity_bytes: present.drive.info().capacity_bytes,
            rebuild_row: 0,
            copy_slot: None,
        };
        state.config.drives.push(record);
    }
    let count = new_records.len();
    state.config.vds.extend(new_records);
    Ok(count)
}

/// After `set online force`: the rows that may disagree, for the event. The bitmap's dirty
/// regions hold every row written since the VD was last whole and idle, so the rows whose
/// writes failed when members failed are among them; a consistency check of those rows
/// repairs what disagrees. They are not fenced off: most of them hold acknowledged data that
/// reads back.
fn suspect_rows(vd: &VirtualDrive) -> String {
    let Some(intent) = vd.write_intent() else {
        return "no bitmap says which rows were written; run a consistency check".into();
    };
    let dirty = intent.dirty_regions();
    if dirty.is_empty() {
        return "no row was written since the VD was last whole".into();
    }
    let ranges: Vec<String> = dirty.ones().take(8).map(|region| format!("{:?}", intent.regions.rows_of(region))).collect();
    let more = if dirty.count() > 8 { format!(" and {} more region(s)", dirty.count() - 8) } else { String::new() };
    format!(
        "the rows whose writes failed are among rows {}{more} (written while members were failing); run a consistency check of them",
        ranges.join(", ")
    )
}

/// Why a foreign configuration cannot be imported as it is: a write-back cache VD caching VDs
/// may hold their newest data in a table that names the other controller's VD numbers, which
/// an import renumbers; imported without it, those VDs would serve older data.
fn write_back_cache_in_use(config: &ForeignConfig) -> Option<String> {
    let vds = &config.superblock.config.vds;
    let cache = vds.iter().find(|c| c.cache_vd && c.cache_write_back && vds.iter().any(|v| v.ssd_cache_vd_id == Some(c.vd_id)))?;
    Some(format!(
        "foreign configuration {:032x}: its write-back cache VD v{} caches VDs and may hold their newest data, which an import cannot carry over; turn their SSD caching off (or delete the cache VD) on the controller that made it, then import",
        config.superblock.controller_id.0, cache.vd_id
    ))
}
