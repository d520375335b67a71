//! RBD images of a Ceph cluster as member drives (`rbd:POOL/IMAGE[?conf=PATH&id=USER]`),
//! through librbd's asynchronous C API.
//!
//! # Why a thin FFI layer, loaded at run time
//! The crates that bind librbd (`ceph-rbd`, `librbd-sys`, `ceph-rust` for librados) link the
//! libraries when storc is built (`ceph-rbd` also needs libclang for bindgen), so every build
//! would need Ceph's development packages, and `cargo run -p storc -- serve` would not build on a
//! machine without them; `librbd-sys` was last released in 2016 and `ceph-rust` binds librados
//! only. This backend needs about twenty C functions (connect, open, size, the AIO calls and
//! their completions), declared in `ffi.rs` and looked up with `dlopen` (the `libloading` crate)
//! when the first `rbd:` drive opens. storc builds and serves anywhere; a machine without
//! `librbd1` gets an error naming the package the moment it asks for an `rbd:` drive.
//!
//! # Threads: what librbd's callbacks may touch
//! `submit` (on a shard) starts an `rbd_aio_*` call and returns: with `rbd_non_blocking_aio`
//! (forced on) the call only queues the request for librbd's own threads. librbd then calls
//! [`on_complete`] on one of *its* threads. That callback touches only the operation's own
//! record ([`Pending`], boxed at submit: the buffers librbd reads or fills, the iovec array, and
//! the context's [`CompletionPort`] and the operation's token) and this drive's shared counters. It never touches the
//! shard's `IoCtx`: it pushes the completion into the context's port, which wakes the shard, whose
//! next `poll` delivers it (`port.rs`). Buffers live in the record until the callback, and writes
//! are copied by librbd (`rbd_disable_zero_copy_writes`, forced on), so nothing of ours is read
//! after the completion.
//!
//! # Errors
//! A negative return of an operation is its errno (`DriveError::Io`), so the engine books it as
//! it books a file's: a failed write takes the member out, read errors are repaired from
//! redundancy. An image that is gone (removed, its pool deleted, or this client blocklisted)
//! answers with ENOENT, ESHUTDOWN or (a deleted pool, in Ceph 16) EPERM; those become
//! `DriveError::Gone`, which takes the member out at once, and every later operation fails
//! the same way without reaching librbd. librados' OSD timeout is set to 30 s unless the conf
//! sets one, so a member whose OSDs stop answering fails instead of holding the VD's I/O forever;
//! and a write or flush that librbd holds past 60 s whatever the reason (an exclusive lock it
//! never gets back) is completed as `Gone` and the drive with it (`overdue.rs`).
//!
//! Each drive has a cluster connection of its own: a member's faults (its client blocklisted,
//! its connection stuck) stay with that member, as a disk's stay on its own link.

mod connect;
mod ffi;
mod overdue;
mod spec;

pub use spec::{RbdSpec, RBD_FORM};

use crate::{check_op_range, Drive, DriveError, DriveInfo, DriveKind, DriveOp, IoCtx, Token};
use connect::Handles;
use ffi::{Api, RbdCompletionT, RbdImageT};
use overdue::{Delivery, Overdue, OP_DEADLINE};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long closing a drive waits for its operations in flight before it leaves the image open
/// (three OSD timeouts).
const CLOSE_WAIT: Duration = Duration::from_secs(90);

pub struct RbdDrive {
    spec: RbdSpec,
    info: DriveInfo,
    api: &'static Api,
    /// The open image, copied out of `handles` for the I/O path, which takes no lock: it is
    /// used only between `Shared::begin` and `Shared::end`, which `close` waits out.
    image: ImagePtr,
    /// Taken and dropped (the image closed, the connection shut down) by `close`.
    handles: Mutex<Option<Handles>>,
    shared: Arc<Shared>,
    /// The thread that gives up on writes and flushes librbd holds past [`OP_DEADLINE`].
    watch: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Clone, Copy)]
struct ImagePtr(RbdImageT);

// SAFETY: librbd's image handle may be used from any thread, and its AIO calls from several at
// once; it is only used while the drive is open (see `RbdDrive::image`).
unsafe impl Send for ImagePtr {}
// SAFETY: as above.
unsafe impl Sync for ImagePtr {}

