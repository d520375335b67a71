//! Every kernel set against the scalar oracle, over data counts 1..=16 (and a few
//! larger), lengths from one vector to past a 64 KiB strip, aligned and not.

use parity::kernels::{self, Kernels, TwoDataFactors};
use proptest::prelude::*;

const DATA_COUNTS: [usize; 19] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 37, 128, 255];
/// 65536 + 3 * 64 leaves a tail after 256-byte blocks; 7 * 64 and 33 * 64 are odd multiples.
const LENGTHS_BYTES: [usize; 6] = [64, 7 * 64, 512, 33 * 64, 4096, 65536 + 64 * 3];
/// Start offsets of the slices in their buffers: aligned and misaligned.
const MISALIGNMENTS_BYTES: [usize; 2] = [0, 3];

/// Deterministic pseudo-random bytes (splitmix64), so failures reproduce.
fn random_bytes(len_bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut bytes = Vec::with_capacity(len_bytes + 8);
    while bytes.len() < len_bytes {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    bytes.truncate(len_bytes);
    bytes
}

/// `count` buffers of `len_bytes` random bytes, each starting `misalignment` bytes in.
fn members(count: usize, len_bytes: usize, misalignment: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..count).map(|i| random_bytes(len_bytes + misalignment, seed.wrapping_mul(1000).wrapping_add(i as u64))).collect()
}

fn slices(buffers: &[Vec<u8>], misalignment: usize) -> Vec<&[u8]> {
    buffers.iter().map(|b| &b[misalignment..]).collect()
}

fn simd_sets() -> Vec<&'static Kernels> {
    kernels::available().into_iter().filter(|set| set.name != "scalar").collect()
}

/// Runs `op` with `set` and with the scalar oracle on copies of the same outputs.
fn check<const OUTPUTS: usize>(set: &Kernels, case: &str, outputs: [Vec<u8>; OUTPUTS], op: impl Fn(&Kernels, &mut [Vec<u8>; OUTPUTS])) {
    let mut expected = outputs.clone();
    op(kernels::scalar(), &mut expected);
    let mut actual = outputs;
    op(set, &mut actual);
    for (index, (actual, expected)) in actual.iter().zip(&expected).enumerate() {
        if let Some(at) = actual.iter().zip(expected).position(|(a, e)| a != e) {
            panic!("{}: {case}: output {index} differs from scalar at byte {at}", set.name);
        }
    }
}

/// Every (data count, length, misalignment) case, with its seed.
fn cases() -> impl Iterator<Item = (usize, usize, usize, u64)> {
    let mut seed = 0;
    DATA_COUNTS.into_iter().flat_map(move |count| {
        LENGTHS_BYTES.into_iter().flat_map(move |len| {
            MISALIGNMENTS_BYTES.into_iter().map(move |misalignment| {
                seed += 1;
                (count, len, misalignment, seed)
            })
        })
    })
}

#[test]
fn there_is_a_simd_set_on_x86_64_and_dispatch_picks_the_first() {
    let names: Vec<&str> = kernels::available().iter().map(|set| set.name).collect();
    assert_eq!(names.last(), Some(&"scalar"));
    assert_eq!(parity::active_kernel_name(), names[0]);
    assert_eq!(kernels::best().name, names[0]);
    if cfg!(target_arch = "x86_64") && std::is_x86_feature_detected!("avx2") {
        assert!(names.contains(&"avx2"), "available: {names:?}");
    }
}

#[test]
fn xor_gen_and_pq_gen_match_scalar() {
    for set in simd_sets() {
        for (count, len, misalignment, seed) in cases() {
            let buffers = members(count, len, misalignment, seed);
            let data = slices(&buffers, misalignment);
            let case = format!("{count} data x {len} bytes, offset {misalignment}");
            let garbage = || random_bytes(len, !seed);
            check(set, &format!("xor_gen {case}"), [garbage()], |set, [p]| (set.xor_gen)(&data, p));
            check(set, &format!("pq_gen {case}"), [garbage(), garbage()], |set, [p, q]| (set.pq_gen)(&data, p, q));
        }
    }
}

#[test]
fn pq_update_xor_into_gf_mul_into_match_scalar() {
    for set in simd_sets() {
        for (count, len, misalignment, seed) in cases() {
            let buffers = members(3, len, misalignment, seed);
            let [delta, p, q] = [0, 1, 2].map(|i| buffers[i][misalignment..].to_vec());
            let data_index = (count * 7 + 3) % 255;
            let c = (seed * 37) as u8;
            let case = format!("index {data_index}, c {c}, {len} bytes, offset {misalignment}");
            let src = &buffers[0][misalignment..];
            check(set, &format!("pq_update {case}"), [p.clone(), q.clone()], |set, [p, q]| (set.pq_update)(data_index, &delta, p, q));
            check(set, &format!("xor_into {case}"), [p.clone()], |set, [dest]| (set.xor_into)(dest, src));
            check(set, &format!("gf_mul_into {case}"), [q.clone()], |set, [dest]| (set.gf_mul_into)(c, src, dest));
        }
    }
}

