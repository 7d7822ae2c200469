// petal-dispatch web client: a live view over the store. Everything shown is read through the API and
// kept current by the SSE journal stream (resumed by Last-Event-ID); nothing here is a source of truth.
// Native ES modules, one concern each (js/*.js), no build step. User-supplied text is only ever set as
// text; markdown is sanitised in js/markdown.js. The server's CSP allows no inline script.
import { loadFeed, feedEvent, renderFeed } from "./js/activity.js";
import { api, nextFrame, soon } from "./js/api.js";
import { loadAsks, renderAsks, showAsk } from "./js/asks.js";
import { wire as wireAttachments } from "./js/attach.js";
import { belongs, liveEvent, loadConversation, loadOlder, loadQueue, renderConversation, scrollChat, send } from "./js/chat.js";
import { loadContext } from "./js/context.js";
import { $, h } from "./js/dom.js";
import { disableNotify, enableNotify, presence, renderMute, renderNotify, testNotify, toggleMute } from "./js/notify.js";
import { S, TABS, currentTab } from "./js/state.js";
import { loadRoutines } from "./js/routines.js";
import { setConn, stream } from "./js/stream.js";
import { FLEET_POLL_MS, loadFleet } from "./js/fleet.js";
import { detailEvent, loadDetail, loadTasks } from "./js/tasks.js";
import { initSessions, reloadSessions } from "./js/sessions.js";
import { archiveThread, changeMode, clearMissing, findThread, focusThread, loadThreads, newThread, openThread, pickThread, renameThread } from "./js/threads.js";

function onWake(kind) {
  if (kind === "queue") { soon("queue", loadQueue); soon("threads", loadThreads, 300); }
  else if (kind === "question") soon("asks", loadAsks);
  else if (kind === "task") soon("tasks", loadTasks, 300);
  soon("context", loadContext, 500);
}

// what a screen reader hears: a new reply of the focused thread, a question for the user
function announce(e) {
  const p = e.payload || {};
  if (e.event_type === "stream.result" && e.session_id === S.thread) {
    const text = typeof p.result === "string" ? p.result : (p.errors || []).join(" ") || p.subtype;
    $("#announce").textContent = `Reply: ${text.replace(/[*_`#>]/g, "").slice(0, 300)}`;
  } else if (e.event_type === "question.asked") {
    $("#announce").textContent = "A question is waiting for your answer.";
  }
}

function onEvent(e) {
  if (e.event_type === "stream.stream_event") return;
  feedEvent(e);
  if (S.convTypes.has(e.event_type) && belongs(e)) {
    S.conv.set(e.event_id, e);
    if (e.event_type === "task.user_message" || e.event_type === "thread.harness_message") {
      S.queue = S.queue.filter((q) => q.id !== e.message_id);
    }
    nextFrame("render-conv", renderConversation);
    announce(e);
  } else if (liveEvent(e)) {
    nextFrame("render-conv", renderConversation);
  } else if (e.task_id && !S.tasks.has(e.task_id) && e.event_type.startsWith("task.")) {
    soon("tasks", loadTasks, 300); // a task we have not seen: maybe this thread's
  }
  if (e.event_type.startsWith("task.") || e.event_type === "handoff" || e.event_type === "policy.decision") soon("tasks", loadTasks, 300);
  if (e.event_type.startsWith("question.")) soon("asks", loadAsks);
  // a terminal session's state (who holds it, a message waiting) is on its thread's row
  if (e.event_type.startsWith("thread.") || /^terminal\.(started|attached|detached|input_waiting|typed|ended)$/.test(e.event_type)) soon("threads", loadThreads);
  if (/^terminal\.(started|attached|detached|ended)$/.test(e.event_type)) soon("sessions", reloadSessions, 300);
  if (e.event_type.startsWith("gate.")) soon("context", loadContext, 300);
  if (e.event_type.startsWith("routine.")) soon("routines", loadRoutines, 300);
  detailEvent(e);
}

async function refreshAll() {
  await Promise.allSettled([loadThreads(), loadTasks(), loadConversation(), loadQueue(), loadAsks(), loadContext(), loadFleet(),
    reloadSessions()]);
}

function showTab() {
  const tab = currentTab();
  const [head, arg] = location.hash.replace(/^#/, "").split("/");
  if ((head === "chat" || head === "thread") && arg) { // a link to a thread (a notification's, one shared)
    // found, the link has done its work (the same link again is a change of hash); missing, it stays in view
    openThread(arg).then((found) => { if (found && location.hash === `#${head}/${arg}`) history.replaceState(null, "", "#chat"); })
      .catch((e) => { $("#thread-status").textContent = e.message; });
  } else if (head === "chat") clearMissing();
  if (head === "asks" && arg) loadAsks().then(() => showAsk(arg)).catch((e) => console.warn("asks", e));
  for (const t of TABS) {
    $(`#view-${t}`).hidden = t !== tab;
    const link = document.querySelector(`.tabs a[data-tab="${t}"]`);
    if (t === tab) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  const [, taskId] = location.hash.replace(/^#/, "").split("/");
  if (location.hash.startsWith("#task/") && taskId) loadDetail(taskId, true).catch((e) => console.warn("task", e));
  else if (tab === "tasks") { S.detail = null; $("#task-detail").hidden = true; }
  if (tab === "activity") renderFeed();
  if (tab === "context") loadContext();
  if (tab === "routines") loadRoutines().catch((e) => { $("#routines-body").textContent = `Could not load: ${e.message}`; });
  if (tab === "chat") scrollChat(true);
  presence();
}

async function start() {
  $("#composer").addEventListener("submit", send);
  wireAttachments();
  $("#composer-text").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) $("#composer").requestSubmit();
  });
  $("#thread-picker").addEventListener("change", (ev) => pickThread(ev.target.value));
  $("#thread-mode").addEventListener("change", (ev) => changeMode(ev.target.value).catch((e) => alert(e.message)));
  $("#new-thread").addEventListener("click", () => newThread().catch((e) => alert(e.message)));
  $("#asks-scope").addEventListener("change", renderAsks);
  $("#thread-rename").addEventListener("click", () => renameThread());
  $("#thread-archive").addEventListener("click", () => archiveThread());
  $("#thread-search").addEventListener("change", (ev) => findThread(ev.target.value));
  initSessions({ loadThreads, focusThread });
  $("#load-older").addEventListener("click", () => loadOlder().catch((e) => { $("#thread-status").textContent = e.message; }));
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
  $("#notify-mute").addEventListener("change", guard(toggleMute));
  document.addEventListener("visibilitychange", presence);
  setInterval(presence, 20_000);
  S.info = await api("/api/info");
  $("#demo").hidden = !S.info.demo;
  $("#unsandboxed").hidden = S.info.workers_isolated !== false;
  S.lastSeq = S.info.journal_head; // views load next; the stream replays anything after this point
  await loadThreads();
  await Promise.all([loadTasks(), loadConversation(), loadQueue(), loadAsks(), loadFeed()]);
  showTab();
  document.body.dataset.ready = "1";
  stream({ onEvent, onWake, onResume: refreshAll }, S.info.heartbeat_s);
  const fleet = () => loadFleet().catch((e) => console.warn("fleet", e));
  fleet();
  setInterval(fleet, FLEET_POLL_MS);
  renderNotify();
}

start().catch((e) => {
  setConn("offline");
  document.body.dataset.ready = "error";
  $("#messages").replaceChildren(h("li", { class: "msg note error" }, `Could not load: ${e.message}`));
});
