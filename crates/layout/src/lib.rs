//! Where every byte of a virtual drive lives.
//!
//! `layout` maps a byte range of a virtual drive (VD) to extents on its member drives for every
//! level storc serves: RAID 0, 1, 1E, 5, 6, 10, 50, 60 and JBOD. It does no I/O and allocates
//! nothing on the mapping path; the engine and the tests are its only users.
//!
//! # The one model behind every level
//!
//! Every level is described as *spans of rows*. A span is a group of member drives with one kind
//! of redundancy ([`SpanKind`]); a row is one strip-high slice across a span that holds
//! `data_strips_per_row` strips of VD data plus, for parity levels, the P (and Q) strips. The VD
//! address space is cut into rows of `row_data_bytes` and dealt to spans round-robin:
//! global row `r` lives in span `r % span_count`, at row `r / span_count` of that span.
//!
//! | level  | spans | span kind | data strips per row |
//! |--------|-------|-----------|---------------------|
//! | JBOD   | 1     | stripe over 1 drive | 1 |
//! | RAID0  | 1     | stripe over n       | n |
//! | RAID1  | 1     | mirror of 2         | 1 |
//! | RAID1E | 1     | offset mirror of n  | n |
//! | RAID5  | 1     | parity over n       | n - 1 |
//! | RAID6  | 1     | double parity over n| n - 2 |
//! | RAID10 | 2-8   | mirror of 2         | 1 (so strips alternate between spans) |
//! | RAID50 | 2-8   | parity over n each  | n - 1 (a whole span row, so full-stripe writes stay whole) |
//! | RAID60 | 2-8   | double parity over n each | n - 2 |
//!
//! Parity rotates left-symmetric, the Linux md default: in span row `r` of an `n`-drive span the
//! P strip is on drive `n - 1 - r % n`, Q (RAID6) on the drive after it, and data strip `k` on the
//! `k`-th drive after the last parity drive, wrapping. RAID1E is md's "offset" layout with two
//! copies: logical row `r` occupies physical rows `2r` (strip `k` on drive `k`) and `2r + 1` (the
//! copy of strip `k` on drive `k + 1`), so it works with an odd drive count and survives any
//! failure that does not take two neighbours.
//!
//! Every member reserves `member_reserved_bytes` at its start for the controller's metadata; data
//! starts after it. Capacity uses the smallest member and is rounded down to whole rows.

use std::fmt;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const STRIP_SIZE_MIN_BYTES: u64 = 8 * KIB;
pub const STRIP_SIZE_MAX_BYTES: u64 = MIB;
pub const STRIP_SIZE_DEFAULT_BYTES: u64 = 64 * KIB;
/// Spans of RAID 10/50/60.
pub const SPAN_COUNT_MIN: usize = 2;
pub const SPAN_COUNT_MAX: usize = 8;
/// Drives in one span (one array in MegaRAID terms).
pub const DRIVES_PER_SPAN_MAX: usize = 32;
/// The unit every VD and drive offset is aligned to.
pub const SECTOR_BYTES: u64 = 512;

/// A RAID level as the CLI names it (`r0`, `r1`, `r1e`, `r5`, `r6`, `r10`, `r50`, `r60`, `jbod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid1E,
    Raid5,
    Raid6,
    Raid10,
    Raid50,
    Raid60,
    Jbod,
}

impl Level {
    pub const ALL: [Level; 9] =
        [Level::Raid0, Level::Raid1, Level::Raid1E, Level::Raid5, Level::Raid6, Level::Raid10, Level::Raid50, Level::Raid60, Level::Jbod];