/// What the drive and its operations' callbacks share.
struct Shared {
    in_flight: AtomicUsize,
    /// Held to wait for, and to announce, the last operation's end.
    idle_lock: Mutex<()>,
    idle: Condvar,
    /// The image answered that it is gone: later operations fail without reaching librbd.
    gone: AtomicBool,
    /// `close` was called: no new operation starts.
    closed: AtomicBool,
    name: String,
    /// The writes and flushes in flight, for the watch (`overdue.rs`).
    overdue: Arc<Overdue>,
}

impl Shared {
    /// Counts an operation in, unless the drive is closing. Either this sees `closed`, or
    /// `close` (which sets it first) sees the count: both use sequentially consistent order.
    fn begin(&self) -> bool {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.end();
            return false;
        }
        true
    }

    /// The image answered that it is gone, or stopped answering: logged once.
    fn mark_gone(&self, why: &str) {
        if !self.gone.swap(true, Ordering::Relaxed) {
            tracing::error!(drive = %self.name, "RBD image gone: {why}");
        }
    }

    fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _idle = self.idle_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.idle.notify_all();
        }
    }

    /// Waits until no operation is in flight, up to `deadline`; whether that happened.
    fn wait_idle(&self, deadline: Instant) -> bool {
        let mut idle = self.idle_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            idle = self.idle.wait_timeout(idle, left).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
        true
    }
}

impl RbdDrive {
    /// Connects to the cluster and opens the image (blocking: the control plane calls it).
    ///
    /// # Errors
    /// librbd missing, a conf that cannot be read, a cluster that does not answer, a missing
    /// pool or image: each says what was tried.
    pub fn open(spec: &RbdSpec) -> Result<RbdDrive, String> {
        Self::from_opened(spec, connect::open(spec, None)?)
    }

    /// As [`RbdDrive::open`], creating the image with `size_bytes` (librbd's default format and
    /// features) when the pool has none of that name: the target of a migration, which the user
    /// names before it exists. Also says whether it created the image.
    ///
    /// # Errors
    /// As [`RbdDrive::open`], and a create that librbd refuses.
    pub fn open_or_create(spec: &RbdSpec, size_bytes: u64) -> Result<(RbdDrive, bool), String> {
        let opened = connect::open(spec, Some(size_bytes))?;
        let created = opened.created;
        Ok((Self::from_opened(spec, opened)?, created))
    }

    fn from_opened(spec: &RbdSpec, opened: connect::Opened) -> Result<RbdDrive, String> {
        let capacity_bytes = opened.size_bytes - opened.size_bytes % crate::SECTOR_BYTES;
        let name = format!("rbd:{}", spec.image_path());
        let info = DriveInfo { name: name.clone(), kind: DriveKind::Rbd, capacity_bytes, direct_io: !opened.cached, solid_state: false };
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            idle_lock: Mutex::new(()),
            idle: Condvar::new(),
            gone: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            name,
            overdue: Arc::new(Overdue::default()),
        });
        let deadline = spec.op_timeout.unwrap_or(OP_DEADLINE);
        let watch = Self::start_watch(&shared, deadline)
            .map_err(|error| format!("rbd:{}: cannot start its watch thread: {error}", spec.image_path()))?;
        let (api, image) = (opened.handles.api, ImagePtr(opened.handles.image));
        let handles = Mutex::new(Some(opened.handles));
        Ok(RbdDrive { spec: spec.clone(), info, api, image, handles, shared, watch: Mutex::new(Some(watch)) })
    }

    fn start_watch(shared: &Arc<Shared>, deadline: Duration) -> std::io::Result<std::thread::JoinHandle<()>> {
        let shared = Arc::clone(shared);
        std::thread::Builder::new().name("rbd-watch".into()).spawn(move || {
            shared.overdue.run(deadline, |count| {
                shared.mark_gone(&format!("{count} write(s) or flush(es) unanswered by librbd for {} s", deadline.as_secs()));
            });
        })
    }

    pub fn spec(&self) -> &RbdSpec {
        &self.spec
    }
}

/// One operation between its submit and librbd's callback.
struct Pending {
    /// What completes it: kept here for a read (librbd fills its buffers until the callback),
    /// held by the watch for a write or flush, which it may complete first (`overdue.rs`).
    delivery: Held,
    /// The iovecs of a vectored op, alive for the call (librbd copies them there).
    _iovecs: Vec<libc::iovec>,
    shared: Arc<Shared>,
    api: &'static Api,
}

