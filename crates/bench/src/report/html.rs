//! The HTML page: header (what was measured), a chart and a table per pattern, the ratings,
//! and with a second document the ratio table. Inline CSS, inline SVG, no script.

use super::chart::{self, Chart, Kind, Series};
use super::{axis_short, axis_value_text, pattern_charts, ratios, size_text};
use crate::results::{PatternResult, Results};
use std::fmt::Write;

const STYLE: &str = r#"
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 24px auto; max-width: 1280px; padding: 0 16px; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 19px; margin-top: 36px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
.meta { border-collapse: collapse; margin: 8px 0 16px; }
.meta th { text-align: left; padding: 2px 14px 2px 0; color: #555; font-weight: 600; vertical-align: top; }
.meta td { padding: 2px 0; }
.desc { color: #444; margin: 4px 0; }
.note { color: #666; font-size: 13px; margin: 2px 0 8px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { border: 1px solid #ddd; border-radius: 4px; background: #fff; max-width: 100%; height: auto; }
svg .title { font-size: 15px; font-weight: 600; fill: #222; }
svg .tick { font-size: 11px; fill: #444; }
svg .label { font-size: 12px; fill: #333; }
svg .legend { font-size: 12px; fill: #222; }
svg .value { font-size: 10px; fill: #333; }
table.points { border-collapse: collapse; margin: 10px 0; font-size: 12.5px; font-variant-numeric: tabular-nums; }
table.points th, table.points td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.points th { background: #f3f5f7; }
table.points td.text { text-align: left; }
td.up { background: #d9f2dc; }
td.down { background: #f9dcdc; }
details summary { cursor: pointer; color: #0b5cad; margin: 6px 0; }
.fail { color: #b00020; font-weight: 700; }
"#;

pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' => out += "&quot;",
            '\'' => out += "&#39;",
            c => out.push(c),
        }
    }
    out
}

fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{} {}", chart::number((value * 100.0).round() / 100.0), UNITS[unit])
    }
}

/// The whole report. `compare`: a second document and its label, for the ratio table.
pub fn render(results: &Results, compare: Option<(&Results, &str)>, label: &str) -> String {
    let mut out = String::new();
    let title = format!(
        "storc bench{}: {}",
        results.suite.as_ref().map_or_else(String::new, |s| format!(" suite {s}")),
        results.target.description
    );
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n",
        escape(&title)
    );
    let _ = writeln!(out, "<h1>{}</h1>", escape(&title));
    header(&mut out, results);
    if let Some(failure) = results.failure() {
        let _ = writeln!(out, "<p class=\"fail\">{}</p>", escape(&failure));
    }
    if let Some((other, other_label)) = compare {
        compare_section(&mut out, results, label, other, other_label);
    }
    ratings_section(&mut out, results);
    for pattern in &results.patterns {
        pattern_section(&mut out, pattern);
    }
    out += "</body></html>\n";
    out
}

fn header(out: &mut String, r: &Results) {
    let t = &r.target;
    let mut rows: Vec<(&str, String)> = vec![
        ("target", format!("{} ({})", t.spec, t.kind)),
        ("description", t.description.clone()),
        ("capacity", bytes_text(t.capacity_bytes)),
    ];
    if let Some(level) = &t.level {
        rows.push(("level", level.clone()));
    }
    if let Some(count) = t.drive_count {
        rows.push(("drives", count.to_string()));
    }
    if let Some(strip) = t.strip_size_bytes {
        rows.push(("strip size", bytes_text(strip)));
    }
    if !t.drives.is_empty() {
        let drives: Vec<String> = t
            .drives
            .iter()
            .map(|d| {
                format!(
                    "{} ({}{}, {}{})",
                    d.name,
                    d.kind,
                    d.model.as_ref().map_or_else(String::new, |m| format!(" {m}")),
                    bytes_text(d.capacity_bytes),
                    if d.direct_io { ", direct I/O" } else { "" }
                )
            })
            .collect();
        rows.push(("member drives", drives.join("; ")));
    }
    rows.push((
        "policies",
        t.policies.as_ref().map_or_else(
            || "unknown".into(),
            |p| {
                format!(
                    "write {}, read {}, io {}{}",
                    p.write,
                    p.read,
                    p.io,
                    if p.note.is_empty() { String::new() } else { format!(" ({})", p.note) }
                )
            },
        ),
    ));
    if let Some(direct) = t.direct_io {
        rows.push(("direct I/O", direct.to_string()));
    }
    if let Some(shards) = t.engine_shards {
        rows.push(("engine shards", shards.to_string()));
    }
    rows.push(("storc version", r.storc_version.clone()));
    let m = &r.machine;
    rows.push(("machine", format!("{}: {} cores, {}, {}, {} RAM", m.hostname, m.cores, m.cpu_model, m.kernel, bytes_text(m.memory_bytes))));
    let s = &r.settings;
    let mut settings = format!(
        "{} loop, {} s per point after {} s ramp, seed {}{}{}",
        s.loop_kind,
        s.duration_s,
        s.ramp_s,
        s.seed,
        if s.verify { ", verifying reads" } else { "" },
        if s.quick { ", quick (reduced sweeps)" } else { "" }
    );
    if let Some(rate) = s.rate_iops {
        let _ = write!(settings, ", {rate} IOPS offered");
    }
    if let Some(qd) = &s.queue_depths {
        let _ = write!(settings, ", --qd {qd:?}");
    }
    if let Some(blocks) = &s.block_sizes {
        let blocks: Vec<String> = blocks.iter().map(|&b| size_text(b)).collect();
        let _ = write!(settings, ", --block {}", blocks.join(","));
    }
    rows.push(("settings", settings));
    rows.push(("started", format!("{} (Unix seconds)", r.started_unix_s)));
    rows.push(("command", r.command_line.clone()));
    out.push_str("<table class=\"meta\">\n");
    for (name, value) in rows {
        let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", escape(name), escape(&value));
    }
    out.push_str("</table>\n");
}

fn ratings_section(out: &mut String, r: &Results) {
    let rated: Vec<&PatternResult> = r.patterns.iter().filter(|p| !p.ratings.is_empty()).collect();
    if rated.is_empty() {
        return;
    }
    out.push_str("<h2 id=\"ratings\">Performance rating</h2>\n<p class=\"desc\">Σ over queue depth q ∈ {1, 2, 4, 8, 16, 32} of IOPS(q)/q (seed 001), for every pattern measured at all six depths.</p>\n");
    let mut categories = Vec::new();
    let mut points = Vec::new();
    let mut rows = String::new();
    for p in &rated {
        for rating in &p.ratings {
            let rest: Vec<String> =
                rating.coordinates.iter().map(|(a, v)| format!("{} {}", axis_short(a), axis_value_text(a, *v))).collect();
            let label = if rest.is_empty() { p.name.clone() } else { format!("{} ({})", p.name, rest.join(", ")) };
            points.push((categories.len() as f64, rating.value));
            categories.push(label.clone());
            let terms: Vec<String> = rating.terms.iter().map(|t| format!("QD{}: {}", t.queue_depth, chart::number(t.iops))).collect();
            let _ = writeln!(
                rows,
                "<tr><td class=\"text\">{}</td><td>{:.1}</td><td class=\"text\">{}</td></tr>",
                escape(&label),
                rating.value,
                escape(&terms.join(", "))
            );
        }
    }
    let chart = Chart {
        id: "chart-ratings".into(),
        title: "performance rating".into(),
        x_label: String::new(),
        y_label: "Σ IOPS(q)/q".into(),
        kind: Kind::Bar,
        x_log2: false,
        x_format: chart::plain,
        categories,
        series: vec![Series { name: "rating".into(), points }],
    };
    let _ = writeln!(out, "<div class=\"charts\">{}</div>", chart.svg());
    let _ = writeln!(out, "<table class=\"points\"><tr><th>pattern</th><th>rating</th><th>IOPS per queue depth</th></tr>\n{rows}</table>");
}

fn pattern_section(out: &mut String, p: &PatternResult) {
    let _ = writeln!(out, "<h2 id=\"pattern-{}\">{}</h2>", super::slug(&p.name), escape(&p.name));
    let _ = writeln!(out, "<p class=\"desc\">{} <i>({})</i></p>", escape(&p.description), escape(&p.source));
    if !p.notes.is_empty() {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", escape(&p.notes));
    }
    for g in &p.groups {
        let lines: Vec<String> = g
            .lines
            .iter()
            .map(|l| format!("{} {}% read {}% random {}%", size_text(l.block_bytes), l.share_percent, l.read_percent, l.random_percent))
            .collect();
        // Results written before distributions existed have none: uniform.
        let skew = match g.distribution.as_str() {
            "" | "uniform" => String::new(),
            distribution => format!(", random offsets {distribution}"),
        };
        let _ = writeln!(
            out,
            "<p class=\"note\">workers: {} × QD {}, {}{}; {}</p>",
            g.workers,
            g.queue_depth,
            escape(&g.zone),
            escape(&skew),
            escape(&lines.join(", "))
        );
    }
    let charts = pattern_charts(p);
    if !charts.is_empty() {
        out.push_str("<div class=\"charts\">");
        for c in &charts {
            out.push_str(&c.svg());
        }
        out.push_str("</div>\n");
    }
    points_table(out, p);
}

fn points_table(out: &mut String, p: &PatternResult) {
    let axes: Vec<&str> = p.axes.iter().map(|a| a.axis.as_str()).collect();
    let verifying = p.points.iter().any(|pt| pt.verify.is_some());
    out.push_str("<table class=\"points\"><tr>");
    for a in &axes {
        let _ = write!(out, "<th>{}</th>", escape(axis_short(a)));
    }
    for h in ["workers", "total QD", "IOPS", "MB/s", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "ops", "errors"] {
        let _ = write!(out, "<th>{h}</th>");
    }
    if verifying {
        out.push_str("<th>mismatches</th>");
    }
    out.push_str("</tr>\n");
    for pt in &p.points {
        out.push_str("<tr>");
        for a in &axes {
            let v = pt.coordinates.get(*a).map(|&v| axis_value_text(a, v)).unwrap_or_default();
            let _ = write!(out, "<td>{}</td>", escape(&v));
        }
        if let Some(reason) = &pt.skipped {
            let _ = writeln!(out, "<td class=\"text\" colspan=\"{}\">skipped: {}</td></tr>", 11 + usize::from(verifying), escape(reason));
            continue;
        }
        let l = &pt.latency_us;
        let cells = [
            pt.workers.to_string(),
            pt.total_queue_depth.to_string(),
            format!("{:.0}", pt.iops),
            format!("{:.1}", pt.mb_per_s),
            format!("{:.1}", l.mean),
            format!("{:.1}", l.p50),
            format!("{:.1}", l.p99),
            format!("{:.1}", l.p99_9),
            format!("{:.1}", l.max),
            pt.ops.to_string(),
            pt.errors.to_string(),
        ];
        for c in cells {
            let _ = write!(out, "<td>{c}</td>");
        }
        if verifying {
            let _ = write!(out, "<td>{}</td>", pt.verify.as_ref().map_or(0, |v| v.mismatched_sectors));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

fn ratio_cell(ratio: f64, higher_is_better: bool) -> String {
    if !ratio.is_finite() {
        return "<td>–</td>".into();
    }
    let class = if (ratio - 1.0).abs() < 1e-9 {
        ""
    } else if (ratio > 1.0) == higher_is_better {
        " class=\"up\""
    } else {
        " class=\"down\""
    };
    format!("<td{class}>{ratio:.2}</td>")
}

fn compare_section(out: &mut String, a: &Results, a_label: &str, b: &Results, b_label: &str) {
    let rows = ratios(a, b);
    let _ = write!(
        out,
        "<h2 id=\"compare\">Comparison: {} / {}</h2>\n<p class=\"desc\">A = {} ({}), B = {} ({}). Every point measured in both: value A / value B. \
         Green: A better (more IOPS, less latency), red: A worse.</p>\n",
        escape(a_label),
        escape(b_label),
        escape(a_label),
        escape(&a.target.description),
        escape(b_label),
        escape(&b.target.description)
    );
    if rows.is_empty() {
        out.push_str("<p class=\"note\">No point was measured in both documents.</p>\n");
        return;
    }
    out.push_str("<table class=\"points\" id=\"compare-table\"><tr><th>pattern</th><th>point</th><th>IOPS A</th><th>IOPS B</th><th>IOPS A/B</th><th>MB/s A</th><th>MB/s B</th><th>mean µs A</th><th>mean µs B</th><th>latency A/B</th></tr>\n");
    for r in &rows {
        let point: Vec<String> = r.coordinates.iter().map(|(k, v)| format!("{} {}", axis_short(k), axis_value_text(k, *v))).collect();
        let _ = writeln!(
            out,
            "<tr><td class=\"text\">{}</td><td class=\"text\">{}</td><td>{:.0}</td><td>{:.0}</td>{}<td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td>{}</tr>",
            escape(&r.pattern),
            escape(&point.join(", ")),
            r.iops_a,
            r.iops_b,
            ratio_cell(r.iops_ratio(), true),
            r.mb_a,
            r.mb_b,
            r.latency_a,
            r.latency_b,
            ratio_cell(r.latency_ratio(), false)
        );
    }
    out.push_str("</table>\n");
}
