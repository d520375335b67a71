//! A virtual drive: its layout, its members and their states. No I/O happens here; the paths in
//! `io` read this state at the start of every attempt.

mod bad_blocks;
mod copy;
mod fast_writes;
mod io_stats;
pub mod journal_bypass;
mod member;
mod member_states;
mod migration;
pub mod policy;
mod rebuilt;
mod request;
mod requests_in_flight;
mod streams;
pub(crate) mod write_streams;

use crate::config::{IoPolicy, ReadPolicy, WritePolicy};
pub use bad_blocks::{BadBlockChange, BadBlockEvent, BadBlocks, BAD_BLOCKS_MAX};
pub(crate) use copy::same_drive;
pub use copy::CopyTarget;
pub(crate) use fast_writes::FillTicket;
pub use io_stats::{ClientIoStats, IoKind, IoKindSnapshot, LATENCY_BUCKET_BOUNDS_NS};
pub use journal_bypass::JournalBypass;
pub use member::Member;
pub(crate) use member_states::MemberFault;
pub use migration::MigrationTarget;
pub use request::{CheckMode, CheckOutcome, MemberSet, Mismatch, VdCompletion, VdError, VdRequest};
pub use requests_in_flight::GatherCounts;

use crate::Done;
use drive::{Drive, DriveError, OpKind};
use layout::{Geometry, GeometryConfig, Level, SpanKind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Bytes reserved at the start of every member for controller metadata (two copies of the
/// configuration plus room to grow; see docs/on-disk-format.md).
pub const MEMBER_RESERVED_BYTES: u64 = 4 << 20;

/// Read errors a member may return before it is taken out of service. Each one is repaired
/// from redundancy; a drive that keeps failing is more dangerous than a missing one.
pub const MEMBER_READ_ERRORS_MAX: u32 = 16;

/// The state of a member as the engine sees it. Only `Online` members are read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MemberState {
    Online = 0,
    /// Taken out by errors or by the administrator; its contents are stale from then on.
    Failed = 1,
    /// Not present at all.
    Missing = 2,
    /// Being rebuilt: written like an online member (so the rows the rebuild has passed stay
    /// current), read only in the rows below the rebuild's clean watermark (`rebuilt`).
    Rebuilding = 3,
}

impl MemberState {
    /// Only `set_member_state` stores a member state, always from a `MemberState`: any other
    /// byte is memory corruption, not a state to guess.
    fn from_u8(value: u8) -> MemberState {
        match value {
            0 => MemberState::Online,
            1 => MemberState::Failed,
            2 => MemberState::Missing,
            3 => MemberState::Rebuilding,
            _ => unreachable!("member state byte {value} is not a MemberState"),
        }
    }
}

/// The health of a whole VD, in MegaRAID's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VdState {
    /// Every member online.
    Optimal,
    /// RAID6/60 that lost one member per span at most: still redundant.
    PartiallyDegraded,
    /// Serving, but one more loss in some span loses data.
    Degraded,
    /// Lost more than it tolerates, or the write-back SSD cache holding its newest data: every
    /// I/O fails.
    Offline,
}

impl VdState {
    pub fn short_name(self) -> &'static str {
        match self {
            VdState::Optimal => "Optl",
            VdState::PartiallyDegraded => "Pdgd",
            VdState::Degraded => "Dgrd",
            VdState::Offline => "OfLn",
        }
    }
}

/// How a VD is laid out, before the member sizes are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VdLayout {
    pub level: Level,
    pub strip_size_bytes: u64,
    /// Drives per span for RAID 10/50/60 (`pdperarray`).
    pub drives_per_span: Option<usize>,
    /// Bytes of each member the VD is laid out on, as recorded in the metadata; `None` for a new
    /// VD, which takes its smallest member's size.
    pub member_size_bytes: Option<u64>,
}

/// The instant this process first asked: what "no client request yet" reads as.
fn clock_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `CLOCK_MONOTONIC_COARSE` in ns: the clock's last tick (1 to 4 ms old), read in a few ns
/// where `Instant::now` costs twenty-odd: it is taken on every client request.
fn coarse_now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to fill; the clock id is a constant the
    // kernel has had since 2.6.32.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    assert_eq!(result, 0, "CLOCK_MONOTONIC_COARSE is unavailable");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Source of [`VirtualDrive::instance_id`].
static NEXT_INSTANCE_ID: AtomicU64 = AtomicU64::new(1);

