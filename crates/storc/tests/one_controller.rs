//! One controller per data directory, and a start that cannot run touches nothing: a second
//! `storc serve` on a data directory in use, or one whose TCP port is taken, exits before it
//! opens a drive. Before, both got as far as assembling the VDs (the second daemon replayed
//! the journal and started a resync on the first one's drives, then wrote a clean stop into
//! their metadata on its way out) and only then found the socket or the port in use.

mod common;

use common::{serve_refused_on, Daemon, Scratch};

/// Regression: a second daemon on the same data directory logged "controller started" and
/// "controller stopped cleanly" into the first one's event log and metadata before it exited.
#[test]
fn a_second_serve_on_a_data_directory_in_use_is_refused_and_changes_nothing() {
    let scratch = Scratch::new("one-controller-dir");
    let daemon = Daemon::start(&scratch, &[]);
    let events_path = scratch.data_dir().join("events.log");
    let events_before = std::fs::read_to_string(&events_path).expect("the first daemon's event log");
    let controller_before = daemon.cli(&["/c0", "show"]);

    let text = serve_refused_on(&scratch.data_dir(), &[], 1);
    let expected = format!(
        "--data-dir {} is in use by another storc serve (pid {} holds {})",
        scratch.data_dir().display(),
        daemon.pid(),
        scratch.data_dir().join("serve.lock").display()
    );
    assert!(text.contains(&expected), "the refusal should name the directory, the pid and the lock:\n{text}");
    assert!(text.contains("one controller per data directory"), "{text}");

    let events_after = std::fs::read_to_string(&events_path).expect("the event log");
    assert_eq!(events_after, events_before, "the refused daemon wrote events");
    assert_eq!(daemon.cli(&["/c0", "show"]), controller_before, "the refused daemon changed the controller");
    daemon.stop();
    // The lock goes with its holder: the directory is free again.
    Daemon::start(&scratch, &[]).stop();
}

#[test]
fn a_taken_port_stops_a_start_before_any_drive_is_created_or_opened() {
    let scratch = Scratch::new("one-controller-port");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let address = taken.local_addr().expect("its address").to_string();
    for (flag, what) in [("--nbd-listen", "NBD"), ("--api-listen", "API")] {
        // No --drive: the embedded default, whose eight drive files a first start creates.
        let text = serve_refused_on(&scratch.data_dir(), &[flag, &address], 1);
        assert!(text.contains(&format!("storc: {what} on {address}: Address already in use")), "{flag}:\n{text}");
        let created: Vec<String> = std::fs::read_dir(scratch.data_dir())
            .expect("the data directory")
            .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
            .filter(|name| name != "serve.lock")
            .collect();
        assert!(created.is_empty(), "{flag}: a start refused for its port created {created:?}");
    }
    drop(taken);
}

/// A drive belongs to one controller: a second daemon, on its own data directory, given the
/// drives of a running one is refused whether it starts for the first time or not (later, a
/// drive that does not open is otherwise left out as a dead disk and the VDs assembled without
/// it), and the first one's drives and events are left alone.
#[test]
fn the_drives_of_a_running_controller_are_refused_to_a_second_one() {
    let scratch = Scratch::new("one-controller-drives");
    let drives: Vec<String> = (0..3).map(|i| scratch.sparse_file(&format!("d{i}.img"), 256 << 20).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    daemon.cli(&["/c0", "add", "vd", "r5", "drives=0-2", "name=v"]);
    let events_path = scratch.data_dir().join("events.log");
    let events_before = std::fs::read_to_string(&events_path).expect("the first daemon's event log");
    let second_dir = scratch.join("second");
    let mut args: Vec<&str> = drives.iter().flat_map(|drive| ["--drive", drive.as_str()]).collect();
    args.extend(["--nbd-listen", "none"]);
    for start in ["first start", "later start"] {
        let text = serve_refused_on(&second_dir, &args, 1);
        let expected = format!("drive {}: in use by another process", drives[0]);
        assert!(text.contains(&expected) && text.contains("a drive belongs to one controller"), "{start}:\n{text}");
        // Its own controller id from now on: a start that is not the first.
        std::fs::copy(scratch.data_dir().join("controller.id"), second_dir.join("controller.id")).expect("copy the controller id");
    }
    assert_eq!(std::fs::read_to_string(&events_path).expect("the event log"), events_before, "the refused daemon wrote events");
    assert!(daemon.cli(&["/c0/v0", "show"]).contains("Optl"), "the first daemon's VD is no longer optimal");
    daemon.stop();
}

/// A member given again as the journal (or twice as a member) is refused by name before
/// anything is created: a journal laid out on a member erases the VD data on it.
#[test]
fn a_drive_given_again_as_the_journal_is_refused_before_anything_is_created() {
    let scratch = Scratch::new("one-controller-twice");
    let drive = scratch.sparse_file("d0.img", 64 << 20).display().to_string();
    let data_dir = scratch.join("data");
    let text = serve_refused_on(&data_dir, &["--drive", &drive, "--journal", &drive, "--nbd-listen", "none"], 1);
    assert!(text.contains(&format!("storc: --drive {drive} and --journal {drive} are the same file or device")), "{text}");
    assert!(!data_dir.exists(), "a refused start created {}", data_dir.display());
    // At run time too, by name and at once (not after waiting for the daemon's own claim).
    let daemon = Daemon::start(&scratch, std::slice::from_ref(&drive));
    let started = std::time::Instant::now();
    let (status, text) = daemon.cli_output(&["/c0", "set", &format!("journal={drive}")]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains(&format!("the drive {drive} and journal={drive} are the same file or device")), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "refused only after {:?}", started.elapsed());
    daemon.stop();
}

/// Regression: a bad --cache-size, --read-ahead, --journal count or spec was found only after
/// the embedded default's eight drive files and the API token had been created.
#[test]
fn bad_flags_are_refused_before_anything_is_created() {
    let scratch = Scratch::new("one-controller-flags");
    let data_dir = scratch.join("data");
    let cases: [(&[&str], &str); 5] = [
        (&["--cache-size", "bogus"], "storc: --cache-size bogus: "),
        (&["--read-ahead", "1GiB"], "storc: --read-ahead 1GiB: from 4KiB up to a sixteenth of --cache-size"),
        (&["--journal", "a", "--journal", "b", "--journal", "c"], "storc: --journal is given 3 times"),
        (&["--journal", "ssd:bogus"], "storc: --journal ssd:bogus: emulated drive"),
        (&["--drive", "hdd:99k:1GiB"], "storc: --drive hdd:99k:1GiB: emulated drive \"hdd:99k:1GiB\": unknown hdd speed"),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().copied().chain(["--nbd-listen", "none"]).collect();
        let text = serve_refused_on(&data_dir, &args, 1);
        assert!(text.contains(expected), "{args:?}:\n{text}");
        assert!(!data_dir.exists(), "{args:?}: a refused start created {}", data_dir.display());
    }
}
