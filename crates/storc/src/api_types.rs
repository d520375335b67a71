//! The management API's JSON, shared by the daemon (server side) and the CLI (client side).
//!
//! Routes (HTTP/1.1 over a Unix socket in the data directory, or TCP on loopback):
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET | /api/v1/controller | | `ControllerView` |
//! | PATCH | /api/v1/controller | `SetController` | `ControllerView` |
//! | GET | /api/v1/vds | | `Vec<VdView>` |
//! | GET | /api/v1/vds/{id} | | `VdView` |
//! | POST | /api/v1/vds | `CreateVd` | `VdView` (201) |
//! | PATCH | /api/v1/vds/{id} | `SetVd` | `VdView` |
//! | DELETE | /api/v1/vds/{id}?force=true | | `Message` |
//! | GET | /api/v1/vds/{id}/badblocks | | `BadBlocksView` |
//! | GET | /api/v1/drives | | `Vec<DriveView>` |
//! | GET | /api/v1/drives/{slot} | | `DriveView` |
//! | POST | /api/v1/drives/{slot}/state | `SetDriveState` | `DriveView` |
//! | POST | /api/v1/drives/{slot}/hotspare | `AddHotSpare` | `DriveView` |
//! | DELETE | /api/v1/drives/{slot}/hotspare | | `DriveView` |
//! | GET | /api/v1/rebuilds | | `Vec<RebuildView>` |
//! | POST | /api/v1/drives/{slot}/rebuild | `RebuildAction` | `RebuildView` |
//! | POST | /api/v1/drives/{slot}/insert | `InsertDrive` | `DriveView` |
//! | GET | /api/v1/copybacks | | `Vec<CopybackView>` |
//! | POST | /api/v1/drives/{slot}/copyback | `CopybackAction` | `CopybackView` |
//! | GET | /api/v1/migrations | | `Vec<MigrationView>` |
//! | POST | /api/v1/vds/{id}/migrate | `MigrateAction` | `MigrationView` |
//! | GET | /api/v1/ccs | | `Vec<CcView>` |
//! | POST | /api/v1/vds/{id}/cc | `CcAction` | `Message` |
//! | GET | /api/v1/bgis | | `Vec<BgiView>` |
//! | POST | /api/v1/vds/{id}/bgi | `BgiAction` | `Message` |
//! | GET | /api/v1/inits | | `Vec<InitView>` |
//! | POST | /api/v1/vds/{id}/init | `InitAction` | `Message` |
//! | GET | /api/v1/patrolread | | `PatrolReadView` |
//! | POST | /api/v1/patrolread | `PatrolReadAction` | `Message` |
//! | GET | /api/v1/events | | `Vec<EventView>` |
//! | GET | /api/v1/iostats | | `IoStatsView` |
//! | GET | /api/v1/foreign | | `Vec<ForeignView>` |
//! | POST | /api/v1/foreign/import | | `Message` |
//! | DELETE | /api/v1/foreign | | `Message` |
//!
//! Errors answer 400 (bad input, including a body or query field the request does not have), 404
//! (no such VD or slot) or 409 (not allowed in the current state) with an `ApiError` body whose
//! message names what is wrong and what is allowed. Over TCP, 421 (a Host header that does not
//! name the listener) and 403 (a client that is neither the daemon's user nor root) come before
//! any handler runs, then 401 (no API token, see `daemon::api_token`). Over TCP only, the console:
//! `GET /` (its page), `POST /console/login` (`ConsoleLogin`; sets the token's cookie),
//! `POST /console/logout`.

use serde::{Deserialize, Serialize};

