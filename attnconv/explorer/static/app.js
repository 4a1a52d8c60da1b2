// attnconv explorer: pick a test image and a query token; draw every layer's and head's attention.
// Reads its data through `source`: the JSON API of attnconv/explorer/server.py (the live page), or the data
// embedded in a page written by `attnconv explore --export` (attnconv/explorer/export.py). No frameworks,
// no external assets.
"use strict";

const state = {
  info: null,
  images: [],          // per index: the /api/image/K JSON
  image: 0,
  pinned: null,        // {i, j}: the clicked / keyboard query
  shown: null,         // {i, j}: the query on screen (pinned, or hovered)
  mode: "probs",
  term: "combined",
  seq: 0,
  abort: null,
};
// window.__lastAttention: the last /api/attention JSON drawn on the page (tests read it).
window.__lastAttention = null;

// viridis at 0, 0.1, ..., 1 (matplotlib), interpolated linearly.
const VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884", "#44bf70",
                 "#7ad151", "#bddf26", "#fde725"].map((h) => [1, 3, 5].map((k) => parseInt(h.slice(k, k + 2), 16)));
const MISSING = [210, 210, 210];
// A map with nothing to show (no attention on the grid, or one value everywhere): one flat grey, as in the
// report's figures (attnconv.plots.flat_map_label: the same rules and words).
const NEUTRAL = [166, 166, 166];
const NEGLIGIBLE = 1e-6;  // a probability map whose largest value is at most this holds no attention

function viridis(t) {
  if (!Number.isFinite(t)) return MISSING;
  t = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const k = Math.min(VIRIDIS.length - 2, Math.floor(t));
  const f = t - k;
  return VIRIDIS[k].map((a, c) => Math.round(a + f * (VIRIDIS[k + 1][c] - a)));
}

const $ = (id) => document.getElementById(id);

async function getJSON(url, signal) {
  const response = await fetch(url, { signal });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// ------------------------------------------------------------------------------ where the data comes from

// The page asks `source` for everything it shows; both sources answer with the same JSON as the API:
// info(), image(k), heads(), attention({image, i, j, mode, term}, signal).
const source = (() => {
  const embedded = document.getElementById("attnconv-data");
  return embedded ? embeddedSource(JSON.parse(embedded.textContent)) : liveSource();
})();

function liveSource() {
  return {
    info: () => getJSON("/api/info"),
    image: (k) => getJSON(`/api/image/${k}`),
    heads: () => getJSON("/api/heads"),
    attention: (q, signal) =>
      getJSON(`/api/attention?image=${q.image}&i=${q.i}&j=${q.j}&mode=${q.mode}&term=${q.term}`, signal),
  };
}

function decodeBase64(text) {
  const bytes = atob(text);
  const out = new Uint8Array(bytes.length);
  for (let k = 0; k < bytes.length; k++) out[k] = bytes.charCodeAt(k);
  return out;
}

// A page written by `attnconv explore --export`: the API's answers for the exported images, computed when it
// was written. data.maps.sets holds one map set (position-only models: the same for every image) or one per
// image: every query's attention as 8-bit fractions of its row's maximum ("fractions", uint8
// (layers, heads, T, T)) and those maxima ("maxima", float32 little-endian (layers, heads, T); NaN: no value).
function embeddedSource(data) {
  const sets = [];  // decoded on first use
  const set = (image) => {
    const k = data.maps.per_image ? image : 0;
    if (!sets[k]) {
      const raw = data.maps.sets[k];
      sets[k] = { fractions: decodeBase64(raw.fractions), maxima: new Float32Array(decodeBase64(raw.maxima).buffer) };
    }
    return sets[k];
  };
  const answer = (value) => Promise.resolve(value);
  return {
    info: () => answer(data.info),
    image: (k) => answer({ ...data.images[k], pixels: decodeBase64(data.images[k].pixels) }),
    heads: () => answer(data.heads),
    attention: (q) => {
      const [H, W] = data.info.grid;
      const T = H * W;
      if (!(q.image >= 0 && q.image < data.info.images)) return Promise.reject(new Error(`no image ${q.image}`));
      if (!(q.i >= 0 && q.i < H && q.j >= 0 && q.j < W)) {
        return Promise.reject(new Error(`query pixel (${q.i}, ${q.j}) is outside the ${H}x${W} token grid`));
      }
      if (!data.info.modes.includes(q.mode) || !data.info.terms.includes(q.term)) {
        return Promise.reject(new Error(`this page holds ${data.info.modes} of the ${data.info.terms} term only`));
      }
      const { fractions, maxima } = set(q.image);
      const query = q.i * W + q.j;
      const layers = [];
      for (let l = 0; l < data.info.layers; l++) {
        const heads = [];
        for (let h = 0; h < data.info.heads; h++) {
          const row = (l * data.info.heads + h) * T + query;
          const max = maxima[row];
          const values = new Array(T);
          for (let k = 0; k < T; k++) values[k] = Number.isNaN(max) ? null : (fractions[row * T + k] / 255) * max;
          heads.push(values);
        }
        layers.push(heads);
      }
      return answer({ image: q.image, i: q.i, j: q.j, mode: q.mode, term: q.term, grid: [H, W],
                      layer_numbers: layers.map((_, l) => l + 1), layers });
    },
  };
}

// 3 significant digits, as attnconv.tables.significant: "0.903", "0.100", "12.3", "1230", "1.23e-5".
function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return "0";
  const e = Math.floor(Math.log10(Math.abs(Number(v.toExponential(2)))));
  if (e < -4 || e >= 6) return v.toExponential(2);
  return e >= 2 ? Math.round(Number(v.toPrecision(3))).toString() : v.toFixed(2 - e);
}

