//! The file benchmark's file I/O: contents written and checked by seed, whole-file reads and
//! copies through one buffer, and the page cache dropped behind every file (see the parent's
//! "Cache" section).

use super::{splitmix, Phase, PlannedFile};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Fills `buf` with the content of a file at byte `offset` (a multiple of 8) for `seed`.
pub(super) fn fill(buf: &mut [u8], seed: u64, offset: u64) {
    for (word, chunk) in (offset / 8..).zip(buf.chunks_mut(8)) {
        let mut s = seed ^ word.wrapping_mul(0xD134_2543_DE82_EF95);
        let v = splitmix(&mut s).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

extern "C" {
    fn posix_fadvise(fd: i32, offset: i64, len: i64, advice: i32) -> i32;
}
const POSIX_FADV_DONTNEED: i32 = 4;

/// Drops the page cache of `file` (clean pages only; written files are fsynced first).
pub(super) fn drop_cache(file: &File) {
    // SAFETY: a valid open descriptor; the call only advises the kernel.
    unsafe {
        posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_DONTNEED);
    }
}

pub(super) fn write_file(path: &Path, planned: &PlannedFile, buf: &mut [u8]) -> Result<u32, String> {
    let mut file = File::create(path).map_err(|e| io_err("cannot create", path, e))?;
    let mut crc = 0u32;
    let mut offset = 0u64;
    while offset < planned.size {
        let n = ((planned.size - offset) as usize).min(buf.len());
        fill(&mut buf[..n], planned.seed, offset);
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| io_err("cannot write", path, e))?;
        offset += n as u64;
    }
    Ok(crc)
}

/// Reads a whole file, returning its crc32c and length, then drops it from the cache.
pub(super) fn read_file(path: &Path, buf: &mut [u8]) -> Result<(u32, u64), String> {
    let mut file = File::open(path).map_err(|e| io_err("cannot open", path, e))?;
    let mut crc = 0u32;
    let mut len = 0u64;
    loop {
        let n = file.read(buf).map_err(|e| io_err("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        len += n as u64;
    }
    drop_cache(&file);
    Ok((crc, len))
}

pub(super) fn copy_file(from: &Path, to: &Path, buf: &mut [u8]) -> Result<(), String> {
    let mut src = File::open(from).map_err(|e| io_err("cannot open", from, e))?;
    let mut dst = File::create(to).map_err(|e| io_err("cannot create", to, e))?;
    loop {
        let n = src.read(buf).map_err(|e| io_err("cannot read", from, e))?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n]).map_err(|e| io_err("cannot write", to, e))?;
    }
    drop_cache(&src);
    Ok(())
}

/// The end of a write phase: fsync every file written, then drop it from the page cache.
pub(super) fn sync_and_drop(root: &Path, files: &[PlannedFile]) -> Result<(), String> {
    for f in files {
        let path = root.join(&f.relative);
        let file = File::open(&path).map_err(|e| io_err("cannot open", &path, e))?;
        file.sync_all().map_err(|e| io_err("cannot fsync", &path, e))?;
        drop_cache(&file);
    }
    Ok(())
}

pub(super) fn make_dirs(root: &Path, files: &[PlannedFile]) -> Result<(), String> {
    let mut last: Option<&Path> = None;
    for f in files {
        let parent = f.relative.parent().unwrap_or(Path::new(""));
        if last != Some(parent) {
            let dir = root.join(parent);
            std::fs::create_dir_all(&dir).map_err(|e| io_err("cannot create directory", &dir, e))?;
            last = Some(parent);
        }
    }
    Ok(())
}

pub(super) fn verify(root: &Path, files: &[PlannedFile], crcs: &[u32], phase: Phase, set: &str, buf: &mut [u8]) -> Result<(), String> {
    for (f, &want) in files.iter().zip(crcs) {
        let path = root.join(&f.relative);
        let (got, len) = read_file(&path, buf)?;
        if got != want || len != f.size {
            return Err(format!(
                "VERIFY FAILED after {} of {set}: {} reads back wrong (crc32c {got:08x}, {len} bytes; written {want:08x}, {} bytes)",
                phase.label(),
                path.display(),
                f.size
            ));
        }
    }
    Ok(())
}
