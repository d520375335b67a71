//! The Fast Path (seed 003; MegaRAID's FastPath): a read that one member can serve whole goes
//! straight to that member from the shard that submitted it, with no hop to the shard that owns
//! the row, no row lock and no cache lookup.
//!
//! It is taken only where nothing else could answer differently: the VD's policies are WT,
//! NORA and Direct (nothing of it in the cache, no read-ahead to start), the caches hold no
//! dirty data of it (left from a WB policy before), every member is online and on an SSD or in
//! memory (for a hard disk the hop costs nothing next to a seek), no member is being copied, and
//! no block of it is known to be bad. A read that fits in one strip then has one place to come
//! from (or two on a mirror, picked as the row path picks them). The member state and the bad
//! blocks are looked at again on the serving shard just before the read goes, and a read that
//! fails, or finds a bad block recorded meanwhile, is sent to the owning shard's normal path,
//! which books the error, reconstructs or tries the other copy. Writes keep the normal path: a
//! write's order against others of its row, its bitmap bits and its journal record need the
//! owning shard.
//!
//! Without the Fast Path, a read submitted on shard A for a row of shard B costs two thread
//! wake-ups (A to B, B back to A's completion): at queue depth 1 that is most of its latency.

use crate::config::{IoPolicy, ReadPolicy, WritePolicy};
use crate::io::mirror::choose_copy;
use crate::runtime::Reactor;
use crate::vd::VdCompletion;
use crate::{Done, Engine, ShardMsg, VdRequest, VirtualDrive};
use drive::{DriveKind, DriveOp, IoBuf, IoCtx};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

thread_local! {
    /// The shard this thread runs, as the address of its waker (0 on other threads), so that
    /// an engine can tell whether a request is submitted from one of its own shards.
    static CURRENT_SHARD: Cell<usize> = const { Cell::new(0) };
    /// Reads a shard sent itself: taken by its loop without the inbox's atomics and the
    /// eventfd write a wake-up costs (the shard is awake, running the task that sent them).
    static OWN_READS: RefCell<VecDeque<FastRead>> = const { RefCell::new(VecDeque::new()) };
}

/// The reads this shard sent itself, to spawn.
pub(crate) fn take_own_reads() -> VecDeque<FastRead> {
    OWN_READS.with(|reads| std::mem::take(&mut *reads.borrow_mut()))
}

/// Whether this shard sent itself reads that its loop has not taken yet.
pub(crate) fn has_own_reads() -> bool {
    OWN_READS.with(|reads| !reads.borrow().is_empty())
}

/// Called once by each shard thread.
pub(crate) fn set_current_shard(waker: &Arc<drive::ShardWaker>) {
    CURRENT_SHARD.with(|current| current.set(Arc::as_ptr(waker) as usize));
}

/// Why a VD does not take the Fast Path now, or `None` when it does (`vall show`).
pub fn ineligible(vd: &VirtualDrive) -> Option<&'static str> {
    if vd.members().iter().any(|m| !is_fast(&*m.drive())) {
        return Some("a member is a hard disk");
    }
    policies_or_members(vd).or_else(|| background_in_the_way(vd))
}

