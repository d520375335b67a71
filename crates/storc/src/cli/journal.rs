//! `/c0/bbu show` and `/c0/journal show`: the cache's journal, reported as storcli reports a
//! controller's battery (a journal plays that part: write-back needs it healthy).

use super::render::Report;
use super::table::{key_values, section};
use crate::api_types::JournalView;
use serde_json::Value;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

pub fn report(description: &str, view: &JournalView, answer: &Value) -> Report {
    let used_percent = if view.ring_bytes == 0 { 0.0 } else { view.used_bytes as f64 * 100.0 / view.ring_bytes as f64 };
    let write_back = match view.state.as_str() {
        "Optimal" => "WB VDs run WB",
        "Degraded" => "WB VDs run WB (one copy of the journal left)",
        _ => "WB VDs run WT (bad battery)",
    };
    let legs: Vec<String> = view
        .legs
        .iter()
        .map(|leg| match &leg.reason {
            Some(why) => format!("{} ({}: {why})", leg.source, leg.state),
            None => format!("{} ({})", leg.source, leg.state),
        })
        .collect();
    let device = match (legs.len(), &view.source) {
        (2, _) => format!("mirrored pair: {}", legs.join(", ")),
        (_, Some(source)) => source.clone(),
        (_, None) => "-".into(),
    };
    let properties = [
        ("Journal State", view.state.clone()),
        ("Device", device),
        ("Capacity", if view.capacity_bytes == 0 { "-".into() } else { mib(view.capacity_bytes) }),
        ("Partitions (one per shard)", view.partitions.to_string()),
        ("Used", format!("{} of {} ({used_percent:.1}%)", mib(view.used_bytes), mib(view.ring_bytes))),
        ("Replayed At Start", format!("{} writes, {}", view.replayed_records, mib(view.replayed_bytes))),
        ("Cache Size", mib(view.cache_bytes)),
        ("Cache Dirty", mib(view.dirty_bytes)),
        ("Cache Pinned (offline VDs)", mib(view.pinned_bytes)),
        ("Cache Clean", mib(view.clean_bytes)),
        ("Read Hits/Misses", format!("{}/{}", view.read_hits, view.read_misses)),
        ("Read Ahead", mib(view.read_ahead_bytes)),
        ("Write Policy In Effect", write_back.to_string()),
        ("Reason", view.reason.clone().unwrap_or_else(|| "-".into())),
    ];
    Report {
        description: description.to_string(),
        text: section("Journal (BBU) Properties", &key_values(&properties)),
        data: answer.clone(),
    }
}
