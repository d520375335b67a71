//! `storc bench report`: one self-contained HTML file from a [`Results`] document (and,
//! with `--compare`, the ratio of two), with inline CSS and inline SVG charts drawn here
//! ([`chart`]): no script, no external reference, so it opens offline.
//!
//! Which charts a pattern gets follows the reviews (seeds 000/001): IOPS against write share at
//! QD 1, 16 and 256 for review-database, MB/s against block size (log2) for the block sweeps,
//! MB/s bars per worker count for the multithreaded patterns, mean latency bars for the
//! response-time test, and IOPS/MB/s against the swept variable for every other pattern. Every
//! chart has a table of every point under it.

pub mod chart;
pub mod html;

use crate::results::{PatternResult, Point, Results};
use chart::{Chart, Kind, Series};
use std::collections::BTreeMap;

pub use html::render;

/// A measure's name and how to read it from a point.
type Metric = (&'static str, fn(&Point) -> f64);

/// The charts of one pattern, with ids `chart-PATTERN-N`.
pub fn pattern_charts(pattern: &PatternResult) -> Vec<Chart> {
    let measured: Vec<&Point> = pattern.points.iter().filter(|p| p.skipped.is_none()).collect();
    if measured.is_empty() {
        return Vec::new();
    }
    // Axes that vary among the measured points, in the pattern's order.
    let varying: Vec<String> = pattern
        .axes
        .iter()
        .map(|a| a.axis.clone())
        .filter(|axis| {
            let mut values: Vec<u64> = measured.iter().filter_map(|p| p.coordinates.get(axis).copied()).collect();
            values.sort_unstable();
            values.dedup();
            values.len() > 1
        })
        .collect();
    let id = |n: usize| format!("chart-{}-{n}", slug(&pattern.name));
    let name = pattern.name.as_str();
    let mut charts = Vec::new();
    if name == "review-response-time" || (varying.is_empty() && name.contains("response")) {
        let categories: Vec<String> = measured.iter().map(|p| response_label(p)).collect();
        charts.push(Chart {
            id: id(1),
            title: format!("{name}: mean response time"),
            x_label: "requests".into(),
            y_label: "mean latency (µs)".into(),
            kind: Kind::Bar,
            x_log2: false,
            x_format: chart::plain,
            categories,
            series: vec![Series {
                name: "mean µs".into(),
                points: measured.iter().enumerate().map(|(i, p)| (i as f64, p.latency_us.mean)).collect(),
            }],
        });
        return charts;
    }
    if name.contains("multithreaded") && varying.iter().any(|a| a == "workers") {
        // Bars: MB/s per worker count at the lowest queue depth (the reviews' QD 1), one bar
        // per queue depth measured, so every point shows.
        let workers = distinct(&measured, "workers");
        let depths = distinct(&measured, "queue_depth");
        let series = if depths.is_empty() { vec![None] } else { depths.iter().map(|&d| Some(d)).collect() };
        charts.push(Chart {
            id: id(1),
            title: format!("{name}: MB/s by workers"),
            x_label: "workers".into(),
            y_label: "MB/s".into(),
            kind: Kind::Bar,
            x_log2: false,
            x_format: chart::plain,
            categories: workers.iter().map(|w| format!("{w} worker{}", if *w == 1 { "" } else { "s" })).collect(),
            series: series
                .iter()
                .map(|depth| Series {
                    name: depth.map_or_else(|| "MB/s".into(), |d| format!("QD {d} per worker")),
                    points: workers
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &w)| {
                            measured
                                .iter()
                                .find(|p| {
                                    p.coordinates.get("workers") == Some(&w)
                                        && depth.is_none_or(|d| p.coordinates.get("queue_depth") == Some(&d))
                                })
                                .map(|p| (i as f64, p.mb_per_s))
                        })
                        .collect(),
                })
                .collect(),
        });
        return charts;
    }
    if varying.is_empty() {
        // One point (hba-iops): IOPS and MB/s as bars.
        let p = measured[0];
        for (n, (label, value)) in [("IOPS", p.iops), ("MB/s", p.mb_per_s)].into_iter().enumerate() {
            charts.push(Chart {
                id: id(n + 1),
                title: format!("{name}: {label}"),
                x_label: String::new(),
                y_label: label.into(),
                kind: Kind::Bar,
                x_log2: false,
                x_format: chart::plain,
                categories: vec![name.to_string()],
                series: vec![Series { name: label.into(), points: vec![(0.0, value)] }],
            });
        }
        return charts;
    }
    // Line charts: x is the block size if swept, else write share for review-database, else the
    // fastest-varying axis; every other varying axis makes the series.
    let x_axis = if varying.iter().any(|a| a == "block_bytes") {
        "block_bytes".to_string()
    } else if varying.iter().any(|a| a == "write_percent") && name == "review-database" {
        "write_percent".to_string()
    } else {
        varying.last().cloned().unwrap_or_default()
    };
    let series_axes: Vec<String> = varying.iter().filter(|a| **a != x_axis).cloned().collect();
    let metrics: Vec<Metric> = if x_axis == "block_bytes" {
        if name.contains("random") {
            vec![("MB/s", |p| p.mb_per_s), ("IOPS", |p| p.iops)]
        } else {
            vec![("MB/s", |p| p.mb_per_s)]
        }
    } else if pattern.groups.iter().flat_map(|g| g.lines.iter()).any(|l| l.block_bytes >= 256 * 1024) && !name.contains("server") {
        vec![("MB/s", |p| p.mb_per_s), ("IOPS", |p| p.iops)]
    } else {
        vec![("IOPS", |p| p.iops), ("MB/s", |p| p.mb_per_s)]
    };
    // review-database: the reviews drew QD 1, 16 and 256.
    let keep = |p: &Point| {
        name != "review-database"
            || !distinct(&measured, "queue_depth").iter().any(|d| [1, 16, 256].contains(d))
            || p.coordinates.get("queue_depth").is_none_or(|d| [1, 16, 256].contains(d))
    };
    // With several series axes (the software-RAID matrix), one chart per combination of all
    // but the last; the last makes the lines.
    let (panel_axes, line_axes) = series_axes.split_at(series_axes.len().saturating_sub(1));
    let mut panels: BTreeMap<Vec<u64>, BTreeMap<Vec<u64>, Vec<&Point>>> = BTreeMap::new();
    for p in measured.iter().copied().filter(|p| keep(p)) {
        let key = |axes: &[String]| -> Vec<u64> { axes.iter().map(|a| p.coordinates.get(a).copied().unwrap_or(0)).collect() };
        panels.entry(key(panel_axes)).or_default().entry(key(line_axes)).or_default().push(p);
    }
    let log = matches!(x_axis.as_str(), "block_bytes" | "queue_depth" | "workers") && {
        let xs = distinct(&measured, &x_axis);
        xs.first().is_some_and(|&lo| lo > 0 && xs.last().is_some_and(|&hi| hi / lo >= 8))
    };
    for (panel, groups) in &panels {
        let panel_text: Vec<String> = panel_axes.iter().zip(panel).map(|(a, v)| axis_value_label(a, *v)).collect();
        for (metric, value) in &metrics {
            let series: Vec<Series> = groups
                .iter()
                .map(|(key, points)| Series {
                    name: if line_axes.is_empty() {
                        metric.to_string()
                    } else {
                        line_axes.iter().zip(key).map(|(a, v)| axis_value_label(a, *v)).collect::<Vec<_>>().join(", ")
                    },
                    points: points.iter().map(|p| (p.coordinates.get(&x_axis).copied().unwrap_or(0) as f64, value(p))).collect(),
                })
                .collect();
            charts.push(Chart {
                id: id(charts.len() + 1),
                title: if panel_text.is_empty() {
                    format!("{name}: {metric} by {}", axis_title(&x_axis))
                } else {
                    format!("{metric} by {}, {}", axis_title(&x_axis), panel_text.join(", "))
                },
                x_label: axis_title(&x_axis).to_string() + if log { " (log scale)" } else { "" },
                y_label: metric.to_string(),
                kind: Kind::Line,
                x_log2: log,
                x_format: x_format(&x_axis),
                categories: Vec::new(),
                series,
            });
        }
    }
    charts
}

