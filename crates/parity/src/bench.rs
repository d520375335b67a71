//! Throughput measurement of the parity kernels, for `storc bench parity`.
//!
//! Bytes are counted as `data_strips * strip_bytes` per call (the data a stripe
//! write or rebuild covers), whatever the op reads or writes besides. Each
//! repetition batches enough calls to last `repetition_min`; the median
//! repetition is reported, which shrugs off a noisy neighbour better than a mean.
//! The stripe is one page-aligned buffer with the strips back to back, as an
//! engine's O_DIRECT stripe buffer would be.

use crate::kernels::{self, Kernels};
use std::alloc::{self, Layout};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub data_strips: usize,
    pub strip_bytes: usize,
    /// Timed repetitions; the median is reported.
    pub repetitions: usize,
    /// Each repetition repeats the call until at least this much time has passed.
    pub repetition_min: Duration,
    /// Measure every kernel set this CPU supports, not only the one in use.
    pub all_kernels: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self { data_strips: 8, strip_bytes: 64 * 1024, repetitions: 9, repetition_min: Duration::from_millis(20), all_kernels: false }
    }
}

/// One measured (op, kernel set) pair.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// "xor_gen", "pq_gen", "raid6_recover_2data" or "raid5_recover".
    pub op: &'static str,
    pub kernel: &'static str,
    pub data_strips: usize,
    pub strip_bytes: usize,
    /// Median over the repetitions, counting `data_strips * strip_bytes` per call.
    pub bytes_per_sec: f64,
    /// Timed calls, all repetitions together.
    pub iterations: u64,
}

/// The ops `run` measures, in order.
pub const OPS: [&str; 4] = ["xor_gen", "pq_gen", "raid6_recover_2data", "raid5_recover"];

/// Measures every op in [`OPS`] with the configured kernel sets.
///
/// # Panics
/// If `data_strips` is not in 2..=255, `strip_bytes` is not a positive multiple of
/// 64, or `repetitions` is 0.
pub fn run(config: &BenchConfig) -> Vec<BenchResult> {
    assert!((2..=kernels::DATA_MEMBERS_MAX).contains(&config.data_strips), "bench: data_strips must be 2..=255");
    assert!(config.strip_bytes > 0 && config.strip_bytes.is_multiple_of(64), "bench: strip_bytes must be a positive multiple of 64");
    assert!(config.repetitions > 0, "bench: repetitions must be at least 1");
    let sets = if config.all_kernels { kernels::available() } else { vec![kernels::best()] };
    let mut stripe = AlignedBuf::new((config.data_strips + 2) * config.strip_bytes, AlignedBuf::PAGE_BYTES);
    for (seed, strip) in stripe.chunks_mut(config.strip_bytes).enumerate() {
        fill_pseudo_random(strip, seed as u64 + 1);
    }
    let mut results = Vec::new();
    for set in sets {
        for op in OPS {
            let (secs_per_call, iterations) = measure(config, || call_op(set, op, &mut stripe, config.strip_bytes));
            let bytes_per_call = (config.data_strips * config.strip_bytes) as f64;
            results.push(BenchResult {
                op,
                kernel: set.name,
                data_strips: config.data_strips,
                strip_bytes: config.strip_bytes,
                bytes_per_sec: bytes_per_call / secs_per_call,
                iterations,
            });
        }
    }
    results
}

/// One call of `op` on `stripe` = [D0 .. D(n-1), P, Q], strips back to back as in
/// an engine's page-aligned stripe buffer.
fn call_op(set: &Kernels, op: &str, stripe: &mut [u8], strip_bytes: usize) {
    let mut blocks: Vec<&mut [u8]> = stripe.chunks_mut(strip_bytes).collect();
    let data_strips = blocks.len() - 2;
    match op {
        "xor_gen" | "pq_gen" => {
            let (data, parity) = blocks.split_at_mut(data_strips);
            let data: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let (p, q) = parity.split_at_mut(1);
            if op == "xor_gen" {
                (set.xor_gen)(&data, p[0]);
            } else {
                (set.pq_gen)(&data, p[0], q[0]);
            }
        }
        "raid6_recover_2data" => set.raid6_recover(&mut blocks, &[0, data_strips - 1]).expect("valid stripe"),
        "raid5_recover" => set.raid5_recover(&mut blocks[..=data_strips], 0).expect("valid stripe"),
        _ => unreachable!("unknown op {op}"),
    }
}

/// Median seconds per call over the repetitions, and the number of timed calls.
pub fn measure(config: &BenchConfig, mut call: impl FnMut()) -> (f64, u64) {
    // Warm caches, page tables and the clock frequency for one repetition's time.
    let warm_up = Instant::now();
    while warm_up.elapsed() < config.repetition_min {
        call();
    }
    let started = Instant::now();
    call();
    let one_call = started.elapsed().max(Duration::from_nanos(100));
    let calls_per_repetition = (config.repetition_min.as_secs_f64() / one_call.as_secs_f64()).ceil().max(1.0) as u64;
    let mut secs_per_call: Vec<f64> = (0..config.repetitions)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..calls_per_repetition {
                call();
            }
            started.elapsed().as_secs_f64() / calls_per_repetition as f64
        })
        .collect();
    secs_per_call.sort_by(f64::total_cmp);
    (secs_per_call[secs_per_call.len() / 2], calls_per_repetition * config.repetitions as u64)
}

/// Deterministic xorshift64 fill; benchmarks need varied bytes, not good randomness.
pub fn fill_pseudo_random(buffer: &mut [u8], seed: u64) {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buffer.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

/// A zeroed heap buffer with a chosen alignment, so measurements do not depend on
/// where the allocator happened to put it.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len_bytes: usize,
    align_bytes: usize,
}

impl AlignedBuf {
    /// A cache line and an AVX-512 register.
    pub const LINE_BYTES: usize = 64;
    /// What O_DIRECT I/O buffers are aligned to.
    pub const PAGE_BYTES: usize = 4096;

    /// # Panics
    /// If `len_bytes` is 0, `align_bytes` is not a power of two, or the allocation fails.
    pub fn new(len_bytes: usize, align_bytes: usize) -> Self {
        assert!(len_bytes > 0, "AlignedBuf: length must be positive");
        let layout = Self::layout(len_bytes, align_bytes);
        // SAFETY: `layout` has a non-zero size (asserted above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self { ptr, len_bytes, align_bytes }
    }

    fn layout(len_bytes: usize, align_bytes: usize) -> Layout {
        Layout::from_size_align(len_bytes, align_bytes).expect("AlignedBuf: bad length or alignment")
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len_bytes` initialised (zeroed) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this same layout, and freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len_bytes, self.align_bytes)) }
    }
}

// SAFETY: AlignedBuf owns its bytes exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}
