//! The data directory and what storc keeps in it, owner-only whatever the umask: the drive files
//! hold every VD's raw data and the sockets read and write it, so no other local user may open
//! either. `--socket-group` opens the two sockets (and only them) to one group: they become
//! 0660 of that group, and the directory 0710 of that group, so its members can reach a socket
//! by name but neither list the directory nor open anything else in it.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;
/// With `--socket-group`: the group may pass through the directory (to a socket it knows the
/// name of), not list it.
pub const GROUP_DIR_MODE: u32 = 0o710;
/// With `--socket-group`: the group may connect to the sockets (connect needs write permission).
pub const GROUP_SOCKET_MODE: u32 = 0o660;

/// The group of `--socket-group`, resolved before anything is created.
#[derive(Debug, Clone)]
pub struct SocketGroup {
    pub name: String,
    pub gid: u32,
}

impl SocketGroup {
    /// # Errors
    /// No such group in the system's group database.
    pub fn resolve(name: &str) -> Result<SocketGroup, String> {
        let unknown = || format!("--socket-group {name}: no such group; allowed: a group name from /etc/group (getent group NAME)");
        let c_name = std::ffi::CString::new(name).map_err(|_| unknown())?;
        // SAFETY: an all-zero `group` (null pointers, zero ids) is a valid value to be written over.
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut buffer = vec![0 as libc::c_char; 16 << 10];
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is to a live object of the right type for the whole call, and
        // `buffer.len()` is the size of `buffer`; getgrnam_r writes only into them.
        let status = unsafe { libc::getgrnam_r(c_name.as_ptr(), &mut group, buffer.as_mut_ptr(), buffer.len(), &mut found) };
        if status != 0 || found.is_null() {
            return Err(unknown());
        }
        Ok(SocketGroup { name: name.to_string(), gid: group.gr_gid })
    }
}
/// The permission bits of the group and of other users.
const GROUP_OTHER_BITS: u32 = 0o077;

/// Creates `dir` 0700, or tightens an existing one and the files storc owns in it (drive-N.img,
/// controller.id, api.token, added-drives, *.log) to owner-only, each with a logged line. With `group`, the
/// directory is then 0710 of that group (see the module).
///
/// # Errors
/// `dir` is not a directory, or cannot be created or changed.
pub fn prepare(dir: &Path, group: Option<&SocketGroup>) -> Result<(), String> {
    let group_bits = if group.is_some() { GROUP_DIR_MODE & GROUP_OTHER_BITS } else { 0 };
    match std::fs::metadata(dir) {
        Ok(metadata) if !metadata.is_dir() => {
            Err(format!("--data-dir {}: not a directory; allowed: a directory, or a path where storc creates one", dir.display()))
        }
        Ok(metadata) => tighten(dir, metadata.permissions().mode(), "data directory", group_bits),
        Err(error) if error.kind() == io::ErrorKind::NotFound => create(dir),
        Err(error) => Err(format!("cannot read data directory {}: {error}", dir.display())),
    }?;
    if let Some(group) = group {
        open_to_group(dir, group, GROUP_DIR_MODE, "data directory")?;
    }
    tighten_owned_files(dir)
}

/// Gives `path` to `group` with `mode`.
fn open_to_group(path: &Path, group: &SocketGroup, mode: u32, what: &str) -> Result<(), String> {
    let failed = |error: io::Error| format!("--socket-group {}: cannot give {what} {} to the group: {error}", group.name, path.display());
    std::os::unix::fs::chown(path, None, Some(group.gid)).map_err(failed)?;
    std::fs::set_permissions(path, Permissions::from_mode(mode)).map_err(failed)
}

fn create(dir: &Path) -> Result<(), String> {
    let failed = |error: io::Error| format!("cannot create data directory {}: {error}", dir.display());
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(failed)?;
    // The umask can only take bits away; set the mode exactly.
    std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE)).map_err(failed)
}

