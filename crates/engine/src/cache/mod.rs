//! The controller cache: write-back over the journal, destaging in VD (so member-LBA) order.
//!
//! Each shard has its own cache ([`ShardCache`]), holding dirty data only for the rows the
//! shard owns, so it needs no lock. Every request of the shard passes through [`serve`]:
//!
//! - **writes** go into the cache ([`extents::DirtyMap`]) and, when the shard has a healthy
//!   journal partition, into a journal record first. The policy in effect decides when the
//!   client hears back: WB once the record is durable, AWB at once, WT once the data is on the
//!   members. Without a journal, a WT write to a range with nothing cached takes the direct path.
//!   With one, a WT write to a parity VD with nothing cached takes the imaged path
//!   (`write::write_imaged`): no data record, since the row images its row writes log first
//!   hold every byte it puts on the members; a row that could not be imaged is flushed to the
//!   members before the acknowledgement.
//! - **member writes of cached data happen only in a destage**, which takes a snapshot of the
//!   extents it writes and queues for their row locks in the same step: a newer write to the
//!   same bytes is destaged later and queues later, so members never go back in time. Extents
//!   leave the cache only once their member write completed, and a destage never overlaps
//!   another that is in flight (the RAID0 path has no row locks to order them).
//! - **reads** are served from memory when dirty and clean data ([`clean`]) hold every byte;
//!   otherwise they take a snapshot of the dirty extents they overlap before reading the
//!   members and lay it over what the members returned. Under `iopolicy=cached` the result is
//!   kept as clean data; read-ahead ([`prefetch`]) keeps what it reads under either policy.
//!
//! - **writes of sequential streams** past a cutoff go around the journal to the members
//!   ([`bypass`]) when nothing the journal could replay names their bytes.
//!
//! Destaging starts above the high watermark (three quarters of the shard's share of the
//! cache) and goes on down to the low one (a half), takes any extent older than [`AGE_LIMIT`],
//! and runs at once for WT writes and flushes that wait for it. Runs merge contiguous extents up to
//! [`RUN_BYTES_MAX`], so a row filled by small writes goes out as one full-stripe write; on
//! parity levels, a run inside one row takes the row's other idle extents along, written as one
//! scattered row write (`io::serve_scattered`).

mod bypass;
pub mod clean;
pub(crate) use bypass::{around_durable, note_written_around};
mod destage;
pub mod extents;
mod images;
mod line_memory;
mod read;
mod relocate;
mod write;

pub(crate) use clean::SharedLines;
pub(crate) use destage::{pump, quiesce, tick};
pub(crate) use images::{checkpoint_images, images_to_head};
pub(crate) use read::prefetch;

use crate::io;
use crate::journal::part::JournalPart;
use crate::runtime::Reactor;
use crate::vd::{VdCompletion, VdError, VdRequest, VirtualDrive};
use extents::{DirtyMap, Extent};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Dirty data older than this is destaged even below the watermarks: MegaRAID's default cache
/// flush interval. Destaging competes with the journal's writes for the disks, so a shorter
/// one ends a burst the cache could have absorbed (a 1 s limit halved the admission rate of
/// 4 KiB random writes one second into a burst).
pub const AGE_LIMIT: Duration = Duration::from_secs(4);
/// A destage run's largest member write (several rows of most layouts).
pub const RUN_BYTES_MAX: u64 = 1 << 20;
/// Destage runs in flight per shard at most, when writers wait for room or the cache is above
/// its high watermark.
pub const RUNS_IN_FLIGHT_MAX: usize = 16;
/// Destage runs in flight per shard at most otherwise (data grown old, journal room): few, so
/// that client reads queue behind a few destage writes on the members, not dozens (a
/// controller's cache yields to host reads the same way).
pub const BACKGROUND_RUNS_IN_FLIGHT_MAX: usize = 2;
/// The default cache size of a controller: the SAS3108's 1 GiB.
pub const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

