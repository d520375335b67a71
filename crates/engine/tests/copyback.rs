//! Copyback and proactive replacement through the controller, on memory drives: a spare that
//! took a member's place copies it back to the slot once that slot holds a good drive again
//! (a blank drive found there at start, `set good`) and returns to the spares; a healthy member
//! is copied to another drive while it serves and then replaced by it. Clients write during
//! every copy, and afterwards the new member proves its contents alone (another member taken
//! out, every byte still reads back). A copy stopped by a restart resumes from its checkpoint;
//! a target that fails leaves; a source that fails hands its place to the target; bad input
//! changes nothing.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, Faults, FaultyDrive, MemDrive};
use engine::config::{ControllerId, DriveState};
use engine::controller::{ControlError, Controller, ControllerChanges, ControllerOptions, CopybackCommand, DriveCommand, OfferedDrive};
use engine::{Engine, VdState, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 64 * MIB;
const COPY_TIMEOUT: Duration = Duration::from_secs(60);
/// Long enough per target I/O that clients get to write while a copy runs.
const SLOW_TARGET: Duration = Duration::from_millis(3);

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

fn events(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

fn wait_for_state(controller: &Controller, slot: u32, state: DriveState) {
    let deadline = Instant::now() + COPY_TIMEOUT;
    while controller.slot(slot).unwrap().state != state {
        let recent: Vec<String> = events(controller).into_iter().rev().take(10).collect();
        assert!(Instant::now() < deadline, "slot {slot} never became {state:?}; recent events: {recent:#?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_until_no_copy(controller: &Controller) {
    let deadline = Instant::now() + COPY_TIMEOUT;
    while !controller.copybacks().is_empty() {
        assert!(Instant::now() < deadline, "the copy never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the whole VD and compares it with `expected`, naming the first wrong byte.
fn check_vd(engine: &Engine, vd: &Arc<VirtualDrive>, expected: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, expected.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let first_wrong = read.as_slice().iter().zip(expected).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "{when}: first wrong byte");
}

/// Writes 64 KiB pieces all over the VD while `running` says so (at least `min_writes`), and
/// keeps `model` equal to what was written. Returns how many writes found a copy running.
fn write_while(engine: &Engine, vd: &Arc<VirtualDrive>, model: &mut [u8], min_writes: usize, running: impl Fn() -> bool) -> usize {
    let piece_bytes = 64 << 10;
    let mut during_copy = 0;
    for i in 0.. {
        let copying = running();
        if !copying && i >= min_writes {
            break;
        }
        let offset = (i * 7919 * 4096) % (model.len() - piece_bytes);
        let data = pattern(piece_bytes, (i % 200) as u8 + 50);
        engine.write_at(vd, offset as u64, &data).unwrap();
        model[offset..offset + piece_bytes].copy_from_slice(&data);
        during_copy += usize::from(copying && running());
    }
    during_copy
}

/// A slow memory drive, for a target the copy takes a while to fill.
fn slow_drive(bytes: u64) -> Arc<FaultyDrive> {
    let drive = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(bytes))));
    drive.set_faults(Faults { latency: Some(SLOW_TARGET), ..Faults::default() });
    drive
}

/// The member a read must come from once `slot` is out, to prove the copied member's contents:
/// its mirror partner for mirrors, any other member for parity.
fn other_member(level: Level, copied: u32) -> u32 {
    match level {
        Level::Raid1 | Level::Raid10 => copied ^ 1,
        _ => (copied + 1) % 4,
    }
}

/// The embedded scenario: a member set offline, the global spare rebuilt in its place; the
/// "disk" of that slot replaced by a blank one during a restart; the spare copies back while
/// clients write, returns to the global spares, and the new drive holds the member alone.
#[test]
fn a_spare_copies_back_to_a_replaced_slot_and_returns_to_the_spares() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let engine = engine();
        let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
        let controller = open(&engine, &drives, None);
        let slots: Vec<u32> = if level == Level::Raid1 { vec![0, 1] } else { vec![0, 1, 2, 3] };
        let mut vd_spec = spec(level, &slots, "db");
        vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
        controller.create_vd(vd_spec).unwrap();
        controller.add_hot_spare(4, vec![]).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let mut model = pattern(vd.capacity_bytes() as usize, 3);
        engine.write_at(&vd, 0, &model).unwrap();
        controller.set_drive(1, DriveCommand::Offline).unwrap();
        wait_for_state(&controller, 4, DriveState::Online);
        assert_eq!(controller.slot(4).unwrap().hot_spare_drive_groups, Some(vec![]), "{level}: a serving spare keeps its record");
        assert_eq!(controller.config().drives.iter().find(|d| d.slot == 4).unwrap().copy_slot, Some(1), "{level}");
        let id = controller.config().controller_id;
        controller.shutdown();
        drop(controller);

        // Slot 1's drive is swapped for a blank one (slow, so that clients write during the copy).
        let fresh = slow_drive(DRIVE_BYTES);
        drives[1] = fresh.clone();
        let second = open(&engine, &drives, Some(id));
        assert_eq!(second.slot(1).unwrap().state, DriveState::Copyback, "{level}: the copyback starts at once: {:#?}", events(&second));
        let (_, vd) = second.vd(0).unwrap();
        let during = write_while(&engine, &vd, &mut model, 8, || !second.copybacks().is_empty());
        assert!(during > 0, "{level}: clients wrote while the copy ran");
        wait_for_state(&second, 1, DriveState::Online);
        wait_for_state(&second, 4, DriveState::HotSpare);
        assert_eq!(second.slot(4).unwrap().hot_spare_drive_groups, Some(vec![]), "{level}: back as a global spare");
        assert_eq!(second.vd(0).unwrap().0.member_slots[1], 1, "{level}");
        assert_eq!(vd.state(), VdState::Optimal, "{level}");
        check_vd(&engine, &vd, &model, &format!("{level} after the copyback"));
        fresh.set_faults(Faults::default());

        // The copied member holds its share alone: take the other one out (no spare may step in).
        second.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
        let other = other_member(level, 1);
        second.set_drive(other, DriveCommand::Offline).unwrap();
        check_vd(&engine, &vd, &model, &format!("{level} after the copyback, slot {other} out"));
        let log = events(&second);
        for expected in
            ["slot 1: UGood -> Cpybck (copyback started", "slot 4: Onln -> HSP (copyback done", "copyback of slot 4 to slot 1 (v0) done"]
        {
            assert!(log.iter().any(|e| e.starts_with(expected)), "{level}: no event {expected:?}: {log:#?}");
        }
    }
}

/// A failed member replaced by the spare becomes UBad; `set good` on it (a new disk in the same
/// slot) starts the copyback. With copyback off it does not, and says how to start it by hand.
#[test]
fn set_good_on_the_replaced_slot_starts_the_copyback_unless_it_is_off() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(6, DRIVE_BYTES);
    let failing = Arc::new(FaultyDrive::new(Arc::clone(&drives[2])));
    drives[2] = failing.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![0]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 7);
    engine.write_at(&vd, 0, &model).unwrap();
    failing.set_failed(true);
    engine.write_at(&vd, 0, &model[..4096]).unwrap(); // one row: one error on the failed member
    wait_for_state(&controller, 4, DriveState::Online);
    assert_eq!(controller.slot(2).unwrap().state, DriveState::UnconfiguredBad);

    controller.set_controller(ControllerChanges { copyback: Some(false), ..Default::default() }).unwrap();
    failing.set_failed(false); // the "new disk"
    controller.set_drive(2, DriveCommand::Good).unwrap();
    assert_eq!(controller.slot(2).unwrap().state, DriveState::UnconfiguredGood, "copyback=off: nothing automatic");
    let hint = "copyback is off: /c0/s4 start copyback target=2 copies it back";
    assert!(events(&controller).iter().any(|e| e.contains(hint)), "{:#?}", events(&controller));

    controller.start_copyback(4, 2).unwrap();
    write_while(&engine, &vd, &mut model, 4, || !controller.copybacks().is_empty());
    wait_for_state(&controller, 4, DriveState::HotSpare);
    assert_eq!(controller.slot(4).unwrap().hot_spare_drive_groups, Some(vec![0]), "back as a dedicated spare");
    assert_eq!(controller.slot(2).unwrap().state, DriveState::Online);
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(3, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the copyback by hand, slot 3 out");

    // copyback=on (the default): `set good` alone starts it.
    let engine = common::engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let failing = Arc::new(FaultyDrive::new(Arc::clone(&drives[0])));
    drives[0] = failing.clone();
    let auto = open(&engine, &drives, None);
    auto.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    auto.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = auto.vd(0).unwrap();
    let model = pattern(vd.capacity_bytes() as usize, 8);
    engine.write_at(&vd, 0, &model).unwrap();
    failing.set_failed(true);
    engine.write_at(&vd, 0, &model[..4096]).unwrap(); // one row: one error on the failed member
    wait_for_state(&auto, 4, DriveState::Online);
    failing.set_failed(false);
    auto.set_drive(0, DriveCommand::Good).unwrap();
    wait_for_state(&auto, 4, DriveState::HotSpare);
    assert_eq!(auto.slot(0).unwrap().state, DriveState::Online);
    auto.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    auto.set_drive(1, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the automatic copyback, slot 1 out");
}

/// storcli's `insert` into a place a spare holds: the inserted drive receives a copy, then the
/// spare returns to the spares.
#[test]
fn insert_into_a_spares_place_copies_the_spare_back() {
    let engine = engine();
    let drives: Vec<Arc<dyn Drive>> = mem_drives(6, DRIVE_BYTES);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid6, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 31);
    engine.write_at(&vd, 0, &model).unwrap();
    controller.set_drive(2, DriveCommand::Missing).unwrap();
    wait_for_state(&controller, 4, DriveState::Online);
    controller.replace_member(5, 0, 2).unwrap();
    assert_eq!(controller.slot(5).unwrap().state, DriveState::Copyback);
    write_while(&engine, &vd, &mut model, 4, || !controller.copybacks().is_empty());
    wait_for_state(&controller, 4, DriveState::HotSpare);
    assert_eq!(controller.vd(0).unwrap().0.member_slots, vec![0, 1, 5, 3]);
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the insert, slots 0 and 1 out");
}

