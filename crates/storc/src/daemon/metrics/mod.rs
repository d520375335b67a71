//! `GET /metrics`: the controller in Prometheus' text format (version 0.0.4), on the
//! management API's listeners.
//!
//! Everything is read when scraped, from the controller and the engine (states, background
//! operations, cache and journal) and from counters kept where requests complete (per-VD client
//! I/O, `engine::vd::ClientIoStats`, booked by the NBD export; destage counts in the shards'
//! caches; NBD connection counts in the server): nothing is kept here between scrapes, so a
//! deleted VD or a drive that left takes its series with it. The shards answer the cache's
//! counters through their inboxes, so a scrape runs on the blocking pool.
//!
//! The text goes through `prometheus-client` (the Prometheus project's Rust client, maintained
//! under its organisation) rather than a hand-written writer: it escapes label values and help,
//! formats floats as Go does and lays histograms out cumulatively, which `promtool check metrics`
//! checks in the tests. Its collector interface takes values as they are at the scrape, which
//! fits metrics that mirror state owned elsewhere.
//!
//! Naming follows Prometheus' rules and node_exporter's `node_md_*` and the MegaRAID exporter's
//! `megaraid_*` in spirit: prefix `storc_`, base units (`_bytes`, `_seconds`, `_ratio`),
//! counters end in `_total`, metadata is an `_info` gauge of 1. Labels are only of low
//! cardinality: `vd` (the VD number), `slot`, `kind`, `op`, `state`, `leg`; a VD's name and
//! level are labels of `storc_vd_info` alone, to be joined on `vd`.
//!
//! States are state sets, as node_md's `node_md_state`: one series per possible state, 1 for
//! the state the object is in and 0 for the others (`storc_vd_state{vd="0",state="Dgrd"} 1`),
//! so an alert is `storc_vd_state{state="Optl"} == 0` and a state that is never entered still
//! has a series. The state words are storcli's, as `storc /c0 show` prints them. README.md
//! ("Metrics") lists every series.

mod gather;
mod gather_duties;

use super::api::Shared;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// A series' labels, in order: (name, value).
pub(super) type Labels = Vec<(&'static str, String)>;

/// What a metric family holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Gauge,
    /// Named without `_total`: the encoder appends it.
    Counter,
    /// Named without `_info`: the encoder appends it; every sample is 1.
    Info,
    Histogram,
}

/// One sample's value.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Value {
    Int(u64),
    Float(f64),
    /// Buckets as (upper bound, requests in that bucket alone); `count` includes those above
    /// every bound.
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub samples: Vec<(Labels, Value)>,
}

impl Family {
    pub fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family { name, help, kind, samples: Vec::new() }
    }

    pub fn with(mut self, labels: Labels, value: Value) -> Family {
        self.samples.push((labels, value));
        self
    }

    pub fn push(&mut self, labels: Labels, value: Value) {
        self.samples.push((labels, value));
    }

    /// One series per state of `states`, 1 for `current` and 0 for the others; a current state
    /// outside the list gets a series of its own, so nothing is hidden.
    pub fn push_state_set(&mut self, labels: &Labels, states: &[&str], current: &str) {
        let extra = (!states.contains(&current)).then_some(current);
        for state in states.iter().copied().chain(extra) {
            let mut labels = labels.clone();
            labels.push(("state", state.to_string()));
            self.push(labels, Value::Int(u64::from(state == current)));
        }
    }
}

/// Families that take one value each per object (a VD, a cache VD), filled a row at a time.
pub(super) struct Columns {
    families: Vec<Family>,
}

impl Columns {
    pub fn new(definitions: &[(&'static str, Kind, &'static str)]) -> Columns {
        Columns { families: definitions.iter().map(|(name, kind, help)| Family::new(name, *kind, help)).collect() }
    }

    /// One object's values, in the order of the definitions.
    pub fn add(&mut self, labels: &Labels, values: &[u64]) {
        assert_eq!(values.len(), self.families.len(), "one value per family");
        for (family, value) in self.families.iter_mut().zip(values) {
            family.push(labels.clone(), Value::Int(*value));
        }
    }

    pub fn into_families(self) -> Vec<Family> {
        self.families
    }
}

/// A boolean as a gauge's 0 or 1.
pub(super) fn flag(value: bool) -> Value {
    Value::Int(u64::from(value))
}

