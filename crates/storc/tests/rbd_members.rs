//! The real daemon with RBD images of a real single-node Ceph cluster as member drives
//! (issue 15): `--drive rbd:POOL/IMAGE?conf=PATH`, a RAID5 of four images written with nbdcopy
//! and read back; an image removed (its client blocklisted, then `rbd rm`) and a pool deleted
//! under a running VD while a client writes: the member fails, the VD serves degraded, and every
//! byte reads back as written, across a restart too.

mod common;

use common::api_types::{BgiView, ControllerView, EventView};
use common::{block_contents, nbdcopy_in, write_random_image, Daemon, Scratch, MIB};
use drive::testing::CephCluster;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const IMAGE_BYTES: u64 = 96 * MIB;
/// What nbdcopy writes first: the start of each VD.
const COPIED_BYTES: u64 = 24 * MIB;
/// The writer under load writes 64 KiB blocks in the 8 MiB after the copied image.
const BLOCK_BYTES: usize = 64 << 10;
const LOAD_BLOCKS: u64 = 128;

fn events(daemon: &Daemon) -> Vec<String> {
    let events: Vec<EventView> = daemon.get("/api/v1/events");
    events.into_iter().map(|e| e.description).collect()
}

fn client(daemon: &Daemon, export: &str) -> nbd::Client {
    let uri = nbd::NbdUri::Unix { socket_path: daemon.data_dir().join("nbd.sock"), export_name: export.into() };
    nbd::Client::connect(&uri, &nbd::ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("NBD connect to {export}: {e}"))
}

/// A client writing versioned blocks after the copied image until stopped; every write and
/// flush must succeed. Returns the last version written of each block.
fn writer_under_load(daemon: &Daemon, export: &str) -> (Arc<AtomicBool>, JoinHandle<HashMap<u64, u64>>) {
    let mut nbd = client(daemon, export);
    let stop = Arc::new(AtomicBool::new(false));
    let stop_seen = Arc::clone(&stop);
    let writer = std::thread::spawn(move || {
        let mut versions = HashMap::new();
        let mut rng = common::Rng(15);
        for round in 1u64.. {
            if stop_seen.load(Ordering::SeqCst) {
                break;
            }
            let block = rng.below(LOAD_BLOCKS);
            let offset_bytes = COPIED_BYTES + block * BLOCK_BYTES as u64;
            nbd.write(offset_bytes, &block_contents(block, round, BLOCK_BYTES), false)
                .unwrap_or_else(|e| panic!("write {round} (block {block}) failed: {e}"));
            versions.insert(block, round);
            if round % 16 == 0 {
                nbd.flush().unwrap_or_else(|e| panic!("flush after write {round} failed: {e}"));
            }
        }
        versions
    });
    (stop, writer)
}

/// Every block the writer wrote reads back at its last version, the others as zeros.
fn check_load_blocks(daemon: &Daemon, export: &str, versions: &HashMap<u64, u64>) {
    let mut nbd = client(daemon, export);
    for block in 0..LOAD_BLOCKS {
        let version = versions.get(&block).copied().unwrap_or(0);
        let read = nbd.read(COPIED_BYTES + block * BLOCK_BYTES as u64, BLOCK_BYTES as u32).expect("read a written block");
        assert!(read == block_contents(block, version, BLOCK_BYTES), "block {block} does not read back at version {version}");
    }
}

