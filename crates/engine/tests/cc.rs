//! The consistency check through the controller: garbage written straight onto one member's
//! strip is found, reported in an event that names the slot as precisely as the level allows,
//! and repaired; afterwards another member taken out still leaves every byte readable (so the
//! repair restored the redundancy, not only the read path). Bad input starts nothing.

mod common;

use common::{engine, mem_drives, pattern, spec, CountingDrive};
use drive::{Drive, DriveOp, IoBuf, IoCtx};
use engine::controller::{CcCommand, ControlError, Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive};
use engine::Engine;
use layout::{Level, Place, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 32 * MIB;
const CC_TIMEOUT: Duration = Duration::from_secs(60);

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions::default()).unwrap()
}

fn write_direct(drive: &dyn Drive, offset_bytes: u64, data: &[u8]) {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(data) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    assert_eq!(completions[0].result, Ok(()));
}

/// Waits until the check of `vd_id` left the list and its end event (done, stopped or cannot
/// go on) is in the log after the first `events_before` events: the check leaves the list
/// before that event is written.
fn wait_for_cc(controller: &Controller, vd_id: u32, events_before: usize) {
    let deadline = Instant::now() + CC_TIMEOUT;
    let prefix = format!("consistency check of v{vd_id}");
    let is_end = |e: &String| e.starts_with(&prefix) && (e.contains(" done in ") || e.contains(" stopped: ") || e.contains("cannot go on"));
    loop {
        let running = controller.checks().iter().any(|c| c.vd_id == vd_id);
        if !running && events_since(controller, events_before).iter().any(is_end) {
            return;
        }
        assert!(Instant::now() < deadline, "the consistency check never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn events_since(controller: &Controller, count_before: usize) -> Vec<String> {
    controller.events().into_iter().skip(count_before).map(|e| e.description).collect()
}

fn check_vd(engine: &Engine, vd: &Arc<engine::VirtualDrive>, expected: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, expected.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let first_wrong = read.as_slice().iter().zip(expected).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "{when}: first wrong byte");
}

/// What to corrupt in the row, and what the event must say.
struct Case {
    level: Level,
    /// The place to corrupt, from the row's map.
    place: fn(&layout::RowMap) -> Place,
    /// Words the row's event must hold, given the corrupted slot.
    said: fn(u32) -> Vec<String>,
}

#[test]
fn a_corrupt_strip_is_found_named_and_repaired_and_redundancy_holds_after() {
    let cases = [
        // RAID5 cannot tell which strip is wrong: garbage in P is found and P recomputed.
        Case {
            level: Level::Raid5,
            place: |map| map.p_place().unwrap(),
            said: |slot| vec![format!("P on slot {slot} disagrees with the data"), "P recomputed".into()],
        },
        // RAID6 locates a single wrong data strip from P and Q and rewrites only it.
        Case {
            level: Level::Raid6,
            place: |map| map.data_copy(1, 0),
            said: |slot| vec![format!("slot {slot} (Data"), "P and Q both point to it".into(), "rewritten".into()],
        },
        // A mirror cannot tell which copy is right: copy 0 goes over the others.
        Case {
            level: Level::Raid10,
            place: |map| map.data_copy(0, 1),
            said: |slot| vec![format!("and slot {slot}"), "nothing tells which is right".into(), "copy 0".into()],
        },
    ];
    for case in cases {
        let level = case.level;
        let engine = engine();
        let drives = mem_drives(4, DRIVE_BYTES);
        let controller = open(&engine, &drives);
        let mut vd_spec = spec(level, &[0, 1, 2, 3], "db");
        vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
        controller.create_vd(vd_spec).unwrap();
        let (record, vd) = controller.vd(0).unwrap();
        let model = pattern(vd.capacity_bytes() as usize, 5);
        engine.write_at(&vd, 0, &model).unwrap();

        let row = vd.geometry().row_count() / 2 + 1;
        let place = (case.place)(&vd.geometry().row_map(row));
        let garbage: Vec<u8> = (0..vd.geometry().strip_size_bytes()).map(|i| (i * 31 + 7) as u8).collect();
        write_direct(&*drives[place.drive], place.drive_offset_bytes, &garbage);
        let slot = record.member_slots[place.drive];

        let before = controller.events().len();
        controller.start_cc(0, true).unwrap();
        wait_for_cc(&controller, 0, before);
        let events = events_since(&controller, before);
        let reported: Vec<&String> = events.iter().filter(|e| e.contains("inconsistent:")).collect();
        assert_eq!(reported.len(), 1, "{level}: exactly the corrupted row is reported: {events:#?}");
        assert!(reported[0].contains(&format!("row {row} ")), "{level}: {}", reported[0]);
        for words in (case.said)(slot) {
            assert!(reported[0].contains(&words), "{level}: {words:?} in {}", reported[0]);
        }
        let done = events.iter().find(|e| e.contains("done in")).unwrap_or_else(|| panic!("{level}: no end event: {events:#?}"));
        assert!(done.contains("1 inconsistent, 1 repaired"), "{level}: {done}");

        // Clean now, and the row's redundancy is back: with another member out, every byte
        // still reads back.
        let before = controller.events().len();
        controller.start_cc(0, false).unwrap();
        wait_for_cc(&controller, 0, before);
        let events = events_since(&controller, before);
        assert!(events.iter().any(|e| e.contains("0 inconsistent")), "{level}: a second check finds nothing: {events:#?}");
        check_vd(&engine, &vd, &model, &format!("{level} after the repair"));
        // RAID10: the partner of the repaired copy, so that reads must come from it.
        let other = if level == Level::Raid10 { slot ^ 1 } else { (0..4u32).find(|&s| s != slot).unwrap() };
        controller.set_drive(other, DriveCommand::Offline).unwrap();
        check_vd(&engine, &vd, &model, &format!("{level} after the repair, slot {other} out"));
    }
}

#[test]
fn bad_requests_start_nothing_and_say_what_is_allowed() {
    let engine = engine();
    let drives = mem_drives(5, DRIVE_BYTES);
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid0, &[0], "fast")).unwrap();
    controller.create_vd(spec(Level::Raid5, &[1, 2, 3], "db")).unwrap();
    let error = controller.start_cc(0, true).unwrap_err();
    assert!(matches!(&error, ControlError::BadInput(m) if m.contains("needs redundancy")), "{error}");
    assert!(matches!(controller.start_cc(9, true), Err(ControlError::NotFound(_))));
    let error = controller.cc_command(1, CcCommand::Pause).unwrap_err();
    assert!(error.to_string().contains("v1 has no consistency check running"), "{error}");
    let error = controller.set_controller(ControllerChanges { cc_rate_percent: Some(101), ..Default::default() }).unwrap_err();
    assert!(error.to_string().contains("allowed: 0 to 100"), "{error}");
    assert_eq!(controller.config().settings.cc_rate_percent, 30, "a refused rate changes nothing");

    // Paused, a check refuses a second start and a second pause; resumed, it ends.
    let (_, vd) = controller.vd(1).unwrap();
    engine.write_at(&vd, 0, &pattern(vd.capacity_bytes() as usize, 1)).unwrap();
    controller.set_controller(ControllerChanges { cc_rate_percent: Some(0), ..Default::default() }).unwrap();
    let before = controller.events().len();
    controller.start_cc(1, true).unwrap();
    controller.cc_command(1, CcCommand::Pause).unwrap();
    assert!(matches!(controller.start_cc(1, true), Err(ControlError::Conflict(_))));
    let error = controller.cc_command(1, CcCommand::Pause).unwrap_err();
    assert!(error.to_string().contains("allowed only when it is in progress"), "{error}");
    controller.cc_command(1, CcCommand::Resume).unwrap();
    wait_for_cc(&controller, 1, before);

    // Degraded: nothing to compare.
    controller.set_drive(2, DriveCommand::Offline).unwrap();
    let error = controller.start_cc(1, true).unwrap_err();
    assert!(matches!(&error, ControlError::Conflict(m) if m.contains("needs every member online")), "{error}");
}

