//! Hot-spare takeover and rebuild through the controller: the spare takes a failed member's
//! place at once, is rebuilt row by row while clients write, and then holds the data alone (a
//! different member taken out afterwards, every byte still reads back). A rebuild stopped by a
//! restart resumes from its checkpoint.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, Faults, FaultyDrive, MemDrive};
use engine::config::{BadBlock, DriveState};
use engine::controller::{ranges_text, Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive, RebuildCommand};
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
    // The rows client reads may take from the spare are published right after the watermark
    // moves: wait for both.
    while controller.rebuilds().first().map_or(0.0, |r| r.progress.percent_done()) < 30.0 || vd.readable_rows(3) == 0 {
        assert!(Instant::now() < deadline, "the rebuild makes no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Paused, so that reading the whole VD below cannot outlast the rebuild.
    controller.rebuild_command(4, RebuildCommand::Pause).unwrap();
    let readable_rows = vd.readable_rows(3);
    assert!(
        readable_rows > 0 && readable_rows < vd.geometry().row_count(),
        "the rebuild publishes the rows client reads may take from the spare: {readable_rows}"
    );
    check_vd(&engine, &vd, &model, "during the rebuild, reading the spare below its watermark");
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

/// A source sector that cannot be read while nothing else holds its data: the rebuild records
/// the lost VD bytes as a bad block (an event names VD, range and cause), goes on, and the
/// member becomes Onln. Reads of the range fail, even once the sector reads again; everything
/// else reads back. The list is in the metadata, so a restart keeps it; a write over it clears
/// it, on disk too.
#[test]
fn lost_data_becomes_a_bad_block_that_survives_a_restart_until_written() {
    let engine = engine();
    let mut drives: Vec<Arc<dyn Drive>> = mem_drives(5, DRIVE_BYTES);
    let flaky = Arc::new(FaultyDrive::new(Arc::clone(&drives[2])));
    drives[2] = flaky.clone();
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    controller.add_hot_spare(4, vec![]).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut model = pattern(vd.capacity_bytes() as usize, 5);
    engine.write_at(&vd, 0, &model).unwrap();
    let bad_start = 16 * MIB + 8192;
    flaky.set_faults(Faults { read_error_ranges: std::iter::once(bad_start..bad_start + 512).collect(), ..Faults::default() });
    let expected = lost_chunks(&vd, bad_start, [1, 2]);

    controller.set_drive(1, DriveCommand::Offline).unwrap();
    wait_for_state(&controller, 4, DriveState::Online);
    assert_eq!(vd.state(), VdState::Optimal);
    assert_eq!(controller.bad_blocks(0).unwrap(), expected);
    assert_eq!(controller.config().vds[0].bad_blocks, expected, "in the metadata before the row was written");
    let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
    let recorded = format!("v0: data lost, recorded as bad block(s) {}: rebuilding member 1 at row ", ranges_text(&expected));
    assert!(events.iter().any(|e| e.starts_with(&recorded) && e.contains("member 2 (")), "{recorded}\n{events:#?}");
    flaky.set_faults(Faults::default()); // the sector reads again (zeros, as the rebuild wrote)
    check_outside(&engine, &vd, &model, &expected, "after the rebuild");
    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);

    let second = open(&engine, &drives, Some(id));
    assert_eq!(second.bad_blocks(0).unwrap(), expected, "the list survives a restart");
    let (_, vd) = second.vd(0).unwrap();
    check_outside(&engine, &vd, &model, &expected, "after the restart");
    for range in &expected {
        let data = pattern(range.len_bytes as usize, 77);
        engine.write_at(&vd, range.offset_bytes, &data).unwrap();
        model[range.offset_bytes as usize..(range.offset_bytes + range.len_bytes) as usize].copy_from_slice(&data);
    }
    assert_eq!(second.bad_blocks(0).unwrap(), vec![], "written: good again");
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    while !second.config().vds[0].bad_blocks.is_empty() {
        assert!(Instant::now() < deadline, "the shorter list is never written");
        std::thread::sleep(Duration::from_millis(5));
    }
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e.ends_with("written by a client: good again")), "{events:#?}");
    second.shutdown();
    drop(second);
    let third = open(&engine, &drives, Some(id));
    assert_eq!(third.bad_blocks(0).unwrap(), vec![]);
    check_vd(&engine, &third.vd(0).unwrap().1, &model, "after writing the bad blocks and a restart");
    let error = third.bad_blocks(7).unwrap_err();
    assert_eq!(error.to_string(), "virtual drive v7 does not exist; VDs: v0");
}

/// The 4 KiB chunk around drive offset `drive_offset` of every data strip of its row that sits
/// on one of `lost` (a 64 KiB strip RAID5: both members' data is lost there).
fn lost_chunks(vd: &engine::VirtualDrive, drive_offset: u64, lost: [usize; 2]) -> Vec<BadBlock> {
    let geometry = vd.geometry();
    let strip = geometry.strip_size_bytes();
    let row = (drive_offset - engine::MEMBER_RESERVED_BYTES) / strip;
    let chunk_start = (drive_offset - engine::MEMBER_RESERVED_BYTES) % strip / 4096 * 4096;
    let map = geometry.row_map(row);
    (0..map.data_strip_count())
        .filter(|&k| lost.contains(&map.data_copy(k, 0).drive))
        .map(|k| BadBlock { offset_bytes: row * geometry.row_data_bytes() + k as u64 * strip + chunk_start, len_bytes: 4096 })
        .collect()
}

/// Reads of each bad block fail naming it; everything around them reads back as `expected`.
fn check_outside(engine: &Engine, vd: &Arc<engine::VirtualDrive>, expected: &[u8], bad: &[BadBlock], when: &str) {
    let mut from = 0u64;
    for range in bad.iter().chain([&BadBlock { offset_bytes: expected.len() as u64, len_bytes: 0 }]) {
        if range.len_bytes > 0 {
            let error = engine.read_at(vd, range.offset_bytes, 4096).map(|_| ()).unwrap_err();
            assert_eq!(error, engine::VdError::BadBlock { vd: "db".into(), offset_bytes: range.offset_bytes, len_bytes: range.len_bytes });
        }
        let read = engine.read_at(vd, from, (range.offset_bytes - from) as usize).unwrap_or_else(|e| panic!("{when}: {e}"));
        let wrong = read.as_slice().iter().zip(&expected[from as usize..]).position(|(a, b)| a != b);
        assert_eq!(wrong.map(|i| from + i as u64), None, "{when}: first wrong byte");
        from = range.offset_bytes + range.len_bytes;
    }
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
    full.set_faults(Faults { write_error_ranges: std::iter::once(0..DRIVE_BYTES).collect(), ..Faults::default() });
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
