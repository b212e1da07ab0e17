// The regen dashboard: read-only views over the job's store. Every value
// from the server is set with textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c === undefined || c === null ? "" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw new Error((await r.text()) || r.statusText);
  return r.json();
}

// The status document (schema v1, docs/status-json.md) gives every
// duration in *_seconds too; a duration that does not exist is null.
function fmtSecs(secs) {
  if (secs === null || secs === undefined || secs < 0) return "-";
  let s = Math.round(secs);
  if (s < 1) return "<1s";
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return (h ? h + "h" : "") + (h || m ? m + "m" : "") + s + "s";
}

// Every time on the page is UTC on a 24-hour clock, as the terminal views
// print them; the headings and labels say "UTC". An unknown time is null
// in every document regen serves.
function fmtTime(t) {
  return t ? new Date(t).toISOString().slice(11, 19) : "";
}

// fmtDateTime is a time with its date: "2026-12-06 00:43:04 UTC".
function fmtDateTime(t) {
  return t ? new Date(t).toISOString().slice(0, 19).replace("T", " ") + " UTC" : "";
}

function eventLine(e) {
  const head = [e.kind, e.subject, e.state].filter((p) => p).join(" ");
  return `${fmtTime(e.time)} ${head}${e.evidence ? ": " + e.evidence : ""}`;
}

function fmtNum(x, digits) {
  return Number(x || 0).toFixed(digits);
}

// fmtBytes is a byte count in decimal units, as regen status writes it.
function fmtBytes(b) {
  const units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
  let v = b || 0, i = 0;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (i > 0 && v < 10 ? v.toFixed(1) : v.toFixed(0)) + " " + units[i];
}

// applyCapture shows the hidden-state capture's progress; the section is
// hidden for a job without a capture section (capture is null).
function applyCapture(cap) {
  $("capture").hidden = !cap;
  if (!cap) return;
  for (const k of ["captured", "dead", "in_flight", "pending"]) $("capture-" + k).textContent = (cap[k] || 0).toLocaleString("en-US");
  $("capture-total").textContent = cap.total === null ? "not counted yet" : cap.total.toLocaleString("en-US");
  $("capture-bytes").textContent = fmtBytes(cap.bytes);
}

function sampleLink(id) {
  const a = el("a", id);
  a.href = "#samples/" + id.split("/").map(encodeURIComponent).join("/");
  return a;
}

// samplesHash is the address of the samples page with filters f: every
// filter is a query parameter, so a filtered view is a link.
function samplesHash(f) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(f)) if (v !== "" && v !== undefined && v !== null && v !== false) q.set(k, v);
  const s = q.toString();
  return "#samples" + (s ? "?" + s : "");
}

// countLink is a cell's count of rejected or dead samples, a link to them.
function countLink(n, state, c) {
  if (!n) return n;
  const a = el("a", n, "count-" + state);
  a.href = samplesHash({ state, partition: c.partition, lane: c.lane });
  return a;
}

// ---- status (live) ----

// The values each class of filter select offers, kept while they do not change.
const filterValues = {};

function setOptions(cls, values) {
  if ((filterValues[cls] || []).join() === values.join()) return;
  filterValues[cls] = values;
  for (const sel of document.querySelectorAll("select." + cls)) {
    const keep = sel.value;
    // A value the address asked for stays offered until the status lists it.
    const all = keep && !values.includes(keep) ? [...values, keep] : values;
    sel.replaceChildren(el("option", sel.options[0].textContent), ...all.map((v) => el("option", v)));
    sel.options[0].value = "";
    sel.value = keep;
  }
}

// setSelect shows value in a select, adding it as an option if needed.
function setSelect(sel, value) {
  if (value && ![...sel.options].some((o) => o.value === value)) sel.append(el("option", value));
  sel.value = value || "";
}

