// Tasks: the list (stalls unmissable), and one task's detail with its events and handoff.
import { api, confirmed, nextFrame, refused } from "./api.js";
import { loadLiveTurns, renderConversation, renderTurnStatus } from "./chat.js";
import { $, Follow, Keyed, chip, firstLine, h, reconcile, short, sleep, when } from "./dom.js";
import { toolLabel } from "./live.js";
import { md } from "./markdown.js";
import { reviewDiff } from "./review.js";
import { S, currentTab, taskState, taskTitle, usageText } from "./state.js";

export async function loadTasks() {
  const [all, mine] = await Promise.all([api("/api/tasks?limit=200"), api(`/api/tasks?limit=500&thread_id=${S.thread}`)]);
  S.tasks = new Map(all.tasks.map((t) => [t.id, t]));
  for (const t of mine.tasks) S.tasks.set(t.id, t);
  S.threadTasks = new Set(mine.tasks.map((t) => t.id));
  renderTasks(); renderTurnStatus(); renderConversation();
  loadLiveTurns().catch((e) => console.warn("live", e));
  if (S.detail) loadDetail(S.detail.id, false);
}

export function renderTasks() {
  const tasks = [...S.tasks.values()].sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)));
  const stalled = tasks.filter((t) => t.status === "running" && t.activity === "stalled");
  const badge = $("#stalled-count");
  badge.hidden = !stalled.length;
  badge.textContent = String(stalled.length);
  const banner = $("#stalled-banner");
  banner.hidden = !stalled.length;
  banner.replaceChildren(...(stalled.length ? [`${stalled.length} task${stalled.length > 1 ? "s are" : " is"} stalled: `,
    ...stalled.map((t) => h("a", { href: `#task/${t.id}` }, `${t.role} ${short(t.id)}`)), " — silent past the threshold."] : []));
  const items = tasks.map((t) => h("li", { class: taskState(t) },
    h("a", { href: `#task/${t.id}` }, chip(taskState(t)), h("span", { class: "role" }, t.role),
      h("span", { class: "brief" }, taskTitle(t)), h("span", { class: "role" }, when(t.created_at)))));
  $("#task-list").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No tasks yet. Workers appear here the moment they are dispatched.")]));
}

export async function loadDetail(id, fresh) {
  if (fresh || !S.detail || S.detail.id !== id) {
    S.detail = { id, task: null, events: new Map(), fresh: [], shownSeq: 0, handoff: null, children: new Map() };
    follow.stick = true;
  }
  let task, events;
  try {
    [task, events] = await Promise.all([api(`/api/tasks/${id}`), api(`/api/tasks/${id}/events?limit=1000`)]);
  } catch (e) {
    // a link to a task that is not there (mistyped, another store's) says so, with the id it was given
    if (e.status !== 404 && e.status !== 400) throw e;
    if (S.detail?.id === id) notFound(id);
    return;
  }
  // an extractor derives the handoff of its parent (the worker): that is what it shows
  const scope = task.role === "extractor" && task.parent_task_id ? task.parent_task_id : id;
  // a project worker's recorded changes (409: not recorded yet; a task outside a project has none to ask
  // for) and its usage
  const [handoffs, changes, usage] = await Promise.all([api(`/api/handoffs?scope_id=${scope}&limit=1`),
    task.project_id && task.role === "worker" ? api(`/api/tasks/${id}/diff`).catch(() => null) : null,
    api(`/api/usage?by=task&task_id=${id}`).catch(() => null)]);
  if (!S.detail || S.detail.id !== id) return;
  S.detail.changes = changes;
  S.detail.usage = usage?.total || null;
  S.detail.children = await childrenByParent(id);
  if (!S.detail || S.detail.id !== id) return;
  S.detail.task = task;
  for (const e of events.events) detailEvent(e, false);
  S.detail.handoff = handoffs.handoffs.find((x) => x.task_id === scope)?.payload || null;
  renderDetail();
}

function notFound(id) {
  const box = $("#task-detail");
  box.hidden = false;
  box.dataset.taskId = "";
  box.replaceChildren(h("a", { href: "#tasks" }, "← all tasks"),
    h("p", { class: "not-found", role: "alert" }, "Task not found: ", h("code", {}, id)));
}

// The tasks this one dispatched, by the event they hang under (their task.spawned's parent_id: the
// tool call that asked for them), so the detail folds each worker under its dispatch call.
async function childrenByParent(id) {
  const byParent = new Map();
  const kids = [...S.tasks.values()].filter((t) => t.parent_task_id === id);
  await Promise.all(kids.map(async (kid) => {
    const first = await api(`/api/tasks/${kid.id}/events?limit=5`);
    const spawned = first.events.find((e) => e.event_type === "task.spawned");
    if (spawned?.parent_id) byParent.set(spawned.parent_id, [...(byParent.get(spawned.parent_id) || []), kid]);
  }));
  return byParent;
}

