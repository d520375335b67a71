//! A VD's requests in flight: counted from submission to delivery, held while a member failure
//! is unrecorded (the ack gate's release is in `mod.rs`), refused once the VD is retired or
//! being initialized, and waited for before its drives are freed.

use super::*;

/// What write gathering (`io::gather`) did on a VD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatherCounts {
    /// Row writes that waited for the rest of their row.
    pub waits: u64,
    /// Those that other writes joined.
    pub rows: u64,
    /// The writes that joined them.
    pub joins: u64,
}

impl VirtualDrive {
    /// Counts a row write that waited to gather (`io::gather`), which `joins` later writes joined.
    pub(crate) fn note_gathered(&self, joins: u64) {
        self.gather_waits.fetch_add(1, Ordering::Relaxed);
        if joins > 0 {
            self.gathered_rows.fetch_add(1, Ordering::Relaxed);
            self.gathered_joins.fetch_add(joins, Ordering::Relaxed);
        }
    }

    /// Parity row writes that waited to gather writes of a stream, those that gathered any
    /// (written whole, or nearer it), and the writes that joined them.
    pub fn gathered(&self) -> GatherCounts {
        GatherCounts {
            waits: self.gather_waits.load(Ordering::Relaxed),
            rows: self.gathered_rows.load(Ordering::Relaxed),
            joins: self.gathered_joins.load(Ordering::Relaxed),
        }
    }

    /// Counts a request piece handed to a shard, or a request entering `Engine::submit`;
    /// [`VirtualDrive::finish`] or [`VirtualDrive::end_request`] ends it. SeqCst: the count on
    /// entry and the hold of a migration are the two sides of a handshake (see
    /// `VirtualDrive::park_if_held`).
    pub(crate) fn begin_request(&self) {
        self.requests_in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// Delivers a finished request piece, holding a write's acknowledgement while a member
    /// failure is unrecorded (see [`AckGate`]).
    pub(crate) fn finish(&self, completion: VdCompletion, done: Done, write: bool) {
        if write && completion.result.is_ok() && self.is_retired() {
            // Deleted meanwhile: nothing will settle a held acknowledgement now, and the
            // client's data is gone with the VD anyway.
            let refused = VdCompletion { result: Err(VdError::Deleted { vd: self.name() }), buf: completion.buf };
            return self.complete(done, refused);
        }
        // SeqCst pairs with the store in `member_error`, made before the member's state changed:
        // a write that saw the member out of service sees the gate closed.
        if write && completion.result.is_ok() && self.acks_gated.load(Ordering::SeqCst) {
            let mut gate = self.acks.lock().expect("ack gate poisoned");
            if gate.failures_unrecorded > 0 {
                return gate.held.push((done, completion));
            }
            if let Some(detail) = gate.record_error.clone() {
                drop(gate);
                let refused = VdCompletion { result: Err(VdError::FailureUnrecorded { vd: self.name(), detail }), buf: completion.buf };
                return self.complete(done, refused);
            }
        }
        self.complete(done, completion);
    }

    /// Publishes whether the gate holds or refuses acknowledgements; called under its lock.
    pub(super) fn set_gated(&self, gate: &AckGate) {
        self.acks_gated.store(gate.failures_unrecorded > 0 || gate.record_error.is_some(), Ordering::SeqCst);
    }

    pub(super) fn complete(&self, done: Done, completion: VdCompletion) {
        done(completion);
        self.end_request();
    }

    /// Ends a request piece or a row job counted by [`VirtualDrive::begin_request`].
    pub(crate) fn end_request(&self) {
        let before = self.requests_in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "v{}: more requests finished than began", self.id);
    }

    /// Notes that a client submitted a request now.
    pub(crate) fn note_client_request(&self) {
        let now_ns = coarse_now_ns();
        // Once per tick of the coarse clock, not per request: the line stays shared between
        // the shards that submit.
        if self.last_client_request_ns.load(Ordering::Relaxed) != now_ns {
            self.last_client_request_ns.store(now_ns, Ordering::Relaxed);
        }
    }

    /// When a client last submitted a request (the process's start if none has), to within a
    /// tick of the coarse clock (a few ms; the windows that use it are 200 ms).
    pub fn last_client_request(&self) -> Instant {
        let last_ns = self.last_client_request_ns.load(Ordering::Relaxed);
        let age = Duration::from_nanos(coarse_now_ns().saturating_sub(last_ns));
        match last_ns {
            0 => clock_epoch(),
            _ => Instant::now().checked_sub(age).unwrap_or_else(clock_epoch),
        }
    }

    pub fn requests_in_flight(&self) -> usize {
        self.requests_in_flight.load(Ordering::SeqCst)
    }

    /// Takes the VD out of service for good (it is being deleted): new requests fail, and held
    /// acknowledgements fail too, since nothing will record their member failures now.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.bad_blocks.abandon(&format!("virtual drive {} was deleted", self.name()));
        let held = std::mem::take(&mut self.acks.lock().expect("ack gate poisoned").held);
        for (done, completion) in held {
            self.complete(done, VdCompletion { result: Err(VdError::Deleted { vd: self.name() }), buf: completion.buf });
        }
    }

    /// Undoes [`VirtualDrive::retire`] when a deletion is abandoned.
    pub fn unretire(&self) {
        self.retired.store(false, Ordering::Release);
        self.bad_blocks.revive();
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// A full initialization starts (`true`) or ends: client requests are refused meanwhile
    /// (wait for those in flight with [`VirtualDrive::wait_idle`]).
    pub fn set_initializing(&self, initializing: bool) {
        self.init_epoch.fetch_add(1, Ordering::AcqRel);
        self.initializing.store(initializing, Ordering::Release);
    }

    /// Changes whenever an initialization begins or ends.
    pub fn init_epoch(&self) -> u64 {
        self.init_epoch.load(Ordering::Acquire)
    }

    pub fn is_initializing(&self) -> bool {
        self.initializing.load(Ordering::Acquire)
    }

    /// Waits until no request of this VD is queued or running; returns whether that happened
    /// within `timeout`. Control plane only.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.requests_in_flight() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}
