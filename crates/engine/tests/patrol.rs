//! Patrol read through the controller, over members that return medium errors in a range
//! (`Faults::medium_error_ranges`, cured by a write as a disk remaps a pending sector): it finds
//! them, rewrites them from redundancy, says so in events, and afterwards the range reads and
//! every byte of the VD is right, with another member taken out too. Where nothing else holds
//! the data, the loss is in the bad-block list; a spare's errors are named; bad input is refused.

#![allow(clippy::single_range_in_vec_init)] // a fault range is one range, not a list of numbers

mod common;

use common::{engine, pattern, spec};
use drive::{Drive, DriveOp, Faults, FaultyDrive, IoBuf, IoCtx, MemDrive};
use engine::controller::{ControlError, Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive, PatrolCommand};
use engine::vd::VdError;
use engine::{Engine, MEMBER_RESERVED_BYTES};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 24 * MIB;
const TIMEOUT: Duration = Duration::from_secs(60);

fn faulty_drives(count: usize) -> Vec<Arc<FaultyDrive>> {
    (0..count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))))).collect()
}

fn open(engine: &Arc<Engine>, drives: &[Arc<FaultyDrive>]) -> Arc<Controller> {
    let offered = drives
        .iter()
        .enumerate()
        .map(|(i, d)| OfferedDrive { drive: Arc::clone(d) as Arc<dyn Drive>, source: format!("faulty{i}") })
        .collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions::default()).unwrap()
}

fn events(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

fn patrol_to_the_end(controller: &Controller) -> Vec<String> {
    let before = controller.events().len();
    controller.start_patrol_read().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while controller.patrol_read().is_some() {
        assert!(Instant::now() < deadline, "the patrol read never ended: {:#?}", events(controller));
        std::thread::sleep(Duration::from_millis(5));
    }
    events(controller).into_iter().skip(before).collect()
}

fn reads(drive: &dyn Drive, offset_bytes: u64, len_bytes: u64) -> bool {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) });
    let mut done = Vec::new();
    ctx.poll(&mut done, false);
    done[0].result.is_ok()
}

fn check_image(engine: &Engine, vd: &Arc<engine::VirtualDrive>, image: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, image.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let wrong = read.as_slice().iter().zip(image).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "{when}: first wrong byte");
}

#[test]
fn patrol_read_rewrites_medium_errors_from_redundancy() {
    for (level, count) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid1, 2), (Level::Raid10, 4)] {
        let engine = engine();
        let drives = faulty_drives(count);
        let controller = open(&engine, &drives);
        let mut vd_spec = spec(level, &(0..count as u32).collect::<Vec<_>>(), "db");
        vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
        controller.create_vd(vd_spec).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let image = pattern(vd.capacity_bytes() as usize, 5);
        engine.write_at(&vd, 0, &image).unwrap();

        // Three sectors inside a strip and a range across a strip boundary, on slot 1.
        let strip = vd.geometry().strip_size_bytes();
        let data = MEMBER_RESERVED_BYTES;
        let bad = vec![data + 5 * strip + 1024..data + 5 * strip + 2560, data + 9 * strip - 4096..data + 9 * strip + 8192];
        drives[1].set_faults(Faults { medium_error_ranges: bad.clone(), ..Faults::default() });
        assert!(!reads(&*drives[1], bad[0].start, 512), "{level}: the medium error is there before the patrol");

        let said = patrol_to_the_end(&controller);
        let corrected: Vec<&String> = said.iter().filter(|e| e.contains("patrol read corrected medium error on slot 1")).collect();
        assert_eq!(corrected.len(), 2, "{level}: one event per bad range: {said:#?}");
        assert!(corrected[0].contains(&format!("LBA {}", (bad[0].start / 4096) * 8)), "{level}: names the LBA: {}", corrected[0]);
        assert!(said.iter().any(|e| e.contains("patrol read done") && e.contains("2 medium error(s) found, 2 corrected")), "{said:#?}");
        assert!(drives[1].faults().medium_error_ranges.is_empty(), "{level}: every bad sector was written over");
        for range in &bad {
            assert!(reads(&*drives[1], range.start, range.end - range.start), "{level}: the range reads after the patrol");
        }
        check_image(&engine, &vd, &image, &format!("{level} after the patrol"));
        // The rewritten sectors hold the right data: read them through slot 1 with slot 0 out.
        controller.set_drive(0, DriveCommand::Offline).unwrap();
        check_image(&engine, &vd, &image, &format!("{level} after the patrol, slot 0 offline"));
    }
}

