//! The management API (HTTP/1.1 + JSON, see `api_types`), served by axum on the control-plane
//! runtime. Controller calls write metadata, so they run on tokio's blocking pool.

use crate::api_types::*;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use engine::config::{CcMode, DriveState, VdRecord, WritePolicy};
use engine::controller::{ControlError, Controller, ControllerChanges, DriveCommand, RebuildCommand, ResyncStatus, SlotView};
use engine::VirtualDrive;
use std::sync::Arc;

pub struct AppState {
    pub controller: Arc<Controller>,
    pub nbd: nbd::Server,
    /// `nbd+unix:///{}?socket=...` style templates; `{}` is replaced by the export name.
    pub endpoint_templates: Vec<String>,
    pub pool: drive::BufPool,
    /// Client I/O per VD, for the console's live charts.
    pub io_stats: super::io_stats::IoStats,
    /// Drives added at run time (migration targets named by spec).
    pub added_drives: Arc<super::added_drives::AddedDrives>,
}

pub(super) type Shared = Arc<AppState>;
pub(super) type Reply<T> = Result<(StatusCode, Json<T>), (StatusCode, Json<ApiError>)>;

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/api/v1/controller", get(controller).patch(set_controller))
        .route("/api/v1/rebuilds", get(rebuilds))
        .route("/api/v1/drives/{slot}/rebuild", post(rebuild_action))
        .route("/api/v1/drives/{slot}/insert", post(insert_drive))
        .route("/api/v1/copybacks", get(super::api_copyback::copybacks))
        .route("/api/v1/drives/{slot}/copyback", post(super::api_copyback::copyback_action))
        .route("/api/v1/migrations", get(super::api_migrate::migrations))
        .route("/api/v1/vds/{id}/migrate", post(super::api_migrate::migrate_action))
        .route("/api/v1/ccs", get(super::api_cc::checks))
        .route("/api/v1/vds/{id}/cc", post(super::api_cc::cc_action))
        .route("/api/v1/bgis", get(super::api_bgi::bgis))
        .route("/api/v1/vds/{id}/bgi", post(super::api_bgi::bgi_action))
        .route("/api/v1/inits", get(super::api_bgi::inits))
        .route("/api/v1/patrolread", get(super::api_bgi::patrol_read).post(super::api_bgi::patrol_action))
        .route(
            "/api/v1/journal",
            get(super::api_journal::journal).post(super::api_journal::attach_journal).delete(super::api_journal::remove_journal),
        )
        .route("/api/v1/vds/{id}/init", post(super::api_bgi::init_action))
        .route("/api/v1/vds", get(super::api_vds::list_vds).post(super::api_vds::create_vd))
        .route("/api/v1/vds/{id}", get(super::api_vds::get_vd).patch(super::api_vds::set_vd).delete(super::api_vds::delete_vd))
        .route("/api/v1/vds/{id}/badblocks", get(super::api_vds::bad_blocks))
        .route("/api/v1/vds/{id}/cache", delete(super::api_journal::discard_preserved_cache))
        .route("/api/v1/drives", get(list_drives))
        .route("/api/v1/drives/{slot}", get(get_drive))
        .route("/api/v1/drives/{slot}/state", post(set_drive_state))
        .route("/api/v1/drives/{slot}/hotspare", post(add_hot_spare).delete(delete_hot_spare))
        .route("/api/v1/drives/{slot}/journal", post(super::api_journal::assign_journal_drive))
        .route("/api/v1/events", get(events))
        .route("/api/v1/iostats", get(super::io_stats::iostats))
        .route("/api/v1/foreign", get(foreign).delete(clear_foreign))
        .route("/api/v1/foreign/import", post(import_foreign))
        .route("/metrics", get(super::metrics::metrics))
        .with_state(state)
}

pub(super) fn fail(error: ControlError) -> (StatusCode, Json<ApiError>) {
    let status = match error {
        ControlError::BadInput(_) => StatusCode::BAD_REQUEST,
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(ApiError { error: error.to_string() }))
}

pub(super) fn bad(message: String) -> (StatusCode, Json<ApiError>) {
    fail(ControlError::BadInput(message))
}

/// Runs a controller call on the blocking pool (it may write metadata to every drive).
pub(super) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, ControlError> + Send + 'static,
) -> Result<T, (StatusCode, Json<ApiError>)> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(fail),
        Err(join) => Err(fail(ControlError::Io(format!("control task failed: {join}")))),
    }
}

