// petal-dispatch web client: a live view over the store. Everything shown is read through the API and
// kept current by the SSE journal stream (resumed by Last-Event-ID); nothing here is a source of truth.
// User-supplied text is only ever set as text; markdown goes through marked (raw HTML escaped, links
// other than http/https/mailto left as text) and then DOMPurify before it touches innerHTML. HTML option
// previews go into a sandboxed iframe that may not run scripts. The server's CSP allows no inline script.
import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";

// an allow-list on the raw string: "java\tscript:" or " javascript:" match nothing here
const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;
const markdown = new Marked({ gfm: true, breaks: true, async: false });
markdown.use({ renderer: {
  html: (token) => escapeHtml(token.text ?? token.raw ?? ""),
  link: (token) => (SAFE_URL.test(token.href ?? "") ? false : escapeHtml(token.raw ?? token.text ?? "")),
  // remote images would be blocked by the CSP anyway: a link to the image instead
  image: (token) => (SAFE_URL.test(token.href ?? "")
    ? `<a href="${escapeHtml(token.href)}">${escapeHtml(token.text || token.href)}</a>` : escapeHtml(token.raw ?? "")),
} });
const PURIFY = { ALLOWED_URI_REGEXP: SAFE_URL, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
  FORBID_ATTR: ["style"] };
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
// what an HTML mock-up may do inside its frame: show itself, with inline styles and inline images
const PREVIEW_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'";

const TABS = ["chat", "tasks", "asks", "activity", "context"];
const FEED_MAX = 2000;
const FINAL = new Set(["success", "failed", "crashed", "cancelled", "rate_limited", "partial", "skipped", "gated",
  "extraction_failed"]);

const S = {
  info: null,
  threads: [],
  defaultThread: null,
  thread: localStorage.getItem("petal.thread"),
  tasks: new Map(),          // id → task row (recent, all threads)
  threadTasks: new Set(),    // ids of the focused thread's turns and workers
  conv: new Map(),           // event_id → event, the focused thread's chat records
  convTypes: new Set(),
  queue: [],                 // the focused thread's undelivered messages
  asks: [],                  // pending questions, all threads
  feed: [],                  // the Activity feed (newest last, bounded)
  lastSeq: 0,
  conn: "connecting",
  detail: null,              // the task shown in Tasks, with its events
};

// ---- small helpers -------------------------------------------------------------------------------------

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function md(text) {
  const div = h("div", { class: "md" });
  div.innerHTML = DOMPurify.sanitize(markdown.parse(String(text ?? "")), PURIFY);
  return div;
}

// An option preview: markdown, or (when it starts with a tag) an HTML mock-up shown in a frame that is
// sandboxed without allow-scripts (no script, no same-origin access, no forms, no popups) with its own CSP.
function preview(text) {
  const value = String(text ?? "");
  if (!/^\s*</.test(value)) return md(value);
  const frame = h("iframe", { class: "html-preview", sandbox: "", referrerpolicy: "no-referrer",
    title: "HTML preview", loading: "lazy" });
  frame.srcdoc = `<!doctype html><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="${PREVIEW_CSP}">${value}`;
  return frame;
}

const $ = (sel) => document.querySelector(sel);
const short = (id) => String(id ?? "").slice(0, 8);
const firstLine = (s, n = 120) => { const l = String(s ?? "").split("\n")[0]; return l.length > n ? l.slice(0, n) + "…" : l; };
const when = (t) => (t ? new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : "");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(path, options = {}) {
  const init = { ...options, headers: { accept: "application/json", ...(options.headers || {}) } };
  if (options.body !== undefined && typeof options.body !== "string") {
    init.body = JSON.stringify(options.body);
    init.headers["content-type"] = "application/json";
  }
  const r = await fetch(path, init);
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : null;
  if (!r.ok) throw new Error(data?.detail || data?.title || `${r.status} ${r.statusText}`);
  return data;
}

// coalesces refreshes asked for in a burst (one wake-up per kind per frame)
const pending = new Map();
function soon(name, fn, ms = 150) {
  if (pending.has(name)) return;
  pending.set(name, setTimeout(async () => { pending.delete(name); try { await fn(); } catch (e) { console.warn(name, e); } }, ms));
}

// ---- loading ---------------------------------------------------------------------------------------------

