// Sessions: the Claude Code conversations the executors hold (begun in a terminal), found by text or directory
// and continued as a thread with one tap; and the hand-back — the focused thread's command for a terminal.
import { api } from "./api.js";
import { $, firstLine, h } from "./dom.js";
import { S } from "./state.js";

let opened = null;  // { loadThreads, focusThread } from app.js (this module imports no view that imports it)
let searching = 0;
let loads = 0;  // only the newest of overlapping loads renders: one an event began can overtake a search's
let adopting = false;  // a continue in flight: a background reload would give back its disabled button (a second tap)
let dirsShown = "";  // the directories the <select> lists: rebuilt only when they change (an open one would close)

export function initSessions(threads) {
  opened = threads;
  $("#sessions-open").addEventListener("click", toggle);
  $("#sessions-close").addEventListener("click", toggle);
  $("#sessions-q").addEventListener("input", () => { clearTimeout(searching); searching = setTimeout(load, 250); });
  $("#sessions-dir").addEventListener("change", () => load());
  $("#handback-copy").addEventListener("click", copyHandback);
  // the hand-back is one line (the command cut short) until opened: the conversation keeps the screen
  const more = h("button", { id: "handback-more", type: "button", class: "secondary small", "aria-expanded": "false",
    "aria-controls": "handback" }, "More");
  more.addEventListener("click", () => {
    const open = $("#handback").classList.toggle("open");
    more.setAttribute("aria-expanded", String(open));
    more.textContent = open ? "Less" : "More";
  });
  $("#handback-copy").after(more);
}

function toggle() {
  const panel = $("#sessions-panel");
  panel.hidden = !panel.hidden;
  $("#sessions-open").setAttribute("aria-expanded", String(!panel.hidden));
  if (!panel.hidden) { load(); $("#sessions-q").focus(); }
}

function ago(t) {
  if (!t) return "";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 90) return "just now";
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 129600) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

// The open panel follows what the executors hold (a terminal session starting, changing screens, ending; the
// stream resumed after a restart): it is read again, not left as it was when opened.
export function reloadSessions() {
  return $("#sessions-panel").hidden || adopting ? undefined : load(true);
}

async function load(quiet = false) {
  const mine = ++loads;
  const q = $("#sessions-q").value.trim();
  const dir = $("#sessions-dir").value;
  const params = new URLSearchParams({ limit: "50" });
  if (q) params.set("q", q);
  if (dir) params.set("dir", dir);
  if (!quiet) $("#sessions-status").textContent = "Loading…";
  try {
    const data = await api(`/api/claude-sessions?${params}`);
    if (mine !== loads || (quiet && adopting)) return;  // (a background read begun before a continue's tap)
    renderDirs(data.dirs, dir);
    const live = data.terminals || [];
    const held = new Set(live.map((t) => t.session_id));
    $("#sessions-list").replaceChildren(...live.map(terminalRow), ...data.sessions.filter((x) => !held.has(x.session_id)).map(row));
    $("#sessions-status").textContent = data.sessions.length || live.length ? (data.more ? "Showing the 50 newest; search to narrow." : "")
      : "No stored conversations match.";
  } catch (e) {
    if (mine !== loads) return;
    $("#sessions-status").textContent = `Could not list them: ${e.message}`;
  }
}

function renderDirs(dirs, chosen) {
  const shown = JSON.stringify([dirs, chosen]);
  if (shown === dirsShown) return;
  dirsShown = shown;
  $("#sessions-dir").replaceChildren(h("option", { value: "" }, "every directory"),
    ...dirs.map((d) => h("option", { value: d.cwd, selected: d.cwd === chosen }, `${d.cwd} (${d.sessions})`)));
}

// A session live in a terminal (`petal-dispatch claude`): first in the list, with who holds it; its thread is
// the conversation.
function terminalRow(t) {
  return h("li", { class: "session terminal", "data-session-id": t.session_id },
    h("div", { class: "title" }, firstLine(t.title || `terminal ${t.session_id.slice(0, 8)}`, 140)),
    h("div", { class: "meta" }, [t.cwd, ago(t.started_at), t.executor].filter(Boolean).join(" · ")),
    h("div", { class: "meta live" }, t.held_by ? `live in a terminal, shown in ${t.held_by}` : "live in a terminal, detached"),
    h("button", { type: "button", class: "secondary small", onclick: () => open(t.thread_id) }, "Open its thread"));
}

