use super::*;
use std::collections::HashMap;

const RESERVED_BYTES: u64 = 64 * KIB;

fn geometry(level: Level, drive_count: usize, per_span: Option<usize>, strip_kib: u64, member_kib: u64) -> Geometry {
    Geometry::new(GeometryConfig {
        level,
        drive_count,
        drives_per_span: per_span,
        strip_size_bytes: strip_kib * KIB,
        member_size_bytes: member_kib * KIB,
        member_reserved_bytes: RESERVED_BYTES,
    })
    .unwrap()
}

/// One case per level: (level, drives, drives per span).
fn all_layouts() -> Vec<(Level, usize, Option<usize>)> {
    vec![
        (Level::Jbod, 1, None),
        (Level::Raid0, 1, None),
        (Level::Raid0, 5, None),
        (Level::Raid1, 2, None),
        (Level::Raid1E, 3, None),
        (Level::Raid1E, 4, None),
        (Level::Raid1E, 5, None),
        (Level::Raid5, 3, None),
        (Level::Raid5, 8, None),
        (Level::Raid6, 4, None),
        (Level::Raid6, 7, None),
        (Level::Raid10, 4, None),
        (Level::Raid10, 6, Some(2)),
        (Level::Raid50, 6, None),
        (Level::Raid50, 12, Some(4)),
        (Level::Raid60, 8, None),
        (Level::Raid60, 15, Some(5)),
    ]
}

/// Every member byte is used by exactly one (row, role) and every VD byte maps to distinct places:
/// the mapping is a bijection from (VD byte, copy) and parity roles onto the used member area.
#[test]
fn every_member_byte_has_exactly_one_owner() {
    for (level, drives, per_span) in all_layouts() {
        for strip_kib in [8, 64] {
            let g = geometry(level, drives, per_span, strip_kib, RESERVED_BYTES / KIB + strip_kib * 8);
            let mut owner: HashMap<(usize, u64), (Role, u64)> = HashMap::new();
            let unit = g.strip_size_bytes();
            for extent in g.extents(0, g.capacity_bytes()) {
                assert_eq!(extent.len_bytes % unit, 0, "{level}: whole-VD extents are whole strips");
                for strip_start in (0..extent.len_bytes).step_by(unit as usize) {
                    let key = (extent.drive, extent.drive_offset_bytes + strip_start);
                    let value = (extent.role, extent.vd_offset_bytes + strip_start);
                    let before = owner.insert(key, value);
                    assert!(before.is_none(), "{level} {drives}: {key:?} owned twice: {before:?} and {value:?}");
                }
            }
            let used_per_member = (g.member_used_bytes() - g.data_offset_bytes()) / unit;
            assert_eq!(owner.len() as u64, used_per_member * drives as u64, "{level} {drives}: member area fully used");
            for (drive, offset) in owner.keys() {
                assert!(*drive < drives && *offset >= g.data_offset_bytes() && *offset < g.member_used_bytes());
            }
        }
    }
}

#[test]
fn capacity_follows_the_smallest_member_and_whole_rows() {
    // 10 strips of 64 KiB after the metadata area, plus a partial strip that must be ignored.
    let member_kib = RESERVED_BYTES / KIB + 10 * 64 + 17;
    let check = |level, drives, per_span: Option<usize>, expected_strips: u64| {
        let g = geometry(level, drives, per_span, 64, member_kib);
        assert_eq!(g.capacity_bytes(), expected_strips * 64 * KIB, "{level} over {drives}");
    };
    check(Level::Jbod, 1, None, 10);
    check(Level::Raid0, 4, None, 40);
    check(Level::Raid1, 2, None, 10);
    check(Level::Raid1E, 3, None, 15); // 5 logical rows of 3 strips
    check(Level::Raid5, 5, None, 40);
    check(Level::Raid6, 6, None, 40);
    check(Level::Raid10, 8, None, 40);
    check(Level::Raid50, 6, None, 40);
    check(Level::Raid60, 10, None, 60);
}

#[test]
fn raid5_parity_rotates_left_symmetric_like_md() {
    let g = geometry(Level::Raid5, 4, None, 64, 1024);
    // md left-symmetric, 4 disks: row 0 P on disk 3, data D0..D2 on 0,1,2;
    // row 1 P on 2, data on 3,0,1; row 2 P on 1, data on 2,3,0; row 3 P on 0, data on 1,2,3.
    let expected = [(3, [0, 1, 2]), (2, [3, 0, 1]), (1, [2, 3, 0]), (0, [1, 2, 3])];
    for (row, (p, data)) in expected.iter().enumerate() {
        let map = g.row_map(row as u64);
        assert_eq!(map.p_place().unwrap().drive, *p, "row {row}");
        let got: Vec<usize> = (0..3).map(|k| map.data_copy(k, 0).drive).collect();
        assert_eq!(got, data.to_vec(), "row {row}");
    }
}

