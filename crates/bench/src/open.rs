//! `--target`: what a benchmark measures, parsed from one string and opened in this process.
//!
//! Every target needs no daemon: a VD is built here over memory, emulated or file drives and
//! served by an engine of this process; a file or block device is driven through an engine
//! shard's io_uring with O_DIRECT; an NBD export is reached with `nbd::Client`.

use crate::nbd_target::{connections_for, NbdTarget};
use crate::results::{DriveDescription, Policies, TargetInfo};
use crate::spec::AccessSpec;
use crate::target::{RawDriveTarget, Target, VdTarget};
use drive::{Drive, DriveKind, EmulatedDrive, EmulatedDriveSpec, FileDrive, FileDriveConfig, MemDrive, RealClock};
use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive};
use layout::Level;
use nbd::NbdUri;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The forms `--target` accepts, for help texts and error messages.
pub const TARGET_FORMS: &str = "\
TARGET is one of:
  nbd://HOST[:PORT]/EXPORT          an NBD export over TCP (one connection per worker)
  nbd+unix:///EXPORT?socket=PATH    an NBD export over a Unix socket
  PATH                              an existing file or block device (O_DIRECT through io_uring)
  vd:LEVEL:COUNTxDRIVE[:strip=KIB][:span=N][:POLICY...][:journal=DRIVE]
                                    a virtual drive built in this process, no daemon:
    LEVEL   r0 r1 r1e r5 r6 r10 r50 r60 jbod
    COUNT   member drives
    DRIVE   mem:SIZE                            RAM, allocated on first write
            hdd:7200|10k|15k:SIZE[,OPTION...]   emulated hard disk, real clock
            ssd:sata|sas|nvme:SIZE[,OPTION...]  emulated SSD, real clock
            file:DIR:SIZE                       sparse files made in DIR, removed at exit
    strip   strip size in KiB (default 64); span: drives per span for r10/r50/r60
    POLICY  wt|wb|awb (write, default wt), nora|ra|adra (read-ahead), direct|cached (IO)
    journal the cache's journal (WB needs one; last, as it may hold colons): a DRIVE as above
  e.g. vd:r5:8xhdd:15k:600GiB:strip=64   vd:r10:4xmem:1GiB   vd:r6:6xfile:/var/tmp:2GiB
       vd:r5:8xhdd:15k:600GiB:wb:journal=ssd:sata:8GiB";

/// A parsed `--target`.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetSpec {
    Nbd { uri: NbdUri, text: String },
    Path(PathBuf),
    Vd(VdSpec),
}

/// `vd:LEVEL:COUNTxDRIVE[:strip=KIB][:span=N]`.
#[derive(Clone, Debug, PartialEq)]
pub struct VdSpec {
    pub level: Level,
    pub drive_count: usize,
    pub drive: MemberSpec,
    pub strip_size_bytes: u64,
    pub drives_per_span: Option<usize>,
    pub write_policy: WritePolicy,
    pub read_policy: ReadPolicy,
    pub io_policy: IoPolicy,
    /// The cache's journal drive.
    pub journal: Option<MemberSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MemberSpec {
    Mem { capacity_bytes: u64 },
    Emulated(EmulatedDriveSpec),
    Files { dir: PathBuf, capacity_bytes: u64 },
}

const STRIP_KIB_DEFAULT: u64 = 64;
const MEMBERS_MAX: usize = 32;

impl TargetSpec {
    /// # Errors
    /// A message that quotes the target, names the wrong part and lists the allowed forms.
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        let text = text.trim();
        if text.starts_with("nbd") && text.contains("://") {
            let uri: NbdUri = text.parse().map_err(|e| format!("--target {text}: {e}"))?;
            return Ok(TargetSpec::Nbd { uri, text: text.to_string() });
        }
        if let Some(rest) = text.strip_prefix("vd:") {
            return parse_vd(rest).map(TargetSpec::Vd).map_err(|problem| format!("--target {text}: {problem}\n{TARGET_FORMS}"));
        }
        if text.is_empty() {
            return Err(format!("--target is empty\n{TARGET_FORMS}"));
        }
        let path = PathBuf::from(text);
        if !path.exists() {
            return Err(format!(
                "--target {text}: no such file or device (create a file with: truncate -s 8G {text}); \
                 for a VD in this process write vd:..., for NBD nbd://...\n{TARGET_FORMS}"
            ));
        }
        Ok(TargetSpec::Path(path))
    }
}

