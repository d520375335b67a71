//! The read side of the controller cache on a running engine of two shards: clean data kept
//! under `iopolicy=cached`, read-ahead under RA and ADRA, and reads that stay right while writes
//! change what the cache holds. (The simulator covers the interleavings and crashes.)

mod common;

use common::{mem_drives, pattern};
use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive};
use layout::{Level, KIB, MIB};
use std::sync::Arc;

/// The part of each VD the tests use.
const VD_BYTES: u64 = 16 * MIB;

fn rig(level: Level, read: ReadPolicy, io: IoPolicy) -> (Engine, Arc<VirtualDrive>) {
    let engine = Engine::start(EngineConfig { shard_count: 2, cache_bytes: 256 * MIB, ..EngineConfig::default() }).unwrap();
    let layout = VdLayout { level, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    // At least VD_BYTES on every level used here (RAID5 of 4: three members' worth).
    let member_bytes = engine::MEMBER_RESERVED_BYTES + VD_BYTES / 3 + MIB;
    let vd = Arc::new(VirtualDrive::new(1, "v1", layout, mem_drives(4, member_bytes)).unwrap());
    vd.set_read_policies(read, io);
    (engine, vd)
}

/// Fills the VD with `seed`'s pattern and returns what it holds.
fn fill(engine: &Engine, vd: &Arc<VirtualDrive>, seed: u8) -> Vec<u8> {
    assert!(vd.capacity_bytes() >= VD_BYTES);
    let data = pattern(VD_BYTES as usize, seed);
    for (index, chunk) in data.chunks(MIB as usize).enumerate() {
        engine.write_at(vd, index as u64 * MIB, chunk).unwrap();
    }
    data
}

fn check(engine: &Engine, vd: &Arc<VirtualDrive>, expected: &[u8], offset: u64, len: usize) {
    let got = engine.read_at(vd, offset, len).unwrap();
    assert!(got.as_slice() == &expected[offset as usize..offset as usize + len], "wrong data at {offset}+{len}");
}

/// A tiny, deterministic generator for offsets.
fn offsets(count: usize, limit: u64, step: u64) -> Vec<u64> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (limit / step) * step
        })
        .collect()
}

#[test]
fn cached_reads_are_served_from_the_cache_and_stay_right_across_writes() {
    let (engine, vd) = rig(Level::Raid5, ReadPolicy::NoReadAhead, IoPolicy::Cached);
    let mut data = fill(&engine, &vd, 1);
    let working_set = 4 * MIB;
    let reads = offsets(4000, working_set, 4 * KIB);
    for &offset in &reads {
        check(&engine, &vd, &data, offset, 4096);
    }
    let warm = engine.cache_stats().clean;
    for &offset in &reads {
        check(&engine, &vd, &data, offset, 4096);
    }
    let hot = engine.cache_stats().clean;
    assert_eq!(hot.misses, warm.misses, "a working set that fits is read from the cache the second time");
    assert_eq!(hot.hits - warm.hits, reads.len() as u64);

    // Writes straight to the members (WT without a journal) set what they cover aside.
    for &offset in &offsets(200, working_set, 4 * KIB) {
        let new = pattern(8192.min((VD_BYTES - offset) as usize), offset as u8 ^ 0x5a);
        engine.write_at(&vd, offset, &new).unwrap();
        data[offset as usize..offset as usize + new.len()].copy_from_slice(&new);
    }
    for &offset in &reads {
        check(&engine, &vd, &data, offset, 4096);
    }
    // Writes through the dirty map (AWB) update what the cache holds, written out or not.
    vd.set_write_policy(WritePolicy::AlwaysWriteBack);
    for &offset in &offsets(300, working_set, 512) {
        let new = pattern(1536, offset as u8 ^ 0x33);
        engine.write_at(&vd, offset, &new).unwrap();
        data[offset as usize..offset as usize + new.len()].copy_from_slice(&new);
    }
    for &offset in &reads {
        check(&engine, &vd, &data, offset, 4096);
    }
    engine.quiesce().unwrap();
    for &offset in &reads {
        check(&engine, &vd, &data, offset, 4096);
    }
    check(&engine, &vd, &data, 0, VD_BYTES as usize);
}

