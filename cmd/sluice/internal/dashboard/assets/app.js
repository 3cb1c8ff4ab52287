// sluice live dashboard: polls api/state once a second and shows it. Every value is set
// with textContent or setAttribute; the only markup inserted is the charts' SVG, rendered
// and escaped by the server (package svgchart).
"use strict";

const POLL_MS = 1000;
// Rule charts share the width of the page in columns at least MIN_CHART px wide; each chart
// is asked from the server at its column's width (the memory chart at the section's), so
// the charts fill the page at their own size rather than scaled.
const MIN_CHART = 560, CHART_GAP = 12, CHART_BORDER = 2;
let ruleCount = 0;
const DECISIONS = ["allowed", "denied", "shadow_denied"];
const DELAY_COUNTERS = ["delayed", "delay_refused", "delay_abandoned"];
const CONCURRENCY_COUNTERS = ["acquired", "refused", "queued", "reclaimed"];
const COST_UNITS = ["reserved", "refunded", "excess"], COST_COUNTS = ["settled", "no_usage"];
const $ = (sel, root = document) => root.querySelector(sel);
const dash = (s) => s.replace(/_/g, "-");

function fmtRate(v) {
  if (v === null || v === undefined) return "–";
  if (v === 0) return "0";
  if (v < 0.01) return "<0.01";
  return v >= 100 ? v.toFixed(0) : v.toFixed(2).replace(/\.?0+$/, "");
}

function fmtCount(v) {
  if (v === null || v === undefined) return "–";
  return Math.round(v).toLocaleString("en-US");
}

function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}

function fmtMS(v) {
  if (v === null || v === undefined) return "–";
  return v >= 1000 ? (v / 1000).toFixed(2).replace(/\.?0+$/, "") + " s" : v.toFixed(v >= 10 ? 0 : 1) + " ms";
}

function fmtDuration(sec) {
  if (sec === null || sec === undefined) return "–";
  sec = Math.floor(sec);
  const d = Math.floor(sec / 86400), h = Math.floor(sec % 86400 / 3600), m = Math.floor(sec % 3600 / 60), s = sec % 60;
  if (d) return d + "d " + h + "h " + m + "m";
  if (h) return h + "h " + m + "m " + s + "s";
  if (m) return m + "m " + s + "s";
  return s + "s";
}

// cell sets the text and the raw value (data-value) of an element.
function cell(el, text, value) {
  if (!el) return;
  if (el.textContent !== text) el.textContent = text;
  const v = value === null || value === undefined ? "" : String(value);
  if (el.getAttribute("data-value") !== v) el.setAttribute("data-value", v);
}

// rows keeps one <tr> per key in tbody, in the given order, built by make(key).
function rows(tbody, attr, keys, make) {
  const existing = new Map();
  for (const tr of Array.from(tbody.rows)) existing.set(tr.getAttribute(attr), tr);
  keys.forEach((key, i) => {
    let tr = existing.get(key);
    if (!tr) { tr = make(key); tr.setAttribute(attr, key); }
    existing.delete(key);
    if (tbody.rows[i] !== tr) tbody.insertBefore(tr, tbody.rows[i] || null);
  });
  for (const tr of existing.values()) tr.remove();
}

function newRow(metrics) {
  const tr = document.createElement("tr");
  for (const [m, num] of metrics) {
    const td = document.createElement(m === "name" ? "th" : "td");
    td.setAttribute("data-metric", m);
    if (num) td.className = "num";
    tr.appendChild(td);
  }
  return tr;
}

const RULE_CELLS = [["name", false], ["mode", false], ["algorithm", false], ["limit", false],
  ["allowed-rate", true], ["denied-rate", true], ["shadow-denied-rate", true],
  ["allowed-total", true], ["denied-total", true], ["shadow-denied-total", true], ["store-errors-total", true]];

