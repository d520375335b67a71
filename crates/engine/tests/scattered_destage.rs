//! Scattered row writes: the destager writes a parity row's separate dirty extents as one
//! read-modify-write (`io::serve_scattered`). Parity must come out right column range by column
//! range (checked on the members themselves, P and Q), every byte must read back, and a member
//! that fails such a write hands the extents to the ordinary path, which loses none of them.

mod common;

use common::{check, engine, pattern, spec};
use drive::{Drive, DriveOp, FaultyDrive, IoBuf, IoCtx, MemDrive};
use engine::config::WritePolicy;
use engine::controller::{Controller, ControllerOptions, JournalOffer, OfferedDrive};
use engine::vd::MemberState;
use engine::{Engine, VirtualDrive};
use layout::{Level, KIB, MIB};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 16 * MIB;
const JOURNAL_BYTES: u64 = 32 * MIB;
const ROWS: u64 = 16;

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>]) -> Arc<Controller> {
    let offered = drives.iter().enumerate().map(|(i, d)| OfferedDrive { drive: Arc::clone(d), source: format!("mem{i}") }).collect();
    let journal: Arc<dyn Drive> = Arc::new(MemDrive::new(JOURNAL_BYTES));
    let journal = vec![JournalOffer { drive: journal, source: "mem-journal".into(), path: None, slot: None }];
    Controller::open(Arc::clone(engine), offered, ControllerOptions { journal, ..ControllerOptions::default() }).unwrap()
}

fn write_back_vd(controller: &Controller, level: Level, drive_count: u32) -> Arc<VirtualDrive> {
    let slots: Vec<u32> = (0..drive_count).collect();
    let mut vd_spec = spec(level, &slots, "scattered");
    vd_spec.write_policy = WritePolicy::WriteBack;
    controller.create_vd(vd_spec).unwrap();
    controller.vd(0).unwrap().1
}

