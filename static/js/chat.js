// Chat: the focused thread's conversation, its undelivered messages, the turn status and the composer.
import { api, confirmed, nextFrame, refused } from "./api.js";
import { $, Follow, Keyed, chip, firstLine, h, reconcile, short } from "./dom.js";
import { Progress, isLive } from "./live.js";
import { answerText } from "./asks.js";
import { held, ready, restore, sentFiles, takeAll } from "./attach.js";
import { md } from "./markdown.js";
import { FINAL, S, currentTab, taskState } from "./state.js";

const rendered = new Keyed();

// The newest page of the thread, merged into what is shown (pages read back with "load older" stay).
export async function loadConversation() {
  const thread = S.thread;
  const data = await api(`/api/threads/${thread}/conversation?limit=100`);
  if (thread !== S.thread) return;
  S.convTypes = new Set(data.types);
  if (!S.conv.size) S.convMore = data.more;
  for (const e of data.events) S.conv.set(e.event_id, e);
  renderConversation();
}

// Pages the thread's history back by seq, keeping the reader's place on screen.
export async function loadOlder() {
  const thread = S.thread;
  const oldest = Math.min(...[...S.conv.values()].map((e) => e.seq));
  if (!Number.isFinite(oldest)) return;
  const data = await api(`/api/threads/${thread}/conversation?before_seq=${oldest}&limit=100`);
  if (thread !== S.thread) return;
  S.convMore = data.more;
  const height = document.body.scrollHeight;
  for (const e of data.events) S.conv.set(e.event_id, e);
  S.keepPlace = true;
  renderConversation();
  window.scrollBy(0, document.body.scrollHeight - height);
}

// A read of the queue can be older than the stream: one answered before a message's delivery and read after its
// echo would bring the delivered message back as pending, beside its echo.
const echoed = (id) => [...S.conv.values()].some((e) => e.message_id === id);

export async function loadQueue() {
  const thread = S.thread;
  const { pending } = await api(`/api/queue?thread_id=${thread}`);
  if (thread !== S.thread) return;
  S.queue = pending.filter((q) => !echoed(q.id));
  renderConversation();
}

export function belongs(e) {
  if (e.session_id === S.thread) return true;
  if (e.task_id && S.threadTasks.has(e.task_id)) return true;
  if (e.event_type === "task.dispatch_requested") {
    const p = e.payload || {};
    if (S.threadTasks.has(p.parent_task_id) || S.threadTasks.has(p.retry_of)) { S.threadTasks.add(e.task_id); return true; }
  }
  return false;
}

// why a terminal session ended (executor/terminals), in words
const TERMINAL_ENDS = {
  exited: "the CLI exited",
  ended_from_the_page: "ended from the page",
  executor_stopped: "the executor stopped",
  executor_restart: "the executor restarted",
};

