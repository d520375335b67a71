//! Bad blocks (`vd::bad_blocks`) in the controller: every change of a VD's list that the engine
//! reports is logged and written to the VD's record, so that it survives a restart; the row
//! jobs waiting for their losses to be on disk are then let go (or told it failed).
//!
//! The engine sends changes over a channel of their own, read by a thread of its own, so that a
//! row job waiting (under its row lock) for its loss to be written does not also wait behind the
//! recording of member failures and hot-spare takeovers.

use super::*;
use crate::config::BadBlock;
use crate::vd::{BadBlockChange, BadBlockEvent};

impl Controller {
    /// Logs each change, then writes every changed list in one metadata write.
    pub(super) fn bad_blocks_changed(&self, events: Vec<BadBlockEvent>) {
        let mut state = self.state.lock().expect("controller lock");
        let mut changed: Vec<Arc<VirtualDrive>> = Vec::new();
        for event in events {
            // Matched by instance: a VD deleted meanwhile, or another under its number, is not it.
            let Some(vd) = state.vds.values().find(|vd| vd.instance_id() == event.instance_id).cloned() else { continue };
            let Some(record) = state.config.vds.iter().find(|r| u64::from(r.vd_id) == event.vd_id) else { continue };
            if let Some((severity, message)) = describe(record, &event.change) {
                self.log(severity, message);
            }
            let refused = matches!(event.change, BadBlockChange::Refused { .. });
            if !refused && !changed.iter().any(|other| Arc::ptr_eq(other, &vd)) {
                changed.push(vd);
            }
        }
        let mut written = Vec::with_capacity(changed.len());
        for vd in changed {
            let (ranges, version) = vd.bad_blocks().snapshot();
            let record = state.config.vds.iter_mut().find(|r| u64::from(r.vd_id) == vd.id()).expect("a live VD has a record");
            let before = std::mem::replace(&mut record.bad_blocks, ranges);
            written.push((vd, version, before));
        }
        if written.is_empty() {
            return;
        }
        let outcome = self.persist(&mut state).map_err(|error| error.to_string());
        if outcome.is_err() {
            // Logged by `persist`. The record goes back to the list last written (a list that
            // does not fit must not block every later metadata change); the row jobs waiting
            // write nothing, so their rows keep what the older list says.
            for (vd, _, before) in &written {
                let record = state.config.vds.iter_mut().find(|r| u64::from(r.vd_id) == vd.id()).expect("a live VD has a record");
                record.bad_blocks = before.clone();
            }
        }
        drop(state);
        for (vd, version, _) in written {
            vd.bad_blocks().persisted(version, outcome.clone());
        }
    }

    /// The bad-block list of `vd_id` (`/c0/vN show badblocks`).
    ///
    /// # Errors
    /// No such VD, with the VDs there are.
    pub fn bad_blocks(&self, vd_id: u32) -> Result<Vec<BadBlock>, ControlError> {
        let (_, vd) = self.vd(vd_id)?;
        Ok(vd.bad_blocks().ranges())
    }
}

/// The event a change gets, if any.
fn describe(record: &VdRecord, change: &BadBlockChange) -> Option<(Severity, String)> {
    let vd_id = record.vd_id;
    let slots = record.member_slots.iter().enumerate().map(|(i, slot)| format!("{i}: slot {slot}")).collect::<Vec<_>>().join(", ");
    match change {
        BadBlockChange::Lost { ranges, cause } => Some((
            Severity::Critical,
            format!("v{vd_id}: data lost, recorded as bad block(s) {}: {cause} (members {slots}); reads of it fail until it is written", ranges_text(ranges)),
        )),
        BadBlockChange::Refused { ranges, cause, reason } => Some((
            Severity::Critical,
            format!("v{vd_id}: data lost at {} cannot be recorded: {reason}; the row is left as it was and its member being rebuilt stays Rbld ({cause}; members {slots})", ranges_text(ranges)),
        )),
        BadBlockChange::Rewritten { ranges } => {
            Some((Severity::Info, format!("v{vd_id}: bad block(s) {} written by a client: good again", ranges_text(ranges))))
        }
        BadBlockChange::Unsaved => None,
    }
}

/// `bytes 1048576..1052672 (LBA 2048, 8 sectors)`, comma-separated.
pub fn ranges_text(ranges: &[BadBlock]) -> String {
    let sector = layout::SECTOR_BYTES;
    let one = |r: &BadBlock| {
        format!(
            "bytes {}..{} (LBA {}, {} sectors)",
            r.offset_bytes,
            r.offset_bytes + r.len_bytes,
            r.offset_bytes / sector,
            r.len_bytes / sector
        )
    };
    ranges.iter().map(one).collect::<Vec<_>>().join(", ")
}

pub(super) fn watch_bad_blocks(controller: std::sync::Weak<Controller>, events: crossbeam_channel::Receiver<BadBlockEvent>) {
    while let Ok(first) = events.recv() {
        // Everything queued meanwhile goes out in the same metadata write.
        let batch: Vec<BadBlockEvent> = std::iter::once(first).chain(events.try_iter()).collect();
        let Some(controller) = controller.upgrade() else { return };
        controller.bad_blocks_changed(batch);
    }
}
