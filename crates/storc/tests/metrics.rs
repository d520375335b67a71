//! Issue 14, part 1: `GET /metrics` against the real daemon. Every scrape passes Prometheus' own
//! `promtool check metrics` (format and naming lint), and the series move as a user would see
//! them move: NBD writes and reads count requests, bytes and latencies; a member set offline
//! with a hot spare present shows the VD degraded, the spare rebuilding (paused, resumed) and
//! the VD optimal again; a consistency check shows while it runs and is gone when it ends.

mod common;

use common::api_types::SetController;
use common::{busy_reader, export_difference, nbdcopy_in, write_random_image, Daemon, DaemonOptions, Scratch, MIB};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const DRIVE_BYTES: u64 = 64 * MIB;
const SPARE_SLOT: u32 = 8;
const OFFLINE_SLOT: u32 = 3;
/// For a background operation to show, or to end at full rate.
const WAIT_TIMEOUT: Duration = Duration::from_secs(120);

/// One scrape: each series (name and labels, as `name{a="x",b="y"}` with the labels sorted) and
/// its value.
struct Scrape {
    text: String,
    series: BTreeMap<String, f64>,
}

impl Scrape {
    fn parse(text: String) -> Scrape {
        let series = text.lines().filter(|line| !line.starts_with('#') && !line.is_empty()).map(parse_sample).collect();
        Scrape { text, series }
    }

    /// The value of `name{labels}`; `labels` in any order.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.series.get(&series_key(name, labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())).copied()
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or_else(|| panic!("no series {name}{labels:?} in the scrape:\n{}", self.text))
    }
}

fn series_key(name: &str, mut labels: Vec<(String, String)>) -> String {
    labels.sort();
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// `name{a="x",...} value` or `name value`; label values may hold escaped quotes.
fn parse_sample(line: &str) -> (String, f64) {
    let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
    let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
    let Some((name, rest)) = series.split_once('{') else { return (series_key(series, Vec::new()), value) };
    let mut labels = Vec::new();
    let mut chars = rest.trim_end_matches('}').chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "label {key} of {line:?}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(chars.next().expect("an escaped character")),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_string(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    (series_key(name, labels), value)
}

fn scrape(daemon: &Daemon) -> Scrape {
    let reply = common::http(&daemon.api_socket(), "GET", "/metrics", None).expect("GET /metrics");
    assert_eq!(reply.status, 200, "GET /metrics: {}", reply.body);
    Scrape::parse(reply.body)
}

/// `promtool check metrics` prints nothing and exits 0, or the test fails with what it said.
fn promtool_accepts(scrape: &Scrape, when: &str) {
    nbd::testing::require_tool("promtool", "prometheus", "checks the exposition format with Prometheus' own linter");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().expect("piped stdin").write_all(scrape.text.as_bytes()).expect("feed promtool");
    let output = child.wait_with_output().expect("promtool status");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && said.trim().is_empty(), "{when}: promtool check metrics: {}\n{said}", output.status);
}

