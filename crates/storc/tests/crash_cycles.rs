//! kill -9 of the real daemon during configuration changes and during writes, then a restart,
//! over and over (issue 8): every restart must assemble with every VD Optimal and every member
//! in service, and every write that was acknowledged and then flushed must read back.
//!
//! `STORC_CRASH_CYCLES` sets the number of cycles (20 by default, what CI runs);
//! `scripts/crash-cycles` runs 200. `STORC_CRASH_SEED` changes the seeded timing.

mod common;

use common::api_types::{AddHotSpare, ControllerView, SetVd, VdView};
use common::{block_contents, Daemon, Rng, Scratch, MIB};
use nbd::{Client, ClientConfig, NbdUri};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DRIVE_COUNT: u32 = 8;
const DRIVE_BYTES: u64 = 128 * MIB;
const BLOCK_BYTES: usize = 64 << 10;
const BLOCK_COUNT: u64 = 256;
/// Writes between flushes: a flush makes every write before it durable.
const WRITES_PER_FLUSH: usize = 4;
const CYCLES_DEFAULT: u32 = 20;
const VD_NAMES: [&str; 2] = ["db", "db-renamed"];

/// What each block may hold: the version last made durable by an acknowledged flush, and a
/// version written after it whose write or flush the crash may have cut short.
#[derive(Default, Clone, Copy)]
struct BlockModel {
    durable_version: u64,
    pending_version: Option<u64>,
}

fn contents(block: u64, version: u64) -> Vec<u8> {
    block_contents(block, version, BLOCK_BYTES)
}

fn block_offset_bytes(block: u64, vd_bytes: u64) -> u64 {
    let stride_bytes = (vd_bytes / BLOCK_COUNT) / BLOCK_BYTES as u64 * BLOCK_BYTES as u64;
    block * stride_bytes
}

fn client(daemon: &Daemon, export: &str) -> Client {
    let uri = NbdUri::Unix { socket_path: daemon.api_socket().with_file_name("nbd.sock"), export_name: export.to_string() };
    Client::connect(&uri, &ClientConfig { structured_replies: true }).unwrap_or_else(|e| panic!("NBD connect to {export}: {e}"))
}

/// After a restart: every VD Optimal, every member Onln, slot 7 a spare or unconfigured good.
fn check_assembled(daemon: &Daemon, cycle: u32) -> VdView {
    let controller: ControllerView = daemon.controller();
    let events: Vec<common::api_types::EventView> = daemon.get("/api/v1/events");
    let recent: Vec<&str> = events.iter().rev().take(15).map(|e| e.description.as_str()).collect();
    for vd in &controller.vds {
        assert_eq!(vd.state, "Optl", "cycle {cycle}: v{} is {} after the restart; recent events: {recent:#?}", vd.vd, vd.state);
        assert!(vd.member_states.iter().all(|s| s == "Onln"), "cycle {cycle}: members {:?}; recent events: {recent:#?}", vd.member_states);
    }
    let spare = controller.drives.iter().find(|d| d.slot == 7).expect("slot 7");
    assert!(matches!(spare.state.as_str(), "GHS" | "UGood"), "cycle {cycle}: slot 7 is {}", spare.state);
    assert_eq!(controller.vds.len(), 1, "cycle {cycle}: one VD");
    controller.vds[0].clone()
}

/// Reads every block: each must hold its durable version or the one written after it.
fn verify_blocks(daemon: &Daemon, vd: &VdView, model: &mut [BlockModel], cycle: u32) {
    let mut nbd = client(daemon, &vd.name);
    for (block, state) in model.iter_mut().enumerate() {
        let block = block as u64;
        let offset = block_offset_bytes(block, vd.size_bytes);
        let data = nbd.read(offset, BLOCK_BYTES as u32).unwrap_or_else(|e| panic!("cycle {cycle}: read of block {block}: {e}"));
        let allowed = [Some(state.durable_version), state.pending_version];
        let found = allowed.iter().flatten().find(|v| data == contents(block, **v));
        let header = (u64::from_le_bytes(data[..8].try_into().unwrap()), u64::from_le_bytes(data[8..16].try_into().unwrap()));
        let found = *found.unwrap_or_else(|| {
            panic!("cycle {cycle}: block {block} at {offset} holds none of versions {allowed:?}; its header says (block, version) = {header:?}")
        });
        // Whatever is there now was read back after the restart: it is the durable version.
        *state = BlockModel { durable_version: found, pending_version: None };
    }
}

