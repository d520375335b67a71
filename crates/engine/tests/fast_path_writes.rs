//! Fast Path writes: on RAID0 and JBOD a write within one strip goes straight to its member,
//! reads back (through the Fast Path and through the normal path), is booked by the normal path
//! when its member fails it, and is not taken where something else must see the write (other
//! levels, a journal, a clean cache, a copy).

use drive::{Drive, FaultyDrive, IoBuf, MemDrive};
use engine::config::{IoPolicy, ReadPolicy};
use engine::{Engine, EngineConfig, MemberState, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::sync::{mpsc, Arc, Mutex};

const STRIP_BYTES: u64 = 64 * KIB;
const BLOCK: usize = 4096;

struct Rig {
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
}

fn rig(level: Level, drive_count: usize) -> Rig {
    let drives: Vec<Arc<FaultyDrive>> =
        (0..drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 4 * MIB))))).collect();
    let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    Rig { engine, vd, drives }
}

fn block(seed: u64) -> Vec<u8> {
    (0..BLOCK as u64).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ seed as u8).collect()
}

/// 4 KiB-aligned offsets spread over the VD.
fn offsets(vd: &VirtualDrive, count: u64) -> Vec<u64> {
    let blocks = vd.capacity_bytes() / BLOCK as u64;
    (0..count).map(|i| (i * 7919 % blocks) * BLOCK as u64).collect()
}

impl Rig {
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), engine::VdError> {
        self.engine.run(&self.vd, VdRequest::Write { offset_bytes: offset, buf: IoBuf::from_slice(data) }).result
    }

    /// Writes `offsets` one after another, each submitted from the completion of the one
    /// before (on a shard thread, as a closed-loop client does); block i gets `block(seed + i)`.
    fn write_chained(&self, offsets: Vec<u64>, seed: u64) {
        let (tx, rx) = mpsc::channel();
        chain(Arc::clone(&self.engine), Arc::clone(&self.vd), Arc::new(offsets), 0, seed, tx);
        for (offset, result) in rx.iter() {
            assert_eq!(result, Ok(()), "chained write at {offset}");
        }
    }
}

fn chain(
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
    offsets: Arc<Vec<u64>>,
    index: usize,
    seed: u64,
    tx: mpsc::Sender<(u64, Result<(), engine::VdError>)>,
) {
    let Some(&offset) = offsets.get(index) else { return };
    let (engine2, vd2) = (Arc::clone(&engine), Arc::clone(&vd));
    let request = VdRequest::Write { offset_bytes: offset, buf: IoBuf::from_slice(&block(seed + index as u64)) };
    engine.submit(
        &vd,
        request,
        Box::new(move |completion| {
            tx.send((offset, completion.result)).unwrap();
            chain(engine2, vd2, offsets, index + 1, seed, tx);
        }),
    );
}

/// The whole VD read in one request (across strips: the normal path) against `model`.
fn check_whole(rig: &Rig, model: &[u8], when: &str) {
    let read = rig.engine.read_at(&rig.vd, 0, model.len()).unwrap();
    let first_wrong = read.as_slice().iter().zip(model).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "{when}: first wrong byte");
}

