//! Mirror read selection: each copy keeps the sequential streams it serves.

use drive::{Drive, DriveOp, IoBuf, IoCtx, MemDrive};
use engine::{CompletionOrder, LocalEngine, VdLayout, VdRequest, VirtualDrive, MEMBER_RESERVED_BYTES};
use layout::{Level, KIB, MIB};
use std::sync::{Arc, Mutex};

/// Records the offset of every read that reaches a drive.
struct RecordingDrive {
    inner: MemDrive,
    reads: Mutex<Vec<u64>>,
}

impl Drive for RecordingDrive {
    fn info(&self) -> &drive::DriveInfo {
        self.inner.info()
    }
    fn submit(&self, ctx: &mut IoCtx, token: drive::Token, op: DriveOp) {
        if let DriveOp::Read { offset_bytes, .. } | DriveOp::ReadV { offset_bytes, .. } = &op {
            self.reads.lock().unwrap().push(*offset_bytes);
        }
        self.inner.submit(ctx, token, op)
    }
}

/// Three sequential readers take turns on a RAID1 (the review's multithreaded read, one request
/// at a time): after its first read, every read of a stream goes to the copy that served the
/// one before, so each copy's look-ahead keeps serving its own streams. Before, the copy was
/// picked by queue depth and head distance, and the streams bounced between the copies.
#[test]
fn each_sequential_stream_stays_on_the_copy_that_serves_it() {
    let drives: Vec<Arc<RecordingDrive>> = (0..2)
        .map(|_| Arc::new(RecordingDrive { inner: MemDrive::new(MEMBER_RESERVED_BYTES + 64 * MIB), reads: Mutex::new(Vec::new()) }))
        .collect();
    let layout = VdLayout { level: Level::Raid1, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
    let members = drives.iter().map(|d| Arc::clone(d) as Arc<dyn Drive>).collect();
    let vd = Arc::new(VirtualDrive::new(1, "v0", layout, members).unwrap());
    let mut engine = LocalEngine::new(CompletionOrder::Fifo);
    let pattern: Vec<u8> = (0..vd.capacity_bytes()).map(|i| (i / 512 % 251) as u8).collect();
    let done = engine.run(&vd, VdRequest::Write { offset_bytes: 0, buf: IoBuf::from_slice(&pattern) });
    assert_eq!(done.result, Ok(()));
    drives.iter().for_each(|d| d.reads.lock().unwrap().clear());

    let zone_bytes = vd.capacity_bytes() / 3;
    let block_bytes = 64 * KIB;
    let mut served_by: Vec<Vec<usize>> = vec![Vec::new(); 3];
    for index in 0..32u64 {
        for (stream, served) in served_by.iter_mut().enumerate() {
            let offset_bytes = stream as u64 * zone_bytes / block_bytes * block_bytes + index * block_bytes;
            let counts: Vec<usize> = drives.iter().map(|d| d.reads.lock().unwrap().len()).collect();
            let done = engine.run(&vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(block_bytes as usize) });
            assert_eq!(done.result, Ok(()));
            let at = offset_bytes as usize;
            assert_eq!(done.buf.unwrap().as_slice(), &pattern[at..at + block_bytes as usize], "stream {stream} read {index}");
            let copy = (0..2).find(|&c| drives[c].reads.lock().unwrap().len() > counts[c]).expect("one copy served the read");
            served.push(copy);
        }
    }
    for (stream, served) in served_by.iter().enumerate() {
        assert!(served.iter().all(|&copy| copy == served[0]), "stream {stream} moved between copies: {served:?}");
    }
}