function applyStatus(doc) {
  if (doc.error) { $("updated").textContent = "store read failed: " + doc.error; return; }
  $("job").textContent = doc.job;
  document.title = "regen " + doc.job + " " + doc.state;
  const st = $("state");
  st.textContent = doc.state;
  st.className = "state " + doc.state;
  $("updated").textContent = "updated " + fmtTime(Date.now()) + " UTC";
  $("gone-banner").hidden = true;
  fill($("evidence"), (doc.evidence || []).map((e) => el("li", e)));
  $("evidence").className = "evidence " + doc.state;
  const hb = doc.heartbeat;
  $("runner").textContent = hb
    ? `runner pid ${hb.pid} on ${hb.host}, last heartbeat ${fmtSecs(Math.max(0, hb.age_seconds))} ago` +
      (hb.started ? `, started ${fmtDateTime(hb.started)}` : "") + (doc.runner_exited ? " (exited)" : doc.runner_died ? " (died)" : "")
    : "runner: never started";
  const gone = goneRunner(doc);
  const t = doc.total || {};
  for (const k of ["total", "done", "pending", "in_flight", "rejected", "dead"]) $("total-" + k).textContent = t[k] || 0;
  $("total-in_flight").textContent = leased(t.in_flight || 0, gone);
  $("stranded").textContent = gone && t.in_flight
    ? `(${t.in_flight}): leased by the runner that ${gone} at ${fmtTime(doc.heartbeat.time)}, not in flight; they go back to pending when the job runs again`
    : "";
  $("ingest-errors").textContent = doc.ingest_errors || 0;
  applyCapture(doc.capture);
  setRate($("rate-tokens"), doc, gone, (r) => fmtNum(r && r.tokens_per_sec, 1));
  setRate($("rate-samples"), doc, gone, (r) => fmtNum(r && r.samples_per_sec, 2));
  // With no live runner, or an idle one, the tile is "0 now" and names the
  // past rate's window itself.
  const win = gone || earlierRun(doc) ? "now" : windowLabel(doc.rate_1m);
  for (const k of ["tokens", "samples"]) $("rate-" + k + "-label").textContent = (k === "tokens" ? "tok/s" : "samples/s") + ` (${win})`;
  lastStatus = doc;
  showChartNote();
  // Rejected samples per quality rule, most first, each a link to them.
  const rj = doc.rejects || [];
  $("rejects").replaceChildren(...(rj.length ? ["rejected by rule: "] : []), ...rj.flatMap((r, i) => {
    const a = el("a", `${r.rule} ${r.n}`, "count-rejected");
    a.href = samplesHash({ state: "rejected", rule: r.rule });
    return i ? [", ", a] : [a];
  }));
  // No ETA while nothing can progress: the report says why instead.
  const eta = $("eta");
  eta.textContent = doc.eta_seconds !== null ? fmtSecs(doc.eta_seconds) : doc.eta_note || "-";
  eta.classList.toggle("note", doc.eta_seconds === null);

  const cells = doc.cells || [];
  fill($("cells").tBodies[0], cells.map((c) => {
    // One segment per outcome, each in its own colour: a lane of rejects
    // is an orange bar, not a blue one.
    const bar = el("span", null, "bar");
    for (const k of ["done", "rejected", "dead"]) {
      const seg = el("span", null, k);
      seg.style.width = (c.total ? (100 * c[k]) / c.total : 0).toFixed(1) + "%";
      seg.title = `${c[k]} ${k}`;
      bar.appendChild(seg);
    }
    const r = row([c.partition, c.lane, bar, c.done, c.total, c.pending, leased(c.in_flight, gone),
      countLink(c.rejected, "rejected", c), countLink(c.dead, "dead", c)]);
    r.dataset.cell = c.partition + "/" + c.lane;
    return r;
  }));
  setOptions("partitions", [...new Set(cells.map((c) => c.partition))]);
  setOptions("lanes", [...new Set(cells.map((c) => c.lane))].sort());
  setOptions("rules", (doc.rejects || []).map((r) => r.rule).sort());
  setOptions("generations", (doc.generations || []).map((g) => String(g.generation)));

  showEndpoints(doc, gone);
  // Workers sharing the job (a PostgreSQL store); hidden for one runner.
  const ws = doc.workers || [];
  $("workers-box").hidden = ws.length < 2;
  $("workers-title").textContent = `Workers: ${ws.filter((w) => w.live).length} live of ${ws.length}`;
  fill($("workers").tBodies[0], ws.map((w) => row([w.host, w.pid, el("span", w.state, "state " + w.state),
    fmtSecs(Math.max(0, w.heartbeat_age_seconds)) + " ago", w.done, fmtNum(w.samples_per_sec, 2), w.in_flight,
    (w.lanes || []).length ? w.lanes.join(", ") : "all",
    (w.endpoints || []).map((e) => `${e.url} ${e.state}` + (e.cause ? ` (${e.cause})` : "")).join("; "),
    (w.evidence || []).join("; ")])));
  fill($("last-events"), (doc.events || []).map((e) => el("li", eventLine(e))));
  fill($("last-errors"), (doc.last_errors || []).map((e) => {
    const li = el("li");
    li.append(sampleLink(e.id), ` [${e.state}] ${e.reason}`);
    return li;
  }));
  document.body.dataset.statusAt = String(Date.now());
}

