//! SSD caching in the controller's configuration: cache VDs and the VDs they cache survive a
//! restart (warm after a clean stop, cold after a crash), bad requests change nothing, deleting either side leaves the other serving, and a
//! failed cache VD loses nothing (the tier writes through).

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::Drive;
use engine::controller::{ControlError, Controller, ControllerOptions, OfferedDrive, SsdCacheView, SsdCaching};
use engine::Engine;
use layout::{Level, MIB};
use std::sync::Arc;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions::default()).unwrap()
}

fn cached_by(controller: &Controller, vd_id: u32) -> Option<u32> {
    match controller.ssd_cache_view(vd_id) {
        Some(SsdCacheView::Cached { cache_vd_id, .. }) => Some(cache_vd_id),
        _ => None,
    }
}

fn lines_of(controller: &Controller, vd_id: u32) -> u64 {
    match controller.ssd_cache_view(vd_id) {
        Some(SsdCacheView::Cached { lines_valid, .. }) => lines_valid,
        other => panic!("v{vd_id} is not cached: {other:?}"),
    }
}

fn cache_stats(controller: &Controller, cache_vd_id: u32) -> engine::ssd_cache::SsdCacheStats {
    match controller.ssd_cache_view(cache_vd_id) {
        Some(SsdCacheView::CacheVd { stats, .. }) => stats,
        other => panic!("v{cache_vd_id} is no cache VD: {other:?}"),
    }
}

fn wait_for(condition: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn a_cache_vd_caches_its_vds_across_a_restart_and_deleting_it_leaves_them_serving() {
    let engine = engine();
    let drives = mem_drives(6, 32 * MIB);
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.create_vd(spec(Level::Raid1, &[3, 4], "logs")).unwrap();
    let error = controller.create_cache_vd(spec(Level::Raid5, &[5], "cache"), false, &[]).unwrap_err();
    assert!(matches!(&error, ControlError::BadInput(m) if m.contains("RAID 0, 1 or 10")), "{error}");
    let before = controller.config();
    let error = controller.set_ssd_caching(0, SsdCaching::On).unwrap_err();
    assert!(error.to_string().contains("there is no cache VD"), "{error}");
    assert_eq!(controller.config().vds, before.vds, "a refused request changes nothing");

    let cache = controller.create_cache_vd(spec(Level::Raid0, &[5], "cache"), false, &[0]).unwrap();
    assert!(cache.cache_vd);
    assert_eq!(cached_by(&controller, 0), Some(cache.vd_id));
    controller.set_ssd_caching(1, SsdCaching::On).unwrap();
    let error = controller.set_ssd_caching(cache.vd_id, SsdCaching::On).unwrap_err();
    assert!(error.to_string().contains("is a cache VD"), "{error}");
    let error = controller.set_ssd_caching(0, SsdCaching::By(1)).unwrap_err();
    assert!(error.to_string().contains("v1 is not a cache VD"), "{error}");

    // Reads of a hot range twice: promoted, then hits; the data is the VD's.
    let (_, db) = controller.vd(0).unwrap();
    let data = pattern(MIB as usize, 7);
    engine.write_at(&db, 0, &data).unwrap();
    for _ in 0..2 {
        assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == data.as_slice());
    }
    wait_for(|| cache_stats(&controller, cache.vd_id).promotions == 16, "16 lines promoted");
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == data.as_slice());
    assert!(cache_stats(&controller, cache.vd_id).read_hits >= 1);
    let config = controller.config();
    controller.shutdown();
    drop(controller);

    let controller = open(&engine, &drives);
    assert_eq!(controller.config().vds.len(), config.vds.len());
    for (before, after) in config.vds.iter().zip(controller.config().vds) {
        assert_eq!((before.cache_vd, before.ssd_cache_vd_id), (after.cache_vd, after.ssd_cache_vd_id), "from the metadata");
    }
    assert_eq!((cached_by(&controller, 0), cached_by(&controller, 1)), (Some(cache.vd_id), Some(cache.vd_id)));
    // A clean stop saved the map: the 16 lines are there before any read, and serve the first.
    let (_, db) = controller.vd(0).unwrap();
    assert_eq!(lines_of(&controller, 0), 16, "warm after a clean stop");
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == data.as_slice());
    assert_eq!(cache_stats(&controller, cache.vd_id).read_hits, 1, "the first read after the start is a hit");
    // A crash (no clean stop): the map was invalidated at start, so the next start is cold.
    drop(controller);
    let controller = open(&engine, &drives);
    assert_eq!(lines_of(&controller, 0), 0, "cold after a crash");
    let (_, db) = controller.vd(0).unwrap();
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == data.as_slice());

    controller.set_ssd_caching(1, SsdCaching::Off).unwrap();
    assert_eq!(cached_by(&controller, 1), None);
    controller.delete_vd(cache.vd_id, false, false).unwrap();
    assert_eq!(cached_by(&controller, 0), None, "its VDs go on uncached");
    assert!(controller.config().vds.iter().all(|v| v.ssd_cache_vd_id.is_none()));
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == data.as_slice());
    controller.shutdown();
}

#[test]
fn a_full_initialization_drops_the_vds_lines() {
    let engine = engine();
    let drives = mem_drives(4, 32 * MIB);
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "db")).unwrap();
    let cache = controller.create_cache_vd(spec(Level::Raid0, &[2, 3], "cache"), false, &[0]).unwrap();
    let (_, db) = controller.vd(0).unwrap();
    engine.write_at(&db, 0, &pattern(MIB as usize, 3)).unwrap();
    for _ in 0..2 {
        engine.read_at(&db, 0, MIB as usize).unwrap();
    }
    wait_for(|| cache_stats(&controller, cache.vd_id).promotions == 16, "16 lines promoted");
    controller.start_init(0, true, false, false).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while controller.init(0).is_some() {
        assert!(std::time::Instant::now() < deadline, "the full init did not end");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(lines_of(&controller, 0), 0, "the zeros are newer than every line");
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice().iter().all(|&b| b == 0), "zeros, not cached data");
    controller.shutdown();
}

#[test]
fn a_failed_cache_vd_loses_nothing() {
    let engine = engine();
    let faulty: Vec<Arc<drive::FaultyDrive>> =
        (0..4).map(|_| Arc::new(drive::FaultyDrive::new(Arc::new(drive::MemDrive::new(32 * MIB))))).collect();
    let drives: Vec<Arc<dyn Drive>> = faulty.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "db")).unwrap();
    let cache = controller.create_cache_vd(spec(Level::Raid0, &[2, 3], "cache"), false, &[0]).unwrap();
    let (_, db) = controller.vd(0).unwrap();
    let data = pattern(MIB as usize, 9);
    engine.write_at(&db, 0, &data).unwrap();
    for _ in 0..2 {
        engine.read_at(&db, 0, MIB as usize).unwrap();
    }
    wait_for(|| cache_stats(&controller, cache.vd_id).promotions == 16, "16 lines promoted");
    // The cache VD loses a member (RAID0: it fails); writes and reads go on from the VD.
    faulty[3].set_failed(true);
    let newer = pattern(MIB as usize, 10);
    engine.write_at(&db, 0, &newer).unwrap();
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == newer.as_slice());
    assert!(engine.read_at(&db, 0, MIB as usize).unwrap().as_slice() == newer.as_slice());
    controller.shutdown();
}
