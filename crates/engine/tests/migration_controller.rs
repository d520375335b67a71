//! Live migration through the controller, on memory drives: `start_migration` copies a RAID5
//! onto a UGood drive while a client writes through the handle it held before (as an NBD
//! connection does), then the VD is a JBOD of that drive with the same id, name and size, its
//! old members UGood, and every write reads back, through the old handle, the new one, and
//! after a restart. A migration cut by a restart starts again and finishes; a target that fails
//! ends it and leaves the VD where it was; bad input changes nothing.

mod common;

use common::{engine, spec, Writer};
use drive::{Drive, Faults, FaultyDrive, MemDrive};
use engine::config::{ControllerId, DriveState};
use engine::controller::{ControlError, Controller, ControllerOptions, OfferedDrive};
use engine::{Engine, VirtualDrive};
use layout::{Level, KIB, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MEMBER_BYTES: u64 = 32 * MIB;
const TARGET_BYTES: u64 = 64 * MIB;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Slots 0-2: members of the RAID5; slot 3: the target (slowed down, so that clients write
/// while the copy runs).
fn drives() -> (Vec<Arc<dyn Drive>>, Arc<FaultyDrive>) {
    let mut drives: Vec<Arc<dyn Drive>> = (0..3).map(|_| Arc::new(MemDrive::new(MEMBER_BYTES)) as Arc<dyn Drive>).collect();
    let target = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(TARGET_BYTES))));
    target.set_faults(Faults { latency: Some(Duration::from_millis(2)), ..Faults::default() });
    drives.push(Arc::clone(&target) as Arc<dyn Drive>);
    (drives, target)
}

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

fn events(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

fn wait_for(controller: &Controller, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        let recent: Vec<String> = events(controller).into_iter().rev().take(10).collect();
        assert!(Instant::now() < deadline, "{what} never happened; recent events: {recent:#?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn check(engine: &Engine, vd: &Arc<VirtualDrive>, image: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, image.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let wrong = read.as_slice().iter().zip(image).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "{when}: first wrong byte");
}

/// Stops `controller` cleanly, opens `drives` again, and checks that v0 is a JBOD of slot 3
/// holding `image`.
fn holds_the_vd_after_a_restart(engine: &Arc<Engine>, controller: Arc<Controller>, drives: &[Arc<dyn Drive>], image: &[u8]) {
    let ours = controller.config().controller_id;
    controller.shutdown();
    drop(controller);
    let controller = open(engine, drives, Some(ours));
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.level, record.member_slots), (Level::Jbod, vec![3]));
    check(engine, &vd, image, "after a restart");
    controller.shutdown();
}

/// The target's recorded checkpoint (its drive record's `rebuild_row`).
fn checkpoint_of(controller: &Controller) -> u64 {
    controller.config().drives.iter().find(|d| d.slot == 3).expect("slot 3 recorded").rebuild_row
}

fn migrated(controller: &Controller) -> bool {
    controller.migrations().is_empty() && controller.slot(3).unwrap().state == DriveState::Online
}

#[test]
fn a_raid5_moves_onto_one_drive_under_writes_and_stays_there_after_a_restart() {
    let engine = engine();
    let (drives, _target) = drives();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, old) = controller.vd(0).unwrap();
    let capacity = old.capacity_bytes();
    let writer = Writer::start(&engine, &old, 64 * KIB, 1);
    writer.wait_for(50);
    controller.start_migration(0, 3).unwrap();
    assert_eq!(controller.slot(3).unwrap().state, DriveState::Migrate);
    assert_eq!(controller.migrations().len(), 1);
    writer.wait_for(200);
    wait_for(&controller, "the switch", || migrated(&controller));
    writer.wait_for(100); // through the old handle, now redirected
    let image = writer.finish();

    let (record, new) = controller.vd(0).unwrap();
    assert_eq!((record.level, record.member_slots.clone(), record.name.as_str()), (Level::Jbod, vec![3], "db"));
    assert_eq!(new.capacity_bytes(), capacity, "the same size");
    assert_eq!(new.export_identity(), old.export_identity(), "the export's connections follow it");
    assert!(old.successor().is_some_and(|s| Arc::ptr_eq(s, &new)), "the old handle leads to the new VD");
    for slot in 0..3 {
        assert_eq!(controller.slot(slot).unwrap().state, DriveState::UnconfiguredGood, "slot {slot} left the VD");
    }
    check(&engine, &old, &image, "through the old handle");
    check(&engine, &new, &image, "through the new one");
    holds_the_vd_after_a_restart(&engine, controller, &drives, &image);
}

