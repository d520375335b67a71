//! A virtual drive as an NBD export: the one place where NBD requests become engine requests.

use drive::{BufPool, IoBuf};
use engine::{Engine, VdError, VdRequest, VirtualDrive};
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
    /// What the console's live charts show of this VD.
    pub io: Arc<super::io_stats::VdIoCounters>,
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
        // Only row jobs (rebuild, check) return these; a client request never does.
        VdError::NoRedundancy { .. }
        | VdError::RowOutOfRange { .. }
        | VdError::MemberOutOfRange { .. }
        | VdError::RowUnrecoverable { .. }
        | VdError::RowMemberOut { .. }
        | VdError::RowMemberIo { .. }
        | VdError::CopyEnded { .. } => IoError::Io,
        VdError::Stopped => IoError::ShuttingDown,
    }
}

impl VdDevice {
    /// Flushes after a FUA write: a write-through write is on the members, but their own caches
    /// (page cache, drive cache) must be flushed for it to be durable.
    fn flush_then(&self, done: Done) {
        self.engine.submit(&self.vd, VdRequest::Flush, Box::new(move |c| done(c.result.map_err(|e| io_error(&e)))));
    }

    /// Writes zeros over `[offset, offset + len)` one chunk at a time.
    fn zero_range(self: Arc<Self>, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        if len_bytes == 0 {
            return if fua { self.flush_then(done) } else { done(Ok(())) };
        }
        let chunk = len_bytes.min(ZEROES_CHUNK_BYTES);
        let request = VdRequest::Write { offset_bytes: offset, buf: IoBuf::zeroed(chunk as usize) };
        let this = Arc::clone(&self);
        self.engine.submit(
            &self.vd,
            request,
            Box::new(move |completion| match completion.result {
                Ok(()) => this.zero_range(offset + chunk, len_bytes - chunk, fua, done),
                Err(error) => done(Err(io_error(&error))),
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
        let (len_bytes, io, started) = (buf.len() as u64, Arc::clone(&self.0.io), Instant::now());
        let request = VdRequest::Read { offset_bytes: offset, buf };
        self.0.engine.submit(
            &self.0.vd,
            request,
            Box::new(move |completion| match completion.result {
                Ok(()) => {
                    io.record_read(len_bytes, started.elapsed());
                    done(Ok(completion.buf.expect("a read returns its buffer")))
                }
                Err(error) => done(Err(io_error(&error))),
            }),
        );
    }

    fn write(&self, offset: u64, buf: IoBuf, fua: bool, done: Done) {
        let device = Arc::clone(&self.0);
        let (len_bytes, started) = (buf.len() as u64, Instant::now());
        self.0.engine.submit(
            &self.0.vd,
            VdRequest::Write { offset_bytes: offset, buf },
            Box::new(move |completion| match (completion.result, fua) {
                // A FUA write's time, as its client sees it, includes the flush.
                (Ok(()), true) => {
                    let io = Arc::clone(&device.io);
                    device.flush_then(Box::new(move |result| {
                        if result.is_ok() {
                            io.record_write(len_bytes, started.elapsed());
                        }
                        done(result)
                    }))
                }
                (Ok(()), false) => {
                    device.io.record_write(len_bytes, started.elapsed());
                    done(Ok(()))
                }
                (Err(error), _) => done(Err(io_error(&error))),
            }),
        );
    }

    fn flush(&self, done: Done) {
        self.0.flush_then(done);
    }

    fn trim(&self, _offset: u64, _len_bytes: u64, done: Done) {
        // Never advertised (supports_trim is false), so a client sending it breaks the protocol.
        done(Err(IoError::Invalid));
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done) {
        Arc::clone(&self.0).zero_range(offset, len_bytes, fua, done);
    }
}
