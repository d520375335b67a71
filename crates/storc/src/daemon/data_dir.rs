//! The data directory and what storc keeps in it, owner-only whatever the umask: the drive files
//! hold every VD's raw data and the sockets read and write it, so no other local user may open
//! either.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;
/// The permission bits of the group and of other users.
const GROUP_OTHER_BITS: u32 = 0o077;

/// Creates `dir` 0700, or tightens an existing one and the files storc owns in it (drive-N.img,
/// controller.id, api.token, *.log) to owner-only, each with a logged line.
///
/// # Errors
/// `dir` is not a directory, or cannot be created or changed.
pub fn prepare(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(metadata) if !metadata.is_dir() => {
            Err(format!("--data-dir {}: not a directory; allowed: a directory, or a path where storc creates one", dir.display()))
        }
        Ok(metadata) => tighten(dir, metadata.permissions().mode(), "data directory"),
        Err(error) if error.kind() == io::ErrorKind::NotFound => create(dir),
        Err(error) => Err(format!("cannot read data directory {}: {error}", dir.display())),
    }?;
    tighten_owned_files(dir)
}

fn create(dir: &Path) -> Result<(), String> {
    let failed = |error: io::Error| format!("cannot create data directory {}: {error}", dir.display());
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(failed)?;
    // The umask can only take bits away; set the mode exactly.
    std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE)).map_err(failed)
}

/// Clears the group and other bits of `path` if any is set, and says so.
fn tighten(path: &Path, mode: u32, what: &str) -> Result<(), String> {
    let permission_bits = mode & 0o7777;
    if permission_bits & GROUP_OTHER_BITS == 0 {
        return Ok(());
    }
    let owner_only = permission_bits & !GROUP_OTHER_BITS;
    std::fs::set_permissions(path, Permissions::from_mode(owner_only)).map_err(|error| {
        format!(
            "{what} {} is mode {permission_bits:04o}, open to other users, and cannot be made {owner_only:04o}: {error}",
            path.display()
        )
    })?;
    tracing::warn!("{what} {} was mode {permission_bits:04o}, open to other users; now {owner_only:04o}", path.display());
    Ok(())
}

fn is_owned_file_name(name: &str) -> bool {
    let drive_index = name.strip_prefix("drive-").and_then(|rest| rest.strip_suffix(".img"));
    let is_drive = drive_index.is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()));
    is_drive || name == "controller.id" || name == super::api_token::TOKEN_FILE_NAME || name.ends_with(".log")
}

fn tighten_owned_files(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|error| format!("cannot list data directory {}: {error}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|error| format!("cannot list data directory {}: {error}", dir.display()))?;
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_owned_file_name) {
            continue;
        }
        // Not followed through symlinks: a link may point at a file the user keeps elsewhere.
        let metadata = entry.metadata().map_err(|error| format!("cannot read {}: {error}", entry.path().display()))?;
        if metadata.is_file() {
            tighten(&entry.path(), metadata.permissions().mode(), "file")?;
        }
    }
    Ok(())
}

/// Writes `contents` to a file created owner-only.
pub fn write_owner_only(path: &Path, contents: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(path)?;
    file.write_all(contents.as_bytes())
}

/// Makes a socket just bound owner-only (connect needs write permission on it). The directory
/// is already 0700, so no other user could reach it between the bind and this.
pub fn restrict_socket(path: &Path) -> Result<(), String> {
    std::fs::set_permissions(path, Permissions::from_mode(FILE_MODE))
        .map_err(|error| format!("cannot chmod socket {}: {error}", path.display()))
}

/// Warns when a `--drive` file or device is open to the group or other users: storc does not
/// change a file the user placed outside its data directory, but its data is every VD's.
pub fn warn_if_open_to_others(spec: &str, path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(metadata) = std::fs::metadata(path) else { return };
    let permission_bits = metadata.mode() & 0o7777;
    let who = match (permission_bits & 0o070 != 0, permission_bits & 0o007 != 0) {
        (false, false) => return,
        (true, false) => format!("its group (gid {})", metadata.gid()),
        (_, true) => "every local user".to_string(),
    };
    tracing::warn!(
        "--drive {spec} is mode {permission_bits:04o}: {who} can open it and the VD data on it; make it owner-only with: chmod go-rwx {spec}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_file_names() {
        for name in ["drive-0.img", "drive-17.img", "controller.id", "api.token", "storc.log"] {
            assert!(is_owned_file_name(name), "{name} is storc's");
        }
        for name in ["drive-.img", "drive-x.img", "drive-0.img.bak", "image.raw", "nbd.sock", "controller.id~"] {
            assert!(!is_owned_file_name(name), "{name} is not storc's");
        }
    }
}