function renderRules(state) {
  const tbody = $("#rules tbody");
  const byName = new Map(state.rules.map((r) => [r.name, r]));
  rows(tbody, "data-rule", state.rules.map((r) => r.name), () => newRow(RULE_CELLS));
  for (const tr of Array.from(tbody.rows)) {
    const r = byName.get(tr.getAttribute("data-rule"));
    const c = (m) => tr.querySelector('[data-metric="' + m + '"]');
    cell(c("name"), r.name, r.name);
    if ((c("name").getAttribute("title") || "") !== (r.summary || "")) c("name").setAttribute("title", r.summary || "");
    cell(c("mode"), r.mode || "–", r.mode);
    cell(c("algorithm"), r.algorithm || "–", r.algorithm);
    const limit = r.limit === undefined ? "" : String(r.limit) + (r.window ? " / " + r.window : "") + (r.algorithm === "concurrency" ? " in flight" : "") + (r.burst !== undefined ? " (burst " + r.burst + ")" : "");
    cell(c("limit"), limit || "–", limit);
    for (const d of DECISIONS) cell(c(dash(d) + "-rate"), fmtRate(r.rates[d]), r.rates[d]);
    for (const d of DECISIONS.concat(["store_errors"])) cell(c(dash(d) + "-total"), fmtCount(r.totals[d]), r.totals[d]);
  }
  $("#no-rules").hidden = state.rules.length > 0;

  fillCharts($("#charts"), state.rules, (r) => r.chart);
  renderTopKeys(state);
  renderHeld(state);
  renderCost(state);
  renderInFlight(state);
}

// fillCharts keeps one div.chart per rule in container, in order, holding the given SVG.
function fillCharts(container, rules, svg) {
  const have = new Map(Array.from(container.children).map((el) => [el.getAttribute("data-rule"), el]));
  rules.forEach((r, i) => {
    let div = have.get(r.name);
    if (!div) {
      div = document.createElement("div");
      div.className = "chart";
      div.setAttribute("data-rule", r.name);
    }
    have.delete(r.name);
    if (container.children[i] !== div) container.insertBefore(div, container.children[i] || null);
    const s = svg(r);
    if (div._svg !== s) { div.innerHTML = s; div._svg = s; }
  });
  for (const el of have.values()) el.remove();
}

const HELD_CELLS = [["name", false], ["delay", false], ["held", true],
  ["delayed-rate", true], ["delay-refused-rate", true], ["delay-abandoned-rate", true], ["mean-delay", true],
  ["delayed-total", true], ["delay-refused-total", true], ["delay-abandoned-total", true]];

// renderHeld shows the rules with delay: what they hold now, their rates, the held chart.
function renderHeld(state) {
  const rules = state.rules.filter((r) => r.held_chart);
  $("#held-section").hidden = rules.length === 0;
  const tbody = $("#held tbody");
  const byName = new Map(rules.map((r) => [r.name, r]));
  rows(tbody, "data-rule", rules.map((r) => r.name), () => newRow(HELD_CELLS));
  for (const tr of Array.from(tbody.rows)) {
    const r = byName.get(tr.getAttribute("data-rule"));
    const c = (m) => tr.querySelector('[data-metric="' + m + '"]');
    cell(c("name"), r.name, r.name);
    const delay = r.delay ? "≤ " + r.delay + (r.max_held !== undefined ? " (max_held " + r.max_held + ")" : "") : "";
    cell(c("delay"), delay || "–", delay);
    cell(c("held"), fmtCount(r.held), r.held);
    cell(c("mean-delay"), fmtMS(r.mean_delay_ms), r.mean_delay_ms);
    for (const d of DELAY_COUNTERS) {
      cell(c(dash(d) + "-rate"), fmtRate(r.rates[d]), r.rates[d]);
      cell(c(dash(d) + "-total"), fmtCount(r.totals[d]), r.totals[d]);
    }
  }
  fillCharts($("#held-charts"), rules, (r) => r.held_chart);
}

const INFLIGHT_CELLS = [["name", false], ["limit", true], ["in-flight", true],
  ["acquired-rate", true], ["refused-rate", true], ["queued-rate", true],
  ["acquired-total", true], ["refused-total", true], ["queued-total", true], ["reclaimed-total", true]];

