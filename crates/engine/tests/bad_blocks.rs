//! Bad blocks at the row-job level, over memory drives with injected read errors: a rebuild that
//! meets a source chunk nothing else holds records exactly that chunk's VD bytes (and the
//! rebuilt member's at the same place), goes on, and leaves the row consistent: every other
//! byte reads back right, with each other member taken out too; reads of the lost bytes fail;
//! a write over them makes them good again.

mod common;

use common::random_bytes;
use drive::{Drive, DriveOp, FaultyDrive, IoBuf, IoCtx, MemDrive};
use engine::config::BadBlock;
use engine::vd::{BadBlockChange, BAD_BLOCKS_MAX};
use engine::{
    CheckMode, CompletionOrder, LocalEngine, MemberSet, MemberState, VdError, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES,
};
use engine::{Engine, EngineConfig};
use layout::{Level, SpanKind, KIB, MIB};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

const MEMBER_BYTES: u64 = MEMBER_RESERVED_BYTES + MIB;
const STRIP_BYTES: u64 = 16 * KIB;
const CHUNK_BYTES: u64 = 4 * KIB;

struct Rig {
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
    engine: LocalEngine,
    model: Vec<u8>,
}

fn rig(level: Level, drive_count: usize, drives_per_span: Option<usize>) -> Rig {
    let drives: Vec<Arc<FaultyDrive>> =
        (0..drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))))).collect();
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let model = random_bytes(vd.capacity_bytes() as usize, 7);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    assert_eq!(engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&model) }).result, Ok(()));
    Rig { vd, drives, engine, model }
}

fn write_direct(drive: &dyn Drive, offset_bytes: u64, data: &[u8]) {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(data) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    assert_eq!(completions[0].result, Ok(()));
}

impl Rig {
    /// Makes chunk `chunk` of whatever member `member` holds in `row` unreadable.
    fn unreadable_chunk(&self, member: usize, row: u64, chunk: u64) {
        let map = self.vd.geometry().row_map(row);
        let place = map.members().map(|(place, _, _)| place).find(|place| place.drive == member).expect("member in the row's span");
        let start = place.drive_offset_bytes + chunk * CHUNK_BYTES;
        self.drives[member].update_faults(|f| f.read_error_ranges.push(start..start + 512));
    }

    /// Replaces `target` by garbage (a blank drive) and rebuilds it in runs of 3 rows, as a hot
    /// spare does (in runs, whose merged reads fail over unreadable chunks and fall back to the
    /// row path).
    fn rebuild(&mut self, target: usize) {
        let used = self.vd.geometry().member_used_bytes();
        write_direct(&*self.drives[target], MEMBER_RESERVED_BYTES, &random_bytes((used - MEMBER_RESERVED_BYTES) as usize, 99));
        self.vd.set_member_state(target, MemberState::Failed);
        self.vd.start_rebuild(target, Arc::clone(&self.drives[target]) as Arc<dyn Drive>);
        let row_count = self.vd.geometry().row_count();
        for first_row in (0..row_count).step_by(3) {
            let results = self.engine.run_rebuild_rows(&self.vd, first_row, 3.min(row_count - first_row), MemberSet::of(&[target]));
            for (row, result) in (first_row..).zip(results) {
                assert_eq!(result, Ok(()), "{}: row {row} goes on, lost data or not", self.vd.geometry().level());
            }
        }
        self.vd.finish_rebuild(target);
    }

    fn read(&mut self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, VdError> {
        let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes as usize) });
        done.result.map(|()| done.buf.unwrap().as_slice().to_vec())
    }

    /// Every bad block fails to read with an error naming it; every byte between them reads
    /// what the model holds.
    fn verify(&mut self, when: &str) {
        let level = self.vd.geometry().level();
        let bad = self.vd.bad_blocks().ranges();
        let mut good_from = 0;
        for range in bad.iter().chain([&BadBlock { offset_bytes: self.model.len() as u64, len_bytes: 0 }]) {
            if range.len_bytes > 0 {
                // Its last sector and the next one, where there is one.
                let at = range.offset_bytes + range.len_bytes - 512;
                let error = self.read(at, 1024.min(self.model.len() as u64 - at)).map(|_| ()).expect_err("a read of a bad block fails");
                assert!(
                    matches!(&error, VdError::BadBlock { offset_bytes, len_bytes, .. } if *offset_bytes == range.offset_bytes && *len_bytes == range.len_bytes),
                    "{level} {when}: {error}"
                );
            }
            let len = range.offset_bytes - good_from;
            if len > 0 {
                let got = self.read(good_from, len).unwrap_or_else(|e| panic!("{level} {when}: {e}"));
                let expected = &self.model[good_from as usize..range.offset_bytes as usize];
                let wrong = got.iter().zip(expected).position(|(a, b)| a != b);
                assert_eq!(wrong.map(|i| good_from + i as u64), None, "{level} {when}: first wrong VD byte");
            }
            good_from = range.offset_bytes + range.len_bytes;
        }
    }

    /// `verify`, with the whole VD, then with each member the VD can spare taken out.
    fn verify_each_member_out(&mut self, when: &str) {
        self.verify(when);
        for member in 0..self.drives.len() {
            let mut lost = vec![false; self.drives.len()];
            lost[member] = true;
            if !self.vd.geometry().survives(&lost) {
                continue;
            }
            self.vd.set_member_state(member, MemberState::Failed);
            self.verify(&format!("{when}, member {member} out"));
            self.vd.set_member_state(member, MemberState::Online);
        }
    }
}

