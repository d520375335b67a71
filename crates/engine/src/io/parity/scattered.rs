//! Scattered row writes: several separate ranges of one parity row written as one
//! read-modify-write, for the destager (`cache::destage`), which finds small dirty extents
//! scattered over a row once random writes have filled the cache.
//!
//! Written one by one, each 4 KiB extent of a RAID5 row costs a row write of its own: two
//! member reads, two member writes, and a row image (a 4 KiB header, its data and its parity)
//! in the journal. Written together, the row's parity is read, updated and written once per
//! column range the extents touch, and one image carries them all: with three extents in a
//! row, about a third fewer bytes reach the disks per extent (md's stripe cache gains the same
//! way when several small writes land in one stripe before it is handled).
//!
//! The row model of the other paths (`Row`: one contiguous piece per strip under one column
//! hull) cannot hold such a write: its parity would cover the hull from the first extent's
//! column to the last one's, most of a strip. Here parity is read and written only where the
//! extents are, column range by column range.
//!
//! Only the plain case is taken: every member of the row's span in service and readable, no
//! migration, no replay. Anything else, or a member error on the way, hands the extents back
//! for the ordinary path, which knows degraded writes and retries: a retry after a partly
//! applied scattered write is as safe as one after a partly applied ordinary write, since every
//! member written holds its part of the new row and the others hold what old and new share.

use super::super::row::{read_op, run_all, span_members, Attempt, Env};
use super::fold_change;
use super::row_log::{self, MemberWrite};
use crate::journal::format::IMAGE_ENTRIES_MAX;
use drive::{DriveOp, IoBuf};
use layout::{RowMap, SpanKind};

/// One piece of new data in one strip of the row.
struct Piece {
    strip_index: usize,
    offset_in_strip_bytes: u64,
    data: IoBuf,
}

impl Piece {
    fn end_bytes(&self) -> u64 {
        self.offset_in_strip_bytes + self.data.len() as u64
    }
}

/// Whether a scattered write of `piece_count` pieces fits one row image: each piece is a data
/// write, and each may add a column range to P (and Q).
pub(crate) fn fits_one_image(span_kind: SpanKind, piece_count: usize) -> bool {
    let parity_count = if span_kind == SpanKind::DoubleParity { 2 } else { 1 };
    piece_count * (1 + parity_count) <= IMAGE_ENTRIES_MAX
}

/// Whether the row can take a scattered write now: every member of its span in service and
/// readable there, and nothing else going on that the ordinary path handles. The caller holds
/// the row lock and the write intent, and reads at once if so (`io::serve_scattered`).
pub(crate) fn plain_row(env: &Env, map: &RowMap) -> bool {
    let unreadable = env.vd.unavailable_for_read(map.row).union(env.vd.unwritable());
    !env.vd.is_migrating() && !env.vd.is_replaying() && span_members(map).iter().all(|&(member, _)| !unreadable.contains(member))
}

