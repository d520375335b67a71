//! The shard runtime: a single-threaded executor whose only source of events is the shard's
//! [`IoCtx`].
//!
//! The RAID paths are written as `async fn`s (read old data, compute parity, write) because the
//! state machines they replace are long and easy to get wrong. The executor is ours, not a
//! general-purpose runtime, for two reasons: a shard must never block anywhere but in the
//! io_uring wait, and the simulator must decide the order of every completion from its seed.
//! A few hundred lines buy both.

use drive::{Completion, Drive, DriveError, DriveOp, IoBuf, IoCtx, ShardWaker, Token};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// Task ids woken since the last turn. Wakers must be `Send + Sync`, hence the mutex; only the
/// shard thread ever takes it, so it is never contended.
#[derive(Default)]
struct WakeQueue {
    woken: Mutex<Vec<usize>>,
}

struct TaskWaker {
    task_index: usize,
    queue: Arc<WakeQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.queue.woken.lock().expect("wake queue poisoned").push(self.task_index);
    }
}

/// The state of one drive operation between submit and the future that awaits it.
enum OpSlot {
    Waiting(Option<Waker>),
    Done(Completion),
    /// The awaiting future was dropped; the completion is discarded on arrival.
    Abandoned,
}

/// How completions are handed to tasks. The simulator shuffles them and holds some back so that
/// every interleaving a real drive set could produce gets exercised.
pub enum CompletionOrder {
    Fifo,
    Seeded(SmallRng),
}

/// Everything one shard owns. Tasks reach it through `Rc<Reactor>`.
pub struct Reactor {
    ctx: RefCell<IoCtx>,
    ops: RefCell<Vec<OpSlot>>,
    free_ops: RefCell<Vec<usize>>,
    order: RefCell<CompletionOrder>,
    held_back: RefCell<Vec<Completion>>,
    locks: RefCell<HashMap<LockKey, LockQueue>>,
    next_ticket: RefCell<u64>,
    /// Which shard this is (0 for a lone executor): picks the shard's slot of a VD's bitmap.
    shard_index: std::cell::Cell<usize>,
    /// Rouses the shard from its ring wait; `None` for a context without a ring, which never
    /// sleeps.
    ring_waker: Option<Arc<ShardWaker>>,
    /// Tasks spawned by tasks (the cache's destaging), handed to the executor at its next turn.
    spawned: RefCell<Vec<Pin<Box<dyn Future<Output = ()>>>>>,
    /// The shard's controller cache.
    cache: Rc<crate::cache::ShardCache>,
    /// Parity rows whose write waits for the rest of the row (`io::gather`).
    gathers: RefCell<HashMap<LockKey, Rc<crate::io::gather::Gather>>>,
}

/// Wakes a task from another thread: queues it and rouses its shard from the ring wait (a task
/// waker alone only queues it, which is enough for wakes from the shard's own thread).
#[derive(Clone)]
pub struct RemoteWaker {
    task: Waker,
    ring: Option<Arc<ShardWaker>>,
}

impl RemoteWaker {
    pub fn wake(self) {
        // Queued first: a shard that wakes finds the task in its queue.
        self.task.wake();
        if let Some(ring) = self.ring {
            ring.wake();
        }
    }
}

impl Reactor {
    pub fn new(mut ctx: IoCtx, order: CompletionOrder) -> Rc<Reactor> {
        let ring_waker = ctx.has_ring().then(|| ctx.waker());
        Rc::new(Reactor {
            ring_waker,
            ctx: RefCell::new(ctx),
            ops: RefCell::new(Vec::new()),
            free_ops: RefCell::new(Vec::new()),
            order: RefCell::new(order),
            held_back: RefCell::new(Vec::new()),
            locks: RefCell::new(HashMap::new()),
            next_ticket: RefCell::new(0),
            shard_index: std::cell::Cell::new(0),
            spawned: RefCell::new(Vec::new()),
            cache: Rc::new(crate::cache::ShardCache::new()),
            gathers: RefCell::new(HashMap::new()),
        })
    }

