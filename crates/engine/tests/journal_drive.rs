//! A slot's drive as the journal (`/c0/sN set journal`): the configuration says where the
//! journal is, so a restart replays it with no journal option; a second journal drive makes a
//! mirrored pair with the leg in service; a leg that fails makes its drive UBad; a journal drive
//! another journal replaces, or whose journal is removed, is UGood again; what is not an
//! unconfigured good drive, or a third leg, is refused with the reason.

mod common;

use common::{check, engine, mem_drives, scatter, spec, wait_until};
use drive::{Drive, FaultyDrive, MemDrive};
use engine::config::{ControllerId, DriveState as ConfigDriveState, WritePolicy};
use engine::controller::{ControlError, Controller, ControllerOptions, DriveCommand, JournalOffer, JournalState, OfferedDrive};
use engine::{Engine, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 64 * MIB;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>, journal: Vec<JournalOffer>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, journal, ..ControllerOptions::default() }).unwrap()
}

fn wb_raid5(controller: &Controller) -> Arc<VirtualDrive> {
    let mut vd_spec = spec(Level::Raid5, &[0, 1, 2, 3], "db");
    vd_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(vd_spec).unwrap();
    controller.vd(0).unwrap().1
}

fn state_of(controller: &Controller, slot: u32) -> ConfigDriveState {
    controller.slot(slot).unwrap().state
}

fn conflict(result: Result<impl std::fmt::Debug, ControlError>) -> String {
    match result {
        Err(ControlError::Conflict(message)) => message,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn a_slot_drive_holds_the_journal_and_a_restart_replays_it_without_being_told_where_it_is() {
    let drives = mem_drives(5, DRIVE_BYTES);
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, Vec::new());
        let vd = wb_raid5(&controller);
        assert_eq!(controller.journal_view().state, JournalState::Missing);
        let member = conflict(controller.assign_journal_drive(0));
        assert_eq!(member, "slot 0 is Onln; only an unconfigured good (UGood) drive can hold the journal");
        assert!(matches!(controller.assign_journal_drive(9), Err(ControlError::NotFound(_))));
        let before = controller.config().generation;
        let view = controller.assign_journal_drive(4).unwrap();
        assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("slot 4")), "{view:?}");
        assert_eq!(view.capacity_bytes, DRIVE_BYTES - engine::controller::JOURNAL_DRIVE_OFFSET_BYTES);
        assert_eq!(state_of(&controller, 4), ConfigDriveState::Journal);
        assert!(controller.config().generation > before, "the configuration says where the journal is");
        assert!(controller.journal_usable(), "WB runs WB");
        let good = conflict(controller.set_drive(4, DriveCommand::Good));
        assert!(good.contains("UBad, Failed or Offln"), "{good}");
        scatter(&engine, &vd, &mut image, 1, 300);
        assert!(controller.journal_view().used_bytes > 0, "the records are in the journal");
        controller.config().controller_id
        // Dropped without a shutdown, within the age limit: the members never saw most of it.
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), Vec::new());
    let view = controller.journal_view();
    assert_eq!(view.source.as_deref(), Some("slot 4"), "{view:?}");
    assert!(view.replay.records >= 300, "every write was replayed from the slot's drive: {view:?}");
    assert_eq!(state_of(&controller, 4), ConfigDriveState::Journal);
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after replay");
    controller.shutdown();
}

#[test]
fn a_second_journal_drive_makes_a_pair_and_a_failed_leg_becomes_unconfigured_bad() {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))));
    let mut drives = mem_drives(5, DRIVE_BYTES);
    drives.push(Arc::clone(&failing) as Arc<dyn Drive>);
    drives.extend(mem_drives(2, DRIVE_BYTES));
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, Vec::new());
        let vd = wb_raid5(&controller);
        controller.assign_journal_drive(4).unwrap();
        scatter(&engine, &vd, &mut image, 1, 50);
        let view = controller.assign_journal_drive(5).unwrap();
        assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("slot 4 + slot 5")), "{view:?}");
        let third = conflict(controller.assign_journal_drive(6));
        assert!(third.contains("mirrored pair in full service already (slot 4 + slot 5)"), "{third}");
        assert_eq!(state_of(&controller, 6), ConfigDriveState::UnconfiguredGood, "a refused command changes nothing");
        scatter(&engine, &vd, &mut image, 2, 50);
        failing.set_failed(true);
        scatter(&engine, &vd, &mut image, 3, 50);
        wait_until("slot 5 UBad", &controller, || state_of(&controller, 5) == ConfigDriveState::UnconfiguredBad);
        assert_eq!(controller.journal_view().state, JournalState::Degraded);
        let view = controller.assign_journal_drive(6).unwrap();
        assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("slot 4 + slot 6")), "{view:?}");
        scatter(&engine, &vd, &mut image, 4, 100);
        check(&engine, &vd, &image, "with the new pair");
        controller.config().controller_id
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), Vec::new());
    let view = controller.journal_view();
    assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("slot 4 + slot 6")), "{view:?}");
    assert!(view.replay.found, "{view:?}");
    let states: Vec<ConfigDriveState> = (4..7).map(|slot| state_of(&controller, slot)).collect();
    assert_eq!(states, [ConfigDriveState::Journal, ConfigDriveState::UnconfiguredBad, ConfigDriveState::Journal]);
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after replay from the pair");
    controller.shutdown();
}

