//! A spare takes a member's place while operations of the drive that left are still on their
//! way or not yet booked: their errors belong to the drive that left and must never fail the
//! spare being rebuilt. Each test then rebuilds the spare and reads every byte from it alone.

mod common;

use common::random_bytes;
use drive::{Drive, DriveError, DriveOp, FaultyDrive, IoBuf, IoCtx, MemDrive};
use engine::{Engine, EngineConfig, MemberSet, MemberState, VdError, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MEMBER_BYTES: u64 = MEMBER_RESERVED_BYTES + MIB;
const STRIP_BYTES: u64 = 16 * KIB;
const WAIT: Duration = Duration::from_secs(10);

/// A drive whose operations, while held, wait until the test ends them (a disk that stops
/// answering, then reports an error or answers late, as a timed-out RBD read does).
struct HeldDrive {
    inner: Arc<dyn Drive>,
    held: Mutex<Option<Vec<(drive::CompletionPort, drive::Token, DriveOp)>>>,
}

impl HeldDrive {
    fn over(inner: Arc<dyn Drive>) -> Arc<HeldDrive> {
        Arc::new(HeldDrive { inner, held: Mutex::default() })
    }

    /// Holds every operation from now on.
    fn hold(&self) {
        *self.held.lock().unwrap() = Some(Vec::new());
    }

    /// Waits until an operation is held.
    fn wait_for_one(&self) {
        let deadline = Instant::now() + WAIT;
        while self.held.lock().unwrap().as_ref().is_some_and(Vec::is_empty) {
            assert!(Instant::now() < deadline, "no operation reached the held drive");
            std::thread::yield_now();
        }
    }

    /// Fails every operation held so far with `error`; later ones go to the drive.
    fn fail_held(&self, error: DriveError) -> usize {
        let held = self.held.lock().unwrap().take().unwrap_or_default();
        let count = held.len();
        for (port, token, op) in held {
            port.complete(drive::Completion::of(token, Err(error.clone()), op));
        }
        count
    }

    /// Runs every operation held so far on the drive (a memory drive answers at once) and
    /// completes it; later ones go to the drive.
    fn release_held(&self) -> usize {
        let held = self.held.lock().unwrap().take().unwrap_or_default();
        let count = held.len();
        for (port, token, op) in held {
            let mut ctx = IoCtx::without_ring();
            self.inner.submit(&mut ctx, token, op);
            let mut completions = Vec::new();
            ctx.poll(&mut completions, false);
            port.complete(completions.pop().expect("a memory drive completes at once"));
        }
        count
    }
}

impl Drive for HeldDrive {
    fn info(&self) -> &drive::DriveInfo {
        self.inner.info()
    }

    fn submit(&self, ctx: &mut IoCtx, token: drive::Token, op: DriveOp) {
        let mut held = self.held.lock().unwrap();
        match held.as_mut() {
            Some(held) => held.push((ctx.remote_completion(), token, op)),
            None => self.inner.submit(ctx, token, op),
        }
    }
}

/// A RAID1 of `members`, written whole with random bytes; returns the VD and what it holds.
fn raid1(engine: &Engine, members: [Arc<dyn Drive>; 2]) -> (Arc<VirtualDrive>, Vec<u8>) {
    let layout = VdLayout { level: Level::Raid1, strip_size_bytes: STRIP_BYTES, drives_per_span: None, member_size_bytes: None };
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members.to_vec()).unwrap());
    let model = random_bytes(vd.capacity_bytes() as usize, 5);
    assert_eq!(engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&model) }).result, Ok(()));
    (vd, model)
}

/// Submits a 64 KiB write at 128 KiB; returns its data and where its outcome arrives.
fn submit_write(engine: &Engine, vd: &Arc<VirtualDrive>) -> (Vec<u8>, Receiver<Result<(), VdError>>) {
    let fresh = random_bytes(64 * KIB as usize, 6);
    let (sender, written) = channel();
    let request = VdRequest::Write { offset_bytes: 128 * KIB, buf: IoBuf::from_slice(&fresh) };
    engine.submit(vd, request, Box::new(move |completion| sender.send(completion.result).unwrap()));
    (fresh, written)
}

