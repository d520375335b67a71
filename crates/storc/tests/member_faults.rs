//! The real daemon with member files that vanish or shrink while it is stopped (issue 8): it
//! starts, the slot is out of service with an event that says why, the VD serves degraded with
//! its size and data intact, and the event log covers the earlier boot.

mod common;

use common::api_types::{ControllerView, EventView};
use common::{Daemon, Scratch, MIB};
use nbd::{Client, ClientConfig, NbdUri};

const DRIVE_BYTES: u64 = 256 * MIB;
const DATA_BYTES: usize = 8 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed).rotate_left((i % 7) as u32)).collect()
}

fn client(daemon: &Daemon, export: &str) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: export.to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("NBD connect to {export}: {e}"))
}

/// Four member files, a RAID5 `db` on slots 0-2 holding `DATA_BYTES` of data, cleanly stopped.
fn raid5_with_data(scratch: &Scratch) -> (Vec<String>, u64) {
    let drives: Vec<String> = (0..4).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(scratch, &drives);
    let vd = daemon.create_vd("r5", &[0, 1, 2], "db");
    let mut nbd = client(&daemon, "db");
    for (index, chunk) in pattern(DATA_BYTES, 3).chunks(1 << 20).enumerate() {
        nbd.write((index << 20) as u64, chunk, false).unwrap();
    }
    nbd.flush().unwrap();
    drop(nbd);
    daemon.stop();
    (drives, vd.size_bytes)
}

fn descriptions(daemon: &Daemon) -> Vec<String> {
    let events: Vec<EventView> = daemon.get("/api/v1/events");
    events.into_iter().map(|e| e.description).collect()
}

fn check_degraded_with_data(daemon: &Daemon, slot: u32, slot_state: &str, size_bytes: u64) {
    let controller: ControllerView = daemon.controller();
    let vd = &controller.vds[0];
    assert_eq!(vd.state, "Dgrd", "{:?}", descriptions(daemon));
    assert_eq!(vd.size_bytes, size_bytes, "the VD keeps its size");
    assert_eq!(controller.drives.iter().find(|d| d.slot == slot).unwrap().state, slot_state);
    let mut nbd = client(daemon, "db");
    let mut read = Vec::with_capacity(DATA_BYTES);
    for offset in (0..DATA_BYTES).step_by(1 << 20) {
        read.extend(nbd.read(offset as u64, 1 << 20).unwrap());
    }
    assert!(read == pattern(DATA_BYTES, 3), "the data reads back through the degraded VD");
}

/// Regression: one missing member file stopped `storc serve` from starting at all.
#[test]
fn a_missing_member_file_leaves_its_slot_missing_and_the_vd_serves_degraded() {
    let scratch = Scratch::new("missing-member");
    let (drives, size_bytes) = raid5_with_data(&scratch);
    std::fs::remove_file(&drives[1]).unwrap();
    let daemon = Daemon::start(&scratch, &drives);
    check_degraded_with_data(&daemon, 1, "Msng", size_bytes);
    let events = descriptions(&daemon);
    let left_out = events.iter().any(|e| e.contains(&drives[1]) && e.contains("left out and its slot comes up missing"));
    assert!(left_out, "an event names the drive that could not be opened: {events:#?}");
    assert!(events.iter().any(|e| e.contains("v0 \"db\" starts Dgrd: slot 1 Msng")), "{events:#?}");
    // The log covers the earlier boot too (it used to be kept in memory only).
    assert!(events.iter().any(|e| e.starts_with("created v0 \"db\"")), "{events:#?}");
    assert!(events.iter().any(|e| e == "controller stopped cleanly"), "{events:#?}");
    daemon.stop();
}

/// Regression: a member truncated while stopped made the VD silently shrink, and when the file
/// grew back, 110 MiB read as zeros.
#[test]
fn a_member_file_truncated_while_stopped_is_not_used_and_the_vd_keeps_its_size() {
    let scratch = Scratch::new("shrunken-member");
    let (drives, size_bytes) = raid5_with_data(&scratch);
    std::fs::OpenOptions::new().write(true).open(&drives[2]).unwrap().set_len(DRIVE_BYTES / 2).unwrap();
    let daemon = Daemon::start(&scratch, &drives);
    check_degraded_with_data(&daemon, 2, "Failed", size_bytes);
    let events = descriptions(&daemon);
    let expected = format!("has {} bytes but v0 was laid out on {DRIVE_BYTES} bytes per member", DRIVE_BYTES / 2);
    assert!(events.iter().any(|e| e.contains("slot 2") && e.contains(&expected)), "{events:#?}");
    daemon.stop();

    // The file grows back: the slot stays failed (it missed nothing yet, but nothing says so).
    std::fs::OpenOptions::new().write(true).open(&drives[2]).unwrap().set_len(DRIVE_BYTES).unwrap();
    let daemon = Daemon::start(&scratch, &drives);
    check_degraded_with_data(&daemon, 2, "Failed", size_bytes);
    daemon.stop();
}