function renderRecord(e) {
  const p = e.payload || {};
  const key = { "data-event-id": e.event_id };
  switch (e.event_type) {
    case "task.user_message":
      return h("li", { class: "msg user", ...key }, p.text, sentFiles(p.attachments));
    case "thread.harness_message":
      return harnessNote(p.text, key);
    case "question.answered": {
      const { parts, response } = answerText(p.answers, p.response);
      if (!parts.length && !response) return null;
      return h("li", { class: "msg note answered", ...key }, h("span", { class: "title" }, "You answered"),
        parts.map(([q, v]) => h("div", { class: "qa" }, h("span", { class: "q" }, firstLine(q, 100)), " → ", h("b", { class: "answer" }, v))),
        response ? h("div", { class: "qa" }, "reply: ", h("b", { class: "answer" }, response)) : null);
    }
    case "stream.assistant": {
      // what a turn said on the way (before a tool call): shown by the turn's progress while it runs, kept in
      // the conversation once it ended; the last of it is the final reply, shown once (by stream.result)
      const text = saidText(e);
      if (e.session_id !== S.thread || !text || saidState(e, text) !== "kept") return null;
      return h("li", { class: "msg assistant said", ...key }, md(text));
    }
    case "stream.result": {
      if (e.session_id !== S.thread) return null; // a worker's final text belongs to its task
      const text = typeof p.result === "string" ? p.result : (p.errors || []).join("\n") || p.subtype;
      return h("li", { class: `msg assistant${p.is_error ? " error" : ""}`, ...key }, md(text));
    }
    case "task.dispatch_requested": {
      if (p.role && p.role !== "worker") return null;
      const t = S.tasks.get(e.task_id);
      return h("li", { class: "msg worker", ...key },
        h("div", {}, h("span", { class: "title" }, p.retry_of ? `Worker retried (attempt ${p.attempt})` : "Worker dispatched"), " ",
          chip(taskState(t))),
        h("div", {}, firstLine(p.brief, 200)),
        workerActivity(e.task_id),
        h("a", { href: `#task/${e.task_id}` }, "open the task"));
    }
    case "handoff":
      return h("li", { class: "msg worker", ...key },
        h("div", {}, h("span", { class: "title" }, "Handoff"), " ", chip(p.status || "success")),
        h("div", {}, p.current_state || p.goal || ""),
        p.next_step ? h("div", { class: "meta" }, "next: ", p.next_step) : null,
        h("a", { href: `#task/${e.task_id}` }, "details"));
    case "handoff.extraction_failed":
      return h("li", { class: "msg note error", ...key }, "The handoff failed the validation gate: ", firstLine((p.errors || [])[0]));
    case "task.dispatch_refused":
      return h("li", { class: "msg note", ...key }, `Dispatch refused (${p.reason}): `, firstLine(p.brief));
    case "policy.decision":
      if (p.action === "report") return null;
      return h("li", { class: "msg note", ...key }, `Policy: ${p.status} → ${p.action.replace("_", " ")} (${p.why})`);
    case "escalation.resolved":
      return h("li", { class: "msg note", ...key }, `Escalation answered: ${p.decision}`);
    case "turn.failed":
      return turnFailed(e, key);
    case "approval.resolved":
      return h("li", { class: "msg note", ...key }, `Dispatch ${p.decision === "approved" ? "approved" : p.decision === "rejected" ? "not approved" : "approval closed"}`);
    case "question.timed_out":
      return h("li", { class: "msg note", ...key }, "A question timed out; it stays in Asks (late) and an answer still reaches the thread");
    case "task.stalled":
      return h("li", { class: "msg note error", ...key }, `A task went silent (${Math.round(p.silent_s)} s): `,
        h("a", { href: `#task/${e.task_id}` }, short(e.task_id)));
    case "terminal.entry":
      return terminalEntry(p, key);
    case "terminal.started":
      return h("li", { class: "msg note", ...key }, `Live in a terminal (${p.holder || "a terminal"}), in ${p.cwd}`);
    case "terminal.input_waiting":
      if (p.waiting === false) return null;  // (its end is said by the message going in)
      return h("li", { class: "msg note", ...key }, "Your message waits: the terminal's input line holds text");
    case "question.cancelled":
      if (p.response !== "answered in the terminal") return null;
      return h("li", { class: "msg note", ...key }, "A permission prompt was answered in the terminal");
    case "terminal.ended": {
      const why = TERMINAL_ENDS[p.reason] || p.reason;
      // a negative code is a signal's (a hang-up in the sandbox), not the CLI's own exit status
      const code = p.exit_code == null || p.exit_code < 0 ? "" : `, exit code ${p.exit_code}`;
      return h("li", { class: "msg note", ...key }, `The terminal session ended (${why}${code}); messages continue it with --resume`);
    }
    case "thread.created":
      return h("li", { class: "msg note", ...key }, `Thread started (${p.mode || "interactive"})`);
    case "thread.mode_changed":
      return h("li", { class: "msg note", ...key }, `Mode: ${p.mode}`);
    case "task.review": {
      const n = (p.comments || []).length;
      return h("li", { class: "msg note review", ...key }, `You reviewed ${p.branch}: ${n} comment${n === 1 ? "" : "s"}`,
        p.note ? ` (“${firstLine(p.note, 80)}”)` : "", " sent back to ", h("a", { href: `#task/${p.followup_task_id}` }, "a follow-up worker"));
    }
    default:
      return null;
  }
}

const saidText = (e) => {
  const blocks = e.payload?.message?.content;
  return (Array.isArray(blocks) ? blocks : []).filter((b) => b.type === "text").map((b) => b.text || "").join("\n").trim();
};
// ended: the turn's final reply (task id → its text), read once per render
let replies = new Map();
function saidState(e, text = saidText(e)) {
  if (!replies.has(e.task_id) && !FINAL.has(S.tasks.get(e.task_id)?.status)) return "live";
  const reply = replies.get(e.task_id);
  return typeof reply === "string" && reply.trim() === text ? "final" : "kept";
}

