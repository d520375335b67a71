//! Devices for testing the server alone, and for other crates' tests that need an NBD export
//! without the engine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::device::{BlockDevice, Done, IoError, ReadDone};

/// A `Vec`-backed device that completes every request before returning. Trim zeroes, flush is
/// global (there is no cache), and counters record what reached it so tests can check that
/// flags were passed through.
pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
    block_size_bytes: u32,
    counters: Counters,
}

/// How many requests of each kind reached a [`MemDevice`].
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub write_zeroes: AtomicU64,
}

impl MemDevice {
    /// A zero-filled device of `size_bytes` with 512-byte blocks.
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice::with_block_size(size_bytes, 512)
    }

    /// # Panics
    /// If `size_bytes` is not a multiple of `block_size_bytes`, or does not fit in memory.
    pub fn with_block_size(size_bytes: u64, block_size_bytes: u32) -> MemDevice {
        assert!(block_size_bytes.is_power_of_two());
        assert_eq!(size_bytes % u64::from(block_size_bytes), 0, "size is whole blocks");
        let len = usize::try_from(size_bytes).expect("MemDevice fits in memory");
        MemDevice { bytes: Mutex::new(vec![0; len]), block_size_bytes, counters: Counters::default() }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A copy of `len_bytes` at `offset`, for tests to compare against.
    pub fn snapshot(&self, offset: u64, len_bytes: usize) -> Vec<u8> {
        let bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        bytes[start..start + len_bytes].to_vec()
    }

    /// Writes `data` at `offset` directly, bypassing the server.
    pub fn fill(&self, offset: u64, data: &[u8]) {
        let mut bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        bytes[start..start + data.len()].copy_from_slice(data);
    }

    /// The byte range of a request, or `Invalid` if it leaves the device: the server checks
    /// ranges first, so reaching this error means a server bug, which the tests would see.
    fn range(&self, offset: u64, len_bytes: u64) -> Result<std::ops::Range<usize>, IoError> {
        let size_bytes = self.size_bytes();
        let end = offset.checked_add(len_bytes).filter(|&end| end <= size_bytes).ok_or(IoError::Invalid)?;
        Ok(offset as usize..end as usize)
    }

    fn zero(&self, offset: u64, len_bytes: u64) -> Result<(), IoError> {
        let range = self.range(offset, len_bytes)?;
        self.bytes.lock().unwrap()[range].fill(0);
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    type Buf = Vec<u8>;

    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }

    fn block_size_bytes(&self) -> u32 {
        self.block_size_bytes
    }

    fn alloc(&self, len_bytes: usize) -> Vec<u8> {
        vec![0; len_bytes]
    }

    fn flush_is_global(&self) -> bool {
        true
    }

    fn supports_trim(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, mut buf: Vec<u8>, done: ReadDone<Vec<u8>>) {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let result = self.range(offset, buf.len() as u64).map(|range| {
            buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
            buf
        });
        done(result);
    }

    fn write(&self, offset: u64, buf: Vec<u8>, fua: bool, done: Done) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.counters.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        let result = self.range(offset, buf.len() as u64).map(|range| {
            self.bytes.lock().unwrap()[range].copy_from_slice(&buf);
        });
        done(result);
    }

    fn flush(&self, done: Done) {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        done(Ok(()));
    }

    fn trim(&self, offset: u64, len_bytes: u64, done: Done) {
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
        done(self.zero(offset, len_bytes));
    }

    fn write_zeroes(&self, offset: u64, len_bytes: u64, _fua: bool, done: Done) {
        self.counters.write_zeroes.fetch_add(1, Ordering::Relaxed);
        done(self.zero(offset, len_bytes));
    }
}
