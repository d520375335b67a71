//! End to end: the real `storc serve` binary, set up through its management API (and its CLI),
//! with real NBD clients reading and writing its exports: nbdinfo, nbdcopy, qemu-img and fio.
//! These tools must be installed (`apt-get install -y libnbd-bin qemu-utils fio`); a missing one
//! fails the test, it never skips.
//!
//! Every test starts its own daemon in a scratch directory under /var/tmp and stops it with
//! SIGTERM, checking that it exits 0.

mod common;

use common::api_types::{DriveView, VdView};
use common::*;
use std::process::Command;

#[test]
fn nbdinfo_lists_every_vd_with_the_size_the_api_reports() {
    require_tool("nbdinfo", "libnbd-bin");
    let scratch = Scratch::new("list");
    let daemon = Daemon::start(&scratch, &mem_drives(5, "64MiB"));
    let wanted: [(&str, &str, &[u32]); 2] = [("db", "r5", &[0, 1, 2]), ("logs", "r1", &[3, 4])];
    let vds: Vec<VdView> = wanted.iter().map(|(name, level, slots)| daemon.create_vd(level, slots, name)).collect();

    let listing = stdout(&run(Command::new("nbdinfo").arg("--list").arg(daemon.unix_uri(""))));
    let names: Vec<&str> = vds.iter().map(|vd| vd.export_name.as_str()).collect();
    assert_eq!(listing.matches("export=\"").count(), vds.len(), "nbdinfo should list exactly the exports {names:?}:\n{listing}");
    for vd in &vds {
        let section = nbdinfo_section(&listing, &vd.export_name);
        let size_bytes = nbdinfo_export_size(section);
        assert_eq!(size_bytes, vd.size_bytes, "export {:?}: nbdinfo says {size_bytes} bytes, the API {}", vd.export_name, vd.size_bytes);
        assert!(section.contains(&vd.level), "export {:?}: its description should name {}:\n{section}", vd.export_name, vd.level);
    }
    // Drives of one size: a RAID5 over three keeps two drives' worth, a RAID1 over two keeps one.
    assert_eq!(vds[0].size_bytes, 2 * vds[1].size_bytes, "RAID5 over 3 drives should hold twice a RAID1 over 2 of the same size");
    daemon.stop();
}

#[test]
fn nbdcopy_round_trips_a_1_gib_image_through_raid5_over_unix_and_tcp() {
    let scratch = Scratch::new("nbdcopy");
    // Four drives of 346 MiB keep 3 x 342 MiB after the 4 MiB metadata reserve: just over 1 GiB,
    // so the image fills the export and every byte of the VD is compared.
    let daemon = Daemon::start(&scratch, &mem_drives(4, "346MiB"));
    let vd = daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    assert!(vd.size_bytes >= GIB, "the RAID5 holds {} bytes, less than the 1 GiB image", vd.size_bytes);
    let image = scratch.join("image.raw");
    write_random_image(&image, vd.size_bytes, 2);

    nbdcopy_in(&image, &daemon.unix_uri("db"));
    assert_export_starts_with(&daemon.unix_uri("db"), &image, vd.size_bytes);
    assert_export_starts_with(&daemon.tcp_uri("db"), &image, vd.size_bytes);
    daemon.stop();
}

#[test]
fn qemu_img_convert_then_compare_reports_identical() {
    require_tool("qemu-img", "qemu-utils");
    let scratch = Scratch::new("qemu-img");
    let daemon = Daemon::start(&scratch, &mem_drives(4, "68MiB"));
    let vd = daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    let image = scratch.join("image.raw");
    let other_image = scratch.join("other.raw");
    write_random_image(&image, vd.size_bytes, 3);
    write_random_image(&other_image, vd.size_bytes, 4);
    let uri = daemon.unix_uri("db");

    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&image).arg(&uri));
    let compare = |candidate: &std::path::Path| {
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(candidate)
            .arg(&uri)
            .output()
            .expect("run qemu-img compare")
    };
    let same = compare(&image);
    let same_text = String::from_utf8_lossy(&same.stdout);
    assert!(
        same.status.success() && same_text.contains("Images are identical"),
        "qemu-img compare image {uri}: {}\n{same_text}",
        same.status
    );
    // The control: compare must see a difference, or "identical" above would prove nothing.
    let differs = compare(&other_image);
    assert_eq!(
        differs.status.code(),
        Some(1),
        "qemu-img compare of a different image should exit 1 (content mismatch): {}",
        String::from_utf8_lossy(&differs.stdout)
    );
    daemon.stop();
}

#[test]
fn fio_randrw_with_crc32c_verify_passes_on_raid5() {
    check_fio_verify_passes("r5", 4);
}

#[test]
fn fio_randrw_with_crc32c_verify_passes_on_raid10() {
    check_fio_verify_passes("r10", 6);
}

