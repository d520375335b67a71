//! Rebuild and check of whole rows, every level, over memory drives.
//!
//! The rebuild tests prove what a rebuilt member holds by reading the VD back with each other
//! member taken out in turn, so that every strip of the rebuilt member is read at least once
//! where nothing else holds it. The check tests corrupt one strip directly on a drive.

mod common;

use common::random_bytes;
use common::CountingDrive;
use drive::{Drive, DriveOp, FaultyDrive, IoBuf, IoCtx, MemDrive};
use engine::{
    CheckMode, CheckOutcome, CompletionOrder, Engine, EngineConfig, LocalEngine, MemberSet, MemberState, Mismatch, VdError, VdLayout,
    VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES,
};
use layout::{Level, Role, RowMap, KIB, MIB};
use std::sync::Arc;

const MEMBER_BYTES: u64 = MEMBER_RESERVED_BYTES + MIB;
const STRIP_BYTES: u64 = 16 * KIB;

struct Rig {
    vd: Arc<VirtualDrive>,
    drives: Vec<Arc<FaultyDrive>>,
    engine: LocalEngine,
    /// What the VD should read back.
    model: Vec<u8>,
}

/// A VD of `level` over `drive_count` memory drives, written whole with seeded data.
fn rig(level: Level, drive_count: usize, drives_per_span: Option<usize>) -> Rig {
    let drives: Vec<Arc<FaultyDrive>> =
        (0..drive_count).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))))).collect();
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let model = random_bytes(vd.capacity_bytes() as usize, level as u64);
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    let done = engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&model) });
    assert_eq!(done.result, Ok(()), "{level}: the whole-VD write");
    Rig { vd, drives, engine, model }
}

/// Writes straight to a member, bypassing the engine: a replaced drive, a silent corruption.
fn write_direct(drive: &dyn Drive, offset_bytes: u64, data: &[u8]) {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(data) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    assert_eq!(completions.len(), 1, "a memory drive completes at once");
    assert_eq!(completions[0].result, Ok(()), "direct write at {offset_bytes}");
}

impl Rig {
    /// Garbage over the whole data area of `member`, as a blank replacement drive would hold.
    fn replace_with_blank(&self, member: usize) {
        let used = self.vd.geometry().member_used_bytes();
        let garbage = random_bytes((used - MEMBER_RESERVED_BYTES) as usize, 1000 + member as u64);
        write_direct(&*self.drives[member], MEMBER_RESERVED_BYTES, &garbage);
    }

    fn row_count(&self) -> u64 {
        self.vd.geometry().row_count()
    }

    /// Rebuilds `targets` row by row, skipping `skip_row` (a rebuild that missed a row).
    fn rebuild(&mut self, targets: &[usize], skip_row: Option<u64>) {
        self.rebuild_in_runs(targets, skip_row, 1);
    }

    /// [`Rig::rebuild`] in runs of up to `run_rows` rows, of every length from 1 up in turn (a
    /// skipped row ends a run), where member I/Os merge across rows.
    fn rebuild_in_runs(&mut self, targets: &[usize], skip_row: Option<u64>, run_rows: u64) {
        for &target in targets {
            self.replace_with_blank(target);
            self.vd.set_member_state(target, MemberState::Failed);
        }
        let (mut row, mut length) = (0, 1);
        while row < self.row_count() {
            let end = (row + length).min(self.row_count()).min(skip_row.filter(|&skip| skip >= row).unwrap_or(u64::MAX));
            if end > row {
                let results = self.engine.run_rebuild_rows(&self.vd, row, end - row, MemberSet::of(targets));
                assert_eq!(results, vec![Ok(()); (end - row) as usize], "{}: rebuild of rows {row}..{end}", self.vd.geometry().level());
            }
            row = if Some(end) == skip_row { end + 1 } else { end };
            length = length % run_rows + 1;
        }
        for &target in targets {
            self.vd.set_member_state(target, MemberState::Online);
        }
    }

