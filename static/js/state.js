// The page's state: a cache of what the API and the stream said, never a source of truth.
import { firstLine, short } from "./dom.js";

export const TABS = ["chat", "tasks", "asks", "activity", "context", "routines"];
export const FINAL = new Set(["success", "failed", "crashed", "cancelled", "rate_limited", "partial", "skipped", "gated",
  "extraction_failed"]);

export const S = {
  info: null,
  threads: [],
  defaultThread: null,
  thread: localStorage.getItem("petal.thread"),
  tasks: new Map(),          // id → task row (recent, all threads)
  threadTasks: new Set(),    // ids of the focused thread's turns and workers
  conv: new Map(),           // event_id → event, the focused thread's chat records
  convTypes: new Set(),
  convMore: false,           // older records exist than the oldest one read
  queue: [],                 // the focused thread's undelivered messages
  outbox: new Map(),         // client_msg_id → a message sent here that the store has not taken yet
  asks: [],                  // pending questions, all threads
  feed: [],                  // the Activity feed (newest last, bounded)
  lastSeq: 0,
  conn: "connecting",
  detail: null,              // the task shown in Tasks, with its events
  live: new Map(),           // task id → Progress of the focused thread's running turns (js/live.js)
  workers: new Map(),        // task id → Progress of the focused thread's workers (folded under their dispatch)
  liveLoaded: new Set(),     // tasks whose earlier events were read back
};

export function currentTab() {
  const t = location.hash.replace(/^#/, "").split("/")[0];
  return TABS.includes(t) ? t : t === "task" ? "tasks" : "chat";
}

export function taskState(t) {
  if (!t) return "pending";
  if (t.status === "running" && t.activity && t.activity !== "running") return t.activity;
  if (t.status === "pending" && t.activity === "waiting_for_slot") return t.activity;  // every slot busy
  return t.status;
}

export function threadName(t) { return t.title || (t.id === S.defaultThread ? "Default" : `Thread ${short(t.id)}`); }

// A task's title: its brief's first line. A turn run on a harness report is named for what it reports on,
// never by the report's text; an extractor by the worker it derives a handoff for.
const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/i;
export function taskTitle(t, n = 120) {
  if (!t) return "";
  const brief = String(t.brief ?? "");
  if (t.role === "extractor") return `Handoff of worker ${short(t.parent_task_id)}`;
  if (brief.startsWith("[harness]")) {
    const worker = brief.match(UUID);
    const user = brief.split("\n\n").find((part) => part.trim() && !part.startsWith("[harness]") && !/^[-\w ]+:/.test(part));
    return worker ? `Turn on the report of worker ${short(worker[0])}` : firstLine(user || "Turn on a harness report", n);
  }
  return firstLine(brief, n);
}

// Dollar costs mean nothing for the scripted (demo) model: tokens only.
export function usageText(u) {
  const tokens = `${(u.input_tokens || 0) + (u.output_tokens || 0)} tokens`;
  return S.info?.demo ? tokens : `${tokens} · $${(u.cost_usd || 0).toFixed(4)}`;
}