/// The families of one scrape, handed to the registry as a collector.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let metric_type = match family.kind {
                Kind::Gauge => MetricType::Gauge,
                Kind::Counter => MetricType::Counter,
                Kind::Info => MetricType::Info,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(family.name, family.help, None, metric_type)?;
            for (labels, value) in &family.samples {
                if family.kind == Kind::Info {
                    metric.encode_info(labels)?;
                    continue;
                }
                let mut series = metric.encode_family(labels)?;
                match (family.kind, value) {
                    (Kind::Counter, Value::Int(v)) => series.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    (Kind::Counter, Value::Float(v)) => series.encode_counter::<NoLabelSet, _, f64>(v, None)?,
                    (Kind::Gauge, Value::Int(v)) => series.encode_gauge(v)?,
                    (Kind::Gauge, Value::Float(v)) => series.encode_gauge(v)?,
                    (Kind::Histogram, Value::Histogram { sum, count, buckets }) => {
                        series.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
                    }
                    (kind, value) => unreachable!("{}: a {kind:?} family holds {value:?}", family.name),
                }
            }
        }
        Ok(())
    }
}

/// The families in Prometheus' text format; a family with no series now (no rebuild runs, no
/// SSD cache) is left out, as Prometheus' own clients do.
pub(super) fn render(mut families: Vec<Family>) -> String {
    families.retain(|family| !family.samples.is_empty());
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(families)));
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a family built wrong.
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).expect("metrics encode into a String");
    text
}

/// One scrape at a time: each asks every shard for its cache's counters and takes a blocking
/// thread, so scrapes arriving together wait in line (as futures) instead of piling up there.
static SCRAPES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// `GET /metrics`.
pub(super) async fn metrics(State(state): State<Shared>) -> Response {
    let Ok(_turn) = SCRAPES.acquire().await else {
        // Never closed; answered rather than unwrapped all the same.
        return (StatusCode::INTERNAL_SERVER_ERROR, "the scrape queue is closed\n").into_response();
    };
    match tokio::task::spawn_blocking(move || render(gather::all(&state))).await {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus_client::encoding::prometheus_text::CONTENT_TYPE)], text).into_response(),
        Err(join) => (StatusCode::INTERNAL_SERVER_ERROR, format!("collecting the metrics failed: {join}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vd(id: u32) -> Labels {
        vec![("vd", id.to_string())]
    }

    #[test]
    fn families_render_in_prometheus_text_format() {
        let mut state = Family::new("storc_vd_state", Kind::Gauge, "The VD's state.");
        state.push_state_set(&vd(0), &["Optl", "Dgrd"], "Dgrd");
        state.push_state_set(&vd(1), &["Optl", "Dgrd"], "Weird");
        let families = vec![
            Family::new("storc_controller", Kind::Info, "What runs.").with(vec![("version", "1.2\"3".into())], Value::Int(1)),
            state,
            Family::new("storc_vd_io_operations", Kind::Counter, "Requests.")
                .with(vec![("vd", "0".into()), ("op", "read".into())], Value::Int(7)),
            Family::new("storc_cache_dirty_bytes", Kind::Gauge, "Dirty.").with(Vec::new(), Value::Int(4096)),
            Family::new("storc_background_paused", Kind::Gauge, "Paused (none runs: left out)."),
            Family::new("storc_background_progress_ratio", Kind::Gauge, "Done.").with(vd(0), Value::Float(0.25)),
            Family::new("storc_vd_io_duration_seconds", Kind::Histogram, "Latency.")
                .with(vd(0), Value::Histogram { sum: 0.5, count: 4, buckets: vec![(0.001, 1), (0.01, 2)] }),
        ];
        let expected = "\
# HELP storc_controller_info What runs.
# TYPE storc_controller_info gauge
storc_controller_info{version=\"1.2\\\"3\"} 1
# HELP storc_vd_state The VD's state.
# TYPE storc_vd_state gauge
storc_vd_state{vd=\"0\",state=\"Optl\"} 0
storc_vd_state{vd=\"0\",state=\"Dgrd\"} 1
storc_vd_state{vd=\"1\",state=\"Optl\"} 0
storc_vd_state{vd=\"1\",state=\"Dgrd\"} 0
storc_vd_state{vd=\"1\",state=\"Weird\"} 1
# HELP storc_vd_io_operations_total Requests.
# TYPE storc_vd_io_operations_total counter
storc_vd_io_operations_total{vd=\"0\",op=\"read\"} 7
# HELP storc_cache_dirty_bytes Dirty.
# TYPE storc_cache_dirty_bytes gauge
storc_cache_dirty_bytes 4096
# HELP storc_background_progress_ratio Done.
# TYPE storc_background_progress_ratio gauge
storc_background_progress_ratio{vd=\"0\"} 0.25
# HELP storc_vd_io_duration_seconds Latency.
# TYPE storc_vd_io_duration_seconds histogram
storc_vd_io_duration_seconds_bucket{vd=\"0\",le=\"0.001\"} 1
storc_vd_io_duration_seconds_bucket{vd=\"0\",le=\"0.01\"} 3
storc_vd_io_duration_seconds_bucket{vd=\"0\",le=\"+Inf\"} 4
storc_vd_io_duration_seconds_sum{vd=\"0\"} 0.5
storc_vd_io_duration_seconds_count{vd=\"0\"} 4
";
        assert_eq!(render(families), expected);
    }
}