/// The VD bytes of chunk `chunk` of every data strip in `row` whose data `lost_members` took
/// with them (all its copies, or, for parity, its own member while both are in the row's span).
fn expected_loss(vd: &VirtualDrive, row: u64, chunk: u64, lost_members: [usize; 2]) -> Vec<BadBlock> {
    let geometry = vd.geometry();
    let map = geometry.row_map(row);
    let in_row = |member: usize| map.members().any(|(place, _, _)| place.drive == member);
    let lost_strip = |k: usize| match geometry.span_kind() {
        SpanKind::Mirror | SpanKind::OffsetMirror => (0..map.copy_count()).all(|c| lost_members.contains(&map.data_copy(k, c).drive)),
        _ => lost_members.iter().all(|&m| in_row(m)) && lost_members.contains(&map.data_copy(k, 0).drive),
    };
    let start = |k: usize| row * geometry.row_data_bytes() + k as u64 * STRIP_BYTES + chunk * CHUNK_BYTES;
    (0..map.data_strip_count()).filter(|&k| lost_strip(k)).map(|k| BadBlock { offset_bytes: start(k), len_bytes: CHUNK_BYTES }).collect()
}

/// Normalizes like the list does: sorted, touching ranges merged.
fn merged(mut ranges: Vec<BadBlock>) -> Vec<BadBlock> {
    ranges.sort_by_key(|r| r.offset_bytes);
    let mut out: Vec<BadBlock> = Vec::new();
    for range in ranges {
        match out.last_mut() {
            Some(last) if last.offset_bytes + last.len_bytes >= range.offset_bytes => {
                last.len_bytes = range.offset_bytes + range.len_bytes - last.offset_bytes
            }
            _ => out.push(range),
        }
    }
    out
}

/// A degraded VD rebuilt while `source` has one unreadable chunk in each of several rows of
/// the target's span: the rebuild completes, exactly the lost chunks are bad blocks, and the
/// rest of the VD is right with every member in turn taken out. Then writes over the bad
/// blocks (one partial) make exactly those bytes good again.
fn rebuild_past_lost_chunks(level: Level, drive_count: usize, drives_per_span: Option<usize>, target: usize, source: usize) {
    let mut rig = rig(level, drive_count, drives_per_span);
    let geometry = *rig.vd.geometry();
    let span = geometry.span_of_drive(target);
    let rows: Vec<u64> = (0..geometry.row_count()).filter(|&row| geometry.row_map(row).span == span).skip(1).step_by(3).take(4).collect();
    let mut expected = Vec::new();
    for (i, &row) in rows.iter().enumerate() {
        let chunk = i as u64 % 4;
        rig.unreadable_chunk(source, row, chunk);
        expected.extend(expected_loss(&rig.vd, row, chunk, [target, source]));
    }
    let expected = merged(expected);
    assert!(!expected.is_empty(), "{level}: the faults lose something");
    rig.rebuild(target);
    assert_eq!(rig.vd.member(target).state(), MemberState::Online);
    assert_eq!(rig.vd.bad_blocks().ranges(), expected, "{level}: exactly the lost chunks");
    rig.verify(&format!("after the rebuild of member {target}"));
    // A real disk remaps a sector that is written; the rebuild wrote zeros over the lost chunk.
    rig.drives[source].set_faults(Default::default());
    for row in 0..geometry.row_count() {
        let outcome = rig.engine.run_check_row(&rig.vd, row, CheckMode::Report).unwrap();
        assert!(outcome.is_consistent(), "{level}: row {row} left inconsistent: {outcome:?}");
    }
    rig.verify_each_member_out("after the rebuild");

    // A write over part of the first bad block makes exactly those bytes good again.
    let first = expected[0];
    let part = random_bytes(1024, 3);
    let at = first.offset_bytes + 512;
    rig.engine.run(&rig.vd, VdRequest::Write { offset_bytes: at, buf: IoBuf::from_slice(&part) }).result.unwrap();
    rig.model[at as usize..at as usize + part.len()].copy_from_slice(&part);
    let mut left = vec![BadBlock { offset_bytes: first.offset_bytes, len_bytes: 512 }];
    left.push(BadBlock { offset_bytes: at + 1024, len_bytes: first.len_bytes - 1536 });
    left.extend_from_slice(&expected[1..]);
    assert_eq!(rig.vd.bad_blocks().ranges(), left, "{level}: a partial write clears what it wrote");
    // Writes over every bad block whole leave none.
    for range in rig.vd.bad_blocks().ranges() {
        let data = random_bytes(range.len_bytes as usize, range.offset_bytes);
        rig.engine.run(&rig.vd, VdRequest::Write { offset_bytes: range.offset_bytes, buf: IoBuf::from_slice(&data) }).result.unwrap();
        rig.model[range.offset_bytes as usize..(range.offset_bytes + range.len_bytes) as usize].copy_from_slice(&data);
    }
    assert_eq!(rig.vd.bad_blocks().ranges(), vec![], "{level}");
    rig.verify_each_member_out("after writing the bad blocks");
}

