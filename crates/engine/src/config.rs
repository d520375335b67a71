//! The controller's configuration: what every member drive carries in its metadata area, and
//! what the controller assembles from them on start.
//!
//! These are plain values; `metadata` encodes them on disk, `controller` acts on them.

use layout::Level;

/// Identifies a controller (one `storc serve` and the drives it owns). Random at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerId(pub u128);

/// Identifies one physical drive for its lifetime, whatever slot or path it appears at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DriveId(pub u128);

/// A physical drive's state, in storcli's words. Which state may follow which, and why, is
/// `controller::state`'s table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriveState {
    /// Usable, in no drive group (`UGood`).
    UnconfiguredGood,
    /// Member of a drive group and in service (`Onln`).
    Online,
    /// Taken out by the administrator (`Offln`); its contents are stale from then on.
    Offline,
    /// Taken out by errors (`Failed`).
    Failed,
    /// Expected by the configuration but not present (`Msng`).
    Missing,
    /// A hot spare, global or dedicated (`GHS` / `DHS`).
    HotSpare,
    /// Being rebuilt from the rest of its drive group (`Rbld`).
    Rebuild,
    /// Receiving a copy of a member: copyback to the replaced slot, or a proactive replacement
    /// (`Cpybck`).
    Copyback,
    /// Failed and in no drive group (`UBad`): not used until the administrator makes it good.
    UnconfiguredBad,
    /// Holds the cache's journal (or one leg of a mirrored pair) past its metadata area
    /// (`/c0/sN set journal`): in no drive group.
    Journal,
    /// Receiving a whole VD (live migration, `/c0/vN start migrate`): in no drive group until
    /// the VD switches to it (`Mgrt`).
    Migrate,
}

impl DriveState {
    pub const ALL: [DriveState; 11] = [
        DriveState::UnconfiguredGood,
        DriveState::Online,
        DriveState::Offline,
        DriveState::Failed,
        DriveState::Missing,
        DriveState::HotSpare,
        DriveState::Rebuild,
        DriveState::Copyback,
        DriveState::UnconfiguredBad,
        DriveState::Journal,
        DriveState::Migrate,
    ];

    /// storcli's abbreviation.
    pub fn short_name(self) -> &'static str {
        match self {
            DriveState::UnconfiguredGood => "UGood",
            DriveState::Online => "Onln",
            DriveState::Offline => "Offln",
            DriveState::Failed => "Failed",
            DriveState::Missing => "Msng",
            DriveState::HotSpare => "HSP",
            DriveState::Rebuild => "Rbld",
            DriveState::Copyback => "Cpybck",
            DriveState::UnconfiguredBad => "UBad",
            DriveState::Journal => "Jrnl",
            DriveState::Migrate => "Mgrt",
        }
    }
}

/// When a write is acknowledged (DESIGN.md, durability rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePolicy {
    /// Write-through: after the member drives have it.
    WriteThrough,
    /// Write-back: after the journal has it; runs as WT without a healthy journal.
    WriteBack,
    /// Always write-back: after RAM has it (unsafe; for benchmarks).
    AlwaysWriteBack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadPolicy {
    NoReadAhead,
    ReadAhead,
    /// Read ahead only for detected sequential streams.
    Adaptive,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoPolicy {
    /// Reads bypass the cache.
    Direct,
    Cached,
}

/// From which length a sequential stream's large writes go around the journal, straight to the
/// members (`vd::journal_bypass`; bcache's `sequential_cutoff`). Set per VD
/// (`/cx/vx set seqcutoff=`) and kept in the configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SeqCutoff {
    /// The level's default: 4 MiB without parity, never with it (`vd::journal_bypass` says
    /// why).
    #[default]
    LevelDefault,
    /// Every write goes through the journal.
    Never,
    /// A stream of this many MiB (1 to [`SeqCutoff::MIB_MAX`]).
    Mib(u16),
}

impl SeqCutoff {
    /// The largest cutoff, in MiB (the on-disk field is 16 bits; its top value means never).
    pub const MIB_MAX: u16 = u16::MAX - 1;
    /// What the CLI and the API accept.
    pub const ALLOWED: &'static str =
        "default (the level's: 4MiB without parity, off with it), off, or a size in whole MiB from 1MiB to 65534MiB (e.g. 4MiB, 1GiB)";

