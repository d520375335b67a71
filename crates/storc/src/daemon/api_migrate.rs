//! The migration routes of the management API (a whole VD moved onto one drive):
//! `GET /api/v1/migrations`, `POST /api/v1/vds/{id}/migrate`.

use super::api::{bad, blocking, fail, ok, ApiJson, Reply, Shared};
use crate::api_types::{MigrateAction, MigrationView};
use axum::extract::{Path, State};
use engine::controller::ControlError;
use std::sync::Arc;

fn migration_view(view: &engine::controller::MigrationView) -> MigrationView {
    MigrationView {
        vd: view.vd_id,
        target_slot: view.target_slot,
        progress_percent: (view.progress.percent_done() * 10.0).floor() / 10.0,
        status: view.status().to_string(),
        estimated_seconds_left: view.estimated_time_left().map(|left| left.as_secs()),
        rate_percent: view.progress.rate_percent(),
    }
}

pub(super) async fn migrations(State(state): State<Shared>) -> Reply<Vec<MigrationView>> {
    ok(state.controller.migrations().iter().map(migration_view).collect())
}

/// `start` (with `target`) or `stop`. Answers the migration as it stands after the command.
pub(super) async fn migrate_action(
    State(state): State<Shared>,
    Path(vd_id): Path<u32>,
    ApiJson(body): ApiJson<MigrateAction>,
) -> Reply<MigrationView> {
    let action = body.action.to_ascii_lowercase();
    let start = match (action.as_str(), body.target) {
        ("start", Some(target)) => Some(target),
        ("start", None) => return Err(bad("start migrate needs a target: the UGood slot that receives the VD".into())),
        (_, Some(_)) => return Err(bad(format!("target goes with start only, not with {action:?}"))),
        ("stop", None) => None,
        (other, None) => return Err(bad(format!("unknown migrate action {other:?}; allowed: start, stop"))),
    };
    // Taken before a stop, which ends the migration: the answer then shows it Stopped.
    let before = state.controller.migrations().into_iter().find(|view| view.vd_id == vd_id);
    let controller = Arc::clone(&state.controller);
    match start {
        Some(target) => blocking(move || controller.start_migration(vd_id, target)).await?,
        None => blocking(move || controller.stop_migration(vd_id)).await?,
    }
    let view = state.controller.migrations().into_iter().find(|view| view.vd_id == vd_id).or(before);
    let view = view.ok_or_else(|| fail(ControlError::NotFound(format!("v{vd_id} has no migration any more (it may have finished)"))))?;
    ok(migration_view(&view))
}
