// Plimsoll's charts: a stacked memory timeline and simple line charts, drawn on <canvas> with no
// library and no network. Used by memory_timeline.html and report.html (both self-contained).
"use strict";

const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

function formatBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = b, u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  return (u === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[u];
}

// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
function niceStep(raw) {
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
}

function niceTicks(max, count) {
  if (!(max > 0)) return [0];
  const step = niceStep(max / count);
  const ticks = [];
  for (let v = 0; v <= max * 1.0001; v += step) ticks.push(v);
  return ticks;
}

function byteTicks(max, count) {
  if (!(max > 0)) return [0];
  const unit = Math.pow(1024, Math.max(0, Math.floor(Math.log(max) / Math.log(1024))));
  return niceTicks(max / unit, count).map(t => t * unit);
}

function setupCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// Replays the timeline's events: bytes live per band (category or label) after each event,
// reserved bytes, step and phase boundaries, out-of-memory events and notes.
function replayTimeline(data, byLabel, topLabels) {
  const events = data.events;
  const n = events.length;
  const labelBand = new Map();
  let bandNames;
  if (byLabel) {
    const peak = new Map(), live = new Map();
    for (const [label, , size] of data.initial.live) live.set(label, (live.get(label) || 0) + size);
    for (const [l, v] of live) peak.set(l, v);
    for (const e of events) {
      const [, kind, size, , label] = e;
      if (kind !== 0 && kind !== 1) continue;
      const v = (live.get(label) || 0) + (kind === 0 ? size : -size);
      live.set(label, v);
      peak.set(label, Math.max(peak.get(label) || 0, v));
    }
    const order = [...peak.entries()].sort((a, b) => b[1] - a[1]).slice(0, topLabels);
    order.forEach(([label], i) => labelBand.set(label, i));
    bandNames = order.map(([label]) => data.labels[label]);
    bandNames.push("other labels");
  } else {
    bandNames = data.categories.slice();
  }
  const bands = bandNames.length;
  const bandOf = (label, category) => byLabel
    ? (labelBand.has(label) ? labelBand.get(label) : bands - 1) : category;
  const current = new Float64Array(bands);
  for (const [label, category, size] of data.initial.live) current[bandOf(label, category)] += size;
  const stack = new Float64Array((n + 1) * bands);
  stack.set(current, 0);
  const reserved = new Float64Array(n + 1);
  reserved[0] = data.initial.reserved;
  let r = data.initial.reserved;
  const boundaries = [], marks = [];
  let lastStep = null;
  for (let i = 0; i < n; i++) {
    const [, kind, size, category, label, step, phase] = events[i];
    if (kind === 0) current[bandOf(label, category)] += size;
    else if (kind === 1) current[bandOf(label, category)] -= size;
    else if (kind === 2) r += size;
    else if (kind === 3) r -= size;
    else if (kind === 4) marks.push({ i, oom: true, size, category, label });
    else if (kind === 5) {
      boundaries.push({ i, step, phase, newStep: step !== lastStep });
      lastStep = step;
    } else if (kind === 6) marks.push({ i, oom: false, label });
    stack.set(current, (i + 1) * bands);
    reserved[i + 1] = r;
  }
  return { bandNames, bands, stack, reserved, boundaries, marks, n };
}

