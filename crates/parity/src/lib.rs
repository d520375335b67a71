//! RAID5 and RAID6 parity for storc: XOR parity, the P+Q syndromes over GF(2^8),
//! read-modify-write updates, and recovery of up to two lost members.
//!
//! Pure computation: no I/O, no allocation and no locks on the hot path. Every
//! function takes borrowed slices of equal length, a multiple of 64 bytes
//! (callers use 512-byte sectors).
//!
//! # Conventions
//! RAID6 follows Linux `lib/raid6` (and ISA-L's `pq_gen`): GF(2^8) with polynomial
//! 0x11d and generator g = 2; P = XOR of D\[i\], Q = sum of g^i * D\[i\]. Arrays of
//! stripe members are ordered `[D0, .., D(n-1), P, Q]`.
//!
//! # Design: hand-written Rust kernels, proven against ISA-L
//! Intel's ISA-L is the usual answer for fast parity, and we could link it. We
//! write the kernels in Rust instead so the engine has no C dependency (no
//! build-time toolchain, no `unsafe` FFI boundary, one language to debug), and we
//! *prove* the choice costs nothing: `bench/parity-vs-isal.sh` runs ISA-L and these
//! kernels on the same buffers in one process, checks that P and Q are
//! byte-identical, and reports the speed ratio.
//!
//! The kernels are written once, generically over a SIMD vector (`kernels/simd.rs`),
//! and instantiated for AVX-512BW + GFNI (a multiply by a constant is one
//! `gf2p8affineqb`), AVX-512BW, AVX2 (nibble-table `pshufb` multiplies) and a
//! scalar set. The scalar set is written independently from the definitions and
//! is the test oracle for the others. The fastest set this CPU supports is chosen
//! once, at first use; [`kernels::available`] exposes all of them so tests and
//! benchmarks can run each one.
//!
//! # Performance notes (Zen 4, one core; `bench/parity-vs-isal.sh` for numbers)
//! - Loops handle 4 registers (256 bytes with AVX-512) per iteration; Q uses
//!   Horner's rule two members at a time: with GFNI, g^2 Q ^ g D(i+1) ^ D(i) is two
//!   independent `gf2p8affineqb` and one `vpternlogq`. `gf2p8mulb` cannot be used:
//!   it is hard-wired to the AES polynomial 0x11b.
//! - With 64 KiB strips the stripe lives in L2 and XOR is bound by the L2-to-L1
//!   bandwidth (32 bytes per cycle), for ISA-L and for us alike; P+Q has
//!   arithmetic to spare, which is where GFNI wins.
//! - Outputs of 1 MiB or more are written with non-temporal stores (they would
//!   only evict the inputs from cache); below that, ordinary stores are faster.
//! - Recovery recomputes P', Q' and solves in 4 KiB pieces, so the solve step
//!   reads P', Q' back from L1, and the scratch space lives on the stack.

pub mod bench;
pub mod gf;
pub mod kernels;
mod recover;

pub use recover::{RecoverError, RAID5_MEMBERS_MAX, RAID6_MEMBERS_MAX};

/// `dest` = XOR of all `sources`.
///
/// # Panics
/// If `sources` is empty, or any slice's length differs from `dest`'s, or the
/// length is not a multiple of 64.
pub fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    (kernels::best().xor_gen)(sources, dest)
}

/// `dest ^= src`.
///
/// # Panics
/// If the lengths differ or are not a multiple of 64.
pub fn xor_into(dest: &mut [u8], src: &[u8]) {
    (kernels::best().xor_into)(dest, src)
}

/// RAID6 syndromes: `p` = XOR of `data[i]`, `q` = sum of g^i * `data[i]`.
///
/// # Panics
/// If `data` has fewer than 1 or more than 255 members, or any slice's length
/// differs from `p`'s, or the length is not a multiple of 64.
pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    (kernels::best().pq_gen)(data, p, q)
}

/// Read-modify-write update: with `delta` = old ^ new contents of data member
/// `data_index`, applies `p ^= delta` and `q ^= g^data_index * delta`.
///
/// # Panics
/// If `data_index` >= 255, or the lengths differ or are not a multiple of 64.
pub fn pq_update(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    (kernels::best().pq_update)(data_index, delta, p, q)
}

/// `dest ^= c * src` in GF(2^8).
///
/// # Panics
/// If the lengths differ or are not a multiple of 64.
pub fn gf_mul_into(c: u8, src: &[u8], dest: &mut [u8]) {
    (kernels::best().gf_mul_into)(c, src, dest)
}

/// Recovers lost members of a RAID6 stripe in place.
///
/// `blocks` is `[D0, .., D(n-1), P, Q]` with n = `blocks.len() - 2` data members.
/// `lost` lists 1 or 2 distinct indices into `blocks`, in any order and any
/// combination (data, P, Q). Their contents are overwritten with the recovered
/// bytes; the other blocks are inputs and are not modified.
///
/// # Errors
/// [`RecoverError`] if `blocks` has fewer than 3 or more than 257 entries, the
/// blocks differ in length or their length is not a multiple of 64, or `lost` is
/// empty, longer than 2, out of range or repeats an index. Nothing is written then.
pub fn raid6_recover(blocks: &mut [&mut [u8]], lost: &[usize]) -> Result<(), RecoverError> {
    kernels::best().raid6_recover(blocks, lost)
}

/// Recovers the lost member `lost` of a RAID5 stripe `[D0, .., D(n-1), P]` in place.
///
/// # Errors
/// [`RecoverError`] if `blocks` has fewer than 2 or more than 256 entries, the
/// blocks differ in length or their length is not a multiple of 64, or `lost` is
/// out of range. Nothing is written then.
pub fn raid5_recover(blocks: &mut [&mut [u8]], lost: usize) -> Result<(), RecoverError> {
    kernels::best().raid5_recover(blocks, lost)
}

/// Name of the kernel set chosen at run time: "avx512+gfni", "avx512bw", "avx2"
/// or "scalar".
pub fn active_kernel_name() -> &'static str {
    kernels::best().name
}