struct VdCache {
    vd: Arc<VirtualDrive>,
    dirty: DirtyMap,
    /// Where the elevator continues: the end of the last run started.
    cursor: u64,
    /// Ranges being destaged now.
    busy: Vec<Range<u64>>,
    /// Why the last destage failed, for the writes that waited for it.
    last_error: Option<VdError>,
}

/// One shard's cache.
pub struct ShardCache {
    vds: RefCell<HashMap<u64, VdCache>>,
    limit_bytes: Cell<u64>,
    /// Dirty data older than this is destaged at the next tick ([`AGE_LIMIT`]).
    age_limit: Cell<Duration>,
    bytes: Cell<u64>,
    journal: RefCell<Option<Rc<JournalPart>>>,
    next_id: Cell<u64>,
    runs_in_flight: Cell<usize>,
    draining: Cell<bool>,
    /// A tick asked for data older than the age limit to be destaged (cleared once none is
    /// found).
    aging: Cell<bool>,
    /// Requests waiting for everything un-journaled (or everything) to go out.
    forced: Cell<usize>,
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
    admission: Admission,
    /// VDs destaged to since the last journal checkpoint: flushed before the next one.
    destaged_to: RefCell<HashMap<u64, Arc<VirtualDrive>>>,
    /// Clean data (read and read ahead), in the room dirty data leaves.
    clean: RefCell<clean::CleanLines>,
    /// The extents holding the journal's oldest records, to destage first while the journal
    /// is short of room: (VD instance, offset, extent id), oldest first.
    reclaim: RefCell<std::collections::VecDeque<(u64, u64, u64)>>,
    /// Dirty bytes of offline VDs ("pinned": they cannot be destaged until the VD is back or
    /// its cache is discarded), counted at every tick. They do not crowd the other VDs out.
    pinned_bytes: Cell<u64>,
    /// A pinned extent is being logged again ([`relocate`]).
    relocating: Cell<bool>,
    /// The journal tail no pinned extent held at the last look (looked at again once it moves,
    /// or at the next tick).
    relocation_looked_at: Cell<Option<u64>>,
    /// The journal's image partition of this shard (`images`), and the VDs imaged since its
    /// last checkpoint (flushed before the next one).
    images: RefCell<Option<Rc<JournalPart>>>,
    imaged: RefCell<HashMap<u64, Arc<VirtualDrive>>>,
    /// Rows named by records and images a replay could still read ([`bypass`]).
    logged_rows: RefCell<bypass::LoggedRows>,
    /// Per VD: the member flushes that make writes gone around the journal durable.
    bypass_flushes: RefCell<HashMap<u64, Rc<bypass::FlushGroup>>>,
    /// What destaging did (for the daemon's metrics).
    destaged: Cell<DestageCounts>,
    /// Writes acknowledged on the imaged path (`write`): in the journal once, as row images.
    imaged_writes: Cell<ImagedCounts>,
}

impl Default for ShardCache {
    fn default() -> Self {
        ShardCache::new()
    }
}

impl ShardCache {
    pub fn new() -> ShardCache {
        ShardCache {
            vds: RefCell::new(HashMap::new()),
            limit_bytes: Cell::new(DEFAULT_CACHE_BYTES),
            age_limit: Cell::new(AGE_LIMIT),
            bytes: Cell::new(0),
            journal: RefCell::new(None),
            next_id: Cell::new(1),
            runs_in_flight: Cell::new(0),
            draining: Cell::new(false),
            aging: Cell::new(false),
            forced: Cell::new(0),
            waiters: RefCell::new(Vec::new()),
            admission: Admission::default(),
            destaged_to: RefCell::new(HashMap::new()),
            clean: RefCell::new(clean::CleanLines::default()),
            reclaim: RefCell::new(std::collections::VecDeque::new()),
            pinned_bytes: Cell::new(0),
            relocating: Cell::new(false),
            relocation_looked_at: Cell::new(None),
            images: RefCell::new(None),
            imaged: RefCell::new(HashMap::new()),
            logged_rows: RefCell::new(bypass::LoggedRows::default()),
            bypass_flushes: RefCell::new(HashMap::new()),
            destaged: Cell::new(DestageCounts::default()),
            imaged_writes: Cell::new(ImagedCounts::default()),
        }
    }