async function loadThreads() {
  const [data, projects] = await Promise.all([api("/api/threads"), api("/api/projects").catch(() => null)]);
  S.projects = projects?.projects || [];
  S.defaultThread = data.default_thread_id;
  S.threads = data.threads.filter((t) => t.lifecycle !== "archived");
  if (!S.threads.some((t) => t.id === S.defaultThread)) {
    S.threads.push({ id: S.defaultThread, title: "Default", mode: "interactive", lifecycle: "new" });
  }
  // first visit (or a thread that is gone): the most recent thread (the list is newest first)
  if (!S.thread || (!data.threads.some((t) => t.id === S.thread) && S.thread !== S.defaultThread)) {
    S.thread = S.threads[0]?.id || S.defaultThread;
  }
  renderThreadPicker();
}

async function loadTasks() {
  const [all, mine] = await Promise.all([api("/api/tasks?limit=200"), api(`/api/tasks?limit=500&thread_id=${S.thread}`)]);
  S.tasks = new Map(all.tasks.map((t) => [t.id, t]));
  for (const t of mine.tasks) S.tasks.set(t.id, t);
  S.threadTasks = new Set(mine.tasks.map((t) => t.id));
  renderTasks(); renderTurnStatus(); renderConversation();
  if (S.detail) loadDetail(S.detail.id, false);
}

async function loadConversation() {
  const data = await api(`/api/threads/${S.thread}/conversation?limit=300`);
  S.convTypes = new Set(data.types);
  S.conv = new Map(data.events.map((e) => [e.event_id, e]));
  renderConversation();
}

async function loadQueue() {
  S.queue = (await api(`/api/queue?thread_id=${S.thread}`)).pending;
  renderConversation();
}

async function loadAsks() {
  S.asks = (await api("/api/asks?status=pending&limit=100")).asks;
  renderAsks();
}

async function loadContext() {
  if (currentTab() !== "context") return;
  const c = await api(`/api/context?thread_id=${S.thread}`);
  const [project, usage] = await Promise.all([
    c.thread?.project_id ? api(`/api/projects/${c.thread.project_id}`).catch(() => null) : null,
    api(`/api/usage?by=thread&thread_id=${S.thread}`).catch(() => null)]);
  c.usage = usage?.total;
  renderContext(c, project);
}

async function loadFeed() {
  const after = Math.max(0, (S.info?.journal_head ?? 0) - 200);
  const data = await api(`/api/events?after_seq=${after}&limit=200`);
  S.feed = data.events.filter((e) => e.event_type !== "stream.stream_event");
  renderFeed();
}

async function focusThread(id) {
  S.thread = id;
  presence();
  localStorage.setItem("petal.thread", id);
  S.conv = new Map(); S.queue = [];
  renderThreadPicker();
  await Promise.all([loadTasks(), loadConversation(), loadQueue()]);
  renderAsks();
  loadContext();
}

// ---- the live stream ---------------------------------------------------------------------------------------

function setConn(state) {
  S.conn = state;
  const el = $("#conn");
  el.dataset.state = state;
  el.textContent = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", offline: "offline" }[state];
}

async function stream() {
  let delay = 500;
  let dropped = false;
  for (;;) {
    setConn(dropped ? "reconnecting" : "connecting");
    try {
      const r = await fetch("/api/stream", {
        headers: { accept: "text/event-stream", "Last-Event-ID": String(S.lastSeq) }, cache: "no-store",
      });
      if (!r.ok || !r.body) throw new Error(`stream ${r.status}`);
      setConn("live");
      delay = 500;
      if (dropped) refreshAll(); // wake-ups are not replayed: re-read the views (journal events are)
      await readStream(r.body);
    } catch (e) {
      console.warn("stream", e);
    }
    dropped = true;
    setConn(navigator.onLine === false ? "offline" : "reconnecting");
    await sleep(delay);
    delay = Math.min(delay * 2, 8000);
  }
}

async function readStream(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    // events end with a blank line; the server may use CRLF
    let m;
    while ((m = /\r\n\r\n|\n\n|\r\r/.exec(buf))) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      onFrame(block);
    }
  }
}

function onFrame(block) {
  let id = null, event = "message", data = "";
  for (const line of block.split(/\r\n|\n|\r/)) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data += (data ? "\n" : "") + value;
  }
  if (!data) return;
  let payload;
  try { payload = JSON.parse(data); } catch { return; }
  if (id !== null) {
    const seq = Number(id);
    if (seq <= S.lastSeq) return; // already seen (a replay overlapping the initial load)
    S.lastSeq = seq;
    onEvent(payload);
  } else {
    onWake(event, payload);
  }
}

