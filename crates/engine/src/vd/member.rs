//! One member drive of a VD: the drive (replaced when a spare takes its place), its state, and
//! what the I/O paths track about it (outstanding I/Os, head position, read streams, errors,
//! missed writes, a copy in progress).

use super::{rebuilt, streams, CopyTarget, MemberState};
use drive::{Drive, DriveKind};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

/// One member drive of a VD and what the engine tracks about it. `repr(C, align(64))`: what
/// every I/O of the member reads or writes (the drive, its state and kind, the copy flag, the
/// head position, the queue depth) fills the first cache line, and members do not share lines.
#[repr(C, align(64))]
pub struct Member {
    /// Replaced when a spare or a new drive takes the member's place (while the member is out
    /// of service, so no new I/O reaches the old drive).
    pub(super) drive: RwLock<Arc<dyn Drive>>,
    pub(super) state: AtomicU8,
    /// `copy` holds a copy: set and cleared under its write lock, read without a lock by the
    /// Fast Path's checks.
    pub(super) copying: AtomicBool,
    /// The drive is an SSD or memory (the Fast Path's rule), kept with `drive`.
    pub(super) fast_drive: AtomicBool,
    /// I/Os submitted and not completed, across shards, counted on mirrors only (their read
    /// selection is its one reader; see `VirtualDrive::member_io_started`).
    pub(crate) outstanding: AtomicU32,
    /// Where the last I/O ended: the head position for "nearer copy" decisions.
    pub(crate) last_end_bytes: AtomicU64,
    pub(super) read_errors: AtomicU32,
    /// Set when a write reached the VD while this member was out of service: its contents are
    /// stale and it must not be brought back online without a rebuild.
    pub(super) missed_writes: std::sync::atomic::AtomicBool,
    /// Where its recent reads ended (mirror stream affinity).
    pub(crate) read_streams: streams::StreamEnds,
    /// The copy of this member to another drive, while one runs (see `copy`).
    pub(super) copy: RwLock<Option<Arc<CopyTarget>>>,
    /// While `Rebuilding`: the rows the rebuild made current (see `rebuilt`).
    pub(super) rebuilt: rebuilt::RebuiltRows,
}

/// SSDs and memory: the drives the Fast Path reads directly (next to a hard disk's seek, the
/// hop it saves is nothing).
fn is_fast_drive(drive: &dyn Drive) -> bool {
    drive.info().kind == DriveKind::Memory || drive.info().solid_state
}

impl Member {
    pub(super) fn new(drive: Arc<dyn Drive>) -> Member {
        Member {
            state: AtomicU8::new(MemberState::Online as u8),
            outstanding: AtomicU32::new(0),
            last_end_bytes: AtomicU64::new(0),
            read_streams: streams::StreamEnds::default(),
            read_errors: AtomicU32::new(0),
            missed_writes: std::sync::atomic::AtomicBool::new(false),
            copy: RwLock::new(None),
            copying: AtomicBool::new(false),
            fast_drive: AtomicBool::new(is_fast_drive(&*drive)),
            drive: RwLock::new(drive),
            rebuilt: rebuilt::RebuiltRows::default(),
        }
    }

    /// Puts `drive` in this member's place.
    pub(super) fn set_drive(&self, drive: Arc<dyn Drive>) {
        let mut current = self.drive.write().expect("member drive lock poisoned");
        self.fast_drive.store(is_fast_drive(&*drive), Ordering::Release);
        *current = drive;
    }

    /// Whether a copy of this member runs, without taking its lock.
    pub fn is_copying(&self) -> bool {
        // SeqCst: one side of the handshake with Fast Path writes (see `fast_writes`).
        self.copying.load(Ordering::SeqCst)
    }

    /// Whether the member's drive is an SSD or memory, without taking its lock.
    pub fn is_fast_drive(&self) -> bool {
        self.fast_drive.load(Ordering::Acquire)
    }

    /// The copy of this member to another drive, if one runs. The I/O path reads it before
    /// [`Member::drive`] (see `copy`).
    pub fn copy_target(&self) -> Option<Arc<CopyTarget>> {
        self.copy.read().expect("member copy lock poisoned").clone()
    }

    pub fn has_missed_writes(&self) -> bool {
        self.missed_writes.load(Ordering::Acquire)
    }

    /// The drive that holds this member now.
    pub fn drive(&self) -> Arc<dyn Drive> {
        Arc::clone(&self.drive.read().expect("member drive lock poisoned"))
    }

    /// Runs `f` on the drive that holds this member now, under the member's read lock: for a
    /// call that does not keep the drive (an operation's submission), without the two atomic
    /// read-modify-writes of an `Arc` clone and drop.
    pub fn with_drive<R>(&self, f: impl FnOnce(&dyn Drive) -> R) -> R {
        f(&**self.drive.read().expect("member drive lock poisoned"))
    }

    pub fn state(&self) -> MemberState {
        MemberState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn read_error_count(&self) -> u32 {
        self.read_errors.load(Ordering::Relaxed)
    }
}
