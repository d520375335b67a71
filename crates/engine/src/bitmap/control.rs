//! The control plane's side of the bitmap: reading it at assembly, preparing it for a run, and
//! marking a clean stop. All of it blocks on the drives; none of it runs on a shard.

use super::ondisk::{self, Header, SLOT_COUNT};
use super::{Bits, RegionMap, WriteIntent};
use drive::Drive;
use std::sync::Arc;

/// Which VD a bitmap belongs to: a bitmap left by another VD (or controller) is not ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub controller_id: u128,
    pub vd_id: u32,
}

/// What [`open`] found and prepared.
pub struct Opened {
    pub intent: WriteIntent,
    /// The VD was not stopped cleanly: the regions in `intent.unsynced_regions()` need a resync.
    pub unclean: bool,
    /// Regions found dirty (a resync's work after an unclean stop; a re-add's otherwise).
    pub dirty_region_count: u64,
    /// Something the administrator should know (no bitmap found, members that could not be
    /// read or written).
    pub notes: Vec<String>,
}

/// How a VD's bitmap comes to be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// An existing VD assembled from its members: their bitmaps say what needs a resync.
    Assembled,
    /// A new VD whose members read as zero: every row is consistent already.
    CreatedZeroed,
    /// A new VD over members that held data: every region needs its background initialization,
    /// which is the resync of all of them. Slot 0 holds them all until it is done, so a crash
    /// part way resumes it.
    CreatedOverData,
}

/// Reads the bitmaps of `members` (those in service), decides what needs a resync, and writes
/// the area for this run: slot 0 holds every region found dirty (and, in its unlogged half,
/// those that need a resync), the shard slots are empty, and the header says "not clean" with
/// a new epoch. A new VD has nothing to read.
///
/// After an unclean stop the regions unlogged in any slot need a resync: those a shard wrote
/// (a write in flight may have torn a row) and those slot 0 held as awaiting one. A region that
/// slot 0 holds only as dirty was written while a member was out, in an earlier run, and agrees
/// within itself: it matters to that member's re-add, not to a resync.
pub fn open(identity: Identity, regions: RegionMap, members: &[Arc<dyn Drive>], opening: Opening) -> Opened {
    let fresh = opening != Opening::Assembled;
    let mut notes = Vec::new();
    let mut dirty = Bits::new(regions.region_count);
    let mut unlogged = Bits::new(regions.region_count);
    // What the shards had dirty: those of it not unlogged were logged writes.
    let mut shards_dirty = Bits::new(regions.region_count);
    let (mut epoch, mut clean, mut found) = (0u64, true, 0usize);
    if opening == Opening::CreatedOverData {
        (0..regions.region_count).for_each(|region| dirty.set(region));
        unlogged = dirty.clone();
        clean = false;
    }
    for drive in members.iter().filter(|_| !fresh) {
        match ondisk::read_area(&**drive, regions.region_count) {
            Ok(area) => match area.header {
                Ok(header) if matches(&header, identity, regions) => {
                    found += 1;
                    epoch = epoch.max(header.epoch);
                    clean &= header.clean;
                    for slot in &area.slots {
                        dirty.union_with(&slot.dirty);
                        unlogged.union_with(&slot.unlogged);
                    }
                    area.slots.iter().skip(1).for_each(|slot| shards_dirty.union_with(&slot.dirty));
                }
                Ok(_) => notes.push(format!("{}: its bitmap belongs to another VD or layout", drive.info().name)),
                Err(why) => notes.push(format!("{}: {why}", drive.info().name)),
            },
            Err(error) => notes.push(format!("{}: the bitmap cannot be read: {error}", drive.info().name)),
        }
    }
    if !fresh && found == 0 {
        // Nothing says the last stop was clean (a VD from before the bitmap, or every area
        // lost): every region may disagree.
        (0..regions.region_count).for_each(|region| dirty.set(region));
        unlogged = dirty.clone();
        clean = false;
        notes.push("no write-intent bitmap found on any member: every region is resynced".into());
    }
    let unsynced = if clean { Bits::new(regions.region_count) } else { unlogged };
    // Dirty in a shard's slot but not unlogged: logged writes, whole once the journal's images
    // are replayed. Kept in slot 1's dirty half until then (a crash before the journal is
    // opened must still know them).
    let mut logged = if clean { Bits::new(regions.region_count) } else { shards_dirty };
    unsynced.ones().for_each(|region| logged.clear(region));
    let header = Header {
        controller_id: identity.controller_id,
        vd_id: identity.vd_id,
        rows_per_region: regions.rows_per_region,
        region_count: regions.region_count,
        epoch: epoch + 1,
        clean: false,
        version: ondisk::VERSION,
    };
    for drive in members {
        if let Err(error) = prepare(&**drive, &header, &dirty, &unsynced, &logged) {
            notes.push(format!("{}: the bitmap cannot be written: {error}", drive.info().name));
        }
    }
    let dirty_region_count = dirty.count();
    let intent = WriteIntent::new(regions, header.epoch, dirty, &unsynced, clean);
    intent.set_logged_at_open(logged);
    Opened { intent, unclean: !clean, dirty_region_count, notes }
}

fn matches(header: &Header, identity: Identity, regions: RegionMap) -> bool {
    header.controller_id == identity.controller_id
        && header.vd_id == identity.vd_id
        && header.rows_per_region == regions.rows_per_region
        && header.region_count == regions.region_count
}