    /// The short name used by the CLI and in metadata (`r5`).
    pub fn short_name(self) -> &'static str {
        match self {
            Level::Raid0 => "r0",
            Level::Raid1 => "r1",
            Level::Raid1E => "r1e",
            Level::Raid5 => "r5",
            Level::Raid6 => "r6",
            Level::Raid10 => "r10",
            Level::Raid50 => "r50",
            Level::Raid60 => "r60",
            Level::Jbod => "jbod",
        }
    }

    /// Accepts `r5`, `raid5`, `RAID5` and `5` alike.
    pub fn parse(text: &str) -> Result<Level, LayoutError> {
        let lower = text.to_ascii_lowercase();
        let bare = lower.trim_start_matches("raid").trim_start_matches('r');
        let level = match bare {
            "0" => Level::Raid0,
            "1" => Level::Raid1,
            "1e" => Level::Raid1E,
            "5" => Level::Raid5,
            "6" => Level::Raid6,
            "10" => Level::Raid10,
            "50" => Level::Raid50,
            "60" => Level::Raid60,
            "jbod" => Level::Jbod,
            _ => return Err(LayoutError::UnknownLevel(text.to_string())),
        };
        Ok(level)
    }

    /// The kind of redundancy inside one span of this level.
    pub fn span_kind(self) -> SpanKind {
        match self {
            Level::Raid0 | Level::Jbod => SpanKind::Stripe,
            Level::Raid1 | Level::Raid10 => SpanKind::Mirror,
            Level::Raid1E => SpanKind::OffsetMirror,
            Level::Raid5 | Level::Raid50 => SpanKind::Parity,
            Level::Raid6 | Level::Raid60 => SpanKind::DoubleParity,
        }
    }

    /// Whether this level is made of several spans (RAID 10, 50, 60).
    pub fn is_spanned(self) -> bool {
        matches!(self, Level::Raid10 | Level::Raid50 | Level::Raid60)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Level::Raid0 => "RAID0",
            Level::Raid1 => "RAID1",
            Level::Raid1E => "RAID1E",
            Level::Raid5 => "RAID5",
            Level::Raid6 => "RAID6",
            Level::Raid10 => "RAID10",
            Level::Raid50 => "RAID50",
            Level::Raid60 => "RAID60",
            Level::Jbod => "JBOD",
        };
        f.write_str(name)
    }
}

/// The redundancy inside one span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// No redundancy: RAID0 and JBOD.
    Stripe,
    /// Two drives holding the same strips: RAID1 and each span of RAID10.
    Mirror,
    /// RAID1E: every strip twice, the copy one row down and one drive over.
    OffsetMirror,
    /// One rotating parity strip per row: RAID5 and each span of RAID50.
    Parity,
    /// P and Q per row: RAID6 and each span of RAID60.
    DoubleParity,
}

impl SpanKind {
    /// How many members of one span may be lost in the worst case without losing data.
    pub fn failures_tolerated(self) -> usize {
        match self {
            SpanKind::Stripe => 0,
            SpanKind::Mirror | SpanKind::OffsetMirror | SpanKind::Parity => 1,
            SpanKind::DoubleParity => 2,
        }
    }

    fn parity_strips_per_row(self) -> usize {
        match self {
            SpanKind::Parity => 1,
            SpanKind::DoubleParity => 2,
            _ => 0,
        }
    }
}

/// What a VD asks of its layout: the user's choices plus the size of its smallest member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GeometryConfig {
    pub level: Level,
    pub drive_count: usize,
    /// Drives per span for RAID 10/50/60 (`pdperarray`); `None` picks RAID10: 2, RAID50/60: two spans.
    pub drives_per_span: Option<usize>,
    pub strip_size_bytes: u64,
    /// Size of the smallest member drive.
    pub member_size_bytes: u64,
    /// Bytes at the start of every member kept for controller metadata.
    pub member_reserved_bytes: u64,
}

/// A validated layout. Cheap to copy; every mapping method is a pure function of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    level: Level,
    span_kind: SpanKind,
    span_count: usize,
    drives_per_span: usize,
    strip_size_bytes: u64,
    data_offset_bytes: u64,
    /// Logical rows in each span (for RAID1E each takes two physical rows).
    rows_per_span: u64,
}