#[test]
fn writes_on_raid0_and_jbod_take_the_fast_path_and_read_back() {
    for (level, drive_count) in [(Level::Raid0, 3), (Level::Jbod, 1)] {
        let rig = rig(level, drive_count);
        assert_eq!(rig.engine.fast_path_writes_ineligible(&rig.vd), None, "{level}: qualifies");
        let mut model = vec![0u8; rig.vd.capacity_bytes() as usize];
        let offsets = offsets(&rig.vd, 300);
        // From the test thread (served in place) ...
        for (i, &offset) in offsets.iter().enumerate() {
            let data = block(i as u64);
            rig.write(offset, &data).unwrap();
            model[offset as usize..offset as usize + BLOCK].copy_from_slice(&data);
        }
        assert_eq!(rig.vd.fast_path_writes(), 300, "{level}: every write in a strip took the Fast Path");
        check_whole(&rig, &model, &format!("{level}, written in place"));
        // ... and from shard threads (served on the submitting shard).
        rig.write_chained(offsets.clone(), 1000);
        for (i, &offset) in offsets.iter().enumerate() {
            model[offset as usize..offset as usize + BLOCK].copy_from_slice(&block(1000 + i as u64));
        }
        assert_eq!(rig.vd.fast_path_writes(), 600, "{level}");
        check_whole(&rig, &model, &format!("{level}, written from the shards"));
        // Each block read back alone (the Fast Path's reads) too.
        for &offset in &offsets {
            let read = rig.engine.read_at(&rig.vd, offset, BLOCK).unwrap();
            assert_eq!(read.as_slice(), &model[offset as usize..offset as usize + BLOCK], "{level}: fast read at {offset}");
        }
        // A write across a strip boundary: on RAID0 two members, the normal path; on JBOD one
        // drive, the Fast Path.
        let across = STRIP_BYTES - 2048;
        rig.write(across, &block(7)).unwrap();
        model[across as usize..across as usize + BLOCK].copy_from_slice(&block(7));
        let expected = if level == Level::Jbod { 601 } else { 600 };
        assert_eq!(rig.vd.fast_path_writes(), expected, "{level}: a write across strips");
        check_whole(&rig, &model, &format!("{level}, after a write across strips"));
        // Every write reached the members: a flush is enough to find them there.
        assert_eq!(rig.engine.run(&rig.vd, VdRequest::Flush).result, Ok(()));
    }
}

#[test]
fn other_levels_a_journal_and_a_clean_cache_keep_writes_on_the_normal_path() {
    let mirror = rig(Level::Raid1, 2);
    assert_eq!(mirror.engine.fast_path_writes_ineligible(&mirror.vd), Some("writes: RAID0 and JBOD only"));
    mirror.write(0, &block(1)).unwrap();
    assert_eq!(mirror.vd.fast_path_writes(), 0, "RAID1 writes keep the normal path");

    // A read that fills the clean cache turns Fast Path writes off: the line would go stale.
    let rig = rig(Level::Raid0, 2);
    rig.write(0, &block(2)).unwrap();
    assert_eq!(rig.vd.fast_path_writes(), 1);
    rig.vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Cached);
    assert_eq!(rig.engine.read_at(&rig.vd, 0, BLOCK).unwrap().as_slice(), &block(2)[..]);
    rig.vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Direct);
    assert!(rig.engine.fast_path_writes_ineligible(&rig.vd).unwrap().contains("clean data"));
    rig.write(0, &block(3)).unwrap();
    assert_eq!(rig.vd.fast_path_writes(), 1, "the write went through the cache, which drops the stale line");
    assert_eq!(rig.engine.read_at(&rig.vd, 0, BLOCK).unwrap().as_slice(), &block(3)[..], "no stale clean line");

    let journaled = self::rig(Level::Raid0, 2);
    let journal_drive: Arc<dyn Drive> = Arc::new(MemDrive::new(64 * MIB));
    let journal = engine::journal::Journal::open(vec![journal_drive], 1, 2, 0, &mut |_| Ok(())).unwrap();
    journal.finish_replay().unwrap();
    journaled.engine.set_journal(Some(&journal));
    assert_eq!(journaled.engine.fast_path_writes_ineligible(&journaled.vd), Some("writes: the controller has a journal"));
    journaled.write(0, &block(4)).unwrap();
    assert_eq!(journaled.vd.fast_path_writes(), 0);
}

/// A member that fails a Fast Path write: the normal path writes it again and books the
/// failure, so the client hears of it and the member leaves service (RAID0 and JBOD have no
/// redundancy: the VD goes offline).
#[test]
fn a_failed_fast_write_is_booked_by_the_normal_path() {
    for (level, drive_count) in [(Level::Raid0, 2), (Level::Jbod, 1)] {
        let rig = rig(level, drive_count);
        // The same write takes the Fast Path while the member takes it.
        rig.write(0, &block(4)).unwrap();
        assert_eq!(rig.vd.fast_path_writes(), 1, "{level}: the write qualifies");
        rig.drives[0].update_faults(|f| f.write_error_ranges = std::iter::once(0..u64::MAX).collect());
        let error = rig.write(0, &block(5)).expect_err("a write its member refused fails");
        assert!(!error.to_string().is_empty());
        assert_ne!(rig.vd.member(0).state(), MemberState::Online, "{level}: the member was booked and taken out");
        assert_eq!(rig.vd.fast_path_writes(), 1, "{level}: the refused write is not counted as served");
    }
}

