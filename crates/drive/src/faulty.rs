//! Fault injection around any drive, switchable while I/O runs: the simulator and the tests use
//! it to fail whole drives, fail reads or writes in offset ranges, corrupt what a read returns,
//! and slow a drive down.

use crate::ctx::Hook;
use crate::{Completion, Drive, DriveError, DriveInfo, DriveOp, IoCtx, OpKind, Token};
use std::ops::Range;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The faults in force. Ranges are drive byte offsets; an operation that overlaps one is hit.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Every operation fails with `DriveError::Gone`, as a pulled drive does.
    pub failed: bool,
    pub read_error_ranges: Vec<Range<u64>>,
    pub write_error_ranges: Vec<Range<u64>>,
    /// Reads that overlap these succeed but return flipped bytes in the overlap.
    pub corrupt_read_ranges: Vec<Range<u64>>,
    /// Medium errors: reads that overlap one fail with EIO until a write covers its sectors,
    /// which the drive then remaps (they read again, with what was written), as a disk does
    /// with a pending sector.
    pub medium_error_ranges: Vec<Range<u64>>,
    /// Added to every completion.
    pub latency: Option<Duration>,
}

pub struct FaultyDrive {
    inner: Arc<dyn Drive>,
    faults: RwLock<Faults>,
}

impl FaultyDrive {
    pub fn new(inner: Arc<dyn Drive>) -> FaultyDrive {
        FaultyDrive { inner, faults: RwLock::new(Faults::default()) }
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.faults.write().expect("faults lock poisoned") = faults;
    }

    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.faults.write().expect("faults lock poisoned"));
    }

    pub fn faults(&self) -> Faults {
        self.faults.read().expect("faults lock poisoned").clone()
    }

    /// Fails the whole drive (true) or brings it back (false).
    pub fn set_failed(&self, failed: bool) {
        self.update_faults(|f| f.failed = failed);
    }

    pub fn inner(&self) -> &Arc<dyn Drive> {
        &self.inner
    }
}

fn overlaps(ranges: &[Range<u64>], start: u64, len: u64) -> bool {
    ranges.iter().any(|r| r.start < start + len && start < r.end)
}

impl Drive for FaultyDrive {
    fn info(&self) -> &DriveInfo {
        self.inner.info()
    }

    /// What the drive under it says, unless reads of the range are made to fail or return
    /// corrupted bytes (then what a read returns is not known to be zero).
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let faults = self.faults.read().expect("faults lock poisoned");
        let touched = |ranges: &[Range<u64>]| overlaps(ranges, offset_bytes, len_bytes);
        !faults.failed
            && !touched(&faults.read_error_ranges)
            && !touched(&faults.medium_error_ranges)
            && !touched(&faults.corrupt_read_ranges)
            && self.inner.reads_zero(offset_bytes, len_bytes)
    }

    /// A write the drive lets through is the inner drive's, durable as it is.
    fn writes_durable(&self) -> bool {
        self.inner.writes_durable()
    }

    fn close(&self) {
        self.inner.close();
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        let (start, len) = op.range_bytes().unwrap_or((0, 0));
        // Checked under the read lock first: every write of the simulator comes through here.
        let remaps =
            op.kind() == OpKind::Write && overlaps(&self.faults.read().expect("faults lock poisoned").medium_error_ranges, start, len);
        if remaps {
            self.update_faults(|faults| faults.medium_error_ranges = remapped(&faults.medium_error_ranges, start..start + len));
        }
        let faults = self.faults.read().expect("faults lock poisoned");
        let error = match op.kind() {
            _ if faults.failed => Some(DriveError::Gone),
            OpKind::Read if overlaps(&faults.read_error_ranges, start, len) => Some(DriveError::Io(libc::EIO)),
            OpKind::Read if overlaps(&faults.medium_error_ranges, start, len) => Some(DriveError::Io(libc::EIO)),
            OpKind::Write if overlaps(&faults.write_error_ranges, start, len) => Some(DriveError::Io(libc::EIO)),
            _ => None,
        };
        if let Some(latency) = faults.latency {
            ctx.add_hook(token, Hook::Delay(latency));
        }
        if let Some(error) = error {
            drop(faults);
            return ctx.complete(Completion::of(token, Err(error), op));
        }
        if op.kind() == OpKind::Read && overlaps(&faults.corrupt_read_ranges, start, len) {
            let ranges = faults.corrupt_read_ranges.clone();
            ctx.add_hook(token, Hook::Transform(Box::new(move |c: &mut Completion| corrupt(c, start, &ranges))));
        }
        drop(faults);
        self.inner.submit(ctx, token, op);
    }
}

/// `ranges` without what `written` covers: the sectors a write remapped.
fn remapped(ranges: &[Range<u64>], written: Range<u64>) -> Vec<Range<u64>> {
    let mut left = Vec::new();
    for range in ranges {
        if range.start < written.start {
            left.push(range.start..range.end.min(written.start));
        }
        if range.end > written.end {
            left.push(range.start.max(written.end)..range.end);
        }
    }
    left.retain(|range| !range.is_empty());
    left
}

/// Flips every byte of a successful read that falls in a corrupt range.
fn corrupt(completion: &mut Completion, start: u64, ranges: &[Range<u64>]) {
    if completion.result.is_err() {
        return;
    }
    let mut at = start;
    for buf in completion.buf.iter_mut().chain(completion.bufs.iter_mut()) {
        let len = buf.len() as u64;
        for range in ranges {
            let from = range.start.max(at);
            let to = range.end.min(at + len);
            if from < to {
                buf.as_mut_slice()[(from - at) as usize..(to - at) as usize].iter_mut().for_each(|b| *b ^= 0xA5);
            }
        }
        at += len;
    }
}
