//! A regular file or block device driven through io_uring.
//!
//! O_DIRECT keeps the page cache out of the measurements and out of the durability argument. It
//! is used whenever the filesystem accepts 512-byte-aligned direct I/O; otherwise (tmpfs, or a
//! device with 4 KiB logical sectors) the drive runs buffered and says so once in the log.

use crate::{check_op_range, Completion, Drive, DriveError, DriveInfo, DriveKind, DriveOp, IoBuf, IoCtx, Token};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The mode of a file created by `create_size_bytes`; the umask can only take bits away.
pub const CREATE_MODE: u32 = 0o600;

#[derive(Clone, Debug, Default)]
pub struct FileDriveConfig {
    /// Create the file (sparse, owner-only) with this size if it does not exist.
    pub create_size_bytes: Option<u64>,
    /// Write zeros over every block of a file it creates instead of leaving it sparse: a
    /// journal's flushes then commit no filesystem metadata for blocks written the first time
    /// (fallocate would not do: its extents stay "unwritten" until their first write, and
    /// converting them is a metadata change that every data sync must commit).
    pub preallocate: bool,
    pub direct_io: DirectIo,
    /// Open with `O_DSYNC`: a write completes once it is durable, in the same device request
    /// where the device has FUA, so no flush needs to follow it. For the journal, whose every
    /// record must be durable before it is acknowledged: a separate flush is a second trip
    /// through the ring, and io_uring runs a flush (fsync) on a worker thread.
    pub durable_writes: bool,
    /// Claim the drive for this process alone, as md claims its members: a regular file by an
    /// exclusive `flock`, a block device by `O_EXCL` (which the kernel refuses while the device
    /// is mounted, an md or LVM member, or so claimed by another process). A controller's
    /// drives must not be assembled by a second one.
    pub exclusive: bool,
}

/// Whether the drive bypasses the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT where the filesystem takes it, buffered with a warning where it does not.
    #[default]
    Auto,
    /// O_DIRECT or an error.
    Required,
    /// Buffered I/O through the page cache.
    Off,
}

pub struct FileDrive {
    file: File,
    path: PathBuf,
    info: DriveInfo,
    durable_writes: bool,
}