// A harness report ("[harness] Worker <uuid> finished. Its handoff: …") is a compact system note: its first
// line with the ids shortened and linked to their task, the whole text folded under it.
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi;
export function harnessLine(text, n = 160) {
  const line = firstLine(String(text ?? "").replace(/^\[harness\]\s*/, ""), n).replace(/:$/, "");
  const out = [];
  let at = 0;
  for (const m of line.matchAll(UUID)) {
    out.push(line.slice(at, m.index), h("a", { href: `#task/${m[0]}`, class: "task-link", title: m[0] }, short(m[0])));
    at = m.index + m[0].length;
  }
  out.push(line.slice(at));
  return out;
}

// What a terminal session's CLI wrote to its conversation: the model's text, its tool calls, their results.
function terminalEntry(p, key) {
  const blocks = p.blocks || [];
  if (p.role === "interrupted") return h("li", { class: "msg note terminal", ...key }, "The turn was interrupted");
  if (p.role === "assistant") {
    return h("li", { class: "msg assistant terminal", ...key }, ...blocks.map((b) => b.type === "text" ? md(b.text)
      : h("div", { class: "step tool" }, h("b", {}, b.name || "tool"), " ", h("code", {}, firstLine(b.input, 200)))));
  }
  // a tool's result, or what a `!` command typed in the terminal printed
  const kind = (b) => b.type === "shell_output" ? (b.is_error ? "command output, with errors" : "command output")
    : b.is_error ? "tool error" : "tool result";
  return h("li", { class: "msg note terminal", ...key }, ...blocks.map((b) => h("details", {},
    h("summary", {}, kind(b), " ", firstLine(b.text || "(nothing)", 100)), h("pre", {}, b.text))));
}

function harnessNote(text, attrs, pending = "") {
  const rest = String(text ?? "").split("\n").slice(1).join("\n").trim();
  return h("li", { class: "msg note harness", ...attrs }, h("span", { class: "title" }, "Harness: "), harnessLine(text),
    pending ? h("span", { class: "meta" }, ` — ${pending}`) : null,
    rest ? h("details", {}, h("summary", {}, "what it told the orchestrator"), h("pre", {}, rest)) : null);
}

// A running turn of the focused thread: its assistant text and tool calls as they are journaled. A
// worker's lines fold under the card of the dispatch that started it.
export function liveEvent(e) {
  if (!isLive(e) || !e.task_id) return false;
  if (e.session_id !== S.thread) {
    if (!S.threadTasks.has(e.task_id) || S.tasks.get(e.task_id)?.role !== "worker") return false;
    workerProgress(e.task_id).add(e);
    return false; // updated in place: nothing to re-render
  }
  // what the turn says is part of the conversation (kept when its progress gives way to the reply)
  if (e.event_type === "stream.assistant" && saidText(e)) S.conv.set(e.event_id, e);
  if (hasResult(e.task_id)) return S.conv.has(e.event_id);
  if (!S.live.has(e.task_id)) S.live.set(e.task_id, new Progress(e.task_id));
  const progress = S.live.get(e.task_id);
  if (!progress.add(e)) return false;
  // a step put into a turn already shown needs no render of the conversation, only the follow
  if (progress.node.isConnected && !progress.node.hidden) {
    nextFrame("follow-chat", () => scrollChat(false));
    return false;
  }
  return true;
}

function workerProgress(taskId) {
  if (!S.workers.has(taskId)) S.workers.set(taskId, new Progress(taskId));
  return S.workers.get(taskId);
}

// the folded activity is read back when first opened; the stream keeps it current from then on
async function openWorker(taskId, open) {
  const progress = workerProgress(taskId);
  progress.open = open;
  if (!open || S.liveLoaded.has(taskId)) return;
  S.liveLoaded.add(taskId);
  const data = await api(`/api/tasks/${taskId}/events?limit=1000`);
  for (const e of data.events) if (isLive(e)) progress.add(e);
  if (!progress.count) progress.list.replaceChildren(h("li", { class: "step tool" }, "nothing printed yet"));
}

function hasResult(taskId) {
  for (const e of S.conv.values()) if (e.event_type === "stream.result" && e.task_id === taskId) return true;
  return false;
}