// goneRunner is "died" or "exited" when no runner is live and the last
// one's endpoints and rates are as of its last heartbeat
// (docs/status-json.md), "" while one is live.
function goneRunner(doc) {
  if (!doc.heartbeat) return "";
  return doc.runner_died ? "died" : doc.runner_exited ? "exited" : "";
}

// leased is an in-flight count: with no live runner it is in parentheses,
// leases of the gone runner that nothing answers now (#stranded says so).
function leased(n, gone) {
  return gone && n > 0 ? `(${n})` : n;
}

// fmtWindow is a rate's window, short: 1m, 10m, 45s, 2m30s.
function fmtWindow(secs) {
  return fmtSecs(secs).replace(/([hm])0s$/, "$1").replace(/h0m$/, "h");
}

// windowLabel names the "now" rate's window: 1m, or "its first 12s" for a
// run younger than a minute (never a minute's rate made of 3 s).
function windowLabel(rate) {
  const w = rate && rate.window_seconds;
  return !w || w >= 60 ? "1m" : "its first " + fmtWindow(w);
}

// earlierRun names the run the rates and charts are over when the newest
// one did no work (docs/status-json.md rates_run), "" otherwise.
function earlierRun(doc) {
  const rr = doc.rates_run;
  if (!rr || !rr.earlier) return "";
  return `the last run that did work, pid ${(rr.pids || []).join(", ")}, ${fmtTime(rr.started)} to ${fmtTime(rr.ended)} UTC`;
}

// setRate shows a rate "now": with no live runner, or when the newest run
// did nothing, that is 0, and the rate of the last minute of the run that
// worked is said to be the past, and whose.
function setRate(box, doc, gone, fmt) {
  const rate = doc.rate_1m;
  const earlier = earlierRun(doc);
  box.classList.toggle("note", !!gone || !!earlier);
  if (!gone && !earlier) { box.textContent = fmt(rate); return; }
  const idle = doc.rates_run && doc.rates_run.idle_pid;
  box.textContent = earlier ? `0 now (the newest run, pid ${idle}, sent nothing)` : `0 now (the runner ${gone})`;
  if (rate && rate.window_seconds > 0) {
    box.append(el("div", `${fmt(rate)} in ${earlier ? earlier.replace("the last run that did work", "the last working run's") + ", its" : "its"} last ${fmtWindow(rate.window_seconds)}`, "past"));
  }
}

// showChartNote says whose run the charts show when it is not the newest.
function showChartNote() {
  const earlier = lastStatus && $("window").value === "job" ? earlierRun(lastStatus) : "";
  $("chart-note").textContent = earlier ? `The newest run (pid ${lastStatus.rates_run.idle_pid}) sent nothing: the charts show ${earlier}.` : "";
}