/// fio's nbd engine, random reads and writes of 4 to 64 KiB, every write verified by crc32c.
fn check_fio_verify_passes(level: &str, drive_count: u32) {
    const FIO_SIZE_BYTES: u64 = 256 * MIB;
    require_tool("fio", "fio");
    let scratch = Scratch::new(&format!("fio-{level}"));
    let daemon = Daemon::start(&scratch, &mem_drives(drive_count as usize, "100MiB"));
    let vd = daemon.create_vd(level, &(0..drive_count).collect::<Vec<_>>(), "fio");
    assert!(vd.size_bytes >= FIO_SIZE_BYTES, "{level}: the VD holds {} bytes, less than fio's {FIO_SIZE_BYTES}", vd.size_bytes);

    let output = Command::new("fio")
        .args(["--name=storc-e2e", "--ioengine=nbd", &format!("--uri={}", daemon.unix_uri("fio"))])
        .args(["--rw=randrw", "--bsrange=4k-64k", "--iodepth=16", &format!("--size={FIO_SIZE_BYTES}")])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=json"])
        .output()
        .expect("run fio");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{level}: fio exited with {}\nstderr: {}\nstdout: {text}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json_start = text.find('{').unwrap_or_else(|| panic!("{level}: no JSON in fio's output: {text}"));
    let report: serde_json::Value = serde_json::from_str(&text[json_start..]).unwrap_or_else(|e| panic!("{level}: fio JSON: {e}"));
    let jobs = report["jobs"].as_array().unwrap_or_else(|| panic!("{level}: no jobs in fio's JSON"));
    assert_eq!(jobs.len(), 1, "{level}: one fio job expected");
    let job = &jobs[0];
    assert_eq!(job["error"].as_u64(), Some(0), "{level}: fio reports error {}", job["error"]);
    let io_bytes = |direction: &str| job[direction]["io_bytes"].as_u64().unwrap_or(0);
    assert!(io_bytes("write") > 0, "{level}: fio wrote nothing");
    // The verify pass reads back every byte written, on top of the reads of the mix.
    assert!(
        io_bytes("read") > io_bytes("write"),
        "{level}: fio read {} bytes, less than the {} it wrote and should have verified",
        io_bytes("read"),
        io_bytes("write")
    );
    daemon.stop();
}

#[test]
fn restart_keeps_the_vd_and_its_data_with_drives_listed_in_any_order() {
    let scratch = Scratch::new("restart");
    let files: Vec<String> = (0..4).map(|i| scratch.sparse_file(&format!("drive-{i}.img"), 256 * MIB).display().to_string()).collect();
    let image = scratch.join("image.raw");
    write_random_image(&image, 64 * MIB, 5);

    let daemon = Daemon::start(&scratch, &files);
    let created = daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    let drives_created: Vec<DriveView> = daemon.get("/api/v1/drives");
    daemon.stop();

    let reversed: Vec<String> = files.iter().rev().cloned().collect();
    for (order, drives) in [("the same order", &files), ("reverse order", &reversed)] {
        let daemon = Daemon::start(&scratch, drives);
        let vd = daemon.vd_named("db");
        let shape = |vd: &VdView| (vd.level.clone(), vd.size_bytes, vd.member_slots.clone());
        assert_eq!(shape(&vd), shape(&created), "restarted with the drives in {order}: VD (level, size, slots) changed");
        assert_eq!(vd.state, "Optl", "restarted with the drives in {order}: VD state");
        let drives_now: Vec<DriveView> = daemon.get("/api/v1/drives");
        let identity = |drives: &[DriveView]| drives.iter().map(|d| (d.slot, d.drive_id.clone(), d.source.clone())).collect::<Vec<_>>();
        assert_eq!(identity(&drives_now), identity(&drives_created), "restarted with the drives in {order}: (slot, drive id, path) moved");
        assert_export_starts_with(&daemon.unix_uri("db"), &image, vd.size_bytes);
        daemon.stop();
    }
}

