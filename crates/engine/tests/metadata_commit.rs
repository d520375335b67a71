//! Configuration changes and member failures against a crash at every point of their metadata
//! writes (regression tests for issue 8, part 1).
//!
//! A crash is modelled by a drive wrapper that stops writing metadata after a chosen number of
//! metadata writes across all drives (or tears the write at that point), as a daemon killed
//! mid-change leaves its drives. The controller is then dropped without a shutdown and a new one
//! assembles from the drives alone.

mod common;

use common::{engine, pattern, spec};
use drive::{Completion, Drive, DriveInfo, DriveOp, Faults, FaultyDrive, IoBuf, IoCtx, MemDrive, Token};
use engine::config::{ControllerConfig, ControllerId, DriveState, WritePolicy};
use engine::controller::{Controller, ControllerOptions, OfferedDrive, VdChanges};
use engine::metadata::{self, BITMAP_AREA_OFFSET_BYTES, METADATA_AREA_BYTES};
use engine::{Engine, VdState};
use layout::{Level, MIB};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DRIVE_BYTES: u64 = 64 * MIB;
const DRIVE_COUNT: usize = 8;
const DATA_BYTES: usize = 1 << 20;

/// Metadata writes (across all drives) that still happen before the crash; then nothing more is
/// written, except that with `torn` the write at the crash point lands half.
struct CrashPoint {
    writes_left: AtomicI64,
    torn: bool,
}

impl CrashPoint {
    fn never() -> Arc<CrashPoint> {
        Arc::new(CrashPoint { writes_left: AtomicI64::new(i64::MAX), torn: false })
    }
    fn after(writes: i64, torn: bool) -> Arc<CrashPoint> {
        Arc::new(CrashPoint { writes_left: AtomicI64::new(writes), torn })
    }
    fn writes_done(&self) -> i64 {
        i64::MAX - self.writes_left.load(Ordering::SeqCst)
    }
}

struct CrashDrive {
    inner: Arc<dyn Drive>,
    point: Arc<CrashPoint>,
}

impl Drive for CrashDrive {
    fn info(&self) -> &DriveInfo {
        self.inner.info()
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        let DriveOp::Write { offset_bytes, buf } = op else { return self.inner.submit(ctx, token, op) };
        // The configuration's copies only: the bitmap after them is written by the data path.
        if offset_bytes >= BITMAP_AREA_OFFSET_BYTES {
            return self.inner.submit(ctx, token, DriveOp::Write { offset_bytes, buf });
        }
        match self.point.writes_left.fetch_sub(1, Ordering::SeqCst) {
            1.. => self.inner.submit(ctx, token, DriveOp::Write { offset_bytes, buf }),
            0 if self.point.torn => {
                // Half of the write reaches the medium; the process dies before the rest.
                let half_bytes = (buf.len() / 2).next_multiple_of(512);
                let half = IoBuf::from_slice(&buf.as_slice()[..half_bytes]);
                self.inner.submit(ctx, token, DriveOp::Write { offset_bytes, buf: half });
            }
            // After the crash nothing reaches the drives; the dead process sees "success".
            _ => ctx.complete(Completion::of(token, Ok(()), DriveOp::Write { offset_bytes, buf })),
        }
    }
}

fn open(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], point: &Arc<CrashPoint>, ours: Option<ControllerId>) -> Arc<Controller> {
    let offered = drives
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let drive: Arc<dyn Drive> = Arc::new(CrashDrive { inner: Arc::clone(d), point: Arc::clone(point) });
            OfferedDrive { drive, source: format!("mem{i}") }
        })
        .collect();
    Controller::open(Arc::clone(engine), offered, ControllerOptions { ours, ..ControllerOptions::default() }).unwrap()
}

/// The starting point of every case: RAID5 `db` on slots 0-4 holding data, RAID1 `logs` on
/// slots 5-6, slot 7 unconfigured good (or a global hot spare with `spare`). Cleanly stopped.
fn setup(engine: &Arc<Engine>, spare: bool) -> (Vec<Arc<dyn Drive>>, ControllerId) {
    let drives: Vec<Arc<dyn Drive>> = (0..DRIVE_COUNT).map(|_| Arc::new(MemDrive::new(DRIVE_BYTES)) as Arc<dyn Drive>).collect();
    let controller = open(engine, &drives, &CrashPoint::never(), None);
    controller.create_vd(spec(Level::Raid5, &[0, 1, 2, 3, 4], "db")).unwrap();
    controller.create_vd(spec(Level::Raid1, &[5, 6], "logs")).unwrap();
    if spare {
        controller.add_hot_spare(7, vec![]).unwrap();
    }
    let (_, vd) = controller.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(DATA_BYTES, 1)).unwrap();
    let id = controller.config().controller_id;
    controller.shutdown();
    (drives, id)
}

