//! Initialization against the real daemon, over member files that held random bytes before the
//! VD was created (a reused disk): background initialization runs while an NBD client writes
//! the whole VD, survives a kill -9 (it resumes from its checkpoint at the next start), and
//! leaves a VD in which `start cc` finds no inconsistent row and a member taken offline still
//! reads every byte right. `start init full` zeroes every row (the engine tests show it refuses clients meanwhile).

mod common;

use common::api_types::{BgiView, EventView, VdView};
use common::{export_difference, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 160 * MIB;
const TIMEOUT: Duration = Duration::from_secs(180);

fn wait_until(daemon: &Daemon, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened\n{}", daemon.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn events(daemon: &Daemon) -> Vec<String> {
    daemon.get::<Vec<EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect()
}

/// Member files full of old data.
fn used_members(scratch: &Scratch, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let path = scratch.join(&format!("d{i}.img"));
            write_random_image(&path, DRIVE_BYTES, 1000 + i as u64);
            path.display().to_string()
        })
        .collect()
}

/// `start cc` (report only) to its end; the numbers of its end event.
fn check_finds(daemon: &Daemon) -> String {
    let before = events(daemon).len();
    let started = daemon.cli(&["/c0/v0", "start", "cc", "report"]);
    assert!(started.contains("consistency check of v0 started"), "{started}");
    wait_until(daemon, "the consistency check", || events(daemon).iter().skip(before).any(|e| e.contains("done in")));
    events(daemon).into_iter().skip(before).find(|e| e.contains("done in")).unwrap()
}

#[test]
fn bgi_over_old_data_survives_a_crash_and_leaves_a_consistent_vd() {
    common::require_tool("nbdcopy", "libnbd-bin");
    let scratch = Scratch::new("bgi-raid5");
    let drives = used_members(&scratch, 4);
    let daemon = Daemon::start(&scratch, &drives);
    daemon.cli(&["/c0", "set", "bgirate=0"]);
    let vd = daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    // Held at once: alone it would be done before the client starts.
    let paused = daemon.cli(&["/c0/v0", "pause", "bgi"]);
    assert!(paused.contains("pause done"), "{paused}");
    assert!(events(&daemon).iter().any(|e| e.contains("its members held data; background initialization")));
    let listed = daemon.cli(&["/c0/vall", "show"]);
    let row: Vec<&str> = listed.lines().find(|line| line.starts_with("0/0 ")).expect("the VD's row").split_whitespace().collect();
    assert_eq!(row[3], "No", "Consist is No while BGI is pending:\n{listed}");

    // A client writes the whole VD while BGI moves a burst every half second (rate 0).
    daemon.cli(&["/c0/v0", "resume", "bgi"]);
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 41);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    let during = daemon.get::<Vec<BgiView>>("/api/v1/bgis");
    assert_eq!(during.len(), 1, "BGI still pending after the client's writes: {during:?}");
    assert!(during[0].status == "In progress" && during[0].regions_left > 0, "{during:?}");
    let shown = daemon.cli(&["/c0/v0", "show", "bgi"]);
    assert!(shown.contains("BGI") && shown.contains("In progress"), "{shown}");
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), &image, vd.size_bytes) {
        panic!("the client's writes during BGI: {difference}");
    }
    let refused = daemon.cli_output(&["/c0/v0", "start", "cc"]);
    assert!(refused.0 != 0 && refused.1.contains("to initialize"), "no check before BGI is done: {refused:?}");

    // A crash part way: the next start resumes BGI and finishes it.
    daemon.kill9();
    let daemon = Daemon::start(&scratch, &drives);
    wait_until(&daemon, "the end of BGI", || daemon.get::<Vec<BgiView>>("/api/v1/bgis").is_empty());
    let all = events(&daemon);
    assert!(all.iter().any(|e| e.contains("background initialization of v0 started")), "resumed after the crash: {all:#?}");
    assert!(all.iter().any(|e| e.contains("background initialization of v0 complete")), "{all:#?}");
    assert!(daemon.get::<Vec<VdView>>("/api/v1/vds")[0].consistent);

    let done = check_finds(&daemon);
    assert!(done.contains(" 0 inconsistent"), "no inconsistent row after BGI: {done}");
    daemon.cli(&["/c0/s2", "set", "offline"]);
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), &image, vd.size_bytes) {
        panic!("after BGI with slot 2 offline: {difference}");
    }
    daemon.stop();
}

