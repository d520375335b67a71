//! An FC-Test-like file benchmark: file sets modelled on the reviewers' (ISO, MP3, Install,
//! Windows, Programs) are created in a directory, read back, copied within the same tree
//! ("Copy Near") and to a second directory ("Copy Far"), each phase timed and reported in MB/s
//! (10^6 bytes per second of file data).
//!
//! The source review does not give the file sets' sizes, only their character (ISO: the largest
//! files; MP3 and Install: large files; Windows and Programs: many small files), so the sets
//! below are modelled on that description; at scale 1 they total about 4.9 GB. `--scale`
//! multiplies the file count of every set (at least one file) and, for ISO, the size of its
//! three files. [`DEFAULT_SCALE`] (0.1, about 490 MB of file data and about 3 GB of device I/O
//! over the four phases) is chosen so a run takes about a minute on a plain disk.
//!
//! # Cache
//! So that reads reach the device: every write phase ends (inside its timing) with an `fsync` of
//! every file it wrote, then `posix_fadvise(POSIX_FADV_DONTNEED)` on each one; every file read
//! (Read, the source side of the copies, verification) is dropped the same way after it is read.
//! Nothing needs root (no `drop_caches`); directory metadata may stay cached.
//!
//! # Verification
//! Contents are deterministic pseudo-random (a seed per set and file); a crc32c per file is kept
//! when it is written. Read checks every file as it reads it; after each copy, every copied file
//! is read back (untimed) and checked. A mismatch fails the run with the file named.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The default `--scale`: about a minute on a plain disk (see the module documentation).
pub const DEFAULT_SCALE: f64 = 0.1;
/// Version of the JSON written by `storc bench files --json`.
pub const FILES_SCHEMA_VERSION: u32 = 1;

mod file_io;
use file_io::{copy_file, make_dirs, read_file, sync_and_drop, verify, write_file};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const BUF: usize = MIB as usize;

/// How a set's file sizes are drawn.
#[derive(Clone, Copy, Debug)]
enum Sizes {
    /// Every file this size (scaled by `--scale` when `scale_size`).
    Fixed(u64),
    /// Uniform between the two.
    Uniform(u64, u64),
    /// Log-uniform between the two: many small files, a few large ones.
    LogUniform(u64, u64),
}

/// One file set at scale 1.
#[derive(Clone, Copy, Debug)]
pub struct FileSet {
    pub name: &'static str,
    pub description: &'static str,
    files: u64,
    sizes: Sizes,
    /// Directory depth under the set's root and fan-out per level; files per leaf directory.
    depth: u32,
    fanout: u64,
    per_dir: u64,
    extension: &'static str,
    /// ISO: `--scale` shrinks the files, not their number.
    scale_size: bool,
}

/// The file sets, in the reviewers' order.
pub const FILE_SETS: [FileSet; 5] = [
    FileSet {
        name: "ISO",
        description: "3 huge files (640 MiB at scale 1, the size scales)",
        files: 3,
        sizes: Sizes::Fixed(640 * MIB),
        depth: 0,
        fanout: 1,
        per_dir: 3,
        extension: "iso",
        scale_size: true,
    },
    FileSet {
        name: "MP3",
        description: "400 files of 3-5 MiB in albums of 20",
        files: 400,
        sizes: Sizes::Uniform(3 * MIB, 5 * MIB),
        depth: 1,
        fanout: 1000,
        per_dir: 20,
        extension: "mp3",
        scale_size: false,
    },
    FileSet {
        name: "Install",
        description: "1,000 files of 512 B-4 MiB (log-uniform) in a 3-level tree, like an installed program",
        files: 1000,
        sizes: Sizes::LogUniform(512, 4 * MIB),
        depth: 3,
        fanout: 4,
        per_dir: 16,
        extension: "dat",
        scale_size: false,
    },
    FileSet {
        name: "Windows",
        description: "5,000 small system files of 512 B-512 KiB (log-uniform) in a 5-level tree",
        files: 5000,
        sizes: Sizes::LogUniform(512, 512 * KIB),
        depth: 5,
        fanout: 4,
        per_dir: 8,
        extension: "dll",
        scale_size: false,
    },
    FileSet {
        name: "Programs",
        description: "2,000 mixed files of 512 B-2 MiB (log-uniform) in a 3-level tree",
        files: 2000,
        sizes: Sizes::LogUniform(512, 2 * MIB),
        depth: 3,
        fanout: 5,
        per_dir: 16,
        extension: "exe",
        scale_size: false,
    },
];