/// A JSON body whose rejection is the API's `ApiError` (axum's own is plain text): an unknown
/// field, a missing one or a wrong type answers 400 with serde's words, which name the field and
/// the fields allowed.
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = (StatusCode, Json<ApiError>);

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(&rejection)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> (StatusCode, Json<ApiError>) {
    let status = match rejection {
        JsonRejection::MissingJsonContentType(_) => rejection.status(),
        _ => StatusCode::BAD_REQUEST,
    };
    (status, Json(ApiError { error: format!("request body: {}", innermost_cause(rejection)) }))
}

/// The same for a query string (`?force=true`).
pub struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = (StatusCode, Json<ApiError>);

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(query_rejection(&rejection)),
        }
    }
}

fn query_rejection(rejection: &QueryRejection) -> (StatusCode, Json<ApiError>) {
    (StatusCode::BAD_REQUEST, Json(ApiError { error: format!("query string: {}", innermost_cause(rejection)) }))
}

/// serde's message without axum's "Failed to deserialize ..." wrapping.
fn innermost_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

pub(super) fn ok<T>(value: T) -> Reply<T> {
    Ok((StatusCode::OK, Json(value)))
}

// ---------------------------------------------------------------------------------------------
// Views

pub fn vd_view(state: &AppState, record: &VdRecord, vd: &VirtualDrive) -> VdView {
    let geometry = vd.geometry();
    let config = state.controller.config();
    let member_states = record
        .member_slots
        .iter()
        .map(|slot| config.drives.iter().find(|d| d.slot == *slot).map(|d| d.state.short_name()).unwrap_or("Msng").to_string())
        .collect();
    let resync = state.controller.resync_status(record.vd_id).map(|status| match status {
        ResyncStatus::Pending { regions } => ResyncInfo { status: "Pending".into(), regions, percent_done: None },
        ResyncStatus::InProgress { regions, percent_done } => {
            ResyncInfo { status: "In progress".into(), regions, percent_done: Some(percent_done) }
        }
    });
    VdView {
        vd: record.vd_id,
        drive_group: record.drive_group,
        name: record.name.clone(),
        level: record.level.to_string(),
        state: vd.state().short_name().to_string(),
        size_bytes: vd.capacity_bytes(),
        strip_size_bytes: record.strip_size_bytes,
        drives_per_span: record.drives_per_span,
        span_count: geometry.span_count() as u32,
        member_slots: record.member_slots.clone(),
        member_states,
        write_policy: record.write_policy.short_name().to_string(),
        // Without a usable journal write-back runs as write-through, as a MegaRAID does without
        // its battery.
        write_policy_effective: match record.write_policy {
            WritePolicy::WriteBack if !state.controller.journal_usable() => "wt".to_string(),
            other => other.short_name().to_string(),
        },
        read_policy: record.read_policy.short_name().to_string(),
        io_policy: record.io_policy.short_name().to_string(),
        export_name: record.name.clone(),
        resync: resync.clone(),
        consistent: !record.bgi_pending && resync.is_none(),
        fast_path_off: engine::fast_path::ineligible(vd).map(String::from),
        fast_path_reads: vd.fast_path_reads(),
        fast_path_writes_off: state.controller.engine().fast_path_writes_ineligible(vd).map(String::from),
        fast_path_writes: vd.fast_path_writes(),
        gather_waits: vd.gathered().waits,
        gathered_rows: vd.gathered().rows,
        gathered_joins: vd.gathered().joins,
        journal_bypass_cutoff_bytes: vd.journal_bypass().cutoff_bytes(),
        seq_cutoff: record.seq_cutoff.text(),
        journal_bypassed_writes: vd.journal_bypass().bypassed().0,
        journal_bypassed_bytes: vd.journal_bypass().bypassed().1,
        journal_completed_rows: vd.journal_bypass().completed_rows(),
        cache_vd: record.cache_vd,
        ssd_cache: state.controller.ssd_cache_view(record.vd_id).map(super::api_ssd_cache::ssd_cache_info),
    }
}

