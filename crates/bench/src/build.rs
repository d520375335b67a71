//! Targets built in this process: a VD over drives made here (`vd:`), one such drive driven
//! raw (`raw:`), and sets of either (`set:`). A set runs on one engine, as the disks behind one
//! controller do, so that a set of JBOD VDs and a set of the same drives driven raw differ only
//! in the RAID layer between the workers and the drives.

use crate::open::{Backend, OpenOptions};
use crate::results::{DriveDescription, Policies, TargetInfo};
use crate::target::{RawDriveTarget, Target, VdTarget};
use crate::target_spec::{member_spec_text, member_text, MemberSpec, TargetSpec, VdSpec};
use drive::{Backing, Drive, DriveKind, EmulatedDrive, FileDrive, FileDriveConfig, MemDrive, RbdDrive, RbdSpec, RealClock};
use engine::config::WritePolicy;
use engine::ssd_cache::{MapOwner, SsdCacheOptions};
use engine::{Engine, EngineConfig, VdLayout, VirtualDrive};
use std::path::PathBuf;
use std::sync::Arc;

/// Files this process made for its drives, removed when dropped: after the engine and the
/// drives that had them open, as the owner drops its backend first. Also the drives that hold
/// something outside this process (RBD images: their locks and watches), closed then.
#[derive(Default)]
pub(crate) struct CreatedFiles {
    paths: Vec<PathBuf>,
    to_close: Vec<Arc<dyn Drive>>,
    /// Locks on the kept files of `file:...,filled` drives, released when dropped.
    locks: Vec<std::fs::File>,
}

impl CreatedFiles {
    /// Keeps `lock` (a file whose `flock` this run holds) until the target is dropped.
    pub(crate) fn hold(&mut self, lock: std::fs::File) {
        self.locks.push(lock);
    }
}

impl Drop for CreatedFiles {
    fn drop(&mut self) {
        for drive in &self.to_close {
            drive.close();
        }
        for file in &self.paths {
            let _ = std::fs::remove_file(file);
        }
    }
}

pub(crate) fn start_engine(options: OpenOptions) -> Result<Arc<Engine>, String> {
    let shard_count = options.shards.unwrap_or_else(|| EngineConfig::default().shard_count);
    let engine =
        Engine::start(EngineConfig { shard_count, ..EngineConfig::default() }).map_err(|e| format!("cannot start the engine: {e}"))?;
    Ok(Arc::new(engine))
}

/// Builds a `vd:`, `raw:` or `set:` target on an engine of its own. On an error every file
/// made so far is removed.
pub(crate) fn open_built(spec: &TargetSpec, options: OpenOptions) -> Result<(TargetInfo, Backend, CreatedFiles), String> {
    let mut files = CreatedFiles::default();
    let engine = start_engine(options)?;
    let (mut info, backend) = match spec {
        TargetSpec::Vd(vd) => {
            let journal = attach_journal(vd, &engine, &mut files)?;
            let disk = build_vd(vd, &engine, None, &mut files)?;
            let info = vd_info(vd, &disk, &engine, journal.as_ref());
            (info, Backend::Shared(disk.target))
        }
        TargetSpec::Raw(drive_spec) => {
            let drive = make_drive(drive_spec, "raw", &Arc::new(RealClock::new()), &mut files)?;
            (raw_info(drive_spec, &drive, &engine), Backend::Raw { engine, drive })
        }
        TargetSpec::Set { count, each } => open_set(*count, each, &engine, &mut files)?,
        TargetSpec::Nbd { .. } | TargetSpec::Path(_) => unreachable!("only vd:, raw: and set: targets are built here"),
    };
    info.spec = spec.text();
    Ok((info, backend, files))
}

/// One VD built over drives made for it, served by `engine`.
struct BuiltVd {
    target: Arc<VdTarget>,
    drives: Vec<Arc<dyn Drive>>,
}