/// One kind of configuration change: its name, whether it starts from a spare, what it does,
/// and how to tell the old configuration from the new.
struct Change {
    name: &'static str,
    spare: bool,
    apply: fn(&Controller),
    is_new: fn(&ControllerConfig) -> bool,
}

fn changes() -> Vec<Change> {
    vec![
        Change {
            name: "rename",
            spare: false,
            apply: |c| drop(c.set_vd(0, VdChanges { name: Some("renamed".into()), ..VdChanges::default() })),
            is_new: |c| c.vds.iter().any(|v| v.name == "renamed"),
        },
        Change {
            name: "set write policy",
            spare: false,
            apply: |c| drop(c.set_vd(0, VdChanges { write_policy: Some(WritePolicy::WriteBack), ..VdChanges::default() })),
            is_new: |c| c.vds[0].write_policy == WritePolicy::WriteBack,
        },
        Change {
            name: "add hot spare",
            spare: false,
            apply: |c| drop(c.add_hot_spare(7, vec![])),
            is_new: |c| c.hot_spares.iter().any(|h| h.slot == 7),
        },
        Change { name: "delete hot spare", spare: true, apply: |c| drop(c.delete_hot_spare(7)), is_new: |c| c.hot_spares.is_empty() },
        Change {
            name: "create VD",
            spare: false,
            apply: |c| drop(c.create_vd(spec(Level::Raid0, &[7], "scratch"))),
            is_new: |c| c.vds.len() == 3,
        },
        Change { name: "delete VD", spare: false, apply: |c| drop(c.delete_vd(1, false, false)), is_new: |c| c.vds.len() == 1 },
    ]
}

/// After a crash: every VD assembles Optimal, every member that was in service is, the
/// configuration is the old or the new one, and the data written before is intact.
fn check_assembly(engine: &Arc<Engine>, drives: &[Arc<dyn Drive>], id: ControllerId, change: &Change, case: &str) -> bool {
    let controller = open(engine, drives, &CrashPoint::never(), Some(id));
    let config = controller.config();
    for (record, vd) in controller.vds() {
        assert_eq!(vd.state(), VdState::Optimal, "{case}: v{} is {:?}; events: {:?}", record.vd_id, vd.state(), descriptions(&controller));
        for slot in &record.member_slots {
            assert_eq!(controller.slot(*slot).unwrap().state, DriveState::Online, "{case}: slot {slot} of v{}", record.vd_id);
        }
    }
    let new = (change.is_new)(&config);
    let (_, vd) = controller.vd(0).unwrap();
    let data = engine.read_at(&vd, 0, DATA_BYTES).unwrap();
    assert!(data.as_slice() == pattern(DATA_BYTES, 1).as_slice(), "{case}: data of v0 changed");
    controller.shutdown();
    new
}

fn descriptions(controller: &Controller) -> Vec<String> {
    controller.events().into_iter().map(|e| e.description).collect()
}

/// Regression: kill -9 while renaming a VD or changing a hot spare brought a RAID5 back offline
/// for good: one member had the new generation, the others the previous one, and assembly failed
/// every member older than the newest.
#[test]
fn a_crash_at_any_point_of_a_configuration_change_assembles_the_old_or_the_new_configuration() {
    let engine = engine();
    for change in changes() {
        // How many metadata writes the change makes when nothing crashes.
        let (drives, id) = setup(&engine, change.spare);
        let counting = CrashPoint::never();
        let controller = open(&engine, &drives, &counting, Some(id));
        let before_change = counting.writes_done();
        (change.apply)(&controller);
        let change_writes = counting.writes_done() - before_change;
        assert!(change_writes >= 2 * DRIVE_COUNT as i64 - 2, "{}: {change_writes} metadata writes", change.name);
        drop(controller);

        let mut outcomes = [0usize; 2];
        for crash_after in 0..=change_writes {
            for torn in [false, true] {
                let (drives, id) = setup(&engine, change.spare);
                let point = CrashPoint::after(i64::MAX, torn);
                let controller = open_armed(&engine, &drives, id, &point, crash_after);
                (change.apply)(&controller);
                drop(controller); // the crash: no shutdown, nothing more written
                let case = format!("{} crashed after {crash_after} of {change_writes} metadata writes (torn: {torn})", change.name);
                let new = check_assembly(&engine, &drives, id, &change, &case);
                outcomes[usize::from(new)] += 1;
            }
        }
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{}: both the old and the new configuration occur: {outcomes:?}", change.name);
    }
}

/// Opens normally (opening writes metadata too), then arms `point` so that the next change
/// crashes after `crash_after` metadata writes.
fn open_armed(
    engine: &Arc<Engine>,
    drives: &[Arc<dyn Drive>],
    id: ControllerId,
    point: &Arc<CrashPoint>,
    crash_after: i64,
) -> Arc<Controller> {
    let controller = open(engine, drives, point, Some(id));
    point.writes_left.store(crash_after, Ordering::SeqCst);
    controller
}

