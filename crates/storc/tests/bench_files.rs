//! `storc bench files` as a person runs it: the real binary at a tiny scale in /var/tmp.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

fn storc(args: &[&str], env: Option<(&str, &str)>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_storc"));
    cmd.args(args);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run storc")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir =
        PathBuf::from("/var/tmp").join(format!("storc-bench-files-{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn files_every_phase_runs_verified_and_cleaned_up() {
    let dir = scratch("run");
    let far = scratch("far");
    let json = scratch("json").join("r.json");
    let out = storc(&["bench", "files", "--dir", s(&dir), "--second-dir", s(&far), "--scale", "0.002", "--json", s(&json)], None);
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    for word in ["ISO", "MP3", "Install", "Windows", "Programs", "Total", "Create", "Read", "Copy Near", "Copy Far"] {
        assert!(stdout.contains(word), "{word} missing from\n{stdout}");
    }
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results["sets"].as_array().unwrap().len(), 5);
    assert_eq!(results["verified"], true);
    for set in results["sets"].as_array().unwrap() {
        let phases: Vec<_> = set["phases"].as_array().unwrap().iter().map(|p| p["phase"].as_str().unwrap().to_string()).collect();
        assert_eq!(phases, ["Create", "Read", "CopyNear", "CopyFar"]);
        assert!(set["phases"].as_array().unwrap().iter().all(|p| p["mb_per_s"].as_f64().unwrap() > 0.0));
    }
    assert!(empty(&dir) && empty(&far), "files left behind");
    for d in [&dir, &far, &json.parent().unwrap().to_path_buf()] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn files_keep_leaves_the_files_and_default_far_is_a_sibling() {
    let dir = scratch("keep");
    let out = storc(&["bench", "files", "--dir", s(&dir), "--scale", "0.002", "--sets", "mp3", "--keep"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("-far")), "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_a_corrupted_copy_fails_the_run() {
    for (phase, caught) in [("copy-near", "Copy Near"), ("copy-far", "Copy Far"), ("create", "Read")] {
        let dir = scratch("corrupt");
        let out = storc(
            &["bench", "files", "--dir", s(&dir), "--scale", "0.002", "--sets", "Install"],
            Some(("STORC_BENCH_FILES_CORRUPT", phase)),
        );
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{phase}: corrupted run succeeded\n{stderr}");
        assert!(stderr.contains("VERIFY FAILED") && stderr.contains(caught), "{phase}: {stderr}");
        assert!(empty(&dir), "not cleaned up after a failure");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn files_bad_arguments_are_clear() {
    let dir = scratch("args");
    let inside = dir.join("inside");
    std::fs::create_dir(&inside).unwrap();
    let missing = dir.join("missing");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["--dir", s(&missing)], "--dir"),
        (vec!["--dir", s(&dir), "--second-dir", s(&inside)], "inside --dir"),
        (vec!["--dir", s(&dir), "--scale", "0"], "--scale must be a number greater than 0"),
        (vec!["--dir", s(&dir), "--scale", "-2"], "--scale must be a number greater than 0"),
        (vec!["--dir", s(&dir), "--sets", "floppy"], "unknown file set"),
    ];
    for (args, want) in cases {
        let mut all = vec!["bench", "files"];
        all.extend(args.iter().copied());
        let out = storc(&all, None);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    let out = storc(&["bench", "files"], None);
    assert!(!out.status.success() && text(&out.stderr).contains("--dir"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "a refused run created files");
    std::fs::remove_dir_all(&dir).unwrap();
}