#[test]
fn raid6_q_follows_p_and_data_follows_q_like_md() {
    let g = geometry(Level::Raid6, 5, None, 64, 1024);
    // md raid6 left-symmetric: pd = n-1-(r%n), qd = pd+1, data from pd+2.
    let expected = [(4, 0, [1, 2, 3]), (3, 4, [0, 1, 2]), (2, 3, [4, 0, 1])];
    for (row, (p, q, data)) in expected.iter().enumerate() {
        let map = g.row_map(row as u64);
        assert_eq!((map.p_place().unwrap().drive, map.q_place().unwrap().drive), (*p, *q), "row {row}");
        let got: Vec<usize> = (0..3).map(|k| map.data_copy(k, 0).drive).collect();
        assert_eq!(got, data.to_vec(), "row {row}");
    }
}

#[test]
fn raid1e_copy_is_one_row_down_one_drive_over() {
    let g = geometry(Level::Raid1E, 3, None, 64, 1024);
    let map = g.row_map(1);
    let base = RESERVED_BYTES;
    for k in 0..3 {
        assert_eq!(map.data_copy(k, 0), Place { drive: k, drive_offset_bytes: base + 2 * 64 * KIB });
        assert_eq!(map.data_copy(k, 1), Place { drive: (k + 1) % 3, drive_offset_bytes: base + 3 * 64 * KIB });
    }
}

#[test]
fn spanned_levels_deal_rows_to_spans_round_robin() {
    let g = geometry(Level::Raid50, 6, None, 64, 1024);
    assert_eq!((g.span_count(), g.drives_per_span()), (2, 3));
    let spans: Vec<usize> = (0..4).map(|r| g.row_map(r).span).collect();
    assert_eq!(spans, vec![0, 1, 0, 1]);
    assert!(g.row_map(1).p_place().unwrap().drive >= 3, "span 1 uses drives 3..6");
    let g10 = geometry(Level::Raid10, 4, None, 64, 1024);
    assert_eq!(g10.row_map(1).data_copy(0, 1).drive, 3);
}

#[test]
fn a_range_splits_into_rows_and_strips_in_order() {
    let g = geometry(Level::Raid5, 4, None, 64, 1024); // rows of 192 KiB
    let pieces: Vec<RowPiece> = g.rows(100 * KIB, 200 * KIB).collect();
    assert_eq!(pieces.len(), 2);
    assert_eq!((pieces[0].row, pieces[0].offset_in_row_bytes, pieces[0].len_bytes), (0, 100 * KIB, 92 * KIB));
    assert_eq!((pieces[1].row, pieces[1].offset_in_row_bytes, pieces[1].len_bytes), (1, 0, 108 * KIB));
    let strips: Vec<DataPiece> = g.row_map(0).data_pieces(100 * KIB, 92 * KIB).collect();
    assert_eq!(strips.len(), 2);
    assert_eq!((strips[0].strip_index, strips[0].offset_in_strip_bytes, strips[0].len_bytes), (1, 36 * KIB, 28 * KIB));
    assert_eq!((strips[1].strip_index, strips[1].offset_in_piece_bytes, strips[1].len_bytes), (2, 28 * KIB, 64 * KIB));
}

#[test]
fn column_range_covers_what_a_write_changes() {
    let map = geometry(Level::Raid5, 4, None, 64, 1024).row_map(0);
    assert_eq!(map.column_range(4 * KIB, 8 * KIB), (4 * KIB, 12 * KIB));
    assert_eq!(map.column_range(60 * KIB, 8 * KIB), (0, 64 * KIB));
    assert_eq!(map.column_range(0, 128 * KIB), (0, 64 * KIB));
}

#[test]
fn survives_counts_per_span_and_neighbours_for_raid1e() {
    let check = |level, drives, lost: &[usize], expected: bool| {
        let g = geometry(level, drives, None, 64, 1024);
        let mut mask = vec![false; drives];
        lost.iter().for_each(|&d| mask[d] = true);
        assert_eq!(g.survives(&mask), expected, "{level} over {drives} losing {lost:?}");
    };
    check(Level::Raid0, 3, &[], true);
    check(Level::Raid0, 3, &[1], false);
    check(Level::Raid5, 4, &[2], true);
    check(Level::Raid5, 4, &[0, 2], false);
    check(Level::Raid6, 5, &[0, 4], true);
    check(Level::Raid6, 5, &[0, 1, 4], false);
    check(Level::Raid10, 4, &[0, 2], true);
    check(Level::Raid10, 4, &[0, 1], false);
    check(Level::Raid50, 6, &[1, 5], true);
    check(Level::Raid60, 8, &[0, 1, 6, 7], true);
    check(Level::Raid1E, 5, &[0, 2], true);
    check(Level::Raid1E, 5, &[4, 0], false);
}