/// `disk`: the VD's place in a set, which names its drives apart from the other disks'.
fn build_vd(spec: &VdSpec, engine: &Arc<Engine>, disk: Option<usize>, files: &mut CreatedFiles) -> Result<BuiltVd, String> {
    let id = disk.unwrap_or(0) as u64;
    let name = disk.map_or("bench".to_string(), |disk| format!("bench{disk}"));
    let (vd, drives) = new_vd(spec, id, &name, "", disk, files).map_err(|e| format!("--target vd:{}: {e}", spec.level))?;
    vd.set_write_policy(spec.write_policy);
    vd.set_read_policies(spec.read_policy, spec.io_policy);
    vd.set_seq_cutoff(spec.seq_cutoff);
    if let Some(cache_spec) = &spec.ssd_cache {
        attach_ssd_cache(&vd, cache_spec, engine, disk, files).map_err(|e| format!("cachecade: {e}"))?;
    }
    Ok(BuiltVd { target: Arc::new(VdTarget { engine: Arc::clone(engine), vd }), drives })
}

/// Builds the `cachecade=` cache VD on drives of its own and has it cache `vd`.
fn attach_ssd_cache(
    vd: &Arc<VirtualDrive>,
    spec: &VdSpec,
    engine: &Engine,
    disk: Option<usize>,
    files: &mut CreatedFiles,
) -> Result<(), String> {
    // Ids apart from the cached VDs' (a set's disks are 0 to 31).
    let id = 1000 + disk.unwrap_or(0) as u64;
    let (cache_vd, _) = new_vd(spec, id, &format!("cache{id}"), "cache", disk, files)?;
    let write_back = spec.write_policy != WritePolicy::WriteThrough;
    let cache = engine.ssd_cache(&cache_vd, SsdCacheOptions { write_back, ..SsdCacheOptions::default() })?;
    engine.attach_ssd_cache(vd, &cache)?;
    // Its table in service (fresh drives, no controller: any owner): write-back from now on.
    cache.begin_service(MapOwner { controller_id: 0, generation: 0 })
}

/// A VD and the drives under it (closed when the benchmark ends: RBD images hold locks).
type VdAndDrives = (Arc<VirtualDrive>, Vec<Arc<dyn Drive>>);

/// A VD of `spec`'s level over drives made for it, named `{disk}.{prefix}{member}` (or
/// `{prefix}{member}` outside a set).
fn new_vd(spec: &VdSpec, id: u64, name: &str, prefix: &str, disk: Option<usize>, files: &mut CreatedFiles) -> Result<VdAndDrives, String> {
    let clock = Arc::new(RealClock::new());
    let member_name = |member: usize| disk.map_or(format!("{prefix}{member}"), |disk| format!("{disk}.{prefix}{member}"));
    let drives: Vec<Arc<dyn Drive>> =
        (0..spec.drive_count).map(|member| make_drive(&spec.drive, &member_name(member), &clock, files)).collect::<Result<_, _>>()?;
    let layout = VdLayout {
        level: spec.level,
        strip_size_bytes: spec.strip_size_bytes,
        drives_per_span: spec.drives_per_span,
        member_size_bytes: None,
    };
    let vd = VirtualDrive::new(id, name, layout, drives.clone()).map_err(|e| e.to_string())?;
    Ok((Arc::new(vd), drives))
}