    fn read_all(&mut self) -> Result<Vec<u8>, VdError> {
        let done = self.engine.run(&self.vd, VdRequest::Read { offset_bytes: 0, buf: IoBuf::zeroed(self.model.len()) });
        done.result.map(|()| done.buf.expect("a read returns its buffer").as_slice().to_vec())
    }

    /// Reads the whole VD, then again with each member that can be spared taken out. Returns
    /// the first read that differs from the model.
    fn verify(&mut self) -> Result<(), String> {
        let level = self.vd.geometry().level();
        compare(&self.read_all().unwrap(), &self.model).map_err(|diff| format!("{level} with every member: {diff}"))?;
        for member in 0..self.drives.len() {
            let mut lost = vec![false; self.drives.len()];
            lost[member] = true;
            if !self.vd.geometry().survives(&lost) {
                continue;
            }
            self.vd.set_member_state(member, MemberState::Failed);
            let got = self.read_all().unwrap();
            self.vd.set_member_state(member, MemberState::Online);
            compare(&got, &self.model).map_err(|diff| format!("{level} without member {member}: {diff}"))?;
        }
        Ok(())
    }

    fn check_all(&mut self, mode: CheckMode) -> Vec<CheckOutcome> {
        let outcomes = (0..self.row_count()).map(|row| self.engine.run_check_row(&self.vd, row, mode).unwrap());
        outcomes.filter(|outcome| !outcome.is_consistent()).collect()
    }
}

/// Names the first differing byte instead of printing megabytes.
fn compare(got: &[u8], expected: &[u8]) -> Result<(), String> {
    assert_eq!(got.len(), expected.len());
    match got.iter().zip(expected).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("first difference at VD byte {i} (got {:#04x}, expected {:#04x})", got[i], expected[i])),
    }
}

/// Every redundant level: (level, drive count, drives per span, rebuild targets).
const REDUNDANT: [(Level, usize, Option<usize>, &[usize]); 7] = [
    (Level::Raid1, 2, None, &[1]),
    (Level::Raid1E, 5, None, &[2]),
    (Level::Raid5, 4, None, &[1]),
    (Level::Raid6, 5, None, &[0, 3]),
    (Level::Raid10, 4, Some(2), &[2]),
    (Level::Raid50, 6, Some(3), &[4]),
    (Level::Raid60, 8, Some(4), &[1, 2]),
];

#[test]
fn a_rebuilt_member_holds_what_was_written_at_every_level() {
    for (level, drive_count, per_span, targets) in REDUNDANT {
        let mut rig = rig(level, drive_count, per_span);
        rig.rebuild(targets, None);
        if let Err(diff) = rig.verify() {
            panic!("after rebuilding {targets:?}: {diff}");
        }
    }
}

#[test]
fn a_rebuild_in_runs_of_rows_holds_what_was_written_at_every_level() {
    for (level, drive_count, per_span, targets) in REDUNDANT {
        let mut rig = rig(level, drive_count, per_span);
        rig.rebuild_in_runs(targets, None, 7);
        if let Err(diff) = rig.verify() {
            panic!("after rebuilding {targets:?} in runs: {diff}");
        }
    }
}

#[test]
fn a_rebuild_that_skips_a_row_is_caught_by_the_read_back() {
    for (level, drive_count, per_span, targets) in REDUNDANT {
        for run_rows in [1, 5] {
            let mut rig = rig(level, drive_count, per_span);
            // A row of the first target's span, or the skip would not touch the target at all.
            let geometry = *rig.vd.geometry();
            let target_span = geometry.span_of_drive(targets[0]);
            let skipped = (rig.row_count() / 2..).find(|&row| geometry.row_map(row).span == target_span).unwrap();
            rig.rebuild_in_runs(targets, Some(skipped), run_rows);
            assert!(rig.verify().is_err(), "{level}: skipping row {skipped} went unnoticed (runs of {run_rows})");
        }
    }
}

