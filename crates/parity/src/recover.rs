//! Rebuilding lost members of a RAID5 or RAID6 stripe, after Linux
//! `lib/raid6/recov.c`: recompute the syndromes over the surviving members with
//! the lost data taken as zero (P', Q'), then solve for the lost data with
//! precomputed GF(2^8) constants.
//!
//! Work that needs scratch space runs in `CHUNK_BYTES` pieces: the scratch lives
//! on the stack (no allocation), and each piece's P', Q' are still in L1 when the
//! solve step reads them back.

use crate::kernels::{Kernels, TwoDataFactors, DATA_MEMBERS_MAX, LENGTH_MULTIPLE_BYTES};
use std::ops::Range;

/// A RAID6 stripe holds at most 255 data members plus P and Q.
pub const RAID6_MEMBERS_MAX: usize = DATA_MEMBERS_MAX + 2;
/// A RAID5 stripe holds at most 255 data members plus P.
pub const RAID5_MEMBERS_MAX: usize = DATA_MEMBERS_MAX + 1;
/// Piece size for recoveries that need scratch space.
const CHUNK_BYTES: usize = 4096;
/// Stands in for a lost data member while recomputing the syndromes.
static ZEROES: [u8; CHUNK_BYTES] = [0; CHUNK_BYTES];

/// Why a stripe could not be recovered. Nothing was written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoverError {
    #[error("{level}: the stripe has {members} blocks; {level} needs {allowed}")]
    MemberCount { level: &'static str, members: usize, allowed: &'static str },
    #[error("{level}: block {index} is {len_bytes} bytes but block 0 is {expected_bytes} bytes; all blocks must have the same length")]
    LengthMismatch { level: &'static str, index: usize, len_bytes: usize, expected_bytes: usize },
    #[error("{level}: block length {len_bytes} bytes is not a multiple of {LENGTH_MULTIPLE_BYTES}")]
    LengthNotMultiple { level: &'static str, len_bytes: usize },
    #[error("{level}: {count} lost members {lost:?}; {level} can recover {allowed}")]
    LostCount { level: &'static str, count: usize, lost: Vec<usize>, allowed: &'static str },
    #[error("{level}: lost index {index} is out of range; the stripe's blocks are 0..{members} ({layout})")]
    IndexOutOfRange { level: &'static str, index: usize, members: usize, layout: &'static str },
    #[error("{level}: lost index {index} is listed twice in {lost:?}; lost indices must be distinct")]
    DuplicateLost { level: &'static str, index: usize, lost: Vec<usize> },
}

const RAID6: &str = "raid6_recover";
const RAID5: &str = "raid5_recover";
const RAID6_LAYOUT: &str = "data members, then P, then Q";
const RAID5_LAYOUT: &str = "data members, then P";

/// Which members of a RAID6 stripe are lost; x < y are data indices.
#[derive(Debug, Clone, Copy)]
enum Raid6Loss {
    P,
    Q,
    PQ,
    Data(usize),
    DataP(usize),
    DataQ(usize),
    TwoData(usize, usize),
}

impl Raid6Loss {
    fn classify(data_members: usize, low: usize, high: Option<usize>) -> Self {
        let (p, q) = (data_members, data_members + 1);
        match (low, high) {
            (x, None) if x == p => Self::P,
            (x, None) if x == q => Self::Q,
            (x, None) => Self::Data(x),
            (x, Some(_)) if x == p => Self::PQ,
            (x, Some(y)) if y == p => Self::DataP(x),
            (x, Some(y)) if y == q => Self::DataQ(x),
            (x, Some(y)) => Self::TwoData(x, y),
        }
    }
}

/// The blocks of a stripe split into inputs (a lost member's entry is empty) and
/// the lost blocks in ascending index order.
struct Stripe<'a> {
    inputs: [&'a [u8]; RAID6_MEMBERS_MAX],
    low: &'a mut [u8],
    high: Option<&'a mut [u8]>,
    len_bytes: usize,
}

impl<'a> Stripe<'a> {
    fn split(blocks: &'a mut [&mut [u8]], low: usize, high: Option<usize>) -> Self {
        let len_bytes = blocks[0].len();
        let mut inputs: [&'a [u8]; RAID6_MEMBERS_MAX] = [&[]; RAID6_MEMBERS_MAX];
        let (mut low_block, mut high_block) = (None, None);
        for (index, block) in blocks.iter_mut().enumerate() {
            let block: &'a mut [u8] = block;
            if index == low {
                low_block = Some(block);
            } else if Some(index) == high {
                high_block = Some(block);
            } else {
                inputs[index] = block;
            }
        }
        let low = low_block.expect("validated: the low lost index is in range");
        Stripe { inputs, low, high: high_block, len_bytes }
    }

    /// Fills `sources` with the first `count` inputs restricted to `range`,
    /// with `ZEROES` in place of the members in `zeroed`.
    fn chunk_sources<'s>(
        &self,
        count: usize,
        zeroed: &[usize],
        range: Range<usize>,
        sources: &'s mut [&'a [u8]; RAID6_MEMBERS_MAX],
    ) -> &'s [&'a [u8]] {
        for (index, source) in sources[..count].iter_mut().enumerate() {
            *source = if zeroed.contains(&index) { &ZEROES[..range.len()] } else { &self.inputs[index][range.clone()] };
        }
        &sources[..count]
    }
}

