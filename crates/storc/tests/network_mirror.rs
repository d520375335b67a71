//! A network mirror, as DRBD makes one (issue 15): a RAID1 of a local file and an NBD export
//! that nbdkit serves from another network namespace, over a veth pair this test makes (the
//! addresses exist only inside its namespaces). The remote's interface goes down in the middle
//! of writes: the VD goes degraded within the member's timeout and writes keep succeeding. The
//! interface comes back up: the member is re-added by itself and resynced in the regions written
//! meanwhile only (the bytes are printed), and the local file and the remote file then hold the
//! same bytes past the metadata area. Runs as root (`ip netns`); needs iproute2 and nbdkit.

mod common;

use common::api_types::{DriveView, EventView};
use common::{block_contents, Daemon, DaemonOptions, Scratch, MIB};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 1 << 30;
/// The remote member's `?timeout=`: how long a request may go unanswered.
const LINK_TIMEOUT_S: u64 = 3;
/// Bytes of the VD one bit of the write-intent bitmap covers.
const REGION_BYTES: u64 = 64 * MIB;
/// The blocks written while the link is cut: 16 MiB inside region 3.
const CUT_WRITES_AT: u64 = 3 * REGION_BYTES + 8 * MIB;
const CUT_BLOCKS: u64 = 256;
const BLOCK_BYTES: u64 = 64 << 10;
/// Each member's reserved area (metadata, bitmap) before its data (engine::vd::MEMBER_RESERVED_BYTES).
const MEMBER_RESERVED_BYTES: u64 = 4 * MIB;
/// Regions are cleared one to two of these after their last write (BITMAP_CLEAN_INTERVAL).
const BITMAP_CLEAN_INTERVAL: Duration = Duration::from_secs(5);
const WAIT_MAX: Duration = Duration::from_secs(120);
const REMOTE_ADDRESS: &str = "10.77.0.1";
const LOCAL_ADDRESS: &str = "10.77.0.2";

/// Two network namespaces joined by a veth pair, deleted (with the pair) when dropped, whether
/// the test passed or not. Drop it after the processes running in them.
struct Namespaces {
    local: String,
    remote: String,
    remote_interface: String,
}

impl Namespaces {
    fn create() -> Namespaces {
        let tag = std::process::id() % 100_000;
        let namespaces = Namespaces {
            local: format!("storc-nm{tag}-local"),
            remote: format!("storc-nm{tag}-remote"),
            remote_interface: format!("nmr{tag}"),
        };
        let local_interface = format!("nml{tag}");
        // Left by an earlier run of a process with the same pid that was killed: start afresh.
        for namespace in [&namespaces.local, &namespaces.remote] {
            let _ = Command::new("ip").args(["netns", "delete", namespace]).stderr(Stdio::null()).status();
        }
        ip(&["netns", "add", &namespaces.local]);
        ip(&["netns", "add", &namespaces.remote]);
        ip(&["link", "add", &local_interface, "netns", &namespaces.local, "type", "veth", "peer", "name", &namespaces.remote_interface]);
        ip(&["link", "set", &namespaces.remote_interface, "netns", &namespaces.remote]);
        ip(&["-n", &namespaces.local, "addr", "add", &format!("{LOCAL_ADDRESS}/24"), "dev", &local_interface]);
        ip(&["-n", &namespaces.remote, "addr", "add", &format!("{REMOTE_ADDRESS}/24"), "dev", &namespaces.remote_interface]);
        for (namespace, interface) in [(&namespaces.local, &local_interface), (&namespaces.remote, &namespaces.remote_interface)] {
            ip(&["-n", namespace, "link", "set", "lo", "up"]);
            ip(&["-n", namespace, "link", "set", interface, "up"]);
        }
        namespaces
    }

    /// The remote's end of the pair up or down: the cable plugged in or pulled.
    fn set_remote_link(&self, up: bool) {
        ip(&["-n", &self.remote, "link", "set", &self.remote_interface, if up { "up" } else { "down" }]);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the pair, and so the pair.
        for namespace in [&self.local, &self.remote] {
            let _ = Command::new("ip").args(["netns", "delete", namespace]).status();
        }
    }
}

