//! Completions that arrive on threads that are not the context's own.
//!
//! A library with an asynchronous API of its own (librbd) completes operations by calling back on
//! its threads. Those threads must never touch an [`IoCtx`](crate::IoCtx), which its shard alone
//! uses without locks. Instead each operation carries a [`RemoteCompleter`]: on the library's
//! thread it puts the finished [`Completion`] in the context's [`RemoteInbox`] (a mutex-guarded
//! list, held only to push or to take everything) and wakes the shard through its
//! [`ShardWaker`]; the shard's next `poll` takes what arrived. A context without a ring sleeps on
//! the inbox's condition variable instead.
//!
//! No wake-up is lost: `IoCtx::poll` sets the waker's sleeping flag *before* it empties the
//! inbox, so a completion pushed after that finds the flag set and writes the eventfd the ring
//! waits on.

use crate::waker::ShardWaker;
use crate::{Completion, DriveError, DriveOp, Token};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Where other threads leave a context's completions.
pub(crate) struct RemoteInbox {
    arrived: Mutex<Vec<Completion>>,
    /// Signalled on every arrival, for a context without a ring (it cannot sleep in a ring).
    signal: Condvar,
    /// The ring's waker, for a context with a ring.
    waker: Option<Arc<ShardWaker>>,
}

impl RemoteInbox {
    pub(crate) fn new(waker: Option<Arc<ShardWaker>>) -> Arc<RemoteInbox> {
        Arc::new(RemoteInbox { arrived: Mutex::new(Vec::new()), signal: Condvar::new(), waker })
    }

    /// A poisoned lock only means a thread panicked while pushing; the list is still whole.
    fn lock(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.arrived.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, completion: Completion) {
        self.lock().push(completion);
        self.signal.notify_one();
        if let Some(waker) = &self.waker {
            waker.wake();
        }
    }

    /// Everything that arrived so far, oldest first.
    pub(crate) fn take(&self) -> Vec<Completion> {
        std::mem::take(&mut *self.lock())
    }

    /// Blocks until something arrived or `until` passed (forever without it).
    pub(crate) fn wait(&self, until: Option<Instant>) {
        let mut arrived = self.lock();
        while arrived.is_empty() {
            let Some(until) = until else {
                arrived = self.signal.wait(arrived).unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            };
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            arrived = self.signal.wait_timeout(arrived, left).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
    }
}

/// The way back of one operation to the context it was submitted on: may be sent to, and
/// completed on, any thread. Made by `IoCtx::remote_completer`, which counts the operation as in
/// flight until its completion is taken from the inbox.
pub(crate) struct RemoteCompleter {
    inbox: Arc<RemoteInbox>,
    token: Token,
}

impl RemoteCompleter {
    pub(crate) fn new(inbox: Arc<RemoteInbox>, token: Token) -> RemoteCompleter {
        RemoteCompleter { inbox, token }
    }

    /// Hands the operation's result and buffers to its context and wakes it.
    pub(crate) fn complete(self, result: Result<(), DriveError>, op: DriveOp) {
        self.inbox.push(Completion::of(self.token, result, op));
    }
}
