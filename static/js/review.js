// Review from the phone: tap a line of a worker's diff to comment on it (tap a second line of the same file
// first to take a range); the comments on one task are one review; "Send to worker" sends it back, and a
// follow-up worker continues on the reviewed commit with the comments (file, lines, text, the hunk) in its brief.
import { api } from "./api.js";
import { h } from "./dom.js";

const drafts = new Map(); // task id → { comments, open: the line(s) being commented on, text, note, result, sending }

function draft(id) {
  if (!drafts.has(id)) drafts.set(id, { comments: [], open: null, text: "", note: "", result: null, sending: false });
  return drafts.get(id);
}

// The diff's lines, each with the file and the line of the new file it stands at (a removed line: where it
// was removed), and the hunk it is in
export function parseDiff(text) {
  const rows = [];
  let file = null, newLine = 0, hunk = null;
  for (const l of String(text || "").split("\n")) {
    const row = { text: l, file: null, line: null, hunk: null };
    if (l.startsWith("diff --git ")) { file = null; hunk = null; row.cls = "file"; }
    else if (l.startsWith("+++ ")) { file = l.startsWith("+++ b/") ? l.slice(6) : null; row.cls = "file"; }
    else if (l.startsWith("--- ")) row.cls = "file";
    else if (l.startsWith("@@")) {
      const m = /^@@ -\d+(?:,\d+)? \+(\d+)/.exec(l);
      if (m) newLine = Number(m[1]);
      hunk = [l];
      row.cls = "hunk";
    } else if (hunk && file && (l.startsWith("+") || l.startsWith("-") || l.startsWith(" "))) {
      row.cls = l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : "";
      row.line = newLine;  // where it stands in the new file (a removed line: where it was removed)
      if (!l.startsWith("-")) newLine++;
      row.file = file;
      hunk.push(l);
      row.hunk = hunk;
    } else row.cls = l.startsWith("…") ? "cut" : "";
    rows.push(row);
  }
  return rows;
}

function pick(id, row, rerender) {
  const d = draft(id);
  const o = d.open;
  if (o && o.file === row.file && !d.text) {  // a second tap in the same file: the range between the two
    const [a, b] = [Math.min(o.line, row.line), Math.max(o.end_line ?? o.line, row.line)];
    d.open = { ...o, line: a, end_line: b === a ? null : b };
  } else d.open = { file: row.file, line: row.line, end_line: null, hunk: row.hunk.join("\n") };
  rerender();
}

function picked(d, row) {
  const o = d.open;
  return o && row.file === o.file && row.line >= o.line && row.line <= (o.end_line ?? o.line);
}

const where = (c) => `${c.file}:${c.line}${c.end_line ? `-${c.end_line}` : ""}`;

// The diff, its lines tappable, with the comment being written and the review so far
export function reviewDiff(id, text, rerender, shown) {
  const d = draft(id);
  const rows = parseDiff(text).slice(0, shown);
  const lines = rows.map((r) => r.file
    ? h("span", { class: `${r.cls || ""} line${picked(d, r) ? " picked" : ""}${d.comments.some((c) => c.file === r.file && c.line === r.line) ? " commented" : ""}`,
      role: "button", tabindex: "0", "data-file": r.file, "data-line": String(r.line),
      onclick: () => pick(id, r, rerender),
      onkeydown: (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(id, r, rerender); } } }, r.text + "\n")
    : h("span", { class: r.cls || "" }, r.text + "\n"));
  return h("div", { class: "review" }, h("pre", { class: "diff" }, lines), commentBox(id, d, rerender), reviewPanel(id, d, rerender));
}

function commentBox(id, d, rerender) {
  if (!d.open) return null;
  const add = () => {
    const text = d.text.trim();
    if (!text) return;
    d.comments.push({ ...d.open, text });
    d.open = null; d.text = "";
    rerender();
  };
  return h("div", { class: "comment-box", role: "group", "aria-label": "Comment on a line" },
    h("label", { for: `comment-${id}` }, `Comment on ${where(d.open)}`),
    h("textarea", { id: `comment-${id}`, rows: "3", oninput: (ev) => { d.text = ev.target.value; } }, d.text),
    h("div", { class: "actions" },
      h("button", { type: "button", onclick: add }, "Add comment"),
      h("button", { type: "button", class: "secondary", onclick: () => { d.open = null; d.text = ""; rerender(); } }, "Cancel")));
}

function reviewPanel(id, d, rerender) {
  if (!d.comments.length && !d.result) return null;
  const send = async () => {
    if (d.sending) return;  // one review, once: a second tap while it is sent does nothing
    d.sending = true;
    d.result = { text: "Sending…" };
    rerender();
    try {
      await api(`/api/tasks/${id}/review`, { method: "POST", body: { comments: d.comments, note: d.note.trim() || undefined } });
      d.comments = []; d.note = "";
      d.result = { text: "Sent: a follow-up worker continues on this branch with your comments." };
    } catch (e) { d.result = { text: `Not sent: ${e.message}`, error: true }; }
    d.sending = false;
    rerender();
  };
  return h("section", { class: "review-panel", "aria-label": "Your review" },
    d.comments.length ? [
      h("h4", {}, `Your review: ${d.comments.length} comment${d.comments.length > 1 ? "s" : ""}`),
      h("ul", { class: "review-comments" }, d.comments.map((c, i) => h("li", {},
        h("code", {}, where(c)), " ", c.text, " ",
        h("button", { type: "button", class: "secondary small", "aria-label": `Remove the comment on ${where(c)}`,
          onclick: () => { d.comments.splice(i, 1); rerender(); } }, "×")))),
      h("input", { type: "text", class: "review-note", placeholder: "A note for the worker (optional)", "aria-label": "A note for the worker",
        value: d.note, oninput: (ev) => { d.note = ev.target.value; } }),
      h("button", { type: "button", class: "send-review", disabled: Boolean(d.sending), onclick: send }, "Send to worker")] : null,
    d.result ? h("p", { class: `review-sent${d.result.error ? " error" : ""}`, role: "status" }, d.result.text) : null);
}