// The memory timeline in `root`: controls, a canvas, a legend and a tooltip.
function drawTimeline(root, data) {
  root.innerHTML = "";
  const controls = document.createElement("div");
  controls.className = "controls";
  controls.innerHTML =
    '<label>x axis <select class="xaxis"><option value="events">allocation events</option>' +
    '<option value="time">time</option></select></label> ' +
    '<label>stack by <select class="stackby"><option value="category">category</option>' +
    '<option value="label">label (top 20)</option></select></label> ' +
    '<label><input type="checkbox" class="showreserved" checked> reserved</label> ' +
    '<label><input type="checkbox" class="showbudget" checked> budget</label>';
  root.appendChild(controls);
  const canvas = document.createElement("canvas");
  root.appendChild(canvas);
  const legend = document.createElement("div");
  legend.className = "legend";
  root.appendChild(legend);
  const tip = document.createElement("div");
  tip.className = "tip";
  tip.style.display = "none";
  root.appendChild(tip);
  const width = Math.max(600, Math.min(1400, (root.clientWidth || 1100) - 10)), height = 420;
  const pad = { l: 80, r: 20, t: 24, b: 36 };
  let state = null;

  function render() {
    const byLabel = controls.querySelector(".stackby").value === "label";
    const byTime = controls.querySelector(".xaxis").value === "time";
    const showReserved = controls.querySelector(".showreserved").checked;
    const showBudget = controls.querySelector(".showbudget").checked;
    const rp = replayTimeline(data, byLabel, 20);
    const { bands, stack, reserved, n } = rp;
    const times = new Float64Array(n + 1);
    for (let i = 0; i < n; i++) times[i + 1] = data.events[i][0];
    times[0] = n > 0 ? times[1] : 0;
    let ymax = 0;
    for (let i = 0; i <= n; i++) {
      let s = 0;
      for (let b = 0; b < bands; b++) s += stack[i * bands + b];
      ymax = Math.max(ymax, s, showReserved ? reserved[i] : 0);
    }
    if (showBudget && data.budget && data.budget < ymax * 4) ymax = Math.max(ymax, data.budget);
    ymax = ymax * 1.05 || 1;
    const t0 = times[0], t1 = Math.max(times[n], t0 + 1);
    const X = i => pad.l + (width - pad.l - pad.r) *
      (byTime ? (times[i] - t0) / (t1 - t0) : (n === 0 ? 0 : i / n));
    const Y = v => height - pad.b - (height - pad.t - pad.b) * v / ymax;
    const ctx = setupCanvas(canvas, width, height);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px sans-serif";
    // Stacked bands: each band is the area between the running sums below and including it.
    const base = new Float64Array(n + 1);
    for (let b = 0; b < bands; b++) {
      ctx.beginPath();
      for (let i = 0; i <= n; i++) {
        const top = base[i] + stack[i * bands + b];
        if (i === 0) ctx.moveTo(X(i), Y(top)); else { ctx.lineTo(X(i), Y(base[i - 1] + stack[(i - 1) * bands + b])); ctx.lineTo(X(i), Y(top)); }
      }
      for (let i = n; i >= 0; i--) {
        ctx.lineTo(X(i), Y(base[i]));
        if (i > 0) ctx.lineTo(X(i), Y(base[i - 1]));
      }
      ctx.closePath();
      ctx.fillStyle = PALETTE[b % PALETTE.length];
      ctx.fill();
      for (let i = 0; i <= n; i++) base[i] += stack[i * bands + b];
    }
    if (showReserved) {
      ctx.beginPath();
      for (let i = 0; i <= n; i++) {
        if (i === 0) ctx.moveTo(X(i), Y(reserved[i])); else { ctx.lineTo(X(i), Y(reserved[i - 1])); ctx.lineTo(X(i), Y(reserved[i])); }
      }
      ctx.strokeStyle = "#222"; ctx.lineWidth = 1.5; ctx.stroke();
    }
    if (showBudget && data.budget && data.budget <= ymax) {
      ctx.setLineDash([6, 4]); ctx.strokeStyle = "#c00"; ctx.beginPath();
      ctx.moveTo(pad.l, Y(data.budget)); ctx.lineTo(width - pad.r, Y(data.budget)); ctx.stroke();
      ctx.setLineDash([]); ctx.fillStyle = "#c00";
      ctx.fillText("budget " + formatBytes(data.budget), width - pad.r - 120, Y(data.budget) - 4);
    }
    // Step and phase boundaries.
    for (const bd of rp.boundaries) {
      const x = X(bd.i + 1);
      ctx.strokeStyle = bd.newStep ? "#555" : "#aaa";
      ctx.setLineDash(bd.newStep ? [] : [2, 3]);
      ctx.beginPath(); ctx.moveTo(x, pad.t); ctx.lineTo(x, height - pad.b); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = "#333";
      const name = data.phases[bd.phase];
      if (name !== "other") ctx.fillText((bd.newStep ? "step " + bd.step + " " : "") + name[0], x + 2, pad.t - 6 + (bd.newStep ? 0 : 10));
    }
    // Out-of-memory events (red) and notes such as recoveries (orange).
    for (const m of rp.marks) {
      const x = X(m.i + 1);
      ctx.fillStyle = m.oom ? "#d00" : "#e80";
      ctx.beginPath(); ctx.moveTo(x, pad.t + 10); ctx.lineTo(x - 5, pad.t); ctx.lineTo(x + 5, pad.t); ctx.closePath(); ctx.fill();
    }
    // Axes.
    ctx.strokeStyle = "#000"; ctx.fillStyle = "#000"; ctx.beginPath();
    ctx.moveTo(pad.l, pad.t); ctx.lineTo(pad.l, height - pad.b); ctx.lineTo(width - pad.r, height - pad.b); ctx.stroke();
    for (const t of byteTicks(ymax, 6)) {
      if (t > ymax) continue;
      ctx.fillText(formatBytes(t), 4, Y(t) + 4);
      ctx.strokeStyle = "#eee"; ctx.beginPath(); ctx.moveTo(pad.l + 1, Y(t)); ctx.lineTo(width - pad.r, Y(t)); ctx.stroke();
    }
    ctx.fillStyle = "#000";
    const xmax = byTime ? (t1 - t0) / 1000 : n;
    for (const t of niceTicks(xmax, 8)) {
      const frac = xmax > 0 ? t / xmax : 0;
      const x = pad.l + (width - pad.l - pad.r) * frac;
      ctx.fillText(byTime ? t.toFixed(t < 10 ? 1 : 0) + " ms" : String(Math.round(t)), x - 10, height - pad.b + 14);
    }
    ctx.fillText(byTime ? "time since recording began" : "allocation events", width / 2 - 60, height - 6);
    legend.innerHTML = rp.bandNames.map((name, b) =>
      '<span><i style="background:' + PALETTE[b % PALETTE.length] + '"></i>' + escapeHtml(name) + "</span>").join(" ") +
      (showReserved ? ' <span><i style="background:#222;height:2px"></i>reserved</span>' : "") +
      ' <span><i style="background:#d00"></i>out of memory</span> <span><i style="background:#e80"></i>note / recovery</span>';
    state = { rp, X, Y, n, byTime, times, bands };
  }

  canvas.addEventListener("mousemove", ev => {
    if (!state) return;
    const rect = canvas.getBoundingClientRect();
    const mx = ev.clientX - rect.left, my = ev.clientY - rect.top;
    const { rp, X, Y, n, bands } = state;
    let lo = 0, hi = n;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (X(mid) <= mx) lo = mid; else hi = mid - 1; }
    const i = lo;
    let sum = 0, band = -1;
    for (let b = 0; b < bands; b++) {
      const v = rp.stack[i * bands + b];
      if (my <= Y(sum) && my >= Y(sum + v) && v > 0) { band = b; }
      sum += v;
    }
    const e = i > 0 ? data.events[i - 1] : null;
    const kinds = ["allocate", "free", "segment created", "segment released", "OUT OF MEMORY", "phase", "note"];
    let html = "";
    if (band >= 0) html += "<b>" + escapeHtml(rp.bandNames[band]) + "</b>: " + formatBytes(rp.stack[i * bands + band]) + " live<br>";
    html += "total " + formatBytes(sum) + ", reserved " + formatBytes(rp.reserved[i]) + "<br>";
    if (e) {
      html += "event " + i + " (" + (e[0] / 1000).toFixed(2) + " ms): " + kinds[e[1]];
      if (e[4] >= 0) html += " <b>" + escapeHtml(data.labels[e[4]]) + "</b>";
      if (e[3] >= 0) html += " [" + data.categories[e[3]] + "]";
      if (e[2] > 0) html += " " + formatBytes(e[2]);
      html += "<br>step " + e[5] + ", " + data.phases[e[6]];
    }
    tip.innerHTML = html;
    tip.style.display = "block";
    tip.style.left = (mx + 16) + "px";
    tip.style.top = (my + canvas.offsetTop + 8) + "px";
  });
  canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  controls.addEventListener("change", render);
  render();
  return state;
}