/// A virtual drive. `repr(C)` keeps the fields in the order written: what every request reads
/// or counts comes first, next to the `Arc`'s counts, and the large structures only a few paths
/// use (write streams, statistics, the bitmap) come last. In the order the compiler chose, the
/// fields a Fast Path read touches lay on about ten cache lines of a 3 KB struct, now on five;
/// where a shard streams megabytes of buffers between two requests of a VD (bench/hba's 1,024
/// reads in flight), each line is fetched again per request.
#[repr(C)]
pub struct VirtualDrive {
    /// Request pieces queued or running on shards, plus writes whose acknowledgement is held.
    requests_in_flight: AtomicUsize,
    /// Dirty bytes the shards' caches hold for it: reads that bypass the cache (the Fast Path)
    /// are allowed only while there are none.
    cache_dirty_bytes: AtomicU64,
    /// Reads the Fast Path served (see `fast_path`).
    fast_path_reads: AtomicU64,
    /// When a client last submitted a request, in ns of [`coarse_now_ns`] (0: never): background
    /// operations slow down to their rate while clients are busy.
    last_client_request_ns: AtomicU64,
    /// Set once the VD is deleted: every request fails from then on.
    retired: AtomicBool,
    /// A full initialization writes its members: client requests are refused meanwhile.
    initializing: AtomicBool,
    /// The journal is being replayed into it (see `io::parity::replayed_data_only`).
    replaying: AtomicBool,
    /// Whether `acks` holds or refuses acknowledgements now; written under its lock, read
    /// without it, so that a write completing with the gate open (nearly always) takes no lock.
    acks_gated: AtomicBool,
    /// Set while `migration` holds one: what every member write and the Fast Path read, a plain
    /// load where the lock would bounce a cache line between the submitting threads.
    migrating: AtomicBool,
    id: u64,
    geometry: Geometry,
    members: Vec<Member>,
    /// The policies the cache applies, changeable live, and the read-ahead streams.
    policies: policy::Policies,
    /// The SSD cache serving it, or whether it is one (`crate::ssd_cache`).
    ssd_cache: crate::ssd_cache::Attachment,
    /// Held requests and the successor at a migration's end (`migration`).
    switch: migration::Switch,
    /// VD ranges whose data is lost: reads of them fail (see `bad_blocks`).
    bad_blocks: BadBlocks,
    /// What the Fast Path's writes and the things they must not overtake agree through (see
    /// `fast_writes`).
    fast_writes: fast_writes::FastWrites,
    /// Unique to this object within the process. Clients bind to it, not to the VD number or
    /// name, so a VD deleted and another created in its place are never taken for each other.
    instance_id: u64,
    /// Changes on rename; the object (and every connection to it) stays.
    name: RwLock<String>,
    /// Serialises state changes so that two shards failing members at once see each other.
    state_change: Mutex<()>,
    /// Where member failures found by I/O are reported (the controller's watcher).
    notifier: std::sync::OnceLock<crossbeam_channel::Sender<MemberEvent>>,
    /// Counts initializations begun and ended: data read before a change of it may be older
    /// than what the members hold (the cache keeps no such data).
    init_epoch: AtomicU64,
    /// Parity rows written whole by gathering (`io::gather`), and the writes that joined them.
    pub(crate) write_streams: write_streams::WriteStreams,
    gather_waits: AtomicU64,
    gathered_rows: AtomicU64,
    gathered_joins: AtomicU64,
    acks: Mutex<AckGate>,
    /// The write-intent bitmap, set once by the controller before the VD serves (none for
    /// levels without redundancy, and in tests that do not want one).
    write_intent: std::sync::OnceLock<crate::bitmap::WriteIntent>,
    /// Which of its writes go around the journal (`journal_bypass`).
    journal_bypass: JournalBypass,
    /// What its clients saw, booked by the frontend that answers them (`io_stats`).
    client_io: io_stats::ClientIoStats,
    /// The whole VD being copied onto another drive (`migration`).
    migration: RwLock<Option<Arc<MigrationTarget>>>,
}

/// Holds write acknowledgements while a member failure is not yet in the metadata.
///
/// The rule (DESIGN.md, on-disk metadata): before a write proceeds without a member, the
/// member's failure is recorded; otherwise a crash could bring the member back as in service,
/// with stale contents under an acknowledged write. A write that completes while a failure is
/// unrecorded is acknowledged only once the controller has written it to the members.
#[derive(Default)]
struct AckGate {
    /// Member failures found by I/O and sent to the controller, not yet recorded.
    failures_unrecorded: u32,
    /// Why the last attempt to record a failure failed; writes fail until a record succeeds.
    record_error: Option<String>,
    held: Vec<(Done, VdCompletion)>,
}

