//! Emulated drives behave, in time, like the datasheet models they name, and never change data.
//!
//! Throughput is measured on the virtual clock, closed loop: `queue_depth` operations in flight,
//! each completion replaced at once by the next. The numbers are deterministic (seeded offsets),
//! and each test prints what it measured (`cargo test -p drive --test emulated -- --nocapture`).
//! A few tests use the real clock with generous bounds.

use drive::{Clock, Drive, DriveError, DriveOp, EmulatedClass, EmulatedDrive, EmulatedDriveSpec, IoBuf, IoCtx, RealClock, VirtualClock};
use std::sync::Arc;
use std::time::Instant;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Deterministic offsets (xorshift64*), so every run measures the same workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A `block_bytes`-aligned offset of a whole block below `capacity_bytes`.
    fn block_offset(&mut self, capacity_bytes: u64, block_bytes: u64) -> u64 {
        self.next() % (capacity_bytes / block_bytes) * block_bytes
    }
}

#[derive(Clone, Copy, Debug)]
enum Pattern {
    Random,
    Sequential { start_bytes: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Workload {
    write: bool,
    block_bytes: u64,
    queue_depth: usize,
    op_count: usize,
    pattern: Pattern,
}

impl Workload {
    fn random_reads(block_bytes: u64, queue_depth: usize, op_count: usize) -> Workload {
        Workload { write: false, block_bytes, queue_depth, op_count, pattern: Pattern::Random }
    }

    fn op(&self, index: usize, rng: &mut Rng, capacity_bytes: u64) -> DriveOp {
        let offset_bytes = match self.pattern {
            Pattern::Random => rng.block_offset(capacity_bytes, self.block_bytes),
            Pattern::Sequential { start_bytes } => start_bytes + index as u64 * self.block_bytes,
        };
        let buf = IoBuf::zeroed(self.block_bytes as usize);
        match self.write {
            true => DriveOp::Write { offset_bytes, buf },
            false => DriveOp::Read { offset_bytes, buf },
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Measured {
    op_count: usize,
    bytes: u64,
    elapsed_ns: u64,
}

impl Measured {
    fn iops(&self) -> f64 {
        self.op_count as f64 * 1e9 / self.elapsed_ns as f64
    }

    /// MB/s as datasheets count them (10^6 bytes).
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 * 1e3 / self.elapsed_ns as f64
    }
}

fn virtual_drive(spec: &str) -> (EmulatedDrive, VirtualClock) {
    let clock = VirtualClock::new();
    let spec = EmulatedDriveSpec::parse(spec).expect("a valid spec");
    (EmulatedDrive::new(&spec, Arc::new(clock.clone())), clock)
}

fn measure(spec: &str, workload: Workload) -> Measured {
    let (drive, clock) = virtual_drive(spec);
    run_virtual(&drive, &clock, workload)
}

/// Runs `workload` closed loop on the virtual clock (see [`closed_loop`]).
fn run_virtual(drive: &EmulatedDrive, clock: &VirtualClock, workload: Workload) -> Measured {
    let mut rng = Rng(0x5eed_0000_0000_0001 ^ workload.block_bytes);
    let capacity_bytes = drive.info().capacity_bytes;
    let mut submitted = workload.queue_depth.min(workload.op_count);
    let first = (0..submitted).map(|index| (index as u64, workload.op(index, &mut rng, capacity_bytes))).collect();
    let elapsed_ns = closed_loop(drive, clock, first, workload.op_count as u64, |_| {
        (submitted < workload.op_count).then(|| {
            submitted += 1;
            ((submitted - 1) as u64, workload.op(submitted - 1, &mut rng, capacity_bytes))
        })
    });
    let bytes = workload.op_count as u64 * workload.block_bytes;
    Measured { op_count: workload.op_count, bytes, elapsed_ns }
}

/// The simulator's loop of `next_due_ns`, `advance_to`, `poll_due`, `IoCtx::poll`: submits
/// `first` (token, operation), then for each completion whatever `next(its token)` gives, until
/// `count` operations completed, each of them successfully. Returns the virtual ns it took.
fn closed_loop(
    drive: &EmulatedDrive,
    clock: &VirtualClock,
    first: Vec<(u64, DriveOp)>,
    count: u64,
    mut next: impl FnMut(u64) -> Option<(u64, DriveOp)>,
) -> u64 {
    let mut ctx = IoCtx::without_ring();
    let start_ns = clock.now_ns();
    for (token, op) in first {
        drive.submit(&mut ctx, token, op);
    }
    let (mut completed, mut out) = (0, Vec::new());
    while completed < count {
        clock.advance_to(drive.next_due_ns().expect("operations are in flight"));
        drive.poll_due(&mut ctx);
        ctx.poll(&mut out, false);
        for completion in out.drain(..) {
            assert_eq!(completion.result, Ok(()));
            completed += 1;
            if let Some((token, op)) = next(completion.token) {
                drive.submit(&mut ctx, token, op);
            }
        }
    }
    clock.now_ns() - start_ns
}

fn check_within(what: &str, measured: f64, range: std::ops::RangeInclusive<f64>) {
    println!("{what}: {measured:.3}");
    assert!(range.contains(&measured), "{what}: {measured:.1} is outside {range:?}");
}

// --- Hard disks ---------------------------------------------------------------------------

#[test]
fn a_15k_drive_does_about_200_random_8k_iops_at_queue_depth_1() {
    let measured = measure("hdd:15k:600GiB", Workload::random_reads(8 * KIB, 1, 2000));
    check_within("15k random 8 KiB read IOPS at QD1", measured.iops(), 170.0..=260.0);
}

#[test]
fn queued_commands_are_reordered_so_random_iops_rise_with_queue_depth() {
    let qd1 = measure("hdd:15k:8GiB", Workload::random_reads(8 * KIB, 1, 2000)).iops();
    let qd32 = measure("hdd:15k:8GiB", Workload::random_reads(8 * KIB, 32, 4000)).iops();
    let qd32_in_order = measure("hdd:15k:8GiB,qd=1", Workload::random_reads(8 * KIB, 32, 4000)).iops();
    println!("15k random 8 KiB read IOPS: QD1 {qd1:.0}, QD32 {qd32:.0}, QD32 without reordering {qd32_in_order:.0}");
    assert!(qd32 > 1.6 * qd1, "NCQ at QD32 ({qd32:.0}) should clearly beat QD1 ({qd1:.0})");
    assert!((qd32_in_order / qd1 - 1.0).abs() < 0.1, "without reordering a deeper queue buys nothing");
}

#[test]
fn slower_spindles_do_fewer_random_iops() {
    let iops = |spec| measure(spec, Workload::random_reads(8 * KIB, 1, 1000)).iops();
    check_within("7200 random 8 KiB read IOPS at QD1", iops("hdd:7200:2TiB"), 72.0..=110.0);
    check_within("10k random 8 KiB read IOPS at QD1", iops("hdd:10k:600GiB"), 120.0..=180.0);
}

#[test]
fn sequential_reads_run_at_the_zone_rate_outer_fast_inner_slow() {
    let capacity_bytes = 8 * GIB;
    let sequential = |start_bytes| Workload {
        write: false,
        block_bytes: MIB,
        queue_depth: 1,
        op_count: 128,
        pattern: Pattern::Sequential { start_bytes },
    };
    let outer = measure("hdd:15k:8GiB", sequential(0)).mb_per_s();
    let middle = measure("hdd:15k:8GiB", sequential(capacity_bytes / 2)).mb_per_s();
    let inner = measure("hdd:15k:8GiB", sequential(capacity_bytes - 128 * MIB)).mb_per_s();
    check_within("15k sequential 1 MiB read MB/s, outer zone (datasheet 204)", outer, 185.0..=205.0);
    check_within("15k sequential 1 MiB read MB/s, middle", middle, 150.0..=175.0);
    check_within("15k sequential 1 MiB read MB/s, inner zone (datasheet 122)", inner, 112.0..=125.0);
}

#[test]
fn sequential_small_writes_are_much_slower_without_the_write_cache() {
    let writes =
        Workload { write: true, block_bytes: 4 * KIB, queue_depth: 1, op_count: 2000, pattern: Pattern::Sequential { start_bytes: 0 } };
    let cached = measure("hdd:15k:8GiB", writes).iops();
    let uncached = measure("hdd:15k:8GiB,nowritecache", writes).iops();
    println!("15k sequential 4 KiB writes at QD1: {cached:.0} IOPS cached, {uncached:.0} uncached");
    assert!(cached > 10.0 * uncached, "the write cache should make sequential small writes far faster");
    // Uncached, each write finds its sector just passed: about one write per revolution (250/s).
    check_within("15k sequential 4 KiB uncached write IOPS", uncached, 200.0..=260.0);
}

#[test]
fn read_ahead_streams_sequential_reads_that_would_each_miss_a_revolution() {
    let reads =
        Workload { write: false, block_bytes: 64 * KIB, queue_depth: 1, op_count: 2000, pattern: Pattern::Sequential { start_bytes: 0 } };
    let streamed = measure("hdd:15k:8GiB", reads).mb_per_s();
    let unbuffered = measure("hdd:15k:8GiB,noreadahead", reads).mb_per_s();
    println!("15k sequential 64 KiB reads at QD1: {streamed:.1} MB/s with read-ahead, {unbuffered:.1} MB/s without");
    assert!(streamed > 190.0 && unbuffered < 20.0);
}

/// Two sequential readers far apart, taking turns with 2 ms of host think time between requests
/// (as on the members of a striped array): the drive reads ahead for each while idle and keeps
/// both segments, so after the first visits nearly every read is a buffer hit. With read-ahead
/// off every read seeks to the other zone.
#[test]
fn interleaved_sequential_readers_each_keep_their_read_ahead_segment() {
    let mean_read_us = |spec: &str| {
        let (drive, clock) = virtual_drive(spec);
        let mut ctx = IoCtx::without_ring();
        let (reads, mut busy_ns) = (200u64, 0);
        for index in 0..reads {
            let zone_bytes = if index % 2 == 0 { 0 } else { 300 * GIB };
            let offset_bytes = zone_bytes + index / 2 * 64 * KIB;
            let started_ns = clock.now_ns();
            drive.submit(&mut ctx, index, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(64 << 10) });
            run_until_complete(&drive, &clock, &mut ctx, 1);
            busy_ns += clock.now_ns() - started_ns;
            clock.advance_by(2_000_000);
        }
        busy_ns as f64 / reads as f64 / 1e3
    };
    let kept = mean_read_us("hdd:15k:600GiB");
    let unbuffered = mean_read_us("hdd:15k:600GiB,noreadahead");
    println!("two interleaved 64 KiB sequential readers: mean read {kept:.0} us with read-ahead, {unbuffered:.0} us without");
    assert!(kept < 600.0 && unbuffered > 4000.0, "kept segments {kept:.0} us, no read-ahead {unbuffered:.0} us");
}

/// A RAID5 member's reads: 64 KiB strips in order at QD 1, skipping every eighth (its parity
/// strip, which a read of data leaves out). The head reads on through the skipped strip while
/// the next read is on its way, so that read waits for the head to reach it instead of paying
/// a revolution (it did: 4 ms per skip, which held a RAID5 of 8 of these to 450 MB/s where
/// the members allow 1,430). The head passes over no more than the media rate all the same.
#[test]
fn a_read_that_skips_a_strip_ahead_of_the_streaming_head_waits_for_it_not_a_revolution() {
    let (drive, clock) = virtual_drive("hdd:15k:600GiB,nowritecache");
    let strip_offset = |index: u64| (index + index / 7) * 64 * KIB;
    let read = |index: u64| DriveOp::Read { offset_bytes: strip_offset(index), buf: IoBuf::zeroed(64 << 10) };
    let reads = 1400;
    let mut next = 1;
    let elapsed_ns = closed_loop(&drive, &clock, vec![(0, read(0))], reads, |_| {
        next += 1;
        Some((next - 1, read(next - 1)))
    });
    let data_mb_per_s = (reads * 64 * KIB) as f64 * 1e3 / elapsed_ns as f64;
    let passed_mb_per_s = strip_offset(reads) as f64 * 1e3 / elapsed_ns as f64;
    println!("64 KiB reads skipping every eighth strip at QD 1: {data_mb_per_s:.1} MB/s of data, head over {passed_mb_per_s:.1} MB/s");
    assert!(passed_mb_per_s <= 205.0, "the head passed {passed_mb_per_s:.1} MB/s, above the 204 MB/s media rate");
    assert!(data_mb_per_s >= 0.9 * 7.0 / 8.0 * 204.0, "only {data_mb_per_s:.1} MB/s of data: a skip costs a revolution");
}

/// `streams` sequential readers of 64 KiB, each in its own zone of a 600 GiB 15k drive and each
/// with one read in flight, closed loop (a new read the moment the last completes, as the
/// review-multithreaded-read workers do): the MB/s of distinct sectors they get together.
fn interleaved_streams_mb_per_s(streams: u64, reads_per_stream: u64) -> f64 {
    let (drive, clock) = virtual_drive("hdd:15k:600GiB,nowritecache");
    streams_on(&drive, &clock, streams, reads_per_stream)
}

fn streams_on(drive: &EmulatedDrive, clock: &VirtualClock, streams: u64, reads_per_stream: u64) -> f64 {
    let zone_bytes = 600 * GIB / 4;
    let read =
        |stream: u64, index: u64| DriveOp::Read { offset_bytes: stream * zone_bytes + index * 64 * KIB, buf: IoBuf::zeroed(64 << 10) };
    let mut next_index = vec![1u64; streams as usize];
    let first = (0..streams).map(|stream| (stream, read(stream, 0))).collect();
    let elapsed_ns = closed_loop(drive, clock, first, streams * reads_per_stream, |stream| {
        let index = &mut next_index[stream as usize];
        (*index < reads_per_stream).then(|| {
            *index += 1;
            (stream, read(stream, *index - 1))
        })
    });
    (streams * reads_per_stream * 64 * KIB) as f64 * 1e3 / elapsed_ns as f64
}

/// Physics: one head reads distinct sectors no faster than the media rate (204 MB/s in the
/// outer zone of a 15k drive), however many streams share it. And a switch between sequential
/// streams reads a minimum prefetch for the stream it leaves, as segmented caches do, so two to
/// four streams still get a good part of the media rate instead of a seek per 64 KiB (which
/// gives about 10 MB/s).
#[test]
fn interleaved_sequential_streams_share_the_media_rate_and_never_exceed_it() {
    for streams in 1..=4 {
        let mb_per_s = interleaved_streams_mb_per_s(streams, 600);
        println!("{streams} sequential 64 KiB readers at QD 1 each on a 15k drive: {mb_per_s:.1} MB/s together");
        assert!(mb_per_s <= 205.0, "{streams} streams read {mb_per_s:.1} MB/s of distinct sectors, above the 204 MB/s media rate");
        assert!(mb_per_s >= 90.0, "{streams} streams get only {mb_per_s:.1} MB/s: each switch costs a seek");
    }
}

/// The slowest of `reads_per_stream` 64 KiB reads of each of `streams` sequential readers, each
/// in its own zone (the first zone the highest) with `per_stream` reads in flight, closed loop.
fn slowest_read_ns(spec: &str, streams: u64, per_stream: u64, reads_per_stream: u64) -> u64 {
    let (drive, clock) = virtual_drive(spec);
    let zone_bytes = drive.info().capacity_bytes / streams;
    // As a RAID5 member of 8 sees a VD's sequential reader: one strip a row, none in the rows
    // whose parity it holds.
    let read = |stream: u64, index: u64| {
        let zone_start_bytes = (streams - 1 - stream) * zone_bytes;
        let row = index + index / 7;
        DriveOp::Read { offset_bytes: zone_start_bytes + row * 64 * KIB, buf: IoBuf::zeroed(64 << 10) }
    };
    let mut ctx = IoCtx::without_ring();
    let mut next_index = vec![per_stream; streams as usize];
    let mut submitted_ns = std::collections::HashMap::new();
    for stream in 0..streams {
        for index in 0..per_stream {
            let token = stream << 32 | index;
            submitted_ns.insert(token, clock.now_ns());
            drive.submit(&mut ctx, token, read(stream, index));
        }
    }
    let (mut slowest_ns, mut completed, mut out) = (0, 0, Vec::new());
    while completed < streams * reads_per_stream {
        clock.advance_to(drive.next_due_ns().expect("operations are in flight"));
        drive.poll_due(&mut ctx);
        ctx.poll(&mut out, false);
        for completion in out.drain(..) {
            assert_eq!(completion.result, Ok(()));
            completed += 1;
            slowest_ns = slowest_ns.max(clock.now_ns() - submitted_ns.remove(&completion.token).expect("submitted"));
            let stream = completion.token >> 32;
            let index = &mut next_index[stream as usize];
            if *index < reads_per_stream {
                let token = stream << 32 | *index;
                submitted_ns.insert(token, clock.now_ns());
                drive.submit(&mut ctx, token, read(stream, *index));
                *index += 1;
            }
        }
    }
    slowest_ns
}

/// Physics again, with queued reads: RAID5 members' streams (a strip a row, none in their
/// parity rows), several in flight each, as a controller's read-ahead sends them. However the
/// reads ahead of the head are queued, no mix of streams gets more than the media rate.
#[test]
fn queued_reads_that_skip_strips_never_exceed_the_media_rate() {
    for (streams, per_stream) in [(1, 4), (1, 16), (2, 4), (2, 16), (4, 8)] {
        let (drive, clock) = virtual_drive("hdd:15k:600GiB,nowritecache");
        let zone_bytes = drive.info().capacity_bytes / 4;
        let read = |stream: u64, index: u64| DriveOp::Read {
            offset_bytes: stream * zone_bytes + (index + index / 7) * 64 * KIB,
            buf: IoBuf::zeroed(64 << 10),
        };
        let reads_per_stream = 1200;
        let mut next_index = vec![per_stream; streams as usize];
        let first = (0..streams)
            .flat_map(|stream| (0..per_stream).map(move |index| (stream, index)))
            .map(|(stream, index)| (stream, read(stream, index)))
            .collect();
        let elapsed_ns = closed_loop(&drive, &clock, first, streams * reads_per_stream, |stream| {
            let index = &mut next_index[stream as usize];
            (*index < reads_per_stream).then(|| {
                *index += 1;
                (stream, read(stream, *index - 1))
            })
        });
        let mb_per_s = (streams * reads_per_stream * 64 * KIB) as f64 * 1e3 / elapsed_ns as f64;
        println!("{streams} RAID5-member streams, {per_stream} reads in flight each: {mb_per_s:.1} MB/s of data");
        assert!(
            mb_per_s <= 7.0 / 8.0 * 205.0,
            "{streams} streams at {per_stream} each read {mb_per_s:.1} MB/s of data, above 7/8 of the media rate"
        );
    }
}

/// Regression: a segment held everything its stream had read since the head last moved, so
/// after one reader streamed for seconds, another starting where it began (a benchmark's next
/// point) was served from the "buffer": 2 GB/s from eight 15k drives. A segment holds a few
/// MiB; going back to the start of a long stream takes the head.
#[test]
fn a_long_stream_keeps_only_its_last_stretch_in_the_buffer() {
    let (drive, clock) = virtual_drive("hdd:15k:600GiB,nowritecache");
    let read = |index: u64| DriveOp::Read { offset_bytes: index * 64 * KIB, buf: IoBuf::zeroed(64 << 10) };
    let reads = 2000;
    // The stream, then its first read again.
    let (mut next, mut back_submitted_ns) = (1, 0);
    closed_loop(&drive, &clock, vec![(0, read(0))], reads + 1, |_| {
        next += 1;
        if next - 1 == reads {
            back_submitted_ns = clock.now_ns();
            return Some((reads, read(0)));
        }
        Some((next - 1, read(next - 1)))
    });
    let (back_us, stream_mib) = ((clock.now_ns() - back_submitted_ns) / 1000, reads * 64 / 1024);
    println!("reading the start of a {stream_mib} MiB stream again: {back_us} us");
    assert!(back_us > 1000, "the start of a {stream_mib} MiB stream came from the buffer in {back_us} us");
}

/// Regression: a queued read served from a kept segment (another stream's, read ahead before
/// the head left it) moved the *current* stream's look-ahead out to that segment's end, so the
/// head "read ahead" across the whole gap between the zones before it took another command:
/// the drive stopped for as long as reading hundreds of GB takes (920 s in a benchmark of
/// four readers at QD 8 on RAID5, which then waited for it). No read may wait much longer than
/// the starvation limit (1 s) plus a few services.
#[test]
fn a_read_from_a_kept_segment_leaves_the_current_stream_where_it_is() {
    for (streams, per_stream) in [(2, 2), (3, 2), (4, 2), (4, 4), (3, 8)] {
        let slowest_ns = slowest_read_ns("hdd:15k:600GiB,nowritecache", streams, per_stream, 400);
        println!("{streams} sequential 64 KiB readers, {per_stream} reads in flight each: slowest read {} us", slowest_ns / 1000);
        assert!(slowest_ns < 1_500_000_000, "{streams} readers at {per_stream} each: a read waited {} ms", slowest_ns / 1_000_000);
    }
}

/// A point's result does not depend on the point run before it, once a flush (which the
/// benchmark sends between points) drained the write cache: two interleaved readers measure
/// the same on a fresh drive and after random writes or four other streams.
#[test]
fn the_same_point_measures_the_same_after_another_point() {
    let fresh = {
        let (drive, clock) = virtual_drive("hdd:15k:600GiB");
        streams_on(&drive, &clock, 2, 300)
    };
    let after = |before: &dyn Fn(&EmulatedDrive, &VirtualClock)| {
        let (drive, clock) = virtual_drive("hdd:15k:600GiB");
        before(&drive, &clock);
        let mut ctx = IoCtx::without_ring();
        drive.submit(&mut ctx, 1 << 40, DriveOp::Flush);
        run_until_complete(&drive, &clock, &mut ctx, 1);
        streams_on(&drive, &clock, 2, 300)
    };
    let random_writes = Workload { write: true, block_bytes: 8 * KIB, queue_depth: 8, op_count: 3000, pattern: Pattern::Random };
    let after_writes = after(&|drive, clock| {
        run_virtual(drive, clock, random_writes);
    });
    let after_streams = after(&|drive, clock| {
        streams_on(drive, clock, 4, 200);
    });
    println!("two 64 KiB readers: {fresh:.1} MB/s fresh, {after_writes:.1} after random writes, {after_streams:.1} after four streams");
    for (what, measured) in [("random writes", after_writes), ("four streams", after_streams)] {
        assert!((measured / fresh - 1.0).abs() <= 0.1, "after {what}: {measured:.1} MB/s against {fresh:.1} fresh");
    }
}

#[test]
fn a_flush_waits_until_cached_writes_reach_the_platter() {
    let (drive, clock) = virtual_drive("hdd:7200:2TiB");
    let mut ctx = IoCtx::without_ring();
    let mut rng = Rng(7);
    for token in 0..32 {
        let offset_bytes = rng.block_offset(2 << 40, 64 * KIB);
        drive.submit(&mut ctx, token, DriveOp::Write { offset_bytes, buf: IoBuf::zeroed(64 << 10) });
    }
    let writes_done_ns = run_until_complete(&drive, &clock, &mut ctx, 32);
    drive.submit(&mut ctx, 99, DriveOp::Flush);
    let flush_done_ns = run_until_complete(&drive, &clock, &mut ctx, 1);
    println!("32 random 64 KiB cached writes complete after {writes_done_ns} ns; the flush after {flush_done_ns} ns");
    assert!(writes_done_ns < 2_000_000, "cached writes complete at link speed");
    assert!(flush_done_ns > 32 * 5_000_000, "the flush waits for 32 random destages");
}

/// Advances the virtual clock until `count` completions arrived; returns the time then.
fn run_until_complete(drive: &EmulatedDrive, clock: &VirtualClock, ctx: &mut IoCtx, count: usize) -> u64 {
    let mut out = Vec::new();
    while out.len() < count {
        clock.advance_to(drive.next_due_ns().expect("operations are in flight"));
        drive.poll_due(ctx);
        ctx.poll(&mut out, false);
    }
    assert!(out.iter().all(|c| c.result.is_ok()));
    clock.now_ns()
}

// --- SSDs ---------------------------------------------------------------------------------

#[test]
fn ssds_reach_their_class_ceilings_for_4k_random_reads() {
    for (spec, queue_depth, datasheet_iops) in
        [("ssd:sata:480GiB", 32, 75_000.0), ("ssd:sas:400GiB", 64, 130_000.0), ("ssd:nvme:1TiB", 128, 460_000.0)]
    {
        let iops = measure(spec, Workload::random_reads(4 * KIB, queue_depth, 50_000)).iops();
        check_within(&format!("{spec} 4 KiB random read IOPS at QD{queue_depth}"), iops, datasheet_iops * 0.9..=datasheet_iops * 1.01);
        let qd1 = measure(spec, Workload::random_reads(4 * KIB, 1, 5_000)).iops();
        println!("{spec} 4 KiB random read IOPS at QD1: {qd1:.0}");
        assert!(qd1 < iops / 2.0, "at QD1 latency, not the ceiling, limits an SSD");
    }
}

#[test]
fn ssd_sequential_bandwidth_meets_the_datasheet() {
    let sequential =
        Workload { write: false, block_bytes: 128 * KIB, queue_depth: 8, op_count: 4000, pattern: Pattern::Sequential { start_bytes: 0 } };
    check_within("ssd:sata sequential 128 KiB read MB/s (datasheet 500)", measure("ssd:sata:8GiB", sequential).mb_per_s(), 480.0..=501.0);
    check_within(
        "ssd:nvme sequential 128 KiB read MB/s (datasheet 2800)",
        measure("ssd:nvme:8GiB", sequential).mb_per_s(),
        2600.0..=2801.0,
    );
}

#[test]
fn ssd_writes_slow_down_once_the_spare_area_has_been_written() {
    let (drive, clock) = virtual_drive("ssd:sata:8GiB,spare=512MiB");
    let writes = |op_count| Workload { write: true, block_bytes: 4 * KIB, queue_depth: 32, op_count, pattern: Pattern::Random };
    let fresh = run_virtual(&drive, &clock, writes(20_000)).iops();
    run_virtual(&drive, &clock, writes(130_000)); // 4 KiB × 150,000 > 512 MiB
    let steady = run_virtual(&drive, &clock, writes(20_000)).iops();
    println!("ssd:sata 4 KiB random write IOPS at QD32: fresh {fresh:.0}, steady state {steady:.0} (datasheet 36,000)");
    assert!(steady < 0.6 * fresh, "steady-state writes are slower");
    check_within("ssd:sata steady-state 4 KiB random write IOPS", steady, 32_000.0..=36_500.0);
}

// --- Data and real time ---------------------------------------------------------------------

fn pattern(len_bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..len_bytes).map(|_| rng.next() as u8).collect()
}

/// Writes 48 distinct 8 KiB blocks (queue depth 8), reads them back and compares.
fn check_round_trip(drive: &dyn Drive, mut complete: impl FnMut(&mut IoCtx, usize) -> Vec<drive::Completion>) {
    let mut ctx = IoCtx::without_ring();
    let block_bytes = 8 * KIB;
    let slots = drive.info().capacity_bytes / block_bytes;
    let offsets: Vec<u64> = (0..48u64).map(|i| (i * 7919 + 13) % slots * block_bytes).collect();
    for batch in offsets.chunks(8) {
        for &offset_bytes in batch {
            let buf = IoBuf::from_slice(&pattern(block_bytes as usize, offset_bytes));
            drive.submit(&mut ctx, offset_bytes, DriveOp::Write { offset_bytes, buf });
        }
        assert!(complete(&mut ctx, batch.len()).iter().all(|c| c.result.is_ok()));
    }
    for batch in offsets.chunks(8) {
        for &offset_bytes in batch {
            drive.submit(&mut ctx, offset_bytes, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(block_bytes as usize) });
        }
        for completion in complete(&mut ctx, batch.len()) {
            let read = completion.buf.expect("a read returns its buffer");
            assert_eq!(
                read.as_slice(),
                &pattern(block_bytes as usize, completion.token)[..],
                "{} at {}",
                drive.info().name,
                completion.token
            );
        }
    }
}

#[test]
fn data_written_reads_back_unchanged_on_every_class() {
    for class in EmulatedClass::ALL {
        let clock = VirtualClock::new();
        let drive = EmulatedDrive::new(&EmulatedDriveSpec::new(class, GIB), Arc::new(clock.clone()));
        check_round_trip(&drive, |ctx, count| {
            let mut out = Vec::new();
            while out.len() < count {
                clock.advance_to(drive.next_due_ns().expect("in flight"));
                drive.poll_due(ctx);
                ctx.poll(&mut out, false);
            }
            out
        });
    }
}

fn wait_for(ctx: &mut IoCtx, count: usize) -> Vec<drive::Completion> {
    let mut out = Vec::new();
    while out.len() < count {
        ctx.poll(&mut out, true);
    }
    out
}

#[test]
fn with_the_real_clock_data_round_trips_and_completions_wait_for_their_due_time() {
    for spec in ["hdd:15k:1GiB", "ssd:nvme:1GiB"] {
        let drive = EmulatedDrive::new(&EmulatedDriveSpec::parse(spec).unwrap(), Arc::new(RealClock::new()));
        check_round_trip(&drive, wait_for);
    }
    // 40 random reads at QD1 on a 15k drive: never faster than the model, not much slower.
    let drive = EmulatedDrive::new(&EmulatedDriveSpec::parse("hdd:15k:600GiB").unwrap(), Arc::new(RealClock::new()));
    let mut ctx = IoCtx::without_ring();
    let mut rng = Rng(3);
    let started = Instant::now();
    for token in 0..40 {
        let offset_bytes = rng.block_offset(600 * GIB, 8 * KIB);
        drive.submit(&mut ctx, token, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(8 << 10) });
        wait_for(&mut ctx, 1);
    }
    let iops = 40.0 / started.elapsed().as_secs_f64();
    check_within("15k random 8 KiB read IOPS at QD1, real clock", iops, 80.0..=260.0);
}

