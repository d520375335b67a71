//! Issue 14, part 3: NBD over TLS on the daemon's TCP listener. nbdinfo and qemu-img reach a VD
//! over `nbds://` with a PSK file made by psktool; with `--tls require` a plaintext client is
//! refused before it sees any export; `--tls on` serves both; data written over TLS reads back;
//! flags that cannot work are refused with what is allowed. The tools must be installed
//! (`apt-get install -y libnbd-bin qemu-utils gnutls-bin`); a missing one fails the test.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `psktool -u USER -p FILE`, as a user would make the key file.
fn psk_file(scratch: &Scratch, name: &str, user: &str) -> PathBuf {
    require_tool("psktool", "gnutls-bin");
    let path = scratch.join(name);
    run(Command::new("psktool").args(["-u", user, "-p"]).arg(&path));
    path
}

fn nbds_uri(daemon: &Daemon, user: &str, export: &str, keys: &Path) -> String {
    format!("nbds://{user}@{}/{export}?tls-psk-file={}", daemon.nbd_tcp_address(), keys.display())
}

fn tls_daemon(scratch: &Scratch, mode: &str, keys: &Path) -> Daemon {
    let keys = keys.display().to_string();
    let daemon = Daemon::start_with_args(scratch, &mem_drives(2, "64MiB"), &["--tls", mode, "--tls-psk-file", &keys]);
    daemon.create_vd("r1", &[0, 1], "db");
    daemon
}

/// Runs a command that must fail; what it printed.
fn run_failing(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(!output.status.success(), "{command:?} should have failed:\n{}", text_of(&output));
    text_of(&output)
}

#[test]
fn nbdinfo_and_qemu_img_reach_a_vd_over_nbds_and_plaintext_is_refused_with_require() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-img", "qemu-utils");
    let scratch = Scratch::new("nbd-tls-require");
    let keys = psk_file(&scratch, "keys.psk", "alice");
    let daemon = tls_daemon(&scratch, "require", &keys);
    let size_bytes = daemon.vd_named("db").size_bytes;

    let info = stdout(&run(Command::new("nbdinfo").arg(nbds_uri(&daemon, "alice", "db", &keys))));
    assert!(info.contains(&format!("export-size: {size_bytes}")), "{info}");
    // qemu reads keys.psk from the directory it is given.
    let object = format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice", keys.parent().unwrap().display());
    let (host, port) = daemon.nbd_tcp_address().split_once(':').unwrap();
    let image_opts = format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export=db,tls-creds=tls0");
    let qemu_info = stdout(&run(Command::new("qemu-img").args(["info", "--object", &object, "--image-opts", &image_opts])));
    assert!(qemu_info.contains(&format!("({size_bytes} bytes)")), "{qemu_info}");

    // Written over TLS by qemu-img, read back over TLS by nbdcopy and over the Unix socket.
    let image = scratch.join("image.raw");
    write_random_image(&image, 8 * MIB, 14);
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "--object", &object, "--target-image-opts"])
        .arg(&image)
        .arg(&image_opts));
    assert_export_starts_with(&nbds_uri(&daemon, "alice", "db", &keys), &image, size_bytes);
    assert_export_starts_with(&daemon.unix_uri("db"), &image, size_bytes);

    // A plaintext client gets no export list and no export.
    let listing = run_failing(Command::new("nbdinfo").arg("--list").arg(daemon.tcp_uri("")));
    assert!(!listing.contains("db"), "a plaintext client saw the exports:\n{listing}");
    let plain = run_failing(Command::new("nbdinfo").arg(daemon.tcp_uri("db")));
    assert!(plain.to_lowercase().contains("tls"), "nbdinfo should say TLS is required:\n{plain}");
    // The wrong key is refused too.
    let other_keys = psk_file(&scratch, "other.psk", "alice");
    let wrong = run_failing(Command::new("nbdinfo").arg(nbds_uri(&daemon, "alice", "db", &other_keys)));
    assert!(!wrong.contains("export-size"), "{wrong}");

    let log = daemon.log();
    let banner_uri = nbds_uri(&daemon, "alice", "v0", &std::fs::canonicalize(&keys).unwrap());
    assert!(log.contains(&format!("nbdinfo '{banner_uri}'")), "the banner should show {banner_uri}:\n{log}");
    assert!(log.contains("TLS required (--tls require; plaintext clients see no export) with PSK credentials"), "{log}");
    assert!(
        !log.contains("has no TLS") && !log.contains("serves plaintext clients"),
        "--tls require must not warn about plaintext:\n{log}"
    );
    let endpoints = daemon.controller().nbd_endpoints;
    assert!(endpoints.iter().any(|e| e.starts_with("nbds://")) && !endpoints.iter().any(|e| e.starts_with("nbd://")), "{endpoints:?}");
    daemon.stop();
}

