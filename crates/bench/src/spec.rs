//! IOMeter access specifications: lines of (block size, share of requests, read %, random %,
//! alignment), and how a worker picks the line and the offset of its next I/O.
//!
//! Pure: no I/O, no clock. The generator takes its random numbers from the caller's seeded RNG,
//! so the same seed gives the same sequence of requests.

use crate::distribution::Distribution;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The unit every offset and length is a multiple of.
pub const SECTOR_BYTES: u64 = 512;

/// One line of an access specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessLine {
    pub block_bytes: u64,
    /// Share of the worker's requests that use this line; the lines of a spec add up to 100.
    pub share_percent: u32,
    pub read_percent: u32,
    pub random_percent: u32,
    /// Random offsets are multiples of this, sequential ones are rounded up to it.
    pub align_bytes: u64,
}

impl AccessLine {
    /// A line that takes every request, aligned to its own block size.
    pub fn whole(block_bytes: u64, read_percent: u32, random_percent: u32) -> AccessLine {
        AccessLine { block_bytes, share_percent: 100, read_percent, random_percent, align_bytes: block_bytes }
    }
}

/// The lines one worker draws its requests from, each by its share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessSpec {
    lines: Vec<AccessLine>,
}

impl AccessSpec {
    /// # Errors
    /// A message naming the first wrong line: shares that do not add up to 100, a block or an
    /// alignment that is not a positive multiple of 512 bytes, a percentage above 100.
    pub fn new(lines: Vec<AccessLine>) -> Result<AccessSpec, String> {
        if lines.is_empty() {
            return Err("an access specification needs at least one line".into());
        }
        for (index, line) in lines.iter().enumerate() {
            check_line(line).map_err(|problem| format!("access line {}: {problem}", index + 1))?;
        }
        let shares: u32 = lines.iter().map(|l| l.share_percent).sum();
        if shares != 100 {
            return Err(format!("the shares of the access lines add up to {shares}%, not 100%"));
        }
        Ok(AccessSpec { lines })
    }

    pub fn lines(&self) -> &[AccessLine] {
        &self.lines
    }

    /// The line for `roll_percent` in `0..100`: lines own consecutive ranges the width of
    /// their shares, in order.
    pub fn pick(&self, roll_percent: u32) -> &AccessLine {
        assert!(roll_percent < 100, "roll {roll_percent} out of 0..100");
        let mut end = 0;
        for line in &self.lines {
            end += line.share_percent;
            if roll_percent < end {
                return line;
            }
        }
        unreachable!("shares add up to 100 (checked in new)")
    }

    pub fn block_bytes_max(&self) -> u64 {
        self.lines.iter().map(|l| l.block_bytes).max().expect("at least one line")
    }

    /// Whether any request may be a write.
    pub fn writes(&self) -> bool {
        self.lines.iter().any(|l| l.read_percent < 100 && l.share_percent > 0)
    }
}

fn check_line(line: &AccessLine) -> Result<(), String> {
    for (what, bytes) in [("block size", line.block_bytes), ("alignment", line.align_bytes)] {
        if bytes == 0 || bytes % SECTOR_BYTES != 0 {
            return Err(format!("{what} {bytes} bytes is not a positive multiple of {SECTOR_BYTES}"));
        }
    }
    for (what, percent) in [("share", line.share_percent), ("read", line.read_percent), ("random", line.random_percent)] {
        if percent > 100 {
            return Err(format!("{what} {percent}% is above 100%"));
        }
    }
    Ok(())
}

/// One request a worker decided to issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    pub write: bool,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// Where one worker's requests go: its zone, how its random requests fall in it, and the end
/// of its last request, where the next sequential one starts (IOMeter's rule: "sequential"
/// continues from the last I/O, whatever that was).
#[derive(Clone, Debug)]
pub struct Cursor {
    zone: Range<u64>,
    next_bytes: u64,
    distribution: Distribution,
}

