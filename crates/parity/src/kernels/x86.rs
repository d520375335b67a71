//! x86-64 vectors (AVX2, AVX-512BW, AVX-512BW + GFNI), their kernel tables and
//! run-time detection.

use super::simd::{self, Vector};
use super::{check, Kernels, TwoDataFactors};
use crate::gf;
use std::arch::x86_64::*;

/// Every x86 kernel set this CPU supports, best first.
pub(super) fn detected() -> Vec<&'static Kernels> {
    let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    let gfni = is_x86_feature_detected!("gfni");
    let mut sets = Vec::new();
    if avx512 && gfni {
        sets.push(&avx512_gfni::KERNELS);
    }
    if avx512 {
        sets.push(&avx512bw::KERNELS);
    }
    if is_x86_feature_detected!("avx2") {
        sets.push(&avx2::KERNELS);
    }
    sets
}

/// The low bits of x * 2 ^ 0x1d when x's top bit is set (0x11d without the x^8 term).
const REDUCTION: i8 = (gf::POLYNOMIAL & 0xff) as i8;
/// Multiply-by-g and by g^2 as `gf2p8affineqb` matrices.
const MATRIX_G: i64 = gf::affine_matrix(gf::GENERATOR) as i64;
const MATRIX_G2: i64 = gf::affine_matrix(gf::mul(gf::GENERATOR, gf::GENERATOR)) as i64;

#[derive(Clone, Copy)]
pub(super) struct Avx2(__m256i);

