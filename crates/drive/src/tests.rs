// The fault lists are lists of ranges, however many a test needs.
#![allow(clippy::single_range_in_vec_init)]

use super::*;
use std::sync::Arc;

/// Submits one op and waits for its completion.
fn run(drive: &dyn Drive, ctx: &mut IoCtx, op: DriveOp) -> Completion {
    drive.submit(ctx, 7, op);
    let mut out = Vec::new();
    while out.is_empty() {
        ctx.poll(&mut out, true);
    }
    assert_eq!(out.len(), 1);
    out.pop().unwrap()
}

fn pattern(len: usize, seed: u8) -> IoBuf {
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    IoBuf::from_slice(&bytes)
}

/// Writes a pattern at two offsets, reads both back, checks a fresh area reads as zeros.
fn check_round_trip(drive: &dyn Drive, ctx: &mut IoCtx) {
    for (offset, seed) in [(0u64, 1u8), (3 * 1024 * 1024 - 4096, 2)] {
        let written = pattern(8192, seed);
        let expected = written.as_slice().to_vec();
        let done = run(drive, ctx, DriveOp::Write { offset_bytes: offset, buf: written });
        assert_eq!(done.result, Ok(()));
        let read = run(drive, ctx, DriveOp::Read { offset_bytes: offset, buf: IoBuf::zeroed(8192) });
        assert_eq!(read.result, Ok(()));
        assert_eq!(read.buf.unwrap().as_slice(), &expected[..], "{} at {offset}", drive.info().name);
    }
    let fresh = run(drive, ctx, DriveOp::Read { offset_bytes: 1 << 20, buf: IoBuf::zeroed(4096) });
    assert!(fresh.buf.unwrap().as_slice().iter().all(|&b| b == 0));
    assert_eq!(run(drive, ctx, DriveOp::Flush).result, Ok(()));
}

#[test]
fn memory_drive_round_trips_across_chunks() {
    let drive = MemDrive::new(4 << 20);
    check_round_trip(&drive, &mut IoCtx::without_ring());
    assert_eq!(drive.allocated_bytes(), 3 * 64 * 1024, "only the three chunks written are allocated");
}

/// A chunk's pages never written read as zeros next to written ones, at sector granularity and
/// across page and chunk boundaries (reads skip the memory of unwritten pages).
#[test]
fn memory_drive_reads_unwritten_pages_of_a_written_chunk_as_zeros() {
    let drive = MemDrive::new(1 << 20);
    let ctx = &mut IoCtx::without_ring();
    // Sectors 7..9 of the second chunk: the end of its page 0 and the start of page 1.
    let written = pattern(1024, 9);
    let at = (64 << 10) + 3584;
    assert_eq!(run(&drive, ctx, DriveOp::Write { offset_bytes: at, buf: pattern(1024, 9) }).result, Ok(()));
    let read = run(&drive, ctx, DriveOp::Read { offset_bytes: 60 << 10, buf: IoBuf::zeroed(16 << 10) });
    let bytes = read.buf.unwrap();
    let start = (at - (60 << 10)) as usize;
    assert!(bytes.as_slice()[..start].iter().all(|&b| b == 0), "the first chunk and page 0's head read zeros");
    assert_eq!(&bytes.as_slice()[start..start + 1024], written.as_slice());
    assert!(bytes.as_slice()[start + 1024..].iter().all(|&b| b == 0), "page 1's rest and pages 2.. read zeros");
}

#[test]
fn file_drive_round_trips_through_io_uring_with_o_direct() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d0");
    let config = FileDriveConfig { create_size_bytes: Some(4 << 20), ..Default::default() };
    let drive = FileDrive::open(&path, &config).unwrap();
    assert_eq!(drive.info().capacity_bytes, 4 << 20);
    assert!(drive.info().direct_io, "/var/tmp on a disk filesystem takes O_DIRECT");
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    check_round_trip(&drive, &mut ctx);
    check_round_trip(&drive, &mut IoCtx::without_ring());
}