fn parse_vd(rest: &str) -> Result<VdSpec, String> {
    // `journal=` comes last: its drive may hold colons.
    let (rest, journal) = match rest.split_once(":journal=") {
        Some((before, journal)) => {
            (before, Some(parse_member(&journal.split(':').collect::<Vec<_>>()).map_err(|e| format!("journal: {e}"))?))
        }
        None => (rest, None),
    };
    let (level_text, rest) = rest.split_once(':').ok_or("expected vd:LEVEL:COUNTxDRIVE")?;
    let level = Level::parse(level_text).map_err(|_| format!("unknown level {level_text:?}; allowed: r0 r1 r1e r5 r6 r10 r50 r60 jbod"))?;
    let (count_text, rest) = rest.split_once('x').ok_or_else(|| format!("expected COUNTxDRIVE after the level, found {rest:?}"))?;
    let drive_count: usize = count_text.parse().map_err(|_| format!("drive count {count_text:?} is not a number"))?;
    if !(1..=MEMBERS_MAX).contains(&drive_count) {
        return Err(format!("drive count {drive_count} is not allowed; allowed: 1 to {MEMBERS_MAX}"));
    }
    let mut segments: Vec<&str> = rest.split(':').collect();
    let mut strip_kib = STRIP_KIB_DEFAULT;
    let mut drives_per_span = None;
    let (mut write_policy, mut read_policy, mut io_policy) = (WritePolicy::WriteThrough, ReadPolicy::NoReadAhead, IoPolicy::Direct);
    // Options come after the drive, in any order.
    while let Some(&last) = segments.last() {
        if let Some(policy) = WritePolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            write_policy = policy;
        } else if let Some(policy) = ReadPolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            read_policy = policy;
        } else if let Some(policy) = IoPolicy::ALL.into_iter().find(|p| p.short_name() == last) {
            io_policy = policy;
        } else if let Some((key @ ("strip" | "span"), value)) = last.split_once('=') {
            let number: u64 = value.parse().map_err(|_| format!("{key}={value:?} is not a number"))?;
            match key {
                "strip" => strip_kib = number,
                _ => drives_per_span = Some(number as usize),
            }
        } else {
            break;
        }
        segments.pop();
    }
    let drive = parse_member(&segments)?;
    Ok(VdSpec {
        level,
        drive_count,
        drive,
        strip_size_bytes: strip_kib * 1024,
        drives_per_span,
        write_policy,
        read_policy,
        io_policy,
        journal,
    })
}

fn parse_member(segments: &[&str]) -> Result<MemberSpec, String> {
    let size = |text: &str| drive::parse_size_bytes(text).map_err(|e| format!("drive size: {e}"));
    match segments {
        ["mem", capacity] => Ok(MemberSpec::Mem { capacity_bytes: size(capacity)? }),
        ["hdd" | "ssd", ..] => EmulatedDriveSpec::parse(&segments.join(":")).map(MemberSpec::Emulated),
        ["file", dir @ .., capacity] if !dir.is_empty() => {
            let dir = PathBuf::from(dir.join(":"));
            if !dir.is_dir() {
                return Err(format!("file drives: {} is not a directory", dir.display()));
            }
            Ok(MemberSpec::Files { dir, capacity_bytes: size(capacity)? })
        }
        _ => Err(format!("unknown drive {:?}; allowed: mem:SIZE, hdd:CLASS:SIZE, ssd:CLASS:SIZE, file:DIR:SIZE", segments.join(":"))),
    }
}

/// How to open a target.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Engine shards for VD and file targets (default: one per core).
    pub shards: Option<usize>,
}

/// An opened target: hands each worker its own [`Target`] (its own NBD connections, its own
/// engine shard for a raw file) and describes itself for the report.
pub struct OpenTarget {
    info: TargetInfo,
    backend: Backend,
    /// Member files this process made, removed on drop.
    created_files: Vec<PathBuf>,
}