#[test]
fn direct_reads_keep_nothing() {
    let (engine, vd) = rig(Level::Raid0, ReadPolicy::NoReadAhead, IoPolicy::Direct);
    let data = fill(&engine, &vd, 2);
    for _ in 0..2 {
        for &offset in &offsets(500, VD_BYTES, 4 * KIB) {
            check(&engine, &vd, &data, offset, 4096);
        }
    }
    let stats = engine.cache_stats().clean;
    assert_eq!((stats.hits, stats.bytes), (0, 0));
}

#[test]
fn adra_reads_interleaved_sequential_streams_ahead_across_shards() {
    let (engine, vd) = rig(Level::Raid5, ReadPolicy::Adaptive, IoPolicy::Direct);
    let data = fill(&engine, &vd, 3);
    let streams = 8;
    let stream_bytes = VD_BYTES / streams;
    let read_bytes = 64 * KIB;
    for step in 0..stream_bytes / read_bytes {
        for stream in 0..streams {
            check(&engine, &vd, &data, stream * stream_bytes + step * read_bytes, read_bytes as usize);
        }
    }
    let stats = engine.cache_stats().clean;
    let reads = VD_BYTES / read_bytes;
    assert!(stats.read_ahead_bytes >= VD_BYTES * 3 / 4, "read ahead {} of {VD_BYTES}", stats.read_ahead_bytes);
    assert!(stats.hits >= reads * 3 / 4, "{} of {reads} reads came from the cache: {stats:?}", stats.hits);
}

#[test]
fn ra_reads_ahead_of_random_reads_too_and_nora_never() {
    let (engine, vd) = rig(Level::Raid0, ReadPolicy::ReadAhead, IoPolicy::Direct);
    let data = fill(&engine, &vd, 4);
    for &offset in &offsets(100, VD_BYTES - MIB, 64 * KIB) {
        check(&engine, &vd, &data, offset, 4096);
    }
    assert!(engine.cache_stats().clean.read_ahead_bytes >= 50 * 128 * KIB);
    let (engine, vd) = rig(Level::Raid0, ReadPolicy::NoReadAhead, IoPolicy::Direct);
    let data = fill(&engine, &vd, 5);
    for offset in (0..VD_BYTES).step_by(64 * KIB as usize) {
        check(&engine, &vd, &data, offset, 64 * KIB as usize);
    }
    assert_eq!(engine.cache_stats().clean.read_ahead_bytes, 0);
}

/// A block of [`racing_hits_never_read_older_than_an_acknowledged_write`]: its version in the
/// first 8 bytes, the rest a pattern of version and block (so a torn block shows).
fn versioned_block(block: u64, version: u64) -> Vec<u8> {
    let mut bytes = vec![(version as u8) ^ (block as u8).wrapping_mul(7); 4096];
    bytes[..8].copy_from_slice(&version.to_le_bytes());
    bytes
}

