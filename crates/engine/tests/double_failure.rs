//! A double-parity row whose write fails on two members in one attempt: both are taken out
//! before the write is retried, so the retry never rebuilds a strip from parity that the failed
//! attempt left stale (it did: a RAID6 write that lost a data strip's and P's writes rebuilt the
//! strip from the old P and wrote the garbage into Q; the simulator's seed 11464 found it).

use drive::{Drive, FaultyDrive, IoBuf, MemDrive};
use engine::{CompletionOrder, LocalEngine, MemberState, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

const STRIP_BYTES: u64 = 8 * KIB;
const DRIVES: usize = 5;

/// Whether a write succeeded, once it completed.
type Outcome = Rc<RefCell<Option<bool>>>;
const ROWS: u64 = 4;

/// Write errors over a random range of a member's data area.
fn write_errors(rng: &mut SmallRng, drive: &FaultyDrive) {
    let start = MEMBER_RESERVED_BYTES + rng.gen_range(0..ROWS * STRIP_BYTES / 512) * 512;
    let end = (start + rng.gen_range(1..32) * 512).min(MEMBER_RESERVED_BYTES + ROWS * STRIP_BYTES);
    drive.update_faults(|f| f.write_error_ranges.push(start..end));
}

#[test]
fn writes_that_fail_on_two_members_read_back_from_the_rest() {
    for seed in 0..3000u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let member_bytes = MEMBER_RESERVED_BYTES + ROWS * STRIP_BYTES;
        let drives: Vec<Arc<FaultyDrive>> =
            (0..DRIVES).map(|_| Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(member_bytes))))).collect();
        let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
        let layout = VdLayout { level: Level::Raid6, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
        let vd = Arc::new(VirtualDrive::new(1, "v", layout, members).unwrap());
        let capacity = vd.capacity_bytes();
        let mut model: Vec<u8> = (0..capacity).map(|_| rng.gen()).collect();
        let mut engine = LocalEngine::new(CompletionOrder::seeded(seed));
        assert_eq!(engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&model) }).result, Ok(()));
        // Two members at risk: one out already or failing writes too, one failing writes.
        let first = rng.gen_range(0..DRIVES);
        let second = (first + rng.gen_range(1..DRIVES)) % DRIVES;
        match rng.gen_bool(0.5) {
            true => drop(vd.set_member_state(first, MemberState::Failed)),
            false => write_errors(&mut rng, &drives[first]),
        }
        write_errors(&mut rng, &drives[second]);
        // A few writes at once that do not overlap (overlapping ones may land in either order).
        let mut writes: Vec<(u64, Vec<u8>, Outcome)> = Vec::new();
        for _ in 0..rng.gen_range(1..6) {
            let len = rng.gen_range(1..=(2 * 3 * STRIP_BYTES / 512)) * 512;
            let offset = rng.gen_range(0..=(capacity - len) / 512) * 512;
            if writes.iter().any(|(o, d, _)| offset < o + d.len() as u64 && *o < offset + len) {
                continue;
            }
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let ok = Rc::new(RefCell::new(None));
            let ok2 = Rc::clone(&ok);
            let buf = IoBuf::from_slice(&data);
            engine.submit(&vd, VdRequest::Write { offset_bytes: offset, buf }, move |c| *ok2.borrow_mut() = Some(c.result.is_ok()));
            writes.push((offset, data, ok));
        }
        engine.run_until_idle();
        for (offset, data, ok) in &writes {
            assert_eq!(*ok.borrow(), Some(true), "seed {seed}: a write within the level's tolerance succeeds");
            model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
        let read = engine.run(&vd, VdRequest::Read { offset_bytes: 0, buf: IoBuf::zeroed(capacity as usize) });
        assert_eq!(read.result, Ok(()), "seed {seed}");
        let got = read.buf.unwrap();
        let wrong = got.as_slice().iter().zip(&model).position(|(a, b)| a != b);
        assert_eq!(wrong, None, "seed {seed}: members {:?}", vd.members().iter().map(|m| m.state()).collect::<Vec<_>>());
    }
}
