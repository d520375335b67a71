//! Helpers shared by the integration tests: temp dirs, random data, real tools.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub mod tls;

use nbd::testing::MemDevice;
use nbd::{Export, Server, ServerHandle};

pub const MIB: u64 = 1024 * 1024;

/// A directory unique to one test, removed when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(test_name: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("storc-nbd-{test_name}-{}-{unique}-{nanos}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).unwrap();
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failure reproduces.
pub fn random_bytes(len_bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len_bytes + 8);
    while out.len() < len_bytes {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len_bytes);
    out
}

/// Fails the test, saying how to install it, if a client tool is missing.
pub fn require_tool(tool: &str, debian_package: &str) {
    nbd::testing::require_tool(tool, debian_package, "runs it as a real NBD client");
}

#[allow(unused_imports)] // not every test file that includes this module runs commands
pub use nbd::testing::{run_ok as run, stdout_text as stdout};

/// A server with one MemDevice export `name` of `size_bytes`, on a Unix socket in `dir`.
pub fn serve_mem(dir: &TempDir, name: &str, size_bytes: u64) -> (ServerHandle, Arc<MemDevice>) {
    let device = Arc::new(MemDevice::new(size_bytes));
    let server = Server::new(vec![Export::new(name, Arc::clone(&device))]).unwrap();
    let handle = server.serve_unix(dir.join("nbd.sock")).unwrap();
    (handle, device)
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    condition()
}
