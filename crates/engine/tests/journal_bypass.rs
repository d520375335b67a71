//! Writes of sequential streams go around the journal (`cache::bypass`): a write-back RAID5
//! with the bypass turned on takes a stream of 1 MiB writes straight to its members once the
//! stream passed the cutoff, while the small random writes before it stay in the journal; after
//! a crash the replay of those records undoes none of the stream's writes. A degraded VD, or a
//! cutoff of 0, keeps every write in the journal. By default it is on for levels without parity
//! only; `seqcutoff=` (`VdChanges::seq_cutoff`) sets it per VD, and the VD's record keeps it
//! across a restart.
//!
//! (The crash semantics proper, with drives that drop or tear unflushed writes and images and
//! records that could be replayed over a write gone around, are the simulator's: its runs with
//! `journal_bypass`.)

mod common;

use common::{check, engine, mem_drives, pattern, scatter, spec};
use drive::{Drive, FaultyDrive, FileDrive, FileDriveConfig, IoBuf, MemDrive};
use engine::config::{ControllerId, SeqCutoff, VdRecord, WritePolicy};
use engine::controller::{Controller, ControllerOptions, DriveCommand, JournalOffer, OfferedDrive, VdChanges};
use engine::{Engine, VdCompletion, VdRequest, VirtualDrive};
use layout::{Level, MIB};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 64 * MIB;
const JOURNAL_BYTES: u64 = 64 * MIB;
const SPAN_BYTES: usize = 32 * MIB as usize;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], ours: Option<ControllerId>, journal: &Arc<dyn Drive>) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    let journal = vec![JournalOffer { drive: Arc::clone(journal), source: "mem-journal".into(), path: None, slot: None }];
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, journal, ..ControllerOptions::default() }).unwrap()
}

fn wb_raid5(controller: &Controller) -> Arc<VirtualDrive> {
    let mut vd_spec = spec(Level::Raid5, &[0, 1, 2, 3, 4], "stream");
    vd_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(vd_spec).unwrap();
    controller.vd(0).unwrap().1
}

/// 1 MiB writes one after the other over `range` of the VD, recorded in `image`.
fn stream(engine: &Engine, vd: &Arc<VirtualDrive>, image: &mut [u8], range: std::ops::Range<usize>, seed: u8) {
    stream_of(engine, vd, image, range, MIB as usize, seed);
}

/// Writes of `write_bytes` one after the other from `range.start`, as many as fit in `range`,
/// recorded in `image`; returns how many.
fn stream_of(
    engine: &Engine,
    vd: &Arc<VirtualDrive>,
    image: &mut [u8],
    range: std::ops::Range<usize>,
    write_bytes: usize,
    seed: u8,
) -> usize {
    stream_at_depth(engine, vd, image, range, write_bytes, seed, 1)
}

/// [`stream_of`] by a closed-loop writer that keeps `queue_depth` writes in flight.
fn stream_at_depth(
    engine: &Engine,
    vd: &Arc<VirtualDrive>,
    image: &mut [u8],
    range: std::ops::Range<usize>,
    write_bytes: usize,
    seed: u8,
    queue_depth: usize,
) -> usize {
    let offsets: Vec<usize> = (range.start..range.end).step_by(write_bytes).filter(|o| o + write_bytes <= range.end).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut in_flight = 0;
    for (index, &offset) in offsets.iter().enumerate() {
        if in_flight == queue_depth {
            assert_eq!(rx.recv().unwrap(), Ok(()));
            in_flight -= 1;
        }
        let data = pattern(write_bytes, seed.wrapping_add(index as u8));
        image[offset..offset + write_bytes].copy_from_slice(&data);
        let (tx, buf) = (tx.clone(), IoBuf::from_slice(&data));
        let request = VdRequest::Write { offset_bytes: offset as u64, buf };
        engine.submit(vd, request, Box::new(move |done: VdCompletion| tx.send(done.result).unwrap()));
        in_flight += 1;
    }
    (0..in_flight).for_each(|_| assert_eq!(rx.recv().unwrap(), Ok(())));
    offsets.len()
}

#[test]
fn a_stream_goes_around_the_journal_and_a_crash_replays_nothing_over_it() {
    let drives = mem_drives(5, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; SPAN_BYTES];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, &journal);
        let vd = wb_raid5(&controller);
        set_seq_cutoff(&controller, SeqCutoff::Mib(4));
        assert_eq!(vd.journal_bypass().cutoff_bytes(), 4 * MIB, "set live");
        // Journaled: small random writes over the first half, then a stream over all of it.
        scatter(&engine, &vd, &mut image[..SPAN_BYTES / 2], 1, 200);
        let journal_before = controller.journal_view().used_bytes;
        stream(&engine, &vd, &mut image, 0..SPAN_BYTES, 7);
        let (writes, bytes) = vd.journal_bypass().bypassed();
        println!("{writes} write pieces ({bytes} bytes) of the 32 MiB stream went around the journal");
        // The second half has no records a replay could lay over it: past the 4 MiB cutoff,
        // at least that much goes around.
        assert!(bytes >= 12 * MIB, "only {bytes} bytes went around the journal");
        assert!(controller.journal_view().used_bytes < journal_before + 20 * MIB, "the stream filled the journal anyway");
        check(&engine, &vd, &image, "after the stream");
        controller.config().controller_id
        // Dropped without a shutdown: the random writes' records are replayed at the restart.
    };
    let (controller, record, vd) = reopen_after_crash(&drives, id, &journal, &image);
    assert_eq!(record.seq_cutoff, SeqCutoff::Mib(4), "kept in the VD's record");
    assert_eq!(vd.journal_bypass().cutoff_bytes(), 4 * MIB, "applied at assembly");
    controller.shutdown();
}