// What to write under a map with nothing to show, or null when it has something (see NEUTRAL).
function flatLabel(values, probs) {
  const r = range(values);
  if (r.count === 0) return null;  // no such term in this layer: said elsewhere
  if (probs && r.hi <= NEGLIGIBLE) return r.hi === 0 ? "no attention: all zero" : "no attention: all < 1e-6";
  if (r.hi - r.lo > 1e-6 * Math.max(Math.abs(r.hi), Math.abs(r.lo))) return null;
  if (r.count === 1) return `one key: ${fmt(r.hi)}`;
  return probs ? `uniform: ${fmt(r.hi)} each` : `constant: ${fmt(r.hi)}`;
}

// ------------------------------------------------------------------------------ setup

async function start() {
  const info = await source.info();
  state.info = info;
  document.title = `attnconv explorer: ${info.title}`;
  $("title").textContent = `attnconv explorer: ${info.run} (${info.model})`;
  $("subtitle").textContent =
    `${info.model} (${info.encoding} encoding) on ${info.dataset}: ${info.layers} layers x ${headCount(info)} heads, ` +
    `${gridWords(info)} (${info.image_size[0]}x${info.image_size[1]} images, ` +
    `downsampled ${info.downsample}x${info.downsample}); ${info.images} test images sampled across the classes. ` +
    "Layers and heads are numbered from 1, coordinates from 0.";
  for (const input of document.querySelectorAll('input[name="mode"], input[name="term"]')) {
    const ok = (input.name === "mode" ? info.modes : info.terms).includes(input.value);
    input.disabled = !ok;
    input.parentElement.classList.toggle("disabled", !ok);
  }
  if (info.note) {
    $("term-note").textContent = info.note;
  } else if (!info.terms.includes("content")) {
    $("term-note").textContent = "Position-only attention: the score is the positional term alone.";
  }
  state.pinned = { i: Math.floor(info.grid[0] / 2), j: Math.floor(info.grid[1] / 2) };
  state.shown = { ...state.pinned };
  buildMaps();
  buildImageCanvas();
  await buildStrip();
  selectImage(0);
  await startHistory();
}

// ------------------------------------------------------------------------------ heads over training

// matplotlib's tab10, the colours of the heads in `attnconv plot centers`.
const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"];
const CENTERS_PX = 170;

