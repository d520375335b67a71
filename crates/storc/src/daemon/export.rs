//! A virtual drive as an NBD export: the one place where NBD requests become engine requests,
//! and where each is booked in its VD's client I/O stats (`engine::vd::ClientIoStats`, which the
//! metrics report) as it is answered: so the latency is the client's, a FUA write's flush
//! included.

use drive::{BufPool, IoBuf};
use engine::{Engine, IoKind, VdError, VdRequest, VirtualDrive};
use nbd::{BlockDevice, Done, IoError, ReadDone};
use std::sync::Arc;
use std::time::Instant;

/// Largest single engine write used to zero a range (WRITE_ZEROES can cover the whole drive).
const ZEROES_CHUNK_BYTES: u64 = 4 << 20;

pub struct VdDevice {
    pub engine: Arc<Engine>,
    pub vd: Arc<VirtualDrive>,
    /// Shared by every export: request buffers are reused, not mapped and zeroed each time.
    pub pool: BufPool,
}

fn io_error(error: &VdError) -> IoError {
    match error {
        VdError::OutOfRange { .. } => IoError::NoSpace,
        VdError::Misaligned { .. } => IoError::Invalid,
        VdError::Offline { .. }
        | VdError::Unrecoverable { .. }
        | VdError::Deleted { .. }
        | VdError::Initializing { .. }
        | VdError::FailureUnrecorded { .. }
        | VdError::RowNotResynced { .. }
        | VdError::SsdCacheLost { .. }
        | VdError::SsdCacheWrite { .. }
        | VdError::BadBlock { .. } => IoError::Io,
        // Only row jobs (rebuild, check, copy, migration) return these; a client request never does.
        VdError::NoRedundancy { .. }
        | VdError::RowOutOfRange { .. }
        | VdError::MemberOutOfRange { .. }
        | VdError::RowUnrecoverable { .. }
        | VdError::RowMemberOut { .. }
        | VdError::RowMemberIo { .. }
        | VdError::CopyEnded { .. }
        | VdError::MigrationEnded { .. } => IoError::Io,
        VdError::Stopped => IoError::ShuttingDown,
    }
}

/// A client request on its way, booked when it is answered.
struct Timed {
    vd: Arc<VirtualDrive>,
    kind: IoKind,
    bytes: u64,
    started: Instant,
}

impl Timed {
    fn start(vd: &Arc<VirtualDrive>, kind: IoKind, bytes: u64) -> Timed {
        Timed { vd: Arc::clone(vd), kind, bytes, started: Instant::now() }
    }

    /// Books the request, then answers the client: a client that has its answer finds it
    /// counted in the next scrape.
    fn answer<T>(self, result: Result<T, IoError>, done: impl FnOnce(Result<T, IoError>)) {
        self.vd.client_io().record(self.kind, self.bytes, self.started.elapsed(), result.is_ok());
        done(result)
    }
}

impl VdDevice {
    /// A flush, or the one after a FUA write: a write-through write is on the members, but
    /// their own caches (page cache, drive cache) must be flushed for it to be durable.
    fn flush_then(&self, timed: Timed, done: Done) {
        self.engine.submit(&self.vd, VdRequest::Flush, Box::new(move |c| timed.answer(c.result.map_err(|e| io_error(&e)), done)));
    }

    /// Writes zeros over `[offset, offset + len)` one chunk at a time.
    fn zero_range(self: Arc<Self>, offset: u64, len_bytes: u64, fua: bool, timed: Timed, done: Done) {
        if len_bytes == 0 {
            return if fua { self.flush_then(timed, done) } else { timed.answer(Ok(()), done) };
        }
        let chunk = len_bytes.min(ZEROES_CHUNK_BYTES);
        let request = VdRequest::Write { offset_bytes: offset, buf: IoBuf::zeroed(chunk as usize) };
        let this = Arc::clone(&self);
        self.engine.submit(
            &self.vd,
            request,
            Box::new(move |completion| match completion.result {
                Ok(()) => this.zero_range(offset + chunk, len_bytes - chunk, fua, timed, done),
                Err(error) => timed.answer(Err(io_error(&error)), done),
            }),
        );
    }
}

/// The NBD server holds devices in an `Arc`; write-zeroes needs that `Arc` to chain chunks.
pub struct SharedVdDevice(pub Arc<VdDevice>);

impl BlockDevice for SharedVdDevice {
    type Buf = IoBuf;

    fn size_bytes(&self) -> u64 {
        self.0.vd.capacity_bytes()
    }

    fn block_size_bytes(&self) -> u32 {
        layout::SECTOR_BYTES as u32
    }

    fn alloc(&self, len_bytes: usize) -> IoBuf {
        // Not zeroed: the server fills it from the socket (writes) or the engine does (reads).
        self.0.pool.take(len_bytes)
    }

    /// A flush goes to every member drive, so it covers writes from every connection.
    fn flush_is_global(&self) -> bool {
        true
    }

    /// TRIM is not advertised until storc can deallocate and guarantee zeros afterwards.
    fn supports_trim(&self) -> bool {
        false
    }

    fn read(&self, offset: u64, buf: IoBuf, done: ReadDone<IoBuf>) {
        let timed = Timed::start(&self.0.vd, IoKind::Read, buf.len() as u64);
        let request = VdRequest::Read { offset_bytes: offset, buf };
        self.0.engine.submit(
            &self.0.vd,
            request,
            Box::new(move |completion| match completion.result {
                Ok(()) => timed.answer(Ok(completion.buf.expect("a read returns its buffer")), done),
                Err(error) => timed.answer(Err(io_error(&error)), done),
            }),
        );
    }

    fn write(&self, offset: u64, buf: IoBuf, fua: bool, done: Done) {
        let timed = Timed::start(&self.0.vd, IoKind::Write, buf.len() as u64);
        let device = Arc::clone(&self.0);
        self.0.engine.submit(
            &self.0.vd,
            VdRequest::Write { offset_bytes: offset, buf },
            Box::new(move |completion| match (completion.result, fua) {
                (Ok(()), true) => device.flush_then(timed, done),
                (Ok(()), false) => timed.answer(Ok(()), done),
                (Err(error), _) => timed.answer(Err(io_error(&error)), done),
            }),
        );
    }

    fn flush(&self, done: Done) {
        self.0.flush_then(Timed::start(&self.0.vd, IoKind::Flush, 0), done);
    }

    fn trim(&self, _offset: u64, _len_bytes: u64, done: Done) {
        // Never advertised (supports_trim is false), so a client sending it breaks the protocol.
        done(Err(IoError::Invalid));
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        let timed = Timed::start(&self.0.vd, IoKind::Write, len_bytes);
        Arc::clone(&self.0).zero_range(offset, len_bytes, fua, timed, done);
    }
}