/// A set's disks: VDs or raw drives, all of one spec, on one engine.
fn open_set(count: usize, each: &TargetSpec, engine: &Arc<Engine>, files: &mut CreatedFiles) -> Result<(TargetInfo, Backend), String> {
    let (info, disks): (TargetInfo, Vec<Arc<dyn Target>>) = match each {
        TargetSpec::Vd(vd) => {
            let journal = attach_journal(vd, engine, files)?;
            let built: Vec<BuiltVd> = (0..count).map(|disk| build_vd(vd, engine, Some(disk), files)).collect::<Result<_, _>>()?;
            let mut info = vd_info(vd, &built[0], engine, journal.as_ref());
            info.drives = built.iter().flat_map(|disk| describe_drives(&disk.drives, &vd.drive)).collect();
            (info, built.into_iter().map(|disk| disk.target as Arc<dyn Target>).collect())
        }
        TargetSpec::Raw(drive_spec) => {
            let clock = Arc::new(RealClock::new());
            let drives: Vec<Arc<dyn Drive>> =
                (0..count).map(|disk| make_drive(drive_spec, &format!("raw{disk}"), &clock, files)).collect::<Result<_, _>>()?;
            let mut info = raw_info(drive_spec, &drives[0], engine);
            info.drives = describe_drives(&drives, drive_spec);
            let disks = drives.into_iter().enumerate().map(|(disk, drive)| {
                // Spread over the shards as a VD spreads its rows.
                let shard = disk % engine.shard_count();
                Arc::new(RawDriveTarget { engine: Arc::clone(engine), drive, shard, data_offset_bytes: 0 }) as Arc<dyn Target>
            });
            (info, disks.collect())
        }
        other => return Err(format!("each disk of a set is a vd:... or a raw:... target, not {}", other.text())),
    };
    let info = TargetInfo {
        kind: format!("set of {}", info.kind),
        description: format!("{count} disks, each {}", info.description),
        capacity_bytes: info.capacity_bytes * count as u64,
        disk_count: Some(count),
        ..info
    };
    Ok((info, Backend::Disks(disks)))
}

fn vd_info(spec: &VdSpec, built: &BuiltVd, engine: &Engine, journal: Option<&Arc<dyn Drive>>) -> TargetInfo {
    let geometry = built.target.vd.geometry();
    let capacity_bytes = built.target.capacity_bytes();
    TargetInfo {
        spec: String::new(),
        kind: "vd".into(),
        description: format!(
            "{} over {} x {}, strip {} KiB, {} bytes, in-process engine ({} shards)",
            geometry.level(),
            geometry.drive_count(),
            member_text(&spec.drive),
            spec.strip_size_bytes / 1024,
            capacity_bytes,
            engine.shard_count()
        ),
        capacity_bytes,
        level: Some(geometry.level().to_string()),
        drive_count: Some(geometry.drive_count()),
        strip_size_bytes: Some(spec.strip_size_bytes),
        drives: describe_drives(&built.drives, &spec.drive),
        policies: Some(policies_in_effect(spec, journal)),
        direct_io: Some(built.drives.iter().all(|d| d.info().direct_io)),
        engine_shards: Some(engine.shard_count()),
        disk_count: None,
    }
}

fn raw_info(spec: &MemberSpec, drive: &Arc<dyn Drive>, engine: &Engine) -> TargetInfo {
    let capacity_bytes = drive.info().capacity_bytes;
    TargetInfo {
        kind: "raw".into(),
        description: format!(
            "{} driven raw through the in-process engine's shards ({} shards), {} bytes",
            member_text(spec),
            engine.shard_count(),
            capacity_bytes
        ),
        capacity_bytes,
        drives: describe_drives(std::slice::from_ref(drive), spec),
        direct_io: Some(drive.info().direct_io),
        engine_shards: Some(engine.shard_count()),
        ..TargetInfo::default()
    }
}