/// The controller `id` opened again after a crash (its engine dropped without a shutdown), its
/// journal replayed, and VD 0 checked against `image`.
fn reopen_after_crash(
    drives: &[Arc<dyn Drive>],
    id: ControllerId,
    journal: &Arc<dyn Drive>,
    image: &[u8],
) -> (Arc<Controller>, VdRecord, Arc<VirtualDrive>) {
    let engine = engine();
    let controller = open(&engine, drives, Some(id), journal);
    let (record, vd) = controller.vd(0).unwrap();
    check(&engine, &vd, image, "after the crash and the replay");
    (controller, record, vd)
}

/// A clean stop and a new controller over the same drives and journal.
fn restart(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], controller: Arc<Controller>, journal: &Arc<dyn Drive>) -> Arc<Controller> {
    let id = controller.config().controller_id;
    controller.shutdown();
    drop(controller);
    open(engine, drives, Some(id), journal)
}

fn set_seq_cutoff(controller: &Controller, cutoff: SeqCutoff) {
    controller.set_vd(0, VdChanges { seq_cutoff: Some(cutoff), ..VdChanges::default() }).unwrap();
}

#[test]
fn a_degraded_vd_and_a_cutoff_of_zero_keep_every_write_in_the_journal() {
    let drives = mem_drives(5, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let engine = engine();
    let controller = open(&engine, &drives, None, &journal);
    let vd = wb_raid5(&controller);
    let mut image = vec![0u8; SPAN_BYTES];
    assert_eq!(vd.journal_bypass().cutoff_bytes(), 0, "off by default on a parity level");
    stream(&engine, &vd, &mut image, 0..SPAN_BYTES / 2, 3);
    assert_eq!(vd.journal_bypass().bypassed(), (0, 0), "cutoff 0: nothing goes around");
    vd.journal_bypass().set_cutoff_bytes(engine::vd::journal_bypass::DEFAULT_CUTOFF_BYTES);
    controller.set_drive(4, DriveCommand::Offline).unwrap();
    stream(&engine, &vd, &mut image, SPAN_BYTES / 2..SPAN_BYTES, 5);
    assert_eq!(vd.journal_bypass().bypassed(), (0, 0), "degraded: nothing goes around");
    check(&engine, &vd, &image, "degraded");
    controller.shutdown();
}

#[test]
fn a_vd_created_with_a_cutoff_has_it_from_its_first_write_and_keeps_it() {
    let drives = mem_drives(5, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let engine = engine();
    let controller = open(&engine, &drives, None, &journal);
    let mut vd_spec = spec(Level::Raid6, &[0, 1, 2, 3, 4], "stream");
    vd_spec.write_policy = WritePolicy::WriteBack;
    vd_spec.seq_cutoff = SeqCutoff::Mib(2);
    controller.create_vd(vd_spec).unwrap();
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.seq_cutoff, vd.journal_bypass().cutoff_bytes()), (SeqCutoff::Mib(2), 2 * MIB));
    let mut image = vec![0u8; SPAN_BYTES];
    stream(&engine, &vd, &mut image, 0..SPAN_BYTES, 13);
    assert!(vd.journal_bypass().bypassed().1 >= 16 * MIB, "a RAID6 created with seqcutoff=2MiB sends its stream around");
    check(&engine, &vd, &image, "RAID6 after the stream");
    let controller = restart(&engine, &drives, controller, &journal);
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.seq_cutoff, vd.journal_bypass().cutoff_bytes()), (SeqCutoff::Mib(2), 2 * MIB), "kept");
    check(&engine, &vd, &image, "RAID6 after a restart");
    controller.shutdown();
}

