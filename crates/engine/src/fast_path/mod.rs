//! The Fast Path (seed 003; MegaRAID's FastPath): a read that one member can serve whole goes
//! straight to that member from the shard that submitted it, with no hop to the shard that owns
//! the row, no row lock and no cache lookup.
//!
//! It is taken only where nothing else could answer differently: the VD's policies are WT,
//! NORA and Direct (nothing of it in the cache, no read-ahead to start), the caches hold no
//! dirty data of it (left from a WB policy before), every member is online and on an SSD or in
//! memory (for a hard disk the hop costs nothing next to a seek), no member is being copied, and
//! no block of it is known to be bad. A read that fits in one strip then has one place to come
//! from (or two on a mirror, picked as the row path picks them); on JBOD a read of any size
//! does. The member state and the bad blocks are looked at again on the serving shard just
//! before the read goes, and a read that fails, or finds a bad block recorded meanwhile, is
//! sent to the owning shard's normal path, which books the error, reconstructs or tries the
//! other copy. Writes take it on RAID0 and JBOD only, under more rules ([`write`]): on other
//! levels a write's order against others of its row and its bitmap bits need the owning shard.
//!
//! Without the Fast Path, a read submitted on shard A for a row of shard B costs two thread
//! wake-ups (A to B, B back to A's completion): at queue depth 1 that is most of its latency.
//! A read submitted on a shard is served on that shard (through its own queue, see
//! [`crate::shard`]); one submitted elsewhere is read in place (memory and file members), or
//! goes to the shard that serves that thread's Fast Path requests for the VD
//! ([`Engine::submitter_shard`]). Only a request that falls back goes to the row's owner.

use crate::config::{IoPolicy, ReadPolicy, WritePolicy};
use crate::io::mirror::choose_copy;
use crate::runtime::Reactor;
use crate::vd::{MemberSet, MemberState, VdCompletion};
use crate::{Done, Engine, ShardMsg, VdRequest, VirtualDrive};
use drive::{DriveKind, DriveOp, IoBuf, IoCtx};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod hits;
mod write;

impl Engine {
    /// Why the VD's writes do not take the Fast Path now, or `None` when they do (`vall show`).
    pub fn fast_path_writes_ineligible(&self, vd: &VirtualDrive) -> Option<&'static str> {
        ineligible(vd).or_else(|| write::write_blockers(vd, self.journal_attached()))
    }
}

/// Why a VD's reads do not take the Fast Path now, or `None` when they do (`vall show`).
pub fn ineligible(vd: &VirtualDrive) -> Option<&'static str> {
    if vd.members().iter().any(|m| !m.is_fast_drive()) {
        return Some("a member is a hard disk");
    }
    policies_or_members(vd).or_else(|| background_in_the_way(vd))
}

/// The policies and the members' states: what a request looks at first, atomics only.
fn policies_or_members(vd: &VirtualDrive) -> Option<&'static str> {
    let policies = vd.policies();
    if policies.write() != WritePolicy::WriteThrough || policies.read() != ReadPolicy::NoReadAhead || policies.io() != IoPolicy::Direct {
        return Some("needs WT, NORA and Direct");
    }
    if !vd.unavailable().is_empty() {
        return Some("a member is not online");
    }
    None
}

/// Work that could answer a read differently, or should have the members to itself.
fn background_in_the_way(vd: &VirtualDrive) -> Option<&'static str> {
    if vd.cache_dirty_bytes() > 0 {
        return Some("the cache holds dirty data of it");
    }
    if vd.members().iter().any(|m| m.is_copying()) {
        return Some("a member is being copied");
    }
    if !vd.bad_blocks().is_empty() {
        return Some("it has bad blocks");
    }
    if vd.is_replaying() {
        return Some("the journal is being replayed into it");
    }
    None
}

/// The member and drive offset that serve a request of `len_bytes` at `offset_bytes` alone,
/// with the (first) row it lies in; `None` if it spans strips. On JBOD every byte of the VD
/// lies at the same place on its one drive: a request of any size is one member operation, as
/// behind a host bus adapter.
fn place(vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64) -> Option<(u64, usize, u64)> {
    let geometry = vd.geometry();
    // An empty request has no place (and may sit at the very end); the normal path answers it.
    if len_bytes == 0 {
        return None;
    }
    if geometry.level() == layout::Level::Jbod {
        let (row, drive_offset_bytes) = geometry.jbod_place(offset_bytes);
        return Some((row, 0, drive_offset_bytes));
    }
    let mut rows = geometry.rows(offset_bytes, len_bytes);
    let row = rows.next()?;
    if rows.next().is_some() {
        return None;
    }
    let map = geometry.row_map(row.row);
    let mut pieces = map.data_pieces(row.offset_in_row_bytes, row.len_bytes);
    let piece = pieces.next()?;
    if pieces.next().is_some() {
        return None;
    }
    // One row, one piece: the piece is the whole request, so one member operation serves it.
    assert_eq!(piece.len_bytes, len_bytes, "a request in one strip is one piece");
    // Every member is online (checked before): each copy can be read.
    let (member, drive_offset_bytes) = choose_copy(vd, &map, &piece, MemberSet::default())?;
    Some((row.row, member, drive_offset_bytes))
}

