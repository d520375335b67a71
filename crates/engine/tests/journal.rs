//! The cache's journal through the controller: write-back data that only the journal held is
//! replayed after a crash, and so are the cached partial rows of WB writes whose whole rows went
//! to the members; a journal that fails or whose file is removed is detached (WB runs
//! WT, nothing acknowledged is lost) and never replayed afterwards; a journal assigned again
//! brings WB back; a deleted VD's records never reach the VD that takes its id; a mirrored pair
//! goes on with one leg, whose stale partner is never replayed, and is replaced at run time.

mod common;

use common::{check, engine, mem_drives, pattern, scatter, spec, wait_until};
use drive::{Drive, FaultyDrive, FileDrive, FileDriveConfig, MemDrive};
use engine::config::{ControllerId, WritePolicy};
use engine::controller::{Controller, ControllerOptions, JournalOffer, JournalState, OfferedDrive, VdChanges};
use engine::{Engine, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;
use std::time::Duration;

const DRIVE_BYTES: u64 = 64 * MIB;
const JOURNAL_BYTES: u64 = 32 * MIB;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>, journal: Vec<JournalOffer>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, journal, ..ControllerOptions::default() }).unwrap()
}

fn mem_journal(drive: &Arc<dyn Drive>) -> Vec<JournalOffer> {
    vec![leg(drive, "mem-journal")]
}

fn leg(drive: &Arc<dyn Drive>, source: &str) -> JournalOffer {
    JournalOffer { drive: Arc::clone(drive), source: source.into(), path: None, slot: None }
}

/// The two legs of a mirrored journal, the second one able to fail.
fn failing_pair() -> (Arc<FaultyDrive>, [Arc<dyn Drive>; 2]) {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(JOURNAL_BYTES))));
    (Arc::clone(&failing), [Arc::new(MemDrive::new(JOURNAL_BYTES)), failing as Arc<dyn Drive>])
}

fn wb_raid5(controller: &Controller) -> Arc<VirtualDrive> {
    let mut vd_spec = spec(Level::Raid5, &[0, 1, 2, 3], "db");
    vd_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(vd_spec).unwrap();
    controller.vd(0).unwrap().1
}

fn events(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

#[test]
fn write_back_data_held_only_by_the_journal_is_replayed_after_a_crash() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, mem_journal(&journal));
        assert_eq!(controller.journal_view().state, JournalState::Optimal);
        let vd = wb_raid5(&controller);
        scatter(&engine, &vd, &mut image, 1, 300);
        check(&engine, &vd, &image, "from the cache");
        assert!(controller.journal_view().used_bytes > 0, "the records are in the journal");
        controller.config().controller_id
        // Dropped without a shutdown, within the age limit: the members never saw most of it.
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), mem_journal(&journal));
    let view = controller.journal_view();
    assert!(view.replay.records >= 300, "every write was replayed: {view:?}");
    assert!(events(&controller).iter().any(|e| e.contains("replayed")), "{:#?}", events(&controller));
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after replay");
    controller.shutdown();
}

/// The whole rows of a WB write go to the journal once, as the row images of their row
/// writes, and on to the members; its partial first and last rows are cached, where the
/// stream's next and previous writes make whole rows of them. A crash with those still cached
/// loses nothing.
#[test]
fn whole_rows_of_write_back_writes_skip_the_cache_and_survive_a_crash() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, mem_journal(&journal));
        let vd = wb_raid5(&controller);
        let row_bytes = vd.geometry().row_data_bytes();
        // Two and a half rows each, starting a third of a row in: no write is row-aligned.
        let len_bytes = row_bytes * 5 / 2;
        let (mut offset, mut whole_rows_bytes, mut written_bytes) = (row_bytes / 3 / 512 * 512, 0, 0);
        for seed in 0.. {
            if offset + len_bytes > image.len() as u64 {
                break;
            }
            let data = pattern(len_bytes as usize, seed);
            engine.write_at(&vd, offset, &data).unwrap();
            image[offset as usize..(offset + len_bytes) as usize].copy_from_slice(&data);
            whole_rows_bytes += ((offset + len_bytes) / row_bytes).saturating_sub(offset.div_ceil(row_bytes)) * row_bytes;
            written_bytes += len_bytes;
            offset += len_bytes;
        }
        let stats = engine.cache_stats();
        assert_eq!(stats.imaged.write_back_bytes, whole_rows_bytes, "every whole row went the imaged path");
        assert!(stats.dirty_bytes > 0 && stats.dirty_bytes <= written_bytes - whole_rows_bytes, "only partial rows were cached: {stats:?}");
        check(&engine, &vd, &image, "before the crash");
        controller.config().controller_id
        // Dropped without a shutdown: the partial rows are in the cache and the journal only.
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), mem_journal(&journal));
    assert!(controller.journal_view().replay.records > 0);
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after replay");
    controller.shutdown();
}

