//! Hot-spare takeover and rebuild through the controller: the spare takes a failed member's
//! place at once, is rebuilt row by row while clients write, and then holds the data alone (a
//! different member taken out afterwards, every byte still reads back). A rebuild stopped by a
//! restart resumes from its checkpoint.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, Faults, FaultyDrive, MemDrive};
use engine::config::DriveState;
use engine::controller::{Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive};
use engine::{Engine, VdState};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 64 * MIB;
const REBUILD_TIMEOUT: Duration = Duration::from_secs(60);

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<engine::config::ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

fn wait_for_state(controller: &Controller, slot: u32, state: DriveState) {
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    while controller.slot(slot).unwrap().state != state {
        let events: Vec<String> = controller.events().into_iter().rev().take(8).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "slot {slot} never became {state:?}; recent events: {events:#?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the whole VD and compares it with `expected`, naming the first wrong byte.
fn check_vd(engine: &Engine, vd: &Arc<engine::VirtualDrive>, expected: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, expected.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let first_wrong = read.as_slice().iter().zip(expected).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "{when}: first wrong byte");
}

#[test]
fn a_hot_spare_takes_over_at_once_and_its_rebuilt_contents_serve_alone() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let engine = engine();
        let drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
        let controller = open(&engine, &drives, None);
        let slots: Vec<u32> = match level {
            Level::Raid1 => vec![0, 1],
            _ => vec![0, 1, 2, 3],
        };
        let mut vd_spec = spec(level, &slots, "db");
        vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
        controller.create_vd(vd_spec).unwrap();
        controller.add_hot_spare(4, vec![]).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let mut model = pattern(vd.capacity_bytes() as usize, 3);
        engine.write_at(&vd, 0, &model).unwrap();

        controller.set_drive(1, DriveCommand::Offline).unwrap();
        assert_eq!(controller.slot(4).unwrap().state, DriveState::Rebuild, "{level}: the spare takes over at once");
        assert_eq!(controller.slot(1).unwrap().state, DriveState::UnconfiguredGood, "{level}: the offline drive leaves the VD");
        // Clients write while the rebuild runs; the rebuild must not undo their writes.
        let step_bytes = (model.len() / 7) / 4096 * 4096;
        for (i, offset) in (0..model.len()).step_by(step_bytes).enumerate() {
            let len = (256 << 10).min(model.len() - offset);
            let data = pattern(len, 100 + i as u8);
            engine.write_at(&vd, offset as u64, &data).unwrap();
            model[offset..offset + len].copy_from_slice(&data);
        }
        wait_for_state(&controller, 4, DriveState::Online);
        assert_eq!(vd.state(), VdState::Optimal, "{level}");
        check_vd(&engine, &vd, &model, &format!("{level} after the rebuild"));

        // The rebuilt member now holds its share alone: take another member out and read all.
        let other = if matches!(level, Level::Raid1 | Level::Raid10) { 0 } else { 2 };
        controller.set_drive(other, DriveCommand::Offline).unwrap();
        check_vd(&engine, &vd, &model, &format!("{level} with slot {other} out after the rebuild"));
        let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
        assert!(events.iter().any(|e| e.contains("v0 stays degraded: no hot spare")), "{level}: {events:#?}");
    }
}

#[test]
fn without_autorebuild_or_a_fitting_spare_the_vd_stays_degraded_and_says_why() {
    let engine = engine();
    let drives: Vec<Arc<dyn Drive>> = mem_drives(4, DRIVE_BYTES);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.add_hot_spare(3, vec![]).unwrap();
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e == "v0 stays degraded: automatic rebuild is off (/c0 set autorebuild=on)"), "{events:#?}");
    assert_eq!(controller.slot(3).unwrap().state, DriveState::HotSpare);
    let refused = controller.set_controller(ControllerChanges { rebuild_rate_percent: Some(101), ..Default::default() }).unwrap_err();
    assert_eq!(refused.to_string(), "rebuild rate 101 is not allowed; allowed: 0 to 100 (percent)");

    let mut with_small_spare: Vec<Arc<dyn Drive>> = mem_drives(4, DRIVE_BYTES);
    with_small_spare.push(Arc::new(MemDrive::new(DRIVE_BYTES / 2)));
    let small = open(&engine, &with_small_spare, None);
    small.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    small.add_hot_spare(4, vec![]).unwrap();
    small.set_drive(2, DriveCommand::Offline).unwrap();
    let events: Vec<String> = small.events().into_iter().map(|e| e.description).collect();
    let expected =
        format!("v0 stays degraded: no hot spare fits: v0 needs {DRIVE_BYTES} bytes per member; slot 4 has {} bytes", DRIVE_BYTES / 2);
    assert!(events.contains(&expected), "{events:#?}");
    assert_eq!(small.vd(0).unwrap().1.state(), VdState::Degraded);
}

