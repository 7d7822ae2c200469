// Routines: work that starts without the user. The list with next fire times and the last run, the quota
// meters, a form to create or edit one (the server checks the cron expression, zone and template and says
// what is wrong), enable/disable, run now, and each routine's history. Secrets are shown once, on creation.
import { api } from "./api.js";
import { $, chip, firstLine, h, short } from "./dom.js";
import { currentTab } from "./state.js";

const R = { editing: null, open: new Set(), made: null, loads: 0 };
const when = (t) => (t ? new Date(t).toLocaleString([], { dateStyle: "short", timeStyle: "short" }) : "");
const hm = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
// a fire time as the routine's own zone reads it, with the zone said (the page's zone may differ)
function fireTime(t, tz) {
  try {
    return new Date(t).toLocaleString([], { timeZone: tz, dateStyle: "short", timeStyle: "short" }) + ` ${tz}`;
  } catch { return when(t); }
}

export async function loadRoutines() {
  if (currentTab() !== "routines") return;
  // loads overlap (an action's, a routine event's): only the latest started may render, or an earlier answer
  // arriving last would put back a run that has since ended as still running
  const load = ++R.loads;
  const [list, quota] = await Promise.all([api("/api/routines"), api("/api/quota").catch(() => ({ windows: [] }))]);
  const runs = await Promise.all([...R.open].map((id) => api(`/api/routines/${id}/runs`).then((r) => [id, r.runs]).catch(() => [id, []])));
  if (load === R.loads) render(list.routines, quota.windows, new Map(runs));
}

function field(label, input) { return h("label", { class: "field" }, h("span", { class: "label" }, label), input); }

function form(routine) {
  const r = routine || {};
  const tz = r.tz || Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const opt = (value, chosen) => h("option", { value, selected: value === chosen }, value);
  const f = h("form", { id: "routine-form", class: "routine-form", "aria-label": r.id ? "Edit routine" : "New routine" },
    h("h3", {}, r.id ? `Edit ${r.name}` : "New routine"),
    field("Name", h("input", { name: "name", required: true, maxlength: "200", value: r.name || "" })),
    field("Prompt (template: {{ event.field }})", h("textarea", { name: "prompt", rows: "3", required: true }, r.prompt || "")),
    field("Mode", h("select", { name: "mode" }, opt("autonomous", r.mode || "autonomous"), opt("interactive", r.mode))),
    field("Cron (empty: no schedule)", h("input", { name: "cron", placeholder: "0 9 * * 1-5", value: r.cron || "" })),
    field("Time zone", h("input", { name: "tz", value: tz })),
    field("Missed instants", h("select", { name: "missed" }, opt("skip", r.missed || "skip"), opt("run_once", r.missed))),
    field("If still running", h("select", { name: "overlap" }, opt("skip", r.overlap || "skip"), opt("queue", r.overlap), opt("parallel", r.overlap))),
    field("USD per run", h("input", { name: "usd_per_run", type: "number", step: "0.01", min: "0", value: r.usd_per_run ?? "" })),
    field("USD per day", h("input", { name: "usd_per_day", type: "number", step: "0.01", min: "0", value: r.usd_per_day ?? "" })),
    field("Max runtime (s)", h("input", { name: "runtime_s", type: "number", step: "1", min: "1", value: r.runtime_s ?? "" })),
    field("Max workers at once", h("input", { name: "max_workers", type: "number", step: "1", min: "1", value: r.max_workers ?? "" })),
    r.id ? null : h("label", { class: "field check" }, h("input", { name: "webhook", type: "checkbox" }), " Webhook (issue a secret)"),
    h("div", { class: "actions" }, h("button", { type: "submit" }, r.id ? "Save" : "Create"),
      r.id ? h("button", { type: "button", class: "secondary", onclick: () => { R.editing = null; loadRoutines(); } }, "Cancel") : null),
    h("p", { id: "routine-error", class: "composer-error", role: "alert" }));
  f.addEventListener("submit", (ev) => { ev.preventDefault(); save(f, r).catch((e) => refusedBy(f, e)); });
  return f;
}

// the form's inputs by the names the API gives them (a validation error's loc ends with one)
const LABELS = { name: "Name", prompt: "Prompt", mode: "Mode", cron: "Cron", tz: "Time zone", missed: "Missed instants",
  overlap: "If still running", usd_per_run: "USD per run", usd_per_day: "USD per day", runtime_s: "Max runtime",
  max_workers: "Max workers at once" };

// A refusal names the field it is about, marks and focuses it, and is scrolled into view with the form
function refusedBy(f, e) {
  const loc = e.data?.errors?.[0]?.loc || [];
  const name = e.data?.field || [...loc].reverse().find((x) => x in LABELS);
  for (const el of f.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const input = name ? f.elements.namedItem(name) : null;
  $("#routine-error").textContent = `${name && LABELS[name] ? `${LABELS[name]}: ` : ""}${e.message}`;
  // said under the field it is about, so the two are in view together
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.setAttribute("aria-describedby", "routine-error");
    input.closest(".field").after($("#routine-error"));
  }
  $("#routine-error").scrollIntoView({ block: "center" });
  if (input) input.focus({ preventScroll: true });
}

