//! Write-back SSD caching under the controller: writes to held lines stay on the cache VD and
//! read back; a crash loses none (the dirty lines come back from the cache VD's table); turning
//! caching off destages first; a RAID1 cache VD survives an SSD; a RAID0 one that fails takes
//! its VDs offline rather than serve older data, until it is deleted.

mod common;

use common::{check, engine, pattern, scatter, spec, wait_until};
use drive::{Drive, FaultyDrive, MemDrive};
use engine::controller::{Controller, ControllerOptions, DriveCommand, OfferedDrive, SsdCacheView, SsdCaching};
use engine::{Engine, VdError, VdState, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;

const HOT_BYTES: usize = 4 * MIB as usize;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions::default()).unwrap()
}

fn faulty_drives(count: usize) -> (Vec<Arc<FaultyDrive>>, Vec<Arc<dyn Drive>>) {
    let faulty: Vec<Arc<FaultyDrive>> = (0..count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(48 * MIB))))).collect();
    let drives = faulty.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    (faulty, drives)
}

fn dirty_lines(controller: &Controller, vd_id: u32) -> u64 {
    match controller.ssd_cache_view(vd_id) {
        Some(SsdCacheView::Cached { lines_dirty, .. }) => lines_dirty,
        other => panic!("v{vd_id} is not cached: {other:?}"),
    }
}

fn stats(controller: &Controller, cache_vd_id: u32) -> engine::ssd_cache::SsdCacheStats {
    match controller.ssd_cache_view(cache_vd_id) {
        Some(SsdCacheView::CacheVd { stats, .. }) => stats,
        other => panic!("v{cache_vd_id} is no cache VD: {other:?}"),
    }
}

/// A RAID1 `db` (v0) of drives 0-1 cached write-back by a cache VD (v1) of `level` on drives
/// 2-3; `db`'s first 4 MiB written, then read twice (promoted: 64 lines held, clean).
fn cached_db(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], level: Level) -> (Arc<Controller>, Arc<VirtualDrive>, Vec<u8>) {
    let controller = open(engine, drives);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "db")).unwrap();
    let cache = controller.create_cache_vd(spec(level, &[2, 3], "cache"), true, &[0]).unwrap();
    assert!(cache.cache_write_back && cache.vd_id == 1);
    let (_, db) = controller.vd(0).unwrap();
    let image = pattern(HOT_BYTES, 5);
    engine.write_at(&db, 0, &image).unwrap();
    // A MiB (16 lines, as many fills as run at once) read twice at a time.
    for mib in 0..4 {
        for _ in 0..2 {
            let read = engine.read_at(&db, mib * MIB, MIB as usize).unwrap();
            assert!(read.as_slice() == &image[(mib * MIB) as usize..][..MIB as usize], "promoting MiB {mib}");
        }
        wait_until("16 more lines promoted", &controller, || stats(&controller, 1).promotions == 16 * (mib + 1));
    }
    (controller, db, image)
}

#[test]
fn writes_stay_on_the_cache_vd_and_a_crash_loses_none_of_them() {
    let engine = engine();
    let (_, drives) = faulty_drives(4);
    let (controller, db, mut image) = cached_db(&engine, &drives, Level::Raid1);
    scatter(&engine, &db, &mut image, 11, 200);
    let s = stats(&controller, 1);
    assert!(s.writes_absorbed >= 190, "writes to held lines stay on the cache VD: {s:?}");
    assert!(dirty_lines(&controller, 0) > 0);
    check(&engine, &db, &image, "read back from the cache VD");
    // A write over the last held line and the first one not held: a read of both takes each
    // part from where its newest data is (the simulator's seed 39 found reads taking the VD's).
    let across = pattern(16 * 1024, 77);
    let at = HOT_BYTES as u64 - 8 * 1024;
    engine.write_at(&db, at, &across).unwrap();
    let read = engine.read_at(&db, HOT_BYTES as u64 - 65536, 2 * 65536).unwrap();
    assert!(read.as_slice()[65536 - 8192..65536 + 8192] == across[..], "a read over a dirty line and a line not held");
    image.extend_from_slice(engine.read_at(&db, HOT_BYTES as u64, 8192).unwrap().as_slice());
    image[at as usize..].copy_from_slice(&across);
    // A crash: no clean stop (the old controller and its cache go without a word).
    let weak_cache = Arc::downgrade(&db.ssd_cache().get().unwrap());
    drop((controller, db));
    // Its destager thread holds it for a moment every 10 ms while it looks for work, and then
    // lets go for good: a single look could catch that moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while weak_cache.upgrade().is_some() {
        assert!(std::time::Instant::now() < deadline, "the crashed cache is gone (its destager with it)");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let controller = open(&engine, &drives);
    let dirty = dirty_lines(&controller, 0);
    assert!(dirty > 0, "the dirty lines came back from the table");
    let (_, db) = controller.vd(0).unwrap();
    check(&engine, &db, &image, "after the crash, from the cache VD");
    // Off: destaged first, then the VD alone has every write.
    controller.set_ssd_caching(0, SsdCaching::Off).unwrap();
    assert!(db.ssd_cache().get().is_none());
    check(&engine, &db, &image, "uncached after the destage");
    controller.shutdown();
}