function onWake(kind) {
  if (kind === "queue") { soon("queue", loadQueue); soon("threads", loadThreads, 300); }
  else if (kind === "question") soon("asks", loadAsks);
  else if (kind === "task") soon("tasks", loadTasks, 300);
  soon("context", loadContext, 500);
}

function belongs(e) {
  if (e.session_id === S.thread) return true;
  if (e.task_id && S.threadTasks.has(e.task_id)) return true;
  if (e.event_type === "task.dispatch_requested") {
    const p = e.payload || {};
    if (S.threadTasks.has(p.parent_task_id) || S.threadTasks.has(p.retry_of)) { S.threadTasks.add(e.task_id); return true; }
  }
  return false;
}

function onEvent(e) {
  if (e.event_type === "stream.stream_event") return;
  if (!S.feed.length || e.seq > S.feed[S.feed.length - 1].seq) S.feed.push(e); // a replay may overlap the first load
  if (S.feed.length > FEED_MAX) S.feed.splice(0, S.feed.length - FEED_MAX);
  if (currentTab() === "activity") appendFeed(e);
  if (S.convTypes.has(e.event_type) && belongs(e)) {
    S.conv.set(e.event_id, e);
    if (e.event_type === "task.user_message" || e.event_type === "thread.harness_message") {
      S.queue = S.queue.filter((q) => q.id !== e.message_id);
    }
    soon("render-conv", renderConversation, 30);
  } else if (e.task_id && !S.tasks.has(e.task_id) && e.event_type.startsWith("task.")) {
    soon("tasks", loadTasks, 300); // a task we have not seen: maybe this thread's
  }
  if (e.event_type.startsWith("task.") || e.event_type === "handoff" || e.event_type === "policy.decision") soon("tasks", loadTasks, 300);
  if (e.event_type.startsWith("question.")) soon("asks", loadAsks);
  if (e.event_type.startsWith("thread.")) soon("threads", loadThreads);
  if (S.detail && e.task_id === S.detail.id) { S.detail.events.push(e); soon("detail", renderDetail, 50); }
}

async function refreshAll() {
  await Promise.allSettled([loadThreads(), loadTasks(), loadConversation(), loadQueue(), loadAsks(), loadContext()]);
}

// ---- tabs --------------------------------------------------------------------------------------------------

