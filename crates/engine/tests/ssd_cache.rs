//! The SSD cache (CacheCade, write-through): lines promoted on their second miss are served
//! from the cache VD and return what was written, under concurrent writes, evictions and a
//! failing cache VD; a sequential scan leaves the hot set where it was.

mod common;

use drive::{Drive, FaultyDrive, IoBuf, MemDrive};
use engine::ssd_cache::{SsdCache, SsdCacheOptions};
use engine::{Engine, EngineConfig, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::sync::{Arc, Mutex};

const LINE: u64 = 64 * KIB;

struct Rig {
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
    cache: Arc<SsdCache>,
    cache_drives: Vec<Arc<FaultyDrive>>,
}

fn drives(count: usize, bytes: u64) -> Vec<Arc<FaultyDrive>> {
    (0..count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + bytes))))).collect()
}

fn vd(id: u64, level: Level, drives: &[Arc<FaultyDrive>]) -> Arc<VirtualDrive> {
    let layout = VdLayout { level, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    Arc::new(VirtualDrive::new(id, &format!("v{id}"), layout, members).unwrap())
}

/// A RAID5 of four 8 MiB drives (24 MiB) cached by a RAID0 of two drives of `cache_lines`
/// lines' room, one of which holds the line map ([`engine::ssd_cache`]'s warm start).
fn rig(cache_lines: u64) -> Rig {
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    let vd = vd(0, Level::Raid5, &drives(4, 8 * MIB));
    let cache_drives = drives(2, cache_lines * LINE / 2);
    let cache_vd = vd_of(1, &cache_drives);
    let cache = engine.ssd_cache(&cache_vd, SsdCacheOptions::default()).unwrap();
    assert_eq!(cache.stats().line_count, cache_lines - 1);
    engine.attach_ssd_cache(&vd, &cache).unwrap();
    Rig { engine, vd, cache, cache_drives }
}

fn vd_of(id: u64, drives: &[Arc<FaultyDrive>]) -> Arc<VirtualDrive> {
    vd(id, Level::Raid0, drives)
}

impl Rig {
    fn read(&self, offset_bytes: u64, len_bytes: u64) -> Vec<u8> {
        let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) });
        assert_eq!(done.result, Ok(()), "read {offset_bytes}+{len_bytes}");
        done.buf.unwrap().as_slice().to_vec()
    }

    fn write(&self, offset_bytes: u64, data: &[u8]) {
        assert_eq!(self.engine.write_at(&self.vd, offset_bytes, data), Ok(()), "write {offset_bytes}+{}", data.len());
    }
}

