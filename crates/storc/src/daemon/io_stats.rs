//! `GET /api/v1/iostats`: every VD's client I/O since the daemon started, for the console's live
//! charts (rates between two samples). The counters are the engine's (`engine::vd::ClientIoStats`,
//! booked by the NBD export just before it answers, the same ones `GET /metrics` shows), so a
//! rename keeps them and a VD deleted and made again starts from zero.

use super::api::{ok, AppState, Reply, Shared};
use crate::api_types::{IoStatsView, VdIoView};
use axum::extract::State;
use engine::vd::IoKind;
use std::time::Instant;

/// When the daemon started serving: the clock the samples' `elapsed_ms` runs on.
pub struct IoStats {
    started: Instant,
}

impl Default for IoStats {
    fn default() -> IoStats {
        IoStats { started: Instant::now() }
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
            let (read, write) = (vd.client_io().snapshot(IoKind::Read), vd.client_io().snapshot(IoKind::Write));
            VdIoView {
                vd: record.vd_id,
                name: record.name.clone(),
                reads: read.requests,
                writes: write.requests,
                read_bytes: read.bytes,
                written_bytes: write.bytes,
                read_latency_ns_total: (read.latency_sum_seconds * 1e9) as u64,
                write_latency_ns_total: (write.latency_sum_seconds * 1e9) as u64,
            }
        })
        .collect();
    IoStatsView { elapsed_ms: u64::try_from(state.io_stats.started.elapsed().as_millis()).unwrap_or(u64::MAX), vds }
}
