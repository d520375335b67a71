//! The controller's public types: how it is opened, what it is told to do, what it shows, and
//! how it refuses.

use super::*;

/// How to open a controller, beyond its drives.
#[derive(Default)]
pub struct ControllerOptions {
    /// This controller's id if it has one (the daemon keeps it in its data directory): with
    /// drives of several controllers present, only it decides which configuration is ours.
    pub ours: Option<ControllerId>,
    /// Where the event log is kept across restarts; in memory only without one.
    pub event_log_path: Option<PathBuf>,
    /// What the caller found before the controller existed (a drive that cannot be opened),
    /// logged as the first events of this start.
    pub startup_events: Vec<(Severity, String)>,
    /// The cache's journal: no device, one, or a mirrored pair (`storc serve --journal`,
    /// given once or twice).
    pub journal: Vec<super::JournalOffer>,
}

/// A drive offered to the controller at start: the drive and where it came from.
pub struct OfferedDrive {
    pub drive: Arc<dyn Drive>,
    /// `mem:8GiB`, a path, an emulated drive spec.
    pub source: String,
}

/// Why a control request was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// Malformed or impossible input (400).
    BadInput(String),
    /// No such VD, slot or foreign configuration (404).
    NotFound(String),
    /// Not allowed in the current state (409).
    Conflict(String),
    /// The change was applied in memory but metadata could not be written (500).
    Io(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::BadInput(m) | ControlError::NotFound(m) | ControlError::Conflict(m) | ControlError::Io(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ControlError {}

impl ControlError {
    /// The same refusal with `note` after its message.
    #[must_use]
    pub fn with_note(self, note: &str) -> ControlError {
        match self {
            ControlError::BadInput(m) => ControlError::BadInput(format!("{m} {note}")),
            ControlError::NotFound(m) => ControlError::NotFound(format!("{m} {note}")),
            ControlError::Conflict(m) => ControlError::Conflict(format!("{m} {note}")),
            ControlError::Io(m) => ControlError::Io(format!("{m} {note}")),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub sequence: u64,
    pub time_unix_secs: u64,
    pub severity: Severity,
    pub description: String,
}

/// What `add vd` asks for.
#[derive(Clone, Debug)]
pub struct CreateVdSpec {
    pub level: Level,
    pub slots: Vec<u32>,
    pub strip_size_bytes: u64,
    pub name: Option<String>,
    pub drives_per_span: Option<usize>,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
    /// `seqcutoff=`: from which length a sequential stream goes around the journal.
    pub seq_cutoff: SeqCutoff,
}

/// What `set` changes on a VD; `None` keeps the current value.
#[derive(Clone, Debug, Default)]
pub struct VdChanges {
    pub write_policy: Option<WritePolicy>,
    pub read_policy: Option<ReadPolicy>,
    pub io_policy: Option<IoPolicy>,
    pub name: Option<String>,
    /// `seqcutoff=`: from which length a sequential stream goes around the journal.
    pub seq_cutoff: Option<SeqCutoff>,
}

/// What `/c0 set` changes; `None` keeps the current value.
#[derive(Clone, Copy, Debug, Default)]
pub struct ControllerChanges {
    pub auto_rebuild: Option<bool>,
    pub rebuild_rate_percent: Option<u8>,
    pub copyback: Option<bool>,
    pub cc_rate_percent: Option<u8>,
    pub bgi_rate_percent: Option<u8>,
    /// `patrolread=on|off`.
    pub patrol_read: Option<bool>,
    /// `mode=manual` (true) or `mode=auto`.
    pub patrol_manual: Option<bool>,
    /// `delay=HOURS`, at least 1.
    pub patrol_delay_hours: Option<u16>,
    /// `prrate=N`.
    pub patrol_rate_percent: Option<u8>,
    /// `includessds=on|off`.
    pub patrol_include_ssds: Option<bool>,
    /// `cc=off|seq|conc`.
    pub cc_mode: Option<crate::config::CcMode>,
    /// `delay=HOURS` after `cc=`, at least 1.
    pub cc_delay_hours: Option<u16>,
    /// `starttime=...` (Unix seconds): when the next round starts. Turning the schedule on
    /// without it starts a round at once.
    pub cc_start_unix_secs: Option<u64>,
}

/// What `/c0/sN set` asks for. What each may change is `state::TRANSITIONS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriveCommand {
    Offline,
    Online,
    Missing,
    Good,
}

/// A drive slot as the controller sees it now.
#[derive(Clone)]
pub struct SlotView {
    pub slot: u32,
    pub drive_id: DriveId,
    pub state: DriveState,
    /// Carries another controller's configuration (not written until imported or cleared).
    pub foreign: bool,
    pub vd: Option<u32>,
    pub hot_spare_drive_groups: Option<Vec<u32>>,
    pub capacity_bytes: u64,
    pub source: String,
    pub info: Option<DriveInfo>,
    pub read_errors: u32,
}

/// A configuration found on drives written by another controller.
#[derive(Clone, Debug)]
pub struct ForeignConfig {
    pub superblock: Superblock,
    /// Our slots holding its drives.
    pub slots: Vec<u32>,
}