fn pattern(seed: u64, len_bytes: u64) -> Vec<u8> {
    let mut data = vec![0u8; len_bytes as usize];
    SmallRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

#[test]
fn a_line_read_twice_is_served_from_the_cache_vd_and_a_failing_cache_vd_loses_nothing() {
    let rig = rig(32);
    let model = pattern(1, rig.vd.capacity_bytes());
    rig.write(0, &model);
    let hot: Vec<u64> = (0..8).map(|i| i * 5 * LINE + 8 * KIB).collect();
    for _ in 0..2 {
        for &offset in &hot {
            assert_eq!(rig.read(offset, 8 * KIB), &model[offset as usize..][..8192]);
        }
    }
    // Fills run after the second miss's answer: wait for them.
    wait_for(|| rig.cache.stats().promotions == 8, "8 promotions");
    let before = rig.cache.stats();
    for &offset in &hot {
        assert_eq!(rig.read(offset, 8 * KIB), &model[offset as usize..][..8192], "hit at {offset}");
    }
    let after = rig.cache.stats();
    assert_eq!(after.read_hits - before.read_hits, 8, "every hot read is a hit: {after:?}");
    assert_eq!(rig.cache.lines_valid_of(&rig.vd), 8);
    // The cache VD's members start failing every read: the VD answers, the lines leave.
    for drive in &rig.cache_drives {
        drive.set_failed(true);
    }
    for &offset in &hot {
        assert_eq!(rig.read(offset, 8 * KIB), &model[offset as usize..][..8192], "served by the VD at {offset}");
    }
    assert!(rig.cache.stats().cache_read_errors > 0);
    rig.cache.check_invariants();
}

#[test]
fn cached_lines_stay_equal_to_the_vd_under_concurrent_writes_reads_and_evictions() {
    // 7 lines of cache for a hot set of 16 lines: promotions evict all the time.
    let rig = Arc::new(rig(8));
    let hot_lines = 16u64;
    let model = Arc::new(Mutex::new(pattern(2, hot_lines * LINE)));
    rig.write(0, &model.lock().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A reader of whole lines, unchecked (the others write under it): it drives promotions,
    // hits and evictions.
    let churn = {
        let (rig, stop) = (Arc::clone(&rig), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(3);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rig.read(rng.gen_range(0..hot_lines) * LINE, LINE);
            }
        })
    };
    // Four writers, each owning every fourth 4 KiB page of the hot lines: each checks that it
    // reads back its own last write, whatever the cache did meanwhile.
    let writers: Vec<_> = (0..4u64)
        .map(|thread| {
            let (rig, model) = (Arc::clone(&rig), Arc::clone(&model));
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(10 + thread);
                let pages = hot_lines * LINE / (4 * KIB);
                for round in 0..1500u64 {
                    let page = rng.gen_range(0..pages / 4) * 4 + thread;
                    let offset = page * 4 * KIB;
                    if rng.gen_bool(0.4) {
                        let data = pattern(round * 4 + thread + 100, 4 * KIB);
                        model.lock().unwrap()[offset as usize..][..4096].copy_from_slice(&data);
                        rig.write(offset, &data);
                    } else {
                        let expected = model.lock().unwrap()[offset as usize..][..4096].to_vec();
                        assert_eq!(rig.read(offset, 4 * KIB), expected, "thread {thread} round {round}: page {page}");
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    // Writes across lines and reads across lines, from one thread while the churn goes on.
    let mut rng = SmallRng::seed_from_u64(4);
    for round in 0..300u64 {
        let offset = rng.gen_range(0..hot_lines * LINE / 4096 - 48) * 4096;
        let len = rng.gen_range(1..=48u64) * 4096;
        if round % 2 == 0 {
            let data = pattern(10_000 + round, len);
            model.lock().unwrap()[offset as usize..][..len as usize].copy_from_slice(&data);
            rig.write(offset, &data);
        } else {
            assert_eq!(rig.read(offset, len), &model.lock().unwrap()[offset as usize..][..len as usize], "round {round}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    let stats = rig.cache.stats();
    assert!(stats.read_hits > 100 && stats.promotions > 20 && stats.evictions > 10 && stats.write_updates > 10, "{stats:?}");
    rig.cache.check_invariants();
    // Every line the cache serves, and the VD without the cache, hold the model.
    let model = model.lock().unwrap().clone();
    assert!(rig.read(0, hot_lines * LINE) == model, "through the cache");
    rig.engine.detach_ssd_cache(&rig.vd).unwrap();
    assert!(rig.read(0, hot_lines * LINE) == model, "the VD itself (write-through)");
}

#[test]
fn a_promotion_reads_the_whole_line_and_a_bad_block_elsewhere_in_it_fails_only_the_fill() {
    let rig = rig(32);
    let model = pattern(5, 4 * LINE);
    rig.write(0, &model);
    // Line 1 is read twice at 8 KiB: the second miss reads the whole line and promotes it.
    for _ in 0..2 {
        assert_eq!(rig.read(LINE + 8 * KIB, 8 * KIB), &model[(LINE + 8 * KIB) as usize..][..8192]);
    }
    wait_for(|| rig.cache.stats().promotions == 1, "line 1 promoted");
    // The whole line is served from the cache VD now, not only the part that was asked for.
    let before = rig.cache.stats().read_hits;
    assert_eq!(rig.read(LINE, LINE), &model[LINE as usize..][..LINE as usize]);
    assert_eq!(rig.cache.stats().read_hits, before + 1);
    // Line 2 holds a bad block past the range asked for: the whole-line read fails, the
    // client's range is read alone and returned, the fill is dropped.
    rig.vd.bad_blocks().load(&[engine::config::BadBlock { offset_bytes: 2 * LINE + 32 * KIB, len_bytes: 4 * KIB }]);
    for _ in 0..2 {
        assert_eq!(rig.read(2 * LINE, 8 * KIB), &model[(2 * LINE) as usize..][..8192]);
    }
    wait_for(|| rig.cache.stats().fills_dropped == 1, "the fill of line 2 dropped");
    assert_eq!(rig.cache.lines_valid_of(&rig.vd), 1);
    rig.cache.check_invariants();
}

#[test]
fn a_sequential_scan_leaves_the_hot_set_cached() {
    let rig = rig(32);
    let hot: Vec<u64> = (0..8).map(|i| (i * 37 % 300) * LINE).collect();
    for _ in 0..2 {
        for &offset in &hot {
            rig.read(offset, 8 * KIB);
        }
    }
    wait_for(|| rig.cache.lines_valid_of(&rig.vd) == 8, "the hot set promoted");
    // Two passes over the whole VD in 64 KiB reads: 384 lines, twelve times the cache.
    for _ in 0..2 {
        for offset in (0..rig.vd.capacity_bytes()).step_by(LINE as usize) {
            rig.read(offset, LINE);
        }
    }
    let scanned = rig.cache.stats();
    assert!(scanned.read_bypassed > 600, "reads past the first 4 MiB of each pass bypass the cache: {scanned:?}");
    for &offset in &hot {
        rig.read(offset, 8 * KIB);
    }
    let after = rig.cache.stats();
    assert_eq!(after.read_hits - scanned.read_hits, 8, "the hot set is still cached after the scan: {after:?}");
}

#[test]
fn attaching_is_refused_where_it_makes_no_sense_and_detaching_drops_the_lines() {
    let rig = rig(32);
    let other = vd(2, Level::Raid1, &drives(2, 8 * MIB));
    let second = rig.engine.ssd_cache(&vd_of(3, &drives(1, 4 * MIB)), SsdCacheOptions::default()).unwrap();
    let error = rig.engine.attach_ssd_cache(&rig.vd, &second).unwrap_err();
    assert!(error.contains("cached already"), "{error}");
    let error = rig.engine.attach_ssd_cache(rig.cache.cache_vd(), &second).unwrap_err();
    assert!(error.contains("is a cache VD"), "{error}");
    let error = rig.engine.ssd_cache(rig.cache.cache_vd(), SsdCacheOptions::default()).map(|_| ()).unwrap_err();
    assert!(error.contains("a cache VD already"), "{error}");
    let error = rig.engine.ssd_cache(&rig.vd, SsdCacheOptions::default()).map(|_| ()).unwrap_err();
    assert!(error.contains("is cached by a cache VD"), "{error}");
    let bad_line = SsdCacheOptions { line_bytes: 3000, ..SsdCacheOptions::default() };
    assert!(rig.engine.ssd_cache(&other, bad_line).map(|_| ()).unwrap_err().contains("power of two"));
    // One cache VD serves two VDs.
    rig.engine.attach_ssd_cache(&other, &rig.cache).unwrap();
    for _ in 0..2 {
        rig.read(0, 4 * KIB);
        assert_eq!(rig.engine.read_at(&other, 0, 4096).unwrap().len(), 4096);
    }
    wait_for(|| rig.cache.lines_valid_of(&rig.vd) == 1 && rig.cache.lines_valid_of(&other) == 1, "a line of each VD");
    rig.engine.detach_ssd_cache(&rig.vd).unwrap();
    assert_eq!(rig.cache.lines_valid_of(&rig.vd), 0);
    assert_eq!(rig.cache.lines_valid_of(&other), 1);
    rig.cache.check_invariants();
}

fn wait_for(condition: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A RAID1 over disks that held different data, not yet initialized, reads its first copy,
/// and the SSD cache promotes what it read. The first member is replaced by a blank drive and
/// rebuilt from the second: the VD now reads the second copy's bytes everywhere, and so must
/// the cache (the controller cache's twin is `read_cache.rs`'s test of the same name).
#[test]
fn a_rebuild_of_an_unsynced_mirror_row_drops_the_lines_cached_of_it() {
    use engine::bitmap::control::{self, Identity, Opening};
    use engine::bitmap::RegionMap;
    use engine::{MemberSet, MemberState};
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    let members = drives(2, 8 * MIB);
    common::fill_drive(&*members[0], 0xaa);
    common::fill_drive(&*members[1], 0xbb);
    let vd = vd(0, Level::Raid1, &members);
    let regions = RegionMap::with_rows_per_region(vd.geometry(), 4);
    let member_drives: Vec<Arc<dyn Drive>> = members.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let opened = control::open(Identity { controller_id: 7, vd_id: 0 }, regions, &member_drives, Opening::CreatedOverData);
    vd.set_write_intent(opened.intent);
    let cache_vd = vd_of(1, &drives(2, 16 * LINE));
    let cache = engine.ssd_cache(&cache_vd, SsdCacheOptions::default()).unwrap();
    engine.attach_ssd_cache(&vd, &cache).unwrap();
    let rig = Rig { engine: Arc::clone(&engine), vd: Arc::clone(&vd), cache: Arc::clone(&cache), cache_drives: Vec::new() };
    let lines: Vec<u64> = (0..4).map(|i| i * 3 * LINE).collect();
    for _ in 0..2 {
        lines.iter().for_each(|&offset| assert!(rig.read(offset, LINE).iter().all(|&b| b == 0xaa), "unsynced rows read the first copy"));
    }
    wait_for(|| cache.stats().promotions == lines.len() as u64, "the lines' promotions");
    let hits = cache.stats().read_hits;
    lines.iter().for_each(|&offset| assert!(rig.read(offset, LINE).iter().all(|&b| b == 0xaa)));
    assert_eq!(cache.stats().read_hits, hits + lines.len() as u64, "served from the cache VD");

    vd.set_member_state(0, MemberState::Failed);
    vd.start_rebuild(0, Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 8 * MIB)));
    let (sender, receiver) = std::sync::mpsc::channel();
    engine.rebuild_rows(&vd, 0, vd.geometry().row_count(), MemberSet::of(&[0]), Box::new(move |results| sender.send(results).unwrap()));
    assert!(receiver.recv().unwrap().iter().all(Result::is_ok));
    vd.finish_rebuild(0);
    for &offset in &lines {
        assert!(
            rig.read(offset, LINE).iter().all(|&b| b == 0xbb),
            "line at {offset}: the rebuilt VD reads the second copy, and so does its cache"
        );
    }
}

/// RAID6 names a data strip that disagrees with P and Q and a repairing check rewrites it. If
/// the SSD cache promoted the wrong bytes before the check, it must not go on serving them.
#[test]
fn a_repairing_check_drops_the_lines_it_corrected() {
    use engine::CheckMode;
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    let members = drives(5, 8 * MIB);
    let vd = vd(0, Level::Raid6, &members);
    let cache_vd = vd_of(1, &drives(2, 16 * LINE));
    let cache = engine.ssd_cache(&cache_vd, SsdCacheOptions::default()).unwrap();
    engine.attach_ssd_cache(&vd, &cache).unwrap();
    let rig = Rig { engine: Arc::clone(&engine), vd: Arc::clone(&vd), cache: Arc::clone(&cache), cache_drives: Vec::new() };
    let model = pattern(9, 4 * vd.geometry().row_data_bytes());
    rig.write(0, &model);

    // Row 1's first data strip (one line) goes bad on its member, behind the VD's back.
    let row = 1;
    let place = vd.geometry().row_map(row).data_copy(0, 0);
    let garbage = vec![0x5a; LINE as usize];
    common::write_drive_at(&*members[place.drive], place.drive_offset_bytes, &garbage);
    let offset = row * vd.geometry().row_data_bytes();
    for _ in 0..2 {
        assert_eq!(rig.read(offset, LINE), garbage, "a read does not check parity");
    }
    wait_for(|| cache.stats().promotions == 1, "the bad line's promotion");

    let (sender, receiver) = std::sync::mpsc::channel();
    engine.check_rows(&vd, row, 1, CheckMode::Repair, Box::new(move |results| sender.send(results).unwrap()));
    let outcome = receiver.recv().unwrap().pop().unwrap().unwrap();
    assert!(outcome.repaired && !outcome.is_consistent(), "the check found the strip and rewrote it: {outcome:?}");
    assert_eq!(rig.read(offset, LINE), &model[offset as usize..][..LINE as usize], "the repaired line is read, not the cached garbage");
}