#[test]
fn a_failed_journal_turns_write_back_into_write_through_and_loses_nothing() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let faulty = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(JOURNAL_BYTES))));
    let journal: Arc<dyn Drive> = Arc::clone(&faulty) as Arc<dyn Drive>;
    let engine = engine();
    let controller = open(&engine, &drives, None, mem_journal(&journal));
    let vd = wb_raid5(&controller);
    let mut image = vec![0u8; 16 * MIB as usize];
    scatter(&engine, &vd, &mut image, 1, 100);
    faulty.set_failed(true);
    // The next writes find the journal failed: they wait for the detach, then go through.
    scatter(&engine, &vd, &mut image, 2, 100);
    wait_until("the journal detached", &controller, || controller.config().settings.journal_id == 0);
    assert_eq!(controller.journal_view().state, JournalState::Failed);
    assert!(!controller.journal_usable());
    assert_eq!(controller.config().settings.journal_id, 0, "the metadata no longer trusts it");
    assert!(events(&controller).iter().any(|e| e.contains("WB VDs run WT")), "{:#?}", events(&controller));
    engine.flush(&vd).unwrap();
    check(&engine, &vd, &image, "after the journal failed");
    let id = controller.config().controller_id;
    drop(controller);
    drop(engine);

    // It comes back readable, holding records older than writes the members took without it:
    // it is not replayed over them.
    faulty.set_failed(false);
    let engine = self::engine();
    let controller = open(&engine, &drives, Some(id), mem_journal(&journal));
    let view = controller.journal_view();
    assert!(view.replay.untrusted && view.replay.records == 0, "{view:?}");
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after a restart with the old journal");
    controller.shutdown();
}

#[test]
fn a_removed_journal_file_is_detached_and_a_new_one_brings_write_back_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.img");
    let file = |path: &std::path::Path| {
        let config = FileDriveConfig { create_size_bytes: Some(JOURNAL_BYTES), ..FileDriveConfig::default() };
        let drive: Arc<dyn Drive> = Arc::new(FileDrive::open(path, &config).unwrap());
        vec![JournalOffer { drive, source: path.display().to_string(), path: Some(path.to_path_buf()), slot: None }]
    };
    let drives = mem_drives(4, DRIVE_BYTES);
    let engine = engine();
    let controller = open(&engine, &drives, None, file(&path));
    let vd = wb_raid5(&controller);
    let mut image = vec![0u8; 16 * MIB as usize];
    scatter(&engine, &vd, &mut image, 3, 100);
    std::fs::remove_file(&path).unwrap();
    wait_until("the removal noticed", &controller, || controller.journal_view().state == JournalState::Failed);
    wait_until("the journal detached", &controller, || controller.config().settings.journal_id == 0);
    // The event is logged once the detach returns, just after the metadata stops naming it.
    wait_until("the removal's event", &controller, || events(&controller).iter().any(|e| e.contains("was removed")));
    scatter(&engine, &vd, &mut image, 4, 100);
    check(&engine, &vd, &image, "after the removal");

    let other = dir.path().join("journal2.img");
    let view = controller.attach_journal(file(&other)).unwrap();
    assert_eq!(view.state, JournalState::Optimal);
    assert!(controller.journal_usable());
    assert_ne!(controller.config().settings.journal_id, 0);
    scatter(&engine, &vd, &mut image, 5, 100);
    assert!(controller.journal_view().used_bytes > 0, "WB logs to the new journal");
    let error = controller.attach_journal(file(&dir.path().join("third.img"))).unwrap_err();
    assert!(error.to_string().contains("full service already"), "{error}");
    check(&engine, &vd, &image, "with the new journal");
    controller.shutdown();
}

#[test]
fn a_deleted_vds_records_never_reach_the_vd_that_takes_its_id() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, mem_journal(&journal));
        let vd = wb_raid5(&controller);
        engine.write_at(&vd, 0, &pattern(1 << 20, 7)).unwrap();
        controller.delete_vd(0, true, false).unwrap();
        assert_eq!(controller.journal_view().used_bytes, 0, "deleting emptied the journal");
        let fresh = wb_raid5(&controller);
        controller.set_vd(0, VdChanges { write_policy: Some(WritePolicy::WriteThrough), ..VdChanges::default() }).unwrap();
        engine.write_at(&fresh, 4 << 20, &pattern(4096, 9)).unwrap();
        controller.config().controller_id
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), mem_journal(&journal));
    let (_, vd) = controller.vd(0).unwrap();
    let head = engine.read_at(&vd, 0, 1 << 20).unwrap();
    assert!(head.as_slice() != pattern(1 << 20, 7).as_slice(), "the deleted VD's write was replayed into the new one");
    assert_eq!(engine.read_at(&vd, 4 << 20, 4096).unwrap().as_slice(), pattern(4096, 9).as_slice());
    controller.shutdown();
}