    /// Parses `default`, `off` or a size in whole MiB (`4MiB`, `1GiB`).
    ///
    /// # Errors
    /// What is wrong with `text`, and what is allowed.
    pub fn parse(text: &str) -> Result<SeqCutoff, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "default" => return Ok(SeqCutoff::LevelDefault),
            "off" => return Ok(SeqCutoff::Never),
            _ => {}
        }
        let bytes = drive::parse_size_bytes(text).map_err(|e| format!("seqcutoff: {e}; allowed: {}", SeqCutoff::ALLOWED))?;
        let mib = bytes.is_multiple_of(1 << 20).then_some(bytes >> 20).filter(|mib| (1..=u64::from(SeqCutoff::MIB_MAX)).contains(mib));
        match mib {
            Some(mib) => Ok(SeqCutoff::Mib(mib as u16)),
            None => Err(format!("seqcutoff={text:?} is not allowed; allowed: {}", SeqCutoff::ALLOWED)),
        }
    }

    /// The cutoff in bytes on a VD of `level`; 0: never.
    pub fn bytes_for(self, level: Level) -> u64 {
        match self {
            SeqCutoff::LevelDefault => crate::vd::journal_bypass::default_cutoff_bytes(level.span_kind()),
            SeqCutoff::Never => 0,
            SeqCutoff::Mib(mib) => u64::from(mib) << 20,
        }
    }

    /// The CLI's words: `default`, `off`, `4MiB`.
    pub fn text(self) -> String {
        match self {
            SeqCutoff::LevelDefault => "default".into(),
            SeqCutoff::Never => "off".into(),
            SeqCutoff::Mib(mib) => format!("{mib}MiB"),
        }
    }
}

impl WritePolicy {
    pub const ALL: [WritePolicy; 3] = [WritePolicy::WriteThrough, WritePolicy::WriteBack, WritePolicy::AlwaysWriteBack];
    /// The CLI's word (`wt`, `wb`, `awb`).
    pub fn short_name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "wt",
            WritePolicy::WriteBack => "wb",
            WritePolicy::AlwaysWriteBack => "awb",
        }
    }
}

impl ReadPolicy {
    pub const ALL: [ReadPolicy; 3] = [ReadPolicy::NoReadAhead, ReadPolicy::ReadAhead, ReadPolicy::Adaptive];
    /// The CLI's word (`nora`, `ra`, `adra`).
    pub fn short_name(self) -> &'static str {
        match self {
            ReadPolicy::NoReadAhead => "nora",
            ReadPolicy::ReadAhead => "ra",
            ReadPolicy::Adaptive => "adra",
        }
    }
}

impl IoPolicy {
    pub const ALL: [IoPolicy; 2] = [IoPolicy::Direct, IoPolicy::Cached];
    /// The CLI's word (`direct`, `cached`).
    pub fn short_name(self) -> &'static str {
        match self {
            IoPolicy::Direct => "direct",
            IoPolicy::Cached => "cached",
        }
    }
}

/// One physical drive as the configuration knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveRecord {
    pub slot: u32,
    pub drive_id: DriveId,
    pub state: DriveState,
    pub capacity_bytes: u64,
    /// While the drive is being rebuilt (`Rbld`): every VD row below this one is rebuilt (the
    /// last checkpoint); a restart resumes here. Also the watermark of a copy (`Cpybck`). 0
    /// otherwise.
    pub rebuild_row: u64,
    /// The other end of a copy, by state:
    /// - `Cpybck`: the slot of the member this drive receives a copy of, and whose place it
    ///   takes when the copy is done (copyback to a replaced slot, or a proactive replace);
    /// - `Rbld` or `Onln`, for a hot spare serving as a member (it keeps its hot spare record:
    ///   a revertible spare): the slot whose place it took, where a copyback returns the data
    ///   once that slot holds a good drive again;
    /// - `None` otherwise.
    pub copy_slot: Option<u32>,
}

