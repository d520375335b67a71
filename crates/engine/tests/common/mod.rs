//! Helpers shared by the engine's integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use engine::config::{IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::CreateVdSpec;
use engine::{Engine, EngineConfig};
use layout::{Level, KIB};
use std::sync::Arc;

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