/// Real clock, two threads with a context each, sharing one drive: each submits `per_thread`
/// random 8 KiB reads at once and waits for them. Returns the seconds taken and each thread's
/// completion order (by token).
fn queued_reads_from_two_threads(spec: &str, per_thread: u64) -> (f64, Vec<Vec<u64>>) {
    let drive = Arc::new(EmulatedDrive::new(&EmulatedDriveSpec::parse(spec).unwrap(), Arc::new(RealClock::new())));
    let capacity_bytes = drive.info().capacity_bytes;
    let started = Instant::now();
    let threads: Vec<_> = (0..2u64)
        .map(|thread| {
            let drive = Arc::clone(&drive);
            std::thread::spawn(move || {
                let mut ctx = IoCtx::without_ring();
                let mut rng = Rng(11 + thread);
                for token in 0..per_thread {
                    let offset_bytes = rng.block_offset(capacity_bytes, 8 * KIB);
                    drive.submit(&mut ctx, token, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(8 << 10) });
                }
                let done = wait_for(&mut ctx, per_thread as usize);
                assert!(done.iter().all(|c| c.result == Ok(())));
                assert_eq!(ctx.in_flight(), 0);
                done.iter().map(|c| c.token).collect::<Vec<_>>()
            })
        })
        .collect();
    let orders = threads.into_iter().map(|t| t.join().unwrap()).collect();
    (started.elapsed().as_secs_f64(), orders)
}

