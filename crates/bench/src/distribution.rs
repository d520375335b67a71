//! Where a worker's random requests fall in its zone: uniformly (IOMeter's only choice), or
//! skewed as real data is, so that a cache has a hot set to find (fio's `random_distribution`,
//! with fio's names and syntax: `uniform`, `zipf:THETA`, `zoned:IO/SPACE[:IO/SPACE...]`).
//!
//! Pure, as `spec` is: the random numbers come from the caller's seeded generator, and the
//! mapping from a draw to a block depends only on the zone, so every worker that shares a
//! zone shares its hot set. Sequential requests are not affected.
//!
//! Zipf ranks are drawn with rand_distr's rejection-inversion sampler (O(1) per draw for any
//! number of blocks). Rank `k` goes to block `(k × a) mod blocks`, with `a` the integer nearest
//! `blocks / φ` made coprime with `blocks`: a permutation, so no block is hotter than its rank
//! says, that spreads neighbouring ranks evenly over the zone (fio hashes its ranks for the
//! same reason: the hottest blocks of real data are not one contiguous run).

use rand::Rng;
use rand_distr::{Distribution as _, Zipf};
use serde::{Deserialize, Serialize};

/// The skew of random offsets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Distribution {
    /// Every block of the zone equally likely.
    #[default]
    Uniform,
    /// The block of rank `k` (1 the hottest) drawn with a probability proportional to
    /// `1 / k^theta`; theta above 0 (fio's 1.2 is a common choice; the larger, the hotter).
    Zipf { theta: f64 },
    /// Consecutive parts of the zone from its start, each taking a share of the requests and
    /// of the space (`zoned:90/10`: 90 % of requests to the first 10 % of the zone, the rest
    /// spread over the other 90 %); within a part, uniform.
    Zoned(Vec<ZonedPart>),
}

/// One part of a [`Distribution::Zoned`]: shares in percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZonedPart {
    pub io_percent: u32,
    pub space_percent: u32,
}

const ALLOWED: &str = "allowed: uniform, zipf:THETA (THETA above 0, e.g. zipf:1.2), or zoned:IO/SPACE[:IO/SPACE...] \
     (percent of requests / percent of the zone per part from the zone's start, e.g. zoned:90/10)";

impl Distribution {
    /// Parses fio's syntax. A zoned list whose shares add up to less than 100 on both sides
    /// gets a last part with the rest (`zoned:90/10` is `zoned:90/10:10/90`).
    ///
    /// # Errors
    /// What is wrong, and what is allowed.
    pub fn parse(text: &str) -> Result<Distribution, String> {
        let wrong = |why: &str| format!("distribution {text:?}: {why}; {ALLOWED}");
        let (kind, argument) = text.split_once(':').unwrap_or((text, ""));
        match kind {
            "uniform" if argument.is_empty() => Ok(Distribution::Uniform),
            "zipf" => {
                let theta: f64 = argument.parse().map_err(|_| wrong("THETA is not a number"))?;
                if !(theta.is_finite() && theta > 0.0 && theta <= 100.0) {
                    return Err(wrong("THETA must be above 0 and at most 100"));
                }
                Ok(Distribution::Zipf { theta })
            }
            "zoned" => parse_zoned(argument).map(Distribution::Zoned).map_err(|why| wrong(&why)),
            _ => Err(wrong("unknown kind")),
        }
    }

    /// The text `parse` reads back.
    pub fn text(&self) -> String {
        match self {
            Distribution::Uniform => "uniform".into(),
            Distribution::Zipf { theta } => format!("zipf:{theta}"),
            Distribution::Zoned(parts) => {
                let parts: Vec<String> = parts.iter().map(|p| format!("{}/{}", p.io_percent, p.space_percent)).collect();
                format!("zoned:{}", parts.join(":"))
            }
        }
    }

    /// Slot (block index) `0..slots` of the next random request.
    ///
    /// # Panics
    /// If `slots` is 0.
    pub fn slot(&self, slots: u64, rng: &mut impl Rng) -> u64 {
        assert!(slots > 0, "a zone with no room for a request");
        match self {
            Distribution::Uniform => rng.gen_range(0..slots),
            Distribution::Zipf { theta } => {
                let zipf = Zipf::new(slots, *theta).expect("slots above 0 and theta above 0 (checked in parse)");
                // Ranks are 1..=slots as floats; the hottest is 1.
                let rank = (zipf.sample(rng) as u64).clamp(1, slots) - 1;
                scatter(rank, slots)
            }
            Distribution::Zoned(parts) => zoned_slot(parts, slots, rng),
        }
    }
}

impl From<Distribution> for String {
    fn from(distribution: Distribution) -> String {
        distribution.text()
    }
}

impl TryFrom<String> for Distribution {
    type Error = String;
    fn try_from(text: String) -> Result<Distribution, String> {
        Distribution::parse(&text)
    }
}