/// Byte ranges of at most `CHUNK_BYTES` covering `0..len_bytes`.
fn chunks(len_bytes: usize) -> impl Iterator<Item = Range<usize>> {
    (0..len_bytes).step_by(CHUNK_BYTES).map(move |start| start..len_bytes.min(start + CHUNK_BYTES))
}

impl Kernels {
    /// [`crate::raid6_recover`] with this kernel set.
    ///
    /// # Errors
    /// See [`crate::raid6_recover`].
    pub fn raid6_recover(&self, blocks: &mut [&mut [u8]], lost: &[usize]) -> Result<(), RecoverError> {
        let (low, high) = validate(RAID6, blocks, lost, 3..=RAID6_MEMBERS_MAX, 2)?;
        let data_members = blocks.len() - 2;
        let loss = Raid6Loss::classify(data_members, low, high);
        let mut stripe = Stripe::split(blocks, low, high);
        match loss {
            Raid6Loss::P => (self.xor_gen)(&stripe.inputs[..data_members], stripe.low),
            Raid6Loss::Q => self.regenerate_q(&mut stripe, data_members),
            Raid6Loss::PQ => {
                let q = stripe.high.as_deref_mut().expect("two-member loss");
                (self.pq_gen)(&stripe.inputs[..data_members], stripe.low, q);
            }
            Raid6Loss::Data(x) => self.xor_of_the_others(&mut stripe, data_members + 1, x),
            Raid6Loss::DataP(x) => self.recover_data_p(&mut stripe, data_members, x),
            Raid6Loss::DataQ(x) => self.recover_data_q(&mut stripe, data_members, x),
            Raid6Loss::TwoData(x, y) => self.recover_two_data(&mut stripe, data_members, x, y),
        }
        Ok(())
    }

    /// [`crate::raid5_recover`] with this kernel set.
    ///
    /// # Errors
    /// See [`crate::raid5_recover`].
    pub fn raid5_recover(&self, blocks: &mut [&mut [u8]], lost: usize) -> Result<(), RecoverError> {
        validate(RAID5, blocks, &[lost], 2..=RAID5_MEMBERS_MAX, 1)?;
        let members = blocks.len();
        let mut stripe = Stripe::split(blocks, lost, None);
        self.xor_of_the_others(&mut stripe, members, lost);
        Ok(())
    }

    /// The lost block `lost` of the XOR group `inputs[..group_members]` (data and
    /// P) is the XOR of the others: RAID5, or RAID6 with one data member lost.
    fn xor_of_the_others(&self, stripe: &mut Stripe, group_members: usize, lost: usize) {
        let last = group_members - 1;
        let mut sources = stripe.inputs;
        sources[lost] = stripe.inputs[last]; // the survivors are now sources[..last]
        (self.xor_gen)(&sources[..last], stripe.low);
    }

    /// Q lost alone: regenerate it; P goes to scratch, since it is an input.
    fn regenerate_q(&self, stripe: &mut Stripe, data_members: usize) {
        let mut scratch_p = [0u8; CHUNK_BYTES];
        let mut sources = [&[][..]; RAID6_MEMBERS_MAX];
        for range in chunks(stripe.len_bytes) {
            let data = stripe.chunk_sources(data_members, &[], range.clone(), &mut sources);
            (self.pq_gen)(data, &mut scratch_p[..range.len()], &mut stripe.low[range]);
        }
    }

