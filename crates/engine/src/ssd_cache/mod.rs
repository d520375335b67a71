//! SSD caching (seed 003's CacheCade): the hot 64 KiB lines of VDs on hard disks kept on a
//! *cache VD*, itself a VD of any level (RAID0 for speed, RAID1/10 to survive an SSD's loss),
//! usually on SSDs. One cache VD may serve several VDs.
//!
//! ```text
//! Engine::submit(vd) ──▶ SsdCache::submit ──┬─ read, every line valid ─▶ cache VD (one read per line)
//!                                           ├─ read, a miss ─▶ the VD's own path ─▶ client
//!                                           │        └─ second miss of a line ─▶ fill: the line from the VD ─▶ cache VD
//!                                           ├─ write, write-through ─▶ the VD, and the cache VD for lines it holds ─▶ client
//!                                           └─ write, write-back ─▶ the cache VD for lines it holds (dirty), the VD for the rest ─▶ client
//!                                                                    └─ destage (watermarks, idle, detach) ─▶ the VD, in LBA order
//! ```
//!
//! A write-through cache has every write reach the VD before it is acknowledged: the cache VD
//! never holds the only copy of anything, and losing it loses nothing. A write-back cache
//! ([`write_back`]) keeps writes to the lines it holds on the cache VD only, as dirty lines
//! named in a table on the cache VD that a restart after a crash reads back ([`map`]), and
//! destages them later ([`destage`]); a lost cache VD then loses data, so its VDs with dirty
//! lines go offline ([`Attachment::mark_lost`]) rather than serve what their members hold.
//! A RAID1 or RAID10 cache VD survives one SSD's loss like any VD. What lines a cache holds,
//! how they are admitted and evicted, and the rules that keep each equal to (or newer than)
//! its VD are in [`lines`]. A sequential stream past [`SsdCacheOptions::sequential_cutoff_bytes`] (4 MiB,
//! bcache's default) is served from the cache where it hits but promotes nothing, so a scan does
//! not displace the hot set.
//!
//! The tier sits above the engine's normal path: the VD's misses and writes take the path a
//! request without the tier takes (its own controller cache, read-ahead and Fast Path apply),
//! and the cache VD is read and written through the shards like any VD, so its level, its
//! member failures and its rebuilds are those of any VD. Fills are issued from completions on
//! shard threads, through the engine's [`Router`].
//!
//! The line table is kept on the cache VD ([`map`]): the cache starts warm after a clean stop,
//! and with its dirty lines after any stop.

mod destage;
mod lines;
mod map;
mod persist;
mod read;
mod write_back;

use crate::router::Router;
use crate::{Done, Engine, VdCompletion, VdRequest, VirtualDrive};
use drive::IoBuf;
use lines::{LineKey, Lines, WriteAction};
pub use map::{MapEntry, MapOwner};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A line: the unit of promotion and eviction (MegaRAID's CacheCade and the issue's example).
pub const DEFAULT_LINE_BYTES: u64 = 64 << 10;
/// A sequential stream longer than this promotes nothing (bcache's `sequential_cutoff`).
pub const DEFAULT_SEQUENTIAL_CUTOFF_BYTES: u64 = 4 << 20;
/// Sequential streams followed at once, by their end offset, for the cutoff.
const STREAMS_TRACKED: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct SsdCacheOptions {
    pub line_bytes: u64,
    pub sequential_cutoff_bytes: u64,
    /// Writes to held lines stay on the cache VD (see the module docs).
    pub write_back: bool,
}

impl Default for SsdCacheOptions {
    fn default() -> Self {
        SsdCacheOptions { line_bytes: DEFAULT_LINE_BYTES, sequential_cutoff_bytes: DEFAULT_SEQUENTIAL_CUTOFF_BYTES, write_back: false }
    }
}

