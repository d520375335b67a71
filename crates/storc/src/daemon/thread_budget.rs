//! How many more threads this process may start, and which limit says so: the smallest room
//! among the limits the kernel checks when it creates a thread (`copy_process` in
//! kernel/fork.c): the pids cgroup of the process and of each cgroup above it (a systemd
//! unit's `TasksMax`, by default 15 % of pid_max: 4,915 where pid_max is 32,768), the real
//! user's `RLIMIT_NPROC` (`ulimit -u`; root is exempt), and the system's `threads-max` and
//! `pid_max`. An NBD connection holds `--nbd-readers` + 1 threads (17 by default, 4,352 at the
//! default 256 connections), so the daemon sizes its connection limit by this room as it does
//! by descriptors, instead of finding out when a connection's threads cannot be spawned.
//!
//! Read once at start, from /proc and /sys (no crate reads cgroup pid limits across v1 and
//! v2 without pulling in far more than this): other processes may take some of the room later,
//! and then a connection runs with fewer readers, with a warning, or is refused.

use std::path::{Path, PathBuf};

/// Room for more threads under one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRoom {
    /// Threads that may still be created under this limit.
    pub threads: u64,
    /// The limit, for messages: `the pids cgroup /system.slice/storc.service (pids.max 4915, 12 in use)`.
    pub limit: String,
    /// How to raise it.
    pub remedy: &'static str,
}

/// The tightest room among the limits that could be read; `None` if none could.
pub fn thread_room() -> Option<ThreadRoom> {
    [cgroup_room(), user_room(), system_room()].into_iter().flatten().min_by_key(|room| room.threads)
}

// ---- The pids cgroup ---------------------------------------------------------------------------

/// The room the pids controller leaves, in cgroup v2 or v1, whichever holds it.
fn cgroup_room() -> Option<ThreadRoom> {
    let memberships = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    pids_cgroup_dirs(&memberships, &mountinfo).into_iter().filter_map(|dir| room_up_from(&dir)).min_by_key(|room| room.threads)
}

/// A cgroup of this process under a hierarchy that has the pids controller.
#[derive(Debug, PartialEq, Eq)]
struct CgroupDir {
    /// Where the hierarchy is mounted.
    mount_point: PathBuf,
    /// The cgroup's path inside that mount, without its leading `/`.
    relative: PathBuf,
}

/// The process's cgroups that may hold a pids limit: the v2 one, and the v1 one of a `pids`
/// hierarchy (`memberships` is /proc/self/cgroup, `mountinfo` /proc/self/mountinfo).
fn pids_cgroup_dirs(memberships: &str, mountinfo: &str) -> Vec<CgroupDir> {
    let mounts: Vec<CgroupMount> = mountinfo.lines().filter_map(parse_cgroup_mount).collect();
    let mut dirs = Vec::new();
    for line in memberships.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let is_v2 = controllers.is_empty();
        let is_v1_pids = controllers.split(',').any(|controller| controller == "pids");
        let Some(mount) = mounts.iter().find(|mount| if is_v2 { mount.is_v2 } else { is_v1_pids && mount.has_pids }) else {
            continue;
        };
        // A mount of a subtree (a container's) names paths below its root.
        let relative = Path::new(path).strip_prefix(&mount.root).unwrap_or(Path::new(path));
        let relative = relative.strip_prefix("/").unwrap_or(relative).to_path_buf();
        dirs.push(CgroupDir { mount_point: mount.mount_point.clone(), relative });
    }
    dirs
}

struct CgroupMount {
    root: PathBuf,
    mount_point: PathBuf,
    is_v2: bool,
    has_pids: bool,
}

/// A mountinfo line (`36 25 0:31 / /sys/fs/cgroup/pids rw,... shared:9 - cgroup cgroup rw,pids`)
/// if it mounts a cgroup hierarchy.
fn parse_cgroup_mount(line: &str) -> Option<CgroupMount> {
    let (mount_fields, fs_fields) = line.split_once(" - ")?;
    let mount_fields: Vec<&str> = mount_fields.split(' ').collect();
    let fs_fields: Vec<&str> = fs_fields.split(' ').collect();
    let (root, mount_point) = (mount_fields.get(3)?, mount_fields.get(4)?);
    let (fs_type, super_options) = (*fs_fields.first()?, fs_fields.get(2).copied().unwrap_or(""));
    let is_v2 = fs_type == "cgroup2";
    let has_pids = fs_type == "cgroup" && super_options.split(',').any(|option| option == "pids");
    (is_v2 || has_pids).then(|| CgroupMount { root: PathBuf::from(root), mount_point: PathBuf::from(mount_point), is_v2, has_pids })
}

/// The least room left by `pids.max` in the cgroup and each one above it up to the mount:
/// a cgroup's limit holds for everything below it.
fn room_up_from(dir: &CgroupDir) -> Option<ThreadRoom> {
    let mut tightest: Option<ThreadRoom> = None;
    let mut relative = Some(dir.relative.as_path());
    while let Some(level) = relative {
        let level_dir = dir.mount_point.join(level);
        if let Some(room) = pids_room(&level_dir, &format!("/{}", level.display())) {
            if tightest.as_ref().is_none_or(|tight| room.threads < tight.threads) {
                tightest = Some(room);
            }
        }
        relative = level.parent();
    }
    tightest
}

/// `pids.max` less `pids.current` in one cgroup directory, if it has a number for a limit.
fn pids_room(level_dir: &Path, level_name: &str) -> Option<ThreadRoom> {
    let max = read_number(&level_dir.join("pids.max"))?; // "max" (no limit) does not parse
    let current = read_number(&level_dir.join("pids.current")).unwrap_or(0);
    Some(ThreadRoom {
        threads: max.saturating_sub(current),
        limit: format!("the pids cgroup {level_name} (pids.max {max}, {current} in use)"),
        remedy: "raise the cgroup's pids.max (TasksMax= for a systemd unit)",
    })
}

