//! Runs of rows: the member I/O of a background job over several consecutive rows, merged.
//!
//! A rebuild that reads and writes one strip per member per row keeps every member busy with
//! strip-sized I/Os (64 KiB by default). Disks, and files on a filesystem, move data much faster
//! in larger pieces: on a test machine a RAID5 rebuild ran 40% faster with 1 MiB member I/Os
//! than with 64 KiB ones. A run reads each member's strips of several rows with one I/O per
//! drive-contiguous range, hands each row its strips as views of those buffers, and writes what
//! the rows produced for one member back as one I/O where the views are adjacent again.
//!
//! Errors are not handled here: a failed merged read makes the caller do its rows one by one,
//! with the per-strip reads, probing and error booking of the row path, so that a bad sector
//! costs exactly what it costs there and is booked once.

use super::lost::{StripRead, StripState};
use super::row::{member_io, read_op, Env};
use crate::vd::{MemberSet, VdError};
use drive::{DriveOp, IoBuf};
use futures::future::join_all;

/// A drive-contiguous range of whole strips on one member: the indices of `places` it covers,
/// in offset order.
struct Range {
    member: usize,
    offset_bytes: u64,
    places: Vec<usize>,
}

/// Whole strips at `places` (member, drive offset), read with one I/O per drive-contiguous
/// range of a member. Members in `skip` are not read: their strips are zeros from one buffer per
/// range too, so that what a job fills in for them can be written back as one I/O.
///
/// `None` when a read failed. Nothing is booked: the caller redoes its rows one by one.
pub(super) async fn read_strips(env: &Env, places: &[(usize, u64)], skip: MemberSet) -> Option<Vec<StripRead>> {
    let strip_bytes = env.vd.geometry().strip_size_bytes();
    let ranges = contiguous_ranges(places, strip_bytes);
    let reads = ranges.iter().map(|range| async move {
        let len_bytes = range.places.len() * strip_bytes as usize;
        match skip.contains(range.member) {
            true => Some(IoBuf::zeroed(len_bytes)),
            false => match member_io(env, range.member, read_op(range.offset_bytes, len_bytes)).await {
                (Ok(()), buf) => Some(buf.expect("a read returns its buffer")),
                (Err(_), _) => None,
            },
        }
    });
    let bufs = join_all(reads).await;
    let mut strips: Vec<Option<StripRead>> = places.iter().map(|_| None).collect();
    for (range, buf) in ranges.iter().zip(bufs) {
        let mut rest = buf?;
        let state = if skip.contains(range.member) { StripState::Out } else { StripState::Read };
        for (i, &place) in range.places.iter().enumerate() {
            let tail = rest.split_off(strip_bytes as usize);
            let buf = std::mem::replace(&mut rest, tail);
            let offset_bytes = range.offset_bytes + i as u64 * strip_bytes;
            assert_eq!(places[place], (range.member, offset_bytes), "a range's strips follow each other");
            strips[place] = Some(StripRead { member: range.member, offset_bytes, buf, state: state.clone() });
        }
        assert!(rest.is_empty(), "a range's buffer holds exactly its strips");
    }
    Some(strips.into_iter().map(|strip| strip.expect("every place is in a range")).collect())
}

/// The strips of each row of a run whose rows read `places[i]` (member, drive offset) each,
/// read with [`read_strips`] and handed back per row, in place order. `None` when the run has
/// one row, a member it reads is out of service, or a read failed: the caller then takes the
/// row path, which names the member and books the error once.
pub(super) async fn read_rows(env: &Env, places: &[Vec<(usize, u64)>]) -> Option<Vec<Vec<IoBuf>>> {
    let unavailable = env.vd.unavailable();
    let all_in = places.iter().flatten().all(|&(member, _)| !unavailable.contains(member));
    if !all_in || places.len() < 2 {
        return None;
    }
    let flat: Vec<(usize, u64)> = places.iter().flatten().copied().collect();
    let mut strips = read_strips(env, &flat, MemberSet::default()).await?.into_iter().map(|strip| strip.buf);
    Some(places.iter().map(|row_places| strips.by_ref().take(row_places.len()).collect()).collect())
}

/// Groups `places` into drive-contiguous ranges of whole strips per member.
fn contiguous_ranges(places: &[(usize, u64)], strip_bytes: u64) -> Vec<Range> {
    let mut order: Vec<usize> = (0..places.len()).collect();
    order.sort_by_key(|&i| places[i]);
    for pair in order.windows(2) {
        assert!(places[pair[0]] != places[pair[1]], "a strip read twice in one run: {:?}", places[pair[0]]);
    }
    let mut ranges: Vec<Range> = Vec::new();
    for i in order {
        let (member, offset_bytes) = places[i];
        match ranges.last_mut() {
            Some(last) if last.member == member && last.offset_bytes + last.places.len() as u64 * strip_bytes == offset_bytes => {
                last.places.push(i)
            }
            _ => ranges.push(Range { member, offset_bytes, places: vec![i] }),
        }
    }
    ranges
}

/// A strip a run writes: (row index in the run, member, drive offset, contents).
pub(super) type RunWrite = (usize, usize, u64, IoBuf);

/// Writes what the rows of a run produced, one I/O per member range whose buffers are adjacent
/// views of one allocation. A member that fails a write is booked (taken out of service: its
/// strips are stale now); each row with a strip in a failed write gets the error, naming the row.
pub(super) async fn write_strips(env: &Env, rows: &[u64], mut writes: Vec<RunWrite>, action: &'static str) -> Vec<Result<(), VdError>> {
    writes.sort_by_key(|&(_, member, offset_bytes, _)| (member, offset_bytes));
    for pair in writes.windows(2) {
        assert!((pair[0].1, pair[0].2) != (pair[1].1, pair[1].2), "a run writes each strip once: member {} at {}", pair[0].1, pair[0].2);
    }
    // (member, offset, buffer, the rows it carries)
    let mut merged: Vec<(usize, u64, IoBuf, Vec<usize>)> = Vec::new();
    for (row_index, member, offset_bytes, buf) in writes {
        match merged.last_mut() {
            Some((last_member, last_offset, last_buf, last_rows))
                if *last_member == member && *last_offset + last_buf.len() as u64 == offset_bytes && last_buf.is_followed_by(&buf) =>
            {
                last_buf.unsplit(buf);
                last_rows.push(row_index);
            }
            _ => merged.push((member, offset_bytes, buf, vec![row_index])),
        }
    }
    let carried: Vec<Vec<usize>> = merged.iter().map(|(_, _, _, rows)| rows.clone()).collect();
    let ops = merged.into_iter().map(|(member, offset_bytes, buf, _)| member_io(env, member, DriveOp::Write { offset_bytes, buf }));
    let outcomes = join_all(ops).await;
    let mut results: Vec<Result<(), VdError>> = rows.iter().map(|_| Ok(())).collect();
    for (row_indices, (result, _)) in carried.iter().zip(outcomes) {
        let Err(fault) = result else { continue };
        env.vd.member_error(&fault);
        for &i in row_indices {
            if results[i].is_ok() {
                let (member, error) = (fault.index, fault.error.clone());
                results[i] = Err(VdError::RowMemberIo { vd: env.vd.name(), row: rows[i], member, action, error });
            }
        }
    }
    results
}