    pub fn set_limit_bytes(&self, bytes: u64) {
        self.limit_bytes.set(bytes.max(RUN_BYTES_MAX * 4));
    }

    /// Any size and age limit, however small: the simulator keeps destaging busy with them.
    pub fn set_limits_for_tests(&self, bytes: u64, age_limit: Duration) {
        self.limit_bytes.set(bytes);
        self.age_limit.set(age_limit);
    }

    /// The shard's journal partition from now on. Cached data keeps no hold on the journal it
    /// leaves: it is un-journaled data from now on (a flush writes it out), and the controller
    /// stopped trusting that journal before it took it away.
    pub fn set_journal(&self, journal: Option<Rc<JournalPart>>) {
        for cache in self.vds.borrow_mut().values_mut() {
            cache.dirty.forget_sequences();
        }
        self.logged_rows.borrow_mut().forget_data();
        *self.journal.borrow_mut() = journal;
        self.wake_all();
    }

    pub fn journal(&self) -> Option<Rc<JournalPart>> {
        self.journal.borrow().clone()
    }

    /// Dirty bytes held.
    pub fn dirty_bytes(&self) -> u64 {
        self.bytes.get()
    }

    /// The clean cache's lines, shared with the engine's hits on other threads.
    pub(crate) fn clean_lines(&self) -> SharedLines {
        self.clean.borrow().shared()
    }

    /// The clean cache's counters and size.
    pub fn clean_stats(&self) -> clean::CleanStats {
        self.clean.borrow().stats()
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            dirty_bytes: self.dirty_bytes(),
            pinned_bytes: self.pinned_bytes.get(),
            clean: self.clean_stats(),
            destage: self.destaged.get(),
            imaged: self.imaged_writes.get(),
        }
    }

    /// At a tick: the stuck data of VDs that are back (no longer offline) is destaged again,
    /// and what offline VDs hold is counted as pinned.
    pub(crate) fn review_stuck(&self) {
        let mut pinned = 0;
        let mut retried = false;
        for cache in self.vds.borrow_mut().values_mut() {
            if cache.vd.state() == crate::VdState::Offline && !cache.vd.is_retired() {
                pinned += cache.dirty.bytes();
            } else {
                retried |= cache.dirty.unstick_all();
            }
        }
        self.pinned_bytes.set(pinned);
        self.relocation_looked_at.set(None);
        if retried {
            self.wake_all();
        }
    }

    /// The dirty bytes that count against the cache's room: pinned data counts only up to
    /// the point where it would leave the other VDs less than an eighth of the cache (so
    /// memory stays below 9/8 of the cache size, and an offline VD never stalls the others).
    fn counted_bytes(&self) -> u64 {
        let floor = (self.limit_bytes.get() / 8).max(RUN_BYTES_MAX * 4);
        let pinned_allowed = self.limit_bytes.get().saturating_sub(floor);
        self.bytes.get() - self.pinned_bytes.get().min(self.bytes.get()) + self.pinned_bytes.get().min(pinned_allowed)
    }

    /// A repair may change what `range` of `vd` reads: until [`ShardCache::end_repair`] no
    /// clean data of it is kept or served.
    pub(crate) fn begin_repair(&self, vd: &VirtualDrive, range: Range<u64>) -> u64 {
        self.clean.borrow_mut().begin_direct_write(vd.instance_id(), range)
    }

    pub(crate) fn end_repair(&self, id: u64) {
        self.clean.borrow_mut().end_direct_write(id);
    }

    fn has_dirty(&self, vd: &VirtualDrive) -> bool {
        self.vds.borrow().get(&vd.instance_id()).is_some_and(|c| !c.dirty.is_empty())
    }

    fn wake_all(&self) {
        for waiter in self.waiters.borrow_mut().drain(..) {
            let _ = waiter.send(());
        }
    }

    async fn wait_for_change(&self) {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }

    /// Drops a VD's cached data (it was deleted) and its holds on journal records.
    pub fn forget(&self, vd: &VirtualDrive) {
        self.clean.borrow_mut().forget_vd(vd.instance_id());
        self.bypass_flushes.borrow_mut().remove(&vd.instance_id());
        let Some(cache) = self.vds.borrow_mut().remove(&vd.instance_id()) else { return };
        self.bytes.set(self.bytes.get() - cache.dirty.bytes());
        vd.note_cache_dirty(-(cache.dirty.bytes() as i64));
        let journal = self.journal();
        if let Some(journal) = &journal {
            cache.dirty.all().for_each(|extent| release_extent(journal, extent));
        }
        self.wake_all();
    }
}