#[test]
fn levels_without_redundancy_refuse_rebuild_and_check() {
    for (level, drive_count) in [(Level::Raid0, 3), (Level::Jbod, 1)] {
        let mut rig = rig(level, drive_count, None);
        let rebuild = rig.engine.run_rebuild_row(&rig.vd, 0, MemberSet::of(&[0])).unwrap_err();
        let expected = format!("virtual drive v0 is {level}, which keeps no redundancy: there is nothing to rebuild a row from");
        assert_eq!(rebuild.to_string(), expected);
        let check = rig.engine.run_check_row(&rig.vd, 0, CheckMode::Repair).unwrap_err();
        assert_eq!(check.to_string(), expected.replace("rebuild", "check"));
        compare(&rig.read_all().unwrap(), &rig.model).unwrap();
    }
}

#[test]
fn a_source_read_error_is_booked_and_the_row_rebuilt_from_the_rest() {
    let mut rig = rig(Level::Raid6, 5, None);
    let start = MEMBER_RESERVED_BYTES;
    rig.drives[1].update_faults(|f| f.read_error_ranges.push(start..start + 8 * STRIP_BYTES));
    rig.rebuild(&[0], None);
    assert!(rig.vd.member(1).read_error_count() > 0, "the read errors were booked");
    rig.drives[1].set_faults(Default::default());
    rig.verify().unwrap();
}

#[test]
fn a_run_reads_each_source_once_where_row_by_row_reads_it_once_per_row() {
    // What runs are for: one member I/O per drive-contiguous range, not one per strip.
    for (level, drive_count, per_span, rows_per_job) in
        [(Level::Raid5, 4, None, 8), (Level::Raid10, 4, Some(2), 8), (Level::Raid5, 4, None, 1)]
    {
        let counting: Vec<Arc<CountingDrive>> =
            (0..drive_count).map(|_| CountingDrive::over(Arc::new(MemDrive::new(MEMBER_BYTES)))).collect();
        let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span: per_span, member_size_bytes: None };
        let vd = Arc::new(VirtualDrive::new(1, "v0", layout, counting.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect()).unwrap());
        let mut engine = LocalEngine::new(CompletionOrder::Fifo);
        vd.set_member_state(0, MemberState::Failed);
        let before: Vec<u64> = counting.iter().map(|d| d.reads()).collect();
        for first_row in (0..8).step_by(rows_per_job) {
            let results = engine.run_rebuild_rows(&vd, first_row, rows_per_job as u64, MemberSet::of(&[0]));
            assert!(results.iter().all(Result::is_ok), "{level}: {results:?}");
        }
        let reads: Vec<u64> = counting.iter().zip(&before).map(|(d, b)| d.reads() - b).collect();
        let source = if level == Level::Raid10 { 1 } else { 2 };
        let expected = 8 / rows_per_job as u64;
        assert_eq!(reads[source], expected, "{level}, jobs of {rows_per_job} rows: reads per source member {reads:?}");
        assert_eq!(reads[0], 0, "{level}: the target is never read");
    }
}