function childList(e) {
  const kids = S.detail?.children?.get(e.event_id);
  return kids ? h("ul", { class: "children" }, kids.map((k) => h("li", {},
    h("a", { href: `#task/${k.id}` }, `${k.role} ${short(k.id)}`), " ", chip(taskState(k)), " ", taskTitle(k, 80)))) : null;
}

function blocksOf(e) {
  const content = e.payload?.message?.content;
  return Array.isArray(content) ? content : typeof content === "string" ? [{ type: "text", text: content }] : [];
}

function renderEvent(e) {
  const p = e.payload || {};
  const kind = h("span", { class: "kind" }, `#${e.seq} ${e.event_type}`);
  if (e.event_type === "stream.assistant" || e.event_type === "stream.user") {
    return blocksOf(e).map((b) => {
      if (b.type === "text") return h("li", {}, kind, md(b.text));
      if (b.type === "tool_use") return h("li", {}, h("details", {}, h("summary", {}, kind, toolLabel(b.name, b.input)),
        h("pre", {}, JSON.stringify(b.input, null, 2))), childList(e));
      if (b.type === "tool_result") {
        const text = typeof b.content === "string" ? b.content : JSON.stringify(b.content, null, 2);
        return h("li", {}, h("details", {}, h("summary", {}, kind, b.is_error ? "tool result (error)" : "tool result"), h("pre", {}, text)));
      }
      return h("li", {}, h("details", {}, h("summary", {}, kind, b.type), h("pre", {}, JSON.stringify(b, null, 2))));
    });
  }
  if (e.event_type === "stream.result") return h("li", {}, kind, `result: ${p.subtype}${p.is_error ? " (error)" : ""}`, p.result ? md(p.result) : null);
  if (e.event_type === "task.stderr") return h("li", {}, kind, h("pre", {}, p.line));
  return h("li", {}, h("details", {}, h("summary", {}, kind, firstLine(p.status || p.reason || p.text || "", 80)),
    h("pre", {}, JSON.stringify(p, null, 2))));
}

function renderHandoff(x) {
  if (!x) return h("p", { class: "empty" }, "No handoff (yet). It is derived when the worker exits.");
  const list = (items, fmt) => (items?.length ? h("ul", {}, items.map((i) => h("li", {}, fmt(i)))) : h("span", {}, "none"));
  return h("dl", {},
    h("dt", {}, "goal"), h("dd", {}, x.goal ?? ""),
    h("dt", {}, "state"), h("dd", {}, x.current_state ?? ""),
    h("dt", {}, "next step"), h("dd", {}, x.next_step ?? ""),
    h("dt", {}, "status"), h("dd", {}, chip(x.status || "success")),
    h("dt", {}, "ruled out"), h("dd", {}, list(x.ruled_out, (r) => `${r.approach} — ${r.reason}`)),
    h("dt", {}, "artifacts"), h("dd", {}, list(x.artifacts, (a) => (typeof a === "string" ? a : JSON.stringify(a)))),
    x.gate_decisions ? [h("dt", {}, "gates"), h("dd", {}, list(x.gate_decisions, (g) => `${g.gate}: ${g.decision_point}`))] : null);
}

// A running task's events are tailed in place: each arrives once (keyed by event id), in seq order. A burst
// is drawn once, in the next frame; events that follow on from the last one shown are appended without
// walking the list (the usual case while tailing a worker), anything else is put in order.
export function detailEvent(e, render = true) {
  if (!S.detail || e.task_id !== S.detail.id || S.detail.events.has(e.event_id)) return;
  S.detail.events.set(e.event_id, e);
  S.detail.fresh.push(e);
  if (render) nextFrame("render-detail", appendDetailEvents);
}

const eventNodes = new Keyed();
const follow = new Follow(() => currentTab() === "tasks" && !!S.detail);
const childSig = (e) => (S.detail.children?.get(e.event_id) || []).map((k) => `${k.id}:${taskState(k)}`).join();
const eventNode = (e) => eventNodes.get(e.event_id, childSig(e), () => renderEvent(e));

function appendDetailEvents() {
  const d = S.detail;
  const list = $("#task-detail ol.events");
  if (!list || !d || !d.fresh.length) return;
  const fresh = d.fresh.sort((a, b) => a.seq - b.seq);
  d.fresh = [];
  if (fresh[0].seq <= d.shownSeq) { renderDetailEvents(); return; }
  for (const e of fresh) list.append(...[eventNode(e)].flat().filter(Boolean));
  d.shownSeq = fresh.at(-1).seq;
  shown(d);
}

