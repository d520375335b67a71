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

use super::{background_in_the_way, in_place, place, policies_or_members, submit_in_place, submit_on_shard, Owner};
use crate::runtime::Reactor;
use crate::vd::{MemberState, VdCompletion};
use crate::{Done, Engine, ShardMsg, VdRequest, VirtualDrive};
use drive::{DriveError, DriveOp, IoBuf};
use layout::SpanKind;
use std::rc::Rc;
use std::sync::Arc;

/// A write on its way to one member (see the module docs).
pub(crate) struct FastWrite {
    pub(crate) vd: Arc<VirtualDrive>,
    member: usize,
    drive_offset_bytes: u64,
    offset_bytes: u64,
    /// The client's data: here until the write goes to the member (`None` while it is there).
    buf: Option<IoBuf>,
    done: Done,
    /// The shard that owns the row, for the fallback.
    owner: usize,
}

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

impl Engine {
    /// Sends a qualifying write down the Fast Path; hands the buffer and callback back otherwise.
    pub(crate) fn fast_write(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, done: Done) -> Result<(), (IoBuf, Done)> {
        if policies_or_members(vd).is_some() || write_blockers(vd, self.journal_attached()).is_some() {
            return Err((buf, done));
        }
        let placed = place(vd, offset_bytes, buf.len() as u64).filter(|&(_, member, _)| vd.member(member).is_fast_drive());
        let placed = placed.filter(|_| background_in_the_way(vd).is_none());
        let Some((row, member, drive_offset_bytes)) = placed.filter(|_| vd.begin_fast_write()) else {
            return Err((buf, done));
        };
        let owner = self.shard_of_row(vd, row);
        vd.begin_request();
        let write = FastWrite { vd: Arc::clone(vd), member, drive_offset_bytes, offset_bytes, buf: Some(buf), done, owner };
        match self.shards.iter().find(|s| s.is_current()) {
            Some(own) => own.send(ShardMsg::FastWrite(Box::new(write))),
            None if in_place(&*vd.member(member).drive()) => serve_in_place(write, Owner::Link(&self.shards[owner].link)),
            None => self.shards[owner].send(ShardMsg::FastWrite(Box::new(write))),
        }
        Ok(())
    }
}

/// Serves a Fast Path write on the submitting thread, which is no shard.
fn serve_in_place(mut write: FastWrite, owner: Owner) {
    let buf = write.buf.take().expect("the data is with the write");
    let completion = submit_in_place(&write.vd, write.member, DriveOp::Write { offset_bytes: write.drive_offset_bytes, buf });
    complete(write, completion.result, completion.buf.expect("a write returns its buffer"), &owner);
}

/// Serves a Fast Path write on the shard it was sent to.
pub(crate) async fn serve(reactor: Rc<Reactor>, mut write: FastWrite) {
    let owner = Owner::Index(write.owner);
    let buf = write.buf.take().expect("the data is with the write");
    let op = DriveOp::Write { offset_bytes: write.drive_offset_bytes, buf };
    let finished = submit_on_shard(&reactor, &write.vd, write.member, op).await;
    complete(write, finished.result, finished.buf.expect("a write returns its buffer"), &owner);
}

/// Acknowledges a write its member took, or has the normal path write it again (see the
/// module docs).
fn complete(write: FastWrite, result: Result<(), DriveError>, buf: IoBuf, owner: &Owner) {
    let FastWrite { vd, member, drive_offset_bytes, offset_bytes, done, .. } = write;
    vd.end_fast_write();
    vd.note_member_io(member, drive_offset_bytes, buf.len() as u64, false);
    let unsettled = vd.member(member).state() != MemberState::Online || !vd.bad_blocks().is_empty();
    if result.is_err() || unsettled {
        return super::fall_back(owner, vd, VdRequest::Write { offset_bytes, buf }, done);
    }
    vd.count_fast_path_write();
    vd.finish(VdCompletion { result: Ok(()), buf: Some(buf) }, done, true);
}
