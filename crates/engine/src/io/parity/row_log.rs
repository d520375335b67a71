//! The write hole's parity log: a parity row write's member writes are logged as row images in
//! the journal's image partition, durable, before they go to the members (see `cache::images`
//! for the partition, and `journal::Journal::open_with_images` for the replay).
//!
//! A crash in the middle of a row write can leave some members with the new data and others
//! with the old, so the row's parity no longer matches its data; with a member missing, what
//! parity reconstructs for it would be wrong. The bitmap alone can only say which regions may
//! hold such rows, and reads through their parity are refused until a resync (which needs every
//! member). With the row's image in the journal, replay writes the whole row write again, and
//! the row is whole: its region needs nothing more, which is what the bitmap's unlogged bit says
//! (only a row write that could not be logged sets it).
//!
//! An image is cut by columns into records of at most a record's data: each record holds, for
//! its columns, every member write of the row, so that each one restores whole columns on its
//! own (a crash after some of them were logged and before the member writes began leaves rows
//! whose columns are each old or new, all consistent).

use super::super::intent;
use super::super::row::{AttemptError, Env};
use crate::journal::format::{ImageEntry, IMAGE_ENTRIES_MAX, RECORD_DATA_BYTES_MAX};
use crate::journal::part::JournalPart;
use crate::journal::JournalError;
use crate::metadata::BLOCK_BYTES;
use crate::runtime::Reactor;
use drive::IoBuf;
use layout::SpanKind;
use std::rc::Rc;

/// Waits for image room before a row write gives up on its image and goes unlogged.
const ROOM_WAITS_MAX: usize = 64;

/// One member write of a row write: where it goes, which columns of the row it covers (its
/// offset in its strip), and its bytes.
pub(super) struct MemberWrite<'a> {
    pub member: usize,
    pub offset_bytes: u64,
    pub column_bytes: u64,
    pub bytes: &'a [u8],
}

/// The images of a row write, held until its member writes are done.
pub(super) struct Logged {
    part: Rc<JournalPart>,
    reactor: Rc<Reactor>,
    sequences: Vec<u64>,
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.sequences.iter().for_each(|&sequence| self.part.release(sequence));
        self.reactor.cache().images_changed();
    }
}

/// Whether `env`'s row writes are logged as images now: a parity VD, not replaying, with a
/// journal whose image partition works. (A row write that finds otherwise when it logs, or
/// finds no room, marks its region unlogged then.)
pub(crate) fn logs_row_images(env: &Env) -> bool {
    let parity = matches!(env.vd.geometry().span_kind(), SpanKind::Parity | SpanKind::DoubleParity);
    parity && !env.vd.is_replaying() && env.reactor.cache().images().is_some()
}

