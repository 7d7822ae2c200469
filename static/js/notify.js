// Notifications (Web Push) and presence.
import { api } from "./api.js";
import { $ } from "./dom.js";
import { S, currentTab } from "./state.js";

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

export async function renderNotify() {
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
  renderPolicy(st.info || await api("/api/push").catch(() => null));
  $("#notify-enable").hidden = st.state !== "off";
  $("#notify-disable").hidden = st.state !== "on";
  $("#notify-test").hidden = st.state !== "on";
}

// What will notify, as the executor is configured, and whether this thread is muted
function renderPolicy(info) {
  const p = info?.policy || {};
  const mins = (s) => (s >= 120 ? `${Math.round(s / 60)} minutes` : `${Math.round(s)} seconds`);
  const items = [
    "At once: a question from Claude, a tool call or a worker waiting for your approval, an escalation, a stalled task. A question's options are buttons on the notification.",
    p.digest_s !== undefined ? `Finished turns and routine runs: in one digest, at most every ${mins(p.digest_s)}.` : null,
    "Nothing while this page (or the page on another device) is open in front of you.",
    p.quiet ? `Quiet hours: ${p.quiet}.` : "No quiet hours (PETAL_NOTIFY_QUIET sets them).",
  ].filter(Boolean);
  $("#notify-policy").replaceChildren(...items.map((t) => Object.assign(document.createElement("li"), { textContent: t })));
  S.muted = new Set(info?.muted || []);
  renderMute();
}

export function renderMute() {
  const box = $("#notify-mute");
  box.disabled = !S.thread;
  box.checked = Boolean(S.thread && S.muted?.has(S.thread));
  const t = S.threads?.find((x) => x.id === S.thread);
  $("#notify-mute-title").textContent = t?.title ? ` (${t.title})` : "";
}

export async function toggleMute() {
  const box = $("#notify-mute");
  const thread = S.thread;
  if (!thread) return;
  await api(`/api/threads/${thread}/mute`, box.checked ? { method: "PUT", body: {} } : { method: "DELETE" });
  if (box.checked) S.muted.add(thread); else S.muted.delete(thread);
  $("#notify-result").textContent = box.checked ? "This thread is muted." : "This thread notifies again.";
}

export async function enableNotify() {
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

export async function disableNotify() {
  const reg = await registration();
  const sub = await reg.pushManager.getSubscription();
  if (sub) {
    await api("/api/push/subscriptions", { method: "DELETE", body: { endpoint: sub.endpoint } }).catch(() => null);
    await sub.unsubscribe();
  }
  $("#notify-result").textContent = "Notifications are off.";
  await renderNotify();
}

export async function testNotify() {
  await api("/api/push/test", { method: "POST", body: {} });
  $("#notify-result").textContent = "Test sent: it should arrive in a few seconds.";
}

// Presence: which thread this page is looking at, so a reply you are watching is not also pushed.
const clientId = localStorage.getItem("petal.client") || (() => {
  const id = crypto.randomUUID(); localStorage.setItem("petal.client", id); return id;
})();

// Whether it is in front of the user at all: while it is, nothing is pushed.
export function presence() {
  const visible = document.visibilityState === "visible";
  const watching = visible && currentTab() === "chat" ? S.thread : null;
  api("/api/presence", { method: "POST", body: { client_id: clientId, thread_id: watching, visible } }).catch(() => null);
}
