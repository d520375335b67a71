//! The controller over memory drives: assembly from the drives' own metadata, stale and missing
//! members, foreign configurations, and bad input that changes nothing.

use drive::{Drive, MemDrive};
use engine::config::{ControllerId, DriveState, IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::{ControlError, Controller, ControllerOptions, CreateVdSpec, DriveCommand, OfferedDrive};
use engine::{Engine, EngineConfig, VdState};
use layout::{Level, KIB, MIB};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 64 * MIB;

fn drives(count: usize) -> Vec<Arc<dyn Drive>> {
    (0..count).map(|_| Arc::new(MemDrive::new(DRIVE_BYTES)) as Arc<dyn Drive>).collect()
}

fn engine() -> Arc<Engine> {
    Arc::new(Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap())
}

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    open_as(engine, drives, None)
}

/// Opens as the controller with id `ours` (what the daemon remembers in its data directory).
fn open_as(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

fn spec(level: Level, slots: &[u32], name: &str) -> CreateVdSpec {
    CreateVdSpec {
        level,
        slots: slots.to_vec(),
        strip_size_bytes: 64 * KIB,
        name: Some(name.to_string()),
        drives_per_span: None,
        write_policy: WritePolicy::WriteThrough,
        read_policy: ReadPolicy::NoReadAhead,
        io_policy: IoPolicy::Direct,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

#[test]
fn a_second_start_finds_the_same_configuration_and_data_on_the_drives() {
    let engine = engine();
    let members = drives(5);
    let first = open(&engine, &members);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    first.add_hot_spare(4, vec![0]).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(1 << 20, 1)).unwrap();
    let before = first.config();
    first.shutdown();
    drop(first);

    // The drives come back in another order: slots follow the drives, not the order.
    let mut shuffled = members.clone();
    shuffled.reverse();
    let second = open(&engine, &shuffled);
    let after = second.config();
    assert_eq!(after.controller_id, before.controller_id);
    assert_eq!(after.vds, before.vds);
    assert_eq!(after.hot_spares, before.hot_spares);
    assert!(after.generation > before.generation);
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(vd.state(), VdState::Optimal);
    assert!(engine.read_at(&vd, 0, 1 << 20).unwrap().as_slice() == pattern(1 << 20, 1).as_slice());
}

#[test]
fn a_member_left_out_is_missing_and_comes_back_out_of_date() {
    let engine = engine();
    let members = drives(3);
    let first = open(&engine, &members);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    first.shutdown();
    drop(first);

    // Start without drive 2: the VD is degraded, the slot missing, and the change is recorded.
    let second = open(&engine, &members[..2]);
    assert_eq!(second.vd(0).unwrap().1.state(), VdState::Degraded);
    assert_eq!(second.slot(2).unwrap().state, DriveState::Missing);
    let (_, vd) = second.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(256 << 10, 2)).unwrap();
    second.shutdown();
    drop(second);

    // Drive 2 returns: the configuration recorded it missing, so it missed writes and is not trusted.
    let third = open(&engine, &members);
    assert_eq!(third.slot(2).unwrap().state, DriveState::Failed);
    let (_, vd) = third.vd(0).unwrap();
    assert_eq!(vd.state(), VdState::Degraded);
    assert!(engine.read_at(&vd, 0, 256 << 10).unwrap().as_slice() == pattern(256 << 10, 2).as_slice());
}

#[test]
fn drives_of_another_controller_are_foreign_until_imported_or_cleared() {
    let engine = engine();
    let ours = drives(3);
    let theirs = drives(3);
    let a = open(&engine, &ours);
    a.create_vd(spec(Level::Raid1, &[0, 1], "mine")).unwrap();
    let ours_id = a.config().controller_id;
    a.shutdown();
    drop(a);
    let b = open(&engine, &theirs);
    b.create_vd(spec(Level::Raid5, &[0, 1, 2], "theirs")).unwrap();
    let (_, vd) = b.vd(0).unwrap();
    engine.write_at(&vd, 4096, &pattern(64 << 10, 3)).unwrap();
    b.shutdown();
    drop(b);

    let all: Vec<Arc<dyn Drive>> = ours.iter().chain(&theirs).cloned().collect();
    // Without an id of its own the controller cannot tell which of two arrays is its own.
    let undecided = open(&engine, &all);
    assert!(undecided.vds().is_empty() && undecided.foreign().len() == 2);
    drop(undecided);
    let merged = open_as(&engine, &all, Some(ours_id));
    assert_eq!(merged.vds().len(), 1, "only our VD is assembled");
    assert_eq!(merged.foreign().len(), 1);
    assert!(merged.slots().iter().filter(|s| s.foreign).count() == 3);
    let error = merged.create_vd(spec(Level::Raid0, &[3], "grab")).unwrap_err();
    assert!(matches!(error, ControlError::Conflict(_)), "foreign drives cannot be reused: {error}");

    assert_eq!(merged.import_foreign().unwrap(), 1);
    let (record, vd) = merged.vds().into_iter().find(|(r, _)| r.name == "theirs").unwrap();
    assert_eq!(record.level, Level::Raid5);
    assert_eq!(vd.state(), VdState::Optimal);
    assert!(engine.read_at(&vd, 4096, 64 << 10).unwrap().as_slice() == pattern(64 << 10, 3).as_slice());
    assert!(merged.foreign().is_empty());
}

#[test]
fn clearing_a_foreign_configuration_frees_its_drives() {
    let engine = engine();
    let theirs = drives(2);
    let b = open(&engine, &theirs);
    b.create_vd(spec(Level::Raid1, &[0, 1], "theirs")).unwrap();
    b.shutdown();
    drop(b);
    let mut all = drives(1);
    all.extend(theirs.iter().cloned());
    // Our own id first: a controller with its own drive and two foreign ones.
    let ours = open(&engine, &all[..1]);
    let ours_id = ours.config().controller_id;
    ours.shutdown();
    drop(ours);
    let merged = open_as(&engine, &all, Some(ours_id));
    assert_eq!(merged.foreign().len(), 1);
    assert_eq!(merged.clear_foreign().unwrap(), 1);
    assert!(merged.slots().iter().all(|s| !s.foreign && s.state == DriveState::UnconfiguredGood));
    merged.create_vd(spec(Level::Raid1, &[1, 2], "reused")).unwrap();
}

#[test]
fn bad_requests_name_the_problem_and_change_nothing() {
    let engine = engine();
    let controller = open(&engine, &drives(4));
    controller.create_vd(spec(Level::Raid1, &[2, 3], "a")).unwrap();
    let generation = controller.config().generation;
    let check = |result: Result<(), ControlError>, expected: &str| {
        assert_eq!(result.unwrap_err().to_string(), expected);
        assert_eq!(controller.config().generation, generation, "nothing written after: {expected}");
    };
    check(controller.create_vd(spec(Level::Raid5, &[0, 1], "x")).map(|_| ()), "RAID5 needs 3 to 32 drives; got 2: slots 0, 1");
    check(controller.create_vd(spec(Level::Raid0, &[0, 0], "x")).map(|_| ()), "slot 0 is listed twice: slots 0, 0");
    check(controller.create_vd(spec(Level::Raid0, &[7], "x")).map(|_| ()), "slot 7 does not exist; slots: 0, 1, 2, 3");
    check(
        controller.create_vd(spec(Level::Raid0, &[0, 2], "x")).map(|_| ()),
        "slot 2 is a member of v0; a new VD needs unconfigured good (UGood) drives",
    );
    check(
        controller.create_vd(spec(Level::Raid0, &[0], "a")).map(|_| ()),
        "VD name \"a\" is used by v0; names are NBD export names and must be unique",
    );
    check(
        controller.set_drive(0, DriveCommand::Offline),
        "slot 0 is UGood; `set offline` is allowed only for online members of a VD (Onln)",
    );
    check(controller.add_hot_spare(1, vec![5]), "drive group 5 does not exist; drive groups: 0");
    check(controller.delete_vd(3, false, false), "virtual drive v3 does not exist; VDs: v0");
}

#[test]
fn a_member_that_missed_writes_cannot_be_set_online() {
    let engine = engine();
    let controller = open(&engine, &drives(3));
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    controller.set_drive(1, DriveCommand::Online).unwrap(); // nothing was written meanwhile
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(4096, 4)).unwrap();
    let error = controller.set_drive(1, DriveCommand::Online).unwrap_err();
    assert!(error.to_string().contains("missed writes"), "{error}");
    assert_eq!(vd.state(), VdState::Degraded);
    assert!(engine.read_at(&vd, 0, 4096).unwrap().as_slice() == pattern(4096, 4).as_slice());
}

