//! Issue 14, part 4: `scripts/build-deb` packages the storc this test suite built; the package
//! installs into a scratch root with dpkg (no container: docker does not run here), and from
//! there `storc --help`, `man storc` (by name, MANPATH pointed at the root), the subcommands'
//! pages, the bash completion and the systemd unit (`systemd-analyze verify`) work as a user
//! would use them.

mod common;

use common::{run, stdout, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn require(tool: &str, debian_package: &str) {
    nbd::testing::require_tool(tool, debian_package, "builds, installs or checks the Debian package with it");
}

fn text_of(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `man -P cat ARGS` with MANPATH set to the root's pages only, as a user reads them; lines
/// wide enough that no paragraph wraps (nor hyphenates) inside the words a test looks for.
fn man(root: &Path, args: &[&str]) -> String {
    let output = run(Command::new("man").env("MANPATH", root.join("usr/share/man")).env("MANWIDTH", "2000").args(["-P", "cat"]).args(args));
    stdout(&output)
}

/// Builds the package of this build's binary; its path.
fn build_deb(scratch: &Scratch) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-deb");
    let out = scratch.join("out");
    let built = run(Command::new(&script).args(["--binary", env!("CARGO_BIN_EXE_storc"), "--out"]).arg(&out));
    let deb = PathBuf::from(stdout(&built).trim());
    let arch = stdout(&run(Command::new("dpkg").arg("--print-architecture"))).trim().to_string();
    assert_eq!(deb, out.join(format!("storc_{}_{arch}.deb", env!("CARGO_PKG_VERSION"))), "the script prints the package it made");
    assert!(!text_of(&built).contains("warning"), "build-deb warned:\n{}", text_of(&built));
    let fields = stdout(&run(Command::new("dpkg-deb").arg("--field").arg(&deb).args(["Package", "Version", "Depends"])));
    assert!(fields.contains("Package: storc\n") && fields.contains(&format!("Version: {}\n", env!("CARGO_PKG_VERSION"))), "{fields}");
    assert!(fields.contains("Depends: libc6 (>= "), "dpkg-shlibdeps names the C library: {fields}");
    deb
}

/// Installs `deb` with dpkg into an empty root of its own (its own package database): the
/// root's paths, as the package lays them out.
fn install_into_scratch_root(scratch: &Scratch, deb: &Path) -> PathBuf {
    let root = scratch.join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    // The root's database knows no libc6: the dependency is checked above, not here. A
    // minimized image's dpkg.cfg.d may leave man pages out (path-exclude): this root takes all.
    run(Command::new("dpkg").arg("--root").arg(&root).args(["--force-depends", "--path-include=*", "-i"]).arg(deb));
    let status = stdout(&run(Command::new("dpkg").arg("--root").arg(&root).args(["-s", "storc"])));
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(status.contains("Conffiles:\n /etc/default/storc "), "the defaults are a conffile, kept across upgrades:\n{status}");
    root
}

#[test]
fn the_deb_installs_into_a_scratch_root_where_storc_its_man_pages_completions_and_unit_work() {
    for (tool, package) in
        [("dpkg-deb", "dpkg"), ("dpkg-shlibdeps", "dpkg-dev"), ("strip", "binutils"), ("man", "man-db"), ("systemd-analyze", "systemd")]
    {
        require(tool, package);
    }
    let scratch = Scratch::new("deb");
    let deb = build_deb(&scratch);
    let root = install_into_scratch_root(&scratch, &deb);

    let storc = root.join("usr/bin/storc");
    let help = stdout(&run(Command::new(&storc).arg("--help")));
    for words in
        ["serve", "bench", "storc [--api PATH|tcp:HOST:PORT|https://HOST:PORT [--api-ca FILE]] /c0[/vN", "man storc lists every object"]
    {
        assert!(help.contains(words), "storc --help lacks {words:?}:\n{help}");
    }
    let version = stdout(&run(Command::new(&storc).arg("--version")));
    assert_eq!(version.trim(), format!("storc {}", env!("CARGO_PKG_VERSION")));

    let page = man(&root, &["storc"]);
    for words in
        ["storc - A RAID controller in software", "OBJECTS", "/c0/vN: virtual drive N", "start cc [repair|report]", "storc-serve(1)"]
    {
        assert!(page.contains(words), "man storc lacks {words:?}:\n{page}");
    }
    assert_eq!(man(&root, &["-l", &root.join("usr/share/man/man1/storc.1.gz").display().to_string()]), page, "man -l reads the same page");
    let serve = man(&root, &["storc-serve"]);
    assert!(serve.contains("--metrics-any-user") && serve.contains("--data-dir"), "man storc-serve:\n{serve}");

    // Bash completes a subcommand and a flag from the installed script.
    let completion = root.join("usr/share/bash-completion/completions/storc");
    let script = format!(
        "source {} && COMP_WORDS=(storc se) COMP_CWORD=1 && _storc storc se storc && echo \"${{COMPREPLY[@]}}\" \
         && COMP_WORDS=(storc serve --metr) COMP_CWORD=2 && _storc storc --metr serve && echo \"${{COMPREPLY[@]}}\"",
        completion.display()
    );
    assert_eq!(stdout(&run(Command::new("bash").args(["-c", &script]))), "serve\n--metrics-any-user\n");

    verify_unit(&scratch, &root);
}

/// `systemd-analyze verify` on the installed unit finds nothing to say. It checks that
/// ExecStart's program exists and that the Documentation= pages open, so the copy it reads runs
/// the root's binary and man looks in the root's pages.
fn verify_unit(scratch: &Scratch, root: &Path) {
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/storc.service")).unwrap();
    let exec = "ExecStart=/usr/bin/storc serve --data-dir /var/lib/storc $STORC_OPTIONS";
    assert!(unit.contains(exec), "the unit runs storc serve on /var/lib/storc:\n{unit}");
    for hardening in ["ProtectSystem=strict", "PrivateTmp=yes", "NoNewPrivileges=yes", "Restart=on-failure", "StateDirectory=storc"] {
        assert!(unit.contains(&format!("\n{hardening}\n")), "the unit lacks {hardening}");
    }
    let dir = scratch.join("unit");
    std::fs::create_dir_all(&dir).unwrap();
    let rooted = unit.replace("ExecStart=/usr/bin/storc", &format!("ExecStart={}", root.join("usr/bin/storc").display()));
    std::fs::write(dir.join("storc.service"), rooted).unwrap();
    let output = Command::new("systemd-analyze")
        .args(["verify"])
        .arg(dir.join("storc.service"))
        .env("MANPATH", root.join("usr/share/man"))
        .output()
        .expect("run systemd-analyze");
    assert!(
        output.status.success() && text_of(&output).trim().is_empty(),
        "systemd-analyze verify: {}\n{}",
        output.status,
        text_of(&output)
    );
    let defaults = std::fs::read_to_string(root.join("etc/default/storc")).unwrap();
    assert!(defaults.contains("\nSTORC_OPTIONS=\"--nbd-listen none --api-listen 127.0.0.1:9290 --metrics-any-user\"\n"), "{defaults}");
}
