//! The consistency check against the real daemon: garbage written into one member's strip
//! underneath a stopped daemon (RAID5, RAID6, RAID10) is reported by `start cc` in an event that
//! names the slot as precisely as the level allows and repaired; afterwards a *different*
//! member taken offline still leaves every byte of the image right.

mod common;

use common::api_types::{CcView, EventView};
use common::{export_difference, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use layout::{Geometry, GeometryConfig, Level, Place, RowMap};
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 64 * MIB;
const CC_TIMEOUT: Duration = Duration::from_secs(120);

fn corrupt(path: &str, offset_bytes: u64, len_bytes: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("open a member file");
    let garbage: Vec<u8> = (0..len_bytes).map(|i| (i * 13 + 5) as u8).collect();
    file.write_all_at(&garbage, offset_bytes).expect("write garbage into the member");
}

fn wait_for_cc(daemon: &Daemon) {
    let deadline = Instant::now() + CC_TIMEOUT;
    while !daemon.get::<Vec<CcView>>("/api/v1/ccs").is_empty() {
        assert!(Instant::now() < deadline, "the consistency check never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The strip of a row to corrupt.
type Pick = fn(&RowMap) -> Place;
/// What the row's event must say about the corrupted slot.
type Said = fn(u32) -> String;

#[test]
fn cc_names_the_slot_repairs_and_another_member_out_still_reads_right() {
    common::require_tool("nbdcopy", "libnbd-bin");
    // level, what to corrupt in the row, words the event must hold for slot N.
    let cases: [(&str, Level, Pick, Said); 3] = [
        ("r5", Level::Raid5, |map| map.p_place().unwrap(), |slot| format!("P on slot {slot} disagrees with the data")),
        ("r6", Level::Raid6, |map| map.data_copy(0, 0), |slot| format!("slot {slot} (Data")),
        ("r10", Level::Raid10, |map| map.data_copy(0, 1), |slot| format!("and slot {slot}; nothing tells which is right")),
    ];
    for (level_name, level, pick, said) in cases {
        let scratch = Scratch::new(&format!("cc-{level_name}"));
        let drives: Vec<String> = (0..4).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
        let daemon = Daemon::start(&scratch, &drives);
        let vd = daemon.create_vd(level_name, &[0, 1, 2, 3], "db");
        let image = scratch.join("image.raw");
        write_random_image(&image, vd.size_bytes, 23);
        nbdcopy_in(&image, &daemon.unix_uri("db"));
        daemon.stop();

        let geometry = Geometry::new(GeometryConfig {
            level,
            drive_count: 4,
            drives_per_span: (level == Level::Raid10).then_some(2),
            strip_size_bytes: vd.strip_size_bytes,
            member_size_bytes: DRIVE_BYTES,
            member_reserved_bytes: engine::MEMBER_RESERVED_BYTES,
        })
        .unwrap();
        let row = 5;
        let place = pick(&geometry.row_map(row));
        corrupt(&drives[place.drive], place.drive_offset_bytes, vd.strip_size_bytes);
        let slot = vd.member_slots[place.drive];

        let daemon = Daemon::start(&scratch, &drives);
        let started = daemon.cli(&["/c0/v0", "start", "cc"]);
        assert!(started.contains("consistency check of v0 started"), "{started}");
        wait_for_cc(&daemon);
        let events: Vec<String> = daemon.get::<Vec<EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect();
        let reported: Vec<&String> = events.iter().filter(|e| e.contains("inconsistent:")).collect();
        assert_eq!(reported.len(), 1, "{level_name}: exactly one row reported: {reported:#?}");
        assert!(reported[0].contains(&format!("row {row} ")) && reported[0].contains(&said(slot)), "{level_name}: {}", reported[0]);
        let shown = daemon.cli(&["/c0/v0", "show", "cc"]);
        assert!(shown.contains("CC Not in progress"), "{shown}");

        // Another member out: every byte must come through the repaired redundancy.
        let other = if level == Level::Raid10 { slot ^ 1 } else { (slot + 1) % 4 };
        daemon.cli(&[&format!("/c0/s{other}"), "set", "offline"]);
        if let Some(difference) = export_difference(&daemon.unix_uri("db"), &image, vd.size_bytes) {
            panic!("{level_name}: after the repair with slot {other} offline: {difference}");
        }
        daemon.stop();
    }
}