/// With the real clock, commands queued from several contexts are reordered together (NCQ):
/// 32 random reads finish well before the same reads served in arrival order (`qd=1`), and not
/// in the order they were sent. (About 0.09 s against 0.17 s on an idle machine.)
#[test]
fn with_the_real_clock_queued_commands_from_several_contexts_are_reordered() {
    let (fifo_s, fifo_orders) = queued_reads_from_two_threads("hdd:15k:600GiB,qd=1", 16);
    let (ncq_s, ncq_orders) = queued_reads_from_two_threads("hdd:15k:600GiB", 16);
    println!("32 random 8 KiB reads queued from two threads: {ncq_s:.3} s with NCQ, {fifo_s:.3} s in arrival order");
    assert!(fifo_orders.iter().all(|order| order.windows(2).all(|w| w[0] < w[1])), "qd=1 serves in arrival order");
    assert!(ncq_orders.iter().any(|order| !order.windows(2).all(|w| w[0] < w[1])), "NCQ served in arrival order: {ncq_orders:?}");
    assert!(ncq_s < 0.75 * fifo_s, "NCQ took {ncq_s:.3} s, arrival order {fifo_s:.3} s");
}

#[test]
fn out_of_range_and_misaligned_operations_fail_at_once() {
    let (drive, _clock) = virtual_drive("hdd:15k:1GiB");
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 1, DriveOp::Read { offset_bytes: GIB, buf: IoBuf::zeroed(4096) });
    drive.submit(&mut ctx, 2, DriveOp::Write { offset_bytes: 100, buf: IoBuf::zeroed(4096) });
    let mut out = Vec::new();
    ctx.poll(&mut out, false);
    assert!(matches!(out[0].result, Err(DriveError::OutOfRange { .. })));
    assert!(matches!(out[1].result, Err(DriveError::Misaligned { .. })));
    assert_eq!(drive.next_due_ns(), None, "nothing reached the model");
}