fn wait_for_state(daemon: &Daemon, name: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while daemon.vd_named(name).state != state {
        assert!(Instant::now() < deadline, "{name} is not {state} after 90 s: {:#?}\n{}", events(daemon), daemon.log_tail());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Copies a random image to the start of `export` and runs a writer after it while `fault`
/// takes a member away; then the VD must be degraded with `failed_slot` out, and everything
/// must read back.
fn survive_a_member_lost_under_load(daemon: &Daemon, scratch: &Scratch, export: &str, failed_slot: u32, fault: impl FnOnce()) {
    let image = scratch.join(&format!("{export}.img"));
    write_random_image(&image, COPIED_BYTES, 7);
    nbdcopy_in(&image, &daemon.unix_uri(export));
    let size_bytes = daemon.vd_named(export).size_bytes;
    common::assert_export_starts_with(&daemon.unix_uri(export), &image, size_bytes);
    let (stop, writer) = writer_under_load(daemon, export);
    std::thread::sleep(Duration::from_millis(300));
    fault();
    wait_for_state(daemon, export, "Dgrd");
    std::thread::sleep(Duration::from_millis(500)); // writes go on while degraded
    stop.store(true, Ordering::SeqCst);
    let versions = writer.join().expect("the writer saw no error");
    assert!(versions.len() > 16, "the writer wrote {} blocks only", versions.len());
    let controller: ControllerView = daemon.controller();
    let slot = controller.drives.iter().find(|d| d.slot == failed_slot).expect("the failed slot");
    assert_eq!(slot.state, "Failed", "{:#?}", events(daemon));
    common::assert_export_starts_with(&daemon.unix_uri(export), &image, size_bytes);
    check_load_blocks(daemon, export, &versions);
}

/// A RAID5 of four RBD images: made without background initialization (new images read as
/// zero), written with nbdcopy and read back; one image removed under a writing client.
#[test]
fn a_raid5_of_rbd_images_serves_its_data_and_survives_an_image_removed_under_load() {
    let cluster = CephCluster::shared();
    let scratch = Scratch::new("rbd-raid5");
    let images: Vec<String> = (0..4).map(|i| format!("raid5-m{i}")).collect();
    for image in &images {
        cluster.create_image(image, IMAGE_BYTES);
    }
    let drives: Vec<String> = images.iter().map(|image| cluster.drive_arg(image)).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let controller: ControllerView = daemon.controller();
    for (slot, drive) in drives.iter().enumerate() {
        let view = controller.drives.iter().find(|d| d.slot == slot as u32).expect("a slot per drive");
        assert_eq!((view.kind.as_str(), &view.source, view.size_bytes), ("Rbd", drive, IMAGE_BYTES), "slot {slot}");
    }
    let shown = daemon.cli(&["/c0/sall", "show"]);
    let rbd_rows = shown.lines().filter(|line| line.contains(" Rbd ") && line.contains("rbd:rbd/raid5-m")).count();
    assert_eq!(rbd_rows, 4, "the CLI lists the four images with their kind:\n{shown}");
    let vd = daemon.create_vd("r5", &[0, 1, 2, 3], "ceph5");
    assert_eq!(vd.state, "Optl");
    let bgis: Vec<BgiView> = daemon.get("/api/v1/bgis");
    assert!(bgis.is_empty(), "new images read as zero: nothing to initialize, yet {bgis:?}");

    survive_a_member_lost_under_load(&daemon, &scratch, "ceph5", 2, || cluster.remove_image_in_use("raid5-m2"));
    let events = events(&daemon);
    let failed = events.iter().any(|e| e.contains("slot 2") && e.contains("the drive is gone"));
    assert!(failed, "an event says slot 2 failed because its image is gone: {events:#?}");
    daemon.stop();

    // The image is gone for good: the next start leaves it out, saying why, and serves degraded.
    let daemon = Daemon::start(&scratch, &drives);
    assert_eq!(daemon.vd_named("ceph5").state, "Dgrd");
    let events = self::events(&daemon);
    let left_out = events.iter().any(|e| e.contains("image rbd/raid5-m2 does not exist") && e.contains("left out"));
    assert!(left_out, "an event says which image could not be opened: {events:#?}");
    common::assert_export_starts_with(&daemon.unix_uri("ceph5"), &scratch.join("ceph5.img"), vd.size_bytes);
    daemon.stop();
}

/// A RAID1 of an RBD image and a file: the image's pool deleted under a writing client.
#[test]
fn a_raid1_of_an_rbd_image_and_a_file_survives_its_pool_deleted_under_load() {
    let cluster = CephCluster::shared();
    let scratch = Scratch::new("rbd-raid1");
    cluster.create_pool("storc-doomed");
    cluster.run("rbd", &["create", "--size", &format!("{}M", IMAGE_BYTES >> 20), "storc-doomed/mirror"]);
    let rbd = format!("rbd:storc-doomed/mirror?conf={}", cluster.conf().display());
    let file = scratch.sparse_file("mirror.img", IMAGE_BYTES).display().to_string();
    let daemon = Daemon::start(&scratch, &[rbd, file]);
    daemon.create_vd("r1", &[0, 1], "mixed1");
    survive_a_member_lost_under_load(&daemon, &scratch, "mixed1", 0, || cluster.delete_pool("storc-doomed"));
    daemon.stop();
}

/// Bad `--drive rbd:` arguments stop the first start with a message that says what is wrong.
#[test]
fn bad_rbd_drives_are_refused_with_what_was_tried() {
    let cluster = CephCluster::shared();
    let scratch = Scratch::new("rbd-refused");
    let conf = cluster.conf().display().to_string();
    for (drive, expected) in [
        (format!("rbd:rbd/absent?conf={conf}"), "image rbd/absent does not exist (create it with: rbd create --size 8G rbd/absent)"),
        (format!("rbd:absent-pool/disk?conf={conf}"), "pool \"absent-pool\" does not exist"),
        (format!("rbd:rbd/disk?conf={conf}&user=admin"), "unknown key \"user\" (allowed keys: conf, id, timeout)"),
        ("rbd:disk".to_string(), "expected POOL/IMAGE"),
    ] {
        let message = common::serve_refused(&scratch, &["--drive", &drive], 1);
        assert!(message.contains(&format!("--drive {}", drive.split('?').next().unwrap())), "{message}");
        assert!(message.contains(expected), "--drive {drive}: {message:?} should say {expected:?}");
    }
}

/// `storc bench` with a RAID0 of two RBD images (`vd:r0:2xrbd:POOL/PREFIX`: images PREFIX-0 and
/// PREFIX-1) writes and verifies what it reads; at exit it lets go of the images (no watcher
/// left, `rbd rm` works at once).
#[test]
fn storc_bench_verifies_a_raid0_of_rbd_images_and_lets_go_of_them() {
    let cluster = CephCluster::shared();
    let scratch = Scratch::new("rbd-bench");
    for image in ["bench-0", "bench-1"] {
        cluster.create_image(image, 64 * MIB);
    }
    let json = scratch.join("results.json");
    let target = format!("vd:r0:2x{}", cluster.drive_arg("bench"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_storc"))
        .args(["bench", "run", "review-database", "--quick", "--verify", "--duration", "0.2", "--ramp", "0"])
        .args(["--target", &target, "--json"])
        .arg(&json)
        .output()
        .expect("run storc bench");
    assert!(output.status.success(), "storc bench --target {target}:\n{}", common::text_of(&output));
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let drives: Vec<&str> = results["target"]["drives"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(drives, ["rbd:rbd/bench-0", "rbd:rbd/bench-1"]);
    let points = results["patterns"][0]["points"].as_array().unwrap();
    assert!(points.iter().all(|p| p["ops"].as_u64().unwrap() > 0 && p["errors"] == 0 && p["verify"]["mismatched_sectors"] == 0));
    for image in ["bench-0", "bench-1"] {
        let status = cluster.run("rbd", &["status", "--format", "json", &format!("rbd/{image}")]);
        assert!(!status.contains("\"address\""), "storc bench left {image} open: {status}");
        cluster.run("rbd", &["rm", "--no-progress", &format!("rbd/{image}")]);
    }
}

/// A local journal in front of Ceph (issue 15, item 4): a write-back JBOD over an RBD image with
/// its journal on a local file. A client writes versioned blocks (a FLUSH now and then) and the
/// daemon is killed with -9 while the cache still holds what the journal acknowledged; after the
/// restart, every acknowledged block reads back at its version (replayed from the journal onto
/// the image), and after a clean stop the image itself holds them past the metadata area.
#[test]
fn a_write_back_vd_over_an_rbd_image_keeps_what_its_local_journal_acknowledged_across_kill_9() {
    let cluster = CephCluster::shared();
    // The killed daemon's watch on the image would hold its exclusive lock for the default
    // 30 s, and the restart's replay waits for that lock: a shorter watch keeps the test short.
    cluster.run("ceph", &["config", "set", "osd", "osd_client_watch_timeout", "5"]);
    let scratch = Scratch::new("rbd-wb");
    cluster.create_image("wb-m0", IMAGE_BYTES);
    let journal = scratch.join("journal.img").display().to_string();
    let args = ["--journal", journal.as_str(), "--cache-size", "64MiB"];
    let drives = [cluster.drive_arg("wb-m0")];
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    daemon.create_vd("jbod", &[0], "cephwb");
    let body = common::api_types::SetVd { write_policy: Some("wb".into()), ..Default::default() };
    let reply = daemon.api("PATCH", "/api/v1/vds/0", Some(&body));
    assert!(reply.status < 300, "set wrcache=wb: {} {}", reply.status, reply.body);
    assert_eq!(daemon.vd_named("cephwb").write_policy_effective, "wb");

    let mut nbd = client(&daemon, "cephwb");
    let mut versions = HashMap::new();
    let mut rng = common::Rng(42);
    for round in 1..=400u64 {
        let block = rng.below(LOAD_BLOCKS);
        nbd.write(block * BLOCK_BYTES as u64, &block_contents(block, round, BLOCK_BYTES), false)
            .unwrap_or_else(|e| panic!("write {round} (block {block}) failed: {e}"));
        versions.insert(block, round);
        if round % 64 == 0 {
            nbd.flush().unwrap_or_else(|e| panic!("flush after write {round} failed: {e}"));
        }
    }
    drop(nbd);
    daemon.kill9();

    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    let journal: common::api_types::JournalView = daemon.get("/api/v1/journal");
    assert!(journal.replayed_records > 0, "the kill left records to replay: {journal:?}");
    let mut nbd = client(&daemon, "cephwb");
    for block in 0..LOAD_BLOCKS {
        let version = versions.get(&block).copied().unwrap_or(0);
        let read = nbd.read(block * BLOCK_BYTES as u64, BLOCK_BYTES as u32).expect("read a written block");
        assert!(read == block_contents(block, version, BLOCK_BYTES), "block {block} does not read back at version {version}");
    }
    drop(nbd);
    daemon.stop();

    // The image holds the VD past the controller's metadata area.
    let exported = scratch.join("exported.img");
    cluster.run("rbd", &["export", "--no-progress", "rbd/wb-m0", &exported.display().to_string()]);
    let image = std::fs::read(&exported).expect("read the exported image");
    let metadata_bytes = 4 * MIB as usize;
    for block in 0..LOAD_BLOCKS {
        let version = versions.get(&block).copied().unwrap_or(0);
        let start = metadata_bytes + (block as usize) * BLOCK_BYTES;
        assert!(
            image[start..start + BLOCK_BYTES] == block_contents(block, version, BLOCK_BYTES)[..],
            "block {block} is not on the RBD image at version {version}"
        );
    }
    println!("{} journal writes replayed onto the RBD image after kill -9; every acknowledged block read back", journal.replayed_records);
}

/// fio's nbd engine over `export`: random 4-64 KiB reads and writes over the first `size_bytes`,
/// every write verified by crc32c: at the end, or (with `seconds`, a time-based run) every 64
/// blocks while it runs. Returns the child, still running.
fn fio_verify(daemon: &Daemon, export: &str, size_bytes: u64, seconds: Option<u32>) -> std::process::Child {
    let mut command = std::process::Command::new("fio");
    command
        .args(["--name=migrate", "--ioengine=nbd", &format!("--uri={}", daemon.unix_uri(export))])
        .args(["--rw=randrw", "--bsrange=4k-64k", "--iodepth=8", &format!("--size={size_bytes}")])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=json"]);
    if let Some(seconds) = seconds {
        command.args(["--time_based", &format!("--runtime={seconds}"), "--verify_backlog=64"]);
    }
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("run fio")
}

fn fio_passed(child: std::process::Child, what: &str) {
    let output = child.wait_with_output().expect("wait for fio");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{what}: fio exited with {}\n{}\n{text}", output.status, String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').expect("fio's JSON")..]).expect("fio's JSON");
    assert_eq!(report["jobs"][0]["error"].as_u64(), Some(0), "{what}: fio reports an error");
}

/// Live migration into Ceph (issue 15, item 3): a RAID5 of three local files moves onto an RBD
/// image named by its spec (`start migrate target=rbd:POOL/IMAGE?conf=...`, which storc creates
/// at the size the VD needs and adds as slot 3) while fio writes and verifies through its export,
/// before, during and after the switch; then the VD is a JBOD of the image with the same export
/// name and size, a new fio run verifies through the same export, `rbd export` finds the VD on
/// the image past the 4 MiB metadata area, and a restart with only the three files as `--drive`
/// opens the image again (the daemon remembered it) and serves the same bytes; an image that
/// holds data is refused as a target.
#[test]
fn a_vd_migrates_into_an_rbd_image_while_fio_verifies_through_its_export() {
    let cluster = CephCluster::shared();
    let scratch = Scratch::new("rbd-migrate");
    let drives: Vec<String> = (0..3).map(|i| scratch.sparse_file(&format!("m{i}.img"), 64 * MIB).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let vd = daemon.create_vd("r5", &[0, 1, 2], "moving");
    let fio_bytes = 96 * MIB;
    assert!(vd.size_bytes > fio_bytes);

    let mut fio = fio_verify(&daemon, "moving", fio_bytes, Some(12));
    std::thread::sleep(Duration::from_millis(300));
    let target = cluster.drive_arg("migrate-target");
    let shown = daemon.cli(&["/c0/v0", "start", "migrate", &format!("target={target}")]);
    assert!(shown.contains("Start Migrate Succeeded") && shown.contains("/c0/s3") && shown.contains(&target), "{shown}");
    assert!(fio.try_wait().expect("fio's status").is_none(), "fio was running when the migration started");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let fio_ran_at_switch = loop {
        let controller: ControllerView = daemon.controller();
        if controller.drives.iter().any(|d| d.slot == 3 && d.state == "Onln") {
            break fio.try_wait().expect("fio's status").is_none();
        }
        assert!(Instant::now() < deadline, "the migration did not end within 90 s: {:#?}\n{}", events(&daemon), daemon.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    };
    let migration_seconds = started.elapsed().as_secs_f64();
    assert!(fio_ran_at_switch, "fio (12 s) ended before the switch ({migration_seconds:.1} s after the start): it did not run throughout");
    fio_passed(fio, "fio during the migration");
    let moved = daemon.vd_named("moving");
    assert_eq!((moved.size_bytes, moved.level.as_str()), (vd.size_bytes, "JBOD"), "{moved:?}");
    let said = events(&daemon);
    assert!(said.iter().any(|e| e.contains("v0 moved to slot 3")), "{said:#?}");
    let image_bytes = 4 * MIB + vd.size_bytes;
    assert!(said.iter().any(|e| e.contains(&format!("RBD image rbd/migrate-target ({image_bytes} bytes) created"))), "{said:#?}");
    fio_passed(fio_verify(&daemon, "moving", 32 * MIB, None), "fio after the switch");

    let through_export = scratch.join("through-export.img");
    common::run(std::process::Command::new("nbdcopy").arg(daemon.unix_uri("moving")).arg(&through_export));
    daemon.stop();
    let exported = scratch.join("rbd-export.img");
    cluster.run("rbd", &["export", "--no-progress", "rbd/migrate-target", &exported.display().to_string()]);
    let image = std::fs::read(&exported).expect("read the exported image");
    let vd_bytes = std::fs::read(&through_export).expect("read the VD's copy");
    let start = 4 * MIB as usize;
    let on_image = &image[start..start + vd_bytes.len()];
    assert!(on_image == &vd_bytes[..], "the RBD image holds the VD past its metadata area");
    assert_eq!(image.len() as u64, image_bytes, "created at the size the VD needs");

    let daemon = Daemon::start(&scratch, &drives);
    let moved = daemon.vd_named("moving");
    assert_eq!((moved.level.as_str(), moved.state.as_str()), ("JBOD", "Optl"), "{moved:?}");
    let after_restart = scratch.join("after-restart.img");
    common::run(std::process::Command::new("nbdcopy").arg(daemon.unix_uri("moving")).arg(&after_restart));
    assert!(std::fs::read(&after_restart).expect("read the copy") == vd_bytes, "the same bytes after a restart");

    // An image that holds data is never a target named at run time: storc would overwrite it.
    cluster.create_image("holds-data", 256 * MIB);
    cluster.run("rbd", &["bench", "--io-type", "write", "--io-size", "4K", "--io-total", "64K", "rbd/holds-data"]);
    daemon.create_vd("r5", &[0, 1, 2], "second");
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.vd_named("second").resync.is_some() {
        assert!(Instant::now() < deadline, "the new VD's initialization did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let target = format!("target={}", cluster.drive_arg("holds-data"));
    let (status, text) = daemon.cli_output(&["/c0/v1", "start", "migrate", &target]);
    assert!(status != 0 && text.contains("exists and holds data") && text.contains("--drive"), "{status} {text}");
    assert_eq!(daemon.controller().drives.len(), 4, "nothing was added");
    daemon.stop();
    println!(
        "v0 ({} MiB) migrated into rbd/migrate-target in {migration_seconds:.1} s under fio, which ran on past the switch; fio verified during and after; rbd export matches",
        vd.size_bytes >> 20
    );
}
