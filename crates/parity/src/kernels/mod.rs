//! Every kernel set this CPU can run, so tests and benchmarks can call each one
//! explicitly; the crate's top-level functions use [`best`].
//!
//! A kernel set is a table of safe function pointers. Each function checks its
//! arguments (and panics, like the top-level functions, on bad lengths) before
//! running any SIMD code, so a table is safe to call with any input.

mod scalar;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::gf;
use std::sync::OnceLock;

/// Lengths must be a multiple of this many bytes (one AVX-512 register).
pub const LENGTH_MULTIPLE_BYTES: usize = 64;
/// At most this many data members: g^255 = g^0, so a 256th member's Q coefficient
/// would repeat member 0's and two-member recovery would be impossible.
pub const DATA_MEMBERS_MAX: usize = gf::GROUP_ORDER;

/// See [`crate::xor_gen`].
pub type XorGenFn = fn(sources: &[&[u8]], dest: &mut [u8]);
/// See [`crate::xor_into`].
pub type XorIntoFn = fn(dest: &mut [u8], src: &[u8]);
/// See [`crate::pq_gen`].
pub type PqGenFn = fn(data: &[&[u8]], p: &mut [u8], q: &mut [u8]);
/// See [`crate::pq_update`].
pub type PqUpdateFn = fn(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]);
/// See [`crate::gf_mul_into`].
pub type GfMulIntoFn = fn(c: u8, src: &[u8], dest: &mut [u8]);
/// See [`Kernels::recover_2data`].
pub type Recover2DataFn = fn(factors: TwoDataFactors, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]);
/// See [`Kernels::recover_data_from_q`].
pub type RecoverDataFromQFn = fn(data_index: usize, q: &[u8], dx: &mut [u8]);

/// One implementation of every primitive, all for the same instruction set.
#[derive(Debug)]
pub struct Kernels {
    /// e.g. "avx512+gfni", "avx512bw", "avx2", "scalar".
    pub name: &'static str,
    pub xor_gen: XorGenFn,
    pub xor_into: XorIntoFn,
    pub pq_gen: PqGenFn,
    pub pq_update: PqUpdateFn,
    pub gf_mul_into: GfMulIntoFn,
    /// Two lost data members x < y. On entry `dx` holds P' and `dy` holds Q', the
    /// syndromes of the stripe with Dx = Dy = 0; on return they hold Dx and Dy.
    pub recover_2data: Recover2DataFn,
    /// One lost data member x, from Q. On entry `dx` holds Q' (the Q syndrome with
    /// Dx = 0); on return it holds Dx = g^-x * (Q ^ Q').
    pub recover_data_from_q: RecoverDataFromQFn,
}

/// The two constants of the Linux `raid6_2data_recov` formula for lost data
/// members x < y: Dy = p_factor * (P ^ P') ^ q_factor * (Q ^ Q'), Dx = Dy ^ P ^ P'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwoDataFactors {
    /// 1 / (g^(y-x) + 1)
    pub p_factor: u8,
    /// 1 / (g^x + g^y)
    pub q_factor: u8,
}

impl TwoDataFactors {
    /// # Panics
    /// Unless `x < y < DATA_MEMBERS_MAX`.
    pub fn new(x: usize, y: usize) -> Self {
        assert!(x < y && y < DATA_MEMBERS_MAX, "TwoDataFactors: need x < y < 255, got x={x}, y={y}");
        Self { p_factor: gf::inv(gf::pow_g(y - x) ^ 1), q_factor: gf::inv(gf::pow_g(x) ^ gf::pow_g(y)) }
    }
}

/// Every kernel set this CPU supports, best first; `scalar()` is always last.
pub fn available() -> Vec<&'static Kernels> {
    let mut sets = Vec::new();
    #[cfg(target_arch = "x86_64")]
    sets.extend(x86::detected());
    sets.push(scalar());
    sets
}

/// The portable byte-at-a-time reference implementation (the test oracle).
pub fn scalar() -> &'static Kernels {
    &scalar::KERNELS
}

/// The fastest set on this CPU, detected once and cached.
pub fn best() -> &'static Kernels {
    static BEST: OnceLock<&'static Kernels> = OnceLock::new();
    BEST.get_or_init(|| available()[0])
}

/// Argument checks shared by every kernel set; they run before any unsafe code.
pub(crate) mod check {
    use super::{DATA_MEMBERS_MAX, LENGTH_MULTIPLE_BYTES};

    pub(crate) fn length(op: &str, what: &str, len_bytes: usize, expected_bytes: usize) {
        assert!(
            len_bytes == expected_bytes,
            "parity::{op}: {what} is {len_bytes} bytes but dest is {expected_bytes} bytes; all slices must have the same length"
        );
    }

    pub(crate) fn multiple(op: &str, len_bytes: usize) {
        assert!(
            len_bytes.is_multiple_of(LENGTH_MULTIPLE_BYTES),
            "parity::{op}: length {len_bytes} bytes is not a multiple of {LENGTH_MULTIPLE_BYTES}"
        );
    }

    /// The message is formatted only on failure: these checks run on the hot path.
    pub(crate) fn sources(op: &str, sources: &[&[u8]], dest_bytes: usize) {
        multiple(op, dest_bytes);
        for (index, source) in sources.iter().enumerate() {
            assert!(
                source.len() == dest_bytes,
                "parity::{op}: source {index} is {} bytes but dest is {dest_bytes} bytes; all slices must have the same length",
                source.len()
            );
        }
    }

    pub(crate) fn xor_gen(sources: &[&[u8]], dest: &[u8]) {
        assert!(!sources.is_empty(), "parity::xor_gen: needs at least one source, got none");
        self::sources("xor_gen", sources, dest.len());
    }

    pub(crate) fn pq_gen(data: &[&[u8]], p: &[u8], q: &[u8]) {
        let count = data.len();
        assert!((1..=DATA_MEMBERS_MAX).contains(&count), "parity::pq_gen: {count} data members; RAID6 allows 1..={DATA_MEMBERS_MAX}");
        sources("pq_gen", data, p.len());
        length("pq_gen", "q", q.len(), p.len());
    }

    pub(crate) fn data_index(op: &str, data_index: usize) {
        assert!(data_index < DATA_MEMBERS_MAX, "parity::{op}: data index {data_index} out of range; RAID6 allows 0..{DATA_MEMBERS_MAX}");
    }

    /// Every slice in `others` must have `dest`'s length, a multiple of 64.
    pub(crate) fn same_lengths(op: &str, dest: &[u8], others: &[(&str, &[u8])]) {
        multiple(op, dest.len());
        for (what, slice) in others {
            length(op, what, slice.len(), dest.len());
        }
    }
}