function currentTab() {
  const t = location.hash.replace(/^#/, "").split("/")[0];
  return TABS.includes(t) ? t : t === "task" ? "tasks" : "chat";
}

function showTab() {
  const tab = currentTab();
  const [head, arg] = location.hash.replace(/^#/, "").split("/");
  if (head === "chat" && arg && arg !== S.thread) { // a notification's link to a thread
    history.replaceState(null, "", "#chat");
    focusThread(arg);
  }
  for (const t of TABS) {
    $(`#view-${t}`).hidden = t !== tab;
    const link = document.querySelector(`.tabs a[data-tab="${t}"]`);
    if (t === tab) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  const [, taskId] = location.hash.replace(/^#/, "").split("/");
  if (location.hash.startsWith("#task/") && taskId) loadDetail(taskId, true);
  else if (tab === "tasks") { S.detail = null; $("#task-detail").hidden = true; }
  if (tab === "activity") renderFeed();
  if (tab === "context") loadContext();
  if (tab === "chat") scrollChat(true);
  presence();
}

// ---- threads -----------------------------------------------------------------------------------------------

function threadName(t) { return t.title || (t.id === S.defaultThread ? "Default" : `Thread ${short(t.id)}`); }

function renderThreadPicker() {
  const sel = $("#thread-picker");
  sel.replaceChildren(...S.threads.map((t) => h("option", { value: t.id, selected: t.id === S.thread },
    threadName(t) + (t.pending ? " (creating…)" : ""))));
  const t = S.threads.find((x) => x.id === S.thread);
  const project = t?.project_id ? (S.projects || []).find((p) => p.id === t.project_id) : null;
  $("#thread-title").textContent = t ? threadName(t) + (project ? ` · ${project.slug}` : "") : "";
  $("#thread-mode").value = t?.mode || "interactive";
}

async function newThread() {
  const title = prompt("Name the new thread", "");
  if (title === null) return;
  let project = null;  // a project thread's turns know the project; its workers run in its repository
  if (S.projects?.length) {
    const slug = prompt(`Project of this thread (${S.projects.map((p) => p.slug).join(", ")}; empty for none)`, "");
    if (slug === null) return;
    project = S.projects.find((p) => p.slug === slug.trim()) || null;
    if (slug.trim() && !project) { alert(`No project ${slug.trim()}`); return; }
  }
  const made = await api("/api/threads", { method: "POST", body: { title: title || null, mode: "interactive",
    ...(project ? { project_id: project.id } : {}) } });
  await loadThreads();
  await focusThread(made.thread_id);
  location.hash = "#chat";
}

async function changeMode(mode) {
  await api(`/api/threads/${S.thread}`, { method: "PATCH", body: { mode } });
}

// ---- chat --------------------------------------------------------------------------------------------------

function chip(status) { return h("span", { class: `chip ${status}` }, status.replace("_", " ")); }

function taskState(t) {
  if (!t) return "pending";
  if (t.status === "running" && t.activity && t.activity !== "running") return t.activity;
  return t.status;
}

function renderRecord(e) {
  const p = e.payload || {};
  const key = { "data-event-id": e.event_id };
  switch (e.event_type) {
    case "task.user_message":
      return h("li", { class: "msg user", ...key }, p.text);
    case "thread.harness_message":
      return h("li", { class: "msg note", ...key }, h("details", {}, h("summary", {}, "the harness told the orchestrator"),
        h("pre", {}, p.text)));
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
    case "task.stalled":
      return h("li", { class: "msg note error", ...key }, `A task went silent (${Math.round(p.silent_s)} s): `,
        h("a", { href: `#task/${e.task_id}` }, short(e.task_id)));
    case "thread.created":
      return h("li", { class: "msg note", ...key }, `Thread started (${p.mode || "interactive"})`);
    case "thread.mode_changed":
      return h("li", { class: "msg note", ...key }, `Mode: ${p.mode}`);
    default:
      return null;
  }
}

function atBottom() { return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80; }
function scrollChat(force) { if (force || S.stick) window.scrollTo(0, document.body.scrollHeight); }

function renderConversation() {
  S.stick = atBottom();
  const items = [...S.conv.values()].sort((a, b) => a.seq - b.seq).map(renderRecord).filter(Boolean);
  for (const q of S.queue) {
    items.push(h("li", { class: "msg user pending", "data-queue-id": q.id },
      q.origin === "harness" ? "(harness report) " + firstLine(q.text) : q.text,
      h("span", { class: "meta" }, q.status === "pending" ? "pending — delivered at the next turn boundary" : "delivering…")));
  }
  if (!items.length) items.push(h("li", { class: "empty" }, "Nothing here yet. Say what you want done; the orchestrator plans it and dispatches workers."));
  $("#messages").replaceChildren(...items);
  renderTurnStatus();
  scrollChat(false);
}

function renderTurnStatus() {
  const turn = [...S.tasks.values()].find((t) => t.session_id === S.thread && t.role === "orchestrator"
    && (t.status === "running" || t.status === "pending"));
  const el = $("#turn-status");
  el.hidden = !turn;
  if (turn) el.textContent = turn.activity === "awaiting_user" ? "The orchestrator is waiting for your answer"
    : turn.activity === "stalled" ? "The orchestrator's turn is stalled" : "The orchestrator is working…";
}

async function send(ev) {
  ev.preventDefault();
  const box = $("#composer-text");
  const text = box.value.trim();
  if (!text) return;
  const button = ev.target.querySelector("button");
  button.disabled = true;
  try {
    const queued = await api("/api/chat", { method: "POST", body: { text, thread_id: S.thread, client_msg_id: crypto.randomUUID() } });
    box.value = "";
    if (!S.queue.some((q) => q.id === queued.id) && ![...S.conv.values()].some((e) => e.message_id === queued.id)) {
      S.queue.push({ ...queued, text, status: queued.status || "pending" });
    }
    renderConversation();
    scrollChat(true);
  } catch (e) {
    alert(`Not sent: ${e.message}`);
  } finally {
    button.disabled = false;
  }
}

// ---- asks --------------------------------------------------------------------------------------------------

function askThread(a) { return a.thread_scope; }

// Cards are kept by ask id across re-renders, so a wake-up never wipes a half-filled answer.
const cardCache = { list: new Map(), pinned: new Map() };

function cardsFor(asks, cache) {
  const keep = new Set(asks.map((a) => a.id));
  for (const id of cache.keys()) if (!keep.has(id)) cache.delete(id);
  return asks.map((a) => { if (!cache.has(a.id)) cache.set(a.id, askCard(a)); return cache.get(a.id); });
}

function renderAsks() {
  const count = S.asks.length;
  const badge = $("#ask-count");
  badge.hidden = count === 0;
  badge.textContent = String(count);
  const scoped = $("#asks-scope").checked;
  const mine = S.asks.filter((a) => askThread(a) === S.thread || S.threadTasks.has(a.task_id));
  const cards = cardsFor(scoped ? mine : S.asks, cardCache.list);
  $("#ask-cards").replaceChildren(...(cards.length ? cards : [h("p", { class: "empty" },
    scoped ? "No questions wait on this thread." : "No questions are waiting. When Claude needs you, they land here.")]));
  $("#pinned-asks").replaceChildren(...cardsFor(mine, cardCache.pinned));
}

function askCard(a) {
  const form = h("form", { class: "ask", "data-ask-id": a.id });
  const thread = S.threads.find((t) => t.id === askThread(a));
  form.append(h("div", { class: "from" }, a.asked_by === "harness" ? "The harness asks" : "Claude asks",
    thread ? ` · ${threadName(thread)}` : "", a.task_id ? [" · ", h("a", { href: `#task/${a.task_id}` }, `task ${short(a.task_id)}`)] : null));
  a.questions.forEach((q, qi) => {
    const name = `${a.id}-${qi}`;
    const fieldset = h("fieldset", { class: "question", "data-question": q.question });
    fieldset.append(h("legend", { class: "header" }, q.header || "Question"), h("p", { class: "q" }, q.question));
    const options = h("div", { class: "options", role: q.multiSelect ? "group" : "radiogroup" });
    for (const o of q.options) {
      // the preview sits beside the label, so opening it never toggles the choice
      options.append(h("div", { class: "option" },
        h("label", {},
          h("input", { type: q.multiSelect ? "checkbox" : "radio", name, value: o.label }),
          h("span", {}, h("span", { class: "label" }, o.label), o.description ? h("span", { class: "desc" }, o.description) : null)),
        o.preview ? h("details", { class: "preview" }, h("summary", {}, "preview"), preview(o.preview)) : null));
    }
    fieldset.append(options, h("input", { class: "other", name: `${name}-other`, placeholder: "Other (type your own answer)",
      "aria-label": `Other answer to: ${q.question}` }));
    form.append(fieldset);
  });
  const error = h("p", { class: "error", role: "alert" });
  form.append(h("div", { class: "actions" },
    h("button", { type: "submit" }, "Submit"),
    h("input", { class: "reply", name: "reply", placeholder: "…or dismiss with a reply", "aria-label": "Reply instead" }),
    h("button", { type: "button", class: "secondary", onclick: () => dismiss(a, form, error) }, "Dismiss")), error);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); answer(a, form, error); });
  return form;
}

async function answer(a, form, error) {
  const answers = {};
  a.questions.forEach((q, qi) => {
    const name = `${a.id}-${qi}`;
    const other = form.querySelector(`[name="${name}-other"]`).value.trim();
    const picked = [...form.querySelectorAll(`input[name="${name}"]:checked`)].map((i) => i.value);
    if (q.multiSelect) {
      const values = [...picked, ...(other ? [{ other }] : [])];
      if (values.length) answers[q.question] = values;
    } else if (other) answers[q.question] = { other };
    else if (picked.length) answers[q.question] = picked[0];
  });
  if (!Object.keys(answers).length) { error.textContent = "Choose an option or type an answer."; return; }
  const reply = form.querySelector('[name="reply"]').value.trim();
  await submitAnswer(a, { answers, ...(reply ? { response: reply } : {}) }, form, error);
}

async function dismiss(a, form, error) {
  const reply = form.querySelector('[name="reply"]').value.trim();
  if (reply) await submitAnswer(a, { response: reply }, form, error);
  else {
    try { await api(`/api/asks/${a.id}`, { method: "DELETE" }); removeAsk(a.id); } catch (e) { error.textContent = e.message; }
  }
}

async function submitAnswer(a, body, form, error) {
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  try {
    await api(`/api/asks/${a.id}/answer`, { method: "POST", body });
    removeAsk(a.id);
  } catch (e) {
    error.textContent = e.message;
    for (const b of form.querySelectorAll("button")) b.disabled = false;
    soon("asks", loadAsks);
  }
}

function removeAsk(id) { S.asks = S.asks.filter((x) => x.id !== id); renderAsks(); }

// ---- tasks -------------------------------------------------------------------------------------------------

function renderTasks() {
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
      h("span", { class: "brief" }, firstLine(t.brief)), h("span", { class: "role" }, when(t.created_at)))));
  $("#task-list").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No tasks yet. Workers appear here the moment they are dispatched.")]));
}