pub(super) fn drive_view(view: &SlotView) -> DriveView {
    // GHS or DHS is the hot spare record's to say, and only while the drive is a spare: a missing
    // spare keeps its record and shows Msng.
    let spare_drive_groups = view.hot_spare_drive_groups.as_ref().filter(|_| view.state == DriveState::HotSpare);
    let state = match (spare_drive_groups, view.foreign) {
        (_, true) => "Frgn".to_string(),
        (Some(dgs), _) if dgs.is_empty() => "GHS".to_string(),
        (Some(_), _) => "DHS".to_string(),
        (None, _) => view.state.short_name().to_string(),
    };
    DriveView {
        slot: view.slot,
        drive_id: format!("{:032x}", view.drive_id.0),
        state,
        drive_group: view.vd,
        vd: view.vd,
        size_bytes: view.capacity_bytes,
        source: view.source.clone(),
        kind: view.info.as_ref().map(|i| format!("{:?}", i.kind)).unwrap_or_else(|| "-".into()),
        direct_io: view.info.as_ref().is_some_and(|i| i.direct_io),
        hot_spare_drive_groups: view.hot_spare_drive_groups.clone().unwrap_or_default(),
        read_errors: view.read_errors,
    }
}

pub(super) fn all_vd_views(state: &AppState) -> Vec<VdView> {
    state.controller.vds().iter().map(|(record, vd)| vd_view(state, record, vd)).collect()
}

/// What `/c0 show` calls "Needs Attention": a VD not optimal, or a drive failed, missing,
/// offline or unconfigured bad.
pub(super) fn needs_attention(vds: &[VdView], drives: &[DriveView]) -> bool {
    vds.iter().any(|v| v.state != "Optl") || drives.iter().any(|d| matches!(d.state.as_str(), "Failed" | "Msng" | "Offln" | "UBad"))
}

// ---------------------------------------------------------------------------------------------
// Handlers

async fn controller(State(state): State<Shared>) -> Reply<ControllerView> {
    let config = state.controller.config();
    let drives: Vec<DriveView> = state.controller.slots().iter().map(drive_view).collect();
    let vds = all_vd_views(&state);
    let attention = needs_attention(&vds, &drives);
    let names: Vec<String> = vds.iter().map(|v| v.export_name.clone()).collect();
    let nbd_endpoints = state.endpoint_templates.iter().flat_map(|t| names.iter().map(move |n| t.replace("{}", n))).collect();
    ok(ControllerView {
        controller: 0,
        controller_id: format!("{:032x}", config.controller_id.0),
        product: "storc".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        generation: config.generation,
        status: if attention { "Needs Attention".into() } else { "Optimal".into() },
        drives,
        vds,
        foreign_configurations: state.controller.foreign().len(),
        nbd_endpoints,
        shards: state.controller.engine().shard_count(),
        parity_kernels: parity::active_kernel_name().into(),
        auto_rebuild: config.settings.auto_rebuild,
        rebuild_rate_percent: config.settings.rebuild_rate_percent,
        copyback: config.settings.copyback,
        cc_rate_percent: config.settings.cc_rate_percent,
        bgi_rate_percent: config.settings.bgi_rate_percent,
        cc_mode: config.settings.cc_schedule.mode.short_name().to_string(),
        cc_delay_hours: config.settings.cc_schedule.delay_hours,
        cc_next_start_unix_secs: config.settings.cc_schedule.next_start_unix_secs,
        cc_queue: state.controller.cc_schedule().1,
    })
}

async fn set_controller(State(state): State<Shared>, ApiJson(body): ApiJson<SetController>) -> Reply<ControllerView> {
    let changes = ControllerChanges {
        auto_rebuild: body.auto_rebuild,
        rebuild_rate_percent: body.rebuild_rate_percent,
        copyback: body.copyback,
        cc_rate_percent: body.cc_rate_percent,
        bgi_rate_percent: body.bgi_rate_percent,
        patrol_read: body.patrol_read,
        patrol_manual: match body.patrol_mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => None,
            Some("auto") => Some(false),
            Some("manual") => Some(true),
            Some(other) => return Err(bad(format!("patrol read mode {other:?} is not allowed; allowed: auto, manual"))),
        },
        patrol_delay_hours: body.patrol_delay_hours,
        patrol_rate_percent: body.patrol_rate_percent,
        patrol_include_ssds: body.patrol_include_ssds,
        cc_mode: match body.cc_mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => None,
            Some("off") => Some(CcMode::Off),
            Some("seq") => Some(CcMode::Sequential),
            Some("conc") => Some(CcMode::Concurrent),
            Some(other) => return Err(bad(format!("consistency check mode {other:?} is not allowed; allowed: off, seq, conc"))),
        },
        cc_delay_hours: body.cc_delay_hours,
        cc_start_unix_secs: body.cc_start_unix_secs,
    };
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.set_controller(changes)).await?;
    self::controller(State(state)).await
}

