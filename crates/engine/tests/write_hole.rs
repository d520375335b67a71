//! The RAID5/6 write hole through the controller: a crash while a member is out leaves the
//! regions written just before it dirty in the bitmap. Without a journal their rows may be torn
//! and nothing can say which, so reads that need parity there are refused until a resync (which
//! needs the member back). With a journal every parity row write is logged as a row image first:
//! replay makes torn rows whole, the bitmap leaves those regions out of the resync, and every
//! byte reads back. If the journal holding the images is lost at the restart, the regions are
//! refused again rather than trusted.
//!
//! (Torn rows themselves, with member writes lost at a power cut, are the simulator's: its
//! drives have volatile caches. Here the members are memory drives and the point is what the
//! bitmap and the replay decide.)

mod common;

use common::{engine, mem_drives, pattern, spec};
use drive::{Drive, FaultyDrive, MemDrive};
use engine::config::ControllerId;
use engine::controller::{Controller, ControllerOptions, JournalOffer, OfferedDrive};
use engine::{Engine, VdError, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 64 * MIB;
const SPAN_BYTES: usize = 24 * MIB as usize;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>, journal: Option<&Arc<dyn Drive>>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    let journal = journal.map(|drive| JournalOffer { drive: Arc::clone(drive), source: "mem-journal".into(), path: None, slot: None });
    let options = ControllerOptions { ours, journal: journal.into_iter().collect(), ..ControllerOptions::default() };
    Controller::open(Arc::clone(engine), offered, options).unwrap()
}

/// A RAID5 of four drives (WT), whose member 3 fails; then writes all over it, degraded, and a
/// crash. Returns the controller id and what the VD holds.
fn degraded_writes_then_crash(
    drives: &[Arc<dyn Drive>],
    failing: &FaultyDrive,
    journal: Option<&Arc<dyn Drive>>,
) -> (ControllerId, Vec<u8>) {
    let engine = engine();
    let controller = open(&engine, drives, None, journal);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3], "r5")).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    let mut image = pattern(SPAN_BYTES, 1);
    engine.write_at(&vd, 0, &image).unwrap();
    failing.set_failed(true);
    let deadline = Instant::now() + Duration::from_secs(30);
    while vd.state() != engine::VdState::Degraded {
        let _ = engine.write_at(&vd, 0, &image[..4096]);
        assert!(Instant::now() < deadline, "member 3 never left service");
        std::thread::sleep(Duration::from_millis(5));
    }
    scatter(&engine, &vd, &mut image);
    let id = controller.config().controller_id;
    // A crash: no shutdown, so the bitmap says the VD did not stop cleanly.
    (id, image)
}

/// 4 KiB writes spread over every region of the span.
fn scatter(engine: &Engine, vd: &Arc<VirtualDrive>, image: &mut [u8]) {
    for index in 0..400u64 {
        let offset = (index * 7919 * 4096) % (image.len() as u64 - 4096);
        let data = pattern(4096, index as u8 ^ 0x5a);
        engine.write_at(vd, offset, &data).unwrap();
        image[offset as usize..offset as usize + 4096].copy_from_slice(&data);
    }
}

/// Reads the span in 64 KiB pieces: how many were refused, and whether every other one holds
/// what was written.
fn read_back(engine: &Engine, vd: &Arc<VirtualDrive>, image: &[u8]) -> usize {
    let mut refused = 0;
    for at in (0..image.len()).step_by(64 << 10) {
        match engine.read_at(vd, at as u64, 64 << 10) {
            Ok(read) => assert!(read.as_slice() == &image[at..at + (64 << 10)], "wrong data at {at}: never acceptable"),
            Err(VdError::RowNotResynced { .. }) => refused += 1,
            Err(error) => panic!("read at {at}: {error}"),
        }
    }
    refused
}

fn rig() -> (Vec<Arc<dyn Drive>>, Arc<FaultyDrive>) {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))));
    let mut drives = mem_drives(3, DRIVE_BYTES);
    drives.push(Arc::clone(&failing) as Arc<dyn Drive>);
    (drives, failing)
}

#[test]
fn without_a_journal_a_crash_while_degraded_refuses_what_parity_cannot_vouch_for() {
    let (drives, failing) = rig();
    let (id, image) = degraded_writes_then_crash(&drives, &failing, None);
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), None);
    let (_, vd) = controller.vd(0).unwrap();
    let refused = read_back(&engine, &vd, &image);
    assert!(refused > 0, "the torn-or-not rows of dirty regions are refused, not guessed");
    controller.shutdown();
}

#[test]
fn with_a_journal_a_crash_while_degraded_leaves_every_byte_readable() {
    let (drives, failing) = rig();
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(32 * MIB));
    let (id, image) = degraded_writes_then_crash(&drives, &failing, Some(&journal));
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), Some(&journal));
    let (_, vd) = controller.vd(0).unwrap();
    assert_eq!(vd.write_intent().map(|i| i.unsynced_count()), Some(0), "the images vouch for every region written");
    assert_eq!(read_back(&engine, &vd, &image), 0, "nothing refused");
    controller.shutdown();
}

#[test]
fn a_journal_lost_at_the_restart_takes_its_images_with_it_and_the_regions_are_refused() {
    let (drives, failing) = rig();
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(32 * MIB));
    let (id, image) = degraded_writes_then_crash(&drives, &failing, Some(&journal));
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), None);
    let (_, vd) = controller.vd(0).unwrap();
    assert!(vd.write_intent().is_some_and(|i| i.unsynced_count() > 0), "the logged regions need a resync now");
    assert!(read_back(&engine, &vd, &image) > 0, "refused, not trusted");
    let events: Vec<String> = controller.events().into_iter().map(|e| e.description).collect();
    assert!(events.iter().any(|e| e.contains("row images need a resync")), "{events:#?}");
    controller.shutdown();
}