/// Proactive replacement of a healthy member (md's want_replacement): copied while clients
/// write, then the copy is the member and the old drive is UGood. To a hot spare, the spare
/// becomes a revertible member in turn.
#[test]
fn a_healthy_member_is_replaced_while_it_serves() {
    for level in [Level::Raid0, Level::Raid1, Level::Raid1E, Level::Raid5, Level::Raid6, Level::Raid50] {
        let engine = engine();
        let mut drives: Vec<Arc<dyn Drive>> = mem_drives(8, DRIVE_BYTES);
        let target = slow_drive(DRIVE_BYTES);
        drives[7] = target.clone();
        let controller = open(&engine, &drives, None);
        let slots: Vec<u32> = match level {
            Level::Raid1 => vec![0, 1],
            Level::Raid1E => vec![0, 1, 2],
            Level::Raid50 => vec![0, 1, 2, 3, 4, 5],
            _ => vec![0, 1, 2, 3],
        };
        let mut vd_spec = spec(level, &slots, "db");
        vd_spec.drives_per_span = (level == Level::Raid50).then_some(3);
        controller.create_vd(vd_spec).unwrap();
        controller.add_hot_spare(6, vec![]).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let mut model = pattern(vd.capacity_bytes() as usize, 9);
        engine.write_at(&vd, 0, &model).unwrap();

        controller.start_copyback(1, 7).unwrap();
        assert_eq!(controller.slot(7).unwrap().state, DriveState::Copyback);
        assert_eq!(vd.state(), VdState::Optimal, "{level}: the member keeps serving");
        let during = write_while(&engine, &vd, &mut model, 8, || !controller.copybacks().is_empty());
        assert!(during > 0, "{level}: clients wrote while the copy ran");
        wait_for_state(&controller, 7, DriveState::Online);
        assert_eq!(controller.slot(1).unwrap().state, DriveState::UnconfiguredGood, "{level}");
        assert_eq!(controller.vd(0).unwrap().0.member_slots[1], 7, "{level}");
        check_vd(&engine, &vd, &model, &format!("{level} after the replacement"));
        target.set_faults(Faults::default());
        if level != Level::Raid0 {
            // Another member of the copied one's span out: its strips must come from the copy.
            controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
            let other = if level == Level::Raid1 { 0 } else { 2 };
            controller.set_drive(other, DriveCommand::Offline).unwrap();
            check_vd(&engine, &vd, &model, &format!("{level} after the replacement, slot {other} out"));
        }
    }
}

