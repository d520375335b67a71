//! RBD drives against a real single-node Ceph cluster (`drive::testing::CephCluster`): data
//! round trips, flush, concurrency from two shards' contexts, and the errors a person sees
//! (missing image, pool or conf, a cluster that does not answer, an image removed or a pool
//! deleted under an open drive).

use drive::testing::{CephCluster, POOL};
use drive::{Completion, Drive, DriveError, DriveOp, IoBuf, IoCtx, IoCtxConfig, RbdDrive, RbdSpec};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn open(cluster: &CephCluster, image: &str) -> RbdDrive {
    RbdDrive::open(&RbdSpec::parse(&cluster.spec_text(image)).unwrap()).unwrap_or_else(|e| panic!("{e}"))
}

fn open_error(spec_text: &str) -> String {
    match RbdDrive::open(&RbdSpec::parse(spec_text).unwrap()) {
        Ok(_) => panic!("rbd:{spec_text} opened"),
        Err(message) => message,
    }
}

/// Submits one op and polls (sleeping) until it completes; a minute at most.
fn run(drive: &dyn Drive, ctx: &mut IoCtx, op: DriveOp) -> Completion {
    drive.submit(ctx, 7, op);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.is_empty() {
        assert!(Instant::now() < deadline, "no completion from {} within a minute", drive.info().name);
        ctx.poll(&mut out, true);
    }
    assert_eq!(out.len(), 1);
    assert_eq!(ctx.in_flight(), 0);
    out.pop().unwrap()
}

fn pattern(len: usize, seed: u64) -> IoBuf {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    IoBuf::from_slice(&bytes)
}

fn write(drive: &dyn Drive, ctx: &mut IoCtx, offset_bytes: u64, buf: IoBuf) -> Result<(), DriveError> {
    run(drive, ctx, DriveOp::Write { offset_bytes, buf }).result
}

fn read(drive: &dyn Drive, ctx: &mut IoCtx, offset_bytes: u64, len: usize) -> Result<Vec<u8>, DriveError> {
    let done = run(drive, ctx, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len) });
    done.result.map(|()| done.buf.expect("a read's buffer comes back").as_slice().to_vec())
}

/// Writes and reads back single and vectored buffers, reads a never-written area as zeros,
/// flushes; `reads_zero` follows what was written.
fn check_round_trip(drive: &RbdDrive, ctx: &mut IoCtx) {
    assert!(drive.reads_zero(0, drive.info().capacity_bytes), "a new image reads as zero");
    for (offset, seed) in [(0u64, 1u64), (5 * MIB - 4096, 2), (drive.info().capacity_bytes - 65536, 3)] {
        let data = pattern(65536, seed);
        let expected = data.as_slice().to_vec();
        assert_eq!(write(drive, ctx, offset, data), Ok(()));
        assert_eq!(read(drive, ctx, offset, 65536).unwrap(), expected, "read back at {offset}");
    }
    assert!(!drive.reads_zero(0, 4096), "written data is not zero");
    let parts = vec![pattern(4096, 4), pattern(512, 5), pattern(131072, 6)];
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.as_slice().to_vec()).collect();
    let done = run(drive, ctx, DriveOp::WriteV { offset_bytes: 9 * MIB + 512 * 7, bufs: parts });
    assert_eq!((done.result, done.bufs.len()), (Ok(()), 3), "writev hands its three buffers back");
    let bufs = vec![IoBuf::zeroed(512), IoBuf::zeroed(135168)];
    let done = run(drive, ctx, DriveOp::ReadV { offset_bytes: 9 * MIB + 512 * 7, bufs });
    assert_eq!(done.result, Ok(()));
    let got: Vec<u8> = done.bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    assert_eq!(got, expected, "readv returns what writev wrote");
    assert!(read(drive, ctx, 20 * MIB, 8192).unwrap().iter().all(|&b| b == 0), "never written reads as zero");
    assert_eq!(run(drive, ctx, DriveOp::Flush).result, Ok(()));
}

