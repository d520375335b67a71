//! What crosses a virtual drive's boundary: requests and their completions, the errors a request
//! or a row job ends with, check outcomes, and sets of members.

use drive::{DriveError, IoBuf};
use layout::Level;

/// Why a VD request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VdError {
    #[error("range {offset_bytes}+{len_bytes} is past the end of virtual drive {vd} ({capacity_bytes} bytes)")]
    OutOfRange { vd: String, offset_bytes: u64, len_bytes: u64, capacity_bytes: u64 },
    #[error("offset {offset_bytes} and length {len_bytes} must be multiples of 512 bytes")]
    Misaligned { offset_bytes: u64, len_bytes: u64 },
    #[error("virtual drive {vd} is offline: it lost more members than {level} tolerates")]
    Offline { vd: String, level: Level },
    #[error("virtual drive {vd}: member {member} failed and the data has no other copy: {error}")]
    Unrecoverable { vd: String, member: usize, error: DriveError },
    #[error("the engine is stopped")]
    Stopped,
    #[error("virtual drive {vd} was deleted")]
    Deleted { vd: String },
    #[error("virtual drive {vd} is being initialized (full): it refuses I/O until every row is written; `show init` says how far it is")]
    Initializing { vd: String },
    #[error("virtual drive {vd}: a member failed and the failure could not be recorded in the metadata ({detail}); writes are refused until it is")]
    FailureUnrecorded { vd: String, detail: String },
    #[error("virtual drive {vd} is {level}, which keeps no redundancy: there is nothing to {action} a row from")]
    NoRedundancy { vd: String, level: Level, action: &'static str },
    #[error("virtual drive {vd} has {row_count} rows: row {row} does not exist")]
    RowOutOfRange { vd: String, row: u64, row_count: u64 },
    #[error("virtual drive {vd} has {member_count} members: member {member} does not exist")]
    MemberOutOfRange { vd: String, member: usize, member_count: usize },
    /// A row job found data that nothing holds any more and could not record it as a bad
    /// block; nothing was written over it.
    #[error("virtual drive {vd}: row {row} of member {member} cannot be rebuilt: no other member holds what it needs, and the loss cannot be recorded as a bad block: {detail}")]
    RowUnrecoverable { vd: String, row: u64, member: usize, detail: String },
    /// A read touched a range of the VD's bad-block list.
    #[error("virtual drive {vd}: bytes {offset_bytes}..{} (LBA {}, {} sectors) are a bad block: their data was lost when nothing that held it could be read; writing them makes them good again", offset_bytes + len_bytes, offset_bytes / layout::SECTOR_BYTES, len_bytes / layout::SECTOR_BYTES)]
    BadBlock { vd: String, offset_bytes: u64, len_bytes: u64 },
    #[error("virtual drive {vd}: row {row} cannot be checked: member {member} is out of service")]
    RowMemberOut { vd: String, row: u64, member: usize },
    #[error("virtual drive {vd}: row {row} needs its parity to be read now, and its region is not yet resynced (after an unclean stop) or initialized (a new VD over old data): its parity may not match")]
    RowNotResynced { vd: String, row: u64 },
    #[error("virtual drive {vd}: row {row}: {action} member {member} failed: {error}")]
    RowMemberIo { vd: String, row: u64, member: usize, action: &'static str, error: DriveError },
    #[error("virtual drive {vd}: member {member} is no longer being copied (its copy target failed or left, or the member left service)")]
    CopyEnded { vd: String, member: usize },
    #[error("virtual drive {vd} is no longer being migrated (its migration target failed, or the migration ended)")]
    MigrationEnded { vd: String },
    #[error("virtual drive {vd} is offline: its write-back SSD cache (cache VD {cache_vd}) failed while holding data not yet written to it; delete the cache VD to discard that data and bring {vd} back with what its members hold")]
    SsdCacheLost { vd: String, cache_vd: String },
    #[error("virtual drive {vd}: its write-back SSD cache (cache VD {cache_vd}) could not record the write: {detail}")]
    SsdCacheWrite { vd: String, cache_vd: String, detail: String },
}

/// Whether a consistency check rewrites what it finds wrong, as MegaRAID's check does by
/// default, or only reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckMode {
    Report,
    /// Rewrites what disagrees. A RAID6 row whose P and Q both name one data strip as wrong gets
    /// that strip corrected (silent corruption of one strip).
    Repair,
    /// Makes the redundancy agree with the data as it stands: parity recomputed, copies made
    /// equal to copy 0; data strips are never rewritten. What a resync after an unclean stop
    /// needs: there a write dropped on one data strip looks exactly like a corrupt strip to
    /// RAID6's syndromes, yet clients may already have read what that strip holds.
    Resync,
}

