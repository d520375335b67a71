//! The write-intent bitmap through the controller, over memory drives: a member that comes back
//! is resynced in the regions written while it was out only; an unclean stop is resynced in its
//! dirty regions, and until then a read that needs parity fails instead of trusting it; a clean
//! stop leaves nothing to resync.

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, DriveOp, IoBuf};
use engine::bitmap::ondisk;
use engine::bitmap::RegionMap;
use engine::config::{ControllerId, DriveState};
use engine::controller::{Controller, ControllerOptions, DriveCommand, OfferedDrive, ResyncStatus};
use engine::vd::{CheckMode, VdError};
use engine::{Engine, VdState, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Four regions of 64 MiB per member, and a bit.
const DRIVE_BYTES: u64 = 4 * 64 * MIB + 8 * MIB;
const TIMEOUT: Duration = Duration::from_secs(60);
const CHUNK_BYTES: usize = 1 << 20;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

fn wait_until(what: &str, controller: &Controller, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        let events: Vec<String> = controller.events().into_iter().rev().take(8).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "{what} never happened; recent events: {events:#?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Clears every idle region now (what the daemon does after a few idle seconds).
fn clean_now(engine: &Engine, vd: &Arc<VirtualDrive>) {
    let (sender, receiver) = std::sync::mpsc::channel();
    engine.clean_write_intent(vd, true, Box::new(move |result| sender.send(result).unwrap()));
    receiver.recv().unwrap().unwrap();
}

/// The start of each region of the VD, in VD bytes: one chunk is written at each.
fn region_starts(vd: &VirtualDrive) -> Vec<u64> {
    let regions = RegionMap::for_geometry(vd.geometry());
    let row_bytes = vd.geometry().row_data_bytes();
    (0..regions.region_count)
        .map(|r| regions.rows_of(r).start * row_bytes)
        .filter(|&o| o + CHUNK_BYTES as u64 <= vd.capacity_bytes())
        .collect()
}

fn check_chunks(engine: &Engine, vd: &Arc<VirtualDrive>, chunks: &[(u64, Vec<u8>)], when: &str) {
    for (offset, data) in chunks {
        let read = engine.read_at(vd, *offset, data.len()).unwrap_or_else(|e| panic!("{when}: offset {offset}: {e}"));
        assert!(read.as_slice() == data.as_slice(), "{when}: wrong data at VD byte {offset}");
    }
}

fn spec_for(level: Level, slots: &[u32]) -> engine::controller::CreateVdSpec {
    let mut vd_spec = spec(level, slots, "db");
    vd_spec.drives_per_span = (level == Level::Raid10).then_some(2);
    vd_spec
}

#[test]
fn a_member_that_comes_back_is_resynced_only_where_it_missed_writes() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        let engine = engine();
        let slots: Vec<u32> = if level == Level::Raid1 { vec![0, 1] } else { vec![0, 1, 2, 3] };
        let controller = open(&engine, &mem_drives(slots.len(), DRIVE_BYTES), None);
        controller.create_vd(spec_for(level, &slots)).unwrap();
        let (_, vd) = controller.vd(0).unwrap();
        let starts = region_starts(&vd);
        assert!(starts.len() >= 3, "{level}: the test needs several regions");
        let mut chunks: Vec<(u64, Vec<u8>)> = starts.iter().enumerate().map(|(i, &o)| (o, pattern(CHUNK_BYTES, i as u8))).collect();
        chunks.iter().for_each(|(offset, data)| engine.write_at(&vd, *offset, data).unwrap());
        clean_now(&engine, &vd);
        assert!(vd.write_intent().unwrap().dirty_regions().is_empty(), "{level}: idle regions of a whole VD are cleared");

        controller.set_drive(1, DriveCommand::Offline).unwrap();
        // One region written while slot 1 is out; a clean pass must not forget it.
        chunks[1].1 = pattern(CHUNK_BYTES, 77);
        engine.write_at(&vd, chunks[1].0, &chunks[1].1).unwrap();
        clean_now(&engine, &vd);
        assert_eq!(vd.write_intent().unwrap().dirty_regions().count(), 1, "{level}: bits stay while a member is out");

        controller.set_drive(1, DriveCommand::Online).unwrap();
        wait_until(&format!("{level}: slot 1 online"), &controller, || controller.slot(1).unwrap().state == DriveState::Online);
        assert_eq!(vd.state(), VdState::Optimal, "{level}");
        let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
        let re_add = events.iter().find(|e| e.contains("re-add of slot 1")).unwrap_or_else(|| panic!("{level}: {events:#?}"));
        let rows_per_region = vd.write_intent().unwrap().regions.rows_per_region;
        assert!(re_add.contains(&format!(": 1 dirty region(s), {rows_per_region} row(s)")), "{level}: only that region's rows: {re_add}");

        // Slot 1 must hold the new data alone: take the other copy or another member out.
        controller.set_drive(0, DriveCommand::Offline).unwrap();
        check_chunks(&engine, &vd, &chunks, &format!("{level} with slot 0 out after the re-add"));
    }
}

/// What [`raid5_stopped_uncleanly`] leaves: the engine, the drives, the controller id, the
/// region starts and the VD's geometry.
type StoppedRaid5 = (Arc<Engine>, Vec<Arc<dyn Drive>>, ControllerId, Vec<u64>, layout::Geometry);

