//! Emulated drives: a [`MemDrive`] holds the data and a timing model says when each operation
//! completes, as a hard disk or SSD of a named datasheet model would. The model only delays:
//! data is read and written at submit, exactly as the memory drive does it.
//!
//! # Time and delivery
//! A drive reads the time from a [`Clock`] and computes each completion's due time from its
//! model, whose state (head position, platter angle, queue, caches, busy units) sits behind one
//! mutex shared by every submitting thread.
//!
//! - With a [`RealClock`] the due time must be known at submit: the completion goes to the
//!   caller's `IoCtx`, which holds it until that instant (`IoCtx::complete_at`), and no later
//!   call reaches the drive on the caller's thread to change it. The drive therefore decides
//!   each command when it arrives, and a hard disk serves in arrival order: **no NCQ reordering
//!   with the real clock**. Caches, zones, seeks and rotation all apply.
//! - With a [`VirtualClock`] the drive keeps completions until the simulator asks for them, so it
//!   decides as a real drive does: when it becomes free, among what has arrived by then. The
//!   simulator runs on one thread with one `IoCtx` and loops: `next_due_ns()` says when the drive
//!   next has something to report or to decide; it advances the clock there and calls
//!   `poll_due(ctx)`, which completes into `ctx` everything due by then; `ctx.poll` returns it.
//!
//! # Models
//! Hard disks (`hdd.rs`, `geometry.rs`): seek curve through the datasheet's track-to-track,
//! average and full-stroke times; rotational latency from the platter angle at each instant;
//! media rate falling linearly from the outer to the inner zone over the emulated capacity;
//! command overhead; read look-ahead and write-back cache (switchable); queue reordering by
//! shortest positioning time. SSDs (`ssd.rs`): latency per operation, parallel flash units, an
//! IOPS and bandwidth ceiling, and writes slowing to the steady state once the spare area has
//! been written. The figures and their sources are in `profiles.rs`.

mod clock;
mod geometry;
mod hdd;
mod profiles;
mod spec;
mod ssd;

pub use clock::{Clock, RealClock, VirtualClock};
pub use spec::{EmulatedClass, EmulatedDriveSpec};

use crate::{check_op_range, Completion, Drive, DriveInfo, DriveKind, DriveOp, IoCtx, MemDrive, OpKind, Token};
use hdd::{HddConfig, HddModel};
use spec::Profile;
use ssd::SsdModel;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One operation as a timing model sees it: where, how much, when; no data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Command {
    pub(crate) id: u64,
    pub(crate) kind: OpKind,
    pub(crate) offset_bytes: u64,
    pub(crate) len_bytes: u64,
    pub(crate) arrival_ns: u64,
}

/// A completion time a model has settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) id: u64,
    pub(crate) due_ns: u64,
}

/// Decides when commands complete. Pure: no I/O, no clock of its own.
pub(crate) trait TimingModel: Send {
    /// `command` reaches the drive; completions settled at once (cache hits) go to `decided`.
    fn arrive(&mut self, command: Command, decided: &mut Vec<Due>);

    /// Takes every scheduling decision due at or before `horizon_ns`.
    fn decide_until(&mut self, horizon_ns: u64, decided: &mut Vec<Due>);

    /// When the next decision is due on the model's own (it becomes free with commands waiting).
    fn next_decision_ns(&self) -> Option<u64>;
}

/// A drive that behaves, in time, like the datasheet model its spec names.
pub struct EmulatedDrive {
    info: DriveInfo,
    class: EmulatedClass,
    store: MemDrive,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

struct State {
    model: Box<dyn TimingModel>,
    next_command_id: u64,
    /// Virtual clock: completions the drive holds until they are due, by command id.
    held: HashMap<u64, Held>,
    /// Virtual clock: the context every completion goes to (its address, for a clear panic).
    owner_ctx: Option<usize>,
}

struct Held {
    completion: Completion,
    due_ns: Option<u64>,
}

impl EmulatedDrive {
    pub fn new(spec: &EmulatedDriveSpec, clock: Arc<dyn Clock>) -> EmulatedDrive {
        let name = spec.to_string();
        let store = MemDrive::named(name.clone(), spec.capacity_bytes);
        let info = DriveInfo { name, kind: DriveKind::Emulated, capacity_bytes: spec.capacity_bytes, direct_io: true };
        let state = State { model: build_model(spec), next_command_id: 0, held: HashMap::new(), owner_ctx: None };
        EmulatedDrive { info, class: spec.class, store, clock, state: Mutex::new(state) }
    }

    /// The datasheet model this drive behaves like.
    pub fn model(&self) -> &'static str {
        self.class.model()
    }

    /// Virtual clock: the next instant at which the drive has a completion due or a decision to
    /// take; `None` when it is idle. Already-due completions give a time at or before now.
    pub fn next_due_ns(&self) -> Option<u64> {
        let mut state = self.lock();
        state.decide_until(self.clock.now_ns());
        let held = state.held.values().filter_map(|held| held.due_ns).min();
        [held, state.model.next_decision_ns()].into_iter().flatten().min()
    }