// --- Specs --------------------------------------------------------------------------------

#[test]
fn specs_parse_and_print_back() {
    for (text, class, capacity_bytes) in [
        ("hdd:15k:600GiB", EmulatedClass::Hdd15k, 600 * GIB),
        ("hdd:7200:2TiB,nocache", EmulatedClass::Hdd7200, 2 << 40),
        ("hdd:10k:300GiB,noreadahead,qd=4", EmulatedClass::Hdd10k, 300 * GIB),
        ("ssd:sata:480GiB", EmulatedClass::SsdSata, 480 * GIB),
        ("ssd:sas:400GiB,qd=16", EmulatedClass::SsdSas, 400 * GIB),
        ("ssd:nvme:1TiB,spare=64GiB", EmulatedClass::SsdNvme, 1 << 40),
    ] {
        let spec = EmulatedDriveSpec::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((spec.class, spec.capacity_bytes), (class, capacity_bytes), "{text}");
        assert_eq!(spec.to_string(), text);
        assert_eq!(EmulatedDriveSpec::parse(&spec.to_string()).as_ref(), Ok(&spec));
    }
    let spec = EmulatedDriveSpec::parse("HDD:15000:1GiB,NoWriteCache").unwrap();
    assert_eq!((spec.class, spec.write_cache, spec.read_ahead), (EmulatedClass::Hdd15k, false, true));
    let drive = EmulatedDrive::new(&spec, Arc::new(VirtualClock::new()));
    assert_eq!(drive.info().name, "hdd:15k:1GiB,nowritecache");
    assert_eq!(drive.model(), "Seagate Cheetah 15K.7 ST3600057SS");
}