// renderInFlight shows the concurrency rules: their requests in flight now against the
// limit, their rates, the in-flight chart.
function renderInFlight(state) {
  const rules = state.rules.filter((r) => r.in_flight_chart);
  $("#inflight-section").hidden = rules.length === 0;
  const tbody = $("#inflight tbody");
  const byName = new Map(rules.map((r) => [r.name, r]));
  rows(tbody, "data-rule", rules.map((r) => r.name), () => newRow(INFLIGHT_CELLS));
  for (const tr of Array.from(tbody.rows)) {
    const r = byName.get(tr.getAttribute("data-rule"));
    const c = (m) => tr.querySelector('[data-metric="' + m + '"]');
    cell(c("name"), r.name, r.name);
    cell(c("limit"), r.limit === undefined ? "–" : String(r.limit), r.limit);
    cell(c("in-flight"), fmtCount(r.in_flight), r.in_flight);
    for (const d of CONCURRENCY_COUNTERS) {
      if (c(dash(d) + "-rate")) cell(c(dash(d) + "-rate"), fmtRate(r.rates[d]), r.rates[d]);
      cell(c(dash(d) + "-total"), fmtCount(r.totals[d]), r.totals[d]);
    }
  }
  fillCharts($("#inflight-charts"), rules, (r) => r.in_flight_chart);
}

const COST_CELLS = [["name", false], ["cost", false],
  ["reserved-rate", true], ["refunded-rate", true], ["excess-rate", true],
  ["reserved-total", true], ["refunded-total", true], ["excess-total", true], ["settled-total", true], ["no-usage-total", true]];

// renderCost shows the rules with cost: the cost units they reserve, refund and charge
// beyond the reservations, the requests settled, and the cost chart.
function renderCost(state) {
  const rules = state.rules.filter((r) => r.cost_chart);
  $("#cost-section").hidden = rules.length === 0;
  const tbody = $("#cost tbody");
  const byName = new Map(rules.map((r) => [r.name, r]));
  rows(tbody, "data-rule", rules.map((r) => r.name), () => newRow(COST_CELLS));
  for (const tr of Array.from(tbody.rows)) {
    const r = byName.get(tr.getAttribute("data-rule"));
    const c = (m) => tr.querySelector('[data-metric="' + m + '"]');
    cell(c("name"), r.name, r.name);
    cell(c("cost"), r.cost || "–", r.cost);
    for (const d of COST_UNITS) {
      cell(c(dash(d) + "-rate"), fmtRate(r.rates[d]), r.rates[d]);
      cell(c(dash(d) + "-total"), fmtCount(r.totals[d]), r.totals[d]);
    }
    for (const d of COST_COUNTS) cell(c(dash(d) + "-total"), fmtCount(r.totals[d]), r.totals[d]);
  }
  fillCharts($("#cost-charts"), rules, (r) => r.cost_chart);
}

// A rule's top-keys summaries, in the order of its table's column pairs (key, count).
const TOPKEYS = [["denied", "current"], ["denied", "last"], ["consumed", "current"], ["consumed", "last"]];

function headCell(text) {
  const th = document.createElement("th");
  th.textContent = text;
  return th;
}

// newTopKeys builds a rule's top-keys block: its name, and a table with a rank column and
// a column pair per summary, headed by the summary's period and error bound.
function newTopKeys() {
  const div = document.createElement("div");
  div.className = "topkeys";
  div.appendChild(document.createElement("h3"));
  const table = document.createElement("table");
  const head = table.createTHead().insertRow(), bound = table.tHead.insertRow();
  bound.className = "bound";
  head.appendChild(headCell("#"));
  bound.appendChild(headCell(""));
  for (const [kind, period] of TOPKEYS) {
    const h = headCell(kind + (period === "current" ? ", this period" : ", last period"));
    const b = headCell("–");
    for (const el of [h, b]) { el.colSpan = 2; el.setAttribute("data-kind", kind); el.setAttribute("data-period", period); }
    b.setAttribute("data-field", "bound");
    head.appendChild(h);
    bound.appendChild(b);
  }
  table.createTBody();
  div.appendChild(table);
  return div;
}