impl FileDrive {
    /// # Errors
    /// If the path cannot be opened or created, or is neither a file nor a block device.
    pub fn open(path: &Path, config: &FileDriveConfig) -> io::Result<FileDrive> {
        let context = |e: io::Error| io::Error::new(e.kind(), format!("drive {}: {e}", path.display()));
        if let Some(size) = config.create_size_bytes {
            if !path.exists() {
                // Owner-only whatever the umask: the file will hold VD data of every user of the controller.
                let file = OpenOptions::new().create_new(true).write(true).mode(CREATE_MODE).open(path).map_err(context)?;
                preallocate_or_extend(&file, size, config.preallocate).map_err(context)?;
            }
        }
        let sync_flag = if config.durable_writes { libc::O_DSYNC } else { 0 };
        let block_device = std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
        let exclusive_flag = if config.exclusive && block_device { libc::O_EXCL } else { 0 };
        let open = |flags| OpenOptions::new().read(true).write(true).custom_flags(flags | sync_flag | exclusive_flag).open(path);
        let opened = match exclusive_flag {
            0 => open_direct_or_buffered(open, config.direct_io),
            _ => claim::retrying_while_busy(|| open_direct_or_buffered(open, config.direct_io)),
        };
        let (file, direct_io) = opened.map_err(|e| {
            tracing::debug!(path = %path.display(), "open refused");
            context(claim::name_busy(e))
        })?;
        if config.exclusive && !block_device {
            claim::lock_file(&file).map_err(context)?;
        }
        if config.direct_io == DirectIo::Auto && !direct_io {
            tracing::warn!(path = %path.display(), "O_DIRECT with 512-byte alignment is not supported here; using buffered I/O");
        }
        let metadata = file.metadata().map_err(context)?;
        let (kind, capacity_bytes) = if metadata.file_type().is_block_device() {
            (DriveKind::BlockDevice, block_device_size_bytes(&file).map_err(context)?)
        } else if metadata.is_file() {
            (DriveKind::File, metadata.len())
        } else {
            return Err(context(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device")));
        };
        let capacity_bytes = capacity_bytes - capacity_bytes % crate::SECTOR_BYTES;
        let solid_state = kind == DriveKind::BlockDevice && non_rotational(&metadata);
        let info = DriveInfo { name: path.display().to_string(), kind, capacity_bytes, direct_io, solid_state };
        Ok(FileDrive { file, path: path.to_path_buf(), info, durable_writes: config.durable_writes })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Without a ring (simulator, tests) the drive works synchronously.
    fn submit_sync(&self, ctx: &mut IoCtx, token: Token, mut op: DriveOp) {
        let result = match &mut op {
            DriveOp::Read { offset_bytes, buf } => self.file.read_exact_at(buf.as_mut_slice(), *offset_bytes),
            DriveOp::Write { offset_bytes, buf } => self.file.write_all_at(buf.as_slice(), *offset_bytes),
            DriveOp::ReadV { offset_bytes, bufs } => each_at(*offset_bytes, bufs, |b, at| self.file.read_exact_at(b.as_mut_slice(), at)),
            DriveOp::WriteV { offset_bytes, bufs } => each_at(*offset_bytes, bufs, |b, at| self.file.write_all_at(b.as_slice(), at)),
            DriveOp::Flush => self.file.sync_data(),
        };
        let result = result.map_err(|e| DriveError::Io(e.raw_os_error().unwrap_or(libc::EIO)));
        ctx.complete(Completion::of(token, result, op));
    }
}

/// Claiming a drive for one process (`FileDriveConfig::exclusive`).
mod claim {
    use std::fs::File;
    use std::io;
    use std::time::{Duration, Instant};

    /// How long a claim waits for a holder to let go before it is refused. A process killed
    /// with requests in flight keeps its files open after it is reaped, until the kernel has
    /// torn its io_uring down (asynchronously, once those requests completed): a daemon
    /// restarted at once after a kill -9 would otherwise find its own drives still held.
    const HOLDER_EXIT_WAIT: Duration = Duration::from_secs(5);
    const RETRY_INTERVAL: Duration = Duration::from_millis(20);

    /// `attempt` again while it fails with EBUSY (a block device's `O_EXCL` claim held
    /// elsewhere), for up to [`HOLDER_EXIT_WAIT`].
    pub(super) fn retrying_while_busy<T>(mut attempt: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let started = Instant::now();
        loop {
            match attempt() {
                Err(error) if error.raw_os_error() == Some(libc::EBUSY) && started.elapsed() < HOLDER_EXIT_WAIT => {
                    std::thread::sleep(RETRY_INTERVAL);
                }
                outcome => return outcome,
            }
        }
    }

    /// EBUSY from an exclusive open, said as what it means.
    pub(super) fn name_busy(error: io::Error) -> io::Error {
        if error.raw_os_error() != Some(libc::EBUSY) {
            return error;
        }
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            "in use: mounted, a member of md or LVM, or claimed by another storc serve (opened O_EXCL); a drive belongs to one controller",
        )
    }

    /// An exclusive `flock` on `file` (std's `File::try_lock`), waiting up to
    /// [`HOLDER_EXIT_WAIT`] for a holder to let go; it lasts as long as the file is open.
    pub(super) fn lock_file(file: &File) -> io::Result<()> {
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(()),
                Err(std::fs::TryLockError::Error(error)) => return Err(error),
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() >= HOLDER_EXIT_WAIT => {
                    return Err(io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        "in use by another process, which holds an exclusive lock on it (another storc serve?); a drive belongs to one controller",
                    ));
                }
                Err(std::fs::TryLockError::WouldBlock) => std::thread::sleep(RETRY_INTERVAL),
            }
        }
    }
}

