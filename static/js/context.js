// Context: the orchestrator's working set for the focused thread.
import { api } from "./api.js";
import { $, chip, firstLine, h } from "./dom.js";
import { S, currentTab, taskState, threadName } from "./state.js";

export async function loadContext() {
  if (currentTab() !== "context") return;
  renderContext(await api(`/api/context?thread_id=${S.thread}`));
}

function renderContext(c) {
  const section = (title, items, fmt, empty) => [h("h3", {}, title),
    items?.length ? h("ul", {}, items.map((i) => h("li", {}, fmt(i)))) : h("p", { class: "empty" }, empty)];
  const turn = c.current_turn;
  $("#context-body").replaceChildren(
    h("p", {}, "Thread: ", c.thread ? threadName(c.thread) : "(not started)", " · mode ", c.mode || "interactive"),
    h("h3", {}, "Current turn"),
    turn ? h("p", {}, chip(taskState(turn)), " ", firstLine(turn.brief)) : h("p", { class: "empty" }, "No turn is running."),
    ...section("Pending messages", c.pending_messages, (m) => firstLine(m.text), "None waiting."),
    ...section("Running workers", c.running_workers, (w) => [chip(taskState(w)), " ", h("a", { href: `#task/${w.id}` }, firstLine(w.brief))], "None running."),
    ...section("Recent handoffs", c.recent_handoffs, (x) => [chip(x.payload.status || "success"), " ", x.payload.current_state || x.payload.goal || ""], "No handoffs yet."),
    ...section("Questions waiting", c.pending_asks, (a) => a.questions[0]?.question || "", "None."));
}
