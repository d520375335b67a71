//! A whole VD copied onto another drive while a client writes to it (`vd::migration`, the
//! engine's part of live migration): once every row was copied, a JBOD laid over the target
//! reads exactly what the VD holds, on every level, whatever order the rows were copied in; a
//! target that fails stops the migration and never a client write.

mod common;

use common::Writer;
use drive::{Drive, FaultyDrive, MemDrive};
use engine::{Engine, EngineConfig, VdError, VdLayout, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::sync::{mpsc, Arc};

const STRIP_BYTES: u64 = 64 * KIB;
const MEMBER_DATA_BYTES: u64 = 4 * MIB;

struct Rig {
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
}

fn rig(level: Level, drive_count: usize) -> Rig {
    let members: Vec<Arc<dyn Drive>> =
        (0..drive_count).map(|_| Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + MEMBER_DATA_BYTES)) as Arc<dyn Drive>).collect();
    let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    Rig { engine, vd }
}

fn migrate_rows(rig: &Rig, first_row: u64, row_count: u64) -> Vec<Result<(), VdError>> {
    let (tx, rx) = mpsc::channel();
    rig.engine.migrate_rows(&rig.vd, first_row, row_count, Box::new(move |results| tx.send(results).unwrap()));
    rx.recv().unwrap()
}

/// What a JBOD laid over the target reads: the VD the migration leaves behind.
fn read_as_jbod(engine: &Engine, target: Arc<dyn Drive>, capacity_bytes: u64) -> Vec<u8> {
    let layout = VdLayout {
        level: Level::Jbod,
        strip_size_bytes: STRIP_BYTES,
        drives_per_span: None,
        member_size_bytes: Some(MEMBER_RESERVED_BYTES + capacity_bytes),
    };
    let jbod = Arc::new(VirtualDrive::new(2, "migrated", layout, vec![target]).unwrap());
    assert_eq!(jbod.capacity_bytes(), capacity_bytes, "the JBOD over the target has the VD's size");
    engine.read_at(&jbod, 0, capacity_bytes as usize).unwrap().as_slice().to_vec()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Every level: rows copied in a scattered order (runs of 3 rows, stepping through the VD by a
/// stride prime to the row count) while the client writes before, during and after the copy.
#[test]
fn a_vd_migrated_under_writes_reads_the_same_from_a_jbod_over_its_target() {
    for (level, drive_count) in [(Level::Raid0, 4), (Level::Raid1, 2), (Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let rig = rig(level, drive_count);
        let capacity = rig.vd.capacity_bytes();
        let writer = Writer::start(&rig.engine, &rig.vd, 192 * KIB, 1);
        writer.wait_for(50);
        let target: Arc<dyn Drive> = Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + capacity));
        rig.vd.start_migration(Arc::clone(&target));
        let row_count = rig.vd.geometry().row_count();
        let runs = row_count.div_ceil(3);
        let stride = (1..).map(|s: u64| s * 7 + 3).find(|s| gcd(*s, runs) == 1).unwrap();
        for step in 0..runs {
            let first = (step * stride % runs) * 3;
            let count = 3.min(row_count - first);
            let results = migrate_rows(&rig, first, count);
            assert!(results.iter().all(Result::is_ok), "{level:?}: rows {first}+{count}: {results:?}");
            if step % 8 == 0 {
                writer.wait_for(5);
            }
        }
        writer.wait_for(50);
        let image = writer.finish();
        let migration = rig.vd.end_migration().expect("the migration ran");
        assert!(!migration.has_failed(), "{level:?}");
        let from_vd = rig.engine.read_at(&rig.vd, 0, capacity as usize).unwrap().as_slice().to_vec();
        assert_eq!(first_difference(&from_vd, &image), None, "{level:?}: the VD reads what was written");
        let from_target = read_as_jbod(&rig.engine, target, capacity);
        assert_eq!(first_difference(&from_target, &image), None, "{level:?}: the JBOD over the target reads the VD");
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A target that fails its writes stops the migration: the row jobs say it ended, and the
/// client's writes and flushes go on succeeding on the members.
#[test]
fn a_failing_target_stops_the_migration_and_never_a_client_write() {
    let rig = rig(Level::Raid5, 4);
    let capacity = rig.vd.capacity_bytes();
    let target = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + capacity))));
    let writer = Writer::start(&rig.engine, &rig.vd, 192 * KIB, 1);
    writer.wait_for(20);
    rig.vd.start_migration(Arc::clone(&target) as Arc<dyn Drive>);
    assert!(migrate_rows(&rig, 0, 4).iter().all(Result::is_ok));
    target.update_faults(|faults| faults.write_error_ranges = std::iter::once(0..u64::MAX).collect());
    writer.wait_for(50);
    let results = migrate_rows(&rig, 4, 4);
    assert!(results.iter().all(|r| matches!(r, Err(VdError::MigrationEnded { .. }))), "{results:?}");
    let migration = rig.vd.migration().expect("still stored until the controller ends it");
    assert!(migration.has_failed());
    writer.wait_for(50);
    let image = writer.finish();
    let from_vd = rig.engine.read_at(&rig.vd, 0, capacity as usize).unwrap().as_slice().to_vec();
    assert_eq!(first_difference(&from_vd, &image), None, "the VD holds every write");
}

/// A migration cannot start onto a target without room for the reserved area and the VD.
#[test]
#[should_panic(expected = "the migration target holds")]
fn a_target_too_small_is_refused() {
    let rig = rig(Level::Raid0, 2);
    let capacity = rig.vd.capacity_bytes();
    rig.vd.start_migration(Arc::new(MemDrive::new(capacity)));
}
