//! The context's timetable: completions parked until they come due (emulated drives that know
//! an operation's service time at submit, timers), and the sources that hold completions and
//! decide later when they are due (a hard disk reordering its queue).

use super::IoCtx;
use crate::{Completion, Token};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct Delayed {
    pub(super) due: Instant,
    pub(super) sequence: u64,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.sequence) == (other.due, other.sequence)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    // Reversed: BinaryHeap is a max-heap and we want the earliest deadline first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.due, other.sequence).cmp(&(self.due, self.sequence))
    }
}

/// Holds completions for contexts and releases them as time passes: a drive whose completion
/// times are decided after submit, possibly by another thread's submit (a shared queue).
pub(crate) trait DueSource: Send + Sync {
    /// Moves the completions of context `ctx_id` that are due by now into `out`, and says when
    /// to ask again: `None` once the source holds nothing more for that context.
    fn release_due(&self, ctx_id: u64, out: &mut VecDeque<Completion>) -> Option<Instant>;
}

/// A source this context has operations in, and when it asked to be polled next.
pub(super) struct WatchedSource {
    pub(super) source: Arc<dyn DueSource>,
    pub(super) next_poll: Option<Instant>,
}

impl IoCtx {
    /// Completes an operation at `due` and not before: for emulated drives, which know their
    /// service time at submit. The token's hooks run when it is released, as for any completion.
    pub(crate) fn complete_at(&mut self, completion: Completion, due: Instant) {
        self.delay_sequence += 1;
        let sequence = self.delay_sequence;
        self.delayed.push(Delayed { due, sequence });
        self.delayed_completions.insert(sequence, completion);
    }

    /// `source` now holds one more completion for this context and will release it through
    /// [`DueSource::release_due`], which `poll` calls until the source says it holds nothing.
    pub(crate) fn held_by(&mut self, source: Arc<dyn DueSource>) {
        self.held_by_sources += 1;
        let known = self.sources.iter_mut().find(|w| std::ptr::addr_eq(Arc::as_ptr(&w.source), Arc::as_ptr(&source)));
        match known {
            // Poll it now: the new operation may be due sooner than the source last said.
            Some(watched) => watched.next_poll = Some(Instant::now()),
            None => self.sources.push(WatchedSource { source, next_poll: Some(Instant::now()) }),
        }
    }

    /// A completion of `token` with nothing in it, `delay` from now: a timer for the context's
    /// owner, which sleeps in the ring no longer than the earliest one.
    pub fn timer(&mut self, token: Token, delay: Duration) {
        self.park(Completion { token, result: Ok(()), buf: None, bufs: Vec::new() }, delay);
    }

    pub(super) fn park(&mut self, completion: Completion, delay: Duration) {
        self.delay_sequence += 1;
        let sequence = self.delay_sequence;
        self.delayed.push(Delayed { due: Instant::now() + delay, sequence });
        self.delayed_completions.insert(sequence, completion);
    }

    pub(super) fn release_due_delays(&mut self) {
        loop {
            let now = Instant::now();
            while self.delayed.peek().is_some_and(|d| d.due <= now) {
                let delayed = self.delayed.pop().expect("peeked");
                let completion = self.delayed_completions.remove(&delayed.sequence).expect("parked");
                self.ready.push_back(completion);
            }
            if self.ring.is_some() || !self.ready.is_empty() {
                return;
            }
            // No ring to sleep in: wait for the next deadline here.
            let Some(due) = self.next_deadline() else { return };
            std::thread::sleep(due.saturating_duration_since(now));
            self.release_from_sources();
        }
    }

    /// The earliest instant something parked here comes due, a source wants to be asked, or an
    /// operation the kernel handed back is to be submitted again.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let sources = self.sources.iter().filter_map(|w| w.next_poll);
        self.delayed.peek().map(|d| d.due).into_iter().chain(sources).chain(self.retries.next_due()).min()
    }

    /// Asks every source whose time has come for this context's due completions.
    pub(super) fn release_from_sources(&mut self) {
        if self.sources.is_empty() {
            return;
        }
        let now = Instant::now();
        let before = self.ready.len();
        for watched in &mut self.sources {
            if watched.next_poll.is_some_and(|at| at <= now) {
                watched.next_poll = watched.source.release_due(self.id, &mut self.ready);
            }
        }
        self.held_by_sources -= self.ready.len() - before;
        self.sources.retain(|w| w.next_poll.is_some());
    }
}