/// A copy of a member (a proactive replacement) while Fast Path writes run, from a thread
/// that is no shard and from the shards: the copy target, once it took the member's place,
/// holds every write. The race this guards against (a write that looked before the copy's
/// flag) is narrow here; `vd::fast_writes`'s unit tests hold the handshake to it directly.
#[test]
fn a_copy_while_fast_writes_run_leaves_the_target_with_every_write() {
    let rig = rig(Level::Raid0, 2);
    let model = Arc::new(Mutex::new(vec![0u8; rig.vd.capacity_bytes() as usize]));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (engine, vd, model, stop) = (Arc::clone(&rig.engine), Arc::clone(&rig.vd), Arc::clone(&model), Arc::clone(&stop));
        std::thread::spawn(move || {
            let offsets = offsets(&vd, 1 << 20);
            for (i, &offset) in offsets.iter().enumerate().cycle() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let data = block(i as u64 + 17);
                let done = engine.run(&vd, VdRequest::Write { offset_bytes: offset, buf: IoBuf::from_slice(&data) });
                assert_eq!(done.result, Ok(()));
                model.lock().unwrap()[offset as usize..offset as usize + BLOCK].copy_from_slice(&data);
            }
        })
    };
    while rig.vd.fast_path_writes() < 200 {
        std::thread::yield_now();
    }
    let target: Arc<dyn Drive> = Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 4 * MIB));
    rig.vd.start_copy(0, Arc::clone(&target));
    let (tx, rx) = mpsc::channel();
    for row in 0..rig.vd.geometry().row_count() {
        let tx = tx.clone();
        rig.engine.copy_row(&rig.vd, row, 0, Box::new(move |result| tx.send(result).unwrap()));
    }
    drop(tx);
    assert!(rx.iter().all(|result| result.is_ok()), "every row copied");
    rig.vd.finish_copy(0);
    // Fast Path writes resume once the copy is over, and land on the target. (Waiting for
    // them, not asserting a count at once: a loaded machine may not run the writer between
    // the copy's end and the stop.)
    let at_copy_end = rig.vd.fast_path_writes();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rig.vd.fast_path_writes() < at_copy_end + 50 {
        assert!(std::time::Instant::now() < deadline, "Fast Path writes did not resume after the copy");
        std::thread::yield_now();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
    // The old source is out of the VD: reads of member 0 come from the target alone.
    rig.drives[0].set_failed(true);
    check_whole(&rig, &model.lock().unwrap(), "after the copy");
}

/// JBOD: a request of any size, at any sector, is one operation on its one drive (reads and
/// writes both), and lands where the normal path reads it.
#[test]
fn jbod_requests_of_any_size_are_one_member_operation() {
    let rig = rig(Level::Jbod, 1);
    let mut model = vec![0u8; rig.vd.capacity_bytes() as usize];
    let pieces = [(STRIP_BYTES - 512, MIB as usize + 3 * 1024), (5 * STRIP_BYTES + 1536, 200 * 1024), (0, 2 * MIB as usize)];
    for (i, &(offset, len)) in pieces.iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|b| (b as u64 * 31 + i as u64 * 7) as u8).collect();
        rig.write(offset, &data).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        let read = rig.engine.read_at(&rig.vd, offset, len).unwrap();
        assert_eq!(read.as_slice(), &model[offset as usize..offset as usize + len], "fast read back of piece {i}");
    }
    assert_eq!((rig.vd.fast_path_writes(), rig.vd.fast_path_reads()), (3, 3), "every request took the Fast Path");
    // The normal path (cached I/O) reads the same bytes.
    rig.vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Cached);
    check_whole(&rig, &model, "JBOD through the normal path");
    assert_eq!(rig.vd.fast_path_reads(), 3);
    // RAID0: a 1 MiB request spans members; the normal path.
    let raid0 = self::rig(Level::Raid0, 2);
    raid0.write(0, &vec![1u8; MIB as usize]).unwrap();
    assert_eq!(raid0.vd.fast_path_writes(), 0);
}
