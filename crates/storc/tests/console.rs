//! Issue 14, part 2: the web console in a real browser. Debian's headless Chromium, driven over
//! WebDriver by chromedriver (packages chromium and chromium-driver; a missing one fails the test,
//! it never skips), opens the console the daemon serves on its TCP listener, logs in with the
//! token from the data directory, creates a RAID5, assigns a global hot spare, takes a member
//! offline and watches the rebuild's progress bar advance until the VD is Optimal; the CLI then
//! shows the same state. A client keeps the VD busy meanwhile, so the live charts have data and
//! the rebuild runs at the rate set in the console.
//!
//! `STORC_CONSOLE_SCREENSHOT=$PWD/docs/console.png cargo test -p storc --test console` also
//! writes the screenshot taken mid-rebuild there (the README's picture).

mod common;
mod webdriver;

use common::*;
use nbd::{Client, ClientConfig, NbdUri};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use webdriver::Browser;

const DRIVE_COUNT: usize = 6;
/// Big enough that the rebuild, at the rate the test sets while a client is busy, takes several
/// of the console's one-second polls.
const DRIVE_SIZE: &str = "512MiB";
const MEMBERS: [u32; 4] = [0, 1, 2, 3];
const SPARE_SLOT: u32 = 4;
const OFFLINE_SLOT: u32 = 1;
const REBUILD_RATE_PERCENT: u32 = 10;
/// Long enough for a page load or an action's answer on a loaded 2-core machine.
const UI_TIMEOUT: Duration = Duration::from_secs(20);
const REBUILD_TIMEOUT: Duration = Duration::from_secs(240);
/// The busy client stops by itself after this, whatever the test does.
const LOAD_DURATION_MAX: Duration = Duration::from_secs(300);
const WINDOW_WIDTH: u32 = 1280;
const WINDOW_HEIGHT: u32 = 1600;
/// The README's picture must stay small.
const SCREENSHOT_BYTES_MAX: usize = 1 << 20;

/// Waits until `probe` returns something; fails with `what` and the page's text after `timeout`.
fn wait_until<T>(browser: &Browser, what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}; the page shows:\n{}", browser.page_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn slot_state(browser: &Browser, slot: u32) -> Option<String> {
    browser.attributes_of(&format!(".slot[data-slot=\"{slot}\"]"), "data-state").into_iter().next()
}

fn wait_for_slot_state(browser: &Browser, slot: u32, state: &str) {
    wait_until(browser, &format!("slot {slot} shown {state}"), UI_TIMEOUT, || (slot_state(browser, slot)? == state).then_some(()));
}

fn vd_cell(browser: &Browser, vd: u32, class: &str) -> Option<String> {
    browser.text_of(&format!("#vd-table tr[data-vd=\"{vd}\"] .{class}"))
}

/// The notice after an action: its text, once it starts with `prefix`; whether it is an error.
fn notice(browser: &Browser, prefix: &str) -> (String, bool) {
    let text = wait_until(browser, &format!("a notice {prefix:?}"), UI_TIMEOUT, || {
        browser.text_of("#notice-text").filter(|text| text.starts_with(prefix))
    });
    let is_error = !browser.attributes_of("#notice.error", "id").is_empty();
    (text, is_error)
}

fn login(browser: &Browser, daemon: &Daemon) {
    browser.goto(&format!("http://{}/", daemon.api_tcp_address()));
    browser.wait_for("#login:not([hidden])", UI_TIMEOUT);
    // Another token first: the console says so and stays at the login.
    let token_input = browser.wait_for("#login-token", UI_TIMEOUT);
    token_input.send_keys(&"0".repeat(64));
    browser.click("#login-button", UI_TIMEOUT);
    let refusal = wait_until(browser, "the wrong token refused", UI_TIMEOUT, || {
        browser.text_of("#login-error").filter(|text| text.contains("not this daemon's API token"))
    });
    assert!(refusal.contains("api.token"), "the refusal should say where the token is: {refusal}");
    assert!(browser.find_all("#console:not([hidden])").is_empty(), "a wrong token opened the console");
    token_input.clear();
    token_input.send_keys(&daemon.api_token());
    browser.click("#login-button", UI_TIMEOUT);
    browser.wait_for("#console:not([hidden])", UI_TIMEOUT);
    for slot in 0..DRIVE_COUNT as u32 {
        wait_for_slot_state(browser, slot, "UGood");
    }
    // Everything the page loaded came from the daemon itself: no CDN, it works offline.
    let origin = format!("http://{}/", daemon.api_tcp_address());
    let loaded = browser.execute("return performance.getEntriesByType('resource').map((entry) => entry.name);", &[]);
    let loaded: Vec<&str> = loaded.as_array().expect("a list of resources").iter().filter_map(|url| url.as_str()).collect();
    for asset in ["console.js", "charts.js", "console.css", "api/v1/controller"] {
        assert!(loaded.contains(&format!("{origin}{asset}").as_str()), "the page did not load {asset}: {loaded:?}");
    }
    assert!(loaded.iter().all(|url| url.starts_with(&origin)), "the page loaded something from elsewhere: {loaded:?}");
}