/// Reads of every row, then writes over every row, while `targets` are rebuilt up to half the
/// rows: client reads must use a target below its published watermark and never above it (a
/// blank drive's garbage lies there), and the finished rebuild must hold everything.
#[test]
fn client_reads_use_a_rebuilding_member_below_its_watermark_only() {
    for (level, drive_count, per_span, targets) in REDUNDANT {
        let mut rig = rig(level, drive_count, per_span);
        let counting: Vec<Arc<CountingDrive>> =
            targets.iter().map(|&t| CountingDrive::over(Arc::clone(&rig.drives[t]) as Arc<dyn Drive>)).collect();
        for (&target, drive) in targets.iter().zip(&counting) {
            rig.replace_with_blank(target);
            rig.vd.set_member_state(target, MemberState::Failed);
            rig.vd.start_rebuild(target, Arc::clone(drive) as Arc<dyn Drive>);
        }
        let half = rig.row_count() / 2;
        let results = rig.engine.run_rebuild_rows(&rig.vd, 0, half, MemberSet::of(targets));
        assert!(results.iter().all(Result::is_ok), "{level}: {results:?}");
        let reads_of = |counting: &[Arc<CountingDrive>]| -> u64 { counting.iter().map(|d| d.reads()).sum() };

        // Not published yet: nothing reads the targets.
        compare(&rig.read_all().unwrap(), &rig.model).unwrap_or_else(|diff| panic!("{level} before publishing: {diff}"));
        assert_eq!(reads_of(&counting), 0, "{level}: a target was read before its rebuild published a row");

        for &target in targets {
            rig.vd.rebuild_advanced(target, rig.vd.rebuild_epoch(target), half);
            assert_eq!(rig.vd.readable_rows(target), half);
        }
        compare(&rig.read_all().unwrap(), &rig.model).unwrap_or_else(|diff| panic!("{level} reading below the watermark: {diff}"));
        if level.span_kind() != layout::SpanKind::Mirror && level != Level::Raid1E {
            assert!(reads_of(&counting) > 0, "{level}: the rebuilt rows were reconstructed instead of read");
        }

        // Client writes meanwhile land on both sides of the watermark; the rebuild then ends.
        let fresh = random_bytes(rig.model.len(), 77 + level as u64);
        let done = rig.engine.run(&rig.vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&fresh) });
        assert_eq!(done.result, Ok(()), "{level}: the write during the rebuild");
        rig.model = fresh;
        compare(&rig.read_all().unwrap(), &rig.model).unwrap_or_else(|diff| panic!("{level} after writing: {diff}"));
        let rest = rig.row_count() - half;
        let results = rig.engine.run_rebuild_rows(&rig.vd, half, rest, MemberSet::of(targets));
        assert!(results.iter().all(Result::is_ok), "{level}: {results:?}");
        for &target in targets {
            rig.vd.finish_rebuild(target);
        }
        rig.verify().unwrap_or_else(|diff| panic!("after rebuilding {targets:?} with reads below the watermark: {diff}"));
    }
}

#[test]
fn a_new_rebuild_of_the_member_starts_unreadable_and_ignores_the_old_ones_progress() {
    let mut rig = rig(Level::Raid5, 4, None);
    rig.vd.set_member_state(1, MemberState::Failed);
    rig.vd.start_rebuild(1, Arc::clone(&rig.drives[1]) as Arc<dyn Drive>);
    let first = rig.vd.rebuild_epoch(1);
    rig.vd.rebuild_advanced(1, first, rig.row_count());
    assert_eq!(rig.vd.readable_rows(1), rig.row_count());
    // The target failed; another drive takes its place, blank.
    rig.vd.set_member_state(1, MemberState::Failed);
    assert_eq!(rig.vd.readable_rows(1), 0, "a failed member is never read");
    rig.replace_with_blank(1);
    rig.vd.start_rebuild(1, Arc::clone(&rig.drives[1]) as Arc<dyn Drive>);
    assert_eq!(rig.vd.readable_rows(1), 0, "the new rebuild has done nothing yet");
    rig.vd.rebuild_advanced(1, first, rig.row_count());
    assert_eq!(rig.vd.readable_rows(1), 0, "the old rebuild's thread publishes in vain");
    compare(&rig.read_all().unwrap(), &rig.model).unwrap_or_else(|diff| panic!("the blank drive was read: {diff}"));
}

