//! A slot's drive as the journal (`/c0/sN set journal`), as a controller's battery-backed
//! cache module sits in the controller rather than beside it: the drive keeps the controller's
//! metadata in its reserved first MiBs like every other drive, and the journal lives past them
//! (a [`drive::Window`]). Its state is `Jrnl` (the drive state machine in `state`), so the
//! configuration on every drive says where the journal is, and the next start finds it without
//! a `--journal` option.
//!
//! A journal drive joins the journal there is: none or a failed one gives a journal of one leg;
//! one leg in service (a single journal, or a pair that lost a leg) gives a mirrored pair of
//! that leg and the new drive. Either way the journal is laid out anew: the cache is written to
//! the members and the old journal untrusted first, as `set journal=` does. A leg that fails
//! makes its drive UBad; a journal drive that another journal replaces, or whose journal is
//! removed (`/c0/journal delete`), is UGood again.

use super::{state, ControlError, Controller, JournalOffer, JournalView, Severity, State};
use crate::config::DriveState;
use crate::journal::format::LEGS_MAX;
use crate::vd::MEMBER_RESERVED_BYTES;
use drive::{Drive, Window};
use std::sync::Arc;

/// Where the journal starts on a slot's drive: past the controller's reserved area (metadata
/// copies and write-intent bitmap area), which the drive keeps as any drive does.
pub const JOURNAL_DRIVE_OFFSET_BYTES: u64 = MEMBER_RESERVED_BYTES;

impl Controller {
    /// `/c0/sN set journal`: the drive in `slot` holds the journal from now on, alone or as
    /// the second leg of a mirrored pair (see the module docs).
    ///
    /// # Errors
    /// No such slot; the drive is not UGood or not present; the journal is a mirrored pair in
    /// full service already; the drive is too small for a journal; metadata cannot be written.
    pub fn assign_journal_drive(&self, slot: u32) -> Result<JournalView, ControlError> {
        let drive = self.drive_for_journal(slot)?;
        let mut offers = self.legs_in_service();
        if offers.len() >= LEGS_MAX {
            let source = offers.iter().map(|offer| offer.source.as_str()).collect::<Vec<_>>().join(" + ");
            return Err(ControlError::Conflict(format!(
                "the journal is a mirrored pair in full service already ({source}); a journal has at most {LEGS_MAX} legs"
            )));
        }
        offers.push(journal_offer(slot, drive).map_err(ControlError::BadInput)?);
        let transition = {
            let mut state = self.state.lock().expect("controller lock");
            let transition = self.transition(&mut state, slot, DriveState::Journal, state::Cause::JournalAssigned, None);
            if let Err(error) = self.persist(&mut state) {
                self.undo_transition(&mut state, &transition);
                return Err(error);
            }
            transition
        };
        self.replace_journal(offers).inspect_err(|_| {
            // Nothing holds the journal on it: it is the unconfigured drive it was.
            let mut state = self.state.lock().expect("controller lock");
            self.undo_transition(&mut state, &transition);
            let _ = self.persist(&mut state);
        })
    }

    /// The drive in `slot`, if it may become a journal drive.
    fn drive_for_journal(&self, slot: u32) -> Result<Arc<dyn Drive>, ControlError> {
        let state = self.state.lock().expect("controller lock");
        let Some(record) = state.config.drives.iter().find(|d| d.slot == slot) else {
            drop(state);
            return Err(self.no_slot(slot));
        };
        if state::check(record.state, DriveState::Journal, state::Cause::JournalAssigned).is_err() {
            return Err(ControlError::Conflict(format!(
                "slot {slot} is {}; only an unconfigured good (UGood) drive can hold the journal",
                record.state.short_name()
            )));
        }
        let present = state.slots.get(&slot).filter(|present| !present.foreign);
        present.map(|present| Arc::clone(&present.drive)).ok_or_else(|| ControlError::Conflict(format!("slot {slot} has no drive present")))
    }

    /// At start: the journal's legs on slot drives (state `Jrnl`), then those the daemon was
    /// given (`--journal`), at most [`LEGS_MAX`] in all: the configuration's own journal comes
    /// first, and what does not fit is left out with a warning.
    pub(super) fn journal_offers_at_start(&self, given: Vec<JournalOffer>) -> Vec<JournalOffer> {
        let mut offers = Vec::new();
        {
            let state = self.state.lock().expect("controller lock");
            for (slot, drive) in journal_drives_present(&state) {
                match journal_offer(slot, drive) {
                    Ok(offer) => offers.push(offer),
                    Err(error) => self.log(Severity::Critical, format!("slot {slot} holds the journal but cannot be used: {error}")),
                }
            }
        }
        offers.extend(given);
        if offers.len() > LEGS_MAX {
            let left_out: Vec<String> = offers.drain(LEGS_MAX..).map(|offer| offer.source).collect();
            self.log(
                Severity::Warning,
                format!("a journal has at most {LEGS_MAX} legs: {} left out (the journal drives in slots come first)", left_out.join(", ")),
            );
        }
        offers
    }

    /// Journal drives whose leg left service: UBad (a failed drive in no VD), recorded once.
    pub(super) fn fail_journal_drives(&self, out: &[(u32, String)]) {
        if out.is_empty() {
            return;
        }
        let mut state = self.state.lock().expect("controller lock");
        let mut changed = false;
        for (slot, why) in out {
            if state.config.drives.iter().any(|d| d.slot == *slot && d.state == DriveState::Journal) {
                self.transition(&mut state, *slot, DriveState::UnconfiguredBad, state::Cause::IoFailure, Some(why));
                changed = true;
            }
        }
        if changed {
            if let Err(error) = self.persist(&mut state) {
                drop(state);
                self.log(Severity::Critical, format!("a failed journal drive cannot be recorded: {error}"));
            }
        }
    }

    /// After a new journal is attached, or the journal removed: the journal drives not in use
    /// (`kept` are those the new journal uses) are unconfigured good again.
    pub(super) fn free_journal_drives(&self, kept: &[u32], cause: state::Cause) {
        let mut state = self.state.lock().expect("controller lock");
        let freed: Vec<u32> =
            state.config.drives.iter().filter(|d| d.state == DriveState::Journal && !kept.contains(&d.slot)).map(|d| d.slot).collect();
        if freed.is_empty() {
            return;
        }
        for slot in freed {
            self.transition(&mut state, slot, DriveState::UnconfiguredGood, cause, None);
        }
        if let Err(error) = self.persist(&mut state) {
            drop(state);
            self.log(Severity::Critical, format!("journal drives no longer in use cannot be recorded as free: {error}"));
        }
    }
}

/// The present drives in state `Jrnl`, by slot.
fn journal_drives_present(state: &State) -> Vec<(u32, Arc<dyn Drive>)> {
    let journal_slots = state.config.drives.iter().filter(|d| d.state == DriveState::Journal).map(|d| d.slot);
    journal_slots
        .filter_map(|slot| state.slots.get(&slot).filter(|present| !present.foreign).map(|present| (slot, Arc::clone(&present.drive))))
        .collect()
}

/// The journal's leg on the drive in `slot`: the part of it past its reserved area.
fn journal_offer(slot: u32, drive: Arc<dyn Drive>) -> Result<JournalOffer, String> {
    let window = Window::from_offset(drive, JOURNAL_DRIVE_OFFSET_BYTES)
        .map_err(|_| format!("slot {slot} is too small to hold a journal past its {JOURNAL_DRIVE_OFFSET_BYTES}-byte reserved area"))?;
    Ok(JournalOffer { drive: Arc::new(window), source: format!("slot {slot}"), path: None, slot: Some(slot) })
}
