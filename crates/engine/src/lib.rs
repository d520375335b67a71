//! The storc engine: virtual drives over member drives, and the threads that serve them.
//!
//! # Design
//!
//! Thread per core. The engine runs as N shards, each one thread with its own io_uring
//! ([`drive::IoCtx`]) and its own small executor ([`runtime`]). The rows of every VD are dealt
//! to shards in strides of about 1 MiB ([`SHARD_STRIDE_BYTES`]): the shard that owns a row is the
//! only one that locks it, so row locks are plain single-threaded queues; a sequential 1 MiB
//! request stays on one shard, where its member I/Os merge; a larger one is served by several
//! shards at once. Frontends
//! (NBD, the benchmark) call [`Engine::submit`] from their own threads; it cuts the request at
//! row boundaries, queues each piece to its shard and completes the caller's callback when the
//! last piece is done.
//!
//! The I/O paths ([`io`]) are `async fn`s over the [`drive::Drive`] interface only. They run
//! unchanged in [`LocalEngine`], a single shard on the caller's thread whose completion order is
//! chosen by a seed: that is how the simulator explores interleavings and replays a failure.
//!
//! The engine knows nothing of NBD, HTTP or JSON, and does no blocking system call on a shard.

pub mod background;
pub mod bitmap;
pub mod cache;
pub mod config;
pub mod controller;
pub mod fast_path;
pub mod io;
mod join;
pub mod journal;
mod local;
pub mod metadata;
mod router;
mod row_jobs;
pub mod runtime;
mod shard;
pub mod ssd_cache;
pub mod vd;

pub use local::LocalEngine;
pub use runtime::CompletionOrder;
pub use vd::{
    CheckMode, CheckOutcome, ClientIoStats, GatherCounts, IoKind, IoKindSnapshot, Member, MemberEvent, MemberSet, MemberState, Mismatch,
    VdCompletion, VdError, VdLayout, VdRequest, VdState, VirtualDrive, LATENCY_BUCKET_BOUNDS_NS, MEMBER_RESERVED_BYTES,
};

use crossbeam_channel::Sender;
use drive::{Completion, Drive, DriveOp, IoBuf, ShardWaker};
use join::validate;
use row_jobs::RowJob;
use shard::{start_shard, start_ticker};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Called once with the outcome of a request, on a shard thread.
pub type Done = Box<dyn FnOnce(VdCompletion) + Send>;
/// Called once with the completion of a raw drive operation, on a shard thread.
pub type RawDone = Box<dyn FnOnce(Completion) + Send>;
/// Called once with the outcome of a row rebuild, on a shard thread.
pub type RebuildDone = Box<dyn FnOnce(Result<(), VdError>) + Send>;
/// Called once with the outcome of each row of a run of rebuilt rows, in row order, on a shard
/// thread.
pub type RebuildRunDone = Box<dyn FnOnce(Vec<Result<(), VdError>>) + Send>;
/// Called once with the outcome of a row check, on a shard thread.
pub type CheckDone = Box<dyn FnOnce(Result<CheckOutcome, VdError>) + Send>;
/// Called once with the outcome of each row of a run of checked rows, in row order, on a shard
/// thread.
pub type CheckRunDone = Box<dyn FnOnce(Vec<Result<CheckOutcome, VdError>>) + Send>;

#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Shard threads; default: one per core.
    pub shard_count: usize,
    /// io_uring submission queue entries per shard.
    pub ring_entries: u32,
    /// Messages a shard's inbox holds before submitters block (back-pressure).
    pub inbox_depth: usize,
    /// The controller cache, shared equally by the shards (`--cache-size`).
    pub cache_bytes: u64,
    /// How far RA (`rdcache=ra`) reads past every read (`--read-ahead`).
    pub read_ahead_bytes: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(bitmap::ondisk::SHARD_SLOTS_MAX);
        EngineConfig {
            shard_count: cores,
            ring_entries: 512,
            inbox_depth: 4096,
            cache_bytes: cache::DEFAULT_CACHE_BYTES,
            read_ahead_bytes: vd::policy::DEFAULT_READ_AHEAD_BYTES,
        }
    }
}

