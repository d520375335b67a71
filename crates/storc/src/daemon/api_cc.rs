//! The consistency check routes of the management API: `GET /api/v1/ccs`,
//! `POST /api/v1/vds/{id}/cc`.

use super::api::{bad, blocking, ok, ApiJson, Reply, Shared};
use crate::api_types::{CcAction, CcView, Message};
use axum::extract::{Path, State};
use engine::controller::CcCommand;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn cc_view(view: &engine::controller::CcView) -> CcView {
    CcView {
        vd: view.vd_id,
        progress_percent: (view.progress.percent_done() * 10.0).floor() / 10.0,
        status: view.status().to_string(),
        estimated_seconds_left: view.estimated_time_left().map(|left| left.as_secs()),
        rate_percent: view.progress.rate_percent(),
        repair: view.repair,
        rows_checked: view.tally.rows_checked.load(Ordering::Relaxed),
        rows_inconsistent: view.tally.rows_inconsistent.load(Ordering::Relaxed),
        rows_repaired: view.tally.rows_repaired.load(Ordering::Relaxed),
    }
}

pub(super) async fn checks(State(state): State<Shared>) -> Reply<Vec<CcView>> {
    ok(state.controller.checks().iter().map(cc_view).collect())
}

enum Request {
    Start { repair: bool },
    Command(CcCommand),
}

/// `start` (with `repair`, default true), `stop`, `pause`, `resume` on one VD.
pub(super) async fn cc_action(State(state): State<Shared>, Path(vd_id): Path<u32>, ApiJson(body): ApiJson<CcAction>) -> Reply<Message> {
    let action = body.action.to_ascii_lowercase();
    let request = match (action.as_str(), body.repair) {
        ("start", repair) => Request::Start { repair: repair.unwrap_or(true) },
        (_, Some(_)) => return Err(bad(format!("repair goes with start only, not with {action:?}"))),
        ("stop", None) => Request::Command(CcCommand::Stop),
        ("pause", None) => Request::Command(CcCommand::Pause),
        ("resume", None) => Request::Command(CcCommand::Resume),
        (other, None) => return Err(bad(format!("unknown consistency check action {other:?}; allowed: start, stop, pause, resume"))),
    };
    let controller = Arc::clone(&state.controller);
    let message = match request {
        Request::Start { repair } => {
            blocking(move || controller.start_cc(vd_id, repair)).await?;
            let mode = if repair { "repairs" } else { "reports" };
            format!("consistency check of v{vd_id} started; it {mode} what disagrees (show events says what it finds)")
        }
        Request::Command(command) => {
            blocking(move || controller.cc_command(vd_id, command)).await?;
            format!("consistency check of v{vd_id}: {action} done")
        }
    };
    ok(Message { message })
}
