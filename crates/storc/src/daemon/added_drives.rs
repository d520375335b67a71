//! Drives added while the daemon runs: the target a migration names by its spec
//! (`/c0/vN start migrate target=rbd:POOL/IMAGE`), which no `--drive` argument gives.
//!
//! Each is remembered in `added-drives` in the data directory (one spec per line, owner-only)
//! before the controller records it, and every later start opens those specs after the
//! `--drive` arguments, as if they had been given last. The order matters for a crash: a spec
//! remembered whose drive the controller never recorded opens as a blank drive next time (an
//! unconfigured good drive, harmless); the reverse, a recorded drive no start opens, would be a
//! VD whose only member comes up missing once the migration has switched to it.
//!
//! Only drives that keep their data can be added this way: RBD images and files; a `mem:` or
//! emulated drive would come back blank at the next start, and an NBD export is given with
//! `--drive` so that its link is watched from the start.
//!
//! And only drives that hold nothing: a new RBD image or file that storc creates, or an existing
//! one with nothing allocated (`rbd create`, `truncate -s`). A command over the API must not be
//! able to overwrite data nobody gave storc: an image of someone else's pool that a typo names,
//! or, for a member of `--socket-group` (a storc administrator, not root), a file of the system.
//! For the same reason storc creates a file only inside its data directory; a block device, or a
//! file that holds data, is given with `--drive` at start and named by its slot.

use drive::{Drive, FileDrive, FileDriveConfig, RbdDrive, RbdSpec, RBD_FORM};
use engine::controller::OfferedDrive;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const FILE_NAME: &str = "added-drives";

/// The specs remembered in `data_dir` (none when the file does not exist).
///
/// # Errors
/// The file exists but cannot be read.
pub fn load(data_dir: &Path) -> Result<Vec<String>, String> {
    let path = data_dir.join(FILE_NAME);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(str::trim).filter(|line| !line.is_empty()).map(String::from).collect()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(format!("cannot read {}: {error}", path.display())),
    }
}

/// The remembered specs, and the drives opened from them at run time (closed at shutdown,
/// after the controller's: an RBD image holds its lock until then).
pub struct AddedDrives {
    path: PathBuf,
    state: Mutex<Added>,
    /// Held through one whole addition (open, remember, record or forget), so that two
    /// commands naming the same spec cannot forget what the other remembered.
    adding: Mutex<()>,
}

struct Added {
    specs: Vec<String>,
    opened: Vec<Arc<dyn Drive>>,
}

impl AddedDrives {
    /// The data directory, where a target file may be created.
    pub fn data_dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    pub fn new(data_dir: &Path, specs: Vec<String>) -> AddedDrives {
        AddedDrives { path: data_dir.join(FILE_NAME), state: Mutex::new(Added { specs, opened: Vec::new() }), adding: Mutex::new(()) }
    }

    /// Taken for the whole of one addition (see the field).
    pub fn adding(&self) -> std::sync::MutexGuard<'_, ()> {
        self.adding.lock().expect("adding lock")
    }

    /// Adds `spec` to the file (written whole to a new file, synced, then renamed over the old
    /// one, so a crash leaves the old list or the new one). Says whether it was new: only a
    /// spec this call added may be forgotten again (one remembered before may name a drive
    /// the configuration records, which did not open at this start).
    ///
    /// # Errors
    /// The file cannot be written; it is unchanged then.
    pub fn remember(&self, spec: &str) -> Result<bool, String> {
        let mut state = self.state.lock().expect("added drives lock");
        if state.specs.iter().any(|known| known == spec) {
            return Ok(false);
        }
        let mut specs = state.specs.clone();
        specs.push(spec.to_string());
        self.write(&specs)?;
        state.specs = specs;
        Ok(true)
    }

    /// Takes `spec`, which [`AddedDrives::remember`] has just added, out of the file again (its
    /// drive was not recorded after all); best effort, since a spec left there only opens as an
    /// unconfigured drive.
    pub fn forget(&self, spec: &str) {
        let mut state = self.state.lock().expect("added drives lock");
        let specs: Vec<String> = state.specs.iter().filter(|known| *known != spec).cloned().collect();
        if self.write(&specs).is_ok() {
            state.specs = specs;
        }
    }

    /// Keeps a drive opened at run time, to close it at shutdown.
    pub fn opened(&self, drive: Arc<dyn Drive>) {
        self.state.lock().expect("added drives lock").opened.push(drive);
    }

    /// Closes the drives opened at run time (after the controller's shutdown).
    pub fn close_all(&self) {
        for drive in std::mem::take(&mut self.state.lock().expect("added drives lock").opened) {
            drive.close();
        }
    }

    fn write(&self, specs: &[String]) -> Result<(), String> {
        let fresh = self.path.with_extension("new");
        let written = (|| {
            let mut file = std::fs::OpenOptions::new();
            std::os::unix::fs::OpenOptionsExt::mode(file.write(true).create(true).truncate(true), 0o600);
            let mut file = file.open(&fresh)?;
            for spec in specs {
                writeln!(file, "{spec}")?;
            }
            file.sync_all()?;
            std::fs::rename(&fresh, &self.path)?;
            let directory = self.path.parent().unwrap_or(Path::new("."));
            std::fs::File::open(directory)?.sync_all()
        })();
        written.map_err(|error| format!("cannot write {}: {error}", self.path.display()))
    }
}