#[test]
fn a_source_read_error_inside_a_run_sends_its_rows_down_the_row_path() {
    // The merged read of a source fails: the run's rows are redone one by one, which books the
    // error and recovers the chunk from the second parity. (Where nothing else holds a chunk it
    // becomes a bad block: `bad_blocks.rs` rebuilds in runs too.)
    for (level, drive_count, per_span) in [(Level::Raid6, 5, None), (Level::Raid60, 8, Some(4))] {
        let mut rig = rig(level, drive_count, per_span);
        let start = MEMBER_RESERVED_BYTES + 3 * STRIP_BYTES;
        rig.drives[2].update_faults(|f| f.read_error_ranges.push(start..start + 512));
        rig.rebuild_in_runs(&[0], None, 8);
        assert!(rig.vd.member(2).read_error_count() > 0, "{level}: the read error was booked");
        assert!(rig.vd.bad_blocks().ranges().is_empty(), "{level}: nothing lost");
        rig.drives[2].set_faults(Default::default());
        rig.verify().unwrap();
    }
}

#[test]
fn a_target_that_fails_a_merged_write_fails_every_row_of_it() {
    let mut rig = rig(Level::Raid5, 4, None);
    rig.drives[2].update_faults(|f| f.write_error_ranges.push(0..u64::MAX));
    let results = rig.engine.run_rebuild_rows(&rig.vd, 4, 3, MemberSet::of(&[2]));
    for (row, result) in (4..).zip(results) {
        let error = result.unwrap_err();
        assert!(matches!(error, VdError::RowMemberIo { member: 2, row: r, .. } if r == row), "each row names itself: {error}");
    }
    assert_eq!(rig.vd.member(2).state(), MemberState::Failed);
}

#[test]
fn a_target_that_fails_its_write_is_failed_and_named() {
    let mut rig = rig(Level::Raid5, 4, None);
    rig.drives[2].update_faults(|f| f.write_error_ranges.push(0..u64::MAX));
    let error = rig.engine.run_rebuild_row(&rig.vd, 3, MemberSet::of(&[2])).unwrap_err();
    assert!(matches!(error, VdError::RowMemberIo { row: 3, member: 2, .. }), "the error names row 3 and member 2: {error}");
    assert!(error.to_string().starts_with("virtual drive v0: row 3: writing the rebuilt strip to member 2 failed"), "{error}");
    assert_eq!(rig.vd.member(2).state(), MemberState::Failed);
}

#[test]
fn bad_row_and_member_numbers_are_refused() {
    let mut rig = rig(Level::Raid5, 4, None);
    let row_count = rig.row_count();
    let error = rig.engine.run_check_row(&rig.vd, row_count, CheckMode::Report).unwrap_err();
    assert_eq!(error.to_string(), format!("virtual drive v0 has {row_count} rows: row {row_count} does not exist"));
    let error = rig.engine.run_rebuild_row(&rig.vd, 0, MemberSet::of(&[4])).unwrap_err();
    assert_eq!(error.to_string(), "virtual drive v0 has 4 members: member 4 does not exist");
}

#[test]
fn a_check_of_a_degraded_row_names_the_missing_member() {
    let mut rig = rig(Level::Raid6, 5, None);
    rig.drives[3].set_failed(true);
    rig.vd.set_member_state(3, MemberState::Failed);
    let error = rig.engine.run_check_row(&rig.vd, 0, CheckMode::Report).unwrap_err();
    assert_eq!(error.to_string(), "virtual drive v0: row 0 cannot be checked: member 3 is out of service");
}

#[test]
fn a_consistent_vd_checks_clean_at_every_level() {
    for (level, drive_count, per_span, _) in REDUNDANT {
        let mut rig = rig(level, drive_count, per_span);
        assert_eq!(rig.check_all(CheckMode::Report), vec![], "{level}");
    }
}

/// Which strip of a row a corruption hits.
#[derive(Clone, Copy, Debug)]
enum Corrupt {
    Data { strip_index: usize, copy: usize },
    P,
    Q,
}

