use super::ondisk::{self, Header};
use super::shard::ShardSlot;
use super::*;

#[test]
fn bits_round_trip_through_slot_bytes() {
    let mut bits = Bits::new(1000);
    [0, 7, 8, 63, 64, 999].iter().for_each(|&i| bits.set(i));
    let bytes = bits.to_bytes(4096);
    assert_eq!(bytes[0], 0b1000_0001, "bit i is bit i % 8 of byte i / 8");
    assert_eq!(Bits::from_bytes(&bytes, 1000), bits);
    assert_eq!(bits.ones().collect::<Vec<_>>(), vec![0, 7, 8, 63, 64, 999]);
    // Stray bits past the end are noise, not regions.
    let mut noisy = bytes.clone();
    noisy[124] = 0xFF; // regions 992..1000, 999 among them
    noisy[125] = 0xFF; // regions 1000..1008: past the end of 1000
    assert_eq!(Bits::from_bytes(&noisy, 1000).count(), 5 + 8);
    assert_eq!(Bits::from_bytes(&noisy, 1001).count(), 5 + 9);
}

#[test]
fn header_round_trips_and_refuses_damage() {
    let header = Header {
        controller_id: 7 << 100,
        vd_id: 3,
        rows_per_region: 1024,
        region_count: 17,
        epoch: 9,
        clean: true,
        version: ondisk::VERSION,
    };
    let bytes = header.encode();
    assert_eq!(Header::decode(&bytes), Ok(header));
    // A version-1 header (one half per slot) is still read, and says so.
    let mut v1 = bytes.clone();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&v1[..4092]);
    v1[4092..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(Header::decode(&v1), Ok(Header { version: ondisk::VERSION_V1, ..header }));
    for at in [0, 9, 13, 20, 40, 60, 100, 4093] {
        let mut torn = bytes.clone();
        torn[at] ^= 1;
        assert!(Header::decode(&torn).is_err(), "byte {at} flipped");
    }
    assert!(Header::decode(&[0; 4096]).is_err());
}

#[test]
fn regions_cover_64_mib_of_each_member_and_grow_to_fit_a_slot() {
    let geometry = |member_bytes: u64| {
        let config = layout::GeometryConfig {
            level: layout::Level::Raid5,
            drive_count: 4,
            drives_per_span: None,
            strip_size_bytes: 64 << 10,
            member_size_bytes: member_bytes,
            member_reserved_bytes: 4 << 20,
        };
        layout::Geometry::new(config).unwrap()
    };
    let small = RegionMap::for_geometry(&geometry(1 << 30));
    assert_eq!(small.rows_per_region, 1024, "64 MiB of 64 KiB strips");
    assert_eq!(small.region_count, small.row_count.div_ceil(1024));
    let huge = RegionMap::for_geometry(&geometry(64 << 40));
    assert!(huge.region_count <= ondisk::REGIONS_MAX && huge.rows_per_region > 1024);
    assert_eq!(huge.rows_of(huge.region_count - 1).end, huge.row_count);
}

#[test]
fn a_write_waits_for_its_bit_and_a_clear_never_races_a_write() {
    let mut slot = ShardSlot::default();
    assert!(!slot.enter(5, 100, true), "a clean region must be written first");
    let write = slot.start_write().expect("no writer yet");
    assert_eq!(write.blocks, vec![0, ondisk::HALF_BLOCKS], "the dirty and the unlogged half");
    assert!(slot.start_write().is_none(), "one writer at a time");
    assert!(slot.finish_write(write.image, true).is_empty());
    assert!(slot.is_durable(5));
    // Idle for a whole period, then cleared.
    slot.leave(5);
    assert!(slot.clean_candidates(false).is_empty(), "touched in this period");
    let candidates = slot.clean_candidates(false);
    assert_eq!(candidates, vec![5]);
    assert!(slot.clear_idle(&candidates));
    let clearing = slot.start_write().expect("no writer");
    // A write that comes while the cleared image is on its way must not trust the old bit.
    assert!(!slot.enter(5, 100, true));
    drop(slot.finish_write(clearing.image, true));
    assert!(!slot.is_durable(5));
    let setting = slot.start_write().expect("no writer");
    assert!(setting.image.dirty.get(5) && setting.image.unlogged.get(5));
    drop(slot.finish_write(setting.image, true));
    assert!(slot.is_durable(5));
    // A region with a write in flight is never a candidate.
    assert!(slot.clean_candidates(true).is_empty());
    slot.leave(5);
    assert_eq!(slot.clean_candidates(true), vec![5]);
}

/// A logged write (its row image is in the journal) sets only the dirty bit; one that turns out
/// unlogged must wait for its unlogged bit too, and a clean pass clears both.
#[test]
fn a_logged_write_sets_only_its_dirty_bit_and_an_unlogged_one_waits_for_both() {
    let mut slot = ShardSlot::default();
    assert!(!slot.enter(7, 100, false));
    let write = slot.start_write().expect("no writer");
    assert_eq!(write.blocks, vec![0], "the dirty half only");
    drop(slot.finish_write(write.image, true));
    assert!(slot.is_durable(7) && !slot.is_unlogged_durable(7));
    assert!(!slot.mark_unlogged(7), "its image could not be logged: the unlogged bit must land first");
    let write = slot.start_write().expect("no writer");
    assert_eq!(write.blocks, vec![ondisk::HALF_BLOCKS]);
    drop(slot.finish_write(write.image, true));
    assert!(slot.is_unlogged_durable(7));
    slot.leave(7);
    slot.clean_candidates(false);
    let candidates = slot.clean_candidates(false);
    assert!(slot.clear_idle(&candidates));
    let write = slot.start_write().expect("no writer");
    assert!(write.image.dirty.is_empty() && write.image.unlogged.is_empty(), "both halves cleared");
}