/// Writes blocks in a seeded order, flushing every few writes, until `stop`.
fn write_until_stopped(mut nbd: Client, vd_bytes: u64, model: Arc<Mutex<Vec<BlockModel>>>, seed: u64, stop: Arc<AtomicBool>) -> usize {
    let mut rng = Rng(seed | 1);
    let mut unflushed: Vec<(u64, u64)> = Vec::new();
    let mut acknowledged = 0;
    while !stop.load(Ordering::SeqCst) {
        let block = rng.below(BLOCK_COUNT);
        let version = {
            let mut model = model.lock().unwrap();
            let state = &mut model[block as usize];
            if state.pending_version.is_some() {
                continue; // one write in doubt per block keeps the model exact
            }
            let version = state.durable_version + 1 + rng.below(1000);
            state.pending_version = Some(version);
            version
        };
        if nbd.write(block_offset_bytes(block, vd_bytes), &contents(block, version), false).is_err() {
            return acknowledged;
        }
        unflushed.push((block, version));
        if unflushed.len() == WRITES_PER_FLUSH {
            if nbd.flush().is_err() {
                return acknowledged;
            }
            let mut model = model.lock().unwrap();
            for (block, version) in unflushed.drain(..) {
                model[block as usize] = BlockModel { durable_version: version, pending_version: None };
                acknowledged += 1;
            }
        }
    }
    acknowledged
}

/// Changes the configuration over and over through the API until `stop`.
fn change_configuration_until_stopped(daemon_api: std::path::PathBuf, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng(seed.rotate_left(17) | 1);
    let request = |method: &str, path: &str, body: String| common::http(&daemon_api, method, path, Some(&body));
    while !stop.load(Ordering::SeqCst) {
        let outcome = match rng.below(4) {
            0 => {
                let name = VD_NAMES[rng.below(2) as usize];
                let body = SetVd { name: Some(name.into()), ..SetVd::default() };
                request("PATCH", "/api/v1/vds/0", serde_json::to_string(&body).unwrap())
            }
            1 => request("POST", "/api/v1/drives/7/hotspare", serde_json::to_string(&AddHotSpare { drive_groups: vec![] }).unwrap()),
            2 => request("DELETE", "/api/v1/drives/7/hotspare", String::new()),
            _ => {
                let policy = ["wt", "wb"][rng.below(2) as usize];
                let body = SetVd { write_policy: Some(policy.into()), ..SetVd::default() };
                request("PATCH", "/api/v1/vds/0", serde_json::to_string(&body).unwrap())
            }
        };
        if outcome.is_err() {
            return; // the daemon is gone
        }
    }
}

#[test]
fn kill_9_during_configuration_changes_and_writes_never_loses_a_flushed_write_or_a_member() {
    let cycles: u32 = std::env::var("STORC_CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(CYCLES_DEFAULT);
    let seed: u64 = std::env::var("STORC_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5EED);
    let scratch = Scratch::new("crash-cycles");
    let drives: Vec<String> =
        (0..DRIVE_COUNT).map(|i| scratch.sparse_file(&format!("d{i}.img"), DRIVE_BYTES).display().to_string()).collect();
    let daemon = Daemon::start(&scratch, &drives);
    daemon.create_vd("r5", &(0..7).collect::<Vec<_>>(), VD_NAMES[0]);
    daemon.kill9();
    let model = Arc::new(Mutex::new(vec![BlockModel::default(); BLOCK_COUNT as usize]));
    let mut rng = Rng(seed);
    let started = Instant::now();
    let (mut acknowledged_total, mut restart_total) = (0, Duration::ZERO);
    for cycle in 0..cycles {
        let daemon = Daemon::start(&scratch, &drives);
        restart_total += daemon.startup;
        let vd = check_assembled(&daemon, cycle);
        verify_blocks(&daemon, &vd, &mut model.lock().unwrap(), cycle);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (nbd, model, stop, seed) = (client(&daemon, &vd.name), Arc::clone(&model), Arc::clone(&stop), rng.next());
            std::thread::spawn(move || write_until_stopped(nbd, vd.size_bytes, model, seed, stop))
        };
        let changer = {
            let (api, stop, seed) = (daemon.api_socket(), Arc::clone(&stop), rng.next());
            std::thread::spawn(move || change_configuration_until_stopped(api, seed, stop))
        };
        std::thread::sleep(Duration::from_millis(50 + rng.below(350)));
        daemon.kill9();
        stop.store(true, Ordering::SeqCst);
        acknowledged_total += writer.join().expect("writer");
        changer.join().expect("configuration changer");
    }
    let daemon = Daemon::start(&scratch, &drives);
    let vd = check_assembled(&daemon, cycles);
    verify_blocks(&daemon, &vd, &mut model.lock().unwrap(), cycles);
    daemon.stop();
    let versions: HashMap<bool, usize> = model.lock().unwrap().iter().fold(HashMap::new(), |mut counts, b| {
        *counts.entry(b.durable_version > 0).or_default() += 1;
        counts
    });
    println!(
        "{cycles} kill -9 cycles in {:.1} s: every restart Optimal, {acknowledged_total} acknowledged-and-flushed writes checked, {} of {BLOCK_COUNT} blocks written, mean restart {:.0} ms",
        started.elapsed().as_secs_f64(),
        versions.get(&true).copied().unwrap_or(0),
        restart_total.as_secs_f64() * 1000.0 / f64::from(cycles.max(1))
    );
}
