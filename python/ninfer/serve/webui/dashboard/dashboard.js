// ninfer dashboard: polls /dashboard/state once a second and renders it. Tokens/s is the change in the engine's
// tokens_generated counter over the last RATE_WINDOW_S of polls (restarted when the resident model changes). When a
// poll fails the page says since when it is disconnected and greys the figures it shows: they are not current.
"use strict";

const POLL_MS = 1000;
const RATE_WINDOW_S = 10;
let samples = [];  // {time, resident, tokens} of the polls within the rate window
let disconnectedSince = null;

// The chat UI at / (same origin) keeps its settings, the API key among them, in localStorage under this name; the
// dashboard sends the same key so it works on a server started with --api-key-file without asking again.
const LLAMA_UI_CONFIG = "LlamaUi.config";

function authHeaders() {
  try {
    const key = String(JSON.parse(localStorage.getItem(LLAMA_UI_CONFIG) || "{}").apiKey || "").trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  } catch {
    return {};
  }
}

function fmtBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log2(n) / 10));
  return `${(n / 2 ** (10 * i)).toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 90) return `${s.toFixed(0)} s`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

function modelState(m) {
  if (m.failure) return `${m.status}: ${m.failure}`;
  if (m.waiting) return m.waiting;
  if (m.load_progress !== null && m.load_progress !== undefined) return `loading ${Math.round(100 * m.load_progress)}%`;
  return m.status;
}

function renderModels(models) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren();
  for (const m of models) {
    const row = body.insertRow();
    row.dataset.model = m.name;
    cell(row, m.name);
    cell(row, modelState(m), `state-${m.waiting ? "loading" : m.status}`);
    cell(row, String(m.in_flight));
    // idle only when nothing is in flight (the server sends no idle time then)
    const idle = m.in_flight ? "busy" : fmtSeconds(m.idle_s);
    cell(row, `${idle} / ${m.ttl_s ? fmtSeconds(m.ttl_s) : "never"}`);
    cell(row, String(m.max_context));
    cell(row, String(m.lanes));
    cell(row, m.kv_dtype);
    cell(row, m.load_seconds === null ? "–" : `${m.load_seconds.toFixed(2)} s`);
  }
}

function renderSlots(state) {
  document.getElementById("slots-model").textContent = state.resident ? `(${state.resident})` : "(no model loaded)";
  const body = document.querySelector("#slots tbody");
  body.replaceChildren();
  for (const s of state.slots) {
    const row = body.insertRow();
    row.dataset.slot = String(s.id);
    cell(row, String(s.id));
    cell(row, s.is_processing ? "busy" : "idle", s.is_processing ? "state-busy" : "state-idle");
    cell(row, s.id_task >= 0 ? String(s.id_task) : "–");
    cell(row, s.request_id === null ? "–" : String(s.request_id));
    cell(row, String(s.n_prompt_tokens));
    cell(row, String(s.n_decoded));
    cell(row, `${s.tokens} / ${s.n_ctx}`);
  }
}

// Tokens per second over the polls of the last RATE_WINDOW_S with the same resident model.
function rollingRate(state) {
  samples = samples.filter((s) => s.resident === state.resident && state.time - s.time <= RATE_WINDOW_S);
  samples.push({ time: state.time, resident: state.resident, tokens: state.engine.tokens_generated });
  const first = samples[0], last = samples[samples.length - 1];
  return last.time > first.time ? Math.max(0, last.tokens - first.tokens) / (last.time - first.time) : 0;
}

function renderEngine(state) {
  const e = state.engine;
  document.getElementById("tps").textContent = rollingRate(state).toFixed(1);
  document.getElementById("totals").textContent =
    `${state.totals.generated_tokens} generated, ${state.totals.prompt_tokens} prompt tok in all`;
  document.getElementById("queue").textContent = String(e.queued);
  document.getElementById("lanes").textContent = `${e.busy_lanes} / ${e.lanes}`;
  const kv = state.kv;
  document.getElementById("kv").textContent = `${kv.in_use_tokens} / ${kv.reserved_tokens} tok`;
  document.getElementById("kv-note").textContent =
    `held by slots / pages reserved, of ${kv.capacity_tokens} tok`;
  const bar = document.getElementById("kv-bar");
  bar.value = kv.capacity_tokens ? kv.reserved_tokens / kv.capacity_tokens : 0;
  document.getElementById("memory").textContent = fmtBytes(e.resident_bytes);
  document.getElementById("streams").textContent = `${state.streams.count} (${fmtBytes(state.streams.bytes)})`;
  document.getElementById("uptime").textContent = `up ${fmtSeconds(state.uptime_s)}`;
}

// Prompt tokens read from the prefix cache, of all prompt tokens of finished generations (the server's counters).
function renderPrefixCache(cache) {
  const cached = cache.cached_prompt_tokens, prompt = cache.prompt_tokens;
  const share = prompt ? ` (${((100 * cached) / prompt).toFixed(0)}%)` : "";
  document.getElementById("prefix-cache").textContent = `${cached} / ${prompt} tok${share}`;
  document.getElementById("prefix-cache-note").textContent = cache.reuse
    ? "prompt tokens from the cache"
    : "the prefix cache is off";
}

function renderErrors(errors) {
  const list = document.getElementById("errors");
  list.replaceChildren();
  for (const err of errors.slice().reverse()) {
    const li = document.createElement("li");
    li.textContent = `${new Date(err.time * 1000).toLocaleTimeString()} ${err.model}: ${err.message}`;
    list.appendChild(li);
  }
}

async function poll() {
  const badge = document.getElementById("connection");
  try {
    const response = await fetch("/dashboard/state", { cache: "no-store", headers: authHeaders() });
    if (response.status === 401) throw new Error("API key needed: set it in the chat UI's settings");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const state = await response.json();
    renderModels(state.models);
    renderEngine(state);
    renderSlots(state);
    renderPrefixCache(state.prefix_cache);
    renderErrors(state.errors);
    disconnectedSince = null;
    document.body.classList.remove("stale");
    badge.textContent = "live";
  } catch (err) {
    disconnectedSince = disconnectedSince || new Date();
    document.body.classList.add("stale");
    badge.textContent = `disconnected since ${disconnectedSince.toLocaleTimeString()} (${err.message})`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
