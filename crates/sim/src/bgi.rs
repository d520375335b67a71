//! Background initialization while clients write, as the controller runs it for a VD created
//! over members that held data: in some runs the members start full of seeded random bytes,
//! every bitmap region starts unsynced, and a BGI job walks the unsynced regions in runs of
//! rows (`CheckMode::Resync`) amid the workload, marking a region synced once all its rows are
//! done and checkpointing slot 0 of the bitmap now and then, as `controller::resync` does. A
//! crash kills the job with the engine; the restart's resync then finishes what the bitmap
//! says is left, and the checks after it (every row consistent, every byte read whole and
//! degraded) are the proof that the VD is consistent.
//!
//! The model starts from the old data as the layout places it (each data strip's first copy),
//! worked out from the members without the engine, so a BGI that rewrote data would be caught
//! by the reads.

use crate::intent::in_service_drives;
use crate::run::{Sim, SimDrive};
use engine::bitmap::control;
use engine::{CheckMode, CheckOutcome, MemberState, VdError, VirtualDrive};
use layout::Geometry;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The longest run of rows one BGI job covers here (the controller's runs are a shard's stride).
const BGI_RUN_ROWS_MAX: u64 = 4;

type BgiOutcomes = Rc<RefCell<Option<Vec<Result<CheckOutcome, VdError>>>>>;

/// The BGI of this run, while one is pending.
pub(crate) struct Bgi {
    /// Rows left per unsynced region when the walk (re)started.
    rows_left: BTreeMap<u64, u64>,
    /// The next row to submit.
    next_row: u64,
    in_flight: Option<(u64, BgiOutcomes)>,
    /// A member left service: it waits, as the controller's does, for the restart.
    halted: bool,
}

/// What BGI did in a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct BgiReport {
    /// Rows the BGI job made consistent while clients wrote.
    pub rows_done: usize,
    /// Slot 0 checkpoints written.
    pub checkpoints: usize,
    /// Regions still unsynced at a crash (the restart's resync did them).
    pub left_at_crash: u64,
    /// Every region was synced by the end of the run.
    pub completed: bool,
}

/// Fills each member's data area with seeded random bytes, durably: disks that held data.
pub(crate) fn fill_with_old_data(drives: &[SimDrive], geometry: &Geometry, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x01d_da7a);
    let (start_bytes, end_bytes) = (geometry.data_offset_bytes(), geometry.member_used_bytes());
    for drive in drives {
        let mut bytes = vec![0u8; (end_bytes - start_bytes) as usize];
        rng.fill_bytes(&mut bytes);
        submit_now(&*drive.faulty, drive::DriveOp::Write { offset_bytes: start_bytes, buf: drive::IoBuf::from_slice(&bytes) });
        crate::drive::flush_now(&*drive.faulty).expect("a blank memory drive flushes");
    }
}

/// Sectors that may read as any of several values, by sector index.
pub(crate) type Floating = BTreeMap<u64, Vec<Box<[u8]>>>;

/// The VD's contents as its members hold them: each data strip from its first copy; and the
/// sectors whose mirror copies hold other values (see `Model::with_image`).
pub(crate) fn image_of(vd: &VirtualDrive) -> (Vec<u8>, Floating) {
    let geometry = vd.geometry();
    let strip_bytes = geometry.strip_size_bytes() as usize;
    let sector_bytes = layout::SECTOR_BYTES as usize;
    let mut image = vec![0u8; vd.capacity_bytes() as usize];
    let mut floating = Floating::new();
    for row in 0..geometry.row_count() {
        let map = geometry.row_map(row);
        for strip in 0..map.data_strip_count() {
            let copies: Vec<drive::IoBuf> = (0..map.copy_count())
                .map(|copy| {
                    let place = map.data_copy(strip, copy);
                    let read = drive::DriveOp::Read { offset_bytes: place.drive_offset_bytes, buf: drive::IoBuf::zeroed(strip_bytes) };
                    submit_now(&*vd.member(place.drive).drive(), read)
                })
                .collect();
            let at = (row * geometry.row_data_bytes()) as usize + strip * strip_bytes;
            image[at..at + strip_bytes].copy_from_slice(copies[0].as_slice());
            for sector in 0..strip_bytes / sector_bytes {
                let range = sector * sector_bytes..(sector + 1) * sector_bytes;
                let mut values: Vec<Box<[u8]>> = Vec::new();
                for copy in &copies {
                    let value = &copy.as_slice()[range.clone()];
                    if !values.iter().any(|v| **v == *value) {
                        values.push(value.into());
                    }
                }
                if values.len() > 1 {
                    floating.insert(((at + range.start) / sector_bytes) as u64, values);
                }
            }
        }
    }
    (image, floating)
}