#[test]
fn raid5_with_a_drive_set_offline_serves_correct_data_and_takes_it_back_through_a_resync() {
    const OFFLINE_SLOT: u32 = 2;
    let scratch = Scratch::new("offline");
    let daemon = Daemon::start(&scratch, &mem_drives(4, "68MiB"));
    let vd = daemon.create_vd("r5", &[0, 1, 2, 3], "db");
    let uri = daemon.unix_uri("db");
    let written_optimal = scratch.join("optimal.raw");
    let written_degraded = scratch.join("degraded.raw");
    write_random_image(&written_optimal, vd.size_bytes, 6);
    write_random_image(&written_degraded, vd.size_bytes, 7);
    nbdcopy_in(&written_optimal, &uri);

    cli_set_drive(&daemon, OFFLINE_SLOT, "offline")
        .unwrap_or_else(|refusal| panic!("storc /c0/s{OFFLINE_SLOT} set offline refused:\n{refusal}"));
    let degraded_states = ["Onln", "Onln", "Offln", "Onln"];
    check_vd_state(&daemon, "after set offline", "Dgrd", &degraded_states);
    assert_export_starts_with(&uri, &written_optimal, vd.size_bytes);

    nbdcopy_in(&written_degraded, &uri);
    assert_export_starts_with(&uri, &written_degraded, vd.size_bytes);
    // The control: the comparison sees that the degraded writes replaced the first image.
    assert!(
        export_difference(&uri, &written_optimal, vd.size_bytes).is_some(),
        "the export still holds the first image after the degraded writes"
    );

    // The member missed the writes above: it comes back through a resync of the regions
    // written meanwhile (a re-add), never straight into service with stale strips.
    cli_set_drive(&daemon, OFFLINE_SLOT, "online").unwrap_or_else(|refusal| panic!("set online (re-add) refused:\n{refusal}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while daemon.vd_named("db").state != "Optl" {
        assert!(std::time::Instant::now() < deadline, "the re-added member never came back: {:?}", daemon.vd_named("db"));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check_vd_state(&daemon, "after the re-add", "Optl", &["Onln"; 4]);
    assert_export_starts_with(&uri, &written_degraded, vd.size_bytes);
    // What the re-added member holds is right: read with another member out.
    cli_set_drive(&daemon, 0, "offline").unwrap_or_else(|refusal| panic!("set offline refused:\n{refusal}"));
    assert_export_starts_with(&uri, &written_degraded, vd.size_bytes);
    daemon.stop();
}

fn check_vd_state(daemon: &Daemon, when: &str, state: &str, member_states: &[&str]) {
    let vd = daemon.vd_named("db");
    assert_eq!(vd.state, state, "{when}: VD state");
    assert_eq!(vd.member_states, member_states, "{when}: member states of slots {:?}", vd.member_slots);
}

/// `storc /c0/sSLOT set STATE --api ...`: Ok, or the refusal (exit 1) with the CLI's output.
fn cli_set_drive(daemon: &Daemon, slot: u32, state: &str) -> Result<(), String> {
    let output = Command::new(env!("CARGO_BIN_EXE_storc"))
        .args([&format!("/c0/s{slot}"), "set", state, "--api"])
        .arg(daemon.api_socket())
        .output()
        .expect("run the storc CLI");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    match output.status.code() {
        Some(0) => Ok(()),
        Some(1) => Err(text),
        _ => panic!("storc /c0/s{slot} set {state}: {}; expected 0 (success) or 1 (refused)\n{text}", output.status),
    }
}

#[test]
fn embedded_default_is_raid5_on_seven_sparse_files_and_a_global_hot_spare() {
    const DRIVE_COUNT: usize = 8;
    const DRIVE_BYTES: u64 = 8 * GIB;
    const ALLOCATED_BYTES_MAX: u64 = 64 * MIB;
    require_tool("nbdinfo", "libnbd-bin");
    let scratch = Scratch::new("default");
    let daemon = Daemon::start(&scratch, &[]);
    eprintln!("the embedded default answered after {:?}", daemon.startup);

    let files: Vec<_> = (0..DRIVE_COUNT).map(|i| scratch.data_dir().join(format!("drive-{i}.img"))).collect();
    let allocated_bytes = |files: &[std::path::PathBuf]| -> u64 {
        use std::os::unix::fs::MetadataExt;
        files.iter().map(|f| std::fs::metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())).blocks() * 512).sum()
    };
    for file in &files {
        let len_bytes = std::fs::metadata(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).len();
        assert_eq!(len_bytes, DRIVE_BYTES, "{}: apparent size", file.display());
    }
    let used_bytes = allocated_bytes(&files);
    assert!(
        used_bytes < ALLOCATED_BYTES_MAX,
        "the default drives use {used_bytes} bytes of disk; sparse files should stay under {ALLOCATED_BYTES_MAX}"
    );

    let first = daemon.controller();
    check_default_layout(&first, "first start");
    let v0 = &first.vds[0];
    let info = stdout(&run(Command::new("nbdinfo").arg(daemon.unix_uri("v0"))));
    assert_eq!(nbdinfo_export_size(&info), v0.size_bytes, "nbdinfo's size of v0 against the API's");
    daemon.stop();

    let daemon = Daemon::start(&scratch, &[]);
    let second = daemon.controller();
    check_default_layout(&second, "second start");
    assert_eq!(second.controller_id, first.controller_id, "the second start should find the first start's controller");
    assert_eq!(second.vds[0].size_bytes, v0.size_bytes, "v0's size after a restart");
    daemon.stop();
    let used_bytes = allocated_bytes(&files);
    assert!(used_bytes < ALLOCATED_BYTES_MAX, "after two starts the default drives use {used_bytes} bytes of disk");
}