    /// The rows being gathered (`io::gather`).
    pub(crate) fn gathers(&self) -> &RefCell<HashMap<LockKey, Rc<crate::io::gather::Gather>>> {
        &self.gathers
    }

    /// The shard's controller cache.
    pub(crate) fn cache(&self) -> &Rc<crate::cache::ShardCache> {
        &self.cache
    }

    /// Starts a task from a task: it first runs at the executor's next turn.
    pub fn spawn(&self, task: impl Future<Output = ()> + 'static) {
        self.spawned.borrow_mut().push(Box::pin(task));
    }

    pub fn shard_index(&self) -> usize {
        self.shard_index.get()
    }

    pub fn set_shard_index(&self, index: usize) {
        self.shard_index.set(index);
    }

    /// A waker for the task polled with `cx` that another thread may call.
    pub fn remote_waker(&self, cx: &Context<'_>) -> RemoteWaker {
        RemoteWaker { task: cx.waker().clone(), ring: self.ring_waker.clone() }
    }

    pub fn ctx(&self) -> std::cell::RefMut<'_, IoCtx> {
        self.ctx.borrow_mut()
    }

    /// Starts `op` on `drive`; the returned future resolves with its completion.
    pub fn submit(&self, drive: &dyn Drive, op: DriveOp) -> DriveIo<'_> {
        let index = self.op_slot();
        drive.submit(&mut self.ctx.borrow_mut(), index as Token, op);
        DriveIo { reactor: self, index, finished: false }
    }

    /// A free operation slot, waiting for its completion.
    fn op_slot(&self) -> usize {
        let index = match self.free_ops.borrow_mut().pop() {
            Some(index) => index,
            None => {
                let mut ops = self.ops.borrow_mut();
                ops.push(OpSlot::Abandoned);
                ops.len() - 1
            }
        };
        self.ops.borrow_mut()[index] = OpSlot::Waiting(None);
        index
    }

    /// Resolves `delay` from now (a timer in the shard's ring wait: no thread of its own).
    pub fn sleep(&self, delay: std::time::Duration) -> DriveIo<'_> {
        let index = self.op_slot();
        self.ctx.borrow_mut().timer(index as Token, delay);
        DriveIo { reactor: self, index, finished: false }
    }

    /// Whether completions come in seeded order (the simulator), where nothing may depend on
    /// the wall clock.
    pub fn is_seeded(&self) -> bool {
        matches!(&*self.order.borrow(), CompletionOrder::Seeded(_))
    }

    /// Collects completions from the context and hands them to their futures. Returns how many
    /// were delivered. `wait` blocks in the ring when nothing is ready.
    fn deliver(&self, wait: bool) -> usize {
        let mut completions = std::mem::take(&mut *self.held_back.borrow_mut());
        let wait = wait && completions.is_empty();
        self.ctx.borrow_mut().poll(&mut completions, wait);
        self.reorder(&mut completions);
        let delivered = completions.len();
        for completion in completions {
            self.deliver_one(completion);
        }
        delivered
    }

    /// In seeded order: shuffle, then keep a random part back for a later turn.
    fn reorder(&self, completions: &mut Vec<Completion>) {
        let CompletionOrder::Seeded(rng) = &mut *self.order.borrow_mut() else { return };
        if completions.len() < 2 {
            return;
        }
        for i in (1..completions.len()).rev() {
            completions.swap(i, rng.gen_range(0..=i));
        }
        let keep = rng.gen_range(1..=completions.len());
        self.held_back.borrow_mut().extend(completions.drain(keep..));
    }

    fn deliver_one(&self, completion: Completion) {
        let index = completion.token as usize;
        let mut ops = self.ops.borrow_mut();
        match std::mem::replace(&mut ops[index], OpSlot::Abandoned) {
            OpSlot::Waiting(waker) => {
                ops[index] = OpSlot::Done(completion);
                drop(ops);
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            OpSlot::Abandoned => {
                drop(ops);
                self.free_ops.borrow_mut().push(index);
            }
            OpSlot::Done(_) => panic!("two completions for token {index}"),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.ctx.borrow().in_flight() + self.held_back.borrow().len()
    }

    /// A seeded coin for the simulator's own choices (None in FIFO order).
    pub fn seeded_choice(&self, upper: usize) -> Option<usize> {
        match &mut *self.order.borrow_mut() {
            CompletionOrder::Seeded(rng) => Some(rng.gen_range(0..upper.max(1))),
            CompletionOrder::Fifo => None,
        }
    }
}

/// Future of one drive operation.
pub struct DriveIo<'a> {
    reactor: &'a Reactor,
    index: usize,
    finished: bool,
}

