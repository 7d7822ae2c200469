// Context: the orchestrator's working set for the focused thread, its project and its standing gate rules.
import { api } from "./api.js";
import { harnessLine } from "./chat.js";
import { $, chip, firstLine, h, short } from "./dom.js";
import { S, currentTab, taskState, taskTitle, threadName, usageText } from "./state.js";

export async function loadContext() {
  if (currentTab() !== "context") return;
  const c = await api(`/api/context?thread_id=${S.thread}`);
  const [project, usage, rules, fleet] = await Promise.all([
    c.thread?.project_id ? api(`/api/projects/${c.thread.project_id}`).catch(() => null) : null,
    api(`/api/usage?by=thread&thread_id=${S.thread}`).catch(() => null),
    api(`/api/gate-rules?thread_id=${S.thread}`),
    api("/api/executors")]);
  c.usage = usage?.total;
  renderContext(c, project);
  renderGateRules(rules);
  renderExecutors(fleet.executors);
}

function renderProject(p) {
  if (!p) return [];
  const u = p.usage || {};
  const run = (t) => t.latest ? [chip(t.latest.status), " ", h("a", { href: `#task/${t.latest.task_id}` }, short(t.latest.task_id))]
    : [h("span", { class: "chip" }, t.checked ? "checked" : "not started")];
  return [
    h("h3", {}, `Project ${p.slug}`),
    h("p", {}, h("code", {}, p.workdir), ` · ${usageText(u)}`),
    h("ul", { class: "plan" }, p.plan_tasks.length ? p.plan_tasks.map((t) => h("li", {}, h("b", {}, t.ref), " ", t.title || "", " ", ...run(t),
      t.handoffs[0] ? h("div", { class: "handoff-line" }, t.handoffs[0].current_state || "") : null))
      : h("li", { class: "empty" }, "No plan.")),
    h("h3", {}, "Branches waiting for review"),
    p.branches_waiting.length ? h("ul", {}, p.branches_waiting.map((b) => h("li", {},
      h("a", { href: `#task/${b.task_id}` }, b.branch), ` ${b.plan_ref || ""} · ${b.files_changed ?? 0} files`)))
      : h("p", { class: "empty" }, "None."),
  ];
}

function renderContext(c, project) {
  const section = (title, items, fmt, empty) => [h("h3", {}, title),
    items?.length ? h("ul", {}, items.map((i) => h("li", {}, fmt(i)))) : h("p", { class: "empty" }, empty)];
  const turn = c.current_turn;
  $("#context-body").replaceChildren(
    h("p", {}, "Thread: ", c.thread ? threadName(c.thread) : "(not started)", " · mode ", c.mode || "interactive",
      c.usage?.runs ? ` · ${usageText(c.usage)}` : ""),
    h("h3", {}, "Current turn"),
    turn ? h("p", {}, chip(taskState(turn)), " ", taskTitle(turn)) : h("p", { class: "empty" }, "No turn is running."),
    ...section("Pending messages", c.pending_messages, (m) => (m.origin === "harness" ? ["Harness: ", harnessLine(m.text)] : firstLine(m.text)), "None waiting."),
    ...section("Running workers", c.running_workers, (w) => [chip(taskState(w)), " ", h("a", { href: `#task/${w.id}` }, taskTitle(w))], "None running."),
    ...section("Recent handoffs", c.recent_handoffs, (x) => [chip(x.payload.status || "success"), " ", x.payload.current_state || x.payload.goal || ""], "No handoffs yet."),
    ...section("Questions waiting", c.pending_asks, (a) => a.questions[0]?.question || "", "None."),
    ...renderProject(project));
}

// Standing gate rules ("always allow `npm test` in this thread"): listed with their uses, revocable; a
// command typed here becomes a queued rule for this thread (the executor makes it).
function renderGateRules(g) {
  const revoke = (r) => h("button", { class: "small", onclick: async () => {
    await api(`/api/gate-rules/${r.id}`, { method: "DELETE" }); loadContext(); } }, "Revoke");
  const rule = (r) => [h("code", {}, `${r.tool_name}: ${r.pattern}`), ` · ${r.scope}, used ${r.uses}× · `, revoke(r)];
  const input = h("input", { type: "text", placeholder: "npm test  (or a prefix: npm test:*)", "aria-label": "command to always allow" });
  const add = h("form", { class: "gate-rule-add", onsubmit: async (ev) => {
    ev.preventDefault();
    if (!input.value.trim()) return;
    await api("/api/gate-rules", { method: "POST", body: { thread_id: S.thread, pattern: input.value.trim() } });
    input.value = ""; loadContext(); // the rule shows once the executor makes it (gate.rule_added)
  } }, input, h("button", { type: "submit" }, "Always allow in this thread"));
  $("#context-body").append(h("h3", {}, "Gate rules"),
    g.rules.length ? h("ul", {}, g.rules.map((r) => h("li", {}, rule(r)))) : h("p", { class: "empty" }, "No standing rules."),
    ...g.requests.map((q) => h("p", { class: "empty" }, `${q.status}: ${q.pattern}${q.error ? ` (${q.error})` : ""}`)), add);
}

// The fleet, under the thread's context: one line per executor; a lost one stands out like a stalled task.
function renderExecutors(list) {
  const look = { live: "running", stopped: "cancelled" };  // the task chips' colours: lost/expired as stalled
  const line = (x) => [h("span", { class: `chip ${look[x.state] || "stalled"}` }, x.state), " ",
    `${x.name} · ${x.load}/${x.capacity} · lease ${x.lease_age_s}s ago · ${(x.labels || []).join(", ") || "no labels"} · ${x.version || ""}`];
  // where a thread without a project works (each live executor's PETAL_WORKDIR, from its own row)
  const dirs = [...new Set(list.filter((x) => x.state === "live" && x.workdir).map((x) => x.workdir))];
  $("#context-body").append(h("h3", {}, "Working directory"),
    dirs.length ? h("p", { id: "workdir" }, ...dirs.flatMap((d, i) => [i ? ", " : "", h("code", {}, d)]),
      " (threads without a project)") : h("p", { class: "empty" }, "No executor is running."));
  $("#context-body").append(h("h3", {}, "Executors"),
    list.length ? h("ul", { id: "executors" }, list.map((x) => h("li", { "data-state": x.state }, line(x))))
      : h("p", { class: "empty" }, "No executor has started."));
}
