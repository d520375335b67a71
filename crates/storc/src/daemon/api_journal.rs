//! The journal's routes: `GET /api/v1/journal` (`/c0/bbu show`, `/c0/journal show`) and
//! `POST /api/v1/journal` (`/c0 set journal=DEVICE`: a journal assigned at run time).

use super::api::{bad, blocking, ok, ApiJson, Reply, Shared};
use crate::api_types::{AttachJournal, JournalView};
use axum::extract::State;
use std::sync::Arc;

fn journal_view(state: &Shared) -> JournalView {
    let view = state.controller.journal_view();
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
    }
}

pub(super) async fn journal(State(state): State<Shared>) -> Reply<JournalView> {
    ok(journal_view(&state))
}

pub(super) async fn attach_journal(State(state): State<Shared>, ApiJson(body): ApiJson<AttachJournal>) -> Reply<JournalView> {
    let offer = super::drives::open_journal(&body.source).map_err(|e| bad(e.replacen("--journal", "journal=", 1)))?;
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.attach_journal(offer)).await?;
    ok(journal_view(&state))
}