/// What a drive operation returned: the result and the buffer.
pub struct DriveDone {
    pub result: Result<(), DriveError>,
    pub buf: Option<IoBuf>,
    /// The buffers of a vectored operation, in order.
    pub bufs: Vec<IoBuf>,
}

impl Future for DriveIo<'_> {
    type Output = DriveDone;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DriveDone> {
        let mut ops = self.reactor.ops.borrow_mut();
        match &mut ops[self.index] {
            OpSlot::Done(_) => {
                let OpSlot::Done(completion) = std::mem::replace(&mut ops[self.index], OpSlot::Abandoned) else { unreachable!() };
                drop(ops);
                self.reactor.free_ops.borrow_mut().push(self.index);
                self.finished = true;
                Poll::Ready(DriveDone { result: completion.result, buf: completion.buf, bufs: completion.bufs })
            }
            OpSlot::Waiting(waker) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
            OpSlot::Abandoned => panic!("polled a finished drive operation"),
        }
    }
}

impl Drop for DriveIo<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // The operation is still in the ring; its slot is freed when the completion arrives.
            let mut ops = self.reactor.ops.borrow_mut();
            if let OpSlot::Done(_) = ops[self.index] {
                ops[self.index] = OpSlot::Abandoned;
                drop(ops);
                self.reactor.free_ops.borrow_mut().push(self.index);
            } else {
                ops[self.index] = OpSlot::Abandoned;
            }
        }
    }
}

/// Resolves at the executor's next turn: tasks woken in this turn run first.
pub(crate) async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Identifies a lockable unit: one row of one virtual drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    pub vd_id: u64,
    pub row: u64,
}

#[derive(Default)]
struct LockQueue {
    /// Tickets in arrival order; the front one holds the lock.
    tickets: VecDeque<(u64, Option<Waker>)>,
}

impl Reactor {
    /// Queues for the lock on `key` now (so that locks are granted in call order, which keeps
    /// overlapping writes in submission order) and returns a future that resolves when held.
    pub fn lock(self: &Rc<Self>, key: LockKey) -> RowLock {
        let ticket = {
            let mut next = self.next_ticket.borrow_mut();
            *next += 1;
            *next
        };
        self.locks.borrow_mut().entry(key).or_default().tickets.push_back((ticket, None));
        RowLock { reactor: Rc::clone(self), key, ticket }
    }

    fn unlock(&self, key: LockKey, ticket: u64) {
        let mut locks = self.locks.borrow_mut();
        let queue = locks.get_mut(&key).expect("unlock of an unknown lock");
        let position = queue.tickets.iter().position(|(t, _)| *t == ticket).expect("unlock of a ticket not queued");
        queue.tickets.remove(position);
        match queue.tickets.front_mut() {
            None => {
                locks.remove(&key);
            }
            Some((_, waker)) if position == 0 => {
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
            }
            Some(_) => {}
        }
    }
}

/// A row lock: queued at creation, held once [`RowLock::acquired`] resolves, released (or
/// dequeued) on drop.
pub struct RowLock {
    reactor: Rc<Reactor>,
    key: LockKey,
    ticket: u64,
}

impl RowLock {
    /// Resolves when this ticket is at the front of the row's queue.
    pub async fn acquired(&self) {
        std::future::poll_fn(|cx| self.poll_held(cx)).await
    }