fn ip(args: &[&str]) {
    common::run(Command::new("ip").args(args));
}

/// nbdkit serving a file on the remote namespace's address; killed when dropped.
struct RemoteExport {
    child: Child,
}

impl RemoteExport {
    fn start(namespaces: &Namespaces, file: &Path, pid_file: &Path) -> RemoteExport {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &namespaces.remote, "nbdkit", "--foreground", "--exit-with-parent", "-i", REMOTE_ADDRESS]);
        command.args(["-p", "10809", "-P"]).arg(pid_file).arg("file").arg(file).stdin(Stdio::null());
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        // nbdkit writes its pid file once it accepts connections.
        wait_until("nbdkit listening in the remote namespace", || pid_file.exists());
        RemoteExport { child }
    }
}

impl Drop for RemoteExport {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WAIT_MAX, "{what} did not happen within {WAIT_MAX:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

fn client(daemon: &Daemon) -> nbd::Client {
    let uri = nbd::NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: "mirror".into() };
    nbd::Client::connect(&uri, &nbd::ClientConfig::default()).expect("connect to the mirror's export")
}

fn vd_state(daemon: &Daemon) -> String {
    daemon.vd_named("mirror").state
}

fn slot_state(daemon: &Daemon, slot: u32) -> String {
    daemon.get::<DriveView>(&format!("/api/v1/drives/{slot}")).state
}

fn events(daemon: &Daemon) -> Vec<String> {
    daemon.get::<Vec<EventView>>("/api/v1/events").into_iter().map(|e| e.description).collect()
}

/// Writes blocks of [`CUT_WRITES_AT`] round and round, each time a new version, until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<AtomicU64>,
    thread: JoinHandle<WriterOutcome>,
}

struct WriterOutcome {
    /// The last version of each block the VD acknowledged.
    versions: BTreeMap<u64, u64>,
    errors: Vec<String>,
    slowest: Duration,
}

impl Writer {
    fn start(daemon: &Daemon) -> Writer {
        let mut client = client(daemon);
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(AtomicU64::new(0));
        let (stop_seen, counted) = (Arc::clone(&stop), Arc::clone(&acknowledged));
        let thread = std::thread::spawn(move || {
            let mut outcome = WriterOutcome { versions: BTreeMap::new(), errors: Vec::new(), slowest: Duration::ZERO };
            let mut round = 0;
            while !stop_seen.load(Ordering::SeqCst) {
                let block = CUT_WRITES_AT / BLOCK_BYTES + round % CUT_BLOCKS;
                let version = 2 + round / CUT_BLOCKS;
                let started = Instant::now();
                match client.write(block * BLOCK_BYTES, &block_contents(block, version, BLOCK_BYTES as usize), false) {
                    Ok(()) => {
                        outcome.versions.insert(block, version);
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(error) => outcome.errors.push(format!("block {block} version {version}: {error}")),
                }
                outcome.slowest = outcome.slowest.max(started.elapsed());
                round += 1;
            }
            outcome
        });
        Writer { stop, acknowledged, thread }
    }

    fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::SeqCst)
    }

    fn finish(self) -> WriterOutcome {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the writer thread")
    }
}

/// 4 MiB of version 1 in each of four regions (none of them region 3).
fn write_before_the_cut(daemon: &Daemon) -> BTreeMap<u64, u64> {
    let mut client = client(daemon);
    let mut versions = BTreeMap::new();
    for region in [0, 5, 10, 14] {
        let first = (region * REGION_BYTES + 16 * MIB) / BLOCK_BYTES;
        for block in first..first + 4 * MIB / BLOCK_BYTES {
            client.write(block * BLOCK_BYTES, &block_contents(block, 1, BLOCK_BYTES as usize), false).expect("write before the cut");
            versions.insert(block, 1);
        }
    }
    client.flush().expect("flush");
    versions
}