/// Garbage over one strip; returns the member it hit and the VD range of a data strip.
fn corrupt(rig: &Rig, row: u64, what: Corrupt) -> (usize, Option<std::ops::Range<usize>>) {
    let map = rig.vd.geometry().row_map(row);
    let (place, vd_range) = match what {
        Corrupt::Data { strip_index, copy } => {
            let start = (row * rig.vd.geometry().row_data_bytes() + strip_index as u64 * STRIP_BYTES) as usize;
            (map.data_copy(strip_index, copy), Some(start..start + STRIP_BYTES as usize))
        }
        Corrupt::P => (map.p_place().unwrap(), None),
        Corrupt::Q => (map.q_place().unwrap(), None),
    };
    write_direct(&*rig.drives[place.drive], place.drive_offset_bytes, &random_bytes(STRIP_BYTES as usize, 77));
    (place.drive, vd_range)
}

/// A VD's shape: level, drive count, drives per span.
type Shape = (Level, usize, Option<usize>);

/// Corrupts one strip, checks that exactly its row is reported as `expected` (given the
/// corrupted member and the row's map) says, repairs, checks clean, and reads back.
/// `keeps_garbage`: the repair trusts the data (RAID5), so the garbage is what reads back.
fn check_finds_and_repairs(shape: Shape, what: Corrupt, expected: impl Fn(usize, &RowMap) -> Mismatch, keeps_garbage: bool) {
    let (level, drive_count, per_span) = shape;
    let mut rig = rig(level, drive_count, per_span);
    let row = rig.row_count() / 3;
    let (member, vd_range) = corrupt(&rig, row, what);
    let found = rig.check_all(CheckMode::Report);
    let wanted = CheckOutcome { row, mismatches: vec![expected(member, &rig.vd.geometry().row_map(row))], repaired: false };
    assert_eq!(found, vec![wanted.clone()], "{level}: {what:?} on member {member}");
    let repaired = rig.engine.run_check_row(&rig.vd, row, CheckMode::Repair).unwrap();
    assert_eq!(repaired, CheckOutcome { repaired: true, ..wanted }, "{level}");
    assert_eq!(rig.check_all(CheckMode::Report), vec![], "{level}: clean after the repair");
    if keeps_garbage {
        let range = vd_range.expect("a data strip");
        rig.model[range].copy_from_slice(&random_bytes(STRIP_BYTES as usize, 77));
    }
    if let Err(diff) = rig.verify() {
        panic!("{level} after repairing {what:?}: {diff}");
    }
}

#[test]
fn raid5_check_finds_the_row_and_repair_recomputes_parity_from_the_data() {
    // RAID5 cannot tell which strip is wrong: the check names P, the repair trusts the data.
    let p_of_row = |_, map: &RowMap| Mismatch::Unlocated { p_member: map.p_place().unwrap().drive, q_member: None };
    check_finds_and_repairs((Level::Raid5, 4, None), Corrupt::Data { strip_index: 1, copy: 0 }, p_of_row, true);
    check_finds_and_repairs((Level::Raid5, 4, None), Corrupt::P, p_of_row, false);
    check_finds_and_repairs((Level::Raid50, 6, Some(3)), Corrupt::Data { strip_index: 0, copy: 0 }, p_of_row, true);
}

#[test]
fn raid6_check_names_the_bad_member_and_repair_restores_it() {
    let data = |member, _: &RowMap| Mismatch::Member { member, role: Role::Data { copy: 0 } };
    for strip_index in [0, 2] {
        check_finds_and_repairs((Level::Raid6, 5, None), Corrupt::Data { strip_index, copy: 0 }, data, false);
    }
    check_finds_and_repairs((Level::Raid60, 8, Some(4)), Corrupt::Data { strip_index: 1, copy: 0 }, data, false);
    check_finds_and_repairs((Level::Raid6, 6, None), Corrupt::P, |member, _| Mismatch::Member { member, role: Role::P }, false);
    check_finds_and_repairs((Level::Raid6, 6, None), Corrupt::Q, |member, _| Mismatch::Member { member, role: Role::Q }, false);
}