function renderDetailEvents() {
  const d = S.detail;
  const list = $("#task-detail ol.events");
  if (!list || !d) return;
  d.fresh = [];
  const events = [...d.events.values()].sort((a, b) => a.seq - b.seq);
  reconcile(list, events.flatMap(eventNode).filter(Boolean));
  eventNodes.prune();
  d.shownSeq = events.at(-1)?.seq ?? 0;
  shown(d);
}

function shown(d) {
  $("#task-detail .events-count").textContent = `Events (${d.events.size})`;
  if (d.task?.status === "running") follow.scroll(false);
}

export function renderDetail() {
  const d = S.detail;
  const box = $("#task-detail");
  if (!d || !d.task) { box.hidden = true; return; }
  const t = d.task;
  const live = t.status === "running" || t.status === "pending";
  box.hidden = false;
  if (box.dataset.taskId !== t.id) {
    box.dataset.taskId = t.id;
    box.replaceChildren(h("div", { class: "detail-head" }), h("h3", { class: "events-count" }), h("ol", { class: "events" }));
  }
  const open = box.querySelector(".detail-head details.brief")?.open;
  box.querySelector(".detail-head").replaceChildren(
    h("a", { href: "#tasks" }, "← all tasks"),
    h("h2", {}, `${t.role} ${short(t.id)} `, chip(taskState(t))),
    h("dl", {},
      h("dt", {}, "brief"), h("dd", {}, h("details", { class: "brief", open }, h("summary", {}, taskTitle(t)), h("pre", {}, t.brief))),
      h("dt", {}, "reason"), h("dd", {}, t.status_reason || "—"),
      h("dt", {}, "attempt"), h("dd", {}, String(t.attempt)),
      h("dt", {}, "last output"), h("dd", {}, t.last_output_at ? new Date(t.last_output_at).toLocaleString() : "—")),
    live ? stopControl(t) : "",
    d.usage?.runs ? h("p", { class: "usage" }, usageText(d.usage)) : "",
    ...(t.role === "extractor" ? [h("h3", {}, "Derived"), h("p", { class: "derived-for" }, "The handoff of ",
      h("a", { href: `#task/${t.parent_task_id}` }, `worker ${short(t.parent_task_id)}`),
      d.handoff ? "" : ` — ${live ? "not derived yet" : "none recorded (see its events)"}`), d.handoff ? renderHandoff(d.handoff) : ""]
      // a turn of the orchestrator leaves no handoff of its own: its workers do (folded under its events)
      : t.role === "orchestrator" ? [] : [h("h3", {}, "Handoff"), renderHandoff(d.handoff)]),
    d.changes ? renderChanges(t, d.changes) : "");
  renderDetailEvents();
}

// ---- a project worker's changes: files, the diff, Merge / Discard, Push -----------------------------------

const DIFF_LINES_SHOWN = 4000;

function renderDiff(text) {
  const lines = String(text || "").split("\n");
  const cls = (l) => (l.startsWith("+++") || l.startsWith("---") || l.startsWith("diff ") ? "file"
    : l.startsWith("@@") ? "hunk" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : l.startsWith("…") ? "cut" : "");
  const shown = lines.slice(0, DIFF_LINES_SHOWN).map((l) => h("span", { class: cls(l) }, l + "\n"));
  if (lines.length > DIFF_LINES_SHOWN) shown.push(h("span", { class: "cut" }, `… ${lines.length - DIFF_LINES_SHOWN} more lines on the branch`));
  return h("pre", { class: "diff" }, shown);
}

function renderChanges(t, c) {
  const files = c.files || [];
  const open = !c.review && !c.error && files.length > 0;  // nothing to merge or discard without changes
  const into = c.base_branch || "the project's branch";
  return h("section", { class: "changes" },
    h("h3", {}, `Changes on ${c.branch}`, c.review ? [" ", chip(c.review)] : null),
    c.error ? h("p", { class: "error" }, c.error) : null,
    h("ul", { class: "files" }, files.length ? files.map((f) => h("li", {}, h("code", {}, f.path),
      ` +${f.added ?? "bin"} −${f.deleted ?? "bin"}`)) : h("li", { class: "empty" }, "no changes"),
      c.files_truncated ? h("li", { class: "empty" }, "… and more files on the branch") : null),
    c.check ? checkResult(c.check, c.check_round) : null,
    open ? h("div", { class: "actions" },
      h("button", { type: "button", onclick: () => reviewTask(t.id, "merge", c.check && !c.check.passed
        ? `The check failed (${c.check.timed_out ? "timed out" : `exit ${c.check.exit_code}`}). Merge ${c.branch} into ${into} anyway?`
        : `Merge ${c.branch} into ${into}?`) }, `Merge into ${into}`),
      h("button", { type: "button", class: "danger", onclick: () => reviewTask(t.id, "discard", `Discard ${c.branch}? The branch is deleted.`) }, "Discard")) : null,
    pushControl(t, c),
    h("p", { class: `review-result${S.detail?.note?.error ? " error" : ""}`, id: "review-result" }, S.detail?.note?.text || ""),
    c.diff ? h("details", { open: files.length <= 10 }, h("summary", {}, open ? "diff (tap a line to comment)" : "diff"),
      open ? reviewDiff(t.id, c.diff, renderDetail, DIFF_LINES_SHOWN) : renderDiff(c.diff)) : null);
}

