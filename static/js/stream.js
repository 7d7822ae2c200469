// The live journal stream (SSE over fetch, so Last-Event-ID can be set on every reconnect). Journal
// events carry `id: <seq>`; id-less events are wake-ups (re-read a REST view).
//
// Phones sleep and networks flap, and a half-open connection looks exactly like a quiet one. So: any
// byte (a heartbeat comment included) proves the stream alive; silence for two heartbeat intervals
// reconnects; coming back to the page or back online reconnects at once; otherwise back off 1 s doubling
// to 30 s with jitter. Resuming by Last-Event-ID loses nothing; the views are re-read after each resume.
import { $ } from "./dom.js";
import { S } from "./state.js";

const BACKOFF_FIRST_MS = 1000;
const BACKOFF_MAX_MS = 30_000;

export function setConn(state) {
  S.conn = state;
  const el = $("#conn");
  el.dataset.state = state;
  el.textContent = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", offline: "offline" }[state];
}

// full jitter over the upper half: reconnecting phones do not arrive in step
export function backoff(attempt) {
  const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** attempt);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

let current = null;   // AbortController of the open connection
let wake = null;      // cuts a back-off sleep short
let lastByte = 0;

// Drop the connection (if any) and connect again now: a wake, a return online, a silent stream.
export function reconnectNow(why) {
  console.info("stream: reconnect now", why);
  if (wake) wake();
  if (current) current.abort(why);
}

function pause(ms) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    wake = () => { clearTimeout(t); resolve(); };
  }).finally(() => { wake = null; });
}

// handlers: { onEvent(envelope), onWake(kind, payload), onResume() }
export async function stream(handlers, heartbeatS = 15) {
  const silenceMs = 2 * heartbeatS * 1000;
  // lastByte is also set when a connection attempt starts: an attempt that gets no answer is dropped too
  setInterval(() => {
    if (current && Date.now() - lastByte > silenceMs) reconnectNow(S.conn === "live" ? "no heartbeat" : "no answer");
  }, Math.min(5000, silenceMs / 4));
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") reconnectNow("visible"); });
  window.addEventListener("online", () => reconnectNow("online"));
  window.addEventListener("offline", () => { setConn("offline"); if (current) current.abort("offline"); });

  let attempt = 0;
  let dropped = false;
  for (;;) {
    setConn(navigator.onLine === false ? "offline" : dropped ? "reconnecting" : "connecting");
    const controller = new AbortController();
    current = controller;
    lastByte = Date.now();
    try {
      const r = await fetch("/api/stream", {
        headers: { accept: "text/event-stream", "Last-Event-ID": String(S.lastSeq) }, cache: "no-store",
        signal: controller.signal,
      });
      if (!r.ok || !r.body) throw new Error(`stream ${r.status}`);
      lastByte = Date.now();
      setConn("live");
      attempt = 0;
      if (dropped) handlers.onResume(); // wake-ups are not replayed: re-read the views (journal events are)
      await readStream(r.body, handlers, controller.signal);
    } catch (e) {
      if (!controller.signal.aborted) console.warn("stream", e);
    }
    current = null;
    dropped = true;
    setConn(navigator.onLine === false ? "offline" : "reconnecting");
    // our own abort (a wake, back online, silence) asks for a fresh connection now: the silence that
    // caused it already spaced the attempts, and a dead socket the browser reused is not the server's
    // fault. A failure backs off (an online/visible wake cuts the wait short).
    if (!controller.signal.aborted) await pause(backoff(attempt++));
  }
}

async function readStream(body, handlers, signal) {
  // decoded in place rather than through a piped TextDecoderStream: one hop less per chunk
  const reader = body.getReader();
  const decoder = new TextDecoder();
  signal.addEventListener("abort", () => reader.cancel().catch(() => null));
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done || signal.aborted) return;
    lastByte = Date.now();
    buf += decoder.decode(value, { stream: true });
    // events end with a blank line; the server may use CRLF
    let m;
    while ((m = /\r\n\r\n|\n\n|\r\r/.exec(buf))) {
      const block = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      onFrame(block, handlers);
    }
  }
}

function onFrame(block, handlers) {
  let id = null, event = "message", data = "";
  for (const line of block.split(/\r\n|\n|\r/)) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data += (data ? "\n" : "") + value;
  }
  if (!data) return;
  let payload;
  try { payload = JSON.parse(data); } catch { return; }
  if (id !== null) {
    const seq = Number(id);
    if (seq <= S.lastSeq) return; // already seen (a replay overlapping the initial load)
    S.lastSeq = seq;
    handlers.onEvent(payload);
  } else {
    handlers.onWake(event, payload);
  }
}