#[test]
fn a_clean_stop_writes_the_cache_out_and_leaves_nothing_to_replay() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, mem_journal(&journal));
        let vd = wb_raid5(&controller);
        scatter(&engine, &vd, &mut image, 6, 200);
        controller.shutdown();
        assert_eq!(controller.journal_view().used_bytes, 0, "the journal was checkpointed empty");
        controller.config().controller_id
    };
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), mem_journal(&journal));
    assert_eq!(controller.journal_view().replay.records, 0);
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after a clean stop");
    controller.shutdown();
}

/// A mirrored pair: one leg fails under write-back, the other goes on (Degraded, still WB) once
/// the metadata names the failed one stale. After a crash the failed leg comes back holding
/// what it held: it is not replayed, the survivor is, and nothing acknowledged is lost. A
/// restart with the stale leg alone finds nothing it may replay and says so.
#[test]
fn a_mirrored_journal_goes_on_with_one_leg_and_never_replays_the_stale_one() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let (failing, legs) = failing_pair();
    let pair = || vec![leg(&legs[0], "leg-a"), leg(&legs[1], "leg-b")];
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, pair());
        assert_eq!(controller.journal_view().state, JournalState::Optimal);
        assert_eq!(controller.journal_view().legs.len(), 2);
        let vd = wb_raid5(&controller);
        scatter(&engine, &vd, &mut image, 1, 100);
        failing.set_failed(true);
        // Acknowledged only once the metadata names leg b stale (the watcher does it).
        scatter(&engine, &vd, &mut image, 2, 200);
        let view = controller.journal_view();
        assert_eq!(view.state, JournalState::Degraded, "{view:?}");
        assert!(controller.journal_usable(), "a degraded pair keeps write-back");
        assert_eq!(controller.config().settings.journal_stale_legs, 0b10);
        assert!(view.legs[0].in_service && !view.legs[1].in_service, "{view:?}");
        assert!(events(&controller).iter().any(|e| e.contains("degraded")), "{:#?}", events(&controller));
        assert!(controller.journal_view().used_bytes > 0, "records wait in the surviving leg");
        check(&engine, &vd, &image, "from the cache");
        controller.config().controller_id
        // Dropped without a shutdown: most of it is only in leg a.
    };
    // The failed leg is back with what it held: the stale mark keeps it out of the replay.
    failing.set_failed(false);
    {
        let engine = engine();
        let controller = open(&engine, &drives, Some(id), pair());
        let view = controller.journal_view();
        assert!(view.replay.found && view.replay.records >= 300, "the survivor replayed everything: {view:?}");
        assert_eq!(view.state, JournalState::Optimal, "both legs laid out anew: {view:?}");
        assert_eq!(controller.config().settings.journal_stale_legs, 0);
        let (_, vd) = controller.vd(0).unwrap();
        check(&engine, &vd, &image, "after replay from the surviving leg");
        scatter(&engine, &vd, &mut image, 3, 50);
        // Dropped again without a shutdown: both legs hold these.
    }
    // Either leg alone holds every acknowledged write.
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), vec![leg(&legs[1], "leg-b")]);
    assert!(controller.journal_view().replay.records >= 50, "{:?}", controller.journal_view());
    let (_, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, &image, "after replay from leg b alone");
    controller.shutdown();
}

/// The stale leg alone: nothing is replayed from it, the event says that writes are lost, and
/// the metadata stops trusting the journal.
#[test]
fn a_stale_leg_alone_is_never_replayed() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let (failing, legs) = failing_pair();
    let mut image = vec![0u8; 16 * MIB as usize];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, vec![leg(&legs[0], "leg-a"), leg(&legs[1], "leg-b")]);
        let vd = wb_raid5(&controller);
        scatter(&engine, &vd, &mut image, 1, 50);
        failing.set_failed(true);
        scatter(&engine, &vd, &mut image, 2, 50);
        assert_eq!(controller.config().settings.journal_stale_legs, 0b10);
        controller.config().controller_id
    };
    failing.set_failed(false);
    let engine = engine();
    let controller = open(&engine, &drives, Some(id), vec![leg(&legs[1], "leg-b")]);
    let view = controller.journal_view();
    assert!(!view.replay.found && view.replay.untrusted && view.replay.records == 0, "{view:?}");
    assert!(events(&controller).iter().any(|e| e.contains("are lost")), "{:#?}", events(&controller));
    assert_ne!(controller.config().settings.journal_id, 0, "the new layout is trusted");
    controller.shutdown();
}