#[test]
fn a_proactive_replacement_to_a_hot_spare_makes_it_a_revertible_member() {
    let engine = engine();
    let drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let model = pattern(vd.capacity_bytes() as usize, 13);
    engine.write_at(&vd, 0, &model).unwrap();
    controller.start_copyback(3, 4).unwrap();
    wait_for_state(&controller, 4, DriveState::Online);
    let record = controller.config().drives.into_iter().find(|d| d.slot == 4).unwrap();
    assert_eq!(record.copy_slot, Some(3), "it remembers whose place it took");
    // Slot 3 gets good again: the spare goes back there and to the spares.
    controller.start_copyback(4, 3).unwrap();
    wait_for_state(&controller, 4, DriveState::HotSpare);
    assert_eq!(controller.vd(0).unwrap().0.member_slots[3], 3);
    check_vd(&engine, &vd, &model, "after the round trip");
}

/// A copy stopped by a restart resumes from its checkpoint (progress > 0), with the writes made
/// before the restart on the target, and completes.
#[test]
fn a_copy_resumes_from_its_checkpoint_after_a_restart() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let target = slow_drive(DRIVE_BYTES);
    drives[4] = target.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 17);
    engine.write_at(&vd, 0, &model).unwrap();
    let id = controller.config().controller_id;
    controller.start_copyback(2, 4).unwrap();
    let deadline = Instant::now() + COPY_TIMEOUT;
    while controller.copybacks().first().map_or(0.0, |c| c.progress.percent_done()) < 30.0 {
        assert!(Instant::now() < deadline, "the copy makes no progress");
        write_while(&engine, &vd, &mut model, 1, || false);
    }
    controller.shutdown();
    drop(controller);

    let second = open(&engine, &drives, Some(id));
    assert_eq!(second.slot(4).unwrap().state, DriveState::Copyback, "still copying after the restart");
    let resumed =
        events(&second).into_iter().find(|e| e.starts_with("copyback of slot 2 to slot 4 (v0) resumes at row ")).expect("a resume event");
    let row: u64 = resumed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(row > 0, "progress > 0 at the restart: {resumed}");
    let (_, vd) = second.vd(0).unwrap();
    write_while(&engine, &vd, &mut model, 4, || !second.copybacks().is_empty());
    wait_for_state(&second, 4, DriveState::Online);
    target.set_faults(Faults::default());
    second.set_drive(0, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the resumed copy, slot 0 out");
}