    fn poll_held(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut locks = self.reactor.locks.borrow_mut();
        let queue = locks.get_mut(&self.key).expect("queued lock vanished");
        if queue.tickets.front().map(|(ticket, _)| *ticket) == Some(self.ticket) {
            return Poll::Ready(());
        }
        let slot = queue.tickets.iter_mut().find(|(t, _)| *t == self.ticket).expect("ticket queued");
        slot.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for RowLock {
    fn drop(&mut self) {
        self.reactor.unlock(self.key, self.ticket);
    }
}

/// The executor: tasks plus the reactor they wait on.
pub struct Executor {
    reactor: Rc<Reactor>,
    tasks: Vec<Option<Task>>,
    free_tasks: Vec<usize>,
    wake_queue: Arc<WakeQueue>,
    wakers: Vec<Option<Waker>>,
    live_tasks: usize,
}

impl Executor {
    pub fn new(reactor: Rc<Reactor>) -> Executor {
        Executor {
            reactor,
            tasks: Vec::new(),
            free_tasks: Vec::new(),
            wake_queue: Arc::new(WakeQueue::default()),
            wakers: Vec::new(),
            live_tasks: 0,
        }
    }

    pub fn reactor(&self) -> &Rc<Reactor> {
        &self.reactor
    }

    /// Adds a task; it first runs at the next [`Executor::run_ready`].
    pub fn spawn(&mut self, task: impl Future<Output = ()> + 'static) {
        let index = self.free_tasks.pop().unwrap_or_else(|| {
            self.tasks.push(None);
            self.wakers.push(None);
            self.tasks.len() - 1
        });
        self.tasks[index] = Some(Box::pin(task));
        // A slot's waker names only the slot, so it is made once and serves every task the
        // slot holds: a waker left behind by an earlier task can only cause a spurious poll,
        // which a future must allow for anyway.
        if self.wakers[index].is_none() {
            let queue = Arc::clone(&self.wake_queue);
            self.wakers[index] = Some(Waker::from(Arc::new(TaskWaker { task_index: index, queue })));
        }
        self.wake_queue.woken.lock().expect("wake queue poisoned").push(index);
        self.live_tasks += 1;
    }

    pub fn live_tasks(&self) -> usize {
        self.live_tasks
    }

    /// Polls every woken task until none is woken. Returns whether any task ran.
    pub fn run_ready(&mut self) -> bool {
        let mut ran = false;
        loop {
            let spawned = std::mem::take(&mut *self.reactor.spawned.borrow_mut());
            for task in spawned {
                self.spawn(task);
            }
            let woken = std::mem::take(&mut *self.wake_queue.woken.lock().expect("wake queue poisoned"));
            if woken.is_empty() {
                return ran;
            }
            for index in woken {
                ran |= self.poll_task(index);
            }
        }
    }

    fn poll_task(&mut self, index: usize) -> bool {
        let Some(mut task) = self.tasks[index].take() else { return false };
        let waker = self.wakers[index].as_ref().expect("live task has a waker");
        let mut cx = Context::from_waker(waker);
        match task.as_mut().poll(&mut cx) {
            Poll::Ready(()) => {
                self.free_tasks.push(index);
                self.live_tasks -= 1;
            }
            Poll::Pending => self.tasks[index] = Some(task),
        }
        true
    }

    /// One turn: run ready tasks, then collect completions (blocking in the ring only if
    /// `may_sleep` and nothing is runnable). Returns whether anything happened.
    pub fn turn(&mut self, may_sleep: bool) -> bool {
        let ran = self.run_ready();
        let wait = may_sleep && !ran;
        let delivered = self.reactor.deliver(wait);
        ran || delivered > 0
    }
}

impl CompletionOrder {
    pub fn seeded(seed: u64) -> CompletionOrder {
        CompletionOrder::Seeded(SmallRng::seed_from_u64(seed))
    }
}