/// Runs `io` on each buffer at its running offset, stopping at the first error.
fn each_at(offset_bytes: u64, bufs: &mut [IoBuf], mut io: impl FnMut(&mut IoBuf, u64) -> io::Result<()>) -> io::Result<()> {
    let mut at = offset_bytes;
    for buf in bufs {
        io(buf, at)?;
        at += buf.len() as u64;
    }
    Ok(())
}

impl Drive for FileDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn writes_durable(&self) -> bool {
        self.durable_writes
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        if !ctx.has_ring() {
            return self.submit_sync(ctx, token, op);
        }
        let fd = self.file.as_raw_fd();
        // SAFETY (all four): the fd belongs to self.file; the engine keeps every drive alive (Arc)
        // for as long as any shard context can have operations in flight on it.
        match op {
            DriveOp::Read { offset_bytes, buf } => unsafe { ctx.push_rw(fd, token, offset_bytes, buf, false) },
            DriveOp::Write { offset_bytes, buf } => unsafe { ctx.push_rw(fd, token, offset_bytes, buf, true) },
            DriveOp::ReadV { offset_bytes, bufs } => unsafe { ctx.push_rwv(fd, token, offset_bytes, bufs, false) },
            DriveOp::WriteV { offset_bytes, bufs } => unsafe { ctx.push_rwv(fd, token, offset_bytes, bufs, true) },
            DriveOp::Flush => ctx.push_flush(fd, token),
        }
    }

    /// A regular file: the range lies in a hole (`SEEK_DATA` finds no data before its end).
    /// A block device is not known to read as zero (a discard does not promise it).
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if self.info.kind != DriveKind::File || len_bytes == 0 {
            return len_bytes == 0;
        }
        let Ok(start) = libc::off_t::try_from(offset_bytes) else { return false };
        // SAFETY: lseek on a file descriptor this drive owns; it reads no memory of ours. It
        // moves the file offset, which nothing else uses (all I/O is positioned).
        let data_at = unsafe { libc::lseek(self.file.as_raw_fd(), start, libc::SEEK_DATA) };
        if data_at < 0 {
            // ENXIO: no data at or after `start` (the rest of the file is a hole).
            return io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        }
        data_at as u64 >= offset_bytes.saturating_add(len_bytes)
    }
}

/// Opens with O_DIRECT if allowed and working, else buffered (unless direct I/O is required).
pub(crate) fn open_direct_or_buffered(open: impl Fn(i32) -> io::Result<File>, mode: DirectIo) -> io::Result<(File, bool)> {
    if mode == DirectIo::Off {
        return Ok((open(0)?, false));
    }
    match open(libc::O_DIRECT) {
        Ok(file) if direct_io_works(&file) => return Ok((file, true)),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => return Err(e),
    }
    if mode == DirectIo::Required {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "O_DIRECT with 512-byte alignment is not supported here"));
    }
    Ok((open(0)?, false))
}

/// Whether a 512-byte direct read at a 512-byte offset is accepted (4 KiB-sector devices refuse).
fn direct_io_works(file: &File) -> bool {
    let mut probe = IoBuf::zeroed(4096);
    let sector = &mut probe.as_mut_slice()[..512];
    match file.read_at(sector, 512) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::EINVAL),
    }
}

/// What the kernel says of a block device's queue (`rotational` 0), by its device number; a
/// partition answers through its disk. Not known: rotational.
fn non_rotational(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = (libc::major(metadata.rdev()), libc::minor(metadata.rdev()));
    let device = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    [device.join("queue/rotational"), device.join("../queue/rotational")]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .is_some_and(|text| text.trim() == "0")
}

fn block_device_size_bytes(file: &File) -> io::Result<u64> {
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live u64.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Gives a new file its size: written with zeros and synced, or sparse.
fn preallocate_or_extend(file: &std::fs::File, size_bytes: u64, preallocate: bool) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if !preallocate {
        return file.set_len(size_bytes);
    }
    const CHUNK_BYTES: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK_BYTES as usize];
    let mut offset = 0;
    while offset < size_bytes {
        let len = CHUNK_BYTES.min(size_bytes - offset) as usize;
        file.write_all_at(&zeros[..len], offset)?;
        offset += len as u64;
    }
    file.sync_all()
}