/// A degraded pair is replaced at run time: the cache is written out, the old journal
/// detached, the new pair laid out and trusted; a healthy journal is not replaced.
#[test]
fn a_degraded_pair_is_replaced_at_run_time() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let (failing, legs) = failing_pair();
    let engine = engine();
    let controller = open(&engine, &drives, None, vec![leg(&legs[0], "leg-a"), leg(&legs[1], "leg-b")]);
    let vd = wb_raid5(&controller);
    let mut image = vec![0u8; 16 * MIB as usize];
    scatter(&engine, &vd, &mut image, 1, 50);
    let healthy = controller.attach_journal(vec![leg(&legs[0], "leg-a")]).unwrap_err();
    assert!(healthy.to_string().contains("full service already"), "{healthy}");
    failing.set_failed(true);
    scatter(&engine, &vd, &mut image, 2, 50);
    assert_eq!(controller.journal_view().state, JournalState::Degraded);
    let fresh: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let view = controller.attach_journal(vec![leg(&legs[0], "leg-a"), leg(&fresh, "leg-c")]).unwrap();
    assert_eq!(view.state, JournalState::Optimal, "{view:?}");
    assert_eq!(controller.config().settings.journal_stale_legs, 0);
    scatter(&engine, &vd, &mut image, 3, 50);
    check(&engine, &vd, &image, "with the new pair");
    controller.shutdown();
}

/// Pinned cache: a WB VD goes offline with writes only the cache and the journal hold. Its data
/// is preserved (pinned), it neither crowds the other VDs out of the cache nor stops the
/// journal's ring (its records are logged again at the head as the tail reaches them), and
/// `delete preservedcache` drops it; an online VD's cache cannot be discarded.
#[test]
fn an_offline_vds_pinned_cache_stops_neither_the_cache_nor_the_journal() {
    let failing: Vec<Arc<FaultyDrive>> = (0..2).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))))).collect();
    let mut drives: Vec<Arc<dyn Drive>> = failing.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    drives.extend(mem_drives(3, DRIVE_BYTES));
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(8 * MIB));
    let config = engine::EngineConfig { shard_count: 1, cache_bytes: 16 * MIB, ..engine::EngineConfig::default() };
    let engine = Arc::new(Engine::start(config).unwrap());
    let controller = open(&engine, &drives, None, mem_journal(&journal));
    let mut pinned_spec = spec(Level::Raid0, &[0, 1], "pinned");
    pinned_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(pinned_spec).unwrap();
    let mut other_spec = spec(Level::Raid5, &[2, 3, 4], "other");
    other_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(other_spec).unwrap();
    let (pinned, other) = (controller.vd(0).unwrap().1, controller.vd(1).unwrap().1);
    engine.write_at(&pinned, 0, &pattern(2 * MIB as usize, 1)).unwrap();
    failing.iter().for_each(|d| d.set_failed(true));
    // The destage after the age limit fails: the VD goes offline with its data in the cache.
    wait_until("the VD offline", &controller, || pinned.state() == engine::VdState::Offline);
    wait_until("its data pinned", &controller, || engine.cache_stats().pinned_bytes > 0);
    // Eight times the journal and four times the cache, through the other VD (on a thread:
    // a stalled ring would block it for good).
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (engine2, other2) = (Arc::clone(&engine), Arc::clone(&other));
    std::thread::spawn(move || {
        let mut image = vec![0u8; 16 * MIB as usize];
        for round in 0..4u8 {
            for piece in 0..(16 * MIB / (256 * 1024)) {
                let offset = piece * 256 * 1024;
                let data = pattern(256 * 1024, round.wrapping_mul(31).wrapping_add(piece as u8));
                engine2.write_at(&other2, offset, &data).unwrap();
                image[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
            }
        }
        let _ = done_tx.send(image);
    });
    let image = done_rx.recv_timeout(Duration::from_secs(60)).expect("writes to the other VD stalled behind the pinned data");
    check(&engine, &other, &image, "the other VD");
    assert!(engine.cache_stats().pinned_bytes > 0, "the offline VD's data is still preserved");
    let refused = controller.discard_preserved_cache(1).unwrap_err();
    assert!(refused.to_string().contains("not offline"), "{refused}");
    controller.discard_preserved_cache(0).unwrap();
    wait_until("the pinned data gone", &controller, || engine.cache_stats().pinned_bytes == 0);
    assert!(events(&controller).iter().any(|e| e.contains("preserved cache was discarded")), "{:#?}", events(&controller));
    controller.shutdown();
}