fn create_raid5(browser: &Browser) {
    browser.click("#create-level option[value=\"r5\"]", UI_TIMEOUT);
    for slot in MEMBERS {
        browser.click(&format!("input[name=\"create-drive\"][value=\"{slot}\"]"), UI_TIMEOUT);
    }
    browser.wait_for("#create-name", UI_TIMEOUT).send_keys("db");
    browser.click("#create-button", UI_TIMEOUT);
    let (text, is_error) = notice(browser, "create VD");
    assert!(!is_error, "creating the RAID5 failed: {text}");
    wait_until(browser, "v0 in the VD table", UI_TIMEOUT, || vd_cell(browser, 0, "vd-state"));
    assert_eq!(vd_cell(browser, 0, "vd-level").as_deref(), Some("RAID5"));
    assert_eq!(vd_cell(browser, 0, "vd-name").as_deref(), Some("db"));
    assert_eq!(vd_cell(browser, 0, "vd-state").as_deref(), Some("Optl"));
    for slot in MEMBERS {
        wait_for_slot_state(browser, slot, "Onln");
    }
}

/// An error the API answers reaches the user in the daemon's own words.
fn an_api_error_is_shown(browser: &Browser) {
    browser.click(".slot[data-slot=\"5\"]", UI_TIMEOUT);
    browser.wait_for("#drive-hotspare-dgs", UI_TIMEOUT).send_keys("7");
    browser.click("#drive-hotspare-dedicated", UI_TIMEOUT);
    let (text, is_error) = notice(browser, "slot 5 as dedicated hot spare: ");
    assert!(is_error, "a refused action should show as an error: {text}");
    assert!(text.len() > "slot 5 as dedicated hot spare: ".len() + 10, "the daemon's message should be shown: {text}");
    assert_eq!(slot_state(browser, 5).as_deref(), Some("UGood"), "a refused action changed slot 5");
}

fn set_rebuild_rate(browser: &Browser) {
    browser.wait_for("#settings-rebuild-rate", UI_TIMEOUT).send_keys(&REBUILD_RATE_PERCENT.to_string());
    browser.click("#settings-button", UI_TIMEOUT);
    let (text, is_error) = notice(browser, "controller settings");
    assert!(!is_error, "setting the rebuild rate failed: {text}");
    let shown = format!("Rebuild rate{REBUILD_RATE_PERCENT} %");
    wait_until(browser, "the new rebuild rate in the summary", UI_TIMEOUT, || {
        browser.text_of("#summary-list").filter(|text| text.contains(&shown))
    });
}

/// A client reading and writing 64 KiB blocks over NBD until told to stop (or
/// `LOAD_DURATION_MAX`); the requests it completed.
fn busy_client(daemon: &Daemon, export: &str, span_bytes: u64) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    const BLOCK_BYTES: u64 = 64 << 10;
    let uri = NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: export.into() };
    let mut client = Client::connect(&uri, &ClientConfig { structured_replies: true }).expect("connect the busy client");
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (stop_seen, done_count) = (Arc::clone(&stop), Arc::clone(&done));
    let block = vec![0x5a; BLOCK_BYTES as usize];
    let worker = std::thread::spawn(move || {
        let (started, mut rng) = (Instant::now(), Rng(7));
        while !stop_seen.load(Ordering::SeqCst) && started.elapsed() < LOAD_DURATION_MAX {
            let offset = rng.below(span_bytes / BLOCK_BYTES) * BLOCK_BYTES;
            let outcome = if rng.below(4) == 0 {
                client.write(offset, &block, false).map(drop)
            } else {
                client.read(offset, BLOCK_BYTES as u32).map(drop)
            };
            outcome.expect("the busy client's request failed");
            done_count.fetch_add(1, Ordering::Relaxed);
        }
    });
    (stop, done, worker)
}

