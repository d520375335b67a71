//! The routes of the quiet duties: initialization (`GET /api/v1/bgis`,
//! `POST /api/v1/vds/{id}/bgi` (stop, pause, resume), `GET /api/v1/inits`,
//! `POST /api/v1/vds/{id}/init` (fast or full)) and patrol read (`GET|POST /api/v1/patrolread`).

use super::api::{bad, blocking, fail, ok, ApiJson, Reply, Shared};
use crate::api_types::{BgiAction, BgiView, InitAction, InitView, Message, PatrolReadAction, PatrolReadView};
use axum::extract::{Path, State};
use engine::controller::{BgiCommand, PatrolCommand, FAST_INIT_BYTES};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn bgi_view(view: &engine::controller::BgiView) -> BgiView {
    BgiView {
        vd: view.vd_id,
        progress_percent: (view.percent_done * 10.0).floor() / 10.0,
        status: view.status.to_string(),
        estimated_seconds_left: view.estimated_time_left.map(|left| left.as_secs()),
        rate_percent: view.rate_percent,
        regions_left: view.regions_left,
        region_count: view.region_count,
    }
}

pub(super) async fn bgis(State(state): State<Shared>) -> Reply<Vec<BgiView>> {
    ok(state.controller.bgis().iter().map(bgi_view).collect())
}

pub(super) async fn bgi_action(State(state): State<Shared>, Path(vd_id): Path<u32>, ApiJson(body): ApiJson<BgiAction>) -> Reply<Message> {
    let action = body.action.to_ascii_lowercase();
    let command = match action.as_str() {
        "stop" => BgiCommand::Stop,
        "pause" => BgiCommand::Pause,
        "resume" => BgiCommand::Resume,
        other => return Err(bad(format!("unknown background initialization action {other:?}; allowed: stop, pause, resume"))),
    };
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.bgi_command(vd_id, command)).await?;
    ok(Message { message: format!("background initialization of v{vd_id}: {action} done") })
}

pub(super) async fn inits(State(state): State<Shared>) -> Reply<Vec<InitView>> {
    let vds = state.controller.vds();
    let views = vds.iter().filter_map(|(record, _)| state.controller.init(record.vd_id)).map(|view| InitView {
        vd: view.vd_id,
        progress_percent: (view.percent_done * 10.0).floor() / 10.0,
        elapsed_seconds: view.elapsed.as_secs(),
    });
    ok(views.collect())
}

pub(super) async fn init_action(State(state): State<Shared>, Path(vd_id): Path<u32>, ApiJson(body): ApiJson<InitAction>) -> Reply<Message> {
    let (record, _) = state.controller.vd(vd_id).map_err(fail)?;
    let in_use = state.nbd.connections_to(&record.name) > 0;
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.start_init(vd_id, body.full, body.force, in_use)).await?;
    let message = match body.full {
        true => format!("full initialization of v{vd_id} started; v{vd_id} refuses I/O until it is done (show init says how far)"),
        false => format!("fast initialization of v{vd_id} done: its first and last {} MiB are zeros", FAST_INIT_BYTES >> 20),
    };
    ok(Message { message })
}

pub(super) async fn patrol_read(State(state): State<Shared>) -> Reply<PatrolReadView> {
    let settings = state.controller.config().settings.patrol;
    let running = state.controller.patrol_read();
    let tally = running.as_ref().map(|view| &view.tally);
    let count = |read: fn(&engine::controller::PatrolTally) -> u64| tally.map_or(0, |t| read(t));
    ok(PatrolReadView {
        enabled: settings.enabled,
        mode: if settings.manual { "manual" } else { "auto" }.to_string(),
        delay_hours: settings.delay_hours,
        rate_percent: settings.rate_percent,
        include_ssds: settings.include_ssds,
        state: running.as_ref().map_or("Stopped", |view| view.state()).to_string(),
        progress_percent: running.as_ref().map(|view| (view.progress.percent_done() * 10.0).floor() / 10.0),
        current_slot: tally.map(|t| t.current_slot.load(Ordering::Relaxed) as u32),
        drives_done: count(|t| t.drives_done.load(Ordering::Relaxed)),
        drives_total: running.as_ref().map_or(0, |view| view.slots.len() as u64),
        medium_errors: count(|t| t.medium_errors.load(Ordering::Relaxed)),
        corrected: count(|t| t.corrected.load(Ordering::Relaxed)),
        last_start_unix_secs: settings.last_start_unix_secs,
        next_start_unix_secs: state.controller.patrol_next_start_unix_secs(),
    })
}

pub(super) async fn patrol_action(State(state): State<Shared>, ApiJson(body): ApiJson<PatrolReadAction>) -> Reply<Message> {
    let action = body.action.to_ascii_lowercase();
    let controller = Arc::clone(&state.controller);
    match action.as_str() {
        "start" => blocking(move || controller.start_patrol_read()).await?,
        "stop" | "pause" | "resume" => {
            let command = match action.as_str() {
                "stop" => PatrolCommand::Stop,
                "pause" => PatrolCommand::Pause,
                _ => PatrolCommand::Resume,
            };
            blocking(move || controller.patrol_command(command)).await?
        }
        other => return Err(bad(format!("unknown patrol read action {other:?}; allowed: start, stop, pause, resume"))),
    }
    ok(Message { message: format!("patrol read: {action} done (show events says what it finds)") })
}
