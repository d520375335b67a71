//! NBD exports as member drives (`nbd::member::NbdDrive`) against nbdkit: data round trips
//! through a shard-like context (ring, completions from the link's reader thread), operations
//! larger than the export's largest request, a stalled server (nbdkit's pause filter) failing
//! requests within the timeout and the link coming back, a drop that never hangs, and opens
//! that must be refused.

use drive::{Completion, Drive, DriveError, DriveKind, DriveOp, IoBuf, IoCtx, IoCtxConfig};
use nbd::member::{MemberSpec, NbdDrive};
use nbd::testing::Nbdkit;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn spec_for(nbdkit: &Nbdkit, timeout: &str) -> MemberSpec {
    MemberSpec::parse(&format!("nbd+unix:///?socket={}&timeout={timeout}", nbdkit.socket_path().display())).unwrap()
}

fn pattern(len: usize, seed: u64) -> IoBuf {
    let bytes: Vec<u8> = (0..len).map(|i| ((i as u64 * 31 + seed * 7) % 251) as u8).collect();
    IoBuf::from_slice(&bytes)
}

/// Submits `op` on `ctx` and waits (sleeping in the ring) for its completion.
fn run(drive: &dyn Drive, ctx: &mut IoCtx, op: DriveOp) -> Completion {
    drive.submit(ctx, 9, op);
    let started = Instant::now();
    let mut out = Vec::new();
    while out.is_empty() {
        ctx.poll(&mut out, true);
        assert!(started.elapsed() < Duration::from_secs(60), "no completion within a minute");
    }
    out.pop().unwrap()
}

#[test]
fn a_member_reads_back_what_it_wrote_in_every_operation_shape() {
    let nbdkit = Nbdkit::start(&["memory", "64M"]);
    let drive = NbdDrive::open(&spec_for(&nbdkit, "5s")).expect("open the member");
    assert_eq!(drive.info().capacity_bytes, 64 * MIB as u64);
    assert_eq!(drive.info().kind, DriveKind::Network);
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    let written = run(&drive, ctx, DriveOp::Write { offset_bytes: 4096, buf: pattern(MIB, 1) });
    assert_eq!(written.result, Ok(()));
    assert_eq!(written.buf.unwrap().len(), MIB, "the written buffer comes back");
    let bufs = vec![pattern(8192, 2), pattern(512, 3), pattern(65536, 4)];
    assert_eq!(run(&drive, ctx, DriveOp::WriteV { offset_bytes: 8 * MIB as u64, bufs }).result, Ok(()));
    assert_eq!(run(&drive, ctx, DriveOp::Flush).result, Ok(()));
    let read = run(&drive, ctx, DriveOp::Read { offset_bytes: 4096, buf: IoBuf::zeroed(MIB) });
    assert_eq!(read.buf.unwrap().as_slice(), pattern(MIB, 1).as_slice());
    let bufs = vec![IoBuf::zeroed(8192), IoBuf::zeroed(512), IoBuf::zeroed(65536)];
    let read = run(&drive, ctx, DriveOp::ReadV { offset_bytes: 8 * MIB as u64, bufs });
    assert_eq!(read.result, Ok(()));
    for (buf, seed) in read.bufs.iter().zip(2..) {
        assert_eq!(buf.as_slice(), pattern(buf.len(), seed).as_slice());
    }
    let past_end = run(&drive, ctx, DriveOp::Read { offset_bytes: 64 * MIB as u64, buf: IoBuf::zeroed(4096) });
    assert!(matches!(past_end.result, Err(DriveError::OutOfRange { .. })), "{:?}", past_end.result);
    assert_eq!(drive.link_status().connections, 1);
}

/// Many operations in flight at once from one context, replies in any order.
#[test]
fn many_operations_in_flight_each_complete_once() {
    let nbdkit = Nbdkit::start(&["memory", "64M"]);
    let drive = NbdDrive::open(&spec_for(&nbdkit, "5s")).unwrap();
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    for token in 0..256u64 {
        drive.submit(ctx, token, DriveOp::Write { offset_bytes: token * 65536, buf: pattern(65536, token) });
    }
    let mut out = Vec::new();
    while out.len() < 256 {
        ctx.poll(&mut out, true);
    }
    let mut tokens: Vec<u64> = out.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, (0..256).collect::<Vec<_>>());
    assert!(out.iter().all(|c| c.result == Ok(())));
    for token in (0..256u64).step_by(37) {
        let read = run(&drive, ctx, DriveOp::Read { offset_bytes: token * 65536, buf: IoBuf::zeroed(65536) });
        assert_eq!(read.buf.unwrap().as_slice(), pattern(65536, token).as_slice(), "block {token}");
    }
}

/// An export whose largest request is 64 KiB gets a 1 MiB operation as sixteen requests, and
/// the operation completes once, its buffer whole.
#[test]
fn operations_larger_than_the_exports_largest_request_are_cut() {
    let nbdkit = Nbdkit::start(&["--filter=blocksize-policy", "memory", "16M", "blocksize-maximum=64K", "blocksize-error-policy=error"]);
    let drive = NbdDrive::open(&spec_for(&nbdkit, "5s")).unwrap();
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(run(&drive, ctx, DriveOp::Write { offset_bytes: 512, buf: pattern(MIB, 5) }).result, Ok(()));
    let bufs = vec![IoBuf::zeroed(100 * 1024), IoBuf::zeroed(MIB - 100 * 1024)];
    let read = run(&drive, ctx, DriveOp::ReadV { offset_bytes: 512, bufs });
    assert_eq!(read.result, Ok(()));
    let joined: Vec<u8> = read.bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    assert_eq!(joined, pattern(MIB, 5).as_slice());
}

