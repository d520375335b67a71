//! The Fast Path: reads that one member serves whole go straight to it, return what was
//! written, fall back to the normal path on any error, and are not taken where the cache or
//! the VD's state could answer differently.

use drive::{Drive, EmulatedClass, EmulatedDrive, EmulatedDriveSpec, FaultyDrive, IoBuf, MemDrive, RealClock};
use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::fast_path::ineligible;
use engine::{Engine, EngineConfig, MemberState, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Arc;

const STRIP_BYTES: u64 = 64 * KIB;

struct Rig {
    engine: Arc<Engine>,
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
    model: Vec<u8>,
}

fn rig(level: Level, drive_count: usize) -> Rig {
    let drives: Vec<Arc<FaultyDrive>> =
        (0..drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 8 * MIB))))).collect();
    let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap());
    let model: Vec<u8> = (0..vd.capacity_bytes()).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let done = engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&model) });
    assert_eq!(done.result, Ok(()), "{level}: the whole-VD write");
    Rig { engine, vd, drives, model }
}

/// 4 KiB reads at offsets spread over the VD, each in one strip.
fn offsets(rig: &Rig, count: u64) -> Vec<u64> {
    let blocks = rig.vd.capacity_bytes() / (4 * KIB);
    (0..count).map(|i| (i * 7919 % blocks) * 4 * KIB).collect()
}

impl Rig {
    /// Reads `offsets` from the test thread and checks each against the model.
    fn read_and_check(&self, offsets: &[u64]) {
        for &offset in offsets {
            let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(4096) });
            assert_eq!(done.result, Ok(()), "read at {offset}");
            let at = offset as usize;
            assert_eq!(done.buf.unwrap().as_slice(), &self.model[at..at + 4096], "read at {offset}");
        }
    }

    /// Reads `offsets` one after another, each submitted from the completion of the one before
    /// (on a shard thread, as a closed-loop client does), and checks them.
    fn read_chained_and_check(&self, offsets: Vec<u64>) {
        let (tx, rx) = mpsc::channel();
        chain(Arc::clone(&self.engine), Arc::clone(&self.vd), offsets, 0, tx);
        for (offset, result, bytes) in rx.iter() {
            assert_eq!(result, Ok(()), "chained read at {offset}");
            assert_eq!(&bytes[..], &self.model[offset as usize..offset as usize + 4096], "chained read at {offset}");
        }
    }
}

type Outcome = (u64, Result<(), engine::VdError>, Vec<u8>);

fn chain(engine: Arc<Engine>, vd: Arc<VirtualDrive>, offsets: Vec<u64>, index: usize, tx: mpsc::Sender<Outcome>) {
    let Some(&offset) = offsets.get(index) else { return };
    let (engine2, vd2) = (Arc::clone(&engine), Arc::clone(&vd));
    let request = VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(4096) };
    engine.submit(
        &vd,
        request,
        Box::new(move |completion| {
            let bytes = completion.buf.map(|b| b.as_slice().to_vec()).unwrap_or_default();
            tx.send((offset, completion.result, bytes)).unwrap();
            chain(engine2, vd2, offsets, index + 1, tx);
        }),
    );
}

