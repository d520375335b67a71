//! Turning `--drive SPEC` arguments, or the embedded default, into drives.

use drive::{Drive, EmulatedDrive, EmulatedDriveSpec, FileDrive, FileDriveConfig, MemDrive, RealClock};
use engine::controller::OfferedDrive;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The embedded default: eight sparse files of this size in the data directory.
pub const DEFAULT_DRIVE_COUNT: usize = 8;
pub const DEFAULT_DRIVE_BYTES: u64 = 8 << 30;

/// Opens one `--drive` argument: `mem:SIZE`, `hdd:CLASS:SIZE[,...]`, `ssd:CLASS:SIZE[,...]`, or a
/// path to an existing file or block device.
pub fn open_spec(spec: &str) -> Result<OfferedDrive, String> {
    let drive: Arc<dyn Drive> = if let Some(size) = spec.strip_prefix("mem:") {
        let capacity = drive::parse_size_bytes(size).map_err(|e| format!("--drive {spec}: {e}"))?;
        Arc::new(MemDrive::named(spec.to_string(), capacity))
    } else if spec.starts_with("hdd:") || spec.starts_with("ssd:") {
        let parsed = EmulatedDriveSpec::parse(spec).map_err(|e| format!("--drive {spec}: {e}"))?;
        Arc::new(EmulatedDrive::new(&parsed, Arc::new(RealClock::new())))
    } else {
        let path = Path::new(spec);
        if !path.exists() {
            return Err(format!(
                "--drive {spec}: no such file or device; allowed: an existing file or block device, mem:SIZE, hdd:7200|10k|15k:SIZE or ssd:sata|sas|nvme:SIZE (create a file with: truncate -s 8G {spec})"
            ));
        }
        let drive = FileDrive::open(path, &FileDriveConfig::default()).map_err(|e| e.to_string())?;
        super::data_dir::warn_if_open_to_others(spec, path);
        Arc::new(drive)
    };
    Ok(OfferedDrive { drive, source: spec.to_string() })
}

/// The default drives: `drive-N.img` in `data_dir` (which exists), created sparse and owner-only
/// on first start.
pub fn open_default(data_dir: &Path) -> Result<Vec<OfferedDrive>, String> {
    (0..DEFAULT_DRIVE_COUNT)
        .map(|i| {
            let path: PathBuf = data_dir.join(format!("drive-{i}.img"));
            let config = FileDriveConfig { create_size_bytes: Some(DEFAULT_DRIVE_BYTES), ..Default::default() };
            let drive = FileDrive::open(&path, &config).map_err(|e| e.to_string())?;
            Ok(OfferedDrive { drive: Arc::new(drive), source: path.display().to_string() })
        })
        .collect()
}
