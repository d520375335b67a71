//! Member drives: the `Drive` interface and its backends.
//!
//! A [`Drive`] accepts an operation with a caller-chosen [`Token`] and reports its [`Completion`]
//! later through the per-thread [`IoCtx`] it was submitted on. This is the io_uring shape
//! (`user_data` in, CQE out) and it is the only shape the engine sees, so the same engine code
//! runs over io_uring files, memory drives, emulated drives and the deterministic simulator.
//!
//! Backends:
//! - [`FileDrive`]: a regular file or block device through io_uring, with O_DIRECT where the
//!   filesystem allows it (tmpfs does not: buffered I/O with a logged warning);
//! - [`MemDrive`]: sparse RAM, completes synchronously;
//! - [`FaultyDrive`]: wraps any drive and fails it whole, fails reads or writes in offset ranges,
//!   returns corrupted data or adds latency, switchable at run time.
//! - [`Window`]: a part of another drive (a journal past a slot drive's metadata).
//! - [`RbdDrive`]: an RBD image of a Ceph cluster through librbd's asynchronous API, loaded at
//!   run time (`rbd` module docs: why a thin FFI layer, and which thread runs its callbacks).
//!
//! A backend that lives elsewhere (an NBD export, `nbd::member`, which depends on this crate and
//! not the other way; an RBD image, whose librbd calls back on its own threads) completes through
//! a [`CompletionPort`] from its own threads.
//!
//! This crate is the only place with io_uring `unsafe`, and with librbd's FFI; every `unsafe`
//! block says why it holds.

mod buf;
mod ctx;
mod emulated;
mod faulty;
mod file;
pub mod heap_cache;
mod huge;
mod mem;
mod port;
mod rbd;
mod waker;
mod window;

pub mod testing;

pub use buf::{BufPool, IoBuf, BUF_ALIGN_BYTES};
pub use ctx::{IoCtx, IoCtxConfig};
pub use emulated::{Clock, EmulatedClass, EmulatedDrive, EmulatedDriveSpec, RealClock, VirtualClock};
pub use faulty::{Faults, FaultyDrive};
pub use file::{DirectIo, FileDrive, FileDriveConfig};
pub use huge::{HugePageBuf, HUGE_PAGE_BYTES};
pub use mem::{Backing, MemDrive};
pub use port::CompletionPort;
pub use rbd::{RbdDrive, RbdSpec, RBD_FORM};
pub use waker::ShardWaker;
pub use window::Window;

use std::fmt;

/// Identifies one submitted operation; chosen by the submitter, returned in its completion.
pub type Token = u64;

/// The unit every drive offset and length is aligned to.
pub const SECTOR_BYTES: u64 = 512;

/// One operation on a drive. Buffers move into the operation and come back in the completion.
#[derive(Debug)]
pub enum DriveOp {
    Read {
        offset_bytes: u64,
        buf: IoBuf,
    },
    Write {
        offset_bytes: u64,
        buf: IoBuf,
    },
    /// One read into several buffers, filled in order from `offset_bytes` (readv): lets the
    /// engine merge a drive's contiguous pieces of a request whose VD buffer is not contiguous.
    ReadV {
        offset_bytes: u64,
        bufs: Vec<IoBuf>,
    },
    /// One write from several buffers, in order (writev).
    WriteV {
        offset_bytes: u64,
        bufs: Vec<IoBuf>,
    },
    /// Makes every completed write durable (the drive's own cache included).
    Flush,
}

impl DriveOp {
    pub fn kind(&self) -> OpKind {
        match self {
            DriveOp::Read { .. } | DriveOp::ReadV { .. } => OpKind::Read,
            DriveOp::Write { .. } | DriveOp::WriteV { .. } => OpKind::Write,
            DriveOp::Flush => OpKind::Flush,
        }
    }

    /// `(offset, len)` for reads and writes.
    pub fn range_bytes(&self) -> Option<(u64, u64)> {
        match self {
            DriveOp::Read { offset_bytes, buf } | DriveOp::Write { offset_bytes, buf } => Some((*offset_bytes, buf.len() as u64)),
            DriveOp::ReadV { offset_bytes, bufs } | DriveOp::WriteV { offset_bytes, bufs } => {
                Some((*offset_bytes, bufs.iter().map(|b| b.len() as u64).sum()))
            }
            DriveOp::Flush => None,
        }
    }

    /// The buffers the op carried, to return them in its completion.
    fn into_bufs(self) -> (Option<IoBuf>, Vec<IoBuf>) {
        match self {
            DriveOp::Read { buf, .. } | DriveOp::Write { buf, .. } => (Some(buf), Vec::new()),
            DriveOp::ReadV { bufs, .. } | DriveOp::WriteV { bufs, .. } => (None, bufs),
            DriveOp::Flush => (None, Vec::new()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Read,
    Write,
    Flush,
}

/// Why a drive operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriveError {
    #[error("{}", errno_text(*.0))]
    Io(i32),
    #[error("the drive is gone")]
    Gone,
    #[error(
        "the drive ends inside a read of {len_bytes} bytes at offset {offset_bytes} (only {done_bytes} bytes came back; the file shrank?)"
    )]
    EndOfMedium { offset_bytes: u64, len_bytes: u64, done_bytes: u64 },
    #[error("range {offset_bytes}+{len_bytes} is past the end of the drive ({capacity_bytes} bytes)")]
    OutOfRange { offset_bytes: u64, len_bytes: u64, capacity_bytes: u64 },
    #[error("offset {offset_bytes} or length {len_bytes} is not a multiple of 512 bytes")]
    Misaligned { offset_bytes: u64, len_bytes: u64 },
}

