//! Initialization through the controller, over memory drives that held random bytes before the
//! VD was created (a reused disk): background initialization (BGI) makes parity and copies
//! agree with the data while clients write, resumes after a crash from its checkpoint, and
//! `start init` (fast and full) zeroes what it says. Members that read as zero skip BGI.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, FaultyDrive};
use engine::config::ControllerId;
use engine::controller::{BgiCommand, ControlError, Controller, ControllerChanges, ControllerOptions, DriveCommand, OfferedDrive};
use engine::vd::VdError;
use engine::{Engine, VirtualDrive};
use layout::{Level, MIB};
use rand::{RngCore, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Two regions of 64 MiB per member, and a bit.
const DRIVE_BYTES: u64 = 2 * 64 * MIB + 8 * MIB;
const TIMEOUT: Duration = Duration::from_secs(120);
const CHUNK_BYTES: usize = 256 << 10;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

/// Memory drives whose whole area holds random bytes, as disks that held other data do.
fn used_drives(count: usize, seed: u64) -> Vec<Arc<dyn Drive>> {
    let drives = mem_drives(count, DRIVE_BYTES);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut chunk = vec![0u8; 8 << 20];
    for drive in &drives {
        for offset_bytes in (0..DRIVE_BYTES).step_by(chunk.len()) {
            rng.fill_bytes(&mut chunk);
            common::write_drive_at(&**drive, offset_bytes, &chunk);
        }
    }
    drives
}

fn wait_until(what: &str, controller: &Controller, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        let events: Vec<String> = controller.events().into_iter().rev().take(8).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "{what} never happened; recent events: {events:#?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn events(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

fn spec_for(level: Level, slots: &[u32]) -> engine::controller::CreateVdSpec {
    let mut vd_spec = spec(level, slots, "db");
    vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
    vd_spec
}

fn check_image(engine: &Engine, vd: &Arc<VirtualDrive>, expected: &[u8], when: &str) {
    for (index, want) in expected.chunks(4 << 20).enumerate() {
        let offset = index as u64 * (4 << 20);
        let read = engine.read_at(vd, offset, want.len()).unwrap_or_else(|e| panic!("{when}: offset {offset}: {e}"));
        let wrong = read.as_slice().iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(wrong, None, "{when}: first wrong byte after VD byte {offset}");
    }
}

/// Runs a report-only consistency check and returns (rows checked, rows inconsistent).
fn check_consistency(controller: &Controller, vd_id: u32) -> (u64, u64) {
    let before = controller.events().len();
    controller.start_cc(vd_id, false).unwrap();
    let end_event = || controller.events().into_iter().skip(before).map(|e| e.description).find(|e| e.contains("done in"));
    // The end event is logged just after the check leaves the list: wait for the event itself.
    wait_until("the consistency check's end event", controller, || end_event().is_some());
    let done = end_event().expect("an end event");
    let number_before = |words: &str| -> u64 {
        let head = &done[..done.find(words).unwrap_or_else(|| panic!("{words:?} in {done:?}"))];
        head.trim_end().rsplit([' ', ':']).next().unwrap().parse().unwrap()
    };
    (number_before("row(s) checked"), number_before("inconsistent"))
}

/// A VD over members that held data: while BGI crawls (rate 0, clients busy), client writes
/// read back; once it is done a check finds no inconsistent row, and with a member out every
/// byte still reads as it did.
#[test]
fn bgi_makes_a_vd_over_old_data_consistent_while_clients_write() {
    for (level, drive_count) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4), (Level::Raid1, 2)] {
        let engine = engine();
        let drives = used_drives(drive_count, level as u64);
        let controller = open(&engine, &drives, None);
        controller.set_controller(ControllerChanges { bgi_rate_percent: Some(0), ..Default::default() }).unwrap();
        let slots: Vec<u32> = (0..drive_count as u32).collect();
        controller.create_vd(spec_for(level, &slots)).unwrap();
        // Held at once (alone it would be done in a moment), until clients keep it busy.
        controller.bgi_command(0, BgiCommand::Pause).unwrap();
        let (record, vd) = controller.vd(0).unwrap();
        assert!(record.bgi_pending, "{level}: recorded as needing its BGI");
        assert!(events(&controller).iter().any(|e| e.contains("its members held data; background initialization")), "{level}");
        let mut image = engine.read_at(&vd, 0, vd.capacity_bytes() as usize).unwrap().as_slice().to_vec();

        // Clients busy for a while: at rate 0 BGI moves one small burst per half second.
        controller.bgi_command(0, BgiCommand::Resume).unwrap();
        let started = Instant::now();
        let mut seed = 0u8;
        while started.elapsed() < Duration::from_millis(1500) {
            let offset = (u64::from(seed) * 7919 * 4096) % (vd.capacity_bytes() - CHUNK_BYTES as u64);
            let data = pattern(CHUNK_BYTES, seed);
            engine.write_at(&vd, offset, &data).unwrap();
            image[offset as usize..][..CHUNK_BYTES].copy_from_slice(&data);
            let read = engine.read_at(&vd, offset, CHUNK_BYTES).unwrap();
            assert!(read.as_slice() == data.as_slice(), "{level}: a write during BGI reads back");
            seed = seed.wrapping_add(1);
        }
        let bgi = controller.bgi(0).expect("still pending while clients kept it at rate 0");
        assert_eq!(bgi.status, "In progress", "{level}");
        assert!(bgi.regions_left > 0 && bgi.percent_done < 100.0, "{level}: {bgi:?}");
        let refused = controller.start_cc(0, false).unwrap_err();
        assert!(matches!(&refused, ControlError::Conflict(m) if m.contains("to initialize")), "{level}: no check before BGI: {refused}");

        wait_until("the end of BGI", &controller, || controller.bgi(0).is_none());
        assert!(!controller.vd(0).unwrap().0.bgi_pending, "{level}: recorded consistent");
        assert!(events(&controller).iter().any(|e| e.contains("background initialization of v0 complete")), "{level}");
        let (checked, inconsistent) = check_consistency(&controller, 0);
        assert_eq!((checked, inconsistent), (vd.geometry().row_count(), 0), "{level}: rows checked, inconsistent after BGI");
        check_image(&engine, &vd, &image, &format!("{level} after BGI"));
        controller.set_drive(drive_count as u32 - 1, DriveCommand::Offline).unwrap();
        check_image(&engine, &vd, &image, &format!("{level} after BGI with the last member offline"));
    }
}

