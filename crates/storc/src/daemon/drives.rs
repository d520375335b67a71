//! Turning `--drive SPEC` arguments, or the embedded default, into drives.

use drive::{
    Backing, Drive, EmulatedDrive, EmulatedDriveSpec, FileDrive, FileDriveConfig, MemDrive, RbdDrive, RbdSpec, RealClock, RBD_FORM,
};
use engine::controller::{OfferedDrive, Severity};
use nbd::member::{MemberSpec, NbdDrive};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The embedded default: eight sparse files of this size in the data directory.
pub const DEFAULT_DRIVE_COUNT: usize = 8;
pub const DEFAULT_DRIVE_BYTES: u64 = 8 << 30;

/// Opens one `--drive` argument: `mem:SIZE`, `hdd:CLASS:SIZE[,...]`, `ssd:CLASS:SIZE[,...]`, an
/// NBD export (`nbd://HOST[:PORT]/EXPORT`, `nbds://...`, `nbd+unix:///EXPORT?socket=PATH`, each
/// with `timeout=DURATION` in its query if wanted), `rbd:POOL/IMAGE[?conf=PATH&id=USER&timeout=SECONDS]` (an
/// existing RBD image), or a path to an existing file or block device.
pub fn open_spec(spec: &str) -> Result<OfferedDrive, String> {
    open_drive(spec).map(|(offered, _)| offered).map_err(|failure| failure.message)
}

/// Why a drive did not open.
struct OpenFailure {
    message: String,
    /// Another process holds it (`FileDriveConfig::exclusive`): refused at every start, never
    /// left out as a dead disk, since another controller runs on it.
    claimed: bool,
}

impl From<String> for OpenFailure {
    fn from(message: String) -> OpenFailure {
        OpenFailure { message, claimed: false }
    }
}

impl From<std::io::Error> for OpenFailure {
    fn from(error: std::io::Error) -> OpenFailure {
        OpenFailure { message: error.to_string(), claimed: error.kind() == std::io::ErrorKind::ResourceBusy }
    }
}

/// Whether a `--drive` or `--journal` spec names a file or block device (not RAM, an emulated
/// drive, an RBD image or an NBD export).
fn is_path_spec(spec: &str) -> bool {
    !MemberSpec::is_nbd(spec) && !["mem:", "hdd:", "ssd:", "rbd:"].iter().any(|prefix| spec.starts_with(prefix))
}

/// Checks the syntax of a `--drive` or `--journal` spec (`flag`) without opening anything, so
/// that a start refused for a typo creates nothing: a path is only a path here (whether it
/// exists is for the open to say; later, a missing member is a dead disk).
pub fn check_syntax(flag: &str, spec: &str) -> Result<(), String> {
    if MemberSpec::is_nbd(spec) {
        return MemberSpec::parse(spec).map(drop).map_err(|e| format!("{flag} {e}"));
    }
    if let Some(rbd) = spec.strip_prefix("rbd:") {
        return RbdSpec::parse(rbd).map(drop).map_err(|e| format!("{flag} {e}"));
    }
    if let Some(size) = spec.strip_prefix("mem:") {
        return drive::parse_size_bytes(size).map(drop).map_err(|e| format!("{flag} {spec}: {e}"));
    }
    if spec.starts_with("hdd:") || spec.starts_with("ssd:") {
        return EmulatedDriveSpec::parse(spec).map(drop).map_err(|e| format!("{flag} {spec}: {e}"));
    }
    Ok(())
}