/// A drive opened with `durable_writes` (the journal) has `O_DSYNC` on its descriptor, as the
/// kernel reports it, and says so to its users; one opened without it has neither.
#[test]
fn a_file_drive_for_durable_writes_is_opened_o_dsync() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    for durable_writes in [true, false] {
        let path = dir.path().join(format!("d{durable_writes}"));
        let config = FileDriveConfig { create_size_bytes: Some(4 << 20), durable_writes, ..Default::default() };
        let drive = FileDrive::open(&path, &config).unwrap();
        assert_eq!(drive.writes_durable(), durable_writes);
        let flags = open_flags_of(&path).expect("the drive's descriptor is open");
        assert_eq!(flags & libc::O_DSYNC != 0, durable_writes, "{}: flags {flags:o}", path.display());
        let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
        check_round_trip(&drive, &mut ctx);
    }
}

/// The `open(2)` flags of this process's descriptor of `path` (from /proc/self/fdinfo).
fn open_flags_of(path: &std::path::Path) -> Option<i32> {
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(path) {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", entry.file_name().to_str()?)).ok()?;
        let flags = info.lines().find_map(|line| line.strip_prefix("flags:"))?.trim();
        return i32::from_str_radix(flags, 8).ok();
    }
    None
}

/// Regression (issue 8): drive files were created 0644, so any local user could read the VDs' data.
#[test]
fn a_created_drive_file_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d0");
    let config = FileDriveConfig { create_size_bytes: Some(1 << 20), ..Default::default() };
    FileDrive::open(&path, &config).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, file::CREATE_MODE, "{} was created {mode:04o}, not owner-only", path.display());
}

/// A controller's drive file is claimed for its process: a second exclusive open is refused
/// once the holder has not let go within the wait, with an error that says so; an open that
/// claims nothing (the benchmark's) still works; the claim ends when the holder closes.
#[test]
fn an_exclusive_drive_file_is_refused_to_a_second_claim_until_its_holder_closes_it() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d0");
    let exclusive = FileDriveConfig { create_size_bytes: Some(1 << 20), exclusive: true, ..Default::default() };
    let holder = FileDrive::open(&path, &exclusive).unwrap();
    let started = std::time::Instant::now();
    let refused = FileDrive::open(&path, &exclusive).err().expect("a second claim while the first holds the file");
    assert_eq!(refused.kind(), std::io::ErrorKind::ResourceBusy, "{refused}");
    assert!(
        refused.to_string().contains("in use by another process") && refused.to_string().contains("a drive belongs to one controller"),
        "{refused}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(4), "refused without waiting for a holder that may be exiting");
    FileDrive::open(&path, &FileDriveConfig::default()).expect("an open that claims nothing");
    drop(holder);
    FileDrive::open(&path, &exclusive).expect("the claim ended with its holder");
}

/// A block device (a loop device over a file) is claimed with O_EXCL: the second claim gets
/// the kernel's EBUSY, said as what it means.
#[test]
fn an_exclusive_block_device_is_refused_to_a_second_claim() {
    let loop_device = crate::testing::LoopDevice::attach(8 << 20);
    let device = loop_device.path();
    let exclusive = FileDriveConfig { exclusive: true, ..Default::default() };
    let holder = FileDrive::open(device, &exclusive).unwrap();
    assert_eq!(holder.info().kind, DriveKind::BlockDevice);
    let refused = FileDrive::open(device, &exclusive).err().expect("a second O_EXCL claim");
    assert_eq!(refused.kind(), std::io::ErrorKind::ResourceBusy, "{refused}");
    assert!(refused.to_string().contains("opened O_EXCL"), "{refused}");
    drop(holder);
    FileDrive::open(device, &exclusive).expect("the claim ended with its holder");
}

