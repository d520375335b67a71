//! Emulated drives: a [`MemDrive`] holds the data and a timing model says when each operation
//! completes, as a hard disk or SSD of a named datasheet model would. The model only delays:
//! data is read and written at submit, exactly as the memory drive does it.
//!
//! # Time and delivery
//! A drive reads the time from a [`Clock`] and computes each completion's due time from its
//! model, whose state (head position, platter angle, queue, caches, busy units) sits behind one
//! mutex shared by every submitting thread. The model decides as a real drive does: when it
//! becomes free, among the commands that have arrived by then (a hard disk picks the one it can
//! reach soonest, NCQ), so a command's due time may be settled after its submit, and by another
//! thread's call. Whoever reaches the model first takes every decision due by its `now`, in
//! time order, so the result does not depend on which thread that is.
//!
//! - With a [`RealClock`], a command decided at submit (an idle drive, a cache hit, any SSD
//!   command) goes to the caller's `IoCtx` with its due instant (`IoCtx::complete_at`). One that
//!   waits in the queue stays with the drive, which registers with that `IoCtx` as a
//!   `DueSource`: each `poll` of the context asks the drive for its due completions and is told
//!   when to ask again (the next decision, or the next due time), and sleeps until then.
//! - With a [`VirtualClock`] the drive keeps every completion until the simulator asks for them.
//!   The simulator runs on one thread with one `IoCtx` and loops: `next_due_ns()` says when the
//!   drive next has something to report or to decide; it advances the clock there and calls
//!   `poll_due(ctx)`, which completes into `ctx` everything due by then; `ctx.poll` returns it.
//!
//! # Models
//! Hard disks (`hdd/`, `geometry.rs`): seek curve through the datasheet's track-to-track,
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

use crate::ctx::DueSource;
use crate::{check_op_range, Backing, Completion, Drive, DriveInfo, DriveKind, DriveOp, IoCtx, MemDrive, OpKind, Token};
use hdd::{HddConfig, HddModel};
use spec::Profile;
use ssd::SsdModel;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    timing: Arc<Timing>,
}

/// The model and the completions the drive holds, shared with the contexts it holds them for.
struct Timing {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

struct State {
    model: Box<dyn TimingModel>,
    next_command_id: u64,
    /// Completions the drive holds until they are due, by command id.
    held: HashMap<u64, Held>,
    /// Virtual clock: the context every completion goes to while any is held (for a clear panic).
    owner_ctx: Option<u64>,
}

struct Held {
    completion: Completion,
    due_ns: Option<u64>,
    /// The id of the context the completion goes to.
    ctx_id: u64,
}

impl EmulatedDrive {
    /// As [`EmulatedDrive::open`]; panics where the machine cannot map the store (tests).
    pub fn new(spec: &EmulatedDriveSpec, clock: Arc<dyn Clock>) -> EmulatedDrive {
        EmulatedDrive::open(spec, clock).expect("an emulated drive's store")
    }

    /// A drive as `spec` says, or why the machine cannot hold its store.
    pub fn open(spec: &EmulatedDriveSpec, clock: Arc<dyn Clock>) -> std::io::Result<EmulatedDrive> {
        let name = spec.to_string();
        let store = MemDrive::open(name.clone(), spec.capacity_bytes, Backing::Sparse)?;
        let solid_state = matches!(spec.class.profile(), Profile::Ssd(_));
        let info = DriveInfo { name, kind: DriveKind::Emulated, capacity_bytes: spec.capacity_bytes, direct_io: true, solid_state };
        let state = State { model: build_model(spec), next_command_id: 0, held: HashMap::new(), owner_ctx: None };
        Ok(EmulatedDrive { info, class: spec.class, store, timing: Arc::new(Timing { clock, state: Mutex::new(state) }) })
    }

    /// The datasheet model this drive behaves like.
    pub fn model(&self) -> &'static str {
        self.class.model()
    }

    /// Virtual clock: the next instant at which the drive has a completion due or a decision to
    /// take; `None` when it is idle. Already-due completions give a time at or before now.
    pub fn next_due_ns(&self) -> Option<u64> {
        let mut state = self.timing.lock();
        state.decide_until(self.timing.clock.now_ns());
        let held = state.held.values().filter_map(|held| held.due_ns).min();
        [held, state.model.next_decision_ns()].into_iter().flatten().min()
    }

