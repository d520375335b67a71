//! NBD connections live no longer than the VD they were opened on (issue 8, part 3): deleting a
//! VD ends its connections before another VD can use its drives, and a rename keeps them on the
//! same VD, which honours member state changes. A migration keeps them across the switch to the
//! drive it names, which the daemon adds and opens again at every start.

mod common;

use common::{assert_export_starts_with, mem_drives, nbdcopy_in, write_random_image, Daemon, Scratch};
use nbd::{Client, ClientConfig, NbdUri};
use std::time::{Duration, Instant};

fn client(daemon: &Daemon, export: &str) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: export.to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("NBD connect to {export}: {e}"))
}

fn block(seed: u8) -> Vec<u8> {
    (0..64 << 10).map(|i: usize| (i as u8).wrapping_mul(3).wrapping_add(seed)).collect()
}

/// Regression: after `del force` a connected client kept reading and writing, and once a new VD
/// was created on the same drives it overwrote that VD's data and could read it.
#[test]
fn a_deleted_vds_connections_end_and_never_reach_the_vd_that_reuses_its_drives() {
    let scratch = Scratch::new("vd-lifetime-delete");
    let daemon = Daemon::start(&scratch, &mem_drives(3, "256MiB"));
    daemon.create_vd("r5", &[0, 1, 2], "old");
    let mut old = client(&daemon, "old");
    old.write(0, &block(1), false).unwrap();

    daemon.api("DELETE", "/api/v1/vds/0?force=true", None::<&()>).expect::<serde_json::Value>(200, "del force");
    let refused_within = Instant::now() + Duration::from_secs(5);
    while old.read(0, 4096).is_ok() {
        assert!(Instant::now() < refused_within, "the deleted VD's connection still reads");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.create_vd("r5", &[0, 1, 2], "new");
    let mut new = client(&daemon, "new");
    new.write(0, &block(2), false).unwrap();
    new.flush().unwrap();

    assert!(old.write(0, &block(3), false).is_err(), "the old connection cannot write the new VD");
    assert!(old.read(0, 4096).is_err(), "nor read it");
    assert_eq!(new.read(0, 64 << 10).unwrap(), block(2), "the new VD's data is its own");
    daemon.stop();
}

/// Regression: a rename rebuilt the VD, so an old connection kept writing to a member that was
/// set offline afterwards (and would have served its stale data).
#[test]
fn a_renamed_vds_connections_stay_and_follow_member_state_changes() {
    let scratch = Scratch::new("vd-lifetime-rename");
    let daemon = Daemon::start(&scratch, &mem_drives(3, "256MiB"));
    daemon.create_vd("r5", &[0, 1, 2], "before");
    let mut held = client(&daemon, "before");
    held.write(0, &block(4), false).unwrap();

    let rename = serde_json::json!({ "name": "after" });
    daemon.api("PATCH", "/api/v1/vds/0", Some(&rename)).expect::<serde_json::Value>(200, "rename");
    assert_eq!(held.read(0, 64 << 10).unwrap(), block(4), "the connection survives the rename");
    daemon
        .api("POST", "/api/v1/drives/1/state", Some(&serde_json::json!({ "state": "offline" })))
        .expect::<serde_json::Value>(200, "offline");
    assert_eq!(daemon.vd_named("after").state, "Dgrd");
    held.write(0, &block(5), false).unwrap();
    held.flush().unwrap();
    // Bringing the member back is a re-add: the held connection's write skipped it, so it is
    // resynced first, while the connection keeps working.
    daemon
        .api("POST", "/api/v1/drives/1/state", Some(&serde_json::json!({ "state": "online" })))
        .expect::<serde_json::Value>(200, "online (re-add)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while daemon.vd_named("after").state != "Optl" {
        assert!(std::time::Instant::now() < deadline, "the re-add never finished");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(held.read(0, 64 << 10).unwrap(), block(5));
    let mut fresh = client(&daemon, "after");
    assert_eq!(fresh.read(0, 64 << 10).unwrap(), block(5));
    daemon.stop();
}

/// `start migrate target=/PATH`: the daemon creates the file (in its data directory, the only
/// place it creates one) at the size the VD needs, adds it,
/// and the connection held across the switch goes on; the VD lives on the file after a restart
/// whose `--drive` list does not name it (its three memory drives come back blank). Targets that
/// would not keep the VD are refused with what is allowed, and add nothing.
#[test]
fn a_vd_moved_onto_a_file_named_by_path_keeps_its_connection_and_is_found_after_a_restart() {
    let scratch = Scratch::new("vd-lifetime-migrate");
    let drives = mem_drives(3, "64MiB");
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &[0, 1, 2], "moving");
    let mut held = client(&daemon, "moving");
    held.write(0, &block(7), false).unwrap();

    let outside = scratch.join("not-in-the-data-dir.img").display().to_string();
    let targets = [
        ("mem:1GiB", "comes back blank"),
        ("relative.img", "absolute path"),
        ("nbd://127.0.0.1/x", "--drive"),
        (outside.as_str(), "only in its data directory"),
        (drives[0].as_str(), "slot 0 is Onln; the target must be UGood"),
    ];
    for (target, expected) in targets {
        let (status, text) = daemon.cli_output(&["/c0/v0", "start", "migrate", &format!("target={target}")]);
        assert!(status != 0 && text.contains(expected), "target={target}: {status} {text}");
    }
    assert_eq!(daemon.controller().drives.len(), 3, "a refused target adds no drive");

    let file = daemon.data_dir().join("moved-v0.img");
    let shown = daemon.cli(&["/c0/v0", "start", "migrate", &format!("target={}", file.display())]);
    assert!(shown.contains("/c0/s3"), "{shown}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.vd_named("moving").level != "JBOD" {
        assert!(Instant::now() < deadline, "the migration did not end: {}", daemon.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::metadata(&file).unwrap().len(), (4 << 20) + vd.size_bytes, "created at the size the VD needs");
    assert_eq!(held.read(0, 64 << 10).unwrap(), block(7), "the held connection reads across the switch");
    held.write(64 << 10, &block(8), false).unwrap();
    held.flush().unwrap();
    drop(held);
    daemon.stop();

    let daemon = Daemon::start(&scratch, &drives);
    let moved = daemon.vd_named("moving");
    assert_eq!((moved.level.as_str(), moved.member_slots.clone(), moved.size_bytes), ("JBOD", vec![3], vd.size_bytes));
    let mut fresh = client(&daemon, "moving");
    assert_eq!(fresh.read(0, 64 << 10).unwrap(), block(7));
    assert_eq!(fresh.read(64 << 10, 64 << 10).unwrap(), block(8));
    daemon.stop();
}

/// A migration that a clean stop (SIGTERM) cuts resumes at its checkpoint at the next start, and
/// the VD it lands on holds what was written before. Its copy is slowed down (rebuild rate 0 %
/// while a client keeps reading) and paused, so that the stop finds it part of the way through.
#[test]
fn a_migration_cut_by_a_clean_stop_resumes_where_it_was_after_the_restart() {
    let scratch = Scratch::new("vd-lifetime-migrate-resume");
    let drives: Vec<String> = (0..3).map(|i| scratch.sparse_file(&format!("m{i}.img"), 128 << 20).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &[0, 1, 2], "moving");
    let image = scratch.join("image.bin");
    write_random_image(&image, vd.size_bytes, 11);
    nbdcopy_in(&image, &daemon.unix_uri("moving"));
    daemon.cli(&["/c0", "set", "rebuildrate=0"]);
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (busy, mut held) = (std::sync::Arc::clone(&busy), client(&daemon, "moving"));
        std::thread::spawn(move || {
            while busy.load(std::sync::atomic::Ordering::SeqCst) {
                held.read(0, 4096).expect("the busy client's read");
            }
        })
    };
    // An existing empty file outside the data directory (as `truncate -s` makes one).
    let file = scratch.sparse_file("moved.img", vd.size_bytes + (4 << 20));
    daemon.cli(&["/c0/v0", "start", "migrate", &format!("target={}", file.display())]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let shown: Vec<serde_json::Value> = daemon.get("/api/v1/migrations");
        let percent = shown.first().and_then(|m| m["progress_percent"].as_f64()).unwrap_or(0.0);
        if percent > 0.0 {
            assert!(percent < 100.0, "the copy ran to its end before it could be cut");
            break;
        }
        assert!(Instant::now() < deadline, "the copy never moved: {}", daemon.log_tail());
        std::thread::sleep(Duration::from_millis(5));
    }
    daemon.cli(&["/c0/v0", "pause", "migrate"]);
    busy.store(false, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
    daemon.stop();

    let daemon = Daemon::start(&scratch, &drives);
    let events: Vec<serde_json::Value> = daemon.get("/api/v1/events");
    let said: Vec<&str> = events.iter().filter_map(|e| e["description"].as_str()).collect();
    let resumed = said.iter().find(|e| e.contains("starts again at row")).unwrap_or_else(|| panic!("{said:#?}"));
    assert!(!resumed.contains("starts again at row 0,"), "{resumed}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.vd_named("moving").level != "JBOD" {
        assert!(Instant::now() < deadline, "the resumed migration did not end: {}", daemon.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_export_starts_with(&daemon.unix_uri("moving"), &image, vd.size_bytes);
    println!("{resumed}");
    daemon.stop();
}