/// The schedule (`set cc=seq|conc`): a round starts when due, checks every VD with
/// redundancy (one after another in seq), skips a RAID0, moves the next start a delay on, and
/// the schedule survives a restart; bad input changes nothing.
#[test]
fn scheduled_rounds_check_every_vd_and_the_schedule_survives_a_restart() {
    use engine::config::CcMode;
    let engine = engine();
    let drives = mem_drives(5, DRIVE_BYTES);
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "a")).unwrap();
    controller.create_vd(spec(Level::Raid1, &[2, 3], "b")).unwrap();
    controller.create_vd(spec(Level::Raid0, &[4], "fast")).unwrap();
    let error = controller.set_controller(ControllerChanges { cc_delay_hours: Some(0), ..Default::default() }).unwrap_err();
    assert!(error.to_string().contains("allowed: 1 to 65535 (hours)"), "{error}");
    assert_eq!(controller.config().settings.cc_schedule.mode, CcMode::Off, "off by default, and a refused change changes nothing");

    let before = controller.events().len();
    controller
        .set_controller(ControllerChanges { cc_mode: Some(CcMode::Sequential), cc_delay_hours: Some(24), ..Default::default() })
        .unwrap();
    let turned_on_at = controller.config().settings.cc_schedule.next_start_unix_secs;
    let deadline = Instant::now() + CC_TIMEOUT;
    let done = |vd: u32| events_since(&controller, before).iter().position(|e| e.contains(&format!("consistency check of v{vd} done")));
    while done(0).is_none() || done(1).is_none() {
        assert!(Instant::now() < deadline, "the scheduled round never ended: {:#?}", events_since(&controller, before));
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = events_since(&controller, before);
    assert!(said.iter().any(|e| e.contains("scheduled consistency check round started (seq): v0, v1")), "RAID0 left out: {said:#?}");
    let started_v1 = said.iter().position(|e| e.contains("consistency check of v1 started")).unwrap();
    assert!(done(0).unwrap() < started_v1, "seq: v1 starts once v0 is done: {said:#?}");
    let schedule = controller.config().settings.cc_schedule;
    assert_eq!(schedule.next_start_unix_secs, turned_on_at + 24 * 3600, "the next round a delay after this one");

    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    let reopened = Controller::open(Arc::clone(&engine), offered, ControllerOptions { ours: Some(id), ..Default::default() }).unwrap();
    assert_eq!(reopened.config().settings.cc_schedule, schedule, "the schedule is in the metadata");
}

