// jaxmodel explorer: the page's behaviour. State lives in the URL (?page=...&field=...).
"use strict";
const $ = (s) => document.querySelector(s);
const $$ = (s) => Array.from(document.querySelectorAll(s));
const PAGES = ["predict", "whatif", "search", "compare"];
let OPTIONS = null, uploaded = null, plans = [], knobState = {}, page = "predict";
const UNITS = {step_time_s: "s", ttft_s: "s", tpot_s: "s", total_s: "s", tokens_per_s: "tokens/s",
  mfu: "", memory_bytes: "GiB", usd_per_million_tokens: "USD / M tokens"};

function fmt(v, key) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (key && key.includes("bytes")) return (v / 2 ** 30).toPrecision(4) + " GiB";
  if (Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0)) return v.toExponential(4);
  return Number(v.toPrecision(5)).toString();
}
function num(v) { return typeof v === "number" ? v : (v === "inf" ? Infinity : NaN); }

// ---- form <-> URL
function formValues() {
  const out = {};
  for (const el of $$("#inputs [name]")) if (el.value !== "") out[el.name] = el.value;
  const ph = out.phase || "train";
  const skip = ph === "train" ? ["batch", "prompt_len", "gen_len", "runtime"] : ["global_batch", "seq_len"];
  for (const k of skip) delete out[k];
  return out;
}
function searchValues() {
  const out = {};
  for (const el of $$("#page-search [name]")) if (el.value !== "") out[el.name] = el.value;
  const f = formValues();
  for (const k of ["system", "nodes", "model", "global_batch", "seq_len", "precision"]) if (f[k] !== undefined) out[k] = f[k];
  if (out.kind === "serve") { delete out.global_batch; delete out.seq_len; delete out.precision; }
  else for (const k of ["isl", "osl", "ttft_slo", "tpot_slo", "precisions", "runtimes"]) delete out[k];
  return out;
}
function whatifValues() {
  const out = formValues();
  for (const [k, s] of Object.entries(knobState)) { out["k_" + k] = s.value; }
  out.sweep = $("#w-metric").dataset.sweep || "mem_bw";
  const s = knobState[out.sweep];
  if (s) { out.lo = s.lo; out.hi = s.hi; }
  return out;
}
function pageValues() {
  if (page === "whatif") return whatifValues();
  if (page === "search") return searchValues();
  if (page === "compare") {
    const out = {};
    plans.forEach((p, i) => { for (const [k, v] of Object.entries(p)) out[`p${i + 1}.${k}`] = v; });
    return out;
  }
  return formValues();
}
function writeURL() {
  const q = new URLSearchParams({page, ...pageValues()});
  if (page === "whatif") q.set("metric", $("#w-metric").value);
  history.replaceState(null, "", "?" + q.toString());
  for (const name of ["predict", "whatif", "search", "compare"]) {
    const v = name === page ? pageValues() : (name === "search" ? searchValues() : name === "whatif" ? whatifValues() : formValues());
    if (name === "compare") continue;
    $("#csv-" + name).href = `/api/${name}?` + new URLSearchParams({...v, format: "csv"});
  }
  const cq = {};
  plans.forEach((p, i) => { for (const [k, v] of Object.entries(p)) cq[`p${i + 1}.${k}`] = v; });
  $("#csv-compare").href = "/api/compare?" + new URLSearchParams({...cq, format: "csv"});
  $("#csv-sens").href = "/api/explain?" + new URLSearchParams({...formValues(), format: "csv"});
}
function readURL() {
  const q = new URLSearchParams(location.search);
  page = PAGES.includes(q.get("page")) ? q.get("page") : "predict";
  const byPlan = {};
  for (const [k, v] of q.entries()) {
    const el = document.querySelector(`#inputs [name="${k}"]`) || document.querySelector(`#page-search [name="${k}"]`);
    if (el) el.value = v;
    const m = k.match(/^p(\d+)\.(.+)$/);
    if (m) (byPlan[m[1]] = byPlan[m[1]] || {})[m[2]] = v;
    const kn = k.match(/^k_(.+)$/);
    if (kn) (knobState[kn[1]] = knobState[kn[1]] || {}).fromURL = parseFloat(v);
  }
  plans = Object.keys(byPlan).sort((a, b) => a - b).map((i) => byPlan[i]);
  if (q.get("sweep")) $("#w-metric").dataset.sweep = q.get("sweep");
  if (q.get("metric")) $("#w-metric").dataset.want = q.get("metric");
}