/// A read or a write on its way to one member: what the serving thread needs, and where it
/// goes if the Fast Path cannot finish it.
pub(crate) struct FastIo {
    pub(crate) vd: Arc<VirtualDrive>,
    write: bool,
    member: usize,
    drive_offset_bytes: u64,
    offset_bytes: u64,
    /// The client's buffer: here until the request goes to the member (`None` while it is there).
    buf: Option<IoBuf>,
    done: Done,
    /// The (first) row it lies in: its owner serves the request if the Fast Path cannot. The
    /// owner is worked out only then, which saves the divisions on every request.
    row: u64,
}

impl FastIo {
    /// The member operation, with the client's buffer.
    fn take_op(&mut self) -> DriveOp {
        let (offset_bytes, buf) = (self.drive_offset_bytes, self.buf.take().expect("the buffer is with the request"));
        let op = match self.write {
            true => DriveOp::Write { offset_bytes, buf },
            false => DriveOp::Read { offset_bytes, buf },
        };
        // No row lock or hop checks it later: a placement past the strip or the area is caught here.
        self.vd.assert_in_data_area(self.member, &op);
        op
    }
}

/// The request as the normal path takes it.
fn normal_request(write: bool, offset_bytes: u64, buf: IoBuf) -> VdRequest {
    match write {
        true => VdRequest::Write { offset_bytes, buf },
        false => VdRequest::Read { offset_bytes, buf },
    }
}

impl Engine {
    /// Sends a qualifying read or write down the Fast Path; hands the buffer and callback back
    /// otherwise.
    pub(crate) fn fast_io(
        &self,
        vd: &Arc<VirtualDrive>,
        write: bool,
        offset_bytes: u64,
        buf: IoBuf,
        done: Done,
    ) -> Result<(), (IoBuf, Done)> {
        let blocked = policies_or_members(vd).is_some() || (write && write::write_blockers(vd, self.journal_attached()).is_some());
        if blocked {
            return Err((buf, done));
        }
        // The member's kind before the checks that take a lock per member: a VD of hard disks
        // (the usual one that does not qualify) stops here.
        let placed = place(vd, offset_bytes, buf.len() as u64).filter(|&(_, member, _)| vd.member(member).is_fast_drive());
        let placed = placed.filter(|_| background_in_the_way(vd).is_none());
        // A write announces itself (`vd::fast_writes`), and is refused while a copy runs.
        let Some((row, member, drive_offset_bytes)) = placed.filter(|_| !write || vd.begin_fast_write()) else {
            return Err((buf, done));
        };
        // The request was counted in flight on entry (`Engine::submit`); the count goes with it.
        let io = FastIo { vd: Arc::clone(vd), write, member, drive_offset_bytes, offset_bytes, buf: Some(buf), done, row };
        if self.shards.iter().any(|s| s.is_current()) {
            // Served here: no hop.
            crate::shard::send_own_fast(io);
        } else if in_place(&*vd.member(member).drive()) {
            serve_in_place(io, Owner::Engine(self));
        } else {
            self.shards[self.submitter_shard(vd)].send(ShardMsg::Fast(Box::new(io)));
        }
        Ok(())
    }

    /// The shard that serves the Fast Path requests that this thread, which is no shard,
    /// submits for `vd`: the same one each time, as blk-mq maps a CPU to one hardware queue.
    /// The VD's counters and its member's lock then stay in one core's cache, and so does the
    /// client's own state, since its next request is submitted from the completion of the one
    /// before, on that shard. Sent to each row's owner instead, one client's requests to a VD
    /// were served on every shard, and those lines moved between the cores with each request:
    /// on bench/hba's 16 JBOD SSDs that cost a quarter of the IOPS (0.74 of the raw drives
    /// against about 1.0). Threads and VDs spread over the shards: the thread's number is
    /// added to the VD's id.
    fn submitter_shard(&self, vd: &VirtualDrive) -> usize {
        let submitter = SUBMITTER.with(|number| *number);
        submitter.wrapping_add(vd.id() as usize) % self.shards.len()
    }
}

/// The numbers [`SUBMITTER`] hands out.
static NEXT_SUBMITTER: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number, taken when it first submits a Fast Path request off a shard.
    static SUBMITTER: usize = NEXT_SUBMITTER.fetch_add(1, Ordering::Relaxed);
}

/// Memory and file members complete an operation on any thread, without a ring (a copy, a
/// pread or pwrite): a thread that is not a shard (an NBD connection's) does it itself instead
/// of waking a shard and being woken back.
fn in_place(drive: &dyn drive::Drive) -> bool {
    matches!(drive.info().kind, DriveKind::Memory | DriveKind::File)
}

thread_local! {
    /// The ring-less context a non-shard thread serves members in place with.
    static IN_PLACE: RefCell<Option<IoCtx>> = const { RefCell::new(None) };
}

