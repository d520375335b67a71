//! SSD caching in the management API: a VD's side of it in the VD view, and `ssd_caching`
//! of a VD's PATCH.

use super::api::bad;
use crate::api_types::{ApiError, SsdCacheInfo};
use axum::http::StatusCode;
use axum::Json;
use engine::controller::{SsdCacheView, SsdCaching};

pub(super) fn ssd_cache_info(view: SsdCacheView) -> SsdCacheInfo {
    match view {
        SsdCacheView::CacheVd { cached_vds, stats } => SsdCacheInfo {
            cache_vd: None,
            cached_vds,
            lines_valid: stats.lines_valid,
            line_count: stats.line_count,
            line_bytes: stats.line_bytes,
            read_hits: stats.read_hits,
            read_misses: stats.read_misses,
            read_bypassed: stats.read_bypassed,
            promotions: stats.promotions,
            evictions: stats.evictions,
            write_updates: stats.write_updates,
            hit_ratio: stats.hit_ratio(),
            write_back: stats.write_back,
            lines_dirty: stats.lines_dirty,
            writes_absorbed: stats.writes_absorbed,
            lines_destaged: stats.lines_destaged,
            lost: false,
        },
        SsdCacheView::Cached { cache_vd_id, lines_valid, lines_dirty, line_bytes, write_back, lost } => {
            SsdCacheInfo { cache_vd: Some(cache_vd_id), lines_valid, lines_dirty, line_bytes, write_back, lost, ..SsdCacheInfo::default() }
        }
    }
}

/// `on`, `off` or `vN` of `set ssdcaching=`.
pub(super) fn ssd_caching(text: &str) -> Result<SsdCaching, (StatusCode, Json<ApiError>)> {
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "on" => Ok(SsdCaching::On),
        "off" => Ok(SsdCaching::Off),
        _ => lower
            .strip_prefix('v')
            .and_then(|n| n.parse().ok())
            .map(SsdCaching::By)
            .ok_or_else(|| bad(format!("ssdcaching={text:?} is not allowed; allowed: on, off, or vN (the cache VD)"))),
    }
}