impl Vector for Avx2 {
    const BYTES: usize = 32;
    type Factor = [__m256i; 2];

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        Self(_mm256_loadu_si256(ptr.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        _mm256_storeu_si256(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn store_streaming(self, ptr: *mut u8) {
        _mm256_stream_si256(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul_g_xor(self, d: Self) -> Self {
        let doubled = _mm256_add_epi8(self.0, self.0);
        let top_bit_set = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
        let reduction = _mm256_and_si256(top_bit_set, _mm256_set1_epi8(REDUCTION));
        Self(_mm256_xor_si256(_mm256_xor_si256(doubled, reduction), d.0))
    }
    #[inline(always)]
    unsafe fn factor(c: u8) -> Self::Factor {
        let (low, high) = gf::nibble_tables(c);
        let broadcast = |table: [u8; 16]| _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast()));
        [broadcast(low), broadcast(high)]
    }
    #[inline(always)]
    unsafe fn mul(self, factor: Self::Factor) -> Self {
        let nibble = _mm256_set1_epi8(0x0f);
        let low = _mm256_and_si256(self.0, nibble);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(self.0), nibble);
        Self(_mm256_xor_si256(_mm256_shuffle_epi8(factor[0], low), _mm256_shuffle_epi8(factor[1], high)))
    }
}

#[derive(Clone, Copy)]
pub(super) struct Avx512Bw(__m512i);

impl Vector for Avx512Bw {
    const BYTES: usize = 64;
    type Factor = [__m512i; 2];

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        Self(_mm512_loadu_si512(ptr.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        _mm512_storeu_si512(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn store_streaming(self, ptr: *mut u8) {
        _mm512_stream_si512(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, b: Self, c: Self) -> Self {
        Self(_mm512_ternarylogic_epi64::<0x96>(self.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn mul_g_xor(self, d: Self) -> Self {
        let doubled = _mm512_add_epi8(self.0, self.0);
        let top_bit_set = _mm512_movepi8_mask(self.0);
        let reduction = _mm512_maskz_mov_epi8(top_bit_set, _mm512_set1_epi8(REDUCTION));
        Self(doubled).xor3(Self(reduction), d)
    }
    #[inline(always)]
    unsafe fn factor(c: u8) -> Self::Factor {
        let (low, high) = gf::nibble_tables(c);
        let broadcast = |table: [u8; 16]| _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast()));
        [broadcast(low), broadcast(high)]
    }
    #[inline(always)]
    unsafe fn mul(self, factor: Self::Factor) -> Self {
        let nibble = _mm512_set1_epi8(0x0f);
        let low = _mm512_and_si512(self.0, nibble);
        let high = _mm512_and_si512(_mm512_srli_epi16::<4>(self.0), nibble);
        Self(_mm512_xor_si512(_mm512_shuffle_epi8(factor[0], low), _mm512_shuffle_epi8(factor[1], high)))
    }
}

/// AVX-512 with GFNI: every multiply by a constant is one `gf2p8affineqb`.
#[derive(Clone, Copy)]
pub(super) struct Avx512Gfni(__m512i);

impl Avx512Gfni {
    #[inline(always)]
    unsafe fn affine(self, matrix: __m512i) -> Self {
        Self(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, matrix))
    }
}

impl Vector for Avx512Gfni {
    const BYTES: usize = 64;
    type Factor = __m512i;

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> Self {
        Self(_mm512_loadu_si512(ptr.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, ptr: *mut u8) {
        _mm512_storeu_si512(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn store_streaming(self, ptr: *mut u8) {
        _mm512_stream_si512(ptr.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Self(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, b: Self, c: Self) -> Self {
        Self(_mm512_ternarylogic_epi64::<0x96>(self.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn mul_g_xor(self, d: Self) -> Self {
        self.affine(_mm512_set1_epi64(MATRIX_G)).xor(d)
    }
    /// g^2 q ^ g high ^ low: two independent multiplies and one three-way XOR,
    /// instead of two dependent multiply-then-XOR steps.
    #[inline(always)]
    unsafe fn horner2(self, high: Self, low: Self) -> Self {
        let q = self.affine(_mm512_set1_epi64(MATRIX_G2));
        q.xor3(high.affine(_mm512_set1_epi64(MATRIX_G)), low)
    }
    #[inline(always)]
    unsafe fn factor(c: u8) -> Self::Factor {
        _mm512_set1_epi64(gf::affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, factor: Self::Factor) -> Self {
        self.affine(factor)
    }
}

/// Defines a module with a `KERNELS` table whose entries check their arguments and
/// then run the generic `simd` bodies compiled for `$features`.
macro_rules! kernel_set {
    ($module:ident, $vector:ty, $features:literal, $name:literal) => {
        mod $module {
            use super::*;

            pub(in crate::kernels) static KERNELS: Kernels =
                Kernels { name: $name, xor_gen, xor_into, pq_gen, pq_update, gf_mul_into, recover_2data, recover_data_from_q };

            fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
                check::xor_gen(sources, dest);
                // SAFETY: KERNELS is only handed out by `detected()` after it found
                // the CPU features this function is compiled for; lengths checked above.
                unsafe { features::xor_gen(sources, dest) }
            }

            fn xor_into(dest: &mut [u8], src: &[u8]) {
                check::same_lengths("xor_into", dest, &[("src", src)]);
                // SAFETY: CPU features as in `xor_gen`; lengths checked above.
                unsafe { features::xor_into(dest, src) }
            }

            fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
                check::pq_gen(data, p, q);
                // SAFETY: CPU features as in `xor_gen`; lengths and count checked above.
                unsafe { features::pq_gen(data, p, q) }
            }

            fn pq_update(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
                check::data_index("pq_update", data_index);
                check::same_lengths("pq_update", p, &[("delta", delta), ("q", q)]);
                // SAFETY: CPU features as in `xor_gen`; lengths checked above.
                unsafe { features::pq_update(data_index, delta, p, q) }
            }

            fn gf_mul_into(c: u8, src: &[u8], dest: &mut [u8]) {
                check::same_lengths("gf_mul_into", dest, &[("src", src)]);
                // SAFETY: CPU features as in `xor_gen`; lengths checked above.
                unsafe { features::gf_mul_into(c, src, dest) }
            }

            fn recover_2data(factors: TwoDataFactors, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
                check::same_lengths("recover_2data", dx, &[("p", p), ("q", q), ("dy", dy)]);
                // SAFETY: CPU features as in `xor_gen`; lengths checked above.
                unsafe { features::recover_2data(factors, p, q, dx, dy) }
            }

            fn recover_data_from_q(data_index: usize, q: &[u8], dx: &mut [u8]) {
                check::data_index("recover_data_from_q", data_index);
                check::same_lengths("recover_data_from_q", dx, &[("q", q)]);
                // SAFETY: CPU features as in `xor_gen`; lengths checked above.
                unsafe { features::recover_data_from_q(data_index, q, dx) }
            }

            /// The generic bodies instantiated inside `#[target_feature]` functions.
            mod features {
                use super::*;

                #[target_feature(enable = $features)]
                pub(super) unsafe fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
                    simd::xor_gen::<$vector>(sources, dest)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn xor_into(dest: &mut [u8], src: &[u8]) {
                    simd::xor_into::<$vector>(dest, src)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
                    simd::pq_gen::<$vector>(data, p, q)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn pq_update(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
                    simd::pq_update::<$vector>(data_index, delta, p, q)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn gf_mul_into(c: u8, src: &[u8], dest: &mut [u8]) {
                    simd::gf_mul_into::<$vector>(c, src, dest)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn recover_2data(factors: TwoDataFactors, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
                    simd::recover_2data::<$vector>(factors, p, q, dx, dy)
                }
                #[target_feature(enable = $features)]
                pub(super) unsafe fn recover_data_from_q(data_index: usize, q: &[u8], dx: &mut [u8]) {
                    simd::recover_data_from_q::<$vector>(data_index, q, dx)
                }
            }
        }
    };
}

kernel_set!(avx2, Avx2, "avx2", "avx2");
kernel_set!(avx512bw, Avx512Bw, "avx512f,avx512bw", "avx512bw");
kernel_set!(avx512_gfni, Avx512Gfni, "avx512f,avx512bw,gfni", "avx512+gfni");