async function save(f, old) {
  const v = Object.fromEntries(new FormData(f).entries());
  const num = (x) => (x === "" || x === undefined ? null : Number(x));
  const budget = { usd_per_run: num(v.usd_per_run), usd_per_day: num(v.usd_per_day), runtime_s: num(v.runtime_s),
    max_workers: num(v.max_workers) };
  const body = { name: v.name, prompt: v.prompt, mode: v.mode, budget: Object.values(budget).some((x) => x !== null) ? budget : undefined };
  const schedule = v.cron.trim() ? { cron: v.cron.trim(), tz: v.tz.trim() || "UTC", missed: v.missed, overlap: v.overlap } : null;
  if (old.id) {
    if (schedule) body.schedule = schedule; else if (old.cron) body.unschedule = true;
    await api(`/api/routines/${old.id}`, { method: "PATCH", body });
    R.editing = null;
  } else {
    if (schedule) body.schedule = schedule;
    body.webhook = v.webhook === "on";
    R.made = await api("/api/routines", { method: "POST", body });
  }
  await loadRoutines();
}

function secrets() {
  const m = R.made;
  if (!m) return null;
  return h("div", { class: "routine-secrets", role: "status" },
    h("p", {}, h("b", {}, `${m.name} was created.`), " Copy these now: they are not shown again."),
    h("p", {}, "Fire token (POST ", h("code", {}, m.fire_url), ", Authorization: Bearer): ", h("code", {}, m.fire_token)),
    m.webhook_secret ? h("p", {}, "Webhook ", h("code", {}, m.hook_url), " secret: ", h("code", {}, m.webhook_secret)) : null,
    h("button", { type: "button", class: "secondary small", onclick: () => { R.made = null; loadRoutines(); } }, "Done"));
}

function meters(windows) {
  if (!windows.length) return null;
  return h("div", { class: "quota", "aria-label": "Quota" }, windows.map((w) => h("p", {},
    h("span", { class: "label" }, w.kind.replace("_", " ")), " ",
    w.utilization !== null && w.utilization !== undefined
      ? h("meter", { min: "0", max: "1", value: String(w.utilization), "aria-label": `${w.kind} used` }) : null,
    ` ${w.status}`, w.resets_at ? ` · resets ${when(w.resets_at)}` : "",
    w.exhausted ? h("b", {}, ` · routines wait for quota until ${hm(w.resets_at)}`) : null)));
}

function history(runs) {
  if (!runs) return null;
  return h("ol", { class: "routine-runs" }, runs.length ? runs.map((r) => h("li", {},
    chip(r.status), ` ${r.trigger} · ${when(r.scheduled_at || r.created_at)}`,
    r.duration_s !== null && r.duration_s !== undefined ? ` · ${Math.round(r.duration_s)} s` : "",
    r.cost_usd ? ` · $${r.cost_usd.toFixed(4)}` : "",
    r.thread_id ? [" · ", h("a", { href: `#chat/${r.thread_id}` }, `thread ${short(r.thread_id)}`)] : null,
    r.reason ? h("div", { class: "reason" }, r.reason) : null,
    r.prompt ? h("div", { class: "prompt" }, firstLine(r.prompt, 200)) : null)) : h("li", { class: "empty" }, "No runs yet."));
}

function row(r, runs) {
  const act = (label, fn, cls = "secondary small") => h("button", { type: "button", class: cls, onclick: () => fn().then(loadRoutines).catch((e) => alert(e.message)) }, label);
  const toggle = () => { if (R.open.has(r.id)) R.open.delete(r.id); else R.open.add(r.id); return Promise.resolve(); };
  return h("li", { class: "routine", dataset: { id: r.id } },
    h("div", {}, h("b", {}, r.name), " ", chip(r.enabled ? "enabled" : "disabled"), " ", r.mode,
      r.cron ? h("span", {}, " · ", h("code", {}, r.cron), ` (${r.tz})`) : " · no schedule", r.webhook ? " · webhook" : ""),
    r.next_fire_times.length ? h("div", { class: "next" }, "Next: ", r.next_fire_times.map((t) => fireTime(t, r.tz)).join(", ")) : null,
    r.last_run ? h("div", {}, "Last run: ", chip(r.last_run.status), ` ${when(r.last_run.created_at)}`, r.last_run.reason ? ` · ${r.last_run.reason}` : "") : null,
    h("div", { class: "actions" },
      act("Run now", () => api(`/api/routines/${r.id}/run`, { method: "POST", body: {} }), "small"),
      act(r.enabled ? "Disable" : "Enable", () => api(`/api/routines/${r.id}`, { method: "PATCH", body: { enabled: !r.enabled } })),
      act("Edit", () => { R.editing = r; R.reveal = true; return Promise.resolve(); }),
      act(R.open.has(r.id) ? "Hide history" : "History", toggle),
      act("Delete", () => (confirm(`Delete ${r.name}?`) ? api(`/api/routines/${r.id}`, { method: "DELETE" }) : Promise.resolve()))),
    history(runs));
}

function render(routines, windows, runs) {
  $("#routines-body").replaceChildren(...[
    meters(windows), secrets(),
    h("ul", { class: "routine-list" }, routines.length ? routines.map((r) => row(r, runs.get(r.id)))
      : h("li", { class: "empty" }, "No routines yet.")),
    form(R.editing)].filter(Boolean));
  if (R.reveal) {  // Edit opens the form at the list's end: brought into view, its first field focused
    R.reveal = false;
    const f = $("#routine-form");
    f.scrollIntoView({ block: "start" });
    f.elements.namedItem("name")?.focus({ preventScroll: true });
  }
}
