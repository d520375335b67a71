//! GF(2^8) arithmetic for RAID6, Linux `lib/raid6` convention: polynomial
//! x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator g = 2.
//!
//! Everything here is table-driven scalar code built at compile time. It is the
//! reference the SIMD kernels are tested against, and it derives their constants
//! (nibble tables and GFNI matrices), so it must stay simple enough to check by eye.

/// The field polynomial, including the x^8 term.
pub const POLYNOMIAL: u16 = 0x11d;
/// The generator used for the Q syndrome.
pub const GENERATOR: u8 = 2;
/// Order of the multiplicative group: g^255 = 1.
pub const GROUP_ORDER: usize = 255;

/// `EXP[i] = g^i` for i in 0..510, so `EXP[log a + log b]` needs no reduction mod 255.
const EXP: [u8; 2 * GROUP_ORDER] = build_exp();
/// `LOG[g^i] = i`; `LOG[0]` is unused (0 has no logarithm).
const LOG: [u8; 256] = build_log();

const fn build_exp() -> [u8; 2 * GROUP_ORDER] {
    let mut table = [0u8; 2 * GROUP_ORDER];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < table.len() {
        table[i] = x as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLYNOMIAL;
        }
        i += 1;
    }
    table
}

const fn build_log() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < GROUP_ORDER {
        table[EXP[i] as usize] = i as u8;
        i += 1;
    }
    table
}

/// a * b in GF(2^8).
#[inline]
pub const fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// g^exponent (the exponent is reduced mod 255).
#[inline]
pub const fn pow_g(exponent: usize) -> u8 {
    EXP[exponent % GROUP_ORDER]
}

/// Multiplicative inverse.
///
/// # Panics
/// If `a` is 0, which has no inverse.
#[inline]
pub const fn inv(a: u8) -> u8 {
    assert!(a != 0, "gf::inv: 0 has no multiplicative inverse");
    EXP[GROUP_ORDER - LOG[a as usize] as usize]
}

/// Tables for the SSSE3-style `pshufb` multiply by the constant `c`:
/// `c * x = low[x & 0xf] ^ high[x >> 4]`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut low = [0u8; 16];
    let mut high = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        low[i] = mul(c, i as u8);
        high[i] = mul(c, (i as u8) << 4);
        i += 1;
    }
    (low, high)
}

/// The 8x8 bit matrix of "multiply by `c`" in the layout `gf2p8affineqb` expects:
/// byte `7 - i` of the result holds row i, whose bit j is bit i of `c * 2^j`.
/// (`gf2p8mulb` is no use here: it is hard-wired to the AES polynomial 0x11b.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    let mut row = 0;
    while row < 8 {
        let mut row_bits = 0u64;
        let mut column = 0;
        while column < 8 {
            let image_of_bit = mul(c, 1 << column);
            row_bits |= (((image_of_bit >> row) & 1) as u64) << column;
            column += 1;
        }
        matrix |= row_bits << (8 * (7 - row));
        row += 1;
    }
    matrix
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shift-and-add multiply, independent of the log/exp tables.
    fn mul_by_shifting(a: u8, b: u8) -> u8 {
        let (mut a, mut b, mut product) = (a as u16, b, 0u16);
        while b != 0 {
            if b & 1 != 0 {
                product ^= a;
            }
            a <<= 1;
            if a & 0x100 != 0 {
                a ^= POLYNOMIAL;
            }
            b >>= 1;
        }
        product as u8
    }

    /// Software model of one byte of `gf2p8affineqb` (Intel SDM pseudo-code).
    fn affine_byte(matrix: u64, x: u8) -> u8 {
        (0..8).fold(0u8, |out, i| {
            let row = (matrix >> (8 * (7 - i))) as u8;
            out | ((((row & x).count_ones() & 1) as u8) << i)
        })
    }

    #[test]
    fn tables_agree_with_shift_and_add() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_by_shifting(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn field_laws_hold() {
        assert_eq!(pow_g(GROUP_ORDER), 1, "g^255 = 1");
        let powers: std::collections::BTreeSet<u8> = (0..GROUP_ORDER).map(pow_g).collect();
        assert_eq!(powers.len(), GROUP_ORDER, "g generates every non-zero element");
        for a in 0..=255u8 {
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "a * a^-1 = 1 for a = {a}");
            }
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul(b, a), "commutative");
                let c = a.wrapping_mul(31).wrapping_add(b);
                assert_eq!(mul(a, b ^ c), mul(a, b) ^ mul(a, c), "distributive");
                assert_eq!(mul(mul(a, b), c), mul(a, mul(b, c)), "associative");
            }
        }
    }

    #[test]
    fn simd_constants_multiply() {
        for c in 0..=255u8 {
            let (low, high) = nibble_tables(c);
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                let expected = mul(c, x);
                assert_eq!(low[(x & 15) as usize] ^ high[(x >> 4) as usize], expected);
                assert_eq!(affine_byte(matrix, x), expected, "matrix for c = {c}, x = {x}");
            }
        }
    }
}
