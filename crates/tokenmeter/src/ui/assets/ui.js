// tokenmeter's page: reads api/summary every few seconds and draws it. Plain DOM and SVG, no
// library. Every value from the server is set as text (textContent), never parsed as markup.
'use strict';
(function () {
  const REFRESH_MS = 2000;
  // tokenmeter_capacity_limit_concurrency's bounds, in the order the model names a tie.
  const BOUNDS = [['ttft', 'TTFT'], ['tokens_per_second', 'tokens/s'], ['kv_cache', 'KV cache'], ['max_num_seqs', 'max-num-seqs']];
  const NS = 'http://www.w3.org/2000/svg';
  let last = null;
  let refreshes = 0;

  // === helpers ===

  function svgEl(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k of Object.keys(attrs || {})) e.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(e);
    return e;
  }

  function svgText(parent, x, y, s, attrs) {
    const t = svgEl('text', Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (v === 0) return '0'; // also -0
    const a = Math.abs(v);
    if (a >= 1000 || Number.isInteger(v)) return Math.round(v).toLocaleString('en-US');
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  // Axis ticks: no trailing zeros (0.8, not 0.80).
  function fmtTick(v) {
    return Math.abs(v) >= 1000 ? fmt(v) : String(Number(v.toPrecision(3)));
  }

  function fmtMs(seconds) {
    return seconds === null || seconds === undefined ? '–' : fmt(seconds * 1000);
  }

  function clock(ms) {
    return new Date(ms).toLocaleTimeString('en-GB', { hour12: false });
  }

  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw * (1 - 1e-9)) return m * p;
    return 10 * p;
  }

  function linearTicks(maxValue) {
    const step = niceStep((maxValue > 0 ? maxValue : 1) / 4);
    const max = Math.max(step, Math.ceil((maxValue > 0 ? maxValue : 1) / step - 1e-9) * step);
    const out = [];
    for (let v = 0; v <= max + step / 2; v += step) out.push(Number(v.toPrecision(12)));
    return { max: max, ticks: out };
  }

  // Marker shapes and dash patterns tell series apart without colour.
  function marker(g, shape, x, y, attrs) {
    const a = Object.assign({ class: 'pt' }, attrs);
    if (shape === 'square') return svgEl('rect', Object.assign(a, { x: x - 3, y: y - 3, width: 6, height: 6 }), g);
    if (shape === 'triangle') return svgEl('path', Object.assign(a, { d: `M${x},${y - 4}L${x + 4},${y + 3}L${x - 4},${y + 3}Z` }), g);
    if (shape === 'diamond') return svgEl('path', Object.assign(a, { d: `M${x},${y - 4}L${x + 4},${y}L${x},${y + 4}L${x - 4},${y}Z` }), g);
    return svgEl('circle', Object.assign(a, { cx: x, cy: y, r: 3 }), g);
  }

  // === the one chart function ===
  //
  // spec: { height, x: { min, max, log2, label, ticks, fmt }, left: { label }, right: { label },
  //         series: [{ id, name, axis, points: [[x, y|null]], dash, shape, color }],
  //         hlines: [{ axis, y, label }], vlines: [{ x, label }], empty }
  function drawChart(container, spec) {
    while (container.firstChild) container.removeChild(container.firstChild);
    const width = Math.max(280, container.clientWidth || 600);
    const height = spec.height || 220;
    const hasRight = spec.series.some((s) => s.axis === 'right');
    const m = { l: 58, r: hasRight ? 62 : 18, t: 30, b: 42 };
    const svg = svgEl('svg', { width: width, height: height, viewBox: `0 0 ${width} ${height}` }, container);
    const pw = width - m.l - m.r;
    const ph = height - m.t - m.b;
    const tx = (v) => (spec.x.log2 ? Math.log2(v) : v);
    const x0 = tx(spec.x.min);
    const x1 = tx(spec.x.max);
    const sx = (v) => m.l + ((tx(v) - x0) / (x1 - x0 || 1)) * pw;

    const axisMax = (axis) => {
      let mx = 0;
      for (const s of spec.series) if (s.axis === axis) for (const p of s.points) if (p[1] !== null && p[1] > mx) mx = p[1];
      for (const h of spec.hlines || []) if (h.axis === axis && h.y > mx) mx = h.y;
      return linearTicks(mx);
    };
    const scales = { left: axisMax('left') };
    if (hasRight) scales.right = axisMax('right');
    const sy = (axis, v) => m.t + ph - (v / scales[axis].max) * ph;

    // Axes, grid and their labels (units in every axis title).
    const axes = svgEl('g', { class: 'axis' }, svg);
    for (const v of scales.left.ticks) {
      const y = sy('left', v);
      svgEl('line', { x1: m.l, x2: m.l + pw, y1: y, y2: y, class: 'grid' }, axes);
      svgText(axes, m.l - 6, y + 4, fmtTick(v), { 'text-anchor': 'end' });
    }
    if (hasRight) {
      for (const v of scales.right.ticks) {
        svgText(axes, m.l + pw + 6, sy('right', v) + 4, fmtTick(v), { 'text-anchor': 'start' });
      }
    }
    svgEl('line', { x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph }, axes);
    svgEl('line', { x1: m.l, x2: m.l, y1: m.t, y2: m.t + ph }, axes);
    if (hasRight) svgEl('line', { x1: m.l + pw, x2: m.l + pw, y1: m.t, y2: m.t + ph }, axes);
    for (const v of spec.x.ticks) {
      const x = sx(v);
      svgEl('line', { x1: x, x2: x, y1: m.t + ph, y2: m.t + ph + 4 }, axes);
      svgText(axes, x, m.t + ph + 16, (spec.x.fmt || fmtTick)(v), { 'text-anchor': 'middle' });
    }
    svgText(axes, m.l + pw / 2, height - 6, spec.x.label, { 'text-anchor': 'middle', class: 'axis-title' });
    svgText(axes, 4, 14, spec.left.label, { 'text-anchor': 'start', class: 'axis-title' });
    if (hasRight) svgText(axes, width - 4, 14, spec.right.label, { 'text-anchor': 'end', class: 'axis-title' });

    // Reference lines: floors and limits, each with its label.
    for (const h of spec.hlines || []) {
      const y = sy(h.axis, h.y);
      svgEl('line', { x1: m.l, x2: m.l + pw, y1: y, y2: y, stroke: '#333', 'stroke-dasharray': '2 4', class: 'ref' }, svg);
      svgText(svg, m.l + 4, y - 4, h.label, { class: 'ref-label' });
    }
    for (const v of spec.vlines || []) {
      if (v.x < spec.x.min || v.x > spec.x.max) continue;
      const x = sx(v.x);
      svgEl('line', { x1: x, x2: x, y1: m.t, y2: m.t + ph, stroke: '#333', 'stroke-dasharray': '2 4', class: 'ref' }, svg);
      const right = x > m.l + pw * 0.7;
      svgText(svg, right ? x - 4 : x + 4, m.t + 12, v.label, { class: 'ref-label', 'text-anchor': right ? 'end' : 'start' });
    }

    let drawn = 0;
    const labels = [];
    for (const s of spec.series) {
      const g = svgEl('g', { class: 'series', 'data-series': s.id }, svg);
      let run = [];
      const runs = [];
      let lastPt = null;
      for (const p of s.points) {
        if (p[1] === null || p[1] === undefined || !isFinite(p[1])) {
          if (run.length) runs.push(run);
          run = [];
          continue;
        }
        const xy = [sx(p[0]), sy(s.axis, p[1])];
        run.push(xy);
        lastPt = xy;
      }
      if (run.length) runs.push(run);
      for (const r of runs) {
        if (r.length > 1) {
          svgEl('polyline', {
            points: r.map((q) => q[0].toFixed(1) + ',' + q[1].toFixed(1)).join(' '),
            fill: 'none', stroke: s.color, 'stroke-width': 2, 'stroke-dasharray': s.dash || 'none',
          }, g);
        }
        for (const q of r) {
          marker(g, s.shape, q[0], q[1], { fill: s.color, 'data-series': s.id });
          drawn++;
        }
      }
      g.setAttribute('data-points', String(runs.reduce((n, r) => n + r.length, 0)));
      if (lastPt) labels.push({ x: lastPt[0], y: lastPt[1], name: s.name });
    }
    // Each line says what it is at its last point; labels are nudged apart vertically.
    labels.sort((a, b) => a.y - b.y);
    let prevY = -Infinity;
    for (const l of labels) {
      const y = Math.max(l.y - 6, prevY + 14);
      prevY = y;
      const nearRight = l.x > m.l + pw * 0.6;
      svgText(svg, nearRight ? l.x - 6 : l.x + 6, y, l.name, {
        'text-anchor': nearRight ? 'end' : 'start', class: 'line-label',
        stroke: '#fff', 'stroke-width': 3, 'paint-order': 'stroke',
      });
    }
    if (!drawn) {
      svgText(svg, m.l + pw / 2, m.t + ph / 2, spec.empty || 'no data yet', { 'text-anchor': 'middle', class: 'empty' });
    }
    container.setAttribute('data-points', String(drawn));
  }

  // === sections ===

  function setFigure(id, value, text) {
    const dd = document.getElementById(id);
    dd.setAttribute('data-value', value === null || value === undefined ? '' : String(value));
    dd.textContent = text;
  }

  function renderNow(s) {
    const n = s.now;
    setFigure('now-decode', n.in_flight_decode, fmt(n.in_flight_decode));
    setFigure('now-prefill', n.in_flight_prefill, fmt(n.in_flight_prefill));
    setFigure('now-tps', n.output_tokens_per_second, fmt(n.output_tokens_per_second));
    setFigure('now-tps-gpu', n.output_tokens_per_second_per_gpu, fmt(n.output_tokens_per_second_per_gpu));
    document.getElementById('now-gpus').textContent = `tok/s (${fmt(n.gpus)} GPU${n.gpus === 1 ? '' : 's'})`;
    setFigure('now-ttft-p50', n.ttft_p50_seconds, fmtMs(n.ttft_p50_seconds));
    setFigure('now-ttft-p99', n.ttft_p99_seconds, fmtMs(n.ttft_p99_seconds));
    setFigure('now-rtps-p50', n.request_tokens_per_second_p50, fmt(n.request_tokens_per_second_p50));
    document.getElementById('now-note').textContent =
      `TTFT and per-request speed: the ${fmt(n.ttft_requests)} requests recorded in the last ` +
      `${fmt(n.window.seconds)} s (since ${clock(n.window.from_unix_ms)}), read from histogram buckets ` +
      'as PromQL histogram_quantile does. Aggregate: tokenmeter_output_tokens_per_second (its --rate-window).';
    renderSplit(n);
  }

  // Where TTFT went, for the requests whose engine stated it (absent when none did).
  function renderSplit(n) {
    const p = document.getElementById('now-split');
    const parts = n.ttft_parts || [];
    p.hidden = parts.length === 0;
    p.textContent = parts.length === 0 ? '' :
      `Where TTFT went, as the engine states it (${fmt(n.ttft_split_requests)} of ${fmt(n.ttft_requests)} requests): ` +
      parts.map((x) => `${x.part.replace('_', ' ')} ${fmtMs(x.mean_seconds)} ms`).join(' + ') + ' (mean per request).';
    p.setAttribute('data-parts', JSON.stringify(parts.map((x) => [x.part, x.mean_seconds])));
  }

  function fillTable(id, rows) {
    const body = document.querySelector(`#${id} tbody`);
    while (body.firstChild) body.removeChild(body.firstChild);
    const total = rows.reduce((n, r) => n + r.requests, 0);
    if (!rows.length) {
      const tr = body.insertRow();
      const td = tr.insertCell();
      td.colSpan = 3;
      td.textContent = 'none yet';
      return;
    }
    for (const r of rows) {
      const tr = body.insertRow();
      tr.insertCell().textContent = r.name;
      const n = tr.insertCell();
      n.className = 'num';
      n.textContent = fmt(r.requests);
      const share = tr.insertCell();
      const pct = total > 0 ? (100 * r.requests) / total : 0;
      share.textContent = `${pct.toFixed(1)}%`;
      const meter = document.createElement('meter');
      meter.min = 0;
      meter.max = 100;
      meter.value = pct;
      meter.setAttribute('aria-hidden', 'true');
      share.appendChild(meter);
    }
  }

  function pct(v) {
    return v === null || v === undefined ? '–' : `${(100 * v).toFixed(1)}%`;
  }

  function renderSlo(s) {
    const section = document.getElementById('slo');
    if (!s.slo) {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    const body = document.querySelector('#slo-table tbody');
    while (body.firstChild) body.removeChild(body.firstChild);
    for (const c of s.slo) {
      const tr = body.insertRow();
      tr.setAttribute('data-class', c.class);
      const th = document.createElement('th');
      th.scope = 'row';
      th.textContent = c.class;
      tr.appendChild(th);
      const att = tr.insertCell();
      att.className = 'attainment';
      att.setAttribute('data-value', c.window.attainment === null ? '' : String(c.window.attainment));
      att.textContent = pct(c.window.attainment);
      const judged = c.window.requests - (c.window.results.client_disconnect || 0);
      tr.insertCell().textContent = `${fmt(c.window.met)} / ${fmt(judged)}`;
      tr.insertCell().textContent = pct(c.objective);
      tr.insertCell().textContent = pct(c.since_start.attainment);
      const missed = Object.keys(c.window.results)
        .filter((k) => k !== 'met' && c.window.results[k] > 0)
        .map((k) => `${k} ${fmt(c.window.results[k])}`);
      tr.insertCell().textContent = missed.length ? missed.join(', ') : 'none';
    }
  }

  function pow2Ticks(max) {
    const out = [];
    for (let v = 1; v <= max; v *= 2) out.push(v);
    return out;
  }

  function renderTradeoff(s) {
    const t = s.tradeoff;
    const bands = t.bands;
    let top = 8;
    for (const b of bands) top = Math.max(top, b.concurrency, b.aggregate_mean_in_flight || 0);
    for (const kind of Object.keys(t.capacity_curve)) for (const p of t.capacity_curve[kind]) top = Math.max(top, p.concurrency);
    for (const c of Object.keys(t.max_concurrency)) top = Math.max(top, t.max_concurrency[c]);
    top = Math.pow(2, Math.ceil(Math.log2(top)));
    const series = [
      {
        id: 'per_request', name: 'per request, median (left)', axis: 'left', shape: 'circle', color: '#1f5fa8', dash: '',
        points: bands.filter((b) => b.per_request_p50 !== null).map((b) => [b.concurrency, b.per_request_p50]),
      },
      {
        id: 'aggregate', name: 'aggregate (right)', axis: 'right', shape: 'square', color: '#b34700', dash: '6 3',
        points: bands.filter((b) => b.aggregate_tokens_per_second !== null).map((b) => [b.aggregate_mean_in_flight, b.aggregate_tokens_per_second]),
      },
    ];
    const curve = t.capacity_curve;
    if (curve.per_request && curve.per_request.length) {
      series.push({
        id: 'model_per_request', name: 'model: per request (left)', axis: 'left', shape: 'triangle', color: '#1f5fa8', dash: '1 3',
        points: curve.per_request.map((p) => [p.concurrency, p.tokens_per_second]),
      });
    }
    if (curve.aggregate && curve.aggregate.length) {
      series.push({
        id: 'model_aggregate', name: 'model: aggregate (right)', axis: 'right', shape: 'diamond', color: '#b34700', dash: '1 3',
        points: curve.aggregate.map((p) => [p.concurrency, p.tokens_per_second]),
      });
    }
    const hlines = (t.floors || []).map((f) => ({ axis: 'left', y: f.tokens_per_second, label: `${f.class} floor ${fmt(f.tokens_per_second)} tok/s` }));
    // The bound that binds: the smallest, on a tie the first of BOUNDS (the model's order).
    const binds = (c) => {
      const l = (t.limits || {})[c] || {};
      let best = null;
      BOUNDS.forEach(([b, name]) => { if (l[b] !== undefined && (best === null || l[b] < l[best[0]])) best = [b, name]; });
      return best && best[0] !== 'tokens_per_second' ? ` (${best[1]} binds)` : '';
    };
    const vlines = Object.keys(t.max_concurrency).map((c) => ({ x: t.max_concurrency[c], label: `${c}: max ${fmt(t.max_concurrency[c])}${binds(c)}` }));
    renderLimits(t);
    drawChart(document.getElementById('chart-tradeoff'), {
      height: 300,
      x: { min: 1, max: top, log2: true, ticks: pow2Ticks(top), label: 'concurrency (mean requests in flight, log scale)' },
      left: { label: 'per-request tok/s' },
      right: { label: 'aggregate tok/s' },
      series: series, hlines: hlines, vlines: vlines,
      empty: 'no request measured yet',
    });
  }

  // Each class's limits and the mix the predictions assume, beside the chart.
  function renderLimits(t) {
    const el = document.getElementById('tradeoff-limits');
    if (!el) return;
    const classes = Object.keys(t.limits || {});
    const w = t.workload || {};
    if (!classes.length && w.requests === undefined && !Object.keys(t.check || {}).length) { el.textContent = ''; return; }
    const parts = classes.map((c) => {
      const l = t.limits[c];
      const one = ([b, name]) => (l[b] === undefined ? '' : `${name} limit ${fmt(l[b])}`);
      return `${c}: ` + BOUNDS.map(one).filter((x) => x).join(', ');
    });
    if (w.requests !== undefined) {
      parts.push(`assuming the last ${fmt(w.requests)} requests: prompt ${fmt(w.prompt || 0)} tokens (${fmt(w.cached || 0)} cached), output ${fmt(w.output || 0)}`);
    }
    const k = t.check || {};
    if (k.concurrency !== undefined && k.ttft_predicted !== undefined && k.ttft_observed !== undefined) {
      parts.push(`self-check at ${fmt(k.concurrency)} in flight: TTFT p90 predicted ${fmt(k.ttft_predicted)} s, observed ${fmt(k.ttft_observed)} s` +
        (k.tps_predicted !== undefined && k.tps_observed !== undefined ? `, tok/s predicted ${fmt(k.tps_predicted)}, observed ${fmt(k.tps_observed)}` : '') +
        (k.trusted === 0 ? ' (NOT TO BE TRUSTED: the model is more than 50% off what the engine does now)' : ''));
    }
    el.textContent = 'Capacity per engine, requests in flight. ' + parts.join('; ') + '.';
  }

  function renderHistory(s) {
    const pts = s.history;
    const now = s.generated_unix_ms;
    const ago = (p) => (p.unix_ms - now) / 60000;
    const span = s.history_span_seconds / 60;
    const first = pts.length ? ago(pts[0]) : -1;
    const min = Math.max(-span, Math.min(-1, Math.floor(first)));
    const step = niceStep(-min / 5);
    const xt = [];
    for (let v = 0; v >= min - 1e-9; v -= step) xt.unshift(Number(v.toPrecision(12)));
    const x = { min: min, max: 0, ticks: xt, label: 'minutes before now', fmt: (v) => (v === 0 ? 'now' : fmtTick(v)) };
    drawChart(document.getElementById('chart-tps'), {
      height: 190, x: x, left: { label: 'tok/s' },
      series: [{ id: 'tps', name: 'aggregate', axis: 'left', shape: 'circle', color: '#b34700', points: pts.map((p) => [ago(p), p.output_tokens_per_second]) }],
    });
    drawChart(document.getElementById('chart-ttft'), {
      height: 190, x: x, left: { label: 'TTFT (s)' },
      series: [
        { id: 'ttft_p50', name: 'p50', axis: 'left', shape: 'circle', color: '#1f5fa8', points: pts.map((p) => [ago(p), p.ttft_p50_seconds]) },
        { id: 'ttft_p99', name: 'p99', axis: 'left', shape: 'triangle', color: '#6a1b9a', dash: '6 3', points: pts.map((p) => [ago(p), p.ttft_p99_seconds]) },
      ],
    });
    drawChart(document.getElementById('chart-inflight'), {
      height: 190, x: x, left: { label: 'requests' },
      series: [
        { id: 'decode', name: 'decoding', axis: 'left', shape: 'circle', color: '#2e7d32', points: pts.map((p) => [ago(p), p.in_flight_decode]) },
        { id: 'prefill', name: 'prefill', axis: 'left', shape: 'square', color: '#555', dash: '6 3', points: pts.map((p) => [ago(p), p.in_flight_prefill]) },
      ],
    });
    document.getElementById('history-note').textContent =
      `A reading every ${fmt(s.sample_period_seconds)} s, the last ${fmt(span)} minutes kept. ` +
      'TTFT points are the percentiles of the requests recorded between two readings (none: a gap).';
  }

  function render(s) {
    last = s;
    renderNow(s);
    renderSlo(s);
    renderTradeoff(s);
    renderHistory(s);
    fillTable('outcomes-table', s.outcomes);
    fillTable('codes-table', s.codes);
    fillTable('sources-table', s.token_sources);
    // Who used the GPUs (docs/cost.md): each tenant's charged GPU-seconds and idle, as shares
    // of all of it.
    const gpu = s.gpu_time || { by_tenant: [], idle_seconds: 0 };
    const gpuRows = gpu.by_tenant.map((r) => ({ name: r.name || 'all traffic', requests: r.gpu_seconds }));
    if (gpu.idle_seconds > 0) gpuRows.push({ name: 'idle', requests: gpu.idle_seconds });
    fillTable('gpu-table', gpuRows);
    refreshes++;
    document.body.setAttribute('data-generated', String(s.generated_unix_ms));
    document.body.setAttribute('data-refreshes', String(refreshes));
    const status = document.getElementById('status');
    status.className = '';
    status.textContent = `tokenmeter ${s.version || ''} · updated ${clock(s.generated_unix_ms)} · refreshes every ${REFRESH_MS / 1000} s`;
  }

  async function refresh() {
    try {
      const r = await fetch('api/summary', { cache: 'no-store' });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      render(await r.json());
    } catch (e) {
      const status = document.getElementById('status');
      status.className = 'error';
      status.textContent = `cannot read api/summary (${e.message}); showing the last data, retrying`;
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (last) {
        renderTradeoff(last);
        renderHistory(last);
      }
    }, 150);
  });

  refresh();
})();