impl CheckMode {
    /// Whether the check writes what it finds wrong.
    pub fn writes(self) -> bool {
        self != CheckMode::Report
    }
}

/// What a consistency check found in one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOutcome {
    pub row: u64,
    pub mismatches: Vec<Mismatch>,
    /// Whether every mismatch was rewritten ([`CheckMode::Repair`] with something to repair).
    pub repaired: bool,
}

impl CheckOutcome {
    pub fn is_consistent(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// One disagreement inside a row, named as precisely as the level allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Mirrors: the copies of data strip `strip_index` differ. `members` holds copy 0's member
    /// first, then the members whose copy differs from it; nothing says which copy is right, so
    /// a repair copies copy 0 over the others.
    Copies { strip_index: usize, members: Vec<usize> },
    /// The parity disagrees with the data and the wrong strip cannot be named: RAID5 always,
    /// RAID6 when more than one strip is wrong. A repair recomputes P (and Q) from the data.
    Unlocated { p_member: usize, q_member: Option<usize> },
    /// RAID6: P and Q name the one member whose strip is wrong (data, P or Q). A repair rewrites
    /// that strip from the others.
    Member { member: usize, role: layout::Role },
}

/// A set of member indices (a VD has at most 8 spans of 32 drives).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberSet([u64; 4]);

impl MemberSet {
    /// Most members a set can hold.
    pub const MEMBERS_MAX: usize = 256;

    pub fn of(members: &[usize]) -> MemberSet {
        let mut set = MemberSet::default();
        for &member in members {
            set.insert(member);
        }
        set
    }
    pub fn insert(&mut self, index: usize) {
        assert!(index < Self::MEMBERS_MAX, "member {index} past the {} a set holds", Self::MEMBERS_MAX);
        self.0[index / 64] |= 1 << (index % 64);
    }
    pub fn contains(&self, index: usize) -> bool {
        index < Self::MEMBERS_MAX && self.0[index / 64] & (1 << (index % 64)) != 0
    }
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
    pub fn union(mut self, other: MemberSet) -> MemberSet {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        self
    }
    /// The members in the set, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..Self::MEMBERS_MAX).filter(|&index| self.contains(index))
    }
}

/// A request to a VD. Buffers move in and come back in the completion.
#[derive(Debug)]
pub enum VdRequest {
    Read {
        offset_bytes: u64,
        buf: IoBuf,
    },
    Write {
        offset_bytes: u64,
        buf: IoBuf,
    },
    /// Every write completed before the flush was submitted is durable when it completes.
    Flush,
}

impl VdRequest {
    pub fn range_bytes(&self) -> Option<(u64, u64)> {
        match self {
            VdRequest::Read { offset_bytes, buf } | VdRequest::Write { offset_bytes, buf } => Some((*offset_bytes, buf.len() as u64)),
            VdRequest::Flush => None,
        }
    }

    pub(crate) fn into_buf(self) -> Option<IoBuf> {
        match self {
            VdRequest::Read { buf, .. } | VdRequest::Write { buf, .. } => Some(buf),
            VdRequest::Flush => None,
        }
    }
}

/// The outcome of a request: the result and the buffer (read data, or the written buffer back).
#[derive(Debug)]
pub struct VdCompletion {
    pub result: Result<(), VdError>,
    pub buf: Option<IoBuf>,
}
