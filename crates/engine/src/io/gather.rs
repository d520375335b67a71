//! Write gathering on parity levels: the last piece of a write that spans rows, when it starts
//! a row and stops short of its end, waits a moment under the row lock for the next write of the
//! stream to bring the rest of the row; both then go out as one full-stripe write instead of two
//! read-modify-writes (md's stripe cache does the same with its delayed stripes). A 1 MiB
//! sequential writer on 7+1 RAID5 with 64 KiB strips shares a row between every two requests.
//!
//! The rules that keep the order of writes:
//! - the piece that waits (the owner) registers its row when it takes its lock ticket, and
//!   waits only after it holds the lock;
//! - a later write to the row *joins* if its range touches or overlaps what is gathered: its
//!   bytes are laid over the owner's (and earlier joiners') in arrival order, and it completes
//!   with the owner's write;
//! - any other write to the row closes the gathering before it takes its own ticket, so it,
//!   and everything after it, lands after the gathered write;
//! - the owner writes at the first of: the row whole, the gathering closed, its wait passed
//!   (twice the usual time until a join, from [`HOLD_MIN`] to [`HOLD`]).
//!
//! Nothing is acknowledged before the gathered write completes, so a crash or a read meanwhile
//! sees each byte old or new, as with any write in flight. Never in the simulator (it runs on
//! seeded completion order, where nothing may wait on the wall clock), and only while the VD has
//! another request in flight that could be the continuation.

use super::row::Env;
use crate::runtime::{LockKey, Reactor};
use crate::vd::{VdError, VirtualDrive};
use drive::IoBuf;
use layout::{RowPiece, SpanKind};
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::ops::Range;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

/// The longest an owner waits for the rest of its row: about one request's time on disks at the
/// queue depths where a stream's next write is already on its way. It waits twice the usual
/// time until a join (`vd::write_streams`) when that is shorter, so that a wait that finds
/// nothing costs little once the stream's pace is known; a writer at queue depth 1 never
/// waits (see [`may_hold`]).
///
/// A request's time includes a member flush when the write goes around the journal
/// (`cache::bypass` acknowledges only what is durable): 1.0 to 1.5 ms per flush on files in
/// /tmp here, so the stream's next write comes 1 to 3 ms after the row began to wait. A cap
/// of 1.5 ms let a third of the rows of a 1 MiB stream at QD 4 time out into two
/// read-modify-writes with images; at 5 ms nine in ten joined and the stream wrote 19 % faster
/// (medians of three alternated rounds; WT streams, which join sooner, did not change).
///
/// A debug build does the shard's work (parity above all) ten to thirty times slower, so the
/// next write reaches the shard that much later: it waits 20 ms.
pub(crate) const HOLD: Duration = if cfg!(debug_assertions) { Duration::from_millis(20) } else { Duration::from_millis(5) };
/// The shortest wait: what a shard takes to see the next message after a busy turn.
pub(crate) const HOLD_MIN: Duration = Duration::from_micros(50);

/// One row being gathered: the range of the row its writes cover, from offset 0 (the owner's
/// piece starts the row), and the joiners' bytes in arrival order.
pub(crate) struct Gather {
    row_bytes: u64,
    covered_end_bytes: Cell<u64>,
    joined: RefCell<Vec<(u64, IoBuf)>>,
    open: Cell<bool>,
    owner: RefCell<Option<Waker>>,
    outcome: RefCell<Option<Result<(), VdError>>>,
    joiners: RefCell<Vec<Waker>>,
}

impl Gather {
    fn whole(&self) -> bool {
        self.covered_end_bytes.get() == self.row_bytes
    }

    fn wake_owner(&self) {
        if let Some(waker) = self.owner.borrow_mut().take() {
            waker.wake();
        }
    }

    /// No more joiners: the owner writes now.
    fn close(&self) {
        self.open.set(false);
        self.wake_owner();
    }
}

/// Whether the write piece `piece` (`last` of its request's pieces on this shard) should wait
/// for the rest of its row: it is the tail of a sequential stream's write (`vd::write_streams`).
pub(super) fn may_hold(env: &Env, piece: &RowPiece, last: bool) -> bool {
    last && tail_may_wait(&env.reactor, &env.vd, piece.vd_offset_bytes..piece.vd_offset_bytes + piece.len_bytes)
}

/// Whether VD bytes `range`, the last piece of a write, would wait for the rest of its row:
/// see [`may_hold`].
fn tail_may_wait(reactor: &Reactor, vd: &VirtualDrive, range: Range<u64>) -> bool {
    let kind = vd.geometry().span_kind();
    let row_bytes = vd.geometry().row_data_bytes();
    matches!(kind, SpanKind::Parity | SpanKind::DoubleParity)
        && range.start.is_multiple_of(row_bytes)
        && range.end - range.start < row_bytes
        && vd.write_streams.others_in_flight()
        && !reactor.is_seeded()
        && vd.write_streams.is_stream_end(range.end)
        && !on_memory(vd)
}

/// Whether a write of `range`, a part of one row and a whole piece of its request, would be
/// written together with a neighbour of its stream if it went to the members: it joins the
/// row's open gathering, or opens one as a stream write's tail ([`may_hold`]).
pub(crate) fn would_gather(reactor: &Reactor, vd: &VirtualDrive, range: &Range<u64>) -> bool {
    let row = range.start / vd.geometry().row_data_bytes();
    let key = LockKey { vd_id: vd.id(), row };
    let open = reactor.gathers().borrow().get(&key).is_some_and(|gather| gather.open.get());
    open || tail_may_wait(reactor, vd, range.clone())
}