/// Settings of the whole controller (storcli's `/c0 set ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerSettings {
    /// A failed member is rebuilt onto a hot spare without asking (`autorebuild=on`).
    pub auto_rebuild: bool,
    /// Share of member bandwidth a rebuild takes while clients are busy (`rebuildrate`, 0-100).
    pub rebuild_rate_percent: u8,
    /// When a spare took a failed member's place and that slot later holds a good drive again,
    /// copy the member back to it and return the spare (`copyback=on`, MegaRAID's revertible
    /// hot spare).
    pub copyback: bool,
    /// Share of its speed alone a consistency check keeps while clients are busy (`ccrate`,
    /// 0-100).
    pub cc_rate_percent: u8,
    /// The same for background initialization (`bgirate`, 0-100).
    pub bgi_rate_percent: u8,
    pub patrol: PatrolSettings,
    pub cc_schedule: CcSchedule,
    /// The journal whose records a restart replays (0: none): set before the cache logs to a
    /// journal, cleared before writes go on without one that failed, so that a journal which
    /// comes back after missing writes is never replayed over them.
    pub journal_id: u64,
    /// Legs of the trusted journal (bit per `leg_index`) that missed acknowledged records: a
    /// leg of a mirrored pair that failed while the other went on. Never replayed.
    pub journal_stale_legs: u8,
}

/// When consistency checks start on their own (`/c0 set cc=off|seq|conc delay=HOURS
/// starttime=...`). Off by default: a check of every VD takes the members' bandwidth for hours,
/// so storc waits to be asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcSchedule {
    pub mode: CcMode,
    /// Hours from the start of one round to the start of the next (at least 1).
    pub delay_hours: u16,
    /// When the next round starts, in seconds since the Unix epoch.
    pub next_start_unix_secs: u64,
}

/// How a scheduled round checks the VDs: one after another, or all at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcMode {
    Off,
    Sequential,
    Concurrent,
}

impl CcMode {
    pub const ALL: [CcMode; 3] = [CcMode::Off, CcMode::Sequential, CcMode::Concurrent];

    /// storcli's words: off, seq, conc.
    pub fn short_name(self) -> &'static str {
        match self {
            CcMode::Off => "off",
            CcMode::Sequential => "seq",
            CcMode::Concurrent => "conc",
        }
    }
}

impl Default for CcSchedule {
    fn default() -> Self {
        CcSchedule { mode: CcMode::Off, delay_hours: 168, next_start_unix_secs: 0 }
    }
}

/// Patrol read (`/c0 set patrolread=on|off mode=auto|manual delay=HOURS prrate=N
/// includessds=on|off`): every member and hot spare read in the background, medium errors
/// rewritten from redundancy before a rebuild needs them. MegaRAID's defaults: on, automatic,
/// every 168 hours, 30%, SSDs left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatrolSettings {
    pub enabled: bool,
    /// Starts only by hand (`start patrolread`), never on the schedule.
    pub manual: bool,
    /// Reads solid-state drives too (they remap on their own, and reads wear nothing, but a
    /// patrol keeps them busy).
    pub include_ssds: bool,
    /// Share of its speed alone it keeps while clients are busy (`prrate`, 0-100).
    pub rate_percent: u8,
    /// Hours from the start of one patrol read to the start of the next (at least 1).
    pub delay_hours: u16,
    /// When the last one started, in seconds since the Unix epoch; 0 if none has.
    pub last_start_unix_secs: u64,
}

impl Default for PatrolSettings {
    fn default() -> Self {
        PatrolSettings {
            enabled: true,
            manual: false,
            include_ssds: false,
            rate_percent: crate::background::RATE_PERCENT_DEFAULT,
            delay_hours: 168,
            last_start_unix_secs: 0,
        }
    }
}

impl Default for ControllerSettings {
    fn default() -> Self {
        ControllerSettings {
            auto_rebuild: true,
            rebuild_rate_percent: crate::background::RATE_PERCENT_DEFAULT,
            copyback: true,
            cc_rate_percent: crate::background::RATE_PERCENT_DEFAULT,
            bgi_rate_percent: crate::background::RATE_PERCENT_DEFAULT,
            patrol: PatrolSettings::default(),
            cc_schedule: CcSchedule::default(),
            journal_id: 0,
            journal_stale_legs: 0,
        }
    }
}

/// A hot spare: global (no drive groups listed) or dedicated to the listed drive groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotSpareRecord {
    pub slot: u32,
    pub dedicated_drive_groups: Vec<u32>,
}