async function loadDetail(id, fresh) {
  if (fresh || !S.detail || S.detail.id !== id) {
    S.detail = { id, task: null, events: [], handoff: null };
  }
  const [task, events, handoffs] = await Promise.all([api(`/api/tasks/${id}`), api(`/api/tasks/${id}/events?limit=1000`),
    api(`/api/handoffs?scope_id=${id}&limit=1`)]);
  // a project worker's recorded changes (404: not a project worker; 409: not recorded yet) and its usage
  const [changes, usage] = await Promise.all([api(`/api/tasks/${id}/diff`).catch(() => null),
    api(`/api/usage?by=task&task_id=${id}`).catch(() => null)]);
  if (!S.detail || S.detail.id !== id) return;
  S.detail.changes = changes;
  S.detail.usage = usage?.total || null;
  S.detail.task = task;
  S.detail.events = events.events;
  S.detail.handoff = handoffs.handoffs.find((x) => x.task_id === id)?.payload || null;
  renderDetail();
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
      if (b.type === "tool_use") return h("li", {}, h("details", {}, h("summary", {}, kind, `tool call: ${b.name}`),
        h("pre", {}, JSON.stringify(b.input, null, 2))));
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

function renderDetail() {
  const d = S.detail;
  const box = $("#task-detail");
  if (!d || !d.task) { box.hidden = true; return; }
  const t = d.task;
  const live = t.status === "running" || t.status === "pending";
  box.hidden = false;
  box.replaceChildren(
    h("a", { href: "#tasks" }, "← all tasks"),
    h("h2", {}, `${t.role} ${short(t.id)} `, chip(taskState(t))),
    h("dl", {},
      h("dt", {}, "brief"), h("dd", {}, h("details", {}, h("summary", {}, firstLine(t.brief)), h("pre", {}, t.brief))),
      h("dt", {}, "reason"), h("dd", {}, t.status_reason || "—"),
      h("dt", {}, "attempt"), h("dd", {}, String(t.attempt)),
      h("dt", {}, "last output"), h("dd", {}, t.last_output_at ? new Date(t.last_output_at).toLocaleString() : "—")),
    live ? h("button", { type: "button", class: "danger", onclick: () => stopTask(t.id) }, "Stop") : "",
    d.usage?.runs ? h("p", { class: "usage" }, `${d.usage.input_tokens + d.usage.output_tokens} tokens · $${d.usage.cost_usd.toFixed(4)}`) : "",
    h("h3", {}, "Handoff"), renderHandoff(d.handoff),
    d.changes ? renderChanges(t, d.changes) : "",
    h("h3", {}, `Events (${d.events.length})`),
    h("ol", { class: "events" }, d.events.flatMap((e) => renderEvent(e))));
}

// ---- a project worker's changes: files, the diff, Merge / Discard -----------------------------------------

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
  const open = !c.review && !c.error;
  const into = c.base_branch || "the project's branch";
  return h("section", { class: "changes" },
    h("h3", {}, `Changes on ${c.branch}`, c.review ? [" ", chip(c.review)] : null),
    c.error ? h("p", { class: "error" }, c.error) : null,
    h("ul", { class: "files" }, files.length ? files.map((f) => h("li", {}, h("code", {}, f.path),
      ` +${f.added ?? "bin"} −${f.deleted ?? "bin"}`)) : h("li", { class: "empty" }, "no changes")),
    open ? h("div", { class: "actions" },
      h("button", { type: "button", onclick: () => reviewTask(t.id, "merge", `Merge ${c.branch} into ${into}?`) }, `Merge into ${into}`),
      h("button", { type: "button", class: "danger", onclick: () => reviewTask(t.id, "discard", `Discard ${c.branch}? The branch is deleted.`) }, "Discard")) : null,
    h("p", { class: `review-result${S.detail?.note?.error ? " error" : ""}`, id: "review-result" }, S.detail?.note?.text || ""),
    c.diff ? h("details", { open: files.length <= 10 }, h("summary", {}, "diff"), renderDiff(c.diff)) : null);
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
        if (r.status === "done") await loadDetail(id, false);  // the branch is merged or gone now
        note(r.status === "done" ? `${action} done` : `${action} failed: ${r.error}`, r.status !== "done");
        return;
      }
      await sleep(500);
    }
  } catch (e) { note(e.message, true); }
}