function newTopKeysRow() {
  const tr = document.createElement("tr");
  tr.appendChild(document.createElement("th"));
  for (const [kind, period] of TOPKEYS) {
    for (const field of ["key", "count"]) {
      const td = document.createElement("td");
      td.className = field === "key" ? "key" : "num";
      td.setAttribute("data-kind", kind);
      td.setAttribute("data-period", period);
      td.setAttribute("data-field", field);
      tr.appendChild(td);
    }
  }
  return tr;
}

// renderTopKeys shows, for each rule with top keys, the keys of its summaries side by side.
function renderTopKeys(state) {
  const rules = state.rules.filter((r) => r.top_keys && r.top_keys.length);
  $("#topkeys-section").hidden = rules.length === 0;
  const box = $("#topkeys");
  const have = new Map(Array.from(box.children).map((el) => [el.getAttribute("data-rule"), el]));
  rules.forEach((r, i) => {
    let div = have.get(r.name);
    if (!div) { div = newTopKeys(); div.setAttribute("data-rule", r.name); }
    have.delete(r.name);
    if (box.children[i] !== div) box.insertBefore(div, box.children[i] || null);
    cell($("h3", div), r.name, r.name);
    const byCol = new Map(r.top_keys.map((t) => [t.kind + "/" + t.period, t]));
    let n = 0;
    for (const [kind, period] of TOPKEYS) {
      const t = byCol.get(kind + "/" + period);
      const b = $('th[data-field="bound"][data-kind="' + kind + '"][data-period="' + period + '"]', div);
      const since = t ? new Date(t.since).toLocaleTimeString("en-GB") : "";
      cell(b, t ? "total " + fmtCount(t.total) + ", error ≤ " + fmtCount(t.error_bound) + ", since " + since : "none yet", t ? t.error_bound : null);
      if (t) n = Math.max(n, t.keys.length);
    }
    const tbody = div.querySelector("tbody");
    rows(tbody, "data-rank", Array.from({ length: n }, (_, k) => String(k + 1)), newTopKeysRow);
    for (const tr of Array.from(tbody.rows)) {
      const rank = Number(tr.getAttribute("data-rank"));
      cell(tr.cells[0], String(rank), rank);
      for (const [kind, period] of TOPKEYS) {
        const t = byCol.get(kind + "/" + period), k = t && t.keys[rank - 1];
        const q = (f) => tr.querySelector('[data-kind="' + kind + '"][data-period="' + period + '"][data-field="' + f + '"]');
        cell(q("key"), k ? k.key : "", k ? k.key : null);
        cell(q("count"), k ? fmtCount(k.count) + (k.err ? " ±" + fmtCount(k.err) : "") : "", k ? k.count : null);
      }
    }
  });
  for (const el of have.values()) el.remove();
}

const WORKER_CELLS = [["name", false], ["healthy", false], ["memory-bytes", true], ["vm-restarts", true], ["requests", true], ["failed-requests", true]];