/// Metadata writes that take `delay_ms` each, or fail: a controller slow (or unable) to record.
struct SlowMetadata {
    inner: Arc<dyn Drive>,
    delay_ms: std::sync::atomic::AtomicU64,
    fail: std::sync::atomic::AtomicBool,
}

impl Drive for SlowMetadata {
    fn info(&self) -> &DriveInfo {
        self.inner.info()
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if matches!(op, DriveOp::Write { offset_bytes, .. } if offset_bytes < BITMAP_AREA_OFFSET_BYTES) {
            if self.fail.load(Ordering::SeqCst) {
                return ctx.fail(token, drive::DriveError::Io(libc::EIO), op);
            }
            // Metadata is written from the control plane, never a shard: sleeping here delays
            // only the controller's record.
            std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::SeqCst)));
        }
        self.inner.submit(ctx, token, op)
    }
}

/// A RAID1 whose member 0 fails its next data write and whose member 1 records metadata through
/// `SlowMetadata`.
fn mirror_with_a_failing_member(engine: &Arc<Engine>) -> (Arc<Controller>, Arc<FaultyDrive>, Arc<SlowMetadata>, Arc<dyn Drive>) {
    let failing = Arc::new(FaultyDrive::new(Arc::new(MemDrive::new(DRIVE_BYTES))));
    let survivor_mem: Arc<dyn Drive> = Arc::new(MemDrive::new(DRIVE_BYTES));
    let survivor = Arc::new(SlowMetadata {
        inner: Arc::clone(&survivor_mem),
        delay_ms: std::sync::atomic::AtomicU64::new(0),
        fail: std::sync::atomic::AtomicBool::new(false),
    });
    let drives: Vec<Arc<dyn Drive>> = vec![failing.clone(), survivor.clone()];
    let controller = open(engine, &drives, &CrashPoint::never(), None);
    controller.create_vd(spec(Level::Raid1, &[0, 1], "mirror")).unwrap();
    failing.set_faults(Faults { write_error_ranges: std::iter::once(METADATA_AREA_BYTES..DRIVE_BYTES).collect(), ..Faults::default() });
    (controller, failing, survivor, survivor_mem)
}

/// Regression: a write that went on without a failed member was acknowledged before the
/// controller had recorded the failure, so a crash in between brought the member back in
/// service with stale data under an acknowledged write.
#[test]
fn a_write_that_skipped_a_failed_member_is_acknowledged_only_once_the_failure_is_recorded() {
    let engine = engine();
    let (controller, _failing, survivor, survivor_mem) = mirror_with_a_failing_member(&engine);
    survivor.delay_ms.store(150, Ordering::SeqCst);
    let (_, vd) = controller.vd(0).unwrap();
    engine.write_at(&vd, 0, &pattern(64 << 10, 2)).unwrap();
    // The acknowledgement came: the survivor's metadata must already say slot 0 failed.
    let on_disk = metadata::read(&*survivor_mem).unwrap().unwrap().superblock.config;
    let slot0 = on_disk.drives.iter().find(|d| d.slot == 0).unwrap();
    assert_eq!(slot0.state, DriveState::Failed, "recorded before the write was acknowledged");
    assert_eq!(vd.state(), VdState::Degraded);
    assert!(engine.read_at(&vd, 0, 64 << 10).unwrap().as_slice() == pattern(64 << 10, 2).as_slice());
}

#[test]
fn writes_fail_while_a_member_failure_cannot_be_recorded_and_recover_once_it_is() {
    let engine = engine();
    let (controller, _failing, survivor, _) = mirror_with_a_failing_member(&engine);
    survivor.fail.store(true, Ordering::SeqCst);
    let (_, vd) = controller.vd(0).unwrap();
    let error = engine.write_at(&vd, 0, &pattern(4096, 3)).unwrap_err();
    assert!(error.to_string().contains("could not be recorded"), "{error}");
    let error = engine.write_at(&vd, 8192, &pattern(4096, 4)).unwrap_err();
    assert!(error.to_string().contains("could not be recorded"), "later writes are refused too: {error}");
    // Reads go on: nothing is wrong with the data that is there.
    engine.read_at(&vd, 0, 4096).unwrap();
    // Once the metadata can be written again, the next change records everything.
    survivor.fail.store(false, Ordering::SeqCst);
    controller.set_vd(0, VdChanges { name: Some("mirror2".into()), ..VdChanges::default() }).unwrap();
    engine.write_at(&vd, 0, &pattern(4096, 5)).unwrap();
    assert!(engine.read_at(&vd, 0, 4096).unwrap().as_slice() == pattern(4096, 5).as_slice());
}
