//! Thread limits, met for real in a pids cgroup (a systemd unit's `TasksMax`):
//! - The daemon sizes its NBD connection limit by the threads it may start, not only by its
//!   descriptors: a connection holds 17 threads by default. In a cgroup that leaves room for a
//!   few connections past the daemon's reserve, it says so at start, serves that many clients
//!   with all their readers, and refuses the next one at once, where without the budget it
//!   accepted connections whose threads the kernel then refused.
//! - A thread limit reached while the daemon runs is not a drive failure: io_uring hands back
//!   the flushes it cannot start a worker thread for (ECANCELED), and every member of the RAID5
//!   used to fail at once, taking the VD offline. They are retried until the limit is lifted.
//!
//! Makes cgroups, so it must run as root, under cgroup v1's pids hierarchy or cgroup v2 with
//! the pids controller available at its root.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::api_types::{DriveView, VdView};
use common::*;
use nbd::{Client, ClientConfig, NbdUri};

/// A pids cgroup made for one test, removed when dropped (once its processes are gone).
struct PidsCgroup {
    dir: PathBuf,
}

impl PidsCgroup {
    fn create(name: &str, pids_max: u64) -> PidsCgroup {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test makes a pids cgroup and must run as root (uid 0), not uid {euid}");
        let dir = pids_hierarchy().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        let cgroup = PidsCgroup { dir };
        write(&cgroup.dir.join("pids.max"), &pids_max.to_string());
        cgroup
    }

    fn set_max(&self, pids_max: u64) {
        write(&self.dir.join("pids.max"), &pids_max.to_string());
    }

    fn current(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("pids.current")).expect("read pids.current");
        text.trim().parse().unwrap_or_else(|_| panic!("pids.current is {text:?}"))
    }

    /// A command prefix that moves the command into this cgroup, then execs it in its place.
    fn command_prefix(&self) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs");
        vec!["sh".into(), "-c".into(), "echo $$ > \"$0\" && exec \"$@\"".into(), procs.display().to_string()]
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // A killed daemon's threads take a moment to leave.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("cannot remove the cgroup {}", self.dir.display());
    }
}

/// Where pids cgroups are made: cgroup v1's pids hierarchy, or the cgroup v2 root with the pids
/// controller enabled for its children.
fn pids_hierarchy() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let mounts: Vec<(&str, &str, &str)> = mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let mount_point = mount.split(' ').nth(4)?;
            let mut fs = fs.split(' ');
            Some((mount_point, fs.next()?, fs.nth(1).unwrap_or("")))
        })
        .collect();
    if let Some((mount_point, ..)) = mounts.iter().find(|(_, fs, options)| *fs == "cgroup" && options.split(',').any(|o| o == "pids")) {
        return PathBuf::from(mount_point);
    }
    let (mount_point, ..) = mounts
        .iter()
        .find(|(_, fs, _)| *fs == "cgroup2")
        .expect("no pids cgroup hierarchy: neither cgroup v1's pids nor cgroup v2 is mounted (see /proc/self/mountinfo)");
    let root = PathBuf::from(mount_point);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    assert!(controllers.split_whitespace().any(|c| c == "pids"), "cgroup v2 at {} has no pids controller", root.display());
    write(&root.join("cgroup.subtree_control"), "+pids");
    root
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {text:?} to {}: {e}", path.display()));
}

/// The connection limit the daemon printed at start.
fn connections_allowed(log: &str) -> usize {
    let line = log.lines().find(|line| line.starts_with("NBD bounds: ")).unwrap_or_else(|| panic!("no NBD bounds in the log:\n{log}"));
    line["NBD bounds: ".len()..].split(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("cannot read {line:?}"))
}

