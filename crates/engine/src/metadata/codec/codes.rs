//! The one-byte enum codes of the format: the code tables in docs/on-disk-format.md. Never
//! renumber; only add (with a new format version).

use super::{drive_record, get, Field, MetadataError};
use crate::config::{CcMode, DriveState, IoPolicy, ReadPolicy, WritePolicy};
use layout::Level;

/// An enum stored as a one-byte code. The tables are explicit `match`es both ways, so that
/// reordering the Rust enum cannot change what is on disk.
pub(crate) trait Code: Copy + PartialEq + std::fmt::Debug + 'static {
    const ALL: &'static [Self];
    fn code(self) -> u8;
    fn from_code(code: u8) -> Option<Self>;
    /// The CLI's word for the value, used in error messages and the doc tables.
    fn short_name(self) -> &'static str;
}

/// Decodes the one-byte code in `field`, naming the record, the field and the known codes
/// when it is unknown.
pub(super) fn decode_code<T: Code>(fixed: &[u8], field: Field, record: impl Fn() -> String) -> Result<T, MetadataError> {
    let code = get::<1>(fixed, field)[0];
    T::from_code(code).ok_or_else(|| {
        let known = T::ALL.iter().map(|v| format!("{} ({})", v.code(), v.short_name())).collect::<Vec<_>>().join(", ");
        MetadataError::UnknownCode { record: record(), field: field.name, code, known }
    })
}

impl Code for DriveState {
    const ALL: &'static [Self] = &DriveState::ALL;
    fn code(self) -> u8 {
        match self {
            DriveState::UnconfiguredGood => 1,
            DriveState::Online => 2,
            DriveState::Offline => 3,
            DriveState::Failed => 4,
            DriveState::Missing => 5,
            DriveState::HotSpare => 6,
            DriveState::Rebuild => 7,
            DriveState::Copyback => 8,
            DriveState::UnconfiguredBad => 9,
            DriveState::Journal => 10,
            DriveState::Migrate => 11,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => DriveState::UnconfiguredGood,
            2 => DriveState::Online,
            3 => DriveState::Offline,
            4 => DriveState::Failed,
            5 => DriveState::Missing,
            6 => DriveState::HotSpare,
            7 => DriveState::Rebuild,
            8 => DriveState::Copyback,
            9 => DriveState::UnconfiguredBad,
            10 => DriveState::Journal,
            11 => DriveState::Migrate,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        DriveState::short_name(self)
    }
}

impl Code for Level {
    const ALL: &'static [Self] = &Level::ALL;
    fn code(self) -> u8 {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 => 2,
            Level::Raid1E => 3,
            Level::Raid5 => 4,
            Level::Raid6 => 5,
            Level::Raid10 => 6,
            Level::Raid50 => 7,
            Level::Raid60 => 8,
            Level::Jbod => 9,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Level::Raid0,
            2 => Level::Raid1,
            3 => Level::Raid1E,
            4 => Level::Raid5,
            5 => Level::Raid6,
            6 => Level::Raid10,
            7 => Level::Raid50,
            8 => Level::Raid60,
            9 => Level::Jbod,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        Level::short_name(self)
    }
}

impl Code for CcMode {
    const ALL: &'static [Self] = &CcMode::ALL;
    fn code(self) -> u8 {
        match self {
            CcMode::Off => 1,
            CcMode::Sequential => 2,
            CcMode::Concurrent => 3,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => CcMode::Off,
            2 => CcMode::Sequential,
            3 => CcMode::Concurrent,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        CcMode::short_name(self)
    }
}

impl Code for WritePolicy {
    const ALL: &'static [Self] = &WritePolicy::ALL;
    fn code(self) -> u8 {
        match self {
            WritePolicy::WriteThrough => 1,
            WritePolicy::WriteBack => 2,
            WritePolicy::AlwaysWriteBack => 3,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => WritePolicy::WriteThrough,
            2 => WritePolicy::WriteBack,
            3 => WritePolicy::AlwaysWriteBack,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        WritePolicy::short_name(self)
    }
}

impl Code for ReadPolicy {
    const ALL: &'static [Self] = &ReadPolicy::ALL;
    fn code(self) -> u8 {
        match self {
            ReadPolicy::NoReadAhead => 1,
            ReadPolicy::ReadAhead => 2,
            ReadPolicy::Adaptive => 3,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => ReadPolicy::NoReadAhead,
            2 => ReadPolicy::ReadAhead,
            3 => ReadPolicy::Adaptive,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        ReadPolicy::short_name(self)
    }
}

impl Code for IoPolicy {
    const ALL: &'static [Self] = &IoPolicy::ALL;
    fn code(self) -> u8 {
        match self {
            IoPolicy::Direct => 1,
            IoPolicy::Cached => 2,
        }
    }
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => IoPolicy::Direct,
            2 => IoPolicy::Cached,
            _ => return None,
        })
    }
    fn short_name(self) -> &'static str {
        IoPolicy::short_name(self)
    }
}

/// The first format version with the drive state `state`.
fn first_version_of(state: DriveState) -> u32 {
    match state {
        DriveState::Copyback | DriveState::UnconfiguredBad => super::FORMAT_VERSION_COPYBACK_UBAD,
        DriveState::Journal => super::FORMAT_VERSION_JOURNAL_DRIVE,
        DriveState::Migrate => super::FORMAT_VERSION_MIGRATION,
        _ => super::FORMAT_VERSION_OLDEST,
    }
}

/// A drive state code that the record's format version did not have is as unknown as any other:
/// no storc ever wrote it there.
pub(super) fn check_state_in_version(state: DriveState, version: u32, record: impl Fn() -> String) -> Result<(), MetadataError> {
    if version >= first_version_of(state) {
        return Ok(());
    }
    let known_in_version = DriveState::ALL.iter().filter(|s| version >= first_version_of(**s));
    let known = known_in_version.map(|s| format!("{} ({})", s.code(), s.short_name())).collect::<Vec<_>>().join(", ");
    Err(MetadataError::UnknownCode { record: record(), field: drive_record::STATE.name, code: state.code(), known })
}