/// The call that starts an operation, with raw pointers into its `Pending` (taken before the
/// record is handed to librbd, so no reference to it is held while a callback may run).
enum Call {
    Read { offset_bytes: u64, ptr: *mut u8, len: usize },
    Write { offset_bytes: u64, ptr: *const u8, len: usize },
    ReadV { offset_bytes: u64, iov: *const libc::iovec, count: c_int },
    WriteV { offset_bytes: u64, iov: *const libc::iovec, count: c_int },
    Flush,
}

/// Where an operation's [`Delivery`] waits for librbd's callback.
enum Held {
    Here(Delivery),
    Watched(u64),
}

impl Call {
    /// The call for `delivery`'s operation; its iovecs (of a vectored op) go into `iovecs`.
    fn of(delivery: &mut Delivery, iovecs: &mut Vec<libc::iovec>) -> Call {
        *iovecs = match &mut delivery.op {
            DriveOp::ReadV { bufs, .. } | DriveOp::WriteV { bufs, .. } => {
                bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect()
            }
            _ => Vec::new(),
        };
        let (iov, count) = (iovecs.as_ptr(), c_int::try_from(iovecs.len()).unwrap_or(c_int::MAX));
        match &mut delivery.op {
            DriveOp::Read { offset_bytes, buf } => Call::Read { offset_bytes: *offset_bytes, ptr: buf.as_mut_ptr(), len: buf.len() },
            DriveOp::Write { offset_bytes, buf } => Call::Write { offset_bytes: *offset_bytes, ptr: buf.as_mut_ptr(), len: buf.len() },
            DriveOp::ReadV { offset_bytes, .. } => Call::ReadV { offset_bytes: *offset_bytes, iov, count },
            DriveOp::WriteV { offset_bytes, .. } => Call::WriteV { offset_bytes: *offset_bytes, iov, count },
            DriveOp::Flush => Call::Flush,
        }
    }

    /// # Safety
    /// `image` is open; the pointers point into a `Pending` that lives until `completion`'s
    /// callback has run.
    unsafe fn start(self, api: &Api, image: RbdImageT, completion: RbdCompletionT) -> c_int {
        // SAFETY: the caller's contract; each call matches its C prototype in ffi.rs.
        unsafe {
            match self {
                Call::Read { offset_bytes, ptr, len } => (api.rbd_aio_read)(image, offset_bytes, len, ptr.cast(), completion),
                Call::Write { offset_bytes, ptr, len } => (api.rbd_aio_write)(image, offset_bytes, len, ptr.cast(), completion),
                Call::ReadV { offset_bytes, iov, count } => (api.rbd_aio_readv)(image, iov, count, offset_bytes, completion),
                Call::WriteV { offset_bytes, iov, count } => (api.rbd_aio_writev)(image, iov, count, offset_bytes, completion),
                Call::Flush => (api.rbd_aio_flush)(image, completion),
            }
        }
    }
}

