//! The VD's write-intent bitmap in the simulator: opened at creation and at every restart as the
//! controller does, cleared by clean passes amid the workload, and the one judge of which
//! refusals (`VdError::RowNotResynced`) are correct.
//!
//! The bitmap lives in the members' reserved area, on the same volatile drives as the data, so a
//! power cut drops, keeps or tears its unflushed writes too: a bit counts only once flushed.

use crate::run::Sim;
use engine::bitmap::control::{self, Identity, Opening};
use engine::bitmap::RegionMap;
use engine::{MemberState, VdError, VirtualDrive};
use layout::SpanKind;
use rand::Rng;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// A clean pass in flight: its outcome once it arrived.
pub(crate) type CleanOutcome = Rc<RefCell<Option<Result<(), VdError>>>>;

/// Which VD the bitmap belongs to: the same at creation and at every restart.
pub(crate) fn identity(seed: u64) -> Identity {
    Identity { controller_id: u128::from(seed) | 1 << 100, vd_id: 1 }
}

/// The members in service, whose bitmap areas count and receive the bits (as the controller's).
pub(crate) fn in_service_drives(vd: &VirtualDrive) -> Vec<Arc<dyn drive::Drive>> {
    vd.members().iter().filter(|m| matches!(m.state(), MemberState::Online | MemberState::Rebuilding)).map(|m| m.drive()).collect()
}

/// What opening the bitmap found.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenedBitmap {
    /// The VD was not stopped cleanly (a crash always is).
    pub unclean: bool,
    /// Regions some member in service had marked dirty.
    pub dirty_region_count: u64,
}

/// Opens the bitmap of `vd` over its members in service (as `opening` says) and gives it to the
/// VD; `None` for a level without redundancy, which has no bitmap.
pub(crate) fn open(vd: &VirtualDrive, seed: u64, rows_per_region: u64, opening: Opening) -> Option<OpenedBitmap> {
    if vd.geometry().span_kind() == SpanKind::Stripe {
        return None;
    }
    let regions = RegionMap::with_rows_per_region(vd.geometry(), rows_per_region);
    let opened = control::open(identity(seed), regions, &in_service_drives(vd), opening);
    let summary = OpenedBitmap { unclean: opened.unclean, dirty_region_count: opened.dirty_region_count };
    vd.set_write_intent(opened.intent);
    Some(summary)
}

impl Sim {
    /// Sometimes starts a clean pass (one at a time), as the controller's daemon does every few
    /// seconds; settles the one in flight if it ended.
    pub(crate) fn clean_some(&mut self) -> Result<(), String> {
        if let Some(outcome) = &self.clean {
            let arrived = outcome.borrow_mut().take();
            match arrived {
                None => return Ok(()),
                Some(Ok(())) => self.clean_passes += 1,
                // Only a member failing under it can fail a pass, and only with faults injected.
                Some(Err(_)) if !self.faults.is_empty() => {}
                Some(Err(error)) => return Err(format!("clean pass of the bitmap failed without faults: {error}")),
            }
            self.clean = None;
        }
        if self.vd.write_intent().is_none() || self.rng.gen_range(0..1000) >= self.config.clean_per_mille {
            return Ok(());
        }
        let outcome: CleanOutcome = Rc::new(RefCell::new(None));
        let out = Rc::clone(&outcome);
        self.engine.clean_write_intent(&self.vd, false, move |result| *out.borrow_mut() = Some(result));
        self.clean = Some(outcome);
        Ok(())
    }

    /// Whether `row`'s region awaits a resync the restart could not do.
    pub(crate) fn row_unsynced(&self, row: u64) -> bool {
        self.vd.write_intent().is_some_and(|intent| intent.row_unsynced(row))
    }

    /// Whether a refusal to read `row` is correct: its region awaits a resync, the level has
    /// parity, and the read needed the parity because a member of the row (one of
    /// `strip_members`, the members of the data read, when known) is out of service or has
    /// injected faults. Mirror levels read copy 0 and never refuse.
    pub(crate) fn refusal_is_correct(&self, row: u64, strip_members: Option<&[usize]>) -> bool {
        let parity = matches!(self.vd.geometry().span_kind(), SpanKind::Parity | SpanKind::DoubleParity);
        let map = self.vd.geometry().row_map(row);
        let row_members: Vec<usize> = map.members().map(|(place, _, _)| place.drive).collect();
        let needs_parity = |m: &usize| self.at_risk[*m] || self.vd.member(*m).state() != MemberState::Online;
        let lacking = match strip_members {
            Some(members) => members.iter().any(needs_parity),
            None => row_members.iter().any(needs_parity),
        };
        parity && self.row_unsynced(row) && lacking
    }
}