/// Every block written holds its last acknowledged version, read through the VD.
fn assert_blocks(daemon: &Daemon, versions: &BTreeMap<u64, u64>) {
    let mut client = client(daemon);
    for (&block, &version) in versions {
        let read = client.read(block * BLOCK_BYTES, BLOCK_BYTES as u32).expect("read back");
        assert!(read == block_contents(block, version, BLOCK_BYTES as usize), "block {block} does not hold version {version}");
    }
}

/// The first offset past the reserved area where the two member files differ.
fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    let (mut a, mut b) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (mut chunk_a, mut chunk_b) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    let mut offset = 0u64;
    loop {
        let (read_a, read_b) = (a.read(&mut chunk_a).unwrap(), b.read(&mut chunk_b).unwrap());
        assert_eq!(read_a, read_b, "the member files differ in length");
        if read_a == 0 {
            return None;
        }
        let start = MEMBER_RESERVED_BYTES.saturating_sub(offset).min(read_a as u64) as usize;
        if let Some(i) = (start..read_a).find(|&i| chunk_a[i] != chunk_b[i]) {
            return Some(offset + i as u64);
        }
        offset += read_a as u64;
    }
}

/// The `B` of "re-add of slot 1 (v0): N dirty region(s), R row(s), B bytes resynced".
fn resynced_bytes(all: &[String]) -> (u64, String) {
    let event = all.iter().find(|e| e.starts_with("re-add of slot 1 (v0)")).unwrap_or_else(|| panic!("no re-add event: {all:#?}"));
    let bytes = event.split(", ").find_map(|part| part.strip_suffix(" bytes resynced")).expect("bytes in the event");
    (bytes.parse().expect("a number of bytes"), event.clone())
}

#[test]
fn a_mirror_with_a_remote_export_survives_a_cut_link_and_resyncs_only_what_it_missed() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes network namespaces: run it as root");
    nbd::testing::require_tool("ip", "iproute2", "makes network namespaces and a veth pair with it");
    nbd::testing::require_tool("nbdkit", "nbdkit", "serves the remote member with it");
    let scratch = Scratch::new("network-mirror");
    let local_file: PathBuf = scratch.sparse_file("local.img", DRIVE_BYTES);
    let remote_file: PathBuf = scratch.sparse_file("remote.img", DRIVE_BYTES);
    let namespaces = Namespaces::create();
    let remote = RemoteExport::start(&namespaces, &remote_file, &scratch.join("nbdkit.pid"));
    let remote_spec = format!("nbd://{REMOTE_ADDRESS}:10809/remote?timeout={LINK_TIMEOUT_S}s");
    let command_prefix = ["ip", "netns", "exec", &namespaces.local].map(String::from).to_vec();
    let options = DaemonOptions { nbd_tcp: false, command_prefix, ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &[local_file.display().to_string(), remote_spec.clone()], &options);
    let remote_view = daemon.get::<DriveView>("/api/v1/drives/1");
    assert_eq!((remote_view.kind.as_str(), remote_view.source.as_str()), ("Network", remote_spec.as_str()));
    let vd = daemon.create_vd("r1", &[0, 1], "mirror");
    let mut expected = write_before_the_cut(&daemon);
    let written_at = Instant::now();
    let bgi = wait_until("the initial sync (BGI) of the mirror", || daemon.vd_named("mirror").consistent);
    println!("initial sync of {} bytes over the veth pair: {bgi:.1?}", vd.size_bytes);
    // The regions written so far go clean once idle: from now on only the cut writes are dirty.
    std::thread::sleep((2 * BITMAP_CLEAN_INTERVAL + Duration::from_secs(1)).saturating_sub(written_at.elapsed()));

    let writer = Writer::start(&daemon);
    wait_until("writes through the healthy mirror", || writer.acknowledged() > 20);
    namespaces.set_remote_link(false);
    let cut_at = Instant::now();
    wait_until("the mirror degraded", || vd_state(&daemon) == "Dgrd");
    let degraded_after = cut_at.elapsed();
    assert!(degraded_after < Duration::from_secs(LINK_TIMEOUT_S + 4), "degraded {degraded_after:?} after the cut");
    assert_eq!(slot_state(&daemon, 1), "Failed");
    let acknowledged_when_degraded = writer.acknowledged();
    std::thread::sleep(Duration::from_secs(2));
    let acknowledged_while_degraded = writer.acknowledged() - acknowledged_when_degraded;
    let outcome = writer.finish();
    assert!(outcome.errors.is_empty(), "writes failed while the link was cut: {:#?}", outcome.errors);
    assert!(acknowledged_while_degraded > 20, "only {acknowledged_while_degraded} writes in 2 s on the degraded mirror");
    println!(
        "link cut: degraded after {degraded_after:.1?} (timeout {LINK_TIMEOUT_S} s); the slowest write took {:.1?}; \
         {acknowledged_while_degraded} writes acknowledged in the next 2 s",
        outcome.slowest
    );
    expected.extend(&outcome.versions);

    namespaces.set_remote_link(true);
    let back = wait_until("the remote member re-added and resynced", || slot_state(&daemon, 1) == "Onln" && vd_state(&daemon) == "Optl");
    let all = events(&daemon);
    for wanted in ["NBD link lost (no reply within 3 s)", "NBD link back (connection", "re-added to v0 after its NBD link came back"] {
        assert!(all.iter().any(|e| e.contains(wanted)), "no event saying {wanted:?}: {all:#?}");
    }
    let (resynced, event) = resynced_bytes(&all);
    println!(
        "link back: Optl {back:.1?} later; the resync copied {resynced} bytes ({:.1} MiB) of a {} byte ({} MiB) VD: {event}",
        resynced as f64 / MIB as f64,
        vd.size_bytes,
        vd.size_bytes / MIB
    );
    assert!(resynced > 0 && resynced <= REGION_BYTES, "only region 3 was written while the link was cut: {event}");
    assert!(resynced * 8 < vd.size_bytes, "the resync copied {resynced} of {} bytes", vd.size_bytes);

    assert_blocks(&daemon, &expected);
    daemon.stop();
    drop(remote);
    let difference = first_difference(&local_file, &remote_file);
    assert_eq!(difference, None, "the local and the remote member differ past their reserved area");
    drop(namespaces);
}

