//! Where a blank drive goes at assembly: a slot is a bay.
//!
//! Drives are offered in a fixed order (the daemon's `--drive` list, or `drive-N.img`), and on a
//! first start drive N takes slot N. A drive we know keeps its slot wherever it is offered (its
//! id is in its metadata). A *blank* drive offered at position N is a new drive put in bay N: it
//! takes slot N when that slot is free, or when the drive recorded there did not come back and
//! left nothing behind (it is in no VD and no spare: UGood, UBad, or missing), as a new disk
//! takes the bay of the one pulled out of a hardware controller. That is what lets a copyback
//! find "the slot a spare replaced holds a good drive again" after a disk file is replaced.
//! Otherwise it takes the lowest free slot.
//!
//! Positions shift when a drive before it cannot be opened at all; then a blank drive may take
//! another bay's slot, which costs nothing but the slot number it shows.

use super::*;

impl Controller {
    /// The slot for a blank drive offered at position `index` (see the module docs); forgets
    /// the absent drive whose place it takes, with an event.
    pub(super) fn blank_drive_slot(&self, state: &mut State, index: usize) -> u32 {
        let bay = u32::try_from(index).unwrap_or(u32::MAX);
        if !state.slots.contains_key(&bay) && bay_is_free(state, bay) {
            if let Some(old) = state.config.drives.iter().find(|d| d.slot == bay).cloned() {
                state.config.drives.retain(|d| d.slot != bay);
                let (id, state_name) = (old.drive_id.0, old.state.short_name());
                self.log(
                    Severity::Info,
                    format!("slot {bay}: a blank drive takes the place of drive {id:032x} ({state_name}), which did not come back"),
                );
            }
            return bay;
        }
        lowest_free_slot(state)
    }
}

/// Whether a blank drive may take slot `bay`, whose drive is not present: nothing is recorded
/// there, or the drive recorded there is in no VD and no spare.
fn bay_is_free(state: &State, bay: u32) -> bool {
    let Some(record) = state.config.drives.iter().find(|d| d.slot == bay) else { return true };
    let spare = state.config.hot_spares.iter().any(|h| h.slot == bay);
    let left_nothing = matches!(record.state, DriveState::UnconfiguredGood | DriveState::UnconfiguredBad | DriveState::Missing);
    left_nothing && !spare && member_of(state, bay).is_none()
}

/// The lowest slot with neither a drive present nor a record: where a drive with no bay of its
/// own goes (a foreign drive, a blank one whose bay is taken, one added at run time).
pub(super) fn lowest_free_slot(state: &State) -> u32 {
    (0..).find(|s| !state.slots.contains_key(s) && state.config.drives.iter().all(|d| d.slot != *s)).expect("a free slot")
}