// The console's DTOs in a file of their own (this one is long); `#[path]` so that the tests'
// copy of this module (`tests/common`) finds it too.
#[path = "api_types/console.rs"]
mod console;
pub use console::*;
// The background operations' views and commands (rebuild, copyback, check, BGI, init, migration).
#[path = "api_types/background.rs"]
mod background;
pub use background::*;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ApiError {
    pub error: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub message: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ControllerView {
    /// Always 0: one daemon is one controller.
    pub controller: u32,
    /// 32 hex digits.
    pub controller_id: String,
    pub product: String,
    pub version: String,
    /// Configuration generation on the drives.
    pub generation: u64,
    /// "Optimal" or "Needs Attention" (a VD not optimal, a drive failed or missing).
    pub status: String,
    pub drives: Vec<DriveView>,
    pub vds: Vec<VdView>,
    pub foreign_configurations: usize,
    /// Where clients reach the VDs: `nbd+unix:///NAME?socket=...` and `nbd://127.0.0.1:10809/NAME`.
    pub nbd_endpoints: Vec<String>,
    pub shards: usize,
    pub parity_kernels: String,
    /// A failed member is rebuilt onto a hot spare without asking (`autorebuild`).
    pub auto_rebuild: bool,
    /// Share of member bandwidth a rebuild takes while clients are busy (`rebuildrate`).
    pub rebuild_rate_percent: u8,
    /// A spare that took a member's place is copied back to that slot once it holds a good
    /// drive again, and returns to the spares (`copyback`).
    pub copyback: bool,
    /// Share of its speed alone a consistency check keeps while clients are busy (`ccrate`).
    pub cc_rate_percent: u8,
    /// The same for background initialization (`bgirate`).
    #[serde(default)]
    pub bgi_rate_percent: u8,
    /// When consistency checks start on their own: "off", "seq" or "conc" (`cc=`).
    #[serde(default)]
    pub cc_mode: String,
    #[serde(default)]
    pub cc_delay_hours: u16,
    /// When the next scheduled round starts (Unix seconds).
    #[serde(default)]
    pub cc_next_start_unix_secs: u64,
    /// The VDs of a sequential round still waiting for their turn.
    #[serde(default)]
    pub cc_queue: Vec<u32>,
}

/// `/c0 show patrolread`: its settings, and how far the one that runs is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PatrolReadView {
    pub enabled: bool,
    /// "auto" or "manual".
    pub mode: String,
    pub delay_hours: u16,
    pub rate_percent: u8,
    pub include_ssds: bool,
    /// "Active", "Paused" or "Stopped" (none runs).
    pub state: String,
    pub progress_percent: Option<f64>,
    /// The slot being read now.
    pub current_slot: Option<u32>,
    pub drives_done: u64,
    pub drives_total: u64,
    pub medium_errors: u64,
    pub corrected: u64,
    /// When the last one started (Unix seconds; 0: none has).
    pub last_start_unix_secs: u64,
    /// When the next one starts on its own; absent when off or manual.
    pub next_start_unix_secs: Option<u64>,
}

/// `/c0/bbu show`, `/c0/journal show`: the cache's journal, MegaRAID's battery.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JournalView {
    /// "Optimal", "Degraded" (a mirrored pair on one leg), "Failed" or "Missing".
    pub state: String,
    /// The device, as given (`--journal` or `set journal=`); absent without one.
    pub source: Option<String>,
    pub capacity_bytes: u64,
    /// Ring bytes over every partition (one per shard).
    pub ring_bytes: u64,
    /// Bytes that replay after a crash could need now.
    pub used_bytes: u64,
    pub partitions: u32,
    /// VD writes the replay at this start wrote to the VDs (from the journal's records; a
    /// group record carries several), and their bytes.
    pub replayed_records: u64,
    pub replayed_bytes: u64,
    /// Why it failed or is missing.
    pub reason: Option<String>,
    /// The controller cache (`--cache-size`) and what of it is dirty now.
    pub cache_bytes: u64,
    pub dirty_bytes: u64,
    /// Dirty bytes of offline VDs: preserved until the VD is back or its cache is discarded
    /// (`/c0/vN delete preservedcache`).
    #[serde(default)]
    pub pinned_bytes: u64,
    /// Clean data held (read and read ahead), reads served from the cache and not, and the
    /// bytes read ahead, since the start.
    pub clean_bytes: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    pub read_ahead_bytes: u64,
    /// Each device of the journal (two for a mirrored pair).
    #[serde(default)]
    pub legs: Vec<JournalLegView>,
}

/// One device of the journal.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JournalLegView {
    pub source: String,
    /// "Online" or "Failed".
    pub state: String,
    pub reason: Option<String>,
}

/// `/c0 set journal=DEVICE`: a journal assigned at run time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AttachJournal {
    /// A file path (created if missing), a block device, or `ssd:sata|sas|nvme:SIZE`; two of
    /// them separated by a comma for a mirrored pair.
    pub source: String,
}

/// `/c0 start|stop|pause|resume patrolread`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PatrolReadAction {
    pub action: String,
}

