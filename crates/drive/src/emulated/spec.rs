//! `hdd:15k:600GiB,nocache`, `ssd:nvme:1TiB`: the emulated drives `storc serve --drive` and the
//! benchmark accept, parsed with errors that name the wrong part and what is allowed there.

use super::profiles::{HddProfile, SsdProfile, HDD_10K, HDD_15K, HDD_7200, SSD_NVME, SSD_SAS, SSD_SATA};
use crate::{parse_size_bytes, SECTOR_BYTES};
use std::fmt;

/// A kind of drive with the datasheet model that stands for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmulatedClass {
    Hdd7200,
    Hdd10k,
    Hdd15k,
    SsdSata,
    SsdSas,
    SsdNvme,
}

pub(crate) enum Profile {
    Hdd(&'static HddProfile),
    Ssd(&'static SsdProfile),
}

impl EmulatedClass {
    pub const ALL: [EmulatedClass; 6] = [
        EmulatedClass::Hdd7200,
        EmulatedClass::Hdd10k,
        EmulatedClass::Hdd15k,
        EmulatedClass::SsdSata,
        EmulatedClass::SsdSas,
        EmulatedClass::SsdNvme,
    ];

    pub(crate) fn profile(self) -> Profile {
        match self {
            EmulatedClass::Hdd7200 => Profile::Hdd(&HDD_7200),
            EmulatedClass::Hdd10k => Profile::Hdd(&HDD_10K),
            EmulatedClass::Hdd15k => Profile::Hdd(&HDD_15K),
            EmulatedClass::SsdSata => Profile::Ssd(&SSD_SATA),
            EmulatedClass::SsdSas => Profile::Ssd(&SSD_SAS),
            EmulatedClass::SsdNvme => Profile::Ssd(&SSD_NVME),
        }
    }

    /// The datasheet model whose figures the class uses (`Seagate Cheetah 15K.7 ST3600057SS`).
    pub fn model(self) -> &'static str {
        match self.profile() {
            Profile::Hdd(profile) => profile.model,
            Profile::Ssd(profile) => profile.model,
        }
    }

    pub fn is_hdd(self) -> bool {
        matches!(self.profile(), Profile::Hdd(_))
    }

    /// The largest queue depth the drive accepts (`qd=`).
    pub fn queue_depth_max(self) -> u32 {
        match self.profile() {
            Profile::Hdd(profile) => profile.queue_depth_max,
            Profile::Ssd(profile) => profile.queue_depth_max,
        }
    }

    /// `("hdd", "15k")`, as written in a spec.
    fn spec_words(self) -> (&'static str, &'static str) {
        match self {
            EmulatedClass::Hdd7200 => ("hdd", "7200"),
            EmulatedClass::Hdd10k => ("hdd", "10k"),
            EmulatedClass::Hdd15k => ("hdd", "15k"),
            EmulatedClass::SsdSata => ("ssd", "sata"),
            EmulatedClass::SsdSas => ("ssd", "sas"),
            EmulatedClass::SsdNvme => ("ssd", "nvme"),
        }
    }
}

/// What to emulate. The capacity may be smaller (or larger) than the real model's: the emulated
/// capacity always spans the whole stroke and both transfer-rate zones, so a small emulated hard
/// disk seeks and streams like the whole real one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmulatedDriveSpec {
    pub class: EmulatedClass,
    pub capacity_bytes: u64,
    /// Hard disks: a write completes when it reaches the drive's buffer, not the platter.
    pub write_cache: bool,
    /// Hard disks: the drive reads on after a read while it is idle.
    pub read_ahead: bool,
    /// Hard disks: commands the drive reorders among (1: arrival order). SSDs: commands it holds.
    /// `None`: the model's maximum.
    pub queue_depth: Option<u32>,
    /// SSDs: bytes written before writes slow to the steady state. `None`: the model's spare
    /// area as a share of the emulated capacity.
    pub steady_after_bytes: Option<u64>,
}

const FORMS: &str = "KIND:CLASS:CAPACITY[,OPTION...] where KIND:CLASS is hdd:7200, hdd:10k, hdd:15k, ssd:sata, ssd:sas \
                     or ssd:nvme, e.g. hdd:15k:600GiB,nocache or ssd:nvme:1TiB";

impl EmulatedDriveSpec {
    /// `class` at `capacity_bytes` with the caches on and the model's queue depth and spare area.
    pub fn new(class: EmulatedClass, capacity_bytes: u64) -> EmulatedDriveSpec {
        EmulatedDriveSpec { class, capacity_bytes, write_cache: true, read_ahead: true, queue_depth: None, steady_after_bytes: None }
    }

