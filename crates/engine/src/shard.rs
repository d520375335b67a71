//! A shard's thread: its loop, the messages it serves, and the ticker that nudges its cache.

use crate::fast_path::FastIo;
use crate::runtime::{CompletionOrder, Executor, Reactor};
use crate::{cache, io, EngineConfig, RowJob, ShardHandle, ShardLink, ShardMsg, VdRequest, VirtualDrive};
use crossbeam_channel::{Receiver, Sender};
use drive::{Completion, IoCtx, IoCtxConfig, ShardWaker};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub(crate) fn start_shard(index: usize, config: EngineConfig) -> std::io::Result<ShardHandle> {
    let (inbox_tx, inbox_rx) = crossbeam_channel::bounded(config.inbox_depth);
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let stopped = Arc::new(AtomicBool::new(false));
    let shard_stopped = Arc::clone(&stopped);
    let thread = std::thread::Builder::new().name(format!("storc-shard-{index}")).spawn(move || {
        let ctx = match IoCtx::new(IoCtxConfig { ring_entries: config.ring_entries }) {
            Ok(ctx) => ctx,
            Err(error) => return ready_tx.send(Err(error)).expect("starter waits"),
        };
        let _stop_taking = StopTaking { stopped: &shard_stopped, inbox: &inbox_rx };
        shard_main(index, config, ctx, &inbox_rx, ready_tx);
    })?;
    let (waker, clean_lines) = ready_rx.recv().expect("shard reports whether it started")?;
    let waker_addr = Arc::as_ptr(&waker) as usize;
    Ok(ShardHandle { link: Arc::new(ShardLink { inbox: inbox_tx, waker, stopped }), waker_addr, clean_lines, thread: Some(thread) })
}

/// A stopped shard (returned or panicked) takes no more messages: senders see `stopped` and
/// drop theirs, and what came before they saw it is dropped here. A message left in the inbox would live as long as
/// the channel, which every holder of a `Router` keeps open (an SSD cache's destager among
/// them), its completion never called nor dropped. (A sender that looked just before the flag
/// was set may still leave one: so no thread outside the engine may wait on a completion
/// without also watching `Router::stopped`.)
struct StopTaking<'a> {
    stopped: &'a AtomicBool,
    inbox: &'a Receiver<ShardMsg>,
}

impl Drop for StopTaking<'_> {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.inbox.try_iter().for_each(drop);
    }
}

thread_local! {
    /// The shard this thread runs, as the address of its waker (0 on other threads), so that
    /// a message for it can be told from one for another shard.
    static CURRENT_SHARD: Cell<usize> = const { Cell::new(0) };
    /// Messages a shard sent itself: taken by its loop without the inbox's atomics and the
    /// eventfd write a wake-up costs (the shard is awake, running the task that sent them),
    /// and never blocked by its own full inbox. Bounded by the work in flight that sent them.
    static OWN_MSGS: RefCell<VecDeque<ShardMsg>> = const { RefCell::new(VecDeque::new()) };
    /// Fast Path requests a shard sent itself, as [`OWN_MSGS`] but unboxed: one allocation
    /// less on the path that exists to be short.
    static OWN_FAST: RefCell<VecDeque<FastIo>> = const { RefCell::new(VecDeque::new()) };
    /// Every shard of this shard's engine (see [`ShardMsg::Links`]).
    static LINKS: RefCell<Option<Arc<[Arc<ShardLink>]>>> = const { RefCell::new(None) };
}

/// The address of the waker of the shard this thread runs; 0 on a thread that is no shard.
pub(crate) fn current_waker_addr() -> usize {
    CURRENT_SHARD.with(Cell::get)
}

/// Whether this thread is the shard that `waker` wakes.
pub(crate) fn is_current(waker: &Arc<ShardWaker>) -> bool {
    current_waker_addr() == Arc::as_ptr(waker) as usize
}

/// Queues a Fast Path request for the shard this thread runs.
pub(crate) fn send_own_fast(io: FastIo) {
    OWN_FAST.with(|own| own.borrow_mut().push_back(io));
}

