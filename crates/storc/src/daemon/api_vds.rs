//! The virtual drive routes of the management API: `GET` and `POST /api/v1/vds`, `GET`,
//! `PATCH` and `DELETE /api/v1/vds/{id}` (policies, name, SSD caching, `?force=`), and
//! `GET /api/v1/vds/{id}/badblocks`.

use super::api::{all_vd_views, bad, blocking, fail, ok, vd_view, ApiJson, ApiQuery, Reply, Shared};
use crate::api_types::*;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use engine::config::{IoPolicy, ReadPolicy, SeqCutoff, WritePolicy};
use engine::controller::{CreateVdSpec, VdChanges};
use layout::Level;
use std::sync::Arc;

pub(super) async fn list_vds(State(state): State<Shared>) -> Reply<Vec<VdView>> {
    ok(all_vd_views(&state))
}

pub(super) async fn get_vd(State(state): State<Shared>, Path(id): Path<u32>) -> Reply<VdView> {
    let (record, vd) = state.controller.vd(id).map_err(fail)?;
    ok(vd_view(&state, &record, &vd))
}

pub(super) async fn bad_blocks(State(state): State<Shared>, Path(id): Path<u32>) -> Reply<BadBlocksView> {
    let ranges = state.controller.bad_blocks(id).map_err(fail)?;
    let sector = layout::SECTOR_BYTES;
    let bad_blocks = ranges
        .iter()
        .map(|r| BadBlockView {
            offset_bytes: r.offset_bytes,
            len_bytes: r.len_bytes,
            lba: r.offset_bytes / sector,
            sectors: r.len_bytes / sector,
        })
        .collect();
    ok(BadBlocksView { vd: id, max_ranges: engine::vd::BAD_BLOCKS_MAX, bad_blocks })
}

fn parse_choice<T: Copy>(what: &str, text: &str, all: &[T], name: impl Fn(T) -> &'static str) -> Result<T, (StatusCode, Json<ApiError>)> {
    let lower = text.to_ascii_lowercase();
    all.iter().copied().find(|v| name(*v) == lower).ok_or_else(|| {
        let allowed: Vec<&str> = all.iter().map(|v| name(*v)).collect();
        bad(format!("unknown {what} {text:?}; allowed: {}", allowed.join(", ")))
    })
}

fn write_policy(text: Option<&str>) -> Result<Option<WritePolicy>, (StatusCode, Json<ApiError>)> {
    text.map(|t| parse_choice("write policy", t, &WritePolicy::ALL, WritePolicy::short_name)).transpose()
}
fn read_policy(text: Option<&str>) -> Result<Option<ReadPolicy>, (StatusCode, Json<ApiError>)> {
    text.map(|t| parse_choice("read policy", t, &ReadPolicy::ALL, ReadPolicy::short_name)).transpose()
}
fn io_policy(text: Option<&str>) -> Result<Option<IoPolicy>, (StatusCode, Json<ApiError>)> {
    text.map(|t| parse_choice("IO policy", t, &IoPolicy::ALL, IoPolicy::short_name)).transpose()
}

pub(super) async fn create_vd(State(state): State<Shared>, ApiJson(body): ApiJson<CreateVd>) -> Reply<VdView> {
    let level = Level::parse(&body.level).map_err(|e| bad(e.to_string()))?;
    let strip_kib = body.strip_kib.unwrap_or(64);
    let mut spec = CreateVdSpec {
        level,
        slots: body.drives.clone(),
        strip_size_bytes: strip_kib.checked_mul(1024).ok_or_else(|| bad(format!("strip {strip_kib} KiB is too large")))?,
        name: body.name.clone(),
        drives_per_span: body.pdperarray.map(|n| n as usize),
        write_policy: write_policy(body.write_policy.as_deref())?.unwrap_or(WritePolicy::WriteThrough),
        read_policy: read_policy(body.read_policy.as_deref())?.unwrap_or(ReadPolicy::NoReadAhead),
        io_policy: io_policy(body.io_policy.as_deref())?.unwrap_or(IoPolicy::Direct),
        seq_cutoff: body.seq_cutoff.as_deref().map(SeqCutoff::parse).transpose().map_err(bad)?.unwrap_or_default(),
    };
    let controller = Arc::clone(&state.controller);
    let (cachecade, assign_vds) = (body.cachecade, body.assign_vds.clone());
    if !cachecade && !assign_vds.is_empty() {
        return Err(bad("assignvds= is for a cache VD (add vd cachecade ...)".to_string()));
    }
    if cachecade && body.seq_cutoff.is_some() {
        return Err(bad("seqcutoff= is for a VD behind the journal; a cache VD (add vd cachecade ...) takes none".to_string()));
    }
    // A cache VD's wt|wb is its caching's (write-back keeps writes on it, CacheCade's WB); its
    // own writes go through to its SSDs.
    let cache_write_back = cachecade && spec.write_policy != WritePolicy::WriteThrough;
    if cachecade {
        spec.write_policy = WritePolicy::WriteThrough;
    }
    let record = blocking(move || match cachecade {
        true => controller.create_cache_vd(spec, cache_write_back, &assign_vds),
        false => controller.create_vd(spec),
    })
    .await?;
    let (record, vd) = state.controller.vd(record.vd_id).map_err(fail)?;
    Ok((StatusCode::CREATED, Json(vd_view(&state, &record, &vd))))
}

pub(super) async fn set_vd(State(state): State<Shared>, Path(id): Path<u32>, ApiJson(body): ApiJson<SetVd>) -> Reply<VdView> {
    let changes = VdChanges {
        write_policy: write_policy(body.write_policy.as_deref())?,
        read_policy: read_policy(body.read_policy.as_deref())?,
        io_policy: io_policy(body.io_policy.as_deref())?,
        name: body.name.clone(),
        seq_cutoff: body.seq_cutoff.as_deref().map(SeqCutoff::parse).transpose().map_err(bad)?,
    };
    let caching = body.ssd_caching.as_deref().map(super::api_ssd_cache::ssd_caching).transpose()?;
    let policies_or_name = body.write_policy.is_some()
        || body.read_policy.is_some()
        || body.io_policy.is_some()
        || body.name.is_some()
        || body.seq_cutoff.is_some();
    let controller = Arc::clone(&state.controller);
    blocking(move || {
        // Caching first: it has more reasons to refuse, and a refusal then changes nothing.
        if let Some(caching) = caching {
            controller.set_ssd_caching(id, caching)?;
        }
        match policies_or_name {
            true => controller.set_vd(id, changes).map(|_| ()),
            false => Ok(()),
        }
    })
    .await?;
    let (record, vd) = state.controller.vd(id).map_err(fail)?;
    ok(vd_view(&state, &record, &vd))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForceQuery {
    force: Option<bool>,
}

pub(super) async fn delete_vd(State(state): State<Shared>, Path(id): Path<u32>, ApiQuery(query): ApiQuery<ForceQuery>) -> Reply<Message> {
    let in_use = state.controller.vd(id).map(|(record, _)| state.nbd.connections_to(&record.name) > 0).unwrap_or(false);
    let controller = Arc::clone(&state.controller);
    blocking(move || controller.delete_vd(id, query.force.unwrap_or(false), in_use)).await?;
    ok(Message { message: format!("deleted v{id}") })
}