#[test]
fn full_init_zeroes_every_row() {
    common::require_tool("nbdcopy", "libnbd-bin");
    let scratch = Scratch::new("init-full");
    let drives = used_members(&scratch, 3);
    let daemon = Daemon::start(&scratch, &drives);
    daemon.cli(&["/c0", "set", "bgirate=0"]);
    let vd = daemon.create_vd("r5", &[0, 1, 2], "db");
    let bad = daemon.cli_output(&["/c0/v0", "start", "init", "quick"]);
    assert!(bad.0 == 2 && bad.1.contains("start init takes: full, force"), "{bad:?}");

    let started = daemon.cli(&["/c0/v0", "start", "init", "full"]);
    assert!(started.contains("full initialization of v0 started"), "{started}");
    wait_until(&daemon, "the full init", || events(&daemon).iter().any(|e| e.contains("full initialization of v0 done")));
    assert!(daemon.get::<Vec<BgiView>>("/api/v1/bgis").is_empty(), "nothing left for BGI");
    let zeros = scratch.join("zeros.raw");
    std::fs::File::create(&zeros).unwrap().set_len(vd.size_bytes).unwrap();
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), &zeros, vd.size_bytes) {
        panic!("after a full init: {difference}");
    }
    let done = check_finds(&daemon);
    assert!(done.contains(" 0 inconsistent"), "{done}");
    daemon.stop();
}

/// Patrol read from the CLI against the daemon: started by hand, it reads every member and the
/// spare and ends with a summary event; `show patrolread` gives storcli's properties; turned
/// off, it refuses to start. (Medium errors and their repair: `engine/tests/patrol.rs`.)
#[test]
fn patrol_read_runs_from_the_cli() {
    let scratch = Scratch::new("patrol-cli");
    let drives: Vec<String> = (0..4).map(|i| scratch.sparse_file(&format!("d{i}.img"), 64 * MIB).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    daemon.create_vd("r5", &[0, 1, 2], "db");
    daemon.cli(&["/c0/s3", "add", "hotsparedrive"]);
    let shown = daemon.cli(&["/c0", "show", "patrolread"]);
    for expected in ["PR Mode = Auto", "PR Execution Delay = 168 hours", "PR on SSD = Disabled", "PR Current State = Stopped"] {
        assert!(shown.contains(expected), "{expected:?} missing in:\n{shown}");
    }
    let started = daemon.cli(&["/c0", "start", "patrolread"]);
    assert!(started.contains("patrol read: start done"), "{started}");
    wait_until(&daemon, "the patrol read", || events(&daemon).iter().any(|e| e.contains("patrol read done")));
    let all = events(&daemon);
    assert!(all.iter().any(|e| e.contains("patrol read started: 4 drive(s) (slots 0, 1, 2, 3)")), "{all:#?}");
    assert!(all.iter().any(|e| e.contains("4 of 4 drive(s)") && e.contains("0 medium error(s) found")), "{all:#?}");
    let shown = daemon.cli(&["/c0", "show", "patrolread"]);
    assert!(!shown.contains("PR Last Start time = Never"), "the start is recorded:\n{shown}");

    daemon.cli(&["/c0", "set", "patrolread=off"]);
    let refused = daemon.cli_output(&["/c0", "start", "patrolread"]);
    assert!(refused.0 == 1 && refused.1.contains("patrol read is off"), "{refused:?}");
    let bad = daemon.cli_output(&["/c0", "set", "patrolread", "delay=0"]);
    assert!(bad.0 == 2 && bad.1.contains("allowed: 1 to 65535"), "{bad:?}");
    daemon.stop();
}