async function startHistory() {
  const data = await source.heads();
  const snaps = data.snapshots;
  state.history = data;
  const box = $("centers");
  if (!snaps.length) {
    $("history-note").textContent =
      "This run has no heads.jsonl (runs trained before heads were recorded, and networks converted from a " +
      "CNN, have none): train it again to step through its heads over training.";
    $("history-controls").hidden = true;
    box.dataset.status = "empty";
    return;
  }
  $("history-note").textContent =
    "Where each head looks, recorded at initialization (epoch 0) and after every epoch: its center relative " +
    "to the query token (black square), in tokens" +
    (snaps[0].layers[0][0].ellipses ? ", with the contours holding 50% (solid) and 90% (dotted) of its mass. " :
      " (the centre of mass of the middle query's positional attention). ") +
    "Drag the slider, or focus it and use the arrow keys.";
  // One window for every epoch, so the heads' movement reads directly: all centers and 90% contours fit.
  let reach = 2;
  for (const snap of snaps) for (const layer of snap.layers) for (const h of layer) {
    const extent = h.ellipses ? h.ellipses[h.ellipses.length - 1][0] : 0;
    reach = Math.max(reach, Math.abs(h.center[0]) + extent, Math.abs(h.center[1]) + extent);
  }
  state.reach = Math.min(Math.ceil(reach), Math.max(...data.grid));
  const heads = snaps[0].layers[0].length;
  const legend = $("head-legend");
  for (let h = 0; h < heads; h++) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");  // no inline style markup: the exported page's policy forbids it
    swatch.className = "swatch";
    swatch.style.background = TAB10[h % 10];
    item.append(swatch, `head ${h + 1}`);
    legend.appendChild(item);
  }
  snaps[0].layers.forEach((_, l) => {
    const fig = document.createElement("figure");
    const canvas = document.createElement("canvas");
    canvas.id = `centers-${l}`;
    canvas.width = canvas.height = CENTERS_PX;
    canvas.setAttribute("role", "img");
    const cap = document.createElement("figcaption");
    cap.textContent = `layer ${l + 1}`;
    fig.append(canvas, cap);
    box.appendChild(fig);
  });
  const slider = $("epoch");
  slider.max = String(snaps.length - 1);
  slider.value = String(snaps.length - 1);
  slider.setAttribute("aria-valuetext", `epoch ${snaps[snaps.length - 1].epoch}`);
  slider.addEventListener("input", () => drawHistory(Number(slider.value)));
  drawHistory(snaps.length - 1);
}

function drawHistory(index) {
  const snap = state.history.snapshots[index];
  const text = `epoch ${snap.epoch} (step ${snap.step})${snap.epoch === 0 ? ", at initialization" : ""}`;
  $("epoch-readout").textContent = text;
  $("epoch").setAttribute("aria-valuetext", text);
  snap.layers.forEach((heads, l) => {
    const canvas = $(`centers-${l}`);
    canvas.setAttribute("aria-label", `layer ${l + 1} head centers at ${text}`);
    drawCenters(canvas, heads, state.reach);
  });
  const box = $("centers");
  box.dataset.epoch = String(snap.epoch);
  box.dataset.status = "ready";
  window.__lastHeads = snap;
}

