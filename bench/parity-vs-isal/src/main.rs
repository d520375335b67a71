//! storc's parity kernels against Intel ISA-L, on the same buffers in one process.
//!
//! 1. Checks that storc's P (xor_gen, pq_gen) and Q (pq_gen) are byte-identical to
//!    ISA-L's for 2..=16 data members: proof that both follow the same RAID6
//!    convention. Exits 1 if not.
//! 2. Times ISA-L and storc alternately on the same buffers (8 data strips of
//!    64 KiB and of 4 MiB) and prints the median GB/s of each and the ratio.
//! 3. Times `parity::raid6_recover` of two lost data members, GB/s on one core.
//!
//! GB/s counts data bytes (strips x strip bytes) per call, 1 GB = 1e9 bytes.
//! Options: `--quick` (few rounds, for CI), `--json` (machine-readable output).

use parity::bench::{fill_pseudo_random, AlignedBuf};
use std::os::raw::{c_int, c_void};
use std::process::ExitCode;
use std::time::Instant;

/// The two ISA-L entry points we compare against, from `isa-l/raid.h`.
mod isal {
    use std::os::raw::{c_int, c_void};
    extern "C" {
        /// `array` = `vects - 1` sources then the dest; `len` in bytes; pointers
        /// aligned to 32 bytes. Returns 0 on success.
        pub fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        /// `array` = `vects - 2` sources then P then Q; `len` a multiple of 32;
        /// pointers aligned to 32 bytes; at least 2 sources. Returns 0 on success.
        pub fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    }
}

/// Member counts whose output is compared byte for byte (ISA-L's pq_gen needs 2+).
const IDENTITY_DATA_COUNTS: std::ops::RangeInclusive<usize> = 2..=16;
const DATA_STRIPS: usize = 8;
const STRIP_SIZES_BYTES: [usize; 2] = [64 * 1024, 4 * 1024 * 1024];
/// Targets from the parity crate's brief: storc/ISA-L per strip size, and GB/s.
const RATIO_TARGETS: [f64; 2] = [1.0, 0.9];
const RECOVERY_TARGET_GBPS: f64 = 10.0;

struct Options {
    quick: bool,
    json: bool,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let mut options = Options {
            quick: false,
            json: false,
        };
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--json" => options.json = true,
                other => {
                    return Err(format!(
                        "unknown argument {other:?}; usage: parity-vs-isal [--quick] [--json]"
                    ))
                }
            }
        }
        Ok(options)
    }
    fn rounds(&self) -> usize {
        if self.quick {
            5
        } else {
            31
        }
    }
    /// Minimum time of one timed batch of calls.
    fn batch_min_secs(&self) -> f64 {
        if self.quick {
            0.002
        } else {
            0.01
        }
    }
}

/// Where the strips of a stripe sit in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StripLayout {
    /// Back to back in one page-aligned buffer, as in an engine's O_DIRECT stripe
    /// buffer: equal offsets of all strips fall in the same L1 cache sets.
    Contiguous,
    /// Strip i starts 64 * i bytes later than contiguous, so they do not.
    Staggered,
}

impl StripLayout {
    const ALL: [StripLayout; 2] = [StripLayout::Contiguous, StripLayout::Staggered];
    fn name(self) -> &'static str {
        match self {
            StripLayout::Contiguous => "contiguous",
            StripLayout::Staggered => "staggered",
        }
    }
}

/// `[D0 .. D(n-1), P, Q]` in one page-aligned buffer, strip i at `i * stride_bytes`.
struct Stripe {
    buffer: AlignedBuf,
    members: usize,
    strip_bytes: usize,
    stride_bytes: usize,
}