/// Members that read as zero need no BGI, and the creation event says so.
#[test]
fn a_vd_over_zeroed_members_skips_bgi() {
    let engine = engine();
    let drives = mem_drives(4, DRIVE_BYTES);
    let controller = open(&engine, &drives, None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    assert!(!controller.vd(0).unwrap().0.bgi_pending);
    assert!(controller.bgi(0).is_none());
    assert!(events(&controller).iter().any(|e| e.contains("every member reads as zero") && e.contains("no background initialization")));
    let error = controller.bgi_command(0, BgiCommand::Pause).unwrap_err();
    assert!(matches!(&error, ControlError::NotFound(m) if m.contains("no background initialization pending")), "{error}");
}

/// A crash (the controller dropped without shutdown) after BGI was stopped part way: the next
/// start resumes it from its checkpoint, not from the first region, and it completes.
#[test]
fn a_crash_during_bgi_resumes_it_from_its_checkpoint() {
    let engine = engine();
    let drives = used_drives(4, 7);
    let first = open(&engine, &drives, None);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    let region_count = vd.write_intent().unwrap().regions.region_count;
    assert!(region_count >= 2, "the test needs regions to resume past");
    // Paused as soon as a region is done, so that the stop below lands before the end.
    wait_until("one region initialized", &first, || {
        first.bgi(0).is_some_and(|bgi| bgi.regions_left < region_count) && first.bgi_command(0, BgiCommand::Pause).is_ok()
    });
    let left_at_stop = first.bgi(0).unwrap().regions_left;
    first.bgi_command(0, BgiCommand::Stop).unwrap();
    wait_until("BGI to stop", &first, || events(&first).iter().any(|e| e.contains("background initialization of v0 stopped after")));
    assert_eq!(first.bgi(0).unwrap().status, "Stopped");
    let image = engine.read_at(&vd, 0, vd.capacity_bytes() as usize).unwrap().as_slice().to_vec();
    let id = first.config().controller_id;
    drop(first); // no shutdown: a crash

    let second = open(&engine, &drives, Some(id));
    let opened = events(&second);
    let resumed = opened.iter().find(|e| e.contains("background initialization of v0 started")).expect("BGI resumes at start");
    assert!(resumed.contains(&format!("{left_at_stop} of {region_count} region(s)")), "resumed from the checkpoint: {resumed}");
    wait_until("the end of BGI", &second, || second.bgi(0).is_none());
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(check_consistency(&second, 0).1, 0, "no inconsistent row after the resumed BGI");
    second.set_drive(1, DriveCommand::Offline).unwrap();
    check_image(&engine, &vd, &image, "after the resumed BGI, degraded");
}

/// `start init`: fast zeroes the first and last 8 MiB with clients served; full zeroes every
/// row while the VD refuses I/O, and leaves no BGI to do.
#[test]
fn fast_and_full_initialization_zero_what_they_say() {
    let engine = engine();
    // Behind a fault layer, so that the full initialization can be slowed down: the read that
    // must find it running would otherwise race it on a loaded machine.
    let slowable: Vec<Arc<FaultyDrive>> = used_drives(3, 11).into_iter().map(|d| Arc::new(FaultyDrive::new(d))).collect();
    let drives: Vec<Arc<dyn Drive>> = slowable.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let controller = open(&engine, &drives, None);
    controller.set_controller(ControllerChanges { bgi_rate_percent: Some(0), ..Default::default() }).unwrap();
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let capacity = vd.capacity_bytes();
    let middle_before = engine.read_at(&vd, 16 * MIB, 1 << 20).unwrap().as_slice().to_vec();
    assert!(middle_before.iter().any(|&b| b != 0), "old data in the middle");

    controller.start_init(0, false, false, false).unwrap();
    let zeros = vec![0u8; 8 << 20];
    assert!(engine.read_at(&vd, 0, zeros.len()).unwrap().as_slice() == zeros.as_slice(), "first 8 MiB zeroed");
    assert!(engine.read_at(&vd, capacity - zeros.len() as u64, zeros.len()).unwrap().as_slice() == zeros.as_slice(), "last 8 MiB");
    assert!(engine.read_at(&vd, 16 * MIB, 1 << 20).unwrap().as_slice() == middle_before.as_slice(), "the middle is untouched");
    assert!(controller.bgi(0).is_some(), "a fast init leaves BGI to go on");

    let error = controller.start_init(0, true, false, true).unwrap_err();
    assert!(matches!(&error, ControlError::Conflict(m) if m.contains("NBD clients connected")), "{error}");
    let set_latency = |latency| slowable.iter().for_each(|d| d.update_faults(|f| f.latency = latency));
    set_latency(Some(Duration::from_millis(5)));
    controller.start_init(0, true, false, false).unwrap();
    // Zeroing three 136 MiB members, each write 5 ms late, takes far longer than this read
    // takes to arrive.
    let refused = engine.read_at(&vd, 0, 4096);
    assert!(matches!(refused, Err(VdError::Initializing { .. })), "a read while the full init runs is refused, got {refused:?}");
    set_latency(None);
    wait_until("the full init", &controller, || controller.init(0).is_none());
    assert!(events(&controller).iter().any(|e| e.contains("full initialization of v0 done")));
    assert!(controller.bgi(0).is_none() && !controller.vd(0).unwrap().0.bgi_pending, "nothing left for BGI");
    assert_eq!(check_consistency(&controller, 0).1, 0);
    controller.set_drive(0, DriveCommand::Offline).unwrap();
    let all_zeros = vec![0u8; capacity as usize];
    check_image(&engine, &vd, &all_zeros, "after a full init, degraded");
}