// ---- The user's process limit ------------------------------------------------------------------

/// `RLIMIT_NPROC` counts every thread of the real user, in every process; root is exempt.
fn user_room() -> Option<ThreadRoom> {
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return None;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we pass, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let in_use = threads_of_user(uid);
    Some(ThreadRoom {
        threads: limit.rlim_cur.saturating_sub(in_use),
        limit: format!("the user's process limit (ulimit -u {}, {in_use} threads of uid {uid} running)", limit.rlim_cur),
        remedy: "raise ulimit -u (LimitNPROC= for a systemd unit)",
    })
}

/// Threads whose real user is `uid`, in every process /proc shows.
fn threads_of_user(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.bytes().all(|byte| byte.is_ascii_digit())))
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("status")).ok())
        .filter_map(|status| threads_if_owned(&status, uid))
        .sum()
}

/// The `Threads:` of a /proc/PID/status whose real uid (the first of `Uid:`) is `uid`.
fn threads_if_owned(status: &str, uid: u32) -> Option<u64> {
    let field = |name: &str| status.lines().find_map(|line| line.strip_prefix(name)).map(str::trim);
    let real_uid: u32 = field("Uid:")?.split_whitespace().next()?.parse().ok()?;
    (real_uid == uid).then(|| field("Threads:")?.parse().ok())?
}

// ---- The system --------------------------------------------------------------------------------

/// The system's thread and pid limits, less every thread running (/proc/loadavg's count).
fn system_room() -> Option<ThreadRoom> {
    let running = running_threads(&std::fs::read_to_string("/proc/loadavg").ok()?)?;
    [("threads-max", "/proc/sys/kernel/threads-max"), ("pid_max", "/proc/sys/kernel/pid_max")]
        .into_iter()
        .filter_map(|(name, path)| {
            let max = read_number(Path::new(path))?;
            Some(ThreadRoom {
                threads: max.saturating_sub(running),
                limit: format!("the system's {name} ({max}, {running} threads running)"),
                remedy: "raise the sysctls kernel.threads-max and kernel.pid_max",
            })
        })
        .min_by_key(|room| room.threads)
}

/// Threads on the system, from /proc/loadavg (`0.62 1.84 2.05 3/245 12345`: running/total).
fn running_threads(loadavg: &str) -> Option<u64> {
    loadavg.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_V1: &str = "\
25 30 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
33 25 0:29 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids
34 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 25 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_and_v2_memberships_find_their_mounts() {
        let memberships = "8:pids:/system.slice/storc.service\n4:memory:/other\n0::/system.slice/storc.service\n";
        let dirs = pids_cgroup_dirs(memberships, MOUNTINFO_V1);
        assert_eq!(
            dirs,
            vec![
                CgroupDir { mount_point: "/sys/fs/cgroup/pids".into(), relative: "system.slice/storc.service".into() },
                CgroupDir { mount_point: "/sys/fs/cgroup/unified".into(), relative: "system.slice/storc.service".into() },
            ]
        );
    }

    #[test]
    fn a_mounted_subtree_names_paths_below_its_root() {
        let mountinfo = "40 30 0:35 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let dirs = pids_cgroup_dirs("0::/docker/abc/worker\n", mountinfo);
        assert_eq!(dirs[0].mount_point, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(dirs[0].relative, PathBuf::from("worker"));
    }

    #[test]
    fn a_hierarchy_without_pids_is_not_a_limit() {
        assert!(pids_cgroup_dirs("4:memory:/x\n", MOUNTINFO_V1).is_empty());
    }

    /// A cgroup tree in a temporary directory: the tightest level wins, `max` is no limit.
    #[test]
    fn the_tightest_level_up_the_tree_is_the_room() {
        let root = std::env::temp_dir().join(format!("storc-thread-budget-{}", std::process::id()));
        let unit = root.join("system.slice/storc.service");
        std::fs::create_dir_all(&unit).unwrap();
        let write = |dir: &Path, max: &str, current: &str| {
            std::fs::write(dir.join("pids.max"), max).unwrap();
            std::fs::write(dir.join("pids.current"), current).unwrap();
        };
        write(&unit, "max\n", "12\n");
        write(&root.join("system.slice"), "500\n", "450\n");
        let dir = CgroupDir { mount_point: root.clone(), relative: "system.slice/storc.service".into() };
        let room = room_up_from(&dir).unwrap();
        assert_eq!(room.threads, 50);
        assert_eq!(room.limit, "the pids cgroup /system.slice (pids.max 500, 450 in use)");
        write(&unit, "4915\n", "4900\n");
        assert_eq!(room_up_from(&dir).unwrap().threads, 15);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn status_lines_count_only_the_users_threads() {
        let status = "Name:\tstorc\nUid:\t1000\t1000\t1000\t1000\nThreads:\t17\n";
        assert_eq!(threads_if_owned(status, 1000), Some(17));
        assert_eq!(threads_if_owned(status, 0), None);
    }

    #[test]
    fn loadavg_gives_the_threads_running() {
        assert_eq!(running_threads("0.62 1.84 2.05 3/245 12345\n"), Some(245));
        assert_eq!(running_threads("garbage"), None);
    }

    #[test]
    fn this_machine_has_some_room() {
        let room = thread_room().expect("/proc/sys/kernel/threads-max is always there");
        assert!(room.threads > 0, "{room:?}");
    }
}
