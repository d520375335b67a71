//! Recovery of every one- and two-member loss with every kernel set, and the
//! errors and panics a caller sees for bad input.

use parity::kernels::{self, Kernels};
use parity::RecoverError;
use proptest::prelude::*;

/// One vector, and a length spanning several 4 KiB recovery chunks plus a tail.
const LENGTHS_BYTES: [usize; 2] = [64, 3 * 4096 + 192];

fn random_bytes(len_bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A consistent RAID6 stripe [D0 .. D(n-1), P, Q], parity from the scalar oracle.
fn raid6_stripe(data_members: usize, len_bytes: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut stripe: Vec<Vec<u8>> = (0..data_members).map(|i| random_bytes(len_bytes, seed.wrapping_add(i as u64 * 7919))).collect();
    let (mut p, mut q) = (vec![0; len_bytes], vec![0; len_bytes]);
    let data: Vec<&[u8]> = stripe.iter().map(|d| &d[..]).collect();
    (kernels::scalar().pq_gen)(&data, &mut p, &mut q);
    stripe.extend([p, q]);
    stripe
}

/// Every loss RAID6 can survive over `members` blocks: each single, each pair.
fn loss_patterns(members: usize) -> Vec<Vec<usize>> {
    let singles = (0..members).map(|a| vec![a]);
    let pairs = (0..members).flat_map(|a| (a + 1..members).flat_map(move |b| [vec![a, b], vec![b, a]]));
    singles.chain(pairs).collect()
}

/// Overwrites the lost blocks with garbage, recovers, and expects the original
/// stripe back byte for byte (so survivors were not modified either).
fn check_recovers(
    set: &Kernels,
    stripe: &[Vec<u8>],
    lost: &[usize],
    recover: impl Fn(&Kernels, &mut [&mut [u8]], &[usize]) -> Result<(), RecoverError>,
) {
    let mut damaged = stripe.to_vec();
    for &index in lost {
        damaged[index] = random_bytes(stripe[0].len(), 0xdead + index as u64);
    }
    let mut blocks: Vec<&mut [u8]> = damaged.iter_mut().map(|b| &mut b[..]).collect();
    let result = recover(set, &mut blocks, lost);
    let case = format!("{}: {} blocks x {} bytes, lost {lost:?}", set.name, stripe.len(), stripe[0].len());
    assert_eq!(result, Ok(()), "{case}");
    for (index, (got, want)) in damaged.iter().zip(stripe).enumerate() {
        assert!(got == want, "{case}: block {index} differs after recovery");
    }
}

fn raid6(set: &Kernels, blocks: &mut [&mut [u8]], lost: &[usize]) -> Result<(), RecoverError> {
    set.raid6_recover(blocks, lost)
}

fn raid5(set: &Kernels, blocks: &mut [&mut [u8]], lost: &[usize]) -> Result<(), RecoverError> {
    set.raid5_recover(blocks, lost[0])
}

#[test]
fn raid6_recovers_every_loss_pattern_with_every_kernel_set() {
    for set in kernels::available() {
        for data_members in (1..=12).chain([31]) {
            for len in LENGTHS_BYTES {
                let stripe = raid6_stripe(data_members, len, (data_members * len) as u64);
                for lost in loss_patterns(data_members + 2) {
                    check_recovers(set, &stripe, &lost, raid6);
                }
            }
        }
    }
}

#[test]
fn raid6_recovers_members_far_apart_in_a_wide_stripe() {
    let stripe = raid6_stripe(255, 256, 4242);
    for set in kernels::available() {
        for lost in [[0, 254], [0, 1], [253, 254], [17, 255], [254, 256], [255, 256], [0, 256]] {
            check_recovers(set, &stripe, &lost, raid6);
        }
    }
}

#[test]
fn raid5_recovers_every_single_loss_with_every_kernel_set() {
    for set in kernels::available() {
        for data_members in 1..=12 {
            for len in LENGTHS_BYTES {
                let mut stripe = raid6_stripe(data_members, len, 99 + data_members as u64);
                stripe.pop(); // RAID5 has no Q
                for lost in 0..stripe.len() {
                    check_recovers(set, &stripe, &[lost], raid5);
                }
            }
        }
    }
}

#[test]
fn top_level_functions_use_the_best_set() {
    let stripe = raid6_stripe(6, 4096, 7);
    check_recovers(kernels::best(), &stripe, &[1, 4], |_, blocks, lost| parity::raid6_recover(blocks, lost));
    let raid5_stripe = &stripe[..7];
    check_recovers(kernels::best(), raid5_stripe, &[2], |_, blocks, lost| parity::raid5_recover(blocks, lost[0]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn raid6_recovers_random_stripes(
        data_members in 2usize..=20,
        len_vectors in 1usize..=140,
        a in 0usize..22,
        b in 0usize..22,
        seed in any::<u64>(),
    ) {
        let members = data_members + 2;
        let (a, b) = (a % members, b % members);
        let lost = if a == b { vec![a] } else { vec![a, b] };
        let stripe = raid6_stripe(data_members, len_vectors * 64, seed);
        for set in kernels::available() {
            check_recovers(set, &stripe, &lost, raid6);
        }
    }
}

/// Block lengths for a bad-input case; all 64 unless overridden.
fn blocks_of(lengths: &[usize]) -> Vec<Vec<u8>> {
    lengths.iter().map(|&len| vec![0u8; len]).collect()
}

/// The request fails, the message names the problem and what is allowed, and
/// nothing was written.
fn check_error(level: &str, lengths: &[usize], lost: &[usize], expected: &[&str]) {
    let mut buffers = blocks_of(lengths);
    let mut blocks: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
    let result = match level {
        "raid6" => parity::raid6_recover(&mut blocks, lost),
        _ => parity::raid5_recover(&mut blocks, lost[0]),
    };
    let message = result.expect_err("bad input must be rejected").to_string();
    for part in expected {
        assert!(message.contains(part), "{level} {lengths:?} lost {lost:?}: {message:?} lacks {part:?}");
    }
    assert!(buffers.iter().flatten().all(|&b| b == 0), "nothing is written on error");
}

#[test]
fn bad_recovery_requests_are_rejected_with_clear_messages() {
    let six = [64; 6];
    check_error("raid6", &six, &[1, 2, 3], &["3 lost members [1, 2, 3]", "can recover 1 or 2 members"]);
    check_error("raid6", &six, &[], &["0 lost members", "1 or 2"]);
    check_error("raid6", &six, &[2, 2], &["lost index 2 is listed twice", "must be distinct"]);
    check_error("raid6", &six, &[1, 6], &["lost index 6 is out of range", "0..6", "then P, then Q"]);
    check_error("raid6", &[64, 64, 128, 64], &[0], &["block 2 is 128 bytes but block 0 is 64", "same length"]);
    check_error("raid6", &[100; 4], &[0], &["100 bytes is not a multiple of 64"]);
    check_error("raid6", &[64; 2], &[0], &["has 2 blocks", "3..=257 blocks"]);
    check_error("raid6", &[64; 258], &[0], &["has 258 blocks", "1..=255 data members"]);
    check_error("raid5", &[64; 4], &[4], &["raid5_recover", "lost index 4 is out of range", "0..4"]);
    check_error("raid5", &[64; 1], &[0], &["has 1 blocks", "2..=256"]);
    check_error("raid5", &[64, 192], &[0], &["block 1 is 192 bytes but block 0 is 64"]);
}

/// Runs `f`, which must panic, and checks the panic message.
fn check_panics(case: &str, expected: &str, f: impl FnOnce() + std::panic::UnwindSafe) {
    let payload = std::panic::catch_unwind(f).expect_err(case);
    let message =
        payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
    assert!(message.contains(expected), "{case}: panic {message:?} lacks {expected:?}");
}

#[test]
fn bad_lengths_panic_with_clear_messages() {
    let [a, b, short, odd] = [vec![0u8; 128], vec![0u8; 128], vec![0u8; 64], vec![0u8; 100]];
    for set in kernels::available() {
        let name = set.name;
        let mut dest = vec![0u8; 128];
        let mut q = vec![0u8; 128];
        let mut check = |case: &str, expected: &str, f: &dyn Fn(&mut [u8], &mut [u8])| {
            let (dest, q) = (&mut dest, &mut q);
            check_panics(&format!("{name}: {case}"), expected, std::panic::AssertUnwindSafe(|| f(dest, q)));
        };
        check("xor_gen short source", "source 1 is 64 bytes but dest is 128", &|d, _| (set.xor_gen)(&[&a, &short], d));
        check("xor_gen no sources", "at least one source", &|d, _| (set.xor_gen)(&[], d));
        check("xor_into odd", "is 100 bytes but dest is 128", &|d, _| (set.xor_into)(d, &odd));
        check("pq_gen short q", "q is 128 bytes but dest is 64", &|d, q| (set.pq_gen)(&[&short], &mut d[..64], q));
        check("pq_gen 256 data", "256 data members; RAID6 allows 1..=255", &|d, q| (set.pq_gen)(&vec![&b[..]; 256], d, q));
        check("pq_gen unaligned length", "length 100 bytes is not a multiple of 64", &|_, _| {
            (set.pq_gen)(&[&odd], &mut [0; 100], &mut [0; 100])
        });
        check("pq_update index", "data index 255 out of range", &|d, q| (set.pq_update)(255, &b, d, q));
        check("gf_mul_into short", "src is 64 bytes but dest is 128", &|d, _| (set.gf_mul_into)(3, &short, d));
    }
}