// showEndpoints fills the endpoints table; with no live runner it is
// titled and greyed as of its last heartbeat: nothing is sent to them now.
function showEndpoints(doc, gone) {
  const title = $("endpoints-title");
  title.textContent = "Endpoints";
  if (gone) {
    title.textContent += ` when the runner ${gone} at ${fmtTime(doc.heartbeat.time)}`;
    title.append(el("span", " (its last heartbeat; nothing is sent to them now)", "muted"));
  }
  $("endpoints").classList.toggle("gone", !!gone);
  fill($("endpoints").tBodies[0], (doc.endpoints || []).map((e) => {
    const l = e.load;
    // A figure the engine does not report is null, and so is a stale load.
    const g = (v, pct) => (v === null || v === undefined ? "-" : pct ? (100 * v).toFixed(1) + "%" : fmtNum(v, 0));
    const s = el("span", e.state, "state " + e.state);
    const pool = e.kv_tokens ? `${fmtNum(e.kv_tokens, 0)} (${e.kv_tokens_source})` : "-";
    // A reading older than its probe interval says its age: the figures
    // are the server as it was then.
    const aged = (v) => {
      if (!l || !l.stale) return v;
      const c = el("span", v, "stale");
      c.append(el("span", ` (read ${fmtSecs(l.age_seconds)} ago)`, "age"));
      return c;
    };
    const inFlight = gone ? `${e.in_flight} when it ${gone}` : e.in_flight;
    return row([e.url, s, fmtTime(e.since), inFlight, e.limit || "-", aged(g(l && l.kv_usage, true)), aged(g(l && l.queued)), aged(g(l && l.running)),
      pool, e.restarts || 0, [e.cause, ...(e.evidence || []), holdText(e.hold), e.replays ? `${e.replays} keep-alive replays` : ""].filter(Boolean).join("; "),
      e.limit_reason || ""]);
  }));
}

// The last status shown, and who serves the page (/api/server): a page
// served by `regen run` ends with that run.
let lastStatus = null;
let server = { served_by: "" };

// holdText is a server's backpressure hold as status prints it (UTC).
function holdText(h) {
  if (!h) return "";
  const cap = h.fixed_cap ? `; fixed lanes capped at ${h.fixed_cap} requests, one more per answer` : "";
  return h.until ? `held by the server since ${fmtTime(h.since)} until ${fmtTime(h.until)} UTC: ${h.reason}${cap}`
    : `after the server's backpressure at ${fmtTime(h.since)} UTC (${h.reason})${cap}`;
}

function startStream() {
  getJSON("/api/server").then((s) => { server = s; }).catch(() => {});
  const es = new EventSource("/api/stream");
  es.addEventListener("status", (ev) => applyStatus(JSON.parse(ev.data)));
  es.onerror = connectionLost;
}

// connectionLost: the state is no longer known (a grey UNKNOWN, never the
// last state's green); a page served by `regen run` says that run ended
// and how to keep a dashboard that outlives runs.
function connectionLost() {
  $("updated").textContent = "connection lost at " + fmtTime(Date.now()) + " UTC; retrying";
  const st = $("state");
  st.textContent = "UNKNOWN";
  st.className = "state UNKNOWN";
  st.title = lastStatus ? `last known: ${lastStatus.state}` : "";
  if (lastStatus) document.title = "regen " + lastStatus.job + " UNKNOWN";
  const b = $("gone-banner");
  if (server.served_by !== "run") {
    b.hidden = true;
    return;
  }
  b.hidden = false;
  b.textContent = `This page was served by regen run (pid ${server.pid}), which has exited or cannot be reached: ` +
    "the figures below are the last it sent and do not change. For a dashboard that outlives runs, serve it with " +
    `regen watch ${server.job_file || "job.yaml"} --web ${location.host} and reload this page.`;
}

// ---- charts ----

const charts = {};

// chart draws data in box id; key is what else shapes the chart (the
// bucket its axis ticks on): a new key builds it anew.
function chart(id, opts, data, key) {
  const box = $(id);
  const width = Math.max(300, box.clientWidth - 12);
  if (charts[id] && charts[id].series.length === opts.series.length && charts[id].regenKey === key) {
    charts[id].setData(data);
    return;
  }
  if (charts[id]) charts[id].destroy();
  opts.width = width;
  opts.height = 220;
  charts[id] = new uPlot(opts, data, box);
  charts[id].regenKey = key;
}

const palette = ["#2f7bd9", "#e0742b", "#1f8a4c", "#9b4dca", "#c9302c", "#5b6477"];