function drawCenters(canvas, heads, R) {
  const ctx = canvas.getContext("2d");
  const scale = canvas.width / (2 * R + 1);
  const x = (col) => (col + R + 0.5) * scale; // token (row, col) shifts -> canvas pixels, rows down
  const y = (row) => (row + R + 0.5) * scale;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.strokeStyle = "#e3e7eb";
  ctx.lineWidth = 1;
  for (let k = 0; k <= 2 * R + 1; k++) {
    ctx.beginPath();
    ctx.moveTo(k * scale, 0); ctx.lineTo(k * scale, canvas.height);
    ctx.moveTo(0, k * scale); ctx.lineTo(canvas.width, k * scale);
    ctx.stroke();
  }
  ctx.fillStyle = "#000";
  ctx.fillRect(x(-0.5), y(-0.5), scale, scale);
  const lim = R + 0.5;
  heads.forEach((h, n) => {
    const color = TAB10[n % 10];
    const [r, c] = h.center;
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.4;
    (h.ellipses || []).forEach(([major, minor, angle], k) => {
      ctx.setLineDash(k === 0 ? [] : [2, 3]);
      ctx.beginPath();
      ctx.ellipse(x(c), y(r), major * scale, minor * scale, (angle * Math.PI) / 180, 0, 2 * Math.PI);
      ctx.stroke();
    });
    ctx.setLineDash([]);
    const inside = Math.abs(r) <= lim && Math.abs(c) <= lim;
    ctx.beginPath();
    ctx.arc(x(Math.min(lim, Math.max(-lim, c))), y(Math.min(lim, Math.max(-lim, r))), 3.5, 0, 2 * Math.PI);
    if (inside) { ctx.fillStyle = color; ctx.fill(); } else { ctx.lineWidth = 1.5; ctx.stroke(); }
  });
}

function buildStrip() {
  const strip = $("strip");
  const jobs = [];
  for (let k = 0; k < state.info.images; k++) {
    const button = document.createElement("button");
    button.type = "button";
    button.id = `thumb-${k}`;
    button.setAttribute("aria-pressed", "false");
    button.setAttribute("aria-label", `image ${k + 1} of ${state.info.images}`);
    const canvas = document.createElement("canvas");
    button.appendChild(canvas);
    button.addEventListener("click", () => selectImage(k));
    strip.appendChild(button);
    jobs.push(source.image(k).then((img) => {
      state.images[k] = img;
      drawPixels(canvas, img, 1);
      button.title = `test image #${img.test_index}: ${img.label_name}`;
      button.setAttribute("aria-label", `test image #${img.test_index}, ${img.label_name}`);
    }));
  }
  return Promise.all(jobs);
}

function buildImageCanvas() {
  const canvas = $("image");
  const [h, w] = state.info.image_size;
  const scale = Math.max(1, Math.floor(256 / Math.max(h, w)));
  canvas.width = w * scale;
  canvas.height = h * scale;
  canvas.addEventListener("click", (ev) => {
    state.pinned = tokenAt(canvas, ev);
    setQuery(state.pinned);
  });
  canvas.addEventListener("mousemove", (ev) => {
    const t = tokenAt(canvas, ev);
    if (t.i !== state.shown.i || t.j !== state.shown.j) setQuery(t);
  });
  canvas.addEventListener("mouseleave", () => {
    if (state.pinned.i !== state.shown.i || state.pinned.j !== state.shown.j) setQuery(state.pinned);
  });
  canvas.addEventListener("keydown", (ev) => {
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (!(ev.key in moves)) return;
    ev.preventDefault();
    const [di, dj] = moves[ev.key];
    const [gh, gw] = state.info.grid;
    state.pinned = { i: Math.min(gh - 1, Math.max(0, state.pinned.i + di)),
                     j: Math.min(gw - 1, Math.max(0, state.pinned.j + dj)) };
    setQuery(state.pinned);
  });
  for (const input of document.querySelectorAll('input[name="mode"], input[name="term"]')) {
    input.addEventListener("change", () => {
      state[input.name] = input.value;
      update();
    });
  }
  $("shared").addEventListener("change", () => window.__lastAttention && render(window.__lastAttention));
}

// The token under a mouse event: image pixel = position * image size / drawn size; token = pixel / downsample.
function tokenAt(canvas, ev) {
  const rect = canvas.getBoundingClientRect();
  const [h, w] = state.info.image_size;
  const [gh, gw] = state.info.grid;
  const d = state.info.downsample;
  const x = ((ev.clientX - rect.left) * w) / rect.width;
  const y = ((ev.clientY - rect.top) * h) / rect.height;
  return { i: Math.min(gh - 1, Math.max(0, Math.floor(y / d))), j: Math.min(gw - 1, Math.max(0, Math.floor(x / d))) };
}

