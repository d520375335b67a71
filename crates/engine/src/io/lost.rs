//! Data that nothing holds any more, as the row jobs meet it: strips read whole where they can
//! be and probed chunk by chunk where they cannot, so that exactly the unreadable chunks count
//! as lost; lost VD ranges recorded as bad blocks, durably, before a row job writes anything
//! over them; and the read guard that makes reads of bad blocks fail (see `vd::bad_blocks`).

use super::row::{member_io, read_op, Env};
use crate::config::BadBlock;
use crate::vd::{MemberSet, VdCompletion, VdError};
use drive::{DriveError, IoBuf};
use futures::future::join_all;
use layout::Geometry;

/// The unit an unreadable strip is probed in, and so the smallest bad block a row job records:
/// the physical sector of most drives. Every strip size is a multiple of it.
pub(super) const PROBE_BYTES: u64 = 4096;

/// Reads of a range retried because the bad-block list changed while they ran.
const GUARDED_READ_ATTEMPTS: usize = 3;

/// One strip of a row as a row job read it.
pub(super) struct StripRead {
    pub member: usize,
    pub offset_bytes: u64,
    /// The whole strip: what was read, zeros where nothing could be.
    pub buf: IoBuf,
    pub state: StripState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum StripState {
    Read,
    /// Not read: a target of the job, or its member is out of service.
    Out,
    /// The whole-strip read failed and the member is still in service: per [`PROBE_BYTES`]
    /// chunk, whether it cannot be read (every chunk until [`probe`] finds out).
    Unreadable {
        error: DriveError,
        chunks: Vec<bool>,
    },
}

impl StripRead {
    /// Whether this job has nothing of the strip's chunk `chunk`.
    pub fn lost_at(&self, chunk: usize) -> bool {
        match &self.state {
            StripState::Read => false,
            StripState::Out => true,
            StripState::Unreadable { chunks, .. } => chunks[chunk],
        }
    }