// ---- errors and progress
function clearErrors() {
  $("#error").style.display = "none";
  $$(".err").forEach((e) => { if (e.id !== "predict-explain") e.textContent = ""; });
  $$(".bad").forEach((e) => e.classList.remove("bad"));
}
function showError(msg, field) {
  $("#error").textContent = msg;
  $("#error").style.display = "block";
  if (field) {
    const base = field.includes(".") ? field.split(".").pop() : field;
    const e = $("#e-" + base) || $("#e-" + field);
    if (e) e.textContent = msg;
    const inp = $("#f-" + base) || $("#s-" + base);
    if (inp) inp.classList.add("bad");
  }
}
let busy = 0;
function progress(on, text) {
  busy += on ? 1 : -1;
  $("#progress").style.display = busy > 0 ? "block" : "none";
  if (text) $("#progress-text").textContent = text;
}

// ---- API: a job polled until done (progress shown), or a direct answer
async function api(name, values, body) {
  const url = `/api/${name}?` + new URLSearchParams(values);
  const opts = body ? {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({form: values, ...body})} : {};
  const r = await fetch(url, opts);
  const j = await r.json();
  if (!r.ok) throw Object.assign(new Error(j.error), {field: j.field});
  if (!j.job) return j;
  progress(true, `${name}: queued`);
  try {
    for (let i = 0; ; i++) {
      await new Promise((res) => setTimeout(res, i < 10 ? 100 : 400));
      const s = await (await fetch(`/api/job/${j.job}`)).json();
      if (s.state === "done") return s.result;
      if (s.state === "error") throw Object.assign(new Error(s.message), {field: s.field});
      $("#progress-text").textContent = `${name}: ${s.state}, ${s.elapsed_s.toFixed(1)} s` +
        (s.elapsed_s > 3 ? " (the first question of a shape compiles; later ones answer in a fraction of a second)" : "");
    }
  } finally { progress(false); }
}
function withModel(values) { return uploaded ? {model_config: uploaded} : null; }

// ---- Predict
function kvTable(obj, prefix = "v-") {
  return "<table class='kv'>" + Object.entries(obj).map(([k, v]) =>
    `<tr><td>${k}</td><td class="num" id="${prefix}${k}">${fmt(v, k)}</td></tr>`).join("") + "</table>";
}
function stackedBar(div, parts, title, unit, scale, mode = "stack") {
  if (!window.Plotly) { $(div).textContent = "charts need the plotly package (pip install jaxmodel[ui])"; return; }
  const traces = Object.entries(parts).filter(([k, v]) => k !== "total" && typeof v === "number" && v > 0).map(([k, v]) =>
    ({type: "bar", orientation: "h", name: k, y: [title], x: [v * scale], hovertemplate: `${k}: %{x:.4g} ${unit}<extra></extra>`}));
  Plotly.react(div, traces, {barmode: mode, title: {text: title, font: {size: 14}}, margin: {l: 20, r: 10, t: 40, b: 40},
    xaxis: {title: {text: unit}}, yaxis: {showticklabels: false}, legend: {orientation: "h", y: -0.3, font: {size: 10}}}, {displaylogo: false, responsive: true});
}
async function runPredict() {
  clearErrors(); writeURL();
  try {
    const r = await api("predict", formValues(), withModel());
    $("#predict-out").style.display = "block";
    const head = {...r.headline, feasible: r.feasible, reason: r.reason};
    $("#predict-headline").innerHTML = `<div class="muted">${r.model} on ${r.n_devices} × ${r.system} — plan ` +
      ["dp", "tp", "pp", "cp", "micro_batch"].map((k) => `${k}=${r.parallelism[k]}`).join(" ") + "</div>" + kvTable(head);
    $("#predict-explain").textContent = r.explain || "";
    stackedBar("chart-breakdown", r.breakdown, r.phase === "train" ? "time per step" : "time", "s", 1);
    if (Object.keys(r.memory).length) stackedBar("chart-memory", r.memory, "memory per device", "GiB", 1 / 2 ** 30);
    else $("#chart-memory").innerHTML = "";
    $("#status").textContent = "predicted";
  } catch (e) { showError(e.message, e.field); }
}

