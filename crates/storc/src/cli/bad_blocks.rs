//! `/c0/vN show badblocks`: the VD byte ranges whose data is lost, with their LBAs in 512-byte
//! sectors as storcli users read them.

use super::render::Report;
use super::table::{human_size, key_values, section, Table};
use crate::api_types::BadBlocksView;
use serde_json::Value;

pub fn report(view: &BadBlocksView, answer: &Value) -> Report {
    let mut table = Table::new(&["#", "Offset (bytes)", "Length (bytes)", "Size", "Start LBA", "Sectors"]);
    for (index, range) in view.bad_blocks.iter().enumerate() {
        table.push(vec![
            index.to_string(),
            range.offset_bytes.to_string(),
            range.len_bytes.to_string(),
            human_size(range.len_bytes),
            range.lba.to_string(),
            range.sectors.to_string(),
        ]);
    }
    let lost_bytes: u64 = view.bad_blocks.iter().map(|range| range.len_bytes).sum();
    let facts = [
        ("Bad Block Ranges", format!("{} (at most {})", view.bad_blocks.len(), view.max_ranges)),
        ("Bytes Lost", format!("{lost_bytes} ({})", human_size(lost_bytes))),
    ];
    let body = if table.is_empty() {
        "No bad blocks.\n".to_string()
    } else {
        table.render() + "\nReads that touch a bad block fail (EIO); writing it makes it good again.\n"
    };
    let text = "\n".to_string() + &key_values(&facts) + &section(&format!("/c0/v{} Bad Blocks", view.vd), &body);
    Report { description: "Show Bad Blocks Succeeded".to_string(), text, data: answer.clone() }
}

#[cfg(test)]
mod tests {
    use super::super::parse::Action;
    use super::super::render;
    use crate::api_types::BadBlockView;
    use serde_json::json;

    fn answer(ranges: &[(u64, u64)]) -> serde_json::Value {
        let bad_blocks: Vec<BadBlockView> = ranges
            .iter()
            .map(|&(offset_bytes, len_bytes)| BadBlockView { offset_bytes, len_bytes, lba: offset_bytes / 512, sectors: len_bytes / 512 })
            .collect();
        json!({ "vd": 1, "max_ranges": 1024, "bad_blocks": bad_blocks })
    }

    #[test]
    fn the_table_names_each_range_in_bytes_and_sectors() {
        let answer = answer(&[(12_648_448, 4096), (12_713_984, 8192)]);
        let report = render::report(&Action::ShowBadBlocks { vd: 1 }, std::slice::from_ref(&answer)).unwrap();
        assert_eq!(report.description, "Show Bad Blocks Succeeded");
        assert!(report.text.starts_with("\nBad Block Ranges = 2 (at most 1024)\nBytes Lost = 12288 (12.0 KiB)\n"), "{}", report.text);
        assert!(report.text.contains("\n/c0/v1 Bad Blocks :\n"), "{}", report.text);
        assert!(report.text.contains("\n# Offset (bytes) Length (bytes) Size    Start LBA Sectors\n"), "{}", report.text);
        assert!(report.text.contains("\n0 12648448       4096           4.0 KiB 24704     8\n"), "{}", report.text);
        assert!(report.text.contains("\n1 12713984       8192           8.0 KiB 24832     16\n"), "{}", report.text);
        assert_eq!(report.data, answer, "J shows the API's answer");
    }

    #[test]
    fn an_empty_list_says_so() {
        let report = render::report(&Action::ShowBadBlocks { vd: 0 }, &[answer(&[])]).unwrap();
        assert!(report.text.contains("No bad blocks.\n"), "{}", report.text);
        assert!(report.text.contains("Bytes Lost = 0 (0 B)\n"), "{}", report.text);
    }
}