// timeAxis is the x axis of a chart of buckets of b seconds: ticks on
// whole multiples of the bucket (never between two buckets), labelled in
// UTC on a 24-hour clock, with the date once buckets are hours.
function timeAxis(b) {
  const incrs = [1, 2, 3, 6, 12, 24, 60, 120, 360, 720, 1440, 2880].map((k) => k * b);
  const label = (v) => {
    const iso = new Date(v * 1000).toISOString();
    return b >= 3600 ? iso.slice(5, 10) + " " + iso.slice(11, 16) : b >= 60 ? iso.slice(11, 16) : iso.slice(11, 19);
  };
  return { label: "time (UTC)", incrs, space: 70, values: (u, splits) => splits.map(label) };
}

// timeSeries is the x series: its legend value in UTC too.
function timeSeries() {
  return { label: "time (UTC)", value: (u, v) => (v === null || v === undefined ? "" : new Date(v * 1000).toISOString().slice(11, 19)) };
}

async function loadHistory() {
  const h = await getJSON("/api/history?window=" + $("window").value);
  showChartNote();
  const xAxis = timeAxis(h.bucket_seconds || 5);
  chart("chart-throughput", {
    series: [timeSeries(), { label: "tokens/s", stroke: palette[0], width: 2, scale: "tok" },
      { label: "requests/s", stroke: palette[1], width: 2, scale: "req" },
      { label: "samples/s", stroke: palette[2], width: 2, scale: "req" }],
    axes: [xAxis, { scale: "tok", label: "tokens/s" }, { scale: "req", side: 1, label: "per s", grid: { show: false } }],
  }, [h.times, h.tokens_per_sec, h.requests_per_sec, h.samples_per_sec], h.bucket_seconds);
  const series = [timeSeries()];
  const data = [h.times];
  (h.endpoints || []).forEach((e, i) => {
    series.push({ label: "KV usage % " + e.url, stroke: palette[i % palette.length], width: 2, scale: "%" });
    data.push(e.kv_usage.map((v) => (v === null ? null : 100 * v)));
    series.push({ label: "queued " + e.url, stroke: palette[i % palette.length], dash: [6, 4], width: 1, scale: "n" });
    data.push(e.queued);
    series.push({ label: "in flight " + e.url, stroke: palette[(i + 3) % palette.length], width: 1, scale: "n" });
    data.push(e.in_flight);
  });
  if (series.length === 1) {
    series.push({ label: "no endpoint history yet", stroke: palette[5], scale: "%" });
    data.push(h.times.map(() => null));
  }
  chart("chart-load", {
    series,
    scales: { "%": { range: [0, 100] } },
    axes: [xAxis, { scale: "%", label: "KV usage %" }, { scale: "n", side: 1, label: "requests", grid: { show: false } }],
  }, data, h.bucket_seconds);
  document.body.dataset.historyAt = String(Date.now());
}

// ---- events ----

async function loadEvents() {
  const evs = await getJSON("/api/events?limit=500");
  const kind = $("event-kind").value;
  const kinds = [...new Set(evs.map((e) => e.kind))].sort();
  $("event-kind").replaceChildren(el("option", "all kinds"), ...kinds.map((k) => el("option", k)));
  $("event-kind").options[0].value = "";
  $("event-kind").value = kind;
  fill($("events").tBodies[0], evs.filter((e) => !kind || e.kind === kind)
    .map((e) => row([fmtDateTime(e.time), e.kind, e.subject, e.state, e.evidence])));
}

// ---- paged sample listings ----

function pager(name, query, render) {
  const stack = [""];
  async function show() {
    const q = new URLSearchParams(query());
    q.set("after", stack[stack.length - 1]);
    q.set("limit", "50");
    const page = await getJSON("/api/samples?" + q);
    fill($(name).tBodies[0], page.rows.map(render));
    $(name + "-next").disabled = !page.next;
    $(name + "-next").dataset.next = page.next || "";
    $(name + "-first").disabled = stack.length === 1;
  }
  $(name + "-next").onclick = () => { stack.push($(name + "-next").dataset.next); show(); };
  $(name + "-first").onclick = () => { stack.length = 1; show(); };
  return { show, reset: () => { stack.length = 1; return show(); } };
}

const failed = pager("failed", () => ({ state: $("failed-state").value, partition: $("failed-partition").value }),
  (r) => row([sampleLink(r.id), r.partition, r.lane, r.attempts, r.rule || "", r.reason, r.origin]));