impl Drive for RbdDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        if self.shared.gone.load(Ordering::Relaxed) || !self.shared.begin() {
            return ctx.fail(token, DriveError::Gone, op);
        }
        let api = self.api;
        let mut delivery = Delivery { port: ctx.remote_completion(), token, op };
        let mut iovecs = Vec::new();
        let call = Call::of(&mut delivery, &mut iovecs);
        let watched = !matches!(delivery.op, DriveOp::Read { .. } | DriveOp::ReadV { .. });
        // The buffers' memory stays where it is when the delivery moves into the watch.
        let (delivery, watched_id) = if watched {
            let id = self.shared.overdue.hold(delivery);
            (Held::Watched(id), Some(id))
        } else {
            (Held::Here(delivery), None)
        };
        let arg = Box::into_raw(Box::new(Pending { delivery, _iovecs: iovecs, shared: Arc::clone(&self.shared), api }));
        let mut completion: RbdCompletionT = std::ptr::null_mut();
        // SAFETY: `arg` is a leaked box that `on_complete` takes back exactly once; the out
        // pointer is a live local.
        let rc = unsafe { (api.rbd_aio_create_completion)(arg.cast(), on_complete, &mut completion) };
        if rc < 0 {
            // SAFETY: no completion exists, so no callback will take `arg` back: we do.
            return finish(*unsafe { Box::from_raw(arg) }, rc as isize);
        }
        // SAFETY: the image stays open until this operation ends (`begin` above; `close` waits);
        // `call` points into buffers owned by the record behind `arg` (or held by the watch,
        // which gives nothing back before `arm` below), which stay where they are until the
        // callback.
        let rc = unsafe { call.start(api, self.image.0, completion) };
        if rc < 0 {
            // Refused before it started: librbd will not call back, so the record is ours again.
            // SAFETY: the completion was created above and never handed out.
            unsafe { (api.rbd_aio_release)(completion) };
            // SAFETY: as above, the callback will not run for this record.
            return finish(*unsafe { Box::from_raw(arg) }, rc as isize);
        }
        // From here on `arg` may already be freed by the callback on librbd's thread: only the
        // id is used. librbd has copied a write's data, so the watch may give its buffers back.
        if let Some(id) = watched_id {
            self.shared.overdue.arm(id, Instant::now());
        }
    }

    /// Whether librbd reports no allocated extent in the range (a new image: no background
    /// initialization needed). Errors asking answer "not known".
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if len_bytes == 0 {
            return true;
        }
        if !self.shared.begin() {
            return false;
        }
        let mut allocated = false;
        // SAFETY: the image is open until `end` below; the callback gets `allocated` as its
        // argument, a live local, and is only called during this synchronous call.
        let rc = unsafe {
            (self.api.rbd_diff_iterate2)(
                self.image.0,
                std::ptr::null(),
                offset_bytes,
                len_bytes,
                1,
                1,
                on_extent,
                (&mut allocated as *mut bool).cast(),
            )
        };
        self.shared.end();
        rc == 0 && !allocated
    }

    /// Waits for the operations in flight, then closes the image (releasing its exclusive lock
    /// and its watch, which a process that exits without closing holds until the watch times
    /// out, 30 s by default) and the connection. Later operations fail as on a vanished drive.
    fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.overdue.close();
        if let Some(watch) = self.watch.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            let _ = watch.join();
        }
        let mut handles = self.handles.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if handles.is_none() {
            return;
        }
        if !self.shared.wait_idle(Instant::now() + CLOSE_WAIT) {
            // Closing under librbd's feet would be worse than leaving the image open.
            tracing::error!(drive = %self.info.name, "operations still in flight in librbd; the image is left open");
            std::mem::forget(handles.take());
            return;
        }
        drop(handles.take());
    }
}

/// `rbd_diff_iterate2`'s callback: notes an allocated extent and stops the walk.
unsafe extern "C" fn on_extent(_offset: u64, _len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    if exists == 0 {
        return 0;
    }
    // SAFETY: `arg` is the `&mut bool` `reads_zero` passed, alive for the whole walk.
    unsafe { *arg.cast::<bool>() = true };
    -libc::ECANCELED
}

/// librbd's completion callback, on one of librbd's threads.
unsafe extern "C" fn on_complete(completion: RbdCompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the record leaked in `submit` for this completion; librbd calls this once.
    let pending = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    let api = pending.api;
    // SAFETY: the completion is complete (we are its callback); released once, here, as qemu's
    // block/rbd.c does.
    let rv = unsafe {
        let rv = (api.rbd_aio_get_return_value)(completion);
        (api.rbd_aio_release)(completion);
        rv
    };
    finish(*pending, rv);
}

/// Turns librbd's return value into the completion, hands it to the submitting context (on
/// whichever thread this runs) unless the watch gave up on it first, and counts the operation
/// out.
fn finish(pending: Pending, rv: isize) {
    let Pending { delivery, shared, .. } = pending;
    let delivery = match delivery {
        Held::Here(delivery) => Some(delivery),
        Held::Watched(id) => shared.overdue.take(id),
    };
    if let Some(delivery) = delivery {
        let result = outcome(&delivery.op, rv, &shared);
        delivery.complete(result);
    }
    shared.end();
}

fn outcome(op: &DriveOp, rv: isize, shared: &Shared) -> Result<(), DriveError> {
    if rv < 0 {
        let errno = i32::try_from(-rv).unwrap_or(libc::EIO);
        if matches!(errno, libc::ENOENT | libc::ESHUTDOWN | libc::EPERM) {
            shared.mark_gone(&std::io::Error::from_raw_os_error(errno).to_string());
            return Err(DriveError::Gone);
        }
        return Err(DriveError::Io(errno));
    }
    match op {
        DriveOp::Read { .. } | DriveOp::ReadV { .. } => {
            let (offset_bytes, len_bytes) = op.range_bytes().expect("a read has a range");
            let done_bytes = rv as u64;
            // librbd stops a read at the image's end: it shrank under us (`rbd resize`).
            if done_bytes < len_bytes {
                return Err(DriveError::EndOfMedium { offset_bytes, len_bytes, done_bytes });
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl Drop for RbdDrive {
    fn drop(&mut self) {
        self.close();
    }
}