fn rebuild_view(view: &engine::controller::RebuildView) -> RebuildView {
    RebuildView {
        slot: view.slot,
        vd: view.vd_id,
        progress_percent: (view.progress.percent_done() * 10.0).floor() / 10.0,
        status: view.status().to_string(),
        estimated_seconds_left: view.estimated_time_left().map(|left| left.as_secs()),
        rate_percent: view.progress.rate_percent(),
    }
}

async fn insert_drive(State(state): State<Shared>, Path(slot): Path<u32>, ApiJson(body): ApiJson<InsertDrive>) -> Reply<DriveView> {
    // In storc a drive group is its VD; a member is row R of span (array) A.
    let (record, vd) = state.controller.vd(body.drive_group).map_err(fail)?;
    let (spans, per_span) = (vd.geometry().span_count() as u32, vd.geometry().drives_per_span() as u32);
    if body.array >= spans || body.row >= per_span {
        let allowed = format!("array 0 to {} and row 0 to {}", spans - 1, per_span - 1);
        return Err(bad(format!("drive group {} has no array {} row {}; allowed: {allowed}", record.drive_group, body.array, body.row)));
    }
    let member = (body.array * per_span + body.row) as usize;
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.replace_member(slot, record.vd_id, member)).await?;
    ok(drive_view(&state.controller.slot(slot).map_err(fail)?))
}

async fn rebuilds(State(state): State<Shared>) -> Reply<Vec<RebuildView>> {
    ok(state.controller.rebuilds().iter().map(rebuild_view).collect())
}

async fn rebuild_action(State(state): State<Shared>, Path(slot): Path<u32>, ApiJson(body): ApiJson<RebuildAction>) -> Reply<RebuildView> {
    let command = match body.action.to_ascii_lowercase().as_str() {
        "start" => RebuildCommand::Start,
        "stop" => RebuildCommand::Stop,
        "pause" => RebuildCommand::Pause,
        "resume" => RebuildCommand::Resume,
        other => return Err(bad(format!("unknown rebuild action {other:?}; allowed: start, stop, pause, resume"))),
    };
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.rebuild_command(slot, command)).await?;
    let view = state.controller.rebuilds().into_iter().find(|r| r.slot == slot);
    let view = view.ok_or_else(|| fail(ControlError::NotFound(format!("slot {slot} has no rebuild any more"))))?;
    ok(rebuild_view(&view))
}

async fn list_drives(State(state): State<Shared>) -> Reply<Vec<DriveView>> {
    ok(state.controller.slots().iter().map(drive_view).collect())
}

async fn get_drive(State(state): State<Shared>, Path(slot): Path<u32>) -> Reply<DriveView> {
    ok(drive_view(&state.controller.slot(slot).map_err(fail)?))
}

async fn set_drive_state(State(state): State<Shared>, Path(slot): Path<u32>, ApiJson(body): ApiJson<SetDriveState>) -> Reply<DriveView> {
    let command = match body.state.to_ascii_lowercase().as_str() {
        "offline" => DriveCommand::Offline,
        "online" => DriveCommand::Online,
        "missing" => DriveCommand::Missing,
        "good" => DriveCommand::Good,
        other => return Err(bad(format!("unknown drive state {other:?}; allowed: offline, online, missing, good"))),
    };
    let force = body.force.unwrap_or(false);
    if force && command != DriveCommand::Online {
        return Err(bad(format!("force goes only with the state online, not {:?}", body.state)));
    }
    let controller = Arc::clone(&state.controller);
    blocking(move || if force { controller.force_online(slot) } else { controller.set_drive(slot, command) }).await?;
    ok(drive_view(&state.controller.slot(slot).map_err(fail)?))
}

async fn add_hot_spare(State(state): State<Shared>, Path(slot): Path<u32>, ApiJson(body): ApiJson<AddHotSpare>) -> Reply<DriveView> {
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.add_hot_spare(slot, body.drive_groups)).await?;
    ok(drive_view(&state.controller.slot(slot).map_err(fail)?))
}

async fn delete_hot_spare(State(state): State<Shared>, Path(slot): Path<u32>) -> Reply<DriveView> {
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.delete_hot_spare(slot)).await?;
    ok(drive_view(&state.controller.slot(slot).map_err(fail)?))
}

async fn events(State(state): State<Shared>) -> Reply<Vec<EventView>> {
    let events = state.controller.events();
    ok(events
        .into_iter()
        .map(|e| EventView {
            sequence: e.sequence,
            time_unix_secs: e.time_unix_secs,
            severity: format!("{:?}", e.severity).to_lowercase(),
            description: e.description,
        })
        .collect())
}

