//! kill -9 of the real daemon while a client writes to a write-back VD whose cache is protected
//! by a journal file (issue 11): after every restart, every write the daemon acknowledged must
//! read back (under WB an acknowledgement means the journal has it), whether or not a FLUSH or
//! FUA followed; a write cut short by the kill may read as its old or its new contents.
//!
//! A mirrored pair of journals loses one leg amid the writes and a kill -9 follows: nothing
//! acknowledged is lost either.
//!
//! A slot's drive made the journal (`/c0/sN set journal`) is found again after a kill -9 with no
//! `--journal` option: the configuration on the drives says where the journal is.
//!
//! A write-back RAID5 set to send sequential streams around the journal (`set seqcutoff=1MiB`)
//! takes a stream of 1 MiB writes, row after row, mixed with small random writes over the same
//! rows that stay in the journal; kill -9 after kill -9, nothing acknowledged is lost (a replay
//! must never lay an older record over a row the stream wrote around the journal).
//!
//! `STORC_WB_KILLS` sets the number of kills (20 by default, what CI runs); `scripts/wb-kills`
//! runs 1000. `STORC_WB_KILLS_SEED` changes the seeded timing.

mod common;

use common::api_types::{JournalView, SetVd, VdView};
use common::{block_contents, Daemon, Rng, Scratch, MIB};
use nbd::{Client, ClientConfig, NbdUri};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DRIVE_COUNT: u32 = 5;
const DRIVE_BYTES: u64 = 96 * MIB;
const BLOCK_BYTES: usize = 16 << 10;
const BLOCK_COUNT: u64 = 512;
const KILLS_DEFAULT: u32 = 20;

/// What a block may hold: the version last acknowledged, and one written after it that the
/// kill may have cut short.
#[derive(Default, Clone, Copy)]
struct BlockModel {
    acknowledged: u64,
    in_flight: Option<u64>,
}

#[derive(Default)]
struct Tally {
    /// Writes acknowledged: each had to survive.
    acknowledged: u64,
    /// Of them, FUA writes and writes a completed FLUSH covered.
    fua_or_flushed: u64,
}

/// Kills to run: `STORC_WB_KILLS`, or what CI runs.
fn kills_from_env() -> u32 {
    std::env::var("STORC_WB_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(KILLS_DEFAULT)
}

/// `count` sparse member files `d0.img`, `d1.img`, ... of `DRIVE_BYTES` in `scratch`.
fn member_files(scratch: &Scratch, count: u32) -> Vec<String> {
    (0..count).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect()
}

fn contents(block: u64, version: u64) -> Vec<u8> {
    block_contents(block, version, BLOCK_BYTES)
}

/// Blocks are spread over the VD, most of them sharing rows with others (partial-stripe
/// writes), some of them neighbours (merged destaging).
fn block_offset_bytes(block: u64) -> u64 {
    (block / 4) * (256 << 10) + (block % 4) * BLOCK_BYTES as u64
}

fn client(daemon: &Daemon, export: &str) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: export.to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("NBD connect to {export}: {e}"))
}

/// Whether `block` holds its acknowledged version or the one in flight at the kill (`bytes`
/// read back); its model then holds what it found.
fn block_survived(block: u64, bytes: &[u8], state: &mut BlockModel, kill: u32) -> bool {
    let allowed = [Some(state.acknowledged), state.in_flight];
    match allowed.iter().flatten().find(|v| bytes == contents(block, **v)) {
        Some(&found) => {
            *state = BlockModel { acknowledged: found, in_flight: None };
            true
        }
        None => {
            let header = (u64::from_le_bytes(bytes[..8].try_into().unwrap()), u64::from_le_bytes(bytes[8..16].try_into().unwrap()));
            eprintln!("kill {kill}: block {block} holds none of versions {allowed:?}; its header says (block, version) = {header:?}");
            *state = BlockModel { acknowledged: header.1, in_flight: None };
            false
        }
    }
}

/// Reads every block: each must hold its acknowledged version or the one in flight at the kill.
/// Returns the blocks whose acknowledged write was lost.
fn verify(daemon: &Daemon, model: &mut [BlockModel], kill: u32) -> u64 {
    let mut nbd = client(daemon, "wb");
    let mut lost = 0;
    for (block, state) in model.iter_mut().enumerate() {
        let block = block as u64;
        let data =
            nbd.read(block_offset_bytes(block), BLOCK_BYTES as u32).unwrap_or_else(|e| panic!("kill {kill}: read of block {block}: {e}"));
        lost += u64::from(!block_survived(block, &data, state, kill));
    }
    lost
}

