//! Helpers shared by the engine's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::Controller;
use engine::controller::CreateVdSpec;
use engine::{Engine, EngineConfig, VirtualDrive};
use layout::{Level, KIB};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One shard: the controller tests care about what reaches the drives, not about speed.
pub fn engine() -> Arc<Engine> {
    Arc::new(Engine::start(EngineConfig { shard_count: 1, ..EngineConfig::default() }).unwrap())
}

/// `add vd` with a 64 KiB strip and the default policies.
pub fn spec(level: Level, slots: &[u32], name: &str) -> CreateVdSpec {
    CreateVdSpec {
        level,
        slots: slots.to_vec(),
        strip_size_bytes: 64 * KIB,
        name: Some(name.to_string()),
        drives_per_span: None,
        write_policy: WritePolicy::WriteThrough,
        read_policy: ReadPolicy::NoReadAhead,
        io_policy: IoPolicy::Direct,
    }
}

/// Bytes that differ from offset to offset and from seed to seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// `count` memory drives of `bytes` each.
pub fn mem_drives(count: usize, bytes: u64) -> Vec<Arc<dyn drive::Drive>> {
    (0..count).map(|_| Arc::new(drive::MemDrive::new(bytes)) as Arc<dyn drive::Drive>).collect()
}

/// Waits up to 30 s for `done`, naming `what` and the controller's recent events if it never is.
pub fn wait_until(what: &str, controller: &Controller, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        let events: Vec<String> = controller.events().into_iter().rev().take(8).map(|e| e.description).collect();
        assert!(Instant::now() < deadline, "{what} never happened; recent events: {events:#?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the VD's first `image.len()` bytes: they must be `image` (`when` says at which step).
pub fn check(engine: &Engine, vd: &Arc<VirtualDrive>, image: &[u8], when: &str) {
    let read = engine.read_at(vd, 0, image.len()).unwrap_or_else(|e| panic!("{when}: {e}"));
    let wrong = read.as_slice().iter().zip(image).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "{when}: first wrong byte");
}

/// Writes `count` 4 KiB pieces all over `image`'s span of the VD and records them in it.
pub fn scatter(engine: &Engine, vd: &Arc<VirtualDrive>, image: &mut [u8], seed: u8, count: u64) {
    for index in 0..count {
        let offset = (index * 7919 * 4096 + u64::from(seed) * 8192) % (image.len() as u64 - 4096);
        let data = pattern(4096, seed.wrapping_add(index as u8));
        engine.write_at(vd, offset, &data).unwrap();
        image[offset as usize..offset as usize + 4096].copy_from_slice(&data);
    }
}