// "7x7 token grid", or "grids of 28x28 to 4x4, one per layer" where the layers' grids differ (a converted network).
function gridWords(info) {
  const grids = info.layer_grids ? [...new Set(info.layer_grids.map((g) => `${g[0]}x${g[1]}`))] : [];
  if (grids.length < 2) return `${info.grid[0]}x${info.grid[1]} token grid`;
  return `grids of ${grids[0]} to ${grids[grids.length - 1]}, one per layer`;
}

// "9", or "3 to 16" where the layers' head counts differ (a converted ViT's patch layer and blocks).
function headCount(info) {
  if (!info.layer_heads) return `${info.heads}`;
  return `${Math.min(...info.layer_heads)} to ${Math.max(...info.layer_heads)}`;
}

// Each layer's key grid: the token grid, or (networks converted from a CNN) the layer's own input grid.
function layerGrid(l) {
  return state.info.layer_grids ? state.info.layer_grids[l] : state.info.grid;
}

function buildMaps() {
  const { layers, heads } = state.info;
  const maps = $("maps");
  // Each map's column is at most as wide as its canvas and shrinks (the canvases scale down) when the window
  // is narrow, so the page never scrolls sideways; captions wrap inside their column.
  let widest = 0;
  for (let l = 0; l < layers; l++) {
    const grid = layerGrid(l);
    widest = Math.max(widest, grid[1] * Math.max(3, Math.floor(84 / Math.max(grid[0], grid[1]))));
  }
  // At least 48 px a map (or its full width, if smaller): a layer of very many heads (49, a converted ViT's 7x7
  // patches) scrolls sideways inside the maps' box instead of shrinking every map to a few pixels.
  const least = Math.min(48, widest + 2);
  maps.style.gridTemplateColumns =
    `minmax(3.2rem, max-content) repeat(${heads}, minmax(${least}px, ${widest + 2}px))`;
  maps.appendChild(document.createElement("div"));
  for (let h = 0; h < heads; h++) {
    const label = document.createElement("div");
    label.className = "col-label";
    label.textContent = `head ${h + 1}`;
    maps.appendChild(label);
  }
  for (let l = 0; l < layers; l++) {
    const label = document.createElement("div");
    label.className = "row-label";
    label.textContent = `layer ${l + 1}`;
    if (state.info.layer_names) {
      const name = document.createElement("span");
      name.className = "layer-name";
      name.textContent = state.info.layer_names[l];
      label.append(" ", name);
    }
    maps.appendChild(label);
    const grid = layerGrid(l);
    const cell = Math.max(3, Math.floor(84 / Math.max(grid[0], grid[1])));
    for (let h = 0; h < heads; h++) {
      if (state.info.layer_heads && h >= state.info.layer_heads[l]) {  // a layer with fewer heads: an empty cell
        const empty = document.createElement("div");
        empty.className = "no-head";
        maps.appendChild(empty);
        continue;
      }
      const figure = document.createElement("figure");
      figure.id = `map-${l}-${h}`;
      figure.dataset.layer = l;
      figure.dataset.head = h;
      const canvas = document.createElement("canvas");
      canvas.width = grid[1] * cell;
      canvas.height = grid[0] * cell;
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `layer ${l + 1}, head ${h + 1}`);
      canvas.addEventListener("mousemove", (ev) => readCell(canvas, ev, l, h));
      const caption = document.createElement("figcaption");
      caption.className = "readout";
      figure.append(canvas, caption);
      maps.appendChild(figure);
    }
  }
}

// ------------------------------------------------------------------------------ image and query