#[test]
fn a_filesystem_that_refuses_o_direct_gets_buffered_io_unless_direct_is_required() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d0");
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    // Stands in for a filesystem without O_DIRECT (older tmpfs): opening with it gives EINVAL.
    let open = |flags: i32| {
        if flags & libc::O_DIRECT != 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        std::fs::OpenOptions::new().read(true).write(true).open(&path)
    };
    let (_, direct) = file::open_direct_or_buffered(open, DirectIo::Auto).unwrap();
    assert!(!direct);
    let error = file::open_direct_or_buffered(open, DirectIo::Required).err().unwrap();
    assert!(error.to_string().contains("O_DIRECT"), "{error}");
    let config = FileDriveConfig { direct_io: DirectIo::Off, ..Default::default() };
    let drive = FileDrive::open(&path, &config).unwrap();
    assert!(!drive.info().direct_io);
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    let done = run(&drive, &mut ctx, DriveOp::Write { offset_bytes: 512, buf: pattern(512, 3) });
    assert_eq!(done.result, Ok(()));
}

#[test]
fn bad_ranges_complete_with_errors_that_name_them() {
    let drive = MemDrive::new(1 << 20);
    let mut ctx = IoCtx::without_ring();
    let past_end = run(&drive, &mut ctx, DriveOp::Read { offset_bytes: 1 << 20, buf: IoBuf::zeroed(512) });
    assert_eq!(past_end.result.unwrap_err().to_string(), "range 1048576+512 is past the end of the drive (1048576 bytes)");
    let misaligned = run(&drive, &mut ctx, DriveOp::Write { offset_bytes: 100, buf: IoBuf::zeroed(512) });
    assert_eq!(misaligned.result.unwrap_err().to_string(), "offset 100 or length 512 is not a multiple of 512 bytes");
}

#[test]
fn faulty_drive_fails_corrupts_and_delays_on_demand() {
    let faulty = FaultyDrive::new(Arc::new(MemDrive::new(1 << 20)));
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    let data = pattern(4096, 9);
    let expected = data.as_slice().to_vec();
    assert_eq!(run(&faulty, &mut ctx, DriveOp::Write { offset_bytes: 0, buf: data }).result, Ok(()));

    faulty.update_faults(|f| f.read_error_ranges = vec![1024..1536]);
    let hit = run(&faulty, &mut ctx, DriveOp::Read { offset_bytes: 0, buf: IoBuf::zeroed(4096) });
    assert_eq!(hit.result, Err(DriveError::Io(libc::EIO)));
    let miss = run(&faulty, &mut ctx, DriveOp::Read { offset_bytes: 2048, buf: IoBuf::zeroed(512) });
    assert_eq!(miss.result, Ok(()));

    faulty.set_faults(Faults { corrupt_read_ranges: vec![512..1024], ..Default::default() });
    let corrupted = run(&faulty, &mut ctx, DriveOp::Read { offset_bytes: 0, buf: IoBuf::zeroed(4096) });
    let bytes = corrupted.buf.unwrap();
    assert_eq!(&bytes.as_slice()[..512], &expected[..512]);
    assert_ne!(&bytes.as_slice()[512..1024], &expected[512..1024]);
    assert_eq!(&bytes.as_slice()[1024..], &expected[1024..]);

    faulty.set_faults(Faults { latency: Some(std::time::Duration::from_millis(30)), ..Default::default() });
    let started = std::time::Instant::now();
    assert_eq!(run(&faulty, &mut ctx, DriveOp::Flush).result, Ok(()));
    assert!(started.elapsed() >= std::time::Duration::from_millis(30));

    faulty.set_failed(true);
    assert_eq!(run(&faulty, &mut ctx, DriveOp::Flush).result, Err(DriveError::Gone));
}

