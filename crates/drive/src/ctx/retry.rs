//! Operations the kernel hands back without running them, for want of a thread: io_uring runs a
//! flush, and any read or write that would block, on a worker of its own (io-wq), and when it
//! cannot start one (the process's pids cgroup, `ulimit -u` or the system's thread limit is
//! reached) it completes the queued work with ECANCELED. Nothing reached the drive, so this is
//! not the drive's error: failing the member for it once failed every member of a RAID5 at
//! the same moment, and the VD went offline while its drives were fine (a daemon whose NBD
//! connections had taken its cgroup's last threads). Such an operation is queued again after
//! a backoff, and fails as it came back only if the kernel keeps giving it back for
//! [`RETRY_WINDOW`], as long as a drive's command timeout.
//!
//! EAGAIN is taken the same way: io_uring retries it inside the kernel for files and block
//! devices, so one that reaches a CQE also means that nothing was done.

use super::{flush_entry, remaining_iovecs, vectored_entry, IoCtx, SlotOp};
use std::time::{Duration, Instant};

/// How long an operation is retried while the kernel keeps handing it back unexecuted.
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// The first wait before a retry; doubled at each one, up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(1);
const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// Least time between two warnings about operations the kernel handed back unexecuted.
const RETRY_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Whether a CQE's error says that the operation was not run at all.
pub(super) fn is_unexecuted(errno: i32) -> bool {
    matches!(errno, libc::ECANCELED | libc::EAGAIN)
}

/// An operation's retries so far.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RetryState {
    /// When the kernel first handed it back.
    first_at: Option<Instant>,
    attempts: u32,
}

impl RetryState {
    /// When to submit it again after it came back unexecuted at `now`, or `None` once it has
    /// been coming back for longer than [`RETRY_WINDOW`].
    pub(super) fn next_attempt(&mut self, now: Instant) -> Option<Instant> {
        let first_at = *self.first_at.get_or_insert(now);
        if now.duration_since(first_at) >= RETRY_WINDOW {
            return None;
        }
        let backoff = BACKOFF_MIN.saturating_mul(1 << self.attempts.min(16)).min(BACKOFF_MAX);
        self.attempts += 1;
        Some(now + backoff)
    }

    pub(super) fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// Ring slots waiting to be submitted again, with when.
#[derive(Default)]
pub(super) struct PendingRetries {
    due: Vec<(Instant, usize)>,
}

impl PendingRetries {
    pub(super) fn schedule(&mut self, slot_index: usize, at: Instant) {
        self.due.push((at, slot_index));
    }

    /// The slots whose time has come, earliest first.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<usize> {
        if self.due.is_empty() {
            return Vec::new();
        }
        self.due.sort_unstable();
        let due_count = self.due.partition_point(|(at, _)| *at <= now);
        self.due.drain(..due_count).map(|(_, index)| index).collect()
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.due.iter().map(|(at, _)| *at).min()
    }

    pub(super) fn len(&self) -> usize {
        self.due.len()
    }
}

impl IoCtx {
    /// Submits again the operations whose retry is due: each from where it stands (a short
    /// transfer's rest), into the slot it kept.
    pub(super) fn resubmit_due_retries(&mut self) {
        for index in self.retries.take_due(Instant::now()) {
            let slot = self.slots[index].as_mut().expect("a slot waiting for its retry");
            let entry = match slot.op {
                SlotOp::Flush { fd } => flush_entry(fd),
                SlotOp::ReadWrite(resubmit) => {
                    slot.iovecs = remaining_iovecs(slot, slot.done_bytes);
                    vectored_entry(resubmit.fd, &slot.iovecs, resubmit.offset_bytes + slot.done_bytes as u64, resubmit.write)
                }
            };
            self.push_slot_entry(index, entry);
        }
    }

    /// Warns that operations are being retried, at most every [`RETRY_WARNING_INTERVAL`].
    pub(super) fn note_retry(&mut self, errno: i32) {
        self.retries_unreported += 1;
        let now = Instant::now();
        if self.retry_warned_at.is_some_and(|at| now.duration_since(at) < RETRY_WARNING_INTERVAL) {
            return;
        }
        tracing::warn!(
            errno,
            retries = self.retries_unreported,
            "io_uring handed operations back unexecuted (it could not start a worker thread: is a thread limit reached?); \
             retrying them for up to {:?} before they fail",
            RETRY_WINDOW
        );
        self.retry_warned_at = Some(now);
        self.retries_unreported = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_and_gives_up_after_the_window() {
        let start = Instant::now();
        let mut state = RetryState::default();
        let waits: Vec<Duration> = (0..9).map(|_| state.next_attempt(start).unwrap() - start).collect();
        let expected = [1, 2, 4, 8, 16, 32, 64, 100, 100].map(Duration::from_millis);
        assert_eq!(waits, expected);
        assert!(state.next_attempt(start + RETRY_WINDOW - Duration::from_millis(1)).is_some());
        assert!(state.next_attempt(start + RETRY_WINDOW).is_none(), "the window counts from the first hand-back");
    }

    #[test]
    fn due_slots_come_out_earliest_first_and_only_once() {
        let now = Instant::now();
        let mut retries = PendingRetries::default();
        retries.schedule(7, now + Duration::from_millis(5));
        retries.schedule(3, now);
        retries.schedule(9, now + Duration::from_secs(1));
        assert_eq!(retries.next_due(), Some(now));
        assert_eq!(retries.take_due(now + Duration::from_millis(5)), vec![3, 7]);
        assert_eq!(retries.take_due(now + Duration::from_millis(5)), Vec::<usize>::new());
        assert_eq!(retries.len(), 1);
    }

    #[test]
    fn only_cancellation_and_eagain_mean_unexecuted() {
        assert!(is_unexecuted(libc::ECANCELED));
        assert!(is_unexecuted(libc::EAGAIN));
        assert!(!is_unexecuted(libc::EIO));
        assert!(!is_unexecuted(libc::ENOSPC));
    }
}