#[test]
fn gf_mul_into_matches_scalar_for_every_constant() {
    for set in simd_sets() {
        for c in 0..=255u8 {
            let src = random_bytes(4096 + 192, c as u64);
            check(set, &format!("gf_mul_into c={c}"), [random_bytes(4096 + 192, 999)], |set, [dest]| (set.gf_mul_into)(c, &src, dest));
        }
    }
}

#[test]
fn recovery_cores_match_scalar() {
    for set in simd_sets() {
        for (x, y) in [(0, 1), (0, 254), (3, 9), (100, 200), (253, 254)] {
            for len in LENGTHS_BYTES {
                let [p, q, dx, dy] = [1, 2, 3, 4].map(|seed| random_bytes(len, seed * (x + y) as u64));
                let factors = TwoDataFactors::new(x, y);
                let case = format!("x {x}, y {y}, {len} bytes");
                check(set, &format!("recover_2data {case}"), [dx.clone(), dy], |set, [dx, dy]| {
                    (set.recover_2data)(factors, &p, &q, dx, dy)
                });
                check(set, &format!("recover_data_from_q {case}"), [dx], |set, [dx]| (set.recover_data_from_q)(x, &q, dx));
            }
        }
    }
}

/// Outputs of 1 MiB and more take the streaming-store path when aligned to 64
/// bytes, and the ordinary path otherwise.
#[test]
fn large_outputs_match_scalar_aligned_or_not() {
    let len = (1 << 20) + 64 * 3;
    for count in [1, 2, 5, 8] {
        let buffers = members(count, len, 0, count as u64);
        let data = slices(&buffers, 0);
        for set in simd_sets() {
            for dest_offset in [0, 64, 1] {
                let mut outputs = [0u8; 2].map(|_| parity::bench::AlignedBuf::new(len + 64, 64));
                let (mut expected_p, mut expected_q) = (vec![0u8; len], vec![0u8; len]);
                let [p, q] = &mut outputs;
                let (p, q) = (&mut p[dest_offset..dest_offset + len], &mut q[dest_offset..dest_offset + len]);
                (kernels::scalar().pq_gen)(&data, &mut expected_p, &mut expected_q);
                (set.pq_gen)(&data, p, q);
                assert!(*p == expected_p[..] && *q == expected_q[..], "{}: pq_gen {count} x {len} @{dest_offset}", set.name);
                (set.xor_gen)(&data, q);
                assert!(*q == expected_p[..], "{}: xor_gen {count} x {len} @{dest_offset}", set.name);
            }
        }
    }
}

/// A behaviour the engine relies on: updating parity by the delta of one member
/// gives the parity of the new stripe.
#[test]
fn pq_update_by_delta_equals_regenerating() {
    for set in kernels::available() {
        for (count, len, _, seed) in cases().filter(|case| case.2 == 0 && case.0 <= 16) {
            let mut data = members(count, len, 0, seed);
            let (mut p, mut q) = (vec![0; len], vec![0; len]);
            (set.pq_gen)(&slices(&data, 0), &mut p, &mut q);
            let index = seed as usize % count;
            let new_member = random_bytes(len, seed + 77);
            let delta: Vec<u8> = data[index].iter().zip(&new_member).map(|(a, b)| a ^ b).collect();
            (set.pq_update)(index, &delta, &mut p, &mut q);
            data[index] = new_member;
            let (mut p_new, mut q_new) = (vec![0; len], vec![0; len]);
            (kernels::scalar().pq_gen)(&slices(&data, 0), &mut p_new, &mut q_new);
            assert!(p == p_new && q == q_new, "{}: pq_update of member {index} of {count}", set.name);
        }
    }
}

/// The Q convention pinned on a hand-computed example: with D0 = 1, D1 = 1,
/// D2 = 0x80, Q = 1 ^ g ^ g^2 * 0x80 = 1 ^ 2 ^ (0x200 mod 0x11d = 0x3a) = 0x39.
#[test]
fn q_follows_the_linux_convention() {
    let data: Vec<Vec<u8>> = [1u8, 1, 0x80].iter().map(|&b| vec![b; 64]).collect();
    for set in kernels::available() {
        let (mut p, mut q) = (vec![0; 64], vec![0; 64]);
        (set.pq_gen)(&slices(&data, 0), &mut p, &mut q);
        assert_eq!((p[0], q[0]), (0x80, 0x39), "{}", set.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn pq_gen_matches_scalar_on_random_stripes(
        count in 1usize..=24,
        len_vectors in 1usize..=70,
        misalignment in 0usize..64,
        seed in any::<u64>(),
    ) {
        let len = len_vectors * 64;
        let buffers = members(count, len, misalignment, seed);
        let data = slices(&buffers, misalignment);
        for set in simd_sets() {
            check(set, &format!("proptest pq_gen {count} x {len} @{misalignment}"), [vec![0; len], vec![0; len]], |set, [p, q]| {
                (set.pq_gen)(&data, p, q)
            });
            check(set, &format!("proptest xor_gen {count} x {len} @{misalignment}"), [vec![0; len]], |set, [p]| {
                (set.xor_gen)(&data, p)
            });
        }
    }
}