/// Polls the metrics until `ready` holds; the last scrape.
fn scrape_until(daemon: &Daemon, what: &str, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + WAIT_TIMEOUT;
    loop {
        let scrape = scrape(daemon);
        if ready(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{what}: not seen in the metrics within {WAIT_TIMEOUT:?}:\n{}", scrape.text);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn set_rates(daemon: &Daemon, percent: u8) {
    let body = SetController { rebuild_rate_percent: Some(percent), cc_rate_percent: Some(percent), ..SetController::default() };
    daemon.api("PATCH", "/api/v1/controller", Some(&body)).expect::<serde_json::Value>(200, "set the rates");
}

fn rebuild_action(daemon: &Daemon, action: &str) {
    let body = serde_json::json!({ "action": action });
    daemon.api("POST", &format!("/api/v1/drives/{SPARE_SLOT}/rebuild"), Some(&body)).expect::<serde_json::Value>(200, action);
}

const VD: (&str, &str) = ("vd", "0");
const REBUILD: [(&str, &str); 3] = [("kind", "rebuild"), ("vd", "0"), ("slot", "8")];
const CC: [(&str, &str); 2] = [("kind", "cc"), ("vd", "0")];

#[test]
fn metrics_pass_promtool_and_move_with_io_a_rebuild_and_a_consistency_check() {
    common::require_tool("nbdcopy", "libnbd-bin");
    let scratch = Scratch::new("metrics");
    let drives: Vec<String> =
        (0..=SPARE_SLOT).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let options = DaemonOptions { api_tcp: true, extra_args: vec!["--metrics-any-user".into()], ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &drives, &options);
    let vd = daemon.create_vd("r5", &(0..8).collect::<Vec<_>>(), "db");
    daemon.cli(&["/c0/s8", "add", "hotsparedrive"]);

    let idle = scrape(&daemon);
    promtool_accepts(&idle, "idle");
    assert_eq!(idle.value("storc_vd_state", &[VD, ("state", "Optl")]), 1.0);
    assert_eq!(idle.value("storc_drive_state", &[("slot", "8"), ("state", "GHS")]), 1.0);
    assert_eq!(idle.value("storc_vd_io_operations_total", &[VD, ("op", "write")]), 0.0);
    assert_eq!(idle.value("storc_background_operations", &[("kind", "rebuild")]), 0.0);
    assert_eq!(idle.value("storc_controller_needs_attention", &[]), 0.0);
    let info = idle.text.lines().find(|l| l.starts_with("storc_vd_info{")).expect("storc_vd_info");
    assert!(info.contains("name=\"db\"") && info.contains("level=\"RAID5\""), "{info}");

    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 41);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    let written = scrape(&daemon);
    io_moved(&idle, &written, "write", vd.size_bytes);
    assert!(export_difference(&daemon.unix_uri("db"), &image, vd.size_bytes).is_none(), "the image reads back");
    let read = scrape(&daemon);
    io_moved(&written, &read, "read", vd.size_bytes);
    assert!(read.value("storc_nbd_connections_accepted_total", &[]) >= 2.0, "nbdcopy in and out connected");
    let (replies, reply_writes) = (read.value("storc_nbd_replies_sent_total", &[]), read.value("storc_nbd_reply_writes_total", &[]));
    // nbdcopy's replies are large: each may take several writes, so no ratio is promised here
    // (nbd's corked_replies test shows a burst of small ones going out in one).
    assert!(replies > 0.0 && reply_writes > 0.0, "{replies} replies in {reply_writes} socket writes");
    // Each outcome of the connections' measurements of how to take turns is exported (what
    // decides between them is nbd's round_trips tests).
    for choice in ["hand_over", "keep", "too_few_round_trips"] {
        let count = read.value("storc_nbd_turn_choices_total", &[("choice", choice)]);
        assert!(count >= 0.0 && count.fract() == 0.0, "{choice}: {count}");
    }
    // One connection that keeps 64 small reads in flight gives too few round trips to time:
    // its measurement ends after 1,024 requests, and the counter shows it.
    let status = Command::new("nbdcopy")
        .args(["--connections=1", "--request-size=4096", "--requests=64", &daemon.unix_uri("db"), "null:"])
        .status()
        .expect("run nbdcopy");
    assert!(status.success(), "nbdcopy to null: {status}");
    let measured = scrape(&daemon);
    let too_few = |scrape: &Scrape| scrape.value("storc_nbd_turn_choices_total", &[("choice", "too_few_round_trips")]);
    assert!(too_few(&measured) > too_few(&read), "a connection with 64 requests in flight ended its measurement:\n{}", measured.text);
    scrape_over_tcp(&daemon, &read);

    set_rates(&daemon, 5);
    let (stop, reader) = busy_reader(&daemon, "db", vd.size_bytes);
    rebuild_shows(&daemon);
    consistency_check_shows(&daemon);
    migration_shows(&daemon);
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("the reader");
    daemon.stop();
}

/// Between two scrapes, `op` requests covering at least `bytes` were counted, with no errors,
/// each in the latency histogram.
fn io_moved(before: &Scrape, after: &Scrape, op: &str, bytes: u64) {
    let labels = [VD, ("op", op)];
    let delta = |name: &str| after.value(name, &labels) - before.value(name, &labels);
    assert!(delta("storc_vd_io_operations_total") > 0.0, "{op}s counted:\n{}", after.text);
    assert!(delta("storc_vd_io_bytes_total") >= bytes as f64, "{op} bytes: {} < {bytes}", delta("storc_vd_io_bytes_total"));
    assert_eq!(after.value("storc_vd_io_errors_total", &labels), 0.0, "{op} errors");
    let count = after.value("storc_vd_io_duration_seconds_count", &labels);
    assert_eq!(count, after.value("storc_vd_io_operations_total", &labels), "every {op} is in the histogram");
    assert_eq!(after.value("storc_vd_io_duration_seconds_bucket", &[VD, ("op", op), ("le", "+Inf")]), count);
    assert!(after.value("storc_vd_io_duration_seconds_sum", &labels) > before.value("storc_vd_io_duration_seconds_sum", &labels));
}

/// The same metrics over the TCP API, as Prometheus scrapes them, with the text format's type.
fn scrape_over_tcp(daemon: &Daemon, unix_scrape: &Scrape) {
    let address = daemon.api_tcp_address();
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the TCP API");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("malformed answer {answer:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4; charset=utf-8"), "{head}");
    let over_tcp = Scrape::parse(body.to_string());
    let written = [VD, ("op", "write")];
    assert_eq!(over_tcp.value("storc_vd_io_bytes_total", &written), unix_scrape.value("storc_vd_io_bytes_total", &written));
}

/// A member set offline with a spare present: the VD degraded, the spare rebuilding (and
/// paused), then everything optimal and no rebuild left.
fn rebuild_shows(daemon: &Daemon) {
    daemon.cli(&[&format!("/c0/s{OFFLINE_SLOT}"), "set", "offline"]);
    let rebuilding = scrape_until(daemon, "a rebuild under way", |s| s.get("storc_background_progress_ratio", &REBUILD).is_some());
    promtool_accepts(&rebuilding, "during the rebuild");
    assert_eq!(rebuilding.value("storc_background_operations", &[("kind", "rebuild")]), 1.0);
    assert_eq!(rebuilding.value("storc_drive_state", &[("slot", "8"), ("state", "Rbld")]), 1.0);
    assert_eq!(rebuilding.value("storc_vd_state", &[VD, ("state", "Dgrd")]), 1.0);
    assert_eq!(rebuilding.value("storc_vd_members", &[VD, ("state", "Rbld")]), 1.0);
    assert_eq!(rebuilding.value("storc_controller_needs_attention", &[]), 1.0);
    assert_eq!(rebuilding.value("storc_background_rate_ratio", &REBUILD), 0.05);
    let progress = rebuilding.value("storc_background_progress_ratio", &REBUILD);
    assert!((0.0..1.0).contains(&progress), "progress {progress}");

    rebuild_action(daemon, "pause");
    let paused = scrape(daemon);
    assert_eq!(paused.value("storc_background_paused", &REBUILD), 1.0, "paused:\n{}", paused.text);
    rebuild_action(daemon, "resume");
    set_rates(daemon, 100);
    // A scrape reads the rebuilds and the drive states one after the other, not as one
    // snapshot: the end shows in both only from the next scrape on (CI once saw the rebuild
    // gone and slot 8 still Rbld in one scrape).
    let done = scrape_until(daemon, "the rebuild's end", |s| {
        s.value("storc_background_operations", &[("kind", "rebuild")]) == 0.0
            && s.value("storc_drive_state", &[("slot", "8"), ("state", "Onln")]) == 1.0
    });
    assert_eq!(done.get("storc_background_progress_ratio", &REBUILD), None, "a finished rebuild leaves no series");
    assert_eq!(done.value("storc_drive_state", &[("slot", "8"), ("state", "Onln")]), 1.0);
    assert_eq!(done.value("storc_vd_state", &[VD, ("state", "Optl")]), 1.0);
    assert_eq!(done.value("storc_vd_members", &[VD, ("state", "Onln")]), 8.0);
}

/// `/c0/v0 start cc` at a low rate: the check shows with its progress and tallies, moves, and
/// is gone once it ends at full rate.
fn consistency_check_shows(daemon: &Daemon) {
    set_rates(daemon, 5);
    let started = daemon.cli(&["/c0/v0", "start", "cc"]);
    assert!(started.contains("consistency check of v0 started"), "{started}");
    let checking = scrape_until(daemon, "a consistency check under way", |s| s.get("storc_background_progress_ratio", &CC).is_some());
    promtool_accepts(&checking, "during the consistency check");
    assert_eq!(checking.value("storc_background_operations", &[("kind", "cc")]), 1.0);
    assert_eq!(checking.value("storc_cc_inconsistent_rows", &[VD]), 0.0);
    let first = checking.value("storc_background_progress_ratio", &CC);
    scrape_until(daemon, "the check's progress moving", |s| {
        s.get("storc_background_progress_ratio", &CC).is_none_or(|progress| progress > first)
    });
    set_rates(daemon, 100);
    scrape_until(daemon, "the check's end", |s| s.value("storc_background_operations", &[("kind", "cc")]) == 0.0);
}

/// `/c0/v0 start migrate` onto a file at a low rate (the reader keeps the VD busy): the
/// migration shows with its target slot, paused once paused, and is gone once stopped.
fn migration_shows(daemon: &Daemon) {
    set_rates(daemon, 1);
    let target = daemon.data_dir().join("moved.img");
    daemon.cli(&["/c0/v0", "start", "migrate", &format!("target={}", target.display())]);
    let migrating: [(&str, &str); 3] = [("kind", "migrate"), ("vd", "0"), ("slot", "9")];
    let running = scrape_until(daemon, "a migration under way", |s| s.get("storc_background_progress_ratio", &migrating).is_some());
    promtool_accepts(&running, "during the migration");
    assert_eq!(running.value("storc_background_operations", &[("kind", "migrate")]), 1.0);
    daemon.cli(&["/c0/v0", "pause", "migrate"]);
    scrape_until(daemon, "the migration paused", |s| s.get("storc_background_paused", &migrating) == Some(1.0));
    daemon.cli(&["/c0/v0", "stop", "migrate"]);
    scrape_until(daemon, "the migration's end", |s| s.value("storc_background_operations", &[("kind", "migrate")]) == 0.0);
    assert_eq!(daemon.vd_named("db").level, "RAID5", "a stopped migration leaves the VD where it was");
}

/// The caches and the journal: a write-back RAID1 with a mirrored journal, cached by an SSD
/// cache VD. Writes are destaged, hot reads hit the cache VD, both journal legs serve.
#[test]
fn metrics_of_the_controller_cache_the_ssd_cache_and_the_journal_move_and_pass_promtool() {
    common::require_tool("nbdcopy", "libnbd-bin");
    let scratch = Scratch::new("metrics-caches");
    let args = ["--journal", "ssd:nvme:128MiB", "--journal", "ssd:sas:128MiB", "--cache-size", "64MiB"];
    let daemon = Daemon::start_with_args(&scratch, &common::mem_drives(4, "64MiB"), &args);
    let vd = daemon.create_vd("r1", &[0, 1], "db");
    daemon.cli(&["/c0/v0", "set", "wrcache=wb"]);
    daemon.cli(&["/c0", "add", "vd", "cachecade", "r1", "drives=2-3", "name=ssd", "assignvds=0"]);
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 43);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    // nbdcopy reads sequentially: two passes promote the first lines, the third hits them.
    for pass in 0..3 {
        assert!(export_difference(&daemon.unix_uri("db"), &image, vd.size_bytes).is_none(), "pass {pass} reads the image back");
    }
    let cache_vd = [("vd", "1")];
    // nbdcopy writes one stream: past 4 MiB its writes go around the journal to the members.
    let on_members = |s: &Scrape| s.value("storc_cache_destaged_bytes_total", &[]) + s.value("storc_vd_journal_bypass_bytes_total", &[VD]);
    let scrape = scrape_until(&daemon, "the writes destaged", |s| on_members(s) >= vd.size_bytes as f64);
    promtool_accepts(&scrape, "with caches and a journal");
    assert!(scrape.value("storc_cache_destages_total", &[]) > 0.0);
    assert_eq!(scrape.value("storc_cache_destage_failures_total", &[]), 0.0);
    assert_eq!(scrape.value("storc_journal_state", &[("state", "Optimal")]), 1.0);
    assert_eq!(scrape.value("storc_journal_leg_in_service", &[("leg", "1")]), 1.0);
    assert!(scrape.value("storc_journal_ring_bytes", &[]) > 0.0);
    assert_eq!(scrape.value("storc_ssd_cache_write_back", &cache_vd), 0.0);
    assert!(scrape.value("storc_ssd_cache_lines", &cache_vd) > 0.0);
    assert!(scrape.value("storc_ssd_cache_promotions_total", &cache_vd) > 0.0);
    assert!(scrape.value("storc_ssd_cache_read_hits_total", &cache_vd) > 0.0);
    assert!(scrape.value("storc_vd_ssd_cache_valid_lines", &[VD]) > 0.0);
    assert_eq!(scrape.value("storc_vd_ssd_cache_lost", &[VD]), 0.0);
    let info = scrape.text.lines().find(|l| l.starts_with("storc_vd_info{vd=\"1\"")).expect("the cache VD's info");
    assert!(info.contains("cache_vd=\"true\"") && info.contains("name=\"ssd\""), "{info}");
    let db_info = scrape.text.lines().find(|l| l.starts_with("storc_vd_info{vd=\"0\"")).expect("the VD's info");
    assert!(db_info.contains("write_policy=\"wb\"") && db_info.contains("write_policy_effective=\"wb\""), "{db_info}");
    daemon.stop();
}
