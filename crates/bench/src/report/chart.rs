//! A small SVG chart writer: line charts (linear or log2 x axis) and grouped bar charts, with
//! axes, ticks, labels and a legend. The output is inline SVG: no script, no external file.

use super::html::escape;
use std::fmt::Write;

const WIDTH: f64 = 610.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
/// Rough width of one tick-label character, to decide when category labels would collide.
const TICK_CHAR_PX: f64 = 6.5;
/// Characters a slanted category label keeps: at -30 degrees that fits the bottom margin.
const SLANTED_LABEL_CHARS_MAX: usize = 12;
/// Colour-blind friendly (Okabe-Ito, then a few more).
const COLOURS: [&str; 10] = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999933", "#882255", "#44aa99"];

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Line,
    Bar,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    /// Line: (x, y). Bar: (category index, y).
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub kind: Kind,
    /// Line charts: a log2 x axis with a tick at every data x.
    pub x_log2: bool,
    /// How an x value (line) is labelled on the axis.
    pub x_format: fn(f64) -> String,
    /// Bar charts: the category labels.
    pub categories: Vec<String>,
    pub series: Vec<Series>,
}

pub fn plain(x: f64) -> String {
    number(x)
}

/// `12`, `1.5`, `12.3k`, `4.1M`.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Ticks from 0 to a round number at or above `max`.
fn nice_ticks(max: f64) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    let count = (max / step).ceil() as usize;
    (0..=count.max(1)).map(|i| i as f64 * step).collect()
}

