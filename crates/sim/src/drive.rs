//! A member drive with a volatile write cache, as a disk with its write cache on: a write is
//! acknowledged when the drive holds it, and only FLUSH makes it durable.
//!
//! The drive keeps its durable image and, next to it, the writes it has not been told to flush,
//! in arrival order. Reads see the newest data. [`VolatileDrive::crash`] is a power cut: each
//! unflushed write is dropped, kept, or torn (each of its 512-byte sectors kept or dropped on its
//! own), chosen from the seed, and the drive is left holding only what survived.

use drive::{check_op_range, Completion, Drive, DriveInfo, DriveKind, DriveOp, IoBuf, IoCtx, Token};
use layout::SECTOR_BYTES;
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::Mutex;

/// Allocation unit of [`SparseBytes`]: members are mostly the untouched metadata area.
const CHUNK_BYTES: usize = 64 << 10;

/// Compared against (a memcmp) to find writes of zeros.
static ZEROS: [u8; CHUNK_BYTES] = [0; CHUNK_BYTES];

/// Bytes allocated in chunks on first write; unwritten bytes read as zeros.
#[derive(Clone)]
struct SparseBytes {
    chunks: Vec<Option<Box<[u8]>>>,
}

impl SparseBytes {
    fn new(capacity_bytes: u64) -> SparseBytes {
        SparseBytes { chunks: vec![None; (capacity_bytes as usize).div_ceil(CHUNK_BYTES)] }
    }

    fn read(&self, offset_bytes: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let (index, at, len) = self.piece(offset_bytes, done, out.len());
            match &self.chunks[index] {
                Some(chunk) => out[done..done + len].copy_from_slice(&chunk[at..at + len]),
                None => out[done..done + len].fill(0),
            }
            done += len;
        }
    }

    fn write(&mut self, offset_bytes: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let (index, at, len) = self.piece(offset_bytes, done, data.len());
            // Zeros onto a chunk never written change nothing: the bitmap's slots are written
            // whole and mostly empty, and allocating them would cost every crash a copy.
            if self.chunks[index].is_none() && data[done..done + len] == ZEROS[..len] {
                done += len;
                continue;
            }
            let chunk = self.chunks[index].get_or_insert_with(|| vec![0; CHUNK_BYTES].into_boxed_slice());
            chunk[at..at + len].copy_from_slice(&data[done..done + len]);
            done += len;
        }
    }

    /// The chunk, offset in it and length of the part of a copy that starts `done` bytes in.
    fn piece(&self, offset_bytes: u64, done: usize, total: usize) -> (usize, usize, usize) {
        let offset = offset_bytes as usize + done;
        let (index, at) = (offset / CHUNK_BYTES, offset % CHUNK_BYTES);
        (index, at, (CHUNK_BYTES - at).min(total - done))
    }
}

/// A write the drive holds but has not made durable.
struct UnflushedWrite {
    offset_bytes: u64,
    data: Vec<u8>,
}

struct CacheState {
    /// What survives a power cut.
    durable: SparseBytes,
    /// What reads see: `durable` with every unflushed write applied in order.
    newest: SparseBytes,
    unflushed: Vec<UnflushedWrite>,
}

/// What a crash did to the unflushed writes of one drive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashTally {
    pub dropped: usize,
    pub kept: usize,
    pub torn: usize,
}

impl CrashTally {
    pub fn add(&mut self, other: CrashTally) {
        self.dropped += other.dropped;
        self.kept += other.kept;
        self.torn += other.torn;
    }
}

/// A memory drive with a volatile write cache (see the module).
pub struct VolatileDrive {
    info: DriveInfo,
    state: Mutex<CacheState>,
    /// Reads of the data area (past the metadata) served, ever: which drives client reads and
    /// row jobs read, and when (an assembly's metadata and bitmap reads do not count).
    data_reads: std::sync::atomic::AtomicU64,
}