fn check_default_layout(controller: &common::api_types::ControllerView, when: &str) {
    let vds: Vec<(&str, &str, &str)> = controller.vds.iter().map(|v| (v.name.as_str(), v.level.as_str(), v.state.as_str())).collect();
    assert_eq!(vds, [("v0", "RAID5", "Optl")], "{when}: the default VDs (name, level, state)");
    assert_eq!(controller.vds[0].member_slots, (0..7).collect::<Vec<u32>>(), "{when}: v0's member slots");
    let states: Vec<(u32, &str)> = controller.drives.iter().map(|d| (d.slot, d.state.as_str())).collect();
    let expected: Vec<(u32, &str)> = (0..8).map(|slot| (slot, if slot == 7 { "GHS" } else { "Onln" })).collect();
    assert_eq!(states, expected, "{when}: drive states by slot");
}

#[test]
fn refused_requests_change_nothing() {
    let scratch = Scratch::new("refused");
    let daemon = Daemon::start(&scratch, &mem_drives(5, "64MiB"));
    daemon.create_vd("r1", &[3, 4], "logs");
    let before = daemon.controller();
    let cases = [
        (create_vd_body("r5", &[0, 1], "db"), 400, "RAID5 needs 3 to 32 drives; got 2: slots 0, 1"),
        (create_vd_body("r5", &[0, 1, 3], "db"), 409, "slot 3 is a member of v0; a new VD needs unconfigured good (UGood) drives"),
        (create_vd_body("r5", &[0, 1, 2], "logs"), 409, "VD name \"logs\" is used by v0; names are NBD export names and must be unique"),
    ];
    for (body, status, message) in &cases {
        let what = format!("POST /api/v1/vds {} over slots {:?} named {:?}", body.level, body.drives, body.name);
        let error = daemon.api("POST", "/api/v1/vds", Some(body)).expect_error(*status, &what);
        assert_eq!(error, *message, "{what}: error message");
    }
    let after = daemon.controller();
    assert_eq!(after.generation, before.generation, "refused requests changed the configuration generation");
    assert_eq!(after.vds, before.vds, "refused requests changed the VDs");
    assert_eq!(after.drives, before.drives, "refused requests changed the drives");
    daemon.stop();
}

/// Regression (issue 8): unknown fields were ignored, so a typo (`write_polcy`) silently did
/// nothing. They are refused, naming the field and the fields allowed, and change nothing; so is
/// `force` with any state but online.
#[test]
fn unknown_fields_in_a_request_are_refused_by_name() {
    let scratch = Scratch::new("unknown-fields");
    let daemon = Daemon::start(&scratch, &mem_drives(4, "64MiB"));
    daemon.create_vd("r1", &[0, 1], "db");
    let before = daemon.controller();
    let cases = [
        (
            "POST",
            "/api/v1/vds",
            r#"{"level":"r1","drives":[2,3],"colour":"red"}"#,
            "unknown field `colour`, expected one of `level`, `drives`",
        ),
        ("PATCH", "/api/v1/vds/0", r#"{"write_polcy":"wb"}"#, "unknown field `write_polcy`, expected one of `write_policy`, `read_policy`"),
        ("POST", "/api/v1/drives/1/state", r#"{"state":"offline","forced":true}"#, "unknown field `forced`, expected `state` or `force`"),
        ("POST", "/api/v1/drives/1/state", r#"{"state":"offline","force":true}"#, "force goes only with the state online, not \"offline\""),
        (
            "PATCH",
            "/api/v1/controller",
            r#"{"rebuild_rate":50}"#,
            "unknown field `rebuild_rate`, expected one of `auto_rebuild`, `rebuild_rate_percent`, `copyback`",
        ),
        ("POST", "/api/v1/drives/2/hotspare", r#"{"drive_groups":[],"slot":2}"#, "unknown field `slot`, expected `drive_groups`"),
        ("DELETE", "/api/v1/vds/0?forse=true", "", "unknown field `forse`, expected `force`"),
    ];
    for (method, path, body, expected) in cases {
        let reply = http(&daemon.api_socket(), method, path, Some(body)).expect("an answer");
        let error = reply.expect_error(400, &format!("{method} {path} {body}"));
        assert!(error.contains(expected), "{method} {path} {body}: the error should name the field and the allowed ones: {error}");
    }
    let after = daemon.controller();
    assert_eq!(after.generation, before.generation, "refused requests changed the configuration generation");
    assert_eq!(after.vds, before.vds, "refused requests changed the VDs");
    assert_eq!(after.drives, before.drives, "refused requests changed the drives");
    daemon.stop();
}