/// A member that cannot read its part of a row does not end the check: the row is rewritten
/// onto it from the rest of the row (curing the medium error), checked again, and the event
/// says so; every byte then reads right with another member out.
#[test]
fn a_read_error_during_a_check_is_repaired_and_the_check_goes_on() {
    use drive::{Faults, FaultyDrive, MemDrive};
    for (level, count) in [(Level::Raid5, 4), (Level::Raid10, 4)] {
        let engine = engine();
        let faulty: Vec<Arc<FaultyDrive>> = (0..count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))))).collect();
        let drives: Vec<Arc<dyn Drive>> = faulty.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
        let controller = open(&engine, &drives);
        let mut vd_spec = spec(level, &(0..count as u32).collect::<Vec<_>>(), "db");
        vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
        controller.create_vd(vd_spec).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let model = pattern(vd.capacity_bytes() as usize, 3);
        engine.write_at(&vd, 0, &model).unwrap();
        let row = 3;
        let place = vd.geometry().row_map(row).data_copy(0, 0);
        let bad = place.drive_offset_bytes + 4096..place.drive_offset_bytes + 8192;
        faulty[place.drive].set_faults(Faults { medium_error_ranges: vec![bad], ..Faults::default() });
        let before = controller.events().len();
        controller.start_cc(0, true).unwrap();
        wait_for_cc(&controller, 0, before);
        let said = events_since(&controller, before);
        let slot = place.drive;
        let repaired = format!("row {row}: slot {slot} could not be read");
        assert!(
            said.iter().any(|e| e.contains(&repaired) && e.contains("rewritten from the rest of the row, then checked: consistent")),
            "{level}: {said:#?}"
        );
        assert!(said.iter().any(|e| e.contains("consistency check of v0 done")), "{level}: the check went on to its end: {said:#?}");
        assert!(faulty[place.drive].faults().medium_error_ranges.is_empty(), "{level}: the bad sectors were written over");
        let other = if level == Level::Raid10 { slot as u32 ^ 1 } else { (slot as u32 + 1) % 4 };
        controller.set_drive(other, DriveCommand::Offline).unwrap();
        check_vd(&engine, &vd, &model, &format!("{level} after the repair, slot {other} out"));
    }
}

#[test]
fn a_check_that_repaired_rows_ends_once_the_members_flushed_them() {
    // The resync after an unclean stop trusts data strips: a repair a power cut took back
    // would leave the bad strip for good, so "done" comes after the members' flushes.
    let engine = engine();
    let counting: Vec<Arc<CountingDrive>> = mem_drives(4, DRIVE_BYTES).into_iter().map(CountingDrive::over).collect();
    let drives: Vec<Arc<dyn Drive>> = counting.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid6, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let model = pattern(vd.capacity_bytes() as usize, 9);
    engine.write_at(&vd, 0, &model).unwrap();
    let flushes = || counting.iter().map(|d| d.flushes()).collect::<Vec<_>>();

    // Nothing to repair: the check asks for no flush.
    let (before, flushed) = (controller.events().len(), flushes());
    controller.start_cc(0, true).unwrap();
    wait_for_cc(&controller, 0, before);
    assert_eq!(flushes(), flushed, "a clean check flushes nothing");

    let place = vd.geometry().row_map(2).data_copy(0, 0);
    write_direct(&*drives[place.drive], place.drive_offset_bytes, &[0x5a; 4096]);
    let (before, flushed) = (controller.events().len(), flushes());
    controller.start_cc(0, true).unwrap();
    wait_for_cc(&controller, 0, before);
    let said = events_since(&controller, before);
    assert!(said.iter().any(|e| e.contains("1 inconsistent, 1 repaired")), "{said:#?}");
    let after = flushes();
    assert!(after.iter().zip(&flushed).all(|(a, b)| a > b), "every member flushed after the repair: {flushed:?} -> {after:?}");
    check_vd(&engine, &vd, &model, "after the repair");
}