/// A malformed NBD spec is refused at start, naming what is wrong and what is allowed; an export
/// that does not answer refuses a first start (a typo, most likely) but, once the controller
/// exists, leaves its slot missing with an event, as a missing drive file does.
#[test]
fn bad_and_unreachable_nbd_members_are_refused_or_left_out() {
    let scratch = Scratch::new("network-mirror-refused");
    let message = common::serve_refused(&scratch, &["--drive", "nbd://10.77.0.1/x?timeout=1h"], 1);
    assert!(
        message.contains("--drive NBD member \"nbd://10.77.0.1/x?timeout=1h\": timeout=\"1h\" has unit \"h\"; allowed: ms, s, m"),
        "{message}"
    );
    assert!(message.contains("allowed: nbd://HOST[:PORT]/EXPORT[?timeout=DURATION]"), "{message}");
    let missing_socket = scratch.join("nowhere.sock");
    let unreachable = format!("nbd+unix:///x?socket={}&timeout=1s", missing_socket.display());
    let message = common::serve_refused(&scratch, &["--drive", &unreachable], 1);
    assert!(message.contains(&format!("--drive {unreachable}: cannot connect (timeout 1 s)")), "{message}");

    let mut nbdkit = nbd::testing::Nbdkit::start(&["memory", "256M"]);
    let remote = format!("nbd+unix:///x?socket={}&timeout=1s", nbdkit.socket_path().display());
    let local = scratch.sparse_file("local.img", 256 * MIB).display().to_string();
    let daemon =
        Daemon::start_with(&scratch, &[local.clone(), remote.clone()], &DaemonOptions { nbd_tcp: false, ..DaemonOptions::default() });
    daemon.create_vd("r1", &[0, 1], "mirror");
    daemon.stop();
    nbdkit.stop();
    let daemon = Daemon::start_with(&scratch, &[local, remote.clone()], &DaemonOptions { nbd_tcp: false, ..DaemonOptions::default() });
    assert_eq!(slot_state(&daemon, 1), "Msng");
    assert_eq!(vd_state(&daemon), "Dgrd");
    let all = events(&daemon);
    let left_out = format!("--drive {remote}: cannot connect (timeout 1 s)");
    assert!(all.iter().any(|e| e.starts_with(&left_out) && e.ends_with("the drive is left out and its slot comes up missing")), "{all:#?}");
    daemon.stop();
}