/// Bad geometry: each message names what is wrong and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("unknown RAID level {0:?}; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod")]
    UnknownLevel(String),
    #[error("{level} needs {rule}; got {got}")]
    DriveCount { level: Level, rule: &'static str, got: usize },
    #[error("{level} needs {rule} drives per span; got {got}")]
    DrivesPerSpan { level: Level, rule: &'static str, got: usize },
    #[error("{level} needs 2 to 8 spans of equal size; {drive_count} drives do not split into spans of {drives_per_span}")]
    SpanSplit { level: Level, drive_count: usize, drives_per_span: usize },
    #[error("pdperarray applies only to r10, r50 and r60, not {0}")]
    SpanNotAllowed(Level),
    #[error("strip size {got_bytes} bytes is not allowed; allowed: a power of two from 8 KiB to 1 MiB")]
    StripSize { got_bytes: u64 },
    #[error("member drives of {member_size_bytes} bytes are too small: {level} with a {strip_size_bytes}-byte strip needs at least {needed_bytes} bytes per drive (including {reserved_bytes} bytes of metadata)")]
    MemberTooSmall { level: Level, member_size_bytes: u64, strip_size_bytes: u64, reserved_bytes: u64, needed_bytes: u64 },
}

impl Geometry {
    /// Validates `config` and computes the layout.
    ///
    /// # Errors
    /// A [`LayoutError`] naming the rule that `config` breaks.
    pub fn new(config: GeometryConfig) -> Result<Geometry, LayoutError> {
        let level = config.level;
        check_strip_size(config.strip_size_bytes)?;
        let (span_count, drives_per_span) = split_into_spans(&config)?;
        let span_kind = level.span_kind();
        let usable_bytes = config.member_size_bytes.saturating_sub(config.member_reserved_bytes);
        let physical_rows = usable_bytes / config.strip_size_bytes;
        let rows_per_span = match span_kind {
            SpanKind::OffsetMirror => physical_rows / 2,
            _ => physical_rows,
        };
        if rows_per_span == 0 {
            let physical_rows_needed = if span_kind == SpanKind::OffsetMirror { 2 } else { 1 };
            return Err(LayoutError::MemberTooSmall {
                level,
                member_size_bytes: config.member_size_bytes,
                strip_size_bytes: config.strip_size_bytes,
                reserved_bytes: config.member_reserved_bytes,
                needed_bytes: config.member_reserved_bytes + physical_rows_needed * config.strip_size_bytes,
            });
        }
        let geometry = Geometry {
            level,
            span_kind,
            span_count,
            drives_per_span,
            strip_size_bytes: config.strip_size_bytes,
            data_offset_bytes: config.member_reserved_bytes,
            rows_per_span,
        };
        debug_assert!(geometry.capacity_bytes() > 0);
        Ok(geometry)
    }

    pub fn level(&self) -> Level {
        self.level
    }
    pub fn span_kind(&self) -> SpanKind {
        self.span_kind
    }
    pub fn span_count(&self) -> usize {
        self.span_count
    }
    pub fn drives_per_span(&self) -> usize {
        self.drives_per_span
    }
    pub fn drive_count(&self) -> usize {
        self.span_count * self.drives_per_span
    }
    pub fn strip_size_bytes(&self) -> u64 {
        self.strip_size_bytes
    }
    /// Where VD data starts on every member (after the metadata area).
    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes
    }
    pub fn rows_per_span(&self) -> u64 {
        self.rows_per_span
    }
    pub fn row_count(&self) -> u64 {
        self.rows_per_span * self.span_count as u64
    }
    pub fn data_strips_per_row(&self) -> usize {
        match self.span_kind {
            SpanKind::Mirror => 1,
            kind => self.drives_per_span - kind.parity_strips_per_row(),
        }
    }
    /// VD bytes held by one row.
    pub fn row_data_bytes(&self) -> u64 {
        self.data_strips_per_row() as u64 * self.strip_size_bytes
    }
    pub fn capacity_bytes(&self) -> u64 {
        self.row_count() * self.row_data_bytes()
    }
    /// Bytes of each member the layout uses, metadata area included.
    pub fn member_used_bytes(&self) -> u64 {
        let physical_rows = match self.span_kind {
            SpanKind::OffsetMirror => self.rows_per_span * 2,
            _ => self.rows_per_span,
        };
        self.data_offset_bytes + physical_rows * self.strip_size_bytes
    }
    /// Member failures the VD survives in the worst case (one per span for RAID 10/50, two for 60
    /// count per span; see [`Geometry::survives`] for an exact answer for a given set).
    pub fn failures_tolerated_per_span(&self) -> usize {
        self.span_kind.failures_tolerated()
    }

    /// Which span a member drive (index into the VD's drive list) belongs to.
    pub fn span_of_drive(&self, drive: usize) -> usize {
        assert!(drive < self.drive_count(), "drive {drive} out of range");
        drive / self.drives_per_span
    }

    /// Whether every byte of the VD is still readable with the given members lost.
    pub fn survives(&self, lost: &[bool]) -> bool {
        assert_eq!(lost.len(), self.drive_count());
        (0..self.span_count).all(|span| {
            let members = &lost[span * self.drives_per_span..(span + 1) * self.drives_per_span];
            let lost_count = members.iter().filter(|&&l| l).count();
            match self.span_kind {
                SpanKind::OffsetMirror => {
                    // Strip copies sit on neighbours k and k+1: data is lost only when two
                    // neighbours (cyclically) are both gone.
                    let n = members.len();
                    !(0..n).any(|k| members[k] && members[(k + 1) % n])
                }
                kind => lost_count <= kind.failures_tolerated(),
            }
        })
    }

    /// The rows a VD byte range touches, in VD order, each with the part of the range inside it.
    ///
    /// # Panics
    /// If the range runs past the capacity.
    pub fn rows(&self, vd_offset_bytes: u64, len_bytes: u64) -> RowIter {
        let end = vd_offset_bytes.checked_add(len_bytes).expect("range overflows u64");
        assert!(end <= self.capacity_bytes(), "range {vd_offset_bytes}+{len_bytes} past capacity");
        RowIter { row_data_bytes: self.row_data_bytes(), next_offset: vd_offset_bytes, end }
    }

    /// Where byte `vd_offset_bytes` of a JBOD lies on its one drive, with the row it is in:
    /// every byte sits right past the metadata at its own offset, so the Fast Path places a
    /// request of any size with one addition instead of walking rows and strips.
    ///
    /// # Panics
    /// If the VD is not a JBOD, or the byte lies past its capacity.
    pub fn jbod_place(&self, vd_offset_bytes: u64) -> (u64, u64) {
        assert_eq!(self.level, Level::Jbod, "jbod_place on a {} VD", self.level);
        assert!(vd_offset_bytes < self.capacity_bytes(), "byte {vd_offset_bytes} past capacity");
        (vd_offset_bytes / self.strip_size_bytes, self.data_offset_bytes + vd_offset_bytes)
    }

    /// Where the strips of global row `row` live.
    pub fn row_map(&self, row: u64) -> RowMap {
        assert!(row < self.row_count(), "row {row} out of range");
        let span = (row % self.span_count as u64) as usize;
        let row_in_span = row / self.span_count as u64;
        RowMap { geometry: *self, row, span, row_in_span }
    }

    /// Every extent a byte range touches: each data piece with all its copies, and for parity
    /// levels the P/Q extents covering the strip columns written in each row.
    pub fn extents(&self, vd_offset_bytes: u64, len_bytes: u64) -> impl Iterator<Item = Extent> + '_ {
        self.rows(vd_offset_bytes, len_bytes).flat_map(move |piece| {
            let map = self.row_map(piece.row);
            let data = map.data_pieces(piece.offset_in_row_bytes, piece.len_bytes).flat_map(move |data| {
                (0..map.copy_count()).map(move |copy| {
                    let place = map.data_copy(data.strip_index, copy);
                    Extent {
                        drive: place.drive,
                        drive_offset_bytes: place.drive_offset_bytes + data.offset_in_strip_bytes,
                        len_bytes: data.len_bytes,
                        vd_offset_bytes: piece.vd_offset_bytes + data.offset_in_piece_bytes,
                        role: Role::Data { copy },
                    }
                })
            });
            let (column_start, column_end) = map.column_range(piece.offset_in_row_bytes, piece.len_bytes);
            let parity = map.parity_places().into_iter().flatten().map(move |(role, place)| Extent {
                drive: place.drive,
                drive_offset_bytes: place.drive_offset_bytes + column_start,
                len_bytes: column_end - column_start,
                vd_offset_bytes: piece.vd_offset_bytes,
                role,
            });
            data.chain(parity)
        })
    }
}