#[test]
fn data_round_trips_through_a_ring_context_and_a_ringless_one() {
    let cluster = CephCluster::shared();
    cluster.create_image("round-trip-ring", 64 * MIB);
    cluster.create_image("round-trip-plain", 64 * MIB);
    let drive = open(&cluster, "round-trip-ring");
    assert_eq!(drive.info().capacity_bytes, 64 * MIB);
    assert_eq!(drive.info().kind, drive::DriveKind::Rbd);
    assert_eq!(drive.info().name, format!("rbd:{POOL}/round-trip-ring"));
    check_round_trip(&drive, &mut IoCtx::new(IoCtxConfig::default()).unwrap());
    // A context without a ring sleeps on its inbox instead.
    check_round_trip(&open(&cluster, "round-trip-plain"), &mut IoCtx::without_ring());
    // What a closed and reopened image holds is what was written.
    drop(drive);
    let reopened = open(&cluster, "round-trip-ring");
    assert_eq!(read(&reopened, &mut IoCtx::without_ring(), 0, 65536).unwrap(), pattern(65536, 1).as_slice());
}

#[test]
fn out_of_range_and_misaligned_operations_fail_without_reaching_librbd() {
    let cluster = CephCluster::shared();
    cluster.create_image("range", 8 * MIB);
    let drive = open(&cluster, "range");
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert!(matches!(write(&drive, ctx, 8 * MIB, pattern(4096, 1)), Err(DriveError::OutOfRange { .. })));
    assert!(matches!(read(&drive, ctx, 100, 512), Err(DriveError::Misaligned { .. })));
}

/// Two shards' contexts keep 16 operations each in flight on one image, each shard in its own
/// region, while both sleep in `poll`: every completion reaches the context that submitted it,
/// and everything reads back.
#[test]
fn two_shards_keep_many_operations_in_flight_on_one_image() {
    let cluster = CephCluster::shared();
    cluster.create_image("two-shards", 64 * MIB);
    let drive = std::sync::Arc::new(open(&cluster, "two-shards"));
    let shards: Vec<_> = (0..2u64)
        .map(|shard| {
            let drive = std::sync::Arc::clone(&drive);
            std::thread::spawn(move || shard_workload(&*drive, shard))
        })
        .collect();
    for shard in shards {
        shard.join().expect("a shard's workload");
    }
}

fn shard_workload(drive: &dyn Drive, shard: u64) {
    const BLOCKS: u64 = 256;
    const BLOCK_BYTES: usize = 65536;
    const QUEUE_DEPTH: u64 = 16;
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    let base = shard * 32 * MIB;
    let offset = |block: u64| base + block * BLOCK_BYTES as u64;
    let seed = |block: u64| shard * 1000 + block;
    // Writes, then reads, QUEUE_DEPTH at a time; tokens are block numbers.
    for writing in [true, false] {
        let mut next = 0;
        let mut in_flight = HashMap::new();
        let mut out = Vec::new();
        while next < BLOCKS || !in_flight.is_empty() {
            while next < BLOCKS && in_flight.len() < QUEUE_DEPTH as usize {
                let op = match writing {
                    true => DriveOp::Write { offset_bytes: offset(next), buf: pattern(BLOCK_BYTES, seed(next)) },
                    false => DriveOp::Read { offset_bytes: offset(next), buf: IoBuf::zeroed(BLOCK_BYTES) },
                };
                drive.submit(ctx, next, op);
                in_flight.insert(next, ());
                next += 1;
            }
            ctx.poll(&mut out, true);
            for done in out.drain(..) {
                assert!(in_flight.remove(&done.token).is_some(), "shard {shard}: token {} is not one of ours", done.token);
                assert_eq!(done.result, Ok(()), "shard {shard} block {}", done.token);
                if !writing {
                    let expected = pattern(BLOCK_BYTES, seed(done.token));
                    assert!(done.buf.unwrap().as_slice() == expected.as_slice(), "shard {shard} block {} read back", done.token);
                }
            }
        }
    }
    assert_eq!(ctx.in_flight(), 0);
}

