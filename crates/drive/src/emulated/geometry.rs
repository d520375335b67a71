//! Where a byte lies on the platters and how long the head takes to reach it: pure functions of
//! a drive's datasheet figures, no state.
//!
//! Zoned bit recording is modelled as a media rate that falls linearly with the byte offset, from
//! the outer-zone to the inner-zone sustained rate. A track holds one revolution of data, i.e.
//! `rate × revolution time` bytes, so outer tracks hold more. Integrating `1 / (rate × revolution
//! time)` over the offset gives the *track position* of a byte in closed form,
//! `k · ln(rate(offset) / outer rate)`: its integer part counts tracks from the outer edge (the
//! seek distance), its fraction is the angle of the byte on its track in revolutions (the
//! rotational latency). Transfer time is the track positions passed times the revolution time,
//! so the platter angle and the head stay consistent however requests are cut. Track skew is
//! taken as perfect: reading on into the next track loses no time, which is what a datasheet's
//! sustained rate measures.
//!
//! The emulated capacity always spans the whole stroke and both zones: a drive emulated at
//! 8 GiB seeks and transfers like the full-size model over its whole surface.

/// Angles are computed from whole-nanosecond times, so a sector reached "just now" can come out a
/// hair late; within this many revolutions that is rounding, not a missed revolution.
const ANGLE_TOLERANCE_REVOLUTIONS: f64 = 1e-5;

pub(crate) struct Platter {
    capacity_bytes: f64,
    revolution_ns: f64,
    outer_rate_bytes_per_ns: f64,
    inner_rate_bytes_per_ns: f64,
    /// `k` above, in tracks.
    tracks_per_log_rate: f64,
}

impl Platter {
    /// Rates in MB/s as datasheets give them (1 MB = 10^6 bytes).
    pub(crate) fn new(rpm: f64, outer_mb_per_s: f64, inner_mb_per_s: f64, capacity_bytes: u64) -> Platter {
        assert!(rpm > 0.0 && capacity_bytes > 0);
        assert!(0.0 < inner_mb_per_s && inner_mb_per_s < outer_mb_per_s, "zoned recording: inner tracks are slower");
        let revolution_ns = 60e9 / rpm;
        let outer_rate_bytes_per_ns = outer_mb_per_s * 1e-3;
        let inner_rate_bytes_per_ns = inner_mb_per_s * 1e-3;
        let capacity = capacity_bytes as f64;
        // Both factors are negative: the rate falls towards the inside.
        let tracks_per_log_rate = capacity / (revolution_ns * (inner_rate_bytes_per_ns - outer_rate_bytes_per_ns));
        Platter { capacity_bytes: capacity, revolution_ns, outer_rate_bytes_per_ns, inner_rate_bytes_per_ns, tracks_per_log_rate }
    }

    #[cfg(test)]
    pub(crate) fn revolution_ns(&self) -> f64 {
        self.revolution_ns
    }

    fn rate_bytes_per_ns(&self, offset_bytes: f64) -> f64 {
        let fraction = offset_bytes / self.capacity_bytes;
        self.outer_rate_bytes_per_ns + (self.inner_rate_bytes_per_ns - self.outer_rate_bytes_per_ns) * fraction
    }

    /// Tracks from the outer edge to `offset_bytes`; the fraction is the angle in revolutions.
    pub(crate) fn track_position(&self, offset_bytes: u64) -> f64 {
        let rate = self.rate_bytes_per_ns(offset_bytes as f64);
        self.tracks_per_log_rate * (rate / self.outer_rate_bytes_per_ns).ln()
    }

    /// The inverse of `track_position`.
    fn offset_at(&self, track_position: f64) -> f64 {
        let rate = self.outer_rate_bytes_per_ns * (track_position / self.tracks_per_log_rate).exp();
        let fraction = (rate - self.outer_rate_bytes_per_ns) / (self.inner_rate_bytes_per_ns - self.outer_rate_bytes_per_ns);
        (fraction * self.capacity_bytes).clamp(0.0, self.capacity_bytes)
    }

    pub(crate) fn track_count(&self) -> f64 {
        self.track_position(self.capacity_bytes as u64)
    }

    /// Time the head spends over `[offset, offset + len)`.
    pub(crate) fn transfer_ns(&self, offset_bytes: u64, len_bytes: u64) -> f64 {
        (self.track_position(offset_bytes + len_bytes) - self.track_position(offset_bytes)) * self.revolution_ns
    }

    /// Where a head reading on from `from_bytes` is after `elapsed_ns`.
    pub(crate) fn offset_after(&self, from_bytes: u64, elapsed_ns: f64) -> u64 {
        let position = self.track_position(from_bytes) + elapsed_ns / self.revolution_ns;
        self.offset_at(position) as u64
    }

    /// From `at_ns` until `offset_bytes` passes under the head (the platter turned by
    /// `at_ns / revolution` since time 0, the byte sits at the fraction of its track position).
    /// Slightly negative when the sector passed within rounding: the transfer is then taken to
    /// start exactly as it passed, so rounding never accumulates over a stream of requests.
    pub(crate) fn rotational_wait_ns(&self, at_ns: f64, offset_bytes: u64) -> f64 {
        let platter_angle = (at_ns / self.revolution_ns).fract();
        let sector_angle = self.track_position(offset_bytes).fract();
        let wait_revolutions = (sector_angle - platter_angle).rem_euclid(1.0);
        if wait_revolutions > 1.0 - ANGLE_TOLERANCE_REVOLUTIONS {
            return (wait_revolutions - 1.0) * self.revolution_ns;
        }
        wait_revolutions * self.revolution_ns
    }
}

