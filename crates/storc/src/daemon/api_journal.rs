//! The journal's routes: `GET /api/v1/journal` (`/c0/bbu show`, `/c0/journal show`) and
//! `POST /api/v1/journal` (`/c0 set journal=DEVICE`: a journal assigned at run time).

use super::api::{bad, blocking, ok, ApiJson, Reply, Shared};
use crate::api_types::{AttachJournal, JournalView};
use axum::extract::State;
use std::sync::Arc;

/// Blocks on the shards for the cache's counters: called off the async runtime.
fn journal_view(state: &Shared) -> JournalView {
    let view = state.controller.journal_view();
    let cache = state.controller.engine().cache_stats();
    JournalView {
        state: view.state.short_name().to_string(),
        source: view.source,
        capacity_bytes: view.capacity_bytes,
        ring_bytes: view.ring_bytes,
        used_bytes: view.used_bytes,
        partitions: view.partitions,
        replayed_records: view.replay.records,
        replayed_bytes: view.replay.data_bytes,
        reason: view.reason,
        cache_bytes: state.controller.engine().cache_bytes(),
        dirty_bytes: cache.dirty_bytes,
        clean_bytes: cache.clean.bytes,
        read_hits: cache.clean.hits,
        read_misses: cache.clean.misses,
        read_ahead_bytes: cache.clean.read_ahead_bytes,
    }
}

pub(super) async fn journal(State(state): State<Shared>) -> Reply<JournalView> {
    ok(blocking(move || Ok(journal_view(&state))).await?)
}

pub(super) async fn attach_journal(State(state): State<Shared>, ApiJson(body): ApiJson<AttachJournal>) -> Reply<JournalView> {
    let offer = super::drives::open_journal(&body.source).map_err(|e| bad(e.replacen("--journal", "journal=", 1)))?;
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.attach_journal(offer)).await?;
    ok(blocking(move || Ok(journal_view(&state))).await?)
}
