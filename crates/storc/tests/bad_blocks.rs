//! The bad-block list against the real daemon. The fault is a real one: the member file a
//! rebuild reads from is truncated while the daemon runs, so the end of the VD's last strip
//! can no longer be read from it (a read past the end of a file is an error, never zeros), and
//! its mirror copy is gone. The rebuild records exactly those bytes, goes on, and the spare
//! comes back Onln; NBD reads of them fail with EIO, the rest reads back; the API and the CLI
//! list them; a restart keeps them; an NBD write over them makes them good again.

mod common;

use common::api_types::{BadBlockView, BadBlocksView, DriveView, EventView};
use common::{Daemon, Scratch, MIB};
use nbd::{Client, ClientConfig, NbdUri};
use std::time::{Duration, Instant};

/// The reserved 4 MiB plus 60 MiB of whole 64 KiB strips: the VD ends where the files end.
const DRIVE_BYTES: u64 = 64 * MIB;
const LOST_BYTES: u64 = 8192;
const REBUILD_TIMEOUT: Duration = Duration::from_secs(120);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).rotate_left((i % 5) as u32)).collect()
}

fn client(daemon: &Daemon) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: "db".to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).expect("NBD connect")
}

fn drive_state(daemon: &Daemon, slot: u32) -> String {
    daemon.get::<DriveView>(&format!("/api/v1/drives/{slot}")).state
}

fn wait_until_online(daemon: &Daemon, slot: u32) {
    let deadline = Instant::now() + REBUILD_TIMEOUT;
    while drive_state(daemon, slot) != "Onln" {
        let events: Vec<EventView> = daemon.get("/api/v1/events");
        let recent: Vec<String> = events.into_iter().rev().take(6).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "slot {slot} never came back Onln: {recent:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the storc CLI against the daemon; returns its exit code and output.
fn cli(daemon: &Daemon, args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_storc"))
        .args(args)
        .arg("--api")
        .arg(daemon.api_socket())
        .output()
        .expect("run the storc CLI");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).to_string())
}

/// Every byte outside `[lost_at, lost_at + LOST_BYTES)` reads back; a read of that range fails.
fn check_reads(daemon: &Daemon, model: &[u8], lost_at: u64, when: &str) {
    let mut nbd = client(daemon);
    let error = nbd.read(lost_at, LOST_BYTES as u32).expect_err("a read of the bad block fails");
    assert!(error.to_string().contains("EIO") || error.to_string().contains("Input/output"), "{when}: {error}");
    let mut nbd = client(daemon);
    for offset in (0..lost_at).step_by(1 << 20) {
        let len = (1 << 20).min(lost_at - offset);
        let got = nbd.read(offset, len as u32).unwrap_or_else(|e| panic!("{when}: read at {offset}: {e}"));
        assert!(got == model[offset as usize..(offset + len) as usize], "{when}: wrong data at {offset}+{len}");
    }
}

#[test]
fn a_rebuild_records_a_lost_range_and_the_api_cli_and_nbd_show_it() {
    let scratch = Scratch::new("bad-blocks");
    let drives: Vec<String> = (0..3).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let size_bytes = daemon.create_vd("r1", &[0, 1], "db").size_bytes;
    assert_eq!(size_bytes, DRIVE_BYTES - 4 * MIB, "the VD ends where the member files end");
    let spare = serde_json::json!({ "drive_groups": [] });
    daemon.api("POST", "/api/v1/drives/2/hotspare", Some(&spare)).expect::<serde_json::Value>(200, "add the spare");
    let mut model = pattern(size_bytes as usize, 9);
    let mut nbd = client(&daemon);
    for (index, chunk) in model.chunks(1 << 20).enumerate() {
        nbd.write((index << 20) as u64, chunk, false).unwrap();
    }
    nbd.flush().unwrap();
    drop(nbd);

    // Slot 0 loses its last 8 KiB; then slot 1 leaves and the spare is rebuilt from slot 0.
    std::fs::OpenOptions::new().write(true).open(&drives[0]).unwrap().set_len(DRIVE_BYTES - LOST_BYTES).unwrap();
    let (code, output) = cli(&daemon, &["/c0/s1", "set", "offline"]);
    assert_eq!(code, 0, "{output}");
    wait_until_online(&daemon, 2);
    assert_eq!(daemon.vd_named("db").state, "Optl");

    let lost_at = size_bytes - LOST_BYTES;
    let expected = vec![BadBlockView { offset_bytes: lost_at, len_bytes: LOST_BYTES, lba: lost_at / 512, sectors: LOST_BYTES / 512 }];
    let listed: BadBlocksView = daemon.get("/api/v1/vds/0/badblocks");
    assert_eq!(listed, BadBlocksView { vd: 0, max_ranges: 1024, bad_blocks: expected.clone() });
    let events: Vec<EventView> = daemon.get("/api/v1/events");
    let recorded = format!("v0: data lost, recorded as bad block(s) bytes {lost_at}..{size_bytes} (LBA {}, 16 sectors)", lost_at / 512);
    assert!(events.iter().any(|e| e.description.starts_with(&recorded)), "{recorded}: {events:#?}");
    check_reads(&daemon, &model, lost_at, "after the rebuild");

    let (code, output) = cli(&daemon, &["/c0/v0", "show", "badblocks"]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("Description = Show Bad Blocks Succeeded\n"), "{output}");
    assert!(output.contains(&format!("\n0 {lost_at}       8192           8.0 KiB {}    16\n", lost_at / 512)), "{output}");
    let (code, output) = cli(&daemon, &["/c0/v0", "show", "badblocks", "J"]);
    assert_eq!(code, 0, "{output}");
    let json: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!(json["Controllers"][0]["Response Data"]["bad_blocks"][0]["lba"], lost_at / 512);
    let (code, output) = cli(&daemon, &["/c0/v9", "show", "badblocks"]);
    assert_eq!((code, output.ends_with("Description = virtual drive v9 does not exist; VDs: v0\n")), (1, true), "{output}");
    let error = daemon.api("GET", "/api/v1/vds/9/badblocks", None::<&()>).expect_error(404, "no such VD");
    assert_eq!(error, "virtual drive v9 does not exist; VDs: v0");

    // A restart keeps the list (slot 0, now shorter than the VD needs, is left out of it).
    daemon.stop();
    let daemon = Daemon::start(&scratch, &drives);
    let listed: BadBlocksView = daemon.get("/api/v1/vds/0/badblocks");
    assert_eq!(listed.bad_blocks, expected, "the list survives a restart");
    check_reads(&daemon, &model, lost_at, "after a restart");

    // A write over the range makes it good again, and it reads back.
    let mut nbd = client(&daemon);
    let rewritten = pattern(LOST_BYTES as usize, 200);
    nbd.write(lost_at, &rewritten, true).unwrap();
    model[lost_at as usize..].copy_from_slice(&rewritten);
    assert_eq!(nbd.read(lost_at - 4096, 4096 + LOST_BYTES as u32).unwrap(), model[lost_at as usize - 4096..]);
    let listed: BadBlocksView = daemon.get("/api/v1/vds/0/badblocks");
    assert_eq!(listed.bad_blocks, vec![]);
    let (code, output) = cli(&daemon, &["/c0/v0", "show", "badblocks"]);
    assert!(code == 0 && output.contains("No bad blocks.\n"), "{output}");
    daemon.stop();
}