impl Chart {
    pub fn svg(&self) -> String {
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let y_max = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let y_ticks = nice_ticks(y_max);
        let y_top = *y_ticks.last().unwrap_or(&1.0);
        let ys = |v: f64| TOP + plot_h - (v / y_top) * plot_h;
        let mut out = String::new();
        let _ = write!(
            out,
            r#"<svg id="{}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{}">"#,
            escape(&self.id),
            escape(&self.title)
        );
        let _ = write!(out, r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>"##);
        let _ =
            write!(out, r#"<text x="{}" y="22" class="title" text-anchor="middle">{}</text>"#, LEFT + plot_w / 2.0, escape(&self.title));
        // Y grid and ticks.
        for &t in &y_ticks {
            let y = ys(t);
            let _ = write!(out, r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e3e3e3"/>"##, LEFT + plot_w);
            let _ = write!(out, r#"<text x="{}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#, LEFT - 6.0, y + 4.0, number(t));
        }
        let _ = write!(
            out,
            r#"<text class="label" text-anchor="middle" transform="translate(18 {:.1}) rotate(-90)">{}</text>"#,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{}" class="label" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 12.0,
            escape(&self.x_label)
        );
        match self.kind {
            Kind::Line => self.lines(&mut out, plot_w, &ys),
            Kind::Bar => self.bars(&mut out, plot_w, &ys),
        }
        // Axes over the grid.
        let _ = write!(out, r##"<path d="M{LEFT} {TOP} V{} H{}" fill="none" stroke="#333"/>"##, TOP + plot_h, LEFT + plot_w);
        // Legend.
        let legend_x = WIDTH - RIGHT + 16.0;
        for (i, s) in self.series.iter().enumerate() {
            let y = TOP + 8.0 + i as f64 * 20.0;
            let colour = COLOURS[i % COLOURS.len()];
            let _ = write!(out, r#"<rect x="{legend_x}" y="{:.1}" width="14" height="10" fill="{colour}"/>"#, y - 9.0);
            let _ = write!(out, r#"<text x="{}" y="{y:.1}" class="legend">{}</text>"#, legend_x + 20.0, escape(&s.name));
        }
        out += "</svg>";
        out
    }

    fn lines(&self, out: &mut String, plot_w: f64, ys: &dyn Fn(f64) -> f64) {
        let mut xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let log = self.x_log2 && xs.first().is_some_and(|&x| x > 0.0);
        let f = |x: f64| if log { x.log2() } else { x };
        let (lo, hi) = if log {
            (xs.first().map_or(0.0, |&x| f(x)), xs.last().map_or(1.0, |&x| f(x)))
        } else {
            let ticks = nice_ticks(xs.last().copied().unwrap_or(1.0));
            (xs.first().copied().unwrap_or(0.0).min(0.0), *ticks.last().unwrap_or(&1.0))
        };
        let span = if hi > lo { hi - lo } else { 1.0 };
        let pad = if hi > lo { 0.0 } else { 0.5 };
        let xs_px = |x: f64| LEFT + 12.0 + ((f(x) - lo + pad) / (span + 2.0 * pad)) * (plot_w - 24.0);
        let ticks: Vec<f64> = if log || xs.len() <= 12 && xs.iter().all(|x| x.fract() == 0.0) && !xs.is_empty() {
            // Thin out crowded ticks.
            let step = xs.len().div_ceil(12).max(1);
            xs.iter().copied().step_by(step).collect()
        } else {
            nice_ticks(hi)
        };
        let bottom = HEIGHT - BOTTOM;
        for t in ticks {
            let x = xs_px(t);
            let _ = write!(out, r##"<line x1="{x:.1}" x2="{x:.1}" y1="{bottom}" y2="{}" stroke="#333"/>"##, bottom + 5.0);
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
                bottom + 18.0,
                escape(&(self.x_format)(t))
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut points: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| p.1.is_finite()).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", xs_px(x), ys(y))).collect();
            let _ = write!(out, r#"<polyline class="series" points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#, path.join(" "));
            for &(x, y) in &points {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{}: {} → {}</title></circle>"#,
                    xs_px(x),
                    ys(y),
                    escape(&s.name),
                    escape(&(self.x_format)(x)),
                    number(y)
                );
            }
        }
    }

    fn bars(&self, out: &mut String, plot_w: f64, ys: &dyn Fn(f64) -> f64) {
        let groups = self.categories.len().max(1) as f64;
        let group_w = plot_w / groups;
        let n = self.series.len().max(1) as f64;
        let bar_w = (group_w * 0.8 / n).min(60.0);
        let bottom = HEIGHT - BOTTOM;
        // Labels wider than their group are slanted and shortened (the full name is in the
        // tooltip and in the table under the chart), so that neighbours do not overprint.
        let longest_px = self.categories.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64 * TICK_CHAR_PX;
        let slant = longest_px > group_w;
        for (c, label) in self.categories.iter().enumerate() {
            let centre = LEFT + group_w * (c as f64 + 0.5);
            let _ = if slant {
                let short: String = if label.chars().count() > SLANTED_LABEL_CHARS_MAX {
                    label.chars().take(SLANTED_LABEL_CHARS_MAX - 1).chain(['…']).collect()
                } else {
                    label.clone()
                };
                write!(
                    out,
                    r#"<text class="tick" text-anchor="end" transform="translate({centre:.1} {:.1}) rotate(-30)"><title>{}</title>{}</text>"#,
                    bottom + 12.0,
                    escape(label),
                    escape(&short)
                )
            } else {
                write!(out, r#"<text x="{centre:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#, bottom + 18.0, escape(label))
            };
        }
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            for &(c, y) in &s.points {
                if !y.is_finite() {
                    continue;
                }
                let centre = LEFT + group_w * (c + 0.5);
                let x = centre - bar_w * n / 2.0 + bar_w * i as f64;
                let top = ys(y);
                let _ = write!(
                    out,
                    r#"<rect class="series" x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{colour}"><title>{}: {}</title></rect>"#,
                    (bar_w - 2.0).max(1.0),
                    (bottom - top).max(0.0),
                    escape(&s.name),
                    number(y)
                );
                let _ = write!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" class="value" text-anchor="middle">{}</text>"#,
                    x + bar_w / 2.0 - 1.0,
                    top - 4.0,
                    number(y)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(nice_ticks(93.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert!(*nice_ticks(12345.0).last().unwrap() >= 12345.0);
        assert_eq!(number(12_300.0), "12.3k");
        assert_eq!(number(2.5), "2.5");
    }

    #[test]
    fn a_chart_has_its_id_axes_and_every_series() {
        let chart = Chart {
            id: "c1".into(),
            title: "t <x>".into(),
            x_label: "block".into(),
            y_label: "MB/s".into(),
            kind: Kind::Line,
            x_log2: true,
            x_format: plain,
            categories: vec![],
            series: vec![
                Series { name: "a".into(), points: vec![(512.0, 1.0), (4096.0, 3.0)] },
                Series { name: "b".into(), points: vec![(512.0, 2.0), (4096.0, 5.0)] },
            ],
        };
        let svg = chart.svg();
        assert!(svg.starts_with("<svg id=\"c1\""));
        assert!(svg.contains("t &lt;x&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }
}
