//! A real single-node Ceph cluster for tests of RBD drives: `../shared/tools/ceph-single-node`
//! (beside the workspace) brings one up in a few seconds with a memory-backed OSD, and takes it
//! down when the last test holding it is done.
//!
//! The tests drive it with Ceph's own CLIs (`rbd`, `ceph`: Debian's `ceph-common`), as an
//! administrator would: to make images, to remove one under a running VD, to delete a pool.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The OSD keeps everything in RAM (memstore): room for the tests' images, small for a 24 GiB
/// machine (the OSD's RSS is 1.3 to 2.7 times what it holds).
const OSD_BYTES: &str = "1536M";
/// The pool the tool makes and initialises for RBD.
pub const POOL: &str = "rbd";
/// Longest a Ceph CLI call may take before the test fails (the cluster is local).
const CLI_TIMEOUT_S: &str = "120";

/// A running cluster; taken down (every daemon stopped, its directory removed) when dropped.
pub struct CephCluster {
    dir: PathBuf,
    conf: PathBuf,
}

/// The tool, found from this crate's place in the workspace.
fn tool() -> PathBuf {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/ceph-single-node");
    assert!(
        tool.is_file(),
        "{} is missing: the RBD tests bring up a real Ceph cluster with it (it lives in shared/tools, beside the workspace)",
        tool.display()
    );
    tool
}

/// Fails the test, saying what to install, when a Ceph program is missing.
fn require(program: &str) {
    let found = std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    assert!(
        found,
        "{program} is not installed: the RBD tests run a real single-node Ceph cluster \
         (apt-get install --no-install-recommends ceph-mon ceph-osd ceph-common; scripts/test does)"
    );
}

impl CephCluster {
    /// The cluster the tests of this process running now share: started by the first, down
    /// once the last has dropped its handle.
    pub fn shared() -> Arc<CephCluster> {
        static SHARED: Mutex<Weak<CephCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(cluster) = shared.upgrade() {
            return cluster;
        }
        let cluster = Arc::new(CephCluster::start());
        *shared = Arc::downgrade(&cluster);
        cluster
    }

    /// Brings up a new cluster in a directory of its own.
    ///
    /// # Panics
    /// If the tool or Ceph is missing, or the cluster does not come up.
    pub fn start() -> CephCluster {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        for program in ["ceph-mon", "ceph-osd", "ceph", "rbd"] {
            require(program);
        }
        // The tool takes the first free monitor port from 3300: two bring-ups at once (tests
        // that stop an OSD have a cluster of their own) could both find it free, and the second
        // monitor then fails to bind. One at a time, the second finds the next port.
        static BRING_UP: Mutex<()> = Mutex::new(());
        let _one_at_a_time = BRING_UP.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = std::env::temp_dir().join(format!("storc-ceph-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst)));
        let started = Instant::now();
        // Through bash: the tool's copy may have lost its execute bit.
        let output = Command::new("bash")
            .arg(tool())
            .arg("up")
            .arg(&dir)
            .env("CEPH_OSD_BYTES", OSD_BYTES)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ceph-single-node: {e}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "ceph-single-node up {} failed:\n{stderr}", dir.display());
        let conf = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        assert!(conf.is_file(), "ceph-single-node printed {conf:?}, not a conf file");
        eprintln!("ceph cluster up in {:.1}s: {}", started.elapsed().as_secs_f64(), conf.display());
        CephCluster { dir, conf }
    }

    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The process ids of the cluster's OSDs (to stop one with SIGSTOP, as a hung host).
    pub fn osd_pids(&self) -> Vec<u32> {
        let entries = std::fs::read_dir(self.dir.join("run")).expect("the cluster's run directory");
        let pid_files = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("osd.") && n.ends_with(".pid")));
        pid_files.filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok()).collect()
    }

    /// `POOL/IMAGE?conf=PATH`: the text after `rbd:` of a drive on `image` of the pool.
    pub fn spec_text(&self, image: &str) -> String {
        format!("{POOL}/{image}?conf={}", self.conf.display())
    }

    /// `--drive` text of `image`: `rbd:POOL/IMAGE?conf=PATH`.
    pub fn drive_arg(&self, image: &str) -> String {
        format!("rbd:{}", self.spec_text(image))
    }

    /// Runs `program` (`rbd`, `ceph`, `rados`) against this cluster; its stdout.
    ///
    /// # Panics
    /// If it fails or takes over two minutes.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let output = Command::new("timeout")
            .args([CLI_TIMEOUT_S, program, "-c"])
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{program} {} failed ({}):\n{stderr}", args.join(" "), output.status);
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Whether `program args` succeeds (for commands expected to fail now and then).
    pub fn try_run(&self, program: &str, args: &[&str]) -> bool {
        Command::new("timeout")
            .args([CLI_TIMEOUT_S, program, "-c"])
            .arg(&self.conf)
            .args(args)
            .output()
            .is_ok_and(|output| output.status.success())
    }

    /// `rbd create --size SIZE POOL/IMAGE`.
    pub fn create_image(&self, image: &str, size_bytes: u64) {
        self.run("rbd", &["create", "--size", &format!("{}M", size_bytes >> 20), &format!("{POOL}/{image}")]);
    }

    /// Removes `image` while a client has it open, as an administrator must: `rbd rm` refuses an
    /// image with watchers, so each watcher's client is blocklisted first (its I/O then fails with
    /// ESHUTDOWN), then the image is removed.
    pub fn remove_image_in_use(&self, image: &str) {
        let path = format!("{POOL}/{image}");
        let status = self.run("rbd", &["status", "--format", "json", &path]);
        let watchers = addresses(&status);
        assert!(!watchers.is_empty(), "{path} has no watcher to blocklist: {status}");
        for address in &watchers {
            self.run("ceph", &["osd", "blocklist", "add", address]);
        }
        // The OSDs drop the watches once they have the new map.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.try_run("rbd", &["rm", "--no-progress", &path]) {
            assert!(Instant::now() < deadline, "rbd rm {path} still fails a minute after blocklisting {watchers:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `ceph osd pool create POOL` and `rbd pool init POOL`.
    pub fn create_pool(&self, pool: &str) {
        self.run("ceph", &["osd", "pool", "create", pool, "8", "8", "replicated"]);
        self.run("rbd", &["pool", "init", pool]);
    }

    /// Deletes a pool and every image in it (the tool's conf allows pool deletion).
    pub fn delete_pool(&self, pool: &str) {
        self.run("ceph", &["osd", "pool", "delete", pool, pool, "--yes-i-really-really-mean-it"]);
    }
}

/// The `"address":"..."` values of `rbd status --format json`.
fn addresses(json: &str) -> Vec<String> {
    json.split("\"address\":\"").skip(1).filter_map(|rest| rest.split('"').next()).map(str::to_string).collect()
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        let down = Command::new("bash").arg(tool()).arg("down").arg(&self.dir).output();
        match down {
            Ok(output) if output.status.success() => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Ok(output) => eprintln!("ceph-single-node down {} failed: {}", self.dir.display(), String::from_utf8_lossy(&output.stderr)),
            Err(e) => eprintln!("cannot run ceph-single-node down: {e}"),
        }
    }
}
