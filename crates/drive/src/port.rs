//! The port through which another thread completes operations submitted on an [`IoCtx`]
//! (see `ctx`'s module docs): a network drive's reply reader, which must never wait on the
//! shard, and which the shard must never wait on.
//!
//! [`IoCtx`]: crate::IoCtx

use crate::{Completion, ShardWaker};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Longest wait of a context without a ring for completions pushed into its port; the caller
/// polls again (a control-plane loop), so this only bounds how long one `poll` blocks.
pub(crate) const PORT_WAIT_MAX: Duration = Duration::from_millis(100);

/// Where another thread completes operations submitted on one context (see the module docs).
/// Cloned into each operation in flight; holds at most one completion per such operation, so it
/// is bounded by what the context submitted.
#[derive(Clone)]
pub struct CompletionPort {
    shared: Arc<PortShared>,
}

struct PortShared {
    arrived: Mutex<VecDeque<Completion>>,
    /// A context without a ring waits here in `poll` (the control plane's blocking I/O).
    signal: Condvar,
    /// Wakes a context sleeping in its ring (its `poll` arms the eventfd before it sleeps).
    waker: Option<Arc<ShardWaker>>,
}

impl CompletionPort {
    pub(crate) fn new(waker: Option<Arc<ShardWaker>>) -> CompletionPort {
        let shared = PortShared { arrived: Mutex::new(VecDeque::new()), signal: Condvar::new(), waker };
        CompletionPort { shared: Arc::new(shared) }
    }

    pub(crate) fn waker(&self) -> Option<Arc<ShardWaker>> {
        self.shared.waker.clone()
    }

    /// Hands `completion` to the context, from any thread; never blocks on the context.
    pub fn complete(&self, completion: Completion) {
        self.shared.arrived.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(completion);
        self.shared.signal.notify_one();
        if let Some(waker) = &self.shared.waker {
            waker.wake();
        }
    }

    pub(crate) fn take_all(&self, into: &mut VecDeque<Completion>) -> usize {
        let mut arrived = self.shared.arrived.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = arrived.len();
        into.append(&mut arrived);
        count
    }

    /// Waits up to `timeout` for a completion to arrive; returns at once if one has.
    pub(crate) fn wait(&self, timeout: Duration) {
        let arrived = self.shared.arrived.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if arrived.is_empty() {
            drop(self.shared.signal.wait_timeout(arrived, timeout));
        }
    }
}
