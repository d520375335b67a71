//! The per-thread I/O context: one io_uring, the completions of synchronous backends, and the
//! hooks fault injection uses to delay or alter a completion.
//!
//! Each engine shard owns one `IoCtx` and is the only thread that touches it, so nothing here is
//! locked. Other threads wake a shard that sleeps in `poll` through its [`ShardWaker`], an eventfd
//! the ring polls.
//!
//! Emulated drives complete on a timetable instead of a ring: one that knows an operation's due
//! time at submit parks the completion here ([`IoCtx::complete_at`]); one whose queue decides
//! later (a hard disk reordering its queue, NCQ) keeps the completion itself and registers as a
//! [`DueSource`], which every `poll` asks for what has come due and when to ask again.
//!
//! A drive whose operations another thread finishes (a network drive, whose replies a reader
//! thread receives) completes them through a [`CompletionPort`]: the submitter takes one with
//! [`IoCtx::remote_completion`] for each operation, the other thread pushes the completion into
//! it, and the push wakes the context (its eventfd, or a condition variable for a context
//! without a ring), so the shard never waits on the other thread and no completion is missed.

use crate::port::{CompletionPort, PORT_WAIT_MAX};
use crate::{Completion, DriveError, IoBuf, ShardWaker, Token};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod retry;
mod timetable;
use retry::{PendingRetries, RetryState};
pub(crate) use timetable::DueSource;
use timetable::{Delayed, WatchedSource};

/// `user_data` of the eventfd poll; ring slots use their index, which never gets this high.
const WAKER_USER_DATA: u64 = u64::MAX;

/// Longest sleep in the ring while the waker's poll is not queued.
const UNARMED_WAIT_MAX: Duration = Duration::from_millis(1);

/// Submissions refused for a transient reason before an operation fails with the error.
const SUBMIT_ATTEMPTS_MAX: usize = 1000;