fn check_strip_size(strip_size_bytes: u64) -> Result<(), LayoutError> {
    let in_range = (STRIP_SIZE_MIN_BYTES..=STRIP_SIZE_MAX_BYTES).contains(&strip_size_bytes);
    if in_range && strip_size_bytes.is_power_of_two() {
        Ok(())
    } else {
        Err(LayoutError::StripSize { got_bytes: strip_size_bytes })
    }
}

/// Checks the drive-count rules of a level and returns (span_count, drives_per_span).
fn split_into_spans(config: &GeometryConfig) -> Result<(usize, usize), LayoutError> {
    let level = config.level;
    let count = config.drive_count;
    let bad_count = |rule| Err(LayoutError::DriveCount { level, rule, got: count });
    if !level.is_spanned() {
        if config.drives_per_span.is_some() {
            return Err(LayoutError::SpanNotAllowed(level));
        }
        let ok = match level {
            Level::Jbod => count == 1,
            Level::Raid0 => (1..=DRIVES_PER_SPAN_MAX).contains(&count),
            Level::Raid1 => count == 2,
            Level::Raid1E | Level::Raid5 => (3..=DRIVES_PER_SPAN_MAX).contains(&count),
            Level::Raid6 => (4..=DRIVES_PER_SPAN_MAX).contains(&count),
            _ => unreachable!("spanned levels handled below"),
        };
        let rule = match level {
            Level::Jbod => "exactly 1 drive",
            Level::Raid0 => "1 to 32 drives",
            Level::Raid1 => "exactly 2 drives",
            Level::Raid1E | Level::Raid5 => "3 to 32 drives",
            _ => "4 to 32 drives",
        };
        return if ok { Ok((1, count)) } else { bad_count(rule) };
    }
    let (per_span_min, per_span_rule) = match level {
        Level::Raid10 => (2, "exactly 2"),
        Level::Raid50 => (3, "3 to 32"),
        _ => (4, "4 to 32"),
    };
    let per_span = config.drives_per_span.unwrap_or(match level {
        Level::Raid10 => 2,
        _ => count / SPAN_COUNT_MIN,
    });
    let per_span_ok = match level {
        Level::Raid10 => per_span == 2,
        _ => (per_span_min..=DRIVES_PER_SPAN_MAX).contains(&per_span),
    };
    if !per_span_ok {
        if config.drives_per_span.is_none() {
            let rule = match level {
                Level::Raid10 => "4 to 16 drives, an even count (2 to 8 spans of 2)",
                Level::Raid50 => "at least 6 drives (2 to 8 spans of 3 or more)",
                _ => "at least 8 drives (2 to 8 spans of 4 or more)",
            };
            return bad_count(rule);
        }
        return Err(LayoutError::DrivesPerSpan { level, rule: per_span_rule, got: per_span });
    }
    let span_count = count / per_span;
    if !count.is_multiple_of(per_span) || !(SPAN_COUNT_MIN..=SPAN_COUNT_MAX).contains(&span_count) {
        return Err(LayoutError::SpanSplit { level, drive_count: count, drives_per_span: per_span });
    }
    Ok((span_count, per_span))
}

mod row;

pub use row::{DataPiece, Extent, Place, Role, RowIter, RowMap, RowPiece};

#[cfg(test)]
mod tests;