/// A member the engine took out of service, reported to the controller.
#[derive(Clone, Debug)]
pub struct MemberEvent {
    pub vd_id: u64,
    /// [`VirtualDrive::instance_id`] of the VD object that found it.
    pub instance_id: u64,
    pub member: usize,
    pub state: MemberState,
    pub reason: String,
    /// The member's copy target failed, not the member (see `copy`).
    pub copy_target: bool,
}

impl VirtualDrive {
    /// Lays a VD out over `drives` (in member order).
    ///
    /// # Errors
    /// The layout rule the drives break (count, strip size, size), with what is allowed.
    pub fn new(id: u64, name: &str, layout: VdLayout, drives: Vec<Arc<dyn Drive>>) -> Result<VirtualDrive, layout::LayoutError> {
        let smallest_bytes = drives.iter().map(|d| d.info().capacity_bytes).min().unwrap_or(0);
        let member_size_bytes = layout.member_size_bytes.unwrap_or(smallest_bytes);
        let geometry = Geometry::new(GeometryConfig {
            level: layout.level,
            drive_count: drives.len(),
            drives_per_span: layout.drives_per_span,
            strip_size_bytes: layout.strip_size_bytes,
            member_size_bytes,
            member_reserved_bytes: MEMBER_RESERVED_BYTES,
        })?;
        let members = drives.into_iter().map(Member::new).collect();
        let instance_id = NEXT_INSTANCE_ID.fetch_add(1, Ordering::Relaxed);
        Ok(VirtualDrive {
            id,
            instance_id,
            bad_blocks: BadBlocks::new(id, instance_id),
            name: RwLock::new(name.to_string()),
            geometry,
            members,
            state_change: Mutex::new(()),
            notifier: std::sync::OnceLock::new(),
            retired: AtomicBool::new(false),
            initializing: AtomicBool::new(false),
            init_epoch: AtomicU64::new(0),
            last_client_request_ns: AtomicU64::new(0),
            requests_in_flight: AtomicUsize::new(0),
            write_streams: write_streams::WriteStreams::default(),
            gather_waits: AtomicU64::new(0),
            gathered_rows: AtomicU64::new(0),
            gathered_joins: AtomicU64::new(0),
            acks: Mutex::new(AckGate::default()),
            acks_gated: AtomicBool::new(false),
            write_intent: std::sync::OnceLock::new(),
            policies: policy::Policies::default(),
            replaying: AtomicBool::new(false),
            cache_dirty_bytes: AtomicU64::new(0),
            fast_path_reads: AtomicU64::new(0),
            fast_writes: fast_writes::FastWrites::default(),
            ssd_cache: crate::ssd_cache::Attachment::default(),
            journal_bypass: JournalBypass::with_cutoff_bytes(journal_bypass::default_cutoff_bytes(geometry.span_kind())),
            client_io: io_stats::ClientIoStats::default(),
            migration: RwLock::new(None),
            migrating: AtomicBool::new(false),
            switch: migration::Switch::default(),
        })
    }

    /// Which of its writes go around the journal: the stream table, the cutoff, the counts.
    pub fn journal_bypass(&self) -> &JournalBypass {
        &self.journal_bypass
    }

    /// From which length its sequential streams' large writes go around the journal (the
    /// controller sets it from the VD's record; the level's default until then).
    pub fn set_seq_cutoff(&self, cutoff: crate::config::SeqCutoff) {
        self.journal_bypass.set_cutoff_bytes(cutoff.bytes_for(self.geometry.level()));
    }

    /// Notes a client write for [`JournalBypass`]: whether it may go around the journal.
    pub(crate) fn note_write_for_bypass(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        self.journal_bypass.note_write(offset_bytes, len_bytes, self.geometry.row_data_bytes())
    }

    /// While set, writes are journal records being replayed: they go through as WT and, in a
    /// row that lacks a member and is not resynced, write the data they can.
    pub fn set_replaying(&self, replaying: bool) {
        self.replaying.store(replaying, Ordering::Release);
    }

    pub fn is_replaying(&self) -> bool {
        self.replaying.load(Ordering::Acquire)
    }