/// `text` fails to parse with a message holding every one of `expected`.
fn check_parse_error(text: &str, expected: &[&str]) {
    let error = EmulatedDriveSpec::parse(text).expect_err(text);
    for part in expected {
        assert!(error.contains(part), "error for {text:?} should mention {part:?}: {error}");
    }
}

#[test]
fn spec_errors_name_the_wrong_part_and_what_is_allowed() {
    check_parse_error("hdd:15k", &["\"hdd:15k\"", "KIND:CLASS:CAPACITY", "hdd:15k:600GiB"]);
    check_parse_error("tape:lto9:18TiB", &["\"tape\"", "allowed: hdd, ssd"]);
    check_parse_error("hdd:5400:1TiB", &["\"5400\"", "7200", "10k", "15k"]);
    check_parse_error("ssd:pcie:1TiB", &["\"pcie\"", "sata, sas, nvme"]);
    check_parse_error("hdd:15k:lots", &["capacity", "\"lots\""]);
    check_parse_error("hdd:15k:600PiB", &["\"PiB\"", "TiB"]);
    check_parse_error("hdd:15k:0", &["capacity \"0\" is zero"]);
    check_parse_error("hdd:15k:1000", &["\"1000\"", "multiple of 512"]);
    check_parse_error("hdd:15k:1GiB,turbo", &["\"turbo\"", "nocache, nowritecache, noreadahead, qd=N (1 to 32)"]);
    check_parse_error("ssd:nvme:1TiB,nocache", &["\"nocache\"", "allowed for ssd", "spare=SIZE"]);
    check_parse_error("hdd:15k:1GiB,spare=1GiB", &["\"spare=1GiB\"", "allowed for hdd"]);
    check_parse_error("hdd:15k:1GiB,qd=64", &["qd=64", "1 to 32"]);
    check_parse_error("hdd:15k:1GiB,qd=many", &["\"many\"", "1 to 32"]);
    check_parse_error("ssd:sata:1GiB,spare=big", &["spare", "\"big\""]);
}
