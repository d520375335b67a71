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
    let header = Header { controller_id: 7 << 100, vd_id: 3, rows_per_region: 1024, region_count: 17, epoch: 9, clean: true };
    let bytes = header.encode();
    assert_eq!(Header::decode(&bytes), Ok(header));
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
    assert!(!slot.enter(5, 100), "a clean region must be written first");
    let write = slot.start_write().expect("no writer yet");
    assert_eq!(write.blocks, vec![0]);
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
    assert!(!slot.enter(5, 100));
    drop(slot.finish_write(clearing.image, true));
    assert!(!slot.is_durable(5));
    let setting = slot.start_write().expect("no writer");
    assert!(setting.image.get(5));
    drop(slot.finish_write(setting.image, true));
    assert!(slot.is_durable(5));
    // A region with a write in flight is never a candidate.
    assert!(slot.clean_candidates(true).is_empty());
    slot.leave(5);
    assert_eq!(slot.clean_candidates(true), vec![5]);
}