fn submit_now(drive: &dyn drive::Drive, op: drive::DriveOp) -> drive::IoBuf {
    let mut ctx = drive::IoCtx::without_ring();
    drive.submit(&mut ctx, 0, op);
    let mut done = Vec::new();
    ctx.poll(&mut done, false);
    let completion = done.pop().expect("a memory drive completes at once");
    assert_eq!(completion.result, Ok(()), "a fault-free memory drive");
    completion.buf.expect("a read or a write carries its buffer")
}

impl Bgi {
    /// The walk over what `vd`'s bitmap says is unsynced now.
    pub(crate) fn start(vd: &VirtualDrive) -> Option<Bgi> {
        let intent = vd.write_intent()?;
        let regions = intent.regions;
        let rows_left: BTreeMap<u64, u64> = intent.unsynced_regions().ones().map(|r| (r, regions.rows_of(r).count() as u64)).collect();
        let next_row = rows_left.keys().next().map(|&r| regions.rows_of(r).start)?;
        Some(Bgi { rows_left, next_row, in_flight: None, halted: false })
    }
}

impl Sim {
    /// Settles the BGI job in flight if it arrived; sometimes queues the next run of rows, and
    /// sometimes checkpoints slot 0.
    pub(crate) fn bgi_some(&mut self) -> Result<(), String> {
        let Some(mut bgi) = self.bgi.take() else { return Ok(()) };
        if let Some((first_row, outcome)) = &bgi.in_flight {
            let arrived = outcome.borrow_mut().take();
            if let Some(results) = arrived {
                let first_row = *first_row;
                bgi.in_flight = None;
                self.settle_bgi(&mut bgi, first_row, results)?;
            }
        }
        let whole = self.vd.members().iter().all(|m| m.state() == MemberState::Online);
        if bgi.halted && whole && bgi.in_flight.is_none() {
            // Every member back in service: the walk starts again over what is left, as the
            // controller starts its resyncs when a rebuild ends.
            match Bgi::start(&self.vd) {
                Some(again) => bgi = again,
                None => return Ok(()),
            }
        }
        if bgi.in_flight.is_none() && !bgi.halted && whole && self.rng.gen_range(0..100) < 30 {
            self.submit_bgi_run(&mut bgi);
        }
        if whole && bgi.in_flight.is_none() && self.rng.gen_range(0..100) < 10 {
            let intent = self.vd.write_intent().expect("a BGI has a bitmap");
            match control::checkpoint_resync(intent, &in_service_drives(&self.vd)) {
                Ok(()) => {
                    // The regions synced so far are durably so now: a crash no longer undoes
                    // the equal copies their sectors read as.
                    self.settle_floating();
                    if self.trace {
                        eprintln!("  bgi: checkpoint; synced regions' sectors settled");
                    }
                    self.bgi_report.checkpoints += 1;
                }
                Err(error) if self.faults.is_empty() => return Err(format!("a BGI checkpoint failed without faults: {error}")),
                Err(_) => {}
            }
        }
        let pending = self.vd.write_intent().is_some_and(|intent| intent.unsynced_count() > 0);
        if pending || bgi.in_flight.is_some() {
            self.bgi = Some(bgi);
        }
        Ok(())
    }