async function stopTask(id) {
  if (!confirm("Stop this task? Its process gets SIGTERM, then SIGKILL after the grace period.")) return;
  try { await api(`/api/tasks/${id}/stop`, { method: "POST", body: { reason: "stopped from the web client" } }); }
  catch (e) { alert(e.message); }
}

// ---- activity ----------------------------------------------------------------------------------------------

function feedMatches(e) {
  const tier = $("#filter-tier").value, type = $("#filter-type").value.trim(), task = $("#filter-task").value.trim();
  return (!tier || e.tier === tier) && (!type || e.event_type.includes(type)) && (!task || String(e.task_id || "").startsWith(task));
}

function feedItem(e) {
  return h("li", { class: e.tier },
    h("span", { class: "seq" }, `#${e.seq} ${when(e.created_at)} `), `${e.event_type} `,
    e.task_id ? h("a", { href: `#task/${e.task_id}` }, short(e.task_id)) : null, " ",
    firstLine(JSON.stringify(e.payload), 160));
}

function renderFeed() {
  const items = S.feed.filter(feedMatches).slice(-500).reverse().map(feedItem);
  $("#feed").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No events match. New ones appear here live.")]));
}

function appendFeed(e) { if (feedMatches(e)) { $("#feed").prepend(feedItem(e)); $("#feed .empty")?.remove(); } }