function drawPixels(canvas, img, scale) {
  canvas.width = img.width * scale;
  canvas.height = img.height * scale;
  const ctx = canvas.getContext("2d");
  const data = ctx.createImageData(img.width, img.height);
  for (let p = 0; p < img.width * img.height; p++) {
    for (let c = 0; c < 3; c++) data.data[4 * p + c] = img.pixels[p * img.channels + (img.channels === 3 ? c : 0)];
    data.data[4 * p + 3] = 255;
  }
  if (scale === 1) {
    ctx.putImageData(data, 0, 0);
    return;
  }
  const tmp = document.createElement("canvas");
  tmp.width = img.width;
  tmp.height = img.height;
  tmp.getContext("2d").putImageData(data, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(tmp, 0, 0, canvas.width, canvas.height);
}

function drawImage() {
  const img = state.images[state.image];
  const canvas = $("image");
  if (!img) return;
  const scale = canvas.width / img.width;
  drawPixels(canvas, img, scale);
  const ctx = canvas.getContext("2d");
  const d = state.info.downsample * scale;
  const [gh, gw] = state.info.grid;
  ctx.strokeStyle = "rgba(64, 150, 255, 0.6)";
  ctx.lineWidth = 1;
  ctx.beginPath();
  for (let r = 1; r < gh; r++) { ctx.moveTo(0, r * d + 0.5); ctx.lineTo(canvas.width, r * d + 0.5); }
  for (let c = 1; c < gw; c++) { ctx.moveTo(c * d + 0.5, 0); ctx.lineTo(c * d + 0.5, canvas.height); }
  ctx.stroke();
  const q = state.shown;
  ctx.strokeStyle = "#ff2d2d";
  ctx.lineWidth = 3;
  ctx.strokeRect(q.j * d + 1.5, q.i * d + 1.5, d - 3, d - 3);
  if (state.pinned.i !== q.i || state.pinned.j !== q.j) {
    ctx.setLineDash([3, 3]);
    ctx.lineWidth = 1.5;
    ctx.strokeRect(state.pinned.j * d + 1, state.pinned.i * d + 1, d - 2, d - 2);
    ctx.setLineDash([]);
  }
}

function selectImage(k) {
  state.image = k;
  for (const b of document.querySelectorAll("#strip button")) {
    b.setAttribute("aria-pressed", String(b.id === `thumb-${k}`));
  }
  const img = state.images[k];
  $("prediction").textContent = img
    ? `test image #${img.test_index}: label ${img.label_name}; the model predicts ${img.predicted_name} ` +
      `(p = ${fmt(img.predicted_prob)})`
    : "";
  setQuery(state.shown);
}

function setQuery(q) {
  state.shown = { i: q.i, j: q.j };
  const pinned = state.pinned.i === q.i && state.pinned.j === q.j;
  $("query-readout").textContent = `query token (${q.i}, ${q.j})${pinned ? "" : " (hover preview; click to keep)"}`;
  drawImage();
  update();
}

// ------------------------------------------------------------------------------ attention

async function update() {
  const seq = ++state.seq;
  if (state.abort) state.abort.abort();
  state.abort = new AbortController();
  const { i, j } = state.shown;
  $("maps").dataset.status = "loading";
  try {
    const result = await source.attention({ image: state.image, i, j, mode: state.mode, term: state.term },
                                          state.abort.signal);
    if (seq !== state.seq) return;  // a newer request is on its way
    window.__lastAttention = result;
    render(result);
    $("status").textContent = "";
    $("status").className = "";
  } catch (err) {
    if (err.name === "AbortError" || seq !== state.seq) return;
    $("status").textContent = `error: ${err.message}`;
    $("status").className = "error";
    $("maps").dataset.status = "error";
  }
}

function range(values) {
  let lo = Infinity, hi = -Infinity, arg = -1, count = 0;
  values.forEach((v, k) => {
    if (v === null) return;
    count += 1;
    if (v < lo) lo = v;
    if (v > hi) { hi = v; arg = k; }
  });
  return { lo, hi, arg, count };
}

function render(result) {
  const probs = result.mode === "probs";
  const shared = $("shared").checked;
  let all = { lo: Infinity, hi: -Infinity };
  for (const layer of result.layers) for (const head of layer) {
    const r = range(head);
    all = { lo: Math.min(all.lo, r.lo), hi: Math.max(all.hi, r.hi) };
  }
  result.layers.forEach((layer, n) => {
    const l = result.layer_numbers[n] - 1;  // numbered from 1; the page's elements from 0
    const grid = result.grids ? result.grids[n] : state.info.grid;
    const [qi, qj] = result.queries ? result.queries[n] : [result.i, result.j];
    layer.forEach((values, h) => {
      const figure = $(`map-${l}-${h}`);
      const canvas = figure.querySelector("canvas");
      const own = range(values);
      // probabilities from 0 (as the paper's maps); scores over their own range
      const lo = probs ? 0 : shared ? all.lo : own.lo;
      const hi = shared ? all.hi : own.hi;
      const flat = flatLabel(values, probs);
      drawMap(canvas, values, lo, hi, qi, qj, grid, flat !== null);
      const r = Math.floor(own.arg / grid[1]), c = own.arg % grid[1];
      figure.dataset.values = JSON.stringify(values);
      figure.dataset.max = String(own.hi);
      figure.dataset.argmax = `${r},${c}`;
      figure.dataset.flat = flat === null ? "" : flat;
      const none = own.arg < 0;  // every value null: this layer has no such score term
      const caption = none ? `no ${result.term} term in this layer` : flat !== null ? flat
        : `max ${fmt(own.hi)} at (${r}, ${c})`;
      figure.querySelector("figcaption").textContent = caption;
      canvas.setAttribute("aria-label", `layer ${l + 1}, head ${h + 1}: ` +
        (none || flat !== null ? caption : `maximum ${fmt(own.hi)} at key (${r}, ${c})`));
    });
  });
  drawLegend(probs, shared, all);
  const maps = $("maps");
  Object.assign(maps.dataset, {
    image: result.image, query: `${result.i},${result.j}`, mode: result.mode, term: result.term, status: "ready",
  });
}

function drawMap(canvas, values, lo, hi, qi, qj, grid, flat) {
  const ctx = canvas.getContext("2d");
  const cw = canvas.width / grid[1], ch = canvas.height / grid[0];
  const span = hi > lo ? hi - lo : 1;
  values.forEach((v, k) => {
    const [r, g, b] = v === null ? MISSING : flat ? NEUTRAL : viridis((v - lo) / span);
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect((k % grid[1]) * cw, Math.floor(k / grid[1]) * ch, cw, ch);
  });
  ctx.strokeStyle = "#ff2d2d";
  ctx.lineWidth = 2;
  ctx.strokeRect(qj * cw + 1, qi * ch + 1, cw - 2, ch - 2);
}

function drawLegend(probs, shared, all) {
  const bar = $("colorbar");
  const ctx = bar.getContext("2d");
  for (let x = 0; x < bar.width; x++) {
    const [r, g, b] = viridis(x / (bar.width - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, 0, 1, bar.height);
  }
  const what = probs ? "probability" : "score";
  if (shared) {
    $("scale-lo").textContent = probs ? "0" : fmt(all.lo);
    $("scale-hi").textContent = fmt(all.hi);
    $("scale-note").textContent = `One scale for every map (${what}).`;
  } else {
    $("scale-lo").textContent = probs ? "0" : "map's min";
    $("scale-hi").textContent = "map's max";
    $("scale-note").textContent = `Each map is scaled to its own ${probs ? "maximum" : "range"} (${what}); ` +
      "the caption gives the maximum and the key where it is.";
  }
}

function readCell(canvas, ev, l, h) {
  const result = window.__lastAttention;
  if (!result) return;
  const n = result.layer_numbers.indexOf(l + 1);
  if (n < 0) return;
  const grid = result.grids ? result.grids[n] : state.info.grid;
  const rect = canvas.getBoundingClientRect();
  const c = Math.min(grid[1] - 1, Math.floor(((ev.clientX - rect.left) * grid[1]) / rect.width));
  const r = Math.min(grid[0] - 1, Math.floor(((ev.clientY - rect.top) * grid[0]) / rect.height));
  const v = result.layers[n][h][r * grid[1] + c];
  $("cell-readout").textContent =
    `layer ${l + 1}, head ${h + 1}, query (${result.i}, ${result.j}) -> key (${r}, ${c}): ` +
    `${result.mode === "probs" ? "probability" : "score"} ${fmt(v)}`;
}

start().catch((err) => {
  $("status").textContent = `error: ${err.message}`;
  $("status").className = "error";
});