/// Whether the VD is on memory drives, where a read-modify-write costs a copy in memory and a
/// wait costs more than it saves (RAID5 of 8 memory drives, 1 MiB sequential writes at QD 8:
/// 11.1 GB/s and 1.5 ms p99 without gathering, 8.8 to 10.4 GB/s and 2.4 to 3.1 ms with it).
fn on_memory(vd: &VirtualDrive) -> bool {
    vd.members().iter().any(|member| member.drive().info().kind == drive::DriveKind::Memory)
}

/// Registers `piece` (which starts its row) as the owner of a gathering of its row. Called
/// right after its lock ticket is taken, before any await.
pub(super) fn open(env: &Env, key: LockKey, piece: &RowPiece) -> Rc<Gather> {
    assert_eq!(piece.offset_in_row_bytes, 0, "an owner's piece starts its row");
    let gather = Rc::new(Gather {
        row_bytes: env.vd.geometry().row_data_bytes(),
        covered_end_bytes: Cell::new(piece.len_bytes),
        joined: RefCell::new(Vec::new()),
        open: Cell::new(true),
        owner: RefCell::new(None),
        outcome: RefCell::new(None),
        joiners: RefCell::new(Vec::new()),
    });
    let previous = env.reactor.gathers().borrow_mut().insert(key, Rc::clone(&gather));
    assert!(previous.is_none_or(|previous| !previous.open.get()), "one open gathering per row");
    gather
}

/// Closes the open gathering of the row `key`, if any: a write that will not join it lands
/// after it.
pub(super) fn close(env: &Env, key: LockKey) {
    if let Some(gather) = env.reactor.gathers().borrow().get(&key).filter(|gather| gather.open.get()) {
        gather.close();
    }
}

/// A write of `piece` (bytes `buf`) arriving at a row: joins the open gathering of the row if
/// it touches what is gathered, and then resolves with the gathered write's outcome; closes
/// it otherwise. `None`: the write goes its own way (after any gathered write of the row).
pub(super) fn join(env: &Env, key: LockKey, piece: &RowPiece, buf: &IoBuf) -> Option<impl Future<Output = Result<(), VdError>>> {
    let gather = env.reactor.gathers().borrow().get(&key).filter(|gather| gather.open.get()).cloned()?;
    if piece.offset_in_row_bytes > gather.covered_end_bytes.get() {
        gather.close();
        return None;
    }
    let end = piece.offset_in_row_bytes + piece.len_bytes;
    gather.covered_end_bytes.set(gather.covered_end_bytes.get().max(end));
    gather.joined.borrow_mut().push((piece.offset_in_row_bytes, IoBuf::from_slice(buf.as_slice())));
    if gather.whole() {
        gather.close();
    }
    Some(poll_fn(move |cx| match gather.outcome.borrow().clone() {
        Some(outcome) => Poll::Ready(outcome),
        None => {
            gather.joiners.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        }
    }))
}

/// The owner, holding the row lock: waits until the row is whole, the gathering is closed or
/// [`HOLD`] has passed, then closes it and returns the range to write (from the row's start)
/// with the bytes: the owner's `own` with the joiners' laid over it in arrival order.
pub(super) async fn collect(env: &Env, key: LockKey, gather: &Rc<Gather>, own: &IoBuf) -> (RowPiece, IoBuf) {
    let hold = env.vd.write_streams.wait(HOLD_MIN, HOLD);
    let started = std::time::Instant::now();
    let mut timer = std::pin::pin!(env.reactor.sleep(hold));
    poll_fn(|cx| {
        if !gather.open.get() || timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        *gather.owner.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    })
    .await;
    // A wait closed early by a write that did not join says nothing of the stream's pace.
    let timed_out = gather.open.get();
    match (gather.joined.borrow().is_empty(), timed_out) {
        (false, _) => env.vd.write_streams.note_wait(Some(started.elapsed()), HOLD),
        (true, true) => env.vd.write_streams.note_wait(None, HOLD),
        (true, false) => {}
    }
    gather.close();
    let mut gathers = env.reactor.gathers().borrow_mut();
    if gathers.get(&key).is_some_and(|registered| Rc::ptr_eq(registered, gather)) {
        gathers.remove(&key);
    }
    drop(gathers);
    let len_bytes = gather.covered_end_bytes.get();
    let mut bytes = IoBuf::from_parts(&[own.as_slice()], len_bytes as usize);
    for (offset_bytes, joined) in gather.joined.borrow().iter() {
        let at = *offset_bytes as usize;
        bytes.as_mut_slice()[at..at + joined.len()].copy_from_slice(joined.as_slice());
    }
    let row_start_bytes = key.row * gather.row_bytes;
    (RowPiece { row: key.row, vd_offset_bytes: row_start_bytes, offset_in_row_bytes: 0, len_bytes }, bytes)
}

/// Hands the gathered write's outcome to its joiners.
pub(super) fn finish(gather: &Gather, outcome: &Result<(), VdError>) {
    *gather.outcome.borrow_mut() = Some(outcome.clone());
    for waker in gather.joiners.borrow_mut().drain(..) {
        waker.wake();
    }
}

/// How many writes joined (for tests and counters).
pub(super) fn joined_count(gather: &Gather) -> usize {
    gather.joined.borrow().len()
}