/// An SSD or a memory drive: one where a thread hop is a large part of a read's time.
fn is_fast(drive: &dyn drive::Drive) -> bool {
    drive.info().kind == DriveKind::Memory || drive.info().solid_state
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
    if vd.members().iter().any(|m| m.copy_target().is_some()) {
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

/// The member and drive offset that serve a read of `len_bytes` at `offset_bytes` alone, with
/// the row it lies in; `None` if the read spans strips.
fn place(vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64) -> Option<(u64, usize, u64)> {
    let geometry = vd.geometry();
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
    let (member, drive_offset_bytes) = choose_copy(vd, &map, &piece, vd.unavailable_for_read(row.row))?;
    Some((row.row, member, drive_offset_bytes))
}

/// A read on its way to one member: what the serving shard needs, and where it goes if the
/// Fast Path cannot finish it.
pub(crate) struct FastRead {
    pub(crate) vd: Arc<VirtualDrive>,
    row: u64,
    member: usize,
    drive_offset_bytes: u64,
    offset_bytes: u64,
    buf: IoBuf,
    done: Done,
    /// The owning shard's inbox and waker, for the fallback.
    owner: (crossbeam_channel::Sender<ShardMsg>, Arc<drive::ShardWaker>),
}

impl Engine {
    /// Sends a qualifying read down the Fast Path; hands the buffer and callback back otherwise.
    pub(crate) fn fast_read(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, done: Done) -> Result<(), (IoBuf, Done)> {
        if policies_or_members(vd).is_some() {
            return Err((buf, done));
        }
        // The member's kind before the checks that take a lock per member: a VD of hard disks
        // (the usual one that does not qualify) stops here.
        let placed = place(vd, offset_bytes, buf.len() as u64).filter(|&(_, member, _)| is_fast(&*vd.member(member).drive()));
        let Some((row, member, drive_offset_bytes)) = placed.filter(|_| background_in_the_way(vd).is_none()) else {
            return Err((buf, done));
        };
        let owner = self.shard_of_row(vd.geometry(), row);
        let current = CURRENT_SHARD.with(Cell::get);
        let own = self.shards.iter().position(|s| Arc::as_ptr(&s.waker) as usize == current);
        let owner_link = (self.shards[owner].inbox.clone(), Arc::clone(&self.shards[owner].waker));
        vd.begin_request();
        let read = FastRead { vd: Arc::clone(vd), row, member, drive_offset_bytes, offset_bytes, buf, done, owner: owner_link };
        match own {
            Some(_) => OWN_READS.with(|reads| reads.borrow_mut().push_back(read)),
            None if reads_in_place(&*vd.member(member).drive()) => serve_in_place(read),
            None => self.shards[owner].send(ShardMsg::FastRead(Box::new(read))),
        }
        Ok(())
    }
}

/// Memory and file members complete a read on any thread, without a ring (a copy, a pread):
/// a thread that is not a shard (an NBD connection's) reads them itself instead of waking a
/// shard and being woken back.
fn reads_in_place(drive: &dyn drive::Drive) -> bool {
    matches!(drive.info().kind, DriveKind::Memory | DriveKind::File)
}

thread_local! {
    /// The ring-less context a non-shard thread reads members in place with.
    static IN_PLACE: RefCell<Option<IoCtx>> = const { RefCell::new(None) };
}

/// Serves a Fast Path read on the submitting thread, which is no shard (see [`reads_in_place`]).
fn serve_in_place(read: FastRead) {
    let Some(mut read) = still_placed(read) else { return };
    let target = read.vd.member(read.member);
    target.outstanding.fetch_add(1, Ordering::Relaxed);
    let drive = target.drive();
    let op = DriveOp::Read { offset_bytes: read.drive_offset_bytes, buf: std::mem::replace(&mut read.buf, IoBuf::zeroed(0)) };
    let completion = IN_PLACE.with(|ctx| {
        let mut ctx = ctx.borrow_mut();
        let ctx = ctx.get_or_insert_with(IoCtx::without_ring);
        drive.submit(ctx, 0, op);
        let mut out = Vec::new();
        ctx.poll(&mut out, false);
        // A drive that delays its completions (fault injection) releases them when due.
        while out.is_empty() {
            std::thread::sleep(std::time::Duration::from_micros(50));
            ctx.poll(&mut out, false);
        }
        out.pop().expect("one read, one completion")
    });
    target.outstanding.fetch_sub(1, Ordering::Relaxed);
    complete(read, completion.result, completion.buf.expect("a read returns its buffer"));
}

/// The read, unless its member left service or background work began since it was placed
/// (then it went to the normal path).
fn still_placed(read: FastRead) -> Option<FastRead> {
    let changed = read.vd.unavailable_for_read(read.row).contains(read.member) || background_in_the_way(&read.vd).is_some();
    if changed {
        let FastRead { vd, offset_bytes, buf, done, owner, .. } = read;
        fall_back(owner, vd, offset_bytes, buf, done);
        return None;
    }
    Some(read)
}

/// Serves a Fast Path read on the shard it was sent to.
pub(crate) async fn serve(reactor: Rc<Reactor>, read: FastRead) {
    let Some(mut read) = still_placed(read) else { return };
    let target = read.vd.member(read.member);
    target.outstanding.fetch_add(1, Ordering::Relaxed);
    let drive = target.drive();
    let buf = std::mem::replace(&mut read.buf, IoBuf::zeroed(0));
    let finished = reactor.submit(&*drive, DriveOp::Read { offset_bytes: read.drive_offset_bytes, buf }).await;
    target.outstanding.fetch_sub(1, Ordering::Relaxed);
    complete(read, finished.result, finished.buf.expect("a read returns its buffer"));
}

/// Delivers a read the member answered: to the client, or to the normal path on an error.
fn complete(read: FastRead, result: Result<(), drive::DriveError>, buf: IoBuf) {
    let FastRead { vd, member, drive_offset_bytes, offset_bytes, done, owner, .. } = read;
    vd.note_member_io(member, drive_offset_bytes, buf.len() as u64, true);
    // A bad block recorded while the read ran may lie under it: the guarded path decides.
    if result.is_err() || !vd.bad_blocks().is_empty() {
        return fall_back(owner, vd, offset_bytes, buf, done);
    }
    vd.count_fast_path_read();
    vd.finish(VdCompletion { result: Ok(()), buf: Some(buf) }, done, false);
}

/// The owning shard serves the read through the normal path; it stays counted in flight.
fn fall_back(
    (inbox, waker): (crossbeam_channel::Sender<ShardMsg>, Arc<drive::ShardWaker>),
    vd: Arc<VirtualDrive>,
    offset_bytes: u64,
    buf: IoBuf,
    done: Done,
) {
    let message = ShardMsg::Request { vd, request: VdRequest::Read { offset_bytes, buf }, done };
    if inbox.send(message).is_ok() {
        waker.wake();
    }
}