/// Takes `OFFLINE_SLOT` offline from the console and watches the rebuild's progress bar until v0
/// is Optimal again; the percentages seen, and the screenshot taken mid-way.
fn offline_and_watch_the_rebuild(browser: &Browser) -> (Vec<f64>, Vec<u8>) {
    browser.click(&format!(".slot[data-slot=\"{OFFLINE_SLOT}\"]"), UI_TIMEOUT);
    browser.click("#drive-offline", UI_TIMEOUT);
    let (text, is_error) = notice(browser, &format!("set slot {OFFLINE_SLOT} offline"));
    assert!(!is_error, "setting slot {OFFLINE_SLOT} offline failed: {text}");
    let (started, mut seen, mut screenshot) = (Instant::now(), Vec::<f64>::new(), Vec::new());
    loop {
        let bars = browser.attributes_of(&format!(".progress[data-kind=\"rebuild\"][data-target=\"s{SPARE_SLOT}\"]"), "data-percent");
        if let Some(percent) = bars.first().and_then(|text| text.parse::<f64>().ok()) {
            if seen.last() != Some(&percent) {
                seen.push(percent);
            }
            if screenshot.is_empty() && (20.0..80.0).contains(&percent) {
                screenshot = browser.screenshot_png();
            }
        }
        if vd_cell(browser, 0, "vd-state").as_deref() == Some("Optl") && bars.is_empty() && !seen.is_empty() {
            return (seen, screenshot);
        }
        assert!(
            started.elapsed() < REBUILD_TIMEOUT,
            "v0 not Optimal within {REBUILD_TIMEOUT:?}; bars seen {seen:?}:\n{}",
            browser.page_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `(slot, state)` of every row of `storc /c0/sall show`.
fn cli_slot_states(daemon: &Daemon) -> Vec<(u32, String)> {
    let text = daemon.cli(&["/c0/sall", "show"]);
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let slot = fields.next()?.parse().ok()?;
            let _drive_id = fields.next()?;
            Some((slot, fields.next()?.to_string()))
        })
        .collect()
}

#[test]
fn the_console_creates_a_raid5_assigns_a_spare_and_shows_a_rebuild_to_optimal() {
    let scratch = Scratch::new("console");
    let options = DaemonOptions { api_tcp: true, ..DaemonOptions::default() };
    let daemon = Daemon::start_with(&scratch, &mem_drives(DRIVE_COUNT, DRIVE_SIZE), &options);
    let browser = Browser::start(&scratch.join("profile"), &scratch.join("chromedriver.log"), WINDOW_WIDTH, WINDOW_HEIGHT);
    login(&browser, &daemon);
    create_raid5(&browser);
    an_api_error_is_shown(&browser);
    browser.click(&format!(".slot[data-slot=\"{SPARE_SLOT}\"]"), UI_TIMEOUT);
    browser.click("#drive-hotspare-global", UI_TIMEOUT);
    wait_for_slot_state(&browser, SPARE_SLOT, "GHS");
    set_rebuild_rate(&browser);

    let size_bytes = daemon.vd_named("db").size_bytes;
    let (stop, requests, client) = busy_client(&daemon, "db", size_bytes);
    wait_until(&browser, "client I/O in the live charts", UI_TIMEOUT, || {
        let legend = browser.text_of("#chart-legend [data-vd=\"0\"]")?;
        let drawn = browser.attributes_of("#chart-iops polyline[data-vd=\"0\"]", "points");
        (legend.contains(" IOPS") && !legend.contains(": 0 IOPS") && drawn.first()?.contains(' ')).then_some(())
    });
    let (percents, screenshot) = offline_and_watch_the_rebuild(&browser);
    stop.store(true, Ordering::SeqCst);
    client.join().expect("the busy client");
    eprintln!("rebuild progress seen: {percents:?}; client requests: {}", requests.load(Ordering::Relaxed));
    assert!(percents.len() >= 2, "the progress bar should advance through at least two values; it showed {percents:?}");
    assert!(percents.windows(2).all(|pair| pair[0] < pair[1]), "the progress bar went back: {percents:?}");
    wait_for_slot_state(&browser, SPARE_SLOT, "Onln");
    wait_for_slot_state(&browser, OFFLINE_SLOT, "UGood");

    // The CLI shows the same state as the console.
    let shown = daemon.cli(&["/c0/v0", "show"]);
    let vd_line = shown.lines().find(|line| line.starts_with("0/0")).unwrap_or_else(|| panic!("no v0 line in:\n{shown}"));
    let fields: Vec<&str> = vd_line.split_whitespace().collect();
    assert_eq!((fields[1], fields[2]), ("RAID5", "Optl"), "storc /c0/v0 show: {vd_line}");
    assert!(vd_line.ends_with("db   db") || vd_line.split_whitespace().rev().take(2).all(|f| f == "db"), "{vd_line}");
    let cli_states = cli_slot_states(&daemon);
    let console_states: Vec<(u32, String)> =
        (0..DRIVE_COUNT as u32).map(|slot| (slot, slot_state(&browser, slot).expect("a slot tile"))).collect();
    assert_eq!(cli_states, console_states, "storc /c0/sall show and the console's slot map differ");

    check_screenshot(&screenshot);
    drop(browser);
    daemon.stop();
}

/// The mid-rebuild screenshot is a PNG of the whole window, small enough for the README; written
/// where `STORC_CONSOLE_SCREENSHOT` says, if it is set.
fn check_screenshot(png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "no mid-rebuild screenshot (the progress bar never showed 20-80 %)");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width >= WINDOW_WIDTH / 2 && height >= WINDOW_HEIGHT / 2, "the screenshot is {width}x{height}");
    assert!(png.len() < SCREENSHOT_BYTES_MAX, "the screenshot is {} bytes; keep it under {SCREENSHOT_BYTES_MAX}", png.len());
    if let Some(path) = std::env::var_os("STORC_CONSOLE_SCREENSHOT") {
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.to_string_lossy()));
        eprintln!("wrote the console screenshot to {} ({} bytes, {width}x{height})", path.to_string_lossy(), png.len());
    }
}