fn make_drive(spec: &MemberSpec, name: &str, clock: &Arc<RealClock>, files: &mut CreatedFiles) -> Result<Arc<dyn Drive>, String> {
    // A journal file is allocated up front and written O_DSYNC, as `storc serve --journal`
    // opens one.
    let journal = name == "journal";
    Ok(match spec {
        MemberSpec::Mem { capacity_bytes, filled } => {
            let drive = MemDrive::open(format!("mem:{capacity_bytes}#{name}"), *capacity_bytes, Backing::Dense)
                .map_err(|e| format!("memory drive {name}: {e}"))?;
            if *filled {
                drive.fill();
            }
            Arc::new(drive)
        }
        MemberSpec::Emulated(emulated) => Arc::new(EmulatedDrive::open(emulated, clock.clone()).map_err(|e| format!("{emulated}: {e}"))?),
        MemberSpec::Files { dir, capacity_bytes, filled } => {
            let path = match filled {
                true => kept_filled_file(dir, name, *capacity_bytes, files)?,
                false => {
                    let path = dir.join(format!("storc-bench-{}-{name}.img", std::process::id()));
                    files.paths.push(path.clone());
                    path
                }
            };
            let config = FileDriveConfig {
                create_size_bytes: Some(*capacity_bytes),
                preallocate: journal || *filled,
                durable_writes: journal,
                ..FileDriveConfig::default()
            };
            Arc::new(FileDrive::open(&path, &config).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        MemberSpec::Rbd(rbd) => {
            let drive: Arc<dyn Drive> = Arc::new(RbdDrive::open(&rbd_member(rbd, name))?);
            files.to_close.push(Arc::clone(&drive));
            drive
        }
    })
}

/// The path of drive `name`'s kept file in `dir` (`file:DIR:SIZE,filled`), locked for this run
/// (the lock goes into `files`). A file that is not whole (a run stopped while writing it) is
/// removed, so that the drive writes it again.
fn kept_filled_file(dir: &std::path::Path, name: &str, capacity_bytes: u64, files: &mut CreatedFiles) -> Result<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let path = dir.join(format!("storc-bench-filled-{name}-{capacity_bytes}.img"));
    let lock_path = path.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!("{} is in use by another storc bench (its lock {} is held)", path.display(), lock_path.display()))
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(format!("{}: {e}", lock_path.display())),
    }
    files.locks.push(lock);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.len() == capacity_bytes && meta.blocks() * 512 >= capacity_bytes => {}
        Ok(_) => std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    if !path.exists() {
        eprintln!("{}: writing every block once (kept for later runs)", path.display());
    }
    Ok(path)
}

/// The image of a target's drive `name`: the spec's own for a `raw:` target, else the spec's
/// image name with the drive's name after a dash (`bench-0`, `bench-journal`, `bench-0.3`).
fn rbd_member(spec: &RbdSpec, name: &str) -> RbdSpec {
    match name {
        "raw" => spec.clone(),
        _ => spec.with_image(format!("{}-{name}", spec.image)),
    }
}

/// Formats the `journal=` drive and hands it to the engine's shards, as a controller does.
fn attach_journal(spec: &VdSpec, engine: &Engine, files: &mut CreatedFiles) -> Result<Option<Arc<dyn Drive>>, String> {
    let Some(journal_spec) = &spec.journal else { return Ok(None) };
    let drive = make_drive(journal_spec, "journal", &Arc::new(RealClock::new()), files)?;
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
    if let Some(cache) = &spec.ssd_cache {
        notes.push(format!(
            "SSD cache (write-through, {} KiB lines) on {} of {} x {}",
            engine::ssd_cache::DEFAULT_LINE_BYTES / 1024,
            cache.level,
            cache.drive_count,
            member_text(&cache.drive)
        ));
    }
    Policies { write, read: spec.read_policy.short_name().into(), io: spec.io_policy.short_name().into(), note: notes.join("; ") }
}

fn describe_drives(drives: &[Arc<dyn Drive>], spec: &MemberSpec) -> Vec<DriveDescription> {
    let model = match spec {
        MemberSpec::Emulated(emulated) => Some(emulated.class.model().to_string()),
        _ => None,
    };
    drives.iter().map(|drive| describe_drive(drive.as_ref(), model.clone())).collect()
}

pub(crate) fn describe_drive(drive: &dyn Drive, model: Option<String>) -> DriveDescription {
    let info = drive.info();
    let kind = match info.kind {
        DriveKind::Memory => "memory",
        DriveKind::File => "file",
        DriveKind::BlockDevice => "block-device",
        DriveKind::Emulated => "emulated",
        DriveKind::Network => "network",
        DriveKind::Rbd => "rbd",
    };
    DriveDescription { name: info.name.clone(), kind: kind.into(), model, capacity_bytes: info.capacity_bytes, direct_io: info.direct_io }
}