/// How long detaching a write-back cache waits for a VD's dirty lines to be destaged.
pub const DETACH_FLUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// What the cache has done since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SsdCacheStats {
    /// Reads served from the cache VD.
    pub read_hits: u64,
    /// Reads that went to the VD (not counting those of a sequential stream past the cutoff).
    pub read_misses: u64,
    /// Reads of a stream past the cutoff that missed: served by the VD, promoting nothing.
    pub read_bypassed: u64,
    /// Lines written to the cache VD and served from then on.
    pub promotions: u64,
    /// Fills dropped: a write came meanwhile, or the VD or the cache VD failed them.
    pub fills_dropped: u64,
    pub evictions: u64,
    /// Writes that updated lines on the cache VD as well as the VD.
    pub write_updates: u64,
    /// Reads the cache VD failed, served again by the VD.
    pub cache_read_errors: u64,
    /// Writes kept on the cache VD (write-back), in part or whole.
    pub writes_absorbed: u64,
    /// Dirty lines written to their VDs and clean since.
    pub lines_destaged: u64,
    /// Destages that left their line dirty (a write came meanwhile, or a failure).
    pub destage_retries: u64,
    /// Writes of the line table that failed (their writes failed with them).
    pub table_write_errors: u64,
    pub lines_valid: u64,
    /// Lines newer on the cache VD than on their VD.
    pub lines_dirty: u64,
    pub line_count: u64,
    pub line_bytes: u64,
    pub write_back: bool,
}

impl SsdCacheStats {
    /// Hits over hits and misses (bypassed reads left out), 0 before any read.
    pub fn hit_ratio(&self) -> f64 {
        let reads = self.read_hits + self.read_misses;
        if reads == 0 {
            return 0.0;
        }
        self.read_hits as f64 / reads as f64
    }
}

#[derive(Default)]
struct Counters {
    read_hits: AtomicU64,
    read_misses: AtomicU64,
    read_bypassed: AtomicU64,
    promotions: AtomicU64,
    fills_dropped: AtomicU64,
    write_updates: AtomicU64,
    cache_read_errors: AtomicU64,
    writes_absorbed: AtomicU64,
    lines_destaged: AtomicU64,
    destage_retries: AtomicU64,
    table_write_errors: AtomicU64,
}

/// One cache VD and the lines it holds for the VDs attached to it.
pub struct SsdCache {
    cache_vd: Arc<VirtualDrive>,
    router: Router,
    options: SsdCacheOptions,
    lines: Mutex<Lines>,
    streams: Mutex<Vec<Stream>>,
    counters: Counters,
    /// The attached VDs by instance id, for the destager.
    vds: Mutex<HashMap<u64, Weak<VirtualDrive>>>,
    /// VDs (instance ids) whose dirty lines are being drained: their writes go through.
    draining: Mutex<HashSet<u64>>,
    /// `draining` is not empty: read without its lock on every write.
    any_draining: AtomicBool,
    /// When the cache was made: `last_write_ms` counts from it.
    created: Instant,
    /// The last write through the cache (the destager's idle rule).
    last_write_ms: AtomicU64,
    /// The destager is between its watermarks, going down.
    destage_active: AtomicBool,
    /// The table on the cache VD is ours and `running` ([`SsdCache::begin_service`]): until
    /// then a write-back cache writes through (nothing could find its dirty lines after a
    /// crash).
    in_service: AtomicBool,
    /// The destager's thread (a write-back cache's): it ends when the cache is dropped or the
    /// engine stops.
    destager: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A sequential stream: where its next request starts, how long it has run.
#[derive(Clone, Copy)]
struct Stream {
    vd_instance: u64,
    end_bytes: u64,
    run_bytes: u64,
    last_use: u64,
}

/// A VD's link to the cache serving it (a field of [`VirtualDrive`]). The flags every request
/// reads come first (`repr(C)`, as the VD's own hot fields).
#[derive(Default)]
#[repr(C)]
pub struct Attachment {
    /// Read without the lock on every request: whether to look under it.
    attached: AtomicBool,
    /// Its write-back cache VD failed holding dirty lines of it: every request fails.
    lost: AtomicBool,
    /// This VD is a cache VD: it cannot have a cache of its own.
    is_cache_vd: AtomicBool,
    cache: Mutex<Option<Arc<SsdCache>>>,
}

impl Attachment {
    /// The cache serving the VD, if any.
    pub fn get(&self) -> Option<Arc<SsdCache>> {
        if !self.attached.load(Ordering::Acquire) {
            return None;
        }
        self.cache.lock().expect("ssd cache attachment lock").clone()
    }

    pub fn is_cache_vd(&self) -> bool {
        self.is_cache_vd.load(Ordering::Acquire)
    }