// ---- Sensitivities (the Predict page's card): jm.explain_train / jm.explain_serve on demand
let sens = null;
async function runSensitivities() {
  clearErrors(); writeURL();
  try {
    sens = await api("explain", formValues(), withModel());
    const sel = $("#sens-metric"), keep = sel.value;
    fill("#sens-metric", Object.keys(sens.metrics));
    if (keep && sens.metrics[keep]) sel.value = keep;
    drawSensitivities();
    $("#status").textContent = "explained";
  } catch (e) { showError(e.message, e.field); }
}
function drawSensitivities() {
  if (!sens) return;
  const m = $("#sens-metric").value || Object.keys(sens.metrics)[0], d = sens.metrics[m];
  $("#sens-body").innerHTML = `<div class="muted">${m} = ${fmt(d.value, m)}; board power ` +
    `${sens.power_w.toFixed(0)} W per device${sens.power_limited ? " (power-limited)" : ""}` +
    `${sens.feasible ? "" : "; infeasible: " + sens.reason}; the ${d.knobs.length} of ` +
    `${sens.knobs_total} knobs with the largest |elasticity| (* = at a kink: one-sided)</div>`;
  if (!window.Plotly) { $("#chart-sens").textContent = "charts need the plotly package (pip install jaxmodel[ui])"; return; }
  const ks = [...d.knobs].reverse();
  Plotly.react("chart-sens", [{type: "bar", orientation: "h", x: ks.map((k) => k.elasticity),
    y: ks.map((k) => k.knob + (k.kink ? " *" : "")),
    marker: {color: ks.map((k) => (k.elasticity < 0 ? "#2a7" : "#c44"))},
    hovertemplate: "%{y}: %{x:.3f}<extra></extra>"}],
    {title: {text: `d ln ${m} / d ln knob`, font: {size: 14}}, margin: {l: 260, r: 10, t: 40, b: 40},
     xaxis: {zeroline: true}}, {displaylogo: false, responsive: true});
  const groups = ["compute", "memory", "communication", "bubble", "overhead"], views = Object.keys(sens.bottleneck);
  Plotly.react("chart-bottleneck", groups.map((g) => ({type: "bar", orientation: "h", name: g, y: views,
    x: views.map((v) => sens.bottleneck[v][g] || 0), hovertemplate: `${g}: %{x:.4g} s<extra></extra>`})),
    {barmode: "stack", title: {text: "bottleneck (s)", font: {size: 14}}, margin: {l: 70, r: 10, t: 40, b: 40},
     legend: {orientation: "h", y: -0.4, font: {size: 10}}}, {displaylogo: false, responsive: true});
}