/// Small writes scattered over each of the first [`ROWS`] rows, none next to another: two in
/// the first strip, others at other columns of other strips, so that the row's parity changes
/// in several separate column ranges.
fn write_scattered_rows(engine: &Engine, vd: &Arc<VirtualDrive>, image: &mut [u8]) {
    let strip_bytes = vd.geometry().strip_size_bytes();
    let row_bytes = vd.geometry().row_data_bytes();
    let places = [(0, 0), (0, 32 * KIB), (1, 16 * KIB), (2, 40 * KIB), (2, 56 * KIB)];
    for row in 0..ROWS {
        for (index, &(strip, column)) in places.iter().enumerate() {
            let offset = row * row_bytes + strip * strip_bytes + column;
            let data = pattern(4 * KIB as usize, (row * 8 + index as u64) as u8);
            engine.write_at(vd, offset, &data).unwrap();
            image[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        }
    }
}

fn read_direct(drive: &dyn Drive, offset_bytes: u64, len_bytes: usize) -> Vec<u8> {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    assert_eq!(completions[0].result, Ok(()));
    completions.pop().unwrap().buf.unwrap().as_slice().to_vec()
}

/// P (and Q) of each of the first [`ROWS`] rows, as the members hold them, are those of the
/// data strips the members hold.
fn assert_parity_right(vd: &VirtualDrive, drives: &[Arc<dyn Drive>]) {
    let strip_bytes = vd.geometry().strip_size_bytes() as usize;
    for row in 0..ROWS {
        let map = vd.geometry().row_map(row);
        let strips: Vec<Vec<u8>> = (0..map.data_strip_count())
            .map(|k| {
                let place = map.data_copy(k, 0);
                read_direct(&*drives[place.drive], place.drive_offset_bytes, strip_bytes)
            })
            .collect();
        let data: Vec<&[u8]> = strips.iter().map(Vec::as_slice).collect();
        let (mut p, mut q) = (vec![0u8; strip_bytes], vec![0u8; strip_bytes]);
        match map.q_place() {
            Some(_) => parity::pq_gen(&data, &mut p, &mut q),
            None => parity::xor_gen(&data, &mut p),
        }
        let p_place = map.p_place().expect("a parity row has P");
        assert!(read_direct(&*drives[p_place.drive], p_place.drive_offset_bytes, strip_bytes) == p, "row {row}: P is wrong");
        if let Some(q_place) = map.q_place() {
            assert!(read_direct(&*drives[q_place.drive], q_place.drive_offset_bytes, strip_bytes) == q, "row {row}: Q is wrong");
        }
    }
}

fn scattered_rows_destage_as_one_row_write_each(level: Level, drive_count: u32) {
    let drives: Vec<Arc<dyn Drive>> = (0..drive_count).map(|_| Arc::new(MemDrive::new(DRIVE_BYTES)) as Arc<dyn Drive>).collect();
    let engine = engine();
    let controller = open(&engine, &drives);
    let vd = write_back_vd(&controller, level, drive_count);
    let mut image = vec![0u8; (ROWS * vd.geometry().row_data_bytes()) as usize];
    write_scattered_rows(&engine, &vd, &mut image);
    check(&engine, &vd, &image, "from the cache");
    engine.quiesce().unwrap();
    let destage = engine.cache_stats().destage;
    assert!(destage.scattered_runs >= ROWS, "each row went out as one scattered write: {destage:?}");
    assert_eq!(destage.failed_runs, 0);
    check(&engine, &vd, &image, "from the members");
    assert_parity_right(&vd, &drives);
    controller.shutdown();
}

#[test]
fn a_raid5_rows_scattered_extents_destage_as_one_row_write_with_parity_right() {
    scattered_rows_destage_as_one_row_write_each(Level::Raid5, 4);
}

#[test]
fn a_raid6_rows_scattered_extents_destage_as_one_row_write_with_p_and_q_right() {
    scattered_rows_destage_as_one_row_write_each(Level::Raid6, 5);
}

/// A scattered row write that meets a member error hands its extents to the ordinary path:
/// `fault` is put on member 1 once the writes are cached, and every byte must read back after
/// the destage (degraded, if the member left service).
fn a_member_error_in_a_scattered_row_write_loses_nothing(fault: impl FnOnce(&mut drive::Faults)) -> Arc<VirtualDrive> {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))));
    let mut drives: Vec<Arc<dyn Drive>> = (0..4).map(|_| Arc::new(MemDrive::new(DRIVE_BYTES)) as Arc<dyn Drive>).collect();
    drives[1] = Arc::clone(&failing) as Arc<dyn Drive>;
    let engine = engine();
    let controller = open(&engine, &drives);
    let vd = write_back_vd(&controller, Level::Raid5, 4);
    let mut image = vec![0u8; (ROWS * vd.geometry().row_data_bytes()) as usize];
    write_scattered_rows(&engine, &vd, &mut image);
    failing.update_faults(fault);
    engine.quiesce().unwrap();
    assert_eq!(engine.cache_stats().dirty_bytes, 0, "everything reached the members");
    check(&engine, &vd, &image, "after the member error");
    controller.shutdown();
    vd
}

/// Read errors come before anything is written: the ordinary path must write it all.
#[test]
fn a_read_error_in_a_scattered_row_write_hands_the_extents_to_the_ordinary_path() {
    a_member_error_in_a_scattered_row_write_loses_nothing(|faults| faults.read_error_ranges.push(0..DRIVE_BYTES));
}

/// Write errors take the member out of service; the rows are written degraded.
#[test]
fn a_member_failing_a_scattered_row_write_leaves_service_and_loses_nothing() {
    let vd = a_member_error_in_a_scattered_row_write_loses_nothing(|faults| faults.write_error_ranges.push(0..DRIVE_BYTES));
    assert_ne!(vd.member(1).state(), MemberState::Online, "the member that failed its writes left service");
}
