//! Row images at start: the journal's images written back to the members before its records
//! (the write hole's parity log; see `io::parity::row_log`), and what the bitmap must learn
//! when they cannot be.
//!
//! The bitmap leaves a region written only by logged row writes out of the resync, because the
//! journal's images make its rows whole. So when the images are not replayed (the trusted
//! journal is lost, or a VD could not take them), those regions need a resync like any other:
//! [`crate::bitmap::WriteIntent::images_lost`].

use super::resync::in_service_drives;
use super::{Controller, Severity};
use crate::bitmap::control;
use crate::config::VdRecord;
use crate::journal::ReplayImage;
use crate::metadata::submit_and_wait;
use crate::vd::{MemberFault, MemberState, VirtualDrive};
use drive::{DriveOp, IoBuf, OpKind};
use std::sync::Arc;

/// Writes `image`'s member writes as they are to the members in service of its VD (a member
/// out of service missed the row anyway, and is rebuilt or resynced whole). An image of a VD
/// that no longer exists is dropped.
///
/// # Errors
/// The image names a member or a range the VD does not have (then nothing of it is written).
/// A member that fails a write leaves service, as on any write.
pub(super) fn write_image(vds: &[(VdRecord, Arc<VirtualDrive>)], image: &ReplayImage) -> Result<(), String> {
    let Some((_, vd)) = vds.iter().find(|(record, _)| record.vd_id == image.vd_id) else { return Ok(()) };
    write_row_image(vd, image)
}

/// Writes `image`'s member writes to `vd`'s members in service (blocks: control plane, and
/// the simulator's restart).
///
/// # Errors
/// As [`write_image`].
pub fn write_row_image(vd: &VirtualDrive, image: &ReplayImage) -> Result<(), String> {
    let geometry = vd.geometry();
    let (start, end) = (geometry.data_offset_bytes(), geometry.member_used_bytes());
    for (member, offset_bytes, bytes) in &image.writes {
        let fits = (*member as usize) < vd.members().len()
            && *offset_bytes >= start
            && offset_bytes.checked_add(bytes.len() as u64).is_some_and(|stop| stop <= end);
        if !fits {
            return Err(format!(
                "row image of v{} row {} names member {member} bytes {offset_bytes}+{}, outside the VD's data area",
                image.vd_id,
                image.row,
                bytes.len()
            ));
        }
    }
    for (index, offset_bytes, bytes) in &image.writes {
        let member = vd.member(*index as usize);
        if !matches!(member.state(), MemberState::Online | MemberState::Rebuilding) {
            continue;
        }
        let op = DriveOp::Write { offset_bytes: *offset_bytes, buf: IoBuf::from_slice(bytes) };
        let epoch = vd.rebuild_epoch(*index as usize);
        if let Err(error) = submit_and_wait(&*member.drive(), op) {
            // As any write error does: the member leaves service, and the row is whole over
            // the others.
            tracing::warn!("{}: row image of row {} not written to member {index}: {error}", vd.name(), image.row);
            vd.member_error(&MemberFault { index: *index as usize, kind: OpKind::Write, error, epoch });
        }
        // A member being copied: its copy may have passed this row already (only rows of
        // unsynced regions are copied again), so the target takes the image too, as the tee
        // gives it every write of the member.
        if let Some(copy) = vd.copy_target(*index as usize).filter(|copy| !copy.has_failed()) {
            let op = DriveOp::Write { offset_bytes: *offset_bytes, buf: IoBuf::from_slice(bytes) };
            if let Err(error) = submit_and_wait(&**copy.target(), op) {
                vd.copy_target_error(*index as usize, &copy, OpKind::Write, &error);
            }
        }
    }
    Ok(())
}

impl Controller {
    /// After a start whose trusted journal was not replayed (`lost`: there was one), or that
    /// had none: the images of every VD are lost, or there were none to replay.
    pub(super) fn settle_images_of_all(&self, lost: bool) {
        let vds: Vec<u32> = if lost { self.vds().iter().map(|(record, _)| record.vd_id).collect() } else { Vec::new() };
        self.settle_images(&vds);
    }

    /// After replay: the VDs in `lost` did not get the images of the trusted journal (it is
    /// lost, or they could not take them); every other VD did. The regions their logged writes
    /// left dirty need a resync now, recorded in the bitmap before anything is served.
    pub(super) fn settle_images(&self, lost: &[u32]) {
        for (record, vd) in self.vds() {
            let Some(intent) = vd.write_intent() else { continue };
            if !lost.contains(&record.vd_id) {
                intent.images_replayed();
                continue;
            }
            let added = intent.images_lost();
            if added == 0 {
                continue;
            }
            self.log(
                Severity::Warning,
                format!("v{}: {added} regions written through the journal's row images need a resync, the images being lost", record.vd_id),
            );
            if let Err(error) = control::record_unsynced(intent, &in_service_drives(&vd)) {
                self.log(Severity::Warning, format!("v{} write-intent bitmap: {error}", record.vd_id));
            }
        }
    }
}
