//! The write-intent bitmap against the real daemon: a member taken offline while 5% of the VD is
//! written comes back through a resync of the dirty regions only (the event prints the bytes),
//! and after kill -9 in the middle of writes the restarted daemon resynces the dirty regions
//! and says so in `/c0/v0 show` until it is done.

mod common;

use common::api_types::{EventView, VdView};
use common::{export_difference, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 256 * MIB;
const TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of each member one bitmap region covers (engine::bitmap::REGION_BYTES_MIN).
const REGION_BYTES: u64 = 64 * MIB;

fn set_drive(daemon: &Daemon, slot: u32, state: &str) {
    let body = serde_json::json!({ "state": state });
    daemon.api("POST", &format!("/api/v1/drives/{slot}/state"), Some(&body)).expect::<serde_json::Value>(200, &format!("set {state}"));
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen in {TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn events(daemon: &Daemon) -> Vec<String> {
    daemon.get::<Vec<EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect()
}

/// Overwrites `[0, len)` of the export and of the reference image with new random bytes.
fn overwrite_start(scratch: &Scratch, daemon: &Daemon, image: &std::path::Path, len_bytes: u64, seed: u64) {
    let patch = scratch.join(&format!("patch{seed}.raw"));
    write_random_image(&patch, len_bytes, seed);
    nbdcopy_in(&patch, &daemon.unix_uri("db"));
    let bytes = std::fs::read(&patch).unwrap();
    let mut reference = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    std::io::Write::write_all(&mut reference, &bytes).unwrap();
}

fn assert_image(daemon: &Daemon, image: &std::path::Path, size_bytes: u64, when: &str) {
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), image, size_bytes) {
        panic!("{when}: {difference}");
    }
}

fn raid5_of_eight(name: &str) -> (Scratch, Vec<String>, Daemon, VdView, std::path::PathBuf) {
    let scratch = Scratch::new(name);
    let drives: Vec<String> = (0..8).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &(0..8).collect::<Vec<_>>(), "db");
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 31);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    (scratch, drives, daemon, vd, image)
}

#[test]
fn a_member_back_from_offline_is_resynced_only_in_the_regions_written_meanwhile() {
    let (scratch, drives, daemon, vd, image) = raid5_of_eight("re-add");
    // A clean stop leaves no bit set, so only what is written from now on is dirty.
    daemon.stop();
    let daemon = Daemon::start(&scratch, &drives);
    set_drive(&daemon, 3, "offline");
    let written_bytes = (vd.size_bytes / 20) / MIB * MIB;
    overwrite_start(&scratch, &daemon, &image, written_bytes, 32);
    set_drive(&daemon, 3, "online");
    wait_for("slot 3 back online", || daemon.get::<common::api_types::DriveView>("/api/v1/drives/3").state == "Onln");
    let all = events(&daemon);
    let re_add = all.iter().find(|e| e.starts_with("re-add of slot 3 (v0)")).unwrap_or_else(|| panic!("{all:#?}"));
    let resynced_bytes: u64 = re_add.split(", ").find_map(|part| part.strip_suffix(" bytes resynced")).unwrap().parse().unwrap();
    // The written range covers this many regions of each member; a resync may redo at most
    // twice that, and a whole rebuild would write the whole member.
    let data_members = 7;
    let written_regions = (written_bytes / data_members).div_ceil(REGION_BYTES);
    let member_bytes = vd.size_bytes / data_members;
    println!(
        "re-add: {written_bytes} bytes written while out ({written_regions} region(s) of each member), {resynced_bytes} bytes resynced on the member, a whole rebuild would write {member_bytes}"
    );
    assert!(resynced_bytes <= 2 * written_regions * REGION_BYTES, "{re_add}");
    assert!(resynced_bytes < member_bytes, "less than a whole rebuild: {re_add}");
    set_drive(&daemon, 5, "offline");
    assert_image(&daemon, &image, vd.size_bytes, "after the re-add, with slot 5 offline");
    daemon.stop();
}

#[test]
fn after_kill_9_during_writes_the_dirty_regions_are_resynced() {
    let (scratch, drives, daemon, vd, image) = raid5_of_eight("unclean-stop");
    overwrite_start(&scratch, &daemon, &image, 8 * MIB, 33);
    daemon.kill9();
    let daemon = Daemon::start(&scratch, &drives);
    let all = events(&daemon);
    assert!(all.iter().any(|e| e.contains("v0 was not stopped cleanly")), "{all:#?}");
    wait_for("the resync", || daemon.vd_named("db").resync.is_none());
    let all = events(&daemon);
    assert!(all.iter().any(|e| e.starts_with("resync of v0 done")), "{all:#?}");
    let show = std::process::Command::new(env!("CARGO_BIN_EXE_storc"))
        .args(["--api", &daemon.api_socket().display().to_string(), "/c0/v0", "show", "all"])
        .output()
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("Resync") && show.contains("None"), "{show}");
    set_drive(&daemon, 2, "offline");
    assert_image(&daemon, &image, vd.size_bytes, "after the resync, with slot 2 offline");
    daemon.stop();
}