/// Regression: the mark that a member missed writes lived only in memory, so after a restart an
/// offline member could be set online and the VD served its stale strips.
#[test]
fn a_restart_does_not_forget_that_an_offline_member_missed_writes() {
    let engine = engine();
    let members = drives(3);
    let first = open(&engine, &members);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(1 << 20, 5)).unwrap();
    first.set_drive(2, DriveCommand::Offline).unwrap();
    engine.write_at(&vd, 0, &pattern(1 << 20, 6)).unwrap();
    let id = first.config().controller_id;
    first.shutdown();
    drop(first);

    let second = open_as(&engine, &members, Some(id));
    assert_eq!(second.slot(2).unwrap().state, DriveState::Offline);
    let error = second.set_drive(2, DriveCommand::Online).unwrap_err();
    assert!(error.to_string().contains("rebuild"), "{error}");
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(vd.state(), VdState::Degraded);
    assert!(engine.read_at(&vd, 0, 1 << 20).unwrap().as_slice() == pattern(1 << 20, 6).as_slice());
}

/// Deleting a VD must not turn a spare dedicated to it into a global spare.
#[test]
fn a_spare_dedicated_to_a_deleted_vd_becomes_unconfigured_good() {
    let engine = engine();
    let controller = open(&engine, &drives(4));
    controller.create_vd(spec(Level::Raid1, &[0, 1], "a")).unwrap();
    controller.add_hot_spare(2, vec![0]).unwrap();
    controller.add_hot_spare(3, vec![]).unwrap();
    controller.delete_vd(0, false, false).unwrap();
    assert_eq!(controller.slot(2).unwrap().state, DriveState::UnconfiguredGood);
    assert!(controller.slot(2).unwrap().hot_spare_drive_groups.is_none());
    assert_eq!(controller.slot(3).unwrap().hot_spare_drive_groups, Some(vec![]), "the global spare stays");
}
