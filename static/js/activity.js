// Activity: the journal as it is written, newest first, filtered in the page.
import { api } from "./api.js";
import { $, firstLine, h, short, when } from "./dom.js";
import { S, currentTab } from "./state.js";

const FEED_MAX = 2000;

export async function loadFeed() {
  const after = Math.max(0, (S.info?.journal_head ?? 0) - 200);
  const data = await api(`/api/events?after_seq=${after}&limit=200`);
  S.feed = data.events.filter((e) => e.event_type !== "stream.stream_event");
  renderFeed();
}

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

export function renderFeed() {
  const items = S.feed.filter(feedMatches).slice(-500).reverse().map(feedItem);
  $("#feed").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No events match. New ones appear here live.")]));
}

export function feedEvent(e) {
  if (!S.feed.length || e.seq > S.feed[S.feed.length - 1].seq) S.feed.push(e); // a replay may overlap the first load
  if (S.feed.length > FEED_MAX) S.feed.splice(0, S.feed.length - FEED_MAX);
  if (currentTab() === "activity" && feedMatches(e)) { $("#feed").prepend(feedItem(e)); $("#feed .empty")?.remove(); }
}