    /// Data x and P lost: Dx = g^-x (Q ^ Q'), then P = P' ^ Dx.
    fn recover_data_p(&self, stripe: &mut Stripe, data_members: usize, x: usize) {
        let q = stripe.inputs[data_members + 1];
        let mut sources = [&[][..]; RAID6_MEMBERS_MAX];
        for range in chunks(stripe.len_bytes) {
            let data = stripe.chunk_sources(data_members, &[x], range.clone(), &mut sources);
            let p = &mut stripe.high.as_deref_mut().expect("two-member loss")[range.clone()];
            let dx = &mut stripe.low[range.clone()];
            (self.pq_gen)(data, p, dx);
            (self.recover_data_from_q)(x, &q[range], dx);
            (self.xor_into)(p, dx);
        }
    }

    /// Data x and Q lost: Dx from P as in RAID5, then regenerate Q.
    fn recover_data_q(&self, stripe: &mut Stripe, data_members: usize, x: usize) {
        self.xor_of_the_others(stripe, data_members + 1, x);
        let Stripe { inputs, low, high, len_bytes } = stripe;
        let mut data: [&[u8]; RAID6_MEMBERS_MAX] = *inputs;
        data[x] = low;
        let q = high.as_deref_mut().expect("two-member loss");
        let mut scratch_p = [0u8; CHUNK_BYTES];
        let mut sources = [&[][..]; RAID6_MEMBERS_MAX];
        for range in chunks(*len_bytes) {
            for (source, member) in sources.iter_mut().zip(&data[..data_members]) {
                *source = &member[range.clone()];
            }
            (self.pq_gen)(&sources[..data_members], &mut scratch_p[..range.len()], &mut q[range]);
        }
    }

    /// Data x < y lost: P', Q' go straight into Dx, Dy, then `recover_2data` solves.
    fn recover_two_data(&self, stripe: &mut Stripe, data_members: usize, x: usize, y: usize) {
        let factors = TwoDataFactors::new(x, y);
        let (p, q) = (stripe.inputs[data_members], stripe.inputs[data_members + 1]);
        let mut sources = [&[][..]; RAID6_MEMBERS_MAX];
        for range in chunks(stripe.len_bytes) {
            let data = stripe.chunk_sources(data_members, &[x, y], range.clone(), &mut sources);
            let dy = &mut stripe.high.as_deref_mut().expect("two-member loss")[range.clone()];
            let dx = &mut stripe.low[range.clone()];
            (self.pq_gen)(data, dx, dy);
            (self.recover_2data)(factors, &p[range.clone()], &q[range], dx, dy);
        }
    }
}

/// Checks a recovery request; returns the lost indices in ascending order.
fn validate(
    level: &'static str,
    blocks: &[&mut [u8]],
    lost: &[usize],
    members_allowed: std::ops::RangeInclusive<usize>,
    lost_max: usize,
) -> Result<(usize, Option<usize>), RecoverError> {
    let members = blocks.len();
    if !members_allowed.contains(&members) {
        let allowed =
            if level == RAID6 { "3..=257 blocks (1..=255 data members, P, Q)" } else { "2..=256 blocks (1..=255 data members, P)" };
        return Err(RecoverError::MemberCount { level, members, allowed });
    }
    validate_lengths(level, blocks)?;
    if lost.is_empty() || lost.len() > lost_max {
        let allowed = if lost_max == 2 { "1 or 2 members" } else { "exactly 1 member" };
        return Err(RecoverError::LostCount { level, count: lost.len(), lost: lost.to_vec(), allowed });
    }
    let layout = if level == RAID6 { RAID6_LAYOUT } else { RAID5_LAYOUT };
    if let Some(&index) = lost.iter().find(|&&index| index >= members) {
        return Err(RecoverError::IndexOutOfRange { level, index, members, layout });
    }
    match *lost {
        [only] => Ok((only, None)),
        [a, b] if a == b => Err(RecoverError::DuplicateLost { level, index: a, lost: lost.to_vec() }),
        [a, b] => Ok((a.min(b), Some(a.max(b)))),
        _ => unreachable!("lost count checked above"),
    }
}

fn validate_lengths(level: &'static str, blocks: &[&mut [u8]]) -> Result<(), RecoverError> {
    let expected_bytes = blocks[0].len();
    if let Some((index, block)) = blocks.iter().enumerate().find(|(_, block)| block.len() != expected_bytes) {
        return Err(RecoverError::LengthMismatch { level, index, len_bytes: block.len(), expected_bytes });
    }
    if !expected_bytes.is_multiple_of(LENGTH_MULTIPLE_BYTES) {
        return Err(RecoverError::LengthNotMultiple { level, len_bytes: expected_bytes });
    }
    Ok(())
}