// ---- What-if
async function loadKnobs() {
  clearErrors();
  let r;
  try { r = await api("knobs", {system: $("#f-system").value, nodes: $("#f-nodes").value}); }
  catch (e) { showError(e.message, e.field); return; }
  const box = $("#sliders"); box.innerHTML = "";
  for (const [k, meta] of Object.entries(r.knobs)) {
    const base = r.values[k], old = knobState[k] || {};
    const s = knobState[k] = {base, lo: base / 2, hi: base * 2, value: old.fromURL !== undefined ? old.fromURL : (old.base === base ? old.value : base)};
    const row = document.createElement("div"); row.className = "slider";
    row.innerHTML = `<span>${meta.label} (${meta.unit})</span>` +
      `<input type="range" id="k-${k}" min="${s.lo}" max="${s.hi}" step="${(s.hi - s.lo) / 1000}" value="${s.value}">` +
      `<span id="kv-${k}">${fmt(s.value)}</span>`;
    box.appendChild(row);
    row.querySelector("input").addEventListener("input", (ev) => {
      s.value = parseFloat(ev.target.value); $("#kv-" + k).textContent = fmt(s.value);
      $("#w-metric").dataset.sweep = k; requestWhatif();
    });
  }
  const sel = $("#w-metric"), want = sel.dataset.want || sel.value;
  const metrics = $("#f-phase").value === "train" ? ["step_time_s", "tokens_per_s", "mfu", "memory_bytes", "usd_per_million_tokens"]
    : ["ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes", "usd_per_million_tokens"];
  sel.innerHTML = metrics.map((m) => `<option>${m}</option>`).join("");
  if (metrics.includes(want)) sel.value = want;
  if (!knobState[sel.dataset.sweep]) sel.dataset.sweep = "mem_bw";
  requestWhatif();
}
let wInFlight = false, wPending = false, lastWhatif = null;
async function requestWhatif() {
  if (wInFlight) { wPending = true; return; }
  wInFlight = true; clearErrors(); writeURL();
  const t0 = performance.now();
  try {
    lastWhatif = await api("whatif", whatifValues(), withModel());
    $("#status").textContent = "what-if";
    $("#w-time").textContent = `answered in ${((performance.now() - t0) / 1000).toFixed(2)} s`;
    drawWhatif();
  } catch (e) { showError(e.message, e.field); }
  wInFlight = false;
  if (wPending) { wPending = false; requestWhatif(); }
}
function drawWhatif() {
  const r = lastWhatif; if (!r) return;
  const m = $("#w-metric").value;
  $("#w-label").textContent = `${m} at ${r.label} = ${fmt(r.value)} ${r.unit}:`;
  $("#w-value").textContent = r.at_feasible ? fmt(r.at[m], m) : `infeasible (${fmt(r.at[m])})`;
  $("#w-value").dataset.raw = r.at[m];
  if (!window.Plotly) return;
  const scale = m.includes("bytes") ? 1 / 2 ** 30 : 1;
  const y = r.curves[m].map((v) => num(v) * scale);
  Plotly.react("chart-whatif", [
    {x: r.x, y, mode: "lines", name: m},
    {x: [r.value], y: [num(r.at[m]) * scale], mode: "markers", marker: {size: 11, color: "#d33"}, name: "slider"}],
    {margin: {t: 20, l: 70, r: 10, b: 50}, xaxis: {title: {text: `${r.label} (${r.unit})`}}, yaxis: {title: {text: `${m} (${UNITS[m] || ""})`}}, showlegend: false},
    {displaylogo: false, responsive: true});
}