impl Stripe {
    fn new(data_strips: usize, strip_bytes: usize, layout: StripLayout) -> Self {
        let members = data_strips + 2;
        let stride_bytes = match layout {
            StripLayout::Contiguous => strip_bytes,
            StripLayout::Staggered => strip_bytes + 64,
        };
        let mut stripe = Stripe {
            buffer: AlignedBuf::new(members * stride_bytes, 4096),
            members,
            strip_bytes,
            stride_bytes,
        };
        for (seed, strip) in stripe.strips_mut().into_iter().enumerate() {
            fill_pseudo_random(strip, seed as u64 + 11);
        }
        stripe
    }
    fn data_strips(&self) -> usize {
        self.members - 2
    }
    fn strips_mut(&mut self) -> Vec<&mut [u8]> {
        let strip_bytes = self.strip_bytes;
        self.buffer
            .chunks_mut(self.stride_bytes)
            .map(|chunk| &mut chunk[..strip_bytes])
            .collect()
    }
    /// ISA-L's argument array: the data pointers, then `outputs` of P and Q.
    fn isal_array(&mut self, outputs: usize) -> Vec<*mut c_void> {
        let count = self.data_strips() + outputs;
        self.strips_mut()[..count]
            .iter_mut()
            .map(|strip| strip.as_mut_ptr().cast())
            .collect()
    }
    fn isal_xor_gen(&mut self) {
        let len = self.strip_bytes as c_int;
        let mut array = self.isal_array(1);
        // SAFETY: `array` holds data_strips + 1 pointers to disjoint live strips of
        // `len` bytes each, 64-byte aligned, len a multiple of 64, as raid.h requires.
        let status = unsafe { isal::xor_gen(array.len() as c_int, len, array.as_mut_ptr()) };
        assert_eq!(status, 0, "ISA-L xor_gen failed");
    }
    fn isal_pq_gen(&mut self) {
        let len = self.strip_bytes as c_int;
        let mut array = self.isal_array(2);
        // SAFETY: as in `isal_xor_gen`, with P and Q as the last two pointers.
        let status = unsafe { isal::pq_gen(array.len() as c_int, len, array.as_mut_ptr()) };
        assert_eq!(status, 0, "ISA-L pq_gen failed");
    }
    fn storc_xor_gen(&mut self) {
        let data_strips = self.data_strips();
        let mut strips = self.strips_mut();
        let (data, parity) = strips.split_at_mut(data_strips);
        let sources: Vec<&[u8]> = data.iter().map(|strip| &strip[..]).collect();
        parity::xor_gen(&sources, parity[0]);
    }
    fn storc_pq_gen(&mut self) {
        let data_strips = self.data_strips();
        let mut strips = self.strips_mut();
        let (data, parity) = strips.split_at_mut(data_strips);
        let sources: Vec<&[u8]> = data.iter().map(|strip| &strip[..]).collect();
        let (p, q) = parity.split_at_mut(1);
        parity::pq_gen(&sources, p[0], q[0]);
    }
    fn storc_recover_2data(&mut self) {
        let last_data = self.data_strips() - 1;
        let mut strips = self.strips_mut();
        parity::raid6_recover(&mut strips, &[1, last_data]).expect("valid stripe");
    }
    /// Overwrites P and Q, so a kernel that writes nothing cannot pass a check.
    fn scramble_parity(&mut self) {
        let n = self.data_strips();
        for (seed, strip) in self.strips_mut()[n..].iter_mut().enumerate() {
            fill_pseudo_random(strip, 0xbad + seed as u64);
        }
    }
    fn parity(&mut self) -> (Vec<u8>, Vec<u8>) {
        let n = self.data_strips();
        let strips = self.strips_mut();
        (strips[n].to_vec(), strips[n + 1].to_vec())
    }
}

