//! The SIMD kernels, written once over a [`Vector`] of 32 or 64 bytes.
//!
//! Each instruction set supplies a `Vector` (in `x86.rs`) and calls these generic
//! bodies from a `#[target_feature]` function; the bodies are `#[inline(always)]`
//! so that they, and the vector methods, are compiled with that function's
//! features. Callers have checked every length (see `check`), so the bodies use
//! raw pointers and do no bounds checks.
//!
//! Blocks of `UNROLL` vectors are processed per loop iteration (256 bytes with
//! AVX-512): enough independent work to hide the latency of the GF multiply
//! chain, few enough registers to stay out of the stack. The tail (lengths are
//! multiples of 64) runs one vector at a time.

use super::TwoDataFactors;
use crate::gf;

/// Vectors per loop iteration.
const UNROLL: usize = 4;
/// Outputs at least this long are written with non-temporal stores: with a
/// 1 MiB output the stripe no longer fits in L2 (1 MiB per core on Zen 4), so
/// caching the output only evicts inputs, and a streaming store also skips
/// reading each output line before overwriting it. Measured on Zen 4: 10-25%
/// faster from 1 MiB strips up, 5% slower at 256 KiB.
const STREAMING_MIN_BYTES: usize = 1 << 20;

/// Whether to write `dest` with streaming stores (which need aligned addresses).
#[inline(always)]
fn streaming<V: Vector>(dest: *const u8, len_bytes: usize) -> bool {
    len_bytes >= STREAMING_MIN_BYTES && dest.align_offset(V::BYTES) == 0
}

/// One SIMD register of bytes and the GF(2^8) operations on it.
///
/// # Safety
/// Every method uses the instructions of its implementation's instruction set:
/// call them only on a CPU that has it (the `Kernels` tables ensure this).
pub(super) trait Vector: Copy {
    const BYTES: usize;
    /// A prepared "multiply by c" constant (nibble tables or a GFNI matrix).
    type Factor: Copy;
    unsafe fn load(ptr: *const u8) -> Self;
    unsafe fn store(self, ptr: *mut u8);
    /// Non-temporal store; `ptr` must be aligned to `BYTES`.
    unsafe fn store_streaming(self, ptr: *mut u8);
    /// Orders earlier streaming stores before later stores (`sfence`).
    unsafe fn fence();
    unsafe fn xor(self, other: Self) -> Self;
    #[inline(always)]
    unsafe fn xor3(self, b: Self, c: Self) -> Self {
        self.xor(b).xor(c)
    }
    /// g * self ^ d: one step of Horner's rule for Q.
    unsafe fn mul_g_xor(self, d: Self) -> Self;
    /// g^2 * self ^ g * high ^ low: two Horner steps (GFNI does them in fewer ops).
    #[inline(always)]
    unsafe fn horner2(self, high: Self, low: Self) -> Self {
        self.mul_g_xor(high).mul_g_xor(low)
    }
    unsafe fn factor(c: u8) -> Self::Factor;
    /// c * self, with `factor` = `Self::factor(c)`.
    unsafe fn mul(self, factor: Self::Factor) -> Self;
}

/// Runs `$block` with `$n` = `UNROLL` over blocks of `UNROLL` vectors, then with
/// `$n` = 1 over the remaining vectors, `$offset` being the block's byte offset.
/// A macro, not a function taking closures: a closure is compiled without the
/// caller's target features, and its SIMD intrinsics would not be inlined.
macro_rules! in_blocks {
    ($vector:ty, $len_bytes:expr, |$offset:ident, $n:ident| $block:expr) => {{
        let len_bytes: usize = $len_bytes;
        debug_assert!(len_bytes % <$vector>::BYTES == 0, "checked by the caller");
        let wide_bytes = UNROLL * <$vector>::BYTES;
        let mut $offset = 0;
        while $offset + wide_bytes <= len_bytes {
            const $n: usize = UNROLL;
            $block;
            $offset += wide_bytes;
        }
        while $offset < len_bytes {
            const $n: usize = 1;
            $block;
            $offset += <$vector>::BYTES;
        }
    }};
}

/// Loads `N` consecutive vectors starting `offset` bytes into `slice`.
#[inline(always)]
unsafe fn load_n<V: Vector, const N: usize>(slice: &[u8], offset: usize) -> [V; N] {
    let base = slice.as_ptr().add(offset);
    let mut vectors = [V::load(base); N];
    for (k, vector) in vectors.iter_mut().enumerate().skip(1) {
        *vector = V::load(base.add(k * V::BYTES));
    }
    vectors
}

#[inline(always)]
unsafe fn store_n<V: Vector, const N: usize, const STREAM: bool>(vectors: [V; N], slice: *mut u8, offset: usize) {
    for (k, vector) in vectors.into_iter().enumerate() {
        let ptr = slice.add(offset + k * V::BYTES);
        if STREAM {
            vector.store_streaming(ptr)
        } else {
            vector.store(ptr)
        }
    }
}

#[inline(always)]
unsafe fn load_at<V: Vector>(slices: &[&[u8]], index: usize, offset: usize) -> V {
    V::load(slices.get_unchecked(index).as_ptr().add(offset))
}

#[inline(always)]
pub(super) unsafe fn xor_gen<V: Vector>(sources: &[&[u8]], dest: &mut [u8]) {
    let len_bytes = dest.len();
    let dest = dest.as_mut_ptr();
    if streaming::<V>(dest, len_bytes) {
        in_blocks!(V, len_bytes, |offset, N| xor_gen_block::<V, N, true>(sources, dest, offset));
        V::fence();
    } else {
        in_blocks!(V, len_bytes, |offset, N| xor_gen_block::<V, N, false>(sources, dest, offset));
    }
}