/// As [`open_spec`], and the NBD member itself when it is one (its link is watched).
fn open_drive(spec: &str) -> Result<(OfferedDrive, Option<Arc<NbdDrive>>), OpenFailure> {
    if MemberSpec::is_nbd(spec) {
        let parsed = MemberSpec::parse(spec).map_err(|e| format!("--drive {e}"))?;
        let member = Arc::new(NbdDrive::open(&parsed)?);
        let offered = OfferedDrive { drive: Arc::clone(&member) as Arc<dyn Drive>, source: spec.to_string() };
        return Ok((offered, Some(member)));
    }
    let drive: Arc<dyn Drive> = if let Some(rbd) = spec.strip_prefix("rbd:") {
        let parsed = RbdSpec::parse(rbd).map_err(|e| format!("--drive {e}"))?;
        Arc::new(RbdDrive::open(&parsed).map_err(|e| format!("--drive {e}"))?)
    } else if let Some(size) = spec.strip_prefix("mem:") {
        let capacity = drive::parse_size_bytes(size).map_err(|e| format!("--drive {spec}: {e}"))?;
        Arc::new(MemDrive::open(spec.to_string(), capacity, Backing::Dense).map_err(|e| format!("--drive {spec}: {e}"))?)
    } else if spec.starts_with("hdd:") || spec.starts_with("ssd:") {
        let parsed = EmulatedDriveSpec::parse(spec).map_err(|e| format!("--drive {spec}: {e}"))?;
        Arc::new(EmulatedDrive::open(&parsed, Arc::new(RealClock::new())).map_err(|e| format!("--drive {spec}: {e}"))?)
    } else {
        let path = Path::new(spec);
        if !path.exists() {
            return Err(OpenFailure::from(format!(
                "--drive {spec}: no such file or device; allowed: an existing file or block device, mem:SIZE, hdd:7200|10k|15k:SIZE, ssd:sata|sas|nvme:SIZE, nbd://HOST[:PORT]/EXPORT or {RBD_FORM} (create a file with: truncate -s 8G {spec})"
            )));
        }
        let drive = FileDrive::open(path, &FileDriveConfig { exclusive: true, ..FileDriveConfig::default() })?;
        super::data_dir::warn_if_open_to_others(spec, path);
        Arc::new(drive)
    };
    Ok((OfferedDrive { drive, source: spec.to_string() }, None))
}

/// Drives that opened, and events for the controller to log about those that did not.
pub type Opened = (Vec<OfferedDrive>, Vec<(Severity, String)>);

/// Opens every `--drive` argument. On a first start any failure is an error (a typo, most
/// likely); later a drive that cannot be opened (an NBD server that does not answer too) is
/// reported and left out, so that its slot comes up missing and the VDs serve degraded, as a
/// controller with a dead disk does; but a drive another process holds is refused at every start
/// (another controller runs on it). Also returns the NBD members, whose links the daemon watches.
pub fn open_specs(specs: &[String], first_start: bool) -> Result<(Opened, Vec<Arc<NbdDrive>>), String> {
    let mut opened = (Vec::new(), Vec::new());
    let mut links = Vec::new();
    for spec in specs {
        match open_drive(spec) {
            Ok((drive, link)) => {
                opened.0.push(drive);
                links.extend(link);
            }
            Err(failure) if !first_start && !failure.claimed && !is_bad_spec(spec) => opened.1.push(left_out(&failure.message)),
            Err(failure) => return Err(failure.message),
        }
    }
    Ok((opened, links))
}

/// A spec that can never open (a malformed NBD URI): refused at every start, not left out.
fn is_bad_spec(spec: &str) -> bool {
    MemberSpec::is_nbd(spec) && MemberSpec::parse(spec).is_err()
}

fn left_out(error: &str) -> (Severity, String) {
    (Severity::Critical, format!("{error}; the drive is left out and its slot comes up missing"))
}

/// The default drives: `drive-N.img` in `data_dir` (which exists), created sparse and
/// owner-only on the first start only (a file missing later is a dead disk, not a new one).
pub fn open_default(data_dir: &Path, first_start: bool) -> Result<Opened, String> {
    let mut opened = (Vec::new(), Vec::new());
    for i in 0..DEFAULT_DRIVE_COUNT {
        let path: PathBuf = data_dir.join(format!("drive-{i}.img"));
        let create_size_bytes = first_start.then_some(DEFAULT_DRIVE_BYTES);
        let config = FileDriveConfig { create_size_bytes, exclusive: true, ..Default::default() };
        match FileDrive::open(&path, &config) {
            Ok(drive) => opened.0.push(OfferedDrive { drive: Arc::new(drive), source: path.display().to_string() }),
            Err(error) if !first_start && error.kind() != std::io::ErrorKind::ResourceBusy => {
                opened.1.push(left_out(&format!("drive {}: {error}", path.display())))
            }
            Err(error) => return Err(error.to_string()),
        }
    }
    Ok(opened)
}

/// A journal file `--journal PATH` creates when it does not exist (allocated, owner-only):
/// twice the default cache, which it protects. Its data records get 7/8 of it (row images the
/// rest), and write-back absorbs writes only while their records fit, so a journal the size of
/// the cache would cap dirty data below what the cache holds.
pub const JOURNAL_DEFAULT_BYTES: u64 = 2 << 30;

