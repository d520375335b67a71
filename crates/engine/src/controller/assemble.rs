//! Assembly at start: which configuration to run and how each drive fits into it.

use super::*;

impl Controller {
    pub(super) fn assemble(
        &self,
        offered: Vec<OfferedDrive>,
        found: Vec<(usize, Superblock)>,
        assembly: metadata::Assembly,
    ) -> Result<(), ControlError> {
        let mut state = self.state.lock().expect("controller lock");
        let superblock_of = |index: usize| found.iter().find(|(i, _)| *i == index).map(|(_, sb)| sb.clone());
        if let Some(ours) = &assembly.ours {
            state.config = ours.config.clone();
        }
        let ours_id = state.config.controller_id;
        let mut offered: Vec<Option<OfferedDrive>> = offered.into_iter().map(Some).collect();
        // Our drives keep their recorded slots.
        for index in 0..offered.len() {
            let Some(sb) = superblock_of(index) else { continue };
            if sb.controller_id != ours_id || state.config.drives.iter().all(|d| d.drive_id != sb.drive_id) {
                continue;
            }
            let offer = offered[index].take().expect("each drive once");
            let slot = state.config.drives.iter().find(|d| d.drive_id == sb.drive_id).expect("checked").slot;
            if sb.generation < state.config.generation {
                self.log(
                    Severity::Warning,
                    format!(
                        "drive at slot {slot} ({}) has configuration generation {} older than {}; it is out of date",
                        offer.source, sb.generation, state.config.generation
                    ),
                );
                mark_out_of_date(&mut state.config, slot);
            }
            state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: false });
        }
        // Foreign drives and blank drives take the lowest free slots.
        for (index, offer) in offered.into_iter().enumerate() {
            let Some(offer) = offer else { continue };
            let slot =
                (0..).find(|s| !state.slots.contains_key(s) && state.config.drives.iter().all(|d| d.slot != *s)).expect("a free slot");
            // A drive that carries our id but left our configuration is blank to us.
            match superblock_of(index).filter(|sb| sb.controller_id != ours_id) {
                Some(sb) => {
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id: sb.drive_id, foreign: true });
                    add_foreign(&mut state.foreign, sb, slot);
                }
                None => {
                    let drive_id = DriveId(random_id());
                    let capacity_bytes = offer.drive.info().capacity_bytes;
                    state.config.drives.push(DriveRecord { slot, drive_id, state: DriveState::UnconfiguredGood, capacity_bytes });
                    state.slots.insert(slot, Slot { drive: offer.drive, source: offer.source, drive_id, foreign: false });
                }
            }
        }
        mark_missing(&mut state);
        for record in state.config.vds.clone() {
            let vd = self.build_vd(&state, &record)?;
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
        Ok(())
    }
}

fn mark_out_of_date(config: &mut ControllerConfig, slot: u32) {
    let is_member = config.vds.iter().any(|v| v.member_slots.contains(&slot));
    if is_member {
        set_drive_state(config, slot, DriveState::Failed);
    }
}

/// Recorded drives that did not show up are missing.
fn mark_missing(state: &mut State) {
    let absent: Vec<u32> = state.config.drives.iter().map(|d| d.slot).filter(|s| !state.slots.contains_key(s)).collect();
    for slot in absent {
        set_drive_state(&mut state.config, slot, DriveState::Missing);
    }
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
