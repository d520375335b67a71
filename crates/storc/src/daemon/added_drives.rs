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
//! Only drives that keep their data can be added this way: RBD images, and files or block
//! devices; a `mem:` or emulated drive would come back blank at the next start, and an NBD
//! export is given with `--drive` so that its link is watched from the start.

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
/// not exist: an RBD image (`rbd create`'s defaults), or a file (sparse, owner-only). Also says
/// what it created, if anything, for the answer and the error messages.
///
/// # Errors
/// A spec of another kind, with the kinds allowed; or why the drive cannot be opened or made.
pub fn open_target(spec: &str, size_bytes: u64) -> Result<(OfferedDrive, Option<String>), String> {
    const ALLOWED: &str =
        "allowed: a slot number, an RBD image (created if missing) or the path of a file (created if missing) or block device";
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
        let created = created.then(|| format!("RBD image {} ({size_bytes} bytes)", parsed.image_path()));
        return Ok((OfferedDrive { drive: Arc::new(drive), source: spec.to_string() }, created));
    }
    let path = Path::new(spec);
    if !path.is_absolute() {
        return Err(format!(
            "target={spec}: a file or device is given by its absolute path (the daemon's directory is not yours); {ALLOWED}"
        ));
    }
    let create_size_bytes = (!path.exists()).then_some(size_bytes);
    let config = FileDriveConfig { create_size_bytes, ..FileDriveConfig::default() };
    let drive = FileDrive::open(path, &config).map_err(|e| format!("target={spec}: {e}"))?;
    super::data_dir::warn_if_open_to_others(spec, path);
    let created = create_size_bytes.map(|bytes| format!("file {spec} ({bytes} bytes)"));
    Ok((OfferedDrive { drive: Arc::new(drive), source: spec.to_string() }, created))
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
            let error = open_target(spec, 1 << 30).err().unwrap_or_else(|| panic!("{spec} was accepted"));
            assert!(error.contains(expected), "{spec}: {error}");
        }
    }

    #[test]
    fn a_missing_file_target_is_created_at_the_size_asked() {
        let dir = Scratch::new("create");
        let path = dir.path().join("target.img");
        let (offer, created) = open_target(path.to_str().unwrap(), 64 << 20).unwrap();
        assert_eq!(offer.drive.info().capacity_bytes, 64 << 20);
        assert!(created.is_some_and(|what| what.contains("file")));
        drop(offer);
        let (_, created) = open_target(path.to_str().unwrap(), 64 << 20).unwrap();
        assert_eq!(created, None, "an existing file is opened as it is");
    }
}
