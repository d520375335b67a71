//! [`ShardWaker`]: how other threads rouse a thread sleeping in its ring (or in `poll(2)`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Wakes a shard sleeping in [`IoCtx::poll`]; cheap when the shard is awake.
pub struct ShardWaker {
    eventfd: OwnedFd,
    sleeping: AtomicBool,
}

impl ShardWaker {
    /// A waker of its own, for a thread that sleeps in `poll(2)` on `fd()` rather than in a ring.
    pub fn new() -> Arc<ShardWaker> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd failed: {}", io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Arc::new(ShardWaker { eventfd, sleeping: AtomicBool::new(false) })
    }

    /// The eventfd, readable after a `wake` that found the sleeper's flag set.
    pub fn fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Clears the eventfd after waking.
    pub fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
        let _ = unsafe { libc::read(self.eventfd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    }

    /// Called by the shard before it checks its inbox one last time and sleeps: a message sent
    /// after this point finds the flag set and writes the eventfd, so no wake-up is lost.
    pub fn prepare_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
    }

    /// Called by the shard when it did not sleep after all, or has woken.
    pub fn cancel_sleep(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Called by other threads after they queued work for the shard.
    pub fn wake(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
            let _ = unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}
