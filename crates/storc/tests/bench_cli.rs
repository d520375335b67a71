//! `storc bench list`, `run` and `suite` as a person runs them: the real binary, a VD built in
//! its process, and nbdkit as an NBD server (`apt-get install -y nbdkit`; a missing nbdkit fails
//! the test, it never skips).

use nbd::testing::Nbdkit;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

fn storc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_storc")).args(args).output().expect("cannot run storc")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn scratch_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir =
        std::env::temp_dir().join(format!("storc-bench-cli-{name}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn list_shows_every_pattern_with_its_definition() {
    let output = storc(&["bench", "list"]);
    assert!(output.status.success());
    let listing = text(&output.stdout);
    for name in ["file-server", "review-database", "rating", "os-drive", "hba-throughput", "software-raid-matrix"] {
        assert!(listing.contains(&format!("{name}  (")), "storc bench list lacks {name}");
    }
    assert!(listing.contains("write share 0% to 100% in steps of 10"));
    let output = storc(&["bench", "list", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let review = json["suites"].as_array().unwrap().iter().find(|s| s["name"] == "review").unwrap();
    assert_eq!(review["point_count"], 243);
}

#[test]
fn help_documents_the_target_syntax() {
    let output = storc(&["bench", "--help"]);
    let help = text(&output.stdout);
    assert!(help.contains("vd:LEVEL:COUNTxDRIVE"), "{help}");
    assert!(help.contains("nbd+unix:///EXPORT?socket=PATH"), "{help}");
}

#[test]
fn a_wrong_target_or_pattern_is_named_in_the_error() {
    let output = storc(&["bench", "run", "review-database", "--target", "vd:r5:8xtape:1GiB"]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("unknown drive \"tape:1GiB\"") && stderr.contains("vd:LEVEL:COUNTxDRIVE"), "{stderr}");
    let output = storc(&["bench", "run", "no-such-pattern", "--target", "vd:r0:2xmem:64MiB"]);
    assert!(text(&output.stderr).contains("unknown pattern \"no-such-pattern\"; allowed: file-server"), "{}", text(&output.stderr));
}

#[test]
fn a_verified_run_on_an_in_process_vd_passes_and_writes_json_and_csv() {
    let dir = scratch_dir("vd");
    let (json, csv) = (dir.join("results.json"), dir.join("results.csv"));
    let output = storc(&[
        "bench",
        "run",
        "review-database",
        "--target",
        "vd:r5:4xmem:64MiB",
        "--quick",
        "--verify",
        "--duration",
        "0.1",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}\n{}", text(&output.stdout), text(&output.stderr));
    assert!(text(&output.stdout).contains("== review-database"), "a table per pattern");
    let results = read_json(&json);
    assert_eq!(results["target"]["level"], "RAID5");
    assert_eq!(results["target"]["drive_count"], 4);
    assert!(results["machine"]["cores"].as_u64().unwrap() >= 1);
    let points = results["patterns"][0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 9);
    for point in points {
        assert_eq!(point["verify"]["mismatched_sectors"], 0, "a point read back what it did not write: {point}");
        assert!(point["iops"].as_f64().unwrap() > 0.0, "a point completed no I/O: {point}");
    }
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 10);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_target_that_loses_writes_fails_the_run_loudly() {
    // nbdkit's null plugin takes every write and reads back zeros.
    let nbdkit = Nbdkit::start(&["null", "size=256M"]);
    let output = storc(&["bench", "run", "file-server", "--target", &nbdkit.uri(), "--quick", "--verify", "--duration", "0.1"]);
    assert!(!output.status.success(), "mismatches must fail the run");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("VERIFY FAILED"), "{stderr}");
    assert!(stderr.contains("no header (all zeros)"), "the first offsets are shown: {stderr}");
}

#[test]
fn a_suite_runs_every_pattern_against_nbdkit() {
    let nbdkit = Nbdkit::start(&["memory", "size=1G"]);
    let dir = scratch_dir("suite");
    let json = dir.join("hba.json");
    let output = storc(&["bench", "suite", "hba", "--target", &nbdkit.uri(), "--quick", "--verify", "--json", json.to_str().unwrap()]);
    assert!(output.status.success(), "{}\n{}", text(&output.stdout), text(&output.stderr));
    let results = read_json(&json);
    assert_eq!(results["suite"], "hba");
    assert_eq!(results["target"]["kind"], "nbd");
    let names: Vec<&str> = results["patterns"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["hba-iops", "hba-throughput"]);
    for pattern in results["patterns"].as_array().unwrap() {
        assert_eq!(pattern["points"][0]["workers"], 8);
        assert!(pattern["points"][0]["ops"].as_u64().unwrap() > 0);
    }
    let _ = std::fs::remove_dir_all(dir);
}