/// A target that fails stops the copy and leaves (UBad); the VD never noticed. A source that
/// fails during a proactive replacement hands its place to the target, which is rebuilt.
#[test]
fn a_failing_target_leaves_and_a_failing_source_hands_over_to_the_target() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(6, DRIVE_BYTES);
    let target = slow_drive(DRIVE_BYTES);
    drives[4] = target.clone();
    let source = Arc::new(FaultyDrive::new(Arc::clone(&drives[1])));
    drives[1] = source.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 19);
    engine.write_at(&vd, 0, &model).unwrap();

    controller.start_copyback(1, 4).unwrap();
    target.set_faults(Faults {
        write_error_ranges: std::iter::once(0..DRIVE_BYTES).collect(),
        latency: Some(SLOW_TARGET),
        ..Faults::default()
    });
    write_while(&engine, &vd, &mut model, 4, || false);
    wait_for_state(&controller, 4, DriveState::UnconfiguredBad);
    wait_until_no_copy(&controller);
    assert_eq!(vd.state(), VdState::Optimal);
    assert!(vd.copy_target(1).is_none());
    write_while(&engine, &vd, &mut model, 4, || false);
    check_vd(&engine, &vd, &model, "after the target failed");

    // Now to slot 5, and the source dies on the way.
    let slow_five = Arc::new(FaultyDrive::new(Arc::clone(&drives[5])));
    let mut drives2 = drives.clone();
    drives2[5] = slow_five.clone();
    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);
    slow_five.set_faults(Faults { latency: Some(SLOW_TARGET), ..Faults::default() });
    let second = open(&engine, &drives2, Some(id));
    slow_five.set_faults(Faults { latency: Some(SLOW_TARGET * 4), ..Faults::default() });
    let (_, vd) = second.vd(0).unwrap();
    second.start_copyback(1, 5).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(second.copybacks().first().is_some_and(|c| c.progress.percent_done() < 100.0), "still copying");
    source.set_failed(true);
    write_while(&engine, &vd, &mut model, 4, || false);
    wait_for_state(&second, 5, DriveState::Online);
    assert_eq!(second.vd(0).unwrap().0.member_slots[1], 5);
    let log = events(&second);
    assert!(log.iter().any(|e| e.starts_with("slot 5: Cpybck -> Rbld (rebuild started")), "{log:#?}");
    slow_five.set_faults(Faults::default());
    second.set_drive(3, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the fallback rebuild, slot 3 out");
}