/// A clean stop in the middle of the copy records its watermark as the target's checkpoint; the
/// next start clears that record before anything else and resumes there (a crash in the resumed
/// run then copies from row 0 again), and the VD on the target reads back every write made before
/// and during both runs.
#[test]
fn a_migration_cut_by_a_clean_stop_resumes_at_its_checkpoint_and_finishes() {
    let engine = engine();
    let (drives, target) = drives();
    target.set_faults(Faults { latency: Some(Duration::from_millis(20)), ..Faults::default() });
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let writer = Writer::start(&engine, &vd, 64 * KIB, 3);
    writer.wait_for(50);
    controller.start_migration(0, 3).unwrap();
    // While it runs, what could change rows the copy read, or lose the VD, is refused.
    let refused = controller.start_cc(0, true).expect_err("no check during a migration").to_string();
    assert!(refused.contains("being migrated"), "{refused}");
    let refused = controller.delete_vd(0, false, false).expect_err("no delete during a migration").to_string();
    assert!(refused.contains("stop the migration first"), "{refused}");
    let refused = controller.start_migration(0, 3).expect_err("one migration at a time").to_string();
    assert!(refused.contains("a migration runs on it"), "{refused}");
    let progress = Arc::clone(&controller.migrations()[0].progress);
    wait_for(&controller, "a part of the copy", || progress.watermark_row() >= progress.total_rows / 8);
    writer.wait_for(20);
    let image = writer.finish();
    let ours = controller.config().controller_id;
    controller.shutdown();
    let checkpoint = checkpoint_of(&controller);
    assert!(
        checkpoint >= progress.total_rows / 8 && checkpoint < progress.total_rows,
        "checkpoint {checkpoint} of {}",
        progress.total_rows
    );
    drop(controller);
    assert_eq!(target.info().capacity_bytes, TARGET_BYTES);

    let controller = open(&engine, &drives, Some(ours));
    assert_eq!(checkpoint_of(&controller), 0, "the checkpoint is cleared before the resumed run");
    let said = events(&controller);
    assert!(said.iter().any(|e| e.contains(&format!("starts again at row {checkpoint}"))), "{said:#?}");
    let (_, vd) = controller.vd(0).unwrap();
    let writer = Writer::resume(&engine, &vd, image, 64 * KIB, 1_000_003);
    writer.wait_for(20);
    target.set_faults(Faults::default());
    wait_for(&controller, "the switch after the restart", || migrated(&controller));
    let image = writer.finish();
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.member_slots, checkpoint_of(&controller)), (vec![3], 0));
    check(&engine, &vd, &image, "after the migration resumed");
    controller.shutdown();
}

#[test]
fn a_target_that_fails_ends_the_migration_and_the_vd_stays_where_it_was() {
    let engine = engine();
    let (drives, target) = drives();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let writer = Writer::start(&engine, &vd, 64 * KIB, 5);
    controller.start_migration(0, 3).unwrap();
    writer.wait_for(20);
    target.set_faults(Faults { write_error_ranges: std::iter::once(0..u64::MAX).collect(), ..Faults::default() });
    wait_for(&controller, "the end of the migration", || controller.migrations().is_empty());
    writer.wait_for(20);
    let image = writer.finish();
    assert_eq!(controller.slot(3).unwrap().state, DriveState::UnconfiguredBad);
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.level, record.member_slots), (Level::Raid5, vec![0, 1, 2]));
    check(&engine, &vd, &image, "the VD where it was");
    controller.shutdown();
}

#[test]
fn bad_migrations_are_refused_and_change_nothing() {
    let engine = engine();
    let (mut drives, _target) = drives();
    drives.push(Arc::new(MemDrive::new(8 * MIB)));
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let generation = controller.config().generation;
    let refused = |vd_id, target, expected: &str| {
        let error = controller.start_migration(vd_id, target).expect_err("refused");
        let message = error.to_string();
        assert!(message.contains(expected), "{message:?} should say {expected:?}");
        matches!(error, ControlError::BadInput(_) | ControlError::Conflict(_) | ControlError::NotFound(_))
    };
    assert!(refused(7, 3, "7"));
    assert!(refused(0, 1, "slot 1 is Onln; the target must be UGood"));
    assert!(refused(0, 4, "slot 4 holds 8388608 bytes"));
    assert!(refused(0, 9, "slot 9 holds no drive"));
    assert_eq!(controller.config().generation, generation, "nothing was written");
    assert!(controller.migrations().is_empty());
    assert!(controller.stop_migration(0).is_err());
    controller.shutdown();
}