/// Checks a run of rows (see [`io::check_rows`]); while a repair may change what the rows
/// read, no clean data of them is kept or served.
pub(crate) async fn checked_rows(
    reactor: Rc<Reactor>,
    vd: &Arc<VirtualDrive>,
    first_row: u64,
    row_count: u64,
    mode: crate::CheckMode,
) -> Vec<Result<crate::CheckOutcome, VdError>> {
    let repairs = !matches!(mode, crate::CheckMode::Report);
    let hold = repairs.then(|| RepairHold::begin(&reactor, vd, first_row, row_count));
    let results = io::check_rows(Rc::clone(&reactor), Arc::clone(vd), first_row, row_count, mode).await;
    if let Some(hold) = hold {
        hold.end(&reactor, vd);
    }
    results
}

/// Rebuilds a run of rows (see [`io::rebuild_rows`]). Rows of a region still unsynced read
/// their first available copy, which the rebuild may change (a blank first member now holds
/// the second one's bytes): no clean data of such a run is kept or served while it runs, as
/// for a repair, so that a read after it never returns what a lost copy held.
pub(crate) async fn rebuilt_rows(
    reactor: Rc<Reactor>,
    vd: &Arc<VirtualDrive>,
    first_row: u64,
    row_count: u64,
    targets: crate::MemberSet,
) -> Vec<Result<(), VdError>> {
    let rows = first_row..first_row + row_count;
    let unsynced = vd.write_intent().is_some_and(|intent| rows.clone().any(|row| intent.row_unsynced(row)));
    let hold = unsynced.then(|| RepairHold::begin(&reactor, vd, first_row, row_count));
    let results = io::rebuild_rows(Rc::clone(&reactor), Arc::clone(vd), first_row, row_count, targets).await;
    if let Some(hold) = hold {
        hold.end(&reactor, vd);
    }
    results
}

/// What a repair of a run of rows holds off while it runs: this shard's clean data of them,
/// and the lines an SSD cache in front of the VD holds of them (its reads would otherwise go
/// on returning what the repair replaced).
struct RepairHold {
    clean: u64,
    ssd: Option<Arc<crate::ssd_cache::SsdCache>>,
    range: Range<u64>,
}

impl RepairHold {
    fn begin(reactor: &Reactor, vd: &VirtualDrive, first_row: u64, row_count: u64) -> RepairHold {
        let row_bytes = vd.geometry().row_data_bytes();
        let range = first_row * row_bytes..(first_row + row_count) * row_bytes;
        let clean = reactor.cache().begin_repair(vd, range.clone());
        let ssd = vd.ssd_cache().get();
        if let Some(ssd) = &ssd {
            ssd.begin_repair(vd, &range);
        }
        RepairHold { clean, ssd, range }
    }