#[test]
fn a_pids_cgroup_lowers_the_connection_limit_to_the_threads_it_leaves() {
    // About 120 threads of room beside the ~10 of an idle daemon: half of it is kept for the
    // rest of the daemon, and the other half holds 3 connections of 17 threads (2 to 4,
    // depending on what runs at start).
    let pids_max = 130;
    let cgroup = PidsCgroup::create("storc-thread-budget", pids_max);
    let scratch = Scratch::new("thread-budget");
    let options = DaemonOptions { nbd_tcp: false, command_prefix: cgroup.command_prefix(), ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &[], &options);
    let log = daemon.log();
    let allowed = connections_allowed(&log);
    assert!((1..=4).contains(&allowed), "pids.max {pids_max} should leave room for 1 to 4 connections; the daemon allows {allowed}\n{log}");
    let lowered = format!("NBD connections lowered from 256 to {allowed}: a connection holds 17 threads");
    assert!(log.contains(&lowered), "no {lowered:?} in the log:\n{log}");
    assert!(log.contains(&format!("pids.max {pids_max}")), "the lowering names the cgroup's limit:\n{log}");

    let uri = NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: "v0".to_string() };
    let mut clients: Vec<Client> = (0..allowed)
        .map(|index| Client::connect(&uri, &ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("client {index}: {e}")))
        .collect();
    for (index, client) in clients.iter_mut().enumerate() {
        let offset = index as u64 * 4096;
        client.write(offset, &[index as u8 + 1; 4096], false).unwrap();
        assert_eq!(client.read(offset, 4096).unwrap(), vec![index as u8 + 1; 4096], "client {index} reads its write back");
    }
    assert!(Client::connect(&uri, &ClientConfig { structured_replies: true }).is_err(), "a connection past the limit is refused");
    let log = daemon.log();
    assert!(log.contains("refused a connection"), "the refusal is logged:\n{log}");
    assert!(!log.contains("fewer request readers"), "every allowed connection got all its readers:\n{log}");
    // Every client still works after the refusal.
    for client in &mut clients {
        client.read(0, 4096).unwrap();
    }
    drop(clients);
    daemon.stop();
}

fn client_of(daemon: &Daemon) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: "v0".to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).expect("NBD connect")
}

#[test]
fn a_thread_limit_reached_while_running_delays_flushes_and_fails_no_drive() {
    let cgroup = PidsCgroup::create("storc-thread-squeeze", 1000);
    let scratch = Scratch::new("thread-squeeze");
    let options = DaemonOptions { nbd_tcp: false, command_prefix: cgroup.command_prefix(), ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &[], &options);
    // Connected first, with a read, so that its threads exist. No write or flush has run
    // yet, so io_uring has no worker thread yet (once it has started one, it keeps the last
    // idle one for good, and queues work behind it when it cannot start more).
    let mut client = client_of(&daemon);
    assert_eq!(client.read(0, 4096).unwrap(), vec![0; 4096]);
    let squeezed_at = cgroup.current();
    cgroup.set_max(squeezed_at);
    let writer = std::thread::spawn(move || {
        let mut client = client;
        let started = Instant::now();
        client.write(0, &[1; 65536], false).expect("a write delayed by the thread limit still succeeds");
        client.flush().expect("a flush delayed by the thread limit still succeeds");
        (client, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(1500));
    cgroup.set_max(1000);
    let (mut client, flush_time) = writer.join().expect("the writer");
    client.write(65536, &[2; 65536], false).unwrap();
    client.flush().unwrap();
    let log = daemon.log();
    assert!(
        log.contains("io_uring handed operations back unexecuted"),
        "the squeeze to {squeezed_at} tasks did not reach io_uring's workers, so this test tested nothing:\n{log}"
    );
    assert!(flush_time >= Duration::from_millis(500), "the write and flush waited for the limit to lift ({flush_time:?})");
    let drives: Vec<DriveView> = daemon.get("/api/v1/drives");
    assert!(drives.iter().all(|drive| drive.state == "Onln" || drive.state == "GHS"), "no drive failed: {drives:?}\n{log}");
    let vd: VdView = daemon.get("/api/v1/vds/0");
    assert_eq!(vd.state, "Optl");
    assert_eq!(client.read(0, 65536).unwrap(), vec![1; 65536]);
    assert_eq!(client.read(65536, 65536).unwrap(), vec![2; 65536]);
    drop(client);
    daemon.stop();
}