    /// Asserts that a shard's operation `op` on a member stays where a shard may go: the VD's
    /// data area (past the metadata every member carries at its start, short of the layout's
    /// end), or the write-intent bitmap's slots (`bitmap::ondisk`), the one part of the
    /// reserved area a shard writes. An operation anywhere else is a layout or placement bug
    /// that would overwrite the controller's configuration or return bytes the VD does not
    /// own, so it stops the process rather than reach the drive.
    pub(crate) fn assert_in_data_area(&self, index: usize, op: &drive::DriveOp) {
        let Some((offset_bytes, len_bytes)) = op.range_bytes() else { return };
        let end_bytes = offset_bytes + len_bytes;
        let data = self.geometry.data_offset_bytes()..self.geometry.member_used_bytes();
        let bitmap_slots = crate::bitmap::ondisk::slots_range_bytes();
        let inside = |area: &std::ops::Range<u64>| area.start <= offset_bytes && end_bytes <= area.end;
        assert!(
            inside(&data) || inside(&bitmap_slots),
            "VD {}: member {index} operation over {len_bytes} bytes at {offset_bytes} outside its data area {data:?} \
             and the bitmap's slots {bitmap_slots:?}",
            self.id
        );
    }

    /// A member operation starts: counted in the member's queue depth where something reads
    /// it (a mirror's choice of copy, `io::mirror`). Other levels skip the count, whose two
    /// atomic read-modify-writes per operation were a fifth of what the Fast Path adds to a
    /// JBOD SSD's 4 KiB read (`bench/hba`).
    pub(crate) fn member_io_started(&self, index: usize) {
        if self.chooses_copies() {
            self.members[index].outstanding.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends what [`VirtualDrive::member_io_started`] began.
    pub(crate) fn member_io_ended(&self, index: usize) {
        if self.chooses_copies() {
            let before = self.members[index].outstanding.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(before > 0, "v{}: member {index} ended more operations than it started", self.id);
        }
    }

    /// Whether reads choose between copies (RAID1, 1E, 10): what a member's queue depth and
    /// read streams are kept for.
    fn chooses_copies(&self) -> bool {
        matches!(self.geometry.span_kind(), SpanKind::Mirror | SpanKind::OffsetMirror)
    }

    /// A member operation over `len_bytes` at `offset_bytes` completed: where the member's head
    /// is now and, for a read of a copy (the only levels that choose where to read), the stream
    /// it continues.
    pub(crate) fn note_member_io(&self, index: usize, offset_bytes: u64, len_bytes: u64, read: bool) {
        let member = &self.members[index];
        member.last_end_bytes.store(offset_bytes + len_bytes, Ordering::Relaxed);
        if read && self.chooses_copies() {
            member.read_streams.record(offset_bytes, offset_bytes + len_bytes);
        }
    }

    /// A shard's cache gained (`delta` > 0) or lost dirty bytes of this VD.
    pub(crate) fn note_cache_dirty(&self, delta: i64) {
        if delta >= 0 {
            self.cache_dirty_bytes.fetch_add(delta as u64, Ordering::AcqRel);
        } else {
            let before = self.cache_dirty_bytes.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
            assert!(before >= delta.unsigned_abs(), "{}: the caches dropped more dirty bytes than they held", self.name());
        }
    }

    /// Reads the Fast Path served since the VD was opened.
    pub fn fast_path_reads(&self) -> u64 {
        self.fast_path_reads.load(Ordering::Relaxed)
    }

    pub(crate) fn count_fast_path_read(&self) {
        self.fast_path_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Dirty bytes the caches hold for this VD, over every shard.
    pub fn cache_dirty_bytes(&self) -> u64 {
        self.cache_dirty_bytes.load(Ordering::Acquire)
    }

    /// The write policy the cache applies to this VD (WT until the controller sets it).
    pub fn write_policy(&self) -> WritePolicy {
        self.policies.write()
    }

    /// Takes effect for the next write each shard serves.
    pub fn set_write_policy(&self, policy: WritePolicy) {
        self.policies.set_write(policy);
    }

    /// The read-ahead policy (NORA until the controller sets it).
    pub fn read_policy(&self) -> ReadPolicy {
        self.policies.read()
    }

    /// Whether reads keep their data in the cache (Direct until the controller sets it).
    pub fn io_policy(&self) -> IoPolicy {
        self.policies.io()
    }

    /// Sets the read-ahead and I/O policies for the next reads.
    pub fn set_read_policies(&self, read: ReadPolicy, io: IoPolicy) {
        self.policies.set_read(read);
        self.policies.set_io(io);
    }

    pub fn policies(&self) -> &policy::Policies {
        &self.policies
    }

    /// Gives the VD its write-intent bitmap, before it serves.
    ///
    /// # Panics
    /// If it has one already, or its level has no redundancy.
    pub fn set_write_intent(&self, intent: crate::bitmap::WriteIntent) {
        assert!(self.geometry.span_kind() != SpanKind::Stripe, "a level without redundancy has nothing to resync");
        assert!(self.write_intent.set(intent).is_ok(), "a VD's bitmap is set once");
    }

    pub fn write_intent(&self) -> Option<&crate::bitmap::WriteIntent> {
        self.write_intent.get()
    }

    /// Sends member failures found by I/O to `sender` (set once).
    pub fn set_notifier(&self, sender: crossbeam_channel::Sender<MemberEvent>) {
        let _ = self.notifier.set(sender);
    }

    pub fn id(&self) -> u64 {
        self.id
    }
    /// The SSD cache serving this VD, or whether it is a cache VD.
    /// Its clients' requests, latencies and errors (see `io_stats`).
    pub fn client_io(&self) -> &io_stats::ClientIoStats {
        &self.client_io
    }

    pub fn ssd_cache(&self) -> &crate::ssd_cache::Attachment {
        &self.ssd_cache
    }

    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }
    pub fn name(&self) -> String {
        self.name.read().expect("name lock poisoned").clone()
    }
    /// Renames the VD in place: clients connected to it stay connected to this object.
    pub fn set_name(&self, name: &str) {
        *self.name.write().expect("name lock poisoned") = name.to_string();
    }
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    pub fn capacity_bytes(&self) -> u64 {
        self.geometry.capacity_bytes()
    }
    pub fn members(&self) -> &[Member] {
        &self.members
    }
    pub fn member(&self, index: usize) -> &Member {
        &self.members[index]
    }
    pub fn bad_blocks(&self) -> &BadBlocks {
        &self.bad_blocks
    }

    pub(crate) fn offline_error(&self) -> VdError {
        VdError::Offline { vd: self.name(), level: self.geometry.level() }
    }

    /// Checks that a request fits the VD and is sector-aligned.
    pub fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VdError> {
        if !offset_bytes.is_multiple_of(layout::SECTOR_BYTES) || !len_bytes.is_multiple_of(layout::SECTOR_BYTES) {
            return Err(VdError::Misaligned { offset_bytes, len_bytes });
        }
        let capacity_bytes = self.capacity_bytes();
        if offset_bytes.checked_add(len_bytes).is_none_or(|end| end > capacity_bytes) {
            return Err(VdError::OutOfRange { vd: self.name(), offset_bytes, len_bytes, capacity_bytes });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drive::{DriveOp, IoBuf, MemDrive};
    use layout::{Level, KIB, MIB};

    /// A shard's member operations may touch the data area and the bitmap's slots, nothing
    /// else of the drive: not the configuration copies, not the bitmap's header, not past
    /// the layout's end.
    #[test]
    fn member_operations_outside_the_data_area_and_the_bitmap_slots_are_stopped() {
        let layout = VdLayout { level: Level::Raid5, strip_size_bytes: 64 * KIB, drives_per_span: None, member_size_bytes: None };
        let drives = (0..3).map(|_| Arc::new(MemDrive::new(MEMBER_RESERVED_BYTES + 8 * MIB)) as Arc<dyn Drive>).collect();
        let vd = VirtualDrive::new(0, "v", layout, drives).unwrap();
        let (start, end) = (vd.geometry().data_offset_bytes(), vd.geometry().member_used_bytes());
        let write = |offset_bytes: u64, len_bytes: usize| DriveOp::Write { offset_bytes, buf: IoBuf::zeroed(len_bytes) };
        let slots = crate::bitmap::ondisk::slots_range_bytes();
        for allowed in [write(start, 4096), write(end - 4096, 4096), write(slots.start, 4096), write(slots.end - 4096, 4096)] {
            vd.assert_in_data_area(1, &allowed);
        }
        vd.assert_in_data_area(1, &DriveOp::Flush);
        let stopped = [
            write(0, 4096),                  // the configuration's first copy
            write(slots.start - 4096, 4096), // the bitmap's header
            write(start - 4096, 8192),       // straddling the data area's start
            write(end - 4096, 8192),         // past the layout's end
        ];
        for op in stopped {
            let range = op.range_bytes();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| vd.assert_in_data_area(1, &op)));
            assert!(caught.is_err(), "an operation over {range:?} got through");
        }
    }
}