    fn end(self, reactor: &Reactor, vd: &VirtualDrive) {
        reactor.cache().end_repair(self.clean);
        if let Some(ssd) = &self.ssd {
            ssd.end_repair(vd, &self.range);
        }
    }
}

/// What a cache holds and has done (one shard's, or summed over the shards).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheStats {
    pub dirty_bytes: u64,
    /// Dirty bytes of offline VDs (see [`ShardCache::review_stuck`]).
    pub pinned_bytes: u64,
    pub clean: clean::CleanStats,
    pub destage: DestageCounts,
    pub imaged: ImagedCounts,
}

impl CacheStats {
    pub fn plus(&self, other: &CacheStats) -> CacheStats {
        CacheStats {
            dirty_bytes: self.dirty_bytes + other.dirty_bytes,
            pinned_bytes: self.pinned_bytes + other.pinned_bytes,
            clean: self.clean.plus(&other.clean),
            destage: self.destage.plus(&other.destage),
            imaged: self.imaged.plus(&other.imaged),
        }
    }
}

/// Writes acknowledged on the imaged path since the engine started (their data went to the
/// journal once, as the row images of their row writes, and to the members, never cached): WT
/// writes with a journal, and the whole rows of WB writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImagedCounts {
    pub write_through_bytes: u64,
    pub write_back_bytes: u64,
}

impl ImagedCounts {
    pub fn plus(&self, other: &ImagedCounts) -> ImagedCounts {
        ImagedCounts {
            write_through_bytes: self.write_through_bytes + other.write_through_bytes,
            write_back_bytes: self.write_back_bytes + other.write_back_bytes,
        }
    }
}

/// Destage runs since the engine started: those that reached the members (and their bytes),
/// and those that failed (their data stays cached and is tried again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestageCounts {
    pub runs: u64,
    pub bytes: u64,
    pub failed_runs: u64,
    /// Runs that wrote a parity row's scattered extents as one row write.
    pub scattered_runs: u64,
}

impl DestageCounts {
    pub fn plus(&self, other: &DestageCounts) -> DestageCounts {
        DestageCounts {
            runs: self.runs + other.runs,
            bytes: self.bytes + other.bytes,
            failed_runs: self.failed_runs + other.failed_runs,
            scattered_runs: self.scattered_runs + other.scattered_runs,
        }
    }
}

/// The order in which writes enter the cache: tickets taken on arrival, served in turn.
#[derive(Default)]
struct Admission {
    next_ticket: Cell<u64>,
    serving: Cell<u64>,
}

impl Admission {
    fn take_ticket(&self) -> u64 {
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        ticket
    }

    fn serving(&self) -> u64 {
        self.serving.get()
    }

    /// The write being served is in: the next one's turn.
    fn next(&self, cache: &ShardCache) {
        self.serving.set(self.serving.get() + 1);
        assert!(self.serving.get() <= self.next_ticket.get(), "a turn is served only after its ticket was taken");
        cache.wake_all();
    }
}

/// Serves one request of this shard through the cache.
/// `bypass`: a write of a sequential stream that may go around the journal ([`bypass`]).
pub(crate) async fn serve(reactor: Rc<Reactor>, vd: Arc<VirtualDrive>, request: VdRequest, bypass: bool) -> VdCompletion {
    if vd.is_retired() || vd.state() == crate::VdState::Offline {
        return io::serve(reactor, vd, request).await;
    }
    match request {
        VdRequest::Read { offset_bytes, buf } => read::read(reactor, vd, offset_bytes, buf).await,
        VdRequest::Write { offset_bytes, buf } => write::write(reactor, vd, offset_bytes, buf, bypass).await,
        VdRequest::Flush => write::flush(reactor, vd).await,
    }
}

/// An extent left the cache (on the members, or its VD deleted): its holds on records end.
fn release_extent(journal: &JournalPart, extent: &Extent) {
    extent.sequence.iter().chain(&extent.superseded).for_each(|&s| journal.release(s));
}
