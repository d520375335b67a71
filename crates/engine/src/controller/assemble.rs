//! Assembly at start: which configuration to run and how each drive fits into it.

use super::*;

impl Controller {
    pub(super) fn assemble(
        &self,
        offered: Vec<OfferedDrive>,
        found: Vec<(usize, Superblock)>,
        assembly: metadata::Assembly,
    ) -> Result<u64, ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let superblock_of = |index: usize| found.iter().find(|(i, _)| *i == index).map(|(_, sb)| sb.clone());
        if let Some(ours) = &assembly.ours {
            state.config = ours.config.clone();
        }
        // What a clean stop wrote last, if this start follows one (the SSD caches' maps).
        let found_generation = state.config.generation;
        let ours_id = state.config.controller_id;
        let mut offered: Vec<Option<OfferedDrive>> = offered.into_iter().map(Some).collect();
        // Our drives keep their recorded slots.
        for (index, offer) in offered.iter_mut().enumerate() {
            let Some(sb) = superblock_of(index) else { continue };
            if sb.controller_id != ours_id || state.config.drives.iter().all(|d| d.drive_id != sb.drive_id) {
                continue;
            }
            let offer = offer.take().expect("each drive once");
            let slot = state.config.drives.iter().find(|d| d.drive_id == sb.drive_id).expect("checked").slot;
            if sb.generation < state.config.generation {
                // Configuration changes are written drive by drive, so a crash leaves some drives
                // a generation behind. That alone means a missed metadata update, not missed
                // data: a member that missed data is out of service in the newest configuration,
                // which recorded that before any write went on without it.
                self.log(
                    Severity::Info,
                    format!(
                        "drive at slot {slot} ({}) missed a metadata update (generation {}, newest {}); it is brought up to date",
                        offer.source, sb.generation, state.config.generation
                    ),
                );
            }
            state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: false });
        }
        // Foreign drives and blank drives take the lowest free slots.
        for (index, offer) in offered.into_iter().enumerate() {
            let Some(offer) = offer else { continue };
            // A drive that carries our id but left our configuration is blank to us.
            let foreign = superblock_of(index).filter(|sb| sb.controller_id != ours_id);
            let slot = match &foreign {
                Some(_) => super::bays::lowest_free_slot(&state),
                None => self.blank_drive_slot(&mut state, index),
            };
            match foreign {
                Some(sb) => {
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: true });
                    add_foreign(&mut state.foreign, sb, slot);
                }
                None => {
                    let drive_id = DriveId(random_id());
                    let capacity_bytes = offer.drive.info().capacity_bytes;
                    state.config.drives.push(DriveRecord {
                        slot,
                        drive_id,
                        state: DriveState::UnconfiguredGood,
                        capacity_bytes,
                        rebuild_row: 0,
                        copy_slot: None,
                    });
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id, foreign: false });
                }
            }
        }
        self.settle_returning_drives(&mut state);
        self.mark_missing(&mut state);
        self.refuse_shrunken_members(&mut state);
        for record in state.config.vds.clone() {
            let vd = self.build_vd(&state, &record)?;
            if vd.state() != crate::VdState::Optimal {
                self.log(
                    Severity::Warning,
                    format!("v{} {:?} starts {}: {}", record.vd_id, record.name, vd.state().short_name(), out_of_service(&state, &record)),
                );
            }
            state.vds.insert(record.vd_id, vd);
        }
        if !state.foreign.is_empty() {
            self.log(Severity::Warning, format!("{} foreign configuration(s) found; see /c0/fall show", state.foreign.len()));
        }
        self.persist(&mut state)?;
        self.log(
            Severity::Info,
            format!(
                "controller {:032x} started with {} drive(s) and {} VD(s), generation {}",
                ours_id.0,
                state.slots.len(),
                state.vds.len(),
                state.config.generation
            ),
        );
        self.resume_rebuilds(&state);
        // Before the resyncs: a copy resumes below the regions they are about to resync.
        let known_ids: Vec<DriveId> = found.iter().map(|(_, sb)| sb.drive_id).collect();
        self.resume_copies(&mut state, &known_ids);
        self.resume_migrations(&mut state);
        self.start_resyncs(&state);
        // Members out of service at start (a drive that vanished) get a spare, as at run time.
        for vd_id in state.config.vds.iter().map(|v| v.vd_id).collect::<Vec<_>>() {
            let vd = &state.vds[&vd_id];
            if (0..vd.members().len()).any(|i| matches!(vd.member(i).state(), MemberState::Failed | MemberState::Missing)) {
                self.take_over(&mut state, vd_id);
            }
        }
        Ok(found_generation)
    }
}