/// Opens the drive a migration names by its spec, creating it with `size_bytes` when it does
/// not exist: an RBD image (`rbd create`'s defaults), or a file in `data_dir` (sparse,
/// owner-only); an existing one must have nothing allocated (see the module docs). Also says
/// what it created, if anything, for the answer and the error messages.
///
/// # Errors
/// A spec of another kind, with the kinds allowed; a drive that holds data; or why the drive
/// cannot be opened or made.
pub fn open_target(spec: &str, size_bytes: u64, data_dir: &Path) -> Result<(OfferedDrive, Option<String>), String> {
    const ALLOWED: &str = "allowed: a slot number, a new or empty RBD image (created if missing), or the absolute path of a new or \
                           empty file (created if missing, in the data directory only)";
    if spec.contains('\n') || spec.trim() != spec || spec.is_empty() {
        return Err(format!("target={spec:?}: a drive spec is one line without surrounding blanks; {ALLOWED}"));
    }
    let volatile = ["mem:", "hdd:", "ssd:"].iter().any(|prefix| spec.starts_with(prefix));
    if volatile || nbd::member::MemberSpec::is_nbd(spec) {
        let why = if volatile { "comes back blank at the next start" } else { "is given with --drive, so that its link is watched" };
        return Err(format!("target={spec}: a drive of that kind {why}; {ALLOWED}"));
    }
    if let Some(rbd) = spec.strip_prefix("rbd:") {
        let parsed = RbdSpec::parse(rbd).map_err(|e| format!("target={spec}: {e} ({RBD_FORM})"))?;
        let (drive, created) = RbdDrive::open_or_create(&parsed, size_bytes)?;
        let drive: Arc<dyn Drive> = Arc::new(drive);
        if !created {
            refuse_unless_empty(&drive, spec, "RBD image")?;
        }
        let created = created.then(|| format!("RBD image {} ({size_bytes} bytes)", parsed.image_path()));
        return Ok((OfferedDrive { drive, source: spec.to_string() }, created));
    }
    let path = Path::new(spec);
    if !path.is_absolute() {
        return Err(format!(
            "target={spec}: a file or device is given by its absolute path (the daemon's directory is not yours); {ALLOWED}"
        ));
    }
    let exists = path.symlink_metadata().is_ok();
    if !exists && !inside(path, data_dir) {
        return Err(format!(
            "target={spec}: storc creates a target file only in its data directory {}; elsewhere create it yourself \
             (truncate -s {size_bytes} {spec}) and name it again; {ALLOWED}",
            data_dir.display()
        ));
    }
    let config = FileDriveConfig { create_size_bytes: (!exists).then_some(size_bytes), exclusive: true, ..FileDriveConfig::default() };
    let drive: Arc<dyn Drive> = Arc::new(FileDrive::open(path, &config).map_err(|e| format!("target={spec}: {e}"))?);
    if exists {
        refuse_unless_empty(&drive, spec, "file")?;
    }
    super::data_dir::warn_if_open_to_others(spec, path);
    let created = (!exists).then(|| format!("file {spec} ({size_bytes} bytes)"));
    Ok((OfferedDrive { drive, source: spec.to_string() }, created))
}