/// `/c0 set autorebuild=on|off rebuildrate=N copyback=on|off ccrate=N bgirate=N`; absent fields
/// keep their value.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetController {
    pub auto_rebuild: Option<bool>,
    pub rebuild_rate_percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copyback: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_rate_percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgi_rate_percent: Option<u8>,
    /// `patrolread=on|off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patrol_read: Option<bool>,
    /// `mode=auto|manual` (patrol read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patrol_mode: Option<String>,
    /// `delay=HOURS` (patrol read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patrol_delay_hours: Option<u16>,
    /// `prrate=N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patrol_rate_percent: Option<u8>,
    /// `includessds=on|off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patrol_include_ssds: Option<bool>,
    /// `cc=off|seq|conc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_mode: Option<String>,
    /// `delay=HOURS` after `cc=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_delay_hours: Option<u16>,
    /// `starttime=YYYY/MM/DD HH` (UTC), as Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_start_unix_secs: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VdView {
    pub vd: u32,
    pub drive_group: u32,
    pub name: String,
    /// "RAID5", "RAID10", "JBOD", ...
    pub level: String,
    /// storcli state: "Optl", "Pdgd", "Dgrd", "OfLn".
    pub state: String,
    pub size_bytes: u64,
    pub strip_size_bytes: u64,
    pub drives_per_span: u32,
    pub span_count: u32,
    pub member_slots: Vec<u32>,
    /// Member state per slot, in member order ("Onln", "Offln", "Failed", "Msng", "Rbld", "Cpybck").
    pub member_states: Vec<String>,
    /// "wt", "wb", "awb".
    pub write_policy: String,
    /// The write policy in effect ("wt" where "wb" is asked but the journal is not there yet).
    pub write_policy_effective: String,
    /// "nora", "ra", "adra".
    pub read_policy: String,
    /// "direct", "cached".
    pub io_policy: String,
    /// The NBD export name clients use.
    pub export_name: String,
    /// Regions that await a resync after an unclean stop (none when there are none).
    #[serde(default)]
    pub resync: Option<ResyncInfo>,
    /// Parity and copies agree with the data wherever the controller knows (storcli's
    /// `Consist`): false while a background initialization or a resync is pending.
    #[serde(default)]
    pub consistent: bool,
    /// Why reads do not take the Fast Path now (`None`: they do, for reads within a strip).
    #[serde(default)]
    pub fast_path_off: Option<String>,
    /// Reads the Fast Path served since the daemon started.
    #[serde(default)]
    pub fast_path_reads: u64,
    /// Why writes do not take the Fast Path now (`None`: they do, for writes within a strip
    /// of a RAID0 or JBOD VD).
    #[serde(default)]
    pub fast_path_writes_off: Option<String>,
    /// Writes the Fast Path served since the daemon started.
    #[serde(default)]
    pub fast_path_writes: u64,
    /// Write gathering on parity levels since the daemon started: row writes that waited for
    /// the rest of their row from the next write of a sequential stream, those the next write
    /// joined (written whole instead of two read-modify-writes), and the writes that joined.
    #[serde(default)]
    pub gather_waits: u64,
    #[serde(default)]
    pub gathered_rows: u64,
    #[serde(default)]
    pub gathered_joins: u64,
    /// Writes of sequential streams that went around the journal to the members since the
    /// daemon started (pieces and bytes), and the stream length from which they do (0: never).
    #[serde(default)]
    pub journal_bypass_cutoff_bytes: u64,
    /// The VD's `seqcutoff` setting behind that length: "default" (its level's), "off", or a
    /// size such as "4MiB".
    #[serde(default)]
    pub seq_cutoff: String,
    #[serde(default)]
    pub journal_bypassed_writes: u64,
    #[serde(default)]
    pub journal_bypassed_bytes: u64,
    /// Of those writes, the ones that took the cached rest of their row along, the row going
    /// to the members whole (`cache::bypass::complete_row`).
    #[serde(default)]
    pub journal_completed_rows: u64,
    /// A cache VD (SSD caching): it caches other VDs and is not exported.
    #[serde(default)]
    pub cache_vd: bool,
    /// Its side of SSD caching: what a cache VD holds, or which cache VD caches this one.
    #[serde(default)]
    pub ssd_cache: Option<SsdCacheInfo>,
}