/// Sends `msg` to shard `index` of this shard's engine, from a task on one of its shards.
pub(crate) fn send_to_shard(index: usize, msg: ShardMsg) {
    let link = LINKS.with(|links| links.borrow().as_ref().map(|links| Arc::clone(&links[index])));
    link.expect("a shard knows its engine's shards before its first request").send(msg);
}

/// The shard that owns `row` of `vd`, from a task on one of its engine's shards.
pub(crate) fn shard_of_row(vd: &VirtualDrive, row: u64) -> usize {
    let shard_count = LINKS.with(|links| links.borrow().as_ref().map(|links| links.len()));
    crate::router::shard_of_row_among(vd, row, shard_count.expect("a shard knows its engine's shards before its first request"))
}

/// Queues a message for the shard this thread runs (see [`is_current`]).
pub(crate) fn send_own(msg: ShardMsg) {
    OWN_MSGS.with(|own| own.borrow_mut().push_back(msg));
}

/// What a started shard hands its engine: its waker, and its clean cache's lines (for hits).
type ReadyTx = std::sync::mpsc::SyncSender<std::io::Result<(Arc<ShardWaker>, cache::SharedLines)>>;

/// How often the shards' caches are nudged (age-limited destaging, checkpoints).
const TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// The thread that sends every shard a [`ShardMsg::Tick`] each [`TICK`] until its channel
/// closes. A tick is skipped for a shard whose inbox is full: it is busy anyway.
pub(crate) fn start_ticker(shards: Vec<(Sender<ShardMsg>, Arc<ShardWaker>)>) -> std::io::Result<(Sender<()>, JoinHandle<()>)> {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let thread = std::thread::Builder::new().name("storc-cache-tick".into()).spawn(move || {
        while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(TICK) {
            for (inbox, waker) in &shards {
                if inbox.try_send(ShardMsg::Tick).is_ok() {
                    waker.wake();
                }
            }
        }
    })?;
    Ok((stop_tx, thread))
}

/// Bytes of freed scratch buffers a shard keeps for reuse (`drive::heap_cache`): a few
/// hundred of the row images, parity strips and cache copies a burst of writes makes, so that
/// most allocations skip malloc's aligned path.
const HEAP_CACHE_IDLE_BYTES_MAX: usize = 16 << 20;

/// A shard's loop: take messages, run tasks, sleep in the ring when there is nothing to do.
fn shard_main(index: usize, config: EngineConfig, mut ctx: IoCtx, inbox: &Receiver<ShardMsg>, ready: ReadyTx) {
    drive::heap_cache::enable(HEAP_CACHE_IDLE_BYTES_MAX);
    let waker = ctx.waker();
    CURRENT_SHARD.with(|current| current.set(Arc::as_ptr(&waker) as usize));
    let reactor = Reactor::new(ctx, CompletionOrder::Fifo);
    reactor.set_shard_index(index);
    reactor.cache().set_limit_bytes(config.cache_bytes / config.shard_count as u64);
    ready.send(Ok((Arc::clone(&waker), reactor.cache().clean_lines()))).expect("starter waits");
    let mut executor = Executor::new(Rc::clone(&reactor));
    let mut stopping = false;
    // What the own queues held, taken by swapping: each queue keeps a buffer as large as its
    // largest batch, where taking it whole would free it and have the next turn's sends grow a
    // new one, a few reallocations per turn.
    let (mut own_msgs, mut own_fast) = (VecDeque::new(), VecDeque::new());
    loop {
        while let Ok(msg) = inbox.try_recv() {
            stopping |= spawn_msg(&mut executor, msg);
        }
        OWN_MSGS.with(|own| std::mem::swap(&mut *own.borrow_mut(), &mut own_msgs));
        for msg in own_msgs.drain(..) {
            stopping |= spawn_msg(&mut executor, msg);
        }
        OWN_FAST.with(|own| std::mem::swap(&mut *own.borrow_mut(), &mut own_fast));
        for io in own_fast.drain(..) {
            executor.spawn(crate::fast_path::serve(Rc::clone(executor.reactor()), io));
        }
        if stopping && executor.live_tasks() == 0 && reactor.in_flight() == 0 {
            return;
        }
        waker.prepare_sleep();
        let own_work = OWN_MSGS.with(|own| !own.borrow().is_empty()) || OWN_FAST.with(|own| !own.borrow().is_empty());
        if !inbox.is_empty() || own_work {
            waker.cancel_sleep();
            continue;
        }
        executor.turn(true);
        waker.cancel_sleep();
    }
}

