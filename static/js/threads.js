// Threads: the picker, a new thread, the mode, and focusing a thread (which re-reads its views).
import { api } from "./api.js";
import { renderAsks } from "./asks.js";
import { loadConversation, loadQueue } from "./chat.js";
import { loadContext } from "./context.js";
import { $, h } from "./dom.js";
import { presence, renderMute } from "./notify.js";
import { renderHandback } from "./sessions.js";
import { S, threadName } from "./state.js";
import { loadTasks } from "./tasks.js";

export async function loadThreads() {
  const [data, projects] = await Promise.all([api("/api/threads"), api("/api/projects").catch(() => null)]);
  S.projects = projects?.projects || [];
  S.defaultThread = data.default_thread_id;
  S.threads = data.threads.filter((t) => t.lifecycle !== "archived");
  S.threadsBefore = data.next_before;  // older threads are a page away
  // the thread this page was on, when it is older than the first page: fetched alone
  if (S.thread && S.threadsBefore && !data.threads.some((t) => t.id === S.thread)) {
    const one = await api(`/api/threads/${S.thread}`).catch(() => null);
    if (one && one.lifecycle !== "archived") { S.threads.push(one); data.threads.push(one); }
  }
  if (!S.threads.some((t) => t.id === S.defaultThread)) {
    S.threads.push({ id: S.defaultThread, title: "Default", mode: "interactive", lifecycle: "new" });
  }
  // first visit (or a thread that is gone): the most recent thread (the list is newest first)
  if (!S.thread || (!data.threads.some((t) => t.id === S.thread) && S.thread !== S.defaultThread)) {
    S.thread = (S.threads.find((t) => !t.routine_id) || S.threads[0])?.id || S.defaultThread;
  }
  renderThreadPicker();
}

// Routine runs each have a thread: listed apart, the newest few (and the one shown), not among the threads
// the user keeps; the Routines view's history reaches every run.
const ROUTINE_RUNS_LISTED = 10;

export function renderThreadPicker() {
  const sel = $("#thread-picker");
  const option = (t) => h("option", { value: t.id, selected: t.id === S.thread },
    threadName(t) + (t.pending ? " (creating…)" : ""));
  const runs = S.threads.filter((t) => t.routine_id);
  const listed = runs.filter((t, i) => i < ROUTINE_RUNS_LISTED || t.id === S.thread);
  sel.replaceChildren(...S.threads.filter((t) => !t.routine_id).map(option),
    ...(S.threadsBefore ? [h("option", { value: OLDER }, "Older threads…")] : []),
    ...(listed.length ? [h("optgroup", { label: "Routine runs" }, ...listed.map(option))] : []));
  $("#thread-names").replaceChildren(...S.threads.map((t) => h("option", { value: threadName(t) })));
  const t = S.threads.find((x) => x.id === S.thread);
  const project = t?.project_id ? (S.projects || []).find((p) => p.id === t.project_id) : null;
  $("#thread-title").textContent = t ? threadName(t) + (project ? ` · ${project.slug}` : "") : "";
  $("#thread-mode").value = t?.mode || "interactive";
  renderHandback();
}

// The picker's last entry while older threads are not loaded: choosing it loads the next page.
const OLDER = "older";

export async function pickThread(id) {
  if (id !== OLDER) return focusThread(id);
  const data = await api(`/api/threads?before=${encodeURIComponent(S.threadsBefore)}`);
  S.threads.push(...data.threads.filter((t) => t.lifecycle !== "archived" && !S.threads.some((x) => x.id === t.id)));
  S.threadsBefore = data.next_before;
  renderThreadPicker();
}

// A thread named by a link (#thread/<id>, #chat/<id>): focused when it exists; one that does not is said to be
// missing, with the id, instead of showing an empty conversation or another thread.
export async function openThread(id) {
  if (id === S.thread && !$("#view-chat").classList.contains("missing")) return true;
  if (!S.threads.some((t) => t.id === id)) {
    let one = null;
    try { one = await api(`/api/threads/${encodeURIComponent(id)}`); } catch (e) {
      if (e.status !== 404 && e.status !== 400) throw e;
    }
    if (!one) { showMissing(id); return false; }
    if (!S.threads.some((t) => t.id === id)) S.threads.push(one);
  }
  await focusThread(id);
  return true;
}

function showMissing(id) {
  $("#view-chat").classList.add("missing");
  const back = S.threads.find((t) => t.id === S.thread);
  $("#chat-missing").replaceChildren(h("span", { role: "alert" }, "Thread not found: ", h("code", {}, id)), " ",
    back ? h("button", { type: "button", class: "secondary small", onclick: () => { location.hash = "#chat"; focusThread(back.id); } },
      `Back to “${threadName(back)}”`) : null);
}

export function clearMissing() {
  $("#view-chat").classList.remove("missing");
  $("#chat-missing").replaceChildren();
}

export async function focusThread(id) {
  clearMissing();
  S.thread = id;
  presence();
  renderMute();
  localStorage.setItem("petal.thread", id);
  S.conv = new Map(); S.convMore = false; S.queue = []; S.live = new Map(); S.workers = new Map(); S.liveLoaded = new Set();
  renderThreadPicker();
  await Promise.all([loadTasks(), loadConversation(), loadQueue()]);
  renderAsks();
  loadContext();
}

export async function newThread() {
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

export async function changeMode(mode) {
  await api(`/api/threads/${S.thread}`, { method: "PATCH", body: { mode } });
}

// Search: the datalist suggests thread names; a name (or the first thread whose name contains the text)
// is focused.
export async function findThread(text) {
  const q = text.trim().toLowerCase();
  if (!q) return;
  const t = S.threads.find((x) => threadName(x).toLowerCase() === q)
    || S.threads.find((x) => threadName(x).toLowerCase().includes(q));
  $("#thread-status").textContent = t ? "" : `No thread matches “${text.trim()}”.`;
  if (t) { $("#thread-search").value = ""; await focusThread(t.id); }
}

// Rename and archive are optimistic: shown at once, confirmed by the thread's own record (the list is
// re-read on thread.* events); refused, reverted with the server's message.
export async function renameThread() {
  const t = S.threads.find((x) => x.id === S.thread);
  if (!t) return;
  const title = prompt("Rename the thread", threadName(t));
  if (title === null || !title.trim() || title.trim() === threadName(t)) return;
  const before = t.title;
  t.title = title.trim();
  renderThreadPicker();
  $("#thread-status").textContent = "Renaming…";
  try {
    await api(`/api/threads/${t.id}`, { method: "PATCH", body: { title: t.title } });
    $("#thread-status").textContent = "";
  } catch (e) {
    t.title = before;
    renderThreadPicker();
    $("#thread-status").textContent = `Not renamed: ${e.message}`;
  }
}

export async function archiveThread() {
  const t = S.threads.find((x) => x.id === S.thread);
  if (!t || !confirm(`Archive “${threadName(t)}”? It leaves the list; its history stays in the journal.`)) return;
  const at = S.threads.indexOf(t);
  S.threads.splice(at, 1);
  const next = S.threads[0]?.id || S.defaultThread;
  try {
    const done = api(`/api/threads/${t.id}`, { method: "PATCH", body: { archived: true } });
    await focusThread(next);
    await done;
    $("#thread-status").textContent = `Archived “${threadName(t)}”.`;
  } catch (e) {
    S.threads.splice(at, 0, t);
    await focusThread(t.id);
    $("#thread-status").textContent = `Not archived: ${e.message}`;
  }
}