/// The four timed phases of every set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Phase {
    Create,
    Read,
    CopyNear,
    CopyFar,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Create, Phase::Read, Phase::CopyNear, Phase::CopyFar];

    pub fn label(self) -> &'static str {
        match self {
            Phase::Create => "Create",
            Phase::Read => "Read",
            Phase::CopyNear => "Copy Near",
            Phase::CopyFar => "Copy Far",
        }
    }

    /// The name used by the corruption hook (`create`, `read`, `copy-near`, `copy-far`).
    pub fn key(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Read => "read",
            Phase::CopyNear => "copy-near",
            Phase::CopyFar => "copy-far",
        }
    }

    pub fn from_key(key: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.key() == key)
    }
}

/// One file of a set as planned: where it goes, how big, its content seed.
#[derive(Clone, Debug)]
pub struct PlannedFile {
    pub relative: PathBuf,
    pub size: u64,
    pub seed: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(state: &mut u64) -> f64 {
    (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64
}

impl FileSet {
    /// The files of this set at `scale`, deterministic.
    pub fn plan(&self, scale: f64) -> Vec<PlannedFile> {
        let count = if self.scale_size { self.files } else { ((self.files as f64 * scale).round() as u64).max(1) };
        let mut state = 0x5EED_0000u64 ^ self.name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        (0..count)
            .map(|i| {
                let size = match self.sizes {
                    Sizes::Fixed(s) if self.scale_size => (((s as f64 * scale) as u64) / 4096 * 4096).max(4096),
                    Sizes::Fixed(s) => s,
                    Sizes::Uniform(lo, hi) => lo + ((hi - lo) as f64 * unit(&mut state)) as u64,
                    Sizes::LogUniform(lo, hi) => ((lo as f64).ln() + ((hi as f64).ln() - (lo as f64).ln()) * unit(&mut state)).exp() as u64,
                };
                let mut relative = PathBuf::new();
                let mut dir = i / self.per_dir;
                let mut parts = Vec::new();
                for _ in 0..self.depth {
                    parts.push(dir % self.fanout);
                    dir /= self.fanout;
                }
                for (level, part) in parts.iter().rev().enumerate() {
                    relative.push(format!("d{level}_{part:02}"));
                }
                relative.push(format!("f{i:05}.{}", self.extension));
                PlannedFile { relative, size, seed: splitmix(&mut state) }
            })
            .collect()
    }
}

/// One timed phase of one set.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    pub phase: Phase,
    pub seconds: f64,
    pub mb_per_s: f64,
}

/// One set: its size and its four phases.
#[derive(Clone, Debug, Serialize)]
pub struct SetResult {
    pub name: String,
    pub files: u64,
    pub bytes: u64,
    pub phases: Vec<PhaseResult>,
}

/// Every set's bytes over every set's seconds, per phase.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseTotal {
    pub phase: Phase,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
}

/// A whole run, as written by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct FilesResults {
    pub schema_version: u32,
    pub storc_version: String,
    pub dir: PathBuf,
    pub second_dir: PathBuf,
    pub scale: f64,
    /// MB = 10^6 bytes of file data moved per second (a copy counts each byte once).
    pub units: &'static str,
    pub cache_policy: &'static str,
    pub verified: bool,
    pub sets: Vec<SetResult>,
    pub totals: Vec<PhaseTotal>,
}

