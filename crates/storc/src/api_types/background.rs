//! The DTOs of the background operations' routes: rebuilds, copybacks, consistency checks,
//! background and full initialization, migrations (their views and their commands).

use serde::{Deserialize, Serialize};

/// One consistency check (storcli's `show cc` table).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CcView {
    pub vd: u32,
    pub progress_percent: f64,
    /// "In progress", "Paused" or "Stopped".
    pub status: String,
    /// At the speed so far; absent until there is one.
    pub estimated_seconds_left: Option<u64>,
    pub rate_percent: u8,
    /// Whether it rewrites what disagrees (repair) or only reports it.
    pub repair: bool,
    pub rows_checked: u64,
    pub rows_inconsistent: u64,
    pub rows_repaired: u64,
}

/// `/c0/vN start cc [repair|report]` or `/c0/vN stop|pause|resume cc`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CcAction {
    /// start, stop, pause or resume.
    pub action: String,
    /// With start only: rewrite what disagrees (the default, as MegaRAID does) or only report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<bool>,
}

/// One background initialization (storcli's `show bgi` table).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BgiView {
    pub vd: u32,
    pub progress_percent: f64,
    /// "In progress", "Paused", "Stopped", or "Waiting (...)" while a member is out.
    pub status: String,
    /// At the speed so far; absent until there is one.
    pub estimated_seconds_left: Option<u64>,
    pub rate_percent: u8,
    /// Write-intent bitmap regions not yet initialized, of `region_count`.
    pub regions_left: u64,
    pub region_count: u64,
}

/// `/c0/vN stop|pause|resume bgi`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BgiAction {
    /// stop, pause or resume.
    pub action: String,
}

/// `/c0/vN start init [full] [force]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InitAction {
    /// Every row written with zeros while the VD refuses I/O; otherwise (fast) the first and
    /// last 8 MiB only.
    #[serde(default)]
    pub full: bool,
    /// Even with NBD clients connected.
    #[serde(default)]
    pub force: bool,
}

/// A full initialization that runs (storcli's `show init` table).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InitView {
    pub vd: u32,
    pub progress_percent: f64,
    pub elapsed_seconds: u64,
}

/// One copy (copyback or proactive replacement; storcli's `show copyback` table).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CopybackView {
    /// The slot receiving the copy (Cpybck).
    pub slot: u32,
    /// The member being copied.
    pub source_slot: u32,
    pub vd: u32,
    pub progress_percent: f64,
    /// "In progress", "Paused" or "Stopped".
    pub status: String,
    /// At the speed so far; absent until there is one.
    pub estimated_seconds_left: Option<u64>,
    /// The rebuild rate, which copies share.
    pub rate_percent: u8,
}

/// `/c0/sN start copyback target=M` (N the member to copy, M the drive receiving it), or
/// `/c0/sN stop|pause|resume copyback` (N the source or the target of a copy).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CopybackAction {
    /// start, stop, pause or resume.
    pub action: String,
    /// With start only: the slot receiving the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<u32>,
}

/// One migration of a whole VD onto one drive (`show migrate`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MigrationView {
    pub vd: u32,
    /// The slot receiving the VD (Mgrt); the VD becomes a JBOD of it at the end.
    pub target_slot: u32,
    /// What that drive was opened from: `rbd:POOL/IMAGE`, a path.
    pub target_source: String,
    pub progress_percent: f64,
    /// "In progress", "Paused" or "Stopped".
    pub status: String,
    /// At the speed so far; absent until there is one.
    pub estimated_seconds_left: Option<u64>,
    /// The rebuild rate, which migrations share.
    pub rate_percent: u8,
}

/// `/c0/vN start migrate target=M` (M a UGood slot), or `/c0/vN stop migrate`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MigrateAction {
    /// start, pause, resume or stop.
    pub action: String,
    /// With start only: the drive receiving the VD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<MigrateTarget>,
}

/// The drive a migration moves a VD onto: a UGood slot (`8`), or a drive the daemon opens, and
/// creates when it does not exist, and adds to the controller (`"rbd:POOL/IMAGE"`, a path).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MigrateTarget {
    Slot(u32),
    Drive(String),
}

/// One rebuild (storcli's `show rebuild` table).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RebuildView {
    /// The slot being rebuilt.
    pub slot: u32,
    pub vd: u32,
    pub progress_percent: f64,
    /// "In progress", "Paused" or "Stopped".
    pub status: String,
    /// At the speed so far; absent until there is one.
    pub estimated_seconds_left: Option<u64>,
    pub rate_percent: u8,
}

/// `/c0/sN insert dg=D array=A row=R`: an unconfigured good drive takes the place of the member
/// at row R of span (array) A of drive group D, which must be out of service, and is rebuilt.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InsertDrive {
    pub drive_group: u32,
    pub array: u32,
    pub row: u32,
}

/// `/c0/sN start|stop|pause|resume rebuild`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RebuildAction {
    /// start, stop, pause or resume.
    pub action: String,
}