#[test]
fn idle_dirty_lines_are_destaged_and_a_clean_stop_keeps_the_cache_warm() {
    let engine = engine();
    let (_, drives) = faulty_drives(4);
    let (controller, db, mut image) = cached_db(&engine, &drives, Level::Raid1);
    scatter(&engine, &db, &mut image, 3, 100);
    wait_until("every dirty line destaged once idle", &controller, || dirty_lines(&controller, 0) == 0);
    assert!(stats(&controller, 1).lines_destaged > 0);
    scatter(&engine, &db, &mut image, 4, 50);
    let dirty = dirty_lines(&controller, 0);
    controller.shutdown();
    drop((controller, db));
    let controller = open(&engine, &drives);
    let (_, db) = controller.vd(0).unwrap();
    match controller.ssd_cache_view(0) {
        Some(SsdCacheView::Cached { lines_valid, lines_dirty, .. }) => {
            assert_eq!(lines_valid, 64, "warm after a clean stop");
            assert!(lines_dirty <= dirty, "what was dirty at the stop stays dirty until destaged");
        }
        other => panic!("{other:?}"),
    }
    check(&engine, &db, &image, "after a clean stop");
    controller.shutdown();
}

#[test]
fn a_raid1_cache_vd_survives_an_ssd_and_serves_on() {
    let engine = engine();
    let (faulty, drives) = faulty_drives(4);
    let (controller, db, mut image) = cached_db(&engine, &drives, Level::Raid1);
    scatter(&engine, &db, &mut image, 21, 100);
    faulty[3].set_failed(true);
    scatter(&engine, &db, &mut image, 22, 100);
    check(&engine, &db, &image, "with one SSD of the cache VD gone");
    wait_until("the cache VD degraded", &controller, || controller.vd(1).unwrap().1.state() == VdState::Degraded);
    assert_eq!(db.state(), VdState::Optimal);
    controller.set_ssd_caching(0, SsdCaching::Off).unwrap();
    check(&engine, &db, &image, "destaged from the degraded cache VD");
    controller.shutdown();
}

#[test]
fn a_failed_raid0_cache_vd_takes_its_vds_offline_until_it_is_deleted() {
    let engine = engine();
    let (faulty, drives) = faulty_drives(4);
    let (controller, db, image) = cached_db(&engine, &drives, Level::Raid0);
    assert!(controller.events().iter().any(|e| e.description.contains("RAID0 write-back")), "creating a RAID0 write-back cache VD warns");
    let mut newer = image.clone();
    scatter(&engine, &db, &mut newer, 31, 100);
    faulty[3].set_failed(true);
    // The next access to the cache VD finds the failure; the controller takes v0 offline.
    let _ = engine.read_at(&db, 0, HOT_BYTES);
    wait_until("v0 offline", &controller, || db.state() == VdState::Offline);
    let error = engine.read_at(&db, 0, 4096).unwrap_err();
    assert!(matches!(error, VdError::SsdCacheLost { .. }), "{error}");
    assert!(controller.events().iter().any(|e| e.description.contains("v0 is offline")));
    let refused = controller.set_ssd_caching(0, SsdCaching::Off).unwrap_err();
    assert!(refused.to_string().contains("delete v1"), "{refused}");
    // Deleting the cache VD discards what it held: v0 serves what its members hold.
    controller.delete_vd(1, false, false).unwrap();
    assert_eq!(db.state(), VdState::Optimal);
    let read = engine.read_at(&db, 0, HOT_BYTES).unwrap();
    let blocks = read.as_slice().chunks(4096).zip(image.chunks(4096).zip(newer.chunks(4096)));
    assert!(blocks.clone().all(|(got, (old, new))| got == old || got == new), "every block is one that was written");
    assert!(blocks.clone().any(|(got, (old, new))| old != new && got == old), "the discarded writes are not there");
    controller.shutdown();
}

#[test]
fn setting_a_raid0_cache_vd_member_offline_takes_its_dirty_vd_offline_at_once() {
    let engine = engine();
    let (_, drives) = faulty_drives(4);
    let (controller, db, image) = cached_db(&engine, &drives, Level::Raid0);
    let mut newer = image.clone();
    scatter(&engine, &db, &mut newer, 41, 50);
    assert!(dirty_lines(&controller, 0) > 0);
    controller.set_drive(3, DriveCommand::Offline).unwrap();
    assert_eq!(db.state(), VdState::Offline, "offline with the command, not at the next I/O");
    assert!(matches!(engine.read_at(&db, 0, 4096).unwrap_err(), VdError::SsdCacheLost { .. }));
    controller.delete_vd(1, false, false).unwrap();
    assert_eq!(db.state(), VdState::Optimal);
    controller.shutdown();
}

#[test]
fn a_destager_whose_vd_fails_its_writes_retries_at_a_polling_pace() {
    let engine = engine();
    let (faulty, drives) = faulty_drives(4);
    let (controller, db, mut image) = cached_db(&engine, &drives, Level::Raid1);
    scatter(&engine, &db, &mut image, 51, 100);
    assert!(dirty_lines(&controller, 0) > 0);
    faulty[0].set_failed(true);
    faulty[1].set_failed(true);
    // Idle for a second, the destager tries every dirty line, and every try fails.
    wait_until("destages failing", &controller, || stats(&controller, 1).destage_retries > 0);
    let before = stats(&controller, 1).destage_retries;
    std::thread::sleep(std::time::Duration::from_secs(1));
    let retries_per_s = stats(&controller, 1).destage_retries - before;
    // A batch of 8 lines per 10 ms poll at most; one that does not wait after a failed batch
    // retries as fast as the failures come back (25,760 a second in a debug build here).
    assert!(retries_per_s <= 1_000, "{retries_per_s} failed destages in a second");
    assert!(dirty_lines(&controller, 0) > 0, "lines whose destage failed stay dirty");
    controller.shutdown();
}