impl Cursor {
    /// # Panics
    /// If the zone is not sector-aligned or `first_bytes` lies outside it.
    pub fn new(zone: Range<u64>, first_bytes: u64) -> Cursor {
        assert!(zone.start.is_multiple_of(SECTOR_BYTES) && zone.end.is_multiple_of(SECTOR_BYTES), "zone {zone:?} is not sector-aligned");
        assert!(zone.contains(&first_bytes) || first_bytes == zone.start, "first offset {first_bytes} outside {zone:?}");
        Cursor { zone, next_bytes: first_bytes, distribution: Distribution::Uniform }
    }

    /// The same cursor with its random requests drawn from `distribution`.
    pub fn with_distribution(self, distribution: Distribution) -> Cursor {
        Cursor { distribution, ..self }
    }

    pub fn zone(&self) -> &Range<u64> {
        &self.zone
    }

    /// Whether a request of `line` fits in the zone at all.
    pub fn fits(&self, line: &AccessLine) -> bool {
        aligned_start(&self.zone, line).is_some_and(|start| start + line.block_bytes <= self.zone.end)
    }

    /// The next request of `spec`: its line by share, then read or write, then random or
    /// sequential, each by the line's percentages.
    ///
    /// # Panics
    /// If the picked line does not fit in the zone (callers check with [`Cursor::fits`]).
    pub fn next(&mut self, spec: &AccessSpec, rng: &mut impl Rng) -> Io {
        let line = *spec.pick(rng.gen_range(0..100));
        let write = rng.gen_range(0..100) >= line.read_percent;
        let random = rng.gen_range(0..100) < line.random_percent;
        let offset_bytes = if random { self.random_offset(&line, rng) } else { self.sequential_offset(&line) };
        debug_assert!(offset_bytes >= self.zone.start && offset_bytes + line.block_bytes <= self.zone.end);
        self.next_bytes = offset_bytes + line.block_bytes;
        Io { write, offset_bytes, len_bytes: line.block_bytes }
    }

    /// Moves the sequential position past a request that could not be issued (its blocks were
    /// busy), so that the next try looks further on.
    pub fn skip(&mut self, io: &Io) {
        self.next_bytes = io.offset_bytes + io.len_bytes;
    }

    fn random_offset(&self, line: &AccessLine, rng: &mut impl Rng) -> u64 {
        let start = aligned_start(&self.zone, line).expect("line fits the zone");
        let slots = (self.zone.end - line.block_bytes - start) / line.align_bytes + 1;
        start + self.distribution.slot(slots, rng) * line.align_bytes
    }

    /// From the end of the last request, rounded up to the alignment; back to the start of the
    /// zone when the request would cross its end.
    fn sequential_offset(&self, line: &AccessLine) -> u64 {
        let wanted = self.next_bytes.next_multiple_of(line.align_bytes);
        if wanted >= self.zone.start && wanted + line.block_bytes <= self.zone.end {
            return wanted;
        }
        aligned_start(&self.zone, line).expect("line fits the zone")
    }
}