// ---- context -----------------------------------------------------------------------------------------------

function renderProject(p) {
  if (!p) return [];
  const u = p.usage || {};
  const run = (t) => t.latest ? [chip(t.latest.status), " ", h("a", { href: `#task/${t.latest.task_id}` }, short(t.latest.task_id))]
    : [h("span", { class: "chip" }, t.checked ? "checked" : "not started")];
  return [
    h("h3", {}, `Project ${p.slug}`),
    h("p", {}, h("code", {}, p.workdir), ` · ${(u.input_tokens || 0) + (u.output_tokens || 0)} tokens · $${(u.cost_usd || 0).toFixed(4)}`),
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
      c.usage?.runs ? ` · ${c.usage.input_tokens + c.usage.output_tokens} tokens · $${c.usage.cost_usd.toFixed(4)}` : ""),
    h("h3", {}, "Current turn"),
    turn ? h("p", {}, chip(taskState(turn)), " ", firstLine(turn.brief)) : h("p", { class: "empty" }, "No turn is running."),
    ...section("Pending messages", c.pending_messages, (m) => firstLine(m.text), "None waiting."),
    ...section("Running workers", c.running_workers, (w) => [chip(taskState(w)), " ", h("a", { href: `#task/${w.id}` }, firstLine(w.brief))], "None running."),
    ...section("Recent handoffs", c.recent_handoffs, (x) => [chip(x.payload.status || "success"), " ", x.payload.current_state || x.payload.goal || ""], "No handoffs yet."),
    ...section("Questions waiting", c.pending_asks, (a) => a.questions[0]?.question || "", "None."),
    ...renderProject(project));
}


// ---- notifications -----------------------------------------------------------------------------------------
// Web Push: the service worker registers on load (it only shows notifications); the browser subscribes
// only after the user presses "Turn on". The page states what is true: off, on, blocked, unsupported.

const pushSupported = () => "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;

