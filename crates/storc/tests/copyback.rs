//! Copyback and proactive replacement against the real daemon: a RAID5 of eight file drives and a
//! global spare, filled with a random image by nbdcopy. A member set offline is rebuilt onto the
//! spare; the daemon stops, the offline member's file is replaced by a fresh empty one, and at
//! the next start the spare copies back to it and returns to the global spares; the image reads
//! back whole, and again with another member taken out (which proves the copied member's
//! contents). A proactive replacement killed with -9 resumes from its checkpoint. The storcli
//! commands (`J` JSON included) say what is allowed when the input is wrong, and change nothing.

mod common;

use common::api_types::{CopybackView, DriveView, EventView};
use common::{busy_reader, export_difference, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use nbd::{Client, ClientConfig, NbdUri};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 128 * MIB;
const SPARE_SLOT: u32 = 8;
const COPY_TIMEOUT: Duration = Duration::from_secs(120);

struct Array {
    scratch: Scratch,
    drives: Vec<String>,
    image: std::path::PathBuf,
    size_bytes: u64,
}

/// Eight members and a global spare, a RAID5 `db` holding a random image; the daemon running.
fn raid5_with_a_spare(name: &str) -> (Array, Daemon) {
    let scratch = Scratch::new(name);
    let drives: Vec<String> =
        (0..=SPARE_SLOT).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &(0..8).collect::<Vec<_>>(), "db");
    daemon.cli(&["/c0/s8", "add", "hotsparedrive"]);
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 23);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    (Array { scratch, drives, image, size_bytes: vd.size_bytes }, daemon)
}

fn drive_state(daemon: &Daemon, slot: u32) -> String {
    daemon.get::<DriveView>(&format!("/api/v1/drives/{slot}")).state
}

fn assert_image(array: &Array, daemon: &Daemon, when: &str) {
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), &array.image, array.size_bytes) {
        panic!("{when}: {difference}");
    }
}