#[test]
fn tls_on_serves_plaintext_and_tls_clients_and_warns_about_plaintext() {
    require_tool("nbdinfo", "libnbd-bin");
    let scratch = Scratch::new("nbd-tls-on");
    let keys = psk_file(&scratch, "keys.psk", "alice");
    let daemon = tls_daemon(&scratch, "on", &keys);
    for uri in [daemon.tcp_uri("db"), nbds_uri(&daemon, "alice", "db", &keys)] {
        let info = stdout(&run(Command::new("nbdinfo").arg(&uri)));
        assert!(info.contains("export-size:"), "{uri}: {info}");
    }
    let log = daemon.log();
    assert!(log.contains("serves plaintext clients too (--tls on)") && log.contains("--tls require"), "{log}");

    // storc's own benchmark client speaks nbds:// with the PSK.
    let json = scratch.join("point.json");
    let target = nbds_uri(&daemon, "alice", "db", &keys);
    let bench = Command::new(env!("CARGO_BIN_EXE_storc"))
        .args(["bench", "run", "review-random-read", "--block", "4K", "--qd", "8", "--duration", "0.3", "--ramp", "0"])
        .args(["--target", &target, "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(bench.status.success(), "storc bench run --target {target}: {}", text_of(&bench));
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let iops = results["patterns"][0]["points"][0]["iops"].as_f64().unwrap_or(0.0);
    assert!(iops > 0.0, "storc bench over nbds:// measured {iops} IOPS: {results}");
    daemon.stop();
}

#[test]
fn tls_flags_that_cannot_work_are_refused_before_anything_is_created() {
    let scratch = Scratch::new("nbd-tls-flags");
    let maybe = serve_refused(&scratch, &["--tls", "maybe"], 2);
    assert!(maybe.contains("invalid value 'maybe' for '--tls <TLS>'") && maybe.contains("[possible values: off, on, require]"), "{maybe}");
    let missing = serve_refused(&scratch, &["--tls", "require"], 1);
    assert!(
        missing.contains("--tls require needs credentials; allowed: --tls-psk-file FILE (made with: psktool -u USER -p FILE)"),
        "{missing}"
    );
    let malformed = scratch.join("bad.psk");
    std::fs::write(&malformed, "alice:00ff\nbob 1234\n").unwrap();
    let bad = serve_refused(&scratch, &["--tls", "on", "--tls-psk-file", &malformed.display().to_string()], 1);
    let expected =
        format!("--tls-psk-file: PSK file {}: line 2: no ':' between user name and key; allowed: USERNAME:HEXKEY", malformed.display());
    assert!(bad.contains(&expected), "{bad}");
    let no_tcp =
        serve_refused(&scratch, &["--tls", "require", "--tls-psk-file", &malformed.display().to_string(), "--nbd-listen", "none"], 1);
    assert!(no_tcp.contains("which --nbd-listen none turns off"), "{no_tcp}");
    assert!(!scratch.data_dir().exists(), "a refused start created {}", scratch.data_dir().display());
}
