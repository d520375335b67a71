//! The journal's routes: `GET /api/v1/journal` (`/c0/bbu show`, `/c0/journal show`) and
//! `POST /api/v1/journal` (`/c0 set journal=DEVICE[,DEVICE]`: a journal, or a mirrored pair,
//! assigned at run time), and `POST /api/v1/drives/{slot}/journal` (`/c0/sN set journal`: a
//! slot's drive as the journal, or as the second leg of a mirrored pair), and
//! `DELETE /api/v1/journal` (`/c0/journal delete`: the controller goes on without one).

use super::api::{bad, blocking, ok, ApiJson, Reply, Shared};
use crate::api_types::Message;
use crate::api_types::{AttachJournal, JournalLegView, JournalView};
use axum::extract::{Path, State};
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
        pinned_bytes: cache.pinned_bytes,
        clean_bytes: cache.clean.bytes,
        read_hits: cache.clean.hits,
        read_misses: cache.clean.misses,
        read_ahead_bytes: cache.clean.read_ahead_bytes,
        legs: view
            .legs
            .into_iter()
            .map(|leg| JournalLegView {
                source: leg.source,
                state: if leg.in_service { "Online" } else { "Failed" }.to_string(),
                reason: leg.reason,
            })
            .collect(),
    }
}

/// `/c0/vN delete preservedcache`.
pub(super) async fn discard_preserved_cache(State(state): State<Shared>, Path(id): Path<u32>) -> Reply<Message> {
    let controller = Arc::clone(&state.controller);
    let message = blocking(move || controller.discard_preserved_cache(id)).await?;
    ok(Message { message })
}

pub(super) async fn journal(State(state): State<Shared>) -> Reply<JournalView> {
    ok(blocking(move || Ok(journal_view(&state))).await?)
}

pub(super) async fn attach_journal(State(state): State<Shared>, ApiJson(body): ApiJson<AttachJournal>) -> Reply<JournalView> {
    let specs: Vec<&str> = body.source.split(',').map(str::trim).collect();
    if specs.len() > 2 || specs.iter().any(|spec| spec.is_empty()) {
        return Err(bad(format!("journal={}: one device, or two separated by a comma (a mirrored pair)", body.source)));
    }
    // A slot's drive is claimed by this process: opened again as the journal, it would wait
    // for its own claim and then be refused as another controller's.
    let members: Vec<String> = state.controller.slots().into_iter().map(|slot| slot.source).collect();
    let journals: Vec<String> = specs.iter().map(|spec| spec.to_string()).collect();
    super::drives::check_distinct(&members, &journals)
        .map_err(|e| bad(e.replace("--journal ", "journal=").replace("--drive ", "the drive ")))?;
    // Opening may create and fill a journal file, or wait for a claim: not on the runtime's thread.
    let offers = blocking(move || {
        let specs: Vec<&str> = journals.iter().map(String::as_str).collect();
        super::drives::open_journal_legs(&specs).map_err(|e| engine::controller::ControlError::BadInput(e.replace("--journal", "journal=")))
    })
    .await?;
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.attach_journal(offers)).await?;
    ok(blocking(move || Ok(journal_view(&state))).await?)
}

pub(super) async fn remove_journal(State(state): State<Shared>) -> Reply<JournalView> {
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.remove_journal()).await?;
    ok(blocking(move || Ok(journal_view(&state))).await?)
}

pub(super) async fn assign_journal_drive(State(state): State<Shared>, Path(slot): Path<u32>) -> Reply<JournalView> {
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.assign_journal_drive(slot)).await?;
    ok(blocking(move || Ok(journal_view(&state))).await?)
}