/// Clears the group and other bits of `path` but `allowed_bits` if any is set, and says so.
fn tighten(path: &Path, mode: u32, what: &str, allowed_bits: u32) -> Result<(), String> {
    let permission_bits = mode & 0o7777;
    if permission_bits & GROUP_OTHER_BITS & !allowed_bits == 0 {
        return Ok(());
    }
    let owner_only = permission_bits & !(GROUP_OTHER_BITS & !allowed_bits);
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
    let named = ["controller.id", super::api_token::TOKEN_FILE_NAME, super::added_drives::FILE_NAME, LOCK_FILE_NAME];
    is_drive || named.contains(&name) || name.ends_with(".log")
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
            tighten(&entry.path(), metadata.permissions().mode(), "file", 0)?;
        }
    }
    Ok(())
}

/// The file whose lock says which `storc serve` runs on a data directory.
pub const LOCK_FILE_NAME: &str = "serve.lock";

/// Takes the data directory for this process: an exclusive `flock` on `serve.lock` (owner-only),
/// held until the process exits, with its pid written in it. Taken before any drive is opened:
/// a second daemon on the same directory would otherwise assemble the same drives, replay the
/// journal the first one is writing, start its own resync and, on its way out, write a clean
/// stop into the metadata under the first one's feet (a later crash of the first would then
/// skip its resync). The kernel drops the lock when the process dies, kill -9 included.
///
/// # Errors
/// Another process holds the lock (its pid named), or the file cannot be opened.
pub fn lock(dir: &Path) -> Result<std::fs::File, String> {
    use std::io::{Read, Seek};
    let path = dir.join(LOCK_FILE_NAME);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(&path)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::Error(error)) => return Err(format!("cannot lock {}: {error}", path.display())),
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim().parse::<u32>().map_or_else(|_| "another process".to_string(), |pid| format!("pid {pid}"));
            return Err(format!(
                "--data-dir {} is in use by another storc serve ({holder} holds {}); one controller per data directory: \
                 stop that one first, or give another --data-dir",
                dir.display(),
                path.display()
            ));
        }
    }
    file.set_len(0).and_then(|()| file.rewind()).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    writeln!(file, "{}", std::process::id()).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    Ok(file)
}

/// Writes `contents` to a file created owner-only.
pub fn write_owner_only(path: &Path, contents: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(path)?;
    file.write_all(contents.as_bytes())
}

/// Makes a socket just bound owner-only (connect needs write permission on it), or 0660 of
/// `group`. The directory is already 0700 (0710 of the group), so nobody else could reach it
/// between the bind and this.
pub fn restrict_socket(path: &Path, group: Option<&SocketGroup>) -> Result<(), String> {
    if let Some(group) = group {
        return open_to_group(path, group, GROUP_SOCKET_MODE, "socket");
    }
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
    fn an_unknown_socket_group_is_refused_by_name() {
        let error = SocketGroup::resolve("no-such-group-storc").unwrap_err();
        assert_eq!(error, "--socket-group no-such-group-storc: no such group; allowed: a group name from /etc/group (getent group NAME)");
        assert_eq!(SocketGroup::resolve("root").map(|group| group.gid), Ok(0));
    }

    #[test]
    fn owned_file_names() {
        for name in ["drive-0.img", "drive-17.img", "controller.id", "api.token", "added-drives", "storc.log", "serve.lock"] {
            assert!(is_owned_file_name(name), "{name} is storc's");
        }
        for name in ["drive-.img", "drive-x.img", "drive-0.img.bak", "image.raw", "nbd.sock", "controller.id~"] {
            assert!(!is_owned_file_name(name), "{name} is not storc's");
        }
    }

    #[test]
    fn a_data_directory_is_taken_by_one_process_at_a_time_and_freed_when_its_lock_closes() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        let written = std::fs::read_to_string(dir.path().join(LOCK_FILE_NAME)).unwrap();
        assert_eq!(written, format!("{}\n", std::process::id()), "the holder's pid is in the lock file");
        // flock belongs to the open file: a second open, even in this process, is another holder.
        let refused = lock(dir.path()).unwrap_err();
        let expected =
            format!("is in use by another storc serve (pid {} holds {}", std::process::id(), dir.path().join(LOCK_FILE_NAME).display());
        assert!(refused.contains(&expected), "{refused}");
        drop(held);
        lock(dir.path()).expect("the lock is free once its holder closed it");
    }
}