/// A datasheet's seek figures, in milliseconds, without controller overhead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeekFigures {
    pub(crate) track_to_track_ms: f64,
    pub(crate) average_ms: f64,
    pub(crate) full_stroke_ms: f64,
}

/// Seek time against distance, in the usual shape (Ruemmler & Wilkes, "An introduction to disk
/// drive modeling", IEEE Computer 1994): over short seeks the arm accelerates then brakes, so time
/// grows with the square root of the distance; long seeks coast at top speed, so time grows
/// linearly. Calibrated so that one track costs the track-to-track time, a third of the stroke
/// (the mean distance between two random cylinders) the average, the whole stroke the full-stroke
/// time. The mean over uniformly random pairs of cylinders then comes out 3-4 % under the
/// datasheet average, which datasheets define as that mean: a slightly optimistic drive.
pub(crate) struct SeekCurve {
    track_to_track_ns: f64,
    sqrt_coefficient_ns: f64,
    third_stroke_ns: f64,
    long_ns_per_stroke: f64,
}

const THIRD_STROKE: f64 = 1.0 / 3.0;

impl SeekCurve {
    pub(crate) fn new(figures: &SeekFigures) -> SeekCurve {
        let SeekFigures { track_to_track_ms, average_ms, full_stroke_ms } = *figures;
        assert!(0.0 < track_to_track_ms && track_to_track_ms < average_ms && average_ms < full_stroke_ms, "{figures:?}");
        let track_to_track_ns = track_to_track_ms * 1e6;
        let third_stroke_ns = average_ms * 1e6;
        let full_stroke_ns = full_stroke_ms * 1e6;
        SeekCurve {
            track_to_track_ns,
            sqrt_coefficient_ns: (third_stroke_ns - track_to_track_ns) / THIRD_STROKE.sqrt(),
            third_stroke_ns,
            long_ns_per_stroke: (full_stroke_ns - third_stroke_ns) / (1.0 - THIRD_STROKE),
        }
    }

    /// A seek over `distance_tracks` of `track_count`; 0 for none. Distance is measured from one
    /// track, so that one track costs exactly the track-to-track time.
    pub(crate) fn seek_ns(&self, distance_tracks: f64, track_count: f64) -> f64 {
        if distance_tracks < 1.0 {
            return 0.0;
        }
        let stroke = ((distance_tracks - 1.0) / (track_count - 1.0).max(1.0)).clamp(0.0, 1.0);
        if stroke <= THIRD_STROKE {
            self.track_to_track_ns + self.sqrt_coefficient_ns * stroke.sqrt()
        } else {
            self.third_stroke_ns + self.long_ns_per_stroke * (stroke - THIRD_STROKE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIGURES: SeekFigures = SeekFigures { track_to_track_ms: 0.2, average_ms: 3.4, full_stroke_ms: 7.0 };

    #[test]
    fn the_seek_curve_meets_the_three_datasheet_points_and_grows() {
        let curve = SeekCurve::new(&FIGURES);
        let tracks = 100_001.0;
        assert_eq!(curve.seek_ns(0.0, tracks), 0.0);
        assert!((curve.seek_ns(1.0, tracks) - 0.2e6).abs() < 1.0);
        assert!((curve.seek_ns(1.0 + (tracks - 1.0) / 3.0, tracks) - 3.4e6).abs() < 1.0);
        assert!((curve.seek_ns(tracks, tracks) - 7.0e6).abs() < 1.0);
        let samples: Vec<f64> = (1..=100).map(|i| curve.seek_ns(f64::from(i) * 1000.0, tracks)).collect();
        assert!(samples.windows(2).all(|w| w[0] < w[1]), "monotonic");
    }

    #[test]
    fn track_positions_follow_the_zone_rates() {
        let platter = Platter::new(15_000.0, 204.0, 122.0, 600_000_000_000);
        // At the outer edge one revolution (4 ms) passes 204 MB/s × 4 ms of data, at the inner 122.
        let outer_track_bytes = 204e6 * 0.004;
        let inner_track_bytes = 122e6 * 0.004;
        let outer = platter.track_position(outer_track_bytes as u64);
        assert!((outer - 1.0).abs() < 1e-3, "{outer}");
        let end = 600_000_000_000;
        let inner = platter.track_count() - platter.track_position(end - inner_track_bytes as u64);
        assert!((inner - 1.0).abs() < 1e-3, "{inner}");
        let back = platter.offset_after(1 << 30, platter.transfer_ns(1 << 30, 1 << 20));
        assert!(back.abs_diff((1 << 30) + (1 << 20)) <= 1, "{back}");
    }

    #[test]
    fn a_sector_that_just_passed_is_waited_for_a_whole_revolution() {
        let platter = Platter::new(15_000.0, 204.0, 122.0, 1 << 33);
        let offset = 12_345 * 512;
        let angle = platter.track_position(offset).fract();
        let on_time_ns = angle * platter.revolution_ns() + 10.0 * platter.revolution_ns();
        assert!(platter.rotational_wait_ns(on_time_ns, offset).abs() < 1.0);
        let late = platter.rotational_wait_ns(on_time_ns + 1000.0, offset);
        assert!((late - (platter.revolution_ns() - 1000.0)).abs() < 1.0, "{late}");
    }
}