    /// Parses `hdd:7200:2TiB,nocache`, `ssd:sata:480GiB,qd=1`, `ssd:nvme:1TiB,spare=64GiB`.
    ///
    /// # Errors
    /// A message that quotes `text`, names the part that is wrong and lists what is allowed there.
    pub fn parse(text: &str) -> Result<EmulatedDriveSpec, String> {
        let text = text.trim();
        let fail = |problem: String| format!("emulated drive {text:?}: {problem}");
        let mut options = text.split(',');
        let words: Vec<&str> = options.next().unwrap_or_default().split(':').collect();
        let [kind, class, capacity] = words[..] else {
            return Err(fail(format!("expected {FORMS}")));
        };
        let class = parse_class(kind, class).map_err(fail)?;
        let mut spec = EmulatedDriveSpec::new(class, parse_capacity(capacity).map_err(fail)?);
        for option in options {
            spec.apply_option(option.trim()).map_err(fail)?;
        }
        Ok(spec)
    }

    fn apply_option(&mut self, option: &str) -> Result<(), String> {
        let lower = option.to_ascii_lowercase();
        let hdd = self.class.is_hdd();
        match lower.split_once('=') {
            None if hdd && lower == "nocache" => (self.write_cache, self.read_ahead) = (false, false),
            None if hdd && lower == "nowritecache" => self.write_cache = false,
            None if hdd && lower == "noreadahead" => self.read_ahead = false,
            Some(("qd", value)) => self.queue_depth = Some(parse_queue_depth(value, self.class)?),
            Some(("spare", value)) if !hdd => {
                let bytes = parse_size_bytes(value).map_err(|e| format!("option spare: {e}"))?;
                self.steady_after_bytes = Some(bytes);
            }
            _ => return Err(format!("unknown option {option:?}; {}", allowed_options(self.class))),
        }
        Ok(())
    }

    /// The queue depth in force: the one asked for, or the model's maximum.
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth.unwrap_or_else(|| self.class.queue_depth_max())
    }
}

fn parse_class(kind: &str, class: &str) -> Result<EmulatedClass, String> {
    match (kind.to_ascii_lowercase().as_str(), class.to_ascii_lowercase().as_str()) {
        ("hdd", "7200" | "7.2k" | "7k2") => Ok(EmulatedClass::Hdd7200),
        ("hdd", "10k" | "10000") => Ok(EmulatedClass::Hdd10k),
        ("hdd", "15k" | "15000") => Ok(EmulatedClass::Hdd15k),
        ("hdd", _) => Err(format!("unknown hdd speed {class:?}; allowed: 7200 (or 7.2k), 10k (or 10000), 15k (or 15000)")),
        ("ssd", "sata") => Ok(EmulatedClass::SsdSata),
        ("ssd", "sas") => Ok(EmulatedClass::SsdSas),
        ("ssd", "nvme") => Ok(EmulatedClass::SsdNvme),
        ("ssd", _) => Err(format!("unknown ssd interface {class:?}; allowed: sata, sas, nvme")),
        _ => Err(format!("unknown drive kind {kind:?}; allowed: hdd, ssd")),
    }
}

fn parse_capacity(text: &str) -> Result<u64, String> {
    let capacity_bytes = parse_size_bytes(text).map_err(|e| format!("capacity: {e}"))?;
    if capacity_bytes == 0 {
        return Err(format!("capacity {text:?} is zero; it must be at least {SECTOR_BYTES} bytes"));
    }
    if capacity_bytes % SECTOR_BYTES != 0 {
        return Err(format!("capacity {text:?} is not a multiple of {SECTOR_BYTES} bytes"));
    }
    Ok(capacity_bytes)
}

fn parse_queue_depth(value: &str, class: EmulatedClass) -> Result<u32, String> {
    let max = class.queue_depth_max();
    let depth: u32 = value.parse().map_err(|_| format!("option qd={value:?} is not a number; allowed: 1 to {max}"))?;
    if !(1..=max).contains(&depth) {
        return Err(format!("option qd={depth} is out of range; allowed for {}: 1 to {max}", class.model()));
    }
    Ok(depth)
}

fn allowed_options(class: EmulatedClass) -> String {
    let max = class.queue_depth_max();
    match class.is_hdd() {
        true => format!("allowed for hdd: nocache, nowritecache, noreadahead, qd=N (1 to {max})"),
        false => format!("allowed for ssd: qd=N (1 to {max}), spare=SIZE (bytes written before the steady state)"),
    }
}

/// `4GiB` when the size is a whole number of some binary unit, else bytes.
fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(unit, _)| bytes.is_multiple_of(*unit)) {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => bytes.to_string(),
    }
}

/// The canonical spec: `EmulatedDriveSpec::parse` reads it back to an equal value.
impl fmt::Display for EmulatedDriveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, class) = self.class.spec_words();
        write!(f, "{kind}:{class}:{}", format_size(self.capacity_bytes))?;
        match (self.write_cache, self.read_ahead) {
            (false, false) => write!(f, ",nocache")?,
            (false, true) => write!(f, ",nowritecache")?,
            (true, false) => write!(f, ",noreadahead")?,
            (true, true) => {}
        }
        if let Some(depth) = self.queue_depth {
            write!(f, ",qd={depth}")?;
        }
        if let Some(bytes) = self.steady_after_bytes {
            write!(f, ",spare={}", format_size(bytes))?;
        }
        Ok(())
    }
}