/// `start migrate target=SPEC`: a blank drive the controller did not hold takes a slot of its own
/// and receives the VD in the same configuration write; after the switch and a restart (the
/// drive offered last, as the daemon does with the drives it added) the VD is a JBOD of it.
#[test]
fn a_blank_drive_added_at_run_time_receives_the_vd_and_holds_it_after_a_restart() {
    let engine = engine();
    let (mut drives, target) = drives();
    drives.truncate(3);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    assert_eq!(controller.migration_target_bytes(0).unwrap(), 4 * MIB + vd.capacity_bytes());
    let writer = Writer::start(&engine, &vd, 64 * KIB, 7);
    writer.wait_for(20);
    let offer = OfferedDrive { drive: Arc::clone(&target) as Arc<dyn Drive>, source: "rbd:rbd/db".into() };
    assert_eq!(controller.start_migration_onto(0, offer).unwrap(), 3, "the lowest free slot");
    assert_eq!(controller.slot_of_source("rbd:rbd/db"), Some(3));
    let views = controller.migrations();
    assert_eq!((views[0].target_slot, views[0].target_source.as_str()), (3, "rbd:rbd/db"));
    writer.wait_for(100);
    wait_for(&controller, "the switch", || migrated(&controller));
    let image = writer.finish();
    let said = events(&controller);
    assert!(said.iter().any(|e| e.contains("slot 3: rbd:rbd/db") && e.contains("added to receive v0")), "{said:#?}");
    drives.push(target);
    holds_the_vd_after_a_restart(&engine, controller, &drives, &image);
}

#[test]
fn a_drive_that_is_not_blank_small_or_held_already_is_not_added() {
    let engine = engine();
    let (mut drives, _target) = drives();
    drives.truncate(3);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let generation = controller.config().generation;
    let refused = |drive: Arc<dyn Drive>, source: &str, expected: &str| {
        let message = controller.start_migration_onto(0, OfferedDrive { drive, source: source.into() }).expect_err("refused").to_string();
        assert!(message.contains(expected), "{message:?} should say {expected:?}");
    };
    refused(Arc::clone(&drives[1]), "mem1", "is slot 1 already; give target=1");
    refused(Arc::clone(&drives[1]), "the same drive under another name", "holds the configuration of this controller");
    refused(Arc::new(MemDrive::new(8 * MIB)), "small", "small holds 8388608 bytes");
    let message = controller.start_migration_onto(4, OfferedDrive { drive: Arc::new(MemDrive::new(TARGET_BYTES)), source: "x".into() });
    assert!(message.expect_err("no v4").to_string().contains("v4"));
    assert_eq!(controller.config().generation, generation, "nothing was written");
    assert_eq!(controller.config().drives.len(), 3, "no drive was added");
    assert!(controller.migrations().is_empty());
    controller.shutdown();
}

#[test]
fn a_paused_migration_copies_nothing_until_it_is_resumed() {
    let engine = engine();
    let (drives, target) = drives();
    target.set_faults(Faults { latency: Some(Duration::from_millis(5)), ..Faults::default() });
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.start_migration(0, 3).unwrap();
    let refused = controller.pause_migration(0, false).expect_err("resume of a running one").to_string();
    assert!(refused.contains("can be resumed only when it is paused"), "{refused}");
    controller.pause_migration(0, true).unwrap();
    let view = controller.migrations().remove(0);
    assert_eq!(view.status(), "Paused");
    // The run in flight when the pause came may still land; after that nothing moves.
    std::thread::sleep(Duration::from_millis(300));
    let paused_at = view.progress.percent_done();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(view.progress.percent_done(), paused_at, "the copy went on while paused");
    assert!(paused_at < 100.0);
    controller.pause_migration(0, false).unwrap();
    target.set_faults(Faults::default());
    wait_for(&controller, "the switch after the resume", || migrated(&controller));
    assert!(controller.pause_migration(0, true).is_err(), "nothing to pause any more");
    let said = events(&controller);
    assert!(said.iter().any(|e| e.contains("migration of v0: paused by the administrator")), "{said:#?}");
    controller.shutdown();
}