/// storc's P and Q must equal ISA-L's, byte for byte: for 2..=16 data strips,
/// and for 8 strips of 4 MiB (where storc uses streaming stores).
fn check_identical() -> Result<(), String> {
    let small = IDENTITY_DATA_COUNTS.map(|count| (count, 4096 + 192, StripLayout::Staggered));
    for (data_strips, strip_bytes, layout) in
        small.chain([(DATA_STRIPS, 4 << 20, StripLayout::Contiguous)])
    {
        let mut stripe = Stripe::new(data_strips, strip_bytes, layout);
        let case = format!("{data_strips} data strips of {strip_bytes} bytes");
        stripe.isal_pq_gen();
        let isal_pq = stripe.parity();
        stripe.scramble_parity();
        stripe.storc_pq_gen();
        if stripe.parity() != isal_pq {
            return Err(format!(
                "pq_gen: storc's P/Q differ from ISA-L's for {case}"
            ));
        }
        stripe.isal_xor_gen();
        let isal_p = stripe.parity().0;
        stripe.scramble_parity();
        stripe.storc_xor_gen();
        if stripe.parity().0 != isal_p {
            return Err(format!(
                "xor_gen: storc's parity differs from ISA-L's for {case}"
            ));
        }
    }
    Ok(())
}

/// Seconds one batch of `calls` calls takes, per call.
fn time_batch(calls: usize, f: &mut impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..calls {
        f();
    }
    started.elapsed().as_secs_f64() / calls as f64
}

