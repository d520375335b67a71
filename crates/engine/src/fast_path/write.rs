//! Fast Path writes, as MegaRAID's FastPath does them: on RAID0 and JBOD only, a write within
//! one strip goes from the submitting thread straight to its member, with no hop to the row's
//! owner, no row lock and no pass through the cache.
//!
//! On these levels a write has nothing to keep in step: no parity, no copy, no write-intent
//! bit. What else a write of the normal path respects is ruled out before one goes, beyond the
//! read rules (WT, NORA, Direct, every member online and fast, no dirty data, no copy, no bad
//! blocks, no replay):
//! - **no journal on the controller**: with one, even a write-through write is recorded, so
//!   that a replay after a crash cannot put an older record over it;
//! - **no clean data of the VD in any cache**: a shard's clean lines are its own, and only the
//!   normal path on that shard invalidates them. A fill of the clean cache turns Fast Path
//!   writes off for the rest of the VD's life in this process (`vd::fast_writes`).
//!
//! A copy of a member starting meanwhile, and a fill racing a write, are settled by the
//! announcement protocol in `vd::fast_writes`. A write that fails, or that completes while a
//! member left service or a bad block was recorded, is written again by the normal path
//! before the client hears of it, which books the failure or clears the block: the client
//! has no acknowledgement yet, so no later write of its can be overtaken.

use super::{FastIo, Owner};
use crate::vd::{MemberState, VdCompletion};
use crate::VirtualDrive;
use drive::{DriveError, IoBuf};
use layout::SpanKind;

/// Why the VD's writes do not take the Fast Path even where its reads do, or `None`.
pub(crate) fn write_blockers(vd: &VirtualDrive, journal_attached: bool) -> Option<&'static str> {
    if vd.geometry().span_kind() != SpanKind::Stripe || vd.write_intent().is_some() {
        return Some("writes: RAID0 and JBOD only");
    }
    if journal_attached {
        return Some("writes: the controller has a journal");
    }
    if vd.clean_cache_used() {
        return Some("writes: the cache has held clean data of it (until the controller restarts)");
    }
    None
}

/// Acknowledges a write its member took, or has the normal path write it again (see the
/// module docs).
pub(super) fn complete(write: FastIo, result: Result<(), DriveError>, buf: IoBuf, owner: &Owner) {
    let FastIo { vd, member, drive_offset_bytes, offset_bytes, done, row, .. } = write;
    vd.end_fast_write();
    vd.note_member_io(member, drive_offset_bytes, buf.len() as u64, false);
    let unsettled = vd.member(member).state() != MemberState::Online || !vd.bad_blocks().is_empty();
    if result.is_err() || unsettled {
        return super::fall_back(owner, row, vd, super::normal_request(true, offset_bytes, buf), done);
    }
    vd.count_fast_path_write();
    vd.finish(VdCompletion { result: Ok(()), buf: Some(buf) }, done, true);
}