mod opening {
    use super::super::control::{self, Identity, Opening};
    use super::*;
    use drive::{Drive, MemDrive};
    use std::sync::Arc;

    const IDENTITY: Identity = Identity { controller_id: 0x5eed, vd_id: 4 };

    fn members_and_regions() -> (Vec<Arc<dyn Drive>>, RegionMap) {
        let config = layout::GeometryConfig {
            level: layout::Level::Raid5,
            drive_count: 3,
            drives_per_span: None,
            strip_size_bytes: 64 << 10,
            member_size_bytes: 12 << 20,
            member_reserved_bytes: 4 << 20,
        };
        let geometry = layout::Geometry::new(config).unwrap();
        let members = (0..3).map(|_| Arc::new(MemDrive::new(12 << 20)) as Arc<dyn Drive>).collect();
        (members, RegionMap::with_rows_per_region(&geometry, 8))
    }

    fn bits(region_count: u64, ones: &[u64]) -> Bits {
        let mut bits = Bits::new(region_count);
        ones.iter().for_each(|&r| bits.set(r));
        bits
    }

    /// A shard's write to `region`, as its slot holds it on every member: dirty and unlogged.
    fn shard_wrote(members: &[Arc<dyn Drive>], regions: RegionMap, region: u64) {
        let written = bits(regions.region_count, &[region]);
        let image = ondisk::slot_image(&written, &written);
        members.iter().for_each(|m| ondisk::write_slot(&**m, 1, &image).unwrap());
    }

    /// A VD stopped cleanly while a member was out keeps, in slot 0, the regions written
    /// meanwhile (for that member's re-add). They agree within themselves: after a later crash
    /// only what the shards wrote (and what awaited a resync) needs one.
    #[test]
    fn an_unclean_open_resyncs_what_was_unlogged_not_what_slot_0_kept_for_a_re_add() {
        let (members, regions) = members_and_regions();
        let opened = control::open(IDENTITY, regions, &members, Opening::CreatedZeroed);
        opened.intent.note_written_degraded(&[2]);
        control::close(IDENTITY, &opened.intent, &members).unwrap();
        let clean = control::open(IDENTITY, regions, &members, Opening::Assembled);
        assert!(!clean.unclean && clean.intent.unsynced_count() == 0);
        assert_eq!(clean.intent.inherited(), bits(regions.region_count, &[2]), "slot 0 keeps it for a re-add");
        shard_wrote(&members, regions, 5);
        // Crash: no close.
        let crashed = control::open(IDENTITY, regions, &members, Opening::Assembled);
        assert!(crashed.unclean);
        assert_eq!(crashed.intent.unsynced_regions(), bits(regions.region_count, &[5]), "only what a shard wrote");
        assert_eq!(crashed.intent.inherited(), bits(regions.region_count, &[2, 5]), "both stay dirty for a re-add");
        // Crash again before the resync: slot 0's unlogged half says region 5 still awaits it.
        let again = control::open(IDENTITY, regions, &members, Opening::Assembled);
        assert_eq!(again.intent.unsynced_regions(), bits(regions.region_count, &[5]));
    }

    /// A version-1 area has one half per slot: every dirty bit there also awaits a resync.
    #[test]
    fn a_version_1_area_counts_every_dirty_region_as_unsynced() {
        let (members, regions) = members_and_regions();
        control::open(IDENTITY, regions, &members, Opening::CreatedZeroed);
        let header = Header {
            controller_id: IDENTITY.controller_id,
            vd_id: IDENTITY.vd_id,
            rows_per_region: regions.rows_per_region,
            region_count: regions.region_count,
            epoch: 3,
            clean: false,
            version: ondisk::VERSION_V1,
        };
        let mut v1 = header.encode();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&v1[..4092]);
        v1[4092..].copy_from_slice(&crc.to_le_bytes());
        let slot_0 = bits(regions.region_count, &[1, 3]).to_bytes(4096);
        for member in &members {
            ondisk::write_slot(&**member, 0, &slot_0).unwrap();
            ondisk::write_and_flush(&**member, crate::metadata::BITMAP_AREA_OFFSET_BYTES, &v1).unwrap();
        }
        let opened = control::open(IDENTITY, regions, &members, Opening::Assembled);
        assert_eq!(opened.intent.unsynced_regions(), bits(regions.region_count, &[1, 3]));
        assert_eq!(opened.intent.epoch, 4);
        // It is written back in version 2: a crash now finds the same regions unsynced.
        let area = ondisk::read_area(&*members[0], regions.region_count).unwrap();
        assert_eq!(area.header.unwrap().version, ondisk::VERSION);
        assert_eq!(area.slots[0].unlogged, bits(regions.region_count, &[1, 3]));
    }
}