    pub fn is_unreadable(&self) -> bool {
        matches!(self.state, StripState::Unreadable { .. })
    }
}

pub(super) fn chunk_count(geometry: &Geometry) -> usize {
    let strip_bytes = geometry.strip_size_bytes();
    assert!(strip_bytes.is_multiple_of(PROBE_BYTES), "strip of {strip_bytes} bytes is not a multiple of the probe unit");
    (strip_bytes / PROBE_BYTES) as usize
}

/// Reads whole strips at `places` (member, drive offset), except members in `skip`. A failed
/// read is booked, which may take its member out of service.
pub(super) async fn read_strips(env: &Env, places: &[(usize, u64)], skip: MemberSet) -> Vec<StripRead> {
    let strip_bytes = env.vd.geometry().strip_size_bytes() as usize;
    let reads = places.iter().map(|&(member, offset_bytes)| async move {
        match skip.contains(member) {
            true => None,
            false => Some(member_io(env, member, read_op(offset_bytes, strip_bytes)).await),
        }
    });
    let mut strips = Vec::with_capacity(places.len());
    for (&(member, offset_bytes), outcome) in places.iter().zip(join_all(reads).await) {
        let (buf, state) = match outcome {
            None => (IoBuf::zeroed(strip_bytes), StripState::Out),
            Some((Ok(()), buf)) => (buf.expect("a read returns its buffer"), StripState::Read),
            Some((Err(fault), _)) => {
                env.vd.member_error(&fault);
                (IoBuf::zeroed(strip_bytes), unreadable_or_out(env, member, fault.error))
            }
        };
        strips.push(StripRead { member, offset_bytes, buf, state });
    }
    strips
}

fn unreadable_or_out(env: &Env, member: usize, error: DriveError) -> StripState {
    match env.vd.unavailable().contains(member) {
        true => StripState::Out,
        false => StripState::Unreadable { error, chunks: vec![true; chunk_count(env.vd.geometry())] },
    }
}

/// Reads every unreadable strip again chunk by chunk, keeping what can be read. A chunk that
/// fails stays lost; such errors are not booked again (the strip's was). A member that vanishes
/// meanwhile is booked and its strip is out.
pub(super) async fn probe(env: &Env, strips: &mut [StripRead]) {
    for strip in strips.iter_mut().filter(|strip| strip.is_unreadable()) {
        let reads = (0..chunk_count(env.vd.geometry()) as u64)
            .map(|chunk| member_io(env, strip.member, read_op(strip.offset_bytes + chunk * PROBE_BYTES, PROBE_BYTES as usize)));
        let results = join_all(reads).await;
        let StripState::Unreadable { chunks, .. } = &mut strip.state else { unreachable!("filtered") };
        let mut vanished = None;
        for (chunk, (result, buf)) in results.into_iter().enumerate() {
            match result {
                Ok(()) => {
                    let at = chunk * PROBE_BYTES as usize;
                    let buf = buf.expect("a read returns its buffer");
                    strip.buf.as_mut_slice()[at..at + buf.len()].copy_from_slice(buf.as_slice());
                    chunks[chunk] = false;
                }
                Err(fault) if fault.error == DriveError::Gone => vanished = Some(fault),
                Err(_) => {}
            }
        }
        if let Some(fault) = vanished {
            env.vd.member_error(&fault);
            strip.buf = IoBuf::zeroed(strip.buf.len());
            strip.state = StripState::Out;
        } else if !chunks.contains(&true) {
            strip.state = StripState::Read;
        }
    }
}

/// The VD bytes of chunks `[first, end)` of data strip `strip_index` in row `row`. A row's data
/// is one VD-contiguous run, strip after strip, at every level (`RowMap::data_pieces`): how
/// RAID 1E/10/50/60 deal rows to spans and place copies is the row map's business, not this.
pub(super) fn lost_range(geometry: &Geometry, row: u64, strip_index: usize, chunks: std::ops::Range<usize>) -> BadBlock {
    assert!(strip_index < geometry.data_strips_per_row() && chunks.start < chunks.end, "a lost range inside a row's data");
    let strip_bytes = geometry.strip_size_bytes();
    let offset_bytes = row * geometry.row_data_bytes() + strip_index as u64 * strip_bytes + chunks.start as u64 * PROBE_BYTES;
    let len_bytes = (chunks.end - chunks.start) as u64 * PROBE_BYTES;
    assert!(offset_bytes + len_bytes <= (row + 1) * geometry.row_data_bytes(), "a lost range ends inside its row");
    BadBlock { offset_bytes, len_bytes }
}

/// Sorts ranges and merges those that touch, for the list and for the event that names them.
pub(super) fn merged(mut ranges: Vec<BadBlock>) -> Vec<BadBlock> {
    ranges.sort_by_key(|range| range.offset_bytes);
    let mut out: Vec<BadBlock> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            Some(last) if last.offset_bytes + last.len_bytes >= range.offset_bytes => {
                let end = (last.offset_bytes + last.len_bytes).max(range.offset_bytes + range.len_bytes);
                last.len_bytes = end - last.offset_bytes;
            }
            _ => out.push(range),
        }
    }
    out
}

/// Names the strips a row job could not read, for the event that records the loss.
pub(super) fn cause(row: u64, targets: MemberSet, strips: &[StripRead]) -> String {
    let targets: Vec<String> = targets.iter().map(|m| m.to_string()).collect();
    let unreadable: Vec<String> = strips
        .iter()
        .filter_map(|strip| match &strip.state {
            StripState::Unreadable { error, .. } => Some(format!("member {} ({error})", strip.member)),
            _ => None,
        })
        .collect();
    let unreadable = if unreadable.is_empty() { "members out of service".to_string() } else { unreadable.join(", ") };
    format!("rebuilding member {} at row {row}: {unreadable} could not be read and nothing else holds the data", targets.join(", "))
}

/// Records `ranges` as bad blocks and waits until the controller has them in the metadata:
/// only then may the row job write over the lost data (see `vd::bad_blocks`).
///
/// # Errors
/// [`VdError::RowUnrecoverable`] when the list is full or the controller could not write it:
/// nothing may be written over the lost data then.
pub(super) async fn record_lost(env: &Env, row: u64, target: usize, ranges: &[BadBlock], cause: &str) -> Result<(), VdError> {
    let bad_blocks = env.vd.bad_blocks();
    let refuse = |detail: String| VdError::RowUnrecoverable { vd: env.vd.name(), row, member: target, detail };
    let version = bad_blocks.record_lost(ranges, cause).map_err(refuse)?;
    let durable = std::future::poll_fn(|cx| bad_blocks.poll_durable(version, || env.reactor.remote_waker(cx))).await;
    durable.map_err(|reason| refuse(format!("the bad-block list could not be written to the metadata: {reason}")))
}

