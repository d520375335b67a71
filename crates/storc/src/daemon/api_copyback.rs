//! The copyback routes of the management API (copyback and proactive replacement):
//! `GET /api/v1/copybacks`, `POST /api/v1/drives/{slot}/copyback`.

use super::api::{bad, blocking, fail, ok, ApiJson, Reply, Shared};
use crate::api_types::{CopybackAction, CopybackView};
use axum::extract::{Path, State};
use engine::controller::{ControlError, CopybackCommand};
use std::sync::Arc;

enum Request {
    Start { target: u32 },
    Command(CopybackCommand),
}

fn copyback_view(view: &engine::controller::CopyView) -> CopybackView {
    CopybackView {
        slot: view.target_slot,
        source_slot: view.source_slot,
        vd: view.vd_id,
        progress_percent: (view.progress.percent_done() * 10.0).floor() / 10.0,
        status: view.status().to_string(),
        estimated_seconds_left: view.estimated_time_left().map(|left| left.as_secs()),
        rate_percent: view.progress.rate_percent(),
    }
}

pub(super) async fn copybacks(State(state): State<Shared>) -> Reply<Vec<CopybackView>> {
    ok(state.controller.copybacks().iter().map(copyback_view).collect())
}

/// `start` (with `target`) on the member to copy; `stop`, `pause`, `resume` on the source or
/// the target of a copy. Answers the copy as it stands after the command.
pub(super) async fn copyback_action(
    State(state): State<Shared>,
    Path(slot): Path<u32>,
    ApiJson(body): ApiJson<CopybackAction>,
) -> Reply<CopybackView> {
    let action = body.action.to_ascii_lowercase();
    let request = match (action.as_str(), body.target) {
        ("start", Some(target)) => Request::Start { target },
        ("start", None) => return Err(bad("start copyback needs a target: the slot that receives the copy".into())),
        (_, Some(_)) => return Err(bad(format!("target goes with start only, not with {action:?}"))),
        ("stop", None) => Request::Command(CopybackCommand::Stop),
        ("pause", None) => Request::Command(CopybackCommand::Pause),
        ("resume", None) => Request::Command(CopybackCommand::Resume),
        (other, None) => return Err(bad(format!("unknown copyback action {other:?}; allowed: start, stop, pause, resume"))),
    };
    let involves = |view: &&engine::controller::CopyView| view.source_slot == slot || view.target_slot == slot;
    // Taken before a stop, which ends the copy: the answer then shows it Stopped.
    let before = state.controller.copybacks().into_iter().find(|view| involves(&view));
    let controller = Arc::clone(&state.controller);
    match request {
        Request::Start { target } => blocking(move || controller.start_copyback(slot, target)).await?,
        Request::Command(command) => blocking(move || controller.copyback_command(slot, command)).await?,
    }
    let view = state.controller.copybacks().into_iter().find(|view| involves(&view)).or(before);
    let view = view.ok_or_else(|| fail(ControlError::NotFound(format!("slot {slot} has no copyback any more"))))?;
    ok(copyback_view(&view))
}