enum ShardMsg {
    Request {
        vd: Arc<VirtualDrive>,
        request: VdRequest,
        done: Done,
        /// A write of a sequential stream that may go around the journal (`vd::journal_bypass`).
        bypass: bool,
    },
    /// A read or write served straight by one member (see `fast_path`).
    Fast(Box<fast_path::FastIo>),
    /// Read a range (owned by the shard) into the cache ahead of the client.
    Prefetch {
        vd: Arc<VirtualDrive>,
        range: std::ops::Range<u64>,
    },
    Raw {
        drive: Arc<dyn Drive>,
        op: DriveOp,
        done: RawDone,
    },
    Row {
        vd: Arc<VirtualDrive>,
        row: u64,
        job: RowJob,
    },
    CleanIntent {
        vd: Arc<VirtualDrive>,
        stopping: bool,
        done: CleanDone,
    },
    /// The shard's journal partition from now on (`None`: no journal).
    /// The shard's data partition of the journal and, if it has them, its image partition.
    Journal(Option<(journal::PartSpec, Option<journal::PartSpec>)>),
    /// Drop a deleted VD's cached data, then write everything else out and empty the journal.
    Forget {
        vd: Arc<VirtualDrive>,
        done: ShardDone,
    },
    /// The cache's periodic nudge: destage what grew old, checkpoint the journal.
    Tick,
    /// Every shard of the engine, sent once at start: where a task on this shard sends work
    /// that another shard owns (a Fast Path read's fallback).
    Links(Arc<[Arc<ShardLink>]>),
    /// The cache's counters (see [`Engine::cache_stats`]).
    Stats {
        done: Box<dyn FnOnce(cache::CacheStats) + Send>,
    },
    /// Write everything cached out (see [`Engine::quiesce`]).
    Quiesce {
        done: ShardDone,
    },
    /// Checkpoint the journal's row images past everything logged (see
    /// [`Engine::images_to_head`]).
    ImagesToHead {
        done: ShardDone,
    },
    Stop,
}

/// Called on a shard thread with the outcome of a quiesce, a forget or an image checkpoint.
pub type ShardDone = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Called on a shard thread with the outcome of a bitmap clean pass.
pub type CleanDone = Box<dyn FnOnce(Result<(), VdError>) + Send>;

struct ShardHandle {
    link: Arc<ShardLink>,
    /// `link.waker`'s address, here in the engine's own (read-only) memory: telling whether
    /// this thread is the shard touches no line that the shard's threads write.
    waker_addr: usize,
    /// The shard's clean cache lines: hits are served from them on the submitting thread.
    clean_lines: cache::SharedLines,
    thread: Option<JoinHandle<()>>,
}