#[test]
fn reads_on_every_level_take_the_fast_path_and_return_what_was_written() {
    for (level, drive_count) in [(Level::Raid0, 3), (Level::Raid1, 2), (Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let rig = rig(level, drive_count);
        assert_eq!(ineligible(&rig.vd), None, "{level}: WT, NORA, Direct on memory drives qualifies");
        let offsets = offsets(&rig, 200);
        rig.read_and_check(&offsets);
        rig.read_chained_and_check(offsets);
        assert_eq!(rig.vd.fast_path_reads(), 400, "{level}: every 4 KiB read took the fast path");
        // A read across a strip boundary has two members to read: the normal path.
        let across = STRIP_BYTES - 2048;
        rig.read_and_check(&[across]);
        assert_eq!(rig.vd.fast_path_reads(), 400, "{level}: a read across strips did not take it");
    }
}

/// A member that fails a fast read: the read is served by the normal path (the other copy, or
/// reconstructed from parity), so the client still gets its data.
#[test]
fn a_failed_fast_read_is_served_by_the_normal_path() {
    for (level, drive_count) in [(Level::Raid1, 2), (Level::Raid5, 4)] {
        let rig = rig(level, drive_count);
        let data_area = MEMBER_RESERVED_BYTES..MEMBER_RESERVED_BYTES + 8 * MIB;
        rig.drives[0].update_faults(|f| f.read_error_ranges = vec![data_area.clone()]);
        let offsets = offsets(&rig, 100);
        rig.read_and_check(&offsets);
        rig.read_chained_and_check(offsets);
        assert_ne!(rig.vd.member(0).state(), MemberState::Online, "{level}: the failing member was booked and taken out");
    }
}

#[test]
fn vds_the_cache_or_a_missing_member_could_answer_for_do_not_take_it() {
    let rig = rig(Level::Raid1, 2);
    let offsets = offsets(&rig, 20);

    rig.vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Cached);
    assert_eq!(ineligible(&rig.vd), Some("needs WT, NORA and Direct"));
    rig.read_and_check(&offsets);
    assert_eq!(rig.vd.fast_path_reads(), 0, "cached I/O keeps the normal path");
    rig.vd.set_read_policies(ReadPolicy::NoReadAhead, IoPolicy::Direct);

    // AWB leaves dirty data in the cache: reads must see it, not the members.
    rig.vd.set_write_policy(WritePolicy::AlwaysWriteBack);
    let fresh = vec![0xa5u8; 4096];
    let done = rig.engine.run(&rig.vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&fresh) });
    assert_eq!(done.result, Ok(()));
    rig.vd.set_write_policy(WritePolicy::WriteThrough);
    assert!(rig.vd.cache_dirty_bytes() > 0, "the write is in the cache");
    assert_eq!(ineligible(&rig.vd), Some("the cache holds dirty data of it"));
    let done = rig.engine.run(&rig.vd, VdRequest::Read { offset_bytes: 0, buf: IoBuf::zeroed(4096) });
    assert_eq!(done.buf.unwrap().as_slice(), &fresh[..], "the read sees the cached write");
    assert_eq!(rig.vd.fast_path_reads(), 0);
    let done = rig.engine.run(&rig.vd, VdRequest::Flush);
    assert_eq!(done.result, Ok(()));
    rig.engine.quiesce().unwrap();
    assert_eq!(rig.vd.cache_dirty_bytes(), 0, "destaged");
    assert_eq!(ineligible(&rig.vd), None);

    rig.vd.set_member_state(1, MemberState::Failed);
    assert_eq!(ineligible(&rig.vd), Some("a member is not online"));
}

/// A JBOD VD on one emulated NVMe SSD, which is served on a shard (never in place).
fn ssd_jbod(id: u64) -> Arc<VirtualDrive> {
    let spec = EmulatedDriveSpec::new(EmulatedClass::SsdNvme, MEMBER_RESERVED_BYTES + 8 * MIB);
    let drive: Arc<dyn Drive> = Arc::new(EmulatedDrive::new(&spec, Arc::new(RealClock::new())));
    let layout = VdLayout { level: Level::Jbod, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
    Arc::new(VirtualDrive::new(id, &format!("v{id}"), layout, vec![drive]).unwrap())
}

/// The names of the threads that completed 4 KiB reads of `vd` at `offsets`, submitted one
/// after another from this thread, which is no shard.
fn completing_threads(engine: &Engine, vd: &Arc<VirtualDrive>, offsets: &[u64]) -> HashSet<String> {
    let (tx, rx) = mpsc::channel();
    for &offset in offsets {
        let tx = tx.clone();
        let request = VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(4096) };
        engine.submit(
            vd,
            request,
            Box::new(move |completion| {
                assert_eq!(completion.result, Ok(()), "read at {offset}");
                tx.send(std::thread::current().name().unwrap_or("unnamed").to_string()).unwrap();
            }),
        );
    }
    drop(tx);
    rx.iter().collect()
}

/// One thread's Fast Path requests to one VD are served on one shard, whichever row they read
/// (so the VD's counters and the client's state stay in one core's cache), and two VDs the
/// thread reads are served on different shards (the load still spreads).
#[test]
fn a_threads_reads_of_one_vd_are_served_on_one_shard_and_vds_spread() {
    let engine = Engine::start(EngineConfig { shard_count: 2, ..EngineConfig::default() }).unwrap();
    let (first, second) = (ssd_jbod(1), ssd_jbod(2));
    // Rows 0 to 127 of 64 KiB: the rows' owners are both shards.
    let offsets: Vec<u64> = (0..128).map(|row| row * STRIP_BYTES).collect();
    let first_threads = completing_threads(&engine, &first, &offsets);
    let second_threads = completing_threads(&engine, &second, &offsets);
    assert_eq!(first.fast_path_reads(), 128, "every read took the Fast Path");
    assert_eq!(first_threads.len(), 1, "one shard served the thread's reads of v1: {first_threads:?}");
    assert_eq!(second_threads.len(), 1, "one shard served the thread's reads of v2: {second_threads:?}");
    assert!(first_threads.iter().all(|name| name.starts_with("storc-shard-")), "{first_threads:?}");
    assert_ne!(first_threads, second_threads, "v1 and v2 are served on different shards");
}