// A page opened (or a stream resumed) mid-turn reads back what the running turn already printed.
export async function loadLiveTurns() {
  const thread = S.thread;
  const running = [...S.tasks.values()].filter((t) => t.session_id === thread && t.role === "orchestrator"
    && t.status === "running" && !S.liveLoaded.has(t.id));
  await Promise.all(running.map(async (t) => {
    S.liveLoaded.add(t.id);
    const data = await api(`/api/tasks/${t.id}/events?limit=1000`);
    if (S.thread !== thread) return;
    for (const e of data.events) liveEvent(e);
  }));
  if (running.length) renderConversation();
}

function workerActivity(taskId) {
  const progress = workerProgress(taskId);
  return h("details", { class: "activity", open: progress.open,
    ontoggle: (ev) => openWorker(taskId, ev.target.open).catch((err) => console.warn("worker", err)) },
  h("summary", {}, "what it is doing ", progress.counter), progress.fold, progress.list);
}

const follow = new Follow(() => currentTab() === "chat");  // not another view's scrolling
export function scrollChat(force) { follow.scroll(force); }

function recordSig(e) {
  if (e.event_type === "stream.assistant") return saidState(e);
  return e.event_type === "task.dispatch_requested" ? taskState(S.tasks.get(e.task_id)) : "";
}

export function renderConversation() {
  const keepPlace = S.keepPlace;
  S.keepPlace = false;
  $("#load-older").hidden = !S.convMore;
  replies = new Map([...S.conv.values()].filter((e) => e.event_type === "stream.result" && e.session_id === S.thread)
    .map((e) => [e.task_id, e.payload?.result]));
  // a turn's progress gives way to its final reply; a turn that ended without one leaves nothing behind
  for (const [id, progress] of S.live) {
    if (hasResult(id) || FINAL.has(S.tasks.get(id)?.status)) S.live.delete(id);
    else progress.node.hidden = progress.count === 0;
  }
  const entries = [...S.conv.values()].map((e) => ({ seq: e.seq, node: rendered.get(e.event_id, recordSig(e), () => renderRecord(e)) }));
  for (const progress of S.live.values()) entries.push({ seq: progress.firstSeq, node: progress.node });
  const items = entries.filter((x) => x.node).sort((a, b) => a.seq - b.seq).map((x) => x.node);
  for (const q of S.queue) {
    // no executor running (js/fleet.js): the message says it waits for one, not for a turn boundary
    const down = q.status === "pending" && S.fleetDown;
    items.push(rendered.get(`queue:${q.id}`, `${q.status}${down ? ":down" : ""}`, () => (q.origin === "harness"
      ? harnessNote(q.text, { "data-queue-id": q.id }, "waiting for the next turn")
      : h("li", { class: "msg user pending", "data-queue-id": q.id }, q.text, sentFiles(q.attachments),
        h("span", { class: "meta" }, down ? "waiting — no executor is running; delivered when one is back"
          : q.status === "pending" ? "pending — delivered at the next turn boundary" : "delivering…")))));
  }
  for (const item of S.outbox.values()) {
    if (item.thread === S.thread) items.push(rendered.get(`out:${item.id}`, item.state, () => outboxItem(item)));
  }
  if (!items.length) items.push(rendered.get("empty", "", () => h("li", { class: "empty" }, "Nothing here yet. Say what you want done; the orchestrator plans it and dispatches workers.")));
  rendered.prune();
  reconcile($("#messages"), items);
  renderTurnStatus();
  if (!keepPlace) scrollChat(false); // only while Chat is shown (js/dom.js Follow)
}

export function renderTurnStatus() {
  const turn = [...S.tasks.values()].find((t) => t.session_id === S.thread && t.role === "orchestrator"
    && (t.status === "running" || t.status === "pending"));
  const el = $("#turn-status");
  el.hidden = !turn;
  if (turn?.status === "pending" && turn.activity === "waiting_for_slot") slotsLine(el);
  else if (turn) el.textContent = turn.activity === "awaiting_user" ? "The orchestrator is waiting for your answer"
    : turn.activity === "stalled" ? "The orchestrator's turn is stalled" : "The orchestrator is working…";
}

// A turn the supervisor holds back says for what: the running tasks (one parked on its user holds no slot) against
// the live executors' slots (GET /api/executors, read again at most every 10 s while the wait shows).
const slots = { at: 0, n: null };
function slotsLine(el) {
  if (Date.now() - slots.at > 10_000) {
    slots.at = Date.now();
    api("/api/executors").then(({ executors }) => {
      slots.n = executors.filter((x) => x.state === "live").reduce((n, x) => n + x.capacity, 0);
      renderTurnStatus();
    }).catch(() => {});
  }
  const busy = [...S.tasks.values()].filter((t) => t.status === "running" && t.activity !== "awaiting_user");
  el.replaceChildren(`Waiting for a free slot — ${busy.length} of ${slots.n ?? busy.length} busy`,
    ...busy.flatMap((t, i) => [i ? ", " : ": ", h("a", { href: `#task/${t.id}` }, `${t.role} ${short(t.id)}`)]));
}

