use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = PathBuf::from("/var/tmp").join(format!("storc-files-unit-{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(dir: &Path, second: Option<&Path>) -> FilesConfig {
    FilesConfig { dir: dir.to_path_buf(), second_dir: second.map(Path::to_path_buf), scale: 0.002, keep: false, sets: vec![] }
}

#[test]
fn files_plan_is_deterministic_and_scales() {
    for set in &FILE_SETS {
        let a = set.plan(1.0);
        let b = set.plan(1.0);
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.size == y.size && x.seed == y.seed && x.relative == y.relative));
        assert_eq!(a.len() as u64, set.files);
        assert!(!set.plan(1e-6).is_empty());
    }
    assert_eq!(FILE_SETS[0].plan(0.5)[0].size, 320 * MIB);
    assert_eq!(FILE_SETS[0].plan(1e-9)[0].size, 4096);
    // Windows is a deep tree.
    assert_eq!(FILE_SETS[3].plan(1.0)[4999].relative.components().count(), 6);
}

#[test]
fn files_run_all_phases_verify_and_clean_up() {
    let dir = scratch("run");
    let second = scratch("far");
    let mut lines = Vec::new();
    let results = run(&config(&dir, Some(&second)), None, &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(results.sets.len(), 5);
    for set in &results.sets {
        assert_eq!(set.phases.iter().map(|p| p.phase).collect::<Vec<_>>(), Phase::ALL.to_vec());
        assert!(set.bytes > 0 && set.files > 0);
    }
    assert_eq!(lines.len(), 20);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "work directory left behind");
    assert_eq!(std::fs::read_dir(&second).unwrap().count(), 0, "far copy left behind");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&second).unwrap();
}

#[test]
fn files_corrupted_copy_fails_the_run() {
    // Corrupting the source after Create is caught by Read; a copy, by that copy's check.
    for (phase, caught_in) in [(Phase::Create, Phase::Read), (Phase::CopyNear, Phase::CopyNear), (Phase::CopyFar, Phase::CopyFar)] {
        let dir = scratch("corrupt");
        let corrupt = move |p: Phase, set: &str, files: &[PathBuf]| {
            if p == phase && set == "MP3" {
                let mut bytes = std::fs::read(&files[0]).unwrap();
                bytes[100] ^= 0xff;
                std::fs::write(&files[0], bytes).unwrap();
            }
        };
        let err = run(&config(&dir, None), Some(&corrupt), &mut |_| {}).unwrap_err();
        assert!(err.contains("VERIFY FAILED") && err.contains("MP3") && err.contains(caught_in.label()), "{phase:?}: {err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "not cleaned up after a failure");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn files_bad_arguments_are_refused() {
    let dir = scratch("args");
    let missing = dir.join("missing");
    assert!(check_config(&config(&missing, None)).unwrap_err().contains("--dir"));
    let inside = dir.join("inside");
    std::fs::create_dir(&inside).unwrap();
    assert!(check_config(&config(&dir, Some(&inside))).unwrap_err().contains("inside --dir"));
    assert!(check_config(&config(&dir, Some(&dir))).unwrap_err().contains("inside --dir"));
    for scale in [0.0, -1.0, f64::NAN] {
        let mut c = config(&dir, None);
        c.scale = scale;
        assert!(check_config(&c).unwrap_err().contains("--scale"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