pub const CACHE_POLICY: &str = "fsync of every written file at the end of each write phase (timed), then posix_fadvise(DONTNEED) \
on every file after it is written or read; directory metadata may stay cached";

/// What to run.
pub struct FilesConfig {
    pub dir: PathBuf,
    /// Copy Far's destination; `None`: a sibling of the work directory inside `dir`.
    pub second_dir: Option<PathBuf>,
    pub scale: f64,
    pub keep: bool,
    /// Only these sets (by name, case-insensitive); empty: all.
    pub sets: Vec<String>,
}

/// Called after each phase's timed part, before it is verified, with the phase, the set and the
/// files that phase produced (or, for Read, the files it read). Tests use it to corrupt a file.
pub type Hook<'a> = &'a dyn Fn(Phase, &str, &[PathBuf]);

/// Checks the arguments: `dir` exists and is a directory, `second_dir` (if given) exists, is a
/// directory and is not inside `dir` (or `dir` itself), and `scale` is a finite number > 0.
pub fn check_config(config: &FilesConfig) -> Result<(PathBuf, Option<PathBuf>), String> {
    if !(config.scale.is_finite() && config.scale > 0.0) {
        return Err(format!("--scale must be a number greater than 0 (got {})", config.scale));
    }
    let dir = canonical_dir(&config.dir, "--dir")?;
    let second = match &config.second_dir {
        None => None,
        Some(s) => {
            let second = canonical_dir(s, "--second-dir")?;
            if second.starts_with(&dir) {
                return Err(format!(
                    "--second-dir {} is inside --dir {}: Copy Far must go to another directory tree",
                    second.display(),
                    dir.display()
                ));
            }
            Some(second)
        }
    };
    for wanted in &config.sets {
        if !FILE_SETS.iter().any(|s| s.name.eq_ignore_ascii_case(wanted)) {
            let names: Vec<_> = FILE_SETS.iter().map(|s| s.name).collect();
            return Err(format!("unknown file set {wanted:?} (the sets: {})", names.join(", ")));
        }
    }
    Ok((dir, second))
}

fn canonical_dir(path: &Path, flag: &str) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("{flag} {} is not a directory", path.display()));
    }
    std::fs::canonicalize(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

fn mbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e6 / seconds
    } else {
        0.0
    }
}

/// Runs every set's four phases. `progress` gets one line per phase. Everything created is
/// removed at the end (also on failure) unless `config.keep`.
pub fn run(config: &FilesConfig, hook: Option<Hook>, progress: &mut dyn FnMut(&str)) -> Result<FilesResults, String> {
    let (dir, second) = check_config(config)?;
    let tag = format!("storc-files-{}", std::process::id());
    let work = dir.join(&tag);
    let (far_root, far_created) = match &second {
        Some(s) => (s.join(&tag), s.join(&tag)),
        None => (dir.join(format!("{tag}-far")), dir.join(format!("{tag}-far"))),
    };
    for d in [&work, &far_root] {
        if d.exists() {
            return Err(format!("{} already exists; not touching it", d.display()));
        }
    }
    let outcome = run_sets(config, hook, progress, &work, &far_root);
    if !config.keep {
        for d in [&work, &far_created] {
            if d.exists() {
                if let Err(e) = std::fs::remove_dir_all(d) {
                    progress(&format!("warning: cannot remove {}: {e}", d.display()));
                }
            }
        }
    } else {
        progress(&format!("kept {} and {}", work.display(), far_root.display()));
    }
    let sets = outcome?;
    let totals = Phase::ALL
        .into_iter()
        .map(|phase| {
            let (bytes, seconds) = sets.iter().fold((0u64, 0f64), |(b, s), set| {
                let p = set.phases.iter().find(|p| p.phase == phase).expect("every phase is run");
                (b + set.bytes, s + p.seconds)
            });
            PhaseTotal { phase, bytes, seconds, mb_per_s: mbps(bytes, seconds) }
        })
        .collect();
    Ok(FilesResults {
        schema_version: FILES_SCHEMA_VERSION,
        storc_version: env!("CARGO_PKG_VERSION").to_string(),
        dir,
        second_dir: second.unwrap_or(far_root),
        scale: config.scale,
        units: "MB/s, MB = 10^6 bytes of file data",
        cache_policy: CACHE_POLICY,
        verified: true,
        sets,
        totals,
    })
}

