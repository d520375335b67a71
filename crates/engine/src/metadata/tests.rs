//! Unit tests of what the public API cannot see: the field tables and the code tables, and
//! their agreement with docs/on-disk-format.md.

use super::codec::{bad_block, counts, drive_record, header, hot_spare_record, tiles, vd_record, Code, Field};
use crate::config::{CcMode, DriveState, IoPolicy, ReadPolicy, WritePolicy};
use layout::Level;

const DOC: &str = include_str!("../../../../docs/on-disk-format.md");

/// The data rows (first cell a number) of the table under `### {heading}`, cells trimmed and
/// without backticks.
fn doc_table(heading: &str) -> Vec<Vec<String>> {
    let mut lines = DOC.lines().skip_while(|line| *line != format!("### {heading}"));
    assert!(lines.next().is_some(), "docs/on-disk-format.md has no `### {heading}` section");
    lines
        .take_while(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with('|'))
        .map(|line| line.trim_matches('|').split('|').map(|cell| cell.trim().replace('`', "")).collect::<Vec<_>>())
        .filter(|cells| cells[0].parse::<u64>().is_ok())
        .collect()
}

pub(crate) fn check_byte_table(heading: &str, fields: &[Field]) {
    let documented: Vec<(usize, usize, String)> =
        doc_table(heading).iter().map(|row| (row[0].parse().unwrap(), row[1].parse().unwrap(), row[3].clone())).collect();
    let coded: Vec<(usize, usize, String)> = fields.iter().map(|f| (f.offset, f.size, f.name.to_string())).collect();
    assert_eq!(documented, coded, "docs/on-disk-format.md `### {heading}` vs the code (offset, size, field)");
}

fn check_code_table<T: Code>(heading: &str) {
    let documented: Vec<(u8, String)> = doc_table(heading).iter().map(|row| (row[0].parse().unwrap(), row[1].clone())).collect();
    let coded: Vec<(u8, String)> = T::ALL.iter().map(|v| (v.code(), v.short_name().to_string())).collect();
    assert_eq!(documented, coded, "docs/on-disk-format.md `### {heading}` vs the code (code, name)");
}

#[test]
fn doc_tables_match_the_code() {
    check_byte_table("Header", &header::ALL);
    check_byte_table("Counts", &counts::ALL);
    check_byte_table("Drive record", &drive_record::ALL);
    check_byte_table("VD record", &vd_record::ALL);
    check_byte_table("Hot spare record", &hot_spare_record::ALL);
    check_byte_table("Bad block entry", &bad_block::ALL);
    check_code_table::<DriveState>("Drive state codes");
    check_code_table::<Level>("RAID level codes");
    check_code_table::<WritePolicy>("Write policy codes");
    check_code_table::<ReadPolicy>("Read policy codes");
    check_code_table::<IoPolicy>("IO policy codes");
    check_code_table::<CcMode>("Consistency check schedule codes");
}

#[test]
fn field_tables_tile_their_records() {
    // Also asserted at compile time; this checks that `tiles` rejects what it must.
    let a = |offset, size| Field { name: "x", offset, size };
    assert!(tiles(&[a(0, 4), a(4, 4)], 8));
    assert!(!tiles(&[a(0, 4), a(5, 3)], 8), "gap");
    assert!(!tiles(&[a(0, 4), a(3, 5)], 8), "overlap");
    assert!(!tiles(&[a(0, 4), a(4, 4)], 12), "short of the record");
    assert!(!tiles(&[a(0, 0), a(0, 8)], 8), "empty field");
}

fn check_codes<T: Code>() {
    let mut seen = Vec::new();
    for &value in T::ALL {
        let code = value.code();
        assert_ne!(code, 0, "{value:?}: code 0 is reserved so that zeroed bytes never decode");
        assert!(!seen.contains(&code), "{value:?}: code {code} is used twice");
        assert_eq!(T::from_code(code), Some(value), "{value:?} round trip");
        seen.push(code);
    }
    let unknown = (0..=u8::MAX).filter(|code| !seen.contains(code));
    unknown.for_each(|code| assert_eq!(T::from_code(code), None, "code {code} is not in the table"));
}

#[test]
fn every_code_round_trips_and_no_other_decodes() {
    check_codes::<DriveState>();
    check_codes::<Level>();
    check_codes::<WritePolicy>();
    check_codes::<ReadPolicy>();
    check_codes::<CcMode>();
    check_codes::<IoPolicy>();
}