#[test]
fn bad_geometry_names_the_rule() {
    let check = |level, drives, per_span, strip_kib: u64, member_kib: u64, expected: &str| {
        let err = Geometry::new(GeometryConfig {
            level,
            drive_count: drives,
            drives_per_span: per_span,
            strip_size_bytes: strip_kib * KIB,
            member_size_bytes: member_kib * KIB,
            member_reserved_bytes: RESERVED_BYTES,
        })
        .unwrap_err();
        assert_eq!(err.to_string(), expected);
    };
    check(Level::Raid5, 2, None, 64, 1024, "RAID5 needs 3 to 32 drives; got 2");
    check(Level::Raid6, 3, None, 64, 1024, "RAID6 needs 4 to 32 drives; got 3");
    check(Level::Raid1, 3, None, 64, 1024, "RAID1 needs exactly 2 drives; got 3");
    check(Level::Jbod, 2, None, 64, 1024, "JBOD needs exactly 1 drive; got 2");
    check(Level::Raid10, 5, None, 64, 1024, "RAID10 needs 2 to 8 spans of equal size; 5 drives do not split into spans of 2");
    check(Level::Raid50, 4, None, 64, 1024, "RAID50 needs at least 6 drives (2 to 8 spans of 3 or more); got 4");
    check(Level::Raid60, 8, Some(3), 64, 1024, "RAID60 needs 4 to 32 drives per span; got 3");
    check(Level::Raid5, 4, Some(2), 64, 1024, "pdperarray applies only to r10, r50 and r60, not RAID5");
    check(Level::Raid0, 2, None, 48, 1024, "strip size 49152 bytes is not allowed; allowed: a power of two from 8 KiB to 1 MiB");
    check(Level::Raid0, 2, None, 2048, 4096, "strip size 2097152 bytes is not allowed; allowed: a power of two from 8 KiB to 1 MiB");
    check(Level::Raid1E, 3, None, 64, 100, "member drives of 102400 bytes are too small: RAID1E with a 65536-byte strip needs at least 196608 bytes per drive (including 65536 bytes of metadata)");
    assert_eq!(
        Level::parse("raid7").unwrap_err().to_string(),
        "unknown RAID level \"raid7\"; allowed: r0, r1, r1e, r5, r6, r10, r50, r60, jbod"
    );
}

#[test]
fn level_names_round_trip() {
    for level in Level::ALL {
        assert_eq!(Level::parse(level.short_name()).unwrap(), level);
        assert_eq!(Level::parse(&level.to_string()).unwrap(), level);
    }
}

proptest::proptest! {
    /// Any sector-aligned range maps to data extents that tile it exactly, once per copy.
    #[test]
    fn data_extents_tile_any_range(level_index in 0usize..17, start_sectors in 0u64..4000, len_sectors in 1u64..3000) {
        let (level, drives, per_span) = all_layouts()[level_index];
        let g = geometry(level, drives, per_span, 16, 1024);
        let start = (start_sectors * SECTOR_BYTES) % g.capacity_bytes();
        let len = (len_sectors * SECTOR_BYTES).min(g.capacity_bytes() - start);
        let copies = g.row_map(0).copy_count();
        let mut covered = vec![0usize; (len / SECTOR_BYTES) as usize];
        for extent in g.extents(start, len).filter(|e| matches!(e.role, Role::Data { .. })) {
            for sector in 0..extent.len_bytes / SECTOR_BYTES {
                covered[((extent.vd_offset_bytes - start) / SECTOR_BYTES + sector) as usize] += 1;
            }
        }
        proptest::prop_assert!(covered.iter().all(|&c| c == copies));
    }
}

#[test]
fn a_jbod_byte_lies_where_its_row_map_puts_it() {
    let g = geometry(Level::Jbod, 1, None, 64, 1024);
    let last_byte = g.capacity_bytes() - 1;
    for vd_offset_bytes in [0, 511, 64 * KIB - 1, 64 * KIB, 300 * KIB + 4096, last_byte] {
        let row = g.rows(vd_offset_bytes, 1).next().unwrap();
        let map = g.row_map(row.row);
        let piece = map.data_pieces(row.offset_in_row_bytes, 1).next().unwrap();
        let place = map.data_copy(piece.strip_index, 0);
        assert_eq!(place.drive, 0);
        let expected = (row.row, place.drive_offset_bytes + piece.offset_in_strip_bytes);
        assert_eq!(g.jbod_place(vd_offset_bytes), expected, "byte {vd_offset_bytes}");
    }
}

#[test]
#[should_panic(expected = "past capacity")]
fn a_jbod_byte_past_the_capacity_has_no_place() {
    let g = geometry(Level::Jbod, 1, None, 64, 1024);
    g.jbod_place(g.capacity_bytes());
}