/// SSD caching (CacheCade, write-through) of a VD, from either side.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SsdCacheInfo {
    /// The cache VD caching this VD (on a cached VD).
    pub cache_vd: Option<u32>,
    /// The VDs this cache VD caches (on a cache VD).
    pub cached_vds: Vec<u32>,
    /// Lines the cache serves: all of them on a cache VD, this VD's on a cached one.
    pub lines_valid: u64,
    /// Lines the cache VD holds at most (on a cache VD).
    pub line_count: u64,
    pub line_bytes: u64,
    /// Counters of the cache VD (zero on a cached VD).
    pub read_hits: u64,
    pub read_misses: u64,
    /// Reads of sequential streams past the cutoff that missed (they promote nothing).
    pub read_bypassed: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub write_updates: u64,
    /// Hits over hits and misses since the controller started.
    pub hit_ratio: f64,
    /// The cache keeps writes to its lines (write-back) rather than writing them through.
    #[serde(default)]
    pub write_back: bool,
    /// Lines newer on the cache VD than on their VD: all of them on a cache VD, this VD's on a
    /// cached one.
    #[serde(default)]
    pub lines_dirty: u64,
    /// Writes kept on the cache VD, lines destaged since (on a cache VD).
    #[serde(default)]
    pub writes_absorbed: u64,
    #[serde(default)]
    pub lines_destaged: u64,
    /// This VD is offline: its write-back cache VD failed holding its newest data.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// A VD's resync after an unclean stop: its dirty regions' parity or copies are recomputed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResyncInfo {
    /// "Pending" (waits for every member to be in service) or "In progress".
    pub status: String,
    /// Regions left to resync.
    pub regions: u64,
    pub percent_done: Option<u64>,
}

/// `/c0/vN show badblocks`: the VD's byte ranges whose data is lost (nothing that held it could
/// be read). Reads that touch one fail; writing one makes it good again.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BadBlocksView {
    pub vd: u32,
    /// Most ranges the list holds; a loss past it is not recorded and the rebuild's member stays Rbld.
    pub max_ranges: usize,
    pub bad_blocks: Vec<BadBlockView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BadBlockView {
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// The same range in 512-byte sectors.
    pub lba: u64,
    pub sectors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DriveView {
    pub slot: u32,
    /// 32 hex digits.
    pub drive_id: String,
    /// storcli state: "UGood", "UBad", "Onln", "Offln", "Failed", "Msng", "GHS", "DHS", "Rbld",
    /// "Cpybck", or "Frgn" (holds a foreign configuration).
    pub state: String,
    /// Drive group it belongs to (as member or dedicated spare), if any.
    pub drive_group: Option<u32>,
    /// VD it is a member of, if any.
    pub vd: Option<u32>,
    pub size_bytes: u64,
    /// `mem:8GiB`, a path, `hdd:15k:600GiB`, ...
    pub source: String,
    /// "Memory", "File", "BlockDevice", "Emulated", "Network" (an NBD export), "Rbd".
    pub kind: String,
    pub direct_io: bool,
    /// For dedicated hot spares: the drive groups it serves (empty for global spares).
    pub hot_spare_drive_groups: Vec<u32>,
    pub read_errors: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateVd {
    /// "r0", "r1", "r1e", "r5", "r6", "r10", "r50", "r60", "jbod".
    pub level: String,
    pub drives: Vec<u32>,
    /// KiB; default 64.
    pub strip_kib: Option<u64>,
    pub name: Option<String>,
    /// Drives per span for r10/r50/r60.
    pub pdperarray: Option<u32>,
    /// "wt" (default), "wb", "awb".
    pub write_policy: Option<String>,
    /// "nora" (default), "ra", "adra".
    pub read_policy: Option<String>,
    /// "direct" (default), "cached".
    pub io_policy: Option<String>,
    /// A cache VD for SSD caching (`add vd cachecade`): r0, r1 or r10, not exported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cachecade: bool,
    /// With `cachecade`: VDs it caches from the start (`assignvds=0,1`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assign_vds: Vec<u32>,
    /// From which length a sequential stream's writes go around the journal: "default" (the
    /// level's), "off", or a size in whole MiB ("4MiB").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_cutoff: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetVd {
    pub write_policy: Option<String>,
    pub read_policy: Option<String>,
    pub io_policy: Option<String>,
    pub name: Option<String>,
    /// SSD caching: "on" (by the only cache VD), "off", or "vN" (by cache VD N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd_caching: Option<String>,
    /// From which length a sequential stream's writes go around the journal: "default",
    /// "off", or a size in whole MiB ("4MiB").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_cutoff: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SetDriveState {
    /// "offline", "online", "missing", "good".
    pub state: String,
    /// With "online": even though the member missed writes (`set online force`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AddHotSpare {
    /// Empty for a global hot spare; drive groups for a dedicated one.
    pub drive_groups: Vec<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventView {
    pub sequence: u64,
    /// Seconds since the Unix epoch.
    pub time_unix_secs: u64,
    /// "info", "warning", "critical".
    pub severity: String,
    pub description: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ForeignView {
    pub controller_id: String,
    pub generation: u64,
    pub slots: Vec<u32>,
    pub vds: Vec<ForeignVdView>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ForeignVdView {
    pub name: String,
    pub level: String,
    pub size_bytes: u64,
}