#[test]
fn raid5_rebuild_records_exactly_the_lost_chunks_and_leaves_parity_consistent() {
    rebuild_past_lost_chunks(Level::Raid5, 4, None, 1, 2);
}

#[test]
fn raid50_loses_only_in_the_span_that_lost_two() {
    rebuild_past_lost_chunks(Level::Raid50, 6, Some(3), 4, 5);
}

#[test]
fn mirrors_with_no_other_copy_record_the_chunk() {
    rebuild_past_lost_chunks(Level::Raid1, 2, None, 1, 0);
    rebuild_past_lost_chunks(Level::Raid10, 6, Some(2), 2, 3);
    rebuild_past_lost_chunks(Level::Raid1E, 5, None, 2, 3);
}

/// Where the span still tolerates the source's error, nothing is lost: the chunk is rebuilt
/// from the rest and written back over the unreadable one (read repair).
#[test]
fn raid6_recovers_a_source_error_and_repairs_it_without_a_bad_block() {
    let mut rig = rig(Level::Raid6, 5, None);
    for row in [2, 7, 9] {
        rig.unreadable_chunk(3, row, 1);
    }
    rig.rebuild(0);
    assert_eq!(rig.vd.bad_blocks().ranges(), vec![]);
    rig.drives[3].set_faults(Default::default());
    rig.verify_each_member_out("after the rebuild");
}

/// A row whose target and every other copy are gone loses its whole strip, not a made-up one.
#[test]
fn a_row_without_any_source_is_a_bad_block_of_whole_strips() {
    let mut rig = rig(Level::Raid5, 4, None);
    rig.drives[2].set_failed(true);
    rig.vd.set_member_state(2, MemberState::Failed);
    rig.vd.set_member_state(1, MemberState::Failed);
    let map = rig.vd.geometry().row_map(3);
    rig.engine.run_rebuild_row(&rig.vd, 3, MemberSet::of(&[1])).unwrap();
    let row_start = 3 * rig.vd.geometry().row_data_bytes();
    let lost: Vec<BadBlock> = (0..map.data_strip_count())
        .filter(|&k| [1, 2].contains(&map.data_copy(k, 0).drive))
        .map(|k| BadBlock { offset_bytes: row_start + k as u64 * STRIP_BYTES, len_bytes: STRIP_BYTES })
        .collect();
    assert_eq!(rig.vd.bad_blocks().ranges(), merged(lost));
}

/// A read that began before a row job recorded its range as lost cannot return the zeros the
/// job writes: it sees the list change and is redone (or fails).
#[test]
fn reads_racing_a_puncture_never_return_its_zeros() {
    let mut rig = rig(Level::Raid1, 2, None);
    let row = 5;
    rig.unreadable_chunk(0, row, 2);
    rig.vd.set_member_state(1, MemberState::Failed);
    rig.vd.start_rebuild(1, Arc::clone(&rig.drives[1]) as Arc<dyn Drive>);
    let offset_bytes = row * STRIP_BYTES + 2 * CHUNK_BYTES;
    let results = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..4 {
        let results = Rc::clone(&results);
        rig.engine.submit(&rig.vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(4096) }, move |c| results.borrow_mut().push(c));
        rig.engine.rebuild_row(&rig.vd, row, MemberSet::of(&[1]), |result| assert_eq!(result, Ok(())));
    }
    rig.engine.run_until_idle();
    for completion in results.borrow_mut().drain(..) {
        let error = completion.result.expect_err("the data is lost");
        assert!(matches!(error, VdError::BadBlock { .. } | VdError::Offline { .. }), "{error}");
    }
}