// ---- Search
let lastSearch = null;
async function runSearch() {
  clearErrors(); writeURL();
  try {
    const r = lastSearch = await api("search", searchValues(), withModel());
    $("#search-out").style.display = "block";
    $("#search-summary").textContent = `${r.model} on ${r.n_devices} × ${r.system}: ${r.n_evaluated} configurations evaluated; ${r.rows.length} shown (Pareto front highlighted). Click a point or a row.`;
    const cols = r.columns.filter((c) => !c.startsWith("breakdown") && !c.startsWith("memory.")).slice(0, 24);
    $("#search-table").innerHTML = "<tr>" + cols.map((c) => `<th>${c}</th>`).join("") + "</tr>" +
      r.rows.map((row, i) => `<tr data-i="${i}" class="${row.pareto ? "pareto" : ""}">` +
        cols.map((c) => `<td class="num">${fmt(row[c], c)}</td>`).join("") + "</tr>").join("");
    $$("#search-table tr[data-i]").forEach((tr) => tr.addEventListener("click", () => pick(+tr.dataset.i)));
    if (window.Plotly) {
      const {x, y} = r.axes, ys = y.includes("bytes") ? 1 / 2 ** 30 : 1;
      const idx = r.rows.map((_, i) => i);
      const front = idx.filter((i) => r.rows[i].pareto), rest = idx.filter((i) => !r.rows[i].pareto);
      const tr = (ii, name, color) => ({x: ii.map((i) => r.rows[i][x]), y: ii.map((i) => r.rows[i][y] * ys), customdata: ii,
        mode: "markers", type: "scatter", name, marker: {color, size: name === "Pareto front" ? 10 : 6}});
      const el = $("#chart-front");
      Plotly.react(el, [tr(rest, "other", "#9ab"), tr(front, "Pareto front", "#e63")],
        {margin: {t: 20, l: 70, r: 10, b: 50}, xaxis: {title: {text: x}}, yaxis: {title: {text: y + (ys !== 1 ? " (GiB)" : "")}}, hovermode: "closest"},
        {displaylogo: false, responsive: true});
      el.removeAllListeners && el.removeAllListeners("plotly_click");
      el.on("plotly_click", (ev) => pick(ev.points[0].customdata));
    }
  } catch (e) { showError(e.message, e.field); }
}
function pick(i) {
  const r = lastSearch, row = r.rows[i];
  $$("#search-table tr").forEach((t) => t.classList.toggle("sel", t.dataset.i == i));
  const box = $("#search-pick");
  box.innerHTML = `<b>chosen point #${i + 1}</b><div id="pick-breakdown" style="height:300px"></div>` +
    kvTable(Object.fromEntries(Object.entries(row).filter(([, v]) => v !== null)), "pick-");
  box.dataset.row = i;
  // the row's own breakdown (the search's numbers for this plan): breakdown.* columns
  const parts = {};
  for (const [k, v] of Object.entries(row)) if (k.startsWith("breakdown.") && typeof v === "number") parts[k.slice(10)] = v;
  if (!Object.keys(parts).length) for (const k of ["ttft_s", "tpot_s"]) if (typeof row[k] === "number") parts[k] = row[k];
  // training: the step's parts add up (stacked); serving: TTFT and TPOT side by side
  stackedBar("pick-breakdown", parts, r.kind === "train" ? "time per step of this plan" : "latencies of this deployment", "s", 1,
    r.kind === "train" ? "stack" : "group");
}

// ---- Compare
function drawPlans() {
  $("#plans").innerHTML = plans.map((p, i) => `<span>#${i + 1}: ${p.model || ""} on ${p.system || ""}×${p.nodes || 1} ${p.phase || ""} tp=${p.tp || "-"} pp=${p.pp || "-"} ${p.precision || ""}</span>`).join("");
}
async function runCompare() {
  clearErrors(); writeURL();
  try {
    const body = {plans, ...(uploaded ? {model_config: uploaded} : {})};
    const r = await api("compare", {}, body);
    $("#compare-out").style.display = "block";
    const keys = [...new Set(r.plans.flatMap((p) => Object.keys(p.headline)))];
    $("#compare-table").innerHTML = "<tr><th></th>" + r.plans.map((p, i) => `<th>#${i + 1} ${p.model} / ${p.system}</th>`).join("") + "</tr>" +
      keys.concat(["feasible"]).map((k) => `<tr><td>${k}</td>` + r.plans.map((p) => `<td class="num">${fmt(k === "feasible" ? p.feasible : p.headline[k], k)}</td>`).join("") + "</tr>").join("");
    if (window.Plotly) {
      const comps = [...new Set(r.plans.flatMap((p) => Object.keys(p.breakdown)))];
      const names = r.plans.map((p, i) => `#${i + 1}`);
      Plotly.react("chart-compare", comps.map((c) => ({type: "bar", name: c, x: names, y: r.plans.map((p) => p.breakdown[c] || 0)})),
        {barmode: "stack", margin: {t: 20, l: 60, r: 10, b: 40}, yaxis: {title: {text: "s"}}, legend: {font: {size: 10}}}, {displaylogo: false, responsive: true});
    }
  } catch (e) { showError(e.message, e.field); }
}