fn aligned_start(zone: &Range<u64>, line: &AccessLine) -> Option<u64> {
    let start = zone.start.next_multiple_of(line.align_bytes);
    (start + line.block_bytes <= zone.end).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    const KIB: u64 = 1024;

    fn line(block_bytes: u64, share_percent: u32, read_percent: u32, random_percent: u32) -> AccessLine {
        AccessLine { block_bytes, share_percent, read_percent, random_percent, align_bytes: block_bytes }
    }

    #[test]
    fn lines_are_picked_by_share() {
        // file-server: the shares of BENCH.md, checked statistically over a seeded run.
        let shares = [(512, 10), (KIB, 5), (2 * KIB, 5), (4 * KIB, 60), (8 * KIB, 2), (16 * KIB, 4), (32 * KIB, 4), (64 * KIB, 10)];
        let spec = AccessSpec::new(shares.iter().map(|&(b, s)| line(b, s, 80, 100)).collect()).unwrap();
        let mut cursor = Cursor::new(0..(1 << 30), 0);
        let mut rng = SmallRng::seed_from_u64(42);
        let draws = 200_000;
        let mut counts = std::collections::HashMap::new();
        let mut writes = 0;
        for _ in 0..draws {
            let io = cursor.next(&spec, &mut rng);
            *counts.entry(io.len_bytes).or_insert(0u32) += 1;
            writes += u32::from(io.write);
        }
        for (block, share) in shares {
            let seen = f64::from(counts[&block]) / f64::from(draws) * 100.0;
            assert!((seen - f64::from(share)).abs() < 0.5, "{block}-byte line: {seen:.2}% of requests, expected {share}%");
        }
        let write_percent = f64::from(writes) / f64::from(draws) * 100.0;
        assert!((write_percent - 20.0).abs() < 0.5, "writes {write_percent:.2}%, expected 20%");
    }

    #[test]
    fn pick_covers_each_share_exactly() {
        let spec = AccessSpec::new(vec![line(512, 10, 100, 0), line(4096, 60, 100, 0), line(8192, 30, 100, 0)]).unwrap();
        let picked: Vec<u64> = (0..100).map(|roll| spec.pick(roll).block_bytes).collect();
        assert_eq!(picked.iter().filter(|&&b| b == 512).count(), 10);
        assert_eq!(picked.iter().filter(|&&b| b == 4096).count(), 60);
        assert_eq!(picked.iter().filter(|&&b| b == 8192).count(), 30);
    }

    #[test]
    fn bad_specs_name_the_problem() {
        let check = |lines: Vec<AccessLine>, expected: &str| {
            let error = AccessSpec::new(lines).unwrap_err();
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
        };
        check(vec![line(4096, 60, 100, 0)], "add up to 60%");
        check(vec![line(1000, 100, 100, 0)], "block size 1000 bytes");
        check(vec![line(4096, 100, 101, 0)], "read 101%");
        check(vec![], "at least one line");
    }

    #[test]
    fn random_offsets_follow_the_distribution_and_stay_aligned() {
        let spec = AccessSpec::new(vec![line(8 * KIB, 100, 100, 100)]).unwrap();
        let zone = 4 * KIB..4 * KIB + 80 * 1024 * KIB;
        let distribution = Distribution::parse("zoned:90/10").unwrap();
        let mut cursor = Cursor::new(zone.clone(), zone.start).with_distribution(distribution);
        let mut rng = SmallRng::seed_from_u64(5);
        let hot_end = zone.start.next_multiple_of(8 * KIB) + 8 * 1024 * KIB;
        let mut hot = 0;
        for _ in 0..20_000 {
            let io = cursor.next(&spec, &mut rng);
            assert!(
                io.offset_bytes.is_multiple_of(8 * KIB) && zone.contains(&io.offset_bytes) && io.offset_bytes + io.len_bytes <= zone.end
            );
            hot += u32::from(io.offset_bytes < hot_end);
        }
        let share = f64::from(hot) / 20_000.0;
        assert!((share - 0.9).abs() < 0.01, "the zone's first 10% took {share:.3} of the requests");
    }

    #[test]
    fn sequential_wraps_to_the_zone_start() {
        let spec = AccessSpec::new(vec![line(64 * KIB, 100, 100, 0)]).unwrap();
        // A zone of three and a half blocks: the half block at the end is never used.
        let zone = 1024 * KIB..1024 * KIB + 224 * KIB;
        let mut cursor = Cursor::new(zone.clone(), zone.start);
        let mut rng = SmallRng::seed_from_u64(1);
        let offsets: Vec<u64> = (0..7).map(|_| cursor.next(&spec, &mut rng).offset_bytes / KIB).collect();
        assert_eq!(offsets, [1024, 1088, 1152, 1024, 1088, 1152, 1024]);
    }

    #[test]
    fn sequential_starts_at_the_first_offset_and_random_stays_aligned_in_the_zone() {
        let zone = 10 * 4096..30 * 4096;
        let spec = AccessSpec::new(vec![line(8192, 100, 50, 0)]).unwrap();
        let mut cursor = Cursor::new(zone.clone(), 20 * 4096);
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(cursor.next(&spec, &mut rng).offset_bytes, 20 * 4096);
        let random = AccessSpec::new(vec![line(8192, 100, 50, 100)]).unwrap();
        for _ in 0..10_000 {
            let io = cursor.next(&random, &mut rng);
            assert!(io.offset_bytes >= zone.start && io.offset_bytes + io.len_bytes <= zone.end, "{io:?} leaves {zone:?}");
            assert_eq!(io.offset_bytes % 8192, 0);
        }
    }
}
