// Live progress of running work, read from the journal as it is written: a turn's (or a worker's)
// assistant text as it arrives and its tool calls as compact lines, keyed by event id, so a replay or a
// reload that overlaps the stream shows each once. The final reply replaces it when the `result` lands.
import { firstLine, h, pressed } from "./dom.js";
import { md } from "./markdown.js";

const base = (p) => String(p ?? "").split("/").filter(Boolean).pop() || String(p ?? "");

// what a tool call is doing, in a few words
export function toolLabel(name, input = {}) {
  const i = input || {};
  switch (name) {
    case "mcp__harness__dispatch_worker": return "dispatching a worker";
    case "mcp__harness__ask_user_question": return "asking you";
    case "mcp__harness__get_handoffs": return "reading handoffs";
    case "mcp__harness__get_project_state": return "reading the project state";
    case "mcp__harness__check_ruled_out": return "checking what was ruled out";
    case "Read": return `reading ${base(i.file_path)}`;
    case "Write": return `writing ${base(i.file_path)}`;
    case "Edit": case "MultiEdit": return `editing ${base(i.file_path)}`;
    case "Bash": return `running ${firstLine(i.command, 60)}`;
    case "Grep": return `searching for ${firstLine(i.pattern, 40)}`;
    case "Glob": return `listing ${firstLine(i.pattern, 40)}`;
    case "ToolSearch": return "looking up tools";
    case "WebFetch": return `fetching ${firstLine(i.url, 60)}`;
    case "WebSearch": return `searching the web for ${firstLine(i.query, 40)}`;
    case "TodoWrite": return "updating its to-do list";
    default: return `using ${String(name).replace(/^mcp__\w+?__/, "")}`;
  }
}

// steps of a running turn kept in view; a long turn's earlier ones are folded
export const SHOWN = 40;

const LIVE_TYPES = new Set(["stream.assistant", "stream.user"]);
export const isLive = (e) => LIVE_TYPES.has(e.event_type);

// One running task's progress. add() is idempotent per event id; the node is updated in place.
export class Progress {
  constructor(taskId, attrs = {}) {
    this.taskId = taskId;
    this.seen = new Set();
    this.firstSeq = Infinity;
    this.steps = new Map(); // tool_use_id → step element
    this.done = new Map();  // tool_use_id → "done" | "failed"
    this.list = h("ol", { class: "steps" });
    // the newest SHOWN steps stay in view; earlier ones fold away (nothing is dropped: the reader can
    // open them), so what the browser lays out and paints per frame does not grow with the turn
    this.earlier = h("ol", { class: "steps" });
    this.folded = h("summary", {});
    this.fold = h("details", { class: "earlier", hidden: true }, this.folded, this.earlier);
    this.node = h("li", { class: "msg live", "aria-busy": "true", "data-live-task": taskId, ...attrs },
      h("span", { class: "sr" }, "working: "), this.fold, this.list);
    this.count = 0;
    this.counter = h("span", { class: "count" });
    this.open = false;
  }

  add(e) {
    if (this.seen.has(e.event_id)) return false;
    this.seen.add(e.event_id);
    this.firstSeq = Math.min(this.firstSeq, e.seq);
    const content = e.payload?.message?.content;
    const blocks = Array.isArray(content) ? content : [];
    for (const b of blocks) {
      if (e.event_type === "stream.assistant" && b.type === "text" && b.text?.trim()) {
        this.place(h("li", { class: "step text", "data-seq": e.seq }, md(b.text)), e.seq);
        this.count += 1;
      } else if (e.event_type === "stream.assistant" && b.type === "tool_use") {
        const step = h("li", { class: "step tool", "data-seq": e.seq, "data-tool-use-id": b.id },
          toolLabel(b.name, b.input));
        if (this.done.has(b.id)) step.classList.add(this.done.get(b.id));
        this.steps.set(b.id, step);
        this.place(step, e.seq);
        this.count += 1;
      } else if (e.event_type === "stream.user" && b.type === "tool_result") {
        const mark = b.is_error ? "failed" : "done";
        this.done.set(b.tool_use_id, mark); // a result read before its call (a reload racing the stream)
        this.steps.get(b.tool_use_id)?.classList.add(mark);
      }
    }
    this.counter.textContent = this.count ? `(${this.count})` : "";
    return true;
  }

  // in seq order, whichever way the events came in (a reload's read can race the live stream); a live
  // line is almost always the newest, so it is appended without walking the list
  place(el, seq) {
    const later = (c) => Number(c.dataset.seq) > seq;
    const first = this.list.firstElementChild;
    const list = first && this.earlier.firstElementChild && later(first) ? this.earlier : this.list;
    const last = list.lastElementChild;
    if (!last || !later(last)) list.append(el);
    else {
      let after = list.firstElementChild;
      while (!later(after)) after = after.nextElementSibling;
      list.insertBefore(el, after);
    }
    // not under a finger: folding moves the steps above it (the browser's scroll anchoring does not
    // always make up for steps moved out from under it); the next step after the release folds them
    if (this.list.childElementCount <= SHOWN || pressed()) return;
    while (this.list.childElementCount > SHOWN) this.earlier.append(this.list.firstElementChild);
    this.fold.hidden = false;
    const n = this.earlier.childElementCount;
    this.folded.textContent = `${n} earlier step${n === 1 ? "" : "s"}`;
  }
}