/// A rebuild interrupted by a stop resumes from its checkpoint at the next start (progress > 0),
/// and completes with the data intact.
#[test]
fn a_rebuild_resumes_from_its_checkpoint_after_a_restart() {
    let engine = engine();
    let mems: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let slow_spare = Arc::new(FaultyDrive::new(Arc::clone(&mems[4])));
    let mut drives = mems.clone();
    drives[4] = slow_spare.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let model = pattern(vd.capacity_bytes() as usize, 9);
    engine.write_at(&vd, 0, &model).unwrap();
    let id = controller.config().controller_id;

    slow_spare.set_faults(Faults { latency: Some(Duration::from_millis(5)), ..Faults::default() });
    controller.set_drive(3, DriveCommand::Offline).unwrap();
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    while controller.rebuilds().first().map_or(0.0, |r| r.progress.percent_done()) < 30.0 {
        assert!(Instant::now() < deadline, "the rebuild makes no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    controller.shutdown(); // stops the rebuild at its watermark, checkpointed
    drop(controller);

    slow_spare.set_faults(Faults::default());
    let second = open(&engine, &drives, Some(id));
    assert_eq!(second.slot(4).unwrap().state, DriveState::Rebuild, "still being rebuilt after the restart");
    let resumed_at = second.rebuilds().first().map(|r| r.progress.percent_done()).unwrap_or(0.0);
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    let resumed = events.iter().find(|e| e.starts_with("rebuild of slot 4 (v0) resumes at row ")).expect("a resume event");
    let row: u64 = resumed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(row > 0, "progress > 0 at the restart: {resumed}; {resumed_at:.1}% shown");
    wait_for_state(&second, 4, DriveState::Online);
    let (_, vd) = second.vd(0).unwrap();
    check_vd(&engine, &vd, &model, "after the resumed rebuild");
    second.set_drive(0, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the resumed rebuild, with slot 0 out");
}

/// A VD beyond its tolerance has nothing to rebuild a spare from: the spare stays a spare,
/// instead of becoming a member full of rows nobody could rebuild.
#[test]
fn an_offline_vd_gets_no_spare() {
    let engine = engine();
    let drives: Vec<Arc<dyn Drive>> = mem_drives(4, DRIVE_BYTES);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.add_hot_spare(3, vec![]).unwrap();
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    assert_eq!(controller.vd(0).unwrap().1.state(), VdState::Offline);
    controller.set_controller(ControllerChanges { auto_rebuild: Some(true), ..Default::default() }).unwrap();
    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);

    let second = open(&engine, &drives, Some(id));
    assert_eq!(second.slot(3).unwrap().state, DriveState::HotSpare);
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e == "v0 is offline: no spare can be rebuilt from what is left"), "{events:#?}");
}

