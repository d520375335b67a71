//! SSD caching (CacheCade, write-through) against the real daemon: a RAID5 `db` of three file
//! drives cached by a RAID1 cache VD of two more, made and assigned with storcli's commands.
//! The cache VD is not exported; reads of the image twice promote it and the third is served
//! from the cache VD; after kill -9 the daemon comes back with the same caching and the image
//! (cold), after a clean stop warm with the same lines;
//! with one of the cache's drives offline, serving and new writes go on and read back.

mod common;

use common::api_types::VdView;
use common::{export_difference, nbdcopy_in, require_tool, write_random_image, Daemon, Scratch, MIB};
use std::process::Command;

const DRIVE_BYTES: u64 = 64 * MIB;

fn vd(daemon: &Daemon, id: u32) -> VdView {
    daemon.get::<VdView>(&format!("/api/v1/vds/{id}"))
}

fn assert_image(daemon: &Daemon, image: &std::path::Path, size_bytes: u64, when: &str) {
    if let Some(difference) = export_difference(&daemon.unix_uri("db"), image, size_bytes) {
        panic!("{when}: {difference}");
    }
}

#[test]
fn a_cache_vd_serves_hot_reads_survives_kill_9_and_a_lost_drive_loses_nothing() {
    let scratch = Scratch::new("ssd-caching");
    let drives: Vec<String> = (0..5).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    let db = daemon.create_vd("r5", &[0, 1, 2], "db");
    let (code, refused) = daemon.cli_output(&["/c0", "add", "vd", "cachecade", "jbod", "drives=3"]);
    assert!(code != 0 && refused.contains("a cache VD is r0, r1 or r10"), "{refused}");
    daemon.cli(&["/c0", "add", "vd", "cachecade", "r1", "drives=3-4", "name=ssd", "assignvds=0"]);
    let cache = vd(&daemon, 1);
    assert!(cache.cache_vd, "{cache:?}");
    assert_eq!(vd(&daemon, 0).ssd_cache.and_then(|c| c.cache_vd), Some(1));
    require_tool("nbdinfo", "libnbd-bin");
    let listing = Command::new("nbdinfo").arg("--list").arg(daemon.unix_uri("")).output().expect("nbdinfo --list");
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("export=\"db\"") && !listing.contains("export=\"ssd\""), "the cache VD is not exported:\n{listing}");

    let image = scratch.join("image.raw");
    write_random_image(&image, db.size_bytes, 31);
    nbdcopy_in(&image, &daemon.unix_uri("db"));
    // nbdcopy reads sequentially: the first 4 MiB of each pass count, the rest bypasses. Two
    // passes promote the lines of the first 4 MiB; the third pass hits them.
    for pass in 0..3 {
        assert_image(&daemon, &image, db.size_bytes, &format!("pass {pass}"));
    }
    let stats = vd(&daemon, 1).ssd_cache.expect("a cache VD's counters");
    assert!(stats.promotions > 0 && stats.read_hits > 0 && stats.read_bypassed > 0, "{stats:?}");
    let show = daemon.cli(&["/c0/v1", "show", "all"]);
    assert!(show.contains("SSD Caching") && show.contains("cache VD (write-through) of v0"), "{show}");
    let summary = daemon.cli(&["/c0", "show"]);
    assert!(summary.contains("CACHECADE") && summary.contains("CC:RAID1"), "{summary}");

    daemon.kill9();
    let daemon = Daemon::start(&scratch, &drives);
    assert_eq!(vd(&daemon, 0).ssd_cache.and_then(|c| c.cache_vd), Some(1), "caching comes back from the metadata");
    assert_image(&daemon, &image, db.size_bytes, "after kill -9");
    assert_eq!(vd(&daemon, 0).ssd_cache.map(|c| c.lines_valid), Some(0), "cold after kill -9");
    // Promoted again, then a clean stop: the next start is warm with the same lines.
    assert_image(&daemon, &image, db.size_bytes, "after kill -9, second pass");
    let warm_lines = vd(&daemon, 0).ssd_cache.map_or(0, |c| c.lines_valid);
    assert!(warm_lines > 0);
    daemon.stop();
    let daemon = Daemon::start(&scratch, &drives);
    assert_eq!(vd(&daemon, 0).ssd_cache.map(|c| c.lines_valid), Some(warm_lines), "warm after a clean stop");
    assert_image(&daemon, &image, db.size_bytes, "after a clean stop");
    assert!(vd(&daemon, 1).ssd_cache.is_some_and(|c| c.read_hits > 0), "served from the cache at once");

    // One of the cache VD's drives goes offline: it runs degraded, the VD goes on.
    daemon.cli(&["/c0/s4", "set", "offline"]);
    assert_eq!(vd(&daemon, 1).state, "Dgrd");
    let newer = scratch.join("newer.raw");
    write_random_image(&newer, db.size_bytes, 32);
    nbdcopy_in(&newer, &daemon.unix_uri("db"));
    for pass in 0..2 {
        assert_image(&daemon, &newer, db.size_bytes, &format!("with a cache drive offline, pass {pass}"));
    }
    daemon.cli(&["/c0/v0", "set", "ssdcaching=off"]);
    assert!(vd(&daemon, 0).ssd_cache.is_none());
    daemon.cli(&["/c0/v1", "del"]);
    assert_image(&daemon, &newer, db.size_bytes, "after the cache VD was deleted");
    daemon.stop();
}