/// The order that makes a crash safe: a row job that found data lost writes nothing over it
/// until the list is in the metadata (here: until the test says it was written); when it cannot
/// be written, the job writes nothing at all and says why. On the threaded engine, where the
/// word comes from another thread while the shard sleeps in its ring.
#[test]
fn a_row_job_writes_over_lost_data_only_once_the_list_is_durable() {
    for written in [true, false] {
        let rig = rig(Level::Raid1, 2, None);
        let engine = Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap();
        let (sender, events) = crossbeam_channel::unbounded();
        rig.vd.bad_blocks().set_notifier(sender);
        let row = 4;
        rig.unreadable_chunk(0, row, 1);
        rig.vd.set_member_state(1, MemberState::Failed);
        rig.vd.start_rebuild(1, Arc::clone(&rig.drives[1]) as Arc<dyn Drive>);
        let target_chunk = MEMBER_RESERVED_BYTES + row * STRIP_BYTES + CHUNK_BYTES;
        let before = read_direct(&*rig.drives[1], target_chunk);
        let (done_tx, done) = std::sync::mpsc::channel();
        engine.rebuild_row(&rig.vd, row, MemberSet::of(&[1]), Box::new(move |result| done_tx.send(result).unwrap()));
        let event = events.recv_timeout(Duration::from_secs(10)).expect("the loss is reported");
        assert!(matches!(event.change, BadBlockChange::Lost { .. }), "{event:?}");
        assert!(done.recv_timeout(Duration::from_millis(300)).is_err(), "the job waits for the list to be written");
        assert_eq!(read_direct(&*rig.drives[1], target_chunk), before, "nothing written over the lost data yet");
        let (_, version) = rig.vd.bad_blocks().snapshot();
        let outcome = if written { Ok(()) } else { Err("no drive took the metadata".to_string()) };
        rig.vd.bad_blocks().persisted(version, outcome);
        let result = done.recv_timeout(Duration::from_secs(10)).expect("the job ends once told");
        let after = read_direct(&*rig.drives[1], target_chunk);
        if written {
            assert_eq!(result, Ok(()));
            assert_eq!(after, vec![0; CHUNK_BYTES as usize], "then the lost chunk holds zeros");
        } else {
            let error = result.unwrap_err();
            assert!(matches!(error, VdError::RowUnrecoverable { row: 4, member: 1, .. }), "{error}");
            assert!(error.to_string().ends_with("could not be written to the metadata: no drive took the metadata"), "{error}");
            assert_eq!(after, before, "nothing written when the loss could not be recorded");
        }
    }
}

fn read_direct(drive: &dyn Drive, offset_bytes: u64) -> Vec<u8> {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Read { offset_bytes, buf: IoBuf::zeroed(CHUNK_BYTES as usize) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    completions.pop().and_then(|c| c.result.ok().and(c.buf)).expect("direct read").as_slice().to_vec()
}

/// A loss past the list's bound is not recorded: the row job writes nothing over it (its target
/// strip keeps what it had, never read while Rbld) and says why; what was listed stays.
#[test]
fn a_full_list_refuses_a_new_loss_and_the_row_is_left_as_it_was() {
    let mut rig = rig(Level::Raid5, 4, None);
    let capacity = rig.vd.capacity_bytes();
    let full: Vec<BadBlock> =
        (0..BAD_BLOCKS_MAX as u64).map(|i| BadBlock { offset_bytes: capacity - (i + 1) * 1024, len_bytes: 512 }).rev().collect();
    rig.vd.bad_blocks().load(&full);
    let row = 2;
    rig.unreadable_chunk(2, row, 0);
    rig.vd.set_member_state(1, MemberState::Failed);
    rig.vd.start_rebuild(1, Arc::clone(&rig.drives[1]) as Arc<dyn Drive>);
    let place = rig.vd.geometry().row_map(row).members().map(|(place, _, _)| place).find(|p| p.drive == 1).unwrap();
    write_direct(&*rig.drives[1], place.drive_offset_bytes, &[0xAB; STRIP_BYTES as usize]);
    let error = rig.engine.run_rebuild_row(&rig.vd, row, MemberSet::of(&[1])).unwrap_err();
    let expected = format!("virtual drive v0: row {row} of member 1 cannot be rebuilt: no other member holds what it needs, and the loss cannot be recorded as a bad block: the bad-block list of v1 holds its maximum of {BAD_BLOCKS_MAX} ranges");
    assert_eq!(error.to_string(), expected);
    assert_eq!(read_direct(&*rig.drives[1], place.drive_offset_bytes), vec![0xAB; CHUNK_BYTES as usize], "nothing written");
    assert_eq!(rig.vd.bad_blocks().ranges(), full);
}