function b64urlToBytes(s) {
  const raw = atob((s + "=".repeat((4 - (s.length % 4)) % 4)).replace(/-/g, "+").replace(/_/g, "/"));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

async function registration() {
  return navigator.serviceWorker.register("/sw.js", { scope: "/" }).then(() => navigator.serviceWorker.ready);
}

async function notifyState() {
  if (!pushSupported()) return { state: "unsupported" };
  if (Notification.permission === "denied") return { state: "blocked" };
  const reg = await registration();
  const sub = await reg.pushManager.getSubscription();
  if (!sub) return { state: "off", reg };
  const info = await api(`/api/push?endpoint=${encodeURIComponent(sub.endpoint)}`);
  return { state: info.subscribed ? "on" : "off", reg, sub, info };
}

async function renderNotify() {
  let st;
  try { st = await notifyState(); } catch (e) { st = { state: "error", error: e.message }; }
  S.notify = st.state;
  $("#notify-state").textContent = { on: "on", off: "off", blocked: "blocked", unsupported: "unsupported", error: "error" }[st.state];
  document.body.dataset.notify = st.state;
  $("#notify-explain").textContent = {
    on: "This browser gets a notification when Claude asks you something, a worker stalls or needs a decision, and when a reply lands while you are not looking.",
    off: "Turn on to be told when Claude needs you, even with this page closed.",
    blocked: "The browser blocks notifications for this site: allow them in its site settings, then come back.",
    unsupported: "This browser cannot receive Web Push (on iPhone: add the page to the home screen first).",
    error: `Could not read the notification state: ${st.error}`,
  }[st.state];
  $("#notify-enable").hidden = st.state !== "off";
  $("#notify-disable").hidden = st.state !== "on";
  $("#notify-test").hidden = st.state !== "on";
}

async function enableNotify() {
  const result = $("#notify-result");
  const permission = await Notification.requestPermission();
  if (permission !== "granted") { result.textContent = "Not allowed by the browser."; return renderNotify(); }
  const info = await api("/api/push");
  if (!info.public_key) { result.textContent = "The executor has not published its push key yet."; return; }
  const reg = await registration();
  const sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: b64urlToBytes(info.public_key) });
  await api("/api/push/subscriptions", { method: "POST", body: sub.toJSON() });
  result.textContent = "Notifications are on.";
  await renderNotify();
}

async function disableNotify() {
  const reg = await registration();
  const sub = await reg.pushManager.getSubscription();
  if (sub) {
    await api("/api/push/subscriptions", { method: "DELETE", body: { endpoint: sub.endpoint } }).catch(() => null);
    await sub.unsubscribe();
  }
  $("#notify-result").textContent = "Notifications are off.";
  await renderNotify();
}

async function testNotify() {
  await api("/api/push/test", { method: "POST", body: {} });
  $("#notify-result").textContent = "Test sent: it should arrive in a few seconds.";
}

// Presence: which thread this page is looking at, so a reply you are watching is not also pushed.
const clientId = localStorage.getItem("petal.client") || (() => {
  const id = crypto.randomUUID(); localStorage.setItem("petal.client", id); return id;
})();

function presence() {
  const watching = document.visibilityState === "visible" && currentTab() === "chat" ? S.thread : null;
  api("/api/presence", { method: "POST", body: { client_id: clientId, thread_id: watching } }).catch(() => null);
}

// ---- start -------------------------------------------------------------------------------------------------

async function start() {
  $("#composer").addEventListener("submit", send);
  $("#composer-text").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) $("#composer").requestSubmit();
  });
  $("#thread-picker").addEventListener("change", (ev) => focusThread(ev.target.value));
  $("#thread-mode").addEventListener("change", (ev) => changeMode(ev.target.value).catch((e) => alert(e.message)));
  $("#new-thread").addEventListener("click", () => newThread().catch((e) => alert(e.message)));
  $("#asks-scope").addEventListener("change", renderAsks);
  $("#feed-filter").addEventListener("input", renderFeed);
  window.addEventListener("hashchange", showTab);
  $("#notify-button").addEventListener("click", () => {
    const panel = $("#notify-panel");
    panel.hidden = !panel.hidden;
    $("#notify-button").setAttribute("aria-expanded", String(!panel.hidden));
  });
  const guard = (fn) => () => fn().catch((e) => { $("#notify-result").textContent = `Failed: ${e.message}`; renderNotify(); });
  $("#notify-enable").addEventListener("click", guard(enableNotify));
  $("#notify-disable").addEventListener("click", guard(disableNotify));
  $("#notify-test").addEventListener("click", guard(testNotify));
  document.addEventListener("visibilitychange", presence);
  setInterval(presence, 20_000);
  window.addEventListener("offline", () => setConn("offline"));
  S.info = await api("/api/info");
  $("#demo").hidden = !S.info.demo;
  S.lastSeq = S.info.journal_head; // views load next; the stream replays anything after this point
  await loadThreads();
  await Promise.all([loadTasks(), loadConversation(), loadQueue(), loadAsks(), loadFeed()]);
  showTab();
  document.body.dataset.ready = "1";
  stream();
  renderNotify();
}

start().catch((e) => {
  setConn("offline");
  document.body.dataset.ready = "error";
  $("#messages").replaceChildren(h("li", { class: "msg note error" }, `Could not load: ${e.message}`));
});