// ---- page switching and start-up
function show(p) {
  page = p;
  $$("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === p));
  $$("section.page").forEach((s) => s.classList.toggle("active", s.id === "page-" + p));
  writeURL();
  if (p === "whatif") loadKnobs();
}
function phaseVisibility() {
  const inf = $("#f-phase").value === "inference";
  $$(".inf-only").forEach((e) => (e.style.display = inf ? "" : "none"));
  $$(".train-only").forEach((e) => (e.style.display = inf ? "none" : ""));
  $$(".serve-only").forEach((e) => (e.style.display = $("#s-kind").value === "serve" ? "" : "none"));
}
function fill(sel, names, keepFirst) {
  const el = $(sel), first = keepFirst ? el.options[0].outerHTML : "";
  el.innerHTML = first + names.map((n) => `<option>${n}</option>`).join("");
}
async function start() {
  OPTIONS = await (await fetch("/api/options")).json();
  fill("#f-system", OPTIONS.systems); fill("#f-model", OPTIONS.models);
  fill("#f-precision", OPTIONS.precisions, true); fill("#f-runtime", OPTIONS.runtimes, true);
  for (const [k, vals] of Object.entries(OPTIONS.choices)) fill("#f-" + k, vals, true);
  $("#f-system").value = OPTIONS.defaults.system; $("#f-model").value = OPTIONS.defaults.model;
  $("#w-npts").textContent = OPTIONS.sweep_points;
  readURL(); phaseVisibility(); drawPlans();
  $$("nav a").forEach((a) => a.addEventListener("click", (ev) => { ev.preventDefault(); show(a.dataset.page); }));
  $("#run-predict").addEventListener("click", runPredict);
  $("#run-sens").addEventListener("click", runSensitivities);
  $("#sens-metric").addEventListener("change", drawSensitivities);
  $("#run-search").addEventListener("click", runSearch);
  $("#run-compare").addEventListener("click", runCompare);
  $("#add-plan").addEventListener("click", () => { if (plans.length < 4) plans.push(formValues()); drawPlans(); writeURL(); });
  $("#clear-plans").addEventListener("click", () => { plans = []; drawPlans(); writeURL(); });
  $("#w-metric").addEventListener("change", () => { drawWhatif(); writeURL(); });
  $("#s-kind").addEventListener("change", () => { phaseVisibility(); writeURL(); });
  $("#inputs").addEventListener("change", (ev) => {
    phaseVisibility(); writeURL();
    if (page === "whatif" && ["system", "nodes", "phase"].includes(ev.target.name)) loadKnobs();
    else if (page === "whatif") requestWhatif();
  });
  $("#f-upload").addEventListener("change", async (ev) => {
    const f = ev.target.files[0]; uploaded = null; $("#upload-name").textContent = "";
    if (!f) return;
    try { uploaded = JSON.parse(await f.text()); $("#upload-name").textContent = `using ${f.name} instead of the model list`; }
    catch (e) { showError(`model_config: ${f.name} is not valid JSON (${e.message})`, "model_config"); }
  });
  show(page);
  $("#status").textContent = "ready";
  document.body.dataset.ready = "1";
}
start();