/// Slot 0 = `dirty` and `unsynced`, slot 1's dirty half `logged`, the other shard slots empty
/// (one write of every slot), flushed; then the header.
fn prepare(drive: &dyn Drive, header: &Header, dirty: &Bits, unsynced: &Bits, logged: &Bits) -> Result<(), drive::DriveError> {
    let mut slots = vec![0u8; SLOT_COUNT * ondisk::SLOT_BYTES as usize];
    let image = ondisk::slot_image(dirty, unsynced);
    slots[..image.len()].copy_from_slice(&image);
    let shard_0 = ondisk::slot_image(logged, &Bits::new(header.region_count));
    let at = ondisk::SLOT_BYTES as usize;
    slots[at..at + shard_0.len()].copy_from_slice(&shard_0);
    ondisk::write_slot(drive, 0, &slots)?;
    ondisk::flush(drive)?;
    ondisk::write_header(drive, header)
}

/// Prepares the area of a drive that joins the VD (a spare or replacement being rebuilt): this
/// run's header, slot 0 as it is, the shard slots empty (the other members hold their bits).
pub fn join(identity: Identity, intent: &WriteIntent, drive: &dyn Drive) -> Result<(), String> {
    let header = Header {
        controller_id: identity.controller_id,
        vd_id: identity.vd_id,
        rows_per_region: intent.regions.rows_per_region,
        region_count: intent.regions.region_count,
        epoch: intent.epoch,
        clean: false,
        version: ondisk::VERSION,
    };
    let none = Bits::new(intent.regions.region_count);
    prepare(drive, &header, &intent.inherited(), &intent.unsynced_regions(), &none)
        .map_err(|e| format!("{}: preparing its bitmap failed: {e}", drive.info().name))
}

/// Clears slot 0 on `members` once what it held is resynced and every member is in service:
/// the members are flushed first, so that nothing it covered can still be lost.
pub fn clear_inherited(intent: &WriteIntent, members: &[Arc<dyn Drive>]) -> Result<(), String> {
    write_inherited(intent, members, &Bits::new(intent.regions.region_count))?;
    intent.clear_inherited();
    Ok(())
}

/// A resync's checkpoint, every member being in service: slot 0 keeps only the regions still
/// unsynced (and those written while a member was out), so that a crash resumes the resync
/// where it was rather than from its start. The members are flushed first: what the resync
/// wrote in the regions dropped from slot 0 is durable before their bits go.
pub fn checkpoint_resync(intent: &WriteIntent, members: &[Arc<dyn Drive>]) -> Result<(), String> {
    let kept = intent.keep_inherited_unsynced();
    write_inherited(intent, members, &kept)
}

/// Writes slot 0 again with the regions unsynced now (after [`WriteIntent::images_lost`]), so
/// that a crash before their resync finds them unsynced still.
pub fn record_unsynced(intent: &WriteIntent, members: &[Arc<dyn Drive>]) -> Result<(), String> {
    write_inherited(intent, members, &intent.inherited())
}

/// Every region unsynced, in memory and in slot 0 on `members`: what a full initialization
/// does before it overwrites them, so that a crash part way leaves every region to a resync.
pub fn mark_all_unsynced(intent: &WriteIntent, members: &[Arc<dyn Drive>]) -> Result<(), String> {
    let mut all = Bits::new(intent.regions.region_count);
    (0..intent.regions.region_count).for_each(|region| all.set(region));
    intent.add_inherited(&all);
    (0..intent.regions.region_count).for_each(|region| intent.mark_unsynced(region));
    write_inherited(intent, members, &intent.inherited())
}

/// Flushes `members`, writes `bits` to slot 0 (the regions awaiting a resync now in its
/// unlogged half) and flushes again.
fn write_inherited(intent: &WriteIntent, members: &[Arc<dyn Drive>], bits: &Bits) -> Result<(), String> {
    let image = ondisk::slot_image(bits, &intent.unsynced_regions());
    for drive in members {
        let name = &drive.info().name;
        ondisk::flush(&**drive).map_err(|e| format!("{name}: flush before writing slot 0 of the bitmap failed: {e}"))?;
        ondisk::write_slot(&**drive, 0, &image).map_err(|e| format!("{name}: writing slot 0 of the bitmap failed: {e}"))?;
        ondisk::flush(&**drive).map_err(|e| format!("{name}: flush after writing slot 0 of the bitmap failed: {e}"))?;
    }
    Ok(())
}

/// Marks a stop on `members` (flushed first): "clean" unless regions still await a resync.
/// The shards have cleared their slots (a clean pass with `stopping`); what a member out of
/// service missed goes to slot 0 first, so that its re-add after the restart knows it.
pub fn close(identity: Identity, intent: &WriteIntent, members: &[Arc<dyn Drive>]) -> Result<(), String> {
    let header = Header {
        controller_id: identity.controller_id,
        vd_id: identity.vd_id,
        rows_per_region: intent.regions.rows_per_region,
        region_count: intent.regions.region_count,
        epoch: intent.epoch,
        clean: intent.unsynced_count() == 0,
        version: ondisk::VERSION,
    };
    let dirty = ondisk::slot_image(&intent.dirty_regions(), &intent.unsynced_regions());
    for drive in members {
        let name = &drive.info().name;
        ondisk::flush(&**drive).map_err(|e| format!("{name}: flush before the clean mark failed: {e}"))?;
        ondisk::write_slot(&**drive, 0, &dirty).map_err(|e| format!("{name}: writing the dirty regions failed: {e}"))?;
        ondisk::flush(&**drive).map_err(|e| format!("{name}: flush before the clean mark failed: {e}"))?;
        ondisk::write_header(&**drive, &header).map_err(|e| format!("{name}: writing the clean mark failed: {e}"))?;
    }
    Ok(())
}
