//! One row of a VD: the pieces of a byte range that fall in each row ([`RowIter`]), and where a
//! row's strips lie on its members ([`RowMap`]: data, P and Q strips, mirror copies, RAID1E's
//! offset copies).

use crate::*;

/// The part of a VD byte range that falls inside one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPiece {
    pub row: u64,
    pub vd_offset_bytes: u64,
    pub offset_in_row_bytes: u64,
    pub len_bytes: u64,
}

pub struct RowIter {
    pub(crate) row_data_bytes: u64,
    pub(crate) next_offset: u64,
    pub(crate) end: u64,
}

impl Iterator for RowIter {
    type Item = RowPiece;
    fn next(&mut self) -> Option<RowPiece> {
        if self.next_offset >= self.end {
            return None;
        }
        let row = self.next_offset / self.row_data_bytes;
        let offset_in_row_bytes = self.next_offset % self.row_data_bytes;
        let len_bytes = (self.row_data_bytes - offset_in_row_bytes).min(self.end - self.next_offset);
        let piece = RowPiece { row, vd_offset_bytes: self.next_offset, offset_in_row_bytes, len_bytes };
        self.next_offset += len_bytes;
        Some(piece)
    }
}

/// A strip on a member drive: which drive (index into the VD's drive list) and where on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub drive: usize,
    pub drive_offset_bytes: u64,
}

/// What an extent holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// VD data; `copy` 0 is the primary, 1 the mirror copy.
    Data {
        copy: usize,
    },
    P,
    Q,
}

/// One contiguous piece of one member drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub drive: usize,
    pub drive_offset_bytes: u64,
    pub len_bytes: u64,
    /// For data, the VD offset the piece holds; for parity, the start of the row piece it covers.
    pub vd_offset_bytes: u64,
    pub role: Role,
}

/// The part of a row piece that falls inside one data strip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPiece {
    pub strip_index: usize,
    pub offset_in_strip_bytes: u64,
    pub len_bytes: u64,
    /// Where this piece starts relative to the start of the row piece.
    pub offset_in_piece_bytes: u64,
}

/// The placement of one row's strips.
#[derive(Clone, Copy, Debug)]
pub struct RowMap {
    pub(crate) geometry: Geometry,
    pub row: u64,
    pub span: usize,
    pub row_in_span: u64,
}

impl RowMap {
    pub fn strip_size_bytes(&self) -> u64 {
        self.geometry.strip_size_bytes
    }

    fn span_first_drive(&self) -> usize {
        self.span * self.geometry.drives_per_span
    }

    pub fn data_strip_count(&self) -> usize {
        self.geometry.data_strips_per_row()
    }

    /// Copies of each data strip: 2 for mirrors, 1 otherwise.
    pub fn copy_count(&self) -> usize {
        match self.geometry.span_kind {
            SpanKind::Mirror | SpanKind::OffsetMirror => 2,
            _ => 1,
        }
    }

    /// Drive offset of this row's strips (physical row start) on any member of the span.
    fn physical_row_offset(&self, physical_row: u64) -> u64 {
        self.geometry.data_offset_bytes + physical_row * self.geometry.strip_size_bytes
    }

    /// Index within the span of the P drive for parity levels.
    fn p_index_in_span(&self) -> usize {
        let n = self.geometry.drives_per_span as u64;
        (n - 1 - self.row_in_span % n) as usize
    }

    /// Where copy `copy` of data strip `strip_index` lives.
    pub fn data_copy(&self, strip_index: usize, copy: usize) -> Place {
        assert!(strip_index < self.data_strip_count() && copy < self.copy_count());
        let n = self.geometry.drives_per_span;
        let first = self.span_first_drive();
        let (index_in_span, physical_row) = match self.geometry.span_kind {
            SpanKind::Stripe => (strip_index, self.row_in_span),
            SpanKind::Mirror => (copy, self.row_in_span),
            SpanKind::OffsetMirror => ((strip_index + copy) % n, self.row_in_span * 2 + copy as u64),
            SpanKind::Parity => ((self.p_index_in_span() + 1 + strip_index) % n, self.row_in_span),
            SpanKind::DoubleParity => ((self.p_index_in_span() + 2 + strip_index) % n, self.row_in_span),
        };
        Place { drive: first + index_in_span, drive_offset_bytes: self.physical_row_offset(physical_row) }
    }

    /// The P strip, for RAID 5/6/50/60.
    pub fn p_place(&self) -> Option<Place> {
        match self.geometry.span_kind {
            SpanKind::Parity | SpanKind::DoubleParity => Some(Place {
                drive: self.span_first_drive() + self.p_index_in_span(),
                drive_offset_bytes: self.physical_row_offset(self.row_in_span),
            }),
            _ => None,
        }
    }

    /// The Q strip, for RAID 6/60.
    pub fn q_place(&self) -> Option<Place> {
        match self.geometry.span_kind {
            SpanKind::DoubleParity => {
                let n = self.geometry.drives_per_span;
                Some(Place {
                    drive: self.span_first_drive() + (self.p_index_in_span() + 1) % n,
                    drive_offset_bytes: self.physical_row_offset(self.row_in_span),
                })
            }
            _ => None,
        }
    }

    /// P and Q places with their roles (None where the level has none).
    pub fn parity_places(&self) -> [Option<(Role, Place)>; 2] {
        [self.p_place().map(|p| (Role::P, p)), self.q_place().map(|q| (Role::Q, q))]
    }

    /// Splits a range inside this row into the data strips it covers.
    pub fn data_pieces(&self, offset_in_row_bytes: u64, len_bytes: u64) -> impl Iterator<Item = DataPiece> {
        let strip = self.geometry.strip_size_bytes;
        assert!(offset_in_row_bytes + len_bytes <= self.geometry.row_data_bytes());
        let end = offset_in_row_bytes + len_bytes;
        let first_strip = offset_in_row_bytes / strip;
        let last_strip = if len_bytes == 0 { first_strip } else { (end - 1) / strip + 1 };
        (first_strip..last_strip).map(move |strip_index| {
            let strip_start = strip_index * strip;
            let start = offset_in_row_bytes.max(strip_start);
            let stop = end.min(strip_start + strip);
            DataPiece {
                strip_index: strip_index as usize,
                offset_in_strip_bytes: start - strip_start,
                len_bytes: stop - start,
                offset_in_piece_bytes: start - offset_in_row_bytes,
            }
        })
    }

    /// The strip-column range `[start, end)` (offsets inside a strip) that a row range touches in
    /// any strip: the part of P/Q that a write to the range changes.
    pub fn column_range(&self, offset_in_row_bytes: u64, len_bytes: u64) -> (u64, u64) {
        let strip = self.geometry.strip_size_bytes;
        if len_bytes >= strip {
            return (0, strip);
        }
        let start = offset_in_row_bytes % strip;
        let end = start + len_bytes;
        if end <= strip {
            (start, end)
        } else {
            // Crosses one strip boundary: touches [start, strip) of one strip and [0, end - strip)
            // of the next; the hull of the two is the whole column.
            (0, strip)
        }
    }

    /// Every member of this row's span, in span order, with the role it plays in this row.
    pub fn members(&self) -> impl Iterator<Item = (Place, Role, Option<usize>)> + '_ {
        let data = (0..self.data_strip_count())
            .flat_map(move |k| (0..self.copy_count()).map(move |copy| (self.data_copy(k, copy), Role::Data { copy }, Some(k))));
        let parity = self.parity_places().into_iter().flatten().map(|(role, place)| (place, role, None));
        data.chain(parity)
    }
}