    /// Virtual clock: completes into `ctx` every operation due by now, earliest first; returns
    /// how many. With a real clock there is nothing to do (the `IoCtx` delivers), and it returns 0.
    ///
    /// # Panics
    /// If operations were submitted on another context: the simulator has exactly one.
    pub fn poll_due(&self, ctx: &mut IoCtx) -> usize {
        if !self.is_virtual() {
            return 0;
        }
        let now_ns = self.clock.now_ns();
        let mut state = self.lock();
        state.claim_owner(ctx);
        state.decide_until(now_ns);
        let mut due: Vec<(u64, u64)> =
            state.held.iter().filter_map(|(id, held)| held.due_ns.filter(|d| *d <= now_ns).map(|d| (d, *id))).collect();
        due.sort_unstable();
        for (_, id) in &due {
            ctx.complete(state.held.remove(id).expect("listed above").completion);
        }
        due.len()
    }

    /// Whether the drive holds completions for the simulator (virtual clock) rather than handing
    /// them to the caller's `IoCtx` with their due instant (real clock).
    fn is_virtual(&self) -> bool {
        self.clock.wall_instant(0).is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("emulated drive state poisoned")
    }

    /// Reads or writes the data now, on a private context: the model only decides when the
    /// caller sees the completion.
    fn store_now(&self, token: Token, op: DriveOp) -> Completion {
        let mut scratch = IoCtx::without_ring();
        self.store.submit(&mut scratch, token, op);
        let mut done = Vec::with_capacity(1);
        scratch.poll(&mut done, false);
        assert_eq!(done.len(), 1, "a memory drive completes at once");
        done.pop().expect("checked above")
    }
}

fn build_model(spec: &EmulatedDriveSpec) -> Box<dyn TimingModel> {
    let queue_depth = spec.queue_depth() as usize;
    match spec.class.profile() {
        Profile::Hdd(profile) => {
            let config =
                HddConfig { capacity_bytes: spec.capacity_bytes, write_cache: spec.write_cache, read_ahead: spec.read_ahead, queue_depth };
            Box::new(HddModel::new(profile, &config))
        }
        Profile::Ssd(profile) => {
            let spare_bytes = (spec.capacity_bytes as f64 * profile.spare_fraction) as u64;
            Box::new(SsdModel::new(profile, spec.steady_after_bytes.unwrap_or(spare_bytes), queue_depth))
        }
    }
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_command_id += 1;
        self.next_command_id
    }

    fn claim_owner(&mut self, ctx: &IoCtx) {
        let address = ctx as *const IoCtx as usize;
        let owner = *self.owner_ctx.get_or_insert(address);
        assert_eq!(owner, address, "an emulated drive on a virtual clock serves one IoCtx (the simulator's)");
    }

    /// Virtual clock: takes the decisions due by `horizon_ns` and notes the due times.
    fn decide_until(&mut self, horizon_ns: u64) {
        let mut decided = Vec::new();
        self.model.decide_until(horizon_ns, &mut decided);
        self.note_due(&decided);
    }

    fn note_due(&mut self, decided: &[Due]) {
        for due in decided {
            let held = self.held.get_mut(&due.id).expect("a decided command is held");
            debug_assert!(held.due_ns.is_none(), "decided twice");
            held.due_ns = Some(due.due_ns);
        }
    }
}

impl Drive for EmulatedDrive {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        let kind = op.kind();
        let (offset_bytes, len_bytes) = op.range_bytes().unwrap_or((0, 0));
        let completion = self.store_now(token, op);
        let mut state = self.lock();
        // Read under the lock, so that racing shards reach the model in time order.
        let arrival_ns = self.clock.now_ns();
        let command = Command { id: state.next_id(), kind, offset_bytes, len_bytes, arrival_ns };
        match self.is_virtual() {
            false => self.submit_real(&mut state, ctx, command, completion),
            true => submit_virtual(&mut state, ctx, command, completion),
        }
    }
}

impl EmulatedDrive {
    /// Decides the command at once (earlier ones were decided at their own submit) and lets the
    /// context hold its completion until it is due.
    fn submit_real(&self, state: &mut State, ctx: &mut IoCtx, command: Command, completion: Completion) {
        let mut decided = Vec::with_capacity(1);
        state.model.arrive(command, &mut decided);
        state.model.decide_until(u64::MAX, &mut decided);
        assert!(matches!(decided[..], [Due { id, .. }] if id == command.id), "only the new command is decided: {decided:?}");
        let due = self.clock.wall_instant(decided[0].due_ns).expect("a real clock has instants");
        ctx.complete_at(completion, due);
    }
}

/// Holds the completion; decisions wait until the clock reaches them.
fn submit_virtual(state: &mut State, ctx: &IoCtx, command: Command, completion: Completion) {
    state.claim_owner(ctx);
    state.decide_until(command.arrival_ns);
    state.held.insert(command.id, Held { completion, due_ns: None });
    let mut decided = Vec::new();
    state.model.arrive(command, &mut decided);
    state.model.decide_until(command.arrival_ns, &mut decided);
    state.note_due(&decided);
}