#[test]
fn opening_what_is_not_there_says_what_was_tried() {
    let cluster = CephCluster::shared();
    let conf = cluster.conf().display().to_string();
    let message = open_error(&format!("{POOL}/no-such-image?conf={conf}"));
    assert!(
        message.contains("image rbd/no-such-image does not exist (create it with: rbd create --size 8G rbd/no-such-image)"),
        "{message}"
    );
    let message = open_error(&format!("no-such-pool/disk?conf={conf}"));
    assert!(message.contains("pool \"no-such-pool\" does not exist"), "{message}");
    let message = open_error("rbd/disk?conf=/no/such/ceph.conf");
    assert!(message.contains("conf /no/such/ceph.conf is not a file"), "{message}");
    let message = open_error(&format!("rbd/disk?conf={conf}&id=nobody"));
    assert!(message.contains("cannot connect to the Ceph cluster as client.nobody"), "{message}");
    // Monitors that do not answer: a port nothing listens on; the conf's own mount timeout
    // (2 s) is kept.
    let dir = tempfile::tempdir().unwrap();
    let dead_conf = dir.path().join("dead.conf");
    std::fs::write(&dead_conf, "[global]\nmon host = 127.0.0.1:9\nclient mount timeout = 2\nauth client required = none\n").unwrap();
    let started = Instant::now();
    let message = open_error(&format!("rbd/disk?conf={}", dead_conf.display()));
    assert!(message.contains("cannot connect to the Ceph cluster as client.admin"), "{message}");
    assert!(message.contains("127.0.0.1:9"), "names the monitors asked: {message}");
    assert!(started.elapsed() < Duration::from_secs(30), "gave up after {:?}", started.elapsed());
}

/// An image removed under an open drive (its client blocklisted first, as `rbd rm` demands):
/// operations fail as a vanished drive's do, and keep failing without reaching librbd.
#[test]
fn an_image_removed_under_an_open_drive_fails_as_a_vanished_drive() {
    let cluster = CephCluster::shared();
    cluster.create_image("doomed-image", 16 * MIB);
    let drive = open(&cluster, "doomed-image");
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 1)), Ok(()));
    cluster.remove_image_in_use("doomed-image");
    assert_eq!(write(&drive, ctx, 4096, pattern(4096, 2)), Err(DriveError::Gone));
    assert_eq!(read(&drive, ctx, 0, 4096), Err(DriveError::Gone));
    assert_eq!(run(&drive, ctx, DriveOp::Flush).result, Err(DriveError::Gone));
}

/// A pool deleted under an open drive: the same.
#[test]
fn a_pool_deleted_under_an_open_drive_fails_as_a_vanished_drive() {
    let cluster = CephCluster::shared();
    cluster.create_pool("doomed-pool");
    cluster.run("rbd", &["create", "--size", "16M", "doomed-pool/disk"]);
    let spec = RbdSpec::parse(&format!("doomed-pool/disk?conf={}", cluster.conf().display())).unwrap();
    let drive = RbdDrive::open(&spec).unwrap();
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 1)), Ok(()));
    cluster.delete_pool("doomed-pool");
    // The client learns of the deletion with the next OSD map.
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        match write(&drive, ctx, 4096, pattern(4096, 2)) {
            Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => break other,
        }
    };
    assert_eq!(error, Err(DriveError::Gone));
    assert_eq!(read(&drive, ctx, 0, 4096), Err(DriveError::Gone));
}

/// `close` lets go of the image at once (no watcher left, so `rbd rm` works without waiting
/// for a watch to time out); operations after it fail as on a vanished drive.
#[test]
fn close_releases_the_image_and_later_operations_fail() {
    let cluster = CephCluster::shared();
    cluster.create_image("closing", 8 * MIB);
    let drive = open(&cluster, "closing");
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 1)), Ok(()));
    assert!(cluster.run("rbd", &["status", "--format", "json", "rbd/closing"]).contains("\"address\""), "open: a watcher");
    drive.close();
    let status = cluster.run("rbd", &["status", "--format", "json", "rbd/closing"]);
    assert!(!status.contains("\"address\""), "closed: no watcher left: {status}");
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 2)), Err(DriveError::Gone));
    assert!(!drive.reads_zero(0, 4096), "not known once closed");
    cluster.run("rbd", &["rm", "--no-progress", "rbd/closing"]);
}

/// The cluster's conf with librados' OSD timeout set to `osd_op_timeout_s`, written in `dir`.
fn client_conf(cluster: &CephCluster, dir: &std::path::Path, osd_op_timeout_s: u32) -> std::path::PathBuf {
    let conf = dir.join("client.conf");
    let text = std::fs::read_to_string(cluster.conf()).unwrap();
    std::fs::write(&conf, format!("{text}\n[client]\nrados osd op timeout = {osd_op_timeout_s}\n")).unwrap();
    conf
}