enum Backend {
    /// One target shared by every worker (a VD, or a test's own target).
    Shared(Arc<dyn Target>),
    /// A file or block device; each worker submits through its own shard.
    Raw { engine: Arc<Engine>, drive: Arc<dyn Drive> },
    /// Connections per worker, kept across points.
    Nbd { uri: NbdUri, text: String, by_worker: Mutex<HashMap<usize, Arc<NbdTarget>>> },
}

impl OpenTarget {
    /// # Errors
    /// What could not be opened or built, naming the target.
    pub fn open(spec: &TargetSpec, options: OpenOptions) -> Result<OpenTarget, String> {
        match spec {
            TargetSpec::Nbd { uri, text } => open_nbd(uri, text),
            TargetSpec::Path(path) => open_path(path, options),
            TargetSpec::Vd(vd) => open_vd(vd, options),
        }
    }

    /// Any target, shared by all workers: for tests and for embedding the runner.
    pub fn shared(target: Arc<dyn Target>, info: TargetInfo) -> OpenTarget {
        OpenTarget { info, backend: Backend::Shared(target), created_files: Vec::new() }
    }

    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.info.capacity_bytes
    }

    /// Flushes the target between points (see [`Target::settle`]): a VD, or the raw drive
    /// through every shard that submitted to it.
    ///
    /// # Errors
    /// The flush failed.
    pub fn settle(&self) -> Result<(), String> {
        match &self.backend {
            Backend::Shared(target) => target.settle(),
            Backend::Raw { engine, drive } => {
                let target = RawDriveTarget { engine: Arc::clone(engine), drive: Arc::clone(drive), shard: 0, data_offset_bytes: 0 };
                target.settle()
            }
            Backend::Nbd { .. } => Ok(()),
        }
    }

    /// The target worker `worker_index` submits to, ready for `queue_depth` requests of `spec`.
    /// `reads_checked`: whether the worker looks at what its reads return (`--verify`); an NBD
    /// target skips copying it otherwise.
    ///
    /// # Errors
    /// NBD: a connection that could not be made.
    pub fn worker_target(
        &self,
        worker_index: usize,
        queue_depth: usize,
        spec: &AccessSpec,
        reads_checked: bool,
    ) -> Result<Arc<dyn Target>, String> {
        match &self.backend {
            Backend::Shared(target) => Ok(Arc::clone(target)),
            Backend::Raw { engine, drive } => Ok(Arc::new(RawDriveTarget {
                engine: Arc::clone(engine),
                drive: Arc::clone(drive),
                shard: worker_index,
                data_offset_bytes: 0,
            })),
            Backend::Nbd { uri, text, by_worker } => {
                let needed = connections_for(queue_depth, spec);
                let mut by_worker = by_worker.lock().expect("NBD connections lock");
                let target = match by_worker.get(&worker_index).filter(|t| t.connection_count() >= needed) {
                    Some(target) => Arc::clone(target),
                    None => {
                        let target = Arc::new(NbdTarget::connect(uri, text, needed)?);
                        by_worker.insert(worker_index, Arc::clone(&target));
                        target
                    }
                };
                target.set_deliver_reads(reads_checked);
                Ok(target)
            }
        }
    }
}