fn run_sets(
    config: &FilesConfig,
    hook: Option<Hook>,
    progress: &mut dyn FnMut(&str),
    work: &Path,
    far_root: &Path,
) -> Result<Vec<SetResult>, String> {
    let mut buf = vec![0u8; BUF];
    let mut results = Vec::new();
    let selected = FILE_SETS.iter().filter(|s| config.sets.is_empty() || config.sets.iter().any(|w| w.eq_ignore_ascii_case(s.name)));
    for set in selected {
        let files = set.plan(config.scale);
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        let src = work.join("src").join(set.name);
        let near = work.join("near").join(set.name);
        let far = far_root.join(set.name);
        let paths = |root: &Path| files.iter().map(|f| root.join(&f.relative)).collect::<Vec<_>>();
        let mut phases = Vec::new();
        let mut record = |phase: Phase, seconds: f64, progress: &mut dyn FnMut(&str)| {
            let mb = mbps(bytes, seconds);
            progress(&format!(
                "{:<9} {:<9} {:>6} files {:>10.1} MB  {:>8.2} s  {:>9.1} MB/s",
                set.name,
                phase.label(),
                files.len(),
                bytes as f64 / 1e6,
                seconds,
                mb
            ));
            phases.push(PhaseResult { phase, seconds, mb_per_s: mb });
        };

        // Create.
        let start = Instant::now();
        make_dirs(&src, &files)?;
        let mut crcs = Vec::with_capacity(files.len());
        for f in &files {
            crcs.push(write_file(&src.join(&f.relative), f, &mut buf)?);
        }
        sync_and_drop(&src, &files)?;
        record(Phase::Create, start.elapsed().as_secs_f64(), progress);
        if let Some(h) = hook {
            h(Phase::Create, set.name, &paths(&src));
        }

        // Read (verified as read).
        let start = Instant::now();
        let mut read_back = Vec::with_capacity(files.len());
        for f in &files {
            read_back.push(read_file(&src.join(&f.relative), &mut buf)?);
        }
        record(Phase::Read, start.elapsed().as_secs_f64(), progress);
        if let Some(h) = hook {
            h(Phase::Read, set.name, &paths(&src));
        }
        for ((f, &want), &(got, len)) in files.iter().zip(&crcs).zip(&read_back) {
            if got != want || len != f.size {
                return Err(format!(
                    "VERIFY FAILED in Read of {}: {} read back wrong (crc32c {got:08x}, {len} bytes; written {want:08x}, {} bytes)",
                    set.name,
                    src.join(&f.relative).display(),
                    f.size
                ));
            }
        }

        // Copy Near, Copy Far: the same copy to two destinations.
        for (phase, dest) in [(Phase::CopyNear, &near), (Phase::CopyFar, &far)] {
            let start = Instant::now();
            make_dirs(dest, &files)?;
            for f in &files {
                copy_file(&src.join(&f.relative), &dest.join(&f.relative), &mut buf)?;
            }
            sync_and_drop(dest, &files)?;
            record(phase, start.elapsed().as_secs_f64(), progress);
            if let Some(h) = hook {
                h(phase, set.name, &paths(dest));
            }
            verify(dest, &files, &crcs, phase, set.name, &mut buf)?;
        }

        // Free the space before the next set.
        if !config.keep {
            for d in [&src, &near, &far] {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        results.push(SetResult { name: set.name.to_string(), files: files.len() as u64, bytes, phases });
    }
    Ok(results)
}

#[cfg(test)]
mod tests;