/// A submit error that goes away once completions are reaped or the call is repeated.
fn is_transient_submit_error(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

#[derive(Clone, Copy, Debug)]
pub struct IoCtxConfig {
    /// Submission queue entries; 0 makes a context without a ring (memory drives, simulator).
    pub ring_entries: u32,
}

impl Default for IoCtxConfig {
    fn default() -> Self {
        IoCtxConfig { ring_entries: 256 }
    }
}

/// An operation in the ring. The buffer lives here until its CQE arrives, whatever happens to
/// the future that asked for it, because the kernel may write into it until then.
struct RingSlot {
    token: Token,
    buf: Option<IoBuf>,
    /// Buffers of a vectored op and the iovec array the kernel reads (kept alive together).
    bufs: Vec<IoBuf>,
    iovecs: Vec<libc::iovec>,
    /// For short transfers: what was already done.
    done_bytes: usize,
    /// What to submit again for the rest of a short transfer, or after the kernel handed the
    /// operation back unexecuted.
    op: SlotOp,
    retry: RetryState,
}

#[derive(Clone, Copy)]
enum SlotOp {
    ReadWrite(Resubmit),
    Flush { fd: RawFd },
}

#[derive(Clone, Copy)]
struct Resubmit {
    fd: RawFd,
    offset_bytes: u64,
    write: bool,
}

/// Identifies contexts to the sources that hold completions for several of them.
static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

/// Something to do to a completion before the submitter sees it.
pub(crate) enum Hook {
    Delay(Duration),
    Transform(Box<dyn FnOnce(&mut Completion)>),
}

pub struct IoCtx {
    ring: Option<IoUring>,
    slots: Vec<Option<RingSlot>>,
    free_slots: Vec<usize>,
    in_ring: usize,
    unsubmitted: usize,
    ready: VecDeque<Completion>,
    hooks: HashMap<Token, Vec<Hook>>,
    delayed: BinaryHeap<Delayed>,
    delayed_completions: HashMap<u64, Completion>,
    delay_sequence: u64,
    waker: Option<Arc<ShardWaker>>,
    waker_armed: bool,
    id: u64,
    sources: Vec<WatchedSource>,
    /// Operations whose completions sources hold for this context.
    held_by_sources: usize,
    /// Where other threads complete this context's operations; made on first use.
    port: Option<CompletionPort>,
    /// Operations another thread will complete through `port`.
    held_by_port: usize,
    /// Errors the next submits return instead of entering the kernel (tests of the paths that
    /// a real kernel takes only under memory pressure or a full completion queue).
    injected_submit_errors: VecDeque<i32>,
    /// Ring slots the kernel handed back unexecuted, to be submitted again (`retry.rs`).
    retries: PendingRetries,
    /// Errnos the next CQEs of reads, writes and flushes carry instead of the kernel's (tests
    /// of the retry of operations the kernel hands back unexecuted).
    injected_cqe_errors: VecDeque<i32>,
    /// When the last warning about retried operations went out, and retries since.
    retry_warned_at: Option<Instant>,
    retries_unreported: u64,
}

impl IoCtx {
    /// # Errors
    /// If the kernel refuses to set up an io_uring (too old, or disabled by sysctl).
    pub fn new(config: IoCtxConfig) -> io::Result<IoCtx> {
        let ring = if config.ring_entries == 0 {
            None
        } else {
            let ring = IoUring::new(config.ring_entries).map_err(|e| {
                io::Error::new(e.kind(), format!("io_uring setup failed ({e}); storc needs Linux 5.11 or later with io_uring enabled"))
            })?;
            Some(ring)
        };
        Ok(IoCtx {
            ring,
            slots: Vec::new(),
            free_slots: Vec::new(),
            in_ring: 0,
            unsubmitted: 0,
            ready: VecDeque::new(),
            hooks: HashMap::new(),
            delayed: BinaryHeap::new(),
            delayed_completions: HashMap::new(),
            delay_sequence: 0,
            waker: None,
            waker_armed: false,
            id: NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed),
            sources: Vec::new(),
            held_by_sources: 0,
            port: None,
            held_by_port: 0,
            injected_submit_errors: VecDeque::new(),
            retries: PendingRetries::default(),
            injected_cqe_errors: VecDeque::new(),
            retry_warned_at: None,
            retries_unreported: 0,
        })
    }

    /// A context without a ring: only synchronous backends (memory, simulator) can submit.
    pub fn without_ring() -> IoCtx {
        IoCtx::new(IoCtxConfig { ring_entries: 0 }).expect("a context without a ring cannot fail")
    }

    pub fn has_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// The handle other threads use to wake this context's thread; created on first use.
    ///
    /// # Panics
    /// On a context without a ring, which never sleeps.
    pub fn waker(&mut self) -> Arc<ShardWaker> {
        assert!(self.ring.is_some(), "a context without a ring never sleeps");
        if let Some(waker) = &self.waker {
            return Arc::clone(waker);
        }
        let waker = ShardWaker::new();
        self.waker = Some(Arc::clone(&waker));
        waker
    }

    /// Completes an operation now (synchronous backends and errors found at submit).
    pub fn complete(&mut self, completion: Completion) {
        self.ready.push_back(completion);
    }

    /// Completes `op` with an error, returning the buffers it carried.
    pub fn fail(&mut self, token: Token, error: DriveError, op: crate::DriveOp) {
        self.complete(Completion::of(token, Err(error), op));
    }

    pub(crate) fn add_hook(&mut self, token: Token, hook: Hook) {
        self.hooks.entry(token).or_default().push(hook);
    }

    /// This context's identity, unique in the process, for sources that serve several.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// For an operation that another thread will complete (a network drive's reply reader):
    /// the port to complete it through, exactly once. Counted in [`IoCtx::in_flight`] until its
    /// completion arrives; the push wakes this context.
    pub fn remote_completion(&mut self) -> CompletionPort {
        self.held_by_port += 1;
        if let Some(port) = &self.port {
            return port.clone();
        }
        let waker = self.ring.is_some().then(|| self.waker());
        let port = CompletionPort::new(waker);
        self.port = Some(port.clone());
        port
    }

    /// Moves what other threads completed into `ready`.
    fn take_from_port(&mut self) {
        if self.held_by_port == 0 {
            return;
        }
        let Some(port) = &self.port else { return };
        self.held_by_port -= port.take_all(&mut self.ready);
    }

    /// Queues a read or write on the ring; the buffer is kept until the CQE arrives.
    ///
    /// # Safety
    /// `fd` must stay open until the operation completes.
    pub(crate) unsafe fn push_rw(&mut self, fd: RawFd, token: Token, offset_bytes: u64, mut buf: IoBuf, write: bool) {
        let len = u32::try_from(buf.len()).expect("a single I/O is under 4 GiB");
        let entry = if write {
            opcode::Write::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset_bytes).build()
        } else {
            opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset_bytes).build()
        };
        let op = SlotOp::ReadWrite(Resubmit { fd, offset_bytes, write });
        let slot =
            RingSlot { token, buf: Some(buf), bufs: Vec::new(), iovecs: Vec::new(), done_bytes: 0, op, retry: RetryState::default() };
        self.push_entry(entry, slot);
    }

    /// Queues a vectored read or write (readv/writev) of `bufs`, in order from `offset_bytes`.
    ///
    /// # Safety
    /// `fd` must stay open until the operation completes.
    pub(crate) unsafe fn push_rwv(&mut self, fd: RawFd, token: Token, offset_bytes: u64, mut bufs: Vec<IoBuf>, write: bool) {
        let iovecs: Vec<libc::iovec> = bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        let entry = vectored_entry(fd, &iovecs, offset_bytes, write);
        let op = SlotOp::ReadWrite(Resubmit { fd, offset_bytes, write });
        self.push_entry(entry, RingSlot { token, buf: None, bufs, iovecs, done_bytes: 0, op, retry: RetryState::default() });
    }

    /// Queues an fdatasync of `fd`.
    pub(crate) fn push_flush(&mut self, fd: RawFd, token: Token) {
        let slot = RingSlot {
            token,
            buf: None,
            bufs: Vec::new(),
            iovecs: Vec::new(),
            done_bytes: 0,
            op: SlotOp::Flush { fd },
            retry: RetryState::default(),
        };
        self.push_entry(flush_entry(fd), slot);
    }

    fn push_entry(&mut self, entry: squeue::Entry, slot: RingSlot) {
        let index = match self.free_slots.pop() {
            Some(index) => index,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        debug_assert!(self.slots[index].is_none());
        self.slots[index] = Some(slot);
        self.in_ring += 1;
        self.push_slot_entry(index, entry);
    }

    /// Queues the entry of ring slot `index`; if the ring will not take it, the slot's operation
    /// completes with that error instead (a fault on the data path is an error for that I/O).
    fn push_slot_entry(&mut self, index: usize, entry: squeue::Entry) {
        if let Err(error) = self.push_sqe(entry.user_data(index as u64)) {
            let slot = self.slots[index].take().expect("a slot being queued");
            self.in_ring -= 1;
            self.free_slots.push(index);
            let errno = error.raw_os_error().unwrap_or(libc::EIO);
            self.ready.push_back(Completion { token: slot.token, result: Err(DriveError::Io(errno)), buf: slot.buf, bufs: slot.bufs });
        }
    }

    /// Puts an entry in the submission queue, submitting to make room when it is full.
    ///
    /// # Errors
    /// When the kernel keeps refusing the submission for something other than a transient
    /// reason (EINTR; EAGAIN or EBUSY while completions are waiting to be reaped).
    fn push_sqe(&mut self, entry: squeue::Entry) -> io::Result<()> {
        for attempt in 0..SUBMIT_ATTEMPTS_MAX {
            let ring = self.ring.as_mut().expect("ring operations need a context with a ring");
            // SAFETY: every buffer and fd an entry refers to is kept alive in `slots` (or by the
            // caller's contract for fds) until its CQE is reaped.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                self.unsubmitted += 1;
                return Ok(());
            }
            // Submission queue full: hand what we have to the kernel and retry.
            let submitted = match self.injected_submit_errors.pop_front() {
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => ring.submit(),
            };
            match submitted {
                Ok(_) => self.unsubmitted = 0,
                Err(error) if is_transient_submit_error(&error) => {
                    // The completion queue is full or the kernel is short of resources: reaping
                    // makes room; back off a little if that is not enough.
                    self.reap();
                    if attempt > 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Err(io::Error::new(io::ErrorKind::WouldBlock, format!("io_uring refused submissions {SUBMIT_ATTEMPTS_MAX} times")))
    }

    /// Makes the next submits that reach the kernel fail with these errnos instead, in order.
    #[doc(hidden)]
    pub fn inject_submit_errors(&mut self, errnos: &[i32]) {
        self.injected_submit_errors.extend(errnos);
    }

    /// Makes the next CQEs of reads, writes and flushes carry these errnos instead of what the
    /// kernel did, in order (the operation ran, but is taken as handed back with the errno).
    #[doc(hidden)]
    pub fn inject_cqe_errors(&mut self, errnos: &[i32]) {
        self.injected_cqe_errors.extend(errnos);
    }

    /// Operations submitted on this context that have not completed yet (ring and delayed).
    pub fn in_flight(&self) -> usize {
        self.in_ring + self.delayed_completions.len() + self.held_by_sources + self.held_by_port
    }

    /// Moves finished completions into `out`. With `wait`, blocks until at least one completion
    /// is available or the waker fires (only when the caller has nothing else to do).
    pub fn poll(&mut self, out: &mut Vec<Completion>, wait: bool) {
        self.release_from_sources();
        // A push into the port after this point finds the flag set and writes the eventfd the
        // ring waits on (the shard's own loop sets it too; set here for any other sleeper).
        let port_waker = self.port_waker(wait);
        if let Some(waker) = &port_waker {
            waker.prepare_sleep();
        }
        self.take_from_port();
        self.resubmit_due_retries();
        let must_wait = wait && self.ready.is_empty();
        self.submit_and_reap(must_wait);
        if let Some(waker) = &port_waker {
            waker.cancel_sleep();
        }
        self.release_due_delays();
        self.release_from_sources();
        self.wait_on_port(wait);
        self.take_from_port();
        while let Some(completion) = self.ready.pop_front() {
            self.finish(completion, out);
        }
    }

    /// The waker a sleep in the ring needs for port completions, when it may sleep for them.
    fn port_waker(&self, wait: bool) -> Option<Arc<ShardWaker>> {
        let waiting_for_port = wait && self.held_by_port > 0 && self.ready.is_empty();
        waiting_for_port.then(|| self.port.as_ref().and_then(CompletionPort::waker)).flatten()
    }

    /// Without a ring: sleeps until another thread completes something for this context, the
    /// next parked completion is due, or [`PORT_WAIT_MAX`] passes.
    fn wait_on_port(&mut self, wait: bool) {
        if !wait || self.ring.is_some() || self.held_by_port == 0 || !self.ready.is_empty() {
            return;
        }
        let Some(port) = &self.port else { return };
        let timeout = self.next_deadline().map_or(PORT_WAIT_MAX, |due| due.saturating_duration_since(Instant::now()).min(PORT_WAIT_MAX));
        port.wait(timeout);
    }

    fn submit_and_reap(&mut self, wait: bool) {
        if self.ring.is_none() {
            return;
        }
        if wait {
            self.arm_waker();
        }
        let mut timeout = self.next_deadline().map(|due| due.saturating_duration_since(Instant::now()));
        if wait && self.waker.is_some() && !self.waker_armed {
            // The wake-up poll could not be queued: wake on a short timer instead, so that work
            // sent from other threads is still seen.
            timeout = Some(timeout.map_or(UNARMED_WAIT_MAX, |t| t.min(UNARMED_WAIT_MAX)));
        }
        let ring = self.ring.as_mut().expect("checked above");
        let result = match (wait, timeout) {
            (true, Some(timeout)) => {
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(1, &args)
            }
            (true, None) => ring.submit_and_wait(1),
            (false, _) if self.unsubmitted > 0 => match self.injected_submit_errors.pop_front() {
                Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                None => ring.submit(),
            },
            (false, _) => Ok(0),
        };
        match result {
            Ok(_) => self.unsubmitted = 0,
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => self.unsubmitted = 0,
            // Still queued: the next poll submits them again, after this reap made room.
            Err(e) if is_transient_submit_error(&e) => {}
            Err(e) => {
                // Nothing here can fail an operation that is already in the submission queue,
                // and a shard must not die: report it, back off, and let the next poll retry.
                tracing::error!(error = %e, "io_uring submit failed; retrying");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.reap();
    }

    fn arm_waker(&mut self) {
        if self.waker_armed {
            return;
        }
        let Some(waker) = &self.waker else { return };
        let fd = waker.eventfd.as_raw_fd();
        let entry = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(WAKER_USER_DATA);
        // Without the poll the context wakes on its own completions and timeouts only; the next
        // sleep tries to arm it again.
        self.waker_armed = self.push_sqe(entry).is_ok();
    }

    fn reap(&mut self) {
        let ring = self.ring.as_mut().expect("reap needs a ring");
        let cqes: Vec<(u64, i32)> = ring.completion().map(|cqe| (cqe.user_data(), cqe.result())).collect();
        for (user_data, result) in cqes {
            if user_data == WAKER_USER_DATA {
                self.drain_waker();
                continue;
            }
            self.ring_completed(user_data as usize, result);
        }
    }

    fn drain_waker(&mut self) {
        self.waker_armed = false;
        self.waker.as_ref().expect("only armed with a waker").drain();
    }

    fn ring_completed(&mut self, index: usize, result: i32) {
        let mut slot = self.slots[index].take().expect("CQE for an empty slot");
        let result = self.injected_cqe_errors.pop_front().map_or(result, |errno| -errno);
        if result < 0 && retry::is_unexecuted(-result) {
            if let Some(at) = slot.retry.next_attempt(Instant::now()) {
                self.note_retry(-result);
                self.slots[index] = Some(slot);
                self.retries.schedule(index, at);
                return;
            }
            tracing::error!(
                errno = -result,
                attempts = slot.retry.attempts(),
                "io_uring kept handing an operation back unexecuted for {:?}; it fails",
                retry::RETRY_WINDOW
            );
        }
        let result = match result {
            ..0 => Err(DriveError::Io(-result)),
            transferred_bytes => match self.short_transfer_rest(&mut slot, transferred_bytes as usize) {
                Transfer::Continue(next) => {
                    // The continuation points into the slot's buffers and iovecs, which move back
                    // into the slot table without their heap storage moving.
                    self.slots[index] = Some(slot);
                    self.push_slot_entry(index, next);
                    return;
                }
                Transfer::Done => Ok(()),
                Transfer::Stalled(error) => Err(error),
            },
        };
        self.in_ring -= 1;
        self.free_slots.push(index);
        self.ready.push_back(Completion { token: slot.token, result, buf: slot.buf, bufs: slot.bufs });
    }

    /// After a read or write transferred `transferred_bytes`: done, the entry that continues
    /// a short transfer, or the error of one that can make no progress.
    fn short_transfer_rest(&mut self, slot: &mut RingSlot, transferred_bytes: usize) -> Transfer {
        let SlotOp::ReadWrite(resubmit) = slot.op else { return Transfer::Done };
        let len_bytes: usize = slot.buf.iter().chain(&slot.bufs).map(|b| b.len()).sum();
        slot.done_bytes += transferred_bytes;
        if slot.done_bytes >= len_bytes {
            return Transfer::Done;
        }
        if transferred_bytes == 0 {
            // End of file: the file is shorter than the drive it was opened as (it shrank).
            // Zeros here would be silent data loss; the engine repairs the error from redundancy.
            let (offset_bytes, len_bytes, done_bytes) = (resubmit.offset_bytes, len_bytes as u64, slot.done_bytes as u64);
            return Transfer::Stalled(match resubmit.write {
                false => DriveError::EndOfMedium { offset_bytes, len_bytes, done_bytes },
                true => DriveError::Io(libc::EIO),
            });
        }
        let offset = resubmit.offset_bytes + slot.done_bytes as u64;
        slot.iovecs = remaining_iovecs(slot, slot.done_bytes);
        Transfer::Continue(vectored_entry(resubmit.fd, &slot.iovecs, offset, resubmit.write))
    }

    /// Runs hooks; a delayed completion is parked, everything else goes to `out`.
    fn finish(&mut self, mut completion: Completion, out: &mut Vec<Completion>) {
        if !self.hooks.is_empty() {
            if let Some(hooks) = self.hooks.remove(&completion.token) {
                let mut delay = None;
                for hook in hooks {
                    match hook {
                        Hook::Delay(d) => delay = Some(d),
                        Hook::Transform(transform) => transform(&mut completion),
                    }
                }
                if let Some(delay) = delay {
                    self.park(completion, delay);
                    return;
                }
            }
        }
        out.push(completion);
    }
}

fn flush_entry(fd: RawFd) -> squeue::Entry {
    opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build()
}

/// A readv/writev entry over `iovecs`, which must stay alive until the CQE.
fn vectored_entry(fd: RawFd, iovecs: &[libc::iovec], offset_bytes: u64, write: bool) -> squeue::Entry {
    let count = u32::try_from(iovecs.len()).expect("iovec count fits u32");
    match write {
        true => opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), count).offset(offset_bytes).build(),
        false => opcode::Readv::new(types::Fd(fd), iovecs.as_ptr(), count).offset(offset_bytes).build(),
    }
}

/// iovecs for the part of a slot's buffers after the first `done_bytes`.
fn remaining_iovecs(slot: &mut RingSlot, done_bytes: usize) -> Vec<libc::iovec> {
    let mut skip = done_bytes;
    let mut iovecs = Vec::new();
    for buf in slot.buf.iter_mut().chain(slot.bufs.iter_mut()) {
        if skip >= buf.len() {
            skip -= buf.len();
            continue;
        }
        // SAFETY: skip < buf.len(), so the pointer stays inside the buffer the slot keeps alive.
        let base = unsafe { buf.as_mut_ptr().add(skip) };
        iovecs.push(libc::iovec { iov_base: base.cast(), iov_len: buf.len() - skip });
        skip = 0;
    }
    iovecs
}

/// Where a read or write stands after one of its transfers completed.
enum Transfer {
    Done,
    /// A short transfer: the entry for the rest.
    Continue(squeue::Entry),
    /// It can make no progress (end of file).
    Stalled(DriveError),
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // Buffers in the ring may still be written by the kernel: wait for every CQE first
        // (operations waiting for a retry are not in the kernel).
        while self.in_ring > self.retries.len() {
            let ring = self.ring.as_mut().expect("in_ring > 0 implies a ring");
            if ring.submit_and_wait(1).is_err() {
                break;
            }
            self.reap();
        }
    }
}