impl Drop for OpenTarget {
    fn drop(&mut self) {
        // Connections and engines first, so that no thread still has the files open.
        self.backend = Backend::Shared(Arc::new(Nothing));
        for file in &self.created_files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Stands in for a dropped backend.
struct Nothing;

impl Target for Nothing {
    fn describe(&self) -> String {
        "nothing".into()
    }
    fn capacity_bytes(&self) -> u64 {
        0
    }
    fn submit(&self, _: bool, _: u64, buf: drive::IoBuf, done: crate::target::IoDone) {
        done(Err("the target was closed".into()), buf);
    }
}

fn open_nbd(uri: &NbdUri, text: &str) -> Result<OpenTarget, String> {
    let first = Arc::new(NbdTarget::connect(uri, text, 1)?);
    let info = TargetInfo {
        spec: text.to_string(),
        kind: "nbd".into(),
        description: first.describe(),
        capacity_bytes: first.capacity_bytes(),
        ..TargetInfo::default()
    };
    let by_worker = Mutex::new(HashMap::from([(0, first)]));
    Ok(OpenTarget { info, backend: Backend::Nbd { uri: uri.clone(), text: text.to_string(), by_worker }, created_files: Vec::new() })
}

fn start_engine(options: OpenOptions) -> Result<Arc<Engine>, String> {
    let shard_count = options.shards.unwrap_or_else(|| EngineConfig::default().shard_count);
    let engine =
        Engine::start(EngineConfig { shard_count, ..EngineConfig::default() }).map_err(|e| format!("cannot start the engine: {e}"))?;
    Ok(Arc::new(engine))
}

fn open_path(path: &Path, options: OpenOptions) -> Result<OpenTarget, String> {
    let file = FileDrive::open(path, &FileDriveConfig::default()).map_err(|e| format!("--target {}: {e}", path.display()))?;
    let drive: Arc<dyn Drive> = Arc::new(file);
    let engine = start_engine(options)?;
    let drive_info = drive.info();
    let kind = if drive_info.kind == DriveKind::BlockDevice { "block-device" } else { "file" };
    let info = TargetInfo {
        spec: path.display().to_string(),
        kind: kind.into(),
        description: format!("{} {} ({} bytes, {})", kind, path.display(), drive_info.capacity_bytes, io_mode(drive_info.direct_io)),
        capacity_bytes: drive_info.capacity_bytes,
        drives: vec![describe_drive(drive.as_ref(), None)],
        direct_io: Some(drive_info.direct_io),
        engine_shards: Some(engine.shard_count()),
        ..TargetInfo::default()
    };
    Ok(OpenTarget { info, backend: Backend::Raw { engine, drive }, created_files: Vec::new() })
}

fn io_mode(direct_io: bool) -> &'static str {
    if direct_io {
        "O_DIRECT"
    } else {
        "buffered: O_DIRECT refused"
    }
}

fn open_vd(spec: &VdSpec, options: OpenOptions) -> Result<OpenTarget, String> {
    let mut created_files = Vec::new();
    let drives = make_members(spec, &mut created_files);
    let cleanup = |files: &[PathBuf]| files.iter().for_each(|f| drop(std::fs::remove_file(f)));
    let drives = drives.inspect_err(|_| cleanup(&created_files))?;
    let layout = VdLayout {
        level: spec.level,
        strip_size_bytes: spec.strip_size_bytes,
        drives_per_span: spec.drives_per_span,
        member_size_bytes: None,
    };
    let vd = VirtualDrive::new(0, "bench", layout, drives.clone()).map_err(|e| {
        cleanup(&created_files);
        format!("--target vd:{}: {e}", spec.level)
    })?;
    let engine = start_engine(options).inspect_err(|_| cleanup(&created_files))?;
    let journal = attach_journal(spec, &engine, &mut created_files).inspect_err(|_| cleanup(&created_files))?;
    vd.set_write_policy(spec.write_policy);
    vd.set_read_policies(spec.read_policy, spec.io_policy);
    let target = Arc::new(VdTarget { engine: Arc::clone(&engine), vd: Arc::new(vd) });
    let model = match &spec.drive {
        MemberSpec::Emulated(emulated) => Some(emulated.class.model().to_string()),
        _ => None,
    };
    let geometry = target.vd.geometry();
    let info = TargetInfo {
        spec: format!("vd:{}", vd_spec_text(spec)),
        kind: "vd".into(),
        description: format!(
            "{} over {} x {}, strip {} KiB, {} bytes, in-process engine ({} shards)",
            geometry.level(),
            geometry.drive_count(),
            member_text(&spec.drive),
            spec.strip_size_bytes / 1024,
            target.capacity_bytes(),
            engine.shard_count()
        ),
        capacity_bytes: target.capacity_bytes(),
        level: Some(geometry.level().to_string()),
        drive_count: Some(geometry.drive_count()),
        strip_size_bytes: Some(spec.strip_size_bytes),
        drives: drives.iter().map(|d| describe_drive(d.as_ref(), model.clone())).collect(),
        policies: Some(policies_in_effect(spec, journal.as_ref())),
        direct_io: Some(drives.iter().all(|d| d.info().direct_io)),
        engine_shards: Some(engine.shard_count()),
    };
    Ok(OpenTarget { info, backend: Backend::Shared(target), created_files })
}

fn make_members(spec: &VdSpec, created_files: &mut Vec<PathBuf>) -> Result<Vec<Arc<dyn Drive>>, String> {
    let clock = Arc::new(RealClock::new());
    (0..spec.drive_count).map(|index| make_drive(&spec.drive, &index.to_string(), &clock, created_files)).collect()
}

fn make_drive(spec: &MemberSpec, name: &str, clock: &Arc<RealClock>, created_files: &mut Vec<PathBuf>) -> Result<Arc<dyn Drive>, String> {
    // A journal file is allocated up front, as `storc serve --journal` makes one.
    let preallocate = name == "journal";
    Ok(match spec {
        MemberSpec::Mem { capacity_bytes } => Arc::new(MemDrive::named(format!("mem:{capacity_bytes}#{name}"), *capacity_bytes)),
        MemberSpec::Emulated(emulated) => Arc::new(EmulatedDrive::new(emulated, clock.clone())),
        MemberSpec::Files { dir, capacity_bytes } => {
            let path = dir.join(format!("storc-bench-{}-{name}.img", std::process::id()));
            let config = FileDriveConfig { create_size_bytes: Some(*capacity_bytes), preallocate, ..FileDriveConfig::default() };
            created_files.push(path.clone());
            Arc::new(FileDrive::open(&path, &config).map_err(|e| e.to_string())?)
        }
    })
}

/// Formats the `journal=` drive and hands it to the engine's shards, as a controller does.
fn attach_journal(spec: &VdSpec, engine: &Engine, created_files: &mut Vec<PathBuf>) -> Result<Option<Arc<dyn Drive>>, String> {
    let Some(journal_spec) = &spec.journal else { return Ok(None) };
    let drive = make_drive(journal_spec, "journal", &Arc::new(RealClock::new()), created_files)?;
    let journal = engine::journal::Journal::open(vec![Arc::clone(&drive)], 1, engine.shard_count() as u32, 0, &mut |_| Ok(()))
        .and_then(|journal| journal.finish_replay().map(|()| journal))
        .map_err(|e| format!("journal={}: {e}", member_spec_text(journal_spec)))?;
    engine.set_journal(Some(&journal));
    Ok(Some(drive))
}

/// What the report says of the policies: the ones asked for, and what runs where that differs.
fn policies_in_effect(spec: &VdSpec, journal: Option<&Arc<dyn Drive>>) -> Policies {
    let mut notes = Vec::new();
    let write = match (spec.write_policy, journal) {
        (WritePolicy::WriteBack, None) => {
            notes.push("wb asked without a journal runs as wt (a bad battery)".to_string());
            "wt".to_string()
        }
        (policy, _) => policy.short_name().to_string(),
    };
    if let Some(journal) = journal {
        notes.push(format!("journal on {}", journal.info().name));
    }
    Policies { write, read: spec.read_policy.short_name().into(), io: spec.io_policy.short_name().into(), note: notes.join("; ") }
}

fn member_text(member: &MemberSpec) -> String {
    match member {
        MemberSpec::Emulated(spec) => format!("{spec} ({})", spec.class.model()),
        other => member_spec_text(other),
    }
}

/// The member as `--target` writes it, sizes in their largest whole binary unit.
fn member_spec_text(member: &MemberSpec) -> String {
    match member {
        MemberSpec::Mem { capacity_bytes } => format!("mem:{}", size_text(*capacity_bytes)),
        MemberSpec::Emulated(emulated) => emulated.to_string(),
        MemberSpec::Files { dir, capacity_bytes } => format!("file:{}:{}", dir.display(), size_text(*capacity_bytes)),
    }
}

fn size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(unit, _)| bytes > 0 && bytes.is_multiple_of(*unit)) {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => bytes.to_string(),
    }
}