#[test]
fn a_journal_drive_that_another_journal_replaces_is_unconfigured_good_again() {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))));
    let mut drives = mem_drives(4, DRIVE_BYTES);
    drives.push(Arc::clone(&failing) as Arc<dyn Drive>);
    drives.extend(mem_drives(1, DRIVE_BYTES));
    let engine = engine();
    let controller = open(&engine, &drives, None, Vec::new());
    let vd = wb_raid5(&controller);
    controller.assign_journal_drive(4).unwrap();
    controller.assign_journal_drive(5).unwrap();
    let mut image = vec![0u8; 16 * MIB as usize];
    scatter(&engine, &vd, &mut image, 1, 50);
    failing.set_failed(true);
    scatter(&engine, &vd, &mut image, 2, 50);
    wait_until("slot 4 UBad", &controller, || state_of(&controller, 4) == ConfigDriveState::UnconfiguredBad);
    let files: Vec<Arc<dyn Drive>> = mem_drives(2, DRIVE_BYTES);
    let legs =
        files.iter().enumerate().map(|(i, d)| JournalOffer { drive: Arc::clone(d), source: format!("j{i}"), path: None, slot: None });
    let view = controller.attach_journal(legs.collect()).unwrap();
    assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("j0 + j1")), "{view:?}");
    assert_eq!(state_of(&controller, 5), ConfigDriveState::UnconfiguredGood, "freed by the replacement");
    assert_eq!(state_of(&controller, 4), ConfigDriveState::UnconfiguredBad, "a failed one stays bad");
    let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e == "slot 5: Jrnl -> UGood (journal replaced)"), "{events:#?}");
    scatter(&engine, &vd, &mut image, 3, 50);
    check(&engine, &vd, &image, "with the new journal");
    controller.shutdown();
}

#[test]
fn removing_the_journal_writes_the_cache_out_frees_its_drive_and_write_back_runs_write_through() {
    let drives = mem_drives(5, DRIVE_BYTES);
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, Vec::new());
        let vd = wb_raid5(&controller);
        let nothing = conflict(controller.remove_journal());
        assert!(nothing.starts_with("no journal is attached"), "{nothing}");
        controller.assign_journal_drive(4).unwrap();
        scatter(&engine, &vd, &mut image, 1, 300);
        assert!(controller.journal_view().used_bytes > 0, "the writes are in the journal");
        let view = controller.remove_journal().unwrap();
        assert_eq!((view.state, view.source.as_deref()), (JournalState::Missing, None), "{view:?}");
        let reason = view.reason.unwrap_or_default();
        assert!(reason.contains("journal slot 4 was removed by the administrator"), "{reason}");
        assert_eq!(state_of(&controller, 4), ConfigDriveState::UnconfiguredGood, "the drive is free");
        assert!(!controller.journal_usable(), "WB runs WT");
        assert_eq!(engine.cache_stats().dirty_bytes, 0, "the cache was written out");
        let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
        assert!(events.iter().any(|e| e == "slot 4: Jrnl -> UGood (journal removed)"), "{events:#?}");
        assert!(events.iter().any(|e| e.contains("WB VDs run WT until a journal is assigned")), "{events:#?}");
        let again = conflict(controller.remove_journal());
        assert!(again.starts_with("no journal is attached"), "{again}");
        scatter(&engine, &vd, &mut image, 2, 100);
        assert_eq!(engine.cache_stats().dirty_bytes, 0, "without a journal a WB VD's writes are acknowledged from the members");
        controller.config().controller_id
        // Dropped without a shutdown: the writes made while the journal was attached must be on
        // the members, for nothing replays that journal now.
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), Vec::new());
    let view = controller.journal_view();
    assert_eq!((view.state, view.replay.found), (JournalState::Missing, false), "the removed journal is not used again: {view:?}");
    assert_eq!(state_of(&controller, 4), ConfigDriveState::UnconfiguredGood);
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after a crash following the removal");
    let view = controller.assign_journal_drive(4).unwrap();
    assert_eq!((view.state, view.source.as_deref()), (JournalState::Optimal, Some("slot 4")), "{view:?}");
    assert!(controller.journal_usable(), "WB runs WB again");
    scatter(&engine, &vd, &mut image, 3, 100);
    check(&engine, &vd, &image, "with the journal assigned again");
    controller.shutdown();
}