/// `stop copyback` abandons the copy: the target returns to what it was (a hot spare here), the
/// member never left.
#[test]
fn stop_copyback_returns_the_target() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let target = slow_drive(DRIVE_BYTES);
    drives[4] = target.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![0]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let model = pattern(vd.capacity_bytes() as usize, 23);
    engine.write_at(&vd, 0, &model).unwrap();
    controller.start_copyback(0, 4).unwrap();
    controller.copyback_command(4, CopybackCommand::Pause).unwrap();
    assert_eq!(controller.copybacks()[0].status(), "Paused");
    let refused = controller.copyback_command(0, CopybackCommand::Pause).unwrap_err();
    assert_eq!(refused.to_string(), "the copyback to slot 4 is Paused; Pause is allowed only when it is in progress");
    controller.copyback_command(0, CopybackCommand::Stop).unwrap();
    wait_for_state(&controller, 4, DriveState::HotSpare);
    wait_until_no_copy(&controller);
    assert_eq!(controller.slot(4).unwrap().hot_spare_drive_groups, Some(vec![0]));
    assert!(vd.copy_target(0).is_none());
    assert_eq!(controller.vd(0).unwrap().0.member_slots, vec![0, 1, 2, 3]);
    check_vd(&engine, &vd, &model, "after the stopped copy");
    let missing = controller.copyback_command(4, CopybackCommand::Stop).unwrap_err();
    assert_eq!(missing.to_string(), "slot 4 has no copyback; none has one");
}

