//! Hot-spare takeover and rebuild against the real daemon: a RAID5 of eight file drives and a
//! global spare, filled with a random image by nbdcopy. A member set offline is replaced by the
//! spare at once, the VD serves the image throughout, and after the rebuild a *different* member
//! set offline still leaves every byte right (which proves the rebuilt member's contents). With
//! kill -9 during the rebuild, the restarted daemon resumes it from its checkpoint.

mod common;

use common::api_types::{RebuildView, SetController};
use common::{busy_reader, export_difference, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 128 * MIB;
const SPARE_SLOT: u32 = 8;
const REBUILD_TIMEOUT: Duration = Duration::from_secs(120);

struct Array {
    scratch: Scratch,
    drives: Vec<String>,
    image: std::path::PathBuf,
    size_bytes: u64,
}

/// Eight members and a spare, a RAID5 `db` holding a random image; the daemon still running.
fn raid5_with_a_spare(name: &str) -> (Array, Daemon) {
    let scratch = Scratch::new(name);
    let drives: Vec<String> =
        (0..=SPARE_SLOT).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &(0..8).collect::<Vec<_>>(), "db");
    let spare = serde_json::json!({ "drive_groups": [] });
    daemon.api("POST", &format!("/api/v1/drives/{SPARE_SLOT}/hotspare"), Some(&spare)).expect::<serde_json::Value>(200, "add the spare");
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 17);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    (Array { scratch, drives, image, size_bytes: vd.size_bytes }, daemon)
}

fn drive_state(daemon: &Daemon, slot: u32) -> String {
    daemon.get::<common::api_types::DriveView>(&format!("/api/v1/drives/{slot}")).state
}

fn set_drive(daemon: &Daemon, slot: u32, state: &str) {
    let body = serde_json::json!({ "state": state });
    daemon.api("POST", &format!("/api/v1/drives/{slot}/state"), Some(&body)).expect::<serde_json::Value>(200, &format!("set {state}"));
}

fn set_rate(daemon: &Daemon, rebuild_rate_percent: u8) {
    let body = SetController { rebuild_rate_percent: Some(rebuild_rate_percent), ..SetController::default() };
    daemon.api("PATCH", "/api/v1/controller", Some(&body)).expect::<serde_json::Value>(200, "set the rebuild rate");
}

fn assert_image(array: &Array, daemon: &Daemon, when: &str) {
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), &array.image, array.size_bytes) {
        panic!("{when}: {difference}");
    }
}

fn wait_until_online(daemon: &Daemon, slot: u32) {
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    while drive_state(daemon, slot) != "Onln" {
        assert!(
            Instant::now() < deadline,
            "slot {slot} was not rebuilt in {REBUILD_TIMEOUT:?}: {:?}",
            daemon.get::<Vec<RebuildView>>("/api/v1/rebuilds")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_spare_takes_over_and_its_rebuilt_contents_hold_the_data_alone() {
    let (array, daemon) = raid5_with_a_spare("rebuild");
    // The takeover is part of the command: the spare is rebuilding by the time it returns, not
    // after some later scan. (No bound on the command's time: it writes the metadata of nine
    // drives, which a loaded host may take over a second to flush.)
    set_drive(&daemon, 3, "offline");
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Rbld", "the spare is rebuilding once `set offline` returns");
    assert_image(&array, &daemon, "while the spare is rebuilt");
    wait_until_online(&daemon, SPARE_SLOT);
    assert_eq!(daemon.vd_named("db").state, "Optl");
    assert_image(&array, &daemon, "after the rebuild");

    set_drive(&daemon, 5, "offline");
    assert_eq!(daemon.vd_named("db").state, "Dgrd", "no spare left");
    assert_image(&array, &daemon, "after the rebuild with slot 5 offline");

    // The drive replaced first (slot 3, now UGood) takes slot 5's place by hand, through the CLI.
    assert_eq!(drive_state(&daemon, 3), "UGood");
    let insert = daemon.cli(&["/c0/s3", "insert", "dg=0", "array=0", "row=5"]);
    assert!(insert.contains("Insert Drive Succeeded"), "{insert}");
    let shown = daemon.cli(&["/c0/s3", "show", "rebuild"]);
    assert!(shown.contains("/c0/s3") || drive_state(&daemon, 3) == "Onln", "{shown}");
    wait_until_online(&daemon, 3);
    set_drive(&daemon, 7, "offline");
    assert_image(&array, &daemon, "after slot 3 replaced slot 5, with slot 7 offline");
    daemon.stop();
    drop(array.scratch);
}

#[test]
fn a_rebuild_killed_with_the_daemon_resumes_from_its_checkpoint() {
    let (array, daemon) = raid5_with_a_spare("rebuild-kill");
    // Slow: clients busy and a low rate, so that kill -9 lands well inside the rebuild.
    set_rate(&daemon, 5);
    let (stop, reader) = busy_reader(&daemon, "db", array.size_bytes);
    set_drive(&daemon, 3, "offline");
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    // A checkpoint is written every 1/16 of the VD and every 5 s.
    while daemon.get::<Vec<RebuildView>>("/api/v1/rebuilds").first().map_or(0.0, |r| r.progress_percent) < 8.0 {
        assert!(Instant::now() < deadline, "the rebuild makes no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    let _ = reader.join();

    let daemon = Daemon::start(&array.scratch, &array.drives);
    assert_eq!(drive_state(&daemon, SPARE_SLOT), "Rbld", "still being rebuilt after the restart");
    let events: Vec<String> =
        daemon.get::<Vec<common::api_types::EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect();
    let resumed = events.iter().rev().find(|e| e.starts_with("rebuild of slot 8 (v0) resumes at row ")).expect("a resume event");
    let row: u64 = resumed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(row > 0, "progress > 0 at the restart: {resumed}");
    set_rate(&daemon, 100);
    wait_until_online(&daemon, SPARE_SLOT);
    assert_image(&array, &daemon, "after the resumed rebuild");
    set_drive(&daemon, 6, "offline");
    assert_image(&array, &daemon, "after the resumed rebuild with slot 6 offline");
    daemon.stop();
}