// Optimistic send: the message shows at once as pending, becomes the queue's row when the store takes
// it (and the echo when the turn boundary delivers it); unconfirmed in time it says so and offers Retry;
// refused, it goes back into the composer with the server's message. Retries reuse the client_msg_id,
// which the server deduplicates.
// A message goes with its files only once every one of them is stored (js/attach.js).
export async function send(ev) {
  ev.preventDefault();
  const box = $("#composer-text");
  const text = box.value.trim();
  if (held()) return;
  const attached = ready();
  if (!text && !attached.files.length) return;
  const item = { id: crypto.randomUUID(), text: text || FILES_ONLY, files: attached.files, thread: S.thread,
    state: "sending", error: null };
  S.outbox.set(item.id, item);
  box.value = "";
  takeAll();
  $("#composer-error").textContent = "";
  renderConversation();
  scrollChat(true);
  await deliver(item);
}

// the text of a message that is only files (a message needs text; this is what the user sees sent)
const FILES_ONLY = "(see the attached files)";

async function deliver(item) {
  item.state = "sending";
  renderConversation();
  try {
    const queued = await confirmed(
      api("/api/chat", { method: "POST", body: { text: item.text, thread_id: item.thread, client_msg_id: item.id,
        ...(item.files.length ? { attachment_ids: item.files.map((f) => f.id) } : {}) } }),
      () => { if (S.outbox.has(item.id)) { item.state = "late"; renderConversation(); } });
    S.outbox.delete(item.id);
    if (item.thread === S.thread && !S.queue.some((q) => q.id === queued.id) && !echoed(queued.id)) {
      S.queue.push({ ...queued, text: item.text, attachments: item.files, status: queued.status || "pending" });
    }
  } catch (e) {
    if (refused(e)) {
      S.outbox.delete(item.id);
      const box = $("#composer-text");
      if (!box.value && item.text !== FILES_ONLY) box.value = item.text;
      restore(item.files);
      $("#composer-error").textContent = `Not sent: ${e.message}`;
    } else {
      item.state = "failed";
      item.error = e.message;
    }
  }
  renderConversation();
}

function outboxItem(item) {
  const retry = h("button", { type: "button", class: "secondary retry", onclick: () => deliver(item) }, "Retry");
  const meta = { sending: ["sending…"], late: ["not confirmed yet — ", retry],
    failed: [`not sent (${item.error}) — `, retry] }[item.state];
  return h("li", { class: `msg user pending ${item.state}`, "data-client-msg-id": item.id }, item.text,
    sentFiles(item.files), h("span", { class: "meta" }, ...meta));
}

// A failed orchestrator turn: status, reason, the messages it carried, what the harness does, and Retry
// (POST /api/threads/{id}/retry) while no later run repeats it.
function turnFailed(e, key) {
  const p = e.payload || {};
  const rerun = e.retried_by || [...S.conv.values()].some((x) => x.event_type === "task.dispatch_requested"
    && x.payload && x.payload.retry_of === e.task_id);
  const what = { retry_same: "running it again", back_off: `running it again in ${Math.round(p.delay_s || 0)} s`,
    escalate: "asking you in Asks", skip: "leaving it to you" }[p.action] || p.action;
  const error = h("span", { class: "error", role: "alert" });
  let retry = null;
  if (p.retry && !rerun) {
    retry = h("button", { type: "button", class: "secondary", onclick: async () => {
      retry.disabled = true;
      try { await api(p.retry.path, { method: p.retry.method || "POST", body: p.retry.body || {} }); retry.textContent = "Retry queued"; }
      catch (err) { error.textContent = err.message; retry.disabled = false; }
    } }, "Retry");
  }
  return h("li", { class: "msg note error turn-failed", ...key },
    h("div", {}, h("span", { class: "title" }, "The turn failed"), " ", chip(p.status || "failed"),
      ` ${p.reason || ""} — attempt ${p.attempt || 1}, ${what}`),
    p.messages ? h("details", {}, h("summary", {}, "its messages"), h("pre", {}, p.messages)) : null,
    retry, error);
}