/// Every refusal names what is wrong and what is allowed, and changes nothing.
#[test]
fn bad_copyback_input_changes_nothing() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(7, DRIVE_BYTES);
    drives.push(Arc::new(MemDrive::new(DRIVE_BYTES / 2)));
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    controller.create_vd(spec(Level::Raid1, &[3, 4], "logs")).unwrap();
    controller.add_hot_spare(5, vec![1]).unwrap();
    let before = controller.config();
    let refused = |result: Result<(), ControlError>, expected: &str| {
        assert_eq!(result.unwrap_err().to_string(), expected);
        assert_eq!(controller.config(), before, "nothing changed after: {expected}");
        assert!(controller.copybacks().is_empty());
    };
    let allowed = "a copy goes to an unconfigured good drive (UGood) or a hot spare that serves drive group 0";
    refused(controller.start_copyback(0, 1), &format!("slot 1 is Onln (a member of v0); {allowed}"));
    refused(controller.start_copyback(0, 3), &format!("slot 3 is Onln (a member of v1); {allowed}"));
    refused(controller.start_copyback(0, 5), &format!("slot 5 is HSP (dedicated to drive group(s) 1); {allowed}"));
    refused(controller.start_copyback(0, 7), &format!("slot 7 has {} bytes; v0 needs {DRIVE_BYTES} bytes per member", DRIVE_BYTES / 2));
    refused(controller.start_copyback(0, 0), "slot 0 cannot be copied onto itself; give target= another drive");
    refused(controller.start_copyback(6, 0), "slot 6 is UGood, in no VD; only an online member (Onln) can be copied");
    refused(controller.start_copyback(5, 6), "slot 5 is HSP, in no VD; only an online member (Onln) can be copied");
    refused(controller.start_copyback(9, 6), "slot 9 holds no drive of ours");
    refused(controller.start_copyback(0, 9), "slot 9 holds no drive of ours");
    refused(controller.copyback_command(0, CopybackCommand::Stop), "slot 0 has no copyback; none has one");
    // A member out of service is rebuilt, not copied.
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(1, DriveCommand::Offline).unwrap();
    let before = controller.config();
    let result = controller.start_copyback(1, 6);
    assert_eq!(result.unwrap_err().to_string(), "slot 1 is Offln in v0; only an online member (Onln) can be copied");
    assert_eq!(controller.config(), before);
    // A degraded VD may have a member copied (replacing a failing member early is the point);
    // an offline one may not.
    controller.set_drive(2, DriveCommand::Offline).unwrap();
    let before = controller.config();
    let result = controller.start_copyback(0, 6);
    assert_eq!(result.unwrap_err().to_string(), "v0 is offline: a copy needs a VD that serves; bring it back first (set online force)");
    assert_eq!(controller.config(), before);
    // Two copies of one member.
    controller.start_copyback(3, 6).unwrap();
    let before = controller.config();
    let result = controller.start_copyback(3, 5);
    assert_eq!(result.unwrap_err().to_string(), "slot 3 is being copied to slot 6 already; stop that copyback first");
    assert_eq!(controller.config(), before);
    wait_for_state(&controller, 6, DriveState::Online);
}

/// A VD deleted while one of its members is copied: the target returns to the spares (as a
/// MegaRAID's does), the members to UGood.
#[test]
fn deleting_the_vd_returns_the_copy_target() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let target = slow_drive(DRIVE_BYTES);
    drives[4] = target.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    controller.start_copyback(2, 4).unwrap();
    controller.delete_vd(0, false, false).unwrap();
    assert_eq!(controller.slot(4).unwrap().state, DriveState::HotSpare);
    assert_eq!(controller.slot(4).unwrap().hot_spare_drive_groups, Some(vec![]));
    assert!((0..4).all(|slot| controller.slot(slot).unwrap().state == DriveState::UnconfiguredGood));
    wait_until_no_copy(&controller);
    let record = controller.config().drives.into_iter().find(|d| d.slot == 4).unwrap();
    assert_eq!((record.copy_slot, record.rebuild_row), (None, 0));
}

/// The replaced slot made good while the spare is still being rebuilt: the copyback waits for
/// the rebuild, then runs.
#[test]
fn a_copyback_asked_for_during_the_rebuild_runs_after_it() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let spare = slow_drive(DRIVE_BYTES);
    drives[4] = spare.clone();
    let failing = Arc::new(FaultyDrive::new(Arc::clone(&drives[3])));
    drives[3] = failing.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 29);
    engine.write_at(&vd, 0, &model).unwrap();
    failing.set_failed(true);
    engine.write_at(&vd, 0, &model[..4096]).unwrap(); // one row: one error on the failed member
    wait_for_state(&controller, 3, DriveState::UnconfiguredBad);
    assert_eq!(controller.slot(4).unwrap().state, DriveState::Rebuild);
    failing.set_failed(false);
    controller.set_drive(3, DriveCommand::Good).unwrap();
    let waits = "copyback of slot 4 to slot 3 (set good) starts when its rebuild is done";
    assert!(events(&controller).iter().any(|e| e == waits), "{:#?}", events(&controller));
    write_while(&engine, &vd, &mut model, 8, || false);
    wait_for_state(&controller, 4, DriveState::HotSpare);
    assert_eq!(controller.slot(3).unwrap().state, DriveState::Online);
    spare.set_faults(Faults::default());
    controller.set_controller(ControllerChanges { auto_rebuild: Some(false), ..Default::default() }).unwrap();
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    check_vd(&engine, &vd, &model, "after the rebuild and the copyback, slot 0 out");
}
