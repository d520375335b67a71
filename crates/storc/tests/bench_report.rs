//! `storc bench suite ... --html` and `storc bench report`: a real quick run of the review suite
//! through the binary, the report checked for being self-contained and for every chart, then
//! opened in a real headless browser (Debian's chromium: `apt-get install -y chromium`; a missing
//! chromium fails the test, it never skips) that must render every chart's SVG.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn storc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_storc")).args(args).output().expect("cannot run storc")
}

fn ok(output: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{what} failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// A test's directory, removed when the test passes; kept, with the reports and screenshots in
/// it, when the test fails.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch_dir(name: &str) -> ScratchDir {
    let dir = std::env::temp_dir().join(format!("storc-bench-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ScratchDir(dir)
}

/// The charts a quick review-suite run must have (ratings need all six QDs 1..32, which
/// --quick does not measure).
const REVIEW_CHARTS: &[&str] = &[
    "chart-review-database-1",
    "chart-review-sequential-read-1",
    "chart-review-sequential-write-1",
    "chart-review-random-read-1",
    "chart-review-random-write-1",
    "chart-review-response-time-1",
    "chart-review-multithreaded-read-1",
    "chart-review-multithreaded-write-1",
    "chart-file-server-1",
    "chart-web-server-1",
    "chart-workstation-1",
    "chart-rating-1",
];

fn check_self_contained(html: &str, what: &str) {
    let lower = html.to_ascii_lowercase();
    for forbidden in ["http://", "https://", " src=", "<script", "<link", "@import", "url("] {
        assert!(!lower.contains(forbidden), "{what} is not self-contained: it contains {forbidden:?}");
    }
    assert!(lower.starts_with("<!doctype html>"), "{what} is not an HTML document");
}

fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).flat_map(|dir| [dir.join("chromium"), dir.join("chromium-browser")]).find(|p| p.is_file())
    });
    found.expect(
        "chromium is not installed, and this test renders the report in a real browser; install it with `apt-get install -y chromium`",
    )
}

fn browser(page: &Path, profile: &Path, extra: &[&str]) -> Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("cannot run chromium")
}

#[test]
fn a_quick_review_run_makes_a_self_contained_report_that_a_browser_renders() {
    // The target: a RAID5 of eight emulated 15,000 rpm drives, in process (about 20 s
    // with --quick; the full-length suite takes about 11 minutes).
    const TARGET: &str = "vd:r5:8xhdd:15k:600GiB:strip=64";
    let dir = scratch_dir("review");
    let json = dir.join("a.json");
    let run_html = dir.join("run.html");
    let a = json.to_str().unwrap();
    ok(
        storc(&["bench", "suite", "review", "--target", TARGET, "--quick", "--json", a, "--html", run_html.to_str().unwrap()]),
        "storc bench suite review",
    );
    let other = dir.join("b.json");
    ok(
        storc(&["bench", "run", "review-database", "--target", "vd:r10:8xhdd:15k:600GiB", "--quick", "--json", other.to_str().unwrap()]),
        "storc bench run review-database",
    );
    let report = dir.join("report.html");
    let stdout =
        ok(storc(&["bench", "report", a, "--compare", other.to_str().unwrap(), "--html", report.to_str().unwrap()]), "storc bench report");
    assert!(stdout.contains("report.html"), "{stdout}");

    for (path, what) in [(&run_html, "suite --html"), (&report, "bench report")] {
        let html = std::fs::read_to_string(path).unwrap();
        check_self_contained(&html, what);
        for id in REVIEW_CHARTS {
            assert!(html.contains(&format!("<svg id=\"{id}\"")), "{what}: chart {id} is missing");
        }
        // What was measured.
        for needle in ["RAID5", "storc version", "machine", "policies", TARGET, "Seagate Cheetah 15K.7"] {
            assert!(html.contains(needle), "{what}: the header lacks {needle:?}");
        }
    }
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("id=\"compare-table\""), "the --compare ratio table is missing");
    // review-database is in both runs: its 9 quick points appear as ratio rows.
    let ratio_rows = html.split("id=\"compare-table\"").nth(1).unwrap().split("</table>").next().unwrap().matches("<tr><td").count();
    assert_eq!(ratio_rows, 9, "one ratio row per review-database point measured in both runs");
    assert!(!run_html.exists() || !std::fs::read_to_string(&run_html).unwrap().contains("compare-table"));

    // A real browser renders every chart.
    let profile = dir.join("profile");
    let dom = browser(&report, &profile, &["--dump-dom"]);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success() && dom_text.contains("</html>"), "chromium --dump-dom failed: {}", String::from_utf8_lossy(&dom.stderr));
    for id in REVIEW_CHARTS {
        let start = dom_text.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("chart {id} is not in the rendered DOM"));
        let svg = &dom_text[start..start + dom_text[start..].find("</svg>").expect("an svg element is closed")];
        assert!(svg.contains("class=\"series\""), "chart {id} rendered without data");
    }
    let png = dir.join("report.png");
    let shot = browser(&report, &dir.join("profile2"), &[&format!("--screenshot={}", png.display())]);
    assert!(shot.status.success(), "chromium --screenshot failed: {}", String::from_utf8_lossy(&shot.stderr));
    let bytes = std::fs::read(&png).expect("chromium wrote no screenshot");
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "the screenshot is not a rendered page");
}

#[test]
fn report_rejects_a_file_that_is_not_results() {
    let dir = scratch_dir("bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"hello\": 1}").unwrap();
    let out = storc(&["bench", "report", bad.to_str().unwrap(), "--html", dir.join("o.html").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a storc bench results document"));
}
