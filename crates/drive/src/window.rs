//! A drive that is a window of another: offsets `0..len` of the window are
//! `offset..offset + len` of the drive under it. What lets one drive hold two things, as a
//! journal drive in a slot does: the controller's metadata in the drive's first MiBs, the
//! journal in the rest.

use crate::{check_op_range, Completion, Drive, DriveInfo, DriveOp, IoCtx, Token, SECTOR_BYTES};
use std::sync::Arc;

pub struct Window {
    inner: Arc<dyn Drive>,
    offset_bytes: u64,
    info: DriveInfo,
}

impl Window {
    /// The part of `inner` from `offset_bytes` to its end.
    ///
    /// # Errors
    /// When `offset_bytes` is not sector-aligned or leaves nothing of the drive.
    pub fn from_offset(inner: Arc<dyn Drive>, offset_bytes: u64) -> Result<Window, String> {
        let capacity_bytes = inner.info().capacity_bytes;
        if !offset_bytes.is_multiple_of(SECTOR_BYTES) || offset_bytes >= capacity_bytes {
            return Err(format!(
                "{}: a window from byte {offset_bytes} of {capacity_bytes} is empty or not aligned to {SECTOR_BYTES} bytes",
                inner.info().name
            ));
        }
        let info = DriveInfo { capacity_bytes: capacity_bytes - offset_bytes, ..inner.info().clone() };
        Ok(Window { inner, offset_bytes, info })
    }
}

impl Drive for Window {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        // Checked against the window, so that no operation reaches past it into the part of the
        // drive it does not own (or before it, by an offset that would wrap).
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.complete(Completion::of(token, Err(error), op));
        }
        let shifted = match op {
            DriveOp::Read { offset_bytes, buf } => DriveOp::Read { offset_bytes: offset_bytes + self.offset_bytes, buf },
            DriveOp::Write { offset_bytes, buf } => DriveOp::Write { offset_bytes: offset_bytes + self.offset_bytes, buf },
            DriveOp::ReadV { offset_bytes, bufs } => DriveOp::ReadV { offset_bytes: offset_bytes + self.offset_bytes, bufs },
            DriveOp::WriteV { offset_bytes, bufs } => DriveOp::WriteV { offset_bytes: offset_bytes + self.offset_bytes, bufs },
            DriveOp::Flush => DriveOp::Flush,
        };
        self.inner.submit(ctx, token, shifted);
    }

    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        offset_bytes.checked_add(len_bytes).is_some_and(|end| end <= self.info.capacity_bytes)
            && self.inner.reads_zero(offset_bytes + self.offset_bytes, len_bytes)
    }
}