/// Writes `writes` (offset in row `map.row`, bytes; disjoint, each inside the row) as one
/// read-modify-write with one row image. The caller holds the row lock and the write intent and
/// checked [`plain_row`] and [`fits_one_image`].
///
/// # Errors
/// A member error (to book and hand the writes to the ordinary path), or a row that lost its
/// image and could not be marked unlogged.
pub(crate) async fn write_scattered(env: &Env, map: &RowMap, writes: &[(u64, &[u8])]) -> Attempt<()> {
    let pieces = pieces_of(map, writes);
    let ranges = column_ranges(&pieces);
    let parity_places: Vec<(usize, u64)> =
        [map.p_place(), map.q_place()].into_iter().flatten().map(|place| (place.drive, place.drive_offset_bytes)).collect();
    // Old data of every piece, then each parity's old columns, range by range.
    let mut reads: Vec<(usize, DriveOp)> = pieces
        .iter()
        .map(|piece| {
            let place = map.data_copy(piece.strip_index, 0);
            (place.drive, read_op(place.drive_offset_bytes + piece.offset_in_strip_bytes, piece.data.len()))
        })
        .collect();
    for &(drive, strip_offset) in &parity_places {
        reads.extend(ranges.iter().map(|&(lo, hi)| (drive, read_op(strip_offset + lo, (hi - lo) as usize))));
    }
    let (bufs, error) = run_all(env, reads).await;
    if let Some(error) = error {
        return Err(error);
    }
    let mut bufs = bufs.into_iter().map(|buf| buf.expect("a read returns its buffer"));
    let old_data: Vec<IoBuf> = bufs.by_ref().take(pieces.len()).collect();
    let mut p: Vec<IoBuf> = bufs.by_ref().take(ranges.len()).collect();
    let mut q: Option<Vec<IoBuf>> = map.q_place().map(|_| bufs.by_ref().take(ranges.len()).collect());
    assert!(bufs.next().is_none(), "every read is used");
    for (piece, old) in pieces.iter().zip(old_data) {
        let range = ranges.partition_point(|&(_, hi)| hi <= piece.offset_in_strip_bytes);
        let (lo, hi) = ranges[range];
        assert!(lo <= piece.offset_in_strip_bytes && piece.end_bytes() <= hi, "a piece lies inside its column range");
        let at = (piece.offset_in_strip_bytes - lo) as usize;
        let q_range = q.as_mut().map(|q| &mut q[range]);
        fold_change(piece.strip_index, old, piece.data.as_slice(), &mut p[range], q_range, at);
    }
    let mut ops: Vec<(usize, u64, u64, IoBuf)> = pieces
        .into_iter()
        .map(|piece| {
            let place = map.data_copy(piece.strip_index, 0);
            (place.drive, place.drive_offset_bytes + piece.offset_in_strip_bytes, piece.offset_in_strip_bytes, piece.data)
        })
        .collect();
    for (&(drive, strip_offset), columns) in parity_places.iter().zip([Some(p), q].into_iter().flatten()) {
        ops.extend(ranges.iter().zip(columns).map(|(&(lo, _), buf)| (drive, strip_offset + lo, lo, buf)));
    }
    let member_writes: Vec<MemberWrite> = ops
        .iter()
        .map(|(member, offset_bytes, column_bytes, buf)| MemberWrite {
            member: *member,
            offset_bytes: *offset_bytes,
            column_bytes: *column_bytes,
            bytes: buf.as_slice(),
        })
        .collect();
    // Held until the member writes are done: then the image may go.
    let logged = row_log::log_row(env, map.row, &member_writes, false).await?;
    drop(member_writes);
    let ops = ops.into_iter().map(|(member, offset_bytes, _, buf)| (member, DriveOp::Write { offset_bytes, buf })).collect();
    let (_, error) = run_all(env, ops).await;
    drop(logged);
    error.map_or(Ok(()), Err)
}

/// The writes cut into strip pieces, in strip and column order.
fn pieces_of(map: &RowMap, writes: &[(u64, &[u8])]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for &(offset_in_row_bytes, bytes) in writes {
        for piece in map.data_pieces(offset_in_row_bytes, bytes.len() as u64) {
            let at = piece.offset_in_piece_bytes as usize;
            pieces.push(Piece {
                strip_index: piece.strip_index,
                offset_in_strip_bytes: piece.offset_in_strip_bytes,
                data: IoBuf::from_slice(&bytes[at..at + piece.len_bytes as usize]),
            });
        }
    }
    pieces.sort_by_key(|piece| (piece.strip_index, piece.offset_in_strip_bytes));
    for pair in pieces.windows(2) {
        let disjoint = pair[0].strip_index != pair[1].strip_index || pair[0].end_bytes() <= pair[1].offset_in_strip_bytes;
        assert!(disjoint, "scattered writes do not overlap: strip {} at {}", pair[1].strip_index, pair[1].offset_in_strip_bytes);
    }
    pieces
}

/// The column ranges the pieces touch, merged where they meet or overlap, in order: where P
/// (and Q) change.
fn column_ranges(pieces: &[Piece]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = pieces.iter().map(|piece| (piece.offset_in_strip_bytes, piece.end_bytes())).collect();
    spans.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (lo, hi) in spans {
        match ranges.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => ranges.push((lo, hi)),
        }
    }
    ranges
}