/// Reads served from the clean lines on the submitting thread (no hop to the shard) race the
/// shards' writes: WT writes that set the lines aside, AWB writes that update them in place.
/// Each reader notes the newest version acknowledged before its read began; the block it reads
/// must be whole and at least that new.
#[test]
fn racing_hits_never_read_older_than_an_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const BLOCKS: u64 = 64;
    const WRITES_PER_WRITER: u64 = 3000;
    for write_policy in [WritePolicy::WriteThrough, WritePolicy::AlwaysWriteBack] {
        let (engine, vd) = rig(Level::Raid5, ReadPolicy::NoReadAhead, IoPolicy::Cached);
        let acked: Vec<AtomicU64> = (0..BLOCKS).map(|_| AtomicU64::new(0)).collect();
        for block in 0..BLOCKS {
            engine.write_at(&vd, block * 4096, &versioned_block(block, 0)).unwrap();
            // Read once, so that the lines hold it: AWB writes then update them in place.
            engine.read_at(&vd, block * 4096, 4096).unwrap();
        }
        vd.set_write_policy(write_policy);
        let writing = AtomicBool::new(true);
        let hits_before = engine.cache_stats().clean.hits;
        std::thread::scope(|scope| {
            let writers: Vec<_> = (0..2u64)
                .map(|writer| {
                    let (engine, vd, acked) = (&engine, &vd, &acked);
                    scope.spawn(move || {
                        for n in 1..=WRITES_PER_WRITER {
                            // Each writer owns every other block: versions of a block only grow.
                            let block = (n * 13 % (BLOCKS / 2)) * 2 + writer;
                            let version = acked[block as usize].load(Ordering::SeqCst) + 1;
                            engine.write_at(vd, block * 4096, &versioned_block(block, version)).unwrap();
                            acked[block as usize].store(version, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for reader in 0..2u64 {
                let (engine, vd, acked, writing) = (&engine, &vd, &acked, &writing);
                scope.spawn(move || {
                    let mut n = reader;
                    while writing.load(Ordering::SeqCst) {
                        n += 1;
                        let block = n * 29 % BLOCKS;
                        let at_least = acked[block as usize].load(Ordering::SeqCst);
                        let got = engine.read_at(vd, block * 4096, 4096).unwrap();
                        let version = u64::from_le_bytes(got.as_slice()[..8].try_into().unwrap());
                        assert!(
                            version >= at_least,
                            "{write_policy:?}: block {block} read version {version} after {at_least} was acknowledged"
                        );
                        assert!(
                            got.as_slice() == versioned_block(block, version),
                            "{write_policy:?}: block {block} torn at version {version}"
                        );
                    }
                });
            }
            writers.into_iter().for_each(|w| w.join().unwrap());
            writing.store(false, Ordering::SeqCst);
        });
        let hits = engine.cache_stats().clean.hits - hits_before;
        assert!(hits > 1000, "{write_policy:?}: only {hits} reads were served from the cache");
        for block in 0..BLOCKS {
            let version = acked[block as usize].load(Ordering::SeqCst);
            assert!(engine.read_at(&vd, block * 4096, 4096).unwrap().as_slice() == versioned_block(block, version));
        }
    }
}

/// A RAID1 over disks that held different data, not yet initialized: reads return the first
/// copy, and the cache keeps it. The first member is replaced by a blank drive and rebuilt
/// from the second, so every read now returns the second copy's bytes: the cache must not go
/// on serving the lost first copy (found by the simulator, seed 72451).
#[test]
fn a_rebuild_of_an_unsynced_mirror_row_drops_what_the_cache_held_of_it() {
    use engine::bitmap::control::{self, Identity, Opening};
    use engine::bitmap::RegionMap;
    use engine::{MemberSet, MemberState};
    let engine = Engine::start(EngineConfig { shard_count: 2, cache_bytes: 64 * MIB, ..EngineConfig::default() }).unwrap();
    let member_bytes = engine::MEMBER_RESERVED_BYTES + 8 * MIB;
    let drives = mem_drives(2, member_bytes);
    common::fill_drive(&*drives[0], 0xaa);
    common::fill_drive(&*drives[1], 0xbb);
    let layout = VdLayout { level: Level::Raid1, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v1", layout, drives.clone()).unwrap());
    let regions = RegionMap::with_rows_per_region(vd.geometry(), 4);
    let identity = Identity { controller_id: 7, vd_id: 1 };
    vd.set_write_intent(control::open(identity, regions, &drives, Opening::CreatedOverData).intent);
    vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Cached);
    let rows = vd.geometry().row_count();
    let len = (rows * vd.geometry().row_data_bytes()) as usize;
    for _ in 0..2 {
        assert!(engine.read_at(&vd, 0, len).unwrap().as_slice().iter().all(|&b| b == 0xaa), "unsynced rows read the first copy");
    }
    assert!(engine.cache_stats().clean.hits > 0, "the second read came from the cache");

    vd.set_member_state(0, MemberState::Failed);
    let blank: Arc<dyn drive::Drive> = Arc::new(drive::MemDrive::new(member_bytes));
    vd.start_rebuild(0, Arc::clone(&blank));
    let (sender, receiver) = std::sync::mpsc::channel();
    engine.rebuild_rows(&vd, 0, rows, MemberSet::of(&[0]), Box::new(move |results| sender.send(results).unwrap()));
    let results = receiver.recv().unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    vd.finish_rebuild(0);
    let read = engine.read_at(&vd, 0, len).unwrap();
    assert!(read.as_slice().iter().all(|&b| b == 0xbb), "after the rebuild every copy holds the second one's bytes, and reads say so");
}