fn warm_up(options: &Options, f: &mut impl FnMut()) {
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < options.batch_min_secs() {
        f();
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Median seconds per call of `a` and of `b`, timed in alternating batches
/// (a b, b a, a b, ...) so drift and neighbours hit both alike.
fn time_alternating(options: &Options, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    // Warm caches and the clock frequency, then size batches by the slower side.
    for _ in 0..3 {
        warm_up(options, &mut a);
        warm_up(options, &mut b);
    }
    let slowest = time_batch(2, &mut a).max(time_batch(2, &mut b));
    let calls = (options.batch_min_secs() / slowest).ceil().max(1.0) as usize;
    let (mut a_secs, mut b_secs) = (Vec::new(), Vec::new());
    for round in 0..options.rounds() {
        if round % 2 == 0 {
            a_secs.push(time_batch(calls, &mut a));
            b_secs.push(time_batch(calls, &mut b));
        } else {
            b_secs.push(time_batch(calls, &mut b));
            a_secs.push(time_batch(calls, &mut a));
        }
    }
    (median(a_secs), median(b_secs))
}

struct Comparison {
    op: &'static str,
    strip_bytes: usize,
    layout: StripLayout,
    isal_gbps: f64,
    storc_gbps: f64,
    target_ratio: f64,
}

impl Comparison {
    fn ratio(&self) -> f64 {
        self.storc_gbps / self.isal_gbps
    }
}

struct Recovery {
    strip_bytes: usize,
    layout: StripLayout,
    gbps: f64,
}

fn gbps(strip_bytes: usize, secs_per_call: f64) -> f64 {
    (DATA_STRIPS * strip_bytes) as f64 / secs_per_call / 1e9
}

fn measure(options: &Options) -> (Vec<Comparison>, Vec<Recovery>) {
    let (mut comparisons, mut recoveries) = (Vec::new(), Vec::new());
    for (strip_bytes, target_ratio) in STRIP_SIZES_BYTES.into_iter().zip(RATIO_TARGETS) {
        for layout in StripLayout::ALL {
            let stripe = std::cell::RefCell::new(Stripe::new(DATA_STRIPS, strip_bytes, layout));
            let mut compare = |op, isal: fn(&mut Stripe), storc: fn(&mut Stripe)| {
                let (isal_secs, storc_secs) = time_alternating(
                    options,
                    || isal(&mut stripe.borrow_mut()),
                    || storc(&mut stripe.borrow_mut()),
                );
                let (isal_gbps, storc_gbps) =
                    (gbps(strip_bytes, isal_secs), gbps(strip_bytes, storc_secs));
                comparisons.push(Comparison {
                    op,
                    strip_bytes,
                    layout,
                    isal_gbps,
                    storc_gbps,
                    target_ratio,
                });
            };
            compare("xor_gen", Stripe::isal_xor_gen, Stripe::storc_xor_gen);
            compare("pq_gen", Stripe::isal_pq_gen, Stripe::storc_pq_gen);
            stripe.borrow_mut().storc_pq_gen();
            let (recover_secs, _) =
                time_alternating(options, || stripe.borrow_mut().storc_recover_2data(), || {});
            recoveries.push(Recovery {
                strip_bytes,
                layout,
                gbps: gbps(strip_bytes, recover_secs),
            });
        }
    }
    (comparisons, recoveries)
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn print_table(options: &Options, comparisons: &[Comparison], recoveries: &[Recovery]) {
    println!(
        "storc parity ({}) vs ISA-L, same buffers, median of {} alternating rounds; P and Q byte-identical to ISA-L",
        parity::active_kernel_name(),
        options.rounds()
    );
    println!(
        "{:<9} {:>11} {:<11} {:>11} {:>11} {:>12}  target",
        "op", "data", "layout", "ISA-L GB/s", "storc GB/s", "storc/ISA-L"
    );
    for c in comparisons {
        let verdict = if c.ratio() >= c.target_ratio {
            "ok"
        } else {
            "BELOW"
        };
        println!(
            "{:<9} {:>11} {:<11} {:>11.1} {:>11.1} {:>12.3}  >= {:.1} {verdict}",
            c.op,
            format!("{DATA_STRIPS} x {}", size_label(c.strip_bytes)),
            c.layout.name(),
            c.isal_gbps,
            c.storc_gbps,
            c.ratio(),
            c.target_ratio
        );
    }
    for r in recoveries {
        let verdict = match r.strip_bytes {
            bytes if bytes > 64 * 1024 => "(no target)",
            _ if r.gbps >= RECOVERY_TARGET_GBPS => "ok",
            _ => "BELOW",
        };
        println!(
            "raid6_recover 2 data lost {:>11} {:<11} {:>6.1} GB/s on one core  target >= {RECOVERY_TARGET_GBPS:.0} {verdict}",
            format!("{DATA_STRIPS} x {}", size_label(r.strip_bytes)),
            r.layout.name(),
            r.gbps
        );
    }
}

fn print_json(options: &Options, comparisons: &[Comparison], recoveries: &[Recovery]) {
    let comparisons: Vec<String> = comparisons
        .iter()
        .map(|c| {
            format!(
                "{{\"op\":\"{}\",\"data_strips\":{DATA_STRIPS},\"strip_bytes\":{},\"layout\":\"{}\",\"isal_gbps\":{:.3},\"storc_gbps\":{:.3},\"ratio\":{:.4},\"target_ratio\":{}}}",
                c.op,
                c.strip_bytes,
                c.layout.name(),
                c.isal_gbps,
                c.storc_gbps,
                c.ratio(),
                c.target_ratio
            )
        })
        .collect();
    let recoveries: Vec<String> = recoveries
        .iter()
        .map(|r| {
            format!(
                "{{\"op\":\"raid6_recover_2data\",\"data_strips\":{DATA_STRIPS},\"strip_bytes\":{},\"layout\":\"{}\",\"gbps_per_core\":{:.3}}}",
                r.strip_bytes,
                r.layout.name(),
                r.gbps
            )
        })
        .collect();
    println!(
        "{{\"kernel\":\"{}\",\"rounds\":{},\"identical_to_isal\":true,\"comparisons\":[{}],\"recovery\":[{}]}}",
        parity::active_kernel_name(),
        options.rounds(),
        comparisons.join(","),
        recoveries.join(",")
    );
}

fn main() -> ExitCode {
    let options = match Options::parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("parity-vs-isal: {message}");
            return ExitCode::from(2);
        }
    };
    if let Err(message) = check_identical() {
        eprintln!(
            "parity-vs-isal: {message}: storc does not follow ISA-L's (Linux) RAID6 convention"
        );
        return ExitCode::from(1);
    }
    let (comparisons, recoveries) = measure(&options);
    if options.json {
        print_json(&options, &comparisons, &recoveries);
    } else {
        print_table(&options, &comparisons, &recoveries);
    }
    ExitCode::SUCCESS
}