// A line chart of one or more series [{name, points: [[x, y], ...], color, dashed, dots}];
// opts.yMin and opts.yMax fix the vertical range (a percentage from 80 to 100).
function drawLines(canvas, series, opts) {
  const width = opts.width || 560, height = opts.height || 260;
  const pad = { l: 70, r: 16, t: 22, b: 34 };
  const ctx = setupCanvas(canvas, width, height);
  const all = series.flatMap(s => s.points);
  if (all.length === 0) {
    ctx.fillText("no data", width / 2 - 20, height / 2);
    return 0;
  }
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]).filter(Number.isFinite);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = opts.yMin !== undefined ? opts.yMin : opts.zero ? 0 : Math.min(...ys);
  const y1 = opts.yMax !== undefined ? opts.yMax : Math.max(...ys, y0 + 1e-9);
  const X = x => pad.l + (width - pad.l - pad.r) * (x - x0) / (x1 - x0);
  const Y = y => height - pad.b - (height - pad.t - pad.b) * (y - y0) / (y1 - y0);
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#000";
  ctx.fillText(opts.title || "", pad.l, 14);
  ctx.strokeStyle = "#000";
  ctx.beginPath(); ctx.moveTo(pad.l, pad.t); ctx.lineTo(pad.l, height - pad.b); ctx.lineTo(width - pad.r, height - pad.b); ctx.stroke();
  const fmt = opts.bytes ? formatBytes : (v => Math.abs(v) >= 1000 || v === 0 ? v.toFixed(0) : v.toPrecision(3));
  for (let k = 0; k <= 4; k++) {
    const v = y0 + (y1 - y0) * k / 4;
    ctx.fillText(fmt(v), 2, Y(v) + 4);
  }
  // Steps are whole numbers: ticks at a round whole step, never at 2.75.
  const xStep = x1 > x0 ? Math.max(1, niceStep((x1 - x0) / 4)) : 1;
  for (let v = Math.ceil(x0 / xStep) * xStep; v <= x1; v += xStep) {
    ctx.fillText(String(v), X(v) - 8, height - pad.b + 14);
  }
  ctx.fillText(opts.xlabel || "step", width / 2 - 10, height - 4);
  series.forEach((s, k) => {
    ctx.strokeStyle = s.color || PALETTE[k % PALETTE.length];
    ctx.setLineDash(s.dashed ? [5, 4] : []);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.points.filter(p => Number.isFinite(p[1])).forEach((p, i) => i === 0 ? ctx.moveTo(X(p[0]), Y(p[1])) : ctx.lineTo(X(p[0]), Y(p[1])));
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = ctx.strokeStyle;
    if (s.dots) {
      // Few points (one per evaluation): each marked, so a single one shows.
      s.points.filter(p => Number.isFinite(p[1])).forEach(p => {
        ctx.beginPath(); ctx.arc(X(p[0]), Y(p[1]), 3, 0, 2 * Math.PI); ctx.fill();
      });
    }
    ctx.fillText(s.name, width - pad.r - 150, pad.t + 12 * (k + 1));
  });
  return all.length;
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// Reports the page's state for tests: the body's status attribute says "ok: ..." once drawn,
// "error: ..." on any error.
function reportStatus(text) {
  document.body.setAttribute("data-status", text);
  const el = document.getElementById("status");
  if (el) el.textContent = text;
}
window.addEventListener("error", e => reportStatus("error: " + e.message));