    /// Virtual clock: completes into `ctx` every operation due by now, earliest first; returns
    /// how many. With a real clock there is nothing to do (the `IoCtx` delivers), and it returns 0.
    ///
    /// # Panics
    /// If operations were submitted on another context: the simulator has exactly one.
    pub fn poll_due(&self, ctx: &mut IoCtx) -> usize {
        if !self.timing.is_virtual() {
            return 0;
        }
        let now_ns = self.timing.clock.now_ns();
        let mut state = self.timing.lock();
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

    /// Reads or writes the data now (`submit` checked its range): the model only decides when
    /// the caller sees the completion.
    fn store_now(&self, token: Token, op: DriveOp) -> Completion {
        self.store.serve_checked(token, op)
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

    /// A drive holding nothing may pass to another context (a simulator that starts afresh).
    fn claim_owner(&mut self, ctx: &IoCtx) {
        if self.held.is_empty() {
            self.owner_ctx = Some(ctx.id());
        }
        let owner = *self.owner_ctx.get_or_insert(ctx.id());
        assert_eq!(owner, ctx.id(), "an emulated drive on a virtual clock serves one IoCtx (the simulator's)");
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

    /// The data lives in its store; the timing model has no say in what reads return.
    fn reads_zero(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        self.store.reads_zero(offset_bytes, len_bytes)
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        let kind = op.kind();
        let (offset_bytes, len_bytes) = op.range_bytes().unwrap_or((0, 0));
        let completion = self.store_now(token, op);
        let mut state = self.timing.lock();
        // Read under the lock, so that racing shards reach the model in time order.
        let arrival_ns = self.timing.clock.now_ns();
        let command = Command { id: state.next_id(), kind, offset_bytes, len_bytes, arrival_ns };
        match self.timing.clock.wall_instant(0).is_some() {
            true => self.submit_real(state, ctx, command, completion),
            false => submit_virtual(&mut state, ctx, command, completion),
        }
    }
}

impl EmulatedDrive {
    /// Takes the decisions due by now; a command decided at once goes to the context with its
    /// due instant, one left in the queue stays here until a later decision (see the module docs).
    fn submit_real(&self, mut state: std::sync::MutexGuard<'_, State>, ctx: &mut IoCtx, command: Command, completion: Completion) {
        let mut decided = Vec::new();
        state.decide_until(command.arrival_ns);
        state.model.arrive(command, &mut decided);
        state.model.decide_until(command.arrival_ns, &mut decided);
        let own_due = decided.iter().position(|d| d.id == command.id).map(|index| decided.swap_remove(index));
        state.note_due(&decided);
        match own_due {
            Some(due) => {
                drop(state);
                ctx.complete_at(completion, self.timing.clock.wall_instant(due.due_ns).expect("a real clock has instants"));
            }
            None => {
                state.held.insert(command.id, Held { completion, due_ns: None, ctx_id: ctx.id() });
                drop(state);
                ctx.held_by(Arc::clone(&self.timing) as Arc<dyn DueSource>);
            }
        }
    }
}

impl Timing {
    /// Whether the drive holds every completion for the simulator (virtual clock).
    fn is_virtual(&self) -> bool {
        self.clock.wall_instant(0).is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("emulated drive state poisoned")
    }
}

impl DueSource for Timing {
    /// Decides what is due by now, hands over the context's due completions earliest first, and
    /// names the next instant that can change anything for the context: one of its completions
    /// coming due, or the next decision while any of its commands still waits to be decided.
    fn release_due(&self, ctx_id: u64, out: &mut VecDeque<Completion>) -> Option<Instant> {
        let mut state = self.lock();
        // Read under the lock, as at submit, so the model's time never runs backwards.
        let now_ns = self.clock.now_ns();
        state.decide_until(now_ns);
        let mut due: Vec<(u64, u64)> = state
            .held
            .iter()
            .filter(|(_, held)| held.ctx_id == ctx_id)
            .filter_map(|(id, held)| held.due_ns.filter(|d| *d <= now_ns).map(|d| (d, *id)))
            .collect();
        due.sort_unstable();
        for (_, id) in due {
            out.push_back(state.held.remove(&id).expect("listed above").completion);
        }
        let mut next_ns: Option<u64> = None;
        for held in state.held.values().filter(|held| held.ctx_id == ctx_id) {
            let at_ns = held.due_ns.or_else(|| state.model.next_decision_ns()).unwrap_or(now_ns);
            next_ns = Some(next_ns.map_or(at_ns, |n| n.min(at_ns)));
        }
        next_ns.map(|at_ns| self.clock.wall_instant(at_ns).expect("a real clock has instants"))
    }
}

/// Holds the completion; decisions wait until the clock reaches them.
fn submit_virtual(state: &mut State, ctx: &IoCtx, command: Command, completion: Completion) {
    state.claim_owner(ctx);
    state.decide_until(command.arrival_ns);
    state.held.insert(command.id, Held { completion, due_ns: None, ctx_id: ctx.id() });
    let mut decided = Vec::new();
    state.model.arrive(command, &mut decided);
    state.model.decide_until(command.arrival_ns, &mut decided);
    state.note_due(&decided);
}
