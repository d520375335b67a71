//! The migration routes of the management API (a whole VD moved onto one drive):
//! `GET /api/v1/migrations`, `POST /api/v1/vds/{id}/migrate`.

use super::api::{bad, blocking, fail, ok, ApiJson, Reply, Shared};
use crate::api_types::{MigrateAction, MigrateTarget, MigrationView};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use engine::controller::{ControlError, Controller};
use std::sync::Arc;

fn migration_view(view: &engine::controller::MigrationView) -> MigrationView {
    MigrationView {
        vd: view.vd_id,
        target_slot: view.target_slot,
        target_source: view.target_source.clone(),
        progress_percent: (view.progress.percent_done() * 10.0).floor() / 10.0,
        status: view.status().to_string(),
        estimated_seconds_left: view.estimated_time_left().map(|left| left.as_secs()),
        rate_percent: view.progress.rate_percent(),
    }
}

pub(super) async fn migrations(State(state): State<Shared>) -> Reply<Vec<MigrationView>> {
    ok(state.controller.migrations().iter().map(migration_view).collect())
}

/// `start` (with `target`), `pause`, `resume` or `stop`. Answers the migration as it stands
/// after the command.
pub(super) async fn migrate_action(
    State(state): State<Shared>,
    Path(vd_id): Path<u32>,
    ApiJson(body): ApiJson<MigrateAction>,
) -> Reply<MigrationView> {
    let action = body.action.to_ascii_lowercase();
    const ALLOWED: &str = "allowed: start (with a target), pause, resume, stop";
    // Taken before a stop, which ends the migration: the answer then shows it Stopped.
    let before = state.controller.migrations().into_iter().find(|view| view.vd_id == vd_id);
    let controller = Arc::clone(&state.controller);
    match (action.as_str(), body.target) {
        ("start", Some(target)) => start(&state, vd_id, target).await?,
        ("start", None) => return Err(bad("start migrate needs a target: a UGood slot, an RBD image or a file".into())),
        (_, Some(_)) => return Err(bad(format!("target goes with start only, not with {action:?}"))),
        ("stop", None) => blocking(move || controller.stop_migration(vd_id)).await?,
        ("pause", None) => blocking(move || controller.pause_migration(vd_id, true)).await?,
        ("resume", None) => blocking(move || controller.pause_migration(vd_id, false)).await?,
        (other, None) => return Err(bad(format!("unknown migrate action {other:?}; {ALLOWED}"))),
    }
    let view = state.controller.migrations().into_iter().find(|view| view.vd_id == vd_id).or(before);
    let view = view.ok_or_else(|| fail(ControlError::NotFound(format!("v{vd_id} has no migration any more (it may have finished)"))))?;
    ok(migration_view(&view))
}

async fn start(state: &Shared, vd_id: u32, target: MigrateTarget) -> Result<(), (StatusCode, Json<crate::api_types::ApiError>)> {
    let controller = Arc::clone(&state.controller);
    // A drive given before (with --drive, or by an earlier migration) is its slot.
    let slot = match target {
        MigrateTarget::Slot(slot) => slot,
        MigrateTarget::Drive(spec) => match controller.slot_of_source(&spec) {
            Some(slot) => slot,
            None => {
                let added = Arc::clone(&state.added_drives);
                return blocking(move || start_onto_new_drive(&controller, &added, vd_id, &spec)).await;
            }
        },
    };
    blocking(move || controller.start_migration(vd_id, slot)).await
}

/// Opens (or creates) the drive `spec` names, remembers it for later starts, and lets the
/// controller add it and start the migration; undoes the remembering if the controller refuses.
fn start_onto_new_drive(
    controller: &Controller,
    added: &super::added_drives::AddedDrives,
    vd_id: u32,
    spec: &str,
) -> Result<(), ControlError> {
    let _adding = added.adding();
    // Another command may have added it since the caller looked.
    if let Some(slot) = controller.slot_of_source(spec) {
        return controller.start_migration(vd_id, slot);
    }
    let needed_bytes = controller.migration_target_bytes(vd_id)?;
    let (offer, created) = super::added_drives::open_target(spec, needed_bytes, added.data_dir()).map_err(ControlError::BadInput)?;
    let drive = Arc::clone(&offer.drive);
    let left_behind = |error: ControlError| match &created {
        Some(created) => error.with_note(&format!("(the {created} made for it is left in place)")),
        None => error,
    };
    if let Some(created) = &created {
        controller.log(engine::controller::Severity::Info, format!("{created} created to receive v{vd_id}"));
    }
    let remembered_now = match added.remember(spec) {
        Ok(new) => new,
        Err(error) => {
            drive.close();
            return Err(left_behind(ControlError::Io(error)));
        }
    };
    match controller.start_migration_onto(vd_id, offer) {
        Ok(_slot) => {
            added.opened(drive);
            Ok(())
        }
        Err(error) => {
            if remembered_now {
                added.forget(spec);
            }
            drive.close();
            Err(left_behind(error))
        }
    }
}