#[inline(always)]
unsafe fn xor_gen_block<V: Vector, const N: usize, const STREAM: bool>(sources: &[&[u8]], dest: *mut u8, offset: usize) {
    let mut acc: [V; N] = load_n(sources[0], offset);
    let mut index = 1;
    while index + 1 < sources.len() {
        for (k, acc) in acc.iter_mut().enumerate() {
            let at = offset + k * V::BYTES;
            *acc = acc.xor3(load_at(sources, index, at), load_at(sources, index + 1, at));
        }
        index += 2;
    }
    if index < sources.len() {
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc = acc.xor(load_at(sources, index, offset + k * V::BYTES));
        }
    }
    store_n::<V, N, STREAM>(acc, dest, offset);
}

#[inline(always)]
pub(super) unsafe fn xor_into<V: Vector>(dest: &mut [u8], src: &[u8]) {
    let len_bytes = src.len();
    let (dest, src) = (dest.as_mut_ptr(), src.as_ptr());
    in_blocks!(V, len_bytes, |offset, N| {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            V::load(dest.add(at)).xor(V::load(src.add(at))).store(dest.add(at));
        }
    });
}

/// Q by Horner's rule from the highest member down: Q = (..(D[n-1] g + D[n-2]) g + ..) g + D[0].
#[inline(always)]
pub(super) unsafe fn pq_gen<V: Vector>(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len_bytes = p.len();
    let (p, q) = (p.as_mut_ptr(), q.as_mut_ptr());
    if streaming::<V>(p, len_bytes) && streaming::<V>(q, len_bytes) {
        in_blocks!(V, len_bytes, |offset, N| pq_gen_block::<V, N, true>(data, p, q, offset));
        V::fence();
    } else {
        in_blocks!(V, len_bytes, |offset, N| pq_gen_block::<V, N, false>(data, p, q, offset));
    }
}

#[inline(always)]
unsafe fn pq_gen_block<V: Vector, const N: usize, const STREAM: bool>(data: &[&[u8]], p: *mut u8, q: *mut u8, offset: usize) {
    let top = data.len() - 1;
    let mut p_acc: [V; N] = load_n(data[top], offset);
    let mut q_acc = p_acc;
    // Invariant: members above `next` are folded in; `next` is the next to fold.
    let mut next = top;
    while next >= 2 {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            let high = load_at::<V>(data, next - 1, at);
            let low = load_at::<V>(data, next - 2, at);
            p_acc[k] = p_acc[k].xor3(high, low);
            q_acc[k] = q_acc[k].horner2(high, low);
        }
        next -= 2;
    }
    if next == 1 {
        for k in 0..N {
            let d = load_at::<V>(data, 0, offset + k * V::BYTES);
            p_acc[k] = p_acc[k].xor(d);
            q_acc[k] = q_acc[k].mul_g_xor(d);
        }
    }
    store_n::<V, N, STREAM>(p_acc, p, offset);
    store_n::<V, N, STREAM>(q_acc, q, offset);
}

#[inline(always)]
pub(super) unsafe fn pq_update<V: Vector>(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    let factor = V::factor(gf::pow_g(data_index));
    let (p, q) = (p.as_mut_ptr(), q.as_mut_ptr());
    in_blocks!(V, delta.len(), |offset, N| {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            let d = V::load(delta.as_ptr().add(at));
            V::load(p.add(at)).xor(d).store(p.add(at));
            V::load(q.add(at)).xor(d.mul(factor)).store(q.add(at));
        }
    });
}

#[inline(always)]
pub(super) unsafe fn gf_mul_into<V: Vector>(c: u8, src: &[u8], dest: &mut [u8]) {
    let factor = V::factor(c);
    let dest = dest.as_mut_ptr();
    in_blocks!(V, src.len(), |offset, N| {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            let product = V::load(src.as_ptr().add(at)).mul(factor);
            V::load(dest.add(at)).xor(product).store(dest.add(at));
        }
    });
}

/// Linux `raid6_2data_recov`: Dy = p_factor (P ^ P') ^ q_factor (Q ^ Q'), Dx = Dy ^ P ^ P'.
#[inline(always)]
pub(super) unsafe fn recover_2data<V: Vector>(factors: TwoDataFactors, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
    let (p_factor, q_factor) = (V::factor(factors.p_factor), V::factor(factors.q_factor));
    let (dx, dy) = (dx.as_mut_ptr(), dy.as_mut_ptr());
    in_blocks!(V, p.len(), |offset, N| {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            let p_delta = V::load(p.as_ptr().add(at)).xor(V::load(dx.add(at)));
            let q_delta = V::load(q.as_ptr().add(at)).xor(V::load(dy.add(at)));
            let y = p_delta.mul(p_factor).xor(q_delta.mul(q_factor));
            y.store(dy.add(at));
            y.xor(p_delta).store(dx.add(at));
        }
    });
}

/// Linux `raid6_datap_recov`: Dx = g^-x (Q ^ Q').
#[inline(always)]
pub(super) unsafe fn recover_data_from_q<V: Vector>(data_index: usize, q: &[u8], dx: &mut [u8]) {
    let factor = V::factor(gf::inv(gf::pow_g(data_index)));
    let dx = dx.as_mut_ptr();
    in_blocks!(V, q.len(), |offset, N| {
        for k in 0..N {
            let at = offset + k * V::BYTES;
            let q_delta = V::load(q.as_ptr().add(at)).xor(V::load(dx.add(at)));
            q_delta.mul(factor).store(dx.add(at));
        }
    });
}
