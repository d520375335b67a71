//! `--target`: what a benchmark measures, opened in this process from its [`TargetSpec`].
//!
//! Every target needs no daemon: a VD or a raw drive is built here ([`crate::build`]) over
//! memory, emulated or file drives and served by an engine of this process; a file or block
//! device is driven through an engine shard's io_uring with O_DIRECT; an NBD export is reached
//! with `nbd::Client`. A `set:` is several disks: workers take them as IOMeter's do.

use crate::build::{describe_drive, open_built, start_engine, CreatedFiles};
use crate::nbd_target::{connections_for, NbdTarget};
use crate::results::TargetInfo;
use crate::spec::AccessSpec;
use crate::target::{RawDriveTarget, Target};
pub use crate::target_spec::{MemberSpec, TargetSpec, VdSpec, TARGET_FORMS};
use drive::{Drive, DriveKind, FileDrive, FileDriveConfig};
use engine::Engine;
use nbd::NbdUri;
use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// How to open a target.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Engine shards for VD and file targets (default: one per core).
    pub shards: Option<usize>,
    /// The run writes. A block device is then claimed with `O_EXCL`, as a controller claims
    /// its drives: the kernel refuses it while the device is mounted, a member of md or LVM, or
    /// a running `storc serve`'s drive, whose data the run would write over. A run that only
    /// reads opens it shared, so a mounted disk can still be measured.
    pub writes: bool,
}

/// An opened target: hands each worker its own [`Target`] (its own NBD connections, its own
/// engine shard for a raw file) and describes itself for the report.
pub struct OpenTarget {
    info: TargetInfo,
    backend: Backend,
    /// Member files this process made, removed on drop, after the backend.
    _created_files: CreatedFiles,
}

pub(crate) enum Backend {
    /// One target shared by every worker (a VD, or a test's own target).
    Shared(Arc<dyn Target>),
    /// A file or block device; each worker submits through its own shard.
    Raw { engine: Arc<Engine>, drive: Arc<dyn Drive> },
    /// Connections per worker, kept across points.
    Nbd { uri: NbdUri, text: String, by_worker: Mutex<HashMap<usize, Arc<NbdTarget>>> },
    /// The disks of a `set:`, each one target, all of one capacity.
    Disks(Vec<Arc<dyn Target>>),
}

impl OpenTarget {
    /// # Errors
    /// What could not be opened or built, naming the target.
    pub fn open(spec: &TargetSpec, options: OpenOptions) -> Result<OpenTarget, String> {
        match spec {
            TargetSpec::Nbd { uri, text } => open_nbd(uri, text),
            TargetSpec::Path(path) => open_path(path, options),
            TargetSpec::Vd(_) | TargetSpec::Raw(_) | TargetSpec::Set { .. } => {
                let (info, backend, created_files) = open_built(spec, options)?;
                Ok(OpenTarget { info, backend, _created_files: created_files })
            }
        }
    }

    /// Any target, shared by all workers: for tests and for embedding the runner.
    pub fn shared(target: Arc<dyn Target>, info: TargetInfo) -> OpenTarget {
        OpenTarget { info, backend: Backend::Shared(target), _created_files: CreatedFiles::default() }
    }

    /// Disks that workers are assigned to (a `set:`), or one disk, each of
    /// [`Self::disk_capacity_bytes`].
    pub fn disk_count(&self) -> usize {
        match &self.backend {
            Backend::Disks(disks) => disks.len(),
            _ => 1,
        }
    }

    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// The whole target: every disk of a set.
    pub fn capacity_bytes(&self) -> u64 {
        self.info.capacity_bytes
    }