/// Member 0 leaves service and a blank spare takes its place, as the controller does.
fn swap_in_spare(vd: &VirtualDrive) {
    vd.set_member_state(0, MemberState::Failed);
    vd.start_rebuild(0, Arc::new(MemDrive::new(MEMBER_BYTES)));
}

/// Rebuilds member 0, then takes member 1 out and reads every byte from the spare alone.
fn rebuild_and_read_spare_alone(engine: &Engine, vd: &Arc<VirtualDrive>, other: &FaultyDrive, model: &[u8]) {
    let (sender, rebuilt) = channel();
    let rows = vd.geometry().row_count();
    engine.rebuild_rows(vd, 0, rows, MemberSet::of(&[0]), Box::new(move |results| sender.send(results).unwrap()));
    let results = rebuilt.recv_timeout(3 * WAIT).expect("the rebuild ends");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    vd.finish_rebuild(0);
    other.set_failed(true);
    vd.set_member_state(1, MemberState::Failed);
    let read = engine.run(vd, VdRequest::Read { offset_bytes: 0, buf: IoBuf::zeroed(model.len()) });
    assert_eq!(read.result, Ok(()));
    let got = read.buf.expect("a read returns its buffer");
    if let Some(i) = got.as_slice().iter().zip(model).position(|(a, b)| a != b) {
        panic!("the spare alone: first difference at VD byte {i}");
    }
}

/// A write that was on its way to a drive when a spare took the member's place, and failed
/// there after: its error belongs to the drive that left, so the member being rebuilt stays
/// in service (it once failed it), the write lands, and the rebuild ends with every byte
/// readable from the spare.
#[test]
fn an_error_of_a_replaced_drive_does_not_fail_the_spare_in_its_place() {
    let engine = Engine::start(EngineConfig { shard_count: 1, ..Default::default() }).unwrap();
    let held = HeldDrive::over(Arc::new(MemDrive::new(MEMBER_BYTES)));
    let other = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))));
    let (vd, mut model) = raid1(&engine, [Arc::clone(&held) as Arc<dyn Drive>, Arc::clone(&other) as Arc<dyn Drive>]);

    held.hold();
    let (fresh, written) = submit_write(&engine, &vd);
    held.wait_for_one();
    swap_in_spare(&vd);
    assert!(held.fail_held(DriveError::Io(libc::EIO)) > 0);
    assert_eq!(written.recv_timeout(WAIT).expect("the write completes"), Ok(()), "the write lands on the members in service");
    assert_eq!(vd.member(0).state(), MemberState::Rebuilding, "the old drive's error did not fail the spare");
    model[128 * KIB as usize..192 * KIB as usize].copy_from_slice(&fresh);
    rebuild_and_read_spare_alone(&engine, &vd, &other, &model);
}

/// An attempt books its members' errors once all its operations are done. Here the old drive
/// fails its copy of a mirrored write at once, the other copy's write is held, and the spare
/// takes the member's place before the attempt books: the error was the old drive's, taken
/// while it was still in place, and must not fail the spare either.
#[test]
fn an_error_booked_after_a_spare_took_the_place_does_not_fail_the_spare() {
    let engine = Engine::start(EngineConfig { shard_count: 1, ..Default::default() }).unwrap();
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))));
    let other = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(MEMBER_BYTES))));
    let held = HeldDrive::over(Arc::clone(&other) as Arc<dyn Drive>);
    let (vd, mut model) = raid1(&engine, [Arc::clone(&failing) as Arc<dyn Drive>, Arc::clone(&held) as Arc<dyn Drive>]);

    failing.set_failed(true);
    held.hold();
    let (fresh, written) = submit_write(&engine, &vd);
    held.wait_for_one();
    assert_eq!(vd.member(0).state(), MemberState::Online, "the attempt books its errors when all its operations are done");
    swap_in_spare(&vd);
    assert!(held.release_held() > 0);
    assert_eq!(written.recv_timeout(WAIT).expect("the write completes"), Ok(()), "the write lands on member 1");
    assert_eq!(vd.member(0).state(), MemberState::Rebuilding, "the old drive's error did not fail the spare");
    model[128 * KIB as usize..192 * KIB as usize].copy_from_slice(&fresh);
    rebuild_and_read_spare_alone(&engine, &vd, &other, &model);
}