/// A medium error fails reads until a write covers its sectors, as a disk remaps a pending
/// sector; the sectors not written stay unreadable.
#[test]
fn a_medium_error_is_cured_by_a_write_over_it() {
    let faulty = FaultyDrive::new(Arc::new(MemDrive::new(1 << 20)));
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    faulty.set_faults(Faults { medium_error_ranges: vec![1024..2048], ..Default::default() });
    assert!(!faulty.reads_zero(0, 4096), "an unreadable range is not known to read as zero");
    let read = |ctx: &mut IoCtx, offset_bytes| run(&faulty, ctx, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(512) }).result;
    assert_eq!(read(&mut ctx, 1024), Err(DriveError::Io(libc::EIO)));
    assert_eq!(read(&mut ctx, 512), Ok(()));
    let written = pattern(512, 3);
    assert_eq!(run(&faulty, &mut ctx, DriveOp::Write { offset_bytes: 1024, buf: written }).result, Ok(()));
    let cured = run(&faulty, &mut ctx, DriveOp::Read { offset_bytes: 1024, buf: IoBuf::zeroed(512) });
    assert_eq!(cured.result, Ok(()));
    assert_eq!(cured.buf.unwrap().as_slice(), pattern(512, 3).as_slice());
    assert_eq!(read(&mut ctx, 1536), Err(DriveError::Io(libc::EIO)), "the sector not written is still bad");
    assert_eq!(faulty.faults().medium_error_ranges, vec![1536..2048]);
}

#[test]
fn a_waker_interrupts_a_sleeping_poll() {
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    let waker = ctx.waker();
    let thread = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        waker.wake();
    });
    ctx.waker().prepare_sleep();
    let mut out = Vec::new();
    ctx.poll(&mut out, true); // returns once woken, with nothing completed
    assert!(out.is_empty());
    thread.join().unwrap();
}

#[test]
fn sizes_parse_with_units_and_reject_garbage() {
    assert_eq!(parse_size_bytes("4GiB"), Ok(4 << 30));
    assert_eq!(parse_size_bytes("64k"), Ok(64 << 10));
    assert_eq!(parse_size_bytes("512"), Ok(512));
    assert_eq!(parse_size_bytes("4XB").unwrap_err(), "unknown size unit \"XB\" in \"4XB\"; allowed: B, KiB, MiB, GiB, TiB");
}

/// Writes three buffers with one writev at an odd sector, reads them back with one readv.
fn check_vectored_round_trip(drive: &dyn Drive, ctx: &mut IoCtx) {
    let parts = [pattern(4096, 1), pattern(512, 2), pattern(65536, 3)];
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.as_slice().to_vec()).collect();
    let done = run(drive, ctx, DriveOp::WriteV { offset_bytes: 512 * 7, bufs: parts.into() });
    assert_eq!(done.result, Ok(()));
    assert_eq!(done.bufs.len(), 3, "writev returns its buffers");
    let bufs = vec![IoBuf::zeroed(512), IoBuf::zeroed(expected.len() - 512)];
    let read = run(drive, ctx, DriveOp::ReadV { offset_bytes: 512 * 7, bufs });
    assert_eq!(read.result, Ok(()));
    let got: Vec<u8> = read.bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    assert!(got == expected, "{}: readv returns what writev wrote", drive.info().name);
}

#[test]
fn vectored_reads_and_writes_round_trip_on_every_backend() {
    check_vectored_round_trip(&MemDrive::new(1 << 20), &mut IoCtx::without_ring());
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let config = FileDriveConfig { create_size_bytes: Some(1 << 20), ..Default::default() };
    let drive = FileDrive::open(&dir.path().join("d0"), &config).unwrap();
    check_vectored_round_trip(&drive, &mut IoCtx::new(IoCtxConfig::default()).unwrap());
    check_vectored_round_trip(&drive, &mut IoCtx::without_ring());
}

