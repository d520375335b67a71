//! Per-VD client I/O counters for the console's live charts (IOPS, MB/s, latency per VD).
//!
//! Counted where NBD requests become engine requests (`export`), the one door client I/O comes
//! through in the daemon: a few relaxed atomic adds per request, no lock, nothing in the engine.
//! The counters belong to a VD object (its `instance_id`), so a rename keeps them and a VD
//! deleted and made again starts from zero; the map is pruned to the live VDs whenever the export
//! set changes, so it holds one entry per VD at most.

use super::api::{ok, AppState, Reply, Shared};
use crate::api_types::{IoStatsView, VdIoView};
use axum::extract::State;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct VdIoCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    read_ns: AtomicU64,
    write_ns: AtomicU64,
}

impl VdIoCounters {
    pub fn record_read(&self, len_bytes: u64, latency: Duration) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(len_bytes, Ordering::Relaxed);
        self.read_ns.fetch_add(nanos(latency), Ordering::Relaxed);
    }

    pub fn record_write(&self, len_bytes: u64, latency: Duration) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.written_bytes.fetch_add(len_bytes, Ordering::Relaxed);
        self.write_ns.fetch_add(nanos(latency), Ordering::Relaxed);
    }
}

/// 584 years fit in u64 nanoseconds.
fn nanos(latency: Duration) -> u64 {
    u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX)
}

/// The counters of every live VD, by instance.
pub struct IoStats {
    started: Instant,
    by_instance: Mutex<HashMap<u64, Arc<VdIoCounters>>>,
}

impl Default for IoStats {
    fn default() -> IoStats {
        IoStats { started: Instant::now(), by_instance: Mutex::new(HashMap::new()) }
    }
}

impl IoStats {
    /// The counters of VD object `instance_id`, created at its first export.
    pub fn counters(&self, instance_id: u64) -> Arc<VdIoCounters> {
        let mut map = self.by_instance.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(map.entry(instance_id).or_default())
    }

    /// Forgets the VDs that are gone.
    pub fn retain(&self, live_instances: &[u64]) {
        let mut map = self.by_instance.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.retain(|instance, _| live_instances.contains(instance));
    }

    fn snapshot(&self, instance_id: u64) -> Option<Arc<VdIoCounters>> {
        let map = self.by_instance.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.get(&instance_id).cloned()
    }
}

/// `GET /api/v1/iostats`.
pub async fn iostats(State(state): State<Shared>) -> Reply<IoStatsView> {
    ok(view(&state))
}

fn view(state: &AppState) -> IoStatsView {
    let vds = state
        .controller
        .vds()
        .iter()
        .filter(|(record, _)| !record.cache_vd)
        .map(|(record, vd)| {
            let counters = state.io_stats.snapshot(vd.instance_id()).unwrap_or_default();
            VdIoView {
                vd: record.vd_id,
                name: record.name.clone(),
                reads: counters.reads.load(Ordering::Relaxed),
                writes: counters.writes.load(Ordering::Relaxed),
                read_bytes: counters.read_bytes.load(Ordering::Relaxed),
                written_bytes: counters.written_bytes.load(Ordering::Relaxed),
                read_latency_ns_total: counters.read_ns.load(Ordering::Relaxed),
                write_latency_ns_total: counters.write_ns.load(Ordering::Relaxed),
            }
        })
        .collect();
    IoStatsView { elapsed_ms: u64::try_from(state.io_stats.started.elapsed().as_millis()).unwrap_or(u64::MAX), vds }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_the_vd_object_and_are_pruned() {
        let stats = IoStats::default();
        stats.counters(7).record_read(4096, Duration::from_micros(30));
        stats.counters(7).record_write(8192, Duration::from_micros(50));
        stats.counters(7).record_write(8192, Duration::from_micros(70));
        let counters = stats.snapshot(7).unwrap();
        assert_eq!((counters.reads.load(Ordering::Relaxed), counters.read_bytes.load(Ordering::Relaxed)), (1, 4096));
        assert_eq!((counters.writes.load(Ordering::Relaxed), counters.written_bytes.load(Ordering::Relaxed)), (2, 16384));
        assert_eq!(counters.write_ns.load(Ordering::Relaxed), 120_000);
        stats.retain(&[8]);
        assert!(stats.snapshot(7).is_none(), "a VD gone takes its counters along");
    }
}