/// Every chart id the report of `results` has, in order.
pub fn chart_ids(results: &Results) -> Vec<String> {
    let mut ids: Vec<String> = results.patterns.iter().flat_map(|p| pattern_charts(p).into_iter().map(|c| c.id)).collect();
    if results.patterns.iter().any(|p| !p.ratings.is_empty()) {
        ids.push("chart-ratings".into());
    }
    ids
}

fn response_label(p: &Point) -> String {
    match p.coordinates.get("write_percent") {
        Some(0) => "read".into(),
        Some(100) => "write".into(),
        Some(w) => format!("{w}% writes"),
        None => format!("{} reads / {} writes", p.read_ops, p.write_ops),
    }
}

fn distinct(points: &[&Point], axis: &str) -> Vec<u64> {
    let mut values: Vec<u64> = points.iter().filter_map(|p| p.coordinates.get(axis).copied()).collect();
    values.sort_unstable();
    values.dedup();
    values
}

pub fn slug(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

pub fn axis_title(axis: &str) -> &str {
    match axis {
        "queue_depth" => "queue depth per worker",
        "workers" => "workers",
        "block_bytes" => "block size",
        "write_percent" => "write share (%)",
        "read_percent" => "read share (%)",
        "random_percent" => "random share (%)",
        other => other,
    }
}

pub fn axis_short(axis: &str) -> &str {
    match axis {
        "queue_depth" => "QD",
        "workers" => "workers",
        "block_bytes" => "block",
        "write_percent" => "write %",
        "read_percent" => "read %",
        "random_percent" => "random %",
        other => other,
    }
}

pub fn axis_value_label(axis: &str, value: u64) -> String {
    match axis {
        "block_bytes" => size_text(value),
        "write_percent" | "read_percent" | "random_percent" => {
            format!("{} {value}", axis_short(axis))
        }
        _ => format!("{} {value}", axis_short(axis)),
    }
}

pub fn axis_value_text(axis: &str, value: u64) -> String {
    if axis == "block_bytes" {
        size_text(value)
    } else {
        value.to_string()
    }
}

fn x_format(axis: &str) -> fn(f64) -> String {
    match axis {
        "block_bytes" => |x| size_text(x as u64),
        _ => chart::plain,
    }
}

/// `512`, `4K`, `1M`.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// One row of the `--compare` table: a point present in both documents.
#[derive(Clone, Debug)]
pub struct Ratio {
    pub pattern: String,
    pub coordinates: BTreeMap<String, u64>,
    pub iops_a: f64,
    pub iops_b: f64,
    pub mb_a: f64,
    pub mb_b: f64,
    pub latency_a: f64,
    pub latency_b: f64,
}

impl Ratio {
    pub fn iops_ratio(&self) -> f64 {
        self.iops_a / self.iops_b
    }
    pub fn latency_ratio(&self) -> f64 {
        self.latency_a / self.latency_b
    }
}

/// Every (pattern, point) measured in both `a` and `b`, in `a`'s order.
pub fn ratios(a: &Results, b: &Results) -> Vec<Ratio> {
    let mut out = Vec::new();
    for pa in &a.patterns {
        let Some(pb) = b.patterns.iter().find(|p| p.name == pa.name) else {
            continue;
        };
        for point_a in pa.points.iter().filter(|p| p.skipped.is_none()) {
            let Some(point_b) = pb.points.iter().find(|p| p.skipped.is_none() && p.coordinates == point_a.coordinates) else {
                continue;
            };
            out.push(Ratio {
                pattern: pa.name.clone(),
                coordinates: point_a.coordinates.clone(),
                iops_a: point_a.iops,
                iops_b: point_b.iops,
                mb_a: point_a.mb_per_s,
                mb_b: point_b.mb_per_s,
                latency_a: point_a.latency_us.mean,
                latency_b: point_b.latency_us.mean,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{AxisValues, PatternResult, Point, Rating, RatingTerm};

    fn point(coordinates: &[(&str, u64)], iops: f64) -> Point {
        Point {
            coordinates: coordinates.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            workers: 1,
            iops,
            mb_per_s: iops * 8192.0 / 1e6,
            ..Point::default()
        }
    }

    fn database(scale: f64) -> Results {
        let mut points = Vec::new();
        for w in [0, 50, 100] {
            for q in [1, 2, 16, 256] {
                points.push(point(&[("write_percent", w), ("queue_depth", q)], scale * (1000.0 + q as f64 * 10.0 - w as f64)));
            }
        }
        Results {
            patterns: vec![
                PatternResult {
                    name: "review-database".into(),
                    axes: vec![
                        AxisValues { axis: "write_percent".into(), unit: "percent".into(), values: vec![0, 50, 100] },
                        AxisValues { axis: "queue_depth".into(), unit: "requests".into(), values: vec![1, 2, 16, 256] },
                    ],
                    points,
                    ..PatternResult::default()
                },
                PatternResult {
                    name: "rating".into(),
                    axes: vec![AxisValues { axis: "queue_depth".into(), unit: "requests".into(), values: vec![1, 2] }],
                    points: vec![point(&[("queue_depth", 1)], scale * 100.0), point(&[("queue_depth", 2)], scale * 150.0)],
                    ratings: vec![Rating {
                        coordinates: BTreeMap::new(),
                        value: 175.0,
                        terms: vec![RatingTerm { queue_depth: 1, iops: 100.0 }],
                    }],
                    ..PatternResult::default()
                },
            ],
            ..Results::default()
        }
    }

    #[test]
    fn review_database_draws_qd_1_16_256_against_write_share() {
        let results = database(1.0);
        let charts = pattern_charts(&results.patterns[0]);
        assert_eq!(charts[0].id, "chart-review-database-1");
        assert_eq!(charts[0].y_label, "IOPS");
        let names: Vec<&str> = charts[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["QD 1", "QD 16", "QD 256"]);
        assert!(charts[0].series.iter().all(|s| s.points.iter().map(|p| p.0).eq([0.0, 50.0, 100.0])));
        assert_eq!(
            chart_ids(&results),
            ["chart-review-database-1", "chart-review-database-2", "chart-rating-1", "chart-rating-2", "chart-ratings"]
        );
    }

    #[test]
    fn the_report_is_self_contained_and_compares_point_by_point() {
        let a = database(2.0);
        let mut b = database(1.0);
        b.patterns[0].points.truncate(4);
        let rows = ratios(&a, &b);
        assert_eq!(rows.len(), 4 + 2, "only points in both documents");
        assert!(rows.iter().all(|r| (r.iops_ratio() - 2.0).abs() < 1e-9));
        let html = render(&a, Some((&b, "b.json")), "a.json");
        assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("<script"));
        for id in chart_ids(&a) {
            assert!(html.contains(&format!("<svg id=\"{id}\"")), "{id}");
        }
        assert_eq!(html.matches("<td class=\"up\">2.00</td>").count(), 6);
        assert!(html.contains("Σ IOPS(q)/q"));
    }
}
