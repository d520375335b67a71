// storc console: the live I/O charts (IOPS, MB/s, mean latency per VD), drawn as SVG from the
// counters of GET /api/v1/iostats, sampled once a second by console.js. No chart library.
'use strict';

window.StorcCharts = (() => {
  /** Seconds of I/O history the charts keep and draw. */
  const HISTORY_SECONDS = 60;
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#65a30d'];
  /** vd id -> {name, samples: [{elapsedMs, reads, writes, readBytes, writtenBytes, readNs, writeNs}]} */
  const ioHistory = new Map();

  /** Keeps one `GET /api/v1/iostats` answer. */
  function record(iostats) {
    const live = new Set();
    for (const v of iostats.vds) {
      live.add(v.vd);
      const entry = ioHistory.get(v.vd) || { name: v.name, samples: [] };
      entry.name = v.name;
      const last = entry.samples[entry.samples.length - 1];
      // A sample older than the last one is a restarted daemon: start over.
      if (last && iostats.elapsed_ms < last.elapsedMs) entry.samples = [];
      if (!last || iostats.elapsed_ms > last.elapsedMs) {
        entry.samples.push({
          elapsedMs: iostats.elapsed_ms, reads: v.reads, writes: v.writes, readBytes: v.read_bytes, writtenBytes: v.written_bytes,
          readNs: v.read_latency_ns_total, writeNs: v.write_latency_ns_total,
        });
      }
      while (entry.samples.length > 2 && iostats.elapsed_ms - entry.samples[0].elapsedMs > (HISTORY_SECONDS + 2) * 1000) entry.samples.shift();
      ioHistory.set(v.vd, entry);
    }
    for (const vd of [...ioHistory.keys()]) if (!live.has(vd)) ioHistory.delete(vd);
  }

  /** Rates between consecutive samples: [{t (s, end of interval), iops, mbps, latencyUs}]. */
  function rates(samples) {
    const points = [];
    for (let i = 1; i < samples.length; i += 1) {
      const [a, b] = [samples[i - 1], samples[i]];
      const seconds = (b.elapsedMs - a.elapsedMs) / 1000;
      if (seconds <= 0) continue;
      const ops = (b.reads - a.reads) + (b.writes - a.writes);
      const moved = (b.readBytes - a.readBytes) + (b.writtenBytes - a.writtenBytes);
      const waitedNs = (b.readNs - a.readNs) + (b.writeNs - a.writeNs);
      points.push({ t: b.elapsedMs / 1000, iops: ops / seconds, mbps: moved / seconds / 1e6, latencyUs: ops > 0 ? waitedNs / ops / 1000 : 0 });
    }
    return points;
  }

  /** 1, 2 or 5 times a power of ten, at least `value`. */
  function niceCeiling(value) {
    if (value <= 0) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 5, 10].map((m) => m * power).find((candidate) => candidate >= value);
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function drawChart(target, series, field) {
    const [width, height, left, bottom, top] = [360, 150, 44, 18, 8];
    const now = Math.max(0, ...series.flatMap((s) => s.points.map((p) => p.t)));
    const from = now - HISTORY_SECONDS;
    const peak = niceCeiling(Math.max(0, ...series.flatMap((s) => s.points.map((p) => p[field]))));
    const x = (t) => left + ((t - from) / HISTORY_SECONDS) * (width - left - 4);
    const y = (v) => height - bottom - (v / peak) * (height - bottom - top);
    const nodes = [];
    for (const fraction of [0, 0.5, 1]) {
      const value = peak * fraction;
      nodes.push(svg('line', { class: 'grid', x1: left, x2: width - 4, y1: y(value), y2: y(value) }));
      nodes.push(svg('text', { class: 'axis-label', x: left - 4, y: y(value) + 3, 'text-anchor': 'end' }, compact(value)));
    }
    nodes.push(svg('text', { class: 'axis-label', x: left, y: height - 4 }, `-${HISTORY_SECONDS} s`));
    nodes.push(svg('text', { class: 'axis-label', x: width - 4, y: height - 4, 'text-anchor': 'end' }, 'now'));
    for (const s of series) {
      const shown = s.points.filter((p) => p.t >= from);
      if (shown.length < 1) continue;
      const path = shown.map((p) => `${x(p.t).toFixed(1)},${y(p[field]).toFixed(1)}`).join(' ');
      nodes.push(svg('polyline', { class: 'series', stroke: s.color, points: shown.length === 1 ? `${path} ${path}` : path, 'data-vd': s.vd }));
    }
    target.replaceChildren(...nodes);
  }

  function compact(value) {
    if (value >= 1e6) return `${(value / 1e6).toFixed(value >= 1e7 ? 0 : 1)}M`;
    if (value >= 1e3) return `${(value / 1e3).toFixed(value >= 1e4 ? 0 : 1)}k`;
    return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(1);
  }

  /** Draws the three charts into `targets.iops`, `.mbps`, `.latencyUs` and the legend into `.legend`. */
  function render(targets) {
    const series = [...ioHistory.entries()].map(([vd, entry], index) => ({ vd, name: entry.name, color: COLORS[index % COLORS.length], points: rates(entry.samples) }));
    for (const field of ['iops', 'mbps', 'latencyUs']) drawChart(targets[field], series, field);
    targets.legend.replaceChildren(...series.map((s) => {
      const last = s.points[s.points.length - 1];
      const now = last ? `${compact(last.iops)} IOPS, ${last.mbps.toFixed(1)} MB/s, ${compact(last.latencyUs)} µs` : 'no sample yet';
      const swatch = document.createElement('span');
      swatch.className = 'swatch';
      swatch.style.background = s.color;
      const item = document.createElement('span');
      item.dataset.vd = String(s.vd);
      item.append(swatch, `v${s.vd} ${s.name}: ${now}`);
      return item;
    }));
  }

  return { record, render };
})();