/// nbdkit's pause filter, controlled over its socket.
struct Pause {
    control: PathBuf,
}

impl Pause {
    fn send(&self, command: u8) {
        let mut socket = UnixStream::connect(&self.control).expect("connect to the pause control socket");
        socket.write_all(&[command]).unwrap();
        let mut answer = [0u8; 1];
        socket.read_exact(&mut answer).unwrap();
        assert_eq!(answer[0], command.to_ascii_uppercase(), "the pause filter answered {:?}", answer[0] as char);
    }
}

fn paused_nbdkit(dir: &Path) -> (Nbdkit, Pause) {
    let control = dir.join("pause.sock");
    let argument = format!("pause-control={}", control.display());
    let nbdkit = Nbdkit::start(&["--filter=pause", "memory", "16M", &argument]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !control.exists() {
        assert!(Instant::now() < deadline, "nbdkit made no pause control socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (nbdkit, Pause { control })
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("storc-member-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server that stops answering: the request in flight fails within the timeout (not
/// before), the link goes down, operations fail at once meanwhile, and when the server answers
/// again the supervisor's new connection serves them.
#[test]
fn a_stalled_server_fails_requests_after_the_timeout_and_the_link_comes_back() {
    let dir = scratch_dir("stall");
    let (_nbdkit, pause) = paused_nbdkit(&dir);
    let drive = NbdDrive::open(&spec_for(&_nbdkit, "1s")).unwrap();
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(run(&drive, ctx, DriveOp::Write { offset_bytes: 0, buf: pattern(4096, 1) }).result, Ok(()));
    pause.send(b'p');
    let started = Instant::now();
    let stalled = run(&drive, ctx, DriveOp::Write { offset_bytes: 0, buf: pattern(4096, 2) });
    let waited = started.elapsed();
    assert_eq!(stalled.result, Err(DriveError::Gone));
    assert_eq!(stalled.buf.map(|b| b.len()), Some(4096), "the buffer comes back with the error");
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(3), "failed after {waited:?}; the timeout is 1 s");
    let status = drive.link_status();
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("no reply within 1 s")), "{status:?}");
    pause.send(b'r');
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = drive.link_status();
        if status.connected && status.connections >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the link did not come back: {status:?}");
        let down = run(&drive, ctx, DriveOp::Read { offset_bytes: 0, buf: IoBuf::zeroed(4096) });
        assert!(down.result.is_err() || drive.link_status().connected, "a read on a down link fails at once");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(run(&drive, ctx, DriveOp::Write { offset_bytes: 8192, buf: pattern(4096, 3) }).result, Ok(()));
    let read = run(&drive, ctx, DriveOp::Read { offset_bytes: 8192, buf: IoBuf::zeroed(4096) });
    assert_eq!(read.buf.unwrap().as_slice(), pattern(4096, 3).as_slice());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Dropping a drive whose server hangs with requests in flight: the requests complete with an
/// error and the drop returns (every thread joined) without waiting for the server.
#[test]
fn dropping_a_member_with_requests_stuck_in_flight_does_not_hang() {
    let dir = scratch_dir("drop");
    let (nbdkit, pause) = paused_nbdkit(&dir);
    let drive = NbdDrive::open(&spec_for(&nbdkit, "30s")).unwrap();
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    pause.send(b'p');
    for token in 0..8 {
        drive.submit(ctx, token, DriveOp::Write { offset_bytes: token * 4096, buf: pattern(4096, token) });
    }
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    drop(drive);
    assert!(started.elapsed() < Duration::from_secs(5), "the drop took {:?}", started.elapsed());
    let mut out = Vec::new();
    while out.len() < 8 {
        ctx.poll(&mut out, true);
    }
    assert!(out.iter().all(|c| c.result == Err(DriveError::Gone)), "{:?}", out.iter().map(|c| &c.result).collect::<Vec<_>>());
    assert_eq!(ctx.in_flight(), 0);
    // Not resumed: nbdkit is killed when `nbdkit` drops. Resumed, it would answer the requests
    // of the connection the drop closed, and nbdkit aborts on that at times (connections.c,
    // "Assertion `sock >= 0' failed") before it acknowledges the resume, which failed this test.
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exports_a_member_cannot_use_are_refused_with_the_spec_named() {
    let missing = MemberSpec::parse("nbd+unix:///x?socket=/nonexistent/storc.sock&timeout=2s").unwrap();
    let error = NbdDrive::open(&missing).err().expect("no server");
    assert!(
        error.starts_with("--drive nbd+unix:///x?socket=/nonexistent/storc.sock&timeout=2s: cannot connect (timeout 2 s): "),
        "{error}"
    );
    let read_only = Nbdkit::start(&["-r", "memory", "16M"]);
    let error = NbdDrive::open(&spec_for(&read_only, "2s")).err().expect("a read-only export");
    assert!(error.contains("is read-only; a member must take writes"), "{error}");
    let big_blocks = Nbdkit::start(&["--filter=blocksize-policy", "memory", "16M", "blocksize-minimum=4096"]);
    let error = NbdDrive::open(&spec_for(&big_blocks, "2s")).err().expect("4 KiB blocks");
    assert!(error.contains("needs blocks of 4096 bytes; storc writes 512-byte sectors"), "{error}");
}