impl VolatileDrive {
    pub fn new(capacity_bytes: u64) -> VolatileDrive {
        let info = DriveInfo {
            name: format!("volatile:{capacity_bytes}"),
            kind: DriveKind::Memory,
            capacity_bytes,
            direct_io: true,
            solid_state: false,
        };
        let empty = SparseBytes::new(capacity_bytes);
        let state = Mutex::new(CacheState { durable: empty.clone(), newest: empty, unflushed: Vec::new() });
        VolatileDrive { info, state, data_reads: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Reads of the data area served so far.
    pub fn data_reads(&self) -> u64 {
        self.data_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the drive holds and has not made durable.
    pub fn unflushed_count(&self) -> usize {
        self.lock().unflushed.len()
    }

    /// A power cut: every unflushed write is dropped, kept or torn per sector, as `rng` says;
    /// afterwards the drive holds its durable image only.
    pub fn crash(&self, rng: &mut SmallRng) -> CrashTally {
        let mut state = self.lock();
        let mut tally = CrashTally::default();
        for write in std::mem::take(&mut state.unflushed) {
            match rng.gen_range(0..3) {
                0 => tally.dropped += 1,
                1 => {
                    tally.kept += 1;
                    state.durable.write(write.offset_bytes, &write.data);
                }
                _ => {
                    tally.torn += 1;
                    for (index, sector) in write.data.chunks(SECTOR_BYTES as usize).enumerate() {
                        if rng.gen_bool(0.5) {
                            state.durable.write(write.offset_bytes + index as u64 * SECTOR_BYTES, sector);
                        }
                    }
                }
            }
        }
        state.newest = state.durable.clone();
        tally
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().expect("volatile drive lock poisoned")
    }

    fn read(&self, offset_bytes: u64, bufs: &mut [&mut IoBuf]) {
        if offset_bytes >= engine::MEMBER_RESERVED_BYTES {
            self.data_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let state = self.lock();
        let mut at = offset_bytes;
        for buf in bufs {
            state.newest.read(at, buf.as_mut_slice());
            at += buf.len() as u64;
        }
    }

    /// Applies a write to what reads see and keeps it aside until a flush.
    fn write(&self, offset_bytes: u64, bufs: &[&IoBuf]) {
        let mut data = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        bufs.iter().for_each(|b| data.extend_from_slice(b.as_slice()));
        let mut state = self.lock();
        state.newest.write(offset_bytes, &data);
        state.unflushed.push(UnflushedWrite { offset_bytes, data });
    }

    /// Makes every write that arrived before the flush durable.
    fn flush(&self) {
        let mut state = self.lock();
        for write in std::mem::take(&mut state.unflushed) {
            state.durable.write(write.offset_bytes, &write.data);
        }
    }
}

impl Drive for VolatileDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    /// Completes at once; the simulator's executor chooses when the completion is delivered.
    fn submit(&self, ctx: &mut IoCtx, token: Token, mut op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        match &mut op {
            DriveOp::Read { offset_bytes, buf } => self.read(*offset_bytes, &mut [buf]),
            DriveOp::ReadV { offset_bytes, bufs } => self.read(*offset_bytes, &mut bufs.iter_mut().collect::<Vec<_>>()),
            DriveOp::Write { offset_bytes, buf } => self.write(*offset_bytes, &[buf]),
            DriveOp::WriteV { offset_bytes, bufs } => self.write(*offset_bytes, &bufs.iter().collect::<Vec<_>>()),
            DriveOp::Flush => self.flush(),
        }
        ctx.complete(Completion::of(token, Ok(()), op));
    }
}

/// Flushes `drive` from outside the engine and waits: what the controller's checkpoint does.
///
/// # Errors
/// What the drive reported.
pub fn flush_now(drive: &dyn Drive) -> Result<(), drive::DriveError> {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Flush);
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    completions.pop().expect("a memory drive completes at once").result
}

/// Writes `data` to `drive` from outside the engine and waits: a change on the media that no
/// VD made (a strip gone bad).
///
/// # Errors
/// What the drive reported.
pub fn write_now(drive: &dyn Drive, offset_bytes: u64, data: &[u8]) -> Result<(), drive::DriveError> {
    let mut ctx = IoCtx::without_ring();
    drive.submit(&mut ctx, 0, DriveOp::Write { offset_bytes, buf: IoBuf::from_slice(data) });
    let mut completions = Vec::new();
    ctx.poll(&mut completions, false);
    completions.pop().expect("a memory drive completes at once").result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn write(drive: &VolatileDrive, offset_bytes: u64, byte: u8, sectors: usize) {
        drive.write(offset_bytes, &[&IoBuf::from_slice(&vec![byte; sectors * SECTOR_BYTES as usize])]);
    }

    fn sectors(drive: &VolatileDrive, offset_bytes: u64, count: usize) -> Vec<u8> {
        let mut buf = IoBuf::zeroed(count * SECTOR_BYTES as usize);
        drive.read(offset_bytes, &mut [&mut buf]);
        buf.as_slice().chunks(SECTOR_BYTES as usize).map(|s| s[0]).collect()
    }

    #[test]
    fn reads_see_the_newest_write_and_a_crash_keeps_what_was_flushed() {
        let drive = VolatileDrive::new(1 << 20);
        write(&drive, 0, 1, 4);
        flush_now(&drive).unwrap();
        write(&drive, 0, 2, 4);
        assert_eq!(sectors(&drive, 0, 4), [2, 2, 2, 2]);
        assert_eq!(drive.unflushed_count(), 1);
        // A crash of a drive whose flushed write was overwritten: each sector is old or new.
        let tally = drive.crash(&mut SmallRng::seed_from_u64(7));
        assert_eq!(tally.dropped + tally.kept + tally.torn, 1);
        assert!(sectors(&drive, 0, 4).iter().all(|&s| s == 1 || s == 2));
        assert_eq!(drive.unflushed_count(), 0);
    }

    #[test]
    fn crashes_drop_keep_and_tear_writes_per_sector() {
        let mut seen = CrashTally::default();
        let mut mixed_sectors = false;
        for seed in 0..64 {
            let drive = VolatileDrive::new(1 << 20);
            write(&drive, 0, 9, 16);
            let tally = drive.crash(&mut SmallRng::seed_from_u64(seed));
            let after = sectors(&drive, 0, 16);
            assert!(after.iter().all(|&s| s == 0 || s == 9), "a sector holds its old or its new contents");
            match (tally.dropped, tally.kept) {
                (1, _) => assert!(after.iter().all(|&s| s == 0)),
                (_, 1) => assert!(after.iter().all(|&s| s == 9)),
                _ => mixed_sectors |= after.contains(&0) && after.contains(&9),
            }
            seen.add(tally);
        }
        assert!(seen.dropped > 0 && seen.kept > 0 && seen.torn > 0, "{seen:?}");
        assert!(mixed_sectors, "some torn write kept part of its sectors");
    }
}