/// Logs the member writes `writes` of row `row` as its image, or, when that cannot be (no
/// image partition, a journal that failed, a replay, an image too large for the ring), marks
/// the row's region unlogged. Either way the writes may go once this returns.
///
/// A write that goes around the journal (`cache::bypass`) and writes the row `whole` needs no
/// image: a crash can tear only its own data there, and the resync of the unlogged region puts
/// parity right (every member is in service, or it would not have gone around). Unless an
/// older image of the row is still live: replay would put it over this write.
///
/// # Errors
/// The region's unlogged bit cannot be written (the VD went offline): the writes must not go.
pub(super) async fn log_row(env: &Env, row: u64, writes: &[MemberWrite<'_>], whole: bool) -> Result<Option<Logged>, AttemptError> {
    let around = whole && env.full_rows_unlogged && !env.reactor.cache().image_live(&env.vd, row);
    if let Some(part) = env.reactor.cache().images().filter(|_| logs_row_images(env) && !around) {
        // The image's parity assumes the row's data: data written around must be durable first.
        crate::cache::around_durable(&env.reactor, &env.vd, row).await.map_err(|_| AttemptError::Lost)?;
        match log_images(env, &part, row, writes).await {
            Ok(Some(logged)) => return Ok(Some(logged)),
            // No room, or too big. An older image of this row must not be replayed over what
            // this write puts there: the ring is checkpointed past every image first.
            Ok(None) => {
                if let Err(error) = crate::cache::images_to_head(&env.reactor).await {
                    tracing::warn!("{}: image checkpoint before an unlogged write of row {row}: {error}", env.vd.name());
                }
            }
            // The journal failed: it is detached, and so never replayed, before anything is
            // acknowledged without it; the cache's records of this data outlive its images.
            Err(error) => tracing::warn!("{}: row {row} goes unlogged: {error}", env.vd.name()),
        }
    }
    env.not_imaged.set(true);
    intent::mark_unlogged(env, row).await.map_err(|_| AttemptError::Lost)?;
    Ok(None)
}

/// The records of the image, written and durable; `None` if they do not fit the ring.
async fn log_images(env: &Env, part: &Rc<JournalPart>, row: u64, writes: &[MemberWrite<'_>]) -> Result<Option<Logged>, JournalError> {
    assert!(!writes.is_empty() && writes.len() <= IMAGE_ENTRIES_MAX, "a row write is 1 to {IMAGE_ENTRIES_MAX} member writes");
    let lo = writes.iter().map(|w| w.column_bytes).min().expect("a write");
    let hi = writes.iter().map(|w| w.column_bytes + w.bytes.len() as u64).max().expect("a write");
    let total_bytes: u64 = writes.iter().map(|w| w.bytes.len() as u64).sum();
    // Columns per record: all of them when a record holds every write whole (a scattered row
    // write's many small writes would otherwise be cut into records of a few columns each, a
    // header apiece), else as many as a record's data holds for every member write.
    let window_bytes = if total_bytes.next_multiple_of(BLOCK_BYTES as u64) <= RECORD_DATA_BYTES_MAX {
        hi - lo
    } else {
        (RECORD_DATA_BYTES_MAX / writes.len() as u64 / BLOCK_BYTES as u64 * BLOCK_BYTES as u64).max(BLOCK_BYTES as u64)
    };
    let (_, capacity_bytes) = part.usage();
    if total_bytes + (hi - lo).div_ceil(window_bytes) * BLOCK_BYTES as u64 > capacity_bytes / 2 {
        return Ok(None);
    }
    let mut logged = Logged { part: Rc::clone(part), reactor: Rc::clone(&env.reactor), sequences: Vec::new() };
    let mut start = lo;
    while start < hi {
        let end = (start + window_bytes).min(hi);
        let (entries, body, data_bytes) = window(writes, start, end);
        if !entries.is_empty() {
            let Some(placed) = place(env, part, data_bytes).await? else { return Ok(None) };
            logged.sequences.push(placed.placement.sequence);
            env.reactor.cache().note_logged_image(&env.vd, row, placed.placement.sequence);
            let vd_id = u32::try_from(env.vd.id()).expect("a VD id is a u32");
            part.write_image(&env.reactor, &placed, (vd_id, row), entries, body).await?;
        }
        start = end;
    }
    env.reactor.cache().note_imaged(&env.vd);
    Ok(Some(logged))
}

/// The part of every member write in columns `[start, end)`: its entries, and their bytes one
/// after the other, copied once into the record body that goes to the journal (zero-padded to
/// whole blocks), with their length.
fn window(writes: &[MemberWrite<'_>], start: u64, end: u64) -> (Vec<ImageEntry>, IoBuf, usize) {
    // Each write's piece in the window: where it starts in the write, and how long it is.
    let pieces: Vec<(&MemberWrite, usize, usize)> = writes
        .iter()
        .filter_map(|write| {
            let (from, to) = (write.column_bytes.max(start), (write.column_bytes + write.bytes.len() as u64).min(end));
            (from < to).then(|| (write, (from - write.column_bytes) as usize, (to - from) as usize))
        })
        .collect();
    let data_bytes: usize = pieces.iter().map(|&(_, _, len)| len).sum();
    let parts: Vec<&[u8]> = pieces.iter().map(|&(write, at, len)| &write.bytes[at..at + len]).collect();
    let body = IoBuf::from_parts(&parts, data_bytes.next_multiple_of(BLOCK_BYTES));
    let mut entries = Vec::with_capacity(pieces.len());
    for (write, at, len) in pieces {
        entries.push(ImageEntry {
            member: u32::try_from(write.member).expect("a member index is a u32"),
            len_bytes: u32::try_from(len).expect("a window is at most a record"),
            member_offset_bytes: write.offset_bytes + at as u64,
        });
    }
    (entries, body, data_bytes)
}

/// Room for a record of `data_bytes` in the ring, waiting (with checkpoints asked for) while
/// other row writes hold it; `None` after [`ROOM_WAITS_MAX`] waits.
async fn place(env: &Env, part: &JournalPart, data_bytes: usize) -> Result<Option<crate::journal::part::Placed>, JournalError> {
    for _ in 0..ROOM_WAITS_MAX {
        if let Some(why) = part.health().failure() {
            return Err(JournalError::Failed(why));
        }
        if let Some(placed) = part.place_image(data_bytes) {
            return Ok(Some(placed));
        }
        crate::cache::checkpoint_images(&env.reactor, true);
        env.reactor.cache().wait_for_image_room().await;
    }
    Ok(None)
}