/// Regression: a member file truncated while open read back as zeros past its new end, and a
/// RAID5 served 216 MiB of zeros with no error. Reading past the end is an error now.
#[test]
fn a_read_past_the_end_of_a_shrunken_file_is_an_error_not_zeros() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("d0");
    let config = FileDriveConfig { create_size_bytes: Some(4 << 20), ..Default::default() };
    let drive = FileDrive::open(&path, &config).unwrap();
    let mut ring = IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(run(&drive, &mut ring, DriveOp::Write { offset_bytes: 1 << 20, buf: pattern(1 << 20, 9) }).result, Ok(()));
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len((1 << 20) + 4096).unwrap();
    for ctx in [&mut ring, &mut IoCtx::without_ring()] {
        let read = run(&drive, ctx, DriveOp::Read { offset_bytes: 1 << 20, buf: IoBuf::zeroed(64 << 10) });
        assert!(read.result.is_err(), "a read that crosses the new end fails, got {:?}", read.result);
        let beyond = run(&drive, ctx, DriveOp::Read { offset_bytes: 2 << 20, buf: IoBuf::zeroed(4096) });
        assert!(beyond.result.is_err(), "a read wholly past the new end fails, got {:?}", beyond.result);
    }
    let read = run(&drive, &mut ring, DriveOp::Read { offset_bytes: 1 << 20, buf: IoBuf::zeroed(64 << 10) });
    assert!(
        matches!(read.result, Err(DriveError::EndOfMedium { offset_bytes, done_bytes: 4096, .. }) if offset_bytes == 1 << 20),
        "{:?}",
        read.result
    );
}

/// A ring far smaller than the operations queued on it, never polled while they are queued:
/// the submission queue fills and the completion queue overflows. Submitting must make room
/// (reap, retry) rather than panic, and every operation must complete with its data.
#[test]
fn a_tiny_ring_with_many_queued_operations_completes_them_all() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let config = FileDriveConfig { create_size_bytes: Some(4 << 20), ..Default::default() };
    let drive = FileDrive::open(&dir.path().join("d0"), &config).unwrap();
    let mut ctx = IoCtx::new(IoCtxConfig { ring_entries: 2 }).unwrap();
    let operation_count = 256u64;
    for i in 0..operation_count {
        drive.submit(&mut ctx, i, DriveOp::Write { offset_bytes: i * 4096, buf: pattern(4096, i as u8) });
    }
    let mut done = Vec::new();
    while done.len() < operation_count as usize {
        ctx.poll(&mut done, true);
    }
    assert!(done.iter().all(|c| c.result.is_ok()), "every write succeeds");
    for i in 0..operation_count {
        drive.submit(&mut ctx, i, DriveOp::Read { offset_bytes: i * 4096, buf: IoBuf::zeroed(4096) });
    }
    let mut reads = Vec::new();
    while reads.len() < operation_count as usize {
        ctx.poll(&mut reads, true);
    }
    for read in reads {
        assert_eq!(read.buf.unwrap().as_slice(), pattern(4096, read.token as u8).as_slice(), "read {}", read.token);
    }
}

/// Regression (issue "Keeping redundancy", faults on the data path): a refused io_uring submit
/// panicked the shard. Transient refusals (EAGAIN, EBUSY, EINTR) are retried; a lasting one
/// fails the operation it stopped, and the context keeps working.
#[test]
fn refused_submits_are_retried_or_fail_their_operation_never_panic() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let config = FileDriveConfig { create_size_bytes: Some(4 << 20), ..Default::default() };
    let drive = FileDrive::open(&dir.path().join("d0"), &config).unwrap();
    let mut ctx = IoCtx::new(IoCtxConfig { ring_entries: 2 }).unwrap();
    let queue = |ctx: &mut IoCtx, count: u64| {
        for i in 0..count {
            drive.submit(ctx, i, DriveOp::Write { offset_bytes: i * 4096, buf: pattern(4096, i as u8) });
        }
    };
    let drain = |ctx: &mut IoCtx, count: usize| {
        let mut done = Vec::new();
        while done.len() < count {
            ctx.poll(&mut done, true);
        }
        done
    };
    // Transient: the third and later pushes find the queue full and the kernel busy a while.
    ctx.inject_submit_errors(&[libc::EAGAIN, libc::EBUSY, libc::EINTR]);
    queue(&mut ctx, 8);
    assert!(drain(&mut ctx, 8).iter().all(|c| c.result.is_ok()), "transient refusals are retried");
    // Lasting: the push that needs a submit fails its own operation, with the errno.
    ctx.inject_submit_errors(&[libc::EBADF]);
    queue(&mut ctx, 3);
    let done = drain(&mut ctx, 3);
    let failed: Vec<_> = done.iter().filter(|c| c.result.is_err()).collect();
    assert_eq!(failed.len(), 1, "{done:?}");
    assert_eq!(failed[0].result, Err(DriveError::Io(libc::EBADF)));
    assert!(failed[0].buf.is_some(), "a failed operation still hands its buffer back");
    // A refused submit while polling is reported and retried by the next poll.
    queue(&mut ctx, 1);
    ctx.inject_submit_errors(&[libc::ENOMEM]);
    assert!(drain(&mut ctx, 1)[0].result.is_ok());
}