// The samples page's filters, as query parameters.
const sampleFilters = ["state", "partition", "lane", "rule", "generation"];

function sampleQuery() {
  const q = {};
  for (const k of sampleFilters) q[k] = $("samples-" + k).value;
  if ($("samples-ended").checked) q.ended = "true";
  return q;
}

// applySampleQuery sets the filters from the address's query.
function applySampleQuery(params) {
  for (const k of sampleFilters) setSelect($("samples-" + k), params.get(k) || "");
  $("samples-ended").checked = params.get("ended") === "true";
}

const sampleList = pager("samples", sampleQuery, (r) => {
  const why = r.rule ? `${r.rule}: ${r.reason}` : r.end_reason ? "ended early: " + r.end_reason : r.reason || "";
  return row([sampleLink(r.id), r.partition, r.lane, r.state, r.attempts, r.completion_tokens || "", r.endpoint || "", fmtTime(r.finished_at), why]);
});

async function loadBadRows() {
  const b = await getJSON("/api/ingest-errors");
  $("bad-count").textContent = b.count;
  fill($("bad-rows").tBodies[0], b.first.map((e) => row([e.partition, e.origin, e.field, e.reason])));
}

// ---- one sample ----

function text(v) {
  if (v === undefined || v === null || v === "") return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, 2);
}

async function showSample(id) {
  $("sample-error").textContent = "";
  $("lookup-id").value = id;
  let s;
  try {
    s = await getJSON("/api/samples/" + id.split("/").map(encodeURIComponent).join("/"));
  } catch (e) {
    $("sample").hidden = true;
    $("sample-error").textContent = e.message;
    return;
  }
  $("sample").hidden = false;
  $("sample-id").textContent = s.id;
  const rv = s.review;
  if (!rv) {
    $("sample-error").textContent = "this sample cannot be shown turn by turn: " + (s.review_error || "no review");
    $("sample-turns").replaceChildren();
    $("sample-fate").hidden = true;
    return;
  }
  const answered = rv.turns.filter((t) => t.answer).length;
  const meta = [["state", rv.state], ["partition", rv.partition], ["lane", rv.lane], ["attempts", rv.attempts], ["origin", rv.origin],
    ["turns", `${answered} answered of ${rv.planned_turns} planned`],
    ["finished", fmtDateTime(rv.finished_at)]];
  if (!rv.originals_kept) meta.push(["dataset's answers", "not kept (ingested before regen kept them, or the row has none)"]);
  fill($("sample-meta"), meta.filter((m) => m[1] !== undefined && m[1] !== "").map((m) => row(m)));
  // Why the conversation stopped where it did.
  const fate = $("sample-fate");
  fate.hidden = false;
  if (rv.rule) { fate.textContent = `Rejected by rule ${rv.rule}: ${rv.evidence}`; fate.className = "fate rejected"; }
  else if (rv.ended_early) { fate.textContent = "Ended early: " + rv.ended_early; fate.className = "fate ended"; }
  else if (rv.state === "dead") { fate.textContent = "Dead letter: " + rv.error; fate.className = "fate dead"; }
  else if (rv.error) { fate.textContent = "Last error: " + rv.error; fate.className = "fate"; }
  else fate.hidden = true;
  $("sample-tools-box").hidden = !rv.tools;
  $("sample-tools").textContent = text(rv.tools);
  $("sample-turns").replaceChildren(...rv.turns.map((t) => turnBox(t, rv.planned_turns)));
  document.body.dataset.sampleShown = s.id;
}

// message renders one chat message: its role (and the call it answers),
// reasoning, text and tool calls, all as text.
function message(m) {
  const d = el("div", null, "msg");
  d.dataset.role = m.role;
  d.append(el("span", m.role + (m.tool_call_id ? " → " + m.tool_call_id : ""), "role"));
  if (m.reasoning_content) d.append(el("div", m.reasoning_content, "reasoning"));
  d.append(text(m.content));
  if (Array.isArray(m.tool_calls)) {
    for (const c of m.tool_calls) {
      const f = c.function || {};
      d.append(el("div", `tool call: ${f.name}(${typeof f.arguments === "string" ? f.arguments : text(f.arguments)})` + (c.id ? " " + c.id : ""), "call"));
    }
  } else if (m.tool_calls) d.append(el("div", "tool calls: " + text(m.tool_calls), "call"));
  return d;
}

