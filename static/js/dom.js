// Small DOM helpers shared by every view. User-supplied text only ever goes in as text nodes here.

export const $ = (sel) => document.querySelector(sel);
export const short = (id) => String(id ?? "").slice(0, 8);
export const firstLine = (s, n = 120) => { const l = String(s ?? "").split("\n")[0]; return l.length > n ? l.slice(0, n) + "…" : l; };
export const when = (t) => (t ? new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : "");
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

export function h(tag, attrs = {}, ...children) {
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

export function chip(status) { return h("span", { class: `chip ${status}` }, status.replaceAll("_", " ")); }

// Puts exactly `nodes` into `parent`, in order, moving only what is out of place: nodes that stay are
// never re-created or detached, so focus, open <details> and scroll survive a re-render (no flicker).
export function reconcile(parent, nodes) {
  let i = 0;
  for (const n of nodes) {
    const at = parent.childNodes[i];
    if (at !== n) parent.insertBefore(n, at || null);
    i += 1;
  }
  while (parent.childNodes.length > nodes.length) parent.lastChild.remove();
}

// A cache of rendered nodes by key and signature: the same key with the same signature is the same node.
export class Keyed {
  constructor() { this.nodes = new Map(); this.used = new Set(); }
  get(key, sig, make) {
    this.used.add(key);
    const c = this.nodes.get(key);
    if (c && c.sig === sig) return c.node;
    const node = make();
    if (node) this.nodes.set(key, { node, sig });
    return node;
  }
  prune() { for (const k of this.nodes.keys()) if (!this.used.has(k)) this.nodes.delete(k); this.used = new Set(); }
}

// A finger (or button) pressed on the page holds every follow until a moment after it lifts: the page
// does not move between the press and the release, so a tap lands on what it was aimed at. The scroll
// held back runs then. While pressed, the page's own moves (the browser's scroll anchoring as lines
// fold above) are not the reader scrolling away. A press the browser takes for a pan or a zoom
// (pointercancel) ends the hold at once, and the pan is read as the reader's scrolling again.
const follows = new Set();
const press = { down: false, timer: 0 };
const RELEASE_MS = 250;
export const pressed = () => press.down; // what a view restructures above the reader waits for the release
window.addEventListener("pointerdown", () => { press.down = true; clearTimeout(press.timer); },
  { capture: true, passive: true });
window.addEventListener("pointerup", () => {
  clearTimeout(press.timer);
  press.timer = setTimeout(() => {
    press.down = false;
    for (const f of follows) if (f.held) f.scroll(false);
  }, RELEASE_MS);
}, { capture: true, passive: true });
window.addEventListener("pointercancel", () => {
  clearTimeout(press.timer);
  press.down = false;
  for (const f of follows) f.held = false; // the next line follows, unless the pan went up first
}, { capture: true, passive: true });

// Following the bottom is the reader's choice, read from their scrolling: scrolling up away from the
// bottom stops it, scrolling back down to it resumes it. Text arriving never moves the page up, so a
// render need not measure the page (a forced layout) to know, and a burst taller than the margin
// arriving between two frames does not unstick the reader. One per view that grows at the bottom;
// `active()` says whether the page's scrolling is that view's.
export class Follow {
  constructor(active) {
    this.active = active;
    this.stick = true;
    this.lastY = 0;
    this.held = false;
    follows.add(this);
    window.addEventListener("scroll", () => {
      const y = window.scrollY;
      if (active() && !press.down && (y < this.lastY || !this.stick)) this.stick = atBottom();
      this.lastY = y;
    }, { passive: true });
  }
  // only while the view is the one shown: another view's reader is never moved. The position it moves
  // to is remembered at once: scroll events come once a frame, so a reader scrolling up in the same
  // frame would otherwise look to have never left the old position, and stay followed.
  scroll(force) {
    if (!this.active() || !(force || this.stick)) return;
    if (!force && press.down) { this.held = true; return; }
    this.held = false;
    window.scrollTo(0, document.body.scrollHeight);
    this.lastY = window.scrollY;
    this.stick = true;
  }
}

function atBottom() { return window.innerHeight + window.scrollY >= document.body.scrollHeight - 80; }