    fn submit_bgi_run(&mut self, bgi: &mut Bgi) {
        let regions = self.vd.write_intent().expect("a BGI has a bitmap").regions;
        let Some(&region) = bgi.rows_left.keys().find(|&&r| regions.rows_of(r).end > bgi.next_row) else { return };
        let rows = regions.rows_of(region);
        let first_row = bgi.next_row.max(rows.start);
        let row_count = self.rng.gen_range(1..=BGI_RUN_ROWS_MAX).min(rows.end - first_row);
        let outcome: BgiOutcomes = Rc::new(RefCell::new(None));
        let filled = Rc::clone(&outcome);
        if self.trace {
            eprintln!("  bgi: rows {first_row}..{}", first_row + row_count);
        }
        self.engine.check_rows(&self.vd, first_row, row_count, CheckMode::Resync, move |results| *filled.borrow_mut() = Some(results));
        bgi.next_row = first_row + row_count;
        bgi.in_flight = Some((first_row, outcome));
    }

    fn settle_bgi(&mut self, bgi: &mut Bgi, first_row: u64, results: Vec<Result<CheckOutcome, VdError>>) -> Result<(), String> {
        let intent = self.vd.write_intent().expect("a BGI has a bitmap");
        if self.trace {
            eprintln!("  bgi: rows from {first_row} done: {results:?}");
        }
        for (row, result) in (first_row..).zip(results) {
            match result {
                Ok(outcome) if outcome.row == row => {}
                Ok(outcome) => return Err(format!("a BGI job of row {row} reported row {}", outcome.row)),
                // A member that left meanwhile stops the walk; the regions left stay unsynced.
                Err(VdError::RowMemberOut { .. } | VdError::RowMemberIo { .. } | VdError::Offline { .. }) => {
                    bgi.halted = true;
                    return Ok(());
                }
                Err(error) => return Err(format!("BGI of row {row} failed: {error}")),
            }
            self.bgi_report.rows_done += 1;
            let region = intent.regions.region_of(row);
            let left = bgi.rows_left.get_mut(&region).expect("a BGI run stays in an unsynced region");
            *left -= 1;
            if *left == 0 {
                bgi.rows_left.remove(&region);
                intent.region_synced(region);
            }
        }
        Ok(())
    }

    /// Floating sectors of regions initialized now are settled in the model: call it only once
    /// their initialization is durable (flushed), or when no crash can follow.
    pub(crate) fn settle_floating(&mut self) {
        let Some(intent) = self.vd.write_intent() else { return };
        let sectors_per_row = self.vd.geometry().row_data_bytes() / layout::SECTOR_BYTES;
        self.model.settle_floating(|sector| !intent.row_unsynced(sector / sectors_per_row));
    }

    /// At a crash: the job dies with the engine; what is left is the restart's resync.
    pub(crate) fn bgi_at_crash(&mut self) {
        if self.bgi.take().is_some() {
            self.bgi_report.left_at_crash = self.vd.write_intent().map_or(0, |intent| intent.unsynced_count());
        }
    }

    /// At the end of the run: BGI goes on to its end while every member is in service (so
    /// that the checks after it cover every row), then says whether it completed.
    pub(crate) fn finish_bgi(&mut self) -> Result<(), String> {
        if let Some(mut bgi) = self.bgi.take() {
            loop {
                if let Some((first_row, outcome)) = bgi.in_flight.take() {
                    self.engine.run_until_idle();
                    let results = outcome.borrow_mut().take().expect("a queued BGI run completes once the engine is idle");
                    self.settle_bgi(&mut bgi, first_row, results)?;
                }
                let whole = self.vd.members().iter().all(|m| m.state() == MemberState::Online);
                if bgi.halted || !whole || bgi.rows_left.is_empty() {
                    break;
                }
                self.submit_bgi_run(&mut bgi);
                if bgi.in_flight.is_none() {
                    break;
                }
            }
        }
        self.bgi_report.completed = self.config.bgi && self.vd.write_intent().is_some_and(|intent| intent.unsynced_count() == 0);
        Ok(())
    }
}