/// nbdkit serving `file` on the Unix socket `socket` (removed first if a killed server left it).
fn nbdkit_on(scratch: &Scratch, socket: &Path, file: &Path, name: &str) -> RemoteExport {
    let _ = std::fs::remove_file(socket);
    let pid_file = scratch.join(&format!("{name}.pid"));
    let mut command = Command::new("nbdkit");
    command.args(["--foreground", "--exit-with-parent", "--unix"]).arg(socket).arg("-P").arg(&pid_file);
    command.arg("file").arg(file).stdin(Stdio::null());
    let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    wait_until(&format!("nbdkit {name} listening"), || pid_file.exists());
    RemoteExport { child }
}

/// The remote server goes away and another export answers at its address: a blank disk of the
/// same size is refused (never written as the member; an event says so), and when the member's
/// own export answers again it is reconnected and re-added. Unix sockets: no namespaces needed.
#[test]
fn a_blank_export_at_the_members_address_is_refused_and_the_members_own_is_re_added() {
    nbd::testing::require_tool("nbdkit", "nbdkit", "serves the remote member with it");
    let scratch = Scratch::new("network-mirror-identity");
    let socket = scratch.join("remote.sock");
    let remote_file = scratch.sparse_file("remote.img", 256 * MIB);
    let blank_file = scratch.sparse_file("blank.img", 256 * MIB);
    let remote = nbdkit_on(&scratch, &socket, &remote_file, "remote");
    let spec = format!("nbd+unix:///x?socket={}&timeout=1s", socket.display());
    let local = scratch.sparse_file("local.img", 256 * MIB).display().to_string();
    let daemon = Daemon::start_with(&scratch, &[local, spec], &DaemonOptions { nbd_tcp: false, ..DaemonOptions::default() });
    daemon.create_vd("r1", &[0, 1], "mirror");
    wait_until("the initial sync", || daemon.vd_named("mirror").consistent);
    drop(remote);
    let blank = nbdkit_on(&scratch, &socket, &blank_file, "blank");
    // A write finds the link down (or the blank disk refused): the member fails, the VD goes on.
    let mut client = client(&daemon);
    client.write(0, &block_contents(0, 1, BLOCK_BYTES as usize), false).expect("a write on the degraded mirror");
    wait_until("the refusal of the blank export", || {
        events(&daemon).iter().any(|e| e.contains("answers again but is not this slot's drive"))
    });
    assert_eq!(slot_state(&daemon, 1), "Failed");
    assert_eq!(vd_state(&daemon), "Dgrd");
    let all = events(&daemon);
    assert!(all.iter().any(|e| e.contains("it now holds no storc metadata (a blank disk?)")), "{all:#?}");
    // Sparse and never written: not one block allocated.
    assert_eq!(std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&blank_file).unwrap()), 0, "the blank export was written");
    drop(blank);
    let _remote = nbdkit_on(&scratch, &socket, &remote_file, "remote-again");
    wait_until("the member's own export re-added", || slot_state(&daemon, 1) == "Onln" && vd_state(&daemon) == "Optl");
    assert!(events(&daemon).iter().any(|e| e.contains("re-added to v0 after its NBD link came back")));
    let read = client.read(0, BLOCK_BYTES as u32).expect("read back");
    assert!(read == block_contents(0, 1, BLOCK_BYTES as usize), "the write made while degraded is there");
    daemon.stop();
}