fn vd_spec_text(spec: &VdSpec) -> String {
    let member = member_spec_text(&spec.drive);
    let span = spec.drives_per_span.map(|n| format!(":span={n}")).unwrap_or_default();
    let policies = format!(":{}:{}:{}", spec.write_policy.short_name(), spec.read_policy.short_name(), spec.io_policy.short_name());
    let journal = spec.journal.as_ref().map(|j| format!(":journal={}", member_spec_text(j))).unwrap_or_default();
    format!("{}:{}x{member}:strip={}{span}{policies}{journal}", spec.level.short_name(), spec.drive_count, spec.strip_size_bytes / 1024)
}

fn describe_drive(drive: &dyn Drive, model: Option<String>) -> DriveDescription {
    let info = drive.info();
    let kind = match info.kind {
        DriveKind::Memory => "memory",
        DriveKind::File => "file",
        DriveKind::BlockDevice => "block-device",
        DriveKind::Emulated => "emulated",
    };
    DriveDescription { name: info.name.clone(), kind: kind.into(), model, capacity_bytes: info.capacity_bytes, direct_io: info.direct_io }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drive::EmulatedClass;

    fn vd(text: &str) -> VdSpec {
        match TargetSpec::parse(text) {
            Ok(TargetSpec::Vd(spec)) => spec,
            other => panic!("{text}: {other:?}"),
        }
    }

    fn error(text: &str) -> String {
        TargetSpec::parse(text).expect_err(text)
    }

    #[test]
    fn vd_targets_parse() {
        let spec = vd("vd:r5:8xhdd:15k:600GiB:strip=64");
        assert_eq!((spec.level, spec.drive_count, spec.strip_size_bytes), (Level::Raid5, 8, 64 * 1024));
        assert_eq!(spec.drive, MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::Hdd15k, 600 << 30)));
        let spec = vd("vd:r5:8xhdd:15k:600GiB:wb:adra:strip=32:journal=ssd:sata:8GiB");
        assert_eq!((spec.write_policy, spec.read_policy, spec.io_policy), (WritePolicy::WriteBack, ReadPolicy::Adaptive, IoPolicy::Direct));
        assert_eq!(spec.journal, Some(MemberSpec::Emulated(EmulatedDriveSpec::new(EmulatedClass::SsdSata, 8 << 30))));
        assert_eq!(spec.strip_size_bytes, 32 * 1024);
        assert_eq!(vd("vd:r0:2xmem:1GiB:awb:cached").io_policy, IoPolicy::Cached);
        let spec = vd("vd:r50:8xmem:1GiB:strip=128:span=4");
        assert_eq!(spec.drive, MemberSpec::Mem { capacity_bytes: 1 << 30 });
        assert_eq!((spec.strip_size_bytes, spec.drives_per_span), (128 * 1024, Some(4)));
        let spec = vd("vd:r1:2xssd:nvme:1TiB,qd=4");
        assert!(matches!(spec.drive, MemberSpec::Emulated(EmulatedDriveSpec { queue_depth: Some(4), .. })));
        assert_eq!(vd("vd:r6:6xfile:/tmp:2GiB").drive, MemberSpec::Files { dir: "/tmp".into(), capacity_bytes: 2 << 30 });
    }

    #[test]
    fn wrong_targets_name_the_wrong_part() {
        let check = |text: &str, expected: &str| {
            let message = error(text);
            assert!(message.contains(expected), "{text}: {message:?} should contain {expected:?}");
            assert!(message.contains(text), "{message:?} should quote {text}");
        };
        check("vd:r7:8xmem:1GiB", "unknown level \"r7\"");
        check("vd:r5:eightxmem:1GiB", "drive count \"eight\"");
        check("vd:r5:99xmem:1GiB", "allowed: 1 to 32");
        check("vd:r5:8xtape:1GiB", "unknown drive \"tape:1GiB\"");
        check("vd:r5:8xhdd:12k:1GiB", "unknown hdd speed");
        check("vd:r5:8xmem:1GiB:strip=big", "strip=\"big\"");
        check("vd:r5:8xfile:/no/such/dir:1GiB", "is not a directory");
        check("/no/such/device", "no such file or device");
        check("nbd://host:99999/x", "port");
        assert!(error("vd:r5").contains("vd:LEVEL:COUNTxDRIVE"));
    }

    #[test]
    fn an_impossible_vd_reports_the_layout_rule() {
        let spec = TargetSpec::parse("vd:r6:2xmem:64MiB").unwrap();
        let message = OpenTarget::open(&spec, OpenOptions::default()).err().expect("RAID6 needs more drives");
        assert!(message.contains("RAID6"), "{message}");
    }
}