#[test]
fn levels_without_parity_go_around_by_default() {
    let drives = mem_drives(4, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let engine = engine();
    let controller = open(&engine, &drives, None, &journal);
    let mut vd_spec = spec(Level::Raid10, &[0, 1, 2, 3], "mirror");
    vd_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(vd_spec).unwrap();
    let (_, vd) = controller.vd(0).unwrap();
    assert_eq!(vd.journal_bypass().cutoff_bytes(), engine::vd::journal_bypass::DEFAULT_CUTOFF_BYTES);
    let mut image = vec![0u8; SPAN_BYTES];
    stream(&engine, &vd, &mut image, 0..SPAN_BYTES, 9);
    let (_, bytes) = vd.journal_bypass().bypassed();
    assert!(bytes >= 24 * MIB, "a 32 MiB stream past its first 4 MiB goes around: {bytes} bytes did");
    check(&engine, &vd, &image, "RAID10 after the stream");
    // `seqcutoff=off` keeps a mirror's streams in the journal, across a restart too.
    set_seq_cutoff(&controller, SeqCutoff::Never);
    let controller = restart(&engine, &drives, controller, &journal);
    let (record, vd) = controller.vd(0).unwrap();
    assert_eq!((record.seq_cutoff, vd.journal_bypass().cutoff_bytes()), (SeqCutoff::Never, 0));
    stream(&engine, &vd, &mut image, 0..SPAN_BYTES, 11);
    assert_eq!(vd.journal_bypass().bypassed(), (0, 0), "off: nothing goes around");
    check(&engine, &vd, &image, "RAID10 with the cutoff off");
    set_seq_cutoff(&controller, SeqCutoff::LevelDefault);
    assert_eq!(vd.journal_bypass().cutoff_bytes(), engine::vd::journal_bypass::DEFAULT_CUTOFF_BYTES, "back to the level's");
    controller.shutdown();
}

/// A stream whose writes end inside rows (1 MiB + 80 KiB on 256 KiB rows): each write's last
/// part of a row is cached, and the next write completes the row around the journal with it
/// (`cache::bypass::complete_row`); where small cached writes lie in the next write's part of a
/// row, it is cached instead. Everything reads back, before and after a crash's replay. (That
/// no live record may name a completing write's bytes is the simulator's to check: here the
/// small writes' data stays cached, so their records never outlive it.)
#[test]
fn a_stream_completes_the_rows_its_previous_writes_left_in_the_cache() {
    const WRITE_BYTES: usize = (MIB + (80 << 10)) as usize;
    let drives = mem_drives(5, DRIVE_BYTES);
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; SPAN_BYTES];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, &journal);
        let vd = wb_raid5(&controller);
        set_seq_cutoff(&controller, SeqCutoff::Mib(1));
        // Cached first: small writes over rows the stream writes later.
        scatter(&engine, &vd, &mut image[..SPAN_BYTES / 2], 2, 64);
        let writes = stream_of(&engine, &vd, &mut image, 0..SPAN_BYTES, WRITE_BYTES, 40);
        let completed = vd.journal_bypass().completed_rows();
        println!("{writes} stream writes completed {completed} rows the cache held");
        // Most writes end inside a row the next completes (16 of 29 when measured), unless a
        // small write lies in the next write's part of that row.
        assert!(completed >= writes as u64 / 3, "only {completed} of {writes} writes completed a cached row");
        check(&engine, &vd, &image, "after the stream");
        controller.config().controller_id
        // Dropped without a shutdown: the records still live are replayed at the restart.
    };
    reopen_after_crash(&drives, id, &journal, &image).0.shutdown();
}

/// Five file drives, each operation a millisecond late (as disks are), so that a stream's next
/// requests are on their way while a row waits (write gathering stays off on memory drives).
fn slow_file_drives(dir: &std::path::Path) -> Vec<Arc<dyn Drive>> {
    let config = FileDriveConfig { create_size_bytes: Some(DRIVE_BYTES), ..FileDriveConfig::default() };
    (0..5)
        .map(|i| {
            let drive = FaultyDrive::new(Arc::new(FileDrive::open(&dir.join(format!("d{i}")), &config).unwrap()));
            drive.update_faults(|faults| faults.latency = Some(std::time::Duration::from_millis(1)));
            Arc::new(drive) as Arc<dyn Drive>
        })
        .collect()
}

/// A stream at queue depth 8 whose writes end inside rows: the row each write shares with the
/// next goes around the journal too, gathered whole on the members (`io::gather`), instead of
/// its first part going to the journal and the cache. Everything reads back, before and after a
/// crash's replay.
#[test]
fn a_stream_at_queue_depth_8_gathers_the_rows_its_writes_share_around_the_journal() {
    const WRITE_BYTES: usize = (MIB + (80 << 10)) as usize;
    let dir = tempfile::tempdir().unwrap();
    let drives = slow_file_drives(dir.path());
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let mut image = vec![0u8; SPAN_BYTES];
    let id = {
        let engine = engine();
        let controller = open(&engine, &drives, None, &journal);
        let vd = wb_raid5(&controller);
        set_seq_cutoff(&controller, SeqCutoff::Mib(1));
        let writes = stream_at_depth(&engine, &vd, &mut image, 0..SPAN_BYTES, WRITE_BYTES, 0, 8);
        let gathered = vd.gathered();
        let (_, around_bytes) = vd.journal_bypass().bypassed();
        println!(
            "{writes} stream writes: {gathered:?}, {around_bytes} bytes around the journal, {} rows completed from the cache",
            vd.journal_bypass().completed_rows()
        );
        // How many join depends on when the next request reaches the shard: some must.
        assert!(gathered.rows >= 1 && gathered.joins >= gathered.rows, "nothing gathered: {gathered:?}");
        check(&engine, &vd, &image, "after the stream");
        controller.config().controller_id
        // Dropped without a shutdown: whatever records are live are replayed at the restart.
    };
    reopen_after_crash(&drives, id, &journal, &image).0.shutdown();
}
