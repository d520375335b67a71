//! The controller over memory drives: assembly from the drives' own metadata, stale and missing
//! members, foreign configurations, and bad input that changes nothing.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, MemDrive};
use engine::config::{ControllerId, DriveState};
use engine::controller::{ControlError, Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive};
use engine::{Engine, VdState};
use layout::{Level, MIB};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 64 * MIB;

fn drives(count: usize) -> Vec<Arc<dyn Drive>> {
    mem_drives(count, DRIVE_BYTES)
}

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    open_as(engine, drives, None)
}

/// Opens as the controller with id `ours` (what the daemon remembers in its data directory).
fn open_as(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
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

/// A member that missed writes comes back through a resync of what it missed (the bitmap's
/// dirty regions; `tests/bitmap.rs` has the details), never straight into service.
#[test]
fn a_member_that_missed_writes_comes_back_through_a_resync() {
    let engine = engine();
    let controller = open(&engine, &drives(3));
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    controller.set_drive(1, DriveCommand::Online).unwrap(); // nothing was written meanwhile
    assert_eq!(controller.slot(1).unwrap().state, DriveState::Online);
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(4096, 4)).unwrap();
    controller.set_drive(1, DriveCommand::Online).unwrap();
    wait_online(&controller, 1);
    controller.set_drive(0, DriveCommand::Offline).unwrap();
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
    second.set_drive(2, DriveCommand::Online).unwrap();
    assert_ne!(second.slot(2).unwrap().state, DriveState::Online, "it is resynced first");
    wait_online(&second, 2);
    let (_, vd) = second.vd(0).unwrap();
    second.set_drive(0, DriveCommand::Offline).unwrap();
    assert!(engine.read_at(&vd, 0, 1 << 20).unwrap().as_slice() == pattern(1 << 20, 6).as_slice());
}

fn wait_online(controller: &Controller, slot: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while controller.slot(slot).unwrap().state != DriveState::Online {
        assert!(std::time::Instant::now() < deadline, "slot {slot} never came back online");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
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

/// A drive holding `source`'s metadata area but only `capacity_bytes`: a member file that was
/// truncated while the daemon was stopped.
fn shrunken_copy(source: &Arc<dyn Drive>, capacity_bytes: u64) -> Arc<dyn Drive> {
    let copy: Arc<dyn Drive> = Arc::new(MemDrive::new(capacity_bytes));
    let mut ctx = drive::IoCtx::without_ring();
    let area = engine::metadata::METADATA_AREA_BYTES as usize;
    let run = |drive: &Arc<dyn Drive>, ctx: &mut drive::IoCtx, op| {
        drive.submit(ctx, 1, op);
        let mut out = Vec::new();
        while out.is_empty() {
            ctx.poll(&mut out, true);
        }
        out.pop().unwrap()
    };
    let read = run(source, &mut ctx, drive::DriveOp::Read { offset_bytes: 0, buf: drive::IoBuf::zeroed(area) });
    run(&copy, &mut ctx, drive::DriveOp::Write { offset_bytes: 0, buf: read.buf.unwrap() }).result.unwrap();
    copy
}

/// Regression: a member truncated while stopped made the VD silently shrink, and when the file
/// grew back, data read as zeros. A member smaller than the VD's recorded member size is not
/// used: the slot is failed with an event naming the sizes, and the VD keeps its size.
#[test]
fn a_member_that_shrank_while_stopped_is_not_used_and_the_vd_keeps_its_size() {
    let engine = engine();
    let mut members = drives(3);
    let first = open(&engine, &members);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    let capacity_bytes = vd.capacity_bytes();
    let data = pattern(capacity_bytes as usize, 7);
    engine.write_at(&vd, 0, &data).unwrap();
    let id = first.config().controller_id;
    first.shutdown();
    drop(first);

    members[1] = shrunken_copy(&members[1], DRIVE_BYTES / 2);
    let second = open_as(&engine, &members, Some(id));
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(vd.capacity_bytes(), capacity_bytes, "the VD keeps its size");
    assert_eq!(second.slot(1).unwrap().state, DriveState::Failed);
    assert_eq!(vd.state(), VdState::Degraded);
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    let expected = format!("has {} bytes but v0 was laid out on {DRIVE_BYTES} bytes per member", DRIVE_BYTES / 2);
    assert!(events.iter().any(|e| e.contains("slot 1") && e.contains(&expected)), "{events:#?}");
    assert!(events.iter().any(|e| e.contains("v0 \"db\" starts Dgrd: slot 1 Failed")), "{events:#?}");
    assert!(engine.read_at(&vd, 0, data.len()).unwrap().as_slice() == data.as_slice(), "every byte reads back");
}

/// Regression: a member file truncated to half while serving made 216 MiB of a RAID5 read back
/// as zeros, with no error and the VD still Optimal.
#[test]
fn a_member_file_truncated_while_serving_is_repaired_from_parity_never_read_as_zeros() {
    let engine = engine();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let paths: Vec<_> = (0..4).map(|i| dir.path().join(format!("d{i}"))).collect();
    let members: Vec<Arc<dyn Drive>> = paths
        .iter()
        .map(|path| {
            let config = drive::FileDriveConfig { create_size_bytes: Some(DRIVE_BYTES), ..Default::default() };
            Arc::new(drive::FileDrive::open(path, &config).unwrap()) as Arc<dyn Drive>
        })
        .collect();
    let controller = open(&engine, &members);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let data = pattern(vd.capacity_bytes() as usize, 8);
    engine.write_at(&vd, 0, &data).unwrap();
    std::fs::OpenOptions::new().write(true).open(&paths[2]).unwrap().set_len(DRIVE_BYTES / 2).unwrap();
    let read = engine.read_at(&vd, 0, data.len()).unwrap();
    let first_wrong = read.as_slice().iter().zip(&data).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "every byte reads back");
    let slot = controller.slot(2).unwrap();
    assert!(slot.read_errors > 0 || slot.state == DriveState::Failed, "the short reads were booked against slot 2");
}

/// Regression: after `del force`, a client still connected kept reading and writing the deleted
/// VD, and after a new VD was created on the same drives it overwrote that VD's data.
#[test]
fn a_deleted_vd_refuses_every_request_and_cannot_touch_the_vd_that_reuses_its_drives() {
    let engine = engine();
    let controller = open(&engine, &drives(3));
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "old")).unwrap();
    let (_, old) = controller.vd(0).unwrap();
    engine.write_at(&old, 0, &pattern(64 << 10, 1)).unwrap();
    controller.delete_vd(0, true, true).unwrap();
    assert_eq!(old.requests_in_flight(), 0);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "new")).unwrap();
    let (_, new) = controller.vd(0).unwrap();
    assert_ne!(new.instance_id(), old.instance_id());
    engine.write_at(&new, 0, &pattern(64 << 10, 2)).unwrap();

    let error = engine.write_at(&old, 0, &pattern(64 << 10, 3)).unwrap_err();
    assert_eq!(error.to_string(), "virtual drive old was deleted");
    assert!(engine.read_at(&old, 0, 4096).is_err(), "reads are refused too");
    assert!(engine.flush(&old).is_err(), "and flushes");
    assert!(engine.read_at(&new, 0, 64 << 10).unwrap().as_slice() == pattern(64 << 10, 2).as_slice(), "the new VD is untouched");
}