function row(s) {
  const why = !s.readable ? `unreadable: ${s.unreadable_reason}` : !s.adoptable ? "outside the project roots"
    : !s.executor_live ? `its executor (${s.executor}) is not running` : null;
  const action = s.thread_id
    ? h("button", { type: "button", class: "secondary small", onclick: () => open(s.thread_id) }, "Open its thread")
    : h("button", { type: "button", class: "small", disabled: Boolean(why), onclick: (ev) => adopt(s, ev.target) },
      s.live ? "Continue (fork)" : "Continue here");
  return h("li", { class: "session", "data-session-id": s.session_id },
    h("div", { class: "title" }, firstLine(s.title || `conversation ${s.session_id.slice(0, 8)}`, 140)),
    h("div", { class: "meta" }, [s.cwd || "?", s.git_branch && s.git_branch !== "HEAD" ? `⎇ ${s.git_branch}` : null, `${s.message_count} messages`,
      ago(s.last_activity), s.executor].filter(Boolean).join(" · ")),
    s.live ? h("div", { class: "meta live" }, "in use by a terminal now: continuing forks it") : null,
    why ? h("div", { class: "meta error" }, why) : null,
    action);
}

async function open(threadId) {
  await opened.loadThreads();
  await opened.focusThread(threadId);
  toggle();
}

async function adopt(s, button) {
  button.disabled = true;
  adopting = true;
  $("#sessions-status").textContent = "Queued…";
  try {
    const made = await api("/api/threads", { method: "POST", body: { adopt_session_id: s.session_id, executor: s.executor } });
    $("#sessions-status").textContent = "";
    await open(made.thread_id);
    location.hash = "#chat";
  } catch (e) {
    button.disabled = false;
    $("#sessions-status").textContent = `Not continued: ${e.message}`;
  } finally {
    adopting = false;
  }
}

// The focused thread's command for a terminal, once it has one (its first turn, or its adoption).
export function renderHandback() {
  const t = (S.threads || []).find((x) => x.id === S.thread);
  // live in a terminal (`petal-dispatch claude`): any terminal attaches to it; once it ended, --resume continues it
  const cmd = t?.terminal ? `petal-dispatch attach ${t.id}` : t?.resume_command;
  $("#handback").hidden = !cmd;
  $("#handback-cmd").textContent = cmd || "";
  renderTerminal(t);
}

// The focused thread's live terminal session: who shows it, whether a message waits on the user's typing, and
// a way to end it from here. Docked with the composer: Stop and End session stay on screen while a long turn is
// followed on a phone (above the conversation they scrolled away).
function renderTerminal(t) {
  let bar = $("#terminal-live");
  if (!bar) {
    bar = h("p", { id: "terminal-live", class: "terminal-live", hidden: true });
    $(".dock").prepend(bar);
  }
  const live = t?.terminal;
  bar.hidden = !live;
  // the chat box says where a message goes: typed into the session at its next empty prompt, or to the orchestrator
  const box = $("#composer-text");
  box.dataset.placeholder ??= box.placeholder;
  box.placeholder = live ? "Type to the terminal session (at its next empty prompt)…" : box.dataset.placeholder;
  if (!live) return bar.replaceChildren();
  const end = h("button", { type: "button", class: "secondary small", id: "terminal-end" }, "End session");
  end.addEventListener("click", async () => {
    end.disabled = true;
    try { await api(`/api/threads/${t.id}/terminal/end`, { method: "POST", body: {} }); } catch (e) {
      end.disabled = false;
      end.title = e.message;
    }
  });
  // Stop interrupts the running turn, as Esc in the terminal does; the session goes on
  const stop = h("button", { type: "button", class: "secondary small", id: "terminal-stop" }, "Stop");
  stop.addEventListener("click", () => api(`/api/tasks/${live.task_id}/stop`, { method: "POST", body: { reason: "interrupted from the page" } })
    .catch((e) => { stop.title = e.message; }));
  // one line: where it shows gives way (cut, whole in its title) before the buttons or a waiting message do
  const where = `${live.held_by ? `shown in ${live.held_by}` : "detached: running on its own"} · ${
    live.sandboxed ? "sandboxed" : "not sandboxed (your own session)"}`;
  bar.replaceChildren(h("span", { class: "chip live" }, "live in a terminal"), " ",
    h("span", { class: "meta where", title: where }, where), " ",
    ...(live.input_waiting ? [h("span", { class: "chip waiting", title: "a message from the page waits: the terminal's input line holds text" },
      "message waits"), " "] : []),
    stop, " ", end);
}

async function copyHandback() {
  const text = $("#handback-cmd").textContent;
  try {
    await navigator.clipboard.writeText(text);
    $("#handback-copy").textContent = "Copied";
  } catch {
    // no clipboard (a page not served over HTTPS): the command is selected for a manual copy
    const range = document.createRange();
    range.selectNodeContents($("#handback-cmd"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    $("#handback-copy").textContent = "Selected";
  }
  setTimeout(() => { $("#handback-copy").textContent = "Copy"; }, 2000);
}