/// Regression: io_uring completes the work it cannot start a worker thread for with ECANCELED
/// (a pids cgroup or `ulimit -u` reached), and storc took that for the drive's error: every
/// member of a RAID5 failed at once. Operations handed back unexecuted (ECANCELED, EAGAIN) are
/// submitted again after a backoff and succeed; a real error still fails at once.
#[test]
fn operations_handed_back_unexecuted_are_retried_and_real_errors_are_not() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let config = FileDriveConfig { create_size_bytes: Some(4 << 20), ..Default::default() };
    let drive = FileDrive::open(&dir.path().join("d0"), &config).unwrap();
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    ctx.inject_cqe_errors(&[libc::ECANCELED, libc::ECANCELED, libc::EAGAIN]);
    let write = run(&drive, &mut ctx, DriveOp::Write { offset_bytes: 8192, buf: pattern(8192, 7) });
    assert!(write.result.is_ok(), "{:?}", write.result);
    ctx.inject_cqe_errors(&[libc::ECANCELED]);
    assert!(run(&drive, &mut ctx, DriveOp::Flush).result.is_ok(), "a flush handed back is run again");
    ctx.inject_cqe_errors(&[libc::ECANCELED]);
    let read = run(&drive, &mut ctx, DriveOp::Read { offset_bytes: 8192, buf: IoBuf::zeroed(8192) });
    assert_eq!(read.buf.unwrap().as_slice(), pattern(8192, 7).as_slice(), "a read handed back is run again");
    ctx.inject_cqe_errors(&[libc::EIO]);
    let failed = run(&drive, &mut ctx, DriveOp::Write { offset_bytes: 0, buf: pattern(4096, 1) });
    assert_eq!(failed.result, Err(DriveError::Io(libc::EIO)), "a drive's error is not retried");
    assert_eq!(ctx.in_flight(), 0);
}

#[test]
fn errors_say_what_an_administrator_can_do_about_them() {
    assert_eq!(
        DriveError::Io(libc::ENOSPC).to_string(),
        "backing filesystem full (ENOSPC): the drive is not at fault; free space where its file lives"
    );
    assert_eq!(DriveError::Io(libc::EIO).to_string(), "I/O error: Input/output error (os error 5)");
}