function renderHost(state) {
  const h = state.host;
  const dd = (m) => $('#host [data-metric="' + m + '"]');
  if (!h) return;
  cell(dd("uptime"), fmtDuration(h.uptime_seconds), h.uptime_seconds);
  cell(dd("workers"), String(h.workers.length) + (h.workers.every((w) => w.healthy) ? " (all healthy)" : " (" + h.workers.filter((w) => !w.healthy).length + " unhealthy)"), h.workers.length);
  cell(dd("vm-restarts"), fmtCount(h.vm_restarts), h.vm_restarts);
  cell(dd("requests"), fmtCount(h.requests), h.requests);
  cell(dd("request-rate"), fmtRate(h.request_rate), h.request_rate);
  cell(dd("failed-requests"), fmtCount(h.failed_requests), h.failed_requests);
  cell(dd("filter-errors"), fmtCount(state.filter_errors), state.filter_errors);
  cell(dd("memory-limit"), fmtBytes(h.memory_limit_bytes), h.memory_limit_bytes);
  cell(dd("shared-data-keys"), fmtCount(h.shared_data_keys), h.shared_data_keys);
  cell(dd("shared-data-bytes"), fmtBytes(h.shared_data_bytes), h.shared_data_bytes);
  cell(dd("abi-version"), h.abi_version || "–", h.abi_version);
  cell(dd("vm-id"), h.vm_id || "–", h.vm_id);

  const tbody = $("#workers tbody");
  const byID = new Map(h.workers.map((w) => [String(w.id), w]));
  rows(tbody, "data-worker", h.workers.map((w) => String(w.id)), () => newRow(WORKER_CELLS));
  for (const tr of Array.from(tbody.rows)) {
    const w = byID.get(tr.getAttribute("data-worker"));
    const c = (m) => tr.querySelector('[data-metric="' + m + '"]');
    cell(c("name"), "worker " + w.id, w.id);
    cell(c("healthy"), w.healthy ? "healthy" : "no VM", w.healthy);
    cell(c("memory-bytes"), fmtBytes(w.memory_bytes), w.memory_bytes);
    cell(c("vm-restarts"), fmtCount(w.vm_restarts), w.vm_restarts);
    cell(c("requests"), fmtCount(w.requests), w.requests);
    cell(c("failed-requests"), fmtCount(w.failed_requests), w.failed_requests);
  }
  const mc = $("#memory-chart");
  if (mc._svg !== state.memory_chart) { mc.innerHTML = state.memory_chart || ""; mc._svg = state.memory_chart; }
}

function renderConfig(state) {
  const pre = $("#config");
  if (pre.textContent !== state.config.pretty) pre.textContent = state.config.pretty;
  const err = $("#config-error");
  err.hidden = !state.config.error;
  err.textContent = state.config.error || "";
}

function setStatus(kind, text) {
  const s = $("#status");
  s.setAttribute("data-state", kind);
  $("#status-text").textContent = text;
}

function render(state) {
  $("#rate-window").textContent = state.rate_window_seconds + " s";
  for (const el of document.querySelectorAll(".rate-window")) el.textContent = state.rate_window_seconds + " s";
  renderRules(state);
  renderHost(state);
  renderConfig(state);
  const problems = (state.error ? [state.error] : []).concat(state.problems || []);
  const ul = $("#problems");
  ul.replaceChildren(...problems.map((p) => { const li = document.createElement("li"); li.textContent = p; return li; }));
  $("#problems-section").hidden = problems.length === 0;
  $("#samples").textContent = state.samples + " samples kept; updated " + new Date(state.time).toLocaleTimeString("en-GB") + ".";
  document.body.setAttribute("data-updated", state.time);
  if (state.live) setStatus("live", "live — updated every " + state.interval_seconds + " s");
  else setStatus("stale", state.error || "stale");
}

// chartLayout sets the rule charts' columns for n rules and returns the widths to ask for.
function chartLayout(n) {
  const charts = $("#charts"), mem = $("#memory-chart");
  const avail = charts.clientWidth;
  const cols = Math.max(1, Math.min(n || 1, Math.floor((avail + CHART_GAP) / (MIN_CHART + CHART_GAP))));
  for (const el of [charts, $("#held-charts"), $("#cost-charts"), $("#inflight-charts")]) {
    if (el.style.getPropertyValue("--cols") !== String(cols)) el.style.setProperty("--cols", String(cols));
  }
  const col = Math.floor((avail - (cols - 1) * CHART_GAP) / cols);
  return { rule: Math.max(0, col - CHART_BORDER), memory: Math.max(0, mem.clientWidth - CHART_BORDER) };
}

async function poll() {
  try {
    const w = chartLayout(ruleCount);
    const resp = await fetch("api/state?chart_width=" + w.rule + "&memory_width=" + w.memory, { cache: "no-store" });
    if (!resp.ok) throw new Error("api/state answered " + resp.status);
    const state = await resp.json();
    ruleCount = state.rules.length;
    chartLayout(ruleCount);
    render(state);
  } catch (e) {
    setStatus("error", "disconnected (" + e.message + "); retrying");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