// Push: the reviewed commit to its branch on the project's push remote, merged or not (never a discarded one);
// the last push's outcome as the executor journaled it
function pushControl(t, c) {
  if (!c.push_remote || c.review === "discarded" || c.error || !c.head_commit) return null;
  const p = c.push;
  const outcome = !p ? null : p.pushed
    ? h("p", { class: "pushed" }, h("b", {}, "Pushed"), ` ${short(p.commit)} to ${p.branch} on `, h("code", {}, p.remote))
    : h("p", { class: "push-failed" }, h("b", {}, "Push failed"), `: ${p.reason}`,
      (p.tail || []).length ? h("details", {}, h("summary", {}, "git's last lines"), h("pre", { class: "check-tail" }, p.tail.join("\n"))) : null);
  return h("div", { class: "push" },
    h("div", { class: "actions" }, h("button", { type: "button", onclick: () => reviewTask(t.id, "push",
      `Push ${short(c.head_commit)} (the reviewed commit) to ${c.branch} on ${c.push_remote}?`) }, p?.pushed ? "Push again" : "Push")),
    outcome);
}

// The project's check as code ran it on the worker's tree: passed or failed, how long, its last lines
function checkResult(k, rounds) {
  const how = k.passed ? "passed" : k.timed_out ? "timed out" : `failed (exit ${k.exit_code})`;
  return h("div", { class: `check ${k.passed ? "passed" : "failed"}` },
    h("p", {}, h("b", {}, `Check ${how}`), ` in ${Math.round(k.duration_s * 10) / 10} s: `, h("code", {}, k.command),
      rounds ? ` (fix round ${rounds})` : ""),
    (k.tail || []).length ? h("details", { open: !k.passed }, h("summary", {}, `its last ${k.tail.length} lines`),
      h("pre", { class: "check-tail" }, k.tail.join("\n"))) : null);
}

async function reviewTask(id, action, question) {
  if (!confirm(question)) return;
  // the note lives with the task shown, so a live re-render (its events arrive meanwhile) keeps it
  const note = (text, error = false) => { if (S.detail?.id === id) { S.detail.note = { text, error }; renderDetail(); } };
  try {
    const queued = await api(`/api/tasks/${id}/${action}`, { method: "POST", body: {} });
    note(`${action} queued…`);
    for (let i = 0; i < 120; i++) {  // the executor carries it out; its outcome is on the request row
      const r = await api(`/api/project-requests/${queued.id}`);
      if (r.status === "done" || r.status === "failed") {
        // the branch is merged or gone now; a push's outcome, either way, is on the card
        if (r.status === "done" || action === "push") await loadDetail(id, false);
        note(r.status === "done" ? `${action} done` : `${action} failed: ${r.error}`, r.status !== "done");
        return;
      }
      await sleep(500);
    }
  } catch (e) { note(e.message, true); }
}

// Optimistic stop: "stopping…" at once; the task's own end makes it final. Unconfirmed in time it offers
// Retry; refused (e.g. the task already ended) it reverts with the server's message.
async function stopTask(id) {
  if (!confirm("Stop this task? Its process gets SIGTERM, then SIGKILL after the grace period.")) return;
  const set = (state, message = "") => { if (S.detail?.id === id) { S.detail.stop = { state, message }; renderDetail(); } };
  set("sending");
  try {
    await confirmed(api(`/api/tasks/${id}/stop`, { method: "POST", body: { reason: "stopped from the web client" } }),
      () => set("late", "No confirmation yet: the stop may not have arrived."));
    set("requested");
  } catch (e) {
    set(refused(e) ? "refused" : "late", refused(e) ? e.message : `Not sent: ${e.message}`);
  }
}

function stopControl(t) {
  const st = S.detail.stop || { state: "idle", message: "" };
  const label = { sending: "Stopping…", requested: "Stop requested" }[st.state] || (st.state === "late" ? "Retry stop" : "Stop");
  return h("div", { class: "stop" },
    h("button", { type: "button", class: `danger ${st.state}`, disabled: st.state === "sending" || st.state === "requested",
      onclick: () => stopTask(t.id) }, label),
    h("span", { class: "status", role: "status" }, st.message));
}