    /// Takes the VD offline: its write-back cache VD failed while holding dirty lines of it,
    /// which its members do not have. Undone by [`Engine::discard_ssd_cache`].
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Engine {
    /// Makes `cache_vd` a cache VD (see the module docs); attach VDs to it with
    /// [`Engine::attach_ssd_cache`].
    ///
    /// # Errors
    /// If the VD is attached to a cache itself, is already a cache VD, or cannot hold a line.
    pub fn ssd_cache(&self, cache_vd: &Arc<VirtualDrive>, options: SsdCacheOptions) -> Result<Arc<SsdCache>, String> {
        let name = cache_vd.name();
        if !options.line_bytes.is_power_of_two() || !(4096..=1 << 20).contains(&options.line_bytes) {
            return Err(format!("line size {} bytes: allowed a power of two from 4 KiB to 1 MiB", options.line_bytes));
        }
        if cache_vd.ssd_cache().get().is_some() {
            return Err(format!("virtual drive {name} is cached by a cache VD; it cannot be one"));
        }
        let slot_count = map::slot_count_for(cache_vd.capacity_bytes(), options.line_bytes);
        if slot_count == 0 {
            return Err(format!("virtual drive {name} is smaller than one {}-byte line", options.line_bytes));
        }
        if cache_vd.ssd_cache().is_cache_vd.swap(true, Ordering::AcqRel) {
            return Err(format!("virtual drive {name} is a cache VD already"));
        }
        let cache = Arc::new(SsdCache {
            cache_vd: Arc::clone(cache_vd),
            router: self.router.clone(),
            options,
            lines: Mutex::new(Lines::new(slot_count, options.write_back)),
            streams: Mutex::new(Vec::with_capacity(STREAMS_TRACKED)),
            counters: Counters::default(),
            vds: Mutex::new(HashMap::new()),
            draining: Mutex::new(HashSet::new()),
            any_draining: AtomicBool::new(false),
            created: Instant::now(),
            last_write_ms: AtomicU64::new(0),
            destage_active: AtomicBool::new(false),
            in_service: AtomicBool::new(false),
            destager: Mutex::new(None),
        });
        if options.write_back {
            let destager = destage::spawn(&cache).map_err(|error| {
                cache_vd.ssd_cache().is_cache_vd.store(false, Ordering::Release);
                format!("virtual drive {name}: cannot start the cache's destage thread ({error}); is a thread limit reached?")
            })?;
            *cache.destager.lock().expect("ssd cache destager lock") = Some(destager);
        }
        Ok(cache)
    }

    /// Has `cache` serve `vd` from now on.
    ///
    /// # Errors
    /// If `vd` is a cache VD or is served by a cache already.
    pub fn attach_ssd_cache(&self, vd: &Arc<VirtualDrive>, cache: &Arc<SsdCache>) -> Result<(), String> {
        let attachment = vd.ssd_cache();
        if attachment.is_cache_vd() {
            return Err(format!("virtual drive {} is a cache VD; it cannot be cached", vd.name()));
        }
        let mut slot = attachment.cache.lock().expect("ssd cache attachment lock");
        if slot.is_some() {
            return Err(format!("virtual drive {} is cached already; detach its cache first", vd.name()));
        }
        let vd_id = u32::try_from(vd.id()).map_err(|_| format!("virtual drive {}: id {} is past the line table's", vd.name(), vd.id()))?;
        cache.lines().attach(vd.instance_id(), vd_id);
        cache.vds.lock().expect("ssd cache vds lock").insert(vd.instance_id(), Arc::downgrade(vd));
        *slot = Some(Arc::clone(cache));
        attachment.attached.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops caching `vd`: a write-back cache destages its dirty lines first (its writes go
    /// through meanwhile); then its lines are dropped (those in use once idle).
    ///
    /// # Errors
    /// Dirty lines could not be destaged within [`DETACH_FLUSH_TIMEOUT`]: the VD stays cached.
    pub fn detach_ssd_cache(&self, vd: &Arc<VirtualDrive>) -> Result<(), String> {
        let Some(cache) = vd.ssd_cache().get() else { return Ok(()) };
        if cache.options.write_back {
            if let Err(error) = cache.flush_vd(vd, DETACH_FLUSH_TIMEOUT) {
                cache.end_drain(vd);
                return Err(error);
            }
        }
        self.discard_ssd_cache(vd);
        Ok(())
    }

    /// Stops caching `vd` without destaging anything: dirty lines are discarded (its cache VD
    /// failed, or an administrator chose to). A VD offline for a lost cache comes back with
    /// what its members hold.
    pub fn discard_ssd_cache(&self, vd: &Arc<VirtualDrive>) {
        let attachment = vd.ssd_cache();
        let mut slot = attachment.cache.lock().expect("ssd cache attachment lock");
        attachment.attached.store(false, Ordering::Release);
        attachment.lost.store(false, Ordering::Release);
        if let Some(cache) = slot.take() {
            cache.lines().detach(vd.instance_id());
            cache.vds.lock().expect("ssd cache vds lock").remove(&vd.instance_id());
            cache.end_drain(vd);
            cache.kick_table();
        }
    }
}

impl SsdCache {
    pub fn cache_vd(&self) -> &Arc<VirtualDrive> {
        &self.cache_vd
    }

    pub fn stats(&self) -> SsdCacheStats {
        let c = &self.counters;
        let lines = self.lines();
        SsdCacheStats {
            read_hits: c.read_hits.load(Ordering::Relaxed),
            read_misses: c.read_misses.load(Ordering::Relaxed),
            read_bypassed: c.read_bypassed.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            fills_dropped: c.fills_dropped.load(Ordering::Relaxed),
            evictions: lines.evictions,
            write_updates: c.write_updates.load(Ordering::Relaxed),
            cache_read_errors: c.cache_read_errors.load(Ordering::Relaxed),
            writes_absorbed: c.writes_absorbed.load(Ordering::Relaxed),
            lines_destaged: c.lines_destaged.load(Ordering::Relaxed),
            destage_retries: c.destage_retries.load(Ordering::Relaxed),
            table_write_errors: c.table_write_errors.load(Ordering::Relaxed),
            lines_valid: lines.valid_count() as u64,
            lines_dirty: lines.dirty_count() as u64,
            line_count: u64::from(lines.slot_count()),
            line_bytes: self.options.line_bytes,
            write_back: self.options.write_back,
        }
    }

    /// Checks the line map's invariants (every slot free or held by one line, ...): for tests;
    /// it looks at every line.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.lines().check();
    }

    /// Drops every line of `vd` (those in use once idle; fills under way are poisoned), which
    /// stays attached: its data changed under the cache (a full initialization).
    pub fn drop_lines(self: &Arc<Self>, vd: &VirtualDrive) {
        {
            let mut lines = self.lines();
            lines.detach(vd.instance_id());
            lines.attach(vd.instance_id(), vd.id() as u32);
        }
        self.kick_table();
    }

    /// A repair of `vd`'s `range` begins (see [`Lines::begin_repair`]): no line the cache
    /// holds or fills of it is served until [`SsdCache::end_repair`].
    pub(crate) fn begin_repair(&self, vd: &VirtualDrive, range: &std::ops::Range<u64>) {
        let keys = self.keys(vd, range.start, range.end - range.start);
        let mut lines = self.lines();
        keys.into_iter().for_each(|key| lines.begin_repair(key));
    }

    pub(crate) fn end_repair(&self, vd: &VirtualDrive, range: &std::ops::Range<u64>) {
        let keys = self.keys(vd, range.start, range.end - range.start);
        let mut lines = self.lines();
        keys.into_iter().for_each(|key| lines.end_repair(key));
    }

    /// Lines of `vd` the cache can serve now.
    pub fn lines_valid_of(&self, vd: &VirtualDrive) -> u64 {
        self.lines().valid_count_of(vd.instance_id()) as u64
    }

    /// Lines of `vd` newer on the cache VD than on `vd`.
    pub fn lines_dirty_of(&self, vd: &VirtualDrive) -> u64 {
        self.lines().dirty_count_of(vd.instance_id()) as u64
    }

    pub fn is_write_back(&self) -> bool {
        self.options.write_back
    }

    /// Writes to held lines stay on the cache VD now (write-back, its table in service).
    fn writes_back(&self) -> bool {
        self.options.write_back && self.in_service.load(Ordering::Acquire)
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.lines.lock().expect("ssd cache lines lock")
    }

    /// The lines a range touches, as keys.
    fn keys(&self, vd: &VirtualDrive, offset_bytes: u64, len_bytes: u64) -> Vec<LineKey> {
        let line = self.options.line_bytes;
        let (first, last) = (offset_bytes / line, (offset_bytes + len_bytes - 1) / line);
        (first..=last).map(|index| (vd.instance_id(), index)).collect()
    }

    /// Serves `request` of `vd`, which this cache is attached to and [`Engine::submit`]
    /// validated; `engine` takes what goes to the VD on the submitting thread.
    pub(crate) fn submit(self: &Arc<Self>, engine: &Engine, vd: &Arc<VirtualDrive>, request: VdRequest, done: Done) {
        // The cache VD's background work (a rebuild of a mirrored cache) yields to clients too.
        self.cache_vd.note_client_request();
        match request {
            VdRequest::Read { offset_bytes, buf } => self.read(engine, vd, offset_bytes, buf, done),
            VdRequest::Write { offset_bytes, buf } if self.writes_back() && !self.is_draining(vd) => {
                self.note_write();
                self.write_back(engine, vd, offset_bytes, buf, done);
            }
            VdRequest::Write { offset_bytes, buf } => self.write(engine, vd, offset_bytes, buf, done),
            VdRequest::Flush if self.writes_back() => self.flush_both(engine, vd, done),
            VdRequest::Flush => engine.submit_direct(vd, VdRequest::Flush, done),
        }
    }

    /// A client's flush of a VD cached write-back: the cache VD holds its acknowledged writes
    /// too.
    fn flush_both(&self, engine: &Engine, vd: &Arc<VirtualDrive>, done: Done) {
        let joiner = crate::join::Joiner::new(2, done);
        let cache_joiner = Arc::clone(&joiner);
        self.router.flush(&self.cache_vd, Box::new(move |completion| cache_joiner.piece_done(0, completion)));
        engine.submit_direct(vd, VdRequest::Flush, Box::new(move |completion| joiner.piece_done(1, completion)));
    }

    /// Writes to the VD, and to the cache VD the parts of lines it holds (see [`lines`]);
    /// acknowledged once both are done, with the VD's result.
    fn write(self: &Arc<Self>, engine: &Engine, vd: &Arc<VirtualDrive>, offset_bytes: u64, buf: IoBuf, done: Done) {
        let line = self.options.line_bytes;
        let keys = self.keys(vd, offset_bytes, buf.len() as u64);
        let actions: Vec<WriteAction> = {
            let mut lines = self.lines();
            keys.iter().map(|&key| lines.begin_write(key)).collect()
        };
        let mut updates = Vec::new();
        for (key, action) in keys.iter().zip(&actions) {
            let WriteAction::Update(slot) = *action else { continue };
            let line_start = key.1 * line;
            let (start, end) = (offset_bytes.max(line_start), (offset_bytes + buf.len() as u64).min(line_start + line));
            let data = &buf.as_slice()[(start - offset_bytes) as usize..(end - offset_bytes) as usize];
            updates.push((u64::from(slot) * line + start - line_start, IoBuf::from_slice(data)));
        }
        if !updates.is_empty() {
            self.counters.write_updates.fetch_add(1, Ordering::Relaxed);
        }
        let join = Arc::new(WriteJoin {
            cache: Arc::clone(self),
            keys,
            actions,
            state: Mutex::new(WriteJoinState { remaining: updates.len() + 1, cache_ok: true, vd_completion: None, done: Some(done) }),
        });
        for (cache_offset_bytes, data) in updates {
            let join = Arc::clone(&join);
            let update_done: Done = Box::new(move |completion| join.update_done(completion.result.is_ok()));
            self.router.submit_plain(&self.cache_vd, VdRequest::Write { offset_bytes: cache_offset_bytes, buf: data }, update_done);
        }
        let vd_done: Done = Box::new(move |completion| join.vd_done(completion));
        engine.submit_direct(vd, VdRequest::Write { offset_bytes, buf }, vd_done);
    }
}

/// A write to the VD and its updates of cached lines: acknowledged when all are done.
struct WriteJoin {
    cache: Arc<SsdCache>,
    keys: Vec<LineKey>,
    actions: Vec<WriteAction>,
    state: Mutex<WriteJoinState>,
}

struct WriteJoinState {
    remaining: usize,
    cache_ok: bool,
    vd_completion: Option<VdCompletion>,
    done: Option<Done>,
}

impl WriteJoin {
    fn update_done(&self, ok: bool) {
        let mut state = self.state.lock().expect("ssd cache write join lock");
        state.cache_ok &= ok;
        self.piece_done(state);
    }

    fn vd_done(&self, completion: VdCompletion) {
        let mut state = self.state.lock().expect("ssd cache write join lock");
        state.vd_completion = Some(completion);
        self.piece_done(state);
    }

    fn piece_done(&self, mut state: std::sync::MutexGuard<'_, WriteJoinState>) {
        state.remaining -= 1;
        if state.remaining > 0 {
            return;
        }
        let completion = state.vd_completion.take().expect("the VD's write is one of the pieces");
        let done = state.done.take().expect("acknowledged once");
        let ok = state.cache_ok && completion.result.is_ok();
        drop(state);
        {
            let mut lines = self.cache.lines();
            for (key, action) in self.keys.iter().zip(&self.actions) {
                lines.end_write(*key, *action, ok);
            }
        }
        done(completion);
    }
}