/// One virtual drive. In storc every VD has its own drive group, numbered like the VD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VdRecord {
    pub vd_id: u32,
    pub drive_group: u32,
    /// At most [`VD_NAME_BYTES_MAX`] bytes of UTF-8.
    pub name: String,
    pub level: Level,
    pub strip_size_bytes: u64,
    /// Drives per span (RAID 10/50/60); the drive count otherwise.
    pub drives_per_span: u32,
    /// Member slots in member order (span by span).
    pub member_slots: Vec<u32>,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
    /// Bytes of each member the VD is laid out on. A member found smaller is not used: reading
    /// past its end would return nothing where the VD has data.
    pub member_size_bytes: u64,
    /// VD byte ranges whose data is lost (a source that could not be read while nothing else
    /// held its data): reads of them fail until they are written whole. Sorted, not overlapping.
    pub bad_blocks: Vec<BadBlock>,
    /// Its members held data when it was created, so its parity or copies did not match: the
    /// background initialization (BGI) that makes them consistent has not completed. Cleared
    /// when it does, or by a full initialization.
    pub bgi_pending: bool,
    /// A cache VD (CacheCade): it holds hot lines of the VDs that name it, and is not exported.
    pub cache_vd: bool,
    /// A cache VD that caches write-back (`/c0 add vd cachecade ... wb`): it holds data its VDs
    /// do not have yet. Only with `cache_vd`.
    pub cache_write_back: bool,
    /// The cache VD that caches this one (`set ssdcaching=on`), if any.
    pub ssd_cache_vd_id: Option<u32>,
    /// From which length its sequential streams' large writes go around the journal.
    pub seq_cutoff: SeqCutoff,
}

/// A VD byte range whose data is lost (MegaRAID's puncture, md's bad-block log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadBlock {
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

pub const VD_NAME_BYTES_MAX: usize = 32;

/// The whole configuration of a controller: what every member drive carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    pub controller_id: ControllerId,
    /// Incremented on every change; the newest valid copy wins at assembly.
    pub generation: u64,
    pub drives: Vec<DriveRecord>,
    pub vds: Vec<VdRecord>,
    pub hot_spares: Vec<HotSpareRecord>,
    pub settings: ControllerSettings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seq_cutoff_is_default_off_or_whole_mib_and_anything_else_is_refused_by_name() {
        assert_eq!(SeqCutoff::parse("default"), Ok(SeqCutoff::LevelDefault));
        assert_eq!(SeqCutoff::parse("OFF"), Ok(SeqCutoff::Never));
        assert_eq!(SeqCutoff::parse("4MiB"), Ok(SeqCutoff::Mib(4)));
        assert_eq!(SeqCutoff::parse("1G"), Ok(SeqCutoff::Mib(1024)));
        assert_eq!(SeqCutoff::parse("65534MiB"), Ok(SeqCutoff::Mib(SeqCutoff::MIB_MAX)));
        for bad in ["0", "512KiB", "1536KiB", "65535MiB", "64GiB", "fast", ""] {
            let error = SeqCutoff::parse(bad).expect_err(bad);
            assert!(error.contains("allowed: default"), "{bad}: {error}");
        }
        for cutoff in [SeqCutoff::LevelDefault, SeqCutoff::Never, SeqCutoff::Mib(16)] {
            assert_eq!(SeqCutoff::parse(&cutoff.text()), Ok(cutoff), "the CLI's words read back");
        }
    }

    #[test]
    fn the_level_default_goes_around_the_journal_only_without_parity() {
        assert_eq!(SeqCutoff::LevelDefault.bytes_for(Level::Raid1), 4 << 20);
        assert_eq!(SeqCutoff::LevelDefault.bytes_for(Level::Raid0), 4 << 20);
        assert_eq!(SeqCutoff::LevelDefault.bytes_for(Level::Raid5), 0);
        assert_eq!(SeqCutoff::LevelDefault.bytes_for(Level::Raid60), 0);
        assert_eq!(SeqCutoff::Mib(8).bytes_for(Level::Raid6), 8 << 20);
        assert_eq!(SeqCutoff::Never.bytes_for(Level::Raid10), 0);
    }
}
