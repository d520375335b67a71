use super::*;
use drive::{Faults, FaultyDrive, MemDrive};
use layout::{Level, KIB, MIB};
use std::sync::atomic::Ordering;

const MEMBER_BYTES: u64 = MEMBER_RESERVED_BYTES + 2 * MIB;

struct Rig {
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
}

fn rig(level: Level, drive_count: usize, strip_kib: u64) -> Rig {
    let drives: Vec<Arc<FaultyDrive>> =
        (0..drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))))).collect();
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let layout = VdLayout { level, strip_size_bytes: strip_kib * KIB, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    Rig { vd, drives }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8).collect()
}

/// Compares without printing megabytes: names the first differing byte.
#[track_caller]
fn assert_same(got: &[u8], expected: &[u8], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    if let Some(i) = got.iter().zip(expected).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i} (got {}, expected {})", got[i], expected[i]);
    }
}

fn write(engine: &mut LocalEngine, vd: &Arc<VirtualDrive>, offset: u64, data: &[u8]) {
    let done = engine.run(vd, VdRequest::Write { offset_bytes: offset, buf: IoBuf::from_slice(data) });
    assert_eq!(done.result, Ok(()), "write at {offset}");
}

fn read(engine: &mut LocalEngine, vd: &Arc<VirtualDrive>, offset: u64, len: usize) -> Result<Vec<u8>, VdError> {
    let done = engine.run(vd, VdRequest::Read { offset_bytes: offset, buf: IoBuf::zeroed(len) });
    done.result.map(|()| done.buf.unwrap().as_slice().to_vec())
}

/// Writes a range, fails members one by one up to the tolerance, and reads it back each time.
fn check_survives_failures(level: Level, drive_count: usize, fail: &[usize]) {
    let rig = rig(level, drive_count, 16);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    let data = pattern(300 * KIB as usize, 1);
    write(&mut engine, &rig.vd, 8 * KIB, &data);
    for &member in fail {
        rig.drives[member].set_failed(true);
        assert_same(&read(&mut engine, &rig.vd, 8 * KIB, data.len()).unwrap(), &data, &format!("{level} after failing {member}"));
    }
    // Writes while degraded must stay readable too.
    let more = pattern(100 * KIB as usize, 2);
    write(&mut engine, &rig.vd, 40 * KIB + 512, &more);
    let mut expected = data.clone();
    expected[(32 * KIB + 512) as usize..(32 * KIB + 512) as usize + more.len()].copy_from_slice(&more);
    assert_same(&read(&mut engine, &rig.vd, 8 * KIB, expected.len()).unwrap(), &expected, &format!("{level} degraded write"));
}

#[test]
fn every_level_reads_back_through_its_tolerated_failures() {
    check_survives_failures(Level::Raid0, 3, &[]);
    check_survives_failures(Level::Jbod, 1, &[]);
    check_survives_failures(Level::Raid1, 2, &[1]);
    check_survives_failures(Level::Raid1E, 5, &[1, 3]);
    check_survives_failures(Level::Raid5, 4, &[2]);
    check_survives_failures(Level::Raid6, 5, &[0, 3]);
    check_survives_failures(Level::Raid10, 6, &[0, 3, 5]);
    check_survives_failures(Level::Raid50, 6, &[1, 4]);
    check_survives_failures(Level::Raid60, 8, &[0, 1, 5, 6]);
}

#[test]
fn a_vd_past_its_tolerance_fails_io_instead_of_returning_wrong_data() {
    let rig = rig(Level::Raid5, 4, 16);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    write(&mut engine, &rig.vd, 0, &pattern(256 * KIB as usize, 3));
    rig.drives[0].set_failed(true);
    rig.drives[1].set_failed(true);
    let error = read(&mut engine, &rig.vd, 0, 256 * KIB as usize).unwrap_err();
    assert_eq!(rig.vd.state(), VdState::Offline);
    assert_eq!(error.to_string(), "virtual drive v0 is offline: it lost more members than RAID5 tolerates");
}

#[test]
fn a_read_error_is_repaired_from_parity_and_the_member_stays_online() {
    let rig = rig(Level::Raid5, 4, 16);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    let data = pattern(192 * KIB as usize, 4);
    write(&mut engine, &rig.vd, 0, &data);
    let start = MEMBER_RESERVED_BYTES;
    rig.drives[1].update_faults(|f| f.read_error_ranges = std::iter::once(start..start + 4 * KIB).collect());
    assert_same(&read(&mut engine, &rig.vd, 0, data.len()).unwrap(), &data, "RAID5 repaired");
    assert_eq!(rig.vd.member(1).state(), MemberState::Online);
    assert_eq!(rig.vd.member(1).read_error_count(), 1);
    // The repaired sector was written back: with the fault cleared the member has good data.
    rig.drives[1].set_faults(Faults::default());
    rig.drives[0].set_failed(true);
    assert_same(&read(&mut engine, &rig.vd, 0, data.len()).unwrap(), &data, "RAID5 repaired");
}