/// Regression: a rename rebuilt the VD object, so connections on the old object kept writing to a
/// member that was set offline afterwards.
#[test]
fn a_renamed_vd_is_the_same_object_and_follows_member_state_changes() {
    let engine = engine();
    let controller = open(&engine, &drives(3));
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "before")).unwrap();
    let (_, held) = controller.vd(0).unwrap();
    controller.set_vd(0, engine::controller::VdChanges { name: Some("after".into()), ..Default::default() }).unwrap();
    let (_, current) = controller.vd(0).unwrap();
    assert!(Arc::ptr_eq(&held, &current), "a rename keeps the object clients hold");
    assert_eq!(held.name(), "after");
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    assert_eq!(held.state(), VdState::Degraded, "the held object sees the member go offline");
}

fn drive_states(controller: &Controller) -> Vec<(u32, DriveState)> {
    controller.slots().iter().map(|s| (s.slot, s.state)).collect()
}

/// Checks that the drives went from `before` to what `controller` shows now, and that every
/// change was recorded by exactly one event "slot N: A -> B (cause...)" after `since` events.
fn check_changes(controller: &Controller, before: &[(u32, DriveState)], since: usize, expected: &[(u32, DriveState)]) {
    let after = drive_states(controller);
    let changed: Vec<(u32, DriveState)> = after.iter().filter(|state| !before.contains(state)).copied().collect();
    assert_eq!(changed, expected, "drive states after {before:?}");
    let events: Vec<String> = controller.events().into_iter().skip(since).map(|e| e.description).collect();
    let transitions: Vec<&String> = events.iter().filter(|e| e.starts_with("slot ") && e.contains(" -> ")).collect();
    assert_eq!(transitions.len(), changed.len(), "one event per change: {events:#?}");
    for (slot, to) in changed {
        let from = before.iter().find(|(s, _)| *s == slot).map(|(_, state)| state.short_name()).unwrap();
        let prefix = format!("slot {slot}: {from} -> {} (", to.short_name());
        assert!(transitions.iter().any(|e| e.starts_with(&prefix)), "no event {prefix:?}...: {events:#?}");
    }
}