/// An existing drive named at run time must have nothing allocated; closed when refused.
fn refuse_unless_empty(drive: &Arc<dyn Drive>, spec: &str, kind: &str) -> Result<(), String> {
    if drive.reads_zero(0, drive.info().capacity_bytes) {
        return Ok(());
    }
    drive.close();
    Err(format!(
        "target={spec}: the {kind} exists and holds data (or is a device, which cannot tell); storc moves a VD at run time only \
         onto a new or empty one. To use this one, give it to storc serve with --drive and name its slot (target=N)"
    ))
}

/// Whether `path`'s directory, its symbolic links resolved, is `data_dir` or below it.
fn inside(path: &Path, data_dir: &Path) -> bool {
    let parent = path.parent().and_then(|p| p.canonicalize().ok());
    let data_dir = data_dir.canonicalize().ok();
    matches!((parent, data_dir), (Some(parent), Some(dir)) if parent.starts_with(&dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this process, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("storc-added-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn specs_are_remembered_once_in_order_and_forgotten() {
        let dir = Scratch::new("remember");
        assert_eq!(load(dir.path()).unwrap(), Vec::<String>::new());
        let added = AddedDrives::new(dir.path(), Vec::new());
        assert!(added.remember("rbd:rbd/a").unwrap());
        assert!(added.remember("/srv/b.img").unwrap());
        assert!(!added.remember("rbd:rbd/a").unwrap(), "known already");
        assert_eq!(load(dir.path()).unwrap(), ["rbd:rbd/a", "/srv/b.img"]);
        added.forget("rbd:rbd/a");
        assert_eq!(load(dir.path()).unwrap(), ["/srv/b.img"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only");
    }

    #[test]
    fn targets_that_would_not_keep_the_vd_are_refused_with_what_is_allowed() {
        for (spec, expected) in [
            ("mem:1GiB", "comes back blank"),
            ("hdd:15k:1GiB", "comes back blank"),
            ("nbd://127.0.0.1/x", "is given with --drive"),
            ("relative.img", "absolute path"),
            ("rbd:nopool", "rbd:"),
            (" rbd:a/b", "one line"),
        ] {
            let error = open_target(spec, 1 << 30, Path::new("/nonexistent")).err().unwrap_or_else(|| panic!("{spec} was accepted"));
            assert!(error.contains(expected), "{spec}: {error}");
        }
    }

    #[test]
    fn a_file_target_is_created_in_the_data_directory_only_and_must_hold_nothing() {
        let dir = Scratch::new("create");
        let data_dir = dir.path().join("data");
        std::fs::create_dir(&data_dir).unwrap();
        let path = data_dir.join("target.img");
        let (offer, created) = open_target(path.to_str().unwrap(), 64 << 20, &data_dir).unwrap();
        assert_eq!(offer.drive.info().capacity_bytes, 64 << 20);
        assert!(created.is_some_and(|what| what.contains("file")));
        drop(offer);
        let (_, created) = open_target(path.to_str().unwrap(), 64 << 20, &data_dir).unwrap();
        assert_eq!(created, None, "an existing empty file is opened as it is");

        let outside = dir.path().join("elsewhere.img");
        let error = open_target(outside.to_str().unwrap(), 64 << 20, &data_dir).err().expect("refused");
        assert!(error.contains("only in its data directory") && error.contains("truncate -s"), "{error}");
        assert!(!outside.exists(), "nothing was created");
        let escaping = data_dir.join("..").join("escaping.img");
        assert!(open_target(escaping.to_str().unwrap(), 64 << 20, &data_dir).is_err(), "a path leaving the data directory");

        let file = std::fs::File::create(&outside).unwrap();
        file.set_len(64 << 20).unwrap();
        assert!(open_target(outside.to_str().unwrap(), 64 << 20, &data_dir).is_ok(), "an existing empty file elsewhere");
        std::os::unix::fs::FileExt::write_all_at(&file, b"someone's data", 8 << 20).unwrap();
        let error = open_target(outside.to_str().unwrap(), 64 << 20, &data_dir).err().expect("refused");
        assert!(error.contains("holds data") && error.contains("--drive"), "{error}");
    }
}
