//! A loop device over a sparse file in /var/tmp, attached with `losetup` (root), detached and
//! its file removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// An attached loop device.
pub struct LoopDevice {
    device: PathBuf,
    backing: PathBuf,
}

impl LoopDevice {
    /// Attaches a new loop device of `size_bytes`.
    ///
    /// # Panics
    /// `losetup` is missing or fails (not root, no free loop device): the test cannot run.
    #[must_use]
    pub fn attach(size_bytes: u64) -> LoopDevice {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let backing = PathBuf::from(format!("/var/tmp/storc-loop-{}-{}.img", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::File::create(&backing).and_then(|file| file.set_len(size_bytes)).expect("create the loop device's backing file");
        let attach = Command::new("losetup").args(["--find", "--show"]).arg(&backing).output().expect("run losetup");
        if !attach.status.success() {
            let _ = std::fs::remove_file(&backing);
            panic!("losetup: {}", String::from_utf8_lossy(&attach.stderr));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&attach.stdout).trim());
        LoopDevice { device, backing }
    }

    /// The device node, `/dev/loopN`.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.device
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        let _ = std::fs::remove_file(&self.backing);
    }
}