/// What an errno from a drive means to an administrator. ENOSPC from a file drive is the
/// filesystem under it, not the disk: said so, since freeing space is the fix.
fn errno_text(errno: i32) -> String {
    match errno {
        libc::ENOSPC => "backing filesystem full (ENOSPC): the drive is not at fault; free space where its file lives".to_string(),
        _ => format!("I/O error: {}", std::io::Error::from_raw_os_error(errno)),
    }
}

/// The result of one operation; the buffers come back for reads and writes.
#[derive(Debug)]
pub struct Completion {
    pub token: Token,
    pub result: Result<(), DriveError>,
    /// The buffer of a `Read` or `Write`.
    pub buf: Option<IoBuf>,
    /// The buffers of a `ReadV` or `WriteV`, in order.
    pub bufs: Vec<IoBuf>,
}

impl Completion {
    /// Completes `op` with `result`, handing back whatever buffers it carried.
    pub fn of(token: Token, result: Result<(), DriveError>, op: DriveOp) -> Completion {
        let (buf, bufs) = op.into_bufs();
        Completion { token, result, buf, bufs }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriveKind {
    Memory,
    File,
    BlockDevice,
    Emulated,
    /// An export on another machine, reached over a network (`nbd::member`).
    Network,
    /// An RBD image of a Ceph cluster.
    Rbd,
}

/// What a drive is, as reported to the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveInfo {
    /// Where the drive came from (`mem:4GiB`, a path).
    pub name: String,
    pub kind: DriveKind,
    pub capacity_bytes: u64,
    /// Whether data reaches the medium without the page cache (O_DIRECT).
    pub direct_io: bool,
    /// A solid-state drive (an emulated SSD, a block device the kernel calls non-rotational):
    /// patrol read leaves it out unless asked. Files and memory are not.
    pub solid_state: bool,
}

/// A member drive. Shared by every shard thread; each submits on its own [`IoCtx`].
pub trait Drive: Send + Sync {
    fn info(&self) -> &DriveInfo;

    /// Starts `op`; its completion, carrying `token`, is later returned by `ctx.poll`. Never
    /// blocks on the medium. Errors (range, alignment, failed drive) also arrive as completions.
    /// The caller need not keep the drive alive until then (the engine submits under a
    /// member's lock and lets go): the operation holds what its completion needs (the kernel
    /// a file's reference, an emulated drive's model its place in `ctx`), and a drive that
    /// stops its operations when dropped completes them (a network drive fails them, an RBD
    /// image waits for them).
    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp);

    /// Whether every byte of `offset_bytes..offset_bytes + len_bytes` is known to read as zero
    /// without reading it: a hole of a sparse file, memory never written. `false` means
    /// "not known" (a block device, an error asking), never "holds data". The controller asks
    /// when it creates a VD: members that read as zero already have consistent parity, so
    /// background initialization has nothing to do.
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let _ = (offset_bytes, len_bytes);
        false
    }

    /// Whether a write is durable once it completes (a file or device opened `O_DSYNC`), so
    /// that a flush after it adds nothing. `false` unless the drive says so: a wrapper that does
    /// not pass the question on keeps its writes flushed, which is never wrong.
    fn writes_durable(&self) -> bool {
        false
    }

    /// Lets go of what the drive holds outside this process once nothing more will be
    /// submitted (an RBD image's exclusive lock and watch, which would otherwise outlive a
    /// process that exits without dropping it); later operations fail as on a vanished drive.
    /// Blocking: the control plane calls it at shutdown. Nothing to do for most drives.
    fn close(&self) {}
}

impl fmt::Debug for dyn Drive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Drive({})", self.info().name)
    }
}

/// Checks range and alignment; the error a backend completes with when they are wrong.
pub fn check_op_range(op: &DriveOp, capacity_bytes: u64) -> Result<(), DriveError> {
    let Some((offset_bytes, len_bytes)) = op.range_bytes() else { return Ok(()) };
    if offset_bytes % SECTOR_BYTES != 0 || len_bytes % SECTOR_BYTES != 0 {
        return Err(DriveError::Misaligned { offset_bytes, len_bytes });
    }
    if offset_bytes.checked_add(len_bytes).is_none_or(|end| end > capacity_bytes) {
        return Err(DriveError::OutOfRange { offset_bytes, len_bytes, capacity_bytes });
    }
    Ok(())
}

/// Parses sizes the way the CLI accepts them: `4GiB`, `512MiB`, `64KiB`, `4G`, `1048576`.
pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("size {text:?} does not start with a number"))?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        _ => return Err(format!("unknown size unit {unit:?} in {text:?}; allowed: B, KiB, MiB, GiB, TiB")),
    };
    number.checked_mul(multiplier).ok_or_else(|| format!("size {text:?} is too large"))
}

#[cfg(test)]
mod tests;