#[test]
fn a_window_is_the_part_of_its_drive_past_its_offset_and_nothing_else() {
    let inner: Arc<dyn Drive> = Arc::new(MemDrive::new(8 << 20));
    let window = Window::from_offset(Arc::clone(&inner), 4 << 20).unwrap();
    assert_eq!(window.info().capacity_bytes, 4 << 20);
    let mut ctx = IoCtx::without_ring();
    check_round_trip(&window, &mut ctx);
    // What the window wrote at its offset 0 is at the drive's offset 4 MiB; the drive's own
    // first MiBs are untouched.
    let under = run(&*inner, &mut ctx, DriveOp::Read { offset_bytes: 4 << 20, buf: IoBuf::zeroed(8192) });
    assert_eq!(under.buf.unwrap().as_slice(), pattern(8192, 1).as_slice());
    let before = run(&*inner, &mut ctx, DriveOp::Read { offset_bytes: 0, buf: IoBuf::zeroed(4 << 20) });
    assert!(before.buf.unwrap().as_slice().iter().all(|&b| b == 0));
    // Nothing reaches past its end, and an offset that would wrap is refused, not shifted.
    let past = run(&window, &mut ctx, DriveOp::Write { offset_bytes: (4 << 20) - 4096, buf: IoBuf::zeroed(8192) });
    assert!(matches!(past.result, Err(DriveError::OutOfRange { .. })), "{:?}", past.result);
    let wrap = run(&window, &mut ctx, DriveOp::Read { offset_bytes: u64::MAX - 4095, buf: IoBuf::zeroed(4096) });
    assert!(matches!(wrap.result, Err(DriveError::OutOfRange { .. })), "{:?}", wrap.result);
    assert!(Window::from_offset(Arc::clone(&inner), 8 << 20).is_err(), "an empty window");
    assert!(Window::from_offset(inner, 100).is_err(), "an unaligned window");
}

/// A drive whose operations a thread of its own completes after `delay`: the shape of a
/// network drive, whose replies a reader thread receives.
struct ThreadedDrive {
    info: DriveInfo,
    delay: std::time::Duration,
}

impl Drive for ThreadedDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        let port = ctx.remote_completion();
        let delay = self.delay;
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            port.complete(Completion::of(token, Ok(()), op));
        });
    }
}

fn threaded_drive(delay_ms: u64) -> ThreadedDrive {
    let info =
        DriveInfo { name: "threaded".into(), kind: DriveKind::Network, capacity_bytes: 1 << 20, direct_io: true, solid_state: false };
    ThreadedDrive { info, delay: std::time::Duration::from_millis(delay_ms) }
}

/// A context sleeping in its ring wakes for a completion another thread pushes into its port,
/// and counts the operation in flight until then; a context without a ring waits for it too.
#[test]
fn completions_from_another_thread_wake_a_sleeping_context() {
    let drive = threaded_drive(50);
    for mut ctx in [IoCtx::new(IoCtxConfig::default()).unwrap(), IoCtx::without_ring()] {
        let started = std::time::Instant::now();
        drive.submit(&mut ctx, 3, DriveOp::Write { offset_bytes: 0, buf: IoBuf::zeroed(4096) });
        drive.submit(&mut ctx, 4, DriveOp::Flush);
        assert_eq!(ctx.in_flight(), 2);
        let mut out = Vec::new();
        while out.len() < 2 {
            ctx.poll(&mut out, true);
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "a completion from another thread was never seen");
        }
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        let mut tokens: Vec<Token> = out.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, [3, 4]);
        assert_eq!(out.iter().find(|c| c.token == 3).unwrap().buf.as_ref().map(IoBuf::len), Some(4096), "the buffer comes back");
        assert_eq!(ctx.in_flight(), 0);
    }
}

/// A shard's loop (`prepare_sleep`, then a waiting `poll`) is woken by a push from another
/// thread many times in a row: no wake-up is lost between the last look and the sleep.
#[test]
fn port_wake_ups_are_not_lost_in_a_shard_loop() {
    let drive = threaded_drive(0);
    let mut ctx = IoCtx::new(IoCtxConfig::default()).unwrap();
    let waker = ctx.waker();
    let mut out = Vec::new();
    for round in 0..500u64 {
        drive.submit(&mut ctx, round, DriveOp::Flush);
        while out.is_empty() {
            waker.prepare_sleep();
            ctx.poll(&mut out, true);
            waker.cancel_sleep();
        }
        assert_eq!(out.pop().unwrap().token, round);
    }
}