#[test]
fn raid6_resync_trusts_the_data_even_where_the_syndromes_locate_a_strip() {
    // After an unclean stop a dropped write to one data strip looks like a corrupt strip to P and
    // Q, but clients may already have read that strip: a resync recomputes P and Q instead.
    for (level, drive_count, per_span) in [(Level::Raid6, 5, None), (Level::Raid60, 8, Some(4))] {
        let mut rig = rig(level, drive_count, per_span);
        let row = rig.row_count() / 3;
        let (member, vd_range) = corrupt(&rig, row, Corrupt::Data { strip_index: 1, copy: 0 });
        let resynced = rig.engine.run_check_row(&rig.vd, row, CheckMode::Resync).unwrap();
        let located = Mismatch::Member { member, role: Role::Data { copy: 0 } };
        assert_eq!(resynced, CheckOutcome { row, mismatches: vec![located], repaired: true }, "{level}: found as a check finds it");
        assert_eq!(rig.check_all(CheckMode::Report), vec![], "{level}: consistent after the resync");
        rig.model[vd_range.expect("a data strip")].copy_from_slice(&random_bytes(STRIP_BYTES as usize, 77));
        if let Err(diff) = rig.verify() {
            panic!("{level}: the resync changed the data strip: {diff}");
        }
    }
}

#[test]
fn mirror_check_finds_the_differing_copies_and_repair_copies_copy_0() {
    // Nothing tells which copy is right; the repair keeps copy 0, so copy 1 is corrupted here.
    for (shape, strip_index) in [((Level::Raid1, 2, None), 0), ((Level::Raid1E, 5, None), 3), ((Level::Raid10, 4, Some(2)), 0)] {
        let copies =
            move |member, map: &RowMap| Mismatch::Copies { strip_index, members: vec![map.data_copy(strip_index, 0).drive, member] };
        check_finds_and_repairs(shape, Corrupt::Data { strip_index, copy: 1 }, copies, false);
    }
}

#[test]
fn raid6_check_with_two_bad_strips_reports_parity_it_cannot_place() {
    let mut rig = rig(Level::Raid6, 6, None);
    let row = 5;
    corrupt(&rig, row, Corrupt::Data { strip_index: 0, copy: 0 });
    corrupt(&rig, row, Corrupt::Data { strip_index: 1, copy: 0 });
    let map = rig.vd.geometry().row_map(row);
    let (p_member, q_member) = (map.p_place().unwrap().drive, map.q_place().unwrap().drive);
    let found = rig.check_all(CheckMode::Report);
    let expected = CheckOutcome { row, mismatches: vec![Mismatch::Unlocated { p_member, q_member: Some(q_member) }], repaired: false };
    assert_eq!(found, vec![expected]);
}

/// The threaded engine sends each row job to the shard that owns the row.
#[test]
fn the_threaded_engine_rebuilds_and_checks_rows_on_their_shards() {
    let mut rig = rig(Level::Raid5, 5, None);
    let engine = Engine::start(EngineConfig { shard_count: 2, ..Default::default() }).unwrap();
    rig.replace_with_blank(3);
    rig.vd.set_member_state(3, MemberState::Failed);
    let (tx, rx) = std::sync::mpsc::channel();
    for row in 0..rig.row_count() {
        let tx = tx.clone();
        engine.rebuild_row(&rig.vd, row, MemberSet::of(&[3]), Box::new(move |result| tx.send(result).unwrap()));
    }
    for _ in 0..rig.row_count() {
        assert_eq!(rx.recv().unwrap(), Ok(()));
    }
    rig.vd.set_member_state(3, MemberState::Online);
    let (tx, rx) = std::sync::mpsc::channel();
    for row in 0..rig.row_count() {
        let tx = tx.clone();
        engine.check_row(&rig.vd, row, CheckMode::Report, Box::new(move |result| tx.send(result).unwrap()));
    }
    for _ in 0..rig.row_count() {
        assert!(rx.recv().unwrap().unwrap().is_consistent());
    }
    // Row jobs count as requests in flight (a deletion waits for them) until just after `done`.
    assert!(rig.vd.wait_idle(std::time::Duration::from_secs(10)), "every row job ended");
    rig.verify().unwrap();
}