/// Writes blocks in a seeded order, some FUA, with a FLUSH now and then, until `stop` or the
/// daemon is gone.
fn write_until_stopped(mut nbd: Client, model: Arc<Mutex<Vec<BlockModel>>>, tally: Arc<Mutex<Tally>>, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng(seed | 1);
    let mut since_flush = 0;
    while !stop.load(Ordering::SeqCst) {
        let block = rng.below(BLOCK_COUNT);
        let version = {
            let mut model = model.lock().unwrap();
            let state = &mut model[block as usize];
            let version = state.acknowledged + 1 + rng.below(1000);
            state.in_flight = Some(version);
            version
        };
        let fua = rng.below(8) == 0;
        if nbd.write(block_offset_bytes(block), &contents(block, version), fua).is_err() {
            return;
        }
        model.lock().unwrap()[block as usize] = BlockModel { acknowledged: version, in_flight: None };
        {
            let mut tally = tally.lock().unwrap();
            tally.acknowledged += 1;
            tally.fua_or_flushed += u64::from(fua);
        }
        since_flush += u64::from(!fua);
        if rng.below(16) == 0 {
            if nbd.flush().is_err() {
                return;
            }
            tally.lock().unwrap().fua_or_flushed += since_flush;
            since_flush = 0;
        }
    }
}

/// A writer (`write_until_stopped`, `seed`) runs for `pause`, then `before_kill`, then kill -9;
/// returns once the writer saw the daemon go.
fn write_then_kill(
    daemon: Daemon,
    (model, tally): (&Arc<Mutex<Vec<BlockModel>>>, &Arc<Mutex<Tally>>),
    seed: u64,
    pause: Duration,
    before_kill: impl FnOnce(&Daemon),
) {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (nbd, model, tally, stop) = (client(&daemon, "wb"), Arc::clone(model), Arc::clone(tally), Arc::clone(&stop));
        std::thread::spawn(move || write_until_stopped(nbd, model, tally, seed, stop))
    };
    std::thread::sleep(pause);
    before_kill(&daemon);
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
}

fn set_write_back(daemon: &Daemon) {
    let body = SetVd { write_policy: Some("wb".into()), ..SetVd::default() };
    let reply = daemon.api("PATCH", "/api/v1/vds/0", Some(&body));
    assert!(reply.status < 300, "set wrcache=wb: {} {}", reply.status, reply.body);
}