/// Every drive state change, by the administrator or by assembly, is recorded as an event; a
/// failed member of a deleted VD becomes UBad and only `set good` makes it usable again.
#[test]
fn every_drive_state_change_is_recorded_and_a_deleted_vds_failed_member_is_unconfigured_bad() {
    use DriveState::*;
    let engine = engine();
    let members = drives(4);
    let first = open(&engine, &members);
    // The spare stays a spare here: this test walks the states by hand.
    first.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    let (before, since) = (drive_states(&first), first.events().len());
    first.create_vd(spec(Level::Raid1, &[0, 1], "m")).unwrap();
    first.add_hot_spare(2, vec![0]).unwrap();
    check_changes(&first, &before, since, &[(0, Online), (1, Online), (2, HotSpare)]);
    first.set_drive(3, DriveCommand::Good).unwrap_err();
    for (slot, command, to) in [(0, DriveCommand::Offline, Offline), (0, DriveCommand::Online, Online), (1, DriveCommand::Missing, Missing)]
    {
        let (before, since) = (drive_states(&first), first.events().len());
        first.set_drive(slot, command).unwrap();
        check_changes(&first, &before, since, &[(slot, to)]);
    }
    let id = first.config().controller_id;
    let before = drive_states(&first);
    first.shutdown();
    drop(first);

    // Slot 1 found again: it missed the writes made while it was missing.
    let second = open_as(&engine, &members, Some(id));
    check_changes(&second, &before, 0, &[(1, Failed)]);
    let (before, since) = (drive_states(&second), second.events().len());
    second.delete_vd(0, false, false).unwrap();
    check_changes(&second, &before, since, &[(0, UnconfiguredGood), (1, UnconfiguredBad), (2, UnconfiguredGood)]);

    let generation = second.config().generation;
    let refused = |result: Result<(), ControlError>, expected: &str| assert_eq!(result.unwrap_err().to_string(), expected);
    refused(second.add_hot_spare(1, vec![]), "slot 1 is UBad; only an unconfigured good (UGood) drive can become a hot spare");
    refused(second.create_vd(spec(Level::Raid0, &[1], "x")).map(|_| ()), "slot 1 is UBad; a new VD needs unconfigured good (UGood) drives");
    refused(
        second.set_drive(1, DriveCommand::Online),
        "slot 1 is UBad; `set online` is allowed only for members of a VD that are Offln, Failed or Msng",
    );
    refused(
        second.set_drive(0, DriveCommand::Good),
        "slot 0 is UGood; `set good` is allowed only for drives in no VD that are UBad, Failed or Offln",
    );
    assert_eq!(second.config().generation, generation, "refusals change nothing");
    let (before, since) = (drive_states(&second), second.events().len());
    second.set_drive(1, DriveCommand::Good).unwrap();
    check_changes(&second, &before, since, &[(1, UnconfiguredGood)]);
    second.create_vd(spec(Level::Raid1, &[0, 1], "again")).unwrap();
}

/// A UBad drive absent at a start stays UBad (as Msng it would come back good), and it takes
/// no metadata writes.
#[test]
fn an_unconfigured_bad_drive_stays_bad_across_restarts_with_or_without_it() {
    let engine = engine();
    let members = drives(3);
    let first = open(&engine, &members);
    first.create_vd(spec(Level::Raid1, &[0, 1], "m")).unwrap();
    first.set_drive(1, DriveCommand::Missing).unwrap();
    let id = first.config().controller_id;
    first.shutdown();
    drop(first);
    let second = open_as(&engine, &members, Some(id));
    second.delete_vd(0, false, false).unwrap();
    assert_eq!(second.slot(1).unwrap().state, DriveState::UnconfiguredBad);
    second.shutdown();
    drop(second);

    let without = open_as(&engine, &[Arc::clone(&members[0]), Arc::clone(&members[2])], Some(id));
    assert_eq!(without.slot(1).unwrap().state, DriveState::UnconfiguredBad, "absent, still bad");
    without.shutdown();
    drop(without);
    let with = open_as(&engine, &members, Some(id));
    assert_eq!(with.slot(1).unwrap().state, DriveState::UnconfiguredBad, "found again, still bad");
    let stored = engine::metadata::read(&*members[1]).unwrap().unwrap().superblock;
    assert!(stored.generation < with.config().generation, "a UBad drive is not written to");
}