/// Runs `op` on member `member` of `vd` on this thread, which is no shard (see [`in_place`]),
/// counted in the member's outstanding operations.
fn submit_in_place(vd: &VirtualDrive, member: usize, op: DriveOp) -> drive::Completion {
    vd.member_io_started(member);
    let completion = IN_PLACE.with(|ctx| {
        let mut ctx = ctx.borrow_mut();
        let ctx = ctx.get_or_insert_with(IoCtx::without_ring);
        vd.member(member).with_drive(|drive| drive.submit(ctx, 0, op));
        let mut out = Vec::new();
        ctx.poll(&mut out, false);
        // A drive that delays its completions (fault injection) releases them when due.
        while out.is_empty() {
            std::thread::sleep(std::time::Duration::from_micros(50));
            ctx.poll(&mut out, false);
        }
        out.pop().expect("one operation, one completion")
    });
    vd.member_io_ended(member);
    completion
}

/// Serves a Fast Path request on the submitting thread, which is no shard (see [`in_place`]).
fn serve_in_place(mut io: FastIo, owner: Owner) {
    if placement_changed(&io) {
        return fall_back_unread(io, &owner);
    }
    let op = io.take_op();
    let completion = submit_in_place(&io.vd, io.member, op);
    complete(io, completion.result, completion.buf.expect("reads and writes return their buffer"), &owner);
}

/// Serves a Fast Path request on the shard it was sent to.
///
/// The member operation runs on the shard's ring, counted in the member's outstanding
/// operations; no nested future: this task is the Fast Path's one per request, and each layer
/// of state machine is copied in and out of it.
///
/// The drive is held by its `Arc` rather than under the member's read lock: a memory or
/// emulated drive copies the data in `submit`, and the lock's release, a locked instruction,
/// then waited for those 4 KiB of stores to drain (a profile put a third of this task's time on
/// it). The count is taken before the copy and dropped after the completion.
pub(crate) async fn serve(reactor: Rc<Reactor>, mut io: FastIo) {
    if placement_changed(&io) {
        return fall_back_unread(io, &Owner::Shard);
    }
    let op = io.take_op();
    io.vd.member_io_started(io.member);
    let drive = io.vd.member(io.member).drive();
    let finished = reactor.submit(&*drive, op).await;
    drop(drive);
    io.vd.member_io_ended(io.member);
    complete(io, finished.result, finished.buf.expect("reads and writes return their buffer"), &Owner::Shard);
}

/// Whether the request is a read whose member left service, or for which background work
/// began, since it was placed: then it goes to the normal path ([`fall_back_unread`]). A write
/// goes on: it announced itself, so no copy starts under it, and its completion looks at the
/// member again. Looked at through a reference: the request is not moved in and out.
fn placement_changed(io: &FastIo) -> bool {
    !io.write && (io.vd.member(io.member).state() != MemberState::Online || background_in_the_way(&io.vd).is_some())
}

/// Sends a read whose placement changed (see [`placement_changed`]) to the normal path.
fn fall_back_unread(io: FastIo, owner: &Owner) {
    let FastIo { vd, offset_bytes, buf, done, row, .. } = io;
    fall_back(owner, row, vd, normal_request(false, offset_bytes, buf.expect("the buffer is with the read")), done);
}

fn complete(io: FastIo, result: Result<(), drive::DriveError>, buf: IoBuf, owner: &Owner) {
    match io.write {
        true => write::complete(io, result, buf, owner),
        false => complete_read(io, result, buf, owner),
    }
}

/// Delivers a read the member answered: to the client, or to the normal path on an error.
fn complete_read(read: FastIo, result: Result<(), drive::DriveError>, buf: IoBuf, owner: &Owner) {
    let FastIo { vd, member, drive_offset_bytes, offset_bytes, done, row, .. } = read;
    vd.note_member_io(member, drive_offset_bytes, buf.len() as u64, true);
    // A bad block recorded while the read ran may lie under it: the guarded path decides.
    if result.is_err() || !vd.bad_blocks().is_empty() {
        return fall_back(owner, row, vd, normal_request(false, offset_bytes, buf), done);
    }
    vd.count_fast_path_read();
    vd.finish(VdCompletion { result: Ok(()), buf: Some(buf) }, done, false);
}

/// The shard that owns `row` serves the request through the normal path; it stays counted in
/// flight.
fn fall_back(owner: &Owner, row: u64, vd: Arc<VirtualDrive>, request: VdRequest, done: Done) {
    match owner {
        Owner::Engine(engine) => {
            let index = engine.shard_of_row(&vd, row);
            engine.shards[index].send(ShardMsg::Request { vd, request, done, bypass: false });
        }
        Owner::Shard => {
            let index = crate::shard::shard_of_row(&vd, row);
            crate::shard::send_to_shard(index, ShardMsg::Request { vd, request, done, bypass: false });
        }
    }
}

/// How a request the Fast Path cannot finish reaches the shard that owns its row: through the
/// engine on a thread that is no shard (served in place, called by the engine), through the
/// shard's list of its engine's shards on a shard.
enum Owner<'a> {
    Engine(&'a Engine),
    Shard,
}
