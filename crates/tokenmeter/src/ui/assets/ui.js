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

  // === where text goes ===
  //
  // Every text of a chart is placed against the boxes of the texts already drawn, so none is
  // drawn over another (a limit's label over a series name read "interactivemodel: aggregate").
  // Widths are measured once the text is in the page; the estimate is for a chart not laid out.
  const CHAR_PX = 7; // sans-serif at 12 px averages about 6.5 px a character
  const ROW_PX = 16; // one line of 12 px text (ascent and descent) and the space between two
  const TITLE_Y = 14; // the axis titles' baseline, the chart's first row

  function textWidth(t) {
    let w = 0;
    try {
      w = t.getComputedTextLength();
    } catch (e) {
      w = 0;
    }
    return w > 0 ? w : CHAR_PX * t.textContent.length;
  }

  // The box a line of text takes around its baseline, a pixel either side.
  function textBox(x, y, w, anchor) {
    const x0 = anchor === 'end' ? x - w : anchor === 'middle' ? x - w / 2 : x;
    return { x0: x0 - 1, x1: x0 + w + 1, y0: y - 12, y1: y + 4 };
  }

  function intersects(a, b) {
    return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
  }

  // === the one chart function ===
  //
  // spec: { height, x: { min, max, log2, label, ticks, fmt }, left: { label }, right: { label },
  //         series: [{ id, name, axis, points: [[x, y|null]], dash, shape, color }],
  //         hlines: [{ axis, y, label }], vlines: [{ x, label }], empty }
  //
  // From the top: the axis titles; the vertical lines' labels, in as many rows as they need;
  // the plot (spec.height less the margins, whatever the rows above and below); the x axis; the
  // legend, wrapped into rows. Only the horizontal lines' labels are inside the plot.
  function drawChart(container, spec) {
    while (container.firstChild) container.removeChild(container.firstChild);
    const width = Math.max(280, container.clientWidth || 600);
    const hasRight = spec.series.some((s) => s.axis === 'right');
    const m = { l: 58, r: hasRight ? 62 : 18, t: 30, b: 46 };
    const ph = Math.max(60, (spec.height || 220) - 72);
    const pw = width - m.l - m.r;
    // In the page from the start, so that each text can be measured as it is made.
    const svg = svgEl('svg', { width: width, height: spec.height || 220 }, container);
    const placed = [];
    // A text whose place is known: drawn and its box kept.
    const put = (parent, x, y, s, attrs) => {
      const t = svgText(parent, x, y, s, attrs);
      placed.push(textBox(x, y, textWidth(t), (attrs || {})['text-anchor'] || 'start'));
      return t;
    };
    // A text placed at the first of `spots` ([x, y, anchor]) where it meets no other, or, if
    // every spot is taken, at the first.
    const putFree = (parent, spots, s, attrs) => {
      const t = svgText(parent, 0, 0, s, attrs);
      const w = textWidth(t);
      const boxes = spots.map(([x, y, a]) => textBox(x, y, w, a));
      let i = boxes.findIndex((b) => !placed.some((p) => intersects(p, b)));
      if (i < 0) i = 0;
      const [x, y, a] = spots[i];
      t.setAttribute('x', String(x));
      t.setAttribute('y', String(y));
      t.setAttribute('text-anchor', a);
      placed.push(boxes[i]);
      return t;
    };
    const tx = (v) => (spec.x.log2 ? Math.log2(v) : v);
    const x0 = tx(spec.x.min);
    const x1 = tx(spec.x.max);
    const sx = (v) => m.l + ((tx(v) - x0) / (x1 - x0 || 1)) * pw;

    // The axis titles (units in every one) share the first row.
    const axes = svgEl('g', { class: 'axis' }, svg);
    put(axes, 4, TITLE_Y, spec.left.label, { 'text-anchor': 'start', class: 'axis-title' });
    if (hasRight) put(axes, width - 4, TITLE_Y, spec.right.label, { 'text-anchor': 'end', class: 'axis-title' });

    // The vertical lines' labels, above the plot: each beside its line's x (after it, or
    // before it near the right edge), in the first row where it meets no other label. Lines
    // a few pixels apart (30 and 32 on a log scale) take a row each.
    const vlines = (spec.vlines || []).filter((v) => v.x >= spec.x.min && v.x <= spec.x.max).sort((a, b) => a.x - b.x);
    const rows = [];
    for (const v of vlines) {
      const x = sx(v.x);
      const t = svgText(svg, 0, 0, v.label, { class: 'ref-label' });
      const w = textWidth(t);
      const after = x + 4 + w <= width - 2 || x - 4 - w < 2;
      const lx = after ? x + 4 : x - 4;
      const span = after ? [lx - 6, lx + w + 6] : [lx - w - 6, lx + 6];
      let r = rows.findIndex((row) => row.every((o) => span[1] <= o[0] || o[1] <= span[0]));
      if (r < 0) {
        rows.push([]);
        r = rows.length - 1;
      }
      rows[r].push(span);
      const y = TITLE_Y + ROW_PX * (r + 1);
      t.setAttribute('x', String(lx));
      t.setAttribute('y', String(y));
      t.setAttribute('text-anchor', after ? 'start' : 'end');
      placed.push(textBox(lx, y, w, after ? 'start' : 'end'));
      v.px = x;
    }
    // The plot starts below the last row, far enough that the top tick labels clear it.
    if (rows.length) m.t = TITLE_Y + ROW_PX * rows.length + 14;

    const axisMax = (axis) => {
      let mx = 0;
      for (const s of spec.series) if (s.axis === axis) for (const p of s.points) if (p[1] !== null && p[1] > mx) mx = p[1];
      for (const h of spec.hlines || []) if (h.axis === axis && h.y > mx) mx = h.y;
      return linearTicks(mx);
    };
    const scales = { left: axisMax('left') };
    if (hasRight) scales.right = axisMax('right');
    const sy = (axis, v) => m.t + ph - (v / scales[axis].max) * ph;

    // Axes, grid and their tick labels; an x label that would run into another text (the one
    // before it, the right axis' 0) is left out, its tick kept.
    for (const v of scales.left.ticks) {
      const y = sy('left', v);
      svgEl('line', { x1: m.l, x2: m.l + pw, y1: y, y2: y, class: 'grid' }, axes);
      put(axes, m.l - 6, y + 4, fmtTick(v), { 'text-anchor': 'end' });
    }
    if (hasRight) {
      for (const v of scales.right.ticks) {
        put(axes, m.l + pw + 6, sy('right', v) + 4, fmtTick(v), { 'text-anchor': 'start' });
      }
    }
    svgEl('line', { x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph }, axes);
    svgEl('line', { x1: m.l, x2: m.l, y1: m.t, y2: m.t + ph }, axes);
    if (hasRight) svgEl('line', { x1: m.l + pw, x2: m.l + pw, y1: m.t, y2: m.t + ph }, axes);
    let labelledTo = -Infinity;
    for (const v of spec.x.ticks) {
      const x = sx(v);
      svgEl('line', { x1: x, x2: x, y1: m.t + ph, y2: m.t + ph + 4 }, axes);
      const t = svgText(axes, x, m.t + ph + 20, (spec.x.fmt || fmtTick)(v), { 'text-anchor': 'middle' });
      const b = textBox(x, m.t + ph + 20, textWidth(t), 'middle');
      if (b.x0 < labelledTo + 2 || placed.some((p) => intersects(p, b))) {
        axes.removeChild(t);
        continue;
      }
      labelledTo = b.x1;
      placed.push(b);
    }
    put(axes, m.l + pw / 2, m.t + ph + 38, spec.x.label, { 'text-anchor': 'middle', class: 'axis-title' });

    // Reference lines: floors and limits (their labels come after the series, on top).
    for (const h of spec.hlines || []) {
      const y = sy(h.axis, h.y);
      svgEl('line', { x1: m.l, x2: m.l + pw, y1: y, y2: y, stroke: '#333', 'stroke-dasharray': '2 4', class: 'ref' }, svg);
    }
    for (const v of vlines) {
      svgEl('line', { x1: v.px, x2: v.px, y1: m.t, y2: m.t + ph, stroke: '#333', 'stroke-dasharray': '2 4', class: 'ref' }, svg);
    }

    let drawn = 0;
    const legend = [];
    for (const s of spec.series) {
      const g = svgEl('g', { class: 'series', 'data-series': s.id }, svg);
      let run = [];
      const runs = [];
      for (const p of s.points) {
        if (p[1] === null || p[1] === undefined || !isFinite(p[1])) {
          if (run.length) runs.push(run);
          run = [];
          continue;
        }
        run.push([sx(p[0]), sy(s.axis, p[1])]);
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
      if (runs.length) legend.push(s);
    }
    if (!drawn) {
      put(svg, m.l + pw / 2, m.t + ph / 2, spec.empty || 'no data yet', { 'text-anchor': 'middle', class: 'empty' });
    }

    // A floor's label sits on its line at the left, else under it, else at the right, else a
    // row further away: never on another label, and inside the plot.
    const halo = { stroke: '#fff', 'stroke-width': 3, 'paint-order': 'stroke' };
    const hlines = (spec.hlines || []).map((h) => ({ h: h, y: sy(h.axis, h.y) })).sort((a, b) => a.y - b.y);
    for (const { h, y } of hlines) {
      const spots = [];
      for (let k = 0; k < 8; k++) {
        for (const dy of k === 0 ? [-4, 14] : [-4 - ROW_PX * k, 14 + ROW_PX * k]) {
          spots.push([m.l + 4, y + dy, 'start'], [m.l + pw - 4, y + dy, 'end']);
        }
      }
      const inside = spots.filter((p) => p[1] - 12 >= m.t && p[1] + 4 <= m.t + ph);
      putFree(svg, inside.length ? inside : spots, h.label, Object.assign({ class: 'ref-label' }, halo));
    }

    // The legend, under the x axis: each series' swatch (its line, dash and marker) and name,
    // left to right, wrapping before the right edge. The svg grows by its rows; the plot keeps
    // its size.
    const lg = svgEl('g', { class: 'legend' }, svg);
    let lx = m.l;
    let row = 0;
    for (const s of legend) {
      const t = svgText(lg, 0, 0, s.name, { class: 'line-label', 'text-anchor': 'start' });
      const w = 26 + textWidth(t);
      if (lx > m.l && lx + w > width - 4) {
        lx = m.l;
        row++;
      }
      const y = m.t + ph + 38 + 18 * (row + 1);
      svgEl('line', { x1: lx, x2: lx + 22, y1: y - 4, y2: y - 4, stroke: s.color, 'stroke-width': 2, 'stroke-dasharray': s.dash || 'none' }, lg);
      marker(lg, s.shape, lx + 11, y - 4, { fill: s.color, class: 'swatch' });
      t.setAttribute('x', String(lx + 26));
      t.setAttribute('y', String(y));
      placed.push(textBox(lx + 26, y, w - 26, 'start'));
      lx += w + 16;
    }
    const height = m.t + ph + m.b + (legend.length ? 18 * (row + 1) : 0);
    svg.setAttribute('height', String(height));
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
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

  // Why the self-check failed, from which figure is off and which way: what an operator can
  // act on, not only that the model is more than 50% off.
  function checkFailure(k) {
    const why = [];
    const ratio = (p, o) => (p > 0 && o > 0 ? o / p : null);
    const ttft = ratio(k.ttft_predicted, k.ttft_observed);
    const tps = ratio(k.tps_predicted, k.tps_observed);
    if (ttft !== null && ttft > 1.5) why.push(`first tokens take ${fmt(ttft)}x what the fitted costs say: more prefill or queueing than the window's mix shows (a mix that changed within the window), or an engine slowed by other work on its machine`);
    if (ttft !== null && ttft < 1 / 1.5) why.push(`first tokens come ${fmt(1 / ttft)}x sooner than the model says: a prefix cache that serves prompts without saying so, or a prefill cost read at a busier time`);
    if (tps !== null && tps < 1 / 1.5) why.push(`decoding is ${fmt(1 / tps)}x slower than the fitted line: the engine's steps stretched (a machine shared with other work, or throttled), or longer contexts than the window held`);
    if (tps !== null && tps > 1.5) why.push(`decoding is ${fmt(tps)}x faster than the fitted line: several tokens a step (speculative decoding), or a lighter load than the window's`);
    return why.length ? why.join('; ') : 'the model is more than 50% off what the engine does now';
  }

  // Each class's limits and the mix the predictions assume, beside the chart.
  function renderLimits(t) {
    const el = document.getElementById('tradeoff-limits');
    if (!el) return;
    const classes = Object.keys(t.limits || {});
    const w = t.workload || {};
    if (!classes.length && w.requests === undefined && !Object.keys(t.check || {}).length && !t.unsupported) { el.textContent = ''; return; }
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
        (k.trusted === 0 ? ` (NOT TO BE TRUSTED: ${checkFailure(k)})` : ''));
    }
    const head = t.unsupported ? `Capacity: cannot answer yet: ${t.unsupported}. ` : 'Capacity per engine, requests in flight. ';
    el.textContent = head + parts.join('; ') + (parts.length ? '.' : '');
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
    // The workload trace's file (docs/replay.md): lines written, lost
    // to a full queue or disk, and requests it leaves out; shown only with --workload-log.
    const wl = s.workload_log;
    const wlTable = document.getElementById('workload-table');
    wlTable.hidden = !wl;
    if (wl) {
      fillTable('workload-table', [
        { name: 'written', requests: wl.written },
        { name: 'dropped', requests: wl.dropped },
        { name: 'skipped (never sent upstream)', requests: wl.skipped },
      ]);
    }
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