/// Turns a message into a task. Returns whether it asked the shard to stop.
fn spawn_msg(executor: &mut Executor, msg: ShardMsg) -> bool {
    let reactor = Rc::clone(executor.reactor());
    match msg {
        ShardMsg::Request { vd, request, done, bypass } => {
            let write = matches!(request, VdRequest::Write { .. });
            executor.spawn(async move {
                let completion = cache::serve(reactor, Arc::clone(&vd), request, bypass).await;
                vd.finish(completion, done, write);
            });
            false
        }
        ShardMsg::Fast(io) => {
            executor.spawn(crate::fast_path::serve(reactor, *io));
            false
        }
        ShardMsg::Prefetch { vd, range } => {
            executor.spawn(async move {
                cache::prefetch(reactor, Arc::clone(&vd), range).await;
                vd.end_request();
            });
            false
        }
        ShardMsg::Raw { drive, op, done } => {
            executor.spawn(async move {
                let finished = reactor.submit(&*drive, op).await;
                done(Completion { token: 0, result: finished.result, buf: finished.buf, bufs: finished.bufs });
            });
            false
        }
        ShardMsg::Row { vd, row, job } => {
            executor.spawn(async move {
                run_row_job(reactor, &vd, row, job).await;
                vd.end_request();
            });
            false
        }
        ShardMsg::CleanIntent { vd, stopping, done } => {
            executor.spawn(async move {
                done(io::clean_write_intent(reactor, Arc::clone(&vd), stopping).await);
                vd.end_request();
            });
            false
        }
        ShardMsg::Journal(specs) => {
            let (data, images) = specs.map_or((None, None), |(data, images)| (Some(data), images));
            reactor.cache().set_images(images.map(|spec| Rc::new(spec.build())));
            reactor.cache().set_journal(data.map(|spec| Rc::new(spec.build())));
            false
        }
        ShardMsg::Forget { vd, done } => {
            reactor.cache().forget(&vd);
            executor.spawn(async move { done(cache::quiesce(&reactor).await) });
            false
        }
        ShardMsg::Stats { done } => {
            done(reactor.cache().stats());
            false
        }
        ShardMsg::Tick => {
            cache::tick(&reactor);
            false
        }
        ShardMsg::Links(links) => {
            LINKS.with(|own| *own.borrow_mut() = Some(links));
            false
        }
        ShardMsg::Quiesce { done } => {
            executor.spawn(async move { done(cache::quiesce(&reactor).await) });
            false
        }
        ShardMsg::ImagesToHead { done } => {
            executor.spawn(async move { done(cache::images_to_head(&reactor).await) });
            false
        }
        ShardMsg::Stop => true,
    }
}

async fn run_row_job(reactor: Rc<Reactor>, vd: &Arc<VirtualDrive>, row: u64, job: RowJob) {
    match job {
        RowJob::Rebuild { row_count, targets, done } => done(cache::rebuilt_rows(reactor, vd, row, row_count, targets).await),
        RowJob::Check { row_count, mode, done } => done(cache::checked_rows(reactor, vd, row, row_count, mode).await),
        RowJob::Copy { member, done } => done(io::copy_row(reactor, Arc::clone(vd), row, member).await),
        RowJob::Migrate { row_count, done } => done(io::migrate_rows(reactor, Arc::clone(vd), row, row_count).await),
    }
}