/// Where a shard's messages go: its inbox, and the waker that gets it out of its ring's wait.
pub(crate) struct ShardLink {
    inbox: Sender<ShardMsg>,
    waker: Arc<ShardWaker>,
    /// The shard's thread has ended (the engine stopped): a message sent now would never be
    /// served, so it is dropped with its completion.
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl ShardLink {
    /// Queues `msg` for the shard: in the shard's own queue when this thread is that shard.
    pub(crate) fn send(&self, msg: ShardMsg) {
        if shard::is_current(&self.waker) {
            return shard::send_own(msg);
        }
        if self.is_stopped() {
            return drop(msg);
        }
        if self.inbox.send(msg).is_ok() {
            self.waker.wake();
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ShardHandle {
    fn send(&self, msg: ShardMsg) {
        self.link.send(msg);
    }

    /// Whether this thread is this shard.
    fn is_current(&self) -> bool {
        shard::current_waker_addr() == self.waker_addr
    }
}

/// The running engine: shard threads serving any number of virtual drives.
pub struct Engine {
    shards: Vec<ShardHandle>,
    /// Cuts requests into shards' pieces (the same links as `shards`).
    router: router::Router,
    /// Stops the ticker thread when the engine is dropped.
    ticker: Option<(Sender<()>, JoinHandle<()>)>,
    cache_bytes: u64,
    read_ahead_bytes: u64,
    /// A journal was attached once: Fast Path writes are off from then on (see
    /// `fast_path::write`).
    journal_attached: std::sync::atomic::AtomicBool,
}

impl Engine {
    /// Starts the shard threads.
    ///
    /// # Errors
    /// If a shard cannot set up its io_uring (the message says what the kernel lacks).
    pub fn start(config: EngineConfig) -> std::io::Result<Engine> {
        assert!(config.shard_count > 0, "an engine needs at least one shard");
        if config.shard_count > bitmap::ondisk::SHARD_SLOTS_MAX {
            let message = format!(
                "{} shards asked for; at most {} are allowed (one write-intent bitmap slot each)",
                config.shard_count,
                bitmap::ondisk::SHARD_SLOTS_MAX
            );
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, message));
        }
        let mut shards = Vec::with_capacity(config.shard_count);
        for index in 0..config.shard_count {
            shards.push(start_shard(index, config)?);
        }
        let links: Arc<[Arc<ShardLink>]> = shards.iter().map(|s| Arc::clone(&s.link)).collect();
        for shard in &shards {
            shard.send(ShardMsg::Links(Arc::clone(&links)));
        }
        let ticker = start_ticker(shards.iter().map(|s| (s.link.inbox.clone(), Arc::clone(&s.link.waker))).collect())?;
        Ok(Engine {
            router: router::Router::new(links),
            shards,
            ticker: Some(ticker),
            cache_bytes: config.cache_bytes,
            read_ahead_bytes: config.read_ahead_bytes,
            journal_attached: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The controller cache's size, over every shard.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes
    }

    /// The cache's counters, summed over the shards. Blocks until every shard answered:
    /// control plane only.
    pub fn cache_stats(&self) -> cache::CacheStats {
        let (tx, rx) = std::sync::mpsc::channel();
        for shard in &self.shards {
            let tx = tx.clone();
            shard.send(ShardMsg::Stats {
                done: Box::new(move |stats| {
                    let _ = tx.send(stats);
                }),
            });
        }
        drop(tx);
        rx.iter().take(self.shards.len()).fold(cache::CacheStats::default(), |sum, stats| sum.plus(&stats))
    }

    /// Hands each shard its partition of `journal` (which must have one per shard), or takes
    /// the journal away (`None`).
    pub fn set_journal(&self, journal: Option<&journal::Journal>) {
        if journal.is_some() {
            // Before any shard takes the journal: no Fast Path write may skip it.
            self.journal_attached.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some(journal) = journal {
            assert_eq!(journal.superblock().partition_count as usize, self.shards.len(), "a journal has a partition per shard");
        }
        for (index, shard) in self.shards.iter().enumerate() {
            shard.send(ShardMsg::Journal(journal.map(|j| j.shard_specs(index as u32))));
        }
    }

    /// Writes everything cached to the members, makes it durable there, and checkpoints a
    /// healthy journal to its head. Blocks until every shard is done: control plane only.
    ///
    /// # Errors
    /// The first shard's failure (cached data that cannot be written).
    pub fn quiesce(&self) -> Result<(), String> {
        self.on_every_shard(|done| ShardMsg::Quiesce { done })
    }

    /// Checkpoints every shard's row images (the journal's parity log) past everything logged
    /// so far, the members flushed first: before a rebuild writes a member that missed row
    /// writes, so that no older image can be replayed onto what the rebuild puts there. Blocks
    /// until every shard is done: control plane only.
    ///
    /// # Errors
    /// The first shard's failure (a member flush that failed).
    pub fn images_to_head(&self) -> Result<(), String> {
        self.on_every_shard(|done| ShardMsg::ImagesToHead { done })
    }

    /// Drops a deleted VD's cached data on every shard, then writes everything else cached to
    /// the members and empties the journal, so that no record of the VD can be replayed into
    /// a VD that takes its id later. Blocks until every shard is done: control plane only.
    ///
    /// # Errors
    /// The first shard's failure (cached data of another VD that cannot be written).
    pub fn forget(&self, vd: &Arc<VirtualDrive>) -> Result<(), String> {
        self.on_every_shard(|done| ShardMsg::Forget { vd: Arc::clone(vd), done })
    }

    /// Sends every shard the message `message` makes of its completion, and waits for all of
    /// them: the first failure, or `Ok`. Control plane only.
    fn on_every_shard(&self, message: impl Fn(ShardDone) -> ShardMsg) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        for shard in &self.shards {
            let tx = tx.clone();
            shard.send(message(Box::new(move |result| drop(tx.send(result)))));
        }
        drop(tx);
        rx.iter().take(self.shards.len()).collect()
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Queues a request; `done` runs on a shard thread when it completes. Bad requests
    /// (misaligned, past the end) complete at once with an error and touch nothing.
    pub fn submit(&self, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        // Counted in flight from here, before the hold is looked at: a migration's hold waits
        // for the VD to be idle, so no request slips past it uncounted (see `vd::migration`).
        vd.begin_request();
        let Some((request, done)) = vd.park_if_held(request, done) else { return vd.end_request() };
        // Looked for after the hold: a release sets the successor before it ends the hold.
        if let Some(successor) = vd.successor() {
            // A migration ended: the VD lives on the drive it was copied to.
            vd.end_request();
            return self.submit(&Arc::clone(successor), request, done);
        }
        self.submit_entered(vd, request, done);
    }

    /// [`Engine::submit`] once the request is past a migration's hold, counted in flight;
    /// the count ends here, or goes with the request down the Fast Path.
    fn submit_entered(&self, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        if let Err(error) = validate(vd, &request) {
            done(VdCompletion { result: Err(error), buf: request.into_buf() });
            return vd.end_request();
        }
        vd.note_client_request();
        if let Some(cache) = vd.ssd_cache().get() {
            if vd.ssd_cache().is_lost() {
                let error = VdError::SsdCacheLost { vd: vd.name(), cache_vd: cache.cache_vd().name() };
                done(VdCompletion { result: Err(error), buf: request.into_buf() });
                return vd.end_request();
            }
            cache.submit(self, vd, request, done);
            return vd.end_request();
        }
        self.submit_counted(vd, request, done);
    }

    /// [`Engine::submit`] past the SSD cache: the path of a cached VD's misses and writes.
    pub(crate) fn submit_direct(&self, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        vd.begin_request();
        self.submit_counted(vd, request, done);
    }

    /// The path of every request of a VD without an SSD cache, counted in flight by the
    /// caller. A Fast Path request or a clean-cache hit keeps that count until it finishes: that saves two atomic
    /// read-modify-writes on the path that exists to be short. Any other way ends it once the
    /// request is handed on, whose pieces count themselves.
    fn submit_counted(&self, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        match request {
            VdRequest::Flush => self.router.flush(vd, done),
            VdRequest::Read { offset_bytes, buf } => {
                let range = offset_bytes..offset_bytes + buf.len() as u64;
                // A hit or a Fast Path read keeps the entry's count to its end.
                let served =
                    self.cache_hit(vd, offset_bytes, buf, done).or_else(|(buf, done)| self.fast_io(vd, false, offset_bytes, buf, done));
                let served_here = served.is_ok();
                if let Err((buf, done)) = served {
                    self.router.submit_pieces(vd, offset_bytes, buf, router::Piece::READ, done);
                }
                // A hit moves a stream on as a miss does: its read-ahead keeps ahead of it.
                if let Some(ahead) = read_ahead_for(vd, range, self.read_ahead_bytes) {
                    self.prefetch(vd, ahead);
                }
                if served_here {
                    return;
                }
            }
            VdRequest::Write { offset_bytes, buf } => {
                // Write gathering's streams (`io::gather`).
                let done = vd::write_streams::track(vd, offset_bytes, buf.len() as u64, done);
                let (buf, done) = match self.fast_io(vd, true, offset_bytes, buf, done) {
                    Ok(()) => return,
                    Err(back) => back,
                };
                let bypass = vd.note_write_for_bypass(offset_bytes, buf.len() as u64);
                self.router.submit_pieces(vd, offset_bytes, buf, router::Piece { write: true, bypass }, done);
            }
        }
        vd.end_request();
    }

    /// Whether a journal was ever attached to this engine.
    pub(crate) fn journal_attached(&self) -> bool {
        self.journal_attached.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sends each shard its part of a read-ahead, counted in the VD's requests in flight.
    fn prefetch(&self, vd: &Arc<VirtualDrive>, range: std::ops::Range<u64>) {
        let mut start = range.start;
        let mut shard: Option<usize> = None;
        for row in vd.geometry().rows(range.start, range.end - range.start) {
            let row_shard = self.shard_of_row(vd, row.row);
            if let Some(previous) = shard.filter(|&s| s != row_shard) {
                vd.begin_request();
                self.shards[previous].send(ShardMsg::Prefetch { vd: Arc::clone(vd), range: start..row.vd_offset_bytes });
                start = row.vd_offset_bytes;
            }
            shard = Some(row_shard);
        }
        vd.begin_request();
        self.shards[shard.expect("a read-ahead is never empty")].send(ShardMsg::Prefetch { vd: Arc::clone(vd), range: start..range.end });
    }

    /// The shard that owns `row` of `vd` (see [`router::Router::shard_of_row`]).
    fn shard_of_row(&self, vd: &VirtualDrive, row: u64) -> usize {
        self.router.shard_of_row(vd, row)
    }

    /// Runs one operation on a drive directly, bypassing every RAID layer: the baseline the
    /// benchmark compares virtual drives with. `shard` picks the shard (modulo the count).
    pub fn submit_raw(&self, shard: usize, drive: &Arc<dyn Drive>, op: DriveOp, done: RawDone) {
        let shard = shard % self.shards.len();
        self.shards[shard].send(ShardMsg::Raw { drive: Arc::clone(drive), op, done });
    }

    /// Submits and waits: for tests, tools and the control plane, never for the data path.
    pub fn run(&self, vd: &Arc<VirtualDrive>, request: VdRequest) -> VdCompletion {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(vd, request, Box::new(move |completion| tx.send(completion).expect("waiter is alive")));
        rx.recv().unwrap_or(VdCompletion { result: Err(VdError::Stopped), buf: None })
    }

    /// Reads `len_bytes` at `offset_bytes`, waiting for the result.
    ///
    /// # Errors
    /// What the VD reported.
    pub fn read_at(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, VdError> {
        let done = self.run(vd, VdRequest::Read { offset_bytes, buf: IoBuf::zeroed(len_bytes) });
        done.result.map(|()| done.buf.expect("a read returns its buffer"))
    }

    /// Writes `data` at `offset_bytes`, waiting for the result.
    ///
    /// # Errors
    /// What the VD reported.
    pub fn write_at(&self, vd: &Arc<VirtualDrive>, offset_bytes: u64, data: &[u8]) -> Result<(), VdError> {
        self.run(vd, VdRequest::Write { offset_bytes, buf: IoBuf::from_slice(data) }).result
    }

    /// Flushes, waiting for the result.
    ///
    /// # Errors
    /// What the VD reported.
    pub fn flush(&self, vd: &Arc<VirtualDrive>) -> Result<(), VdError> {
        self.run(vd, VdRequest::Flush).result
    }
}

impl Drop for Engine {
    /// Lets in-flight requests finish, then stops the shard threads.
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.ticker.take() {
            drop(stop);
            let _ = thread.join();
        }
        for shard in &self.shards {
            shard.send(ShardMsg::Stop);
        }
        for shard in &mut self.shards {
            if let Some(thread) = shard.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// What to read ahead of a client read of `range`, whole pages only (see [`vd::policy`]).
fn read_ahead_for(vd: &VirtualDrive, range: std::ops::Range<u64>, ra_bytes: u64) -> Option<std::ops::Range<u64>> {
    let page = cache::clean::PAGE_BYTES;
    let ahead = vd.policies().read_ahead(range, vd.capacity_bytes(), ra_bytes)?;
    let ahead = ahead.start.next_multiple_of(page)..ahead.end / page * page;
    (ahead.start < ahead.end).then_some(ahead)
}

/// VD bytes a shard owns in a row before the next shard's turn: large enough that a 1 MiB
/// sequential request usually stays on one shard, where its member I/Os can be merged.
pub const SHARD_STRIDE_BYTES: u64 = 1 << 20;

/// Consecutive rows that belong to one shard.
fn shard_stride_rows(geometry: &layout::Geometry) -> u64 {
    SHARD_STRIDE_BYTES.div_ceil(geometry.row_data_bytes()).max(1)
}

/// The rows a background run may cover on one shard: runs aligned to this many rows are served
/// by one shard, with member I/Os of up to this many strips.
pub fn run_rows_for(geometry: &layout::Geometry) -> u64 {
    shard_stride_rows(geometry)
}

#[cfg(test)]
mod tests;