/// A RAID5 of four drives whose controller writes `chunks(starts)` (at VD byte offsets, given
/// the region starts) and is then dropped without `shutdown`: an unclean stop. Returns the
/// engine, the drives, the controller id, the region starts and the VD's geometry.
fn raid5_stopped_uncleanly(chunks: impl Fn(&[u64]) -> Vec<(u64, Vec<u8>)>) -> StoppedRaid5 {
    let engine = engine();
    let drives = mem_drives(4, DRIVE_BYTES);
    let first = open(&engine, &drives, None);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "db")).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    let starts = region_starts(&vd);
    chunks(&starts).iter().for_each(|(offset, data)| engine.write_at(&vd, *offset, data).unwrap());
    let (id, geometry) = (first.config().controller_id, *vd.geometry());
    (engine, drives, id, starts, geometry)
}

/// An unclean stop: the controller is dropped without `shutdown`, and one dirty row's parity is
/// made stale behind its back, as a write torn by a power cut leaves it.
#[test]
fn an_unclean_stop_is_resynced_in_its_dirty_regions() {
    let chunks_at = |starts: &[u64]| vec![(starts[0], pattern(CHUNK_BYTES, 1)), (starts[2], pattern(CHUNK_BYTES, 2))];
    let (engine, drives, id, starts, geometry) = raid5_stopped_uncleanly(chunks_at);
    let chunks = chunks_at(&starts);
    let row = starts[2] / geometry.row_data_bytes();
    let parity_place = geometry.row_map(row).p_place().unwrap();
    let stale = IoBuf::from_slice(&vec![0xEE; 4096]);
    run(&*drives[parity_place.drive], DriveOp::Write { offset_bytes: parity_place.drive_offset_bytes, buf: stale });

    let second = open(&engine, &drives, Some(id));
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e.contains("was not stopped cleanly: 2 of")), "{events:#?}");
    let (_, vd) = second.vd(0).unwrap();
    wait_until("the resync", &second, || second.resync_status(0).is_none());
    let (sender, receiver) = std::sync::mpsc::channel();
    engine.check_row(&vd, row, CheckMode::Report, Box::new(move |outcome| sender.send(outcome).unwrap()));
    let outcome = receiver.recv().unwrap().unwrap();
    assert!(outcome.is_consistent(), "the resync recomputed the stale parity: {outcome:?}");
    second.set_drive(parity_place.drive as u32 ^ 1, DriveCommand::Offline).unwrap();
    check_chunks(&engine, &vd, &chunks, "degraded after the resync");
}

/// Until a dirty region is resynced, a read that needs its parity fails: here the resync cannot
/// run, since a member is missing after the unclean stop.
#[test]
fn a_degraded_read_of_an_unsynced_region_fails_instead_of_trusting_its_parity() {
    let (engine, drives, id, starts, _) = raid5_stopped_uncleanly(|starts| vec![(starts[1], pattern(CHUNK_BYTES, 3))]);
    let without_slot_3 = &drives[..3];
    let second = open(&engine, without_slot_3, Some(id));
    let (_, vd) = second.vd(0).unwrap();
    assert_eq!(vd.state(), VdState::Degraded);
    assert_eq!(second.resync_status(0), Some(ResyncStatus::Pending { regions: 1 }));
    let mut refused = 0;
    for strip in 0..(CHUNK_BYTES as u64 / (64 << 10)) {
        let offset = starts[1] + strip * (64 << 10);
        match engine.read_at(&vd, offset, 64 << 10) {
            Ok(data) => assert!(data.as_slice() == &pattern(CHUNK_BYTES, 3)[(offset - starts[1]) as usize..][..64 << 10]),
            Err(VdError::RowNotResynced { .. }) => refused += 1,
            Err(error) => panic!("unexpected error: {error}"),
        }
    }
    assert!(refused > 0, "the strips on the missing member need parity");
    // A region nobody wrote before the stop reads as usual, through parity too.
    engine.read_at(&vd, starts[2], CHUNK_BYTES).unwrap();
}

#[test]
fn a_clean_stop_leaves_nothing_to_resync() {
    let engine = engine();
    let drives = mem_drives(3, DRIVE_BYTES);
    let first = open(&engine, &drives, None);
    first.create_vd(spec(Level::Raid5, &[0, 1, 2], "db")).unwrap();
    let (_, vd) = first.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(4 * CHUNK_BYTES, 9)).unwrap();
    let region_count = vd.write_intent().unwrap().regions.region_count;
    let id = first.config().controller_id;
    drop(vd);
    first.shutdown();
    drop(first);
    for drive in &drives {
        let area = ondisk::read_area(&**drive, region_count).unwrap();
        assert!(area.header.unwrap().clean, "{}", drive.info().name);
        assert!(
            area.slots.iter().all(|slot| slot.dirty.is_empty() && slot.unlogged.is_empty()),
            "a clean stop of a whole VD clears every bit"
        );
    }
    let second = open(&engine, &drives, Some(id));
    let events: Vec<String> = second.events().into_iter().map(|e| e.description).collect();
    assert!(!events.iter().any(|e| e.contains("not stopped cleanly") || e.contains("resync of v0")), "{events:#?}");
    assert_eq!(second.resync_status(0), None);
}

fn run(drive: &dyn Drive, op: DriveOp) {
    let mut ctx = drive::IoCtx::without_ring();
    drive.submit(&mut ctx, 0, op);
    let mut out = Vec::new();
    while out.is_empty() {
        ctx.poll(&mut out, true);
    }
    out[0].result.clone().unwrap();
}