/// Checks every row in runs of 1 to `run_rows` rows in turn; returns the rows found
/// inconsistent, in order.
fn check_in_runs(rig: &mut Rig, mode: CheckMode, run_rows: u64) -> Vec<CheckOutcome> {
    let (mut row, mut length, mut found) = (0, 1, Vec::new());
    while row < rig.row_count() {
        let count = length.min(rig.row_count() - row);
        let results = rig.engine.run_check_rows(&rig.vd, row, count, mode);
        assert_eq!(results.len(), count as usize);
        for (i, result) in results.into_iter().enumerate() {
            let outcome = result.unwrap_or_else(|e| panic!("check of row {}: {e}", row + i as u64));
            assert_eq!(outcome.row, row + i as u64, "a run reports its rows in order");
            if !outcome.is_consistent() {
                found.push(outcome);
            }
        }
        row += count;
        length = length % run_rows + 1;
    }
    found
}

#[test]
fn a_check_in_runs_finds_exactly_what_row_by_row_finds_and_repairs_it() {
    for (level, drive_count, per_span, _) in REDUNDANT {
        let mut rig = rig(level, drive_count, per_span);
        // Garbage in a data strip's last copy (a mirror's second copy, a parity row's data) of
        // three rows spread over the VD.
        let corrupted: Vec<u64> = [3, rig.row_count() / 2, rig.row_count() - 2].to_vec();
        for &row in &corrupted {
            let copies = rig.vd.geometry().row_map(row).copy_count();
            corrupt(&rig, row, Corrupt::Data { strip_index: 0, copy: copies - 1 });
        }
        let by_row = rig.check_all(CheckMode::Report);
        let in_runs = check_in_runs(&mut rig, CheckMode::Report, 7);
        assert_eq!(in_runs, by_row, "{level}: runs find what rows find");
        assert_eq!(in_runs.iter().map(|o| o.row).collect::<Vec<_>>(), corrupted, "{level}: the corrupted rows, and only them");
        let repaired = check_in_runs(&mut rig, CheckMode::Repair, 5);
        assert!(repaired.iter().all(|o| o.repaired), "{level}: {repaired:?}");
        assert_eq!(check_in_runs(&mut rig, CheckMode::Report, 3), vec![], "{level}: clean after the repair in runs");
    }
}

#[test]
fn a_check_run_reads_each_member_once() {
    for (level, per_span) in [(Level::Raid6, None), (Level::Raid10, Some(2))] {
        let counting: Vec<Arc<CountingDrive>> = (0..4).map(|_| CountingDrive::over(Arc::new(MemDrive::new(MEMBER_BYTES)))).collect();
        let layout = VdLayout { level, strip_size_bytes: STRIP_BYTES, drives_per_span: per_span, member_size_bytes: None };
        let drives = counting.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
        let vd = Arc::new(VirtualDrive::new(1, "v0", layout, drives).unwrap());
        let mut engine = LocalEngine::new(CompletionOrder::Fifo);
        let results = engine.run_check_rows(&vd, 0, 8, CheckMode::Report);
        assert!(results.iter().all(|r| r.as_ref().is_ok_and(CheckOutcome::is_consistent)), "{level}: {results:?}");
        let reads: Vec<u64> = counting.iter().map(|d| d.reads()).collect();
        assert_eq!(reads, vec![1; 4], "{level}: one read per member for a run of 8 rows");
    }
}