async fn foreign(State(state): State<Shared>) -> Reply<Vec<ForeignView>> {
    let views = state
        .controller
        .foreign()
        .iter()
        .map(|f| ForeignView {
            controller_id: format!("{:032x}", f.superblock.controller_id.0),
            generation: f.superblock.generation,
            slots: f.slots.clone(),
            vds: f
                .superblock
                .config
                .vds
                .iter()
                .map(|v| ForeignVdView { name: v.name.clone(), level: v.level.to_string(), size_bytes: foreign_vd_bytes(v) })
                .collect(),
        })
        .collect();
    ok(views)
}

/// The size a foreign VD would have once imported, from its recorded geometry.
fn foreign_vd_bytes(vd: &VdRecord) -> u64 {
    let geometry = layout::Geometry::new(layout::GeometryConfig {
        level: vd.level,
        drive_count: vd.member_slots.len(),
        drives_per_span: vd.level.is_spanned().then_some(vd.drives_per_span as usize),
        strip_size_bytes: vd.strip_size_bytes,
        member_size_bytes: vd.member_size_bytes,
        member_reserved_bytes: engine::MEMBER_RESERVED_BYTES,
    });
    geometry.map(|g| g.capacity_bytes()).unwrap_or(0)
}

async fn import_foreign(State(state): State<Shared>) -> Reply<Message> {
    let controller = Arc::clone(&state.controller);
    let count = blocking(move || controller.import_foreign()).await?;
    ok(Message { message: format!("imported {count} VD(s)") })
}

async fn clear_foreign(State(state): State<Shared>) -> Reply<Message> {
    let controller = Arc::clone(&state.controller);
    let count = blocking(move || controller.clear_foreign()).await?;
    ok(Message { message: format!("cleared {count} foreign configuration(s)") })
}

/// Keeps the NBD exports equal to the controller's VDs.
pub fn refresh_exports(state: &AppState) {
    let exports: Vec<nbd::Export> = state
        .controller
        .vds()
        .into_iter()
        // A cache VD holds copies of other VDs' lines: nothing a client should read or write.
        .filter(|(record, _)| !record.cache_vd)
        .map(|(record, vd)| {
            // Connections follow the VD object across renames and end with it; a VD created in
            // its place later (same number, same name) is another instance. A VD that moved
            // (a migration's end) keeps the identity of the one it succeeded.
            let identity = vd.export_identity();
            let device = super::export::VdDevice { engine: Arc::clone(state.controller.engine()), vd, pool: state.pool.clone() };
            let description = format!("storc v{} {}", record.vd_id, record.level);
            nbd::Export::new(record.name.clone(), Arc::new(super::export::SharedVdDevice(Arc::new(device))))
                .with_description(description)
                .with_identity(identity)
        })
        .collect();
    if let Err(error) = state.nbd.set_exports(exports) {
        state.controller.log(engine::controller::Severity::Critical, format!("NBD exports not updated: {error}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::config::DriveId;

    fn check(state: DriveState, hot_spare_drive_groups: Option<Vec<u32>>, foreign: bool, expected: &str) {
        let view = SlotView {
            slot: 3,
            drive_id: DriveId(1),
            state,
            foreign,
            vd: None,
            hot_spare_drive_groups,
            capacity_bytes: 1 << 30,
            source: "mem:1GiB".into(),
            info: None,
            read_errors: 0,
        };
        assert_eq!(drive_view(&view).state, expected, "{state:?}");
    }

    /// Every drive state reads as storcli writes it; GHS or DHS only while the drive is a spare.
    #[test]
    fn drive_states_are_shown_in_storclis_words() {
        check(DriveState::UnconfiguredGood, None, false, "UGood");
        check(DriveState::UnconfiguredBad, None, false, "UBad");
        check(DriveState::Online, None, false, "Onln");
        check(DriveState::Offline, None, false, "Offln");
        check(DriveState::Failed, None, false, "Failed");
        check(DriveState::Missing, None, false, "Msng");
        check(DriveState::Rebuild, None, false, "Rbld");
        check(DriveState::Copyback, None, false, "Cpybck");
        check(DriveState::HotSpare, Some(vec![]), false, "GHS");
        check(DriveState::HotSpare, Some(vec![0, 2]), false, "DHS");
        check(DriveState::Missing, Some(vec![]), false, "Msng");
        check(DriveState::UnconfiguredGood, None, true, "Frgn");
    }
}