/// Opens a journal device: `ssd:sata|sas|nvme:SIZE` (or any emulated or `mem:` spec), an RBD
/// image, or a path to a file (created, zero-filled, at [`JOURNAL_DEFAULT_BYTES`] if missing) or a
/// block device.
pub fn open_journal(spec: &str) -> Result<engine::controller::JournalOffer, String> {
    if !is_path_spec(spec) {
        let offered = open_spec(spec).map_err(|e| e.replacen("--drive", "--journal", 1))?;
        return Ok(engine::controller::JournalOffer { drive: offered.drive, source: spec.to_string(), path: None, slot: None });
    }
    let path = Path::new(spec);
    let create_size_bytes = (!path.exists()).then_some(JOURNAL_DEFAULT_BYTES);
    // O_DSYNC: a record is durable when its write completes, with no flush behind it.
    let config = FileDriveConfig { create_size_bytes, preallocate: true, durable_writes: true, exclusive: true, ..Default::default() };
    let drive = FileDrive::open(path, &config).map_err(|e| format!("--journal {spec}: {e}"))?;
    super::data_dir::warn_if_open_to_others(spec, path);
    Ok(engine::controller::JournalOffer { drive: Arc::new(drive), source: spec.to_string(), path: Some(path.to_path_buf()), slot: None })
}

/// Opens the legs of a journal: none, one device, or the two of a mirrored pair (which must be
/// two different devices: a pair on one file mirrors nothing).
pub fn open_journal_legs(specs: &[&str]) -> Result<Vec<engine::controller::JournalOffer>, String> {
    if let [a, b] = specs {
        let same_file = !a.contains(':') && Path::new(a).canonicalize().ok().is_some_and(|p| Path::new(b).canonicalize().ok() == Some(p));
        if a == b || same_file {
            return Err(format!("--journal {a} is given twice: the legs of a mirrored pair are two different devices"));
        }
    }
    specs.iter().map(|spec| open_journal(spec)).collect()
}

/// Refuses two `--drive` or `--journal` paths that name one file or block device (as the same
/// path, through a link, or as two device nodes of one device), flag and path both named:
/// opened twice, the second would wait for the first's claim and then be refused as if another
/// controller held it, and before drives were claimed a journal laid out on a member erased it.
pub fn check_distinct(drives: &[String], journals: &[String]) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let named = drives.iter().map(|spec| ("--drive", spec)).chain(journals.iter().map(|spec| ("--journal", spec)));
    let mut seen: Vec<((u64, u64), &str, &String)> = Vec::new();
    for (flag, spec) in named {
        // A path that does not exist yet (a journal file to create) is nothing else.
        let Some(metadata) = is_path_spec(spec).then(|| std::fs::metadata(spec).ok()).flatten() else { continue };
        let identity = if metadata.file_type().is_block_device() { (u64::MAX, metadata.rdev()) } else { (metadata.dev(), metadata.ino()) };
        if let Some((_, first_flag, first_spec)) = seen.iter().find(|(seen_identity, _, _)| *seen_identity == identity) {
            return Err(format!(
                "{first_flag} {first_spec} and {flag} {spec} are the same file or device: every drive and journal needs one of its own"
            ));
        }
        seen.push((identity, flag, spec));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Two flags that name one file, by the same path or another, are refused by name.
    #[test]
    fn a_file_given_twice_as_drive_or_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::File::create(&a).unwrap().set_len(1 << 20).unwrap();
        std::fs::File::create(&b).unwrap().set_len(1 << 20).unwrap();
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let text = |path: &std::path::Path| path.display().to_string();
        let new_journal = text(&dir.path().join("journal.img"));
        assert_eq!(super::check_distinct(&[text(&a), text(&b), "mem:1GiB".into()], &[new_journal]), Ok(()));
        let error = super::check_distinct(&[text(&a), text(&b)], &[text(&link)]).unwrap_err();
        let expected = format!("--drive {} and --journal {} are the same file or device", text(&a), text(&link));
        assert!(error.starts_with(&expected), "{error}");
        let error = super::check_distinct(&[text(&b), text(&a), text(&b)], &[]).unwrap_err();
        assert!(error.starts_with(&format!("--drive {} and --drive {} are the same", text(&b), text(&b))), "{error}");
    }

    /// `--journal FILE` is written `O_DSYNC`: the journal's records need no flush of their own.
    #[test]
    fn a_journal_file_is_opened_for_durable_writes() {
        let path = std::env::temp_dir().join(format!("storc-journal-dsync-{}.img", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(64 << 20).unwrap();
        let offer = super::open_journal(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(offer.unwrap().drive.writes_durable(), "the journal file was opened without O_DSYNC");
    }
}