impl Controller {
    /// Drives recorded as missing that are present again. A member missed every write made
    /// while it was gone (the configuration recorded its absence first), so it comes back
    /// failed, to be rebuilt; a spare or an unconfigured drive simply returns.
    fn settle_returning_drives(&self, state: &mut State) {
        let returning: Vec<u32> = state
            .config
            .drives
            .iter()
            .filter(|d| d.state == DriveState::Missing && state.slots.contains_key(&d.slot))
            .map(|d| d.slot)
            .collect();
        for slot in returning {
            let (back_as, detail) = match member_of(state, slot) {
                Some((vd_id, _)) => {
                    (DriveState::Failed, Some(format!("missed the writes to v{vd_id} while missing; out of service until rebuilt")))
                }
                None if state.config.hot_spares.iter().any(|h| h.slot == slot) => (DriveState::HotSpare, None),
                None => (DriveState::UnconfiguredGood, None),
            };
            self.transition(state, slot, back_as, state::Cause::Returned, detail.as_deref());
        }
    }

    /// Members now smaller than their VD's recorded member size are not used: reading past
    /// their end would return nothing where the VD holds data. Recorded as failed.
    fn refuse_shrunken_members(&self, state: &mut State) {
        for record in state.config.vds.clone() {
            for slot in &record.member_slots {
                let Some(present) = state.slots.get(slot).filter(|s| !s.foreign) else { continue };
                let found_bytes = present.drive.info().capacity_bytes;
                if found_bytes >= record.member_size_bytes {
                    continue;
                }
                self.log(
                    Severity::Critical,
                    format!(
                        "slot {slot} ({}) of v{} has {found_bytes} bytes but v{} was laid out on {} bytes per member; the drive shrank and is not used",
                        present.source, record.vd_id, record.vd_id, record.member_size_bytes
                    ),
                );
                if state.config.drives.iter().any(|d| d.slot == *slot && d.state == DriveState::Online) {
                    self.transition(state, *slot, DriveState::Failed, state::Cause::Shrunk, Some(&format!("member of v{}", record.vd_id)));
                }
            }
        }
    }
}

impl Controller {
    /// Recorded drives that did not show up are missing, except a UBad drive, which stays UBad:
    /// found again as Msng it would come back UGood (see `state`).
    fn mark_missing(&self, state: &mut State) {
        let stays = |d: &DriveRecord| matches!(d.state, DriveState::Missing | DriveState::UnconfiguredBad);
        let absent: Vec<u32> =
            state.config.drives.iter().filter(|d| !stays(d) && !state.slots.contains_key(&d.slot)).map(|d| d.slot).collect();
        for slot in absent {
            self.transition(state, slot, DriveState::Missing, state::Cause::Absent, None);
        }
    }
}

/// "slot 3 Msng, slot 5 Failed": the members of a VD that are out of service.
fn out_of_service(state: &State, record: &VdRecord) -> String {
    let state_of = |slot: &u32| state.config.drives.iter().find(|d| d.slot == *slot).map_or(DriveState::Missing, |d| d.state);
    let list: Vec<String> = record
        .member_slots
        .iter()
        .filter(|slot| state_of(slot) != DriveState::Online)
        .map(|slot| format!("slot {slot} {}", state_of(slot).short_name()))
        .collect();
    list.join(", ")
}

fn add_foreign(foreign: &mut Vec<ForeignConfig>, superblock: Superblock, slot: u32) {
    match foreign.iter_mut().find(|f| f.superblock.controller_id == superblock.controller_id) {
        Some(existing) => {
            existing.slots.push(slot);
            if superblock.generation > existing.superblock.generation {
                existing.superblock = superblock;
            }
        }
        None => foreign.push(ForeignConfig { superblock, slots: vec![slot] }),
    }
}