/// RAID5 with both slot 1 and slot 2 unreadable at the same place of a row: nothing holds the
/// data of slot 1 there, so it goes to the bad-block list and the event says so; RAID0 likewise.
#[test]
fn patrol_read_records_what_nothing_else_holds() {
    for (level, count) in [(Level::Raid5, 3), (Level::Raid0, 2)] {
        let engine = engine();
        let drives = faulty_drives(count);
        let controller = open(&engine, &drives);
        controller.create_vd(spec(level, &(0..count as u32).collect::<Vec<_>>(), "db")).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        engine.write_at(&vd, 0, &pattern(vd.capacity_bytes() as usize, 8)).unwrap();
        let bad = MEMBER_RESERVED_BYTES + 3 * vd.geometry().strip_size_bytes();
        for drive in &drives[1..] {
            drive.set_faults(Faults { medium_error_ranges: vec![bad..bad + 4096], ..Faults::default() });
        }
        let said = patrol_to_the_end(&controller);
        assert!(said.iter().any(|e| e.contains("not corrected") && e.contains("bad-block list")), "{level}: {said:#?}");
        let deadline = Instant::now() + TIMEOUT;
        while controller.vd(0).unwrap().0.bad_blocks.is_empty() {
            assert!(Instant::now() < deadline, "{level}: the loss never reached the metadata");
            std::thread::sleep(Duration::from_millis(5));
        }
        let lost = controller.vd(0).unwrap().0.bad_blocks[0];
        let refused = engine.read_at(&vd, lost.offset_bytes, 512);
        assert!(matches!(refused, Err(VdError::BadBlock { .. })), "{level}: a read of the lost range fails: {refused:?}");
    }
}

#[test]
fn patrol_read_names_a_spare_and_refuses_bad_input() {
    let engine = engine();
    let drives = faulty_drives(4);
    let controller = open(&engine, &drives);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "db")).unwrap();
    controller.add_hot_spare(3, vec![]).unwrap();
    drives[3].set_faults(Faults { medium_error_ranges: vec![DRIVE_BYTES - 8192..DRIVE_BYTES - 4096], ..Faults::default() });
    let said = patrol_to_the_end(&controller);
    assert!(said.iter().any(|e| e.contains("patrol read started: 3 drive(s) (slots 0, 1, 3)")), "slot 2 is in no VD: {said:#?}");
    assert!(said.iter().any(|e| e.contains("medium error on hot spare slot 3")), "{said:#?}");

    let bad = |changes: ControllerChanges, words: &str| {
        let error = controller.set_controller(changes).unwrap_err();
        assert!(matches!(&error, ControlError::BadInput(m) if m.contains(words)), "{error}");
    };
    bad(ControllerChanges { patrol_delay_hours: Some(0), ..Default::default() }, "allowed: 1 to 65535 (hours)");
    bad(ControllerChanges { patrol_rate_percent: Some(101), ..Default::default() }, "allowed: 0 to 100");
    let patrol = controller.config().settings.patrol;
    assert!(patrol.last_start_unix_secs > 0, "the start of the patrol read is recorded");
    let defaults = engine::config::PatrolSettings { last_start_unix_secs: patrol.last_start_unix_secs, ..Default::default() };
    assert_eq!(patrol, defaults, "refused changes change nothing");
    let next = controller.patrol_next_start_unix_secs().expect("on and automatic: scheduled");
    assert_eq!(next, patrol.last_start_unix_secs + 168 * 3600, "the next one a delay after the last start");
    let error = controller.patrol_command(PatrolCommand::Pause).unwrap_err();
    assert!(matches!(&error, ControlError::NotFound(m) if m.contains("no patrol read is running")), "{error}");
    controller.set_controller(ControllerChanges { patrol_read: Some(false), ..Default::default() }).unwrap();
    let error = controller.start_patrol_read().unwrap_err();
    assert!(matches!(&error, ControlError::Conflict(m) if m.contains("patrol read is off")), "{error}");
    assert_eq!(controller.patrol_next_start_unix_secs(), None, "off: nothing scheduled");
}