// turnBox is one turn: the dataset's input, then the dataset's answer
// beside the regenerated one.
function turnBox(t, planned) {
  const box = el("section", null, "turn" + (t.answer ? "" : " not-reached"));
  box.dataset.turn = t.turn;
  box.append(el("h3", `Turn ${t.turn + 1} of ${planned}`));
  const input = el("div", null, "messages input");
  input.append(...(t.input || []).map(message));
  const orig = el("div", null, "side original");
  orig.append(el("h4", "Dataset's answer"));
  const om = el("div", null, "messages");
  om.append(...(t.original || []).map(message));
  if (!t.original) om.append(el("p", "(not kept)", "muted"));
  orig.append(om);
  const regen = el("div", null, "side regenerated");
  const a = t.answer;
  if (!a) {
    regen.append(el("h4", "Regenerated"), el("p", "(not reached)", "muted"));
  } else {
    if (a.rejected) regen.classList.add("rejected");
    regen.append(el("h4", a.rejected ? "Regenerated (rejected)" : "Regenerated"));
    const u = a.usage || {};
    regen.append(el("div", `lane ${a.lane} · attempts ${a.attempts} · finish ${a.finish_reason} · ` +
      `${u.prompt_tokens || 0} prompt + ${u.completion_tokens || 0} completion tokens` + (u.reasoning_tokens ? ` (${u.reasoning_tokens} reasoning)` : "") +
      ` · ${a.duration_ms} ms, first token ${a.ttft_ms} ms` + (a.endpoint ? " · " + a.endpoint : ""), "answer-meta"));
    const m = el("div", null, "messages");
    m.append(message({ role: "assistant", content: a.content, reasoning_content: a.reasoning_content, tool_calls: a.tool_calls }));
    regen.append(m);
  }
  const cmp = el("div", null, "compare");
  cmp.append(orig, regen);
  box.append(input, cmp);
  return box;
}

// ---- routing ----

function route() {
  const full = location.hash.slice(1) || "overview";
  const qi = full.indexOf("?");
  const hash = qi < 0 ? full : full.slice(0, qi);
  const [page, ...rest] = hash.split("/");
  if (page === "samples" && !rest.length) applySampleQuery(new URLSearchParams(qi < 0 ? "" : full.slice(qi + 1)));
  for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== "page-" + page;
  for (const a of document.querySelectorAll("nav a[data-page]")) a.classList.toggle("active", a.dataset.page === page);
  if (page === "overview") loadHistory().catch(showError);
  if (page === "events") loadEvents().catch(showError);
  if (page === "failed") { failed.reset().catch(showError); loadBadRows().catch(showError); }
  if (page === "samples") {
    sampleList.reset().catch(showError);
    if (rest.length) showSample(rest.map(decodeURIComponent).join("/"));
  }
}

function showError(e) { $("updated").textContent = "error: " + e.message; }

$("lookup").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const id = $("lookup-id").value.trim();
  if (id) location.hash = "samples/" + id.split("/").map(encodeURIComponent).join("/");
});
$("window").onchange = () => { showChartNote(); loadHistory().catch(showError); };
$("event-kind").onchange = () => loadEvents().catch(showError);
$("failed-state").onchange = $("failed-partition").onchange = () => failed.reset().catch(showError);
// A filter change updates the address (so it can be shared or reloaded)
// without a new history entry, then lists again.
for (const f of [...sampleFilters.map((k) => "samples-" + k), "samples-ended"]) {
  $(f).onchange = () => {
    history.replaceState(null, "", samplesHash(sampleQuery()));
    sampleList.reset().catch(showError);
  };
}
window.addEventListener("hashchange", route);
window.addEventListener("resize", () => { for (const k in charts) charts[k].setSize({ width: Math.max(300, $(k).clientWidth - 12), height: 220 }); });

startStream();
route();
setInterval(() => { if (!$("page-overview").hidden) loadHistory().catch(showError); }, 15000);