/// A row whose sources cannot be read while nothing else holds its data is never made up: the
/// rebuild goes on past it, and at the end the member stays Rbld (written, never read) and an
/// event names the row.
#[test]
fn rows_that_cannot_be_rebuilt_keep_the_member_from_being_read() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let flaky = Arc::new(FaultyDrive::new(Arc::clone(&drives[2])));
    drives[2] = flaky.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(vd.capacity_bytes() as usize, 5)).unwrap();
    let bad_start = 16 * MIB;
    flaky.set_faults(Faults { read_error_ranges: vec![bad_start..bad_start + 4096], ..Faults::default() });
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    let ended = |events: &[String]| events.iter().find(|e| e.starts_with("rebuild of slot 4 (v0) reached the end")).cloned();
    let message = loop {
        let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
        if let Some(message) = ended(&events) {
            break message;
        }
        assert!(Instant::now() < deadline, "the rebuild never ended: {events:#?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(message.contains("1 row(s) could not be rebuilt"), "{message}");
    assert_eq!(controller.slot(4).unwrap().state, DriveState::Rebuild, "never read while a row is missing");
    assert_eq!(vd.state(), VdState::Degraded);
}

/// storcli's `insert` + `start rebuild`: an unconfigured good drive takes a failed member's
/// place and is rebuilt; `start rebuild` on a UGood drive picks the member itself. Refusals
/// name what is wrong and change nothing.
#[test]
fn an_unconfigured_good_drive_replaces_a_member_by_hand() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(6, DRIVE_BYTES);
    drives.push(Arc::new(MemDrive::new(DRIVE_BYTES / 2)));
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 11);
    engine.write_at(&vd, 0, &model).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    let late = pattern(1 << 20, 12);
    engine.write_at(&vd, 0, &late).unwrap();
    model[..late.len()].copy_from_slice(&late);

    let generation = controller.config().generation;
    let refused = |result: Result<(), engine::controller::ControlError>, expected: &str| {
        assert_eq!(result.unwrap_err().to_string(), expected);
        assert_eq!(controller.config().generation, generation, "nothing changed after: {expected}");
    };
    refused(controller.replace_member(4, 0, 2), "member 2 of v0 (slot 2) is in service; only a member out of service can be replaced");
    refused(controller.replace_member(4, 0, 9), "v0 has 4 members (0 to 3); member 9 does not exist");
    refused(controller.replace_member(0, 0, 1), "slot 0 is Onln; only an unconfigured good (UGood) drive can replace a member");
    let small = format!("slot 6 has {} bytes; v0 needs {DRIVE_BYTES} bytes per member", DRIVE_BYTES / 2);
    refused(controller.replace_member(6, 0, 1), &small);

    controller.replace_member(4, 0, 1).unwrap();
    assert_eq!(controller.slot(4).unwrap().state, DriveState::Rebuild);
    wait_for_state(&controller, 4, DriveState::Online);
    controller.set_drive(2, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the replacement, with slot 2 out");
    // `start rebuild` on a UGood drive: it finds the member out of service (slot 2's) itself.
    controller.rebuild_command(5, engine::controller::RebuildCommand::Start).unwrap();
    wait_for_state(&controller, 5, DriveState::Online);
    assert_eq!(vd.state(), VdState::Optimal);
    check_vd(&engine, &vd, &model, "after the second replacement");
}

/// A RAID5 that lost two members in one burst (say, the backing filesystem filled up) comes back
/// with `set online force` on the member that failed last, after a restart too: every write
/// acknowledged before reads back; plain `set online` refuses, since the member missed a write.
#[test]
fn an_offline_vd_comes_back_with_set_online_force() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(3, DRIVE_BYTES);
    let full = Arc::new(FaultyDrive::new(Arc::clone(&drives[1])));
    drives[1] = full.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let acknowledged = pattern(4 << 20, 21);
    engine.write_at(&vd, 0, &acknowledged).unwrap();
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    engine.write_at(&vd, 8 << 20, &pattern(1 << 20, 22)).unwrap();
    let mut model = acknowledged.clone();
    model.resize(8 << 20, 0);
    model.extend(pattern(1 << 20, 22));
    // The next write fails on slot 1 as well: beyond RAID5's tolerance, and not acknowledged.
    full.set_faults(Faults { write_error_ranges: vec![0..DRIVE_BYTES], ..Faults::default() });
    assert!(engine.write_at(&vd, 16 << 20, &pattern(1 << 20, 23)).is_err());
    assert_eq!(vd.state(), VdState::Offline);
    full.set_faults(Faults::default()); // space freed
    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);

    let second = open(&engine, &drives, Some(id));
    let error = second.set_drive(1, DriveCommand::Online).unwrap_err();
    assert!(error.to_string().contains("set online force"), "{error}");
    second.force_online(1).unwrap();
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(vd.state(), VdState::Degraded);
    check_vd(&engine, &vd, &model, "after set online force");
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    let forced = events.iter().find(|e| e.starts_with("slot 1 forced online in v0 (Dgrd)")).unwrap_or_else(|| panic!("{events:#?}"));
    assert!(forced.contains("are among rows 0.."), "the event names the rows to check: {forced}");
}