fn wait_for_state(daemon: &Daemon, slot: u32, state: &str) {
    let deadline = Instant::now() + COPY_TIMEOUT;
    while drive_state(daemon, slot) != state {
        let copies = daemon.get::<Vec<CopybackView>>("/api/v1/copybacks");
        assert!(Instant::now() < deadline, "slot {slot} never became {state} in {COPY_TIMEOUT:?}; copies: {copies:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn events(daemon: &Daemon) -> Vec<String> {
    daemon.get::<Vec<EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect()
}

#[test]
fn the_spare_copies_back_to_a_replaced_drive_file_and_returns_to_the_global_spares() {
    let (array, daemon) = raid5_with_a_spare("copyback");
    daemon.cli(&["/c0/s3", "set", "offline"]);
    wait_for_state(&daemon, SPARE_SLOT, "Onln");
    assert_eq!(drive_state(&daemon, 3), "UGood");
    daemon.stop();

    // The offline member's disk is swapped for a new, empty one.
    std::fs::remove_file(&array.drives[3]).unwrap();
    array.scratch.sparse_file("d3.img", DRIVE_BYTES);
    let daemon = Daemon::start(&array.scratch, &array.drives);
    let shown = daemon.cli(&["/c0/s3", "show", "copyback"]);
    let started = events(&daemon).iter().any(|e| e.starts_with("slot 3: UGood -> Cpybck (copyback started"));
    assert!(started, "the copyback starts at once: {:#?}", events(&daemon));
    assert!(shown.contains("/c0/s8") || drive_state(&daemon, 3) == "Onln", "{shown}");
    assert_image(&array, &daemon, "during the copyback");
    wait_for_state(&daemon, 3, "Onln");
    wait_for_state(&daemon, SPARE_SLOT, "GHS");
    assert_eq!(daemon.vd_named("db").member_slots[3], 3);
    assert_eq!(daemon.vd_named("db").state, "Optl");
    assert_image(&array, &daemon, "after the copyback");

    // The copied member holds its share: take another member out, with no spare stepping in.
    daemon.cli(&["/c0", "set", "autorebuild=off"]);
    daemon.cli(&["/c0/s5", "set", "offline"]);
    assert_eq!(daemon.vd_named("db").state, "Dgrd");
    assert_image(&array, &daemon, "after the copyback, with slot 5 offline");
    let log = events(&daemon);
    assert!(log.iter().any(|e| e.starts_with("copyback of slot 8 to slot 3 (v0) done")), "{log:#?}");
    assert!(log.iter().any(|e| e.starts_with("slot 8: Onln -> HSP (copyback done")), "{log:#?}");
    daemon.stop();
}

/// `/c0/sN start copyback target=M` (md's want_replacement), killed with -9 halfway: the next
/// start resumes from the checkpoint; killed again after a client write below the checkpoint, it
/// resumes below that write; the copy completes, the old member is UGood, and the image reads
/// back with another member out.
#[test]
fn a_proactive_replacement_killed_with_the_daemon_resumes_from_its_checkpoint() {
    let (array, daemon) = raid5_with_a_spare("copyback-kill");
    // A clean stop leaves the write-intent bitmap empty: after the kill, no write of the fill
    // can have been in flight, and the copy resumes at its checkpoint (not below dirty regions).
    daemon.stop();
    let daemon = Daemon::start(&array.scratch, &array.drives);
    daemon.cli(&["/c0", "set", "rebuildrate=5"]);
    let (stop, reader) = busy_reader(&daemon, "db", array.size_bytes);
    let started = daemon.cli(&["/c0/s2", "start", "copyback", "target=8", "J"]);
    let answer: serde_json::Value = serde_json::from_str(&started).expect("J prints JSON");
    let data = &answer["Controllers"][0]["Response Data"];
    assert_eq!((data["slot"].as_u64(), data["source_slot"].as_u64()), (Some(8), Some(2)), "{answer}");
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Cpybck");
    let deadline = Instant::now() + COPY_TIMEOUT;
    // A checkpoint is written every 1/16 of the VD and every 5 s.
    while daemon.get::<Vec<CopybackView>>("/api/v1/copybacks").first().map_or(0.0, |c| c.progress_percent) < 8.0 {
        assert!(Instant::now() < deadline, "the copy makes no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    let _ = reader.join();

    let daemon = Daemon::start(&array.scratch, &array.drives);
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Cpybck", "still copying after the restart");
    let resumed = events(&daemon).into_iter().rev().find(|e| e.starts_with("copyback of slot 2 to slot 8 (v0) resumes at row "));
    let resumed = resumed.expect("a resume event");
    let row: u64 = resumed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(row > 0, "progress > 0 at the restart: {resumed}");

    // Killed again right after a client rewrote the first MiB (the same bytes): that write may
    // have reached the member and not the target, so the copy resumes below it, at row 0.
    let (stop, reader) = busy_reader(&daemon, "db", array.size_bytes); // the copy stays at 5%
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: "db".into() };
    let mut client = Client::connect(&uri, &ClientConfig { structured_replies: true }).expect("connect the writer");
    let first_mib = std::fs::read(&array.image).unwrap()[..MIB as usize].to_vec();
    client.write(0, &first_mib, true).expect("rewrite the first MiB");
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Cpybck", "killed while still copying");
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    let _ = reader.join();
    let daemon = Daemon::start(&array.scratch, &array.drives);
    let log = events(&daemon);
    let lowered = "copyback of slot 2 to slot 8: checkpoint at row ";
    let unclean = log.iter().rev().find(|e| e.starts_with(lowered)).unwrap_or_else(|| panic!("no event {lowered:?}: {log:#?}"));
    assert!(unclean.ends_with("v0 stopped uncleanly with writes in flight from row 0, which are copied again"), "{unclean}");
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Cpybck");
    daemon.cli(&["/c0", "set", "rebuildrate=100"]);
    wait_for_state(&daemon, SPARE_SLOT, "Onln");
    assert_eq!(drive_state(&daemon, 2), "UGood");
    assert_image(&array, &daemon, "after the resumed replacement");
    daemon.cli(&["/c0", "set", "autorebuild=off"]);
    // kill -9 with writes in flight: the dirty regions are resynced first; until then a read
    // through their parity would fail (EIO) rather than trust it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while daemon.vd_named("db").resync.is_some() {
        assert!(std::time::Instant::now() < deadline, "the resync after kill -9 never finished");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    daemon.cli(&["/c0/s6", "set", "offline"]);
    assert_image(&array, &daemon, "after the resumed replacement, with slot 6 offline");
    daemon.stop();
}

/// The copyback commands in storcli's syntax, text and `J`: settings shown and changed, a
/// table for `show copyback`, and bad input refused with what is allowed, nothing changed.
#[test]
fn copyback_commands_say_what_is_allowed_and_bad_input_changes_nothing() {
    let scratch = Scratch::new("copyback-cli");
    let drives: Vec<String> = (0..6).map(|i| scratch.sparse_file(&format!("d{i}.img"), 64 * MIB).display().to_string()).collect();
    let small = scratch.sparse_file("small.img", 16 * MIB).display().to_string();
    let drives: Vec<String> = drives.into_iter().chain([small]).collect();
    let daemon = Daemon::start(&scratch, &drives);
    daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    let shown = daemon.cli(&["/c0", "show", "all"]);
    assert!(shown.contains("Copyback") && shown.contains("On"), "{shown}");
    let set = daemon.cli(&["/c0", "set", "copyback=off", "J"]);
    assert!(set.contains("\"copyback\": false"), "{set}");
    assert!(!daemon.controller().copyback);
    daemon.cli(&["/c0", "set", "copyback=on"]);

    let generation = daemon.controller().generation;
    let refused = |args: &[&str], status: i32, expected: &str| {
        let (code, text) = daemon.cli_output(args);
        assert_eq!(code, status, "storc {args:?}: {text}");
        assert!(text.contains(expected), "storc {args:?}: {text}");
        assert_eq!(daemon.controller().generation, generation, "storc {args:?} changed nothing");
        assert_eq!(drive_state(&daemon, 4), "UGood");
    };
    let allowed = "a copy goes to an unconfigured good drive (UGood) or a hot spare that serves drive group 0";
    refused(&["/c0/s0", "start", "copyback", "target=1"], 1, &format!("slot 1 is Onln (a member of v0); {allowed}"));
    refused(&["/c0/s0", "start", "copyback", "target=6"], 1, "slot 6 has 16777216 bytes; v0 needs 67108864 bytes per member");
    refused(&["/c0/s4", "start", "copyback", "target=5"], 1, "slot 4 is UGood, in no VD; only an online member (Onln) can be copied");
    refused(&["/c0/s0", "start", "copyback", "target=0"], 1, "slot 0 cannot be copied onto itself");
    refused(&["/c0/s0", "start", "copyback"], 2, "start copyback needs target=M");
    refused(&["/c0/s0", "stop", "copyback"], 1, "slot 0 has no copyback; none has one");
    refused(&["/c0", "set", "rebuildrate=101"], 2, "rebuildrate=\"101\" is not allowed; allowed: 0 to 100 (percent)");
    refused(&["/c0", "set", "copyback=maybe"], 2, "copyback=\"maybe\" is not allowed; allowed: on, off");
    let (code, json) = daemon.cli_output(&["/c0/s0", "start", "copyback", "target=1", "J"]);
    assert_eq!(code, 1);
    let answer: serde_json::Value = serde_json::from_str(&json).expect("J prints JSON");
    assert_eq!(answer["Controllers"][0]["Command Status"]["Status"], "Failure", "{answer}");

    let none = daemon.cli(&["/c0/sall", "show", "copyback"]);
    assert!(none.contains("No copyback in progress."), "{none}");
    daemon.cli(&["/c0/s1", "start", "copyback", "target=4"]);
    let table = daemon.cli(&["/c0/s4", "show", "copyback"]);
    assert!(table.contains("Progress%") && table.contains("Estimated Time Left"), "{table}");
    assert!((table.contains("/c0/s4") && table.contains("/c0/s1")) || drive_state(&daemon, 4) == "Onln", "{table}");
    wait_for_state(&daemon, 4, "Onln");
    assert_eq!(drive_state(&daemon, 1), "UGood");
    daemon.stop();
}