/// Sends `signal` (`-STOP`, `-CONT`) to every OSD of the cluster, as a host that hangs and comes back.
fn signal_osds(cluster: &CephCluster, signal: &str) {
    let osds = cluster.osd_pids();
    assert!(!osds.is_empty(), "the cluster has an OSD");
    for pid in &osds {
        let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// A write librbd holds past the drive's `timeout=` whatever the reason (here an OSD stopped
/// with librados' own timeout set far away, as librbd's lock waits are not covered by it at
/// all): the drive's watch completes it as Gone after about the timeout, later operations fail
/// at once, and closing the drive still waits for librbd to let go of the write once the OSD
/// answers again.
#[test]
fn a_write_librbd_holds_past_the_timeout_fails_the_drive_as_gone() {
    let (cluster, _dir, drive) = drive_on_own_cluster("held", 600, "&timeout=3s");
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 1)), Ok(()));
    let signal = |name: &str| signal_osds(&cluster, name);
    signal("-STOP");
    let started = Instant::now();
    let held = write(&drive, ctx, 4096, pattern(4096, 2));
    let waited = started.elapsed();
    let later = write(&drive, ctx, 8192, pattern(4096, 3));
    signal("-CONT");
    assert_eq!(held, Err(DriveError::Gone), "after {waited:?}");
    assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(15), "given up after {waited:?}");
    assert_eq!(later, Err(DriveError::Gone), "an operation after the drive was given up");
    let closing = Instant::now();
    drive.close();
    assert!(closing.elapsed() < Duration::from_secs(60), "close waited {:?} for librbd", closing.elapsed());
}

/// A drive on an 8 MiB image `image` of a cluster of its own (a test that stops its OSDs must
/// not stall the others), whose client conf sets librados' OSD timeout to `osd_timeout_s`;
/// `query` is appended to the spec. The directory holds the conf.
fn drive_on_own_cluster(image: &str, osd_timeout_s: u32, query: &str) -> (CephCluster, tempfile::TempDir, RbdDrive) {
    let cluster = CephCluster::start();
    cluster.create_image(image, 8 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let conf = client_conf(&cluster, dir.path(), osd_timeout_s);
    let drive = RbdDrive::open(&RbdSpec::parse(&format!("{POOL}/{image}?conf={}{query}", conf.display())).unwrap()).unwrap();
    (cluster, dir, drive)
}

/// An OSD that stops answering (SIGSTOP, as a hung host): an operation fails with ETIMEDOUT
/// after librados' OSD timeout (2 s in this client's conf; storc makes it 30 s when the conf
/// sets none) instead of waiting forever; once the OSD is back the drive works again. A cluster
/// of its own, so the other tests do not stall.
#[test]
fn an_osd_that_stops_answering_fails_operations_after_the_timeout() {
    let (cluster, _dir, drive) = drive_on_own_cluster("stalled", 2, "");
    let ctx = &mut IoCtx::new(IoCtxConfig::default()).unwrap();
    assert_eq!(write(&drive, ctx, 0, pattern(4096, 1)), Ok(()));
    let signal = |name: &str| signal_osds(&cluster, name);
    signal("-STOP");
    let started = Instant::now();
    let stalled = write(&drive, ctx, 4096, pattern(4096, 2));
    let waited = started.elapsed();
    signal("-CONT");
    assert_eq!(stalled, Err(DriveError::Io(libc::ETIMEDOUT)), "after {waited:?}");
    // librados times the operation on its own clock from its own start: in one CI run it
    // failed 3 ms short of 2 s of ours. What matters is that it waited, then gave up.
    assert!(waited >= Duration::from_millis(1800) && waited < Duration::from_secs(20), "failed after {waited:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while write(&drive, ctx, 4096, pattern(4096, 3)) != Ok(()) {
        assert!(Instant::now() < deadline, "the drive does not work again once the OSD answers");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(read(&drive, ctx, 4096, 4096).unwrap(), pattern(4096, 3).as_slice());
}