fn parse_zoned(argument: &str) -> Result<Vec<ZonedPart>, String> {
    let mut parts = Vec::new();
    for part in argument.split(':') {
        let (io, space) = part.split_once('/').ok_or_else(|| format!("part {part:?} is not IO/SPACE"))?;
        let percent = |s: &str| s.parse::<u32>().ok().filter(|&p| p <= 100);
        let (Some(io_percent), Some(space_percent)) = (percent(io), percent(space)) else {
            return Err(format!("part {part:?}: shares are whole percents from 0 to 100"));
        };
        if space_percent == 0 && io_percent > 0 {
            return Err(format!("part {part:?} sends requests to no space"));
        }
        parts.push(ZonedPart { io_percent, space_percent });
    }
    let io: u32 = parts.iter().map(|p| p.io_percent).sum();
    let space: u32 = parts.iter().map(|p| p.space_percent).sum();
    match (io, space) {
        (100, 100) => {}
        (io, space) if io < 100 && space < 100 => parts.push(ZonedPart { io_percent: 100 - io, space_percent: 100 - space }),
        _ => return Err(format!("the parts take {io}% of the requests and {space}% of the space; both must be 100, or both less")),
    }
    Ok(parts)
}

/// A part by its share of requests, then a slot uniformly within its share of the space.
fn zoned_slot(parts: &[ZonedPart], slots: u64, rng: &mut impl Rng) -> u64 {
    let roll = rng.gen_range(0..100);
    let (mut io_end, mut space_before) = (0, 0);
    for part in parts {
        io_end += part.io_percent;
        if roll < io_end {
            let start = slots * u64::from(space_before) / 100;
            let end = (slots * u64::from(space_before + part.space_percent) / 100).max(start + 1).min(slots);
            return rng.gen_range(start..end);
        }
        space_before += part.space_percent;
    }
    unreachable!("the parts' request shares add up to 100 (checked in parse)")
}

/// The block of rank `rank`: a permutation of `0..slots` (see the module docs).
fn scatter(rank: u64, slots: u64) -> u64 {
    let step = scatter_step(slots);
    ((u128::from(rank) * u128::from(step)) % u128::from(slots)) as u64
}

/// The integer nearest `slots / φ`, moved up until coprime with `slots`.
fn scatter_step(slots: u64) -> u64 {
    let mut step = ((slots as f64) * 0.618_033_988_749_895).round().max(1.0) as u64;
    while gcd(step, slots) != 1 {
        step += 1;
    }
    step
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn counts(distribution: &Distribution, slots: u64, draws: usize) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = vec![0u64; slots as usize];
        for _ in 0..draws {
            counts[distribution.slot(slots, &mut rng) as usize] += 1;
        }
        counts
    }

    #[test]
    fn texts_parse_back_and_bad_ones_say_what_is_allowed() {
        for text in ["uniform", "zipf:1.2", "zipf:0.8", "zoned:90/10:10/90", "zoned:60/10:30/20:10/70"] {
            assert_eq!(Distribution::parse(text).unwrap().text(), text);
        }
        assert_eq!(Distribution::parse("zoned:90/10").unwrap().text(), "zoned:90/10:10/90");
        for (text, why) in [
            ("pareto:0.5", "unknown kind"),
            ("zipf:0", "above 0"),
            ("zipf:x", "not a number"),
            ("zoned:90/10:20/10", "110% of the requests"),
            ("zoned:50/100", "both must be 100"),
            ("zoned:10/0", "no space"),
            ("zoned:90-10", "not IO/SPACE"),
            ("uniform:3", "unknown kind"),
        ] {
            let error = Distribution::parse(text).unwrap_err();
            assert!(error.contains(why) && error.contains("allowed: uniform"), "{text}: {error}");
        }
    }

    #[test]
    fn zoned_sends_each_share_of_requests_to_its_share_of_space() {
        let distribution = Distribution::parse("zoned:90/10").unwrap();
        let counts = counts(&distribution, 1000, 200_000);
        let hot: u64 = counts[..100].iter().sum();
        let share = hot as f64 / 200_000.0;
        assert!((share - 0.9).abs() < 0.01, "the first 10% of the zone took {share:.3} of the requests");
        assert!(counts[100..].iter().all(|&c| c > 0), "the cold part is still reached");
    }

    #[test]
    fn zipf_is_skewed_by_theta_and_scattered_over_the_zone() {
        let slots = 10_000;
        let share_of_hottest_percent = |theta: f64| {
            let mut counts = counts(&Distribution::Zipf { theta }, slots, 200_000);
            counts.sort_unstable_by(|a, b| b.cmp(a));
            counts[..(slots / 100) as usize].iter().sum::<u64>() as f64 / 2000.0
        };
        let (mild, steep) = (share_of_hottest_percent(0.8), share_of_hottest_percent(1.2));
        // 1% of the blocks take far more than 1% of the requests, more so for a larger theta.
        assert!(mild > 10.0 && steep > mild + 20.0, "hottest 1% of blocks: {mild:.1}% (0.8), {steep:.1}% (1.2)");
        // The ten hottest ranks lie in different tenths of the zone, not side by side.
        let tenths: std::collections::HashSet<u64> = (0..10).map(|rank| scatter(rank, slots) * 10 / slots).collect();
        assert!(tenths.len() >= 8, "the hottest ranks fall in only {} tenths of the zone", tenths.len());
    }

    #[test]
    fn scatter_is_a_permutation() {
        for slots in [1, 2, 3, 10, 64, 1000, 4096, 9973] {
            let mut seen: Vec<u64> = (0..slots).map(|rank| scatter(rank, slots)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..slots).collect::<Vec<_>>(), "slots {slots}");
        }
    }

    #[test]
    fn uniform_reaches_every_slot_evenly() {
        let counts = counts(&Distribution::Uniform, 100, 100_000);
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }
}