/// Serves a read unless it touches a bad block. A read that saw the list change while it ran
/// is redone: a row job may have recorded a loss and written zeros under it after it looked.
pub(super) async fn read_guarded(env: &Env, offset_bytes: u64, mut buf: IoBuf) -> VdCompletion {
    let bad_blocks = env.vd.bad_blocks();
    let len_bytes = buf.len() as u64;
    for attempt in 1.. {
        let version = bad_blocks.version();
        if let Some(bad) = bad_blocks.overlap(offset_bytes, len_bytes) {
            return bad_block_error(env, bad, buf);
        }
        let completion = super::serve_rows(env, offset_bytes, buf, false).await;
        if bad_blocks.version() == version {
            return completion;
        }
        buf = completion.buf.expect("a read returns its buffer");
        if attempt == GUARDED_READ_ATTEMPTS {
            // Still changing (clients rewriting bad blocks): what the list says now decides.
            return match bad_blocks.overlap(offset_bytes, len_bytes) {
                Some(bad) => bad_block_error(env, bad, buf),
                None => VdCompletion { result: completion.result, buf: Some(buf) },
            };
        }
    }
    unreachable!("the loop returns")
}

fn bad_block_error(env: &Env, bad: BadBlock, buf: IoBuf) -> VdCompletion {
    let error = VdError::BadBlock { vd: env.vd.name(), offset_bytes: bad.offset_bytes, len_bytes: bad.len_bytes };
    VdCompletion { result: Err(error), buf: Some(buf) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::{GeometryConfig, Level, Role, KIB};

    /// `lost_range` names the VD bytes whose data extent lies at the strip's place on its
    /// member, for every level's row mapping.
    #[test]
    fn lost_ranges_map_back_to_the_strip_they_name_at_every_level() {
        let shapes = [
            (Level::Raid1, 2, None),
            (Level::Raid1E, 5, None),
            (Level::Raid5, 4, None),
            (Level::Raid6, 6, None),
            (Level::Raid10, 6, Some(2)),
            (Level::Raid50, 6, Some(3)),
            (Level::Raid60, 8, Some(4)),
        ];
        for (level, drive_count, drives_per_span) in shapes {
            let strip_size_bytes = 16 * KIB;
            let config = GeometryConfig {
                level,
                drive_count,
                drives_per_span,
                strip_size_bytes,
                member_size_bytes: 1 << 24,
                member_reserved_bytes: 1 << 20,
            };
            let geometry = Geometry::new(config).unwrap();
            for row in [0, 1, 5, geometry.row_count() - 1] {
                let map = geometry.row_map(row);
                for strip_index in 0..map.data_strip_count() {
                    let range = lost_range(&geometry, row, strip_index, 1..3);
                    let data: Vec<_> = geometry
                        .extents(range.offset_bytes, range.len_bytes)
                        .filter(|e| matches!(e.role, Role::Data { .. }))
                        .map(|e| (e.drive, e.drive_offset_bytes, e.len_bytes))
                        .collect();
                    let expected: Vec<_> = (0..map.copy_count())
                        .map(|copy| map.data_copy(strip_index, copy))
                        .map(|p| (p.drive, p.drive_offset_bytes + PROBE_BYTES, 2 * PROBE_BYTES))
                        .collect();
                    assert_eq!(data, expected, "{level} row {row} strip {strip_index}");
                }
            }
        }
    }

    #[test]
    fn touching_ranges_merge() {
        let block = |offset_bytes, len_bytes| BadBlock { offset_bytes, len_bytes };
        assert_eq!(
            merged(vec![block(8192, 4096), block(0, 4096), block(4096, 4096), block(20000, 10)]),
            vec![block(0, 12288), block(20000, 10)]
        );
    }
}