#[test]
fn a_failed_write_takes_the_member_out_and_the_data_stays_recoverable() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6] {
        let count = match level {
            Level::Raid1 => 2,
            _ => 4,
        };
        let rig = rig(level, count, 16);
        let mut engine = LocalEngine::new(CompletionOrder::Fifo);
        rig.drives[1].update_faults(|f| f.write_error_ranges = std::iter::once(0..u64::MAX).collect());
        let data = pattern(100 * KIB as usize, 5);
        write(&mut engine, &rig.vd, 4 * KIB, &data);
        assert_eq!(rig.vd.member(1).state(), MemberState::Failed, "{level}");
        assert_same(&read(&mut engine, &rig.vd, 4 * KIB, data.len()).unwrap(), &data, &format!("{level}"));
    }
}

#[test]
fn bad_requests_are_refused_without_touching_the_drives() {
    let rig = rig(Level::Raid0, 2, 16);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    let capacity = rig.vd.capacity_bytes();
    let past_end = read(&mut engine, &rig.vd, capacity - 512, 1024).unwrap_err();
    assert_eq!(past_end.to_string(), format!("range {}+1024 is past the end of virtual drive v0 ({capacity} bytes)", capacity - 512));
    let misaligned = read(&mut engine, &rig.vd, 100, 512).unwrap_err();
    assert_eq!(misaligned.to_string(), "offset 100 and length 512 must be multiples of 512 bytes");
}

#[test]
fn mirror_reads_prefer_the_idle_copy() {
    let rig = rig(Level::Raid1, 2, 64);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    write(&mut engine, &rig.vd, 0, &pattern(64 * KIB as usize, 6));
    rig.vd.member(0).outstanding.store(5, Ordering::Relaxed);
    rig.drives[0].update_faults(|f| f.read_error_ranges = std::iter::once(0..u64::MAX).collect());
    // Copy 0 is busy, so the read goes to copy 1 and never meets copy 0's error.
    read(&mut engine, &rig.vd, 0, 4096).unwrap();
    assert_eq!(rig.vd.member(0).read_error_count(), 0);
}

#[test]
fn the_threaded_engine_serves_requests_that_span_shards() {
    let rig = rig(Level::Raid5, 5, 16);
    let engine = Engine::start(EngineConfig { shard_count: 2, ..Default::default() }).unwrap();
    let data = pattern(MIB as usize, 7);
    engine.write_at(&rig.vd, 512 * 3, &data).unwrap();
    assert_same(engine.read_at(&rig.vd, 512 * 3, data.len()).unwrap().as_slice(), &data, "threaded");
    engine.flush(&rig.vd).unwrap();
    rig.drives[4].set_failed(true);
    assert_same(engine.read_at(&rig.vd, 512 * 3, data.len()).unwrap().as_slice(), &data, "threaded");
    assert_eq!(rig.vd.state(), VdState::Degraded);
}

#[test]
fn each_vd_deals_its_rows_to_the_shards_from_a_shard_of_its_own() {
    let engine = Engine::start(EngineConfig { shard_count: 2, ..Default::default() }).unwrap();
    let layout = |level| VdLayout { level, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    let vds: Vec<VirtualDrive> = (0..4)
        .map(|id| VirtualDrive::new(id, "v", layout(Level::Jbod), vec![Arc::new(MemDrive::new(64 * MIB)) as Arc<dyn Drive>]).unwrap())
        .collect();
    let first_shards: Vec<usize> = vds.iter().map(|vd| engine.shard_of_row(vd, 0)).collect();
    assert_eq!(first_shards, [0, 1, 0, 1], "four VDs' first rows spread over both shards");
    // Within a VD, strides of rows take turns, as before.
    let stride = shard_stride_rows(vds[1].geometry());
    assert_eq!(engine.shard_of_row(&vds[1], stride - 1), 1);
    assert_eq!(engine.shard_of_row(&vds[1], stride), 0);
}

/// A task on a shard that submits to rows its own shard owns does not wait for room in its own
/// inbox (it would wait forever: only it empties that inbox): its messages go to its own queue.
#[test]
fn a_shard_submitting_to_itself_never_waits_on_its_own_full_inbox() {
    let engine = Arc::new(Engine::start(EngineConfig { shard_count: 1, inbox_depth: 2, ..Default::default() }).unwrap());
    let rig = rig(Level::Raid1, 2, 64);
    let (sender, receiver) = std::sync::mpsc::channel();
    let (inner_engine, inner_vd) = (Arc::clone(&engine), Arc::clone(&rig.vd));
    let first: Done = Box::new(move |completion| {
        completion.result.unwrap();
        // On the shard: 64 writes (never the Fast Path), far more than the inbox holds.
        for index in 0..64u64 {
            let sender = sender.clone();
            let write = VdRequest::Write { offset_bytes: index * 4096, buf: IoBuf::from_slice(&[index as u8; 4096]) };
            inner_engine.submit(&inner_vd, write, Box::new(move |done| sender.send(done.result).unwrap()));
        }
    });
    engine.submit(&rig.vd, VdRequest::Write { offset_bytes: MIB, buf: IoBuf::from_slice(&[9; 4096]) }, first);
    for _ in 0..64 {
        let result = receiver.recv_timeout(std::time::Duration::from_secs(10)).expect("the shard stalled on its own inbox");
        result.unwrap();
    }
    for index in 0..64u64 {
        assert_eq!(engine.read_at(&rig.vd, index * 4096, 4096).unwrap().as_slice(), &[index as u8; 4096]);
    }
}
