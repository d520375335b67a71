//! What a benchmark drives.

use drive::{Drive, DriveOp, IoBuf};
use engine::{Engine, VdRequest, VirtualDrive};
use std::sync::Arc;

/// Called once per I/O with its outcome and the buffer back.
pub type IoDone = Box<dyn FnOnce(Result<(), String>, IoBuf) + Send>;

pub trait Target: Send + Sync {
    /// What is being measured, for reports (`RAID5 over 8 drives`, `mem:1GiB raw`).
    fn describe(&self) -> String;
    fn capacity_bytes(&self) -> u64;
    fn submit(&self, write: bool, offset_bytes: u64, buf: IoBuf, done: IoDone);

    /// Flushes what the target holds, and waits: run between points, untimed, so that a point
    /// does not pay for the writes of the one before (a drive's write cache still destaging).
    /// Targets this process does not own (NBD) are left as they are.
    fn settle(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A virtual drive served by an engine in this process.
pub struct VdTarget {
    pub engine: Arc<Engine>,
    pub vd: Arc<VirtualDrive>,
}

impl Target for VdTarget {
    fn describe(&self) -> String {
        let g = self.vd.geometry();
        format!("{} over {} drives, strip {} KiB", g.level(), g.drive_count(), g.strip_size_bytes() / 1024)
    }

    fn capacity_bytes(&self) -> u64 {
        self.vd.capacity_bytes()
    }

    fn submit(&self, write: bool, offset_bytes: u64, buf: IoBuf, done: IoDone) {
        let request = match write {
            true => VdRequest::Write { offset_bytes, buf },
            false => VdRequest::Read { offset_bytes, buf },
        };
        self.engine.submit(
            &self.vd,
            request,
            Box::new(move |completion| {
                let buf = completion.buf.expect("reads and writes return their buffer");
                done(completion.result.map_err(|e| e.to_string()), buf)
            }),
        );
    }

    fn settle(&self) -> Result<(), String> {
        self.engine.run(&self.vd, VdRequest::Flush).result.map_err(|e| e.to_string())
    }
}

/// One member drive driven directly through the engine's shards, past every RAID layer, over
/// the same area a VD would use (after the metadata reserve).
pub struct RawDriveTarget {
    pub engine: Arc<Engine>,
    pub drive: Arc<dyn Drive>,
    /// Which shard submits; spread drives over shards as a VD spreads rows.
    pub shard: usize,
    pub data_offset_bytes: u64,
}

impl Target for RawDriveTarget {
    fn describe(&self) -> String {
        format!("{} raw", self.drive.info().name)
    }

    fn capacity_bytes(&self) -> u64 {
        self.drive.info().capacity_bytes - self.data_offset_bytes
    }

    fn submit(&self, write: bool, offset_bytes: u64, buf: IoBuf, done: IoDone) {
        let offset_bytes = offset_bytes + self.data_offset_bytes;
        let op = match write {
            true => DriveOp::Write { offset_bytes, buf },
            false => DriveOp::Read { offset_bytes, buf },
        };
        self.engine.submit_raw(
            self.shard,
            &self.drive,
            op,
            Box::new(move |completion| {
                let buf = completion.buf.expect("reads and writes return their buffer");
                done(completion.result.map_err(|e| e.to_string()), buf)
            }),
        );
    }

    fn settle(&self) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move |completion: drive::Completion| {
            let _ = tx.send(completion.result.map_err(|e| e.to_string()));
        });
        self.engine.submit_raw(self.shard, &self.drive, DriveOp::Flush, done);
        rx.recv().map_err(|_| "the engine stopped before the flush completed".to_string())?
    }
}