#[test]
fn kill_9_of_a_write_back_vd_with_a_journal_never_loses_an_acknowledged_write() {
    let kills: u32 = kills_from_env();
    let seed: u64 = std::env::var("STORC_WB_KILLS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0xB0B);
    let scratch = Scratch::new("wb-kills");
    let drives = member_files(&scratch, DRIVE_COUNT);
    let journal = scratch.join("journal.img").display().to_string();
    let args = ["--journal", journal.as_str(), "--cache-size", "64MiB"];
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    let vd: VdView = daemon.create_vd("r5", &(0..DRIVE_COUNT).collect::<Vec<_>>(), "wb");
    assert!(vd.size_bytes >= block_offset_bytes(BLOCK_COUNT));
    set_write_back(&daemon);
    let shown = daemon.cli(&["/c0/bbu", "show"]);
    assert!(shown.contains("Journal State = Optimal") && shown.contains("WB VDs run WB"), "{shown}");
    assert!(daemon.cli(&["/c0/vall", "show"]).contains("NRWBD"), "the Cache column says WB runs");
    daemon.stop();
    let model = Arc::new(Mutex::new(vec![BlockModel::default(); BLOCK_COUNT as usize]));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut rng = Rng(seed);
    let started = Instant::now();
    let (mut lost_total, mut replayed_total) = (0, 0);
    for kill in 0..=kills {
        let daemon = Daemon::start_with_args(&scratch, &drives, &args);
        let journal: JournalView = daemon.get("/api/v1/journal");
        assert_eq!(journal.state, "Optimal", "kill {kill}: {journal:?}");
        replayed_total += journal.replayed_records;
        let vd = daemon.vd_named("wb");
        assert_eq!((vd.write_policy_effective.as_str(), vd.state.as_str()), ("wb", "Optl"), "kill {kill}");
        lost_total += verify(&daemon, &mut model.lock().unwrap(), kill);
        if kill == kills {
            daemon.stop();
            break;
        }
        let pause = Duration::from_millis(30 + rng.below(470));
        write_then_kill(daemon, (&model, &tally), rng.next(), pause, |_| {});
    }
    let tally = tally.lock().unwrap();
    println!(
        "{kills} kill -9 of a WB VD with a journal in {:.1} s: {} acknowledged writes had to survive ({} of them FUA or flushed), {lost_total} lost; {replayed_total} writes replayed from the journal at the restarts",
        started.elapsed().as_secs_f64(),
        tally.acknowledged,
        tally.fua_or_flushed,
    );
    assert_eq!(lost_total, 0, "acknowledged writes lost");
    assert!(tally.acknowledged > u64::from(kills), "the writer wrote something between kills");
}

/// A mirrored pair of journal files: one leg's file is removed while a client writes under WB;
/// the pair goes Degraded and WB goes on; kill -9; a replacement file is given for that leg at
/// the restart, and every acknowledged write reads back, replayed from the surviving leg.
#[test]
fn a_mirrored_journal_survives_the_loss_of_one_leg_and_a_kill_9() {
    let scratch = Scratch::new("wb-mirror");
    let drives = member_files(&scratch, DRIVE_COUNT);
    let legs = [scratch.sparse_file("ja.img", 64 * MIB), scratch.sparse_file("jb.img", 64 * MIB)];
    let (ja, jb) = (legs[0].display().to_string(), legs[1].display().to_string());
    let args = ["--journal", ja.as_str(), "--journal", jb.as_str(), "--cache-size", "64MiB"];
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    daemon.create_vd("r5", &(0..DRIVE_COUNT).collect::<Vec<_>>(), "wb");
    set_write_back(&daemon);
    let shown = daemon.cli(&["/c0/bbu", "show"]);
    assert!(shown.contains("Journal State = Optimal") && shown.contains("mirrored pair"), "{shown}");

    let model = Arc::new(Mutex::new(vec![BlockModel::default(); BLOCK_COUNT as usize]));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (nbd, model, tally, stop) = (client(&daemon, "wb"), Arc::clone(&model), Arc::clone(&tally), Arc::clone(&stop));
        std::thread::spawn(move || write_until_stopped(nbd, model, tally, 7, stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(&legs[1]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let journal: JournalView = daemon.get("/api/v1/journal");
        if journal.state == "Degraded" {
            assert!(journal.legs[0].state == "Online" && journal.legs[1].state == "Failed", "{journal:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the removed leg was never noticed: {journal:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Acknowledgements wait until the metadata names the leg stale (the watcher persists that
    // within a look or two; longer when the members' flushes are slow), then go on.
    let degraded_at = Instant::now();
    let acknowledged_at_degraded = tally.lock().unwrap().acknowledged;
    while tally.lock().unwrap().acknowledged < acknowledged_at_degraded + 100 {
        assert!(degraded_at.elapsed() < Duration::from_secs(30), "writes did not go on with one leg");
        std::thread::sleep(Duration::from_millis(10));
    }
    let resumed_after = degraded_at.elapsed();
    assert!(daemon.cli(&["/c0/vall", "show"]).contains("NRWBD"), "a degraded pair keeps write-back");
    std::thread::sleep(Duration::from_millis(200));
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    let acknowledged = tally.lock().unwrap().acknowledged;

    // A replacement file for the lost leg.
    scratch.sparse_file("jb.img", 64 * MIB);
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    let journal: JournalView = daemon.get("/api/v1/journal");
    assert_eq!(journal.state, "Optimal", "{journal:?}");
    let lost = verify(&daemon, &mut model.lock().unwrap(), 1);
    println!(
        "mirrored journal: {acknowledged} acknowledged writes ({} after leg b was lost; 100 of them within {:.2} s of the loss), {} writes replayed from leg a, {lost} lost",
        acknowledged - acknowledged_at_degraded,
        resumed_after.as_secs_f64(),
        journal.replayed_records
    );
    assert_eq!(lost, 0, "acknowledged writes lost");
    daemon.stop();
}

/// `/c0/s5 set journal` on a running daemon with no `--journal`; WB writes; kill -9; the restart,
/// still without `--journal`, replays the journal from slot 5 and loses nothing.
#[test]
fn a_slot_drive_journal_is_replayed_after_a_kill_9_without_a_journal_option() {
    let scratch = Scratch::new("wb-slot-journal");
    let drives = member_files(&scratch, DRIVE_COUNT + 1);
    let args = ["--cache-size", "64MiB"];
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    daemon.create_vd("r5", &(0..DRIVE_COUNT).collect::<Vec<_>>(), "wb");
    set_write_back(&daemon);
    assert!(daemon.cli(&["/c0/bbu", "show"]).contains("Journal State = Missing"));
    let (code, refused) = daemon.cli_output(&["/c0/s0", "set", "journal"]);
    assert!(code != 0 && refused.contains("slot 0 is Onln; only an unconfigured good (UGood) drive can hold the journal"), "{refused}");
    let set = daemon.cli(&["/c0/s5", "set", "journal"]);
    assert!(set.contains("Set Journal Succeeded") && set.contains("slot 5"), "{set}");
    assert!(daemon.cli(&["/c0/s5", "show"]).contains("Jrnl"), "the drive shows its state");
    assert!(daemon.cli(&["/c0/vall", "show"]).contains("NRWBD"), "WB runs WB");

    let model = Arc::new(Mutex::new(vec![BlockModel::default(); BLOCK_COUNT as usize]));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (nbd, model, tally, stop) = (client(&daemon, "wb"), Arc::clone(&model), Arc::clone(&tally), Arc::clone(&stop));
        std::thread::spawn(move || write_until_stopped(nbd, model, tally, 11, stop))
    };
    std::thread::sleep(Duration::from_millis(400));
    daemon.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    let acknowledged = tally.lock().unwrap().acknowledged;

    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    let journal: JournalView = daemon.get("/api/v1/journal");
    assert_eq!((journal.state.as_str(), journal.source.as_deref()), ("Optimal", Some("slot 5")), "{journal:?}");
    let lost = verify(&daemon, &mut model.lock().unwrap(), 1);
    println!("journal on slot 5: {acknowledged} acknowledged writes, {} writes replayed, {lost} lost", journal.replayed_records);
    assert_eq!(lost, 0, "acknowledged writes lost");
    assert!(acknowledged > 0, "the writer wrote something");
    daemon.stop();
}

/// Write-back SSD caching (issue 13): `wb` (RAID5 of three files) cached write-back by a RAID1
/// cache VD of two more. Its blocks are promoted, then a client writes them (they stay on the
/// cache VD, dirty) and the daemon is killed again and again: after each restart every
/// acknowledged write reads back, the dirty lines read back from the cache VD's table. Then one
/// cache SSD goes offline amid the writes, and a last kill -9 loses nothing either.
#[test]
fn kill_9_with_a_write_back_ssd_cache_never_loses_an_acknowledged_write() {
    let kills: u32 = kills_from_env() / 2;
    let scratch = Scratch::new("ssd-wb-kills");
    let drives = member_files(&scratch, DRIVE_COUNT);
    let daemon = Daemon::start(&scratch, &drives);
    daemon.create_vd("r5", &[0, 1, 2], "wb");
    daemon.cli(&["/c0", "add", "vd", "cachecade", "r1", "drives=3-4", "wb", "name=ssd", "assignvds=0"]);
    let shown = daemon.cli(&["/c0/v1", "show", "all"]);
    assert!(shown.contains("cache VD (write-back) of v0"), "{shown}");
    // Every block read until its line is held: a line is promoted at its second miss, and a
    // promotion may be dropped (its fill refused while the cache VD is busy, as on a loaded CI
    // machine), so the blocks are read again, pass after pass, until every line is held.
    let mut nbd = client(&daemon, "wb");
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = || daemon.get::<VdView>("/api/v1/vds/0").ssd_cache.map_or(0, |c| c.lines_valid);
    let mut passes = 0;
    while held() < BLOCK_COUNT / 4 {
        assert!(
            Instant::now() < deadline,
            "the blocks' {} lines were not promoted after {passes} passes: {} held",
            BLOCK_COUNT / 4,
            held()
        );
        for block in 0..BLOCK_COUNT {
            nbd.read(block_offset_bytes(block), BLOCK_BYTES as u32).expect("read");
        }
        passes += 1;
        std::thread::sleep(Duration::from_millis(if passes < 2 { 0 } else { 50 }));
    }
    drop(nbd);
    daemon.stop();

    let model = Arc::new(Mutex::new(vec![BlockModel::default(); BLOCK_COUNT as usize]));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut rng = Rng(0x55D);
    let (mut lost_total, mut dirty_at_restarts) = (0, 0);
    for kill in 0..=kills + 1 {
        let daemon = Daemon::start(&scratch, &drives);
        let vd = daemon.vd_named("wb");
        assert_eq!(vd.state, "Optl", "kill {kill}: {vd:?}");
        let cache = vd.ssd_cache.expect("still cached after the restart");
        dirty_at_restarts += cache.lines_dirty;
        lost_total += verify(&daemon, &mut model.lock().unwrap(), kill);
        if kill == kills + 1 {
            assert!(daemon.vd_named("ssd").state == "Dgrd", "the cache VD runs on one SSD");
            daemon.cli(&["/c0/v0", "set", "ssdcaching=off"]);
            lost_total += verify(&daemon, &mut model.lock().unwrap(), kill);
            daemon.stop();
            break;
        }
        let pause = Duration::from_millis(100 + rng.below(400));
        write_then_kill(daemon, (&model, &tally), rng.next(), pause, |daemon| {
            if kill == kills {
                // The last round: a cache SSD goes offline amid the writes, then the kill.
                daemon.cli(&["/c0/s4", "set", "offline"]);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    }
    let tally = tally.lock().unwrap();
    println!(
        "{} kill -9 with a write-back RAID1 SSD cache: {} acknowledged writes had to survive, {lost_total} lost; {dirty_at_restarts} dirty lines read back at the restarts",
        kills + 1,
        tally.acknowledged,
    );
    assert_eq!(lost_total, 0, "acknowledged writes lost");
    assert!(dirty_at_restarts > 0, "the kills found dirty lines on the cache VD: the test tested the write-back path");
}

/// The stream test's region: 16 KiB blocks, one after the other from the VD's start.
const STREAM_REGION_BYTES: u64 = 24 * MIB;
const STREAM_BLOCKS: u64 = STREAM_REGION_BYTES / BLOCK_BYTES as u64;
/// Blocks of one stream write: 1 MiB and 80 KiB, four whole rows of the RAID5 of five (64 KiB
/// strips) and some, so that most writes end inside a row that the next one completes
/// (`cache::bypass::complete_row`) and the others hold whole rows only.
const STREAM_WRITE_BLOCKS: u64 = (MIB + (80 << 10)) / BLOCK_BYTES as u64;
/// Blocks the verification reads at once.
const VERIFY_BLOCKS: u64 = MIB / BLOCK_BYTES as u64;

/// Marks `blocks` blocks from `first` in flight at `version`, and returns their contents.
fn begin_write(model: &Mutex<Vec<BlockModel>>, first: u64, blocks: u64, version: u64) -> Vec<u8> {
    model.lock().unwrap()[first as usize..(first + blocks) as usize].iter_mut().for_each(|b| b.in_flight = Some(version));
    (first..first + blocks).flat_map(|block| contents(block, version)).collect()
}

/// The write [`begin_write`] began was acknowledged.
fn end_write(model: &Mutex<Vec<BlockModel>>, first: u64, blocks: u64, version: u64) {
    let acknowledged = BlockModel { acknowledged: version, in_flight: None };
    model.lock().unwrap()[first as usize..(first + blocks) as usize].fill(acknowledged);
}

/// One write of `blocks` consecutive blocks from `first`, each block its own contents at
/// `version`: in flight, then acknowledged.
fn write_blocks(nbd: &mut Client, model: &Mutex<Vec<BlockModel>>, first: u64, blocks: u64, version: u64) -> bool {
    let data = begin_write(model, first, blocks, version);
    if nbd.write(first * BLOCK_BYTES as u64, &data, false).is_err() {
        return false;
    }
    end_write(model, first, blocks, version);
    true
}

/// The next version, shared by every writer of a test, so none repeats.
fn take_version(next_version: &Mutex<u64>) -> u64 {
    let mut next = next_version.lock().unwrap();
    *next += 1;
    *next
}

/// The first block of the stream's next write after `cursor`, wrapping at the region's end.
fn next_stream_write(cursor: &mut u64) -> u64 {
    let first = if *cursor + STREAM_WRITE_BLOCKS <= STREAM_BLOCKS { *cursor } else { 0 };
    *cursor = first + STREAM_WRITE_BLOCKS;
    first
}

/// A stream of 1 MiB writes over the region, wrapping at its end, with a random 16 KiB write
/// into it now and then, until `stop` or the daemon is gone. Versions come from `next_version`,
/// shared by every writer of the test, so none repeats.
fn stream_until_stopped(
    mut nbd: Client,
    model: Arc<Mutex<Vec<BlockModel>>>,
    next_version: Arc<Mutex<u64>>,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng(seed | 1);
    let mut cursor = 0;
    while !stop.load(Ordering::SeqCst) {
        let version = take_version(&next_version);
        let written = match rng.below(2) {
            0 => write_blocks(&mut nbd, &model, rng.below(STREAM_BLOCKS), 1, version),
            _ => write_blocks(&mut nbd, &model, next_stream_write(&mut cursor), STREAM_WRITE_BLOCKS, version),
        };
        if !written {
            return;
        }
    }
}

/// Stream writes kept in flight by [`stream_pipelined_until_stopped`].
const PIPELINE_DEPTH: usize = 8;

/// A stream of 1 MiB + 80 KiB writes over the region, wrapping at its end, with
/// [`PIPELINE_DEPTH`] of them in flight (the region holds twice as many, so writes in
/// flight never overlap), until `stop` or the daemon is gone. At this depth the next write is
/// on its way while a row waits for it, so the rows two writes share are gathered whole around
/// the journal (`io::gather`) instead of their first part being cached.
fn stream_pipelined_until_stopped(
    mut nbd: Client,
    model: Arc<Mutex<Vec<BlockModel>>>,
    next_version: Arc<Mutex<u64>>,
    _seed: u64,
    stop: Arc<AtomicBool>,
) {
    const _: () = assert!(PIPELINE_DEPTH as u64 * STREAM_WRITE_BLOCKS * 2 <= STREAM_BLOCKS, "writes in flight never overlap");
    let mut cursor = 0;
    let mut in_flight: std::collections::HashMap<u64, (u64, u64)> = std::collections::HashMap::new();
    loop {
        while in_flight.len() < PIPELINE_DEPTH && !stop.load(Ordering::SeqCst) {
            let (version, first) = (take_version(&next_version), next_stream_write(&mut cursor));
            let data = begin_write(&model, first, STREAM_WRITE_BLOCKS, version);
            let Ok(cookie) = nbd.submit_write(first * BLOCK_BYTES as u64, &data, false) else { return };
            in_flight.insert(cookie, (first, version));
        }
        if in_flight.is_empty() {
            return;
        }
        let Ok(completion) = nbd.wait() else { return };
        let (first, version) = in_flight.remove(&completion.cookie).expect("a completion of a write in flight");
        if completion.result.is_err() {
            return;
        }
        end_write(&model, first, STREAM_WRITE_BLOCKS, version);
    }
}

/// Reads the region back: each block must hold its acknowledged version or the one in flight.
/// Returns the blocks whose acknowledged write was lost.
fn verify_stream(daemon: &Daemon, model: &mut [BlockModel], kill: u32) -> u64 {
    let mut nbd = client(daemon, "wb");
    let mut lost = 0;
    for first in (0..STREAM_BLOCKS).step_by(VERIFY_BLOCKS as usize) {
        let data = nbd.read(first * BLOCK_BYTES as u64, MIB as u32).unwrap_or_else(|e| panic!("kill {kill}: read at block {first}: {e}"));
        for (block, bytes) in (first..).zip(data.chunks(BLOCK_BYTES)) {
            lost += u64::from(!block_survived(block, bytes, &mut model[block as usize], kill));
        }
    }
    lost
}

/// What kills amid a stream found: blocks lost, and what the daemons reported before each kill.
#[derive(Default)]
struct StreamKills {
    writes: u64,
    lost: u64,
    bypassed_bytes: u64,
    completed_rows: u64,
    gathered_rows: u64,
}

type StreamWriter = fn(Client, Arc<Mutex<Vec<BlockModel>>>, Arc<Mutex<u64>>, u64, Arc<AtomicBool>);

/// A WB RAID5 `wb` of five member files with a journal file, checked by `check_new_vd` once
/// created, then set to send streams from 1 MiB around the journal; then `kills` rounds of:
/// start the daemon, verify the stream's region, run `writer` for 0.2 to 2 s, kill -9; then a
/// last start and verification.
fn kill_amid_stream(name: &str, kills: u32, writer: StreamWriter, check_new_vd: fn(&Daemon)) -> StreamKills {
    let scratch = Scratch::new(name);
    let drives = member_files(&scratch, DRIVE_COUNT);
    let journal = scratch.join("journal.img").display().to_string();
    // A small cache: the random writes' data is destaged within a run, while their records
    // stay live in the journal: the case a stream written around must not be replayed over.
    let args = ["--journal", journal.as_str(), "--cache-size", "4MiB"];
    let daemon = Daemon::start_with_args(&scratch, &drives, &args);
    daemon.create_vd("r5", &(0..DRIVE_COUNT).collect::<Vec<_>>(), "wb");
    set_write_back(&daemon);
    check_new_vd(&daemon);
    daemon.cli(&["/c0/v0", "set", "seqcutoff=1MiB"]);
    daemon.stop();
    let model = Arc::new(Mutex::new(vec![BlockModel::default(); STREAM_BLOCKS as usize]));
    let next_version = Arc::new(Mutex::new(0));
    let mut rng = Rng(0x5EC);
    let mut found = StreamKills::default();
    for kill in 0..=kills {
        let daemon = Daemon::start_with_args(&scratch, &drives, &args);
        let shown = daemon.cli(&["/c0/v0", "show", "all"]);
        assert!(shown.contains("streams from 1.0 MiB on (seqcutoff=1MiB)"), "kill {kill}: the setting is kept: {shown}");
        found.lost += verify_stream(&daemon, &mut model.lock().unwrap(), kill);
        if kill == kills {
            daemon.stop();
            break;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writing = {
            let (nbd, model, next_version, stop) =
                (client(&daemon, "wb"), Arc::clone(&model), Arc::clone(&next_version), Arc::clone(&stop));
            let seed = rng.next();
            std::thread::spawn(move || writer(nbd, model, next_version, seed, stop))
        };
        std::thread::sleep(Duration::from_millis(200 + rng.below(1800)));
        let vd = daemon.vd_named("wb");
        found.bypassed_bytes += vd.journal_bypassed_bytes;
        found.completed_rows += vd.journal_completed_rows;
        found.gathered_rows += vd.gathered_rows;
        daemon.kill9();
        stop.store(true, Ordering::SeqCst);
        writing.join().expect("writer");
    }
    found.writes = *next_version.lock().unwrap();
    found
}

#[test]
fn kill_9_amid_a_stream_that_goes_around_the_journal_never_loses_an_acknowledged_write() {
    let kills: u32 = kills_from_env() / 2;
    let found = kill_amid_stream("wb-stream-kills", kills, stream_until_stopped, |daemon| {
        let shown = daemon.cli(&["/c0/v0", "show", "all"]);
        assert!(
            shown.contains("Journal Bypass = Off (seqcutoff=default: the level's)"),
            "a parity level keeps streams in the journal: {shown}"
        );
        let (code, refused) = daemon.cli_output(&["/c0/v0", "set", "seqcutoff=100KiB"]);
        assert!(code != 0 && refused.contains("seqcutoff=\"100KiB\" is not allowed; allowed: default"), "{refused}");
    });
    println!(
        "{kills} kill -9 amid a stream going around the journal: {} writes, {} MiB of them around the journal, {} rows completed from the cache, {} blocks lost",
        found.writes,
        found.bypassed_bytes / MIB,
        found.completed_rows,
        found.lost
    );
    assert_eq!(found.lost, 0, "acknowledged writes lost");
    assert!(found.bypassed_bytes > 0, "the stream never went around the journal");
    assert!(found.completed_rows > 0, "no stream write completed a row the cache held");
}

/// The same kills amid a stream kept 8 writes deep, where the rows two writes share are
/// gathered whole around the journal rather than cached (`cache/write.rs`, `io::gather`).
#[test]
fn kill_9_amid_a_stream_8_writes_deep_never_loses_an_acknowledged_write() {
    let kills: u32 = kills_from_env() / 2;
    let found = kill_amid_stream("wb-pipelined-kills", kills, stream_pipelined_until_stopped, |_| {});
    println!(
        "{kills} kill -9 amid a stream 8 writes deep: {} writes, {} MiB around the journal, {} rows gathered, {} completed from the cache, {} blocks lost",
        found.writes,
        found.bypassed_bytes / MIB,
        found.gathered_rows,
        found.completed_rows,
        found.lost
    );
    assert_eq!(found.lost, 0, "acknowledged writes lost");
    assert!(found.gathered_rows > 0, "no row two stream writes share was gathered");
}