    /// One disk's capacity: the zones of a pattern's workers are cut from it.
    pub fn disk_capacity_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Disks(disks) => disks[0].capacity_bytes(),
            _ => self.info.capacity_bytes,
        }
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
            Backend::Disks(disks) => disks.iter().try_for_each(|disk| disk.settle()),
        }
    }

    /// The target worker `worker_index` submits to on disk `disk` (below
    /// [`Self::disk_count`]), ready for `queue_depth` requests of `spec`. `reads_checked`:
    /// whether the worker looks at what its reads return (`--verify`); an NBD target skips
    /// copying it otherwise.
    ///
    /// # Errors
    /// NBD: a connection that could not be made.
    pub fn worker_target(
        &self,
        worker_index: usize,
        disk: usize,
        queue_depth: usize,
        spec: &AccessSpec,
        reads_checked: bool,
    ) -> Result<Arc<dyn Target>, String> {
        assert!(disk < self.disk_count(), "disk {disk} of {}", self.disk_count());
        match &self.backend {
            Backend::Disks(disks) => Ok(Arc::clone(&disks[disk])),
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
    let backend = Backend::Nbd { uri: uri.clone(), text: text.to_string(), by_worker };
    Ok(OpenTarget { info, backend, _created_files: CreatedFiles::default() })
}

fn open_path(path: &Path, options: OpenOptions) -> Result<OpenTarget, String> {
    let block_device = std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
    let config = FileDriveConfig { exclusive: block_device && options.writes, ..FileDriveConfig::default() };
    let file = FileDrive::open(path, &config).map_err(|e| match e.kind() {
        std::io::ErrorKind::ResourceBusy => format!(
            "--target {}: the run writes, and the device is in use (mounted, a member of md or LVM, or a running storc serve's \
             drive: the kernel refused O_EXCL); benchmark it with read patterns only, or free it first",
            path.display()
        ),
        _ => format!("--target {}: {e}", path.display()),
    })?;
    let mut held = CreatedFiles::default();
    if file.info().kind == DriveKind::File {
        held.hold(shared_claim(path)?);
    }
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
    Ok(OpenTarget { info, backend: Backend::Raw { engine, drive }, _created_files: held })
}

/// A shared `flock` on a file target, held for the run: refused while a running `storc serve`
/// holds the file as a drive (its exclusive claim, `FileDriveConfig::exclusive`), whose data
/// the benchmark would write over, and keeping a daemon from claiming it meanwhile. A block
/// device is claimed with `O_EXCL` when the run writes ([`OpenOptions::writes`]), and its
/// writes need `--overwrite-device` too (`storc bench`).
fn shared_claim(path: &Path) -> Result<std::fs::File, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("--target {}: {e}", path.display()))?;
    match file.try_lock_shared() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "--target {}: a running storc serve holds this file as one of its drives (an exclusive lock on it); \
             benchmark a copy, or stop that controller first",
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("--target {}: {e}", path.display())),
    }
}

fn io_mode(direct_io: bool) -> &'static str {
    if direct_io {
        "O_DIRECT"
    } else {
        "buffered: O_DIRECT refused"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file a controller holds as its drive is not benchmarked (its data would be written
    /// over), and a file being benchmarked cannot be claimed by a controller meanwhile.
    #[test]
    fn a_file_held_as_a_controllers_drive_is_refused_as_a_target_and_the_other_way_round() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("member.img");
        std::fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
        let spec = TargetSpec::Path(path.clone());
        let claimed = FileDrive::open(&path, &FileDriveConfig { exclusive: true, ..FileDriveConfig::default() }).unwrap();
        let refused =
            OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).err().expect("a controller's drive as the target");
        assert!(refused.contains("a running storc serve holds this file as one of its drives"), "{refused}");
        drop(claimed);
        let target = OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).expect("the file once no controller holds it");
        let error = FileDrive::open(&path, &FileDriveConfig { exclusive: true, ..FileDriveConfig::default() }).err();
        assert!(error.is_some_and(|e| e.kind() == std::io::ErrorKind::ResourceBusy), "claimed while a benchmark runs on it");
        drop(target);
    }

    /// A block device is claimed (`O_EXCL`) by a run that writes, so one that a controller
    /// holds (or that is mounted) is refused to it, and a controller cannot claim it while the
    /// run goes on; a run that only reads opens it shared.
    #[test]
    fn a_block_device_in_use_is_refused_to_a_run_that_writes_and_opened_to_one_that_reads() {
        let loop_device = drive::testing::LoopDevice::attach(8 << 20);
        let spec = TargetSpec::Path(loop_device.path().to_path_buf());
        let claim = FileDriveConfig { exclusive: true, ..FileDriveConfig::default() };
        let controller = FileDrive::open(loop_device.path(), &claim).unwrap();
        let refused = OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).err().expect("a writing run on a held device");
        assert!(refused.contains("the run writes, and the device is in use"), "{refused}");
        let reading = OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: false }).expect("a reading run beside the holder");
        drop(reading);
        drop(controller);
        let writing =
            OpenTarget::open(&spec, OpenOptions { shards: Some(1), writes: true }).expect("a writing run once the device is free");
        let error = FileDrive::open(loop_device.path(), &claim).err();
        assert!(error.is_some_and(|e| e.kind() == std::io::ErrorKind::ResourceBusy), "claimed while a run writes to it");
        drop(writing);
    }

    #[test]
    fn an_impossible_vd_reports_the_layout_rule() {
        let spec = TargetSpec::parse("vd:r6:2xmem:64MiB").unwrap();
        let message = OpenTarget::open(&spec, OpenOptions::default()).err().expect("RAID6 needs more drives");
        assert!(message.contains("RAID6"), "{message}");
    }
}
